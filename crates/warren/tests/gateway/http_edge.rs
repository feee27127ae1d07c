//! The gateway's HTTP edge: JSON arrays refused where an object belongs, the header and body
//! timeouts (raw `TcpStream`s send what no well-behaved client does), and event streams that
//! outlive those timeouts.

use std::path::PathBuf;
use std::time::Duration;

use reqwest::Method;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use warren_gateway::GatewayArgs;
use warren_test_support::read_until_closed;

use super::helpers::{
    EventStream, TestGateway, append_ready_status, args_without_agent, assert_error,
};

/// Timeouts short enough to watch them fire.
fn args_with_short_timeouts(data: PathBuf) -> GatewayArgs {
    let mut args = args_without_agent(data);
    args.serve.header_read_timeout_ms = 300;
    args.serve.body_idle_timeout_ms = 300;
    args
}

/// A raw connection to the gateway.
async fn connect(gw: &TestGateway) -> TcpStream {
    warren_test_support::connect(gw.url.trim_start_matches("http://")).await
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
            assert_error(response, 400, "INVALID_REQUEST_BODY", &what).await;
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
    gw.assert_healthy("the gateway keeps serving").await;
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
        for part in [head.as_bytes(), body.as_bytes()] {
            stream.write_all(part).await.expect("writes");
        }
        let answer = read_until_closed(&mut stream, path).await;
        let timed_out = r#""code":"REQUEST_TIMEOUT""#;
        assert!(
            answer.starts_with("HTTP/1.1 408") && answer.contains(timed_out),
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
    let session = gw.session_of("phone-0001", &id);
    let response = gw.get(&token, &format!("/sessions/{id}/events")).await;
    let mut stream = EventStream::new(response);
    // Deliberately longer than both timeouts: the open stream must not be cut by them.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let seq = append_ready_status(&session);
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
