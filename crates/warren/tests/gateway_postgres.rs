//! The gateway suite of tests/gateway/ again, with every gateway on the PostgreSQL store: each
//! test's gateway gets a database of its own on one shared PostgreSQL server (the helpers pick it
//! by this binary's name), so both stores are held to the same semantics. Tests of the file
//! store's own files say so and do nothing here.

// Tests start real programs (shells, servers, the binary under test) directly.
#![allow(clippy::disallowed_methods)]

#[path = "gateway/main.rs"]
mod suite;
