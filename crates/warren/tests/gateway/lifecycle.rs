//! The hands lifecycle through the gateway's HTTP API and the built-in shell agent: idle pause
//! and resume, archive and restore, lost hands rebuilt, adoption after a gateway restart (a
//! SIGTERM and a kill -9), a nonce that does not match, a full disk while snapshotting.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use warren_gateway::GatewayArgs;
use warren_test_support::{alive, eventually};

use super::helpers::{
    EventStream, Received, TestGateway, args_with_shell_agent, hands_processes, in_bwrap, kill,
};

/// What the agent said (its message chunks), in order.
fn text_of(events: &[Received]) -> String {
    events
        .iter()
        .filter(|e| {
            e.event == "update" && e.data["update"]["sessionUpdate"] == "agent_message_chunk"
        })
        .filter_map(|e| e.data["update"]["content"]["text"].as_str())
        .collect()
}

/// A gateway whose hands pause after `idle` and archive after `archive` paused.
fn quick_lifecycle(data: PathBuf, idle: Duration, archive: Duration) -> GatewayArgs {
    let mut args = args_with_shell_agent(data);
    args.hands_idle_pause = idle;
    args.hands_archive_after = archive;
    args
}

fn hands_event<'a>(events: &'a [Received], state: &str) -> Option<&'a Received> {
    events
        .iter()
        .find(|e| e.event == "hands" && e.data["state"] == state)
}

/// Path → (mode bits, content or link target) of every entry below `root`.
fn manifest(root: &Path) -> BTreeMap<String, (u32, String)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir").flatten() {
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).expect("metadata");
            let rel = path
                .strip_prefix(root)
                .expect("below root")
                .display()
                .to_string();
            let mode = meta.permissions().mode() & 0o7777;
            let what = if meta.file_type().is_symlink() {
                format!("-> {}", std::fs::read_link(&path).expect("link").display())
            } else if meta.is_dir() {
                stack.push(path.clone());
                "dir".to_string()
            } else {
                String::from_utf8_lossy(&std::fs::read(&path).expect("read")).into_owned()
            };
            out.insert(rel, (mode, what));
        }
    }
    out
}

fn line_count(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|text| text.lines().count())
        .unwrap_or(0)
}

/// The value after `name=` in the agent's output.
fn reported(text: &str, name: &str) -> String {
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("{name}= in {text:?}"))
        .trim()
        .to_string()
}

#[tokio::test]
async fn idle_hands_are_paused_and_a_background_ticker_stops_then_resumes_with_the_same_pid() {
    let gw = TestGateway::start(|data| {
        quick_lifecycle(data, Duration::from_millis(700), Duration::from_secs(3600))
    })
    .await;
    let mut chat = gw.conversation("phone-pause1").await;
    let seen = chat
        .turn("setsid nohup bash -c 'while :; do date +%s%N >> tick.log; sleep 0.05; done' >/dev/null 2>&1 & echo ticker=$!")
        .await;
    let ticker = reported(&text_of(&seen), "ticker");
    let tick_log = chat.workspace().join("tick.log");
    eventually("the ticker ticks", || line_count(&tick_log) > 3).await;

    let paused = chat
        .until("the idle hands paused", |e| {
            e.event == "hands" && e.data["state"] == "paused"
        })
        .await;
    let paused = paused.last().expect("the paused event");
    assert!(paused.data["elapsed_ms"].is_u64(), "{:?}", paused.data);
    assert!(
        paused.data["snapshot_bytes"]
            .as_u64()
            .is_some_and(|n| n > 0),
        "a snapshot is taken before the freeze: {:?}",
        paused.data
    );
    assert_eq!(chat.info().await["hands"], "paused");
    let frozen_at = line_count(&tick_log);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        line_count(&tick_log),
        frozen_at,
        "a paused ticker writes nothing"
    );

    let seen = chat
        .turn(&format!("kill -0 {ticker} && echo alive={ticker}"))
        .await;
    let resumed = hands_event(&seen, "running").expect("a hands event when the use resumes them");
    assert_eq!(resumed.data["message"], "resumed", "{:?}", resumed.data);
    assert!(resumed.data["elapsed_ms"].is_u64());
    assert!(
        resumed.data.get("reset").is_none(),
        "resuming keeps every process: {:?}",
        resumed.data
    );
    assert_eq!(
        reported(&text_of(&seen), "alive"),
        ticker,
        "the same process"
    );
    eventually("the ticker ticks again", || {
        line_count(&tick_log) > frozen_at + 3
    })
    .await;
    gw.stop().await;
}

#[tokio::test]
async fn paused_hands_are_archived_then_restored_on_next_use_with_identical_files_and_a_reset_notice()
 {
    let gw = TestGateway::start(|data| {
        quick_lifecycle(data, Duration::from_millis(400), Duration::from_millis(600))
    })
    .await;
    let mut chat = gw.conversation("phone-archive").await;
    chat.turn(
        "mkdir -p src/empty && printf 'one\\n' > src/a.txt && chmod 640 src/a.txt \
         && head -c 3000 /dev/urandom > blob.bin && ln -s src/a.txt link \
         && setsid sleep 4242 >/dev/null 2>&1 & echo ok",
    )
    .await;
    let workspace = chat.workspace();
    eventually("the files are written", || workspace.join("link").exists()).await;
    let before = manifest(&workspace);
    let processes = hands_processes(&gw.data, &chat.session);
    assert!(!processes.is_empty(), "the hands run");

    let seen = chat
        .until("the paused hands archived", |e| {
            e.event == "hands" && e.data["state"] == "archived"
        })
        .await;
    let archived = seen.last().expect("archived event");
    assert!(
        archived.data["snapshot_at"].is_string(),
        "{:?}",
        archived.data
    );
    assert_eq!(chat.info().await["hands"], "archived");
    assert!(!workspace.exists(), "the live workspace is removed");
    // The archive is the session's newest checkpoint (taken at the pause), not a whole tar.
    assert!(
        !workspace.with_file_name("snapshot.tar.zst").exists(),
        "no whole-tar snapshot of local hands"
    );
    let newest = gw
        .get_json(
            &chat.token,
            &format!("/sessions/{}/checkpoints?limit=1", chat.session),
        )
        .await;
    assert_eq!(
        newest["checkpoints"][0]["created_at"], archived.data["snapshot_at"],
        "the archive is the newest checkpoint: {newest}"
    );
    eventually("no process of the session is left", || {
        !processes.iter().any(|pid| alive(*pid))
    })
    .await;

    let seen = chat
        .turn("cat src/a.txt; pgrep -f '[s]leep 4242' || echo no-sleeper")
        .await;
    assert!(hands_event(&seen, "restoring").is_some(), "{seen:?}");
    let restored = hands_event(&seen, "restored").expect("a restored event");
    assert_eq!(restored.data["reset"], true);
    assert_eq!(restored.data["snapshot_at"], archived.data["snapshot_at"]);
    let text = text_of(&seen);
    assert!(
        text.contains("restored")
            && text.contains(archived.data["snapshot_at"].as_str().expect("at")),
        "the agent's prompt carried the notice with the snapshot time: {text:?}"
    );
    assert!(text.contains("one\n"), "{text:?}");
    assert!(
        text.contains("no-sleeper"),
        "processes were reset: {text:?}"
    );
    assert_eq!(
        manifest(&workspace),
        before,
        "files, modes and links as before"
    );
    gw.stop().await;
}

#[tokio::test]
async fn killed_hands_are_noticed_at_once_as_lost_and_rebuilt_with_a_reset_notice() {
    let gw = TestGateway::start(args_with_shell_agent).await;
    let mut chat = gw.conversation("phone-lost1").await;
    chat.turn("echo kept > kept.txt").await;
    let root = *hands_processes(&gw.data, &chat.session)
        .first()
        .expect("the sandbox's root process");
    kill("9", root, "the sandbox this test's gateway started");
    let seen = chat
        .until("the hands noticed lost", |e| {
            e.event == "hands" && e.data["state"] == "lost"
        })
        .await;
    assert!(
        seen.last().expect("lost").data["error"].is_string(),
        "{:?}",
        seen.last()
    );
    assert_eq!(chat.info().await["hands"], "lost");

    let seen = chat.turn("cat kept.txt").await;
    let rebuilt = hands_event(&seen, "running").expect("new hands");
    assert_eq!(rebuilt.data["reset"], true, "{:?}", rebuilt.data);
    let text = text_of(&seen);
    assert!(text.contains("reset"), "the notice: {text:?}");
    assert!(text.contains("kept\n"), "the workspace is kept: {text:?}");
    assert_eq!(chat.info().await["hands"], "running");
    gw.stop().await;
}

/// A port nothing listens on right now.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

struct Device {
    token: String,
    session: String,
}

async fn device_with_session(gw: &TestGateway, device_id: &str) -> Device {
    let token = gw.register(device_id).await;
    let session = gw.create_session(&token).await;
    Device { token, session }
}

async fn run(gw: &TestGateway, device: &Device, text: &str) -> Vec<Received> {
    let last = gw.session_info(&device.token, &device.session).await["last_seq"]
        .as_u64()
        .expect("last_seq");
    let mut events: EventStream = gw.events(&device.token, &device.session, Some(last)).await;
    let accepted = gw.post_message(&device.token, &device.session, text).await;
    assert_eq!(accepted.status(), 202, "{text:?} accepted");
    events
        .until(&format!("turn_end of {text:?}"), |e| e.event == "turn_end")
        .await
}

#[tokio::test]
async fn after_a_sigterm_restart_the_next_gateway_adopts_the_paused_hands_and_a_dev_server_still_answers()
 {
    let dir = tempfile::tempdir().expect("data dir");
    let data = dir.path().to_path_buf();
    let first = TestGateway::start_in(args_with_shell_agent(data.clone())).await;
    let device = device_with_session(&first, "phone-adopt1").await;
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/");
    let started = run(
        &first,
        &device,
        &format!(
            "setsid nohup python3 -m http.server {port} --bind 127.0.0.1 >/dev/null 2>&1 & \
             for i in $(seq 100); do curl -s -o /dev/null {url} && echo status=up && exit 0; \
             sleep 0.1; done; exit 1"
        ),
    )
    .await;
    assert_eq!(reported(&text_of(&started), "status"), "up", "{started:?}");
    let processes = hands_processes(&data, &device.session);
    first.stop_leaving_hands().await;
    assert!(
        processes.iter().all(|pid| alive(*pid)),
        "SIGTERM leaves the hands (paused) for the next gateway"
    );

    let second = TestGateway::start_in(args_with_shell_agent(data.clone())).await;
    let info = second.session_info(&device.token, &device.session).await;
    assert_eq!(
        info["hands"], "paused",
        "adopted hands start paused: {info}"
    );
    // The dev server in the adopted hands, and the egress proxy's socket made again for them.
    let seen = run(
        &second,
        &device,
        &format!(
            "python3 -c \"import urllib.request as u; print('status=%d' % u.urlopen('{url}').status)\"; \
             curl -sS -o /dev/null -w 'egress=%{{http_code}}\\n' https://pypi.org/simple/six/"
        ),
    )
    .await;
    assert_eq!(reported(&text_of(&seen), "status"), "200", "{seen:?}");
    assert_eq!(reported(&text_of(&seen), "egress"), "200", "{seen:?}");
    assert!(
        seen.iter()
            .filter(|e| e.event == "hands")
            .all(|e| e.data.get("reset").is_none()),
        "the same hands, not new ones: {seen:?}"
    );
    assert_eq!(hands_processes(&data, &device.session)[0], processes[0]);
    second.stop().await;
}

#[tokio::test]
async fn a_gateway_restart_stops_left_hands_whose_nonce_does_not_match_and_the_session_gets_new_ones()
 {
    let dir = tempfile::tempdir().expect("data dir");
    let data = dir.path().to_path_buf();
    let first = TestGateway::start_in(args_with_shell_agent(data.clone())).await;
    let device = device_with_session(&first, "phone-nonce1").await;
    run(&first, &device, "echo kept > kept.txt").await;
    let processes = hands_processes(&data, &device.session);
    first.stop_leaving_hands().await;
    let record_path = data
        .join("run")
        .join("hands")
        .join(format!("{}.json", device.session));
    let mut record: Value =
        serde_json::from_str(&std::fs::read_to_string(&record_path).expect("record"))
            .expect("record parses");
    record["nonce"] = Value::String("0123456789abcdef0123456789abcdef".into());
    std::fs::write(&record_path, record.to_string()).expect("tamper with the record");

    let second = TestGateway::start_in(args_with_shell_agent(data.clone())).await;
    eventually("hands that do not prove their identity are stopped", || {
        !processes.iter().any(|pid| alive(*pid))
    })
    .await;
    let info = second.session_info(&device.token, &device.session).await;
    assert_eq!(info["hands"], "lost", "{info}");
    let seen = run(&second, &device, "cat kept.txt").await;
    let rebuilt = hands_event(&seen, "running").expect("new hands");
    assert_eq!(rebuilt.data["reset"], true);
    assert!(text_of(&seen).contains("kept\n"));
    second.stop().await;
}

#[tokio::test]
async fn hands_left_for_a_session_deleted_while_no_gateway_ran_are_stopped_at_start() {
    let dir = tempfile::tempdir().expect("data dir");
    let data = dir.path().to_path_buf();
    let first = TestGateway::start_in(args_with_shell_agent(data.clone())).await;
    let device = device_with_session(&first, "phone-stray1").await;
    run(&first, &device, "echo hi").await;
    let processes = hands_processes(&data, &device.session);
    first.stop_leaving_hands().await;
    std::fs::remove_dir_all(data.join("sessions").join(&device.session))
        .expect("the session goes while no gateway runs");
    super::helpers::delete_stored_session(&data, &device.session);
    let second = TestGateway::start_in(args_with_shell_agent(data.clone())).await;
    eventually("the stray hands are stopped", || {
        !processes.iter().any(|pid| alive(*pid))
    })
    .await;
    assert!(
        !data
            .join("run")
            .join("hands")
            .join(format!("{}.json", device.session))
            .exists()
    );
    second.stop().await;
}

#[tokio::test]
async fn deleting_a_session_removes_its_workspace_snapshot_and_run_directory() {
    let gw = TestGateway::start(|data| {
        quick_lifecycle(data, Duration::from_millis(300), Duration::from_secs(3600))
    })
    .await;
    let mut chat = gw.conversation("phone-delete").await;
    chat.turn("echo x > x.txt").await;
    chat.until("paused (a snapshot exists)", |e| {
        e.event == "hands" && e.data["state"] == "paused"
    })
    .await;
    let session_dir = chat
        .workspace()
        .parent()
        .expect("session dir")
        .to_path_buf();
    assert!(
        session_dir.join("checkpoints/workspace").is_dir(),
        "the paused files are in the session's checkpoints"
    );
    let processes = hands_processes(&gw.data, &chat.session);
    let deleted = gw
        .delete(&chat.token, &format!("/sessions/{}", chat.session))
        .await;
    assert_eq!(deleted.status(), 204);
    assert!(!session_dir.exists(), "workspace and checkpoints removed");
    assert!(
        !gw.data
            .join("run")
            .join("hands")
            .join(&chat.session)
            .exists()
    );
    assert!(
        !processes.iter().any(|pid| alive(*pid)),
        "every process stopped, paused ones too"
    );
    gw.stop().await;
}

#[tokio::test]
async fn with_isolation_bwrap_and_no_working_bwrap_a_message_ends_with_hands_unavailable() {
    let gw = in_bwrap(|args| args.hands_bwrap = Some("/nonexistent/bwrap".into())).await;
    let mut chat = gw.conversation("phone-nobwrap").await;
    assert_eq!(chat.info().await["isolation"], "bwrap");
    let seen = chat.turn("echo never").await;
    let error = seen
        .iter()
        .find(|e| e.event == "error")
        .expect("an error event");
    assert_eq!(error.data["code"], "HANDS_UNAVAILABLE", "{:?}", error.data);
    assert!(
        error.data["message"]
            .as_str()
            .is_some_and(|m| m.contains("bwrap")),
        "the message says what is missing: {:?}",
        error.data
    );
    assert_eq!(seen.last().expect("turn_end").data["stop_reason"], "error");
    assert!(!text_of(&seen).contains("never"), "nothing ran unconfined");
    gw.stop().await;
}

#[tokio::test]
async fn with_isolation_auto_and_no_working_bwrap_hands_run_unconfined_and_say_so_everywhere() {
    let gw = TestGateway::start_changed(args_with_shell_agent, |args| {
        args.hands_bwrap = Some("/nonexistent/bwrap".into())
    })
    .await;
    let mut chat = gw.conversation("phone-noiso").await;
    assert_eq!(chat.info().await["isolation"], "none");
    let seen = chat.turn("env | cut -d= -f1 | sort | tr '\\n' ' '").await;
    let hands: Vec<&Received> = seen.iter().filter(|e| e.event == "hands").collect();
    assert!(!hands.is_empty());
    assert!(
        hands.iter().all(|e| e.data["isolation"] == "none"),
        "{hands:?}"
    );
    let names = text_of(&seen);
    for secret in ["WARREN_APP_KEY", "WARREN_ADMIN_TOKEN", "CARGO_PKG_NAME"] {
        assert!(
            !names.contains(secret),
            "the environment allowlist holds unconfined too: {names}"
        );
    }
    assert!(names.contains("PATH"), "{names}");
    gw.stop().await;
}

#[tokio::test]
async fn paused_hands_thaw_cleanly_when_one_of_their_processes_was_killed_while_frozen() {
    let gw = TestGateway::start(|data| {
        quick_lifecycle(data, Duration::from_millis(400), Duration::from_secs(3600))
    })
    .await;
    let mut chat = gw.conversation("phone-thaw1").await;
    chat.turn("setsid sleep 5151 >/dev/null 2>&1 & echo started")
        .await;
    chat.until("paused", |e| {
        e.event == "hands" && e.data["state"] == "paused"
    })
    .await;
    let sleeper = hands_processes(&gw.data, &chat.session)
        .into_iter()
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmd| cmd.starts_with(b"sleep\x005151"))
        })
        .expect("the sleeper, as the host sees it");
    kill("9", sleeper, "the frozen sleeper");
    eventually("a frozen process still dies of SIGKILL", || !alive(sleeper)).await;
    let seen = chat
        .turn("pgrep -f '[s]leep 5151' || echo sleeper-gone")
        .await;
    assert!(hands_event(&seen, "running").is_some(), "resumed: {seen:?}");
    assert!(hands_event(&seen, "lost").is_none(), "{seen:?}");
    assert!(text_of(&seen).contains("sleeper-gone"), "{seen:?}");
    gw.stop().await;
}

#[tokio::test]
async fn hands_killed_while_paused_are_noticed_lost_and_rebuilt_on_next_use() {
    let gw = TestGateway::start(|data| {
        quick_lifecycle(data, Duration::from_millis(400), Duration::from_secs(3600))
    })
    .await;
    let mut chat = gw.conversation("phone-thaw2").await;
    chat.turn("echo kept > kept.txt").await;
    chat.until("paused", |e| {
        e.event == "hands" && e.data["state"] == "paused"
    })
    .await;
    let root = hands_processes(&gw.data, &chat.session)[0];
    kill("9", root, "the paused sandbox");
    chat.until("lost", |e| e.event == "hands" && e.data["state"] == "lost")
        .await;
    let seen = chat.turn("cat kept.txt").await;
    assert_eq!(
        hands_event(&seen, "running").expect("new hands").data["reset"],
        true
    );
    assert!(text_of(&seen).contains("kept\n"));
    gw.stop().await;
}

#[tokio::test]
async fn paused_hands_whose_snapshot_is_over_snapshot_max_are_never_archived() {
    let gw = TestGateway::start(|data| {
        let mut args =
            quick_lifecycle(data, Duration::from_millis(300), Duration::from_millis(300));
        args.snapshot_max = 64;
        args
    })
    .await;
    let mut chat = gw.conversation("phone-toobig").await;
    chat.turn("head -c 100000 /dev/urandom > big.bin").await;
    let paused = chat
        .until("paused", |e| {
            e.event == "hands" && e.data["state"] == "paused"
        })
        .await;
    assert!(
        paused.last().expect("paused").data["snapshot_bytes"]
            .as_u64()
            .is_some_and(|n| n > 64)
    );
    // Several sweeps past --hands-archive-after: still paused, the workspace still there.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(chat.info().await["hands"], "paused");
    assert!(chat.workspace().join("big.bin").is_file());
    gw.stop().await;
}

#[tokio::test]
async fn an_archive_that_cannot_be_restored_twice_gives_an_empty_workspace_an_error_and_the_session_goes_on()
 {
    let gw = TestGateway::start(|data| {
        quick_lifecycle(data, Duration::from_millis(300), Duration::from_millis(300))
    })
    .await;
    let mut chat = gw.conversation("phone-badsnap").await;
    chat.turn("echo lost-to-corruption > a.txt").await;
    chat.until("archived", |e| {
        e.event == "hands" && e.data["state"] == "archived"
    })
    .await;
    // The archive is the newest checkpoint: every chunk of it made to not match its hash.
    let chunks = chat
        .workspace()
        .with_file_name("checkpoints")
        .join("workspace/chunks");
    let mut n_corrupted = 0;
    for dir in std::fs::read_dir(&chunks).expect("the chunk directory") {
        for file in std::fs::read_dir(dir.expect("an entry").path()).expect("a chunk directory") {
            std::fs::write(file.expect("a chunk").path(), b"not what its name hashes")
                .expect("corrupt a chunk");
            n_corrupted += 1;
        }
    }
    assert!(n_corrupted > 0, "the archived files are in chunks");

    let seen = chat.turn("ls -A; echo listed").await;
    let error = seen
        .iter()
        .find(|e| e.event == "error")
        .expect("an error event");
    assert_eq!(error.data["code"], "RESTORE_FAILED", "{:?}", error.data);
    assert!(hands_event(&seen, "restored").is_some(), "{seen:?}");
    let text = text_of(&seen);
    assert!(
        text.contains("listed") && !text.contains("a.txt"),
        "an empty workspace: {text:?}"
    );
    assert_eq!(
        seen.last().expect("turn_end").data["stop_reason"],
        "end_turn"
    );
    assert_eq!(chat.info().await["hands"], "running");
    gw.stop().await;
}
