//! OpenSandbox-compatible commands, bash sessions, health, metrics and auth against a real
//! `warren execd` router on 127.0.0.1:0 (execd-compat.md).

use crate::opensandbox_support;

use futures_util::StreamExt;
use opensandbox_support::*;
use serde_json::{Value, json};
use warren_test_support::{WAIT, eventually_async, wait_until_dead};

#[tokio::test]
async fn foreground_command_streams_init_ping_output_lines_and_completion() {
    let server = Server::start().await;
    let events = server.run_command("echo a; echo b >&2; printf c").await;
    assert_eq!(kinds(&events[..2]), ["init", "ping"]);
    let id = events[0]["text"].as_str().expect("init carries the id");
    assert_eq!(id.len(), 32);
    assert!(
        id.chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    );
    assert_eq!(events[1]["text"], "pong");
    assert_eq!(texts(&events, "stdout"), ["a", "c"]);
    assert_eq!(texts(&events, "stderr"), ["b"]);
    let last = events.last().expect("a final event");
    assert_eq!(last["type"], "execution_complete");
    assert!(last["execution_time"].is_u64());
    assert!(
        last.get("error").is_none() && last.get("text").is_none(),
        "empty fields are omitted"
    );
}

#[tokio::test]
async fn empty_lines_are_sent_as_a_newline_and_crlf_ends_one_line() {
    let server = Server::start().await;
    let events = server.run_command(r"printf 'x\r\n\ny\rz'").await;
    assert_eq!(texts(&events, "stdout"), ["x", "\n", "y", "z"]);
}

#[tokio::test]
async fn failing_command_ends_with_an_error_event_carrying_the_exit_code() {
    let server = Server::start().await;
    let events = server.run_command("echo out; exit 3").await;
    assert!(!kinds(&events).contains(&"execution_complete".to_owned()));
    let last = events.last().expect("a final event");
    assert_eq!(last["type"], "error");
    assert_eq!(last["error"]["ename"], "CommandExecError");
    assert_eq!(last["error"]["evalue"], "3");
    assert_eq!(last["error"]["traceback"], json!(["exit status 3"]));
}

#[tokio::test]
async fn timeout_kills_the_command_and_reports_minus_one() {
    let server = Server::start().await;
    let events = server
        .run(json!({"command": "sleep 30", "timeout": 200}))
        .await;
    let last = events.last().expect("a final event");
    assert_eq!(last["error"]["evalue"], "-1");
    let status = server.command_status(&command_id(&events)).await;
    assert_eq!(status["running"], false);
    assert_eq!(status["exit_code"], -1);
}

#[tokio::test]
async fn an_enormous_timeout_is_accepted() {
    let server = Server::start().await;
    let events = server
        .run(json!({"command": "true", "timeout": i64::MAX}))
        .await;
    assert_eq!(events.last().expect("final")["type"], "execution_complete");
    let id = server.create_session(json!({})).await;
    let events = server
        .run_in_session(&id, json!({"command": "true", "timeout": i64::MAX}))
        .await;
    assert_eq!(events.last().expect("final")["type"], "execution_complete");
}

#[tokio::test]
async fn argv_runs_without_a_shell() {
    let server = Server::start().await;
    let events = server.run(json!({"argv": ["echo", "$HOME", "a  b"]})).await;
    assert_eq!(texts(&events, "stdout"), ["$HOME a  b"]);
}

#[tokio::test]
async fn a_command_that_cannot_start_sends_init_then_the_os_error() {
    let server = Server::start().await;
    let events = server.run(json!({"argv": ["/nonexistent/program"]})).await;
    assert_eq!(kinds(&events), ["init", "error"]);
    let evalue = events[1]["error"]["evalue"].as_str().expect("evalue");
    assert!(evalue.contains("No such file"), "{evalue}");
    let status = server.command_status(&command_id(&events)).await;
    assert_eq!(status["running"], false, "{status}");
    assert!(status["finished_at"].is_string(), "{status}");
    assert!(
        status["error"]
            .as_str()
            .is_some_and(|e| e.contains("No such file")),
        "the record keeps the OS error: {status}"
    );
}

#[tokio::test]
async fn invalid_command_requests_are_rejected_with_400() {
    let server = Server::start().await;
    let cases = [
        json!({}),
        json!({"command": "  "}),
        json!({"argv": []}),
        json!({"command": "true", "argv": ["true"]}),
        json!({"command": "true", "timeout": 0}),
        json!({"command": "true", "gid": 0}),
        json!({"command": "true", "cwd": "/nonexistent/dir"}),
        json!({"command": "true", "cwd": "/etc/hostname"}),
        json!({"command": 5}),
    ];
    for body in cases {
        let (status, code, _) = error_body(server.post_json("/command", body.clone()).await).await;
        assert_eq!(
            (status, code.as_str()),
            (400, "INVALID_REQUEST_BODY"),
            "{body}"
        );
    }
    let response = send(
        server
            .client
            .post(server.url("/command"))
            .header("content-type", "application/json")
            .body("{not json"),
    )
    .await;
    assert_eq!(error_body(response).await.1, "INVALID_REQUEST_BODY");
}

#[tokio::test]
async fn envs_and_cwd_apply_to_the_command_and_the_token_is_not_inherited() {
    let server = Server::start().await;
    let dir = server.path("work");
    std::fs::create_dir(&dir).expect("mkdir");
    let events = server
        .run(json!({"command": "echo $FOO; pwd; echo ${EXECD_ACCESS_TOKEN:-unset}", "cwd": dir, "envs": {"FOO": "bar"}}))
        .await;
    assert_eq!(texts(&events, "stdout"), ["bar", dir.as_str(), "unset"]);
}

#[tokio::test]
async fn output_is_streamed_while_the_command_runs() {
    let server = Server::start().await;
    let mut stream = server
        .command_stream(json!({"command": "echo first; sleep 30; echo never"}))
        .await;
    let mut text = String::new();
    let id = tokio::time::timeout(WAIT, async {
        while let Some(chunk) = stream.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
            if text.contains("\"first\"") {
                break;
            }
        }
        command_id(&parse_events(&text))
    })
    .await
    .expect("the first line arrives while the command still runs");
    assert_eq!(server.command_status(&id).await["running"], true);
    assert_eq!(server.interrupt(&id).await.status(), 200);
    let rest = tokio::time::timeout(WAIT, async {
        let mut rest = String::new();
        while let Some(chunk) = stream.next().await {
            rest.push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
        }
        rest
    })
    .await
    .expect("the stream ends after the interrupt");
    let last = parse_events(&rest).pop().expect("a final event");
    assert_eq!(last["error"]["evalue"], "-1");
}

#[tokio::test]
async fn background_command_reports_status_and_logs_with_a_cursor() {
    let server = Server::start().await;
    let events = server
        .run(json!({"command": "echo one; echo two >&2; echo three", "background": true}))
        .await;
    assert_eq!(kinds(&events), ["init", "ping", "execution_complete"]);
    let id = command_id(&events);
    let status = server
        .wait_until_finished(&id, "the background command to finish")
        .await;
    assert_eq!(status["exit_code"], 0);
    assert_eq!(status["content"], "echo one; echo two >&2; echo three");
    assert!(
        status["started_at"]
            .as_str()
            .is_some_and(|s| s.ends_with('Z'))
    );
    assert!(status["finished_at"].is_string());

    let response = server.get(&format!("/command/{id}/logs?cursor=0")).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["EXECD-COMMANDS-TAIL-CURSOR"], "14");
    assert_eq!(response.text().await.expect("text"), "one\ntwo\nthree\n");
    let response = server.get(&format!("/command/{id}/logs?cursor=4")).await;
    assert_eq!(response.text().await.expect("text"), "two\nthree\n");
    let response = server.get(&format!("/command/{id}/logs?cursor=abc")).await;
    assert_eq!(response.text().await.expect("text"), "one\ntwo\nthree\n");
    let response = server.get(&format!("/command/{id}/logs?cursor=14")).await;
    assert_eq!(response.headers()["EXECD-COMMANDS-TAIL-CURSOR"], "14");
    assert_eq!(response.text().await.expect("text"), "");
}

#[tokio::test]
async fn a_descendant_holding_stdout_open_does_not_hold_the_stream() {
    let server = Server::start().await;
    let events = server.run_command("sleep 30 & echo \"started $!\"").await;
    let stdout = texts(&events, "stdout");
    assert_eq!(stdout.len(), 1, "{stdout:?}");
    let sleeper: i32 = stdout[0]
        .strip_prefix("started ")
        .and_then(|pid| pid.parse().ok())
        .expect("the command prints `started <pid>`");
    assert_eq!(events.last().expect("final")["type"], "execution_complete");
    // The stream ended while its descendant lives on (as in OpenSandbox); end it here.
    let sleeper = rustix::process::Pid::from_raw(sleeper).expect("positive pid");
    rustix::process::kill_process(sleeper, rustix::process::Signal::KILL)
        .expect("kills the sleeper");
}

#[tokio::test]
async fn background_output_is_capped_with_a_marker() {
    let server = Server::start().await;
    let id = server
        .start_background("head -c 9000000 /dev/zero | tr '\\0' x; echo")
        .await;
    server
        .wait_until_finished(&id, "the noisy background command to finish")
        .await;
    let response = server.get(&format!("/command/{id}/logs")).await;
    let cursor: u64 = response.headers()["EXECD-COMMANDS-TAIL-CURSOR"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("number");
    let body = response.bytes().await.expect("body");
    assert_eq!(cursor, body.len() as u64);
    assert!(
        body.len() < 8 * 1024 * 1024 + 100,
        "log is capped, got {} bytes",
        body.len()
    );
    let tail = String::from_utf8_lossy(&body[body.len() - 60..]).into_owned();
    assert!(
        tail.contains("output truncated"),
        "marker at the end: {tail:?}"
    );
}

#[tokio::test]
async fn background_stdin_is_dev_null() {
    let server = Server::start().await;
    let id = server.start_background("cat; echo done").await;
    let logs = eventually_async("the background command to read end of file", || async {
        let text = server
            .get(&format!("/command/{id}/logs"))
            .await
            .text()
            .await
            .ok()?;
        (text == "done\n").then_some(text)
    })
    .await;
    assert_eq!(logs, "done\n");
}

#[tokio::test]
async fn unknown_commands_and_foreground_logs_are_errors() {
    let server = Server::start().await;
    let (status, code, message) = error_body(server.get("/command/status/nope").await).await;
    assert_eq!(
        (status, code.as_str(), message.as_str()),
        (404, "INVALID_REQUEST_BODY", "command not found: nope")
    );
    assert_error(
        server.get("/command/nope/logs").await,
        400,
        "INVALID_REQUEST_BODY",
    )
    .await;
    let id = command_id(&server.run_command("true").await);
    assert_error(
        server.get(&format!("/command/{id}/logs")).await,
        400,
        "INVALID_REQUEST_BODY",
    )
    .await;
}

#[tokio::test]
async fn interrupt_kills_a_running_background_command_and_refuses_finished_ones() {
    let server = Server::start().await;
    let id = server.start_background("sleep 30").await;
    assert_eq!(server.interrupt(&id).await.status(), 200);
    let status = server
        .wait_until_finished(&id, "the interrupted command to be recorded as finished")
        .await;
    assert_eq!(status["exit_code"], -1);
    assert_error(server.interrupt(&id).await, 500, "RUNTIME_ERROR").await;
    assert_error(
        server.delete("/command?id=unknown").await,
        500,
        "RUNTIME_ERROR",
    )
    .await;
    assert_error(server.delete("/command").await, 400, "MISSING_QUERY").await;
}

#[tokio::test]
async fn interrupt_kills_grandchildren_in_new_sessions_too() {
    let server = Server::start().await;
    let pid_file = server.path("grandchild.pid");
    let command = format!("setsid sleep 300 & echo $! > {pid_file}; wait");
    let id = server.start_background(&command).await;
    let pid: i32 = eventually_async("the grandchild pid file", || async {
        std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok()
    })
    .await;
    assert_eq!(server.interrupt(&id).await.status(), 200);
    wait_until_dead(pid, "the setsid grandchild to be gone").await;
}

#[tokio::test]
async fn finished_records_expire_and_take_their_logs_with_them() {
    let server = Server::start_with(|config| config.command_retention_secs = 0).await;
    let log_dir = server.execd.opensandbox.command_log_dir().to_path_buf();
    let id = server.start_background("echo hi").await;
    eventually_async("the finished record to expire", || async {
        (server.get(&format!("/command/status/{id}")).await.status() == 404).then_some(())
    })
    .await;
    eventually_async("the expired command's log file to be deleted", || async {
        let n_files = std::fs::read_dir(&log_dir).ok()?.count();
        (n_files == 0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn only_the_newest_finished_records_are_kept_beyond_the_cap() {
    const MAX: usize = 4;
    let server = Server::start_with(|config| config.command_records_max = MAX).await;
    let log_dir = server.execd.opensandbox.command_log_dir().to_path_buf();
    let mut ids = Vec::with_capacity(MAX + 2);
    let background = server.start_background("echo hi").await;
    server
        .wait_until_finished(&background, "the background command")
        .await;
    ids.push(background);
    for _ in 0..MAX {
        let events = server.run_command("true").await;
        assert_eq!(events.last().expect("final")["type"], "execution_complete");
        ids.push(command_id(&events));
    }
    let oldest = server.get(&format!("/command/status/{}", ids[0])).await;
    assert_error(oldest, 404, "INVALID_REQUEST_BODY").await;
    for id in &ids[1..] {
        assert_eq!(server.command_status(id).await["running"], false);
    }
    eventually_async(
        "the dropped background command's log file to be deleted",
        || async {
            let n_files = std::fs::read_dir(&log_dir).ok()?.count();
            (n_files == 0).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn a_client_that_leaves_does_not_kill_the_command() {
    let server = Server::start().await;
    let marker = server.path("marker");
    let mut stream = server
        .command_stream(json!({"command": format!("sleep 0.3; touch {marker}")}))
        .await;
    let first = tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("init arrives");
    assert!(first.is_some());
    drop(stream);
    eventually_async("the command to finish after its client left", || async {
        std::path::Path::new(&marker).exists().then_some(())
    })
    .await;
}

#[tokio::test]
async fn bash_session_keeps_exported_variables_and_the_working_directory() {
    let server = Server::start().await;
    let cwd = server.path("session/home");
    let id = server.create_session(json!({"cwd": cwd})).await;
    assert!(
        std::path::Path::new(&cwd).is_dir(),
        "the session directory is created"
    );
    let run = |command: &str| server.run_in_session(&id, json!({"command": command}));

    let events = run("export GREETING=hello; mkdir -p sub; cd sub").await;
    assert_eq!(events[0]["type"], "init");
    assert_eq!(events[0]["text"], id.as_str());
    assert_eq!(events.last().expect("final")["type"], "execution_complete");

    let events = run("echo $GREETING; pwd; echo; echo err >&2").await;
    assert_eq!(
        texts(&events, "stdout"),
        ["hello", format!("{cwd}/sub").as_str(), "err"]
    );
    assert!(
        texts(&events, "stderr").is_empty(),
        "stderr is merged into stdout"
    );
}

#[tokio::test]
async fn session_run_failure_reports_the_exit_code_and_the_session_survives() {
    let server = Server::start().await;
    let id = server.create_session(json!({})).await;
    let run = |command: &str| server.run_in_session(&id, json!({"command": command}));
    let events = run("false").await;
    assert_eq!(events.last().expect("final")["error"]["evalue"], "1");
    let events = run("printf 'no newline'").await;
    assert_eq!(texts(&events, "stdout"), ["no newline"]);
    let events = run("exit 4").await;
    assert_eq!(events.last().expect("final")["error"]["evalue"], "4");
    let events = run("echo again").await;
    assert_eq!(texts(&events, "stdout"), ["again"]);
}

#[tokio::test]
async fn session_run_timeout_reports_minus_one() {
    let server = Server::start().await;
    let id = server.create_session(json!({})).await;
    let events = server
        .run_in_session(&id, json!({"command": "sleep 30", "timeout": 200}))
        .await;
    assert_eq!(events.last().expect("final")["error"]["evalue"], "-1");
}

#[tokio::test]
async fn session_errors_and_deletion() {
    let server = Server::start().await;
    let (status, code, message) = error_body(
        server
            .post_json("/session/nope/run", json!({"command": "true"}))
            .await,
    )
    .await;
    assert_eq!(
        (status, code.as_str(), message.as_str()),
        (
            500,
            "RUNTIME_ERROR",
            "error running in session. context not found"
        )
    );
    assert_error(
        server.delete("/session/nope").await,
        404,
        "CONTEXT_NOT_FOUND",
    )
    .await;

    // An empty body is allowed.
    let response = send(server.client.post(server.url("/session"))).await;
    assert_eq!(response.status(), 200);
    let id = response.json::<Value>().await.expect("json")["session_id"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_error(
        server
            .post_json(&format!("/session/{id}/run"), json!({"cwd": "/"}))
            .await,
        400,
        "INVALID_REQUEST_BODY",
    )
    .await;
    server.run_in_session(&id, json!({"command": "true"})).await;
    assert_eq!(server.delete(&format!("/session/{id}")).await.status(), 200);
    let (status, _, _) = error_body(
        server
            .post_json(&format!("/session/{id}/run"), json!({"command": "true"}))
            .await,
    )
    .await;
    assert_eq!(status, 500);
}

/// Regression: `POST /session` with a file or a NUL byte as `cwd` was a 500.
#[tokio::test]
async fn a_session_cwd_that_cannot_be_a_directory_is_a_4xx_naming_why() {
    let server = Server::start().await;
    let file = server.path("file.txt");
    std::fs::write(&file, "f").expect("write");
    let cases = [
        (file.clone(), 409, "NOT_A_DIRECTORY"),
        (format!("{file}/below"), 409, "NOT_A_DIRECTORY"),
        (server.path("a\u{0}b"), 400, "INVALID_PATH"),
        (
            "/$WARREN_SURELY_UNDEFINED_VAR/x".to_owned(),
            400,
            "INVALID_PATH",
        ),
        (server.path(&"n".repeat(300)), 400, "NAME_TOO_LONG"),
    ];
    for (cwd, status, code) in cases {
        let response = server.post_json("/session", json!({"cwd": cwd})).await;
        assert_error(response, status, code).await;
    }
    assert_eq!(std::fs::read_to_string(&file).expect("read"), "f");

    let id = server.create_session(json!({})).await;
    let response = server
        .post_json(
            &format!("/session/{id}/run"),
            json!({"command": "pwd", "cwd": server.path("a\u{0}b")}),
        )
        .await;
    assert_error(response, 400, "INVALID_PATH").await;
}

#[tokio::test]
async fn bash_sessions_beyond_the_limit_get_429_until_one_is_deleted() {
    let server = Server::start_with(|config| config.max_bash_sessions = 2).await;
    let first = server.create_session(json!({})).await;
    server.create_session(json!({})).await;
    let message = assert_error(
        server.post_json("/session", json!({})).await,
        429,
        "TOO_MANY_SESSIONS",
    )
    .await;
    assert!(message.contains("limit is 2"), "{message}");
    assert_eq!(
        server.delete(&format!("/session/{first}")).await.status(),
        200
    );
    let third = server.create_session(json!({})).await;
    let events = server
        .run_in_session(&third, json!({"command": "echo works"}))
        .await;
    assert_eq!(texts(&events, "stdout"), ["works"]);
}

#[tokio::test]
async fn deleting_a_command_id_that_names_a_session_closes_the_session() {
    let server = Server::start().await;
    let id = server.create_session(json!({})).await;
    server.run_in_session(&id, json!({"command": "true"})).await;
    assert_eq!(server.interrupt(&id).await.status(), 200);
    assert_eq!(server.delete(&format!("/session/{id}")).await.status(), 404);
}

#[tokio::test]
async fn ping_metrics_and_unsupported_routes() {
    let server = Server::start().await;
    let response = server.get("/ping").await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.expect("text"), "");

    let metrics = server.get_json("/metrics").await;
    for field in ["cpu_count", "cpu_used_pct", "mem_total_mib", "mem_used_mib"] {
        assert!(metrics[field].is_number(), "{field} in {metrics}");
    }
    assert!(metrics["timestamp"].is_i64());

    let response = server.get("/metrics/watch").await;
    let mut stream = response.bytes_stream();
    let mut text = String::new();
    tokio::time::timeout(WAIT, async {
        while text.matches('\n').count() < 2 {
            let chunk = stream.next().await.expect("more data").expect("chunk");
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await
    .expect("two metrics lines, one a second");
    let lines: Vec<Value> = text
        .lines()
        .take(2)
        .map(|line| serde_json::from_str(line).expect("each line is one JSON object"))
        .collect();
    assert!(lines[0]["mem_total_mib"].as_f64().is_some_and(|m| m > 0.0));
    let (first_ms, second_ms) = (
        lines[0]["timestamp"].as_i64(),
        lines[1]["timestamp"].as_i64(),
    );
    assert!(
        first_ms.zip(second_ms).is_some_and(|(a, b)| b > a),
        "a later sample follows: {text}"
    );

    for path in ["/code", "/code/contexts", "/v1/isolated/sessions"] {
        let (status, code, _) = error_body(server.get(path).await).await;
        assert_eq!((status, code.as_str()), (501, "NOT_SUPPORTED"), "{path}");
    }
}

#[tokio::test]
async fn access_token_guards_everything_but_ping() {
    let server = Server::start_with(|config| config.access_token = Some("s3cret".to_owned())).await;
    assert_eq!(server.get("/ping").await.status(), 200);
    assert_eq!(
        server
            .post_json("/command", json!({"command": "true"}))
            .await
            .status(),
        401
    );
    let response = send(
        server
            .client
            .post(server.url("/command"))
            .header("X-EXECD-ACCESS-TOKEN", "s3cret")
            .json(&json!({"command": "true"})),
    )
    .await;
    assert_eq!(response.status(), 200);
    let events = parse_events(&response.text().await.expect("text"));
    assert_eq!(
        without_pings(&events).last().expect("final")["type"],
        "execution_complete"
    );
}

#[tokio::test]
async fn shutdown_kills_running_commands_and_sessions() {
    let server = Server::start().await;
    let id = server.start_background("sleep 300").await;
    server.shutdown().await;
    server
        .wait_until_finished(&id, "the command to be recorded as finished after shutdown")
        .await;
}

#[tokio::test]
async fn command_and_session_streams_are_unbuffered_event_streams() {
    let server = Server::start().await;
    let id = server.create_session(json!({})).await;
    for path in ["/command".to_owned(), format!("/session/{id}/run")] {
        let response = server.post_json(&path, json!({"command": "echo hi"})).await;
        assert_eq!(response.status(), 200, "{path}");
        let headers = response.headers().clone();
        assert_eq!(headers["content-type"], "text/event-stream", "{path}");
        assert_eq!(headers["cache-control"], "no-cache", "{path}");
        assert_eq!(headers["x-accel-buffering"], "no", "{path}");
        let events = parse_events(&response.text().await.expect("text"));
        assert_eq!(texts(&events, "stdout"), ["hi"], "{path}");
    }
}

#[tokio::test]
async fn a_command_running_past_three_seconds_gets_another_ping() {
    let server = Server::start().await;
    let id = server.create_session(json!({})).await;
    let body = json!({"command": "sleep 4; echo done"});
    let (command, session) = tokio::join!(
        server.run(body.clone()),
        server.run_in_session(&id, body.clone())
    );
    for (what, events) in [("command", command), ("session run", session)] {
        let n_pings = texts(&events, "ping")
            .iter()
            .inspect(|text| assert_eq!(*text, "pong", "{what}"))
            .count();
        assert!(
            n_pings >= 2,
            "{what}: a ping at once and another after 3 s: {events:?}"
        );
        assert_eq!(texts(&events, "stdout"), ["done"], "{what}");
        assert_eq!(
            events.last().expect("final")["type"],
            "execution_complete",
            "{what}"
        );
    }
}

#[tokio::test]
async fn unknown_json_fields_are_ignored() {
    let server = Server::start().await;
    let events = server
        .run(
            json!({"command": "echo ok", "future_option": {"nested": [1, 2]}, "background": false}),
        )
        .await;
    assert_eq!(texts(&events, "stdout"), ["ok"]);
    let id = server
        .create_session(json!({"cwd": server.path("s"), "future_option": true}))
        .await;
    let events = server
        .run_in_session(&id, json!({"command": "echo ok", "future_option": 1}))
        .await;
    assert_eq!(texts(&events, "stdout"), ["ok"]);
}

#[tokio::test]
async fn session_run_with_a_cwd_runs_there() {
    let server = Server::start().await;
    let dir = server.path("elsewhere");
    std::fs::create_dir(&dir).expect("mkdir");
    let id = server.create_session(json!({})).await;
    let events = server
        .run_in_session(&id, json!({"command": "pwd", "cwd": dir}))
        .await;
    assert_eq!(texts(&events, "stdout"), [dir.as_str()]);
    assert_eq!(events.last().expect("final")["type"], "execution_complete");
    let missing = server.path("missing");
    let events = server
        .run_in_session(&id, json!({"command": "echo never", "cwd": missing}))
        .await;
    assert!(
        texts(&events, "stdout").iter().all(|t| t != "never"),
        "{events:?}"
    );
    assert_eq!(events.last().expect("final")["type"], "error");
}

#[tokio::test]
async fn a_command_killed_by_a_signal_reports_minus_one() {
    let server = Server::start().await;
    let events = server.run_command("kill -KILL $$").await;
    let last = events.last().expect("a final event");
    assert_eq!(last["type"], "error");
    assert_eq!(last["error"]["evalue"], "-1");
    let status = server.command_status(&command_id(&events)).await;
    assert_eq!(
        (status["running"].clone(), status["exit_code"].clone()),
        (json!(false), json!(-1))
    );
}

#[tokio::test]
async fn uid_and_gid_set_the_command_credentials() {
    let server = Server::start().await;
    let events = server
        .run(json!({"command": "id -u; id -g; id -G", "uid": 65534, "gid": 65534}))
        .await;
    if rustix::process::geteuid().is_root() {
        assert_eq!(
            texts(&events, "stdout"),
            ["65534", "65534", "65534"],
            "{events:?}"
        );
        assert_eq!(events.last().expect("final")["type"], "execution_complete");
    } else {
        // Only root may switch users: the start fails with the OS error, reported as such.
        assert_eq!(kinds(&events), ["init", "error"], "{events:?}");
        let evalue = events[1]["error"]["evalue"].as_str().expect("evalue");
        assert!(evalue.contains("not permitted"), "{evalue}");
    }
}

#[tokio::test]
async fn the_timeout_kills_a_foreground_command_whose_client_stopped_reading() {
    let server = Server::start().await;
    let mut stream = server
        .command_stream(
            json!({"command": "yes \"$(head -c 2000 /dev/zero | tr '\\0' x)\"", "timeout": 2000}),
        )
        .await;
    let mut text = String::new();
    let id = tokio::time::timeout(WAIT, async {
        while !text.contains("\n\n") {
            let chunk = stream.next().await.expect("more data").expect("chunk");
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
        text.split("\n\n").next().map(|init| {
            let event: Value = serde_json::from_str(init).expect("init is JSON");
            event["text"]
                .as_str()
                .expect("init carries the id")
                .to_owned()
        })
    })
    .await
    .expect("init arrives")
    .expect("an id");
    // The client keeps the connection but reads nothing more; the flood fills every buffer.
    let status = server
        .wait_until_finished(
            &id,
            "the timeout to end the command although its client stalls",
        )
        .await;
    assert_eq!(status["exit_code"], -1, "{status}");
    drop(stream);
}

#[tokio::test]
async fn the_timeout_ends_a_session_run_whose_client_stopped_reading() {
    let server = Server::start().await;
    let id = server.create_session(json!({})).await;
    let pid_file = server.path("flood.pid");
    let command = format!(
        "sh -c 'echo $$ > {pid_file}; exec yes \"$(head -c 2000 /dev/zero | tr \"\\\\0\" x)\"'"
    );
    let mut stream = server
        .post_stream(
            &format!("/session/{id}/run"),
            json!({"command": command, "timeout": 2000}),
        )
        .await;
    tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("the first event arrives")
        .expect("a chunk")
        .expect("reads");
    let pid: i32 = eventually_async("the flood's pid file", || async {
        std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok()
    })
    .await;
    // The client keeps the connection but reads nothing more; the flood fills every buffer.
    wait_until_dead(
        pid,
        "the timeout to kill the flood although its client stalls",
    )
    .await;
    drop(stream);
}

#[tokio::test]
async fn foreground_stdin_is_dev_null() {
    let server = Server::start().await;
    let events = server
        .run_command("cat; readlink /proc/self/fd/0; echo done")
        .await;
    assert_eq!(texts(&events, "stdout"), ["/dev/null", "done"]);
}

#[tokio::test]
async fn deleting_a_session_kills_what_it_left_running() {
    let server = Server::start().await;
    let id = server.create_session(json!({})).await;
    let events = server
        .run_in_session(&id, json!({"command": "setsid sleep 1000 & echo $!"}))
        .await;
    let pid: i32 = texts(&events, "stdout")
        .first()
        .and_then(|line| line.parse().ok())
        .unwrap_or_else(|| panic!("the run prints the sleeper's pid: {events:?}"));
    assert_eq!(server.delete(&format!("/session/{id}")).await.status(), 200);
    wait_until_dead(pid, "the session's background sleeper to be gone").await;
}
