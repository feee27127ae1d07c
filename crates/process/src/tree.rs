//! A command's process tree and how to kill all of it.
//!
//! Membership is the union of three facts read from `/proc`, because each alone misses
//! processes: descendants of the root (by parent pid), members of the root's terminal session
//! (interactive bash puts background jobs in their own process groups, but in its session), and
//! processes that carry the tree's marker variable in their environment (a grandchild that called
//! `setsid` and was re-parented to the subreaper keeps its environment). Zombies are counted as
//! dead.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

use crate::procfs::{self, Stat};

/// Environment variable set on every spawned command; its value identifies the tree.
pub const TREE_MARKER_VAR: &str = "WARREN_TREE_ID";

/// Identifies one command's process tree: the root pid (a session leader) and an optional
/// marker value that was put in the root's environment as [`TREE_MARKER_VAR`].
///
/// The root's start time is read when the id is made, so a pid the kernel hands to another
/// process after the root was reaped never makes that process, its children or its session
/// members of the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeId {
    pub root_pid: i32,
    pub marker: Option<String>,
    root_start: Option<u64>,
}

impl TreeId {
    /// The tree rooted at `root_pid` as that pid is now: make it while the root is known to be
    /// the command (an unreaped child, or a recorded pid checked against its start time).
    pub fn new(root_pid: i32, marker: Option<String>) -> Self {
        let root_start = (root_pid > 1)
            .then(|| procfs::stat(root_pid))
            .flatten()
            .map(|stat| stat.start_time);
        Self {
            root_pid,
            marker,
            root_start,
        }
    }
}

/// A tree's marker value, created by the caller before the spawn (so the tree can be listed in
/// a [`crate::TreeRegistry`] before it exists) and given to [`crate::CommandSpec::new`].
/// ASCII letters, digits and `-` only; unique per process and start time.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TreeMarker(String);

impl TreeMarker {
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self(format!("{}-{nanos:x}-{n}", std::process::id()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for TreeMarker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// This process's group and session ids as this PID namespace sees them: 0 when the leader lives
/// outside the namespace (a daemon started inside a container by a process outside it). The
/// rustix `getpgrp`/`getsid` wrappers assume a positive id, so they are not used for these.
pub fn own_group_and_session() -> (i32, i32) {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .as_deref()
        .and_then(procfs::parse_stat)
        .map_or((0, 0), |stat| (stat.pgid, stat.sid))
}

fn all_processes() -> Vec<Stat> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|entry| {
        let entry = entry.ok()?;
        let name = entry.file_name();
        let pid: i32 = name.to_str()?.parse().ok()?;
        procfs::stat(pid)
    })
    .collect()
}

fn has_marker(pid: i32, marker: &str) -> bool {
    let Some(environ) = environ(pid) else {
        return false;
    };
    let prefix = format!("{TREE_MARKER_VAR}=");
    environ.split(|b| *b == 0).any(|var| {
        var.strip_prefix(prefix.as_bytes())
            .is_some_and(|chain| chain.split(|b| *b == b':').any(|m| m == marker.as_bytes()))
    })
}

/// `pid`'s environment. A process in the middle of `execve` reads as having neither
/// environment nor arguments for an instant (its new memory is in place before they are), so
/// when both are empty for a process that has a program (a kernel thread has none) they are read
/// again, for at most 50 ms. A process started with an empty environment still has its
/// arguments and is read once.
fn environ(pid: i32) -> Option<Vec<u8>> {
    let path = format!("/proc/{pid}/environ");
    let deadline = Instant::now() + Duration::from_millis(50);
    loop {
        let environ = std::fs::read(&path).ok()?;
        let mid_exec = || {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|args| args.is_empty())
                && std::fs::read_link(format!("/proc/{pid}/exe")).is_ok()
        };
        if !environ.is_empty() || Instant::now() >= deadline || !mid_exec() {
            return Some(environ);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Every marker some live process carries (each element of each chain). One scan of /proc.
pub(crate) fn live_markers() -> std::collections::HashSet<String> {
    let mut markers = std::collections::HashSet::new();
    let prefix = format!("{TREE_MARKER_VAR}=");
    for stat in all_processes() {
        if stat.is_zombie() {
            continue;
        }
        let Some(environ) = environ(stat.pid) else {
            continue;
        };
        for var in environ.split(|b| *b == 0) {
            if let Some(chain) = var.strip_prefix(prefix.as_bytes()) {
                for marker in chain.split(|b| *b == b':') {
                    markers.insert(String::from_utf8_lossy(marker).into_owned());
                }
            }
        }
    }
    markers
}

/// Live (non-zombie) members of the tree, never including this process or its process group.
pub fn tree_members(tree: &TreeId) -> Vec<i32> {
    let procs = all_processes();
    let me = std::process::id() as i32;
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for p in &procs {
        children.entry(p.ppid).or_default().push(p.pid);
    }
    let by_pid: HashMap<i32, Stat> = procs.iter().map(|p| (p.pid, *p)).collect();
    let mut members = BTreeSet::new();
    // Pid 0 is the kernel's (init and kthreadd are its children) and 1 is init: rooting a tree
    // there would make every process on the machine a member. Such a tree is its marker only.
    let rooted = tree.root_pid > 1;
    // Whoever holds the root's pid now is the root only with the root's start time. A pid in
    // use as a session id is never handed out again, so while nobody holds it, the processes of
    // that session are the root's; once another process holds it, they are that one's.
    let holder = by_pid.get(&tree.root_pid);
    let root_alive = rooted
        && holder.is_some_and(|p| tree.root_start.is_some_and(|start| p.start_time == start));
    let session_ours = rooted && (holder.is_none() || root_alive);
    let mut stack = if root_alive {
        vec![tree.root_pid]
    } else {
        Vec::new()
    };
    while let Some(pid) = stack.pop() {
        if members.insert(pid)
            && let Some(kids) = children.get(&pid)
        {
            stack.extend(kids.iter().copied());
        }
    }
    for p in &procs {
        if session_ours && p.sid == tree.root_pid {
            members.insert(p.pid);
        }
    }
    if let Some(marker) = &tree.marker {
        for p in &procs {
            if !members.contains(&p.pid) && has_marker(p.pid, marker) {
                members.insert(p.pid);
            }
        }
    }
    members
        .into_iter()
        .filter(|pid| *pid != me)
        .filter(|pid| by_pid.get(pid).is_some_and(|p| !p.is_zombie()))
        .collect()
}

/// Sends `signal` to every process group that has a member in the tree (so a job that forks
/// after the scan is hit too), and to each member directly. The daemon's own group is never
/// signalled as a group.
/// Sends `signal` to every process group of `tree` (SIGSTOP and SIGCONT for pausing hands that
/// have no cgroup freezer); returns how many members the tree had.
pub fn signal_tree(tree: &TreeId, signal: Signal) -> usize {
    let members = tree_members(tree);
    signal_members(&members, signal);
    members.len()
}

fn signal_members(members: &[i32], signal: Signal) {
    let (own_pgid, _) = own_group_and_session();
    let mut groups = BTreeSet::new();
    for pid in members {
        if let Some(stat) = procfs::stat(*pid)
            && stat.pgid > 1
            && stat.pgid != own_pgid
        {
            groups.insert(stat.pgid);
        }
    }
    for pgid in groups {
        if let Some(pgid) = Pid::from_raw(pgid) {
            // A group may have vanished since the scan; ESRCH is expected and harmless.
            let _ = rustix::process::kill_process_group(pgid, signal);
        }
    }
    for pid in members {
        if let Some(pid) = Pid::from_raw(*pid) {
            let _ = rustix::process::kill_process(pid, signal);
        }
    }
}

/// What [`kill_tree`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KillReport {
    /// Members found when the kill started.
    pub n_members: usize,
    /// SIGKILL was needed because something outlived the grace period.
    pub escalated: bool,
    /// Members still alive when the bounded wait gave up (should be empty).
    pub survivors: Vec<i32>,
}

const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// How long to keep re-sending SIGKILL and waiting for members to disappear.
const KILL_WAIT: Duration = Duration::from_secs(2);

/// Kills the whole tree: SIGTERM to every member's process group, up to `grace` for them to
/// go, then SIGKILL (re-scanned until nothing is left or [`KILL_WAIT`] passes). Runs on the
/// blocking pool; survivors are logged.
pub async fn kill_tree(tree: &TreeId, grace: Duration) -> KillReport {
    let owned = tree.clone();
    let report = match tokio::task::spawn_blocking(move || kill_tree_blocking(&owned, grace)).await
    {
        Ok(report) => report,
        Err(error) => {
            tracing::error!(%error, "the kill task failed; killing on this thread");
            kill_tree_blocking(tree, grace)
        }
    };
    if !report.survivors.is_empty() {
        tracing::warn!(survivors = ?report.survivors, "processes survived SIGKILL");
    }
    report
}

/// Kills a tree when dropped (on a thread of its own, so a drop never blocks), unless
/// [`TreeGuard::kill`] already did. Holds the tree's registry entry, if any, until the tree is
/// dead, so a crash in between still finds it listed.
#[derive(Debug)]
pub struct TreeGuard {
    tree: TreeId,
    grace: Duration,
    registered: Option<crate::Registered>,
    armed: bool,
}

impl TreeGuard {
    pub fn new(tree: TreeId, grace: Duration, registered: Option<crate::Registered>) -> Self {
        Self {
            tree,
            grace,
            registered,
            armed: true,
        }
    }

    pub fn tree(&self) -> &TreeId {
        &self.tree
    }

    /// Kills the tree now and forgets its registry entry. Idempotent.
    pub async fn kill(&mut self) -> KillReport {
        if !std::mem::take(&mut self.armed) {
            return KillReport::default();
        }
        let report = kill_tree(&self.tree, self.grace).await;
        self.registered = None;
        report
    }
}

impl Drop for TreeGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let tree = self.tree.clone();
        let grace = self.grace;
        let registered = self.registered.take();
        std::thread::spawn(move || {
            kill_tree_blocking(&tree, grace);
            drop(registered);
        });
    }
}

/// [`kill_tree`] on the calling thread, for code that is not async.
pub fn kill_tree_blocking(tree: &TreeId, grace: Duration) -> KillReport {
    let members = tree_members(tree);
    let mut report = KillReport {
        n_members: members.len(),
        ..KillReport::default()
    };
    if members.is_empty() {
        return report;
    }
    signal_members(&members, Signal::TERM);
    // Stopped processes never act on SIGTERM; wake them so the grace period means something.
    signal_members(&members, Signal::CONT);
    // During the grace only the members signalled are polled (cheap: their stat files); one
    // scan of /proc, which reads every process's environment, confirms the tree is gone.
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !members.iter().any(|pid| is_alive(*pid)) && tree_members(tree).is_empty() {
            return report;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
    report.escalated = true;
    escalate(tree, KILL_WAIT, &mut report);
    report
}

/// Whether `pid` is a live process (not gone, not a zombie).
fn is_alive(pid: i32) -> bool {
    procfs::stat(pid).is_some_and(|stat| !stat.is_zombie())
}

/// SIGKILL to what is left of the tree, re-scanned until nothing is or `wait` has passed. The
/// signal goes out at least once whatever `wait` is: on a loaded machine one scan of /proc can
/// take longer than the whole wait.
fn escalate(tree: &TreeId, wait: Duration, report: &mut KillReport) {
    let deadline = Instant::now() + wait;
    let mut left = tree_members(tree);
    while !left.is_empty() {
        signal_members(&left, Signal::KILL);
        std::thread::sleep(POLL_INTERVAL);
        left = tree_members(tree);
        if Instant::now() >= deadline {
            break;
        }
    }
    report.survivors = left;
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;

    #[test]
    fn a_kill_wait_shorter_than_one_scan_still_sends_sigkill() {
        use std::os::unix::process::{CommandExt, ExitStatusExt};
        // Ignores SIGTERM like an interactive shell; its own group, so the test's is untouched.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "trap '' TERM; while :; do sleep 0.1; done"])
            .process_group(0)
            .spawn()
            .expect("spawns sh");
        let tree = TreeId::new(child.id() as i32, None);
        let mut report = KillReport::default();
        escalate(&tree, Duration::ZERO, &mut report);
        let status = child.wait().expect("waits for sh");
        assert_eq!(status.signal(), Some(9), "{status:?}");
    }

    #[test]
    fn a_root_pid_held_by_another_process_makes_neither_it_nor_its_session_members() {
        // A session leader with a child and an orphaned session member, standing in for the
        // process the kernel gave a reaped root's pid to. (`setsid` execs in place: the test's
        // child is no group leader.)
        let mut child = std::process::Command::new("setsid")
            .args(["sh", "-c", "(sleep 30 &); sleep 30"])
            .spawn()
            .expect("spawns setsid sh");
        let pid = child.id() as i32;
        let tree = TreeId::new(pid, None);
        let deadline = Instant::now() + Duration::from_secs(10);
        while tree_members(&tree).len() < 3 {
            assert!(Instant::now() < deadline, "sh and its two sleeps appear");
            std::thread::sleep(POLL_INTERVAL);
        }
        let mut reused = tree.clone();
        reused.root_start = tree.root_start.map(|start| start + 1);
        assert_eq!(tree_members(&reused), Vec::<i32>::new());
        let unknown = TreeId {
            root_start: None,
            ..tree.clone()
        };
        assert_eq!(tree_members(&unknown), Vec::<i32>::new());
        let _ = rustix::process::kill_process_group(
            Pid::from_raw(pid).expect("a positive pid"),
            Signal::KILL,
        );
        let _ = child.wait();
    }

    #[test]
    fn a_tree_rooted_at_the_kernel_or_init_has_no_members_without_a_marker() {
        assert_eq!(tree_members(&TreeId::new(0, None)), Vec::<i32>::new());
        assert_eq!(tree_members(&TreeId::new(1, None)), Vec::<i32>::new());
    }

    #[test]
    fn own_group_and_session_match_what_ps_reports() {
        let out = std::process::Command::new("ps")
            .args(["-o", "pgid=,sid=", "-p", &std::process::id().to_string()])
            .output()
            .expect("runs ps");
        let ids: Vec<i32> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(|s| s.parse().expect("a number"))
            .collect();
        let (pgid, sid) = own_group_and_session();
        assert_eq!(ids, vec![pgid, sid]);
    }
}
