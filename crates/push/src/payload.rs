//! What a push says, and which events make one (phone.md "Push").
//!
//! [`Payload`] is the JSON the service worker decrypts: the session, its title, the event's
//! kind, a sentence, the console URL to open (`/#/s/{id}`, or `/#/s/{id}/r/{request_id}` for a
//! question), the answers it offers and, for a question, its `request` id (what an answer is
//! posted to, and the notification's tag). [`payload_for`] says which events are pushed: a
//! `permission_request` and an `egress_request` (with their options as actions), a `turn_end`
//! whose turn ran longer than `--push-after` ([`TurnStarts`] times turns from their
//! `turn_start`), and `hands` entering `lost`. A payload carries only what the event shows the
//! person anyway, cut to fit a push message (4096 bytes once encrypted).

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use warren_protocol::gateway::{Event, EventBody};

/// The most bytes of JSON a push carries: 4096 less the `aes128gcm` header (86 bytes with a
/// P-256 key id), the padding delimiter and the tag (17 bytes).
pub const PAYLOAD_MAX_BYTES: usize = 4096 - 86 - 17;
/// The longest `title` and `text`, and an action's title, in characters.
const TITLE_MAX_CHARS: usize = 200;
const TEXT_MAX_CHARS: usize = 1000;
const ACTION_TITLE_MAX_CHARS: usize = 64;
/// The most actions a push offers (browsers show two or three).
const ACTIONS_MAX: usize = 4;
/// An option whose id is longer than this is not offered as an action (an id cannot be cut).
const ACTION_ID_MAX_CHARS: usize = 128;
/// How long a push service keeps a question, and anything else, for a browser that is away.
const REQUEST_TTL_SECONDS: u64 = 60;
const TTL_SECONDS: u64 = 3600;

/// The decrypted body of one push.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payload {
    /// The session's id.
    pub session: String,
    /// The session's title.
    pub title: String,
    /// What happened: `permission_request`, `egress_request`, `turn_end` or `hands_lost`.
    pub kind: String,
    /// One sentence for the notification's body.
    pub text: String,
    /// Where the console opens: `/#/s/{id}`, or `/#/s/{id}/r/{request_id}` for a question.
    pub url: String,
    /// The answers a question offers, as notification actions.
    pub actions: Vec<Action>,
    /// The question's `request_id` (`POST /v1/sessions/{session}/permissions/{request}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
}

/// An answer offered with a push: `id` is the `option_id` to post, `title` its label.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Action {
    pub id: String,
    pub title: String,
}

impl Payload {
    /// Whether the push asks the person something (then it is urgent and short-lived).
    pub fn is_request(&self) -> bool {
        matches!(self.kind.as_str(), "permission_request" | "egress_request")
    }

    /// The push's `TTL` (seconds a push service keeps it for a browser that is away).
    pub fn ttl_seconds(&self) -> u64 {
        if self.is_request() {
            REQUEST_TTL_SECONDS
        } else {
            TTL_SECONDS
        }
    }

    /// The push's `Urgency` (RFC 8030 section 5.3).
    pub fn urgency(&self) -> &'static str {
        if self.is_request() { "high" } else { "normal" }
    }

    /// The payload as JSON, cut until it fits [`PAYLOAD_MAX_BYTES`]: the text first, then the
    /// actions, then the title.
    pub fn to_json(&self) -> Vec<u8> {
        let mut payload = self.clone();
        loop {
            let json = serde_json::to_vec(&payload).expect("a payload (strings) serializes");
            if json.len() <= PAYLOAD_MAX_BYTES {
                return json;
            }
            let excess = json.len() - PAYLOAD_MAX_BYTES;
            if payload.text.chars().count() > 20 {
                payload.text = cut(&payload.text, payload.text.chars().count() / 2);
            } else if payload.actions.pop().is_some() {
            } else if payload.title.chars().count() > 20 {
                payload.title = cut(&payload.title, payload.title.chars().count() / 2);
            } else {
                // Only the ids are left (the gateway's, short): nothing fits with less.
                tracing::warn!(excess, "a push payload is over the size a push takes");
                payload.text.clear();
                payload.title.clear();
                return serde_json::to_vec(&payload).expect("a payload serializes");
            }
        }
    }
}

/// `text` to at most `max_chars` characters, with `…` when cut.
fn cut(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text.to_owned();
    }
    let mut kept: String = text.chars().take(max_chars.saturating_sub(1)).collect();
    kept.push('…');
    kept
}

/// When each session's running turn started, from its `turn_start` events, so its `turn_end`
/// tells how long the turn ran.
#[derive(Debug, Default)]
pub struct TurnStarts {
    by_session: HashMap<String, (Option<u64>, chrono::DateTime<chrono::FixedOffset>)>,
}

impl TurnStarts {
    /// Follows one event of `session`: notes a `turn_start`; for a `turn_end`, how long its turn
    /// ran (`None` when its start was not seen, or the times do not parse).
    pub fn follow(&mut self, session: &str, event: &Event) -> Option<Duration> {
        let at = chrono::DateTime::parse_from_rfc3339(&event.ts).ok();
        match &event.body {
            EventBody::TurnStart {} => {
                if let Some(at) = at {
                    self.by_session.insert(session.to_owned(), (event.turn, at));
                }
                None
            }
            EventBody::TurnEnd { .. } => {
                let (turn, started) = self.by_session.remove(session)?;
                if turn != event.turn {
                    return None;
                }
                (at? - started).to_std().ok()
            }
            _ => None,
        }
    }

    /// Forgets a session that is gone.
    pub fn forget(&mut self, session: &str) {
        self.by_session.remove(session);
    }
}

/// The push an event of `session` (titled `title`) makes, if any; `turn_ran` is how long the
/// turn a `turn_end` closes ran (from [`TurnStarts::follow`]), pushed when over `push_after`.
pub fn payload_for(
    session: &str,
    title: &str,
    event: &Event,
    turn_ran: Option<Duration>,
    push_after: Duration,
) -> Option<Payload> {
    let session_url = format!("/#/s/{}", url_segment(session));
    let (kind, text, request, actions) = match &event.body {
        EventBody::PermissionRequest {
            request_id,
            tool_call,
            options,
        } => {
            let asked = tool_call
                .get("title")
                .and_then(Value::as_str)
                .filter(|title| !title.trim().is_empty())
                .unwrap_or("a tool");
            // As the console says it: a command is run, another tool used.
            let verb = match tool_call.get("kind").and_then(Value::as_str) {
                None | Some("execute") => "run",
                Some(_) => "use",
            };
            let text = format!("The agent asks to {verb}: {asked}");
            let actions = permission_actions(options);
            (event.body.kind(), text, Some(request_id), actions)
        }
        EventBody::EgressRequest {
            request_id,
            host,
            port,
            options,
        } => {
            let text = format!("The sandbox wants to reach {}", host_port(host, *port));
            let actions = options
                .iter()
                .map(|option| Action {
                    id: option.clone(),
                    title: egress_option_title(option).to_owned(),
                })
                .collect();
            (event.body.kind(), text, Some(request_id), actions)
        }
        EventBody::TurnEnd { stop_reason, .. } => {
            let ran = turn_ran.filter(|ran| *ran > push_after)?;
            let text = turn_end_text(stop_reason, ran);
            (event.body.kind(), text, None, Vec::new())
        }
        EventBody::Hands { state, error, .. } if state == "lost" => {
            let text = match error {
                Some(error) => format!("The sandbox was lost: {error}"),
                None => "The sandbox was lost; the next use starts it again on the same \
                         workspace."
                    .to_owned(),
            };
            ("hands_lost", text, None, Vec::new())
        }
        _ => return None,
    };
    let url = match request {
        Some(request_id) => format!("{session_url}/r/{}", url_segment(request_id)),
        None => session_url,
    };
    let mut actions: Vec<Action> = actions;
    actions.retain(|action| action.id.chars().count() <= ACTION_ID_MAX_CHARS);
    actions.truncate(ACTIONS_MAX);
    for action in &mut actions {
        action.title = cut(&action.title, ACTION_TITLE_MAX_CHARS);
    }
    Some(Payload {
        session: session.to_owned(),
        title: cut(title, TITLE_MAX_CHARS),
        kind: kind.to_owned(),
        text: cut(&text, TEXT_MAX_CHARS),
        url,
        actions,
        request: request.cloned(),
    })
}

/// An ACP permission request's options (`[{optionId, name, kind}]`) as actions.
fn permission_actions(options: &Value) -> Vec<Action> {
    let Some(options) = options.as_array() else {
        return Vec::new();
    };
    options
        .iter()
        .filter_map(|option| {
            let id = option.get("optionId")?.as_str()?;
            let title = option.get("name").and_then(Value::as_str).unwrap_or(id);
            Some(Action {
                id: id.to_owned(),
                title: title.to_owned(),
            })
        })
        .collect()
}

/// The label of an `egress_request` option, as the console shows it.
fn egress_option_title(option: &str) -> &str {
    match option {
        "allow_once" => "Allow once",
        "allow_session" => "Allow for this session",
        "deny" => "Deny",
        other => other,
    }
}

/// `host:port`, an IPv6 address in brackets.
fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

fn turn_end_text(stop_reason: &str, ran: Duration) -> String {
    let after = human_duration(ran);
    match stop_reason {
        "end_turn" => format!("The agent finished after {after}."),
        "cancelled" => format!("The turn was cancelled after {after}."),
        "interrupted" => format!("The turn was interrupted after {after}."),
        "error" => format!("The turn failed after {after}."),
        other => format!("The turn ended ({other}) after {after}."),
    }
}

/// `42 s`, `3 min`, `2 h 5 min`.
fn human_duration(duration: Duration) -> String {
    let seconds = duration.as_secs();
    match seconds {
        0..60 => format!("{seconds} s"),
        60..3600 => format!("{} min", seconds / 60),
        _ => format!("{} h {} min", seconds / 3600, seconds % 3600 / 60),
    }
}

/// An id as one URL path segment: what is not unreserved is percent-encoded (ids are UUIDs or
/// the agent's request ids, which may hold anything).
fn url_segment(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for byte in id.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const AFTER: Duration = Duration::from_secs(30);

    fn event(turn: Option<u64>, ts: &str, body: Value) -> Event {
        let mut value = body;
        value["seq"] = json!(7);
        value["ts"] = json!(ts);
        if let Some(turn) = turn {
            value["turn"] = json!(turn);
        }
        serde_json::from_value(value).expect("an event")
    }

    fn pushed(body: Value, turn_ran: Option<Duration>) -> Option<Value> {
        let event = event(Some(2), "2026-01-01T00:00:00Z", body);
        payload_for("s-1", "fix the build", &event, turn_ran, AFTER)
            .map(|payload| serde_json::to_value(payload).expect("serializes"))
    }

    /// Table: an event → the payload it makes (or none).
    #[test]
    fn which_events_are_pushed_and_what_they_say() {
        let long = Some(Duration::from_secs(95));
        let cases = [
            (
                json!({"type": "permission_request", "request_id": "r-9",
                       "tool_call": {"title": "rm doomed.txt", "toolCallId": "t1"},
                       "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                                   {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]}),
                None,
                Some(json!({"session": "s-1", "title": "fix the build",
                    "kind": "permission_request", "text": "The agent asks to run: rm doomed.txt",
                    "url": "/#/s/s-1/r/r-9", "request": "r-9",
                    "actions": [{"id": "allow", "title": "Allow"}, {"id": "reject", "title": "Reject"}]})),
            ),
            (
                json!({"type": "permission_request", "request_id": "a/b c",
                       "tool_call": {}, "options": "not a list"}),
                None,
                Some(json!({"session": "s-1", "title": "fix the build",
                    "kind": "permission_request", "text": "The agent asks to run: a tool",
                    "url": "/#/s/s-1/r/a%2Fb%20c", "request": "a/b c", "actions": []})),
            ),
            (
                json!({"type": "permission_request", "request_id": "r-2",
                       "tool_call": {"title": "Write notes.md", "kind": "edit"}, "options": []}),
                None,
                Some(json!({"session": "s-1", "title": "fix the build",
                    "kind": "permission_request", "text": "The agent asks to use: Write notes.md",
                    "url": "/#/s/s-1/r/r-2", "request": "r-2", "actions": []})),
            ),
            (
                json!({"type": "egress_request", "request_id": "e-1", "host": "pypi.org",
                       "port": 443, "options": ["allow_once", "allow_session", "deny"]}),
                None,
                Some(json!({"session": "s-1", "title": "fix the build",
                    "kind": "egress_request", "text": "The sandbox wants to reach pypi.org:443",
                    "url": "/#/s/s-1/r/e-1", "request": "e-1",
                    "actions": [{"id": "allow_once", "title": "Allow once"},
                                {"id": "allow_session", "title": "Allow for this session"},
                                {"id": "deny", "title": "Deny"}]})),
            ),
            (
                json!({"type": "egress_request", "request_id": "e-2", "host": "2001:db8::1",
                       "port": 8080, "options": ["deny"]}),
                None,
                Some(json!({"session": "s-1", "title": "fix the build",
                    "kind": "egress_request", "text": "The sandbox wants to reach [2001:db8::1]:8080",
                    "url": "/#/s/s-1/r/e-2", "request": "e-2", "actions": [{"id": "deny", "title": "Deny"}]})),
            ),
            (
                json!({"type": "turn_end", "stop_reason": "end_turn"}),
                long,
                Some(
                    json!({"session": "s-1", "title": "fix the build", "kind": "turn_end",
                    "text": "The agent finished after 1 min.", "url": "/#/s/s-1", "actions": []}),
                ),
            ),
            (
                json!({"type": "turn_end", "stop_reason": "cancelled"}),
                Some(Duration::from_secs(31)),
                Some(
                    json!({"session": "s-1", "title": "fix the build", "kind": "turn_end",
                    "text": "The turn was cancelled after 31 s.", "url": "/#/s/s-1", "actions": []}),
                ),
            ),
            (
                json!({"type": "turn_end", "stop_reason": "end_turn"}),
                Some(AFTER),
                None,
            ),
            (
                json!({"type": "turn_end", "stop_reason": "end_turn"}),
                None,
                None,
            ),
            (
                json!({"type": "hands", "state": "lost", "error": "the sandbox hit its process limit"}),
                None,
                Some(
                    json!({"session": "s-1", "title": "fix the build", "kind": "hands_lost",
                    "text": "The sandbox was lost: the sandbox hit its process limit",
                    "url": "/#/s/s-1", "actions": []}),
                ),
            ),
            (json!({"type": "hands", "state": "paused"}), None, None),
            (json!({"type": "turn_start"}), None, None),
            (json!({"type": "user_message", "text": "hi"}), None, None),
            (
                json!({"type": "permission_resolved", "request_id": "r-9", "outcome": "selected"}),
                None,
                None,
            ),
            (
                json!({"type": "error", "code": "X", "message": "y"}),
                None,
                None,
            ),
        ];
        for (body, turn_ran, expected) in cases {
            assert_eq!(pushed(body.clone(), turn_ran), expected, "{body}");
        }
    }

    #[test]
    fn requests_are_urgent_and_short_lived_the_rest_normal_for_an_hour() {
        let request = pushed(
            json!({"type": "egress_request", "request_id": "e", "host": "h", "port": 1, "options": []}),
            None,
        )
        .expect("pushed");
        let request: Payload = serde_json::from_value(request).expect("a payload");
        assert_eq!((request.ttl_seconds(), request.urgency()), (60, "high"));
        let lost = pushed(json!({"type": "hands", "state": "lost"}), None).expect("pushed");
        let lost: Payload = serde_json::from_value(lost).expect("a payload");
        assert_eq!((lost.ttl_seconds(), lost.urgency()), (3600, "normal"));
    }

    #[test]
    fn turns_are_timed_from_their_own_start() {
        let mut starts = TurnStarts::default();
        let start = event(
            Some(3),
            "2026-01-01T00:00:00.000Z",
            json!({"type": "turn_start"}),
        );
        let end = |turn, ts| {
            event(
                Some(turn),
                ts,
                json!({"type": "turn_end", "stop_reason": "end_turn"}),
            )
        };
        assert_eq!(starts.follow("s", &start), None);
        assert_eq!(
            starts.follow("s", &end(3, "2026-01-01T00:00:42.500Z")),
            Some(Duration::from_millis(42_500))
        );
        assert_eq!(
            starts.follow("s", &end(3, "2026-01-01T00:01:00Z")),
            None,
            "a turn ends once"
        );
        starts.follow("s", &start);
        assert_eq!(
            starts.follow("s", &end(4, "2026-01-01T00:01:00Z")),
            None,
            "another turn's end"
        );
        starts.follow("s", &start);
        starts.forget("s");
        assert_eq!(starts.follow("s", &end(3, "2026-01-01T00:01:00Z")), None);
        assert_eq!(
            starts.follow("other", &end(3, "2026-01-01T00:01:00Z")),
            None,
            "a start never seen"
        );
    }

    #[test]
    fn a_payload_always_fits_a_push_message() {
        let huge = "x".repeat(20_000);
        let mut options: Vec<Value> = (0..50)
            .map(|n| json!({"optionId": format!("o{n}"), "name": huge}))
            .collect();
        options.insert(
            0,
            json!({"optionId": huge, "name": "an id too long to answer with"}),
        );
        let event = event(
            Some(1),
            "2026-01-01T00:00:00Z",
            json!({"type": "permission_request", "request_id": "perm-1",
                   "tool_call": {"title": huge}, "options": options}),
        );
        let payload = payload_for("s-1", &huge, &event, None, AFTER).expect("pushed");
        assert_eq!(payload.actions.len(), ACTIONS_MAX);
        assert_eq!(
            payload.actions[0].id, "o0",
            "an option too long to answer is left out"
        );
        assert!(payload.title.chars().count() <= TITLE_MAX_CHARS);
        let json = payload.to_json();
        assert!(json.len() <= PAYLOAD_MAX_BYTES, "{} bytes", json.len());
        let back: Payload = serde_json::from_slice(&json).expect("still a payload");
        assert_eq!(back.session, "s-1");
        let small = payload_for(
            "s-1",
            "t",
            &self::event(
                Some(1),
                "2026-01-01T00:00:00Z",
                json!({"type": "hands", "state": "lost"}),
            ),
            None,
            AFTER,
        )
        .expect("pushed");
        assert_eq!(
            serde_json::from_slice::<Payload>(&small.to_json()).expect("parses"),
            small,
            "a payload that fits is sent whole"
        );
    }
}
