//! Warm sandboxes (agents.md "Warm pool = warm sandboxes"): with the brain in the hands, the
//! warm pool holds `--warm-workers` whole sessions-to-be: a running hands sandbox with an empty
//! workspace and its agent started inside and `initialize`d. A new session takes one whole, so
//! creating it starts nothing and its first message only opens the ACP session.
//!
//! A warm sandbox is made under the id of the session that will take it: its directory
//! `sessions/<id>/` (workspace, agent home), its run directory and record, and its model token
//! are already that session's, and taking it renames nothing. Until a session takes it the
//! directory has no `meta.json`, so a gateway that dies leaves no session behind: the next one
//! removes such directories at start and stops their hands as strays. Each one taken is
//! replaced in the background; at shutdown the idle ones are stopped and removed.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use warren_brain::Worker;

use crate::engine::Engine;
use crate::hands::Hands;

/// One warm sandbox: its future session's id and directory, its running hands, its agent.
pub struct WarmSandbox {
    pub id: String,
    pub dir: PathBuf,
    pub hands: Arc<Hands>,
    pub worker: Worker,
}

/// The pool (see the module docs).
pub struct WarmSandboxes {
    n_warm: usize,
    ready: Mutex<VecDeque<WarmSandbox>>,
    n_starting: tokio::sync::watch::Sender<usize>,
    closed: AtomicBool,
}

impl WarmSandboxes {
    pub fn new(n_warm: usize) -> WarmSandboxes {
        WarmSandboxes {
            n_warm,
            ready: Mutex::new(VecDeque::new()),
            n_starting: tokio::sync::watch::Sender::new(0),
            closed: AtomicBool::new(false),
        }
    }

    fn ready(&self) -> std::sync::MutexGuard<'_, VecDeque<WarmSandbox>> {
        self.ready
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How many warm sandboxes are ready right now.
    pub fn n_ready(&self) -> usize {
        self.ready().len()
    }

    /// A ready sandbox whose agent is alive, if any; a replacement starts in the background.
    pub fn take(&self, gateway: &Arc<Engine>) -> Option<WarmSandbox> {
        let taken = loop {
            let candidate = self.ready().pop_front();
            match candidate {
                Some(warm) if warm.worker.is_alive() => break Some(warm),
                Some(dead) => {
                    tracing::warn!(id = %dead.id, "a warm sandbox's agent died while idle");
                    tokio::spawn(discard(dead));
                }
                None => break None,
            }
        };
        self.refill(gateway);
        taken
    }

    /// Starts as many sandboxes as needed to get back to `--warm-workers`.
    pub fn refill(&self, gateway: &Arc<Engine>) {
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        let have = self.ready().len() + *self.n_starting.borrow();
        for _ in have..self.n_warm {
            self.n_starting.send_modify(|n| *n += 1);
            let gateway = Arc::downgrade(gateway);
            tokio::spawn(async move {
                let Some(strong) = gateway.upgrade() else {
                    return;
                };
                let made = make(&strong).await;
                let pool = &strong.warm;
                match made {
                    Ok(warm) if !pool.closed.load(Ordering::SeqCst) => pool.ready().push_back(warm),
                    Ok(warm) => discard(warm).await,
                    Err(error) => tracing::warn!(%error, "cannot make a warm sandbox"),
                }
                pool.n_starting.send_modify(|n| *n -= 1);
            });
        }
    }

    /// Waits until `n` sandboxes are ready (tests and benchmarks), or `timeout` passes.
    pub async fn wait_ready(&self, n: usize, timeout: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.n_ready() < n {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        true
    }

    /// Stops and removes every idle sandbox; later takes find none. Sandboxes still being made
    /// are waited for (each is discarded as soon as it is up).
    pub async fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let idle: Vec<WarmSandbox> = self.ready().drain(..).collect();
        futures_util::future::join_all(idle.into_iter().map(discard)).await;
        let mut n_starting = self.n_starting.subscribe();
        let all_done = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            n_starting.wait_for(|n| *n == 0),
        );
        if all_done.await.is_err() {
            tracing::warn!("warm sandboxes still starting at shutdown");
        }
    }
}

/// A sandbox for a session that does not exist yet: its hands, then its agent inside them.
async fn make(gateway: &Arc<Engine>) -> Result<WarmSandbox, String> {
    let id = uuid::Uuid::new_v4().to_string();
    let dir = gateway.sessions.dir().join(&id);
    std::fs::create_dir_all(dir.join("workspace")).map_err(|e| e.to_string())?;
    let hands = gateway.sessions.new_hands(&id, &dir);
    let started = crate::turns::start_in_hands(gateway, &id, &hands, &dir).await;
    match started {
        Ok(worker) => Ok(WarmSandbox {
            id,
            dir,
            hands,
            worker,
        }),
        Err(e) => {
            hands.stop().await;
            gateway.model.revoke(&id);
            let _ = std::fs::remove_dir_all(&dir);
            Err(e.to_string())
        }
    }
}

/// Stops a sandbox no session took and removes what it left.
pub async fn discard(warm: WarmSandbox) {
    warm.worker.kill().await;
    warm.hands.stop().await;
    let dir = warm.dir;
    let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
}
