//! Quotas and server-wide limits: per device 20 sessions and 4 running brains, server-wide
//! `--max-brains`. Checking and reserving is one step under one lock, and a reservation is a
//! guard that gives its slot back when dropped, so a slot can neither leak nor be counted twice.
//! Over a limit the answer is an immediate error (429), never a queue.
//!
//! With a PostgreSQL store a device's brains are counted across replicas too (scale-out.md
//! "Admission"): before a session takes a brain slot, a [`StoreTicket`] reserves its row in
//! `brain_slots` (count and insert in one transaction), and every slot this replica holds is
//! listed with the token of its row, renewed with the leases and released when the slot goes.
//! `--max-brains` stays per replica.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use warren_store::admission::{Admit, HeldSlot};
use warren_store::pg::Store;

use crate::engine_error::EngineError;

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub sessions_per_device: usize,
    pub brains_per_device: usize,
    pub max_brains: usize,
}

impl Limits {
    pub fn new(max_brains: usize) -> Limits {
        Limits {
            sessions_per_device: 20,
            brains_per_device: 4,
            max_brains,
        }
    }
}

#[derive(Default)]
struct Usage {
    n_sessions: usize,
    n_brains: usize,
}

#[derive(Default)]
struct State {
    per_device: HashMap<String, Usage>,
    n_brains: usize,
}

pub struct Admission {
    limits: Limits,
    state: Mutex<State>,
    in_store: OnceLock<InStore>,
}

/// The brain slots of this replica as rows of the store's `brain_slots`.
struct InStore {
    store: Store,
    replica_id: String,
    ttl: Duration,
    /// Every slot held here, by a number of its own (a session's slot and a late one of the
    /// same session, about to go, may overlap).
    held: Mutex<HashMap<u64, Held>>,
    next_slot: AtomicU64,
}

/// A slot held here as the store has it: its session, device and the token its row carries.
struct Held {
    session_id: String,
    device_id: String,
    token: String,
}

impl InStore {
    fn held(&self) -> MutexGuard<'_, HashMap<u64, Held>> {
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Deletes the session's row if it still carries `token`, off the caller's thread (a slot
    /// is dropped under locks). Without a runtime the row expires by itself.
    fn release(&self, session_id: String, token: String) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.store.clone();
        runtime.spawn(async move {
            if let Err(e) = store.release_brain(&session_id, &token).await {
                tracing::warn!(session = %session_id, error = %e, "brain slot not released; it expires by itself");
            }
        });
    }
}

/// A brain slot reserved in the store for one session: it becomes that session's
/// [`BrainSlot`]; dropped unused, its row is released, or left to the slot the session already
/// holds (the row now carries this ticket's token).
pub struct StoreTicket {
    admission: Arc<Admission>,
    session_id: String,
    token: Option<String>,
}

impl Drop for StoreTicket {
    fn drop(&mut self) {
        let (Some(token), Some(in_store)) = (self.token.take(), self.admission.in_store.get())
        else {
            return;
        };
        let mut held = in_store.held();
        let mut of_session = held
            .values_mut()
            .filter(|held| held.session_id == self.session_id)
            .peekable();
        if of_session.peek().is_none() {
            drop(held);
            in_store.release(self.session_id.clone(), token);
            return;
        }
        for held in of_session {
            held.token = token.clone();
        }
    }
}

/// One session counted against its device's quota until dropped.
pub struct SessionSlot {
    admission: Arc<Admission>,
    device_id: String,
}

/// One running brain counted against its device and the server until dropped (and, with a
/// store, listed under its session for the store's count).
pub struct BrainSlot {
    admission: Arc<Admission>,
    device_id: String,
    /// The number it is held under in the store's count.
    held_id: Option<u64>,
}

impl Admission {
    pub fn new(limits: Limits) -> Arc<Admission> {
        Arc::new(Admission {
            limits,
            state: Mutex::new(State::default()),
            in_store: OnceLock::new(),
        })
    }

    /// From now on brain slots are also counted in `store`, as `replica_id`'s, each row living
    /// `ttl` unless renewed ([`Admission::renew_in_store`]).
    pub fn count_brains_in(&self, store: Store, replica_id: String, ttl: Duration) {
        let _ = self.in_store.set(InStore {
            store,
            replica_id,
            ttl,
            held: Mutex::default(),
            next_slot: AtomicU64::new(0),
        });
    }

    /// With a store: reserves a brain slot of `device_id` for `session_id` there, or says the
    /// device runs its limit of brains on the replicas together (429). `None` without a store.
    pub async fn ticket(
        self: &Arc<Self>,
        session_id: &str,
        device_id: &str,
    ) -> Result<Option<StoreTicket>, EngineError> {
        let Some(in_store) = self.in_store.get() else {
            return Ok(None);
        };
        let token = uuid::Uuid::new_v4().simple().to_string();
        let slot = HeldSlot {
            session_id,
            device_id,
            token: &token,
        };
        let limit = self.limits.brains_per_device;
        match in_store
            .store
            .reserve_brain(slot, &in_store.replica_id, limit, in_store.ttl)
            .await?
        {
            Admit::Admitted => Ok(Some(StoreTicket {
                admission: self.clone(),
                session_id: session_id.to_owned(),
                token: Some(token),
            })),
            _ => Err(EngineError::QuotaExceeded(format!(
                "a device may run {limit} brains at once"
            ))),
        }
    }

    /// Extends the store's rows of every brain slot held here (writing back any that went
    /// missing): called with the lease renewals.
    pub async fn renew_in_store(&self) {
        let Some(in_store) = self.in_store.get() else {
            return;
        };
        // One row per session: of overlapping slots, the newest.
        let mut by_session: HashMap<String, (u64, String, String)> = HashMap::new();
        for (&id, held) in in_store.held().iter() {
            let newest = by_session
                .get(&held.session_id)
                .is_none_or(|(other, _, _)| *other < id);
            if newest {
                let row = (id, held.device_id.clone(), held.token.clone());
                by_session.insert(held.session_id.clone(), row);
            }
        }
        let slots: Vec<HeldSlot<'_>> = by_session
            .iter()
            .map(|(session_id, (_, device_id, token))| HeldSlot {
                session_id,
                device_id,
                token,
            })
            .collect();
        if let Err(e) = in_store
            .store
            .renew_brain_slots(&in_store.replica_id, &slots, in_store.ttl)
            .await
        {
            tracing::warn!(error = %e, "brain slots not renewed");
        }
    }

    /// Frees every row of this replica's brain slots (a graceful stop).
    pub async fn release_all_in_store(&self) {
        let Some(in_store) = self.in_store.get() else {
            return;
        };
        if let Err(e) = in_store
            .store
            .release_replica_brains(&in_store.replica_id)
            .await
        {
            tracing::warn!(error = %e, "brain slots not released; they expire by themselves");
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Counters are updated in single statements; a poisoned lock still holds valid counts.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Reserves a session and, when the limits allow, a brain for it, in one step. Without a
    /// store only: with one, the brain is reserved after the session's row
    /// ([`Admission::ticket`], then [`Admission::reserve_brain`]).
    pub fn reserve_session(
        self: &Arc<Self>,
        device_id: &str,
        with_brain: bool,
    ) -> Result<(SessionSlot, Option<BrainSlot>), EngineError> {
        let mut state = self.lock();
        let usage = state.per_device.entry(device_id.to_string()).or_default();
        if usage.n_sessions >= self.limits.sessions_per_device {
            return Err(EngineError::QuotaExceeded(format!(
                "a device may hold {} sessions",
                self.limits.sessions_per_device
            )));
        }
        let session = self.count_session(&mut state, device_id);
        let brain = if with_brain {
            self.try_brain(&mut state, device_id, None).ok()
        } else {
            None
        };
        Ok((session, brain))
    }

    /// Counts a session that already exists on disk (loaded at start), or one the store has
    /// just admitted (the store's count is the quota then), even over the local quota.
    pub fn adopt_session(self: &Arc<Self>, device_id: &str) -> SessionSlot {
        self.count_session(&mut self.lock(), device_id)
    }

    /// Counts one more session of `device_id`; the slot uncounts it when dropped.
    fn count_session(self: &Arc<Self>, state: &mut State, device_id: &str) -> SessionSlot {
        state
            .per_device
            .entry(device_id.to_string())
            .or_default()
            .n_sessions += 1;
        SessionSlot {
            admission: self.clone(),
            device_id: device_id.to_string(),
        }
    }

    /// Reserves a running brain for `session_id`, one of `device_id`'s sessions, with the
    /// store's `ticket` for it when there is a store. (A slot taken there without a ticket is
    /// written to the store at the next renewal.)
    pub fn reserve_brain(
        self: &Arc<Self>,
        device_id: &str,
        session_id: &str,
        ticket: Option<StoreTicket>,
    ) -> Result<BrainSlot, EngineError> {
        let mut state = self.lock();
        self.try_brain(&mut state, device_id, Some((session_id, ticket)))
    }

    fn try_brain(
        self: &Arc<Self>,
        state: &mut State,
        device_id: &str,
        for_session: Option<(&str, Option<StoreTicket>)>,
    ) -> Result<BrainSlot, EngineError> {
        if state.n_brains >= self.limits.max_brains {
            return Err(EngineError::ServerBusy(format!(
                "the server runs its maximum of {} brains",
                self.limits.max_brains
            )));
        }
        let usage = state.per_device.entry(device_id.to_string()).or_default();
        if usage.n_brains >= self.limits.brains_per_device {
            return Err(EngineError::QuotaExceeded(format!(
                "a device may run {} brains at once",
                self.limits.brains_per_device
            )));
        }
        usage.n_brains += 1;
        state.n_brains += 1;
        let mut held_id = None;
        if let (Some(in_store), Some((session, ticket))) = (self.in_store.get(), for_session) {
            let token = ticket
                .and_then(|mut ticket| ticket.token.take())
                .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
            let id = in_store.next_slot.fetch_add(1, Ordering::Relaxed);
            let held = Held {
                session_id: session.to_owned(),
                device_id: device_id.to_owned(),
                token,
            };
            in_store.held().insert(id, held);
            held_id = Some(id);
        }
        Ok(BrainSlot {
            admission: self.clone(),
            device_id: device_id.to_string(),
            held_id,
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn n_brains(&self) -> usize {
        self.lock().n_brains
    }
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        let mut state = self.admission.lock();
        if let Some(usage) = state.per_device.get_mut(&self.device_id) {
            usage.n_sessions = usage.n_sessions.saturating_sub(1);
        }
    }
}

impl Drop for BrainSlot {
    fn drop(&mut self) {
        let mut state = self.admission.lock();
        state.n_brains = state.n_brains.saturating_sub(1);
        if let Some(usage) = state.per_device.get_mut(&self.device_id) {
            usage.n_brains = usage.n_brains.saturating_sub(1);
        }
        drop(state);
        if let (Some(in_store), Some(id)) = (self.admission.in_store.get(), self.held_id) {
            // The row goes if it is still this slot's: a newer slot of the session has its own
            // token there, or shares this one.
            let mut all_held = in_store.held();
            let Some(gone) = all_held.remove(&id) else {
                return;
            };
            let shared = all_held
                .values()
                .any(|held| held.session_id == gone.session_id && held.token == gone.token);
            drop(all_held);
            if !shared {
                in_store.release(gone.session_id, gone.token);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_quota_and_brain_limits_are_reserved_and_released() {
        let admission = Admission::new(Limits {
            sessions_per_device: 2,
            brains_per_device: 1,
            max_brains: 2,
        });
        let (a, brain_a) = admission.reserve_session("dev-a", true).expect("first");
        assert!(brain_a.is_some());
        let (_b, brain_b) = admission.reserve_session("dev-a", true).expect("second");
        assert!(
            brain_b.is_none(),
            "device brain limit reached, session created without one"
        );
        assert!(matches!(
            admission.reserve_session("dev-a", true),
            Err(EngineError::QuotaExceeded(_))
        ));
        drop(a);
        admission
            .reserve_session("dev-a", false)
            .expect("slot given back");
        let (_c, brain_c) = admission
            .reserve_session("dev-b", true)
            .expect("other device");
        assert!(brain_c.is_some());
        assert!(matches!(
            admission.reserve_brain("dev-c", "s-c", None),
            Err(EngineError::ServerBusy(_))
        ));
        drop(brain_a);
        let _brain_d = admission
            .reserve_brain("dev-c", "s-d", None)
            .expect("server slot given back");
        assert_eq!(admission.n_brains(), 2);
    }
}
