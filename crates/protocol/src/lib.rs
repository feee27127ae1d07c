//! Wire types shared by Warren's servers and clients: PTY frames, exec arguments and results,
//! execd's file listings and change feed, OpenSandbox-compatible bodies, gateway events, the
//! hands' identity and restore answers, and the common error body.
//!
//! This crate holds data shapes only (serde derives and small constructors); it knows nothing
//! about HTTP, processes or storage.

pub mod error;
pub mod exec;
pub mod files;
pub mod gateway;
pub mod hands;
pub mod opensandbox;
pub mod pty;
pub mod terminal;
