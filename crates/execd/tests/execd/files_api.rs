//! Warren's file routes (`/v1/files*`) against a real execd on 127.0.0.1:0 through the typed
//! client the gateway uses: byte ranges, listings, uploads (also cut off midway), `mkdir -p`,
//! moves, removal and the change feed, with each bad input's status and code.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use warren_execd_client::{ClientError, Download, ExecdClient};
use warren_protocol::error::ErrorBody;
use warren_protocol::files::{FileKind, MoveRequest};
use warren_test_support::{eventually, within};

use crate::client_answers::{assert_refused, mkfifo};
use crate::opensandbox_support::Server;

async fn start() -> (Server, ExecdClient) {
    let server = Server::start().await;
    let client = ExecdClient::new(&server.base, None).expect("client");
    (server, client)
}

/// An execd whose root holds `digits` (`0123456789`), and its client.
async fn start_with_digits() -> (Server, ExecdClient) {
    let (server, client) = start().await;
    std::fs::write(server.root.join("digits"), "0123456789").expect("file");
    (server, client)
}

async fn body_of(download: Download) -> Vec<u8> {
    let chunks: Vec<_> = download.body.try_collect().await.expect("the whole body");
    chunks.concat()
}

/// The names in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("lists")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

/// `digits` downloaded with `range`: status, `Content-Range`, `Content-Length` and body.
async fn download_digits(
    client: &ExecdClient,
    range: Option<&str>,
) -> (u16, Option<String>, Option<u64>, Vec<u8>) {
    let download = client.download("digits", range).await.expect("an answer");
    let status = download.status.as_u16();
    let content_range = download.content_range.clone();
    let content_length = download.content_length;
    (
        status,
        content_range,
        content_length,
        body_of(download).await,
    )
}

#[tokio::test]
async fn a_range_is_served_as_206_and_a_bad_or_multiple_one_as_the_whole_file() {
    let (_server, client) = start_with_digits().await;
    let whole = (200, None, Some(10), b"0123456789".to_vec());
    let table = [
        (None, whole.clone()),
        (
            Some("bytes=2-5"),
            (206, Some("bytes 2-5/10".into()), Some(4), b"2345".to_vec()),
        ),
        (
            Some("bytes=-3"),
            (206, Some("bytes 7-9/10".into()), Some(3), b"789".to_vec()),
        ),
        (Some("bytes=5-1"), whole.clone()),
        (Some("bytes=0-1,4-5"), whole),
    ];
    for (range, expected) in table {
        assert_eq!(download_digits(&client, range).await, expected, "{range:?}");
    }
}

#[tokio::test]
async fn a_range_past_the_end_is_416_with_the_size() {
    let (_server, client) = start_with_digits().await;
    let (status, content_range, _, body) = download_digits(&client, Some("bytes=999999999-")).await;
    assert_eq!(
        (status, content_range.as_deref()),
        (416, Some("bytes */10"))
    );
    let error: ErrorBody = serde_json::from_slice(&body).expect("error body");
    assert_eq!(error.code, "RANGE_NOT_SATISFIABLE");
}

#[tokio::test]
async fn a_download_is_octet_stream_that_never_sniffs_and_takes_ranges() {
    let (server, _client) = start_with_digits().await;
    let response = server
        .get(&format!("/v1/files?path={}", server.path("digits")))
        .await;
    let header = |name: &str| response.headers()[name].to_str().expect("text").to_owned();
    assert_eq!(header("accept-ranges"), "bytes");
    assert_eq!(header("content-type"), "application/octet-stream");
    assert_eq!(header("x-content-type-options"), "nosniff");
}

/// `a.txt`, `b.dir/` (an empty directory), `link -> sub`, and `sub/` holding `inner.txt` and
/// `deeper/` with `x.txt` and `more/` with `y.txt` (four levels down).
fn populate(root: &Path) {
    std::fs::create_dir_all(root.join("sub/deeper/more")).expect("dirs");
    std::fs::create_dir(root.join("b.dir")).expect("dir");
    for (path, content) in [
        ("a.txt", "abc"),
        ("sub/inner.txt", "inner"),
        ("sub/deeper/x.txt", "x"),
        ("sub/deeper/more/y.txt", "y"),
    ] {
        let path = root.join(path);
        std::fs::write(&path, content).expect("file");
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .expect("chmod");
    }
    std::os::unix::fs::symlink("sub", root.join("link")).expect("link");
}

#[tokio::test]
async fn a_listing_describes_each_entry_and_its_links_without_following_them() {
    let (server, client) = start().await;
    populate(&server.root);
    let listed = client.list_files("", 1).await.expect("lists the root");
    assert_eq!(listed.path, "");
    assert!(!listed.truncated);
    let paths: Vec<&str> = listed.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["a.txt", "b.dir", "link", "sub"]);
    let a = &listed.entries[0];
    assert_eq!(
        (a.name.as_str(), a.kind, a.size, a.mode),
        ("a.txt", FileKind::File, 3, 0o644)
    );
    assert_eq!(a.target, None);
    let stamp = a.modified_at.as_bytes();
    assert!(
        stamp.len() == 24 && stamp[10] == b'T' && stamp[19] == b'.' && stamp[23] == b'Z',
        "RFC 3339 UTC with milliseconds: {}",
        a.modified_at
    );
    let link = &listed.entries[2];
    assert_eq!(
        (link.kind, link.target.as_deref()),
        (FileKind::Symlink, Some("sub"))
    );
    assert_eq!(listed.entries[3].kind, FileKind::Dir);
    let same = client.list_files(".", 1).await.expect("lists the root");
    assert_eq!(same, listed);
}

#[tokio::test]
async fn a_deeper_listing_is_one_flat_list_sorted_by_path() {
    let (server, client) = start().await;
    populate(&server.root);
    let listed = client.list_files("", 3).await.expect("lists");
    let paths: Vec<&str> = listed.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "a.txt",
            "b.dir",
            "link",
            "sub",
            "sub/deeper",
            "sub/deeper/more",
            "sub/deeper/x.txt",
            "sub/inner.txt",
        ]
    );
    let below = client
        .list_files(&server.path("sub/deeper"), 1)
        .await
        .expect("lists an absolute path");
    assert_eq!(below.path, "sub/deeper");
    let paths: Vec<&str> = below.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["sub/deeper/more", "sub/deeper/x.txt"]);
}

#[tokio::test]
async fn bad_listings_get_a_code() {
    let (server, client) = start().await;
    populate(&server.root);
    std::os::unix::fs::symlink("/etc", server.root.join("out")).expect("link");
    let cases = [
        ("", 0, 400, "INVALID_REQUEST_BODY"),
        ("", 6, 400, "INVALID_REQUEST_BODY"),
        ("a.txt", 1, 409, "NOT_A_DIRECTORY"),
        ("missing", 1, 404, "FILE_NOT_FOUND"),
        ("..", 1, 403, "PATH_ESCAPE"),
        ("/etc", 1, 403, "PATH_ESCAPE"),
        ("out", 1, 403, "PATH_ESCAPE"),
    ];
    for (path, depth, status, code) in cases {
        let listed = client.list_files(path, depth).await;
        assert_refused(listed, status, code, &format!("{path:?} depth {depth}"));
    }
}

#[tokio::test]
async fn a_link_out_of_the_root_is_refused_for_download_and_listing() {
    let (server, client) = start().await;
    std::os::unix::fs::symlink("/etc", server.root.join("out")).expect("link");
    let downloaded = client.download("out/passwd", None).await;
    assert_refused(downloaded, 403, "PATH_ESCAPE", "download through the link");
    let listed = client.list_files("out", 1).await;
    assert_refused(listed, 403, "PATH_ESCAPE", "list through the link");
}

#[tokio::test]
async fn a_fifo_is_refused_at_once() {
    let (server, client) = start().await;
    mkfifo(&server.root.join("fifo"));
    let downloaded = tokio::time::timeout(Duration::from_secs(5), client.download("fifo", None))
        .await
        .expect("answered without opening the FIFO");
    assert_refused(downloaded, 403, "NOT_REGULAR_FILE", "download of a FIFO");
}

#[tokio::test]
async fn an_upload_creates_then_replaces_and_says_which() {
    let (server, client) = start().await;
    let created = client
        .upload("new/dir/notes.txt", "first\n".into())
        .await
        .expect("created");
    assert!(created.created);
    assert_eq!(created.written.path, "new/dir/notes.txt");
    assert_eq!(created.written.size, 6);
    let absolute = server.path("new/dir/notes.txt");
    let replaced = client
        .upload(&absolute, "second, longer\n".into())
        .await
        .expect("replaced");
    assert!(!replaced.created);
    assert_eq!(replaced.written.path, absolute);
    assert_eq!(replaced.written.size, 15);
    assert_eq!(names_in(&server.root.join("new/dir")), ["notes.txt"]);
    let whole = client
        .download("new/dir/notes.txt", None)
        .await
        .expect("200");
    assert_eq!(body_of(whole).await, b"second, longer\n");
}

/// Waits until execd writes an upload of `target.txt` into its temporary file beside it.
async fn until_writing(root: &Path) {
    eventually("execd to start writing the temporary file", || {
        names_in(root).len() == 2
    })
    .await;
}

/// Waits until the temporary file is gone; `target.txt` still holds `old`.
async fn until_cleaned_up(root: &Path) {
    eventually("the temporary file to be removed", || {
        names_in(root) == ["target.txt"]
    })
    .await;
    let content = std::fs::read(root.join("target.txt")).expect("reads");
    assert_eq!(content, b"old");
}

#[tokio::test]
async fn an_upload_whose_body_fails_leaves_the_old_file_and_no_temp_file() {
    let (server, client) = start().await;
    std::fs::write(server.root.join("target.txt"), "old").expect("file");
    // The body's first part goes out at once; the failure only once execd is writing it.
    let (fail, failed) = tokio::sync::oneshot::channel::<()>();
    let first = futures_util::stream::once(async {
        Ok::<_, std::io::Error>(&b"the first part of the new content"[..])
    });
    let then_fail = futures_util::stream::once(async {
        let _ = failed.await;
        Err(std::io::Error::other("the client gave up"))
    });
    let body = reqwest::Body::wrap_stream(first.chain(then_fail));
    let upload = tokio::spawn(async move { client.upload("target.txt", body).await });
    until_writing(&server.root).await;
    fail.send(()).expect("the body is still being sent");
    within("the upload to fail", upload)
        .await
        .expect("the upload task ends")
        .expect_err("the upload broke off");
    until_cleaned_up(&server.root).await;
}

#[tokio::test]
async fn an_upload_whose_client_hangs_up_leaves_the_old_file_and_no_temp_file() {
    let (server, _client) = start().await;
    std::fs::write(server.root.join("target.txt"), "old").expect("file");
    let addr = server.base.trim_start_matches("http://").to_owned();
    let mut socket = std::net::TcpStream::connect(&addr).expect("connects");
    let head = format!(
        "PUT /v1/files?path=target.txt HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 1000\r\n\r\n"
    );
    socket.write_all(head.as_bytes()).expect("sends the head");
    socket.write_all(b"0123456789").expect("sends 10 bytes");
    // Once execd is reading the body, the client hangs up.
    until_writing(&server.root).await;
    drop(socket);
    until_cleaned_up(&server.root).await;
}

#[tokio::test]
async fn make_dir_creates_parents_and_accepts_an_existing_directory() {
    let (server, client) = start().await;
    client.make_dir("a/b/c").await.expect("created");
    assert!(server.root.join("a/b/c").is_dir());
    client.make_dir("a/b").await.expect("already there is fine");
    std::fs::write(server.root.join("a/file"), "x").expect("file");
    let made = client.make_dir("a/file").await;
    assert_refused(made, 409, "FILE_EXISTS", "mkdir of a file");
    let made = client.make_dir("a/file/below").await;
    assert_refused(made, 409, "NOT_A_DIRECTORY", "mkdir below a file");
}

fn move_request(from: &str, to: &str, overwrite: bool) -> MoveRequest {
    MoveRequest {
        from: from.into(),
        to: to.into(),
        overwrite,
    }
}

#[tokio::test]
async fn a_move_replaces_an_existing_target_only_when_asked() {
    let (server, client) = start().await;
    std::fs::write(server.root.join("from.txt"), "new").expect("file");
    std::fs::write(server.root.join("to.txt"), "old").expect("file");
    let moved = client
        .move_file(&move_request("from.txt", "to.txt", false))
        .await;
    assert_refused(moved, 409, "FILE_EXISTS", "move onto a file");
    let to = || std::fs::read(server.root.join("to.txt")).expect("reads");
    assert_eq!(to(), b"old");
    client
        .move_file(&move_request("from.txt", "to.txt", true))
        .await
        .expect("moved");
    assert_eq!(names_in(&server.root), ["to.txt"]);
    assert_eq!(to(), b"new");
    client
        .move_file(&move_request("to.txt", "made/for/it.txt", false))
        .await
        .expect("moved with the parents created");
    assert!(server.root.join("made/for/it.txt").is_file());
}

#[tokio::test]
async fn bad_moves_get_a_code_and_change_nothing() {
    let (server, client) = start().await;
    std::fs::create_dir(server.root.join("d")).expect("dir");
    std::fs::write(server.root.join("f"), "x").expect("file");
    let root = server.path("");
    let cases = [
        (".", "elsewhere", 400, "INVALID_PATH"),
        ("f", ".", 400, "INVALID_PATH"),
        ("f", root.as_str(), 400, "INVALID_PATH"),
        ("d", "d/sub/d", 400, "INVALID_PATH"),
        ("missing", "x", 404, "FILE_NOT_FOUND"),
        ("f", "../outside", 403, "PATH_ESCAPE"),
        ("", "x", 400, "INVALID_PATH"),
    ];
    for (from, to, status, code) in cases {
        let moved = client.move_file(&move_request(from, to, false)).await;
        assert_refused(moved, status, code, &format!("{from} -> {to}"));
    }
    assert_eq!(names_in(&server.root), ["d", "f"]);
    assert!(names_in(&server.root.join("d")).is_empty());
}

#[tokio::test]
async fn a_non_empty_directory_is_removed_only_recursively() {
    let (server, client) = start().await;
    std::fs::create_dir_all(server.root.join("full/sub")).expect("dirs");
    std::fs::write(server.root.join("full/sub/f"), "x").expect("file");
    std::fs::create_dir(server.root.join("empty")).expect("dir");
    std::fs::write(server.root.join("file"), "x").expect("file");
    let deleted = client.delete_file("full", false).await;
    assert_refused(deleted, 409, "DIR_NOT_EMPTY", "delete of a full directory");
    client.delete_file("full", true).await.expect("removed");
    client.delete_file("empty", false).await.expect("removed");
    client.delete_file("file", false).await.expect("removed");
    assert!(names_in(&server.root).is_empty());
    let cases = [
        ("file", 404, "FILE_NOT_FOUND"),
        (".", 400, "INVALID_PATH"),
        ("", 400, "INVALID_PATH"),
        ("../x", 403, "PATH_ESCAPE"),
    ];
    for (path, status, code) in cases {
        let deleted = client.delete_file(path, true).await;
        assert_refused(deleted, status, code, &format!("delete {path:?}"));
    }
}

#[tokio::test]
async fn removing_links_never_touches_what_they_point_to() {
    let (server, client) = start().await;
    let outside = tempfile::tempdir().expect("outside dir");
    std::fs::write(outside.path().join("precious"), "keep").expect("file");
    std::os::unix::fs::symlink(outside.path(), server.root.join("link")).expect("link");
    std::fs::create_dir(server.root.join("tree")).expect("dir");
    std::os::unix::fs::symlink(outside.path(), server.root.join("tree/inner-link")).expect("link");
    client
        .delete_file("link", false)
        .await
        .expect("link removed");
    client
        .delete_file("tree", true)
        .await
        .expect("tree removed");
    assert!(names_in(&server.root).is_empty());
    assert_eq!(names_in(outside.path()), ["precious"]);
}

#[tokio::test]
async fn nul_bytes_and_overlong_paths_are_invalid_everywhere() {
    let (_server, client) = start().await;
    let long = "d/".repeat(2500);
    for path in ["a\0b", long.as_str()] {
        let shown = &path[..path.len().min(8)];
        let what = |route: &str| format!("{route} of {shown:?}");
        let downloaded = client.download(path, None).await;
        assert_refused(downloaded, 400, "INVALID_PATH", &what("download"));
        let listed = client.list_files(path, 1).await;
        assert_refused(listed, 400, "INVALID_PATH", &what("list"));
        let uploaded = client.upload(path, "x".into()).await;
        assert_refused(uploaded, 400, "INVALID_PATH", &what("upload"));
        let made = client.make_dir(path).await;
        assert_refused(made, 400, "INVALID_PATH", &what("mkdir"));
        let deleted = client.delete_file(path, false).await;
        assert_refused(deleted, 400, "INVALID_PATH", &what("delete"));
        let moved = client.move_file(&move_request(path, "x", false)).await;
        assert_refused(moved, 400, "INVALID_PATH", &what("move"));
    }
}

/// Reads the feed until every path in `expected` was reported; returns everything reported.
async fn until_reported(
    feed: &mut futures_util::stream::BoxStream<
        'static,
        Result<warren_protocol::files::FileChanges, ClientError>,
    >,
    expected: &[&str],
) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    within(&format!("the feed to report {expected:?}"), async {
        while !expected.iter().all(|path| seen.contains(*path)) {
            let changes = feed
                .next()
                .await
                .expect("the feed goes on")
                .expect("a line");
            seen.extend(changes.paths);
        }
    })
    .await;
    seen
}

#[tokio::test]
async fn the_feed_reports_new_files_and_new_directories_with_their_contents() {
    let (server, client) = start().await;
    std::fs::create_dir(server.root.join("old")).expect("dir");
    let mut feed = client.watch_files().await.expect("watching");
    std::fs::write(server.root.join("a.txt"), "a").expect("file");
    std::fs::create_dir(server.root.join("new")).expect("dir");
    std::fs::write(server.root.join("new/inner.txt"), "inner").expect("file");
    std::fs::write(server.root.join("old/deep.txt"), "deep").expect("file");
    until_reported(
        &mut feed,
        &["a.txt", "new", "new/inner.txt", "old/deep.txt"],
    )
    .await;
}

#[tokio::test]
async fn the_feed_reports_an_upload_by_its_name_not_its_temp_file() {
    let (_server, client) = start().await;
    let mut feed = client.watch_files().await.expect("watching");
    client
        .upload("up.txt", "content".into())
        .await
        .expect("uploaded");
    let seen = until_reported(&mut feed, &["up.txt"]).await;
    assert_eq!(seen, BTreeSet::from(["up.txt".to_owned()]));
}

#[tokio::test]
async fn an_open_feed_ends_when_execd_stops() {
    let root = tempfile::tempdir().expect("root");
    let config = warren_execd::Config {
        root: root.path().to_path_buf(),
        listen: "127.0.0.1:0".parse().expect("address"),
        ..warren_execd::Config::default()
    };
    let (listener, url) = warren_execd::bind(&config.listen).await.expect("binds");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(warren_execd::serve(
        warren_execd::Execd::new(config),
        listener,
        async {
            let _ = stopped.await;
        },
    ));
    let client = ExecdClient::new(&url, None).expect("client");
    let mut feed = client.watch_files().await.expect("watching");
    stop.send(()).expect("execd is serving");
    within("execd to stop while a feed is open", served)
        .await
        .expect("the server task ends")
        .expect("serves until stopped");
    assert!(within("the feed to end", feed.next()).await.is_none());
}

#[tokio::test]
async fn the_host_root_cannot_be_watched() {
    let server = Server::start_with(|config| config.root = "/".into()).await;
    let client = ExecdClient::new(&server.base, None).expect("client");
    let watched = client.watch_files().await.map(drop);
    assert_refused(watched, 503, "WATCH_UNAVAILABLE", "a watch of /");
}
