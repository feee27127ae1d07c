//! Sending pushes: a bounded queue and the one task that empties it, a few sends at a time.
//!
//! [`Pusher::enqueue`] never waits: when the queue is full the push is dropped and counted, so
//! whatever produces pushes (the gateway's event path) is never held up by a slow push service.
//! Each send checks the endpoint against the [`AllowedEndpoints`] again, encrypts the payload for
//! the subscription (`aes128gcm`), signs a VAPID token for the endpoint's origin and posts it
//! with `TTL`, `Urgency` and a bounded timeout, redirects not followed. What came of it goes to
//! the [`Observer`]: delivered, gone (404 or 410: the browser unsubscribed, and the owner of the
//! subscription removes it) or failed. Nothing is retried.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, mpsc};

use crate::payload::Payload;
use crate::subscription::{AllowedEndpoints, Subscription, origin_of};
use crate::vapid::Vapid;

/// How long a VAPID token is good for (RFC 8292 suggests at most 24 hours).
const VAPID_VALID_FOR: Duration = Duration::from_secs(12 * 60 * 60);
/// The most bytes of a push service's answer read (then the connection is dropped).
const ANSWER_MAX_BYTES: usize = 64 * 1024;

/// How a [`Pusher`] sends.
#[derive(Debug, Clone)]
pub struct PusherConfig {
    /// Where pushes may go, checked before every send.
    pub allowed: AllowedEndpoints,
    /// The VAPID `sub`: a `mailto:` or `https:` URL a push service can reach the operator at.
    pub contact: String,
    /// The bound on one send, from connecting to the answer.
    pub timeout: Duration,
    /// Pushes waiting to be sent; past this, new ones are dropped.
    pub queue_max: usize,
    /// Sends at once.
    pub in_flight_max: usize,
}

impl PusherConfig {
    /// The defaults: a queue of 1024, 8 sends at once, 10 s each.
    pub fn new(allowed: AllowedEndpoints, contact: String) -> PusherConfig {
        PusherConfig {
            allowed,
            contact,
            timeout: Duration::from_secs(10),
            queue_max: 1024,
            in_flight_max: 8,
        }
    }
}

/// One push: a payload for one subscription.
#[derive(Debug, Clone)]
pub struct Push {
    pub subscription: Subscription,
    pub payload: Payload,
}

/// What came of one send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The push service took the push (a 2xx answer, usually 201).
    Delivered { status: u16 },
    /// 404 or 410: the subscription is no more; whoever keeps it removes it.
    Gone { status: u16 },
    /// Another answer (`status`), or none: not sent (an endpoint no longer allowed, keys that
    /// do not encrypt), a refused connection, a timeout.
    Failed { status: Option<u16>, reason: String },
}

/// Told what came of every send, on the sending task: it must not block.
pub trait Observer: Send + Sync + 'static {
    fn sent(&self, push: &Push, outcome: &Outcome, elapsed: Duration);
}

/// The gateway's pushes: the queue and the task that sends (it ends once the `Pusher` is gone
/// and the queue is empty).
pub struct Pusher {
    queue: mpsc::Sender<Push>,
    vapid: Arc<Vapid>,
    allowed: AllowedEndpoints,
    n_dropped: AtomicU64,
}

impl std::fmt::Debug for Pusher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pusher")
            .field("vapid", &self.vapid)
            .field("n_dropped", &self.n_dropped)
            .finish_non_exhaustive()
    }
}

impl Pusher {
    /// Starts the sending task (call inside a tokio runtime). Fails only when the HTTP client
    /// cannot be built.
    pub fn start(
        vapid: Vapid,
        config: PusherConfig,
        observer: Arc<dyn Observer>,
    ) -> Result<Pusher, String> {
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("cannot build the push client: {e}"))?;
        let vapid = Arc::new(vapid);
        let (queue, queued) = mpsc::channel(config.queue_max.max(1));
        let in_flight = Arc::new(Semaphore::new(config.in_flight_max.max(1)));
        let allowed = config.allowed.clone();
        let sender = Arc::new(Sender {
            client,
            vapid: vapid.clone(),
            config,
            observer,
        });
        tokio::spawn(send_queued(queued, sender, in_flight));
        Ok(Pusher {
            queue,
            vapid,
            allowed,
            n_dropped: AtomicU64::new(0),
        })
    }

    /// Queues `push`; false (and counted) when the queue is full. Never waits.
    pub fn enqueue(&self, push: Push) -> bool {
        match self.queue.try_send(push) {
            Ok(()) => true,
            Err(error) => {
                let n_dropped = self.n_dropped.fetch_add(1, Ordering::Relaxed) + 1;
                let push = match &error {
                    mpsc::error::TrySendError::Full(push)
                    | mpsc::error::TrySendError::Closed(push) => push,
                };
                // Said at the first and then every thousandth: a backlog does not flood the log.
                if n_dropped % 1000 != 1 {
                    return false;
                }
                tracing::warn!(
                    endpoint = %origin_of(&push.subscription.endpoint),
                    kind = %push.payload.kind,
                    n_dropped,
                    "push dropped: the queue is full"
                );
                false
            }
        }
    }

    /// The VAPID public key (the browser's `applicationServerKey`).
    pub fn public_key_b64url(&self) -> &str {
        self.vapid.public_key_b64url()
    }

    /// Where pushes may go.
    pub fn allowed(&self) -> &AllowedEndpoints {
        &self.allowed
    }

    /// Pushes dropped because the queue was full.
    pub fn n_dropped(&self) -> u64 {
        self.n_dropped.load(Ordering::Relaxed)
    }
}

/// The sending task: one send per push, at most `in_flight` at once.
async fn send_queued(
    mut queued: mpsc::Receiver<Push>,
    sender: Arc<Sender>,
    in_flight: Arc<Semaphore>,
) {
    while let Some(push) = queued.recv().await {
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let sender = sender.clone();
        tokio::spawn(async move {
            sender.send(push).await;
            drop(permit);
        });
    }
}

struct Sender {
    client: reqwest::Client,
    vapid: Arc<Vapid>,
    config: PusherConfig,
    observer: Arc<dyn Observer>,
}

impl Sender {
    async fn send(&self, push: Push) {
        let started = Instant::now();
        let outcome = match self.request(&push) {
            Ok(request) => self.post(request).await,
            Err(reason) => Outcome::Failed {
                status: None,
                reason,
            },
        };
        let endpoint = origin_of(&push.subscription.endpoint);
        match &outcome {
            Outcome::Delivered { status } => {
                tracing::debug!(%endpoint, status, kind = %push.payload.kind, "push delivered")
            }
            Outcome::Gone { status } => {
                tracing::info!(%endpoint, status, "push subscription gone")
            }
            Outcome::Failed { status, reason } => {
                tracing::warn!(%endpoint, ?status, %reason, "push not delivered")
            }
        }
        self.observer.sent(&push, &outcome, started.elapsed());
    }

    /// The push as a request: the endpoint checked, the body encrypted, the headers set.
    fn request(&self, push: &Push) -> Result<reqwest::Request, String> {
        let subscription = &push.subscription;
        let endpoint = self
            .config
            .allowed
            .check(&subscription.endpoint)
            .map_err(|why| format!("endpoint not allowed: {why}"))?;
        let (public, auth) = subscription.keys().map_err(|e| e.to_string())?;
        let body = web_push_native::encrypt(push.payload.to_json(), &public, &auth)
            .map_err(|e| format!("cannot encrypt: {e}"))?;
        let authorization = self
            .vapid
            .authorization(&endpoint, &self.config.contact, VAPID_VALID_FOR)
            .map_err(|e| e.to_string())?;
        self.client
            .post(subscription.endpoint.as_str())
            .header("TTL", push.payload.ttl_seconds())
            .header("Urgency", push.payload.urgency())
            .header(reqwest::header::CONTENT_ENCODING, "aes128gcm")
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .header(reqwest::header::AUTHORIZATION, authorization)
            .body(body)
            .build()
            .map_err(|e| format!("cannot build the request: {e}"))
    }

    async fn post(&self, request: reqwest::Request) -> Outcome {
        let mut response = match self.client.execute(request).await {
            Ok(response) => response,
            Err(e) => {
                let reason = if e.is_timeout() {
                    format!("no answer within {:?}", self.config.timeout)
                } else {
                    format!("cannot reach the push service: {e}")
                };
                return Outcome::Failed {
                    status: None,
                    reason,
                };
            }
        };
        let status = response.status().as_u16();
        // Read (a little of) the answer so the connection can be kept for the next push.
        let mut n_read = 0;
        while n_read < ANSWER_MAX_BYTES {
            match response.chunk().await {
                Ok(Some(chunk)) => n_read += chunk.len(),
                Ok(None) | Err(_) => break,
            }
        }
        match status {
            200..=299 => Outcome::Delivered { status },
            404 | 410 => Outcome::Gone { status },
            _ => Outcome::Failed {
                status: Some(status),
                reason: format!("the push service answered {status}"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use warren_test_support::push_service::PushService;

    use super::*;

    /// Every outcome, in the order the sends ended.
    #[derive(Default)]
    struct Outcomes {
        seen: Mutex<Vec<(String, Outcome)>>,
        changed: tokio::sync::Notify,
    }

    impl Observer for Outcomes {
        fn sent(&self, push: &Push, outcome: &Outcome, _elapsed: Duration) {
            let seen = (push.subscription.endpoint.clone(), outcome.clone());
            self.seen.lock().expect("not poisoned").push(seen);
            self.changed.notify_waiters();
        }
    }

    impl Outcomes {
        /// The first `n` outcomes, waiting (boundedly) for them.
        async fn first(&self, n: usize) -> Vec<(String, Outcome)> {
            let waited = tokio::time::timeout(warren_test_support::WAIT, async {
                loop {
                    let notified = self.changed.notified();
                    let seen = self.seen.lock().expect("not poisoned").clone();
                    if seen.len() >= n {
                        return seen[..n].to_vec();
                    }
                    notified.await;
                }
            });
            waited.await.expect("the sends end")
        }
    }

    fn payload(kind: &str) -> Payload {
        Payload {
            session: "s-1".into(),
            title: "fix the build".into(),
            kind: kind.into(),
            text: "The agent asks to run: rm x".into(),
            url: "/#/s/s-1/r/perm-1".into(),
            actions: vec![crate::Action {
                id: "allow".into(),
                title: "Allow".into(),
            }],
            request: Some("perm-1".into()),
        }
    }

    /// A pusher allowed to reach `service` (or `allowed`), and what it observes.
    fn pusher(
        service: &PushService,
        allowed: Option<&str>,
        change: impl FnOnce(&mut PusherConfig),
    ) -> (Pusher, Arc<Outcomes>) {
        let prefix = allowed.map_or_else(|| service.endpoint_prefix(), str::to_owned);
        let allowed = AllowedEndpoints::new(&[prefix]).expect("a prefix");
        let mut config = PusherConfig::new(allowed, "mailto:ops@example.com".into());
        change(&mut config);
        let outcomes = Arc::new(Outcomes::default());
        let pusher = Pusher::start(Vapid::generate(), config, outcomes.clone()).expect("starts");
        (pusher, outcomes)
    }

    fn subscription(service: &PushService, pusher: &Pusher) -> Subscription {
        let made = service.subscribe(pusher.public_key_b64url());
        let text = |value: &serde_json::Value| value.as_str().expect("a string").to_owned();
        Subscription {
            endpoint: text(&made["endpoint"]),
            p256dh: text(&made["keys"]["p256dh"]),
            auth: text(&made["keys"]["auth"]),
        }
    }

    #[tokio::test]
    async fn a_push_arrives_decrypted_with_its_headers_and_a_vapid_token_for_the_service() {
        let service = PushService::start().await;
        let (pusher, outcomes) = pusher(&service, None, |_| {});
        let subscription = subscription(&service, &pusher);
        let (request, done) = (payload("permission_request"), payload("turn_end"));
        for payload in [&request, &done] {
            let push = Push {
                subscription: subscription.clone(),
                payload: payload.clone(),
            };
            assert!(pusher.enqueue(push));
        }
        let seen = outcomes.first(2).await;
        assert!(
            seen.iter()
                .all(|(_, outcome)| *outcome == Outcome::Delivered { status: 201 }),
            "{seen:?}"
        );
        let received = service.received();
        let by_kind = |kind: &str| {
            received
                .iter()
                .find(|push| push.payload["kind"] == kind)
                .unwrap_or_else(|| panic!("a {kind} push among {received:?}"))
        };
        let urgent = by_kind("permission_request");
        assert_eq!(
            urgent.payload,
            serde_json::to_value(&request).expect("json")
        );
        assert_eq!(urgent.header("ttl"), Some("60"));
        assert_eq!(urgent.header("urgency"), Some("high"));
        assert_eq!(urgent.header("content-encoding"), Some("aes128gcm"));
        assert_eq!(urgent.vapid_key, pusher.public_key_b64url());
        assert_eq!(urgent.claims["aud"], service.origin());
        assert_eq!(urgent.claims["sub"], "mailto:ops@example.com");
        let normal = by_kind("turn_end");
        assert_eq!(normal.header("ttl"), Some("3600"));
        assert_eq!(normal.header("urgency"), Some("normal"));
        assert!(service.refusals().is_empty(), "{:?}", service.refusals());
    }

    #[tokio::test]
    async fn a_subscription_the_service_no_longer_knows_is_gone() {
        let service = PushService::start().await;
        let (pusher, outcomes) = pusher(&service, None, |_| {});
        let unsubscribed = subscription(&service, &pusher);
        service.answer_gone(&unsubscribed.endpoint);
        let mut unknown = subscription(&service, &pusher);
        unknown.endpoint = format!("{}never-made", service.endpoint_prefix());
        for subscription in [unsubscribed.clone(), unknown.clone()] {
            let payload = payload("hands_lost");
            assert!(pusher.enqueue(Push {
                subscription,
                payload
            }));
        }
        let mut seen = outcomes.first(2).await;
        seen.sort_by(|a, b| a.0.cmp(&b.0));
        let mut expected = vec![
            (unsubscribed.endpoint, Outcome::Gone { status: 410 }),
            (unknown.endpoint, Outcome::Gone { status: 404 }),
        ];
        expected.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(seen, expected);
        assert!(service.received().is_empty());
    }

    #[tokio::test]
    async fn an_endpoint_not_allowed_is_never_posted_to() {
        let service = PushService::start().await;
        let elsewhere = "http://127.0.0.1:9/push/";
        let (pusher, outcomes) = pusher(&service, Some(elsewhere), |_| {});
        let subscription = subscription(&service, &pusher);
        let payload = payload("hands_lost");
        assert!(pusher.enqueue(Push {
            subscription,
            payload
        }));
        let seen = outcomes.first(1).await;
        assert!(
            matches!(&seen[0].1, Outcome::Failed { status: None, reason } if reason.starts_with("endpoint not allowed")),
            "{seen:?}"
        );
        assert!(service.received().is_empty() && service.refusals().is_empty());
    }

    #[tokio::test]
    async fn a_service_that_does_not_answer_in_time_fails_the_send() {
        let service = PushService::start().await;
        service.set_delay(Duration::from_secs(30));
        let (pusher, outcomes) = pusher(&service, None, |config| {
            config.timeout = Duration::from_millis(300);
        });
        let subscription = subscription(&service, &pusher);
        let payload = payload("hands_lost");
        assert!(pusher.enqueue(Push {
            subscription,
            payload
        }));
        let seen = outcomes.first(1).await;
        assert!(
            matches!(&seen[0].1, Outcome::Failed { status: None, reason } if reason.contains("no answer")),
            "{seen:?}"
        );
    }

    #[tokio::test]
    async fn a_full_queue_drops_pushes_and_never_waits() {
        let service = PushService::start().await;
        service.set_delay(Duration::from_secs(30));
        let (pusher, _outcomes) = pusher(&service, None, |config| {
            config.queue_max = 4;
            config.in_flight_max = 1;
        });
        let subscription = subscription(&service, &pusher);
        let started = Instant::now();
        let n_queued = (0..100)
            .filter(|_| {
                pusher.enqueue(Push {
                    subscription: subscription.clone(),
                    payload: payload("hands_lost"),
                })
            })
            .count();
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "enqueueing never waits for the service: {:?}",
            started.elapsed()
        );
        // The queue's four, and perhaps one the sender took out before it blocked.
        assert!((4..=6).contains(&n_queued), "{n_queued} queued");
        assert_eq!(pusher.n_dropped(), 100 - n_queued as u64);
    }

    /// One request to the test push service.
    #[derive(Clone)]
    struct Attempt {
        ttl: Option<&'static str>,
        encoding: &'static str,
        authorization: Option<String>,
        body: Vec<u8>,
    }

    /// The local push service is as strict as a real one: each request a real service refuses,
    /// it refuses, with the same kind of status; the same push done right is taken.
    #[tokio::test]
    async fn the_test_push_service_refuses_what_real_ones_refuse() {
        let service = PushService::start().await;
        let vapid = Vapid::generate();
        let other_key = Vapid::generate();
        let made = service.subscribe(vapid.public_key_b64url());
        let endpoint_url = made["endpoint"].as_str().expect("endpoint").to_owned();
        let subscription = Subscription {
            endpoint: endpoint_url.clone(),
            p256dh: made["keys"]["p256dh"].as_str().expect("p256dh").to_owned(),
            auth: made["keys"]["auth"].as_str().expect("auth").to_owned(),
        };
        let allowed =
            AllowedEndpoints::new(&[service.endpoint_prefix(), "http://127.0.0.1/".to_owned()])
                .expect("prefixes");
        let endpoint = allowed.check(&endpoint_url).expect("allowed");
        // The origin without its port: what a signer that drops the port puts in `aud`.
        let portless = endpoint_url.replacen(service.origin(), "http://127.0.0.1", 1);
        let portless = allowed.check(&portless).expect("allowed");
        let (public, auth) = subscription.keys().expect("keys");
        let body =
            web_push_native::encrypt(b"{\"ok\":true}".to_vec(), &public, &auth).expect("encrypts");
        let day = Duration::from_secs(24 * 3600);
        let sign = |vapid: &Vapid, endpoint: &crate::Endpoint, valid_for| {
            vapid
                .authorization(endpoint, "mailto:ops@example.com", valid_for)
                .expect("signs")
        };
        let right = Attempt {
            ttl: Some("60"),
            encoding: "aes128gcm",
            authorization: Some(sign(&vapid, &endpoint, Duration::from_secs(3600))),
            body: body.clone(),
        };
        let cases = [
            (
                "no TTL",
                Attempt {
                    ttl: None,
                    ..right.clone()
                },
                400,
            ),
            (
                "aesgcm",
                Attempt {
                    encoding: "aesgcm",
                    ..right.clone()
                },
                400,
            ),
            (
                "no VAPID",
                Attempt {
                    authorization: None,
                    ..right.clone()
                },
                401,
            ),
            (
                "another key",
                Attempt {
                    authorization: Some(sign(&other_key, &endpoint, Duration::from_secs(60))),
                    ..right.clone()
                },
                401,
            ),
            (
                "aud without the port",
                Attempt {
                    authorization: Some(sign(&vapid, &portless, Duration::from_secs(60))),
                    ..right.clone()
                },
                401,
            ),
            (
                "exp over a day ahead",
                Attempt {
                    authorization: Some(sign(&vapid, &endpoint, day + Duration::from_secs(3600))),
                    ..right.clone()
                },
                401,
            ),
            (
                "a body over 4096 bytes",
                Attempt {
                    body: vec![0; 4097],
                    ..right.clone()
                },
                413,
            ),
            (
                "not encrypted for it",
                Attempt {
                    body: vec![0; 200],
                    ..right.clone()
                },
                400,
            ),
            ("done right", right, 201),
        ];
        let client = reqwest::Client::new();
        for (what, attempt, status) in cases {
            let mut request = client
                .post(&endpoint_url)
                .header("Content-Encoding", attempt.encoding)
                .body(attempt.body);
            if let Some(ttl) = attempt.ttl {
                request = request.header("TTL", ttl);
            }
            if let Some(authorization) = attempt.authorization {
                request = request.header("Authorization", authorization);
            }
            let answer = request.send().await.expect("answered");
            assert_eq!(answer.status().as_u16(), status, "{what}");
        }
        assert_eq!(
            service.received().len(),
            1,
            "only the push done right is taken"
        );
        assert_eq!(
            service.received()[0].payload,
            serde_json::json!({"ok": true})
        );
    }
}
