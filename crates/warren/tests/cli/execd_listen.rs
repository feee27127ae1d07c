//! Where the real `warren execd` and `warren envd` agree to listen: beyond loopback (0.0.0.0,
//! reached here only at 127.0.0.1) they refuse to start without an access token, with a message
//! that says what to do and a non-zero exit; `--no-auth` starts them anyway, with a warning; a
//! token starts them quietly, and is then required.

use std::process::Stdio;

use serde_json::json;
use warren_test_support::WAIT;
use warren_test_support::pty::Daemon;

use crate::support::{ExecdProcess, warren};

/// `warren execd --listen 0.0.0.0:0` with a temp `--root`, `args` and `env` added, once it
/// listens; and its root.
async fn off_loopback(args: &[&str], env: &[(&str, &str)]) -> (ExecdProcess, tempfile::TempDir) {
    let root = tempfile::tempdir().expect("temp root");
    let path = root.path().to_str().expect("a UTF-8 temp path");
    let mut all = vec!["--listen", "0.0.0.0:0", "--root", path];
    all.extend_from_slice(args);
    (ExecdProcess::start(&all, env).await, root)
}

/// `warren <args>` with a temp `--root`, expected to exit on its own: its exit status, stdout
/// and stderr.
async fn run_to_exit(args: &[&str]) -> (std::process::ExitStatus, String, String) {
    let root = tempfile::tempdir().expect("temp root");
    let child = tokio::process::Command::new(warren())
        .args(args)
        .arg("--root")
        .arg(root.path())
        .env_remove("EXECD_ACCESS_TOKEN")
        .env("WARREN_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawns warren");
    let output = tokio::time::timeout(WAIT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("`warren {args:?}` exits by itself within {WAIT:?}"))
        .expect("waits for warren");
    (
        output.status,
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Asserts `warren <args>` exits non-zero, refusing to listen on 0.0.0.0:0 without an access
/// token and binding nothing; returns what it printed on stderr.
async fn refuses_to_start(args: &[&str]) -> String {
    let (status, stdout, stderr) = run_to_exit(args).await;
    assert!(!status.success(), "exits non-zero: {status}");
    assert!(
        stderr.contains("refusing to listen on 0.0.0.0:0 without an access token"),
        "{stderr}"
    );
    assert!(!stdout.contains("listening on"), "bound nothing: {stdout}");
    stderr
}

#[tokio::test]
async fn warren_execd_off_loopback_without_a_token_refuses_to_start() {
    let stderr = refuses_to_start(&["execd", "--listen", "0.0.0.0:0"]).await;
    assert!(
        stderr.contains("--access-token") && stderr.contains("--no-auth"),
        "says what to do: {stderr}"
    );
}

#[tokio::test]
async fn warren_envd_off_loopback_without_a_token_refuses_to_start() {
    refuses_to_start(&["envd", "--e2b-listen", "0.0.0.0:0"]).await;
    // execd's own listener beyond loopback is refused the same way when envd rides along.
    let (status, _, stderr) = run_to_exit(&[
        "execd",
        "--listen",
        "127.0.0.1:0",
        "--e2b-listen",
        "0.0.0.0:0",
    ])
    .await;
    assert!(!status.success(), "exits non-zero: {status}");
    assert!(
        stderr.contains("refusing to listen on 0.0.0.0:0"),
        "{stderr}"
    );
}

#[tokio::test]
async fn warren_execd_with_no_auth_listens_off_loopback_and_warns() {
    let (open, _root) = off_loopback(&["--no-auth"], &[]).await;
    open.daemon.create(json!({})).await;
    let log = open.stop_with(rustix::process::Signal::TERM).await;
    assert!(
        log.contains("listening on a non-loopback address without an access token"),
        "{log}"
    );
}

#[tokio::test]
async fn warren_execd_off_loopback_with_a_token_starts_quietly_and_requires_it() {
    let (guarded, _root) = off_loopback(&[], &[("EXECD_ACCESS_TOKEN", "from-env")]).await;
    guarded.daemon.create(json!({})).await;
    let anonymous = Daemon {
        token: None,
        base: guarded.daemon.base.clone(),
        http: guarded.daemon.http.clone(),
    };
    assert_eq!(anonymous.post_raw("/pty", "{}").await.0, 401);
    let log = guarded.stop_with(rustix::process::Signal::TERM).await;
    assert!(!log.contains("non-loopback"), "{log}");
}
