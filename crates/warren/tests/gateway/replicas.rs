//! Two gateway replicas on one PostgreSQL store (scale-out.md "One owner per session"): a
//! session made on A is streamed from B and driven through B (its owner-bound requests
//! forwarded to A), every event once and in order on both; a session whose owner is gone is 503
//! `OWNER_UNAVAILABLE` with `Retry-After` until the lease expires, then taken over by the next
//! request; creations racing over both replicas never exceed a device's quota.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::Value;

use super::helpers::{
    EventStream, Received, TestGateway, WAIT, args_with_shell_agent, assert_error, assert_seq_from,
    assert_turn_follows, created_and_refused, on_postgres,
};

/// A lease short enough that a failover test waits seconds, not the default 15.
const LEASE_TTL: Duration = Duration::from_secs(3);

/// Two replicas `a` and `b` on one fresh database, each with its own data directory.
struct Pair {
    a: TestGateway,
    b: TestGateway,
    database: String,
}

fn replica_args(url: &str) -> impl FnOnce(PathBuf) -> warren_gateway::GatewayArgs {
    let url = url.to_owned();
    move |data| {
        let mut args = args_with_shell_agent(data);
        args.store = warren_gateway::config::StoreUrl::Postgres(url);
        args.lease_ttl = LEASE_TTL;
        args
    }
}

async fn pair() -> Pair {
    let url = tokio::task::spawn_blocking(|| {
        warren_test_support::services::Postgres::shared().fresh_database()
    })
    .await
    .expect("a database");
    let database = url.rsplit('/').next().expect("a name").to_owned();
    let a = TestGateway::start(replica_args(&url)).await;
    let b = TestGateway::start(replica_args(&url)).await;
    Pair { a, b, database }
}

fn psql(database: &str, sql: &str) -> String {
    warren_test_support::services::Postgres::shared().psql(database, sql)
}

/// A real `warren gateway` A (a child process, to be killed or stopped) and an in-process B
/// on one fresh database, with a session of a new device made on A running `command`, its
/// stream open on B since before the first event.
struct OwnerProcess {
    a: super::helpers::GatewayProcess,
    a_data: tempfile::TempDir,
    b: TestGateway,
    database: String,
    token: String,
    session: String,
    on_b: EventStream,
}

async fn running_on_a_process(device: &str, command: &str) -> OwnerProcess {
    let url = tokio::task::spawn_blocking(|| {
        warren_test_support::services::Postgres::shared().fresh_database()
    })
    .await
    .expect("a database");
    let database = url.rsplit('/').next().expect("a name").to_owned();
    let a_data = tempfile::tempdir().expect("A's data");
    let extra = [
        "--store".to_owned(),
        url.clone(),
        "--lease-ttl".to_owned(),
        format!("{}s", LEASE_TTL.as_secs()),
    ];
    let a = super::helpers::GatewayProcess::start(a_data.path(), &extra, &[]);
    let b = TestGateway::start(replica_args(&url)).await;
    let token = a.register(device).await;
    let session = a.create_session(&token).await;
    let mut on_b = b.events(&token, &session, None).await;
    let sent = a.post_message(&token, &session, command).await;
    assert_eq!(sent.status(), 202);
    on_b.until("the turn running on A, seen on B", |e| e.event == "update")
        .await;
    OwnerProcess {
        a,
        a_data,
        b,
        database,
        token,
        session,
        on_b,
    }
}

/// The agent's session id the store keeps in `session`'s meta.
fn acp_session_id(database: &str, session: &str) -> String {
    psql(
        database,
        &format!("SELECT meta->>'acp_session_id' FROM sessions WHERE id = '{session}'"),
    )
    .trim()
    .to_owned()
}

fn kinds(events: &[Received]) -> Vec<&str> {
    events.iter().map(|e| e.event.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_made_on_a_is_streamed_from_b_and_driven_through_b() {
    if on_postgres() {
        return;
    }
    let Pair { a, b, .. } = pair().await;
    let token = a.register("phone-replica-01").await;
    let session = a.create_session(&token).await;
    // The device and the session are known on B at once.
    let info = b.session_info(&token, &session).await;
    assert_eq!(info["id"], session.as_str(), "{info}");
    let mut on_a = a.events(&token, &session, None).await;
    let mut on_b = b.events(&token, &session, None).await;

    for (n, text) in ["echo one", "echo two"].into_iter().enumerate() {
        let sent = b.post_message(&token, &session, text).await;
        assert_eq!(sent.status(), 202, "a message sent to B is forwarded to A");
        let seen_b = on_b
            .until(&format!("turn_end of {text} on B"), |e| {
                e.event == "turn_end"
            })
            .await;
        let seen_a = on_a
            .until(&format!("turn_end of {text} on A"), |e| {
                e.event == "turn_end"
            })
            .await;
        let ids = |events: &[Received]| events.iter().map(|e| e.id).collect::<Vec<_>>();
        assert_eq!(
            ids(&seen_a),
            ids(&seen_b),
            "turn {n}: both replicas deliver the same events"
        );
        assert_eq!(kinds(&seen_a), kinds(&seen_b));
        assert!(
            seen_b
                .iter()
                .any(|e| e.event == "user_message" && e.data["text"] == text),
            "{:?}",
            kinds(&seen_b)
        );
    }
    // B lists A's session as the events it follows say: what A says of it.
    let listed_on_b = || async {
        let list = b.get_json(&token, "/sessions").await;
        list["sessions"]
            .as_array()
            .and_then(|all| all.iter().find(|s| s["id"] == session.as_str()).cloned())
            .expect("B lists the session")
    };
    let on_a_info = a.session_info(&token, &session).await;
    let listed = listed_on_b().await;
    for field in ["status", "turn", "last_seq", "brain", "hands"] {
        assert_eq!(
            listed[field], on_a_info[field],
            "{field}: {listed} vs {on_a_info}"
        );
    }
    assert_eq!(listed["status"], "idle");
    assert_eq!(listed["brain"], "ready", "{listed}");
    let sent = b.post_message(&token, &session, "sleep 30").await;
    assert_eq!(sent.status(), 202);
    on_b.until("the sleep running, seen on B", |e| e.event == "update")
        .await;
    let listed = listed_on_b().await;
    assert_eq!(listed["status"], "running", "{listed}");
    assert_eq!(listed["turn"], 3, "{listed}");
    let cancelled = b
        .request(Method::POST, &token, &format!("/sessions/{session}/cancel"))
        .send()
        .await
        .expect("answers");
    assert!(cancelled.status().is_success(), "{}", cancelled.status());
    on_b.until("the sleep cancelled", |e| e.event == "turn_end")
        .await;
    let listed = listed_on_b().await;
    assert_eq!(listed["status"], "idle", "{listed}");
    // A resumed stream on B is the same history, with no gap and no duplicate.
    let mut resumed = b.events(&token, &session, Some(0)).await;
    let history = resumed
        .until("the second turn_end again", {
            let mut n = 0;
            move |e| {
                n += usize::from(e.event == "turn_end");
                n == 2
            }
        })
        .await;
    assert_seq_from(&history, 0, "history on B");
    // The session's owner-bound routes answer on B too: its state is A's.
    let info = b.session_info(&token, &session).await;
    assert_eq!(info["turn"], 3, "{info}");
    let deleted = b.delete(&token, &format!("/sessions/{session}")).await;
    assert_eq!(deleted.status(), 204, "a delete sent to B is A's");
    for gw in [&a, &b] {
        let gone = gw.get(&token, &format!("/sessions/{session}")).await;
        assert_eq!(gone.status(), 404);
    }
    // A stops with a brain running for another session: B's list stops calling it ready.
    let other = a.create_session(&token).await;
    let mut other_on_b = b.events(&token, &other, None).await;
    let sent = a.post_message(&token, &other, "echo x").await;
    assert_eq!(sent.status(), 202);
    other_on_b
        .until("turn_end of echo x on B", |e| e.event == "turn_end")
        .await;
    let brain_on_b = || async {
        let list = b.get_json(&token, "/sessions").await;
        list["sessions"]
            .as_array()
            .and_then(|all| all.iter().find(|s| s["id"] == other.as_str()).cloned())
            .expect("B lists the other session")["brain"]
            .clone()
    };
    assert_eq!(brain_on_b().await, "ready");
    a.stop().await;
    other_on_b
        .until("the brain stopped with A, seen on B", |e| {
            e.event == "status" && e.data["brain"] == "idle"
        })
        .await;
    assert_eq!(brain_on_b().await, "none");
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_that_is_gone_is_503_until_its_lease_expires_then_the_session_is_taken_over() {
    if on_postgres() {
        return;
    }
    let Pair { a, b, database } = pair().await;
    let token = a.register("phone-replica-02").await;
    let session = a.create_session(&token).await;
    let mut events = a.events(&token, &session, None).await;
    let first = a.turn(&token, &session, &mut events, "echo before").await;
    let last_seen = first.last().and_then(|e| e.id).expect("events");
    drop(events);
    a.stop().await;
    // A replica that died holding the lease: nothing listens at its URL.
    let dead = "http://127.0.0.1:9";
    psql(
        &database,
        &format!(
            "UPDATE leases SET replica_id = 'dead', replica_url = '{dead}', \
             expires_at = now() + interval '{} seconds' WHERE session_id = '{session}'",
            LEASE_TTL.as_secs()
        ),
    );
    let started = Instant::now();
    let refused = b.post_message(&token, &session, "echo during").await;
    assert_eq!(refused.status(), 503);
    let retry: u64 = refused
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("a Retry-After in seconds");
    assert!((1..=LEASE_TTL.as_secs() + 1).contains(&retry), "{retry}");
    let body: Value = refused.json().await.expect("a JSON error");
    assert_eq!(body["code"], "OWNER_UNAVAILABLE", "{body}");
    // A forwarded request is never forwarded again.
    let hop = b
        .request(Method::POST, &token, &format!("/sessions/{session}/cancel"))
        .header("x-warren-forwarded-by", "another-replica")
        .send()
        .await
        .expect("answers");
    assert_eq!(hop.status(), 503);

    let mut stream = b.events(&token, &session, Some(last_seen)).await;
    let accepted = loop {
        let sent = b.post_message(&token, &session, "echo after").await;
        if sent.status() == 202 {
            break started.elapsed();
        }
        assert_eq!(sent.status(), 503, "until the lease expires");
        assert!(
            started.elapsed() < LEASE_TTL + WAIT,
            "the lease expires in time"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        accepted >= LEASE_TTL - Duration::from_millis(500),
        "not before the lease expired: {accepted:?}"
    );
    assert_turn_follows(&mut stream, "echo after", last_seen, "after the takeover").await;
    let holder = psql(
        &database,
        &format!("SELECT replica_id FROM leases WHERE session_id = '{session}'"),
    );
    assert_ne!(holder.trim(), "dead", "B holds the lease now");
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_creations_racing_over_two_replicas_never_exceed_the_device_quota() {
    if on_postgres() {
        return;
    }
    let Pair { a, b, database } = pair().await;
    let token = a.register("phone-replica-03").await;
    let create = |gw: &TestGateway| {
        gw.request(Method::POST, &token, "/sessions")
            .json(&serde_json::json!({"title": "race"}))
            .send()
    };
    let answers =
        futures_util::future::join_all((0..50).map(|n| create(if n % 2 == 0 { &a } else { &b })))
            .await;
    let (n_created, _) = created_and_refused(answers).await;
    assert_eq!(
        n_created, 20,
        "a device holds at most 20 sessions across replicas"
    );
    let stored = psql(&database, "SELECT count(*) FROM sessions");
    assert_eq!(stored.trim(), "20");
    let listed = b.get_json(&token, "/sessions").await;
    assert_eq!(
        listed["sessions"].as_array().map(Vec::len),
        Some(20),
        "B lists A's sessions too"
    );
    b.stop().await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_sessions_slot_is_free_on_every_replica() {
    if on_postgres() {
        return;
    }
    let Pair { a, b, database: _ } = pair().await;
    let token = a.register("phone-replica-06").await;
    let mut sessions = Vec::new();
    for n in 0..20 {
        let maker = if n % 2 == 0 { &a } else { &b };
        sessions.push(maker.create_session(&token).await);
    }
    // B has seen every session (its list shows A's too) before two of them go through A.
    let listed = b.get_json(&token, "/sessions").await;
    assert_eq!(listed["sessions"].as_array().map(Vec::len), Some(20));
    for session in &sessions[..2] {
        let deleted = a.delete(&token, &format!("/sessions/{session}")).await;
        assert_eq!(deleted.status(), 204, "delete {session}");
    }
    for (name, gw) in [("A", &a), ("B", &b)] {
        let created = gw
            .request(Method::POST, &token, "/sessions")
            .json(&serde_json::json!({"title": "after delete"}))
            .send()
            .await
            .expect("answers");
        let status = created.status();
        let body = created.text().await.unwrap_or_default();
        assert_eq!(
            status, 201,
            "a creation on {name} after two deletes: {body}"
        );
    }
    b.stop().await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_devices_brains_on_both_replicas_together_never_exceed_its_limit() {
    if on_postgres() {
        return;
    }
    let Pair { a, b, database } = pair().await;
    let token = a.register("phone-replica-05").await;
    let n_slots = || {
        psql(
            &database,
            "SELECT count(*) FROM brain_slots WHERE expires_at >= now()",
        )
    };
    // Six sessions, three made on each replica (a creation takes a warm brain while the limit
    // leaves room).
    let mut sessions = Vec::new();
    for n in 0..6 {
        let maker = if n % 2 == 0 { &a } else { &b };
        sessions.push(maker.create_session(&token).await);
    }
    let held: u64 = n_slots().trim().parse().expect("a count");
    assert!(held <= 4, "at most 4 brains at creation: {held}");
    let n_events = |session: &str| {
        psql(
            &database,
            &format!("SELECT count(*) FROM events WHERE session_id = '{session}'"),
        )
    };
    let events_before: std::collections::HashMap<String, String> = sessions
        .iter()
        .map(|session| (session.clone(), n_events(session)))
        .collect();
    // A message to each session at once, each sent to the replica that did not make it (so it is
    // forwarded to its owner): the device runs at most 4 brains over both replicas together.
    let sends = sessions.iter().enumerate().map(|(n, session)| {
        let via = if n % 2 == 0 { &b } else { &a };
        via.post_message(&token, session, "echo hi")
    });
    let answers = futures_util::future::join_all(sends).await;
    let mut refused = Vec::new();
    for (answer, session) in answers.into_iter().zip(&sessions) {
        match answer.status().as_u16() {
            202 => {}
            429 => {
                let body = assert_error(answer, 429, "QUOTA_EXCEEDED", "a message over it").await;
                assert!(
                    body["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("4 brains")),
                    "{body}"
                );
                refused.push(session.clone());
            }
            other => panic!("a message answered {other}"),
        }
    }
    assert_eq!(refused.len(), 2, "4 of 6 sessions run a brain");
    assert_eq!(n_slots().trim(), "4");
    // A refused session got nothing recorded.
    assert_eq!(
        n_events(&refused[0]),
        events_before[&refused[0]],
        "nothing recorded"
    );
    // Deleting a session that runs a brain frees its slot for the others, on either replica.
    let running = sessions
        .iter()
        .find(|session| !refused.contains(session))
        .expect("a session with a brain");
    let gone = a.delete(&token, &format!("/sessions/{running}")).await;
    assert_eq!(gone.status(), 204);
    let deadline = Instant::now() + WAIT;
    loop {
        let answer = a.post_message(&token, &refused[0], "echo now").await;
        match answer.status().as_u16() {
            202 => break,
            429 => assert!(Instant::now() < deadline, "the freed slot is taken in time"),
            other => panic!("a message answered {other}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(n_slots().trim(), "4");
    // A replica that stops gives its slots back at once.
    let b_id = psql(
        &database,
        &format!(
            "SELECT replica_id FROM leases WHERE session_id = '{}'",
            sessions[1]
        ),
    );
    let b_slots = format!(
        "SELECT count(*) FROM brain_slots WHERE replica_id = '{}'",
        b_id.trim()
    );
    let n_on_b: u64 = psql(&database, &b_slots).trim().parse().expect("a count");
    b.stop().await;
    assert_eq!(psql(&database, &b_slots).trim(), "0", "B held {n_on_b}");
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_owner_mid_turn_and_the_other_replica_closes_the_turn_once_and_goes_on() {
    if on_postgres() {
        return;
    }
    let OwnerProcess {
        mut a,
        a_data,
        b,
        database,
        token,
        session,
        mut on_b,
    } = running_on_a_process("phone-replica-04", "sleep 60").await;
    let acp_session_on_a = acp_session_id(&database, &session);
    assert!(
        acp_session_on_a.starts_with("shell-"),
        "A's agent session is stored: {acp_session_on_a:?}"
    );

    let killed_at = Instant::now();
    tokio::task::spawn_blocking(move || {
        a.kill_9();
        a
    })
    .await
    .map(drop)
    .expect("A is killed");
    // B's subscribers stay connected; the next message on B waits out A's lease, then B takes
    // the session: the turn A ran is closed `interrupted` once, and the new turn runs on B.
    let accepted = loop {
        let answer = b.post_message(&token, &session, "echo after").await;
        match answer.status().as_u16() {
            202 => break killed_at.elapsed(),
            503 => {
                assert_error(answer, 503, "OWNER_UNAVAILABLE", "a message to B").await;
            }
            other => panic!("a message while A is gone answered {other}"),
        }
        assert!(
            killed_at.elapsed() < LEASE_TTL + WAIT,
            "B takes over in time"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        accepted < LEASE_TTL + Duration::from_secs(10),
        "within the lease timeout: {accepted:?}"
    );
    let seen = on_b
        .until("turn_end of echo after on B", |e| {
            e.event == "turn_end" && e.data["stop_reason"] != "interrupted"
        })
        .await;
    let interrupted: Vec<&Received> = seen
        .iter()
        .filter(|e| e.event == "turn_end" && e.data["stop_reason"] == "interrupted")
        .collect();
    assert_eq!(
        interrupted.len(),
        1,
        "the running turn is closed once: {:?}",
        kinds(&seen)
    );
    assert!(
        seen.iter()
            .any(|e| e.event == "user_message" && e.data["text"] == "echo after")
    );
    // B's brain resumed the agent's session A had (`session/resume`), so the agent keeps its
    // context: no `CONTEXT_LOST`, and the stored ACP session id is still A's.
    assert!(
        !seen
            .iter()
            .any(|e| e.event == "error" && e.data["code"] == "CONTEXT_LOST"),
        "the ACP session is resumed: {:?}",
        kinds(&seen)
    );
    assert_eq!(acp_session_id(&database, &session), acp_session_on_a);
    // One history, every seq once: what B streamed live is what the store holds.
    let mut history = b.events(&token, &session, Some(0)).await;
    let n_stored: u64 = psql(
        &database,
        &format!("SELECT count(*) FROM events WHERE session_id = '{session}'"),
    )
    .trim()
    .parse()
    .expect("a count");
    let all = history
        .until("every stored event", |e| e.id == Some(n_stored))
        .await;
    assert_seq_from(&all, 0, "the whole history");
    let n_interrupted = all
        .iter()
        .filter(|e| e.event == "turn_end" && e.data["stop_reason"] == "interrupted")
        .count();
    assert_eq!(n_interrupted, 1);
    let again = b.post_message(&token, &session, "echo more").await;
    assert_eq!(again.status(), 202, "the session goes on");
    on_b.until("turn_end of echo more", |e| e.event == "turn_end")
        .await;
    super::helpers::stop_left_hands(a_data.path());
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_stalls_past_its_lease_writes_nothing_after_the_new_owner_and_goes_on() {
    if on_postgres() {
        return;
    }
    let OwnerProcess {
        a,
        a_data: _a_data,
        b,
        database,
        token,
        session,
        mut on_b,
    } = running_on_a_process("phone-replica-06", "sleep 30").await;

    // A stalls (SIGSTOP): it still accepts connections and answers nothing. A message sent to
    // B is a clear 503 while A's lease runs (the forward does not hang), then B takes over.
    a.signal("STOP");
    let stalled_at = Instant::now();
    loop {
        let answer = tokio::time::timeout(
            LEASE_TTL + WAIT,
            b.post_message(&token, &session, "echo after"),
        )
        .await
        .expect("B answers while A is stalled");
        match answer.status().as_u16() {
            202 => break,
            503 => {
                assert_error(answer, 503, "OWNER_UNAVAILABLE", "a message to B").await;
            }
            // B has taken the session and is still ending A's `sleep 30` turn as interrupted:
            // a moment of "a turn is running", as a client sees when it sends during one.
            409 => {
                assert_error(answer, 409, "TURN_IN_PROGRESS", "a message to B").await;
            }
            other => panic!("a message while A is stalled answered {other}"),
        }
        assert!(
            stalled_at.elapsed() < LEASE_TTL + 2 * WAIT,
            "B takes over in time"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    on_b.until("turn_end of echo after on B", |e| {
        e.event == "turn_end" && e.data["stop_reason"] != "interrupted"
    })
    .await;
    // B's own last event: the turn's checkpoint (B's first of the session), just after.
    on_b.until("B's checkpoint after echo after", |e| {
        e.event == "checkpoint"
    })
    .await;
    let n_stored = || {
        psql(
            &database,
            &format!("SELECT count(*) FROM events WHERE session_id = '{session}'"),
        )
        .trim()
        .parse::<u64>()
        .expect("a count")
    };
    let before_wake = n_stored();

    // A wakes: it finds its lease gone and stops the brain; what that appends is refused by the
    // fence, so nothing of A's lands after B's events, and A stays healthy for its other work.
    a.signal("CONT");
    tokio::time::sleep(LEASE_TTL).await;
    assert_eq!(n_stored(), before_wake, "nothing of A's after B's events");
    a.assert_healthy("A's storage is fine").await;
    let other = a.create_session(&token).await;
    let mut on_other = a.events(&token, &other, None).await;
    let sent = a.post_message(&token, &other, "echo fine").await;
    assert_eq!(sent.status(), 202, "A takes new work");
    on_other
        .until("turn_end on A", |e| e.event == "turn_end")
        .await;
    // One history: seq +1 throughout, the stalled turn closed `interrupted` once, by B.
    let again = b.post_message(&token, &session, "echo more").await;
    assert_eq!(again.status(), 202, "the session goes on on B");
    on_b.until("turn_end of echo more", |e| e.event == "turn_end")
        .await;
    let mut history = b.events(&token, &session, Some(0)).await;
    let n_all = n_stored();
    let all = history
        .until("every stored event", |e| e.id == Some(n_all))
        .await;
    assert_seq_from(&all, 0, "the whole history");
    let first_turn_ends: Vec<&Received> = all
        .iter()
        .filter(|e| e.event == "turn_end" && e.data["turn"] == 1)
        .collect();
    assert_eq!(first_turn_ends.len(), 1, "{first_turn_ends:?}");
    assert_eq!(first_turn_ends[0].data["stop_reason"], "interrupted");
    drop(a);
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_made_on_a_is_served_through_b_until_it_is_revoked() {
    if on_postgres() {
        return;
    }
    let Pair { a, b, database } = pair().await;
    let mut chat = a.conversation("phone-replica-preview").await;
    chat.turn("echo served-by-a > index.txt; setsid nohup python3 -m http.server 18766 --bind 127.0.0.1 >/dev/null 2>&1 & echo started")
        .await;
    let created = chat.create_preview(serde_json::json!(18766)).await;
    assert_eq!(created.status(), 201);
    let preview: Value = created.json().await.expect("json");
    let url = preview["url"].as_str().expect("url").to_owned();
    let host = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let token = host
        .strip_prefix("p-")
        .and_then(|rest| rest.split('.').next())
        .expect("the default URL shape")
        .to_owned();
    let through_b = |path: &str| {
        reqwest::Client::new()
            .get(format!("{}{path}", b.url))
            .header(reqwest::header::HOST, &host)
    };
    let body = warren_test_support::eventually_async("A's preview answers through B", || {
        let request = through_b("/index.txt");
        async move {
            let response = request.send().await.ok()?;
            (response.status() == 200).then_some(())?;
            response.text().await.ok()
        }
    })
    .await;
    assert_eq!(body, "served-by-a\n");
    // A request B is handed as forwarded already is never forwarded again.
    let bounced = through_b("/index.txt")
        .header("x-warren-forwarded-by", "another-replica")
        .send()
        .await
        .expect("answers");
    assert_error(bounced, 503, "OWNER_UNAVAILABLE", "a forwarded request").await;
    // The store holds the token's hash, never the token.
    let rows = psql(
        &database,
        "SELECT token_hash || ' ' || session_id || ' ' || record::text FROM preview_tokens",
    );
    let rows: Vec<&str> = rows.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(rows.len(), 1, "{rows:?}");
    let hash = rows[0].split(' ').next().expect("a hash");
    assert_eq!(hash.len(), 64, "a hex SHA-256: {hash}");
    assert!(!rows[0].contains(&token), "{rows:?}");
    assert!(rows[0].contains(&chat.session), "{rows:?}");

    let revoked = chat.revoke_preview(18766).await;
    assert_eq!(revoked.status(), 204);
    let gone = through_b("/index.txt").send().await.expect("answers");
    assert_error(gone, 404, "PREVIEW_NOT_FOUND", "the revoked preview").await;
    assert_eq!(
        psql(&database, "SELECT count(*) FROM preview_tokens").trim(),
        "0"
    );
    b.stop().await;
    a.stop().await;
}
