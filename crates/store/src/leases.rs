//! Session leases: which replica owns a session (runs its brain), in the `leases` table, so any
//! replica can forward owner-only requests to the owner's `replica_url`.
//!
//! Architecture Invariant: at most one replica holds an unexpired lease of a session. Taking and
//! renewing are single conditional statements that compare `expires_at` with the database's
//! `now()`, never a replica's clock, so clock skew between replicas cannot make two owners.
//!
//! Architecture Invariant: a lease's `epoch` only grows. It increases each time another replica
//! takes the session and stays the same when the holder renews or re-acquires; a released lease
//! keeps its row (expired at `-infinity`) so the next owner continues the epoch rather than
//! starting again at 1. An owner whose renewal says `false` has lost the session and must stop
//! its brain.

use std::time::Duration;

use crate::pg::{Store, StoreError, millis};

/// How often [`Store::acquire_lease`] retries when the holder it was refused by is gone by the
/// time it reads who holds the lease.
const ACQUIRE_ATTEMPTS: usize = 5;

/// A lease this replica holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub session_id: String,
    pub replica_id: String,
    pub epoch: i64,
}

/// The answer of [`Store::acquire_lease`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// This replica owns the session. `took_over_from` names the replica whose expired lease
    /// was taken (its running turn, if any, must be closed as interrupted); `None` when the
    /// session was free, released, or already ours.
    Owned {
        lease: Lease,
        took_over_from: Option<String>,
    },
    /// Another replica owns the session for `expires_in` more.
    HeldBy {
        replica_id: String,
        replica_url: String,
        expires_in: Duration,
    },
}

impl Store {
    /// Takes or renews the session's lease for `ttl` when it is free, expired, released or
    /// already this replica's; otherwise says who holds it.
    pub async fn acquire_lease(
        &self,
        session_id: &str,
        replica_id: &str,
        replica_url: &str,
        ttl: Duration,
    ) -> Result<Acquired, StoreError> {
        let client = self.client().await?;
        let ttl_ms = millis(ttl);
        for _ in 0..ACQUIRE_ATTEMPTS {
            // `leases.*` in DO UPDATE is the current row (locked), so the epoch and the
            // previous holder are decided on the row that is replaced, race-free.
            let taken = client
                .query_opt(
                    "INSERT INTO leases AS l (session_id, replica_id, replica_url, epoch, expires_at)
                     VALUES ($1, $2, $3, 1, now() + $4::bigint * interval '1 millisecond')
                     ON CONFLICT (session_id) DO UPDATE SET
                         replica_id = EXCLUDED.replica_id,
                         replica_url = EXCLUDED.replica_url,
                         epoch = CASE WHEN l.replica_id = EXCLUDED.replica_id THEN l.epoch
                                      ELSE l.epoch + 1 END,
                         expires_at = EXCLUDED.expires_at,
                         took_over_from = CASE
                             WHEN l.replica_id <> EXCLUDED.replica_id
                                  AND l.expires_at <> '-infinity' THEN l.replica_id
                         END
                     WHERE l.replica_id = EXCLUDED.replica_id OR l.expires_at < now()
                     RETURNING epoch, took_over_from",
                    &[&session_id, &replica_id, &replica_url, &ttl_ms],
                )
                .await?;
            if let Some(row) = taken {
                return Ok(Acquired::Owned {
                    lease: Lease {
                        session_id: session_id.to_owned(),
                        replica_id: replica_id.to_owned(),
                        epoch: row.try_get(0)?,
                    },
                    took_over_from: row.try_get(1)?,
                });
            }
            let holder = client
                .query_opt(
                    "SELECT replica_id, replica_url,
                            (extract(epoch FROM expires_at - now()) * 1000)::bigint
                     FROM leases WHERE session_id = $1 AND expires_at >= now()",
                    &[&session_id],
                )
                .await?;
            if let Some(row) = holder {
                let left_ms: i64 = row.try_get(2)?;
                return Ok(Acquired::HeldBy {
                    replica_id: row.try_get(0)?,
                    replica_url: row.try_get(1)?,
                    expires_in: Duration::from_millis(u64::try_from(left_ms).unwrap_or(0)),
                });
            }
            // The holder's lease expired or was released between the two statements: try again.
        }
        Err(StoreError::Unavailable(format!(
            "the lease of {session_id} changed hands {ACQUIRE_ATTEMPTS} times while being acquired"
        )))
    }

    /// Extends `lease` by `ttl` from now. `false` when the lease is lost: another replica took
    /// it (its epoch changed) or it was released. A lease that expired but was not taken is
    /// still this replica's and is renewed.
    pub async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let renewed = client
            .execute(
                "UPDATE leases SET expires_at = now() + $4::bigint * interval '1 millisecond'
                 WHERE session_id = $1 AND replica_id = $2 AND epoch = $3
                   AND expires_at <> '-infinity'",
                &[
                    &lease.session_id,
                    &lease.replica_id,
                    &lease.epoch,
                    &millis(ttl),
                ],
            )
            .await?;
        Ok(renewed == 1)
    }

    /// Gives the lease up so any replica may take it at once; a lease already lost is left
    /// alone. Returns whether it was still held.
    pub async fn release_lease(&self, lease: &Lease) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let released = client
            .execute(
                "UPDATE leases SET expires_at = '-infinity'
                 WHERE session_id = $1 AND replica_id = $2 AND epoch = $3",
                &[&lease.session_id, &lease.replica_id, &lease.epoch],
            )
            .await?;
        Ok(released == 1)
    }

    /// Who holds the session's lease: replica id, replica URL and the time left (`None` when it
    /// has expired and nobody took it yet). `None` when nobody holds or held it (never taken, or
    /// released).
    pub async fn lease_holder(
        &self,
        session_id: &str,
    ) -> Result<Option<(String, String, Option<Duration>)>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT replica_id, replica_url,
                        CASE WHEN expires_at >= now()
                             THEN (extract(epoch FROM expires_at - now()) * 1000)::bigint END
                 FROM leases WHERE session_id = $1 AND expires_at <> '-infinity'",
                &[&session_id],
            )
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let left_ms: Option<i64> = row.try_get(2)?;
        Ok(Some((
            row.try_get(0)?,
            row.try_get(1)?,
            left_ms.map(|left_ms| Duration::from_millis(u64::try_from(left_ms).unwrap_or(0))),
        )))
    }
}
