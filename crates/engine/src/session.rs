//! One session: who owns it, its event log, its hands, and [`SessionState`], everything about it
//! that changes, behind one lock that nothing holds across an await (every method here that
//! takes it is synchronous).
//!
//! The state has private fields and changes only through the transitions below, each of which
//! appends its own events while holding the lock, so no other turn or request can interleave
//! theirs. The brain and its admission slot are one value, [`BrainState`]: whenever a brain goes
//! away (stopped, idle, dead, the session deleted), its slot goes with it.
//!
//! [`OpenTurns`] follows what the event log holds: the turns opened and not yet closed, with
//! their unanswered permission requests. Replayed at start, and kept up to date by every append
//! made here, it is what "close every turn left open" closes, at a restart as well as when the
//! storage comes back after a failed write. Deliberately absent: starting brains and running
//! turns (`turns`), the registry and recovery (`sessions`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use warren_brain::{BrainSession, Worker};
use warren_protocol::gateway::{EventBody, ModelUsage, SessionInfo, UsageTotals};

use crate::admission::{Admission, BrainSlot, SessionSlot, StoreTicket};
use crate::engine_error::EngineError;
use crate::event_log::{AppendError, EventLog, StoredEvent};
use crate::hands::Hands;
use warren_store::session_meta::{MetaStore, Reloaded};

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
    /// The nonce the session's remote hands last reported, so the next gateway (or replica)
    /// tells an execd replaced at the address from the same one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hands_nonce: Option<String>,
}

pub struct Session {
    pub id: String,
    pub device_id: String,
    pub created_at: String,
    pub dir: PathBuf,
    meta_store: MetaStore,
    pub log: EventLog,
    /// The sandbox; nothing runs until first use.
    pub hands: Arc<Hands>,
    /// Held while the brain is being brought up, so two turns never start two workers.
    pub brain_gate: tokio::sync::Mutex<()>,
    state: Mutex<SessionState>,
}

/// Everything about a session that changes.
pub struct SessionState {
    /// The title the person gave (or `untitled`); `PATCH /v1/sessions/{id}` changes it.
    title: String,
    /// Number of the last turn (0 before the first message).
    turn: u64,
    running: Option<RunningTurn>,
    acp_session_id: Option<String>,
    brain: BrainState,
    last_active: Instant,
    deleted: bool,
    session_slot: Option<SessionSlot>,
    /// The turns the event log has opened and not closed.
    open_turns: OpenTurns,
    /// Model tokens used through the model proxy, all turns together.
    usage: UsageTotals,
    /// The notice of a rewind since the agent's last prompt (checkpoints.md).
    rewound: Option<warren_brain::Notice>,
}

/// The turn in progress.
struct RunningTurn {
    turn: u64,
    /// Fired by `POST .../cancel`, a storage failure, delete and shutdown.
    cancel: CancellationToken,
    /// Unanswered permission requests, by request id.
    pending_permissions: HashMap<String, PendingPermission>,
    /// Model tokens this turn used.
    usage: UsageTotals,
}

/// An unanswered `permission_request`.
pub struct PendingPermission {
    answer: oneshot::Sender<String>,
    /// The `optionId`s the agent offered.
    option_ids: Vec<String>,
}

impl PendingPermission {
    pub fn new(answer: oneshot::Sender<String>, option_ids: Vec<String>) -> PendingPermission {
        PendingPermission { answer, option_ids }
    }
}

/// A session's brain and the admission slot it counts against, as one value.
enum BrainState {
    None,
    /// A slot reserved for the brain a turn is starting (the worker, if any, is out being
    /// bound to an ACP session).
    Starting(BrainSlot),
    /// A warm, initialized worker taken from the pool; no ACP session yet.
    Warm(Worker, BrainSlot),
    Ready(Arc<BrainSession>, BrainSlot),
}

impl BrainState {
    fn label(&self) -> &'static str {
        match self {
            BrainState::None | BrainState::Starting(_) => "none",
            BrainState::Warm(..) => "warm",
            BrainState::Ready(..) => "ready",
        }
    }

    fn holds_slot(&self) -> bool {
        !matches!(self, BrainState::None)
    }
}

/// A brain taken from its session, to be stopped; its slot is given back once it is.
pub struct RetiredBrain(BrainState);

impl RetiredBrain {
    /// Whether it was a brain with an ACP session (not a warm worker, not none).
    pub fn was_ready(&self) -> bool {
        matches!(self.0, BrainState::Ready(..))
    }

    /// Stops the brain: `session/close` then kill when this is the only handle; otherwise the
    /// last handle's drop kills the worker.
    pub async fn stop(self) {
        match self.0 {
            BrainState::None | BrainState::Starting(_) => {}
            BrainState::Warm(worker, _slot) => worker.kill().await,
            BrainState::Ready(brain, _slot) => stop_brain_session(brain).await,
        }
    }
}

/// Stops a brain: closes its ACP session when nothing else holds it, else (a turn still runs,
/// e.g. waiting on hands that are being paused) kills the agent outright, so it never outlives
/// its session.
pub async fn stop_brain_session(brain: Arc<BrainSession>) {
    brain.cancel().await;
    match Arc::try_unwrap(brain) {
        Ok(brain) => brain.close().await,
        Err(shared) => shared.kill().await,
    }
}

/// What a turn about to prompt finds (see [`Session::brain_for_turn`]).
pub enum BrainStart {
    Ready(Arc<BrainSession>),
    /// No live brain: start one, from `worker` when there is a warm one, resuming
    /// `acp_session_id` when there is one.
    Start {
        worker: Option<Worker>,
        acp_session_id: Option<String>,
    },
}

/// The turns an event log leaves open: opened by `user_message` or `turn_start`, closed by
/// `turn_end`, each with the permission requests it has not resolved.
#[derive(Debug, Default)]
pub struct OpenTurns {
    by_turn: BTreeMap<u64, BTreeSet<String>>,
    last_turn: u64,
    /// The `usage` events seen, summed: the session's totals at start.
    usage: UsageTotals,
    /// The brain and hands as the last `status` and `hands` events said (what a replica that
    /// follows the session reports of them).
    brain_said: Option<String>,
    hands_said: Option<String>,
}

impl OpenTurns {
    /// Follows one stored event.
    pub fn visit(&mut self, turn: Option<u64>, body: &EventBody) {
        match body {
            EventBody::UserMessage { .. } | EventBody::TurnStart {} => {
                if let Some(turn) = turn {
                    self.last_turn = self.last_turn.max(turn);
                    self.by_turn.entry(turn).or_default();
                }
            }
            EventBody::TurnEnd { .. } => {
                let closed = turn.or_else(|| self.by_turn.keys().next_back().copied());
                if let Some(turn) = closed {
                    self.by_turn.remove(&turn);
                }
            }
            EventBody::PermissionRequest { request_id, .. } => {
                let open = turn
                    .filter(|turn| self.by_turn.contains_key(turn))
                    .or_else(|| self.by_turn.keys().next_back().copied());
                if let Some(requests) = open.and_then(|turn| self.by_turn.get_mut(&turn)) {
                    requests.insert(request_id.clone());
                }
            }
            EventBody::PermissionResolved { request_id, .. } => {
                for requests in self.by_turn.values_mut() {
                    requests.remove(request_id);
                }
            }
            EventBody::Usage(usage) => self.usage.add(usage),
            EventBody::Status { brain, hands, .. } => {
                if brain.is_some() {
                    self.brain_said.clone_from(brain);
                }
                if hands.is_some() {
                    self.hands_said.clone_from(hands);
                }
            }
            EventBody::Hands { state, .. } => self.hands_said = Some(state.clone()),
            _ => {}
        }
    }

    /// The sum of the `usage` events seen.
    pub fn usage(&self) -> UsageTotals {
        self.usage
    }

    /// The newest turn number seen.
    pub fn last_turn(&self) -> u64 {
        self.last_turn
    }

    /// Open turns other than `except`, oldest first, with their unresolved request ids.
    fn all_but(&self, except: Option<u64>) -> Vec<(u64, Vec<String>)> {
        self.by_turn
            .iter()
            .filter(|(turn, _)| Some(**turn) != except)
            .map(|(turn, requests)| (*turn, requests.iter().cloned().collect()))
            .collect()
    }
}

/// The structural effect of an event on [`OpenTurns`], kept while the body moves into the log.
enum Mark {
    Opens(Option<u64>),
    Closes(Option<u64>),
    Asks(Option<u64>, String),
    Resolves(String),
    Nothing,
}

impl Mark {
    fn of(turn: Option<u64>, body: &EventBody) -> Mark {
        match body {
            EventBody::UserMessage { .. } | EventBody::TurnStart {} => Mark::Opens(turn),
            EventBody::TurnEnd { .. } => Mark::Closes(turn),
            EventBody::PermissionRequest { request_id, .. } => Mark::Asks(turn, request_id.clone()),
            EventBody::PermissionResolved { request_id, .. } => Mark::Resolves(request_id.clone()),
            _ => Mark::Nothing,
        }
    }

    fn apply(self, open_turns: &mut OpenTurns) {
        // Replays the effect with a body of the same kind (the contents do not matter).
        let (turn, body) = match self {
            Mark::Opens(turn) => (turn, EventBody::TurnStart {}),
            Mark::Closes(turn) => (
                turn,
                EventBody::TurnEnd {
                    stop_reason: String::new(),
                    usage: None,
                },
            ),
            Mark::Asks(turn, request_id) => (
                turn,
                EventBody::PermissionRequest {
                    request_id,
                    tool_call: serde_json::Value::Null,
                    options: serde_json::Value::Null,
                },
            ),
            Mark::Resolves(request_id) => (
                None,
                EventBody::PermissionResolved {
                    request_id,
                    outcome: String::new(),
                    option_id: None,
                },
            ),
            Mark::Nothing => return,
        };
        open_turns.visit(turn, &body);
    }
}

fn cancelled(request_id: String) -> EventBody {
    EventBody::PermissionResolved {
        request_id,
        outcome: "cancelled".into(),
        option_id: None,
    }
}

impl Session {
    /// A session as loaded or created: `open_turns` is what its log holds open, `session_slot`
    /// its place in the device's quota.
    pub fn new(
        meta: SessionMeta,
        dir: PathBuf,
        meta_store: MetaStore,
        log: EventLog,
        hands: Arc<Hands>,
        open_turns: OpenTurns,
        session_slot: SessionSlot,
    ) -> Session {
        hands.remember_nonce(meta.hands_nonce.clone());
        Session {
            meta_store,
            id: meta.id,
            device_id: meta.device_id,
            created_at: meta.created_at,
            dir,
            log,
            hands,
            brain_gate: tokio::sync::Mutex::new(()),
            state: Mutex::new(SessionState {
                title: meta.title,
                turn: open_turns.last_turn(),
                running: None,
                acp_session_id: meta.acp_session_id,
                brain: BrainState::None,
                last_active: Instant::now(),
                deleted: false,
                session_slot: Some(session_slot),
                usage: open_turns.usage(),
                rewound: None,
                open_turns,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, SessionState> {
        // Every transition finishes its field writes before anything that can panic, so a
        // poisoned lock still holds a consistent state.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn meta(&self) -> SessionMeta {
        let state = self.lock();
        SessionMeta {
            id: self.id.clone(),
            device_id: self.device_id.clone(),
            title: state.title.clone(),
            created_at: self.created_at.clone(),
            acp_session_id: state.acp_session_id.clone(),
            hands_nonce: self.hands.known_nonce(),
        }
    }

    /// The session's title.
    pub fn title(&self) -> String {
        self.lock().title.clone()
    }

    /// Renames the session and stores the new title with its meta.
    pub async fn rename(&self, title: String) -> Result<(), EngineError> {
        self.lock().title = title;
        self.save_meta().await
    }

    /// A fork's: the agent's ACP session of the source, whose home it was forked with, so the
    /// first message resumes the conversation there.
    pub async fn continue_acp_session(&self, acp_session_id: String) -> Result<(), EngineError> {
        self.lock().acp_session_id = Some(acp_session_id);
        self.save_meta().await
    }

    /// Stores the session's meta (see [`MetaStore::save`]).
    pub async fn save_meta(&self) -> Result<(), EngineError> {
        let meta =
            serde_json::to_value(self.meta()).map_err(|e| EngineError::Internal(e.to_string()))?;
        Ok(self.meta_store.save(meta).await?)
    }

    /// Reads the session's meta back as its owner last stored it (the title, the agent's ACP
    /// session id), for a replica that followed the session and now owns it.
    pub async fn reload_meta(&self) -> Result<(), EngineError> {
        let value = match self.meta_store.reload().await? {
            Reloaded::Current => return Ok(()),
            Reloaded::Gone => return Err(EngineError::SessionNotFound),
            Reloaded::Stored(value) => value,
        };
        let meta: SessionMeta =
            serde_json::from_value(value).map_err(|e| EngineError::Internal(e.to_string()))?;
        self.hands.remember_nonce(meta.hands_nonce.clone());
        let mut state = self.lock();
        state.title = meta.title;
        state.acp_session_id = meta.acp_session_id;
        Ok(())
    }

    pub fn workspace(&self) -> PathBuf {
        self.dir.join("workspace")
    }

    pub fn info(&self) -> SessionInfo {
        let state = self.lock();
        SessionInfo {
            id: self.id.clone(),
            title: state.title.clone(),
            created_at: self.created_at.clone(),
            status: if state.running.is_some() {
                "running"
            } else {
                "idle"
            }
            .to_string(),
            turn: state.turn,
            last_seq: self.log.last_seq(),
            brain: state.brain.label().to_string(),
            hands: self.hands.state().label().to_string(),
            isolation: self.hands.isolation().label().to_string(),
            brain_placement: self.hands.brain_placement().label().to_string(),
            usage: state.usage,
            network: self.hands.network().to_owned(),
        }
    }

    /// [`Session::info`] of a session another replica owns, from the events this replica
    /// follows: a turn open in the log is running; brain and hands are as the last `status`
    /// and `hands` events said.
    pub fn followed_info(&self) -> SessionInfo {
        let mut info = self.info();
        let state = self.lock();
        let said = &state.open_turns;
        info.status = match said.by_turn.is_empty() {
            true => "idle",
            false => "running",
        }
        .to_string();
        info.turn = state.turn.max(said.last_turn);
        info.brain = match said.brain_said.as_deref() {
            Some("ready") => "ready",
            _ => "none",
        }
        .to_string();
        if let Some(hands) = &said.hands_said {
            info.hands.clone_from(hands);
        }
        info
    }

    /// Reads what the session's owner (another replica) committed since the last read and
    /// publishes it to this replica's subscribers; the session's turns and usage follow.
    pub async fn follow(&self) -> std::io::Result<()> {
        loop {
            let page = self.log.read_followed().await?;
            if page.is_empty() {
                return Ok(());
            }
            // Published and visited under the session's lock: whoever sees an event and then
            // asks for the session finds its state as of that event.
            let mut state = self.lock();
            for stored in self.log.publish_followed(page) {
                match serde_json::from_str::<warren_protocol::gateway::Event>(&stored.json) {
                    Ok(event) => state.open_turns.visit(event.turn, &event.body),
                    Err(e) => {
                        tracing::warn!(seq = stored.seq, error = %e, "a followed event does not parse")
                    }
                }
            }
            state.turn = state.turn.max(state.open_turns.last_turn());
            state.usage = state.open_turns.usage();
        }
    }

    /// The model tokens the session used so far (what `--model-budget-tokens` counts).
    pub fn usage_totals(&self) -> UsageTotals {
        self.lock().usage
    }

    /// One model request through the model proxy: a `usage` event (in the running turn, if
    /// any), counted in the turn's and the session's totals.
    pub fn record_usage(&self, usage: ModelUsage) {
        let mut state = self.lock();
        let turn = state.running.as_ref().map(|running| running.turn);
        state.usage.add(&usage);
        if let Some(running) = state.running.as_mut() {
            running.usage.add(&usage);
        }
        if let Err(e) = self.log.append(turn, EventBody::Usage(usage)) {
            tracing::debug!(session = %self.id, error = %e, "usage event not stored");
        }
    }

    /// The number of the last turn begun (0 before the first message).
    pub fn last_turn(&self) -> u64 {
        self.lock().turn
    }

    /// Tells the agent's next prompt the workspace was rewound to `checkpoint`.
    pub fn set_rewound_notice(&self, checkpoint: &str, turn: u64, created_at: &str) {
        let text = format!(
            "Note: the person rewound this session's workspace to checkpoint {checkpoint} \
             (taken after turn {turn}, {created_at}). Files are as they were then; what changed \
             since is kept in a checkpoint of its own."
        );
        self.lock().rewound = Some(warren_brain::Notice {
            kind: warren_brain::REWOUND_NOTICE,
            text,
            checkpoint: Some(checkpoint.to_owned()),
        });
    }

    /// The rewind notice for the next prompt, once.
    pub fn take_rewound_notice(&self) -> Option<warren_brain::Notice> {
        self.lock().rewound.take()
    }

    /// The turn in progress, if any.
    pub fn running_turn(&self) -> Option<u64> {
        self.lock().running.as_ref().map(|running| running.turn)
    }

    pub fn is_running(&self) -> bool {
        self.lock().running.is_some()
    }

    /// The pid of the session's agent (a warm worker or a ready brain).
    pub fn brain_pid(&self) -> Option<u32> {
        match &self.lock().brain {
            BrainState::Ready(brain, _) => Some(brain.pid()),
            BrainState::Warm(worker, _) => Some(worker.pid()),
            BrainState::None | BrainState::Starting(_) => None,
        }
    }

    /// Sends the hands' lifecycle events to this session's log (in the running turn, if any).
    pub fn wire_hands(self: &Arc<Self>) {
        let session = Arc::downgrade(self);
        self.hands.set_emitter(Box::new(move |body| {
            if let Some(session) = session.upgrade() {
                let turn = session.running_turn();
                session.emit(turn, body);
            }
        }));
        let session = Arc::downgrade(self);
        self.hands.set_nonce_keeper(Box::new(move || {
            let Some(session) = session.upgrade() else {
                return;
            };
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    if let Err(e) = session.save_meta().await {
                        tracing::warn!(session = %session.id, error = %e, "the hands' nonce is not stored");
                    }
                });
            }
        }));
    }

    /// Appends an event that does not open or close anything (status, hands, error, update),
    /// logging (not failing) when the log refuses: callers on background paths have no client
    /// to answer, and a failing log has already said why.
    pub fn emit(&self, turn: Option<u64>, body: EventBody) {
        debug_assert!(
            matches!(Mark::of(turn, &body), Mark::Nothing),
            "turn and permission events go through a transition"
        );
        match self.log.append(turn, body) {
            Ok(_) => {}
            Err(AppendError::Failing(_)) => {
                tracing::debug!(session = %self.id, "event dropped: the event log is failing")
            }
            Err(e) => tracing::warn!(session = %self.id, error = %e, "cannot append event"),
        }
    }

    /// Appends an event of the hands' egress (network.md): `egress`, `egress_request`, and the
    /// `permission_resolved` that closes a question, which belongs to no turn's open requests
    /// (a question can come when no turn runs). In the running turn, if any; false when the
    /// log refused it.
    pub fn append_outside_turns(&self, body: EventBody) -> bool {
        let state = self.lock();
        let turn = state.running.as_ref().map(|running| running.turn);
        match self.log.append(turn, body) {
            Ok(_) => true,
            Err(e) => {
                tracing::debug!(session = %self.id, error = %e, "egress event not stored");
                false
            }
        }
    }

    /// Appends under the state lock and follows the event in `open_turns` once the log took it.
    fn record(
        &self,
        state: &mut SessionState,
        turn: Option<u64>,
        body: EventBody,
    ) -> Result<Arc<StoredEvent>, AppendError> {
        let mark = Mark::of(turn, &body);
        let stored = self.log.append(turn, body)?;
        mark.apply(&mut state.open_turns);
        Ok(stored)
    }

    /// A warm worker taken for the new session, with its slot. Handed back when the session was
    /// deleted meanwhile (the caller kills it).
    pub fn adopt_warm_worker(&self, worker: Worker, slot: BrainSlot) -> Option<Worker> {
        let mut state = self.lock();
        if state.deleted || state.brain.holds_slot() {
            return Some(worker);
        }
        state.brain = BrainState::Warm(worker, slot);
        None
    }

    /// Whether the session holds a brain slot (a brain running, starting or warm).
    pub fn holds_brain_slot(&self) -> bool {
        self.lock().brain.holds_slot()
    }

    /// `POST .../messages`: appends `user_message` and `turn_start` of turn n+1 and makes it the
    /// running turn; reserves a brain slot first when the session holds none, with the store's
    /// `ticket` for it (see [`Admission::ticket`]). A log that refuses the message leaves the
    /// session as it was.
    pub fn begin_turn(
        &self,
        text: String,
        admission: &Arc<Admission>,
        ticket: Option<StoreTicket>,
    ) -> Result<(u64, CancellationToken), EngineError> {
        let mut state = self.lock();
        if state.deleted {
            return Err(EngineError::SessionNotFound);
        }
        if state.running.is_some() {
            return Err(EngineError::TurnInProgress);
        }
        let new_slot = match state.brain.holds_slot() {
            true => None,
            false => Some(admission.reserve_brain(&self.device_id, &self.id, ticket)?),
        };
        let turn = state.turn + 1;
        self.record(&mut state, Some(turn), EventBody::UserMessage { text })?;
        state.turn = turn;
        let reserved_now = new_slot.is_some();
        if let Some(slot) = new_slot {
            state.brain = BrainState::Starting(slot);
        }
        if let Err(e) = self.record(&mut state, Some(turn), EventBody::TurnStart {}) {
            // The message is in the log: close its turn if the log takes that; if not, the turn
            // stays in `open_turns` and is closed `interrupted` once the storage recovers.
            let end = EventBody::TurnEnd {
                stop_reason: "error".into(),
                usage: None,
            };
            let _ = self.record(&mut state, Some(turn), end);
            if reserved_now {
                state.brain = BrainState::None;
            }
            return Err(e.into());
        }
        let cancel = CancellationToken::new();
        state.running = Some(RunningTurn {
            turn,
            cancel: cancel.clone(),
            pending_permissions: HashMap::new(),
            usage: UsageTotals::default(),
        });
        state.last_active = Instant::now();
        Ok((turn, cancel))
    }

    /// Closes `turn` with `turn_end` `stop_reason` (after `permission_resolved` `cancelled` for
    /// each unanswered request) unless someone (cancel, a storage failure, delete, shutdown)
    /// already ended it. Returns whether it did.
    pub fn end_turn(&self, turn: u64, stop_reason: &str) -> bool {
        let mut state = self.lock();
        if state.running.as_ref().map(|running| running.turn) != Some(turn) {
            return false;
        }
        self.close_running(&mut state, stop_reason);
        state.last_active = Instant::now();
        true
    }

    /// Ends the running turn, if any, with `stop_reason`. A refused append leaves the turn in
    /// `open_turns`, so it is closed when the storage recovers.
    fn close_running(&self, state: &mut SessionState, stop_reason: &str) {
        let Some(running) = state.running.take() else {
            return;
        };
        running.cancel.cancel();
        let mut request_ids: Vec<String> = running.pending_permissions.into_keys().collect();
        request_ids.sort();
        for request_id in request_ids {
            let _ = self.record(state, Some(running.turn), cancelled(request_id));
        }
        let end = EventBody::TurnEnd {
            stop_reason: stop_reason.to_string(),
            usage: (running.usage.requests > 0).then_some(running.usage),
        };
        if let Err(e) = self.record(state, Some(running.turn), end) {
            tracing::warn!(session = %self.id, turn = running.turn, error = %e, "turn_end not stored yet");
        }
    }

    /// `POST .../cancel`: fires the running turn's token; 409 `NO_TURN_RUNNING` when none runs.
    pub fn cancel_turn(&self) -> Result<(), EngineError> {
        let state = self.lock();
        let running = state.running.as_ref().ok_or(EngineError::NoTurnRunning)?;
        // Fired under the lock that also starts turns: the token is this turn's.
        running.cancel.cancel();
        Ok(())
    }

    /// A permission request of the running turn: stored as `permission_request` and kept until
    /// answered. False when no turn runs (the agent is told `cancelled`).
    pub fn ask_permission(
        &self,
        request_id: &str,
        tool_call: serde_json::Value,
        options: serde_json::Value,
        pending: PendingPermission,
    ) -> bool {
        let mut state = self.lock();
        let Some(turn) = state.running.as_ref().map(|running| running.turn) else {
            return false;
        };
        let request = EventBody::PermissionRequest {
            request_id: request_id.to_string(),
            tool_call,
            options,
        };
        if let Err(e) = self.record(&mut state, Some(turn), request) {
            tracing::debug!(session = %self.id, error = %e, "permission request not stored");
            return false;
        }
        if let Some(running) = state.running.as_mut() {
            running
                .pending_permissions
                .insert(request_id.to_string(), pending);
        }
        true
    }

    /// `POST .../permissions/{request_id}`: stores `permission_resolved` and hands the answer to
    /// the agent.
    pub fn answer_permission(
        &self,
        request_id: &str,
        option_id: String,
    ) -> Result<(), EngineError> {
        let mut state = self.lock();
        let running = state
            .running
            .as_ref()
            .ok_or(EngineError::PermissionNotFound)?;
        let turn = running.turn;
        let pending = running
            .pending_permissions
            .get(request_id)
            .ok_or(EngineError::PermissionNotFound)?;
        if !pending.option_ids.contains(&option_id) {
            return Err(EngineError::InvalidRequest(format!(
                "option_id must be one of {:?}",
                pending.option_ids
            )));
        }
        let resolved = EventBody::PermissionResolved {
            request_id: request_id.to_string(),
            outcome: "selected".into(),
            option_id: Some(option_id.clone()),
        };
        self.record(&mut state, Some(turn), resolved)?;
        let pending = state
            .running
            .as_mut()
            .and_then(|running| running.pending_permissions.remove(request_id))
            .ok_or(EngineError::PermissionNotFound)?;
        state.last_active = Instant::now();
        drop(state);
        let _ = pending.answer.send(option_id);
        Ok(())
    }

    /// A permission request that ended without an answer (its future was dropped): stored as
    /// `permission_resolved` `cancelled` if it was still pending.
    pub fn abandon_permission(&self, request_id: &str) {
        let mut state = self.lock();
        let Some(running) = state.running.as_mut() else {
            return;
        };
        let turn = running.turn;
        if running.pending_permissions.remove(request_id).is_some() {
            let _ = self.record(&mut state, Some(turn), cancelled(request_id.to_string()));
        }
    }

    /// For a turn about to prompt: the live brain, or what starting one needs. A warm worker is
    /// taken out, its slot staying behind as `Starting`; a session without a slot reserves one.
    pub fn brain_for_turn(&self, admission: &Arc<Admission>) -> Result<BrainStart, EngineError> {
        let mut state = self.lock();
        if state.deleted {
            return Err(EngineError::SessionNotFound);
        }
        let acp_session_id = state.acp_session_id.clone();
        let (worker, slot) = match std::mem::replace(&mut state.brain, BrainState::None) {
            BrainState::Ready(brain, slot) if brain.is_alive() => {
                state.brain = BrainState::Ready(brain.clone(), slot);
                return Ok(BrainStart::Ready(brain));
            }
            // A dead brain's slot carries over to its replacement.
            BrainState::Ready(_, slot) | BrainState::Starting(slot) => (None, slot),
            BrainState::Warm(worker, slot) => (Some(worker), slot),
            BrainState::None => (
                None,
                admission.reserve_brain(&self.device_id, &self.id, None)?,
            ),
        };
        state.brain = BrainState::Starting(slot);
        Ok(BrainStart::Start {
            worker,
            acp_session_id,
        })
    }

    /// The started brain becomes the session's. Returns whether its ACP session id is new (then
    /// `meta.json` is due); hands the brain back when the session went away meanwhile (deleted,
    /// shut down), for the caller to stop.
    pub fn brain_started(&self, brain: Arc<BrainSession>) -> Result<bool, Arc<BrainSession>> {
        let mut state = self.lock();
        if state.deleted {
            return Err(brain);
        }
        match std::mem::replace(&mut state.brain, BrainState::None) {
            BrainState::Starting(slot) => {
                state.brain = BrainState::Ready(brain.clone(), slot);
                let changed = state.acp_session_id.as_deref() != Some(brain.acp_session_id());
                state.acp_session_id = Some(brain.acp_session_id().to_string());
                Ok(changed)
            }
            other => {
                state.brain = other;
                Err(brain)
            }
        }
    }

    /// Bringing up a brain for `turn` failed: says so in the log if the turn still runs, and
    /// gives the slot back unless a later turn already counts on it.
    pub fn brain_start_failed(&self, turn: u64, error: &EngineError) {
        let message = error.to_string();
        let mut state = self.lock();
        let running = state.running.as_ref().map(|running| running.turn);
        if running == Some(turn) {
            let error = EventBody::Error {
                code: error.code().into(),
                message,
            };
            self.emit(Some(turn), error);
        } else {
            tracing::warn!(session = %self.id, turn, error = %message, "brain start failed after the turn ended");
        }
        let later_turn = running.is_some() && running != Some(turn);
        if matches!(state.brain, BrainState::Starting(_)) && !later_turn {
            state.brain = BrainState::None;
        }
    }

    /// Drops the session's brain (and its slot) if it is still `brain`, a worker that died.
    pub fn forget_brain(&self, brain: &Arc<BrainSession>) {
        let mut state = self.lock();
        if matches!(&state.brain, BrainState::Ready(current, _) if Arc::ptr_eq(current, brain)) {
            state.brain = BrainState::None;
        }
    }

    /// The brain, if it had no turn for `idle_after` (a brain still starting is not idle).
    pub fn take_idle_brain(&self, idle_after: Duration) -> Option<RetiredBrain> {
        let mut state = self.lock();
        let idle = state.running.is_none()
            && matches!(state.brain, BrainState::Warm(..) | BrainState::Ready(..))
            && state.last_active.elapsed() >= idle_after;
        idle.then(|| RetiredBrain(std::mem::replace(&mut state.brain, BrainState::None)))
    }

    /// Delete: the session takes nothing more, its running turn ends (its agent is cancelled),
    /// and its brain is handed out to be stopped. No `turn_end` is written: the log goes too.
    pub fn retire_for_delete(&self) -> RetiredBrain {
        let mut state = self.lock();
        state.deleted = true;
        if let Some(running) = state.running.take() {
            running.cancel.cancel();
        }
        RetiredBrain(std::mem::replace(&mut state.brain, BrainState::None))
    }

    /// Shutdown: the running turn ends `interrupted` and the brain is handed out to be stopped.
    pub fn retire_for_shutdown(&self) -> RetiredBrain {
        let mut state = self.lock();
        self.close_running(&mut state, "interrupted");
        RetiredBrain(std::mem::replace(&mut state.brain, BrainState::None))
    }

    /// Gives the session's quota slot back (its files are being removed).
    pub fn release_quota(&self) {
        self.lock().session_slot = None;
    }

    /// The event log failed: the running turn ends now and its agent is told to cancel. Its
    /// closing events cannot be stored yet; the turn stays in `open_turns` until
    /// [`Session::close_open_turns`]. Returns the turn it ended.
    pub fn storage_failed(&self) -> Option<u64> {
        let mut state = self.lock();
        let running = state.running.take()?;
        // Dropping the pending requests answers them `cancelled` on the agent's side.
        running.cancel.cancel();
        state.last_active = Instant::now();
        Some(running.turn)
    }

    /// Takes what a scan of the whole log found (a replica taking the session over, whose
    /// follower log was published without being visited): its open turns, last turn and usage.
    pub fn adopt_history(&self, open_turns: OpenTurns) {
        let mut state = self.lock();
        state.turn = state.turn.max(open_turns.last_turn());
        state.usage = open_turns.usage();
        state.open_turns = open_turns;
    }

    /// Whether the log holds a turn open that no running turn will close.
    pub fn has_turns_left_open(&self) -> bool {
        let state = self.lock();
        let running = state.running.as_ref().map(|running| running.turn);
        !state.open_turns.all_but(running).is_empty()
    }

    /// Closes every turn the log holds open, except the running one, oldest first:
    /// `permission_resolved` `cancelled` for each unresolved request, `turn_end` `interrupted`,
    /// then one `status` (`brain`, `message`). Returns how many it closed. The caller syncs.
    pub fn close_open_turns(
        &self,
        brain: Option<&str>,
        message: &str,
    ) -> Result<usize, AppendError> {
        let mut state = self.lock();
        let running = state.running.as_ref().map(|running| running.turn);
        let open = state.open_turns.all_but(running);
        for (turn, request_ids) in &open {
            for request_id in request_ids {
                self.record(&mut state, Some(*turn), cancelled(request_id.clone()))?;
            }
            let end = EventBody::TurnEnd {
                stop_reason: "interrupted".into(),
                usage: None,
            };
            self.record(&mut state, Some(*turn), end)?;
        }
        if !open.is_empty() {
            self.log.append(
                None,
                EventBody::Status {
                    brain: brain.map(str::to_string),
                    hands: None,
                    message: Some(message.to_string()),
                },
            )?;
        }
        Ok(open.len())
    }
}

/// The session as the model proxy sees it.
impl warren_model_proxy::Account for Session {
    fn session_id(&self) -> &str {
        &self.id
    }

    fn used_tokens(&self) -> u64 {
        self.usage_totals().tokens()
    }

    fn record(&self, usage: ModelUsage) {
        self.record_usage(usage);
    }

    fn refused(&self, code: &str, message: &str) {
        self.emit(
            self.running_turn(),
            EventBody::Error {
                code: code.to_owned(),
                message: message.to_owned(),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user_message(turn: u64) -> (Option<u64>, EventBody) {
        (Some(turn), EventBody::UserMessage { text: "x".into() })
    }

    fn turn_end(turn: u64) -> (Option<u64>, EventBody) {
        (
            Some(turn),
            EventBody::TurnEnd {
                stop_reason: "end_turn".into(),
                usage: None,
            },
        )
    }

    fn ask(turn: u64, id: &str) -> (Option<u64>, EventBody) {
        (
            Some(turn),
            EventBody::PermissionRequest {
                request_id: id.into(),
                tool_call: serde_json::Value::Null,
                options: serde_json::Value::Null,
            },
        )
    }

    fn resolve(turn: u64, id: &str) -> (Option<u64>, EventBody) {
        (Some(turn), cancelled(id.into()))
    }

    /// Table: events → (open turns with their unresolved requests, last turn).
    #[test]
    fn open_turns_follow_every_turn_left_open_not_only_the_last() {
        type Events = Vec<(Option<u64>, EventBody)>;
        type Want = Vec<(u64, Vec<&'static str>)>;
        let cases: Vec<(Events, Want, u64)> = vec![
            (vec![], vec![], 0),
            (vec![user_message(1), turn_end(1)], vec![], 1),
            (vec![user_message(1)], vec![(1, vec![])], 1),
            (
                vec![user_message(1), ask(1, "a"), user_message(2)],
                vec![(1, vec!["a"]), (2, vec![])],
                2,
            ),
            (
                vec![
                    user_message(1),
                    ask(1, "a"),
                    ask(1, "b"),
                    resolve(1, "a"),
                    user_message(2),
                    turn_end(2),
                ],
                vec![(1, vec!["b"])],
                2,
            ),
            (
                vec![user_message(3), turn_end(3), user_message(4)],
                vec![(4, vec![])],
                4,
            ),
        ];
        for (events, want, want_last) in cases {
            let mut open = OpenTurns::default();
            let mut marked = OpenTurns::default();
            for (turn, body) in &events {
                open.visit(*turn, body);
                Mark::of(*turn, body).apply(&mut marked);
            }
            let got: Vec<(u64, Vec<String>)> = open.all_but(None);
            let want: Vec<(u64, Vec<String>)> = want
                .into_iter()
                .map(|(turn, ids)| (turn, ids.into_iter().map(String::from).collect()))
                .collect();
            assert_eq!((&got, open.last_turn()), (&want, want_last), "{events:?}");
            assert_eq!(
                marked.all_but(None),
                want,
                "marks replay the same: {events:?}"
            );
        }
    }
}
