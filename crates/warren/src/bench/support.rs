//! What the benchmarks share: a `warren execd` child process to measure apart from the
//! benchmark's own process, an execd or a gateway served in process on 127.0.0.1:0,
//! percentiles, and the one markdown table every `warren bench` prints. No measurement lives
//! here.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use warren_gateway::{Gateway, GatewayArgs};

/// One line of a benchmark's table.
pub struct Row {
    pub measurement: String,
    pub result: String,
    pub target: &'static str,
}

/// Prints `rows` as a markdown table with measurement, result and target columns.
pub fn print_table(rows: &[Row]) {
    println!("| measurement | result | target |");
    println!("|---|---|---|");
    for row in rows {
        println!("| {} | {} | {} |", row.measurement, row.result, row.target);
    }
}

/// The sample at quantile `p` (0.0 to 1.0) of `sorted`, which must not be empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

pub fn ms(duration: Duration) -> String {
    format!("{:.2} ms", duration.as_secs_f64() * 1000.0)
}

/// Resident memory of process `pid` in KiB, from `/proc/<pid>/status`.
pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .context("no VmRSS line")
}

/// A `warren execd --listen 127.0.0.1:0` child process, so its memory and CPU are its own.
pub struct ExecdChild {
    child: warren_process::OwnedChild,
    tree: warren_process::TreeId,
    pub pid: u32,
    /// `http://127.0.0.1:<port>`, as execd printed it.
    pub base: String,
}

impl ExecdChild {
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(&[]).await
    }

    /// Starts one with `flags` after `--listen 127.0.0.1:0` (limits such as
    /// `--max-pty-sessions`).
    pub async fn start_with(flags: &[&str]) -> anyhow::Result<Self> {
        // `/proc/self/exe` still works when the binary was rebuilt (replaced) since it started.
        let spec =
            warren_process::CommandSpec::new("/proc/self/exe", &warren_process::TreeMarker::new())
                .args(["execd", "--listen", "127.0.0.1:0"])
                .args(flags.iter().copied())
                .env("WARREN_LOG", "warn");
        let options = warren_process::pipes::PipeOptions {
            stdin: warren_process::pipes::StdinMode::Null,
            output: warren_process::pipes::OutputMode::Merged,
            leader: warren_process::pipes::Leader::ProcessGroup,
        };
        let spawned =
            warren_process::spawn(&spec, warren_process::Connect::Pipes(options))?.into_pipes();
        let pid = spawned.pid();
        let tree = spawned.tree.clone();
        let child = spawned.child;
        let stdout = spawned.stdout;
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .context("execd did not print its address within 30 s")??
            .context("execd exited before printing its address")?;
        let base = first
            .rsplit_once("http://")
            .map(|(_, addr)| format!("http://{}", addr.trim()))
            .with_context(|| format!("unexpected first line from execd: {first}"))?;
        // Keep draining execd's stdout so it can never block on it.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Self {
            child,
            tree,
            pid,
            base,
        })
    }

    /// The live processes execd started and has not ended (its tree without itself).
    pub fn descendants(&self) -> Vec<i32> {
        let own = self.pid as i32;
        let mut members = warren_process::tree_members(&self.tree);
        members.retain(|pid| *pid != own);
        members
    }

    /// SIGTERM (execd kills every session's processes), then wait; SIGKILL after 30 s.
    pub async fn stop(mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.pid as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .is_err()
        {
            warren_process::kill_tree(&self.tree, Duration::ZERO).await;
            let _ = self.child.wait().await;
        }
    }
}

/// An execd served in this process on 127.0.0.1:0 until [`InProcessExecd::stop`].
pub struct InProcessExecd {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl InProcessExecd {
    pub async fn start(config: warren_execd::Config) -> anyhow::Result<Self> {
        let execd = warren_execd::Execd::new(config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(warren_execd::serve(execd, listener, async move {
            let _ = stopped.await;
        }));
        Ok(Self { base, stop, server })
    }

    /// Ends the server, which kills what is left of its sessions; waits up to 20 s for it.
    /// Idle keep-alive connections hold the graceful shutdown open: drop clients first.
    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(20), self.server)
            .await
            .context("execd did not shut down within 20 s")???;
        Ok(())
    }
}

/// A gateway served in this process on 127.0.0.1:0 until [`BenchGateway::stop`].
pub struct BenchGateway {
    pub gateway: Arc<Gateway>,
    /// Where it listens (127.0.0.1 and the port it got).
    pub addr: std::net::SocketAddr,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    pub http: reqwest::Client,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl BenchGateway {
    /// Opens the gateway on `args` (with `app_key` set, so devices can register) and serves it.
    pub async fn start(mut args: GatewayArgs) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        // As `warren gateway` does: agents and preview URLs name the real port.
        args.listen = listener.local_addr()?;
        let addr = args.listen;
        let gateway = Gateway::open(args).await?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(warren_gateway::serve(gateway.clone(), listener, async {
            let _ = stopped.await;
        }));
        Ok(Self {
            gateway,
            addr,
            url: format!("http://{addr}"),
            http: reqwest::Client::builder().no_proxy().build()?,
            stop,
            server,
        })
    }

    /// The way SIGTERM does, then stops the hands it left paused for a next gateway.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(20), self.server).await;
        let run_dir = self.gateway.args.data.join("run").join("hands");
        warren_gateway::hands::local::stop_left_hands_blocking(&run_dir);
    }

    /// `POST /v1/devices` with the gateway's app key: the device's token.
    pub async fn register(&self, device_id: &str) -> anyhow::Result<String> {
        let request = (self.http.post(format!("{}/v1/devices", self.url)))
            .header("X-App-Key", &self.gateway.app_key)
            .json(&serde_json::json!({"device_id": device_id}));
        let body = json_answer(request).await?;
        Ok(body["token"].as_str().context("token")?.to_string())
    }

    /// `POST /v1/sessions` as the device of `token`: the new session's id.
    pub async fn create_session(&self, token: &str) -> anyhow::Result<String> {
        let request = (self.http.post(format!("{}/v1/sessions", self.url))).bearer_auth(token);
        let body = json_answer(request).await?;
        Ok(body["id"].as_str().context("session id")?.to_string())
    }
}

/// Sends `request` and reads its successful answer as JSON.
pub async fn json_answer(request: reqwest::RequestBuilder) -> anyhow::Result<Value> {
    Ok(request.send().await?.error_for_status()?.json().await?)
}
