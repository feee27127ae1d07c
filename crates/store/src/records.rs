//! Devices and preview tokens as JSON records (`devices`, `preview_tokens`): the gateway owns
//! their shape, this module only stores and finds them.
//!
//! Architecture Invariant: an expired preview token is never returned, whether or not its row
//! has been deleted yet; expiry is decided by the database's clock.

use crate::pg::{Store, StoreError};

impl Store {
    /// Creates or replaces the device's record.
    pub async fn put_device(&self, id: &str, record: &serde_json::Value) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO devices (id, record) VALUES ($1, $2)
                 ON CONFLICT (id) DO UPDATE SET record = EXCLUDED.record",
                &[&id, record],
            )
            .await?;
        Ok(())
    }

    /// The device's record, `None` when there is none.
    pub async fn device(&self, id: &str) -> Result<Option<serde_json::Value>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt("SELECT record FROM devices WHERE id = $1", &[&id])
            .await?;
        Ok(row.map(|row| row.try_get(0)).transpose()?)
    }

    /// Replaces the device's record only when the stored one is still `expected` (`None`: there
    /// is none yet), so two replicas registering one device id cannot both bind it. Returns
    /// whether the record was written.
    pub async fn put_device_if(
        &self,
        id: &str,
        expected: Option<&serde_json::Value>,
        record: &serde_json::Value,
    ) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let written = match expected {
            None => client
                .execute(
                    "INSERT INTO devices (id, record) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
                    &[&id, record],
                )
                .await?,
            Some(expected) => {
                client
                    .execute(
                        "UPDATE devices SET record = $3 WHERE id = $1 AND record = $2",
                        &[&id, expected, record],
                    )
                    .await?
            }
        };
        Ok(written == 1)
    }

    /// The id and record of the device whose record holds `token_sha256` (hex), `None` when
    /// none does. The caller still checks the token's liveness and compares in constant time.
    pub async fn device_by_token_hash(
        &self,
        token_sha256: &str,
    ) -> Result<Option<(String, serde_json::Value)>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT id, record FROM devices WHERE record->>'token_sha256' = $1",
                &[&token_sha256],
            )
            .await?;
        row.map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .transpose()
    }

    /// Every device's id and record, by id.
    pub async fn devices(&self) -> Result<Vec<(String, serde_json::Value)>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query("SELECT id, record FROM devices ORDER BY id", &[])
            .await?;
        rows.iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect()
    }

    /// Deletes the device's record; `false` when there was none.
    pub async fn delete_device(&self, id: &str) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let deleted = client
            .execute("DELETE FROM devices WHERE id = $1", &[&id])
            .await?;
        Ok(deleted == 1)
    }

    /// Creates or replaces the preview token with hash `token_hash`, valid until
    /// `expires_at_unix_ms` (milliseconds since the Unix epoch).
    pub async fn put_preview_token(
        &self,
        token_hash: &str,
        session_id: &str,
        record: &serde_json::Value,
        expires_at_unix_ms: i64,
    ) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO preview_tokens (token_hash, session_id, record, expires_at)
                 VALUES ($1, $2, $3, to_timestamp($4::bigint / 1000.0))
                 ON CONFLICT (token_hash) DO UPDATE SET
                     session_id = EXCLUDED.session_id,
                     record = EXCLUDED.record,
                     expires_at = EXCLUDED.expires_at",
                &[&token_hash, &session_id, record, &expires_at_unix_ms],
            )
            .await?;
        Ok(())
    }

    /// The unexpired preview token's session id and record; `None` when there is none or it
    /// has expired.
    pub async fn preview_token(
        &self,
        token_hash: &str,
    ) -> Result<Option<(String, serde_json::Value)>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT session_id, record FROM preview_tokens
                 WHERE token_hash = $1 AND expires_at > now()",
                &[&token_hash],
            )
            .await?;
        row.map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .transpose()
    }

    /// Deletes every preview token of the session, and every expired one; returns how many
    /// rows went.
    pub async fn delete_preview_tokens(&self, session_id: &str) -> Result<u64, StoreError> {
        let client = self.client().await?;
        Ok(client
            .execute(
                "DELETE FROM preview_tokens WHERE session_id = $1 OR expires_at <= now()",
                &[&session_id],
            )
            .await?)
    }

    /// Deletes the session's preview tokens whose record contains `record_subset` (JSON
    /// containment: `{"port": 3000}` is every token of that port), live or expired; returns how
    /// many rows went.
    pub async fn delete_preview_tokens_matching(
        &self,
        session_id: &str,
        record_subset: &serde_json::Value,
    ) -> Result<u64, StoreError> {
        let client = self.client().await?;
        Ok(client
            .execute(
                "DELETE FROM preview_tokens WHERE session_id = $1 AND record @> $2",
                &[&session_id, record_subset],
            )
            .await?)
    }
}
