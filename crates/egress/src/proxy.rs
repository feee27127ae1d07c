//! The egress proxy of one session's hands (network.md "The egress proxy"): HTTP/1.1 on a Unix
//! socket, `CONNECT host:port` for TLS and other TCP, absolute-form requests for plain HTTP.
//! Every connection is judged by name ([`Policy::judge`]), asked of the person when no rule
//! covers it ([`Observer::ask`]), resolved here, and each address checked again
//! ([`Policy::check_address`]) before the proxy connects. A refusal is a `403 text/plain` whose
//! body names the host, the rule and how to allow it.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UnixListener, UnixStream};

use crate::credential::Credential;
use crate::inject::{CredentialUse, Edge, Interception};
use crate::policy::{Policy, Rule, Verdict, normalize_host};

/// How the person answered an `egress_request`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    AllowOnce,
    /// Allow, and let this host and port through for the rest of the session (a rule in
    /// [`Policy::answered`](crate::Policy::answered)).
    AllowSession,
    Deny,
    /// No answer came in time: refused, saying so.
    TimedOut,
}

/// A future the observer answers with.
pub type AnswerFuture = Pin<Box<dyn Future<Output = Answer> + Send>>;

/// What the proxy tells its owner (the gateway: events, questions to the person).
pub trait Observer: Send + Sync + 'static {
    /// No rule covers `host:port`: ask the person. The owner bounds the wait (no answer in time
    /// is [`Answer::TimedOut`]) and shares one question among concurrent connections to one host.
    fn ask(&self, host: &str, port: u16) -> AnswerFuture;
    /// A connection was decided (`allowed` with the rule that let it, or `refused` with why).
    fn decided(&self, host: &str, port: u16, allowed: bool, rule: &str);
    /// A connection that was let through closed, with what it carried each way.
    fn closed(&self, host: &str, port: u16, bytes_up: u64, bytes_down: u64);
    /// A request carried a credential (after its response's head came back).
    fn credential_used(&self, used: CredentialUse) {
        let _ = used;
    }
}

/// The proxy's bounds.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections through the proxy at once; past it a client gets 429.
    pub max_connections: usize,
    /// Resolving a name and connecting to it.
    pub connect_timeout: Duration,
    /// An upstream's response head to a plain HTTP request.
    pub response_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 256,
            connect_timeout: Duration::from_secs(10),
            response_timeout: Duration::from_secs(60),
        }
    }
}

pub(crate) type Body = BoxBody<Bytes, hyper::Error>;

/// Headers of one hop, never passed on.
pub(crate) const HOP_HEADERS: &[&str] = &[
    "proxy-connection",
    "proxy-authorization",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
];

/// Each direction's buffer in a tunnel whose client connection hyper keeps wrapped.
const TUNNEL_BUFFER: usize = 256 * 1024;

/// One session's egress proxy: its policy (changed at run time), observer and bounds.
pub struct Egress {
    policy: RwLock<Policy>,
    observer: Arc<dyn Observer>,
    limits: Limits,
    n_open: AtomicUsize,
    /// How the person can allow a host, said in every refusal.
    how_to_allow: String,
    /// The gateway's CA and upstream trust, when it has credentials.
    edge: Option<Arc<Edge>>,
    /// The credentials this session's requests may carry now.
    credentials: RwLock<Vec<Arc<Credential>>>,
}

/// Counts one open connection until dropped.
struct Slot(Arc<Egress>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.n_open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Egress {
    /// `how_to_allow` ends each refusal's body (e.g. where the session's rules are changed).
    pub fn new(
        policy: Policy,
        observer: Arc<dyn Observer>,
        limits: Limits,
        how_to_allow: String,
    ) -> Arc<Egress> {
        Egress::with_credentials(policy, observer, limits, how_to_allow, None, Vec::new())
    }

    /// A proxy that sets `credentials` on requests to their hosts (`edge` answers the
    /// sandbox's TLS for those hosts and checks the upstreams').
    pub fn with_credentials(
        policy: Policy,
        observer: Arc<dyn Observer>,
        limits: Limits,
        how_to_allow: String,
        edge: Option<Arc<Edge>>,
        credentials: Vec<Arc<Credential>>,
    ) -> Arc<Egress> {
        Arc::new(Egress {
            policy: RwLock::new(policy),
            observer,
            limits,
            n_open: AtomicUsize::new(0),
            how_to_allow,
            edge,
            credentials: RwLock::new(credentials),
        })
    }

    /// The credentials the session's requests may carry now.
    pub fn credentials(&self) -> Vec<Arc<Credential>> {
        self.credentials
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Replaces the credentials the session's requests may carry (for tunnels opened from now
    /// on).
    pub fn set_credentials(&self, credentials: Vec<Arc<Credential>>) {
        *self
            .credentials
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = credentials;
    }

    /// The credentials for `host`, with the edge that injects them; `None` when none is.
    fn injection_for(&self, host: &str) -> Option<(Arc<Edge>, Vec<Arc<Credential>>)> {
        let edge = self.edge.clone()?;
        let credentials: Vec<_> = self
            .credentials
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .iter()
            .filter(|credential| credential.covers(host))
            .cloned()
            .collect();
        (!credentials.is_empty()).then_some((edge, credentials))
    }

    /// The session's policy and rules now.
    pub fn policy(&self) -> Policy {
        self.policy
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Replaces the session's policy and rules (for connections made from now on).
    pub fn set_policy(&self, policy: Policy) {
        *self
            .policy
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = policy;
    }

    /// Serves connections from `listener` until the task is dropped.
    pub async fn serve(self: Arc<Self>, listener: UnixListener) {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::warn!(%error, "egress proxy: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let egress = Arc::clone(&self);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let egress = Arc::clone(&egress);
                    async move { Ok::<_, std::convert::Infallible>(egress.handle(request).await) }
                });
                let served = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .with_upgrades()
                    .await;
                if let Err(error) = served {
                    tracing::debug!(%error, "egress proxy: connection ended");
                }
            });
        }
    }

    async fn handle(self: Arc<Self>, request: Request<Incoming>) -> Response<Body> {
        let open = self.n_open.fetch_add(1, Ordering::AcqRel);
        let slot = Slot(Arc::clone(&self));
        if open >= self.limits.max_connections {
            return text(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "warren egress: too many connections at once ({} allowed); retry when some close\n",
                    self.limits.max_connections
                ),
            );
        }
        let is_connect = request.method() == Method::CONNECT;
        let Some((host, port)) = target(&request, is_connect) else {
            let why = if is_connect {
                "CONNECT needs HOST:PORT"
            } else {
                "a proxy request needs an absolute http:// URI (use CONNECT for https)"
            };
            return text(StatusCode::BAD_REQUEST, format!("warren egress: {why}\n"));
        };
        let upstream = match self.open_upstream(&host, port).await {
            Ok(upstream) => upstream,
            Err(refusal) => return refusal,
        };
        if is_connect {
            self.tunnel(request, upstream, host, port, slot)
        } else {
            self.forward(request, upstream, host, port, slot).await
        }
    }

    /// Judges, resolves, checks, asks and connects; `Err` is the answer to send instead. The
    /// addresses are checked before the person is asked, so no one is asked about a host that
    /// would be refused anyway (a name that resolves to loopback or metadata).
    async fn open_upstream(&self, host: &str, port: u16) -> Result<TcpStream, Response<Body>> {
        // A rule's name when a rule allows; `None` when the person is to be asked.
        let allowed_by = match self.policy().judge(host, port) {
            Verdict::Refuse(rule) => return Err(self.refuse(host, port, &rule)),
            Verdict::Allow(rule) => Some(rule),
            Verdict::Ask => None,
        };
        let resolved = tokio::time::timeout(self.limits.connect_timeout, resolve(host, port)).await;
        let addresses = match resolved {
            Ok(Ok(addresses)) if !addresses.is_empty() => addresses,
            Ok(_) => {
                return Err(text(
                    StatusCode::BAD_GATEWAY,
                    format!("warren egress: cannot resolve {host}\n"),
                ));
            }
            Err(_) => return Err(self.timed_out(host, port)),
        };
        let policy = self.policy();
        let mut refused = None;
        let allowed: Vec<SocketAddr> = addresses
            .into_iter()
            .filter(
                |address| match policy.check_address(host, port, address.ip()) {
                    Ok(()) => true,
                    Err(why) => {
                        refused.get_or_insert(why);
                        false
                    }
                },
            )
            .collect();
        if allowed.is_empty() {
            let why = refused.unwrap_or_default();
            return Err(self.refuse(host, port, &why));
        }
        let rule = match allowed_by {
            Some(rule) => rule,
            None => match self.observer.ask(host, port).await {
                Answer::AllowOnce => "allowed once by the person".to_owned(),
                Answer::AllowSession => {
                    if let Some(rule) = Rule::exact(host, port) {
                        let mut policy = self
                            .policy
                            .write()
                            .unwrap_or_else(|poisoned| poisoned.into_inner());
                        if !policy.answered.contains(&rule) {
                            policy.answered.push(rule);
                        }
                    }
                    "allowed for the session by the person".to_owned()
                }
                Answer::Deny => return Err(self.refuse(host, port, "denied by the person")),
                Answer::TimedOut => {
                    return Err(self.refuse(host, port, "the person did not answer in time"));
                }
            },
        };
        let connect = async {
            let mut last = None;
            for address in &allowed {
                match TcpStream::connect(address).await {
                    Ok(stream) => return Ok(stream),
                    Err(error) => last = Some(error),
                }
            }
            Err(last.unwrap_or_else(|| std::io::Error::other("no address")))
        };
        match tokio::time::timeout(self.limits.connect_timeout, connect).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                self.observer.decided(host, port, true, &rule);
                Ok(stream)
            }
            Ok(Err(error)) => Err(text(
                StatusCode::BAD_GATEWAY,
                format!("warren egress: cannot connect to {host}:{port}: {error}\n"),
            )),
            Err(_) => Err(self.timed_out(host, port)),
        }
    }

    /// `403` naming the host, the rule and how to allow it, in the body and (for tools that
    /// print only a status line, like Python's `Tunnel connection failed: 403 ...`) in the
    /// reason phrase.
    fn refuse(&self, host: &str, port: u16, rule: &str) -> Response<Body> {
        self.observer.decided(host, port, false, rule);
        let mut response = text(
            StatusCode::FORBIDDEN,
            format!(
                "warren egress: {host}:{port} refused ({rule}). {}\n",
                self.how_to_allow
            ),
        );
        let reason = format!("Forbidden by Warren egress: {host}:{port} ({rule})");
        let printable: String = reason
            .chars()
            .map(|c| {
                if c.is_ascii_graphic() || c == ' ' {
                    c
                } else {
                    '?'
                }
            })
            .collect();
        if let Ok(reason) = hyper::ext::ReasonPhrase::try_from(printable.into_bytes()) {
            response.extensions_mut().insert(reason);
        }
        response
    }

    fn timed_out(&self, host: &str, port: u16) -> Response<Body> {
        text(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "warren egress: {host}:{port} did not answer within {:?}\n",
                self.limits.connect_timeout
            ),
        )
    }

    /// `200` now; the tunnel runs once the client's connection is handed over.
    fn tunnel(
        self: Arc<Self>,
        request: Request<Incoming>,
        mut upstream: TcpStream,
        host: String,
        port: u16,
        slot: Slot,
    ) -> Response<Body> {
        let injection = self.injection_for(&host);
        tokio::spawn(async move {
            let _slot = slot;
            let upgraded = match hyper::upgrade::on(request).await {
                Ok(upgraded) => upgraded,
                Err(error) => {
                    tracing::debug!(%error, "egress proxy: the client left before its tunnel");
                    return;
                }
            };
            if let Some((edge, credentials)) = injection {
                let interception = Interception {
                    edge,
                    observer: self.observer.clone(),
                    host: host.clone(),
                    port,
                    credentials,
                    handshake_timeout: self.limits.connect_timeout,
                    response_timeout: self.limits.response_timeout,
                };
                // Boxed: an opaque tunnel's task does not carry the injecting path's state.
                let (up, down) = Box::pin(interception.run(upgraded, upstream)).await;
                self.observer.closed(&host, port, up, down);
                return;
            }
            let (up, down) = match upgraded.downcast::<TokioIo<UnixStream>>() {
                // The client's own socket back from hyper, with what it sent past the head:
                // spliced to the upstream's (splice(2) through a pipe, no copy through this
                // process).
                Ok(parts) => {
                    let client = parts.io.into_inner();
                    let early = parts.read_buf;
                    if upstream.write_all(&early).await.is_err() {
                        self.observer.closed(&host, port, 0, 0);
                        return;
                    }
                    let (up, down) = crate::splice::tunnel(client, upstream).await;
                    (up + early.len() as u64, down)
                }
                Err(upgraded) => {
                    let mut client = TokioIo::new(upgraded);
                    tokio::io::copy_bidirectional_with_sizes(
                        &mut client,
                        &mut upstream,
                        TUNNEL_BUFFER,
                        TUNNEL_BUFFER,
                    )
                    .await
                    .unwrap_or((0, 0))
                }
            };
            self.observer.closed(&host, port, up, down);
        });
        Response::new(empty())
    }

    /// Sends a plain HTTP request on over `upstream` in origin form.
    async fn forward(
        self: Arc<Self>,
        mut request: Request<Incoming>,
        upstream: TcpStream,
        host: String,
        port: u16,
        slot: Slot,
    ) -> Response<Body> {
        let counted = Counted::new(upstream);
        let (up, down) = (Arc::clone(&counted.up), Arc::clone(&counted.down));
        let (mut sender, connection) =
            match hyper::client::conn::http1::handshake(TokioIo::new(counted)).await {
                Ok(pair) => pair,
                Err(error) => {
                    return text(
                        StatusCode::BAD_GATEWAY,
                        format!("warren egress: {host}:{port}: {error}\n"),
                    );
                }
            };
        let egress = Arc::clone(&self);
        let (closed_host, closed_port) = (host.clone(), port);
        tokio::spawn(async move {
            let _slot = slot;
            let _ = connection.await;
            egress.observer.closed(
                &closed_host,
                closed_port,
                up.load(Ordering::Acquire),
                down.load(Ordering::Acquire),
            );
        });
        let origin_form = request
            .uri()
            .path_and_query()
            .map(|pq| pq.as_str().to_owned())
            .unwrap_or_else(|| "/".to_owned());
        *request.uri_mut() = match origin_form.parse() {
            Ok(uri) => uri,
            Err(_) => return text(StatusCode::BAD_REQUEST, "warren egress: bad path\n".into()),
        };
        let headers = request.headers_mut();
        for hop in HOP_HEADERS {
            headers.remove(*hop);
        }
        if !headers.contains_key(header::HOST) {
            let authority = if port == 80 {
                host.clone()
            } else {
                format!("{host}:{port}")
            };
            if let Ok(value) = authority.parse() {
                headers.insert(header::HOST, value);
            }
        }
        match tokio::time::timeout(self.limits.response_timeout, sender.send_request(request)).await
        {
            Ok(Ok(response)) => response.map(BodyExt::boxed),
            Ok(Err(error)) => text(
                StatusCode::BAD_GATEWAY,
                format!("warren egress: {host}:{port}: {error}\n"),
            ),
            Err(_) => text(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "warren egress: {host}:{port} sent no response within {:?}\n",
                    self.limits.response_timeout
                ),
            ),
        }
    }
}

/// The host (normalized) and port a proxy request names: `CONNECT host:port`, or an absolute
/// `http://host[:port]/...` URI.
fn target(request: &Request<Incoming>, is_connect: bool) -> Option<(String, u16)> {
    let uri = request.uri();
    let authority = uri.authority()?;
    let port = if is_connect {
        authority.port_u16()?
    } else {
        if uri.scheme_str() != Some("http") {
            return None;
        }
        authority.port_u16().unwrap_or(80)
    };
    if port == 0 {
        return None;
    }
    Some((normalize_host(authority.host())?, port))
}

async fn resolve(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    Ok(tokio::net::lookup_host((host, port)).await?.collect())
}

/// An upstream connection that counts the bytes it carries each way.
pub(crate) struct Counted {
    stream: TcpStream,
    pub(crate) up: Arc<AtomicU64>,
    pub(crate) down: Arc<AtomicU64>,
}

impl Counted {
    pub(crate) fn new(stream: TcpStream) -> Counted {
        Counted {
            stream,
            up: Arc::new(AtomicU64::new(0)),
            down: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl tokio::io::AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        self.down.fetch_add(n as u64, Ordering::AcqRel);
        polled
    }
}

impl tokio::io::AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, data);
        if let std::task::Poll::Ready(Ok(n)) = &polled {
            self.up.fetch_add(*n as u64, Ordering::AcqRel);
        }
        polled
    }

    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

fn empty() -> Body {
    Full::new(Bytes::new())
        .map_err(|never| match never {})
        .boxed()
}

pub(crate) fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
