//! The session engine: sessions and their event logs, turns and brains, warm sandboxes, the
//! model proxy's tokens and sockets, and replicas' leases, with the background tasks that keep
//! them (idle brains, idle hands, the storage watch, lease renewal, following other replicas).
//! It names no route and no HTTP state: what the routes keep per session (previews, shells,
//! file listings) they drop when the engine says a session is gone ([`Engine::on_session_gone`]).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use warren_brain::WorkerPool;

use crate::config::GatewayArgs;
use crate::hands::Lifecycle;
use crate::sessions::{self, Sessions};
use crate::{agents, model_proxy, replicas, turns, warm};

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
    gone: Mutex<Vec<GoneHook>>,
}

impl Engine {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        args: GatewayArgs,
        sessions: Sessions,
        pool: Arc<WorkerPool>,
        agent: agents::Agent,
        model: Arc<model_proxy::ModelProxy>,
        warm: warm::WarmSandboxes,
        replicas: Option<Arc<replicas::Replicas>>,
        warren_bin: PathBuf,
    ) -> Engine {
        Engine {
            args,
            sessions,
            pool,
            agent,
            model,
            model_sockets: model_proxy::sockets::ModelSockets::default(),
            warm,
            replicas,
            warren_bin,
            gone: Mutex::new(Vec::new()),
        }
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
    let weak = Arc::downgrade(gateway);
    let lifecycle = Lifecycle {
        idle_pause: gateway.args.hands_idle_pause,
        archive_after: gateway.args.hands_archive_after,
        snapshot_max: gateway.args.snapshot_max,
    };
    let period = (lifecycle.idle_pause.min(lifecycle.archive_after) / 4)
        .clamp(Duration::from_millis(50), Duration::from_secs(5));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(gateway) = weak.upgrade() else {
                return;
            };
            let sessions = gateway.sessions.all();
            drop(gateway);
            futures_util::future::join_all(
                sessions
                    .iter()
                    .map(|session| session.hands.sweep(&lifecycle)),
            )
            .await;
        }
    });
}
