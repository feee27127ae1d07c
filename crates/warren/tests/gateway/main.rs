//! Integration tests of the gateway through its real HTTP API on 127.0.0.1:0, with real reqwest
//! and SSE clients, and of its hands: real `warren execd` children of the `warren` binary this
//! package builds. One test binary; `helpers` starts gateways and reads event streams.

// Tests start real programs (shells, servers, the binary under test) directly.
#![allow(clippy::disallowed_methods)]

mod auth;
mod brain_in_hands;
mod cancel;
mod checkpoints;
mod console;
mod console_browser;
mod console_js;
mod credentials;
mod engine;
mod hands;
mod helpers;
mod http_edge;
mod lifecycle;
mod model_proxy;
mod network;
mod openapi;
mod pairing;
mod preview_hosts;
mod previews;
mod push;
mod python_agent;
mod real_agents;
mod recovery;
mod remote_netns;
mod replicas;
mod sandbox;
mod sessions;
mod snapshots_s3;
mod sse;
mod storage;
mod store_faults;
mod terminals;
mod turns;
mod window_files;
mod window_terminals;
