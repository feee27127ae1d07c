//! A local push service (RFC 8030) on 127.0.0.1, as strict as the real ones (Mozilla's
//! autopush, Google's FCM): it hands out subscriptions as a browser's `PushSubscription`
//! (`{endpoint, keys: {p256dh, auth}}`, the keys its own, made for each) and takes a push to an
//! endpoint only with a `TTL`, `Content-Encoding: aes128gcm`, a body of at most 4096 bytes and a
//! VAPID `Authorization` (`vapid t=…, k=…`) whose ES256 JWT verifies against `k`, with `aud`
//! its own origin, an `exp` in the future and at most 24 hours ahead, and a `sub`; `k` must be
//! the `applicationServerKey` the subscription was made with. Anything else is refused (400,
//! 401, 404, 413) and recorded as a refusal. A push it takes is decrypted with the
//! subscription's private key and auth secret (RFC 8291) and recorded with when it came and its
//! headers; the answer is 201 with a `Location`. It can be told to answer 410 for an endpoint (a
//! browser that unsubscribed) or to wait before answering (a slow service).

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use p256::SecretKey;
use p256::ecdsa::signature::Verifier as _;
use p256::ecdsa::{Signature, VerifyingKey};
use p256::elliptic_curve::sec1::ToEncodedPoint as _;
use serde_json::Value;

/// The largest body a push service takes (RFC 8291 section 4: 4096 octets).
pub const BODY_MAX_BYTES: usize = 4096;
/// How far ahead a VAPID token may expire (RFC 8292 section 2).
const EXP_MAX_AHEAD: Duration = Duration::from_secs(24 * 60 * 60);

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn b64url_decode(text: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(text.trim_end_matches('='))
        .ok()
}

/// One push the service took, decrypted.
#[derive(Debug, Clone)]
pub struct Received {
    /// When its body was read, before any delay.
    pub received_at: Instant,
    /// The endpoint it was posted to.
    pub endpoint: String,
    /// Its headers, names lowercase.
    pub headers: HashMap<String, String>,
    /// The decrypted body, as JSON.
    pub payload: Value,
    /// The VAPID token's claims (`aud`, `sub`, `exp`, ...).
    pub claims: Value,
    /// The VAPID public key (`k`).
    pub vapid_key: String,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }
}

/// A push it refused: the status it answered and why.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub endpoint: String,
    pub status: u16,
    pub why: String,
}

struct Subscriber {
    secret: SecretKey,
    auth: [u8; 16],
    /// The `applicationServerKey` it was made with.
    server_key: String,
}

#[derive(Default)]
struct State {
    subscribers: HashMap<String, Subscriber>,
    gone: HashSet<String>,
    delay: Duration,
    received: Vec<Received>,
    refusals: Vec<Refusal>,
    n_subscriptions: u64,
}

/// The push service; stops when dropped.
pub struct PushService {
    origin: String,
    state: Arc<Mutex<State>>,
    changed: Arc<tokio::sync::Notify>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for PushService {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl PushService {
    /// Listens on 127.0.0.1 (a port of its own). Call inside a tokio runtime.
    pub async fn start() -> PushService {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("the push service binds");
        let origin = format!("http://{}", listener.local_addr().expect("local addr"));
        let state = Arc::new(Mutex::new(State::default()));
        let changed = Arc::new(tokio::sync::Notify::new());
        let service = Arc::new(Service {
            origin: origin.clone(),
            state: state.clone(),
            changed: changed.clone(),
        });
        let server = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let service = service.clone();
                tokio::spawn(async move {
                    let handler = hyper::service::service_fn(move |request| {
                        let service = service.clone();
                        async move { Ok::<_, Infallible>(service.answer(request).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), handler)
                        .await;
                });
            }
        });
        PushService {
            origin,
            state,
            changed,
            server,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `http://127.0.0.1:<port>`.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The prefix of every endpoint it hands out (what `--push-allow-endpoint` names).
    pub fn endpoint_prefix(&self) -> String {
        format!("{}/push/", self.origin)
    }

    /// A new subscription for a server whose VAPID public key is `server_key`, as a browser's
    /// `PushSubscription.toJSON()`: `{endpoint, expirationTime, keys: {p256dh, auth}}`.
    pub fn subscribe(&self, server_key: &str) -> Value {
        let secret = loop {
            let mut scalar = [0u8; 32];
            rand::fill(&mut scalar);
            // Out of range (zero, or past the order) about once in 2^32 tries.
            if let Ok(secret) = SecretKey::from_slice(&scalar) {
                break secret;
            }
        };
        let mut auth = [0u8; 16];
        rand::fill(&mut auth);
        let p256dh = b64url(secret.public_key().to_encoded_point(false).as_bytes());
        let mut state = self.lock();
        state.n_subscriptions += 1;
        let endpoint = format!(
            "{}{}-{}",
            self.endpoint_prefix(),
            state.n_subscriptions,
            &b64url(&auth)[..8]
        );
        state.subscribers.insert(
            endpoint.clone(),
            Subscriber {
                secret,
                auth,
                server_key: server_key.to_owned(),
            },
        );
        serde_json::json!({
            "endpoint": endpoint,
            "expirationTime": null,
            "keys": {"p256dh": p256dh, "auth": b64url(&auth)},
        })
    }

    /// From now on, pushes to `endpoint` are answered 410 Gone (the browser unsubscribed).
    pub fn answer_gone(&self, endpoint: &str) {
        self.lock().gone.insert(endpoint.to_owned());
    }

    /// From now on, every answer waits `delay` after the push was read (it is recorded first).
    pub fn set_delay(&self, delay: Duration) {
        self.lock().delay = delay;
    }

    /// Every push taken so far, in the order they came.
    pub fn received(&self) -> Vec<Received> {
        self.lock().received.clone()
    }

    /// Every push refused so far.
    pub fn refusals(&self) -> Vec<Refusal> {
        self.lock().refusals.clone()
    }

    /// Waits (at most `timeout`) until a push satisfying `found` was taken, and returns it;
    /// panics naming `what`, with the refusals seen, when none came.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        mut found: impl FnMut(&Received) -> bool,
    ) -> Received {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            if let Some(push) = self.lock().received.iter().find(|push| found(push)) {
                return push.clone();
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!(
                    "no push {what} within {timeout:?}; received {:#?}; refused {:#?}",
                    self.received(),
                    self.refusals()
                );
            }
        }
    }
}

struct Service {
    origin: String,
    state: Arc<Mutex<State>>,
    changed: Arc<tokio::sync::Notify>,
}

impl Service {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn answer(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let endpoint = format!("{}{}", self.origin, request.uri().path());
        match self.take(request, &endpoint).await {
            Ok((location, delay)) => {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                Response::builder()
                    .status(StatusCode::CREATED)
                    .header("Location", location)
                    .body(Full::new(Bytes::new()))
                    .expect("a response")
            }
            Err((status, why)) => {
                self.lock().refusals.push(Refusal {
                    endpoint,
                    status: status.as_u16(),
                    why: why.clone(),
                });
                self.changed.notify_waiters();
                Response::builder()
                    .status(status)
                    .header("Content-Type", "application/json")
                    .body(Full::new(Bytes::from(
                        serde_json::json!({"code": status.as_u16(), "message": why}).to_string(),
                    )))
                    .expect("a response")
            }
        }
    }

    /// Checks and decrypts one push; its `Location` and the delay before answering, or the
    /// status and reason of a refusal.
    async fn take(
        &self,
        request: Request<Incoming>,
        endpoint: &str,
    ) -> Result<(String, Duration), (StatusCode, String)> {
        let refuse = |status: StatusCode, why: &str| (status, why.to_owned());
        if request.method() != hyper::Method::POST {
            return Err(refuse(StatusCode::METHOD_NOT_ALLOWED, "only POST"));
        }
        let (secret, auth, server_key) = {
            let state = self.lock();
            let Some(subscriber) = state.subscribers.get(endpoint) else {
                return Err(refuse(StatusCode::NOT_FOUND, "no such subscription"));
            };
            if state.gone.contains(endpoint) {
                return Err(refuse(StatusCode::GONE, "the subscription is gone"));
            }
            (
                subscriber.secret.clone(),
                subscriber.auth,
                subscriber.server_key.clone(),
            )
        };
        let headers: HashMap<String, String> = request
            .headers()
            .iter()
            .map(|(name, value)| {
                let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
                (name.as_str().to_owned(), value)
            })
            .collect();
        match headers.get("ttl").map(|ttl| ttl.parse::<u64>()) {
            Some(Ok(_)) => {}
            _ => return Err(refuse(StatusCode::BAD_REQUEST, "missing or bad TTL header")),
        }
        if headers.get("content-encoding").map(String::as_str) != Some("aes128gcm") {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "Content-Encoding must be aes128gcm",
            ));
        }
        if let Some(urgency) = headers.get("urgency")
            && !["very-low", "low", "normal", "high"].contains(&urgency.as_str())
        {
            return Err(refuse(StatusCode::BAD_REQUEST, "bad Urgency header"));
        }
        let (claims, vapid_key) = self
            .check_vapid(
                headers.get("authorization").map(String::as_str),
                &server_key,
            )
            .map_err(|why| (StatusCode::UNAUTHORIZED, why))?;
        let body = Limited::new(request.into_body(), BODY_MAX_BYTES)
            .collect()
            .await
            .map_err(|_| refuse(StatusCode::PAYLOAD_TOO_LARGE, "body over 4096 bytes"))?
            .to_bytes();
        let received_at = Instant::now();
        let auth = web_push_native::Auth::clone_from_slice(&auth);
        let plain = web_push_native::decrypt(body.to_vec(), &secret, &auth)
            .map_err(|e| (StatusCode::BAD_REQUEST, format!("does not decrypt: {e}")))?;
        let payload: Value = serde_json::from_slice(&plain).map_err(|e| {
            (
                StatusCode::BAD_REQUEST,
                format!("not JSON once decrypted: {e}"),
            )
        })?;
        let mut state = self.lock();
        let location = format!("{}/m/{}", self.origin, state.received.len() + 1);
        state.received.push(Received {
            received_at,
            endpoint: endpoint.to_owned(),
            headers,
            payload,
            claims,
            vapid_key,
        });
        let delay = state.delay;
        drop(state);
        self.changed.notify_waiters();
        Ok((location, delay))
    }

    /// `vapid t=<JWT>, k=<key>`: the JWT's claims and `k`, or why it is refused.
    fn check_vapid(
        &self,
        header: Option<&str>,
        server_key: &str,
    ) -> Result<(Value, String), String> {
        let header = header.ok_or("no Authorization header")?;
        let rest = header
            .strip_prefix("vapid ")
            .ok_or("Authorization is not `vapid t=…, k=…`")?;
        let (mut token, mut key) = (None, None);
        for part in rest.split(',') {
            match part.trim().split_once('=') {
                Some(("t", value)) => token = Some(value.trim()),
                Some(("k", value)) => key = Some(value.trim()),
                _ => return Err(format!("unknown part {part:?} in Authorization")),
            }
        }
        let (token, key) = token.zip(key).ok_or("Authorization lacks t or k")?;
        if key != server_key {
            return Err("k is not the applicationServerKey of the subscription".into());
        }
        let public = b64url_decode(key)
            .and_then(|bytes| VerifyingKey::from_sec1_bytes(&bytes).ok())
            .ok_or("k is not a P-256 public key")?;
        let claims = verify_es256(&public, token)?;
        let aud = claims["aud"].as_str().ok_or("the VAPID JWT has no aud")?;
        if aud != self.origin {
            return Err(format!(
                "aud {aud:?} is not this push service's origin {:?}",
                self.origin
            ));
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_secs();
        let exp = claims["exp"].as_u64().ok_or("the VAPID JWT has no exp")?;
        if exp <= now || exp > now + EXP_MAX_AHEAD.as_secs() {
            return Err(format!("exp {exp} is not within 24 h of now ({now})"));
        }
        let sub = claims["sub"]
            .as_str()
            .ok_or("the VAPID JWT has no sub")?
            .to_owned();
        if !(sub.starts_with("mailto:") || sub.starts_with("https://")) {
            return Err(format!("sub {sub:?} is not a mailto: or https: URL"));
        }
        let claims = serde_json::json!({
            "aud": self.origin,
            "sub": sub,
            "exp": exp,
        });
        Ok((claims, key.to_owned()))
    }
}

/// The claims of a JWT whose header says ES256 and whose signature (`r‖s`, RFC 7518 §3.4) over
/// `header.claims` verifies with `public`, or why not.
fn verify_es256(public: &VerifyingKey, token: &str) -> Result<Value, String> {
    let parts: Vec<&str> = token.split('.').collect();
    let [header, claims, signature] = parts[..] else {
        return Err("the VAPID JWT is not three parts".into());
    };
    let json = |part: &str, what: &str| -> Result<Value, String> {
        b64url_decode(part)
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .ok_or(format!("the VAPID JWT's {what} is not base64url JSON"))
    };
    let alg = json(header, "header")?;
    if alg["alg"] != "ES256" {
        return Err(format!("the VAPID JWT's alg is {}, not ES256", alg["alg"]));
    }
    let signature = b64url_decode(signature)
        .and_then(|bytes| Signature::from_slice(&bytes).ok())
        .ok_or("the VAPID JWT's signature is not 64 bytes of r‖s")?;
    public
        .verify(format!("{header}.{claims}").as_bytes(), &signature)
        .map_err(|_| "the VAPID JWT's signature does not verify with k".to_owned())?;
    json(claims, "claims")
}
