//! `/v1/terminals`: the agent's terminals (ACP `terminal/*`), run by the same exec engine as
//! `/v1/exec` and read back as raw bytes. `POST /v1/terminals` starts one without waiting,
//! `GET /v1/terminals/{id}/output?wait_ms=N` returns its output and (once exited and drained)
//! its exit code or signal, `POST /v1/terminals/{id}/kill` kills its whole tree and keeps it
//! readable, `DELETE /v1/terminals/{id}` kills and forgets it, `GET /v1/terminals` lists them.
//!
//! The routes are thin: parsing and one engine call; statuses come from `crate::error`.

use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde::Deserialize;
use warren_protocol::terminal::{TerminalCreate, TerminalCreated, TerminalList, TerminalOutput};

use crate::error::{ApiError, Json};
use crate::exec_api::ExecState;

/// Longest `wait_ms` one output request may ask for; clients loop for longer waits.
const MAX_WAIT_MS: u64 = 300_000;

pub fn routes(state: ExecState) -> Router {
    Router::new()
        .route("/v1/terminals", post(create).get(list))
        .route(
            "/v1/terminals/{terminal_id}",
            axum::routing::delete(release),
        )
        .route("/v1/terminals/{terminal_id}/output", get(output))
        .route("/v1/terminals/{terminal_id}/kill", post(kill))
        .with_state(state)
}

async fn create(
    State(state): State<ExecState>,
    Json(create): Json<TerminalCreate>,
) -> Result<(StatusCode, axum::Json<TerminalCreated>), ApiError> {
    let created = state
        .engine()
        .start_terminal(create)
        .map_err(ApiError::from)?;
    Ok((StatusCode::CREATED, axum::Json(created)))
}

async fn list(State(state): State<ExecState>) -> axum::Json<TerminalList> {
    axum::Json(state.engine().list_terminals())
}

#[derive(Debug, Deserialize)]
struct OutputQuery {
    /// Wait up to this long for the command to exit (0: answer at once).
    #[serde(default)]
    wait_ms: u64,
}

async fn output(
    State(state): State<ExecState>,
    Path(terminal_id): Path<String>,
    query: Result<Query<OutputQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<axum::Json<TerminalOutput>, ApiError> {
    let Query(query) = query
        .map_err(|e| ApiError::from(warren_http::RequestError::InvalidQuery(e.body_text())))?;
    let wait = Duration::from_millis(query.wait_ms.min(MAX_WAIT_MS));
    state
        .engine()
        .terminal_output(&terminal_id, wait)
        .await
        .map(axum::Json)
        .map_err(ApiError::from)
}

async fn kill(
    State(state): State<ExecState>,
    Path(terminal_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    state
        .engine()
        .kill_terminal(&terminal_id)
        .await
        .map_err(ApiError::from)?;
    Ok(StatusCode::NO_CONTENT)
}

async fn release(
    State(state): State<ExecState>,
    Path(terminal_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    state
        .engine()
        .release_terminal(&terminal_id)
        .await
        .map_err(ApiError::from)?;
    Ok(StatusCode::NO_CONTENT)
}
