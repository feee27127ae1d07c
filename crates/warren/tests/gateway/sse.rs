//! The event stream over SSE: resume with `Last-Event-ID` / `?after=` without gap or
//! duplicate, framing, a reader that stops reading being dropped while others keep going, and
//! heartbeat comments on an idle stream (read from the raw bytes, since SSE parsers hide them).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use warren_gateway::GatewayArgs;
use warren_gateway::event_log::SUBSCRIBER_QUEUE_MAX;
use warren_gateway::sessions::Session;
use warren_protocol::gateway::EventBody;

use warren_test_support::within;

use super::helpers::{
    EventStream, Received, TestGateway, WAIT, append_ready_status, args_without_agent,
};

fn filler(i: u64, size: usize) -> EventBody {
    EventBody::Update {
        update: serde_json::json!({"sessionUpdate": "agent_message_chunk", "n": i, "pad": "x".repeat(size)}),
    }
}

/// A gateway on the arguments `args` makes, a device's token, a new session's id, and the
/// session itself, whose log the test appends to.
async fn with_session(
    args: impl FnOnce(PathBuf) -> GatewayArgs,
) -> (TestGateway, String, String, Arc<Session>) {
    let gw = TestGateway::start(args).await;
    let token = gw.register("phone-0001").await;
    let id = gw.create_session(&token).await;
    let session = gw.session_of("phone-0001", &id);
    (gw, token, id, session)
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
    let (gw, token, id, session) = with_session(args_without_agent).await;

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
    let (gw, token, id, session) = with_session(args_without_agent).await;

    let mut fast = gw.events(&token, &id, None).await;
    let mut slow = gw.events(&token, &id, None).await;
    until_subscribed(&session, 2).await;

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
    let (gw, token, id, session) = with_session(args_without_agent).await;
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
    append_ready_status(&session);
    let live = stream.next("the live status event").await.expect("event");
    assert_eq!((live.id, live.event.as_str()), (Some(4), "status"));
    assert_eq!(live.data["brain"], "ready");
    gw.stop().await;
}

/// The heartbeat interval of the heartbeat tests: long enough not to flood a loaded machine.
const HEARTBEAT_MS: u64 = 100;
/// How long a heartbeat may take: a hundred intervals, yet shorter than the 15 s default, so these
/// tests fail if the gateway ignored `--sse-heartbeat-ms`.
const HEARTBEAT_WAIT: Duration = Duration::from_secs(10);

fn args_with_heartbeat_ms(heartbeat_ms: u64) -> impl FnOnce(PathBuf) -> GatewayArgs {
    move |data| {
        let mut args = args_without_agent(data);
        args.sse_heartbeat_ms = heartbeat_ms;
        args
    }
}

/// One SSE block as it was sent: a heartbeat (comment lines only) or an event.
#[derive(Debug)]
enum Block {
    Heartbeat,
    Event(Received),
}

/// Reads an event stream's raw bytes block by block, so heartbeat comments are visible.
struct RawEventStream {
    body: BoxStream<'static, reqwest::Result<Vec<u8>>>,
    buffer: Vec<u8>,
}

impl RawEventStream {
    fn new(response: reqwest::Response) -> RawEventStream {
        assert_eq!(response.status(), 200, "opening the event stream");
        RawEventStream {
            body: response
                .bytes_stream()
                .map(|chunk| chunk.map(|bytes| bytes.to_vec()))
                .boxed(),
            buffer: Vec::new(),
        }
    }

    /// The next block within `within`, or `None` when the stream ended.
    async fn next(&mut self, within: Duration, what: &str) -> Option<Block> {
        let lines = tokio::time::timeout(within, self.next_lines())
            .await
            .unwrap_or_else(|_| panic!("timed out after {within:?} waiting for {what}"))?;
        if lines.iter().all(|line| line.starts_with(':')) {
            return Some(Block::Heartbeat);
        }
        let mut received = Received {
            id: None,
            event: String::new(),
            data: serde_json::Value::Null,
        };
        for line in &lines {
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "id" => received.id = Some(value.parse().expect("ids are seqs")),
                "event" => received.event = value.to_string(),
                "data" => received.data = serde_json::from_str(value).expect("data is JSON"),
                _ => {}
            }
        }
        Some(Block::Event(received))
    }

    /// The lines of the next block (up to its blank line), or `None` at the end of the body.
    async fn next_lines(&mut self) -> Option<Vec<String>> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buffer.drain(..end + 2).take(end).collect();
                let text = String::from_utf8(block).expect("the stream is UTF-8");
                return Some(text.lines().map(str::to_string).collect());
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.buffer.extend_from_slice(&chunk),
                Some(Err(_)) | None => return None,
            }
        }
    }

    /// Reads until the next heartbeat; an event before it fails the test.
    async fn heartbeat(&mut self, what: &str) {
        match self.next(HEARTBEAT_WAIT, what).await {
            Some(Block::Heartbeat) => {}
            other => panic!("expected {what}, got {other:?}"),
        }
    }

    /// The next event, skipping heartbeats; the number of heartbeats skipped comes with it.
    async fn event(&mut self, what: &str) -> (Received, usize) {
        let mut n_heartbeats = 0;
        loop {
            match self.next(WAIT, what).await {
                Some(Block::Heartbeat) => n_heartbeats += 1,
                Some(Block::Event(event)) => return (event, n_heartbeats),
                None => panic!("the stream ended before {what}"),
            }
        }
    }
}

/// Opens the raw event stream, resuming after `last_event_id` when given.
async fn raw_events(
    gw: &TestGateway,
    token: &str,
    id: &str,
    last_event_id: Option<u64>,
) -> RawEventStream {
    let mut request = gw.request(
        reqwest::Method::GET,
        token,
        &format!("/sessions/{id}/events"),
    );
    if let Some(seq) = last_event_id {
        request = request.header("Last-Event-ID", seq.to_string());
    }
    RawEventStream::new(request.send().await.expect("events request"))
}

/// Appends a one-chunk update and returns its seq.
/// Waits until `n` readers are subscribed to `session`'s log.
async fn until_subscribed(session: &Session, n: usize) {
    within(&format!("{n} readers subscribed"), async {
        while session.log.n_subscribers() < n {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

fn append(session: &Session, i: u64) -> u64 {
    session.log.append(None, filler(i, 1)).expect("append").seq
}

#[tokio::test]
async fn an_idle_stream_sends_heartbeat_comments_and_events_keep_their_ids() {
    let (gw, token, id, session) = with_session(args_with_heartbeat_ms(HEARTBEAT_MS)).await;
    append(&session, 1);
    let mut stream = raw_events(&gw, &token, &id, None).await;
    let mut ids = vec![stream.event("stored event 1").await.0.id];
    stream.heartbeat("a heartbeat on the idle stream").await;
    stream
        .heartbeat("a second heartbeat on the idle stream")
        .await;
    for i in 2..=4 {
        append(&session, i);
        let (event, _) = stream
            .event(&format!("live event {i} after heartbeats"))
            .await;
        assert_eq!(event.event, "update");
        assert_eq!(event.data["seq"], i, "data's seq of event {i}");
        assert_eq!(
            event.data["update"]["n"], i,
            "event {i} is the one appended"
        );
        ids.push(event.id);
        stream
            .heartbeat(&format!("a heartbeat after event {i}"))
            .await;
    }
    assert_eq!(
        ids,
        [Some(1), Some(2), Some(3), Some(4)],
        "ids strictly +1 across heartbeats"
    );
    gw.stop().await;
}

#[tokio::test]
async fn last_event_id_resume_after_heartbeats_continues_with_the_next_event() {
    let (gw, token, id, session) = with_session(args_with_heartbeat_ms(HEARTBEAT_MS)).await;
    for i in 1..=3 {
        append(&session, i);
    }
    let mut stream = raw_events(&gw, &token, &id, None).await;
    // The client's last id comes from events only: heartbeats carry none.
    let mut last_event_id = None;
    for i in 1..=3 {
        last_event_id = stream.event(&format!("stored event {i}")).await.0.id;
    }
    stream
        .heartbeat("a heartbeat after the stored events")
        .await;
    stream.heartbeat("a second heartbeat").await;
    drop(stream);
    assert_eq!(last_event_id, Some(3));

    // Events written while the client is away, then the resume.
    append(&session, 4);
    append(&session, 5);
    let mut resumed = raw_events(&gw, &token, &id, last_event_id).await;
    let (first, _) = resumed.event("the first event after resuming").await;
    assert_eq!(
        first.id,
        Some(4),
        "the resume starts right after the last event"
    );
    let (second, _) = resumed.event("the second event after resuming").await;
    assert_eq!(second.id, Some(5));
    resumed.heartbeat("a heartbeat on the resumed stream").await;
    append(&session, 6);
    let (live, _) = resumed.event("the live event after resuming").await;
    assert_eq!(live.id, Some(6), "live events follow the resumed ones");
    gw.stop().await;
}

#[tokio::test]
async fn heartbeats_do_not_count_towards_a_readers_queue() {
    // A short interval so more heartbeats than the queue holds pass quickly.
    let (gw, token, id, session) = with_session(args_with_heartbeat_ms(2)).await;
    let mut idle = raw_events(&gw, &token, &id, None).await;
    let mut clock = raw_events(&gw, &token, &id, None).await;
    until_subscribed(&session, 2).await;

    // The second stream's heartbeats are the clock: while it receives more than a queue's worth,
    // the first one is not read at all.
    for n in 0..=SUBSCRIBER_QUEUE_MAX {
        clock
            .heartbeat(&format!("heartbeat {n} of the clock stream"))
            .await;
    }
    append(&session, 1);
    assert_eq!(
        session.log.n_subscribers(),
        2,
        "the reader that read nothing is still subscribed"
    );
    let (first, n_heartbeats) = idle.event("event 1 on the unread stream").await;
    assert_eq!(first.id, Some(1));
    assert!(
        n_heartbeats > 0,
        "the unread stream got heartbeats before its event"
    );
    append(&session, 2);
    let (second, _) = idle.event("event 2 on the unread stream").await;
    assert_eq!(
        second.id,
        Some(2),
        "the stream goes on after its heartbeats"
    );
    gw.stop().await;
}

#[tokio::test]
async fn last_event_id_header_wins_over_a_bad_after_query() {
    let (gw, token, id, session) = with_session(args_without_agent).await;
    for i in 1..=3 {
        append(&session, i);
    }
    // A browser's EventSource reconnects to the URL it was given, `?after=` and all, and adds
    // its last id: the header decides, whatever the query says.
    for after in ["abc", "1", "999"] {
        let response = gw
            .request(
                reqwest::Method::GET,
                &token,
                &format!("/sessions/{id}/events?after={after}"),
            )
            .header("Last-Event-ID", "2")
            .send()
            .await
            .expect("events request");
        assert_eq!(response.status(), 200, "after={after}");
        let mut stream = EventStream::new(response);
        let next = stream.next("the event after seq 2").await.expect("event");
        assert_eq!(next.id, Some(3), "after={after}");
    }
    // Without the header a bad `after` is still refused.
    let response = gw
        .get(&token, &format!("/sessions/{id}/events?after=abc"))
        .await;
    assert_eq!(response.status(), 400);
    let body: serde_json::Value = response.json().await.expect("error body");
    assert_eq!(body["code"], "INVALID_REQUEST_BODY", "{body}");
    gw.stop().await;
}
