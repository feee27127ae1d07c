//! `warren bench pty`.

pub async fn run() -> anyhow::Result<()> {
    anyhow::bail!("warren bench pty is not implemented yet")
}
