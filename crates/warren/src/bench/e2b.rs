//! `warren bench e2b`: the pinned `e2b` Python SDK (debug mode) against Warren's envd API,
//! served in process on 127.0.0.1:0, and side by side against any other envd URL given with
//! `--against` (an upstream envd, say). Measures `commands.run("true")` p50/p90, the echo
//! latency of one keystroke on a PTY (`send_stdin` until the stream delivers it) and a 64 MiB
//! `files.write` + `files.read` in MiB/s. The measuring script is `tests/python/e2b_bench.py`,
//! compiled in; it needs a python with `e2b==2.63.0` (`scripts/python-env.sh` makes one).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use super::support::percentile;

const SCRIPT: &str = include_str!("../../../../tests/python/e2b_bench.py");
const N_RUNS: usize = 100;

#[derive(Debug, clap::Args)]
pub struct E2bArgs {
    /// Another envd to measure the same way (e.g. `http://127.0.0.1:49983`).
    #[arg(long)]
    pub against: Vec<String>,
    /// A python with the `e2b` SDK (default: `target/warren-pyenv/bin/python` if present).
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// A directory the envd at `--against` can write 64 MiB into.
    #[arg(long, default_value = "/tmp")]
    pub against_dir: PathBuf,
}

struct Measured {
    target: String,
    run_p50: Duration,
    run_p90: Duration,
    key_p50: Duration,
    write_mib_s: f64,
    read_mib_s: f64,
}

pub async fn run(args: E2bArgs) -> anyhow::Result<()> {
    warren_process::reaper::start().context("becoming a subreaper")?;
    let python = args.python.clone().unwrap_or_else(|| {
        let venv = PathBuf::from("target/warren-pyenv/bin/python");
        if venv.exists() {
            venv
        } else {
            PathBuf::from("python3")
        }
    });
    let root = std::env::temp_dir().join(format!("warren-bench-e2b-{}", std::process::id()));
    std::fs::create_dir_all(&root)?;
    let root = std::fs::canonicalize(&root)?;
    let config = warren_execd::Config {
        root: root.clone(),
        ..warren_execd::Config::default()
    };
    let execd = warren_execd::Execd::new(config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(warren_execd::serve_listeners(
        execd,
        None,
        Some(listener.into()),
        async move {
            let _ = stopped.await;
        },
    ));
    let mut rows = Vec::new();
    let warren = measure(&python, "warren", &base, &root).await;
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(20), server).await;
    let _ = std::fs::remove_dir_all(&root);
    rows.push(warren?);
    for url in &args.against {
        rows.push(measure(&python, url, url, &args.against_dir).await?);
    }
    println!("| envd | run(\"true\") p50 | p90 | pty keystroke p50 | write 64 MiB | read 64 MiB |");
    println!("|---|---|---|---|---|---|");
    for row in rows {
        println!(
            "| {} | {:.1} ms | {:.1} ms | {:.2} ms | {:.0} MiB/s | {:.0} MiB/s |",
            row.target,
            row.run_p50.as_secs_f64() * 1000.0,
            row.run_p90.as_secs_f64() * 1000.0,
            row.key_p50.as_secs_f64() * 1000.0,
            row.write_mib_s,
            row.read_mib_s,
        );
    }
    Ok(())
}

async fn measure(
    python: &PathBuf,
    target: &str,
    url: &str,
    dir: &std::path::Path,
) -> anyhow::Result<Measured> {
    // Through warren-process like every spawn of Warren's: killed as a tree if this is dropped.
    let spec = warren_process::CommandSpec::new(python, &warren_process::TreeMarker::new())
        .arg("-c")
        .arg(SCRIPT)
        .arg(url)
        .arg(dir)
        .arg(N_RUNS.to_string());
    let options = warren_process::pipes::PipeOptions {
        stdin: warren_process::pipes::StdinMode::Null,
        output: warren_process::pipes::OutputMode::Separate,
        leader: warren_process::pipes::Leader::Session,
    };
    let mut child = warren_process::spawn(&spec, warren_process::Connect::Pipes(options))
        .with_context(|| format!("running {}", python.display()))?
        .into_pipes();
    let _guard = warren_process::TreeGuard::new(child.tree.clone(), Duration::from_secs(1), None);
    let mut stderr_pipe = child.stderr.take().context("stderr is a pipe")?;
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let status = tokio::time::timeout(Duration::from_secs(600), async {
        use tokio::io::AsyncReadExt as _;
        let (out, err) = tokio::join!(
            child.stdout.read_to_end(&mut stdout),
            stderr_pipe.read_to_end(&mut stderr)
        );
        out?;
        err?;
        child.child.wait().await
    })
    .await
    .context("the e2b bench script did not finish within 10 minutes")??;
    anyhow::ensure!(
        status.success(),
        "the e2b bench script failed against {url}: {}",
        String::from_utf8_lossy(&stderr)
    );
    let answer: serde_json::Value =
        serde_json::from_slice(&stdout).context("the e2b bench script printed no JSON")?;
    let samples = |key: &str| -> Vec<Duration> {
        let mut samples: Vec<Duration> = answer[key]
            .as_array()
            .map(|values| {
                values
                    .iter()
                    .filter_map(serde_json::Value::as_f64)
                    .map(|ms| Duration::from_secs_f64(ms / 1000.0))
                    .collect()
            })
            .unwrap_or_default();
        samples.sort();
        samples
    };
    let runs = samples("run_ms");
    let keys = samples("key_ms");
    anyhow::ensure!(
        !runs.is_empty() && !keys.is_empty(),
        "no samples from {url}"
    );
    let mib_s = |key: &str| 64.0 / answer[key].as_f64().unwrap_or(f64::INFINITY);
    Ok(Measured {
        target: target.to_owned(),
        run_p50: percentile(&runs, 0.5),
        run_p90: percentile(&runs, 0.9),
        key_p50: percentile(&keys, 0.5),
        write_mib_s: mib_s("write_s"),
        read_mib_s: mib_s("read_s"),
    })
}
