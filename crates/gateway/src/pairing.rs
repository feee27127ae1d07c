//! One person, several devices (phone.md "Pairing"): a signed-in device mints a pairing code,
//! another browser registers with it under the same owner and drives the same sessions; the
//! owner's devices are listed and revoked; and each device's push subscriptions, kept in its
//! record so they live wherever devices do (files or PostgreSQL).
//!
//! A code is 8 characters of an alphabet without look-alikes (`0`/`O`, `1`/`I`/`L`, `U`/`V`),
//! shown as `ABCD-EFGH`: 29⁸ ≈ 5·10¹¹ codes, good for one registration within 5 minutes.
//! Only its SHA-256 is stored, in the minting device's record, which a redemption clears with a
//! conditional write: two browsers racing for one code never both get in.

use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Duration, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use warren_protocol::error::ErrorBody;
use warren_protocol::gateway::{OwnedDevice, OwnedDevices, PairCode};

use crate::Gateway;
use crate::auth::{DeviceRecord, Devices, SignedIn, from_value, sha256, to_value, valid_device_id};
use crate::error::{GatewayError, Path};

/// How long a pairing code may be used.
pub const PAIR_CODE_MINUTES: i64 = 5;
/// The characters of a pairing code: letters and digits no one confuses when reading aloud or
/// typing from a screen.
const PAIR_ALPHABET: &[u8] = b"ABCDEFGHJKMNPQRSTWXYZ23456789";
const PAIR_CODE_LEN: usize = 8;
/// How often a write that lost to another one (a last-use refresh) reads the record again.
const WRITE_ATTEMPTS: usize = 5;

/// A minted code as its device's record keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairingCode {
    /// Hex SHA-256 of the normalized code (`ABCDEFGH`).
    code_sha256: String,
    expires_at: DateTime<Utc>,
}

/// A browser's push subscription, bound to the device that made it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredPushSubscription {
    pub id: String,
    pub endpoint: String,
    /// The browser's P-256 public key, base64url (uncompressed point).
    pub p256dh: String,
    /// The browser's 16-byte auth secret, base64url.
    pub auth: String,
    pub created_at: DateTime<Utc>,
}

/// A fresh code, `ABCDEFGH` (no dash).
fn new_code() -> String {
    let mut bytes = [0u8; PAIR_CODE_LEN];
    let mut code = String::with_capacity(PAIR_CODE_LEN);
    while code.len() < PAIR_CODE_LEN {
        rand::fill(&mut bytes);
        // Rejection sampling: 256 is not a multiple of the alphabet's size.
        let limit = 256 - 256 % PAIR_ALPHABET.len();
        for b in bytes {
            if (b as usize) < limit && code.len() < PAIR_CODE_LEN {
                code.push(PAIR_ALPHABET[b as usize % PAIR_ALPHABET.len()] as char);
            }
        }
    }
    code
}

/// `ABCD-EFGH` as a person reads it.
pub fn display_code(code: &str) -> String {
    format!("{}-{}", &code[..4], &code[4..])
}

/// A typed code as it is stored: case, blanks and dashes do not matter. `None` when it cannot
/// be a code (length, a character not in the alphabet).
pub fn normalize_code(typed: &str) -> Option<String> {
    let code: String = typed
        .chars()
        .filter(|c| !c.is_whitespace() && *c != '-')
        .map(|c| c.to_ascii_uppercase())
        .collect();
    (code.len() == PAIR_CODE_LEN && code.bytes().all(|b| PAIR_ALPHABET.contains(&b)))
        .then_some(code)
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

impl Devices {
    /// Applies `change` to `device_id`'s record and writes it when it is still the one read,
    /// reading again when another write came first. `change` returns `Ok(false)` to write
    /// nothing. [`GatewayError::DeviceNotFound`] when there is no record.
    async fn modify<T>(
        &self,
        device_id: &str,
        mut change: impl FnMut(&mut DeviceRecord) -> Result<(bool, T), GatewayError>,
    ) -> Result<T, GatewayError> {
        for _ in 0..WRITE_ATTEMPTS {
            let stored = self
                .store
                .get(device_id)
                .await?
                .ok_or(GatewayError::DeviceNotFound)?;
            let mut record = from_value(&stored)?;
            let (write, answer) = change(&mut record)?;
            if !write
                || self
                    .store
                    .put_if(device_id, Some(&stored), &to_value(&record)?)
                    .await?
            {
                return Ok(answer);
            }
        }
        Err(GatewayError::Internal(format!(
            "device {device_id}'s record kept changing under {WRITE_ATTEMPTS} writes"
        )))
    }

    /// A new pairing code for `device_id` (replacing one it minted before) and when it expires.
    pub async fn mint_pair_code(
        &self,
        device_id: &str,
    ) -> Result<(String, DateTime<Utc>), GatewayError> {
        let code = new_code();
        let expires_at = Utc::now() + Duration::minutes(PAIR_CODE_MINUTES);
        let pairing = PairingCode {
            code_sha256: hex::encode(sha256(&code)),
            expires_at,
        };
        self.modify(device_id, |record| {
            record.pairing = Some(pairing.clone());
            Ok((true, ()))
        })
        .await?;
        Ok((code, expires_at))
    }

    /// Registers `device_id` under the owner of the device that minted `typed_code`, using the
    /// code up, and returns the new device's token. A code that is malformed, unknown, expired,
    /// used, or whose device is no longer signed in is [`GatewayError::InvalidPairCode`], one
    /// answer for all; an id already in use is [`GatewayError::DeviceAlreadyBound`] (or
    /// `DeviceRevoked`), and leaves the code usable.
    pub async fn register_paired(
        &self,
        device_id: &str,
        typed_code: &str,
    ) -> Result<String, GatewayError> {
        if !valid_device_id(device_id) {
            return Err(GatewayError::InvalidDeviceId);
        }
        let code = normalize_code(typed_code).ok_or(GatewayError::InvalidPairCode)?;
        let code_sha256 = hex::encode(sha256(&code));
        if let Some(stored) = self.store.get(device_id).await? {
            let existing = from_value(&stored)?;
            return Err(match existing.revoked_at {
                Some(_) => GatewayError::DeviceRevoked,
                None => GatewayError::DeviceAlreadyBound,
            });
        }
        let now = Utc::now();
        let minter = self
            .store
            .list()
            .await?
            .iter()
            .filter_map(|stored| from_value(stored).ok())
            .find(|record| {
                record
                    .pairing
                    .as_ref()
                    .is_some_and(|p| p.code_sha256 == code_sha256 && p.expires_at > now)
                    && record.token_live(now)
            })
            .ok_or(GatewayError::InvalidPairCode)?;
        // One use: the code is cleared by a write conditional on the record still holding it.
        let owner = self
            .modify(&minter.device_id, |record| {
                let holds = record
                    .pairing
                    .as_ref()
                    .is_some_and(|p| p.code_sha256 == code_sha256 && p.expires_at > now);
                if !holds {
                    return Err(GatewayError::InvalidPairCode);
                }
                record.pairing = None;
                Ok((true, record.owner().to_owned()))
            })
            .await?;
        let token = warren_http::secret::new_secret("wr_");
        let record = DeviceRecord {
            device_id: device_id.to_owned(),
            created_at: now,
            token_sha256: Some(hex::encode(sha256(&token))),
            last_used_at: Some(now),
            owner: Some(owner.clone()),
            revoked_at: None,
            pairing: None,
            push_subscriptions: Vec::new(),
        };
        if !self
            .store
            .put_if(device_id, None, &to_value(&record)?)
            .await?
        {
            return Err(GatewayError::DeviceAlreadyBound);
        }
        tracing::info!(%device_id, paired_by = %minter.device_id, %owner, "device paired");
        Ok(token)
    }

    /// The devices of `owner` that are not revoked, by id.
    async fn of_owner(&self, owner: &str) -> Result<Vec<DeviceRecord>, GatewayError> {
        let mut devices = Vec::new();
        for stored in self.store.list().await? {
            let record = from_value(&stored)?;
            if record.owner() == owner && record.revoked_at.is_none() {
                devices.push(record);
            }
        }
        devices.sort_by(|a, b| a.device_id.cmp(&b.device_id));
        Ok(devices)
    }

    /// The owner's devices as `GET /v1/devices` lists them.
    pub async fn list_owned(&self, me: &SignedIn) -> Result<Vec<OwnedDevice>, GatewayError> {
        let now = Utc::now();
        Ok(self
            .of_owner(&me.owner)
            .await?
            .into_iter()
            .map(|record| OwnedDevice {
                current: record.device_id == me.device_id,
                created_at: rfc3339(record.created_at),
                last_used_at: record.last_used_at.map(rfc3339),
                signed_in: record.token_live(now),
                push_subscriptions: record.push_subscriptions.len(),
                device_id: record.device_id,
            })
            .collect())
    }

    /// Revokes `device_id`, a device of `me`'s owner (`me` itself too): its token stops
    /// working at once, its pairing code and push subscriptions go, its id cannot register
    /// again. Another owner's device, or none, is [`GatewayError::DeviceNotFound`].
    pub async fn revoke(&self, me: &SignedIn, device_id: &str) -> Result<(), GatewayError> {
        let now = Utc::now();
        self.modify(device_id, |record| {
            if record.owner() != me.owner || record.revoked_at.is_some() {
                return Err(GatewayError::DeviceNotFound);
            }
            record.token_sha256 = None;
            record.revoked_at = Some(now);
            record.pairing = None;
            record.push_subscriptions.clear();
            Ok((true, ()))
        })
        .await?;
        tracing::info!(%device_id, by = %me.device_id, "device revoked");
        Ok(())
    }

    /// Adds a push subscription to `device_id`; the same endpoint again keeps its id and takes
    /// the new keys.
    pub async fn add_push_subscription(
        &self,
        device_id: &str,
        endpoint: &str,
        p256dh: &str,
        auth: &str,
    ) -> Result<StoredPushSubscription, GatewayError> {
        let fresh = StoredPushSubscription {
            id: warren_http::secret::new_secret("ps_")[..3 + 16].to_owned(),
            endpoint: endpoint.to_owned(),
            p256dh: p256dh.to_owned(),
            auth: auth.to_owned(),
            created_at: Utc::now(),
        };
        self.modify(device_id, |record| {
            let subscriptions = &mut record.push_subscriptions;
            if let Some(known) = subscriptions.iter_mut().find(|s| s.endpoint == endpoint) {
                known.p256dh = p256dh.to_owned();
                known.auth = auth.to_owned();
                return Ok((true, known.clone()));
            }
            subscriptions.push(fresh.clone());
            Ok((true, fresh.clone()))
        })
        .await
    }

    /// `device_id`'s push subscriptions.
    pub async fn push_subscriptions(
        &self,
        device_id: &str,
    ) -> Result<Vec<StoredPushSubscription>, GatewayError> {
        let stored = self
            .store
            .get(device_id)
            .await?
            .ok_or(GatewayError::DeviceNotFound)?;
        Ok(from_value(&stored)?.push_subscriptions)
    }

    /// Removes `device_id`'s subscription `id`; whether it had one.
    pub async fn remove_push_subscription(
        &self,
        device_id: &str,
        id: &str,
    ) -> Result<bool, GatewayError> {
        self.modify(device_id, |record| {
            let before = record.push_subscriptions.len();
            record.push_subscriptions.retain(|s| s.id != id);
            let removed = record.push_subscriptions.len() < before;
            Ok((removed, removed))
        })
        .await
    }

    /// Every subscription of `owner`'s signed-in devices.
    pub async fn owner_push_subscriptions(
        &self,
        owner: &str,
    ) -> Result<Vec<StoredPushSubscription>, GatewayError> {
        let now = Utc::now();
        Ok(self
            .of_owner(owner)
            .await?
            .into_iter()
            .filter(|record| record.token_live(now))
            .flat_map(|record| record.push_subscriptions)
            .collect())
    }

    /// Removes `endpoint` from every device (the push service said it is gone: 404 or 410).
    pub async fn remove_push_endpoint(&self, endpoint: &str) -> Result<(), GatewayError> {
        for stored in self.store.list().await? {
            let record = from_value(&stored)?;
            if record
                .push_subscriptions
                .iter()
                .any(|s| s.endpoint == endpoint)
            {
                self.modify(&record.device_id, |record| {
                    record.push_subscriptions.retain(|s| s.endpoint != endpoint);
                    Ok((true, ()))
                })
                .await?;
            }
        }
        Ok(())
    }
}

/// The routes of this module, documented.
pub fn routes() -> OpenApiRouter<Arc<Gateway>> {
    OpenApiRouter::new()
        .routes(routes!(mint_pair_code))
        .routes(routes!(list_devices))
        .routes(routes!(revoke_device))
}

/// The origin the request was made to (`https://host:port`), for the link back to the console:
/// https when the gateway serves TLS. `X-Forwarded-*` is not read (the gateway trusts no proxy).
pub fn request_origin(gateway: &Gateway, headers: &HeaderMap) -> Option<String> {
    let host = headers.get(header::HOST)?.to_str().ok()?;
    if host.is_empty() || host.contains(['/', '\\', '@', ' ']) {
        return None;
    }
    let scheme = match gateway.args.tls_cert.is_some() {
        true => "https",
        false => "http",
    };
    Some(format!("{scheme}://{host}"))
}

#[utoipa::path(
    post,
    path = "/v1/devices/pair",
    tag = "devices",
    security(("device_token" = [])),
    responses(
        (status = 201, description = "A pairing code for another browser: one use, 5 minutes; a new one replaces this device's previous code", body = PairCode),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 507, description = "STORAGE_FULL: the gateway's disk is full", body = ErrorBody),
    ),
)]
async fn mint_pair_code(
    axum::extract::State(gateway): axum::extract::State<Arc<Gateway>>,
    me: SignedIn,
    headers: HeaderMap,
) -> Result<Response, GatewayError> {
    gateway.engine.sessions.storage().check()?;
    let (code, expires_at) = gateway.devices.mint_pair_code(&me.device_id).await?;
    let shown = display_code(&code);
    let url = format!(
        "{}/#/pair/{shown}",
        request_origin(&gateway, &headers).unwrap_or_default()
    );
    let qr_svg = qrcode::QrCode::new(url.as_bytes())
        .map(|qr| {
            qr.render::<qrcode::render::svg::Color>()
                .min_dimensions(200, 200)
                .quiet_zone(true)
                .build()
        })
        .map_err(|e| {
            GatewayError::Internal(format!("the pairing URL does not fit a QR code: {e}"))
        })?;
    tracing::info!(device_id = %me.device_id, "pairing code minted");
    let body = PairCode {
        code: shown,
        url,
        expires_at: rfc3339(expires_at),
        qr_svg,
    };
    Ok((StatusCode::CREATED, axum::Json(body)).into_response())
}

#[utoipa::path(
    get,
    path = "/v1/devices",
    tag = "devices",
    security(("device_token" = [])),
    responses(
        (status = 200, description = "The devices that share this device's sessions (its owner's), revoked ones left out", body = OwnedDevices),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
    ),
)]
async fn list_devices(
    axum::extract::State(gateway): axum::extract::State<Arc<Gateway>>,
    me: SignedIn,
) -> Result<axum::Json<OwnedDevices>, GatewayError> {
    let devices = gateway.devices.list_owned(&me).await?;
    Ok(axum::Json(OwnedDevices { devices }))
}

#[utoipa::path(
    delete,
    path = "/v1/devices/{device_id}",
    tag = "devices",
    params(("device_id" = String, Path, description = "A device of this device's owner (this device too)")),
    security(("device_token" = [])),
    responses(
        (status = 204, description = "Revoked: its token stops working at once, its push subscriptions are gone, its id cannot register again; the sessions stay with the owner"),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 404, description = "DEVICE_NOT_FOUND: no device of this owner by that id", body = ErrorBody),
        (status = 507, description = "STORAGE_FULL: the gateway's disk is full", body = ErrorBody),
    ),
)]
async fn revoke_device(
    axum::extract::State(gateway): axum::extract::State<Arc<Gateway>>,
    me: SignedIn,
    Path(device_id): Path<String>,
) -> Result<StatusCode, GatewayError> {
    gateway.engine.sessions.storage().check()?;
    gateway.devices.revoke(&me, &device_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_eight_unambiguous_characters_and_typing_them_loosely_works() {
        for _ in 0..200 {
            let code = new_code();
            assert_eq!(code.len(), 8);
            assert!(code.bytes().all(|b| PAIR_ALPHABET.contains(&b)), "{code}");
            assert_eq!(
                normalize_code(&display_code(&code)).as_deref(),
                Some(&*code)
            );
        }
        for confusing in [b'0', b'O', b'1', b'I', b'L', b'U', b'V'] {
            assert!(!PAIR_ALPHABET.contains(&confusing), "{}", confusing as char);
        }
        let cases = [
            ("ABCD-EFGH", Some("ABCDEFGH")),
            ("abcd efgh", Some("ABCDEFGH")),
            (" abcdefgh ", Some("ABCDEFGH")),
            ("ABCD-EFG", None),
            ("ABCD-EFGHJ", None),
            ("ABCD-EFG0", None),
            ("ABCD-EFGÉ", None),
            ("", None),
        ];
        for (typed, want) in cases {
            assert_eq!(normalize_code(typed).as_deref(), want, "{typed:?}");
        }
    }
}
