//! Web Push (phone.md "Push"): the routes of a device's push subscriptions and the gateway's
//! VAPID key, and what of the sessions' events is pushed to whom.
//!
//! Every session's log tells [`start`]'s hook of each event it stores here (the engine's
//! [`crate::sessions::Sessions::on_event_stored`]); the hook keeps only the kinds that may be
//! pushed and hands them to one task through a bounded queue without waiting, so the event log's
//! writer never waits for a push. That task times turns, makes the payload
//! ([`warren_push::payload_for`]), reads the subscriptions of every live device of the session's
//! owner and queues one push each on the [`Pusher`], which sends them. A push service that
//! answers 404 or 410 has dropped the subscription: it is removed from whichever device held it.
//! The subscriptions themselves live in the device records (`auth`, `pairing`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use warren_protocol::error::ErrorBody;
use warren_protocol::gateway::Event;
use warren_push::{
    AllowedEndpoints, Observer, Outcome, Payload, Push as OnePush, Pusher, PusherConfig,
    Subscription, TurnStarts, Vapid,
};

use crate::Gateway;
use crate::auth::SignedIn;
use crate::config::GatewayArgs;
use crate::error::{GatewayError, Json, Path};
use crate::event_log::StoredEvent;
use crate::pairing::StoredPushSubscription;

/// The event kinds a push may come of (`turn_start` to time turns).
const PUSHED_KINDS: [&str; 5] = [
    "permission_request",
    "egress_request",
    "turn_start",
    "turn_end",
    "hands",
];
/// Events waiting for the push task; past this, new ones are dropped (and counted).
const EVENT_QUEUE_MAX: usize = 1024;
/// The most push subscriptions one device keeps (a browser has one; a few browsers share a
/// device only by sharing its token).
pub const SUBSCRIPTIONS_PER_DEVICE_MAX: usize = 16;

/// The gateway's pushes: its VAPID key, where pushes may go, the sender.
pub struct Push {
    pusher: Pusher,
    push_after: Duration,
    /// The gateway, for the sender's outcomes (set by [`start`]).
    gateway: Arc<OnceLock<Weak<Gateway>>>,
    /// Events the push task never saw: its queue was full.
    n_events_dropped: AtomicU64,
}

impl Push {
    /// The VAPID key of `args.data` (made at the first start), `--push-allow-endpoint` and the
    /// sending task. Call inside a tokio runtime.
    pub fn open(args: &GatewayArgs) -> Result<Push, GatewayError> {
        let vapid = Vapid::load_or_create(&args.data)
            .map_err(|e| GatewayError::Internal(format!("push: {e}")))?;
        let allowed = AllowedEndpoints::new(&args.push_allow_endpoint)
            .map_err(GatewayError::InvalidRequest)?;
        let gateway = Arc::new(OnceLock::new());
        let observer = Arc::new(Expiry {
            gateway: gateway.clone(),
        });
        let config = PusherConfig::new(allowed, args.push_contact.clone());
        let pusher = Pusher::start(vapid, config, observer).map_err(GatewayError::Internal)?;
        Ok(Push {
            pusher,
            push_after: args.push_after,
            gateway,
            n_events_dropped: AtomicU64::new(0),
        })
    }
}

impl Push {
    /// Pushes never sent because a queue was full: events the push task never saw, and pushes
    /// the sender's queue refused.
    pub fn n_dropped(&self) -> u64 {
        self.n_events_dropped.load(Ordering::Relaxed) + self.pusher.n_dropped()
    }
}

/// What reaches the push task.
enum Job {
    /// An event a session's log stored.
    Event(String, Arc<StoredEvent>),
    /// A session that is gone (its turn's start is forgotten).
    Gone(String),
}

/// Wires the pushes to `gateway`'s sessions: every event a log stores reaches the push task,
/// and a subscription a push service dropped is removed from its device.
pub fn start(gateway: &Arc<Gateway>) {
    let _ = gateway.push.gateway.set(Arc::downgrade(gateway));
    let (jobs, queued) = mpsc::channel(EVENT_QUEUE_MAX);
    let weak = Arc::downgrade(gateway);
    let events = jobs.clone();
    gateway
        .engine
        .sessions
        .on_event_stored(move |session, event| {
            if !PUSHED_KINDS.contains(&event.kind) {
                return;
            }
            if events
                .try_send(Job::Event(session.to_owned(), event.clone()))
                .is_err()
                && let Some(gateway) = weak.upgrade()
            {
                let n = gateway
                    .push
                    .n_events_dropped
                    .fetch_add(1, Ordering::Relaxed)
                    + 1;
                // Said at the first and then every thousandth: a backlog does not flood the log.
                if n % 1000 == 1 {
                    tracing::warn!(%session, n_dropped = n, "push skipped: the push queue is full");
                }
            }
        });
    gateway.engine.on_session_gone(move |session| {
        let _ = jobs.try_send(Job::Gone(session.to_owned()));
    });
    tokio::spawn(push_events(Arc::downgrade(gateway), queued));
}

/// The push task: turns each stored event into the pushes it makes, in the order they came.
/// Ends when the engine (and so every sender of its queue) is gone.
async fn push_events(gateway: Weak<Gateway>, mut queued: mpsc::Receiver<Job>) {
    let mut turn_starts = TurnStarts::default();
    while let Some(job) = queued.recv().await {
        let (session_id, stored) = match job {
            Job::Event(session_id, stored) => (session_id, stored),
            Job::Gone(session_id) => {
                turn_starts.forget(&session_id);
                continue;
            }
        };
        let Some(gateway) = gateway.upgrade() else {
            return;
        };
        let Ok(event) = serde_json::from_str::<Event>(&stored.json) else {
            continue;
        };
        let turn_ran = turn_starts.follow(&session_id, &event);
        let Some(session) = gateway.engine.sessions.by_id(&session_id) else {
            continue;
        };
        let push_after = gateway.push.push_after;
        let title = session.title();
        let Some(payload) =
            warren_push::payload_for(&session_id, &title, &event, turn_ran, push_after)
        else {
            continue;
        };
        // The session's device id is its owner's: every device of the owner is told.
        let subscriptions = match gateway
            .devices
            .owner_push_subscriptions(&session.device_id)
            .await
        {
            Ok(subscriptions) => subscriptions,
            Err(e) => {
                tracing::warn!(session = %session_id, error = %e, "push skipped: the subscriptions do not read");
                continue;
            }
        };
        enqueue(&gateway.push.pusher, &payload, subscriptions);
    }
}

/// Queues `payload` for each of `subscriptions`.
fn enqueue(pusher: &Pusher, payload: &Payload, subscriptions: Vec<StoredPushSubscription>) {
    for stored in subscriptions {
        let subscription = Subscription {
            endpoint: stored.endpoint,
            p256dh: stored.p256dh,
            auth: stored.auth,
        };
        pusher.enqueue(OnePush {
            subscription,
            payload: payload.clone(),
        });
    }
}

/// The sender's outcomes: a subscription the push service dropped goes from its device.
struct Expiry {
    gateway: Arc<OnceLock<Weak<Gateway>>>,
}

impl Observer for Expiry {
    fn sent(&self, push: &OnePush, outcome: &Outcome, _elapsed: Duration) {
        let Outcome::Gone { .. } = outcome else {
            return;
        };
        let Some(gateway) = self.gateway.get().and_then(Weak::upgrade) else {
            return;
        };
        let endpoint = push.subscription.endpoint.clone();
        tokio::spawn(async move {
            if let Err(e) = gateway.devices.remove_push_endpoint(&endpoint).await {
                tracing::warn!(error = %e, "a push subscription the push service dropped stays");
            }
        });
    }
}

/// Every route of this module, documented.
pub fn routes() -> OpenApiRouter<Arc<Gateway>> {
    OpenApiRouter::new()
        .routes(routes!(push_key))
        .routes(routes!(subscribe, list_subscriptions))
        .routes(routes!(unsubscribe))
}

/// `GET /v1/push/key`.
#[derive(Serialize, utoipa::ToSchema)]
struct PushKey {
    /// The gateway's VAPID public key: the uncompressed P-256 point, base64url (the browser's
    /// `applicationServerKey`).
    public_key: String,
}

/// `POST /v1/push/subscriptions`: what a browser's `PushSubscription.toJSON()` gives.
#[derive(Deserialize, utoipa::ToSchema)]
struct NewPushSubscription {
    /// The push service's URL for this browser.
    #[schema(pattern = "^https?://", max_length = 2048)]
    endpoint: String,
    keys: PushSubscriptionKeys,
    /// The browser's `expirationTime` (milliseconds since the epoch, or null): taken, not kept.
    #[serde(default, rename = "expirationTime")]
    #[allow(dead_code)]
    #[schema(value_type = Option<f64>)]
    expiration_time: Option<serde_json::Value>,
}

#[derive(Deserialize, utoipa::ToSchema)]
struct PushSubscriptionKeys {
    /// The browser's P-256 public key: an uncompressed point (65 bytes), base64url.
    #[schema(pattern = "^[A-Za-z0-9_-]{87}=?$")]
    p256dh: String,
    /// The browser's 16-byte authentication secret, base64url.
    #[schema(pattern = "^[A-Za-z0-9_-]{22}(==)?$")]
    auth: String,
}

/// A device's push subscription as the routes show it (never its keys).
#[derive(Serialize, utoipa::ToSchema)]
struct PushSubscriptionInfo {
    id: String,
    endpoint: String,
    /// RFC 3339.
    created_at: String,
}

impl From<StoredPushSubscription> for PushSubscriptionInfo {
    fn from(stored: StoredPushSubscription) -> Self {
        PushSubscriptionInfo {
            id: stored.id,
            endpoint: stored.endpoint,
            created_at: stored
                .created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        }
    }
}

#[utoipa::path(
    get,
    path = "/v1/push/key",
    tag = "push",
    responses(
        (status = 200, description = "The gateway's VAPID public key (no token needed: it is public)", body = PushKey),
    ),
)]
async fn push_key(State(gateway): State<Arc<Gateway>>) -> axum::Json<PushKey> {
    axum::Json(PushKey {
        public_key: gateway.push.pusher.public_key_b64url().to_owned(),
    })
}

#[utoipa::path(
    post,
    path = "/v1/push/subscriptions",
    tag = "push",
    request_body = NewPushSubscription,
    security(("device_token" = [])),
    responses(
        (status = 201, description = "Subscribed: this device's pushes go to the endpoint too (the same endpoint again: the same id, its keys replaced)", body = PushSubscriptionInfo),
        (status = 400, description = "INVALID_REQUEST_BODY: not a PushSubscription; INVALID_PUSH_SUBSCRIPTION: an endpoint pushes may not go to (not https, not a public host, not under --push-allow-endpoint), or keys that are not a P-256 point and a 16-byte secret", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 408, description = "REQUEST_TIMEOUT: the body did not arrive in time", body = ErrorBody),
        (status = 409, description = "TOO_MANY_PUSH_SUBSCRIPTIONS: the device has 16; delete one first", body = ErrorBody),
        (status = 413, description = "BODY_TOO_LARGE", body = ErrorBody),
        (status = 507, description = "STORAGE_FULL: the gateway's disk is full", body = ErrorBody),
    ),
)]
async fn subscribe(
    State(gateway): State<Arc<Gateway>>,
    me: SignedIn,
    Json(body): Json<NewPushSubscription>,
) -> Result<Response, GatewayError> {
    let checked = Subscription::new(
        &body.endpoint,
        &body.keys.p256dh,
        &body.keys.auth,
        gateway.push.pusher.allowed(),
    )
    .map_err(|e| GatewayError::InvalidPushSubscription(e.to_string()))?;
    gateway.engine.sessions.storage().check()?;
    let existing = gateway.devices.push_subscriptions(&me.device_id).await?;
    let known = existing.iter().any(|s| s.endpoint == checked.endpoint);
    if !known && existing.len() >= SUBSCRIPTIONS_PER_DEVICE_MAX {
        return Err(GatewayError::TooManyPushSubscriptions);
    }
    let stored = gateway
        .devices
        .add_push_subscription(
            &me.device_id,
            &checked.endpoint,
            &checked.p256dh,
            &checked.auth,
        )
        .await?;
    tracing::info!(device_id = %me.device_id, subscription = %stored.id, ?checked, "push subscription added");
    let info = PushSubscriptionInfo::from(stored);
    Ok((StatusCode::CREATED, axum::Json(info)).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/push/subscriptions",
    tag = "push",
    security(("device_token" = [])),
    responses(
        (status = 200, description = "This device's push subscriptions (not its owner's other devices')", body = Vec<PushSubscriptionInfo>),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
    ),
)]
async fn list_subscriptions(
    State(gateway): State<Arc<Gateway>>,
    me: SignedIn,
) -> Result<axum::Json<Vec<PushSubscriptionInfo>>, GatewayError> {
    let stored = gateway.devices.push_subscriptions(&me.device_id).await?;
    Ok(axum::Json(stored.into_iter().map(Into::into).collect()))
}

#[utoipa::path(
    delete,
    path = "/v1/push/subscriptions/{id}",
    tag = "push",
    params(("id" = String, Path, description = "A push subscription of this device")),
    security(("device_token" = [])),
    responses(
        (status = 204, description = "Unsubscribed: no push goes to its endpoint any more"),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 404, description = "PUSH_SUBSCRIPTION_NOT_FOUND: no subscription of this device by that id", body = ErrorBody),
    ),
)]
async fn unsubscribe(
    State(gateway): State<Arc<Gateway>>,
    me: SignedIn,
    Path(id): Path<String>,
) -> Result<StatusCode, GatewayError> {
    if gateway
        .devices
        .remove_push_subscription(&me.device_id, &id)
        .await?
    {
        tracing::info!(device_id = %me.device_id, subscription = %id, "push subscription removed");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(GatewayError::PushSubscriptionNotFound)
    }
}
