//! `warren bench compat`: starts `warren execd` in-process on 127.0.0.1:0 and times complete
//! OpenSandbox-style round trips over raw HTTP, the way `CommandsAdapter.run("true")` makes
//! them: `POST /command` and read the event stream to its end. Also times the argv form, a
//! bash-session run and a background start. Prints one markdown table with p50/p99.
//!
//! OpenSandbox's own daemon cannot go below about one second per foreground command (it sleeps
//! before closing every stream); Warren's target is a p50 under 10 ms.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};

use super::support::{InProcessExecd, ms};

const N_WARMUP: usize = 20;
const N_ROUND_TRIPS: usize = 300;
const TARGET_P50: Duration = Duration::from_millis(10);

struct Row {
    what: &'static str,
    samples: Vec<Duration>,
}

pub async fn run() -> anyhow::Result<()> {
    warren_process::reaper::start().context("becoming a subreaper")?;
    let root = std::env::temp_dir().join(format!("warren-bench-compat-{}", std::process::id()));
    std::fs::create_dir_all(&root)?;
    let config = warren_execd::Config {
        root: root.clone(),
        ..warren_execd::Config::default()
    };
    let execd = InProcessExecd::start(config).await?;
    let outcome = bench(&execd.base).await;
    // Ends the server, which kills what is left (the bench session's shell).
    let stopped = execd.stop().await;
    let _ = std::fs::remove_dir_all(&root);
    let rows = outcome?;

    println!("| round trip ({N_ROUND_TRIPS} runs, raw HTTP, one client) | p50 | p99 | mean |");
    println!("|---|---|---|---|");
    for row in &rows {
        let (p50, p99, mean) = stats(&row.samples);
        println!(
            "| {} | {} | {} | {} |",
            row.what,
            ms(p50),
            ms(p99),
            ms(mean)
        );
    }
    let (p50, _, _) = stats(&rows[0].samples);
    let verdict = if p50 < TARGET_P50 { "met" } else { "MISSED" };
    println!();
    println!(
        "Target: `POST /command` `true` p50 < {} ms ({verdict}); OpenSandbox execd needs >= 1000 ms.",
        TARGET_P50.as_millis()
    );
    stopped
}

async fn bench(base: &str) -> anyhow::Result<Vec<Row>> {
    let client = reqwest::Client::new();
    let command = |body: Value| {
        let client = client.clone();
        let url = format!("{base}/command");
        async move { stream_to_end(&client, &url, &body).await }
    };
    let mut rows = Vec::new();
    rows.push(Row {
        what: "`POST /command` `{\"command\":\"true\"}` to the final event",
        samples: time(|| command(json!({"command": "true"}))).await?,
    });
    rows.push(Row {
        what: "`POST /command` `{\"argv\":[\"true\"]}` (no shell)",
        samples: time(|| command(json!({"argv": ["true"]}))).await?,
    });
    rows.push(Row {
        what: "`POST /command` background `true` (start only)",
        samples: time(|| command(json!({"command": "true", "background": true}))).await?,
    });
    let created: Value = client
        .post(format!("{base}/session"))
        .send()
        .await?
        .json()
        .await?;
    let session = created["session_id"]
        .as_str()
        .context("session id")?
        .to_owned();
    let run_url = format!("{base}/session/{session}/run");
    rows.push(Row {
        what: "`POST /session/{id}/run` `true` (warm shell)",
        samples: time(|| {
            let client = client.clone();
            let url = run_url.clone();
            async move { stream_to_end(&client, &url, &json!({"command": "true"})).await }
        })
        .await?,
    });
    Ok(rows)
}

/// Sends the request and reads the stream until the server ends it; checks the last event.
async fn stream_to_end(client: &reqwest::Client, url: &str, body: &Value) -> anyhow::Result<()> {
    let response = client.post(url).json(body).send().await?;
    anyhow::ensure!(
        response.status().is_success(),
        "{url} answered {}",
        response.status()
    );
    let text = response.text().await?;
    let last = text.trim_end().rsplit("\n\n").next().unwrap_or_default();
    let event: Value =
        serde_json::from_str(last).with_context(|| format!("last event {last:?}"))?;
    anyhow::ensure!(
        event["type"] == "execution_complete",
        "unexpected final event {event}"
    );
    Ok(())
}

async fn time<F, Fut>(mut round_trip: F) -> anyhow::Result<Vec<Duration>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    for _ in 0..N_WARMUP {
        round_trip().await?;
    }
    let mut samples = Vec::with_capacity(N_ROUND_TRIPS);
    for _ in 0..N_ROUND_TRIPS {
        let started = Instant::now();
        round_trip().await?;
        samples.push(started.elapsed());
    }
    Ok(samples)
}

fn stats(samples: &[Duration]) -> (Duration, Duration, Duration) {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let at =
        |q: f64| sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1];
    let mean = sorted.iter().sum::<Duration>() / sorted.len().max(1) as u32;
    (at(0.50), at(0.99), mean)
}
