//! Cancel is never lost: a cancel while the brain starts ends the turn `cancelled` and its
//! prompt is never sent; a cancel racing the prompt or arriving mid-command ends the turn
//! `cancelled` with exactly one `turn_end`; a cancel with no turn running is 409.

use serde_json::Value;

use super::helpers::{
    Conversation, Received, TestGateway, args_with_shell_agent, args_without_agent, assert_error,
    stop_reason, test_agent_bin, text_of,
};

fn turn_ends_of(events: &[Received], turn: u64) -> usize {
    events
        .iter()
        .filter(|e| e.event == "turn_end" && e.data["turn"] == turn)
        .count()
}

/// Sends `text` as turn `turn` and reads until that turn's `turn_end`, asserting it ended well.
async fn turn_ended_well(chat: &mut Conversation<'_>, text: &str, turn: u64) -> Vec<Received> {
    chat.accept(text).await;
    let seen = chat
        .until(&format!("turn_end of turn {turn}, {text:?}"), |e| {
            e.event == "turn_end" && e.data["turn"] == turn
        })
        .await;
    assert_eq!(stop_reason(&seen), "end_turn", "{text}");
    seen
}

/// A gateway whose agent is `warren-test-agent` with `agent_args`.
async fn with_test_agent(agent_args: &[&str]) -> TestGateway {
    let mut agent = test_agent_bin().display().to_string();
    for arg in agent_args {
        agent.push(' ');
        agent.push_str(arg);
    }
    TestGateway::start_changed(args_with_shell_agent, |args| args.agent = Some(agent)).await
}

#[tokio::test]
async fn a_cancel_while_the_brain_starts_ends_the_turn_and_its_command_never_runs() {
    let gates = tempfile::tempdir().expect("gate dir");
    let gate = gates.path().join("open-session");
    let gate_arg = gate.display().to_string();
    let gw = with_test_agent(&["--gate-session", &gate_arg]).await;
    let mut chat = gw.conversation("phone-0001").await;
    let workspace = gw.session_of("phone-0001", &chat.session).workspace();

    chat.accept("term touch marker-file").await;
    // The agent cannot have started: its `session/new` waits for the gate file.
    assert_eq!(chat.cancel().await.status(), 202);
    let mut seen = chat
        .until_turn_end("the turn cancelled while the brain starts")
        .await;
    let end = seen.last().expect("turn_end");
    assert_eq!(end.data["turn"], 1);
    assert_eq!(end.data["stop_reason"], "cancelled");
    assert!(
        !seen.iter().any(|e| e.event == "update"),
        "the agent never worked on the cancelled turn: {seen:#?}"
    );

    std::fs::write(&gate, b"").expect("open the gate");
    let looking = "term test -e marker-file && echo present || echo absent";
    let second = turn_ended_well(&mut chat, looking, 2).await;
    assert!(
        text_of(&second).contains("absent"),
        "no marker file: {second:#?}"
    );
    assert!(
        !workspace.join("marker-file").exists(),
        "the cancelled command never ran"
    );
    seen.extend(second);

    // The same command in a turn that is not cancelled does create the file where we looked.
    let third = turn_ended_well(&mut chat, "term touch marker-file", 3).await;
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
    let gw = with_test_agent(&[]).await;
    let mut chat = gw.conversation("phone-0001").await;
    // `wait` only ends on `session/cancel`: a lost cancel leaves the turn running and the wait
    // below times out. Each round's cancel lands somewhere else in the turn's start.
    for round in 1..=12u64 {
        let accepted = chat.send("wait").await;
        assert_eq!(accepted.status(), 202, "message of round {round}");
        let body: Value = accepted.json().await.expect("accepted body");
        assert_eq!(body["turn"], round);
        assert_eq!(chat.cancel().await.status(), 202, "cancel of round {round}");
        let seen = chat.until_turn_end(&format!("round {round}")).await;
        let end = seen.last().expect("turn_end");
        assert_eq!(end.data["turn"], round);
        assert_eq!(end.data["stop_reason"], "cancelled", "round {round}");
    }
    // Every turn ended exactly once: the next message starts turn 13 and ends normally.
    let seen = chat.turn("echo after all").await;
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
    let mut chat = gw.conversation("phone-0001").await;
    chat.accept("echo started; sleep 60; printf '%s-%s\\n' fin ished")
        .await;
    let mut seen = chat
        .until("the command's first output", |e| {
            e.event == "update" && e.data["update"].to_string().contains("started")
        })
        .await;
    assert_eq!(chat.cancel().await.status(), 202);
    seen.extend(chat.until_turn_end("the cancelled turn").await);
    assert_eq!(stop_reason(&seen), "cancelled");
    // The tool call carries the command line, never its output after the sleep.
    assert!(!text_of(&seen).contains("fin-ished"), "{seen:#?}");

    let next = chat.turn("echo next").await;
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
    let mut chat = gw.conversation("phone-0001").await;

    assert_error(chat.cancel().await, 409, "NO_TURN_RUNNING", "no turn yet").await;

    // The agent cannot start: the turn ends with `error`, and then nothing runs either.
    let seen = chat.turn("echo hi").await;
    assert_eq!(stop_reason(&seen), "error");
    let after_turn = chat.cancel().await;
    assert_error(after_turn, 409, "NO_TURN_RUNNING", "the turn has ended").await;
    gw.stop().await;
}
