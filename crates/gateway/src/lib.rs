//! The gateway: devices, sessions, the event log, brains and hands.

pub mod hands;

/// `warren gateway` / `warren serve` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct GatewayArgs {}

pub async fn run(
    _args: GatewayArgs,
    _shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    anyhow::bail!("warren gateway is not implemented yet")
}
