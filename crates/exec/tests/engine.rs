//! The engine against real commands and real processes: waits, prompts, timeouts, kills,
//! output cleaning and limits. Every wait is bounded and says what it expected; timing
//! assertions are loose ("well before 30 s"), speed targets live in `warren bench exec`.

// Tests start real programs (shells, servers, the binary under test) directly.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use warren_exec::{Engine, EngineConfig, ExecError};
use warren_protocol::exec::{ExecCommandArgs, ExecResult, ExecStatus, SessionInfo, WriteStdinArgs};
use warren_test_support::peak_memory::{alone_in_a_new_process, memory_kib};
use warren_test_support::{alive, eventually, wait_until_dead, within};

struct Harness {
    engine: Arc<Engine>,
    _logs: tempfile::TempDir,
}

fn harness_with(adjust: impl FnOnce(&mut EngineConfig)) -> Harness {
    warren_process::reaper::start().expect("become subreaper and start reaping");
    let logs = tempfile::tempdir().expect("temp dir");
    let mut config = EngineConfig {
        log_dir: logs.path().join("logs"),
        default_workdir: std::env::temp_dir(),
        ..EngineConfig::default()
    };
    adjust(&mut config);
    Harness {
        engine: Engine::new(config),
        _logs: logs,
    }
}

fn harness() -> Harness {
    harness_with(|_| {})
}

/// A command expected to finish: the longest yield, so a loaded machine never turns "exited"
/// into "running". Not a login shell: this machine's profile (`pyenv rehash`) prints errors when
/// many login shells start at once, which would garble exact-output assertions;
/// `login_shell_is_the_default` covers the default.
fn cmd(cmd: &str) -> ExecCommandArgs {
    ExecCommandArgs {
        cmd: cmd.into(),
        yield_time_ms: Some(30_000),
        login: Some(false),
        ..ExecCommandArgs::default()
    }
}

fn cmd_yield(cmd: &str, yield_time_ms: u64) -> ExecCommandArgs {
    ExecCommandArgs {
        cmd: cmd.into(),
        yield_time_ms: Some(yield_time_ms),
        login: Some(false),
        ..ExecCommandArgs::default()
    }
}

fn write(session_id: u32, chars: &str) -> WriteStdinArgs {
    WriteStdinArgs {
        session_id,
        chars: chars.into(),
        ..WriteStdinArgs::default()
    }
}

async fn exec(engine: &Engine, args: ExecCommandArgs) -> ExecResult {
    within("exec_command", engine.exec_command(args))
        .await
        .expect("exec_command succeeds")
}

async fn stdin(engine: &Engine, args: WriteStdinArgs) -> ExecResult {
    within("write_stdin", engine.write_stdin(args))
        .await
        .expect("write_stdin succeeds")
}

/// Starts a command that is expected to outlive its yield; returns its session id.
async fn start(engine: &Engine, args: ExecCommandArgs) -> u32 {
    exec(engine, args)
        .await
        .session_id
        .expect("a command still running after its yield has a session id")
}

/// Starts `script` (which prints `pid N` for a process it leaves running) and polls until that
/// line is read; returns the session id and the pid.
async fn start_reporting_a_pid(engine: &Engine, script: &str) -> (u32, i32) {
    let first = exec(engine, cmd_yield(script, 1000)).await;
    let id = first.session_id.expect("session id");
    let mut output = first.output;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !output.contains('\n') {
        assert!(
            Instant::now() < deadline,
            "{script:?} never printed its pid"
        );
        output.push_str(&stdin(engine, write(id, "")).await.output);
    }
    let pid = output
        .trim()
        .strip_prefix("pid ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("unexpected output {output:?}"));
    (id, pid)
}

/// Writes `chars` to a session and waits up to the longest yield, so a command that the input
/// ends is reported as exited.
async fn reply(engine: &Engine, session_id: u32, chars: &str) -> ExecResult {
    let args = WriteStdinArgs {
        yield_time_ms: Some(30_000),
        ..write(session_id, chars)
    };
    stdin(engine, args).await
}

/// Waits until the listed session reports `exited` (without reading its output).
async fn wait_until_listed_as_exited(engine: &Engine, session_id: u32, what: &str) -> SessionInfo {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let listed = engine.list_sessions().await;
        let info = listed
            .sessions
            .into_iter()
            .find(|s| s.session_id == session_id)
            .expect("the session stays listed until its output is read");
        if info.status == ExecStatus::Exited {
            return info;
        }
        assert!(Instant::now() < deadline, "{what} exits within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs a command that prompts, checks it is reported as awaiting input (well before its
/// 30 s yield) showing exactly `prompt`, then answers it and returns the final result.
async fn prompt_then_answer(
    engine: &Engine,
    args: ExecCommandArgs,
    prompt: &str,
    answer: &str,
) -> (ExecResult, ExecResult) {
    let started = Instant::now();
    let prompted = exec(engine, args).await;
    assert_eq!(prompted.status, ExecStatus::AwaitingInput, "{prompted:?}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "returned well before the 30 s yield"
    );
    assert_eq!(prompted.output, prompt);
    let id = prompted.session_id.expect("session id");
    let answered = reply(engine, id, answer).await;
    assert_eq!(answered.status, ExecStatus::Exited, "{answered:?}");
    (prompted, answered)
}

/// Starts a long `sleep`, sends Ctrl-C and checks the command ends with 130 (SIGINT).
async fn assert_ctrl_c_interrupts(engine: &Engine, args: ExecCommandArgs) {
    let id = start(engine, args).await;
    let result = reply(engine, id, "\u{3}").await;
    assert_eq!(result.status, ExecStatus::Exited);
    assert_eq!(result.exit_code, Some(130));
}

/// Polls the session until it reports `exited`, collecting output.
async fn poll_until_exited(engine: &Engine, session_id: u32) -> (String, ExecResult) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut output = String::new();
    loop {
        let result = stdin(engine, write(session_id, "")).await;
        output.push_str(&result.output);
        if result.status == ExecStatus::Exited {
            return (output, result);
        }
        assert!(
            Instant::now() < deadline,
            "session {session_id} did not exit within 60 s"
        );
    }
}

#[tokio::test]
async fn login_shell_is_the_default() {
    let h = harness();
    let args = ExecCommandArgs {
        cmd: "shopt -q login_shell && echo login-shell".into(),
        yield_time_ms: Some(30_000),
        ..ExecCommandArgs::default()
    };
    let result = exec(&h.engine, args).await;
    assert!(
        result.output.ends_with("login-shell\n"),
        "{:?}",
        result.output
    );
}

#[tokio::test]
async fn quick_command_exits_within_the_first_yield_without_a_session_id() {
    let h = harness();
    let result = exec(&h.engine, cmd("echo hello")).await;
    assert_eq!(result.status, ExecStatus::Exited);
    assert_eq!(result.exit_code, Some(0));
    assert_eq!(result.session_id, None);
    assert_eq!(result.output, "hello\n");
    assert_eq!(result.original_token_count, 2);
    assert!(
        result.text.contains("Process exited with code 0\n"),
        "{}",
        result.text
    );
    assert!(result.text.ends_with("Output:\nhello\n"), "{}", result.text);
    assert_eq!(result.chunk_id.len(), 6);
}

#[tokio::test]
async fn dev_server_loop_is_polled_then_killed_with_no_survivor() {
    let h = harness();
    let first = exec(
        &h.engine,
        cmd_yield("while true; do echo tick; sleep 0.2; done", 500),
    )
    .await;
    assert_eq!(first.status, ExecStatus::Running);
    let id = first
        .session_id
        .expect("a running command has a session id");
    assert!(
        (1000..100_000).contains(&id),
        "session ids have 4-5 digits: {id}"
    );
    assert!(
        first
            .text
            .contains(&format!("Process running with session ID {id}"))
    );
    let listed = h.engine.list_sessions().await;
    let info = listed
        .sessions
        .iter()
        .find(|s| s.session_id == id)
        .expect("listed");
    let pid = info.pid as i32;

    let poll = stdin(
        &h.engine,
        WriteStdinArgs {
            yield_time_ms: Some(5000),
            ..write(id, "")
        },
    )
    .await;
    assert_eq!(poll.status, ExecStatus::Running);
    assert!(poll.output.contains("tick"), "{:?}", poll.output);

    let killed = tokio::time::timeout(Duration::from_secs(30), h.engine.kill_session(id))
        .await
        .expect("kill_session returns within 30 s")
        .expect("kill succeeds");
    assert_eq!(killed.status, ExecStatus::Exited);
    assert!(killed.exit_code.is_some());
    wait_until_dead(pid, "the killed dev server").await;
    assert!(matches!(
        within("write_stdin", h.engine.write_stdin(write(id, ""))).await,
        Err(ExecError::UnknownSession(unknown)) if unknown == id
    ));
}

#[tokio::test]
async fn read_prompt_on_pipes_is_reported_as_awaiting_input_then_answered() {
    let h = harness();
    let script = "printf 'Name? '; read n; echo \"hello $n\"";
    let (prompt, answer) =
        prompt_then_answer(&h.engine, cmd_yield(script, 30_000), "Name? ", "bob\n").await;
    assert!(
        prompt.text.contains("Process is waiting for input\n"),
        "{}",
        prompt.text
    );
    assert_eq!(answer.exit_code, Some(0));
    assert_eq!(answer.output, "hello bob\n");
}

#[tokio::test]
async fn python_input_on_pipes_is_reported_as_awaiting_input() {
    let h = harness();
    let script = "python3 -c \"print('got', input('x: '))\"";
    let (_, answer) = prompt_then_answer(&h.engine, cmd_yield(script, 30_000), "x: ", "42\n").await;
    assert_eq!(answer.output, "got 42\n");
}

#[tokio::test]
async fn timeout_kills_the_command_and_reports_124() {
    let h = harness();
    let started = Instant::now();
    let args = ExecCommandArgs {
        timeout_ms: Some(1000),
        ..cmd_yield("sleep 30", 30_000)
    };
    let result = exec(&h.engine, args).await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "returned well before 30 s"
    );
    assert_eq!(result.status, ExecStatus::Exited);
    assert_eq!(result.exit_code, Some(124));
    assert!(
        result.output.contains("timed out after 1000 ms"),
        "{:?}",
        result.output
    );
}

#[tokio::test]
async fn yield_expiry_never_kills() {
    let h = harness();
    let first = exec(&h.engine, cmd_yield("sleep 1; echo finished", 250)).await;
    assert_eq!(first.status, ExecStatus::Running);
    let id = first.session_id.expect("session id");
    let (output, last) = poll_until_exited(&h.engine, id).await;
    assert_eq!(output, "finished\n");
    assert_eq!(last.exit_code, Some(0));
}

#[tokio::test]
async fn background_grandchild_holding_the_pipe_does_not_hold_the_result() {
    let h = harness();
    let started = Instant::now();
    let result = exec(&h.engine, cmd_yield("(sleep 30 &); echo done", 30_000)).await;
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "returned after the 2 s drain, not 30 s"
    );
    assert_eq!(result.status, ExecStatus::Exited);
    assert_eq!(result.exit_code, Some(0));
    assert_eq!(result.output, "done\n");
}

#[tokio::test]
async fn killing_a_session_kills_setsid_grandchildren() {
    let h = harness();
    let (id, pid) = start_reporting_a_pid(
        &h.engine,
        "setsid sleep 1000 & echo \"pid $!\"; while true; do sleep 1; done",
    )
    .await;
    assert!(alive(pid), "the setsid grandchild runs before the kill");
    within("kill_session", h.engine.kill_session(id))
        .await
        .expect("kill succeeds");
    wait_until_dead(pid, "the setsid grandchild").await;
}

#[tokio::test]
async fn thirty_megabytes_of_output_keep_head_and_tail_within_a_small_budget() {
    if !alone_in_a_new_process(
        "thirty_megabytes_of_output_keep_head_and_tail_within_a_small_budget",
    ) {
        return;
    }
    let h = harness();
    let args = ExecCommandArgs {
        max_output_tokens: Some(1000),
        ..cmd_yield("seq 1 4000000", 30_000)
    };
    let rss_before_kib = memory_kib("VmRSS");
    let result = exec(&h.engine, args).await;
    // The test runs alone in its process, so this peak is its own. Keeping the output (29 MB)
    // would raise it by far more than the bounded capture and its render.
    let peak_growth_kib = memory_kib("VmHWM").saturating_sub(rss_before_kib);
    assert!(
        peak_growth_kib < 20 * 1024,
        "memory stays flat while 29 MB pass through: peak grew by {peak_growth_kib} KiB"
    );
    assert_eq!(result.status, ExecStatus::Exited);
    assert_eq!(result.exit_code, Some(0));
    assert!(
        result
            .output
            .starts_with("Total output lines: 4000000\n\n1\n2\n3\n"),
        "{}",
        &result.output[..200]
    );
    assert!(result.output.contains("tokens truncated…"));
    assert!(
        result.output.contains("3999999\n4000000\n"),
        "the tail survives"
    );
    assert!(
        result.output.len() < 6000,
        "folded to about 1000 tokens: {}",
        result.output.len()
    );
    assert!(
        result.original_token_count > 7_000_000,
        "{}",
        result.original_token_count
    );
    let file = result
        .output_file
        .expect("a truncated result names the full log");
    let log_len = std::fs::metadata(&file)
        .expect("the named log exists")
        .len();
    assert!(
        log_len > 28_000_000,
        "the log holds the whole output: {log_len}"
    );
    assert!(
        result.output.contains(&file),
        "the output says where the log is"
    );
}

#[tokio::test]
async fn nul_bytes_are_withheld_as_binary() {
    let h = harness();
    let result = exec(&h.engine, cmd("printf 'a\\0b\\0c'")).await;
    assert_eq!(result.exit_code, Some(0));
    assert!(
        result
            .output
            .starts_with("[binary output withheld: 5 bytes"),
        "{:?}",
        result.output
    );
    assert!(!result.output.contains('\0'));
}

#[tokio::test]
async fn multibyte_character_split_across_reads_arrives_whole() {
    let h = harness();
    let first = exec(
        &h.engine,
        cmd_yield("printf '\\342\\202'; sleep 1; printf '\\254 done\\n'", 250),
    )
    .await;
    let mut output = first.output.clone();
    if first.status != ExecStatus::Exited {
        let id = first.session_id.expect("session id");
        output.push_str(&poll_until_exited(&h.engine, id).await.0);
    }
    assert_eq!(output, "€ done\n");
}

#[tokio::test]
async fn exit_codes_and_signals_are_reported() {
    let h = harness();
    let table = [
        ("exit 3", 3, None),
        ("true", 0, None),
        ("kill -9 $$", 137, Some("SIGKILL")),
        ("kill -TERM $$", 143, Some("SIGTERM")),
    ];
    for (command, code, signal) in table {
        let result = exec(&h.engine, cmd(command)).await;
        assert_eq!(result.exit_code, Some(code), "{command}");
        assert_eq!(result.signal.as_deref(), signal, "{command}");
    }
}

#[tokio::test]
async fn ctrl_c_interrupts_a_pipe_session() {
    let h = harness();
    assert_ctrl_c_interrupts(&h.engine, cmd_yield("sleep 100", 250)).await;
}

#[tokio::test]
async fn ctrl_d_closes_stdin_of_a_pipe_session() {
    let h = harness();
    let id = start(&h.engine, cmd_yield("wc -c", 250)).await;
    let result = reply(&h.engine, id, "abc\u{4}").await;
    assert_eq!(result.status, ExecStatus::Exited);
    assert_eq!(result.output.trim(), "3");
}

#[tokio::test]
async fn environment_has_defaults_and_no_secrets() {
    let h = harness_with(|config| {
        config.base_env = Some(vec![
            ("PATH".into(), std::env::var("PATH").unwrap_or_default()),
            ("MY_SECRET_TOKEN".into(), "leak".into()),
            ("PASSED_API_KEY".into(), "ok".into()),
        ]);
        config.pass_env = vec!["PASSED_API_KEY".into()];
    });
    let mut args = cmd(
        "echo \"$PAGER $TERM $NO_COLOR $GIT_TERMINAL_PROMPT ${MY_SECRET_TOKEN:-scrubbed} $PASSED_API_KEY $EXTRA\"",
    );
    args.env.insert("EXTRA".into(), "given".into());
    // Not a login shell: the profile would complain about the trimmed environment.
    args.login = Some(false);
    let result = exec(&h.engine, args).await;
    assert_eq!(result.output, "cat dumb 1 0 scrubbed ok given\n");
}

#[tokio::test]
async fn nonexistent_workdir_is_rejected_at_once() {
    let h = harness();
    let mut args = cmd("true");
    args.workdir = Some("/nonexistent/dir".into());
    let err = within("exec_command", h.engine.exec_command(args))
        .await
        .expect_err("rejected");
    assert!(matches!(err, ExecError::InvalidWorkdir { .. }), "{err}");
}

#[tokio::test]
async fn relative_workdir_resolves_against_the_default() {
    let base = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(base.path().join("sub")).expect("mkdir");
    let path = base.path().to_path_buf();
    let h = harness_with(|config| config.default_workdir = path);
    let mut args = cmd("pwd");
    args.workdir = Some("sub".into());
    let result = exec(&h.engine, args).await;
    assert_eq!(
        result.output.trim(),
        base.path().join("sub").display().to_string()
    );
}

#[tokio::test]
async fn exited_session_keeps_unread_output_until_the_next_poll() {
    let h = harness();
    let id = start(
        &h.engine,
        cmd_yield("echo one; sleep 1; echo two; exit 5", 250),
    )
    .await;
    let info = wait_until_listed_as_exited(&h.engine, id, "the command").await;
    assert_eq!(info.exit_code, Some(5));
    assert!(info.unread_bytes > 0);
    let last = stdin(&h.engine, write(id, "")).await;
    assert_eq!(last.status, ExecStatus::Exited);
    assert_eq!(last.exit_code, Some(5));
    assert!(last.output.ends_with("two\n"), "{:?}", last.output);
    assert!(last.session_id.is_none());
    let err = within("write_stdin", h.engine.write_stdin(write(id, "")))
        .await
        .expect_err("gone after the final read");
    assert_eq!(err.to_string(), format!("Unknown process id {id}"));
}

#[tokio::test]
async fn seventy_sessions_prune_the_least_recently_used_beyond_sixty_four() {
    let h = harness();
    let mut started = Vec::new();
    for _ in 0..64 {
        started.push(start(&h.engine, cmd_yield("sleep 1000", 250)).await);
    }
    let pids: std::collections::HashMap<u32, i32> = h
        .engine
        .list_sessions()
        .await
        .sessions
        .iter()
        .map(|s| (s.session_id, s.pid as i32))
        .collect();
    // Using the oldest session makes it the most recently used: it is protected from pruning.
    let touched = started[0];
    let used = stdin(&h.engine, write(touched, "\n")).await;
    assert_eq!(used.status, ExecStatus::Running, "{used:?}");
    for _ in 64..70 {
        started.push(start(&h.engine, cmd_yield("sleep 1000", 250)).await);
    }
    let listed = h.engine.list_sessions().await;
    assert_eq!(listed.sessions.len(), 64);
    let is_listed = |id: u32| listed.sessions.iter().any(|s| s.session_id == id);
    assert!(
        is_listed(touched),
        "the recently used oldest session was kept"
    );
    for pruned in &started[1..7] {
        assert!(!is_listed(*pruned), "{pruned} was pruned");
        let err = within("write_stdin", h.engine.write_stdin(write(*pruned, "")))
            .await
            .expect_err("a pruned session is unknown");
        assert!(matches!(err, ExecError::UnknownSession(_)), "{err}");
        wait_until_dead(pids[pruned], "a pruned session's process").await;
    }
    for kept in &started[7..] {
        assert!(is_listed(*kept), "{kept} was kept");
    }
    within("shutdown", h.engine.shutdown()).await;
    assert!(h.engine.list_sessions().await.sessions.is_empty());
}

#[tokio::test]
async fn exited_sessions_are_pruned_before_running_ones() {
    let h = harness_with(|config| {
        config.max_sessions = 4;
        config.n_protected_recent = 1;
    });
    let oldest_running = start(&h.engine, cmd_yield("sleep 1000", 250)).await;
    let running = start(&h.engine, cmd_yield("sleep 1000", 250)).await;
    let short = start(&h.engine, cmd_yield("sleep 0.5", 250)).await;
    let newest = start(&h.engine, cmd_yield("sleep 1000", 250)).await;
    wait_until_listed_as_exited(&h.engine, short, "sleep 0.5").await;
    exec(&h.engine, cmd_yield("sleep 1000", 250)).await;
    let ids: Vec<u32> = h
        .engine
        .list_sessions()
        .await
        .sessions
        .iter()
        .map(|s| s.session_id)
        .collect();
    assert!(!ids.contains(&short), "the exited session goes first");
    for id in [oldest_running, running, newest] {
        assert!(ids.contains(&id), "{id} kept");
    }
    within("shutdown", h.engine.shutdown()).await;
}

#[tokio::test]
async fn shutdown_kills_every_session_and_refuses_new_commands() {
    let h = harness();
    let id = start(&h.engine, cmd_yield("sleep 1000", 250)).await;
    let pid = h.engine.list_sessions().await.sessions[0].pid as i32;
    assert_eq!(h.engine.list_sessions().await.sessions[0].session_id, id);
    within("shutdown", h.engine.shutdown()).await;
    wait_until_dead(pid, "the session's process after shutdown").await;
    assert!(matches!(
        within("exec_command", h.engine.exec_command(cmd("true"))).await,
        Err(ExecError::ShuttingDown)
    ));
}

fn tty(cmd: &str, yield_time_ms: u64) -> ExecCommandArgs {
    ExecCommandArgs {
        tty: Some(true),
        ..cmd_yield(cmd, yield_time_ms)
    }
}

#[tokio::test]
async fn read_prompt_on_a_tty_is_reported_as_awaiting_input_then_answered() {
    let h = harness();
    let script = "printf 'Name? '; read n; echo \"hello $n\"";
    let (_, answer) = prompt_then_answer(&h.engine, tty(script, 30_000), "Name? ", "bob\n").await;
    assert_eq!(answer.exit_code, Some(0));
    assert_eq!(
        answer.output, "bob\nhello bob\n",
        "input is echoed by the terminal"
    );
}

#[tokio::test]
async fn python_input_on_a_tty_is_reported_as_awaiting_input() {
    let h = harness();
    let script = "python3 -c \"print('got', input('x: '))\"";
    let (_, answer) = prompt_then_answer(&h.engine, tty(script, 30_000), "x: ", "42\n").await;
    assert!(answer.output.ends_with("got 42\n"), "{:?}", answer.output);
}

#[tokio::test]
async fn tty_sessions_run_on_a_terminal_with_a_colour_term() {
    let h = harness();
    let result = exec(
        &h.engine,
        tty(
            "test -t 0 && test -t 1 && echo \"$TERM\" && stty size",
            30_000,
        ),
    )
    .await;
    assert_eq!(result.exit_code, Some(0), "{:?}", result.output);
    assert_eq!(result.output, "xterm-256color\n24 80\n", "a 24x80 terminal");
}

#[tokio::test]
async fn ctrl_c_on_a_tty_interrupts_the_foreground_command() {
    let h = harness();
    assert_ctrl_c_interrupts(&h.engine, tty("sleep 100", 250)).await;
}

/// The result shows output as a terminal would have shown it: behaviour, command, output.
#[tokio::test]
async fn output_is_cleaned_to_what_a_terminal_shows() {
    let h = harness();
    let alternate_screen = "printf 'before\\n\\033[?1049h\\033[H\\033[2Jframe one\\033[H\\033[2Jfinal frame\\033[?1049l'; echo after";
    let cases = [
        (
            "progress bar redraws fold to the final state",
            cmd("for i in $(seq 1 100); do printf '\\rprogress %3d%%' $i; done; echo; echo done"),
            "progress 100%\ndone\n",
        ),
        (
            "ANSI colours are removed",
            cmd("printf '\\033[1;31merror\\033[0m: \\033[32mok\\033[m\\n'"),
            "error: ok\n",
        ),
        (
            "an alternate-screen program on a tty is shown as its final screen",
            tty(alternate_screen, 30_000),
            "before\nfinal frame\nafter\n",
        ),
    ];
    for (behaviour, args, expected) in cases {
        assert_eq!(exec(&h.engine, args).await.output, expected, "{behaviour}");
    }
}

#[tokio::test]
async fn tty_sessions_get_the_scrubbed_environment_not_the_daemons() {
    // A variable of this test process that the engine's base environment leaves out stands for
    // a secret: the PTY spawner starts from the daemon's environment, so it must be removed.
    // Variables a shell sets by itself when they are missing (bash gives `SHELL` the login
    // shell, `PWD`, `SHLVL`, `HOSTNAME`...) or the engine sets (`TERM`) would say nothing.
    const SET_BY_THE_SHELL_OR_ENGINE: &[&str] = &[
        "PATH", "HOME", "SHELL", "PWD", "OLDPWD", "SHLVL", "HOSTNAME", "HOSTTYPE", "OSTYPE",
        "MACHTYPE", "TERM", "COLUMNS", "LINES", "IFS", "PS1", "PS2", "PS4", "OPTIND", "_",
    ];
    let (dropped, _) = std::env::vars()
        .find(|(name, _)| {
            !SET_BY_THE_SHELL_OR_ENGINE.contains(&name.as_str())
                && !name.starts_with("BASH")
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
        .expect("the test process has an environment variable no shell sets by itself");
    let h = harness_with(|config| {
        config.base_env = Some(vec![
            ("PATH".into(), std::env::var("PATH").unwrap_or_default()),
            ("HOME".into(), std::env::var("HOME").unwrap_or_default()),
            ("MY_SECRET_TOKEN".into(), "leak".into()),
        ]);
    });
    let script = format!("echo \"${{{dropped}:-absent}} ${{MY_SECRET_TOKEN:-scrubbed}}\"");
    let args = ExecCommandArgs {
        login: Some(false),
        ..tty(&script, 30_000)
    };
    let result = exec(&h.engine, args).await;
    assert_eq!(
        result.output, "absent scrubbed\n",
        "{dropped} must not reach the command"
    );
}

#[tokio::test]
async fn missing_shell_is_an_immediate_spawn_error() {
    let h = harness();
    for tty_mode in [false, true] {
        let args = ExecCommandArgs {
            shell: Some("/nonexistent/shell".into()),
            tty: Some(tty_mode),
            ..cmd("true")
        };
        let err = within("exec_command", h.engine.exec_command(args))
            .await
            .expect_err("cannot start");
        assert!(matches!(err, ExecError::Spawn { .. }), "{err}");
    }
}

#[tokio::test]
async fn orphaned_grandchildren_are_reaped_not_left_as_zombies() {
    let h = harness();
    let result = exec(&h.engine, cmd("sh -c 'sleep 0.5 & echo $!'")).await;
    assert_eq!(result.status, ExecStatus::Exited);
    let pid: i32 = result.output.trim().parse().expect("the orphan's pid");
    // The orphan was re-parented to this process (the subreaper); once it exits, the reaper
    // must collect it, so its /proc entry disappears entirely instead of staying a zombie.
    let proc_entry = format!("/proc/{pid}");
    eventually(&format!("orphan {pid} to be reaped"), || {
        !std::path::Path::new(&proc_entry).exists()
    })
    .await;
}

#[tokio::test]
async fn raw_log_is_bounded_named_and_deleted_at_shutdown() {
    let logs = tempfile::tempdir().expect("temp dir");
    let log_dir = logs.path().join("logs");
    let dir = log_dir.clone();
    let h = harness_with(move |config| {
        config.log_dir = dir;
        config.max_log_bytes = 100 * 1024;
    });
    let args = ExecCommandArgs {
        max_output_tokens: Some(100),
        ..cmd("seq 1 200000")
    };
    let result = exec(&h.engine, args).await;
    let file = result.output_file.expect("truncated output names the log");
    assert_eq!(
        std::fs::metadata(&file).expect("log exists").len(),
        100 * 1024
    );
    assert!(
        result.output.contains("its first 102400 bytes"),
        "{}",
        result.output
    );
    let head = std::fs::read_to_string(&file).expect("readable log");
    assert!(head.starts_with("1\n2\n3\n"));
    within("shutdown", h.engine.shutdown()).await;
    assert!(
        !std::path::Path::new(&file).exists(),
        "logs are deleted at shutdown"
    );
    assert!(
        !log_dir.exists(),
        "the log directory is removed at shutdown"
    );
}

#[tokio::test]
async fn untruncated_results_name_no_log_and_leave_none_behind() {
    let logs = tempfile::tempdir().expect("temp dir");
    let log_dir = logs.path().join("logs");
    let dir = log_dir.clone();
    let h = harness_with(move |config| config.log_dir = dir);
    let result = exec(&h.engine, cmd("echo small")).await;
    assert!(result.output_file.is_none());
    let leftovers = std::fs::read_dir(&log_dir).map(|d| d.count()).unwrap_or(0);
    assert_eq!(leftovers, 0, "a finished session's unnamed log is deleted");
}

#[tokio::test]
async fn an_unwritable_log_directory_is_never_named_as_output_file() {
    let h = harness_with(|config| config.log_dir = "/proc/warren-cannot-create/logs".into());
    let args = ExecCommandArgs {
        max_output_tokens: Some(10),
        ..cmd("seq 1 1000")
    };
    let result = exec(&h.engine, args).await;
    assert_eq!(
        result.exit_code,
        Some(0),
        "commands still run without a log"
    );
    assert!(result.output_file.is_none());
    assert!(
        result.output.contains("log file could not be created"),
        "{}",
        result.output
    );
}

/// What an agent that lost its ids sees: each session's command, directory, mode, state,
/// process, start time, idle time and unread output.
#[tokio::test]
async fn list_sessions_describes_every_live_session() {
    let h = harness();
    let workdir = std::env::temp_dir().display().to_string();
    let server = start(
        &h.engine,
        cmd_yield("sleep 2; echo listening; sleep 1000", 250),
    )
    .await;
    let prompt = start(
        &h.engine,
        cmd_yield("printf 'Name? '; read n; sleep 1000", 30_000),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let (server_info, prompt_info) = loop {
        let listed = h.engine.list_sessions().await.sessions;
        let find = |id: u32| listed.iter().find(|s| s.session_id == id).cloned();
        let (Some(server_info), Some(prompt_info)) = (find(server), find(prompt)) else {
            panic!("both sessions are listed: {listed:?}");
        };
        if server_info.unread_bytes > 0 && prompt_info.status == ExecStatus::AwaitingInput {
            break (server_info, prompt_info);
        }
        assert!(
            Instant::now() < deadline,
            "the server's line is unread and the prompt awaits input within 30 s: {listed:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(server_info.cmd, "sleep 2; echo listening; sleep 1000");
    assert_eq!(server_info.workdir, workdir);
    assert!(!server_info.tty);
    assert_eq!(server_info.status, ExecStatus::Running);
    assert_eq!(server_info.exit_code, None);
    assert!(server_info.pid > 1);
    assert!(server_info.started_at.ends_with('Z'), "{server_info:?}");
    assert_eq!(server_info.unread_bytes, "listening\n".len() as u64);
    assert_eq!(
        prompt_info.unread_bytes, 0,
        "the prompt was returned already"
    );
    let polled = stdin(&h.engine, write(server, "")).await;
    assert_eq!(polled.output, "listening\n");
    let listed = h.engine.list_sessions().await.sessions;
    let after = listed
        .iter()
        .find(|s| s.session_id == server)
        .expect("still listed while running");
    assert_eq!(
        after.unread_bytes, 0,
        "reading the output leaves none unread"
    );
    for id in [server, prompt] {
        within("kill_session", h.engine.kill_session(id))
            .await
            .expect("kill succeeds");
    }
    let listed = h.engine.list_sessions().await.sessions;
    assert!(
        listed
            .iter()
            .all(|s| s.session_id != server && s.session_id != prompt),
        "killed sessions are gone: {listed:?}"
    );
}

#[tokio::test]
async fn the_shell_parameter_picks_the_shell_and_login_false_is_not_a_login_shell() {
    let h = harness();
    for shell in ["sh", "/bin/sh", "bash"] {
        let args = ExecCommandArgs {
            shell: Some(shell.to_owned()),
            ..cmd("echo $0")
        };
        let result = exec(&h.engine, args).await;
        assert_eq!(result.exit_code, Some(0), "{shell:?}: {:?}", result.output);
        assert_eq!(result.output, format!("{shell}\n"), "{shell:?}");
    }
    let args = ExecCommandArgs {
        shell: Some("bash".into()),
        login: Some(false),
        ..cmd("shopt -q login_shell && echo login || echo not-login")
    };
    assert_eq!(exec(&h.engine, args).await.output, "not-login\n");
}

/// Password prompts (`sudo`, `ssh`, `getpass`) read `/dev/tty`, not stdin.
#[tokio::test]
async fn a_password_prompt_reading_dev_tty_is_reported_as_awaiting_input() {
    let h = harness();
    let script = "python3 -c \"import getpass; print('got', getpass.getpass('Password: '))\"";
    let (_, answer) =
        prompt_then_answer(&h.engine, tty(script, 30_000), "Password: ", "hunter2\n").await;
    assert!(
        answer.output.ends_with("got hunter2\n"),
        "{:?}",
        answer.output
    );
    assert!(
        !answer.output.contains("hunter2\ngot"),
        "the password is not echoed: {:?}",
        answer.output
    );
}

#[tokio::test]
async fn a_repl_prompt_on_a_tty_is_reported_as_awaiting_input() {
    let h = harness();
    let prompted = exec(&h.engine, tty("python3 -q", 30_000)).await;
    assert_eq!(prompted.status, ExecStatus::AwaitingInput, "{prompted:?}");
    assert!(prompted.output.ends_with(">>> "), "{:?}", prompted.output);
    let id = prompted.session_id.expect("session id");
    let answered = stdin(
        &h.engine,
        WriteStdinArgs {
            yield_time_ms: Some(30_000),
            ..write(id, "print(6 * 7)\n")
        },
    )
    .await;
    assert_eq!(answered.status, ExecStatus::AwaitingInput, "{answered:?}");
    assert!(answered.output.contains("42\n"), "{:?}", answered.output);
    let done = reply(&h.engine, id, "exit()\n").await;
    assert_eq!(done.status, ExecStatus::Exited, "{done:?}");
}

#[tokio::test]
async fn a_tree_that_ignores_sigterm_is_killed_after_the_grace_period() {
    let h = harness_with(|config| config.kill_grace = Duration::from_millis(300));
    let (id, pid) = start_reporting_a_pid(
        &h.engine,
        "trap '' TERM; sleep 1000 & echo \"pid $!\"; wait",
    )
    .await;
    let killed = within("kill_session", h.engine.kill_session(id))
        .await
        .expect("kill succeeds");
    assert_eq!(killed.exit_code, Some(137), "SIGKILL ended it: {killed:?}");
    wait_until_dead(pid, "the sleeper that ignores SIGTERM").await;
}

/// Regression: 100 concurrent `echo xN` calls returned `exited`, exit 0 and an empty output
/// after 2.2-2.9 s. Registering a new session pruned one a call was still waiting on, which
/// aborted its output reader; the waiter then gave up draining after 2 s. 200 concurrent
/// calls, 20 times, with room for them all: every call gets its own output.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_exec_calls_never_lose_their_output() {
    let harness = harness_with(|config| config.max_sessions = 256);
    run_concurrent_echoes(&harness.engine, 20, 200, false).await;
}

/// The same load as above on the default 64 sessions: calls beyond the limit are refused with
/// `TooManySessions` at once, and every call that runs returns its own output.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_exec_calls_beyond_the_session_limit_are_refused_never_emptied() {
    let harness = harness();
    run_concurrent_echoes(&harness.engine, 5, 200, true).await;
}

async fn run_concurrent_echoes(
    engine: &Arc<Engine>,
    n_rounds: usize,
    n_calls: usize,
    may_refuse: bool,
) {
    for round in 0..n_rounds {
        let mut calls = tokio::task::JoinSet::new();
        for n in 0..n_calls {
            let engine = Arc::clone(engine);
            calls.spawn(async move {
                let result = engine.exec_command(cmd(&format!("echo x{n}"))).await;
                (n, result)
            });
        }
        while let Some(joined) = calls.join_next().await {
            let (n, result) = joined.expect("call task");
            let result = match result {
                Err(ExecError::TooManySessions(64)) if may_refuse => continue,
                other => other.expect("exec_command succeeds"),
            };
            assert_eq!(result.status, ExecStatus::Exited, "round {round} call {n}");
            assert_eq!(
                result.exit_code,
                Some(0),
                "round {round} call {n}: {result:?}"
            );
            assert_eq!(
                result.output,
                format!("x{n}\n"),
                "round {round} call {n}: {result:?}"
            );
        }
    }
}

/// Regression: with more calls in flight than session slots, pruning took sessions whose
/// callers were still waiting: the callers got SIGTERM (143) or an empty output.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pruning_never_kills_a_session_a_call_is_waiting_on_and_a_full_engine_answers_too_many_sessions()
 {
    let harness = harness_with(|config| config.max_sessions = 4);
    let engine = &harness.engine;
    let mut running = Vec::new();
    for n in 0..4 {
        let engine = Arc::clone(engine);
        running.push(tokio::spawn(async move {
            engine
                .exec_command(cmd(&format!("sleep 2; echo slow{n}")))
                .await
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while engine.list_sessions().await.sessions.len() < 4 {
        assert!(
            Instant::now() < deadline,
            "four sessions listed within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refused = engine
        .exec_command(cmd("echo fifth"))
        .await
        .expect_err("every slot is in use");
    assert!(
        matches!(refused, ExecError::TooManySessions(4)),
        "{refused:?}"
    );
    for (n, call) in running.into_iter().enumerate() {
        let result = call.await.expect("task").expect("exec_command succeeds");
        assert_eq!(
            result.exit_code,
            Some(0),
            "call {n} was not killed: {result:?}"
        );
        assert_eq!(result.output, format!("slow{n}\n"));
    }
    let after = exec(engine, cmd("echo room again")).await;
    assert_eq!(after.output, "room again\n");
}

#[tokio::test]
async fn a_nul_byte_or_an_oversized_cmd_is_an_invalid_argument() {
    let harness = harness();
    for args in [
        cmd("echo a\0b"),
        cmd(&"x".repeat(1024 * 1024)),
        ExecCommandArgs {
            workdir: Some("a\0b".into()),
            ..cmd("true")
        },
    ] {
        let error = harness
            .engine
            .exec_command(args)
            .await
            .expect_err("refused");
        assert!(matches!(error, ExecError::InvalidArgument(_)), "{error:?}");
    }
}

// --- watchers -------------------------------------------------------------------------------

/// Everything a watcher heard, in order: `started` commands, output bytes, exits, removals.
#[derive(Default)]
struct Recorder {
    started: std::sync::Mutex<
        Vec<(
            u32,
            warren_exec::SessionKind,
            String,
            warren_exec::SessionInput,
        )>,
    >,
    output: Arc<std::sync::Mutex<Vec<u8>>>,
    ends: Arc<std::sync::Mutex<Vec<String>>>,
}

struct RecordingFeed {
    output: Arc<std::sync::Mutex<Vec<u8>>>,
    ends: Arc<std::sync::Mutex<Vec<String>>>,
}

impl warren_exec::Watcher for Recorder {
    fn started(&self, session: warren_exec::WatchedSession) -> Arc<dyn warren_exec::Feed> {
        self.started.lock().expect("lock").push((
            session.id,
            session.kind,
            session.command_line,
            session.input,
        ));
        Arc::new(RecordingFeed {
            output: Arc::clone(&self.output),
            ends: Arc::clone(&self.ends),
        })
    }
}

impl warren_exec::Feed for RecordingFeed {
    fn output(&self, bytes: &[u8]) {
        self.output.lock().expect("lock").extend_from_slice(bytes);
    }
    fn finished(&self, exit_code: Option<i32>) {
        let n_bytes = self.output.lock().expect("lock").len();
        self.ends
            .lock()
            .expect("lock")
            .push(format!("finished {exit_code:?} after {n_bytes} bytes"));
    }
    fn removed(&self) {
        self.ends.lock().expect("lock").push("removed".into());
    }
}

fn watched() -> (Arc<Engine>, Arc<Recorder>, tempfile::TempDir) {
    warren_process::reaper::start().expect("become subreaper and start reaping");
    let logs = tempfile::tempdir().expect("temp dir");
    let config = EngineConfig {
        log_dir: logs.path().join("logs"),
        default_workdir: std::env::temp_dir(),
        ..EngineConfig::default()
    };
    let recorder = Arc::new(Recorder::default());
    let engine = Engine::with_watcher(config, recorder.clone());
    (engine, recorder, logs)
}

#[tokio::test]
async fn a_watcher_gets_every_raw_byte_then_the_exit_then_the_removal() {
    let (engine, recorder, _logs) = watched();
    // More than the capture and the fold keep, with a carriage return the result would clean.
    let result = exec(
        &engine,
        cmd("printf 'a\\rb\\n'; head -c 3000000 /dev/zero | tr '\\0' x; exit 7"),
    )
    .await;
    assert_eq!(result.exit_code, Some(7));
    let output = recorder.output.lock().expect("lock").clone();
    assert_eq!(output.len(), 4 + 3_000_000);
    assert!(output.starts_with(b"a\rb\nxxx"));
    eventually("the session's removal reaches the watcher", || {
        recorder.ends.lock().expect("lock").len() == 2
    })
    .await;
    assert_eq!(
        *recorder.ends.lock().expect("lock"),
        ["finished Some(7) after 3000004 bytes", "removed"]
    );
    let started = recorder.started.lock().expect("lock");
    assert_eq!(started.len(), 1);
    assert_eq!(started[0].1, warren_exec::SessionKind::Exec);
    assert!(started[0].2.starts_with("printf 'a"), "{}", started[0].2);
}

#[tokio::test]
async fn a_watchers_input_reaches_the_command_the_agent_waits_on() {
    let (engine, recorder, _logs) = watched();
    let create = warren_protocol::terminal::TerminalCreate {
        command: "bash".into(),
        args: vec!["-c".into(), "read n; echo \"hello $n\"".into()],
        ..Default::default()
    };
    let created = engine.start_terminal(create).expect("terminal");
    let input = {
        let started = recorder.started.lock().expect("lock");
        assert_eq!(started[0].1, warren_exec::SessionKind::Terminal);
        assert_eq!(started[0].2, "bash -c read n; echo \"hello $n\"");
        started[0].3.clone()
    };
    input.write(b"warren\n").await.expect("typed");
    let output = within(
        "the terminal's exit",
        engine.terminal_output(&created.terminal_id, Duration::from_secs(20)),
    )
    .await
    .expect("output");
    assert_eq!(output.output, "hello warren\n");
    engine
        .release_terminal(&created.terminal_id)
        .await
        .expect("released");
    eventually("the released terminal's input is gone", || {
        recorder
            .ends
            .lock()
            .expect("lock")
            .last()
            .map(String::as_str)
            == Some("removed")
    })
    .await;
    let gone = input
        .write(b"late\n")
        .await
        .expect_err("the command is gone");
    assert_eq!(gone.kind(), std::io::ErrorKind::NotFound);
}

#[tokio::test]
async fn a_character_split_across_writes_reaches_a_terminal_reader_whole() {
    let engine = Engine::new(EngineConfig::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let go = dir.path().join("go");
    // The rest of the character is written only once the test has read the first part.
    let script = format!(
        r"printf 'A\xe4\xbd'; while [ ! -e '{}' ]; do sleep 0.02; done; printf '\xa0\xe5\xa5\xbd\n'",
        go.display()
    );
    let create = warren_protocol::terminal::TerminalCreate {
        command: "bash".into(),
        args: vec!["-c".into(), script],
        ..Default::default()
    };
    let created = engine.start_terminal(create).expect("terminal");
    // The first write has arrived once "A" shows; the two bytes after it wait for the third.
    let mut first = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while first.is_empty() {
        assert!(Instant::now() < deadline, "no output of the first write");
        first = engine
            .terminal_output(&created.terminal_id, Duration::ZERO)
            .await
            .expect("output")
            .output;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        first, "A",
        "an incomplete character is held back, not replaced"
    );
    std::fs::write(&go, "").expect("go");
    let output = within(
        "the terminal's exit",
        engine.terminal_output(&created.terminal_id, Duration::from_secs(20)),
    )
    .await
    .expect("output");
    assert!(output.exit_status.is_some(), "{output:?}");
    assert_eq!(output.output, "A你好\n");
}
