//! `warren execd`: the daemon that runs inside a sandbox. It serves interactive PTY sessions
//! (REST + WebSocket), the agent exec API (`/v1/exec`, `/mcp`), the agent's terminals
//! (`/v1/terminals`), Warren's file routes (`/v1/files`) and the OpenSandbox-compatible
//! command, bash-session, file and metrics routes, all behind one optional access token.
//!
//! This module only wires the parts together: each feature module owns its routes and state, and
//! [`Execd::router`] merges them under the auth layer. Process handling lives in
//! `warren-process`, exec sessions in `warren-exec`.

pub mod auth;
pub mod config;
pub mod error;
pub mod exec_api;
pub mod files_api;
pub mod opensandbox;
pub mod pty;
pub mod state;
pub mod terminals;

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
    pub files: files_api::FilesApi,
    /// Cancelled when the daemon shuts down: ends the MCP sessions and their open SSE streams,
    /// which graceful shutdown would otherwise wait for forever.
    pub mcp_shutdown: tokio_util::sync::CancellationToken,
}

impl Execd {
    pub fn new(config: Config) -> Self {
        let config = Arc::new(config);
        Self {
            pty: pty::PtySessions::new(&config),
            exec: exec_api::ExecState::new(&config),
            opensandbox: opensandbox::Compat::new(&config),
            files: files_api::FilesApi::new(&config.root),
            mcp_shutdown: tokio_util::sync::CancellationToken::new(),
            config,
        }
    }

    /// The complete HTTP surface, with the access-token check applied to every route except
    /// `GET /ping`. Unknown paths and methods answer 404/405 in Warren's error shape.
    pub fn router(&self) -> Router {
        Router::new()
            .merge(pty::routes(self.pty.clone()))
            .merge(exec_api::routes(self.exec.clone()))
            .merge(terminals::routes(self.exec.clone()))
            .merge(files_api::routes(self.files.clone()))
            .merge(opensandbox::routes(self.opensandbox.clone()))
            .route_service("/mcp", self.mcp_service())
            .fallback(error::route_not_found)
            .method_not_allowed_fallback(error::method_not_allowed)
            .layer(axum::middleware::from_fn_with_state(
                self.config.access_token.clone().map(Arc::<str>::from),
                auth::require_access_token,
            ))
    }

    /// The exec tools over MCP streamable HTTP, driving the same engine as `/v1/exec`. With an
    /// access token any `Host` is accepted (the token defeats DNS rebinding); without one, only
    /// loopback names and the listen address.
    fn mcp_service(&self) -> warren_mcp::McpHttpService {
        let allowed_hosts = match &self.config.access_token {
            Some(_) => warren_mcp::AllowedHosts::Any,
            None => warren_mcp::AllowedHosts::Only(vec![
                self.config.listen.ip().to_string(),
                self.config.listen.to_string(),
            ]),
        };
        warren_mcp::streamable_http_service(
            self.exec.engine().clone(),
            allowed_hosts,
            self.mcp_shutdown.clone(),
        )
    }

    /// Kills every process any session started. Called on SIGTERM/SIGINT before exit.
    pub async fn shutdown(&self) {
        tokio::join!(
            self.pty.shutdown(),
            self.exec.shutdown(),
            self.opensandbox.shutdown()
        );
    }
}

/// Serves `execd` on `listener` (with its header and body timeouts and connection limit) until
/// `shutdown` resolves, then tears every session down.
pub async fn serve(
    execd: Execd,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = execd.router();
    let mcp_shutdown = execd.mcp_shutdown.clone();
    let shutdown = async move {
        shutdown.await;
        mcp_shutdown.cancel();
    };
    warren_http::serve(listener, app, execd.config.serve_config(), shutdown).await?;
    execd.shutdown().await;
    Ok(())
}
