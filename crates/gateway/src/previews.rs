//! Previews (files-terminals-previews.md "Previews"): a port the agent opened in the hands,
//! served on an origin of its own so agent-written pages never share the console's. A preview
//! is a random token (lowercase `[a-z0-9]`, 32 characters, a DNS label) bound to one session
//! and port, expiring after `--preview-ttl` and revoked with `DELETE` or the session.
//!
//! Its URL is `--preview-base-url` with `{token}` filled in (default
//! `http://p-{token}.localhost:<gateway port>`: browsers resolve `*.localhost` to loopback).
//! [`route`] runs before the API: a request whose `Host` names a preview never reaches a
//! route, and a device token presented there is refused. It is forwarded to the hands' execd
//! `/proxy/{port}/{path}` ([`crate::tunnel`], WebSocket upgrades included). Each request
//! is a use of the hands (paused ones resume).
//!
//! With a store (`--store postgres://…`) every preview is also a row of `preview_tokens`, keyed
//! by the hex SHA-256 of its token (never the token), so any replica serves its URL: a replica
//! that does not know a token looks it up there and, when another replica owns the session
//! ([`crate::replicas::route`]), forwards the whole request (upgrades included) to the owner
//! with its `Host`, so the owner's [`route`] recognises it. A replica that takes the session
//! over keeps the stored preview and serves it itself.
//!
//! Architecture Invariant: a forwarded preview request is never forwarded again; a replica that
//! receives one and does not own the session answers 503 `OWNER_UNAVAILABLE`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use warren_store::pg::Store;

use crate::Gateway;
use crate::error::GatewayError;
use crate::replicas::Route;

/// Token length: 32 characters of `[a-z0-9]`, about 165 bits.
const TOKEN_LEN: usize = 32;

/// One preview as the routes answer it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct PreviewInfo {
    pub port: u16,
    pub url: String,
    /// RFC 3339.
    pub expires_at: String,
}

struct Preview {
    session_id: String,
    port: u16,
    expires: Instant,
    expires_at: String,
}

/// A preview's record in the store's `preview_tokens` (its session and token hash are columns).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    port: u16,
    /// RFC 3339.
    expires_at: String,
}

/// The store's key of a token: its hex SHA-256.
fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// What the store matches to find every token of a session's port.
fn port_match(port: u16) -> serde_json::Value {
    serde_json::json!({ "port": port })
}

/// The live previews, by token.
pub struct Previews {
    by_token: Mutex<HashMap<String, Preview>>,
    ttl: Duration,
    /// The URL template with `{token}` (scheme, host, optional port).
    base_url: String,
    /// The host template split at `{token}`: what a preview's `Host` starts and ends with.
    host_prefix: String,
    host_suffix: String,
}

impl Previews {
    /// `base_url` is `--preview-base-url` (`{token}` in its host); `None` is
    /// `http://p-{token}.localhost:<gateway_port>`.
    pub fn new(
        base_url: Option<&str>,
        gateway_port: u16,
        ttl: Duration,
    ) -> Result<Previews, String> {
        let base_url = base_url
            .map(|url| url.trim_end_matches('/').to_owned())
            .unwrap_or_else(|| format!("http://p-{{token}}.localhost:{gateway_port}"));
        let host = base_url
            .split_once("://")
            .map(|(_, rest)| rest.split('/').next().unwrap_or(rest))
            .ok_or_else(|| format!("--preview-base-url {base_url:?} is not a URL"))?;
        let host = host.rsplit_once(':').map_or(host, |(name, _)| name);
        let (host_prefix, host_suffix) = host.split_once("{token}").ok_or_else(|| {
            format!("--preview-base-url {base_url:?} has no {{token}} in its host")
        })?;
        Ok(Previews {
            by_token: Mutex::new(HashMap::new()),
            ttl,
            host_prefix: host_prefix.to_ascii_lowercase(),
            host_suffix: host_suffix.to_ascii_lowercase(),
            base_url,
        })
    }

    /// Every preview origin as one CSP source, the console's `frame-src`: the host label that
    /// holds `{token}` and those left of it become `*` (CSP wildcards only the leftmost labels),
    /// scheme and port stay (`http://p-{token}.localhost:8080` → `http://*.localhost:8080`,
    /// `https://{token}.preview.example.com` → `https://*.preview.example.com`).
    pub fn frame_source(&self) -> String {
        frame_source(&self.base_url)
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Preview>> {
        self.by_token
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn info(&self, token: &str, preview: &Preview) -> PreviewInfo {
        PreviewInfo {
            port: preview.port,
            url: format!("{}/", self.base_url.replace("{token}", token)),
            expires_at: preview.expires_at.clone(),
        }
    }

    /// A new preview of `port` for the session (an earlier one of the same port is replaced).
    /// With a `store` it is written there first: a store that cannot be reached fails it.
    pub async fn create(
        &self,
        store: Option<&Store>,
        session_id: &str,
        port: u16,
    ) -> Result<PreviewInfo, GatewayError> {
        let token = new_token();
        let expires_at = chrono::Utc::now()
            + chrono::Duration::from_std(self.ttl).unwrap_or(chrono::Duration::hours(1));
        let preview = Preview {
            session_id: session_id.to_owned(),
            port,
            expires: Instant::now() + self.ttl,
            expires_at: expires_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        };
        if let Some(store) = store {
            let record = Record {
                port,
                expires_at: preview.expires_at.clone(),
            };
            let record =
                serde_json::to_value(&record).map_err(|e| GatewayError::Internal(e.to_string()))?;
            store
                .delete_preview_tokens_matching(session_id, &port_match(port))
                .await?;
            store
                .put_preview_token(
                    &token_hash(&token),
                    session_id,
                    &record,
                    expires_at.timestamp_millis(),
                )
                .await?;
        }
        let info = self.info(&token, &preview);
        self.insert(token, preview);
        Ok(info)
    }

    /// Puts `preview` under `token`, replacing the session's earlier preview of its port.
    fn insert(&self, token: String, preview: Preview) {
        let mut map = self.map();
        map.retain(|_, p| !(p.session_id == preview.session_id && p.port == preview.port));
        map.insert(token, preview);
    }

    /// Keeps a preview found in the store (this replica owns its session now); `None` when its
    /// record's expiry does not parse.
    fn adopt(&self, token: &str, session_id: &str, record: &Record) -> Option<()> {
        let expires_at = chrono::DateTime::parse_from_rfc3339(&record.expires_at).ok()?;
        let left = (expires_at.with_timezone(&chrono::Utc) - chrono::Utc::now())
            .to_std()
            .unwrap_or(Duration::ZERO);
        let preview = Preview {
            session_id: session_id.to_owned(),
            port: record.port,
            expires: Instant::now() + left,
            expires_at: record.expires_at.clone(),
        };
        self.insert(token.to_owned(), preview);
        Some(())
    }

    /// The session's live previews, by port.
    pub fn list(&self, session_id: &str) -> Vec<PreviewInfo> {
        let now = Instant::now();
        let mut map = self.map();
        map.retain(|_, p| p.expires > now);
        let mut list: Vec<PreviewInfo> = map
            .iter()
            .filter(|(_, p)| p.session_id == session_id)
            .map(|(token, p)| self.info(token, p))
            .collect();
        list.sort_by_key(|p| p.port);
        list
    }

    /// Revokes the session's preview of `port`, in the `store` first (its row goes whichever
    /// replica made it); false when there was none.
    pub async fn revoke(
        &self,
        store: Option<&Store>,
        session_id: &str,
        port: u16,
    ) -> Result<bool, GatewayError> {
        let stored = match store {
            Some(store) => {
                store
                    .delete_preview_tokens_matching(session_id, &port_match(port))
                    .await?
                    > 0
            }
            None => false,
        };
        let mut map = self.map();
        let before = map.len();
        map.retain(|_, p| !(p.session_id == session_id && p.port == port));
        Ok(map.len() < before || stored)
    }

    /// Revokes every preview of the session (it is deleted).
    pub fn revoke_session(&self, session_id: &str) {
        self.map().retain(|_, p| p.session_id != session_id);
    }

    /// The token a `Host` header names, if it is a preview origin's.
    fn token_of_host(&self, host: &str) -> Option<String> {
        let host = host.rsplit_once(':').map_or(host, |(name, _)| name);
        let host = host.to_ascii_lowercase();
        let token = host
            .strip_prefix(&self.host_prefix)?
            .strip_suffix(&self.host_suffix)?;
        Some(token.to_owned())
    }

    /// The live preview of `token`: its session and port.
    fn lookup(&self, token: &str) -> Option<(String, u16)> {
        let mut map = self.map();
        match map.get(token) {
            Some(p) if p.expires > Instant::now() => Some((p.session_id.clone(), p.port)),
            Some(_) => {
                map.remove(token);
                None
            }
            None => None,
        }
    }
}

/// [`Previews::frame_source`] of a URL template that [`Previews::new`] accepted.
fn frame_source(base_url: &str) -> String {
    let (scheme, rest) = base_url.split_once("://").unwrap_or(("https", base_url));
    let authority = rest.split('/').next().unwrap_or(rest);
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (authority, None),
    };
    let labels: Vec<&str> = host.split('.').collect();
    let after_token = labels
        .iter()
        .position(|label| label.contains("{token}"))
        .map_or(&labels[..], |at| &labels[at + 1..]);
    let mut source = format!("{}://*", scheme.to_ascii_lowercase());
    for label in after_token {
        source.push('.');
        source.push_str(&label.to_ascii_lowercase());
    }
    if let Some(port) = port {
        source.push(':');
        source.push_str(port);
    }
    source
}

fn new_token() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..TOKEN_LEN)
        .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// The port of a preview request body or path: 1 to 65535.
pub fn parse_port(port: i64) -> Result<u16, GatewayError> {
    u16::try_from(port)
        .ok()
        .filter(|port| *port > 0)
        .ok_or_else(|| GatewayError::InvalidRequest(format!("{port} is not a port (1 to 65535)")))
}

/// Middleware before every route: a request to a preview origin is served here.
pub async fn route(State(gateway): State<Arc<Gateway>>, request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|host| host.to_str().ok())
        .map(str::to_owned);
    let Some(token) = host.and_then(|host| gateway.previews.token_of_host(&host)) else {
        return next.run(request).await;
    };
    match serve(&gateway, &token, request).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

/// Why a preview request was not served.
enum PreviewError {
    NotFound,
    DeviceToken,
    Unreachable(String),
    /// The store or the session's owner (another replica) is away.
    Gateway(GatewayError),
}

impl From<GatewayError> for PreviewError {
    fn from(error: GatewayError) -> Self {
        PreviewError::Gateway(error)
    }
}

impl IntoResponse for PreviewError {
    fn into_response(self) -> Response {
        let (status, code, message) = match self {
            PreviewError::NotFound => (
                StatusCode::NOT_FOUND,
                "PREVIEW_NOT_FOUND",
                "no such preview: unknown, expired or revoked".to_owned(),
            ),
            PreviewError::DeviceToken => (
                StatusCode::FORBIDDEN,
                "DEVICE_TOKEN_REFUSED",
                "a device token is never accepted on a preview origin".to_owned(),
            ),
            PreviewError::Unreachable(why) => (StatusCode::BAD_GATEWAY, "PREVIEW_UNREACHABLE", why),
            PreviewError::Gateway(error) => return error.into_response(),
        };
        warren_http::error_response(status, code, message)
    }
}

async fn serve(
    gateway: &Arc<Gateway>,
    token: &str,
    request: Request,
) -> Result<Response, PreviewError> {
    let (session_id, port, stored) = match gateway.previews.lookup(token) {
        Some((session_id, port)) => (session_id, port, None),
        None => {
            let (session_id, record) = stored(gateway, token)
                .await?
                .ok_or(PreviewError::NotFound)?;
            (session_id, record.port, Some(record))
        }
    };
    if carries_device_token(gateway, presented_tokens(&request)).await {
        return Err(PreviewError::DeviceToken);
    }
    let session = crate::owner::session_for_request(gateway, &session_id)
        .await?
        .ok_or(PreviewError::NotFound)?;
    if let Route::There { url, expires_in } = crate::replicas::route(&gateway.engine, &session)
        .await
        .map_err(GatewayError::from)?
    {
        return Ok(crate::owner::forward(gateway, &url, request, expires_in).await?);
    }
    if let Some(record) = stored {
        gateway
            .previews
            .adopt(token, &session_id, &record)
            .ok_or(PreviewError::NotFound)?;
    }
    let endpoint = session
        .hands
        .endpoint()
        .await
        .map_err(|e| PreviewError::Unreachable(format!("the hands did not start: {e}")))?;
    let path = request.uri().path_and_query().map_or("/", |pq| pq.as_str());
    let upstream_path = format!("/proxy/{port}{path}");
    let answer = crate::tunnel::forward(&endpoint, &upstream_path, request, ())
        .await
        .map_err(|e| PreviewError::Unreachable(e.to_string()))?;
    if answer.status() == StatusCode::BAD_GATEWAY {
        return Err(PreviewError::Unreachable(format!(
            "nothing answers at port {port} in the hands"
        )));
    }
    Ok(answer)
}

/// The stored preview of `token` (none without a store): its session and record.
async fn stored(gateway: &Gateway, token: &str) -> Result<Option<(String, Record)>, GatewayError> {
    let Some(store) = gateway.engine.sessions.store() else {
        return Ok(None);
    };
    let Some((session_id, record)) = store.preview_token(&token_hash(token)).await? else {
        return Ok(None);
    };
    match serde_json::from_value(record) {
        Ok(record) => Ok(Some((session_id, record))),
        Err(e) => {
            tracing::warn!(session = %session_id, error = %e, "a stored preview does not parse");
            Ok(None)
        }
    }
}

/// Whether one of the request's tokens is a device token.
async fn carries_device_token(gateway: &Gateway, tokens: Vec<String>) -> bool {
    for token in tokens {
        if gateway.devices.authenticate(&token).await.is_ok() {
            return true;
        }
    }
    false
}

/// The tokens a request presents (bearer or `?access_token=`).
fn presented_tokens(request: &Request) -> Vec<String> {
    let bearer = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(crate::auth::bearer_token)
        .map(str::to_owned);
    let query = request.uri().query().and_then(|query| {
        query
            .split('&')
            .find_map(|pair| pair.strip_prefix("access_token=").map(str::to_owned))
    });
    [bearer, query].into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_preview_host_names_its_token_and_other_hosts_do_not() {
        let previews = Previews::new(None, 8080, Duration::from_secs(60)).expect("default");
        let token = "abcdefghijklmnopqrstuvwxyz012345";
        assert_eq!(
            previews
                .token_of_host(&format!("p-{token}.localhost:8080"))
                .as_deref(),
            Some(token)
        );
        assert_eq!(previews.token_of_host("127.0.0.1:8080"), None);
        assert_eq!(previews.token_of_host("localhost:8080"), None);
        let custom = Previews::new(
            Some("https://{token}.preview.example.com"),
            8080,
            Duration::from_secs(60),
        )
        .expect("custom");
        assert_eq!(
            custom
                .token_of_host(&format!("{token}.preview.example.com"))
                .as_deref(),
            Some(token)
        );
        assert!(Previews::new(Some("https://preview.example.com"), 1, Duration::ZERO).is_err());
    }

    #[test]
    fn the_frame_source_covers_every_preview_origin_table() {
        let cases = [
            ("http://p-{token}.localhost:8080", "http://*.localhost:8080"),
            (
                "https://{token}.preview.example.com",
                "https://*.preview.example.com",
            ),
            (
                "https://Preview-{token}.Example.com:8443/app",
                "https://*.example.com:8443",
            ),
            ("http://a.{token}.example.com", "http://*.example.com"),
            ("http://{token}:9000", "http://*:9000"),
        ];
        for (template, want) in cases {
            assert_eq!(frame_source(template), want, "{template}");
        }
        let previews = Previews::new(None, 41234, Duration::from_secs(60)).expect("default");
        assert_eq!(previews.frame_source(), "http://*.localhost:41234");
    }

    #[tokio::test]
    async fn tokens_are_dns_labels_and_previews_expire_and_revoke() {
        let previews = Previews::new(None, 8080, Duration::from_secs(60)).expect("default");
        let info = previews.create(None, "s1", 3000).await.expect("made");
        let token = info
            .url
            .strip_prefix("http://p-")
            .and_then(|rest| rest.strip_suffix(".localhost:8080/"))
            .expect("the default URL shape");
        assert_eq!(token.len(), TOKEN_LEN);
        assert!(
            token
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        );
        assert_eq!(previews.lookup(token), Some(("s1".to_owned(), 3000)));
        assert_eq!(previews.list("s1"), std::slice::from_ref(&info));
        assert!(previews.revoke(None, "s1", 3000).await.expect("revoked"));
        assert!(!previews.revoke(None, "s1", 3000).await.expect("answers"));
        assert_eq!(previews.lookup(token), None);
        let expired = Previews::new(None, 8080, Duration::ZERO).expect("default");
        let info = expired.create(None, "s1", 3000).await.expect("made");
        assert!(expired.list("s1").is_empty(), "{info:?} expired at once");
    }
}
