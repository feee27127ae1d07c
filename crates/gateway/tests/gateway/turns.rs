//! Turns end to end with the built-in shell agent of the real `warren` binary: streamed output,
//! 409 while a turn runs, cancel, permission questions and answers.

use serde_json::Value;

use crate::helpers::{Received, TestGateway, args_with_shell_agent};

fn text_of(events: &[Received]) -> String {
    events
        .iter()
        .filter(|e| e.event == "update")
        .map(|e| e.data["update"].to_string())
        .collect()
}

#[tokio::test]
async fn echo_hi_streams_user_message_turn_start_updates_and_turn_end() {
    let gw = TestGateway::start(args_with_shell_agent).await;
    let token = gw.register("phone-0001").await;
    let session = gw.create_session(&token).await;
    let mut events = gw.events(&token, &session, None).await;
    let accepted = gw.post_message(&token, &session, "echo hi").await;
    assert_eq!(accepted.status(), 202);
    let body: Value = accepted.json().await.expect("accepted body");
    assert_eq!(body["turn"], 1);

    let seen = events
        .until("turn_end of `echo hi`", |e| e.event == "turn_end")
        .await;
    let kinds: Vec<&str> = seen.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(&kinds[..2], ["user_message", "turn_start"], "{kinds:?}");
    assert_eq!(seen[0].data["text"], "echo hi");
    assert!(kinds.contains(&"update"), "{kinds:?}");
    assert!(
        text_of(&seen).contains("hi"),
        "an update carries the output: {seen:#?}"
    );
    let end = seen.last().expect("turn_end");
    assert_eq!(end.data["stop_reason"], "end_turn");
    assert_eq!(end.data["turn"], 1);
    let seqs: Vec<u64> = seen.iter().map(|e| e.id.expect("id")).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "seq strictly +1 from 1"
    );

    let second = gw.post_message(&token, &session, "echo second").await;
    assert_eq!(second.status(), 202);
    let seen = events
        .until("turn_end of the second turn", |e| e.event == "turn_end")
        .await;
    assert!(text_of(&seen).contains("second"));
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
    assert_eq!(info["turn"], 2);
    assert_eq!(info["status"], "idle");
    assert_eq!(info["hands"], "running");
    gw.stop().await;
}

#[tokio::test]
async fn a_second_message_during_a_turn_is_409_and_cancel_ends_the_turn() {
    let gw = TestGateway::start(args_with_shell_agent).await;
    let token = gw.register("phone-0001").await;
    let session = gw.create_session(&token).await;
    let mut events = gw.events(&token, &session, None).await;
    assert_eq!(
        gw.post_message(&token, &session, "sleep 60").await.status(),
        202
    );
    events
        .until("the sleep command's tool call", |e| e.event == "update")
        .await;

    let busy = gw.post_message(&token, &session, "echo no").await;
    assert_eq!(busy.status(), 409);
    let body: Value = busy.json().await.expect("body");
    assert_eq!(body["code"], "TURN_IN_PROGRESS");

    let cancel = gw
        .http
        .post(format!("{}/v1/sessions/{session}/cancel", gw.url))
        .bearer_auth(&token)
        .send()
        .await
        .expect("cancel");
    assert_eq!(cancel.status(), 202);
    let seen = events
        .until("turn_end after cancel", |e| e.event == "turn_end")
        .await;
    assert_eq!(
        seen.last().expect("turn_end").data["stop_reason"],
        "cancelled"
    );

    let idle_cancel = gw
        .http
        .post(format!("{}/v1/sessions/{session}/cancel", gw.url))
        .bearer_auth(&token)
        .send()
        .await
        .expect("cancel");
    assert_eq!(idle_cancel.status(), 409, "nothing to cancel");
    assert_eq!(
        gw.post_message(&token, &session, "echo after")
            .await
            .status(),
        202
    );
    let seen = events
        .until("turn_end of the turn after cancel", |e| {
            e.event == "turn_end"
        })
        .await;
    assert!(text_of(&seen).contains("after"));
    gw.stop().await;
}

#[tokio::test]
async fn rm_asks_permission_and_the_answer_is_recorded() {
    let gw = TestGateway::start(args_with_shell_agent).await;
    let token = gw.register("phone-0001").await;
    let session = gw.create_session(&token).await;
    let mut events = gw.events(&token, &session, None).await;
    assert_eq!(
        gw.post_message(&token, &session, "touch doomed.txt")
            .await
            .status(),
        202
    );
    events
        .until("turn_end of touch", |e| e.event == "turn_end")
        .await;

    assert_eq!(
        gw.post_message(&token, &session, "rm doomed.txt")
            .await
            .status(),
        202
    );
    let seen = events
        .until("the permission request for rm", |e| {
            e.event == "permission_request"
        })
        .await;
    let request = seen.last().expect("permission_request");
    let request_id = request.data["request_id"]
        .as_str()
        .expect("request id")
        .to_string();
    assert!(request.data["tool_call"].is_object());
    let options = request.data["options"].as_array().expect("options");
    let allow = options
        .iter()
        .find(|o| o["kind"] == "allow_once")
        .expect("an allow option");
    let allow_id = allow["optionId"].as_str().expect("option id");

    let url = format!("{}/v1/sessions/{session}/permissions/{request_id}", gw.url);
    let wrong = gw
        .http
        .post(&url)
        .bearer_auth(&token)
        .json(&serde_json::json!({"option_id": "nope"}))
        .send()
        .await
        .expect("answer");
    assert_eq!(wrong.status(), 400, "an option the agent did not offer");
    let answer = gw
        .http
        .post(&url)
        .bearer_auth(&token)
        .json(&serde_json::json!({"option_id": allow_id}))
        .send()
        .await
        .expect("answer");
    assert_eq!(answer.status(), 204);
    let again = gw
        .http
        .post(&url)
        .bearer_auth(&token)
        .json(&serde_json::json!({"option_id": allow_id}))
        .send()
        .await
        .expect("answer");
    assert_eq!(again.status(), 404, "answered once");

    let seen = events
        .until("turn_end of rm", |e| e.event == "turn_end")
        .await;
    let resolved = seen
        .iter()
        .find(|e| e.event == "permission_resolved")
        .expect("permission_resolved");
    assert_eq!(resolved.data["outcome"], "selected");
    assert_eq!(resolved.data["option_id"], allow_id);
    assert_eq!(
        seen.last().expect("turn_end").data["stop_reason"],
        "end_turn"
    );
    let workspace = gw.data.join("sessions").join(&session).join("workspace");
    assert!(
        !workspace.join("doomed.txt").exists(),
        "rm ran after the answer"
    );
    gw.stop().await;
}

#[tokio::test]
async fn cancel_answers_a_pending_permission_cancelled() {
    let gw = TestGateway::start(args_with_shell_agent).await;
    let token = gw.register("phone-0001").await;
    let session = gw.create_session(&token).await;
    let mut events = gw.events(&token, &session, None).await;
    assert_eq!(
        gw.post_message(&token, &session, "rm -rf nothing")
            .await
            .status(),
        202
    );
    events
        .until("the permission request", |e| {
            e.event == "permission_request"
        })
        .await;
    let cancel = gw
        .http
        .post(format!("{}/v1/sessions/{session}/cancel", gw.url))
        .bearer_auth(&token)
        .send()
        .await
        .expect("cancel");
    assert_eq!(cancel.status(), 202);
    let seen = events
        .until("turn_end after cancel", |e| e.event == "turn_end")
        .await;
    let resolved = seen
        .iter()
        .find(|e| e.event == "permission_resolved")
        .expect("permission_resolved");
    assert_eq!(resolved.data["outcome"], "cancelled");
    assert_eq!(
        seen.last().expect("turn_end").data["stop_reason"],
        "cancelled"
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_worker_dying_mid_turn_ends_the_turn_with_error_and_the_conversation_stays() {
    let gw = TestGateway::start(args_with_shell_agent).await;
    let token = gw.register("phone-0001").await;
    let session = gw.create_session(&token).await;
    let mut events = gw.events(&token, &session, None).await;
    assert_eq!(
        gw.post_message(&token, &session, "sleep 60").await.status(),
        202
    );
    events
        .until("the agent working on `sleep 60`", |e| e.event == "update")
        .await;

    let pid = {
        let handle = gw
            .gateway
            .sessions
            .get("phone-0001", &session)
            .expect("session");
        let state = handle.lock();
        match &state.brain {
            warren_gateway::turns::BrainState::Ready(brain) => brain.pid(),
            _ => panic!("a ready brain runs the turn"),
        }
    };
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill -9 the agent");
    assert!(killed.success());

    let seen = events
        .until("turn_end after the worker died", |e| e.event == "turn_end")
        .await;
    let error = seen
        .iter()
        .find(|e| e.event == "error")
        .expect("an error event");
    assert_eq!(error.data["code"], "BRAIN_EXITED");
    assert_eq!(seen.last().expect("turn_end").data["stop_reason"], "error");

    assert_eq!(
        gw.post_message(&token, &session, "echo still here")
            .await
            .status(),
        202
    );
    let seen = events
        .until("turn_end with a new worker", |e| e.event == "turn_end")
        .await;
    assert_eq!(
        seen.last().expect("turn_end").data["stop_reason"],
        "end_turn"
    );
    assert!(text_of(&seen).contains("still here"));
    gw.stop().await;
}

#[tokio::test]
async fn an_idle_brain_is_stopped_and_the_next_message_resumes_it() {
    let gw = TestGateway::start(|data| {
        let mut args = args_with_shell_agent(data);
        args.brain_idle = std::time::Duration::from_secs(1);
        args
    })
    .await;
    let token = gw.register("phone-0001").await;
    let session = gw.create_session(&token).await;
    let mut events = gw.events(&token, &session, None).await;
    assert_eq!(
        gw.post_message(&token, &session, "echo one").await.status(),
        202
    );
    events
        .until("turn_end of the first turn", |e| e.event == "turn_end")
        .await;
    events
        .until("the brain stopped for being idle", |e| {
            e.event == "status" && e.data["brain"] == "idle"
        })
        .await;
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
    assert_eq!(info["brain"], "none");

    assert_eq!(
        gw.post_message(&token, &session, "echo two").await.status(),
        202
    );
    let seen = events
        .until("turn_end after resuming", |e| e.event == "turn_end")
        .await;
    assert!(
        seen.iter()
            .any(|e| e.event == "status" && e.data["brain"] == "ready"),
        "{seen:#?}"
    );
    assert!(
        !seen.iter().any(|e| e.event == "error"),
        "the shell agent resumes its session: {seen:#?}"
    );
    assert_eq!(
        seen.last().expect("turn_end").data["stop_reason"],
        "end_turn"
    );
    assert!(text_of(&seen).contains("two"));
    gw.stop().await;
}

#[tokio::test]
async fn agent_output_streams_while_the_command_still_runs() {
    let gw = TestGateway::start(args_with_shell_agent).await;
    let token = gw.register("phone-0001").await;
    let session = gw.create_session(&token).await;
    let mut events = gw.events(&token, &session, None).await;
    // The command cannot finish before the test creates `go`, which it does only after it saw
    // the first line: so that line must have been forwarded while the command ran.
    let command = "echo first-line; while [ ! -f go ]; do sleep 0.05; done; echo second-line";
    assert_eq!(
        gw.post_message(&token, &session, command).await.status(),
        202
    );
    let seen = events
        .until(
            "an update with the first line while the command runs",
            |e| e.event == "update" && e.data["update"].to_string().contains("first-line\\n"),
        )
        .await;
    assert!(!seen.iter().any(|e| e.event == "turn_end"));
    let workspace = gw
        .gateway
        .args
        .data
        .join("sessions")
        .join(&session)
        .join("workspace");
    std::fs::write(workspace.join("go"), "").expect("create go");
    let seen = events
        .until("turn_end after go", |e| e.event == "turn_end")
        .await;
    assert!(text_of(&seen).contains("second-line"));
    assert_eq!(
        seen.last().expect("turn_end").data["stop_reason"],
        "end_turn"
    );
    gw.stop().await;
}

#[tokio::test]
async fn over_the_server_brain_limit_a_message_gets_429_at_once_until_a_slot_frees() {
    let gw = TestGateway::start(|data| {
        let mut args = args_with_shell_agent(data);
        args.max_brains = 1;
        args.warm_workers = 0;
        args
    })
    .await;
    let token = gw.register("phone-0001").await;
    let first = gw.create_session(&token).await;
    let second = gw.create_session(&token).await;
    let mut first_events = gw.events(&token, &first, None).await;
    assert_eq!(
        gw.post_message(&token, &first, "echo one").await.status(),
        202
    );
    first_events
        .until("turn_end in the session holding the brain", |e| {
            e.event == "turn_end"
        })
        .await;

    let refused = gw.post_message(&token, &second, "echo two").await;
    assert_eq!(refused.status(), 429);
    let body: Value = refused.json().await.expect("body");
    assert_eq!(body["code"], "SERVER_BUSY");
    let info: Value = gw
        .http
        .get(format!("{}/v1/sessions/{second}", gw.url))
        .bearer_auth(&token)
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("body");
    assert_eq!(
        (info["turn"].clone(), info["last_seq"].clone()),
        (0.into(), 0.into()),
        "a refused message leaves no trace"
    );

    let deleted = gw
        .http
        .delete(format!("{}/v1/sessions/{first}", gw.url))
        .bearer_auth(&token)
        .send()
        .await
        .expect("delete");
    assert_eq!(deleted.status(), 204);
    let mut second_events = gw.events(&token, &second, None).await;
    assert_eq!(
        gw.post_message(&token, &second, "echo two").await.status(),
        202,
        "the slot was given back"
    );
    let seen = second_events
        .until("turn_end in the second session", |e| e.event == "turn_end")
        .await;
    assert_eq!(
        seen.last().expect("turn_end").data["stop_reason"],
        "end_turn"
    );
    gw.stop().await;
}

#[tokio::test]
async fn deleting_a_session_mid_turn_stops_its_brain_and_hands() {
    let gw = TestGateway::start(args_with_shell_agent).await;
    let token = gw.register("phone-0001").await;
    let session = gw.create_session(&token).await;
    let mut events = gw.events(&token, &session, None).await;
    assert_eq!(
        gw.post_message(&token, &session, "sleep 60").await.status(),
        202
    );
    events
        .until("the agent working on `sleep 60`", |e| e.event == "update")
        .await;
    let workspace = gw.gateway.args.data.join("sessions").join(&session);
    let needle = workspace.to_string_lossy().to_string();
    assert!(
        !crate::recovery::processes_mentioning(&needle).is_empty(),
        "the hands run"
    );

    let deleted = gw
        .http
        .delete(format!("{}/v1/sessions/{session}", gw.url))
        .bearer_auth(&token)
        .send()
        .await
        .expect("delete");
    assert_eq!(deleted.status(), 204);
    // The stream delivers what was already sent, then ends.
    while events
        .next("the end of the deleted session's stream")
        .await
        .is_some()
    {}
    assert!(
        crate::recovery::processes_mentioning(&needle).is_empty(),
        "the hands stopped with the session"
    );
    assert!(!workspace.exists());
    gw.stop().await;
}
