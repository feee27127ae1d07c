//! A directory of the process trees a daemon has running: one empty file per tree, named by
//! the tree's marker ([`TREE_MARKER_VAR`](crate::tree::TREE_MARKER_VAR)). A daemon killed
//! with SIGKILL runs no cleanup, so the processes it started live on; the next daemon on the
//! same directory finds them by marker (never by a pid, which may have been reused) and stops
//! them before it starts its own.
//!
//! A file is written before its tree is spawned and removed once the tree is stopped, so at
//! any instant every live tree is listed.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::tree::{TreeId, kill_tree_blocking};

/// The directory of registered trees. Only one daemon may use a directory at a time (the
/// caller holds a lock on its data directory).
#[derive(Debug)]
pub struct TreeRegistry {
    dir: PathBuf,
}

/// One registered tree; dropping it removes the entry. Drop it only after the tree is stopped.
#[derive(Debug)]
pub struct Registered {
    registry: Arc<TreeRegistry>,
    marker: String,
}

impl TreeRegistry {
    /// Opens (creating it if needed) the registry directory.
    pub fn open(dir: impl Into<PathBuf>) -> io::Result<Arc<Self>> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        Ok(Arc::new(Self { dir }))
    }

    /// Lists `marker`, a value from [`crate::TreeMarker::new`]. A failure to write is logged and
    /// otherwise ignored: the tree still runs, it just cannot be found after a crash.
    pub fn register(self: &Arc<Self>, marker: &crate::TreeMarker) -> Registered {
        let marker = marker.as_str();
        if is_marker(marker) {
            if let Err(err) = std::fs::write(self.dir.join(marker), b"") {
                tracing::warn!(dir = %self.dir.display(), %err, "cannot register a process tree");
            }
        } else {
            tracing::warn!(marker, "not registering a malformed tree marker");
        }
        Registered {
            registry: Arc::clone(self),
            marker: marker.to_owned(),
        }
    }

    #[cfg(test)]
    fn register_raw_for_tests(self: &Arc<Self>, marker: &str) -> Registered {
        if is_marker(marker) {
            let _ = std::fs::write(self.dir.join(marker), b"");
        }
        Registered {
            registry: Arc::clone(self),
            marker: marker.to_owned(),
        }
    }

    /// Lists `marker` with no guard: the entry stays until [`TreeRegistry::sweep`] finds the
    /// tree gone or [`TreeRegistry::stop_leftovers`] stops it. For daemons that list every tree
    /// they spawn ([`install_global`]), including trees whose root exits but whose jobs live on.
    pub fn list(&self, marker: &crate::TreeMarker) {
        if let Err(err) = std::fs::write(self.dir.join(marker.as_str()), b"") {
            tracing::warn!(dir = %self.dir.display(), %err, "cannot register a process tree");
        }
    }

    /// Forgets every listed tree that has no live process any more and was listed at least
    /// `min_age` ago. Returns how many were forgotten. Blocking (one scan of /proc).
    ///
    /// A tree is listed before its fork, and a forked child shows its marker in
    /// `/proc/<pid>/environ` only once it has exec'd: `min_age` keeps a sweep from forgetting a
    /// tree in that window.
    pub fn sweep(&self, min_age: Duration) -> usize {
        let listed: Vec<String> = self
            .markers()
            .into_iter()
            .filter(|marker| {
                std::fs::metadata(self.dir.join(marker))
                    .and_then(|meta| meta.modified())
                    .ok()
                    .and_then(|listed_at| listed_at.elapsed().ok())
                    .is_some_and(|age| age >= min_age)
            })
            .collect();
        if listed.is_empty() {
            return 0;
        }
        let alive = crate::tree::live_markers();
        let mut n_forgotten = 0;
        for marker in listed {
            if !alive.contains(&marker) {
                self.remove(&marker);
                n_forgotten += 1;
            }
        }
        n_forgotten
    }

    /// Markers currently listed.
    pub fn markers(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut markers: Vec<String> = entries
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter(|name| is_marker(name))
            .collect();
        markers.sort();
        markers
    }

    /// Stops every listed tree (SIGTERM, `grace`, SIGKILL) and forgets it. Returns how many
    /// still had live processes. Blocking; call it before registering anything new.
    pub fn stop_leftovers(&self, grace: Duration) -> usize {
        let mut n_alive = 0;
        for marker in self.markers() {
            // Root pid 0: membership by marker alone.
            let report = kill_tree_blocking(&TreeId::new(0, Some(marker.clone())), grace);
            if report.n_members > 0 {
                n_alive += 1;
            }
            if !report.survivors.is_empty() {
                tracing::warn!(marker, survivors = ?report.survivors, "left-over processes survived SIGKILL");
            }
            self.remove(&marker);
        }
        n_alive
    }

    fn remove(&self, marker: &str) {
        if let Err(err) = std::fs::remove_file(self.dir.join(marker))
            && err.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %self.dir.display(), %err, "cannot unregister a process tree");
        }
    }
}

static GLOBAL: std::sync::OnceLock<Arc<TreeRegistry>> = std::sync::OnceLock::new();

/// Makes `registry` list every tree [`crate::spawn`] starts in this process from before its
/// fork. A daemon installs it once, after [`TreeRegistry::stop_leftovers`]; a second call is
/// refused.
pub fn install_global(registry: Arc<TreeRegistry>) -> Result<(), Arc<TreeRegistry>> {
    GLOBAL.set(registry)
}

/// The registry [`install_global`] installed, if any.
pub(crate) fn global() -> Option<&'static Arc<TreeRegistry>> {
    GLOBAL.get()
}

impl Registered {
    pub fn marker(&self) -> &str {
        &self.marker
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry.remove(&self.marker);
    }
}

/// Markers are file names here: only ASCII letters, digits and `-` are accepted.
fn is_marker(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)]
mod tests {
    use std::os::unix::process::CommandExt;

    use super::*;
    use crate::tree::TREE_MARKER_VAR;

    fn is_alive(pid: u32) -> bool {
        // A zombie (an exited child not yet reaped) counts as gone.
        crate::procfs::stat(pid as i32).is_some_and(|stat| !stat.is_zombie())
    }

    #[test]
    fn a_registered_tree_is_listed_until_its_guard_drops() {
        let dir = tempfile::tempdir().expect("temp dir");
        let registry = TreeRegistry::open(dir.path().join("trees")).expect("opens");
        let marker = crate::TreeMarker::new();
        let registered = registry.register(&marker);
        assert_eq!(registry.markers(), vec![marker.to_string()]);
        assert_eq!(registered.marker(), marker.as_str());
        drop(registered);
        assert!(registry.markers().is_empty());
    }

    #[test]
    fn malformed_names_are_neither_written_nor_read() {
        let dir = tempfile::tempdir().expect("temp dir");
        let registry = TreeRegistry::open(dir.path()).expect("opens");
        drop(registry.register_raw_for_tests("../escape"));
        assert!(!dir.path().parent().expect("parent").join("escape").exists());
        std::fs::write(dir.path().join("not a marker"), b"").expect("write");
        assert!(registry.markers().is_empty());
        assert_eq!(registry.stop_leftovers(Duration::from_millis(10)), 0);
        assert!(
            dir.path().join("not a marker").exists(),
            "foreign files are left alone"
        );
    }

    #[test]
    fn sweep_forgets_trees_with_no_live_process_and_keeps_the_others() {
        let dir = tempfile::tempdir().expect("temp dir");
        let registry = TreeRegistry::open(dir.path()).expect("opens");
        let gone = crate::TreeMarker::new();
        let alive = crate::TreeMarker::new();
        registry.list(&gone);
        registry.list(&alive);
        assert_eq!(
            registry.sweep(Duration::from_secs(3600)),
            0,
            "a tree listed just now may not have exec'd yet: it is kept"
        );
        let mut sleeper = std::process::Command::new("sleep")
            .arg("300")
            .env(TREE_MARKER_VAR, format!("outer-1:{alive}"))
            .spawn()
            .expect("spawns");
        assert_eq!(registry.sweep(Duration::ZERO), 1);
        assert_eq!(registry.markers(), vec![alive.to_string()]);
        sleeper.kill().expect("kills");
        sleeper.wait().expect("waits");
        assert_eq!(registry.sweep(Duration::ZERO), 1);
        assert!(registry.markers().is_empty());
    }

    /// A process tree whose owner vanished without cleanup (its guard forgotten, as in a crash)
    /// is stopped by the next owner of the directory, found by its marker alone.
    #[test]
    fn left_over_trees_are_stopped_by_marker_and_forgotten() {
        let dir = tempfile::tempdir().expect("temp dir");
        let registry = TreeRegistry::open(dir.path()).expect("opens");
        let marker = crate::TreeMarker::new();
        std::mem::forget(registry.register(&marker));
        // `setsid` and a double fork: the sleeper is neither our child nor in our session.
        let mut shell = std::process::Command::new("sh")
            .args([
                "-c",
                "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!",
            ])
            .env(TREE_MARKER_VAR, marker.as_str())
            .stdout(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("spawns");
        let mut out = String::new();
        std::io::Read::read_to_string(shell.stdout.as_mut().expect("stdout"), &mut out)
            .expect("reads");
        shell.wait().expect("waits");
        let sleeper: u32 = out.trim().parse().expect("a pid");
        assert!(is_alive(sleeper));

        let reopened = TreeRegistry::open(dir.path()).expect("opens again");
        // 1 when the sleeper was still there to be stopped; whatever the count, it must be gone
        // below (a sleeper nobody stopped would live on for 300 s) and its entry forgotten.
        assert!(reopened.stop_leftovers(Duration::from_secs(2)) <= 1);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while is_alive(sleeper) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!is_alive(sleeper), "the left-over sleeper is gone");
        assert!(reopened.markers().is_empty());
    }
}
