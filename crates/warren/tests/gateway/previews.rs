//! Previews: a `python3 -m http.server` the agent started in hands without a network is
//! reachable only through its preview URL (its own origin, `p-<token>.localhost`), which the
//! gateway proxies through the hands' execd; and the bad input each route gets.

use serde_json::{Value, json};
use warren_gateway::hands::local::NetworkMode;

use super::helpers::{Conversation, TestGateway, assert_error, in_bwrap};

/// A client that sends every `*.localhost` name to the gateway, as browsers resolve them.
fn preview_client(gateway_url: &str, preview_url: &str) -> reqwest::Client {
    let addr: std::net::SocketAddr = gateway_url
        .trim_start_matches("http://")
        .parse()
        .expect("the gateway's address");
    let host = preview_url
        .trim_start_matches("http://")
        .split(':')
        .next()
        .expect("a host")
        .to_owned();
    reqwest::Client::builder()
        .resolve(&host, addr)
        .build()
        .expect("client")
}

/// The URL of the preview `chat` creates for `port`.
async fn preview_url(chat: &Conversation<'_>, port: u16) -> String {
    let created: Value = chat
        .create_preview(json!(port))
        .await
        .json()
        .await
        .expect("json");
    created["url"].as_str().expect("url").to_owned()
}

/// A gateway with the shell agent and bwrap hands on `network`.
async fn on_network(network: NetworkMode) -> TestGateway {
    in_bwrap(|args| args.hands_network = network).await
}

#[tokio::test]
async fn a_dev_server_in_hands_without_a_network_is_served_through_its_preview() {
    let gw = on_network(NetworkMode::None).await;
    let mut chat = gw.conversation("phone-preview-01").await;
    chat.turn_ok("echo served-from-the-hands > index.txt; setsid nohup python3 -m http.server 8765 --bind 127.0.0.1 >/dev/null 2>&1 & echo started").await;

    let created = chat.create_preview(json!(8765)).await;
    assert_eq!(created.status(), 201);
    let preview: Value = created.json().await.expect("json");
    let url = preview["url"].as_str().expect("url").to_owned();
    assert!(
        url.starts_with("http://p-") && url.contains(".localhost:"),
        "{url}"
    );
    assert!(preview["expires_at"].is_string());

    let client = preview_client(&gw.url, &url);
    let body =
        warren_test_support::eventually_async("the dev server answers through its preview", || {
            let client = client.clone();
            let url = format!("{url}index.txt");
            async move {
                let response = client.get(&url).send().await.ok()?;
                (response.status() == 200).then_some(())?;
                response.text().await.ok()
            }
        })
        .await;
    assert_eq!(body, "served-from-the-hands\n");

    // The device token is never accepted on the preview origin.
    let refused = client
        .get(&url)
        .bearer_auth(&chat.token)
        .send()
        .await
        .expect("answers");
    assert_eq!(refused.status(), 403);
    let listed: Value = gw
        .get_json(&chat.token, &format!("/sessions/{}/previews", chat.session))
        .await;
    assert_eq!(listed[0]["url"], url.as_str());

    // Revoked: its URL is gone at once.
    let revoked = chat.revoke_preview(8765).await;
    assert_eq!(revoked.status(), 204);
    let gone = client.get(&url).send().await.expect("answers");
    assert_error(gone, 404, "PREVIEW_NOT_FOUND", "the revoked preview").await;
    gw.stop().await;
}

#[tokio::test]
async fn preview_bad_input_gets_clear_errors() {
    let gw = on_network(NetworkMode::Host).await;
    let chat = gw.conversation_after("phone-preview-02", "echo up").await;
    let previews = format!("/sessions/{}/previews", chat.session);
    for port in [json!(0), json!(70000), json!(-1), json!("80")] {
        let answer = chat.create_preview(port.clone()).await;
        assert_error(answer, 400, "INVALID_REQUEST_BODY", &format!("port {port}")).await;
    }
    // A port nobody listens on: created, and its URL answers 502.
    let url = preview_url(&chat, 9).await;
    let client = preview_client(&gw.url, &url);
    let unreachable = client.get(&url).send().await.expect("answers");
    assert_error(unreachable, 502, "PREVIEW_UNREACHABLE", "port 9").await;
    // An unknown token on the preview origin, and a preview nobody made.
    let unknown = url.replacen("http://p-", "http://p-0", 1);
    let unknown_client = preview_client(&gw.url, &unknown);
    let answer = unknown_client.get(&unknown).send().await.expect("answers");
    assert_eq!(answer.status(), 404);
    let missing = chat.revoke_preview(3000).await;
    assert_eq!(missing.status(), 404);
    // Another device's token on every preview route: the session does not exist for it.
    let other = gw.register("phone-preview-03").await;
    for (method, path) in [
        (reqwest::Method::POST, previews.clone()),
        (reqwest::Method::GET, previews.clone()),
        (reqwest::Method::DELETE, format!("{previews}/9")),
    ] {
        let answer = gw
            .request(method.clone(), &other, &path)
            .json(&json!({"port": 9}))
            .send()
            .await
            .expect("answers");
        assert_error(
            answer,
            404,
            "SESSION_NOT_FOUND",
            &format!("{method} {path}"),
        )
        .await;
    }
    // Deleting the session revokes its previews.
    let deleted = gw
        .delete(&chat.token, &format!("/sessions/{}", chat.session))
        .await;
    assert_eq!(deleted.status(), 204);
    assert_eq!(
        client.get(&url).send().await.expect("answers").status(),
        404
    );
    gw.stop().await;
}

/// A WebSocket through a preview: an echo server written with what the sandbox has (Python's
/// standard library, `tests/python/ws_echo_server.py`), reached on the preview's origin.
#[tokio::test]
async fn a_websocket_goes_through_a_preview_into_hands_without_a_network() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    let gw = on_network(NetworkMode::None).await;
    let mut chat = gw.conversation_after("phone-preview-ws", "echo up").await;
    std::fs::copy(
        warren_test_support::repo_root().join("tests/python/ws_echo_server.py"),
        chat.workspace().join("ws_echo_server.py"),
    )
    .expect("the echo server in the workspace");
    chat.turn_ok("setsid nohup python3 ws_echo_server.py 8766 >/dev/null 2>&1 & echo started")
        .await;
    let url = preview_url(&chat, 8766).await;
    // The preview's host, resolved to the gateway as a browser resolves `*.localhost`.
    let host = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let gateway_addr = gw.url.trim_start_matches("http://").to_owned();
    let mut socket = warren_test_support::eventually_async("the echo server accepts", || {
        let (host, gateway_addr) = (host.clone(), gateway_addr.clone());
        async move {
            let tcp = tokio::net::TcpStream::connect(&gateway_addr).await.ok()?;
            let request = format!("ws://{host}/socket").into_client_request().ok()?;
            let (socket, _) = tokio_tungstenite::client_async(request, tcp).await.ok()?;
            Some(socket)
        }
    })
    .await;
    for text in ["hello", "again"] {
        socket
            .send(Message::Text(text.into()))
            .await
            .expect("sends");
        let answer = tokio::time::timeout(super::helpers::WAIT, socket.next())
            .await
            .expect("an answer in time")
            .expect("a frame")
            .expect("readable");
        assert_eq!(
            answer.into_text().expect("text").as_str(),
            format!("echo: {text}")
        );
    }
    gw.stop().await;
}
