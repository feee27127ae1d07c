//! The session engine driven directly, without HTTP: a session's whole life (create, a turn
//! with the built-in shell agent, delete) through `warren_gateway::engine`, what its log holds,
//! and what the engine tells the layers above when a session goes.

use std::sync::{Arc, Mutex};

use warren_gateway::engine::Engine;
use warren_gateway::engine_error::EngineError;
use warren_gateway::{sessions, turns};
use warren_test_support::within;

use super::helpers::args_with_shell_agent;

/// The events of `session`'s log up to and including the first `turn_end`.
async fn until_turn_end(session: &sessions::Session) -> Vec<serde_json::Value> {
    until(session, |event| event["type"] == "turn_end").await
}

/// The events of `session`'s log up to and including the first that `wanted` picks.
async fn until(
    session: &sessions::Session,
    wanted: impl Fn(&serde_json::Value) -> bool,
) -> Vec<serde_json::Value> {
    let mut subscription = session.log.subscribe(0).expect("subscribes");
    let mut seen: Vec<serde_json::Value> = Vec::new();
    for event in std::mem::take(&mut subscription.backlog) {
        seen.push(serde_json::from_str(&event.json).expect("an event is JSON"));
    }
    while !seen.iter().any(&wanted) {
        let event = within("the next event of the turn", subscription.live.recv())
            .await
            .expect("the log stays open");
        seen.push(serde_json::from_str(&event.json).expect("an event is JSON"));
    }
    let first = seen.iter().position(&wanted).expect("the wanted event");
    seen.truncate(first + 1);
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

/// The arguments of an engine on `data` in this suite's store (files, or a database of its own
/// in the PostgreSQL run), with the shell agent.
fn engine_args(data: &std::path::Path) -> warren_gateway::config::GatewayArgs {
    let mut args = args_with_shell_agent(data.to_path_buf());
    args.store = super::helpers::store_for(data);
    args
}

/// A session outlives its engine: after a shutdown in the middle of a turn, an engine opened on
/// the same store has the session, its log says the turn was interrupted, and the next
/// message is turn 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_and_its_interrupted_turn_come_back_when_the_engine_reopens() {
    let data = tempfile::tempdir().expect("temp data dir");
    let engine = Engine::open(engine_args(data.path()))
        .await
        .expect("the engine opens");
    engine.start().await;
    let session = sessions::create_session(&engine, "phone-0001", Some("long".into()))
        .await
        .expect("a session");
    let id = session.id.clone();
    turns::start_turn(&engine, &session, "sleep 30".into())
        .await
        .expect("the turn starts");
    // The agent runs the command: the turn is under way, not still starting its brain.
    until(&session, |event| {
        event["type"] != "user_message" && event.to_string().contains("sleep 30")
    })
    .await;
    engine.shutdown().await;
    drop(session);
    drop(engine);

    let engine = Engine::open(engine_args(data.path()))
        .await
        .expect("the engine opens again");
    engine.start().await;
    let session = engine
        .sessions
        .get("phone-0001", &id)
        .expect("the session is back");
    let seen = until_turn_end(&session).await;
    let end = seen.last().expect("turn_end");
    assert_eq!(end["turn"], 1, "{end}");
    assert_eq!(end["stop_reason"], "interrupted", "{seen:#?}");
    let next = turns::start_turn(&engine, &session, "echo again".into())
        .await
        .expect("the next turn starts");
    assert_eq!(next, 2);
    sessions::delete_session(&engine, &session)
        .await
        .expect("deleted");
    engine.shutdown().await;
}

/// A device holds at most 20 sessions, counted by the engine (in the store, across replicas):
/// the 21st is refused with `QuotaExceeded` and makes nothing; a delete frees a place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_beyond_its_session_quota_is_refused_by_the_engine() {
    let data = tempfile::tempdir().expect("temp data dir");
    let mut args = super::helpers::args_without_agent(data.path().to_path_buf());
    args.store = super::helpers::store_for(data.path());
    let engine = Engine::open(args).await.expect("the engine opens");
    engine.start().await;
    let mut made = Vec::new();
    for n in 0..20 {
        let session = sessions::create_session(&engine, "phone-0002", Some(format!("s{n}")))
            .await
            .expect("within the quota");
        made.push(session);
    }
    let refused = sessions::create_session(&engine, "phone-0002", None).await;
    assert!(
        matches!(refused, Err(EngineError::QuotaExceeded(_))),
        "the 21st session: {:?}",
        refused.map(|s| s.id.clone())
    );
    assert_eq!(engine.sessions.list("phone-0002").len(), 20);
    let n_dirs = std::fs::read_dir(data.path().join("sessions"))
        .expect("the sessions directory")
        .count();
    assert_eq!(n_dirs, 20, "a refused session leaves no directory");
    sessions::create_session(&engine, "phone-0003", None)
        .await
        .expect("another device has its own quota");
    let first = made.remove(0);
    sessions::delete_session(&engine, &first)
        .await
        .expect("deleted");
    sessions::create_session(&engine, "phone-0002", None)
        .await
        .expect("a delete frees a place");
    engine.shutdown().await;
}
