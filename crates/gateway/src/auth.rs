//! Devices and credentials: registration with the app key, trust-on-first-use binding of a
//! device id, device tokens (`wr_` + 43 base64url chars, only their SHA-256 stored), 30-day
//! expiry of unused tokens, and the admin token.
//!
//! Token checks hash the presented token and compare hashes in constant time; a token or its
//! hash is never logged. Device records live in `devices/<id>.json`, written atomically.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use base64::Engine;
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::GatewayError;
use crate::store;

/// A token unused for this long stops working.
pub const TOKEN_EXPIRY_DAYS: i64 = 30;
/// `last_used_at` is persisted at most this often per device (it only feeds expiry).
const LAST_USED_PERSIST_MINUTES: i64 = 60;

/// A fresh random secret: `prefix` + 43 base64url chars (32 random bytes).
pub fn new_secret(prefix: &str) -> String {
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes);
    format!(
        "{prefix}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

fn sha256(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Constant-time check of a presented secret against an expected one (by their hashes, so the
/// lengths do not leak either).
pub fn secret_matches(presented: &str, expected: &str) -> bool {
    sha256(presented).ct_eq(&sha256(expected)).into()
}

/// The token of an `Authorization` header value using the Bearer scheme, whose name is
/// case-insensitive (RFC 9110 §11.1: `bearer`, `BEARER` are the same scheme). Blanks around the
/// token are ignored; another scheme or an empty token is `None`.
pub fn bearer_token(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.trim_start().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
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
    fn token_live(&self, now: DateTime<Utc>) -> bool {
        let fresh = self
            .last_used_at
            .is_none_or(|used| now - used < Duration::days(TOKEN_EXPIRY_DAYS));
        self.token_sha256.is_some() && fresh
    }
}

/// Every device, loaded at start and kept in memory; the files are the source of truth after a
/// restart.
pub struct Devices {
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
    /// Loads every `devices/*.json` under `data_dir`.
    pub fn load(data_dir: &Path) -> std::io::Result<Devices> {
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
        Ok(Devices {
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
        let token = new_secret("wr_");
        let record = DeviceRecord {
            device_id: device_id.to_string(),
            created_at: existing.map_or(now, |r| r.created_at),
            token_sha256: Some(hex::encode(sha256(&token))),
            last_used_at: Some(now),
        };
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
        let stale = record
            .last_used_at
            .is_none_or(|used| now - used > Duration::minutes(LAST_USED_PERSIST_MINUTES));
        if stale {
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
        let mut out: Vec<_> = state
            .by_id
            .values()
            .map(|r| {
                (
                    r.device_id.clone(),
                    r.created_at
                        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                    r.token_live(now),
                    r.last_used_at
                        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
                )
            })
            .collect();
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
        let devices = Devices::load(dir.path()).expect("load");
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
        let reloaded = Devices::load(dir.path()).expect("reload");
        assert_eq!(
            reloaded.authenticate(&rotated).expect("persisted"),
            "phone-0001"
        );
    }

    #[test]
    fn reset_revokes_and_unused_tokens_expire() {
        let dir = tempfile::tempdir().expect("temp dir");
        let devices = Devices::load(dir.path()).expect("load");
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
}
