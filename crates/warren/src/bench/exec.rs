//! `warren bench exec`.

pub async fn run() -> anyhow::Result<()> {
    anyhow::bail!("warren bench exec is not implemented yet")
}
