//! The `warren` binary of this package as a child process: cargo builds it for these tests and
//! names it in `CARGO_BIN_EXE_warren`, wherever the target directory is. `warren execd`
//! children print their address first; tests stop them by pid.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Stdio};

use tokio::io::AsyncBufReadExt as _;
use warren_test_support::pty::Daemon;
use warren_test_support::{WAIT, try_within, within};

/// The `warren` binary under test.
pub fn warren() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_warren"))
}

/// `warren execd <args>` with warnings-only logging, no stdin, and stdout piped for the address
/// line.
pub fn execd_command(args: &[&str]) -> Command {
    let mut command = Command::new(warren());
    command
        .arg("execd")
        .args(args)
        .env("WARREN_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    command
}

/// The URL in execd's first line (`warren execd listening on http://...` or `unix:/...`).
pub fn listening_url(line: &str) -> String {
    line.trim()
        .strip_prefix("warren execd listening on ")
        .filter(|url| url.starts_with("http://") || url.starts_with("unix:/"))
        .unwrap_or_else(|| panic!("execd's address line, got {line:?}"))
        .to_owned()
}

/// Spawns `command` (an [`execd_command`]), killed if dropped, and waits for its address line.
pub async fn spawn_execd(command: Command) -> (tokio::process::Child, String) {
    let mut command = tokio::process::Command::from(command);
    let mut child = command
        .kill_on_drop(true)
        .spawn()
        .expect("spawns warren execd");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = within("execd's `listening on` line", lines.next_line())
        .await
        .expect("reads execd's stdout")
        .expect("execd exited before printing its address");
    (child, listening_url(&line))
}

/// Sends `signal` to `child` by its pid.
pub fn signal(child: &tokio::process::Child, signal: rustix::process::Signal) {
    let pid = child.id().expect("not yet reaped") as i32;
    let pid = rustix::process::Pid::from_raw(pid).expect("a valid pid");
    rustix::process::kill_process(pid, signal).expect("signals the child");
}

/// A `warren execd` child process; its stderr (the log) is collected when it is stopped.
pub struct ExecdProcess {
    pub child: tokio::process::Child,
    /// Where to reach it: 127.0.0.1 and the port it printed.
    pub daemon: Daemon,
}

impl ExecdProcess {
    /// `warren execd <args>` with `env` added; waits for its `listening on` line.
    pub async fn start(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut command = execd_command(args);
        command
            .env_remove("EXECD_ACCESS_TOKEN")
            .envs(env.iter().copied())
            .stderr(Stdio::piped());
        let (child, url) = spawn_execd(command).await;
        let port = url
            .rsplit_once(':')
            .map(|(_, port)| port.to_owned())
            .expect("an address with a port");
        let token = env
            .iter()
            .find(|(key, _)| *key == "EXECD_ACCESS_TOKEN")
            .map(|(_, value)| value.to_string());
        Self {
            child,
            daemon: Daemon::at(format!("http://127.0.0.1:{port}"), token),
        }
    }

    /// Sends `signal`, waits for a clean exit and returns what it logged.
    pub async fn stop_with(self, signal: rustix::process::Signal) -> String {
        self::signal(&self.child, signal);
        let output = tokio::time::timeout(WAIT, self.child.wait_with_output())
            .await
            .expect("execd exits in time after the signal")
            .expect("waits for execd");
        let log = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(
            output.status.success(),
            "execd exited {}: {log}",
            output.status
        );
        log
    }
}

/// A `warren execd` child on 127.0.0.1:0 with an access token; stopped with SIGTERM.
pub struct ExecdChild {
    child: tokio::process::Child,
    pub url: String,
    pub token: String,
}

impl ExecdChild {
    pub async fn start(token: &str, workdir: &Path) -> anyhow::Result<Self> {
        Self::start_on("127.0.0.1:0", token, workdir).await
    }

    /// On `listen` (`HOST:PORT` or `unix:/path`); `url` is what execd printed.
    pub async fn start_on(listen: &str, token: &str, workdir: &Path) -> anyhow::Result<Self> {
        let mut command = execd_command(&["--listen", listen, "--access-token", token]);
        command.arg("--root").arg(workdir).stderr(Stdio::inherit());
        let (child, url) = spawn_execd(command).await;
        Ok(Self {
            child,
            url,
            token: token.to_owned(),
        })
    }

    /// SIGTERM, then wait for execd to kill its sessions and exit.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        signal(&self.child, rustix::process::Signal::TERM);
        let status = try_within("execd to exit after SIGTERM", self.child.wait()).await??;
        anyhow::ensure!(status.success(), "execd exited with {status}");
        Ok(())
    }
}
