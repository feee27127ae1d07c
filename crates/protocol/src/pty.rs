//! Wire types of interactive PTY sessions (pty-sessions.md): the REST bodies, the JSON text
//! frames in both directions and the binary frame channels.
//!
//! Binary frames are a channel byte followed by raw bytes; replay frames (`0x03`) put an
//! 8-byte big-endian offset between the channel and the bytes. Text frames are JSON objects
//! tagged by `type`. Parsing a client text frame is two-step on purpose: [`ClientFrameKind`]
//! first tells an unknown `type` (answered with `INVALID_FRAME`) from a known one with bad
//! fields, so the server can say which.

use serde::{Deserialize, Serialize};

/// Client → server: stdin bytes.
pub const CHANNEL_STDIN: u8 = 0x00;
/// Server → client: stdout (in PTY mode everything the terminal prints).
pub const CHANNEL_STDOUT: u8 = 0x01;
/// Server → client: stderr (pipe mode only).
pub const CHANNEL_STDERR: u8 = 0x02;
/// Server → client: replay, `offset: u64 BE` then bytes.
pub const CHANNEL_REPLAY: u8 = 0x03;
/// Bytes before the payload of a replay frame: the channel and the offset.
pub const REPLAY_HEADER_LEN: usize = 9;
/// Most payload bytes in one live `0x01`/`0x02` frame.
pub const MAX_LIVE_PAYLOAD: usize = 32 * 1024;

/// WebSocket close code for a holder evicted by a takeover.
pub const CLOSE_TAKEN_OVER: u16 = 4001;
pub const CLOSE_TAKEN_OVER_REASON: &str = "TAKEN_OVER";
/// Close reason after the `exit` frame (code 1000).
pub const CLOSE_EXITED_REASON: &str = "process exited";

/// `POST /pty` body; every field optional and the body itself may be empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePtyRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// **Warren**: variables added to the shell's environment (after the daemon's own minus
    /// Warren's credentials). Names are non-empty, without `=` or NUL; values without NUL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<std::collections::BTreeMap<String, String>>,
}

/// `POST /pty` answer (201).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CreatePtyResponse {
    pub session_id: String,
}

/// `GET /pty/{id}` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PtyStatus {
    pub session_id: String,
    /// A shell process is alive right now.
    pub running: bool,
    /// Output bytes ever produced by the session, across shell restarts.
    pub output_offset: u64,
}

/// How the shell's output reaches the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PtyMode {
    Pty,
    Pipe,
}

/// What a connection may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PtyRole {
    Holder,
    Viewer,
}

/// Only the `type` of a client text frame, read first.
#[derive(Debug, Clone, Deserialize)]
pub struct ClientFrameKind {
    #[serde(rename = "type")]
    pub kind: String,
}

/// Known `type` values of client text frames.
pub const CLIENT_FRAME_TYPES: [&str; 4] = ["stdin", "resize", "signal", "ping"];

/// A client → server text frame with a known `type`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ClientFrame {
    /// Plain UTF-8 stdin, a fallback for binary channel 0.
    Stdin {
        data: String,
    },
    /// New terminal size; applied when both are positive. Wide integers so that a huge or
    /// negative value is told apart from malformed JSON.
    Resize {
        cols: i64,
        rows: i64,
    },
    /// A signal by name (`SIGINT`, `SIGTERM`, `SIGKILL`, `SIGQUIT`, `SIGHUP`).
    Signal {
        signal: String,
    },
    Ping,
}

/// A server → client text frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ServerFrame {
    Connected {
        session_id: String,
        mode: PtyMode,
        role: PtyRole,
    },
    /// The shell exited; `exit_code` is -1 when a signal killed it.
    Exit {
        exit_code: i32,
    },
    Pong,
    Error {
        error: String,
        code: FrameErrorCode,
    },
}

/// `code` of an `error` text frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum FrameErrorCode {
    StartFailed,
    StdinWriteFailed,
    InvalidFrame,
    AlreadyConnected,
    ReadOnly,
}

impl ServerFrame {
    pub fn error(code: FrameErrorCode, error: impl Into<String>) -> Self {
        Self::Error {
            error: error.into(),
            code,
        }
    }

    /// The frame as JSON text. Serialising these plain enums cannot fail.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("server frames always serialise")
    }
}

/// A `0x03` replay frame: channel, offset, bytes.
pub fn encode_replay(offset: u64, bytes: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(REPLAY_HEADER_LEN + bytes.len());
    frame.push(CHANNEL_REPLAY);
    frame.extend_from_slice(&offset.to_be_bytes());
    frame.extend_from_slice(bytes);
    frame
}

/// Splits a `0x03` frame into its offset and bytes; `None` for anything else.
pub fn decode_replay(frame: &[u8]) -> Option<(u64, &[u8])> {
    if frame.len() < REPLAY_HEADER_LEN || frame[0] != CHANNEL_REPLAY {
        return None;
    }
    let offset = u64::from_be_bytes(frame[1..REPLAY_HEADER_LEN].try_into().ok()?);
    Some((offset, &frame[REPLAY_HEADER_LEN..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_have_the_opensandbox_json_shape() {
        let cases = [
            (
                ServerFrame::Connected {
                    session_id: "s".into(),
                    mode: PtyMode::Pipe,
                    role: PtyRole::Viewer,
                },
                r#"{"type":"connected","session_id":"s","mode":"pipe","role":"viewer"}"#,
            ),
            (
                ServerFrame::Exit { exit_code: 0 },
                r#"{"type":"exit","exit_code":0}"#,
            ),
            (ServerFrame::Pong, r#"{"type":"pong"}"#),
            (
                ServerFrame::error(FrameErrorCode::ReadOnly, "x"),
                r#"{"type":"error","error":"x","code":"READ_ONLY"}"#,
            ),
        ];
        for (frame, json) in cases {
            assert_eq!(frame.to_json(), json);
        }
        let parsed: ClientFrame =
            serde_json::from_str(r#"{"type":"resize","cols":120,"rows":40}"#).expect("parses");
        assert_eq!(
            parsed,
            ClientFrame::Resize {
                cols: 120,
                rows: 40
            }
        );
    }

    #[test]
    fn replay_frames_round_trip() {
        let frame = encode_replay(0x0102_0304_0506_0708, b"abc");
        assert_eq!(&frame[..9], &[3, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(
            decode_replay(&frame),
            Some((0x0102_0304_0506_0708, &b"abc"[..]))
        );
        assert_eq!(decode_replay(&[1, 2]), None);
    }
}
