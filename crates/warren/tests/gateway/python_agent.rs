//! The whole gateway path with an agent built on a third-party ACP implementation (the PyPI
//! `agent-client-protocol` package, `tests/python/acp_echo_agent.py`): streamed text, a file
//! written through `fs/write_text_file` into the session's hands, a terminal, and a permission
//! question answered through the HTTP API.

// Tests start real programs (shells, servers, the binary under test) directly.
#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use warren_test_support::{python, repo_root};

use super::helpers::{Received, TestGateway, args_with_shell_agent, first_of, stop_reason};

/// The python echo agent's command line: the venv python with the ACP SDK (from the
/// repository's own setup script) running `tests/python/acp_echo_agent.py`.
fn python_agent() -> String {
    format!(
        "{} {}",
        python().display(),
        repo_root().join("tests/python/acp_echo_agent.py").display()
    )
}

/// A gateway whose agent is the python echo agent, with brains stopped after `brain_idle`.
async fn with_python_agent(brain_idle: Option<Duration>) -> TestGateway {
    let agent = python_agent();
    TestGateway::start(|data| {
        let mut args = args_with_shell_agent(data);
        args.agent = Some(agent);
        if let Some(brain_idle) = brain_idle {
            args.brain_idle = brain_idle;
        }
        args
    })
    .await
}

fn said(events: &[Received]) -> String {
    events
        .iter()
        .filter(|e| {
            e.event == "update" && e.data["update"]["sessionUpdate"] == "agent_message_chunk"
        })
        .map(|e| {
            e.data["update"]["content"]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

#[tokio::test]
async fn a_python_acp_agent_works_through_the_gateway() {
    let gw = with_python_agent(None).await;
    let mut chat = gw.conversation("phone-0001").await;

    let seen = chat.turn("hello there").await;
    assert_eq!(said(&seen), "echo: hello there");
    assert_eq!(stop_reason(&seen), "end_turn");

    // What the gateway offered, as a third-party ACP implementation parsed it: both fs methods,
    // terminals, and one MCP server (Warren's exec tools) in `session/new`.
    let seen = chat.turn("caps").await;
    let caps = said(&seen);
    assert!(
        caps.starts_with("caps: fs.read=true fs.write=true terminal=true mcp="),
        "{caps}"
    );
    let mcp_names = caps.rsplit_once("mcp=").map_or("", |(_, names)| names);
    assert_eq!(
        mcp_names.split(',').filter(|n| !n.is_empty()).count(),
        1,
        "{caps}"
    );

    let target = chat.workspace().join("from-python.txt");
    let seen = chat.turn(&format!("write {}", target.display())).await;
    assert!(said(&seen).starts_with("wrote "), "{seen:#?}");
    assert_eq!(
        std::fs::read_to_string(&target).expect("file written by the agent"),
        "hello from python"
    );

    let source = chat.workspace().join("for-python.txt");
    std::fs::write(&source, "from the workspace").expect("write a workspace file");
    let seen = chat.turn(&format!("read {}", source.display())).await;
    assert_eq!(said(&seen), "read: from the workspace", "{seen:#?}");

    let seen = chat.turn("term echo from-a-terminal").await;
    assert!(said(&seen).contains("from-a-terminal"), "{seen:#?}");

    let request = chat.permission_request_for("perm").await;
    let request_id = request.data["request_id"].as_str().expect("id").to_string();
    let answer = chat.answer_permission(&request_id, "allow").await;
    assert_eq!(answer.status(), 204);
    let seen = chat.until_turn_end("the permission turn").await;
    assert_eq!(said(&seen), "permission: allow");
    gw.stop().await;
}

#[tokio::test]
async fn an_agent_that_cannot_resume_gets_a_new_session_and_an_error_says_context_was_lost() {
    let gw = with_python_agent(Some(Duration::from_secs(1))).await;
    let mut chat = gw.conversation("phone-0001").await;
    chat.turn("first").await;
    chat.until("the idle brain stopped", |e| {
        e.event == "status" && e.data["brain"] == "idle"
    })
    .await;

    let seen = chat.turn("second").await;
    assert_eq!(first_of(&seen, "error").data["code"], "CONTEXT_LOST");
    assert_eq!(said(&seen), "echo: second");
    assert_eq!(stop_reason(&seen), "end_turn");
    gw.stop().await;
}
