//! Everything a gateway keeps, on engines that already exist: the data directory's files
//! (`file`: atomic JSON, the directory's lock, the space probe) and whether they take writes
//! (`health`); device records and session metas on either (`devices`, `session_meta`); PostgreSQL for state, events, session leases and admission shared by replicas
//! (`pg`, `events`, `leases`, `admission`, `records`); and S3-compatible object storage for
//! snapshots (`objects`). Nothing here knows HTTP, ACP or the gateway's types: records are JSON
//! and ids are strings, so the gateway keeps its own model and this crate its engines.

pub mod admission;
pub mod devices;
pub mod event_store;
pub mod events;
pub mod file;
pub mod health;
pub mod leases;
pub mod objects;
pub mod pg;
pub mod records;
pub mod session_meta;
