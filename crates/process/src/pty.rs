//! Spawning a command on a new pseudo-terminal (the leader of its own terminal session with the
//! PTY as controlling terminal), plus the few terminal operations a server needs afterwards:
//! resizing and finding the terminal's foreground process group, the one Ctrl-C would hit.
//!
//! What runs is a [`CommandSpec`], the same one [`crate::spawn`] takes for pipes. The spawn
//! goes through [`crate::reaper::spawn_owned`] and puts a fresh tree marker
//! ([`crate::tree::TREE_MARKER_VAR`]) in the command's environment, so [`crate::kill_tree`] with
//! the returned [`TreeId`] finds everything the command started; [`OwnedChild::wait`] releases
//! the pid to the reaper. This module does not read or buffer output: callers get the raw PTY
//! halves and own the read loop.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::process::{Pid, Signal};

use crate::command::{CommandSpec, OwnedChild};
use crate::tree::TreeId;

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
        crate::command::signal_group(pgrp, signal)
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
pub(crate) fn spawn_pty(command: &CommandSpec, size: PtySize) -> io::Result<PtyChild> {
    let (pty, pts) = pty_process::open().map_err(pty_error)?;
    resize(pty.as_fd(), size)?;
    // The duplicate must be close-on-exec, or every child would hold the master open.
    let control = PtyControl {
        master: rustix::io::fcntl_dupfd_cloexec(pty.as_fd(), 0).map_err(io::Error::from)?,
    };
    let pty_command = pty_process::Command::from(command.to_tokio()?);
    let child = crate::spawner::on_spawner_thread(move || {
        crate::reaper::spawn_owned(|| {
            let child = pty_command.spawn(pts).map_err(pty_error)?;
            let pid = child.id();
            Ok((child, pid))
        })
    })?;
    let child = OwnedChild::new(child)?;
    let (reader, writer) = pty.into_split();
    Ok(PtyChild {
        tree: TreeId::new(child.pid() as i32, Some(command.marker.to_string())),
        child,
        reader,
        writer,
        control,
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
    use crate::command::exit_code;

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
        let command = CommandSpec::new("sh", &crate::TreeMarker::new())
            .arg("-c")
            .arg("stty size; cat");
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
    async fn pty_child_environment_follows_the_policy_and_keeps_the_marker() {
        let command = CommandSpec::new("sh", &crate::TreeMarker::new())
            .arg("-c")
            .arg("echo \"[${HOME:-no home} ${WARREN_TREE_ID:+marked} $FOO]\"")
            .env_policy(crate::EnvPolicy::Exec {
                base: Some(vec![("PATH".into(), "/usr/bin:/bin".into())]),
                pass_env: Vec::new(),
                tty: true,
            })
            .env("FOO", "bar");
        let mut spawned = spawn_pty(&command, PtySize::DEFAULT).expect("spawns");
        let text = read_pty_until(&mut spawned.reader, "]").await;
        assert!(text.contains("[no home marked bar]"), "{text:?}");
        let status = tokio::time::timeout(Duration::from_secs(20), spawned.child.wait())
            .await
            .expect("the child exits")
            .expect("waits");
        assert_eq!(exit_code(status), 0);
    }
}
