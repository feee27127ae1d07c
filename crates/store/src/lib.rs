//! What gateway replicas share, on engines that already exist: PostgreSQL for state, events,
//! session leases and admission (`pg`, `events`, `leases`, `admission`, `records`), and
//! S3-compatible object storage for snapshots (`objects`). Nothing here knows HTTP, ACP or the
//! gateway's types: rows are JSON and ids are strings, so the gateway keeps its own model and
//! this crate its engines.

pub mod admission;
pub mod events;
pub mod leases;
pub mod objects;
pub mod pg;
pub mod records;
