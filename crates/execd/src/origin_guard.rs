//! The guard in front of execd's and envd's TCP listeners against requests a web page makes the
//! user's browser send: a page of any site may POST a form (a `multipart/form-data` upload)
//! to `http://127.0.0.1:44772` without a CORS preflight, open a WebSocket there, or rebind its
//! own name to 127.0.0.1 (DNS rebinding) and then talk to the daemon as if it were its own
//! origin. Two checks, as Jupyter, Vite and Docker's advice have them:
//!
//! - `Host` (against DNS rebinding): a browser always sends the name in the URL it fetched, so
//!   a rebound page sends its own name. A loopback listener answers only loopback names
//!   (`localhost`, `*.localhost`, which browsers resolve to loopback only), loopback IP
//!   literals and the names of `--allowed-host` (Jupyter's `local_hostnames`, Vite's
//!   `server.allowedHosts`); a listener on another address with `--no-auth` also answers any IP
//!   literal, which no DNS answer can rebind (Vite's rule); with an access token off loopback
//!   the check is off, since a rebound page cannot know the token (Jupyter turns it off when
//!   listening beyond loopback). No `Host` at all passes: browsers always send one.
//! - `Origin` (against cross-site requests): present, it must be listed with `--allowed-origin`
//!   or be the server's own origin (`http://`, or `https://` behind a TLS proxy, + the
//!   request's `Host`, that `Host` being one the first check admits by name), as Jupyter's
//!   `check_origin` compares it with `Host`. Without `Origin` (curl, the SDKs, the gateway's
//!   clients) a request passes.
//!
//! A request that presents the listener's access token passes both: a page cannot attach a
//! custom header to a cross-site request without a CORS preflight, which neither listener
//! grants, nor to a WebSocket, so the token proves the client is no page's puppet (and the
//! gateway's tunnel, which forwards a browser's `Origin` to remote hands with the token, keeps
//! working). A Unix socket is out of any browser's reach: no guard there.
//!
//! This module decides and refuses; the listener says how a refusal looks (execd's
//! `{"code","message"}`, envd's Connect or HTTP error). It knows nothing of routes.

use std::net::{IpAddr, Ipv6Addr};
use std::str::FromStr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Uri, header};
use axum::middleware::Next;
use axum::response::Response;

/// Who can reach a listener, by its address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposure {
    /// A Unix-domain socket: no browser reaches it.
    Unix,
    /// 127.0.0.0/8 or ::1: only this machine, and the web pages its browsers show.
    Loopback,
    /// Any other address (`0.0.0.0` included): the network.
    Network,
}

impl Exposure {
    /// The exposure of a TCP listener on `ip`.
    pub fn of_ip(ip: IpAddr) -> Self {
        if ip.to_canonical().is_loopback() {
            Exposure::Loopback
        } else {
            Exposure::Network
        }
    }
}

/// A host name or IP address as a `Host` header or an origin carries it: names lowercase
/// without a trailing dot, IPv6 without brackets.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HostName {
    Ip(IpAddr),
    Name(String),
}

impl HostName {
    /// `host` as `Authority::host` gives it (IPv6 in brackets).
    fn parse(host: &str) -> Option<Self> {
        if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            return inner
                .parse::<Ipv6Addr>()
                .ok()
                .map(|ip| HostName::Ip(ip.into()));
        }
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Some(HostName::Ip(ip));
        }
        let name = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
        let valid = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
        valid.then_some(HostName::Name(name))
    }

    /// `localhost` and its subdomains (RFC 6761: browsers resolve them to loopback only, so no
    /// page can rebind them), and loopback IP literals.
    fn is_loopback(&self) -> bool {
        match self {
            HostName::Ip(ip) => ip.to_canonical().is_loopback(),
            HostName::Name(name) => name == "localhost" || name.ends_with(".localhost"),
        }
    }
}

impl std::fmt::Display for HostName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostName::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            HostName::Ip(ip) => write!(f, "{ip}"),
            HostName::Name(name) => f.write_str(name),
        }
    }
}

/// `host[:port]` as a `Host` header or an origin carries it; `None` for anything else (user
/// info, a path, an empty or out-of-range port, characters no host name has).
fn parse_authority(value: &str) -> Option<(HostName, Option<u16>)> {
    let (host, port) = match value.strip_prefix('[') {
        Some(rest) => {
            let (inner, after) = rest.split_once(']')?;
            (&value[..inner.len() + 2], after)
        }
        // The port starts at the first colon: a name has none, and a second one makes the
        // port invalid.
        None => match value.find(':') {
            Some(colon) => value.split_at(colon),
            None => (value, ""),
        },
    };
    let port = match port.strip_prefix(':') {
        None if port.is_empty() => None,
        None => return None,
        Some(digits) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
            Some(digits.parse::<u16>().ok()?)
        }
        Some(_) => return None,
    };
    Some((HostName::parse(host)?, port))
}

/// One `--allowed-host` value: `*` (every host: the check is off), `.example.com` (that name and
/// every name under it, as Vite reads a leading dot), or one name or IP address. Ports are not
/// named: every port of an allowed host is allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHost(Allowed);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Allowed {
    Any,
    Domain(String),
    Exact(HostName),
}

impl AllowedHost {
    /// `*`: every host.
    pub const ANY: AllowedHost = AllowedHost(Allowed::Any);

    /// Whether `host` is this name (or under this domain); `*` admits nothing by name, it
    /// turns the check off instead.
    fn names(&self, host: &HostName) -> bool {
        match (&self.0, host) {
            (Allowed::Any, _) => false,
            (Allowed::Exact(allowed), host) => allowed == host,
            (Allowed::Domain(domain), HostName::Name(name)) => {
                name == domain
                    || name
                        .strip_suffix(domain.as_str())
                        .is_some_and(|prefix| prefix.ends_with('.'))
            }
            (Allowed::Domain(_), HostName::Ip(_)) => false,
        }
    }
}

impl FromStr for AllowedHost {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        if value == "*" {
            return Ok(AllowedHost::ANY);
        }
        let invalid = || {
            format!(
                "expected `*`, a host name, `.domain` or an IP address without a port, not {value:?}"
            )
        };
        if let Some(domain) = value.strip_prefix('.') {
            return match HostName::parse(domain) {
                Some(HostName::Name(domain)) => Ok(AllowedHost(Allowed::Domain(domain))),
                _ => Err(invalid()),
            };
        }
        // A bare IPv6 address has colons that are not a port's.
        if let Ok(ip) = value.parse::<Ipv6Addr>() {
            return Ok(AllowedHost(Allowed::Exact(HostName::Ip(ip.into()))));
        }
        match parse_authority(value) {
            Some((host, None)) => Ok(AllowedHost(Allowed::Exact(host))),
            _ => Err(invalid()),
        }
    }
}

/// An origin as the `Origin` header serializes it (`scheme://host[:port]`), normalized: scheme
/// and name lowercase, the scheme's default port left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    scheme: String,
    host: HostName,
    port: Option<u16>,
}

impl Origin {
    fn parse(value: &str) -> Option<Self> {
        let (scheme, rest) = value.split_once("://")?;
        let scheme = scheme.to_ascii_lowercase();
        let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
        if !scheme_ok {
            return None;
        }
        // `Origin` never ends in `/`, but a flag pasted from the address bar may.
        let (host, port) = parse_authority(rest.strip_suffix('/').unwrap_or(rest))?;
        let port = port.filter(|port| Some(*port) != default_port(&scheme));
        Some(Origin { scheme, host, port })
    }

    /// The port a browser connects to for this origin.
    fn effective_port(&self) -> Option<u16> {
        self.port.or_else(|| default_port(&self.scheme))
    }
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" | "ws" => Some(80),
        "https" | "wss" => Some(443),
        _ => None,
    }
}

/// One `--allowed-origin` value: `*` (every origin: the check is off), `null` (the opaque
/// origin of sandboxed frames and `file:` pages), or `scheme://host[:port]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedOrigin {
    Any,
    Null,
    Exact(Origin),
}

impl FromStr for AllowedOrigin {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "*" => Ok(AllowedOrigin::Any),
            "null" => Ok(AllowedOrigin::Null),
            _ => Origin::parse(value)
                .map(AllowedOrigin::Exact)
                .ok_or_else(|| {
                    format!("expected `*`, `null` or scheme://host[:port] (no path), not {value:?}")
                }),
        }
    }
}

/// Why a request was refused; each is a 403 with its code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The `Host` is not one of this listener's names.
    #[error(
        "host {given:?} is not a name of this server (a web page may have rebound its own name \
         to this address); pass --allowed-host {hint} to serve it"
    )]
    Host { given: String, hint: String },
    /// The `Origin` is another site's.
    #[error(
        "origin {given:?} may not use this server (a web page of another site sent this \
         request); pass --allowed-origin {hint} to admit it"
    )]
    Origin { given: String, hint: String },
}

impl Refusal {
    /// The `code` of Warren's error body.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::Host { .. } => "HOST_NOT_ALLOWED",
            Refusal::Origin { .. } => "ORIGIN_NOT_ALLOWED",
        }
    }
}

/// What one listener accepts; see the module docs.
#[derive(Debug, Clone)]
pub struct Guard {
    exposure: Exposure,
    /// Whether `Host` is checked at all (off with a token beyond loopback, or `*`).
    check_host: bool,
    /// Off with `--allowed-origin '*'`.
    check_origin: bool,
    allowed_hosts: Vec<AllowedHost>,
    allowed_origins: Vec<AllowedOrigin>,
}

/// Whether a request presents the listener's access token.
pub type PresentsToken = Arc<dyn Fn(&HeaderMap) -> bool + Send + Sync>;
/// The answer to a refused request, in the listener's error shape.
pub type Refuse = Arc<dyn Fn(&Uri, &HeaderMap, Refusal) -> Response + Send + Sync>;

impl Guard {
    /// The guard of a listener with `exposure`; `token_configured` is whether it started with
    /// an access token.
    pub fn new(
        exposure: Exposure,
        token_configured: bool,
        allowed_hosts: &[AllowedHost],
        allowed_origins: &[AllowedOrigin],
    ) -> Self {
        let any_host = allowed_hosts.contains(&AllowedHost::ANY);
        Self {
            exposure,
            check_host: exposure != Exposure::Unix
                && !any_host
                && !(exposure == Exposure::Network && token_configured),
            check_origin: exposure != Exposure::Unix
                && !allowed_origins.contains(&AllowedOrigin::Any),
            allowed_hosts: allowed_hosts.to_vec(),
            allowed_origins: allowed_origins.to_vec(),
        }
    }

    /// Whether `host` is one of this listener's names (whether or not `Host` is checked).
    fn knows(&self, host: &HostName) -> bool {
        let own = match host {
            HostName::Ip(_) if self.exposure == Exposure::Network => true,
            host => host.is_loopback(),
        };
        own || self.allowed_hosts.iter().any(|allowed| allowed.names(host))
    }

    /// Checks a request's `Host` (or its URI's authority, which stands for it in absolute
    /// form) and `Origin`.
    pub fn check(&self, headers: &HeaderMap, uri: &Uri) -> Result<(), Refusal> {
        let given_host = match headers.get(header::HOST) {
            Some(value) => Some(String::from_utf8_lossy(value.as_bytes()).into_owned()),
            None => uri
                .authority()
                .map(|authority| authority.as_str().to_owned()),
        };
        let host = given_host.as_deref().map(parse_authority);
        if self.check_host
            && let Some(parsed) = &host
            && !parsed.as_ref().is_some_and(|(name, _)| self.knows(name))
        {
            let given = given_host.unwrap_or_default();
            let hint = match parsed {
                Some((name, _)) => name.to_string(),
                None => "NAME".to_owned(),
            };
            return Err(Refusal::Host { given, hint });
        }
        let Some(origin_header) = headers.get(header::ORIGIN) else {
            return Ok(());
        };
        if !self.check_origin {
            return Ok(());
        }
        let given = String::from_utf8_lossy(origin_header.as_bytes()).into_owned();
        let origin = Origin::parse(&given);
        let listed = self.allowed_origins.iter().any(|allowed| match allowed {
            AllowedOrigin::Any => true,
            AllowedOrigin::Null => given == "null",
            AllowedOrigin::Exact(allowed) => origin.as_ref() == Some(allowed),
        });
        let same_origin = match (&origin, host.flatten()) {
            (Some(origin), Some((host, port))) => {
                matches!(origin.scheme.as_str(), "http" | "https")
                    && origin.host == host
                    // A `Host` without a port is the default one of the page's scheme.
                    && origin.effective_port() == port.or_else(|| default_port(&origin.scheme))
                    && self.knows(&host)
            }
            _ => false,
        };
        if listed || same_origin {
            return Ok(());
        }
        let hint = match &origin {
            Some(_) => given.clone(),
            None => "ORIGIN".to_owned(),
        };
        Err(Refusal::Origin { given, hint })
    }

    /// `router` behind this guard: a request it refuses and that does not present the token
    /// is answered by `refuse` before any route (a WebSocket upgrade included) sees it. On a
    /// Unix socket, `router` as it is.
    pub fn apply(self, router: Router, presents_token: PresentsToken, refuse: Refuse) -> Router {
        if self.exposure == Exposure::Unix {
            return router;
        }
        let layered = Layered {
            guard: Arc::new(self),
            presents_token,
            refuse,
        };
        router.layer(axum::middleware::from_fn_with_state(layered, guard_request))
    }
}

#[derive(Clone)]
struct Layered {
    guard: Arc<Guard>,
    presents_token: PresentsToken,
    refuse: Refuse,
}

async fn guard_request(State(layered): State<Layered>, request: Request, next: Next) -> Response {
    if let Err(refusal) = layered.guard.check(request.headers(), request.uri())
        && !(layered.presents_token)(request.headers())
    {
        // Logged so an operator whose proxy or page is refused sees why and which flag helps.
        tracing::info!(%refusal, "refused a request a web page may have sent");
        return (layered.refuse)(request.uri(), request.headers(), refusal);
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn guard(exposure: Exposure, token: bool, hosts: &[&str], origins: &[&str]) -> Guard {
        let hosts: Vec<AllowedHost> = hosts.iter().map(|h| h.parse().expect("host")).collect();
        let origins: Vec<AllowedOrigin> =
            origins.iter().map(|o| o.parse().expect("origin")).collect();
        Guard::new(exposure, token, &hosts, &origins)
    }

    /// The check of a request with these headers (`None`: the header is absent).
    fn check(guard: &Guard, host: Option<&str>, origin: Option<&str>) -> Checked {
        let mut headers = HeaderMap::new();
        if let Some(host) = host {
            headers.insert(header::HOST, HeaderValue::from_str(host).expect("header"));
        }
        if let Some(origin) = origin {
            headers.insert(
                header::ORIGIN,
                HeaderValue::from_str(origin).expect("header"),
            );
        }
        guard
            .check(&headers, &Uri::from_static("/files/upload"))
            .map_err(|refusal| refusal.code())
    }

    /// What [`check`] answers: `Ok`, or the refusal's code.
    type Checked = Result<(), &'static str>;

    const HOST: Result<(), &str> = Err("HOST_NOT_ALLOWED");
    const ORIGIN: Result<(), &str> = Err("ORIGIN_NOT_ALLOWED");

    #[test]
    fn a_loopback_listener_answers_loopback_names_and_allowed_hosts_only() {
        let plain = guard(Exposure::Loopback, false, &[], &[]);
        let allowed = guard(
            Exposure::Loopback,
            false,
            &["proxy.internal", ".cluster.local", "10.0.0.5"],
            &[],
        );
        let cases: [(&Guard, Option<&str>, Checked); 30] = [
            (&plain, Some("127.0.0.1:44772"), Ok(())),
            (&plain, Some("127.0.0.1"), Ok(())),
            (&plain, Some("127.1.2.3:9"), Ok(())),
            (&plain, Some("[::1]:44772"), Ok(())),
            (&plain, Some("[::ffff:127.0.0.1]:1"), Ok(())),
            (&plain, Some("localhost:44772"), Ok(())),
            (&plain, Some("LocalHost"), Ok(())),
            (&plain, Some("localhost.:1"), Ok(())),
            (&plain, Some("p-1.localhost:8080"), Ok(())),
            // No Host at all (HTTP/1.0): no browser sends that.
            (&plain, None, Ok(())),
            (&plain, Some("evil.example"), HOST),
            (&plain, Some("evil.example:44772"), HOST),
            (&plain, Some("localhost.evil.example"), HOST),
            (&plain, Some("127.0.0.1.nip.io"), HOST),
            (&plain, Some("evillocalhost"), HOST),
            (&plain, Some("10.0.0.5:44772"), HOST),
            (&plain, Some("0.0.0.0:44772"), HOST),
            (&plain, Some("[::2]"), HOST),
            (&plain, Some(""), HOST),
            (&plain, Some("user@localhost"), HOST),
            (&plain, Some("localhost:99999"), HOST),
            (&plain, Some("localhost:"), HOST),
            (&plain, Some("proxy.internal"), HOST),
            (&allowed, Some("proxy.internal:80"), Ok(())),
            (&allowed, Some("PROXY.internal"), Ok(())),
            (&allowed, Some("cluster.local"), Ok(())),
            (&allowed, Some("a.b.cluster.local:1"), Ok(())),
            (&allowed, Some("xcluster.local"), HOST),
            (&allowed, Some("10.0.0.5"), Ok(())),
            (&allowed, Some("proxy.internal.evil.example"), HOST),
        ];
        for (guard, host, expected) in cases {
            assert_eq!(check(guard, host, None), expected, "Host {host:?}");
        }
    }

    #[test]
    fn off_loopback_the_host_check_depends_on_the_token_and_star_turns_it_off() {
        let no_auth = guard(Exposure::Network, false, &[], &[]);
        let token = guard(Exposure::Network, true, &[], &[]);
        let star = guard(Exposure::Loopback, false, &["*"], &[]);
        let unix = guard(Exposure::Unix, false, &[], &[]);
        let cases: [(&Guard, &str, Checked); 10] = [
            // With --no-auth beyond loopback: IP literals (no DNS to rebind) and loopback names.
            (&no_auth, "10.0.0.5:44772", Ok(())),
            (&no_auth, "[fd00::1]:44772", Ok(())),
            (&no_auth, "localhost:44772", Ok(())),
            (&no_auth, "sandbox.lan:44772", HOST),
            (&no_auth, "evil.example", HOST),
            // A token beyond loopback: a rebound page cannot know it.
            (&token, "evil.example", Ok(())),
            (&token, "sandbox.lan:44772", Ok(())),
            (&star, "evil.example", Ok(())),
            (&unix, "evil.example", Ok(())),
            (&unix, "hands", Ok(())),
        ];
        for (guard, host, expected) in cases {
            assert_eq!(check(guard, Some(host), None), expected, "Host {host:?}");
        }
    }

    #[test]
    fn an_origin_passes_when_absent_listed_or_the_servers_own() {
        let plain = guard(Exposure::Loopback, false, &[], &[]);
        let listed = guard(
            Exposure::Loopback,
            false,
            &["proxy.internal"],
            &["https://console.example", "http://localhost:3000/", "null"],
        );
        let token = guard(Exposure::Network, true, &[], &[]);
        let star = guard(Exposure::Loopback, false, &[], &["*"]);
        let h = "127.0.0.1:44772";
        let cases: [(&Guard, &str, Option<&str>, Checked); 26] = [
            (&plain, h, None, Ok(())),
            (&plain, h, Some("http://127.0.0.1:44772"), Ok(())),
            (&plain, h, Some("HTTP://127.0.0.1:44772"), Ok(())),
            (
                &plain,
                "localhost:44772",
                Some("http://localhost:44772"),
                Ok(()),
            ),
            (&plain, "localhost", Some("http://localhost:80"), Ok(())),
            (&plain, "localhost", Some("http://localhost:3000"), ORIGIN),
            (&plain, "localhost", Some("https://localhost"), Ok(())),
            (&plain, "[::1]:44772", Some("http://[::1]:44772"), Ok(())),
            (&plain, h, Some("https://evil.example"), ORIGIN),
            (&plain, h, Some("http://127.0.0.1:3000"), ORIGIN),
            (&plain, h, Some("http://localhost:44772"), ORIGIN),
            (&plain, h, Some("null"), ORIGIN),
            (&plain, h, Some("not an origin"), ORIGIN),
            (&plain, h, Some("ftp://127.0.0.1:44772"), ORIGIN),
            (&listed, h, Some("https://console.example"), Ok(())),
            (&listed, h, Some("https://console.example:443"), Ok(())),
            (&listed, h, Some("http://console.example"), ORIGIN),
            (&listed, h, Some("https://console.example:8443"), ORIGIN),
            (&listed, h, Some("http://localhost:3000"), Ok(())),
            (&listed, h, Some("null"), Ok(())),
            (
                &listed,
                "proxy.internal",
                Some("http://proxy.internal"),
                Ok(()),
            ),
            // Off loopback with a token the Host check is off, but the Origin check is not: a
            // rebound page's own origin is not the server's.
            (
                &token,
                "evil.example:44772",
                Some("http://evil.example:44772"),
                ORIGIN,
            ),
            (
                &token,
                "10.0.0.5:44772",
                Some("http://10.0.0.5:44772"),
                Ok(()),
            ),
            (&token, h, Some("https://evil.example"), ORIGIN),
            (&star, h, Some("https://evil.example"), Ok(())),
            // The Host check comes first.
            (&plain, "evil.example", Some("http://evil.example"), HOST),
        ];
        for (guard, host, origin, expected) in cases {
            assert_eq!(
                check(guard, Some(host), origin),
                expected,
                "Host {host:?} Origin {origin:?}"
            );
        }
    }

    #[test]
    fn flag_values_parse_or_say_what_is_expected() {
        let hosts = [
            ("*", true),
            ("proxy.internal", true),
            ("Proxy.Internal.", true),
            (".cluster.local", true),
            ("10.0.0.5", true),
            ("fd00::1", true),
            ("[fd00::1]", true),
            ("proxy.internal:8080", false),
            ("", false),
            (".", false),
            ("http://proxy.internal", false),
            ("a b", false),
        ];
        for (value, ok) in hosts {
            assert_eq!(
                value.parse::<AllowedHost>().is_ok(),
                ok,
                "--allowed-host {value:?}"
            );
        }
        let origins = [
            ("*", true),
            ("null", true),
            ("https://console.example", true),
            ("http://localhost:3000/", true),
            ("chrome-extension://abcdef", true),
            ("console.example", false),
            ("https://console.example/app", false),
            ("https://", false),
            ("https://user@console.example", false),
        ];
        for (value, ok) in origins {
            assert_eq!(
                value.parse::<AllowedOrigin>().is_ok(),
                ok,
                "--allowed-origin {value:?}"
            );
        }
    }

    /// Every string of up to five characters from an alphabet of the bytes the parsers split
    /// on (brackets, colons, dots, `@`, `/`, a non-ASCII byte): no panic, and only parseable
    /// values are admitted by name.
    #[test]
    fn no_host_or_origin_makes_the_parsers_panic() {
        let alphabet: [&[u8]; 10] = [
            b"[",
            b"]",
            b":",
            b".",
            b"1",
            b"a",
            b"@",
            b"/",
            "\u{e9}".as_bytes(),
            b"::1",
        ];
        let guard = guard(Exposure::Loopback, false, &[], &[]);
        let mut values: Vec<Vec<u8>> = vec![Vec::new()];
        for _ in 0..5 {
            let longer: Vec<Vec<u8>> = values
                .iter()
                .filter(|value| value.len() < 5)
                .flat_map(|value| {
                    alphabet
                        .iter()
                        .map(move |piece| [value.as_slice(), piece].concat())
                })
                .collect();
            values.extend(longer);
        }
        for value in &values {
            let Ok(header_value) = HeaderValue::from_bytes(value) else {
                continue;
            };
            let mut headers = HeaderMap::new();
            headers.insert(header::HOST, header_value.clone());
            let admitted = guard.check(&headers, &Uri::from_static("/")).is_ok();
            let parsed = std::str::from_utf8(value).ok().and_then(parse_authority);
            assert_eq!(
                admitted,
                parsed.is_some_and(|(host, _)| host.is_loopback()),
                "Host {value:?}"
            );
            headers.insert(header::ORIGIN, header_value);
            let _ = guard.check(&headers, &Uri::from_static("/"));
            let text = String::from_utf8_lossy(value);
            let _ = text.parse::<AllowedHost>();
            let _ = text.parse::<AllowedOrigin>();
        }
    }

    #[test]
    fn exposure_follows_the_listen_address() {
        let cases = [
            ("127.0.0.1", Exposure::Loopback),
            ("127.9.9.9", Exposure::Loopback),
            ("::1", Exposure::Loopback),
            ("::ffff:127.0.0.1", Exposure::Loopback),
            ("0.0.0.0", Exposure::Network),
            ("::", Exposure::Network),
            ("10.0.0.5", Exposure::Network),
        ];
        for (ip, expected) in cases {
            let ip: IpAddr = ip.parse().expect("ip");
            assert_eq!(Exposure::of_ip(ip), expected, "{ip}");
        }
    }
}
