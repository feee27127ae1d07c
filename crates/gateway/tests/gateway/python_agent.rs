//! The whole gateway path with an agent built on a third-party ACP implementation (the PyPI
//! `agent-client-protocol` package, `tests/python/acp_echo_agent.py`): streamed text, a file
//! written through `fs/write_text_file` into the session's hands, a terminal, and a permission
//! question answered through the HTTP API.

use std::path::PathBuf;

use crate::helpers::{Received, TestGateway, args_with_shell_agent};

/// The venv python with the ACP SDK, from the repository's own setup script.
fn python() -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let output = std::process::Command::new("bash")
        .arg(root.join("scripts/python-env.sh"))
        .output()
        .expect("run scripts/python-env.sh");
    assert!(
        output.status.success(),
        "python-env.sh failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("utf-8 path")
        .trim()
        .to_string()
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
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root");
    let agent = format!(
        "{} {}",
        python(),
        root.join("tests/python/acp_echo_agent.py").display()
    );
    let gw = TestGateway::start(|data| {
        let mut args = args_with_shell_agent(data);
        args.agent = Some(agent);
        args
    })
    .await;
    let token = gw.register("phone-0001").await;
    let session = gw.create_session(&token).await;
    let mut events = gw.events(&token, &session, None).await;

    assert_eq!(
        gw.post_message(&token, &session, "hello there")
            .await
            .status(),
        202
    );
    let seen = events
        .until("turn_end of the echo", |e| e.event == "turn_end")
        .await;
    assert_eq!(said(&seen), "echo: hello there");
    assert_eq!(
        seen.last().expect("turn_end").data["stop_reason"],
        "end_turn"
    );

    let workspace = gw
        .gateway
        .args
        .data
        .join("sessions")
        .join(&session)
        .join("workspace");
    let target = workspace.join("from-python.txt");
    assert_eq!(
        gw.post_message(&token, &session, &format!("write {}", target.display()))
            .await
            .status(),
        202
    );
    let seen = events
        .until("turn_end of the write", |e| e.event == "turn_end")
        .await;
    assert!(said(&seen).starts_with("wrote "), "{seen:#?}");
    assert_eq!(
        std::fs::read_to_string(&target).expect("file written by the agent"),
        "hello from python"
    );

    assert_eq!(
        gw.post_message(&token, &session, "term echo from-a-terminal")
            .await
            .status(),
        202
    );
    let seen = events
        .until("turn_end of the terminal", |e| e.event == "turn_end")
        .await;
    assert!(said(&seen).contains("from-a-terminal"), "{seen:#?}");

    assert_eq!(
        gw.post_message(&token, &session, "perm").await.status(),
        202
    );
    let seen = events
        .until("the permission request", |e| {
            e.event == "permission_request"
        })
        .await;
    let request_id = seen.last().expect("request").data["request_id"]
        .as_str()
        .expect("id")
        .to_string();
    let answer = gw
        .http
        .post(format!(
            "{}/v1/sessions/{session}/permissions/{request_id}",
            gw.url
        ))
        .bearer_auth(&token)
        .json(&serde_json::json!({"option_id": "allow"}))
        .send()
        .await
        .expect("answer");
    assert_eq!(answer.status(), 204);
    let seen = events
        .until("turn_end of the permission turn", |e| e.event == "turn_end")
        .await;
    assert_eq!(said(&seen), "permission: allow");
    gw.stop().await;
}

#[tokio::test]
async fn an_agent_that_cannot_resume_gets_a_new_session_and_an_error_says_context_was_lost() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root");
    let agent = format!(
        "{} {}",
        python(),
        root.join("tests/python/acp_echo_agent.py").display()
    );
    let gw = TestGateway::start(|data| {
        let mut args = args_with_shell_agent(data);
        args.agent = Some(agent);
        args.brain_idle = std::time::Duration::from_secs(1);
        args
    })
    .await;
    let token = gw.register("phone-0001").await;
    let session = gw.create_session(&token).await;
    let mut events = gw.events(&token, &session, None).await;
    assert_eq!(
        gw.post_message(&token, &session, "first").await.status(),
        202
    );
    events
        .until("turn_end of the first turn", |e| e.event == "turn_end")
        .await;
    events
        .until("the idle brain stopped", |e| {
            e.event == "status" && e.data["brain"] == "idle"
        })
        .await;

    assert_eq!(
        gw.post_message(&token, &session, "second").await.status(),
        202
    );
    let seen = events
        .until("turn_end after a new agent session", |e| {
            e.event == "turn_end"
        })
        .await;
    let error = seen
        .iter()
        .find(|e| e.event == "error")
        .expect("an error event");
    assert_eq!(error.data["code"], "CONTEXT_LOST");
    assert_eq!(said(&seen), "echo: second");
    assert_eq!(
        seen.last().expect("turn_end").data["stop_reason"],
        "end_turn"
    );
    gw.stop().await;
}
