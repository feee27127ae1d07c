//! No secret of the gateway reaches the hands: `warren gateway` (the real binary) runs with
//! three secret-looking variables and one ordinary one in its environment. A session's command
//! prints its whole environment; none of the four values is in its output, in `events.jsonl`
//! or in the gateway's log, and the agent got the ordinary variable but none of Warren's own
//! credentials.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

const APP_KEY: &str = "wk_app-secret-value-1111";
const ADMIN_TOKEN: &str = "admin-secret-value-2222";
const MODEL_KEY: &str = "sk-model-secret-value-3333";
const ORDINARY: &str = "ordinary-value-4444";

/// The environment of the process `pid`, as `NAME=VALUE` strings.
fn environ_of(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|bytes| {
            bytes
                .split(|b| *b == 0)
                .map(|var| String::from_utf8_lossy(var).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Live processes whose environment carries one of `markers` and whose command line contains
/// `needle`.
/// Stops the hands the gateway leaves paused at SIGTERM, when the test ends.
struct LeftHands(std::path::PathBuf);

impl Drop for LeftHands {
    fn drop(&mut self) {
        warren_gateway::hands::local::stop_left_hands_blocking(&self.0);
    }
}

fn processes_with_marker(markers: &[String], needle: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).contains(needle)
                && environ_of(*pid).iter().any(|var| {
                    var.strip_prefix("WARREN_TREE_ID=").is_some_and(|chain| {
                        chain.split(':').any(|m| markers.iter().any(|k| k == m))
                    })
                })
        })
        .collect()
}

/// Sends `request` and returns the string `field` of the JSON object it answers.
async fn answered_field(request: reqwest::RequestBuilder, field: &str) -> String {
    let response = request.send().await.expect("answers");
    let answer: Value = response.json().await.expect("a JSON answer");
    answer[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} in {answer}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_of_the_gateway_reaches_a_hands_command_the_event_log_or_the_log() {
    let data = tempfile::tempdir().expect("data dir");
    let log_path = data.path().join("gateway.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let mut gateway = Command::new(env!("CARGO_BIN_EXE_warren"))
        .args([
            "gateway",
            "--listen",
            "127.0.0.1:0",
            "--warm-workers",
            "1",
            "--data",
        ])
        .arg(data.path().join("warren"))
        .env("WARREN_APP_KEY", APP_KEY)
        .env("WARREN_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("OPENAI_API_KEY", MODEL_KEY)
        .env("PROJECT_COLOR", ORDINARY)
        // Everything Warren logs, so a leak through any log line is caught.
        .env("WARREN_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("starts warren gateway");
    let mut stdout = gateway.stdout.take().expect("stdout");
    let url = tokio::task::spawn_blocking(move || {
        let mut seen = Vec::new();
        let mut byte = [0u8; 1];
        while !seen.ends_with(b"\n") && stdout.read(&mut byte).unwrap_or(0) == 1 {
            seen.push(byte[0]);
        }
        std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        String::from_utf8_lossy(&seen).into_owned()
    })
    .await
    .expect("reads the address line");
    let url = url
        .trim()
        .strip_prefix("warren gateway listening on ")
        .unwrap_or_else(|| panic!("address line, got {url:?}"))
        .to_owned();

    let http = reqwest::Client::new();
    let registration = http
        .post(format!("{url}/v1/devices"))
        .header("X-App-Key", APP_KEY)
        .json(&json!({"device_id": "phone-secrets"}));
    let token = answered_field(registration, "token").await;
    let creation = http.post(format!("{url}/v1/sessions")).bearer_auth(&token);
    let session_id = answered_field(creation, "id").await;
    let accepted = http
        .post(format!("{url}/v1/sessions/{session_id}/messages"))
        .bearer_auth(&token)
        .json(&json!({"text": "env; cat /proc/$PPID/environ | tr '\\0' '\\n'; echo env-done"}))
        .send()
        .await
        .expect("message");
    assert_eq!(accepted.status(), 202);

    let events_path = data
        .path()
        .join("warren/sessions")
        .join(&session_id)
        .join("events.jsonl");
    let deadline = Instant::now() + WAIT;
    let events = loop {
        let events = std::fs::read_to_string(&events_path).unwrap_or_default();
        if events.contains("\"turn_end\"") {
            break events;
        }
        assert!(
            Instant::now() < deadline,
            "turn_end within {WAIT:?}: {events}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(events.contains("env-done"), "the command ran: {events}");
    assert!(
        events.contains("PATH="),
        "the command printed its environment: {events}"
    );
    for value in [APP_KEY, ADMIN_TOKEN, MODEL_KEY, ORDINARY] {
        assert!(
            !events.contains(value),
            "{value} reached the hands: {events}"
        );
    }

    // The agent (the built-in shell agent) kept the gateway's ordinary variable and lost
    // Warren's credentials; the hands' execd has neither.
    let markers: Vec<String> = std::fs::read_dir(data.path().join("warren/run/trees"))
        .expect("tree registry")
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .collect();
    let agents = processes_with_marker(&markers, "shell-agent");
    assert!(!agents.is_empty(), "the agent process is listed");
    for pid in &agents {
        let env = environ_of(*pid);
        assert!(
            env.iter()
                .any(|v| v == &format!("PROJECT_COLOR={ORDINARY}")),
            "{env:?}"
        );
        for value in [APP_KEY, ADMIN_TOKEN] {
            assert!(
                !env.iter().any(|v| v.contains(value)),
                "agent has {value}: {env:?}"
            );
        }
    }
    // The hands' sandbox (bwrap, execd and what it runs), found from the record the gateway
    // keeps for its successor.
    let hands_dir = data.path().join("warren/run/hands");
    let hands: Vec<u32> = std::fs::read_dir(&hands_dir)
        .expect("hands records")
        .flatten()
        .filter(|entry| entry.path().extension().is_some_and(|e| e == "json"))
        .filter_map(|entry| {
            let record: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(entry.path()).ok()?).ok()?;
            record["pid"].as_u64()
        })
        .flat_map(|pid| {
            warren_process::tree_members(&warren_process::TreeId::new(pid as i32, None))
        })
        .map(|pid| pid as u32)
        .collect();
    let _left = LeftHands(hands_dir);
    assert!(
        hands.iter().any(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmd| String::from_utf8_lossy(&cmd).contains("execd"))
        }),
        "the hands' execd runs: {hands:?}"
    );
    for pid in &hands {
        let env = environ_of(*pid);
        for value in [APP_KEY, ADMIN_TOKEN, MODEL_KEY, ORDINARY] {
            assert!(
                !env.iter().any(|v| v.contains(value)),
                "execd has {value}: {env:?}"
            );
        }
    }

    let _ = Command::new("kill")
        .args(["-TERM", &gateway.id().to_string()])
        .status();
    let exited = tokio::task::spawn_blocking(move || gateway.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(exited.success(), "clean exit: {exited}");
    let log = std::fs::read_to_string(&log_path).expect("log");
    assert!(log.contains("hands started"), "the log was captured: {log}");
    for value in [APP_KEY, ADMIN_TOKEN, MODEL_KEY, ORDINARY] {
        assert!(!log.contains(value), "{value} reached the gateway log");
    }
}
