//! The gateway's HTTP edge: JSON arrays refused where an object belongs, the header and body
//! timeouts (raw `TcpStream`s send what no well-behaved client does), and event streams that
//! outlive those timeouts.

use std::path::PathBuf;
use std::time::Duration;

use reqwest::Method;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use warren_gateway::GatewayArgs;
use warren_protocol::gateway::EventBody;

use super::helpers::{EventStream, TestGateway, WAIT, args_without_agent};

/// Timeouts short enough to watch them fire.
fn args_with_short_timeouts(data: PathBuf) -> GatewayArgs {
    let mut args = args_without_agent(data);
    args.header_read_timeout_ms = 300;
    args.body_idle_timeout_ms = 300;
    args
}

async fn connect(gw: &TestGateway) -> TcpStream {
    let addr = gw.url.trim_start_matches("http://").to_owned();
    tokio::time::timeout(WAIT, TcpStream::connect(addr))
        .await
        .expect("connects within the wait")
        .expect("connects")
}

/// Reads until the gateway closes the connection; what it sent on the way.
async fn read_until_closed(stream: &mut TcpStream, what: &str) -> String {
    let mut received = Vec::new();
    let finished = tokio::time::timeout(WAIT, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => received.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(finished.is_ok(), "{what}: not closed within {WAIT:?}");
    String::from_utf8_lossy(&received).into_owned()
}

#[tokio::test]
async fn json_array_body_is_refused_as_400_on_every_object_route() {
    let gw = TestGateway::start(args_without_agent).await;
    let token = gw.register("phone-0001").await;
    let session = gw.create_session(&token).await;
    let routes = [
        "/sessions".to_owned(),
        format!("/sessions/{session}/messages"),
        format!("/sessions/{session}/permissions/perm-1"),
    ];
    for path in &routes {
        for body in ["[]", r#"["a title"]"#, r#"["echo hi", 1]"#] {
            let response = gw
                .request(Method::POST, &token, path)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .expect("request");
            let what = format!("POST {path} {body}");
            assert_eq!(response.status(), 400, "{what}");
            let answer: Value = response.json().await.expect("JSON error body");
            assert_eq!(answer["code"], "INVALID_REQUEST_BODY", "{what}: {answer}");
        }
    }
    let response = gw
        .http
        .post(format!("{}/v1/devices", gw.url))
        .header("X-App-Key", &gw.app_key)
        .header("content-type", "application/json")
        .body(r#"["phone-0002"]"#)
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 400, "POST /v1/devices with an array");
    // No session was made from an array.
    let list: Value = gw.get_json(&token, "/sessions").await;
    assert_eq!(list["sessions"].as_array().map(Vec::len), Some(1), "{list}");
    gw.stop().await;
}

#[tokio::test]
async fn half_sent_request_line_is_closed_after_header_read_timeout() {
    let gw = TestGateway::start(args_with_short_timeouts).await;
    let mut half = connect(&gw).await;
    half.write_all(b"POST /v1/sess").await.expect("writes");
    read_until_closed(&mut half, "half a request line").await;
    let mut silent = connect(&gw).await;
    read_until_closed(&mut silent, "a connection that sends nothing").await;
    let health = gw
        .http
        .get(format!("{}/healthz", gw.url))
        .send()
        .await
        .expect("the gateway keeps serving");
    assert_eq!(health.status(), 200);
    gw.stop().await;
}

#[tokio::test]
async fn body_short_of_its_content_length_times_out() {
    let gw = TestGateway::start(args_with_short_timeouts).await;
    let token = gw.register("phone-0001").await;
    let body = r#"{"title": "never finished"}"#;
    for path in ["/v1/sessions", "/v1/devices"] {
        let mut stream = connect(&gw).await;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nX-App-Key: {}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            gw.app_key,
            body.len() + 100
        );
        stream
            .write_all(head.as_bytes())
            .await
            .expect("writes head");
        stream
            .write_all(body.as_bytes())
            .await
            .expect("writes body");
        let answer = read_until_closed(&mut stream, path).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{path}: {answer}");
        assert!(
            answer.contains(r#""code":"REQUEST_TIMEOUT""#),
            "{path}: {answer}"
        );
    }
    gw.stop().await;
}

#[tokio::test]
async fn an_event_stream_outlives_the_request_timeouts() {
    let gw = TestGateway::start(args_with_short_timeouts).await;
    let token = gw.register("phone-0001").await;
    let id = gw.create_session(&token).await;
    let session = gw.gateway.engine.sessions.get("phone-0001", &id).expect("session");
    let response = gw.get(&token, &format!("/sessions/{id}/events")).await;
    let mut stream = EventStream::new(response);
    // Deliberately longer than both timeouts: the open stream must not be cut by them.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let seq = session
        .log
        .append(
            None,
            EventBody::Status {
                brain: Some("ready".into()),
                hands: None,
                message: None,
            },
        )
        .expect("append")
        .seq;
    let mut last = None;
    while last != Some(seq) {
        last = stream
            .next("the event appended after the timeouts")
            .await
            .expect("the stream is still open")
            .id;
    }
    gw.stop().await;
}
