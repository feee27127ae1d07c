//! The person's files through the gateway (files-terminals-previews.md "Files"), on real bwrap
//! hands with the built-in shell agent doing what an agent does: browse before any hands exist,
//! upload, mkdir, list with depth, download with ranges, move without silent overwrite, delete;
//! links to `/etc` and FIFOs the agent made, a file swapped for a link mid-download; an archived
//! session answered from its snapshot without waking the hands; uploads over the limit or cut
//! off leave nothing; 64 MiB each way with flat memory; `files_changed` after the agent's
//! `echo x > f`; and every bad input's status and code.

use std::time::Duration;

use futures_util::StreamExt;
use reqwest::Method;
use serde_json::{Value, json};

use super::helpers::{Conversation, TestGateway, WAIT, in_bwrap};

/// Bwrap hands that pause and are archived half a second after their last use.
async fn archived_soon() -> TestGateway {
    in_bwrap(|args| {
        args.hands_idle_pause = Duration::from_millis(500);
        args.hands_archive_after = Duration::from_millis(500);
    })
    .await
}

/// A conversation for `device` after `command` ran in its hands, and its files route.
async fn chat_after<'a>(
    gw: &'a TestGateway,
    device: &str,
    command: &str,
) -> (Conversation<'a>, String) {
    let chat = gw.conversation_after(device, command).await;
    let base = files(&chat.session);
    (chat, base)
}

/// Reads `chat`'s events until its hands are archived; their live workspace is gone then.
async fn until_archived(chat: &mut Conversation<'_>) {
    chat.until("the hands archived", |e| {
        e.event == "hands" && e.data["state"] == "archived"
    })
    .await;
    assert!(!chat.workspace().exists(), "the live workspace is gone");
}

/// Asserts browsing left `chat`'s hands archived, then that uploading `path` restores them
/// first and lands (201).
async fn upload_restores_the_hands(
    gw: &TestGateway,
    chat: &Conversation<'_>,
    path: &str,
    body: &'static [u8],
) {
    assert_eq!(
        chat.info().await["hands"],
        "archived",
        "browsing woke nothing"
    );
    let uploaded = upload(gw, &chat.token, &chat.session, path, body).await;
    assert_eq!(uploaded.status(), 201);
    assert_eq!(chat.info().await["hands"], "running");
}

/// `path` percent-encoded for a query value.
fn q(path: &str) -> String {
    let mut out = String::new();
    for byte in path.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                out.push(byte as char)
            }
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

async fn error_of(response: reqwest::Response) -> (u16, String) {
    let status = response.status().as_u16();
    let body: Value = response.json().await.expect("a JSON error body");
    assert!(body["message"].is_string(), "{body}");
    (status, body["code"].as_str().unwrap_or_default().to_owned())
}

fn files(session: &str) -> String {
    format!("/sessions/{session}/files")
}

async fn upload(
    gw: &TestGateway,
    token: &str,
    session: &str,
    path: &str,
    body: &'static [u8],
) -> reqwest::Response {
    gw.request(
        Method::PUT,
        token,
        &format!("{}/content?path={}", files(session), q(path)),
    )
    .body(body)
    .send()
    .await
    .expect("answers")
}

/// Sends `request_line` with the token over a raw connection (for requests no client library
/// would send); returns the status and the body.
async fn raw_request(gw: &TestGateway, request_line: &str, token: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = gw.url.trim_start_matches("http://").to_owned();
    let mut socket = tokio::net::TcpStream::connect(&address)
        .await
        .expect("connects");
    let request = format!(
        "{request_line} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    socket.write_all(request.as_bytes()).await.expect("sent");
    let mut answer = Vec::new();
    tokio::time::timeout(WAIT, socket.read_to_end(&mut answer))
        .await
        .expect("answered")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|status| status.parse().ok())
        .unwrap_or_else(|| panic!("a status line in {:?}", &answer[..answer.len().min(200)]));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// `GET target` with a `Range` header.
async fn ranged(gw: &TestGateway, token: &str, target: &str, range: &str) -> reqwest::Response {
    gw.request(Method::GET, token, target)
        .header("range", range)
        .send()
        .await
        .expect("answers")
}

/// `PUT target` with `chunks` as a body of no declared length.
async fn upload_stream(
    gw: &TestGateway,
    token: &str,
    target: &str,
    chunks: impl Iterator<Item = Vec<u8>> + Send + Sync + 'static,
) -> reqwest::Response {
    let body = futures_util::stream::iter(chunks.map(Ok::<_, std::io::Error>));
    gw.request(Method::PUT, token, target)
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await
        .expect("answers")
}

/// The entry called `name` in a listing.
fn entry<'a>(listed: &'a Value, name: &str) -> &'a Value {
    listed["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("{name} is listed: {listed}"))
}

fn paths_of(listed: &Value) -> Vec<String> {
    listed["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|entry| entry["path"].as_str().expect("path").to_owned())
        .collect()
}

#[tokio::test]
async fn the_persons_files_are_browsed_uploaded_moved_and_deleted_in_the_hands() {
    let gw = in_bwrap(|_| {}).await;
    let token = gw.register("phone-files-01").await;
    let session = gw.create_session(&token).await;
    let base = files(&session);

    // Browsing before the hands exist starts nothing: an empty root, missing files.
    let listed = gw.get_json(&token, &base).await;
    assert_eq!(
        listed,
        json!({"path": "", "entries": [], "truncated": false})
    );
    let missing = gw
        .get(&token, &format!("{base}/content?path=nope.txt"))
        .await;
    assert_eq!(error_of(missing).await, (404, "FILE_NOT_FOUND".into()));
    assert_eq!(gw.session_info(&token, &session).await["hands"], "none");

    // Upload: 201 new, 200 replaced; parents made.
    let created = upload(&gw, &token, &session, "/notes/hello.txt", b"hello, phone").await;
    assert_eq!(created.status(), 201);
    assert_eq!(
        created.json::<Value>().await.expect("json"),
        json!({"path": "notes/hello.txt", "size": 12})
    );
    let replaced = upload(&gw, &token, &session, "notes/hello.txt", b"hello, world").await;
    assert_eq!(replaced.status(), 200);
    let made = gw
        .send(Method::POST, &token, &format!("{base}/dir?path=a/b/c"))
        .await;
    assert_eq!(made.status(), 201);
    let unicode = upload(&gw, &token, &session, "notes/résumé v2.txt", b"cv").await;
    assert_eq!(unicode.status(), 201);

    // Lists: one level, then three in one flat list, sorted by path.
    let top = gw.get_json(&token, &base).await;
    assert_eq!(paths_of(&top), ["a", "notes"]);
    assert_eq!(top["entries"][0]["type"], "dir");
    let deep = gw.get_json(&token, &format!("{base}?path=/&depth=3")).await;
    assert_eq!(
        paths_of(&deep),
        [
            "a",
            "a/b",
            "a/b/c",
            "notes",
            "notes/hello.txt",
            "notes/résumé v2.txt"
        ]
    );
    let hello = &deep["entries"][4];
    assert_eq!(hello["name"], "hello.txt");
    assert_eq!(hello["type"], "file");
    assert_eq!(hello["size"], 12);
    assert!(
        hello["mode"].is_u64() && hello["modified_at"].is_string(),
        "{hello}"
    );
    let inner = gw.get_json(&token, &format!("{base}?path=notes")).await;
    assert_eq!(inner["path"], "notes");
    assert_eq!(paths_of(&inner), ["notes/hello.txt", "notes/résumé v2.txt"]);

    // Download: whole, a range, and ranges that are not served as ranges.
    let content = format!("{base}/content?path=notes/hello.txt");
    let whole = gw.get(&token, &content).await;
    assert_eq!(whole.status(), 200);
    let headers = whole.headers().clone();
    assert_eq!(headers["content-type"], "application/octet-stream");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(headers["accept-ranges"], "bytes");
    assert_eq!(
        headers["content-disposition"],
        "attachment; filename=\"hello.txt\"; filename*=UTF-8''hello.txt"
    );
    assert_eq!(whole.bytes().await.expect("body").as_ref(), b"hello, world");
    let named = gw
        .get(
            &token,
            &format!("{base}/content?path={}", q("notes/résumé v2.txt")),
        )
        .await;
    assert_eq!(
        named.headers()["content-disposition"],
        "attachment; filename=\"r_sum_ v2.txt\"; filename*=UTF-8''r%C3%A9sum%C3%A9%20v2.txt"
    );
    let part = ranged(&gw, &token, &content, "bytes=7-11").await;
    assert_eq!(part.status(), 206);
    assert_eq!(part.headers()["content-range"], "bytes 7-11/12");
    assert_eq!(part.bytes().await.expect("body").as_ref(), b"world");
    for ignored in ["bytes=5-1", "bytes=0-1,4-5"] {
        let full = ranged(&gw, &token, &content, ignored).await;
        assert_eq!(full.status(), 200, "{ignored}");
        assert_eq!(full.bytes().await.expect("body").len(), 12, "{ignored}");
    }
    let beyond = ranged(&gw, &token, &content, "bytes=999999999-").await;
    assert_eq!(beyond.headers()["content-range"], "bytes */12");
    assert_eq!(
        error_of(beyond).await,
        (416, "RANGE_NOT_SATISFIABLE".into())
    );

    // Move: never over an existing file unless asked.
    let moving = |body: Value| {
        gw.request(Method::POST, &token, &format!("{base}/move"))
            .json(&body)
            .send()
    };
    let moved = moving(json!({"from": "notes/hello.txt", "to": "a/hello.txt"}))
        .await
        .expect("answers");
    assert_eq!(moved.status(), 200);
    assert_eq!(
        upload(&gw, &token, &session, "a/other.txt", b"other")
            .await
            .status(),
        201
    );
    let clash = moving(json!({"from": "a/other.txt", "to": "a/hello.txt"}))
        .await
        .expect("answers");
    assert_eq!(error_of(clash).await, (409, "FILE_EXISTS".into()));
    let forced = moving(json!({"from": "a/other.txt", "to": "a/hello.txt", "overwrite": true}))
        .await
        .expect("answers");
    assert_eq!(forced.status(), 200);
    let after = gw
        .get(&token, &format!("{base}/content?path=a/hello.txt"))
        .await;
    assert_eq!(after.bytes().await.expect("body").as_ref(), b"other");
    for root in [
        json!({"from": "", "to": "x"}),
        json!({"from": "a", "to": "/"}),
        json!({"from": "/.", "to": "y"}),
    ] {
        let refused = moving(root.clone()).await.expect("answers");
        assert_eq!(
            error_of(refused).await,
            (400, "INVALID_PATH".into()),
            "{root}"
        );
    }
    let escape = moving(json!({"from": "a", "to": "../a"}))
        .await
        .expect("answers");
    assert_eq!(error_of(escape).await, (403, "PATH_ESCAPE".into()));

    // Delete: a non-empty directory only when asked; never the root.
    let not_empty = gw.delete(&token, &format!("{base}?path=a")).await;
    assert_eq!(error_of(not_empty).await, (409, "DIR_NOT_EMPTY".into()));
    let root = gw
        .delete(&token, &format!("{base}?path=/&recursive=true"))
        .await;
    assert_eq!(error_of(root).await, (400, "INVALID_PATH".into()));
    let gone = gw
        .delete(&token, &format!("{base}?path=a&recursive=true"))
        .await;
    assert_eq!(gone.status(), 204);
    let again = gw.delete(&token, &format!("{base}?path=a")).await;
    assert_eq!(error_of(again).await, (404, "FILE_NOT_FOUND".into()));
    assert_eq!(paths_of(&gw.get_json(&token, &base).await), ["notes"]);

    // Bad input, each with its status and code.
    // A 100 KB path: in a query, longer than any URI the server takes (414 from the HTTP
    // layer, before any route); in a body, and a 5 KB one in a query, 400 INVALID_PATH.
    let long = "x/".repeat(50 * 1024);
    let (status, _) = raw_request(&gw, &format!("GET /v1{base}/content?path={long}"), &token).await;
    assert_eq!(status, 414, "a 100 KB path in the query");
    let answer = gw
        .request(Method::POST, &token, &format!("{base}/move"))
        .json(&json!({"from": long, "to": "x"}))
        .send()
        .await
        .expect("answers");
    assert_eq!(
        error_of(answer).await,
        (400, "INVALID_PATH".into()),
        "a 100 KB path in a body"
    );
    let answer = gw
        .get(
            &token,
            &format!("{base}/content?path={}", "y/".repeat(2500)),
        )
        .await;
    assert_eq!(
        error_of(answer).await,
        (400, "INVALID_PATH".into()),
        "a 5 KB path"
    );
    for (path, status, code) in [
        ("..", 403, "PATH_ESCAPE"),
        ("%2e%2e", 403, "PATH_ESCAPE"),
        ("%2e%2e%2f%2e%2e%2fetc%2fpasswd", 403, "PATH_ESCAPE"),
        ("notes/../../etc/passwd", 403, "PATH_ESCAPE"),
        // Absolute: the workspace's, never the host's.
        ("/etc/passwd", 404, "FILE_NOT_FOUND"),
        ("a%00b", 400, "INVALID_PATH"),
        ("%ff%fe", 400, "INVALID_PATH"),
        ("", 400, "INVALID_PATH"),
        ("notes", 403, "NOT_REGULAR_FILE"),
    ] {
        let answer = gw.get(&token, &format!("{base}/content?path={path}")).await;
        assert_eq!(
            error_of(answer).await,
            (status, code.into()),
            "download {path}"
        );
    }
    for query in ["depth=0", "depth=6", "depth=two"] {
        let answer = gw.get(&token, &format!("{base}?{query}")).await;
        assert_eq!(
            error_of(answer).await,
            (400, "INVALID_QUERY".into()),
            "{query}"
        );
    }
    let answer = gw
        .delete(&token, &format!("{base}?path=notes&recursive=perhaps"))
        .await;
    assert_eq!(error_of(answer).await, (400, "INVALID_QUERY".into()));
    let answer = gw
        .get(&token, &format!("{base}?path={}", q("notes/résumé v2.txt")))
        .await;
    assert_eq!(
        error_of(answer).await,
        (409, "NOT_A_DIRECTORY".into()),
        "listing a file"
    );

    // Another device's token on every route: the session does not exist for it.
    let other = gw.register("phone-files-02").await;
    for (method, path) in [
        (Method::GET, base.clone()),
        (Method::DELETE, format!("{base}?path=notes")),
        (
            Method::GET,
            format!("{base}/content?path=notes/résumé v2.txt"),
        ),
        (Method::PUT, format!("{base}/content?path=x.txt")),
        (Method::POST, format!("{base}/dir?path=x")),
        (Method::POST, format!("{base}/move")),
    ] {
        let answer = gw
            .request(method.clone(), &other, &path)
            .json(&json!({"from": "notes", "to": "x"}))
            .send()
            .await
            .expect("answers");
        assert_eq!(
            error_of(answer).await,
            (404, "SESSION_NOT_FOUND".into()),
            "{method} {path}"
        );
    }
    gw.stop().await;
}

#[tokio::test]
async fn links_and_fifos_the_agent_made_are_refused_at_once_and_changes_are_announced() {
    let gw = in_bwrap(|_| {}).await;
    let (mut chat, base) = chat_after(
        &gw,
        "phone-files-03",
        "ln -s /etc etc-link && ln -s /etc/passwd passwd-link && mkfifo pipe && mkdir -p src && ln -s src code && echo inside > src/in.txt",
    )
    .await;

    for (path, status, code) in [
        ("etc-link/passwd", 403, "PATH_ESCAPE"),
        ("passwd-link", 403, "PATH_ESCAPE"),
        ("pipe", 403, "NOT_REGULAR_FILE"),
    ] {
        let answer = tokio::time::timeout(
            Duration::from_secs(10),
            gw.get(&chat.token, &format!("{base}/content?path={path}")),
        )
        .await
        .unwrap_or_else(|_| panic!("{path} is answered at once"));
        assert_eq!(error_of(answer).await, (status, code.into()), "{path}");
    }
    let through = gw.get(&chat.token, &format!("{base}?path=etc-link")).await;
    assert_eq!(error_of(through).await, (403, "PATH_ESCAPE".into()));
    // A link inside the workspace is followed; the listing shows links as links.
    let inside = gw
        .get(&chat.token, &format!("{base}/content?path=code/in.txt"))
        .await;
    assert_eq!(inside.text().await.expect("body"), "inside\n");
    let top = gw.get_json(&chat.token, &base).await;
    let link = entry(&top, "etc-link");
    assert_eq!(link["type"], "symlink");
    assert_eq!(link["target"], "/etc");
    assert_eq!(entry(&top, "pipe")["type"], "other");

    // The agent's own write is announced.
    chat.turn_ok("echo x > f").await;
    let changed = chat
        .until("files_changed naming f", |e| {
            e.event == "files_changed"
                && e.data["paths"]
                    .as_array()
                    .is_some_and(|paths| paths.iter().any(|p| p == "f"))
        })
        .await;
    let event = changed.last().expect("the event");
    assert_eq!(event.data["truncated"], false);

    // Many changes at once: one event of at most 100 paths, marked truncated.
    chat.turn_ok("mkdir many && for i in $(seq 1 250); do echo $i > many/$i; done")
        .await;
    let changed = chat
        .until("a truncated files_changed", |e| {
            e.event == "files_changed" && e.data["truncated"] == true
        })
        .await;
    let event = changed.last().expect("the event");
    assert!(event.data["paths"].as_array().expect("paths").len() <= 100);
    gw.stop().await;
}

#[tokio::test]
async fn a_file_swapped_for_a_link_mid_download_never_yields_the_links_target() {
    let gw = in_bwrap(|_| {}).await;
    let (mut chat, base) = chat_after(
        &gw,
        "phone-files-04",
        "head -c 33554432 /dev/zero | tr '\\0' 'a' > big",
    )
    .await;
    let response = gw
        .get(&chat.token, &format!("{base}/content?path=big"))
        .await;
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let first = body.next().await.expect("a first chunk").expect("bytes");
    // The file is replaced by a link to the host's passwd while the download runs.
    chat.turn_ok("mv big big.old && ln -s /etc/passwd big")
        .await;
    let mut n_bytes = first.len();
    let mut only_a = first.iter().all(|b| *b == b'a');
    while let Some(chunk) = tokio::time::timeout(WAIT, body.next())
        .await
        .expect("streams")
    {
        let Ok(chunk) = chunk else { break };
        n_bytes += chunk.len();
        only_a &= chunk.iter().all(|b| *b == b'a');
    }
    assert!(only_a, "only the file's own bytes are sent");
    assert!(n_bytes <= 32 << 20, "{n_bytes}");
    let now = gw
        .get(&chat.token, &format!("{base}/content?path=big"))
        .await;
    assert_eq!(error_of(now).await, (403, "PATH_ESCAPE".into()));
    gw.stop().await;
}

#[tokio::test]
async fn an_archived_session_is_browsed_from_its_snapshot_without_waking_the_hands() {
    let gw = archived_soon().await;
    let (mut chat, base) = chat_after(
        &gw,
        "phone-files-05",
        "mkdir -p src/deep && printf 'fn main() {}\\n' > src/main.rs && echo deep > src/deep/x.txt && ln -s src code && ln -s /etc etc-link",
    )
    .await;
    until_archived(&mut chat).await;

    let deep = gw.get_json(&chat.token, &format!("{base}?depth=3")).await;
    // A snapshot keeps no link that leads out of the workspace (it could never be restored).
    assert_eq!(
        paths_of(&deep),
        ["code", "src", "src/deep", "src/deep/x.txt", "src/main.rs"]
    );
    let main = deep["entries"][4].clone();
    assert_eq!(
        (main["type"].clone(), main["size"].clone()),
        (json!("file"), json!(13))
    );
    let content = format!("{base}/content?path=code/main.rs");
    let part = ranged(&gw, &chat.token, &content, "bytes=3-6").await;
    assert_eq!(part.status(), 206);
    assert_eq!(part.headers()["content-range"], "bytes 3-6/13");
    assert_eq!(part.headers()["content-length"], "4");
    assert_eq!(part.bytes().await.expect("body").as_ref(), b"main");
    let whole = gw.get(&chat.token, &content).await;
    assert_eq!(
        whole.headers()["content-disposition"],
        "attachment; filename=\"main.rs\"; filename*=UTF-8''main.rs"
    );
    assert_eq!(whole.text().await.expect("body"), "fn main() {}\n");
    let beyond = ranged(&gw, &chat.token, &content, "bytes=999999999-").await;
    assert_eq!(beyond.headers()["content-range"], "bytes */13");
    assert_eq!(
        error_of(beyond).await,
        (416, "RANGE_NOT_SATISFIABLE".into())
    );
    for (path, status, code) in [
        ("etc-link/passwd", 404, "FILE_NOT_FOUND"),
        ("code/../../etc/passwd", 403, "PATH_ESCAPE"),
        ("src", 403, "NOT_REGULAR_FILE"),
        ("nope", 404, "FILE_NOT_FOUND"),
    ] {
        let answer = gw
            .get(&chat.token, &format!("{base}/content?path={path}"))
            .await;
        assert_eq!(error_of(answer).await, (status, code.into()), "{path}");
    }

    // A change restores the hands first, then lands beside the restored files.
    upload_restores_the_hands(&gw, &chat, "src/new.txt", b"new").await;
    let listed = gw.get_json(&chat.token, &format!("{base}?path=src")).await;
    assert_eq!(
        paths_of(&listed),
        ["src/deep", "src/main.rs", "src/new.txt"]
    );
    gw.stop().await;
}

/// Everything in the workspace on the host, hidden files too.
fn workspace_files(chat: &Conversation<'_>) -> Vec<String> {
    super::helpers::files_under(&chat.workspace())
        .into_iter()
        .map(|path| path.display().to_string())
        .collect()
}

#[tokio::test]
async fn uploads_over_the_limit_or_cut_off_leave_nothing_behind() {
    let gw = in_bwrap(|args| args.upload_max = 1 << 20).await;
    let (chat, base) = chat_after(&gw, "phone-files-06", "echo keep > kept.txt").await;
    let target = format!("{base}/content?path=big.bin");

    // Declared too large: refused before a byte is read.
    let declared = gw
        .request(Method::PUT, &chat.token, &target)
        .body(vec![b'x'; (1 << 20) + 1])
        .send()
        .await
        .expect("answers");
    assert_eq!(error_of(declared).await, (413, "FILE_TOO_LARGE".into()));
    // Streamed without a length: refused once past the limit.
    let chunks = (0..4).map(|_| vec![b'y'; 512 * 1024]);
    let streamed = upload_stream(&gw, &chat.token, &target, chunks).await;
    assert_eq!(error_of(streamed).await, (413, "FILE_TOO_LARGE".into()));
    // Cut off midway: the client says 100000 bytes, sends 1000 and goes away.
    let address = gw.url.trim_start_matches("http://").to_owned();
    let mut socket = tokio::net::TcpStream::connect(&address)
        .await
        .expect("connects");
    let head = format!(
        "PUT /v1{target} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {}\r\nContent-Length: 100000\r\n\r\n",
        chat.token
    );
    use tokio::io::AsyncWriteExt;
    socket.write_all(head.as_bytes()).await.expect("head sent");
    socket
        .write_all(&[b'z'; 1000])
        .await
        .expect("part of the body sent");
    socket.flush().await.expect("flushed");
    // The bytes sent arrive before the close: the gateway reads them, then the end.
    drop(socket);

    let expected = vec![chat.workspace().join("kept.txt").display().to_string()];
    let deadline = std::time::Instant::now() + WAIT;
    while workspace_files(&chat) != expected {
        assert!(
            std::time::Instant::now() < deadline,
            "left behind: {:?}",
            workspace_files(&chat)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(workspace_files(&chat), expected);
    gw.stop().await;
}

#[tokio::test]
async fn sixty_four_mebibytes_go_up_and_down_with_flat_gateway_memory() {
    if !warren_test_support::peak_memory::alone_in_a_new_process(
        "sixty_four_mebibytes_go_up_and_down_with_flat_gateway_memory",
    ) {
        return;
    }
    use warren_test_support::peak_memory::memory_kib;
    const N_CHUNKS: usize = 64;
    const CHUNK: usize = 1 << 20;
    let gw = in_bwrap(|_| {}).await;
    let (chat, base) = chat_after(&gw, "phone-files-07", "true").await;
    let target = format!("{base}/content?path=big/file.bin");
    let rss_before_kib = memory_kib("VmRSS");
    let chunks = (0..N_CHUNKS).map(|i| vec![b'a' + (i % 26) as u8; CHUNK]);
    let uploaded = upload_stream(&gw, &chat.token, &target, chunks).await;
    assert_eq!(uploaded.status(), 201);
    assert_eq!(
        uploaded.json::<Value>().await.expect("json")["size"],
        (N_CHUNKS * CHUNK) as u64
    );
    let response = gw.get(&chat.token, &target).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-length"],
        (N_CHUNKS * CHUNK).to_string().as_str()
    );
    let (n_bytes, last_byte) = warren_test_support::peak_memory::drain(response).await;
    assert_eq!(n_bytes, N_CHUNKS * CHUNK);
    assert_eq!(last_byte, b'a' + ((N_CHUNKS - 1) % 26) as u8);
    let peak_growth_kib = memory_kib("VmHWM").saturating_sub(rss_before_kib);
    assert!(
        peak_growth_kib < 24 * 1024,
        "64 MiB each way through the gateway, its peak memory grew by {peak_growth_kib} KiB"
    );
    gw.stop().await;
}

/// One table over both walkers: the running hands' (execd's, through the gateway) and the
/// archived snapshot's (the gateway's own). An absolute link spelled with the workspace's own
/// path (`/workspace/...`, as the sandbox sees it) is followed inside the workspace by both; an
/// absolute link anywhere else, or one that climbs out from `/workspace`, is refused live and
/// absent from the snapshot (which never keeps a link it could not restore).
#[tokio::test]
async fn an_absolute_link_inside_the_workspace_is_followed_live_and_archived_alike() {
    let gw = archived_soon().await;
    let (mut chat, base) = chat_after(
        &gw,
        "phone-files-abs",
        "echo a > a.txt && mkdir -p d && echo deep > d/x.txt && ln -s /workspace/a.txt link && ln -s /workspace/d dir-link && ln -s /workspace/../etc/passwd climb && ln -s /etc/hostname out && cat link dir-link/x.txt",
    )
    .await;
    // (path, live answer, archived answer): 200 with the body, or the error's status and code.
    type Answer = Result<&'static str, (u16, &'static str)>;
    let table: [(&str, Answer, Answer); 5] = [
        ("link", Ok("a\n"), Ok("a\n")),
        ("dir-link/x.txt", Ok("deep\n"), Ok("deep\n")),
        ("d/../link", Ok("a\n"), Ok("a\n")),
        (
            "climb",
            Err((403, "PATH_ESCAPE")),
            Err((404, "FILE_NOT_FOUND")),
        ),
        (
            "out",
            Err((403, "PATH_ESCAPE")),
            Err((404, "FILE_NOT_FOUND")),
        ),
    ];
    for archived in [false, true] {
        if archived {
            until_archived(&mut chat).await;
        }
        for (path, live, from_snapshot) in &table {
            let expected = if archived { from_snapshot } else { live };
            let answer = gw
                .get(&chat.token, &format!("{base}/content?path={}", q(path)))
                .await;
            match expected {
                Ok(body) => {
                    assert_eq!(answer.status(), 200, "{path} (archived: {archived})");
                    assert_eq!(answer.text().await.expect("body"), *body, "{path}");
                }
                Err((status, code)) => assert_eq!(
                    error_of(answer).await,
                    (*status, (*code).to_owned()),
                    "{path} (archived: {archived})"
                ),
            }
        }
        // A listing through the absolute directory link names the files beneath it.
        let listed = gw
            .get_json(&chat.token, &format!("{base}?path=dir-link"))
            .await;
        assert_eq!(
            paths_of(&listed),
            ["dir-link/x.txt"],
            "archived: {archived}"
        );
    }
    // The snapshot kept the links as the sandbox made them: restored, they still lead inside.
    upload_restores_the_hands(&gw, &chat, "b.txt", b"b").await;
    for path in ["link", "dir-link/x.txt"] {
        let answer = gw
            .get(&chat.token, &format!("{base}/content?path={}", q(path)))
            .await;
        assert_eq!(answer.status(), 200, "{path} after the restore");
    }
    let top = gw.get_json(&chat.token, &base).await;
    let link = entry(&top, "link");
    assert_eq!(
        (link["type"].clone(), link["target"].clone()),
        (json!("symlink"), json!("/workspace/a.txt"))
    );
    gw.stop().await;
}
