//! The optional access token: every route but `GET /ping` needs `X-EXECD-ACCESS-TOKEN`,
//! compared in constant time. The 401 body is OpenSandbox's, byte for byte.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

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
    if request.uri().path() == "/ping" {
        return next.run(request).await;
    }
    let presented = request
        .headers()
        .get(ACCESS_TOKEN_HEADER)
        .map(|v| v.as_bytes());
    if presented.is_some_and(|p| token_matches(&expected, p)) {
        return next.run(request).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        axum::Json(serde_json::json!({
            "error": "Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"
        })),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::token_matches;

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
