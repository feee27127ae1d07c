//! Shared helpers for the OpenSandbox-compatibility tests: a real execd on 127.0.0.1:0, a
//! reqwest client and stream-event parsing, each wait with a named timeout.

#![allow(dead_code)]

use std::path::PathBuf;

use serde_json::Value;
use warren_execd::{Config, Execd};
use warren_test_support::{WAIT, eventually_async};

pub struct Server {
    pub base: String,
    pub execd: Execd,
    pub client: reqwest::Client,
    /// The files root (a temporary directory unless the test chose `/`).
    pub root: PathBuf,
    _root_dir: Option<tempfile::TempDir>,
}

impl Server {
    /// An execd whose files API is confined to a fresh temporary directory.
    pub async fn start() -> Server {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(adjust: impl FnOnce(&mut Config)) -> Server {
        let root_dir = tempfile::tempdir().expect("creates a temporary root");
        let root = std::fs::canonicalize(root_dir.path()).expect("canonical root");
        let mut config = Config {
            root: root.clone(),
            ..Config::default()
        };
        adjust(&mut config);
        let root = config.root.clone();
        let execd = Execd::new(config);
        Server {
            base: crate::loopback::serve(execd.router()).await,
            execd,
            client: reqwest::Client::new(),
            root,
            _root_dir: Some(root_dir),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A path inside the root, as a string the API accepts.
    pub fn path(&self, rel: &str) -> String {
        self.root.join(rel).to_string_lossy().into_owned()
    }

    pub async fn post_json(&self, path: &str, body: Value) -> reqwest::Response {
        send(self.client.post(self.url(path)).json(&body)).await
    }

    /// POSTs `body` to `path` and returns the answer's body as it streams in.
    pub async fn post_stream(
        &self,
        path: &str,
        body: Value,
    ) -> impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + use<> {
        self.post_json(path, body).await.bytes_stream()
    }

    /// POSTs `body` to `/command` and returns the events' bytes as they stream in.
    pub async fn command_stream(
        &self,
        body: Value,
    ) -> impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + use<> {
        self.post_stream("/command", body).await
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        send(self.client.get(self.url(path))).await
    }

    /// GETs `path` and parses the body as JSON.
    pub async fn get_json(&self, path: &str) -> Value {
        self.get(path).await.json().await.expect("the body is JSON")
    }

    pub async fn delete(&self, path: &str) -> reqwest::Response {
        send(self.client.delete(self.url(path))).await
    }

    /// POSTs to a streaming route and collects every event until the stream ends.
    pub async fn events(&self, path: &str, body: Value) -> Vec<Value> {
        let response = self.post_json(path, body).await;
        assert_eq!(response.status(), 200, "stream request failed");
        let text = tokio::time::timeout(WAIT, response.text())
            .await
            .unwrap_or_else(|_| panic!("the stream ends within {WAIT:?}"))
            .expect("reads the stream");
        parse_events(&text)
    }

    /// Runs a foreground command and returns its events.
    pub async fn run(&self, body: Value) -> Vec<Value> {
        self.events("/command", body).await
    }

    /// Runs `command` in the foreground with no other option and returns its events.
    pub async fn run_command(&self, command: &str) -> Vec<Value> {
        self.run(serde_json::json!({ "command": command })).await
    }

    /// Starts `command` in the background and returns its id.
    pub async fn start_background(&self, command: &str) -> String {
        let events = self
            .run(serde_json::json!({"command": command, "background": true}))
            .await;
        command_id(&events)
    }

    /// `GET /command/status/{id}`.
    pub async fn command_status(&self, id: &str) -> Value {
        self.get_json(&format!("/command/status/{id}")).await
    }

    /// Waits until command `id` is recorded as finished and returns its status; `what` names
    /// the wait in the failure.
    pub async fn wait_until_finished(&self, id: &str, what: &str) -> Value {
        let path = format!("/command/status/{id}");
        eventually_async(what, || async {
            let status: Value = self.get(&path).await.json().await.ok()?;
            (status["running"] == false).then_some(status)
        })
        .await
    }

    /// `DELETE /command?id={id}`: interrupts a command (or closes a bash session).
    pub async fn interrupt(&self, id: &str) -> reqwest::Response {
        self.delete(&format!("/command?id={id}")).await
    }

    /// Creates a bash session with `body` and returns its id.
    pub async fn create_session(&self, body: Value) -> String {
        let response = self.post_json("/session", body).await;
        assert_eq!(response.status(), 200, "the session is created");
        let created: Value = response.json().await.expect("the body is JSON");
        created["session_id"]
            .as_str()
            .expect("the response names the session")
            .to_owned()
    }

    /// Runs `body` in bash session `id` and returns its events.
    pub async fn run_in_session(&self, id: &str, body: Value) -> Vec<Value> {
        self.events(&format!("/session/{id}/run"), body).await
    }

    pub async fn shutdown(&self) {
        self.execd.shutdown().await;
    }
}

/// Splits `{json}\n\n{json}\n\n...` and checks the framing on the way.
pub fn parse_events(text: &str) -> Vec<Value> {
    assert!(
        text.is_empty() || text.ends_with("\n\n"),
        "stream does not end with a blank line: {text:?}"
    );
    text.split("\n\n")
        .filter(|frame| !frame.is_empty())
        .map(|frame| {
            assert!(!frame.contains('\n'), "an event spans lines: {frame:?}");
            assert!(
                frame.starts_with('{'),
                "an event is not bare JSON: {frame:?}"
            );
            let event: Value = serde_json::from_str(frame).expect("each event is JSON");
            assert!(
                event["timestamp"].is_i64(),
                "event without integer timestamp: {frame}"
            );
            event
        })
        .collect()
}

/// Sends a request; the server must answer (at least the headers) within [`WAIT`].
pub async fn send(request: reqwest::RequestBuilder) -> reqwest::Response {
    tokio::time::timeout(WAIT, request.send())
        .await
        .unwrap_or_else(|_| panic!("the server answers within {WAIT:?}"))
        .expect("request is sent")
}

/// The command id that a stream's `init` event carries.
pub fn command_id(events: &[Value]) -> String {
    assert_eq!(events[0]["type"], "init", "the stream starts with init");
    events[0]["text"]
        .as_str()
        .expect("init carries the id")
        .to_owned()
}

pub fn kinds(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap_or("?").to_owned())
        .collect()
}

/// Texts of events of `kind`, in order.
pub fn texts(events: &[Value], kind: &str) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["type"] == kind)
        .map(|e| e["text"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Events other than `ping` (which may come at any time).
pub fn without_pings(events: &[Value]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e["type"] != "ping")
        .cloned()
        .collect()
}

/// Checks an error response's status and machine-readable code; returns its message.
pub async fn assert_error(response: reqwest::Response, status: u16, code: &str) -> String {
    let (got_status, got_code, message) = error_body(response).await;
    assert_eq!((got_status, got_code.as_str()), (status, code), "{message}");
    message
}

pub async fn error_body(response: reqwest::Response) -> (u16, String, String) {
    let status = response.status().as_u16();
    let body: Value = response.json().await.expect("error body is JSON");
    (
        status,
        body["code"].as_str().unwrap_or_default().to_owned(),
        body["message"].as_str().unwrap_or_default().to_owned(),
    )
}
