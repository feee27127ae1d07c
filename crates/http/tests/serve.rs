//! `warren_http::serve` over real sockets: a small router on 127.0.0.1:0 (and one on a Unix
//! socket), raw TCP clients for the requests no well-behaved client sends (half a request line,
//! a body short of its `Content-Length`), reqwest for the rest. Timeouts are set short in the
//! config and asserted only as "within a generous wait".

// Tests start real programs (shells, servers, the binary under test) directly.
#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use warren_http::{Json, OptionalJson, RequestError, ServeConfig};

/// Generous: the machine is shared and loaded.
const WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, Default, serde::Deserialize)]
struct Body {
    #[serde(default)]
    text: String,
}

fn router() -> Router {
    Router::new()
        .route("/ping", get(|| async { "pong" }))
        .route(
            "/panic",
            get(|| async {
                let parts: Vec<&str> = Vec::new();
                // An out-of-bounds index, as a handler bug would be.
                parts[3].to_owned()
            }),
        )
        .route(
            "/echo",
            post(|Json(body): Json<Body>| async move { body.text }),
        )
        .route(
            "/optional",
            post(
                |body: Result<OptionalJson<Body>, RequestError>| async move {
                    match body {
                        Ok(OptionalJson(body)) => body.text,
                        Err(error) => format!("refused: {error}"),
                    }
                },
            ),
        )
}

/// Serves [`router`] with `config`; returns the address.
async fn start(config: ServeConfig) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds 127.0.0.1:0");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(warren_http::serve(
        listener,
        router(),
        config,
        std::future::pending(),
    ));
    addr
}

/// Reads until the server closes the connection (or breaks it off); what it sent on the way.
async fn read_until_closed(stream: &mut (impl AsyncRead + Unpin), what: &str) -> String {
    let mut received = Vec::new();
    // An error ends the reading as the close does; what came before it is kept.
    let read = tokio::time::timeout(WAIT, stream.read_to_end(&mut received)).await;
    assert!(
        read.is_ok(),
        "{what}: the server did not close within {WAIT:?}"
    );
    String::from_utf8_lossy(&received).into_owned()
}

/// Writes the head of a `POST /echo` whose body is `length` bytes long, with the header lines
/// `extra` (each ending in CRLF) besides.
async fn write_echo_head(stream: &mut TcpStream, length: usize, extra: &str) {
    let head = format!(
        "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n{extra}\r\n"
    );
    stream
        .write_all(head.as_bytes())
        .await
        .expect("writes head");
}

/// Sends `request`: the body of its answer as text.
async fn text(request: reqwest::RequestBuilder) -> String {
    let response = request.send().await.expect("answered");
    response.text().await.expect("text")
}

/// Asserts that `response` is `status` with Warren's JSON error body of `code`; the body.
async fn assert_error(response: reqwest::Response, status: u16, code: &str) -> serde_json::Value {
    assert_eq!(response.status(), status);
    let body: serde_json::Value = response.json().await.expect("JSON error body");
    assert_eq!(body["code"], code, "{body}");
    body
}

async fn connect(addr: std::net::SocketAddr) -> TcpStream {
    tokio::time::timeout(WAIT, TcpStream::connect(addr))
        .await
        .expect("connects within the wait")
        .expect("connects")
}

/// A `GET /ping` on a raw connection that stays open; the response head.
async fn ping_keep_alive(stream: &mut TcpStream) -> String {
    stream
        .write_all(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("writes");
    let mut received = Vec::new();
    tokio::time::timeout(WAIT, async {
        let mut buf = [0u8; 1024];
        while !String::from_utf8_lossy(&received).ends_with("pong") {
            let n = stream.read(&mut buf).await.expect("reads");
            assert!(n > 0, "closed before the response");
            received.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("the ping is answered within the wait");
    String::from_utf8_lossy(&received).into_owned()
}

fn short_timeouts() -> ServeConfig {
    ServeConfig {
        header_read_timeout: Duration::from_millis(300),
        body_idle_timeout: Duration::from_millis(300),
        ..ServeConfig::default()
    }
}

#[tokio::test]
async fn half_sent_request_line_is_closed_after_header_read_timeout() {
    let addr = start(short_timeouts()).await;
    let mut half = connect(addr).await;
    half.write_all(b"GET /pi").await.expect("writes");
    read_until_closed(&mut half, "half a request line").await;
    // A connection that sends nothing at all goes the same way.
    let mut silent = connect(addr).await;
    read_until_closed(&mut silent, "a silent connection").await;
    // And the server still answers.
    let mut client = connect(addr).await;
    assert!(
        ping_keep_alive(&mut client)
            .await
            .starts_with("HTTP/1.1 200")
    );
}

#[tokio::test]
async fn body_short_of_its_content_length_times_out() {
    let addr = start(short_timeouts()).await;
    let mut stream = connect(addr).await;
    let body = r#"{"text": "hello"}"#;
    write_echo_head(&mut stream, body.len() + 100, "").await;
    stream
        .write_all(body.as_bytes())
        .await
        .expect("writes body");
    let answer = read_until_closed(&mut stream, "a stalled body").await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains(r#""code":"REQUEST_TIMEOUT""#), "{answer}");
}

#[tokio::test]
async fn a_slow_body_that_keeps_coming_is_not_cut_off() {
    let addr = start(short_timeouts()).await;
    let mut stream = connect(addr).await;
    let body = br#"{"text": "slow"}"#;
    write_echo_head(&mut stream, body.len(), "Connection: close\r\n").await;
    // Each piece comes well within the idle timeout, though the whole takes longer than it.
    for piece in body.chunks(4) {
        stream.write_all(piece).await.expect("writes a piece");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answer = read_until_closed(&mut stream, "a slow body").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("slow"), "{answer}");
}

#[tokio::test]
async fn a_handler_that_panics_answers_500_in_the_error_shape_and_the_server_goes_on() {
    let addr = start(ServeConfig::default()).await;
    let http = reqwest::Client::new();
    for _ in 0..2 {
        let response = http
            .get(format!("http://{addr}/panic"))
            .send()
            .await
            .expect("answered, not cut off");
        let body = assert_error(response, 500, "RUNTIME_ERROR").await;
        assert_eq!(body["message"], "internal error", "{body}");
    }
    let pong = text(http.get(format!("http://{addr}/ping"))).await;
    assert_eq!(pong, "pong");
}

#[tokio::test]
async fn a_json_array_for_an_object_body_is_refused() {
    let addr = start(ServeConfig::default()).await;
    let http = reqwest::Client::new();
    let response = http
        .post(format!("http://{addr}/echo"))
        .header("content-type", "application/json")
        .body(r#"["hello"]"#)
        .send()
        .await
        .expect("answered");
    assert_error(response, 400, "INVALID_REQUEST_BODY").await;
    let optional = http.post(format!("http://{addr}/optional"));
    let answer = text(optional.body(r#"["hello"]"#)).await;
    assert!(answer.starts_with("refused: invalid JSON body"), "{answer}");
}

#[tokio::test]
async fn connections_over_the_limit_wait_until_one_closes() {
    let addr = start(ServeConfig {
        max_connections: 2,
        ..ServeConfig::default()
    })
    .await;
    // Two keep-alive connections, each answered, so each holds a slot.
    let mut first = connect(addr).await;
    let mut second = connect(addr).await;
    ping_keep_alive(&mut first).await;
    ping_keep_alive(&mut second).await;
    // The third is queued by the kernel, not served.
    let mut third = connect(addr).await;
    third
        .write_all(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("writes");
    let mut buf = [0u8; 64];
    let early = tokio::time::timeout(Duration::from_millis(500), third.read(&mut buf)).await;
    assert!(
        early.is_err(),
        "a third connection was served past the limit"
    );
    // Once one closes, the third is accepted and answered.
    drop(first);
    let answer = read_until_closed(&mut third, "the queued connection").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test]
async fn graceful_shutdown_finishes_and_returns() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let addr = listener.local_addr().expect("local addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(warren_http::serve(
        listener,
        router(),
        ServeConfig::default(),
        async {
            let _ = stopped.await;
        },
    ));
    let mut idle = connect(addr).await;
    ping_keep_alive(&mut idle).await;
    let _ = stop.send(());
    let result = tokio::time::timeout(WAIT, server)
        .await
        .expect("serve returns within the wait once told to stop");
    result.expect("serve task").expect("serve result");
    read_until_closed(&mut idle, "an idle connection at shutdown").await;
}

#[tokio::test]
async fn a_unix_socket_gets_the_same_answers_and_header_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("serve.sock");
    let listener = tokio::net::UnixListener::bind(&socket).expect("binds the socket");
    tokio::spawn(warren_http::serve(
        listener,
        router(),
        short_timeouts(),
        std::future::pending(),
    ));
    let connect = || async {
        tokio::time::timeout(WAIT, tokio::net::UnixStream::connect(&socket))
            .await
            .expect("connects within the wait")
            .expect("connects")
    };
    let mut client = connect().await;
    client
        .write_all(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("writes");
    let answer = read_until_closed(&mut client, "a ping").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("pong"), "{answer}");
    // Half a request line is closed by the header read timeout, as on TCP.
    let mut half = connect().await;
    half.write_all(b"GET /pi").await.expect("writes");
    read_until_closed(&mut half, "half a request line").await;
}
