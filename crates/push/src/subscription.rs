//! A browser's push subscription and where pushes may go.
//!
//! [`Subscription::new`] takes what a browser's `PushSubscription` holds and refuses, each with
//! its reason: an endpoint [`AllowedEndpoints`] does not allow, a `p256dh` that is not an
//! uncompressed P-256 point, an `auth` that is not 16 bytes. [`AllowedEndpoints`] is
//! `--push-allow-endpoint`: with no prefix, any `https://` URL whose host is a name or a public
//! address (never loopback, private, link-local or `localhost`: the gateway does not post to its
//! own network for a device); with prefixes, only URLs under one of them, compared by origin
//! and then path, so `https://push.example.com` does not let `https://push.example.com.evil/` in.
//! The same check runs before every send.

use std::net::IpAddr;

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use web_push_native::p256::PublicKey;

/// base64url as browsers write it (without padding), and with padding too.
pub(crate) const URL_SAFE_ANY_PADDING: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The longest endpoint taken (push services' are a few hundred characters).
pub const ENDPOINT_MAX_CHARS: usize = 2048;
/// The length of a subscription's `auth` secret (RFC 8291).
const AUTH_BYTES: usize = 16;
/// The length of an uncompressed P-256 point.
const P256_POINT_BYTES: usize = 65;

/// Why a subscription was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubscriptionError {
    #[error("endpoint: {0}")]
    Endpoint(String),
    #[error("keys.p256dh must be an uncompressed P-256 point (65 bytes, base64url)")]
    P256dh,
    #[error("keys.auth must be 16 bytes, base64url")]
    Auth,
}

/// A browser's push subscription: where to send, and the keys to encrypt for.
#[derive(Clone, PartialEq, Eq)]
pub struct Subscription {
    /// The push service's URL for this browser.
    pub endpoint: String,
    /// The browser's P-256 public key, base64url.
    pub p256dh: String,
    /// The browser's authentication secret, base64url.
    pub auth: String,
}

// Hand-written: an endpoint is a capability URL and `auth` a secret; logs get the origin.
impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("endpoint", &origin_of(&self.endpoint))
            .finish_non_exhaustive()
    }
}

impl Subscription {
    /// A subscription a browser made, checked: the endpoint `allowed`, the keys well-formed.
    pub fn new(
        endpoint: &str,
        p256dh: &str,
        auth: &str,
        allowed: &AllowedEndpoints,
    ) -> Result<Subscription, SubscriptionError> {
        allowed
            .check(endpoint)
            .map_err(SubscriptionError::Endpoint)?;
        let subscription = Subscription {
            endpoint: endpoint.to_owned(),
            p256dh: p256dh.to_owned(),
            auth: auth.to_owned(),
        };
        subscription.keys()?;
        Ok(subscription)
    }

    /// The browser's public key and secret, decoded.
    pub(crate) fn keys(&self) -> Result<(PublicKey, web_push_native::Auth), SubscriptionError> {
        let point = URL_SAFE_ANY_PADDING
            .decode(self.p256dh.trim())
            .map_err(|_| SubscriptionError::P256dh)?;
        if point.len() != P256_POINT_BYTES || point[0] != 0x04 {
            return Err(SubscriptionError::P256dh);
        }
        let public = PublicKey::from_sec1_bytes(&point).map_err(|_| SubscriptionError::P256dh)?;
        let auth = URL_SAFE_ANY_PADDING
            .decode(self.auth.trim())
            .map_err(|_| SubscriptionError::Auth)?;
        if auth.len() != AUTH_BYTES {
            return Err(SubscriptionError::Auth);
        }
        Ok((public, web_push_native::Auth::clone_from_slice(&auth)))
    }
}

/// The origin of `endpoint` for logs (`https://push.example.com`), or `?` when it has none.
pub(crate) fn origin_of(endpoint: &str) -> String {
    parse(endpoint).map_or_else(|_| "?".to_owned(), |endpoint| endpoint.origin())
}

/// An endpoint URL, parsed.
#[derive(Debug, Clone)]
pub struct Endpoint {
    uri: http::Uri,
    scheme: String,
    host: String,
    port: u16,
}

impl Endpoint {
    /// `scheme://host[:port]`, the port only when not the scheme's default: the VAPID `aud`.
    pub fn origin(&self) -> String {
        let default_port = if self.scheme == "https" { 443 } else { 80 };
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.port == default_port {
            format!("{}://{host}", self.scheme)
        } else {
            format!("{}://{host}:{}", self.scheme, self.port)
        }
    }

    pub fn uri(&self) -> &http::Uri {
        &self.uri
    }

    fn path(&self) -> &str {
        self.uri.path()
    }
}

/// Parses an absolute `http` or `https` URL with a host, no user info and nothing odd in it.
fn parse(text: &str) -> Result<Endpoint, String> {
    if text.len() > ENDPOINT_MAX_CHARS {
        return Err(format!("longer than {ENDPOINT_MAX_CHARS} characters"));
    }
    let uri: http::Uri = text.parse().map_err(|_| "not a URL".to_owned())?;
    let scheme = match uri.scheme_str() {
        Some(scheme @ ("http" | "https")) => scheme.to_owned(),
        _ => return Err("not an http(s) URL".to_owned()),
    };
    let authority = uri.authority().ok_or("no host")?;
    if authority.as_str().contains('@') {
        return Err("user info in the URL".to_owned());
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    if host.is_empty() {
        return Err("no host".to_owned());
    }
    let port = authority
        .port_u16()
        .unwrap_or(if scheme == "https" { 443 } else { 80 });
    Ok(Endpoint {
        uri,
        scheme,
        host,
        port,
    })
}

/// Where pushes may go (`--push-allow-endpoint`); see the module docs.
#[derive(Debug, Clone, Default)]
pub struct AllowedEndpoints {
    prefixes: Vec<Endpoint>,
}

impl AllowedEndpoints {
    /// `prefixes` as `--push-allow-endpoint` gives them; none: any public `https://` URL.
    pub fn new(prefixes: &[String]) -> Result<AllowedEndpoints, String> {
        let prefixes = prefixes
            .iter()
            .map(|prefix| {
                parse(prefix).map_err(|why| format!("--push-allow-endpoint {prefix:?}: {why}"))
            })
            .collect::<Result<_, _>>()?;
        Ok(AllowedEndpoints { prefixes })
    }

    /// `endpoint` parsed, if pushes may go there; else why not.
    pub fn check(&self, endpoint: &str) -> Result<Endpoint, String> {
        let parsed = parse(endpoint)?;
        if self.prefixes.is_empty() {
            if parsed.scheme != "https" {
                return Err("not an https:// URL".to_owned());
            }
            if !public_host(&parsed.host) {
                return Err(format!(
                    "{} is not a public host (use --push-allow-endpoint to allow it)",
                    parsed.host
                ));
            }
            return Ok(parsed);
        }
        let under = |prefix: &Endpoint| {
            prefix.scheme == parsed.scheme
                && prefix.host == parsed.host
                && prefix.port == parsed.port
                && parsed.path().starts_with(prefix.path())
        };
        if self.prefixes.iter().any(under) {
            Ok(parsed)
        } else {
            Err("not under any --push-allow-endpoint prefix".to_owned())
        }
    }
}

/// Whether `host` (lowercase, without brackets) is a name other than `localhost`, or an
/// address of the public internet.
fn public_host(host: &str) -> bool {
    if host == "localhost" || host.ends_with(".localhost") {
        return false;
    }
    let Ok(ip) = host.parse::<IpAddr>() else {
        return true;
    };
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_documentation()
                || v4.octets()[0] == 100 && (v4.octets()[1] & 0xc0) == 64)
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real subscription's keys (RFC 8291's example).
    const P256DH: &str =
        "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4";
    const AUTH: &str = "BTBZMqHH6r4Tts7J_aSIgg";

    #[test]
    fn endpoints_by_default_any_public_https_url() {
        let any = AllowedEndpoints::default();
        let cases = [
            ("https://fcm.googleapis.com/fcm/send/abc", true),
            ("https://updates.push.services.mozilla.com/wpush/v2/x", true),
            ("https://web.push.apple.com/QF8w", true),
            ("https://8.8.8.8/push", true),
            ("http://fcm.googleapis.com/fcm/send/abc", false),
            ("https://localhost/push", false),
            ("https://a.localhost/push", false),
            ("https://127.0.0.1/push", false),
            ("https://10.1.2.3/push", false),
            ("https://192.168.0.9/push", false),
            ("https://169.254.169.254/latest", false),
            ("https://100.64.0.1/x", false),
            ("https://[::1]/push", false),
            ("https://[fd00::1]/push", false),
            ("https://[::ffff:127.0.0.1]/push", false),
            ("https://user:pw@push.example.com/x", false),
            ("ftp://push.example.com/x", false),
            ("/relative/only", false),
            ("not a url", false),
            ("", false),
        ];
        for (endpoint, allowed) in cases {
            assert_eq!(any.check(endpoint).is_ok(), allowed, "{endpoint}");
        }
        let long = format!(
            "https://push.example.com/{}",
            "a".repeat(ENDPOINT_MAX_CHARS)
        );
        assert!(any.check(&long).is_err(), "a very long endpoint");
    }

    #[test]
    fn endpoints_with_prefixes_only_under_them_by_origin_then_path() {
        let allowed = AllowedEndpoints::new(&[
            "http://127.0.0.1:4000/push/".to_owned(),
            "https://push.example.com".to_owned(),
        ])
        .expect("prefixes parse");
        let cases = [
            ("http://127.0.0.1:4000/push/abc", true),
            ("http://127.0.0.1:4000/other/abc", false),
            ("http://127.0.0.1:4001/push/abc", false),
            ("https://127.0.0.1:4000/push/abc", false),
            ("https://push.example.com/x", true),
            ("https://PUSH.example.com:443/x", true),
            ("https://push.example.com.evil.org/x", false),
            ("https://push.example.com:8443/x", false),
            ("https://fcm.googleapis.com/fcm/send/abc", false),
        ];
        for (endpoint, ok) in cases {
            assert_eq!(allowed.check(endpoint).is_ok(), ok, "{endpoint}");
        }
        assert!(AllowedEndpoints::new(&["push.example.com".to_owned()]).is_err());
    }

    #[test]
    fn origins_keep_a_port_that_is_not_the_schemes_default() {
        let allowed = AllowedEndpoints::new(&[
            "http://127.0.0.1:4000/".to_owned(),
            "https://push.example.com/".to_owned(),
            "http://[::1]:81/".to_owned(),
        ])
        .expect("prefixes parse");
        let cases = [
            ("http://127.0.0.1:4000/p", "http://127.0.0.1:4000"),
            ("https://push.example.com:443/p", "https://push.example.com"),
            ("http://[::1]:81/p", "http://[::1]:81"),
        ];
        for (endpoint, origin) in cases {
            let parsed = allowed.check(endpoint).expect(endpoint);
            assert_eq!(parsed.origin(), origin);
        }
    }

    #[test]
    fn subscription_keys_are_checked() {
        let any = AllowedEndpoints::default();
        let endpoint = "https://push.example.com/x";
        assert!(Subscription::new(endpoint, P256DH, AUTH, &any).is_ok());
        let padded_auth = format!("{AUTH}==");
        assert!(Subscription::new(endpoint, P256DH, &padded_auth, &any).is_ok());
        let not_on_curve = format!("BA{}", &P256DH[2..]);
        let compressed = "AyVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcx";
        let cases = [
            (P256DH, "", SubscriptionError::Auth),
            (P256DH, "AAAA", SubscriptionError::Auth),
            (P256DH, "!!!!", SubscriptionError::Auth),
            ("", AUTH, SubscriptionError::P256dh),
            (compressed, AUTH, SubscriptionError::P256dh),
            (not_on_curve.as_str(), AUTH, SubscriptionError::P256dh),
            ("not base64 at all", AUTH, SubscriptionError::P256dh),
        ];
        for (p256dh, auth, error) in cases {
            assert_eq!(
                Subscription::new(endpoint, p256dh, auth, &any),
                Err(error),
                "{p256dh} {auth}"
            );
        }
        assert!(matches!(
            Subscription::new("http://push.example.com/x", P256DH, AUTH, &any),
            Err(SubscriptionError::Endpoint(_))
        ));
    }

    #[test]
    fn debug_shows_the_origin_only() {
        let any = AllowedEndpoints::default();
        let subscription =
            Subscription::new("https://push.example.com/secret-path", P256DH, AUTH, &any)
                .expect("valid");
        let shown = format!("{subscription:?}");
        assert!(shown.contains("https://push.example.com"), "{shown}");
        assert!(
            !shown.contains("secret-path") && !shown.contains(AUTH),
            "{shown}"
        );
    }
}
