//! `warren gateway --snapshots s3://bucket/prefix` (the real binary) against an S3 endpoint
//! (moto on loopback): an archived session's snapshot is the object in the bucket and its
//! files download with ranges; with the endpoint stopped, a snapshot fails with an `error`
//! event while the previous snapshot still restores.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use warren_cluster::objects::{ObjectUrl, Objects};
use warren_test_support::services::S3;

use crate::helpers::{EventStream, Received, WAIT, text_of, warren_bin};

const APP_KEY: &str = "snapshots-s3-key";

/// A `warren gateway` child process (its own process group), stopped by its pid on drop, with
/// the hands it leaves for a next gateway (a stopped gateway pauses them) stopped after it.
struct Gateway {
    child: Child,
    data: std::path::PathBuf,
    url: String,
    http: reqwest::Client,
    token: String,
}

impl Gateway {
    /// `warren gateway --snapshots s3://<bucket>/warren` with hands that pause and archive
    /// quickly, its S3 settings in its environment.
    async fn start(data: &Path, s3: &S3, bucket: &str) -> Gateway {
        use std::os::unix::process::CommandExt;
        let warren = warren_bin();
        let mut command = Command::new(&warren);
        command
            .args(["gateway", "--listen", "127.0.0.1:0", "--app-key", APP_KEY])
            .args(["--warm-workers", "0", "--brain-placement", "host"])
            .args([
                "--hands-idle-pause",
                "500ms",
                "--hands-archive-after",
                "500ms",
            ])
            .arg("--snapshots")
            .arg(format!("s3://{bucket}/warren"))
            .arg("--agent")
            .arg(format!("{} shell-agent", warren.display()))
            .arg("--data")
            .arg(data)
            .env("WARREN_BIN", &warren)
            .env_remove("WARREN_APP_KEY")
            .env("WARREN_LOG", "warn")
            .envs(s3.env())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0);
        let mut child = command.spawn().expect("starts warren gateway");
        let stdout = child.stdout.take().expect("stdout piped");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let line = lines
            .recv_timeout(WAIT)
            .expect("the gateway prints its address");
        let url = line
            .strip_prefix("warren gateway listening on ")
            .unwrap_or_else(|| panic!("an address line: {line}"))
            .trim()
            .to_owned();
        let http = reqwest::Client::new();
        let registered: Value = http
            .post(format!("{url}/v1/devices"))
            .header("X-App-Key", APP_KEY)
            .json(&serde_json::json!({"device_id": "phone-s3-01"}))
            .send()
            .await
            .expect("register")
            .json()
            .await
            .expect("register body");
        let token = registered["token"].as_str().expect("token").to_owned();
        Gateway {
            child,
            data: data.to_path_buf(),
            url,
            http,
            token,
        }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}/v1{path}", self.url))
            .bearer_auth(&self.token)
    }

    async fn create_session(&self) -> String {
        let created: Value = self
            .request(reqwest::Method::POST, "/sessions")
            .json(&serde_json::json!({"title": "s3"}))
            .send()
            .await
            .expect("create")
            .json()
            .await
            .expect("session body");
        created["id"].as_str().expect("id").to_owned()
    }

    async fn events(&self, session: &str) -> EventStream {
        let response = self
            .request(
                reqwest::Method::GET,
                &format!("/sessions/{session}/events?after=0"),
            )
            .send()
            .await
            .expect("events");
        EventStream::new(response)
    }

    /// Sends `text` and reads `events` until its `turn_end`.
    async fn turn(&self, session: &str, events: &mut EventStream, text: &str) -> Vec<Received> {
        let sent = self
            .request(
                reqwest::Method::POST,
                &format!("/sessions/{session}/messages"),
            )
            .json(&serde_json::json!({ "text": text }))
            .send()
            .await
            .expect("message");
        assert_eq!(sent.status(), 202, "{text:?} accepted");
        events
            .until(&format!("turn_end of {text:?}"), |e| e.event == "turn_end")
            .await
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = std::time::Instant::now() + WAIT;
        while matches!(self.child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        crate::helpers::stop_left_hands(&self.data);
    }
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

#[tokio::test]
async fn an_archived_sessions_snapshot_is_the_object_in_the_bucket_and_serves_ranges() {
    let s3 = S3::start();
    s3.create_bucket("archives");
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let gateway = Gateway::start(&data, &s3, "archives").await;
    let session = gateway.create_session().await;
    let mut events = gateway.events(&session).await;
    gateway
        .turn(
            &session,
            &mut events,
            "printf 'hello object storage' > notes.txt",
        )
        .await;
    archived(&mut events).await;

    let stored = object(&s3, "archives", &session)
        .await
        .expect("the snapshot is in the bucket");
    let local = std::fs::read(
        data.join("sessions")
            .join(&session)
            .join("snapshot.tar.zst"),
    )
    .expect("the replica's copy");
    assert!(
        stored[..] == local[..],
        "the object is the snapshot the replica wrote"
    );

    let part = gateway
        .request(
            reqwest::Method::GET,
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

#[tokio::test]
async fn a_snapshot_while_object_storage_is_down_is_an_error_and_the_previous_one_still_restores() {
    let mut s3 = S3::start();
    s3.create_bucket("outage");
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let gateway = Gateway::start(&data, &s3, "outage").await;
    let session = gateway.create_session().await;
    let mut events = gateway.events(&session).await;
    gateway
        .turn(&session, &mut events, "printf 'version one' > notes.txt")
        .await;
    archived(&mut events).await;
    let snapshot = data
        .join("sessions")
        .join(&session)
        .join("snapshot.tar.zst");
    let previous = std::fs::read(&snapshot).expect("the snapshot");
    assert_eq!(
        object(&s3, "outage", &session).await.as_deref(),
        Some(&previous[..]),
        "the snapshot is in the bucket"
    );

    s3.stop();
    let seen = gateway
        .turn(
            &session,
            &mut events,
            "cat notes.txt; printf 'version two' > notes.txt",
        )
        .await;
    assert!(
        seen.iter()
            .any(|e| e.event == "hands" && e.data["state"] == "restored"),
        "the hands were restored: {seen:#?}"
    );
    assert!(
        text_of(&seen).contains("version one"),
        "the previous snapshot restored: {seen:#?}"
    );
    let failed = events
        .until("the snapshot's error", |e| e.event == "error")
        .await;
    let error = failed.last().expect("an error event");
    assert!(
        error.data.to_string().contains("SNAPSHOT_FAILED"),
        "{:?}",
        error.data
    );
    assert!(
        std::fs::read(&snapshot).expect("the snapshot") == previous,
        "the previous snapshot is kept"
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
