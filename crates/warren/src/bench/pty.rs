//! `warren bench pty`: what PTY sessions cost, measured in one run against a separate
//! `warren execd` process on 127.0.0.1:0 and printed as one markdown table.
//!
//! 1. Throughput of `head -c 256M /dev/zero | tr '\0' x` through a session to a WebSocket
//!    client, PTY mode and pipe mode, next to reading the same command from a local PTY in this
//!    process (the floor). Target: ratio >= 0.5.
//! 2. Keystroke echo round trip: one stdin byte to its echo from `cat` on a raw-mode terminal,
//!    p50 and p99. Target: p50 <= 150 µs on loopback.
//! 3. Holder throughput with 8 reading viewers and with 1 viewer that never reads, as ratios to
//!    no viewers (medians of 3 interleaved rounds). Targets: >= 0.8 and >= 0.95.
//! 4. Resident memory of the daemon per idle session: 200 sessions whose shell printed its
//!    prompt, holders still connected. Target: < 100 KiB (the shells are other processes).
//!
//! The daemon runs as its own process so its memory and CPU are its own; the clients share
//! this process's runtime.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio_tungstenite::tungstenite::Message;

use super::support::{ExecdChild, Row, percentile, print_table, rss_kib};

const STREAM_BYTES: u64 = 256 * 1024 * 1024;
const STREAM_COMMAND: &str = "head -c 256M /dev/zero | tr '\\0' x";
const N_ECHOES: usize = 2000;
const N_IDLE_SESSIONS: usize = 200;
const FAN_OUT_ROUNDS: usize = 3;
const WAIT: Duration = Duration::from_secs(120);
const MIB: f64 = 1024.0 * 1024.0;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub async fn run() -> anyhow::Result<()> {
    warren_process::reaper::start().context("becoming a subreaper")?;
    let mut rows = Vec::new();

    // The best of three, so a busy moment on the machine does not flatter the ratios below.
    let mut floor: f64 = 0.0;
    for _ in 0..3 {
        floor = floor.max(local_pty_floor().await.context("reading a local PTY")?);
    }
    rows.push(Row {
        measurement: "local PTY read of the command (floor, best of 3)".into(),
        result: mib_per_s(floor),
        target: "–",
    });

    let daemon = Daemon::start().await.context("starting warren execd")?;
    let measured = async {
        for (measurement, query) in [
            ("session → WebSocket, PTY mode", ""),
            ("session → WebSocket, pipe mode", "pty=0"),
        ] {
            let rate = daemon
                .stream_throughput(Stream {
                    query,
                    ..Stream::ALONE
                })
                .await?;
            rows.push(Row {
                measurement: measurement.into(),
                result: format!("{} ({:.2} of floor)", mib_per_s(rate), rate / floor),
                target: "≥ 0.5 of floor",
            });
        }
        let (p50, p99) = daemon.echo_round_trip().await.context("measuring echo")?;
        rows.push(Row {
            measurement: "keystroke echo round trip p50 / p99".into(),
            result: format!("{} / {}", micros(p50), micros(p99)),
            target: "p50 ≤ 150 µs",
        });
        // Interleaved rounds, median of each: other load on the machine hits all three alike.
        let (mut alone, mut with_readers, mut with_stuck) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..FAN_OUT_ROUNDS {
            // Gated: viewers attach first, and the clock starts when the command is let go.
            let gated = Stream {
                gated: true,
                ..Stream::ALONE
            };
            alone.push(daemon.stream_throughput(gated).await?);
            with_readers.push(
                daemon
                    .stream_throughput(Stream {
                        n_reading_viewers: 8,
                        ..gated
                    })
                    .await?,
            );
            with_stuck.push(
                daemon
                    .stream_throughput(Stream {
                        n_stuck_viewers: 1,
                        ..gated
                    })
                    .await?,
            );
        }
        let (alone, with_readers, with_stuck) =
            (median(alone), median(with_readers), median(with_stuck));
        rows.push(Row {
            measurement: "holder with 8 reading viewers / no viewers".into(),
            result: format!(
                "{:.2} ({} vs {})",
                with_readers / alone,
                mib_per_s(with_readers),
                mib_per_s(alone)
            ),
            target: "≥ 0.8",
        });
        rows.push(Row {
            measurement: "holder with 1 viewer that never reads / no viewers".into(),
            result: format!(
                "{:.2} ({} vs {})",
                with_stuck / alone,
                mib_per_s(with_stuck),
                mib_per_s(alone)
            ),
            target: "≥ 0.95",
        });
        anyhow::Ok(())
    }
    .await;
    daemon.stop().await;
    measured?;

    let fresh = Daemon::start()
        .await
        .context("starting warren execd for the memory run")?;
    let memory = fresh.idle_session_memory().await;
    fresh.stop().await;
    let per_session = memory.context("measuring idle session memory")?;
    rows.push(Row {
        measurement: "daemon RSS per idle session (200 shells with a prompt)".into(),
        result: format!("{:.1} KiB", per_session / 1024.0),
        target: "< 100 KiB",
    });

    print_table(&rows);
    Ok(())
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn mib_per_s(bytes_per_s: f64) -> String {
    format!("{:.0} MiB/s", bytes_per_s / MIB)
}

fn micros(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

/// Bytes per second reading the stream command straight from a PTY master in this process.
async fn local_pty_floor() -> anyhow::Result<f64> {
    use warren_process::CommandSpec;
    use warren_process::pty::PtySize;
    let command = CommandSpec::new("bash", &warren_process::TreeMarker::new())
        .arg("-c")
        .arg(STREAM_COMMAND);
    let started = Instant::now();
    let mut spawned =
        warren_process::spawn(&command, warren_process::Connect::Pty(PtySize::DEFAULT))?.into_pty();
    let mut buf = vec![0u8; 64 * 1024];
    let mut n_bytes = 0u64;
    loop {
        match spawned.reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n_bytes += n as u64,
        }
    }
    let elapsed = started.elapsed();
    spawned.child.wait().await?;
    if n_bytes != STREAM_BYTES {
        bail!("the local PTY delivered {n_bytes} bytes, expected {STREAM_BYTES}");
    }
    Ok(n_bytes as f64 / elapsed.as_secs_f64())
}

/// One run of the stream command through a session.
#[derive(Clone, Copy)]
struct Stream {
    /// The holder's attach query: `""` for PTY mode, `"pty=0"` for pipe mode.
    query: &'static str,
    /// Viewers that read everything.
    n_reading_viewers: usize,
    /// Viewers that attach and then never read.
    n_stuck_viewers: usize,
    /// The command waits for a line on stdin so viewers can attach first; the clock starts
    /// when that line is sent.
    gated: bool,
}

impl Stream {
    const ALONE: Stream = Stream {
        query: "",
        n_reading_viewers: 0,
        n_stuck_viewers: 0,
        gated: false,
    };
}

struct Daemon {
    execd: ExecdChild,
    http: reqwest::Client,
}

impl Daemon {
    async fn start() -> anyhow::Result<Self> {
        let execd = ExecdChild::start().await?;
        Ok(Self {
            execd,
            http: reqwest::Client::new(),
        })
    }

    async fn stop(self) {
        self.execd.stop().await;
    }

    async fn create(&self, body: Value) -> anyhow::Result<String> {
        let response = self
            .http
            .post(format!("{}/pty", self.execd.base))
            .json(&body)
            .send()
            .await?;
        let answer: Value = response.json().await?;
        answer["session_id"]
            .as_str()
            .map(str::to_string)
            .with_context(|| format!("no session_id in {answer}"))
    }

    async fn delete(&self, id: &str) -> anyhow::Result<()> {
        self.http
            .delete(format!("{}/pty/{id}", self.execd.base))
            .send()
            .await?;
        Ok(())
    }

    async fn connect(&self, id: &str, query: &str) -> anyhow::Result<Ws> {
        let url = format!(
            "{}/pty/{id}/ws?{query}",
            self.execd.base.replacen("http://", "ws://", 1)
        );
        let (ws, _) = tokio_tungstenite::connect_async_with_config(url, None, true).await?;
        Ok(ws)
    }

    /// Streams the 256 MiB command through a holder and returns bytes per second at the holder.
    async fn stream_throughput(&self, stream: Stream) -> anyhow::Result<f64> {
        let command = if stream.gated {
            format!("read -r _; {STREAM_COMMAND}")
        } else {
            STREAM_COMMAND.to_string()
        };
        let id = self.create(json!({"command": command})).await?;
        let mut started = Instant::now();
        let mut holder = self.connect(&id, stream.query).await?;
        wait_connected(&mut holder).await?;
        let mut readers = Vec::new();
        for _ in 0..stream.n_reading_viewers {
            let mut viewer = self.connect(&id, "mode=viewer").await?;
            wait_connected(&mut viewer).await?;
            readers.push(tokio::spawn(drain(viewer)));
        }
        let mut stuck = Vec::new();
        for _ in 0..stream.n_stuck_viewers {
            let mut viewer = self.connect(&id, "mode=viewer").await?;
            wait_connected(&mut viewer).await?;
            // Never read again while the stream runs.
            stuck.push(viewer);
        }
        if stream.gated {
            started = Instant::now();
            holder
                .send(Message::Binary(vec![0u8, b'\n'].into()))
                .await?;
        }
        let n_bytes = tokio::time::timeout(WAIT, count_until_exit(&mut holder))
            .await
            .context("stream timed out")??;
        let elapsed = started.elapsed();
        for reader in readers {
            let _ = reader.await;
        }
        drop(stuck);
        self.delete(&id).await?;
        if n_bytes < STREAM_BYTES {
            bail!(
                "the holder got {n_bytes} bytes, expected at least {STREAM_BYTES} (was it disconnected as too slow?)"
            );
        }
        Ok(n_bytes as f64 / elapsed.as_secs_f64())
    }

    /// p50 and p99 of one stdin byte to its echo by `cat` on a raw, non-echoing terminal.
    async fn echo_round_trip(&self) -> anyhow::Result<(Duration, Duration)> {
        let id = self
            .create(json!({"command": "stty raw -echo; printf READY; exec cat"}))
            .await?;
        let mut holder = self.connect(&id, "").await?;
        let mut seen = Vec::new();
        while !String::from_utf8_lossy(&seen).contains("READY") {
            match next_binary(&mut holder).await? {
                Some(frame) => seen.extend_from_slice(frame_payload(&frame)),
                None => bail!("the echo session ended before it was ready"),
            }
        }
        let mut samples = Vec::with_capacity(N_ECHOES);
        for i in 0..N_ECHOES + 100 {
            let key = b'a' + (i % 26) as u8;
            let started = Instant::now();
            holder.send(Message::Binary(vec![0u8, key].into())).await?;
            loop {
                match next_binary(&mut holder).await? {
                    Some(frame) if frame_payload(&frame).contains(&key) => break,
                    Some(_) => {}
                    None => bail!("the echo session ended"),
                }
            }
            // The first 100 round trips warm up caches and the connection.
            if i >= 100 {
                samples.push(started.elapsed());
            }
        }
        self.delete(&id).await?;
        samples.sort();
        Ok((percentile(&samples, 0.50), percentile(&samples, 0.99)))
    }

    /// Daemon RSS growth per session for [`N_IDLE_SESSIONS`] sessions whose shell printed a
    /// prompt, holders connected.
    async fn idle_session_memory(&self) -> anyhow::Result<f64> {
        // One warm-up session so lazily built daemon state is not charged to the 200.
        let mut warm = self.start_idle_session().await?;
        let before = rss_bytes(self.execd.pid)?;
        let mut holders = Vec::with_capacity(N_IDLE_SESSIONS);
        for _ in 0..N_IDLE_SESSIONS {
            holders.push(self.start_idle_session().await?);
        }
        let after = rss_bytes(self.execd.pid)?;
        let _ = warm.close(None).await;
        for holder in &mut holders {
            let _ = holder.close(None).await;
        }
        Ok((after.saturating_sub(before)) as f64 / N_IDLE_SESSIONS as f64)
    }

    async fn start_idle_session(&self) -> anyhow::Result<Ws> {
        let id = self.create(json!({})).await?;
        let mut holder = self.connect(&id, "").await?;
        let mut seen = Vec::new();
        // Interactive bash prints `bash-5.2# ` (or `$ `): wait for the prompt's end.
        while !(seen.ends_with(b"# ") || seen.ends_with(b"$ ")) {
            match tokio::time::timeout(WAIT, next_binary(&mut holder))
                .await
                .context("no prompt")??
            {
                Some(frame) => seen.extend_from_slice(frame_payload(&frame)),
                None => bail!("the idle session ended before its prompt"),
            }
        }
        Ok(holder)
    }
}

fn rss_bytes(pid: u32) -> anyhow::Result<u64> {
    Ok(rss_kib(pid)? * 1024)
}

/// Output bytes in a binary frame: live frames carry 1 header byte, replay frames 9.
fn frame_payload(frame: &[u8]) -> &[u8] {
    match frame.first() {
        Some(3) if frame.len() >= 9 => &frame[9..],
        Some(_) => &frame[1..],
        None => frame,
    }
}

/// The next binary frame; `None` once the session reports its exit or the socket closes.
async fn next_binary(ws: &mut Ws) -> anyhow::Result<Option<Vec<u8>>> {
    loop {
        match ws.next().await {
            Some(Ok(Message::Binary(bytes))) => return Ok(Some(bytes.to_vec())),
            Some(Ok(Message::Text(text))) => {
                let frame: Value = serde_json::from_str(text.as_str())?;
                if frame["type"] == "exit" {
                    return Ok(None);
                }
                if frame["type"] == "error" {
                    bail!("error frame: {frame}");
                }
            }
            Some(Ok(Message::Close(_))) | None => return Ok(None),
            Some(Ok(_)) => {}
            Some(Err(error)) => return Err(error.into()),
        }
    }
}

async fn wait_connected(ws: &mut Ws) -> anyhow::Result<()> {
    loop {
        match tokio::time::timeout(WAIT, ws.next())
            .await
            .context("no connected frame")?
        {
            Some(Ok(Message::Text(text))) if text.as_str().contains("\"connected\"") => {
                return Ok(());
            }
            Some(Ok(Message::Text(text))) if text.as_str().contains("\"error\"") => {
                bail!("attach failed: {text}")
            }
            Some(Ok(_)) => {}
            Some(Err(error)) => return Err(error.into()),
            None => bail!("closed before connected"),
        }
    }
}

/// Output bytes the holder receives until the exit frame.
async fn count_until_exit(ws: &mut Ws) -> anyhow::Result<u64> {
    let mut n_bytes = 0u64;
    while let Some(frame) = next_binary(ws).await? {
        n_bytes += frame_payload(&frame).len() as u64;
    }
    Ok(n_bytes)
}

/// Reads a viewer until its session ends.
async fn drain(mut ws: Ws) -> u64 {
    let mut n_bytes = 0;
    while let Some(Ok(message)) = ws.next().await {
        if let Message::Binary(bytes) = message {
            n_bytes += bytes.len() as u64;
        }
    }
    n_bytes
}
