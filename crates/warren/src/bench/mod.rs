//! `warren bench <what>`: benchmarks that print one table measured in one run. Targets live
//! here, never in timed unit tests.

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: Bench,
}

#[derive(Debug, clap::Subcommand)]
pub enum Bench {
    /// PTY session throughput, echo latency, viewer fan-out and idle memory.
    Pty,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.what {
        Bench::Pty => anyhow::bail!("not implemented yet"),
    }
}
