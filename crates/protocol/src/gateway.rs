//! Wire types for the gateway API (`docs/gateway.md`): device registration, sessions,
//! messages, permission answers and the events of a session's stream.
//!
//! An [`Event`] is what one line of `events.jsonl` holds and what one SSE `data:` carries:
//! `{"seq", "ts", "type", "turn"?, ...}` with the type-specific fields flattened in. ACP payloads
//! (`update`, `tool_call`, `options`) stay `serde_json::Value` so they pass through unchanged.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `POST /v1/devices` body (sent with the `X-App-Key` header).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RegisterDevice {
    /// 8 to 128 characters of `[A-Za-z0-9_-]`, chosen by the device.
    #[schema(pattern = "^[A-Za-z0-9_-]{8,128}$", example = "my-phone-01")]
    pub device_id: String,
    /// A pairing code another device of the owner minted (`POST /v1/devices/pair`), instead of
    /// the app key: the device joins that owner and drives the same sessions. Case, blanks and
    /// the dash do not matter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "ABCD-EFGH")]
    pub pair_code: Option<String>,
}

/// `201` answer to `POST /v1/devices/pair`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PairCode {
    /// 8 characters of `ABCDEFGHJKMNPQRSTWXYZ23456789`, shown `ABCD-EFGH`.
    #[schema(example = "ABCD-EFGH")]
    pub code: String,
    /// The console's pairing link on the host this request was made to (`…/#/pair/ABCD-EFGH`).
    pub url: String,
    /// RFC 3339; the code is good once, until then.
    pub expires_at: String,
    /// `url` as a QR code, an SVG document.
    pub qr_svg: String,
}

/// One device of the caller's owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OwnedDevice {
    pub device_id: String,
    /// Whether this is the device asking.
    pub current: bool,
    pub created_at: String,
    pub last_used_at: Option<String>,
    /// Whether its token works (not expired, not reset by an admin).
    pub signed_in: bool,
    /// How many push subscriptions it has.
    pub push_subscriptions: usize,
}

/// `GET /v1/devices`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OwnedDevices {
    pub devices: Vec<OwnedDevice>,
}

/// `201` answer to [`RegisterDevice`]: the device token is shown exactly once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DeviceRegistered {
    pub device_id: String,
    pub token: String,
}

/// One device as the admin routes list it (never any token material).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DeviceInfo {
    pub device_id: String,
    pub created_at: String,
    /// Whether the device holds a token that is neither revoked nor expired.
    pub bound: bool,
    pub last_used_at: Option<String>,
    pub n_sessions: usize,
}

/// `POST /v1/sessions` body; the body may also be empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CreateSession {
    /// At most 200 characters.
    #[serde(default)]
    #[schema(max_length = 200)]
    pub title: Option<String>,
}

/// `PATCH /v1/sessions/{id}` body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RenameSession {
    /// 1 to 200 characters once blanks around it are trimmed.
    #[schema(min_length = 1, max_length = 200, pattern = "\\S")]
    pub title: String,
}

/// A session as `GET /v1/sessions[/{id}]` and `POST /v1/sessions` answer it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SessionInfo {
    pub id: String,
    pub title: String,
    pub created_at: String,
    /// `idle` or `running` (a turn is in progress).
    pub status: String,
    /// The number of the last turn (0 before the first message).
    pub turn: u64,
    /// The seq of the last event of the session's stream (0 when empty).
    pub last_seq: u64,
    /// Brain state: `none`, `warm` (a pool worker, no ACP session yet) or `ready`.
    pub brain: String,
    /// Hands state: `none` (not created yet), `starting`, `running`, `paused`, `archived`,
    /// `restoring` or `lost` (hands.md).
    pub hands: String,
    /// How the hands are confined: `bwrap`, `none` (unconfined, said loudly) or `remote`.
    pub isolation: String,
    /// Where the agent process runs: `hands` (inside the sandbox) or `host`.
    pub brain_placement: String,
    /// Model tokens the session's agent used through the model proxy, all turns together.
    pub usage: UsageTotals,
    /// The hands' network (network.md): `private` (a namespace of their own, egress through the
    /// session's proxy), `none` (loopback only), `host` (the host's network, shared with every
    /// other session: said loudly) or `remote` (whatever the remote hands' host gives).
    pub network: String,
}

/// One model request through the gateway's model proxy, as the provider reported it in its
/// streamed answer (agents.md); the `usage` event.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ModelUsage {
    /// `anthropic`, `openai` or `gemini`.
    pub provider: String,
    /// The model the request named (or the answer reported).
    pub model: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    /// Milliseconds from the request to the first byte of the answer's body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ms_to_first_token: Option<u64>,
    pub ms_total: u64,
    /// The upstream's HTTP status (or the proxy's own, e.g. 429 over budget).
    pub status: u16,
}

/// Token totals over model requests: a turn's (`turn_end.usage`) or a session's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UsageTotals {
    pub requests: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
}

impl UsageTotals {
    /// Adds one request's counts.
    pub fn add(&mut self, usage: &ModelUsage) {
        self.requests += 1;
        self.input_tokens += usage.input_tokens;
        self.output_tokens += usage.output_tokens;
        self.cache_read_tokens += usage.cache_read_tokens;
        self.cache_write_tokens += usage.cache_write_tokens;
    }

    /// The tokens a budget counts: everything read and written, cached or not.
    pub fn tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens + self.cache_read_tokens + self.cache_write_tokens
    }
}

/// `GET /v1/sessions` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SessionList {
    pub sessions: Vec<SessionInfo>,
}

/// `POST /v1/sessions/{id}/messages` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PostMessage {
    /// Something to say: not only blanks.
    #[schema(pattern = "\\S")]
    pub text: String,
}

/// `202` answer to [`PostMessage`]: the number of the turn it started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MessageAccepted {
    pub turn: u64,
}

/// `POST /v1/sessions/{id}/permissions/{request_id}` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PermissionAnswer {
    pub option_id: String,
}

/// One entry of a session's event stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Event {
    pub seq: u64,
    /// RFC 3339 time the gateway appended the event.
    pub ts: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<u64>,
    #[serde(flatten)]
    pub body: EventBody,
}

/// The type-specific part of an [`Event`]; `type` is the SSE `event:` name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventBody {
    UserMessage {
        text: String,
    },
    TurnStart {},
    /// An ACP `session/update` notification's `update`, unchanged.
    Update {
        update: Value,
    },
    PermissionRequest {
        request_id: String,
        tool_call: Value,
        options: Value,
    },
    PermissionResolved {
        request_id: String,
        /// `selected`, `cancelled` or (an egress request no one answered in time) `timed_out`.
        outcome: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        option_id: Option<String>,
    },
    /// `stop_reason` is ACP's (`end_turn`, `cancelled`, ...) or `interrupted` / `error`.
    TurnEnd {
        stop_reason: String,
        /// The model tokens the turn used through the model proxy (absent when none).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<UsageTotals>,
    },
    /// One model request through the model proxy.
    Usage(ModelUsage),
    /// Brain or hands state change (`starting`, `ready`, `idle`, `paused`, `archived`,
    /// `restored`, `reset`).
    Status {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        brain: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hands: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// Workspace files changed (through the files API or by the agent's commands): at most
    /// 100 workspace-relative paths, `truncated` when more changed since the last one.
    FilesChanged {
        paths: Vec<String>,
        #[serde(default)]
        truncated: bool,
    },
    /// A sandbox lifecycle transition (hands.md): `state` is the state entered (`starting`,
    /// `running`, `paused`, `archived`, `restoring`, `restored`, `lost`, `stopped`), with how long
    /// the transition took and, where it applies, the other fields.
    Hands {
        state: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        elapsed_ms: Option<u64>,
        /// `bwrap`, `none` or `remote`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        isolation: Option<String>,
        /// True when processes and shell state were reset (new hands on kept or restored files).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reset: Option<bool>,
        /// When the snapshot the files come from (or the one just taken) was taken.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        snapshot_at: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        snapshot_bytes: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    Error {
        code: String,
        message: String,
    },
    /// A checkpoint of the workspace (and the agent's home) was stored (checkpoints.md):
    /// after a turn that used the hands (`reason` `turn`), before a rewind (`rewind`), or a
    /// fork's first (`fork`), before a pause (`pause`), after a change through the files API
    /// (`files`); the event's `turn` is the turn it follows.
    Checkpoint {
        id: String,
        reason: String,
        files_changed: u64,
        bytes_new: u64,
        elapsed_ms: u64,
        /// Files that changed while they were read: each is stored as one read saw it, which
        /// may be a moment between two writes (absent when none).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        changed_under: Vec<String>,
    },
    /// The first event of a session forked from another's checkpoint.
    Forked {
        source_session: String,
        checkpoint: String,
    },
    /// The workspace was rewound to a checkpoint; `saved` is the checkpoint of what it held
    /// just before.
    Rewound {
        checkpoint: String,
        saved: String,
        restart: bool,
    },
    /// A command in the hands wants to reach a host no egress rule covers (network.md
    /// "Asking"); the connection waits for the answer (`POST .../permissions/{request_id}`
    /// with one of `options`), closed by `permission_resolved` (`selected`, or `timed_out`:
    /// refused).
    EgressRequest {
        request_id: String,
        host: String,
        port: u16,
        /// `allow_once`, `allow_session`, `deny`.
        options: Vec<String>,
    },
    /// A destination of the hands' egress: its first use in a turn (`decision`, `rule`), or
    /// what its connections carried (`bytes_up`, `bytes_down`, `connections`), at most once a
    /// second per host.
    Egress {
        host: String,
        port: u16,
        /// `allowed` or `refused`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        decision: Option<String>,
        /// The rule that decided (`policy registries`, `allow github.com`, `deny *.x.com`, ...).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rule: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bytes_up: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bytes_down: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        connections: Option<u64>,
    },
    /// A request from the hands that carried a credential, set by the egress proxy (never its
    /// value): which credential, where, and the upstream's answer.
    CredentialUsed {
        name: String,
        host: String,
        method: String,
        /// The request's path without its query.
        path: String,
        status: u16,
    },
    /// Sent on a stream (never stored) when events after `after` up to `next_seq - 1` are no
    /// longer available.
    Gap {
        after: u64,
        next_seq: u64,
    },
}

impl EventBody {
    /// The `type` tag, used as the SSE `event:` name.
    pub fn kind(&self) -> &'static str {
        match self {
            EventBody::UserMessage { .. } => "user_message",
            EventBody::TurnStart {} => "turn_start",
            EventBody::Update { .. } => "update",
            EventBody::PermissionRequest { .. } => "permission_request",
            EventBody::PermissionResolved { .. } => "permission_resolved",
            EventBody::TurnEnd { .. } => "turn_end",
            EventBody::Usage(_) => "usage",
            EventBody::Status { .. } => "status",
            EventBody::FilesChanged { .. } => "files_changed",
            EventBody::Hands { .. } => "hands",
            EventBody::Error { .. } => "error",
            EventBody::Checkpoint { .. } => "checkpoint",
            EventBody::Forked { .. } => "forked",
            EventBody::Rewound { .. } => "rewound",
            EventBody::EgressRequest { .. } => "egress_request",
            EventBody::Egress { .. } => "egress",
            EventBody::CredentialUsed { .. } => "credential_used",
            EventBody::Gap { .. } => "gap",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_serializes_flat_with_type_tag() {
        let event = Event {
            seq: 3,
            ts: "2026-01-01T00:00:00Z".into(),
            turn: Some(1),
            body: EventBody::TurnEnd {
                stop_reason: "end_turn".into(),
                usage: None,
            },
        };
        let json = serde_json::to_value(&event).expect("event serializes");
        assert_eq!(
            json,
            serde_json::json!({"seq": 3, "ts": "2026-01-01T00:00:00Z", "turn": 1,
                "type": "turn_end", "stop_reason": "end_turn"})
        );
        let back: Event = serde_json::from_value(json).expect("event parses");
        assert_eq!(back, event);
    }

    #[test]
    fn kind_matches_serialized_type() {
        let bodies = [
            EventBody::TurnStart {},
            EventBody::Update {
                update: serde_json::json!({"sessionUpdate": "x"}),
            },
            EventBody::Gap {
                after: 1,
                next_seq: 5,
            },
            EventBody::Usage(ModelUsage::default()),
        ];
        for body in bodies {
            let json = serde_json::to_value(&body).expect("body serializes");
            assert_eq!(json["type"], body.kind());
        }
    }
}
