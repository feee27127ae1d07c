//! `/proxy/{port}/{path}`: execd's reverse proxy to a port beside it, against a real HTTP and
//! WebSocket server on loopback started by the test: the request as the app sees it (path,
//! query, `Host`, no execd token), bodies streamed both ways, a WebSocket echo, and the errors.

use std::sync::Arc;

use axum::extract::ws::{Message, WebSocketUpgrade};
use axum::http::HeaderMap;
use axum::routing::{any, get, post};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::opensandbox_support::Server;

const TOKEN: &str = "proxy-test-token";

/// The app the agent "started": echoes what it got, counts uploads, streams with a gate, and
/// echoes WebSocket messages.
async fn start_app(gate: Arc<Notify>) -> u16 {
    let app = axum::Router::new()
        .route(
            "/echo/{*rest}",
            any(|headers: HeaderMap, uri: axum::http::Uri| async move {
                let headers: serde_json::Map<String, Value> = headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), json!(v.to_str().unwrap_or(""))))
                    .collect();
                axum::Json(json!({"path": uri.path(), "query": uri.query(), "headers": headers}))
            }),
        )
        .route(
            "/count",
            post(|body: axum::body::Body| async move {
                let mut stream = body.into_data_stream();
                let mut n = 0usize;
                while let Some(Ok(chunk)) = stream.next().await {
                    n += chunk.len();
                }
                n.to_string()
            }),
        )
        .route(
            "/gated",
            get(move || {
                let gate = gate.clone();
                async move {
                    let chunks = futures_util::stream::unfold(0, move |step| {
                        let gate = gate.clone();
                        async move {
                            match step {
                                0 => Some((Ok::<_, std::io::Error>("first ".to_owned()), 1)),
                                1 => {
                                    gate.notified().await;
                                    Some((Ok("second".to_owned()), 2))
                                }
                                _ => None,
                            }
                        }
                    });
                    axum::body::Body::from_stream(chunks)
                }
            }),
        )
        .route(
            "/ws",
            get(|ws: WebSocketUpgrade| async move {
                ws.on_upgrade(|mut socket| async move {
                    while let Some(Ok(message)) = socket.recv().await {
                        if let Message::Text(text) = message {
                            let _ = socket
                                .send(Message::Text(format!("echo: {text}").into()))
                                .await;
                        }
                    }
                })
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    port
}

async fn with_token() -> Server {
    Server::start_with(|config| config.access_token = Some(TOKEN.to_owned())).await
}

fn get_with_token(server: &Server, path: &str) -> reqwest::RequestBuilder {
    server
        .client
        .get(server.url(path))
        .header("X-EXECD-ACCESS-TOKEN", TOKEN)
}

#[tokio::test]
async fn the_app_sees_its_own_path_and_host_and_never_execd_credentials() {
    let server = with_token().await;
    let port = start_app(Arc::new(Notify::new())).await;
    let answer: Value = get_with_token(&server, &format!("/proxy/{port}/echo/a/b?x=1&y=%20"))
        .header("Connection", "keep-alive, x-hop")
        .header("x-hop", "1")
        .send()
        .await
        .expect("answers")
        .json()
        .await
        .expect("json");
    assert_eq!(answer["path"], "/echo/a/b");
    assert_eq!(answer["query"], "x=1&y=%20");
    let headers = &answer["headers"];
    assert_eq!(headers["host"], format!("127.0.0.1:{port}"));
    assert_eq!(headers["x-forwarded-prefix"], format!("/proxy/{port}"));
    assert!(headers["x-forwarded-host"].is_string(), "{headers}");
    // (The hands nonce is dropped too: a unit test of the header filter shows it.)
    for gone in ["x-execd-access-token", "x-hop"] {
        assert!(
            headers.get(gone).is_none(),
            "{gone} reached the app: {headers}"
        );
    }
}

#[tokio::test]
async fn bodies_stream_both_ways() {
    let server = with_token().await;
    let gate = Arc::new(Notify::new());
    let port = start_app(gate.clone()).await;
    // 8 MiB up, in chunks, counted by the app.
    let chunks = futures_util::stream::iter(
        (0..128).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![7u8; 64 * 1024]))),
    );
    let counted = server
        .client
        .post(server.url(&format!("/proxy/{port}/count")))
        .header("X-EXECD-ACCESS-TOKEN", TOKEN)
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .expect("answers")
        .text()
        .await
        .expect("text");
    assert_eq!(counted, (8 * 1024 * 1024).to_string());
    // Down: the first chunk arrives while the app still holds the rest.
    let response = get_with_token(&server, &format!("/proxy/{port}/gated"))
        .send()
        .await
        .expect("answers");
    let mut body = response.bytes_stream();
    let first = body.next().await.expect("a first chunk").expect("readable");
    assert_eq!(&first[..], b"first ");
    gate.notify_one();
    let rest = body.next().await.expect("the rest").expect("readable");
    assert_eq!(&rest[..], b"second");
}

#[tokio::test]
async fn a_websocket_goes_through_both_ways() {
    let server = with_token().await;
    let port = start_app(Arc::new(Notify::new())).await;
    let url = format!("{}/proxy/{port}/ws", server.base.replacen("http", "ws", 1));
    let mut request =
        tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(url)
            .expect("request");
    request
        .headers_mut()
        .insert("X-EXECD-ACCESS-TOKEN", TOKEN.parse().expect("header"));
    let (mut socket, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("upgrades");
    for text in ["one", "two"] {
        socket
            .send(tokio_tungstenite::tungstenite::Message::Text(text.into()))
            .await
            .expect("sends");
        let answer = socket.next().await.expect("an answer").expect("readable");
        assert_eq!(
            answer.into_text().expect("text").as_str(),
            format!("echo: {text}")
        );
    }
}

#[tokio::test]
async fn bad_ports_nothing_listening_and_no_token_are_refused_clearly() {
    let server = with_token().await;
    for port in ["0", "70000", "abc", "-1"] {
        let response = get_with_token(&server, &format!("/proxy/{port}/x"))
            .send()
            .await
            .expect("answers");
        assert_eq!(response.status(), 400, "port {port}");
        let body: Value = response.json().await.expect("json");
        assert_eq!(body["code"], "INVALID_PORT", "port {port}");
    }
    // A port nobody listens on: a free one, closed again.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("binds")
        .local_addr()
        .expect("addr")
        .port();
    let response = get_with_token(&server, &format!("/proxy/{free}/"))
        .send()
        .await
        .expect("answers");
    assert_eq!(response.status(), 502);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["code"], "UPSTREAM_UNREACHABLE");
    let unauthorized = server
        .client
        .get(server.url(&format!("/proxy/{free}/")))
        .send()
        .await
        .expect("answers");
    assert_eq!(unauthorized.status(), 401);
}
