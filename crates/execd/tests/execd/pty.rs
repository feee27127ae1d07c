//! PTY sessions against the real daemon on 127.0.0.1:0, with a real WebSocket client and a
//! real HTTP client, driving real bash on real PTYs. One test per behaviour of
//! pty-sessions.md's last section, then Warren's own points and the bad inputs.

use crate::pty_support;

use serde_json::json;
use tokio_tungstenite::tungstenite::protocol::Message;
use warren_execd::Config;

use pty_support::{Event, alive, eventually, start, start_with};

// --- REST ---------------------------------------------------------------------------------

#[tokio::test]
async fn create_returns_201_with_a_uuid_and_no_shell_yet() {
    let daemon = start().await;
    let id = daemon.create(json!({})).await;
    assert_eq!(id.len(), 36, "uuid v4: {id}");
    assert_eq!(&id[14..15], "4", "uuid v4: {id}");
    let status = daemon.status(&id).await;
    assert_eq!(
        status,
        json!({"session_id": id, "running": false, "output_offset": 0})
    );
}

#[tokio::test]
async fn create_accepts_an_empty_body_and_creates_a_missing_cwd() {
    let daemon = start().await;
    let (status, body) = daemon.post_raw("/pty", "").await;
    assert_eq!(status, 201, "{body}");
    let dir = tempfile::tempdir().expect("temp dir");
    let cwd = dir.path().join("new/nested");
    let id = daemon.create(json!({"cwd": cwd})).await;
    assert!(cwd.is_dir());
    let mut holder = daemon.connect(&id, "").await;
    holder.run("pwd; echo pwd-$((1+1))", "pwd-2").await;
    assert!(
        holder
            .output_text()
            .contains(cwd.to_str().expect("utf-8 path"))
    );
}

#[tokio::test]
async fn unknown_session_is_404_context_not_found() {
    let daemon = start().await;
    let id = "00000000-0000-4000-8000-000000000000";
    let expected =
        json!({"code": "CONTEXT_NOT_FOUND", "message": format!("pty session {id} not found")});
    assert_eq!(
        daemon.get(&format!("/pty/{id}")).await,
        (404, expected.clone())
    );
    let (status, body) = daemon.delete(&format!("/pty/{id}")).await;
    assert_eq!(
        (
            status,
            serde_json::from_str::<serde_json::Value>(&body).expect("json")
        ),
        (404, expected.clone())
    );
    let refused = daemon.try_connect(id, "").await.err().expect("refused");
    assert_eq!(refused, (404, expected));
}

#[tokio::test]
async fn malformed_json_bodies_are_400_invalid_request_body() {
    let daemon = start().await;
    for body in [
        "{bad",
        "[1,2]",
        r#"{"cwd": 5}"#,
        r#"{"command": ["ls"]}"#,
        "null",
    ] {
        let (status, answer) = daemon.post_raw("/pty", body).await;
        assert_eq!(status, 400, "body {body:?} answered {answer}");
        assert_eq!(answer["code"], "INVALID_REQUEST_BODY", "body {body:?}");
    }
    // A body too large to read keeps its status and gets the same error shape.
    let huge = format!(r#"{{"cwd": "{}"}}"#, "a".repeat(3 * 1024 * 1024));
    let (status, answer) = daemon.post_raw("/pty", &huge).await;
    assert_eq!(status, 413, "{answer}");
    assert_eq!(answer["code"], "INVALID_REQUEST_BODY", "{answer}");
    // The daemon keeps serving.
    daemon.create(json!({})).await;
}

#[tokio::test]
async fn session_limit_answers_429_too_many_sessions() {
    let daemon = start_with(Config {
        max_pty_sessions: 2,
        ..Config::default()
    })
    .await;
    let first = daemon.create(json!({})).await;
    daemon.create(json!({})).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let refused_cwd = dir.path().join("refused");
    let (status, body) = daemon
        .post_raw("/pty", &json!({ "cwd": refused_cwd }).to_string())
        .await;
    assert_eq!(
        (status, body["code"].clone()),
        (429, json!("TOO_MANY_SESSIONS")),
        "{body}"
    );
    assert!(!refused_cwd.exists(), "a refused create makes no directory");
    assert_eq!(daemon.delete(&format!("/pty/{first}")).await.0, 200);
    daemon.create(json!({})).await;
}

#[tokio::test]
async fn access_token_is_required_on_rest_and_websocket_routes() {
    let daemon = pty_support::start_with_token("s3cret").await;
    let id = daemon.create(json!({})).await;
    let anonymous = reqwest::Client::new();
    let response = tokio::time::timeout(
        pty_support::WAIT,
        anonymous.get(format!("{}/pty/{id}", daemon.base)).send(),
    )
    .await
    .expect("answered within the wait")
    .expect("answered");
    assert_eq!(response.status().as_u16(), 401);
    let body: serde_json::Value = response.json().await.expect("json");
    assert_eq!(
        body,
        json!({"error": "Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"})
    );
    let without_token = pty_support::Daemon {
        base: daemon.base.clone(),
        http: daemon.http.clone(),
        token: None,
    };
    assert_eq!(
        without_token
            .try_connect(&id, "")
            .await
            .err()
            .expect("refused")
            .0,
        401
    );
    let mut holder = daemon.connect(&id, "").await;
    holder.ping().await;
}

// --- attach, frames -----------------------------------------------------------------------

#[tokio::test]
async fn connected_frame_names_session_mode_and_role() {
    let daemon = start().await;
    let id = daemon.create(json!({})).await;
    let mut holder = daemon.try_connect(&id, "").await.expect("connects");
    let connected = holder.wait_text("connected").await;
    assert_eq!(
        connected,
        json!({"type": "connected", "session_id": id, "mode": "pty", "role": "holder"})
    );
    let mut viewer = daemon
        .try_connect(&id, "mode=viewer")
        .await
        .expect("connects");
    let connected = viewer.wait_text("connected").await;
    assert_eq!(
        connected,
        json!({"type": "connected", "session_id": id, "mode": "pty", "role": "viewer"})
    );
    let piped = daemon.create(json!({})).await;
    let mut holder = daemon.try_connect(&piped, "pty=0").await.expect("connects");
    assert_eq!(holder.wait_text("connected").await["mode"], "pipe");
}

#[tokio::test]
async fn first_holder_attach_starts_the_shell() {
    let daemon = start().await;
    let (id, _holder) = daemon.shell().await;
    let status = daemon.status(&id).await;
    assert_eq!(status["running"], true);
    assert!(status["output_offset"].as_u64().expect("offset") > 0);
}

#[tokio::test]
async fn stdin_is_forwarded_from_binary_and_json_frames() {
    let daemon = start().await;
    let (_id, mut holder) = daemon.shell().await;
    holder.run("echo binary-$((3*3))", "binary-9").await;
    holder
        .send_json(json!({"type": "stdin", "data": "echo json-$((4*4))\n"}))
        .await;
    holder.wait_output("json-16").await;
}

/// Warren's `env` on `POST /pty`: the shell gets the variables (how the gateway starts an agent
/// inside the hands with its model settings); a bad name or a NUL is 400 and makes nothing.
#[tokio::test]
async fn create_env_reaches_the_shell_and_bad_entries_are_400() {
    let daemon = start().await;
    let id = daemon
        .create(json!({"command": "echo \"value=$AGENT_SETTING\"", "env": {"AGENT_SETTING": "from-env"}}))
        .await;
    let mut holder = daemon.connect(&id, "pty=0").await;
    holder.wait_output("value=from-env").await;
    for env in [
        json!({"": "x"}),
        json!({"A=B": "x"}),
        json!({"A": "x\u{0}y"}),
        json!(["A"]),
    ] {
        let body = json!({"env": env}).to_string();
        let (status, answer) = daemon.post_raw("/pty", &body).await;
        assert_eq!(status, 400, "env {env} answered {answer}");
        assert_eq!(answer["code"], "INVALID_REQUEST_BODY", "env {env}");
    }
}

#[tokio::test]
async fn ping_gets_pong() {
    let daemon = start().await;
    let id = daemon.create(json!({})).await;
    let mut holder = daemon.connect(&id, "").await;
    holder.ping().await;
}

#[tokio::test]
async fn second_holder_is_refused_with_409_already_connected() {
    let daemon = start().await;
    let (id, mut holder) = daemon.shell().await;
    let refused = daemon.try_connect(&id, "").await.err().expect("refused");
    assert_eq!(refused.0, 409);
    assert_eq!(refused.1["code"], "ALREADY_CONNECTED");
    assert_eq!(
        refused.1["message"],
        format!("another client is already connected to pty session {id}")
    );
    holder.run("echo still-$((5+5))", "still-10").await;
}

#[tokio::test]
async fn holder_can_reattach_after_disconnecting() {
    let daemon = start().await;
    let (id, holder) = daemon.shell().await;
    drop(holder);
    // The old connection's task notices the drop asynchronously; `reconnect` retries with a
    // deadline instead of sleeping.
    let mut holder = reconnect(&daemon, &id, "").await;
    holder.run("echo back-$((6+6))", "back-12").await;
}

#[tokio::test]
async fn exit_frame_reports_code_0_after_all_output_then_closes_1000() {
    let daemon = start().await;
    let id = daemon
        .create(json!({"command": "for i in 1 2 3; do echo line-$i; done"}))
        .await;
    let mut holder = daemon.try_connect(&id, "").await.expect("connects");
    let exit = holder.wait_text("exit").await;
    assert_eq!(exit, json!({"type": "exit", "exit_code": 0}));
    let output = holder.output_text();
    assert!(
        output.contains("line-1") && output.contains("line-3"),
        "all output before exit: {output:?}"
    );
    assert_eq!(
        holder.wait_close().await,
        (1000, "process exited".to_string())
    );
    let status = daemon.status(&id).await;
    assert_eq!(status["running"], false);
}

#[tokio::test]
async fn exit_42_reports_42() {
    let daemon = start().await;
    let (_id, mut holder) = daemon.shell().await;
    holder.send_stdin("exit 42\n").await;
    assert_eq!(holder.wait_text("exit").await["exit_code"], 42);
    assert_eq!(holder.wait_close().await.0, 1000);
}

#[tokio::test]
async fn holder_gets_everything_printed_before_exit() {
    let daemon = start().await;
    let id = daemon
        .create(json!({"command": "seq 1 20000; echo tail-marker"}))
        .await;
    let mut holder = daemon.try_connect(&id, "").await.expect("connects");
    holder.wait_text("exit").await;
    let output = holder.output_text();
    assert!(
        output.contains("19999\r\n20000\r\ntail-marker"),
        "output ends {:?}",
        &output[output.len().saturating_sub(80)..]
    );
}

#[tokio::test]
async fn shell_restarts_on_the_next_attach_and_the_ring_survives() {
    let daemon = start().await;
    let (id, mut holder) = daemon.shell().await;
    holder.run("echo first-$((7*7))", "first-49").await;
    holder.send_stdin("exit 3\n").await;
    assert_eq!(holder.wait_text("exit").await["exit_code"], 3);
    let offset = daemon.output_offset(&id).await;
    let mut holder = daemon.connect(&id, "since=0").await;
    assert!(
        holder.output_text().contains("first-49"),
        "replay keeps the old shell's output"
    );
    holder.run("echo second-$((8*8))", "second-64").await;
    assert!(daemon.output_offset(&id).await > offset);
    assert_eq!(daemon.status(&id).await["running"], true);
}

#[tokio::test]
async fn reconnect_replays_output_from_since_with_its_offset() {
    let daemon = start().await;
    let (id, mut holder) = daemon.shell().await;
    holder.run("echo before-$((9*9))", "before-81").await;
    holder.close().await;
    let offset = daemon.output_offset(&id).await;
    assert!(offset > 0);
    let mut again = reconnect(&daemon, &id, "").await;
    assert_eq!(again.replays.len(), 1, "one replay frame before connected");
    assert_eq!(again.replays[0].0, 0);
    assert!(again.output_text().contains("before-81"));
    again.close().await;
    let mut tail = reconnect(&daemon, &id, &format!("since={}", offset - 3)).await;
    assert_eq!(tail.replays[0].0, offset - 3);
    tail.close().await;
    let nothing = reconnect(&daemon, &id, &format!("since={offset}")).await;
    assert!(nothing.replays.is_empty() || nothing.replays[0].0 >= offset);
}

/// Connects as holder once the previous holder's connection is gone (409 until then).
async fn reconnect(daemon: &pty_support::Daemon, id: &str, query: &str) -> pty_support::Client {
    let deadline = tokio::time::Instant::now() + pty_support::WAIT;
    let mut client = loop {
        match daemon.try_connect(id, query).await {
            Ok(client) => break client,
            Err((409, _)) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(other) => panic!("reconnect refused: {other:?}"),
        }
    };
    client.wait_text("connected").await;
    client
}

#[tokio::test]
async fn since_values_are_parsed_leniently() {
    let daemon = start().await;
    let (id, mut holder) = daemon.shell().await;
    holder.run("echo since-$((2*21))", "since-42").await;
    holder.close().await;
    for (since, offset) in [
        ("-5", 0),
        ("abc", 0),
        ("12abc", 12),
        ("99999999999999999999", 0),
    ] {
        let mut client = reconnect(&daemon, &id, &format!("since={since}")).await;
        assert_eq!(
            client.replays.first().map(|r| r.0),
            Some(offset),
            "since={since}"
        );
        client.close().await;
    }
    // A huge but valid offset replays nothing.
    let mut client = reconnect(&daemon, &id, "since=18446744073709551615").await;
    assert!(client.replays.is_empty());
    client.ping().await;
}

#[tokio::test]
async fn since_before_the_oldest_retained_byte_is_clamped() {
    let daemon = start().await;
    let id = daemon
        .create(json!({"command": "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo end-marker"}))
        .await;
    let mut holder = daemon.try_connect(&id, "pty=0").await.expect("connects");
    holder.wait_text("exit").await;
    holder.wait_close().await;
    let total = daemon.output_offset(&id).await;
    assert_eq!(total, 3_000_000 + 1 + 11);
    let mut viewer_like = reconnect(&daemon, &id, "since=5&pty=0").await;
    let (offset, bytes) = viewer_like.replays[0].clone();
    assert_eq!(
        offset,
        total - 1024 * 1024,
        "clamped to the oldest retained byte"
    );
    assert_eq!(bytes.len(), 1024 * 1024);
    assert!(String::from_utf8_lossy(&bytes).ends_with("x\nend-marker\n"));
    viewer_like.ping().await;
}

// --- viewers ------------------------------------------------------------------------------

#[tokio::test]
async fn viewer_before_the_shell_starts_is_refused_with_409() {
    let daemon = start().await;
    let id = daemon.create(json!({})).await;
    let refused = daemon
        .try_connect(&id, "mode=viewer")
        .await
        .err()
        .expect("refused");
    assert_eq!(refused.0, 409);
    assert_eq!(refused.1["code"], "VIEWER_REQUIRES_RUNNING_SESSION");
}

#[tokio::test]
async fn viewers_get_replay_then_live_output_and_do_not_take_the_holder_lock() {
    let daemon = start().await;
    let (id, mut holder) = daemon.shell().await;
    holder.run("echo old-$((1+2))", "old-3").await;
    let mut viewer = daemon
        .try_connect(&id, "mode=viewer")
        .await
        .expect("connects");
    match viewer.next_event("the replay frame").await {
        Event::Replay(0, bytes) => assert!(String::from_utf8_lossy(&bytes).contains("old-3")),
        other => panic!("expected a replay frame first, got {other:?}"),
    }
    viewer.wait_text("connected").await;
    let mut second = daemon.connect(&id, "mode=viewer").await;
    holder.run("echo new-$((2+3))", "new-5").await;
    viewer.wait_output("new-5").await;
    second.wait_output("new-5").await;
    assert!(viewer.stdout.is_empty(), "viewers only get 0x03 frames");
    let offsets: Vec<u64> = viewer.replays.iter().map(|r| r.0).collect();
    let mut expected = 0;
    for (offset, bytes) in &viewer.replays {
        assert_eq!(*offset, expected, "contiguous offsets {offsets:?}");
        expected += bytes.len() as u64;
    }
    assert_eq!(
        daemon
            .try_connect(&id, "")
            .await
            .err()
            .expect("holder still holds")
            .0,
        409
    );
}

#[tokio::test]
async fn viewer_writes_are_rejected_with_no_effect() {
    let daemon = start().await;
    let (id, mut holder) = daemon.shell().await;
    let mut viewer = daemon.connect(&id, "mode=viewer").await;
    viewer.send_stdin("echo viewer-$((10+1))\n").await;
    assert_eq!(viewer.wait_text("error").await["code"], "READ_ONLY");
    viewer
        .send_json(json!({"type": "resize", "cols": 120, "rows": 40}))
        .await;
    assert_eq!(viewer.wait_text("error").await["code"], "READ_ONLY");
    viewer
        .send_json(json!({"type": "signal", "signal": "SIGINT"}))
        .await;
    assert_eq!(viewer.wait_text("error").await["code"], "READ_ONLY");
    viewer
        .send_json(json!({"type": "stdin", "data": "exit\n"}))
        .await;
    assert_eq!(viewer.wait_text("error").await["code"], "READ_ONLY");
    viewer.ping().await;
    holder
        .run("stty size; echo size-$((20+1))", "size-21")
        .await;
    let output = holder.output_text();
    assert!(output.contains("24 80"), "size unchanged: {output:?}");
    assert!(!output.contains("viewer-11"), "viewer stdin had no effect");
}

#[tokio::test]
async fn viewer_is_disconnected_with_1008_after_five_rejected_frames() {
    let daemon = start().await;
    let (id, _holder) = daemon.shell().await;
    let mut viewer = daemon.connect(&id, "mode=viewer").await;
    for _ in 0..5 {
        viewer.send_stdin("x").await;
    }
    let (code, _) = viewer.wait_close().await;
    assert_eq!(code, 1008);
    let n_read_only = viewer
        .texts
        .iter()
        .filter(|t| t["code"] == "READ_ONLY")
        .count();
    assert_eq!(n_read_only, 5);
}

#[tokio::test]
async fn viewer_sees_final_output_before_exit() {
    let daemon = start().await;
    let (id, mut holder) = daemon.shell().await;
    let mut viewer = daemon.connect(&id, "mode=viewer").await;
    holder.send_stdin("echo final-$((6*7)); exit 7\n").await;
    let exit = viewer.wait_text("exit").await;
    assert_eq!(exit["exit_code"], 7);
    assert!(
        viewer.output_text().contains("final-42"),
        "final output before exit"
    );
    assert_eq!(
        viewer.wait_close().await,
        (1000, "process exited".to_string())
    );
}

#[tokio::test]
async fn one_viewer_leaving_does_not_disturb_others() {
    let daemon = start().await;
    let (id, mut holder) = daemon.shell().await;
    let leaving = daemon.connect(&id, "mode=viewer").await;
    let mut staying = daemon.connect(&id, "mode=viewer").await;
    drop(leaving);
    holder.run("echo after-$((3*5))", "after-15").await;
    staying.wait_output("after-15").await;
    staying.ping().await;
}

#[tokio::test]
async fn viewer_survives_takeover_and_sees_the_new_holder() {
    let daemon = start().await;
    let (id, mut old) = daemon.shell().await;
    let mut viewer = daemon.connect(&id, "mode=viewer").await;
    let mut new = daemon.connect(&id, "takeover=1").await;
    assert_eq!(old.wait_close().await.0, 4001);
    new.run("echo taken-$((4*25))", "taken-100").await;
    viewer.wait_output("taken-100").await;
}

#[tokio::test]
async fn viewer_in_pipe_mode_gets_combined_output() {
    let daemon = start().await;
    let id = daemon.create(json!({})).await;
    let mut holder = daemon.connect(&id, "pty=0").await;
    let mut viewer = daemon.connect(&id, "mode=viewer").await;
    assert_eq!(viewer.texts.last().expect("connected")["mode"], "pipe");
    holder
        .send_stdin("echo out-$((1+1)); echo err-$((2+2)) >&2\n")
        .await;
    viewer.wait_output("out-2").await;
    viewer.wait_output("err-4").await;
    assert!(
        viewer.stderr.is_empty() && viewer.stdout.is_empty(),
        "viewers get 0x03 only"
    );
}

// --- takeover -----------------------------------------------------------------------------

#[tokio::test]
async fn takeover_evicts_with_4001_and_keeps_shell_state() {
    let daemon = start().await;
    let (id, mut old) = daemon.shell().await;
    old.run(
        "export KEEP=kept-$((11*11)); cd /tmp; echo set-$((1+0))",
        "set-1",
    )
    .await;
    let mut new = daemon.connect(&id, "takeover=1").await;
    assert_eq!(old.wait_close().await, (4001, "TAKEN_OVER".to_string()));
    assert!(
        new.output_text().contains("set-1"),
        "the newcomer gets the replay"
    );
    new.run("echo $KEEP $PWD", "kept-121 /tmp").await;
}

#[tokio::test]
async fn takeover_succeeds_when_the_old_holder_stopped_reading() {
    let daemon = start().await;
    let id = daemon.create(json!({"command": "yes"})).await;
    let stalled = daemon.connect(&id, "pty=0").await;
    // `stalled` reads nothing more: once a few MB are out its socket is full and the daemon's
    // send to it waits.
    daemon
        .wait_for_output_offset(&id, 4_000_000, pty_support::WAIT)
        .await;
    let mut new = daemon
        .try_connect(&id, "takeover=1")
        .await
        .expect("upgrades");
    loop {
        match new.next_event("connected after the takeover").await {
            Event::Text(value) if value["type"] == "connected" => break,
            Event::Text(value) if value["type"] == "error" => panic!("takeover refused: {value}"),
            Event::Close(code, reason) => panic!("closed ({code} {reason})"),
            _ => {}
        }
    }
    assert_eq!(daemon.delete(&format!("/pty/{id}")).await.0, 200);
    drop(stalled.ws);
}

#[tokio::test]
async fn takeover_on_a_free_session_connects() {
    let daemon = start().await;
    let id = daemon.create(json!({})).await;
    let mut holder = daemon.connect(&id, "takeover=1").await;
    holder.run("echo free-$((1+1))", "free-2").await;
}

#[tokio::test]
async fn plain_get_with_takeover_gets_409_and_evicts_nobody() {
    let daemon = start().await;
    let (id, mut holder) = daemon.shell().await;
    let (status, body) = daemon.get(&format!("/pty/{id}/ws?takeover=1")).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["code"], "ALREADY_CONNECTED");
    holder.run("echo alive-$((2+2))", "alive-4").await;
}

#[tokio::test]
async fn six_concurrent_takeovers_leave_a_working_session() {
    let daemon = start().await;
    let (id, _holder) = daemon.shell().await;
    let attempts = (0..6).map(|_| daemon.try_connect(&id, "takeover=1"));
    let mut clients = Vec::new();
    for client in futures_util::future::join_all(attempts).await {
        let mut client = client.expect("takeover handshakes succeed");
        // Each takeover is served in turn: `connected` (and later 4001), or ALREADY_CONNECTED.
        loop {
            match client.next_event("connected or an error frame").await {
                Event::Text(value) if value["type"] == "connected" || value["type"] == "error" => {
                    break;
                }
                Event::Close(code, reason) => panic!("closed ({code} {reason}) before connected"),
                _ => {}
            }
        }
        clients.push(client);
    }
    let mut last = daemon.connect(&id, "takeover=1").await;
    last.run("echo works-$((5*5))", "works-25").await;
    assert_eq!(daemon.status(&id).await["running"], true);
    assert_eq!(
        daemon
            .try_connect(&id, "")
            .await
            .err()
            .expect("one holder")
            .0,
        409
    );
}

// --- terminal control ---------------------------------------------------------------------

#[tokio::test]
async fn resize_makes_stty_print_40_120() {
    let daemon = start().await;
    let (_id, mut holder) = daemon.shell().await;
    holder
        .send_json(json!({"type": "resize", "cols": 120, "rows": 40}))
        .await;
    holder
        .run("stty size; echo sized-$((1+1))", "sized-2")
        .await;
    assert!(
        holder.output_text().contains("40 120"),
        "{:?}",
        holder.output_text()
    );
}

#[tokio::test]
async fn resize_with_zero_is_ignored_and_huge_sizes_are_invalid_frames() {
    let daemon = start().await;
    let (_id, mut holder) = daemon.shell().await;
    holder
        .send_json(json!({"type": "resize", "cols": 0, "rows": 40}))
        .await;
    holder
        .send_json(json!({"type": "resize", "cols": -3, "rows": 0}))
        .await;
    holder
        .send_invalid(json!({"type": "resize", "cols": 100000, "rows": 40}))
        .await;
    holder
        .send_invalid(
            json!({"type": "resize", "cols": 99999999999999u64, "rows": 99999999999999u64}),
        )
        .await;
    holder.run("stty size; echo same-$((1+1))", "same-2").await;
    assert!(holder.output_text().contains("24 80"));
}

#[tokio::test]
async fn sigint_interrupts_sleep_and_the_shell_survives() {
    let daemon = start().await;
    let (_id, mut holder) = daemon.shell().await;
    holder
        .send_stdin("sleep 30.4242; echo slept-$((3+3))\n")
        .await;
    // Wait until sleep runs (then it is the terminal's foreground job) before interrupting it.
    let sleep_running = || {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                std::fs::read_to_string(e.path().join("cmdline"))
                    .is_ok_and(|c| c == "sleep\u{0}30.4242\u{0}")
            })
    };
    eventually("sleep 30 runs", sleep_running).await;
    holder
        .send_json(json!({"type": "signal", "signal": "SIGINT"}))
        .await;
    holder.run("echo survived-$((4+4))", "survived-8").await;
    assert!(
        !holder.output_text().contains("slept-6"),
        "sleep was interrupted, not finished"
    );
}

#[tokio::test]
async fn unknown_signal_names_get_invalid_frame() {
    let daemon = start().await;
    let (_id, mut holder) = daemon.shell().await;
    for name in ["SIGFOO", "", "sigint", "9"] {
        holder
            .send_invalid(json!({"type": "signal", "signal": name}))
            .await;
    }
    holder.run("echo ok-$((1+1))", "ok-2").await;
}

#[tokio::test]
async fn pipe_mode_separates_stderr() {
    let daemon = start().await;
    let id = daemon.create(json!({})).await;
    let mut holder = daemon.connect(&id, "pty=0").await;
    holder
        .send_stdin("echo to-out-$((1+1)); echo to-err-$((2+2)) >&2\n")
        .await;
    holder.wait_output("to-out-2").await;
    holder.wait_output("to-err-4").await;
    assert_eq!(String::from_utf8_lossy(&holder.stdout), "to-out-2\n");
    assert_eq!(String::from_utf8_lossy(&holder.stderr), "to-err-4\n");
}

#[tokio::test]
async fn concurrent_stdout_and_stderr_writers_keep_the_offset_exact() {
    let daemon = start().await;
    let command = "head -c 300000 /dev/zero & head -c 200000 /dev/zero >&2; wait";
    let id = daemon.create(json!({ "command": command })).await;
    let mut holder = daemon.try_connect(&id, "pty=0").await.expect("connects");
    assert_eq!(holder.wait_text("exit").await["exit_code"], 0);
    // Anything printed before the attach subscribed arrives in the replay instead.
    let replayed: usize = holder.replays.iter().map(|(_, bytes)| bytes.len()).sum();
    assert_eq!(
        holder.stdout.len() + holder.stderr.len() + replayed,
        500_000
    );
    assert_eq!(daemon.status(&id).await["output_offset"], 500_000);
}

// --- teardown -----------------------------------------------------------------------------

#[tokio::test]
async fn delete_kills_every_process_including_background_jobs() {
    let daemon = start().await;
    let (id, mut holder) = daemon.shell().await;
    // In the subshell job control is off, so setsid detaches `sleep` itself (no fork) and `$!`
    // is its pid.
    let line = "sleep 1000 & echo bg=$!; (setsid sleep 1001 & echo ss=$!); echo pids-$((1+1))";
    let [background, detached] = holder.run_for_pids(line, "pids-2", ["bg=", "ss="]).await;
    assert!(alive(background) && alive(detached));
    let (status, body) = daemon.delete(&format!("/pty/{id}")).await;
    assert_eq!((status, body.as_str()), (200, ""));
    eventually("background jobs are dead", || {
        !alive(background) && !alive(detached)
    })
    .await;
    assert_eq!(daemon.delete(&format!("/pty/{id}")).await.0, 404);
    assert_eq!(daemon.get(&format!("/pty/{id}")).await.0, 404);
    assert_eq!(holder.wait_close().await.0, 1000);
}

#[tokio::test]
async fn daemon_shutdown_kills_every_session_shell_and_its_jobs() {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (daemon, served) = pty_support::start_with_shutdown(Config::default(), async move {
        let _ = stopped.await;
    })
    .await;
    let (_first, mut holder) = daemon.shell().await;
    let line = "sleep 1002 & echo job=$!; echo sh=$$; echo ok-$((1+1))";
    let [job, shell] = holder.run_for_pids(line, "ok-2", ["job=", "sh="]).await;
    let second = daemon.create(json!({})).await;
    let mut piped = daemon.connect(&second, "pty=0").await;
    let [piped_shell] = piped
        .run_for_pids("echo pipe-sh=$$; echo ok-$((2+2))", "ok-4", ["pipe-sh="])
        .await;
    assert!(alive(job) && alive(shell) && alive(piped_shell));
    stop.send(()).expect("daemon still running");
    tokio::time::timeout(pty_support::WAIT, served)
        .await
        .expect("serve returns")
        .expect("serve task");
    eventually("every shell and job is dead", || {
        !alive(job) && !alive(shell) && !alive(piped_shell)
    })
    .await;
}

// --- limits and robustness ----------------------------------------------------------------

#[tokio::test]
async fn holder_that_never_reads_does_not_block_the_shell() {
    let daemon = start().await;
    let id = daemon
        .create(json!({"command": "head -c 48000000 /dev/zero | tr '\\0' x; sleep 1000"}))
        .await;
    let mut holder = daemon.try_connect(&id, "pty=0").await.expect("connects");
    // The holder reads nothing while 48 MB are produced: the shell must get through them all.
    let offset = daemon
        .wait_for_output_offset(&id, 48_000_000, std::time::Duration::from_secs(60))
        .await;
    // The holder that fell behind was disconnected: with close code 1013 if the close frame
    // got through its full socket in time, else the connection just ends. It may reconnect
    // with since.
    let (code, reason) = holder.wait_close().await;
    assert!(code == 1013 || code == 1006, "{code} {reason}");
    let mut again = reconnect(&daemon, &id, &format!("since={offset}&pty=0")).await;
    again.ping().await;
    // The shell is still in `sleep 1000`; DELETE is what ends it (and the test leaves nothing).
    assert_eq!(daemon.delete(&format!("/pty/{id}")).await.0, 200);
}

#[tokio::test]
async fn oversized_frames_close_with_1009() {
    let daemon = start().await;
    let id = daemon.create(json!({})).await;
    let mut holder = daemon.connect(&id, "").await;
    holder
        .send(Message::Binary(vec![0u8; 2 * 1024 * 1024].into()))
        .await;
    assert_eq!(holder.wait_close().await.0, 1009);
    let mut next = daemon.connect(&id, "takeover=1").await;
    next.run("echo fine-$((1+1))", "fine-2").await;
}

#[tokio::test]
async fn non_json_text_frames_are_ignored() {
    let daemon = start().await;
    let (_id, mut holder) = daemon.shell().await;
    for text in ["hello", "{", "", "\u{0}"] {
        holder.send(Message::Text(text.into())).await;
    }
    holder.ping().await;
    assert!(
        holder.texts.iter().all(|t| t["type"] != "error"),
        "{:?}",
        holder.texts
    );
}

#[tokio::test]
async fn unknown_frame_types_get_invalid_frame_and_the_connection_stays_open() {
    let daemon = start().await;
    let (_id, mut holder) = daemon.shell().await;
    for frame in [
        json!({"type": "dance"}),
        json!({"no_type": 1}),
        json!([1, 2]),
        json!({"type": "stdin"}),
    ] {
        holder.send_invalid(frame).await;
    }
    holder.run("echo open-$((1+1))", "open-2").await;
}

#[tokio::test]
async fn unknown_binary_channels_and_empty_frames_are_ignored() {
    let daemon = start().await;
    let (_id, mut holder) = daemon.shell().await;
    holder.send(Message::Binary(Vec::new().into())).await;
    holder.send(Message::Binary(vec![0u8].into())).await;
    holder
        .send(Message::Binary(b"\x07echo nope-$((1+1))\n".to_vec().into()))
        .await;
    holder
        .send(Message::Binary(b"\x01echo nope-$((1+2))\n".to_vec().into()))
        .await;
    holder.run("echo yes-$((1+3))", "yes-4").await;
    let output = holder.output_text();
    assert!(
        !output.contains("nope-2") && !output.contains("nope-3"),
        "{output:?}"
    );
    assert!(holder.texts.iter().all(|t| t["type"] != "error"));
}

#[tokio::test]
async fn start_failure_sends_start_failed_and_closes() {
    let daemon = start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let id = daemon.create(json!({"cwd": dir.path().join("gone")})).await;
    // Make the cwd impossible to create: a file where its parent directory should be.
    std::fs::remove_dir_all(dir.path().join("gone")).expect("removes cwd");
    std::fs::write(dir.path().join("gone"), b"").expect("blocks the cwd with a file");
    let mut holder = daemon.try_connect(&id, "").await.expect("upgrades");
    assert_eq!(holder.wait_text("error").await["code"], "START_FAILED");
    assert_eq!(holder.wait_close().await.0, 1011);
    assert_eq!(daemon.status(&id).await["running"], false);
}

// --- keepalive and takeover timeouts (shortened through the daemon's hidden flags) ----------

#[tokio::test]
async fn server_pings_attached_clients_and_an_answering_client_stays() {
    let daemon = start_with(Config {
        pty_ping_interval_ms: 100,
        pty_silence_timeout_ms: 2_000,
        ..Config::default()
    })
    .await;
    let (id, mut holder) = daemon.shell().await;
    let mut viewer = daemon.connect(&id, "mode=viewer").await;
    viewer.wait_ws_ping().await;
    // A viewer that is not read answers no pings and would be dropped: it leaves now.
    viewer.close().await;
    // The client answers every ping (tungstenite sends the pong on its next read), so pings
    // keep coming well past the silence timeout: 25 pings are at least 2.5 s apart in all.
    for _ in 0..25 {
        holder.wait_ws_ping().await;
    }
    holder.run("echo still-$((2+3))", "still-5").await;
    assert_eq!(daemon.delete(&format!("/pty/{id}")).await.0, 200);
}

#[tokio::test]
async fn a_silent_holder_is_dropped_and_the_shell_lives_on() {
    let daemon = start_with(Config {
        pty_ping_interval_ms: 100,
        pty_silence_timeout_ms: 1_000,
        ..Config::default()
    })
    .await;
    let (id, mut silent) = daemon.shell().await;
    silent
        .run("MARK=kept-$((3+4)); echo set-$((1+1))", "set-2")
        .await;
    // `silent` now neither reads nor sends, so it answers no ping: once the silence timeout
    // has passed the daemon drops it and the holder slot is free for a plain attach.
    let deadline = tokio::time::Instant::now() + pty_support::WAIT;
    let mut next = loop {
        match daemon.try_connect(&id, "").await {
            Ok(client) => break client,
            Err((409, _)) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the silent holder was not dropped within {:?}",
                    pty_support::WAIT
                );
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err((status, body)) => panic!("attach refused: {status} {body}"),
        }
    };
    next.wait_text("connected").await;
    // Same shell, same state.
    next.run("echo got-$MARK", "got-kept-7").await;
    assert_eq!(daemon.status(&id).await["running"], true);
    // The dropped connection just ended (no close frame).
    assert_eq!(silent.wait_close().await.0, 1006);
    assert_eq!(daemon.delete(&format!("/pty/{id}")).await.0, 200);
}

#[tokio::test]
async fn takeover_that_cannot_evict_the_holder_in_time_gets_already_connected() {
    let daemon = start_with(Config {
        pty_takeover_timeout_ms: 300,
        // Longer than the test: the stuck stdin write below ends only when the test unblocks it.
        pty_write_timeout_ms: 300_000,
        ..Config::default()
    })
    .await;
    // Takes one byte of stdin, then reads none until its background sleep is killed, then
    // drains the rest. Background jobs of `bash -c` read /dev/null, not the pipe.
    let script = "head -c 1 >/dev/null; sleep 1000 & echo \"sleeper=$! armed\"; wait; \
                  echo resumed-$((6+6)); cat >/dev/null";
    let id = daemon.create(json!({"command": script})).await;
    let mut holder = daemon.connect(&id, "pty=0").await;
    let mut viewer = daemon.connect(&id, "mode=viewer").await;
    // Far more than a pipe holds: once `head` took its byte, the holder's connection task
    // waits in its stdin write and cannot act on a takeover until the shell reads again.
    holder.send_stdin(&"x".repeat(900 * 1024)).await;
    viewer.wait_output("armed").await;
    let sleeper = pty_support::pid_after(&viewer.output_text(), "sleeper=");

    let mut newcomer = daemon
        .try_connect(&id, "pty=0&takeover=1")
        .await
        .expect("upgrades");
    let error = newcomer.wait_text("error").await;
    assert_eq!(error["code"], "ALREADY_CONNECTED", "{error}");
    assert_eq!(newcomer.wait_close().await.0, 1008);
    // The old holder keeps the session.
    let refused = daemon.try_connect(&id, "pty=0").await.err();
    assert_eq!(refused.expect("refused").0, 409);

    // Once the shell reads its stdin again, the old holder carries on: it gets the output it
    // missed meanwhile and still answers.
    let pid = rustix::process::Pid::from_raw(sleeper).expect("a valid pid");
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).expect("kills the sleeper");
    holder.wait_output("resumed-12").await;
    holder.ping().await;
    assert!(
        holder.texts.iter().all(|t| t["type"] != "error"),
        "{:?}",
        holder.texts
    );
    viewer.wait_output("resumed-12").await;
    assert_eq!(daemon.delete(&format!("/pty/{id}")).await.0, 200);
}

#[tokio::test]
async fn exit_is_reported_even_when_a_background_job_keeps_printing() {
    let daemon = start().await;
    // The background loop keeps the output pipe open and prints more often than any quiet
    // period: the shell's exit must still be reported, and the session show it stopped.
    let command = "(while :; do echo tick; sleep 0.02; done) & echo started; exit 5";
    let id = daemon.create(json!({ "command": command })).await;
    let mut holder = daemon.try_connect(&id, "pty=0").await.expect("connects");
    assert_eq!(holder.wait_text("exit").await["exit_code"], 5);
    assert!(holder.output_text().contains("started"));
    assert_eq!(daemon.status(&id).await["running"], false);
    assert_eq!(daemon.delete(&format!("/pty/{id}")).await.0, 200);
}

/// Checks that every whole 16-byte line of `seq -f '%015.0f'` output inside a `0x03` frame
/// holds the number its absolute offset says: the frame's offset and bytes agree.
fn assert_seq_frame_consistent(offset: u64, bytes: &[u8]) {
    let first_line = offset.div_ceil(16);
    let mut line = first_line;
    while (line + 1) * 16 <= offset + bytes.len() as u64 {
        let at = (line * 16 - offset) as usize;
        let text = std::str::from_utf8(&bytes[at..at + 16]).expect("seq output is ASCII");
        assert_eq!(
            text,
            format!("{line:015}\n"),
            "frame at offset {offset} (len {}) has the wrong bytes at {}",
            bytes.len(),
            line * 16
        );
        line += 1;
    }
}

#[tokio::test]
async fn viewer_frames_match_their_offsets_and_a_stalled_viewer_skips_ahead() {
    // The stalled viewer's socket is full until the output has streamed: on a loaded machine
    // that can take longer than the default write timeout, which would drop the viewer rather
    // than show it skipping ahead (the write timeout has tests of its own).
    let daemon = start_with(Config {
        pty_write_timeout_ms: 300_000,
        ..Config::default()
    })
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let go = dir.path().join("go");
    let n_lines: u64 = 4_000_000;
    let command = format!(
        "while [ ! -e '{}' ]; do sleep 0.02; done; seq -f '%015.0f' 0 {}; sleep 1000",
        go.display(),
        n_lines - 1
    );
    let id = daemon.create(json!({ "command": command })).await;
    // The holder never reads: it is disconnected once too far behind, and blocks nothing.
    let _holder = daemon.connect(&id, "pty=0").await;
    let mut stalled = daemon.connect(&id, "mode=viewer").await;
    std::fs::write(&go, b"").expect("starts the output");
    let total = n_lines * 16;
    // Viewers attach while output streams: each replay is one contiguous piece of the ring.
    let mut n_replays = 0;
    while daemon.output_offset(&id).await < total {
        let mut viewer = daemon
            .try_connect(&id, "mode=viewer")
            .await
            .expect("connects");
        if let Event::Replay(offset, bytes) = viewer.next_event("a replay frame").await {
            assert_seq_frame_consistent(offset, &bytes);
            n_replays += 1;
        }
    }
    assert!(n_replays > 0, "no viewer attached while output streamed");
    daemon
        .wait_for_output_offset(&id, total, std::time::Duration::from_secs(60))
        .await;
    // The viewer that read nothing fell more than the ring behind: its frames jump ahead, and
    // each one's bytes are those of its offset.
    let deadline = tokio::time::Instant::now() + pty_support::WAIT;
    let mut end = None;
    let mut skipped = false;
    while end != Some(total) {
        match stalled
            .next_event_by("the stalled viewer's frames", deadline)
            .await
        {
            Event::Replay(offset, bytes) => {
                assert_seq_frame_consistent(offset, &bytes);
                if let Some(end) = end {
                    assert!(offset >= end, "offsets go forward: {offset} after {end}");
                    skipped |= offset > end;
                }
                end = Some(offset + bytes.len() as u64);
                stalled.all_output.clear();
            }
            Event::Close(code, reason) => panic!("viewer closed ({code} {reason})"),
            _ => {}
        }
    }
    assert!(skipped, "a viewer more than the ring behind skips ahead");
    stalled.ping().await;
    assert_eq!(daemon.delete(&format!("/pty/{id}")).await.0, 200);
}

#[tokio::test]
async fn signal_in_pipe_mode_goes_to_the_shells_group_and_a_killed_shell_exits_with_minus_1() {
    let daemon = start().await;
    // Without job control the background `sleep` shares the shell's process group: a signal to
    // the group reaches it, one to the shell alone would not.
    let id = daemon
        .create(json!({"command": "sleep 1004 & echo bg=$!; echo waiting-$((1+1)); wait"}))
        .await;
    let mut holder = daemon.connect(&id, "pty=0").await;
    holder.wait_output("waiting-2").await;
    let background = pty_support::pid_after(&holder.output_text(), "bg=");
    assert!(alive(background));
    holder
        .send_json(json!({"type": "signal", "signal": "SIGTERM"}))
        .await;
    assert_eq!(holder.wait_text("exit").await["exit_code"], -1);
    assert_eq!(
        holder.wait_close().await,
        (1000, "process exited".to_string())
    );
    eventually("the background job got the signal too", || {
        !alive(background)
    })
    .await;
    assert_eq!(daemon.status(&id).await["running"], false);
}

#[tokio::test]
async fn resize_in_pipe_mode_is_a_no_op() {
    let daemon = start().await;
    let id = daemon.create(json!({})).await;
    let mut holder = daemon.connect(&id, "pty=0").await;
    holder
        .send_json(json!({"type": "resize", "cols": 120, "rows": 40}))
        .await;
    holder.run("echo piped-$((2+5))", "piped-7").await;
    assert!(holder.texts.iter().all(|t| t["type"] != "error"));
}

#[tokio::test]
async fn pty_0_only_matters_when_the_attach_starts_the_shell() {
    let daemon = start().await;
    let (id, holder) = daemon.shell().await;
    drop(holder);
    let mut again = reconnect(&daemon, &id, "pty=0").await;
    assert_eq!(again.texts.last().expect("connected")["mode"], "pty");
    again
        .run("tty; echo still-pty-$((1+1))", "still-pty-2")
        .await;
    assert!(again.output_text().contains("/dev/pts/"));
}

#[tokio::test]
async fn viewer_mode_takes_precedence_over_takeover() {
    let daemon = start().await;
    let (id, mut holder) = daemon.shell().await;
    let viewer = daemon.connect(&id, "mode=viewer&takeover=1").await;
    assert_eq!(viewer.texts.last().expect("connected")["role"], "viewer");
    holder.run("echo kept-$((3+3))", "kept-6").await;
    assert!(holder.closed.is_none(), "the holder was not evicted");
}

#[tokio::test]
async fn holder_replay_comes_before_connected() {
    let daemon = start().await;
    let (id, mut holder) = daemon.shell().await;
    holder.run("echo first-$((1+1))", "first-2").await;
    holder.close().await;
    let deadline = tokio::time::Instant::now() + pty_support::WAIT;
    let mut again = loop {
        match daemon.try_connect(&id, "").await {
            Ok(client) => break client,
            Err((409, _)) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(other) => panic!("reconnect refused: {other:?}"),
        }
    };
    match again.next_event("the replay frame").await {
        Event::Replay(0, bytes) => assert!(String::from_utf8_lossy(&bytes).contains("first-2")),
        other => panic!("expected the replay first, got {other:?}"),
    }
    match again.next_event("connected").await {
        Event::Text(value) => assert_eq!(value["type"], "connected", "{value}"),
        other => panic!("expected connected after the replay, got {other:?}"),
    }
}

#[tokio::test]
async fn stdin_to_a_shell_that_closed_it_gets_stdin_write_failed() {
    let daemon = start().await;
    let id = daemon
        .create(json!({"command": "exec 0<&-; echo closed-$((2+2)); sleep 1000"}))
        .await;
    let mut holder = daemon.connect(&id, "pty=0").await;
    holder.wait_output("closed-4").await;
    holder.send_stdin("hello\n").await;
    assert_eq!(
        holder.wait_text("error").await["code"],
        "STDIN_WRITE_FAILED"
    );
    holder.ping().await;
    assert_eq!(daemon.delete(&format!("/pty/{id}")).await.0, 200);
}

#[tokio::test]
async fn a_wrong_access_token_is_refused_and_ping_needs_none() {
    let daemon = pty_support::start_with_token("right-token").await;
    let id = daemon.create(json!({})).await;
    let wrong = pty_support::Daemon {
        base: daemon.base.clone(),
        http: daemon.http.clone(),
        token: Some("wrong-token".into()),
    };
    let unauthorized =
        json!({"error": "Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"});
    assert_eq!(
        wrong.get(&format!("/pty/{id}")).await,
        (401, unauthorized.clone())
    );
    assert_eq!(
        wrong.post_raw("/pty", "{}").await,
        (401, unauthorized.clone())
    );
    assert_eq!(wrong.delete(&format!("/pty/{id}")).await.0, 401);
    assert_eq!(
        wrong.try_connect(&id, "").await.err(),
        Some((401, unauthorized))
    );
    let anonymous = pty_support::Daemon {
        token: None,
        ..wrong
    };
    assert_eq!(anonymous.get("/ping").await.0, 200);
    // The session is untouched.
    assert_eq!(daemon.status(&id).await["running"], false);
}

#[tokio::test]
async fn shell_that_exits_while_detached_is_replaced_on_the_next_attach() {
    let daemon = start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let flag = dir.path().join("exit-now");
    let (id, mut holder) = daemon.shell().await;
    let line = format!(
        "echo old-sh=$$ up-$((1+2)); while [ ! -e '{}' ]; do sleep 0.02; done; exit 9",
        flag.display()
    );
    let [old_shell] = holder.run_for_pids(&line, "up-3", ["old-sh="]).await;
    holder.close().await;
    std::fs::write(&flag, b"").expect("lets the shell exit");
    let deadline = tokio::time::Instant::now() + pty_support::WAIT;
    while daemon.status(&id).await["running"] == true {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the detached shell's exit was not noticed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let mut again = reconnect(&daemon, &id, "").await;
    assert!(again.output_text().contains("up-3"), "the replay keeps it");
    let [new_shell] = again
        .run_for_pids("echo new-sh=$$ fresh-$((2+2))", "fresh-4", ["new-sh="])
        .await;
    assert_ne!(new_shell, old_shell, "a new shell runs");
    assert_eq!(daemon.status(&id).await["running"], true);
}

#[tokio::test]
async fn a_viewer_whose_write_waits_past_the_write_timeout_is_dropped() {
    // A write that can complete at once never times out, so even 1 ms only catches a write
    // that has to wait for the client. `yes` produces fast enough that anything longer could
    // outlast the whole test below.
    let daemon = start_with(Config {
        pty_write_timeout_ms: 1,
        ..Config::default()
    })
    .await;
    // Output starts only once both are attached, so their first frames are small.
    let dir = tempfile::tempdir().expect("temp dir");
    let go = dir.path().join("go");
    let command = format!(
        "while [ ! -e '{}' ]; do sleep 0.02; done; exec yes",
        go.display()
    );
    let id = daemon.create(json!({ "command": command })).await;
    let _holder = daemon.connect(&id, "pty=0").await;
    let mut viewer = daemon.connect(&id, "mode=viewer").await;
    std::fs::write(&go, b"").expect("starts the output");
    // The viewer reads nothing while far more than any socket buffer holds is produced: once
    // its buffers are full, the daemon's next write to it has to wait, and is given up.
    daemon
        .wait_for_output_offset(&id, 200_000_000, std::time::Duration::from_secs(60))
        .await;
    // What was buffered is still readable; then the connection ends without a close frame.
    let deadline = tokio::time::Instant::now() + pty_support::WAIT;
    loop {
        match viewer
            .next_event_by("the dropped viewer's end", deadline)
            .await
        {
            Event::Close(code, _) => {
                assert_eq!(code, 1006, "dropped, not closed");
                break;
            }
            _ => {
                viewer.all_output.clear();
                viewer.replays.clear();
            }
        }
    }
    assert_eq!(daemon.status(&id).await["running"], true);
    assert_eq!(daemon.delete(&format!("/pty/{id}")).await.0, 200);
}

#[tokio::test]
async fn plain_get_on_a_free_session_is_426_upgrade_required_and_starts_nothing() {
    let daemon = start().await;
    let id = daemon.create(json!({})).await;
    let (status, body) = daemon.get(&format!("/pty/{id}/ws")).await;
    assert_eq!(
        (status, body["code"].clone()),
        (426, json!("UPGRADE_REQUIRED")),
        "{body}"
    );
    assert_eq!(daemon.status(&id).await["running"], false);
    let mut holder = daemon.connect(&id, "").await;
    holder.ping().await;
}

/// `(process group, session, controlling tty)` of `pid`, from /proc.
fn group_session_tty(pid: i32) -> (i32, i32, i32) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("reads stat");
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let field = |i: usize| fields[i].parse::<i32>().expect("a number");
    // After the command name: state, ppid, pgrp, session, tty_nr.
    (field(2), field(3), field(4))
}

#[tokio::test]
async fn pty_shell_leads_its_own_session_on_its_terminal_and_pipe_shell_its_own_group() {
    let daemon = start().await;
    let (_id, mut holder) = daemon.shell().await;
    let [shell] = holder
        .run_for_pids("echo sh=$$ mark-$((1+1))", "mark-2", ["sh="])
        .await;
    let (group, session, tty) = group_session_tty(shell);
    assert_eq!(
        (group, session),
        (shell, shell),
        "PTY shell leads its session"
    );
    assert_ne!(tty, 0, "the PTY is its controlling terminal");

    let piped = daemon.create(json!({})).await;
    let mut holder = daemon.connect(&piped, "pty=0").await;
    let [shell] = holder
        .run_for_pids("echo sh=$$ mark-$((2+2))", "mark-4", ["sh="])
        .await;
    let (group, _, _) = group_session_tty(shell);
    assert_eq!(group, shell, "pipe shell leads its own process group");
    // Read from /proc: 0 when the daemon's group leader is outside this PID namespace.
    let (daemons_group, _, _) = group_session_tty(std::process::id() as i32);
    assert_ne!(group, daemons_group, "not the daemon's group");
}
