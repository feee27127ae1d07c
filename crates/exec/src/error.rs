//! The engine's error type. Servers map it to their own status codes in exactly one place
//! (execd: 400 `INVALID_WORKDIR`, 404 `SESSION_NOT_FOUND`, 429 `TOO_MANY_SESSIONS`,
//! 500 `SPAWN_FAILED`).

use std::path::PathBuf;

use warren_protocol::exec::SessionId;

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// An argument is out of range or malformed (empty `cmd`, NUL in a variable...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// `workdir` does not exist or is not a directory.
    #[error("invalid workdir {path}: {reason}")]
    InvalidWorkdir { path: PathBuf, reason: String },
    /// No session with this id (never existed, or its final output was already returned).
    /// The text is Codex's, so agents trained on it recognise it.
    #[error("Unknown process id {0}")]
    UnknownSession(SessionId),
    /// No terminal with this id (never created, or released).
    #[error("unknown terminal {0}")]
    UnknownTerminal(String),
    /// The command could not be started.
    #[error("failed to start `{program}`: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    /// Every session slot is held by a session some call is waiting on, so none may be
    /// pruned to make room for a new one.
    #[error("too many exec sessions: all {0} are in use by calls in flight; try again shortly")]
    TooManySessions(usize),
    /// The engine is shutting down and takes no new commands.
    #[error("the exec engine is shutting down")]
    ShuttingDown,
}
