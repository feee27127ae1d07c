//! `/v1/terminals`: the agent's terminals (ACP `terminal/*`), run by the same exec engine as
//! `/v1/exec` and read back as raw bytes. `POST /v1/terminals` starts one without waiting,
//! `GET /v1/terminals/{id}/output?wait_ms=N` returns its output and (once exited and drained)
//! its exit code or signal, `POST /v1/terminals/{id}/kill` kills its whole tree and keeps it
//! readable, `DELETE /v1/terminals/{id}` kills and forgets it, `GET /v1/terminals` lists them.
//!
//! The routes are thin: parsing and one engine call; statuses come from `crate::error`.

use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use warren_protocol::error::ErrorBody;
use warren_protocol::terminal::{TerminalCreate, TerminalCreated, TerminalList, TerminalOutput};

use crate::error::{ApiError, Json, Path};
use crate::exec_api::ExecState;
use crate::route_helpers;

/// Longest `wait_ms` one output request may ask for; clients loop for longer waits.
const MAX_WAIT_MS: u64 = 300_000;

pub fn routes(state: ExecState) -> OpenApiRouter {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(release))
        .routes(routes!(output))
        .routes(routes!(kill))
        .with_state(state)
}

/// Starts a command without waiting (ACP `terminal/create`).
#[utoipa::path(
    post, path = "/v1/terminals", tag = "terminals",
    request_body = TerminalCreate,
    responses(
        (status = 201, description = "Started", body = TerminalCreated),
        (status = 400, description = "`INVALID_REQUEST_BODY`, `INVALID_WORKDIR` or `SPAWN_FAILED` (no shell)", body = ErrorBody),
        (status = 429, description = "`TOO_MANY_SESSIONS`", body = ErrorBody),
        (status = 500, description = "`SPAWN_FAILED`: the program could not be started (the OS error)", body = ErrorBody),
        (status = 503, description = "`SHUTTING_DOWN`", body = ErrorBody),
    )
)]
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

/// Every terminal not yet released.
#[utoipa::path(
    get, path = "/v1/terminals", tag = "terminals", operation_id = "list_terminals",
    responses((status = 200, description = "The terminals", body = TerminalList))
)]
async fn list(State(state): State<ExecState>) -> axum::Json<TerminalList> {
    axum::Json(state.engine().list_terminals())
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct OutputQuery {
    /// Wait up to this long for the command to exit (0: answer at once).
    #[serde(default)]
    wait_ms: u64,
}

/// The output kept so far, and the exit once the command exited and its output is drained
/// (ACP `terminal/output`, with `wait_ms` also `terminal/wait_for_exit`).
#[utoipa::path(
    get, path = "/v1/terminals/{terminal_id}/output", tag = "terminals",
    params(("terminal_id" = String, Path, description = "From `POST /v1/terminals`"), OutputQuery),
    responses(
        (status = 200, description = "The output", body = TerminalOutput),
        (status = 400, description = "`INVALID_REQUEST_BODY`: a query that does not parse", body = ErrorBody),
        (status = 404, description = "`TERMINAL_NOT_FOUND`", body = ErrorBody),
    )
)]
async fn output(
    State(state): State<ExecState>,
    Path(terminal_id): Path<String>,
    query: Result<Query<OutputQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<axum::Json<TerminalOutput>, ApiError> {
    let query = route_helpers::query(query)?;
    let wait = Duration::from_millis(query.wait_ms.min(MAX_WAIT_MS));
    state
        .engine()
        .terminal_output(&terminal_id, wait)
        .await
        .map(axum::Json)
        .map_err(ApiError::from)
}

/// Kills the command's whole tree; its output stays readable (ACP `terminal/kill`).
#[utoipa::path(
    post, path = "/v1/terminals/{terminal_id}/kill", tag = "terminals",
    params(("terminal_id" = String, Path, description = "From `POST /v1/terminals`")),
    responses(
        (status = 204, description = "Killed (or had exited already)"),
        (status = 404, description = "`TERMINAL_NOT_FOUND`", body = ErrorBody),
    )
)]
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

/// Kills the command and forgets the terminal (ACP `terminal/release`).
#[utoipa::path(
    delete, path = "/v1/terminals/{terminal_id}", tag = "terminals",
    params(("terminal_id" = String, Path, description = "From `POST /v1/terminals`")),
    responses(
        (status = 204, description = "Released"),
        (status = 404, description = "`TERMINAL_NOT_FOUND`", body = ErrorBody),
    )
)]
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
