//! Where the exec tools run: an in-process [`Engine`] (this machine is the sandbox) or a remote
//! `warren execd` reached over its `/v1/exec` HTTP API (the sandbox is elsewhere).
//!
//! Both answer the four calls with the same protocol types, and both report failures as
//! [`BackendError`], so the MCP layer above does not know which one it talks to. This module
//! does no rendering and knows nothing about MCP.

use std::sync::Arc;

use reqwest::StatusCode;
use warren_exec::Engine;
use warren_execd_client::{ClientError, ExecdClient};
use warren_protocol::exec::{ExecCommandArgs, ExecResult, SessionId, SessionList, WriteStdinArgs};

/// Why a call failed. Messages are written for the model that made the call.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The session id is not (or no longer) known: it never existed, or its exit was already
    /// reported.
    #[error("Unknown process id {0}")]
    UnknownSession(SessionId),
    /// The request itself was wrong (bad workdir, invalid arguments): the message says how.
    #[error("{0}")]
    Rejected(String),
    /// The command could not be started or the engine failed; the message says why.
    #[error("{0}")]
    Failed(String),
    /// The remote execd could not be reached or answered something unreadable.
    #[error("execd at {url} unreachable: {detail}")]
    Unreachable { url: String, detail: String },
    /// `--execd` is not an `http://host:port` URL.
    #[error("invalid execd URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    /// The remote execd refused the access token.
    #[error("execd at {url} rejected the access token (set --token or WARREN_EXECD_TOKEN)")]
    Unauthorized { url: String },
}

/// The engine the tools drive.
#[derive(Clone)]
pub enum ExecBackend {
    /// Commands run on this machine, in this process's engine.
    Local(Arc<Engine>),
    /// Commands run on a remote `warren execd`.
    Remote(RemoteExecd),
}

impl ExecBackend {
    pub async fn exec_command(&self, args: ExecCommandArgs) -> Result<ExecResult, BackendError> {
        match self {
            Self::Local(engine) => engine.exec_command(args).await.map_err(local_error),
            Self::Remote(remote) => remote
                .exec_command(&args)
                .await
                .map_err(|e| remote_error(e, None)),
        }
    }

    pub async fn write_stdin(&self, args: WriteStdinArgs) -> Result<ExecResult, BackendError> {
        match self {
            Self::Local(engine) => engine.write_stdin(args).await.map_err(local_error),
            Self::Remote(remote) => {
                let session_id = args.session_id;
                remote
                    .write_stdin(args)
                    .await
                    .map_err(|e| remote_error(e, Some(session_id)))
            }
        }
    }

    pub async fn list_sessions(&self) -> Result<SessionList, BackendError> {
        match self {
            Self::Local(engine) => Ok(engine.list_sessions().await),
            Self::Remote(remote) => remote
                .list_sessions()
                .await
                .map_err(|e| remote_error(e, None)),
        }
    }

    pub async fn kill_session(&self, session_id: SessionId) -> Result<ExecResult, BackendError> {
        match self {
            Self::Local(engine) => engine.kill_session(session_id).await.map_err(local_error),
            Self::Remote(remote) => remote
                .kill_session(session_id)
                .await
                .map_err(|e| remote_error(e, Some(session_id))),
        }
    }
}

/// The one place engine errors become backend errors.
fn local_error(error: warren_exec::ExecError) -> BackendError {
    use warren_exec::ExecError;
    match error {
        ExecError::UnknownSession(session_id) => BackendError::UnknownSession(session_id),
        ExecError::InvalidArgument(_) | ExecError::InvalidWorkdir { .. } => {
            BackendError::Rejected(error.to_string())
        }
        ExecError::TooManySessions(_) | ExecError::UnknownTerminal(_) => {
            BackendError::Rejected(error.to_string())
        }
        ExecError::Spawn { .. } | ExecError::ShuttingDown => {
            BackendError::Failed(error.to_string())
        }
    }
}

/// A remote execd: the typed client of its `/v1/exec` routes.
pub type RemoteExecd = ExecdClient;

/// The one place client errors become backend errors. `session_id` names the session a 404
/// is about.
fn remote_error(error: ClientError, session_id: Option<SessionId>) -> BackendError {
    match error {
        ClientError::InvalidUrl { url, reason } => BackendError::InvalidUrl { url, reason },
        ClientError::Unreachable { url, detail } => BackendError::Unreachable { url, detail },
        ClientError::Unauthorized { url } => BackendError::Unauthorized { url },
        ClientError::Api {
            status,
            code,
            message,
        } => match session_id {
            Some(session_id) if status == StatusCode::NOT_FOUND && code == "SESSION_NOT_FOUND" => {
                BackendError::UnknownSession(session_id)
            }
            _ if status.is_client_error() => BackendError::Rejected(message),
            _ => BackendError::Failed(message),
        },
    }
}
