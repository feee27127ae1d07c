//! execd's routes as matrix rows: Warren's own (`/v1/exec`, `/v1/terminals`, `/v1/files*`,
//! `/v1/workspace/*`, `/pty*`, `/v1/agent-terminals*`, `/v1/hands/identity`, `/mcp`), the
//! OpenSandbox-compatible ones, `/proxy/{port}/...`, and envd's on the E2B listener.

use serde_json::json;

use crate::matrix::{self, Credential, Route, Shape};
use crate::servers::{EXECD_TOKEN, Server};
use crate::wire::{self, Body, Request};

/// A `Permission` has only optional fields: `{}` is one, and serde takes `[]` for one too.
const PERMISSION_IS_ALL_OPTIONAL: &[(&str, &[u16])] = &[("wrong types", &[200])];

/// Over Connect's message limit (32 MiB).
const CONNECT_HUGE: usize = 33 * 1024 * 1024;

/// execd's own credential.
fn credential() -> Credential {
    Credential {
        header: "X-EXECD-ACCESS-TOKEN",
        good: EXECD_TOKEN.into(),
        other: None,
    }
}

/// What the rows need that must exist first: a PTY session and an agent terminal.
pub struct Fixtures {
    pub pty: String,
    pub agent_terminal: String,
    /// The PTY session's holder, attached for the whole matrix so its shell runs and viewers
    /// may attach.
    pub _holder: tokio::net::TcpStream,
}

async fn post_json(server: &Server, target: &str, body: serde_json::Value) -> serde_json::Value {
    let request = Request::new("POST", target)
        .header("X-EXECD-ACCESS-TOKEN", EXECD_TOKEN)
        .header("Content-Type", "application/json")
        .body(Body::Sized(body.to_string().into_bytes()));
    let answer = wire::fetch(server.addr, &request).await;
    serde_json::from_slice(wire::body_of(&answer)).unwrap_or_else(|e| panic!("POST {target}: {e}"))
}

pub async fn fixtures(server: &Server) -> Fixtures {
    let pty = post_json(server, "/pty", json!({}))
        .await
        .get("session_id")
        .and_then(|v| v.as_str())
        .expect("a PTY session id")
        .to_owned();
    let terminal = post_json(
        server,
        "/v1/terminals",
        json!({"command": "sleep", "args": ["600"]}),
    )
    .await;
    let id = terminal["terminal_id"].as_str().expect("a terminal id");
    let attach =
        Request::new("GET", format!("/pty/{pty}/ws")).header("X-EXECD-ACCESS-TOKEN", EXECD_TOKEN);
    let holder = wire::websocket(server.addr, &attach)
        .await
        .expect("the PTY session's holder attaches");
    // The holder's attach starts the shell; viewers may attach once it runs.
    let status = Request::new("GET", format!("/pty/{pty}"))
        .header("X-EXECD-ACCESS-TOKEN", EXECD_TOKEN)
        .body(Body::Sized(Vec::new()));
    let deadline = tokio::time::Instant::now() + warren_test_support::WAIT;
    loop {
        let answer = wire::fetch(server.addr, &status).await;
        let body: serde_json::Value = serde_json::from_slice(wire::body_of(&answer)).expect("JSON");
        if body["running"] == true {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the PTY session's shell never ran: {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    Fixtures {
        pty,
        agent_terminal: format!("term-{id}"),
        _holder: holder,
    }
}

/// Every route of execd and its E2B listener.
pub fn routes(server: &Server, fixtures: &Fixtures) -> Vec<Route> {
    let addr = server.addr;
    let e2b = server.e2b.expect("execd's E2B listener");
    let warren = |method, target: &str| Route::new(method, target, addr).credential(credential());
    let os = |method, target: &str| warren(method, target).shape(Shape::OpenSandbox);
    let pty = &fixtures.pty;
    let term = &fixtures.agent_terminal;
    let mut routes = vec![
        // /v1/exec: Warren's 401 shape.
        warren("POST", "/v1/exec")
            .json(json!({"cmd": "true", "yield_time_ms": 100}))
            // A NUL cannot be in a command line.
            .fine(&[200])
            .wrong(&["PUT", "DELETE"]),
        warren("DELETE", "/v1/exec/999999")
            .fine(&[200, 404])
            .wrong(&["POST", "GET"]),
        warren("POST", "/v1/exec/999999/stdin")
            .json(json!({"chars": "x", "yield_time_ms": 10}))
            .optional_json()
            .fine(&[404])
            .wrong(&["GET"]),
        warren("GET", "/v1/exec").wrong(&["PUT"]),
        // /v1/terminals
        os("POST", "/v1/terminals")
            .json(json!({"command": "true", "args": []}))
            .fine(&[200, 201])
            .wrong(&["PUT", "DELETE"]),
        os("DELETE", "/v1/terminals/nope")
            .fine(&[404])
            .wrong(&["GET"]),
        os("GET", "/v1/terminals/nope/output?wait_ms=notanumber")
            .fine(&[404])
            .wrong(&["POST"]),
        os("POST", "/v1/terminals/nope/kill")
            .fine(&[404])
            .wrong(&["GET"]),
        // /v1/files
        os("GET", "/v1/files?path={file}")
            .file()
            .range()
            .wrong(&["POST", "PATCH"]),
        os("PUT", "/v1/files?path={file}")
            .file()
            .writes()
            .fine(&[200, 201, 204]),
        os("DELETE", "/v1/files?path={file}")
            .file()
            .writes()
            .fine(&[200, 204, 404]),
        os("GET", "/v1/files/list?path={file}")
            .file()
            .fine(&[200, 400, 404])
            .wrong(&["POST"]),
        os("GET", "/v1/files/watch").wrong(&["POST"]),
        os("GET", "/v1/hands/identity").wrong(&["POST"]),
        os("GET", "/v1/workspace/snapshot?tree=nonsense").wrong(&["POST"]),
        os("POST", "/v1/workspace/restore?tree=nonsense")
            .fine(&[200, 400, 409])
            .wrong(&["GET"]),
        // PTY
        os("POST", "/pty")
            .json(json!({"cwd": "dir", "command": "true"}))
            .optional_json()
            .fine(&[200, 201])
            .wrong(&["PUT", "DELETE"]),
        os("GET", "/pty/nope")
            .fine(&[200, 404])
            .wrong(&["POST", "PUT"]),
        os("DELETE", "/pty/nope").fine(&[200, 204, 404]),
        os("GET", &format!("/pty/{pty}/ws?mode=viewer"))
            .websocket()
            .wrong(&["POST"]),
        os("GET", &format!("/v1/agent-terminals/{term}/ws?mode=viewer"))
            .websocket()
            .wrong(&["POST"]),
        os("GET", "/v1/agent-terminals").wrong(&["POST"]),
        // /mcp (rmcp's streamable HTTP), Warren's 401.
        warren("POST", "/mcp").fine(&[200, 202, 400, 406]),
        // OpenSandbox
        Route::new("GET", "/ping", addr).wrong(&["POST"]),
        os("GET", "/metrics").wrong(&["POST"]),
        os("GET", "/metrics/watch").wrong(&["POST"]),
        os("POST", "/command")
            .json(json!({"command": "true", "cwd": "dir", "background": true}))
            .fine(&[200])
            .wrong(&["PUT"]),
        os("DELETE", "/command?id=nope").fine(&[200, 204, 404]),
        os("GET", "/command/status/nope")
            .fine(&[404])
            .wrong(&["POST"]),
        os("GET", "/command/nope/logs?cursor=notanumber")
            .fine(&[404])
            .wrong(&["POST"]),
        os("POST", "/session")
            .json(json!({"cwd": "dir"}))
            .optional_json()
            .fine(&[200, 201])
            .wrong(&["GET"]),
        os("DELETE", "/session/nope")
            .fine(&[200, 204, 404])
            .wrong(&["GET"]),
        // execd-compat.md: an unknown session is OpenSandbox's 500 `RUNTIME_ERROR`.
        os("POST", "/session/nope/run")
            .json(json!({"command": "true"}))
            .fine(&[500])
            .wrong(&["GET"]),
        // execd-compat.md: a directory is OpenSandbox's 500 `RUNTIME_ERROR`, and the lossily
        // decoded name may be the directory `POST /v1/files/dir` made of it.
        os("DELETE", "/files?path={file}")
            .file()
            .writes()
            .fine(&[200, 204, 404])
            .also(&[("invalid UTF-8", &[500])])
            .wrong(&["GET"]),
        os("GET", "/files/info?path={file}")
            .file()
            .fine(&[200, 404])
            .wrong(&["POST"]),
        os("POST", "/files/mv")
            .json(json!([{"src": "absent.txt", "dest": "moved.txt"}]))
            .file_field("dest")
            .writes()
            .fine(&[200, 204, 404])
            .wrong(&["GET"]),
        os("POST", "/files/permissions")
            .json(json!({"absent.txt": {"mode": 644}}))
            .fine(&[200, 404])
            .also(PERMISSION_IS_ALL_OPTIONAL)
            .wrong(&["GET"]),
        os("GET", "/files/search?path={file}&pattern=*")
            .file()
            .fine(&[200, 404])
            .wrong(&["POST"]),
        os("POST", "/files/replace")
            .json(json!({"absent.txt": {"old": "a", "new": "b"}}))
            .fine(&[200, 404])
            .wrong(&["GET"]),
        os("POST", "/files/upload")
            .fine(&[200, 400])
            .wrong(&["GET"]),
        os("GET", "/files/download?path={file}")
            .file()
            .range()
            .wrong(&["POST"]),
        os("POST", "/directories")
            .json(json!({"made": {"mode": 755}}))
            .fine(&[200, 404])
            .also(PERMISSION_IS_ALL_OPTIONAL)
            .wrong(&["GET"]),
        os("DELETE", "/directories?path={file}")
            .file()
            .writes()
            .fine(&[200, 204, 404]),
        os("GET", "/directories/list?path={file}")
            .file()
            .fine(&[200, 400, 404])
            .wrong(&["POST"]),
        os("POST", "/code").fine(&[404, 501]),
        os("GET", "/v1/isolated/anything").fine(&[404, 501]),
        os("GET", "/proxy/notaport/x").fine(&[400, 502]),
        os("GET", "/proxy/99999/x").fine(&[400, 502]),
    ];
    // envd (E2B) on its own listener: `X-Access-Token`, envd's and Connect's error shapes.
    let envd = |method, target: &str, shape| {
        let credential = Credential {
            header: "X-Access-Token",
            ..credential()
        };
        Route::new(method, target, e2b)
            .credential(credential)
            .shape(shape)
    };
    routes.extend([
        Route::new("GET", "/health", e2b)
            .fine(&[204])
            .wrong(&["POST"])
            .shape(Shape::Envd),
        envd("GET", "/envs", Shape::Envd).wrong(&["POST"]),
        // envd's `/init` takes an empty body, any content type, and `{}` for its variables.
        envd("POST", "/init", Shape::Envd)
            .json(json!({"envVars": {"A": "b"}}))
            .optional_json()
            .fine(&[204])
            .also(&[("wrong types", &[204])])
            .wrong(&["GET"]),
        // envd's download has no byte ranges: a `Range` is ignored, as by envd itself.
        envd("GET", "/files?path={file}", Shape::Envd)
            .file()
            .wrong(&["PUT"]),
        envd("POST", "/files?path={file}", Shape::Envd).fine(&[200, 400]),
        envd("POST", "/filesystem.Filesystem/Stat", Shape::Connect)
            .json(json!({"path": "hello.txt"}))
            .huge(CONNECT_HUGE)
            .fine(&[200])
            // Connect's `resource_exhausted` is HTTP 429.
            .also(&[("huge body", &[429])])
            .wrong(&["GET"]),
        // A `ListRequest` has no fields: any object is one, and Connect takes an empty body
        // for the empty message.
        envd("POST", "/process.Process/List", Shape::Connect)
            .json(json!({}))
            .huge(CONNECT_HUGE)
            .fine(&[200])
            .also(&[
                ("wrong types", &[200]),
                ("empty body", &[200]),
                ("huge body", &[429]),
            ])
            .wrong(&["GET"]),
        // Connect's `unimplemented` is HTTP 501, before the body is read.
        envd("POST", "/process.Process/NoSuchMethod", Shape::Connect).fine(&[501]),
    ]);
    routes.extend(matrix::dir_and_move(os, "/v1/files"));
    routes
}

/// A request that tells whether execd still serves the PTY session it had.
pub async fn pty_alive(server: &Server, id: &str) -> bool {
    let request =
        Request::new("GET", format!("/pty/{id}")).header("X-EXECD-ACCESS-TOKEN", EXECD_TOKEN);
    matches!(wire::send(server.addr, &request).await, Ok(r) if r.status == 200)
}
