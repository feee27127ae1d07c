//! `warren bench <what>`: benchmarks that print one table measured in one run. Targets live
//! here, never in timed unit tests. Each benchmark is its own module.

mod agents;
mod checkpoints;
mod compat;
mod e2b;
mod event_store;
mod exec;
mod gateway;
mod hands;
mod load;
mod network;
mod phone;
mod pty;
mod push;
mod support;
mod window;

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: Bench,
}

#[derive(Debug, clap::Subcommand)]
pub enum Bench {
    /// PTY session throughput, echo latency, viewer fan-out and idle memory.
    Pty,
    /// exec_command overhead, pipeline throughput and daemon memory under load.
    Exec,
    /// OpenSandbox-compatible command round trips.
    Compat,
    /// Warm-brain handout, first-event latency, SSE fan-out and event-log append rate;
    /// `--store postgres://…` adds the PostgreSQL event log's figures (two replicas).
    Gateway(gateway::GatewayBenchArgs),
    /// Hands lifecycle: create, first tool call, pause/resume, snapshot/restore, archive, RSS.
    Hands,
    /// Model proxy overhead (TTFT, total, 32 streams) and brain start in the hands / warm.
    Agents,
    /// Files, terminals and previews through the gateway vs direct.
    Window,
    /// The e2b Python SDK against Warren's envd API (and `--against URL`).
    E2b(e2b::E2bArgs),
    /// The hands' egress proxy: a 64 MiB download, request latency and CONNECT set-up through it
    /// vs direct, its memory with 200 open tunnels; and small HTTPS requests and new tunnels
    /// direct, through an opaque tunnel and through one that sets a credential.
    Network,
    /// Under load: 1,000 PTY sessions, 200 concurrent exec calls, 1,000 slow-header
    /// connections, SSE to 1,000 readers; `--soak 30m` prints the servers' RSS over time.
    Load(load::LoadArgs),
    /// Web Push: latency from an event to its push received and decrypted by a strict local
    /// push service (p50, p95), and throughput with 16 subscriptions.
    Push,
    /// The checkpoint store on a 1 GiB, 20,000-file workspace: first checkpoint, 100 turns of
    /// 1 MiB (time, bytes stored, total against one copy), restore, rewind and collection;
    /// `--s3 s3://…` adds a bucket's figures.
    Checkpoints(checkpoints::CheckpointsArgs),
    /// The console's first load on a phone's slow link (400 ms, 400 kbit/s): bytes, first
    /// paint and time to interactive, cold and with the service worker.
    Phone(phone::PhoneArgs),
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.what {
        Bench::Pty => pty::run().await,
        Bench::Exec => exec::run().await,
        Bench::Compat => compat::run().await,
        Bench::Gateway(args) => gateway::run(args).await,
        Bench::Hands => hands::run().await,
        Bench::Agents => agents::run().await,
        Bench::Window => window::run().await,
        Bench::E2b(args) => e2b::run(args).await,
        Bench::Load(args) => load::run(args).await,
        Bench::Network => network::run().await,
        Bench::Push => push::run().await,
        Bench::Phone(args) => phone::run(args).await,
        Bench::Checkpoints(args) => checkpoints::run(args).await,
    }
}
