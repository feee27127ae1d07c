//! Warren as a child subreaper: orphaned descendants of every command are re-parented to the
//! daemon, and this module reaps them so no zombie is ever left.
//!
//! Children that some owner (a `tokio::process::Child`) will wait for itself must not be reaped
//! here, or the owner would lose the exit status. Owners therefore spawn through [`spawn_owned`],
//! which registers the pid under the same lock the reaper takes, and [`release`] it after their
//! wait. The reaper only collects zombies whose pid is not registered.

use std::collections::BTreeSet;
use std::io;
use std::sync::Mutex;
use std::time::Duration;

use rustix::process::{Pid, WaitOptions};

static OWNED: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

fn owned() -> std::sync::MutexGuard<'static, BTreeSet<i32>> {
    // A panic while holding this lock cannot leave the set inconsistent (single inserts and
    // removes), so a poisoned lock is still usable.
    OWNED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Marks this process as a child subreaper (`PR_SET_CHILD_SUBREAPER`).
pub fn become_subreaper() -> io::Result<()> {
    let me = Pid::from_raw(std::process::id() as i32).expect("own pid is positive");
    rustix::process::set_child_subreaper(Some(me)).map_err(io::Error::from)
}

/// Runs `spawn` (which returns its value and the child's pid) while the reaper is locked out,
/// and registers the pid as owned, so the reaper never steals the child's exit status.
pub fn spawn_owned<T>(spawn: impl FnOnce() -> io::Result<(T, Option<u32>)>) -> io::Result<T> {
    let mut set = owned();
    let (value, pid) = spawn()?;
    if let Some(pid) = pid {
        set.insert(pid as i32);
    }
    Ok(value)
}

/// The owner of `pid` has waited for it; the reaper may collect that pid again if it is reused.
pub fn release(pid: u32) {
    owned().remove(&(pid as i32));
}

/// Reaps every zombie child of this process that no owner is waiting for. Returns how many.
///
/// The `/proc` scan runs without the lock (it takes milliseconds on a busy machine, and owners
/// spawning or releasing must not wait for it); only the final check-and-wait of each zombie
/// candidate holds it. A candidate that is owned by then is skipped, and an owner can only
/// register a pid while holding the lock, so the reaper never steals an owned exit status.
pub fn reap_orphans() -> usize {
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut zombies = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if let Some(stat) = crate::procfs::stat(pid)
            && stat.state == 'Z'
            && stat.ppid == me
        {
            zombies.push(pid);
        }
    }
    if zombies.is_empty() {
        return 0;
    }
    let set = owned();
    let mut n_reaped = 0;
    for pid in zombies {
        if set.contains(&pid) {
            continue;
        }
        if let Some(pid) = Pid::from_raw(pid)
            && let Ok(Some(_)) = rustix::process::waitpid(Some(pid), WaitOptions::NOHANG)
        {
            n_reaped += 1;
        }
    }
    n_reaped
}

/// Becomes a subreaper and starts a task that reaps orphans on every SIGCHLD (and once a
/// second, in case signals were coalesced). Call once per daemon, inside a tokio runtime.
pub fn start() -> io::Result<()> {
    become_subreaper()?;
    let mut sigchld = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())?;
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = sigchld.recv() => {}
                _ = tick.tick() => {}
            }
            let _ = tokio::task::spawn_blocking(reap_orphans).await;
        }
    });
    Ok(())
}
