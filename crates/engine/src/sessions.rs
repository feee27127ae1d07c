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
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::admission::{Admission, BrainSlot};
use crate::config::BrainPlacement;
use crate::engine::Engine;
use crate::engine_error::EngineError;
use crate::event_log::EventLog;
use crate::hands::{Hands, HandsProvider};
use crate::network::Network;
use crate::session::OpenTurns;
use warren_store::session_meta::MetaStore;
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
    by_id: Mutex<HashMap<String, Arc<Session>>>,
}

impl Sessions {
    /// Loads and repairs every session under `data_dir/sessions`. Turns left open are closed by
    /// [`Sessions::close_turns_left_open`], once the gateway runs.
    pub fn load(
        data_dir: &Path,
        admission: Arc<Admission>,
        hands_provider: Arc<dyn HandsProvider>,
        placement: BrainPlacement,
        storage: Arc<StorageHealth>,
        network: Arc<Network>,
    ) -> std::io::Result<Sessions> {
        let dir = data_dir.join("sessions");
        std::fs::create_dir_all(&dir)?;
        let mut by_id = HashMap::new();
        for entry in std::fs::read_dir(&dir)? {
            let session_dir = entry?.path();
            // A warm sandbox's directory (no `meta.json`: no session took it) is removed;
            // its hands are stopped as strays once the gateway runs.
            if session_dir.is_dir() && !session_dir.join("meta.json").exists() {
                tracing::info!(dir = %session_dir.display(), "removing a warm sandbox no session took");
                let _ = std::fs::remove_dir_all(&session_dir);
                continue;
            }
            let recovered = recover_session(
                &session_dir,
                &admission,
                &hands_provider,
                placement,
                &storage,
            );
            match recovered {
                Ok(Some(session)) => {
                    let session = Arc::new(session);
                    session.wire_hands();
                    network.attach(&session);
                    by_id.insert(session.id.clone(), session);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(dir = %session_dir.display(), error = %e, "session not recovered")
                }
            }
        }
        Ok(Sessions {
            dir,
            hands_provider,
            placement,
            admission,
            storage,
            store: None,
            network,
            by_id: Mutex::new(by_id),
        })
    }

    /// Loads every session of a PostgreSQL store with its event log; a session without a
    /// directory under `data_dir/sessions` (made on another machine) gets one, and a directory
    /// that names no session (a warm sandbox nobody took, a session deleted elsewhere) goes.
    pub async fn load_postgres(
        data_dir: &Path,
        store: warren_store::pg::Store,
        admission: Arc<Admission>,
        hands_provider: Arc<dyn HandsProvider>,
        placement: BrainPlacement,
        storage: Arc<StorageHealth>,
        network: Arc<Network>,
    ) -> Result<Sessions, EngineError> {
        let dir = data_dir.join("sessions");
        let rows = store.load_sessions().await?;
        let known: std::collections::HashSet<String> =
            rows.iter().map(|(id, _, _)| id.clone()).collect();
        let scan_dir = dir.clone();
        tokio::task::spawn_blocking(move || remove_unknown_dirs(&scan_dir, &known))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))??;
        let sessions = Sessions {
            dir,
            hands_provider,
            placement,
            admission,
            storage,
            store: Some(store),
            network,
            by_id: Mutex::new(HashMap::new()),
        };
        for (id, _, value) in rows {
            if let Err(e) = sessions.open_stored(&id, value).await {
                tracing::error!(session = %id, error = %e, "session not loaded from the store");
            }
        }
        Ok(sessions)
    }

    /// Opens the stored session `id` (its meta as stored) with its event log, and registers it.
    async fn open_stored(
        &self,
        id: &str,
        value: serde_json::Value,
    ) -> Result<Arc<Session>, EngineError> {
        let store = self
            .store
            .clone()
            .ok_or_else(|| EngineError::Internal("no store".into()))?;
        let meta: SessionMeta = serde_json::from_value(value).map_err(|e| {
            EngineError::Internal(format!("stored session meta of {id} does not parse: {e}"))
        })?;
        if meta.id != id {
            return Err(EngineError::Internal(format!(
                "stored session meta of {id} names another session"
            )));
        }
        // Only the directory: the hands make the workspace when they start, and a session whose
        // workspace is missing with a snapshot stored (made on another machine) is archived.
        let session_dir = self.dir.join(&meta.id);
        let making = session_dir.clone();
        tokio::task::spawn_blocking(move || std::fs::create_dir_all(making))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))??;
        let mut open_turns = OpenTurns::default();
        let log = EventLog::open_postgres(store.clone(), &meta.id, self.storage.clone(), |event| {
            open_turns.visit(event.turn, &event.body)
        })
        .await?;
        tracing::info!(session = %meta.id, last_seq = log.last_seq(), "session loaded from the store");
        let slot = self.admission.adopt_session(&meta.device_id);
        let hands = Hands::new(
            self.hands_provider.clone(),
            &meta.id,
            &session_dir,
            self.placement,
        );
        let session = Arc::new(Session::new(
            meta,
            session_dir,
            MetaStore::Postgres {
                store,
                id: id.to_owned(),
            },
            log,
            hands,
            open_turns,
            slot,
        ));
        session.wire_hands();
        self.network.attach(&session);
        // Two requests may load one session at once: the first registered stays.
        let registered = self
            .map()
            .entry(session.id.clone())
            .or_insert_with(|| session.clone())
            .clone();
        if !Arc::ptr_eq(&registered, &session) {
            session.log.close().await;
        }
        Ok(registered)
    }

    /// The session `id`, loaded from the store when another replica made it since this one
    /// started; `None` when there is no such session (one deleted on another replica is
    /// forgotten here too). Without a store, what the map holds.
    pub async fn find(&self, id: &str) -> Result<Option<Arc<Session>>, EngineError> {
        let local = self.by_id(id);
        let Some(store) = &self.store else {
            return Ok(local);
        };
        match (local, store.session_meta(id).await?) {
            (Some(session), Some(_)) => Ok(Some(session)),
            (None, Some(value)) => self.open_stored(id, value).await.map(Some),
            (Some(session), None) => {
                // Deleted by its owner on another replica.
                self.map().remove(id);
                session.log.close().await;
                Ok(None)
            }
            (None, None) => Ok(None),
        }
    }

    /// Loads every stored session this replica has not loaded yet (made on another replica).
    pub async fn load_missing(&self) -> Result<(), EngineError> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        for (id, _, value) in store.load_sessions().await? {
            if self.by_id(&id).is_none()
                && let Err(e) = self.open_stored(&id, value).await
            {
                tracing::error!(session = %id, error = %e, "session not loaded from the store");
            }
        }
        Ok(())
    }

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

    /// Makes a session's files and registers it; reserves its quota slot and, when
    /// `want_brain` and the limits allow, a brain slot, in one atomic step. Blocking (fsyncs).
    fn create_blocking(
        &self,
        device_id: &str,
        title: Option<String>,
        want_brain: bool,
        warm: Option<(String, Arc<Hands>)>,
    ) -> Result<(Arc<Session>, Option<BrainSlot>), EngineError> {
        let (session_slot, brain_slot) = self.admission.reserve_session(device_id, want_brain)?;
        let (meta, warm_hands) = new_meta(device_id, title, warm);
        let id = meta.id.clone();
        let session_dir = self.dir.join(&id);
        let made = (|| {
            std::fs::create_dir_all(session_dir.join("workspace"))?;
            let (log, _) = EventLog::open(
                &session_dir.join("events.jsonl"),
                self.storage.clone(),
                |_| {},
            )?;
            let hands = warm_hands
                .clone()
                .unwrap_or_else(|| self.new_hands(&id, &session_dir));
            let session = Session::new(
                meta,
                session_dir.clone(),
                MetaStore::File(session_dir.join("meta.json")),
                log,
                hands,
                OpenTurns::default(),
                session_slot,
            );
            file::write_json_atomic(&session_dir.join("meta.json"), &session.meta())?;
            file::sync_dir(&self.dir)?;
            Ok::<_, std::io::Error>(session)
        })();
        let session = match made {
            Ok(session) => {
                let session = Arc::new(session);
                session.wire_hands();
                self.network.attach(&session);
                session
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&session_dir);
                if file::is_storage_full(&e) {
                    self.storage.report(&e);
                }
                return Err(e.into());
            }
        };
        self.map().insert(id, session.clone());
        Ok((session, brain_slot))
    }

    /// [`Sessions::create_blocking`] for a PostgreSQL store: the device's quota is checked and
    /// the session's row inserted in one transaction (so replicas admitting at once never
    /// exceed it), then its directory is made and its (empty) event log opened.
    async fn create_in_store(
        &self,
        store: &warren_store::pg::Store,
        device_id: &str,
        title: Option<String>,
        want_brain: bool,
        warm: Option<(String, Arc<Hands>)>,
    ) -> Result<(Arc<Session>, Option<BrainSlot>), EngineError> {
        // The store's count is the quota across replicas: this replica's own count may still
        // hold sessions another replica deleted (a 204 there frees the slot everywhere), so it
        // only follows the store here and never refuses on its own.
        let session_slot = self.admission.adopt_session(device_id);
        let (meta, warm_hands) = new_meta(device_id, title, warm);
        let id = meta.id.clone();
        let value =
            serde_json::to_value(&meta).map_err(|e| EngineError::Internal(e.to_string()))?;
        let limit = self.admission.limits().sessions_per_device;
        match store
            .create_session_within(&id, device_id, &value, limit)
            .await?
        {
            warren_store::admission::Admit::Admitted => {}
            _ => {
                return Err(EngineError::QuotaExceeded(format!(
                    "a device may hold {limit} sessions"
                )));
            }
        }
        let session_dir = self.dir.join(&id);
        let made = async {
            let workspace = session_dir.join("workspace");
            tokio::task::spawn_blocking(move || std::fs::create_dir_all(workspace))
                .await
                .map_err(|e| EngineError::Internal(e.to_string()))??;
            let log =
                EventLog::open_postgres(store.clone(), &id, self.storage.clone(), |_| {}).await?;
            Ok::<_, EngineError>(log)
        }
        .await;
        let log = match made {
            Ok(log) => log,
            Err(e) => {
                if let Err(undo) = store.delete_session(&id).await {
                    tracing::error!(session = %id, error = %undo, "a session that could not be made keeps its row");
                }
                let dir = session_dir.clone();
                let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
                return Err(e);
            }
        };
        // A brain now when the device's brains on every replica together leave room: without
        // one the session is made all the same, and its first message reserves one.
        let brain_slot = match want_brain {
            true => match self.admission.ticket(&id, device_id).await {
                Ok(ticket) => self.admission.reserve_brain(device_id, &id, ticket).ok(),
                Err(e) => {
                    tracing::debug!(session = %id, error = %e, "no brain slot at creation");
                    None
                }
            },
            false => None,
        };
        let hands = warm_hands.unwrap_or_else(|| self.new_hands(&id, &session_dir));
        let session = Arc::new(Session::new(
            meta,
            session_dir,
            MetaStore::Postgres {
                store: store.clone(),
                id: id.clone(),
            },
            log,
            hands,
            OpenTurns::default(),
            session_slot,
        ));
        session.wire_hands();
        self.network.attach(&session);
        self.map().insert(id, session.clone());
        Ok((session, brain_slot))
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
    let created = match gateway.sessions.store() {
        Some(store) => {
            gateway
                .sessions
                .create_in_store(store, device_id, title, warm_available, warm_parts)
                .await
        }
        None => {
            // Creation fsyncs the new files: keep it off the async workers.
            let creating = gateway.clone();
            let owner = device_id.to_string();
            tokio::task::spawn_blocking(move || {
                creating
                    .sessions
                    .create_blocking(&owner, title, warm_available, warm_parts)
            })
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))
            .and_then(|created| created)
        }
    };
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

/// `DELETE /v1/sessions/{id}`: ends the turn, stops brain and hands (every process in them),
/// removes the data: workspace, snapshot, event log.
pub async fn delete_session(
    gateway: &Arc<Engine>,
    session: &Arc<Session>,
) -> Result<(), EngineError> {
    // In a store, the row goes first: once it is gone no replica loads the session again, and
    // a store that cannot be reached refuses the delete before anything is torn down.
    if let Some(store) = gateway.sessions.store() {
        store.delete_session(&session.id).await?;
    }
    // The session's model token and socket go first: nothing it left running can use them.
    gateway.model.revoke(&session.id);
    gateway.model_sockets.stop(&session.id);
    gateway.sessions.network.detach(&session.id);
    gateway.session_gone(&session.id);
    session.hands.wake_for_brain_stop().await;
    session.retire_for_delete().stop().await;
    session.hands.stop().await;
    session.hands.delete_snapshot_objects().await;
    gateway.sessions.map().remove(&session.id);
    session.log.close().await;
    session.release_quota();
    if let Some(store) = gateway.sessions.store() {
        // Left rows are harmless (no session names them) but take space: say so.
        if let Err(e) = store.delete_events(&session.id).await {
            tracing::warn!(session = %session.id, error = %e, "the session's events stay in the store");
        }
        if let Err(e) = store.delete_preview_tokens(&session.id).await {
            tracing::warn!(session = %session.id, error = %e, "the session's preview tokens stay in the store");
        }
    }
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
    let pg = gateway.sessions.store.clone();
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
            if let Some(pg) = &pg
                && let Err(e) = pg.ping().await
            {
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

/// Removes every directory under `sessions_dir` whose name is not in `known`.
fn remove_unknown_dirs(
    sessions_dir: &Path,
    known: &std::collections::HashSet<String>,
) -> std::io::Result<()> {
    std::fs::create_dir_all(sessions_dir)?;
    for entry in std::fs::read_dir(sessions_dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() && !known.contains(name) {
            tracing::info!(dir = %path.display(), "removing a directory that names no stored session");
            let _ = std::fs::remove_dir_all(&path);
        }
    }
    Ok(())
}

fn recover_session(
    dir: &Path,
    admission: &Arc<Admission>,
    hands_provider: &Arc<dyn HandsProvider>,
    placement: BrainPlacement,
    storage: &Arc<StorageHealth>,
) -> std::io::Result<Option<Session>> {
    let meta_path = dir.join("meta.json");
    if !meta_path.exists() {
        return Ok(None);
    }
    let meta: SessionMeta = file::read_json(&meta_path)?;
    if dir.file_name().and_then(|n| n.to_str()) != Some(meta.id.as_str()) {
        tracing::warn!(dir = %dir.display(), "meta.json names another session; skipped");
        return Ok(None);
    }
    let mut open_turns = OpenTurns::default();
    let (log, repair) = EventLog::open(&dir.join("events.jsonl"), storage.clone(), |event| {
        open_turns.visit(event.turn, &event.body)
    })?;
    tracing::info!(session = %meta.id, last_seq = log.last_seq(), ?repair, "session recovered");
    let slot = admission.adopt_session(&meta.device_id);
    let hands = Hands::new(hands_provider.clone(), &meta.id, dir, placement);
    Ok(Some(Session::new(
        meta,
        dir.to_path_buf(),
        MetaStore::File(meta_path),
        log,
        hands,
        open_turns,
        slot,
    )))
}
