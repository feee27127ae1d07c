//! `/v1/terminals` and `/v1/files` over real HTTP with the typed client the gateway uses: a real
//! execd router on 127.0.0.1:0, real commands, a real temp tree. Raw bytes in and out, the real
//! exit code and signal name, and each bad input's status and code.

// Tests start real programs (shells, servers, the binary under test) directly.
#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use warren_execd_client::ExecdClient;
use warren_protocol::exec::ExecCommandArgs;
use warren_protocol::terminal::{TerminalCreate, TerminalCreated, TerminalExitStatus};

#[path = "support/client_answers.rs"]
mod client_answers;
#[path = "support/engine_execd.rs"]
mod engine_execd;

use client_answers::{assert_refused, mkfifo};
use engine_execd::start;

fn shell_line(command: &str) -> TerminalCreate {
    TerminalCreate {
        command: command.into(),
        ..TerminalCreate::default()
    }
}

/// Waits (bounded) for the terminal's exit and returns its output and status.
async fn finish(client: &ExecdClient, id: &str) -> (String, bool, TerminalExitStatus) {
    for _ in 0..20 {
        let output = client
            .terminal_output(id, Duration::from_secs(5))
            .await
            .expect("output");
        if let Some(status) = output.exit_status {
            return (output.output, output.truncated, status);
        }
    }
    panic!("terminal {id} exits within 100 s");
}

/// Starts `create`, which must start.
async fn create(client: &ExecdClient, create: &TerminalCreate) -> TerminalCreated {
    client.create_terminal(create).await.expect("created")
}

#[tokio::test]
async fn a_terminal_returns_exactly_the_bytes_written_and_the_exit_code() {
    let server = start().await;
    let line = shell_line(r"printf 'p10\rp100\n'; printf 'no-newline' >&2; exit 3");
    let created = create(&server.client, &line).await;
    assert!(created.pid > 0);
    let (output, truncated, status) = finish(&server.client, &created.terminal_id).await;
    assert_eq!(output, "p10\rp100\nno-newline");
    assert!(!truncated);
    assert_eq!(status.exit_code, Some(3));
    assert_eq!(status.signal, None);
    // Readable after the exit until released; then unknown.
    let again = server
        .client
        .terminal_output(&created.terminal_id, Duration::ZERO)
        .await
        .expect("still readable");
    assert_eq!(again.output, output);
    server
        .client
        .release_terminal(&created.terminal_id)
        .await
        .expect("released");
    let gone = server
        .client
        .terminal_output(&created.terminal_id, Duration::ZERO)
        .await;
    assert_refused(gone, 404, "TERMINAL_NOT_FOUND", "released");
}

#[tokio::test]
async fn a_program_with_arguments_runs_without_a_shell_interpreting_them() {
    let server = start().await;
    let printf = TerminalCreate {
        command: "printf".into(),
        args: vec!["%s|".into(), "a b".into(), "$HOME".into(), "'q'".into()],
        ..TerminalCreate::default()
    };
    let created = create(&server.client, &printf).await;
    let (output, _, status) = finish(&server.client, &created.terminal_id).await;
    assert_eq!(output, "a b|$HOME|'q'|");
    assert_eq!(status.exit_code, Some(0));
}

#[tokio::test]
async fn kill_ends_the_whole_tree_with_its_signal_and_keeps_the_output() {
    let server = start().await;
    let line = shell_line("echo started; sleep 300 & sleep 300");
    let created = create(&server.client, &line).await;
    for _ in 0..100 {
        let output = server
            .client
            .terminal_output(&created.terminal_id, Duration::ZERO)
            .await
            .expect("output");
        if output.output.contains("started") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server
        .client
        .kill_terminal(&created.terminal_id)
        .await
        .expect("killed");
    let (output, _, status) = finish(&server.client, &created.terminal_id).await;
    assert_eq!(output, "started\n");
    assert_eq!(status.exit_code, None);
    assert_eq!(status.signal.as_deref(), Some("SIGTERM"));
    let listed = server.client.list_terminals().await.expect("list");
    assert!(
        listed
            .terminals
            .iter()
            .any(|t| t.terminal_id == created.terminal_id && !t.running)
    );
}

#[tokio::test]
async fn the_output_limit_keeps_the_newest_bytes_and_says_so() {
    let server = start().await;
    let limited = TerminalCreate {
        output_byte_limit: Some(10),
        ..shell_line("printf 'abcdefghij'; printf 'é0123456789'")
    };
    let created = create(&server.client, &limited).await;
    let (output, truncated, _) = finish(&server.client, &created.terminal_id).await;
    assert!(truncated);
    assert_eq!(output, "0123456789");
}

#[tokio::test]
async fn terminals_and_exec_sessions_do_not_see_each_other() {
    let server = start().await;
    let created = create(&server.client, &shell_line("sleep 300")).await;
    let sessions = server.client.list_sessions().await.expect("sessions");
    assert!(sessions.sessions.is_empty(), "{sessions:?}");
    let id: u32 = created.terminal_id.parse().expect("numeric id");
    let refused = server.client.kill_session(id).await;
    assert_refused(refused, 404, "SESSION_NOT_FOUND", "not an exec session");
    let result = server
        .client
        .exec_command(&ExecCommandArgs {
            cmd: "sleep 300".into(),
            login: Some(false),
            yield_time_ms: Some(250),
            ..ExecCommandArgs::default()
        })
        .await
        .expect("exec");
    let session_id = result.session_id.expect("running").to_string();
    let refused = server
        .client
        .terminal_output(&session_id, Duration::ZERO)
        .await;
    assert_refused(refused, 404, "TERMINAL_NOT_FOUND", "not a terminal");
    server
        .client
        .release_terminal(&created.terminal_id)
        .await
        .expect("released");
}

#[tokio::test]
async fn bad_terminal_requests_get_a_code() {
    let server = start().await;
    let cases = [
        (shell_line(""), 400, "INVALID_REQUEST_BODY"),
        (shell_line("echo a\0b"), 400, "INVALID_REQUEST_BODY"),
        (
            TerminalCreate {
                cwd: Some("/nonexistent/dir".into()),
                ..shell_line("true")
            },
            400,
            "INVALID_WORKDIR",
        ),
    ];
    for (create, status, code) in cases {
        let refused = server.client.create_terminal(&create).await;
        assert_refused(refused, status, code, &format!("{create:?}"));
    }
    let unknown = server.client.kill_terminal("not-a-number").await;
    assert_refused(unknown, 404, "TERMINAL_NOT_FOUND", "unknown");
}

#[tokio::test]
async fn files_are_read_and_replaced_atomically_beneath_the_root() {
    let server = start().await;
    let root = server.root.path();
    let target = root.join("deep/new/dir/notes.txt");
    server
        .client
        .write_file(&target.display().to_string(), "first\n")
        .await
        .expect("created with its parents");
    server
        .client
        .write_file("deep/new/dir/notes.txt", "second\n")
        .await
        .expect("replaced by a relative path");
    let bytes = server
        .client
        .read_file(&target.display().to_string())
        .await
        .expect("read");
    assert_eq!(&bytes[..], b"second\n");
    let leftovers: Vec<_> = std::fs::read_dir(target.parent().expect("parent"))
        .expect("list")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        leftovers,
        vec![std::ffi::OsString::from("notes.txt")],
        "no temp file left"
    );
}

#[tokio::test]
async fn bad_file_requests_get_a_code() {
    let server = start().await;
    let root = server.root.path();
    std::fs::write(root.join("plain"), "x").expect("file");
    std::os::unix::fs::symlink("/etc", root.join("out")).expect("link");
    // Made directly: this binary runs the daemon's reaper, which would take a `mkfifo`
    // child's exit status.
    mkfifo(&root.join("fifo"));
    let long_name = "n".repeat(300);
    let reads = [
        ("missing", 404, "FILE_NOT_FOUND"),
        ("../outside", 403, "PATH_ESCAPE"),
        ("out/passwd", 403, "PATH_ESCAPE"),
        ("/etc/passwd", 403, "PATH_ESCAPE"),
        (".", 403, "NOT_REGULAR_FILE"),
        ("fifo", 403, "NOT_REGULAR_FILE"),
        ("plain/below", 409, "NOT_A_DIRECTORY"),
        (long_name.as_str(), 400, "NAME_TOO_LONG"),
        ("", 400, "INVALID_PATH"),
        ("a\0b", 400, "INVALID_PATH"),
    ];
    for (path, status, code) in reads {
        let refused = server.client.read_file(path).await;
        assert_refused(refused, status, code, &format!("read {path:?}"));
    }
    let writes = [
        ("out/evil", 403, "PATH_ESCAPE"),
        ("plain/below", 409, "NOT_A_DIRECTORY"),
        ("fifo", 403, "NOT_REGULAR_FILE"),
        (".", 400, "INVALID_PATH"),
    ];
    for (path, status, code) in writes {
        let refused = server.client.write_file(path, "data").await;
        assert_refused(refused, status, code, &format!("write {path:?}"));
    }
    assert!(!std::path::Path::new("/etc/evil").exists());
}
