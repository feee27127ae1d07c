//! `warren bench window`: what the person's window into the hands (files, terminals, previews:
//! files-terminals-previews.md) costs over going to the hands directly. Starts a gateway in this
//! process with the built-in shell agent and local hands (`--hands-isolation auto`: bwrap where
//! it works, else none; `--hands-network host`, so a port in the hands is also reachable from
//! here), one device and one session whose first message starts the hands and a
//! `python3 -m http.server` in them. Measured, in one run and interleaved where both sides can
//! be: a 64 MiB download and upload through the files routes against the same bytes read from
//! and written (with fsync) to disk; the keystroke echo round trip of the session's `default`
//! terminal against a PTY session of the hands' own execd; and requests through a preview
//! against the same port directly. Prints one markdown table. It does not measure archived
//! (snapshot-served) downloads or preview WebSockets.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::{Sink, SinkExt, Stream, StreamExt};
use serde_json::json;
use tokio_tungstenite::tungstenite::{self, Message};
use warren_gateway::GatewayArgs;
use warren_gateway::config::BrainPlacement;
use warren_gateway::hands::local::{IsolationMode, NetworkMode};
use warren_protocol::pty::CreatePtyRequest;

use super::support::{BenchGateway, Row, json_answer, ms, percentile, print_table};

const CHUNK_BYTES: usize = 1024 * 1024;
const N_CHUNKS: usize = 64;
const FILE_BYTES: usize = CHUNK_BYTES * N_CHUNKS;
const SMALL_BYTES: usize = 1024;
const N_BEST_OF: usize = 3;
const N_WARMUP: usize = 10;
const N_KEYSTROKES: usize = 200;
const N_REQUESTS: usize = 200;
const PREVIEW_PORT: u16 = 8765;
const DEVICE_ID: &str = "bench-window-01";
/// How long one wait for the hands (a terminal's echo, the dev server coming up) may take.
const WAIT: Duration = Duration::from_secs(60);

pub async fn run() -> anyhow::Result<()> {
    let data = std::env::temp_dir().join(format!("warren-bench-window-{}", std::process::id()));
    std::fs::create_dir_all(&data)?;
    let result = bench(&data).await;
    // A gateway that failed to start or stop cleanly leaves its sandboxes here.
    let run_dir = data.join("gateway").join("run").join("hands");
    warren_gateway::hands::local::stop_left_hands_blocking(&run_dir);
    let _ = std::fs::remove_dir_all(&data);
    let (isolation, rows) = result?;
    println!("hands isolation: {isolation}");
    print_table(&rows);
    Ok(())
}

async fn bench(data: &Path) -> anyhow::Result<(String, Vec<Row>)> {
    let mut args = GatewayArgs::with_data(data.join("gateway"));
    args.app_key = Some("bench-app-key".into());
    args.agent = None; // the built-in shell agent
    args.brain_placement = Some(BrainPlacement::Host);
    args.warm_workers = 0;
    args.hands_isolation = IsolationMode::Auto;
    args.hands_network = NetworkMode::Host;
    // Nothing here may find the hands paused halfway.
    args.hands_idle_pause = Duration::from_secs(600);
    let gateway = BenchGateway::start(args).await?;
    let outcome = measure(&gateway, data).await;
    gateway.stop().await;
    outcome
}

/// The session the rows are measured on, its hands running.
struct Window<'a> {
    gateway: &'a BenchGateway,
    token: String,
    /// `http://127.0.0.1:<port>/v1/sessions/<id>`.
    session_url: String,
    session: std::sync::Arc<warren_gateway::session::Session>,
    workspace: PathBuf,
}

async fn measure(gateway: &BenchGateway, data: &Path) -> anyhow::Result<(String, Vec<Row>)> {
    let token = gateway.register(DEVICE_ID).await?;
    let id = gateway.create_session(&token).await?;
    let session = (gateway.gateway.engine.sessions.by_id(&id)).context("the new session")?;
    let window = Window {
        gateway,
        session_url: format!("{}/v1/sessions/{id}", gateway.url),
        token,
        session,
        workspace: (gateway.gateway.args.data)
            .join("sessions")
            .join(&id)
            .join("workspace"),
    };
    window.start_dev_server().await?;
    let isolation = window.session.hands.isolation().label().to_string();
    write_file(window.workspace.join("big.bin")).await?;
    std::fs::write(window.workspace.join("small.txt"), small_body())?;
    let rows = vec![
        window.download_row().await?,
        window.upload_row(&data.join("write-baseline.bin")).await?,
        window.terminal_row().await?,
        window.preview_latency_row().await?,
        window.preview_throughput_row().await?,
    ];
    Ok((isolation, rows))
}

impl Window<'_> {
    /// The first message: the shell agent starts the hands and a dev server in the workspace,
    /// which is then waited for on its port.
    async fn start_dev_server(&self) -> anyhow::Result<()> {
        let text = format!(
            "setsid nohup python3 -m http.server {PREVIEW_PORT} --bind 127.0.0.1 >/dev/null 2>&1 & echo started"
        );
        let request = (self.gateway.http)
            .post(format!("{}/messages", self.session_url))
            .bearer_auth(&self.token)
            .json(&json!({"text": text}));
        request.send().await?.error_for_status()?;
        let direct = format!("http://127.0.0.1:{PREVIEW_PORT}/");
        let deadline = Instant::now() + WAIT;
        loop {
            match self.gateway.http.get(&direct).send().await {
                Ok(answer) if answer.status().is_success() => return Ok(()),
                _ if Instant::now() > deadline => {
                    anyhow::bail!(
                        "the dev server in the hands did not answer on {direct} within 60 s"
                    )
                }
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    fn content_url(&self, path: &str) -> String {
        format!("{}/files/content?path={path}", self.session_url)
    }

    async fn download_row(&self) -> anyhow::Result<Row> {
        let big = self.workspace.join("big.bin");
        read_file(big.clone()).await?; // into the page cache, for both sides
        let (mut through, mut disk) = (Duration::MAX, Duration::MAX);
        for _ in 0..N_BEST_OF {
            let request = (self.gateway.http)
                .get(self.content_url("big.bin"))
                .bearer_auth(&self.token);
            through = through.min(download(request).await?);
            disk = disk.min(read_file(big.clone()).await?);
        }
        Ok(Row {
            measurement: format!(
                "download {} MiB: `GET …/files/content` vs reading the file from disk (page cache, best of {N_BEST_OF})",
                N_CHUNKS
            ),
            result: rates("gateway", through, "disk", disk),
            target: "streams; ≥ 100 MiB/s",
        })
    }

    async fn upload_row(&self, baseline: &Path) -> anyhow::Result<Row> {
        let (mut through, mut disk) = (Duration::MAX, Duration::MAX);
        for _ in 0..N_BEST_OF {
            through = through.min(self.upload().await?);
            disk = disk.min(write_file(baseline.to_path_buf()).await?);
        }
        // The upload scheduled a snapshot of the workspace: take it now, so that it does not
        // run under the latency rows.
        self.session.hands.snapshot().await;
        Ok(Row {
            measurement: format!(
                "upload {} MiB: `PUT …/files/content` (1 MiB chunks) vs writing a file + fsync (best of {N_BEST_OF})",
                N_CHUNKS
            ),
            result: rates("gateway", through, "disk", disk),
            target: "streams; ≥ 100 MiB/s",
        })
    }

    /// One streamed 64 MiB `PUT` of `up.bin`.
    async fn upload(&self) -> anyhow::Result<Duration> {
        let chunks =
            futures_util::stream::iter((0..N_CHUNKS).map(|_| Ok::<_, std::io::Error>(chunk())));
        let started = Instant::now();
        let request = (self.gateway.http)
            .put(self.content_url("up.bin"))
            .bearer_auth(&self.token)
            .body(reqwest::Body::wrap_stream(chunks));
        let answer = json_answer(request).await?;
        let elapsed = started.elapsed();
        anyhow::ensure!(
            answer["size"] == FILE_BYTES,
            "the upload answered {answer}, not {FILE_BYTES} bytes"
        );
        Ok(elapsed)
    }

    async fn terminal_row(&self) -> anyhow::Result<Row> {
        let url = format!(
            "{}/terminals/default/ws?access_token={}",
            self.session_url.replacen("http://", "ws://", 1),
            self.token
        );
        let (mut through, _) = tokio_tungstenite::connect_async(url)
            .await
            .context("the session's default terminal")?;
        let client = self.session.hands.endpoint().await?.client()?;
        let pty = client.create_pty(&CreatePtyRequest::default()).await?;
        let mut direct = client.connect_pty(&pty.session_id, "").await?;
        wait_for_shell(&mut through).await?;
        wait_for_shell(&mut direct).await?;
        let (mut through_times, mut direct_times) = (Vec::new(), Vec::new());
        for n in 0..N_WARMUP + N_KEYSTROKES {
            let key = b'a' + (n % 26) as u8;
            let (t, d) = (
                keystroke(&mut through, key).await?,
                keystroke(&mut direct, key).await?,
            );
            if n >= N_WARMUP {
                through_times.push(t);
                direct_times.push(d);
            }
        }
        let _ = through.close(None).await;
        let _ = direct.close(None).await;
        let _ = client.delete_pty(&pty.session_id).await;
        Ok(Row {
            measurement: format!(
                "keystroke echo round trip, {N_KEYSTROKES} keys: terminal WS through the gateway vs execd's PTY WS directly"
            ),
            result: latencies(&mut through_times, &mut direct_times),
            target: "adds < 1 ms at p50",
        })
    }

    /// `POST /previews` for the dev server: its URL and a client that sends its host to the
    /// gateway, as a browser resolves `*.localhost`.
    async fn preview(&self) -> anyhow::Result<(String, reqwest::Client)> {
        let request = (self.gateway.http)
            .post(format!("{}/previews", self.session_url))
            .bearer_auth(&self.token)
            .json(&json!({"port": PREVIEW_PORT}));
        let created = json_answer(request).await?;
        let url = created["url"].as_str().context("the preview's url")?;
        let host = (url.trim_start_matches("http://").split([':', '/']).next())
            .context("the preview url's host")?;
        let client = reqwest::Client::builder()
            .no_proxy()
            .resolve(host, self.gateway.addr)
            .build()?;
        Ok((url.trim_end_matches('/').to_string(), client))
    }

    async fn preview_latency_row(&self) -> anyhow::Result<Row> {
        let (preview, preview_client) = self.preview().await?;
        let direct = format!("http://127.0.0.1:{PREVIEW_PORT}");
        let (mut through_times, mut direct_times) = (Vec::new(), Vec::new());
        for n in 0..N_WARMUP + N_REQUESTS {
            let t = get_small(&preview_client, &format!("{preview}/small.txt")).await?;
            let d = get_small(&self.gateway.http, &format!("{direct}/small.txt")).await?;
            if n >= N_WARMUP {
                through_times.push(t);
                direct_times.push(d);
            }
        }
        Ok(Row {
            measurement: format!(
                "{N_REQUESTS} sequential GETs of a {SMALL_BYTES} B file: through a preview vs the port directly (http.server: HTTP/1.0, a connection each)"
            ),
            result: latencies(&mut through_times, &mut direct_times),
            target: "adds < 2 ms at p50",
        })
    }

    async fn preview_throughput_row(&self) -> anyhow::Result<Row> {
        let (preview, preview_client) = self.preview().await?;
        let direct = format!("http://127.0.0.1:{PREVIEW_PORT}/big.bin");
        let (mut through, mut straight) = (Duration::MAX, Duration::MAX);
        for _ in 0..N_BEST_OF {
            let request = preview_client.get(format!("{preview}/big.bin"));
            through = through.min(download(request).await?);
            straight = straight.min(download(self.gateway.http.get(&direct)).await?);
        }
        Ok(Row {
            measurement: format!(
                "download {N_CHUNKS} MiB from the dev server: through a preview vs the port directly (best of {N_BEST_OF})"
            ),
            result: rates("preview", through, "direct", straight),
            target: "streams; ≥ 100 MiB/s",
        })
    }
}

/// 1 MiB of pseudo-random (incompressible) bytes, the same for every chunk written or sent.
fn chunk() -> &'static [u8] {
    static CHUNK: OnceLock<Vec<u8>> = OnceLock::new();
    CHUNK.get_or_init(|| {
        let mut state = 0x9E37_79B9_7F4A_7C15_u64;
        (0..CHUNK_BYTES / 8)
            .flat_map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state.to_le_bytes()
            })
            .collect()
    })
}

fn small_body() -> Vec<u8> {
    b"the quick brown fox jumps over the lazy dog.\n"
        .iter()
        .copied()
        .cycle()
        .take(SMALL_BYTES)
        .collect()
}

/// How long writing [`FILE_BYTES`] of [`chunk`]s to `path` and fsyncing it takes.
async fn write_file(path: PathBuf) -> anyhow::Result<Duration> {
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let started = Instant::now();
        let mut file = std::fs::File::create(&path)?;
        for _ in 0..N_CHUNKS {
            file.write_all(chunk())?;
        }
        file.sync_all()?;
        Ok(started.elapsed())
    })
    .await?
}

/// How long reading all of `path` takes, 1 MiB at a time.
async fn read_file(path: PathBuf) -> anyhow::Result<Duration> {
    tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let started = Instant::now();
        let mut file = std::fs::File::open(&path)?;
        let mut buffer = vec![0u8; CHUNK_BYTES];
        let mut n_read = 0;
        loop {
            match file.read(&mut buffer)? {
                0 => break,
                n => n_read += n,
            }
        }
        let elapsed = started.elapsed();
        anyhow::ensure!(n_read == FILE_BYTES, "read {n_read} of {FILE_BYTES} bytes");
        Ok(elapsed)
    })
    .await?
}

/// How long `request` takes to answer with all of a [`FILE_BYTES`] body, counted as it
/// streams.
async fn download(request: reqwest::RequestBuilder) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut answer = request.send().await?.error_for_status()?;
    let mut n_read = 0;
    while let Some(chunk) = answer.chunk().await? {
        n_read += chunk.len();
    }
    let elapsed = started.elapsed();
    anyhow::ensure!(
        n_read == FILE_BYTES,
        "downloaded {n_read} of {FILE_BYTES} bytes"
    );
    Ok(elapsed)
}

async fn get_small(http: &reqwest::Client, url: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let body = http
        .get(url)
        .send()
        .await?
        .error_for_status()?
        .bytes()
        .await?;
    let elapsed = started.elapsed();
    anyhow::ensure!(body.len() == SMALL_BYTES, "{url}: {} bytes", body.len());
    Ok(elapsed)
}

fn mib_per_s(elapsed: Duration) -> f64 {
    FILE_BYTES as f64 / (1024.0 * 1024.0) / elapsed.as_secs_f64()
}

/// `a 123 MiB/s, b 456 MiB/s (a/b ×0.27)`.
fn rates(a: &str, a_time: Duration, b: &str, b_time: Duration) -> String {
    let (a_rate, b_rate) = (mib_per_s(a_time), mib_per_s(b_time));
    format!(
        "{a} {a_rate:.0} MiB/s, {b} {b_rate:.0} MiB/s ({a}/{b} ×{:.2})",
        a_rate / b_rate
    )
}

/// p50 and p99 of both, and what the first adds at p50.
fn latencies(through: &mut [Duration], direct: &mut [Duration]) -> String {
    through.sort();
    direct.sort();
    let (t50, d50) = (percentile(through, 0.5), percentile(direct, 0.5));
    format!(
        "through p50 {} / p99 {}; direct p50 {} / p99 {}; adds {:+.2} ms at p50 (×{:.2})",
        ms(t50),
        ms(percentile(through, 0.99)),
        ms(d50),
        ms(percentile(direct, 0.99)),
        (t50.as_secs_f64() - d50.as_secs_f64()) * 1000.0,
        t50.as_secs_f64() / d50.as_secs_f64()
    )
}

/// Waits for the `connected` frame and then for a shell that runs what it is sent.
async fn wait_for_shell<S>(socket: &mut S) -> anyhow::Result<()>
where
    S: Stream<Item = Result<Message, tungstenite::Error>>
        + Sink<Message, Error = tungstenite::Error>
        + Unpin,
{
    loop {
        match next_frame(socket).await? {
            Message::Text(text) if text.contains("\"connected\"") => break,
            Message::Text(text) => anyhow::bail!("before `connected`: {text}"),
            _ => {}
        }
    }
    // The quotes keep the echoed command line from matching: only the output does.
    socket
        .send(Message::binary(b"\0echo RE''ADY\r".to_vec()))
        .await?;
    until_output(socket, b"READY").await
}

/// Sends `key` as stdin and times until the terminal prints it back.
async fn keystroke<S>(socket: &mut S, key: u8) -> anyhow::Result<Duration>
where
    S: Stream<Item = Result<Message, tungstenite::Error>>
        + Sink<Message, Error = tungstenite::Error>
        + Unpin,
{
    let started = Instant::now();
    socket.send(Message::binary(vec![0x00, key])).await?;
    until_output(socket, &[key]).await?;
    Ok(started.elapsed())
}

/// Reads output (`0x01` frames) until it holds `needle`.
async fn until_output<S>(socket: &mut S, needle: &[u8]) -> anyhow::Result<()>
where
    S: Stream<Item = Result<Message, tungstenite::Error>> + Unpin,
{
    let mut output = Vec::new();
    while !output.windows(needle.len()).any(|window| window == needle) {
        match next_frame(socket).await? {
            Message::Binary(frame) if frame.first() == Some(&0x01) => {
                output.extend_from_slice(&frame[1..])
            }
            Message::Text(text) if !text.contains("\"pong\"") => {
                anyhow::bail!("waiting for {:?}: {text}", String::from_utf8_lossy(needle))
            }
            Message::Close(close) => anyhow::bail!("the terminal closed: {close:?}"),
            _ => {}
        }
    }
    Ok(())
}

async fn next_frame<S>(socket: &mut S) -> anyhow::Result<Message>
where
    S: Stream<Item = Result<Message, tungstenite::Error>> + Unpin,
{
    Ok(tokio::time::timeout(WAIT, socket.next())
        .await
        .context("no frame from the terminal within 60 s")?
        .context("the terminal's socket ended")??)
}
