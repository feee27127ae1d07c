//! Wire types of execd's `/v1/terminals` routes: commands an agent started through ACP
//! `terminal/create`, run by the exec engine on pipes and read back as raw bytes.
//!
//! Unlike `/v1/exec` results, a terminal's output is exactly what the command wrote (no
//! terminal cleaning, no folding, nothing added or split), bounded to its last
//! `output_byte_limit` bytes, and stays readable after the exit until the terminal is released.
//! See `docs/exec-tools.md`. Also here: the agent terminals list (`/v1/agent-terminals`), every
//! command of the engine as a person watches it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `POST /v1/terminals`: ACP's `terminal/create` parameters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TerminalCreate {
    /// With `args`, the program to run; without, a shell command line.
    #[schema(min_length = 1, pattern = "\\S")]
    pub command: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory; relative paths resolve against the daemon's root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Keep at most this many bytes of output, dropping the oldest (default 1 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_byte_limit: Option<u64>,
}

/// The answer to `POST /v1/terminals`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TerminalCreated {
    pub terminal_id: String,
    /// The command's root process (the shell).
    pub pid: u32,
}

/// How a terminal's command ended: its exit code, or the signal that killed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TerminalExitStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<u32>,
    /// `SIGTERM`, `SIGKILL`...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
}

/// `GET /v1/terminals/{id}/output`: the output kept so far and the exit, once the command has
/// exited and its output is drained.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TerminalOutput {
    /// The last bytes the command wrote, as UTF-8 (invalid sequences replaced; a character cut
    /// by the byte limit is dropped whole).
    pub output: String,
    /// Bytes were dropped from the start to keep within the limit.
    pub truncated: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<TerminalExitStatus>,
}

/// One entry of `GET /v1/terminals`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TerminalInfo {
    pub terminal_id: String,
    pub command: String,
    pub pid: u32,
    pub running: bool,
}

/// `GET /v1/terminals`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TerminalList {
    pub terminals: Vec<TerminalInfo>,
}

/// Which engine call started an agent terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum AgentTerminalSource {
    /// ACP `terminal/create` (`/v1/terminals`).
    Terminal,
    /// The exec tools' `exec_command` (`/v1/exec`, `/mcp`).
    Exec,
}

/// One entry of `GET /v1/agent-terminals`: a command of the exec engine that a person can
/// watch and answer over `GET /v1/agent-terminals/{name}/ws` (pty-sessions.md's protocol).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AgentTerminalInfo {
    /// `term-<terminal_id>` or `exec-<session_id>`.
    pub name: String,
    pub source: AgentTerminalSource,
    /// The command line, on one line, shortened to at most 80 characters.
    pub title: String,
    pub mode: crate::pty::PtyMode,
    /// The command has not exited yet.
    pub running: bool,
    /// Output bytes the command ever produced: the natural `since` for a reconnect.
    pub output_offset: u64,
    /// RFC 3339.
    pub started_at: String,
}

/// `GET /v1/agent-terminals`, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AgentTerminalList {
    pub terminals: Vec<AgentTerminalInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_needs_a_command_and_refuses_unknown_fields() {
        let parsed: TerminalCreate =
            serde_json::from_str(r#"{"command":"ls","args":["-l"]}"#).expect("parses");
        assert_eq!(parsed.args, vec!["-l"]);
        assert!(serde_json::from_str::<TerminalCreate>("{}").is_err());
        assert!(serde_json::from_str::<TerminalCreate>(r#"{"command":"ls","x":1}"#).is_err());
    }
}
