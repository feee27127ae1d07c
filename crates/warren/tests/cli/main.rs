//! `warren execd` run as a user runs it: the real binary as a child process, driven over HTTP
//! and WebSocket. One test binary; `support` starts the children.

mod execd_leftovers;
mod execd_pty;
mod support;
