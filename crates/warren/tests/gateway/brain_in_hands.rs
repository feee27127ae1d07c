//! The brain inside the hands (`--brain-placement hands`) with the built-in shell agent: the
//! agent process is inside the sandbox's process tree, paused hands are resumed before the
//! prompt reaches it, and a restarted gateway stops the agent the previous one left in the
//! hands before it starts its own.

use std::path::Path;

use warren_gateway::GatewayArgs;
use warren_gateway::config::BrainPlacement;
use warren_gateway::hands::local::IsolationMode;

use super::helpers::{
    LeftHands, Received, TestGateway, WAIT, args_with_shell_agent, hands_processes, text_of,
};

fn in_the_hands(data: std::path::PathBuf) -> GatewayArgs {
    let mut args = args_with_shell_agent(data);
    args.brain_placement = Some(BrainPlacement::Hands);
    args.hands_isolation = IsolationMode::Bwrap;
    args.warm_workers = 0;
    args
}

/// The pids of the session's hands whose command line is the shell agent's.
fn agents_in_hands(data: &Path, session: &str) -> Vec<u32> {
    hands_processes(data, session)
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains("shell-agent"))
        })
        .collect()
}

#[tokio::test]
async fn the_agent_runs_inside_the_sandbox_and_sees_its_workspace() {
    let gw = TestGateway::start(in_the_hands).await;
    let mut chat = gw.conversation("phone-brain-in-hands").await;
    let seen = chat.turn_ok("echo \"at=$(pwd) uid=$(id -u)\"").await;
    let said = text_of(&seen);
    assert!(said.contains("at=/workspace uid=1000"), "{said}");
    let info = chat.info().await;
    assert_eq!(info["brain_placement"], "hands", "{info}");
    assert_eq!(
        agents_in_hands(&gw.data, &chat.session).len(),
        1,
        "the agent is one process of the sandbox's tree"
    );
    gw.stop().await;
}

#[tokio::test]
async fn paused_hands_are_resumed_before_the_prompt_reaches_their_agent() {
    let gw = TestGateway::start(in_the_hands).await;
    let mut chat = gw
        .conversation_after("phone-paused-brain", "echo one")
        .await;
    let session = gw.session(&chat.session);
    session.hands.pause(None).await;
    assert_eq!(chat.info().await["hands"], "paused");
    // The agent is frozen with its hands; the message must thaw them first.
    let seen = chat.turn_ok("echo two").await;
    assert!(text_of(&seen).contains("two"));
    gw.stop().await;
}

#[tokio::test]
async fn a_restarted_gateway_stops_the_agent_its_predecessor_left_in_the_hands() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().to_path_buf();
    let _cleanup = LeftHands(data.clone());
    let first = TestGateway::start_in(in_the_hands(data.clone())).await;
    let chat = first
        .conversation_after("phone-restart-brain", "echo before")
        .await;
    let (token, session) = (chat.token.clone(), chat.session.clone());
    let left = agents_in_hands(&data, &session);
    assert_eq!(left.len(), 1);
    first.stop_leaving_hands().await;

    let second = TestGateway::start_in(in_the_hands(data.clone())).await;
    let accepted = second.post_message(&token, &session, "echo after").await;
    assert_eq!(accepted.status(), 202);
    warren_test_support::eventually_async("the second turn ends", || async {
        second.session_info(&token, &session).await["status"] == "idle"
    })
    .await;
    let now = agents_in_hands(&data, &session);
    assert_eq!(now.len(), 1, "one agent in the hands: {now:?}");
    assert!(
        !now.contains(&left[0]),
        "the left agent was stopped: {left:?} {now:?}"
    );
    second.stop().await;
}

/// Warm sandboxes: a new session takes a running sandbox with its agent initialized inside;
/// the pool refills, and at shutdown the sandboxes nobody took are stopped and removed.
#[tokio::test]
async fn a_new_session_takes_a_warm_sandbox_whole_and_the_pool_refills() {
    let gw = TestGateway::start_changed(in_the_hands, |args| args.warm_workers = 1).await;
    assert!(
        gw.gateway.engine.warm.wait_ready(1, WAIT).await,
        "a warm sandbox"
    );
    let mut chat = gw.conversation("phone-warm-sandbox").await;
    let info = chat.info().await;
    assert_eq!(
        (info["hands"].as_str(), info["brain"].as_str()),
        (Some("running"), Some("warm")),
        "the session took the sandbox and its agent: {info}"
    );
    assert_eq!(agents_in_hands(&gw.data, &chat.session).len(), 1);
    let seen = chat.turn_ok("echo \"at=$(pwd)\"").await;
    assert!(text_of(&seen).contains("at=/workspace"));
    // The history says the hands run from the start (the warm sandbox), and nothing started
    // for the first message.
    let hands: Vec<&Received> = seen.iter().filter(|e| e.event == "hands").collect();
    assert_eq!(hands.len(), 1, "{hands:#?}");
    assert_eq!(hands[0].id, Some(1), "the session's first event");
    assert_eq!(
        (
            hands[0].data["state"].as_str(),
            hands[0].data["message"].as_str()
        ),
        (Some("running"), Some("warm"))
    );
    assert!(
        gw.gateway.engine.warm.wait_ready(1, WAIT).await,
        "the pool refilled"
    );
    let sessions = gw.data.join("sessions");
    let session = chat.session.clone();
    drop(chat);
    let _kept = gw.stop().await;
    let left: Vec<String> = std::fs::read_dir(&sessions)
        .expect("sessions dir")
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, [session], "the untaken sandbox was removed");
}

/// A warm sandbox's directory a killed gateway left (no `meta.json`) is no session: the next
/// gateway removes it.
#[tokio::test]
async fn a_warm_sandbox_left_by_a_killed_gateway_is_removed_at_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let left = dir
        .path()
        .join("sessions")
        .join("0b6c2a4e-left-by-a-killed-gateway");
    std::fs::create_dir_all(left.join("workspace")).expect("a left sandbox dir");
    let gw = TestGateway::start_in(in_the_hands(dir.path().to_path_buf())).await;
    assert!(!left.exists(), "removed at start");
    assert!(gw.gateway.engine.sessions.all().is_empty());
    gw.stop().await;
}

/// Deleting a session whose hands (and agent) are paused: the hands are resumed so the agent
/// is closed, then everything in them is stopped.
#[tokio::test]
async fn deleting_a_session_with_its_agent_frozen_stops_everything() {
    let gw = TestGateway::start(in_the_hands).await;
    let chat = gw
        .conversation_after("phone-delete-paused", "echo one")
        .await;
    let processes = hands_processes(&gw.data, &chat.session);
    assert!(!agents_in_hands(&gw.data, &chat.session).is_empty());
    let session = gw.session(&chat.session);
    session.hands.pause(None).await;
    let deleted = gw
        .delete(&chat.token, &format!("/sessions/{}", chat.session))
        .await;
    assert_eq!(deleted.status(), 204);
    warren_test_support::eventually("every process of the hands is gone", || {
        processes
            .iter()
            .all(|pid| !warren_test_support::alive(*pid))
    })
    .await;
    gw.stop().await;
}
