//! The exec tools through real MCP clients against the real `warren` binary: `warren mcp` over
//! stdio (in-process engine and the `--execd` remote form), and execd's `/mcp` route behind its
//! access token, also driven by the official MCP Python and TypeScript SDKs. The scenarios every
//! transport passes are in `warren_test_support::mcp`; the in-process HTTP service is tested in
//! `warren-mcp`.

use std::path::Path;

use anyhow::Context as _;
use rmcp::ServiceExt as _;
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};
use warren_test_support::mcp::*;
use warren_test_support::{alive, eventually, python, repo_root, try_within};

use crate::support::{ExecdChild, warren};

/// `warren mcp <args>` as a child process, with an MCP client on its stdio.
async fn stdio_client(args: &[&str]) -> anyhow::Result<McpClient> {
    stdio_client_with_env(args, &[]).await
}

/// `warren mcp <args>` with `env` added to its environment.
async fn stdio_client_with_env(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<McpClient> {
    let mut command = tokio::process::Command::new(warren());
    command
        .arg("mcp")
        .args(args)
        .env_remove("WARREN_EXECD_TOKEN")
        .envs(env.iter().copied())
        .env("WARREN_LOG", "warn");
    let transport = TokioChildProcess::new(command).context("spawning warren mcp")?;
    try_within(
        "the MCP initialize handshake over stdio",
        ().serve(transport),
    )
    .await?
    .context("MCP initialize over stdio")
}

// ---------------------------------------------------------------------------------------------
// stdio: `warren mcp` with the in-process engine.

async fn local_stdio_client(dir: &Path) -> anyhow::Result<McpClient> {
    stdio_client(&["--workdir", dir.to_str().expect("utf-8 temp dir")]).await
}

/// Runs `scenario` against `warren mcp --workdir <a fresh temp dir>` over stdio, then closes it.
async fn on_local_stdio(
    scenario: impl AsyncFnOnce(&McpClient, &Path) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let client = local_stdio_client(dir.path()).await?;
    scenario(&client, dir.path()).await?;
    client.cancel().await?;
    Ok(())
}

#[tokio::test]
async fn stdio_lists_the_four_tools_with_their_input_schemas() -> anyhow::Result<()> {
    on_local_stdio(async |client, _| lists_the_four_tools_with_their_schemas(client).await).await
}

#[tokio::test]
async fn stdio_quick_command_returns_codex_text_and_structured_result() -> anyhow::Result<()> {
    on_local_stdio(async |client, dir| {
        quick_command_returns_codex_text_and_json(client).await?;
        // Commands run in --workdir by default.
        commands_run_in(client, dir).await
    })
    .await
}

#[tokio::test]
async fn stdio_passes_every_exec_command_argument() -> anyhow::Result<()> {
    on_local_stdio(async |client, dir| every_argument_reaches_the_engine(client, dir).await).await
}

#[tokio::test]
async fn stdio_long_command_returns_a_session_then_polls_to_exit() -> anyhow::Result<()> {
    on_local_stdio(async |client, dir| long_command_is_polled_to_its_exit(client, dir).await).await
}

#[tokio::test]
async fn stdio_prompt_reports_awaiting_input_and_takes_an_answer() -> anyhow::Result<()> {
    on_local_stdio(async |client, _| prompt_is_answered_with_write_stdin(client).await).await
}

#[tokio::test]
async fn stdio_lists_and_kills_sessions() -> anyhow::Result<()> {
    on_local_stdio(async |client, _| sessions_are_listed_and_killed(client).await).await
}

#[tokio::test]
async fn stdio_bad_arguments_and_unknown_sessions_are_tool_errors() -> anyhow::Result<()> {
    on_local_stdio(async |client, _| bad_arguments_are_tool_errors(client).await).await
}

#[tokio::test]
async fn stdio_cancelled_call_leaves_its_session_running_and_listed() -> anyhow::Result<()> {
    on_local_stdio(async |client, dir| cancelled_call_leaves_its_session_running(client, dir).await)
        .await
}

async fn cancelled_call_leaves_its_session_running(
    client: &McpClient,
    dir: &Path,
) -> anyhow::Result<()> {
    let started = dir.join("started");
    let cmd = format!("touch '{}'; sleep 600", started.display());
    let arguments = json!({"cmd": cmd, "yield_time_ms": 30000});
    // The agent's turn is interrupted while the call waits: dropping the call sends
    // notifications/cancelled. The command must keep running, findable by list_sessions.
    tokio::select! {
        result = call(client, "exec_command", arguments) => {
            anyhow::bail!("exec_command returned before it was cancelled: {result:?}")
        }
        waited = try_within("the command to start", until_exists(&started)) => waited?,
    }
    let session = listed_session(client, |s| s["cmd"] == cmd).await?;
    let session = session["session_id"]
        .as_u64()
        .unwrap_or_else(|| panic!("the cancelled call's session has no id: {session}"));
    let killed = call(client, "kill_session", json!({"session_id": session})).await?;
    assert_eq!(structured(&killed)["status"], "exited");
    Ok(())
}

/// Polls every 20 ms until `path` exists (wrap in `try_within` for the timeout).
async fn until_exists(path: &Path) {
    while !path.exists() {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn stdio_client_disconnect_kills_running_commands() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let client = local_stdio_client(dir.path()).await?;
    let session = start_running(&client, "sleep 600").await?;
    let entry = listed_session(&client, |s| s["session_id"] == session).await?;
    let pid = entry["pid"].as_u64().expect("listed with a pid");
    // Closing stdin ends `warren mcp`, which kills the sessions it started.
    try_within("warren mcp to exit after stdin closes", client.cancel()).await??;
    eventually("the session's process to be gone", || !alive(pid)).await;
    Ok(())
}

#[tokio::test]
async fn stdio_sigterm_kills_running_commands() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let client = local_stdio_client(dir.path()).await?;
    let session = start_running(&client, "sleep 600").await?;
    let entry = listed_session(&client, |s| s["session_id"] == session).await?;
    let pid = entry["pid"].as_u64().expect("listed with a pid");
    // The command's parent is `warren mcp` itself (commands are its direct children).
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let parent: i32 = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
        .and_then(|ppid| ppid.parse().ok())
        .context("the command's parent pid")?;
    let cmdline = std::fs::read_to_string(format!("/proc/{parent}/cmdline"))?;
    anyhow::ensure!(
        cmdline.split('\0').nth(1) == Some("mcp"),
        "the command's parent {parent} is not `warren mcp`: {cmdline:?}"
    );
    let warren = rustix::process::Pid::from_raw(parent).context("pid 0")?;
    rustix::process::kill_process(warren, rustix::process::Signal::TERM)?;
    eventually("the session's process to be gone after SIGTERM", || {
        !alive(pid)
    })
    .await;
    drop(client);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// A real `warren execd`: `/mcp` behind the access token, and `warren mcp --execd`.

#[tokio::test]
async fn execd_serves_mcp_behind_its_access_token() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let execd = ExecdChild::start("mcp-test-token", dir.path()).await?;
    let url = format!("{}/mcp", execd.url);

    let refused = http_client(&url, None).await;
    assert!(refused.is_err(), "MCP without the access token must fail");
    let refused = http_client(&url, Some("wrong-token")).await;
    assert!(refused.is_err(), "MCP with a wrong access token must fail");
    // What such a client is told: a 401 in Warren's error shape, as on `/v1/exec`.
    let initialize = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "1"}}
    });
    for token in [None, Some("wrong-token")] {
        let mut request = reqwest::Client::new()
            .post(&url)
            .header("Accept", "application/json, text/event-stream")
            .json(&initialize);
        if let Some(token) = token {
            request = request.header("X-EXECD-ACCESS-TOKEN", token);
        }
        let response =
            try_within("the answer to an unauthenticated POST /mcp", request.send()).await??;
        assert_eq!(
            response.status(),
            reqwest::StatusCode::UNAUTHORIZED,
            "token {token:?}"
        );
        let body: Value = response.json().await?;
        assert_eq!(
            body,
            json!({"code": "UNAUTHORIZED", "message": "invalid or missing header X-EXECD-ACCESS-TOKEN"})
        );
    }

    let client = http_client(&url, Some(&execd.token)).await?;
    lists_the_four_tools_with_their_schemas(&client).await?;
    quick_command_returns_codex_text_and_json(&client).await?;
    sessions_are_listed_and_killed(&client).await?;
    client.cancel().await?;
    execd.stop().await
}

#[tokio::test]
async fn execd_shuts_down_while_an_mcp_client_is_connected() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let execd = ExecdChild::start("shutdown-token", dir.path()).await?;
    let client = http_client(&format!("{}/mcp", execd.url), Some(&execd.token)).await?;
    let session = start_running(&client, "sleep 600").await?;
    assert!(session > 0);
    // The client's session and its SSE stream are still open: SIGTERM must not wait for them.
    execd.stop().await?;
    drop(client);
    Ok(())
}

#[tokio::test]
async fn remote_mcp_runs_commands_on_execd() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let execd = ExecdChild::start("remote-test-token", dir.path()).await?;
    let client = stdio_client(&["--execd", &execd.url, "--token", &execd.token]).await?;
    quick_command_returns_codex_text_and_json(&client).await?;
    every_argument_reaches_the_engine(&client, dir.path()).await?;
    long_command_is_polled_to_its_exit(&client, dir.path()).await?;
    sessions_are_listed_and_killed(&client).await?;
    bad_arguments_are_tool_errors(&client).await?;
    // The command ran on execd, in its root.
    commands_run_in(&client, dir.path()).await?;
    client.cancel().await?;
    execd.stop().await
}

#[tokio::test]
async fn remote_mcp_runs_commands_on_execd_over_a_unix_socket() -> anyhow::Result<()> {
    let (dir, sockets) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let listen = format!("unix:{}", sockets.path().join("execd.sock").display());
    let execd = ExecdChild::start_on(&listen, "unix-test-token", dir.path()).await?;
    anyhow::ensure!(execd.url == listen, "execd printed {}", execd.url);
    let client = stdio_client(&["--execd", &execd.url, "--token", &execd.token]).await?;
    quick_command_returns_codex_text_and_json(&client).await?;
    commands_run_in(&client, dir.path()).await?;
    client.cancel().await?;
    execd.stop().await
}

#[tokio::test]
async fn remote_mcp_takes_the_token_from_warren_execd_token() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let execd = ExecdChild::start("env-test-token", dir.path()).await?;
    let client = stdio_client_with_env(
        &["--execd", &execd.url],
        &[("WARREN_EXECD_TOKEN", &execd.token)],
    )
    .await?;
    quick_command_returns_codex_text_and_json(&client).await?;
    client.cancel().await?;
    execd.stop().await
}

#[tokio::test]
async fn remote_sessions_outlive_the_mcp_client_and_are_found_again() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let execd = ExecdChild::start("outlive-test-token", dir.path()).await?;
    let args = [
        "--execd",
        execd.url.as_str(),
        "--token",
        execd.token.as_str(),
    ];
    let first = stdio_client(&args).await?;
    let session = start_running(&first, "sleep 601").await?;
    try_within("the first warren mcp to exit", first.cancel()).await??;
    // A new client (a new agent turn, after a restart) finds the command still running.
    let second = stdio_client(&args).await?;
    let entry = listed_session(&second, |s| s["session_id"] == session).await?;
    assert_eq!(entry["status"], "running", "{entry}");
    let killed = call(&second, "kill_session", json!({"session_id": session})).await?;
    assert_eq!(structured(&killed)["status"], "exited");
    second.cancel().await?;
    execd.stop().await
}

#[tokio::test]
async fn remote_mcp_with_a_wrong_token_explains_the_refusal() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let execd = ExecdChild::start("the-right-token", dir.path()).await?;
    let client = stdio_client(&["--execd", &execd.url, "--token", "a-wrong-token"]).await?;
    let result = call(&client, "exec_command", json!({"cmd": "true"})).await?;
    assert_eq!(result.is_error, Some(true));
    assert!(
        text(&result).contains("rejected the access token"),
        "{}",
        text(&result)
    );
    client.cancel().await?;
    execd.stop().await
}

#[tokio::test]
async fn remote_mcp_reports_an_unreachable_execd() -> anyhow::Result<()> {
    // A port that was just free: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let client = stdio_client(&["--execd", &url]).await?;
    let result = call(&client, "list_sessions", json!({})).await?;
    assert_eq!(result.is_error, Some(true));
    let text = text(&result);
    assert!(
        text.contains(&format!("execd at {url} unreachable")),
        "{text}"
    );
    client.cancel().await?;
    Ok(())
}

#[tokio::test]
async fn remote_mcp_refuses_a_malformed_execd_url_at_startup() -> anyhow::Result<()> {
    let output = try_within(
        "warren mcp to exit on a bad --execd",
        tokio::process::Command::new(warren())
            .args(["mcp", "--execd", "10.0.0.5:44772"])
            .stdin(std::process::Stdio::null())
            .output(),
    )
    .await??;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("invalid execd URL \"10.0.0.5:44772\""),
        "{stderr}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Another real client: the official MCP Python SDK (`mcp`, pinned in scripts/python-env.sh).

/// Runs an SDK's check script, which names every failed check on stderr.
async fn run_sdk_checks(what: &str, mut command: tokio::process::Command) -> anyhow::Result<()> {
    let output = try_within(what, command.kill_on_drop(true).output()).await??;
    anyhow::ensure!(
        output.status.success(),
        "{what} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// Runs `checks` (an SDK client's arguments) against `warren mcp` over stdio, then against a
/// real execd's `/mcp` behind `token`.
async fn sdk_checks_over_stdio_and_execd_http(
    token: &str,
    checks: impl AsyncFn(&[&str]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let binary = warren().to_str().expect("utf-8 binary path").to_owned();
    let workdir = dir.path().to_str().expect("utf-8 temp dir").to_owned();
    checks(&["stdio", &binary, &workdir]).await?;

    let execd = ExecdChild::start(token, dir.path()).await?;
    let url = format!("{}/mcp", execd.url);
    checks(&["http", &url, &execd.token]).await?;
    execd.stop().await
}

#[tokio::test]
async fn python_mcp_sdk_uses_the_tools_over_stdio_and_execd_http() -> anyhow::Result<()> {
    let python = python();
    let script = repo_root().join("tests/python/mcp_sdk_client.py");
    sdk_checks_over_stdio_and_execd_http("python-sdk-token", async |args| {
        let mut command = tokio::process::Command::new(&python);
        command.arg(&script).args(args);
        run_sdk_checks("the MCP Python SDK checks", command).await
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// And the official MCP TypeScript SDK (pinned in tests/node/package.json), whose schema
// validation is what strict clients such as Claude Code build on.

#[tokio::test]
async fn typescript_mcp_sdk_uses_the_tools_over_stdio_and_execd_http() -> anyhow::Result<()> {
    let node_dir = tokio::task::spawn_blocking(warren_test_support::node_packages).await?;
    sdk_checks_over_stdio_and_execd_http("typescript-sdk-token", async |args| {
        let mut command = tokio::process::Command::new("node");
        command.arg(node_dir.join("mcp_sdk_client.mjs")).args(args);
        run_sdk_checks("the MCP TypeScript SDK checks", command).await
    })
    .await
}
