//! Credentials at the edge, over the proxy's real Unix socket against real HTTPS upstreams
//! (Python's `http.server` with a test CA's certificates, on 127.0.0.2 and 127.0.0.3): a
//! covered host gets the credential's header (the sandbox's own replaced) on every request of a
//! keep-alive tunnel, its value masked in what comes back and each use reported; a host no
//! credential covers, and a covered host once the credentials are taken away, is an opaque
//! tunnel with the upstream's own certificate and no header; an upstream whose certificate is
//! not trusted gets nothing and the sandbox a 502 naming `--egress-upstream-ca`; and bytes that
//! are not TLS pass opaque to a covered host.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::UnixStream;
use warren_egress::{
    Answer, AnswerFuture, Authority, Credential, CredentialUse, Edge, Egress, Limits, Mode,
    Observer, Policy, upstream_trust,
};
use warren_test_support::tls::{HttpsUpstream, TestCa};
use warren_test_support::{WAIT, eventually, within};

/// The credential's secret: nothing the sandbox reads may hold it.
const CANARY: &str = "warren-canary-5c1d9e7a3b";
/// The covered upstream; the one no credential covers.
const COVERED: &str = "127.0.0.2";
const OTHER: &str = "127.0.0.3";

fn required_header() -> String {
    format!("Authorization: Bearer {CANARY}")
}

fn credential() -> Arc<Credential> {
    let credential = Credential::parse(
        &format!("api={COVERED}:Authorization:Bearer $API_TOKEN"),
        |variable| (variable == "API_TOKEN").then(|| CANARY.to_owned()),
    )
    .expect("the credential parses");
    Arc::new(credential)
}

#[derive(Default)]
struct Seen {
    decided: Mutex<Vec<(String, bool, String)>>,
    used: Mutex<Vec<CredentialUse>>,
}

impl Observer for Seen {
    fn ask(&self, _host: &str, _port: u16) -> AnswerFuture {
        Box::pin(async { Answer::Deny })
    }

    fn decided(&self, host: &str, port: u16, allowed: bool, rule: &str) {
        self.decided.lock().expect("lock").push((
            format!("{host}:{port}"),
            allowed,
            rule.to_owned(),
        ));
    }

    fn closed(&self, _host: &str, _port: u16, _bytes_up: u64, _bytes_down: u64) {}

    fn credential_used(&self, used: CredentialUse) {
        self.used.lock().expect("lock").push(used);
    }
}

/// A test CA, the upstreams' certificates, the gateway's CA and a proxy serving one session.
struct World {
    dir: tempfile::TempDir,
    ca: TestCa,
    ca_file: PathBuf,
    authority: Arc<Authority>,
}

impl World {
    fn new() -> World {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = TestCa::new();
        let ca_file = ca.write_ca(dir.path());
        let authority =
            Arc::new(Authority::open(&dir.path().join("egress-ca")).expect("the egress CA"));
        World {
            dir,
            ca,
            ca_file,
            authority,
        }
    }

    /// An echo upstream on `ip` (a certificate for `ip` from the test CA) that answers 200 only
    /// to the credential's exact header.
    async fn upstream(&self, ip: &str) -> Upstream {
        let (cert, key) = self.ca.write_server(self.dir.path(), &[ip]);
        let cert_der = CertificateDer::from_pem_file(&cert).expect("the upstream's certificate");
        let header = required_header();
        let server =
            HttpsUpstream::start(ip, &cert, &key, &["echo", "--require-header", &header]).await;
        Upstream {
            ip: ip.to_owned(),
            cert_der,
            server,
        }
    }

    /// The edge, checking upstreams against the system's roots plus `extra`.
    fn edge(&self, extra: &[PathBuf]) -> Arc<Edge> {
        Edge::new(
            self.authority.clone(),
            upstream_trust(extra).expect("the upstream trust"),
        )
    }

    /// The egress CA, what sandboxes trust.
    fn egress_ca(&self) -> CertificateDer<'static> {
        self.authority.cert_der().clone()
    }

    fn test_ca(&self) -> CertificateDer<'static> {
        CertificateDer::from(self.ca.ca_der())
    }
}

struct Upstream {
    ip: String,
    /// The certificate the upstream presents.
    cert_der: CertificateDer<'static>,
    server: HttpsUpstream,
}

impl Upstream {
    fn target(&self) -> String {
        format!("{}:{}", self.ip, self.server.port)
    }

    /// The upstream's request lines once there are `n` (its log is read as the server writes
    /// it, after the answer may have come back).
    async fn requests(&self, n: usize) -> Vec<String> {
        eventually(&format!("{n} requests logged by {}", self.ip), || {
            self.server.requests().len() >= n
        })
        .await;
        self.server.requests()
    }
}

struct Proxy {
    socket: PathBuf,
    seen: Arc<Seen>,
    egress: Arc<Egress>,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A proxy that allows exactly `upstreams` and sets `credentials` through `edge`.
fn start(upstreams: &[&Upstream], edge: Arc<Edge>, credentials: Vec<Arc<Credential>>) -> Proxy {
    start_limited(upstreams, edge, credentials, Limits::default())
}

/// [`start`] with the proxy's bounds given.
fn start_limited(
    upstreams: &[&Upstream],
    edge: Arc<Edge>,
    credentials: Vec<Arc<Credential>>,
    limits: Limits,
) -> Proxy {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("egress.sock");
    let listener = tokio::net::UnixListener::bind(&socket).expect("binds");
    let mut policy = Policy::new(Mode::None);
    policy.allow = upstreams
        .iter()
        .map(|upstream| upstream.target().parse().expect("an exact rule"))
        .collect();
    let seen = Arc::new(Seen::default());
    let egress = Egress::with_credentials(
        policy,
        Arc::clone(&seen) as Arc<dyn Observer>,
        limits,
        "Allow it in the console's Network view.".to_owned(),
        Some(edge),
        credentials,
    );
    let task = tokio::spawn(Arc::clone(&egress).serve(listener));
    Proxy {
        socket,
        seen,
        egress,
        _dir: dir,
        task,
    }
}

/// A stream that keeps a copy of every byte read from it.
struct Recorded<S> {
    inner: S,
    read: Arc<Mutex<Vec<u8>>>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Recorded<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let fresh = buf.filled()[before..].to_vec();
        self.read.lock().expect("lock").extend_from_slice(&fresh);
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Recorded<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// `CONNECT target` through the proxy; the stream once the proxy said 200 (its head read byte
/// by byte, so nothing of the tunnel is taken).
async fn tunnel(proxy: &Proxy, target: &str) -> UnixStream {
    let mut stream = UnixStream::connect(&proxy.socket)
        .await
        .expect("connects to the proxy");
    stream
        .write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .expect("sends CONNECT");
    let mut head = Vec::new();
    within(&format!("the proxy's answer to CONNECT {target}"), async {
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            match stream.read(&mut byte).await {
                Ok(1) => head.push(byte[0]),
                _ => break,
            }
        }
    })
    .await;
    let head = String::from_utf8_lossy(&head).into_owned();
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "CONNECT {target} is let through: {head:?}"
    );
    stream
}

/// TLS over `stream` for `ip`, trusting `root` only.
async fn tls<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    ip: &str,
    root: CertificateDer<'static>,
) -> std::io::Result<tokio_rustls::client::TlsStream<S>> {
    let mut roots = RootCertStore::empty();
    roots.add(root).expect("a root certificate");
    let mut config = ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = ServerName::try_from(ip.to_owned()).expect("an IP address");
    within(
        &format!("the TLS handshake with {ip}"),
        tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, stream),
    )
    .await
}

/// An HTTP/1.1 client connection over `io` (kept alive between requests).
async fn http<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    io: S,
) -> SendRequest<Full<Bytes>> {
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .expect("an HTTP/1.1 client connection");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    sender
}

struct Answered {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answered {
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("a JSON echo ({e}): {:?}", self.body))
    }
}

async fn send(
    sender: &mut SendRequest<Full<Bytes>>,
    method: Method,
    authority: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answered {
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, authority);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("a request");
    within(&format!("the answer to {path}"), async {
        sender
            .ready()
            .await
            .expect("the connection takes a request");
        let response = sender.send_request(request).await.expect("an answer");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("the whole body").to_bytes();
        Answered {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    })
    .await
}

/// Sends a request on a new tunnel with TLS to the upstream itself (trusting the test CA, as
/// an opaque tunnel must); checks the upstream's own certificate came back and that the egress
/// CA is not what answers.
async fn opaque_request(world: &World, proxy: &Proxy, upstream: &Upstream) -> Answered {
    let refused = tls(
        tunnel(proxy, &upstream.target()).await,
        &upstream.ip,
        world.egress_ca(),
    )
    .await;
    assert!(
        refused.is_err(),
        "the egress CA does not answer for {}: the tunnel is opaque",
        upstream.ip
    );
    let stream = tls(
        tunnel(proxy, &upstream.target()).await,
        &upstream.ip,
        world.test_ca(),
    )
    .await
    .expect("TLS with the upstream itself");
    let presented = stream
        .get_ref()
        .1
        .peer_certificates()
        .expect("a certificate")[0]
        .clone();
    assert_eq!(
        presented, upstream.cert_der,
        "the client sees the upstream's own certificate"
    );
    let mut sender = http(stream).await;
    send(
        &mut sender,
        Method::GET,
        &upstream.target(),
        "/opaque?q=1",
        &[],
        "",
    )
    .await
}

#[tokio::test]
async fn a_covered_host_gets_the_header_set_its_value_masked_and_each_use_reported() {
    let world = World::new();
    let upstream = world.upstream(COVERED).await;
    let proxy = start(
        &[&upstream],
        world.edge(std::slice::from_ref(&world.ca_file)),
        vec![credential()],
    );
    let read = Arc::new(Mutex::new(Vec::new()));
    let stream = tls(
        tunnel(&proxy, &upstream.target()).await,
        COVERED,
        world.egress_ca(),
    )
    .await
    .expect("the proxy answers TLS for the covered host with the egress CA");
    let mut sender = http(Recorded {
        inner: stream,
        read: read.clone(),
    })
    .await;
    let masked = "*".repeat(format!("Bearer {CANARY}").len());

    // The sandbox's own Authorization is replaced: the upstream answers 200 only to the
    // credential's exact value, and echoes what it got (masked on the way back).
    let answer = send(
        &mut sender,
        Method::POST,
        &upstream.target(),
        "/things?page=2",
        &[("authorization", "Bearer fake")],
        "a body",
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let echo = answer.json();
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["path"], "/things?page=2");
    assert_eq!(echo["body"], "a body");
    assert_eq!(
        echo["headers"]["authorization"],
        masked.as_str(),
        "the upstream got the credential (not `Bearer fake`), masked in the echo: {echo}"
    );
    assert_eq!(
        echo["headers"]["accept-encoding"], "identity",
        "nothing compressed hides the value from the mask: {echo}"
    );

    // The same keep-alive tunnel: the header's value comes back in a body and a header, both
    // masked byte for byte.
    let answer = send(
        &mut sender,
        Method::GET,
        &upstream.target(),
        "/echo-header?x=1",
        &[],
        "",
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(answer.body, masked);
    assert_eq!(answer.headers["x-echo"], masked.as_str());

    let read = String::from_utf8_lossy(&read.lock().expect("lock")).into_owned();
    assert!(
        read.contains("HTTP/1.1 200"),
        "the record holds the answers"
    );
    assert!(
        !read.contains(CANARY),
        "the credential never reaches the sandbox: {read}"
    );
    // One TLS connection upstream carried both, each with the header.
    assert_eq!(
        upstream.requests(2).await,
        [
            "REQUEST POST /things?page=2 authorization=present",
            "REQUEST GET /echo-header?x=1 authorization=present",
        ]
    );
    let used = proxy.seen.used.lock().expect("lock").clone();
    let use_of = |method: &str, path: &str| CredentialUse {
        name: "api".to_owned(),
        host: COVERED.to_owned(),
        method: method.to_owned(),
        path: path.to_owned(),
        status: 200,
    };
    assert_eq!(
        used,
        [use_of("POST", "/things"), use_of("GET", "/echo-header")],
        "each request is reported, its path without the query"
    );
}

#[tokio::test]
async fn a_host_no_credential_covers_is_an_opaque_tunnel_with_no_header() {
    let world = World::new();
    let covered = world.upstream(COVERED).await;
    let other = world.upstream(OTHER).await;
    let proxy = start(
        &[&covered, &other],
        world.edge(std::slice::from_ref(&world.ca_file)),
        vec![credential()],
    );
    let answer = opaque_request(&world, &proxy, &other).await;
    assert_eq!(
        answer.status,
        StatusCode::UNAUTHORIZED,
        "no credential was set: {}",
        answer.body
    );
    let echo = answer.json();
    assert!(
        echo["headers"].get("authorization").is_none(),
        "no Authorization reached the upstream: {echo}"
    );
    assert_eq!(
        other.requests(1).await,
        ["REQUEST GET /opaque?q=1 authorization=absent"]
    );
    assert!(proxy.seen.used.lock().expect("lock").is_empty());
    assert!(covered.server.requests().is_empty());
}

#[tokio::test]
async fn an_upstream_whose_certificate_is_not_trusted_gets_nothing_and_the_client_a_502() {
    let world = World::new();
    let upstream = world.upstream(COVERED).await;
    // The system's roots only: the test CA is not among them.
    let proxy = start(&[&upstream], world.edge(&[]), vec![credential()]);
    let stream = tls(
        tunnel(&proxy, &upstream.target()).await,
        COVERED,
        world.egress_ca(),
    )
    .await
    .expect("the proxy answers the client's TLS");
    let mut sender = http(stream).await;
    for path in ["/first", "/second"] {
        let answer = send(&mut sender, Method::GET, &upstream.target(), path, &[], "").await;
        assert_eq!(answer.status, StatusCode::BAD_GATEWAY, "{}", answer.body);
        assert!(
            answer.headers[header::CONTENT_TYPE]
                .to_str()
                .expect("text")
                .starts_with("text/plain"),
            "{:?}",
            answer.headers
        );
        assert!(
            answer.body.contains("--egress-upstream-ca"),
            "the refusal says how to trust a private CA: {}",
            answer.body
        );
        assert!(!answer.body.contains(CANARY), "{}", answer.body);
    }
    // The upstream saw a handshake fail and no request.
    eventually("the upstream logs the refused handshake", || {
        upstream
            .server
            .log()
            .iter()
            .any(|line| line.starts_with("TLS-ERROR"))
    })
    .await;
    assert!(
        upstream.server.requests().is_empty(),
        "nothing was sent upstream: {:?}",
        upstream.server.log()
    );
    assert!(proxy.seen.used.lock().expect("lock").is_empty());
    let decided = proxy.seen.decided.lock().expect("lock").clone();
    assert!(
        decided
            .iter()
            .any(|(target, allowed, why)| target == &upstream.target()
                && !allowed
                && why.contains("not trusted")),
        "the refusal is reported: {decided:?}"
    );
}

#[tokio::test]
async fn once_the_credentials_are_taken_away_a_new_tunnel_is_opaque() {
    let world = World::new();
    let upstream = world.upstream(COVERED).await;
    let proxy = start(
        &[&upstream],
        world.edge(std::slice::from_ref(&world.ca_file)),
        vec![credential()],
    );
    // With the credential: the egress CA answers and the header is set.
    let stream = tls(
        tunnel(&proxy, &upstream.target()).await,
        COVERED,
        world.egress_ca(),
    )
    .await
    .expect("the egress CA answers while the credential is set");
    let mut sender = http(stream).await;
    let answer = send(
        &mut sender,
        Method::GET,
        &upstream.target(),
        "/before",
        &[],
        "",
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    drop(sender);

    proxy.egress.set_credentials(Vec::new());
    assert!(proxy.egress.credentials().is_empty());
    let answer = opaque_request(&world, &proxy, &upstream).await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{}", answer.body);
    assert!(
        answer.json()["headers"].get("authorization").is_none(),
        "{}",
        answer.body
    );
    assert_eq!(
        upstream.requests(2).await,
        [
            "REQUEST GET /before authorization=present",
            "REQUEST GET /opaque?q=1 authorization=absent",
        ]
    );
    assert_eq!(proxy.seen.used.lock().expect("lock").len(), 1);
}

#[tokio::test]
async fn bytes_that_are_not_tls_pass_opaque_to_a_covered_host() {
    let world = World::new();
    let upstream = world.upstream(COVERED).await;
    let proxy = start(
        &[&upstream],
        world.edge(std::slice::from_ref(&world.ca_file)),
        vec![credential()],
    );
    let mut stream = tunnel(&proxy, &upstream.target()).await;
    let request = format!("GET / HTTP/1.1\r\nHost: {}\r\n\r\n", upstream.target());
    stream
        .write_all(request.as_bytes())
        .await
        .expect("writes into the tunnel");
    // Whatever comes back until the tunnel closes: the TLS upstream refuses plain HTTP.
    let mut back = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(WAIT, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => back.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("the tunnel closes once the upstream refuses plain HTTP");
    assert_ne!(
        back.first(),
        Some(&0x16),
        "the proxy did not start a TLS handshake with the client: {back:?}"
    );
    assert!(
        !String::from_utf8_lossy(&back).contains("HTTP/1.1"),
        "no HTTP answer came back from the proxy: {back:?}"
    );
    // The upstream got the plain request itself, as bytes on its TLS port.
    eventually("the upstream logs plain HTTP on its TLS port", || {
        upstream
            .server
            .log()
            .iter()
            .any(|line| line.starts_with("TLS-ERROR") && line.contains("HTTP_REQUEST"))
    })
    .await;
    assert!(upstream.server.requests().is_empty());
    assert!(proxy.seen.used.lock().expect("lock").is_empty());
}

#[tokio::test]
async fn an_upstream_that_speaks_first_gets_an_opaque_tunnel_at_once() {
    // SMTP, FTP or a database greet before the client says anything: no TLS to answer.
    let world = World::new();
    let listener = tokio::net::TcpListener::bind((COVERED, 0))
        .await
        .expect("binds a greeting server");
    let target = format!(
        "{COVERED}:{}",
        listener.local_addr().expect("its address").port()
    );
    tokio::spawn(async move {
        if let Ok((mut stream, _)) = listener.accept().await {
            let _ = stream.write_all(b"220 greeting\r\n").await;
            let mut sink = [0u8; 64];
            let _ = stream.read(&mut sink).await;
        }
    });
    let proxy = start(
        &[],
        world.edge(std::slice::from_ref(&world.ca_file)),
        vec![credential()],
    );
    let mut policy = proxy.egress.policy();
    policy.allow = vec![target.parse().expect("an exact rule")];
    proxy.egress.set_policy(policy);
    let mut stream = tunnel(&proxy, &target).await;
    let mut greeting = [0u8; 14];
    within(
        "the upstream's greeting through a covered host's tunnel",
        stream.read_exact(&mut greeting),
    )
    .await
    .expect("reads the greeting");
    assert_eq!(&greeting, b"220 greeting\r\n");
    assert!(proxy.seen.used.lock().expect("lock").is_empty());
}

#[tokio::test]
async fn a_request_whose_answer_never_comes_is_still_a_use_with_the_proxys_504() {
    // The header went out to the upstream: the person sees the use, with what the sandbox got.
    let world = World::new();
    let (cert, key) = world.ca.server_pem(&[COVERED]);
    let cert = CertificateDer::from_pem_slice(cert.as_bytes()).expect("the certificate");
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("the key");
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .expect("a server configuration");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind((COVERED, 0))
        .await
        .expect("binds a silent server");
    let target = format!(
        "{COVERED}:{}",
        listener.local_addr().expect("its address").port()
    );
    let (got_tx, mut got_rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let Ok(mut tls) = acceptor.accept(stream).await else {
            return;
        };
        // Reads the request and never answers.
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n) = tls.read(&mut buf).await {
            if n == 0 {
                break;
            }
            let _ = got_tx.send(buf[..n].to_vec());
        }
    });
    let limits = Limits {
        response_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let proxy = start_limited(
        &[],
        world.edge(std::slice::from_ref(&world.ca_file)),
        vec![credential()],
        limits,
    );
    let mut policy = proxy.egress.policy();
    policy.allow = vec![target.parse().expect("an exact rule")];
    proxy.egress.set_policy(policy);
    let stream = tunnel(&proxy, &target).await;
    let tls = tls(stream, COVERED, world.egress_ca())
        .await
        .expect("the proxy answers a covered host's TLS");
    let mut sender = http(tls).await;
    let answered = send(&mut sender, Method::GET, &target, "/slow?x=1", &[], "").await;
    assert_eq!(
        answered.status,
        StatusCode::GATEWAY_TIMEOUT,
        "{}",
        answered.body
    );
    let got = within("the request at the silent upstream", got_rx.recv())
        .await
        .expect("the upstream got the request");
    let got = String::from_utf8_lossy(&got).to_lowercase();
    assert!(
        got.contains("authorization: bearer"),
        "the header went out: {got}"
    );
    let used = proxy.seen.used.lock().expect("lock").clone();
    assert_eq!(used.len(), 1, "{used:?}");
    assert_eq!((used[0].path.as_str(), used[0].status), ("/slow", 504));
}
