//! `warren gateway --snapshots s3://bucket/prefix` (the real binary, whose environment holds the
//! S3 settings) against an S3 endpoint (moto on loopback): an archived session's files are its
//! newest checkpoint, in the bucket, and download with ranges; a gateway on another data
//! directory that never held them serves and restores them from the bucket; deleting a session
//! deletes its objects, and a delete while the endpoint is down still succeeds; with the
//! endpoint stopped, an archived session still restores (from this replica's copy) and the new
//! checkpoint fails with an `error` event; remote hands' whole-tar snapshots go to the bucket,
//! and once their machine is gone their files are read from it.

use std::path::Path;
use std::process::{Command, Stdio};

use warren_store::objects::{ObjectUrl, Objects};
use warren_test_support::services::S3;

use super::helpers::{EventStream, GatewayProcess, Received, text_of, warren_bin};

const DEVICE: &str = "phone-s3-01";

/// `warren gateway --snapshots s3://<bucket>/warren` with hands that pause and archive
/// quickly, its S3 settings in its environment.
fn start_gateway(data: &Path, s3: &S3, bucket: &str) -> GatewayProcess {
    let args = [
        "--hands-idle-pause",
        "500ms",
        "--hands-archive-after",
        "500ms",
        "--snapshots",
        &format!("s3://{bucket}/warren"),
    ]
    .map(str::to_owned);
    GatewayProcess::start(data, &args, &s3.env())
}

/// A device of `gateway` with a session and its event stream from the start.
async fn session_of(gateway: &GatewayProcess) -> (String, String, EventStream) {
    let token = gateway.register(DEVICE).await;
    let session = gateway.create_session(&token).await;
    let events = gateway.events(&token, &session, None).await;
    (token, session, events)
}

/// [`session_of`] after a turn that wrote the 20-byte `notes.txt` ("hello object storage").
async fn session_with_notes(gateway: &GatewayProcess) -> (String, String, EventStream) {
    let (token, session, mut events) = session_of(gateway).await;
    gateway
        .turn(
            &token,
            &session,
            &mut events,
            "printf 'hello object storage' > notes.txt",
        )
        .await;
    (token, session, events)
}

async fn archived(events: &mut EventStream) {
    events
        .until("the hands archived", |e| {
            e.event == "hands" && e.data["state"] == "archived"
        })
        .await;
}

/// The snapshot object's bytes, read through the object store client; `None` when absent.
async fn object(s3: &S3, bucket: &str, session: &str) -> Option<Vec<u8>> {
    let url = ObjectUrl::parse(&format!("s3://{bucket}/warren")).expect("a valid url");
    let objects = Objects::from_url_with(&url, &s3.env()).expect("objects for moto");
    let name = "snapshot.tar.zst";
    let (size, _) = objects.head(session, name).await.expect("moto answers")?;
    let bytes = objects
        .get_range(session, name, 0..size)
        .await
        .expect("the object reads");
    Some(bytes.to_vec())
}

/// Every key in `bucket` under `warren/sessions/<session>/`, listed with moto's S3 API
/// (`ListObjectsV2`, which moto answers unsigned).
pub(super) async fn keys_of(s3: &S3, bucket: &str, session: &str) -> Vec<String> {
    let listing = reqwest::Client::new()
        .get(format!("{}/{bucket}", s3.endpoint()))
        .query(&[
            ("list-type", "2"),
            ("prefix", &format!("warren/sessions/{session}/")),
        ])
        .send()
        .await
        .expect("moto lists the bucket");
    assert_eq!(listing.status(), 200, "the listing of {bucket}");
    let xml = listing.text().await.expect("the listing's body");
    xml.split("<Key>")
        .skip(1)
        .filter_map(|rest| rest.split_once("</Key>"))
        .map(|(key, _)| key.to_owned())
        .collect()
}

/// `GET files/content?path=notes.txt` with `Range: bytes=6-11`: 206, that range of a 20-byte
/// file, `object`.
async fn assert_range_of_notes(gateway: &GatewayProcess, token: &str, session: &str) {
    let part = gateway
        .request(
            reqwest::Method::GET,
            token,
            &format!("/sessions/{session}/files/content?path=notes.txt"),
        )
        .header("range", "bytes=6-11")
        .send()
        .await
        .expect("answers");
    assert_eq!(part.status(), 206);
    assert_eq!(part.headers()["content-range"], "bytes 6-11/20");
    assert_eq!(part.bytes().await.expect("body").as_ref(), b"object");
}

/// Asserts the turn `seen` restored the hands (`what` says how) and then printed `printed`.
fn assert_restored(seen: &[Received], printed: &str, what: &str) {
    assert!(
        seen.iter()
            .any(|e| e.event == "hands" && e.data["state"] == "restored"),
        "the hands were restored {what}: {seen:#?}"
    );
    assert!(
        text_of(seen).contains(printed),
        "{printed:?} came back {what}: {seen:#?}"
    );
}

/// The keys of the session's checkpoint manifests (`…/checkpoints/workspace/manifests/…`).
async fn manifest_keys(s3: &S3, bucket: &str, session: &str) -> Vec<String> {
    let under = format!("warren/sessions/{session}/checkpoints/workspace/manifests/");
    keys_of(s3, bucket, session)
        .await
        .into_iter()
        .filter(|key| key.starts_with(&under))
        .collect()
}

#[tokio::test]
async fn an_archived_sessions_files_are_its_checkpoint_in_the_bucket_and_serve_ranges() {
    let s3 = S3::start();
    s3.create_bucket("archives");
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let gateway = start_gateway(&data, &s3, "archives");
    let (token, session, mut events) = session_with_notes(&gateway).await;
    archived(&mut events).await;

    let keys = keys_of(&s3, "archives", &session).await;
    assert!(
        !manifest_keys(&s3, "archives", &session).await.is_empty(),
        "the checkpoint is in the bucket: {keys:#?}"
    );
    assert!(
        !keys.iter().any(|key| key.ends_with(".tar.zst")),
        "no whole-tar snapshot of local hands: {keys:#?}"
    );
    let session_dir = data.join("sessions").join(&session);
    assert!(!session_dir.join("workspace").exists(), "archived");
    assert!(!session_dir.join("snapshot.tar.zst").exists());
    assert_range_of_notes(&gateway, &token, &session).await;
}

#[tokio::test]
async fn a_gateway_that_never_held_the_snapshot_serves_and_restores_it_from_the_bucket() {
    let s3 = S3::start();
    s3.create_bucket("shared");
    let dir = tempfile::tempdir().expect("temp dir");
    let (first_data, second_data) = (dir.path().join("first"), dir.path().join("second"));
    let first = start_gateway(&first_data, &s3, "shared");
    let (_, session, mut events) = session_with_notes(&first).await;
    archived(&mut events).await;
    drop(events);
    drop(first);

    // The session's records as a shared store would give them to the second gateway; its
    // checkpoints stay in the bucket only.
    let (from, to) = (
        first_data.join("sessions").join(&session),
        second_data.join("sessions").join(&session),
    );
    std::fs::create_dir_all(&to).expect("the second data dir's session directory");
    for name in ["meta.json", "events.jsonl"] {
        std::fs::copy(from.join(name), to.join(name)).expect("copies the session's records");
    }
    let second = start_gateway(&second_data, &s3, "shared");
    let token = second.register(DEVICE).await;
    let info = second.session_info(&token, &session).await;
    assert_eq!(info["hands"], "archived", "{info}");
    assert!(
        std::fs::read_dir(to.join("checkpoints/workspace/manifests"))
            .map_or(true, |mut manifests| manifests.next().is_none()),
        "the second gateway holds no copy of the checkpoints"
    );

    assert_range_of_notes(&second, &token, &session).await;
    // From the first gateway's last event on: the new turn's events, not the old one's.
    let log = std::fs::read_to_string(to.join("events.jsonl")).expect("the copied log");
    let last: serde_json::Value =
        serde_json::from_str(log.lines().last().expect("an event")).expect("an event line");
    let last_seq = last["seq"].as_u64().expect("a seq");
    let mut events = second.events(&token, &session, Some(last_seq)).await;
    let seen = second
        .turn(&token, &session, &mut events, "cat notes.txt")
        .await;
    assert_restored(&seen, "hello object storage", "on the second gateway");
    assert_eq!(
        std::fs::read_to_string(to.join("workspace").join("notes.txt")).expect("restored file"),
        "hello object storage"
    );
}

#[tokio::test]
async fn deleting_a_session_deletes_its_objects() {
    let s3 = S3::start();
    s3.create_bucket("deletes");
    let dir = tempfile::tempdir().expect("temp dir");
    let gateway = start_gateway(&dir.path().join("data"), &s3, "deletes");
    let (token, session, mut events) = session_of(&gateway).await;
    gateway
        .turn(&token, &session, &mut events, "printf 'to go' > notes.txt")
        .await;
    archived(&mut events).await;
    let keys = keys_of(&s3, "deletes", &session).await;
    assert!(
        keys.iter()
            .any(|key| key.starts_with(&format!("warren/sessions/{session}/checkpoints/"))),
        "the checkpoints are in the bucket before the delete: {keys:#?}"
    );

    let deleted = gateway
        .delete(&token, &format!("/sessions/{session}"))
        .await;
    assert_eq!(deleted.status(), 204);
    assert_eq!(
        keys_of(&s3, "deletes", &session).await,
        Vec::<String>::new(),
        "no object of the deleted session is left"
    );
}

#[tokio::test]
async fn deleting_a_session_while_object_storage_is_down_still_deletes_it() {
    let mut s3 = S3::start();
    s3.create_bucket("down");
    let dir = tempfile::tempdir().expect("temp dir");
    let gateway = start_gateway(&dir.path().join("data"), &s3, "down");
    let (token, session, mut events) = session_of(&gateway).await;
    gateway
        .turn(&token, &session, &mut events, "printf 'to go' > notes.txt")
        .await;
    archived(&mut events).await;

    s3.stop();
    let path = format!("/sessions/{session}");
    let deleted = gateway.delete(&token, &path).await;
    assert_eq!(
        deleted.status(),
        204,
        "the delete does not wait on the bucket"
    );
    assert_eq!(gateway.get(&token, &path).await.status(), 404);
}

#[tokio::test]
async fn with_object_storage_down_an_archive_restores_from_the_copy_and_a_new_checkpoint_is_an_error()
 {
    let mut s3 = S3::start();
    s3.create_bucket("outage");
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let gateway = start_gateway(&data, &s3, "outage");
    let (token, session, mut events) = session_of(&gateway).await;
    gateway
        .turn(
            &token,
            &session,
            &mut events,
            "printf 'version one' > notes.txt",
        )
        .await;
    archived(&mut events).await;
    let stored = manifest_keys(&s3, "outage", &session).await;
    assert!(!stored.is_empty(), "the checkpoint is in the bucket");
    let listed = format!("/sessions/{session}/checkpoints");
    let before = gateway.get_json(&token, &listed).await;

    s3.stop();
    let seen = gateway
        .turn(
            &token,
            &session,
            &mut events,
            "cat notes.txt; printf 'version two' > notes.txt",
        )
        .await;
    assert_restored(&seen, "version one", "from this replica's copy");
    // The turn's checkpoint cannot reach the bucket: its error, the earlier ones kept.
    let failed = events
        .until("the checkpoint's error", |e| {
            e.event == "error" && e.data["code"] == "CHECKPOINT_FAILED"
        })
        .await;
    let error = failed.last().expect("an error event");
    assert!(
        error.data["message"]
            .as_str()
            .is_some_and(|m| m.contains("the earlier ones are kept")),
        "{:?}",
        error.data
    );
    assert_eq!(
        gateway.get_json(&token, &listed).await["checkpoints"],
        before["checkpoints"],
        "listed from the copy while the bucket is down"
    );
}

#[test]
fn a_bad_snapshots_url_is_a_startup_error_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    for url in ["http://bucket/prefix", "s3://", "s3://bucket/../up"] {
        let output = Command::new(warren_bin())
            .args(["gateway", "--listen", "127.0.0.1:0", "--snapshots", url])
            .arg("--data")
            .arg(dir.path())
            .env_remove("WARREN_SNAPSHOTS")
            .stdin(Stdio::null())
            .output()
            .expect("runs warren gateway");
        assert!(!output.status.success(), "{url} refused");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("--snapshots") && stderr.contains("invalid object request"),
            "{url}: {stderr}"
        );
    }
}

#[tokio::test]
async fn remote_hands_checkpoints_are_in_the_bucket_and_serve_their_files_once_the_hands_are_gone()
{
    let s3 = S3::start();
    s3.create_bucket("remote");
    let execd = super::sandbox::RemoteExecd::start("s3-remote-token").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let args = [
        "--hands-provider",
        "remote",
        "--hands-url-template",
        &execd.url,
        "--hands-token",
        "s3-remote-token",
        "--snapshots",
        "s3://remote/warren",
    ]
    .map(str::to_owned);
    let gateway = GatewayProcess::start(&dir.path().join("data"), &args, &s3.env());
    let (token, session, mut events) = session_with_notes(&gateway).await;
    assert_eq!(
        std::fs::read_to_string(execd.root.path().join("notes.txt")).expect("in the execd's root"),
        "hello object storage"
    );
    // The turn's checkpoint (streamed by the execd) is in the bucket.
    let seen = events
        .until("the turn's checkpoint", |e| {
            e.event == "checkpoint" || e.event == "error"
        })
        .await;
    let last = seen.last().expect("an event");
    assert_eq!(last.event, "checkpoint", "{:?}", last.data);
    assert_eq!(manifest_keys(&s3, "remote", &session).await.len(), 1);
    assert!(
        object(&s3, "remote", &session).await.is_none(),
        "no whole tar is written for remote hands"
    );
    // The hands' machine goes away: they are lost, and their files are answered from the
    // checkpoint in the bucket, ranges included.
    execd.stop().await;
    events
        .until("the remote hands lost", |e| {
            e.event == "hands" && e.data["state"] == "lost"
        })
        .await;
    assert_range_of_notes(&gateway, &token, &session).await;
}
