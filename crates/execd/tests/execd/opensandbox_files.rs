//! The OpenSandbox-compatible files API against a real router on 127.0.0.1:0: every route and
//! error, and the confinement to `--root` (symlinks to `/etc`, chains, `..`, URL-encoded `..`,
//! absolute link targets outside the root, FIFOs, devices, a file swapped for a symlink while
//! being read), and the links it follows (absolute links inside the root, every absolute link
//! with the root `/`), with a link loop answered rather than hung on. No route that changes
//! anything does so through a link out of the root, and large files stream both ways.

use crate::opensandbox_support;

use std::os::unix::fs::{PermissionsExt, symlink};

use std::path::Path;

use opensandbox_support::*;
use serde_json::{Value, json};
use warren_test_support::WAIT;
use warren_test_support::peak_memory::{alone_in_a_new_process, memory_kib};

/// One part of an upload body.
enum UploadPart<'a> {
    Metadata(Value),
    File(&'a [u8]),
}

/// A multipart body with `(metadata json, file bytes)` pairs, in the SDK's chunked layout.
fn multipart(pairs: &[(Value, &[u8])]) -> (String, Vec<u8>) {
    let parts: Vec<UploadPart> = pairs
        .iter()
        .flat_map(|(metadata, content)| {
            [
                UploadPart::Metadata(metadata.clone()),
                UploadPart::File(content),
            ]
        })
        .collect();
    multipart_parts(&parts)
}

/// A multipart body with the parts in exactly the given order.
fn multipart_parts(parts: &[UploadPart]) -> (String, Vec<u8>) {
    let boundary = "warrenTestBoundary1234";
    let mut body = Vec::new();
    for part in parts {
        body.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        match part {
            UploadPart::Metadata(metadata) => {
                body.extend_from_slice(
                    b"Content-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\n",
                );
                body.extend_from_slice(b"Content-Type: application/json\r\n\r\n");
                body.extend_from_slice(metadata.to_string().as_bytes());
            }
            UploadPart::File(content) => {
                body.extend_from_slice(
                    b"Content-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n",
                );
                body.extend_from_slice(b"Content-Type: application/octet-stream\r\n\r\n");
                body.extend_from_slice(content);
            }
        }
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// Uploads with chunked transfer encoding (the body is a stream of small chunks).
async fn upload(server: &Server, pairs: &[(Value, &[u8])]) -> reqwest::Response {
    let (content_type, body) = multipart(pairs);
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        body.chunks(7).map(|c| Ok(c.to_vec())).collect();
    let body = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
    send(upload_request(server, content_type).body(body)).await
}

fn upload_request(server: &Server, content_type: String) -> reqwest::RequestBuilder {
    server
        .client
        .post(server.url("/files/upload"))
        .header("content-type", content_type)
}

/// `GET /files/download?path=…`.
async fn download(server: &Server, path: &str) -> reqwest::Response {
    server.get(&at("/files/download", path)).await
}

/// `GET /files/info?path=…`, parsed.
async fn info(server: &Server, path: &str) -> Value {
    server.get_json(&at("/files/info", path)).await
}

/// A thread that keeps changing the tree (`swap(n)` for n = 0, 1, 2, …) until dropped.
struct Swapping {
    running: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn keep_swapping(mut swap: impl FnMut(u64) + Send + 'static) -> Swapping {
    let running = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let still_running = running.clone();
    let thread = std::thread::spawn(move || {
        let mut n = 0u64;
        while still_running.load(std::sync::atomic::Ordering::Relaxed) {
            swap(n);
            n += 1;
        }
    });
    Swapping {
        running,
        thread: Some(thread),
    }
}

impl Drop for Swapping {
    fn drop(&mut self) {
        self.running
            .store(false, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
            && !std::thread::panicking()
        {
            panic!("the swapping thread panicked");
        }
    }
}

/// Downloads `path` again and again while it is being swapped: every answer is the inside
/// content ("inside"), a refusal (403) or not found (404), never outside content. Goes on
/// until both the inside file and a refusal were seen, and at least 200 requests were made.
async fn assert_downloads_never_leak(server: &Server, path: &str, both_states: &str) {
    let (mut n_inside, mut n_refused, mut n_requests) = (0, 0, 0);
    let deadline = tokio::time::Instant::now() + WAIT;
    while n_requests < 200 || n_inside == 0 || n_refused == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting to see {both_states}"
        );
        let response = download(server, path).await;
        let status = response.status().as_u16();
        let text = response.text().await.expect("text");
        assert!(!text.contains("root:"), "outside content leaked: {text}");
        match status {
            200 => {
                assert_eq!(text, "inside");
                n_inside += 1;
            }
            403 => n_refused += 1,
            404 => {}
            other => panic!("unexpected status {other}: {text}"),
        }
        n_requests += 1;
    }
}

/// `route?path=<path>`, the path percent-encoded.
fn at(route: &str, path: &str) -> String {
    format!("{route}?path={}", q(path))
}

fn q(path: &str) -> String {
    // Percent-encode what a query value needs; keeps the test URLs readable otherwise.
    path.replace('%', "%25")
        .replace(' ', "%20")
        .replace('&', "%26")
        .replace('#', "%23")
}

/// `GET /directories/list` of `path` to `depth`.
fn list_url(path: &str, depth: u32) -> String {
    format!("/directories/list?path={}&depth={depth}", q(path))
}

/// Writes `content` to `rel` below the root, making its parent first; its path.
fn write_below(server: &Server, rel: &str, content: &str) -> String {
    let path = server.path(rel);
    let parent = Path::new(&path).parent().expect("a parent");
    std::fs::create_dir_all(parent).expect("mkdir");
    std::fs::write(&path, content).expect("write");
    path
}

/// Makes a FIFO at `path`.
fn mkfifo(path: &str) {
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
}

/// `POST {route}` (`/files/replace`, with a query or not) of `old` with `new` in `path`.
async fn replace(
    server: &Server,
    route: &str,
    path: &str,
    old: &str,
    new: &str,
) -> reqwest::Response {
    server
        .post_json(route, json!({path: {"old": old, "new": new}}))
        .await
}

/// The status of `DELETE {route}?path=...` of `path`.
async fn delete_status(server: &Server, route: &str, path: &str) -> reqwest::StatusCode {
    server.delete(&at(route, path)).await.status()
}

/// Asserts that `response` is a 200 whose body is `expected`.
async fn assert_ok_text(response: reqwest::Response, expected: &str) {
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.expect("text"), expected);
}

#[tokio::test]
async fn upload_creates_parents_and_download_and_info_see_the_file() {
    let server = Server::start().await;
    let a = server.path("deep/dir/a.txt");
    let b = server.path("b.bin");
    let response = upload(
        &server,
        &[
            (json!({"path": a, "mode": 600}), b"hello\nworld\n"),
            (json!({"path": b}), &[0u8, 1, 2, 255]),
        ],
    )
    .await;
    assert_ok_text(response, "").await;
    assert_eq!(std::fs::read(&b).expect("b exists"), [0u8, 1, 2, 255]);

    let response = download(&server, &a).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "application/octet-stream"
    );
    assert_eq!(
        response.headers()["content-disposition"],
        "attachment; filename=\"a.txt\""
    );
    assert_eq!(response.text().await.expect("text"), "hello\nworld\n");

    let info: Value = server
        .get(&format!("/files/info?path={}&path={}", q(&a), q(&b)))
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(info[&a]["path"], a.as_str());
    assert_eq!(info[&a]["type"], "file");
    assert_eq!(info[&a]["size"], 12);
    assert_eq!(info[&a]["mode"], 600);
    assert!(info[&a]["owner"].is_string() && info[&a]["group"].is_string());
    assert!(
        info[&a]["modified_at"]
            .as_str()
            .is_some_and(|t| t.contains('T'))
    );
    assert!(info[&a]["created_at"].is_string());
    assert_eq!(info[&b]["size"], 4);
    let leftovers: Vec<_> = std::fs::read_dir(server.path("deep/dir"))
        .expect("dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("warren"))
        .collect();
    assert!(leftovers.is_empty(), "no temporary files are left behind");
}

#[tokio::test]
async fn upload_pairs_metadata_and_file_parts_by_index_in_either_order() {
    use UploadPart::{File, Metadata};
    let server = Server::start().await;
    let path = |name: &str| server.path(&format!("order/{name}"));
    let parts = [
        File(b"first"),
        Metadata(json!({"path": path("a.txt"), "mode": 600})),
        Metadata(json!({"path": path("b.txt")})),
        File(b"second"),
        File(b"third"),
        File(b"fourth"),
        Metadata(json!({"path": path("c.txt")})),
        Metadata(json!({"path": path("d.txt")})),
    ];
    let (content_type, body) = multipart_parts(&parts);
    let response = send(upload_request(&server, content_type).body(body)).await;
    assert_eq!(response.status(), 200);
    for (name, content) in [
        ("a.txt", "first"),
        ("b.txt", "second"),
        ("c.txt", "third"),
        ("d.txt", "fourth"),
    ] {
        assert_eq!(std::fs::read_to_string(path(name)).expect("read"), content);
    }
    let mode = std::fs::metadata(path("a.txt"))
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o777,
        0o600,
        "a staged file still gets its metadata's mode"
    );

    // A file part whose metadata never comes: 400, and nothing is written for it.
    let (content_type, body) = multipart_parts(&[
        Metadata(json!({"path": path("e.txt")})),
        File(b"fifth"),
        File(b"orphan"),
    ]);
    let response = send(upload_request(&server, content_type).body(body)).await;
    let message = assert_error(response, 400, "INVALID_FILE_METADATA").await;
    assert!(message.contains("without a metadata part"), "{message}");
    let names: Vec<String> = std::fs::read_dir(server.path("order"))
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !names.iter().any(|n| n.contains("warren")),
        "no temporary files: {names:?}"
    );
}

#[tokio::test]
async fn upload_errors_name_the_bad_part() {
    let server = Server::start().await;
    let (content_type, _) = multipart(&[]);
    let boundary_only = "--warrenTestBoundary1234--\r\n";
    let upload_raw = |ct: String, body: Vec<u8>| send(upload_request(&server, ct).body(body));
    assert_error(
        upload_raw(content_type.clone(), boundary_only.into()).await,
        400,
        "INVALID_FILE",
    )
    .await;
    let (ct, body) = multipart(&[(json!({"nopath": 1}), b"x")]);
    assert_error(upload_raw(ct, body).await, 400, "INVALID_FILE_METADATA").await;
    assert_error(
        upload_raw("application/json".into(), b"{}".to_vec()).await,
        400,
        "INVALID_FILE",
    )
    .await;
    // A body cut off in the middle of the file part.
    let (ct, body) = multipart(&[(json!({"path": server.path("cut")}), b"0123456789")]);
    let cut = body[..body.len() - 30].to_vec();
    assert_error(upload_raw(ct, cut).await, 400, "INVALID_FILE_CONTENT").await;
    assert!(!Path::new(&server.path("cut")).exists());
}

#[tokio::test]
async fn download_supports_ranges_and_line_windows() {
    let server = Server::start().await;
    let file = server.path("lines.txt");
    std::fs::write(&file, "l1\nl2\nl3\nl4\n").expect("write");
    let url = at("/files/download", &file);
    let ranged = |url: String, range: &'static str| {
        send(server.client.get(server.url(&url)).header("Range", range))
    };
    let response = ranged(url.clone(), "bytes=3-7").await;
    assert_eq!(response.status(), 206);
    assert_eq!(response.headers()["content-range"], "bytes 3-7/12");
    assert_eq!(response.text().await.expect("text"), "l2\nl3");
    let response = ranged(url.clone(), "bytes=50-").await;
    assert_eq!(response.status(), 416);
    assert_eq!(response.headers()["content-range"], "bytes */12");
    let response = server.get(&format!("{url}&offset=2&limit=2")).await;
    assert_eq!(response.text().await.expect("text"), "l2\nl3\n");
    let response = server.get(&format!("{url}&offset=3")).await;
    assert_eq!(response.text().await.expect("text"), "l3\nl4\n");
    let response = ranged(format!("{url}&offset=1"), "bytes=0-1").await;
    assert_eq!(response.status(), 400);
    assert_missing(&server, "/files/download", &server.path("none")).await;
}

/// Regression: `Range: items=0-5` and `Range: bytes=abc` were answered 416; RFC 9110 says to
/// ignore an unknown unit or an invalid header. Several ranges get the whole file too.
#[tokio::test]
async fn range_headers_that_are_not_one_valid_byte_range_are_ignored() {
    let server = Server::start().await;
    let file = server.path("r.txt");
    std::fs::write(&file, "0123456789ab").expect("write");
    let url = server.url(&at("/files/download", &file));
    let ranged = |ranges: &[&str]| {
        let mut request = server.client.get(&url);
        for range in ranges {
            request = request.header("Range", *range);
        }
        send(request)
    };
    for ranges in [
        &["items=0-5"][..],
        &["bytes=abc"],
        &["bytes=4-2"],
        &["bytes=0-1,4-5"],
        &["bytes=0-1", "bytes=4-5"],
    ] {
        let response = ranged(ranges).await;
        assert_eq!(response.status(), 200, "{ranges:?}");
        assert!(
            response.headers().get("content-range").is_none(),
            "{ranges:?}"
        );
        assert_eq!(response.headers()["content-length"], "12", "{ranges:?}");
        assert_eq!(response.text().await.expect("text"), "0123456789ab");
    }

    let response = ranged(&["bytes=-4"]).await;
    assert_eq!(response.status(), 206);
    assert_eq!(response.headers()["content-range"], "bytes 8-11/12");
    assert_eq!(response.text().await.expect("text"), "89ab");
    let response = ranged(&["bytes=999999-"]).await;
    assert_eq!(response.headers()["content-range"], "bytes */12");
    assert_error(response, 416, "INVALID_REQUEST_BODY").await;

    // An ignored Range does not clash with a line window.
    let lines = send(
        server
            .client
            .get(format!("{url}&offset=1&limit=1"))
            .header("Range", "items=0-1"),
    )
    .await;
    assert_ok_text(lines, "0123456789ab").await;
}

/// Regression: a path with a 300-byte component (ENAMETOOLONG) was a 500.
#[tokio::test]
async fn a_name_longer_than_the_filesystem_allows_is_400_name_too_long() {
    let server = Server::start().await;
    std::fs::create_dir(server.path("d")).expect("mkdir");
    let long = server.path(&format!("d/{}", "n".repeat(300)));
    for route in [
        "/files/info",
        "/files/download",
        "/files/search",
        "/directories/list",
        "/files",
    ] {
        let response = if route == "/files" {
            server.delete(&at(route, &long)).await
        } else {
            server.get(&at(route, &long)).await
        };
        let message = assert_error(response, 400, "NAME_TOO_LONG").await;
        assert!(
            message.contains("longer than the filesystem allows"),
            "{route}: {message}"
        );
    }
    let response = server
        .post_json("/directories", json!({format!("{long}/below"): {}}))
        .await;
    assert_error(response, 400, "NAME_TOO_LONG").await;
    let response = upload(&server, &[(json!({"path": long}), b"x")]).await;
    assert_error(response, 400, "NAME_TOO_LONG").await;
    std::fs::write(server.path("d/short"), "s").expect("write");
    let response = server
        .post_json(
            "/files/mv",
            json!([{"src": server.path("d/short"), "dest": long}]),
        )
        .await;
    assert_error(response, 400, "NAME_TOO_LONG").await;
    assert!(Path::new(&server.path("d/short")).exists(), "nothing moved");
}

/// The temporary file an upload or a replace writes first repeats the name; a name of the
/// longest length the filesystem allows must still be writable.
#[tokio::test]
async fn a_file_with_a_255_byte_name_can_be_uploaded_and_replaced() {
    let server = Server::start().await;
    let path = server.path(&"x".repeat(255));
    let response = upload(&server, &[(json!({"path": path}), b"old text")]).await;
    assert_eq!(response.status(), 200);
    let response = replace(&server, "/files/replace", &path, "old", "new").await;
    assert_eq!(response.status(), 200);
    assert_eq!(std::fs::read_to_string(&path).expect("read"), "new text");
    let names: Vec<_> = std::fs::read_dir(&server.root)
        .expect("read the root")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names.len(), 1, "no temporary file is left: {names:?}");
}

/// Regression: search and list of a file, a FIFO or a device, and mkdir under a file, were
/// 500 "Not a directory".
#[tokio::test]
async fn search_list_and_mkdir_where_a_file_is_are_409_not_a_directory() {
    let server = Server::start().await;
    let file = server.path("file.txt");
    std::fs::write(&file, "f").expect("write");
    let fifo = server.path("fifo");
    mkfifo(&fifo);
    let everywhere = Server::start_with(|config| config.root = "/".into()).await;
    for (server, path) in [
        (&server, &file),
        (&server, &fifo),
        (&everywhere, &"/dev/null".to_owned()),
    ] {
        for route in ["/files/search", "/directories/list"] {
            let response = tokio::time::timeout(WAIT, server.get(&at(route, path)))
                .await
                .expect("answers without opening the FIFO");
            let message = assert_error(response, 409, "NOT_A_DIRECTORY").await;
            assert_eq!(message, format!("{path} is not a directory"), "{route}");
        }
    }
    for below in [format!("{file}/x"), format!("{fifo}/x")] {
        let message = assert_error(
            server.get(&at("/files/info", &below)).await,
            409,
            "NOT_A_DIRECTORY",
        )
        .await;
        assert!(message.contains("not a directory"), "{message}");
        assert_error(
            server.get(&at("/files/download", &below)).await,
            409,
            "NOT_A_DIRECTORY",
        )
        .await;
        let response = server
            .post_json("/directories", json!({format!("{below}/deeper"): {}}))
            .await;
        assert_error(response, 409, "NOT_A_DIRECTORY").await;
        let response = upload(&server, &[(json!({"path": format!("{below}/f")}), b"x")]).await;
        assert_error(response, 409, "NOT_A_DIRECTORY").await;
    }
    let response = server
        .post_json("/directories", json!({file.clone(): {}}))
        .await;
    assert_error(response, 409, "NOT_A_DIRECTORY").await;
    assert_eq!(std::fs::read_to_string(&file).expect("read"), "f");
}

#[tokio::test]
async fn nul_bytes_empty_paths_and_undefined_variables_are_400_invalid_path() {
    let server = Server::start().await;
    let dir = server.path("");
    for url in [
        format!("/files/info?path={dir}a%00b"),
        format!("/files/download?path={dir}a%00b"),
        format!("/directories/list?path={dir}%00"),
        "/files/info?path=/$WARREN_SURELY_UNDEFINED_VAR/x".to_owned(),
    ] {
        assert_error(server.get(&url).await, 400, "INVALID_PATH").await;
    }
    let response = server
        .post_json(
            "/files/mv",
            json!([{"src": format!("{dir}a\u{0}b"), "dest": format!("{dir}c")}]),
        )
        .await;
    assert_error(response, 400, "INVALID_PATH").await;
    let response = server.post_json("/directories", json!({"": {}})).await;
    assert_error(response, 400, "INVALID_PATH").await;
}

#[tokio::test]
async fn list_directory_is_lexical_preorder_to_the_given_depth_without_following_symlinks() {
    let server = Server::start().await;
    let root = server.path("tree");
    for dir in ["tree/b/inner", "tree/a", "outside/secret"] {
        std::fs::create_dir_all(server.path(dir)).expect("mkdir");
    }
    std::fs::write(server.path("tree/c.txt"), "c").expect("write");
    std::fs::write(server.path("tree/b/inner/deep.txt"), "d").expect("write");
    std::fs::write(server.path("outside/secret/x"), "x").expect("write");
    symlink(server.path("outside"), server.path("tree/link")).expect("symlink");

    let p = |rel: &str| format!("{root}/{rel}");
    assert_eq!(
        list(&server, &root, "").await,
        [
            (p("a"), "directory".into()),
            (p("b"), "directory".into()),
            (p("c.txt"), "file".into()),
            (p("link"), "symlink".into())
        ]
    );
    assert_eq!(
        list(&server, &root, "&depth=3")
            .await
            .into_iter()
            .map(|e| e.0)
            .collect::<Vec<_>>(),
        [
            p("a"),
            p("b"),
            p("b/inner"),
            p("b/inner/deep.txt"),
            p("c.txt"),
            p("link")
        ]
    );
    assert!(list(&server, &root, "&depth=0").await.is_empty());
    assert_error(server.get("/directories/list").await, 400, "MISSING_QUERY").await;
    assert_missing(&server, "/directories/list", &server.path("nope")).await;
}

/// `(paths, truncated header, unreadable header)` of a search or listing answer.
async fn listing(server: &Server, url: &str) -> (Vec<String>, Option<String>, Option<String>) {
    let response = server.get(url).await;
    assert_eq!(response.status(), 200, "{url}");
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().expect("ASCII header").to_owned())
    };
    let (truncated, unreadable) = (
        header("warren-truncated"),
        header("warren-unreadable-entries"),
    );
    let entries: Vec<Value> = response.json().await.expect("a JSON array");
    let paths = entries
        .iter()
        .map(|e| e["path"].as_str().expect("path").to_owned())
        .collect();
    (paths, truncated, unreadable)
}

/// Makes a directory unreadable (mode 000) and readable again when dropped, so the
/// temporary root can be removed.
struct Locked(std::path::PathBuf);

impl Locked {
    fn new(path: std::path::PathBuf) -> Self {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o000)).expect("chmod 000");
        Self(path)
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        let _ = std::fs::set_permissions(&self.0, std::fs::Permissions::from_mode(0o755));
    }
}

/// Regression: one entry that could not be read (`EACCES` on `/proc/1/fdinfo`) made a whole
/// search or listing a 500. Root reads a mode-000 directory anyway, so the server runs on a
/// thread that gave up CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (capabilities are per thread;
/// the runtime's threads are started from it and inherit them).
#[test]
fn an_entry_that_cannot_be_read_is_skipped_and_counted_not_a_failed_listing() {
    let thread = std::thread::spawn(|| {
        use rustix::thread::{CapabilitySet, capabilities, set_capabilities};
        let mut caps = capabilities(None).expect("capget");
        let dac = CapabilitySet::DAC_OVERRIDE | CapabilitySet::DAC_READ_SEARCH;
        caps.effective.remove(dac);
        caps.permitted.remove(dac);
        set_capabilities(None, caps).expect("capset drops capabilities of this thread");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(unreadable_entries_are_skipped());
    });
    if let Err(panic) = thread.join() {
        std::panic::resume_unwind(panic);
    }
}

async fn unreadable_entries_are_skipped() {
    let server = Server::start().await;
    for dir in ["tree/locked", "tree/open"] {
        std::fs::create_dir_all(server.path(dir)).expect("mkdir");
    }
    for file in [
        "tree/a.txt",
        "tree/locked/secret.txt",
        "tree/open/b.txt",
        "tree/z.txt",
    ] {
        std::fs::write(server.path(file), "x").expect("write");
    }
    let _locked = Locked::new(server.path("tree/locked").into());
    let tree = server.path("tree");
    let p = |rel: &str| format!("{tree}/{rel}");

    let (paths, truncated, unreadable) = listing(&server, &list_url(&tree, 5)).await;
    assert_eq!(
        paths,
        [
            p("a.txt"),
            p("locked"),
            p("open"),
            p("open/b.txt"),
            p("z.txt")
        ]
    );
    assert_eq!((truncated, unreadable.as_deref()), (None, Some("1")));

    let (paths, truncated, unreadable) = listing(&server, &at("/files/search", &tree)).await;
    assert_eq!(paths, [p("a.txt"), p("open/b.txt"), p("z.txt")]);
    assert_eq!((truncated, unreadable.as_deref()), (None, Some("1")));

    // The directory the client named is not skipped: it is refused.
    for route in ["/directories/list", "/files/search"] {
        let response = server.get(&at(route, &p("locked"))).await;
        assert_error(response, 403, "PERMISSION_DENIED").await;
    }
    let response = server
        .get(&at("/files/download", &p("locked/secret.txt")))
        .await;
    assert_error(response, 403, "PERMISSION_DENIED").await;
}

/// Regression: with `--root /`, search of `/` or `/proc` and a listing of `/` to depth
/// 1 000 000 were 500 "Permission denied"; they answer, and say when a limit cut them.
#[tokio::test]
async fn search_of_proc_and_deep_listing_of_the_whole_root_answer() {
    let server = Server::start_with(|config| config.root = "/".into()).await;
    for url in [
        "/files/search?path=/proc",
        "/files/search?path=/",
        "/directories/list?path=/&depth=1000000",
        "/directories/list?path=/proc&depth=99999999999999999999999",
    ] {
        let (paths, truncated, _) = listing(&server, url).await;
        assert!(paths.len() <= 10_000, "{url}: {} entries", paths.len());
        if paths.len() == 10_000 {
            assert_eq!(truncated.as_deref(), Some("true"), "{url}");
        }
    }
}

#[tokio::test]
async fn listings_cut_by_the_depth_or_entry_limits_say_they_are_truncated() {
    let server = Server::start().await;
    let deep = server.path(&["d"; 70].join("/"));
    std::fs::create_dir_all(&deep).expect("mkdir 70 levels");
    let top = server.path("d");
    let list = |depth: &str| format!("/directories/list?path={}&depth={depth}", q(&top));
    let (paths, truncated, _) = listing(&server, &list("1000000")).await;
    assert_eq!(paths.len(), 64, "the walk stops 64 levels down");
    assert_eq!(truncated.as_deref(), Some("true"));
    let (paths, truncated, _) = listing(&server, &list("64")).await;
    assert_eq!(
        (paths.len(), truncated),
        (64, None),
        "64 levels asked and given"
    );
    let (_, truncated, _) = listing(&server, &at("/files/search", &top)).await;
    assert_eq!(truncated.as_deref(), Some("true"));

    let wide = server.path("wide");
    std::fs::create_dir(&wide).expect("mkdir");
    for n in 0..10_000 {
        std::fs::write(format!("{wide}/{n:05}"), "").expect("write");
    }
    for url in [at("/directories/list", &wide), at("/files/search", &wide)] {
        let (paths, truncated, _) = listing(&server, &url).await;
        assert_eq!(
            (paths.len(), truncated),
            (10_000, None),
            "exactly at the limit: {url}"
        );
    }
    std::fs::write(format!("{wide}/10000"), "").expect("write");
    for url in [at("/directories/list", &wide), at("/files/search", &wide)] {
        let (paths, truncated, _) = listing(&server, &url).await;
        assert_eq!(paths.len(), 10_000, "{url}");
        assert_eq!(
            paths.last(),
            Some(&format!("{wide}/09999")),
            "the first 10 000 in order"
        );
        assert_eq!(truncated.as_deref(), Some("true"), "{url}");
    }
}

#[tokio::test]
async fn a_directory_whose_name_is_not_utf8_is_listed_with_its_contents() {
    use std::os::unix::ffi::OsStrExt;
    let server = Server::start().await;
    let odd = server
        .root
        .join("t")
        .join(std::ffi::OsStr::from_bytes(b"d\xff"));
    std::fs::create_dir_all(&odd).expect("mkdir");
    std::fs::write(odd.join("inner.txt"), "i").expect("write");
    let tree = server.path("t");
    let (paths, _, unreadable) = listing(&server, &list_url(&tree, 2)).await;
    assert_eq!(
        paths,
        [
            format!("{tree}/d\u{FFFD}"),
            format!("{tree}/d\u{FFFD}/inner.txt")
        ]
    );
    assert_eq!(unreadable, None);
}

#[tokio::test]
async fn search_matches_the_glob_on_base_names_recursively_and_lists_files_only() {
    let server = Server::start().await;
    std::fs::create_dir_all(server.path("s/sub/x.rs")).expect("a directory named like a match");
    std::fs::write(server.path("s/a.rs"), "").expect("write");
    std::fs::write(server.path("s/sub/b.rs"), "").expect("write");
    std::fs::write(server.path("s/sub/c.txt"), "").expect("write");
    let dir = server.path("s");
    let found: Vec<Value> = server
        .get(&format!("/files/search?path={}&pattern=*.rs", q(&dir)))
        .await
        .json()
        .await
        .expect("json");
    let paths: Vec<&str> = found
        .iter()
        .map(|e| e["path"].as_str().expect("path"))
        .collect();
    assert_eq!(paths, [format!("{dir}/a.rs"), format!("{dir}/sub/b.rs")]);
    let all: Vec<Value> = server
        .get(&at("/files/search", &dir))
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(all.len(), 3);
    assert_error(
        server.get("/files/search?pattern=*").await,
        400,
        "MISSING_QUERY",
    )
    .await;
    assert_missing(&server, "/files/search", &server.path("nope")).await;
}

#[tokio::test]
async fn move_renames_creates_parents_and_refuses_missing_sources_and_existing_destinations() {
    let server = Server::start().await;
    std::fs::write(server.path("src"), "s").expect("write");
    std::fs::write(server.path("taken"), "t").expect("write");
    let mv = |src: &str, dest: &str| {
        let body = json!([{"src": server.path(src), "dest": server.path(dest)}]);
        server.post_json("/files/mv", body)
    };
    assert_eq!(mv("src", "new/parent/dst").await.status(), 200);
    assert_eq!(
        std::fs::read_to_string(server.path("new/parent/dst")).expect("moved"),
        "s"
    );
    assert_error(mv("src", "x").await, 404, "FILE_NOT_FOUND").await;
    assert_error(mv("new/parent/dst", "taken").await, 500, "RUNTIME_ERROR").await;
    assert_error(
        server.post_json("/files/mv", json!({"src": "x"})).await,
        400,
        "INVALID_REQUEST_BODY",
    )
    .await;
}

/// Regression: moving a directory into itself was a 500, after the destination's missing
/// parents had been created inside the source.
#[tokio::test]
async fn moving_a_directory_into_itself_is_400_invalid_move_and_changes_nothing() {
    let server = Server::start().await;
    std::fs::create_dir_all(server.path("a/inner")).expect("mkdir");
    symlink(server.path("a/inner"), server.path("to-inner")).expect("symlink");
    let mv = |src: &str, dest: &str| {
        let body = json!([{"src": server.path(src), "dest": server.path(dest)}]);
        server.post_json("/files/mv", body)
    };
    for dest in [
        "a/b",
        "a/inner/b",
        "a/new/parents/b",
        "to-inner/b",
        "a/inner/../b",
    ] {
        let message = assert_error(mv("a", dest).await, 400, "INVALID_MOVE").await;
        assert!(message.contains("into itself"), "{dest}: {message}");
    }
    assert!(
        !Path::new(&server.path("a/new")).exists(),
        "no parent was created"
    );
    assert!(
        Path::new(&server.path("a/inner")).is_dir(),
        "the source is intact"
    );
    let message = assert_error(mv("", "elsewhere").await, 400, "INVALID_MOVE").await;
    assert!(message.contains("root"), "{message}");

    // Beside itself, or a link to it into it, is fine.
    assert_eq!(mv("a", "a2").await.status(), 200);
    assert!(Path::new(&server.path("a2/inner")).is_dir());
    symlink(server.path("a2"), server.path("link-to-a2")).expect("symlink");
    assert_eq!(mv("link-to-a2", "a2/link").await.status(), 200);
    assert!(
        std::fs::symlink_metadata(server.path("a2/link"))
            .expect("moved")
            .is_symlink()
    );
}

#[tokio::test]
async fn replace_rewrites_every_occurrence_and_reports_counts_when_verbose() {
    let server = Server::start().await;
    let file = server.path("r.txt");
    std::fs::write(&file, "a-b-a-b-a").expect("write");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    let verbose = "/files/replace?verbose=true";
    let response = replace(&server, verbose, &file, "a", "XY").await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body[&file]["replacedCount"], 3);
    assert_eq!(
        std::fs::read_to_string(&file).expect("read"),
        "XY-b-XY-b-XY"
    );
    assert_eq!(
        std::fs::metadata(&file).expect("meta").permissions().mode() & 0o777,
        0o640
    );
    let response = replace(&server, "/files/replace", &file, "b", "").await;
    assert_ok_text(response, "").await;
    let response = replace(&server, "/files/replace", &file, "", "x").await;
    assert_error(response, 400, "INVALID_REQUEST_BODY").await;
    let nope = server.path("nope");
    let response = replace(&server, "/files/replace", &nope, "a", "b").await;
    assert_error(response, 404, "FILE_NOT_FOUND").await;
}

#[tokio::test]
async fn permissions_directories_and_deletion() {
    let server = Server::start().await;
    let file = server.path("p.txt");
    std::fs::write(&file, "p").expect("write");
    let user = users_name();
    let response = server
        .post_json(
            "/files/permissions",
            json!({file.clone(): {"mode": 600, "owner": user}}),
        )
        .await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        std::fs::metadata(&file).expect("meta").permissions().mode() & 0o777,
        0o600
    );
    let (status, _, _) = error_body(
        server
            .post_json("/files/permissions", json!({file.clone(): {"mode": 999}}))
            .await,
    )
    .await;
    assert_eq!(status, 400);

    let dir = server.path("made/deep");
    assert_eq!(
        server
            .post_json("/directories", json!({dir.clone(): {"mode": 700}}))
            .await
            .status(),
        200
    );
    assert_eq!(
        std::fs::metadata(&dir)
            .expect("dir made")
            .permissions()
            .mode()
            & 0o777,
        0o700
    );

    let (status, code, _) =
        error_body(server.delete(&at("/files", &server.path("made"))).await).await;
    assert_eq!(
        (status, code.as_str()),
        (500, "RUNTIME_ERROR"),
        "a directory is not deleted as a file"
    );
    assert_eq!(
        server
            .delete(&format!(
                "/files?path={}&path={}",
                q(&file),
                q(&server.path("missing"))
            ))
            .await
            .status(),
        200
    );
    assert!(!Path::new(&file).exists());
    let made = server.path("made");
    assert_eq!(delete_status(&server, "/directories", &made).await, 200);
    assert!(!Path::new(&made).exists());
    assert_eq!(delete_status(&server, "/directories", &made).await, 200);
    assert_missing(&server, "/files/info", &file).await;
}

fn users_name() -> String {
    let uid = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap_or(0);
    std::fs::read_to_string("/etc/passwd")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.get(2) == Some(&uid.to_string().as_str())).then(|| f[0].to_owned())
        })
        .unwrap_or_else(|| uid.to_string())
}

/// `(path, type)` of each entry `/directories/list` returns for `root` with extra `query`.
async fn list(server: &Server, root: &str, query: &str) -> Vec<(String, String)> {
    let url = format!("/directories/list?path={}{query}", q(root));
    let entries: Vec<Value> = server.get(&url).await.json().await.expect("json");
    entries
        .iter()
        .map(|e| {
            (
                e["path"].as_str().expect("path").to_owned(),
                e["type"].as_str().expect("type").to_owned(),
            )
        })
        .collect()
}

/// `GET route?path=<path>` answers 404 FILE_NOT_FOUND.
async fn assert_missing(server: &Server, route: &str, path: &str) {
    assert_error(server.get(&at(route, path)).await, 404, "FILE_NOT_FOUND").await;
}

/// `route?path=<path>` is refused with 403 PATH_ESCAPE.
async fn assert_escape_refused(server: &Server, route: &str, path: &str) {
    assert_refused(server, &at(route, path), "PATH_ESCAPE").await;
}

async fn assert_refused(server: &Server, url: &str, expected_code: &str) {
    // `send` bounds the wait: a refusal must never hang.
    let response = send(server.client.get(server.url(url))).await;
    let (status, code, message) = error_body(response).await;
    assert_eq!(
        (status, code.as_str()),
        (403, expected_code),
        "{url}: {message}"
    );
}

#[tokio::test]
async fn a_symlink_to_etc_inside_the_root_is_refused() {
    let server = Server::start().await;
    symlink("/etc", server.path("etc")).expect("symlink");
    let passwd = server.path("etc/passwd");
    assert_escape_refused(&server, "/files/download", &passwd).await;
    assert_escape_refused(&server, "/files/info", &passwd).await;
    assert_escape_refused(&server, "/directories/list", &server.path("etc")).await;
    let response = upload(
        &server,
        &[(json!({"path": server.path("etc/warren-escape")}), b"x")],
    )
    .await;
    assert_error(response, 403, "PATH_ESCAPE").await;
    assert!(!Path::new("/etc/warren-escape").exists());
}

#[tokio::test]
async fn a_symlink_chain_out_of_the_root_is_refused() {
    let server = Server::start().await;
    symlink(server.path("second"), server.path("first")).expect("symlink");
    symlink("/etc/passwd", server.path("second")).expect("symlink");
    symlink("third", server.path("relative")).expect("symlink");
    symlink("../../../../../../../../etc/passwd", server.path("third")).expect("symlink");
    assert_escape_refused(&server, "/files/download", &server.path("first")).await;
    assert_escape_refused(&server, "/files/download", &server.path("relative")).await;
}

#[tokio::test]
async fn dot_dot_segments_and_paths_outside_the_root_are_refused() {
    let server = Server::start().await;
    let escape = format!("{}/../../../../etc/passwd", server.root.display());
    assert_escape_refused(&server, "/files/download", &escape).await;
    assert_refused(&server, "/files/download?path=/etc/passwd", "PATH_ESCAPE").await;
    let response = server
        .post_json(
            "/files/mv",
            json!([{"src": escape, "dest": server.path("stolen")}]),
        )
        .await;
    assert_eq!(error_body(response).await.1, "PATH_ESCAPE");
    assert!(!Path::new(&server.path("stolen")).exists());
}

#[tokio::test]
async fn url_encoded_dot_dot_is_refused() {
    let server = Server::start().await;
    let url = format!(
        "/files/download?path={}/%2e%2e/%2E%2E/%2e%2e/etc/passwd",
        server.root.display()
    );
    assert_refused(&server, &url, "PATH_ESCAPE").await;
    let url = format!(
        "/files/info?path={}%2F..%2F..%2F..%2Fetc%2Fpasswd",
        server.root.display()
    );
    assert_refused(&server, &url, "PATH_ESCAPE").await;
}

#[tokio::test]
async fn absolute_link_targets_outside_the_root_are_refused() {
    let server = Server::start().await;
    symlink("/etc/hostname", server.path("abs")).expect("symlink");
    std::fs::create_dir(server.path("d")).expect("mkdir");
    symlink("/", server.path("d/slash")).expect("symlink");
    assert_escape_refused(&server, "/files/download", &server.path("abs")).await;
    assert_escape_refused(&server, "/files/search", &server.path("d/slash/etc")).await;
    // The link itself can still be described and deleted (lstat, no following).
    let info = info(&server, &server.path("abs")).await;
    assert_eq!(info[server.path("abs")]["type"], "symlink");
    let abs = server.path("abs");
    assert_eq!(delete_status(&server, "/files", &abs).await, 200);
    assert!(Path::new("/etc/hostname").exists());
}

#[tokio::test]
async fn a_fifo_is_never_opened_and_nothing_hangs() {
    let server = Server::start().await;
    let fifo = server.path("fifo");
    mkfifo(&fifo);
    assert_refused(&server, &at("/files/download", &fifo), "NOT_REGULAR_FILE").await;
    let response = tokio::time::timeout(WAIT, replace(&server, "/files/replace", &fifo, "a", "b"))
        .await
        .expect("replace on a FIFO answers");
    assert_eq!(error_body(response).await.1, "NOT_REGULAR_FILE");
    let response = tokio::time::timeout(WAIT, upload(&server, &[(json!({"path": fifo}), b"x")]))
        .await
        .expect("upload onto a FIFO answers");
    assert_eq!(error_body(response).await.1, "NOT_REGULAR_FILE");
    let info = info(&server, &fifo).await;
    assert_eq!(info[&fifo]["type"], "other");
}

#[tokio::test]
async fn dev_zero_is_never_read_with_the_default_root() {
    let server = Server::start_with(|config| config.root = "/".into()).await;
    assert_refused(
        &server,
        "/files/download?path=/dev/zero",
        "NOT_REGULAR_FILE",
    )
    .await;
    let response = server.get("/files/download?path=/etc/hostname").await;
    assert_eq!(
        response.status(),
        200,
        "ordinary files stay readable under root /"
    );
}

#[tokio::test]
async fn a_file_swapped_for_a_symlink_between_checks_never_leaks_outside_content() {
    let server = Server::start().await;
    let path = server.path("flip");
    let _swapping = {
        let (path, tmp) = (path.clone(), server.path("flip.tmp"));
        keep_swapping(move |n| {
            let _ = std::fs::remove_file(&tmp);
            if n.is_multiple_of(2) {
                std::fs::write(&tmp, "inside").expect("write");
            } else {
                symlink("/etc/passwd", &tmp).expect("symlink");
            }
            std::fs::rename(&tmp, &path).expect("rename");
        })
    };
    assert_downloads_never_leak(&server, &path, "both the file and the link").await;
}

#[tokio::test]
async fn an_absolute_link_to_a_file_inside_the_root_is_followed() {
    let server = Server::start().await;
    let data = write_below(&server, "real/data.txt", "inside\n");
    let link = server.path("abs");
    symlink(&data, &link).expect("symlink");
    // Spelled with `.` and `..` at the root's level, still inside.
    let dotted = server.path("dotted");
    let root_name = server.root.file_name().expect("root has a name");
    symlink(
        format!(
            "{}/./../{}/real/data.txt",
            server.root.display(),
            root_name.to_string_lossy()
        ),
        &dotted,
    )
    .expect("symlink");

    for path in [&link, &dotted] {
        assert_ok_text(download(&server, path).await, "inside\n").await;
    }
    let info = info(&server, &link).await;
    assert_eq!(info[&link]["type"], "symlink", "info describes the link");

    let response = replace(&server, "/files/replace", &link, "inside", "rewritten").await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        std::fs::read_to_string(&data).expect("read"),
        "rewritten\n",
        "replace writes the file the link points to"
    );
    assert!(
        std::fs::symlink_metadata(&link)
            .expect("link")
            .file_type()
            .is_symlink(),
        "the link stays a link"
    );
}

#[tokio::test]
async fn an_absolute_link_to_a_directory_inside_the_root_can_be_listed_and_written_through() {
    let server = Server::start().await;
    std::fs::create_dir_all(server.path("real/sub")).expect("mkdir");
    write_below(&server, "real/a.txt", "a");
    let dir_link = server.path("absdir");
    symlink(server.path("real"), &dir_link).expect("symlink");

    let p = |rel: &str| format!("{dir_link}/{rel}");
    assert_eq!(
        list(&server, &dir_link, "").await,
        [(p("a.txt"), "file".into()), (p("sub"), "directory".into())]
    );
    let info = info(&server, &p("a.txt")).await;
    assert_eq!(info[p("a.txt")]["type"], "file");
    assert_eq!(info[p("a.txt")]["size"], 1);

    let response = upload(&server, &[(json!({"path": p("sub/new/up.txt")}), b"up")]).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        std::fs::read_to_string(server.path("real/sub/new/up.txt")).expect("uploaded"),
        "up"
    );
    let response = server
        .post_json(
            "/files/mv",
            json!([{"src": p("sub/new/up.txt"), "dest": p("sub/moved.txt")}]),
        )
        .await;
    assert_eq!(response.status(), 200);
    assert!(Path::new(&server.path("real/sub/moved.txt")).exists());
    let response = server.delete(&at("/files", &p("sub/moved.txt"))).await;
    assert_eq!(response.status(), 200);
    assert!(!Path::new(&server.path("real/sub/moved.txt")).exists());
    let response = server.delete(&at("/directories", &p("sub/new"))).await;
    assert_eq!(response.status(), 200);
    assert!(!Path::new(&server.path("real/sub/new")).exists());
    assert!(Path::new(&server.path("real/sub")).is_dir());
    let response = server.delete(&at("/directories", &dir_link)).await;
    assert_eq!(response.status(), 200);
    assert!(
        Path::new(&server.path("real/a.txt")).exists(),
        "removing a link to a directory removes the link, not the directory"
    );
    assert!(std::fs::symlink_metadata(&dir_link).is_err());
}

#[tokio::test]
async fn a_symlink_loop_is_a_clear_error_not_a_hang() {
    let server = Server::start().await;
    symlink(server.path("loop_b"), server.path("loop_a")).expect("symlink");
    symlink("loop_a", server.path("loop_b")).expect("symlink");
    symlink(server.path("me"), server.path("me")).expect("symlink");
    for path in [
        server.path("loop_a"),
        server.path("loop_a/below"),
        server.path("me"),
    ] {
        let response = tokio::time::timeout(WAIT, server.get(&at("/files/download", &path)))
            .await
            .expect("a link loop is answered without hanging");
        let (status, code, message) = error_body(response).await;
        assert_eq!((status, code.as_str()), (500, "RUNTIME_ERROR"), "{path}");
        assert!(
            message.contains("too many levels of symbolic links"),
            "{path}: {message}"
        );
    }
    let response = server
        .post_json("/directories", json!({server.path("loop_a/made"): {}}))
        .await;
    let (status, _, message) = error_body(response).await;
    assert_eq!(status, 500, "mkdir through a loop: {message}");
    assert!(message.contains("symbolic links"), "{message}");
}

#[tokio::test]
async fn with_the_root_slash_absolute_links_are_followed() {
    let server = Server::start_with(|config| config.root = "/".into()).await;
    let elsewhere = tempfile::tempdir().expect("temporary directory");
    let elsewhere = std::fs::canonicalize(elsewhere.path()).expect("canonical");
    let here = tempfile::tempdir().expect("temporary directory");
    let here = std::fs::canonicalize(here.path()).expect("canonical");
    std::fs::write(elsewhere.join("file.txt"), "far away").expect("write");
    symlink(elsewhere.join("file.txt"), here.join("file-link")).expect("symlink");
    symlink(&elsewhere, here.join("dir-link")).expect("symlink");

    let file_link = here.join("file-link").display().to_string();
    assert_ok_text(download(&server, &file_link).await, "far away").await;

    let dir_link = here.join("dir-link").display().to_string();
    assert_eq!(
        list(&server, &dir_link, "").await,
        [(format!("{dir_link}/file.txt"), "file".into())]
    );
    // `..` at `/` stays at `/`, as in the kernel.
    let climbing = format!("/../..{}", elsewhere.join("file.txt").display());
    assert_ok_text(download(&server, &climbing).await, "far away").await;
}

#[tokio::test]
async fn a_directory_link_retargeted_from_inside_to_etc_never_leaks_outside_content() {
    let server = Server::start().await;
    write_below(&server, "real/passwd", "inside");
    let link = server.path("dir");
    let _swapping = {
        let (link, tmp) = (link.clone(), server.path("dir.tmp"));
        let inside = server.path("real");
        keep_swapping(move |n| {
            let _ = std::fs::remove_file(&tmp);
            let target = if n.is_multiple_of(2) { &inside } else { "/etc" };
            symlink(target, &tmp).expect("symlink");
            std::fs::rename(&tmp, &link).expect("rename");
        })
    };
    let path = format!("{link}/passwd");
    assert_downloads_never_leak(&server, &path, "both link targets").await;
}

/// Every route that changes something refuses a path through a link out of the root, and the
/// files out there stay exactly as they were.
#[tokio::test]
async fn no_route_changes_anything_through_a_link_out_of_the_root() {
    let server = Server::start().await;
    let outside_dir = tempfile::tempdir().expect("a directory outside the root");
    let outside = std::fs::canonicalize(outside_dir.path()).expect("canonical");
    std::fs::create_dir(outside.join("victimdir")).expect("mkdir");
    std::fs::write(outside.join("victimdir/inner.txt"), "inner").expect("write");
    std::fs::write(outside.join("victim.txt"), "victim").expect("write");
    std::fs::set_permissions(
        outside.join("victim.txt"),
        std::fs::Permissions::from_mode(0o640),
    )
    .expect("chmod");
    symlink(&outside, server.path("link")).expect("symlink");
    std::fs::write(server.path("inside.txt"), "inside").expect("write");
    let through = |rel: &str| server.path(&format!("link/{rel}"));

    let refusals = [
        (
            "delete a file",
            server.delete(&at("/files", &through("victim.txt"))).await,
        ),
        (
            "delete a directory",
            server
                .delete(&at("/directories", &through("victimdir")))
                .await,
        ),
        (
            "chmod",
            server
                .post_json(
                    "/files/permissions",
                    json!({through("victim.txt"): {"mode": 777}}),
                )
                .await,
        ),
        (
            "replace",
            server
                .post_json(
                    "/files/replace",
                    json!({through("victim.txt"): {"old": "victim", "new": "owned"}}),
                )
                .await,
        ),
        (
            "make a directory",
            server
                .post_json("/directories", json!({through("newdir"): {"mode": 755}}))
                .await,
        ),
        (
            "move out",
            server
                .post_json(
                    "/files/mv",
                    json!([{"src": server.path("inside.txt"), "dest": through("moved.txt")}]),
                )
                .await,
        ),
        (
            "move in",
            server
                .post_json(
                    "/files/mv",
                    json!([{"src": through("victim.txt"), "dest": server.path("stolen.txt")}]),
                )
                .await,
        ),
        (
            "upload",
            upload(&server, &[(json!({"path": through("new.txt")}), b"x")]).await,
        ),
    ];
    for (what, response) in refusals {
        let (status, code, message) = error_body(response).await;
        assert_eq!(
            (status, code.as_str()),
            (403, "PATH_ESCAPE"),
            "{what}: {message}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(outside.join("victim.txt")).expect("the victim is still there"),
        "victim"
    );
    assert_eq!(
        std::fs::metadata(outside.join("victim.txt"))
            .expect("stat")
            .permissions()
            .mode()
            & 0o777,
        0o640
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("victimdir/inner.txt")).expect("still there"),
        "inner"
    );
    for name in ["newdir", "moved.txt", "new.txt"] {
        assert!(
            !outside.join(name).exists(),
            "{name} was not created outside"
        );
    }
    assert_eq!(
        std::fs::read_to_string(server.path("inside.txt")).expect("the source stays"),
        "inside"
    );
    assert!(!Path::new(&server.path("stolen.txt")).exists());

    // Removing the link itself removes only the link, never what it points to.
    let response = server
        .delete(&at("/directories", &server.path("link")))
        .await;
    assert_eq!(response.status(), 200);
    assert!(
        std::fs::symlink_metadata(server.path("link")).is_err(),
        "the link is gone"
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("victimdir/inner.txt")).expect("still there"),
        "inner"
    );
    assert!(outside.join("victim.txt").exists());
}

/// Uploads and downloads stream: 64 MiB pass through both ways while the peak memory of this
/// process (client and server, the test alone in it) grows far less.
#[tokio::test]
async fn a_large_upload_and_download_stream_without_buffering_the_file() {
    if !alone_in_a_new_process("a_large_upload_and_download_stream_without_buffering_the_file") {
        return;
    }
    const N_CHUNKS: usize = 64;
    const CHUNK: usize = 1024 * 1024;
    let server = Server::start().await;
    let path = server.path("big/file.bin");
    let boundary = "warrenTestBoundary1234";
    let head = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\n\
         Content-Type: application/json\r\n\r\n{}\r\n--{boundary}\r\n\
         Content-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n",
        json!({"path": path})
    );
    let tail = format!("\r\n--{boundary}--\r\n");
    let rss_before_kib = memory_kib("VmRSS");
    let chunks = std::iter::once(head.into_bytes())
        .chain((0..N_CHUNKS).map(|i| vec![b'a' + (i % 26) as u8; CHUNK]))
        .chain(std::iter::once(tail.into_bytes()))
        .map(Ok::<_, std::io::Error>);
    let body = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
    let content_type = format!("multipart/form-data; boundary={boundary}");
    let response = send(upload_request(&server, content_type).body(body)).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        std::fs::metadata(&path).expect("uploaded").len(),
        (N_CHUNKS * CHUNK) as u64
    );

    let response = download(&server, &path).await;
    assert_eq!(response.status(), 200);
    let (n_bytes, last_byte) = warren_test_support::peak_memory::drain(response).await;
    assert_eq!(n_bytes, N_CHUNKS * CHUNK);
    assert_eq!(last_byte, b'a' + ((N_CHUNKS - 1) % 26) as u8);
    let peak_growth_kib = memory_kib("VmHWM").saturating_sub(rss_before_kib);
    assert!(
        peak_growth_kib < 24 * 1024,
        "64 MiB each way, peak memory grew by {peak_growth_kib} KiB"
    );
}

#[tokio::test]
async fn owner_and_group_are_set_by_name_and_unknown_names_are_400() {
    use std::os::unix::fs::MetadataExt;
    let server = Server::start().await;
    let file = server.path("owned.txt");
    std::fs::write(&file, "o").expect("write");
    let chown = |owner: &str, group: &str| {
        server.post_json(
            "/files/permissions",
            json!({file.clone(): {"owner": owner, "group": group}}),
        )
    };
    if rustix::process::geteuid().is_root() {
        assert_eq!(chown("nobody", "nogroup").await.status(), 200);
        let meta = std::fs::metadata(&file).expect("stat");
        assert_eq!((meta.uid(), meta.gid()), (65534, 65534));
        let described = info(&server, &file).await;
        assert_eq!(described[&file]["owner"], "nobody");
        assert_eq!(described[&file]["group"], "nogroup");
    }
    for (owner, group) in [("no-such-user-warren", ""), ("", "no-such-group-warren")] {
        let (status, code, message) = error_body(chown(owner, group).await).await;
        assert_eq!(
            (status, code.as_str()),
            (400, "INVALID_REQUEST_BODY"),
            "{owner}:{group}: {message}"
        );
        assert!(message.contains("unknown"), "{message}");
    }
}
