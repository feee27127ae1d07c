//! Brains: agent processes spoken to over the Agent Client Protocol (ACP, protocol v1), with the
//! gateway as the ACP *client*. This crate is the only one that knows ACP (and the `smol`-based
//! stack the `agent-client-protocol` crate pulls in); the gateway sees plain Rust types and
//! `serde_json::Value`s.
//!
//! # API in one screen
//! - [`AgentCommand::parse`] splits `--agent "<cmd>"` like a shell would;
//!   [`AgentCommand::shell_agent`] is the built-in `<warren> shell-agent`.
//! - [`WorkerPool::new(cmd, n_warm)`](WorkerPool::new) keeps `n_warm` workers spawned and
//!   `initialize`d; [`WorkerPool::take`] hands one out (a warm one at once, else spawns one) and
//!   starts a replacement in the background. [`WorkerPool::shutdown`] kills the idle ones.
//!   A [`Worker`] serves exactly one session and is never reused.
//! - [`Worker::new_session`] sends `session/new` with the session's `cwd` and MCP servers
//!   ([`McpServerSpec::warren_exec`] builds Warren's exec-tools entry) and binds the session's
//!   [`Host`] (serves `fs/*` and `terminal/*` requests, i.e. the hands) and [`TurnSink`] (receives
//!   `session/update`s and permission requests, i.e. the gateway's event log).
//!   [`Worker::resume_session`] does the same for an ACP session id that an earlier, stopped
//!   worker created: `session/resume` if the agent supports it, else `session/load`, else a new
//!   session, reporting which in [`Resumed`] ([`Resumed::ContextLost`] means the gateway should
//!   emit an `error` event saying the agent's context was lost).
//! - [`BrainSession::prompt`] runs one turn and returns ACP's stop reason (`"end_turn"`,
//!   `"cancelled"`, ...). Updates reach the sink as they arrive (the `update` object exactly as
//!   the agent sent it), all of them before `prompt` returns. A worker that dies mid-turn makes
//!   `prompt` fail with [`BrainError::WorkerExited`], whose status carries the agent's last
//!   stderr line. [`BrainSession::exited`] resolves when the process dies outside a turn.
//! - [`BrainSession::cancel`] sends `session/cancel` and answers every pending permission request
//!   `cancelled` (the sink's permission futures are dropped; the gateway should record them as
//!   resolved by cancellation). [`BrainSession::close`] stops the worker: `session/close` when the
//!   agent advertises it, then kills the agent's whole process tree (also after a crash:
//!   leftovers such as its MCP servers are found by a marker variable). Dropping a worker or a
//!   session without `close` kills it too.
//! - The built-in agent is [`shell_agent`]; `warren-test-agent` (a binary of this crate, for
//!   tests only) is a scripted agent: permission, cancel, `fs/*`, terminals, MCP, crash.
//!
//! Deliberately absent: no HTTP, no event log, no knowledge of hands beyond the [`Host`] trait.

mod host;
mod pool;
mod session;
pub mod shell_agent;
mod worker;

pub use host::{
    BoxFuture, Host, HostError, PermissionOutcome, TerminalExit, TerminalOutput, TerminalSpec,
    TurnSink, select_lines,
};
pub use pool::WorkerPool;
pub use session::{
    BrainSession, CHECKPOINT_META_KEY, HANDS_RESET_NOTICE, NOTICE_META_KEY, Notice, REWOUND_NOTICE,
    Resumed,
};
pub use worker::{AgentIo, RemoteStop, Worker};

/// The agent command line (`--agent "<cmd>"`), already split into a program and its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentCommand {
    pub program: String,
    pub args: Vec<String>,
    /// Variables added to the agent's environment (`--agent-env`), after the gateway's own
    /// minus Warren's credentials.
    pub env: Vec<(String, String)>,
}

impl AgentCommand {
    /// Splits `command_line` the way a POSIX shell would (quotes, backslashes), without running
    /// a shell.
    pub fn parse(command_line: &str) -> Result<Self, BrainError> {
        let words = shlex::split(command_line).ok_or_else(|| {
            BrainError::BadCommand(format!("unbalanced quotes in {command_line:?}"))
        })?;
        let mut words = words.into_iter();
        let program = words
            .next()
            .ok_or_else(|| BrainError::BadCommand("the agent command is empty".to_owned()))?;
        Ok(Self {
            program,
            args: words.collect(),
            env: Vec::new(),
        })
    }

    /// The built-in deterministic agent: `<warren_exe> shell-agent`.
    pub fn shell_agent(warren_exe: impl Into<String>) -> Self {
        Self {
            program: warren_exe.into(),
            args: vec!["shell-agent".to_owned()],
            env: Vec::new(),
        }
    }
}

/// An MCP server entry passed to the agent in `session/new` (stdio transport).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpServerSpec {
    pub name: String,
    pub command: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

impl McpServerSpec {
    /// Warren's exec tools bound to one hands: `<warren_exe> mcp --execd URL`, with the access
    /// token in `WARREN_EXECD_TOKEN` rather than on the command line, where `ps` would show it.
    pub fn warren_exec(warren_exe: impl Into<String>, execd_url: &str, token: &str) -> Self {
        Self {
            name: "warren".to_owned(),
            command: warren_exe.into(),
            args: vec!["mcp".to_owned(), "--execd".to_owned(), execd_url.to_owned()],
            env: vec![("WARREN_EXECD_TOKEN".to_owned(), token.to_owned())],
        }
    }
}

/// Everything that can go wrong talking to an agent.
#[derive(Debug, thiserror::Error)]
pub enum BrainError {
    #[error("bad agent command: {0}")]
    BadCommand(String),
    #[error("cannot start the agent {program:?}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("the agent process exited ({status})")]
    WorkerExited { status: String },
    #[error("the agent answered {method} with error {code}: {message}")]
    Agent {
        method: &'static str,
        code: i32,
        message: String,
    },
    #[error("the agent did not answer {method} within {timeout_ms} ms")]
    Timeout {
        method: &'static str,
        timeout_ms: u64,
    },
    #[error("the worker pool is shut down")]
    PoolClosed,
    #[error("a turn is already running in this brain session")]
    TurnInProgress,
}

#[cfg(test)]
mod tests {
    use super::AgentCommand;

    /// A command line and the program and arguments it splits into (`None`: refused).
    type Case = (
        &'static str,
        Option<(&'static str, &'static [&'static str])>,
    );

    #[test]
    fn agent_command_lines_are_split_like_a_shell_would() {
        let cases: [Case; 6] = [
            ("claude-agent-acp", Some(("claude-agent-acp", &[]))),
            ("gemini --acp", Some(("gemini", &["--acp"]))),
            (
                "python3 'my agent.py' --flag=\"a b\"",
                Some(("python3", &["my agent.py", "--flag=a b"])),
            ),
            ("  codex-acp   -c x  ", Some(("codex-acp", &["-c", "x"]))),
            ("", None),
            ("agent 'unclosed", None),
        ];
        for (line, expected) in cases {
            let parsed = AgentCommand::parse(line).ok();
            let expected = expected.map(|(program, args)| AgentCommand {
                env: Vec::new(),
                program: program.to_owned(),
                args: args.iter().map(|a| (*a).to_owned()).collect(),
            });
            assert_eq!(parsed, expected, "{line:?}");
        }
    }
}
