//! The event stream over SSE: resume with `Last-Event-ID` / `?after=` without gap or
//! duplicate, framing, and a reader that stops reading being dropped while others keep going.

use std::collections::BTreeSet;
use std::sync::Arc;

use warren_gateway::sessions::Session;
use warren_protocol::gateway::EventBody;

use crate::helpers::{EventStream, TestGateway, WAIT, args_without_agent};

fn filler(i: u64, size: usize) -> EventBody {
    EventBody::Update {
        update: serde_json::json!({"sessionUpdate": "agent_message_chunk", "n": i, "pad": "x".repeat(size)}),
    }
}

/// A device's token, a new session's id, and the session itself, whose log the test appends to.
async fn new_session(gw: &TestGateway) -> (String, String, Arc<Session>) {
    let token = gw.register("phone-0001").await;
    let id = gw.create_session(&token).await;
    let session = gw.gateway.sessions.get("phone-0001", &id).expect("session");
    (token, id, session)
}

/// A tiny deterministic generator so failures replay the same disconnect points.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

#[tokio::test]
async fn resume_after_random_disconnects_under_10000_events_has_no_gap_and_no_duplicate() {
    const N: u64 = 10_000;
    let gw = TestGateway::start(args_without_agent).await;
    let (token, id, session) = new_session(&gw).await;

    // The writer appends while the reader disconnects and resumes.
    let writer_session = Arc::clone(&session);
    let writer = tokio::spawn(async move {
        for i in 1..=N {
            writer_session
                .log
                .append(None, filler(i, 16))
                .expect("append");
            if i % 50 == 0 {
                tokio::task::yield_now().await;
            }
        }
    });

    let mut rng = Lcg(42);
    let mut received = Vec::new();
    let mut last: Option<u64> = None;
    let mut n_connections = 0;
    while last != Some(N) {
        n_connections += 1;
        // Alternate the two ways to resume.
        let mut stream = if n_connections % 2 == 0 {
            gw.events(&token, &id, last).await
        } else {
            let path = format!("/sessions/{id}/events?after={}", last.unwrap_or(0));
            EventStream::new(gw.get(&token, &path).await)
        };
        let budget = 1 + rng.below(1500);
        for _ in 0..budget {
            let Some(event) = stream.next("the next resumed event").await else {
                break;
            };
            let seq = event.id.expect("every event has an id");
            assert_eq!(event.data["seq"], seq, "id matches the data's seq");
            assert_eq!(event.event, "update");
            received.push(seq);
            last = Some(seq);
            if seq == N {
                break;
            }
        }
        drop(stream);
    }
    writer.await.expect("writer");
    assert!(
        n_connections > 5,
        "the test disconnected several times ({n_connections})"
    );
    assert_eq!(
        received,
        (1..=N).collect::<Vec<_>>(),
        "exactly 1..N in order, no gap, no duplicate"
    );
    let unique: BTreeSet<_> = received.iter().collect();
    assert_eq!(unique.len() as u64, N);
    gw.stop().await;
}

#[tokio::test]
async fn a_reader_that_stops_reading_is_dropped_while_another_keeps_receiving() {
    const N: u64 = 3000;
    let gw = TestGateway::start(args_without_agent).await;
    let (token, id, session) = new_session(&gw).await;

    let mut fast = gw.events(&token, &id, None).await;
    let mut slow = gw.events(&token, &id, None).await;
    let subscribed = async {
        while session.log.n_subscribers() < 2 {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(WAIT, subscribed)
        .await
        .expect("both readers subscribed");

    // The producer keeps pace with the reader that reads (as an agent producing text would be
    // far slower than any reader); the log itself never waits for anyone.
    let fast_progress = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let writer_session = Arc::clone(&session);
    let writer_progress = Arc::clone(&fast_progress);
    let writer = tokio::spawn(async move {
        for i in 1..=N {
            while i > writer_progress.load(std::sync::atomic::Ordering::Acquire) + 64 {
                tokio::task::yield_now().await;
            }
            // 16 KiB per event: far more than socket buffers hold for a reader that stops.
            writer_session
                .log
                .append(None, filler(i, 16 * 1024))
                .expect("append never waits for readers");
        }
    });
    let mut n_fast = 0;
    while n_fast < N {
        let event = fast
            .next("the fast reader's events")
            .await
            .expect("the fast reader is never dropped");
        n_fast += 1;
        fast_progress.store(n_fast, std::sync::atomic::Ordering::Release);
        assert_eq!(event.id, Some(n_fast));
    }
    tokio::time::timeout(WAIT, writer)
        .await
        .expect("the writer finished while a reader was stuck")
        .expect("writer");

    // The slow reader now reads what was buffered; its stream ends before the last event.
    let mut n_slow = 0;
    let mut last_slow = 0;
    while let Some(event) = slow
        .next("the slow reader's buffered events or the end of its stream")
        .await
    {
        n_slow += 1;
        last_slow = event.id.expect("id");
    }
    assert!(
        last_slow < N,
        "the slow reader was disconnected (it got {n_slow} events, last {last_slow})"
    );
    let resumed = gw.events(&token, &id, Some(last_slow)).await;
    let mut resumed = resumed;
    let first = resumed
        .next("the first event after resuming")
        .await
        .expect("resumed stream");
    assert_eq!(first.id, Some(last_slow + 1), "it resumes from its last id");
    gw.stop().await;
}

#[tokio::test]
async fn stream_sends_stored_events_then_live_ones_with_sse_framing() {
    let gw = TestGateway::start(args_without_agent).await;
    let (token, id, session) = new_session(&gw).await;
    for i in 1..=3 {
        session.log.append(Some(1), filler(i, 1)).expect("append");
    }
    let response = gw
        .get(&token, &format!("/sessions/{id}/events?after=1"))
        .await;
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut stream = EventStream::new(response);
    let second = stream.next("stored event 2").await.expect("event");
    assert_eq!((second.id, second.event.as_str()), (Some(2), "update"));
    assert_eq!(second.data["turn"], 1);
    assert!(second.data["ts"].is_string());
    assert_eq!(
        stream.next("stored event 3").await.expect("event").id,
        Some(3)
    );
    session
        .log
        .append(
            None,
            EventBody::Status {
                brain: Some("ready".into()),
                hands: None,
                message: None,
            },
        )
        .expect("append");
    let live = stream.next("the live status event").await.expect("event");
    assert_eq!((live.id, live.event.as_str()), (Some(4), "status"));
    assert_eq!(live.data["brain"], "ready");
    gw.stop().await;
}
