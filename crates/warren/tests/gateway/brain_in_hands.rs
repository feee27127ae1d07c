//! The brain inside the hands (`--brain-placement hands`) with the built-in shell agent: the
//! agent process is inside the sandbox's process tree, paused hands are resumed before the
//! prompt reaches it, and a restarted gateway stops the agent the previous one left in the
//! hands before it starts its own.

use std::path::Path;

use warren_gateway::GatewayArgs;
use warren_gateway::config::BrainPlacement;
use warren_gateway::hands::local::IsolationMode;

use crate::helpers::{
    LeftHands, TestGateway, args_with_shell_agent, hands_processes, stop_reason, text_of,
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
    let seen = chat.turn("echo \"at=$(pwd) uid=$(id -u)\"").await;
    assert_eq!(stop_reason(&seen), "end_turn", "{seen:#?}");
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
    let mut chat = gw.conversation("phone-paused-brain").await;
    assert_eq!(stop_reason(&chat.turn("echo one").await), "end_turn");
    let session = gw.gateway.sessions.by_id(&chat.session).expect("session");
    session.hands.pause(None).await;
    assert_eq!(chat.info().await["hands"], "paused");
    // The agent is frozen with its hands; the message must thaw them first.
    let seen = chat.turn("echo two").await;
    assert_eq!(stop_reason(&seen), "end_turn", "{seen:#?}");
    assert!(text_of(&seen).contains("two"));
    gw.stop().await;
}

#[tokio::test]
async fn a_restarted_gateway_stops_the_agent_its_predecessor_left_in_the_hands() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().to_path_buf();
    let _cleanup = LeftHands(data.clone());
    let first = TestGateway::start_in(in_the_hands(data.clone())).await;
    let mut chat = first.conversation("phone-restart-brain").await;
    assert_eq!(stop_reason(&chat.turn("echo before").await), "end_turn");
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
