//! Wire types for the agent exec tools (`exec_command`, `write_stdin`, `list_sessions`,
//! `kill_session`): the arguments an agent sends, the structured result it gets back, and the
//! session listing. See `docs/exec-tools.md` for the protocol reference.
//!
//! The same types are the HTTP bodies of `/v1/exec` and the MCP tool input schemas, so every
//! argument type derives `schemars::JsonSchema`. Unknown fields are ignored (Codex-trained models
//! send extra fields such as `justification`), but a known field with the wrong JSON type is
//! rejected by serde with an error naming the field. Defaults and clamping are applied by the
//! engine, not here: `None` means "use the default".

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Session ids are small random integers (4-5 digits).
pub type SessionId = u32;

/// `exec_command`: run a command in a new exec session.
#[derive(
    Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
pub struct ExecCommandArgs {
    /// Shell command to run, as `<shell> -lc <cmd>` (`-c` when `login` is false).
    #[schema(min_length = 1, pattern = "\\S")]
    pub cmd: String,
    /// Working directory; must exist. Relative paths resolve against the server's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// Shell to run the command with (default `bash`, else `sh`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<String>,
    /// Run the shell as a login shell (`-l`). Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub login: Option<bool>,
    /// Run on a pseudo-terminal (24x80, output merged, input echoed) instead of pipes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tty: Option<bool>,
    /// How long this call waits before returning (never kills). Default 10000, clamped to
    /// 250..=30000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yield_time_ms: Option<u64>,
    /// The command's lifetime: when it expires the process tree is killed and the exit code
    /// is 124. Default: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Budget for the output shown in this result, estimated as bytes / 4. Default 10000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u64>,
    /// Extra environment variables. Applied to the command but never echoed back or logged.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// `write_stdin`: write to (or just poll) a running session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WriteStdinArgs {
    /// Session id from an earlier result.
    pub session_id: SessionId,
    /// Bytes to write, no newline added; empty means just poll. On pipe sessions `\u0003`
    /// sends SIGINT to the process group and `\u0004` closes stdin.
    #[serde(default)]
    pub chars: String,
    /// How long to wait for output. Writes: default 250, clamped to 250..=30000; empty polls:
    /// clamped to 5000..=300000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yield_time_ms: Option<u64>,
    /// Budget for the output shown in this result. Default 10000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u64>,
}

/// The body of `POST /v1/exec/{session_id}/stdin`: [`WriteStdinArgs`] minus the id, which is
/// in the path.
#[derive(
    Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
pub struct WriteStdinBody {
    #[serde(default)]
    pub chars: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yield_time_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u64>,
}

impl WriteStdinBody {
    pub fn with_session_id(self, session_id: SessionId) -> WriteStdinArgs {
        WriteStdinArgs {
            session_id,
            chars: self.chars,
            yield_time_ms: self.yield_time_ms,
            max_output_tokens: self.max_output_tokens,
        }
    }
}

/// `kill_session`: kill a session's whole process tree and return its final output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct KillSessionArgs {
    pub session_id: SessionId,
}

/// `list_sessions` takes no arguments; this empty object is its input schema.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ListSessionsArgs {}

/// Where a session stands when a result is produced.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ExecStatus {
    /// The process exited (or was killed); `exit_code` is set and the session is gone.
    Exited,
    /// Still running; poll it with `write_stdin` using `session_id`.
    Running,
    /// Still running and blocked reading its terminal or stdin: answer with `write_stdin`.
    AwaitingInput,
}

/// The result of `exec_command`, `write_stdin` and `kill_session`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
pub struct ExecResult {
    /// Six hex digits identifying this chunk of output.
    pub chunk_id: String,
    /// How long the call took.
    pub wall_time_seconds: f64,
    pub status: ExecStatus,
    /// Set when `status` is `exited`: the exit code, 128+N for a signal, 124 on timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Set when the process was ended by a signal (e.g. `SIGKILL`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// Set while the session is alive (status `running` or `awaiting_input`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<SessionId>,
    /// Estimated tokens (bytes / 4, rounded up) of this chunk's output before folding.
    pub original_token_count: u64,
    /// The cleaned, folded output produced since the previous result of this session.
    pub output: String,
    /// The session's complete raw output, named when `output` is not the whole of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_file: Option<String>,
    /// The same result rendered in Codex's text layout (MCP text content).
    #[serde(default)]
    pub text: String,
}

/// One entry of `list_sessions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
pub struct SessionInfo {
    pub session_id: SessionId,
    pub cmd: String,
    pub workdir: String,
    pub tty: bool,
    pub status: ExecStatus,
    /// Exit code once the process exited (its output not read yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The session's root process (the shell).
    pub pid: u32,
    /// RFC 3339 UTC time the command started.
    pub started_at: String,
    /// Milliseconds since the session last produced output or was used.
    pub idle_ms: u64,
    /// Bytes of output produced and not yet returned by a call.
    pub unread_bytes: u64,
}

/// The result of `list_sessions` (`GET /v1/exec`).
#[derive(
    Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
pub struct SessionList {
    pub sessions: Vec<SessionInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_command_args_need_only_cmd_and_ignore_unknown_fields() {
        let args: ExecCommandArgs =
            serde_json::from_str(r#"{"cmd":"ls","justification":"x"}"#).expect("parses");
        assert_eq!(args.cmd, "ls");
        assert_eq!(args.tty, None);
    }

    #[test]
    fn exec_command_args_reject_missing_cmd_and_wrong_types() {
        let missing = serde_json::from_str::<ExecCommandArgs>("{}").expect_err("missing cmd");
        assert!(missing.to_string().contains("cmd"), "{missing}");
        let wrong =
            serde_json::from_str::<ExecCommandArgs>(r#"{"cmd":"ls","yield_time_ms":"soon"}"#)
                .expect_err("wrong type");
        assert!(wrong.to_string().contains("invalid type"), "{wrong}");
        let negative = serde_json::from_str::<ExecCommandArgs>(r#"{"cmd":"ls","timeout_ms":-1}"#)
            .expect_err("negative");
        assert!(negative.to_string().contains("invalid value"), "{negative}");
    }

    #[test]
    fn exec_result_serializes_status_in_snake_case_and_omits_empty_options() {
        let result = ExecResult {
            chunk_id: "abc123".into(),
            wall_time_seconds: 0.5,
            status: ExecStatus::AwaitingInput,
            exit_code: None,
            signal: None,
            session_id: Some(4242),
            original_token_count: 2,
            output: "Name? ".into(),
            output_file: None,
            text: String::new(),
        };
        let json = serde_json::to_value(&result).expect("serializes");
        assert_eq!(json["status"], "awaiting_input");
        assert!(json.get("exit_code").is_none());
        assert_eq!(json["session_id"], 4242);
    }
}
