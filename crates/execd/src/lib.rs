//! `warren execd`: the daemon that runs inside a sandbox. It serves interactive PTY sessions
//! (REST + WebSocket), the agent exec API (`/v1/exec`, `/mcp`), the agent's terminals
//! (`/v1/terminals`), every command of those watched and answered over the PTY protocol
//! (`/v1/agent-terminals`), Warren's file routes and change feed (`/v1/files*`), the hands'
//! identity and workspace snapshots (`/v1/hands/identity`, `/v1/workspace/*`) and the
//! OpenSandbox-compatible command, bash-session, file and metrics routes, all behind one
//! optional access token and the hands nonce check, and on TCP behind the `Host` and `Origin`
//! guard against requests web pages send (`origin_guard`).
//!
//! This module only wires the parts together: each feature module owns its routes and state, and
//! [`Execd::router`] merges them under the guard and auth layers. Process handling lives in
//! `warren-process`, exec sessions in `warren-exec`.

pub mod auth;
pub mod config;
pub mod e2b;
pub mod error;
pub mod exec_api;
pub mod files_api;
pub mod forward;
pub mod fs;
pub mod identity;
pub mod openapi;
pub mod opensandbox;
pub mod origin_guard;
pub mod proxy;
pub mod pty;
mod route_helpers;
pub mod state;
pub mod terminals;
pub mod workspace;

use std::sync::Arc;

use axum::Router;
use utoipa_axum::router::OpenApiRouter;

pub use config::{Config, ListenAddr};
pub use warren_http::Listener;

/// One daemon's state: every feature's registry, created once and shared by its routes.
#[derive(Clone)]
pub struct Execd {
    pub config: Arc<Config>,
    pub pty: pty::PtySessions,
    /// Every command of `exec`'s engine, watched and answered over the PTY protocol.
    pub agent_terminals: pty::agent::AgentTerminals,
    pub exec: exec_api::ExecState,
    pub opensandbox: opensandbox::Compat,
    pub files: files_api::FilesApi,
    pub identity: identity::Identity,
    pub workspace: workspace::Workspace,
    /// E2B's envd API, served on its own listener (`--e2b-listen`).
    pub e2b: e2b::E2b,
    /// Cancelled when the daemon shuts down: ends the MCP sessions and their open SSE streams,
    /// which graceful shutdown would otherwise wait for forever.
    pub mcp_shutdown: tokio_util::sync::CancellationToken,
}

impl Execd {
    pub fn new(config: Config) -> Self {
        let config = Arc::new(config);
        let agent_terminals = pty::agent::AgentTerminals::new(&config);
        Self {
            pty: pty::PtySessions::new(&config),
            exec: exec_api::ExecState::new(&config, Arc::new(agent_terminals.clone())),
            agent_terminals,
            opensandbox: opensandbox::Compat::new(&config),
            files: files_api::FilesApi::new(&config.root),
            identity: identity::Identity::new(config.hands_nonce.clone(), &config.root),
            workspace: workspace::Workspace::new(config.root.clone(), config.home.clone()),
            mcp_shutdown: tokio_util::sync::CancellationToken::new(),
            e2b: e2b::E2b::new(&config),
            config,
        }
    }

    /// Warren's own routes, each documented by the annotation `routes!` registered it with.
    fn warren_routes(&self) -> OpenApiRouter {
        OpenApiRouter::new()
            .merge(pty::routes(self.pty.clone()))
            .merge(exec_api::routes(self.exec.clone()))
            .merge(terminals::routes(self.exec.clone()))
            .merge(pty::agent::routes(self.agent_terminals.clone()))
            .merge(files_api::routes(self.files.clone()))
            .merge(identity::routes(self.identity.clone()))
            .merge(workspace::routes(self.workspace.clone()))
    }

    /// The OpenAPI 3.1 document of Warren's routes, as `GET /openapi.json` serves it.
    pub fn openapi(&self) -> serde_json::Value {
        openapi::document(
            self.warren_routes().into_openapi(),
            self.config.access_token.is_some(),
        )
    }

    /// The complete HTTP surface: the `Host` and `Origin` guard of `--listen` first (403
    /// `HOST_NOT_ALLOWED` / `ORIGIN_NOT_ALLOWED`; none on a Unix socket), then the access-token
    /// check on every route except `GET /ping` and `GET /openapi.json`, then the hands nonce
    /// check on every route. Unknown paths and methods answer 404/405 in Warren's error shape.
    pub fn router(&self) -> Router {
        let (warren, api) = self.warren_routes().split_for_parts();
        let document =
            openapi::to_bytes(&openapi::document(api, self.config.access_token.is_some()));
        let router = Router::new()
            .merge(warren)
            .route(
                "/openapi.json",
                axum::routing::get(move || async move {
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/json")],
                        document,
                    )
                }),
            )
            .merge(proxy::routes(proxy::Proxy::default()))
            .merge(opensandbox::routes(self.opensandbox.clone()))
            .route_service("/mcp", self.mcp_service())
            .fallback(error::route_not_found)
            .method_not_allowed_fallback(error::method_not_allowed)
            // Inside the token check, so only a client with the token learns about the nonce.
            .layer(axum::middleware::from_fn_with_state(
                self.identity.clone(),
                identity::require_matching_nonce,
            ))
            .layer(axum::middleware::from_fn_with_state(
                self.config.access_token.clone().map(Arc::<str>::from),
                auth::require_access_token,
            ));
        // Outermost, so a page's request is refused before anything reads its body or
        // upgrades it; a request with the token passes (see `origin_guard`).
        let token = self.config.access_token.clone();
        let presents_token = move |headers: &axum::http::HeaderMap| {
            token.as_deref().is_some_and(|expected| {
                headers
                    .get(auth::ACCESS_TOKEN_HEADER)
                    .is_some_and(|presented| auth::token_matches(expected, presented.as_bytes()))
            })
        };
        self.config.execd_guard().apply(
            router,
            Arc::new(presents_token),
            Arc::new(auth::refused_by_guard),
        )
    }

    /// envd's API (`--e2b-listen`, `warren envd`) behind the guard of its listener.
    pub fn envd_router(&self) -> Router {
        self.e2b.router_behind(self.config.envd_guard())
    }

    /// The exec tools over MCP streamable HTTP, driving the same engine as `/v1/exec`. Every
    /// `Host` the router's guard let through is accepted: the guard is the one place that
    /// decides (with `--allowed-host` names), so rmcp's own list would only disagree with it.
    fn mcp_service(&self) -> warren_mcp::McpHttpService {
        warren_mcp::streamable_http_service(
            self.exec.engine().clone(),
            warren_mcp::AllowedHosts::Any,
            self.mcp_shutdown.clone(),
        )
    }

    /// Kills every process any session started. Called on SIGTERM/SIGINT before exit.
    pub async fn shutdown(&self) {
        tokio::join!(
            self.pty.shutdown(),
            self.exec.shutdown(),
            self.opensandbox.shutdown(),
            self.e2b.shutdown()
        );
    }
}

/// Binds `listen`: a TCP address, or a Unix socket (a stale socket file at the path is
/// removed first, anything else there is an error; the socket is made mode 0600). Returns the
/// listener and where it listens as execd prints it: `http://ADDR` (the bound port, for port 0)
/// or `unix:/path`.
pub async fn bind(listen: &ListenAddr) -> std::io::Result<(warren_http::Listener, String)> {
    match listen {
        ListenAddr::Tcp(addr) => {
            let listener = tokio::net::TcpListener::bind(addr).await?;
            let local_addr = listener.local_addr()?;
            Ok((listener.into(), format!("http://{local_addr}")))
        }
        ListenAddr::Unix(path) => {
            use std::os::unix::fs::{FileTypeExt, PermissionsExt};
            match std::fs::symlink_metadata(path) {
                Ok(metadata) if metadata.file_type().is_socket() => std::fs::remove_file(path)?,
                Ok(_) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        format!("{} exists and is not a socket", path.display()),
                    ));
                }
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(error),
            }
            let listener = tokio::net::UnixListener::bind(path)?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
            Ok((listener.into(), format!("unix:{}", path.display())))
        }
    }
}

/// Serves `execd` on `listener`, TCP or a Unix socket (with its header and body timeouts and
/// connection limit) until `shutdown` resolves, then tears every session down.
pub async fn serve(
    execd: Execd,
    listener: impl Into<warren_http::Listener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_listeners(execd, Some(listener.into()), None, shutdown).await
}

/// [`serve`] on execd's listener and/or the E2B envd listener (`--e2b-listen`; `warren envd`
/// has only that one). Both share the daemon's state and stop together.
pub async fn serve_listeners(
    execd: Execd,
    listener: Option<warren_http::Listener>,
    e2b_listener: Option<warren_http::Listener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let stop = tokio_util::sync::CancellationToken::new();
    let mcp_shutdown = execd.mcp_shutdown.clone();
    let files = execd.files.clone();
    let e2b = execd.e2b.clone();
    let stopping = stop.clone();
    tokio::spawn(async move {
        shutdown.await;
        mcp_shutdown.cancel();
        files.stop_watches();
        e2b.stop_streams();
        stopping.cancel();
    });
    let serve_config = execd.config.serve_config();
    let main = listener.map(|listener| {
        warren_http::serve(
            listener,
            execd.router(),
            serve_config,
            stop.clone().cancelled_owned(),
        )
    });
    let e2b = e2b_listener.map(|listener| {
        warren_http::serve(
            listener,
            execd.envd_router(),
            serve_config,
            stop.clone().cancelled_owned(),
        )
    });
    // Whichever ends first (an accept error) stops the other too.
    let until_stopped = async |serving: Option<_>| {
        let Some(serving) = serving else {
            return Ok(());
        };
        let result = serving.await;
        stop.cancel();
        result
    };
    let (main, e2b) = tokio::join!(until_stopped(main), until_stopped(e2b));
    execd.shutdown().await;
    main.and(e2b)
}
