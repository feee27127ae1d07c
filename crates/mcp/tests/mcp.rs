//! The exec tools through real MCP clients: `warren mcp` over stdio (in-process engine and
//! `--execd` remote form), the streamable-HTTP service in process, and execd's `/mcp` route
//! behind its access token.

// Tests start real programs (shells, servers, the binary under test) directly.
#![allow(clippy::disallowed_methods)]

mod support;

use std::path::Path;

use anyhow::Context as _;
use rmcp::model::JsonObject;
use serde_json::{Value, json};
use support::*;

/// Starts `cmd` with the shortest yield; it must still be running after it.
async fn start_running(client: &McpClient, cmd: &str) -> anyhow::Result<u64> {
    let result = call(
        client,
        "exec_command",
        json!({"cmd": cmd, "yield_time_ms": 250}),
    )
    .await?;
    let value = structured(&result);
    anyhow::ensure!(
        value["status"] == "running",
        "expected running, got {value}"
    );
    Ok(session_id(&result))
}

/// A command that prints `start`, waits until `flag` exists, then prints `done`: long-running
/// for as long as the test wants, with no timing assumptions.
fn wait_for_flag_cmd(flag: &Path) -> String {
    format!(
        "echo start; while [ ! -e '{}' ]; do sleep 0.05; done; echo done",
        flag.display()
    )
}

// ---------------------------------------------------------------------------------------------
// Scenarios shared by every transport.

async fn lists_the_four_tools_with_their_schemas(client: &McpClient) -> anyhow::Result<()> {
    let tools = within("tools/list", client.list_all_tools()).await??;
    let mut names: Vec<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "exec_command",
            "kill_session",
            "list_sessions",
            "write_stdin"
        ]
    );
    let schema = |name: &str| -> Value {
        let tool = tools.iter().find(|tool| tool.name == name).expect("listed");
        assert!(
            tool.description.as_deref().is_some_and(|d| d.len() > 40),
            "{name} description"
        );
        Value::Object(tool.input_schema.as_ref().clone())
    };

    let exec = schema("exec_command");
    assert_eq!(exec["type"], "object");
    assert_eq!(exec["required"], json!(["cmd"]));
    for (field, kind) in [
        ("cmd", "string"),
        ("workdir", "string"),
        ("shell", "string"),
        ("login", "boolean"),
        ("tty", "boolean"),
        ("yield_time_ms", "integer"),
        ("timeout_ms", "integer"),
        ("max_output_tokens", "integer"),
        ("env", "object"),
    ] {
        assert_eq!(
            exec["properties"][field]["type"], kind,
            "exec_command.{field}: {exec}"
        );
    }

    let write = schema("write_stdin");
    assert_eq!(write["required"], json!(["session_id"]));
    assert_eq!(write["properties"]["session_id"]["type"], "integer");
    assert_eq!(write["properties"]["chars"]["type"], "string");
    assert_eq!(write["properties"]["yield_time_ms"]["type"], "integer");
    assert_eq!(write["properties"]["max_output_tokens"]["type"], "integer");

    assert_eq!(schema("list_sessions")["properties"], json!({}));
    assert_eq!(schema("kill_session")["required"], json!(["session_id"]));

    let exec_tool = tools
        .iter()
        .find(|tool| tool.name == "exec_command")
        .expect("listed");
    let output = Value::Object(
        exec_tool
            .output_schema
            .as_deref()
            .expect("output schema")
            .clone(),
    );
    assert!(output["properties"]["chunk_id"].is_object(), "{output}");
    assert!(output["properties"].get("text").is_none(), "{output}");
    Ok(())
}

async fn quick_command_returns_codex_text_and_json(client: &McpClient) -> anyhow::Result<()> {
    let result = call(client, "exec_command", json!({"cmd": "echo hello; exit 3"})).await?;
    let value = structured(&result);
    assert_eq!(value["status"], "exited", "{value}");
    assert_eq!(value["exit_code"], 3, "{value}");
    assert!(value.get("session_id").is_none(), "{value}");
    assert_eq!(value["output"], "hello\n", "{value}");
    assert!(
        value.get("text").is_none(),
        "the text is the text content, not a JSON field"
    );

    let text = text(&result);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("Chunk ID: "), "{text}");
    assert!(
        lines[1].starts_with("Wall time: ") && lines[1].ends_with(" seconds"),
        "{text}"
    );
    assert_eq!(lines[2], "Process exited with code 3", "{text}");
    assert!(lines[3].starts_with("Original token count: "), "{text}");
    assert_eq!(&lines[4..], ["Output:", "hello"], "{text}");
    Ok(())
}

async fn every_argument_reaches_the_engine(client: &McpClient, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir.join("sub"))?;
    let result = call(
        client,
        "exec_command",
        json!({"cmd": "echo \"$GREETING\"; pwd -P; tty", "env": {"GREETING": "hi there"},
               "workdir": "sub", "tty": true, "login": false, "shell": "bash",
               "max_output_tokens": 1000}),
    )
    .await?;
    let value = structured(&result);
    let output = value["output"]
        .as_str()
        .unwrap_or_default()
        .replace('\r', "");
    let sub = dir.canonicalize()?.join("sub");
    let mut lines = output.lines();
    assert_eq!(lines.next(), Some("hi there"), "{value}");
    assert_eq!(lines.next(), Some(sub.to_str().expect("utf-8")), "{value}");
    assert!(
        lines.next().is_some_and(|tty| tty.starts_with("/dev/pts/")),
        "{value}"
    );

    let timed_out = call(
        client,
        "exec_command",
        json!({"cmd": "sleep 30", "timeout_ms": 300}),
    )
    .await?;
    let value = structured(&timed_out);
    assert_eq!(value["status"], "exited", "{value}");
    assert_eq!(value["exit_code"], 124, "{value}");
    Ok(())
}

async fn long_command_is_polled_to_its_exit(client: &McpClient, dir: &Path) -> anyhow::Result<()> {
    let flag = dir.join("long-command-flag");
    let cmd = wait_for_flag_cmd(&flag);
    let first = call(
        client,
        "exec_command",
        json!({"cmd": cmd, "yield_time_ms": 250}),
    )
    .await?;
    let value = structured(&first);
    assert_eq!(value["status"], "running", "{value}");
    let session = session_id(&first);
    assert!(text(&first).contains(&format!("Process running with session ID {session}")));

    std::fs::write(&flag, b"")?;
    // An empty poll waits for more output or the exit; collect until the exit is reported.
    let mut output = value["output"].as_str().unwrap_or_default().to_owned();
    loop {
        let poll = call(
            client,
            "write_stdin",
            json!({"session_id": session, "chars": "", "yield_time_ms": 30000}),
        )
        .await?;
        let value = structured(&poll);
        output.push_str(value["output"].as_str().unwrap_or_default());
        if value["status"] == "exited" {
            assert_eq!(value["exit_code"], 0, "{value}");
            break;
        }
    }
    assert_eq!(output, "start\ndone\n");

    // The exit was reported: the id is gone.
    let again = call(client, "write_stdin", json!({"session_id": session})).await?;
    assert_eq!(again.is_error, Some(true));
    assert_eq!(
        text(&again),
        format!("write_stdin failed: Unknown process id {session}")
    );
    Ok(())
}

async fn prompt_is_answered_with_write_stdin(client: &McpClient) -> anyhow::Result<()> {
    let cmd = r#"printf 'Name? '; read -r name; echo "hi $name""#;
    let first = call(client, "exec_command", json!({"cmd": cmd})).await?;
    let value = structured(&first);
    assert_eq!(value["status"], "awaiting_input", "{value}");
    assert!(
        text(&first).contains("Process is waiting for input"),
        "{}",
        text(&first)
    );
    let session = session_id(&first);

    let answer = call(
        client,
        "write_stdin",
        json!({"session_id": session, "chars": "bob\n", "yield_time_ms": 10000}),
    )
    .await?;
    let value = structured(&answer);
    assert!(
        value["output"]
            .as_str()
            .is_some_and(|o| o.contains("hi bob")),
        "{value}"
    );
    Ok(())
}

async fn sessions_are_listed_and_killed(client: &McpClient) -> anyhow::Result<()> {
    let session = start_running(client, "sleep 600").await?;

    let entry = listed_session(client, |s| s["session_id"] == session).await?;
    let listed = call(client, "list_sessions", json!({})).await?;
    assert_eq!(entry["cmd"], "sleep 600");
    assert_eq!(entry["status"], "running");
    assert!(entry["pid"].as_u64().is_some_and(|pid| pid > 0), "{entry}");
    assert!(
        text(&listed).contains(&format!("Session {session}: running")),
        "{}",
        text(&listed)
    );

    let killed = call(client, "kill_session", json!({"session_id": session})).await?;
    let value = structured(&killed);
    assert_eq!(value["status"], "exited", "{value}");
    assert!(
        value["exit_code"].as_i64().is_some_and(|code| code != 0),
        "{value}"
    );
    assert!(
        text(&killed).contains("Process exited with code"),
        "{}",
        text(&killed)
    );

    let listed = call(client, "list_sessions", json!({})).await?;
    let sessions = structured(&listed)["sessions"].clone();
    assert!(
        !sessions
            .as_array()
            .is_some_and(|all| all.iter().any(|s| s["session_id"] == session)),
        "killed session {session} still listed: {sessions}"
    );
    Ok(())
}

async fn bad_arguments_are_tool_errors(client: &McpClient) -> anyhow::Result<()> {
    let expect_error = |result: rmcp::model::CallToolResult, needles: &[&str]| {
        assert_eq!(result.is_error, Some(true), "{result:?}");
        let text = text(&result);
        for needle in needles {
            assert!(text.contains(needle), "{needle:?} not in {text:?}");
        }
    };
    let no_args = call_raw(client, "exec_command", JsonObject::new()).await?;
    expect_error(no_args, &["exec_command failed", "missing field `cmd`"]);

    let wrong_type = call(
        client,
        "exec_command",
        json!({"cmd": "true", "yield_time_ms": "soon"}),
    )
    .await?;
    expect_error(
        wrong_type,
        &["exec_command failed", "invalid type", "string \"soon\""],
    );

    let cmd_not_string = call(client, "exec_command", json!({"cmd": 42})).await?;
    expect_error(cmd_not_string, &["invalid type: integer `42`"]);

    let id_not_number = call(client, "write_stdin", json!({"session_id": "abc"})).await?;
    expect_error(id_not_number, &["write_stdin failed", "invalid type"]);

    let unknown = call(
        client,
        "write_stdin",
        json!({"session_id": 1, "chars": "x"}),
    )
    .await?;
    assert_eq!(unknown.is_error, Some(true));
    assert_eq!(text(&unknown), "write_stdin failed: Unknown process id 1");

    let unknown_kill = call(client, "kill_session", json!({"session_id": 1})).await?;
    assert_eq!(
        text(&unknown_kill),
        "kill_session failed: Unknown process id 1"
    );

    let bad_workdir = call(
        client,
        "exec_command",
        json!({"cmd": "true", "workdir": "/no/such/dir"}),
    )
    .await?;
    expect_error(bad_workdir, &["exec_command failed", "/no/such/dir"]);

    let no_such_tool = call(client, "rm_rf", json!({})).await;
    assert!(
        no_such_tool.is_err(),
        "an unknown tool is a protocol error: {no_such_tool:?}"
    );
    Ok(())
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
        waited = within("the command to start", until_exists(&started)) => waited?,
    }
    let session = listed_session(client, |s| s["cmd"] == cmd).await?;
    let session = session["session_id"]
        .as_u64()
        .unwrap_or_else(|| panic!("the cancelled call's session has no id: {session}"));
    let killed = call(client, "kill_session", json!({"session_id": session})).await?;
    assert_eq!(structured(&killed)["status"], "exited");
    Ok(())
}

/// Polls every 20 ms until `path` exists (wrap in `within` for the timeout).
async fn until_exists(path: &Path) {
    while !path.exists() {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The `list_sessions` entry matching `pred`; fails naming the listing if there is none.
async fn listed_session(
    client: &McpClient,
    pred: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let listed = call(client, "list_sessions", json!({})).await?;
    let sessions = structured(&listed)["sessions"].clone();
    sessions
        .as_array()
        .and_then(|all| all.iter().find(|s| pred(s)))
        .cloned()
        .with_context(|| format!("the session is not listed: {sessions}"))
}

/// Commands run in `dir` by default.
async fn commands_run_in(client: &McpClient, dir: &Path) -> anyhow::Result<()> {
    let pwd = call(client, "exec_command", json!({"cmd": "pwd -P"})).await?;
    assert_eq!(
        structured(&pwd)["output"],
        format!("{}\n", dir.canonicalize()?.display())
    );
    Ok(())
}

#[tokio::test]
async fn stdio_client_disconnect_kills_running_commands() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let client = local_stdio_client(dir.path()).await?;
    let session = start_running(&client, "sleep 600").await?;
    let entry = listed_session(&client, |s| s["session_id"] == session).await?;
    let pid = entry["pid"].as_u64().expect("listed with a pid");
    // Closing stdin ends `warren mcp`, which kills the sessions it started.
    within("warren mcp to exit after stdin closes", client.cancel()).await??;
    let proc_dir = format!("/proc/{pid}");
    within("the session's process to be gone", async {
        while Path::new(&proc_dir).exists() && !is_zombie(&proc_dir) {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await?;
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
    let proc_dir = format!("/proc/{pid}");
    within("the session's process to be gone after SIGTERM", async {
        while Path::new(&proc_dir).exists() && !is_zombie(&proc_dir) {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await?;
    drop(client);
    Ok(())
}

fn is_zombie(proc_dir: &str) -> bool {
    std::fs::read_to_string(format!("{proc_dir}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

// ---------------------------------------------------------------------------------------------
// Streamable HTTP: the service execd mounts, served in process.

async fn serve_in_process(
    allowed_hosts: warren_mcp::AllowedHosts,
    dir: &Path,
) -> anyhow::Result<(String, tokio_util::sync::CancellationToken)> {
    let config = warren_exec::EngineConfig {
        default_workdir: dir.to_path_buf(),
        log_dir: dir.join("logs"),
        ..Default::default()
    };
    let engine = warren_exec::Engine::new(config);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let service = warren_mcp::streamable_http_service(engine, allowed_hosts, shutdown.clone());
    let router = axum::Router::new().route_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/mcp", listener.local_addr()?);
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
    });
    Ok((url, shutdown))
}

#[tokio::test]
async fn http_service_serves_the_tools() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (url, shutdown) =
        serve_in_process(warren_mcp::AllowedHosts::Only(Vec::new()), dir.path()).await?;
    let client = http_client(&url, None).await?;
    lists_the_four_tools_with_their_schemas(&client).await?;
    quick_command_returns_codex_text_and_json(&client).await?;
    every_argument_reaches_the_engine(&client, dir.path()).await?;
    long_command_is_polled_to_its_exit(&client, dir.path()).await?;
    sessions_are_listed_and_killed(&client).await?;
    bad_arguments_are_tool_errors(&client).await?;
    client.cancel().await?;
    shutdown.cancel();
    Ok(())
}

#[tokio::test]
async fn http_service_rejects_hosts_not_allowed() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (url, shutdown) = serve_in_process(
        warren_mcp::AllowedHosts::Only(vec!["sandbox.internal".into()]),
        dir.path(),
    )
    .await?;
    let initialize = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "1"}}
    });
    let post = |host: &'static str| {
        reqwest::Client::new()
            .post(&url)
            .header("Host", host)
            .header("Accept", "application/json, text/event-stream")
            .json(&initialize)
            .send()
    };
    let evil = within("the answer to a foreign Host", post("evil.example")).await??;
    assert_eq!(evil.status(), reqwest::StatusCode::FORBIDDEN);
    let allowed = within("the answer to an allowed Host", post("sandbox.internal")).await??;
    assert_eq!(allowed.status(), reqwest::StatusCode::OK);
    shutdown.cancel();
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
            within("the answer to an unauthenticated POST /mcp", request.send()).await??;
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
    within("the first warren mcp to exit", first.cancel()).await??;
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
    let output = within(
        "warren mcp to exit on a bad --execd",
        tokio::process::Command::new(warren_binary())
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

/// The interoperability venv's python, created once by `scripts/python-env.sh`.
async fn sdk_python() -> anyhow::Result<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/python-env.sh");
    let mut command = tokio::process::Command::new("bash");
    command.arg(&script);
    let stdout = install_sdk("scripts/python-env.sh", command).await?;
    Ok(String::from_utf8(stdout)?.trim().to_owned())
}

/// Runs a one-off SDK installation (minutes on a cold cache); returns its stdout.
async fn install_sdk(what: &str, mut command: tokio::process::Command) -> anyhow::Result<Vec<u8>> {
    let output = tokio::time::timeout(
        std::time::Duration::from_secs(900),
        command.kill_on_drop(true).output(),
    )
    .await
    .map_err(|_| anyhow::anyhow!("{what} did not finish within 15 minutes"))??;
    anyhow::ensure!(
        output.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(output.stdout)
}

/// Runs an SDK's check script, which names every failed check on stderr.
async fn run_sdk_checks(what: &str, mut command: tokio::process::Command) -> anyhow::Result<()> {
    let output = within(what, command.kill_on_drop(true).output()).await??;
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
    let binary = warren_binary()
        .to_str()
        .expect("utf-8 binary path")
        .to_owned();
    let workdir = dir.path().to_str().expect("utf-8 temp dir").to_owned();
    checks(&["stdio", &binary, &workdir]).await?;

    let execd = ExecdChild::start(token, dir.path()).await?;
    let url = format!("{}/mcp", execd.url);
    checks(&["http", &url, &execd.token]).await?;
    execd.stop().await
}

#[tokio::test]
async fn python_mcp_sdk_uses_the_tools_over_stdio_and_execd_http() -> anyhow::Result<()> {
    let python = sdk_python().await?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/mcp_sdk_client.py");
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

/// A directory with the pinned SDK installed (once, under a lock) and the check script copied in.
async fn sdk_node_dir() -> anyhow::Result<std::path::PathBuf> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/warren-mcp-node");
    std::fs::create_dir_all(&dir)?;
    // Serialised with flock so parallel test processes install once; the stamp holds the
    // package.json and lock it was installed from, so a change to either reinstalls.
    let install = r#"
        set -euo pipefail
        exec 9>"$1/.lock"
        flock 9
        cat "$2/package.json" "$2/package-lock.json" > "$1/.wanted"
        if ! cmp -s "$1/.wanted" "$1/.installed"; then
          cp "$2/package.json" "$2/package-lock.json" "$1/"
          (cd "$1" && npm ci --no-audit --no-fund --silent >&2)
          mv "$1/.wanted" "$1/.installed"
        fi
        cp "$2/mcp_sdk_client.mjs" "$1/mcp_sdk_client.mjs.tmp"
        mv "$1/mcp_sdk_client.mjs.tmp" "$1/mcp_sdk_client.mjs"
    "#;
    let mut command = tokio::process::Command::new("bash");
    command
        .args(["-c", install, "install"])
        .arg(&dir)
        .arg(&source);
    install_sdk("npm install of the MCP TypeScript SDK", command).await?;
    Ok(dir)
}

#[tokio::test]
async fn typescript_mcp_sdk_uses_the_tools_over_stdio_and_execd_http() -> anyhow::Result<()> {
    let node_dir = sdk_node_dir().await?;
    sdk_checks_over_stdio_and_execd_http("typescript-sdk-token", async |args| {
        let mut command = tokio::process::Command::new("node");
        command.arg(node_dir.join("mcp_sdk_client.mjs")).args(args);
        run_sdk_checks("the MCP TypeScript SDK checks", command).await
    })
    .await
}
