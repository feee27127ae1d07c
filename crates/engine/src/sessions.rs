//! Sessions: the registry (create, list, get, delete, shut down), each session's files, recovery
//! at start, and the storage watch that brings event logs back after a failed write.
//!
//! Ownership is checked here: a session of another device is answered exactly like a missing
//! one. One session's state is [`crate::session`]'s business; this module only calls its
//! transitions.
//!
//! Recovery: every `sessions/<id>/meta.json` is loaded and its `events.jsonl` repaired by the
//! event log (with `--store postgres://…`: every row of the `sessions` table, with its events
//! from the store, and a local directory made for any that has none); every turn the log leaves open (a crash, or a disk that filled mid-turn) is closed
//! with `permission_resolved` (`cancelled`) for each unanswered request, `turn_end`
//! (`interrupted`) and a `status` event. (Hands and agents a killed gateway left running are
//! stopped before this, through the gateway's tree registry.)
//!
//! The storage watch: when an event log cannot write, the session's running turn ends at once
//! (its agent is cancelled), and new messages, sessions and devices are refused while the disk
//! is full (see [`StorageHealth`]). Every [`STORAGE_RETRY`] the watch probes for space; once a
//! probe passes, each failed log writes what it held and every turn left open is closed
//! `interrupted`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use crate::admission::Admission;
use crate::config::BrainPlacement;
use crate::engine::Engine;
use crate::engine_error::EngineError;
use crate::event_log::StoredEvent;
use crate::hands::{Hands, HandsProvider};
use crate::network::Network;
mod stored;

pub use stored::Parts;

// Re-exported: a session is reached through the registry, so callers name it from here.
pub use crate::session::{Session, SessionMeta};
use warren_store::file;
use warren_store::health::StorageHealth;

/// How often the storage watch probes for space while the storage fails.
pub const STORAGE_RETRY: Duration = Duration::from_millis(250);
/// How often the storage watch looks whether its gateway is still there while all is well.
const STORAGE_IDLE_CHECK: Duration = Duration::from_secs(5);

/// The `status` message of a turn closed at start.
const RESTART_MESSAGE: &str = "the gateway restarted; the running turn was interrupted";
/// The `status` message of a turn closed once the storage recovered.
const STORAGE_MESSAGE: &str =
    "the event log could not be written (storage failing); the running turn was interrupted";

/// Told of a session's id and each event its log's writer stored here (see
/// [`crate::event_log::Tap`]); it must not block.
pub type EventHook = Box<dyn Fn(&str, &Arc<StoredEvent>) + Send + Sync>;

pub struct Sessions {
    dir: PathBuf,
    hands_provider: Arc<dyn HandsProvider>,
    /// Where every session's agent runs (`--brain-placement`).
    placement: BrainPlacement,
    admission: Arc<Admission>,
    storage: Arc<StorageHealth>,
    /// `--store postgres://…`: session metadata and event logs live there.
    store: Option<warren_store::pg::Store>,
    /// The hands' network: each session's egress proxy.
    network: Arc<Network>,
    /// Each session's checkpoints (they keep the files of hands that do not run).
    checkpoints: Arc<crate::checkpoints::Checkpoints>,
    by_id: Mutex<HashMap<String, Arc<Session>>>,
    /// What [`Sessions::on_event_stored`] registered; every session's log taps them.
    event_hooks: Arc<RwLock<Vec<EventHook>>>,
}

impl Sessions {
    /// The PostgreSQL store, when sessions live there.
    pub fn store(&self) -> Option<&warren_store::pg::Store> {
        self.store.as_ref()
    }

    fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<Session>>> {
        // Map inserts and removes are single operations.
        self.by_id
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn admission(&self) -> &Arc<Admission> {
        &self.admission
    }

    pub fn storage(&self) -> &Arc<StorageHealth> {
        &self.storage
    }

    /// Calls `hook` with the session's id and every event a session's log stores here from
    /// now on, the sessions made or loaded later included. Events this replica only follows
    /// (another owns the session) are not told.
    pub fn on_event_stored(&self, hook: impl Fn(&str, &Arc<StoredEvent>) + Send + Sync + 'static) {
        self.event_hooks
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(Box::new(hook));
    }

    /// Taps `session`'s log for the [`Sessions::on_event_stored`] hooks (once, as it is listed).
    fn tap_events(&self, session: &Session) {
        let (hooks, id) = (self.event_hooks.clone(), session.id.clone());
        session.log.tap(Box::new(move |event| {
            // Written only to register a hook: a poisoned lock still holds every hook.
            let hooks = hooks
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            for hook in hooks.iter() {
                hook(&id, event);
            }
        }));
    }

    /// The hands' network of every session.
    pub fn network(&self) -> &Arc<Network> {
        &self.network
    }

    /// `data/sessions`: each session's directory is `<id>` in it.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Hands (not started) for the session `id` in `dir`, with this gateway's provider and
    /// brain placement.
    pub fn new_hands(&self, id: &str, dir: &Path) -> Arc<Hands> {
        Hands::new(self.hands_provider.clone(), id, dir, self.placement)
    }

    /// The session `id` if `device_id` owns it; a foreign session is reported missing.
    pub fn get(&self, device_id: &str, id: &str) -> Result<Arc<Session>, EngineError> {
        self.map()
            .get(id)
            .filter(|s| s.device_id == device_id)
            .cloned()
            .ok_or(EngineError::SessionNotFound)
    }

    /// The session `id`, whoever owns it (for credentials bound to one session, such as the
    /// model proxy's tokens).
    pub fn by_id(&self, id: &str) -> Option<Arc<Session>> {
        self.map().get(id).cloned()
    }

    pub fn list(&self, device_id: &str) -> Vec<Arc<Session>> {
        let mut sessions: Vec<_> = self
            .map()
            .values()
            .filter(|s| s.device_id == device_id)
            .cloned()
            .collect();
        sessions.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        sessions
    }

    pub fn all(&self) -> Vec<Arc<Session>> {
        self.map().values().cloned().collect()
    }

    pub fn count_for(&self, device_id: &str) -> usize {
        self.map()
            .values()
            .filter(|s| s.device_id == device_id)
            .count()
    }

    /// Closes every turn a session's log left open (at start: a crash, a full disk), of the
    /// sessions `owned` says this gateway runs.
    pub async fn close_turns_left_open(&self, owned: impl Fn(&Session) -> bool) {
        for session in self.all() {
            if !owned(&session) || !session.has_turns_left_open() {
                continue;
            }
            let closed = session
                .close_open_turns(Some("idle"), RESTART_MESSAGE)
                .map(|_| ());
            let synced = match closed {
                Ok(()) => session.log.sync().await,
                Err(e) => Err(e),
            };
            if let Err(e) = synced {
                // The storage watch closes them once the disk takes writes again.
                tracing::error!(session = %session.id, error = %e, "turns left open not closed yet");
            }
        }
    }
}

/// `POST /v1/sessions`: creates the session and, when the limits allow, takes a warm worker.
/// 507 while the disk is full.
pub async fn create_session(
    gateway: &Arc<Engine>,
    device_id: &str,
    title: Option<String>,
) -> Result<Arc<Session>, EngineError> {
    gateway.sessions.storage.check()?;
    // Only a worker that is already warm is taken here; starting one would make creation slow,
    // and the first message starts one anyway.
    // With the brain in the hands, a warm sandbox is taken whole: its hands and agent become
    // the session's.
    let warm = gateway.warm.take(gateway);
    let warm_available = warm.is_some() || gateway.pool.n_ready() > 0;
    let warm_parts = warm
        .as_ref()
        .map(|warm| (warm.id.clone(), warm.hands.clone()));
    let new = stored::NewSession {
        device_id,
        title,
        want_brain: warm_available,
        warm: warm_parts,
    };
    let created = gateway.sessions.create(new).await;
    let (session, brain_slot) = match created {
        Ok(created) => created,
        Err(e) => {
            if let Some(warm) = warm {
                // Refused (a quota, a full disk): the sandbox is nobody's, so it goes.
                crate::warm::discard(warm).await;
            }
            return Err(e);
        }
    };
    tracing::info!(session = %session.id, %device_id, warm = warm.is_some(), "session created");
    if let Some(replicas) = &gateway.replicas {
        // A new session is owned by the replica that made it.
        if let Err(e) = replicas.acquire(&session).await {
            tracing::warn!(session = %session.id, error = %e, "the new session's lease is taken at its first use");
        }
    }
    if let Some(warm) = warm {
        session.hands.announce_warm();
        match brain_slot {
            Some(slot) => {
                if let Some(unwanted) = session.adopt_warm_worker(warm.worker, slot) {
                    tokio::spawn(unwanted.kill());
                }
            }
            // No brain slot free: the hands stay, the agent goes; the first message starts one.
            None => {
                tokio::spawn(warm.worker.kill());
            }
        }
        return Ok(session);
    }
    if let Some(slot) = brain_slot {
        match gateway.pool.take().await {
            Ok(worker) => {
                if let Some(unwanted) = session.adopt_warm_worker(worker, slot) {
                    tokio::spawn(unwanted.kill());
                }
            }
            Err(e) => {
                tracing::warn!(session = %session.id, error = %e, "no warm worker; the first message starts one")
            }
        }
    }
    Ok(session)
}

/// `POST …/checkpoints/{id}/fork`: a new session of `device_id` whose workspace and agent
/// home are checkpoint `id`'s and whose first event names where it came from. When the
/// checkpoint holds the agent's home, the new session resumes the source's ACP session
/// from it. A fork that fails leaves no session behind.
pub async fn fork_session(
    engine: &Arc<Engine>,
    source: &Arc<Session>,
    id: &str,
    device_id: &str,
    title: Option<String>,
) -> Result<Arc<Session>, EngineError> {
    let (from, loaded) = engine.checkpoints.load(source, id, true).await?;
    let checkpoint = loaded.workspace.id.clone();
    let with_home = loaded.home.is_some();
    let title = title.unwrap_or_else(|| format!("{} (fork)", source.title()));
    let forked = create_session(engine, device_id, Some(title)).await?;
    let seeded = async {
        engine
            .checkpoints
            .seed(&from, loaded, source, &forked)
            .await?;
        if with_home && let Some(acp) = source.meta().acp_session_id {
            forked.continue_acp_session(acp).await?;
        }
        Ok::<(), EngineError>(())
    }
    .await;
    if let Err(e) = seeded {
        if let Err(deleted) = delete_session(engine, &forked).await {
            tracing::warn!(session = %forked.id, error = %deleted, "cannot remove a failed fork");
        }
        return Err(e);
    }
    // The fork's hands start on its files, so they are browsed and run at once.
    if let Err(e) = forked.hands.endpoint().await {
        tracing::warn!(session = %forked.id, error = %e, "the fork's hands start at its first use");
    }
    forked.emit(
        None,
        warren_protocol::gateway::EventBody::Forked {
            source_session: source.id.clone(),
            checkpoint,
        },
    );
    Ok(forked)
}

/// `DELETE /v1/sessions/{id}`: ends the turn, stops brain and hands (every process in them),
/// removes the data: workspace, snapshot, event log.
pub async fn delete_session(
    gateway: &Arc<Engine>,
    session: &Arc<Session>,
) -> Result<(), EngineError> {
    gateway.sessions.forget_stored(&session.id).await?;
    // The session's model token and socket go first: nothing it left running can use them.
    gateway.model.revoke(&session.id);
    gateway.model_sockets.stop(&session.id);
    gateway.sessions.network.detach(&session.id);
    gateway.session_gone(&session.id);
    gateway.checkpoints.forget(&session.id);
    session.hands.wake_for_brain_stop().await;
    session.retire_for_delete().stop().await;
    session.hands.stop().await;
    session.hands.delete_snapshot_objects().await;
    gateway.sessions.map().remove(&session.id);
    session.log.close().await;
    session.release_quota();
    gateway.sessions.forget_stored_rest(&session.id).await;
    if let Some(replicas) = &gateway.replicas {
        replicas.release(&session.id).await;
    }
    let dir = session.dir.clone();
    tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir))
        .await
        .map_err(|e| EngineError::Internal(e.to_string()))??;
    tracing::info!(session = %session.id, "session deleted");
    Ok(())
}

/// Shutdown: ends the running turn (`interrupted`), closes the brain, snapshots and pauses the
/// hands and leaves them for the next gateway, and flushes the log.
pub async fn shut_down_session(session: &Arc<Session>) {
    session.hands.wake_for_brain_stop().await;
    let retired = session.retire_for_shutdown();
    let had_brain = retired.was_ready();
    retired.stop().await;
    if had_brain {
        // The log says the brain is gone, so what follows the session (another replica's
        // list, a client) does not take it for running.
        session.emit(
            None,
            warren_protocol::gateway::EventBody::Status {
                brain: Some("idle".into()),
                hands: None,
                message: Some("the gateway stopped".into()),
            },
        );
    }
    session.hands.shutdown().await;
    session.log.close().await;
}

impl Sessions {
    /// Gateway start: every session takes over the hands an earlier gateway left for it, and
    /// hands left for sessions that are gone are stopped.
    pub async fn adopt_hands(&self, owned: impl Fn(&Session) -> bool) {
        let sessions: Vec<Arc<Session>> = self.all().into_iter().filter(|s| owned(s)).collect();
        futures_util::future::join_all(sessions.iter().map(|session| session.hands.adopt())).await;
        let live: Vec<String> = sessions.iter().map(|session| session.id.clone()).collect();
        let n_strays = self.hands_provider.stop_strays(&live).await;
        if n_strays > 0 {
            tracing::warn!(n_strays, "stopped hands whose sessions are gone");
        }
    }
}

/// Starts the storage watch (see the module docs). It ends with the gateway.
pub fn spawn_storage_watch(gateway: &Arc<Engine>) {
    let weak = Arc::downgrade(gateway);
    let storage = gateway.sessions.storage.clone();
    let data_dir = gateway.args.data.clone();
    tokio::spawn(async move {
        loop {
            let period = match storage.failure() {
                Some(_) => STORAGE_RETRY,
                None => STORAGE_IDLE_CHECK,
            };
            tokio::select! {
                () = storage.next_report() => {}
                () = tokio::time::sleep(period) => {}
            }
            let Some(gateway) = weak.upgrade() else {
                return;
            };
            if storage.failure().is_none() {
                continue;
            }
            let sessions = gateway.sessions.all();
            for session in &sessions {
                if session.log.is_failing()
                    && let Some(turn) = session.storage_failed()
                {
                    tracing::warn!(session = %session.id, turn, "turn ended: its events cannot be stored");
                }
            }
            let n_reports = storage.n_reports();
            let probe_dir = data_dir.clone();
            let probed = tokio::task::spawn_blocking(move || file::probe_space(&probe_dir)).await;
            match probed {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "storage still failing");
                    continue;
                }
                Err(e) => {
                    tracing::error!(error = %e, "storage probe panicked");
                    continue;
                }
            }
            if let Err(e) = gateway.sessions.probe_store().await {
                tracing::debug!(error = %e, "store still unavailable");
                continue;
            }
            let mut all_resumed = true;
            for session in &sessions {
                if let Err(e) = resume_storage(session).await {
                    tracing::debug!(session = %session.id, error = %e, "event log not resumed yet");
                    all_resumed = false;
                }
            }
            if all_resumed && storage.recovered(n_reports) {
                tracing::info!("storage recovered: event logs write again");
            }
        }
    });
}

/// Brings one session's log back after a failed write: the running turn ends (if the failure
/// has not ended it yet), the held events are written, and every turn left open is closed.
async fn resume_storage(session: &Session) -> Result<(), crate::event_log::AppendError> {
    if session.log.is_failing() {
        session.storage_failed();
        session.log.resume().await?;
    }
    if session.has_turns_left_open() {
        session.close_open_turns(None, STORAGE_MESSAGE)?;
        session.log.sync().await?;
    }
    Ok(())
}

/// A new session's meta and, when it takes a warm sandbox, that sandbox's hands (a warm
/// sandbox was made under its session's id, in its session's directory).
fn new_meta(
    device_id: &str,
    title: Option<String>,
    warm: Option<(String, Arc<Hands>)>,
) -> (SessionMeta, Option<Arc<Hands>>) {
    let (id, warm_hands) = match warm {
        Some((id, hands)) => (id, Some(hands)),
        None => (uuid::Uuid::new_v4().to_string(), None),
    };
    let meta = SessionMeta {
        id,
        device_id: device_id.to_string(),
        title: title.unwrap_or_else(|| "untitled".to_string()),
        created_at: file::now_rfc3339(),
        acp_session_id: None,
        hands_nonce: None,
    };
    (meta, warm_hands)
}
