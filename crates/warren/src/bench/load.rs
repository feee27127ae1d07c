//! `warren bench load`: Warren under load, measured in one run against real servers (`warren
//! execd` child processes on 127.0.0.1:0, a gateway served in this process) and printed as one
//! markdown table.
//!
//! 1. 1,000 concurrent PTY sessions, a shell each, holders attached: creation rate,
//!    create-to-first-output latency, daemon RSS per session, then all deleted and no process
//!    of execd's left.
//! 2. 200 concurrent `/v1/exec` calls (`echo hi` and `sleep 0.2; echo done`): throughput,
//!    latency, the engine's 64-session limit answering 429 (retried), errors.
//! 3. 1,000 idle connections that sent half a request head: `/ping` latency with and without
//!    them, how many the header read timeout closed and when; then a daemon with a small
//!    connection limit, to see that no more connections than that are ever served at once.
//! 4. SSE: 100 readers of one gateway session, and 1,000 readers across 100 sessions, every
//!    event checked (seq strictly +1 per reader): lost, duplicated, out of order.
//!
//! `--soak 30m` instead runs a mixed load (PTY sessions created, used and deleted, exec calls,
//! SSE readers) for that long and prints both servers' RSS every 10 s and a verdict.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;
use tokio_tungstenite::tungstenite::Message;
use warren_gateway::GatewayArgs;
use warren_gateway::session::Session;
use warren_protocol::gateway::EventBody;

use super::support::{BenchGateway, ExecdChild, Row, ms, percentile, print_table, rss_kib};

const N_PTY_SESSIONS: usize = 1_000;
/// PTY sessions being created at once.
const N_PTY_IN_FLIGHT: usize = 100;
const N_EXEC_CALLS: usize = 200;
const N_SLOW_CONNECTIONS: usize = 1_000;
const SLOW_HEADER_TIMEOUT_MS: u64 = 5_000;
/// The small daemon's connection limit, and how many half-sent requests it gets.
const SMALL_MAX_CONNECTIONS: usize = 100;
const N_OVER_LIMIT: usize = 150;
const SMALL_HEADER_TIMEOUT_MS: u64 = 2_000;
const N_PINGS: usize = 500;
/// How far an event producer may run ahead of its slowest reader (queues hold 512).
const SSE_LEAD: u64 = 256;
/// The gateway's quota of sessions per device.
const SESSIONS_PER_DEVICE: usize = 20;
const SOAK_SAMPLE: Duration = Duration::from_secs(10);
const WAIT: Duration = Duration::from_secs(60);
const MACHINE_NOTE: &str = "Clients and servers share this machine: the figures include the \
                            clients' own CPU, and any other load on the machine.";

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

#[derive(Debug, clap::Args)]
pub struct LoadArgs {
    /// Instead of the table, run a mixed load for this long (`30m`, `120s`) and print both
    /// servers' RSS every 10 s.
    #[arg(long, value_parser = warren_gateway::config::parse_duration)]
    pub soak: Option<Duration>,
    /// Measure only these parts (default: all of them).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Part>,
}

/// One part of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    Pty,
    Exec,
    SlowHeaders,
    ConnectionLimit,
    Sse,
}

pub async fn run(args: LoadArgs) -> anyhow::Result<()> {
    warren_process::reaper::start().context("becoming a subreaper")?;
    raise_open_file_limit();
    if let Some(duration) = args.soak {
        return soak(duration).await;
    }
    let wanted = |part: Part| args.only.is_empty() || args.only.contains(&part);
    let mut rows = Vec::new();
    if wanted(Part::Pty) {
        pty_sessions(&mut rows)
            .await
            .context("measuring 1,000 PTY sessions")?;
    }
    if wanted(Part::Exec) {
        exec_calls(&mut rows)
            .await
            .context("measuring concurrent exec calls")?;
    }
    if wanted(Part::SlowHeaders) {
        slow_headers(&mut rows)
            .await
            .context("measuring slow-header connections")?;
    }
    if wanted(Part::ConnectionLimit) {
        connection_limit(&mut rows)
            .await
            .context("measuring the connection limit")?;
    }
    if wanted(Part::Sse) {
        sse(&mut rows).await.context("measuring SSE fan-out")?;
    }
    println!(
        "{} cores. {MACHINE_NOTE}\n",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    print_table(&rows);
    Ok(())
}

/// Every connection and PTY here is a descriptor: the soft limit goes up to the hard one, for
/// this process and the daemons it starts.
fn raise_open_file_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        if let Err(error) = setrlimit(Resource::Nofile, limit) {
            eprintln!("could not raise the open file limit: {error}");
        }
    }
}

fn http_client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder().no_proxy().build()?)
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn p50_p99(samples: &mut [Duration]) -> String {
    if samples.is_empty() {
        return "–".into();
    }
    samples.sort();
    format!(
        "{} / {}",
        ms(percentile(samples, 0.50)),
        ms(percentile(samples, 0.99))
    )
}

/// Waits up to 30 s for execd to have no process left; how many there still are.
async fn processes_left(execd: &ExecdChild) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = execd.descendants().len();
        if left == 0 || Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A PTY session with a shell whose first output arrived on its holder WebSocket.
struct Shell {
    id: String,
    ws: Ws,
    first_output: Duration,
}

/// `POST /pty` for a shell, attaches its holder and waits for its first output.
async fn open_shell(http: &reqwest::Client, base: &str) -> anyhow::Result<Shell> {
    let started = Instant::now();
    let response = http
        .post(format!("{base}/pty"))
        .json(&json!({}))
        .send()
        .await?;
    let status = response.status();
    let answer: Value = response.json().await?;
    if !status.is_success() {
        bail!("POST /pty answered {status}: {answer}");
    }
    let id = answer["session_id"]
        .as_str()
        .with_context(|| format!("no session_id in {answer}"))?
        .to_string();
    let url = format!("{}/pty/{id}/ws", base.replacen("http://", "ws://", 1));
    let (mut ws, _) = tokio_tungstenite::connect_async_with_config(url, None, true).await?;
    loop {
        match tokio::time::timeout(WAIT, ws.next())
            .await
            .context("no output within 60 s")?
        {
            Some(Ok(Message::Binary(frame))) if frame_payload(&frame).is_some() => break,
            Some(Ok(Message::Text(text))) if text.as_str().contains("\"error\"") => {
                bail!("attach failed: {text}")
            }
            Some(Ok(_)) => {}
            Some(Err(error)) => return Err(error.into()),
            None => bail!("the holder closed before any output"),
        }
    }
    Ok(Shell {
        id,
        ws,
        first_output: started.elapsed(),
    })
}

/// Output bytes in a binary frame (live frames carry 1 header byte, replay frames 9), if any.
fn frame_payload(frame: &[u8]) -> Option<&[u8]> {
    let payload = match frame.first() {
        Some(3) if frame.len() >= 9 => &frame[9..],
        Some(_) => &frame[1..],
        None => frame,
    };
    (!payload.is_empty()).then_some(payload)
}

async fn delete_pty(http: &reqwest::Client, base: &str, id: &str) -> anyhow::Result<()> {
    let response = http.delete(format!("{base}/pty/{id}")).send().await?;
    if !response.status().is_success() {
        bail!("DELETE /pty/{id} answered {}", response.status());
    }
    Ok(())
}

async fn pty_sessions(rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let execd =
        ExecdChild::start_with(&["--max-pty-sessions", "1100", "--max-connections", "4096"])
            .await?;
    let result = pty_sessions_on(&execd, rows).await;
    execd.stop().await;
    result
}

async fn pty_sessions_on(execd: &ExecdChild, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let http = http_client()?;
    // One warm-up session so lazily built daemon state is not charged to the 1,000.
    let warm = open_shell(&http, &execd.base).await?;
    drop(warm.ws);
    delete_pty(&http, &execd.base, &warm.id).await?;
    let n_before = processes_left(execd).await;
    let idle = rss_kib(execd.pid)?;

    let slots = Arc::new(Semaphore::new(N_PTY_IN_FLIGHT));
    let started = Instant::now();
    let mut opening = Vec::with_capacity(N_PTY_SESSIONS);
    for _ in 0..N_PTY_SESSIONS {
        let slot = slots.clone().acquire_owned().await?;
        let (http, base) = (http.clone(), execd.base.clone());
        opening.push(tokio::spawn(async move {
            let shell = open_shell(&http, &base).await;
            drop(slot);
            shell
        }));
    }
    let mut shells = Vec::with_capacity(N_PTY_SESSIONS);
    let mut failures = Vec::new();
    for task in opening {
        match task.await? {
            Ok(shell) => shells.push(shell),
            Err(error) => failures.push(error.to_string()),
        }
    }
    let elapsed = started.elapsed();
    let full = rss_kib(execd.pid)?;
    let n_processes = execd.descendants().len();
    let mut first_output: Vec<Duration> = shells.iter().map(|s| s.first_output).collect();

    let started = Instant::now();
    let mut closing = Vec::with_capacity(shells.len());
    for mut shell in shells.drain(..) {
        let slot = slots.clone().acquire_owned().await?;
        let (http, base) = (http.clone(), execd.base.clone());
        closing.push(tokio::spawn(async move {
            let _ = shell.ws.close(None).await;
            let deleted = delete_pty(&http, &base, &shell.id).await;
            drop(slot);
            deleted
        }));
    }
    let mut n_delete_failures = 0;
    for task in closing {
        if task.await?.is_err() {
            n_delete_failures += 1;
        }
    }
    let left = processes_left(execd).await;
    let teardown = started.elapsed();

    let n_open = first_output.len();
    if let Some(first) = failures.first() {
        eprintln!(
            "{} of {N_PTY_SESSIONS} sessions failed; the first: {first}",
            failures.len()
        );
    }
    rows.push(Row {
        measurement: format!(
            "{N_PTY_SESSIONS} PTY sessions with a shell each ({N_PTY_IN_FLIGHT} being created at once): \
             open with first output"
        ),
        result: format!(
            "{n_open} in {:.1} s ({:.0} sessions/s), {} failed, {n_processes} processes running",
            elapsed.as_secs_f64(),
            n_open as f64 / elapsed.as_secs_f64(),
            failures.len()
        ),
        target: "all 1,000",
    });
    rows.push(Row {
        measurement: "PTY create → first shell output on the WebSocket, p50 / p99".into(),
        result: p50_p99(&mut first_output),
        target: "",
    });
    rows.push(Row {
        measurement: format!("execd RSS per PTY session ({n_open} attached shells)"),
        result: format!(
            "{:.1} KiB ({} idle → {})",
            full.saturating_sub(idle) as f64 / n_open.max(1) as f64,
            mib(idle),
            mib(full)
        ),
        target: "< 100 KiB",
    });
    rows.push(Row {
        measurement: "all deleted (`DELETE /pty/{id}`), then execd's processes".into(),
        result: format!(
            "{:.1} s, {n_delete_failures} failed, left: {left} (before: {n_before})",
            teardown.as_secs_f64()
        ),
        target: "left: 0",
    });
    Ok(())
}

/// One `/v1/exec` call that must exit 0 printing `expect`, retried while the engine answers
/// 429 (every session busy): its latency and how many 429s it got.
async fn exec_call(
    http: &reqwest::Client,
    base: &str,
    cmd: &str,
    expect: &str,
) -> anyhow::Result<(Duration, u64)> {
    let started = Instant::now();
    let mut n_busy = 0;
    loop {
        let response = http
            .post(format!("{base}/v1/exec"))
            // Not a login shell: a login profile measures the machine (this one's runs
            // `pyenv rehash` under a lock, and 200 logins at once take a minute without Warren).
            .json(&json!({"cmd": cmd, "login": false, "yield_time_ms": 30000}))
            .send()
            .await?;
        let status = response.status();
        let body: Value = response.json().await?;
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            anyhow::ensure!(
                body["code"] == "TOO_MANY_SESSIONS",
                "429 but not TOO_MANY_SESSIONS: {body}"
            );
            n_busy += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        anyhow::ensure!(status.is_success(), "/v1/exec answered {status}: {body}");
        let mut body = body;
        let mut output = body["output"].as_str().unwrap_or_default().to_string();
        // Still running after the yield: poll until it exits, to see how long it really took.
        while body["status"] == "running" && started.elapsed() < Duration::from_secs(300) {
            let id = body["session_id"].as_u64().context("no session_id")?;
            body = http
                .post(format!("{base}/v1/exec/{id}/stdin"))
                .json(&json!({"yield_time_ms": 30000}))
                .send()
                .await?
                .json()
                .await?;
            output.push_str(body["output"].as_str().unwrap_or_default());
        }
        anyhow::ensure!(
            body["exit_code"] == 0 && output.contains(expect),
            "`{cmd}` did not exit 0 printing {expect} in {:.1} s: {body}",
            started.elapsed().as_secs_f64()
        );
        return Ok((started.elapsed(), n_busy));
    }
}

async fn exec_calls(rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let execd = ExecdChild::start_with(&["--max-connections", "4096"]).await?;
    let result = exec_calls_on(&execd, rows).await;
    execd.stop().await;
    result
}

async fn exec_calls_on(execd: &ExecdChild, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let http = http_client()?;
    exec_call(&http, &execd.base, "echo hi", "hi").await?;
    for (label, cmd, expect) in [
        ("`echo hi`", "echo hi", "hi"),
        ("`sleep 0.2; echo done`", "sleep 0.2; echo done", "done"),
    ] {
        let start = Arc::new(tokio::sync::Barrier::new(N_EXEC_CALLS + 1));
        let mut calls = Vec::with_capacity(N_EXEC_CALLS);
        for _ in 0..N_EXEC_CALLS {
            let (http, base, start) = (http.clone(), execd.base.clone(), start.clone());
            calls.push(tokio::spawn(async move {
                start.wait().await;
                exec_call(&http, &base, cmd, expect).await
            }));
        }
        start.wait().await;
        let started = Instant::now();
        let (mut latencies, mut n_busy, mut errors) = (Vec::new(), 0, Vec::new());
        for call in calls {
            match call.await? {
                Ok((latency, busy)) => {
                    latencies.push(latency);
                    n_busy += busy;
                }
                Err(error) => errors.push(error.to_string()),
            }
        }
        let elapsed = started.elapsed();
        if let Some(first) = errors.first() {
            eprintln!("{} exec calls failed; the first: {first}", errors.len());
        }
        let n_ok = latencies.len();
        rows.push(Row {
            measurement: format!(
                "{N_EXEC_CALLS} concurrent `/v1/exec` {label} (non-login shell): throughput, latency p50 / p99"
            ),
            result: format!(
                "{:.0} calls/s, {} (max {}); {n_ok} ok, errors: {}, 429 answers retried: {n_busy}",
                n_ok as f64 / elapsed.as_secs_f64(),
                p50_p99(&mut latencies),
                ms(latencies.last().copied().unwrap_or_default()),
                errors.len()
            ),
            target: "errors: 0",
        });
    }
    let left = processes_left(execd).await;
    rows.push(Row {
        measurement: "exec processes left after the calls".into(),
        result: format!("left: {left}"),
        target: "left: 0",
    });
    Ok(())
}

/// The daemon's open sockets (its listener included), from `/proc/<pid>/fd`.
fn n_sockets(pid: u32) -> usize {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    entries
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

/// `N_PINGS` sequential `GET /ping` on a warm keep-alive client.
async fn ping_latencies(http: &reqwest::Client, base: &str) -> anyhow::Result<Vec<Duration>> {
    let mut samples = Vec::with_capacity(N_PINGS);
    for _ in 0..N_PINGS {
        let started = Instant::now();
        http.get(format!("{base}/ping"))
            .send()
            .await?
            .error_for_status()?
            .bytes()
            .await?;
        samples.push(started.elapsed());
    }
    Ok(samples)
}

/// Connects, sends half a request head and then nothing: how long after that the server
/// closed the connection (`None` if it had not within `give_up`).
async fn half_sent_request(
    addr: std::net::SocketAddr,
    connected: Arc<AtomicU64>,
    give_up: Duration,
) -> anyhow::Result<Option<Duration>> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        .await?;
    let sent = Instant::now();
    connected.fetch_add(1, Ordering::Relaxed);
    let mut buf = [0u8; 1024];
    let read_to_end = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    Ok(tokio::time::timeout(give_up, read_to_end)
        .await
        .ok()
        .map(|()| sent.elapsed()))
}

fn socket_addr(base: &str) -> anyhow::Result<std::net::SocketAddr> {
    Ok(base.trim_start_matches("http://").parse()?)
}

/// Close times: how many, and min / p50 / max.
fn closed_summary(closed: &mut [Duration]) -> String {
    if closed.is_empty() {
        return "none".into();
    }
    closed.sort();
    format!(
        "{:.2} / {:.2} / {:.2} s",
        closed[0].as_secs_f64(),
        percentile(closed, 0.5).as_secs_f64(),
        closed[closed.len() - 1].as_secs_f64()
    )
}

async fn slow_headers(rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let timeout = SLOW_HEADER_TIMEOUT_MS.to_string();
    let execd = ExecdChild::start_with(&[
        "--header-read-timeout-ms",
        &timeout,
        "--max-connections",
        "1100",
    ])
    .await?;
    let result = slow_headers_on(&execd, rows).await;
    execd.stop().await;
    result
}

async fn slow_headers_on(execd: &ExecdChild, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let http = http_client()?;
    ping_latencies(&http, &execd.base).await?;
    let mut quiet = ping_latencies(&http, &execd.base).await?;
    let n_base_sockets = n_sockets(execd.pid);

    let addr = socket_addr(&execd.base)?;
    let connected = Arc::new(AtomicU64::new(0));
    let mut slow = Vec::with_capacity(N_SLOW_CONNECTIONS);
    for _ in 0..N_SLOW_CONNECTIONS {
        slow.push(tokio::spawn(half_sent_request(
            addr,
            connected.clone(),
            WAIT,
        )));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while (connected.load(Ordering::Relaxed) as usize) < N_SLOW_CONNECTIONS
        || n_sockets(execd.pid) < n_base_sockets + N_SLOW_CONNECTIONS
    {
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {} slow connections connected, {} accepted",
            connected.load(Ordering::Relaxed),
            n_sockets(execd.pid).saturating_sub(n_base_sockets)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let n_accepted = n_sockets(execd.pid) - n_base_sockets;
    let since_open = Instant::now();
    let mut loaded = ping_latencies(&http, &execd.base).await?;
    let measured_in = since_open.elapsed();
    let mut closed = Vec::new();
    let mut n_still_open = 0;
    for task in slow {
        match task.await? {
            Ok(Some(after)) => closed.push(after),
            Ok(None) => n_still_open += 1,
            Err(error) => bail!("a slow connection failed: {error}"),
        }
    }
    let healthy = http
        .get(format!("{}/ping", execd.base))
        .send()
        .await?
        .status()
        .is_success();
    rows.push(Row {
        measurement: format!("`GET /ping` p50 / p99, no other connections ({N_PINGS} requests)"),
        result: p50_p99(&mut quiet),
        target: "",
    });
    rows.push(Row {
        measurement: format!(
            "`GET /ping` p50 / p99 while {N_SLOW_CONNECTIONS} connections hold half a request head"
        ),
        result: format!(
            "{} ({n_accepted} of them accepted; measured within {:.2} s of their opening)",
            p50_p99(&mut loaded),
            measured_in.as_secs_f64()
        ),
        target: "≈ the line above",
    });
    rows.push(Row {
        measurement: format!(
            "half-sent requests closed by the header read timeout ({SLOW_HEADER_TIMEOUT_MS} ms), \
             after min / p50 / max"
        ),
        result: format!(
            "{} of {N_SLOW_CONNECTIONS}, after {}; {n_still_open} still open after 60 s; \
             server healthy: {healthy}",
            closed.len(),
            closed_summary(&mut closed)
        ),
        target: "all, after ≈ 5 s",
    });
    Ok(())
}

async fn connection_limit(rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let (limit, timeout) = (
        SMALL_MAX_CONNECTIONS.to_string(),
        SMALL_HEADER_TIMEOUT_MS.to_string(),
    );
    let execd = ExecdChild::start_with(&[
        "--header-read-timeout-ms",
        &timeout,
        "--max-connections",
        &limit,
    ])
    .await?;
    let result = connection_limit_on(&execd, rows).await;
    execd.stop().await;
    result
}

async fn connection_limit_on(execd: &ExecdChild, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let n_base_sockets = n_sockets(execd.pid);
    let addr = socket_addr(&execd.base)?;
    let connected = Arc::new(AtomicU64::new(0));
    let mut slow = Vec::with_capacity(N_OVER_LIMIT);
    for _ in 0..N_OVER_LIMIT {
        slow.push(tokio::spawn(half_sent_request(
            addr,
            connected.clone(),
            WAIT,
        )));
    }
    while (connected.load(Ordering::Relaxed) as usize) < N_OVER_LIMIT {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A request on a new connection while every slot is taken: it waits for one.
    let base = execd.base.clone();
    let waiting = tokio::spawn(async move {
        let started = Instant::now();
        let status = http_client()?
            .get(format!("{base}/ping"))
            .send()
            .await?
            .status();
        anyhow::ensure!(status.is_success(), "/ping answered {status}");
        anyhow::Ok(started.elapsed())
    });
    let mut most_served = 0;
    while !slow.iter().all(|task| task.is_finished()) {
        most_served = most_served.max(n_sockets(execd.pid).saturating_sub(n_base_sockets));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut closed = Vec::new();
    for task in slow {
        if let Some(after) = task.await?? {
            closed.push(after);
        }
    }
    let waited = waiting.await??;
    rows.push(Row {
        measurement: format!(
            "connection limit {SMALL_MAX_CONNECTIONS}, {N_OVER_LIMIT} half-sent requests \
             (header read timeout {SMALL_HEADER_TIMEOUT_MS} ms): most connections served at once"
        ),
        result: format!(
            "{most_served}; all {} closed after min / p50 / max {}",
            closed.len(),
            closed_summary(&mut closed)
        ),
        target: "≤ 100",
    });
    rows.push(Row {
        measurement: "a new request while every slot is taken: answered after".into(),
        result: format!(
            "{:.2} s (when a timeout freed a slot)",
            waited.as_secs_f64()
        ),
        target: "≈ 2 s, not refused",
    });
    Ok(())
}

/// What one SSE reader saw.
#[derive(Default)]
struct Tally {
    delivered: u64,
    duplicated: u64,
    out_of_order: u64,
    reconnects: u64,
    latencies: Vec<Duration>,
}

/// One event stream of a session, read with a minimal SSE parser: `(seq, data)` per event.
struct SseStream {
    body: std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<Vec<u8>>> + Send>>,
    buffer: String,
}

impl SseStream {
    async fn open(
        http: &reqwest::Client,
        url: &str,
        token: &str,
        after: u64,
    ) -> anyhow::Result<Self> {
        let response = http
            .get(url)
            .bearer_auth(token)
            .header("Last-Event-ID", after.to_string())
            .send()
            .await?
            .error_for_status()?;
        Ok(Self {
            body: Box::pin(
                response
                    .bytes_stream()
                    .map(|chunk| chunk.map(|bytes| bytes.to_vec())),
            ),
            buffer: String::new(),
        })
    }

    /// The next event; `None` when the stream ended.
    async fn next(&mut self) -> anyhow::Result<Option<(u64, String)>> {
        loop {
            while let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut seq = None;
                let mut data = None;
                for line in block.lines() {
                    if let Some(value) = line.strip_prefix("id:") {
                        seq = value.trim().parse().ok();
                    } else if let Some(value) = line.strip_prefix("data:") {
                        data = Some(value.trim().to_string());
                    }
                }
                if let (Some(seq), Some(data)) = (seq, data) {
                    return Ok(Some((seq, data)));
                }
            }
            match self.body.next().await {
                Some(chunk) => self.buffer.push_str(&String::from_utf8_lossy(&chunk?)),
                None => return Ok(None),
            }
        }
    }
}

/// The microseconds since `epoch` an event's text carries between `@`s.
fn sent_at(data: &str) -> Option<u64> {
    let start = data.find('@')? + 1;
    let end = start + data[start..].find('@')?;
    data[start..end].parse().ok()
}

/// Reads `url` from after seq `after` until it has seen seq `last` (which may be set later),
/// resuming with `Last-Event-ID` whenever the stream ends; `seen` is its newest seq.
async fn read_events(
    http: reqwest::Client,
    url: String,
    token: String,
    after: u64,
    last: Arc<AtomicU64>,
    seen: Arc<AtomicU64>,
    epoch: Instant,
) -> anyhow::Result<Tally> {
    let mut tally = Tally::default();
    let mut previous = after;
    'streams: while previous < last.load(Ordering::Acquire) {
        let mut stream = SseStream::open(&http, &url, &token, previous).await?;
        let mut silent_since = Instant::now();
        loop {
            if previous >= last.load(Ordering::Acquire) {
                break 'streams;
            }
            let next = match tokio::time::timeout(Duration::from_secs(1), stream.next()).await {
                Ok(next) => next?,
                Err(_) => {
                    anyhow::ensure!(
                        silent_since.elapsed() < WAIT,
                        "no event for 60 s after seq {previous}"
                    );
                    continue;
                }
            };
            silent_since = Instant::now();
            let Some((seq, data)) = next else {
                tally.reconnects += 1;
                continue 'streams;
            };
            if seq <= previous {
                tally.duplicated += 1;
                continue;
            }
            if seq != previous + 1 {
                tally.out_of_order += 1;
            }
            previous = seq;
            tally.delivered += 1;
            seen.store(seq, Ordering::Release);
            if let Some(sent) = sent_at(&data) {
                let now = epoch.elapsed().as_micros() as u64;
                tally
                    .latencies
                    .push(Duration::from_micros(now.saturating_sub(sent)));
            }
        }
    }
    Ok(tally)
}

/// A session and its readers' newest seqs.
struct Feed {
    session: Arc<Session>,
    seen: Vec<Arc<AtomicU64>>,
}

impl Feed {
    fn slowest(&self) -> u64 {
        (self.seen.iter())
            .map(|seen| seen.load(Ordering::Acquire))
            .min()
            .unwrap_or(0)
    }
}

/// Sessions with `per_session` readers each, connected, as devices of at most
/// [`SESSIONS_PER_DEVICE`] sessions.
struct Fleet {
    feeds: Vec<Feed>,
    readers: Vec<tokio::task::JoinHandle<anyhow::Result<Tally>>>,
    last: Vec<Arc<AtomicU64>>,
    first_seq: Vec<u64>,
}

impl Fleet {
    async fn start(
        gateway: &BenchGateway,
        name: &str,
        n_sessions: usize,
        per_session: usize,
        epoch: Instant,
    ) -> anyhow::Result<Self> {
        let mut fleet = Fleet {
            feeds: Vec::new(),
            readers: Vec::new(),
            last: Vec::new(),
            first_seq: Vec::new(),
        };
        let mut token = String::new();
        let mut device = String::new();
        for index in 0..n_sessions {
            if index % SESSIONS_PER_DEVICE == 0 {
                device = format!("load-{name}-device-{}", index / SESSIONS_PER_DEVICE);
                token = gateway.register(&device).await?;
            }
            let id = gateway.create_session(&token).await?;
            let session = gateway.gateway.engine.sessions.get(&device, &id)?;
            let after = session.log.last_seq();
            let last = Arc::new(AtomicU64::new(u64::MAX));
            let url = format!("{}/v1/sessions/{id}/events", gateway.url);
            let mut seen = Vec::new();
            for _ in 0..per_session {
                let newest = Arc::new(AtomicU64::new(after));
                seen.push(newest.clone());
                fleet.readers.push(tokio::spawn(read_events(
                    gateway.http.clone(),
                    url.clone(),
                    token.clone(),
                    after,
                    last.clone(),
                    newest,
                    epoch,
                )));
            }
            fleet.feeds.push(Feed { session, seen });
            fleet.last.push(last);
            fleet.first_seq.push(after);
        }
        let deadline = Instant::now() + WAIT;
        for feed in &fleet.feeds {
            while feed.session.log.n_subscribers() < per_session {
                anyhow::ensure!(Instant::now() < deadline, "the SSE readers did not connect");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        Ok(fleet)
    }

    /// Appends one event to feed `index`, waiting while its slowest reader is more than
    /// [`SSE_LEAD`] behind; returns `false` if `stop` was set while waiting.
    async fn append(
        &self,
        index: usize,
        epoch: Instant,
        stop: &AtomicBool,
    ) -> anyhow::Result<bool> {
        let feed = &self.feeds[index];
        while feed.session.log.last_seq() >= feed.slowest() + SSE_LEAD {
            if stop.load(Ordering::Relaxed) {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let text = format!("@{}@ {}", epoch.elapsed().as_micros(), "x".repeat(80));
        let update = json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}});
        feed.session
            .log
            .append(Some(1), EventBody::Update { update })?;
        Ok(true)
    }

    /// Lets the readers end at each session's current last event and adds up what they saw.
    async fn finish(self) -> anyhow::Result<(Tally, u64)> {
        let mut expected = 0;
        for ((feed, last), first) in self.feeds.iter().zip(&self.last).zip(&self.first_seq) {
            let newest = feed.session.log.last_seq();
            last.store(newest, Ordering::Release);
            expected += (newest - first) * feed.seen.len() as u64;
        }
        let mut total = Tally::default();
        for reader in self.readers {
            let tally = reader.await??;
            total.delivered += tally.delivered;
            total.duplicated += tally.duplicated;
            total.out_of_order += tally.out_of_order;
            total.reconnects += tally.reconnects;
            total.latencies.extend(tally.latencies);
        }
        Ok((total, expected))
    }
}

async fn sse(rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let data = std::env::temp_dir().join(format!("warren-bench-load-{}", std::process::id()));
    let result = async {
        let gateway = BenchGateway::start(gateway_args(&data)).await?;
        let measured = async {
            fan_out(&gateway, rows, "one", 1, 100, 2_000).await?;
            fan_out(&gateway, rows, "many", 100, 10, 200).await
        }
        .await;
        gateway.stop().await;
        measured
    }
    .await;
    let _ = std::fs::remove_dir_all(&data);
    result
}

fn gateway_args(data: &std::path::Path) -> GatewayArgs {
    let mut args = GatewayArgs::with_data(data.join("gateway"));
    args.app_key = Some("bench-app-key".into());
    // No brains: the events are appended here, and only the event streams are measured.
    args.warm_workers = 0;
    args.serve.max_connections = 4096;
    args
}

async fn fan_out(
    gateway: &BenchGateway,
    rows: &mut Vec<Row>,
    name: &str,
    n_sessions: usize,
    per_session: usize,
    n_events: u64,
) -> anyhow::Result<()> {
    let epoch = Instant::now();
    let fleet = Fleet::start(gateway, name, n_sessions, per_session, epoch).await?;
    let dropped_before =
        warren_gateway::event_log::SLOW_SUBSCRIBERS_DROPPED.load(Ordering::Relaxed);
    let never = AtomicBool::new(false);
    let started = Instant::now();
    for _ in 0..n_events {
        for index in 0..n_sessions {
            fleet.append(index, epoch, &never).await?;
        }
    }
    let (mut tally, expected) = fleet.finish().await?;
    let elapsed = started.elapsed();
    let dropped = warren_gateway::event_log::SLOW_SUBSCRIBERS_DROPPED.load(Ordering::Relaxed)
        - dropped_before;
    let n_readers = n_sessions * per_session;
    let appended = n_sessions as u64 * n_events;
    rows.push(Row {
        measurement: format!(
            "SSE, {n_readers} readers on {n_sessions} session(s), {appended} events: appended / \
             delivered per s, delivery latency p50 / p99"
        ),
        result: format!(
            "{:.0} / {:.0} events/s, {}",
            appended as f64 / elapsed.as_secs_f64(),
            tally.delivered as f64 / elapsed.as_secs_f64(),
            p50_p99(&mut tally.latencies)
        ),
        target: "",
    });
    rows.push(Row {
        measurement: format!("SSE, {n_readers} readers: every event once and in order"),
        result: format!(
            "lost: {}, duplicated: {}, out of order: {} ({} deliveries; {dropped} slow readers \
             dropped, {} resumed)",
            expected.saturating_sub(tally.delivered),
            tally.duplicated,
            tally.out_of_order,
            tally.delivered,
            tally.reconnects
        ),
        target: "0, 0, 0",
    });
    Ok(())
}

/// What the soak's workers did, counted as they go.
#[derive(Default)]
struct SoakCounts {
    pty_cycles: AtomicU64,
    exec_calls: AtomicU64,
    errors: AtomicU64,
    appended: AtomicU64,
}

/// One sample of the soak's RSS curve.
struct Sample {
    at: Duration,
    execd_kib: u64,
    gateway_kib: u64,
    pty_cycles: u64,
    exec_calls: u64,
    appended: u64,
}

const N_SOAK_PTY_WORKERS: usize = 4;
const N_SOAK_EXEC_WORKERS: usize = 4;
const N_SOAK_SESSIONS: usize = 2;
const N_SOAK_READERS: usize = 10;
const SOAK_EVENT_INTERVAL: Duration = Duration::from_millis(20);

/// Opens a shell, runs a command in it, reads its answer, deletes the session.
async fn pty_cycle(http: &reqwest::Client, base: &str) -> anyhow::Result<()> {
    let mut shell = open_shell(http, base).await?;
    shell
        .ws
        .send(Message::Binary(b"\0echo soak-$((6*7))\r".to_vec().into()))
        .await?;
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("soak-42") {
        match tokio::time::timeout(WAIT, shell.ws.next())
            .await
            .context("no answer within 60 s")?
        {
            Some(Ok(Message::Binary(frame))) => {
                seen.extend_from_slice(frame_payload(&frame).unwrap_or_default())
            }
            Some(Ok(_)) => {}
            Some(Err(error)) => return Err(error.into()),
            None => bail!("the session ended before its answer"),
        }
    }
    let _ = shell.ws.close(None).await;
    delete_pty(http, base, &shell.id).await
}

async fn soak(duration: Duration) -> anyhow::Result<()> {
    let data = std::env::temp_dir().join(format!("warren-bench-soak-{}", std::process::id()));
    let result = async {
        let execd = ExecdChild::start_with(&["--max-connections", "4096"]).await?;
        let gateway = match BenchGateway::start(gateway_args(&data)).await {
            Ok(gateway) => gateway,
            Err(error) => {
                execd.stop().await;
                return Err(error);
            }
        };
        let soaked = soak_on(&execd, &gateway, duration).await;
        let left = processes_left(&execd).await;
        gateway.stop().await;
        execd.stop().await;
        let rows = soaked?;
        println!("execd's processes left after the soak: {left}");
        print_table(&rows);
        anyhow::Ok(())
    }
    .await;
    let _ = std::fs::remove_dir_all(&data);
    result
}

async fn soak_on(
    execd: &ExecdChild,
    gateway: &BenchGateway,
    duration: Duration,
) -> anyhow::Result<Vec<Row>> {
    let http = http_client()?;
    let counts = Arc::new(SoakCounts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let epoch = Instant::now();
    let fleet =
        Arc::new(Fleet::start(gateway, "soak", N_SOAK_SESSIONS, N_SOAK_READERS, epoch).await?);

    let mut workers = Vec::new();
    for _ in 0..N_SOAK_PTY_WORKERS {
        let (http, base, counts, stop) = (
            http.clone(),
            execd.base.clone(),
            counts.clone(),
            stop.clone(),
        );
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match pty_cycle(&http, &base).await {
                    Ok(()) => counts.pty_cycles.fetch_add(1, Ordering::Relaxed),
                    Err(error) => {
                        eprintln!("PTY cycle failed: {error:#}");
                        counts.errors.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        }));
    }
    for worker in 0..N_SOAK_EXEC_WORKERS {
        let (http, base, counts, stop) = (
            http.clone(),
            execd.base.clone(),
            counts.clone(),
            stop.clone(),
        );
        let (cmd, expect) = if worker % 2 == 0 {
            ("echo hi", "hi")
        } else {
            ("sleep 0.2; echo done", "done")
        };
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match exec_call(&http, &base, cmd, expect).await {
                    Ok(_) => counts.exec_calls.fetch_add(1, Ordering::Relaxed),
                    Err(error) => {
                        eprintln!("exec call failed: {error:#}");
                        counts.errors.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        }));
    }
    let producer = {
        let (fleet, counts, stop) = (fleet.clone(), counts.clone(), stop.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SOAK_EVENT_INTERVAL);
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                for index in 0..N_SOAK_SESSIONS {
                    if fleet.append(index, epoch, &stop).await? {
                        counts.appended.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            anyhow::Ok(())
        })
    };

    let own_pid = std::process::id();
    let sample = |at: Duration| Sample {
        at,
        execd_kib: rss_kib(execd.pid).unwrap_or(0),
        gateway_kib: rss_kib(own_pid).unwrap_or(0),
        pty_cycles: counts.pty_cycles.load(Ordering::Relaxed),
        exec_calls: counts.exec_calls.load(Ordering::Relaxed),
        appended: counts.appended.load(Ordering::Relaxed),
    };
    let started = Instant::now();
    let mut samples = vec![sample(Duration::ZERO)];
    while started.elapsed() < duration {
        let next = SOAK_SAMPLE * samples.len() as u32;
        tokio::time::sleep(next.min(duration).saturating_sub(started.elapsed())).await;
        let now = sample(started.elapsed());
        eprintln!(
            "{:>6.0} s  execd {:>8}  gateway+clients {:>8}",
            now.at.as_secs_f64(),
            mib(now.execd_kib),
            mib(now.gateway_kib)
        );
        samples.push(now);
    }
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await?;
    }
    producer.await??;
    let fleet = Arc::into_inner(fleet).context("the producer still holds the readers")?;
    let (tally, expected) = fleet.finish().await?;

    println!(
        "Soak of {:.0} s, {} cores. {MACHINE_NOTE} The gateway runs in this process with the \
         clients, so its column is the whole bench process.\n",
        duration.as_secs_f64(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("| time | execd RSS | gateway (+ clients) RSS | PTY cycles | exec calls | events |");
    println!("|---|---|---|---|---|---|");
    for s in &samples {
        println!(
            "| {:.0} s | {} | {} | {} | {} | {} |",
            s.at.as_secs_f64(),
            mib(s.execd_kib),
            mib(s.gateway_kib),
            s.pty_cycles,
            s.exec_calls,
            s.appended
        );
    }
    println!();
    let verdict = |column: fn(&Sample) -> u64| {
        let start = column(&samples[0]);
        let end = column(&samples[samples.len() - 1]);
        let max = samples.iter().map(column).max().unwrap_or(0);
        format!(
            "start {} → end {} ({:+.1} MiB), max {}",
            mib(start),
            mib(end),
            (end as f64 - start as f64) / 1024.0,
            mib(max)
        )
    };
    Ok(vec![
        Row {
            measurement: "execd RSS".into(),
            result: verdict(|s| s.execd_kib),
            target: "flat",
        },
        Row {
            measurement: "gateway (+ clients) RSS".into(),
            result: verdict(|s| s.gateway_kib),
            target: "flat",
        },
        Row {
            measurement: "work done".into(),
            result: format!(
                "{} PTY sessions opened, used and deleted; {} exec calls; {} events to {} \
                 readers; errors: {}",
                counts.pty_cycles.load(Ordering::Relaxed),
                counts.exec_calls.load(Ordering::Relaxed),
                counts.appended.load(Ordering::Relaxed),
                N_SOAK_SESSIONS * N_SOAK_READERS,
                counts.errors.load(Ordering::Relaxed)
            ),
            target: "errors: 0",
        },
        Row {
            measurement: "SSE during the soak".into(),
            result: format!(
                "lost: {}, duplicated: {}, out of order: {} ({} resumed)",
                expected.saturating_sub(tally.delivered),
                tally.duplicated,
                tally.out_of_order,
                tally.reconnects
            ),
            target: "0, 0, 0",
        },
    ])
}
