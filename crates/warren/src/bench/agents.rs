//! `warren bench agents`: the cost of what agents.md puts between an agent and its model, and
//! of starting the agent. A fake Anthropic upstream in this process answers `POST /v1/messages`
//! with an SSE stream (message_start, 20 text deltas of ~50 B, message_delta, message_stop,
//! flushed per event); an in-process gateway on 127.0.0.1:0 proxies to it. Measured: time to
//! the first body chunk (TTFT) and to the end of the body, direct against through the model
//! proxy with a session's `wm_` token, sequential (p50/p99) and 32 streams at once (wall time);
//! then the time from a session's first message to its `brain: ready` status with the shell
//! agent cold in bwrap hands and on the host with a warm pool. Prints one markdown table.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::StreamExt;
use serde_json::Value;
use warren_gateway::GatewayArgs;
use warren_gateway::config::BrainPlacement;
use warren_gateway::hands::local::IsolationMode;

use super::support::{BenchGateway, Row, ms, percentile, print_table};

const N_WARMUP: usize = 20;
const N_CALLS: usize = 300;
const N_STREAMS: usize = 32;
const N_CONCURRENT_CALLS: usize = 320;
const N_DELTAS: usize = 20;
const N_BRAIN_STARTS: usize = 5;
const APP_KEY: &str = "bench-app-key";

pub async fn run() -> anyhow::Result<()> {
    let data = std::env::temp_dir().join(format!("warren-bench-agents-{}", std::process::id()));
    std::fs::create_dir_all(&data)?;
    let result = bench(&data).await;
    for name in ["proxy", "hands", "warm-hands", "warm"] {
        let run_dir = data.join(name).join("run").join("hands");
        warren_gateway::hands::local::stop_left_hands_blocking(&run_dir);
    }
    let _ = std::fs::remove_dir_all(&data);
    print_table(&result?);
    Ok(())
}

async fn bench(data: &Path) -> anyhow::Result<Vec<Row>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let upstream = format!("http://{}", listener.local_addr()?);
    let app = axum::Router::new().route("/v1/messages", axum::routing::post(messages));
    // Without TCP_NODELAY each small event would wait for the reader's delayed ACK.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let upstream_server = tokio::spawn(async move { axum::serve(listener, app).await });
    let key_file = data.join("model-keys");
    std::fs::write(&key_file, "ANTHROPIC_API_KEY=sk-bench\n")?;

    let mut args = base_args(data.join("proxy"), BrainPlacement::Host, 0);
    args.model.model_key_file = Some(key_file);
    args.model.model_upstream = vec![
        warren_gateway::model_proxy::parse_upstream(&format!("anthropic={upstream}"))
            .map_err(anyhow::Error::msg)?,
    ];
    let gateway = BenchGateway::start(args).await?;
    let result = proxy_rows(&gateway, &upstream).await;
    gateway.stop().await;
    let mut rows = result?;

    let mut hands_args = base_args(data.join("hands"), BrainPlacement::Hands, 0);
    hands_args.hands_isolation = IsolationMode::Bwrap;
    rows.push(
        brain_start_row(
            hands_args,
            "new session (create; first message → `brain: ready`), shell agent cold in bwrap hands",
            "—",
        )
        .await,
    );
    let mut warm_hands = base_args(data.join("warm-hands"), BrainPlacement::Hands, 2);
    warm_hands.hands_isolation = IsolationMode::Bwrap;
    rows.push(
        brain_start_row(
            warm_hands,
            "new session (create; first message → `brain: ready`), shell agent in a warm bwrap sandbox",
            "handout < 50 ms",
        )
        .await,
    );
    rows.push(
        brain_start_row(
            base_args(data.join("warm"), BrainPlacement::Host, 2),
            "new session (create; first message → `brain: ready`), shell agent on the host, 2 warm workers",
            "handout < 50 ms",
        )
        .await,
    );
    upstream_server.abort();
    Ok(rows)
}

fn base_args(data: std::path::PathBuf, placement: BrainPlacement, warm: usize) -> GatewayArgs {
    let mut args = GatewayArgs::with_data(data);
    args.app_key = Some(APP_KEY.into());
    args.warm_workers = warm;
    args.brain_placement = Some(placement);
    args.agent = None; // the built-in shell agent
    args
}

/// The fake upstream's answer: an Anthropic message stream, one body chunk per event.
async fn messages(_body: axum::body::Bytes) -> axum::response::Response {
    let stream = futures_util::stream::unfold(sse_events().into_iter(), |mut events| async move {
        let event = events.next()?;
        // Pending once between events, so hyper flushes each one on its own.
        tokio::task::yield_now().await;
        Some((Ok::<_, std::convert::Infallible>(event), events))
    });
    axum::response::Response::builder()
        .header("content-type", "text/event-stream")
        .body(axum::body::Body::from_stream(stream))
        .expect("a valid response")
}

fn sse_events() -> Vec<String> {
    let event = |kind: &str, data: Value| format!("event: {kind}\ndata: {data}\n\n");
    let mut events = vec![event(
        "message_start",
        serde_json::json!({"type": "message_start", "message": {"id": "msg_bench",
            "type": "message", "role": "assistant", "model": "claude-bench", "content": [],
            "stop_reason": null, "usage": {"input_tokens": 12, "output_tokens": 1}}}),
    )];
    for n in 0..N_DELTAS {
        let text = format!("{n:02} the quick brown fox jumps over the lazy dog.");
        events.push(event(
            "content_block_delta",
            serde_json::json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": text}}),
        ));
    }
    events.push(event(
        "message_delta",
        serde_json::json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": N_DELTAS}}),
    ));
    events.push(event(
        "message_stop",
        serde_json::json!({"type": "message_stop"}),
    ));
    events
}

/// One streamed model call: (time to the first body chunk, time to the end of the body).
async fn call(http: &reqwest::Client, url: &str, key: &str) -> anyhow::Result<[Duration; 2]> {
    let body = serde_json::json!({"model": "claude-bench", "stream": true, "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}]});
    let started = Instant::now();
    let mut response = http
        .post(url)
        .header("x-api-key", key)
        .header("anthropic-version", "2023-06-01")
        .json(&body)
        .send()
        .await?
        .error_for_status()?;
    let (mut first, mut bytes) = (None, 0);
    while let Some(chunk) = response.chunk().await? {
        first.get_or_insert_with(|| started.elapsed());
        bytes += chunk.len();
    }
    let expected: usize = sse_events().iter().map(String::len).sum();
    anyhow::ensure!(bytes == expected, "{bytes} B streamed, {expected} B sent");
    Ok([first.context("an empty body")?, started.elapsed()])
}

fn p50_p99(samples: &mut [Duration]) -> [Duration; 2] {
    samples.sort();
    [percentile(samples, 0.5), percentile(samples, 0.99)]
}

fn signed_ms(a: Duration, b: Duration) -> String {
    format!("{:+.2} ms", (a.as_secs_f64() - b.as_secs_f64()) * 1000.0)
}

async fn proxy_rows(gateway: &BenchGateway, upstream: &str) -> anyhow::Result<Vec<Row>> {
    let token = gateway.register("bench-device-01").await?;
    let session = gateway.create_session(&token).await?;
    let model_token = gateway.gateway.engine.model.token(&session);
    let http = reqwest::Client::new();
    let direct = (format!("{upstream}/v1/messages"), "sk-bench".to_string());
    let proxied = (
        format!("{}/v1/model/anthropic/v1/messages", gateway.url),
        model_token,
    );
    // [direct, proxied] × [ttft, total], the two interleaved so drift hits both alike.
    let mut samples: [[Vec<Duration>; 2]; 2] = Default::default();
    for n in 0..N_WARMUP + N_CALLS {
        for (which, (url, key)) in [&direct, &proxied].into_iter().enumerate() {
            let times = call(&http, url, key).await?;
            if n >= N_WARMUP {
                samples[which][0].push(times[0]);
                samples[which][1].push(times[1]);
            }
        }
    }
    let [[d_ttft, d_total], [p_ttft, p_total]] =
        samples.map(|pair| pair.map(|mut s| p50_p99(&mut s)));
    let mut rows = Vec::new();
    for (label, [ttft, total]) in [
        ("direct to the upstream", [d_ttft, d_total]),
        ("through the model proxy", [p_ttft, p_total]),
    ] {
        rows.push(Row {
            measurement: format!("model call {label} ({N_CALLS} sequential, keep-alive)"),
            result: format!(
                "total p50 {} / p99 {}; TTFT p50 {} / p99 {}",
                ms(total[0]),
                ms(total[1]),
                ms(ttft[0]),
                ms(ttft[1])
            ),
            target: "—",
        });
    }
    for (label, direct, proxied) in [("total", d_total, p_total), ("TTFT", d_ttft, p_ttft)] {
        rows.push(Row {
            measurement: format!("proxy overhead, {label} (proxied − direct)"),
            result: format!(
                "p50 {} / p99 {} (×{:.2} at p50)",
                signed_ms(proxied[0], direct[0]),
                signed_ms(proxied[1], direct[1]),
                proxied[0].as_secs_f64() / direct[0].as_secs_f64()
            ),
            target: "streams without buffering",
        });
    }
    let direct_wall = concurrent(&http, &direct).await?;
    let proxied_wall = concurrent(&http, &proxied).await?;
    rows.push(Row {
        measurement: format!("{N_CONCURRENT_CALLS} model calls, {N_STREAMS} streams at once"),
        result: format!(
            "direct {} wall, proxied {} wall (×{:.2})",
            ms(direct_wall),
            ms(proxied_wall),
            proxied_wall.as_secs_f64() / direct_wall.as_secs_f64()
        ),
        target: "—",
    });
    Ok(rows)
}

/// Wall time of `N_CONCURRENT_CALLS` calls to `url`, `N_STREAMS` at a time.
async fn concurrent(
    http: &reqwest::Client,
    (url, key): &(String, String),
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let tasks: Vec<_> = (0..N_STREAMS)
        .map(|_| {
            let (http, url, key) = (http.clone(), url.clone(), key.clone());
            tokio::spawn(async move {
                for _ in 0..N_CONCURRENT_CALLS / N_STREAMS {
                    call(&http, &url, &key).await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(started.elapsed())
}

/// The row for `brain_starts`, or why it could not be measured.
async fn brain_start_row(args: GatewayArgs, what: &str, target: &'static str) -> Row {
    let outcome = tokio::time::timeout(Duration::from_secs(180), brain_starts(args)).await;
    let result = match outcome {
        Ok(Ok((mut created, mut ready))) => {
            created.sort();
            ready.sort();
            format!(
                "create p50 {} / max {}; ready p50 {} / max {} ({} sessions)",
                ms(percentile(&created, 0.5)),
                ms(created[created.len() - 1]),
                ms(percentile(&ready, 0.5)),
                ms(ready[ready.len() - 1]),
                ready.len()
            )
        }
        Ok(Err(e)) => format!("not measured: {e:#}"),
        Err(_) => "not measured: no `brain: ready` within 180 s".into(),
    };
    Row {
        measurement: what.into(),
        result,
        target,
    }
}

/// For `N_BRAIN_STARTS` new sessions: how long `POST /v1/sessions` took (a warm sandbox or
/// worker is handed out there), and `POST …/messages` `echo hi` → `status` `brain: ready`.
async fn brain_starts(args: GatewayArgs) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let warm = args.warm_workers;
    let gateway = BenchGateway::start(args).await?;
    let outcome = async {
        let token = gateway.register("bench-device-01").await?;
        let (mut created, mut samples) = (Vec::new(), Vec::new());
        for _ in 0..N_BRAIN_STARTS {
            if warm > 0 {
                let (pool, sandboxes) =
                    (&gateway.gateway.engine.pool, &gateway.gateway.engine.warm);
                let filled = match gateway.gateway.engine.agent.placement {
                    BrainPlacement::Host => pool.wait_ready(warm, Duration::from_secs(30)).await,
                    BrainPlacement::Hands => {
                        sandboxes.wait_ready(warm, Duration::from_secs(30)).await
                    }
                };
                anyhow::ensure!(filled, "the warm pool did not fill within 30 s");
            }
            let creating = Instant::now();
            let id = gateway.create_session(&token).await?;
            created.push(creating.elapsed());
            let events = events(&gateway, &token, &id).await?;
            let started = Instant::now();
            gateway
                .http
                .post(format!("{}/v1/sessions/{id}/messages", gateway.url))
                .bearer_auth(&token)
                .json(&serde_json::json!({"text": "echo hi"}))
                .send()
                .await?
                .error_for_status()?;
            until_brain_ready(events).await?;
            samples.push(started.elapsed());
            // Running brains count against the device's quota (4): end the session.
            (gateway
                .http
                .delete(format!("{}/v1/sessions/{id}", gateway.url)))
            .bearer_auth(&token)
            .send()
            .await?
            .error_for_status()?;
        }
        Ok((created, samples))
    }
    .await;
    gateway.stop().await;
    outcome
}

/// `GET /v1/sessions/{id}/events`, from the start of the session's log.
async fn events(
    gateway: &BenchGateway,
    token: &str,
    id: &str,
) -> anyhow::Result<reqwest::Response> {
    let url = format!("{}/v1/sessions/{id}/events", gateway.url);
    Ok(gateway
        .http
        .get(url)
        .bearer_auth(token)
        .send()
        .await?
        .error_for_status()?)
}

/// Reads a session's event stream line by line until its `status` event with `brain: ready`.
async fn until_brain_ready(response: reqwest::Response) -> anyhow::Result<()> {
    let mut body = response.bytes_stream();
    let (mut buffer, mut event) = (String::new(), String::new());
    loop {
        while let Some(end) = buffer.find('\n') {
            let line: String = buffer.drain(..=end).collect();
            if let Some(name) = line.strip_prefix("event:") {
                event = name.trim().to_string();
            } else if let Some(data) = line.strip_prefix("data:") {
                let data: Value = serde_json::from_str(data.trim())?;
                match event.as_str() {
                    "status" if data["brain"] == "ready" => return Ok(()),
                    "error" => anyhow::bail!("error event: {data}"),
                    _ => {}
                }
            }
        }
        let chunk = tokio::time::timeout(Duration::from_secs(60), body.next())
            .await
            .context("no event within 60 s")?
            .context("the event stream ended")??;
        buffer.push_str(&String::from_utf8_lossy(&chunk));
    }
}
