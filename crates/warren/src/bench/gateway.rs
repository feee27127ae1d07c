//! `warren bench gateway`: starts a gateway in-process on 127.0.0.1:0 with a temporary data
//! directory and the built-in shell agent (this executable), then measures, through the real
//! HTTP API: the warm-brain handout for a new session, the first-event latency after a message,
//! SSE fan-out to 100 subscribers of one session, and the event log's append rate. Prints one
//! markdown table.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::StreamExt;
use serde_json::Value;
use warren_gateway::event_log::EventLog;
use warren_gateway::{Gateway, GatewayArgs};
use warren_protocol::gateway::EventBody;
use warren_store::health::StorageHealth;

const N_HANDOUTS: usize = 20;
const N_TURNS: usize = 10;
const N_SUBSCRIBERS: usize = 100;
const N_FANOUT_EVENTS: u64 = 2_000;
const N_APPENDS: u64 = 100_000;
const N_SYNCED_APPENDS: u64 = 2_000;

pub(super) struct Row {
    pub(super) what: String,
    pub(super) value: String,
    pub(super) note: String,
}

#[derive(Debug, clap::Args)]
pub struct GatewayBenchArgs {
    /// Also measure the event log kept in this store (`postgres://…`), next to the file log:
    /// append rate, fan-out over two replicas, cross-replica delivery. `file:` (the default)
    /// measures the file log only.
    #[arg(long, default_value = "file:")]
    pub store: String,
}

pub async fn run(args: GatewayBenchArgs) -> anyhow::Result<()> {
    let postgres = match args.store.as_str() {
        "file:" => None,
        url if url.starts_with("postgres://") || url.starts_with("postgresql://") => Some(url),
        other => anyhow::bail!("--store takes file: or postgres://…, not {other:?}"),
    };
    let data = std::env::temp_dir().join(format!("warren-bench-gateway-{}", std::process::id()));
    let result = bench(&data).await;
    let _ = std::fs::remove_dir_all(&data);
    let mut rows = result?;
    if let Some(url) = postgres {
        rows.extend(super::event_store::rows(url).await?);
    }
    println!("| measurement | result | notes |");
    println!("|---|---|---|");
    for row in rows {
        println!("| {} | {} | {} |", row.what, row.value, row.note);
    }
    Ok(())
}

async fn bench(data: &std::path::Path) -> anyhow::Result<Vec<Row>> {
    let mut args = GatewayArgs::with_data(data.join("gateway"));
    args.app_key = Some("bench-app-key".into());
    args.warm_workers = 2;
    let gateway = Gateway::open(args).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(warren_gateway::serve(gateway.clone(), listener, async {
        let _ = stop_rx.await;
    }));
    let client = Client {
        http: reqwest::Client::new(),
        url: url.clone(),
    };
    let mut rows = Vec::new();
    let outcome = async {
        let token = client.register("bench-device").await?;
        rows.push(handout(&gateway, &client, &token).await?);
        rows.extend(first_event(&gateway, &client, &token).await?);
        rows.push(fanout(&gateway, &client, &token).await?);
        anyhow::Ok(())
    }
    .await;
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(20), server).await;
    outcome?;
    rows.extend(append_rate(&data.join("append")).await?);
    Ok(rows)
}

struct Client {
    http: reqwest::Client,
    url: String,
}

impl Client {
    async fn register(&self, device_id: &str) -> anyhow::Result<String> {
        let body: Value = self
            .http
            .post(format!("{}/v1/devices", self.url))
            .header("X-App-Key", "bench-app-key")
            .json(&serde_json::json!({"device_id": device_id}))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        Ok(body["token"]
            .as_str()
            .context("token in registration")?
            .to_string())
    }

    async fn create_session(&self, token: &str) -> anyhow::Result<Value> {
        Ok(self
            .http
            .post(format!("{}/v1/sessions", self.url))
            .bearer_auth(token)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?)
    }

    async fn delete_session(&self, token: &str, id: &str) -> anyhow::Result<()> {
        self.http
            .delete(format!("{}/v1/sessions/{id}", self.url))
            .bearer_auth(token)
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }

    async fn post_message(&self, token: &str, id: &str, text: &str) -> anyhow::Result<()> {
        self.http
            .post(format!("{}/v1/sessions/{id}/messages", self.url))
            .bearer_auth(token)
            .json(&serde_json::json!({"text": text}))
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }

    async fn events(&self, token: &str, id: &str, after: u64) -> anyhow::Result<SseReader> {
        let response = self
            .http
            .get(format!(
                "{}/v1/sessions/{id}/events?after={after}",
                self.url
            ))
            .bearer_auth(token)
            .send()
            .await?
            .error_for_status()?;
        let body = response
            .bytes_stream()
            .map(|chunk| chunk.map(|bytes| bytes.to_vec()));
        Ok(SseReader {
            body: Box::pin(body),
            buffer: String::new(),
        })
    }
}

/// A minimal SSE reader: yields `(event, data)` per block, skipping heartbeat comments.
struct SseReader {
    body: std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<Vec<u8>>> + Send>>,
    buffer: String,
}

impl SseReader {
    async fn next(&mut self) -> anyhow::Result<(String, Value)> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut event = String::new();
                let mut data = None;
                for line in block.lines() {
                    if let Some(value) = line.strip_prefix("event:") {
                        event = value.trim().to_string();
                    } else if let Some(value) = line.strip_prefix("data:") {
                        data = Some(serde_json::from_str(value.trim())?);
                    }
                }
                if let Some(data) = data {
                    return Ok((event, data));
                }
                continue;
            }
            let chunk = tokio::time::timeout(Duration::from_secs(60), self.body.next())
                .await
                .context("no event within 60 s")?
                .context("the event stream ended")??;
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    async fn until(&mut self, event: &str) -> anyhow::Result<Value> {
        loop {
            let (kind, data) = self.next().await?;
            if kind == event {
                return Ok(data);
            }
        }
    }
}

/// The `pct` quantile (0.0 to 1.0) of `samples`.
pub(super) fn percentile(samples: &mut [Duration], pct: f64) -> Duration {
    samples.sort();
    let index = ((samples.len() as f64 - 1.0) * pct).round() as usize;
    samples[index]
}

fn ms(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1000.0)
}

/// POST /v1/sessions with a warm worker ready: the request takes it from the pool.
async fn handout(gateway: &Arc<Gateway>, client: &Client, token: &str) -> anyhow::Result<Row> {
    let mut samples = Vec::with_capacity(N_HANDOUTS);
    for _ in 0..N_HANDOUTS {
        anyhow::ensure!(
            gateway
                .engine
                .pool
                .wait_ready(1, Duration::from_secs(30))
                .await,
            "the warm pool did not refill within 30 s"
        );
        let started = Instant::now();
        let session = client.create_session(token).await?;
        samples.push(started.elapsed());
        anyhow::ensure!(
            session["brain"] == "warm",
            "the session got a warm worker: {session}"
        );
        client
            .delete_session(token, session["id"].as_str().context("id")?)
            .await?;
    }
    let p50 = percentile(&mut samples, 0.5);
    let p95 = percentile(&mut samples, 0.95);
    Ok(Row {
        what: "warm-brain handout (POST /v1/sessions incl. taking a warm worker)".into(),
        value: format!("p50 {} / p95 {}", ms(p50), ms(p95)),
        note: format!("{N_HANDOUTS} sessions, target < 50 ms"),
    })
}

/// POST a message, time until the first `update` event and until `turn_end` (shell agent).
async fn first_event(
    gateway: &Arc<Gateway>,
    client: &Client,
    token: &str,
) -> anyhow::Result<Vec<Row>> {
    anyhow::ensure!(
        gateway
            .engine
            .pool
            .wait_ready(1, Duration::from_secs(30))
            .await,
        "no warm worker"
    );
    let session = client.create_session(token).await?;
    let id = session["id"].as_str().context("id")?.to_string();
    let mut events = client.events(token, &id, 0).await?;
    let mut first_turn = None;
    let mut later_updates = Vec::new();
    let mut later_ends = Vec::new();
    for turn in 0..=N_TURNS {
        let started = Instant::now();
        client
            .post_message(token, &id, &format!("echo turn-{turn}"))
            .await?;
        events.until("update").await?;
        let first_update = started.elapsed();
        events.until("turn_end").await?;
        let end = started.elapsed();
        if turn == 0 {
            first_turn = Some((first_update, end));
        } else {
            later_updates.push(first_update);
            later_ends.push(end);
        }
    }
    client.delete_session(token, &id).await?;
    let (first_update, first_end) = first_turn.context("first turn measured")?;
    Ok(vec![
        Row {
            what: "first event after the first message (`echo`, shell agent)".into(),
            value: format!(
                "{} to first update, {} to turn_end",
                ms(first_update),
                ms(first_end)
            ),
            note: "includes starting the hands (execd) and ACP session/new".into(),
        },
        Row {
            what: "first event after a later message".into(),
            value: format!(
                "p50 {} to first update, p50 {} to turn_end",
                ms(percentile(&mut later_updates, 0.5)),
                ms(percentile(&mut later_ends, 0.5))
            ),
            note: format!("{N_TURNS} turns; update = the agent's tool_call"),
        },
    ])
}

/// One session, 100 SSE subscribers, events appended as fast as the slowest subscriber keeps up
/// within its 512-event queue.
async fn fanout(gateway: &Arc<Gateway>, client: &Client, token: &str) -> anyhow::Result<Row> {
    let session = client.create_session(token).await?;
    let id = session["id"].as_str().context("id")?.to_string();
    let session = gateway.engine.sessions.get("bench-device", &id)?;
    let received: Arc<Vec<AtomicU64>> =
        Arc::new((0..N_SUBSCRIBERS).map(|_| AtomicU64::new(0)).collect());
    let mut readers = Vec::new();
    for index in 0..N_SUBSCRIBERS {
        let mut events = client.events(token, &id, 0).await?;
        let received = received.clone();
        readers.push(tokio::spawn(async move {
            for n in 1..=N_FANOUT_EVENTS {
                events.next().await?;
                received[index].store(n, Ordering::Release);
            }
            anyhow::Ok(())
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while session.log.n_subscribers() < N_SUBSCRIBERS {
        anyhow::ensure!(Instant::now() < deadline, "subscribers did not connect");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let dropped_before =
        warren_gateway::event_log::SLOW_SUBSCRIBERS_DROPPED.load(Ordering::Relaxed);
    let started = Instant::now();
    for seq in 1..=N_FANOUT_EVENTS {
        // Keep the producer within 256 events of the slowest reader (queues hold 512).
        while seq
            > received
                .iter()
                .map(|r| r.load(Ordering::Acquire))
                .min()
                .unwrap_or(0)
                + 256
        {
            tokio::task::yield_now().await;
        }
        let update = serde_json::json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x".repeat(100)}});
        session.log.append(Some(1), EventBody::Update { update })?;
    }
    for reader in readers {
        reader.await??;
    }
    let elapsed = started.elapsed();
    let dropped = warren_gateway::event_log::SLOW_SUBSCRIBERS_DROPPED.load(Ordering::Relaxed)
        - dropped_before;
    client.delete_session(token, &id).await?;
    let deliveries = N_SUBSCRIBERS as f64 * N_FANOUT_EVENTS as f64;
    Ok(Row {
        what: format!("SSE fan-out, {N_SUBSCRIBERS} subscribers of one session"),
        value: format!(
            "{:.0} events/s delivered ({:.0} events/s appended)",
            deliveries / elapsed.as_secs_f64(),
            N_FANOUT_EVENTS as f64 / elapsed.as_secs_f64()
        ),
        note: format!(
            "{N_FANOUT_EVENTS} events of ~200 B, clients in the same process; {dropped} subscribers dropped"
        ),
    })
}

/// Appends `n_events` updates of ~200 B to a fresh log at `path`, with an fdatasync after each
/// one when `sync_each`, else once at the end, and returns how long that took until the last
/// one was in the file and synced.
async fn time_appends(
    path: &std::path::Path,
    n_events: u64,
    sync_each: bool,
) -> anyhow::Result<Duration> {
    let update = serde_json::json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x".repeat(100)}});
    let health = Arc::new(StorageHealth::default());
    let (log, _) = EventLog::open(path, health, |_| {})?;
    let started = Instant::now();
    for _ in 0..n_events {
        log.append(
            Some(1),
            EventBody::Update {
                update: update.clone(),
            },
        )?;
        if sync_each {
            log.sync().await?;
        }
    }
    if !sync_each {
        log.sync().await?;
    }
    Ok(started.elapsed())
}

/// Appends to a fresh `events.jsonl`: the default (queued, written in batches by the log's
/// writer, fsync at turn end) and, for comparison, an fsync after every event.
async fn append_rate(dir: &std::path::Path) -> anyhow::Result<Vec<Row>> {
    std::fs::create_dir_all(dir)?;
    let plain = time_appends(&dir.join("events.jsonl"), N_APPENDS, false).await?;
    let synced = time_appends(&dir.join("synced.jsonl"), N_SYNCED_APPENDS, true).await?;
    Ok(vec![
        Row {
            what: "event-log append (default durability)".into(),
            value: format!("{:.0} events/s", N_APPENDS as f64 / plain.as_secs_f64()),
            note: format!(
                "{N_APPENDS} events of ~200 B, timed until all are in the file; written off the \
                 async workers in batches before they are published (survives a gateway crash), \
                 fdatasync at turn end and shutdown (power loss)"
            ),
        },
        Row {
            what: "event-log append with fdatasync per event".into(),
            value: format!(
                "{:.0} events/s",
                N_SYNCED_APPENDS as f64 / synced.as_secs_f64()
            ),
            note: format!("{N_SYNCED_APPENDS} events; for comparison, not the default"),
        },
    ])
}
