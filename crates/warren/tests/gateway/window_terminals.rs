//! The person's terminals through the gateway: `GET /v1/sessions/{id}/terminals/{name}/ws`
//! carries execd's PTY protocol unchanged (a real shell in bwrap hands, a real WebSocket
//! client): the shell answers, a viewer sees the holder's output, `takeover=1` evicts the
//! holder with 4001, a reconnect with `since` gets exactly the missing bytes, and bad names and
//! other devices' tokens are refused.

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use warren_gateway::hands::local::IsolationMode;

use crate::helpers::{TestGateway, WAIT, args_with_shell_agent};

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn open(gw: &TestGateway, token: &str, session: &str, name: &str, query: &str) -> Socket {
    let url = format!(
        "{}/v1/sessions/{session}/terminals/{name}/ws?access_token={token}&{query}",
        gw.url.replacen("http", "ws", 1)
    );
    let request = url.into_client_request().expect("request");
    let (socket, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("the terminal's WebSocket opens");
    socket
}

/// Reads until the output (live `0x01` or replay `0x03` frames) contains `needle`; returns
/// all output read.
async fn read_until(socket: &mut Socket, needle: &str) -> String {
    let mut output = String::new();
    tokio::time::timeout(WAIT, async {
        while !output.contains(needle) {
            match socket.next().await {
                Some(Ok(Message::Binary(frame))) => match frame.first() {
                    Some(0x01) => output.push_str(&String::from_utf8_lossy(&frame[1..])),
                    Some(0x03) if frame.len() >= 9 => {
                        output.push_str(&String::from_utf8_lossy(&frame[9..]))
                    }
                    _ => {}
                },
                Some(Ok(_)) => {}
                other => panic!("the socket ended before {needle:?}: {other:?}; read {output:?}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {needle:?} within the wait; read {output:?}"));
    output
}

async fn send_line(socket: &mut Socket, line: &str) {
    let mut frame = vec![0u8];
    frame.extend_from_slice(format!("{line}\n").as_bytes());
    socket
        .send(Message::Binary(frame.into()))
        .await
        .expect("stdin sent");
}

#[tokio::test]
async fn the_persons_shell_in_the_hands_speaks_the_pty_protocol_through_the_gateway() {
    let gw = TestGateway::start(|data| {
        let mut args = args_with_shell_agent(data);
        args.hands_isolation = IsolationMode::Bwrap;
        args
    })
    .await;
    let token = gw.register("phone-terminal-1").await;
    let session = gw.create_session(&token).await;

    let mut holder = open(&gw, &token, &session, "default", "").await;
    send_line(&mut holder, "echo at-$(pwd)-as-$(id -u)").await;
    read_until(&mut holder, "at-/workspace-as-1000").await;

    let listed: Value = gw
        .get_json(&token, &format!("/sessions/{session}/terminals"))
        .await;
    assert_eq!(listed[0]["name"], "default", "{listed}");
    assert_eq!(listed[0]["kind"], "shell");
    assert_eq!(listed[0]["running"], true);
    let offset = listed[0]["output_offset"].as_u64().expect("offset");
    assert!(offset > 0);

    // A viewer sees what the holder's shell prints.
    let mut viewer = open(&gw, &token, &session, "default", "mode=viewer").await;
    send_line(&mut holder, "echo seen-by-$((2+2))-viewers").await;
    read_until(&mut viewer, "seen-by-4-viewers").await;

    // A takeover evicts the holder with 4001; the new holder drives the same shell.
    let mut taker = open(&gw, &token, &session, "default", "takeover=1").await;
    let evicted = tokio::time::timeout(WAIT, async {
        loop {
            match holder.next().await {
                Some(Ok(Message::Close(Some(frame)))) => return u16::from(frame.code),
                Some(Ok(_)) => continue,
                other => panic!("no close frame: {other:?}"),
            }
        }
    })
    .await
    .expect("the holder is evicted");
    assert_eq!(evicted, 4001);
    send_line(&mut taker, "echo taken-$((40+2))").await;
    read_until(&mut taker, "taken-42").await;
    drop(taker);
    drop(viewer);

    // A reconnect with `since` gets exactly what came after it.
    let before: Value = gw
        .get_json(&token, &format!("/sessions/{session}/terminals"))
        .await;
    let since = before[0]["output_offset"].as_u64().expect("offset");
    let mut again = open(&gw, &token, &session, "default", &format!("since={since}")).await;
    send_line(&mut again, "echo after-$((1+1))").await;
    let output = read_until(&mut again, "after-2").await;
    assert!(
        !output.contains("taken-42"),
        "nothing from before `since`: {output:?}"
    );
    drop(again);
    gw.stop().await;
}

#[tokio::test]
async fn bad_terminal_names_and_other_devices_are_refused() {
    let gw = TestGateway::start(|data| {
        let mut args = args_with_shell_agent(data);
        args.hands_isolation = IsolationMode::Bwrap;
        args
    })
    .await;
    let token = gw.register("phone-terminal-2").await;
    let session = gw.create_session(&token).await;
    for name in ["Default", "a_b", &"x".repeat(33)] {
        let answer = gw
            .get(&token, &format!("/sessions/{session}/terminals/{name}/ws"))
            .await;
        assert_eq!(answer.status(), 400, "{name}");
        let body: Value = answer.json().await.expect("json");
        assert_eq!(body["code"], "INVALID_REQUEST_BODY");
    }
    let other = gw.register("phone-terminal-3").await;
    for path in [
        format!("/sessions/{session}/terminals"),
        format!("/sessions/{session}/terminals/default/ws"),
    ] {
        let answer = gw.get(&other, &path).await;
        assert_eq!(answer.status(), 404, "{path}");
        let body: Value = answer.json().await.expect("json");
        assert_eq!(body["code"], "SESSION_NOT_FOUND");
    }
    // Listing never starts the hands.
    let listed: Value = gw
        .get_json(&token, &format!("/sessions/{session}/terminals"))
        .await;
    assert_eq!(listed, serde_json::json!([]));
    assert_eq!(gw.session_info(&token, &session).await["hands"], "none");
    gw.stop().await;
}
