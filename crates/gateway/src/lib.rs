//! The gateway (`warren gateway`, `warren serve`): the only server a phone or browser talks to.
//! Per session it runs a brain (an ACP agent process, see `warren-brain`) and hands (a
//! `warren execd` confined to the session workspace, see [`hands`]), and keeps one durable event
//! stream that is the client's single source of truth.
//!
//! The HTTP layer over the session engine (`warren-engine`, re-exported here module by module):
//! [`Gateway`] is the engine and what only routes keep. [`api`] routes and credential
//! extractors; `auth` devices and tokens; [`sse`] the event stream over HTTP; `files`,
//! `terminals` and [`previews`] the window into the hands; `owner` forwarding to a session's
//! owner replica; `tunnel` one request to an execd; `console` the web console's files;
//! [`openapi`] the document of the routes; [`error`] the one mapping of errors to statuses.
//! Modules are crate-private unless another crate names them.
//! Deliberately absent here: ACP itself (brain crate), the tar format (snapshot crate), the
//! sandbox's construction (sandbox crate), the confined file walk (execd), the console's front
//! end (its files in `console/`, embedded by `build.rs`, are served as they are).

pub mod api;
pub(crate) mod auth;
pub(crate) mod console;
pub mod error;
pub(crate) mod files;
pub use warren_engine::{
    admission, agents, config, engine, engine_error, event_log, hands, model_proxy, network,
    replicas, session, sessions, turns, warm,
};
pub mod openapi;
pub(crate) mod owner;
pub mod previews;
pub mod sse;
pub(crate) mod terminals;
pub(crate) mod tunnel;

use std::sync::Arc;
use std::time::{Duration, Instant};

pub use config::GatewayArgs;
pub use error::GatewayError;
use warren_brain::WorkerPool;
use warren_process::TreeRegistry;

use crate::admission::{Admission, Limits};
use crate::auth::Devices;
use crate::config::{BrainPlacement, HandsProviderKind};
use crate::engine::Engine;
use crate::hands::HandsProvider;
use crate::hands::local::{LocalConfig, LocalHands};
use crate::hands::remote::RemoteHands;
use crate::sessions::Sessions;
use warren_store::file;
use warren_store::health::StorageHealth;

/// How long a left-over agent or hands gets between SIGTERM and SIGKILL at start.
const LEFTOVER_STOP_GRACE: Duration = Duration::from_secs(2);

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
    pub started: Instant,
    /// Held for the gateway's lifetime: one gateway per data directory.
    _data_lock: std::fs::File,
}

impl Gateway {
    /// Loads devices and sessions from `--data`, closes the turns they left open, and starts the
    /// warm pool, the idle sweeper and the storage watch. Call inside a tokio runtime.
    pub async fn open(mut args: GatewayArgs) -> Result<Arc<Gateway>, GatewayError> {
        std::fs::create_dir_all(&args.data)?;
        args.data = std::fs::canonicalize(&args.data)?;
        let data_lock = {
            let data = args.data.clone();
            tokio::task::spawn_blocking(move || file::lock_data_dir(&data))
                .await
                .map_err(|e| GatewayError::Internal(e.to_string()))??
        };
        let warren_bin = match &args.warren_bin {
            Some(path) => path.clone(),
            None => std::env::current_exe()?,
        };
        let agent = agents::Agent::resolve(
            args.agent.as_deref(),
            args.agent_program.as_deref(),
            args.brain_placement,
            &warren_bin,
            &args.agent_env,
        )
        .and_then(|agent| agent.with_model(args.agent_model.as_deref()))
        .map_err(GatewayError::InvalidRequest)?;
        let app_key = args
            .app_key
            .clone()
            .unwrap_or_else(|| auth::new_secret("wk_"));
        let model = model_proxy::ModelProxy::from_args(&args.model)
            .map_err(|e| GatewayError::InvalidRequest(format!("model proxy: {e}")))?;
        let previews = previews::Previews::new(
            args.preview_base_url.as_deref(),
            args.listen.port(),
            args.preview_ttl,
        )
        .map_err(GatewayError::InvalidRequest)?;
        let console =
            console::Console::open(args.console_dir.clone(), &previews.frame_source()).await?;
        let data = args.data.clone();
        let admission = Admission::new(Limits::new(args.max_brains));
        // Every agent and hands process tree is listed here while it runs.
        let trees = TreeRegistry::open(args.data.join("run").join("trees"))?;
        let provider = hands_provider(&args, &warren_bin, &agent).await?;
        let network = Arc::new(network::Network::new(&args, provider.network()));
        let network_for_store = network.clone();
        let registry = trees.clone();
        let placement = agent.placement;
        let admission_for_store = admission.clone();
        let provider_for_store = provider.clone();
        let storage = Arc::new(StorageHealth::default());
        let pg = match &args.store {
            config::StoreUrl::File => None,
            config::StoreUrl::Postgres(url) => Some(
                warren_store::pg::Store::connect(url)
                    .await
                    .map_err(|e| GatewayError::InvalidRequest(format!("--store: {e}")))?,
            ),
        };
        let file_storage = storage.clone();
        let file_store = pg.is_none();
        let loaded = tokio::task::spawn_blocking(move || {
            // Agents and hands a gateway killed with SIGKILL left running (and whatever they
            // started): stopped before any new one starts.
            let n_left = registry.stop_leftovers(LEFTOVER_STOP_GRACE);
            if n_left > 0 {
                tracing::warn!(
                    n_left,
                    "stopped process trees an earlier gateway left running"
                );
            }
            // A disk that is already full is found now, not at the first write that fails:
            // `/healthz` says so and new work is refused from the start.
            if let Err(e) = file::probe_space(&data) {
                tracing::error!(error = %e, "the data directory does not take writes");
                file_storage.report(&e);
            }
            if !file_store {
                return Ok::<_, std::io::Error>(None);
            }
            Ok(Some((
                Devices::load(&data)?,
                Sessions::load(&data, admission, provider, placement, file_storage, network)?,
            )))
        })
        .await
        .map_err(|e| GatewayError::Internal(e.to_string()))??;
        let (devices, sessions) = match (loaded, pg) {
            (Some(loaded), _) => loaded,
            (None, Some(pg)) => (
                Devices::postgres(pg.clone()),
                Sessions::load_postgres(
                    &args.data,
                    pg,
                    admission_for_store,
                    provider_for_store,
                    placement,
                    storage,
                    network_for_store,
                )
                .await?,
            ),
            (None, None) => {
                return Err(GatewayError::Internal(
                    "the file store was not loaded".into(),
                ));
            }
        };
        // Warm workers are agents on the host that need nothing of a session; the others start
        // per session (in its hands, or with its model token).
        let n_warm = match (agent.placement, agent.needs_session_env()) {
            (BrainPlacement::Host, false) => args.warm_workers,
            _ => 0,
        };
        let pool = WorkerPool::with_registry(agent.command.clone(), n_warm, Some(trees));
        let replicas = match sessions.store() {
            Some(store) => Some(replicas::Replicas::new(
                store.clone(),
                replica_id(&args)?,
                replica_url(&args),
                args.lease_ttl,
            )),
            None => None,
        };
        if let Some(replicas) = &replicas {
            // A device's brains are counted over all replicas.
            let store = sessions.store().cloned();
            if let Some(store) = store {
                let (id, ttl) = (replicas.id.clone(), args.lease_ttl);
                sessions.admission().count_brains_in(store, id, ttl);
            }
            // The sessions whose lease this replica takes are its own; the others it follows.
            for session in sessions.all() {
                match replicas.acquire(&session).await {
                    Ok(warren_store::leases::Acquired::Owned { .. }) => {}
                    Ok(warren_store::leases::Acquired::HeldBy { replica_id, .. }) => {
                        tracing::info!(session = %session.id, owner = %replica_id, "session followed");
                    }
                    Err(e) => {
                        tracing::warn!(session = %session.id, error = %e, "session lease not taken; followed")
                    }
                }
            }
        }
        let n_warm_sandboxes = match (agent.placement, args.hands_provider) {
            (BrainPlacement::Hands, HandsProviderKind::Local) => args.warm_workers,
            _ => 0,
        };
        let engine = Arc::new(Engine::new(
            args.clone(),
            sessions,
            pool,
            agent,
            Arc::new(model),
            warm::WarmSandboxes::new(n_warm_sandboxes),
            replicas,
            warren_bin,
        ));
        let gateway = Arc::new(Gateway {
            engine: engine.clone(),
            args,
            app_key,
            devices,
            previews: Arc::new(previews),
            console,
            terminals: Arc::default(),
            files: Arc::default(),
            started: Instant::now(),
            _data_lock: data_lock,
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

/// `--replica-id`, or the id kept in `--data` (made at the first start), so a gateway that
/// restarts on its data directory is the same replica and keeps its leases.
fn replica_id(args: &GatewayArgs) -> Result<String, GatewayError> {
    if let Some(id) = &args.replica_id {
        return Ok(id.clone());
    }
    let path = args.data.join("replica-id");
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => Ok(id.trim().to_owned()),
        _ => {
            let id = format!(
                "replica-{}",
                &uuid::Uuid::new_v4().simple().to_string()[..12]
            );
            file::write_atomic(&path, id.as_bytes())?;
            Ok(id)
        }
    }
}

/// `--replica-url`, or `http://` and the listen address (loopback for an unspecified one).
fn replica_url(args: &GatewayArgs) -> String {
    if let Some(url) = &args.replica_url {
        return url.trim_end_matches('/').to_owned();
    }
    let port = args.listen.port();
    match args.listen.ip() {
        ip if ip.is_unspecified() => format!("http://127.0.0.1:{port}"),
        ip => format!("http://{}", std::net::SocketAddr::new(ip, port)),
    }
}

/// The hands provider `--hands-provider` names.
async fn hands_provider(
    args: &GatewayArgs,
    warren_bin: &std::path::Path,
    agent: &agents::Agent,
) -> Result<Arc<dyn HandsProvider>, GatewayError> {
    // `--snapshots`: object storage the client cannot be built for is a startup error naming it.
    let snapshots = args
        .snapshots
        .as_ref()
        .map(|url| {
            warren_store::objects::Objects::from_url(url)
                .map_err(|e| GatewayError::InvalidRequest(format!("--snapshots {url}: {e}")))
        })
        .transpose()?;
    match args.hands_provider {
        HandsProviderKind::Local => {
            let config = LocalConfig {
                warren_bin: warren_bin.to_path_buf(),
                run_dir: args.data.join("run").join("hands"),
                isolation: args.hands_isolation,
                bwrap: args.hands_bwrap.clone(),
                network: args.hands_network,
                uid: args.hands_uid,
                memory_bytes: args.hands_memory,
                pids: args.hands_pids,
                env: args.hands_env.clone(),
                agent_prefix: match agent.placement {
                    BrainPlacement::Hands => agent.install_prefix().map(|p| p.to_path_buf()),
                    BrainPlacement::Host => None,
                },
                snapshots,
            };
            std::fs::create_dir_all(&config.run_dir)?;
            Ok(Arc::new(LocalHands::new(config).await))
        }
        HandsProviderKind::Remote => {
            let template = args.hands_url_template.clone().ok_or_else(|| {
                GatewayError::InvalidRequest(
                    "--hands-provider remote needs --hands-url-template".into(),
                )
            })?;
            let token = args.hands_token.clone().ok_or_else(|| {
                GatewayError::InvalidRequest("--hands-provider remote needs --hands-token".into())
            })?;
            Ok(Arc::new(RemoteHands::new(template, token, snapshots)))
        }
    }
}

/// Serves `gateway` on `listener` (with its header and body timeouts and connection limit) until
/// `shutdown` resolves, then shuts it down.
pub async fn serve(
    gateway: Arc<Gateway>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = gateway.router();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let server = warren_http::serve(listener, app, gateway.args.serve_config(), async move {
        let mut stop_rx = stop_rx;
        let _ = stop_rx.wait_for(|stop| *stop).await;
    });
    let server = tokio::spawn(server);
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

/// The banner's line that names the console's URL. An unspecified address (`0.0.0.0`) is
/// reached at loopback on this machine and at its network address elsewhere.
fn open_console_line(local_addr: std::net::SocketAddr) -> String {
    let port = local_addr.port();
    match local_addr.ip() {
        ip if ip.is_unspecified() => format!(
            "open http://127.0.0.1:{port}/ on your phone or browser \
             (from another device, this machine's address at port {port})"
        ),
        _ => format!("open http://{local_addr}/ on your phone or browser"),
    }
}

/// `warren gateway` / `warren serve`: prints where to connect (the console's URL) and how to
/// register a device, then serves until `shutdown`.
pub async fn run(
    args: GatewayArgs,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let local_addr = listener.local_addr()?;
    // The real port (`--listen` may say 0): agents reach the model proxy there.
    let mut args = args;
    args.listen = local_addr;
    let gateway = Gateway::open(args).await?;
    let url = format!("http://{local_addr}");
    tracing::info!(%url, data = %gateway.args.data.display(), "warren gateway listening");
    // The first line is what tools parse; the second is what a person needs.
    println!("warren gateway listening on {url}");
    println!("{}", open_console_line(local_addr));
    println!("data directory: {}", gateway.args.data.display());
    println!("app key: {}", gateway.app_key);
    println!("register a device:");
    println!(
        "  curl -s -X POST {url}/v1/devices -H 'X-App-Key: {}' -H 'Content-Type: application/json' -d '{{\"device_id\":\"my-phone-01\"}}'",
        gateway.app_key
    );
    serve(gateway, listener, shutdown).await?;
    Ok(())
}
