//! warren-mcp.
