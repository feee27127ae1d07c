//! Reading a request: the JSON body extractors, the path extractor and [`RequestError`], the one
//! way any of them fails.
//!
//! Every body goes through [`from_json_slice`], which asks for a JSON object wherever the target
//! type is a struct: serde's derive also accepts an array for a struct (its fields in order), so
//! without this `["ls"]` would be taken for `{"cmd": "ls"}`. Arrays stay fine where the type is a
//! sequence (`Vec<T>`). Reading the body respects axum's `DefaultBodyLimit` (413) and notices
//! the body idle timeout that [`crate::serve`] puts on every request (408).
//!
//! Deliberately absent: status codes of the servers' own errors and the `code` strings they
//! choose for these failures; each server maps [`RequestError`] in its one error mapping.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::de::{DeserializeOwned, Deserializer, Visitor};

/// Why a request could not be read. The messages are written for the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Not JSON, or not JSON of the expected shape (types, missing fields, an array where an
    /// object belongs).
    #[error("invalid JSON body: {0}")]
    InvalidJson(String),
    /// A JSON body route without `Content-Type: application/json`.
    #[error("expected a JSON body with `Content-Type: application/json`")]
    NotJsonContentType,
    /// Larger than the route's body limit.
    #[error("request body too large")]
    BodyTooLarge,
    /// The client sent part of the body and then nothing for longer than the body idle
    /// timeout.
    #[error("the request body stalled: nothing more arrived within the body idle timeout")]
    BodyTimeout,
    /// The body could not be read for another reason (the connection broke, bad chunking).
    #[error("cannot read the request body: {0}")]
    BodyUnreadable(String),
    /// A path parameter that does not decode (not UTF-8 once percent-decoded, not a number
    /// where one is expected).
    #[error("invalid path parameter: {0}")]
    InvalidPath(String),
    /// A query string that does not fit the route's parameters (missing, wrong type).
    #[error("invalid query: {0}")]
    InvalidQuery(String),
    /// The route extracts path parameters it does not declare: a bug in the server, not in the
    /// request.
    #[error("route misconfigured: {0}")]
    RouteMisconfigured(String),
}

impl RequestError {
    /// The HTTP status for this failure; both servers answer with it and choose only the
    /// `code` themselves.
    pub fn status(&self) -> StatusCode {
        match self {
            RequestError::InvalidJson(_)
            | RequestError::NotJsonContentType
            | RequestError::BodyUnreadable(_)
            | RequestError::InvalidPath(_)
            | RequestError::InvalidQuery(_) => StatusCode::BAD_REQUEST,
            RequestError::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            RequestError::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            RequestError::RouteMisconfigured(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The `code` a server answers with unless it has its own: `INVALID_REQUEST_BODY` for what
    /// the client sent, `BODY_TOO_LARGE`, `REQUEST_TIMEOUT`, and `RUNTIME_ERROR` for a bug.
    pub fn default_code(&self) -> &'static str {
        match self {
            RequestError::InvalidJson(_)
            | RequestError::NotJsonContentType
            | RequestError::BodyUnreadable(_)
            | RequestError::InvalidPath(_)
            | RequestError::InvalidQuery(_) => "INVALID_REQUEST_BODY",
            RequestError::BodyTooLarge => "BODY_TOO_LARGE",
            RequestError::BodyTimeout => "REQUEST_TIMEOUT",
            RequestError::RouteMisconfigured(_) => "RUNTIME_ERROR",
        }
    }

    fn from_body(rejection: BytesRejection) -> Self {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            return RequestError::BodyTooLarge;
        }
        if caused_by_body_timeout(&rejection) {
            return RequestError::BodyTimeout;
        }
        RequestError::BodyUnreadable(rejection.body_text())
    }

    fn invalid_json(error: serde_json::Error) -> Self {
        RequestError::InvalidJson(error.to_string())
    }
}

/// The answer when an extractor's failure reaches axum directly. The servers wrap these
/// extractors with their own error type (see their `error.rs`), so this is only a fallback with
/// the same shape.
impl IntoResponse for RequestError {
    fn into_response(self) -> Response {
        let status = self.status();
        let message = if status.is_server_error() {
            tracing::error!(error = %self, "request extraction failed");
            "internal error".to_owned()
        } else {
            self.to_string()
        };
        crate::error_response(status, self.default_code(), message)
    }
}

/// What an error from reading a streamed request body (`Body::into_data_stream`) means:
/// [`RequestError::BodyTimeout`] when [`crate::serve`]'s idle timeout fired, else
/// [`RequestError::BodyUnreadable`] (the client hung up, bad chunking).
pub fn body_read_error(error: &axum::Error) -> RequestError {
    if caused_by_body_timeout(error) {
        return RequestError::BodyTimeout;
    }
    RequestError::BodyUnreadable(error.to_string())
}

/// True when the body failed because [`crate::serve`]'s idle timeout fired. axum nests the
/// body's error a few boxes deep, so the whole source chain is searched.
fn caused_by_body_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = cause {
        if error.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        cause = error.source();
    }
    false
}

/// Deserializes `T` from JSON, refusing anything but an object where `T` is a struct (see the
/// module comment). Only the top level is checked; Warren's bodies nest no structs in arrays'
/// places.
pub fn from_json_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = T::deserialize(ObjectsForStructs(&mut deserializer))?;
    deserializer.end()?;
    Ok(value)
}

/// `Content-Type: application/json` or any `application/*+json`, parameters ignored.
fn has_json_content_type(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or_default().trim();
    let essence = essence.to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// A JSON body (`Content-Type: application/json` required), deserialized with
/// [`from_json_slice`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Json<T>(pub T);

impl<S, T> FromRequest<S> for Json<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = RequestError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !has_json_content_type(request.headers()) {
            return Err(RequestError::NotJsonContentType);
        }
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(RequestError::from_body)?;
        from_json_slice(&bytes)
            .map(Json)
            .map_err(RequestError::invalid_json)
    }
}

/// A body that may be absent: empty or whitespace-only gives `T::default()`, anything else must
/// be JSON for `T` (an object where `T` is a struct). The content type is not checked, since
/// clients that send no body send no content type either.
#[derive(Debug, Clone, Copy, Default)]
pub struct OptionalJson<T>(pub T);

impl<S, T> FromRequest<S> for OptionalJson<T>
where
    T: DeserializeOwned + Default,
    S: Send + Sync,
{
    type Rejection = RequestError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(RequestError::from_body)?;
        parse_optional_json(&bytes).map(OptionalJson)
    }
}

/// The parsing half of [`OptionalJson`], for bodies already read.
pub fn parse_optional_json<T: DeserializeOwned + Default>(bytes: &[u8]) -> Result<T, RequestError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    from_json_slice(bytes).map_err(RequestError::invalid_json)
}

/// `axum::extract::Path` whose failure is a [`RequestError`]: a client's bad segment is
/// [`RequestError::InvalidPath`], a route that asks for parameters it lacks is
/// [`RequestError::RouteMisconfigured`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Path<T>(pub T);

impl<S, T> FromRequestParts<S> for Path<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = RequestError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Path(value)),
            Err(rejection) => Err(path_error(rejection)),
        }
    }
}

fn path_error(rejection: PathRejection) -> RequestError {
    if rejection.status().is_server_error() {
        RequestError::RouteMisconfigured(rejection.body_text())
    } else {
        RequestError::InvalidPath(rejection.body_text())
    }
}

/// A `serde_json` deserializer that answers a struct's request for itself with a request for a
/// map, which serde_json grants only to `{...}`. Every other request passes through untouched.
struct ObjectsForStructs<D>(D);

macro_rules! forward {
    ($($method:ident),* $(,)?) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
                self.0.$method(visitor)
            }
        )*
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for ObjectsForStructs<D> {
    type Error = D::Error;

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_map(visitor)
    }

    forward!(
        deserialize_any,
        deserialize_bool,
        deserialize_i8,
        deserialize_i16,
        deserialize_i32,
        deserialize_i64,
        deserialize_i128,
        deserialize_u8,
        deserialize_u16,
        deserialize_u32,
        deserialize_u64,
        deserialize_u128,
        deserialize_f32,
        deserialize_f64,
        deserialize_char,
        deserialize_str,
        deserialize_string,
        deserialize_bytes,
        deserialize_byte_buf,
        deserialize_option,
        deserialize_unit,
        deserialize_seq,
        deserialize_map,
        deserialize_identifier,
        deserialize_ignored_any,
    );

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_unit_struct(name, visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_newtype_struct(name, visitor)
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_tuple(len, visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_tuple_struct(name, len, visitor)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_enum(name, variants, visitor)
    }

    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[derive(Debug, Default, PartialEq, serde::Deserialize)]
    #[serde(default)]
    struct Args {
        cmd: String,
        tty: bool,
    }

    fn verdict<T: DeserializeOwned>(json: &str) -> Result<(), String> {
        from_json_slice::<T>(json.as_bytes())
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn structs_take_objects_only_and_sequences_stay_sequences() {
        let cases: [(&str, bool); 10] = [
            (r#"{"cmd": "ls"}"#, true),
            ("{}", true),
            (r#"["ls"]"#, false),
            (r#"["ls", true]"#, false),
            ("[]", false),
            ("null", false),
            ("42", false),
            (r#""ls""#, false),
            (r#"{"cmd": "ls"} {}"#, false),
            (r#"{"cmd": "ls"}   "#, true),
        ];
        for (json, accepted) in cases {
            assert_eq!(verdict::<Args>(json).is_ok(), accepted, "{json}");
        }
        assert_eq!(
            from_json_slice::<Args>(br#"{"cmd": "ls", "tty": true}"#).ok(),
            Some(Args {
                cmd: "ls".into(),
                tty: true
            })
        );
        assert!(verdict::<Vec<Args>>(r#"[{"cmd": "a"}, {"cmd": "b"}]"#).is_ok());
        assert!(verdict::<HashMap<String, u32>>(r#"{"a": 1}"#).is_ok());
        assert!(verdict::<HashMap<String, u32>>("[[\"a\", 1]]").is_err());
    }

    #[test]
    fn an_array_for_a_struct_is_refused_with_a_message_naming_the_shape() {
        let message = verdict::<Args>(r#"["ls"]"#).expect_err("refused");
        assert!(message.contains("invalid type: sequence"), "{message}");
        assert!(message.contains("struct Args"), "{message}");
    }

    #[test]
    fn optional_bodies_default_when_blank_and_refuse_arrays() {
        assert_eq!(parse_optional_json::<Args>(b""), Ok(Args::default()));
        assert_eq!(parse_optional_json::<Args>(b" \n\t"), Ok(Args::default()));
        for body in ["[]", "[\"ls\"]", "null", "{bad"] {
            assert!(
                matches!(
                    parse_optional_json::<Args>(body.as_bytes()),
                    Err(RequestError::InvalidJson(_))
                ),
                "{body}"
            );
        }
    }

    #[test]
    fn json_content_types_are_recognised() {
        let cases = [
            (Some("application/json"), true),
            (Some("application/json; charset=utf-8"), true),
            (Some("Application/JSON"), true),
            (Some("application/merge-patch+json"), true),
            (Some("text/plain"), false),
            (Some("application/jsonx"), false),
            (None, false),
        ];
        for (value, expected) in cases {
            let mut headers = HeaderMap::new();
            if let Some(value) = value {
                headers.insert(
                    header::CONTENT_TYPE,
                    value.parse().expect("valid header value"),
                );
            }
            assert_eq!(has_json_content_type(&headers), expected, "{value:?}");
        }
    }

    #[test]
    fn statuses_and_default_codes() {
        let cases = [
            (
                RequestError::InvalidJson("x".into()),
                400,
                "INVALID_REQUEST_BODY",
            ),
            (
                RequestError::NotJsonContentType,
                400,
                "INVALID_REQUEST_BODY",
            ),
            (RequestError::BodyTooLarge, 413, "BODY_TOO_LARGE"),
            (RequestError::BodyTimeout, 408, "REQUEST_TIMEOUT"),
            (
                RequestError::BodyUnreadable("x".into()),
                400,
                "INVALID_REQUEST_BODY",
            ),
            (
                RequestError::InvalidPath("x".into()),
                400,
                "INVALID_REQUEST_BODY",
            ),
            (
                RequestError::RouteMisconfigured("x".into()),
                500,
                "RUNTIME_ERROR",
            ),
        ];
        for (error, status, code) in cases {
            assert_eq!(
                (error.status().as_u16(), error.default_code()),
                (status, code)
            );
        }
    }
}
