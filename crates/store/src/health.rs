//! [`StorageHealth`]: the one record of whether the gateway can currently write what it keeps
//! (what `/healthz` reports, and what refuses new work while the disk is full or the database
//! away).

use std::io;
use std::sync::Mutex;

use crate::file::{is_storage_full, now_rfc3339};

/// Why [`StorageHealth::check`] refuses new work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The disk (or the quota) is full.
    #[error("the data directory is full")]
    Full,
    /// The PostgreSQL store cannot be reached.
    #[error("store unavailable: {0}")]
    Unavailable(String),
}

/// Why the gateway's storage is failing, as `/healthz` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageFailure {
    /// The disk or quota is full (rather than some other write error).
    pub full: bool,
    /// The PostgreSQL store cannot be reached (`--store postgres://…`).
    pub store_unavailable: bool,
    /// The error, without paths: `/healthz` answers anyone.
    pub message: String,
    /// When the failure was first reported (RFC 3339).
    pub since: String,
}

/// Whether the gateway can write its data directory. An event log that cannot write reports
/// here; the storage watch (see `sessions`) probes for space, lets the logs write again and
/// clears the failure. While the disk is full, new messages, sessions and devices are refused
/// at once ([`StorageHealth::check`]) instead of being accepted and then lost.
#[derive(Default)]
pub struct StorageHealth {
    state: Mutex<HealthState>,
    reported: tokio::sync::Notify,
}

#[derive(Default)]
struct HealthState {
    failure: Option<StorageFailure>,
    /// Bumped by every report, so a recovery that raced a new failure does not clear it.
    n_reports: u64,
}

impl StorageHealth {
    fn lock(&self) -> std::sync::MutexGuard<'_, HealthState> {
        // Every update is a single assignment; a poisoned lock still holds a valid state.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records that a write failed with `error` and wakes the storage watch.
    pub fn report(&self, error: &io::Error) {
        {
            let mut state = self.lock();
            state.n_reports += 1;
            let full = is_storage_full(error);
            let store_unavailable = crate::pg::is_store_unavailable(error);
            let since = match &state.failure {
                Some(failure) => failure.since.clone(),
                None => now_rfc3339(),
            };
            let message = if store_unavailable {
                "cannot reach the store".to_string()
            } else {
                format!("cannot write the data directory: {error}")
            };
            state.failure = Some(StorageFailure {
                full,
                store_unavailable,
                message,
                since,
            });
        }
        self.reported.notify_one();
    }

    /// The current failure, if any.
    pub fn failure(&self) -> Option<StorageFailure> {
        self.lock().failure.clone()
    }

    /// Refuses new work (a message, a session, a device) while the disk is full or the store
    /// cannot be reached.
    pub fn check(&self) -> Result<(), Refusal> {
        match &self.lock().failure {
            Some(failure) if failure.full => Err(Refusal::Full),
            Some(failure) if failure.store_unavailable => {
                Err(Refusal::Unavailable(failure.message.clone()))
            }
            _ => Ok(()),
        }
    }

    /// The number of reports so far; pass it to [`StorageHealth::recovered`].
    pub fn n_reports(&self) -> u64 {
        self.lock().n_reports
    }

    /// Clears the failure unless another report came in since `n_reports` was read. Returns
    /// whether the storage is healthy now.
    pub fn recovered(&self, n_reports: u64) -> bool {
        let mut state = self.lock();
        if state.n_reports == n_reports {
            state.failure = None;
        }
        state.failure.is_none()
    }

    /// Resolves at the next report (at once if one came in since the last call).
    pub async fn next_report(&self) {
        self.reported.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recovery_that_raced_a_new_report_keeps_the_failure() {
        let full = || io::Error::from_raw_os_error(28);
        let health = StorageHealth::default();
        assert!(health.check().is_ok());
        health.report(&full());
        let failure = health.failure().expect("reported");
        assert!(failure.full, "{failure:?}");
        assert_eq!(health.check(), Err(Refusal::Full));
        let seen = health.n_reports();
        health.report(&full());
        assert!(!health.recovered(seen), "a later report is not cleared");
        assert!(health.recovered(health.n_reports()));
        assert!(health.check().is_ok());
    }
}
