//! The gateway on a PostgreSQL store that goes away: while the database is down every request
//! that needs it is 503 `STORE_UNAVAILABLE` with `Retry-After` (never a 500, never a hang), and
//! once it is back the gateway goes on by itself: a client that resumes its stream with
//! `Last-Event-ID` sees every event once, in order, and the next message works.

use std::time::{Duration, Instant};

use super::helpers::{
    TestGateway, WAIT, args_with_shell_agent, assert_seq_from, assert_turn_follows, on_postgres,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_is_503_store_unavailable_meanwhile_and_nothing_is_lost() {
    if on_postgres() {
        // One run is enough: this test makes its own store either way.
        return;
    }
    let mut postgres = tokio::task::spawn_blocking(warren_test_support::services::Postgres::start)
        .await
        .expect("PostgreSQL starts");
    let url = postgres.fresh_database();
    let gw = TestGateway::start_changed(args_with_shell_agent, |args| {
        args.store = warren_gateway::config::StoreUrl::Postgres(url)
    })
    .await;
    let token = gw.register("phone-store-01").await;
    let session = gw.create_session(&token).await;
    let mut events = gw.events(&token, &session, None).await;
    let first = gw.turn(&token, &session, &mut events, "echo before").await;
    assert_seq_from(&first, 0, "before");
    let last_seen = first.last().and_then(|e| e.id).expect("events");

    let mut postgres = tokio::task::spawn_blocking(move || {
        postgres.stop();
        postgres
    })
    .await
    .expect("PostgreSQL stops");
    // Every request that needs the store answers 503 with a code and a retry hint, in time.
    for path in [format!("/sessions/{session}"), "/sessions".to_string()] {
        let started = Instant::now();
        let answer = tokio::time::timeout(WAIT, gw.get(&token, &path))
            .await
            .expect("answers without hanging");
        assert_eq!(answer.status(), 503, "{path}");
        assert_eq!(
            answer
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok()),
            Some("1"),
            "{path}"
        );
        let body: serde_json::Value = answer.json().await.expect("a JSON error");
        assert_eq!(body["code"], "STORE_UNAVAILABLE", "{path}: {body}");
        assert!(
            !body["message"].as_str().unwrap_or("").contains("127.0.0.1"),
            "the database's address stays inside: {body}"
        );
        assert!(started.elapsed() < WAIT, "{path} answered in time");
    }
    let refused = tokio::time::timeout(WAIT, gw.post_message(&token, &session, "echo during"))
        .await
        .expect("answers without hanging");
    assert_eq!(refused.status(), 503, "a message while the store is down");
    // Health needs no store: it answers at once, `ok` or (once a write failed) degraded, in its
    // own shape.
    let health = tokio::time::timeout(
        Duration::from_secs(1),
        gw.http.get(format!("{}/healthz", gw.url)).send(),
    )
    .await
    .expect("healthz answers at once without the store")
    .expect("healthz");
    match health.status().as_u16() {
        200 => assert_eq!(health.text().await.expect("text"), "ok\n"),
        503 => {
            let body: serde_json::Value = health.json().await.expect("a JSON body");
            assert_eq!(body["storage"], "failing", "{body}");
        }
        other => panic!("healthz answered {other}"),
    }

    let postgres = tokio::task::spawn_blocking(move || {
        postgres.start_again();
        postgres
    })
    .await
    .expect("PostgreSQL starts again");
    // Back: requests work again within a few seconds, without a gateway restart.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answer = gw.get(&token, &format!("/sessions/{session}")).await;
        if answer.status() == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the gateway works again after the store came back: {}",
            answer.status()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The stream resumed where the client left it: no gap, no duplicate, then live.
    let mut resumed = gw.events(&token, &session, Some(last_seen)).await;
    let mut status = 0;
    for _ in 0..50 {
        status = gw
            .post_message(&token, &session, "echo after")
            .await
            .status()
            .as_u16();
        if status == 202 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, 202, "a message works once the store is back");
    assert_turn_follows(&mut resumed, "echo after", last_seen, "after the restart").await;
    drop(events);
    gw.stop().await;
    drop(postgres);
}
