//! Sessions: the registry (create, list, get, delete), each session's `meta.json` and event log,
//! and recovery at start.
//!
//! A session's mutable state lives in one place, [`SessionState`] behind the session's lock;
//! nothing holds that lock across an await. Ownership is checked here: a session of another
//! device is answered exactly like a missing one.
//!
//! Recovery: every `sessions/<id>/meta.json` is loaded, its `events.jsonl` repaired by the event
//! log, and a turn left open by a crash is closed with `permission_resolved` (`cancelled`) for
//! each unanswered request, `turn_end` (`interrupted`) and a `status` event. (Hands and agents a
//! killed gateway left running are stopped before this, through the gateway's tree registry.)

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use warren_protocol::gateway::{EventBody, SessionInfo};

use crate::admission::{Admission, BrainSlot, SessionSlot};
use crate::error::GatewayError;
use crate::event_log::EventLog;
use crate::hands::{Hands, HandsProvider};
use crate::store;
use crate::turns::{BrainState, PendingPermission};

/// `sessions/<id>/meta.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionMeta {
    pub id: String,
    pub device_id: String,
    pub title: String,
    pub created_at: String,
    /// The agent's ACP session id, for `session/resume` / `session/load` after a brain stop.
    #[serde(default)]
    pub acp_session_id: Option<String>,
}

pub struct Session {
    pub meta_path: PathBuf,
    pub id: String,
    pub device_id: String,
    pub title: String,
    pub created_at: String,
    pub dir: PathBuf,
    pub log: EventLog,
    /// The sandbox; nothing runs until first use.
    pub hands: Arc<Hands>,
    /// Held while the brain is being brought up, so two turns never start two workers.
    pub brain_gate: tokio::sync::Mutex<()>,
    state: Mutex<SessionState>,
}

/// Everything about a session that changes.
pub struct SessionState {
    /// Number of the last turn (0 before the first message).
    pub turn: u64,
    /// The turn in progress, if any.
    pub running_turn: Option<u64>,
    pub acp_session_id: Option<String>,
    pub brain: BrainState,
    /// A reserved brain slot, held while the session has (or is getting) a brain.
    pub brain_slot: Option<BrainSlot>,
    /// Unanswered permission requests of the running turn, by request id.
    pub pending_permissions: HashMap<String, PendingPermission>,
    /// Fired by `POST .../cancel`: the running turn's cancellation (a new token every turn).
    pub turn_cancel: tokio_util::sync::CancellationToken,
    pub last_active: Instant,
    pub deleted: bool,
    session_slot: Option<SessionSlot>,
}

impl Session {
    pub fn lock(&self) -> MutexGuard<'_, SessionState> {
        // State changes are plain field writes; a panic elsewhere cannot leave them half done.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn meta(&self) -> SessionMeta {
        SessionMeta {
            id: self.id.clone(),
            device_id: self.device_id.clone(),
            title: self.title.clone(),
            created_at: self.created_at.clone(),
            acp_session_id: self.lock().acp_session_id.clone(),
        }
    }

    pub fn save_meta(&self) -> Result<(), GatewayError> {
        store::write_json_atomic(&self.meta_path, &self.meta())?;
        Ok(())
    }

    pub fn workspace(&self) -> PathBuf {
        self.dir.join("workspace")
    }

    pub fn info(&self) -> SessionInfo {
        let state = self.lock();
        SessionInfo {
            id: self.id.clone(),
            title: self.title.clone(),
            created_at: self.created_at.clone(),
            status: if state.running_turn.is_some() {
                "running"
            } else {
                "idle"
            }
            .to_string(),
            turn: state.turn,
            last_seq: self.log.last_seq(),
            brain: state.brain.label().to_string(),
            hands: if self.hands.is_running() {
                "running"
            } else {
                "none"
            }
            .to_string(),
        }
    }

    /// Appends an event, logging (not failing) when the disk refuses: callers on background
    /// paths have no client to answer.
    pub fn emit(&self, turn: Option<u64>, body: EventBody) {
        if let Err(e) = self.log.append(turn, body) {
            tracing::error!(session = %self.id, error = %e, "cannot append event");
        }
    }
}

pub struct Sessions {
    dir: PathBuf,
    hands_provider: Arc<dyn HandsProvider>,
    admission: Arc<Admission>,
    by_id: Mutex<HashMap<String, Arc<Session>>>,
}

impl Sessions {
    /// Loads and recovers every session under `data_dir/sessions`.
    pub fn load(
        data_dir: &Path,
        admission: Arc<Admission>,
        hands_provider: Arc<dyn HandsProvider>,
    ) -> std::io::Result<Sessions> {
        let dir = data_dir.join("sessions");
        std::fs::create_dir_all(&dir)?;
        let mut by_id = HashMap::new();
        for entry in std::fs::read_dir(&dir)? {
            let session_dir = entry?.path();
            match recover_session(&session_dir, &admission, &hands_provider) {
                Ok(Some(session)) => {
                    by_id.insert(session.id.clone(), Arc::new(session));
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
            admission,
            by_id: Mutex::new(by_id),
        })
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

    /// Creates a session for `device_id`; reserves its quota slot and, when `want_brain` and the
    /// limits allow, a brain slot, in one atomic step.
    pub fn create(
        &self,
        device_id: &str,
        title: Option<String>,
        want_brain: bool,
    ) -> Result<(Arc<Session>, Option<BrainSlot>), GatewayError> {
        let (session_slot, brain_slot) = self.admission.reserve_session(device_id, want_brain)?;
        let id = uuid::Uuid::new_v4().to_string();
        let session_dir = self.dir.join(&id);
        std::fs::create_dir_all(session_dir.join("workspace"))?;
        let (log, _) = EventLog::open(&session_dir.join("events.jsonl"), |_| {})?;
        let session = Arc::new(Session {
            meta_path: session_dir.join("meta.json"),
            id: id.clone(),
            device_id: device_id.to_string(),
            title: title.unwrap_or_else(|| "untitled".to_string()),
            created_at: store::now_rfc3339(),
            hands: Hands::new(self.hands_provider.clone(), session_dir.join("workspace")),
            brain_gate: tokio::sync::Mutex::new(()),
            dir: session_dir.clone(),
            log,
            state: Mutex::new(SessionState::new(0, None, Some(session_slot))),
        });
        if let Err(e) = session.save_meta() {
            let _ = std::fs::remove_dir_all(&session_dir);
            return Err(e);
        }
        store::sync_dir(&self.dir)?;
        self.map().insert(id, session.clone());
        Ok((session, brain_slot))
    }

    /// The session `id` if `device_id` owns it; a foreign session is reported missing.
    pub fn get(&self, device_id: &str, id: &str) -> Result<Arc<Session>, GatewayError> {
        self.map()
            .get(id)
            .filter(|s| s.device_id == device_id)
            .cloned()
            .ok_or(GatewayError::SessionNotFound)
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

    /// Forgets the session, closes its log, gives back its slots and removes its files. The
    /// caller stops brain and hands first.
    pub async fn remove(&self, session: &Arc<Session>) -> Result<(), GatewayError> {
        self.map().remove(&session.id);
        {
            let mut state = session.lock();
            state.deleted = true;
            state.session_slot = None;
            state.brain_slot = None;
        }
        session.log.close();
        let dir = session.dir.clone();
        tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir))
            .await
            .map_err(|e| GatewayError::Internal(e.to_string()))??;
        Ok(())
    }
}

impl SessionState {
    fn new(turn: u64, acp_session_id: Option<String>, session_slot: Option<SessionSlot>) -> Self {
        SessionState {
            turn,
            running_turn: None,
            acp_session_id,
            brain: BrainState::default(),
            brain_slot: None,
            pending_permissions: HashMap::new(),
            turn_cancel: tokio_util::sync::CancellationToken::new(),
            last_active: Instant::now(),
            deleted: false,
            session_slot,
        }
    }
}

/// What replaying a log tells about the turn that was running when the gateway stopped.
#[derive(Default)]
struct Replay {
    last_turn: u64,
    open_turn: Option<u64>,
    open_permissions: HashSet<String>,
}

impl Replay {
    fn visit(&mut self, turn: Option<u64>, body: &EventBody) {
        match body {
            EventBody::UserMessage { .. } | EventBody::TurnStart {} => {
                if let Some(turn) = turn {
                    self.last_turn = self.last_turn.max(turn);
                    if self.open_turn != Some(turn) {
                        self.open_permissions.clear();
                    }
                    self.open_turn = Some(turn);
                }
            }
            EventBody::TurnEnd { .. } => {
                self.open_turn = None;
                self.open_permissions.clear();
            }
            EventBody::PermissionRequest { request_id, .. } => {
                self.open_permissions.insert(request_id.clone());
            }
            EventBody::PermissionResolved { request_id, .. } => {
                self.open_permissions.remove(request_id);
            }
            _ => {}
        }
    }
}

fn recover_session(
    dir: &Path,
    admission: &Arc<Admission>,
    hands_provider: &Arc<dyn HandsProvider>,
) -> std::io::Result<Option<Session>> {
    let meta_path = dir.join("meta.json");
    if !meta_path.exists() {
        return Ok(None);
    }
    let meta: SessionMeta = store::read_json(&meta_path)?;
    if dir.file_name().and_then(|n| n.to_str()) != Some(meta.id.as_str()) {
        tracing::warn!(dir = %dir.display(), "meta.json names another session; skipped");
        return Ok(None);
    }
    let mut replay = Replay::default();
    let (log, repair) = EventLog::open(&dir.join("events.jsonl"), |event| {
        replay.visit(event.turn, &event.body)
    })?;
    if let Some(turn) = replay.open_turn {
        let mut ids: Vec<_> = replay.open_permissions.drain().collect();
        ids.sort();
        for request_id in ids {
            log.append(
                Some(turn),
                EventBody::PermissionResolved {
                    request_id,
                    outcome: "cancelled".into(),
                    option_id: None,
                },
            )?;
        }
        log.append(
            Some(turn),
            EventBody::TurnEnd {
                stop_reason: "interrupted".into(),
            },
        )?;
        log.append(
            None,
            EventBody::Status {
                brain: Some("idle".into()),
                hands: None,
                message: Some("the gateway restarted; the running turn was interrupted".into()),
            },
        )?;
        log.sync()?;
    }
    tracing::info!(session = %meta.id, last_seq = log.last_seq(), ?repair, "session recovered");
    let slot = admission.adopt_session(&meta.device_id);
    Ok(Some(Session {
        meta_path,
        hands: Hands::new(hands_provider.clone(), dir.join("workspace")),
        brain_gate: tokio::sync::Mutex::new(()),
        dir: dir.to_path_buf(),
        state: Mutex::new(SessionState::new(
            replay.last_turn,
            meta.acp_session_id,
            Some(slot),
        )),
        id: meta.id,
        device_id: meta.device_id,
        title: meta.title,
        created_at: meta.created_at,
        log,
    }))
}
