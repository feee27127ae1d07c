//! The hands' cgroups: one child cgroup `warren-hands-<name>` of this process's own cgroup in
//! each hierarchy the host offers, to freeze, kill and limit one hands as a whole.
//!
//! [`CgroupRoots::discover`] reads `/proc/self/mountinfo` and `/proc/self/cgroup` to find this
//! process's own cgroup in the v2 hierarchy (used when `cgroup.freeze` works in a child) and in
//! the v1 `freezer`, `memory` and `pids` hierarchies. [`HandsCgroup`] creates the children: v2
//! for freezing and `cgroup.kill`, the v1 freezer only where v2 cannot freeze, v1 memory and
//! pids for the limits (or v2's `memory.max`/`pids.max` where those controllers are enabled).
//! The hands' first process joins them itself before exec
//! ([`warren_process::CommandSpec::join_cgroups`]), so nothing it starts is ever outside.
//!
//! Only children are created: no process is ever moved out of the cgroup the machine accounts
//! this process in. The operations are synchronous file writes with bounded waits; call them
//! off the async workers.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long [`HandsCgroup::freeze`] waits for the kernel to report the cgroup frozen.
const FREEZE_WAIT: Duration = Duration::from_secs(2);
/// How long [`HandsCgroup::kill_all`] waits for the cgroup to empty.
const KILL_WAIT: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(1);

/// This process's own cgroups, one per usable hierarchy; `None` where the host has none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupRoots {
    /// Our own v2 cgroup, when a cgroup2 file system is mounted and a child of it can freeze.
    pub v2: Option<PathBuf>,
    /// Our own v1 freezer cgroup.
    pub freezer: Option<PathBuf>,
    /// Our own v1 memory cgroup.
    pub memory: Option<PathBuf>,
    /// Our own v1 pids cgroup.
    pub pids: Option<PathBuf>,
}

/// The hierarchies `/proc/self/mountinfo` and `/proc/self/cgroup` name, before any check
/// that they work.
#[derive(Debug, Default, PartialEq, Eq)]
struct Found {
    v2: Option<PathBuf>,
    freezer: Option<PathBuf>,
    memory: Option<PathBuf>,
    pids: Option<PathBuf>,
}

impl CgroupRoots {
    /// Finds this process's cgroups. Never fails: a hierarchy that is missing, unreadable or
    /// (for v2) cannot freeze is `None`.
    pub fn discover() -> CgroupRoots {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let found = find_own_cgroups(&mountinfo, &own);
        let is_dir = |dir: Option<PathBuf>| dir.filter(|d| d.join("cgroup.procs").is_file());
        CgroupRoots {
            v2: is_dir(found.v2).filter(|dir| v2_child_can_freeze(dir)),
            freezer: is_dir(found.freezer),
            memory: is_dir(found.memory),
            pids: is_dir(found.pids),
        }
    }

    /// One line for logs: which hierarchies are used, and where.
    pub fn describe(&self) -> String {
        let show = |dir: &Option<PathBuf>| match dir {
            Some(dir) => dir.display().to_string(),
            None => "none".to_owned(),
        };
        format!(
            "cgroup v2 (freeze, kill): {}; v1 freezer: {}; v1 memory: {}; v1 pids: {}",
            show(&self.v2),
            show(&self.freezer),
            show(&self.memory),
            show(&self.pids)
        )
    }
}

/// Whether a child of the v2 cgroup `dir` has `cgroup.freeze` (kernel 5.2+). The root cgroup
/// itself has none, so a probe child is made and removed. Its name is unique per call: several
/// gateways (or discoveries) in one process probe at once, and a clash must not read as "no
/// freezer", which would also hide existing hands cgroups from [`HandsCgroup::open`].
/// How long [`remove_cgroup_dir`] retries a busy cgroup.
const RMDIR_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

fn v2_child_can_freeze(dir: &Path) -> bool {
    static N_PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    if dir.join("cgroup.freeze").is_file() {
        return true;
    }
    let n = N_PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let probe = dir.join(format!("warren-probe-{}-{n}", std::process::id()));
    if std::fs::create_dir(&probe).is_err() {
        return false;
    }
    let can = probe.join("cgroup.freeze").is_file();
    let _ = std::fs::remove_dir(&probe);
    can
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(octal) = field.get(i + 1..i + 4)
            && let Ok(value) = u8::from_str_radix(octal, 8)
        {
            out.push(value);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Our cgroup directory in each hierarchy: the mount point of the hierarchy joined with our
/// path in it relative to the mount's root. A hierarchy whose mount does not show our cgroup
/// (another root) is skipped.
fn find_own_cgroups(mountinfo: &str, own: &str) -> Found {
    // (fstype, super options, root, mount point) of every cgroup mount.
    let mounts: Vec<(String, Vec<String>, String, PathBuf)> = mountinfo
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let sep = fields.iter().position(|f| *f == "-")?;
            let fstype = *fields.get(sep + 1)?;
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            let options = fields
                .get(sep + 3)
                .map(|o| o.split(',').map(str::to_owned).collect())
                .unwrap_or_default();
            Some((
                fstype.to_owned(),
                options,
                unescape(fields.get(3)?),
                PathBuf::from(unescape(fields.get(4)?)),
            ))
        })
        .collect();
    let dir_in = |root: &str, mount: &Path, path: &str| -> Option<PathBuf> {
        let relative = if root == "/" {
            path
        } else {
            let rest = path.strip_prefix(root)?;
            if !rest.is_empty() && !rest.starts_with('/') {
                return None;
            }
            rest
        };
        Some(mount.join(relative.trim_start_matches('/')))
    };
    let mut found = Found::default();
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if path.ends_with(" (deleted)") {
            continue;
        }
        if controllers.is_empty() {
            found.v2 = found.v2.take().or_else(|| {
                mounts
                    .iter()
                    .filter(|(fstype, ..)| fstype == "cgroup2")
                    .find_map(|(_, _, root, mount)| dir_in(root, mount, path))
            });
            continue;
        }
        for controller in controllers.split(',') {
            let slot = match controller {
                "freezer" => &mut found.freezer,
                "memory" => &mut found.memory,
                "pids" => &mut found.pids,
                _ => continue,
            };
            if slot.is_some() {
                continue;
            }
            *slot = mounts
                .iter()
                .filter(|(fstype, options, ..)| {
                    fstype == "cgroup" && options.iter().any(|o| o == controller)
                })
                .find_map(|(_, _, root, mount)| dir_in(root, mount, path));
        }
    }
    found
}

/// Resource limits for one hands; `None` leaves a resource unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub memory_bytes: Option<u64>,
    pub pids: Option<u64>,
}

/// How often the hands ran into their limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitHits {
    /// Processes the kernel's OOM killer killed inside the hands.
    pub oom_kills: u64,
    /// Forks refused because the pids limit was reached.
    pub pids_max: u64,
}

/// The cgroups of one hands, one directory per hierarchy. Dropping it leaves them as they are
/// (a restarted gateway [`HandsCgroup::open`]s them again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandsCgroup {
    /// v2 cgroup: freeze, `cgroup.kill`, and the limits where v1 lacks them.
    v2: Option<PathBuf>,
    /// v1 freezer cgroup, only where v2 cannot freeze.
    freezer: Option<PathBuf>,
    memory: Option<PathBuf>,
    pids: Option<PathBuf>,
}

fn child_name(name: &str) -> io::Result<String> {
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && name != "."
        && name != "..";
    if !valid {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a hands cgroup name (letters, digits, '-', '_', '.')"),
        ));
    }
    Ok(format!("warren-hands-{name}"))
}

fn write(file: &Path, value: &str) -> io::Result<()> {
    std::fs::write(file, value)
        .map_err(|err| io::Error::new(err.kind(), format!("writing {}: {err}", file.display())))
}

/// The value of `key` in a flat-keyed file (`key value` lines), 0 when absent.
fn keyed(file: &Path, key: &str) -> u64 {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .find_map(|line| {
            let (k, v) = line.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0)
}

/// Makes `parent/child` as an empty cgroup: one left from before is removed first, which only
/// succeeds when no process is in it.
fn fresh_child(parent: &Path, child: &str) -> io::Result<PathBuf> {
    let dir = parent.join(child);
    if dir.exists() {
        std::fs::remove_dir(&dir).map_err(|err| {
            io::Error::new(
                err.kind(),
                format!(
                    "cgroup {} exists and cannot be removed: {err}",
                    dir.display()
                ),
            )
        })?;
    }
    std::fs::create_dir(&dir)
        .map_err(|err| io::Error::new(err.kind(), format!("creating {}: {err}", dir.display())))?;
    Ok(dir)
}

impl HandsCgroup {
    /// Creates the hands' cgroups `warren-hands-<name>` below each of `roots` it needs and
    /// applies `limits`. A cgroup of that name left from before is removed first (it must be
    /// empty). An error removes what was created.
    pub fn create(roots: &CgroupRoots, name: &str, limits: &Limits) -> io::Result<HandsCgroup> {
        let child = child_name(name)?;
        let mut cgroup = HandsCgroup {
            v2: None,
            freezer: None,
            memory: None,
            pids: None,
        };
        match cgroup.fill(roots, &child, limits) {
            Ok(()) => Ok(cgroup),
            Err(err) => {
                let _ = cgroup.rmdir_all();
                Err(err)
            }
        }
    }

    fn fill(&mut self, roots: &CgroupRoots, child: &str, limits: &Limits) -> io::Result<()> {
        if let Some(root) = &roots.v2 {
            self.v2 = Some(fresh_child(root, child)?);
        }
        if self.v2.is_none()
            && let Some(root) = &roots.freezer
        {
            self.freezer = Some(fresh_child(root, child)?);
        }
        if let Some(root) = &roots.memory
            && limits.memory_bytes.is_some()
        {
            self.memory = Some(fresh_child(root, child)?);
        }
        if let Some(root) = &roots.pids
            && limits.pids.is_some()
        {
            self.pids = Some(fresh_child(root, child)?);
        }
        if let Some(bytes) = limits.memory_bytes {
            let bytes = bytes.to_string();
            match (&self.memory, &self.v2) {
                (Some(memory), _) => {
                    write(&memory.join("memory.limit_in_bytes"), &bytes)?;
                    // With swap, memory+swap gets the same limit, or swap would hold the rest.
                    let memsw = memory.join("memory.memsw.limit_in_bytes");
                    if memsw.exists() {
                        write(&memsw, &bytes)?;
                    }
                }
                (None, Some(v2)) if v2.join("memory.max").exists() => {
                    write(&v2.join("memory.max"), &bytes)?;
                    if v2.join("memory.swap.max").exists() {
                        write(&v2.join("memory.swap.max"), "0")?;
                    }
                }
                _ => return Err(unsupported("a memory limit")),
            }
        }
        if let Some(max) = limits.pids {
            let max = max.to_string();
            match (&self.pids, &self.v2) {
                (Some(pids), _) => write(&pids.join("pids.max"), &max)?,
                (None, Some(v2)) if v2.join("pids.max").exists() => {
                    write(&v2.join("pids.max"), &max)?
                }
                _ => return Err(unsupported("a pids limit")),
            }
        }
        Ok(())
    }

    /// The hands' cgroups as a gateway left them, found by name after a restart; `None` when
    /// none exists.
    pub fn open(roots: &CgroupRoots, name: &str) -> Option<HandsCgroup> {
        let child = child_name(name).ok()?;
        let existing = |root: &Option<PathBuf>| {
            root.as_ref()
                .map(|root| root.join(&child))
                .filter(|dir| dir.is_dir())
        };
        let v2 = existing(&roots.v2);
        let cgroup = HandsCgroup {
            freezer: if v2.is_some() {
                None
            } else {
                existing(&roots.freezer)
            },
            v2,
            memory: existing(&roots.memory),
            pids: existing(&roots.pids),
        };
        let dirs = cgroup.dirs();
        (!dirs.is_empty()).then_some(cgroup)
    }

    fn dirs(&self) -> Vec<&PathBuf> {
        [&self.v2, &self.freezer, &self.memory, &self.pids]
            .into_iter()
            .flatten()
            .collect()
    }

    /// The `cgroup.procs` file of every hierarchy, for
    /// [`warren_process::CommandSpec::join_cgroups`].
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs()
            .into_iter()
            .map(|dir| dir.join("cgroup.procs"))
            .collect()
    }

    /// Whether [`HandsCgroup::freeze`] can work (a v2 cgroup or a v1 freezer).
    pub fn can_freeze(&self) -> bool {
        self.v2.is_some() || self.freezer.is_some()
    }

    /// Freezes every process in the hands and waits (at most 2 s) until the kernel says they
    /// all are.
    pub fn freeze(&self) -> io::Result<()> {
        if let Some(v2) = &self.v2 {
            write(&v2.join("cgroup.freeze"), "1")?;
        } else if let Some(freezer) = &self.freezer {
            write(&freezer.join("freezer.state"), "FROZEN")?;
        } else {
            return Err(unsupported("freezing"));
        }
        let deadline = Instant::now() + FREEZE_WAIT;
        while !self.is_frozen() {
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the hands' cgroup did not report frozen within 2 s",
                ));
            }
            std::thread::sleep(POLL);
        }
        Ok(())
    }

    /// Lets the hands' processes run again.
    pub fn thaw(&self) -> io::Result<()> {
        if let Some(v2) = &self.v2 {
            write(&v2.join("cgroup.freeze"), "0")
        } else if let Some(freezer) = &self.freezer {
            write(&freezer.join("freezer.state"), "THAWED")
        } else {
            Err(unsupported("freezing"))
        }
    }

    /// Whether the kernel reports the hands frozen (every process stopped).
    pub fn is_frozen(&self) -> bool {
        if let Some(v2) = &self.v2 {
            keyed(&v2.join("cgroup.events"), "frozen") == 1
        } else if let Some(freezer) = &self.freezer {
            std::fs::read_to_string(freezer.join("freezer.state"))
                .is_ok_and(|state| state.trim() == "FROZEN")
        } else {
            false
        }
    }

    /// Every process in the hands (host pids), in any of its hierarchies.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self
            .procs_files()
            .iter()
            .flat_map(|file| {
                std::fs::read_to_string(file)
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|line| line.trim().parse().ok())
                    .collect::<Vec<u32>>()
            })
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    pub fn is_empty(&self) -> bool {
        self.pids().is_empty()
    }

    /// Kills every process in the hands and waits (at most 5 s) until none is left: v2's
    /// `cgroup.kill`, else SIGKILL to every pid (frozen first, so nothing forks in between,
    /// then thawed so the signals are delivered), repeated until empty.
    pub fn kill_all(&self) -> io::Result<()> {
        let deadline = Instant::now() + KILL_WAIT;
        // `cgroup.kill` needs Linux 5.14; before it, v2 too is emptied by signals.
        let kill_file = self
            .v2
            .as_ref()
            .map(|v2| v2.join("cgroup.kill"))
            .filter(|file| file.exists());
        if let Some(file) = &kill_file {
            write(file, "1")?;
        }
        loop {
            let pids = self.pids();
            if pids.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{} processes left in the hands after 5 s", pids.len()),
                ));
            }
            if kill_file.is_none() {
                if self.freezer.is_some() {
                    let _ = self.freeze();
                }
                for pid in &pids {
                    let _ = warren_process::signal_pid(*pid as i32, rustix::process::Signal::KILL);
                }
                if self.freezer.is_some() {
                    self.thaw()?;
                }
            }
            std::thread::sleep(POLL * 5);
        }
    }

    /// How often the hands hit their memory and pids limits.
    pub fn limit_hits(&self) -> LimitHits {
        let oom_kills = match (&self.memory, &self.v2) {
            (Some(memory), _) => keyed(&memory.join("memory.oom_control"), "oom_kill"),
            (None, Some(v2)) => keyed(&v2.join("memory.events"), "oom_kill"),
            _ => 0,
        };
        let pids_max = match (&self.pids, &self.v2) {
            (Some(pids), _) => keyed(&pids.join("pids.events"), "max"),
            (None, Some(v2)) => keyed(&v2.join("pids.events"), "max"),
            _ => 0,
        };
        LimitHits {
            oom_kills,
            pids_max,
        }
    }

    /// Kills what is left ([`HandsCgroup::kill_all`]) and removes every cgroup of the hands.
    pub fn remove(self) -> io::Result<()> {
        if !self.is_empty() {
            self.kill_all()?;
        }
        self.rmdir_all()
    }

    fn rmdir_all(&self) -> io::Result<()> {
        let mut first_error = None;
        for dir in self.dirs() {
            if let Err(err) = remove_cgroup_dir(dir)
                && err.kind() != io::ErrorKind::NotFound
            {
                first_error.get_or_insert(io::Error::new(
                    err.kind(),
                    format!("removing {}: {err}", dir.display()),
                ));
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// `rmdir` of a cgroup whose last process just exited can fail with EBUSY while the kernel
/// still releases it (v2 answers so for a short while after `cgroup.kill`): retried, bounded.
fn remove_cgroup_dir(dir: &Path) -> io::Result<()> {
    let deadline = Instant::now() + RMDIR_WAIT;
    loop {
        match std::fs::remove_dir(dir) {
            Err(err) if err.raw_os_error() == Some(16) && Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

fn unsupported(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("{what} needs a cgroup hierarchy this host does not offer"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn own_cgroups_are_found_in_each_hierarchy() {
        let cases: &[(&str, &str, &str, Found)] = &[
            (
                "hybrid host, v1 memory in an accounting cgroup",
                HYBRID_MOUNTINFO,
                "8:pids:/\n6:freezer:/\n4:memory:/process_api/abc\n1:cpu,cpuacct:/\n0::/\n",
                Found {
                    v2: Some("/sys/fs/cgroup/unified/".into()),
                    freezer: Some("/sys/fs/cgroup/freezer/".into()),
                    memory: Some("/sys/fs/cgroup/memory/process_api/abc".into()),
                    pids: Some("/sys/fs/cgroup/pids/".into()),
                },
            ),
            (
                "pure v2 under systemd",
                "30 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n",
                "0::/system.slice/warren.service\n",
                Found {
                    v2: Some("/sys/fs/cgroup/system.slice/warren.service".into()),
                    ..Found::default()
                },
            ),
            (
                "a container whose mount root is its own cgroup",
                "30 23 0:26 /docker/x /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
                "0::/docker/x/inner\n",
                Found {
                    v2: Some("/sys/fs/cgroup/inner".into()),
                    ..Found::default()
                },
            ),
            (
                "a mount that does not show our cgroup",
                "30 23 0:26 /other /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
                "0::/docker/x\n",
                Found::default(),
            ),
            (
                "a mount point with a space",
                "30 23 0:26 / /mnt/cg\\040two rw - cgroup2 cgroup2 rw\n",
                "0::/a\n",
                Found {
                    v2: Some("/mnt/cg two/a".into()),
                    ..Found::default()
                },
            ),
            ("no cgroups at all", "", "", Found::default()),
        ];
        for (what, mountinfo, own, expected) in cases {
            assert_eq!(&find_own_cgroups(mountinfo, own), expected, "{what}");
        }
    }

    #[test]
    fn names_are_plain_words() {
        for good in ["abc", "s-1_2.3"] {
            assert_eq!(
                child_name(good).expect("valid"),
                format!("warren-hands-{good}")
            );
        }
        for bad in ["", ".", "..", "a/b", "a b", "x\n"] {
            assert!(child_name(bad).is_err(), "{bad:?}");
        }
    }
}
