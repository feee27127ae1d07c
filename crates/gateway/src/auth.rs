//! Devices and credentials: registration with the app key, trust-on-first-use binding of a
//! device id, device tokens (`wr_` + 43 base64url chars, only their SHA-256 stored), 30-day
//! expiry of unused tokens, and the admin token.
//!
//! Token checks hash the presented token and compare hashes in constant time; a token or its
//! hash is never logged. Device records live in `devices/<id>.json`, written atomically, or with
//! `--store postgres://…` in the `devices` table, where every replica finds them: there each
//! check reads the row (a registration or reset on one replica holds on all at once), and a
//! registration replaces the record only if it is still the one it checked, so two replicas
//! cannot both bind one device id.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

pub use warren_http::secret::{bearer_token, new_secret};

use crate::error::GatewayError;
use crate::store;

/// A token unused for this long stops working.
pub const TOKEN_EXPIRY_DAYS: i64 = 30;
/// `last_used_at` is persisted at most this often per device (it only feeds expiry).
const LAST_USED_PERSIST_MINUTES: i64 = 60;

fn sha256(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Constant-time check of a presented secret against an expected one (by their hashes, so the
/// lengths do not leak either).
pub fn secret_matches(presented: &str, expected: &str) -> bool {
    sha256(presented).ct_eq(&sha256(expected)).into()
}

pub fn valid_device_id(id: &str) -> bool {
    (8..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `devices/<id>.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct DeviceRecord {
    device_id: String,
    created_at: DateTime<Utc>,
    /// Hex SHA-256 of the current token; `None` after an admin reset.
    token_sha256: Option<String>,
    last_used_at: Option<DateTime<Utc>>,
}

impl DeviceRecord {
    /// A fresh token for `device_id` and the record that binds it, keeping the creation time
    /// of the `existing` record.
    fn bind(
        device_id: &str,
        existing: Option<&DeviceRecord>,
        now: DateTime<Utc>,
    ) -> (String, DeviceRecord) {
        let token = new_secret("wr_");
        let record = DeviceRecord {
            device_id: device_id.to_string(),
            created_at: existing.map_or(now, |r| r.created_at),
            token_sha256: Some(hex::encode(sha256(&token))),
            last_used_at: Some(now),
        };
        (token, record)
    }

    fn token_live(&self, now: DateTime<Utc>) -> bool {
        let fresh = self
            .last_used_at
            .is_none_or(|used| now - used < Duration::days(TOKEN_EXPIRY_DAYS));
        self.token_sha256.is_some() && fresh
    }
}

/// Every device: in the data directory ([`FileDevices`]) or in PostgreSQL.
pub struct Devices {
    backend: Backend,
}

enum Backend {
    File(Arc<FileDevices>),
    Postgres(warren_store::pg::Store),
}

/// Every device of a data directory, loaded at start and kept in memory; the files are the
/// source of truth after a restart. Blocking (its writes fsync).
pub struct FileDevices {
    dir: PathBuf,
    state: Mutex<DeviceState>,
}

#[derive(Default)]
struct DeviceState {
    by_id: HashMap<String, DeviceRecord>,
    /// Token hash → device id.
    by_token: HashMap<[u8; 32], String>,
}

impl DeviceState {
    fn insert(&mut self, record: DeviceRecord) {
        let old_hash = self
            .by_id
            .get(&record.device_id)
            .and_then(|r| r.token_sha256.as_deref())
            .and_then(decode_hash);
        if let Some(hash) = old_hash {
            self.by_token.remove(&hash);
        }
        if let Some(hash) = record.token_sha256.as_deref().and_then(decode_hash) {
            self.by_token.insert(hash, record.device_id.clone());
        }
        self.by_id.insert(record.device_id.clone(), record);
    }

    /// The device whose live token is `token`.
    fn lookup(&self, token: &str, now: DateTime<Utc>) -> Option<&DeviceRecord> {
        let hash = sha256(token);
        // The map finds the candidate by hash (a hash lookup reveals nothing usable about the
        // token); the final check is constant time.
        let record = self.by_token.get(&hash).and_then(|id| self.by_id.get(id))?;
        let stored = record.token_sha256.as_deref().and_then(decode_hash)?;
        let equal: bool = stored.ct_eq(&hash).into();
        (equal && record.token_live(now)).then_some(record)
    }
}

fn decode_hash(hex_hash: &str) -> Option<[u8; 32]> {
    hex::decode(hex_hash).ok()?.try_into().ok()
}

impl Devices {
    /// The devices of `data_dir` (see [`FileDevices::load`]).
    pub fn load(data_dir: &Path) -> std::io::Result<Devices> {
        Ok(Devices {
            backend: Backend::File(Arc::new(FileDevices::load(data_dir)?)),
        })
    }

    /// The devices of a PostgreSQL store.
    pub fn postgres(store: warren_store::pg::Store) -> Devices {
        Devices {
            backend: Backend::Postgres(store),
        }
    }

    /// Registers `device_id` and returns its new token. When the id holds a live token,
    /// `presented` must be that token, else [`GatewayError::DeviceAlreadyBound`].
    pub async fn register(
        &self,
        device_id: &str,
        presented: Option<String>,
    ) -> Result<String, GatewayError> {
        match &self.backend {
            Backend::File(devices) => {
                // The device file is fsynced: off the async workers.
                let devices = devices.clone();
                let device_id = device_id.to_owned();
                tokio::task::spawn_blocking(move || {
                    devices.register(&device_id, presented.as_deref())
                })
                .await
                .map_err(|e| GatewayError::Internal(e.to_string()))?
            }
            Backend::Postgres(store) => {
                register_in_store(store, device_id, presented.as_deref()).await
            }
        }
    }

    /// The device id a presented token belongs to, if the token is live. Refreshes its
    /// last use.
    pub async fn authenticate(&self, token: &str) -> Result<String, GatewayError> {
        match &self.backend {
            Backend::File(devices) => devices.authenticate(token),
            Backend::Postgres(store) => {
                let now = Utc::now();
                let (record, stored) = find_in_store(store, token, now)
                    .await?
                    .ok_or(GatewayError::Unauthorized)?;
                if last_use_is_stale(&record, now) {
                    let updated = DeviceRecord {
                        last_used_at: Some(now),
                        ..record.clone()
                    };
                    // Only feeds expiry: a lost race (another replica refreshed it) is fine.
                    if let Err(e) = store
                        .put_device_if(&record.device_id, Some(&stored), &to_value(&updated)?)
                        .await
                    {
                        tracing::warn!(device_id = %record.device_id, error = %e, "cannot persist last use");
                    }
                }
                Ok(record.device_id)
            }
        }
    }

    /// Revokes every token of `device_id` (admin reset). Its sessions and files stay.
    pub async fn reset(&self, device_id: &str) -> Result<(), GatewayError> {
        match &self.backend {
            Backend::File(devices) => {
                let devices = devices.clone();
                let device_id = device_id.to_owned();
                tokio::task::spawn_blocking(move || devices.reset(&device_id))
                    .await
                    .map_err(|e| GatewayError::Internal(e.to_string()))?
            }
            Backend::Postgres(store) => loop {
                let stored = store
                    .device(device_id)
                    .await?
                    .ok_or(GatewayError::DeviceNotFound)?;
                let record = from_value(&stored)?;
                let updated = DeviceRecord {
                    token_sha256: None,
                    ..record
                };
                if store
                    .put_device_if(device_id, Some(&stored), &to_value(&updated)?)
                    .await?
                {
                    return Ok(());
                }
                // Changed meanwhile (a last-use refresh on another replica): read it again.
            },
        }
    }

    /// `(device_id, created_at, bound, last_used_at)` of every device, sorted by id.
    pub async fn list(&self) -> Result<Vec<(String, String, bool, Option<String>)>, GatewayError> {
        match &self.backend {
            Backend::File(devices) => Ok(devices.list()),
            Backend::Postgres(store) => {
                let now = Utc::now();
                let mut out = Vec::new();
                for (_, stored) in store.devices().await? {
                    out.push(listing(&from_value(&stored)?, now));
                }
                out.sort();
                Ok(out)
            }
        }
    }
}

/// [`Devices::register`] on PostgreSQL: the check of the stored record and its replacement are
/// one conditional write, tried again when another replica changed the record in between.
async fn register_in_store(
    store: &warren_store::pg::Store,
    device_id: &str,
    presented: Option<&str>,
) -> Result<String, GatewayError> {
    if !valid_device_id(device_id) {
        return Err(GatewayError::InvalidDeviceId);
    }
    for _ in 0..REGISTER_ATTEMPTS {
        let now = Utc::now();
        let stored = store.device(device_id).await?;
        let existing = stored.as_ref().map(from_value).transpose()?;
        if existing
            .as_ref()
            .is_some_and(|record| record.token_live(now))
        {
            let owner = match presented {
                Some(token) => find_in_store(store, token, now).await?,
                None => None,
            };
            if owner.is_none_or(|(owner, _)| owner.device_id != device_id) {
                return Err(GatewayError::DeviceAlreadyBound);
            }
        }
        let (token, record) = DeviceRecord::bind(device_id, existing.as_ref(), now);
        if store
            .put_device_if(device_id, stored.as_ref(), &to_value(&record)?)
            .await?
        {
            return Ok(token);
        }
    }
    // Every attempt lost to another registration of the same id: that one bound it.
    Err(GatewayError::DeviceAlreadyBound)
}

/// How often a registration on PostgreSQL re-reads a record another replica changed meanwhile.
const REGISTER_ATTEMPTS: usize = 3;

/// The device whose live token is `token`, and its stored record as read.
async fn find_in_store(
    store: &warren_store::pg::Store,
    token: &str,
    now: DateTime<Utc>,
) -> Result<Option<(DeviceRecord, serde_json::Value)>, GatewayError> {
    let hash = sha256(token);
    let Some((_, stored)) = store.device_by_token_hash(&hex::encode(hash)).await? else {
        return Ok(None);
    };
    let record = from_value(&stored)?;
    // The row was found by the hash; the final check is constant time, as in memory.
    let equal = record
        .token_sha256
        .as_deref()
        .and_then(decode_hash)
        .is_some_and(|stored_hash| bool::from(stored_hash.ct_eq(&hash)));
    Ok((equal && record.token_live(now)).then_some((record, stored)))
}

fn to_value(record: &DeviceRecord) -> Result<serde_json::Value, GatewayError> {
    serde_json::to_value(record).map_err(|e| GatewayError::Internal(e.to_string()))
}

fn from_value(stored: &serde_json::Value) -> Result<DeviceRecord, GatewayError> {
    serde_json::from_value(stored.clone())
        .map_err(|e| GatewayError::Internal(format!("a stored device record does not parse: {e}")))
}

/// Whether `last_used_at` is old enough to be written again.
fn last_use_is_stale(record: &DeviceRecord, now: DateTime<Utc>) -> bool {
    record
        .last_used_at
        .is_none_or(|used| now - used > Duration::minutes(LAST_USED_PERSIST_MINUTES))
}

/// One row of the admin listing.
fn listing(record: &DeviceRecord, now: DateTime<Utc>) -> (String, String, bool, Option<String>) {
    (
        record.device_id.clone(),
        record
            .created_at
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        record.token_live(now),
        record
            .last_used_at
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
    )
}

impl FileDevices {
    /// Loads every `devices/*.json` under `data_dir`.
    pub fn load(data_dir: &Path) -> std::io::Result<FileDevices> {
        let dir = data_dir.join("devices");
        std::fs::create_dir_all(&dir)?;
        let mut state = DeviceState::default();
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            match store::read_json::<DeviceRecord>(&path) {
                Ok(record) if valid_device_id(&record.device_id) => state.insert(record),
                Ok(_) => {
                    tracing::warn!(path = %path.display(), "device file with invalid id skipped")
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "unreadable device file skipped")
                }
            }
        }
        Ok(FileDevices {
            dir,
            state: Mutex::new(state),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DeviceState> {
        // Inserts are single map operations; a poisoned lock still holds consistent maps.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers `device_id` and returns its new token. When the id holds a live token,
    /// `presented` must be that token, else [`GatewayError::DeviceAlreadyBound`].
    pub fn register(
        &self,
        device_id: &str,
        presented: Option<&str>,
    ) -> Result<String, GatewayError> {
        if !valid_device_id(device_id) {
            return Err(GatewayError::InvalidDeviceId);
        }
        let now = Utc::now();
        let mut state = self.lock();
        let existing = state.by_id.get(device_id).cloned();
        if existing
            .as_ref()
            .is_some_and(|record| record.token_live(now))
        {
            let owner = presented.and_then(|token| state.lookup(token, now));
            if owner.is_none_or(|owner| owner.device_id != device_id) {
                return Err(GatewayError::DeviceAlreadyBound);
            }
        }
        let (token, record) = DeviceRecord::bind(device_id, existing.as_ref(), now);
        store::write_json_atomic(&self.record_path(device_id), &record)?;
        state.insert(record);
        Ok(token)
    }

    /// The device id a presented token belongs to, if the token is live. Refreshes its
    /// last use.
    pub fn authenticate(&self, token: &str) -> Result<String, GatewayError> {
        let now = Utc::now();
        let mut state = self.lock();
        let record = state
            .lookup(token, now)
            .ok_or(GatewayError::Unauthorized)?
            .clone();
        if last_use_is_stale(&record, now) {
            let updated = DeviceRecord {
                last_used_at: Some(now),
                ..record.clone()
            };
            if let Err(e) = store::write_json_atomic(&self.record_path(&record.device_id), &updated)
            {
                tracing::warn!(device_id = %record.device_id, error = %e, "cannot persist last use");
            }
            state.insert(updated);
        }
        Ok(record.device_id)
    }

    /// Revokes every token of `device_id` (admin reset). Its sessions and files stay.
    pub fn reset(&self, device_id: &str) -> Result<(), GatewayError> {
        let mut state = self.lock();
        let record = state
            .by_id
            .get(device_id)
            .cloned()
            .ok_or(GatewayError::DeviceNotFound)?;
        let updated = DeviceRecord {
            token_sha256: None,
            ..record
        };
        store::write_json_atomic(&self.record_path(device_id), &updated)?;
        state.insert(updated);
        Ok(())
    }

    /// `(device_id, created_at, bound, last_used_at)` of every device, sorted by id.
    pub fn list(&self) -> Vec<(String, String, bool, Option<String>)> {
        let now = Utc::now();
        let state = self.lock();
        let mut out: Vec<_> = state.by_id.values().map(|r| listing(r, now)).collect();
        out.sort();
        out
    }

    fn record_path(&self, device_id: &str) -> PathBuf {
        self.dir.join(format!("{device_id}.json"))
    }

    #[cfg(test)]
    fn backdate_last_use(&self, device_id: &str, days: i64) {
        let mut state = self.lock();
        let mut record = state.by_id.get(device_id).cloned().expect("device exists");
        record.last_used_at = Some(Utc::now() - Duration::days(days));
        state.insert(record);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_have_prefix_and_43_base64url_chars() {
        let token = new_secret("wr_");
        assert_eq!(token.len(), 3 + 43);
        assert!(
            token[3..]
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        );
        assert_ne!(token, new_secret("wr_"));
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        let cases = [
            ("Bearer wr_abc", Some("wr_abc")),
            ("bearer wr_abc", Some("wr_abc")),
            ("BEARER wr_abc", Some("wr_abc")),
            ("bEaReR   wr_abc  ", Some("wr_abc")),
            ("Bearer ", None),
            ("Bearer", None),
            ("Basic d3I6YWJj", None),
            ("Bearerwr_abc", None),
            ("wr_abc", None),
            ("", None),
        ];
        for (header, expected) in cases {
            assert_eq!(bearer_token(header), expected, "{header:?}");
        }
    }

    #[test]
    fn device_id_validation_table() {
        let cases = [
            ("abcdefgh", true),
            ("abc", false),
            ("phone-1_AB", true),
            ("has space1", false),
            ("../../etc", false),
            (&"x".repeat(128), true),
            (&"x".repeat(129), false),
        ];
        for (id, want) in cases {
            assert_eq!(valid_device_id(id), want, "{id}");
        }
    }

    #[test]
    fn first_use_binds_and_second_registration_needs_the_token() {
        let dir = tempfile::tempdir().expect("temp dir");
        let devices = FileDevices::load(dir.path()).expect("load");
        let token = devices
            .register("phone-0001", None)
            .expect("first registration");
        assert!(matches!(
            devices.register("phone-0001", None),
            Err(GatewayError::DeviceAlreadyBound)
        ));
        let other = devices.register("phone-0002", None).expect("other device");
        assert!(matches!(
            devices.register("phone-0001", Some(&other)),
            Err(GatewayError::DeviceAlreadyBound)
        ));
        let rotated = devices
            .register("phone-0001", Some(&token))
            .expect("re-registration");
        assert!(devices.authenticate(&token).is_err(), "old token replaced");
        assert_eq!(
            devices.authenticate(&rotated).expect("new token"),
            "phone-0001"
        );
        let reloaded = FileDevices::load(dir.path()).expect("reload");
        assert_eq!(
            reloaded.authenticate(&rotated).expect("persisted"),
            "phone-0001"
        );
    }

    #[test]
    fn reset_revokes_and_unused_tokens_expire() {
        let dir = tempfile::tempdir().expect("temp dir");
        let devices = FileDevices::load(dir.path()).expect("load");
        let token = devices.register("tablet-01", None).expect("register");
        devices.reset("tablet-01").expect("reset");
        assert!(devices.authenticate(&token).is_err());
        let token = devices
            .register("tablet-01", None)
            .expect("register after reset");
        devices.backdate_last_use("tablet-01", TOKEN_EXPIRY_DAYS + 1);
        assert!(
            devices.authenticate(&token).is_err(),
            "expired token refused"
        );
        devices
            .register("tablet-01", None)
            .expect("expired binding can be replaced");
    }

    /// Two replicas' views of one PostgreSQL store.
    async fn two_replicas() -> (Devices, Devices) {
        let url = tokio::task::spawn_blocking(|| {
            warren_test_support::services::Postgres::shared().fresh_database()
        })
        .await
        .expect("a database");
        let a = warren_store::pg::Store::connect(&url)
            .await
            .expect("connects");
        let b = warren_store::pg::Store::connect(&url)
            .await
            .expect("connects");
        (Devices::postgres(a), Devices::postgres(b))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn in_postgres_a_registration_or_reset_on_one_replica_holds_on_the_other() {
        let (a, b) = two_replicas().await;
        let token = a.register("phone-0001", None).await.expect("registers");
        assert_eq!(
            b.authenticate(&token).await.expect("known on b"),
            "phone-0001"
        );
        assert!(matches!(
            b.register("phone-0001", None).await,
            Err(GatewayError::DeviceAlreadyBound)
        ));
        let rotated = b
            .register("phone-0001", Some(token.clone()))
            .await
            .expect("re-registration with the token");
        assert!(a.authenticate(&token).await.is_err(), "old token replaced");
        assert!(a.authenticate("wr_not-a-token").await.is_err());
        a.reset("phone-0001").await.expect("reset");
        assert!(
            b.authenticate(&rotated).await.is_err(),
            "revoked everywhere"
        );
        assert!(matches!(
            a.reset("phone-none").await,
            Err(GatewayError::DeviceNotFound)
        ));
        assert!(matches!(
            a.register("bad id", None).await,
            Err(GatewayError::InvalidDeviceId)
        ));
        let listed = b.list().await.expect("lists");
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].0, "phone-0001");
        assert!(!listed[0].2, "reset: no live token");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn in_postgres_racing_first_registrations_bind_a_device_id_once() {
        let (a, b) = two_replicas().await;
        let (a, b) = (Arc::new(a), Arc::new(b));
        let racers = (0..10).map(|n| {
            let devices = if n % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move { devices.register("laptop-0001", None).await })
        });
        let results = futures_util::future::join_all(racers).await;
        let tokens: Vec<String> = results
            .into_iter()
            .filter_map(|r| r.expect("the task ends").ok())
            .collect();
        assert_eq!(tokens.len(), 1, "exactly one registration binds the id");
        assert_eq!(
            a.authenticate(&tokens[0])
                .await
                .expect("the winner's token works"),
            "laptop-0001"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn in_postgres_a_stopped_database_is_store_unavailable() {
        let mut postgres = warren_test_support::services::Postgres::start();
        let url = postgres.fresh_database();
        let store = warren_store::pg::Store::connect(&url)
            .await
            .expect("connects");
        let devices = Devices::postgres(store);
        let token = devices
            .register("phone-0009", None)
            .await
            .expect("registers");
        let postgres = tokio::task::spawn_blocking(move || {
            postgres.stop();
            postgres
        })
        .await
        .expect("stops");
        let error = devices.authenticate(&token).await.expect_err("no store");
        assert_eq!(error.code(), "STORE_UNAVAILABLE", "{error}");
        drop(postgres);
    }
}
