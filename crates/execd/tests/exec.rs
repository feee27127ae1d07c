//! `/v1/exec` over real HTTP: a real execd router on 127.0.0.1:0, a real reqwest client, real
//! commands. Engine behaviour is tested in depth in `warren-exec`; these tests pin the HTTP
//! contract: status codes, error codes, JSON shapes and the Codex `text`.

// Tests start real programs (shells, servers, the binary under test) directly.
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use warren_execd::{Config, Execd};
use warren_test_support::alive;

#[path = "support/loopback.rs"]
mod loopback;

struct Server {
    base: String,
    http: reqwest::Client,
    execd: Execd,
    _logs: tempfile::TempDir,
}

impl Server {
    async fn start() -> Self {
        Self::start_with(Config::default()).await
    }

    async fn start_with(mut config: Config) -> Self {
        warren_process::reaper::start().expect("become subreaper and start reaping");
        let logs = tempfile::tempdir().expect("temp dir");
        config.root = std::env::temp_dir();
        let execd = Execd::new(config);
        Self {
            base: loopback::serve(execd.router()).await,
            http: reqwest::Client::new(),
            execd,
            _logs: logs,
        }
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> (u16, Value) {
        let response = tokio::time::timeout(Duration::from_secs(60), request.send())
            .await
            .expect("execd answers within 60 s")
            .expect("request succeeds");
        let status = response.status().as_u16();
        let body = response.json::<Value>().await.expect("JSON body");
        (status, body)
    }

    /// `POST /v1/exec`, not as a login shell unless the body says so: this machine's profile
    /// (`pyenv rehash`) prints errors when many login shells start at once.
    async fn exec(&self, mut body: Value) -> (u16, Value) {
        if body.get("login").is_none() {
            body["login"] = Value::Bool(false);
        }
        self.send(self.http.post(self.url("/v1/exec")).json(&body))
            .await
    }

    async fn stdin(&self, id: &str, body: Value) -> (u16, Value) {
        self.send(
            self.http
                .post(self.url(&format!("/v1/exec/{id}/stdin")))
                .json(&body),
        )
        .await
    }

    /// `GET /v1/exec`: the listed sessions.
    async fn list(&self) -> Value {
        let (status, list) = self.send(self.http.get(self.url("/v1/exec"))).await;
        assert_eq!(status, 200, "{list}");
        list["sessions"].clone()
    }

    /// `DELETE /v1/exec/{id}`.
    async fn kill(&self, id: &str) -> (u16, Value) {
        self.send(self.http.delete(self.url(&format!("/v1/exec/{id}"))))
            .await
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn raw_exec(&self, body: &'static str) -> (u16, Value) {
        let request = self
            .http
            .post(self.url("/v1/exec"))
            .header("content-type", "application/json")
            .body(body);
        self.send(request).await
    }
}

#[tokio::test]
async fn exec_returns_the_structured_result_and_codex_text() {
    let server = Server::start().await;
    let (status, body) = server
        .exec(json!({"cmd": "echo hello; exit 3", "yield_time_ms": 30000}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "exited");
    assert_eq!(body["exit_code"], 3);
    assert_eq!(body["output"], "hello\n");
    assert!(body.get("session_id").is_none(), "{body}");
    assert_eq!(body["original_token_count"], 2);
    let text = body["text"].as_str().expect("text");
    assert!(text.starts_with(&format!(
        "Chunk ID: {}\nWall time: ",
        body["chunk_id"].as_str().expect("chunk id")
    )));
    assert!(
        text.ends_with("Process exited with code 3\nOriginal token count: 2\nOutput:\nhello\n"),
        "{text}"
    );
}

#[tokio::test]
async fn running_session_is_listed_polled_answered_and_deleted() {
    let server = Server::start().await;
    let (status, first) = server
        .exec(json!({"cmd": "printf 'Continue? [y/n] '; read a; echo \"answer $a\"; sleep 1000", "yield_time_ms": 30000}))
        .await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["status"], "awaiting_input", "{first}");
    assert_eq!(first["output"], "Continue? [y/n] ");
    let id = first["session_id"]
        .as_u64()
        .expect("session id")
        .to_string();

    let sessions = server.list().await;
    let entry = sessions
        .as_array()
        .expect("sessions array")
        .iter()
        .find(|s| s["session_id"].as_u64().map(|n| n.to_string()).as_deref() == Some(id.as_str()))
        .expect("the session is listed");
    assert_eq!(entry["tty"], false);
    assert!(entry["pid"].as_u64().is_some_and(|pid| pid > 1));
    assert!(
        entry["started_at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z'))
    );

    let (status, answer) = server
        .stdin(&id, json!({"chars": "y\n", "yield_time_ms": 2000}))
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["status"], "running");
    let mut output = answer["output"].as_str().unwrap_or_default().to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !output.contains('\n') {
        assert!(
            Instant::now() < deadline,
            "no answer echoed within 30 s: {output:?}"
        );
        let (_, poll) = server.stdin(&id, json!({})).await;
        output.push_str(poll["output"].as_str().unwrap_or_default());
    }
    assert_eq!(output, "answer y\n");

    let (status, killed) = server.kill(&id).await;
    assert_eq!(status, 200, "{killed}");
    assert_eq!(killed["status"], "exited");
    assert!(killed["exit_code"].as_i64().is_some());

    let (status, gone) = server.stdin(&id, json!({})).await;
    assert_eq!(status, 404);
    assert_eq!(gone["code"], "SESSION_NOT_FOUND");
    assert_eq!(gone["message"], format!("Unknown process id {id}"));
}

#[tokio::test]
async fn empty_stdin_body_is_a_poll() {
    let server = Server::start().await;
    let (_, first) = server
        .exec(json!({"cmd": "sleep 0.5; echo late", "yield_time_ms": 250}))
        .await;
    let id = first["session_id"]
        .as_u64()
        .expect("still running after 250 ms")
        .to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut output = first["output"].as_str().unwrap_or_default().to_string();
    loop {
        let request = server
            .http
            .post(server.url(&format!("/v1/exec/{id}/stdin")));
        let (status, poll) = server.send(request).await;
        assert_eq!(status, 200, "{poll}");
        output.push_str(poll["output"].as_str().unwrap_or_default());
        if poll["status"] == "exited" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the command did not finish within 60 s"
        );
    }
    assert_eq!(output, "late\n");
}

#[tokio::test]
async fn bad_requests_get_clear_errors() {
    let server = Server::start().await;
    let table: &[(&str, u16, &str)] = &[
        ("{}", 400, "INVALID_REQUEST_BODY"),
        ("{\"cmd\": ", 400, "INVALID_REQUEST_BODY"),
        ("not json", 400, "INVALID_REQUEST_BODY"),
        ("{\"cmd\": 42}", 400, "INVALID_REQUEST_BODY"),
        (
            "{\"cmd\": \"ls\", \"tty\": \"yes\"}",
            400,
            "INVALID_REQUEST_BODY",
        ),
        (
            "{\"cmd\": \"ls\", \"yield_time_ms\": -5}",
            400,
            "INVALID_REQUEST_BODY",
        ),
        (
            "{\"cmd\": \"ls\", \"env\": [\"A=1\"]}",
            400,
            "INVALID_REQUEST_BODY",
        ),
        ("{\"cmd\": \"   \"}", 400, "INVALID_REQUEST_BODY"),
        (
            "{\"cmd\": \"ls\", \"env\": {\"A=B\": \"1\"}}",
            400,
            "INVALID_REQUEST_BODY",
        ),
        (
            "{\"cmd\": \"ls\", \"env\": {\"\": \"1\"}}",
            400,
            "INVALID_REQUEST_BODY",
        ),
        (
            "{\"cmd\": \"ls\", \"workdir\": \"/nonexistent/place\"}",
            400,
            "INVALID_WORKDIR",
        ),
        (
            "{\"cmd\": \"ls\", \"workdir\": \"/etc/hostname\"}",
            400,
            "INVALID_WORKDIR",
        ),
        (
            "{\"cmd\": \"ls\", \"shell\": \"/nonexistent/shell\"}",
            400,
            "SPAWN_FAILED",
        ),
    ];
    for (body, status, code) in table {
        let started = Instant::now();
        let (got_status, got) = server.raw_exec(body).await;
        assert_eq!(
            (got_status, got["code"].as_str()),
            (*status, Some(*code)),
            "{body} -> {got}"
        );
        assert!(
            !got["message"].as_str().unwrap_or_default().is_empty(),
            "{body} has a message"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{body} was answered at once"
        );
    }
    let (_, missing) = server.raw_exec("{}").await;
    assert!(
        missing["message"]
            .as_str()
            .unwrap_or_default()
            .contains("cmd"),
        "{missing}"
    );
    let (_, spawn) = server
        .raw_exec("{\"cmd\": \"ls\", \"shell\": \"/nonexistent/shell\"}")
        .await;
    assert!(
        spawn["message"]
            .as_str()
            .unwrap_or_default()
            .contains("No such file"),
        "{spawn}"
    );
}

#[tokio::test]
async fn a_shell_that_does_not_exist_is_400_not_500() {
    let server = Server::start().await;
    for body in [
        r#"{"cmd": "true", "shell": ""}"#,
        r#"{"cmd": "true", "shell": "no-such-shell"}"#,
    ] {
        let (status, error) = server.raw_exec(body).await;
        assert_eq!(status, 400, "{body}: {error}");
        assert_eq!(error["code"], "SPAWN_FAILED", "{body}: {error}");
    }
}

#[tokio::test]
async fn unknown_session_ids_are_404() {
    let server = Server::start().await;
    for id in ["99", "123456", "abc"] {
        let (status, body) = server.stdin(id, json!({"chars": "x"})).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (404, Some("SESSION_NOT_FOUND")),
            "stdin {id}"
        );
        let (status, body) = server.kill(id).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (404, Some("SESSION_NOT_FOUND")),
            "delete {id}"
        );
    }
    let (status, body) = server.stdin("99", json!({"chars": 5})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("INVALID_REQUEST_BODY")),
        "{body}"
    );
}

#[tokio::test]
async fn the_access_token_guards_the_exec_routes() {
    let config = Config {
        access_token: Some("s3cret".into()),
        ..Config::default()
    };
    let server = Server::start_with(config).await;
    let (status, _) = server.exec(json!({"cmd": "true"})).await;
    assert_eq!(status, 401);
    let request = server
        .http
        .post(server.url("/v1/exec"))
        .header("X-EXECD-ACCESS-TOKEN", "s3cret")
        .json(&json!({"cmd": "echo ok", "login": false, "yield_time_ms": 30000}));
    let (status, body) = server.send(request).await;
    assert_eq!((status, body["output"].as_str()), (200, Some("ok\n")));
}

#[tokio::test]
async fn shutdown_kills_running_exec_sessions() {
    let server = Server::start().await;
    let (_, first) = server
        .exec(json!({"cmd": "sleep 1000", "yield_time_ms": 250}))
        .await;
    assert_eq!(first["status"], "running");
    let pid = server.list().await[0]["pid"].as_i64().expect("pid") as i32;
    server.execd.shutdown().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while alive(pid) {
        assert!(Instant::now() < deadline, "sleep 1000 survived shutdown");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, refused) = server.exec(json!({"cmd": "true"})).await;
    assert_eq!(
        (status, refused["code"].as_str()),
        (503, Some("SHUTTING_DOWN")),
        "{refused}"
    );
}

#[tokio::test]
async fn a_session_outlives_a_client_that_gave_up_waiting() {
    let server = Server::start().await;
    let request = server
        .http
        .post(server.url("/v1/exec"))
        .timeout(Duration::from_millis(500))
        .json(&json!({"cmd": "echo started; sleep 1000", "login": false, "yield_time_ms": 30000}));
    let gave_up = request.send().await;
    assert!(
        gave_up.is_err(),
        "the client times out before the 30 s yield"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let session = loop {
        let sessions = server.list().await;
        let found = sessions.as_array().and_then(|s| {
            s.iter()
                .find(|s| s["cmd"] == "echo started; sleep 1000")
                .cloned()
        });
        if let Some(found) = found {
            break found;
        }
        assert!(Instant::now() < deadline, "the session was never listed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(session["status"], "running");
    let id = session["session_id"].to_string();
    let (status, poll) = server.stdin(&id, json!({"yield_time_ms": 5000})).await;
    assert_eq!(status, 200);
    assert_eq!(
        poll["output"], "started\n",
        "the unread output waited for the next call"
    );
    let (status, _) = server.kill(&id).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn unknown_fields_are_ignored() {
    let server = Server::start().await;
    let (status, body) = server
        .exec(json!({
            "cmd": "echo ok",
            "login": false,
            "yield_time_ms": 30000,
            "justification": "Codex sends this",
            "with_escalated_permissions": false
        }))
        .await;
    assert_eq!(
        (status, body["output"].as_str()),
        (200, Some("ok\n")),
        "{body}"
    );
}
