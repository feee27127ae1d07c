//! Wire types of the OpenSandbox-compatible execd API (`execd-compat.md`): command and bash
//! session requests, the one-JSON-object-per-line stream events, command status, file metadata
//! and system metrics. Field names are OpenSandbox's, so SDK 1.1.1 parses them unchanged.
//!
//! Unknown request fields are ignored (serde's default), optional response fields are omitted
//! when empty. Times are carried as RFC 3339 strings; this crate does not format them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `POST /command`. Exactly one of `command` (shell text) and `argv` (exec without a shell).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunCommandRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default)]
    pub background: bool,
    /// Milliseconds; must be at least 1 when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envs: Option<BTreeMap<String, String>>,
}

/// The kinds of stream events Warren sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventType {
    Init,
    Ping,
    Stdout,
    Stderr,
    ExecutionComplete,
    Error,
}

/// One event of a command or session stream, written as one compact JSON line plus a blank line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerEvent {
    #[serde(rename = "type")]
    pub kind: EventType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_count: Option<u64>,
    /// Milliseconds the command ran (`execution_complete` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_time: Option<u64>,
    /// Unix milliseconds. Always present: the SDK drops events without it.
    pub timestamp: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub results: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<EventError>,
}

impl ServerEvent {
    pub fn new(kind: EventType, timestamp: i64) -> Self {
        Self {
            kind,
            text: None,
            execution_count: None,
            execution_time: None,
            timestamp,
            results: None,
            error: None,
        }
    }

    pub fn with_text(mut self, text: impl Into<String>) -> Self {
        self.text = Some(text.into());
        self
    }
}

/// The `error` of an `error` event. For a failed command `evalue` is the exit code as a decimal
/// string (`"-1"` after a signal or timeout).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventError {
    pub ename: String,
    pub evalue: String,
    #[serde(default)]
    pub traceback: Vec<String>,
}

/// `GET /command/status/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandStatus {
    pub id: String,
    /// The command text (argv joined by spaces for argv requests).
    pub content: String,
    pub running: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub started_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
}

/// `POST /session` (the body is optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateSessionRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// `POST /session` answer (status 200).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateSessionResponse {
    pub session_id: String,
}

/// `POST /session/{id}/run`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunInSessionRequest {
    pub command: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Milliseconds; absent or 0 means no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

/// What a path names, as seen by `lstat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileType {
    File,
    Directory,
    Symlink,
    Other,
}

/// Metadata of one path (`/files/info`, `/files/search`, `/directories/list`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileInfo {
    pub path: String,
    #[serde(rename = "type")]
    pub file_type: FileType,
    pub size: u64,
    pub modified_at: String,
    pub created_at: String,
    pub owner: String,
    pub group: String,
    /// Permission bits written as octal digits in a decimal number (`0o755` is `755`).
    pub mode: u32,
}

/// Ownership and mode to apply (`/files/permissions`, `/directories`, upload metadata).
/// `mode` uses octal digits in a decimal number; absent or 0 leaves the mode alone.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Permission {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
}

/// One `POST /files/mv` item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenameItem {
    pub src: String,
    pub dest: String,
}

/// One `POST /files/replace` item: replace every `old` with `new`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplaceItem {
    pub old: String,
    pub new: String,
}

/// Per-file answer of `POST /files/replace?verbose=true`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplaceResult {
    #[serde(rename = "replacedCount")]
    pub replaced_count: u64,
}

/// The `metadata` part of a `POST /files/upload` pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileMetadata {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
}

/// `GET /metrics` and each line of `GET /metrics/watch`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    pub cpu_count: f64,
    pub cpu_used_pct: f64,
    pub mem_total_mib: f64,
    pub mem_used_mib: f64,
    /// Unix milliseconds.
    pub timestamp: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_omit_empty_fields_and_always_carry_a_timestamp() {
        let event = ServerEvent::new(EventType::ExecutionComplete, 7);
        let json = serde_json::to_string(&ServerEvent {
            execution_time: Some(3),
            ..event
        })
        .expect("serializes");
        assert_eq!(
            json,
            r#"{"type":"execution_complete","execution_time":3,"timestamp":7}"#
        );
    }

    #[test]
    fn run_command_request_ignores_unknown_fields_and_accepts_argv() {
        let request: RunCommandRequest =
            serde_json::from_str(r#"{"argv":["echo","hi"],"extra":1}"#).expect("parses");
        assert_eq!(request.argv, Some(vec!["echo".into(), "hi".into()]));
        assert!(!request.background);
    }
}
