//! Serving a router over HTTP/1.1 with the limits `axum::serve` lacks: a header read timeout, a
//! body idle timeout and a cap on concurrent connections.
//!
//! - The header read timeout is hyper's (`http1::Builder::header_read_timeout`, with tokio's
//!   timer, which axum never sets, so today's servers have none). It runs whenever a connection
//!   waits for a request head: a client that sends half a request line, or nothing, or stays
//!   idle on a keep-alive connection, is disconnected when it expires.
//! - The body idle timeout is tower-http's `RequestBodyTimeoutLayer`: a body read that waits
//!   longer than that for its next bytes fails, and the extractors in [`crate::request`] turn
//!   that into [`crate::RequestError::BodyTimeout`] (408).
//! - Past `max_connections` the server stops accepting; new connections wait in the listen
//!   backlog until one closes (as Go's `LimitListener` and actix's `max_connections` do). A
//!   connection's slot travels with its socket, so an upgraded WebSocket holds it until it
//!   closes.
//!
//! - A handler that panics answers 500 `RUNTIME_ERROR` in Warren's error shape, and the panic
//!   is logged (tower-http's `CatchPanicLayer`): bad input can fail a request, never the
//!   connection with no answer ([`PanicAnswer`]).
//!
//! The same limits hold on a TCP and a Unix-domain socket ([`Listener`]).
//!
//! [`serve_tls`] serves HTTPS on TCP (rustls, [`crate::tls`]): the handshake must finish
//! within the header read timeout, and a client that speaks plain HTTP to the port is
//! answered `400 TLS_REQUIRED` in Warren's error shape, then disconnected (as nginx answers
//! "the plain HTTP request was sent to HTTPS port") — unless it connects from 127.0.0.1 or ::1:
//! the gateway's own clients on its machine (an agent on the host reaching the model proxy)
//! stay plain. Everything above the TLS layer, SSE
//! streams and upgraded WebSockets included, is the same as over plain TCP.
//!
//! Both timeouts are on reading requests only: responses (SSE, long polls) and upgraded
//! WebSockets are never cut short by them. Graceful shutdown is axum's: stop accepting, let each
//! connection finish its request in flight, wait for them (not for upgraded WebSockets, which
//! the servers end themselves).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::timeout::RequestBodyTimeoutLayer;

/// The limits [`serve`] applies to every connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeConfig {
    /// How long a connection may take to send a complete request head (and how long an idle
    /// keep-alive connection is kept).
    pub header_read_timeout: Duration,
    /// How long a request body may go without sending anything while the handler reads it.
    pub body_idle_timeout: Duration,
    /// Most connections served at once.
    pub max_connections: usize,
}

impl ServeConfig {
    pub const DEFAULT_HEADER_READ_TIMEOUT_MS: u64 = 30_000;
    pub const DEFAULT_BODY_IDLE_TIMEOUT_MS: u64 = 30_000;
    pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_millis(Self::DEFAULT_HEADER_READ_TIMEOUT_MS),
            body_idle_timeout: Duration::from_millis(Self::DEFAULT_BODY_IDLE_TIMEOUT_MS),
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// The flags of every Warren server that set its [`ServeConfig`] (`warren serve`, `warren
/// execd`): `--header-read-timeout-ms`, `--body-idle-timeout-ms`, `--max-connections`.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct ServeFlags {
    /// Milliseconds a connection may take to send a complete request head once it could; then
    /// it is closed (this also ends idle keep-alive connections).
    #[arg(
        long,
        env = "WARREN_HEADER_READ_TIMEOUT_MS",
        default_value_t = ServeConfig::DEFAULT_HEADER_READ_TIMEOUT_MS,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub header_read_timeout_ms: u64,
    /// Milliseconds a request body may send nothing while it is read; then the request fails
    /// with 408.
    #[arg(
        long,
        env = "WARREN_BODY_IDLE_TIMEOUT_MS",
        default_value_t = ServeConfig::DEFAULT_BODY_IDLE_TIMEOUT_MS,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub body_idle_timeout_ms: u64,
    /// Most connections served at once (event streams and WebSockets included); more wait to
    /// be accepted.
    #[arg(
        long,
        env = "WARREN_MAX_CONNECTIONS",
        default_value_t = ServeConfig::DEFAULT_MAX_CONNECTIONS,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
    )]
    pub max_connections: usize,
}

impl Default for ServeFlags {
    fn default() -> Self {
        Self {
            header_read_timeout_ms: ServeConfig::DEFAULT_HEADER_READ_TIMEOUT_MS,
            body_idle_timeout_ms: ServeConfig::DEFAULT_BODY_IDLE_TIMEOUT_MS,
            max_connections: ServeConfig::DEFAULT_MAX_CONNECTIONS,
        }
    }
}

impl ServeFlags {
    /// The limits these flags ask for.
    pub fn config(&self) -> ServeConfig {
        ServeConfig {
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms),
            body_idle_timeout: Duration::from_millis(self.body_idle_timeout_ms),
            max_connections: self.max_connections,
        }
    }
}

/// Where [`serve`] accepts connections: a TCP port or a Unix-domain socket.
#[derive(Debug)]
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl From<TcpListener> for Listener {
    fn from(listener: TcpListener) -> Self {
        Listener::Tcp(listener)
    }
}

impl From<UnixListener> for Listener {
    fn from(listener: UnixListener) -> Self {
        Listener::Unix(listener)
    }
}

/// One accepted connection.
enum Accepted {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Listener {
    async fn accept(&self) -> io::Result<Accepted> {
        match self {
            Listener::Tcp(listener) => listener.accept().await.map(|(s, _)| Accepted::Tcp(s)),
            Listener::Unix(listener) => listener.accept().await.map(|(s, _)| Accepted::Unix(s)),
        }
    }
}

/// The answer of a handler that panicked: logged with its message, 500 to the client.
#[derive(Debug, Clone, Copy)]
struct PanicAnswer;

impl tower_http::catch_panic::ResponseForPanic for PanicAnswer {
    type ResponseBody = axum::body::Body;

    fn response_for_panic(
        &mut self,
        panic: Box<dyn std::any::Any + Send + 'static>,
    ) -> axum::response::Response {
        let message = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("a panic without a message");
        tracing::error!(panic = message, "a request handler panicked");
        crate::error_response(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "RUNTIME_ERROR",
            "internal error",
        )
    }
}

/// How long to wait before accepting again after an error such as running out of file
/// descriptors, which retrying at once would only repeat.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_secs(1);

/// Serves `router` on `listener` until `shutdown` resolves, then stops accepting and waits for
/// the connections' requests in flight to finish.
pub async fn serve(
    listener: impl Into<Listener>,
    router: Router,
    config: ServeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    serve_with(listener.into(), router, config, None, shutdown).await
}

/// [`serve`] over HTTPS: every TCP connection is a TLS connection of `tls` (see
/// [`crate::tls::server_config`]).
pub async fn serve_tls(
    listener: TcpListener,
    router: Router,
    config: ServeConfig,
    tls: Arc<rustls::ServerConfig>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    serve_with(
        Listener::Tcp(listener),
        router,
        config,
        Some(acceptor),
        shutdown,
    )
    .await
}

async fn serve_with(
    listener: Listener,
    router: Router,
    config: ServeConfig,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    // Zero would make hyper's timer and the semaphore refuse everything; the config parsers
    // refuse zero, and this keeps a hand-built config from doing it either.
    let header_read_timeout = config.header_read_timeout.max(Duration::from_millis(1));
    let body_idle_timeout = config.body_idle_timeout.max(Duration::from_millis(1));
    let slots = Arc::new(Semaphore::new(config.max_connections.max(1)));
    let service = tower::ServiceBuilder::new()
        .layer(CatchPanicLayer::custom(PanicAnswer))
        .layer(RequestBodyTimeoutLayer::new(body_idle_timeout))
        .service(router);
    let stopping = CancellationToken::new();
    let connections = TaskTracker::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            biased;
            () = &mut shutdown => break,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                // The semaphore is never closed; stop serving rather than spin if it were.
                Err(_) => break,
            },
        };
        let stream = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(stream) => stream,
                Err(error) if is_connection_error(&error) => continue,
                Err(error) => {
                    tracing::error!(%error, "cannot accept a connection");
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(ACCEPT_ERROR_PAUSE) => continue,
                    }
                }
            },
        };
        match stream {
            Accepted::Tcp(stream) => {
                // Event streams are many small writes; without TCP_NODELAY each one after the
                // first waits for the client's delayed ACK (about 40 ms per round trip).
                if let Err(error) = stream.set_nodelay(true) {
                    tracing::debug!(%error, "cannot set TCP_NODELAY on a connection");
                }
                if let Some(acceptor) = &tls {
                    connections.spawn(serve_tls_connection(
                        stream,
                        acceptor.clone(),
                        slot,
                        service.clone(),
                        header_read_timeout,
                        stopping.clone(),
                    ));
                    continue;
                }
                connections.spawn(serve_connection(
                    stream,
                    slot,
                    service.clone(),
                    header_read_timeout,
                    stopping.clone(),
                ));
            }
            Accepted::Unix(stream) => {
                connections.spawn(serve_connection(
                    stream,
                    slot,
                    service.clone(),
                    header_read_timeout,
                    stopping.clone(),
                ));
            }
        }
    }
    drop(listener);
    stopping.cancel();
    connections.close();
    connections.wait().await;
    Ok(())
}

/// Errors of one connection that came and went before it was accepted; nothing to report.
fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

type Service = tower_http::catch_panic::CatchPanic<
    tower_http::timeout::RequestBodyTimeout<Router>,
    PanicAnswer,
>;

/// The first byte of every TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// The most of a plain-HTTP request head read before answering it `TLS_REQUIRED`.
const PLAIN_HEAD_MAX: usize = 16 * 1024;

/// One HTTPS connection: the TLS handshake (within `header_read_timeout`, and not past a
/// shutdown), then [`serve_connection`] over it. A client speaking plain HTTP gets
/// [`answer_plain_http`].
async fn serve_tls_connection(
    stream: TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    slot: OwnedSemaphorePermit,
    service: Service,
    header_read_timeout: Duration,
    stopping: CancellationToken,
) {
    let handshake = async {
        let mut first = [0u8; 1];
        let read = stream.peek(&mut first).await?;
        if read == 0 {
            return Ok(Https::Nothing);
        }
        if first[0] != TLS_HANDSHAKE_RECORD {
            // The gateway's own clients on this machine (an agent on the host reaching the
            // model proxy, a replica's loopback URL) speak plain HTTP: loopback never leaves it.
            if stream
                .peer_addr()
                .is_ok_and(|peer| plain_allowed(peer.ip()))
            {
                return Ok(Https::Plain(stream));
            }
            answer_plain_http(stream).await;
            return Ok(Https::Nothing);
        }
        acceptor
            .accept(stream)
            .await
            .map(|tls| Https::Tls(Box::new(tls)))
    };
    let accepted = tokio::select! {
        () = stopping.cancelled() => return,
        accepted = tokio::time::timeout(header_read_timeout, handshake) => accepted,
    };
    match accepted {
        Ok(Ok(Https::Tls(stream))) => {
            serve_connection(*stream, slot, service, header_read_timeout, stopping).await;
        }
        Ok(Ok(Https::Plain(stream))) => {
            serve_connection(stream, slot, service, header_read_timeout, stopping).await;
        }
        Ok(Ok(Https::Nothing)) => {}
        Ok(Err(error)) => tracing::debug!(%error, "TLS handshake failed"),
        Err(_) => tracing::debug!("TLS handshake timed out"),
    }
}

/// Whether plain HTTP from `peer` is served on the HTTPS port: from this machine's own loopback
/// address (127.0.0.1 or ::1, as the gateway's own clients connect), never from elsewhere.
fn plain_allowed(peer: std::net::IpAddr) -> bool {
    match peer.to_canonical() {
        std::net::IpAddr::V4(v4) => v4 == std::net::Ipv4Addr::LOCALHOST,
        std::net::IpAddr::V6(v6) => v6 == std::net::Ipv6Addr::LOCALHOST,
    }
}

/// What a connection to the HTTPS port turned out to be.
enum Https {
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    /// Plain HTTP from loopback.
    Plain(TcpStream),
    /// Nothing to serve (closed, or answered `TLS_REQUIRED`).
    Nothing,
}

/// Answers a plain-HTTP request sent to an HTTPS port: reads its head (so closing does not
/// reset the connection under the answer), says `400 TLS_REQUIRED` with the `https://` URL of
/// its `Host`, and closes. Bounded by the caller's handshake timeout.
async fn answer_plain_http(mut stream: TcpStream) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    while head.len() < PLAIN_HEAD_MAX && !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(read) => head.extend_from_slice(&buf[..read]),
        }
    }
    let host = String::from_utf8_lossy(&head)
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case("host")
                .then(|| value.trim().to_owned())
        })
        .filter(|host| {
            !host.is_empty()
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || ".-:[]".contains(c))
        });
    let message = match host {
        Some(host) => format!("this port serves HTTPS: use https://{host}/"),
        None => "this port serves HTTPS: use https://".to_owned(),
    };
    let body = serde_json::to_string(&warren_protocol::error::ErrorBody::new(
        "TLS_REQUIRED",
        message,
    ))
    .unwrap_or_default();
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    if stream.write_all(answer.as_bytes()).await.is_ok() {
        let _ = stream.shutdown().await;
    }
}

async fn serve_connection<S>(
    stream: S,
    slot: OwnedSemaphorePermit,
    service: Service,
    header_read_timeout: Duration,
    stopping: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(SlotStream {
        stream,
        _slot: slot,
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    let connection = builder
        .serve_connection(io, TowerToHyperService::new(service))
        .with_upgrades();
    let mut connection = std::pin::pin!(connection);
    let mut shutting_down = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    // Clients that hang up mid-request, and those the header timeout closes.
                    tracing::debug!(%error, "connection ended with an error");
                }
                return;
            }
            () = stopping.cancelled(), if !shutting_down => {
                shutting_down = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}

/// A connection's stream holding one connection slot, which goes back when the stream is
/// dropped: after the last response, or when an upgraded WebSocket closes.
struct SlotStream<S> {
    stream: S,
    _slot: OwnedSemaphorePermit,
}

impl<S: AsyncRead + Unpin> AsyncRead for SlotStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for SlotStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod flag_tests {
    use std::time::Duration;

    use clap::Parser;

    use super::{ServeConfig, ServeFlags};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeFlags,
    }

    #[test]
    fn serve_flags_default_parse_and_refuse_zero() {
        let defaults = Cli::try_parse_from(["server"])
            .expect("parses no flags")
            .serve;
        assert_eq!(defaults, ServeFlags::default());
        assert_eq!(defaults.config(), ServeConfig::default());
        let flags = [
            "server",
            "--header-read-timeout-ms=300",
            "--body-idle-timeout-ms=400",
            "--max-connections=5",
        ];
        let parsed = Cli::try_parse_from(flags).expect("parses the flags").serve;
        assert_eq!(
            parsed.config(),
            ServeConfig {
                header_read_timeout: Duration::from_millis(300),
                body_idle_timeout: Duration::from_millis(400),
                max_connections: 5,
            }
        );
        for zero in [
            "--header-read-timeout-ms=0",
            "--body-idle-timeout-ms=0",
            "--max-connections=0",
        ] {
            assert!(Cli::try_parse_from(["server", zero]).is_err(), "{zero}");
        }
    }
}
