//! execd's state directory: the list of process trees it has running (a
//! `warren_process::TreeRegistry` in `<state-dir>/trees`), so an execd started after one that
//! was killed with SIGKILL stops what that one left behind (a `setsid` grandchild, a `nohup`
//! job) before it serves anything.
//!
//! The directory is locked (`flock`) while an execd uses it, so two daemons never share one.
//! By default it is `<tmp>/warren-execd-<uid>/<port>`: the next execd on the same port is the
//! one that cleans up. A daemon on an ephemeral port (0) gets a fresh private directory, since
//! no later daemon could find its port; its direct children still die with it (parent-death
//! signal) and whoever started it kills its tree by marker.

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use warren_process::TreeRegistry;

/// How often trees with no live process are forgotten.
const SWEEP_INTERVAL: Duration = Duration::from_secs(30);
/// Trees listed more recently than this are never swept: their first process may not have
/// exec'd yet, so /proc does not show its marker.
const SWEEP_MIN_AGE: Duration = Duration::from_secs(10);

/// A claimed state directory; dropping it releases the lock.
pub struct StateDir {
    pub path: PathBuf,
    pub registry: Arc<TreeRegistry>,
    /// Removed on drop (a private directory for an ephemeral port).
    private: bool,
    _lock: OwnedFd,
}

impl StateDir {
    /// Claims `configured`, or the default for `port`, stops every tree an earlier daemon left
    /// listed there, and makes every later spawn of this process listed in it. Blocking.
    pub fn claim(configured: Option<&Path>, port: u16) -> io::Result<Self> {
        let (path, private) = match configured {
            Some(path) => (path.to_path_buf(), false),
            None if port != 0 => (default_base().join(port.to_string()), false),
            None => {
                let base = default_base();
                std::fs::create_dir_all(&base)?;
                let dir = tempfile::Builder::new()
                    .prefix("ephemeral-")
                    .tempdir_in(&base)?;
                (dir.keep(), true)
            }
        };
        std::fs::create_dir_all(&path)?;
        let lock_file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path.join("lock"))?;
        let lock = OwnedFd::from(lock_file);
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(
            |_| {
                io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "another warren execd uses the state directory {}",
                        path.display()
                    ),
                )
            },
        )?;
        let registry = TreeRegistry::open(path.join("trees"))?;
        let n_left = registry.stop_leftovers(warren_process::stop::KILL_GRACE);
        if n_left > 0 {
            tracing::warn!(
                n_left,
                dir = %path.display(),
                "stopped process trees an earlier execd left running"
            );
        }
        if warren_process::registry::install_global(Arc::clone(&registry)).is_err() {
            tracing::warn!("a process-tree registry was already installed; keeping it");
        }
        Ok(Self {
            path,
            registry,
            private,
            _lock: lock,
        })
    }

    /// Forgets listed trees that have ended, every [`SWEEP_INTERVAL`], until the runtime ends.
    pub fn start_sweeping(&self) {
        let registry = Arc::clone(&self.registry);
        tokio::spawn(async move {
            let first = tokio::time::Instant::now() + SWEEP_INTERVAL;
            let mut tick = tokio::time::interval_at(first, SWEEP_INTERVAL);
            loop {
                tick.tick().await;
                let registry = Arc::clone(&registry);
                let _ = tokio::task::spawn_blocking(move || registry.sweep(SWEEP_MIN_AGE)).await;
            }
        });
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        if self.private {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

fn default_base() -> PathBuf {
    let uid = rustix::process::getuid().as_raw();
    std::env::temp_dir().join(format!("warren-execd-{uid}"))
}
