//! The session engine driven directly, without HTTP: a session's whole life (create, a turn
//! with the built-in shell agent, delete) through `warren_gateway::engine`, what its log holds,
//! and what the engine tells the layers above when a session goes.

use std::sync::{Arc, Mutex};

use warren_gateway::engine::Engine;
use warren_gateway::engine_error::EngineError;
use warren_gateway::{sessions, turns};
use warren_test_support::within;

use super::helpers::args_with_shell_agent;

/// The event types of `session`'s log up to and including the first `turn_end`.
async fn until_turn_end(session: &sessions::Session) -> Vec<serde_json::Value> {
    let mut subscription = session.log.subscribe(0).expect("subscribes");
    let mut seen: Vec<serde_json::Value> = Vec::new();
    for event in std::mem::take(&mut subscription.backlog) {
        seen.push(serde_json::from_str(&event.json).expect("an event is JSON"));
    }
    while !seen.iter().any(|event| event["type"] == "turn_end") {
        let event = within("the next event of the turn", subscription.live.recv())
            .await
            .expect("the log stays open");
        seen.push(serde_json::from_str(&event.json).expect("an event is JSON"));
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_lives_and_goes_through_the_engine_alone() {
    let data = tempfile::tempdir().expect("temp data dir");
    let engine = Engine::open(args_with_shell_agent(data.path().to_path_buf()))
        .await
        .expect("the engine opens");
    let gone = Arc::new(Mutex::new(Vec::<String>::new()));
    let told = gone.clone();
    engine.on_session_gone(move |id| told.lock().expect("the list").push(id.to_owned()));
    engine.start().await;

    let session = sessions::create_session(&engine, "phone-0001", Some("engine".into()))
        .await
        .expect("a session");
    assert_eq!(
        engine.sessions.list("phone-0001").len(),
        1,
        "the device's sessions"
    );
    let turn = turns::start_turn(&engine, &session, "echo from-the-engine".into())
        .await
        .expect("the turn starts");
    assert_eq!(turn, 1);
    let refused = turns::start_turn(&engine, &session, "echo again".into()).await;
    assert!(
        matches!(refused, Err(EngineError::TurnInProgress)),
        "a second message while the turn runs: {refused:?}"
    );

    let seen = until_turn_end(&session).await;
    let kinds: Vec<&str> = seen.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(&kinds[..2], ["user_message", "turn_start"], "{kinds:?}");
    let end = seen.last().expect("turn_end");
    assert_eq!(end["stop_reason"], "end_turn", "{end}");
    assert!(
        seen.iter()
            .any(|e| e.to_string().contains("from-the-engine")),
        "an update carries the command's output: {seen:#?}"
    );

    let dir = session.dir.clone();
    sessions::delete_session(&engine, &session)
        .await
        .expect("deleted");
    assert!(!dir.exists(), "the session's directory is gone");
    assert!(engine.sessions.by_id(&session.id).is_none());
    assert_eq!(*gone.lock().expect("the list"), vec![session.id.clone()]);
    let missing = engine.sessions.get("phone-0001", &session.id).err();
    assert!(
        matches!(missing, Some(EngineError::SessionNotFound)),
        "{missing:?}"
    );
    engine.shutdown().await;
}
