//! Requests for a session another replica owns (`--store postgres://…`): the router's layer
//! brings sessions made on other replicas into this one (as followers) and forwards every
//! owner-bound request to the owner's `--replica-url` as it came, upgrades included
//! (scale-out.md "One owner per session").
//!
//! Architecture Invariant: a forwarded request is never forwarded again. The replica that
//! receives one and does not own the session answers 503 `OWNER_UNAVAILABLE`, so two replicas
//! that disagree for a moment cannot bounce a request between them.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::Gateway;
use crate::error::GatewayError;
use crate::replicas::{Route, route};
use crate::session::Session;

/// The header a replica adds to a request it forwards (its replica id).
pub const FORWARDED_HEADER: &str = "x-warren-forwarded-by";

/// The session id of a request under `/v1/sessions/{id}/…` that needs the session's owner:
/// everything of a session but its event stream, which any replica serves.
fn owner_bound(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1/sessions/")?;
    let (id, tail) = rest.split_once('/').unwrap_or((rest, ""));
    (!id.is_empty() && tail != "events").then_some(id)
}

/// The router's layer: brings sessions made on other replicas into this one (as followers),
/// and sends owner-bound requests to the owner.
pub async fn layer(State(gateway): State<Arc<Gateway>>, request: Request, next: Next) -> Response {
    if gateway.engine.replicas.is_none() {
        return next.run(request).await;
    }
    let path = request.uri().path().to_owned();
    if path == "/v1/sessions" {
        if let Err(e) = gateway.engine.sessions.load_missing().await {
            return GatewayError::from(e).into_response();
        }
        return next.run(request).await;
    }
    let Some(id) = path
        .strip_prefix("/v1/sessions/")
        .map(|rest| rest.split('/').next().unwrap_or(""))
    else {
        return next.run(request).await;
    };
    let found = session_for_request(&gateway, id).await;
    let session = match found {
        Ok(Some(session)) => session,
        // Unknown: the route answers 404 itself (after authentication).
        Ok(None) => return next.run(request).await,
        Err(e) => return e.into_response(),
    };
    if owner_bound(&path).is_none() {
        return next.run(request).await;
    }
    match route(&gateway.engine, &session).await {
        Ok(Route::Here) => next.run(request).await,
        Ok(Route::There { url, expires_in }) => forward(&gateway, &url, request, expires_in)
            .await
            .unwrap_or_else(IntoResponse::into_response),
        Err(e) => GatewayError::from(e).into_response(),
    }
}

/// The session `id` for a request: from the map while this replica owns it (its deletes go
/// through this replica, so the map is the truth), else as the store has it now (see
/// [`Sessions::find`](crate::sessions::Sessions::find)).
pub async fn session_for_request(
    gateway: &Gateway,
    id: &str,
) -> Result<Option<Arc<Session>>, GatewayError> {
    let owned = gateway
        .engine
        .replicas
        .as_ref()
        .is_none_or(|replicas| replicas.holds(id));
    match gateway.engine.sessions.by_id(id).filter(|_| owned) {
        Some(session) => Ok(Some(session)),
        None => Ok(gateway.engine.sessions.find(id).await?),
    }
}

/// Whole seconds to wait for a lease with `expires_in` left (at least 1).
fn retry_after(expires_in: Duration) -> u64 {
    expires_in.as_secs() + 1
}

/// Sends `request` to the owner at `url` as it came (its `Host` kept, so a preview origin's
/// request is one on the owner too), marked forwarded by this replica. A request that was
/// forwarded already, or an owner that does not answer (in [`forward_head_timeout`]), is 503
/// `OWNER_UNAVAILABLE` until the lease expires.
pub async fn forward(
    gateway: &Gateway,
    url: &str,
    request: Request,
    expires_in: Duration,
) -> Result<Response, GatewayError> {
    let unavailable = || GatewayError::OwnerUnavailable(retry_after(expires_in));
    if request.headers().contains_key(FORWARDED_HEADER) {
        return Err(unavailable());
    }
    let replicas = gateway
        .engine
        .replicas
        .as_ref()
        .ok_or_else(|| GatewayError::Internal("forwarding without replicas".into()))?;
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .to_owned();
    let mut extra = axum::http::HeaderMap::new();
    if let Some(host) = request.headers().get(axum::http::header::HOST) {
        extra.insert(axum::http::header::HOST, host.clone());
    }
    if let Ok(value) = axum::http::HeaderValue::from_str(&replicas.id) {
        extra.insert(FORWARDED_HEADER, value);
    }
    // An owner that stalls (stopped, swapping, partitioned) accepts the connection and never
    // answers: past the head timeout the request is 503 too, and the lease it cannot renew
    // soon expires.
    let forwarded = crate::tunnel::forward_to(url, &path, request, extra, ());
    match tokio::time::timeout(forward_head_timeout(replicas.ttl), forwarded).await {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(e)) => {
            tracing::warn!(owner = %url, error = %e, "the session's owner did not answer");
            Err(unavailable())
        }
        Err(_) => {
            tracing::warn!(owner = %url, "the session's owner did not answer in time");
            Err(unavailable())
        }
    }
}

/// How long a forwarded request waits for the owner's answer to begin: the lease's ttl (an
/// owner silent that long loses its sessions anyway), and at least 5 s.
fn forward_head_timeout(ttl: Duration) -> Duration {
    ttl.max(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_of_a_session_but_its_stream_is_the_owners() {
        let cases = [
            ("/v1/sessions/abc", Some("abc")),
            ("/v1/sessions/abc/messages", Some("abc")),
            ("/v1/sessions/abc/terminals/t1/ws", Some("abc")),
            ("/v1/sessions/abc/files/content", Some("abc")),
            ("/v1/sessions/abc/events", None),
            ("/v1/sessions", None),
            ("/v1/sessions/", None),
            ("/v1/devices", None),
        ];
        for (path, want) in cases {
            assert_eq!(owner_bound(path), want, "{path}");
        }
    }

    #[test]
    fn retry_after_covers_the_lease() {
        assert_eq!(retry_after(Duration::from_millis(2500)), 3);
        assert_eq!(retry_after(Duration::ZERO), 1);
    }
}
