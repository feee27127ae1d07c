//! Crash recovery with the real `warren` binary: kill -9 mid-turn, a torn line appended to
//! `events.jsonl`, restart: the torn line is gone, the turn is closed `interrupted` with a
//! `status` event, seq continues at +1 and the session works. Also: SIGTERM stops the hands.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::helpers::{EventStream, WAIT, warren_bin};

struct GatewayProcess {
    child: Child,
    url: String,
}

fn start_gateway(data: &Path) -> GatewayProcess {
    use std::os::unix::process::CommandExt;
    let mut child = Command::new(warren_bin())
        .args([
            "gateway",
            "--listen",
            "127.0.0.1:0",
            "--app-key",
            "recovery-key",
            "--warm-workers",
            "1",
        ])
        .arg("--data")
        .arg(data)
        .env("WARREN_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("start warren gateway");
    let stdout = child.stdout.take().expect("stdout piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(first)) = lines.next() {
            let _ = tx.send(first);
        }
        for _ in lines {}
    });
    let first = rx
        .recv_timeout(WAIT)
        .expect("the gateway prints its address");
    let url = first
        .strip_prefix("warren gateway listening on ")
        .expect("address line")
        .trim()
        .to_string();
    GatewayProcess { child, url }
}

/// Pids of processes whose command line mentions `needle` (our temp data dir): the hands and
/// agents this test's gateways started.
pub fn processes_mentioning(needle: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    let me = std::process::id();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmdline).contains(needle) {
            pids.push(pid);
        }
    }
    pids
}

fn kill_processes_mentioning(needle: &str) {
    for pid in processes_mentioning(needle) {
        let tree = warren_process::TreeId::new(pid as i32, None);
        warren_process::kill_tree(&tree, Duration::from_millis(200));
    }
}

async fn read_until(
    stream: &mut EventStream,
    what: &str,
    done: impl FnMut(&crate::helpers::Received) -> bool,
) -> Vec<crate::helpers::Received> {
    stream.until(what, done).await
}

#[tokio::test]
async fn kill_9_mid_turn_then_torn_line_then_restart_recovers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let http = reqwest::Client::new();
    let mut first = start_gateway(&data);

    let registered: Value = http
        .post(format!("{}/v1/devices", first.url))
        .header("X-App-Key", "recovery-key")
        .json(&serde_json::json!({"device_id": "phone-0001"}))
        .send()
        .await
        .expect("register")
        .json()
        .await
        .expect("register body");
    let token = registered["token"].as_str().expect("token").to_string();
    let created: Value = http
        .post(format!("{}/v1/sessions", first.url))
        .bearer_auth(&token)
        .send()
        .await
        .expect("create")
        .json()
        .await
        .expect("body");
    let session = created["id"].as_str().expect("id").to_string();
    let events_url =
        |url: &str, after: u64| format!("{url}/v1/sessions/{session}/events?after={after}");
    let response = http
        .get(events_url(&first.url, 0))
        .bearer_auth(&token)
        .send()
        .await
        .expect("events");
    let mut stream = EventStream::new(response);
    let accepted = http
        .post(format!("{}/v1/sessions/{session}/messages", first.url))
        .bearer_auth(&token)
        .json(&serde_json::json!({"text": "sleep 60"}))
        .send()
        .await
        .expect("message");
    assert_eq!(accepted.status(), 202);
    read_until(&mut stream, "the agent working on `sleep 60`", |e| {
        e.event == "update"
    })
    .await;

    first.child.kill().expect("kill -9 the gateway");
    first.child.wait().expect("reap the gateway");
    drop(stream);
    kill_processes_mentioning(&data.to_string_lossy());

    let events_path = data.join("sessions").join(&session).join("events.jsonl");
    let before = std::fs::read_to_string(&events_path).expect("events file");
    let n_before = before.lines().count() as u64;
    assert!(
        n_before >= 3,
        "user_message, turn_start and updates were stored before the crash"
    );
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&events_path)
        .expect("open events");
    write!(file, "{{\"seq\":{},\"ts\":\"2026-", n_before + 1).expect("append torn line");
    drop(file);

    let mut second = start_gateway(&data);
    let response = http
        .get(events_url(&second.url, 0))
        .bearer_auth(&token)
        .send()
        .await
        .expect("events after restart");
    assert_eq!(
        response.status(),
        200,
        "the device token survived the restart"
    );
    let mut stream = EventStream::new(response);
    let replay = read_until(&mut stream, "the recovery status event", |e| {
        e.event == "status" && e.data["message"].is_string()
    })
    .await;
    let seqs: Vec<u64> = replay.iter().map(|e| e.id.expect("id")).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "seq chain intact"
    );
    let end = replay
        .iter()
        .find(|e| e.event == "turn_end")
        .expect("the open turn was closed");
    assert_eq!(end.data["stop_reason"], "interrupted");
    assert_eq!(end.data["turn"], 1);
    assert_eq!(
        end.id,
        Some(n_before + 1),
        "seq continues at +1 after the dropped torn line"
    );

    let stored = std::fs::read_to_string(&events_path).expect("events file");
    for line in stored.lines() {
        serde_json::from_str::<Value>(line)
            .expect("every stored line parses (the torn one is gone)");
    }

    let accepted = http
        .post(format!("{}/v1/sessions/{session}/messages", second.url))
        .bearer_auth(&token)
        .json(&serde_json::json!({"text": "echo back again"}))
        .send()
        .await
        .expect("message after restart");
    assert_eq!(accepted.status(), 202);
    let body: Value = accepted.json().await.expect("body");
    assert_eq!(body["turn"], 2);
    let seen = read_until(&mut stream, "turn_end of the turn after restart", |e| {
        e.event == "turn_end"
    })
    .await;
    assert_eq!(
        seen.last().expect("turn_end").data["stop_reason"],
        "end_turn"
    );
    let output: String = seen
        .iter()
        .filter(|e| e.event == "update")
        .map(|e| e.data.to_string())
        .collect();
    assert!(
        output.contains("back again"),
        "the session works after recovery"
    );

    // SIGTERM: the gateway stops its brains and hands and exits.
    let status = Command::new("kill")
        .arg("-TERM")
        .arg(second.child.id().to_string())
        .status()
        .expect("kill -TERM");
    assert!(status.success());
    let exited = tokio::task::spawn_blocking(move || second.child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(exited.success(), "clean exit on SIGTERM: {exited}");
    let leftovers = processes_mentioning(&data.to_string_lossy());
    kill_processes_mentioning(&data.to_string_lossy());
    assert!(
        leftovers.is_empty(),
        "hands and agents stopped with the gateway: {leftovers:?}"
    );
}

/// Writes `events` (as `(seq, turn, body)`) as a session's whole event log.
fn write_log(path: &Path, events: &[(u64, Option<u64>, Value)]) {
    let mut text = String::new();
    for (seq, turn, body) in events {
        let mut event = body.clone();
        event["seq"] = (*seq).into();
        event["ts"] = "2026-11-30T00:00:00.000Z".into();
        if let Some(turn) = turn {
            event["turn"] = (*turn).into();
        }
        text.push_str(&event.to_string());
        text.push('\n');
    }
    std::fs::write(path, text).expect("write event log");
}

#[tokio::test]
async fn restart_closes_an_open_turn_and_its_unanswered_permission_request() {
    let gw = crate::helpers::TestGateway::start(crate::helpers::args_without_agent).await;
    let token = gw.register("phone-0001").await;
    let session = gw.create_session(&token).await;
    let args = crate::helpers::args_without_agent(gw.data.clone());
    let data_dir = gw.stop().await;
    let log = args
        .data
        .join("sessions")
        .join(&session)
        .join("events.jsonl");
    write_log(
        &log,
        &[
            (
                1,
                Some(1),
                serde_json::json!({"type": "user_message", "text": "rm x"}),
            ),
            (2, Some(1), serde_json::json!({"type": "turn_start"})),
            (
                3,
                Some(1),
                serde_json::json!({"type": "permission_request", "request_id": "perm-a", "tool_call": {}, "options": []}),
            ),
        ],
    );

    let gw = crate::helpers::TestGateway::start_in(args).await;
    let mut events = gw.events(&token, &session, None).await;
    let seen = events
        .until("the recovery status event", |e| e.event == "status")
        .await;
    let summary: Vec<(Option<u64>, &str)> = seen.iter().map(|e| (e.id, e.event.as_str())).collect();
    assert_eq!(
        summary,
        [
            (Some(1), "user_message"),
            (Some(2), "turn_start"),
            (Some(3), "permission_request"),
            (Some(4), "permission_resolved"),
            (Some(5), "turn_end"),
            (Some(6), "status"),
        ]
    );
    assert_eq!(seen[3].data["outcome"], "cancelled");
    assert_eq!(seen[3].data["request_id"], "perm-a");
    assert_eq!(seen[4].data["stop_reason"], "interrupted");
    let info: Value = gw
        .http
        .get(format!("{}/v1/sessions/{session}", gw.url))
        .bearer_auth(&token)
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("body");
    assert_eq!(
        (
            info["turn"].clone(),
            info["status"].clone(),
            info["last_seq"].clone()
        ),
        (1.into(), "idle".into(), 6.into())
    );
    gw.stop().await;
    drop(data_dir);
}

#[tokio::test]
async fn asking_for_compacted_history_starts_with_a_gap_event() {
    let gw = crate::helpers::TestGateway::start(crate::helpers::args_without_agent).await;
    let token = gw.register("phone-0001").await;
    let session = gw.create_session(&token).await;
    let args = crate::helpers::args_without_agent(gw.data.clone());
    let data_dir = gw.stop().await;
    let log = args
        .data
        .join("sessions")
        .join(&session)
        .join("events.jsonl");
    let status = serde_json::json!({"type": "status", "brain": "ready"});
    write_log(
        &log,
        &[
            (5, None, status.clone()),
            (6, None, status.clone()),
            (7, None, status),
        ],
    );

    let gw = crate::helpers::TestGateway::start_in(args).await;
    let mut events = gw.events(&token, &session, Some(2)).await;
    let gap = events.next("the gap event").await.expect("gap");
    assert_eq!(gap.event, "gap");
    assert_eq!(
        (gap.data["after"].clone(), gap.data["next_seq"].clone()),
        (2.into(), 5.into())
    );
    let ids: Vec<Option<u64>> = events
        .until("event 7", |e| e.id == Some(7))
        .await
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(ids, [Some(5), Some(6), Some(7)]);
    gw.stop().await;
    drop(data_dir);
}

#[tokio::test]
async fn serve_prints_the_url_the_generated_app_key_and_how_to_register() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("warren-data");
    let mut child = Command::new(warren_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--warm-workers", "0"])
        .arg("--data")
        .arg(&data)
        .env_remove("WARREN_APP_KEY")
        .env("WARREN_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("start warren serve");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut printed = Vec::new();
    while !printed.iter().any(|line: &String| line.contains("curl")) {
        printed.push(rx.recv_timeout(WAIT).expect("serve prints its banner"));
    }
    let url = printed[0]
        .strip_prefix("warren gateway listening on ")
        .expect("url line")
        .to_string();
    let key = printed
        .iter()
        .find_map(|line| line.strip_prefix("app key: "))
        .expect("app key line")
        .to_string();
    assert!(
        key.starts_with("wk_") && key.len() == 46,
        "a generated key: {key}"
    );
    assert!(
        printed
            .last()
            .expect("curl line")
            .contains(&format!("X-App-Key: {key}"))
    );
    let registered = reqwest::Client::new()
        .post(format!("{url}/v1/devices"))
        .header("X-App-Key", &key)
        .json(&serde_json::json!({"device_id": "my-phone-01"}))
        .send()
        .await
        .expect("register with the printed key");
    assert_eq!(registered.status(), 201);
    let status = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .expect("kill -TERM");
    assert!(status.success());
    let exited = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(exited.success(), "clean exit on SIGTERM: {exited}");
}
