//! The agent exec API (exec-tools.md): `POST /v1/exec`, `POST /v1/exec/{session_id}/stdin`,
//! `GET /v1/exec` and `DELETE /v1/exec/{session_id}`, each answering with the engine's
//! structured result and its Codex-format `text`.
//!
//! The routes are thin: parsing, then one call into [`warren_exec::Engine`]; its errors become
//! statuses in `crate::error`. The engine is shared (see [`ExecState::engine`]) so the MCP
//! service at `/mcp` drives the same sessions.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::routing::{delete, post};
use warren_exec::{Engine, EngineConfig, Watcher};
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

pub fn routes(state: ExecState) -> Router {
    Router::new()
        .route("/v1/exec", post(exec_command).get(list_sessions))
        .route("/v1/exec/{session_id}", delete(kill_session))
        .route("/v1/exec/{session_id}/stdin", post(write_stdin))
        .with_state(state)
}

/// Session ids in paths are numbers; anything else names no session (404, like an unknown
/// number).
fn parse_session_id(raw: &str) -> Result<SessionId, ApiError> {
    raw.parse()
        .map_err(|_| ApiError::UnknownExecSession(raw.to_owned()))
}

async fn exec_command(
    State(state): State<ExecState>,
    Json(args): Json<ExecCommandArgs>,
) -> Result<axum::Json<ExecResult>, ApiError> {
    Ok(axum::Json(state.engine.exec_command(args).await?))
}

async fn write_stdin(
    State(state): State<ExecState>,
    Path(session_id): Path<String>,
    OptionalJson(body): OptionalJson<WriteStdinBody>,
) -> Result<axum::Json<ExecResult>, ApiError> {
    let session_id = parse_session_id(&session_id)?;
    let args = body.with_session_id(session_id);
    Ok(axum::Json(state.engine.write_stdin(args).await?))
}

async fn list_sessions(State(state): State<ExecState>) -> axum::Json<SessionList> {
    axum::Json(state.engine.list_sessions().await)
}

async fn kill_session(
    State(state): State<ExecState>,
    Path(session_id): Path<String>,
) -> Result<axum::Json<ExecResult>, ApiError> {
    let session_id = parse_session_id(&session_id)?;
    Ok(axum::Json(state.engine.kill_session(session_id).await?))
}
