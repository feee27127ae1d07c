//! The exec tools' streamable-HTTP service (the one execd mounts at `/mcp`), served in process
//! and used through rmcp's real MCP client: the scenarios every transport passes (in
//! `warren_test_support::mcp`), and its refusal of Hosts not allowed. `warren mcp` and execd's
//! `/mcp` are tested against the real binary in `crates/warren/tests/cli`.

// Tests start real programs (shells, servers, the binary under test) directly.
#![allow(clippy::disallowed_methods)]

use std::path::Path;

use serde_json::json;
use warren_test_support::mcp::*;
use warren_test_support::try_within;

/// Serves the MCP service of a fresh engine working in `dir` on 127.0.0.1:0; returns its URL and
/// the token that shuts it down.
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
    let evil = try_within("the answer to a foreign Host", post("evil.example")).await??;
    assert_eq!(evil.status(), reqwest::StatusCode::FORBIDDEN);
    let allowed = try_within("the answer to an allowed Host", post("sandbox.internal")).await??;
    assert_eq!(allowed.status(), reqwest::StatusCode::OK);
    shutdown.cancel();
    Ok(())
}
