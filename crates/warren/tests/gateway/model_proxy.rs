//! The model proxy end to end: a fake upstream on 127.0.0.1:0 (a few lines of HTTP/1.1 that
//! record each request and answer each provider's stream, optionally holding it after the first
//! event until the test lets it go), a real gateway in front of it, and reqwest playing the
//! agent's SDK with the session's `wm_` token (taken from the gateway's own API: no route hands
//! tokens out).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use warren_gateway::GatewayArgs;
use warren_gateway::model_proxy::parse_upstream;

use super::helpers::{
    EventStream, LogBuffer, Received, TestGateway, WAIT, args_without_agent, warren_bin,
};

const ANTHROPIC_KEY: &str = "sk-ant-REAL-0123456789";
const OPENAI_KEY: &str = "sk-proj-REAL-9876543210";
const GEMINI_KEY: &str = "AIza-REAL-gemini-55555";

/// One request as the fake upstream received it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    /// Path and query.
    target: String,
    /// Lowercase names.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Everything the upstream saw, as text: where a leaked token would show.
    fn all_text(&self) -> String {
        format!(
            "{} {} {:?} {}",
            self.method,
            self.target,
            self.headers,
            String::from_utf8_lossy(&self.body)
        )
    }
}

/// A fake model API: Anthropic under `/a`, OpenAI under `/o`, Gemini under `/g` (any prefix
/// works; the answer is picked by the path's end).
struct FakeUpstream {
    /// Its origin, `http://127.0.0.1:PORT`.
    origin: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Lets one held stream go on past its first event.
    gate: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeUpstream {
    /// `held`: streams stop after their first event until [`FakeUpstream::release`].
    async fn start(held: bool) -> FakeUpstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let origin = format!("http://{}", listener.local_addr().expect("addr"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(Notify::new());
        let (log, notify) = (seen.clone(), gate.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve_one(stream, log.clone(), notify.clone(), held));
            }
        });
        FakeUpstream {
            origin,
            seen,
            gate,
            task,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn release(&self) {
        self.gate.notify_one();
    }

    fn upstream_args(&self) -> Vec<warren_gateway::model_proxy::Upstream> {
        ["anthropic=/a", "openai=/o", "gemini=/g"]
            .iter()
            .map(|spec| {
                let (name, prefix) = spec.split_once('=').expect("spec");
                parse_upstream(&format!("{name}={}{prefix}", self.origin)).expect("upstream")
            })
            .collect()
    }
}

/// The answer for a path: content type, first part, the rest.
fn answer_for(target: &str) -> (&'static str, String, String) {
    let path = target.split('?').next().unwrap_or(target);
    let sse = |events: &[Value]| -> String {
        events
            .iter()
            .map(|e| match e["type"].as_str() {
                Some(kind) => format!("event: {kind}\ndata: {e}\n\n"),
                None => format!("data: {e}\n\n"),
            })
            .collect()
    };
    if path.ends_with("/v1/messages") {
        let first = sse(&[
            json!({"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-fake-4","content":[],"usage":{"input_tokens":11,"cache_creation_input_tokens":3,"cache_read_input_tokens":7,"output_tokens":1}}}),
        ]);
        let rest = sse(&[
            json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
            json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hello from the fake"}}),
            json!({"type":"content_block_stop","index":0}),
            json!({"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":22}}),
            json!({"type":"message_stop"}),
        ]);
        ("text/event-stream", first, rest)
    } else if path.ends_with("/v1/responses") {
        let first = sse(&[
            json!({"type":"response.created","response":{"id":"resp_1","object":"response","model":"gpt-fake-5","usage":null}}),
        ]);
        let rest = sse(&[
            json!({"type":"response.output_text.delta","delta":"hello from the fake"}),
            json!({"type":"response.completed","response":{"id":"resp_1","object":"response","model":"gpt-fake-5","usage":{"input_tokens":13,"input_tokens_details":{"cached_tokens":5},"output_tokens":24,"total_tokens":37}}}),
        ]);
        ("text/event-stream", first, rest)
    } else if path.ends_with(":streamGenerateContent") {
        let first = sse(&[
            json!({"candidates":[{"content":{"parts":[{"text":"hello "}],"role":"model"}}],"usageMetadata":{"promptTokenCount":17},"modelVersion":"gemini-fake-001"}),
        ]);
        let rest = sse(&[
            json!({"candidates":[{"content":{"parts":[{"text":"from the fake"}],"role":"model"},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":17,"candidatesTokenCount":20,"thoughtsTokenCount":6,"cachedContentTokenCount":9},"modelVersion":"gemini-fake-001"}),
        ]);
        ("text/event-stream", first, rest)
    } else if path.ends_with("/count_tokens") {
        (
            "application/json",
            json!({"input_tokens": 5}).to_string(),
            String::new(),
        )
    } else {
        (
            "application/json",
            json!({"data": []}).to_string(),
            String::new(),
        )
    }
}

async fn serve_one(
    mut stream: TcpStream,
    seen: Arc<Mutex<Vec<Seen>>>,
    gate: Arc<Notify>,
    held: bool,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let header_end = loop {
        if let Some(at) = find(&buf, b"\r\n\r\n") {
            break at + 4;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..header_end]).to_string();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next().unwrap_or_default().split(' ');
    let method = request_line.next().unwrap_or_default().to_string();
    let target = request_line.next().unwrap_or_default().to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let mut body = buf[header_end..].to_vec();
    let chunked = header("transfer-encoding").is_some_and(|v| v.contains("chunked"));
    let length: usize = header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    loop {
        let complete = if chunked {
            body.ends_with(b"0\r\n\r\n")
        } else {
            body.len() >= length
        };
        if complete {
            break;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    if chunked {
        body = dechunk(&body);
    }
    seen.lock().unwrap_or_else(|p| p.into_inner()).push(Seen {
        method,
        target: target.clone(),
        headers,
        body,
    });
    let (content_type, first, rest) = answer_for(&target);
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\nx-fake-upstream: yes\r\nkeep-alive: timeout=5\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    );
    let write_chunk = |text: &str| format!("{:x}\r\n{text}\r\n", text.len());
    if stream.write_all(head.as_bytes()).await.is_err()
        || stream
            .write_all(write_chunk(&first).as_bytes())
            .await
            .is_err()
        || stream.flush().await.is_err()
    {
        return;
    }
    if rest.is_empty() {
        let _ = stream.write_all(b"0\r\n\r\n").await;
        return;
    }
    if held && tokio::time::timeout(WAIT, gate.notified()).await.is_err() {
        return;
    }
    let _ = stream.write_all(write_chunk(&rest).as_bytes()).await;
    let _ = stream.write_all(b"0\r\n\r\n").await;
    let _ = stream.shutdown().await;
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(line_end) = find(body, b"\r\n") {
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&body[..line_end])
                .split(';')
                .next()
                .unwrap_or("0")
                .trim(),
            16,
        )
        .unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = line_end + 2;
        out.extend_from_slice(&body[start..start + size]);
        body = &body[start + size + 2..];
    }
    out
}

/// A key file outside the data directory; `gemini` false leaves Gemini without a key (an
/// empty value overrides whatever the test's environment has).
fn key_file(dir: &Path, gemini: bool) -> PathBuf {
    let path = dir.join("model-keys");
    let gemini_line = if gemini {
        format!("GEMINI_API_KEY={GEMINI_KEY}")
    } else {
        "GEMINI_API_KEY=".to_string()
    };
    std::fs::write(
        &path,
        format!(
            "# the fake upstream's keys\nANTHROPIC_API_KEY={ANTHROPIC_KEY}\nOPENAI_API_KEY='{OPENAI_KEY}'\n{gemini_line}\n"
        ),
    )
    .expect("write key file");
    path
}

/// A gateway in front of `upstream` (or of the public defaults), its keys, a device, a session
/// with its event stream, and the session's model token.
struct Setup {
    gw: TestGateway,
    device: String,
    session: String,
    events: EventStream,
    model_token: String,
    _keys_dir: tempfile::TempDir,
}

async fn setup(configure: impl FnOnce(&mut GatewayArgs)) -> Setup {
    let keys_dir = tempfile::tempdir().expect("keys dir");
    let keys = key_file(keys_dir.path(), true);
    let gw = TestGateway::start(|data| {
        let mut args = args_without_agent(data);
        // No turn runs here; the built-in agent is just a command that exists (none starts:
        // no warm workers).
        args.agent = Some(format!("{} shell-agent", warren_bin().display()));
        args.model.model_key_file = Some(keys);
        configure(&mut args);
        args
    })
    .await;
    let device = gw.register("phone-model-01").await;
    let session = gw.create_session(&device).await;
    let events = gw.events(&device, &session, None).await;
    let model_token = gw.gateway.engine.model.token(&session);
    Setup {
        gw,
        device,
        session,
        events,
        model_token,
        _keys_dir: keys_dir,
    }
}

/// One SDK-like request: the provider's path, its way of carrying the token, a body.
struct Call {
    provider: &'static str,
    path: &'static str,
    body: Value,
}

fn anthropic_call() -> Call {
    Call {
        provider: "anthropic",
        path: "v1/messages",
        body: json!({"model":"claude-fake-4","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}),
    }
}

fn openai_call() -> Call {
    Call {
        provider: "openai",
        path: "v1/responses",
        body: json!({"model":"gpt-fake-5","stream":true,"input":"hi"}),
    }
}

fn gemini_call() -> Call {
    Call {
        provider: "gemini",
        path: "v1beta/models/gemini-fake:streamGenerateContent?alt=sse",
        body: json!({"contents":[{"role":"user","parts":[{"text":"hi"}]}]}),
    }
}

impl Setup {
    fn url(&self, provider: &str, path: &str) -> String {
        format!("{}/v1/model/{provider}/{path}", self.gw.url)
    }

    /// `call` with the token where the provider's SDK puts its key.
    fn request(&self, call: &Call, token: Option<&str>) -> reqwest::RequestBuilder {
        let request = self
            .gw
            .http
            .post(self.url(call.provider, call.path))
            .header("anthropic-version", "2023-06-01")
            .json(&call.body);
        let Some(token) = token else {
            return request;
        };
        match call.provider {
            "anthropic" => request.header("x-api-key", token),
            "openai" => request.bearer_auth(token),
            _ => request.header("x-goog-api-key", token),
        }
    }

    /// Sends `call` with the session's model token.
    async fn send(&self, call: &Call) -> reqwest::Response {
        self.send_with(call, Some(&self.model_token)).await
    }

    /// Sends `call` with `token` (or none) where the provider's SDK puts its key.
    async fn send_with(&self, call: &Call, token: Option<&str>) -> reqwest::Response {
        self.request(call, token)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{} {}: {e}", call.provider, call.path))
    }

    async fn usage_event(&mut self, what: &str) -> Received {
        let seen = self
            .events
            .until(&format!("the usage event of {what}"), |e| {
                e.event == "usage"
            })
            .await;
        seen.last().expect("a usage event").clone()
    }
}

/// Reads the answer to its end, asserting it streamed: its first event arrived while the
/// upstream still held the rest.
async fn read_held_stream(
    mut answer: reqwest::Response,
    upstream: &FakeUpstream,
    first_marker: &str,
) -> String {
    let mut text = String::new();
    while !text.contains(first_marker) {
        let chunk = tokio::time::timeout(WAIT, answer.chunk())
            .await
            .unwrap_or_else(|_| {
                panic!("the first event ({first_marker}) did not arrive before the upstream finished: the proxy buffers")
            })
            .expect("answer chunk")
            .unwrap_or_else(|| panic!("the answer ended before {first_marker}: {text}"));
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(
        !text.contains("from the fake"),
        "the rest came before the release: {text}"
    );
    upstream.release();
    let rest = tokio::time::timeout(WAIT, answer.text())
        .await
        .expect("the rest of the answer after the release")
        .expect("answer body");
    text + &rest
}

/// Asserts `answer` is `status` (`what` names the request) and returns its JSON error body.
async fn error_body(answer: reqwest::Response, status: u16, what: &str) -> Value {
    assert_eq!(answer.status(), status, "{what}");
    answer.json().await.expect("error body")
}

/// Anthropic's token count: not a model call.
fn count_tokens() -> Call {
    Call {
        provider: "anthropic",
        path: "v1/messages/count_tokens",
        body: json!({"model":"claude-fake-4","messages":[]}),
    }
}
#[tokio::test]
async fn each_provider_streams_through_with_the_real_key_swapped_in() {
    let upstream = FakeUpstream::start(true).await;
    let s = setup(|args| args.model.model_upstream = upstream.upstream_args()).await;
    let cases = [
        (
            anthropic_call(),
            "message_start",
            "/a/v1/messages",
            "x-api-key",
            ANTHROPIC_KEY.to_string(),
        ),
        (
            openai_call(),
            "response.created",
            "/o/v1/responses",
            "authorization",
            format!("Bearer {OPENAI_KEY}"),
        ),
        (
            gemini_call(),
            "promptTokenCount",
            "/g/v1beta/models/gemini-fake:streamGenerateContent?alt=sse",
            "x-goog-api-key",
            GEMINI_KEY.to_string(),
        ),
    ];
    for (n, (call, first_marker, target, credential, real)) in cases.into_iter().enumerate() {
        let answer = s.send(&call).await;
        assert_eq!(answer.status(), 200, "{}", call.provider);
        assert_eq!(
            answer.headers()["content-type"],
            "text/event-stream",
            "{}",
            call.provider
        );
        assert_eq!(answer.headers()["x-fake-upstream"], "yes");
        assert!(
            answer.headers().get("keep-alive").is_none(),
            "hop-by-hop dropped"
        );
        let text = read_held_stream(answer, &upstream, first_marker).await;
        assert!(text.contains("from the fake"), "{}: {text}", call.provider);

        let seen = upstream.seen();
        let request = &seen[n];
        assert_eq!(request.method, "POST");
        assert_eq!(request.target, target);
        assert_eq!(
            request.header(credential),
            Some(real.as_str()),
            "{}",
            call.provider
        );
        for other in ["authorization", "x-api-key", "x-goog-api-key"] {
            if other != credential {
                assert_eq!(
                    request.header(other),
                    None,
                    "{}: {other} forwarded",
                    call.provider
                );
            }
        }
        assert!(
            !request.all_text().contains("wm_"),
            "{}: the model token reached the upstream: {request:?}",
            call.provider
        );
        assert_eq!(request.header("anthropic-version"), Some("2023-06-01"));
        let body: Value = serde_json::from_slice(&request.body).expect("forwarded body");
        assert_eq!(body, call.body, "{}", call.provider);
    }
    // The other ways SDKs send their key: Anthropic's Bearer, Gemini's `?key=`.
    let gemini_path = format!(
        "v1beta/models/gemini-fake:streamGenerateContent?key={}&alt=sse",
        s.model_token
    );
    let other_ways = [
        (
            s.gw.http
                .post(s.url("anthropic", "v1/messages"))
                .bearer_auth(&s.model_token)
                .json(&anthropic_call().body),
            "message_start",
        ),
        (
            s.gw.http
                .post(s.url("gemini", &gemini_path))
                .json(&gemini_call().body),
            "promptTokenCount",
        ),
    ];
    for (request, first_marker) in other_ways {
        let answer = request.send().await.expect("model request");
        assert_eq!(answer.status(), 200, "{first_marker}");
        read_held_stream(answer, &upstream, first_marker).await;
    }
    let seen = upstream.seen();
    assert_eq!(seen[3].header("x-api-key"), Some(ANTHROPIC_KEY));
    assert_eq!(seen[3].header("authorization"), None);
    assert_eq!(
        seen[4].target,
        "/g/v1beta/models/gemini-fake:streamGenerateContent?alt=sse"
    );
    assert_eq!(seen[4].header("x-goog-api-key"), Some(GEMINI_KEY));
    for request in &seen {
        assert!(!request.all_text().contains("wm_"), "{request:?}");
    }
    s.gw.stop().await;
}

#[tokio::test]
async fn usage_events_carry_the_providers_numbers_and_sum_into_the_session() {
    let upstream = FakeUpstream::start(false).await;
    let mut s = setup(|args| args.model.model_upstream = upstream.upstream_args()).await;
    let cases = [
        (
            anthropic_call(),
            json!({"provider":"anthropic","model":"claude-fake-4","input_tokens":11,"output_tokens":22,"cache_read_tokens":7,"cache_write_tokens":3,"status":200}),
        ),
        (
            openai_call(),
            json!({"provider":"openai","model":"gpt-fake-5","input_tokens":13,"output_tokens":24,"cache_read_tokens":5,"cache_write_tokens":0,"status":200}),
        ),
        (
            gemini_call(),
            json!({"provider":"gemini","model":"gemini-fake","input_tokens":17,"output_tokens":26,"cache_read_tokens":9,"cache_write_tokens":0,"status":200}),
        ),
    ];
    for (call, expected) in &cases {
        let answer = s.send(call).await;
        assert_eq!(answer.status(), 200);
        answer.text().await.expect("answer body");
        let usage = s.usage_event(call.provider).await;
        for (field, value) in expected.as_object().expect("object") {
            assert_eq!(
                &usage.data[field], value,
                "{}: {field} in {:?}",
                call.provider, usage.data
            );
        }
        assert!(usage.data["ms_to_first_token"].is_u64(), "{:?}", usage.data);
        assert!(usage.data["ms_total"].is_u64(), "{:?}", usage.data);
    }
    let info = s.gw.session_info(&s.device, &s.session).await;
    assert_eq!(
        info["usage"],
        json!({"requests":3,"input_tokens":41,"output_tokens":72,"cache_read_tokens":21,"cache_write_tokens":3}),
        "{info:?}"
    );
    s.gw.stop().await;
}

#[tokio::test]
async fn requests_that_are_not_model_calls_pass_and_record_no_usage() {
    let upstream = FakeUpstream::start(false).await;
    let mut s = setup(|args| args.model.model_upstream = upstream.upstream_args()).await;
    let models =
        s.gw.http
            .get(s.url("openai", "v1/models"))
            .bearer_auth(&s.model_token)
            .send()
            .await
            .expect("models request");
    assert_eq!(models.status(), 200);
    assert_eq!(
        models.json::<Value>().await.expect("models body"),
        json!({"data": []})
    );
    let count = count_tokens();
    let counted = s.send(&count).await;
    assert_eq!(counted.status(), 200);
    assert_eq!(
        counted.json::<Value>().await.expect("count body")["input_tokens"],
        5
    );
    assert_eq!(upstream.seen()[0].target, "/o/v1/models");
    assert_eq!(upstream.seen()[0].method, "GET");
    assert_eq!(
        upstream.seen()[0].header("transfer-encoding"),
        None,
        "no body on a GET"
    );
    assert_eq!(
        upstream.seen()[1]
            .header("content-length")
            .map(str::parse::<usize>),
        Some(Ok(upstream.seen()[1].body.len())),
        "a body is forwarded with its length"
    );
    // The next usage event is the model call's, not theirs.
    let answer = s.send(&anthropic_call()).await;
    answer.text().await.expect("answer body");
    let usage = s.usage_event("the model call").await;
    assert_eq!(usage.data["input_tokens"], 11, "{:?}", usage.data);
    let info = s.gw.session_info(&s.device, &s.session).await;
    assert_eq!(info["usage"]["requests"], 1, "{info:?}");
    s.gw.stop().await;
}

#[tokio::test]
async fn an_answer_dropped_midway_still_records_its_usage_once() {
    let upstream = FakeUpstream::start(true).await;
    let mut s = setup(|args| args.model.model_upstream = upstream.upstream_args()).await;
    let mut answer = s.send(&anthropic_call()).await;
    let first = tokio::time::timeout(WAIT, answer.chunk())
        .await
        .expect("the first event")
        .expect("chunk")
        .expect("a chunk before the end");
    assert!(String::from_utf8_lossy(&first).contains("message_start"));
    drop(answer);
    let usage = s.usage_event("the dropped answer").await;
    assert_eq!(usage.data["input_tokens"], 11, "{:?}", usage.data);
    assert_eq!(
        usage.data["output_tokens"], 1,
        "message_start's count: {:?}",
        usage.data
    );
    upstream.release();
    let info = s.gw.session_info(&s.device, &s.session).await;
    assert_eq!(info["usage"]["requests"], 1, "recorded once: {info:?}");
    s.gw.stop().await;
}

/// The error body each provider's SDK reads, and its `type`/`status`.
fn error_kind(provider: &str, body: &Value) -> String {
    match provider {
        "anthropic" => {
            assert_eq!(body["type"], "error", "{body}");
            body["error"]["type"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        }
        "openai" => body["error"]["code"]
            .as_str()
            .or(body["error"]["type"].as_str())
            .unwrap_or_default()
            .to_string(),
        _ => body["error"]["status"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    }
}

#[tokio::test]
async fn missing_unknown_and_revoked_tokens_get_401_in_the_providers_shape() {
    let upstream = FakeUpstream::start(false).await;
    let s = setup(|args| args.model.model_upstream = upstream.upstream_args()).await;
    let expected = [
        ("anthropic", "authentication_error"),
        ("openai", "invalid_api_key"),
        ("gemini", "UNAUTHENTICATED"),
    ];
    let calls = [anthropic_call(), openai_call(), gemini_call()];
    let unknown = format!("wm_{}", "A".repeat(43));
    let device_token = s.device.clone();
    for (call, (provider, kind)) in calls.iter().zip(expected) {
        for token in [None, Some(unknown.as_str()), Some(device_token.as_str())] {
            let answer = s.send_with(call, token).await;
            let body = error_body(answer, 401, &format!("{provider} with {token:?}")).await;
            assert_eq!(error_kind(provider, &body), kind, "{provider}: {body}");
            if provider == "gemini" {
                assert_eq!(body["error"]["code"], 401);
            }
            if provider == "openai" {
                assert_eq!(body["error"]["type"], "invalid_request_error");
            }
        }
    }
    // Revoked: the old token is refused, a new one works.
    s.gw.gateway.engine.model.revoke(&s.session);
    let refused = s.send(&openai_call()).await;
    assert_eq!(refused.status(), 401);
    let renewed = s.gw.gateway.engine.model.token(&s.session);
    assert_ne!(renewed, s.model_token);
    let allowed = s.send_with(&openai_call(), Some(&renewed)).await;
    assert_eq!(allowed.status(), 200);
    allowed.text().await.expect("answer");
    // A deleted session's token is refused.
    let deleted =
        s.gw.delete(&s.device, &format!("/sessions/{}", s.session))
            .await;
    assert_eq!(deleted.status(), 204);
    let refused = s.send_with(&openai_call(), Some(&renewed)).await;
    assert_eq!(refused.status(), 401);
    assert_eq!(
        upstream.seen().len(),
        1,
        "only the renewed token's call went upstream"
    );
    s.gw.stop().await;
}

#[tokio::test]
async fn an_unknown_provider_is_404_unknown_model_provider() {
    let s = setup(|_| {}).await;
    let answer =
        s.gw.http
            .post(s.url("mistral", "v1/chat/completions"))
            .bearer_auth(&s.model_token)
            .json(&json!({}))
            .send()
            .await
            .expect("request");
    let body = error_body(answer, 404, "an unknown provider").await;
    assert_eq!(body["code"], "UNKNOWN_MODEL_PROVIDER", "{body}");
    assert!(
        body["message"]
            .as_str()
            .expect("message")
            .contains("mistral")
    );
    s.gw.stop().await;
}

#[tokio::test]
async fn a_provider_without_a_key_is_503_naming_the_variable() {
    let upstream = FakeUpstream::start(false).await;
    let keys_dir = tempfile::tempdir().expect("keys dir");
    let keys = key_file(keys_dir.path(), false);
    let mut s = setup(|args| {
        args.model.model_upstream = upstream.upstream_args();
        args.model.model_key_file = Some(keys);
    })
    .await;
    let answer = s.send(&gemini_call()).await;
    let body = error_body(answer, 503, "a provider without a key").await;
    assert_eq!(body["error"]["status"], "UNAVAILABLE", "{body}");
    assert_eq!(body["error"]["code"], 503, "{body}");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(message.contains("GEMINI_API_KEY"), "{message}");
    assert!(upstream.seen().is_empty(), "nothing went upstream");
    let usage = s.usage_event("the refused call").await;
    assert_eq!(usage.data["status"], 503, "{:?}", usage.data);
    assert_eq!(usage.data["model"], "gemini-fake", "{:?}", usage.data);
    s.gw.stop().await;
}

#[tokio::test]
async fn an_unreachable_upstream_is_502_in_the_providers_shape() {
    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let mut s = setup(|args| {
        args.model.model_upstream =
            vec![parse_upstream(&format!("openai=http://127.0.0.1:{port}/v1x")).expect("upstream")];
    })
    .await;
    let answer = s.send(&openai_call()).await;
    let body = error_body(answer, 502, "an unreachable upstream").await;
    assert_eq!(body["error"]["type"], "server_error", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("cannot reach"),
        "{body}"
    );
    let usage = s.usage_event("the unreachable call").await;
    assert_eq!(usage.data["status"], 502, "{:?}", usage.data);
    s.gw.stop().await;
}

#[tokio::test]
async fn over_budget_model_calls_get_429_and_an_error_event_without_reaching_upstream() {
    let upstream = FakeUpstream::start(false).await;
    let mut s = setup(|args| {
        args.model.model_upstream = upstream.upstream_args();
        args.model.model_budget_tokens = Some(40);
    })
    .await;
    assert_eq!(s.gw.gateway.engine.model.budget(), Some(40));
    // 11 + 22 + 7 + 3 = 43 tokens: the first call goes through and spends the budget.
    let answer = s.send(&anthropic_call()).await;
    assert_eq!(answer.status(), 200);
    answer.text().await.expect("answer");
    s.usage_event("the call within budget").await;

    let expected = [
        ("anthropic", "rate_limit_error"),
        ("openai", "insufficient_quota"),
        ("gemini", "RESOURCE_EXHAUSTED"),
    ];
    let calls = [anthropic_call(), openai_call(), gemini_call()];
    for (call, (provider, kind)) in calls.iter().zip(expected) {
        let answer = s.send(call).await;
        let body = error_body(answer, 429, provider).await;
        assert_eq!(error_kind(provider, &body), kind, "{provider}: {body}");
        if provider == "openai" {
            assert_eq!(body["error"]["type"], "insufficient_quota", "{body}");
        }
        let seen = s
            .events
            .until("the budget error event", |e| e.event == "error")
            .await;
        let error = seen.last().expect("error event");
        assert_eq!(error.data["code"], "MODEL_BUDGET_EXCEEDED");
        let message = error.data["message"].as_str().expect("message");
        assert!(
            message.contains("43") && message.contains("40"),
            "{message}"
        );
        let usage = s.usage_event("the refused call").await;
        assert_eq!(usage.data["status"], 429);
        assert_eq!(usage.data["input_tokens"], 0);
    }
    assert_eq!(
        upstream.seen().len(),
        1,
        "refused calls never reach the upstream"
    );
    // Counting tokens is not a model call: it passes.
    let count = count_tokens();
    let counted = s.send(&count).await;
    assert_eq!(counted.status(), 200);
    assert_eq!(upstream.seen().len(), 2);
    s.gw.stop().await;
}

#[tokio::test]
async fn the_real_keys_reach_no_event_no_file_and_no_log() {
    // This test's runtime runs on this thread only: every task of the gateway logs here.
    let logs = LogBuffer::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);

    let upstream = FakeUpstream::start(false).await;
    let mut s = setup(|args| args.model.model_upstream = upstream.upstream_args()).await;
    let mut events = Vec::new();
    for call in [anthropic_call(), openai_call(), gemini_call()] {
        let answer = s.send(&call).await;
        assert_eq!(answer.status(), 200);
        answer.text().await.expect("answer");
        events.push(s.usage_event(call.provider).await);
    }
    // And the refusals, which must not quote what was presented.
    let wrong = s
        .send_with(&openai_call(), Some("wm_not-a-real-token"))
        .await;
    let body = wrong.text().await.expect("body");
    assert!(!body.contains("wm_not-a-real-token"), "{body}");
    tracing::info!("log capture works");
    let data = s.gw.data.clone();
    let token = s.model_token.clone();
    let _data_dir = s.gw.stop().await;

    let secrets = [ANTHROPIC_KEY, OPENAI_KEY, GEMINI_KEY, token.as_str()];
    for event in &events {
        let text = event.data.to_string();
        for secret in &secrets {
            assert!(!text.contains(secret), "{secret} in an event: {text}");
        }
    }
    let files = super::helpers::files_under(&data);
    for path in &files {
        let text = String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).to_string();
        for secret in &secrets {
            assert!(!text.contains(secret), "{secret} in {}", path.display());
        }
    }
    if !super::helpers::stored_rows_keep_none_of(&data, "usage", &secrets) {
        assert!(files.len() >= 2, "the session's files were checked");
    }
    let logged =
        String::from_utf8_lossy(&logs.0.lock().unwrap_or_else(|p| p.into_inner())).to_string();
    assert!(logged.contains("log capture works"), "the capture works");
    assert!(
        logged.contains("model request"),
        "the proxy logged its requests"
    );
    for secret in secrets.iter().chain(&["wm_not-a-real-token"]) {
        assert!(!logged.contains(secret), "{secret} in the log");
    }
}
