//! Turns end to end with the built-in shell agent of the real `warren` binary: streamed output,
//! 409 while a turn runs, cancel, permission questions and answers.

// Tests start real programs (shells, servers, the binary under test) directly.
#![allow(clippy::disallowed_methods)]

use serde_json::Value;

use warren_test_support::alive;

use super::helpers::{
    Received, TestGateway, WAIT, args_with_shell_agent, file_store_only, first_of, hands_processes,
    kill, stop_reason, text_of,
};

#[tokio::test]
async fn echo_hi_streams_user_message_turn_start_updates_and_turn_end() {
    let gw = TestGateway::start(args_with_shell_agent).await;
    let mut chat = gw.conversation("phone-0001").await;
    let accepted = chat.send("echo hi").await;
    assert_eq!(accepted.status(), 202);
    let body: Value = accepted.json().await.expect("accepted body");
    assert_eq!(body["turn"], 1);

    let seen = chat.until_turn_end("`echo hi`").await;
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
    // The first message starts the hands (a `hands` event with its timing) and opens the ACP
    // session on the warm worker (`status` brain `ready`), before the agent's first update.
    let position = |what: &str, found: &dyn Fn(&Received) -> bool| {
        seen.iter()
            .position(found)
            .unwrap_or_else(|| panic!("{what} among {kinds:?}"))
    };
    let starting = position("hands starting", &|e| {
        e.event == "hands" && e.data["state"] == "starting"
    });
    let hands = position("hands running", &|e| {
        e.event == "hands" && e.data["state"] == "running"
    });
    assert!(starting < hands, "{kinds:?}");
    assert!(seen[hands].data["elapsed_ms"].is_u64(), "{:?}", seen[hands]);
    assert!(
        seen[hands].data["isolation"].is_string(),
        "{:?}",
        seen[hands]
    );
    let ready = position("brain ready", &|e| {
        e.event == "status" && e.data["brain"] == "ready"
    });
    let first_update = position("an update", &|e| e.event == "update");
    assert!(hands < ready && ready < first_update, "{kinds:?}");
    let seqs: Vec<u64> = seen.iter().map(|e| e.id.expect("id")).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "seq strictly +1 from 1"
    );

    let seen = chat.turn("echo second").await;
    assert!(text_of(&seen).contains("second"));
    let info = chat.info().await;
    assert_eq!(info["turn"], 2);
    assert_eq!(info["status"], "idle");
    assert_eq!(info["hands"], "running");
    gw.stop().await;
}

#[tokio::test]
async fn a_second_message_during_a_turn_is_409_and_cancel_ends_the_turn() {
    let gw = TestGateway::start(args_with_shell_agent).await;
    let mut chat = gw.conversation("phone-0001").await;
    chat.start_working("sleep 60").await;

    let busy = chat.send("echo no").await;
    assert_eq!(busy.status(), 409);
    let body: Value = busy.json().await.expect("body");
    assert_eq!(body["code"], "TURN_IN_PROGRESS");

    assert_eq!(chat.cancel().await.status(), 202);
    let seen = chat.until_turn_end("the turn after cancel").await;
    assert_eq!(stop_reason(&seen), "cancelled");

    assert_eq!(chat.cancel().await.status(), 409, "nothing to cancel");
    let seen = chat.turn("echo after").await;
    assert!(text_of(&seen).contains("after"));
    gw.stop().await;
}

#[tokio::test]
async fn rm_asks_permission_and_the_answer_is_recorded() {
    let gw = TestGateway::start(args_with_shell_agent).await;
    let mut chat = gw.conversation("phone-0001").await;
    chat.turn("touch doomed.txt").await;

    let request = chat.permission_request_for("rm doomed.txt").await;
    let request_id = request.data["request_id"].as_str().expect("request id");
    assert!(request.data["tool_call"].is_object());
    let options = request.data["options"].as_array().expect("options");
    let allow = options
        .iter()
        .find(|o| o["kind"] == "allow_once")
        .expect("an allow option");
    let allow_id = allow["optionId"].as_str().expect("option id");

    let wrong = chat.answer_permission(request_id, "nope").await;
    assert_eq!(wrong.status(), 400, "an option the agent did not offer");
    let answer = chat.answer_permission(request_id, allow_id).await;
    assert_eq!(answer.status(), 204);
    let again = chat.answer_permission(request_id, allow_id).await;
    assert_eq!(again.status(), 404, "answered once");

    let seen = chat.until_turn_end("rm").await;
    let resolved = first_of(&seen, "permission_resolved");
    assert_eq!(resolved.data["outcome"], "selected");
    assert_eq!(resolved.data["option_id"], allow_id);
    assert_eq!(stop_reason(&seen), "end_turn");
    assert!(
        !chat.workspace().join("doomed.txt").exists(),
        "rm ran after the answer"
    );
    gw.stop().await;
}

#[tokio::test]
async fn cancel_answers_a_pending_permission_cancelled() {
    let gw = TestGateway::start(args_with_shell_agent).await;
    let mut chat = gw.conversation("phone-0001").await;
    chat.permission_request_for("rm -rf nothing").await;
    assert_eq!(chat.cancel().await.status(), 202);
    let seen = chat.until_turn_end("the turn after cancel").await;
    let resolved = first_of(&seen, "permission_resolved");
    assert_eq!(resolved.data["outcome"], "cancelled");
    assert_eq!(stop_reason(&seen), "cancelled");
    gw.stop().await;
}

#[tokio::test]
async fn a_worker_dying_mid_turn_ends_the_turn_with_error_and_the_conversation_stays() {
    let gw = TestGateway::start(args_with_shell_agent).await;
    let mut chat = gw.conversation("phone-0001").await;
    chat.start_working("sleep 60").await;

    let pid = gw
        .session_of("phone-0001", &chat.session)
        .brain_pid()
        .expect("a ready brain runs the turn");
    kill("9", pid, "the agent");

    let seen = chat.until_turn_end("the turn whose worker died").await;
    assert_eq!(first_of(&seen, "error").data["code"], "BRAIN_EXITED");
    assert_eq!(stop_reason(&seen), "error");

    let seen = chat.turn_ok("echo still here").await;
    assert!(text_of(&seen).contains("still here"));
    gw.stop().await;
}

#[tokio::test]
async fn an_idle_brain_is_stopped_and_the_next_message_resumes_it() {
    let gw = TestGateway::start_changed(args_with_shell_agent, |args| {
        args.brain_idle = std::time::Duration::from_secs(1)
    })
    .await;
    let mut chat = gw.conversation("phone-0001").await;
    chat.turn("echo one").await;
    chat.until("the brain stopped for being idle", |e| {
        e.event == "status" && e.data["brain"] == "idle"
    })
    .await;
    assert_eq!(chat.info().await["brain"], "none");

    let seen = chat.turn("echo two").await;
    assert!(
        seen.iter()
            .any(|e| e.event == "status" && e.data["brain"] == "ready"),
        "{seen:#?}"
    );
    assert!(
        !seen.iter().any(|e| e.event == "error"),
        "the shell agent resumes its session: {seen:#?}"
    );
    assert_eq!(stop_reason(&seen), "end_turn");
    assert!(text_of(&seen).contains("two"));
    gw.stop().await;
}

#[tokio::test]
async fn agent_output_streams_while_the_command_still_runs() {
    let gw = TestGateway::start(args_with_shell_agent).await;
    let mut chat = gw.conversation("phone-0001").await;
    // The command cannot finish before the test creates `go`, which it does only after it saw
    // the first line: so that line must have been forwarded while the command ran.
    chat.accept("echo first-line; while [ ! -f go ]; do sleep 0.05; done; echo second-line")
        .await;
    let seen = chat
        .until(
            "an update with the first line while the command runs",
            |e| e.event == "update" && e.data["update"].to_string().contains("first-line\\n"),
        )
        .await;
    assert!(!seen.iter().any(|e| e.event == "turn_end"));
    std::fs::write(chat.workspace().join("go"), "").expect("create go");
    let seen = chat.until_turn_end("the command after go").await;
    assert!(text_of(&seen).contains("second-line"));
    assert_eq!(stop_reason(&seen), "end_turn");
    gw.stop().await;
}

#[tokio::test]
async fn over_the_server_brain_limit_a_message_gets_429_at_once_until_a_slot_frees() {
    let gw = TestGateway::start_changed(args_with_shell_agent, |args| {
        args.max_brains = 1;
        args.warm_workers = 0;
    })
    .await;
    let mut first = gw.conversation("phone-0001").await;
    let second = gw.create_session(&first.token).await;
    first.turn("echo one").await;

    let refused = gw.post_message(&first.token, &second, "echo two").await;
    assert_eq!(refused.status(), 429);
    let body: Value = refused.json().await.expect("body");
    assert_eq!(body["code"], "SERVER_BUSY");
    let info = gw.session_info(&first.token, &second).await;
    assert_eq!(
        (info["turn"].clone(), info["last_seq"].clone()),
        (0.into(), 0.into()),
        "a refused message leaves no trace"
    );

    let deleted = gw
        .delete(&first.token, &format!("/sessions/{}", first.session))
        .await;
    assert_eq!(deleted.status(), 204);
    let mut second_events = gw.events(&first.token, &second, None).await;
    assert_eq!(
        gw.post_message(&first.token, &second, "echo two")
            .await
            .status(),
        202,
        "the slot was given back"
    );
    let seen = second_events
        .until("turn_end in the second session", |e| e.event == "turn_end")
        .await;
    assert_eq!(stop_reason(&seen), "end_turn");
    gw.stop().await;
}

#[tokio::test]
async fn deleting_a_session_mid_turn_stops_its_brain_and_hands() {
    let gw = TestGateway::start(args_with_shell_agent).await;
    let mut chat = gw.conversation("phone-0001").await;
    chat.start_working("sleep 60").await;
    let hands = hands_processes(&gw.data, &chat.session);
    assert!(!hands.is_empty(), "the hands run");

    let deleted = gw
        .delete(&chat.token, &format!("/sessions/{}", chat.session))
        .await;
    assert_eq!(deleted.status(), 204);
    // The stream delivers what was already sent, then ends.
    while chat
        .events
        .next("the end of the deleted session's stream")
        .await
        .is_some()
    {}
    assert!(
        !hands.iter().any(|pid| alive(*pid)),
        "every process of the hands stopped with the session"
    );
    let session_dir = gw.data.join("sessions").join(&chat.session);
    assert!(!session_dir.exists());
    assert!(
        !gw.data
            .join("run")
            .join("hands")
            .join(&chat.session)
            .exists(),
        "the hands' run directory is removed"
    );
    gw.stop().await;
}

#[tokio::test]
async fn shutting_down_mid_turn_ends_the_turn_interrupted_stops_the_brain_and_leaves_the_hands_paused()
 {
    if file_store_only("reads events.jsonl after the stop") {
        return;
    }
    let gw = TestGateway::start(args_with_shell_agent).await;
    let mut chat = gw.conversation("phone-0001").await;
    chat.start_working("sleep 60").await;
    let session = gw
        .gateway
        .engine
        .sessions
        .all()
        .pop()
        .expect("the conversation's session");
    let brain_pid = session.brain_pid().expect("a ready brain runs the turn");
    drop(session);
    let events_path = chat.workspace().with_file_name("events.jsonl");
    let hands = hands_processes(&gw.data, &chat.session);
    assert!(!hands.is_empty(), "the hands run");
    let data = gw.data.clone();
    drop(chat);

    // What SIGTERM does: the running turn is closed before the brain stops; the hands are
    // snapshotted and paused for the next gateway.
    let data_dir = gw.stop_leaving_hands().await;
    let stored = std::fs::read_to_string(&events_path).expect("the event log stays");
    let ends: Vec<Value> = stored
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).expect("stored event parses"))
        .filter(|event| event["type"] == "turn_end")
        .collect();
    assert_eq!(ends.len(), 1, "one turn_end: {ends:?}");
    assert_eq!(ends[0]["stop_reason"], "interrupted");
    assert_eq!(ends[0]["turn"], 1);
    let deadline = std::time::Instant::now() + WAIT;
    while alive(brain_pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent (pid {brain_pid}) stops with the gateway"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        hands.iter().all(|pid| alive(*pid)),
        "the hands are left for the next gateway"
    );
    let kept = std::fs::read_dir(data.join("sessions"))
        .expect("sessions")
        .flatten()
        .any(|entry| {
            std::fs::read_dir(entry.path().join("checkpoints/workspace/manifests"))
                .is_ok_and(|mut manifests| manifests.next().is_some())
        });
    assert!(kept, "the hands' files were checkpointed before the pause");
    super::helpers::stop_left_hands(&data);
    warren_test_support::eventually("the left hands are stopped", || {
        !hands.iter().any(|pid| alive(*pid))
    })
    .await;
    drop(data_dir);
}

#[tokio::test]
async fn sessions_take_warm_workers_up_to_the_device_brain_limit_and_a_message_over_it_gets_429() {
    let gw = TestGateway::start_changed(args_with_shell_agent, |args| args.warm_workers = 2).await;
    let token = gw.register("phone-0001").await;
    let mut sessions = Vec::new();
    for i in 0..5 {
        assert!(
            gw.gateway.engine.pool.wait_ready(1, WAIT).await,
            "a warm worker is ready for session {i}"
        );
        let id = gw.create_session(&token).await;
        let brain = gw.session_info(&token, &id).await["brain"].clone();
        // A device runs at most 4 brains: the fifth session is created without one.
        let want = if i < 4 { "warm" } else { "none" };
        assert_eq!(brain, want, "session {i}");
        sessions.push(id);
    }
    let refused = gw.post_message(&token, &sessions[4], "echo five").await;
    assert_eq!(refused.status(), 429);
    let body: Value = refused.json().await.expect("error body");
    assert_eq!(body["code"], "QUOTA_EXCEEDED");

    let other = gw.register("phone-0002").await;
    assert!(
        gw.gateway.engine.pool.wait_ready(1, WAIT).await,
        "a warm worker"
    );
    let theirs = gw.create_session(&other).await;
    assert_eq!(
        gw.session_info(&other, &theirs).await["brain"],
        "warm",
        "another device has its own brain quota"
    );

    let deleted = gw
        .delete(&token, &format!("/sessions/{}", sessions[0]))
        .await;
    assert_eq!(deleted.status(), 204);
    let mut events = gw.events(&token, &sessions[4], None).await;
    let accepted = gw.post_message(&token, &sessions[4], "echo five").await;
    assert_eq!(
        accepted.status(),
        202,
        "the deleted session gave its brain slot back"
    );
    let seen = events
        .until("turn_end of the fifth session", |e| e.event == "turn_end")
        .await;
    assert_eq!(stop_reason(&seen), "end_turn");
    assert!(text_of(&seen).contains("five"));
    gw.stop().await;
}
