//! The two servers under test, each the real `warren` binary as a child process: `warren execd`
//! (with its E2B listener) on a temp root, and `warren gateway` with no agent that can start.
//! Each is killed by its pid when dropped; its log goes to a file the report can quote.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::AsyncBufReadExt as _;
use warren_test_support::within;

use crate::wire::{self, Request};

/// The access token execd runs with.
pub const EXECD_TOKEN: &str = "matrix-execd-token";
/// The gateway's app key and admin token.
pub const APP_KEY: &str = "matrix-app-key";
pub const ADMIN_TOKEN: &str = "matrix-admin-token";

/// What a file outside execd's root holds: no answer may ever contain it.
pub const OUTSIDE_SECRET: &str = "OUTSIDE-THE-ROOT-7f3a9c";
/// What `hello.txt` in execd's root holds (11 bytes, for the Range cases).
pub const HELLO: &str = "hello world";

pub struct Server {
    pub child: tokio::process::Child,
    pub addr: SocketAddr,
    /// execd's E2B listener.
    pub e2b: Option<SocketAddr>,
    pub log: PathBuf,
    /// The temp directory: `root/` (execd's) or `data/` (the gateway's), `outside/`, the log.
    pub dir: tempfile::TempDir,
}

impl Drop for Server {
    /// The gateway's hands outlive it by design: stop what it left once it is killed.
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let hands = self.dir.path().join("data").join("run").join("hands");
        if hands.exists() {
            warren_gateway::hands::local::stop_left_hands_blocking(&hands);
        }
    }
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.child.id().expect("the server has not been reaped")
    }

    /// Resident memory from `/proc/<pid>/status`, in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("reads the server's /proc status");
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc status")
    }

    /// `None` when the process is alive and its health route answers 200, else why not.
    pub async fn unhealthy(&mut self, health: &str) -> Option<String> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Some(format!("the server exited: {status}"));
        }
        match wire::send(self.addr, &Request::new("GET", health)).await {
            Ok(response) if response.status == 200 => None,
            Ok(response) => Some(format!("{health} answered {}", response.status)),
            Err(e) => Some(format!("{health}: {e}")),
        }
    }

    /// The last errors in the server's log.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
        errors[errors.len().saturating_sub(40)..].join("\n")
    }

    /// The directory beside the server's own that nothing may reach.
    pub fn outside(&self) -> PathBuf {
        self.dir.path().join("outside")
    }
}

fn prepare(dir: &Path) {
    let outside = dir.join("outside");
    std::fs::create_dir_all(&outside).expect("outside dir");
    std::fs::write(outside.join("secret.txt"), OUTSIDE_SECRET).expect("outside secret");
}

/// Starts `warren <words> <paths>` (`words` split at spaces, then each path after its flag) with
/// its log in `dir/server.log`, and reads its address line (`<prefix> listening on
/// http://ADDR`), then that of its E2B listener if it has `e2b`.
async fn start(words: &str, paths: &[(&str, &Path)], dir: tempfile::TempDir, e2b: bool) -> Server {
    let mut args: Vec<&std::ffi::OsStr> = words.split(' ').map(std::ffi::OsStr::new).collect();
    for (flag, path) in paths {
        args.extend([std::ffi::OsStr::new(flag), path.as_os_str()]);
    }
    let log = dir.path().join("server.log");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_warren"))
        .args(&args)
        .env("WARREN_LOG", "warn")
        .env_remove("EXECD_ACCESS_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .kill_on_drop(true)
        .spawn()
        .expect("spawns warren");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut reader = tokio::io::BufReader::new(stdout).lines();
    let mut addrs: Vec<SocketAddr> = Vec::new();
    for _ in 0..1 + usize::from(e2b) {
        let line = within("the server's `listening on` line", reader.next_line())
            .await
            .expect("reads the server's stdout")
            .unwrap_or_else(|| panic!("warren {args:?} exited before printing its address"));
        let addr = line
            .rsplit_once("http://")
            .and_then(|(_, addr)| addr.trim().parse().ok())
            .unwrap_or_else(|| panic!("an address line, got {line:?}"));
        addrs.push(addr);
    }
    // Whatever else it prints is read and dropped, so the pipe never fills.
    tokio::spawn(async move { while let Ok(Some(_)) = reader.next_line().await {} });
    Server {
        child,
        addr: addrs[0],
        e2b: addrs.get(1).copied(),
        log,
        dir,
    }
}

/// `warren execd --root <tmp>/root --access-token ... --e2b-listen 127.0.0.1:0`, with
/// `hello.txt` and `dir/` in its root and a secret beside it.
pub async fn execd() -> Server {
    let dir = tempfile::tempdir().expect("temp dir");
    prepare(dir.path());
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("dir")).expect("root/dir");
    std::fs::write(root.join("hello.txt"), HELLO).expect("hello.txt");
    let state = dir.path().join("state");
    let words =
        format!("execd --listen 127.0.0.1:0 --e2b-listen 127.0.0.1:0 --access-token {EXECD_TOKEN}");
    start(
        &words,
        &[("--root", &root), ("--state-dir", &state)],
        dir,
        true,
    )
    .await
}

/// `warren gateway` on 127.0.0.1:0 with an app key, an admin token, no warm workers and an
/// agent that cannot start: every route but a turn's agent works.
pub async fn gateway() -> Server {
    let dir = tempfile::tempdir().expect("temp dir");
    prepare(dir.path());
    let data = dir.path().join("data");
    let words = format!(
        "gateway --listen 127.0.0.1:0 --app-key {APP_KEY} --admin-token {ADMIN_TOKEN} \
         --warm-workers 0 --agent /nonexistent/agent --brain-placement host"
    );
    start(&words, &[("--data", &data)], dir, false).await
}
