//! Interactive PTY sessions (pty-sessions.md).

use axum::Router;

use crate::Config;

#[derive(Clone)]
pub struct PtySessions {}

impl PtySessions {
    pub fn new(_config: &Config) -> Self {
        Self {}
    }

    pub async fn shutdown(&self) {}
}

pub fn routes(_state: PtySessions) -> Router {
    Router::new()
}
