//! execd's routes against a real execd on 127.0.0.1:0 in this process, with real HTTP and
//! WebSocket clients: PTY sessions (`pty`), and the OpenSandbox-compatible commands, bash
//! sessions and files (`opensandbox_*`), also driven by the OpenSandbox Python SDK, Warren's
//! file routes and change feed (`files_api`), and workspace
//! snapshots with the hands' identity (`workspace`, also on Unix sockets), the OpenAPI
//! document kept true to the router (`openapi`), and the `Host` and `Origin` guard of execd's
//! and envd's listeners (`origin_guard`). One test
//! binary; `/v1/exec` has its own (`tests/exec.rs`), as it runs the daemon's reaper, which
//! would take the exit statuses of the children other tests wait for.

// Tests start real programs (shells, servers, the binary under test) directly.
#![allow(clippy::disallowed_methods)]

#[path = "../support/client_answers.rs"]
mod client_answers;
mod files_api;
mod http_edge;
#[path = "../support/loopback.rs"]
mod loopback;
mod openapi;
mod opensandbox_commands;
mod opensandbox_files;
mod opensandbox_sdk;
mod opensandbox_support;
mod origin_guard;
mod proxy;
mod pty;
mod pty_support;
#[path = "../support/sdk_script.rs"]
mod sdk_script;
mod workspace;
