//! The `warren` binary: command-line parsing and wiring only. Each subcommand hands its parsed
//! flags to the crate that owns the feature.

mod bench;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "warren", version, about = "A sandbox runtime for AI agents")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the in-sandbox daemon: PTY sessions, exec API, files (default 127.0.0.1:44772).
    Execd(warren_execd::Config),
    /// Run only E2B's envd API (execd's flags; on --e2b-listen, default 127.0.0.1:49983).
    Envd(warren_execd::Config),
    /// Serve the exec tools (exec_command, write_stdin, ...) as an MCP server on stdio.
    Mcp(warren_mcp::McpArgs),
    /// Run the gateway: devices, sessions, event streams, brains and hands.
    Gateway(warren_gateway::GatewayArgs),
    /// The gateway with every default filled in (data in ./warren-data, the built-in agent).
    Serve(warren_gateway::GatewayArgs),
    /// The built-in deterministic ACP agent (speaks ACP on stdio).
    ShellAgent,
    /// Run benchmarks and print a table.
    Bench(bench::BenchArgs),
}

/// Logs go to stderr, filtered by `WARREN_LOG`, else by `default_filter`.
fn init_tracing(default_filter: &str) {
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_env("WARREN_LOG").unwrap_or_else(|_| EnvFilter::new(default_filter));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// Resolves on the first SIGTERM or SIGINT. The handlers are installed at the call, not when
/// the future is first polled, so a signal that arrives just after a daemon printed its
/// address still shuts it down cleanly. Call inside the runtime's context.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let signals = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        let (Ok(mut term), Ok(mut int)) = signals else {
            tracing::error!("cannot install signal handlers; shutdown only by kill -9");
            return std::future::pending().await;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received, shutting down"),
            _ = int.recv() => tracing::info!("SIGINT received, shutting down"),
        }
    }
}

/// `--secrets-fd`: the token and nonce from the pipe the gateway passed, then non-dumpable, so
/// neither `/proc/<execd>/environ` nor its memory or descriptors show them to the commands it
/// runs (which share its uid inside a sandbox).
fn read_secrets(config: &mut warren_execd::Config) -> anyhow::Result<()> {
    let Some(fd) = config.secrets_fd else {
        return Ok(());
    };
    let pipe = warren_process::inherited::take_inherited_fd(fd)?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::fs::File::from(pipe), &mut text)?;
    for line in text.lines().filter(|line| !line.is_empty()) {
        match line.split_once('=') {
            Some(("EXECD_ACCESS_TOKEN", token)) => config.access_token = Some(token.to_string()),
            Some(("WARREN_HANDS_NONCE", nonce)) => config.hands_nonce = Some(nonce.to_string()),
            _ => {
                anyhow::bail!("--secrets-fd: unexpected line (expected NAME=VALUE of a known name)")
            }
        }
    }
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)?;
    Ok(())
}

/// envd's own port, where `warren envd` listens unless `--e2b-listen` says otherwise.
const ENVD_DEFAULT_LISTEN: std::net::SocketAddr =
    std::net::SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 49983);

/// `warren execd` (execd's listener, plus the envd one with `--e2b-listen`) or `warren envd`
/// (`envd_only`: the envd listener alone).
async fn run_execd(mut config: warren_execd::Config, envd_only: bool) -> anyhow::Result<()> {
    read_secrets(&mut config)?;
    if envd_only && config.e2b_listen.is_none() {
        config.e2b_listen = Some(ENVD_DEFAULT_LISTEN);
    }
    // Before anything is bound or started: a refused start leaves nothing behind.
    config.check_unguarded_listeners(!envd_only)?;
    let shutdown = shutdown_signal();
    warren_process::reaper::start()?;
    let mut listens: Vec<String> = config
        .e2b_listen
        .iter()
        .filter(|listen| !listen.ip().is_loopback())
        .map(ToString::to_string)
        .collect();
    if let warren_execd::ListenAddr::Tcp(listen) = &config.listen
        && !envd_only
        && !listen.ip().is_loopback()
    {
        listens.push(listen.to_string());
    }
    // Only `--no-auth` gets this far without a token beyond loopback.
    if config.access_token.is_none() {
        for listen in listens {
            tracing::warn!(
                %listen,
                "listening on a non-loopback address without an access token (--no-auth)"
            );
        }
    }
    let (listener, listening_on) = if envd_only {
        (None, String::new())
    } else {
        let (listener, listening_on) = warren_execd::bind(&config.listen).await?;
        tracing::info!(listen = %listening_on, "warren execd listening");
        (Some(listener), listening_on)
    };
    let e2b_listener = match config.e2b_listen {
        Some(listen) => {
            let listener = tokio::net::TcpListener::bind(listen).await?;
            let local_addr = listener.local_addr()?;
            Some((warren_execd::Listener::from(listener), local_addr))
        }
        None => None,
    };
    // The default state directory follows the port; a Unix socket has none, so it gets a
    // private one like port 0 (pass --state-dir to let the next execd clean up).
    let port = match (&listener, &e2b_listener) {
        (Some(warren_execd::Listener::Tcp(listener)), _) => listener.local_addr()?.port(),
        (None, Some((_, e2b_addr))) => e2b_addr.port(),
        _ => 0,
    };
    let configured = config.state_dir.clone();
    let state = tokio::task::spawn_blocking(move || {
        warren_execd::state::StateDir::claim(configured.as_deref(), port)
    })
    .await??;
    state.start_sweeping();
    for forward in config.forward.clone() {
        warren_execd::forward::start(forward).await?;
    }
    // The first stdout line names the bound address, so a parent that asked for port 0 (the
    // gateway starting hands, tests) learns the real one. Printed once leftovers are stopped.
    if !envd_only {
        println!("warren execd listening on {listening_on}");
    }
    let e2b_listener = e2b_listener.map(|(listener, e2b_addr)| {
        println!("warren envd listening on http://{e2b_addr}");
        listener
    });
    let execd = warren_execd::Execd::new(config);
    warren_execd::serve_listeners(execd, listener, e2b_listener, shutdown).await?;
    drop(state);
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // A benchmark's output is its table; the daemons it runs in process log only problems.
    init_tracing(match cli.command {
        Command::Bench(_) => "warn",
        _ => "info,rmcp=warn",
    });
    let runtime = tokio::runtime::Runtime::new()?;
    let _context = runtime.enter();
    match cli.command {
        Command::Execd(config) => runtime.block_on(run_execd(config, false)),
        Command::Envd(config) => runtime.block_on(run_execd(config, true)),
        Command::Mcp(args) => runtime.block_on(warren_mcp::run(args, shutdown_signal())),
        Command::Gateway(args) | Command::Serve(args) => {
            runtime.block_on(warren_gateway::run(args, shutdown_signal()))
        }
        Command::ShellAgent => runtime.block_on(warren_brain::shell_agent::run()),
        Command::Bench(args) => runtime.block_on(bench::run(args)),
    }
}
