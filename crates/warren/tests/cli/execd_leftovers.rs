//! A `warren execd` killed with SIGKILL runs no cleanup. Its direct children die with it
//! (parent-death signal), and the next execd on the same state directory stops everything else
//! it left (a `setsid` grandchild, a `nohup` job, a bash session's background job) before it
//! serves anything. The real binary, real HTTP, real processes.

// Tests start real programs (shells, servers, the binary under test) directly.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};

use serde_json::{Value, json};
use warren_test_support::{alive, wait_until};

use crate::support::{execd_command, listening_url};

/// A started execd, killed by its pid when dropped (a failed assertion must not leave it).
struct Execd(Child);

impl Execd {
    fn kill(&mut self) -> std::io::Result<()> {
        self.0.kill()
    }

    fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.0.wait()
    }
}

impl Drop for Execd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `warren execd` on an ephemeral port with `state_dir`; returns it and its URL.
fn start_execd(state_dir: &Path, root: &Path) -> (Execd, String) {
    let mut child = execd_command(&["--listen", "127.0.0.1:0", "--state-dir"])
        .arg(state_dir)
        .arg("--root")
        .arg(root)
        .stderr(Stdio::null())
        .spawn()
        .expect("starts warren execd");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("reads the address line");
    (Execd(child), listening_url(&line))
}

/// The pid a command wrote to `pids/<name>`, waiting for it to appear.
fn pid_in(dir: &Path, name: &str) -> u32 {
    let path = dir.join(name);
    let mut pid = None;
    wait_until(&format!("{name} writes its pid"), || {
        pid = std::fs::read_to_string(&path)
            .ok()
            .and_then(|text| text.trim().parse().ok());
        pid.is_some()
    });
    pid.expect("pid read")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_left_by_a_sigkilled_execd_are_stopped_by_the_next_one() {
    let temp = tempfile::tempdir().expect("temp dir");
    let state_dir = temp.path().join("state");
    let root = temp.path().join("root");
    let pids = root.join("pids");
    std::fs::create_dir_all(&pids).expect("pid dir");
    let (mut execd, url) = start_execd(&state_dir, &root);
    let http = reqwest::Client::new();
    let record = |name: &str| format!("echo $$ > {}/{name}; exec sleep 300", pids.display());

    // A pipe exec session, with a setsid grandchild and a nohup job of its own.
    let script = format!(
        "setsid sh -c '{}' & nohup sh -c '{}' >/dev/null 2>&1 & {}",
        record("setsid"),
        record("nohup"),
        record("exec")
    );
    let answer: Value = http
        .post(format!("{url}/v1/exec"))
        .json(&json!({"cmd": script, "login": false, "yield_time_ms": 250}))
        .send()
        .await
        .expect("POST /v1/exec")
        .json()
        .await
        .expect("exec result");
    assert_eq!(answer["status"], "running", "{answer}");
    // OpenSandbox commands in the foreground (a stream kept open) and in the background.
    let foreground = tokio::spawn({
        let request = http
            .post(format!("{url}/command"))
            .json(&json!({"command": record("command_fg")}));
        async move {
            let response = request.send().await.expect("POST /command");
            let _ = response.bytes().await;
        }
    });
    let background = http
        .post(format!("{url}/command"))
        .json(&json!({"command": record("command_bg"), "background": true}))
        .send()
        .await
        .expect("POST /command background");
    assert!(background.status().is_success());
    let _ = background.bytes().await;
    // A bash session: the shell itself, and a job it leaves running.
    let session: Value = http
        .post(format!("{url}/session"))
        .json(&json!({}))
        .send()
        .await
        .expect("POST /session")
        .json()
        .await
        .expect("session id");
    let session_id = session["session_id"].as_str().expect("session_id");
    let run = http
        .post(format!("{url}/session/{session_id}/run"))
        .json(&json!({"command": format!(
            "echo $$ > {}/bash_session; (setsid sh -c '{}' &)",
            pids.display(),
            record("bash_job")
        )}))
        .send()
        .await
        .expect("run in the session");
    let _ = run.bytes().await;

    let names = [
        "exec",
        "setsid",
        "nohup",
        "command_fg",
        "command_bg",
        "bash_session",
        "bash_job",
    ];
    let all: Vec<(&str, u32)> = names.iter().map(|n| (*n, pid_in(&pids, n))).collect();
    for (name, pid) in &all {
        assert!(alive(*pid), "{name} ({pid}) runs before the kill");
    }

    execd.kill().expect("SIGKILL execd");
    execd.wait().expect("execd reaped");
    foreground.abort();
    // Direct children of execd get its parent-death signal.
    for name in ["exec", "command_fg", "command_bg", "bash_session"] {
        let pid = all.iter().find(|(n, _)| *n == name).expect("known").1;
        wait_until(&format!("{name} ({pid}) dies with execd"), || !alive(pid));
    }

    let (mut next, _) = start_execd(&state_dir, &root);
    // The next execd stops them before it prints its address; the wait only absorbs a loaded
    // machine's delay in tearing a killed process down.
    for (name, pid) in &all {
        wait_until(&format!("{name} ({pid}) stopped by the next execd"), || {
            !alive(*pid)
        });
    }
    next.kill().expect("kills the second execd");
    next.wait().expect("reaped");
}

#[tokio::test]
async fn a_second_execd_on_a_state_directory_in_use_refuses_to_start() {
    let temp = tempfile::tempdir().expect("temp dir");
    let (mut first, _) = start_execd(temp.path(), temp.path());
    let second = execd_command(&["--listen", "127.0.0.1:0", "--state-dir"])
        .arg(temp.path())
        .output()
        .expect("runs");
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains("another warren execd uses the state directory"),
        "{stderr}"
    );
    first.kill().expect("kills");
    first.wait().expect("reaped");
}
