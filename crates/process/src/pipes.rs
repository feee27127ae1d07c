//! Spawning a command on pipes, in its own session and process group.
//!
//! The child calls `setsid()` between fork and exec, so it leads a new session and process group
//! that no terminal controls: signals for the command's group never reach the daemon, and
//! [`crate::kill_tree`] can find everything it started. Stdin is either a pipe the caller keeps
//! (so an agent can answer prompts) or `/dev/null`, never the daemon's stdin. Stdout and stderr
//! are either merged into one pipe (one ordered byte stream, the way a terminal shows them) or
//! kept apart. Every child carries [`crate::tree::TREE_MARKER_VAR`] and is registered with
//! [`crate::reaper::spawn_owned`]; the owner must call [`crate::reaper::release`] with
//! [`PipeChild::pid`] after waiting for it.
//!
//! This module only spawns; reading output, timeouts and killing belong to the caller.

#![allow(unsafe_code)]

use std::ffi::OsString;
use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::Stdio;

use tokio::net::unix::pipe;

use crate::reaper;
use crate::tree::{TREE_MARKER_VAR, TreeId};

/// What the child's stdin is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StdinMode {
    /// A pipe whose write end is returned in [`PipeChild::stdin`].
    #[default]
    Pipe,
    /// `/dev/null`: reads see end of file at once.
    Null,
}

/// How the child's stdout and stderr reach the caller.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OutputMode {
    /// Both go to one pipe, in the order they were written ([`PipeChild::stdout`]).
    #[default]
    Merged,
    /// Two pipes ([`PipeChild::stdout`] and [`PipeChild::stderr`]).
    Separate,
}

/// Everything needed to start a command on pipes.
#[derive(Debug, Clone, Default)]
pub struct PipeCommand {
    pub program: OsString,
    pub args: Vec<OsString>,
    /// The complete environment when `clear_env` is true, else additions to the daemon's.
    pub env: Vec<(OsString, OsString)>,
    pub clear_env: bool,
    /// Working directory; `None` keeps the daemon's.
    pub cwd: Option<PathBuf>,
    pub stdin: StdinMode,
    pub output: OutputMode,
}

impl PipeCommand {
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
}

/// A started command. Dropping it does not kill the command.
#[derive(Debug)]
pub struct PipeChild {
    pub child: tokio::process::Child,
    /// The child's pid, which is also its process group and session id.
    pub pid: u32,
    /// The command's tree (root pid + marker) for [`crate::kill_tree`].
    pub tree: TreeId,
    /// Write end of the child's stdin when [`StdinMode::Pipe`].
    pub stdin: Option<pipe::Sender>,
    /// Read end of stdout (stdout and stderr when [`OutputMode::Merged`]).
    pub stdout: pipe::Receiver,
    /// Read end of stderr when [`OutputMode::Separate`].
    pub stderr: Option<pipe::Receiver>,
}

/// Starts `command` in a new session on pipes. Must be called inside a tokio runtime.
///
/// A program that cannot be started (missing, not executable, bad cwd) is an immediate error.
pub fn spawn_piped(command: &PipeCommand) -> io::Result<PipeChild> {
    spawn_piped_as(command, None, None)
}

/// [`spawn_piped`] with the child's user and group ids switched to `uid` / `gid` when given
/// (the OpenSandbox command API lets callers choose them; this needs privileges).
pub fn spawn_piped_as(
    command: &PipeCommand,
    uid: Option<u32>,
    gid: Option<u32>,
) -> io::Result<PipeChild> {
    let marker = TreeId::new_marker();
    let mut cmd = tokio::process::Command::new(&command.program);
    cmd.args(&command.args);
    if command.clear_env {
        cmd.env_clear();
    }
    cmd.envs(command.env.iter().map(|(k, v)| (k, v)));
    cmd.env(TREE_MARKER_VAR, &marker);
    if let Some(cwd) = &command.cwd {
        cmd.current_dir(cwd);
    }
    if let Some(uid) = uid {
        cmd.uid(uid);
    }
    if let Some(gid) = gid {
        cmd.gid(gid);
    }

    let (stdin_read, stdin_write) = match command.stdin {
        StdinMode::Pipe => {
            let (read, write) = io::pipe()?;
            (Stdio::from(read), Some(OwnedFd::from(write)))
        }
        StdinMode::Null => (Stdio::null(), None),
    };
    cmd.stdin(stdin_read);
    let (out_read, out_write) = io::pipe()?;
    let stderr_read = match command.output {
        OutputMode::Merged => {
            cmd.stderr(Stdio::from(out_write.try_clone()?));
            None
        }
        OutputMode::Separate => {
            let (err_read, err_write) = io::pipe()?;
            cmd.stderr(Stdio::from(err_write));
            Some(err_read)
        }
    };
    cmd.stdout(Stdio::from(out_write));
    cmd.kill_on_drop(false);
    // SAFETY: the closure runs in the forked child before exec and only calls `setsid`, which
    // is async-signal-safe and touches no memory shared with the parent. It cannot fail for a
    // freshly forked child that is not a process group leader; if it did, spawn reports it.
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::setsid()
                .map(|_| ())
                .map_err(io::Error::from)
        });
    }

    let child = reaper::spawn_owned(|| {
        let child = cmd.spawn()?;
        let pid = child.id();
        Ok((child, pid))
    })?;
    // The command owns the write ends of its output pipes now; ours are dropped with `cmd`, so
    // the read ends see end of file when the command (and everything it started) closes them.
    drop(cmd);
    let pid = child
        .id()
        .expect("a just-spawned child has not been waited for, so it has a pid");
    let stdin = stdin_write.map(pipe::Sender::from_owned_fd).transpose()?;
    let stdout = pipe::Receiver::from_owned_fd(OwnedFd::from(out_read))?;
    let stderr = stderr_read
        .map(|r| pipe::Receiver::from_owned_fd(OwnedFd::from(r)))
        .transpose()?;
    Ok(PipeChild {
        child,
        pid,
        tree: TreeId::new(pid as i32, Some(marker)),
        stdin,
        stdout,
        stderr,
    })
}

/// Sends `signal` to process group `pgid` (a command started here leads its own group). The
/// daemon's own group and pids 0 and 1 are refused, so a bad id can never signal the daemon.
pub fn signal_group(pgid: i32, signal: rustix::process::Signal) -> io::Result<()> {
    let own = rustix::process::getpgrp().as_raw_nonzero().get();
    if pgid <= 1 || pgid == own {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "refusing to signal this process group",
        ));
    }
    let pgid = rustix::process::Pid::from_raw(pgid).expect("pgid checked positive above");
    rustix::process::kill_process_group(pgid, signal).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn sh(script: &str) -> PipeCommand {
        PipeCommand::new("sh").arg("-c").arg(script)
    }

    async fn read_all(mut rx: pipe::Receiver) -> String {
        let mut out = String::new();
        tokio::time::timeout(
            std::time::Duration::from_secs(20),
            rx.read_to_string(&mut out),
        )
        .await
        .expect("output reaches end of file within 20 s")
        .expect("reads output");
        out
    }

    #[tokio::test]
    async fn child_leads_its_own_session_and_group() {
        let child = spawn_piped(&sh("ps -o pid=,pgid=,sid= -p $$")).expect("spawns");
        let pid = child.pid;
        let out = read_all(child.stdout).await;
        let ids: Vec<u32> = out
            .split_whitespace()
            .filter_map(|s| s.parse().ok())
            .collect();
        assert_eq!(ids, vec![pid, pid, pid], "ps said {out:?}");
        let mut child = child.child;
        child.wait().await.expect("waits");
        reaper::release(pid);
    }

    #[tokio::test]
    async fn merged_output_keeps_stdout_and_stderr_in_order_and_stdin_stays_open() {
        let mut child = spawn_piped(&sh("echo one; echo two >&2; read line; echo \"got $line\""))
            .expect("spawns");
        let mut stdin = child.stdin.take().expect("stdin pipe");
        stdin.write_all(b"hello\n").await.expect("writes");
        drop(stdin);
        let out = read_all(child.stdout).await;
        assert_eq!(out, "one\ntwo\ngot hello\n");
        let status = child.child.wait().await.expect("waits");
        reaper::release(child.pid);
        assert!(status.success());
    }

    #[tokio::test]
    async fn separate_output_and_null_stdin_and_environment() {
        let mut command =
            sh("echo out; echo err >&2; cat; echo \"$FOO ${WARREN_TREE_ID:+marked}\"");
        command.output = OutputMode::Separate;
        command.stdin = StdinMode::Null;
        command.env.push(("FOO".into(), "bar".into()));
        let mut child = spawn_piped(&command).expect("spawns");
        assert!(child.stdin.is_none());
        let stderr = child.stderr.take().expect("stderr pipe");
        let (out, err) = tokio::join!(read_all(child.stdout), read_all(stderr));
        assert_eq!(out, "out\nbar marked\n");
        assert_eq!(err, "err\n");
        child.child.wait().await.expect("waits");
        reaper::release(child.pid);
    }

    #[tokio::test]
    async fn missing_program_is_an_immediate_error() {
        let err = spawn_piped(&PipeCommand::new("/nonexistent/program")).expect_err("fails");
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }
}
