//! Replicas: gateways sharing one PostgreSQL store (`--store postgres://…`), each owning the
//! sessions whose lease it holds, and forwarding every other session's owner-bound requests to
//! the replica that owns it (scale-out.md "One owner per session").
//!
//! Architecture Invariant: a replica runs a session's brain, hands and appends only while it
//! holds the session's lease (see `warren_store::leases`: taken and renewed on the database's
//! clock). A replica that does not own a session keeps its event log as a follower (the notices
//! of the store drive [`EventLog::follow`](crate::event_log::EventLog::follow)), so an SSE
//! client may stream any session from any replica; every other route of a session is the
//! owner's (the HTTP layer forwards it there, see `owner`).
//!
//! Failover: while the owner's lease runs, a request it cannot answer (its replica is gone) is
//! 503 `OWNER_UNAVAILABLE` with `Retry-After` (the lease's time left). Once the lease expired,
//! the next owner-bound request takes it ([`route`]): the new owner catches its log up, closes
//! the turn the old owner left running `interrupted` (exactly once: taking the lease is
//! exclusive, and one takeover runs at a time), adopts the hands, and the next message starts a
//! brain that resumes the ACP session.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use warren_store::leases::{Acquired, Lease};
use warren_store::pg::Store;

use crate::engine::Engine;
use crate::engine_error::EngineError;
use crate::event_log::EventLog;
use crate::session::{OpenTurns, Session};

/// The `status` message of a turn closed by a takeover.
const TAKEOVER_MESSAGE: &str =
    "the replica that ran this session stopped; the running turn was interrupted";

/// This replica's identity and the leases it holds.
pub struct Replicas {
    store: Store,
    pub id: String,
    pub url: String,
    pub ttl: Duration,
    held: Mutex<HashMap<String, Lease>>,
    /// One takeover at a time, so a turn left open is closed once.
    takeover: tokio::sync::Mutex<()>,
}

/// Where an owner-bound request of a session is served.
pub enum Route {
    Here,
    /// Another replica holds the lease for `expires_in` more.
    There {
        url: String,
        expires_in: Duration,
    },
}

impl Replicas {
    pub fn new(store: Store, id: String, url: String, ttl: Duration) -> Arc<Replicas> {
        Arc::new(Replicas {
            store,
            id,
            url,
            ttl,
            held: Mutex::new(HashMap::new()),
            takeover: tokio::sync::Mutex::new(()),
        })
    }

    fn held(&self) -> MutexGuard<'_, HashMap<String, Lease>> {
        // Inserts and removes are single operations.
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether this replica holds the session's lease.
    pub fn holds(&self, session_id: &str) -> bool {
        self.held().contains_key(session_id)
    }

    /// Takes (or renews) the session's lease when it is free, expired or ours. Returns whether
    /// this replica owns it now and, if so, which replica it was taken from.
    pub async fn acquire(&self, session: &Session) -> Result<Acquired, EngineError> {
        let acquired = self
            .store
            .acquire_lease(&session.id, &self.id, &self.url, self.ttl)
            .await?;
        if let Acquired::Owned { lease, .. } = &acquired {
            // From now on the session's appends are this lease's: once another replica takes
            // it, none of this one's can land after the new owner's.
            session.log.set_fence(lease.clone());
            self.held().insert(session.id.clone(), lease.clone());
        }
        Ok(acquired)
    }

    /// Gives the session's lease up (deleted, or this replica stops).
    pub async fn release(&self, session_id: &str) {
        let Some(lease) = self.held().remove(session_id) else {
            return;
        };
        if let Err(e) = self.store.release_lease(&lease).await {
            tracing::warn!(session = %session_id, error = %e, "lease not released; it expires by itself");
        }
    }

    /// Gives every lease up (graceful stop), so another replica takes the sessions at once.
    pub async fn release_all(&self) {
        let ids: Vec<String> = self.held().keys().cloned().collect();
        for id in ids {
            self.release(&id).await;
        }
    }

    /// Renews every lease held; returns the sessions whose lease another replica took.
    async fn renew_all(&self) -> Vec<String> {
        let leases: Vec<Lease> = self.held().values().cloned().collect();
        let mut lost = Vec::new();
        for lease in leases {
            match self.store.renew_lease(&lease, self.ttl).await {
                Ok(true) => {}
                Ok(false) => {
                    self.held().remove(&lease.session_id);
                    lost.push(lease.session_id);
                }
                // The store is away: the lease may still be ours; the next round tells.
                Err(e) => {
                    tracing::warn!(session = %lease.session_id, error = %e, "lease not renewed")
                }
            }
        }
        lost
    }
}

/// How often the leases are renewed: a third of their ttl, so two renewals can fail in a row.
fn renew_period(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(100))
}

/// Renews this replica's leases until the gateway goes away; a session whose lease was lost
/// (this replica stalled past its ttl and another took it) stops its brain here and stays as a
/// follower.
pub fn spawn_lease_renewal(gateway: &Arc<Engine>) {
    let Some(replicas) = gateway.replicas.clone() else {
        return;
    };
    let weak = Arc::downgrade(gateway);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(renew_period(replicas.ttl));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if weak.strong_count() == 0 {
                return;
            }
            if let Some(gateway) = weak.upgrade() {
                gateway.sessions.admission().renew_in_store().await;
            }
            for lost in replicas.renew_all().await {
                tracing::warn!(session = %lost, "another replica took this session's lease");
                let Some(gateway) = weak.upgrade() else {
                    return;
                };
                if let Some(session) = gateway.sessions.by_id(&lost) {
                    session.hands.wake_for_brain_stop().await;
                    session.retire_for_shutdown().stop().await;
                }
            }
        }
    });
}

/// Publishes, on this replica, what the owners of the sessions it follows commit: each notice
/// of the store makes the session's log read its new rows; a reconnect of the listener (notices
/// may have been missed) makes every followed log read.
pub fn spawn_follower(gateway: &Arc<Engine>) {
    let (Some(replicas), Some(store)) = (gateway.replicas.clone(), gateway.sessions.store()) else {
        return;
    };
    let store = store.clone();
    let weak = Arc::downgrade(gateway);
    tokio::spawn(async move {
        let notices = store.listen().await;
        let mut received = notices.subscribe();
        loop {
            let notice = received.recv().await;
            let Some(gateway) = weak.upgrade() else {
                return;
            };
            let sessions: Vec<Arc<Session>> = match notice {
                Ok(warren_store::events::Notice::Appended { session_id, .. }) => {
                    gateway.sessions.by_id(&session_id).into_iter().collect()
                }
                Ok(warren_store::events::Notice::Reconnected)
                | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    gateway.sessions.all()
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            };
            for session in sessions {
                if replicas.holds(&session.id) {
                    continue;
                }
                if let Err(e) = session.follow().await {
                    tracing::debug!(session = %session.id, error = %e, "followed log not read yet");
                }
            }
        }
    });
}

/// Where an owner-bound request of `session` is served; takes the session over when its lease
/// expired.
pub async fn route(gateway: &Arc<Engine>, session: &Arc<Session>) -> Result<Route, EngineError> {
    let Some(replicas) = &gateway.replicas else {
        return Ok(Route::Here);
    };
    if replicas.holds(&session.id) {
        return Ok(Route::Here);
    }
    let _one_at_a_time = replicas.takeover.lock().await;
    if replicas.holds(&session.id) {
        return Ok(Route::Here);
    }
    match replicas.acquire(session).await? {
        Acquired::Owned { took_over_from, .. } => {
            tracing::info!(session = %session.id, from = ?took_over_from, "session taken over");
            take_over(session).await?;
            Ok(Route::Here)
        }
        Acquired::HeldBy {
            replica_url,
            expires_in,
            ..
        } => Ok(Route::There {
            url: replica_url,
            expires_in,
        }),
    }
}

/// Makes this replica the session's owner: its meta is the one the old owner stored (so the
/// next brain resumes the agent's ACP session), its log reads everything committed, the turns
/// the old owner left open are closed `interrupted`, and the hands are adopted.
async fn take_over(session: &Arc<Session>) -> Result<(), EngineError> {
    session.reload_meta().await?;
    session.log.follow().await?;
    session.adopt_history(scan_history(&session.log).await?);
    if session.has_turns_left_open() {
        session.close_open_turns(Some("idle"), TAKEOVER_MESSAGE)?;
        session.log.sync().await?;
    }
    session.hands.adopt().await;
    Ok(())
}

/// The open turns, last turn and usage of everything the log holds.
async fn scan_history(log: &EventLog) -> std::io::Result<OpenTurns> {
    const PAGE: usize = 512;
    let mut open_turns = OpenTurns::default();
    let mut after = 0;
    loop {
        let page = log.read_after(after, PAGE).await?;
        let Some(last) = page.last() else {
            return Ok(open_turns);
        };
        after = last.seq;
        for stored in &page {
            match serde_json::from_str::<warren_protocol::gateway::Event>(&stored.json) {
                Ok(event) => open_turns.visit(event.turn, &event.body),
                Err(e) => {
                    tracing::warn!(seq = stored.seq, error = %e, "a stored event does not parse")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewals_come_three_times_a_ttl() {
        assert_eq!(
            renew_period(Duration::from_secs(15)),
            Duration::from_secs(5)
        );
        assert_eq!(
            renew_period(Duration::from_millis(90)),
            Duration::from_millis(100)
        );
    }
}
