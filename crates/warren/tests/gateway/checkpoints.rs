//! Checkpoints (checkpoints.md) on real bwrap hands with the built-in shell agent: a turn that
//! changed files leaves a `checkpoint` event and one that changed nothing none; the list, a
//! listing and a file (with `Range`) as of a checkpoint, the diff between two; a rewind puts
//! back every file byte for byte (keeping what it replaced as a checkpoint) and the agent's
//! next prompt says so; a fork is a new session holding the checkpoint's files; a corrupted
//! chunk is found by its hash and restores nothing; and every bad input's status and code.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::helpers::{Conversation, TestGateway, in_bwrap};

fn base(session: &str) -> String {
    format!("/sessions/{session}/checkpoints")
}

/// The data of the `checkpoint` event that follows a turn's `turn_end` (`seen`, the turn's
/// events, read up to it), read from `events`.
async fn checkpoint_after(
    events: &mut super::helpers::EventStream,
    seen: &[super::helpers::Received],
    what: &str,
) -> Value {
    assert!(
        !seen.iter().any(|e| e.event == "checkpoint"),
        "the checkpoint of {what} comes after its turn_end"
    );
    let more = events
        .until(&format!("the checkpoint after {what}"), |e| {
            e.event == "checkpoint"
        })
        .await;
    more.last().expect("a checkpoint event").data.clone()
}

async fn status_and_code(response: reqwest::Response) -> (u16, String) {
    let status = response.status().as_u16();
    let body: Value = response.json().await.expect("a JSON error body");
    (status, body["code"].as_str().unwrap_or_default().to_owned())
}

async fn post(gw: &TestGateway, token: &str, path: &str, body: Value) -> reqwest::Response {
    gw.request(reqwest::Method::POST, token, path)
        .json(&body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {path}: {e}"))
}

async fn bytes_of(gw: &TestGateway, token: &str, path: &str) -> Vec<u8> {
    let response = gw.get(token, path).await;
    assert_eq!(response.status(), 200, "GET {path}");
    response.bytes().await.expect("the body").to_vec()
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The chunk files of a session's workspace checkpoints.
fn chunk_files(data: &Path, session: &str) -> Vec<PathBuf> {
    let root = data
        .join("sessions")
        .join(session)
        .join("checkpoints/workspace/chunks");
    let mut found = Vec::new();
    for dir in std::fs::read_dir(&root).expect("the chunk directory") {
        for file in std::fs::read_dir(dir.expect("an entry").path()).expect("a chunk directory") {
            let path = file.expect("an entry").path();
            if !path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            {
                found.push(path);
            }
        }
    }
    found
}

#[tokio::test]
async fn turns_leave_checkpoints_that_list_read_diff_rewind_and_fork() {
    let gw = in_bwrap(|_| {}).await;
    let mut chat = gw.conversation("phone-checkpoints").await;
    let seen = chat.turn_ok(
        "mkdir -p src/deep && printf 'one\\n' > src/a.txt && head -c 300000 /dev/urandom > blob.bin \
         && ln -s src/a.txt link && printf 'x' > src/deep/x",
    )
    .await;
    let first = checkpoint_after(&mut chat.events, &seen, "the first turn").await;
    assert_eq!(first["reason"], "turn");
    assert_eq!(first["turn"], 1);
    assert_eq!(first["files_changed"], 4, "{first}");
    assert!(
        first["bytes_new"].as_u64().expect("a number") > 300_000 / 2,
        "{first}"
    );
    let c1 = first["id"].as_str().expect("a string").to_owned();
    let blob = read(&chat.workspace().join("blob.bin"));

    let seen = chat
        .turn_ok("printf 'two\\n' > src/a.txt && mv blob.bin gone.bin && printf 'new\\n' > b.txt")
        .await;
    let second = checkpoint_after(&mut chat.events, &seen, "the second turn").await;
    assert_eq!(second["turn"], 2);
    assert_eq!(
        second["files_changed"], 4,
        "a.txt, b.txt, blob.bin, gone.bin: {second}"
    );
    assert!(
        second["bytes_new"].as_u64().expect("a number") < 100_000,
        "a renamed file's chunks are stored once: {second}"
    );
    let c2 = second["id"].as_str().expect("a string").to_owned();

    // A turn that changes nothing stores no checkpoint: the next one's diff is against c2.
    chat.turn_ok("true").await;
    let seen = chat.turn_ok("printf 'z' > z.txt").await;
    let third = checkpoint_after(&mut chat.events, &seen, "the fourth turn").await;
    assert_eq!(third["turn"], 4);
    let c3 = third["id"].as_str().expect("a string").to_owned();
    let list = gw.get_json(&chat.token, &base(&chat.session)).await;
    let ids: Vec<&str> = list["checkpoints"]
        .as_array()
        .expect("an array")
        .iter()
        .map(|c| c["id"].as_str().expect("a string"))
        .collect();
    assert_eq!(ids, [c3.as_str(), c2.as_str(), c1.as_str()], "{list}");
    assert_eq!(list["next"], Value::Null);
    assert_eq!(
        list["checkpoints"][2]["files"], 3,
        "blob.bin, a.txt, x: {list}"
    );
    assert_eq!(list["checkpoints"][2]["reason"], "turn");
    assert_eq!(list["checkpoints"][0]["files_changed"], 1, "{list}");
    let paged = gw
        .get_json(&chat.token, &format!("{}?limit=1", base(&chat.session)))
        .await;
    assert_eq!(paged["checkpoints"].as_array().expect("an array").len(), 1);
    assert_eq!(paged["next"], c3.as_str());
    let rest = gw
        .get_json(
            &chat.token,
            &format!("{}?limit=1&before={c3}", base(&chat.session)),
        )
        .await;
    assert_eq!(rest["checkpoints"][0]["id"], c2.as_str());
    let z_diff = gw
        .get_json(&chat.token, &format!("{}/{c3}/diff", base(&chat.session)))
        .await;
    assert_eq!(z_diff["against"], c2.as_str(), "{z_diff}");

    // Files as of the first checkpoint: listing, content, a range.
    let listed = gw
        .get_json(
            &chat.token,
            &format!("{}/{c1}/files?depth=2", base(&chat.session)),
        )
        .await;
    let paths: Vec<&str> = listed["entries"]
        .as_array()
        .expect("an array")
        .iter()
        .map(|e| e["path"].as_str().expect("a string"))
        .collect();
    assert_eq!(
        paths,
        ["blob.bin", "link", "src", "src/a.txt", "src/deep"],
        "{listed}"
    );
    assert_eq!(listed["entries"][1]["type"], "symlink");
    assert_eq!(listed["entries"][1]["target"], "src/a.txt");
    let inner = gw
        .get_json(
            &chat.token,
            &format!("{}/{c1}/files?path=src/deep", base(&chat.session)),
        )
        .await;
    assert_eq!(inner["entries"][0]["path"], "src/deep/x");
    let content = format!("{}/{c1}/files/content?path=", base(&chat.session));
    assert_eq!(
        bytes_of(&gw, &chat.token, &format!("{content}src/a.txt")).await,
        b"one\n"
    );
    assert_eq!(
        bytes_of(&gw, &chat.token, &format!("{content}blob.bin")).await,
        blob
    );
    let ranged = gw
        .request(
            reqwest::Method::GET,
            &chat.token,
            &format!("{content}blob.bin"),
        )
        .header("Range", "bytes=1000-1999")
        .send()
        .await
        .expect("sent");
    assert_eq!(ranged.status(), 206);
    assert_eq!(ranged.headers()["content-range"], "bytes 1000-1999/300000");
    assert_eq!(ranged.bytes().await.expect("a body"), blob[1000..2000]);

    // The diff of the second turn.
    let diff = gw
        .get_json(&chat.token, &format!("{}/{c2}/diff", base(&chat.session)))
        .await;
    assert_eq!(diff["against"], c1.as_str());
    let names = |key: &str| -> Vec<String> {
        diff[key]
            .as_array()
            .expect("an array")
            .iter()
            .map(|e| e["path"].as_str().expect("a string").to_owned())
            .collect()
    };
    assert_eq!(names("added"), ["b.txt", "gone.bin"], "{diff}");
    assert_eq!(names("removed"), ["blob.bin"], "{diff}");
    assert_eq!(names("modified"), ["src/a.txt"], "{diff}");
    let text = diff["modified"][0]["diff"].as_str().expect("a string");
    assert!(text.contains("-one") && text.contains("+two"), "{text}");
    assert_eq!(diff["removed"][0]["size"], 300_000);
    let first_diff = gw
        .get_json(&chat.token, &format!("{}/{c1}/diff", base(&chat.session)))
        .await;
    assert_eq!(first_diff["against"], Value::Null);
    assert_eq!(first_diff["added"].as_array().expect("an array").len(), 6);

    // Rewind to the first: byte for byte, what it replaced kept.
    let rewound = post(
        &gw,
        &chat.token,
        &format!("{}/{c1}/rewind", base(&chat.session)),
        json!({}),
    )
    .await;
    assert_eq!(rewound.status(), 202);
    let answer: Value = rewound.json().await.expect("a JSON body");
    assert_eq!(answer["checkpoint"]["id"], c1.as_str());
    let seen = chat
        .until("the rewound event", |e| e.event == "rewound")
        .await;
    let event = &seen.last().expect("an event").data;
    assert_eq!(event["checkpoint"], c1.as_str());
    assert_eq!(
        event["saved"],
        c3.as_str(),
        "nothing changed since c3: {event}"
    );
    let ws = chat.workspace();
    assert_eq!(read(&ws.join("src/a.txt")), b"one\n");
    assert_eq!(read(&ws.join("blob.bin")), blob);
    assert_eq!(read(&ws.join("src/deep/x")), b"x");
    assert_eq!(
        std::fs::read_link(ws.join("link")).expect("the link"),
        Path::new("src/a.txt")
    );
    assert!(
        !ws.join("b.txt").exists() && !ws.join("gone.bin").exists() && !ws.join("z.txt").exists()
    );
    // The agent's next prompt says so; its commands see the rewound files.
    let seen = chat.turn_ok("cat src/a.txt").await;
    let said = super::helpers::text_of(&seen);
    assert!(said.contains(&c1) && said.contains("one"), "{said}");

    // Fork the second checkpoint into a new session.
    let forked = post(
        &gw,
        &chat.token,
        &format!("{}/{c2}/fork", base(&chat.session)),
        json!({"title": "try again"}),
    )
    .await;
    assert_eq!(forked.status(), 201);
    let forked: Value = forked.json().await.expect("a JSON body");
    assert_eq!(forked["title"], "try again");
    let fork_id = forked["id"].as_str().expect("a string").to_owned();
    let fork_ws = gw.data.join("sessions").join(&fork_id).join("workspace");
    assert_eq!(read(&fork_ws.join("src/a.txt")), b"two\n");
    assert_eq!(read(&fork_ws.join("gone.bin")), blob);
    assert_eq!(read(&fork_ws.join("b.txt")), b"new\n");
    assert!(!fork_ws.join("blob.bin").exists() && !fork_ws.join("z.txt").exists());
    let fork_list = gw.get_json(&chat.token, &base(&fork_id)).await;
    assert_eq!(fork_list["checkpoints"][0]["id"], c2.as_str());
    let mut fork_events = gw.events(&chat.token, &fork_id, None).await;
    let seen = fork_events
        .until("the forked event", |e| e.event == "forked")
        .await;
    let forked_event = &seen.last().expect("an event").data;
    assert_eq!(forked_event["source_session"], chat.session.as_str());
    assert_eq!(forked_event["checkpoint"], c2.as_str());
    // The fork's hands run on those files.
    let mut fork_chat = Conversation {
        gw: &gw,
        token: chat.token.clone(),
        session: fork_id.clone(),
        events: fork_events,
    };
    let seen = fork_chat.turn_ok("cat b.txt src/a.txt").await;
    let said = super::helpers::text_of(&seen);
    assert!(said.contains("new") && said.contains("two"), "{said}");

    gw.stop().await;
}

#[tokio::test]
async fn a_file_written_while_its_checkpoint_reads_it_is_named_with_the_checkpoint() {
    let gw = in_bwrap(|_| {}).await;
    let mut chat = gw.conversation("phone-checkpoints-live").await;
    // A writer that keeps appending to a large file, past the end of its turn (throttled, so
    // the file stays tens of MB).
    let seen = chat
        .turn_ok(
            "head -c 30000000 /dev/urandom > log.bin && (setsid sh -c 'while :; do head -c 65536 \
             /dev/urandom >> log.bin; sleep 0.01; done' >/dev/null 2>&1 &); echo started",
        )
        .await;
    checkpoint_after(&mut chat.events, &seen, "the writer's turn").await;
    // Each turn's checkpoint reads log.bin again (its stat changed); one of them sees it change
    // while it reads. Bounded: at most eight turns.
    for attempt in 0..8 {
        let seen = chat.turn_ok(&format!("echo {attempt} > turn.txt")).await;
        let event = checkpoint_after(&mut chat.events, &seen, "a turn").await;
        let named = |value: &Value| {
            value["changed_under"]
                .as_array()
                .is_some_and(|names| names.iter().any(|name| name == "log.bin"))
        };
        if !named(&event) {
            assert!(event.get("changed_under").is_none(), "{event}");
            continue;
        }
        // The listing says it too, and the file reads as one read saw it: a prefix of what
        // the writer wrote, whole chunks of it.
        let id = event["id"].as_str().expect("an id");
        let listed = gw
            .get_json(&chat.token, &format!("{}?limit=1", base(&chat.session)))
            .await;
        assert_eq!(listed["checkpoints"][0]["id"], id);
        assert!(named(&listed["checkpoints"][0]), "{listed}");
        let stored = bytes_of(
            &gw,
            &chat.token,
            &format!("{}/{id}/files/content?path=log.bin", base(&chat.session)),
        )
        .await;
        let live = read(&chat.workspace().join("log.bin"));
        assert!(
            stored.len() >= 30_000_000 && live.starts_with(&stored),
            "{} stored bytes are the start of the {} live ones",
            stored.len(),
            live.len()
        );
        gw.stop().await;
        return;
    }
    panic!("eight checkpoints read log.bin while it grew and none saw it change");
}

#[tokio::test]
async fn bad_checkpoint_requests_get_their_status_and_code() {
    let gw = in_bwrap(|_| {}).await;
    let mut chat = gw.conversation("phone-checkpoints").await;
    let seen = chat.turn_ok("mkdir d && printf 'a' > d/f").await;
    let c1 = checkpoint_after(&mut chat.events, &seen, "the turn").await["id"]
        .as_str()
        .expect("a string")
        .to_owned();
    let b = base(&chat.session);
    let other = gw.register("laptop-checkpoints").await;
    let cases: Vec<(String, &str, u16, &str)> = vec![
        (
            b.clone(),
            "another owner's session",
            404,
            "SESSION_NOT_FOUND",
        ),
        (
            format!("{b}/{c1}/files"),
            "another owner's checkpoint",
            404,
            "SESSION_NOT_FOUND",
        ),
    ];
    for (path, what, status, code) in cases {
        let got = status_and_code(gw.get(&other, &path).await).await;
        assert_eq!(got, (status, code.to_owned()), "{what}");
    }
    let unknown = "000000000001-00000000";
    let cases: Vec<(String, &str, u16, &str)> = vec![
        (format!("{b}?limit=0"), "limit 0", 400, "INVALID_QUERY"),
        (
            format!("{b}?limit=201"),
            "limit over 200",
            400,
            "INVALID_QUERY",
        ),
        (
            format!("{b}?limit=x"),
            "limit not a number",
            400,
            "INVALID_QUERY",
        ),
        (
            format!("{b}?before={unknown}"),
            "before naming nothing",
            404,
            "CHECKPOINT_NOT_FOUND",
        ),
        (
            format!("{b}/{unknown}/files"),
            "an unknown checkpoint",
            404,
            "CHECKPOINT_NOT_FOUND",
        ),
        (
            format!("{b}/..%2F..%2Fmeta/files"),
            "an id that is a path",
            404,
            "CHECKPOINT_NOT_FOUND",
        ),
        (
            format!("{b}/{c1}/files?path=../x"),
            "a path above the root",
            403,
            "PATH_ESCAPE",
        ),
        (
            format!("{b}/{c1}/files?path=nope"),
            "a missing directory",
            404,
            "FILE_NOT_FOUND",
        ),
        (
            format!("{b}/{c1}/files?path=d/f"),
            "a file listed as a directory",
            409,
            "NOT_A_DIRECTORY",
        ),
        (
            format!("{b}/{c1}/files?depth=9"),
            "depth over 5",
            400,
            "INVALID_QUERY",
        ),
        (
            format!("{b}/{c1}/files/content?path=d"),
            "a directory's content",
            403,
            "NOT_REGULAR_FILE",
        ),
        (
            format!("{b}/{c1}/files/content"),
            "content of the root",
            400,
            "INVALID_PATH",
        ),
        (
            format!("{b}/{c1}/files/content?path=d/none"),
            "a missing file",
            404,
            "FILE_NOT_FOUND",
        ),
        (
            format!("{b}/{c1}/diff?against={unknown}"),
            "a diff against nothing",
            404,
            "CHECKPOINT_NOT_FOUND",
        ),
    ];
    for (path, what, status, code) in cases {
        let got = status_and_code(gw.get(&chat.token, &path).await).await;
        assert_eq!(got, (status, code.to_owned()), "{what}: GET {path}");
    }
    let range = gw
        .request(
            reqwest::Method::GET,
            &chat.token,
            &format!("{b}/{c1}/files/content?path=d/f"),
        )
        .header("Range", "bytes=5-9")
        .send()
        .await
        .expect("sent");
    assert_eq!(range.status(), 416);
    assert_eq!(range.headers()["content-range"], "bytes */1");
    for (body, what) in [
        (json!({"restart": "yes"}), "restart not a boolean"),
        (json!({"bogus": true}), "an unknown field"),
        (json!([1]), "not an object"),
    ] {
        let got =
            status_and_code(post(&gw, &chat.token, &format!("{b}/{c1}/rewind"), body).await).await;
        assert_eq!(got, (400, "INVALID_REQUEST_BODY".into()), "{what}");
    }
    let long = "t".repeat(201);
    let got = status_and_code(
        post(
            &gw,
            &chat.token,
            &format!("{b}/{c1}/fork"),
            json!({"title": long}),
        )
        .await,
    )
    .await;
    assert_eq!(got, (400, "INVALID_REQUEST_BODY".into()), "a long title");
    let got = status_and_code(
        post(
            &gw,
            &chat.token,
            &format!("{b}/{unknown}/rewind"),
            json!({}),
        )
        .await,
    )
    .await;
    assert_eq!(got, (404, "CHECKPOINT_NOT_FOUND".into()));

    // A rewind while a turn runs is refused and changes nothing.
    chat.start_working("printf 'b' > d/f && sleep 30").await;
    let written = chat.workspace().join("d/f");
    let deadline = std::time::Instant::now() + super::helpers::WAIT;
    while read(&written) != b"b" {
        assert!(
            std::time::Instant::now() < deadline,
            "the command never wrote d/f"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let got =
        status_and_code(post(&gw, &chat.token, &format!("{b}/{c1}/rewind"), json!({})).await).await;
    assert_eq!(got, (409, "TURN_RUNNING".into()));
    assert_eq!(chat.cancel().await.status(), 202);
    let seen = chat.until_turn_end("the cancelled sleep").await;
    let c2 = checkpoint_after(&mut chat.events, &seen, "the cancelled turn").await["id"]
        .as_str()
        .expect("a string")
        .to_owned();
    assert_eq!(read(&chat.workspace().join("d/f")), b"b");

    // A corrupted chunk: found by its hash, the rewind and the fork change nothing.
    let chunks = chunk_files(&gw.data, &chat.session);
    assert!(!chunks.is_empty());
    for chunk in &chunks {
        let mut bytes = read(chunk);
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(chunk, bytes).expect("a chunk written");
    }
    let got =
        status_and_code(post(&gw, &chat.token, &format!("{b}/{c1}/rewind"), json!({})).await).await;
    assert_eq!(got, (409, "CHECKPOINT_BROKEN".into()), "a broken rewind");
    assert_eq!(read(&chat.workspace().join("d/f")), b"b", "nothing changed");
    let got =
        status_and_code(post(&gw, &chat.token, &format!("{b}/{c2}/fork"), json!({})).await).await;
    assert_eq!(got, (409, "CHECKPOINT_BROKEN".into()), "a broken fork");
    let sessions = gw.get_json(&chat.token, "/sessions").await;
    assert_eq!(
        sessions["sessions"].as_array().expect("an array").len(),
        1,
        "a failed fork leaves no session: {sessions}"
    );
    let got = status_and_code(
        gw.get(&chat.token, &format!("{b}/{c1}/files/content?path=d/f"))
            .await,
    )
    .await;
    assert_eq!(got, (409, "CHECKPOINT_BROKEN".into()));
    gw.stop().await;
}

#[tokio::test]
async fn with_snapshots_in_s3_checkpoints_live_in_the_bucket_and_rewind_and_fork_from_it() {
    use warren_test_support::services::S3;
    let s3 = S3::start();
    s3.create_bucket("checkpoints");
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let args = ["--snapshots", "s3://checkpoints/warren"].map(str::to_owned);
    let gateway = super::helpers::GatewayProcess::start(&data, &args, &s3.env());
    let token = gateway.register("phone-checkpoints-s3").await;
    let session = gateway.create_session(&token).await;
    let mut events = gateway.events(&token, &session, None).await;
    let mut ids = Vec::new();
    for text in ["v1", "v2"] {
        let seen = gateway
            .turn(
                &token,
                &session,
                &mut events,
                &format!("printf '{text}' > f.txt"),
            )
            .await;
        let id = checkpoint_after(&mut events, &seen, text).await["id"]
            .as_str()
            .expect("a string")
            .to_owned();
        ids.push(id);
    }
    let (c1, c2) = (&ids[0], &ids[1]);
    let keys = super::snapshots_s3::keys_of(&s3, "checkpoints", &session).await;
    let manifest = format!("warren/sessions/{session}/checkpoints/workspace/manifests/{c1}");
    assert!(keys.contains(&manifest), "{keys:#?}");
    assert!(
        keys.iter()
            .any(|k| k.contains("/checkpoints/workspace/chunks/")),
        "{keys:#?}"
    );
    let session_dir = data.join("sessions").join(&session);
    // The gateway's disk holds this replica's copy (an archive restores while the bucket is
    // down); the bucket is where they are.
    assert!(
        session_dir
            .join("checkpoints/workspace/manifests")
            .join(c1)
            .is_file(),
        "this replica's copy"
    );
    let b = base(&session);
    let content = gateway
        .get(&token, &format!("{b}/{c1}/files/content?path=f.txt"))
        .await;
    assert_eq!(content.status(), 200);
    assert_eq!(content.bytes().await.expect("a body").as_ref(), b"v1");
    let rewound = gateway
        .request(reqwest::Method::POST, &token, &format!("{b}/{c1}/rewind"))
        .json(&json!({}))
        .send()
        .await
        .expect("sent");
    assert_eq!(rewound.status(), 202);
    assert_eq!(read(&session_dir.join("workspace/f.txt")), b"v1");
    let forked = gateway
        .request(reqwest::Method::POST, &token, &format!("{b}/{c2}/fork"))
        .json(&json!({}))
        .send()
        .await
        .expect("sent");
    assert_eq!(forked.status(), 201);
    let forked: Value = forked.json().await.expect("a JSON body");
    let fork_id = forked["id"].as_str().expect("a string");
    assert_eq!(
        read(&data.join("sessions").join(fork_id).join("workspace/f.txt")),
        b"v2"
    );
    let deleted = gateway
        .delete(&token, &format!("/sessions/{session}"))
        .await;
    assert_eq!(deleted.status(), 204);
    let keys = super::snapshots_s3::keys_of(&s3, "checkpoints", &session).await;
    assert!(
        keys.is_empty(),
        "a deleted session's checkpoints go: {keys:#?}"
    );
}

#[tokio::test]
async fn a_checkpoint_exports_as_a_tar_zst_that_unpacks_to_its_files() {
    let gw = in_bwrap(|_| {}).await;
    let mut chat = gw.conversation("phone-checkpoints-export").await;
    let seen = chat
        .turn_ok(
            "mkdir -p src/empty && printf 'one\\n' > src/a.txt && chmod 640 src/a.txt \
             && head -c 300000 /dev/urandom > blob.bin && ln -s src/a.txt link",
        )
        .await;
    let id = checkpoint_after(&mut chat.events, &seen, "the turn").await["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    let path = format!("{}/{id}/export", base(&chat.session));
    let response = gw.get(&chat.token, &path).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/zstd");
    let disposition = response.headers()["content-disposition"]
        .to_str()
        .expect("ASCII")
        .to_owned();
    assert!(
        disposition.contains(&format!("{}-{id}.tar.zst", chat.session)),
        "{disposition}"
    );
    let body = response.bytes().await.expect("the export");
    // Unpacked by the snapshot format's own checked unpack: the workspace as it was.
    let unpacked = tempfile::tempdir().expect("a directory to unpack into");
    warren_snapshot::unpack(&body[..], unpacked.path(), &Default::default())
        .expect("the export unpacks");
    assert_eq!(digest(unpacked.path()), digest(&chat.workspace()));

    let unknown = gw
        .get(&chat.token, &format!("{}/nope/export", base(&chat.session)))
        .await;
    assert_eq!(
        status_and_code(unknown).await,
        (404, "CHECKPOINT_NOT_FOUND".to_owned())
    );
    let other = gw.register("laptop-checkpoints-export").await;
    let foreign = gw.get(&other, &path).await;
    assert_eq!(
        status_and_code(foreign).await,
        (404, "SESSION_NOT_FOUND".to_owned())
    );
    gw.stop().await;
}

#[tokio::test]
async fn old_checkpoints_go_by_the_keep_flag_and_the_newest_stay_readable() {
    let gw = in_bwrap(|args| args.checkpoints_keep = 2).await;
    let mut chat = gw.conversation("phone-checkpoints-keep").await;
    let mut ids = Vec::new();
    for n in 1..=4 {
        let seen = chat
            .turn_ok(&format!(
                "printf '{n}' > n.txt && head -c 100000 /dev/urandom > r{n}"
            ))
            .await;
        let id = checkpoint_after(&mut chat.events, &seen, &format!("turn {n}")).await["id"]
            .as_str()
            .expect("a string")
            .to_owned();
        ids.push(id);
    }
    // Two kept and one spare: the fourth takes the list over, and it is cut to two.
    let list = gw.get_json(&chat.token, &base(&chat.session)).await;
    let listed: Vec<&str> = list["checkpoints"]
        .as_array()
        .expect("an array")
        .iter()
        .map(|c| c["id"].as_str().expect("a string"))
        .collect();
    assert_eq!(listed, [ids[3].as_str(), ids[2].as_str()], "{list}");
    let gone = status_and_code(
        gw.get(
            &chat.token,
            &format!("{}/{}/files", base(&chat.session), ids[0]),
        )
        .await,
    )
    .await;
    assert_eq!(gone, (404, "CHECKPOINT_NOT_FOUND".into()));
    let kept = format!("{}/{}/files/content?path=r3", base(&chat.session), ids[2]);
    assert_eq!(
        bytes_of(&gw, &chat.token, &kept).await,
        read(&chat.workspace().join("r3")),
        "the chunks kept checkpoints use stay"
    );
    gw.stop().await;
}

/// Every path beneath `root` with what it is: a file's mode and SHA-256, a link's target, a
/// directory's mode.
fn digest(root: &Path) -> std::collections::BTreeMap<String, String> {
    use sha2::Digest;
    use std::os::unix::fs::PermissionsExt;
    let mut out = std::collections::BTreeMap::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("a directory") {
            let path = entry.expect("an entry").path();
            let rel = path
                .strip_prefix(root)
                .expect("beneath the root")
                .to_string_lossy()
                .into_owned();
            let meta = std::fs::symlink_metadata(&path).expect("stat");
            let mode = meta.permissions().mode() & 0o7777;
            let what = if meta.file_type().is_symlink() {
                format!(
                    "link {}",
                    std::fs::read_link(&path).expect("a link").display()
                )
            } else if meta.is_dir() {
                pending.push(path.clone());
                format!("dir {mode:o}")
            } else {
                let bytes = std::fs::read(&path).expect("a file");
                format!(
                    "file {mode:o} {}",
                    hex::encode(sha2::Sha256::digest(&bytes))
                )
            };
            out.insert(rel, what);
        }
    }
    out
}

#[tokio::test]
async fn real_workspaces_a_git_clone_a_node_tree_and_a_200_mib_file_rewind_and_fork_file_by_file() {
    let gw = in_bwrap(|_| {}).await;
    let mut chat = gw.conversation("phone-checkpoints-real").await;
    // A medium repository made here (2,400 files in 40 directories), cloned in the workspace;
    // a node_modules of 300 packages; 200 MiB of noise.
    let seen = chat.turn_ok(
        "set -e; mkdir -p /tmp/origin && cd /tmp/origin && git init -q \
         && for d in $(seq 1 40); do mkdir d$d; for f in $(seq 1 60); do echo \"line $d $f\" > d$d/f$f.txt; done; done \
         && git add -A && git -c user.email=w@example.com -c user.name=w commit -qm init \
         && cd \"$OLDPWD\" && git clone -q /tmp/origin repo \
         && for p in $(seq 1 300); do mkdir -p node_modules/pkg$p/lib; echo '{\"name\":\"pkg'$p'\"}' > node_modules/pkg$p/package.json; \
            for f in 1 2 3 4; do echo \"module.exports = $p$f;\" > node_modules/pkg$p/lib/f$f.js; done; done \
         && chmod 755 node_modules/pkg1/lib/f1.js && ln -s node_modules/pkg2 linked \
         && head -c 209715200 /dev/urandom > big.bin",
    )
    .await;
    let first = checkpoint_after(&mut chat.events, &seen, "the first turn").await;
    let c1 = first["id"].as_str().expect("a string").to_owned();
    assert!(
        first["files_changed"].as_u64().expect("a number") > 2400 + 1500,
        "{first}"
    );
    let ws = chat.workspace();
    let before = digest(&ws);

    // One MiB of the big file, a tracked file, a package gone, a commit.
    let seen = chat
        .turn_ok(
            "set -e; dd if=/dev/urandom of=big.bin bs=1M count=1 seek=100 conv=notrunc status=none \
         && echo changed >> repo/d7/f7.txt && rm -r node_modules/pkg300 \
         && cd repo && git -c user.email=w@example.com -c user.name=w commit -qam change",
        )
        .await;
    let second = checkpoint_after(&mut chat.events, &seen, "the 1 MiB turn").await;
    let c2 = second["id"].as_str().expect("a string").to_owned();
    let stored = second["bytes_new"].as_u64().expect("a number");
    assert!(
        stored < 4 << 20,
        "1 MiB changed in 200 MiB stores about that: {second}"
    );
    let after = digest(&ws);
    assert_ne!(before, after);

    let rewound = post(
        &gw,
        &chat.token,
        &format!("{}/{c1}/rewind", base(&chat.session)),
        json!({}),
    )
    .await;
    assert_eq!(rewound.status(), 202);
    assert_eq!(digest(&ws), before, "the rewind puts back every file");
    let seen = chat
        .turn_ok("cd repo && git status --porcelain && git log --oneline | wc -l")
        .await;
    let said = super::helpers::text_of(&seen);
    assert!(!said.contains("f7.txt"), "git sees a clean clone: {said}");

    let forked = post(
        &gw,
        &chat.token,
        &format!("{}/{c2}/fork", base(&chat.session)),
        json!({}),
    )
    .await;
    assert_eq!(forked.status(), 201);
    let forked: Value = forked.json().await.expect("a JSON body");
    let fork_ws = gw
        .data
        .join("sessions")
        .join(forked["id"].as_str().expect("a string"))
        .join("workspace");
    assert_eq!(
        digest(&fork_ws),
        after,
        "the fork holds the second checkpoint"
    );
    gw.stop().await;
}

/// Remote hands (`--hands-provider remote`, a real `warren execd` on a temp root): each turn's
/// checkpoint is streamed by their execd (the gateway has no tree of theirs), a rewind patches
/// their tree, and a fork seeds the new session's execd. One execd serves every session here,
/// as the URL template has no `{session}`: the fork's patch replaces that same root, exactly.
#[tokio::test]
async fn remote_hands_are_checkpointed_rewound_and_forked_through_their_execd() {
    let execd = super::sandbox::RemoteExecd::start("t").await;
    let url = execd.url.clone();
    let gw = TestGateway::start_changed(super::helpers::args_with_shell_agent, |args| {
        args.hands_provider = warren_gateway::config::HandsProviderKind::Remote;
        args.hands_url_template = Some(url);
        args.hands_token = Some("t".into());
    })
    .await;
    let mut chat = gw.conversation("phone-checkpoints-remote").await;
    let root = execd.root.path().to_path_buf();
    let seen = chat
        .turn_ok(
            "mkdir -p src && printf 'one\\n' > src/a.txt && head -c 2000000 /dev/urandom > big.bin \
             && ln -s src/a.txt link && chmod 640 src/a.txt",
        )
        .await;
    let first = checkpoint_after(&mut chat.events, &seen, "the first remote turn").await;
    assert_eq!(first["files_changed"], 3, "a.txt, big.bin, link: {first}");
    assert!(
        first["bytes_new"].as_u64().expect("a number") > 2_000_000 / 2,
        "{first}"
    );
    let c1 = first["id"].as_str().expect("a string").to_owned();
    assert!(
        !chat.workspace().join("big.bin").exists(),
        "no tree of remote hands on the gateway's disk"
    );
    let session_dir = gw.data.join("sessions").join(&chat.session);
    assert!(
        !session_dir.join("snapshot.tar.zst").exists(),
        "no whole tar is written after a remote turn"
    );
    let big = read(&root.join("big.bin"));

    let seen = chat
        .turn_ok("printf 'two\\n' > src/a.txt && printf 'new\\n' > b.txt")
        .await;
    let second = checkpoint_after(&mut chat.events, &seen, "the second remote turn").await;
    assert_eq!(second["files_changed"], 2, "a.txt, b.txt: {second}");
    assert!(
        second["bytes_new"].as_u64().expect("a number") < 50_000,
        "big.bin was neither sent nor stored again: {second}"
    );
    let c2 = second["id"].as_str().expect("a string").to_owned();
    // A change through the files API is checkpointed too, a second later (no turn runs, and
    // the second turn's checkpoint is stored: nothing else takes it).
    let uploaded = gw
        .request(
            reqwest::Method::PUT,
            &chat.token,
            &format!("/sessions/{}/files/content?path=up.txt", chat.session),
        )
        .body("uploaded")
        .send()
        .await
        .expect("answers");
    assert!(uploaded.status().is_success(), "{}", uploaded.status());
    let seen = chat
        .until("the files' checkpoint", |e| {
            e.event == "checkpoint" || e.event == "error"
        })
        .await;
    let files = &seen.last().expect("an event").data;
    assert_eq!(files["reason"], "files", "{files}");
    assert_eq!(files["files_changed"], 1, "{files}");
    let c_files = files["id"].as_str().expect("a string").to_owned();
    assert_eq!(
        bytes_of(
            &gw,
            &chat.token,
            &format!(
                "{}/{c_files}/files/content?path=up.txt",
                base(&chat.session)
            )
        )
        .await,
        b"uploaded"
    );
    // A turn that changed nothing stores none.
    chat.turn_ok("true").await;
    let list = gw.get_json(&chat.token, &base(&chat.session)).await;
    assert_eq!(list["checkpoints"][0]["id"], c_files.as_str(), "{list}");
    assert_eq!(list["checkpoints"][1]["id"], c2.as_str(), "{list}");
    assert_eq!(list["checkpoints"][2]["id"], c1.as_str(), "{list}");

    // Read and diffed from the store, like local hands' checkpoints.
    let content = format!("{}/{c1}/files/content?path=", base(&chat.session));
    assert_eq!(
        bytes_of(&gw, &chat.token, &format!("{content}big.bin")).await,
        big
    );
    let diff = gw
        .get_json(&chat.token, &format!("{}/{c2}/diff", base(&chat.session)))
        .await;
    assert_eq!(diff["added"][0]["path"], "b.txt", "{diff}");
    assert_eq!(diff["modified"][0]["path"], "src/a.txt", "{diff}");

    // A rewind patches the execd's tree: b.txt goes, a.txt is back, big.bin untouched.
    let big_inode = std::fs::metadata(root.join("big.bin"))
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .expect("big.bin");
    let rewound = post(
        &gw,
        &chat.token,
        &format!("{}/{c1}/rewind", base(&chat.session)),
        json!({}),
    )
    .await;
    assert_eq!(rewound.status(), 202);
    chat.until("the rewound event", |e| e.event == "rewound")
        .await;
    assert_eq!(read(&root.join("src/a.txt")), b"one\n");
    assert!(!root.join("b.txt").exists() && !root.join("up.txt").exists());
    assert_eq!(
        std::fs::read_link(root.join("link")).expect("the link"),
        Path::new("src/a.txt")
    );
    let mode = std::fs::metadata(root.join("src/a.txt"))
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
        .expect("a.txt");
    assert_eq!(mode, 0o640);
    let same_inode = std::fs::metadata(root.join("big.bin"))
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .expect("big.bin");
    assert_eq!(same_inode, big_inode, "an unchanged file is not rewritten");
    let seen = chat.turn_ok("cat src/a.txt").await;
    let said = super::helpers::text_of(&seen);
    assert!(said.contains(&c1) && said.contains("one"), "{said}");

    // A fork of c2 seeds its execd's tree from empty: exactly c2's files.
    std::fs::write(root.join("stray.txt"), "not in c2").expect("a stray file");
    let forked = post(
        &gw,
        &chat.token,
        &format!("{}/{c2}/fork", base(&chat.session)),
        json!({}),
    )
    .await;
    assert_eq!(forked.status(), 201);
    assert_eq!(read(&root.join("src/a.txt")), b"two\n");
    assert_eq!(read(&root.join("b.txt")), b"new\n");
    assert_eq!(read(&root.join("big.bin")), big);
    assert!(
        !root.join("stray.txt").exists(),
        "the fork's tree is c2's alone"
    );
    gw.stop().await;
    execd.stop().await;
}
