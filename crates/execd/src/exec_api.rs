//! The agent exec API, /v1/exec and /mcp (exec-tools.md).

use axum::Router;

use crate::Config;

#[derive(Clone)]
pub struct ExecState {}

impl ExecState {
    pub fn new(_config: &Config) -> Self {
        Self {}
    }

    pub async fn shutdown(&self) {}
}

pub fn routes(_state: ExecState) -> Router {
    Router::new()
}
