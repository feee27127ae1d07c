//! Cancel is never lost: a cancel while the brain still starts ends the turn `cancelled` and its
//! prompt is never sent; a cancel racing the prompt or arriving mid-command ends the turn
//! `cancelled` with exactly one `turn_end`; a cancel with no turn running is 409.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::helpers::{Received, TestGateway, args_with_shell_agent, args_without_agent};

/// `warren-test-agent` (the scripted ACP agent of `warren-brain`), built once per test process.
fn test_agent_bin() -> PathBuf {
    static BUILT: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(path) = built.as_ref() {
        return path.clone();
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::process::Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "-p",
            "warren-brain",
            "--bin",
            "warren-test-agent",
        ])
        .current_dir(&workspace)
        .status()
        .expect("run cargo build -p warren-brain");
    assert!(status.success(), "cargo build of warren-test-agent failed");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace.join("target"), PathBuf::from);
    let path = target.join("debug").join("warren-test-agent");
    assert!(path.exists(), "{} exists after the build", path.display());
    *built = Some(path.clone());
    path
}

async fn cancel(gw: &TestGateway, token: &str, session: &str) -> reqwest::Response {
    gw.http
        .post(format!("{}/v1/sessions/{session}/cancel", gw.url))
        .bearer_auth(token)
        .send()
        .await
        .expect("cancel request")
}

fn text_of(events: &[Received]) -> String {
    events
        .iter()
        .filter(|e| e.event == "update")
        .map(|e| e.data["update"].to_string())
        .collect()
}

fn turn_ends_of(events: &[Received], turn: u64) -> usize {
    events
        .iter()
        .filter(|e| e.event == "turn_end" && e.data["turn"] == turn)
        .count()
}

#[tokio::test]
async fn a_cancel_while_the_brain_starts_ends_the_turn_and_its_command_never_runs() {
    let gates = tempfile::tempdir().expect("gate dir");
    let gate = gates.path().join("open-session");
    let agent = format!(
        "{} --gate-session {}",
        test_agent_bin().display(),
        gate.display()
    );
    let gw = TestGateway::start(|data| {
        let mut args = args_with_shell_agent(data);
        args.agent = Some(agent);
        args
    })
    .await;
    let token = gw.register("phone-0001").await;
    let session = gw.create_session(&token).await;
    let workspace = gw
        .gateway
        .sessions
        .get("phone-0001", &session)
        .expect("session")
        .workspace();
    let mut events = gw.events(&token, &session, None).await;

    let accepted = gw
        .post_message(&token, &session, "term touch marker-file")
        .await;
    assert_eq!(accepted.status(), 202);
    // The agent cannot have started: its `session/new` waits for the gate file.
    assert_eq!(cancel(&gw, &token, &session).await.status(), 202);
    let mut seen = events
        .until(
            "turn_end of the turn cancelled while the brain starts",
            |e| e.event == "turn_end",
        )
        .await;
    let end = seen.last().expect("turn_end");
    assert_eq!(end.data["turn"], 1);
    assert_eq!(end.data["stop_reason"], "cancelled");
    assert!(
        !seen.iter().any(|e| e.event == "update"),
        "the agent never worked on the cancelled turn: {seen:#?}"
    );

    std::fs::write(&gate, b"").expect("open the gate");
    assert_eq!(
        gw.post_message(
            &token,
            &session,
            "term test -e marker-file && echo present || echo absent"
        )
        .await
        .status(),
        202
    );
    let second = events
        .until("turn_end of the turn looking for the marker", |e| {
            e.event == "turn_end" && e.data["turn"] == 2
        })
        .await;
    assert_eq!(
        second.last().expect("turn_end").data["stop_reason"],
        "end_turn"
    );
    let output = text_of(&second);
    assert!(output.contains("absent"), "no marker file: {second:#?}");
    assert!(
        !workspace.join("marker-file").exists(),
        "the cancelled command never ran"
    );
    seen.extend(second);

    // The same command in a turn that is not cancelled does create the file where we looked.
    assert_eq!(
        gw.post_message(&token, &session, "term touch marker-file")
            .await
            .status(),
        202
    );
    let third = events
        .until("turn_end of the uncancelled touch", |e| {
            e.event == "turn_end" && e.data["turn"] == 3
        })
        .await;
    assert_eq!(
        third.last().expect("turn_end").data["stop_reason"],
        "end_turn"
    );
    assert!(
        workspace.join("marker-file").exists(),
        "an uncancelled `touch` creates {}",
        workspace.join("marker-file").display()
    );
    seen.extend(third);
    for turn in 1..=3 {
        assert_eq!(turn_ends_of(&seen, turn), 1, "one turn_end for turn {turn}");
    }
    gw.stop().await;
}

#[tokio::test]
async fn a_cancel_right_after_the_message_is_never_lost() {
    let agent = test_agent_bin().display().to_string();
    let gw = TestGateway::start(|data| {
        let mut args = args_with_shell_agent(data);
        args.agent = Some(agent);
        args
    })
    .await;
    let token = gw.register("phone-0001").await;
    let session = gw.create_session(&token).await;
    let mut events = gw.events(&token, &session, None).await;
    // `wait` only ends on `session/cancel`: a lost cancel leaves the turn running and the wait
    // below times out. Each round's cancel lands somewhere else in the turn's start.
    for round in 1..=12u64 {
        let accepted = gw.post_message(&token, &session, "wait").await;
        assert_eq!(accepted.status(), 202, "message of round {round}");
        let body: Value = accepted.json().await.expect("accepted body");
        assert_eq!(body["turn"], round);
        assert_eq!(
            cancel(&gw, &token, &session).await.status(),
            202,
            "cancel of round {round}"
        );
        let seen = events
            .until(&format!("turn_end of round {round}"), |e| {
                e.event == "turn_end"
            })
            .await;
        let end = seen.last().expect("turn_end");
        assert_eq!(end.data["turn"], round);
        assert_eq!(end.data["stop_reason"], "cancelled", "round {round}");
    }
    // Every turn ended exactly once: the next message starts turn 13 and ends normally.
    assert_eq!(
        gw.post_message(&token, &session, "echo after all")
            .await
            .status(),
        202
    );
    let seen = events
        .until("turn_end of the turn after the cancels", |e| {
            e.event == "turn_end"
        })
        .await;
    let end = seen.last().expect("turn_end");
    assert_eq!(
        end.data["turn"], 13,
        "no stray turn_end in between: {seen:#?}"
    );
    assert_eq!(end.data["stop_reason"], "end_turn");
    gw.stop().await;
}

#[tokio::test]
async fn a_cancel_during_a_running_command_stops_it_and_ends_the_turn_cancelled() {
    let gw = TestGateway::start(args_with_shell_agent).await;
    let token = gw.register("phone-0001").await;
    let session = gw.create_session(&token).await;
    let mut events = gw.events(&token, &session, None).await;
    assert_eq!(
        gw.post_message(
            &token,
            &session,
            "echo started; sleep 60; printf '%s-%s\\n' fin ished"
        )
        .await
        .status(),
        202
    );
    let mut seen = events
        .until("the command's first output", |e| {
            e.event == "update" && e.data["update"].to_string().contains("started")
        })
        .await;
    assert_eq!(cancel(&gw, &token, &session).await.status(), 202);
    seen.extend(
        events
            .until("turn_end after the cancel", |e| e.event == "turn_end")
            .await,
    );
    assert_eq!(
        seen.last().expect("turn_end").data["stop_reason"],
        "cancelled"
    );
    // The tool call carries the command line, never its output after the sleep.
    assert!(!text_of(&seen).contains("fin-ished"), "{seen:#?}");

    assert_eq!(
        gw.post_message(&token, &session, "echo next")
            .await
            .status(),
        202
    );
    let next = events
        .until("turn_end of the next turn", |e| e.event == "turn_end")
        .await;
    let end = next.last().expect("turn_end");
    assert_eq!(end.data["turn"], 2);
    assert_eq!(end.data["stop_reason"], "end_turn");
    seen.extend(next);
    assert_eq!(
        turn_ends_of(&seen, 1),
        1,
        "one turn_end for the cancelled turn"
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_cancel_with_no_turn_running_is_409_no_turn_running() {
    let gw = TestGateway::start(args_without_agent).await;
    let token = gw.register("phone-0001").await;
    let session = gw.create_session(&token).await;
    let mut events = gw.events(&token, &session, None).await;

    let before_any = cancel(&gw, &token, &session).await;
    assert_eq!(before_any.status(), 409, "no turn yet");
    let body: Value = before_any.json().await.expect("error body");
    assert_eq!(body["code"], "NO_TURN_RUNNING");

    // The agent cannot start: the turn ends with `error`, and then nothing runs either.
    assert_eq!(
        gw.post_message(&token, &session, "echo hi").await.status(),
        202
    );
    let seen = events
        .until("turn_end of the turn without an agent", |e| {
            e.event == "turn_end"
        })
        .await;
    assert_eq!(seen.last().expect("turn_end").data["stop_reason"], "error");
    let after_turn = cancel(&gw, &token, &session).await;
    assert_eq!(after_turn.status(), 409, "the turn has ended");
    let body: Value = after_turn.json().await.expect("error body");
    assert_eq!(body["code"], "NO_TURN_RUNNING");
    gw.stop().await;
}
