//! [`WorkerPool`]: agent processes started and `initialize`d ahead of time, so a new session gets
//! a brain in well under 50 ms. Each [`Worker`] taken is replaced in the background; workers are
//! never returned to the pool (one worker per session, never reused).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use warren_process::TreeRegistry;

use crate::worker::Worker;
use crate::{AgentCommand, BrainError};

/// How long [`WorkerPool::shutdown`] waits for workers that are still starting.
const STARTING_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Keeps `n_warm` initialized workers of one agent command ready.
pub struct WorkerPool {
    command: AgentCommand,
    n_warm: usize,
    /// Where every worker's process tree is listed while it runs, if anywhere.
    registry: Option<Arc<TreeRegistry>>,
    warm: Mutex<VecDeque<Worker>>,
    /// Workers being spawned and initialized; `shutdown` waits for it to reach 0.
    n_starting: tokio::sync::watch::Sender<usize>,
    closed: AtomicBool,
}

impl WorkerPool {
    /// Creates the pool and starts filling it in the background. Call inside a tokio runtime.
    pub fn new(command: AgentCommand, n_warm: usize) -> Arc<Self> {
        Self::with_registry(command, n_warm, None)
    }

    /// [`WorkerPool::new`], listing each worker's process tree in `registry` while it runs (see
    /// [`Worker::spawn_registered`]).
    pub fn with_registry(
        command: AgentCommand,
        n_warm: usize,
        registry: Option<Arc<TreeRegistry>>,
    ) -> Arc<Self> {
        let pool = Arc::new(Self {
            command,
            n_warm,
            registry,
            warm: Mutex::new(VecDeque::new()),
            n_starting: tokio::sync::watch::Sender::new(0),
            closed: AtomicBool::new(false),
        });
        pool.refill();
        pool
    }

    /// The agent command this pool starts.
    pub fn command(&self) -> &AgentCommand {
        &self.command
    }

    /// How many initialized workers are ready right now.
    pub fn n_ready(&self) -> usize {
        self.warm().len()
    }

    /// A worker for a new session: a warm one at once if there is one (its replacement starts in
    /// the background), else a freshly spawned and initialized one.
    pub async fn take(self: &Arc<Self>) -> Result<Worker, BrainError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(BrainError::PoolClosed);
        }
        let warm = loop {
            let candidate = self.warm().pop_front();
            match candidate {
                Some(worker) if worker.is_alive() => break Some(worker),
                Some(dead) => {
                    tracing::warn!(pid = dead.pid(), "a warm agent worker died while idle");
                }
                None => break None,
            }
        };
        self.refill();
        match warm {
            Some(worker) => Ok(worker),
            None => Worker::spawn_registered(&self.command, self.registry.as_ref()).await,
        }
    }

    /// A worker of another command line (the pool's agent with one session's settings),
    /// listed in the pool's registry like the pool's own; never warm.
    pub async fn spawn(&self, command: &AgentCommand) -> Result<Worker, BrainError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(BrainError::PoolClosed);
        }
        Worker::spawn_registered(command, self.registry.as_ref()).await
    }

    /// Waits until `n` workers are ready (tests and benchmarks), or `timeout` passes.
    pub async fn wait_ready(&self, n: usize, timeout: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.n_ready() < n {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        true
    }

    /// Stops every idle worker; later `take`s fail with [`BrainError::PoolClosed`].
    ///
    /// Workers still starting are waited for (up to [`STARTING_WAIT`]): each is killed as soon
    /// as it is up, so none outlives the pool unnoticed.
    pub async fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let workers: Vec<Worker> = self.warm().drain(..).collect();
        futures_util::future::join_all(workers.into_iter().map(Worker::kill)).await;
        let mut n_starting = self.n_starting.subscribe();
        let all_done = tokio::time::timeout(STARTING_WAIT, n_starting.wait_for(|n| *n == 0));
        if all_done.await.is_err() {
            tracing::warn!("agent workers still starting at shutdown");
        }
    }

    fn warm(&self) -> std::sync::MutexGuard<'_, VecDeque<Worker>> {
        self.warm
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts as many workers as needed to get back to `n_warm` (counting those starting).
    fn refill(self: &Arc<Self>) {
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        let have = self.warm().len() + *self.n_starting.borrow();
        for _ in have..self.n_warm {
            self.n_starting.send_modify(|n| *n += 1);
            let pool = self.clone();
            tokio::spawn(async move {
                let result = Worker::spawn_registered(&pool.command, pool.registry.as_ref()).await;
                match result {
                    Ok(worker) if !pool.closed.load(Ordering::SeqCst) => {
                        pool.warm().push_back(worker)
                    }
                    // The pool shut down meanwhile; `shutdown` waits for this kill.
                    Ok(worker) => worker.kill().await,
                    Err(error) => tracing::warn!(%error, "cannot start a warm agent worker"),
                }
                pool.n_starting.send_modify(|n| *n -= 1);
            });
        }
    }
}
