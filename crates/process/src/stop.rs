//! How every face ends a command and finishes its output: one policy for PTY sessions, exec
//! sessions, OpenSandbox commands and bash sessions, and E2B processes.
//!
//! - Ending a tree: SIGTERM to every process group of it, [`KILL_GRACE`], then SIGKILL
//!   ([`crate::kill_tree`]).
//! - After the command exits, its output is still read until end of file, until
//!   [`DRAIN_QUIET`] passes without any, or for [`DRAIN_MAX`] in all: a background job that
//!   keeps the output open (`server &`) must not hold the exit back, and what the command
//!   printed before exiting is read long before. The drain never stops while bytes are still
//!   queued in the pipe or terminal (a reader that is merely behind on a loaded machine), up
//!   to [`DRAIN_BEHIND_CAP`].

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::tree::{KillReport, TreeId, kill_tree, signal_tree};

/// SIGTERM's head start before SIGKILL.
pub const KILL_GRACE: Duration = Duration::from_secs(2);
/// After the exit, the drain ends once this long passes without output...
pub const DRAIN_QUIET: Duration = Duration::from_millis(100);
/// ... or once this long has passed since the exit.
pub const DRAIN_MAX: Duration = Duration::from_secs(2);
/// Longest the drain keeps waiting for a reader that is merely behind (bytes queued).
pub const DRAIN_BEHIND_CAP: Duration = Duration::from_secs(30);
/// How often a drain past its time looks at the queued bytes again.
const BEHIND_POLL: Duration = Duration::from_millis(20);

/// Ends `tree` by the policy: SIGTERM to every group, [`KILL_GRACE`], SIGKILL.
pub async fn end_tree(tree: &TreeId) -> KillReport {
    kill_tree(tree, KILL_GRACE).await
}

/// Ends a terminal's tree as closing the terminal would: SIGHUP first (an interactive shell
/// ignores SIGTERM but exits on a hang-up, taking its jobs with it), then [`end_tree`] for
/// whatever ignored it.
pub async fn hang_up(tree: &TreeId) -> KillReport {
    let owned = tree.clone();
    let _ = tokio::task::spawn_blocking(move || signal_tree(&owned, rustix::process::Signal::HUP))
        .await;
    end_tree(tree).await
}

/// The drain after an exit, for callers that read in their own loop: tell it of each output
/// and sleep until [`Drain::deadline`]; once that passes, [`Drain::is_over`] says whether to
/// stop.
#[derive(Debug, Clone, Copy)]
pub struct Drain {
    exited_at: Instant,
    last_output: Instant,
}

impl Drain {
    /// Starts the drain now (the command just exited).
    pub fn start() -> Self {
        let now = Instant::now();
        Self {
            exited_at: now,
            last_output: now,
        }
    }

    /// Output arrived.
    pub fn output(&mut self) {
        self.last_output = Instant::now();
    }

    /// When the drain ends unless more output arrives.
    pub fn deadline(&self) -> Instant {
        (self.last_output + DRAIN_QUIET).min(self.exited_at + DRAIN_MAX)
    }

    /// True once the output has been quiet (or the drain long) enough and `queued` bytes are
    /// none (or the reader has been behind for [`DRAIN_BEHIND_CAP`]).
    pub fn is_over(&self, queued: u64) -> bool {
        let now = Instant::now();
        now >= self.deadline() && (queued == 0 || now >= self.exited_at + DRAIN_BEHIND_CAP)
    }
}

/// Drains after an exit: waits for `copy` (which ends at end of file) while `progress` (bytes
/// read so far) moves, by the policy above; `queued` says how many bytes wait unread. Returns
/// true when `copy` reached end of file; otherwise the caller stops its reader.
pub async fn drain_after_exit<F: Future + Unpin>(
    copy: &mut F,
    progress: impl Fn() -> u64,
    queued: impl Fn() -> u64,
) -> bool {
    let mut drain = Drain::start();
    let mut seen = progress();
    loop {
        let now = Instant::now();
        let wake = if now >= drain.deadline() {
            now + BEHIND_POLL
        } else {
            drain.deadline()
        };
        if tokio::time::timeout_at(wake, &mut *copy).await.is_ok() {
            return true;
        }
        let now_seen = progress();
        if now_seen != seen {
            seen = now_seen;
            drain.output();
        }
        if drain.is_over(queued()) {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_drain_ends_at_end_of_file_quiet_output_or_its_maximum_and_never_with_bytes_queued()
    {
        // End of file first: done at once, reported as complete.
        let mut eof = std::pin::pin!(async {});
        assert!(drain_after_exit(&mut eof, || 0, || 0).await);

        // Nothing arrives: over after DRAIN_QUIET.
        let started = Instant::now();
        let mut held = std::pin::pin!(std::future::pending::<()>());
        assert!(!drain_after_exit(&mut held, || 0, || 0).await);
        let took = started.elapsed();
        assert!(took >= DRAIN_QUIET && took < DRAIN_QUIET * 2, "{took:?}");

        // Output keeps arriving: over at DRAIN_MAX.
        let read = Arc::new(AtomicU64::new(0));
        let ticker = {
            let read = Arc::clone(&read);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(DRAIN_QUIET / 4).await;
                    read.fetch_add(1, Ordering::SeqCst);
                }
            })
        };
        let started = Instant::now();
        let mut held = std::pin::pin!(std::future::pending::<()>());
        assert!(!drain_after_exit(&mut held, || read.load(Ordering::SeqCst), || 0).await);
        let took = started.elapsed();
        assert!(
            took >= DRAIN_MAX && took < DRAIN_MAX + DRAIN_QUIET,
            "{took:?}"
        );
        ticker.abort();

        // Bytes stay queued (a reader that never runs): kept up to DRAIN_BEHIND_CAP.
        let started = Instant::now();
        let mut held = std::pin::pin!(std::future::pending::<()>());
        assert!(!drain_after_exit(&mut held, || 0, || 4).await);
        let took = started.elapsed();
        assert!(
            took >= DRAIN_BEHIND_CAP && took < DRAIN_BEHIND_CAP + DRAIN_QUIET,
            "{took:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_in_a_callers_loop_moves_its_deadline_with_output() {
        let mut drain = Drain::start();
        let first = drain.deadline();
        assert!(!drain.is_over(0));
        tokio::time::sleep(DRAIN_QUIET / 2).await;
        drain.output();
        assert!(drain.deadline() > first);
        tokio::time::sleep_until(drain.deadline()).await;
        assert!(drain.is_over(0));
        assert!(!drain.is_over(1), "bytes queued keep it going");
    }
}
