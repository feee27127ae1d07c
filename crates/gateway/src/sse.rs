//! `GET /v1/sessions/{id}/events`: a session's event log as Server-Sent Events.
//!
//! The stream resumes after `Last-Event-ID` (or `?after=`; the header wins, and a query it
//! overrides is not even parsed, see [`resume_after`]): it first sends every stored event
//! with a larger seq, paging through the file when the position is older than the in-memory
//! tail, then switches to a live subscription positioned exactly at the last event sent, so there
//! is no gap and no duplicate. Framing: `id: <seq>`, `event: <type>`, `data: <json>`; after
//! `--sse-heartbeat-ms` of silence (15 s by default) a heartbeat comment `:`. A browser's
//! `EventSource` never sees a comment, so a client that watches the connection asks for
//! `?heartbeat=event` ([`HeartbeatStyle`]): its heartbeats are then events named `heartbeat`,
//! `data: {"type":"heartbeat","interval_ms":N}`, one at once when the stream opens and one after
//! every silence, so it learns the interval and can tell a connection that died quietly (no
//! event nor heartbeat for two intervals). Heartbeats of either kind carry no id and no seq, so a
//! client's `Last-Event-ID` stays on its last event, and they never enter a subscriber's event
//! queue: axum's keep-alive makes one only while that queue is empty. A subscriber dropped
//! for being too slow sees its stream end and resumes from its last id. When the requested
//! position was compacted away a `gap` event comes first.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::http::HeaderValue;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::{Stream, StreamExt};
use warren_protocol::gateway::{Event, EventBody};

use crate::error::GatewayError;
use crate::event_log::{StoredEvent, SubscribeError, Subscription};
use crate::sessions::Session;

/// Events read from the file per page while catching up.
const CATCH_UP_PAGE: usize = 1024;

enum Phase {
    CatchUp,
    Live(Subscription),
}

struct StreamState {
    session: Arc<Session>,
    last_sent: u64,
    pending: VecDeque<Arc<StoredEvent>>,
    phase: Phase,
    gap: Option<(u64, u64)>,
}

/// The seq a stream resumes after: the `Last-Event-ID` header if there is one, else the
/// `after` query parameter, else 0. The header wins outright, so a browser's EventSource that
/// reconnects with its last id to a URL carrying a stale or odd `?after=` still resumes.
pub fn resume_after(
    last_event_id: Option<&HeaderValue>,
    after_query: Option<&str>,
) -> Result<u64, GatewayError> {
    let seq = |text: &str, what: &str| {
        text.trim()
            .parse::<u64>()
            .map_err(|_| GatewayError::InvalidRequest(format!("{what} must be a seq")))
    };
    match (last_event_id, after_query) {
        (Some(header), _) => seq(header.to_str().unwrap_or("-"), "Last-Event-ID"),
        (None, Some(after)) => seq(after, "after"),
        (None, None) => Ok(0),
    }
}

/// How a stream's heartbeats are framed: a comment `:` (the default, which SSE parsers hide), or
/// an event named `heartbeat` a browser's `EventSource` fires (asked with `?heartbeat=event`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeartbeatStyle {
    Comment,
    Event,
}

impl HeartbeatStyle {
    /// The style a request's query asks for: `heartbeat=event` gives events; anything else,
    /// or nothing, comments.
    pub fn from_query<'a>(mut query: impl Iterator<Item = (&'a str, &'a str)>) -> HeartbeatStyle {
        if query.any(|(name, value)| name == "heartbeat" && value == "event") {
            HeartbeatStyle::Event
        } else {
            HeartbeatStyle::Comment
        }
    }
}

/// The heartbeat event of [`HeartbeatStyle::Event`]: named `heartbeat`, no id, and the interval
/// in its data so the client's timeout follows `--sse-heartbeat-ms`.
pub fn heartbeat_event(interval: Duration) -> SseEvent {
    let data = serde_json::json!({
        "type": "heartbeat",
        "interval_ms": u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
    });
    SseEvent::default()
        .event("heartbeat")
        .data(data.to_string())
}

fn to_sse(event: &StoredEvent) -> SseEvent {
    SseEvent::default()
        .id(event.seq.to_string())
        .event(event.kind)
        .data(&*event.json)
}

/// The SSE response for `session`, starting after seq `after`, with a heartbeat after every
/// `heartbeat` of silence (a comment, or for [`HeartbeatStyle::Event`] an event, the first one
/// sent at once).
pub fn stream(
    session: Arc<Session>,
    after: u64,
    heartbeat: Duration,
    style: HeartbeatStyle,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let first = session.log.first_seq();
    let gap = (after.saturating_add(1) < first).then_some((after, first));
    let state = StreamState {
        session,
        last_sent: after,
        pending: VecDeque::new(),
        phase: Phase::CatchUp,
        gap,
    };
    let events = futures_util::stream::unfold(state, |mut state| async move {
        let event = next_event(&mut state).await?;
        Some((Ok(event), state))
    });
    let keep_alive = KeepAlive::new().interval(heartbeat);
    let (first, keep_alive) = match style {
        HeartbeatStyle::Comment => (None, keep_alive),
        HeartbeatStyle::Event => (
            Some(Ok(heartbeat_event(heartbeat))),
            keep_alive.event(heartbeat_event(heartbeat)),
        ),
    };
    let events = futures_util::stream::iter(first).chain(events);
    Sse::new(events).keep_alive(keep_alive)
}

async fn next_event(state: &mut StreamState) -> Option<SseEvent> {
    if let Some((after, next_seq)) = state.gap.take() {
        state.last_sent = next_seq - 1;
        // Shaped like every other event (`seq`, `ts`, `type`), its seq the one before the oldest
        // kept event, so a client that decodes every event the same way decodes this one too.
        let gap = Event {
            seq: state.last_sent,
            ts: warren_store::file::now_rfc3339(),
            turn: None,
            body: EventBody::Gap { after, next_seq },
        };
        let data = serde_json::to_string(&gap).expect("an event always serializes to JSON");
        return Some(
            SseEvent::default()
                .id(state.last_sent.to_string())
                .event(gap.body.kind())
                .data(data),
        );
    }
    loop {
        if let Phase::Live(subscription) = &state.phase
            && subscription.dropped.load(Ordering::Acquire)
        {
            return None;
        }
        if let Some(event) = state.pending.pop_front() {
            if event.seq <= state.last_sent {
                continue;
            }
            state.last_sent = event.seq;
            return Some(to_sse(&event));
        }
        match &mut state.phase {
            Phase::CatchUp => match state.session.log.subscribe(state.last_sent) {
                Ok(subscription) => {
                    state.pending.extend(subscription.backlog.iter().cloned());
                    state.phase = Phase::Live(subscription);
                }
                Err(SubscribeError::Behind) => {
                    let page = state
                        .session
                        .log
                        .read_after(state.last_sent, CATCH_UP_PAGE)
                        .await;
                    match page {
                        Ok(page) if !page.is_empty() => state.pending.extend(page),
                        Ok(_) => return None,
                        Err(e) => {
                            tracing::error!(session = %state.session.id, error = %e, "cannot read events");
                            return None;
                        }
                    }
                }
                Err(SubscribeError::Closed) => return None,
            },
            Phase::Live(subscription) => {
                let event = subscription.live.recv().await?;
                state.pending.push_back(event);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use axum::response::IntoResponse;

    #[test]
    fn heartbeat_events_are_asked_for_by_the_query() {
        let style = |query: &[(&'static str, &'static str)]| {
            HeartbeatStyle::from_query(query.iter().copied())
        };
        assert_eq!(style(&[]), HeartbeatStyle::Comment);
        assert_eq!(style(&[("after", "3")]), HeartbeatStyle::Comment);
        assert_eq!(style(&[("heartbeat", "comment")]), HeartbeatStyle::Comment);
        assert_eq!(
            style(&[("after", "3"), ("heartbeat", "event")]),
            HeartbeatStyle::Event
        );
    }

    #[tokio::test]
    async fn a_heartbeat_event_is_named_has_no_id_and_carries_the_interval() {
        let events = futures_util::stream::iter([Ok::<_, Infallible>(heartbeat_event(
            Duration::from_millis(1500),
        ))]);
        let body = Sse::new(events).into_response().into_body();
        let bytes = axum::body::to_bytes(body, 1 << 16).await.expect("body");
        let text = std::str::from_utf8(&bytes).expect("UTF-8");
        let lines: Vec<&str> = text
            .strip_suffix("\n\n")
            .expect("one block")
            .lines()
            .collect();
        assert_eq!(lines.len(), 2, "{text:?}");
        assert_eq!(lines[0], "event: heartbeat");
        let data: serde_json::Value =
            serde_json::from_str(lines[1].strip_prefix("data: ").expect("data")).expect("JSON");
        assert_eq!(
            data,
            serde_json::json!({"type": "heartbeat", "interval_ms": 1500})
        );
    }

    #[test]
    fn last_event_id_wins_and_either_must_be_a_seq() {
        let header = |text: &'static str| HeaderValue::from_static(text);
        let cases = [
            (Some(header("7")), Some("3"), Some(7)),
            (Some(header("7")), Some("abc"), Some(7)),
            (Some(header(" 7 ")), None, Some(7)),
            (None, Some("3"), Some(3)),
            (None, None, Some(0)),
            (Some(header("abc")), Some("3"), None),
            (Some(header("-1")), None, None),
            (None, Some("abc"), None),
            (None, Some(""), None),
        ];
        for (last_event_id, after, expected) in cases {
            assert_eq!(
                resume_after(last_event_id.as_ref(), after).ok(),
                expected,
                "{last_event_id:?} {after:?}"
            );
        }
    }
}
