//! The gateway side of ACP against real agent processes: the scripted test agent
//! (`warren-test-agent`), the built-in shell agent and a Python agent built on the PyPI
//! `agent-client-protocol` package. The host here serves files and terminals from the local
//! filesystem with real processes, as hands would.

// Tests start real programs (shells, servers, the binary under test) directly.
#![allow(clippy::disallowed_methods)]

mod support;

use std::sync::Arc;

use support::{
    RecordingSink, finish_turn, prompt, resume_in_new_worker, spawn_session, start_turn, test_agent,
};
use warren_brain::{AgentCommand, BrainError, PermissionOutcome, Resumed, Worker, WorkerPool};
use warren_test_support::{WAIT, alive, eventually, python, repo_root, within};

#[tokio::test]
async fn warm_pool_hands_out_initialized_workers_and_refills_in_the_background() {
    let pool = WorkerPool::new(test_agent(&[]), 2);
    assert!(
        pool.wait_ready(2, WAIT).await,
        "two warm workers within {WAIT:?}"
    );
    let first = within("take a warm worker", pool.take())
        .await
        .expect("warm worker");
    let second = within("take a warm worker", pool.take())
        .await
        .expect("warm worker");
    assert_ne!(
        first.pid(),
        second.pid(),
        "one worker per session, never shared"
    );
    assert!(
        pool.wait_ready(2, WAIT).await,
        "the pool refilled to two within {WAIT:?}"
    );
    pool.shutdown().await;
    assert!(matches!(pool.take().await, Err(BrainError::PoolClosed)));
    first.kill().await;
    second.kill().await;
}

#[tokio::test]
async fn agent_text_reaches_the_sink_as_it_streams_and_the_turn_ends_with_the_stop_reason() {
    let (session, sink, _host) = spawn_session(test_agent(&[])).await;
    let stop_reason = prompt(&session, "echo turn", "echo hello brave world").await;
    assert_eq!(stop_reason, "end_turn");
    assert_eq!(
        sink.n_message_chunks(),
        3,
        "three chunks forwarded one by one"
    );
    assert_eq!(sink.agent_text(), "hello brave world");
    session.close().await;
}

#[tokio::test]
async fn permission_requests_are_forwarded_and_the_clients_answer_returned() {
    let (session, sink, _host) = spawn_session(test_agent(&[])).await;
    let session = Arc::new(session);
    let turn = start_turn(&session, "perm");
    let request = sink.next_permission().await;
    assert_eq!(request.tool_call["title"], "dangerous thing");
    assert_eq!(request.options[0]["optionId"], "allow");
    request.answer(PermissionOutcome::Selected("allow".into()));
    let stop_reason = finish_turn("perm turn", turn).await;
    assert_eq!(stop_reason, "end_turn");
    assert_eq!(sink.agent_text(), "permission: allow");
}

#[tokio::test]
async fn cancel_answers_pending_permissions_cancelled_and_ends_the_turn() {
    let (session, sink, _host) = spawn_session(test_agent(&[])).await;
    let session = Arc::new(session);
    let turn = start_turn(&session, "perm");
    let request = sink.next_permission().await;
    session.cancel().await;
    within(
        "the pending permission future is dropped",
        request.answer_dropped(),
    )
    .await;
    let stop_reason = finish_turn("cancelled turn", turn).await;
    assert_eq!(stop_reason, "cancelled");
}

#[tokio::test]
async fn cancel_sends_session_cancel_to_a_running_turn() {
    let (session, sink, _host) = spawn_session(test_agent(&[])).await;
    let session = Arc::new(session);
    let turn = start_turn(&session, "wait");
    within("the agent says waiting", sink.wait_for_text("waiting")).await;
    session.cancel().await;
    let stop_reason = finish_turn("cancelled turn", turn).await;
    assert_eq!(stop_reason, "cancelled");
    // The brain stays usable after a cancelled turn.
    let again = prompt(&session, "turn after cancel", "echo again").await;
    assert_eq!(again, "end_turn");
}

#[tokio::test]
async fn fs_requests_are_served_by_the_host() {
    let (session, sink, host) = spawn_session(test_agent(&[])).await;
    let path = host.root().join("notes.txt");
    let write = format!("write {} first line", path.display());
    prompt(&session, "write turn", &write).await;
    assert_eq!(
        std::fs::read_to_string(&path).expect("file written"),
        "first line"
    );
    prompt(&session, "read turn", &format!("read {}", path.display())).await;
    assert!(
        sink.agent_text().contains("content: first line"),
        "{}",
        sink.agent_text()
    );
}

#[tokio::test]
async fn terminal_requests_are_served_by_the_host() {
    let (session, sink, _host) = spawn_session(test_agent(&[])).await;
    prompt(&session, "term turn", "term echo hi; exit 3").await;
    assert_eq!(sink.agent_text(), "exit 3: hi\n");
}

#[tokio::test]
async fn a_worker_dying_mid_turn_fails_the_turn_with_worker_exited() {
    let (session, sink, _host) = spawn_session(test_agent(&[])).await;
    let result = within("crash turn", session.prompt("crash".into())).await;
    match result {
        Err(BrainError::WorkerExited { status }) => assert!(status.contains('3'), "{status}"),
        other => panic!("expected WorkerExited, got {other:?}"),
    }
    assert!(sink.agent_text().contains("crashing"));
    assert!(!session.is_alive());
}

#[tokio::test]
async fn close_stops_the_worker_process() {
    let (session, _sink, _host) = spawn_session(test_agent(&["--close"])).await;
    let pid = session.pid();
    within("close", session.close()).await;
    assert!(!alive(pid));
}

#[tokio::test]
async fn resume_uses_session_resume_when_the_agent_supports_it() {
    let agent = test_agent(&["--resume"]);
    let (session, _sink, host) = spawn_session(agent.clone()).await;
    let sink = RecordingSink::new();
    let (acp_session_id, session, resumed) =
        resume_in_new_worker(session, &agent, &host, sink.clone()).await;
    assert_eq!(resumed, Resumed::Resumed);
    assert_eq!(session.acp_session_id(), acp_session_id);
    prompt(&session, "turn after resume", "echo back").await;
    assert_eq!(sink.agent_text(), "back");
}

#[tokio::test]
async fn resume_falls_back_to_session_load_without_forwarding_the_replay() {
    let agent = test_agent(&["--load"]);
    let (session, _sink, host) = spawn_session(agent.clone()).await;
    let sink = RecordingSink::new();
    let (_, session, resumed) = resume_in_new_worker(session, &agent, &host, sink.clone()).await;
    assert_eq!(resumed, Resumed::Loaded);
    prompt(&session, "turn after load", "echo back").await;
    assert_eq!(
        sink.agent_text(),
        "back",
        "the replayed history was not forwarded"
    );
}

#[tokio::test]
async fn resume_without_agent_support_starts_a_new_session_and_reports_lost_context() {
    let agent = test_agent(&[]);
    let (session, _sink, host) = spawn_session(agent.clone()).await;
    let (acp_session_id, session, resumed) =
        resume_in_new_worker(session, &agent, &host, RecordingSink::new()).await;
    assert_eq!(resumed, Resumed::ContextLost);
    assert_ne!(session.acp_session_id(), acp_session_id);
}

#[tokio::test]
async fn the_shell_agent_runs_the_message_in_a_terminal_and_streams_its_output() {
    let (session, sink, _host) = spawn_session(test_agent(&["shell"])).await;
    let stop_reason = prompt(&session, "shell turn", "echo hi; echo there").await;
    assert_eq!(stop_reason, "end_turn");
    assert!(
        sink.agent_text().contains("hi\nthere\n"),
        "{}",
        sink.agent_text()
    );
    let kinds = sink.update_kinds();
    assert!(kinds.contains(&"tool_call".to_owned()), "{kinds:?}");
    assert!(kinds.contains(&"tool_call_update".to_owned()), "{kinds:?}");
    let last_tool_update = sink
        .last_of_kind("tool_call_update")
        .expect("tool call update");
    assert_eq!(last_tool_update["status"], "completed");
}

#[tokio::test]
async fn the_shell_agent_reports_a_failing_command() {
    let (session, sink, _host) = spawn_session(test_agent(&["shell"])).await;
    prompt(&session, "shell turn", "echo oops >&2; exit 7").await;
    assert!(sink.agent_text().contains("oops"), "{}", sink.agent_text());
    assert!(
        sink.agent_text().contains("exit code 7"),
        "{}",
        sink.agent_text()
    );
    assert_eq!(
        sink.last_of_kind("tool_call_update").expect("update")["status"],
        "failed"
    );
}

#[tokio::test]
async fn the_shell_agent_asks_before_rm_and_does_not_run_it_when_refused() {
    let (session, sink, host) = spawn_session(test_agent(&["shell"])).await;
    let victim = host.root().join("keep.txt");
    std::fs::write(&victim, "x").expect("write");
    let session = Arc::new(session);
    let turn = start_turn(&session, "rm keep.txt");
    let request = sink.next_permission().await;
    assert_eq!(request.tool_call["title"], "rm keep.txt");
    request.answer(PermissionOutcome::Selected("reject".into()));
    let stop_reason = finish_turn("refused turn", turn).await;
    assert_eq!(stop_reason, "end_turn");
    assert!(victim.exists(), "the refused rm did not run");
    assert!(
        sink.agent_text().contains("Not run"),
        "{}",
        sink.agent_text()
    );
}

#[tokio::test]
async fn the_shell_agent_runs_rm_once_allowed() {
    let (session, sink, host) = spawn_session(test_agent(&["shell"])).await;
    let victim = host.root().join("gone.txt");
    std::fs::write(&victim, "x").expect("write");
    let session = Arc::new(session);
    let turn = start_turn(&session, "rm gone.txt");
    sink.next_permission()
        .await
        .answer(PermissionOutcome::Selected("allow".into()));
    finish_turn("allowed turn", turn).await;
    assert!(!victim.exists(), "the allowed rm ran");
}

#[tokio::test]
async fn cancelling_the_shell_agent_kills_the_running_command() {
    let (session, sink, host) = spawn_session(test_agent(&["shell"])).await;
    let session = Arc::new(session);
    let turn = start_turn(&session, "echo started; sleep 60; echo never");
    within("the command started", sink.wait_for_text("started")).await;
    session.cancel().await;
    let stop_reason = finish_turn("cancelled turn", turn).await;
    assert_eq!(stop_reason, "cancelled");
    within("the sleep was killed", host.wait_no_running_terminals()).await;
    assert!(!sink.agent_text().contains("never"));
}

#[tokio::test]
async fn a_python_agent_built_on_the_pypi_acp_package_interoperates() {
    let (session, sink, host) = spawn_session(support::python_agent()).await;
    let stop_reason = prompt(&session, "python echo turn", "hello from warren").await;
    assert_eq!(stop_reason, "end_turn");
    assert!(
        sink.agent_text().contains("echo: hello from warren"),
        "{}",
        sink.agent_text()
    );
    // The Python agent also exercises the client methods: a file write and a terminal.
    let written = host.root().join("python-was-here.txt");
    prompt(
        &session,
        "python file turn",
        &format!("write {}", written.display()),
    )
    .await;
    assert_eq!(
        std::fs::read_to_string(&written).expect("written by the python agent"),
        "hello from python"
    );
    prompt(&session, "python terminal turn", "term echo py-term").await;
    assert!(
        sink.agent_text().contains("term: py-term"),
        "{}",
        sink.agent_text()
    );
    let session = Arc::new(session);
    let turn = start_turn(&session, "perm");
    let request = sink.next_permission().await;
    assert_eq!(request.tool_call["title"], "python wants to act");
    request.answer(PermissionOutcome::Selected("reject".into()));
    finish_turn("python permission turn", turn).await;
    assert!(
        sink.agent_text().contains("permission: reject"),
        "{}",
        sink.agent_text()
    );
}

/// The error of starting `program args` as an agent, which the test expects to fail.
async fn spawn_error(what: &str, program: &str, args: &[&str]) -> BrainError {
    let command = AgentCommand {
        env: Vec::new(),
        program: program.into(),
        args: args.iter().map(|a| (*a).to_owned()).collect(),
    };
    match within(what, Worker::spawn(&command)).await {
        Ok(worker) => panic!("{what}: the agent started (pid {})", worker.pid()),
        Err(error) => error,
    }
}

#[tokio::test]
async fn a_missing_agent_program_is_a_spawn_error_not_a_hang() {
    let error = spawn_error("spawn of a missing program", "/nonexistent/agent", &[]).await;
    assert!(matches!(error, BrainError::Spawn { .. }), "{error:?}");
}

#[tokio::test]
async fn an_agent_that_exits_before_initialize_is_reported_as_exited() {
    let error = spawn_error("spawn of an agent that exits", "true", &[]).await;
    assert!(
        matches!(error, BrainError::WorkerExited { .. }),
        "{error:?}"
    );
}

#[tokio::test]
async fn closing_a_crashed_worker_kills_the_processes_it_left_behind() {
    let (session, sink, _host) = spawn_session(test_agent(&[])).await;
    prompt(&session, "bg turn", "bg").await;
    let text = sink.agent_text();
    let pid: u32 = text
        .strip_prefix("bg=")
        .and_then(|p| p.parse().ok())
        .expect("bg=<pid>");
    assert!(alive(pid), "the background child runs");
    let crashed = within("crash turn", session.prompt("crash".into())).await;
    assert!(
        matches!(crashed, Err(BrainError::WorkerExited { .. })),
        "{crashed:?}"
    );
    within("close", session.close()).await;
    eventually("the orphaned child is killed", || !alive(pid)).await;
}

#[tokio::test]
async fn an_agent_that_dies_at_start_reports_its_last_stderr_line() {
    let script = "echo starting >&2; echo 'error: no API key set' >&2; exit 2";
    let error = spawn_error("spawn of an agent that fails", "bash", &["-c", script]).await;
    match error {
        BrainError::WorkerExited { status } => {
            assert!(status.contains("error: no API key set"), "{status}");
            assert!(status.contains('2'), "{status}");
        }
        other => panic!("expected WorkerExited, got {other:?}"),
    }
}

#[tokio::test]
async fn the_shell_agent_works_with_the_pypi_acp_client() {
    let python = python();
    let script = repo_root().join("tests/python/acp_client_drive.py");
    let workdir = tempfile::tempdir().expect("temp dir");
    let victim = workdir.path().join("victim.txt");
    std::fs::write(&victim, "x").expect("write");
    let run = tokio::process::Command::new(python)
        .arg(script)
        .arg(workdir.path())
        .arg(env!("CARGO_BIN_EXE_warren-test-agent"))
        .arg("shell")
        .kill_on_drop(true)
        .output();
    let output = within("the Python ACP client driving the shell agent", run)
        .await
        .expect("run python");
    assert!(
        output.status.success(),
        "python client failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("one JSON line");
    assert_eq!(report["turns"][0]["stop_reason"], "end_turn");
    assert_eq!(report["turns"][0]["text"], "from-python-client\n");
    assert_eq!(report["permissions"], 1, "only the rm asked: {report}");
    assert_eq!(report["turns"][1]["stop_reason"], "end_turn");
    assert!(
        !victim.exists(),
        "the allowed rm ran in the client's terminal"
    );
}
