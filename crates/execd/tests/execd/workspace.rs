//! Workspace snapshots and the hands' identity against real execds in this process, on
//! 127.0.0.1:0 and on Unix sockets, through the typed client the gateway uses: a snapshot of
//! one workspace restored into another execd's empty root gives the same files; a non-empty
//! root, a hostile archive and a cut stream are refused with their codes and leave the root as
//! it was; the identity route and the nonce check; `--listen unix:` replacing a stale socket.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use futures_util::TryStreamExt;
use warren_execd::{Config, Execd, ListenAddr};
use warren_execd_client::Tree;
use warren_execd_client::{ClientError, ExecdClient};

use crate::client_answers::{assert_error, assert_refused};

/// An execd serving `root`, on `listen`, with `nonce` if given; the client of it.
async fn start(root: &Path, listen: ListenAddr, nonce: Option<&str>) -> ExecdClient {
    serve(Config {
        root: root.to_path_buf(),
        listen,
        hands_nonce: nonce.map(str::to_owned),
        ..Config::default()
    })
    .await
}

/// An execd with `config`; the client of it.
async fn serve(config: Config) -> ExecdClient {
    let (listener, listening_on) = warren_execd::bind(&config.listen).await.expect("binds");
    let execd = Execd::new(config);
    tokio::spawn(async move {
        warren_execd::serve(execd, listener, std::future::pending())
            .await
            .expect("serves");
    });
    ExecdClient::new(&listening_on, None).expect("client")
}

fn tcp() -> ListenAddr {
    "127.0.0.1:0".parse().expect("address")
}

fn unix(dir: &Path) -> ListenAddr {
    ListenAddr::Unix(dir.join("execd.sock"))
}

/// `path → (kind, mode, content or link target)` of the tree beneath `root`.
fn tree(root: &Path) -> BTreeMap<String, (char, u32, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("lists") {
            let path = entry.expect("entry").path();
            let relative = path
                .strip_prefix(root)
                .expect("beneath")
                .display()
                .to_string();
            let metadata = std::fs::symlink_metadata(&path).expect("lstat");
            let mode = metadata.mode() & 0o777;
            let value = if metadata.file_type().is_symlink() {
                let target = std::fs::read_link(&path).expect("readlink");
                ('l', 0, target.into_os_string().into_encoded_bytes())
            } else if metadata.is_dir() {
                stack.push(path);
                ('d', mode, Vec::new())
            } else {
                ('f', mode, std::fs::read(&path).expect("reads"))
            };
            out.insert(relative, value);
        }
    }
    out
}

/// A workspace worth restoring: nested and empty directories, an executable, a symlink, and
/// 3 MiB that does not compress (more than a default body limit would let through).
fn populate(root: &Path) {
    std::fs::create_dir_all(root.join("src/nested")).expect("mkdir");
    std::fs::create_dir(root.join("empty")).expect("mkdir");
    std::fs::write(root.join("src/main.rs"), "fn main() {}\n").expect("writes");
    std::fs::write(root.join("src/nested/notes café.txt"), "ünïcode").expect("writes");
    std::fs::write(root.join("run.sh"), "#!/bin/sh\necho hi\n").expect("writes");
    std::fs::set_permissions(root.join("run.sh"), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    std::os::unix::fs::symlink("src/main.rs", root.join("main-link")).expect("symlink");
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let noise: Vec<u8> = (0..3 << 20)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    std::fs::write(root.join("noise.bin"), noise).expect("writes");
}

async fn snapshot_bytes(client: &ExecdClient) -> Vec<u8> {
    let stream = client.snapshot().await.expect("snapshot starts");
    let chunks: Vec<bytes::Bytes> = stream.try_collect().await.expect("snapshot completes");
    chunks.concat()
}

fn is_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).expect("lists").next().is_none()
}

#[tokio::test]
async fn snapshot_streamed_into_restore_on_a_unix_socket_gives_identical_files() {
    let (source, target, sockets) = (tempdir(), tempdir(), tempdir());
    populate(source.path());
    let from = start(source.path(), tcp(), None).await;
    let to = start(target.path(), unix(sockets.path()), None).await;
    // Piped chunk by chunk, as the gateway restores a stored one from disk.
    let stream = from.snapshot().await.expect("snapshot starts");
    let restored = to
        .restore(reqwest::Body::wrap_stream(stream))
        .await
        .expect("restores");
    assert_eq!(restored.files, 4);
    assert_eq!(
        restored.bytes,
        std::fs::metadata(source.path().join("noise.bin"))
            .expect("noise")
            .len()
            + 13
            + 8
            + 19
    );
    assert_eq!(tree(source.path()), tree(target.path()));
}

#[tokio::test]
async fn snapshot_answers_zstd_and_restores_over_tcp() {
    let (source, target) = (tempdir(), tempdir());
    populate(source.path());
    let from = start(source.path(), tcp(), None).await;
    let to = start(target.path(), tcp(), None).await;
    let archive = snapshot_bytes(&from).await;
    assert_eq!(&archive[..4], &[0x28, 0xb5, 0x2f, 0xfd], "a zstd frame");
    to.restore(archive.into()).await.expect("restores");
    assert_eq!(tree(source.path()), tree(target.path()));
}

/// `?tree=home`: the agent's home (`--home`) is snapshotted and restored on its own, beside
/// the workspace; an execd without `--home`, or an unknown tree, answers 400.
#[tokio::test]
async fn the_agent_home_is_a_second_tree_and_an_unknown_tree_is_400() {
    let (workspace, home, target_home) = (tempdir(), tempdir(), tempdir());
    std::fs::write(workspace.path().join("w.txt"), "workspace").expect("writes");
    std::fs::create_dir_all(home.path().join(".agent/sessions")).expect("mkdir");
    std::fs::write(home.path().join(".agent/sessions/s1.jsonl"), "{}\n").expect("writes");
    let start_with_home = |root: &Path, home: &Path| {
        serve(Config {
            root: root.to_path_buf(),
            home: Some(home.to_path_buf()),
            listen: tcp(),
            ..Config::default()
        })
    };
    let from = start_with_home(workspace.path(), home.path()).await;
    let stream = from
        .snapshot_of(Tree::Home)
        .await
        .expect("home snapshot starts");
    let chunks: Vec<bytes::Bytes> = stream.try_collect().await.expect("completes");
    let archive = chunks.concat();
    let entries = warren_snapshot::list(std::io::Cursor::new(&archive)).expect("lists");
    let paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
    assert!(paths.contains(&".agent/sessions/s1.jsonl"), "{paths:?}");
    assert!(
        !paths.contains(&"w.txt"),
        "the home, not the workspace: {paths:?}"
    );

    let other_workspace = tempdir();
    let to = start_with_home(other_workspace.path(), target_home.path()).await;
    to.restore_to(Tree::Home, archive.clone().into())
        .await
        .expect("restores the home");
    assert_eq!(tree(home.path()), tree(target_home.path()));
    assert!(
        is_empty(other_workspace.path()),
        "the workspace is untouched"
    );

    // Without --home there is no home tree; a name nobody knows is refused too.
    let plain = start(tempdir().path(), tcp(), None).await;
    let refused = match plain.snapshot_of(Tree::Home).await {
        Ok(_) => panic!("no home without --home"),
        Err(error) => error,
    };
    assert_error(&refused, 400, "INVALID_REQUEST_BODY", "the home tree");
    let http = reqwest::Client::new();
    let answer = http
        .get(format!(
            "{}/v1/workspace/snapshot?tree=etc",
            from.base_url()
        ))
        .send()
        .await
        .expect("answers");
    assert_eq!(answer.status(), 400);
}

#[tokio::test]
async fn restore_into_a_non_empty_root_is_409_and_keeps_it() {
    let (source, target) = (tempdir(), tempdir());
    populate(source.path());
    std::fs::write(target.path().join("mine.txt"), "keep me").expect("writes");
    let from = start(source.path(), tcp(), None).await;
    let to = start(target.path(), tcp(), None).await;
    let archive = snapshot_bytes(&from).await;
    let refused = to.restore(archive.into()).await;
    assert_refused(refused, 409, "WORKSPACE_NOT_EMPTY", "non-empty root");
    assert_eq!(tree(target.path()).len(), 1);
}

/// A tar with `dir/`, `dir/ok` and then `name` (raw header bytes, so no builder check stops
/// a hostile name), zstd-compressed.
fn archive_ending_with(name: &str) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, kind, data) in [
        ("dir", tar::EntryType::Directory, &b""[..]),
        ("dir/ok", tar::EntryType::Regular, b"fine"),
        (name, tar::EntryType::Regular, b"escaped"),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(0o755);
        header.set_size(data.len() as u64);
        header.as_gnu_mut().expect("gnu").name[..path.len()].copy_from_slice(path.as_bytes());
        header.set_cksum();
        builder.append(&header, data).expect("appends");
    }
    zstd::encode_all(&builder.into_inner().expect("tar")[..], 3).expect("compresses")
}

#[tokio::test]
async fn hostile_and_cut_archives_are_400_and_leave_the_root_empty() {
    let outer = tempdir();
    let root = outer.path().join("workspace");
    std::fs::create_dir(&root).expect("mkdir");
    let client = start(&root, tcp(), None).await;
    let refused = client.restore(archive_ending_with("../x").into()).await;
    assert_refused(refused, 400, "SNAPSHOT_UNSAFE_ENTRY", "hostile archive");
    assert!(is_empty(&root), "root touched");
    assert!(!outer.path().join("x").exists(), "wrote outside the root");

    let whole = archive_ending_with("fine-too");
    let refused = client
        .restore(whole[..whole.len() / 2].to_vec().into())
        .await;
    assert_refused(refused, 400, "SNAPSHOT_CORRUPT", "cut archive");
    assert!(is_empty(&root), "root touched");

    let restored = client
        .restore(whole.into())
        .await
        .expect("the whole one restores");
    assert_eq!((restored.files, restored.bytes), (2, 4 + 7));
}

#[tokio::test]
async fn identity_reports_the_given_nonce_and_the_start_time() {
    let root = tempdir();
    let before = chrono::Utc::now() - chrono::Duration::seconds(1);
    let client = start(root.path(), tcp(), Some("nonce-1234")).await;
    let identity = client.identity().await.expect("identity");
    assert_eq!(identity.nonce, "nonce-1234");
    let started_at = chrono::DateTime::parse_from_rfc3339(&identity.started_at).expect("RFC 3339");
    assert!(
        started_at >= before && started_at <= chrono::Utc::now(),
        "{started_at}"
    );
    // Without --hands-nonce each execd makes its own.
    let (a, b) = (
        start(root.path(), tcp(), None)
            .await
            .identity()
            .await
            .expect("a"),
        start(root.path(), tcp(), None)
            .await
            .identity()
            .await
            .expect("b"),
    );
    assert!(a.nonce.len() >= 16 && a.nonce != b.nonce, "{a:?} {b:?}");
}

#[tokio::test]
async fn another_nonce_is_refused_with_409_on_every_route_and_the_same_one_passes() {
    let root = tempdir();
    let plain = start(root.path(), tcp(), Some("right")).await;
    let wrong = plain.clone().with_nonce("wrong");
    for (route, result) in [
        ("ping", wrong.ping().await.err()),
        ("identity", wrong.identity().await.err()),
        ("files", wrong.read_file("anything").await.err()),
    ] {
        let error = result.unwrap_or_else(|| panic!("{route}: served with the wrong nonce"));
        assert_error(&error, 409, "HANDS_IDENTITY_MISMATCH", route);
        assert!(error.to_string().contains("another sandbox"), "{error}");
    }
    let right = plain.clone().with_nonce("right");
    right.ping().await.expect("the right nonce passes");
    assert_eq!(right.identity().await.expect("identity").nonce, "right");
    plain.ping().await.expect("no nonce header passes");
}

#[tokio::test]
async fn the_token_is_checked_before_the_nonce() {
    let root = tempdir();
    let config = Config {
        root: root.path().to_path_buf(),
        access_token: Some("token".into()),
        hands_nonce: Some("right".into()),
        ..Config::default()
    };
    let (listener, listening_on) = warren_execd::bind(&tcp()).await.expect("binds");
    tokio::spawn(warren_execd::serve(
        Execd::new(config),
        listener,
        std::future::pending(),
    ));
    let stranger = ExecdClient::new(&listening_on, Some("guess".into()))
        .expect("client")
        .with_nonce("wrong");
    let error = stranger.identity().await.expect_err("no token");
    assert!(matches!(error, ClientError::Unauthorized { .. }), "{error}");
    let known = ExecdClient::new(&listening_on, Some("token".into()))
        .expect("client")
        .with_nonce("wrong");
    let error = known.identity().await.expect_err("wrong nonce");
    assert_eq!(error.code(), Some("HANDS_IDENTITY_MISMATCH"));
}

#[tokio::test]
async fn a_unix_socket_replaces_a_stale_one_is_private_and_serves_the_client() {
    let (root, sockets) = (tempdir(), tempdir());
    let path = sockets.path().join("execd.sock");
    // A socket file a killed execd left behind.
    drop(std::os::unix::net::UnixListener::bind(&path).expect("stale socket"));
    let client = start(root.path(), ListenAddr::Unix(path.clone()), None).await;
    assert_eq!(client.base_url(), format!("unix:{}", path.display()));
    let mode = std::fs::metadata(&path).expect("socket").mode() & 0o777;
    assert_eq!(mode, 0o600);
    client.ping().await.expect("ping over the socket");
    client
        .write_file("hello.txt", "over a socket")
        .await
        .expect("writes");
    assert_eq!(
        client.read_file("hello.txt").await.expect("reads"),
        "over a socket"
    );

    // Anything but a socket at the path is left alone.
    let regular = sockets.path().join("not-a-socket");
    std::fs::write(&regular, "data").expect("writes");
    let refused = warren_execd::bind(&ListenAddr::Unix(regular.clone())).await;
    assert!(refused.is_err(), "bound over a regular file");
    assert_eq!(std::fs::read_to_string(&regular).expect("reads"), "data");
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

#[tokio::test]
async fn a_snapshot_body_aborted_midway_is_an_error_for_the_client_not_a_short_archive() {
    // What execd's snapshot route does when packing fails midway: some bytes, then an error
    // item, which makes the server cut the chunked body.
    // The pause lets the head and the first chunk go out before the error.
    async fn aborted() -> axum::body::Body {
        let chunks = futures_util::stream::unfold(0, |step| async move {
            match step {
                0 => Some((
                    Ok(bytes::Bytes::from_static(b"\x28\xb5\x2f\xfd partial")),
                    1,
                )),
                1 => {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    Some((Err(std::io::Error::other("pack failed")), 2))
                }
                _ => None,
            }
        });
        axum::body::Body::from_stream(chunks)
    }
    let router = axum::Router::new().route("/v1/workspace/snapshot", axum::routing::get(aborted));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(warren_http::serve(
        listener,
        router,
        warren_http::ServeConfig::default(),
        std::future::pending(),
    ));
    let client = ExecdClient::new(&format!("http://{addr}"), None).expect("client");
    let stream = client.snapshot().await.expect("the answer starts with 200");
    let collected: Result<Vec<bytes::Bytes>, ClientError> = stream.try_collect().await;
    let error = collected.expect_err("a cut body is an error");
    assert!(
        error.to_string().contains("snapshot stream broken"),
        "{error}"
    );
}

/// The gateway's side of a rewind of remote hands, played by a checkpoint store in the test: a
/// patch against the checkpoint just taken turns execd's root into the earlier checkpoint,
/// leaving what did not change in place; a cut one is 400 and changes nothing.
#[tokio::test]
async fn a_patch_from_a_checkpoint_store_turns_the_root_into_the_earlier_checkpoint() {
    let (root, store_dir, expected) = (tempdir(), tempdir(), tempdir());
    populate(root.path());
    let store = warren_checkpoint::CheckpointStore::new(
        std::sync::Arc::new(warren_checkpoint::LocalDisk::open(store_dir.path()).expect("opens")),
        warren_checkpoint::Config::default(),
    );
    let (earlier, _) = store
        .take(root.path(), None)
        .expect("takes the earlier checkpoint");
    std::fs::write(root.path().join("src/main.rs"), "fn main() { todo!() }\n").expect("writes");
    std::fs::remove_file(root.path().join("run.sh")).expect("rm");
    std::fs::create_dir_all(root.path().join("added/deeper")).expect("mkdir");
    std::fs::write(root.path().join("added/deeper/new.txt"), "new").expect("writes");
    let (current, _) = store
        .take(root.path(), Some(&earlier))
        .expect("takes the current checkpoint");
    let mut patch = Vec::new();
    let sent = store
        .patch(&earlier, &current, &mut patch)
        .expect("makes the patch");
    assert_eq!(sent.n_files_sent, 2, "{sent:?}");
    let noise_inode = std::fs::metadata(root.path().join("noise.bin"))
        .expect("stats")
        .ino();
    let client = start(root.path(), tcp(), None).await;
    let bounded = std::time::Duration::from_secs(30);

    let cut = patch[..patch.len() - 1].to_vec();
    let refused = tokio::time::timeout(bounded, client.patch(Tree::Workspace, cut.into()))
        .await
        .expect("execd answers the cut patch in time");
    let now = tree(root.path());
    assert_refused(refused, 400, "PATCH_CORRUPT", "a cut patch");
    assert_eq!(tree(root.path()), now, "the root is unchanged");

    let applied = tokio::time::timeout(bounded, client.patch(Tree::Workspace, patch.into()))
        .await
        .expect("execd answers the patch in time")
        .expect("applies");
    assert_eq!(
        (
            applied.files_written,
            applied.bytes_written,
            applied.removed
        ),
        (2, sent.bytes_sent, 3)
    );
    store
        .restore(&earlier, expected.path(), None)
        .expect("restores the earlier checkpoint");
    assert_eq!(tree(root.path()), tree(expected.path()));
    assert_eq!(
        std::fs::metadata(root.path().join("noise.bin"))
            .expect("stats")
            .ino(),
        noise_inode,
        "an unchanged file stays in place"
    );
}

/// Sets the mtime of every file and directory beneath `root` to one moment in 2020, so the
/// checkpoint taken next trusts them (the quick check distrusts mtimes near the walk).
fn age(root: &Path) {
    let long_ago =
        std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_600_000_000);
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("lists") {
            let path = entry.expect("entry").path();
            let metadata = std::fs::symlink_metadata(&path).expect("lstat");
            if metadata.is_dir() {
                stack.push(path.clone());
            }
            if metadata.is_dir() || metadata.is_file() {
                std::fs::File::open(&path)
                    .and_then(|f| f.set_modified(long_ago))
                    .expect("sets the mtime");
            }
        }
    }
}

/// The changes stream of `tree` given `known`, whole, within a bounded wait.
async fn changes_bytes(
    client: &ExecdClient,
    tree: Tree,
    known: &warren_checkpoint::Known,
) -> Vec<u8> {
    let collected = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        let stream = client.changes(tree, known).await.expect("changes start");
        stream.try_collect::<Vec<bytes::Bytes>>().await
    })
    .await
    .expect("the changes stream ends in time");
    collected.expect("the changes stream completes").concat()
}

/// The gateway's side of a checkpoint of remote hands, played by a checkpoint store in the
/// test: the stream execd sends makes the checkpoint a local take of the same tree makes; the
/// next one carries only the file that changed.
#[tokio::test]
async fn checkpoint_changes_from_execd_make_the_checkpoint_a_local_take_makes() {
    let (root, store_dir) = (tempdir(), tempdir());
    populate(root.path());
    age(root.path());
    let store = warren_checkpoint::CheckpointStore::new(
        std::sync::Arc::new(warren_checkpoint::LocalDisk::open(store_dir.path()).expect("opens")),
        warren_checkpoint::Config::default(),
    );
    let client = start(root.path(), tcp(), None).await;

    let stream = changes_bytes(&client, Tree::Workspace, &Default::default()).await;
    let (first, stats) = store
        .take_streamed(&mut &stream[..], None, serde_json::json!({"turn": 1}))
        .expect("takes the streamed checkpoint");
    let (local, _) = store.take(root.path(), None).expect("takes locally");
    assert_eq!(first.entries, local.entries, "entries and chunk lists");
    assert_eq!(first.summary, local.summary);
    assert_eq!(stats.files, 4);
    assert_eq!(first.known().len(), 4, "every aged file is trusted");

    std::fs::write(root.path().join("src/main.rs"), "fn main() { changed() }\n").expect("writes");
    let stream = changes_bytes(&client, Tree::Workspace, &first.known()).await;
    assert!(
        stream.len() < 4096,
        "{} bytes: the 3 MiB file travelled again",
        stream.len()
    );
    let (second, stats) = store
        .take_streamed(&mut &stream[..], Some(&first), serde_json::Value::Null)
        .expect("takes the next one");
    assert_eq!((stats.files_changed, stats.bytes_read), (1, 24));
    let mut content = Vec::new();
    store
        .read_file(&second, "src/main.rs", 0..24, &mut content)
        .expect("reads");
    assert_eq!(content, b"fn main() { changed() }\n");
}

/// The route's answers other than a stream: its content type, the home tree, and 400 for an
/// unknown tree or a body that is not `Known`, 413 over the body limit.
#[tokio::test]
async fn checkpoint_changes_answer_their_content_type_and_refuse_bad_requests() {
    let (workspace, home) = (tempdir(), tempdir());
    std::fs::write(workspace.path().join("w.txt"), "workspace").expect("writes");
    std::fs::write(home.path().join("h.txt"), "home").expect("writes");
    let client = serve(Config {
        root: workspace.path().to_path_buf(),
        home: Some(home.path().to_path_buf()),
        listen: tcp(),
        ..Config::default()
    })
    .await;
    let stream = changes_bytes(&client, Tree::Home, &Default::default()).await;
    let store_dir = tempdir();
    let store = warren_checkpoint::CheckpointStore::new(
        std::sync::Arc::new(warren_checkpoint::LocalDisk::open(store_dir.path()).expect("opens")),
        warren_checkpoint::Config::default(),
    );
    let (manifest, _) = store
        .take_streamed(&mut &stream[..], None, serde_json::Value::Null)
        .expect("takes");
    let paths: Vec<&str> = manifest.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["h.txt"], "the home, not the workspace");

    let http = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(60))
        .build()
        .expect("client");
    let url = |query: &str| format!("{}/v1/workspace/changes{query}", client.base_url());
    let answer = http
        .post(url(""))
        .json(&serde_json::json!({}))
        .send()
        .await
        .expect("answers");
    assert_eq!(answer.status(), 200);
    assert_eq!(
        answer.headers()[reqwest::header::CONTENT_TYPE],
        warren_checkpoint::CHANGES_CONTENT_TYPE
    );
    for (query, body, status) in [
        ("?tree=etc", serde_json::json!({}), 400),
        ("", serde_json::json!({"files": []}), 400),
        ("", serde_json::json!({"files": {"a": {"size": -1}}}), 400),
        ("", serde_json::json!([]), 400),
    ] {
        let answer = http
            .post(url(query))
            .json(&body)
            .send()
            .await
            .expect("answers");
        assert_eq!(answer.status(), status, "{query} {body}");
        let error: serde_json::Value = answer.json().await.expect("an error body");
        assert_eq!(error["code"], "INVALID_REQUEST_BODY", "{query} {body}");
    }
    let over_the_limit = vec![b' '; 64 * 1024 * 1024 + 1];
    let answer = http
        .post(url(""))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(over_the_limit)
        .send()
        .await
        .expect("answers");
    assert_eq!(answer.status(), 413);
}
