//! What a child does between fork and exec beyond what std offers: staging bind mounts in a
//! mount namespace of its own ([`CommandSpec::stage_binds`]), taking descriptors at fixed
//! numbers ([`CommandSpec::fd`]), writing itself into cgroups ([`CommandSpec::join_cgroups`])
//! and, when it stages or joins, switching user and group ids only after that.
//!
//! Everything here runs in the forked child of a multi-threaded process, so each closure only
//! makes async-signal-safe system calls (`fcntl`, `dup2`, `open`, `write`, `close`, `mkdir`,
//! `open_tree`, `unshare`, `mount`, `move_mount`, `setgroups`, `setgid`, `setuid`) on values
//! prepared before the fork: no allocation, no locks. std runs `pre_exec` closures after its
//! own id switch, and a process that is no longer root can neither mount nor usually move
//! itself between cgroups; so a spec that stages or joins has its ids switched here, after
//! that, instead of by std. The parent-death signal is armed after all of it (a credential
//! change clears it).
//!
//! Staging clones each source's mount tree (`open_tree(OPEN_TREE_CLONE)`) while the child is
//! still in the daemon's mount namespace, because the kernel binds a path only from the
//! caller's own namespace and the sources' mounts stay in the daemon's; then it unshares the
//! mount namespace, makes every mount private, mounts the tmpfs and moves each detached clone
//! onto its mount point (`move_mount`).

#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::command::{CommandSpec, StageKind, StagedBinds};

/// Checks what a spec asks of the child before anything forks: fd targets above stdio, each
/// named once, and cgroup paths without NUL bytes.
pub(crate) fn validate(spec: &CommandSpec) -> io::Result<()> {
    let mut seen = Vec::new();
    for (target, _) in &spec.fds {
        if *target < 3 || seen.contains(target) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("descriptor target {target} is below 3 or given twice"),
            ));
        }
        seen.push(*target);
    }
    if let Some(staged) = &spec.staged_binds {
        staging_plan(staged)?;
    }
    cgroup_paths(&spec.cgroups).map(|_| ())
}

/// What the child of a [`CommandSpec::stage_binds`] spec needs, every path a C string.
struct StagingPlan {
    dir: CString,
    binds: Vec<(Arc<OwnedFd>, CString, StageKind)>,
}

fn staging_plan(staged: &StagedBinds) -> io::Result<StagingPlan> {
    let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidInput, what);
    if !staged.dir.is_absolute() {
        return Err(invalid(format!(
            "staging directory {} is not absolute",
            staged.dir.display()
        )));
    }
    let dir = CString::new(staged.dir.as_os_str().as_bytes()).map_err(|_| {
        invalid(format!(
            "staging directory {} contains a NUL byte",
            staged.dir.display()
        ))
    })?;
    let mut names: Vec<&str> = Vec::new();
    let mut binds = Vec::with_capacity(staged.binds.len());
    for bind in &staged.binds {
        let name = bind.name.as_str();
        if name.is_empty()
            || name == "."
            || name == ".."
            || name.contains(['/', '\0'])
            || names.contains(&name)
        {
            return Err(invalid(format!(
                "staged bind name {name:?} is not one path component, or is given twice"
            )));
        }
        names.push(name);
        let target = staged.dir.join(name);
        let target = CString::new(target.as_os_str().as_bytes()).map_err(|_| {
            invalid(format!(
                "staged bind {} contains a NUL byte",
                target.display()
            ))
        })?;
        binds.push((bind.source.clone(), target, bind.kind));
    }
    Ok(StagingPlan { dir, binds })
}

/// Makes the child mount a tmpfs on `staged.dir` in a mount namespace of its own and bind each
/// source at `dir/<name>` ([`CommandSpec::stage_binds`]). Registered before every other
/// `pre_exec` step, while the sources still hold their numbers and the child is still root.
pub(crate) fn stage_binds(
    command: &mut tokio::process::Command,
    staged: &StagedBinds,
) -> io::Result<()> {
    use rustix::fs::{Mode, OFlags};
    use rustix::mount::{
        MountFlags, MountPropagationFlags, MoveMountFlags, OpenTreeFlags, mount, mount_change,
        move_mount, open_tree,
    };

    let plan = staging_plan(staged)?;
    // Reserved before the fork: the child pushes one clone per bind and must not allocate.
    let mut clones: Vec<OwnedFd> = Vec::with_capacity(plan.binds.len());
    // SAFETY: the closure runs in the forked child before exec, where this is the only
    // thread. It only calls `open_tree`, `unshare(CLONE_NEWNS)`, `mount`, `mkdir`, `open`,
    // `close` and `move_mount` on C strings and descriptors prepared before the fork (the
    // `Arc`s keep the sources open until the spawn), and pushes into a vector whose capacity
    // was reserved before the fork, so it never allocates. `unshare_unsafe`'s hazard is
    // `CLONE_FILES` (descriptors other threads still use); only `CLONE_NEWNS` is unshared.
    unsafe {
        command.pre_exec(move || {
            clones.clear();
            for (source, _, _) in &plan.binds {
                let clone = open_tree(
                    source,
                    c"",
                    OpenTreeFlags::OPEN_TREE_CLONE
                        | OpenTreeFlags::OPEN_TREE_CLOEXEC
                        | OpenTreeFlags::AT_EMPTY_PATH
                        | OpenTreeFlags::AT_RECURSIVE,
                )?;
                clones.push(clone);
            }
            rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS)?;
            // Nothing mounted from here on propagates into the daemon's namespace.
            mount_change(
                c"/",
                MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
            )?;
            mount(
                c"tmpfs",
                plan.dir.as_c_str(),
                c"tmpfs",
                MountFlags::NOSUID | MountFlags::NODEV,
                c"mode=0755",
            )?;
            for ((_, target, kind), clone) in plan.binds.iter().zip(&clones) {
                match kind {
                    StageKind::Dir => {
                        rustix::fs::mkdir(target.as_c_str(), Mode::from_raw_mode(0o755))?
                    }
                    StageKind::File => drop(rustix::fs::open(
                        target.as_c_str(),
                        OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::CLOEXEC,
                        Mode::from_raw_mode(0o644),
                    )?),
                }
                move_mount(
                    clone,
                    c"",
                    rustix::fs::CWD,
                    target.as_c_str(),
                    MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
                )?;
            }
            // The clones came out of the daemon's peer groups: nothing mounted on the host
            // later reaches the command through them.
            mount_change(
                plan.dir.as_c_str(),
                MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
            )?;
            clones.clear();
            Ok(())
        });
    }
    Ok(())
}

fn cgroup_paths(files: &[PathBuf]) -> io::Result<Vec<CString>> {
    files
        .iter()
        .map(|file| {
            CString::new(file.as_os_str().as_bytes()).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("cgroup path {} contains a NUL byte", file.display()),
                )
            })
        })
        .collect()
}

/// Marks every descriptor from 3 up close-on-exec: `close_range` (Linux 5.11+), else one
/// `fcntl` per possible descriptor up to the soft limit (at most 65536).
fn cloexec_from_3() -> io::Result<()> {
    // SAFETY: with CLOSE_RANGE_CLOEXEC nothing is closed, only flagged; an async-signal-safe
    // system call.
    let result = unsafe { libc::close_range(3, u32::MAX, libc::CLOSE_RANGE_CLOEXEC as i32) };
    if result == 0 {
        return Ok(());
    }
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(65536)
        .min(65536) as RawFd;
    for fd in 3..limit {
        // SAFETY: only wrapped to name the descriptor; never closed through the wrapper.
        let fd = ManuallyDrop::new(unsafe { OwnedFd::from_raw_fd(fd) });
        if let Ok(flags) = rustix::io::fcntl_getfd(&*fd) {
            rustix::io::fcntl_setfd(&*fd, flags | rustix::io::FdFlags::CLOEXEC)?;
        }
    }
    Ok(())
}

/// Makes the child hold each source descriptor at its target number, inherited across exec;
/// with `close_others`, every other descriptor above 2 is closed at exec.
pub(crate) fn pass_fds(
    command: &mut tokio::process::Command,
    fds: &[(i32, Arc<OwnedFd>)],
    close_others: bool,
) {
    if fds.is_empty() && !close_others {
        return;
    }
    let fds: Vec<(RawFd, Arc<OwnedFd>)> = fds.to_vec();
    let above_targets = fds.iter().map(|(target, _)| *target).max().unwrap_or(2) + 1;
    // Prepared here, before the fork: the child must not allocate.
    let mut parked: Vec<RawFd> = Vec::with_capacity(fds.len());
    // SAFETY: the closure runs in the forked child before exec. It only calls `fcntl`
    // (F_DUPFD_CLOEXEC, F_SETFD), `close_range`, `getrlimit`, `dup2` and `close` on descriptors the child owns (its copies of the
    // parent's), and pushes into a vector whose capacity was reserved before the fork, so it
    // never allocates. The `Arc`s it holds keep the parent's descriptors open until the spawn.
    unsafe {
        command.pre_exec(move || {
            parked.clear();
            // First every source moves above every target (close-on-exec, so the copies vanish
            // at exec), so no dup2 onto a target can clobber a source still to be placed.
            for (_, source) in &fds {
                let copy = rustix::io::fcntl_dupfd_cloexec(source, above_targets)?;
                parked.push(ManuallyDrop::new(copy).as_raw_fd());
            }
            if close_others {
                cloexec_from_3()?;
            }
            for ((target, _), copy) in fds.iter().zip(&parked) {
                // SAFETY: `copy` is a descriptor this child just made and owns; `target` is
                // only wrapped so rustix can name it and is never closed through the wrapper.
                let copy = ManuallyDrop::new(OwnedFd::from_raw_fd(*copy));
                let mut target = ManuallyDrop::new(OwnedFd::from_raw_fd(*target));
                rustix::io::dup2(&*copy, &mut target)?;
            }
            for copy in &parked {
                drop(OwnedFd::from_raw_fd(*copy));
            }
            Ok(())
        });
    }
}

/// Makes the child write itself (`0`) into every `cgroup.procs` file in `files`, then switch
/// to `gid` and `uid` (dropping supplementary groups), as std would have.
pub(crate) fn join_cgroups_then_switch_ids(
    command: &mut tokio::process::Command,
    files: &[PathBuf],
    uid: Option<u32>,
    gid: Option<u32>,
) -> io::Result<()> {
    let files = cgroup_paths(files)?;
    // SAFETY: the closure runs in the forked child before exec and only calls `open`, `write`,
    // `close`, `setgroups`, `setgid` and `setuid` on C strings and ids prepared before the fork.
    // The raw id syscalls act on the calling thread, which in the child is the only thread.
    unsafe {
        command.pre_exec(move || {
            for file in &files {
                let procs = rustix::fs::open(
                    file.as_c_str(),
                    rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                )?;
                let written = rustix::io::write(&procs, b"0")?;
                if written != 1 {
                    return Err(io::Error::from(io::ErrorKind::WriteZero));
                }
            }
            if uid.is_some() {
                // As std: without an explicit group list, root's supplementary groups go. Not
                // being allowed to (EPERM, not root) leaves them as they are.
                match rustix::thread::set_thread_groups(&[]) {
                    Ok(()) | Err(rustix::io::Errno::PERM) => {}
                    Err(err) => return Err(err.into()),
                }
            }
            if let Some(gid) = gid {
                rustix::thread::set_thread_gid(rustix::process::Gid::from_raw(gid))?;
            }
            if let Some(uid) = uid {
                rustix::thread::set_thread_uid(rustix::process::Uid::from_raw(uid))?;
            }
            Ok(())
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::path::Path;
    use std::time::Duration;

    use tokio::io::AsyncReadExt;

    use crate::pipes::{PipeOptions, StdinMode};
    use crate::{CommandSpec, Connect, TreeMarker, spawn};

    fn sh(script: &str) -> CommandSpec {
        CommandSpec::new("/bin/sh", &TreeMarker::new())
            .arg("-c")
            .arg(script)
    }

    async fn output_of(spec: &CommandSpec) -> String {
        let mut child = spawn(spec, Connect::Pipes(PipeOptions::default()))
            .expect("spawns")
            .into_pipes();
        let mut out = String::new();
        tokio::time::timeout(
            Duration::from_secs(20),
            child.stdout.read_to_string(&mut out),
        )
        .await
        .expect("output ends within 20 s")
        .expect("reads output");
        child.child.wait().await.expect("waits");
        out
    }

    async fn read_pipe(read: std::io::PipeReader) -> String {
        let mut rx = tokio::net::unix::pipe::Receiver::from_owned_fd(read.into())
            .expect("registers the pipe");
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(20), rx.read_to_string(&mut out))
            .await
            .expect("pipe reaches end of file within 20 s")
            .expect("reads the pipe");
        out
    }

    #[tokio::test]
    async fn descriptors_are_inherited_at_their_targets() {
        let (read_a, write_a) = std::io::pipe().expect("pipe");
        let (read_b, write_b) = std::io::pipe().expect("pipe");
        let write_a = std::sync::Arc::new(std::os::fd::OwnedFd::from(write_a));
        let write_b = std::sync::Arc::new(std::os::fd::OwnedFd::from(write_b));
        // One target is the number the other source has in this process: placing must not
        // clobber a source that is still to be placed.
        let b_raw = std::os::fd::AsRawFd::as_raw_fd(&*write_b);
        let target_a = b_raw;
        let target_b = b_raw + 7;
        // bash, since dash only redirects descriptors 0 to 9.
        let spec = CommandSpec::new("/bin/bash", &TreeMarker::new())
            .arg("-c")
            .arg(format!("echo to-a >&{target_a}; echo to-b >&{target_b}"))
            .fd(target_a, write_a)
            .fd(target_b, write_b);
        let mut child = spawn(&spec, Connect::Pipes(PipeOptions::default()))
            .expect("spawns")
            .into_pipes();
        // Only the child holds the write ends now, so the reads end when it exits.
        drop(spec);
        let (a, b) = tokio::join!(read_pipe(read_a), read_pipe(read_b));
        assert_eq!((a.as_str(), b.as_str()), ("to-a\n", "to-b\n"));
        assert!(child.child.wait().await.expect("waits").success());
    }

    #[tokio::test]
    async fn other_descriptors_are_closed_only_when_asked() {
        let (_read, write) = std::io::pipe().expect("pipe");
        let leaky = std::os::fd::OwnedFd::from(write);
        // As a daemon's jobserver pipe or listener may be: inherited by every child.
        rustix::io::fcntl_setfd(&leaky, rustix::io::FdFlags::empty()).expect("clears cloexec");
        let raw = leaky.as_raw_fd();
        let (_, passed) = std::io::pipe().expect("pipe");
        let passed = std::sync::Arc::new(std::os::fd::OwnedFd::from(passed));
        let list = "ls /proc/self/fd | tr '\\n' ' '";
        let plain = output_of(&sh(list)).await;
        let closed = output_of(&sh(list).fd(9, passed).close_other_fds()).await;
        drop(leaky);
        let numbers = |out: &str| -> Vec<i32> {
            out.split_whitespace()
                .filter_map(|n| n.parse().ok())
                .collect()
        };
        assert!(numbers(&plain).contains(&raw), "{plain}");
        // stdio, the passed descriptor, and the one `ls` reads the directory through.
        assert_eq!(numbers(&closed), vec![0, 1, 2, 3, 9], "{closed}");
    }

    #[tokio::test]
    async fn targets_below_three_or_repeated_are_refused() {
        let (_, write) = std::io::pipe().expect("pipe");
        let fd = std::sync::Arc::new(std::os::fd::OwnedFd::from(write));
        for spec in [
            sh("true").fd(2, fd.clone()),
            sh("true").fd(5, fd.clone()).fd(5, fd.clone()),
        ] {
            let err = spawn(&spec, Connect::Pipes(PipeOptions::default())).expect_err("refused");
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        }
    }

    /// A fresh child cgroup of this process's own, in the v2 hierarchy when one is mounted,
    /// else in the v1 pids hierarchy; removed on drop.
    struct TestCgroup {
        dir: std::path::PathBuf,
        /// How the cgroup shows in `/proc/<pid>/cgroup`.
        line: String,
    }

    impl TestCgroup {
        fn create(name: &str) -> TestCgroup {
            let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
            let own = std::fs::read_to_string("/proc/self/cgroup").expect("own cgroups");
            let mounts: Vec<Vec<&str>> = mountinfo
                .lines()
                .map(|l| l.split_whitespace().collect())
                .collect();
            let find = |fstype: &str, option: Option<&str>| {
                mounts.iter().find_map(|fields| {
                    let sep = fields.iter().position(|f| *f == "-")?;
                    let matches = fields.get(sep + 1) == Some(&fstype)
                        && option.is_none_or(|o| {
                            fields
                                .get(sep + 3)
                                .is_some_and(|opts| opts.split(',').any(|x| x == o))
                        });
                    matches.then(|| (fields[3].to_owned(), fields[4].to_owned()))
                })
            };
            let (prefix, controller, (root, mount)) = match find("cgroup2", None) {
                Some(found) => ("0::", "", found),
                None => (
                    "",
                    "pids",
                    find("cgroup", Some("pids")).expect("a pids cgroup"),
                ),
            };
            let own_path = own
                .lines()
                .find_map(|l| {
                    let (_, rest) = l.split_once(':')?;
                    let (controllers, path) = rest.split_once(':')?;
                    let wanted = if controller.is_empty() {
                        controllers.is_empty()
                    } else {
                        controllers.split(',').any(|c| c == controller)
                    };
                    wanted.then(|| path.to_owned())
                })
                .expect("own cgroup path");
            let relative = own_path.strip_prefix(&root).unwrap_or(&own_path);
            let parent = Path::new(&mount).join(relative.trim_start_matches('/'));
            let dir = parent.join(format!("{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir(&dir);
            std::fs::create_dir(&dir).expect("creates a test cgroup");
            let cgroup_path = format!("{}/{}", own_path.trim_end_matches('/'), dir_name(&dir));
            let line = if prefix.is_empty() {
                format!(":{controller}:{cgroup_path}")
            } else {
                format!("{prefix}{cgroup_path}")
            };
            TestCgroup { dir, line }
        }

        fn procs(&self) -> std::path::PathBuf {
            self.dir.join("cgroup.procs")
        }
    }

    fn dir_name(dir: &Path) -> String {
        dir.file_name()
            .expect("named")
            .to_string_lossy()
            .into_owned()
    }

    impl Drop for TestCgroup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir(&self.dir);
        }
    }

    #[tokio::test]
    async fn the_child_starts_inside_the_cgroups_it_joins() {
        let cgroup = TestCgroup::create("warren-process-test-join");
        let spec = sh("cat /proc/self/cgroup; id -u").join_cgroups(vec![cgroup.procs()]);
        let out = output_of(&spec).await;
        assert!(
            out.lines().any(|l| l.ends_with(&cgroup.line)),
            "{out:?} lacks {:?}",
            cgroup.line
        );
    }

    #[tokio::test]
    async fn joining_then_switching_ids_works_as_root() {
        if !rustix::process::geteuid().is_root() {
            // Switching ids needs root; the join alone is the test above.
            return;
        }
        let cgroup = TestCgroup::create("warren-process-test-join-uid");
        let mut spec = sh("cat /proc/self/cgroup; echo \"ids $(id -u) $(id -g) $(id -G)\"")
            .join_cgroups(vec![cgroup.procs()]);
        spec.uid = Some(1000);
        spec.gid = Some(1000);
        let out = output_of(&spec).await;
        assert!(out.lines().any(|l| l.ends_with(&cgroup.line)), "{out:?}");
        assert!(out.contains("ids 1000 1000 1000\n"), "{out:?}");
    }

    #[tokio::test]
    async fn a_cgroup_that_cannot_be_joined_fails_the_spawn() {
        let spec = sh("true").join_cgroups(vec!["/nonexistent/cgroup.procs".into()]);
        let err = spawn(&spec, Connect::Pipes(PipeOptions::default())).expect_err("fails");
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    }

    fn open_path(path: &Path) -> std::sync::Arc<std::os::fd::OwnedFd> {
        let fd = rustix::fs::open(
            path,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .expect("opens O_PATH");
        std::sync::Arc::new(fd)
    }

    fn stage(source: &Path, name: &str, kind: crate::StageKind) -> crate::StageBind {
        crate::StageBind {
            source: open_path(source),
            name: name.to_owned(),
            kind,
        }
    }

    #[tokio::test]
    async fn staged_binds_reach_a_switched_user_through_an_unsearchable_parent() {
        if !rustix::process::geteuid().is_root() {
            // Mounting needs root; the refusals below run as anyone.
            return;
        }
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let root = tempfile::tempdir().expect("temp dir");
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o700))
            .expect("chmod 0700");
        let dir = root.path().join("dir");
        std::fs::create_dir(&dir).expect("mkdir");
        std::os::unix::fs::chown(&dir, Some(1000), Some(1000)).expect("chown");
        let file = root.path().join("file");
        std::fs::write(&file, "staged file\n").expect("writes");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");

        // The temp dir's own name under the host /tmp, which the staging tmpfs hides.
        let host = dir_name(root.path());
        let before = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        let mut spec = sh(&format!(
            "id -u; cat /tmp/f; echo made > /tmp/d/made && echo wrote; \
             test -e /tmp/{host} && echo host-tmp-visible; ls -A /tmp"
        ))
        .stage_binds(
            "/tmp",
            vec![
                stage(&dir, "d", crate::StageKind::Dir),
                stage(&file, "f", crate::StageKind::File),
            ],
        );
        spec.uid = Some(1000);
        spec.gid = Some(1000);
        let out = output_of(&spec).await;
        assert_eq!(out, "1000\nstaged file\nwrote\nd\nf\n");
        let made = std::fs::metadata(dir.join("made")).expect("the write landed on the host");
        assert_eq!((made.uid(), made.gid()), (1000, 1000));
        let after = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        assert_eq!(before, after, "the daemon's mount namespace changed");
    }

    #[tokio::test]
    async fn a_staging_that_cannot_be_mounted_fails_the_spawn() {
        if !rustix::process::geteuid().is_root() {
            return;
        }
        let root = tempfile::tempdir().expect("temp dir");
        let spec = sh("true").stage_binds(
            "/nonexistent-warren-staging",
            vec![stage(root.path(), "d", crate::StageKind::Dir)],
        );
        let err = spawn(&spec, Connect::Pipes(PipeOptions::default())).expect_err("fails");
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{err}");
        // A file's clone does not fit the directory made for a `Dir` bind.
        let file = root.path().join("file");
        std::fs::write(&file, "").expect("writes");
        let spec = sh("true").stage_binds("/tmp", vec![stage(&file, "d", crate::StageKind::Dir)]);
        spawn(&spec, Connect::Pipes(PipeOptions::default())).expect_err("fails");
    }

    #[tokio::test]
    async fn staged_bind_names_must_be_single_unique_components() {
        let root = tempfile::tempdir().expect("temp dir");
        let bind = |name: &str| stage(root.path(), name, crate::StageKind::Dir);
        for (dir, binds) in [
            ("/tmp", vec![bind("")]),
            ("/tmp", vec![bind("..")]),
            ("/tmp", vec![bind("a/b")]),
            ("/tmp", vec![bind("a"), bind("a")]),
            ("tmp", vec![bind("a")]),
        ] {
            let spec = sh("true").stage_binds(dir, binds);
            let err = spawn(&spec, Connect::Pipes(PipeOptions::default())).expect_err("refused");
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
        }
    }

    /// Env var that turns [`an_outliving_child_leads_its_own_session`] into the helper process
    /// of [`an_outliving_child_survives_the_death_of_its_spawner`].
    const HELPER: &str = "WARREN_PROCESS_TEST_OUTLIVE_HELPER";

    fn sleeper(outlive: bool) -> CommandSpec {
        let spec = CommandSpec::new("/bin/sleep", &TreeMarker::new()).arg("300");
        if outlive { spec.outlive_daemon() } else { spec }
    }

    #[tokio::test]
    async fn an_outliving_child_leads_its_own_session() {
        let helper = std::env::var(HELPER).ok();
        let outlive = helper.as_deref() != Some("plain");
        let options = PipeOptions {
            stdin: StdinMode::Null,
            leader: crate::pipes::Leader::ProcessGroup,
            ..PipeOptions::default()
        };
        let child = spawn(&sleeper(outlive), Connect::Pipes(options))
            .expect("spawns")
            .into_pipes();
        let pid = child.pid() as i32;
        let stat = crate::procfs::stat(pid).expect("the sleeper runs");
        if outlive {
            // Asked for a process group only, it still leads a session of its own.
            assert_eq!((stat.pgid, stat.sid), (pid, pid));
        }
        if helper.is_some() {
            // The helper leaves the sleeper running and exits: the parent test checks on it.
            println!("\nsleeper-pid {pid}");
            return;
        }
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid).expect("positive pid"),
            rustix::process::Signal::KILL,
        );
        let mut child = child;
        child.child.wait().await.expect("waits");
    }

    /// Runs this test binary's [`an_outliving_child_leads_its_own_session`] as a helper process
    /// that spawns a sleeper and exits; returns the sleeper's pid.
    async fn sleeper_of_a_dead_helper(mode: &str) -> i32 {
        let exe = std::env::current_exe().expect("own test binary");
        let spec = CommandSpec::new(exe, &TreeMarker::new())
            .args([
                "--exact",
                "child_setup::tests::an_outliving_child_leads_its_own_session",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(HELPER, mode);
        let out = output_of(&spec).await;
        out.lines()
            .find_map(|l| l.strip_prefix("sleeper-pid ")?.trim().parse().ok())
            .unwrap_or_else(|| panic!("the helper printed no sleeper pid: {out}"))
    }

    fn alive(pid: i32) -> bool {
        crate::procfs::stat(pid).is_some_and(|s| s.state != 'Z')
    }

    async fn wait_until(what: &str, check: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !check() {
            assert!(std::time::Instant::now() < deadline, "timed out: {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn an_outliving_child_survives_the_death_of_its_spawner() {
        let pid = sleeper_of_a_dead_helper("outlive").await;
        // The helper has exited (its output ended and it was waited for); give the kernel no
        // chance to be slow with a parent-death signal either.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let survived = alive(pid);
        if let Some(pid) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
        assert!(
            survived,
            "the outliving sleeper {pid} died with its spawner"
        );
    }

    #[tokio::test]
    async fn a_plain_child_dies_with_its_spawner() {
        let pid = sleeper_of_a_dead_helper("plain").await;
        wait_until("the plain sleeper gets its parent-death signal", || {
            !alive(pid)
        })
        .await;
    }

    #[tokio::test]
    async fn a_child_gets_default_signal_dispositions_even_when_the_daemon_ignores_sigint() {
        // SAFETY: `signal` with constant arguments; ignoring SIGINT and SIGQUIT in the test
        // process is what a daemon started with `&` from a script inherits. Nothing in these
        // tests sends either signal to the test process.
        unsafe {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            libc::signal(libc::SIGQUIT, libc::SIG_IGN);
        }
        let spec = CommandSpec::new("/bin/cat", &TreeMarker::new()).arg("/proc/self/status");
        let options = PipeOptions {
            stdin: StdinMode::Null,
            ..PipeOptions::default()
        };
        let child = spawn(&spec, Connect::Pipes(options))
            .expect("spawns")
            .into_pipes();
        let mut status = String::new();
        let mut stdout = child.stdout;
        tokio::io::AsyncReadExt::read_to_string(&mut stdout, &mut status)
            .await
            .expect("reads");
        let mut child = child.child;
        child.wait().await.expect("waits");
        let ignored = status
            .lines()
            .find_map(|line| line.strip_prefix("SigIgn:"))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
            .expect("SigIgn in /proc/self/status");
        assert_eq!(
            ignored & (1 << (libc::SIGINT - 1) | 1 << (libc::SIGQUIT - 1)),
            0,
            "SIGINT and SIGQUIT are back to default in the child: {ignored:#x}"
        );
    }
}
