//! Quotas and server-wide limits: per device 20 sessions and 4 running brains, server-wide
//! `--max-brains`. Checking and reserving is one step under one lock, and a reservation is a
//! guard that gives its slot back when dropped, so a slot can neither leak nor be counted twice.
//! Over a limit the answer is an immediate error (429), never a queue.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::GatewayError;

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
}

/// One session counted against its device's quota until dropped.
pub struct SessionSlot {
    admission: Arc<Admission>,
    device_id: String,
}

/// One running brain counted against its device and the server until dropped.
pub struct BrainSlot {
    admission: Arc<Admission>,
    device_id: String,
}

impl Admission {
    pub fn new(limits: Limits) -> Arc<Admission> {
        Arc::new(Admission {
            limits,
            state: Mutex::new(State::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Counters are updated in single statements; a poisoned lock still holds valid counts.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Reserves a session and, when the limits allow, a brain for it, in one step.
    pub fn reserve_session(
        self: &Arc<Self>,
        device_id: &str,
        with_brain: bool,
    ) -> Result<(SessionSlot, Option<BrainSlot>), GatewayError> {
        let mut state = self.lock();
        let usage = state.per_device.entry(device_id.to_string()).or_default();
        if usage.n_sessions >= self.limits.sessions_per_device {
            return Err(GatewayError::QuotaExceeded(format!(
                "a device may hold {} sessions",
                self.limits.sessions_per_device
            )));
        }
        usage.n_sessions += 1;
        let session = SessionSlot {
            admission: self.clone(),
            device_id: device_id.to_string(),
        };
        let brain = if with_brain {
            self.try_brain(&mut state, device_id).ok()
        } else {
            None
        };
        Ok((session, brain))
    }

    /// Counts a session that already exists on disk (loaded at start), even over the quota.
    pub fn adopt_session(self: &Arc<Self>, device_id: &str) -> SessionSlot {
        self.lock()
            .per_device
            .entry(device_id.to_string())
            .or_default()
            .n_sessions += 1;
        SessionSlot {
            admission: self.clone(),
            device_id: device_id.to_string(),
        }
    }

    /// Reserves a running brain for one of `device_id`'s sessions.
    pub fn reserve_brain(self: &Arc<Self>, device_id: &str) -> Result<BrainSlot, GatewayError> {
        let mut state = self.lock();
        self.try_brain(&mut state, device_id)
    }

    fn try_brain(
        self: &Arc<Self>,
        state: &mut State,
        device_id: &str,
    ) -> Result<BrainSlot, GatewayError> {
        if state.n_brains >= self.limits.max_brains {
            return Err(GatewayError::ServerBusy(format!(
                "the server runs its maximum of {} brains",
                self.limits.max_brains
            )));
        }
        let usage = state.per_device.entry(device_id.to_string()).or_default();
        if usage.n_brains >= self.limits.brains_per_device {
            return Err(GatewayError::QuotaExceeded(format!(
                "a device may run {} brains at once",
                self.limits.brains_per_device
            )));
        }
        usage.n_brains += 1;
        state.n_brains += 1;
        Ok(BrainSlot {
            admission: self.clone(),
            device_id: device_id.to_string(),
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
            Err(GatewayError::QuotaExceeded(_))
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
            admission.reserve_brain("dev-c"),
            Err(GatewayError::ServerBusy(_))
        ));
        drop(brain_a);
        let _brain_d = admission
            .reserve_brain("dev-c")
            .expect("server slot given back");
        assert_eq!(admission.n_brains(), 2);
    }
}
