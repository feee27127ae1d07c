//! `warren bench exec`: what the exec tools cost, measured in one run and printed as one
//! markdown table.
//!
//! 1. Overhead of `exec_command("true")` through the HTTP API next to a direct spawn (warren_process) of the
//!    same command line (`bash -lc true`) in the same run (target: < 3 ms extra at p50).
//! 2. Output pipeline throughput on 100 MiB of progress-bar output: capture + render in process,
//!    and end to end through a real execd (target: >= 200 MiB/s).
//! 3. Peak RSS of a separate `warren execd` process while a command prints 1 GiB (target: flat,
//!    < 50 MiB growth).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};

use super::support::{ExecdChild, InProcessExecd, Row, ms, percentile, print_table, rss_kib};

const N_OVERHEAD_RUNS: usize = 200;
const PIPELINE_BYTES: usize = 100 * 1024 * 1024;
const BIG_OUTPUT_BYTES: u64 = 1024 * 1024 * 1024;
const MIB: f64 = 1024.0 * 1024.0;

pub async fn run() -> anyhow::Result<()> {
    warren_process::reaper::start().context("becoming a subreaper")?;
    let mut rows = Vec::new();
    overhead(&mut rows, true)
        .await
        .context("measuring exec overhead")?;
    // Without the login profile the shell starts in a few ms, so the engine's own cost is not
    // hidden in the profile's run-to-run variance.
    overhead(&mut rows, false)
        .await
        .context("measuring exec overhead without a login shell")?;
    pipeline_in_process(&mut rows);
    let daemon = Daemon::start().await.context("starting warren execd")?;
    let result = async {
        pipeline_end_to_end(&daemon, &mut rows)
            .await
            .context("measuring end-to-end throughput")?;
        daemon_memory(&daemon, &mut rows)
            .await
            .context("measuring daemon memory")
    }
    .await;
    daemon.stop().await;
    result?;

    print_table(&rows);
    Ok(())
}

/// Exec through an in-process execd on 127.0.0.1:0 versus a direct spawn, interleaved so both
/// see the same machine load.
async fn overhead(rows: &mut Vec<Row>, login: bool) -> anyhow::Result<()> {
    let flag = if login { "-lc" } else { "-c" };
    let execd = InProcessExecd::start(warren_execd::Config::default()).await?;
    let url = format!("{}/v1/exec", execd.base);
    let http = reqwest::Client::new();
    let mut via_http = Vec::with_capacity(N_OVERHEAD_RUNS);
    let mut direct = Vec::with_capacity(N_OVERHEAD_RUNS);
    for i in 0..N_OVERHEAD_RUNS + 10 {
        let started = Instant::now();
        let body: Value = http
            .post(&url)
            .json(&json!({"cmd": "true", "login": login, "yield_time_ms": 30000}))
            .send()
            .await?
            .json()
            .await?;
        let http_time = started.elapsed();
        anyhow::ensure!(
            body["exit_code"] == 0,
            "exec_command(\"true\") failed: {body}"
        );

        let started = Instant::now();
        let spec = warren_process::CommandSpec::new("bash", &warren_process::TreeMarker::new())
            .args([flag, "true"]);
        let options = warren_process::pipes::PipeOptions {
            stdin: warren_process::pipes::StdinMode::Null,
            ..warren_process::pipes::PipeOptions::default()
        };
        let mut child = warren_process::spawn(&spec, warren_process::Connect::Pipes(options))?
            .into_pipes()
            .child;
        let status = child.wait().await?;
        let direct_time = started.elapsed();
        anyhow::ensure!(status.success(), "bash {flag} true failed");
        if i >= 10 {
            // The first runs warm caches and the connection pool.
            via_http.push(http_time);
            direct.push(direct_time);
        }
    }
    // Idle keep-alive connections would hold the graceful shutdown open.
    drop(http);
    execd.stop().await?;
    via_http.sort();
    direct.sort();
    let (http_p50, direct_p50) = (percentile(&via_http, 0.5), percentile(&direct, 0.5));
    let login_note = if login { "" } else { ", `login: false`" };
    rows.push(Row {
        measurement: format!(
            "`exec_command(\"true\"{login_note})` via HTTP, p50 / p90 ({N_OVERHEAD_RUNS} runs)"
        ),
        result: format!("{} / {}", ms(http_p50), ms(percentile(&via_http, 0.9))),
        target: "",
    });
    rows.push(Row {
        measurement: format!("direct spawn (warren_process) of `bash {flag} true`, p50 / p90"),
        result: format!("{} / {}", ms(direct_p50), ms(percentile(&direct, 0.9))),
        target: "",
    });
    let extra = http_p50.as_secs_f64() - direct_p50.as_secs_f64();
    rows.push(Row {
        measurement: format!("exec overhead at p50 (HTTP minus direct, `bash {flag}`)"),
        result: format!("{:.2} ms", extra * 1000.0),
        target: "< 3 ms",
    });
    Ok(())
}

/// `N%` progress-bar redraws with a newline every 100 updates, like a long download.
fn progress_bar_bytes(n_bytes: usize) -> Vec<u8> {
    let mut data = Vec::with_capacity(n_bytes + 128);
    let mut i = 0usize;
    while data.len() < n_bytes {
        let percent = i % 101;
        let bar = "#".repeat(percent / 5);
        data.extend_from_slice(
            format!(
                "\r\x1b[32m{percent:3}%\x1b[0m [{bar:<20}] {i} items, 12.3 MB/s ETA 0:{:02}",
                i % 60
            )
            .as_bytes(),
        );
        if percent == 100 {
            data.push(b'\n');
        }
        i += 1;
    }
    data.truncate(n_bytes);
    data
}

fn pipeline_in_process(rows: &mut Vec<Row>) {
    let data = progress_bar_bytes(PIPELINE_BYTES);
    let options = warren_output::RenderOptions::default();
    let started = Instant::now();
    let mut capture = warren_output::HeadTailCapture::new(1024 * 1024);
    for chunk in data.chunks(64 * 1024) {
        capture.push(chunk);
    }
    let rendered = warren_output::render_chunk(&capture.take(false), options);
    let elapsed = started.elapsed();
    std::hint::black_box(rendered);
    rows.push(Row {
        measurement: "pipeline (capture + clean + fold), 100 MiB progress bars, in process".into(),
        result: format!(
            "{:.0} MiB/s",
            PIPELINE_BYTES as f64 / MIB / elapsed.as_secs_f64()
        ),
        target: ">= 200 MiB/s",
    });

    // Cleaning alone on uncapped input: what rendering costs where it does run.
    let sample = &data[..16 * 1024 * 1024];
    let text = String::from_utf8_lossy(sample);
    let started = Instant::now();
    let cleaned = warren_output::clean::clean_terminal(&text, 24, 80);
    let elapsed = started.elapsed();
    std::hint::black_box(cleaned);
    rows.push(Row {
        measurement: "terminal cleaning alone, 16 MiB progress bars (no capture cap)".into(),
        result: format!("{:.0} MiB/s", 16.0 / elapsed.as_secs_f64()),
        target: "",
    });
}

/// A `warren execd` child process, so its memory is measured apart from the benchmark's.
struct Daemon {
    execd: ExecdChild,
    http: reqwest::Client,
    scratch: PathBuf,
}

impl Daemon {
    async fn start() -> anyhow::Result<Self> {
        let scratch =
            std::env::temp_dir().join(format!("warren-bench-exec-{}", std::process::id()));
        std::fs::create_dir_all(&scratch)?;
        let execd = ExecdChild::start().await?;
        Ok(Self {
            execd,
            http: reqwest::Client::new(),
            scratch,
        })
    }

    /// Runs `cmd` to completion through `/v1/exec`, polling while it runs.
    async fn run_to_exit(&self, cmd: &str) -> anyhow::Result<Value> {
        let mut body: Value = self
            .http
            .post(format!("{}/v1/exec", self.execd.base))
            .json(&json!({"cmd": cmd, "yield_time_ms": 30000, "max_output_tokens": 2000}))
            .send()
            .await?
            .json()
            .await?;
        while body["status"] != "exited" {
            let id = body["session_id"]
                .as_u64()
                .with_context(|| format!("no session id in {body}"))?;
            body = self
                .http
                .post(format!("{}/v1/exec/{id}/stdin", self.execd.base))
                .json(&json!({"yield_time_ms": 30000, "max_output_tokens": 2000}))
                .send()
                .await?
                .json()
                .await?;
        }
        Ok(body)
    }

    /// The daemon's resident memory in KiB (0 once it is gone).
    fn rss_kib(&self) -> u64 {
        rss_kib(self.execd.pid).unwrap_or(0)
    }

    async fn stop(self) {
        drop(self.http);
        self.execd.stop().await;
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

async fn pipeline_end_to_end(daemon: &Daemon, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let file = daemon.scratch.join("progress.txt");
    std::fs::write(&file, progress_bar_bytes(PIPELINE_BYTES))?;
    let cmd = format!("cat '{}'", file.display());
    let started = Instant::now();
    let body = daemon.run_to_exit(&cmd).await?;
    let elapsed = started.elapsed();
    anyhow::ensure!(body["exit_code"] == 0, "cat failed: {body}");
    rows.push(Row {
        measurement: "100 MiB progress bars end to end (`cat` via execd HTTP)".into(),
        result: format!(
            "{:.0} MiB/s",
            PIPELINE_BYTES as f64 / MIB / elapsed.as_secs_f64()
        ),
        target: ">= 200 MiB/s",
    });
    Ok(())
}

async fn daemon_memory(daemon: &Daemon, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let baseline = daemon.rss_kib();
    let cmd = format!(
        "yes 'a typical log line of about sixty bytes, repeated forever' | head -c {BIG_OUTPUT_BYTES}"
    );
    let started = Instant::now();
    let run = daemon.run_to_exit(&cmd);
    tokio::pin!(run);
    let mut peak = baseline;
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let body = loop {
        tokio::select! {
            body = &mut run => break body?,
            _ = tick.tick() => peak = peak.max(daemon.rss_kib()),
        }
    };
    peak = peak.max(daemon.rss_kib());
    let elapsed = started.elapsed();
    anyhow::ensure!(body["exit_code"] == 0, "1 GiB command failed: {body}");
    rows.push(Row {
        measurement: format!(
            "execd RSS while a command prints 1 GiB ({:.1} s, {:.0} MiB/s)",
            elapsed.as_secs_f64(),
            BIG_OUTPUT_BYTES as f64 / MIB / elapsed.as_secs_f64()
        ),
        result: format!(
            "{:.1} MiB -> peak {:.1} MiB (+{:.1} MiB)",
            baseline as f64 / 1024.0,
            peak as f64 / 1024.0,
            peak.saturating_sub(baseline) as f64 / 1024.0
        ),
        target: "< 50 MiB growth",
    });
    Ok(())
}
