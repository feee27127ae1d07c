//! `warren bench gateway`.

pub async fn run() -> anyhow::Result<()> {
    anyhow::bail!("warren bench gateway is not implemented yet")
}
