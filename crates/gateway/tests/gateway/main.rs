//! Integration tests of the gateway through its real HTTP API on 127.0.0.1:0, with real reqwest
//! and SSE clients. One test binary; `helpers` starts gateways and reads event streams.

mod auth;
mod cancel;
mod helpers;
mod http_edge;
mod python_agent;
mod recovery;
mod sessions;
mod sse;
mod storage;
mod terminals;
mod turns;
