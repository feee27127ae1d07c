//! The client side of execd's PTY sessions, for tests in process and against the `warren`
//! binary alike: a REST client of a daemon at some address, and a WebSocket client that sorts
//! what it receives (live output per channel, replay frames with their offsets, JSON frames,
//! the close frame). Every wait has a timeout naming what it expected. Starting the daemon is
//! the test's business.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::WAIT;

/// Most payload bytes in one live (`0x01`/`0x02`) frame.
pub const MAX_LIVE_PAYLOAD: usize = 32 * 1024;

/// A daemon at `base` (`http://host:port`), reached with `token` if it has one.
pub struct Daemon {
    pub base: String,
    pub http: reqwest::Client,
    pub token: Option<String>,
}

impl Daemon {
    /// The daemon at `base`, reached with `token`.
    pub fn at(base: String, token: Option<String>) -> Daemon {
        Daemon {
            base,
            http: reqwest::Client::new(),
            token,
        }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let builder = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(token) => builder.header("X-EXECD-ACCESS-TOKEN", token),
            None => builder,
        }
    }

    pub async fn post_raw(&self, path: &str, body: &str) -> (u16, Value) {
        let request = self
            .request(reqwest::Method::POST, path)
            .header("content-type", "application/json")
            .body(body.to_string());
        let response = answered(request, &format!("POST {path}")).await;
        status_and_body(response).await
    }

    pub async fn create(&self, body: Value) -> String {
        let (status, body) = self.post_raw("/pty", &body.to_string()).await;
        assert_eq!(status, 201, "POST /pty answered {body}");
        body["session_id"]
            .as_str()
            .expect("session_id is a string")
            .to_string()
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let request = self.request(reqwest::Method::GET, path);
        let response = answered(request, &format!("GET {path}")).await;
        status_and_body(response).await
    }

    pub async fn delete(&self, path: &str) -> (u16, String) {
        let request = self.request(reqwest::Method::DELETE, path);
        let response = answered(request, &format!("DELETE {path}")).await;
        let status = response.status().as_u16();
        (status, response.text().await.expect("body"))
    }

    pub async fn status(&self, id: &str) -> Value {
        let (status, body) = self.get(&format!("/pty/{id}")).await;
        assert_eq!(status, 200, "GET /pty/{id} answered {body}");
        body
    }

    /// The session's `output_offset`: how many bytes it has produced.
    pub async fn output_offset(&self, id: &str) -> u64 {
        self.status(id).await["output_offset"]
            .as_u64()
            .expect("output_offset is a number")
    }

    /// Waits (up to `timeout`) until the session has produced `n_bytes`; returns the offset.
    pub async fn wait_for_output_offset(&self, id: &str, n_bytes: u64, timeout: Duration) -> u64 {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let offset = self.output_offset(id).await;
            if offset >= n_bytes {
                return offset;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "output stuck at {offset} of {n_bytes} bytes after {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Opens a PTY session's WebSocket; `Err((status, body))` when the handshake is refused.
    pub async fn try_connect(&self, id: &str, query: &str) -> Result<Client, (u16, Value)> {
        self.try_connect_path(&format!("/pty/{id}/ws"), query).await
    }

    /// Opens the WebSocket at `path` (any route of the PTY protocol, an agent terminal's
    /// too); `Err((status, body))` when the handshake is refused.
    pub async fn try_connect_path(&self, path: &str, query: &str) -> Result<Client, (u16, Value)> {
        let ws_base = self.base.replacen("http://", "ws://", 1);
        let url = format!(
            "{ws_base}{path}{}{query}",
            if query.is_empty() { "" } else { "?" }
        );
        let mut request = url.into_client_request().expect("valid ws url");
        if let Some(token) = &self.token {
            request
                .headers_mut()
                .insert("X-EXECD-ACCESS-TOKEN", token.parse().expect("header"));
        }
        match tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
            .await
            .expect("the handshake is answered")
        {
            Ok((ws, _)) => Ok(Client::new(ws)),
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                let status = response.status().as_u16();
                let body = response.body().clone().unwrap_or_default();
                let body = serde_json::from_slice(&body)
                    .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into()));
                Err((status, body))
            }
            Err(error) => panic!("websocket connect failed: {error}"),
        }
    }

    /// Opens a PTY session's WebSocket and waits for the `connected` frame.
    pub async fn connect(&self, id: &str, query: &str) -> Client {
        self.connect_path(&format!("/pty/{id}/ws"), query).await
    }

    /// Opens the WebSocket at `path` and waits for the `connected` frame.
    pub async fn connect_path(&self, path: &str, query: &str) -> Client {
        let mut client = match self.try_connect_path(path, query).await {
            Ok(client) => client,
            Err((status, body)) => panic!("connect {query:?} refused: {status} {body}"),
        };
        client.wait_text("connected").await;
        client
    }

    /// A new session with an interactive shell and a connected holder whose prompt is up.
    pub async fn shell(&self) -> (String, Client) {
        let id = self.create(json!({})).await;
        let mut holder = self.connect(&id, "").await;
        holder.run("echo ready-$((40+2))", "ready-42").await;
        (id, holder)
    }
}

pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// One thing received.
#[derive(Debug, Clone)]
pub enum Event {
    Live(u8, Vec<u8>),
    Replay(u64, Vec<u8>),
    Text(Value),
    Close(u16, String),
    /// The stream ended without a close frame.
    Ended,
}

pub struct Client {
    pub ws: Ws,
    /// Everything received as stdout, stderr or replay, in order of arrival.
    pub all_output: Vec<u8>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub replays: Vec<(u64, Vec<u8>)>,
    pub texts: Vec<Value>,
    pub closed: Option<(u16, String)>,
}

impl Client {
    fn new(ws: Ws) -> Self {
        Self {
            ws,
            all_output: Vec::new(),
            stdout: Vec::new(),
            stderr: Vec::new(),
            replays: Vec::new(),
            texts: Vec::new(),
            closed: None,
        }
    }

    /// The next event, recorded in the client's logs. Panics after [`WAIT`] naming `expected`.
    pub async fn next_event(&mut self, expected: &str) -> Event {
        self.next_event_by(expected, tokio::time::Instant::now() + WAIT)
            .await
    }

    /// The next event; panics at `deadline` naming `expected`. The waits below share one
    /// deadline across many events, so a stream of other frames cannot make them wait forever.
    pub async fn next_event_by(&mut self, expected: &str, deadline: tokio::time::Instant) -> Event {
        if let Some((code, reason)) = &self.closed {
            return Event::Close(*code, reason.clone());
        }
        let message = tokio::time::timeout_at(deadline, self.ws.next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "timed out waiting for {expected}; output so far: {:?}; texts: {:?}",
                    String::from_utf8_lossy(&self.all_output),
                    self.texts
                )
            });
        let event = match message {
            None | Some(Err(_)) => Event::Ended,
            Some(Ok(Message::Binary(bytes))) => match bytes.first() {
                Some(3) => {
                    let offset = u64::from_be_bytes(bytes[1..9].try_into().expect("8 bytes"));
                    Event::Replay(offset, bytes[9..].to_vec())
                }
                Some(channel) => Event::Live(*channel, bytes[1..].to_vec()),
                None => Event::Live(255, Vec::new()),
            },
            Some(Ok(Message::Text(text))) => Event::Text(
                serde_json::from_str(text.as_str()).expect("server text frames are JSON"),
            ),
            Some(Ok(Message::Close(frame))) => {
                let (code, reason) = frame.map_or((1005, String::new()), |f| {
                    (u16::from(f.code), f.reason.to_string())
                });
                Event::Close(code, reason)
            }
            Some(Ok(_)) => return Box::pin(self.next_event_by(expected, deadline)).await,
        };
        if let Event::Live(_, bytes) = &event {
            assert!(
                bytes.len() <= MAX_LIVE_PAYLOAD,
                "a live frame holds at most 32 KiB, got {}",
                bytes.len()
            );
        }
        match &event {
            Event::Live(1, bytes) => {
                self.stdout.extend_from_slice(bytes);
                self.all_output.extend_from_slice(bytes);
            }
            Event::Live(2, bytes) => {
                self.stderr.extend_from_slice(bytes);
                self.all_output.extend_from_slice(bytes);
            }
            Event::Replay(offset, bytes) => {
                self.replays.push((*offset, bytes.clone()));
                self.all_output.extend_from_slice(bytes);
            }
            Event::Text(value) => self.texts.push(value.clone()),
            Event::Close(code, reason) => self.closed = Some((*code, reason.clone())),
            Event::Ended => self.closed = Some((1006, String::new())),
            Event::Live(..) => {}
        }
        event
    }

    pub fn output_text(&self) -> String {
        String::from_utf8_lossy(&self.all_output).into_owned()
    }

    /// Waits until the received output contains `needle`.
    pub async fn wait_output(&mut self, needle: &str) {
        let deadline = tokio::time::Instant::now() + WAIT;
        let expected = format!("output {needle:?}");
        while !self.output_text().contains(needle) {
            if let Event::Close(code, reason) = self.next_event_by(&expected, deadline).await {
                panic!(
                    "closed ({code} {reason}) before output {needle:?}; got {:?}",
                    self.output_text()
                );
            }
        }
    }

    /// Waits for the next JSON frame of `kind` (earlier frames of other kinds are kept).
    pub async fn wait_text(&mut self, kind: &str) -> Value {
        let deadline = tokio::time::Instant::now() + WAIT;
        let expected = format!("a {kind:?} frame");
        loop {
            match self.next_event_by(&expected, deadline).await {
                Event::Text(value) if value["type"] == kind => return value,
                Event::Close(code, reason) => {
                    panic!(
                        "closed ({code} {reason}) before a {kind:?} frame; texts: {:?}",
                        self.texts
                    )
                }
                _ => {}
            }
        }
    }

    /// Waits for the close frame, skipping anything before it.
    pub async fn wait_close(&mut self) -> (u16, String) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Event::Close(code, reason) =
                self.next_event_by("the close frame", deadline).await
            {
                return (code, reason);
            }
        }
    }

    /// Sends a close frame and waits for the daemon's.
    pub async fn close(&mut self) {
        self.send(Message::Close(None)).await;
        self.wait_close().await;
    }

    pub async fn send(&mut self, message: Message) {
        self.ws.send(message).await.expect("sends a frame");
    }

    pub async fn send_json(&mut self, value: Value) {
        self.send(Message::Text(value.to_string().into())).await;
    }

    pub async fn send_stdin(&mut self, text: &str) {
        let mut frame = vec![0u8];
        frame.extend_from_slice(text.as_bytes());
        self.send(Message::Binary(frame.into())).await;
    }

    /// Types `line` and waits for `needle` (choose one the echoed input does not contain).
    pub async fn run(&mut self, line: &str, needle: &str) {
        self.send_stdin(&format!("{line}\n")).await;
        self.wait_output(needle).await;
    }

    /// Types `line`, waits for `needle`, and returns the pid printed after each of `keys`
    /// (as in `echo key=$!`).
    pub async fn run_for_pids<const N: usize>(
        &mut self,
        line: &str,
        needle: &str,
        keys: [&str; N],
    ) -> [i32; N] {
        self.run(line, needle).await;
        let output = self.output_text();
        keys.map(|key| pid_after(&output, key))
    }

    /// Sends `frame` and expects an `INVALID_FRAME` error frame back.
    pub async fn send_invalid(&mut self, frame: Value) {
        self.send_json(frame.clone()).await;
        assert_eq!(
            self.wait_text("error").await["code"],
            "INVALID_FRAME",
            "{frame}"
        );
    }

    /// Waits for the next WebSocket ping from the daemon, reading (and so answering, as
    /// tungstenite queues the pong) whatever comes before it. Panics on a close.
    pub async fn wait_ws_ping(&mut self) {
        loop {
            let message = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .unwrap_or_else(|_| panic!("timed out waiting for a WebSocket ping"));
            match message {
                Some(Ok(Message::Ping(_))) => return,
                Some(Ok(Message::Close(frame))) => panic!("closed ({frame:?}) before a ping"),
                None | Some(Err(_)) => panic!("the connection ended before a ping"),
                Some(Ok(_)) => {}
            }
        }
    }

    /// Sends a ping frame and waits for the pong: proves the connection still works.
    pub async fn ping(&mut self) {
        self.send_json(json!({"type": "ping"})).await;
        self.wait_text("pong").await;
    }
}

/// Sends `request`; the daemon must answer within [`WAIT`].
async fn answered(request: reqwest::RequestBuilder, what: &str) -> reqwest::Response {
    tokio::time::timeout(WAIT, request.send())
        .await
        .unwrap_or_else(|_| panic!("{what} is answered within {WAIT:?}"))
        .unwrap_or_else(|error| panic!("{what} fails: {error}"))
}

/// An HTTP response's status and body (JSON when it parses, else the text as a string).
async fn status_and_body(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// The pid printed after the last `key` in `output` (as in `echo key=$!`).
pub fn pid_after(output: &str, key: &str) -> i32 {
    let start = output.rfind(key).expect("pid printed") + key.len();
    output[start..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .expect("pid")
}
