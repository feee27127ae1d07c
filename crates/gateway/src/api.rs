//! The gateway's HTTP surface: routes, credential extractors and handlers. Handlers parse and
//! authorize, then call the owning module (devices, sessions, turns, the SSE stream); status
//! codes come only from [`GatewayError`].

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::{FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use warren_protocol::gateway::{
    CreateSession, DeviceInfo, DeviceRegistered, MessageAccepted, PermissionAnswer, PostMessage,
    RegisterDevice, RenameSession, SessionInfo, SessionList,
};

use crate::auth::{bearer_token, secret_matches};
use crate::error::{GatewayError, Json, OptionalJson, Path};
use crate::{Gateway, event_log, sessions, sse, turns};

pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/v1/devices", post(register_device))
        .route("/v1/admin/devices", get(admin_list_devices))
        .route(
            "/v1/admin/devices/{device_id}/reset",
            post(admin_reset_device),
        )
        .route("/v1/sessions", post(create_session).get(list_sessions))
        .route(
            "/v1/sessions/{id}",
            get(get_session)
                .patch(rename_session)
                .delete(delete_session),
        )
        .route("/v1/sessions/{id}/messages", post(post_message))
        .route("/v1/sessions/{id}/cancel", post(cancel_turn))
        .route(
            "/v1/sessions/{id}/permissions/{request_id}",
            post(answer_permission),
        )
        .route("/v1/sessions/{id}/events", get(events))
        .route("/v1/sessions/{id}/terminals", get(list_terminals))
        .route(
            "/v1/sessions/{id}/terminals/{name}/ws",
            get(attach_terminal),
        )
        .route(
            "/v1/sessions/{id}/previews",
            post(create_preview).get(list_previews),
        )
        .route(
            "/v1/sessions/{id}/previews/{port}",
            axum::routing::delete(delete_preview),
        )
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .merge(crate::files::routes())
        .merge(crate::model_proxy::routes())
        .merge(crate::console::routes())
        .fallback(|| async { GatewayError::RouteNotFound })
        .method_not_allowed_fallback(|| async { GatewayError::MethodNotAllowed })
        // Before every route: a preview origin's requests never reach the API.
        .layer(axum::middleware::from_fn_with_state(
            gateway.clone(),
            crate::previews::route,
        ))
        .with_state(gateway)
}

async fn list_terminals(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path(id): Path<String>,
) -> Result<axum::Json<Vec<crate::terminals::TerminalInfo>>, GatewayError> {
    let session = gateway.sessions.get(&device_id, &id)?;
    Ok(axum::Json(gateway.terminals.list(&session).await))
}

/// `GET /v1/sessions/{id}/terminals/{name}/ws`: the WebSocket of the person's shell `name`.
async fn attach_terminal(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path((id, name)): Path<(String, String)>,
    request: axum::extract::Request,
) -> Result<Response, GatewayError> {
    let session = gateway.sessions.get(&device_id, &id)?;
    gateway.terminals.attach(&session, &name, request).await
}

/// `POST /v1/sessions/{id}/previews {"port"}` body.
#[derive(serde::Deserialize)]
struct CreatePreview {
    port: i64,
}

async fn create_preview(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path(id): Path<String>,
    Json(body): Json<CreatePreview>,
) -> Result<Response, GatewayError> {
    let session = gateway.sessions.get(&device_id, &id)?;
    let port = crate::previews::parse_port(body.port)?;
    let preview = gateway.previews.create(&session.id, port);
    Ok((StatusCode::CREATED, axum::Json(preview)).into_response())
}

async fn list_previews(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path(id): Path<String>,
) -> Result<axum::Json<Vec<crate::previews::PreviewInfo>>, GatewayError> {
    let session = gateway.sessions.get(&device_id, &id)?;
    Ok(axum::Json(gateway.previews.list(&session.id)))
}

async fn delete_preview(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path((id, port)): Path<(String, i64)>,
) -> Result<StatusCode, GatewayError> {
    let session = gateway.sessions.get(&device_id, &id)?;
    let port = crate::previews::parse_port(port)?;
    match gateway.previews.revoke(&session.id, port) {
        true => Ok(StatusCode::NO_CONTENT),
        false => Err(GatewayError::PreviewNotFound),
    }
}

/// The bearer token of a request: `Authorization: Bearer T`, else `?access_token=T` (browsers
/// cannot set headers on EventSource/WebSocket).
fn bearer(parts: &Parts) -> Option<String> {
    if let Some(value) = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        return bearer_token(value).map(str::to_string);
    }
    let query = parts.uri.query()?;
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix("access_token=").map(str::to_string))
}

/// An authenticated device (its id).
pub struct Device(pub String);

impl FromRequestParts<Arc<Gateway>> for Device {
    type Rejection = GatewayError;

    async fn from_request_parts(
        parts: &mut Parts,
        gateway: &Arc<Gateway>,
    ) -> Result<Self, Self::Rejection> {
        let token = bearer(parts).ok_or(GatewayError::Unauthorized)?;
        gateway.devices.authenticate(&token).map(Device)
    }
}

/// A request carrying the admin token. Admin routes do not exist without `--admin-token`.
pub struct Admin;

impl FromRequestParts<Arc<Gateway>> for Admin {
    type Rejection = GatewayError;

    async fn from_request_parts(
        parts: &mut Parts,
        gateway: &Arc<Gateway>,
    ) -> Result<Self, Self::Rejection> {
        let expected = gateway
            .args
            .admin_token
            .as_deref()
            .ok_or(GatewayError::RouteNotFound)?;
        let token = bearer(parts).ok_or(GatewayError::Unauthorized)?;
        if secret_matches(&token, expected) {
            Ok(Admin)
        } else {
            Err(GatewayError::Unauthorized)
        }
    }
}

async fn register_device(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Json(body): Json<RegisterDevice>,
) -> Result<Response, GatewayError> {
    let app_key = headers
        .get("x-app-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !secret_matches(app_key, &gateway.app_key) {
        return Err(GatewayError::BadAppKey);
    }
    gateway.sessions.storage().check()?;
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .map(str::to_string);
    // Registration fsyncs the device file: keep it off the async workers.
    let device_id = body.device_id.clone();
    let registering = gateway.clone();
    let token = tokio::task::spawn_blocking(move || {
        registering
            .devices
            .register(&device_id, presented.as_deref())
    })
    .await
    .map_err(|e| GatewayError::Internal(e.to_string()))??;
    tracing::info!(device_id = %body.device_id, "device registered");
    let registered = DeviceRegistered {
        device_id: body.device_id,
        token,
    };
    Ok((StatusCode::CREATED, axum::Json(registered)).into_response())
}

async fn admin_list_devices(
    State(gateway): State<Arc<Gateway>>,
    _admin: Admin,
) -> Result<axum::Json<Vec<DeviceInfo>>, GatewayError> {
    let devices = gateway
        .devices
        .list()
        .into_iter()
        .map(|(device_id, created_at, bound, last_used_at)| DeviceInfo {
            n_sessions: gateway.sessions.count_for(&device_id),
            device_id,
            created_at,
            bound,
            last_used_at,
        })
        .collect();
    Ok(axum::Json(devices))
}

async fn admin_reset_device(
    State(gateway): State<Arc<Gateway>>,
    _admin: Admin,
    Path(device_id): Path<String>,
) -> Result<StatusCode, GatewayError> {
    let resetting = gateway.clone();
    let id = device_id.clone();
    tokio::task::spawn_blocking(move || resetting.devices.reset(&id))
        .await
        .map_err(|e| GatewayError::Internal(e.to_string()))??;
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

async fn create_session(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    OptionalJson(body): OptionalJson<CreateSession>,
) -> Result<Response, GatewayError> {
    if let Some(title) = &body.title {
        check_title(title)?;
    }
    let session = sessions::create_session(&gateway, &device_id, body.title).await?;
    Ok((StatusCode::CREATED, axum::Json(session.info())).into_response())
}

/// `PATCH /v1/sessions/{id} {"title"}`: renames the session (1 to 200 characters).
async fn rename_session(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path(id): Path<String>,
    Json(body): Json<RenameSession>,
) -> Result<axum::Json<SessionInfo>, GatewayError> {
    let session = gateway.sessions.get(&device_id, &id)?;
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

async fn list_sessions(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
) -> axum::Json<SessionList> {
    let sessions = gateway
        .sessions
        .list(&device_id)
        .iter()
        .map(|s| s.info())
        .collect();
    axum::Json(SessionList { sessions })
}

async fn get_session(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path(id): Path<String>,
) -> Result<axum::Json<SessionInfo>, GatewayError> {
    Ok(axum::Json(gateway.sessions.get(&device_id, &id)?.info()))
}

async fn delete_session(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path(id): Path<String>,
) -> Result<StatusCode, GatewayError> {
    let session = gateway.sessions.get(&device_id, &id)?;
    sessions::delete_session(&gateway, &session).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn post_message(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path(id): Path<String>,
    Json(body): Json<PostMessage>,
) -> Result<Response, GatewayError> {
    let session = gateway.sessions.get(&device_id, &id)?;
    if body.text.trim().is_empty() {
        return Err(GatewayError::InvalidRequest(
            "text is empty: a message needs something to say".to_owned(),
        ));
    }
    let turn = turns::start_turn(&gateway, &session, body.text).await?;
    Ok((StatusCode::ACCEPTED, axum::Json(MessageAccepted { turn })).into_response())
}

async fn cancel_turn(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path(id): Path<String>,
) -> Result<StatusCode, GatewayError> {
    let session = gateway.sessions.get(&device_id, &id)?;
    turns::cancel_turn(&session).await?;
    Ok(StatusCode::ACCEPTED)
}

async fn answer_permission(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path((id, request_id)): Path<(String, String)>,
    Json(body): Json<PermissionAnswer>,
) -> Result<StatusCode, GatewayError> {
    let session = gateway.sessions.get(&device_id, &id)?;
    turns::answer_permission(&session, &request_id, body.option_id)?;
    Ok(StatusCode::NO_CONTENT)
}

async fn events(
    State(gateway): State<Arc<Gateway>>,
    Device(device_id): Device,
    Path(id): Path<String>,
    Query(query): Query<Vec<(String, String)>>,
    headers: HeaderMap,
) -> Result<Response, GatewayError> {
    let session = gateway.sessions.get(&device_id, &id)?;
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
    Ok(sse::stream(session, after, gateway.args.sse_heartbeat()).into_response())
}

/// `ok` while the gateway can write its data; 503 with a JSON body saying why while it cannot.
async fn healthz(State(gateway): State<Arc<Gateway>>) -> Response {
    match gateway.sessions.storage().failure() {
        None => "ok\n".into_response(),
        Some(failure) => {
            let body = serde_json::json!({
                "status": "degraded",
                "storage": "failing",
                "full": failure.full,
                "message": failure.message,
                "since": failure.since,
            });
            (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response()
        }
    }
}

async fn metrics(State(gateway): State<Arc<Gateway>>) -> Response {
    let sessions = gateway.sessions.all();
    let n_running = sessions.iter().filter(|s| s.is_running()).count();
    let n_subscribers: usize = sessions.iter().map(|s| s.log.n_subscribers()).sum();
    let lines = [
        ("warren_gateway_sessions", "gauge", sessions.len() as u64),
        ("warren_gateway_turns_running", "gauge", n_running as u64),
        (
            "warren_gateway_brains_running",
            "gauge",
            gateway.sessions.admission().n_brains() as u64,
        ),
        (
            "warren_gateway_warm_workers",
            "gauge",
            gateway.pool.n_ready() as u64,
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
