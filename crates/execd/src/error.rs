//! The one error type every execd route answers with: a status plus the JSON body
//! `{"code","message"}`. Feature modules keep their own `thiserror` enums and convert into
//! [`ApiError`] with an exhaustive match, which is the only place their status codes are picked.

use axum::extract::{FromRequest, Request, rejection::JsonRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use warren_protocol::error::ErrorBody;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "INVALID_REQUEST_BODY", message)
    }

    /// A 500 that tells the client nothing about internals; the detail goes to the log.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        tracing::error!(%detail, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "RUNTIME_ERROR",
            "internal error",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            axum::Json(ErrorBody::new(self.code, self.message)),
        )
            .into_response()
    }
}

/// `axum::Json` whose rejection is a 400 `INVALID_REQUEST_BODY` in Warren's error shape.
/// An empty body is rejected too; routes that allow one take `Option`-like bodies themselves.
pub struct Json<T>(pub T);

impl<S, T> FromRequest<S> for Json<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(Json(value)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

fn json_rejection(rejection: JsonRejection) -> ApiError {
    ApiError::bad_request(rejection.body_text())
}

/// Parses a body that may be empty (`POST /pty` allows that): empty or whitespace-only bytes
/// give `T::default()`, anything else must be valid JSON for `T`.
pub fn parse_optional_body<T: DeserializeOwned + Default>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}
