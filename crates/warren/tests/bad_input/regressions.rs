//! Defects the matrix found, each pinned by a test named after what it was.

use crate::servers::{self, EXECD_TOKEN};
use crate::wire::{self, Body, Request};

/// A client's close frame is answered (the closing handshake completes): with 1002 when its
/// code is one no endpoint may send, with the echo otherwise. execd used to drop the connection
/// without writing the reply tungstenite had queued.
#[tokio::test]
async fn a_close_frame_is_answered_not_met_with_silence() {
    let server = servers::execd().await;
    let fixtures = crate::execd::fixtures(&server).await;
    let target = format!("/pty/{}/ws?mode=viewer", fixtures.pty);
    for (code, expected) in [(999u16, 1002u16), (1000, 1000), (4000, 4000)] {
        let request =
            Request::new("GET", target.clone()).header("X-EXECD-ACCESS-TOKEN", EXECD_TOKEN);
        let mut ws = wire::websocket(server.addr, &request)
            .await
            .expect("a viewer attaches");
        use tokio::io::AsyncWriteExt as _;
        ws.write_all(&wire::client_frame(0x88, &code.to_be_bytes(), true))
            .await
            .expect("writes the close frame");
        assert_eq!(
            wire::close_code(&mut ws).await,
            Some(expected),
            "the answer to a close with {code}"
        );
    }
}

/// envd's `/init` over its 1 MiB limit is 413 like every other body over a limit (it was 400).
#[tokio::test]
async fn an_init_body_over_the_limit_is_413_not_400() {
    let server = servers::execd().await;
    let body = format!(
        "{{\"envVars\": {{\"A\": \"{}\"}}}}",
        "a".repeat(2 * 1024 * 1024)
    );
    let request = Request::new("POST", "/init")
        .header("X-Access-Token", EXECD_TOKEN)
        .header("Content-Type", "application/json")
        .body(Body::Sized(body.into_bytes()));
    let response = wire::send(server.e2b.expect("the E2B listener"), &request)
        .await
        .expect("an answer");
    assert_eq!(response.status, 413);
    let json: serde_json::Value = serde_json::from_slice(&response.body).expect("a JSON body");
    assert_eq!(json["code"], 413, "{json}");
}

/// A wrong method on envd's `/health` answers 405 with a JSON body (it was an empty one).
#[tokio::test]
async fn a_wrong_method_on_envd_health_is_a_json_405_not_an_empty_body() {
    let server = servers::execd().await;
    let response = wire::send(
        server.e2b.expect("the E2B listener"),
        &Request::new("POST", "/health"),
    )
    .await
    .expect("an answer");
    assert_eq!(response.status, 405);
    let json: serde_json::Value = serde_json::from_slice(&response.body).expect("a JSON body");
    assert!(
        json["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{json}"
    );
}
