//! Spawning an interactive command either on a new pseudo-terminal (its own terminal session
//! with the PTY as controlling terminal) or on pipes (its own process group, stdout and stderr
//! kept apart), plus the few terminal operations a server needs afterwards: resizing and finding
//! the terminal's foreground process group, the one Ctrl-C would hit.
//!
//! Every spawn goes through [`crate::reaper::spawn_owned`] and puts a fresh tree marker
//! ([`crate::tree::TREE_MARKER_VAR`]) in the command's environment, so [`crate::kill_tree`] with
//! the returned [`TreeId`] finds everything the command started. [`OwnedChild::wait`] releases
//! the pid to the reaper after waiting. This module does not read or buffer output: callers get
//! the raw PTY halves or pipes and own the read loop.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};

use rustix::process::{Pid, Signal};

use crate::tree::{TREE_MARKER_VAR, TreeId};

/// A terminal size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PtySize {
    pub rows: u16,
    pub cols: u16,
}

impl PtySize {
    pub const DEFAULT: PtySize = PtySize { rows: 24, cols: 80 };
}

impl Default for PtySize {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// What to run: program, arguments, working directory and extra environment variables (added
/// to the daemon's own environment).
#[derive(Debug, Clone, Default)]
pub struct ShellCommand {
    pub program: OsString,
    pub args: Vec<OsString>,
    pub cwd: Option<PathBuf>,
    pub env: Vec<(OsString, OsString)>,
}

impl ShellCommand {
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

    fn to_tokio(&self, marker: &str) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.program);
        command.args(&self.args);
        if let Some(cwd) = &self.cwd {
            command.current_dir(cwd);
        }
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        command.env(TREE_MARKER_VAR, marker);
        command
    }
}

/// A spawned child that was registered with the reaper; [`OwnedChild::wait`] releases it.
#[derive(Debug)]
pub struct OwnedChild {
    child: tokio::process::Child,
    pid: u32,
    released: bool,
}

impl OwnedChild {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Waits for the child to exit and hands its pid back to the reaper. Cancel-safe: dropping
    /// the future before completion leaves the child owned.
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

/// Operations on a PTY master that need no read or write half: resize and foreground group.
/// Holds its own duplicate of the master descriptor.
#[derive(Debug)]
pub struct PtyControl {
    master: OwnedFd,
}

impl PtyControl {
    /// Bytes the terminal has queued for the master side that nobody has read yet
    /// (`FIONREAD`): lets a caller tell "quiet" from "output not drained yet".
    pub fn pending_output(&self) -> io::Result<u64> {
        rustix::io::ioctl_fionread(&self.master).map_err(io::Error::from)
    }

    pub fn resize(&self, size: PtySize) -> io::Result<()> {
        resize(self.master.as_fd(), size)
    }

    /// The terminal's foreground process group (the job a Ctrl-C would interrupt).
    pub fn foreground_process_group(&self) -> io::Result<i32> {
        foreground_process_group(self.master.as_fd())
    }

    /// Sends `signal` to the terminal's foreground process group.
    pub fn signal_foreground(&self, signal: Signal) -> io::Result<()> {
        let pgrp = self.foreground_process_group()?;
        signal_process_group(pgrp, signal)
    }
}

/// Sets the window size of the terminal behind `master` (which also sends SIGWINCH to its
/// foreground group).
pub fn resize(master: BorrowedFd<'_>, size: PtySize) -> io::Result<()> {
    let winsize = rustix::termios::Winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    rustix::termios::tcsetwinsize(master, winsize).map_err(io::Error::from)
}

/// The foreground process group of the terminal behind `master` (`tcgetpgrp` on the master
/// reports the slave side's group).
pub fn foreground_process_group(master: BorrowedFd<'_>) -> io::Result<i32> {
    rustix::termios::tcgetpgrp(master)
        .map(Pid::as_raw_nonzero)
        .map(|p| p.get())
        .map_err(io::Error::from)
}

/// Sends `signal` to process group `pgrp`. Refuses to signal group 0/1 or the daemon's own
/// group, which a caller could otherwise hit through a stale or racy lookup.
pub fn signal_process_group(pgrp: i32, signal: Signal) -> io::Result<()> {
    let own = rustix::process::getpgrp().as_raw_nonzero().get();
    if pgrp <= 1 || pgrp == own {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "refusing to signal this process group",
        ));
    }
    let pgrp = Pid::from_raw(pgrp).expect("pgrp checked positive above");
    rustix::process::kill_process_group(pgrp, signal).map_err(io::Error::from)
}

/// A command running on its own PTY.
#[derive(Debug)]
pub struct PtyChild {
    pub child: OwnedChild,
    /// Root pid (the session leader) and marker: pass to [`crate::kill_tree`].
    pub tree: TreeId,
    /// Reading half of the master; a read error `EIO` means every slave side is closed (EOF).
    pub reader: pty_process::OwnedReadPty,
    pub writer: pty_process::OwnedWritePty,
    pub control: PtyControl,
}

/// Spawns `command` on a new PTY of `size`: the child is the leader of a new terminal session
/// and the PTY is its controlling terminal. The PTY's slave side is closed in this process
/// before returning, so the reader sees EOF once the child's terminal session lets go of it.
pub fn spawn_pty(command: &ShellCommand, size: PtySize) -> io::Result<PtyChild> {
    let (pty, pts) = pty_process::open().map_err(pty_error)?;
    resize(pty.as_fd(), size)?;
    // The duplicate must be close-on-exec, or every child would hold the master open.
    let control = PtyControl {
        master: rustix::io::fcntl_dupfd_cloexec(pty.as_fd(), 0).map_err(io::Error::from)?,
    };
    let marker = TreeId::new_marker();
    let pty_command = pty_process::Command::from(command.to_tokio(&marker));
    let child = crate::reaper::spawn_owned(|| {
        let child = pty_command.spawn(pts).map_err(pty_error)?;
        let pid = child.id();
        Ok((child, pid))
    })?;
    let pid = child
        .id()
        .ok_or_else(|| io::Error::other("spawned child has no pid"))?;
    let (reader, writer) = pty.into_split();
    Ok(PtyChild {
        child: OwnedChild {
            child,
            pid,
            released: false,
        },
        tree: TreeId::new(pid as i32, Some(marker)),
        reader,
        writer,
        control,
    })
}

/// A command running on pipes in its own process group.
#[derive(Debug)]
pub struct PipedChild {
    pub child: OwnedChild,
    /// Root pid (also the process group id) and marker: pass to [`crate::kill_tree`].
    pub tree: TreeId,
    pub stdin: tokio::process::ChildStdin,
    pub stdout: tokio::process::ChildStdout,
    pub stderr: tokio::process::ChildStderr,
}

impl PipedChild {
    /// The child's process group (it leads its own).
    pub fn process_group(&self) -> i32 {
        self.tree.root_pid
    }
}

/// Spawns `command` with piped stdin, stdout and stderr as the leader of a new process group.
pub fn spawn_piped(command: &ShellCommand) -> io::Result<PipedChild> {
    let marker = TreeId::new_marker();
    let mut tokio_command = command.to_tokio(&marker);
    tokio_command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = crate::reaper::spawn_owned(|| {
        let child = tokio_command.spawn()?;
        let pid = child.id();
        Ok((child, pid))
    })?;
    let pid = child
        .id()
        .ok_or_else(|| io::Error::other("spawned child has no pid"))?;
    let missing = || io::Error::other("spawned child lacks a piped stdio handle");
    let stdin = child.stdin.take().ok_or_else(missing)?;
    let stdout = child.stdout.take().ok_or_else(missing)?;
    let stderr = child.stderr.take().ok_or_else(missing)?;
    Ok(PipedChild {
        child: OwnedChild {
            child,
            pid,
            released: false,
        },
        tree: TreeId::new(pid as i32, Some(marker)),
        stdin,
        stdout,
        stderr,
    })
}

fn pty_error(error: pty_process::Error) -> io::Error {
    match error {
        pty_process::Error::Io(e) => e,
        other => io::Error::other(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn read_pty_until(reader: &mut pty_process::OwnedReadPty, needle: &str) -> String {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        let deadline = std::time::Duration::from_secs(20);
        tokio::time::timeout(deadline, async {
            while !String::from_utf8_lossy(&seen).contains(needle) {
                match reader.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {needle:?}"));
        String::from_utf8_lossy(&seen).into_owned()
    }

    #[tokio::test]
    async fn pty_child_leads_its_session_with_the_pty_as_controlling_terminal() {
        let command = ShellCommand::new("sh").arg("-c").arg("stty size; cat");
        let mut spawned = spawn_pty(
            &command,
            PtySize {
                rows: 33,
                cols: 101,
            },
        )
        .expect("spawns");
        let text = read_pty_until(&mut spawned.reader, "33 101").await;
        assert!(text.contains("33 101"), "{text}");
        // `cat` is the foreground job of a session the child leads.
        let pgrp = spawned
            .control
            .foreground_process_group()
            .expect("tcgetpgrp");
        assert_eq!(pgrp, spawned.tree.root_pid);
        spawned.writer.write_all(b"hello\n").await.expect("writes");
        // The terminal echoes the line, then `cat` prints it: only the second proves `cat` runs.
        read_pty_until(&mut spawned.reader, "hello\r\nhello").await;
        spawned
            .control
            .signal_foreground(Signal::INT)
            .expect("signals");
        let status = tokio::time::timeout(Duration::from_secs(20), spawned.child.wait())
            .await
            .expect("the child exits after SIGINT")
            .expect("waits");
        assert_eq!(exit_code(status), -1);
    }

    #[tokio::test]
    async fn piped_child_keeps_stdout_and_stderr_apart() {
        let command = ShellCommand::new("sh")
            .arg("-c")
            .arg("echo out; echo err >&2");
        let mut spawned = spawn_piped(&command).expect("spawns");
        let mut out = String::new();
        let mut err = String::new();
        spawned
            .stdout
            .read_to_string(&mut out)
            .await
            .expect("reads stdout");
        spawned
            .stderr
            .read_to_string(&mut err)
            .await
            .expect("reads stderr");
        assert_eq!((out.as_str(), err.as_str()), ("out\n", "err\n"));
        let status = spawned.child.wait().await.expect("waits");
        assert_eq!(exit_code(status), 0);
    }
}
