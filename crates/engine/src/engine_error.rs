//! What the session engine fails with: [`EngineError`], naming what went wrong and never an
//! HTTP status (the HTTP layer maps it, in `error.rs`). Storage faults arrive here once: a full
//! disk is [`EngineError::StorageFull`] and an unreachable store
//! [`EngineError::StoreUnavailable`] wherever they come from (device files, session metadata,
//! event logs, PostgreSQL).

use crate::event_log::AppendError;
use crate::hands::HandsError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{0}")]
    InvalidRequest(String),
    #[error("session not found")]
    SessionNotFound,
    #[error("a turn is in progress")]
    TurnInProgress,
    #[error("no turn is running")]
    NoTurnRunning,
    #[error("no pending permission request with this id")]
    PermissionNotFound,
    /// An egress rule that does not parse (network.md "Policy").
    #[error(transparent)]
    InvalidEgressRule(#[from] warren_egress::RuleError),
    /// The session's hands have no egress proxy (their network is `host`, `none` or remote).
    #[error(
        "this session's hands have no egress proxy (network {0}): their network is not governed by egress rules"
    )]
    NoEgressProxy(&'static str),
    /// A credential name the session's device is not offered (network.md "Credentials").
    #[error(
        "no credential named {0:?} is offered to this session (GET /v1/sessions/{{id}}/egress lists them in available_credentials)"
    )]
    UnknownCredential(String),
    /// A device's quota (sessions, brains) is used up.
    #[error("{0}")]
    QuotaExceeded(String),
    /// Every brain this gateway may run is running.
    #[error("{0}")]
    ServerBusy(String),
    #[error("the agent could not be started: {0}")]
    BrainUnavailable(String),
    #[error(
        "the gateway's storage is full: new messages, sessions and devices are refused until space is freed"
    )]
    StorageFull,
    /// The PostgreSQL store (`--store postgres://…`) cannot be reached; worth retrying.
    #[error("the gateway's store is unavailable: {0}")]
    StoreUnavailable(String),
    #[error(transparent)]
    Hands(#[from] HandsError),
    /// A rewind or fork asked for while a turn runs (checkpoints.md).
    #[error("a turn is running: wait for it to end or cancel it, then rewind")]
    TurnRunning,
    /// A checkpoint that cannot be found, read, taken or restored.
    #[error(transparent)]
    Checkpoint(#[from] warren_checkpoint::Error),
    #[error("storage error: {0}")]
    Io(std::io::Error),
    #[error("internal error: {0}")]
    Internal(String),
}

impl EngineError {
    /// The machine-readable code a client sees for this error (in an `error` event, or in the
    /// body of the HTTP layer's answer).
    pub fn code(&self) -> &'static str {
        match self {
            EngineError::InvalidRequest(_) => "INVALID_REQUEST_BODY",
            EngineError::SessionNotFound => "SESSION_NOT_FOUND",
            EngineError::TurnInProgress => "TURN_IN_PROGRESS",
            EngineError::NoTurnRunning => "NO_TURN_RUNNING",
            EngineError::PermissionNotFound => "PERMISSION_NOT_FOUND",
            EngineError::InvalidEgressRule(_) => "INVALID_EGRESS_RULE",
            EngineError::NoEgressProxy(_) => "NO_EGRESS_PROXY",
            EngineError::UnknownCredential(_) => "UNKNOWN_CREDENTIAL",
            EngineError::QuotaExceeded(_) => "QUOTA_EXCEEDED",
            EngineError::ServerBusy(_) => "SERVER_BUSY",
            EngineError::BrainUnavailable(_) => "BRAIN_UNAVAILABLE",
            EngineError::StorageFull => "STORAGE_FULL",
            EngineError::StoreUnavailable(_) => "STORE_UNAVAILABLE",
            EngineError::Hands(error) => match error {
                HandsError::Unavailable(_) | HandsError::Start(_) => "HANDS_UNAVAILABLE",
                HandsError::IdentityMismatch(_) => "HANDS_IDENTITY_MISMATCH",
                HandsError::Stopped => "SESSION_NOT_FOUND",
                HandsError::Failed(_) => "HANDS_FAILED",
            },
            EngineError::TurnRunning => "TURN_RUNNING",
            EngineError::Checkpoint(error) => {
                use warren_checkpoint::Error as E;
                match error {
                    E::NotFound(_) => "CHECKPOINT_NOT_FOUND",
                    E::Broken { .. } | E::Missing { .. } | E::Unsafe { .. } | E::Corrupt(_) => {
                        "CHECKPOINT_BROKEN"
                    }
                    E::NoEntry(_) => "FILE_NOT_FOUND",
                    E::WrongKind { expected, .. } if *expected == "directory" => "NOT_A_DIRECTORY",
                    E::WrongKind { .. } => "NOT_REGULAR_FILE",
                    E::Invalid(_) => "INVALID_QUERY",
                    E::StorageFull(_) => "STORAGE_FULL",
                    E::Unavailable(_) => "CHECKPOINTS_UNAVAILABLE",
                    E::Io { .. } => "RUNTIME_ERROR",
                }
            }
            EngineError::Io(_) | EngineError::Internal(_) => "RUNTIME_ERROR",
        }
    }
}

impl From<warren_store::pg::StoreError> for EngineError {
    fn from(error: warren_store::pg::StoreError) -> Self {
        use warren_store::pg::StoreError;
        match error {
            StoreError::Unavailable(message) => EngineError::StoreUnavailable(message),
            StoreError::Conflict(message) | StoreError::Invalid(message) => {
                EngineError::Internal(format!("store: {message}"))
            }
            StoreError::File(error) => EngineError::from(error),
        }
    }
}

impl From<warren_store::health::Refusal> for EngineError {
    fn from(refusal: warren_store::health::Refusal) -> Self {
        match refusal {
            warren_store::health::Refusal::Full => EngineError::StorageFull,
            warren_store::health::Refusal::Unavailable(message) => {
                EngineError::StoreUnavailable(message)
            }
        }
    }
}

/// Every other I/O error stays internal.
impl From<std::io::Error> for EngineError {
    fn from(error: std::io::Error) -> Self {
        if warren_store::pg::is_store_unavailable(&error) {
            EngineError::StoreUnavailable(error.to_string())
        } else if warren_store::file::is_storage_full(&error) {
            tracing::warn!(%error, "the data directory is full");
            EngineError::StorageFull
        } else {
            EngineError::Io(error)
        }
    }
}

impl From<AppendError> for EngineError {
    fn from(error: AppendError) -> Self {
        match error {
            AppendError::Closed => EngineError::Internal(error.to_string()),
            AppendError::Failing(io) if warren_store::file::is_storage_full(&io) => {
                EngineError::StorageFull
            }
            AppendError::Failing(io) if warren_store::pg::is_store_unavailable(&io) => {
                EngineError::StoreUnavailable(io.to_string())
            }
            AppendError::Failing(io) => {
                EngineError::Io(std::io::Error::new(io.kind(), io.to_string()))
            }
        }
    }
}
