//! `warren bench compat`.

pub async fn run() -> anyhow::Result<()> {
    anyhow::bail!("warren bench compat is not implemented yet")
}
