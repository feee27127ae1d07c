//! The agent exec API (exec-tools.md): `POST /v1/exec`, `POST /v1/exec/{session_id}/stdin`,
//! `GET /v1/exec` and `DELETE /v1/exec/{session_id}`, each answering with the engine's
//! structured result and its Codex-format `text`.
//!
//! The routes are thin: parsing, then one call into [`warren_exec::Engine`]; its errors become
//! statuses in `crate::error`. The engine is shared (see [`ExecState::engine`]) so the MCP
//! service at `/mcp` drives the same sessions.

use std::sync::Arc;

use axum::extract::State;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use warren_exec::{Engine, EngineConfig, Watcher};
use warren_protocol::error::ErrorBody;
use warren_protocol::exec::{ExecCommandArgs, ExecResult, SessionId, SessionList, WriteStdinBody};

use crate::Config;
use crate::error::{ApiError, Json, OptionalJson, Path};

/// The exec engine of one daemon.
#[derive(Clone)]
pub struct ExecState {
    engine: Arc<Engine>,
}

impl ExecState {
    /// An engine whose default working directory is `--root`, which passes the `--pass-env`
    /// variables through the secret filter and shows every command to `watcher`.
    pub fn new(config: &Config, watcher: Arc<dyn Watcher>) -> Self {
        let engine_config = EngineConfig {
            default_workdir: config.root.clone(),
            pass_env: config.pass_env.clone(),
            ..EngineConfig::default()
        };
        Self {
            engine: Engine::with_watcher(engine_config, watcher),
        }
    }

    /// The engine, for other front ends of the same sessions (the MCP service).
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Kills every exec session's process tree and deletes their logs.
    pub async fn shutdown(&self) {
        self.engine.shutdown().await;
    }
}

pub fn routes(state: ExecState) -> OpenApiRouter {
    OpenApiRouter::new()
        .routes(routes!(exec_command, list_sessions))
        .routes(routes!(kill_session))
        .routes(routes!(write_stdin))
        .with_state(state)
}

/// Session ids in paths are numbers; anything else names no session (404, like an unknown
/// number).
fn parse_session_id(raw: &str) -> Result<SessionId, ApiError> {
    raw.parse()
        .map_err(|_| ApiError::UnknownExecSession(raw.to_owned()))
}

/// Runs a command (exec-tools.md's `exec_command`) and answers once it exits or
/// `yield_time_ms` passes, with a `session_id` while it still runs.
#[utoipa::path(
    post, path = "/v1/exec", tag = "exec",
    request_body = ExecCommandArgs,
    responses(
        (status = 200, description = "The command's result so far", body = ExecResult),
        (status = 400, description = "`INVALID_REQUEST_BODY` (unreadable body, an argument out of range), `INVALID_WORKDIR`, or `SPAWN_FAILED` for a `shell` that does not exist", body = ErrorBody),
        (status = 429, description = "`TOO_MANY_SESSIONS`: every session slot is busy", body = ErrorBody),
        (status = 500, description = "`SPAWN_FAILED`: the shell exists but could not be started (the OS error)", body = ErrorBody),
        (status = 503, description = "`SHUTTING_DOWN`", body = ErrorBody),
    )
)]
async fn exec_command(
    State(state): State<ExecState>,
    Json(args): Json<ExecCommandArgs>,
) -> Result<axum::Json<ExecResult>, ApiError> {
    Ok(axum::Json(state.engine.exec_command(args).await?))
}

/// Types `chars` into a running session (exec-tools.md's `write_stdin`); empty `chars` only
/// polls for output.
#[utoipa::path(
    post, path = "/v1/exec/{session_id}/stdin", tag = "exec",
    params(("session_id" = String, Path, description = "A session id from `/v1/exec`'s answer")),
    request_body(content = Option<WriteStdinBody>, description = "May be empty (then `chars` is empty: a poll)"),
    responses(
        (status = 200, description = "The session's output since the last call", body = ExecResult),
        (status = 400, description = "`INVALID_REQUEST_BODY`", body = ErrorBody),
        (status = 404, description = "`SESSION_NOT_FOUND`", body = ErrorBody),
        (status = 503, description = "`SHUTTING_DOWN`", body = ErrorBody),
    )
)]
async fn write_stdin(
    State(state): State<ExecState>,
    Path(session_id): Path<String>,
    OptionalJson(body): OptionalJson<WriteStdinBody>,
) -> Result<axum::Json<ExecResult>, ApiError> {
    let session_id = parse_session_id(&session_id)?;
    let args = body.with_session_id(session_id);
    Ok(axum::Json(state.engine.write_stdin(args).await?))
}

/// Every exec session the engine holds (exec-tools.md's `list_sessions`).
#[utoipa::path(
    get, path = "/v1/exec", tag = "exec",
    responses(
        (status = 200, description = "The sessions", body = SessionList),
    )
)]
async fn list_sessions(State(state): State<ExecState>) -> axum::Json<SessionList> {
    axum::Json(state.engine.list_sessions().await)
}

/// Kills a session's whole process tree (exec-tools.md's `kill_session`).
#[utoipa::path(
    delete, path = "/v1/exec/{session_id}", tag = "exec",
    params(("session_id" = String, Path, description = "A session id from `/v1/exec`'s answer")),
    responses(
        (status = 200, description = "The session's last output and its exit", body = ExecResult),
        (status = 404, description = "`SESSION_NOT_FOUND`", body = ErrorBody),
        (status = 503, description = "`SHUTTING_DOWN`", body = ErrorBody),
    )
)]
async fn kill_session(
    State(state): State<ExecState>,
    Path(session_id): Path<String>,
) -> Result<axum::Json<ExecResult>, ApiError> {
    let session_id = parse_session_id(&session_id)?;
    Ok(axum::Json(state.engine.kill_session(session_id).await?))
}
