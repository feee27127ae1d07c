//! The MCP server for Warren's exec tools.

/// `warren mcp` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct McpArgs {}

pub async fn run(_args: McpArgs) -> anyhow::Result<()> {
    anyhow::bail!("warren mcp is not implemented yet")
}
