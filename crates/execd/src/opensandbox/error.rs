//! What the opensandbox routes fail with, before any status exists (`crate::error` picks them): a
//! leaf that names nothing else of execd.

use crate::fs::error::PathError;

/// Everything that can go wrong on these routes. No HTTP in here; see the `From` impl below.
#[derive(Debug, thiserror::Error)]
pub enum CompatError {
    #[error("{0}")]
    InvalidRequest(String),
    #[error("{0}")]
    MissingQuery(String),
    #[error("command not found: {0}")]
    CommandNotFound(String),
    #[error("error running in session. context not found")]
    SessionRunNotFound,
    #[error("session {0} not found")]
    SessionNotFound(String),
    #[error("{0}")]
    FileNotFound(String),
    #[error("{0}")]
    PathEscape(String),
    #[error("{0}")]
    NotRegularFile(String),
    #[error("{0}")]
    InvalidFile(String),
    #[error("{0}")]
    InvalidFileMetadata(String),
    #[error("{0}")]
    InvalidFileContent(String),
    #[error("requested range not satisfiable for a file of {0} bytes")]
    RangeNotSatisfiable(u64),
    #[error("{0}")]
    NotSupported(String),
    #[error("too many bash sessions (the limit is {0}); delete one first")]
    TooManySessions(usize),
    /// A path that cannot be used (`INVALID_PATH`, `NAME_TOO_LONG`, `NOT_A_DIRECTORY`, ...).
    #[error(transparent)]
    Path(#[from] PathError),
    /// A failure the client should see (OpenSandbox's `RUNTIME_ERROR` cases).
    #[error("{0}")]
    Runtime(String),
    /// An unexpected failure; logged, hidden from the client.
    #[error("{0}")]
    Internal(String),
}
