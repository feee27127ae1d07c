//! `warren bench phone`: the console's first load on a phone's slow link (400 ms latency,
//! 400 kbit/s each way). Starts a real `warren serve` (this executable, its data in a
//! temporary directory, on 127.0.0.1:0, no warm hands, an app key of its own) in a process
//! group of its own, then measures:
//!
//! - compression: every file of the app shell (the URLs its `/sw.js` names) fetched once with
//!   `Accept-Encoding: identity` and once with `gzip`, the bytes of each on the wire;
//! - the first load in headless Chromium at a phone's size, throttled through the DevTools
//!   protocol with the HTTP cache off, `--runs` times cold (a new profile, no service worker)
//!   and warm (the second visit, its service worker installed): bytes by resource, first
//!   paint, DOMContentLoaded and time to interactive (the sign-in form's input visible and
//!   editable, which the page's main module shows); and once cold without compression
//!   (`Accept-Encoding: identity`), what gzip saves on that link. The measuring script is
//!   `tests/python/console/bench_first_load.py`, compiled in; it runs on the pinned Python of
//!   `scripts/python-env.sh` (Playwright, driving `/usr/bin/chromium`).
//!
//! Targets: a first load under 300 KB compressed, interactive in under 5 s cold on that link.
//! A bench reports; it fails nothing. The gateway's process group is stopped by its PID
//! (SIGTERM, its tree killed after 20 s) and its data directory removed; every wait is bounded.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

use super::support::{Row, print_table};

const SCRIPT: &str = include_str!("../../../../tests/python/console/bench_first_load.py");
/// The app key of the benchmark's gateway (nothing registers with it).
const APP_KEY: &str = "bench-phone-app-key";
/// How long the gateway may take to print its address, and to stop.
const GATEWAY_WAIT: Duration = Duration::from_secs(30);
/// How long `scripts/python-env.sh` may take (it installs the pinned packages once).
const PYTHON_ENV_WAIT: Duration = Duration::from_secs(1200);
/// The targets (issue: "first load < 300 KB compressed, interactive < 5 s cold").
const TARGET_BYTES: f64 = 300_000.0;
const TARGET_INTERACTIVE_MS: f64 = 5_000.0;

#[derive(Debug, clap::Args)]
pub struct PhoneArgs {
    /// Loads of each kind, cold and warm.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub runs: u32,
    /// A python with Playwright (default: the one `scripts/python-env.sh` prints).
    #[arg(long)]
    pub python: Option<PathBuf>,
}

pub async fn run(args: PhoneArgs) -> anyhow::Result<()> {
    warren_process::reaper::start().context("becoming a subreaper")?;
    let python = match args.python.clone() {
        Some(python) => python,
        None => pinned_python().await?,
    };
    let data = std::env::temp_dir().join(format!("warren-bench-phone-{}", std::process::id()));
    std::fs::create_dir_all(&data)?;
    let gateway = Serve::start(&data).await?;
    let measured = async {
        let compression = compression(&gateway.url).await?;
        let loads = first_loads(&python, &gateway.url, args.runs).await?;
        anyhow::Ok((compression, loads))
    }
    .await;
    gateway.stop().await;
    let _ = std::fs::remove_dir_all(&data);
    let (compression, loads) = measured?;
    println!(
        "Chromium {}, 390x844 mobile, {} loads of each kind, 400 ms latency, 50,000 bytes/s each way, HTTP cache off",
        loads["chromium"].as_str().unwrap_or("?"),
        args.runs
    );
    print_table(&rows(&compression, &loads)?);
    Ok(())
}

/// A `warren serve` child in a process group of its own (its PID is the group's).
struct Serve {
    child: warren_process::OwnedChild,
    tree: warren_process::TreeId,
    pid: u32,
    /// `http://127.0.0.1:<port>`, as it printed it.
    url: String,
}

impl Serve {
    async fn start(data: &Path) -> anyhow::Result<Serve> {
        // `/proc/self/exe` still works when the binary was rebuilt (replaced) since it started.
        let spec =
            warren_process::CommandSpec::new("/proc/self/exe", &warren_process::TreeMarker::new())
                .args(["serve", "--listen", "127.0.0.1:0", "--warm-workers", "0"])
                .arg("--data")
                .arg(data)
                .env("WARREN_LOG", "warn")
                .env("WARREN_APP_KEY", APP_KEY);
        let options = warren_process::pipes::PipeOptions {
            stdin: warren_process::pipes::StdinMode::Null,
            output: warren_process::pipes::OutputMode::Merged,
            leader: warren_process::pipes::Leader::ProcessGroup,
        };
        let spawned = warren_process::spawn(&spec, warren_process::Connect::Pipes(options))
            .context("starting warren serve")?
            .into_pipes();
        let pid = spawned.pid();
        let tree = spawned.tree.clone();
        let mut lines = BufReader::new(spawned.stdout).lines();
        let serve = Serve {
            child: spawned.child,
            tree,
            pid,
            url: String::new(),
        };
        let first = match tokio::time::timeout(GATEWAY_WAIT, lines.next_line()).await {
            Ok(Ok(Some(line))) => line,
            outcome => {
                serve.stop().await;
                bail!("warren serve printed no address within {GATEWAY_WAIT:?}: {outcome:?}");
            }
        };
        let Some(url) = first
            .strip_prefix("warren gateway listening on ")
            .filter(|url| url.starts_with("http://"))
            .map(|url| url.trim().to_owned())
        else {
            serve.stop().await;
            bail!("unexpected first line from warren serve (is WARREN_TLS_CERT set?): {first}");
        };
        // Keep draining its output so it can never block on it.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Serve { url, ..serve })
    }

    /// SIGTERM to its process group, then wait; its tree is killed after [`GATEWAY_WAIT`].
    async fn stop(mut self) {
        let group = i32::try_from(self.pid).unwrap_or(0);
        if let Err(error) = warren_process::signal_group(group, rustix::process::Signal::TERM) {
            tracing::warn!(pid = self.pid, %error, "cannot signal the gateway's group");
        }
        if tokio::time::timeout(GATEWAY_WAIT, self.child.wait())
            .await
            .is_err()
        {
            warren_process::kill_tree(&self.tree, Duration::ZERO).await;
            let _ = tokio::time::timeout(GATEWAY_WAIT, self.child.wait()).await;
        }
    }
}

/// The app shell's bytes on the wire, uncompressed and as the gateway sends them to a client
/// that takes gzip.
struct Compression {
    n_files: usize,
    identity_bytes: u64,
    gzip_bytes: u64,
}

async fn compression(url: &str) -> anyhow::Result<Compression> {
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()?;
    let worker = http
        .get(format!("{url}/sw.js"))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    let shell = worker
        .lines()
        .find_map(|line| line.strip_prefix("const WARREN_SHELL = "))
        .and_then(|line| line.strip_suffix(';'))
        .context("no WARREN_SHELL line in /sw.js")?;
    let shell: Value = serde_json::from_str(shell).context("the WARREN_SHELL line")?;
    let files: Vec<&str> = shell["files"]
        .as_array()
        .context("the shell's files")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let mut measured = Compression {
        n_files: files.len(),
        identity_bytes: 0,
        gzip_bytes: 0,
    };
    for file in files {
        for (encoding, total) in [
            ("identity", &mut measured.identity_bytes),
            ("gzip", &mut measured.gzip_bytes),
        ] {
            // reqwest here decodes nothing: the body is what crossed the wire.
            let body = http
                .get(format!("{url}{file}"))
                .header("accept-encoding", encoding)
                .send()
                .await?
                .error_for_status()?
                .bytes()
                .await?;
            *total += body.len() as u64;
        }
    }
    Ok(measured)
}

/// The pinned Python: what `scripts/python-env.sh` prints (it makes the environment once).
async fn pinned_python() -> anyhow::Result<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/python-env.sh");
    let script = if script.is_file() {
        script
    } else {
        PathBuf::from("scripts/python-env.sh")
    };
    if !script.is_file() {
        bail!("no scripts/python-env.sh here: run from the repository, or pass --python");
    }
    let (status, stdout, stderr) = run_bounded(&script, &[], PYTHON_ENV_WAIT)
        .await
        .context("scripts/python-env.sh")?;
    if !status.success() {
        bail!(
            "scripts/python-env.sh failed: {}",
            String::from_utf8_lossy(&stderr)
        );
    }
    let path = String::from_utf8_lossy(&stdout).trim().to_owned();
    anyhow::ensure!(!path.is_empty(), "scripts/python-env.sh printed no path");
    Ok(PathBuf::from(path))
}

/// Runs `program` with `args` in a session of its own, killed as a tree when this returns;
/// its status, stdout and stderr, within `limit`.
async fn run_bounded(
    program: &Path,
    args: &[&str],
    limit: Duration,
) -> anyhow::Result<(std::process::ExitStatus, Vec<u8>, Vec<u8>)> {
    let spec = warren_process::CommandSpec::new(program, &warren_process::TreeMarker::new())
        .args(args.iter().copied());
    let options = warren_process::pipes::PipeOptions {
        stdin: warren_process::pipes::StdinMode::Null,
        output: warren_process::pipes::OutputMode::Separate,
        leader: warren_process::pipes::Leader::Session,
    };
    let mut child = warren_process::spawn(&spec, warren_process::Connect::Pipes(options))
        .with_context(|| format!("running {}", program.display()))?
        .into_pipes();
    let _guard = warren_process::TreeGuard::new(child.tree.clone(), Duration::from_secs(1), None);
    let mut stderr_pipe = child.stderr.take().context("stderr is a pipe")?;
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let status = tokio::time::timeout(limit, async {
        let (out, err) = tokio::join!(
            child.stdout.read_to_end(&mut stdout),
            stderr_pipe.read_to_end(&mut stderr)
        );
        out?;
        err?;
        child.child.wait().await
    })
    .await
    .with_context(|| format!("{} did not finish within {limit:?}", program.display()))??;
    Ok((status, stdout, stderr))
}

/// The script's measurements: `{"chromium", "cold": [load, …], "warm": [load, …]}`.
async fn first_loads(python: &Path, url: &str, runs: u32) -> anyhow::Result<Value> {
    let runs_text = runs.to_string();
    // Each load takes seconds on the throttled link; a browser that hangs ends the run.
    let limit = Duration::from_secs(60 + 120 * u64::from(runs));
    let (status, stdout, stderr) = run_bounded(
        python,
        &["-c", SCRIPT, "--url", url, "--runs", &runs_text],
        limit,
    )
    .await?;
    anyhow::ensure!(
        status.success(),
        "the first-load script failed: {}",
        String::from_utf8_lossy(&stderr)
    );
    serde_json::from_slice(&stdout).context("the first-load script printed no JSON")
}

/// The median of `values` (not empty).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

fn kb(bytes: f64) -> String {
    format!("{:.1} KB", bytes / 1000.0)
}

/// The table: compression, then each kind of load (medians, with every run), then the bytes
/// of each resource of the first cold load.
fn rows(compression: &Compression, loads: &Value) -> anyhow::Result<Vec<Row>> {
    let mut rows = vec![Row {
        measurement: format!(
            "app shell ({} files) on the wire, uncompressed → gzip",
            compression.n_files
        ),
        result: format!(
            "{} → {} ({:.0} %)",
            kb(compression.identity_bytes as f64),
            kb(compression.gzip_bytes as f64),
            100.0 * compression.gzip_bytes as f64 / compression.identity_bytes.max(1) as f64
        ),
        target: "compressed",
    }];
    for kind in ["cold", "warm"] {
        let runs = loads[kind]
            .as_array()
            .filter(|runs| !runs.is_empty())
            .with_context(|| format!("no {kind} loads"))?;
        let series =
            |key: &str| -> Option<Vec<f64>> { runs.iter().map(|run| run[key].as_f64()).collect() };
        let cold = kind == "cold";
        let mut bytes = series("bytes").context("bytes")?;
        let n_network = runs[0]["n_network"].as_u64().unwrap_or(0);
        let n_requests = runs[0]["n_requests"].as_u64().unwrap_or(0);
        let bytes_median = median(&mut bytes);
        rows.push(Row {
            measurement: format!("{kind} load: bytes on the wire (median of {})", runs.len()),
            result: if cold {
                format!(
                    "{} in {n_network} requests ({:.2} of the target)",
                    kb(bytes_median),
                    bytes_median / TARGET_BYTES
                )
            } else {
                format!(
                    "{} ({n_network} of {n_requests} requests over the network, the rest from the service worker's cache)",
                    kb(bytes_median)
                )
            },
            target: if cold { "< 300 KB" } else { "" },
        });
        for (key, what) in [
            ("first_paint_ms", "first paint"),
            ("dom_content_loaded_ms", "DOMContentLoaded"),
            (
                "interactive_ms",
                "time to interactive (sign-in input editable)",
            ),
        ] {
            let Some(mut values) = series(key) else {
                rows.push(Row {
                    measurement: format!("{kind} load: {what}"),
                    result: "not reported".to_owned(),
                    target: "",
                });
                continue;
            };
            let each: Vec<String> = values
                .iter()
                .map(|ms| format!("{:.2}", ms / 1000.0))
                .collect();
            let middle = median(&mut values);
            let interactive = key == "interactive_ms";
            let ratio = if interactive && cold {
                format!("; {:.2} of the target", middle / TARGET_INTERACTIVE_MS)
            } else {
                String::new()
            };
            rows.push(Row {
                measurement: format!("{kind} load: {what}"),
                result: format!("{:.2} s (runs {}{ratio})", middle / 1000.0, each.join(", ")),
                target: if interactive && cold { "< 5 s" } else { "" },
            });
        }
    }
    // What compression saves on the same link: cold loads that refuse it.
    if let Some(runs) = loads["uncompressed"]
        .as_array()
        .filter(|runs| !runs.is_empty())
    {
        let series =
            |key: &str| -> Vec<f64> { runs.iter().filter_map(|run| run[key].as_f64()).collect() };
        let (mut bytes, mut interactive) = (series("bytes"), series("interactive_ms"));
        if !bytes.is_empty() && !interactive.is_empty() {
            rows.push(Row {
                measurement: format!(
                    "cold load without compression (`Accept-Encoding: identity`, median of {})",
                    runs.len()
                ),
                result: format!(
                    "{}, interactive at {:.2} s",
                    kb(median(&mut bytes)),
                    median(&mut interactive) / 1000.0
                ),
                target: "",
            });
        }
    }
    let first_cold = loads["cold"][0]["resources"]
        .as_array()
        .context("the first cold load's resources")?;
    for resource in first_cold {
        let path = resource["path"].as_str().unwrap_or("?");
        let bytes = resource["bytes"].as_f64().unwrap_or(0.0);
        let encoding = resource["encoding"].as_str().unwrap_or("");
        rows.push(Row {
            measurement: format!("cold load: `{path}`"),
            result: if encoding.is_empty() {
                kb(bytes)
            } else {
                format!("{} ({encoding})", kb(bytes))
            },
            target: "",
        });
    }
    Ok(rows)
}
