//! Previews (files-terminals-previews.md "Previews"): a port the agent opened in the hands,
//! served on an origin of its own so agent-written pages never share the console's. A preview
//! is a random token (lowercase `[a-z0-9]`, 32 characters, a DNS label) bound to one session
//! and port, expiring after `--preview-ttl` and revoked with `DELETE` or the session.
//!
//! Its URL is `--preview-base-url` with `{token}` filled in. Without that flag the URL follows
//! the scheme and `Host` the console was opened with (phone.md; [`OpenedAt`]): on this machine
//! (loopback, `localhost`) `http://p-{token}.localhost:<gateway port>` (browsers resolve
//! `*.localhost` to loopback); on a DNS name `<scheme>://p-{token}.<name>:<its port>`, a
//! subdomain of the console's host; on an IP address, which has no subdomains, a port of the
//! preview's own ([`OwnPort`]): `<scheme>://<address>:<own port>/?warren_preview={token}`. The
//! scheme is `https` when the gateway serves TLS. Forwarded headers (`X-Forwarded-*`) are not
//! read: the gateway trusts no proxy.
//!
//! [`route`] runs before the API: a request whose `Host` names a preview never reaches a
//! route, and a device token presented there is refused. It is forwarded to the hands' execd
//! `/proxy/{port}/{path}` ([`crate::tunnel`], WebSocket upgrades included). Each request
//! is a use of the hands (paused ones resume). [`route`] also lends the routes it runs for
//! where their request says the console was opened (a task-local), which is how `create` and
//! `list` build URLs on that host without the API handlers passing it along.
//!
//! A preview's own port serves that preview and nothing else, to requests that present its
//! token: the URL's `?warren_preview=` once, answered by a redirect to the same path without
//! it and an `HttpOnly` cookie `warren_preview_<port>` that later requests carry (cookies ignore
//! the port, so each preview's is named after its own). The token never reaches the hands:
//! every `warren_preview` cookie and parameter is taken off first. The listener stops when the
//! preview expires, is revoked or replaced, or the gateway goes.
//!
//! With a store (`--store postgres://…`) every preview is also a row of `preview_tokens`, keyed
//! by the hex SHA-256 of its token (never the token), so any replica serves its URL: a replica
//! that does not know a token looks it up there and, when another replica owns the session
//! ([`crate::replicas::route`]), forwards the whole request (upgrades included) to the owner
//! with its `Host` (a request on an own port with the default `p-{token}.localhost`), so the
//! owner's [`route`] recognises it. A replica that takes the session over keeps the stored
//! preview and serves it itself.
//!
//! Architecture Invariant: a forwarded preview request is never forwarded again; a replica that
//! receives one and does not own the session answers 503 `OWNER_UNAVAILABLE`.
//!
//! Architecture Invariant: no preview is served on the console's origin: a preview's `Host` is
//! a subdomain or a port of its own, and a request there never reaches the API.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
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
/// The lengths of a token a default preview host may name (the spec allows 32 to 40).
const HOST_TOKEN_LENS: std::ops::RangeInclusive<usize> = 32..=40;
/// A default preview host's first label: this, then the token.
const HOST_LABEL_PREFIX: &str = "p-";
/// The query parameter of an own port's URL: the token, once.
const TOKEN_PARAM: &str = "warren_preview";
/// The cookie an own port sets is this and its port; every cookie named so is the gateway's.
const COOKIE_PREFIX: &str = "warren_preview_";

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
    /// Its port of its own, bound the first time its URL was asked for on an IP address.
    own_port: Option<OwnPort>,
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

/// `--preview-base-url`: the URL template and its host split at `{token}`.
struct Template {
    /// The URL with `{token}` (scheme, host, optional port), without a last `/`.
    base_url: String,
    /// What a preview's `Host` starts and ends with.
    host_prefix: String,
    host_suffix: String,
}

impl Template {
    fn parse(base_url: &str) -> Result<Template, String> {
        let base_url = base_url.trim_end_matches('/').to_owned();
        let host = base_url
            .split_once("://")
            .map(|(_, rest)| rest.split('/').next().unwrap_or(rest))
            .ok_or_else(|| format!("--preview-base-url {base_url:?} is not a URL"))?;
        let host = host.rsplit_once(':').map_or(host, |(name, _)| name);
        let (host_prefix, host_suffix) = host.split_once("{token}").ok_or_else(|| {
            format!("--preview-base-url {base_url:?} has no {{token}} in its host")
        })?;
        Ok(Template {
            host_prefix: host_prefix.to_ascii_lowercase(),
            host_suffix: host_suffix.to_ascii_lowercase(),
            base_url,
        })
    }
}

/// The live previews, by token.
pub struct Previews {
    by_token: Mutex<HashMap<String, Preview>>,
    ttl: Duration,
    /// The gateway's port, that of the default (loopback) URLs.
    gateway_port: u16,
    /// `--preview-base-url`; `None`: the URLs follow the host the console was opened on.
    template: Option<Template>,
}

impl Previews {
    /// `base_url` is `--preview-base-url` (`{token}` in its host); `None` makes each URL follow
    /// the request's host (see the module docs), `http://p-{token}.localhost:<gateway_port>`
    /// on this machine.
    pub fn new(
        base_url: Option<&str>,
        gateway_port: u16,
        ttl: Duration,
    ) -> Result<Previews, String> {
        Ok(Previews {
            by_token: Mutex::new(HashMap::new()),
            ttl,
            gateway_port,
            template: base_url.map(Template::parse).transpose()?,
        })
    }

    /// The console's `frame-src` on this machine: every preview origin as one CSP source. Of
    /// `--preview-base-url`, the host label that holds `{token}` and those left of it become
    /// `*` (CSP wildcards only the leftmost labels), scheme and port stay
    /// (`https://{token}.preview.example.com` → `https://*.preview.example.com`); by default
    /// `http://*.localhost:<gateway port>`. [`frame_source_of`] is a request's.
    pub fn frame_source(&self) -> String {
        self.frame_source_at(&OpenedAt::Loopback, false)
    }

    /// The `frame-src` of a console opened at `opened_at` (over HTTPS when `secure`): the
    /// origins of the URLs [`Previews::url`] gives there.
    fn frame_source_at(&self, opened_at: &OpenedAt, secure: bool) -> String {
        if let Some(template) = &self.template {
            return frame_source(&template.base_url);
        }
        let scheme = scheme(secure);
        match opened_at {
            OpenedAt::Loopback => format!("http://*.localhost:{}", self.gateway_port),
            OpenedAt::Name { name, port } => format!("{scheme}://*.{name}{}", port_suffix(*port)),
            // Any port: each preview has one of its own.
            OpenedAt::Address(address) => format!("{scheme}://{}:*", url_host(*address)),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Preview>> {
        self.by_token
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The URL of the preview `token` for the request `answering` is of (none: the default).
    /// On an IP address the preview gets its own port, bound now if it has none yet.
    fn url(
        &self,
        token: &str,
        preview: &mut Preview,
        answering: Option<&Answering>,
    ) -> Result<String, GatewayError> {
        if let Some(template) = &self.template {
            return Ok(format!("{}/", template.base_url.replace("{token}", token)));
        }
        let default = || {
            format!(
                "http://{HOST_LABEL_PREFIX}{token}.localhost:{}/",
                self.gateway_port
            )
        };
        let Some(answering) = answering else {
            return Ok(default());
        };
        let scheme = scheme(answering.secure);
        match &answering.opened_at {
            OpenedAt::Loopback => Ok(default()),
            OpenedAt::Name { name, port } => Ok(format!(
                "{scheme}://{HOST_LABEL_PREFIX}{token}.{name}{}/",
                port_suffix(*port)
            )),
            OpenedAt::Address(address) => {
                let own_port = match &preview.own_port {
                    Some(own) => own.port,
                    None => {
                        let gateway = answering.gateway.upgrade().ok_or_else(|| {
                            GatewayError::Internal("the gateway is shutting down".into())
                        })?;
                        let own = OwnPort::bind(&gateway, token, preview.expires)?;
                        let port = own.port;
                        preview.own_port = Some(own);
                        port
                    }
                };
                Ok(format!(
                    "{scheme}://{}:{own_port}/?{TOKEN_PARAM}={token}",
                    url_host(*address)
                ))
            }
        }
    }

    fn info(
        &self,
        token: &str,
        preview: &mut Preview,
        answering: Option<&Answering>,
    ) -> Result<PreviewInfo, GatewayError> {
        Ok(PreviewInfo {
            port: preview.port,
            url: self.url(token, preview, answering)?,
            expires_at: preview.expires_at.clone(),
        })
    }

    /// A new preview of `port` for the session (an earlier one of the same port is replaced),
    /// its URL on the host the request was made to. With a `store` it is written there first:
    /// a store that cannot be reached fails it.
    pub async fn create(
        &self,
        store: Option<&Store>,
        session_id: &str,
        port: u16,
    ) -> Result<PreviewInfo, GatewayError> {
        let token = new_token();
        let expires_at = chrono::Utc::now()
            + chrono::Duration::from_std(self.ttl).unwrap_or(chrono::Duration::hours(1));
        let mut preview = Preview {
            session_id: session_id.to_owned(),
            port,
            expires: Instant::now() + self.ttl,
            expires_at: expires_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            own_port: None,
        };
        // Before the store: a port that cannot be bound leaves no row behind.
        let info = self.info(&token, &mut preview, answering().as_ref())?;
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
            own_port: None,
        };
        self.insert(token.to_owned(), preview);
        Some(())
    }

    /// The session's live previews, by port, their URLs on the host the request was made to.
    /// A preview whose own port cannot be bound is listed with its default URL (and a warning
    /// in the log).
    pub fn list(&self, session_id: &str) -> Vec<PreviewInfo> {
        let answering = answering();
        let now = Instant::now();
        let mut map = self.map();
        map.retain(|_, p| p.expires > now);
        let mut list: Vec<PreviewInfo> = map
            .iter_mut()
            .filter(|(_, p)| p.session_id == session_id)
            .map(|(token, p)| {
                self.info(token, p, answering.as_ref()).unwrap_or_else(|error| {
                    tracing::warn!(session = %session_id, port = p.port, %error, "no own port for a preview");
                    PreviewInfo {
                        port: p.port,
                        url: format!(
                            "http://{HOST_LABEL_PREFIX}{token}.localhost:{}/",
                            self.gateway_port
                        ),
                        expires_at: p.expires_at.clone(),
                    }
                })
            })
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

    /// The token a `Host` header names, if it is a preview origin's: by `--preview-base-url`,
    /// or by default a first label `p-<token>` (32 to 40 of `[a-z0-9]`) of any host.
    fn token_of_host(&self, host: &str) -> Option<String> {
        let host = host.rsplit_once(':').map_or(host, |(name, _)| name);
        let host = host.to_ascii_lowercase();
        let token = match &self.template {
            Some(template) => host
                .strip_prefix(&template.host_prefix)?
                .strip_suffix(&template.host_suffix)?,
            None => {
                let (label, rest) = host.split_once('.')?;
                let token = label.strip_prefix(HOST_LABEL_PREFIX)?;
                let is_token = HOST_TOKEN_LENS.contains(&token.len())
                    && token
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
                (is_token && !rest.is_empty()).then_some(token)?
            }
        };
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

/// Where a request says the console was opened (its `Host`), as the default preview URLs
/// follow it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum OpenedAt {
    /// This machine (a loopback or unspecified address, `localhost`, `*.localhost`), or no
    /// `Host`, or one that is not a host: the URLs on `*.localhost`.
    Loopback,
    /// A DNS name (lowercase, no last dot) and the port the `Host` named: a subdomain of it.
    Name { name: String, port: Option<u16> },
    /// An IP address of another machine's reach: it has no subdomains, so a port of its own.
    Address(IpAddr),
}

impl OpenedAt {
    /// A `Host` header's value: `name[:port]`, `a.b.c.d[:port]` or `[v6][:port]`; anything
    /// else is [`OpenedAt::Loopback`].
    fn of(host: Option<&str>) -> OpenedAt {
        host.and_then(parse_host).unwrap_or(OpenedAt::Loopback)
    }
}

fn parse_host(host: &str) -> Option<OpenedAt> {
    let digits = |port: &str| -> Option<u16> {
        (!port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()))
            .then(|| port.parse().ok())
            .flatten()
    };
    if let Some(rest) = host.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        if !after.is_empty() {
            digits(after.strip_prefix(':')?)?;
        }
        return Some(at_address(IpAddr::V6(v6.parse().ok()?)));
    }
    let (name, port) = match host.split_once(':') {
        Some((name, port)) => (name, Some(digits(port)?)),
        None => (host, None),
    };
    if let Ok(v4) = name.parse::<std::net::Ipv4Addr>() {
        return Some(at_address(IpAddr::V4(v4)));
    }
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    let is_label = |label: &str| {
        (1..=63).contains(&label.len())
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    if name.len() > 253 || !name.split('.').all(is_label) {
        return None;
    }
    if name == "localhost" || name.ends_with(".localhost") {
        return Some(OpenedAt::Loopback);
    }
    Some(OpenedAt::Name { name, port })
}

fn at_address(address: IpAddr) -> OpenedAt {
    let address = address.to_canonical();
    if address.is_loopback() || address.is_unspecified() {
        OpenedAt::Loopback
    } else {
        OpenedAt::Address(address)
    }
}

fn scheme(secure: bool) -> &'static str {
    if secure { "https" } else { "http" }
}

fn port_suffix(port: Option<u16>) -> String {
    port.map(|port| format!(":{port}")).unwrap_or_default()
}

/// An address as a URL's host: IPv6 in brackets.
fn url_host(address: IpAddr) -> String {
    match address {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

/// What [`route`] lends the routes it runs for (a task-local, [`answering`]): where their
/// request says the console was opened, and the gateway, which serves previews' own ports.
#[derive(Clone)]
struct Answering {
    opened_at: OpenedAt,
    /// The gateway serves HTTPS (`--tls-cert`), so the console was opened with `https://`.
    secure: bool,
    gateway: Weak<Gateway>,
}

tokio::task_local! {
    static ANSWERING: Answering;
}

/// The [`Answering`] of the request being answered; none outside [`route`].
fn answering() -> Option<Answering> {
    ANSWERING.try_with(Answering::clone).ok()
}

/// Whether the gateway serves HTTPS.
fn serves_tls(gateway: &Gateway) -> bool {
    gateway.args.tls_cert.is_some() && gateway.args.tls_key.is_some()
}

fn host_header(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::HOST)
        .and_then(|host| host.to_str().ok())
}

/// The console's `frame-src` for a request with `headers`: the origins of the preview URLs the
/// same request would get.
pub(crate) fn frame_source_of(gateway: &Gateway, headers: &HeaderMap) -> String {
    gateway
        .previews
        .frame_source_at(&OpenedAt::of(host_header(headers)), serves_tls(gateway))
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

/// Middleware before every route: a request to a preview origin is served here; any other
/// runs with its [`Answering`].
pub async fn route(State(gateway): State<Arc<Gateway>>, request: Request, next: Next) -> Response {
    let host = host_header(request.headers()).map(str::to_owned);
    if let Some(token) = host
        .as_deref()
        .and_then(|host| gateway.previews.token_of_host(host))
    {
        return match serve(&gateway, &token, request).await {
            Ok(response) => response,
            Err(error) => error.into_response(),
        };
    }
    let answering = Answering {
        opened_at: OpenedAt::of(host.as_deref()),
        secure: serves_tls(&gateway),
        gateway: Arc::downgrade(&gateway),
    };
    ANSWERING.scope(answering, next.run(request)).await
}

/// A preview's port of its own (its URL on an IP address): a listener on the gateway's listen
/// address that serves this preview and nothing else. Dropping it stops the listener.
struct OwnPort {
    port: u16,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// What an own port's requests are checked and served with.
struct OwnPortState {
    gateway: Weak<Gateway>,
    token: String,
    port: u16,
    expires: Instant,
    /// Served over TLS: its cookie is `Secure`.
    secure: bool,
}

impl OwnPort {
    /// Binds a port on the gateway's listen address (its interfaces) and serves the preview
    /// `token` there, with the gateway's limits and TLS, until `expires` or the handle drops.
    fn bind(
        gateway: &Arc<Gateway>,
        token: &str,
        expires: Instant,
    ) -> Result<OwnPort, GatewayError> {
        let listener = std::net::TcpListener::bind(SocketAddr::new(gateway.args.listen.ip(), 0))?;
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let port = listener.local_addr()?.port();
        let tls =
            crate::tls_config(&gateway.args).map_err(|e| GatewayError::Internal(e.to_string()))?;
        let state = Arc::new(OwnPortState {
            gateway: Arc::downgrade(gateway),
            token: token.to_owned(),
            port,
            expires,
            secure: tls.is_some(),
        });
        let router = axum::Router::new()
            .fallback(serve_own_port)
            .with_state(state);
        let config = gateway.args.serve_config();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let until = async move {
            tokio::select! {
                _ = stopped => {}
                () = tokio::time::sleep_until(tokio::time::Instant::from_std(expires)) => {}
            }
        };
        tokio::spawn(async move {
            let served = match tls {
                Some(tls) => warren_http::serve_tls(listener, router, config, tls, until).await,
                None => warren_http::serve(listener, router, config, until).await,
            };
            if let Err(error) = served {
                tracing::warn!(port, %error, "a preview's own port failed");
            }
        });
        tracing::debug!(port, "a preview's own port is listening");
        Ok(OwnPort { port, _stop: stop })
    }
}

async fn serve_own_port(State(own): State<Arc<OwnPortState>>, request: Request) -> Response {
    match own_port_request(&own, request).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

/// A request on an own port: one without the preview's token (parameter or cookie) is 404 as
/// an unknown preview's; a `GET` or `HEAD` with the parameter is sent to the same path without
/// it, setting the cookie; anything else is served as on the preview's host.
async fn own_port_request(
    own: &OwnPortState,
    mut request: Request,
) -> Result<Response, PreviewError> {
    let gateway = own.gateway.upgrade().ok_or(PreviewError::NotFound)?;
    let cookie = format!("{COOKIE_PREFIX}{}", own.port);
    let matches = |value: &str| crate::auth::secret_matches(value, &own.token);
    let in_query = query_values(request.uri().query(), TOKEN_PARAM).any(matches);
    let in_cookie = cookie_values(request.headers(), &cookie).any(matches);
    if !(in_query || in_cookie) {
        return Err(PreviewError::NotFound);
    }
    if in_query {
        let path_and_query =
            without_param(request.uri().path(), request.uri().query(), TOKEN_PARAM);
        if matches!(*request.method(), Method::GET | Method::HEAD) {
            return Ok(own.redirect_setting_cookie(&cookie, &path_and_query));
        }
        *request.uri_mut() = path_and_query.parse().map_err(|_| PreviewError::NotFound)?;
    }
    // The name the owner replica's `route` knows, should the request be forwarded there.
    let host = format!("{HOST_LABEL_PREFIX}{}.localhost", own.token);
    if let Ok(host) = HeaderValue::from_str(&host) {
        request.headers_mut().insert(header::HOST, host);
    }
    serve(&gateway, &own.token, request).await
}

impl OwnPortState {
    /// 303 to `location` (a path on this port), setting the cookie `name` to the token for as
    /// long as the preview lives.
    fn redirect_setting_cookie(&self, name: &str, location: &str) -> Response {
        let max_age = self
            .expires
            .saturating_duration_since(Instant::now())
            .as_secs();
        let mut cookie = format!(
            "{name}={}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Lax",
            self.token
        );
        if self.secure {
            cookie.push_str("; Secure");
        }
        let mut response = StatusCode::SEE_OTHER.into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::LOCATION,
            HeaderValue::from_str(location).unwrap_or(HeaderValue::from_static("/")),
        );
        if let Ok(cookie) = HeaderValue::from_str(&cookie) {
            headers.insert(header::SET_COOKIE, cookie);
        }
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        headers.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        );
        response
    }
}

/// The values of the query parameter `name` (not percent-decoded: a token needs none).
fn query_values<'a>(query: Option<&'a str>, name: &'a str) -> impl Iterator<Item = &'a str> {
    query
        .unwrap_or("")
        .split('&')
        .filter_map(move |pair| pair.strip_prefix(name)?.strip_prefix('='))
}

/// `path` and `query` without the parameter `name`, as a request target.
fn without_param(path: &str, query: Option<&str>, name: &str) -> String {
    let kept: Vec<&str> = query
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty() && pair.split('=').next() != Some(name))
        .collect();
    let path = if path.is_empty() { "/" } else { path };
    if kept.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", kept.join("&"))
    }
}

/// The `(name, value)` pairs of every `Cookie` header.
fn cookie_pairs(headers: &HeaderMap) -> impl Iterator<Item = (&str, &str)> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| {
            let (name, value) = pair.split_once('=')?;
            Some((name.trim(), value.trim().trim_matches('"')))
        })
}

/// The values of the cookie `name`.
fn cookie_values<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = &'a str> {
    cookie_pairs(headers).filter_map(move |(n, value)| (n == name).then_some(value))
}

/// Takes every preview token cookie (`warren_preview_*`) off the request: the tokens are the
/// gateway's, never the previewed app's.
fn strip_token_cookies(headers: &mut HeaderMap) {
    if !cookie_pairs(headers).any(|(name, _)| name.starts_with(COOKIE_PREFIX)) {
        return;
    }
    let kept: Vec<String> = cookie_pairs(headers)
        .filter(|(name, _)| !name.starts_with(COOKIE_PREFIX))
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    headers.remove(header::COOKIE);
    if let Ok(value) = HeaderValue::from_str(&kept.join("; "))
        && !kept.is_empty()
    {
        headers.insert(header::COOKIE, value);
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
    mut request: Request,
) -> Result<Response, PreviewError> {
    strip_token_cookies(request.headers_mut());
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

    #[test]
    fn a_default_preview_host_is_p_token_under_any_host() {
        let previews = Previews::new(None, 8080, Duration::from_secs(60)).expect("default");
        let token = "abcdefghijklmnopqrstuvwxyz012345";
        let longest = format!("{token}01234567");
        let cases = [
            (format!("p-{token}.localhost:8080"), Some(token)),
            (
                format!("P-{}.Warren.Test:8443", token.to_uppercase()),
                Some(token),
            ),
            (format!("p-{token}.warren.example.com"), Some(token)),
            (format!("p-{longest}.localhost"), Some(longest.as_str())),
            (format!("p-{longest}8.localhost"), None),
            (format!("p-{token}"), None),
            (format!("p-{token}.:8080"), None),
            (format!("q-{token}.localhost"), None),
            (format!("p-{}.localhost", &token[1..]), None),
            (format!("p-{token}_.localhost"), None),
            ("warren.test:8443".to_owned(), None),
            ("192.168.1.20:8443".to_owned(), None),
        ];
        for (host, want) in cases {
            assert_eq!(previews.token_of_host(&host).as_deref(), want, "{host}");
        }
    }

    #[test]
    fn where_the_console_was_opened_table() {
        let name = |name: &str, port: Option<u16>| OpenedAt::Name {
            name: name.to_owned(),
            port,
        };
        let address = |text: &str| OpenedAt::Address(text.parse().expect("an address"));
        let cases = [
            (None, OpenedAt::Loopback),
            (Some("127.0.0.1:8080"), OpenedAt::Loopback),
            (Some("127.3.4.5"), OpenedAt::Loopback),
            (Some("[::1]:8080"), OpenedAt::Loopback),
            (Some("[::ffff:127.0.0.1]:8080"), OpenedAt::Loopback),
            (Some("0.0.0.0:8080"), OpenedAt::Loopback),
            (Some("localhost:8080"), OpenedAt::Loopback),
            (Some("LocalHost"), OpenedAt::Loopback),
            (Some("box.localhost:8080"), OpenedAt::Loopback),
            (Some("192.168.1.20:8443"), address("192.168.1.20")),
            (Some("10.0.0.7"), address("10.0.0.7")),
            (Some("[fe80::1]:8443"), address("fe80::1")),
            (Some("[::ffff:192.168.1.20]"), address("192.168.1.20")),
            (Some("warren.test:8080"), name("warren.test", Some(8080))),
            (Some("Warren.Example.COM"), name("warren.example.com", None)),
            (
                Some("warren.example.com.:443"),
                name("warren.example.com", Some(443)),
            ),
            (Some("mybox"), name("mybox", None)),
            // Not a host: the default URLs.
            (Some(""), OpenedAt::Loopback),
            (Some("warren test"), OpenedAt::Loopback),
            (Some("a:b:c"), OpenedAt::Loopback),
            (Some("warren.test:"), OpenedAt::Loopback),
            (Some("warren.test:99999"), OpenedAt::Loopback),
            (Some("warren.test:+80"), OpenedAt::Loopback),
            (Some("-warren.test"), OpenedAt::Loopback),
            (Some("warren..test"), OpenedAt::Loopback),
            (Some("warren.test/x"), OpenedAt::Loopback),
            (Some("war_ren.test"), OpenedAt::Loopback),
            (Some("[zz::1]:80"), OpenedAt::Loopback),
            (Some("[fe80::1]x"), OpenedAt::Loopback),
            (Some("\"evil\".test"), OpenedAt::Loopback),
        ];
        for (host, want) in cases {
            assert_eq!(OpenedAt::of(host), want, "{host:?}");
        }
    }

    #[test]
    fn urls_and_frame_sources_follow_the_host_table() {
        let previews = Previews::new(None, 8080, Duration::from_secs(60)).expect("default");
        let token = "abcdefghijklmnopqrstuvwxyz012345";
        let name = |name: &str, port: Option<u16>| OpenedAt::Name {
            name: name.to_owned(),
            port,
        };
        let cases = [
            (
                OpenedAt::Loopback,
                false,
                format!("http://p-{token}.localhost:8080/"),
                "http://*.localhost:8080",
            ),
            // Loopback stays plain HTTP (served there even with TLS) on `*.localhost`.
            (
                OpenedAt::Loopback,
                true,
                format!("http://p-{token}.localhost:8080/"),
                "http://*.localhost:8080",
            ),
            (
                name("warren.test", Some(8080)),
                false,
                format!("http://p-{token}.warren.test:8080/"),
                "http://*.warren.test:8080",
            ),
            (
                name("warren.example.com", None),
                true,
                format!("https://p-{token}.warren.example.com/"),
                "https://*.warren.example.com",
            ),
        ];
        for (opened_at, secure, want_url, want_source) in cases {
            let answering = Answering {
                opened_at: opened_at.clone(),
                secure,
                gateway: Weak::new(),
            };
            let mut preview = Preview {
                session_id: "s1".into(),
                port: 3000,
                expires: Instant::now() + Duration::from_secs(60),
                expires_at: String::new(),
                own_port: None,
            };
            let url = previews.url(token, &mut preview, Some(&answering));
            assert_eq!(url.expect("a URL"), want_url, "{opened_at:?}");
            assert_eq!(previews.frame_source_at(&opened_at, secure), want_source);
        }
        let address = OpenedAt::Address("192.168.1.20".parse().expect("an address"));
        assert_eq!(
            previews.frame_source_at(&address, true),
            "https://192.168.1.20:*"
        );
        let v6 = OpenedAt::Address("fe80::1".parse().expect("an address"));
        assert_eq!(previews.frame_source_at(&v6, false), "http://[fe80::1]:*");
        // `--preview-base-url` wins wherever the console was opened.
        let custom = Previews::new(
            Some("https://{token}.preview.example.com"),
            8080,
            Duration::from_secs(60),
        )
        .expect("custom");
        assert_eq!(
            custom.frame_source_at(&address, false),
            "https://*.preview.example.com"
        );
    }

    #[test]
    fn own_port_tokens_in_queries_and_cookies_table() {
        let queries = [
            (None, "/", vec![], "/"),
            (Some("warren_preview=abc"), "/", vec!["abc"], "/"),
            (
                Some("a=1&warren_preview=abc&b=2"),
                "/x",
                vec!["abc"],
                "/x?a=1&b=2",
            ),
            (
                Some("warren_preview_x=1&warren_previewx=2"),
                "/",
                vec![],
                "/?warren_preview_x=1&warren_previewx=2",
            ),
            (Some("warren_preview"), "/", vec![], "/"),
            (Some("&&"), "/p", vec![], "/p"),
        ];
        for (query, path, want, want_target) in queries {
            let values: Vec<&str> = query_values(query, TOKEN_PARAM).collect();
            assert_eq!(values, want, "{query:?}");
            assert_eq!(
                without_param(path, query, TOKEN_PARAM),
                want_target,
                "{query:?}"
            );
        }

        let mut headers = HeaderMap::new();
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("theme=dark; warren_preview_4000=abc"),
        );
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("warren_preview_4001=\"def\";session=1"),
        );
        assert_eq!(
            cookie_values(&headers, "warren_preview_4000").collect::<Vec<_>>(),
            ["abc"]
        );
        assert_eq!(
            cookie_values(&headers, "warren_preview_4001").collect::<Vec<_>>(),
            ["def"]
        );
        strip_token_cookies(&mut headers);
        assert_eq!(
            headers.get_all(header::COOKIE).iter().collect::<Vec<_>>(),
            ["theme=dark; session=1"]
        );
        let mut only_tokens = HeaderMap::new();
        only_tokens.insert(
            header::COOKIE,
            HeaderValue::from_static("warren_preview_1=x"),
        );
        strip_token_cookies(&mut only_tokens);
        assert!(only_tokens.get(header::COOKIE).is_none());
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
