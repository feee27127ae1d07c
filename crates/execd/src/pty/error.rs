//! What the pty routes fail with, before any status exists (`crate::error` picks them): a
//! leaf that names nothing else of execd.

/// Everything that can go wrong in a PTY route, before status codes exist.
#[derive(Debug, thiserror::Error)]
pub enum PtyError {
    #[error("pty session {0} not found")]
    NotFound(String),
    #[error("no agent terminal {0}: the agent runs no such command (or it was released)")]
    UnknownAgentTerminal(String),
    #[error("{0}")]
    InvalidBody(String),
    #[error("another client is already connected to pty session {0}")]
    AlreadyConnected(String),
    /// A holder attach without `takeover=1` to an agent's command, which the agent drives.
    #[error("the agent drives {0}: watch it with mode=viewer or answer it with takeover=1")]
    AgentHolds(String),
    #[error("viewer mode requires a running shell in pty session {0}")]
    ViewerRequiresRunningSession(String),
    #[error("too many pty sessions (limit {0}); delete one first")]
    TooManySessions(usize),
    #[error("websocket upgrade required: {0}")]
    UpgradeRequired(String),
    #[error("{0}")]
    Internal(String),
}
