//! The gateway's routes as matrix rows: devices and admin, sessions, messages, permissions,
//! events, terminals, previews, files, the model proxy, the console, health and metrics.

use serde_json::json;

use crate::matrix::{Credential, FileParam, Route, Shape};
use crate::servers::{ADMIN_TOKEN, APP_KEY, Server};
use crate::wire;
use crate::wire::{Body, Request};

/// A device's token and its session, and another device's token.
pub struct Fixtures {
    pub token: String,
    pub other: String,
    pub session: String,
    /// The `matrix` terminal's holder, attached for the whole matrix so viewers may attach.
    pub _holder: tokio::net::TcpStream,
}

async fn json_answer(server: &Server, request: Request) -> serde_json::Value {
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
    let body = match &request.body {
        Body::Sized(body) => body.clone(),
        _ => Vec::new(),
    };
    bytes.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
    bytes.extend_from_slice(&body);
    stream.write_all(&bytes).await.expect("writes");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("reads");
    let at = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head");
    serde_json::from_slice(&answer[at + 4..])
        .unwrap_or_else(|e| panic!("a JSON answer: {e}: {}", String::from_utf8_lossy(&answer)))
}

/// The status of `request`, however long it takes.
async fn wire_send_slow(server: &Server, request: &Request) -> u16 {
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
    let body = match &request.body {
        Body::Sized(body) => body.clone(),
        _ => Vec::new(),
    };
    bytes.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
    bytes.extend_from_slice(&body);
    stream.write_all(&bytes).await.expect("writes");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("reads");
    String::from_utf8_lossy(&answer)
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status")
}

async fn register(server: &Server, device: &str) -> String {
    let request = Request::new("POST", "/v1/devices")
        .header("X-App-Key", APP_KEY)
        .header("Content-Type", "application/json")
        .body(Body::Sized(
            json!({"device_id": device}).to_string().into_bytes(),
        ));
    json_answer(server, request).await["token"]
        .as_str()
        .expect("a device token")
        .to_owned()
}

pub async fn fixtures(server: &Server) -> Fixtures {
    let token = register(server, "matrix-phone").await;
    let other = register(server, "matrix-other").await;
    let request = Request::new("POST", "/v1/sessions")
        .header("Authorization", format!("Bearer {token}"))
        .header("Content-Type", "application/json")
        .body(Body::Sized(
            json!({"title": "matrix"}).to_string().into_bytes(),
        ));
    let session = json_answer(server, request).await["id"]
        .as_str()
        .expect("a session id")
        .to_owned();
    let bearer = format!("Bearer {token}");
    let hello = Request::new(
        "PUT",
        format!("/v1/sessions/{session}/files/content?path=hello.txt"),
    )
    .header("Authorization", bearer.clone())
    .body(Body::Sized(crate::servers::HELLO.as_bytes().to_vec()));
    // The first file operation starts the hands.
    let put = tokio::time::timeout(warren_test_support::WAIT, wire_send_slow(server, &hello))
        .await
        .expect("hello.txt written in time");
    assert!(put == 200 || put == 201, "writing hello.txt: {put}");
    let attach = Request::new("GET", format!("/v1/sessions/{session}/terminals/matrix/ws"))
        .header("Authorization", bearer);
    let holder = wire::websocket(server.addr, &attach)
        .await
        .expect("the terminal's holder attaches");
    Fixtures {
        token,
        other,
        session,
        _holder: holder,
    }
}

/// Every route of the gateway.
pub fn routes(server: &Server, fixtures: &Fixtures) -> Vec<Route> {
    let addr = server.addr;
    let device = |method, target: &str| {
        let mut route = Route::new(method, target, addr);
        route.credential = Some(Credential {
            header: "Authorization",
            good: format!("Bearer {}", fixtures.token),
            other: Some(format!("Bearer {}", fixtures.other)),
        });
        route
    };
    let mine =
        |method, rest: &str| device(method, &format!("/v1/sessions/{}{rest}", fixtures.session));
    let own = |method, target: &str| {
        let mut route = device(method, target);
        if let Some(credential) = &mut route.credential {
            credential.other = None;
        }
        route
    };
    let json_route = |mut route: Route, sample: serde_json::Value| {
        route.json = Some(sample);
        route
    };
    let admin = |method, target: &str| {
        let mut route = Route::new(method, target, addr);
        route.credential = Some(Credential {
            header: "Authorization",
            good: format!("Bearer {ADMIN_TOKEN}"),
            other: Some(format!("Bearer {}", fixtures.token)),
        });
        route
    };
    vec![
        Route {
            credential: Some(Credential {
                header: "X-App-Key",
                good: APP_KEY.into(),
                other: None,
            }),
            fine: &[200, 201],
            wrong_methods: &["GET", "DELETE"],
            ..json_route(
                Route::new("POST", "/v1/devices", addr),
                json!({"device_id": "matrix-fresh"}),
            )
        },
        Route {
            wrong_methods: &["POST"],
            ..admin("GET", "/v1/admin/devices")
        },
        Route {
            wrong_methods: &["GET"],
            fine: &[200, 204, 404],
            ..admin("POST", "/v1/admin/devices/nobody/reset")
        },
        // Another device's token is good here: it is that device's own list.
        Route {
            optional_json: true,
            // A device may hold 20 sessions; the matrix makes more.
            fine: &[200, 201, 429],
            wrong_methods: &["PUT"],
            ..json_route(own("POST", "/v1/sessions"), json!({"title": "t"}))
        },
        Route {
            wrong_methods: &["PUT"],
            ..own("GET", "/v1/sessions")
        },
        Route {
            wrong_methods: &["PUT", "POST"],
            ..mine("GET", "")
        },
        Route {
            fine: &[200],
            ..json_route(mine("PATCH", ""), json!({"title": "renamed"}))
        },
        Route {
            fine: &[200, 204, 404],
            ..device("DELETE", "/v1/sessions/nope")
        },
        Route {
            fine: &[202, 409, 503],
            wrong_methods: &["GET"],
            ..json_route(mine("POST", "/messages"), json!({"text": "hi"}))
        },
        Route {
            fine: &[200, 202, 204, 409],
            wrong_methods: &["GET"],
            ..mine("POST", "/cancel")
        },
        Route {
            fine: &[404, 409],
            wrong_methods: &["GET"],
            ..json_route(
                mine("POST", "/permissions/nope"),
                json!({"option_id": "allow"}),
            )
        },
        Route {
            wrong_methods: &["POST"],
            ..mine("GET", "/events")
        },
        Route {
            wrong_methods: &["POST"],
            ..mine("GET", "/terminals")
        },
        Route {
            websocket: true,
            wrong_methods: &["POST"],
            ..mine("GET", "/terminals/matrix/ws?mode=viewer")
        },
        Route {
            fine: &[200, 201, 400, 409],
            ..json_route(mine("POST", "/previews"), json!({"port": 3000}))
        },
        Route {
            wrong_methods: &["PUT"],
            ..mine("GET", "/previews")
        },
        Route {
            fine: &[200, 204, 404],
            wrong_methods: &["GET"],
            ..mine("DELETE", "/previews/3000")
        },
        Route {
            file: Some(FileParam::Target),
            fine: &[200, 400, 404],
            wrong_methods: &["POST"],
            ..mine("GET", "/files?path={file}")
        },
        Route {
            file: Some(FileParam::Target),
            writes: true,
            fine: &[200, 204, 404],
            ..mine("DELETE", "/files?path={file}")
        },
        Route {
            file: Some(FileParam::Target),
            range: true,
            fine: &[200, 404],
            wrong_methods: &["POST"],
            ..mine("GET", "/files/content?path={file}")
        },
        Route {
            file: Some(FileParam::Target),
            writes: true,
            fine: &[200, 201, 204],
            ..mine("PUT", "/files/content?path={file}")
        },
        Route {
            file: Some(FileParam::Target),
            writes: true,
            fine: &[200, 201, 204, 409],
            wrong_methods: &["GET"],
            ..mine("POST", "/files/dir?path={file}")
        },
        Route {
            file: Some(FileParam::Field("to")),
            writes: true,
            fine: &[200, 204, 404],
            wrong_methods: &["GET"],
            ..json_route(
                mine("POST", "/files/move"),
                json!({"from": "absent.txt", "to": "moved.txt"}),
            )
        },
        Route {
            credential: Some(Credential {
                header: "Authorization",
                good: "Bearer wm_not-a-session-token".into(),
                other: None,
            }),
            fine: &[401, 404],
            shape: Shape::Provider,
            ..Route::new("POST", "/v1/model/openai/v1/chat/completions", addr)
        },
        Route {
            fine: &[200, 304],
            wrong_methods: &["POST"],
            ..Route::new("GET", "/", addr)
        },
        Route {
            fine: &[200, 404],
            wrong_methods: &["POST"],
            ..Route::new("GET", "/console/../../etc/passwd", addr)
        },
        Route {
            wrong_methods: &["POST"],
            ..Route::new("GET", "/healthz", addr)
        },
        Route {
            wrong_methods: &["POST"],
            ..Route::new("GET", "/metrics", addr)
        },
    ]
}
