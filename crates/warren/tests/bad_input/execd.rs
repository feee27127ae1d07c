//! execd's routes as matrix rows: Warren's own (`/v1/exec`, `/v1/terminals`, `/v1/files*`,
//! `/v1/workspace/*`, `/pty*`, `/v1/agent-terminals*`, `/v1/hands/identity`, `/mcp`), the
//! OpenSandbox-compatible ones, `/proxy/{port}/...`, and envd's on the E2B listener.

use serde_json::json;

use crate::matrix::{Credential, FileParam, Route, Shape};
use crate::servers::{EXECD_TOKEN, Server};
use crate::wire::{self, Body, Request};

/// A `Permission` has only optional fields: `{}` is one, and serde takes `[]` for one too.
const PERMISSION_IS_ALL_OPTIONAL: &[(&str, &[u16])] = &[("wrong types", &[200])];

/// Over Connect's message limit (32 MiB).
const CONNECT_HUGE: usize = 33 * 1024 * 1024;

fn credential() -> Option<Credential> {
    Some(Credential {
        header: "X-EXECD-ACCESS-TOKEN",
        good: EXECD_TOKEN.into(),
        other: None,
    })
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
    let response = send_reading_body(server, &request).await;
    serde_json::from_slice(&response).unwrap_or_else(|e| panic!("POST {target}: {e}"))
}

/// A request whose 2xx body is wanted: read to the end of the connection.
async fn send_reading_body(server: &Server, request: &Request) -> Vec<u8> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("connects");
    let mut bytes = format!("{} ", request.method).into_bytes();
    bytes.extend_from_slice(&request.target);
    bytes.extend_from_slice(b" HTTP/1.0\r\n");
    for (name, value) in &request.headers {
        bytes.extend_from_slice(format!("{name}: ").as_bytes());
        bytes.extend_from_slice(value);
        bytes.extend_from_slice(b"\r\n");
    }
    let Body::Sized(body) = &request.body else {
        panic!("a sized body")
    };
    bytes.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
    bytes.extend_from_slice(body);
    stream.write_all(&bytes).await.expect("writes");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("reads");
    let at = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head");
    answer[at + 4..].to_vec()
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
        let body: serde_json::Value =
            serde_json::from_slice(&send_reading_body(server, &status).await).expect("JSON");
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
    let warren = |method, target: &str| {
        let mut route = Route::new(method, target, addr);
        route.credential = credential();
        route
    };
    let os = |method, target: &str| {
        let mut route = warren(method, target);
        route.shape = Shape::OpenSandbox;
        route
    };
    let json_route = |mut route: Route, sample: serde_json::Value| {
        route.json = Some(sample);
        route
    };
    let pty = &fixtures.pty;
    let term = &fixtures.agent_terminal;
    let mut routes = vec![
        // /v1/exec: Warren's 401 shape.
        Route {
            wrong_methods: &["PUT", "DELETE"],
            // A NUL cannot be in a command line.
            fine: &[200],
            ..json_route(
                warren("POST", "/v1/exec"),
                json!({"cmd": "true", "yield_time_ms": 100}),
            )
        },
        Route {
            wrong_methods: &["POST", "GET"],
            fine: &[200, 404],
            ..warren("DELETE", "/v1/exec/999999")
        },
        Route {
            optional_json: true,
            fine: &[404],
            wrong_methods: &["GET"],
            ..json_route(
                warren("POST", "/v1/exec/999999/stdin"),
                json!({"chars": "x", "yield_time_ms": 10}),
            )
        },
        Route {
            wrong_methods: &["PUT"],
            ..warren("GET", "/v1/exec")
        },
        // /v1/terminals
        Route {
            wrong_methods: &["PUT", "DELETE"],
            fine: &[200, 201],
            ..json_route(
                os("POST", "/v1/terminals"),
                json!({"command": "true", "args": []}),
            )
        },
        Route {
            wrong_methods: &["GET"],
            fine: &[404],
            ..os("DELETE", "/v1/terminals/nope")
        },
        Route {
            wrong_methods: &["POST"],
            fine: &[404],
            ..os("GET", "/v1/terminals/nope/output?wait_ms=notanumber")
        },
        Route {
            wrong_methods: &["GET"],
            fine: &[404],
            ..os("POST", "/v1/terminals/nope/kill")
        },
        // /v1/files
        Route {
            file: Some(FileParam::Target),
            range: true,
            wrong_methods: &["POST", "PATCH"],
            ..os("GET", "/v1/files?path={file}")
        },
        Route {
            file: Some(FileParam::Target),
            writes: true,
            fine: &[200, 201, 204],
            ..os("PUT", "/v1/files?path={file}")
        },
        Route {
            file: Some(FileParam::Target),
            writes: true,
            fine: &[200, 204, 404],
            ..os("DELETE", "/v1/files?path={file}")
        },
        Route {
            file: Some(FileParam::Target),
            fine: &[200, 400, 404],
            wrong_methods: &["POST"],
            ..os("GET", "/v1/files/list?path={file}")
        },
        Route {
            file: Some(FileParam::Target),
            writes: true,
            fine: &[200, 201, 204, 409],
            wrong_methods: &["GET"],
            ..os("POST", "/v1/files/dir?path={file}")
        },
        Route {
            file: Some(FileParam::Field("to")),
            writes: true,
            fine: &[200, 204, 404],
            wrong_methods: &["GET"],
            ..json_route(
                os("POST", "/v1/files/move"),
                json!({"from": "absent.txt", "to": "moved.txt"}),
            )
        },
        Route {
            wrong_methods: &["POST"],
            ..os("GET", "/v1/files/watch")
        },
        Route {
            wrong_methods: &["POST"],
            ..os("GET", "/v1/hands/identity")
        },
        Route {
            wrong_methods: &["POST"],
            ..os("GET", "/v1/workspace/snapshot?tree=nonsense")
        },
        Route {
            fine: &[200, 400, 409],
            wrong_methods: &["GET"],
            ..os("POST", "/v1/workspace/restore?tree=nonsense")
        },
        // PTY
        Route {
            optional_json: true,
            fine: &[200, 201],
            wrong_methods: &["PUT", "DELETE"],
            ..json_route(os("POST", "/pty"), json!({"cwd": "dir", "command": "true"}))
        },
        Route {
            wrong_methods: &["POST", "PUT"],
            fine: &[200, 404],
            ..os("GET", "/pty/nope")
        },
        Route {
            fine: &[200, 204, 404],
            ..os("DELETE", "/pty/nope")
        },
        Route {
            websocket: true,
            wrong_methods: &["POST"],
            ..os("GET", &format!("/pty/{pty}/ws?mode=viewer"))
        },
        Route {
            websocket: true,
            wrong_methods: &["POST"],
            ..os("GET", &format!("/v1/agent-terminals/{term}/ws?mode=viewer"))
        },
        Route {
            wrong_methods: &["POST"],
            ..os("GET", "/v1/agent-terminals")
        },
        // /mcp (rmcp's streamable HTTP), Warren's 401.
        Route {
            fine: &[200, 202, 400, 406],
            ..warren("POST", "/mcp")
        },
        // OpenSandbox
        Route {
            wrong_methods: &["POST"],
            ..Route::new("GET", "/ping", addr)
        },
        Route {
            wrong_methods: &["POST"],
            ..os("GET", "/metrics")
        },
        Route {
            wrong_methods: &["POST"],
            ..os("GET", "/metrics/watch")
        },
        Route {
            wrong_methods: &["PUT"],
            fine: &[200],
            ..json_route(
                os("POST", "/command"),
                json!({"command": "true", "cwd": "dir", "background": true}),
            )
        },
        Route {
            fine: &[200, 204, 404],
            ..os("DELETE", "/command?id=nope")
        },
        Route {
            wrong_methods: &["POST"],
            fine: &[404],
            ..os("GET", "/command/status/nope")
        },
        Route {
            wrong_methods: &["POST"],
            fine: &[404],
            ..os("GET", "/command/nope/logs?cursor=notanumber")
        },
        Route {
            optional_json: true,
            fine: &[200, 201],
            wrong_methods: &["GET"],
            ..json_route(os("POST", "/session"), json!({"cwd": "dir"}))
        },
        Route {
            wrong_methods: &["GET"],
            fine: &[200, 204, 404],
            ..os("DELETE", "/session/nope")
        },
        Route {
            wrong_methods: &["GET"],
            // execd-compat.md: an unknown session is OpenSandbox's 500 `RUNTIME_ERROR`.
            fine: &[500],
            ..json_route(os("POST", "/session/nope/run"), json!({"command": "true"}))
        },
        Route {
            file: Some(FileParam::Target),
            writes: true,
            fine: &[200, 204, 404],
            // execd-compat.md: a directory is OpenSandbox's 500 `RUNTIME_ERROR`, and the lossily
            // decoded name may be the directory `POST /v1/files/dir` made of it.
            also: &[("invalid UTF-8", &[500])],
            wrong_methods: &["GET"],
            ..os("DELETE", "/files?path={file}")
        },
        Route {
            file: Some(FileParam::Target),
            fine: &[200, 404],
            wrong_methods: &["POST"],
            ..os("GET", "/files/info?path={file}")
        },
        Route {
            file: Some(FileParam::Field("dest")),
            writes: true,
            fine: &[200, 204, 404],
            wrong_methods: &["GET"],
            ..json_route(
                os("POST", "/files/mv"),
                json!([{"src": "absent.txt", "dest": "moved.txt"}]),
            )
        },
        Route {
            fine: &[200, 404],
            wrong_methods: &["GET"],
            also: PERMISSION_IS_ALL_OPTIONAL,
            ..json_route(
                os("POST", "/files/permissions"),
                json!({"absent.txt": {"mode": 644}}),
            )
        },
        Route {
            file: Some(FileParam::Target),
            fine: &[200, 404],
            wrong_methods: &["POST"],
            ..os("GET", "/files/search?path={file}&pattern=*")
        },
        Route {
            fine: &[200, 404],
            wrong_methods: &["GET"],
            ..json_route(
                os("POST", "/files/replace"),
                json!({"absent.txt": {"old": "a", "new": "b"}}),
            )
        },
        Route {
            fine: &[200, 400],
            wrong_methods: &["GET"],
            ..os("POST", "/files/upload")
        },
        Route {
            file: Some(FileParam::Target),
            range: true,
            wrong_methods: &["POST"],
            ..os("GET", "/files/download?path={file}")
        },
        Route {
            fine: &[200, 404],
            wrong_methods: &["GET"],
            also: PERMISSION_IS_ALL_OPTIONAL,
            ..json_route(os("POST", "/directories"), json!({"made": {"mode": 755}}))
        },
        Route {
            file: Some(FileParam::Target),
            writes: true,
            fine: &[200, 204, 404],
            ..os("DELETE", "/directories?path={file}")
        },
        Route {
            file: Some(FileParam::Target),
            fine: &[200, 400, 404],
            wrong_methods: &["POST"],
            ..os("GET", "/directories/list?path={file}")
        },
        Route {
            fine: &[404, 501],
            ..os("POST", "/code")
        },
        Route {
            fine: &[404, 501],
            ..os("GET", "/v1/isolated/anything")
        },
        Route {
            fine: &[400, 502],
            ..os("GET", "/proxy/notaport/x")
        },
        Route {
            fine: &[400, 502],
            ..os("GET", "/proxy/99999/x")
        },
    ];
    // envd (E2B) on its own listener: `X-Access-Token`, envd's and Connect's error shapes.
    let envd = |method, target: &str, shape| {
        let mut route = Route::new(method, target, e2b);
        route.credential = Some(Credential {
            header: "X-Access-Token",
            good: EXECD_TOKEN.into(),
            other: None,
        });
        route.shape = shape;
        route
    };
    routes.extend([
        Route {
            wrong_methods: &["POST"],
            fine: &[204],
            shape: Shape::Envd,
            ..Route::new("GET", "/health", e2b)
        },
        Route {
            wrong_methods: &["POST"],
            ..envd("GET", "/envs", Shape::Envd)
        },
        // envd's `/init` takes an empty body, any content type, and `{}` for its variables.
        Route {
            fine: &[204],
            optional_json: true,
            also: &[("wrong types", &[204])],
            wrong_methods: &["GET"],
            ..json_route(
                envd("POST", "/init", Shape::Envd),
                json!({"envVars": {"A": "b"}}),
            )
        },
        Route {
            // envd's download has no byte ranges: a `Range` is ignored, as by envd itself.
            file: Some(FileParam::Target),
            wrong_methods: &["PUT"],
            ..envd("GET", "/files?path={file}", Shape::Envd)
        },
        Route {
            fine: &[200, 400],
            ..envd("POST", "/files?path={file}", Shape::Envd)
        },
        Route {
            fine: &[200],
            wrong_methods: &["GET"],
            huge: CONNECT_HUGE,
            // Connect's `resource_exhausted` is HTTP 429.
            also: &[("huge body", &[429])],
            ..json_route(
                envd("POST", "/filesystem.Filesystem/Stat", Shape::Connect),
                json!({"path": "hello.txt"}),
            )
        },
        // A `ListRequest` has no fields: any object is one, and Connect takes an empty body
        // for the empty message.
        Route {
            fine: &[200],
            wrong_methods: &["GET"],
            huge: CONNECT_HUGE,
            also: &[
                ("wrong types", &[200]),
                ("empty body", &[200]),
                ("huge body", &[429]),
            ],
            ..json_route(
                envd("POST", "/process.Process/List", Shape::Connect),
                json!({}),
            )
        },
        // Connect's `unimplemented` is HTTP 501, before the body is read.
        Route {
            fine: &[501],
            ..envd("POST", "/process.Process/NoSuchMethod", Shape::Connect)
        },
    ]);
    routes
}

/// A request that tells whether execd still serves the PTY session it had.
pub async fn pty_alive(server: &Server, id: &str) -> bool {
    let request =
        Request::new("GET", format!("/pty/{id}")).header("X-EXECD-ACCESS-TOKEN", EXECD_TOKEN);
    matches!(wire::send(server.addr, &request).await, Ok(r) if r.status == 200)
}
