//! `warren shell-agent`: the built-in deterministic ACP agent.

pub async fn run() -> anyhow::Result<()> {
    anyhow::bail!("warren shell-agent is not implemented yet")
}
