//! Turns and brains: a message becomes `user_message` and `turn_start`, then the agent's
//! `session/update`s as `update` events while they stream, `permission_request` /
//! `permission_resolved` around each question, and `turn_end` with ACP's stop reason (or
//! `error` when the worker died or could not start, `interrupted` at shutdown).
//!
//! A session's brain comes from the warm pool: a worker is taken when the session is created (if
//! the limits allow), and the ACP session (`session/new`, with the hands as host and Warren's exec
//! tools as MCP server) is opened on the first message, which is also when the hands start.
//! After a stop (idle, worker death) the next message takes a new worker and resumes the ACP
//! session; if the agent cannot, an `error` event says its context was lost.
//!
//! Every turn runs in its own task; the only shared state is the session's [`SessionState`].
//! A turn is closed exactly once: whoever clears `running_turn` writes its `turn_end`.
//!
//! Cancel is a per-turn [`CancellationToken`], a latch the turn races against: fired while the
//! brain or hands still start, the turn ends `cancelled` at once and its prompt is never sent
//! (the brain finishes starting for the next turn); fired later, the brain sends `session/cancel`
//! after the prompt and the agent's own stop reason ends the turn. No cancel falls in a gap.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use warren_brain::{
    BoxFuture, BrainError, BrainSession, PermissionOutcome, Resumed, TurnSink, Worker,
};
use warren_protocol::gateway::EventBody;

use crate::Gateway;
use crate::error::GatewayError;
use crate::sessions::{Session, SessionState};

/// A session's brain, as far as the session state is concerned.
#[derive(Default)]
pub enum BrainState {
    #[default]
    None,
    /// A warm, initialized worker taken from the pool; no ACP session yet.
    Warm(Worker),
    Ready(Arc<BrainSession>),
}

impl BrainState {
    pub fn label(&self) -> &'static str {
        match self {
            BrainState::None => "none",
            BrainState::Warm(_) => "warm",
            BrainState::Ready(_) => "ready",
        }
    }
}

/// An unanswered `permission_request`.
pub struct PendingPermission {
    answer: oneshot::Sender<String>,
    /// The `optionId`s the agent offered.
    option_ids: Vec<String>,
}

/// `POST /v1/sessions`: creates the session and, when the limits allow, takes a warm worker.
pub async fn create_session(
    gateway: &Arc<Gateway>,
    device_id: &str,
    title: Option<String>,
) -> Result<Arc<Session>, GatewayError> {
    // Only a worker that is already warm is taken here; starting one would make creation slow,
    // and the first message starts one anyway.
    let warm_available = gateway.pool.n_ready() > 0;
    // Creation fsyncs the new files: keep it off the async workers.
    let creating = gateway.clone();
    let owner = device_id.to_string();
    let (session, brain_slot) = tokio::task::spawn_blocking(move || {
        creating.sessions.create(&owner, title, warm_available)
    })
    .await
    .map_err(|e| GatewayError::Internal(e.to_string()))??;
    tracing::info!(session = %session.id, %device_id, "session created");
    if let Some(slot) = brain_slot {
        match gateway.pool.take().await {
            Ok(worker) => {
                let mut state = session.lock();
                if state.deleted {
                    drop(state);
                    tokio::spawn(worker.kill());
                } else {
                    state.brain = BrainState::Warm(worker);
                    state.brain_slot = Some(slot);
                }
            }
            Err(e) => {
                tracing::warn!(session = %session.id, error = %e, "no warm worker; the first message starts one")
            }
        }
    }
    Ok(session)
}

/// `DELETE /v1/sessions/{id}`: ends the turn, stops brain and hands, removes the data.
pub async fn delete_session(
    gateway: &Arc<Gateway>,
    session: &Arc<Session>,
) -> Result<(), GatewayError> {
    let brain = {
        let mut state = session.lock();
        state.running_turn = None;
        state.turn_cancel.cancel();
        state.pending_permissions.clear();
        std::mem::take(&mut state.brain)
    };
    stop_brain(brain).await;
    session.hands.stop().await;
    gateway.sessions.remove(session).await?;
    tracing::info!(session = %session.id, "session deleted");
    Ok(())
}

/// `POST /v1/sessions/{id}/messages`: starts turn n+1 and returns its number at once; the turn
/// runs in the background.
pub async fn start_turn(
    gateway: &Arc<Gateway>,
    session: &Arc<Session>,
    text: String,
) -> Result<u64, GatewayError> {
    let (turn, cancel) = {
        let mut state = session.lock();
        if state.deleted {
            return Err(GatewayError::SessionNotFound);
        }
        if state.running_turn.is_some() {
            return Err(GatewayError::TurnInProgress);
        }
        let new_slot = match state.brain_slot {
            Some(_) => None,
            None => Some(
                gateway
                    .sessions
                    .admission()
                    .reserve_brain(&session.device_id)?,
            ),
        };
        // Appended under the session lock so a concurrent message cannot interleave its events,
        // and before the state changes: a log that refuses the message leaves the session (its
        // turn number, its brain slot) as it was.
        let turn = state.turn + 1;
        session
            .log
            .append(Some(turn), EventBody::UserMessage { text: text.clone() })?;
        state.turn = turn;
        if let Some(slot) = new_slot {
            state.brain_slot = Some(slot);
        }
        if let Err(e) = session.log.append(Some(turn), EventBody::TurnStart {}) {
            // The message is stored: close its turn (if the log takes it) so it is not left open.
            let _ = session.log.append(
                Some(turn),
                EventBody::TurnEnd {
                    stop_reason: "error".into(),
                },
            );
            if matches!(state.brain, BrainState::None) {
                state.brain_slot = None;
            }
            return Err(e.into());
        }
        state.running_turn = Some(turn);
        state.turn_cancel = CancellationToken::new();
        state.last_active = Instant::now();
        (turn, state.turn_cancel.clone())
    };
    let gateway = gateway.clone();
    let session = session.clone();
    tokio::spawn(async move { run_turn(gateway, session, turn, text, cancel).await });
    Ok(turn)
}

async fn run_turn(
    gateway: Arc<Gateway>,
    session: Arc<Session>,
    turn: u64,
    text: String,
    cancel: CancellationToken,
) {
    // A cancel while the brain starts ends the turn at once, but the start itself runs to its
    // end: dropping it halfway could strand a worker or half-started hands, and the brain is
    // wanted by the next turn anyway.
    let starting = ensure_brain(&gateway, &session);
    let mut starting = std::pin::pin!(starting);
    let brain = tokio::select! {
        biased;
        brain = &mut starting => brain,
        () = cancel.cancelled() => {
            end_turn(&session, turn, "cancelled");
            starting.await
        }
    };
    let brain = match brain {
        Ok(brain) => brain,
        Err(e) => {
            let mut state = session.lock();
            let still_running = state.running_turn == Some(turn);
            if still_running {
                session.emit(
                    Some(turn),
                    EventBody::Error {
                        code: "BRAIN_UNAVAILABLE".into(),
                        message: e.to_string(),
                    },
                );
            } else {
                tracing::warn!(session = %session.id, turn, error = %e, "brain start failed after the turn ended");
            }
            // No brain runs: give its slot back, unless a later turn already counts on it.
            let later_turn = state.running_turn.is_some() && !still_running;
            if matches!(state.brain, BrainState::None) && !later_turn {
                state.brain_slot = None;
            }
            drop(state);
            end_turn(&session, turn, "error");
            return;
        }
    };
    if cancel.is_cancelled() {
        // Cancelled while the brain started: the prompt is never sent. Checked here as well as
        // in the brain so a later turn never sees this one holding the brain's turn lock.
        end_turn(&session, turn, "cancelled");
        return;
    }
    let result = brain.prompt_cancellable(text, &cancel).await;
    match result {
        Ok(stop_reason) => end_turn(&session, turn, &stop_reason),
        Err(e) => {
            let worker_died = matches!(e, BrainError::WorkerExited { .. }) || !brain.is_alive();
            let code = if worker_died {
                "BRAIN_EXITED"
            } else {
                "BRAIN_ERROR"
            };
            tracing::warn!(session = %session.id, turn, error = %e, "turn failed");
            if session.lock().running_turn == Some(turn) {
                session.emit(
                    Some(turn),
                    EventBody::Error {
                        code: code.into(),
                        message: e.to_string(),
                    },
                );
            }
            if worker_died {
                forget_brain(&session, &brain);
                session.emit(
                    None,
                    EventBody::Status {
                        brain: Some("idle".into()),
                        hands: None,
                        message: Some("the agent process exited".into()),
                    },
                );
            }
            end_turn(&session, turn, "error");
        }
    }
}

/// Writes `turn_end` unless someone (cancel at shutdown, delete) already closed the turn.
fn end_turn(session: &Session, turn: u64, stop_reason: &str) {
    let mut state = session.lock();
    if state.running_turn != Some(turn) {
        return;
    }
    state.running_turn = None;
    cancel_pending_permissions(session, &mut state, turn);
    state.last_active = Instant::now();
    if let Err(e) = session.log.append(
        Some(turn),
        EventBody::TurnEnd {
            stop_reason: stop_reason.to_string(),
        },
    ) {
        tracing::error!(session = %session.id, error = %e, "cannot append turn_end");
    }
    drop(state);
    if let Err(e) = session.log.sync() {
        tracing::error!(session = %session.id, error = %e, "cannot sync the event log");
    }
}

/// Drops the session's brain if it is still `brain` (a dead worker), giving back its slot.
fn forget_brain(session: &Session, brain: &Arc<BrainSession>) {
    let mut state = session.lock();
    if matches!(&state.brain, BrainState::Ready(current) if Arc::ptr_eq(current, brain)) {
        state.brain = BrainState::None;
        state.brain_slot = None;
    }
}

/// The session's ready brain: the existing one, or a worker (warm from creation, else from
/// the pool) with a new or resumed ACP session.
async fn ensure_brain(
    gateway: &Arc<Gateway>,
    session: &Arc<Session>,
) -> Result<Arc<BrainSession>, GatewayError> {
    let _gate = session.brain_gate.lock().await;
    let (worker, acp_session_id) = {
        let mut state = session.lock();
        match std::mem::take(&mut state.brain) {
            BrainState::Ready(brain) if brain.is_alive() => {
                state.brain = BrainState::Ready(brain.clone());
                return Ok(brain);
            }
            BrainState::Ready(_) | BrainState::None => (None, state.acp_session_id.clone()),
            BrainState::Warm(worker) => (Some(worker), state.acp_session_id.clone()),
        }
    };
    let worker = match worker.filter(Worker::is_alive) {
        Some(worker) => worker,
        None => {
            session.emit(
                None,
                EventBody::Status {
                    brain: Some("starting".into()),
                    hands: None,
                    message: None,
                },
            );
            gateway
                .pool
                .take()
                .await
                .map_err(|e| GatewayError::BrainUnavailable(e.to_string()))?
        }
    };
    let hands_started = Instant::now();
    let was_running = session.hands.is_running();
    let mcp = session
        .hands
        .mcp_server(&gateway.warren_bin.to_string_lossy())
        .await
        .map_err(|e| GatewayError::BrainUnavailable(e.to_string()))?;
    if !was_running {
        let elapsed_ms = u64::try_from(hands_started.elapsed().as_millis()).unwrap_or(u64::MAX);
        session.emit(
            None,
            EventBody::Hands {
                state: "ready".into(),
                elapsed_ms: Some(elapsed_ms),
                message: None,
            },
        );
    }
    let sink: Arc<dyn TurnSink> = Arc::new(Sink {
        session: Arc::downgrade(session),
    });
    let host = session.hands.clone();
    let cwd = session.workspace();
    let brain = match acp_session_id {
        None => worker.new_session(cwd, vec![mcp], host, sink).await,
        Some(id) => match worker.resume_session(id, cwd, vec![mcp], host, sink).await {
            Ok((brain, Resumed::ContextLost)) => {
                session.emit(
                    None,
                    EventBody::Error {
                        code: "CONTEXT_LOST".into(),
                        message: "the agent could not resume its session; its earlier context is lost".into(),
                    },
                );
                Ok(brain)
            }
            Ok((brain, _)) => Ok(brain),
            Err(e) => Err(e),
        },
    }
    .map_err(|e| GatewayError::BrainUnavailable(e.to_string()))?;
    let brain = Arc::new(brain);
    let changed_id = {
        let mut state = session.lock();
        if state.deleted {
            None
        } else {
            state.brain = BrainState::Ready(brain.clone());
            let changed = state.acp_session_id.as_deref() != Some(brain.acp_session_id());
            state.acp_session_id = Some(brain.acp_session_id().to_string());
            Some(changed)
        }
    };
    let Some(changed_id) = changed_id else {
        stop_brain(BrainState::Ready(brain)).await;
        return Err(GatewayError::SessionNotFound);
    };
    if changed_id {
        session.save_meta()?;
    }
    session.emit(
        None,
        EventBody::Status {
            brain: Some("ready".into()),
            hands: None,
            message: None,
        },
    );
    Ok(brain)
}

/// Stops a brain: `session/close` then kill when we hold the only handle; otherwise dropping
/// the last handle kills the worker.
async fn stop_brain(brain: BrainState) {
    match brain {
        BrainState::None => {}
        BrainState::Warm(worker) => worker.kill().await,
        BrainState::Ready(brain) => {
            brain.cancel().await;
            match Arc::try_unwrap(brain) {
                Ok(brain) => brain.close().await,
                Err(shared) => drop(shared),
            }
        }
    }
}

/// `POST /v1/sessions/{id}/cancel`: fires the running turn's token (see the module docs); 409
/// `NO_TURN_RUNNING` when no turn runs.
pub async fn cancel_turn(session: &Arc<Session>) -> Result<(), GatewayError> {
    let state = session.lock();
    if state.running_turn.is_none() {
        return Err(GatewayError::NoTurnRunning);
    }
    // Checked and fired under the lock that also starts turns: the token is this turn's.
    state.turn_cancel.cancel();
    Ok(())
}

/// `POST /v1/sessions/{id}/permissions/{request_id}`.
pub fn answer_permission(
    session: &Session,
    request_id: &str,
    option_id: String,
) -> Result<(), GatewayError> {
    let mut state = session.lock();
    let pending = state
        .pending_permissions
        .get(request_id)
        .ok_or(GatewayError::PermissionNotFound)?;
    if !pending.option_ids.contains(&option_id) {
        return Err(GatewayError::InvalidRequest(format!(
            "option_id must be one of {:?}",
            pending.option_ids
        )));
    }
    let pending = state
        .pending_permissions
        .remove(request_id)
        .ok_or(GatewayError::PermissionNotFound)?;
    let turn = state.running_turn;
    session.log.append(
        turn,
        EventBody::PermissionResolved {
            request_id: request_id.to_string(),
            outcome: "selected".into(),
            option_id: Some(option_id.clone()),
        },
    )?;
    state.last_active = Instant::now();
    drop(state);
    let _ = pending.answer.send(option_id);
    Ok(())
}

/// Ends the running turn (`interrupted`), closes the brain, stops the hands and flushes the log.
pub async fn shut_down_session(session: &Arc<Session>) {
    let brain = {
        let mut state = session.lock();
        state.turn_cancel.cancel();
        if let Some(turn) = state.running_turn.take() {
            cancel_pending_permissions(session, &mut state, turn);
            session.emit(
                Some(turn),
                EventBody::TurnEnd {
                    stop_reason: "interrupted".into(),
                },
            );
        }
        state.brain_slot = None;
        std::mem::take(&mut state.brain)
    };
    stop_brain(brain).await;
    session.hands.stop().await;
    session.log.close();
}

/// Resolves every unanswered permission request of `turn` as `cancelled`, in request id order.
fn cancel_pending_permissions(session: &Session, state: &mut SessionState, turn: u64) {
    let mut request_ids: Vec<String> = state
        .pending_permissions
        .drain()
        .map(|(id, _)| id)
        .collect();
    request_ids.sort();
    for request_id in request_ids {
        session.emit(
            Some(turn),
            EventBody::PermissionResolved {
                request_id,
                outcome: "cancelled".into(),
                option_id: None,
            },
        );
    }
}

/// Stops brains that had no turn and no pending permission for `--brain-idle`.
pub fn spawn_idle_sweeper(gateway: &Arc<Gateway>) {
    let weak = Arc::downgrade(gateway);
    let period =
        (gateway.args.brain_idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(30));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(gateway) = weak.upgrade() else {
                return;
            };
            for session in gateway.sessions.all() {
                let idle_brain = {
                    let mut state = session.lock();
                    let idle = state.running_turn.is_none()
                        && state.pending_permissions.is_empty()
                        && !matches!(state.brain, BrainState::None)
                        && state.last_active.elapsed() >= gateway.args.brain_idle;
                    if !idle {
                        continue;
                    }
                    state.brain_slot = None;
                    std::mem::take(&mut state.brain)
                };
                tracing::info!(session = %session.id, "stopping idle brain");
                session.emit(
                    None,
                    EventBody::Status {
                        brain: Some("idle".into()),
                        hands: None,
                        message: None,
                    },
                );
                stop_brain(idle_brain).await;
            }
        }
    });
}

/// Where a session's agent output goes: the event log of the running turn.
struct Sink {
    session: std::sync::Weak<Session>,
}

impl TurnSink for Sink {
    fn update(&self, update: Value) {
        if let Some(session) = self.session.upgrade() {
            let turn = session.lock().running_turn;
            session.emit(turn, EventBody::Update { update });
        }
    }

    fn request_permission(
        &self,
        tool_call: Value,
        options: Value,
    ) -> BoxFuture<'static, PermissionOutcome> {
        let Some(session) = self.session.upgrade() else {
            return Box::pin(async { PermissionOutcome::Cancelled });
        };
        let request_id = format!("perm-{}", uuid::Uuid::new_v4().simple());
        let option_ids = options
            .as_array()
            .map(|options| {
                options
                    .iter()
                    .filter_map(|o| {
                        o.get("optionId")
                            .and_then(Value::as_str)
                            .map(str::to_string)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let (answer, answered) = oneshot::channel();
        {
            let mut state = session.lock();
            let Some(turn) = state.running_turn else {
                return Box::pin(async { PermissionOutcome::Cancelled });
            };
            state
                .pending_permissions
                .insert(request_id.clone(), PendingPermission { answer, option_ids });
            session.emit(
                Some(turn),
                EventBody::PermissionRequest {
                    request_id: request_id.clone(),
                    tool_call,
                    options,
                },
            );
        }
        let guard = PermissionGuard {
            session: self.session.clone(),
            request_id,
        };
        Box::pin(async move {
            let outcome = match answered.await {
                Ok(option_id) => PermissionOutcome::Selected(option_id),
                Err(_) => PermissionOutcome::Cancelled,
            };
            drop(guard);
            outcome
        })
    }
}

/// Records a permission request that ends without an answer (the turn was cancelled, the
/// request dropped) as `permission_resolved` `cancelled`.
struct PermissionGuard {
    session: std::sync::Weak<Session>,
    request_id: String,
}

impl Drop for PermissionGuard {
    fn drop(&mut self) {
        let Some(session) = self.session.upgrade() else {
            return;
        };
        let mut state = session.lock();
        if state.pending_permissions.remove(&self.request_id).is_some() {
            let turn = state.running_turn;
            session.emit(
                turn,
                EventBody::PermissionResolved {
                    request_id: self.request_id.clone(),
                    outcome: "cancelled".into(),
                    option_id: None,
                },
            );
        }
    }
}
