//! Admission across replicas: sessions (the `sessions` table, with their device and JSON meta)
//! and brain slots (`brain_slots`), each counted against a per-device limit.
//!
//! Architecture Invariant: a device never holds more sessions or brain slots than its limit,
//! however many replicas admit at once. The count and the insert run in one transaction that
//! first takes a transaction advisory lock keyed on the device id, so two admissions of one
//! device are serialized and admissions of different devices are not.
//!
//! A brain slot belongs to the replica running the brain and expires with its ttl unless that
//! replica renews it ([`Store::renew_brain_slots`], which also writes back the row of a brain it
//! runs whose row went missing), so the slots of a dead replica free themselves. Each row
//! carries the token of its reservation: a release names it, so releasing an earlier
//! reservation of a session never frees a later one. `--max-brains` is per replica and is not counted here: the gateway checks it and
//! says [`Admit::ServerLimit`] itself.

use std::time::Duration;

use crate::pg::{Store, StoreError, millis, to_bigint};

/// The first keys of the transaction advisory locks of a device's sessions and brain slots (the
/// second is the hash of the device id).
const SESSIONS_LOCK_CLASS: i32 = 0x5741_0001;
const BRAIN_SLOTS_LOCK_CLASS: i32 = 0x5741_0002;

/// Whether a session or brain was admitted, or which limit refused it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    Admitted,
    /// The device already holds `limit`.
    DeviceLimit {
        limit: usize,
    },
    /// This replica already runs `limit` (said by the gateway, not the store).
    ServerLimit {
        limit: usize,
    },
}

impl Store {
    /// Records a new session of `device_id` when the device holds fewer than
    /// `sessions_per_device` sessions. An existing `session_id` is [`StoreError::Conflict`].
    pub async fn create_session_within(
        &self,
        session_id: &str,
        device_id: &str,
        meta: &serde_json::Value,
        sessions_per_device: usize,
    ) -> Result<Admit, StoreError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await?;
        transaction
            .execute(
                "SELECT pg_advisory_xact_lock($1, hashtext($2))",
                &[&SESSIONS_LOCK_CLASS, &device_id],
            )
            .await?;
        let n_sessions: i64 = transaction
            .query_one(
                "SELECT count(*) FROM sessions WHERE device_id = $1",
                &[&device_id],
            )
            .await?
            .try_get(0)?;
        if n_sessions >= to_bigint(sessions_per_device) {
            return Ok(Admit::DeviceLimit {
                limit: sessions_per_device,
            });
        }
        transaction
            .execute(
                "INSERT INTO sessions (id, device_id, meta) VALUES ($1, $2, $3)",
                &[&session_id, &device_id, meta],
            )
            .await?;
        transaction.commit().await?;
        Ok(Admit::Admitted)
    }

    /// Replaces the session's meta; `false` when there is no such session.
    pub async fn update_session_meta(
        &self,
        session_id: &str,
        meta: &serde_json::Value,
    ) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let updated = client
            .execute(
                "UPDATE sessions SET meta = $2 WHERE id = $1",
                &[&session_id, meta],
            )
            .await?;
        Ok(updated == 1)
    }

    /// Deletes the session's row (its events, lease, brain slot and preview tokens are deleted
    /// by their own calls); `false` when there was none.
    pub async fn delete_session(&self, session_id: &str) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let deleted = client
            .execute("DELETE FROM sessions WHERE id = $1", &[&session_id])
            .await?;
        Ok(deleted == 1)
    }

    /// Every session: id, device id and meta, oldest first.
    pub async fn load_sessions(
        &self,
    ) -> Result<Vec<(String, String, serde_json::Value)>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT id, device_id, meta FROM sessions ORDER BY created_at, id",
                &[],
            )
            .await?;
        rows.iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
            .collect()
    }

    /// The session's meta, `None` when there is no such session.
    pub async fn session_meta(
        &self,
        session_id: &str,
    ) -> Result<Option<serde_json::Value>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt("SELECT meta FROM sessions WHERE id = $1", &[&session_id])
            .await?;
        Ok(row.map(|row| row.try_get(0)).transpose()?)
    }

    /// Reserves a brain slot of `device_id` for the session on `replica_id` for `ttl`, when the
    /// device holds fewer than `brains_per_device` unexpired slots; the row carries `token`.
    /// The session's own slot is not counted: reserving again moves it to `replica_id`, gives
    /// it `token` and extends it.
    pub async fn reserve_brain(
        &self,
        slot: HeldSlot<'_>,
        replica_id: &str,
        brains_per_device: usize,
        ttl: Duration,
    ) -> Result<Admit, StoreError> {
        let mut client = self.client().await?;
        let transaction = client.transaction().await?;
        transaction
            .execute(
                "SELECT pg_advisory_xact_lock($1, hashtext($2))",
                &[&BRAIN_SLOTS_LOCK_CLASS, &slot.device_id],
            )
            .await?;
        let n_slots: i64 = transaction
            .query_one(
                "SELECT count(*) FROM brain_slots
                 WHERE device_id = $1 AND session_id <> $2 AND expires_at >= now()",
                &[&slot.device_id, &slot.session_id],
            )
            .await?
            .try_get(0)?;
        if n_slots >= to_bigint(brains_per_device) {
            return Ok(Admit::DeviceLimit {
                limit: brains_per_device,
            });
        }
        transaction
            .execute(
                "INSERT INTO brain_slots (session_id, device_id, replica_id, token, expires_at)
                 VALUES ($1, $2, $3, $4, now() + $5::bigint * interval '1 millisecond')
                 ON CONFLICT (session_id) DO UPDATE SET
                     device_id = EXCLUDED.device_id,
                     replica_id = EXCLUDED.replica_id,
                     token = EXCLUDED.token,
                     expires_at = EXCLUDED.expires_at",
                &[
                    &slot.session_id,
                    &slot.device_id,
                    &replica_id,
                    &slot.token,
                    &millis(ttl),
                ],
            )
            .await?;
        transaction.commit().await?;
        Ok(Admit::Admitted)
    }

    /// The brain slots `replica_id` holds, each extended by `ttl` from now (and written back
    /// when its row went missing or names another reservation: the replica runs those brains,
    /// so they count). Returns how many rows were written.
    pub async fn renew_brain_slots(
        &self,
        replica_id: &str,
        slots: &[HeldSlot<'_>],
        ttl: Duration,
    ) -> Result<u64, StoreError> {
        if slots.is_empty() {
            return Ok(0);
        }
        let sessions: Vec<&str> = slots.iter().map(|slot| slot.session_id).collect();
        let devices: Vec<&str> = slots.iter().map(|slot| slot.device_id).collect();
        let tokens: Vec<&str> = slots.iter().map(|slot| slot.token).collect();
        let client = self.client().await?;
        Ok(client
            .execute(
                "INSERT INTO brain_slots (session_id, device_id, replica_id, token, expires_at)
                 SELECT held.session_id, held.device_id, $1, held.token,
                        now() + $5::bigint * interval '1 millisecond'
                 FROM unnest($2::text[], $3::text[], $4::text[])
                     AS held (session_id, device_id, token)
                 ON CONFLICT (session_id) DO UPDATE SET
                     device_id = EXCLUDED.device_id,
                     replica_id = EXCLUDED.replica_id,
                     token = EXCLUDED.token,
                     expires_at = EXCLUDED.expires_at",
                &[&replica_id, &sessions, &devices, &tokens, &millis(ttl)],
            )
            .await?)
    }

    /// Frees the session's brain slot when its row still carries `token` (a later reservation
    /// of the session stays); `false` when it had none.
    pub async fn release_brain(&self, session_id: &str, token: &str) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let deleted = client
            .execute(
                "DELETE FROM brain_slots WHERE session_id = $1 AND token = $2",
                &[&session_id, &token],
            )
            .await?;
        Ok(deleted == 1)
    }

    /// Frees every brain slot of `replica_id` (a replica shutting down); returns how many.
    pub async fn release_replica_brains(&self, replica_id: &str) -> Result<u64, StoreError> {
        let client = self.client().await?;
        Ok(client
            .execute(
                "DELETE FROM brain_slots WHERE replica_id = $1",
                &[&replica_id],
            )
            .await?)
    }
}

/// One brain slot as the store keeps it: the session running the brain, its device, and the
/// token of the reservation.
#[derive(Debug, Clone, Copy)]
pub struct HeldSlot<'a> {
    pub session_id: &'a str,
    pub device_id: &'a str,
    pub token: &'a str,
}
