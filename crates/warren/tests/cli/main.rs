//! `warren execd` and `warren mcp` run as a user runs them: the real binary as a child process,
//! driven over HTTP, WebSocket and MCP (rmcp's client, the official Python and TypeScript SDKs).
//! One test binary; `support` starts the children.

// Tests start real programs (shells, servers, the binary under test) directly.
#![allow(clippy::disallowed_methods)]

mod execd_leftovers;
mod execd_listen;
mod execd_pty;
mod gateway_credentials;
mod gateway_secrets;
mod mcp;
mod serve_reachable;
mod support;
