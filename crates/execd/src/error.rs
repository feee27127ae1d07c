//! [`ApiError`], every error an execd route answers with, and the one place execd picks HTTP
//! statuses and `code`s: [`ApiError::status_and_code`], an exhaustive match over each feature's
//! own `thiserror` enum. Feature modules return their enum; `?` and `From` bring it here.
//!
//! Bodies are Warren's `{"code","message"}`, except the OpenSandbox 401 (`{"error": "..."}`,
//! byte for byte, as the compat spec requires). A 5xx caused by an internal failure says only
//! "internal error" and logs the detail; the 5xx the specs make part of the contract (a spawn
//! failure's OS error, OpenSandbox's `RUNTIME_ERROR` messages) keep their message.
//!
//! Also here: the extractors every route uses, warren-http's with this error as rejection.

use axum::extract::FromRequest;
use axum::extract::FromRequestParts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use warren_exec::ExecError;
use warren_http::RequestError;

use crate::files_api::error::FilesError;
use crate::fs::error::PathError;
use crate::opensandbox::error::CompatError;
use crate::pty::error::PtyError;
use crate::workspace::error::WorkspaceError;
use crate::workspace::patch::PatchError;
use warren_snapshot::SnapshotError;

/// OpenSandbox's 401 body text, byte for byte.
const OPENSANDBOX_UNAUTHORIZED: &str =
    "Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN";

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request could not be read (body, JSON, path).
    #[error(transparent)]
    Request(#[from] RequestError),
    /// No route has this path.
    #[error("no route for {method} {path}")]
    RouteNotFound { method: String, path: String },
    /// The path exists, the method does not.
    #[error("method {0} is not allowed on this route")]
    MethodNotAllowed(String),
    /// A missing or wrong access token on one of Warren's own routes (`/v1/exec`, `/mcp`).
    #[error("invalid or missing header X-EXECD-ACCESS-TOKEN")]
    Unauthorized,
    /// A missing or wrong access token on an OpenSandbox-compatible route (PTY included).
    #[error("{OPENSANDBOX_UNAUTHORIZED}")]
    OpenSandboxUnauthorized,
    #[error(transparent)]
    Pty(#[from] PtyError),
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// An exec session id in a path that is not a number: it names no session.
    #[error("Unknown process id {0}")]
    UnknownExecSession(String),
    #[error(transparent)]
    Compat(#[from] CompatError),
    /// A path the OS refuses for a reason the client can fix (file routes of both kinds).
    #[error(transparent)]
    Path(#[from] PathError),
    #[error(transparent)]
    Files(#[from] FilesError),
    /// The request's `X-Warren-Hands-Nonce` names another hands instance.
    #[error("another sandbox answered: this execd's hands nonce differs from the one asked for")]
    HandsIdentityMismatch,
    #[error(transparent)]
    Workspace(#[from] WorkspaceError),
    #[error(transparent)]
    Patch(#[from] PatchError),
    #[error(transparent)]
    Proxy(#[from] crate::proxy::error::ProxyError),
}

impl ApiError {
    /// The status and `code` of every error execd answers with.
    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        use StatusCode as S;
        match self {
            ApiError::Request(error) => match error {
                // execd answers every unreadable request with INVALID_REQUEST_BODY, a body too
                // large included (pty-sessions.md lists no other code).
                RequestError::InvalidJson(_)
                | RequestError::NotJsonContentType
                | RequestError::BodyTooLarge
                | RequestError::BodyUnreadable(_)
                | RequestError::InvalidPath(_)
                | RequestError::InvalidQuery(_) => (error.status(), "INVALID_REQUEST_BODY"),
                RequestError::BodyTimeout => (error.status(), "REQUEST_TIMEOUT"),
                RequestError::RouteMisconfigured(_) => (error.status(), "RUNTIME_ERROR"),
            },
            ApiError::RouteNotFound { .. } => (S::NOT_FOUND, "NOT_FOUND"),
            ApiError::MethodNotAllowed(_) => (S::METHOD_NOT_ALLOWED, "METHOD_NOT_ALLOWED"),
            ApiError::Unauthorized | ApiError::OpenSandboxUnauthorized => {
                (S::UNAUTHORIZED, "UNAUTHORIZED")
            }
            ApiError::Pty(error) => match error {
                PtyError::NotFound(_) => (S::NOT_FOUND, "CONTEXT_NOT_FOUND"),
                PtyError::UnknownAgentTerminal(_) => (S::NOT_FOUND, "TERMINAL_NOT_FOUND"),
                PtyError::InvalidBody(_) => (S::BAD_REQUEST, "INVALID_REQUEST_BODY"),
                PtyError::AlreadyConnected(_) | PtyError::AgentHolds(_) => {
                    (S::CONFLICT, "ALREADY_CONNECTED")
                }
                PtyError::ViewerRequiresRunningSession(_) => {
                    (S::CONFLICT, "VIEWER_REQUIRES_RUNNING_SESSION")
                }
                PtyError::TooManySessions(_) => (S::TOO_MANY_REQUESTS, "TOO_MANY_SESSIONS"),
                PtyError::UpgradeRequired(_) => (S::UPGRADE_REQUIRED, "UPGRADE_REQUIRED"),
                PtyError::Internal(_) => (S::INTERNAL_SERVER_ERROR, "RUNTIME_ERROR"),
            },
            ApiError::Exec(error) => match error {
                ExecError::InvalidArgument(_) => (S::BAD_REQUEST, "INVALID_REQUEST_BODY"),
                ExecError::InvalidWorkdir { .. } => (S::BAD_REQUEST, "INVALID_WORKDIR"),
                ExecError::UnknownSession(_) => (S::NOT_FOUND, "SESSION_NOT_FOUND"),
                // A program that does not exist is the request's mistake (a `shell` it named);
                // any other failure to start is the daemon's.
                ExecError::Spawn { source, .. }
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    (S::BAD_REQUEST, "SPAWN_FAILED")
                }
                ExecError::Spawn { .. } => (S::INTERNAL_SERVER_ERROR, "SPAWN_FAILED"),
                ExecError::ShuttingDown => (S::SERVICE_UNAVAILABLE, "SHUTTING_DOWN"),
                ExecError::TooManySessions(_) => (S::TOO_MANY_REQUESTS, "TOO_MANY_SESSIONS"),
                ExecError::UnknownTerminal(_) => (S::NOT_FOUND, "TERMINAL_NOT_FOUND"),
            },
            ApiError::UnknownExecSession(_) => (S::NOT_FOUND, "SESSION_NOT_FOUND"),
            ApiError::Compat(error) => match error {
                CompatError::InvalidRequest(_) => (S::BAD_REQUEST, "INVALID_REQUEST_BODY"),
                CompatError::MissingQuery(_) => (S::BAD_REQUEST, "MISSING_QUERY"),
                CompatError::CommandNotFound(_) => (S::NOT_FOUND, "INVALID_REQUEST_BODY"),
                CompatError::SessionRunNotFound => (S::INTERNAL_SERVER_ERROR, "RUNTIME_ERROR"),
                CompatError::SessionNotFound(_) => (S::NOT_FOUND, "CONTEXT_NOT_FOUND"),
                CompatError::FileNotFound(_) => (S::NOT_FOUND, "FILE_NOT_FOUND"),
                CompatError::PathEscape(_) => (S::FORBIDDEN, "PATH_ESCAPE"),
                CompatError::NotRegularFile(_) => (S::FORBIDDEN, "NOT_REGULAR_FILE"),
                CompatError::InvalidFile(_) => (S::BAD_REQUEST, "INVALID_FILE"),
                CompatError::InvalidFileMetadata(_) => (S::BAD_REQUEST, "INVALID_FILE_METADATA"),
                CompatError::InvalidFileContent(_) => (S::BAD_REQUEST, "INVALID_FILE_CONTENT"),
                CompatError::RangeNotSatisfiable(_) => {
                    (S::RANGE_NOT_SATISFIABLE, "INVALID_REQUEST_BODY")
                }
                CompatError::NotSupported(_) => (S::NOT_IMPLEMENTED, "NOT_SUPPORTED"),
                CompatError::TooManySessions(_) => (S::TOO_MANY_REQUESTS, "TOO_MANY_SESSIONS"),
                CompatError::Runtime(_) => (S::INTERNAL_SERVER_ERROR, "RUNTIME_ERROR"),
                CompatError::Internal(_) => (S::INTERNAL_SERVER_ERROR, "RUNTIME_ERROR"),
                CompatError::Path(error) => path_status_and_code(error),
            },
            ApiError::Path(error) => path_status_and_code(error),
            ApiError::Files(error) => match error {
                FilesError::InvalidPath(_) => (S::BAD_REQUEST, "INVALID_PATH"),
                FilesError::NotFound(_) => (S::NOT_FOUND, "FILE_NOT_FOUND"),
                FilesError::Escape(_) => (S::FORBIDDEN, "PATH_ESCAPE"),
                FilesError::NotRegular(_) => (S::FORBIDDEN, "NOT_REGULAR_FILE"),
                FilesError::Exists(_) => (S::CONFLICT, "FILE_EXISTS"),
                FilesError::DirNotEmpty(_) => (S::CONFLICT, "DIR_NOT_EMPTY"),
                FilesError::RangeNotSatisfiable(_) => {
                    (S::RANGE_NOT_SATISFIABLE, "RANGE_NOT_SATISFIABLE")
                }
                FilesError::WatchUnavailable(_) => (S::SERVICE_UNAVAILABLE, "WATCH_UNAVAILABLE"),
                FilesError::Path(error) => path_status_and_code(error),
                FilesError::Io { source, .. }
                    if source.kind() == std::io::ErrorKind::StorageFull =>
                {
                    (S::INSUFFICIENT_STORAGE, "STORAGE_FULL")
                }
                FilesError::Io { .. } => (S::INTERNAL_SERVER_ERROR, "RUNTIME_ERROR"),
            },
            ApiError::HandsIdentityMismatch => (S::CONFLICT, "HANDS_IDENTITY_MISMATCH"),
            ApiError::Workspace(error) => match error {
                WorkspaceError::Snapshot(error) => match error {
                    SnapshotError::Unsafe { .. } => (S::BAD_REQUEST, "SNAPSHOT_UNSAFE_ENTRY"),
                    SnapshotError::Corrupt(_) => (S::BAD_REQUEST, "SNAPSHOT_CORRUPT"),
                    SnapshotError::TooLarge { .. } => (S::PAYLOAD_TOO_LARGE, "SNAPSHOT_TOO_LARGE"),
                    SnapshotError::NotEmpty => (S::CONFLICT, "WORKSPACE_NOT_EMPTY"),
                    // Only reading a stored snapshot's files gives these; execd never does.
                    SnapshotError::NotFound(_) => (S::NOT_FOUND, "FILE_NOT_FOUND"),
                    SnapshotError::NotAFile(_) => (S::BAD_REQUEST, "NOT_REGULAR_FILE"),
                    SnapshotError::Io(source)
                        if source.kind() == std::io::ErrorKind::StorageFull =>
                    {
                        (S::INSUFFICIENT_STORAGE, "STORAGE_FULL")
                    }
                    SnapshotError::Io(_) => (S::INTERNAL_SERVER_ERROR, "RUNTIME_ERROR"),
                },
                WorkspaceError::Task(_) | WorkspaceError::Unreadable(_) => {
                    (S::INTERNAL_SERVER_ERROR, "RUNTIME_ERROR")
                }
                WorkspaceError::UnknownTree(_) => (S::BAD_REQUEST, "INVALID_REQUEST_BODY"),
            },
            ApiError::Patch(error) => patch_status_and_code(error),
            ApiError::Proxy(error) => match error {
                crate::proxy::error::ProxyError::InvalidPort(_) => (S::BAD_REQUEST, "INVALID_PORT"),
                crate::proxy::error::ProxyError::Unreachable { .. } => {
                    (S::BAD_GATEWAY, "UPSTREAM_UNREACHABLE")
                }
            },
        }
    }

    /// The detail of an internal failure, which the client must not see; `None` for every
    /// error whose message is meant for the client.
    fn internal_detail(&self) -> Option<String> {
        match self {
            ApiError::Pty(PtyError::Internal(detail))
            | ApiError::Compat(CompatError::Internal(detail))
            | ApiError::Request(RequestError::RouteMisconfigured(detail)) => Some(detail.clone()),
            ApiError::Files(error @ FilesError::Io { source, .. })
                if source.kind() != std::io::ErrorKind::StorageFull =>
            {
                Some(error.to_string())
            }
            ApiError::Workspace(
                error @ (WorkspaceError::Task(_) | WorkspaceError::Unreadable(_)),
            ) => Some(error.to_string()),
            ApiError::Patch(error)
                if patch_status_and_code(error).0 == StatusCode::INTERNAL_SERVER_ERROR =>
            {
                Some(error.to_string())
            }
            ApiError::Workspace(WorkspaceError::Snapshot(error @ SnapshotError::Io(source)))
                if source.kind() != std::io::ErrorKind::StorageFull =>
            {
                Some(error.to_string())
            }
            _ => None,
        }
    }

    /// The message for the client. The engine's invalid-argument text is shown without its
    /// "invalid argument: " prefix, which the code already says.
    fn client_message(&self) -> String {
        match self {
            ApiError::Exec(ExecError::InvalidArgument(message)) => message.clone(),
            other => other.to_string(),
        }
    }
}

/// The codes of [`PathError`], on every file route: 400 when the request can never succeed as
/// written, 409 when the filesystem holds something else, 403 when the OS refuses access.
fn path_status_and_code(error: &PathError) -> (StatusCode, &'static str) {
    match error {
        PathError::InvalidPath(_) => (StatusCode::BAD_REQUEST, "INVALID_PATH"),
        PathError::NameTooLong(_) => (StatusCode::BAD_REQUEST, "NAME_TOO_LONG"),
        PathError::NotADirectory(_) => (StatusCode::CONFLICT, "NOT_A_DIRECTORY"),
        PathError::PermissionDenied(_) => (StatusCode::FORBIDDEN, "PERMISSION_DENIED"),
        PathError::InvalidMove(_) => (StatusCode::BAD_REQUEST, "INVALID_MOVE"),
    }
}

/// The codes of a failed patch: 400 for one that can never apply, 409 for a tree that changed
/// since the checkpoint the patch was made against. Applying reads no store, so the store's own
/// errors would be internal here.
fn patch_status_and_code(error: &PatchError) -> (StatusCode, &'static str) {
    use warren_checkpoint::Error as E;
    match error {
        PatchError::Apply(error) => match error {
            E::Corrupt(_) => (StatusCode::BAD_REQUEST, "PATCH_CORRUPT"),
            E::Unsafe { .. } => (StatusCode::BAD_REQUEST, "PATCH_UNSAFE_ENTRY"),
            E::Invalid(_) => (StatusCode::CONFLICT, "PATCH_STALE"),
            E::StorageFull(_) => (StatusCode::INSUFFICIENT_STORAGE, "STORAGE_FULL"),
            E::Io { .. }
            | E::NotFound(_)
            | E::Broken { .. }
            | E::Missing { .. }
            | E::NoEntry(_)
            | E::WrongKind { .. }
            | E::Unavailable(_) => (StatusCode::INTERNAL_SERVER_ERROR, "RUNTIME_ERROR"),
        },
        PatchError::Task(_) => (StatusCode::INTERNAL_SERVER_ERROR, "RUNTIME_ERROR"),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if matches!(self, ApiError::OpenSandboxUnauthorized) {
            return (
                StatusCode::UNAUTHORIZED,
                axum::Json(serde_json::json!({ "error": OPENSANDBOX_UNAUTHORIZED })),
            )
                .into_response();
        }
        let (status, code) = self.status_and_code();
        let message = match self.internal_detail() {
            Some(detail) => {
                tracing::error!(%detail, code, "internal error");
                "internal error".to_owned()
            }
            None => self.client_message(),
        };
        let mut response = warren_http::error_response(status, code, message);
        // A 416 says how large the file is, so a client can ask for a range that exists.
        if let ApiError::Compat(CompatError::RangeNotSatisfiable(size))
        | ApiError::Files(FilesError::RangeNotSatisfiable(size)) = &self
            && let Ok(value) = HeaderValue::from_str(&warren_http::range::unsatisfied_range(*size))
        {
            response.headers_mut().insert(header::CONTENT_RANGE, value);
        }
        response
    }
}

/// A JSON object body (`Content-Type: application/json`); see [`warren_http::Json`].
#[derive(Debug, FromRequest)]
#[from_request(via(warren_http::Json), rejection(ApiError))]
pub struct Json<T>(pub T);

/// A body that may be empty (then `T::default()`); see [`warren_http::OptionalJson`].
#[derive(Debug, FromRequest)]
#[from_request(via(warren_http::OptionalJson), rejection(ApiError))]
pub struct OptionalJson<T>(pub T);

/// Path parameters; a segment that does not decode is a 400 in Warren's shape.
#[derive(Debug, FromRequestParts)]
#[from_request(via(warren_http::Path), rejection(ApiError))]
pub struct Path<T>(pub T);

/// The fallback of every path no route has.
pub async fn route_not_found(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::RouteNotFound {
        method: method.to_string(),
        path: uri.path().to_owned(),
    }
}

/// The fallback of every route asked for a method it does not serve.
pub async fn method_not_allowed(method: axum::http::Method) -> ApiError {
    ApiError::MethodNotAllowed(method.to_string())
}
