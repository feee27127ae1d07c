//! `warren execd`: the daemon that runs inside a sandbox. It serves interactive PTY sessions
//! (REST + WebSocket), the agent exec API (`/v1/exec`, `/mcp`) and the OpenSandbox-compatible
//! command, bash-session, file and metrics routes, all behind one optional access token.
//!
//! This module only wires the parts together: each feature module owns its routes and state, and
//! [`Execd::router`] merges them under the auth layer. Process handling lives in
//! `warren-process`, exec sessions in `warren-exec`.

pub mod auth;
pub mod config;
pub mod error;
pub mod exec_api;
pub mod opensandbox;
pub mod pty;

use std::sync::Arc;

use axum::Router;

pub use config::Config;

/// One daemon's state: every feature's registry, created once and shared by its routes.
#[derive(Clone)]
pub struct Execd {
    pub config: Arc<Config>,
    pub pty: pty::PtySessions,
    pub exec: exec_api::ExecState,
    pub opensandbox: opensandbox::Compat,
}

impl Execd {
    pub fn new(config: Config) -> Self {
        let config = Arc::new(config);
        Self {
            pty: pty::PtySessions::new(&config),
            exec: exec_api::ExecState::new(&config),
            opensandbox: opensandbox::Compat::new(&config),
            config,
        }
    }

    /// The complete HTTP surface, with the access-token check applied to every route except
    /// `GET /ping`.
    pub fn router(&self) -> Router {
        Router::new()
            .merge(pty::routes(self.pty.clone()))
            .merge(exec_api::routes(self.exec.clone()))
            .merge(opensandbox::routes(self.opensandbox.clone()))
            .layer(axum::middleware::from_fn_with_state(
                self.config.access_token.clone().map(Arc::<str>::from),
                auth::require_access_token,
            ))
    }

    /// Kills every process any session started. Called on SIGTERM/SIGINT before exit.
    pub async fn shutdown(&self) {
        tokio::join!(self.pty.shutdown(), self.exec.shutdown(), self.opensandbox.shutdown());
    }
}

/// Serves `execd` on `listener` until `shutdown` resolves, then tears every session down.
pub async fn serve(
    execd: Execd,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = execd.router();
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await?;
    execd.shutdown().await;
    Ok(())
}
