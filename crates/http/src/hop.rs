//! What Warren's proxies (execd's `/proxy`, the gateway's previews, terminals and model proxy)
//! forward of a request's or answer's headers: everything but the hop-by-hop ones (RFC 9110
//! §7.6.1, the `proxy-*` credentials of one hop, and whatever `Connection` names) and `Host`,
//! which belongs to the next hop. A WebSocket upgrade keeps `Connection: upgrade` and
//! `Upgrade`.

use axum::http::{HeaderMap, HeaderValue, header};

/// The headers of one connection, never forwarded as they are.
pub const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-connection",
];

/// Whether a request asks to switch protocols (`Connection: upgrade` and an `Upgrade`).
pub fn wants_upgrade(headers: &HeaderMap) -> bool {
    connection_tokens(headers).any(|token| token == "upgrade")
        && headers.contains_key(header::UPGRADE)
}

/// `headers` without hop-by-hop ones and `Host`; with `upgrade`, `Connection: upgrade` and
/// `Upgrade` stay.
pub fn forwardable(headers: &HeaderMap, upgrade: bool) -> HeaderMap {
    let named: Vec<String> = connection_tokens(headers).collect();
    let mut kept = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let lower = name.as_str();
        let hop = HOP_BY_HOP.contains(&lower)
            || lower.starts_with("proxy-")
            || named.iter().any(|n| n == lower);
        if hop || name == header::HOST {
            continue;
        }
        kept.append(name.clone(), value.clone());
    }
    if upgrade {
        if let Some(value) = headers.get(header::UPGRADE) {
            kept.insert(header::UPGRADE, value.clone());
        }
        kept.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    kept
}

/// The lowercase tokens of every `Connection` header.
fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = String> + '_ {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|token| token.trim().to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderName;

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        headers
    }

    #[test]
    fn hop_by_hop_headers_and_host_stay_behind() {
        let all = headers(&[
            ("connection", "keep-alive, x-private"),
            ("keep-alive", "timeout=5"),
            ("x-private", "1"),
            ("proxy-authorization", "Basic x"),
            ("transfer-encoding", "chunked"),
            ("host", "gateway"),
            ("te", "trailers"),
            ("content-type", "application/json"),
            ("cookie", "a=b"),
        ]);
        let kept = forwardable(&all, false);
        let names: Vec<&str> = kept.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["content-type", "cookie"]);
    }

    #[test]
    fn an_upgrade_keeps_connection_and_upgrade() {
        let all = headers(&[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-key", "k"),
        ]);
        assert!(wants_upgrade(&all));
        let kept = forwardable(&all, true);
        assert_eq!(
            kept.get(header::UPGRADE).map(|v| v.as_bytes()),
            Some(&b"websocket"[..])
        );
        assert_eq!(
            kept.get(header::CONNECTION).map(|v| v.as_bytes()),
            Some(&b"upgrade"[..])
        );
        assert!(kept.contains_key("sec-websocket-key"));
        let no_upgrade_header = headers(&[("connection", "upgrade")]);
        assert!(!wants_upgrade(&no_upgrade_header));
    }
}
