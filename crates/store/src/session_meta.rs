//! Where one session's meta (the gateway's JSON) is kept, chosen when the session is opened:
//! `meta.json` in its directory, or its row of the `sessions` table. [`MetaStore`] saves it and
//! reads back what another replica stored, so the session never asks which one it has.

use std::path::PathBuf;

use serde_json::Value;

use crate::file;
use crate::pg::{Store, StoreError};

/// One session's meta, in a file or in its PostgreSQL row.
#[derive(Clone)]
pub enum MetaStore {
    /// `meta.json` at this path, written atomically.
    File(PathBuf),
    /// The `sessions` row of the session `id`.
    Postgres { store: Store, id: String },
}

/// What [`MetaStore::reload`] found.
#[derive(Debug, PartialEq)]
pub enum Reloaded {
    /// Only this gateway writes the meta (a file): what it holds is current.
    Current,
    /// The meta as last stored (by whichever replica owned the session).
    Stored(Value),
    /// The session's row is gone (deleted on another replica).
    Gone,
}

impl MetaStore {
    /// Stores `meta`: the file replaced atomically (off the async workers), or the row updated
    /// (a row that is gone belongs to a session being deleted: nothing to keep).
    pub async fn save(&self, meta: Value) -> Result<(), StoreError> {
        match self {
            MetaStore::File(path) => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || file::write_json_atomic(&path, &meta))
                    .await
                    .map_err(|e| StoreError::Unavailable(e.to_string()))??;
            }
            MetaStore::Postgres { store, id } => {
                store.update_session_meta(id, &meta).await?;
            }
        }
        Ok(())
    }

    /// The meta another replica may have stored since this one last read it.
    pub async fn reload(&self) -> Result<Reloaded, StoreError> {
        match self {
            MetaStore::File(_) => Ok(Reloaded::Current),
            MetaStore::Postgres { store, id } => Ok(match store.session_meta(id).await? {
                Some(meta) => Reloaded::Stored(meta),
                None => Reloaded::Gone,
            }),
        }
    }
}
