//! The gateway's routes as matrix rows: devices and admin, sessions, messages, permissions,
//! events, terminals, previews, files, the model proxy, the console, health and metrics.

use serde_json::json;

use crate::matrix::{self, Credential, Route, Shape};
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
    let answer = wire::fetch(server.addr, &request).await;
    serde_json::from_slice(wire::body_of(&answer))
        .unwrap_or_else(|e| panic!("a JSON answer: {e}: {}", String::from_utf8_lossy(&answer)))
}

/// The status of `request`, however long it takes.
async fn wire_send_slow(server: &Server, request: &Request) -> u16 {
    let answer = wire::fetch(server.addr, request).await;
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
        Route::new(method, target, addr).credential(Credential {
            header: "Authorization",
            good: format!("Bearer {}", fixtures.token),
            other: Some(format!("Bearer {}", fixtures.other)),
        })
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
    let admin = |method, target: &str| {
        Route::new(method, target, addr).credential(Credential {
            header: "Authorization",
            good: format!("Bearer {ADMIN_TOKEN}"),
            other: Some(format!("Bearer {}", fixtures.token)),
        })
    };
    let mut routes = vec![
        Route::new("POST", "/v1/devices", addr)
            .json(json!({"device_id": "matrix-fresh"}))
            .fine(&[200, 201])
            .wrong(&["PUT", "DELETE"])
            .credential(Credential {
                header: "X-App-Key",
                good: APP_KEY.into(),
                other: None,
            }),
        // Another device's token is good here too: its own owner's devices, its own code.
        own("GET", "/v1/devices").wrong(&["PUT"]),
        own("POST", "/v1/devices/pair").fine(&[201]).wrong(&["GET"]),
        own("DELETE", "/v1/devices/nobody-0001")
            .fine(&[404])
            .wrong(&["POST"]),
        Route::new("GET", "/v1/push/key", addr).wrong(&["POST"]),
        own("POST", "/v1/push/subscriptions")
            .json(json!({
                "endpoint": "https://push.example.com/send/matrix",
                "keys": {"p256dh": "BAAA", "auth": "AAAA"},
            }))
            // The keys are not a P-256 point: refused with its code.
            .fine(&[201, 400])
            .wrong(&["PUT"]),
        own("GET", "/v1/push/subscriptions").wrong(&["PUT"]),
        own("DELETE", "/v1/push/subscriptions/nope")
            .fine(&[404])
            .wrong(&["POST"]),
        admin("GET", "/v1/admin/devices").wrong(&["POST"]),
        admin("POST", "/v1/admin/devices/nobody/reset")
            .fine(&[200, 204, 404])
            .wrong(&["GET"]),
        // Another device's token is good here: it is that device's own list.
        own("POST", "/v1/sessions")
            .json(json!({"title": "t"}))
            .optional_json()
            // A device may hold 20 sessions; the matrix makes more.
            .fine(&[200, 201, 429])
            .wrong(&["PUT"]),
        own("GET", "/v1/sessions").wrong(&["PUT"]),
        mine("GET", "").wrong(&["PUT", "POST"]),
        mine("PATCH", "")
            .json(json!({"title": "renamed"}))
            .fine(&[200]),
        device("DELETE", "/v1/sessions/nope").fine(&[200, 204, 404]),
        mine("POST", "/messages")
            .json(json!({"text": "hi"}))
            .fine(&[202, 409, 503])
            .wrong(&["GET"]),
        mine("POST", "/cancel")
            .fine(&[200, 202, 204, 409])
            .wrong(&["GET"]),
        mine("POST", "/permissions/nope")
            .json(json!({"option_id": "allow"}))
            .fine(&[404, 409])
            .wrong(&["GET"]),
        mine("GET", "/events").wrong(&["POST"]),
        mine("GET", "/terminals").wrong(&["POST"]),
        mine("GET", "/terminals/matrix/ws?mode=viewer")
            .websocket()
            .wrong(&["POST"]),
        mine("POST", "/previews")
            .json(json!({"port": 3000}))
            .fine(&[200, 201, 400, 409]),
        mine("GET", "/previews").wrong(&["PUT"]),
        mine("DELETE", "/previews/3000")
            .fine(&[200, 204, 404])
            .wrong(&["GET"]),
        mine("GET", "/files?path={file}")
            .file()
            .fine(&[200, 400, 404])
            .wrong(&["POST"]),
        mine("DELETE", "/files?path={file}")
            .file()
            .writes()
            .fine(&[200, 204, 404]),
        mine("GET", "/files/content?path={file}")
            .file()
            .range()
            .fine(&[200, 404])
            .wrong(&["POST"]),
        mine("PUT", "/files/content?path={file}")
            .file()
            .writes()
            .fine(&[200, 201, 204]),
        Route::new("POST", "/v1/model/openai/v1/chat/completions", addr)
            .fine(&[401, 404])
            .shape(Shape::Provider)
            .credential(Credential {
                header: "Authorization",
                good: "Bearer wm_not-a-session-token".into(),
                other: None,
            }),
        Route::new("GET", "/", addr)
            .fine(&[200, 304])
            .wrong(&["POST"]),
        Route::new("GET", "/console/../../etc/passwd", addr)
            .fine(&[200, 404])
            .wrong(&["POST"]),
        Route::new("GET", "/healthz", addr).wrong(&["POST"]),
        Route::new("GET", "/metrics", addr).wrong(&["POST"]),
    ];
    routes.extend(matrix::dir_and_move(mine, "/files"));
    routes
}
