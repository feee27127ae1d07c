//! The MCP server for Warren's exec tools: `exec_command`, `write_stdin`, `list_sessions` and
//! `kill_session`, with the semantics of `docs/exec-tools.md`.
//!
//! Two transports: `warren mcp` serves the tools on stdio ([`run`]), backed by an in-process
//! engine or, with `--execd URL`, by a remote `warren execd`; and execd serves them over
//! streamable HTTP at `/mcp` ([`http::streamable_http_service`]). The tools themselves live in
//! [`tools`], the choice of engine in [`backend`]. This crate spawns nothing itself: processes
//! are the engine's business.

pub mod backend;
pub mod http;
pub mod schema;
pub mod tools;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use rmcp::ServiceExt as _;

pub use backend::{BackendError, ExecBackend, RemoteExecd};
pub use http::{AllowedHosts, McpHttpService, streamable_http_service};
pub use tools::ExecTools;

/// `warren mcp` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct McpArgs {
    /// Run commands on this remote `warren execd` (e.g. http://10.0.0.5:44772, or
    /// unix:/path/to/execd.sock) instead of on this machine.
    #[arg(long, value_name = "URL")]
    pub execd: Option<String>,

    /// The remote execd's access token (sent as X-EXECD-ACCESS-TOKEN).
    #[arg(long, env = "WARREN_EXECD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// Default working directory for commands run on this machine (default: the current one).
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<PathBuf>,

    /// Environment variables passed to local commands even though their names look like
    /// secrets.
    #[arg(long, value_delimiter = ',')]
    pub pass_env: Vec<String>,
}

/// Serves the exec tools on stdin/stdout until the client disconnects or `shutdown` resolves
/// (the binary passes SIGTERM/SIGINT), then kills every process the local engine started.
pub async fn run(
    args: McpArgs,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let (backend, engine) = match &args.execd {
        Some(url) => {
            if args.workdir.is_some() || !args.pass_env.is_empty() {
                tracing::warn!(
                    "--workdir and --pass-env apply to local commands; with --execd the daemon's own settings apply"
                );
            }
            let remote = RemoteExecd::new(url, args.token.clone())?;
            tracing::info!(
                execd = remote.base_url(),
                "warren mcp: commands run on a remote execd"
            );
            (ExecBackend::Remote(remote), None)
        }
        None => {
            if args.token.is_some() {
                tracing::warn!("--token is only used with --execd; ignoring it");
            }
            // This process owns every command it starts, and their orphans.
            warren_process::reaper::start().context("cannot become a child subreaper")?;
            let engine = local_engine(&args)?;
            tracing::info!("warren mcp: commands run on this machine");
            (ExecBackend::Local(engine.clone()), Some(engine))
        }
    };
    let service = ExecTools::new(backend)
        .serve(rmcp::transport::stdio())
        .await
        .context("MCP initialization over stdio failed")?;
    tokio::select! {
        quit = service.waiting() => {
            tracing::info!(reason = ?quit, "MCP client disconnected");
        }
        () = shutdown => {}
    }
    if let Some(engine) = engine {
        engine.shutdown().await;
    }
    Ok(())
}

fn local_engine(args: &McpArgs) -> anyhow::Result<Arc<warren_exec::Engine>> {
    let default_workdir = match &args.workdir {
        Some(dir) => dir.clone(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    anyhow::ensure!(
        default_workdir.is_dir(),
        "--workdir {} is not a directory",
        default_workdir.display()
    );
    let config = warren_exec::EngineConfig {
        default_workdir,
        pass_env: args.pass_env.clone(),
        ..Default::default()
    };
    Ok(warren_exec::Engine::new(config))
}
