//! The one description of a command to start ([`CommandSpec`]), the owned child every spawner
//! returns ([`OwnedChild`]), and the one way to signal a command's process group
//! ([`signal_group`]).
//!
//! A [`CommandSpec`] says what runs and with which environment and ids; how it is connected
//! (a PTY or pipes) is chosen by calling [`crate::pty::spawn_pty`] or
//! [`crate::pipes::spawn_piped`] with it. Every spawner puts a fresh tree marker
//! ([`TREE_MARKER_VAR`]) in the environment after the spec's own changes, so no spec can remove
//! it, and registers the child with [`crate::reaper::spawn_owned`]. This module does no I/O.

use std::ffi::OsString;
use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;

use rustix::process::{Pid, Signal};

use crate::tree::TREE_MARKER_VAR;

/// What to run: program, arguments, working directory, environment changes and the user and
/// group ids to switch to.
///
/// The environment starts as the daemon's (empty when `env_clear`), loses every name in
/// `env_remove`, then gets `env` added (later entries win).
#[derive(Debug, Clone, Default)]
pub struct CommandSpec {
    pub program: OsString,
    pub args: Vec<OsString>,
    /// Working directory; `None` keeps the daemon's.
    pub cwd: Option<PathBuf>,
    /// Variables added to (and overriding) the inherited environment.
    pub env: Vec<(OsString, OsString)>,
    /// Variables of the daemon the command must not see (secrets).
    pub env_remove: Vec<OsString>,
    /// Start from an empty environment instead of the daemon's.
    pub env_clear: bool,
    /// User id to switch to before exec (needs privileges).
    pub uid: Option<u32>,
    /// Group id to switch to before exec (needs privileges).
    pub gid: Option<u32>,
}

impl CommandSpec {
    pub fn new(program: impl Into<OsString>) -> Self {
        Self {
            program: program.into(),
            ..Self::default()
        }
    }

    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
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

    pub fn env_remove(mut self, key: impl Into<OsString>) -> Self {
        self.env_remove.push(key.into());
        self
    }

    pub fn env_clear(mut self) -> Self {
        self.env_clear = true;
        self
    }

    /// The tokio command for this spec, with `marker` as [`TREE_MARKER_VAR`]. Stdio and the
    /// session or process group are the spawner's business.
    pub(crate) fn to_tokio(&self, marker: &str) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.program);
        command.args(&self.args);
        if let Some(cwd) = &self.cwd {
            command.current_dir(cwd);
        }
        if self.env_clear {
            command.env_clear();
        }
        for name in &self.env_remove {
            command.env_remove(name);
        }
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        command.env(TREE_MARKER_VAR, marker);
        if let Some(uid) = self.uid {
            command.uid(uid);
        }
        if let Some(gid) = self.gid {
            command.gid(gid);
        }
        command.kill_on_drop(false);
        command
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_group_refuses_kernel_init_and_own_group() {
        let (own, _) = crate::tree::own_group_and_session();
        for pgid in [-5, 0, 1, own] {
            let err = signal_group(pgid, Signal::CONT).expect_err("refused");
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "pgid {pgid}");
        }
    }
}
