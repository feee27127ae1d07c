//! `warren_http::serve_tls` over real sockets on 127.0.0.1:0 with a certificate of a test CA
//! made here: plain requests, an SSE stream and a WebSocket over TLS, ALPN `http/1.1`, a
//! plain-HTTP request answered `400 TLS_REQUIRED`, and a client that never finishes the
//! handshake disconnected.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ws::{Message, WebSocketUpgrade};
use axum::response::sse::{Event, Sse};
use axum::routing::get;
use futures_util::{SinkExt as _, StreamExt as _};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use warren_http::ServeConfig;
use warren_test_support::tls::TestCa;

/// Generous: the machine is shared and loaded.
const WAIT: Duration = Duration::from_secs(10);

fn router() -> Router {
    Router::new()
        .route("/ping", get(|| async { "pong" }))
        .route(
            "/events",
            get(|| async {
                let events = ["one", "two", "three"]
                    .map(|text| Ok::<_, Infallible>(Event::default().data(text)));
                Sse::new(futures_util::stream::iter(events))
            }),
        )
        .route(
            "/ws",
            get(|ws: WebSocketUpgrade| async move {
                ws.on_upgrade(|mut socket| async move {
                    while let Some(Ok(message)) = socket.recv().await {
                        if let Message::Text(text) = message {
                            let echo = format!("echo: {}", text.as_str());
                            if socket.send(Message::Text(echo.into())).await.is_err() {
                                break;
                            }
                        }
                    }
                })
            }),
        )
}

/// A TLS server of [`router`] on 127.0.0.1:0 with a certificate for 127.0.0.1 signed by a new
/// test CA; the header read timeout is `header_timeout`.
async fn start(header_timeout: Duration) -> (SocketAddr, TestCa) {
    let ca = TestCa::new();
    let dir = tempfile::tempdir().expect("temp dir");
    let (cert, key) = ca.write_server(dir.path(), &["127.0.0.1", "localhost"]);
    let tls = warren_http::tls::server_config(&cert, &key).expect("the test certificate loads");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let addr = listener.local_addr().expect("address");
    let config = ServeConfig {
        header_read_timeout: header_timeout,
        ..ServeConfig::default()
    };
    tokio::spawn(warren_http::serve_tls(
        listener,
        router(),
        config,
        tls,
        std::future::pending(),
    ));
    (addr, ca)
}

fn client(ca: &TestCa) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(ca.ca_pem().as_bytes()).expect("the CA parses");
    reqwest::Client::builder()
        .tls_certs_only([ca])
        .timeout(WAIT)
        .build()
        .expect("a client")
}

/// A TLS connection to `addr` trusting only `ca`, offering ALPN `h2` and `http/1.1`.
async fn tls_connect(addr: SocketAddr, ca: &TestCa) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls_pki_types::CertificateDer::from(ca.ca_der()))
        .expect("adds the CA");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let tcp = TcpStream::connect(addr).await.expect("connects");
    let name = rustls_pki_types::ServerName::IpAddress(addr.ip().into());
    tokio::time::timeout(
        WAIT,
        tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp),
    )
    .await
    .expect("the handshake ends in time")
    .expect("the handshake succeeds")
}

#[tokio::test]
async fn https_serves_requests_sse_and_websockets_with_alpn_http1() {
    let (addr, ca) = start(ServeConfig::default().header_read_timeout).await;
    let client = client(&ca);
    let pong = client
        .get(format!("https://{addr}/ping"))
        .send()
        .await
        .expect("answers over TLS");
    assert_eq!(pong.status(), 200);
    assert_eq!(pong.text().await.expect("body"), "pong");

    // SSE: every event arrives through the TLS stream.
    let events = client
        .get(format!("https://{addr}/events"))
        .send()
        .await
        .expect("the stream answers");
    assert_eq!(events.headers()["content-type"], "text/event-stream");
    let mut body = events.bytes_stream();
    let mut text = String::new();
    while !text.contains("data: three") {
        let chunk = tokio::time::timeout(WAIT, body.next())
            .await
            .expect("an event in time")
            .expect("the stream goes on")
            .expect("reads the stream");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(
        text.contains("data: one") && text.contains("data: two"),
        "{text}"
    );

    // ALPN: HTTP/1.1 even to a client that would rather speak h2.
    let tls = tls_connect(addr, &ca).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));

    // A WebSocket upgraded over the TLS connection.
    let (mut socket, _) = tokio::time::timeout(
        WAIT,
        tokio_tungstenite::client_async(format!("wss://{addr}/ws"), tls),
    )
    .await
    .expect("upgrades in time")
    .expect("upgrades");
    socket
        .send(tokio_tungstenite::tungstenite::Message::text("hello"))
        .await
        .expect("sends");
    let answer = tokio::time::timeout(WAIT, socket.next())
        .await
        .expect("an answer in time")
        .expect("the socket stays open")
        .expect("reads");
    assert_eq!(answer.into_text().expect("text").as_str(), "echo: hello");
}

#[tokio::test]
async fn plain_http_to_the_tls_port_is_told_to_use_https() {
    let (addr, _ca) = start(ServeConfig::default().header_read_timeout).await;
    // From another address than 127.0.0.1 (as a LAN client would come): refused, saying why.
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket
        .bind("127.0.0.2:0".parse().expect("an address"))
        .expect("binds 127.0.0.2");
    let mut tcp = socket.connect(addr).await.expect("connects");
    tcp.write_all(format!("GET /ping HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .expect("writes");
    let mut answer = Vec::new();
    tokio::time::timeout(WAIT, tcp.read_to_end(&mut answer))
        .await
        .expect("answered and closed in time")
        .expect("answered, not reset");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("\"code\":\"TLS_REQUIRED\""), "{answer}");
    assert!(
        answer.contains(&format!("this port serves HTTPS: use https://{addr}/")),
        "{answer}"
    );
    // From 127.0.0.1, the machine's own clients (an agent on the host and the model proxy)
    // are served plain.
    let plain = reqwest::Client::builder()
        .timeout(WAIT)
        .build()
        .expect("a client")
        .get(format!("http://{addr}/ping"))
        .send()
        .await
        .expect("answered");
    assert_eq!(plain.status(), 200);
}

#[tokio::test]
async fn a_client_that_never_finishes_the_handshake_is_disconnected() {
    let (addr, _ca) = start(Duration::from_millis(300)).await;
    let mut tcp = TcpStream::connect(addr).await.expect("connects");
    // The first bytes of a TLS record header, then nothing.
    tcp.write_all(&[0x16, 0x03, 0x01]).await.expect("writes");
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(WAIT, tcp.read(&mut buf))
        .await
        .expect("the server closes the connection in time");
    // Closed (0 bytes) or reset: either way, not held open.
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
}
