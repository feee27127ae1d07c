//! Hands: a session's sandbox and its lifecycle (hands.md). [`Hands`] is one session's: it
//! starts a sandbox lazily through a [`HandsProvider`] on first use ([`Hands::endpoint`]),
//! pauses it when idle (snapshot, then freeze), archives it when paused long enough (processes
//! stopped, live workspace removed, the snapshot kept), restores it on the next use, notices at
//! once when it died (`lost`) and rebuilds it on the next use, leaves it paused for the next
//! gateway at shutdown and adopts what the previous gateway left. Every transition appends a
//! `hands` event with its `elapsed_ms`.
//!
//! One async lock ([`Hands::lifecycle`]) serializes the transitions; what a status read needs
//! (the state label, the idle clock, the holds) lives in a small sync lock beside it, never
//! held across an await. Holds ([`HandsHold`]: a running turn, an attached terminal) keep the
//! hands awake; every use restarts the idle clock.
//!
//! The providers: [`local`] (a `warren execd` under bubblewrap, or unconfined where bwrap is
//! absent and `--hands-isolation auto` allows it), [`remote`] (an execd someone else runs,
//! reached by URL and token). [`snapshots`] keeps the session's snapshot file; [`host`] serves
//! the agent's `fs/*` and `terminal/*` requests from the running hands.

pub mod agent;
pub mod changes;
pub mod host;
pub mod keeper;
pub mod local;
pub mod remote;
pub mod snapshots;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use warren_brain::{BoxFuture, McpServerSpec};
use warren_execd_client::{ExecdClient, Tree};
use warren_protocol::gateway::EventBody;
use warren_store::objects::Objects;

pub use self::host::host_error;
pub use self::keeper::Keeper;
use self::snapshots::{SnapshotInfo, SnapshotStore};

/// `--brain-placement`: where the agent process runs (agents.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BrainPlacement {
    /// Inside the session's hands sandbox, with its own home; its model calls go through the
    /// model proxy.
    Hands,
    /// On the gateway's host, as a child of the gateway (for agents trusted with the host).
    Host,
}

impl BrainPlacement {
    pub fn label(self) -> &'static str {
        match self {
            BrainPlacement::Hands => "hands",
            BrainPlacement::Host => "host",
        }
    }
}

/// One word in single quotes for a POSIX shell (a `'` inside becomes `'\''`).
pub fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// Where a running hands' execd answers, the token it requires and the nonce it must report.
#[derive(Clone, PartialEq, Eq)]
pub struct HandsEndpoint {
    /// `unix:/path/execd.sock` or `http://host:port`, no trailing slash.
    pub url: String,
    /// Sent as `X-EXECD-ACCESS-TOKEN`. Never logged.
    pub token: String,
    /// The instance's nonce, sent as `X-Warren-Hands-Nonce` on every request: execd answers
    /// 409 `HANDS_IDENTITY_MISMATCH` when another sandbox answers at this address.
    pub nonce: String,
}

impl HandsEndpoint {
    /// The typed client of this execd, checking its identity on every request.
    pub fn client(&self) -> Result<ExecdClient, HandsError> {
        ExecdClient::new(&self.url, Some(self.token.clone()))
            .map(|client| client.with_nonce(self.nonce.clone()))
            .map_err(|e| HandsError::Start(e.to_string()))
    }
}

impl std::fmt::Debug for HandsEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandsEndpoint")
            .field("url", &self.url)
            .field("token", &"<redacted>")
            .field("nonce", &self.nonce)
            .finish()
    }
}

/// Why hands could not be started or used.
#[derive(Debug, thiserror::Error)]
pub enum HandsError {
    #[error("cannot start hands: {0}")]
    Start(String),
    /// `--hands-isolation bwrap` and bwrap does not work here.
    #[error("hands unavailable: {0}")]
    Unavailable(String),
    /// Another sandbox answered where this session's hands should be.
    #[error("hands identity mismatch: {0}")]
    IdentityMismatch(String),
    #[error("hands are stopped")]
    Stopped,
    #[error("hands operation failed: {0}")]
    Failed(String),
}

/// How a sandbox is confined, as the session object and `hands` events report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// bubblewrap namespaces, seccomp, no capabilities, an unprivileged uid.
    Bwrap,
    /// A plain child process: only the environment allowlist holds.
    None,
    /// Hands on another machine; their confinement is whoever runs them.
    Remote,
}

impl Isolation {
    pub fn label(self) -> &'static str {
        match self {
            Isolation::Bwrap => "bwrap",
            Isolation::None => "none",
            Isolation::Remote => "remote",
        }
    }
}

/// What a provider is asked to start.
#[derive(Debug, Clone)]
pub struct StartSpec {
    pub session_id: String,
    /// The session's workspace on the gateway's disk (created by the provider if absent).
    pub workspace: PathBuf,
    /// The access token the new execd requires (one per session, kept across instances so the
    /// agent's MCP server keeps working).
    pub token: String,
    /// The agent's home on the gateway's disk (`sessions/<id>/agent-home`), mounted at
    /// `/home/agent` when the brain runs in the hands; `None`: an empty home.
    pub agent_home: Option<PathBuf>,
}

/// One running sandbox.
pub trait HandsInstance: Send + Sync {
    fn endpoint(&self) -> &HandsEndpoint;
    /// The workspace's path as execd sees it (`/workspace` inside bwrap).
    fn root(&self) -> &str;
    fn isolation(&self) -> Isolation;
    /// The local process at the sandbox's root (bwrap, or an unconfined execd), if any.
    fn pid(&self) -> Option<u32>;
    /// `Some(why)` once the sandbox died.
    fn exited(&self) -> watch::Receiver<Option<String>>;
    /// Whether [`HandsInstance::freeze`] keeps the processes in memory (remote hands cannot).
    fn can_pause(&self) -> bool;
    /// Whether the sandbox is frozen right now (an adopted one may or may not be).
    fn is_frozen(&self) -> bool;
    fn freeze(&self) -> BoxFuture<'_, Result<(), HandsError>>;
    fn thaw(&self) -> BoxFuture<'_, Result<(), HandsError>>;
    /// Stops every process of the sandbox and forgets it.
    fn stop(self: Box<Self>) -> BoxFuture<'static, ()>;
    /// Leaves the sandbox as it is for the next gateway (which adopts it) and lets go of it.
    fn detach(self: Box<Self>);
}

/// Creates sandboxes for sessions, and finds those an earlier gateway left.
pub trait HandsProvider: Send + Sync + 'static {
    /// How this provider's hands are confined.
    fn isolation(&self) -> Isolation;
    fn start(&self, spec: StartSpec) -> BoxFuture<'_, Result<Box<dyn HandsInstance>, HandsError>>;
    /// The sandbox an earlier gateway left for `session_id`, if it is alive and proves its
    /// identity; one that does not is stopped (and logged). `Err` only for a sandbox that was
    /// there and is gone (the session's hands are `lost`).
    fn adopt(
        &self,
        session_id: &str,
    ) -> BoxFuture<'_, Result<Option<Box<dyn HandsInstance>>, HandsError>>;
    /// Stops sandboxes left for sessions not in `live` (deleted while no gateway ran).
    fn stop_strays(&self, live: &[String]) -> BoxFuture<'_, usize>;
    /// Removes what the provider keeps for the session (records, run directory).
    fn forget(&self, session_id: &str);
    /// The hands' network (network.md "Modes"): `private`, `none`, `host` or `remote`
    /// (whatever the remote hands' host gives).
    fn network(&self) -> &'static str;
    /// The object storage the sessions' snapshots are kept in (`--snapshots`), the files in the
    /// session directory being this replica's copies; `None`: the session directory only.
    fn snapshot_objects(&self) -> Option<&Objects> {
        None
    }
    /// The host uid and gid that own a sandbox's workspace and agent home (what the gateway
    /// writes there itself, a checkpoint restored, must be theirs); `None`: the gateway's own.
    fn tree_owner(&self) -> Option<(u32, u32)> {
        None
    }
}

/// The lifecycle state (the session's `hands` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandsState {
    None,
    Starting,
    Running,
    Paused,
    Archived,
    Restoring,
    Lost,
}

impl HandsState {
    pub fn label(self) -> &'static str {
        match self {
            HandsState::None => "none",
            HandsState::Starting => "starting",
            HandsState::Running => "running",
            HandsState::Paused => "paused",
            HandsState::Archived => "archived",
            HandsState::Restoring => "restoring",
            HandsState::Lost => "lost",
        }
    }
}

/// The lifecycle settings (`--hands-idle-pause`, `--hands-archive-after`, `--snapshot-max`).
#[derive(Debug, Clone, Copy)]
pub struct Lifecycle {
    pub idle_pause: Duration,
    pub archive_after: Duration,
    pub snapshot_max: u64,
}

/// Appends one event to the session's log.
pub type EmitFn = Box<dyn Fn(EventBody) + Send + Sync>;

/// One `hands` event.
#[derive(Debug, Default)]
struct Transition {
    elapsed_ms: Option<u64>,
    reset: Option<bool>,
    snapshot: Option<SnapshotInfo>,
    error: Option<String>,
    message: Option<String>,
}

fn ms_since(started: Instant) -> Option<u64> {
    Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX))
}

/// The running sandbox and what the transitions need under the lifecycle lock.
#[derive(Default)]
struct Live {
    instance: Option<Box<dyn HandsInstance>>,
    /// Bumped whenever `instance` changes, so a death watcher of an old instance says nothing.
    generation: u64,
}

/// What status reads need, behind a sync lock.
struct Status {
    state: HandsState,
    isolation: Option<Isolation>,
    last_use: Instant,
    paused_at: Option<Instant>,
    n_holds: usize,
    /// Used since the last good snapshot (a tool call, a file write), or the last snapshot
    /// failed: the next one is due, and until it is taken the stored one is not current.
    changed: bool,
    /// The reset notice for the agent's next prompt.
    notice: Option<String>,
    /// Used since the last checkpoint was taken: the next turn's end takes one.
    checkpoint_due: bool,
    stopped: bool,
    /// The workspace's path as the last sandbox's execd saw it.
    root: Option<String>,
}

/// One session's hands (see the module docs).
pub struct Hands {
    provider: Arc<dyn HandsProvider>,
    session_id: String,
    workspace: PathBuf,
    /// Where the session's agent runs; with [`BrainPlacement::Hands`] its home is
    /// `agent_home`, mounted at `/home/agent`.
    placement: BrainPlacement,
    agent_home: Option<PathBuf>,
    /// The agent home's snapshot (`agent-home.tar.zst`), taken and restored with the
    /// workspace's when the brain runs in the hands.
    home_snapshots: Option<SnapshotStore>,
    /// The PTY session of the agent last started in these hands (also in the session's
    /// `agent-pty` file, for the next gateway), stopped before another one starts.
    agent_pty: Mutex<Option<String>>,
    agent_pty_file: PathBuf,
    /// `fs/read_text_file` of a missing file answers empty content (see [`host`]).
    empty_missing_reads: std::sync::atomic::AtomicBool,
    snapshots: SnapshotStore,
    token: Mutex<String>,
    live: tokio::sync::Mutex<Live>,
    /// Serializes snapshot writes (a pause's and a turn's).
    snapshotting: tokio::sync::Mutex<()>,
    /// A snapshot after file changes is scheduled ([`Hands::snapshot_soon`]).
    snapshot_scheduled: std::sync::atomic::AtomicBool,
    /// The generation of the instance whose change feed is forwarded (0: none).
    watching: std::sync::atomic::AtomicU64,
    status: Mutex<Status>,
    emit: OnceLock<EmitFn>,
    /// The nonce the session's remote execd last reported (kept in the session's meta, so the
    /// next gateway or replica knows it): another one at the same address is new hands.
    known_nonce: Mutex<Option<String>>,
    /// Told when the known nonce changed (the session stores its meta).
    on_nonce: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// The agent's terminals (see [`host`]).
    terminals: Mutex<std::collections::HashMap<String, ExecdClient>>,
    /// Called whenever an instance is installed (started, adopted): the session's egress proxy
    /// listens from then on ([`crate::network`]).
    on_install: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// The session's checkpoints: what keeps the files of hands whose tree is on this disk
    /// (see [`keeper`]); without one, the whole-tar snapshot does.
    keeper: OnceLock<Arc<dyn Keeper>>,
    me: Weak<Hands>,
}

/// Keeps the hands awake while held (a running turn, an attached terminal, a download).
pub struct HandsHold {
    hands: Arc<Hands>,
    /// Whether letting go counts as a use (the idle clock starts again).
    restarts_idle_clock: bool,
}

impl Drop for HandsHold {
    fn drop(&mut self) {
        let mut status = self.hands.status();
        status.n_holds = status.n_holds.saturating_sub(1);
        if self.restarts_idle_clock {
            status.last_use = Instant::now();
        }
    }
}

/// Whether a session's files are gone from `workspace`, its directory on this disk. Remote
/// hands keep theirs on their own machine, which no local directory tells of (a replica that
/// did not make the session never has one), so for them never.
fn files_gone(provider: &dyn HandsProvider, workspace: &Path) -> bool {
    provider.isolation() != Isolation::Remote && !workspace.exists()
}

/// How long after a change through the files API its snapshot is taken (later changes share it).
pub const SNAPSHOT_AFTER_CHANGE: Duration = Duration::from_secs(1);

impl Hands {
    /// Hands for the session in `session_dir` (workspace `session_dir/workspace`, snapshot
    /// beside it); nothing starts until first use. An absent workspace beside a snapshot is an
    /// archived session.
    pub fn new(
        provider: Arc<dyn HandsProvider>,
        session_id: &str,
        session_dir: &Path,
        placement: BrainPlacement,
    ) -> Arc<Self> {
        let session_dir = std::path::absolute(session_dir).unwrap_or(session_dir.to_path_buf());
        let workspace = session_dir.join("workspace");
        let agent_home =
            (placement == BrainPlacement::Hands).then(|| session_dir.join("agent-home"));
        let objects = provider.snapshot_objects().cloned();
        let snapshots = SnapshotStore::new(&session_dir, objects.as_ref());
        // A snapshot only in object storage is found at adoption (it takes a request).
        let state = if files_gone(provider.as_ref(), &workspace) && snapshots.exists() {
            HandsState::Archived
        } else {
            HandsState::None
        };
        Arc::new_cyclic(|me| Self {
            provider,
            session_id: session_id.to_string(),
            workspace,
            placement,
            home_snapshots: agent_home
                .as_ref()
                .map(|_| SnapshotStore::named(&session_dir, "agent-home", objects.as_ref())),
            agent_home,
            agent_pty: Mutex::new(None),
            agent_pty_file: session_dir.join("agent-pty"),
            empty_missing_reads: std::sync::atomic::AtomicBool::new(false),
            snapshots,
            token: Mutex::new(hex::encode(rand::random::<[u8; 32]>())),
            live: tokio::sync::Mutex::new(Live::default()),
            snapshotting: tokio::sync::Mutex::new(()),
            snapshot_scheduled: std::sync::atomic::AtomicBool::new(false),
            watching: std::sync::atomic::AtomicU64::new(0),
            status: Mutex::new(Status {
                state,
                isolation: None,
                last_use: Instant::now(),
                paused_at: if state == HandsState::Archived {
                    Some(Instant::now())
                } else {
                    None
                },
                n_holds: 0,
                changed: false,
                notice: None,
                checkpoint_due: false,
                stopped: false,
                root: None,
            }),
            emit: OnceLock::new(),
            known_nonce: Mutex::new(None),
            on_nonce: OnceLock::new(),
            terminals: Mutex::new(std::collections::HashMap::new()),
            keeper: OnceLock::new(),
            on_install: OnceLock::new(),
            me: me.clone(),
        })
    }

    /// Where the hands' events go (the session's log); set once by the session.
    pub fn set_emitter(&self, emit: EmitFn) {
        let _ = self.emit.set(emit);
    }

    /// Set once by the session's network: called whenever an instance is installed.
    pub fn set_on_install(&self, on_install: Box<dyn Fn() + Send + Sync>) {
        let _ = self.on_install.set(on_install);
    }

    /// The hands' network: `private`, `none`, `host` or `remote` ([`HandsProvider::network`]).
    pub fn network(&self) -> &'static str {
        self.provider.network()
    }

    /// Whether the session's files are gone from where its hands keep them ([`files_gone`]).
    fn workspace_gone(&self) -> bool {
        files_gone(self.provider.as_ref(), &self.workspace)
    }

    /// A warm sandbox just became these hands (at the session's creation): says so in the
    /// session's log, `hands` `running` with message `warm`, so its history (and every replica
    /// that follows it) tells from the start that the hands run.
    pub fn announce_warm(&self) {
        self.emit_transition(
            "running",
            Transition {
                message: Some("warm".into()),
                ..Transition::default()
            },
        );
    }

    /// The remote execd's nonce as last stored (the session's meta), and who stores the next.
    pub fn remember_nonce(&self, nonce: Option<String>) {
        *self
            .known_nonce
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = nonce;
    }

    /// The remote execd's nonce as known now (for the session's meta).
    pub fn known_nonce(&self) -> Option<String> {
        self.known_nonce
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Set once by the session: stores its meta whenever the known nonce changed.
    pub fn set_nonce_keeper(&self, keep: Box<dyn Fn() + Send + Sync>) {
        let _ = self.on_nonce.set(keep);
    }

    /// For remote hands just connected: whether the execd at the address is another one than
    /// the one last known (its nonce differs), keeping the new nonce.
    fn replaced_remote(&self, live: &Live) -> bool {
        let Some(instance) = live.instance.as_ref() else {
            return false;
        };
        if instance.isolation() != Isolation::Remote {
            return false;
        }
        let nonce = instance.endpoint().nonce.clone();
        let previous = self
            .known_nonce
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .replace(nonce.clone());
        if previous.as_deref() == Some(nonce.as_str()) {
            return false;
        }
        if let Some(keep) = self.on_nonce.get() {
            keep();
        }
        previous.is_some()
    }

    /// The workspace's absolute path on the gateway's disk: the `cwd` given to the agent.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    pub fn snapshots(&self) -> &SnapshotStore {
        &self.snapshots
    }

    /// Keeps the session's files in its checkpoints from now on (set once, before adoption).
    pub fn set_keeper(&self, keeper: Arc<dyn Keeper>) {
        let _ = self.keeper.set(keeper);
    }

    /// The checkpoints that keep these hands' files (remote hands' are streamed by their
    /// execd).
    pub fn keeper(&self) -> Option<&Arc<dyn Keeper>> {
        self.keeper.get()
    }

    /// What the files are kept as while the hands do not run: the newest checkpoint, else a
    /// whole-tar snapshot (remote hands, or a session archived before checkpoints kept them).
    pub async fn stored_info(&self) -> Option<SnapshotInfo> {
        if let Some(keeper) = self.keeper()
            && let Some(info) = keeper.newest().await
        {
            return Some(info);
        }
        if self.snapshots.is_stored().await {
            return self.snapshots.info().await;
        }
        None
    }

    /// The agent's home on the gateway's disk, when the agent runs in these hands.
    /// The host uid and gid the workspace and agent home belong to ([`HandsProvider::tree_owner`]).
    pub fn tree_owner(&self) -> Option<(u32, u32)> {
        self.provider.tree_owner()
    }

    pub fn agent_home(&self) -> Option<&Path> {
        self.agent_home.as_deref()
    }

    /// True (once) when the hands were used since this was last asked: a checkpoint is due.
    pub fn take_checkpoint_due(&self) -> bool {
        std::mem::take(&mut self.status().checkpoint_due)
    }

    /// The files changed other than through the hands (a rewind): the next snapshot is due.
    pub fn mark_changed(&self) {
        self.status().changed = true;
    }

    /// Stops the sandbox's processes, keeping its files: the next use starts new hands on
    /// them (a rewind with `restart`).
    pub async fn restart(&self) {
        self.terminals_clear();
        let mut live = self.live.lock().await;
        if let Some(instance) = live.instance.take() {
            live.generation += 1;
            instance.stop().await;
            self.set_state(HandsState::None);
            self.emit_transition("stopped", Transition::default());
        }
    }

    /// Where the session's agent runs.
    pub fn brain_placement(&self) -> BrainPlacement {
        self.placement
    }

    /// The PTY session id of the agent last started in these hands, if any (from memory, or
    /// the file an earlier gateway wrote).
    pub async fn earlier_agent_pty(&self) -> Option<String> {
        let known = self
            .agent_pty
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        match known {
            Some(id) => Some(id),
            None => tokio::fs::read_to_string(&self.agent_pty_file)
                .await
                .ok()
                .map(|id| id.trim().to_owned())
                .filter(|id| !id.is_empty()),
        }
    }

    /// Records the PTY session id of the agent just started in these hands.
    pub async fn set_agent_pty(&self, id: &str) {
        *self
            .agent_pty
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(id.to_owned());
        if let Err(e) = tokio::fs::write(&self.agent_pty_file, id).await {
            tracing::warn!(session = %self.session_id, error = %e, "cannot record the agent's pty session");
        }
    }

    /// Before the agent inside these hands is stopped or closed: paused hands are resumed, so
    /// the agent can answer `session/close` and its PTY session can be deleted (a frozen one
    /// answers nothing). No-op for an agent on the host.
    pub async fn wake_for_brain_stop(&self) {
        if self.placement == BrainPlacement::Hands
            && self.state() == HandsState::Paused
            && let Err(e) = self.endpoint().await
        {
            tracing::debug!(session = %self.session_id, error = %e, "cannot resume the hands to stop their agent");
        }
    }

    /// Whether the agent's reads of missing files get empty content (Gemini needs it).
    pub fn set_empty_missing_reads(&self, empty: bool) {
        self.empty_missing_reads
            .store(empty, std::sync::atomic::Ordering::Relaxed);
    }

    fn empty_missing_reads(&self) -> bool {
        self.empty_missing_reads
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn status(&self) -> MutexGuard<'_, Status> {
        self.status
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn state(&self) -> HandsState {
        self.status().state
    }

    /// How the hands are (or will be) confined.
    pub fn isolation(&self) -> Isolation {
        self.status()
            .isolation
            .unwrap_or_else(|| self.provider.isolation())
    }

    /// The workspace's path as the sandbox sees it, which an absolute link inside the workspace
    /// spells (`/workspace` in bwrap, the host path unconfined), with or without a running
    /// sandbox; `None` for remote hands this gateway has not reached yet.
    pub fn root_as_seen(&self) -> Option<PathBuf> {
        if let Some(root) = self.status().root.clone() {
            return Some(PathBuf::from(root));
        }
        match self.isolation() {
            Isolation::Bwrap => Some(PathBuf::from(warren_sandbox::WORKSPACE)),
            Isolation::None => Some(self.workspace.clone()),
            Isolation::Remote => None,
        }
    }

    /// True while a sandbox runs or is paused (without starting one).
    pub fn is_running(&self) -> bool {
        matches!(self.state(), HandsState::Running | HandsState::Paused)
    }

    /// The pid at the root of the running sandbox (local hands only).
    pub async fn sandbox_pid(&self) -> Option<u32> {
        self.live.lock().await.instance.as_ref()?.pid()
    }

    /// Keeps the hands awake until the hold is dropped.
    pub fn hold(self: &Arc<Self>) -> HandsHold {
        let mut status = self.status();
        status.n_holds += 1;
        status.last_use = Instant::now();
        HandsHold {
            hands: self.clone(),
            restarts_idle_clock: true,
        }
    }

    /// The endpoint of hands that run now, with a hold that keeps them from pausing while it is
    /// used; `None` when they do not run. Nothing is started or resumed, and it is no use: the
    /// idle clock goes on (browsing files does not keep hands awake).
    pub async fn running_endpoint(self: &Arc<Self>) -> Option<(HandsEndpoint, HandsHold)> {
        // Under the lifecycle lock: a pause either finished (state paused) or waits for the hold.
        let live = self.live.lock().await;
        let instance = live.instance.as_ref()?;
        if self.state() != HandsState::Running || instance.exited().borrow().is_some() {
            return None;
        }
        let hold = {
            let mut status = self.status();
            status.n_holds += 1;
            HandsHold {
                hands: self.clone(),
                restarts_idle_clock: false,
            }
        };
        Some((instance.endpoint().clone(), hold))
    }

    /// Schedules a snapshot [`SNAPSHOT_AFTER_CHANGE`] from now (a file changed through the files
    /// API); changes meanwhile share it.
    pub fn snapshot_soon(self: &Arc<Self>) {
        use std::sync::atomic::Ordering;
        if self.snapshot_scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.me.clone();
        tokio::spawn(async move {
            tokio::time::sleep(SNAPSHOT_AFTER_CHANGE).await;
            let Some(hands) = me.upgrade() else {
                return;
            };
            hands.snapshot_scheduled.store(false, Ordering::Release);
            hands.snapshot_if_changed().await;
        });
    }

    /// The reset notice for the agent's next prompt, once (hands.md "Restore").
    pub fn take_notice(&self) -> Option<String> {
        self.status().notice.take()
    }

    fn set_state(&self, state: HandsState) {
        self.status().state = state;
    }

    fn emit_transition(&self, state: &str, transition: Transition) {
        let isolation = Some(self.isolation().label().to_string());
        let (snapshot_at, snapshot_bytes) = match transition.snapshot {
            Some(info) => (Some(info.taken_at), Some(info.bytes)),
            None => (None, None),
        };
        let body = EventBody::Hands {
            state: state.to_string(),
            elapsed_ms: transition.elapsed_ms,
            isolation,
            reset: transition.reset,
            snapshot_at,
            snapshot_bytes,
            error: transition.error,
            message: transition.message,
        };
        if let Some(emit) = self.emit.get() {
            emit(body);
        }
    }

    fn emit_error(&self, code: &str, message: String) {
        if let Some(emit) = self.emit.get() {
            emit(EventBody::Error {
                code: code.to_string(),
                message,
            });
        }
    }

    /// The running sandbox's endpoint, for a use: starts, thaws, restores or rebuilds the
    /// sandbox first as its state needs. Every call is a use (the idle clock restarts and the
    /// next snapshot is due).
    pub async fn endpoint(&self) -> Result<HandsEndpoint, HandsError> {
        let (endpoint, _root) = self.endpoint_and_root().await?;
        Ok(endpoint)
    }

    /// [`Hands::endpoint`] and the workspace's path as execd sees it.
    pub async fn endpoint_and_root(&self) -> Result<(HandsEndpoint, String), HandsError> {
        let mut live = self.live.lock().await;
        {
            let mut status = self.status();
            if status.stopped {
                return Err(HandsError::Stopped);
            }
            status.last_use = Instant::now();
            status.changed = true;
            status.checkpoint_due = true;
        }
        if let Some(instance) = live.instance.as_ref() {
            if instance.exited().borrow().is_none() {
                if self.state() == HandsState::Paused {
                    let started = Instant::now();
                    instance.thaw().await?;
                    {
                        let mut status = self.status();
                        status.state = HandsState::Running;
                        status.paused_at = None;
                    }
                    self.emit_transition(
                        "running",
                        Transition {
                            elapsed_ms: ms_since(started),
                            message: Some("resumed".into()),
                            ..Transition::default()
                        },
                    );
                }
                // Adopted paused hands are watched from their first resume.
                self.watch_files(&live).await;
                return Ok((instance.endpoint().clone(), instance.root().to_string()));
            }
            let why = instance.exited().borrow().clone().unwrap_or_default();
            if let Some(dead) = live.instance.take() {
                dead.stop().await;
            }
            self.mark_lost(&why);
        }
        self.bring_up(&mut live).await
    }

    /// Starts a sandbox for the current state: fresh on the workspace (`none`), rebuilt on the
    /// workspace (`lost`), or restored from the snapshot (`archived`, or `lost` with the
    /// workspace gone).
    async fn bring_up(&self, live: &mut Live) -> Result<(HandsEndpoint, String), HandsError> {
        let previous = self.state();
        let restore = self.workspace_gone() && self.stored_info().await.is_some();
        let started = Instant::now();
        self.set_state(if restore {
            HandsState::Restoring
        } else {
            HandsState::Starting
        });
        // The transition begins: nothing has elapsed yet (the closing event says how long).
        self.emit_transition(
            if restore { "restoring" } else { "starting" },
            Transition {
                elapsed_ms: Some(0),
                ..Transition::default()
            },
        );
        let result = if restore {
            self.start_restored(live).await
        } else {
            self.start_instance(live).await.map(|()| None)
        };
        let restored_from = match result {
            Ok(restored_from) => restored_from,
            Err(e) => {
                self.set_state(previous);
                self.emit_transition(
                    previous.label(),
                    Transition {
                        elapsed_ms: ms_since(started),
                        error: Some(e.to_string()),
                        ..Transition::default()
                    },
                );
                return Err(e);
            }
        };
        let replaced = self.replaced_remote(live);
        let reset = previous == HandsState::Lost || restore || replaced;
        if reset {
            let notice = match &restored_from {
                Some(info) => format!(
                    "Note: this session's sandbox was restored. Files are as of {}; running \
                     processes and shell state were reset.",
                    info.taken_at
                ),
                None if replaced => "Note: this session's sandbox was replaced by another at \
                                     its address. Files are as that one holds them; running \
                                     processes and shell state were reset."
                    .to_string(),
                None => "Note: this session's sandbox was restarted. Files are as they were; \
                         running processes and shell state were reset."
                    .to_string(),
            };
            self.status().notice = Some(notice);
        }
        self.set_state(HandsState::Running);
        let state = if restore { "restored" } else { "running" };
        self.emit_transition(
            state,
            Transition {
                elapsed_ms: ms_since(started),
                reset: reset.then_some(true),
                snapshot: restored_from,
                ..Transition::default()
            },
        );
        let instance = live
            .instance
            .as_ref()
            .ok_or_else(|| HandsError::Failed("the sandbox went away while starting".into()))?;
        let (endpoint, root) = (instance.endpoint().clone(), instance.root().to_string());
        // After the restore: unpacking the snapshot is no change of the person's files.
        self.watch_files(live).await;
        Ok((endpoint, root))
    }

    /// `files_changed` events from the running instance's change feed ([`changes`]), once per
    /// instance.
    async fn watch_files(&self, live: &Live) {
        use std::sync::atomic::Ordering;
        let Some(instance) = live.instance.as_ref() else {
            return;
        };
        if self.watching.swap(live.generation, Ordering::AcqRel) == live.generation {
            return;
        }
        let Ok(client) = instance.endpoint().client() else {
            return;
        };
        let me = self.me.clone();
        changes::start(client, self.session_id.clone(), move |paths, truncated| {
            if let Some(hands) = me.upgrade()
                && let Some(emit) = hands.emit.get()
            {
                emit(EventBody::FilesChanged { paths, truncated });
            }
        })
        .await;
    }

    /// Starts a provider instance on the workspace and watches it for death.
    async fn start_instance(&self, live: &mut Live) -> Result<(), HandsError> {
        let spec = StartSpec {
            session_id: self.session_id.clone(),
            workspace: self.workspace.clone(),
            token: self.token().clone(),
            agent_home: self.agent_home.clone(),
        };
        let instance = self.provider.start(spec).await?;
        self.install(live, instance);
        Ok(())
    }

    fn token(&self) -> MutexGuard<'_, String> {
        self.token
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn install(&self, live: &mut Live, instance: Box<dyn HandsInstance>) {
        live.generation += 1;
        let generation = live.generation;
        *self.token() = instance.endpoint().token.clone();
        {
            let mut status = self.status();
            status.isolation = Some(instance.isolation());
            status.root = Some(instance.root().to_owned());
        }
        let mut exited = instance.exited();
        let me = self.me.clone();
        tokio::spawn(async move {
            let why = match exited.wait_for(Option::is_some).await {
                Ok(why) => why.clone().unwrap_or_default(),
                Err(_) => return,
            };
            let Some(hands) = me.upgrade() else {
                return;
            };
            hands.died(generation, &why).await;
        });
        live.instance = Some(instance);
        if let Some(on_install) = self.on_install.get() {
            on_install();
        }
    }

    /// The death watcher: the instance of `generation` died on its own.
    async fn died(&self, generation: u64, why: &str) {
        let mut live = self.live.lock().await;
        if live.generation != generation || live.instance.is_none() {
            return;
        }
        if let Some(dead) = live.instance.take() {
            dead.stop().await;
        }
        self.mark_lost(why);
    }

    fn mark_lost(&self, why: &str) {
        {
            let mut status = self.status();
            if status.stopped {
                return;
            }
            status.state = HandsState::Lost;
            status.paused_at = None;
        }
        tracing::warn!(session = %self.session_id, why, "hands lost");
        self.emit_transition(
            "lost",
            Transition {
                // Noticed the moment the sandbox's exit was seen.
                elapsed_ms: Some(0),
                error: Some(if why.is_empty() {
                    "the sandbox exited".to_string()
                } else {
                    why.to_string()
                }),
                ..Transition::default()
            },
        );
    }

    /// Fresh hands with the snapshot restored into them: tried twice; after two failures the
    /// session goes on with an empty workspace and an `error` event.
    async fn start_restored(&self, live: &mut Live) -> Result<Option<SnapshotInfo>, HandsError> {
        let kept = match self.keeper() {
            Some(keeper) => keeper.newest().await.map(|info| (keeper.clone(), info)),
            None => None,
        };
        let info = match &kept {
            Some((_, info)) => Some(info.clone()),
            None => self.snapshots.info().await,
        };
        let mut last_error = String::new();
        for attempt in 1..=2 {
            let restored = match &kept {
                // On this disk, before the sandbox starts: the checkpoint replaces the trees
                // whole or not at all.
                Some((keeper, _)) => match keeper.restore_newest().await {
                    Ok(()) => self.start_instance(live).await.map(|()| Ok(()))?,
                    Err(e) => Err(e),
                },
                None => {
                    self.clear_workspace().await?;
                    self.start_instance(live).await?;
                    self.restore_into(live).await.map_err(|e| e.to_string())
                }
            };
            match restored {
                Ok(()) => return Ok(info),
                Err(e) => {
                    tracing::warn!(session = %self.session_id, attempt, error = %e, "restore failed");
                    last_error = e;
                    if let Some(instance) = live.instance.take() {
                        live.generation += 1;
                        instance.stop().await;
                    }
                }
            }
        }
        self.clear_workspace().await?;
        self.start_instance(live).await?;
        self.emit_error(
            "RESTORE_FAILED",
            format!("the workspace could not be restored ({last_error}); it starts empty"),
        );
        Ok(None)
    }

    async fn restore_into(&self, live: &Live) -> Result<(), HandsError> {
        let instance = live
            .instance
            .as_ref()
            .ok_or_else(|| HandsError::Failed("no sandbox to restore into".into()))?;
        let client = instance.endpoint().client()?;
        let body = self
            .snapshots
            .body()
            .await
            .map_err(|e| HandsError::Failed(format!("cannot read the snapshot: {e}")))?;
        client
            .restore(body)
            .await
            .map_err(|e| HandsError::Failed(format!("restore: {e}")))?;
        if let Some(home) = self.stored_home_snapshot().await {
            let body = home
                .body()
                .await
                .map_err(|e| HandsError::Failed(format!("cannot read the home snapshot: {e}")))?;
            client
                .restore_to(Tree::Home, body)
                .await
                .map_err(|e| HandsError::Failed(format!("restore of the agent's home: {e}")))?;
        }
        Ok(())
    }

    /// An empty workspace directory (what a restore needs).
    async fn clear_workspace(&self) -> Result<(), HandsError> {
        let mut trees = vec![self.workspace.clone()];
        // The home is emptied only when there is a snapshot of it to restore.
        if let (Some(home), Some(_)) = (&self.agent_home, self.stored_home_snapshot().await) {
            trees.push(home.clone());
        }
        tokio::task::spawn_blocking(move || {
            for tree in &trees {
                match std::fs::remove_dir_all(tree) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
                std::fs::create_dir_all(tree)?;
            }
            Ok(())
        })
        .await
        .map_err(|e| HandsError::Failed(e.to_string()))?
        .map_err(|e| HandsError::Failed(format!("cannot empty the workspace: {e}")))
    }

    /// Warren's exec tools bound to these hands, for `session/new` (starts the hands).
    pub async fn mcp_server(&self, warren_exe: &str) -> Result<McpServerSpec, HandsError> {
        let endpoint = self.endpoint().await?;
        Ok(McpServerSpec::warren_exec(
            warren_exe,
            &endpoint.url,
            &endpoint.token,
        ))
    }

    /// Takes a snapshot of the running hands into the session's snapshot file (replacing the
    /// previous one only once complete). `None` when no hands run. A failure (a full disk)
    /// leaves the previous snapshot intact and appends an `error` event.
    pub async fn snapshot(&self) -> Option<SnapshotInfo> {
        let _writing = self.snapshotting.lock().await;
        let client = {
            let live = self.live.lock().await;
            let instance = live.instance.as_ref()?;
            if self.state() != HandsState::Running {
                return None;
            }
            instance.endpoint().client().ok()?
        };
        self.status().changed = false;
        self.write_snapshot(&client, "files").await
    }

    /// Stores the files as they are: a checkpoint labelled `reason` when a [`Keeper`] keeps
    /// them, else the whole-tar snapshot streamed from the hands' execd.
    async fn write_snapshot(
        &self,
        client: &ExecdClient,
        reason: &'static str,
    ) -> Option<SnapshotInfo> {
        if let Some(keeper) = self.keeper() {
            return match keeper.keep(reason).await {
                Ok(info) => Some(info),
                Err(e) => {
                    self.snapshot_failed(&e);
                    None
                }
            };
        }
        let stream = match client.snapshot().await {
            Ok(stream) => stream,
            Err(e) => {
                self.snapshot_failed(&e.to_string());
                return None;
            }
        };
        let info = match self.snapshots.write(stream).await {
            Ok(info) => info,
            Err(e) => {
                self.snapshot_failed(&e.to_string());
                return None;
            }
        };
        if let Some(home) = self.home_snapshot_store() {
            let written = match client.snapshot_of(Tree::Home).await {
                Ok(stream) => home.write(stream).await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if let Err(e) = written {
                self.snapshot_failed(&format!("the agent's home: {e}"));
                return None;
            }
        }
        Some(info)
    }

    /// The agent home's snapshot store, when the agent lives in these (local) hands.
    fn home_snapshot_store(&self) -> Option<&SnapshotStore> {
        match self.isolation() {
            Isolation::Remote => None,
            Isolation::Bwrap | Isolation::None => self.home_snapshots.as_ref(),
        }
    }

    /// The agent home's snapshot store when it holds a snapshot (here or in object storage).
    async fn stored_home_snapshot(&self) -> Option<&SnapshotStore> {
        let home = self.home_snapshot_store()?;
        home.is_stored().await.then_some(home)
    }

    fn snapshot_failed(&self, why: &str) {
        if self.status().stopped {
            // The hands were stopped (the session is being deleted) while the snapshot ran:
            // it was cut short on purpose, and nobody is left to tell.
            tracing::debug!(session = %self.session_id, why, "snapshot cut short by a stop");
            return;
        }
        self.status().changed = true;
        tracing::warn!(session = %self.session_id, why, "snapshot failed");
        self.emit_error(
            "SNAPSHOT_FAILED",
            format!(
                "the workspace snapshot could not be written ({why}); the previous one is kept"
            ),
        );
    }

    /// A snapshot after a turn or file change, if the hands were used since the last one.
    pub async fn snapshot_if_changed(&self) -> Option<SnapshotInfo> {
        if !self.status().changed {
            return None;
        }
        self.snapshot().await
    }

    /// The idle sweeper's step: pauses idle running hands, archives long-paused ones.
    pub async fn sweep(&self, lifecycle: &Lifecycle) {
        let (state, idle_for, paused_for, n_holds, changed) = {
            let status = self.status();
            (
                status.state,
                status.last_use.elapsed(),
                status.paused_at.map(|at| at.elapsed()),
                status.n_holds,
                status.changed,
            )
        };
        match state {
            HandsState::Running if n_holds == 0 && idle_for >= lifecycle.idle_pause => {
                self.pause(Some(lifecycle.idle_pause)).await;
            }
            HandsState::Paused
                if paused_for.is_some_and(|paused| paused >= lifecycle.archive_after)
                    && !changed =>
            {
                self.archive(lifecycle.snapshot_max).await;
            }
            _ => {}
        }
    }

    /// Snapshot, then freeze (hands.md "Idle → pause"). `idle` re-checks that no use came in
    /// meanwhile; `None` pauses regardless (shutdown).
    pub async fn pause(&self, idle: Option<Duration>) {
        let _writing = self.snapshotting.lock().await;
        let live = self.live.lock().await;
        let Some(instance) = live.instance.as_ref() else {
            return;
        };
        {
            let status = self.status();
            if status.state != HandsState::Running || status.stopped {
                return;
            }
            if let Some(idle) = idle
                && (status.n_holds > 0 || status.last_use.elapsed() < idle)
            {
                return;
            }
        }
        if !instance.can_pause() {
            return;
        }
        let started = Instant::now();
        let snapshot = match instance.endpoint().client() {
            Ok(client) => self.write_snapshot(&client, "pause").await,
            Err(_) => None,
        };
        if let Err(e) = instance.freeze().await {
            tracing::warn!(session = %self.session_id, error = %e, "cannot freeze hands");
            self.emit_error(
                "PAUSE_FAILED",
                format!("the hands could not be paused: {e}"),
            );
            return;
        }
        {
            let mut status = self.status();
            status.state = HandsState::Paused;
            status.paused_at = Some(Instant::now());
            if snapshot.is_some() {
                status.changed = false;
            }
        }
        self.emit_transition(
            "paused",
            Transition {
                elapsed_ms: ms_since(started),
                snapshot,
                ..Transition::default()
            },
        );
    }

    /// Paused → archived: processes stopped, live workspace removed, the snapshot kept. Never
    /// when the snapshot is larger than `snapshot_max` or older than the last change.
    pub async fn archive(&self, snapshot_max: u64) {
        let mut live = self.live.lock().await;
        // Only files as the stored checkpoint or snapshot has them may be removed.
        if self.state() != HandsState::Paused || self.status().changed {
            return;
        }
        let kept = self.keeper().is_some();
        if !kept && !self.snapshots.exists() {
            return;
        }
        let Some(info) = self.stored_info().await else {
            return;
        };
        if info.bytes > snapshot_max {
            return;
        }
        let started = Instant::now();
        if let Some(instance) = live.instance.take() {
            live.generation += 1;
            instance.stop().await;
        }
        self.terminals_clear();
        let workspace = self.workspace.clone();
        let removed = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(workspace)).await;
        if let Ok(Err(e)) = removed {
            tracing::warn!(session = %self.session_id, error = %e, "cannot remove the archived workspace");
        }
        // The agent's home goes too once its checkpoint or snapshot holds it: the session is
        // its files.
        let home_kept = kept
            || self
                .home_snapshot_store()
                .is_some_and(SnapshotStore::exists);
        if let Some(home) = self.agent_home.clone().filter(|_| home_kept) {
            let removed = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(home)).await;
            if let Ok(Err(e)) = removed
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(session = %self.session_id, error = %e, "cannot remove the archived agent home");
            }
        }
        self.set_state(HandsState::Archived);
        self.emit_transition(
            "archived",
            Transition {
                elapsed_ms: ms_since(started),
                snapshot: Some(info),
                ..Transition::default()
            },
        );
    }

    /// Gateway start: takes over the sandbox an earlier gateway left, if any (paused, or
    /// running if it was never frozen); a sandbox that was left and died since makes the
    /// hands `lost`.
    pub async fn adopt(&self) {
        let mut live = self.live.lock().await;
        let started = Instant::now();
        match self.provider.adopt(&self.session_id).await {
            Ok(Some(instance)) => {
                // Hands a gateway paused at SIGTERM were snapshotted then: they stay paused and
                // may be archived. Hands a killed gateway left running stay running; the idle
                // sweeper snapshots and pauses them like any other.
                let frozen = instance.is_frozen();
                self.install(&mut live, instance);
                {
                    let mut status = self.status();
                    status.state = if frozen {
                        HandsState::Paused
                    } else {
                        HandsState::Running
                    };
                    status.paused_at = frozen.then(Instant::now);
                    status.changed = !frozen;
                }
                self.emit_transition(
                    if frozen { "paused" } else { "running" },
                    Transition {
                        elapsed_ms: ms_since(started),
                        message: Some("adopted after a gateway restart".into()),
                        ..Transition::default()
                    },
                );
                // A frozen execd answers once thawed (the watch starts then).
                if !frozen {
                    self.watch_files(&live).await;
                }
            }
            // No sandbox, no workspace: archived if a snapshot was stored, maybe by another
            // replica (in object storage only; the local case was seen at construction).
            Ok(None) => {
                if self.state() == HandsState::None
                    && self.workspace_gone()
                    && self.stored_info().await.is_some()
                {
                    let mut status = self.status();
                    status.state = HandsState::Archived;
                    status.paused_at = Some(Instant::now());
                }
            }
            Err(e) => self.mark_lost(&e.to_string()),
        }
    }

    /// Gateway shutdown: snapshot and freeze running hands, then leave them for the next
    /// gateway.
    pub async fn shutdown(&self) {
        self.pause(None).await;
        let mut live = self.live.lock().await;
        // From here on no use may start new hands: the next gateway owns this session's.
        self.status().stopped = true;
        if let Some(instance) = live.instance.take() {
            live.generation += 1;
            instance.detach();
        }
    }

    /// Stops the sandbox and every process in it and forgets it (session delete); later uses
    /// fail with [`HandsError::Stopped`].
    pub async fn stop(&self) {
        {
            let mut status = self.status();
            status.stopped = true;
            status.state = HandsState::None;
        }
        self.terminals_clear();
        let mut live = self.live.lock().await;
        if let Some(instance) = live.instance.take() {
            live.generation += 1;
            instance.stop().await;
        }
        self.provider.forget(&self.session_id);
    }

    /// Session delete, after [`Hands::stop`]: removes the session's objects in object storage
    /// (its snapshots), once any snapshot being written is done. A failure is logged and left:
    /// the session is gone either way, and its objects are then only unreachable bytes.
    pub async fn delete_snapshot_objects(&self) {
        let _writing = self.snapshotting.lock().await;
        match self.snapshots.delete_session_objects().await {
            Ok(0) => {}
            Ok(n_objects) => {
                tracing::info!(session = %self.session_id, n_objects, "deleted the session's snapshot objects");
            }
            Err(e) => {
                tracing::warn!(session = %self.session_id, error = %e, "cannot delete the session's snapshot objects");
            }
        }
    }

    fn terminals_clear(&self) {
        self.terminals
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clear();
    }
}
