//! What Warren's test suites share: bounded waits ([`within`], [`eventually`] and kin), whether
//! a process still runs ([`alive`], from /proc) and the first line it prints ([`first_line`]),
//! the files beneath a directory ([`files_under`]), raw TCP ([`connect`],
//! [`read_until_closed`]), the repository root and its pinned Python environment
//! ([`repo_root`], [`python`]), peak-memory checks ([`peak_memory`]) and, behind features, the
//! client of execd's PTY sessions (`pty`) and MCP clients with the scenarios every transport of
//! the exec tools passes (`mcp`), and the real PostgreSQL and S3 servers the scale-out tests run
//! on (`services`), a test CA with a real HTTPS server, echoing or serving git (`tls`), and a
//! local Web Push service that checks VAPID and decrypts what it takes (`push`).
//!
//! A dev-dependency only, and it depends on no Warren crate but `warren-process` (whose reaper
//! its children register with, so a test binary that is a subreaper never takes their exit
//! status): every other crate's tests can use it without a cycle, and no shipped code can. It starts no Warren server and no `warren` binary;
//! each suite starts the real thing it tests its own way.

// A dev-dependency only: tests start real programs (shells, servers, the binary under test).
#![allow(clippy::disallowed_methods)]

mod environment;
mod files;
mod net;
pub mod peak_memory;
mod process;
mod wait;

#[cfg(feature = "mcp")]
pub mod mcp;
#[cfg(feature = "pty")]
pub mod pty;
#[cfg(feature = "push")]
pub mod push_service;
#[cfg(feature = "services")]
pub mod services;
#[cfg(feature = "tls")]
pub mod tls;

pub use environment::{node_packages, python, repo_root, validate_openapi};
pub use files::files_under;
pub use net::{connect, read_until_closed};
pub use process::{
    alive, first_line, processes_mentioning, spawn_owned, status_owned, wait_until_dead,
};
pub use wait::{
    Done, TimedOut, WAIT, eventually, eventually_async, try_within, wait_until, within,
};
