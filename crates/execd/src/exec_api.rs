//! The agent exec API (exec-tools.md): `POST /v1/exec`, `POST /v1/exec/{session_id}/stdin`,
//! `GET /v1/exec` and `DELETE /v1/exec/{session_id}`, each answering with the engine's
//! structured result and its Codex-format `text`.
//!
//! The routes are thin: parsing, one call into [`warren_exec::Engine`], and [`exec_error`], the
//! only place exec errors become statuses. The engine is shared (see [`ExecState::engine`]) so
//! the MCP service at `/mcp` drives the same sessions.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{delete, post};
use warren_exec::{Engine, EngineConfig, ExecError};
use warren_protocol::exec::{ExecCommandArgs, ExecResult, SessionId, SessionList, WriteStdinBody};

use crate::Config;
use crate::error::{ApiError, Json, parse_optional_body};

/// The exec engine of one daemon.
#[derive(Clone)]
pub struct ExecState {
    engine: Arc<Engine>,
}

impl ExecState {
    /// An engine whose default working directory is `--root` and which passes the
    /// `--pass-env` variables through the secret filter.
    pub fn new(config: &Config) -> Self {
        let engine_config = EngineConfig {
            default_workdir: config.root.clone(),
            pass_env: config.pass_env.clone(),
            ..EngineConfig::default()
        };
        Self {
            engine: Engine::new(engine_config),
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

pub fn routes(state: ExecState) -> Router {
    Router::new()
        .route("/v1/exec", post(exec_command).get(list_sessions))
        .route("/v1/exec/{session_id}", delete(kill_session))
        .route("/v1/exec/{session_id}/stdin", post(write_stdin))
        .with_state(state)
}

/// The one mapping from engine errors to HTTP statuses and codes.
pub(crate) fn exec_error(error: ExecError) -> ApiError {
    match error {
        ExecError::InvalidArgument(message) => ApiError::bad_request(message),
        ExecError::InvalidWorkdir { .. } => ApiError::new(
            StatusCode::BAD_REQUEST,
            "INVALID_WORKDIR",
            error.to_string(),
        ),
        ExecError::UnknownSession(_) => ApiError::new(
            StatusCode::NOT_FOUND,
            "SESSION_NOT_FOUND",
            error.to_string(),
        ),
        // The OS error is the useful part ("No such file or directory") and reveals nothing
        // the caller did not choose (the shell name).
        ExecError::Spawn { .. } => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "SPAWN_FAILED",
            error.to_string(),
        ),
        ExecError::UnknownTerminal(_) => ApiError::new(
            StatusCode::NOT_FOUND,
            "TERMINAL_NOT_FOUND",
            error.to_string(),
        ),
        ExecError::TooManySessions(_) => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "TOO_MANY_SESSIONS",
            error.to_string(),
        ),
        ExecError::ShuttingDown => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "SHUTTING_DOWN",
            error.to_string(),
        ),
    }
}

/// Session ids in paths are numbers; anything else names no session (404, like an unknown
/// number).
fn parse_session_id(raw: &str) -> Result<SessionId, ApiError> {
    raw.parse().map_err(|_| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "SESSION_NOT_FOUND",
            format!("Unknown process id {raw}"),
        )
    })
}

async fn exec_command(
    State(state): State<ExecState>,
    Json(args): Json<ExecCommandArgs>,
) -> Result<axum::Json<ExecResult>, ApiError> {
    state
        .engine
        .exec_command(args)
        .await
        .map(axum::Json)
        .map_err(exec_error)
}

async fn write_stdin(
    State(state): State<ExecState>,
    Path(session_id): Path<String>,
    body: Bytes,
) -> Result<axum::Json<ExecResult>, ApiError> {
    let session_id = parse_session_id(&session_id)?;
    let body: WriteStdinBody = parse_optional_body(&body)?;
    let args = body.with_session_id(session_id);
    state
        .engine
        .write_stdin(args)
        .await
        .map(axum::Json)
        .map_err(exec_error)
}

async fn list_sessions(State(state): State<ExecState>) -> axum::Json<SessionList> {
    axum::Json(state.engine.list_sessions().await)
}

async fn kill_session(
    State(state): State<ExecState>,
    Path(session_id): Path<String>,
) -> Result<axum::Json<ExecResult>, ApiError> {
    let session_id = parse_session_id(&session_id)?;
    state
        .engine
        .kill_session(session_id)
        .await
        .map(axum::Json)
        .map_err(exec_error)
}
