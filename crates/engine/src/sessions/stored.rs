//! Where sessions are kept, the one place that knows it: files under `data/sessions/<id>/`
//! (`meta.json`, `events.jsonl`) or, with `--store postgres://…`, the `sessions` and `events`
//! tables with a local directory per session for its workspace. Loading at start, creating,
//! finding what another replica made, forgetting at delete and probing the store after a
//! failure: [`super::Sessions`] calls these and never asks which store it has.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use warren_store::file;
use warren_store::health::StorageHealth;
use warren_store::session_meta::MetaStore;

use crate::admission::{Admission, BrainSlot};
use crate::config::BrainPlacement;
use crate::engine_error::EngineError;
use crate::event_log::EventLog;
use crate::hands::{Hands, HandsProvider};
use crate::network::Network;
use crate::session::{OpenTurns, Session, SessionMeta};

use super::{Sessions, new_meta};

/// What a new session is made of: its device, title, whether it wants a brain now, and the
/// warm sandbox (id and hands) it takes, if any.
pub(crate) struct NewSession<'a> {
    pub device_id: &'a str,
    pub title: Option<String>,
    pub want_brain: bool,
    pub warm: Option<(String, Arc<Hands>)>,
}

/// What every session of the registry shares, handed to [`Sessions::open`].
pub struct Parts {
    pub admission: Arc<Admission>,
    pub hands_provider: Arc<dyn HandsProvider>,
    /// Where every session's agent runs (`--brain-placement`).
    pub placement: BrainPlacement,
    pub storage: Arc<StorageHealth>,
    /// The hands' network: each session's egress proxy.
    pub network: Arc<Network>,
    /// Each session's checkpoints (they keep the files of hands that do not run).
    pub checkpoints: Arc<crate::checkpoints::Checkpoints>,
}

impl Sessions {
    /// Loads every session where sessions are kept: files are read and repaired off the async
    /// workers; a store's rows are read with their events. Turns left open are closed by
    /// [`Sessions::close_turns_left_open`], once the gateway runs.
    pub async fn open(
        data_dir: &Path,
        store: Option<warren_store::pg::Store>,
        parts: Parts,
    ) -> Result<Sessions, EngineError> {
        match store {
            Some(store) => Self::load_postgres(data_dir, store, parts).await,
            None => {
                let data_dir = data_dir.to_path_buf();
                tokio::task::spawn_blocking(move || Self::load(&data_dir, parts))
                    .await
                    .map_err(|e| EngineError::Internal(e.to_string()))?
                    .map_err(EngineError::from)
            }
        }
    }

    /// Forgets the session `id` where it is stored, before anything of it is torn down: once
    /// its row is gone no replica loads it again, and a store that cannot be reached refuses
    /// the delete. (Its files go with its directory.)
    pub(crate) async fn forget_stored(&self, id: &str) -> Result<(), EngineError> {
        if let Some(store) = &self.store {
            store.delete_session(id).await?;
        }
        Ok(())
    }

    /// After a delete: the session's events and preview tokens in a store. Rows left behind
    /// are harmless (no session names them) but take space: said in the log.
    pub(crate) async fn forget_stored_rest(&self, id: &str) {
        let Some(store) = &self.store else {
            return;
        };
        if let Err(e) = store.delete_events(id).await {
            tracing::warn!(session = %id, error = %e, "the session's events stay in the store");
        }
        if let Err(e) = store.delete_preview_tokens(id).await {
            tracing::warn!(session = %id, error = %e, "the session's preview tokens stay in the store");
        }
    }

    /// Whether the store answers again after a failure (files: the space probe says that).
    pub(crate) async fn probe_store(&self) -> Result<(), EngineError> {
        if let Some(store) = &self.store {
            store.ping().await?;
        }
        Ok(())
    }

    /// Loads and repairs every session under `data_dir/sessions`. Turns left open are closed by
    /// [`Sessions::close_turns_left_open`], once the gateway runs.
    fn load(data_dir: &Path, parts: Parts) -> std::io::Result<Sessions> {
        let sessions = Sessions::empty(data_dir.join("sessions"), None, parts);
        std::fs::create_dir_all(&sessions.dir)?;
        for entry in std::fs::read_dir(&sessions.dir)? {
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
                &sessions.admission,
                &sessions.hands_provider,
                sessions.placement,
                &sessions.storage,
            );
            match recovered {
                Ok(Some(session)) => {
                    let session = Arc::new(session);
                    session.wire_hands();
                    sessions.network.attach(&session);
                    sessions.checkpoints.keep_files_of(&session);
                    sessions.tap_events(&session);
                    sessions.map().insert(session.id.clone(), session);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(dir = %session_dir.display(), error = %e, "session not recovered")
                }
            }
        }
        Ok(sessions)
    }

    /// Loads every session of a PostgreSQL store with its event log; a session without a
    /// directory under `data_dir/sessions` (made on another machine) gets one, and a directory
    /// that names no session (a warm sandbox nobody took, a session deleted elsewhere) goes.
    async fn load_postgres(
        data_dir: &Path,
        store: warren_store::pg::Store,
        parts: Parts,
    ) -> Result<Sessions, EngineError> {
        let rows = store.load_sessions().await?;
        let sessions = Sessions::empty(data_dir.join("sessions"), Some(store), parts);
        let known: std::collections::HashSet<String> =
            rows.iter().map(|(id, _, _)| id.clone()).collect();
        let scan_dir = sessions.dir.clone();
        tokio::task::spawn_blocking(move || remove_unknown_dirs(&scan_dir, &known))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))??;
        for (id, _, value) in rows {
            if let Err(e) = sessions.open_stored(&id, value).await {
                tracing::error!(session = %id, error = %e, "session not loaded from the store");
            }
        }
        Ok(sessions)
    }

    /// A registry with no session yet.
    fn empty(dir: PathBuf, store: Option<warren_store::pg::Store>, parts: Parts) -> Sessions {
        Sessions {
            dir,
            hands_provider: parts.hands_provider,
            placement: parts.placement,
            admission: parts.admission,
            storage: parts.storage,
            store,
            network: parts.network,
            checkpoints: parts.checkpoints,
            by_id: Mutex::new(HashMap::new()),
            event_hooks: Arc::default(),
        }
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
        self.checkpoints.keep_files_of(&session);
        self.tap_events(&session);
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

    /// Makes a new session where sessions are kept and registers it, with its quota slot and,
    /// when `want_brain` and the limits allow, a brain slot.
    pub(crate) async fn create(
        &self,
        new: NewSession<'_>,
    ) -> Result<(Arc<Session>, Option<BrainSlot>), EngineError> {
        match &self.store {
            Some(store) => self.create_in_store(store, new).await,
            None => self.create_in_files(new).await,
        }
    }

    /// [`Sessions::create`] with files: the quota slot and brain slot are reserved in one
    /// atomic step, then the files are made (and fsynced) off the async workers.
    async fn create_in_files(
        &self,
        new: NewSession<'_>,
    ) -> Result<(Arc<Session>, Option<BrainSlot>), EngineError> {
        let (session_slot, brain_slot) = self
            .admission
            .reserve_session(new.device_id, new.want_brain)?;
        let (meta, warm_hands) = new_meta(new.device_id, new.title, new.warm);
        let id = meta.id.clone();
        let session_dir = self.dir.join(&id);
        let meta_path = session_dir.join("meta.json");
        let making = {
            let (session_dir, sessions_dir) = (session_dir.clone(), self.dir.clone());
            let (storage, meta_path, meta) =
                (self.storage.clone(), meta_path.clone(), meta.clone());
            move || {
                std::fs::create_dir_all(session_dir.join("workspace"))?;
                let (log, _) = EventLog::open(&session_dir.join("events.jsonl"), storage, |_| {})?;
                file::write_json_atomic(&meta_path, &meta)?;
                file::sync_dir(&sessions_dir)?;
                Ok::<_, std::io::Error>(log)
            }
        };
        let made = tokio::task::spawn_blocking(making)
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        let log = match made {
            Ok(log) => log,
            Err(e) => {
                let dir = session_dir.clone();
                let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
                if file::is_storage_full(&e) {
                    self.storage.report(&e);
                }
                return Err(e.into());
            }
        };
        let hands = warm_hands.unwrap_or_else(|| self.new_hands(&id, &session_dir));
        let meta_store = MetaStore::File(meta_path);
        let session = self.list_new(meta, session_dir, meta_store, log, hands, session_slot);
        Ok((session, brain_slot))
    }

    /// A new session made of its parts, wired to its hands and network, and listed.
    fn list_new(
        &self,
        meta: SessionMeta,
        dir: std::path::PathBuf,
        meta_store: MetaStore,
        log: EventLog,
        hands: Arc<Hands>,
        slot: crate::admission::SessionSlot,
    ) -> Arc<Session> {
        let id = meta.id.clone();
        let session = Arc::new(Session::new(
            meta,
            dir,
            meta_store,
            log,
            hands,
            OpenTurns::default(),
            slot,
        ));
        session.wire_hands();
        self.network.attach(&session);
        self.checkpoints.keep_files_of(&session);
        self.tap_events(&session);
        self.map().insert(id, session.clone());
        session
    }

    /// [`Sessions::create`] in a PostgreSQL store: the device's quota is checked and
    /// the session's row inserted in one transaction (so replicas admitting at once never
    /// exceed it), then its directory is made and its (empty) event log opened.
    async fn create_in_store(
        &self,
        store: &warren_store::pg::Store,
        new: NewSession<'_>,
    ) -> Result<(Arc<Session>, Option<BrainSlot>), EngineError> {
        let NewSession {
            device_id,
            title,
            want_brain,
            warm,
        } = new;
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
        let meta_store = MetaStore::Postgres {
            store: store.clone(),
            id,
        };
        let session = self.list_new(meta, session_dir, meta_store, log, hands, session_slot);
        Ok((session, brain_slot))
    }
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
