//! Crash recovery with the real `warren` binary: kill -9 mid-turn, a torn line appended to
//! `events.jsonl`, restart: the torn line is gone, the turn is closed `interrupted` with a
//! `status` event, seq continues at +1 and the session works. Also: SIGTERM stops the hands.

// Tests start real programs (shells, servers, the binary under test) directly.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use warren_test_support::{alive, processes_mentioning};

use super::helpers::{
    EventStream, TestGateway, WAIT, args_without_agent, file_store_only, json_of, kill,
    listening_url, stop_reason, warren_bin,
};

/// A `warren` child process in its own process group, and the lines it prints on stdout.
struct WarrenProcess {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl WarrenProcess {
    /// Starts `warren <args> --data <data>` with warnings-only logging.
    fn spawn(args: &[&str], data: &Path) -> WarrenProcess {
        use std::os::unix::process::CommandExt;
        let mut child = Command::new(warren_bin())
            .args(args)
            .arg("--data")
            .arg(data)
            .env_remove("WARREN_APP_KEY")
            .env("WARREN_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("start warren {args:?}: {e}"));
        let stdout = child.stdout.take().expect("stdout piped");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        WarrenProcess { child, lines }
    }

    fn next_line(&self, what: &str) -> String {
        self.lines
            .recv_timeout(WAIT)
            .unwrap_or_else(|e| panic!("timed out waiting for {what}: {e}"))
    }

    /// Sends SIGTERM and asserts a clean exit.
    async fn terminate(mut self) {
        kill("TERM", self.child.id(), "the warren process");
        let exited = tokio::task::spawn_blocking(move || self.child.wait())
            .await
            .expect("join")
            .expect("wait");
        assert!(exited.success(), "clean exit on SIGTERM: {exited}");
    }
}

impl Drop for WarrenProcess {
    /// A test that failed halfway still stops the gateway it started, by its pid: SIGTERM (the
    /// gateway then stops its own hands and agents), SIGKILL if it is still there after [`WAIT`].
    fn drop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = std::time::Instant::now() + WAIT;
        while matches!(self.child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `warren gateway` on a free port with one warm worker; returns it and its URL.
fn start_gateway(data: &Path) -> (WarrenProcess, String) {
    let gateway = WarrenProcess::spawn(
        &[
            "gateway",
            "--listen",
            "127.0.0.1:0",
            "--app-key",
            "recovery-key",
            "--warm-workers",
            "1",
        ],
        data,
    );
    let url = listening_url(
        &gateway.next_line("the gateway prints its address"),
        "gateway",
    );
    (gateway, url)
}

/// A device of a `warren gateway` child process, talking plain HTTP to the URL it is given
/// (the gateway's address changes across a restart; the device and its token stay).
struct Device {
    http: reqwest::Client,
    token: String,
}

impl Device {
    async fn register(url: &str) -> Device {
        let http = reqwest::Client::new();
        let registration = http
            .post(format!("{url}/v1/devices"))
            .header("X-App-Key", "recovery-key")
            .json(&serde_json::json!({"device_id": "phone-0001"}));
        let registered = json_of(registration, "register").await;
        let token = registered["token"].as_str().expect("token").to_string();
        Device { http, token }
    }

    async fn create_session(&self, url: &str) -> String {
        let creation = self
            .http
            .post(format!("{url}/v1/sessions"))
            .bearer_auth(&self.token);
        let created = json_of(creation, "create").await;
        created["id"].as_str().expect("id").to_string()
    }

    async fn events(&self, url: &str, session: &str) -> reqwest::Response {
        self.http
            .get(format!("{url}/v1/sessions/{session}/events?after=0"))
            .bearer_auth(&self.token)
            .send()
            .await
            .expect("events")
    }

    async fn post_message(&self, url: &str, session: &str, text: &str) -> reqwest::Response {
        self.http
            .post(format!("{url}/v1/sessions/{session}/messages"))
            .bearer_auth(&self.token)
            .json(&serde_json::json!({ "text": text }))
            .send()
            .await
            .expect("message")
    }
}

fn kill_processes_mentioning(needle: &str) {
    for pid in processes_mentioning(needle) {
        let tree = warren_process::TreeId::new(pid as i32, None);
        warren_process::kill_tree_blocking(&tree, Duration::from_millis(200));
    }
}

#[tokio::test]
async fn kill_9_mid_turn_then_torn_line_then_restart_recovers() {
    if file_store_only("events.jsonl written or torn by the test") {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let (mut first, first_url) = start_gateway(&data);
    let device = Device::register(&first_url).await;
    let session = device.create_session(&first_url).await;
    let mut stream = EventStream::new(device.events(&first_url, &session).await);
    // A dev server in the hands, which must survive the gateway's death. The hands have a
    // network of their own: it is asked for from inside them.
    let port = 5173;
    let dev_server = format!("http://127.0.0.1:{port}/");
    let server = format!(
        "setsid nohup python3 -m http.server {port} --bind 127.0.0.1 >/dev/null 2>&1 & \
         for i in $(seq 100); do curl -s -o /dev/null {dev_server} && echo dev-server-up && \
         exit 0; sleep 0.1; done; exit 1"
    );
    assert_eq!(
        device
            .post_message(&first_url, &session, &server)
            .await
            .status(),
        202
    );
    let started = stream
        .until("the dev server started", |e| e.event == "turn_end")
        .await;
    assert!(
        started
            .iter()
            .any(|e| e.data.to_string().contains("dev-server-up")),
        "the dev server answers in the hands: {started:?}"
    );
    // A duration no other test uses, so the command can be found among the machine's processes.
    let duration = "61.25";
    let accepted = device
        .post_message(&first_url, &session, &format!("sleep {duration}"))
        .await;
    assert_eq!(accepted.status(), 202);
    stream
        .until("the agent working on the sleep", |e| e.event == "update")
        .await;
    let hands = super::helpers::hands_processes(&data, &session);
    assert!(!hands.is_empty(), "the hands run");
    let _cleanup = super::helpers::LeftHands(data.clone());
    // The tool call is announced before the hands start the command: wait for it to appear.
    let deadline = tokio::time::Instant::now() + WAIT;
    while processes_mentioning(duration).is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the command runs within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    first.child.kill().expect("kill -9 the gateway");
    first.child.wait().expect("reap the gateway");
    drop(stream);

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

    let (second, second_url) = start_gateway(&data);
    // A killed gateway leaves its hands as they are: the restarted one adopts them, with the
    // command they ran.
    assert!(
        hands.iter().all(|pid| warren_test_support::alive(*pid)),
        "the hands outlive a killed gateway"
    );
    assert!(
        !processes_mentioning(duration).is_empty(),
        "the hands' command outlives a killed gateway"
    );
    let response = device.events(&second_url, &session).await;
    assert_eq!(
        response.status(),
        200,
        "the device token survived the restart"
    );
    let mut stream = EventStream::new(response);
    let replay = stream
        .until("the recovery status event", |e| {
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
        .find(|e| e.event == "turn_end" && e.data["turn"] == 2)
        .expect("the open turn was closed");
    assert_eq!(end.data["stop_reason"], "interrupted");
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

    let accepted = device
        .post_message(
            &second_url,
            &session,
            &format!("curl -s -o /dev/null -w 'dev=%{{http_code}} ' {dev_server}; echo back again"),
        )
        .await;
    assert_eq!(accepted.status(), 202);
    let body: Value = accepted.json().await.expect("body");
    assert_eq!(body["turn"], 3);
    let seen = stream
        .until("turn_end of the turn after restart", |e| {
            e.event == "turn_end"
        })
        .await;
    assert_eq!(stop_reason(&seen), "end_turn");
    let output: String = seen
        .iter()
        .filter(|e| e.event == "update")
        .map(|e| e.data.to_string())
        .collect();
    assert!(
        output.contains("back again"),
        "the session works after recovery"
    );
    assert!(
        output.contains("dev=200"),
        "the dev server started before the kill -9 still answers: {output}"
    );

    // SIGTERM: the gateway stops its brains, pauses its hands (left for the next one) and exits.
    second.terminate().await;
    let leftovers = processes_mentioning(&data.to_string_lossy());
    kill_processes_mentioning(&data.to_string_lossy());
    assert!(
        leftovers.is_empty(),
        "agents stopped with the gateway: {leftovers:?}"
    );
}

/// Pids listed one per line in `path` (missing file: none).
fn pids_in(path: &Path) -> Vec<u32> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.trim().parse().ok())
        .collect()
}

/// Agents (and what they started) that a gateway killed with SIGKILL left running are stopped
/// when the next gateway opens the same data directory, before it starts agents of its own.
#[tokio::test]
async fn agents_left_by_a_killed_gateway_are_stopped_at_restart() {
    if file_store_only("runs the binary on its default store") {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    // The message below starts hands, which outlive both gateways on purpose.
    let _cleanup = super::helpers::LeftHands(data.clone());
    let jobs = dir.path().join("agent-jobs");
    // Each agent leaves a background job that ignores its stdin closing (as a third-party
    // agent might) and notes its pid, then becomes the shell agent.
    let agent = format!(
        "sh -c 'sleep 300 </dev/null >/dev/null 2>&1 & echo $! >> {}; exec {} shell-agent'",
        jobs.display(),
        warren_bin().display()
    );
    let args = |port: &'static str| -> Vec<String> {
        [
            "gateway",
            "--listen",
            port,
            "--app-key",
            "recovery-key",
            "--warm-workers",
            "2",
            "--brain-placement",
            "host",
            "--agent",
            &agent,
        ]
        .map(String::from)
        .to_vec()
    };
    let first_args = args("127.0.0.1:0");
    let first_args: Vec<&str> = first_args.iter().map(String::as_str).collect();
    let mut first = WarrenProcess::spawn(&first_args, &data);
    let url = listening_url(
        &first.next_line("the gateway prints its address"),
        "gateway",
    );
    let device = Device::register(&url).await;
    let session = device.create_session(&url).await;
    let accepted = device.post_message(&url, &session, "echo hi").await;
    assert_eq!(accepted.status(), 202);
    // Two warm agents and the session's (taken from the warm ones and replaced, or started for
    // the message): three.
    let deadline = tokio::time::Instant::now() + WAIT;
    while pids_in(&jobs).len() < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "three agents started: {:?}",
            pids_in(&jobs)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.child.kill().expect("kill -9 the gateway");
    first.child.wait().expect("reap the gateway");
    let orphans = pids_in(&jobs);
    assert!(
        orphans.iter().all(|pid| alive(*pid)),
        "the agents' jobs outlive the killed gateway: {orphans:?}"
    );

    let second_args = args("127.0.0.1:0");
    let second_args: Vec<&str> = second_args.iter().map(String::as_str).collect();
    let second = WarrenProcess::spawn(&second_args, &data);
    second.next_line("the restarted gateway prints its address");
    // The left-overs are stopped before the gateway listens.
    let survivors: Vec<u32> = orphans.iter().copied().filter(|pid| alive(*pid)).collect();
    assert!(
        survivors.is_empty(),
        "left-over agent jobs stopped at restart: {survivors:?}"
    );
    // Markers begin with the pid of the process that made them: only the new gateway's agents
    // are listed.
    let listed: Vec<String> = std::fs::read_dir(data.join("run/trees"))
        .expect("the tree registry")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    let prefix = format!("{}-", second.child.id());
    assert!(
        listed.iter().all(|marker| marker.starts_with(&prefix)),
        "the old gateway's agents are no longer listed: {listed:?}"
    );

    // SIGTERM: the new gateway stops its own agents and unlists them.
    second.terminate().await;
    let mine: Vec<u32> = pids_in(&jobs)
        .into_iter()
        .filter(|pid| !orphans.contains(pid))
        .collect();
    let deadline = tokio::time::Instant::now() + WAIT;
    while mine.iter().any(|pid| alive(*pid)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the second gateway's agents stopped with it"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        std::fs::read_dir(data.join("run/trees"))
            .expect("the tree registry")
            .count(),
        0,
        "a clean shutdown leaves the registry empty"
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

/// A gateway restarted on a session whose whole event log was replaced by `events`.
struct Restarted {
    gw: TestGateway,
    token: String,
    session: String,
    _data_dir: Option<tempfile::TempDir>,
}

impl Restarted {
    async fn stop(self) {
        self.gw.stop().await;
    }
}

async fn restart_with_log(events: &[(u64, Option<u64>, Value)]) -> Restarted {
    let gw = TestGateway::start(args_without_agent).await;
    let token = gw.register("phone-0001").await;
    let session = gw.create_session(&token).await;
    let args = args_without_agent(gw.data.clone());
    let data_dir = gw.stop().await;
    let log = args
        .data
        .join("sessions")
        .join(&session)
        .join("events.jsonl");
    write_log(&log, events);
    Restarted {
        gw: TestGateway::start_in(args).await,
        token,
        session,
        _data_dir: data_dir,
    }
}

#[tokio::test]
async fn restart_closes_an_open_turn_and_its_unanswered_permission_request() {
    if file_store_only("events.jsonl written or torn by the test") {
        return;
    }
    let restarted = restart_with_log(&[
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
        ])
        .await;
    let (gw, token, session) = (&restarted.gw, &restarted.token, &restarted.session);
    let mut events = gw.events(token, session, None).await;
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
    let info = gw.session_info(token, session).await;
    assert_eq!(
        (
            info["turn"].clone(),
            info["status"].clone(),
            info["last_seq"].clone()
        ),
        (1.into(), "idle".into(), 6.into())
    );
    restarted.stop().await;
}

/// Regression: recovery closed only the newest open turn, so a turn whose `turn_end` was lost
/// (a full disk) stayed open forever once a later turn had started.
#[tokio::test]
async fn recovery_closes_every_open_turn_not_only_the_last() {
    if file_store_only("events.jsonl written or torn by the test") {
        return;
    }
    let message = |text: &str| serde_json::json!({"type": "user_message", "text": text});
    let start = serde_json::json!({"type": "turn_start"});
    let restarted = restart_with_log(&[
            (1, Some(1), message("rm a")),
            (2, Some(1), start.clone()),
            (
                3,
                Some(1),
                serde_json::json!({"type": "permission_request", "request_id": "perm-a", "tool_call": {}, "options": []}),
            ),
            (4, Some(2), message("echo two")),
            (5, Some(2), start.clone()),
            (6, Some(2), serde_json::json!({"type": "turn_end", "stop_reason": "end_turn"})),
            (7, Some(3), message("echo three")),
            (8, Some(3), start),
        ])
        .await;
    let (gw, token, session) = (&restarted.gw, &restarted.token, &restarted.session);
    let mut events = gw.events(token, session, Some(8)).await;
    let seen = events
        .until("the recovery status event", |e| e.event == "status")
        .await;
    let summary: Vec<(Option<u64>, &str, Value)> = seen
        .iter()
        .map(|e| (e.id, e.event.as_str(), e.data["turn"].clone()))
        .collect();
    assert_eq!(
        summary,
        [
            (Some(9), "permission_resolved", 1.into()),
            (Some(10), "turn_end", 1.into()),
            (Some(11), "turn_end", 3.into()),
            (Some(12), "status", Value::Null),
        ]
    );
    assert_eq!(seen[0].data["request_id"], "perm-a");
    assert_eq!(seen[1].data["stop_reason"], "interrupted");
    assert_eq!(seen[2].data["stop_reason"], "interrupted");
    let info = gw.session_info(token, session).await;
    assert_eq!(
        (info["turn"].clone(), info["status"].clone()),
        (3.into(), "idle".into())
    );
    restarted.stop().await;
}

#[tokio::test]
async fn asking_for_compacted_history_starts_with_a_gap_event() {
    if file_store_only("events.jsonl written or torn by the test") {
        return;
    }
    let status = serde_json::json!({"type": "status", "brain": "ready"});
    let restarted = restart_with_log(&[
        (5, None, status.clone()),
        (6, None, status.clone()),
        (7, None, status),
    ])
    .await;
    let (gw, token, session) = (&restarted.gw, &restarted.token, &restarted.session);
    let mut events = gw.events(token, session, Some(2)).await;
    let gap = events.next("the gap event").await.expect("gap");
    assert_eq!(gap.event, "gap");
    assert_eq!(
        (gap.data["after"].clone(), gap.data["next_seq"].clone()),
        (2.into(), 5.into())
    );
    assert_eq!(
        gap.id,
        Some(4),
        "resuming from the gap continues at the oldest kept event"
    );
    assert_eq!(
        gap.data["seq"], 4,
        "the gap is shaped like every event: {}",
        gap.data
    );
    assert!(gap.data["ts"].is_string(), "{}", gap.data);
    let ids: Vec<Option<u64>> = events
        .until("event 7", |e| e.id == Some(7))
        .await
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(ids, [Some(5), Some(6), Some(7)]);
    restarted.stop().await;
}

#[tokio::test]
async fn serve_prints_the_url_the_console_the_generated_app_key_and_how_to_register() {
    if file_store_only("runs the binary on its default store") {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("warren-data");
    let serve = WarrenProcess::spawn(
        &["serve", "--listen", "127.0.0.1:0", "--warm-workers", "0"],
        &data,
    );
    let mut printed = Vec::new();
    while !printed.iter().any(|line: &String| line.contains("curl")) {
        printed.push(serve.next_line("serve prints its banner"));
    }
    let url = printed[0]
        .strip_prefix("warren gateway listening on ")
        .expect("url line")
        .to_string();
    // The second line is for the person: the console's URL.
    assert_eq!(printed[1], format!("open {url}/ on your phone or browser"));
    let console = reqwest::get(format!("{url}/"))
        .await
        .expect("the printed console URL answers");
    assert_eq!(console.status(), 200);
    assert_eq!(
        console.headers()["content-type"],
        "text/html; charset=utf-8",
        "the console's page"
    );
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
    serve.terminate().await;
}
