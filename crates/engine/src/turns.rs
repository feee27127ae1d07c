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
//! Every turn runs in its own task; the only shared state is the session's state, changed only
//! through [`Session`]'s transitions. A turn is closed exactly once: whichever transition ends
//! the running turn writes its `turn_end` (or, when the event log is failing, leaves it to the
//! storage watch, which closes it `interrupted`).
//!
//! Cancel is a per-turn [`CancellationToken`], a latch the turn races against: fired while the
//! brain or hands still start, the turn ends `cancelled` at once and its prompt is never sent
//! (the brain finishes starting for the next turn); fired later, the brain sends `session/cancel`
//! after the prompt and the agent's own stop reason ends the turn. No cancel falls in a gap.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use warren_brain::{
    BoxFuture, BrainError, BrainSession, McpServerSpec, PermissionOutcome, Resumed, TurnSink,
    Worker,
};
use warren_protocol::gateway::EventBody;

use crate::agents::{ModelAccess, Preset};
use crate::config::BrainPlacement;
use crate::engine::Engine;
use crate::engine_error::EngineError;
use crate::hands::agent::{spawn_in_hands, stop_earlier_agent};
use crate::hands::{Hands, HandsState, Isolation};
use crate::session::{BrainStart, PendingPermission, Session, stop_brain_session};

/// `POST /v1/sessions/{id}/messages`: starts turn n+1 and returns its number at once; the turn
/// runs in the background. 507 while the disk is full.
pub async fn start_turn(
    gateway: &Arc<Engine>,
    session: &Arc<Session>,
    text: String,
) -> Result<u64, EngineError> {
    gateway.sessions.storage().check()?;
    let admission = gateway.sessions.admission();
    // With a store, a session without a brain reserves one there first: over the device's
    // limit on all replicas together the message is refused before anything is recorded.
    let ticket = match session.holds_brain_slot() {
        true => None,
        false => admission.ticket(&session.id, &session.device_id).await?,
    };
    let (turn, cancel) = session.begin_turn(text.clone(), admission, ticket)?;
    let gateway = gateway.clone();
    let session = session.clone();
    tokio::spawn(async move { run_turn(gateway, session, turn, text, cancel).await });
    Ok(turn)
}

async fn run_turn(
    gateway: Arc<Engine>,
    session: Arc<Session>,
    turn: u64,
    text: String,
    cancel: CancellationToken,
) {
    // A running turn keeps the hands awake; once it ends, the files it changed are snapshotted.
    let hold = session.hands.hold();
    run_turn_held(&gateway, &session, turn, text, cancel).await;
    drop(hold);
    // The snapshot must not keep the gateway alive (a shutdown waits for nothing here).
    drop(gateway);
    // Files kept in checkpoints have the turn's own; remote hands' are snapshotted whole.
    if session.hands.keeper().is_none() {
        session.hands.snapshot_if_changed().await;
    }
}

async fn run_turn_held(
    gateway: &Arc<Engine>,
    session: &Arc<Session>,
    turn: u64,
    text: String,
    cancel: CancellationToken,
) {
    // The last turn's checkpoint is taken before this turn can change the files.
    gateway.checkpoints.settled(session).await;
    // A cancel while the brain starts ends the turn at once, but the start itself runs to its
    // end: dropping it halfway could strand a worker or half-started hands, and the brain is
    // wanted by the next turn anyway.
    let starting = ensure_brain(gateway, session);
    let mut starting = std::pin::pin!(starting);
    let brain = tokio::select! {
        biased;
        brain = &mut starting => brain,
        () = cancel.cancelled() => {
            end_turn(session, turn, "cancelled").await;
            starting.await
        }
    };
    let brain = match brain {
        Ok(brain) => brain,
        Err(e) => {
            session.brain_start_failed(turn, &e);
            end_turn(session, turn, "error").await;
            return;
        }
    };
    if cancel.is_cancelled() {
        // Cancelled while the brain started: the prompt is never sent. Checked here as well as
        // in the brain so a later turn never sees this one holding the brain's turn lock.
        end_turn(session, turn, "cancelled").await;
        return;
    }
    // Hands that are lost or archived come back before the prompt, so the reset notice (files
    // as of a snapshot, processes reset) reaches the agent with this turn's text, not the next.
    // A brain inside paused hands is frozen with them: they are resumed first.
    let brain_frozen = gateway.agent.placement == BrainPlacement::Hands
        && session.hands.state() == HandsState::Paused;
    if (brain_frozen
        || matches!(
            session.hands.state(),
            HandsState::Lost | HandsState::Archived
        ))
        && let Err(e) = session.hands.endpoint().await
    {
        tracing::warn!(session = %session.id, error = %e, "hands did not come back before the prompt");
    }
    // The reset notice (hands rebuilt or restored since the agent's last prompt) goes before
    // the person's text, once.
    let mut notices: Vec<warren_brain::Notice> = session
        .hands
        .take_notice()
        .map(|text| warren_brain::Notice {
            kind: warren_brain::HANDS_RESET_NOTICE,
            text,
            checkpoint: None,
        })
        .into_iter()
        .collect();
    notices.extend(session.take_rewound_notice());
    let result = brain.prompt_cancellable(text, notices, &cancel).await;
    match result {
        Ok(stop_reason) => end_turn_checkpointed(gateway, session, turn, &stop_reason).await,
        Err(e) => {
            let worker_died = matches!(e, BrainError::WorkerExited { .. }) || !brain.is_alive();
            let code = if worker_died {
                "BRAIN_EXITED"
            } else {
                "BRAIN_ERROR"
            };
            tracing::warn!(session = %session.id, turn, error = %e, "turn failed");
            if session.running_turn() == Some(turn) {
                session.emit(
                    Some(turn),
                    EventBody::Error {
                        code: code.into(),
                        message: e.to_string(),
                    },
                );
            }
            if worker_died {
                session.forget_brain(&brain);
                session.emit(
                    None,
                    EventBody::Status {
                        brain: Some("idle".into()),
                        hands: None,
                        message: Some("the agent process exited".into()),
                    },
                );
            }
            end_turn_checkpointed(gateway, session, turn, "error").await;
        }
    }
}

/// Ends a turn that may have used the hands: its checkpoint is reserved before `turn_end` (the
/// next turn waits for it) and taken after, so `turn_end` is not delayed by it.
async fn end_turn_checkpointed(
    gateway: &Arc<Engine>,
    session: &Session,
    turn: u64,
    stop_reason: &str,
) {
    let reserved = gateway.checkpoints.reserve(session).await;
    end_turn(session, turn, stop_reason).await;
    if let Some(reserved) = reserved {
        gateway
            .checkpoints
            .after_turn(session, turn, reserved)
            .await;
    }
}

/// Ends `turn` (unless it already ended) and fdatasyncs the log.
async fn end_turn(session: &Session, turn: u64, stop_reason: &str) {
    if !session.end_turn(turn, stop_reason) {
        return;
    }
    if let Err(e) = session.log.sync().await {
        tracing::error!(session = %session.id, error = %e, "cannot sync the event log");
    }
}

/// The session's ready brain: the existing one, or a worker (warm from creation, else from
/// the pool) with a new or resumed ACP session.
async fn ensure_brain(
    gateway: &Arc<Engine>,
    session: &Arc<Session>,
) -> Result<Arc<BrainSession>, EngineError> {
    let _gate = session.brain_gate.lock().await;
    let (worker, acp_session_id) = match session.brain_for_turn(gateway.sessions.admission())? {
        BrainStart::Ready(brain) => return Ok(brain),
        BrainStart::Start {
            worker,
            acp_session_id,
        } => (worker, acp_session_id),
    };
    let worker = match worker.filter(warren_brain::Worker::is_alive) {
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
            start_worker(gateway, session).await?
        }
    };
    let sink: Arc<dyn TurnSink> = Arc::new(Sink {
        session: Arc::downgrade(session),
    });
    let host = session.hands.clone();
    host.set_empty_missing_reads(gateway.agent.preset == Preset::Gemini);
    let (cwd, mcp) = match gateway.agent.placement {
        BrainPlacement::Host => {
            let mcp = session
                .hands
                .mcp_server(&gateway.warren_bin.to_string_lossy())
                .await?;
            (session.workspace(), mcp)
        }
        // Inside, the exec tools run on an engine of their own, beside the agent: no token of
        // the hands' execd enters the sandbox.
        BrainPlacement::Hands => {
            let (_endpoint, root) = session.hands.endpoint_and_root().await?;
            let inner_warren = match session.hands.isolation() {
                Isolation::Bwrap => warren_sandbox::WARREN_BIN.to_owned(),
                _ => gateway.warren_bin.to_string_lossy().into_owned(),
            };
            let mcp = McpServerSpec {
                name: "warren".into(),
                command: inner_warren,
                args: vec!["mcp".into()],
                env: Vec::new(),
            };
            (std::path::PathBuf::from(root), mcp)
        }
    };
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
    .map_err(|e| EngineError::BrainUnavailable(e.to_string()))?;
    let brain = Arc::new(brain);
    let changed_id = match session.brain_started(brain.clone()) {
        Ok(changed_id) => changed_id,
        Err(unwanted) => {
            drop(brain);
            stop_brain_session(unwanted).await;
            return Err(EngineError::SessionNotFound);
        }
    };
    if changed_id {
        session.save_meta().await?;
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

/// A new agent process for `session`: from the warm pool when the agent needs nothing of the
/// session; else started for it, on the host with its model token, or inside its hands.
async fn start_worker(
    gateway: &Arc<Engine>,
    session: &Arc<Session>,
) -> Result<Worker, EngineError> {
    let agent = &gateway.agent;
    let unavailable = |e: BrainError| EngineError::BrainUnavailable(e.to_string());
    let origin = gateway.model_origin(agent.placement == BrainPlacement::Hands);
    let token = gateway.model.token(&session.id);
    match agent.placement {
        BrainPlacement::Host if !agent.needs_session_env() => {
            gateway.pool.take().await.map_err(unavailable)
        }
        BrainPlacement::Host => {
            // A home of the session's own, so its state never mixes with the host user's.
            let home = session.dir.join("agent-home");
            std::fs::create_dir_all(&home).map_err(EngineError::Io)?;
            let home = home.to_string_lossy().into_owned();
            let access = ModelAccess {
                proxy_origin: &origin,
                token: &token,
                as_root: rustix::process::geteuid().is_root(),
                home: &home,
            };
            let command = agent.session_command(false, &access);
            gateway.pool.spawn(&command).await.map_err(unavailable)
        }
        BrainPlacement::Hands => {
            start_in_hands(gateway, &session.id, &session.hands, &session.dir).await
        }
    }
}

/// The session's agent started inside its hands (starting them first): with the session's model
/// token and the proxy's address as the hands reach it, after stopping an agent an earlier
/// brain or gateway left there. Also how a warm sandbox gets its agent ([`crate::warm`]).
pub async fn start_in_hands(
    gateway: &Arc<Engine>,
    session_id: &str,
    hands: &Hands,
    session_dir: &std::path::Path,
) -> Result<Worker, EngineError> {
    let agent = &gateway.agent;
    let unavailable = |e: BrainError| EngineError::BrainUnavailable(e.to_string());
    let origin = gateway.model_origin(true);
    let token = gateway.model.token(session_id);
    let endpoint = hands.endpoint().await?;
    if gateway.hands_have_own_network() {
        let run_dir = gateway.args.data.join("run").join("hands").join(session_id);
        let ledger: Arc<dyn crate::model_proxy::Ledger> = gateway.clone();
        gateway.model_sockets.serve(
            gateway.model.clone(),
            ledger,
            session_id,
            &run_dir.join(crate::hands::local::MODEL_SOCKET),
            gateway.args.serve_config(),
        )?;
    }
    let confined = hands.isolation() == Isolation::Bwrap;
    let home = match confined {
        true => warren_sandbox::HOME.to_owned(),
        false => session_dir
            .join("agent-home")
            .to_string_lossy()
            .into_owned(),
    };
    let access = ModelAccess {
        proxy_origin: &origin,
        token: &token,
        // In a sandbox the agent runs as the hands' unprivileged uid.
        as_root: !confined && rustix::process::geteuid().is_root(),
        home: &home,
    };
    let command = agent.session_command(confined, &access);
    if let Some(earlier) = hands.earlier_agent_pty().await {
        stop_earlier_agent(&endpoint, &earlier).await;
    }
    let (worker, pty_id) = spawn_in_hands(&endpoint, &command)
        .await
        .map_err(unavailable)?;
    hands.set_agent_pty(&pty_id).await;
    Ok(worker)
}

/// `POST /v1/sessions/{id}/cancel`: fires the running turn's token (see the module docs); 409
/// `NO_TURN_RUNNING` when no turn runs.
pub async fn cancel_turn(session: &Arc<Session>) -> Result<(), EngineError> {
    session.cancel_turn()
}

/// `POST /v1/sessions/{id}/permissions/{request_id}`.
pub fn answer_permission(
    session: &Session,
    request_id: &str,
    option_id: String,
) -> Result<(), EngineError> {
    session.answer_permission(request_id, option_id)
}

/// Stops brains that had no turn and no pending permission for `--brain-idle`.
pub fn spawn_idle_sweeper(gateway: &Arc<Engine>) {
    let period =
        (gateway.args.brain_idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(30));
    gateway.every(period, |gateway| async move {
        for session in gateway.sessions.all() {
            // An agent inside paused hands is frozen with them and costs no CPU; it stops when
            // they are archived.
            if session.hands.brain_placement() == BrainPlacement::Hands
                && session.hands.state() == HandsState::Paused
            {
                continue;
            }
            let Some(idle_brain) = session.take_idle_brain(gateway.args.brain_idle) else {
                continue;
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
            idle_brain.stop().await;
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
            let turn = session.running_turn();
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
        let pending = PendingPermission::new(answer, option_ids);
        if !session.ask_permission(&request_id, tool_call, options, pending) {
            return Box::pin(async { PermissionOutcome::Cancelled });
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
        if let Some(session) = self.session.upgrade() {
            session.abandon_permission(&self.request_id);
        }
    }
}
