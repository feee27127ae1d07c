//! `warren bench push`: Web Push from a gateway served in this process (no agent: the events
//! are appended to a session's log as the engine would) to a push service in this process on
//! 127.0.0.1, as strict as a real one: it takes a push only with a `TTL`, `aes128gcm`, at most
//! 4096 bytes and a VAPID token that verifies against the gateway's key for its own origin,
//! and decrypts each with the subscription's keys before counting it received. Measured: the
//! latency from an event being appended to its push received, decrypted (p50, p95 over
//! [`N_LATENCY`] pushes, one at a time, one subscription); and throughput with
//! [`N_SUBSCRIPTIONS`] subscriptions of one device, [`N_BURST_EVENTS`] events appended at once.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::Value;
use tokio::sync::mpsc;
use warren_gateway::GatewayArgs;
use warren_protocol::gateway::EventBody;
use web_push_native::p256::SecretKey;
use web_push_native::p256::elliptic_curve::sec1::ToEncodedPoint as _;

use super::support::{BenchGateway, Row, json_answer, ms, percentile, print_table};

const N_LATENCY: usize = 200;
const N_SUBSCRIPTIONS: usize = 16;
const N_BURST_EVENTS: usize = 50;
/// The bound on one push's arrival, and on the burst's.
const PUSH_WAIT: Duration = Duration::from_secs(20);
const BURST_WAIT: Duration = Duration::from_secs(120);

pub async fn run() -> anyhow::Result<()> {
    let data = std::env::temp_dir().join(format!("warren-bench-push-{}", std::process::id()));
    let result = bench(&data).await;
    let _ = std::fs::remove_dir_all(&data);
    print_table(&result?);
    Ok(())
}

async fn bench(data: &std::path::Path) -> anyhow::Result<Vec<Row>> {
    let receiver = Receiver::start().await?;
    let mut args = GatewayArgs::with_data(data.to_path_buf());
    args.app_key = Some("bench-app-key".into());
    args.warm_workers = 0;
    args.push_allow_endpoint = vec![format!("{}/push/", receiver.origin)];
    let gw = BenchGateway::start(args).await?;
    let outcome = measure(&gw, &receiver).await;
    gw.stop().await;
    outcome
}

async fn measure(gw: &BenchGateway, receiver: &Receiver) -> anyhow::Result<Vec<Row>> {
    let key = json_answer(gw.http.get(format!("{}/v1/push/key", gw.url))).await?;
    let key = key["public_key"].as_str().context("public_key")?.to_owned();
    receiver.expect_key(&key);
    let mut rows = Vec::new();

    // Latency: one subscription, one event at a time.
    let token = gw.register("bench-push-one").await?;
    subscribe(gw, receiver, &token).await?;
    let session_id = gw.create_session(&token).await?;
    let session = (gw.gateway.engine.sessions.by_id(&session_id)).context("the session")?;
    let mut received = receiver.take();
    let mut latencies = Vec::with_capacity(N_LATENCY);
    for n in 0..N_LATENCY {
        let marker = format!("bench {n}");
        let appended = Instant::now();
        session.log.append(None, lost(&marker))?;
        let at = wait_for(&mut received, &marker).await?;
        latencies.push(at - appended);
    }
    latencies.sort();
    rows.push(Row {
        measurement: format!(
            "push latency, event appended → received and decrypted, p50 ({N_LATENCY} pushes)"
        ),
        result: ms(percentile(&latencies, 0.5)),
        target: "—",
    });
    rows.push(Row {
        measurement: "push latency, p95".into(),
        result: ms(percentile(&latencies, 0.95)),
        target: "—",
    });

    // Throughput: one device with many subscriptions, a burst of events.
    let token = gw.register("bench-push-many").await?;
    for _ in 0..N_SUBSCRIPTIONS {
        subscribe(gw, receiver, &token).await?;
    }
    let session_id = gw.create_session(&token).await?;
    let session = (gw.gateway.engine.sessions.by_id(&session_id)).context("the session")?;
    let started = Instant::now();
    for n in 0..N_BURST_EVENTS {
        session.log.append(None, lost(&format!("burst {n}")))?;
    }
    let n_pushes = N_BURST_EVENTS * N_SUBSCRIPTIONS;
    let mut last = started;
    for _ in 0..n_pushes {
        let push = tokio::time::timeout(BURST_WAIT, received.recv())
            .await
            .with_context(|| format!("{n_pushes} pushes did not arrive within {BURST_WAIT:?}"))?
            .context("the receiver stopped")?;
        last = last.max(push.at);
    }
    let elapsed = last - started;
    rows.push(Row {
        measurement: format!(
            "push throughput, {N_BURST_EVENTS} events × {N_SUBSCRIPTIONS} subscriptions ({n_pushes} pushes)"
        ),
        result: format!(
            "{:.0} pushes/s ({} for all)",
            n_pushes as f64 / elapsed.as_secs_f64(),
            ms(elapsed)
        ),
        target: "—",
    });
    let refused = receiver.n_refused();
    if refused > 0 {
        bail!("the push service refused {refused} pushes");
    }
    Ok(rows)
}

/// A `hands` event entering `lost`, the marker in its error (each one is pushed).
fn lost(marker: &str) -> EventBody {
    EventBody::Hands {
        state: "lost".into(),
        elapsed_ms: None,
        isolation: None,
        reset: None,
        snapshot_at: None,
        snapshot_bytes: None,
        error: Some(marker.to_owned()),
        message: None,
    }
}

async fn subscribe(gw: &BenchGateway, receiver: &Receiver, token: &str) -> anyhow::Result<()> {
    let subscription = receiver.subscribe();
    let request = (gw.http.post(format!("{}/v1/push/subscriptions", gw.url)))
        .bearer_auth(token)
        .json(&subscription);
    json_answer(request).await?;
    Ok(())
}

/// The arrival of the push whose text ends with `marker`.
async fn wait_for(
    received: &mut mpsc::UnboundedReceiver<Taken>,
    marker: &str,
) -> anyhow::Result<Instant> {
    loop {
        let push = tokio::time::timeout(PUSH_WAIT, received.recv())
            .await
            .with_context(|| format!("no push of {marker:?} within {PUSH_WAIT:?}"))?
            .context("the receiver stopped")?;
        if push.payload["text"]
            .as_str()
            .is_some_and(|text| text.ends_with(marker))
        {
            return Ok(push.at);
        }
    }
}

/// A push the receiver took, decrypted.
struct Taken {
    at: Instant,
    payload: Value,
}

struct Subscriber {
    secret: SecretKey,
    auth: web_push_native::Auth,
}

#[derive(Default)]
struct State {
    subscribers: HashMap<String, Subscriber>,
    /// The gateway's VAPID public key, base64url.
    server_key: Option<String>,
    n_refused: u64,
    received: Option<mpsc::UnboundedSender<Taken>>,
}

/// The push service (see the module docs).
struct Receiver {
    origin: String,
    state: Arc<Mutex<State>>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

impl Receiver {
    async fn start() -> anyhow::Result<Receiver> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let origin = format!("http://{}", listener.local_addr()?);
        let state = Arc::new(Mutex::new(State::default()));
        let (serving, shared) = (origin.clone(), state.clone());
        let server = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (origin, state) = (serving.clone(), shared.clone());
                tokio::spawn(async move {
                    let handler = hyper::service::service_fn(move |request| {
                        let (origin, state) = (origin.clone(), state.clone());
                        async move { Ok::<_, Infallible>(answer(&origin, &state, request).await) }
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, handler)
                        .await;
                });
            }
        });
        Ok(Receiver {
            origin,
            state,
            server,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Pushes are taken only when signed by this key (the gateway's).
    fn expect_key(&self, key: &str) {
        self.lock().server_key = Some(key.to_owned());
    }

    /// A new subscription, as a browser's `PushSubscription.toJSON()`.
    fn subscribe(&self) -> Value {
        let secret = loop {
            let mut scalar = [0u8; 32];
            rand::fill(&mut scalar);
            if let Ok(secret) = SecretKey::from_slice(&scalar) {
                break secret;
            }
        };
        let mut auth = web_push_native::Auth::default();
        rand::fill(auth.as_mut_slice());
        let p256dh = b64url(secret.public_key().to_encoded_point(false).as_bytes());
        let auth_b64 = b64url(&auth);
        let mut state = self.lock();
        let endpoint = format!("{}/push/{}", self.origin, state.subscribers.len() + 1);
        state
            .subscribers
            .insert(endpoint.clone(), Subscriber { secret, auth });
        serde_json::json!({"endpoint": endpoint, "keys": {"p256dh": p256dh, "auth": auth_b64}})
    }

    /// The pushes taken from now on, as they come.
    fn take(&self) -> mpsc::UnboundedReceiver<Taken> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.lock().received = Some(tx);
        rx
    }

    fn n_refused(&self) -> u64 {
        self.lock().n_refused
    }
}

async fn answer(
    origin: &str,
    state: &Mutex<State>,
    request: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let status = match take(origin, state, request).await {
        Ok(()) => StatusCode::CREATED,
        Err(status) => {
            state.lock().unwrap_or_else(|p| p.into_inner()).n_refused += 1;
            status
        }
    };
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    response
}

/// Checks and decrypts one push, as a strict push service would.
async fn take(
    origin: &str,
    state: &Mutex<State>,
    request: Request<Incoming>,
) -> Result<(), StatusCode> {
    let lock = || state.lock().unwrap_or_else(|p| p.into_inner());
    let endpoint = format!("{origin}{}", request.uri().path());
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    if header("ttl")
        .and_then(|ttl| ttl.parse::<u64>().ok())
        .is_none()
        || header("content-encoding").as_deref() != Some("aes128gcm")
    {
        return Err(StatusCode::BAD_REQUEST);
    }
    let authorization = header("authorization").ok_or(StatusCode::UNAUTHORIZED)?;
    let token = authorization
        .strip_prefix("vapid t=")
        .and_then(|rest| rest.split_once(", k="))
        .map(|(token, _)| token.to_owned())
        .ok_or(StatusCode::UNAUTHORIZED)?;
    let server_key = lock().server_key.clone().ok_or(StatusCode::UNAUTHORIZED)?;
    let claims = warren_push::verify_token(&server_key, &token).ok_or(StatusCode::UNAUTHORIZED)?;
    if claims["aud"] != origin || !claims["sub"].is_string() || !claims["exp"].is_u64() {
        return Err(StatusCode::UNAUTHORIZED);
    }
    let body = Limited::new(request.into_body(), 4096)
        .collect()
        .await
        .map_err(|_| StatusCode::PAYLOAD_TOO_LARGE)?
        .to_bytes();
    let (secret, auth) = {
        let state = lock();
        let subscriber = state
            .subscribers
            .get(&endpoint)
            .ok_or(StatusCode::NOT_FOUND)?;
        (subscriber.secret.clone(), subscriber.auth)
    };
    let plain = web_push_native::decrypt(body.to_vec(), &secret, &auth)
        .map_err(|_| StatusCode::BAD_REQUEST)?;
    let payload: Value = serde_json::from_slice(&plain).map_err(|_| StatusCode::BAD_REQUEST)?;
    let at = Instant::now();
    if let Some(received) = &lock().received {
        let _ = received.send(Taken { at, payload });
    }
    Ok(())
}
