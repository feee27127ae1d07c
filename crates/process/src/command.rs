//! The one description of a command to start ([`CommandSpec`]), the one way to start it
//! ([`spawn`], on a PTY or on pipes), the owned child every spawn returns ([`OwnedChild`]), and
//! the one way to signal a command's process group ([`signal_group`]).
//!
//! A [`CommandSpec`] says what runs, under which [`EnvPolicy`], with which ids, and which tree
//! marker ([`TreeMarker`]) it carries: the caller creates the marker first, so it can list the
//! tree in a [`crate::TreeRegistry`] before the process exists. [`spawn`] builds the
//! environment with [`crate::env::build_env`], appends the marker after it (so no policy can
//! remove it), and forks on one long-lived thread of this process ([`crate::spawner`]), so the
//! child's parent-death signal (SIGKILL) fires when this process dies and at no other time,
//! unless the spec says [`CommandSpec::outlive_daemon`]. A spec can also hand the child
//! descriptors at fixed numbers ([`CommandSpec::fd`]) and have it join cgroups before exec
//! ([`CommandSpec::join_cgroups`]), and, as root, mount directories and files it was given as
//! descriptors into a staging tmpfs of a mount namespace of its own before its ids switch
//! ([`CommandSpec::stage_binds`]); [`crate::child_setup`] does all three in the child.
//! Every child is registered with [`crate::reaper::spawn_owned`].

use std::ffi::OsString;
use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Arc;

use rustix::process::{Pid, Signal};

use crate::env::EnvPolicy;
use crate::pipes::{PipeOptions, PipedChild};
use crate::pty::{PtyChild, PtySize};
use crate::tree::{TREE_MARKER_VAR, TreeMarker};

/// What to run: program, arguments, working directory, environment policy and additions, the
/// user and group ids to switch to, and the tree marker.
#[derive(Debug, Clone)]
pub struct CommandSpec {
    pub program: OsString,
    pub args: Vec<OsString>,
    /// Working directory; `None` keeps the daemon's.
    pub cwd: Option<PathBuf>,
    /// Which of the daemon's variables the command starts with.
    pub env_policy: EnvPolicy,
    /// Variables added after the policy (later entries win).
    pub env: Vec<(OsString, OsString)>,
    /// User id to switch to before exec (needs privileges).
    pub uid: Option<u32>,
    /// Group id to switch to before exec (needs privileges).
    pub gid: Option<u32>,
    /// The tree's marker, put in the environment as [`TREE_MARKER_VAR`].
    pub marker: TreeMarker,
    /// Descriptors the child holds at fixed numbers (target, source), inherited across exec.
    pub fds: Vec<(i32, Arc<OwnedFd>)>,
    /// `cgroup.procs` files the child writes itself into before exec.
    pub cgroups: Vec<PathBuf>,
    /// No parent-death signal, and the child leads a new session: it survives the daemon.
    pub outlive_daemon: bool,
    /// Every descriptor above 2 that is not in `fds` is closed at exec, close-on-exec or not.
    pub close_other_fds: bool,
    /// Sources the child mounts into a staging tmpfs of its own mount namespace, as the
    /// daemon's user, before its ids switch ([`CommandSpec::stage_binds`]).
    pub staged_binds: Option<StagedBinds>,
}

/// What [`CommandSpec::stage_binds`] mounts: a fresh tmpfs at `dir` holding one bind mount per
/// entry of `binds`, at `dir/<name>`.
#[derive(Debug, Clone)]
pub struct StagedBinds {
    /// An existing directory the tmpfs is mounted on (hidden in the child's namespace only).
    pub dir: PathBuf,
    pub binds: Vec<StageBind>,
}

/// One bind mount of [`StagedBinds`]: `source` (any descriptor of it, `O_PATH` will do)
/// mounted at `<dir>/<name>`.
#[derive(Debug, Clone)]
pub struct StageBind {
    pub source: Arc<OwnedFd>,
    /// One path component: no `/`, not empty, `.` or `..`; unique within the staging.
    pub name: String,
    pub kind: StageKind,
}

/// What a [`StageBind`]'s source is, so the mount point made for it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StageKind {
    Dir,
    File,
}

/// How [`spawn`] connects the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connect {
    /// A new PTY of this size, the controlling terminal of a new session the command leads.
    Pty(PtySize),
    /// Pipes, as the options say.
    Pipes(PipeOptions),
}

/// A started command, connected as asked.
#[derive(Debug)]
pub enum Spawned {
    Pty(PtyChild),
    Pipes(PipedChild),
}

impl Spawned {
    /// The PTY child of a [`Connect::Pty`] spawn.
    pub fn into_pty(self) -> PtyChild {
        match self {
            Spawned::Pty(child) => child,
            Spawned::Pipes(_) => unreachable!("spawn(Connect::Pty) returns Spawned::Pty"),
        }
    }

    /// The piped child of a [`Connect::Pipes`] spawn.
    pub fn into_pipes(self) -> PipedChild {
        match self {
            Spawned::Pipes(child) => child,
            Spawned::Pty(_) => unreachable!("spawn(Connect::Pipes) returns Spawned::Pipes"),
        }
    }
}

/// Starts `spec` connected as `connect` says. Must be called inside a tokio runtime. A program
/// that cannot be started (missing, not executable, bad cwd) is an immediate error.
pub fn spawn(spec: &CommandSpec, connect: Connect) -> io::Result<Spawned> {
    crate::child_setup::validate(spec)?;
    if let Some(registry) = crate::registry::global() {
        registry.list(&spec.marker);
    }
    match connect {
        Connect::Pty(size) => crate::pty::spawn_pty(spec, size).map(Spawned::Pty),
        Connect::Pipes(options) => crate::pipes::spawn_piped(spec, options).map(Spawned::Pipes),
    }
}

impl CommandSpec {
    /// `program` under [`EnvPolicy::Daemon`], carrying `marker`.
    pub fn new(program: impl Into<OsString>, marker: &TreeMarker) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            cwd: None,
            env_policy: EnvPolicy::Daemon,
            env: Vec::new(),
            uid: None,
            gid: None,
            marker: marker.clone(),
            fds: Vec::new(),
            cgroups: Vec::new(),
            outlive_daemon: false,
            close_other_fds: false,
            staged_binds: None,
        }
    }

    /// Has the child, before anything else it does before exec and before its ids switch,
    /// enter a mount namespace of its own (every mount in it private, so nothing propagates
    /// back), mount a fresh tmpfs (mode 0755) on `dir` and bind-mount each source at
    /// `dir/<name>` (recursively, as the source's own mount flags have it). So a program that
    /// runs as another user (bwrap as the hands' uid) reaches the sources by a path it can
    /// search, wherever they are on the host. Needs `CAP_SYS_ADMIN` (a root daemon); any
    /// failure fails the spawn. This process's mount namespace is untouched.
    pub fn stage_binds(mut self, dir: impl Into<PathBuf>, binds: Vec<StageBind>) -> Self {
        self.staged_binds = Some(StagedBinds {
            dir: dir.into(),
            binds,
        });
        self
    }

    /// The child keeps only stdio and the descriptors given with [`CommandSpec::fd`]: nothing
    /// this process opened without close-on-exec (a jobserver pipe, a listener) leaks into it.
    pub fn close_other_fds(mut self) -> Self {
        self.close_other_fds = true;
        self
    }

    /// Gives the child `fd` as descriptor `target` (3 or more), without close-on-exec. Several
    /// may be given, each with its own target.
    pub fn fd(mut self, target: i32, fd: Arc<OwnedFd>) -> Self {
        self.fds.push((target, fd));
        self
    }

    /// Has the child write itself into each `cgroup.procs` file before exec, so it and every
    /// descendant start inside those cgroups. A failed write fails the spawn. With a uid or
    /// gid, the ids are switched after the joins.
    pub fn join_cgroups(mut self, procs_files: Vec<PathBuf>) -> Self {
        self.cgroups.extend(procs_files);
        self
    }

    /// The child gets no parent-death signal and leads a new session (on pipes, whatever
    /// [`crate::pipes::Leader`] says), so it survives this process and its terminal. Someone
    /// else (a later daemon, by marker or cgroup) must stop it.
    pub fn outlive_daemon(mut self) -> Self {
        self.outlive_daemon = true;
        self
    }

    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    pub fn args<I: Into<OsString>>(mut self, args: impl IntoIterator<Item = I>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn cwd(mut self, cwd: impl Into<PathBuf>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    pub fn env_policy(mut self, policy: EnvPolicy) -> Self {
        self.env_policy = policy;
        self
    }

    /// The complete environment the command starts with, marker included: the policy applied
    /// to this process's environment, the additions, then [`TREE_MARKER_VAR`]. A daemon that is
    /// itself a marked tree passes its markers on (`outer:inner`), so killing an outer tree
    /// also finds what an inner daemon started after that daemon died.
    pub fn environment(&self) -> Vec<(OsString, OsString)> {
        let mut env = crate::env::build_env(&self.env_policy, std::env::vars_os(), &self.env);
        env.retain(|(name, _)| name != TREE_MARKER_VAR);
        let chain = match std::env::var(TREE_MARKER_VAR) {
            Ok(outer) if !outer.is_empty() => format!("{outer}:{}", self.marker),
            _ => self.marker.to_string(),
        };
        env.push((TREE_MARKER_VAR.into(), chain.into()));
        env
    }

    /// The tokio command for this spec. Stdio and the session or process group are the
    /// spawner's business; staged binds, descriptors, cgroups, ids and the parent-death signal
    /// are set here, in that order.
    // The one place a process command is made: this crate is the spawner (clippy.toml).
    #[allow(clippy::disallowed_methods)]
    pub(crate) fn to_tokio(&self) -> io::Result<tokio::process::Command> {
        let mut command = tokio::process::Command::new(&self.program);
        command.args(&self.args);
        if let Some(cwd) = &self.cwd {
            command.current_dir(cwd);
        }
        command.env_clear();
        command.envs(self.environment());
        // Before the descriptors are placed: a dup2 onto a target may replace a staging source.
        if let Some(staged) = &self.staged_binds {
            crate::child_setup::stage_binds(&mut command, staged)?;
        }
        crate::child_setup::pass_fds(&mut command, &self.fds, self.close_other_fds);
        if self.cgroups.is_empty() && self.staged_binds.is_none() {
            if let Some(uid) = self.uid {
                command.uid(uid);
            }
            if let Some(gid) = self.gid {
                command.gid(gid);
            }
        } else {
            crate::child_setup::join_cgroups_then_switch_ids(
                &mut command,
                &self.cgroups,
                self.uid,
                self.gid,
            )?;
        }
        command.kill_on_drop(false);
        crate::spawner::default_signal_dispositions(&mut command);
        if !self.outlive_daemon {
            crate::spawner::die_with_this_process(&mut command);
        }
        Ok(command)
    }
}

/// A spawned child that is registered with the reaper; [`OwnedChild::wait`] releases it.
/// Dropping it neither kills nor reaps the child.
#[derive(Debug)]
pub struct OwnedChild {
    child: tokio::process::Child,
    pid: u32,
    released: bool,
}

impl OwnedChild {
    /// Wraps a child that [`crate::reaper::spawn_owned`] registered.
    pub(crate) fn new(child: tokio::process::Child) -> io::Result<Self> {
        let pid = child
            .id()
            .ok_or_else(|| io::Error::other("spawned child has no pid"))?;
        Ok(Self {
            child,
            pid,
            released: false,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Waits for the child to exit and hands its pid back to the reaper. Cancel-safe: dropping
    /// the future before completion leaves the child owned; waiting again after the exit
    /// returns the same status.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        let status = self.child.wait().await?;
        if !self.released {
            self.released = true;
            crate::reaper::release(self.pid);
        }
        Ok(status)
    }
}

impl OwnedChild {
    /// [`OwnedChild::wait`] as the exit code a client sees (-1 after a signal, or when waiting
    /// failed, which is logged).
    pub async fn wait_code(&mut self) -> i32 {
        match self.wait().await {
            Ok(status) => exit_code(status),
            Err(err) => {
                tracing::warn!(pid = self.pid(), %err, "waiting for a command failed");
                -1
            }
        }
    }
}

/// The exit code a client sees: the process's code, or -1 when a signal killed it.
pub fn exit_code(status: ExitStatus) -> i32 {
    status.code().unwrap_or(-1)
}

/// Sends `signal` to process group `pgid`. Refuses groups 0 and 1 and the daemon's own group,
/// which a stale or racy lookup could otherwise hit.
pub fn signal_group(pgid: i32, signal: Signal) -> io::Result<()> {
    let (own, _) = crate::tree::own_group_and_session();
    if pgid <= 1 || pgid == own {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "refusing to signal this process group",
        ));
    }
    let pgid = Pid::from_raw(pgid).expect("pgid checked positive above");
    rustix::process::kill_process_group(pgid, signal).map_err(io::Error::from)
}

/// Sends `signal` to process `pid`. Refuses 0, 1, negative pids (groups) and this process,
/// which a stale or racy lookup could otherwise hit.
pub fn signal_pid(pid: i32, signal: Signal) -> io::Result<()> {
    if pid <= 1 || pid as u32 == std::process::id() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "refusing to signal this process",
        ));
    }
    let pid = Pid::from_raw(pid).expect("pid checked positive above");
    rustix::process::kill_process(pid, signal).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_pid_refuses_the_kernel_init_groups_and_this_process() {
        for pid in [-5, 0, 1, std::process::id() as i32] {
            let err = signal_pid(pid, Signal::CONT).expect_err("refused");
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "pid {pid}");
        }
    }

    #[test]
    fn signal_group_refuses_kernel_init_and_own_group() {
        let (own, _) = crate::tree::own_group_and_session();
        for pgid in [-5, 0, 1, own] {
            let err = signal_group(pgid, Signal::CONT).expect_err("refused");
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "pgid {pgid}");
        }
    }
}
