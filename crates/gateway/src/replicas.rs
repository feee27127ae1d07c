//! Replicas: gateways sharing one PostgreSQL store (`--store postgres://…`), each owning the
//! sessions whose lease it holds, and forwarding every other session's owner-bound requests to
//! the replica that owns it (scale-out.md "One owner per session").
//!
//! Architecture Invariant: a replica runs a session's brain, hands and appends only while it
//! holds the session's lease (see `warren_store::leases`: taken and renewed on the database's
//! clock). A replica that does not own a session keeps its event log as a follower (the notices
//! of the store drive [`EventLog::follow`](crate::event_log::EventLog::follow)), so an SSE
//! client may stream any session from any replica; every other route of a session is the
//! owner's and is forwarded to its `--replica-url`, upgrades included.
//!
//! Architecture Invariant: a forwarded request is never forwarded again. The replica that
//! receives one and does not own the session answers 503 `OWNER_UNAVAILABLE`, so two replicas
//! that disagree for a moment cannot bounce a request between them.
//!
//! Failover: while the owner's lease runs, a request it cannot answer (its replica is gone) is
//! 503 `OWNER_UNAVAILABLE` with `Retry-After` (the lease's time left). Once the lease expired,
//! the next owner-bound request takes it ([`route`]): the new owner catches its log up, closes
//! the turn the old owner left running `interrupted` (exactly once: taking the lease is
//! exclusive, and one takeover runs at a time), adopts the hands, and the next message starts a
//! brain that resumes the ACP session.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use warren_store::leases::{Acquired, Lease};
use warren_store::pg::Store;

use crate::Gateway;
use crate::error::GatewayError;
use crate::event_log::EventLog;
use crate::session::{OpenTurns, Session};

/// The header a replica adds to a request it forwards (its replica id).
pub const FORWARDED_HEADER: &str = "x-warren-forwarded-by";

/// The `status` message of a turn closed by a takeover.
const TAKEOVER_MESSAGE: &str =
    "the replica that ran this session stopped; the running turn was interrupted";

/// This replica's identity and the leases it holds.
pub struct Replicas {
    store: Store,
    pub id: String,
    pub url: String,
    pub ttl: Duration,
    held: Mutex<HashMap<String, Lease>>,
    /// One takeover at a time, so a turn left open is closed once.
    takeover: tokio::sync::Mutex<()>,
}

/// Where an owner-bound request of a session is served.
pub enum Route {
    Here,
    /// Another replica holds the lease for `expires_in` more.
    There {
        url: String,
        expires_in: Duration,
    },
}

impl Replicas {
    pub fn new(store: Store, id: String, url: String, ttl: Duration) -> Arc<Replicas> {
        Arc::new(Replicas {
            store,
            id,
            url,
            ttl,
            held: Mutex::new(HashMap::new()),
            takeover: tokio::sync::Mutex::new(()),
        })
    }

    fn held(&self) -> MutexGuard<'_, HashMap<String, Lease>> {
        // Inserts and removes are single operations.
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether this replica holds the session's lease.
    pub fn holds(&self, session_id: &str) -> bool {
        self.held().contains_key(session_id)
    }

    /// Takes (or renews) the session's lease when it is free, expired or ours. Returns whether
    /// this replica owns it now and, if so, which replica it was taken from.
    pub async fn acquire(&self, session: &Session) -> Result<Acquired, GatewayError> {
        let acquired = self
            .store
            .acquire_lease(&session.id, &self.id, &self.url, self.ttl)
            .await?;
        if let Acquired::Owned { lease, .. } = &acquired {
            // From now on the session's appends are this lease's: once another replica takes
            // it, none of this one's can land after the new owner's.
            session.log.set_fence(lease.clone());
            self.held().insert(session.id.clone(), lease.clone());
        }
        Ok(acquired)
    }

    /// Gives the session's lease up (deleted, or this replica stops).
    pub async fn release(&self, session_id: &str) {
        let Some(lease) = self.held().remove(session_id) else {
            return;
        };
        if let Err(e) = self.store.release_lease(&lease).await {
            tracing::warn!(session = %session_id, error = %e, "lease not released; it expires by itself");
        }
    }

    /// Gives every lease up (graceful stop), so another replica takes the sessions at once.
    pub async fn release_all(&self) {
        let ids: Vec<String> = self.held().keys().cloned().collect();
        for id in ids {
            self.release(&id).await;
        }
    }

    /// Renews every lease held; returns the sessions whose lease another replica took.
    async fn renew_all(&self) -> Vec<String> {
        let leases: Vec<Lease> = self.held().values().cloned().collect();
        let mut lost = Vec::new();
        for lease in leases {
            match self.store.renew_lease(&lease, self.ttl).await {
                Ok(true) => {}
                Ok(false) => {
                    self.held().remove(&lease.session_id);
                    lost.push(lease.session_id);
                }
                // The store is away: the lease may still be ours; the next round tells.
                Err(e) => {
                    tracing::warn!(session = %lease.session_id, error = %e, "lease not renewed")
                }
            }
        }
        lost
    }
}

/// How often the leases are renewed: a third of their ttl, so two renewals can fail in a row.
fn renew_period(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(100))
}

/// Renews this replica's leases until the gateway goes away; a session whose lease was lost
/// (this replica stalled past its ttl and another took it) stops its brain here and stays as a
/// follower.
pub fn spawn_lease_renewal(gateway: &Arc<Gateway>) {
    let Some(replicas) = gateway.replicas.clone() else {
        return;
    };
    let weak = Arc::downgrade(gateway);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(renew_period(replicas.ttl));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if weak.strong_count() == 0 {
                return;
            }
            if let Some(gateway) = weak.upgrade() {
                gateway.sessions.admission().renew_in_store().await;
            }
            for lost in replicas.renew_all().await {
                tracing::warn!(session = %lost, "another replica took this session's lease");
                let Some(gateway) = weak.upgrade() else {
                    return;
                };
                if let Some(session) = gateway.sessions.by_id(&lost) {
                    session.hands.wake_for_brain_stop().await;
                    session.retire_for_shutdown().stop().await;
                }
            }
        }
    });
}

/// Publishes, on this replica, what the owners of the sessions it follows commit: each notice
/// of the store makes the session's log read its new rows; a reconnect of the listener (notices
/// may have been missed) makes every followed log read.
pub fn spawn_follower(gateway: &Arc<Gateway>) {
    let (Some(replicas), Some(store)) = (gateway.replicas.clone(), gateway.sessions.store()) else {
        return;
    };
    let store = store.clone();
    let weak = Arc::downgrade(gateway);
    tokio::spawn(async move {
        let notices = store.listen().await;
        let mut received = notices.subscribe();
        loop {
            let notice = received.recv().await;
            let Some(gateway) = weak.upgrade() else {
                return;
            };
            let sessions: Vec<Arc<Session>> = match notice {
                Ok(warren_store::events::Notice::Appended { session_id, .. }) => {
                    gateway.sessions.by_id(&session_id).into_iter().collect()
                }
                Ok(warren_store::events::Notice::Reconnected)
                | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    gateway.sessions.all()
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            };
            for session in sessions {
                if replicas.holds(&session.id) {
                    continue;
                }
                if let Err(e) = session.follow().await {
                    tracing::debug!(session = %session.id, error = %e, "followed log not read yet");
                }
            }
        }
    });
}

/// Where an owner-bound request of `session` is served; takes the session over when its lease
/// expired.
pub async fn route(gateway: &Arc<Gateway>, session: &Arc<Session>) -> Result<Route, GatewayError> {
    let Some(replicas) = &gateway.replicas else {
        return Ok(Route::Here);
    };
    if replicas.holds(&session.id) {
        return Ok(Route::Here);
    }
    let _one_at_a_time = replicas.takeover.lock().await;
    if replicas.holds(&session.id) {
        return Ok(Route::Here);
    }
    match replicas.acquire(session).await? {
        Acquired::Owned { took_over_from, .. } => {
            tracing::info!(session = %session.id, from = ?took_over_from, "session taken over");
            take_over(session).await?;
            Ok(Route::Here)
        }
        Acquired::HeldBy {
            replica_url,
            expires_in,
            ..
        } => Ok(Route::There {
            url: replica_url,
            expires_in,
        }),
    }
}

/// Makes this replica the session's owner: its meta is the one the old owner stored (so the
/// next brain resumes the agent's ACP session), its log reads everything committed, the turns
/// the old owner left open are closed `interrupted`, and the hands are adopted.
async fn take_over(session: &Arc<Session>) -> Result<(), GatewayError> {
    session.reload_meta().await?;
    session.log.follow().await?;
    session.adopt_history(scan_history(&session.log).await?);
    if session.has_turns_left_open() {
        session.close_open_turns(Some("idle"), TAKEOVER_MESSAGE)?;
        session.log.sync().await?;
    }
    session.hands.adopt().await;
    Ok(())
}

/// The open turns, last turn and usage of everything the log holds.
async fn scan_history(log: &EventLog) -> std::io::Result<OpenTurns> {
    const PAGE: usize = 512;
    let mut open_turns = OpenTurns::default();
    let mut after = 0;
    loop {
        let page = log.read_after(after, PAGE).await?;
        let Some(last) = page.last() else {
            return Ok(open_turns);
        };
        after = last.seq;
        for stored in &page {
            match serde_json::from_str::<warren_protocol::gateway::Event>(&stored.json) {
                Ok(event) => open_turns.visit(event.turn, &event.body),
                Err(e) => {
                    tracing::warn!(seq = stored.seq, error = %e, "a stored event does not parse")
                }
            }
        }
    }
}

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
    if gateway.replicas.is_none() {
        return next.run(request).await;
    }
    let path = request.uri().path().to_owned();
    if path == "/v1/sessions" {
        if let Err(e) = gateway.sessions.load_missing().await {
            return e.into_response();
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
    match route(&gateway, &session).await {
        Ok(Route::Here) => next.run(request).await,
        Ok(Route::There { url, expires_in }) => forward(&gateway, &url, request, expires_in)
            .await
            .unwrap_or_else(IntoResponse::into_response),
        Err(e) => e.into_response(),
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
        .replicas
        .as_ref()
        .is_none_or(|replicas| replicas.holds(id));
    match gateway.sessions.by_id(id).filter(|_| owned) {
        Some(session) => Ok(Some(session)),
        None => gateway.sessions.find(id).await,
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
    fn renewals_come_three_times_a_ttl_and_retry_after_covers_the_lease() {
        assert_eq!(
            renew_period(Duration::from_secs(15)),
            Duration::from_secs(5)
        );
        assert_eq!(
            renew_period(Duration::from_millis(90)),
            Duration::from_millis(100)
        );
        assert_eq!(retry_after(Duration::from_millis(2500)), 3);
        assert_eq!(retry_after(Duration::ZERO), 1);
    }
}
