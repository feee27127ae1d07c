//! E2B envd compatibility: execd's envd router on 127.0.0.1:0, driven by the pinned `e2b` SDKs
//! (Python sync and async through `tests/python/e2b_sdk_test.py`, npm through
//! `tests/node/e2b_sdk_test.mjs`) and by raw Connect requests for what no SDK sends: bad
//! envelopes, unknown methods, wrong content types, unknown pids, paths out of the root,
//! missing tokens. Each must be a clear Connect error, never a hang. The raw requests also
//! cover what the SDK scripts only touch in passing: `StreamInput` as a real client stream,
//! `CloseStdin`, `/envs` and `/init`, the binary proto codec, and a stream that falls behind.

// The SDK scripts run as child processes of the test, as the other interoperability tests do.
#![allow(clippy::disallowed_methods)]

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use warren_execd::{Config, Execd};
use warren_test_support::{python, repo_root};

#[path = "support/loopback.rs"]
mod loopback;
#[path = "support/sdk_script.rs"]
mod sdk_script;

struct Server {
    base: String,
    root: PathBuf,
    client: reqwest::Client,
    _root_dir: tempfile::TempDir,
}

async fn start(token: Option<&str>) -> Server {
    start_with(token, None).await
}

/// A server whose daemon user's home (`--home`) is `home` below the root, created.
async fn start_with(token: Option<&str>, home: Option<&str>) -> Server {
    let root_dir = tempfile::tempdir().expect("creates a temporary root");
    let root = std::fs::canonicalize(root_dir.path()).expect("canonical root");
    let home = home.map(|home| {
        let home = root.join(home);
        std::fs::create_dir_all(&home).expect("creates the home");
        home
    });
    let execd = Execd::new(Config {
        root: root.clone(),
        access_token: token.map(str::to_owned),
        home,
        ..Config::default()
    });
    Server {
        base: loopback::serve(execd.e2b.router()).await,
        root,
        client: reqwest::Client::new(),
        _root_dir: root_dir,
    }
}

const WAIT: Duration = Duration::from_secs(30);

impl Server {
    /// Sends `request`, answered within [`WAIT`].
    async fn send(request: reqwest::RequestBuilder) -> reqwest::Response {
        tokio::time::timeout(WAIT, request.send())
            .await
            .expect("answered in time")
            .expect("answered")
    }

    /// A `POST` of `body` to `path` as `content_type`, with `headers` besides.
    async fn post(
        &self,
        path: &str,
        content_type: &str,
        headers: &[(&str, &str)],
        body: impl Into<reqwest::Body>,
    ) -> reqwest::Response {
        let mut request = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", content_type)
            .body(body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        Self::send(request).await
    }

    /// A `GET` of `path`.
    async fn get(&self, path: &str) -> reqwest::Response {
        Self::send(self.client.get(format!("{}{path}", self.base))).await
    }

    /// A unary JSON call with `body` as the raw request: status and JSON answer.
    async fn unary(&self, method: &str, body: &str) -> (u16, Value) {
        let response = self
            .post(
                &format!("/{method}"),
                "application/json",
                &[],
                body.to_owned(),
            )
            .await;
        json_answer(response).await
    }

    /// A unary JSON call of the message `body`.
    async fn call(&self, method: &str, body: Value) -> (u16, Value) {
        self.unary(method, &body.to_string()).await
    }

    /// `filesystem.Filesystem/Stat` of `path`.
    async fn stat(&self, path: &str) -> (u16, Value) {
        let body = json!({"path": path});
        self.call("filesystem.Filesystem/Stat", body).await
    }

    /// `POST /files?path=P` of `body` as an octet stream: status and JSON answer.
    async fn upload(&self, path: &str, body: &'static str) -> (u16, Value) {
        let path = format!("/files?path={path}");
        json_answer(
            self.post(&path, "application/octet-stream", &[], body)
                .await,
        )
        .await
    }

    /// A server-streaming call with `body` as the raw request bytes: every envelope's JSON.
    async fn stream_raw(
        &self,
        method: &str,
        body: Vec<u8>,
        headers: &[(&str, &str)],
    ) -> Vec<(u8, Value)> {
        let response = self
            .post(
                &format!("/{method}"),
                "application/connect+json",
                headers,
                body,
            )
            .await;
        let bytes = tokio::time::timeout(WAIT, response.bytes())
            .await
            .expect("the stream ends in time")
            .expect("the stream ends");
        parse_envelopes(&bytes)
    }

    async fn stream(
        &self,
        method: &str,
        message: Value,
        headers: &[(&str, &str)],
    ) -> Vec<(u8, Value)> {
        self.stream_raw(method, envelope(&message), headers).await
    }

    /// `Start` of `process` (a JSON `ProcessConfig`) without stdin, read to the end.
    async fn run(&self, process: Value, headers: &[(&str, &str)]) -> Vec<(u8, Value)> {
        let request = json!({"process": process, "stdin": false});
        self.stream("process.Process/Start", request, headers).await
    }
}

/// The status and body of `response` as JSON (`Null` when empty, a string when not JSON).
async fn json_answer(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let text = response.text().await.expect("a body");
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    };
    (status, body)
}

/// Asserts that `answer` is an error of `status` with `code` (a Connect code's name, or the
/// HTTP status of envd's own error body).
#[track_caller]
fn assert_error(answer: &(u16, Value), status: u16, code: Value, what: &str) {
    let (got_status, body) = answer;
    assert_eq!(
        (*got_status, &body["code"]),
        (status, &code),
        "{what}: {body}"
    );
}

/// The `end` event of a process's stream.
fn end_event(envelopes: &[(u8, Value)]) -> Value {
    envelopes
        .iter()
        .find_map(|(_, e)| e["event"].get("end").cloned())
        .expect("an end event")
}

/// Every envelope of a whole stream body, as JSON.
fn parse_envelopes(bytes: &[u8]) -> Vec<(u8, Value)> {
    let mut envelopes = Vec::new();
    let mut rest = bytes;
    while rest.len() >= 5 {
        let length = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let value = serde_json::from_slice(&rest[5..5 + length]).expect("each envelope is JSON");
        envelopes.push((rest[0], value));
        rest = &rest[5 + length..];
    }
    assert!(rest.is_empty(), "no bytes after the last envelope");
    envelopes
}

/// `message` as the one envelope of a JSON request stream.
fn envelope(message: &Value) -> Vec<u8> {
    envelope_of(&serde_json::to_vec(message).expect("JSON"))
}

/// `data` in an envelope without flags.
fn envelope_of(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// The error of a stream's end-of-stream envelope.
fn end_error(envelopes: &[(u8, Value)]) -> Value {
    let (flags, last) = envelopes.last().expect("at least the end of the stream");
    assert_eq!(
        *flags, 2,
        "the last envelope ends the stream: {envelopes:?}"
    );
    last["error"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_python_sdk_sync_and_async_work_against_warren() {
    let python = python();
    // The script's relative paths land in the home, which must be inside the root to be seen.
    let server = start_with(None, Some("home/user")).await;
    let script = repo_root().join("tests/python/e2b_sdk_test.py");
    sdk_script::assert_checks_pass(
        tokio::process::Command::new(&python)
            .arg(&script)
            .arg(&server.base)
            .arg(&server.root),
        "all e2b SDK checks passed",
    )
    .await;
}

#[tokio::test]
async fn unknown_services_and_methods_are_unimplemented() {
    let server = start(None).await;
    for method in [
        "process.Process/Nope",
        "nope.Service/Start",
        "filesystem.Filesystem/Format",
    ] {
        let answer = server.unary(method, "{}").await;
        assert_error(&answer, 501, json!("unimplemented"), method);
    }
}

#[tokio::test]
async fn a_wrong_content_type_is_415_with_a_connect_error() {
    let server = start(None).await;
    let response = server
        .post("/process.Process/List", "text/plain", &[], "{}")
        .await;
    let answer = json_answer(response).await;
    assert_error(&answer, 415, json!("invalid_argument"), "text/plain");
    let body = answer.1;
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("content type"),
        "{body}"
    );
}

#[tokio::test]
async fn invalid_json_and_bad_fields_are_invalid_argument() {
    let server = start(None).await;
    for body in ["{\"process\":", "[1]", "{\"process\":{\"pid\":-4}}"] {
        let answer = server.unary("process.Process/SendSignal", body).await;
        assert_error(&answer, 400, json!("invalid_argument"), body);
    }
}

#[tokio::test]
async fn unknown_pids_and_processes_of_other_trees_are_not_found() {
    let server = start(None).await;
    let own_pid = std::process::id();
    for body in [
        json!({"process": {"pid": 999_999_999u32}, "signal": "SIGNAL_SIGKILL"}),
        // The pid as a JSON string, as proto3 JSON allows; it is this test's own process.
        json!({"process": {"pid": own_pid.to_string()}, "signal": "SIGNAL_SIGTERM"}),
        json!({"process": {"pid": 1}, "signal": 9}),
    ] {
        let answer = server
            .call("process.Process/SendSignal", body.clone())
            .await;
        assert_error(&answer, 404, json!("not_found"), &body.to_string());
    }
    let envelopes = server
        .stream(
            "process.Process/Connect",
            json!({"process": {"pid": 999_999_999u32}}),
            &[],
        )
        .await;
    assert_eq!(end_error(&envelopes)["code"], "not_found");
}

#[tokio::test]
async fn truncated_and_oversized_envelopes_end_the_stream_with_an_error() {
    let server = start(None).await;
    let mut truncated = envelope(&json!({"process": {"cmd": "true"}}));
    truncated.truncate(truncated.len() - 3);
    let mut oversized = vec![0u8];
    oversized.extend_from_slice(&u32::MAX.to_be_bytes());
    oversized.extend_from_slice(b"{}");
    let cases = [
        ("truncated", truncated, "invalid_argument"),
        ("oversized", oversized, "resource_exhausted"),
        (
            "flags 0x40",
            vec![0x40, 0, 0, 0, 2, b'{', b'}'],
            "invalid_argument",
        ),
    ];
    for (what, body, code) in cases {
        let envelopes = server.stream_raw("process.Process/Start", body, &[]).await;
        assert_eq!(end_error(&envelopes)["code"], code, "{what}");
    }
}

#[tokio::test]
async fn start_streams_start_then_output_then_end() {
    let server = start(None).await;
    let process = json!({"cmd": "/bin/sh", "args": ["-c", "printf hi; exit 4"]});
    let envelopes = server.run(process, &[]).await;
    assert!(
        envelopes[0].1["event"]["start"]["pid"].as_u64().is_some(),
        "{envelopes:?}"
    );
    let stdout: Vec<u8> = envelopes
        .iter()
        .filter_map(|(_, e)| e["event"]["data"]["stdout"].as_str())
        .flat_map(base64_decode)
        .collect();
    assert_eq!(stdout, b"hi");
    let end = end_event(&envelopes);
    assert_eq!(end["exitCode"], 4, "{end}");
    assert_eq!(end["exited"], true, "{end}");
    assert_eq!(
        envelopes.last().map(|(f, v)| (*f, v.clone())),
        Some((2, json!({})))
    );
}

#[tokio::test]
async fn a_timeout_kills_the_whole_tree_not_just_the_shell() {
    let server = start(None).await;
    // A duration no other test uses, to find the sleep in /proc.
    let command = "sleep 37.25; echo x";
    let process = json!({"cmd": "/bin/bash", "args": ["-c", command]});
    let envelopes = server.run(process, &[("connect-timeout-ms", "700")]).await;
    assert_eq!(
        end_error(&envelopes)["code"],
        "deadline_exceeded",
        "{envelopes:?}"
    );
    let sleeping = std::fs::read_dir("/proc")
        .expect("reads /proc")
        .filter_map(|entry| std::fs::read(entry.ok()?.path().join("cmdline")).ok())
        .any(|cmdline| String::from_utf8_lossy(&cmdline).contains("37.25"));
    assert!(!sleeping, "the sleep outlived the timeout");
}

#[tokio::test]
async fn paths_escaping_the_root_are_permission_denied() {
    let server = start(None).await;
    for path in ["/etc/passwd", "../../etc", "/"] {
        let answer = server.stat(path).await;
        if path == "/" {
            // The root's parent is outside; `/` itself is not under a temporary root either.
            assert_eq!(answer.1["code"], "permission_denied", "{path}: {answer:?}");
            continue;
        }
        assert_error(&answer, 403, json!("permission_denied"), path);
    }
    let response = server.get("/files?path=/etc/passwd").await;
    assert_eq!(response.status().as_u16(), 403);
}

#[tokio::test]
async fn stat_reports_int64_sizes_as_strings_and_missing_paths_as_not_found() {
    let server = start(None).await;
    std::fs::write(server.root.join("ten.txt"), "0123456789").expect("writes");
    let (status, answer) = server.stat("ten.txt").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["entry"]["size"], "10", "{answer}");
    assert_eq!(answer["entry"]["type"], "FILE_TYPE_FILE", "{answer}");
    assert_eq!(
        answer["entry"]["permissions"].as_str().map(|p| p.len()),
        Some(10)
    );
    assert_error(
        &server.stat("missing").await,
        404,
        json!("not_found"),
        "missing",
    );
}

#[tokio::test]
async fn a_watch_on_a_missing_directory_ends_with_not_found() {
    let server = start(None).await;
    let nowhere = json!({"path": "nowhere"});
    let envelopes = server
        .stream("filesystem.Filesystem/WatchDir", nowhere.clone(), &[])
        .await;
    assert_eq!(end_error(&envelopes)["code"], "not_found", "{envelopes:?}");
    let answer = server
        .call("filesystem.Filesystem/CreateWatcher", nowhere)
        .await;
    assert_error(&answer, 404, json!("not_found"), "CreateWatcher");
}

#[tokio::test]
async fn a_token_is_required_when_execd_has_one_except_for_health() {
    let server = start(Some("sekret")).await;
    let answer = server.unary("process.Process/List", "{}").await;
    assert_error(&answer, 401, json!("unauthenticated"), "no token");
    assert_eq!(server.get("/health").await.status().as_u16(), 204);
    assert_eq!(server.list_with_token("sekret").await, 200);
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .expect("bytes are base64")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_js_sdk_works_against_warren() {
    let dir = tokio::task::spawn_blocking(warren_test_support::node_packages)
        .await
        .expect("installs tests/node");
    let server = start(None).await;
    sdk_script::assert_checks_pass(
        tokio::process::Command::new("node")
            .arg(dir.join("e2b_sdk_test.mjs"))
            .arg(&server.base)
            .arg(&server.root),
        "all e2b JS SDK checks passed",
    )
    .await;
}

/// A streaming response read envelope by envelope as it arrives, for streams that stay open
/// while the test makes other calls.
struct EnvelopeStream {
    response: reqwest::Response,
    buffer: Vec<u8>,
}

impl EnvelopeStream {
    /// `response`'s body, read envelope by envelope.
    fn new(response: reqwest::Response) -> Self {
        Self {
            response,
            buffer: Vec::new(),
        }
    }

    /// The next envelope's flags and payload; `None` once the body has ended.
    async fn next_raw(&mut self) -> Option<(u8, Vec<u8>)> {
        loop {
            if self.buffer.len() >= 5 {
                let b = &self.buffer;
                let length = u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize;
                if b.len() >= 5 + length {
                    let flags = b[0];
                    let data = b[5..5 + length].to_vec();
                    self.buffer.drain(..5 + length);
                    return Some((flags, data));
                }
            }
            let chunk = tokio::time::timeout(WAIT, self.response.chunk())
                .await
                .expect("the stream sends its next envelope in time")
                .expect("the stream reads");
            match chunk {
                Some(chunk) => self.buffer.extend_from_slice(&chunk),
                None => {
                    assert!(self.buffer.is_empty(), "no bytes after the last envelope");
                    return None;
                }
            }
        }
    }

    /// The next envelope, which must come, as JSON.
    async fn next(&mut self) -> (u8, Value) {
        let (flags, data) = self.next_raw().await.expect("another envelope");
        (
            flags,
            serde_json::from_slice(&data).expect("each envelope is JSON"),
        )
    }

    /// Every envelope up to the end of the body.
    async fn rest(&mut self) -> Vec<(u8, Value)> {
        let mut envelopes = Vec::new();
        while let Some((flags, data)) = self.next_raw().await {
            envelopes.push((
                flags,
                serde_json::from_slice(&data).expect("each envelope is JSON"),
            ));
        }
        envelopes
    }

    /// Reads data events until their stdout is `expected` (and fails on anything else).
    async fn stdout_until(&mut self, expected: &[u8]) {
        let mut stdout = Vec::new();
        while stdout.len() < expected.len() {
            let (flags, envelope) = self.next().await;
            assert_eq!(flags, 0, "output before the end: {envelope}");
            if let Some(data) = envelope["event"]["data"]["stdout"].as_str() {
                stdout.extend(base64_decode(data));
            }
        }
        assert_eq!(stdout, expected);
    }
}

impl Server {
    /// A server stream opened with one JSON request message, read as it arrives.
    async fn open_stream(&self, method: &str, message: Value) -> EnvelopeStream {
        let path = format!("/{method}");
        let response = self
            .post(&path, "application/connect+json", &[], envelope(&message))
            .await;
        assert_eq!(response.status().as_u16(), 200);
        EnvelopeStream::new(response)
    }

    /// `Start` of `process` (a JSON `ProcessConfig`) with `stdin`: the stream after its start
    /// event, and the pid that event names.
    async fn start_process(&self, process: Value, stdin: bool) -> (EnvelopeStream, u64) {
        self.start_request(json!({"process": process, "stdin": stdin}))
            .await
    }

    /// `Start` of the whole JSON `StartRequest` `request`: as [`Server::start_process`].
    async fn start_request(&self, request: Value) -> (EnvelopeStream, u64) {
        let mut stream = self.open_stream("process.Process/Start", request).await;
        let (flags, first) = stream.next().await;
        let pid = first["event"]["start"]["pid"].as_u64();
        assert_eq!(flags, 0, "{first}");
        (stream, pid.expect("the first event is start{pid}"))
    }

    /// The status of `List` with `token` as `X-Access-Token`.
    async fn list_with_token(&self, token: &str) -> u16 {
        let token = [("x-access-token", token)];
        let path = "/process.Process/List";
        let response = self.post(path, "application/json", &token, "{}").await;
        response.status().as_u16()
    }

    /// A plain HTTP request of the envd API: status and JSON body (`Null` when empty).
    async fn http(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&str>,
        token: Option<&str>,
    ) -> (u16, Value) {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_owned());
        }
        if let Some(token) = token {
            request = request.header("x-access-token", token);
        }
        json_answer(Self::send(request).await).await
    }

    /// `GET /envs` with `token`.
    async fn envs(&self, token: Option<&str>) -> (u16, Value) {
        self.http(reqwest::Method::GET, "/envs", None, token).await
    }

    /// `POST /init` of `body` with `token`.
    async fn init(&self, body: &str, token: Option<&str>) -> (u16, Value) {
        self.http(reqwest::Method::POST, "/init", Some(body), token)
            .await
    }

    /// `SendSignal` of SIGKILL to `pid`.
    async fn send_kill(&self, pid: u64) -> (u16, Value) {
        let body = json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"});
        self.call("process.Process/SendSignal", body).await
    }

    async fn kill(&self, pid: u64) {
        let (status, answer) = self.send_kill(pid).await;
        assert_eq!(status, 200, "{answer}");
    }

    /// Waits until `List` no longer holds `pid` (the process has ended and been reaped).
    async fn wait_until_gone(&self, pid: u64) {
        tokio::time::timeout(WAIT, async {
            loop {
                let (_, listed) = self.unary("process.Process/List", "{}").await;
                let listed = listed["processes"].as_array().cloned().unwrap_or_default();
                if !listed.iter().any(|p| p["pid"].as_u64() == Some(pid)) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the process ends and leaves the list in time");
    }
}

fn stdin_message(bytes: &[u8]) -> Value {
    json!({"data": {"input": {"stdin": base64_encode(bytes)}}})
}

#[tokio::test]
async fn stream_input_writes_each_message_to_stdin_while_the_client_stream_is_open() {
    let server = start(None).await;
    let (_start_stream, pid) = server.start_process(json!({"cmd": "/bin/cat"}), true).await;
    let mut output = server
        .open_stream("process.Process/Connect", json!({"process": {"pid": pid}}))
        .await;
    let (_, first) = output.next().await;
    assert_eq!(
        first["event"]["start"]["pid"].as_u64(),
        Some(pid),
        "{first}"
    );

    let (input_tx, input_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    let body = futures_util::stream::unfold(input_rx, async |mut rx| {
        let bytes = rx.recv().await?;
        Some((Ok::<_, std::io::Error>(bytes), rx))
    });
    let request = server
        .client
        .post(format!("{}/process.Process/StreamInput", server.base))
        .header("content-type", "application/connect+json")
        .body(reqwest::Body::wrap_stream(body));
    let answer = tokio::spawn(async move {
        let response = request.send().await.expect("answered");
        let status = response.status().as_u16();
        (status, response.bytes().await.expect("the answer ends"))
    });

    let start = json!({"start": {"process": {"pid": pid}}});
    input_tx.send(envelope(&start)).await.expect("sends start");
    input_tx
        .send(envelope(&stdin_message(b"first\n")))
        .await
        .expect("sends data");
    output.stdout_until(b"first\n").await;
    input_tx
        .send(envelope(&json!({"keepalive": {}})))
        .await
        .expect("sends a keepalive");
    input_tx
        .send(envelope(&stdin_message(b"second\n")))
        .await
        .expect("sends data");
    output.stdout_until(b"second\n").await;
    // A client stream ends with the end of its body.
    drop(input_tx);

    let (status, bytes) = tokio::time::timeout(WAIT, answer)
        .await
        .expect("StreamInput answers once its stream ends")
        .expect("the request task");
    assert_eq!(status, 200);
    assert_eq!(
        parse_envelopes(&bytes),
        [(0, json!({})), (2, json!({}))],
        "one empty StreamInputResponse, then the end of the stream"
    );
    server.kill(pid).await;
}

#[tokio::test]
async fn stream_input_without_start_to_unknown_pids_or_without_stdin_ends_with_an_error() {
    let server = start(None).await;
    let (_cat_stream, cat) = server.start_process(json!({"cmd": "/bin/cat"}), true).await;
    let (_sleep_stream, no_stdin) = server
        .start_process(json!({"cmd": "/bin/sleep", "args": ["30"]}), false)
        .await;
    let start = |pid: u64| envelope(&json!({"start": {"process": {"pid": pid}}}));
    let data = envelope(&stdin_message(b"x"));
    let cases: [(&str, Vec<u8>, &str); 6] = [
        ("an empty stream", Vec::new(), "invalid_argument"),
        ("data before start", data.clone(), "invalid_argument"),
        (
            "start without a selector",
            envelope(&json!({"start": {}})),
            "invalid_argument",
        ),
        (
            "an unknown pid",
            [start(999_999_999), data.clone()].concat(),
            "not_found",
        ),
        (
            "a second start",
            [start(cat), data.clone(), start(cat)].concat(),
            "invalid_argument",
        ),
        (
            "a process without stdin",
            [start(no_stdin), data.clone()].concat(),
            "failed_precondition",
        ),
    ];
    for (case, body, code) in cases {
        let envelopes = server
            .stream_raw("process.Process/StreamInput", body, &[])
            .await;
        assert_eq!(envelopes.len(), 1, "{case}: only the end: {envelopes:?}");
        assert_eq!(end_error(&envelopes)["code"], code, "{case}: {envelopes:?}");
    }
    let answer = server
        .call(
            "process.Process/StreamInput",
            json!({"start": {"process": {"pid": cat}}}),
        )
        .await;
    let what = "StreamInput is a streaming call";
    assert_error(&answer, 415, json!("invalid_argument"), what);
    server.kill(cat).await;
    server.kill(no_stdin).await;
}

#[tokio::test]
async fn close_stdin_lets_cat_finish_with_exit_code_0() {
    let server = start(None).await;
    let (mut stream, pid) = server.start_process(json!({"cmd": "/bin/cat"}), true).await;
    let input = json!({"process": {"pid": pid}, "input": {"stdin": base64_encode(b"bye\n")}});
    let answer = server.call("process.Process/SendInput", input).await;
    assert_eq!(answer, (200, json!({})));
    stream.stdout_until(b"bye\n").await;
    let close = json!({"process": {"pid": pid}});
    let answer = server.call("process.Process/CloseStdin", close).await;
    assert_eq!(answer, (200, json!({})));
    let rest = stream.rest().await;
    let end = end_event(&rest);
    // proto3 JSON leaves a zero exit code out, as envd's protojson does.
    assert_eq!(
        end.get("exitCode").and_then(Value::as_i64).unwrap_or(0),
        0,
        "{end}"
    );
    assert_eq!(end["status"], "exit status 0", "{end}");
    assert_eq!(end["exited"], true, "{end}");
    assert_eq!(rest.last(), Some(&(2, json!({}))), "{rest:?}");
}

#[tokio::test]
async fn close_stdin_without_a_pipe_or_a_selector_and_input_after_it_are_refused() {
    let server = start(None).await;
    let (_sleep_stream, sleep) = server
        .start_process(json!({"cmd": "/bin/sleep", "args": ["30"]}), true)
        .await;
    let (_pty_stream, pty) = server
        .start_request(json!({"process": {"cmd": "/bin/sleep", "args": ["30"]},
                              "pty": {"size": {"rows": 24, "cols": 80}}}))
        .await;
    let close = |pid: u64| json!({"process": {"pid": pid}}).to_string();
    let answer = server
        .unary("process.Process/CloseStdin", &close(sleep))
        .await;
    assert_eq!(answer, (200, json!({})));
    // The sleep does not read stdin, so it runs on with it closed.
    let input = json!({"process": {"pid": sleep}, "input": {"stdin": base64_encode(b"x")}});
    let cases = [
        ("SendInput", input.to_string(), 400, "failed_precondition"),
        ("CloseStdin", close(pty), 400, "failed_precondition"),
        ("CloseStdin", close(999_999_999), 404, "not_found"),
        ("CloseStdin", "{}".to_owned(), 400, "invalid_argument"),
        (
            "CloseStdin",
            "{\"process\":7}".to_owned(),
            400,
            "invalid_argument",
        ),
    ];
    for (method, body, status, code) in cases {
        let answer = server
            .unary(&format!("process.Process/{method}"), &body)
            .await;
        assert_error(&answer, status, json!(code), &format!("{method} {body}"));
    }
    server.kill(sleep).await;
    server.kill(pty).await;
}

#[tokio::test]
async fn init_env_vars_are_merged_listed_by_envs_and_seen_by_later_processes() {
    let server = start(None).await;
    assert_eq!(server.envs(None).await, (200, json!({})));
    let first = json!({"envVars": {"WARREN_A": "from-init", "WARREN_B": "b1"}}).to_string();
    let second = json!({"envVars": {"WARREN_B": "b2", "WARREN_C": "c"}}).to_string();
    for body in [first, second] {
        let answer = server.init(&body, None).await;
        assert_eq!(answer, (204, Value::Null), "{body}");
    }
    assert_eq!(
        server.envs(None).await,
        (
            200,
            json!({"WARREN_A": "from-init", "WARREN_B": "b2", "WARREN_C": "c"})
        )
    );
    // The process's own envs win over /init's.
    let script = r#"printf '%s %s %s' "$WARREN_A" "$WARREN_B" "$WARREN_C""#;
    let (mut stream, _) = server
        .start_process(
            json!({"cmd": "/bin/sh", "args": ["-c", script], "envs": {"WARREN_C": "own"}}),
            false,
        )
        .await;
    stream.stdout_until(b"from-init b2 own").await;
}

#[tokio::test]
async fn bad_init_bodies_are_400_in_envds_error_shape_and_change_nothing() {
    let server = start(None).await;
    for body in [
        r#"{"envVars": {"A=B": "x"}}"#,
        r#"{"envVars": {"": "x"}}"#,
        "{\"envVars\": {\"A\": \"nul\\u0000\"}}",
        r#"{"envVars": {"A": 1}}"#,
        r#"{"envVars": "#,
    ] {
        let answer = server.init(body, None).await;
        assert_error(&answer, 400, json!(400), body);
        assert!(answer.1["message"].is_string(), "{body}: {answer:?}");
    }
    assert_eq!(server.envs(None).await, (200, json!({})));
}

#[tokio::test]
async fn a_token_set_by_init_is_required_afterwards_when_none_was_configured() {
    let server = start(None).await;
    let (status, _) = server.unary("process.Process/List", "{}").await;
    assert_eq!(status, 200, "no token yet");
    let body = json!({"accessToken": "from-init"}).to_string();
    assert_eq!(server.init(&body, None).await, (204, Value::Null));

    let answer = server.unary("process.Process/List", "{}").await;
    assert_error(&answer, 401, json!("unauthenticated"), "no token");
    for token in [None, Some("wrong")] {
        let answer = server.envs(token).await;
        assert_error(&answer, 401, json!(401), &format!("{token:?}"));
    }
    assert_eq!(server.envs(Some("from-init")).await.0, 200);
    assert_eq!(server.list_with_token("from-init").await, 200);

    // Once set, the token stays: the same one again is fine, another is refused.
    let again = server.init(&body, Some("from-init")).await;
    assert_eq!(again, (204, Value::Null));
    let other = json!({"accessToken": "other"}).to_string();
    let answer = server.init(&other, Some("from-init")).await;
    assert_error(&answer, 403, json!(403), "another token");
    let still = server.envs(Some("other")).await.0;
    assert_eq!(still, 401, "the refused token was not taken");
}

#[tokio::test]
async fn init_cannot_replace_a_configured_token() {
    let server = start(Some("sekret")).await;
    let body = json!({"accessToken": "mine"}).to_string();
    let answer = server.init(&body, None).await;
    assert_error(&answer, 401, json!(401), "no token");
    let answer = server.init(&body, Some("sekret")).await;
    assert_error(&answer, 403, json!(403), "the configured token");
    let (status, _) = server.envs(Some("sekret")).await;
    assert_eq!(status, 200, "the configured token still works");
}

#[tokio::test]
async fn init_fields_for_the_clock_hosts_and_mounts_are_accepted_and_change_nothing() {
    let server = start(None).await;
    let hosts_before = std::fs::read("/etc/hosts").ok();
    let mounts_before = std::fs::read("/proc/self/mountinfo").expect("reads mountinfo");
    let mount_point = server.root.join("nfs");
    let body = json!({
        "timestamp": "2001-02-03T04:05:06Z",
        "hyperloopIP": "10.11.12.13",
        "volumeMounts": [{"nfs_target": "10.11.12.13:/export", "path": mount_point}],
        "defaultUser": "nobody",
        "defaultWorkdir": "/",
    })
    .to_string();
    let answer = server.init(&body, None).await;
    assert_eq!(answer, (204, Value::Null), "accepted as envd does");

    assert_eq!(std::fs::read("/etc/hosts").ok(), hosts_before, "/etc/hosts");
    let mounts_after = std::fs::read("/proc/self/mountinfo").expect("reads mountinfo");
    assert_eq!(mounts_after, mounts_before, "the mount table");
    assert!(!mount_point.exists(), "no mount point was made");
    let year_2020 = std::time::UNIX_EPOCH + Duration::from_secs(1_577_836_800);
    assert!(std::time::SystemTime::now() > year_2020, "the clock");
    assert_eq!(server.envs(None).await, (200, json!({})));
    // Neither the default user nor the default directory of later processes moved.
    let (mut stream, _) = server
        .start_process(
            json!({"cmd": "/bin/sh", "args": ["-c", "id -u; pwd"]}),
            false,
        )
        .await;
    let expected = format!(
        "{}\n{}\n",
        rustix::process::getuid().as_raw(),
        server.root.display()
    );
    stream.stdout_until(expected.as_bytes()).await;
}

/// A unary call in the binary codec: status, content type and body.
async fn unary_proto(server: &Server, method: &str, body: Vec<u8>) -> (u16, String, Vec<u8>) {
    let response = server
        .post(&format!("/{method}"), "application/proto", &[], body)
        .await;
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = response.bytes().await.expect("a body").to_vec();
    (status, content_type, body)
}

#[tokio::test]
async fn unary_calls_in_application_proto_take_and_answer_prost_messages() {
    use prost::Message as _;
    use warren_execd::e2b::proto::process as pb;

    let server = start(None).await;
    let (mut stream, pid) = server
        .start_request(json!({"process": {"cmd": "/bin/sleep", "args": ["30"]},
                              "tag": "proto-tag", "stdin": false}))
        .await;
    let pid = pid as u32;

    let (status, content_type, body) = unary_proto(
        &server,
        "process.Process/List",
        pb::ListRequest {}.encode_to_vec(),
    )
    .await;
    assert_eq!((status, content_type.as_str()), (200, "application/proto"));
    let listed = pb::ListResponse::decode(&body[..]).expect("a ListResponse");
    let info = listed
        .processes
        .iter()
        .find(|p| p.pid == pid)
        .expect("the sleep is listed");
    assert_eq!(info.tag.as_deref(), Some("proto-tag"));
    let config = info.config.as_ref().expect("its config");
    assert_eq!(
        (config.cmd.as_str(), &config.args[..]),
        ("/bin/sleep", &["30".to_owned()][..])
    );

    let selector = |pid: u32| pb::ProcessSelector {
        selector: Some(pb::process_selector::Selector::Pid(pid)),
    };
    let kill = |pid: u32| pb::SendSignalRequest {
        process: Some(selector(pid)),
        signal: pb::Signal::Sigkill as i32,
    };
    // Unary errors are JSON whatever the codec, as the Connect spec says.
    for (body, want_status, code) in [
        (kill(999_999_999).encode_to_vec(), 404, "not_found"),
        (vec![0xff, 0xff, 0xff], 400, "invalid_argument"),
        (
            pb::SendSignalRequest {
                process: Some(selector(pid)),
                signal: 3,
            }
            .encode_to_vec(),
            400,
            "invalid_argument",
        ),
    ] {
        let (status, content_type, answer) =
            unary_proto(&server, "process.Process/SendSignal", body).await;
        let answer: Value = serde_json::from_slice(&answer).expect("a JSON error");
        assert_eq!(
            (status, content_type.as_str()),
            (want_status, "application/json"),
            "{answer}"
        );
        assert_eq!(answer["code"], code, "{answer}");
    }

    let (status, _, body) = unary_proto(
        &server,
        "process.Process/SendSignal",
        kill(pid).encode_to_vec(),
    )
    .await;
    assert_eq!(status, 200);
    pb::SendSignalResponse::decode(&body[..]).expect("a SendSignalResponse");
    let end = end_event(&stream.rest().await);
    // Every signal ends the tree with SIGTERM first (the module's documented escalation).
    assert!(
        end["status"]
            .as_str()
            .is_some_and(|s| s.starts_with("signal: ")),
        "{end}"
    );
}

#[tokio::test]
async fn a_connect_proto_stream_carries_prost_messages_and_a_json_end() {
    use prost::Message as _;
    use warren_execd::e2b::proto::process as pb;

    let server = start(None).await;
    let request = pb::StartRequest {
        process: Some(pb::ProcessConfig {
            cmd: "/bin/sh".into(),
            args: vec!["-c".into(), "printf proto; exit 3".into()],
            ..Default::default()
        }),
        stdin: Some(false),
        ..Default::default()
    };
    let body = envelope_of(&request.encode_to_vec());
    let response = server
        .post(
            "/process.Process/Start",
            "application/connect+proto",
            &[],
            body,
        )
        .await;
    assert_eq!(
        response.headers().get("content-type").map(|v| v.as_bytes()),
        Some(&b"application/connect+proto"[..])
    );
    let mut stream = EnvelopeStream::new(response);
    let mut events = Vec::new();
    let mut end_of_stream = None;
    while let Some((flags, data)) = stream.next_raw().await {
        if flags == 2 {
            end_of_stream = Some(serde_json::from_slice::<Value>(&data).expect("JSON end"));
            break;
        }
        let message = pb::StartResponse::decode(&data[..]).expect("a StartResponse");
        events.push(message.event.and_then(|e| e.event).expect("an event"));
    }
    assert_eq!(end_of_stream, Some(json!({})));
    use pb::process_event::{Event, data_event::Output};
    assert!(
        matches!(events.first(), Some(Event::Start(s)) if s.pid > 0),
        "{events:?}"
    );
    let stdout: Vec<u8> = events
        .iter()
        .filter_map(|e| match e {
            Event::Data(pb::process_event::DataEvent {
                output: Some(Output::Stdout(bytes)),
            }) => Some(bytes.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(stdout, b"proto");
    let Some(Event::End(end)) = events.last() else {
        panic!("the last event is the end: {events:?}");
    };
    assert_eq!((end.exit_code, end.exited), (3, true));
}

/// The `max` of a `min default max` sysctl line, in bytes.
fn sysctl_max(path: &str) -> usize {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| text.split_whitespace().last()?.parse().ok())
        .unwrap_or(64 << 20)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_client_never_reads_ends_with_data_loss_not_a_stall() {
    use warren_execd::e2b::process::SUBSCRIBER_BUFFER;
    // Deterministic: execd reads a process's output whether or not a stream keeps up, so a
    // client that reads nothing can hold back at most the stream's queue (SUBSCRIBER_BUFFER
    // chunks of at most 32 KiB), the sender's 64 envelopes, hyper's buffers and the socket
    // buffers. Twice that, written while the client reads nothing, must overflow.
    let socket_bytes = sysctl_max("/proc/sys/net/ipv4/tcp_rmem")
        + sysctl_max("/proc/sys/net/ipv4/tcp_wmem")
        + sysctl_max("/proc/sys/net/core/rmem_max")
        + sysctl_max("/proc/sys/net/core/wmem_max");
    let held_bytes = SUBSCRIBER_BUFFER * 32 * 1024 + (8 << 20) + socket_bytes;
    let output_bytes = 2 * held_bytes;
    let server = start(None).await;
    let command = format!("head -c {output_bytes} /dev/zero");
    let (mut stream, pid) = server
        .start_process(json!({"cmd": "/bin/sh", "args": ["-c", command]}), false)
        .await;
    server.wait_until_gone(pid).await;

    let rest = stream.rest().await;
    let mut stdout_bytes = 0;
    for (_, envelope) in &rest {
        assert!(
            envelope["event"].get("end").is_none(),
            "no end event after a loss"
        );
        if let Some(data) = envelope["event"]["data"]["stdout"].as_str() {
            stdout_bytes += base64_decode(data).len();
        }
    }
    assert!(stdout_bytes < output_bytes, "some output was dropped");
    let error = end_error(&rest);
    assert_eq!(error["code"], "data_loss", "{error}");
}

/// The name and type of each filesystem event of a watch stream, read until `done` holds of
/// them (or fails after [`WAIT`]).
async fn watch_events_until(
    stream: &mut EnvelopeStream,
    done: impl Fn(&[(String, String)]) -> bool,
) -> Vec<(String, String)> {
    let mut events = Vec::new();
    tokio::time::timeout(WAIT, async {
        while !done(&events) {
            let (flags, envelope) = stream.next().await;
            assert_eq!(flags, 0, "the watch goes on: {envelope}");
            let event = &envelope["filesystem"];
            if let (Some(name), Some(kind)) = (event["name"].as_str(), event["type"].as_str()) {
                events.push((name.to_owned(), kind.to_owned()));
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the expected watch events came in time: {events:?}"));
    events
}

fn has(events: &[(String, String)], name: &str, kind: &str) -> bool {
    events.iter().any(|(n, k)| n == name && k == kind)
}

/// A watch stream of `path` that has sent its `start`.
async fn open_watch(server: &Server, path: &str, recursive: bool) -> EnvelopeStream {
    let mut stream = server
        .open_stream(
            "filesystem.Filesystem/WatchDir",
            json!({"path": path, "recursive": recursive}),
        )
        .await;
    let (_, first) = stream.next().await;
    assert!(first.get("start").is_some(), "{first}");
    stream
}

#[tokio::test]
async fn connect_to_a_process_that_just_exited_answers_start_and_its_end() {
    let server = start(None).await;
    let (mut stream, pid) = server
        .start_request(
            json!({"process": {"cmd": "/bin/sh", "args": ["-c", "exit 3"]},
                              "tag": "short", "stdin": false}),
        )
        .await;
    stream.rest().await;
    server.wait_until_gone(pid).await;

    for selector in [json!({"pid": pid}), json!({"tag": "short"})] {
        let envelopes = server
            .stream("process.Process/Connect", json!({"process": selector}), &[])
            .await;
        let events: Vec<Value> = envelopes.iter().map(|(_, e)| e["event"].clone()).collect();
        assert_eq!(events.len(), 3, "start, end, end of stream: {envelopes:?}");
        assert_eq!(events[0]["start"]["pid"].as_u64(), Some(pid), "{selector}");
        let end = &events[1]["end"];
        assert_eq!(
            (&end["exitCode"], &end["exited"], &end["status"]),
            (&json!(3), &json!(true), &json!("exit status 3")),
            "{selector}: {end}"
        );
        assert_eq!(envelopes[2], (2, json!({})), "{selector}");
    }
    // Only `Connect` sees a finished process; the other calls name running ones, as in envd.
    let answer = server.send_kill(pid).await;
    assert_error(&answer, 404, json!("not_found"), "SendSignal");
}

#[tokio::test]
async fn stat_and_list_report_where_a_symlink_finally_leads_as_an_absolute_path() {
    let server = start(None).await;
    let dir = server.root.join("links");
    std::fs::create_dir_all(dir.join("sub")).expect("dirs");
    std::fs::write(dir.join("sub/t.txt"), "t").expect("file");
    // Each link, its target and where it is reported to lead: resolved like Go's
    // `filepath.EvalSymlinks`; unresolvable (or outside the root): the link's own path, as
    // envd reports it.
    let links = [
        ("rel", PathBuf::from("sub/t.txt"), "sub/t.txt"),
        ("abs", dir.join("sub/t.txt"), "sub/t.txt"),
        ("chain", PathBuf::from("rel"), "sub/t.txt"),
        ("updir", PathBuf::from("sub/../sub"), "sub"),
        ("broken", PathBuf::from("missing"), "broken"),
        ("outside", PathBuf::from("/etc/passwd"), "outside"),
        ("loop", PathBuf::from("loop"), "loop"),
    ];
    for (name, target, _) in &links {
        std::os::unix::fs::symlink(target, dir.join(name)).expect("a link");
    }
    let shown = |rel: &str| dir.join(rel).to_string_lossy().into_owned();
    let expected = links.map(|(name, _, leads_to)| (name, shown(leads_to)));
    let (status, listed) = server
        .call("filesystem.Filesystem/ListDir", json!({"path": dir}))
        .await;
    assert_eq!(status, 200, "{listed}");
    let entries = listed["entries"].as_array().cloned().unwrap_or_default();
    for (name, target) in &expected {
        let entry = entries
            .iter()
            .find(|e| e["name"] == *name)
            .unwrap_or_else(|| panic!("{name} is listed: {listed}"));
        assert_eq!(entry["symlinkTarget"], json!(target), "list {name}");
        let (_, stat) = server.stat(&shown(name)).await;
        assert_eq!(stat["entry"]["symlinkTarget"], json!(target), "stat {name}");
    }
    let sub = entries
        .iter()
        .find(|e| e["name"] == "sub")
        .expect("sub is listed");
    assert!(sub.get("symlinkTarget").is_none(), "no target: {sub}");
}

#[tokio::test]
async fn relative_paths_start_at_the_users_home_for_every_file_call() {
    let server = start_with(None, Some("home/user")).await;
    let home = server.root.join("home/user");
    let at_home = |rel: &str| home.join(rel).to_string_lossy().into_owned();

    let (mut process, _) = server
        .start_process(
            json!({"cmd": "/bin/sh", "args": ["-c", "cd ~ && pwd -P"]}),
            false,
        )
        .await;
    process
        .stdout_until(format!("{}\n", home.display()).as_bytes())
        .await;

    // Upload and download (`/files`).
    let (status, written) = server.upload("up/a.txt", "uploaded").await;
    assert_eq!(status, 200);
    assert_eq!(
        written,
        json!([{"name": "a.txt", "type": "file", "path": at_home("up/a.txt")}])
    );
    assert_eq!(
        std::fs::read_to_string(home.join("up/a.txt")).expect("written in the home"),
        "uploaded"
    );
    let downloaded = server.get("/files?path=up/a.txt").await;
    assert_eq!(downloaded.text().await.expect("a body"), "uploaded");

    // Every filesystem call, `~` and `~/x` included.
    let calls = [
        ("MakeDir", json!({"path": "made"}), at_home("made")),
        ("Stat", json!({"path": "up/a.txt"}), at_home("up/a.txt")),
        ("Stat", json!({"path": "~/up/a.txt"}), at_home("up/a.txt")),
        ("Stat", json!({"path": "~"}), at_home("")),
        (
            "Move",
            json!({"source": "up/a.txt", "destination": "made/b.txt"}),
            at_home("made/b.txt"),
        ),
    ];
    for (method, body, path) in calls {
        let (status, answer) = server
            .call(&format!("filesystem.Filesystem/{method}"), body.clone())
            .await;
        assert_eq!(status, 200, "{method} {body}: {answer}");
        assert_eq!(
            answer["entry"]["path"]
                .as_str()
                .map(|p| p.trim_end_matches('/')),
            Some(path.trim_end_matches('/')),
            "{method} {body}"
        );
    }
    let made = json!({"path": "made"});
    let (_, listed) = server
        .call("filesystem.Filesystem/ListDir", made.clone())
        .await;
    assert_eq!(listed["entries"][0]["path"], json!(at_home("made/b.txt")));
    let (status, _) = server.call("filesystem.Filesystem/Remove", made).await;
    assert_eq!(status, 200);
    assert!(!home.join("made").exists(), "removed from the home");
    let mut watch = open_watch(&server, "~", false).await;
    std::fs::write(home.join("seen.txt"), "seen").expect("file");
    watch_events_until(&mut watch, |events| {
        has(events, "seen.txt", "EVENT_TYPE_CREATE")
    })
    .await;
    let answer = server.stat("~other/x").await;
    assert_error(&answer, 400, json!("invalid_argument"), "~other/x");
}

#[tokio::test]
async fn a_watch_reports_an_upload_as_create_and_write_of_its_name_never_its_temporary_file() {
    let server = start(None).await;
    let dir = server.root.join("watched");
    std::fs::create_dir(&dir).expect("dir");
    let mut watch = open_watch(&server, &dir.to_string_lossy(), false).await;
    let (status, _) = server
        .upload(&format!("{}/inner.txt", dir.display()), "inner")
        .await;
    assert_eq!(status, 200);
    let events = watch_events_until(&mut watch, |events| {
        has(events, "inner.txt", "EVENT_TYPE_CREATE")
            && has(events, "inner.txt", "EVENT_TYPE_WRITE")
    })
    .await;
    // The temporary file's events came before its rename into place, so all are here.
    assert!(
        events.iter().all(|(name, _)| name == "inner.txt"),
        "{events:?}"
    );
}

#[tokio::test]
async fn a_recursive_watch_reports_a_new_directory_and_what_was_made_in_it_before_its_watch() {
    let server = start(None).await;
    let dir = server.root.join("rwatched");
    std::fs::create_dir_all(dir.join("old")).expect("dirs");
    let mut watch = open_watch(&server, &dir.to_string_lossy(), true).await;
    // All at once: the new directories' contents exist before their watches can.
    std::fs::create_dir_all(dir.join("later/sub")).expect("dirs");
    std::fs::write(dir.join("later/sub/deep.txt"), "deep").expect("file");
    std::fs::write(dir.join("top.txt"), "top").expect("file");
    std::fs::write(dir.join("old/inner.txt"), "inner").expect("file");
    let wanted = [
        "later",
        "later/sub",
        "later/sub/deep.txt",
        "top.txt",
        "old/inner.txt",
    ];
    let events = watch_events_until(&mut watch, |events| {
        wanted
            .iter()
            .all(|name| has(events, name, "EVENT_TYPE_CREATE"))
    })
    .await;
    // What is made in a directory once it is watched is the watch's to report.
    std::fs::write(dir.join("later/sub/after.txt"), "after").expect("file");
    watch_events_until(&mut watch, |events| {
        has(events, "later/sub/after.txt", "EVENT_TYPE_CREATE")
    })
    .await;
    assert!(
        events.iter().all(|(name, _)| !name.contains(".warren-")),
        "{events:?}"
    );
}
