//! Helpers for the MCP integration tests: the built `warren` binary, MCP clients over stdio and
//! streamable HTTP (rmcp's client side, as a real agent would use), a `warren execd` child, and
//! small accessors for tool results. Every wait has a timeout that names what was expected.

// Tests start real programs (shells, servers, the binary under test) directly.
#![allow(clippy::disallowed_methods)]
#![allow(dead_code)]

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context as _, bail};
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt as _};
use serde_json::Value;
use tokio::io::AsyncBufReadExt as _;

pub type McpClient = RunningService<RoleClient, ()>;

/// Generous: the machine running the tests may be loaded.
pub const WAIT: Duration = Duration::from_secs(60);

/// Awaits `future` for at most [`WAIT`]; the error names `what`.
pub async fn within<T>(what: &str, future: impl Future<Output = T>) -> anyhow::Result<T> {
    tokio::time::timeout(WAIT, future)
        .await
        .with_context(|| format!("timed out after {WAIT:?} waiting for {what}"))
}

/// The `warren` binary, built (or found fresh) once per test process with
/// `cargo build -p warren`. Cargo does not build other packages' binaries for a test, and this
/// way the tests never run a stale one.
pub fn warren_binary() -> &'static PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| match build_warren() {
        Ok(path) => path,
        Err(error) => panic!("cannot build the warren binary: {error:#}"),
    })
}

fn build_warren() -> anyhow::Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let output = std::process::Command::new(&cargo)
        .args([
            "build",
            "-p",
            "warren",
            "--bin",
            "warren",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(&workspace)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {cargo} build -p warren"))?;
    if !output.status.success() {
        bail!("`cargo build -p warren` failed ({})", output.status);
    }
    // The artifact message names the executable wherever the target directory is.
    let stdout = String::from_utf8_lossy(&output.stdout);
    for line in stdout.lines() {
        let Ok(message) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if message["reason"] == "compiler-artifact"
            && message["target"]["name"] == "warren"
            && let Some(path) = message["executable"].as_str()
        {
            return Ok(PathBuf::from(path));
        }
    }
    bail!("`cargo build -p warren` reported no warren executable")
}

/// `warren mcp <args>` as a child process, with an MCP client on its stdio.
pub async fn stdio_client(args: &[&str]) -> anyhow::Result<McpClient> {
    stdio_client_with_env(args, &[]).await
}

/// `warren mcp <args>` with `env` added to its environment.
pub async fn stdio_client_with_env(
    args: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<McpClient> {
    let mut command = tokio::process::Command::new(warren_binary());
    command
        .arg("mcp")
        .args(args)
        .env_remove("WARREN_EXECD_TOKEN")
        .envs(env.iter().copied())
        .env("WARREN_LOG", "warn");
    let transport = TokioChildProcess::new(command).context("spawning warren mcp")?;
    within(
        "the MCP initialize handshake over stdio",
        ().serve(transport),
    )
    .await?
    .context("MCP initialize over stdio")
}

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
    within(
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
    within(&format!("the {name} result"), client.call_tool(params))
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

/// A `warren execd` child on 127.0.0.1:0 with an access token; stopped with SIGTERM.
pub struct ExecdChild {
    child: tokio::process::Child,
    pub url: String,
    pub token: String,
}

impl ExecdChild {
    pub async fn start(token: &str, workdir: &std::path::Path) -> anyhow::Result<Self> {
        let mut child = tokio::process::Command::new(warren_binary())
            .args(["execd", "--listen", "127.0.0.1:0", "--access-token", token])
            .arg("--root")
            .arg(workdir)
            .env("WARREN_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("spawning warren execd")?;
        let stdout = child.stdout.take().context("execd stdout")?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let line = within("execd's `listening on` line", lines.next_line())
            .await??
            .context("execd exited before printing its address")?;
        let url = line
            .rsplit_once(' ')
            .map(|(_, url)| url.to_owned())
            .filter(|url| url.starts_with("http://"))
            .with_context(|| format!("unexpected first line from execd: {line}"))?;
        Ok(Self {
            child,
            url,
            token: token.to_owned(),
        })
    }

    /// SIGTERM, then wait for execd to kill its sessions and exit.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let pid = self.child.id().context("execd already reaped")?;
        let pid = rustix::process::Pid::from_raw(pid as i32).context("pid 0")?;
        rustix::process::kill_process(pid, rustix::process::Signal::TERM)?;
        let status = within("execd to exit after SIGTERM", self.child.wait()).await??;
        anyhow::ensure!(status.success(), "execd exited with {status}");
        Ok(())
    }
}
