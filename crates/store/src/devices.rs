//! Device records, chosen once between the data directory and PostgreSQL: [`DeviceStore`] finds a
//! record by its id or by its token's hash and replaces it only when it is still the one the
//! caller read, on either backend, so the gateway writes its device logic once.
//!
//! The gateway owns the record's shape (JSON); this module reads two of its fields, `device_id`
//! and `token_sha256` (hex), as the `devices` table's queries do.
//!
//! Architecture Invariant: a conditional write compares and writes under one lock (files) or in
//! one statement (PostgreSQL): two registrations racing for one device id never both win.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::file;
use crate::pg::{Store, StoreError};

/// Where device records live.
#[derive(Clone)]
pub enum DeviceStore {
    /// `devices/<id>.json` in the data directory, kept in memory.
    File(Arc<FileDevices>),
    /// The `devices` table.
    Postgres(Store),
}

impl DeviceStore {
    /// The records of `data_dir/devices` (made if missing). A file that does not parse, or whose
    /// `device_id` `valid_id` refuses, is skipped with a warning.
    pub fn open_dir(data_dir: &Path, valid_id: fn(&str) -> bool) -> std::io::Result<DeviceStore> {
        FileDevices::load(&data_dir.join("devices"), valid_id)
            .map(|devices| DeviceStore::File(Arc::new(devices)))
    }

    /// The device's record, `None` when there is none.
    pub async fn get(&self, id: &str) -> Result<Option<Value>, StoreError> {
        match self {
            DeviceStore::File(devices) => Ok(devices.lock().by_id.get(id).cloned()),
            DeviceStore::Postgres(store) => store.device(id).await,
        }
    }

    /// The record whose `token_sha256` is `token_sha256`, `None` when none is. The caller still
    /// checks the token's liveness and compares in constant time.
    pub async fn by_token_hash(&self, token_sha256: &str) -> Result<Option<Value>, StoreError> {
        match self {
            DeviceStore::File(devices) => {
                let state = devices.lock();
                Ok(state
                    .by_token
                    .get(token_sha256)
                    .and_then(|id| state.by_id.get(id))
                    .cloned())
            }
            DeviceStore::Postgres(store) => Ok(store
                .device_by_token_hash(token_sha256)
                .await?
                .map(|(_, record)| record)),
        }
    }

    /// Replaces the device's record only when the stored one is still `expected` (`None`: there
    /// is none yet). Returns whether the record was written.
    pub async fn put_if(
        &self,
        id: &str,
        expected: Option<&Value>,
        record: &Value,
    ) -> Result<bool, StoreError> {
        match self {
            // The id names the record's file.
            DeviceStore::File(_) if id.is_empty() || id.starts_with('.') || id.contains('/') => {
                Err(StoreError::Invalid(format!(
                    "{id:?} cannot name a device file"
                )))
            }
            DeviceStore::File(devices) => {
                // The file is fsynced: off the async workers.
                let devices = devices.clone();
                let (id, expected, record) = (id.to_owned(), expected.cloned(), record.clone());
                tokio::task::spawn_blocking(move || devices.put_if(&id, expected.as_ref(), record))
                    .await
                    .map_err(|e| StoreError::Unavailable(e.to_string()))?
                    .map_err(StoreError::from)
            }
            DeviceStore::Postgres(store) => store.put_device_if(id, expected, record).await,
        }
    }

    /// Every device's record, by id.
    pub async fn list(&self) -> Result<Vec<Value>, StoreError> {
        match self {
            DeviceStore::File(devices) => {
                let state = devices.lock();
                let mut ids: Vec<&String> = state.by_id.keys().collect();
                ids.sort();
                Ok(ids.into_iter().map(|id| state.by_id[id].clone()).collect())
            }
            DeviceStore::Postgres(store) => Ok(store
                .devices()
                .await?
                .into_iter()
                .map(|(_, record)| record)
                .collect()),
        }
    }
}

/// Every device of a data directory, loaded at start and kept in memory; the files are the
/// source of truth after a restart.
pub struct FileDevices {
    dir: PathBuf,
    state: Mutex<FileState>,
}

#[derive(Default)]
struct FileState {
    by_id: HashMap<String, Value>,
    /// `token_sha256` → device id.
    by_token: HashMap<String, String>,
}

impl FileState {
    fn insert(&mut self, id: String, record: Value) {
        if let Some(old) = self.by_id.get(&id).and_then(token_hash) {
            self.by_token.remove(old);
        }
        if let Some(hash) = token_hash(&record) {
            self.by_token.insert(hash.to_owned(), id.clone());
        }
        self.by_id.insert(id, record);
    }
}

fn token_hash(record: &Value) -> Option<&str> {
    record.get("token_sha256").and_then(Value::as_str)
}

impl FileDevices {
    fn load(dir: &Path, valid_id: fn(&str) -> bool) -> std::io::Result<FileDevices> {
        std::fs::create_dir_all(dir)?;
        let mut state = FileState::default();
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let record = file::read_json::<Value>(&path);
            let id = record
                .as_ref()
                .ok()
                .and_then(|r| r.get("device_id")?.as_str());
            match (id, &record) {
                (Some(id), Ok(record)) if valid_id(id) => {
                    state.insert(id.to_owned(), record.clone())
                }
                (_, Err(e)) => {
                    tracing::warn!(path = %path.display(), error = %e, "unreadable device file skipped")
                }
                _ => tracing::warn!(path = %path.display(), "device file with invalid id skipped"),
            }
        }
        Ok(FileDevices {
            dir: dir.to_owned(),
            state: Mutex::new(state),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FileState> {
        // Inserts are single map operations; a poisoned lock still holds consistent maps.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Compares and writes under the lock (blocking: the file is fsynced).
    fn put_if(&self, id: &str, expected: Option<&Value>, record: Value) -> std::io::Result<bool> {
        let mut state = self.lock();
        if state.by_id.get(id) != expected {
            return Ok(false);
        }
        file::write_json_atomic(&self.dir.join(format!("{id}.json")), &record)?;
        state.insert(id.to_owned(), record);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any_id(_: &str) -> bool {
        true
    }

    #[tokio::test]
    async fn in_files_a_write_holds_only_over_the_record_it_expects_and_survives_a_reload() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = DeviceStore::open_dir(dir.path(), any_id).expect("opens");
        let first = serde_json::json!({"device_id": "phone-1", "token_sha256": "aa"});
        let second = serde_json::json!({"device_id": "phone-1", "token_sha256": "bb"});
        assert!(store.put_if("phone-1", None, &first).await.expect("writes"));
        assert!(
            !store
                .put_if("phone-1", None, &second)
                .await
                .expect("refused: one exists")
        );
        assert!(
            !store
                .put_if("phone-1", Some(&second), &second)
                .await
                .expect("refused: stale")
        );
        assert!(
            store
                .put_if("phone-1", Some(&first), &second)
                .await
                .expect("replaces")
        );
        assert_eq!(
            store.by_token_hash("aa").await.expect("reads"),
            None,
            "old hash gone"
        );
        let reopened = DeviceStore::open_dir(dir.path(), any_id).expect("reopens");
        assert_eq!(
            reopened.by_token_hash("bb").await.expect("reads"),
            Some(second.clone())
        );
        assert_eq!(reopened.list().await.expect("lists"), vec![second]);
        let refused = store.put_if("../x", None, &first).await;
        assert!(
            matches!(refused, Err(StoreError::Invalid(_))),
            "{refused:?}"
        );
    }
}
