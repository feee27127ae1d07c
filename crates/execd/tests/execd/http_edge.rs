//! execd's HTTP and WebSocket edge against the real daemon on 127.0.0.1:0: error bodies on
//! every kind of bad request, the access token's answer per route, the header and body
//! timeouts, and the close codes of WebSocket protocol violations. Requests no well-behaved
//! client sends (half a request line, a body short of its length, a raw bad frame) go over a
//! plain `TcpStream`.

use crate::pty_support;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use warren_execd::Config;

use pty_support::{WAIT, start_with};

/// A daemon with timeouts short enough to watch them fire.
fn short_timeouts() -> Config {
    Config {
        serve: warren_http::ServeFlags {
            header_read_timeout_ms: 300,
            body_idle_timeout_ms: 300,
            ..warren_http::ServeFlags::default()
        },
        ..Config::default()
    }
}

/// `host:port` of a daemon's base URL.
fn addr(daemon: &pty_support::Daemon) -> String {
    daemon.base.trim_start_matches("http://").to_owned()
}

async fn connect(daemon: &pty_support::Daemon) -> TcpStream {
    tokio::time::timeout(WAIT, TcpStream::connect(addr(daemon)))
        .await
        .expect("connects within the wait")
        .expect("connects")
}

/// Reads until the daemon closes the connection (or breaks it off); what it sent on the way.
async fn read_until_closed(stream: &mut TcpStream, what: &str) -> String {
    let mut received = Vec::new();
    // An error ends the reading as the close does; what came before it is kept.
    let finished = tokio::time::timeout(WAIT, stream.read_to_end(&mut received)).await;
    assert!(finished.is_ok(), "{what}: not closed within {WAIT:?}");
    String::from_utf8_lossy(&received).into_owned()
}

/// Sends `request` and returns the status and the body as JSON (a non-JSON body fails the
/// test: that is the defect these tests pin).
async fn json_answer(request: reqwest::RequestBuilder, what: &str) -> (u16, Value) {
    let response = tokio::time::timeout(WAIT, request.send())
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {WAIT:?}"))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    let body = serde_json::from_str(&text)
        .unwrap_or_else(|_| panic!("{what}: {status} with a body that is not JSON: {text:?}"));
    (status, body)
}

/// Sends `request` of `http` as [`json_answer`] does, named by its method and URL: that name,
/// the status and the body.
async fn named_json_answer(
    http: &reqwest::Client,
    request: reqwest::RequestBuilder,
) -> (String, u16, Value) {
    let request = request.build().expect("request");
    let what = format!("{} {}", request.method(), request.url());
    let builder = reqwest::RequestBuilder::from_parts(http.clone(), request);
    let (status, body) = json_answer(builder, &what).await;
    (what, status, body)
}

/// Asserts Warren's `{"code","message"}` body with `code` and a non-empty message.
fn assert_error_shape(body: &Value, code: &str, what: &str) {
    assert_eq!(body["code"], code, "{what}: {body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}: {body}"
    );
    assert_eq!(body.as_object().map(|o| o.len()), Some(2), "{what}: {body}");
}

#[tokio::test]
async fn json_array_body_is_refused_as_400_on_every_object_route() {
    let daemon = start_with(Config::default()).await;
    let routes = [
        "/pty",
        "/session",
        "/v1/exec/1/stdin",
        "/v1/exec",
        "/command",
    ];
    for path in routes {
        for body in ["[]", r#"["ls"]"#, r#"["/tmp", "ls"]"#] {
            let request = daemon
                .http
                .post(format!("{}{path}", daemon.base))
                .header("content-type", "application/json")
                .body(body);
            let what = format!("POST {path} {body}");
            let (status, answer) = json_answer(request, &what).await;
            assert_eq!(status, 400, "{what}: {answer}");
            assert_error_shape(&answer, "INVALID_REQUEST_BODY", &what);
        }
    }
    // An object still works, and a route whose body is a list still takes one.
    daemon.create(json!({})).await;
    let request = daemon
        .http
        .post(format!("{}/files/mv", daemon.base))
        .header("content-type", "application/json")
        .body("[]");
    let response = request.send().await.expect("answered");
    assert_eq!(response.status(), 200, "POST /files/mv []");
}

#[tokio::test]
async fn unknown_route_and_405_have_the_error_shape() {
    let daemon = start_with(Config::default()).await;
    let http = &daemon.http;
    let base = &daemon.base;
    let (status, body) = json_answer(http.get(format!("{base}/nope")), "GET /nope").await;
    assert_eq!(status, 404);
    assert_error_shape(&body, "NOT_FOUND", "GET /nope");
    let cases = [
        http.put(format!("{base}/pty")),
        http.delete(format!("{base}/v1/exec")),
        http.post(format!("{base}/pty/some-id")),
        http.get(format!("{base}/command")),
    ];
    for request in cases {
        let response = request.send().await.expect("answered");
        let what = format!("{}", response.url());
        assert_eq!(response.status(), 405, "{what}");
        assert!(response.headers().contains_key("allow"), "{what}");
        let body: Value = response.json().await.expect("a JSON body");
        assert_error_shape(&body, "METHOD_NOT_ALLOWED", &what);
    }
}

#[tokio::test]
async fn non_utf8_path_parameter_gets_the_error_shape() {
    let daemon = start_with(Config::default()).await;
    let http = &daemon.http;
    let base = &daemon.base;
    let cases = [
        http.get(format!("{base}/pty/%FF%FE")),
        http.delete(format!("{base}/pty/%FF%FE")),
        http.get(format!("{base}/pty/%FF%FE/ws")),
        http.delete(format!("{base}/v1/exec/%FF")),
        http.post(format!("{base}/v1/exec/%FF/stdin")),
        http.get(format!("{base}/command/status/%FF")),
        http.delete(format!("{base}/session/%FF")),
    ];
    for request in cases {
        let (what, status, body) = named_json_answer(http, request).await;
        assert_eq!(status, 400, "{what}: {body}");
        assert_error_shape(&body, "INVALID_REQUEST_BODY", &what);
    }
}

#[tokio::test]
async fn oversized_bodies_on_session_and_stdin_get_the_error_shape() {
    let daemon = start_with(Config::default()).await;
    let huge = format!(r#"{{"cwd": "{}"}}"#, "a".repeat(3 * 1024 * 1024));
    for path in ["/session", "/v1/exec/1/stdin", "/pty"] {
        let request = daemon
            .http
            .post(format!("{}{path}", daemon.base))
            .header("content-type", "application/json")
            .body(huge.clone());
        let (status, body) = json_answer(request, path).await;
        assert_eq!(status, 413, "{path}: {body}");
        assert_error_shape(&body, "INVALID_REQUEST_BODY", path);
    }
}

#[tokio::test]
async fn every_mcp_error_has_the_error_shape() {
    let daemon = start_with(Config::default()).await;
    let url = format!("{}/mcp", daemon.base);
    let http = &daemon.http;
    let initialize = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "1"}}
    });
    let cases = [
        (
            "POST without Accept",
            http.post(&url).json(&initialize),
            406,
            "NOT_ACCEPTABLE",
        ),
        (
            "POST as text/plain",
            http.post(&url)
                .header("accept", "application/json, text/event-stream")
                .header("content-type", "text/plain")
                .body(initialize.to_string()),
            415,
            "UNSUPPORTED_MEDIA_TYPE",
        ),
        ("PUT", http.put(&url).body("x"), 405, "METHOD_NOT_ALLOWED"),
        (
            "GET of an unknown session",
            http.get(&url)
                .header("accept", "text/event-stream")
                .header("mcp-session-id", "no-such-session"),
            404,
            "SESSION_NOT_FOUND",
        ),
        (
            "a foreign Host",
            http.post(&url)
                .header("host", "evil.example")
                .header("accept", "application/json, text/event-stream")
                .json(&initialize),
            403,
            "HOST_NOT_ALLOWED",
        ),
    ];
    for (what, request, status, code) in cases {
        let (got_status, body) = json_answer(request, what).await;
        assert_eq!(got_status, status, "{what}: {body}");
        assert_error_shape(&body, code, what);
    }
}

#[tokio::test]
async fn the_access_token_answers_in_the_shape_of_the_route_it_guards() {
    let daemon = pty_support::start_with_token("s3cret").await;
    let http = &daemon.http;
    let base = &daemon.base;
    let opensandbox =
        json!({"error": "Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"});
    let warren_routes = [
        http.post(format!("{base}/v1/exec"))
            .json(&json!({"cmd": "true"})),
        http.get(format!("{base}/v1/exec")),
        http.delete(format!("{base}/v1/exec/1")),
        http.post(format!("{base}/mcp")).json(&json!({})),
    ];
    for request in warren_routes {
        let (what, status, body) = named_json_answer(http, request).await;
        assert_eq!(status, 401, "{what}");
        assert_error_shape(&body, "UNAUTHORIZED", &what);
    }
    let opensandbox_routes = [
        http.post(format!("{base}/pty")),
        http.get(format!("{base}/pty/x")),
        http.post(format!("{base}/command"))
            .json(&json!({"command": "true"})),
        http.get(format!("{base}/files/info?path=/")),
        http.get(format!("{base}/nope")),
    ];
    for request in opensandbox_routes {
        let (what, status, body) = named_json_answer(http, request).await;
        assert_eq!((status, &body), (401, &opensandbox), "{what}");
    }
}

#[tokio::test]
async fn half_sent_request_line_is_closed_after_header_read_timeout() {
    let daemon = start_with(short_timeouts()).await;
    let mut half = connect(&daemon).await;
    half.write_all(b"GET /pi").await.expect("writes");
    read_until_closed(&mut half, "half a request line").await;
    let mut headers_only = connect(&daemon).await;
    headers_only
        .write_all(b"GET /ping HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
        .await
        .expect("writes");
    read_until_closed(&mut headers_only, "headers that never end").await;
    assert_eq!(daemon.get("/ping").await.0, 200, "the daemon keeps serving");
}

#[tokio::test]
async fn body_short_of_its_content_length_times_out() {
    let daemon = start_with(short_timeouts()).await;
    let body = r#"{"cwd": "/tmp"}"#;
    for path in ["/pty", "/v1/exec", "/session"] {
        let mut stream = connect(&daemon).await;
        // The head and all of the body there is: 100 bytes short of what the head announces.
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len() + 100
        );
        stream
            .write_all(request.as_bytes())
            .await
            .expect("writes the head and the short body");
        let answer = read_until_closed(&mut stream, path).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{path}: {answer}");
        assert!(
            answer.contains(r#""code":"REQUEST_TIMEOUT""#),
            "{path}: {answer}"
        );
    }
}

#[tokio::test]
async fn websockets_and_streamed_responses_outlive_the_request_timeouts() {
    let daemon = start_with(short_timeouts()).await;
    let (_id, mut holder) = daemon.shell().await;
    // `/metrics/watch` sends one line a second: three lines take several header and body
    // timeouts, and the stream must keep going.
    let mut watch = daemon
        .http
        .get(format!("{}/metrics/watch", daemon.base))
        .send()
        .await
        .expect("answered");
    let mut lines = 0;
    tokio::time::timeout(WAIT, async {
        while lines < 3 {
            let chunk = watch
                .chunk()
                .await
                .expect("reads")
                .expect("the stream goes on");
            lines += chunk.iter().filter(|b| **b == b'\n').count();
        }
    })
    .await
    .expect("three metrics lines within the wait");
    // The WebSocket has been open all that time too, and still works both ways.
    holder.run("echo still-$((6*7))", "still-42").await;
}

// --- WebSocket protocol violations, sent as raw frames -------------------------------------

/// A WebSocket opened by hand on a raw TCP stream, after the `101` of the handshake.
/// `query` is empty or starts with `?`.
async fn raw_websocket(daemon: &pty_support::Daemon, id: &str, query: &str) -> TcpStream {
    let mut stream = connect(daemon).await;
    let handshake = format!(
        "GET /pty/{id}/ws{query} HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        addr(daemon)
    );
    stream
        .write_all(handshake.as_bytes())
        .await
        .expect("writes the handshake");
    // Byte by byte up to the blank line, so no frame after the head is consumed here.
    let mut head = Vec::new();
    tokio::time::timeout(WAIT, async {
        while !head.ends_with(b"\r\n\r\n") {
            head.push(stream.read_u8().await.expect("reads the handshake answer"));
        }
    })
    .await
    .expect("the handshake is answered within the wait");
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    stream
}

/// A client frame: FIN set, `opcode`, masked as clients must (with a zero mask, so the payload
/// goes out as given), or unmasked when `masked` is false. Payloads stay under 126 bytes.
fn client_frame(first_byte: u8, payload: &[u8], masked: bool) -> Vec<u8> {
    assert!(payload.len() < 126);
    let mut frame = vec![first_byte];
    if masked {
        frame.push(0x80 | payload.len() as u8);
        frame.extend_from_slice(&[0, 0, 0, 0]);
    } else {
        frame.push(payload.len() as u8);
    }
    frame.extend_from_slice(payload);
    frame
}

/// Reads server frames until a close frame and returns its code; panics if the connection
/// ends without one (what a client reports as 1006).
async fn close_code(stream: &mut TcpStream) -> u16 {
    let read = async {
        loop {
            let first = stream.read_u8().await.ok()?;
            let second = stream.read_u8().await.ok()?;
            let len = match second & 0x7f {
                126 => u64::from(stream.read_u16().await.ok()?),
                127 => stream.read_u64().await.ok()?,
                n => u64::from(n),
            };
            let mut payload = vec![0u8; usize::try_from(len).ok()?];
            stream.read_exact(&mut payload).await.ok()?;
            if first & 0x0f == 0x8 {
                return Some(u16::from_be_bytes([*payload.first()?, *payload.get(1)?]));
            }
        }
    };
    tokio::time::timeout(WAIT, read)
        .await
        .expect("a close frame within the wait")
        .expect("a close frame before the connection ended (not 1006)")
}

#[tokio::test]
async fn ws_text_frame_with_invalid_utf8_closes_with_1007() {
    let daemon = start_with(Config::default()).await;
    for query in ["", "?pty=0"] {
        let id = daemon.create(json!({})).await;
        let mut ws = raw_websocket(&daemon, &id, query).await;
        ws.write_all(&client_frame(0x81, &[b'h', 0xC3, 0x28, b'i'], true))
            .await
            .expect("writes the frame");
        assert_eq!(close_code(&mut ws).await, 1007, "query {query:?}");
    }
}

#[tokio::test]
async fn ws_protocol_violations_close_with_1002() {
    let daemon = start_with(Config::default()).await;
    let violations: [(&str, Vec<u8>); 4] = [
        ("an unmasked frame", client_frame(0x82, b"\x00ls\n", false)),
        ("a reserved opcode", client_frame(0x83, b"x", true)),
        ("a reserved bit", client_frame(0xC2, b"x", true)),
        (
            "a continuation with nothing to continue",
            client_frame(0x80, b"x", true),
        ),
    ];
    for (what, frame) in violations {
        let id = daemon.create(json!({})).await;
        let mut ws = raw_websocket(&daemon, &id, "").await;
        ws.write_all(&frame).await.expect("writes the frame");
        assert_eq!(close_code(&mut ws).await, 1002, "{what}");
    }
}

#[tokio::test]
async fn ws_viewer_sending_invalid_utf8_closes_with_1007() {
    let daemon = start_with(Config::default()).await;
    let (id, _holder) = daemon.shell().await;
    let mut viewer = raw_websocket(&daemon, &id, "?mode=viewer").await;
    viewer
        .write_all(&client_frame(0x81, &[0xFF], true))
        .await
        .expect("writes the frame");
    assert_eq!(close_code(&mut viewer).await, 1007);
}
