//! Bearer secrets: made (`new_secret`, 256 random bits after a prefix that names their kind)
//! and read from an `Authorization` header (`bearer_token`).

use base64::Engine as _;

/// A new secret: `prefix` and 32 random bytes, URL-safe base64 without padding.
pub fn new_secret(prefix: &str) -> String {
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes);
    format!(
        "{prefix}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// The token of an `Authorization` header value using the Bearer scheme, whose name is
/// case-insensitive (RFC 9110 §11.1: `bearer`, `BEARER` are the same scheme). Blanks around the
/// token are ignored; another scheme or an empty token is `None`.
pub fn bearer_token(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.trim_start().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}
