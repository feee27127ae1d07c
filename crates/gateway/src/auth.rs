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

use std::path::Path;
use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

pub use warren_http::secret::{bearer_token, new_secret};

use crate::Gateway;
use crate::error::GatewayError;
use warren_store::devices::DeviceStore;

/// A token unused for this long stops working.
pub const TOKEN_EXPIRY_DAYS: i64 = 30;
/// `last_used_at` is persisted at most this often per device (it only feeds expiry).
const LAST_USED_PERSIST_MINUTES: i64 = 60;

pub(crate) fn sha256(secret: &str) -> [u8; 32] {
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

/// A device's record (`devices/<id>.json`, or its row).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct DeviceRecord {
    pub(crate) device_id: String,
    pub(crate) created_at: DateTime<Utc>,
    /// Hex SHA-256 of the current token; `None` after an admin reset.
    pub(crate) token_sha256: Option<String>,
    pub(crate) last_used_at: Option<DateTime<Utc>>,
    /// The device whose sessions this one shares (it was paired by one of that owner's
    /// devices); `None`: the device is its own owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) owner: Option<String>,
    /// When a device of its owner revoked it: its token is gone and its id cannot register again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) revoked_at: Option<DateTime<Utc>>,
    /// The pairing code this device minted last, while it may be used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pairing: Option<crate::pairing::PairingCode>,
    /// Where pushes for this device go (phone.md "Push").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) push_subscriptions: Vec<crate::pairing::StoredPushSubscription>,
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
            // A new token keeps what the device is: its owner and where its pushes go.
            owner: existing.and_then(|r| r.owner.clone()),
            revoked_at: None,
            pairing: None,
            push_subscriptions: existing.map_or_else(Vec::new, |r| r.push_subscriptions.clone()),
        };
        (token, record)
    }

    /// The owner whose sessions this device drives.
    pub(crate) fn owner(&self) -> &str {
        self.owner.as_deref().unwrap_or(&self.device_id)
    }

    pub(crate) fn token_live(&self, now: DateTime<Utc>) -> bool {
        let fresh = self
            .last_used_at
            .is_none_or(|used| now - used < Duration::days(TOKEN_EXPIRY_DAYS));
        self.token_sha256.is_some() && fresh
    }
}

/// Every device, in the data directory or in PostgreSQL (see [`DeviceStore`]): one logic for
/// both, each check reading the stored record and each write conditional on it.
pub struct Devices {
    pub(crate) store: DeviceStore,
}

impl Devices {
    /// The devices of `data_dir` (`devices/<id>.json`).
    pub fn load(data_dir: &Path) -> std::io::Result<Devices> {
        Ok(Devices {
            store: DeviceStore::open_dir(data_dir, valid_device_id)?,
        })
    }

    /// The devices of a PostgreSQL store.
    pub fn postgres(store: warren_store::pg::Store) -> Devices {
        Devices {
            store: DeviceStore::Postgres(store),
        }
    }

    /// Registers `device_id` and returns its new token. When the id holds a live token,
    /// `presented` must be that token, else [`GatewayError::DeviceAlreadyBound`]. The check of
    /// the stored record and its replacement are one conditional write, tried again when
    /// another registration (or replica) changed the record in between.
    pub async fn register(
        &self,
        device_id: &str,
        presented: Option<String>,
    ) -> Result<String, GatewayError> {
        if !valid_device_id(device_id) {
            return Err(GatewayError::InvalidDeviceId);
        }
        for _ in 0..REGISTER_ATTEMPTS {
            let now = Utc::now();
            let stored = self.store.get(device_id).await?;
            let existing = stored.as_ref().map(from_value).transpose()?;
            if existing.as_ref().is_some_and(|r| r.revoked_at.is_some()) {
                return Err(GatewayError::DeviceRevoked);
            }
            if existing
                .as_ref()
                .is_some_and(|record| record.token_live(now))
            {
                let owner = match presented.as_deref() {
                    Some(token) => self.find(token, now).await?,
                    None => None,
                };
                if owner.is_none_or(|(owner, _)| owner.device_id != device_id) {
                    return Err(GatewayError::DeviceAlreadyBound);
                }
            }
            let (token, record) = DeviceRecord::bind(device_id, existing.as_ref(), now);
            if self
                .store
                .put_if(device_id, stored.as_ref(), &to_value(&record)?)
                .await?
            {
                return Ok(token);
            }
        }
        // Every attempt lost to another registration of the same id: that one bound it.
        Err(GatewayError::DeviceAlreadyBound)
    }

    /// The owner of the device a presented token belongs to, if the token is live (a device
    /// drives its owner's sessions). Refreshes its last use.
    pub async fn authenticate(&self, token: &str) -> Result<String, GatewayError> {
        self.authenticate_device(token)
            .await
            .map(|signed_in| signed_in.owner)
    }

    /// The device a presented token belongs to and its owner, if the token is live.
    /// Refreshes its last use.
    pub async fn authenticate_device(&self, token: &str) -> Result<SignedIn, GatewayError> {
        let now = Utc::now();
        let (record, stored) = self
            .find(token, now)
            .await?
            .ok_or(GatewayError::Unauthorized)?;
        if last_use_is_stale(&record, now) {
            let updated = DeviceRecord {
                last_used_at: Some(now),
                ..record.clone()
            };
            // Only feeds expiry: a lost race (another request refreshed it) is fine.
            if let Err(e) = self
                .store
                .put_if(&record.device_id, Some(&stored), &to_value(&updated)?)
                .await
            {
                tracing::warn!(device_id = %record.device_id, error = %e, "cannot persist last use");
            }
        }
        Ok(SignedIn {
            owner: record.owner().to_owned(),
            device_id: record.device_id,
        })
    }

    /// Revokes every token of `device_id` (admin reset). Its sessions and files stay, and a
    /// revoked id may register again with the app key: the way back to an owner's sessions
    /// after every device of the owner signed out.
    pub async fn reset(&self, device_id: &str) -> Result<(), GatewayError> {
        loop {
            let stored = self
                .store
                .get(device_id)
                .await?
                .ok_or(GatewayError::DeviceNotFound)?;
            let updated = DeviceRecord {
                token_sha256: None,
                revoked_at: None,
                ..from_value(&stored)?
            };
            if self
                .store
                .put_if(device_id, Some(&stored), &to_value(&updated)?)
                .await?
            {
                return Ok(());
            }
            // Changed meanwhile (a last-use refresh): read it again.
        }
    }

    /// `(device_id, created_at, bound, last_used_at)` of every device, sorted by id.
    pub async fn list(&self) -> Result<Vec<(String, String, bool, Option<String>)>, GatewayError> {
        let now = Utc::now();
        let mut out = Vec::new();
        for stored in self.store.list().await? {
            out.push(listing(&from_value(&stored)?, now));
        }
        out.sort();
        Ok(out)
    }

    /// The device whose live token is `token`, and its stored record as read.
    pub(crate) async fn find(
        &self,
        token: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<(DeviceRecord, serde_json::Value)>, GatewayError> {
        let hash = sha256(token);
        let Some(stored) = self.store.by_token_hash(&hex::encode(hash)).await? else {
            return Ok(None);
        };
        let record = from_value(&stored)?;
        // The record was found by the hash (a lookup that reveals nothing usable about the
        // token); the final check is constant time.
        let equal = record
            .token_sha256
            .as_deref()
            .and_then(decode_hash)
            .is_some_and(|stored_hash| bool::from(stored_hash.ct_eq(&hash)));
        Ok((equal && record.token_live(now)).then_some((record, stored)))
    }
}

fn decode_hash(hex_hash: &str) -> Option<[u8; 32]> {
    hex::decode(hex_hash).ok()?.try_into().ok()
}

/// How often a registration re-reads a record another registration changed meanwhile.
const REGISTER_ATTEMPTS: usize = 3;

pub(crate) fn to_value(record: &DeviceRecord) -> Result<serde_json::Value, GatewayError> {
    serde_json::to_value(record).map_err(|e| GatewayError::Internal(e.to_string()))
}

pub(crate) fn from_value(stored: &serde_json::Value) -> Result<DeviceRecord, GatewayError> {
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

/// The bearer token of a request: `Authorization: Bearer T`, else `?access_token=T` (browsers
/// cannot set headers on EventSource/WebSocket).
fn bearer(parts: &Parts) -> Option<String> {
    if let Some(value) = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        return bearer_token(value).map(str::to_string);
    }
    let query = parts.uri.query()?;
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix("access_token=").map(str::to_string))
}

/// An authenticated device's owner: the id its sessions belong to (its own id, unless another
/// device of the owner paired it).
pub struct Device(pub String);

/// An authenticated device and its owner, for the routes about the device itself (pairing,
/// revoking, push subscriptions).
#[derive(Debug, Clone)]
pub struct SignedIn {
    pub device_id: String,
    pub owner: String,
}

impl FromRequestParts<Arc<Gateway>> for SignedIn {
    type Rejection = GatewayError;

    async fn from_request_parts(
        parts: &mut Parts,
        gateway: &Arc<Gateway>,
    ) -> Result<Self, Self::Rejection> {
        let token = bearer(parts).ok_or(GatewayError::Unauthorized)?;
        gateway.devices.authenticate_device(&token).await
    }
}

impl FromRequestParts<Arc<Gateway>> for Device {
    type Rejection = GatewayError;

    async fn from_request_parts(
        parts: &mut Parts,
        gateway: &Arc<Gateway>,
    ) -> Result<Self, Self::Rejection> {
        let signed_in = SignedIn::from_request_parts(parts, gateway).await?;
        Ok(Device(signed_in.owner))
    }
}

/// A request carrying the admin token. Admin routes do not exist without `--admin-token`.
pub struct Admin;

impl FromRequestParts<Arc<Gateway>> for Admin {
    type Rejection = GatewayError;

    async fn from_request_parts(
        parts: &mut Parts,
        gateway: &Arc<Gateway>,
    ) -> Result<Self, Self::Rejection> {
        let expected = gateway
            .args
            .admin_token
            .as_deref()
            .ok_or(GatewayError::RouteNotFound)?;
        let token = bearer(parts).ok_or(GatewayError::Unauthorized)?;
        if secret_matches(&token, expected) {
            Ok(Admin)
        } else {
            Err(GatewayError::Unauthorized)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

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

    #[tokio::test]
    async fn first_use_binds_and_second_registration_needs_the_token() {
        let dir = tempfile::tempdir().expect("temp dir");
        let devices = Devices::load(dir.path()).expect("load");
        let token = devices
            .register("phone-0001", None)
            .await
            .expect("first registration");
        assert!(matches!(
            devices.register("phone-0001", None).await,
            Err(GatewayError::DeviceAlreadyBound)
        ));
        let other = devices
            .register("phone-0002", None)
            .await
            .expect("other device");
        assert!(matches!(
            devices.register("phone-0001", Some(other)).await,
            Err(GatewayError::DeviceAlreadyBound)
        ));
        let rotated = devices
            .register("phone-0001", Some(token.clone()))
            .await
            .expect("re-registration");
        assert!(
            devices.authenticate(&token).await.is_err(),
            "old token replaced"
        );
        assert_eq!(
            devices.authenticate(&rotated).await.expect("new token"),
            "phone-0001"
        );
        let reloaded = Devices::load(dir.path()).expect("reload");
        assert_eq!(
            reloaded.authenticate(&rotated).await.expect("persisted"),
            "phone-0001"
        );
    }

    #[tokio::test]
    async fn reset_revokes_and_unused_tokens_expire() {
        let dir = tempfile::tempdir().expect("temp dir");
        let devices = Devices::load(dir.path()).expect("load");
        let token = devices.register("tablet-01", None).await.expect("register");
        devices.reset("tablet-01").await.expect("reset");
        assert!(devices.authenticate(&token).await.is_err());
        let token = devices
            .register("tablet-01", None)
            .await
            .expect("register after reset");
        // Last used longer ago than the expiry.
        let stored = devices.store.get("tablet-01").await.expect("reads");
        let mut backdated = from_value(stored.as_ref().expect("stored")).expect("parses");
        backdated.last_used_at = Some(Utc::now() - Duration::days(TOKEN_EXPIRY_DAYS + 1));
        let written = devices
            .store
            .put_if(
                "tablet-01",
                stored.as_ref(),
                &to_value(&backdated).expect("json"),
            )
            .await
            .expect("writes");
        assert!(written);
        assert!(
            devices.authenticate(&token).await.is_err(),
            "expired token refused"
        );
        devices
            .register("tablet-01", None)
            .await
            .expect("expired binding can be replaced");
        assert!(matches!(
            devices.reset("tablet-none").await,
            Err(GatewayError::DeviceNotFound)
        ));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn in_files_racing_first_registrations_bind_a_device_id_once() {
        let dir = tempfile::tempdir().expect("temp dir");
        let devices = Arc::new(Devices::load(dir.path()).expect("load"));
        racing_registrations_bind_once(devices.clone(), devices).await;
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
        racing_registrations_bind_once(Arc::new(a), Arc::new(b)).await;
    }

    /// Ten first registrations of one id at once, alternating between `a` and `b`: exactly one
    /// binds it, and its token works.
    async fn racing_registrations_bind_once(a: Arc<Devices>, b: Arc<Devices>) {
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
