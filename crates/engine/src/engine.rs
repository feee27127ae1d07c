//! The session engine: sessions and their event logs, turns and brains, warm sandboxes, the
//! model proxy's tokens and sockets, and replicas' leases, with the background tasks that keep
//! them (idle brains, idle hands, the storage watch, lease renewal, following other replicas).
//! It names no route and no HTTP state: what the routes keep per session (previews, shells,
//! file listings) they drop when the engine says a session is gone ([`Engine::on_session_gone`]).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use warren_brain::WorkerPool;
use warren_process::TreeRegistry;
use warren_store::file;
use warren_store::health::StorageHealth;

use crate::admission::{Admission, Limits};
use crate::config::{self, BrainPlacement, GatewayArgs, HandsProviderKind};
use crate::engine_error::EngineError;
use crate::hands::local::{LocalConfig, LocalHands};
use crate::hands::remote::RemoteHands;
use crate::hands::{HandsProvider, Lifecycle};
use crate::sessions::{self, Sessions};
use crate::{agents, checkpoints, model_proxy, network, replicas, turns, warm};

/// Called with the id of every session that goes away.
type GoneHook = Box<dyn Fn(&str) + Send + Sync>;

/// The session engine's state, shared by its handlers and background tasks.
pub struct Engine {
    pub args: GatewayArgs,
    pub sessions: Sessions,
    pub pool: Arc<WorkerPool>,
    /// The agent every session runs (`--agent`) and where it runs.
    pub agent: agents::Agent,
    /// The model proxy: the real model keys and the sessions' `wm_` tokens.
    pub model: Arc<model_proxy::ModelProxy>,
    /// The proxy's per-session sockets for hands with a network of their own.
    pub model_sockets: model_proxy::sockets::ModelSockets,
    /// Warm sandboxes (with the brain in the hands): whole sessions-to-be.
    pub warm: warm::WarmSandboxes,
    /// With `--store postgres://…`: this replica's leases and its peers' URLs.
    pub replicas: Option<Arc<replicas::Replicas>>,
    /// The `warren` binary that runs hands, the MCP server and the built-in agent.
    pub warren_bin: PathBuf,
    /// Each session's checkpoints.
    pub checkpoints: Arc<checkpoints::Checkpoints>,
    gone: Mutex<Vec<GoneHook>>,
    /// Held for the engine's lifetime: one gateway per data directory.
    _data_lock: std::fs::File,
}

impl Engine {
    /// Opens the engine on `--data` (and `--store`): stops what an earlier gateway left
    /// running, loads every session, connects the store, the agent, the model proxy and the
    /// hands' provider. Nothing runs until [`Engine::start`]. Call inside a tokio runtime.
    pub async fn open(mut args: GatewayArgs) -> Result<Arc<Engine>, EngineError> {
        std::fs::create_dir_all(&args.data)?;
        args.data = std::fs::canonicalize(&args.data)?;
        let data_lock = {
            let data = args.data.clone();
            tokio::task::spawn_blocking(move || file::lock_data_dir(&data))
                .await
                .map_err(|e| EngineError::Internal(e.to_string()))??
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
        .map_err(EngineError::InvalidRequest)?;
        let model = model_proxy::ModelProxy::from_args(&args.model)
            .map_err(|e| EngineError::InvalidRequest(format!("model proxy: {e}")))?;
        let data = args.data.clone();
        let admission = Admission::new(Limits::new(args.max_brains));
        // Every agent and hands process tree is listed here while it runs.
        let trees = TreeRegistry::open(args.data.join("run").join("trees"))?;
        let credentials = network::Credentials::open(&args)?;
        let trust_bundle = credentials
            .as_ref()
            .map(|credentials| credentials.bundle().to_path_buf());
        let provider = hands_provider(&args, &warren_bin, &agent, trust_bundle).await?;
        let network = Arc::new(network::Network::new(
            &args,
            provider.network(),
            credentials,
        ));
        let registry = trees.clone();
        let placement = agent.placement;
        let storage = Arc::new(StorageHealth::default());
        let pg = match &args.store {
            config::StoreUrl::File => None,
            config::StoreUrl::Postgres(url) => Some(
                warren_store::pg::Store::connect(url)
                    .await
                    .map_err(|e| EngineError::InvalidRequest(format!("--store: {e}")))?,
            ),
        };
        let file_storage = storage.clone();
        tokio::task::spawn_blocking(move || {
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
        })
        .await
        .map_err(|e| EngineError::Internal(e.to_string()))?;
        let checkpoint_objects = match &args.snapshots {
            Some(url) => Some(
                warren_store::objects::Objects::from_url(url)
                    .map_err(|e| EngineError::InvalidRequest(format!("--snapshots {url}: {e}")))?,
            ),
            None => None,
        };
        let checkpoints = Arc::new(checkpoints::Checkpoints::new(
            checkpoint_objects,
            args.checkpoints_keep,
            args.checkpoints_max_age,
        ));
        let parts = sessions::Parts {
            admission,
            hands_provider: provider,
            placement,
            storage,
            network,
            checkpoints: checkpoints.clone(),
        };
        let sessions = Sessions::open(&args.data, pg, parts).await?;
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
        Ok(Arc::new(Engine {
            checkpoints,
            args,
            sessions,
            pool,
            agent,
            model: Arc::new(model),
            model_sockets: model_proxy::sockets::ModelSockets::default(),
            warm: warm::WarmSandboxes::new(n_warm_sandboxes),
            replicas,
            warren_bin,
            gone: Mutex::new(Vec::new()),
            _data_lock: data_lock,
        }))
    }

    /// Closes the turns an earlier gateway left open and adopts its hands (for the sessions
    /// this replica owns), then starts the background tasks; each ends with the engine.
    pub async fn start(self: &Arc<Self>) {
        let owned = |session: &sessions::Session| {
            self.replicas
                .as_ref()
                .is_none_or(|replicas| replicas.holds(&session.id))
        };
        self.sessions.close_turns_left_open(owned).await;
        self.sessions.adopt_hands(owned).await;
        replicas::spawn_lease_renewal(self);
        replicas::spawn_follower(self);
        turns::spawn_idle_sweeper(self);
        spawn_hands_sweeper(self);
        self.warm.refill(self);
        sessions::spawn_storage_watch(self);
    }

    /// Calls `hook` with the id of every session that goes away (deleted here).
    pub fn on_session_gone(&self, hook: impl Fn(&str) + Send + Sync + 'static) {
        self.hooks().push(Box::new(hook));
    }

    /// Tells every [`Engine::on_session_gone`] hook that `session_id` is gone.
    pub fn session_gone(&self, session_id: &str) {
        for hook in self.hooks().iter() {
            hook(session_id);
        }
    }

    fn hooks(&self) -> std::sync::MutexGuard<'_, Vec<GoneHook>> {
        // Pushes and calls only: a poisoned lock still holds every hook.
        self.gone
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The model proxy's origin as a session's agent reaches it: this gateway's port on
    /// loopback (an agent on the host, or hands sharing the host's network), or the port the
    /// hands forward to the session's model socket (an agent in hands without a network).
    pub fn model_origin(&self, in_hands: bool) -> String {
        if in_hands && self.hands_have_own_network() {
            return format!("http://127.0.0.1:{}", crate::hands::local::MODEL_PORT);
        }
        let port = self.args.listen.port();
        match self.args.listen.ip() {
            ip if ip.is_unspecified() || ip.is_loopback() => format!("http://127.0.0.1:{port}"),
            ip => format!("http://{}", std::net::SocketAddr::new(ip, port)),
        }
    }

    /// Whether local hands run in a network namespace of their own (`private` or `none`), so
    /// the agent in them reaches the model proxy through the session's model socket.
    pub fn hands_have_own_network(&self) -> bool {
        matches!(self.sessions.network().label(), "private" | "none")
    }

    /// SIGTERM: ends running turns (`interrupted`), closes every brain, snapshots and pauses
    /// every hands (left for the next gateway to adopt) and flushes every event log.
    pub async fn shutdown(&self) {
        self.warm.shutdown().await;
        self.pool.shutdown().await;
        self.model_sockets.stop_all();
        self.sessions.network().stop_all();
        let sessions = self.sessions.all();
        futures_util::future::join_all(sessions.iter().map(sessions::shut_down_session)).await;
        if let Some(replicas) = &self.replicas {
            // Given up, not left to expire: another replica takes the sessions at once.
            replicas.release_all().await;
            self.sessions.admission().release_all_in_store().await;
        }
    }
}

/// What the model proxy knows of the sessions: the live ones here, through [`session::Session`]'s
/// [`model_proxy::Account`].
impl model_proxy::Ledger for Engine {
    fn account(&self, session_id: &str) -> Option<Arc<dyn model_proxy::Account>> {
        let session = self.sessions.by_id(session_id)?;
        Some(session)
    }
}

/// Pauses idle hands and archives long-paused ones (hands.md "Lifecycle"), until the gateway
/// goes away.
fn spawn_hands_sweeper(gateway: &Arc<Engine>) {
    let lifecycle = Lifecycle {
        idle_pause: gateway.args.hands_idle_pause,
        archive_after: gateway.args.hands_archive_after,
        snapshot_max: gateway.args.snapshot_max,
    };
    let period = (lifecycle.idle_pause.min(lifecycle.archive_after) / 4)
        .clamp(Duration::from_millis(50), Duration::from_secs(5));
    gateway.every(period, move |gateway| {
        // The sweep may take long (snapshots): it holds the sessions, not the engine.
        let sessions = gateway.sessions.all();
        drop(gateway);
        async move {
            let sweeps = sessions
                .iter()
                .map(|session| session.hands.sweep(&lifecycle));
            futures_util::future::join_all(sweeps).await;
        }
    });
}

impl Engine {
    /// Runs `round` every `period` (a round that overruns delays the next) for as long as the
    /// engine lives: each round gets the engine, and the task ends once it is gone.
    pub(crate) fn every<F, R>(self: &Arc<Self>, period: Duration, round: F)
    where
        F: Fn(Arc<Engine>) -> R + Send + 'static,
        R: std::future::Future<Output = ()> + Send,
    {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(engine) = weak.upgrade() else {
                    return;
                };
                round(engine).await;
            }
        });
    }
}

/// How long a left-over agent or hands gets between SIGTERM and SIGKILL at start.
const LEFTOVER_STOP_GRACE: Duration = Duration::from_secs(2);

/// `--replica-id`, or the id kept in `--data` (made at the first start), so a gateway that
/// restarts on its data directory is the same replica and keeps its leases.
fn replica_id(args: &GatewayArgs) -> Result<String, EngineError> {
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
    trust_bundle: Option<std::path::PathBuf>,
) -> Result<Arc<dyn HandsProvider>, EngineError> {
    // `--snapshots`: object storage the client cannot be built for is a startup error naming it.
    let snapshots = args
        .snapshots
        .as_ref()
        .map(|url| {
            warren_store::objects::Objects::from_url(url)
                .map_err(|e| EngineError::InvalidRequest(format!("--snapshots {url}: {e}")))
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
                trust_bundle,
            };
            std::fs::create_dir_all(&config.run_dir)?;
            Ok(Arc::new(LocalHands::new(config).await))
        }
        HandsProviderKind::Remote => {
            let template = args.hands_url_template.clone().ok_or_else(|| {
                EngineError::InvalidRequest(
                    "--hands-provider remote needs --hands-url-template".into(),
                )
            })?;
            let token = args.hands_token.clone().ok_or_else(|| {
                EngineError::InvalidRequest("--hands-provider remote needs --hands-token".into())
            })?;
            Ok(Arc::new(RemoteHands::new(template, token, snapshots)))
        }
    }
}
