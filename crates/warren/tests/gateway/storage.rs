//! A full disk, for real: the data directory is a small tmpfs the test mounts and fills, so every
//! write fails with ENOSPC exactly as it would on a full disk. A failed append ends the running
//! turn, new messages, sessions and devices get 507 `STORAGE_FULL`, `/healthz` says the storage is
//! failing, and once space returns (or after a restart) the turn left open is closed
//! `interrupted` with nothing missing from the seq chain.
//!
//! Mounting needs CAP_SYS_ADMIN: the tests run as root, also in CI's PID and mount namespace.
//! The mount is private to the test (its own temp directory) and removed when the test ends.

// Tests start real programs (shells, servers, the binary under test) directly.
#![allow(clippy::disallowed_methods)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use serde_json::Value;
use warren_gateway::event_log::{AppendError, EventLog};
use warren_protocol::gateway::EventBody;
use warren_store::health::StorageHealth;

use warren_test_support::eventually_async;

use super::helpers::{
    Received, TestGateway, WAIT, args_with_shell_agent, file_store_only, stop_reason, text_of,
};

/// A tmpfs of a fixed size mounted on a fresh temp directory, unmounted on drop.
struct SmallDisk {
    mountpoint: PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(size: &str) -> SmallDisk {
        let dir = tempfile::tempdir().expect("temp dir for the mount");
        let mountpoint = dir.path().to_path_buf();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&mountpoint)
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mounting a {size} tmpfs at {} (needs root, as in CI): {status}",
            mountpoint.display()
        );
        SmallDisk {
            mountpoint,
            _dir: dir,
        }
    }

    fn path(&self) -> &Path {
        &self.mountpoint
    }

    fn filler(&self) -> PathBuf {
        self.mountpoint.join("filler")
    }

    /// Writes a file until the disk refuses with ENOSPC: every free block is taken.
    fn fill(&self) {
        let mut file = std::fs::File::create(self.filler()).expect("create the filler");
        let chunk = vec![b'x'; 64 * 1024];
        loop {
            match file.write(&chunk) {
                Ok(0) => panic!("the disk took no byte yet reported no error"),
                Ok(_) => {}
                Err(e) => {
                    assert_eq!(
                        e.raw_os_error(),
                        Some(28),
                        "the filler stops at ENOSPC: {e}"
                    );
                    return;
                }
            }
        }
    }

    /// Gives the space back.
    fn free(&self) {
        std::fs::remove_file(self.filler()).expect("remove the filler");
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        // Lazy: a process that still has its working directory in here (a hands a failed test
        // left behind) must not keep the mount alive.
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.mountpoint)
            .status();
    }
}

/// A tmpfs of `size` for a data disk that fills up under the event log; `None` on the PostgreSQL
/// store, which has no such files.
fn disk_under_the_log(size: &str) -> Option<SmallDisk> {
    (!file_store_only("a full data disk under the event log")).then(|| SmallDisk::mount(size))
}

/// `GET /healthz`: its status and, when degraded, its JSON body.
async fn health(gw: &TestGateway) -> (u16, Option<Value>) {
    let response = gw.get_plain("/healthz").await;
    let status = response.status().as_u16();
    let body = response.text().await.expect("healthz body");
    (status, serde_json::from_str(&body).ok())
}

/// Asserts a 507 `STORAGE_FULL` error body.
async fn assert_storage_full(response: reqwest::Response, what: &str) {
    assert_eq!(response.status(), 507, "{what}");
    let body: Value = response.json().await.expect("error body");
    assert_eq!(body["code"], "STORAGE_FULL", "{what}: {body}");
    let message = body["message"].as_str().expect("a message");
    assert!(message.contains("full"), "{what}: {message}");
}

/// The seqs of `events` are 1, 2, ... with no gap and no duplicate.
fn assert_seq_chain(events: &[Received]) {
    let seqs: Vec<u64> = events
        .iter()
        .map(|e| e.id.expect("every event has an id"))
        .collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "seq chain intact"
    );
}

/// The stored `events.jsonl` of a session: every line parses and the seqs run 1, 2, ...
fn stored_events(data: &Path, session: &str) -> Vec<Value> {
    let path = data.join("sessions").join(session).join("events.jsonl");
    let text = std::fs::read_to_string(&path).expect("the event log");
    let events: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).expect("every stored line parses"))
        .collect();
    let seqs: Vec<u64> = events
        .iter()
        .map(|e| e["seq"].as_u64().expect("seq"))
        .collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    events
}

/// The `turn_end`s stored for `turn`.
fn turn_ends(events: &[Value], turn: u64) -> Vec<&Value> {
    events
        .iter()
        .filter(|e| e["type"] == "turn_end" && e["turn"] == turn)
        .collect()
}

/// A command that waits for `go` in the workspace, then prints far more than the slack left in
/// the last block of the event log, and keeps running: its turn can end only by the failure.
const LOUD_AFTER_GO: &str = "while [ ! -f go ]; do sleep 0.05; done; seq 1 30000; sleep 60";

/// Waits until the session is idle: the failed append ended its turn (no event can say so).
async fn until_idle(gw: &TestGateway, token: &str, session: &str) {
    eventually_async("the turn ended by the failed append", || async {
        gw.session_info(token, session).await["status"] == "idle"
    })
    .await;
}

#[tokio::test]
async fn full_disk_ends_the_running_turn_and_refuses_new_messages_with_507() {
    let Some(disk) = disk_under_the_log("16m") else {
        return;
    };
    let gw = TestGateway::start_in(args_with_shell_agent(disk.path().join("data"))).await;
    let mut chat = gw.conversation("phone-0001").await;
    let mut seen = chat.turn("echo warm-up").await;
    seen.extend(chat.start_working(LOUD_AFTER_GO).await);

    disk.fill();
    std::fs::File::create(chat.workspace().join("go")).expect("create go");
    until_idle(&gw, &chat.token, &chat.session).await;

    let (status, body) = health(&gw).await;
    assert_eq!(status, 503, "/healthz reports the failing storage");
    let body = body.expect("a JSON body");
    assert_eq!(
        (
            body["status"].clone(),
            body["storage"].clone(),
            body["full"].clone()
        ),
        ("degraded".into(), "failing".into(), true.into()),
        "{body}"
    );
    assert!(body["message"].is_string(), "{body}");
    assert_storage_full(chat.send("echo refused").await, "a new message").await;
    let new_session = gw
        .request(reqwest::Method::POST, &chat.token, "/sessions")
        .send()
        .await
        .expect("create session");
    assert_storage_full(new_session, "a new session").await;
    let new_device = gw
        .registration("phone-0002")
        .send()
        .await
        .expect("register");
    assert_storage_full(new_device, "a new device").await;
    assert_eq!(
        chat.info().await["turn"],
        2,
        "the refused message made no turn"
    );

    disk.free();
    let closing = chat
        .until("turn 2 closed once space returned", |e| {
            e.event == "turn_end" && e.data["turn"] == 2
        })
        .await;
    assert_eq!(stop_reason(&closing), "interrupted");
    seen.extend(closing);
    seen.extend(
        chat.until("the status saying why", |e| e.event == "status")
            .await,
    );
    assert!(seen.last().expect("status").data["message"].is_string());
    eventually_async("/healthz ok again", || async { health(&gw).await.0 == 200 }).await;

    let after = chat.turn_ok("echo after-the-disk-was-full").await;
    assert!(text_of(&after).contains("after-the-disk-was-full"));
    seen.extend(after);
    assert_seq_chain(&seen);
    let stored = stored_events(&gw.data, &chat.session);
    assert_eq!(turn_ends(&stored, 2).len(), 1, "turn 2 is closed once");
    assert_eq!(
        stored.len(),
        seen.len(),
        "the stream got every stored event"
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_turn_left_open_by_a_full_disk_is_closed_after_a_restart_once_space_returns() {
    let Some(disk) = disk_under_the_log("16m") else {
        return;
    };
    let data = disk.path().join("data");
    let gw = TestGateway::start_in(args_with_shell_agent(data.clone())).await;
    let mut chat = gw.conversation("phone-0001").await;
    chat.start_working(LOUD_AFTER_GO).await;
    disk.fill();
    std::fs::File::create(chat.workspace().join("go")).expect("create go");
    until_idle(&gw, &chat.token, &chat.session).await;
    let (token, session) = (chat.token.clone(), chat.session.clone());
    drop(chat);
    gw.stop().await;

    // Restarted on the still-full disk: the session is there, the turn cannot be closed yet.
    let gw = TestGateway::start_in(args_with_shell_agent(data)).await;
    assert_eq!(
        gw.get(&token, &format!("/sessions/{session}"))
            .await
            .status(),
        200
    );
    assert_eq!(health(&gw).await.0, 503, "still failing after the restart");
    assert_storage_full(
        gw.post_message(&token, &session, "echo no").await,
        "a message",
    )
    .await;

    disk.free();
    let mut events = gw.events(&token, &session, None).await;
    let seen = events
        .until("turn 1 closed once space returned", |e| {
            e.event == "turn_end" && e.data["turn"] == 1
        })
        .await;
    assert_eq!(stop_reason(&seen), "interrupted");
    assert_seq_chain(&seen);
    eventually_async("/healthz ok again", || async { health(&gw).await.0 == 200 }).await;
    let accepted = gw.post_message(&token, &session, "echo works").await;
    assert_eq!(accepted.status(), 202);
    let after = events
        .until("turn_end of the next turn", |e| e.event == "turn_end")
        .await;
    assert_eq!(stop_reason(&after), "end_turn");
    assert_eq!(turn_ends(&stored_events(&gw.data, &session), 1).len(), 1);
    gw.stop().await;
}

fn update(text: &str) -> EventBody {
    EventBody::Update {
        update: serde_json::json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}),
    }
}

#[tokio::test]
async fn a_failed_append_is_held_unpublished_and_written_in_order_once_space_returns() {
    let Some(disk) = disk_under_the_log("1m") else {
        return;
    };
    let path = disk.path().join("events.jsonl");
    let health = Arc::new(StorageHealth::default());
    let (log, _) = EventLog::open(&path, health.clone(), |_| {}).expect("open");
    let mut subscription = log.subscribe(0).expect("subscribe");
    for i in 1..=3 {
        log.append(None, update(&i.to_string())).expect("append");
    }
    log.sync().await.expect("sync while there is space");
    for want in 1..=3 {
        let event = tokio::time::timeout(WAIT, subscription.live.recv())
            .await
            .expect("a stored event is published")
            .expect("live");
        assert_eq!(event.seq, want);
    }

    disk.fill();
    let held = log
        .append(None, update(&"x".repeat(64 * 1024)))
        .expect("queued");
    assert_eq!(held.seq, 4);
    assert!(matches!(log.sync().await, Err(AppendError::Failing(_))));
    assert!(health.failure().expect("reported").full);
    assert!(
        matches!(
            log.append(None, update("refused")),
            Err(AppendError::Failing(_))
        ),
        "a failing log takes no more events"
    );
    assert!(
        subscription.live.try_recv().is_err(),
        "an event that is not in the file is not published"
    );
    let stored = std::fs::read_to_string(&path).expect("read the log");
    assert_eq!(stored.lines().count(), 3, "no partial line is left behind");

    disk.free();
    log.resume().await.expect("resume once space returned");
    let event = tokio::time::timeout(WAIT, subscription.live.recv())
        .await
        .expect("the held event is published once written")
        .expect("live");
    assert_eq!(event.seq, 4);
    assert_eq!(log.append(None, update("next")).expect("append").seq, 5);
    log.sync().await.expect("sync");
    let stored = std::fs::read_to_string(&path).expect("read the log");
    let seqs: Vec<u64> = stored
        .lines()
        .map(|line| {
            serde_json::from_str::<Value>(line).expect("parses")["seq"]
                .as_u64()
                .expect("seq")
        })
        .collect();
    assert_eq!(
        seqs,
        [1, 2, 3, 4, 5],
        "the held event kept its place and seq"
    );
}

#[tokio::test]
async fn a_checkpoint_that_does_not_fit_on_the_disk_keeps_the_earlier_ones_and_says_why() {
    let disk = SmallDisk::mount("24m");
    let gw = TestGateway::start_in(args_with_shell_agent(disk.path().join("data"))).await;
    let mut chat = gw.conversation("phone-snapfull").await;
    chat.turn("echo small > a.txt").await;
    let listed = format!("/sessions/{}/checkpoints", chat.session);
    chat.until("the first turn's checkpoint", |e| e.event == "checkpoint")
        .await;
    let before = gw.get_json(&chat.token, &listed).await;
    let first = before["checkpoints"][0]["id"]
        .as_str()
        .expect("an id")
        .to_owned();

    // 14 MB that do not compress, on a 24 MB disk: the workspace fits, its checkpoint does not.
    chat.turn("head -c 14000000 /dev/urandom > big.bin").await;
    let seen = chat
        .until("the failed checkpoint reported", |e| {
            e.event == "error" && e.data["code"] == "CHECKPOINT_FAILED"
        })
        .await;
    let error = &seen.last().expect("error event").data;
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("the earlier ones are kept")),
        "{error}"
    );
    assert!(
        !seen.iter().any(|e| e.event == "checkpoint"),
        "no checkpoint announced: {seen:?}"
    );
    // The earlier checkpoint is whole: listed, and its file reads.
    let after = gw.get_json(&chat.token, &listed).await;
    assert_eq!(after["checkpoints"], before["checkpoints"], "{after}");
    let content = gw
        .get(
            &chat.token,
            &format!("{listed}/{first}/files/content?path=a.txt"),
        )
        .await;
    assert_eq!(content.status(), 200);
    assert_eq!(
        content.bytes().await.expect("the body").as_ref(),
        b"small\n"
    );
    // What the failed take wrote is gone: no hidden chunk, no manifest being written.
    let store = chat
        .workspace()
        .with_file_name("checkpoints")
        .join("workspace");
    let leftovers: Vec<_> = walkdir(&store.join("chunks"))
        .into_iter()
        .chain(walkdir(&store.join("tmp")))
        .filter(|path| {
            path.starts_with(store.join("tmp"))
                || path
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    gw.stop().await;
}

/// Every file beneath `root`.
fn walkdir(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("a directory").flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                found.push(path);
            }
        }
    }
    found
}
