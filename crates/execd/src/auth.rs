//! The optional access token: every route but `GET /ping` and `GET /openapi.json` needs
//! `X-EXECD-ACCESS-TOKEN`,
//! compared in constant time. The 401 answers in the shape of the route it guards: Warren's
//! `{"code","message"}` on Warren's own routes (`/v1/exec`, `/mcp`), OpenSandbox's
//! `{"error": ...}` byte for byte everywhere else, PTY routes included, since pty-sessions.md and
//! OpenSandbox's clients expect that body there.
//!
//! Also the answer of the `Host`/`Origin` guard in front of it (`origin_guard`): a 403 in
//! Warren's shape on every route, since OpenSandbox's error body outside that 401 is the same
//! `{"code","message"}` (docs/opensandbox-compat.md).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::origin_guard::Refusal;

pub const ACCESS_TOKEN_HEADER: &str = "X-EXECD-ACCESS-TOKEN";

/// True when `presented` equals `expected`. The comparison time does not depend on where the
/// two differ (the length is not secret).
pub fn token_matches(expected: &str, presented: &[u8]) -> bool {
    expected.as_bytes().ct_eq(presented).into()
}

pub async fn require_access_token(
    State(expected): State<Option<Arc<str>>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(expected) = expected else {
        return next.run(request).await;
    };
    // The OpenAPI document holds no secret, and a client needs it before it has a token.
    if matches!(request.uri().path(), "/ping" | "/openapi.json") {
        return next.run(request).await;
    }
    let presented = request
        .headers()
        .get(ACCESS_TOKEN_HEADER)
        .map(|v| v.as_bytes());
    if presented.is_some_and(|p| token_matches(&expected, p)) {
        return next.run(request).await;
    }
    if is_warren_route(request.uri().path()) {
        ApiError::Unauthorized.into_response()
    } else {
        ApiError::OpenSandboxUnauthorized.into_response()
    }
}

/// The guard's 403 on execd's listener: `{"code":"HOST_NOT_ALLOWED"|"ORIGIN_NOT_ALLOWED",
/// "message"}` whatever the route.
pub fn refused_by_guard(_uri: &Uri, _headers: &HeaderMap, refusal: Refusal) -> Response {
    warren_http::error_response(StatusCode::FORBIDDEN, refusal.code(), refusal.to_string())
}

/// Routes that are Warren's own protocol rather than OpenSandbox's: `/v1/exec...` and
/// `/mcp...`.
pub fn is_warren_route(path: &str) -> bool {
    let under = |prefix: &str| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    under("/v1/exec") || under("/mcp")
}

#[cfg(test)]
mod tests {
    use super::{is_warren_route, token_matches};

    #[test]
    fn warren_routes_are_exec_and_mcp_only() {
        let cases = [
            ("/v1/exec", true),
            ("/v1/exec/12/stdin", true),
            ("/mcp", true),
            ("/mcp/", true),
            ("/v1/executor", false),
            ("/mcpx", false),
            ("/pty", false),
            ("/pty/abc/ws", false),
            ("/command", false),
            ("/files/info", false),
            ("/", false),
        ];
        for (path, expected) in cases {
            assert_eq!(is_warren_route(path), expected, "{path}");
        }
    }

    #[test]
    fn only_the_exact_token_matches() {
        let cases: [(&[u8], bool); 7] = [
            (b"s3cret", true),
            (b"s3creT", false),
            (b"s3cre", false),
            (b"s3cret ", false),
            (b"", false),
            (b"S3CRET", false),
            (b"x3cret", false),
        ];
        for (presented, expected) in cases {
            assert_eq!(
                token_matches("s3cret", presented),
                expected,
                "{:?}",
                String::from_utf8_lossy(presented)
            );
        }
    }
}
