//! `warren execd` and `warren mcp` run as a user runs them: the real binary as a child process,
//! driven over HTTP, WebSocket and MCP (rmcp's client, the official Python and TypeScript SDKs).
//! One test binary; `support` starts the children.

mod execd_leftovers;
mod execd_pty;
mod mcp;
mod support;
