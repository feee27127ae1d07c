//! The gateway's HTTP surface: routes, credential extractors and handlers. Handlers parse and
//! authorize, then call the owning module (devices, sessions, turns, the SSE stream); status
//! codes come only from [`GatewayError`]. Each documented handler's `#[utoipa::path]` says its
//! statuses and bodies, and [`routes`] registers it with the same `routes!` call that puts it in
//! the OpenAPI document ([`crate::openapi`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use warren_protocol::error::ErrorBody;
use warren_protocol::gateway::{
    CreateSession, DeviceInfo, DeviceRegistered, MessageAccepted, PermissionAnswer, PostMessage,
    RegisterDevice, RenameSession, SessionInfo, SessionList,
};

use crate::auth::{Admin, Device, bearer_token, secret_matches};
use crate::error::{GatewayError, Json, OptionalJson, Path};
use crate::{Gateway, event_log, sessions, sse, turns};

/// Every documented route, each registered by the `routes!` call that documents it.
pub fn routes() -> OpenApiRouter<Arc<Gateway>> {
    use utoipa::OpenApi as _;
    OpenApiRouter::with_openapi(crate::openapi::ApiDoc::openapi())
        .routes(routes!(register_device))
        .routes(routes!(admin_list_devices))
        .routes(routes!(admin_reset_device))
        .routes(routes!(create_session, list_sessions))
        .routes(routes!(get_session, rename_session, delete_session))
        .routes(routes!(post_message))
        .routes(routes!(cancel_turn))
        .routes(routes!(answer_permission))
        .routes(routes!(get_egress, put_egress))
        .routes(routes!(events))
        .routes(routes!(list_terminals))
        .routes(routes!(attach_terminal))
        .routes(routes!(create_preview, list_previews))
        .routes(routes!(delete_preview))
        .routes(routes!(healthz))
        .routes(routes!(metrics))
        .routes(routes!(crate::openapi::openapi_json))
        .merge(crate::files::routes())
        .merge(crate::checkpoints::routes())
        .merge(crate::pairing::routes())
        .merge(crate::push::routes())
}

/// The gateway's router: the documented [`routes`], and the routes the document leaves out
/// ([`crate::openapi::UNDOCUMENTED`]).
pub fn router(gateway: Arc<Gateway>) -> Router {
    let (documented, _document) = routes().split_for_parts();
    documented
        .merge(crate::console::routes())
        .fallback(|| async { GatewayError::RouteNotFound })
        .method_not_allowed_fallback(|| async { GatewayError::MethodNotAllowed })
        .with_state(gateway.clone())
        // The model proxy's routes (its own crate and state).
        .merge({
            let ledger: Arc<dyn crate::model_proxy::Ledger> = gateway.engine.clone();
            crate::model_proxy::router(gateway.engine.model.clone(), ledger)
        })
        // With replicas: sessions made elsewhere are loaded, owner-bound requests forwarded.
        .layer(axum::middleware::from_fn_with_state(
            gateway.clone(),
            crate::owner::layer,
        ))
        // Before every route: a preview origin's requests never reach the API.
        .layer(axum::middleware::from_fn_with_state(
            gateway,
            crate::previews::route,
        ))
}

#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/terminals",
    tag = "terminals",
    params(("id" = String, Path, description = "The session's id")),
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 200, description = "The person's shells and the agent's commands", body = Vec<crate::terminals::TerminalInfo>),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND: no such session of this device", body = ErrorBody),
    ),
)]
async fn list_terminals(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path(id): Path<String>,
) -> Result<axum::Json<Vec<crate::terminals::TerminalInfo>>, GatewayError> {
    let session = gateway.engine.sessions.get(&device_id, &id)?;
    Ok(axum::Json(gateway.terminals.list(&session).await))
}

/// `GET /v1/sessions/{id}/terminals/{name}/ws`: the WebSocket of the person's shell `name`.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/terminals/{name}/ws",
    tag = "terminals",
    params(("id" = String, Path, description = "The session's id"), ("name" = String, Path, pattern = "^[a-z0-9-]{1,32}$", description = "`[a-z0-9-]{1,32}`: a shell's name, or an agent's `term-…`/`exec-…`"), ("mode" = Option<String>, Query, description = "`viewer` to watch (pty-sessions.md)"), ("takeover" = Option<String>, Query, description = "`1` to take the terminal over"), ("since" = Option<u64>, Query, description = "The output offset to replay from")),
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 101, description = "The WebSocket of the terminal, execd's PTY protocol carried through (pty-sessions.md)"),
        (status = 400, description = "INVALID_REQUEST_BODY: not a terminal name", body = ErrorBody),
        (status = 426, description = "UPGRADE_REQUIRED: a plain request, not a WebSocket handshake", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND, or TERMINAL_NOT_FOUND: the agent runs no such terminal", body = ErrorBody),
        (status = 409, description = "HANDS_IDENTITY_MISMATCH: the hands changed under the request", body = ErrorBody),
        (status = 502, description = "HANDS_FAILED: the hands' execd failed", body = ErrorBody),
        (status = 503, description = "HANDS_UNAVAILABLE: the hands cannot start", body = ErrorBody),
    ),
)]
async fn attach_terminal(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path((id, name)): Path<(String, String)>,
    request: axum::extract::Request,
) -> Result<Response, GatewayError> {
    let session = gateway.engine.sessions.get(&device_id, &id)?;
    gateway.terminals.attach(&session, &name, request).await
}

/// `POST /v1/sessions/{id}/previews {"port"}` body.
#[derive(serde::Deserialize, utoipa::ToSchema)]
struct CreatePreview {
    /// The port of the hands to preview, 1 to 65535.
    #[schema(minimum = 1, maximum = 65535)]
    port: i64,
}

#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/previews",
    tag = "previews",
    params(("id" = String, Path, description = "The session's id")),
    request_body = CreatePreview,
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 201, description = "The preview: its URL on an origin of its own, and when it expires", body = crate::previews::PreviewInfo),
        (status = 400, description = "INVALID_REQUEST_BODY: not a JSON object of this shape (or no JSON content type), or a port outside 1 to 65535", body = ErrorBody),
        (status = 408, description = "REQUEST_TIMEOUT: the body did not arrive in time", body = ErrorBody),
        (status = 413, description = "BODY_TOO_LARGE", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND: no such session of this device", body = ErrorBody),
    ),
)]
async fn create_preview(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path(id): Path<String>,
    Json(body): Json<CreatePreview>,
) -> Result<Response, GatewayError> {
    let session = gateway.engine.sessions.get(&device_id, &id)?;
    let port = crate::previews::parse_port(body.port)?;
    let preview = gateway
        .previews
        .create(gateway.engine.sessions.store(), &session.id, port)
        .await?;
    Ok((StatusCode::CREATED, axum::Json(preview)).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/previews",
    tag = "previews",
    params(("id" = String, Path, description = "The session's id")),
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 200, description = "The session's live previews", body = Vec<crate::previews::PreviewInfo>),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND: no such session of this device", body = ErrorBody),
    ),
)]
async fn list_previews(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path(id): Path<String>,
) -> Result<axum::Json<Vec<crate::previews::PreviewInfo>>, GatewayError> {
    let session = gateway.engine.sessions.get(&device_id, &id)?;
    Ok(axum::Json(gateway.previews.list(&session.id)))
}

#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}/previews/{port}",
    tag = "previews",
    params(("id" = String, Path, description = "The session's id"), ("port" = i64, Path, description = "The previewed port")),
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 204, description = "Revoked"),
        (status = 400, description = "INVALID_REQUEST_BODY: the port is not a number from 1 to 65535", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND, or PREVIEW_NOT_FOUND: the session has no preview of this port", body = ErrorBody),
    ),
)]
async fn delete_preview(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path((id, port)): Path<(String, i64)>,
) -> Result<StatusCode, GatewayError> {
    let session = gateway.engine.sessions.get(&device_id, &id)?;
    let port = crate::previews::parse_port(port)?;
    match gateway
        .previews
        .revoke(gateway.engine.sessions.store(), &session.id, port)
        .await?
    {
        true => Ok(StatusCode::NO_CONTENT),
        false => Err(GatewayError::PreviewNotFound),
    }
}

#[utoipa::path(
    post,
    path = "/v1/devices",
    tag = "devices",
    request_body = RegisterDevice,
    security(("app_key" = []), ("app_key" = [], "device_token" = []), ()),
    responses(
        (status = 201, description = "Registered: the device token, shown this once", body = DeviceRegistered),
        (status = 400, description = "INVALID_REQUEST_BODY, or INVALID_DEVICE_ID: not 8 to 128 characters of [A-Za-z0-9_-]", body = ErrorBody),
        (status = 401, description = "INVALID_APP_KEY: no pair_code, and a missing or wrong X-App-Key; INVALID_PAIR_CODE: a pair_code (which stands in for the app key, whatever X-App-Key says) that is wrong, expired or used", body = ErrorBody),
        (status = 408, description = "REQUEST_TIMEOUT: the body did not arrive in time", body = ErrorBody),
        (status = 409, description = "DEVICE_ALREADY_BOUND: the id holds a live token, and the request does not present it (with a pair_code: the id is in use); DEVICE_REVOKED: the id was revoked, register with a new one", body = ErrorBody),
        (status = 413, description = "BODY_TOO_LARGE", body = ErrorBody),
        (status = 507, description = "STORAGE_FULL: the gateway's disk is full", body = ErrorBody),
    ),
)]
async fn register_device(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Json(body): Json<RegisterDevice>,
) -> Result<Response, GatewayError> {
    let app_key = headers.get("x-app-key").and_then(|v| v.to_str().ok());
    let token = match &body.pair_code {
        // A pairing code stands in for the app key: the device joins the code's owner.
        Some(code) => {
            gateway.engine.sessions.storage().check()?;
            gateway
                .devices
                .register_paired(&body.device_id, code)
                .await?
        }
        None => {
            if !secret_matches(app_key.unwrap_or(""), &gateway.app_key) {
                return Err(GatewayError::BadAppKey);
            }
            gateway.engine.sessions.storage().check()?;
            let presented = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(bearer_token)
                .map(str::to_string);
            gateway.devices.register(&body.device_id, presented).await?
        }
    };
    tracing::info!(device_id = %body.device_id, "device registered");
    let registered = DeviceRegistered {
        device_id: body.device_id,
        token,
    };
    Ok((StatusCode::CREATED, axum::Json(registered)).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/admin/devices",
    tag = "devices",
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "Every device (never any token material)", body = Vec<DeviceInfo>),
        (status = 401, description = "UNAUTHORIZED: a missing or wrong admin token", body = ErrorBody),
        (status = 404, description = "NOT_FOUND: the gateway runs without --admin-token", body = ErrorBody),
    ),
)]
async fn admin_list_devices(
    State(gateway): State<Arc<Gateway>>,
    _admin: Admin,
) -> Result<axum::Json<Vec<DeviceInfo>>, GatewayError> {
    let devices = gateway
        .devices
        .list()
        .await?
        .into_iter()
        .map(|(device_id, created_at, bound, last_used_at)| DeviceInfo {
            n_sessions: gateway.engine.sessions.count_for(&device_id),
            device_id,
            created_at,
            bound,
            last_used_at,
        })
        .collect();
    Ok(axum::Json(devices))
}

#[utoipa::path(
    post,
    path = "/v1/admin/devices/{device_id}/reset",
    tag = "devices",
    params(("device_id" = String, Path, description = "The device whose tokens are revoked")),
    security(("admin_token" = [])),
    responses(
        (status = 204, description = "Every token of the device is revoked; its sessions stay"),
        (status = 400, description = "INVALID_REQUEST_BODY: the device id does not decode", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: a missing or wrong admin token", body = ErrorBody),
        (status = 404, description = "DEVICE_NOT_FOUND, or NOT_FOUND: the gateway runs without --admin-token", body = ErrorBody),
        (status = 507, description = "STORAGE_FULL: the gateway's disk is full", body = ErrorBody),
    ),
)]
async fn admin_reset_device(
    State(gateway): State<Arc<Gateway>>,
    _admin: Admin,
    Path(device_id): Path<String>,
) -> Result<StatusCode, GatewayError> {
    gateway.devices.reset(&device_id).await?;
    tracing::info!(%device_id, "device tokens revoked by admin");
    Ok(StatusCode::NO_CONTENT)
}

/// Longest session title accepted, in characters (it is shown in lists on small screens).
const MAX_TITLE_CHARS: usize = 200;

/// A title is at most [`MAX_TITLE_CHARS`] characters.
#[doc(hidden)]
pub fn check_title(title: &str) -> Result<(), GatewayError> {
    if title.chars().count() > MAX_TITLE_CHARS {
        return Err(GatewayError::InvalidRequest(format!(
            "title is longer than {MAX_TITLE_CHARS} characters"
        )));
    }
    Ok(())
}

#[utoipa::path(
    post,
    path = "/v1/sessions",
    tag = "sessions",
    request_body(content = CreateSession, description = "Optional: an empty body is a session without a title"),
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 201, description = "The new session", body = SessionInfo),
        (status = 400, description = "INVALID_REQUEST_BODY: not a JSON object of this shape (or no JSON content type), or a title over 200 characters", body = ErrorBody),
        (status = 408, description = "REQUEST_TIMEOUT: the body did not arrive in time", body = ErrorBody),
        (status = 413, description = "BODY_TOO_LARGE", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 429, description = "QUOTA_EXCEEDED or SERVER_BUSY: a limit of the device or the gateway", body = ErrorBody),
        (status = 507, description = "STORAGE_FULL: the gateway's disk is full", body = ErrorBody),
    ),
)]
async fn create_session(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    OptionalJson(body): OptionalJson<CreateSession>,
) -> Result<Response, GatewayError> {
    if let Some(title) = &body.title {
        check_title(title)?;
    }
    let session = sessions::create_session(&gateway.engine, &device_id, body.title).await?;
    Ok((StatusCode::CREATED, axum::Json(session.info())).into_response())
}

/// `PATCH /v1/sessions/{id} {"title"}`: renames the session (1 to 200 characters).
#[utoipa::path(
    patch,
    path = "/v1/sessions/{id}",
    tag = "sessions",
    params(("id" = String, Path, description = "The session's id")),
    request_body = RenameSession,
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 200, description = "The renamed session", body = SessionInfo),
        (status = 400, description = "INVALID_REQUEST_BODY: not a JSON object of this shape (or no JSON content type), or a title empty or over 200 characters", body = ErrorBody),
        (status = 408, description = "REQUEST_TIMEOUT: the body did not arrive in time", body = ErrorBody),
        (status = 413, description = "BODY_TOO_LARGE", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND: no such session of this device", body = ErrorBody),
        (status = 507, description = "STORAGE_FULL: the gateway's disk is full", body = ErrorBody),
    ),
)]
async fn rename_session(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path(id): Path<String>,
    Json(body): Json<RenameSession>,
) -> Result<axum::Json<SessionInfo>, GatewayError> {
    let session = gateway.engine.sessions.get(&device_id, &id)?;
    let title = body.title.trim().to_owned();
    if title.is_empty() {
        return Err(GatewayError::InvalidRequest(
            "title must not be empty".into(),
        ));
    }
    check_title(&title)?;
    session.rename(title).await?;
    Ok(axum::Json(session.info()))
}

#[utoipa::path(
    get,
    path = "/v1/sessions",
    tag = "sessions",
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 200, description = "The device's sessions", body = SessionList),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
    ),
)]
async fn list_sessions(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
) -> axum::Json<SessionList> {
    let sessions = gateway
        .engine
        .sessions
        .list(&device_id)
        .iter()
        .map(|session| match &gateway.engine.replicas {
            // A session another replica owns: as the events followed here say.
            Some(replicas) if !replicas.holds(&session.id) => session.followed_info(),
            _ => session.info(),
        })
        .collect();
    axum::Json(SessionList { sessions })
}

#[utoipa::path(
    get,
    path = "/v1/sessions/{id}",
    tag = "sessions",
    params(("id" = String, Path, description = "The session's id")),
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 200, description = "The session", body = SessionInfo),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND: no such session of this device", body = ErrorBody),
    ),
)]
async fn get_session(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path(id): Path<String>,
) -> Result<axum::Json<SessionInfo>, GatewayError> {
    Ok(axum::Json(
        gateway.engine.sessions.get(&device_id, &id)?.info(),
    ))
}

#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}",
    tag = "sessions",
    params(("id" = String, Path, description = "The session's id")),
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 204, description = "Deleted: turn ended, brain and hands stopped, workspace, snapshot and events removed"),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND: no such session of this device", body = ErrorBody),
    ),
)]
async fn delete_session(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path(id): Path<String>,
) -> Result<StatusCode, GatewayError> {
    let session = gateway.engine.sessions.get(&device_id, &id)?;
    sessions::delete_session(&gateway.engine, &session).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/messages",
    tag = "sessions",
    params(("id" = String, Path, description = "The session's id")),
    request_body = PostMessage,
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 202, description = "The turn it started; its events follow on the stream", body = MessageAccepted),
        (status = 400, description = "INVALID_REQUEST_BODY: not a JSON object of this shape (or no JSON content type), or a text with nothing to say", body = ErrorBody),
        (status = 408, description = "REQUEST_TIMEOUT: the body did not arrive in time", body = ErrorBody),
        (status = 413, description = "BODY_TOO_LARGE", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND: no such session of this device", body = ErrorBody),
        (status = 409, description = "TURN_IN_PROGRESS", body = ErrorBody),
        (status = 429, description = "QUOTA_EXCEEDED or SERVER_BUSY: a limit of the device or the gateway", body = ErrorBody),
        (status = 507, description = "STORAGE_FULL: the gateway's disk is full", body = ErrorBody),
    ),
)]
async fn post_message(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path(id): Path<String>,
    Json(body): Json<PostMessage>,
) -> Result<Response, GatewayError> {
    let session = gateway.engine.sessions.get(&device_id, &id)?;
    if body.text.trim().is_empty() {
        return Err(GatewayError::InvalidRequest(
            "text is empty: a message needs something to say".to_owned(),
        ));
    }
    let turn = turns::start_turn(&gateway.engine, &session, body.text).await?;
    Ok((StatusCode::ACCEPTED, axum::Json(MessageAccepted { turn })).into_response())
}

#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/cancel",
    tag = "sessions",
    params(("id" = String, Path, description = "The session's id")),
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 202, description = "Cancelling: the turn ends with `cancelled` on the stream"),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND: no such session of this device", body = ErrorBody),
        (status = 409, description = "NO_TURN_RUNNING", body = ErrorBody),
    ),
)]
async fn cancel_turn(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path(id): Path<String>,
) -> Result<StatusCode, GatewayError> {
    let session = gateway.engine.sessions.get(&device_id, &id)?;
    turns::cancel_turn(&session).await?;
    Ok(StatusCode::ACCEPTED)
}

#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/permissions/{request_id}",
    tag = "sessions",
    params(("id" = String, Path, description = "The session's id"), ("request_id" = String, Path, description = "A `permission_request` or `egress_request` event's request_id")),
    request_body = PermissionAnswer,
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 204, description = "Answered"),
        (status = 400, description = "INVALID_REQUEST_BODY: not a JSON object of this shape (or no JSON content type), or an option the request did not offer", body = ErrorBody),
        (status = 408, description = "REQUEST_TIMEOUT: the body did not arrive in time", body = ErrorBody),
        (status = 413, description = "BODY_TOO_LARGE", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND, or PERMISSION_NOT_FOUND: no pending request with this id", body = ErrorBody),
    ),
)]
async fn answer_permission(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path((id, request_id)): Path<(String, String)>,
    Json(body): Json<PermissionAnswer>,
) -> Result<StatusCode, GatewayError> {
    let session = gateway.engine.sessions.get(&device_id, &id)?;
    let network = gateway.engine.sessions.network();
    match network
        .answer(&session.id, &request_id, &body.option_id)
        .await
    {
        Some(answered) => answered?,
        None => turns::answer_permission(&session, &request_id, body.option_id)?,
    }
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/egress",
    tag = "sessions",
    params(("id" = String, Path, description = "The session's id")),
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 200, description = "The hands' network, the session's egress policy and rules, and its recent destinations", body = crate::network::EgressView),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND", body = ErrorBody),
    ),
)]
async fn get_egress(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path(id): Path<String>,
) -> Result<axum::Json<crate::network::EgressView>, GatewayError> {
    let session = gateway.engine.sessions.get(&device_id, &id)?;
    Ok(axum::Json(
        gateway.engine.sessions.network().view(&session.id),
    ))
}

#[utoipa::path(
    put,
    path = "/v1/sessions/{id}/egress",
    tag = "sessions",
    params(("id" = String, Path, description = "The session's id")),
    request_body = crate::network::EgressUpdate,
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 200, description = "The policy, rules and (when given) credentials replaced; for connections made from now on", body = crate::network::EgressView),
        (status = 400, description = "INVALID_EGRESS_RULE: a rule that does not parse (named in the message); UNKNOWN_CREDENTIAL: a credential the session is not offered; INVALID_REQUEST_BODY: not a JSON object of this shape, or an unknown policy", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND", body = ErrorBody),
        (status = 408, description = "REQUEST_TIMEOUT: the body did not arrive in time", body = ErrorBody),
        (status = 409, description = "NO_EGRESS_PROXY: the session's hands have no egress proxy (network host, none or remote)", body = ErrorBody),
        (status = 413, description = "BODY_TOO_LARGE", body = ErrorBody),
    ),
)]
async fn put_egress(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path(id): Path<String>,
    Json(body): Json<crate::network::EgressUpdate>,
) -> Result<axum::Json<crate::network::EgressView>, GatewayError> {
    let session = gateway.engine.sessions.get(&device_id, &id)?;
    let view = gateway
        .engine
        .sessions
        .network()
        .replace(&session.id, body)
        .await?;
    Ok(axum::Json(view))
}

#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/events",
    tag = "sessions",
    params(("id" = String, Path, description = "The session's id"), ("after" = Option<u64>, Query, description = "Resume after this seq (Last-Event-ID wins)"), ("heartbeat" = Option<String>, Query, description = "`event`: heartbeats are events named `heartbeat` (`data: {\"type\":\"heartbeat\",\"interval_ms\":N}`, no id), one at once and one after each silence, which a browser's EventSource fires; otherwise comments"), ("Last-Event-ID" = Option<u64>, Header, nullable = false, description = "Resume after this seq")),
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 200, description = "Server-Sent Events: `id: <seq>`, `event: <type>`, `data: <event>`, and heartbeat comments (or `heartbeat` events, see `heartbeat`); it does not end", content_type = "text/event-stream", body = crate::openapi::SseEvent),
        (status = 400, description = "INVALID_REQUEST_BODY: after or Last-Event-ID is not a seq, or past the last event", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND: no such session of this device", body = ErrorBody),
    ),
)]
async fn events(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path(id): Path<String>,
    Query(query): Query<Vec<(String, String)>>,
    headers: HeaderMap,
) -> Result<Response, GatewayError> {
    let session = gateway.engine.sessions.get(&device_id, &id)?;
    // `after` is parsed by hand rather than by a typed `Query<T>`, whose rejection is plain
    // text.
    let query_after = query
        .iter()
        .find(|(name, _)| name == "after")
        .map(|(_, value)| value.as_str());
    let after = sse::resume_after(headers.get("last-event-id"), query_after)?;
    // A position past the end names events this log never had (a client bug, or a log that
    // lost its unsynced tail to a power cut): following it would silently skip the events
    // that take those seqs next, so it is refused.
    let last_seq = session.log.last_seq();
    if after > last_seq {
        return Err(GatewayError::InvalidRequest(format!(
            "cannot resume after seq {after}: the last event is {last_seq}"
        )));
    }
    let style = sse::HeartbeatStyle::from_query(
        query
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str())),
    );
    Ok(sse::stream(session, after, gateway.args.sse_heartbeat(), style).into_response())
}

/// `/healthz`'s 503 body.
#[derive(serde::Serialize, utoipa::ToSchema)]
struct HealthDegraded {
    /// `degraded`.
    status: &'static str,
    /// `failing`.
    storage: &'static str,
    /// Whether the disk is full (else writes fail another way).
    full: bool,
    message: String,
    /// RFC 3339: when writes started failing.
    since: String,
}

/// `ok` while the gateway can write its data; 503 with a JSON body saying why while it cannot.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "health",
    responses(
        (status = 200, description = "`ok`: the gateway can write its data", content_type = "text/plain", body = String),
        (status = 503, description = "Degraded: the data directory does not take writes", body = HealthDegraded),
    ),
)]
async fn healthz(State(gateway): State<Arc<Gateway>>) -> Response {
    match gateway.engine.sessions.storage().failure() {
        None => "ok\n".into_response(),
        Some(failure) => {
            let body = HealthDegraded {
                status: "degraded",
                storage: "failing",
                full: failure.full,
                message: failure.message,
                since: failure.since,
            };
            (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response()
        }
    }
}

#[utoipa::path(
    get,
    path = "/metrics",
    tag = "health",
    responses(
        (status = 200, description = "Prometheus text format", content_type = "text/plain; version=0.0.4", body = String),
    ),
)]
async fn metrics(State(gateway): State<Arc<Gateway>>) -> Response {
    let sessions = gateway.engine.sessions.all();
    let n_running = sessions.iter().filter(|s| s.is_running()).count();
    let n_subscribers: usize = sessions.iter().map(|s| s.log.n_subscribers()).sum();
    let lines = [
        ("warren_gateway_sessions", "gauge", sessions.len() as u64),
        ("warren_gateway_turns_running", "gauge", n_running as u64),
        (
            "warren_gateway_brains_running",
            "gauge",
            gateway.engine.sessions.admission().n_brains() as u64,
        ),
        (
            "warren_gateway_warm_workers",
            "gauge",
            gateway.engine.pool.n_ready() as u64,
        ),
        (
            "warren_gateway_sse_subscribers",
            "gauge",
            n_subscribers as u64,
        ),
        (
            "warren_gateway_events_appended_total",
            "counter",
            event_log::EVENTS_APPENDED.load(Ordering::Relaxed),
        ),
        (
            "warren_gateway_sse_slow_subscribers_dropped_total",
            "counter",
            event_log::SLOW_SUBSCRIBERS_DROPPED.load(Ordering::Relaxed),
        ),
        (
            "warren_gateway_pushes_dropped_total",
            "counter",
            gateway.push.n_dropped(),
        ),
        (
            "warren_gateway_uptime_seconds",
            "gauge",
            gateway.started.elapsed().as_secs(),
        ),
    ];
    let mut text = String::new();
    for (name, kind, value) in lines {
        text.push_str(&format!("# TYPE {name} {kind}\n{name} {value}\n"));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
