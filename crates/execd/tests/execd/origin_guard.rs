//! The `Host` and `Origin` guard against the real daemon, execd's listener and envd's, each on a
//! temp root: what a web page can make a browser send (another site's `Origin` on a form upload
//! or a WebSocket, a rebound name in `Host`) is refused with 403 before any route runs, while
//! what curl and the SDKs send, the server's own origin, the names and origins the flags admit,
//! a request with the access token and anything on a Unix socket are served. "Off loopback"
//! listens on 0.0.0.0:0 and is reached only at 127.0.0.1.

use std::path::Path;

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use warren_execd::{Config, Execd, ListenAddr};
use warren_test_support::WAIT;

/// A daemon on `config.listen` (a TCP address; port 0), its root a temp dir, reached at
/// 127.0.0.1 on the port it got.
struct Server {
    /// `127.0.0.1:PORT`.
    addr: String,
    http: reqwest::Client,
    root: tempfile::TempDir,
}

impl Server {
    async fn start(config: Config) -> Server {
        let root = tempfile::tempdir().expect("temp root");
        // Always a free port: the default (44772) may be another test's at the same moment.
        let listen = match config.listen {
            ListenAddr::Tcp(address) => ListenAddr::Tcp(std::net::SocketAddr::new(address.ip(), 0)),
            other => other,
        };
        let config = Config {
            root: std::fs::canonicalize(root.path()).expect("canonical root"),
            listen,
            ..config
        };
        let (listener, url) = warren_execd::bind(&config.listen).await.expect("binds");
        let port = url.rsplit_once(':').expect("a port").1.to_owned();
        tokio::spawn(warren_execd::serve(
            Execd::new(config),
            listener,
            std::future::pending(),
        ));
        Server {
            addr: format!("127.0.0.1:{port}"),
            http: reqwest::Client::new(),
            root,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// A path inside the root, as the file routes take it.
    fn path(&self, name: &str) -> String {
        std::fs::canonicalize(self.root.path())
            .expect("canonical root")
            .join(name)
            .to_string_lossy()
            .into_owned()
    }

    /// `POST /files/upload` of `content` to `name` (OpenSandbox's multipart form, as a browser
    /// form would send it), with `headers` on top.
    async fn upload(&self, name: &str, headers: &[(&str, &str)]) -> (u16, Value) {
        let boundary = "guardBoundary";
        let metadata = json!({"path": self.path(name)});
        let body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"; \
             filename=\"metadata\"\r\nContent-Type: application/json\r\n\r\n{metadata}\r\n\
             --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\
             Content-Type: application/octet-stream\r\n\r\nuploaded\r\n--{boundary}--\r\n"
        );
        let request = self
            .http
            .post(self.url("/files/upload"))
            .header(
                "content-type",
                format!("multipart/form-data; boundary={boundary}"),
            )
            .body(body);
        send(request, headers).await
    }

    fn written(&self, name: &str) -> bool {
        Path::new(&self.path(name)).exists()
    }

    /// `GET /ping` with `headers`.
    async fn ping(&self, headers: &[(&str, &str)]) -> (u16, Value) {
        let request = self.http.get(self.url("/ping"));
        send(request, headers).await
    }
}

/// Sends `request` with `headers` on top; the status and the body (JSON when it is, else a
/// JSON string).
async fn send(mut request: reqwest::RequestBuilder, headers: &[(&str, &str)]) -> (u16, Value) {
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = tokio::time::timeout(WAIT, request.send())
        .await
        .expect("answered within the wait")
        .expect("answered");
    let status = response.status().as_u16();
    let text = response.text().await.expect("a body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Asserts a 403 in Warren's `{"code","message"}` shape with `code` (`HOST_NOT_ALLOWED` or
/// `ORIGIN_NOT_ALLOWED`), whose message names the flag that would admit the request.
fn assert_refused(answer: &(u16, Value), code: &str, what: &str) {
    let flag = if code == "HOST_NOT_ALLOWED" {
        "--allowed-host"
    } else {
        "--allowed-origin"
    };
    assert_forbidden(answer, json!(code), flag, what);
    let body = &answer.1;
    assert_eq!(body.as_object().map(|o| o.len()), Some(2), "{what}: {body}");
}

/// Asserts a 403 with `code` (a string, or envd's HTTP error's number) whose message names the
/// flag that would admit the request.
fn assert_forbidden(answer: &(u16, Value), code: Value, flag: &str, what: &str) {
    let (status, body) = answer;
    assert_eq!(*status, 403, "{what}: {body}");
    assert_eq!(body["code"], code, "{what}: {body}");
    assert!(
        body["message"].as_str().is_some_and(|m| m.contains(flag)),
        "{what}: the message names {flag}: {body}"
    );
}

/// Writes `request` on a raw connection and reads the answer until the server closes it.
async fn raw_request(stream: &mut (impl AsyncRead + AsyncWrite + Unpin), request: &[u8]) -> String {
    stream.write_all(request).await.expect("writes");
    let mut answer = Vec::new();
    tokio::time::timeout(WAIT, stream.read_to_end(&mut answer))
        .await
        .expect("answered and closed within the wait")
        .expect("reads");
    String::from_utf8_lossy(&answer).into_owned()
}

/// Extra request headers, `(name, value)`.
type Headers<'a> = &'a [(&'a str, &'a str)];

fn tcp(listen: &str) -> ListenAddr {
    listen.parse().expect("a listen address")
}

/// A PTY WebSocket handshake to `/pty/{id}/ws` with `headers`: the status, and the body of a
/// refusal.
async fn pty_handshake(server: &Server, id: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
    let mut request = format!("ws://{}/pty/{id}/ws", server.addr)
        .into_client_request()
        .expect("a WebSocket request");
    for (name, value) in headers {
        request.headers_mut().insert(
            axum::http::HeaderName::from_bytes(name.as_bytes()).expect("header name"),
            value.parse().expect("header value"),
        );
    }
    let connected = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
        .await
        .expect("the handshake is answered within the wait");
    match connected {
        Ok((_socket, response)) => (response.status().as_u16(), Value::Null),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            let body = response.body().clone().unwrap_or_default();
            (
                response.status().as_u16(),
                serde_json::from_slice(&body).unwrap_or(Value::Null),
            )
        }
        Err(error) => panic!("the handshake failed: {error}"),
    }
}

/// A new PTY session's id (a request without `Origin`, with the loopback `Host` reqwest sends).
async fn pty_session(server: &Server) -> String {
    let (status, body) = send(server.http.post(server.url("/pty")).json(&json!({})), &[]).await;
    assert_eq!(status, 201, "POST /pty: {body}");
    body["session_id"]
        .as_str()
        .expect("a session id")
        .to_owned()
}

#[tokio::test]
async fn a_rebound_host_is_refused_on_upload_exec_and_the_pty_websocket() {
    let server = Server::start(Config::default()).await;
    let evil = [("host", "evil.example:44772")];
    let upload = server.upload("rebound.txt", &evil).await;
    assert_refused(&upload, "HOST_NOT_ALLOWED", "upload");
    assert!(
        !server.written("rebound.txt"),
        "the refused upload wrote nothing"
    );
    let exec = send(
        server
            .http
            .post(server.url("/v1/exec"))
            .json(&json!({"cmd": "id"})),
        &[("host", "evil.example")],
    )
    .await;
    assert_refused(&exec, "HOST_NOT_ALLOWED", "/v1/exec");
    let id = pty_session(&server).await;
    let ws = pty_handshake(&server, &id, &[("host", "evil.example")]).await;
    assert_refused(&ws, "HOST_NOT_ALLOWED", "the PTY WebSocket");
    // The same upload with the Host reqwest sends (127.0.0.1:PORT) is served.
    assert_eq!(server.upload("plain.txt", &[]).await.0, 200);
    assert!(server.written("plain.txt"));
}

#[tokio::test]
async fn another_sites_origin_cannot_upload_and_the_servers_own_origin_can() {
    let server = Server::start(Config::default()).await;
    let evil = server
        .upload("evil.txt", &[("origin", "https://evil.example")])
        .await;
    assert_refused(&evil, "ORIGIN_NOT_ALLOWED", "evil upload");
    assert!(
        !server.written("evil.txt"),
        "the refused upload wrote nothing"
    );
    // Same host, another port: another origin.
    let other_port = server
        .upload("port.txt", &[("origin", "http://127.0.0.1:1")])
        .await;
    assert_refused(&other_port, "ORIGIN_NOT_ALLOWED", "port");
    let own = format!("http://{}", server.addr);
    let same = server.upload("same.txt", &[("origin", own.as_str())]).await;
    assert_eq!(same.0, 200, "the server's own origin: {}", same.1);
    assert!(server.written("same.txt"));
}

#[tokio::test]
async fn a_websocket_from_another_origin_is_refused_and_one_from_the_servers_own_is_not() {
    let server = Server::start(Config::default()).await;
    let id = pty_session(&server).await;
    let evil = pty_handshake(&server, &id, &[("origin", "https://evil.example")]).await;
    assert_refused(&evil, "ORIGIN_NOT_ALLOWED", "evil WS");
    let own = format!("http://{}", server.addr);
    let same = pty_handshake(&server, &id, &[("origin", own.as_str())]).await;
    assert_eq!(same.0, 101, "the server's own origin upgrades: {}", same.1);
}

#[tokio::test]
async fn allowed_host_and_allowed_origin_admit_exactly_what_they_name() {
    let server = Server::start(Config {
        allowed_hosts: vec!["proxy.internal".parse().expect("host")],
        allowed_origins: vec!["https://console.example".parse().expect("origin")],
        ..Config::default()
    })
    .await;
    let cases: [(Headers, Option<&str>); 9] = [
        (&[("host", "proxy.internal")], None),
        (&[("host", "PROXY.internal:8443")], None),
        (&[("host", "sub.proxy.internal")], Some("HOST_NOT_ALLOWED")),
        (
            &[("host", "proxy.internal.evil.example")],
            Some("HOST_NOT_ALLOWED"),
        ),
        (&[("origin", "https://console.example")], None),
        (&[("origin", "https://console.example:443")], None),
        (
            &[("origin", "http://console.example")],
            Some("ORIGIN_NOT_ALLOWED"),
        ),
        (
            &[("origin", "https://console.example:8443")],
            Some("ORIGIN_NOT_ALLOWED"),
        ),
        // A page on the allowed host is that host's own origin.
        (
            &[
                ("host", "proxy.internal"),
                ("origin", "http://proxy.internal"),
            ],
            None,
        ),
    ];
    for (headers, refused) in cases {
        let answer = server.ping(headers).await;
        match refused {
            None => assert_eq!(answer.0, 200, "{headers:?}: {}", answer.1),
            Some(code) => assert_refused(&answer, code, &format!("{headers:?}")),
        }
    }
}

#[tokio::test]
async fn the_access_token_passes_the_guard_and_its_absence_does_not() {
    let server = Server::start(Config {
        access_token: Some("s3cret".into()),
        ..Config::default()
    })
    .await;
    let foreign = [("host", "hands"), ("origin", "https://console.example")];
    let refused = server.ping(&foreign).await;
    assert_refused(&refused, "HOST_NOT_ALLOWED", "no token");
    // The gateway's tunnel sends `Host: hands` and the browser's Origin, with the token.
    let with_token = [foreign[0], foreign[1], ("x-execd-access-token", "s3cret")];
    assert_eq!(server.ping(&with_token).await.0, 200);
    let wrong = [foreign[0], foreign[1], ("x-execd-access-token", "guess")];
    assert_refused(
        &server.ping(&wrong).await,
        "HOST_NOT_ALLOWED",
        "a wrong token",
    );
}

#[tokio::test]
async fn a_request_without_host_is_served() {
    let server = Server::start(Config::default()).await;
    let mut stream = tokio::net::TcpStream::connect(&server.addr)
        .await
        .expect("connects");
    let answer = raw_request(&mut stream, b"GET /ping HTTP/1.0\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
}

#[tokio::test]
async fn off_loopback_without_a_token_answers_ip_addresses_and_loopback_names_only() {
    let server = Server::start(Config {
        listen: tcp("0.0.0.0:0"),
        no_auth: true,
        ..Config::default()
    })
    .await;
    assert_eq!(server.ping(&[("host", "10.1.2.3:44772")]).await.0, 200);
    assert_eq!(server.ping(&[("host", "localhost")]).await.0, 200);
    let named = server.ping(&[("host", "sandbox.lan:44772")]).await;
    assert_refused(&named, "HOST_NOT_ALLOWED", "a name");
    let evil = server
        .upload("evil.txt", &[("origin", "https://evil.example")])
        .await;
    assert_refused(&evil, "ORIGIN_NOT_ALLOWED", "an origin");
    assert!(!server.written("evil.txt"));
}

#[tokio::test]
async fn off_loopback_with_a_token_checks_the_origin_but_not_the_host() {
    let server = Server::start(Config {
        listen: tcp("0.0.0.0:0"),
        access_token: Some("s3cret".into()),
        ..Config::default()
    })
    .await;
    // Any Host: the token is what a rebound page lacks, so the answer is the token's 401.
    let named = server.ping(&[("host", "sandbox.lan:44772")]).await;
    assert_eq!(named.0, 200, "/ping needs no token: {}", named.1);
    let upload = server.upload("anon.txt", &[("host", "evil.example")]).await;
    assert_eq!(upload.0, 401, "{}", upload.1);
    // A page's own origin (DNS rebinding) is still not the server's.
    let rebound = server
        .ping(&[
            ("host", "evil.example:44772"),
            ("origin", "http://evil.example:44772"),
        ])
        .await;
    assert_refused(&rebound, "ORIGIN_NOT_ALLOWED", "rebound");
}

#[tokio::test]
async fn a_unix_socket_has_no_guard() {
    let sockets = tempfile::tempdir().expect("socket dir");
    let path = sockets.path().join("execd.sock");
    let root = tempfile::tempdir().expect("temp root");
    let config = Config {
        listen: ListenAddr::Unix(path.clone()),
        root: root.path().to_path_buf(),
        ..Config::default()
    };
    let (listener, _) = warren_execd::bind(&config.listen).await.expect("binds");
    tokio::spawn(warren_execd::serve(
        Execd::new(config),
        listener,
        std::future::pending(),
    ));
    let mut stream = tokio::net::UnixStream::connect(&path)
        .await
        .expect("connects");
    let request = b"GET /ping HTTP/1.1\r\nHost: evil.example\r\nOrigin: https://evil.example\r\n\
                    Connection: close\r\n\r\n";
    let answer = raw_request(&mut stream, request).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

// --- envd's listener (`--e2b-listen`, `warren envd`) --------------------------------------

/// envd's listener alone, as `warren envd` serves it, on `listen` (port 0).
async fn start_envd(config: Config, listen: &str) -> Server {
    let root = tempfile::tempdir().expect("temp root");
    let listener = tokio::net::TcpListener::bind(listen).await.expect("binds");
    let port = listener.local_addr().expect("local addr").port();
    let config = Config {
        root: std::fs::canonicalize(root.path()).expect("canonical root"),
        e2b_listen: Some(listener.local_addr().expect("local addr")),
        ..config
    };
    tokio::spawn(warren_execd::serve_listeners(
        Execd::new(config),
        None,
        Some(listener.into()),
        std::future::pending(),
    ));
    Server {
        addr: format!("127.0.0.1:{port}"),
        http: reqwest::Client::new(),
        root,
    }
}

/// A unary `filesystem.Filesystem/Stat` of the root with `headers`.
async fn envd_stat(server: &Server, headers: &[(&str, &str)]) -> (u16, Value) {
    let request = server
        .http
        .post(server.url("/filesystem.Filesystem/Stat"))
        .header("content-type", "application/json")
        .body(json!({"path": server.path("")}).to_string());
    send(request, headers).await
}

/// A `POST /files?path=` multipart upload to envd with `headers`.
async fn envd_upload(server: &Server, name: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let boundary = "envdBoundary";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\
         Content-Type: application/octet-stream\r\n\r\nuploaded\r\n--{boundary}--\r\n"
    );
    let request = server
        .http
        .post(server.url("/files"))
        .query(&[("path", server.path(name))])
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body);
    send(request, headers).await
}

#[tokio::test]
async fn envd_refuses_a_rebound_host_and_another_sites_origin_in_its_own_error_shapes() {
    let server = start_envd(Config::default(), "127.0.0.1:0").await;
    assert_eq!(envd_stat(&server, &[]).await.0, 200, "the SDKs' request");
    let rebound = envd_stat(&server, &[("host", "evil.example:49983")]).await;
    let connect_error = json!("permission_denied");
    assert_forbidden(&rebound, connect_error, "--allowed-host", "Connect's error");
    let evil = envd_upload(&server, "evil.txt", &[("origin", "https://evil.example")]).await;
    assert_forbidden(&evil, json!(403), "--allowed-origin", "envd's HTTP error");
    assert!(
        !server.written("evil.txt"),
        "the refused upload wrote nothing"
    );
    let own = format!("http://{}", server.addr);
    let (status, body) = envd_upload(&server, "own.txt", &[("origin", own.as_str())]).await;
    assert_eq!(status, 200, "the server's own origin: {body}");
    assert!(server.written("own.txt"));
    let localhost = format!(
        "localhost:{}",
        server.addr.rsplit_once(':').expect("port").1
    );
    assert_eq!(
        envd_stat(&server, &[("host", localhost.as_str())]).await.0,
        200,
        "the SDKs' debug mode at localhost"
    );
}

#[tokio::test]
async fn envd_takes_the_same_flags() {
    let server = start_envd(
        Config {
            allowed_hosts: vec![".cluster.local".parse().expect("host")],
            allowed_origins: vec!["https://console.example".parse().expect("origin")],
            ..Config::default()
        },
        "127.0.0.1:0",
    )
    .await;
    let cases: [(Headers, u16); 5] = [
        (&[("host", "envd.cluster.local:49983")], 200),
        (&[("host", "cluster.local")], 200),
        (&[("host", "cluster.local.evil.example")], 403),
        (&[("origin", "https://console.example")], 200),
        (&[("origin", "https://evil.example")], 403),
    ];
    for (headers, expected) in cases {
        let (status, body) = envd_stat(&server, headers).await;
        assert_eq!(status, expected, "{headers:?}: {body}");
    }
}

#[tokio::test]
async fn envd_passes_a_request_with_its_token() {
    let server = start_envd(
        Config {
            access_token: Some("s3cret".into()),
            ..Config::default()
        },
        "127.0.0.1:0",
    )
    .await;
    let evil = ("origin", "https://evil.example");
    let (status, body) = envd_stat(&server, &[evil]).await;
    assert_eq!(status, 403, "without the token: {body}");
    let (status, body) = envd_stat(&server, &[evil, ("x-access-token", "s3cret")]).await;
    assert_eq!(status, 200, "with the token: {body}");
}
