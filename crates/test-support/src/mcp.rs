//! MCP clients of the exec tools (rmcp's client side, as a real agent uses it), accessors for
//! tool results, and the scenarios every transport passes: `warren mcp` over stdio, the
//! streamable-HTTP service in process, execd's `/mcp`. A scenario takes a connected client (and
//! the directory its commands run in); connecting is the test's business. Every wait has a
//! timeout that names what was expected.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context as _, bail};
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt as _};
use serde_json::{Value, json};

use crate::try_within;

pub type McpClient = RunningService<RoleClient, ()>;

/// An MCP streamable-HTTP client of `url`, sending `X-EXECD-ACCESS-TOKEN: token` if given.
pub async fn http_client(url: &str, token: Option<&str>) -> anyhow::Result<McpClient> {
    let mut headers = HashMap::new();
    if let Some(token) = token {
        headers.insert(
            http::HeaderName::from_static("x-execd-access-token"),
            http::HeaderValue::from_str(token)?,
        );
    }
    let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
    let transport = StreamableHttpClientTransport::from_config(config);
    try_within(
        "the MCP initialize handshake over HTTP",
        ().serve(transport),
    )
    .await?
    .context("MCP initialize over HTTP")
}

/// Calls tool `name` with `arguments` (a JSON object).
pub async fn call(
    client: &McpClient,
    name: &str,
    arguments: Value,
) -> anyhow::Result<CallToolResult> {
    let Value::Object(arguments) = arguments else {
        bail!("arguments must be a JSON object")
    };
    call_raw(client, name, arguments).await
}

/// Calls tool `name` with raw arguments, which may be wrong on purpose.
pub async fn call_raw(
    client: &McpClient,
    name: &str,
    arguments: JsonObject,
) -> anyhow::Result<CallToolResult> {
    let params = CallToolRequestParams::new(name.to_owned()).with_arguments(arguments);
    try_within(&format!("the {name} result"), client.call_tool(params))
        .await?
        .with_context(|| format!("calling {name}"))
}

/// The text content of a result (all text blocks joined).
pub fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|block| block.as_text().map(|text| text.text.as_str()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The structured content of a successful result.
pub fn structured(result: &CallToolResult) -> Value {
    assert_ne!(result.is_error, Some(true), "tool error: {}", text(result));
    result
        .structured_content
        .clone()
        .unwrap_or_else(|| panic!("no structured content: {result:?}"))
}

/// The `session_id` of a result that must still be running.
pub fn session_id(result: &CallToolResult) -> u64 {
    let value = structured(result);
    value["session_id"]
        .as_u64()
        .unwrap_or_else(|| panic!("no session_id in {value}"))
}

/// `exec_command` of `cmd` with the shortest yield (250 ms).
async fn exec_briefly(client: &McpClient, cmd: &str) -> anyhow::Result<CallToolResult> {
    call(
        client,
        "exec_command",
        json!({"cmd": cmd, "yield_time_ms": 250}),
    )
    .await
}

/// `write_stdin` of `chars` to `session`, waiting at most `yield_ms` for output.
async fn write_stdin(
    client: &McpClient,
    session: u64,
    chars: &str,
    yield_ms: u64,
) -> anyhow::Result<CallToolResult> {
    let arguments = json!({"session_id": session, "chars": chars, "yield_time_ms": yield_ms});
    call(client, "write_stdin", arguments).await
}

/// Starts `cmd` with the shortest yield; it must still be running after it.
pub async fn start_running(client: &McpClient, cmd: &str) -> anyhow::Result<u64> {
    let result = exec_briefly(client, cmd).await?;
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
// Scenarios every transport passes.

pub async fn lists_the_four_tools_with_their_schemas(client: &McpClient) -> anyhow::Result<()> {
    let tools = try_within("tools/list", client.list_all_tools()).await??;
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

pub async fn quick_command_returns_codex_text_and_json(client: &McpClient) -> anyhow::Result<()> {
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

pub async fn every_argument_reaches_the_engine(
    client: &McpClient,
    dir: &Path,
) -> anyhow::Result<()> {
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

pub async fn long_command_is_polled_to_its_exit(
    client: &McpClient,
    dir: &Path,
) -> anyhow::Result<()> {
    let flag = dir.join("long-command-flag");
    let cmd = wait_for_flag_cmd(&flag);
    let first = exec_briefly(client, &cmd).await?;
    let value = structured(&first);
    assert_eq!(value["status"], "running", "{value}");
    let session = session_id(&first);
    assert!(text(&first).contains(&format!("Process running with session ID {session}")));

    std::fs::write(&flag, b"")?;
    // An empty poll waits for more output or the exit; collect until the exit is reported.
    let mut output = value["output"].as_str().unwrap_or_default().to_owned();
    loop {
        let poll = write_stdin(client, session, "", 30000).await?;
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

pub async fn prompt_is_answered_with_write_stdin(client: &McpClient) -> anyhow::Result<()> {
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

    let answer = write_stdin(client, session, "bob\n", 10000).await?;
    let value = structured(&answer);
    assert!(
        value["output"]
            .as_str()
            .is_some_and(|o| o.contains("hi bob")),
        "{value}"
    );
    Ok(())
}

pub async fn sessions_are_listed_and_killed(client: &McpClient) -> anyhow::Result<()> {
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

pub async fn bad_arguments_are_tool_errors(client: &McpClient) -> anyhow::Result<()> {
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

/// The `list_sessions` entry matching `pred`; fails naming the listing if there is none.
pub async fn listed_session(
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
pub async fn commands_run_in(client: &McpClient, dir: &Path) -> anyhow::Result<()> {
    let pwd = call(client, "exec_command", json!({"cmd": "pwd -P"})).await?;
    assert_eq!(
        structured(&pwd)["output"],
        format!("{}\n", dir.canonicalize()?.display())
    );
    Ok(())
}
