//! Warren's HTTP edge, shared by `warren execd` and the gateway: how a request is read and how
//! connections are served.
//!
//! [`request`] holds the body and path extractors ([`Json`], [`OptionalJson`], [`Path`]), whose
//! failures are one [`RequestError`] each server turns into its `{"code","message"}` answer, and
//! which refuse a JSON array (or any non-object) where a struct is expected. [`serve`] accepts
//! connections, on TCP or a Unix-domain socket, with a header read timeout, a body idle timeout
//! and a connection limit, none of which `axum::serve` has; [`serve_tls`] does the same over
//! TLS ([`tls`]). [`reach`] lists the URLs a server is reached at, for its start-up lines.
//! [`range`] reads `Range` headers for file downloads. This crate knows no routes and no feature errors: each server keeps its own
//! error enum and the one place that picks its codes.

pub mod hop;
pub mod range;
pub mod reach;
pub mod request;
pub mod secret;
pub mod serve;
pub mod tls;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use warren_protocol::error::ErrorBody;

pub use request::{Json, OptionalJson, Path, RequestError, body_read_error, from_json_slice};
pub use serve::{Listener, ServeConfig, ServeFlags, serve, serve_tls};

/// A response with Warren's error body `{"code": "...", "message": "..."}`.
pub fn error_response(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (status, axum::Json(ErrorBody::new(code, message))).into_response()
}
