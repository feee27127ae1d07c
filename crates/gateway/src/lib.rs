//! The gateway (`warren gateway`, `warren serve`): the only server a phone or browser talks to.
//! Per session it runs a brain (an ACP agent process, see `warren-brain`) and hands (a
//! `warren execd` confined to the session workspace, see [`hands`]), and keeps one durable event
//! stream that is the client's single source of truth.
//!
//! The HTTP layer over the session engine (`warren-engine`, re-exported here module by module):
//! [`Gateway`] is the engine and what only routes keep. [`api`] routes and credential
//! extractors; `auth` devices, tokens and the credential extractors; [`sse`] the event stream
//! over HTTP; `files` (its refusals in `files_error`), `terminals` and [`previews`] the window
//! into the hands; `checkpoints` a session's checkpoints (list, files, diff, rewind, fork); `pairing` an owner's devices, pairing codes and push subscriptions; `push` what of the sessions' events is pushed, and the push routes; `owner` forwarding to a session's owner replica; `tunnel` one request to an execd; `console` the web console's files;
//! [`openapi`] the document of the routes; [`error`] the one mapping of errors to statuses.
//! Modules are crate-private unless another crate names them.
//! Deliberately absent here: ACP itself (brain crate), the tar format (snapshot crate), the
//! sandbox's construction (sandbox crate), the confined file walk (execd), the console's front
//! end (its files in `console/`, embedded by `build.rs`, are served as they are).

pub mod api;
pub(crate) mod auth;
pub(crate) mod checkpoints;
pub(crate) mod console;
pub mod error;
pub(crate) mod files;
pub(crate) mod files_error;
pub use warren_engine::{
    admission, agents, config, engine, engine_error, event_log, hands, model_proxy, network,
    replicas, session, sessions, turns, warm,
};
pub mod openapi;
pub(crate) mod owner;
pub(crate) mod pairing;
pub mod previews;
pub(crate) mod push;
pub mod sse;
pub(crate) mod terminals;
pub(crate) mod tunnel;

use std::sync::Arc;
use std::time::Instant;

pub use config::GatewayArgs;
pub use error::GatewayError;

use crate::auth::Devices;
use crate::engine::Engine;

/// The HTTP layer's state: the session engine and what only the routes keep (devices, the
/// person's shells, file listings, previews, the console).
pub struct Gateway {
    /// The session engine every route drives.
    pub engine: Arc<Engine>,
    pub args: GatewayArgs,
    pub app_key: String,
    pub devices: Devices,
    /// The person's shells in every session's hands.
    pub terminals: Arc<terminals::Terminals>,
    /// The files routes' snapshot listings (archived sessions are browsed from their snapshot).
    pub files: Arc<files::Files>,
    /// The sessions' previews (a port of the hands on an origin of its own).
    pub previews: Arc<previews::Previews>,
    /// The web console's files (`/`, `/console/...`).
    pub console: console::Console,
    /// Web Push: the VAPID key and the sender of the sessions' pushes.
    pub(crate) push: push::Push,
    pub started: Instant,
}

impl Gateway {
    /// Loads devices and sessions from `--data`, closes the turns they left open, and starts the
    /// warm pool, the idle sweeper and the storage watch. Call inside a tokio runtime.
    pub async fn open(args: GatewayArgs) -> Result<Arc<Gateway>, GatewayError> {
        let app_key = args
            .app_key
            .clone()
            .unwrap_or_else(|| auth::new_secret("wk_"));
        let previews = previews::Previews::new(
            args.preview_base_url.as_deref(),
            args.listen.port(),
            args.preview_ttl,
        )
        .map_err(GatewayError::InvalidRequest)?;
        let console =
            console::Console::open(args.console_dir.clone(), &previews.frame_source()).await?;
        let engine = Engine::open(args).await?;
        let args = engine.args.clone();
        let devices = match engine.sessions.store() {
            Some(store) => Devices::postgres(store.clone()),
            None => {
                let data = args.data.clone();
                tokio::task::spawn_blocking(move || Devices::load(&data))
                    .await
                    .map_err(|e| GatewayError::Internal(e.to_string()))??
            }
        };
        let push = push::Push::open(&args)?;
        let gateway = Arc::new(Gateway {
            push,
            engine: engine.clone(),
            args,
            app_key,
            devices,
            previews: Arc::new(previews),
            console,
            terminals: Arc::default(),
            files: Arc::default(),
            started: Instant::now(),
        });
        // What the routes keep of a session goes with it.
        let (previews, terminals, files) = (
            gateway.previews.clone(),
            gateway.terminals.clone(),
            gateway.files.clone(),
        );
        engine.on_session_gone(move |id| {
            previews.revoke_session(id);
            terminals.forget(id);
            files.forget(id);
        });
        push::start(&gateway);
        engine.start().await;
        Ok(gateway)
    }

    pub fn router(self: &Arc<Self>) -> axum::Router {
        api::router(self.clone())
    }

    /// SIGTERM: see [`Engine::shutdown`].
    pub async fn shutdown(&self) {
        self.engine.shutdown().await;
    }
}

/// The HTTPS configuration of `--tls-cert` and `--tls-key` (`None` without them); an
/// unreadable or mismatched file is an error naming it.
pub fn tls_config(
    args: &GatewayArgs,
) -> Result<Option<Arc<warren_http::tls::ServerConfig>>, warren_http::tls::TlsError> {
    match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => warren_http::tls::server_config(cert, key).map(Some),
        // clap makes each require the other; a hand-built `GatewayArgs` with one serves HTTP.
        _ => Ok(None),
    }
}

/// Serves `gateway` on `listener` (with its header and body timeouts and connection limit, and
/// over HTTPS with `--tls-cert`/`--tls-key`) until `shutdown` resolves, then shuts it down.
pub async fn serve(
    gateway: Arc<Gateway>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let tls = tls_config(&gateway.args)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
    serve_with(gateway, listener, tls, shutdown).await
}

async fn serve_with(
    gateway: Arc<Gateway>,
    listener: tokio::net::TcpListener,
    tls: Option<Arc<warren_http::tls::ServerConfig>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = gateway.router();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = async move {
        let mut stop_rx = stop_rx;
        let _ = stop_rx.wait_for(|stop| *stop).await;
    };
    let config = gateway.args.serve_config();
    let server = match tls {
        Some(tls) => tokio::spawn(warren_http::serve_tls(listener, app, config, tls, stopped)),
        None => tokio::spawn(warren_http::serve(listener, app, config, stopped)),
    };
    shutdown.await;
    // SSE streams never end on their own; shut the sessions down first so their streams close,
    // then let the server finish the remaining requests.
    gateway.shutdown().await;
    let _ = stop_tx.send(true);
    match tokio::time::timeout(std::time::Duration::from_secs(5), server).await {
        Ok(Ok(result)) => result,
        Ok(Err(join)) => Err(std::io::Error::other(join)),
        Err(_) => {
            tracing::warn!("connections still open after 5 s; exiting anyway");
            Ok(())
        }
    }
}

/// The banner's lines that say where the console is: `open URL on your phone or browser` (the
/// first LAN address when listening on an unspecified address, else the listen address), then,
/// when there are more, every URL it is reached at. `urls` is [`warren_http::reach::urls`]:
/// loopback first.
fn console_lines(urls: &[String]) -> (String, Vec<String>) {
    let console = urls.get(1).or(urls.first()).cloned().unwrap_or_default();
    let mut lines = vec![format!("open {console} on your phone or browser")];
    if urls.len() > 1 {
        lines.push("reached at:".to_owned());
        lines.extend(urls.iter().map(|url| format!("  {url}")));
    }
    (console, lines)
}

/// `warren gateway` / `warren serve`: prints where to connect (the console's URL, every address
/// it listens on, and a QR code of the console's URL when stdout is a terminal) and how to
/// register a device, then serves until `shutdown`.
pub async fn run(
    args: GatewayArgs,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // Before anything is bound: a bad certificate or key refuses the start, naming the file.
    let tls = tls_config(&args)?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let local_addr = listener.local_addr()?;
    // The real port (`--listen` may say 0): agents reach the model proxy there.
    let mut args = args;
    args.listen = local_addr;
    let gateway = Gateway::open(args).await?;
    let url = format!("{scheme}://{local_addr}");
    tracing::info!(%url, data = %gateway.args.data.display(), "warren gateway listening");
    // The first line is what tools parse; the next ones are what a person needs.
    println!("warren gateway listening on {url}");
    let urls = warren_http::reach::urls(local_addr, scheme);
    let (console, lines) = console_lines(&urls);
    for line in lines {
        println!("{line}");
    }
    if std::io::IsTerminal::is_terminal(&std::io::stdout())
        && let Some(code) = warren_http::reach::qr_code(&console)
    {
        println!("scan to open {console}:");
        print!("{code}");
        println!();
    }
    println!("data directory: {}", gateway.args.data.display());
    println!("app key: {}", gateway.app_key);
    println!("register a device:");
    println!(
        "  curl -s -X POST {url}/v1/devices -H 'X-App-Key: {}' -H 'Content-Type: application/json' -d '{{\"device_id\":\"my-phone-01\"}}'",
        gateway.app_key
    );
    serve_with(gateway, listener, tls, shutdown).await?;
    Ok(())
}

#[cfg(test)]
mod banner_tests {
    use super::console_lines;

    #[test]
    fn the_console_line_names_the_first_lan_url_and_lists_every_url() {
        let one = ["http://127.0.0.1:8080/".to_owned()];
        let (console, lines) = console_lines(&one);
        assert_eq!(console, "http://127.0.0.1:8080/");
        assert_eq!(
            lines,
            ["open http://127.0.0.1:8080/ on your phone or browser"]
        );
        let lan = [
            "https://127.0.0.1:8443/".to_owned(),
            "https://192.168.1.5:8443/".to_owned(),
            "https://10.0.0.7:8443/".to_owned(),
        ];
        let (console, lines) = console_lines(&lan);
        assert_eq!(console, "https://192.168.1.5:8443/");
        assert_eq!(
            lines,
            [
                "open https://192.168.1.5:8443/ on your phone or browser",
                "reached at:",
                "  https://127.0.0.1:8443/",
                "  https://192.168.1.5:8443/",
                "  https://10.0.0.7:8443/",
            ]
        );
    }
}
