//! OpenSandbox-compatible commands, bash sessions, files, health and metrics (execd-compat.md).

use axum::Router;

use crate::Config;

#[derive(Clone)]
pub struct Compat {}

impl Compat {
    pub fn new(_config: &Config) -> Self {
        Self {}
    }

    pub async fn shutdown(&self) {}
}

pub fn routes(_state: Compat) -> Router {
    Router::new()
}
