//! The gateway's error type and the one place that maps it to an HTTP status plus the JSON body
//! `{"code","message"}`. Modules return [`GatewayError`]; only [`IntoResponse`] picks statuses.
//! A 5xx hides internals from the client and logs them; `STORAGE_FULL` (507) is the one 5xx whose
//! message is shown, since it is fixed text that tells the client what to do. Also here: the
//! request extractors handlers use, warren-http's with this error as their rejection.

use axum::extract::{FromRequest, FromRequestParts};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use warren_http::RequestError;

use crate::engine_error::EngineError;
use crate::hands::HandsError;

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The request could not be read (body, JSON, path).
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error("{0}")]
    InvalidRequest(String),
    #[error("device id must be 8 to 128 characters of [A-Za-z0-9_-]")]
    InvalidDeviceId,
    #[error("missing or wrong app key")]
    BadAppKey,
    #[error("missing, unknown, revoked or expired token")]
    Unauthorized,
    #[error("device id is bound to another token; present that token to register again")]
    DeviceAlreadyBound,
    #[error("not found")]
    RouteNotFound,
    /// A console path (`/console/{path}`, `/` for `index.html`) that names no console file.
    #[error("the console has no file {0}")]
    ConsoleFileNotFound(String),
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    /// A WebSocket route asked with a plain request.
    #[error(
        "this route is a WebSocket: send a WebSocket handshake (Connection: upgrade, Upgrade: websocket)"
    )]
    UpgradeRequired,
    #[error("device not found")]
    DeviceNotFound,
    #[error("this device id was revoked; register with a new device id")]
    DeviceRevoked,
    #[error("the pairing code is wrong, expired or used; mint a new one on a signed-in device")]
    InvalidPairCode,
    #[error("the session has no preview of this port")]
    PreviewNotFound,
    /// A push subscription the gateway does not take (phone.md "Push"): why.
    #[error("not a push subscription the gateway takes: {0}")]
    InvalidPushSubscription(String),
    #[error("this device has no push subscription by that id")]
    PushSubscriptionNotFound,
    #[error("this device has 16 push subscriptions; delete one first")]
    TooManyPushSubscriptions,
    /// An agent terminal's name (`term-…`, `exec-…`) the running hands do not know.
    #[error("the agent runs no terminal {0} in this session's hands (or it was released)")]
    TerminalNotFound(String),
    /// The replica that owns the session does not answer; its lease runs this many seconds
    /// more, then another replica takes the session.
    #[error("the replica that owns this session does not answer; retry in {0} s")]
    OwnerUnavailable(u64),
    /// A file request the workspace refused (files-terminals-previews.md "Files").
    #[error(transparent)]
    Files(#[from] crate::files_error::FilesError),
    /// What the session engine refused or failed with (its codes; the statuses are here).
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("storage error: {0}")]
    Io(std::io::Error),
    #[error("internal error: {0}")]
    Internal(String),
}

impl GatewayError {
    /// The machine-readable code a client sees for this error.
    pub fn code(&self) -> &'static str {
        self.status_and_code().1
    }

    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            // The gateway's codes for unreadable requests are warren-http's defaults
            // (INVALID_REQUEST_BODY, BODY_TOO_LARGE, REQUEST_TIMEOUT).
            GatewayError::Request(error) => (error.status(), error.default_code()),
            GatewayError::InvalidRequest(_) => (StatusCode::BAD_REQUEST, "INVALID_REQUEST_BODY"),
            GatewayError::InvalidDeviceId => (StatusCode::BAD_REQUEST, "INVALID_DEVICE_ID"),
            GatewayError::BadAppKey => (StatusCode::UNAUTHORIZED, "INVALID_APP_KEY"),
            GatewayError::Unauthorized => (StatusCode::UNAUTHORIZED, "UNAUTHORIZED"),
            GatewayError::DeviceAlreadyBound => (StatusCode::CONFLICT, "DEVICE_ALREADY_BOUND"),
            GatewayError::RouteNotFound | GatewayError::ConsoleFileNotFound(_) => {
                (StatusCode::NOT_FOUND, "NOT_FOUND")
            }
            GatewayError::MethodNotAllowed => {
                (StatusCode::METHOD_NOT_ALLOWED, "METHOD_NOT_ALLOWED")
            }
            GatewayError::UpgradeRequired => (StatusCode::UPGRADE_REQUIRED, "UPGRADE_REQUIRED"),
            GatewayError::DeviceNotFound => (StatusCode::NOT_FOUND, "DEVICE_NOT_FOUND"),
            GatewayError::DeviceRevoked => (StatusCode::CONFLICT, "DEVICE_REVOKED"),
            GatewayError::InvalidPairCode => (StatusCode::UNAUTHORIZED, "INVALID_PAIR_CODE"),
            GatewayError::PreviewNotFound => (StatusCode::NOT_FOUND, "PREVIEW_NOT_FOUND"),
            GatewayError::InvalidPushSubscription(_) => {
                (StatusCode::BAD_REQUEST, "INVALID_PUSH_SUBSCRIPTION")
            }
            GatewayError::PushSubscriptionNotFound => {
                (StatusCode::NOT_FOUND, "PUSH_SUBSCRIPTION_NOT_FOUND")
            }
            GatewayError::TooManyPushSubscriptions => {
                (StatusCode::CONFLICT, "TOO_MANY_PUSH_SUBSCRIPTIONS")
            }
            GatewayError::TerminalNotFound(_) => (StatusCode::NOT_FOUND, "TERMINAL_NOT_FOUND"),
            GatewayError::Engine(error) => (engine_status(error), error.code()),
            GatewayError::Files(error) => error.kind.status_and_code(),
            GatewayError::OwnerUnavailable(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, "OWNER_UNAVAILABLE")
            }
            GatewayError::Io(_) | GatewayError::Internal(_) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "RUNTIME_ERROR")
            }
        }
    }
}

/// The status of each of the engine's errors (their codes are the engine's).
fn engine_status(error: &EngineError) -> StatusCode {
    match error {
        EngineError::InvalidRequest(_)
        | EngineError::InvalidEgressRule(_)
        | EngineError::UnknownCredential(_) => StatusCode::BAD_REQUEST,
        EngineError::SessionNotFound | EngineError::PermissionNotFound => StatusCode::NOT_FOUND,
        EngineError::TurnInProgress
        | EngineError::NoTurnRunning
        | EngineError::NoEgressProxy(_) => StatusCode::CONFLICT,
        EngineError::QuotaExceeded(_) | EngineError::ServerBusy(_) => StatusCode::TOO_MANY_REQUESTS,
        EngineError::BrainUnavailable(_) => StatusCode::BAD_GATEWAY,
        EngineError::StorageFull => StatusCode::INSUFFICIENT_STORAGE,
        EngineError::StoreUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        EngineError::Hands(error) => match error {
            HandsError::Unavailable(_) | HandsError::Start(_) => StatusCode::SERVICE_UNAVAILABLE,
            HandsError::IdentityMismatch(_) => StatusCode::CONFLICT,
            HandsError::Stopped => StatusCode::NOT_FOUND,
            HandsError::Failed(_) => StatusCode::BAD_GATEWAY,
        },
        EngineError::TurnRunning => StatusCode::CONFLICT,
        EngineError::Checkpoint(error) => {
            use warren_checkpoint::Error as E;
            match error {
                E::NotFound(_) | E::NoEntry(_) => StatusCode::NOT_FOUND,
                E::Broken { .. } | E::Missing { .. } | E::Unsafe { .. } | E::Corrupt(_) => {
                    StatusCode::CONFLICT
                }
                E::WrongKind { expected, .. } if *expected == "directory" => StatusCode::CONFLICT,
                E::WrongKind { .. } => StatusCode::FORBIDDEN,
                E::Invalid(_) => StatusCode::BAD_REQUEST,
                E::StorageFull(_) => StatusCode::INSUFFICIENT_STORAGE,
                E::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
                E::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            }
        }
        EngineError::Io(_) | EngineError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let message = match &self {
            // Fixed texts that tell the person what to do (free space, install bubblewrap).
            GatewayError::Engine(
                EngineError::StorageFull | EngineError::Hands(HandsError::Unavailable(_)),
            ) => {
                tracing::warn!(error = %self, "request refused");
                self.to_string()
            }
            GatewayError::OwnerUnavailable(seconds) => {
                let response = warren_http::error_response(status, code, self.to_string());
                return with_retry_after(response, *seconds);
            }
            // The database's own message may name hosts and users: a fixed text, and a retry.
            GatewayError::Engine(EngineError::StoreUnavailable(_)) => {
                tracing::warn!(error = %self, "request refused");
                let response = warren_http::error_response(
                    status,
                    code,
                    "the gateway's store is unavailable; retry shortly".to_string(),
                );
                return with_retry_after(response, STORE_RETRY_AFTER_SECONDS);
            }
            _ if status.is_server_error() => {
                tracing::error!(error = %self, "request failed");
                "internal error".to_string()
            }
            _ => self.to_string(),
        };
        warren_http::error_response(status, code, message)
    }
}

/// The `Retry-After` of a 503 `STORE_UNAVAILABLE`.
const STORE_RETRY_AFTER_SECONDS: u64 = 1;

/// `response` with `Retry-After: seconds`.
fn with_retry_after(mut response: Response, seconds: u64) -> Response {
    response
        .headers_mut()
        .insert(axum::http::header::RETRY_AFTER, seconds.into());
    response
}

impl From<HandsError> for GatewayError {
    fn from(error: HandsError) -> Self {
        EngineError::Hands(error).into()
    }
}

/// Storage faults are the engine's (see [`EngineError`]), wherever they come from.
impl From<warren_store::pg::StoreError> for GatewayError {
    fn from(error: warren_store::pg::StoreError) -> Self {
        EngineError::from(error).into()
    }
}

impl From<warren_store::health::Refusal> for GatewayError {
    fn from(refusal: warren_store::health::Refusal) -> Self {
        EngineError::from(refusal).into()
    }
}

impl From<std::io::Error> for GatewayError {
    fn from(error: std::io::Error) -> Self {
        EngineError::from(error).into()
    }
}

impl From<crate::event_log::AppendError> for GatewayError {
    fn from(error: crate::event_log::AppendError) -> Self {
        EngineError::from(error).into()
    }
}

/// A JSON object body (`Content-Type: application/json`); see [`warren_http::Json`].
#[derive(Debug, FromRequest)]
#[from_request(via(warren_http::Json), rejection(GatewayError))]
pub struct Json<T>(pub T);

/// A body that may be empty (then `T::default()`); see [`warren_http::OptionalJson`].
#[derive(Debug, FromRequest)]
#[from_request(via(warren_http::OptionalJson), rejection(GatewayError))]
pub struct OptionalJson<T>(pub T);

/// Path parameters; a segment that does not decode (not UTF-8) is a 400 in Warren's shape.
#[derive(Debug, FromRequestParts)]
#[from_request(via(warren_http::Path), rejection(GatewayError))]
pub struct Path<T>(pub T);

#[cfg(test)]
mod tests {
    use super::*;

    /// Table: each of the engine's errors → the status the HTTP layer answers with; the code
    /// and the message are the engine's own.
    #[test]
    fn every_engine_error_has_its_status_and_keeps_its_code_and_message_over_http() {
        let rule = ""
            .parse::<warren_egress::Rule>()
            .expect_err("an empty rule is refused");
        let cases = [
            (EngineError::InvalidRequest("bad".into()), 400),
            (EngineError::SessionNotFound, 404),
            (EngineError::TurnInProgress, 409),
            (EngineError::NoTurnRunning, 409),
            (EngineError::PermissionNotFound, 404),
            (EngineError::InvalidEgressRule(rule), 400),
            (EngineError::NoEgressProxy("host"), 409),
            (EngineError::UnknownCredential("github".into()), 400),
            (EngineError::QuotaExceeded("full".into()), 429),
            (EngineError::ServerBusy("busy".into()), 429),
            (EngineError::BrainUnavailable("gone".into()), 502),
            (EngineError::StorageFull, 507),
            (EngineError::StoreUnavailable("away".into()), 503),
            (EngineError::Hands(HandsError::Unavailable("x".into())), 503),
            (
                EngineError::Hands(HandsError::IdentityMismatch("x".into())),
                409,
            ),
            (EngineError::Hands(HandsError::Stopped), 404),
            (EngineError::Hands(HandsError::Failed("x".into())), 502),
            (EngineError::Io(std::io::Error::other("x")), 500),
            (EngineError::Internal("x".into()), 500),
        ];
        for (error, status) in cases {
            let (code, message) = (error.code(), error.to_string());
            let over_http = GatewayError::from(error);
            assert_eq!(
                over_http.status_and_code(),
                (StatusCode::from_u16(status).expect("a status"), code),
                "{message}"
            );
            assert_eq!(over_http.to_string(), message);
        }
    }
}
