//! Spawning a command on pipes, as the leader of a new session or of a new process group.
//!
//! [`Leader::Session`] makes the child call `setsid()` between fork and exec, so it leads a new
//! session and process group that no terminal controls: signals for the command's group never
//! reach the daemon, and [`crate::kill_tree`] finds everything in the session.
//! [`Leader::ProcessGroup`] only gives it its own process group inside the daemon's session.
//! Stdin is either a pipe the caller keeps (so an agent can answer prompts) or `/dev/null`,
//! never the daemon's stdin. Stdout and stderr are either merged into one pipe (one ordered
//! byte stream, the way a terminal shows them) or kept apart. Every child carries
//! [`crate::tree::TREE_MARKER_VAR`] and is registered with the reaper; [`OwnedChild::wait`]
//! releases it.
//!
//! This module only spawns; reading output, timeouts and killing belong to the caller.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::OwnedFd;
use std::process::Stdio;

use tokio::net::unix::pipe;

use crate::command::{CommandSpec, OwnedChild};
use crate::reaper;
use crate::tree::TreeId;

/// What the child's stdin is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StdinMode {
    /// A pipe whose write end is returned in [`PipedChild::stdin`].
    #[default]
    Pipe,
    /// `/dev/null`: reads see end of file at once.
    Null,
}

/// How the child's stdout and stderr reach the caller.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OutputMode {
    /// Both go to one pipe, in the order they were written ([`PipedChild::stdout`]).
    #[default]
    Merged,
    /// Two pipes ([`PipedChild::stdout`] and [`PipedChild::stderr`]).
    Separate,
}

/// What the child leads; either way its pid is its process group id.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Leader {
    /// A new session (`setsid`) without a controlling terminal.
    #[default]
    Session,
    /// A new process group in the daemon's session.
    ProcessGroup,
}

/// How a command is connected to pipes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PipeOptions {
    pub stdin: StdinMode,
    pub output: OutputMode,
    pub leader: Leader,
}

/// A command running on pipes. Dropping it does not kill the command.
#[derive(Debug)]
pub struct PipedChild {
    pub child: OwnedChild,
    /// Root pid (also the process group id) and marker: pass to [`crate::kill_tree`].
    pub tree: TreeId,
    /// Write end of the child's stdin with [`StdinMode::Pipe`].
    pub stdin: Option<pipe::Sender>,
    /// Read end of stdout (stdout and stderr with [`OutputMode::Merged`]).
    pub stdout: pipe::Receiver,
    /// Read end of stderr with [`OutputMode::Separate`].
    pub stderr: Option<pipe::Receiver>,
}

impl PipedChild {
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// The child's process group (it leads its own): the target of [`crate::signal_group`].
    pub fn process_group(&self) -> i32 {
        self.tree.root_pid
    }
}

/// Starts `command` on pipes as `options` say. Must be called inside a tokio runtime.
///
/// A program that cannot be started (missing, not executable, bad cwd) is an immediate error.
pub(crate) fn spawn_piped(command: &CommandSpec, options: PipeOptions) -> io::Result<PipedChild> {
    let mut cmd = command.to_tokio()?;

    let (stdin_read, stdin_write) = match options.stdin {
        StdinMode::Pipe => {
            let (read, write) = io::pipe()?;
            (Stdio::from(read), Some(OwnedFd::from(write)))
        }
        StdinMode::Null => (Stdio::null(), None),
    };
    cmd.stdin(stdin_read);
    let (out_read, out_write) = io::pipe()?;
    let stderr_read = match options.output {
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
    // An outliving child must leave the daemon's session, or the terminal's hangup reaches it.
    let leader = if command.outlive_daemon {
        Leader::Session
    } else {
        options.leader
    };
    match leader {
        Leader::ProcessGroup => {
            cmd.process_group(0);
        }
        // SAFETY: the closure runs in the forked child before exec and only calls `setsid`,
        // which is async-signal-safe and touches no memory shared with the parent. It cannot
        // fail for a freshly forked child that is not a process group leader; if it did, spawn
        // reports it.
        Leader::Session => unsafe {
            cmd.pre_exec(|| {
                rustix::process::setsid()
                    .map(|_| ())
                    .map_err(io::Error::from)
            });
        },
    }

    // The command owns the write ends of its pipes once it runs; ours are dropped with `cmd`
    // at the end of the job, so the read ends see end of file when the command (and everything
    // it started) closes them.
    let child = crate::spawner::on_spawner_thread(move || {
        reaper::spawn_owned(|| {
            let child = cmd.spawn()?;
            let pid = child.id();
            Ok((child, pid))
        })
    })?;
    let child = OwnedChild::new(child)?;
    let stdin = stdin_write.map(pipe::Sender::from_owned_fd).transpose()?;
    let stdout = pipe::Receiver::from_owned_fd(OwnedFd::from(out_read))?;
    let stderr = stderr_read
        .map(|r| pipe::Receiver::from_owned_fd(OwnedFd::from(r)))
        .transpose()?;
    Ok(PipedChild {
        tree: TreeId::new(child.pid() as i32, Some(command.marker.to_string())),
        child,
        stdin,
        stdout,
        stderr,
    })
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn sh(script: &str) -> CommandSpec {
        CommandSpec::new("sh", &crate::TreeMarker::new())
            .arg("-c")
            .arg(script)
    }

    fn ids_of(out: &str) -> Vec<u32> {
        out.split_whitespace()
            .filter_map(|s| s.parse().ok())
            .collect()
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
        let script = sh("ps -o pid=,pgid=,sid= -p $$");
        let mut child = spawn_piped(&script, PipeOptions::default()).expect("spawns");
        let pid = child.pid();
        let out = read_all(child.stdout).await;
        assert_eq!(ids_of(&out), vec![pid, pid, pid], "ps said {out:?}");
        child.child.wait().await.expect("waits");
    }

    #[tokio::test]
    async fn process_group_leader_stays_in_the_daemons_session() {
        let options = PipeOptions {
            leader: Leader::ProcessGroup,
            ..PipeOptions::default()
        };
        let script = sh("ps -o pid=,pgid=,sid= -p $$");
        let mut child = spawn_piped(&script, options).expect("spawns");
        let pid = child.pid();
        // 0 when this test runs in a PID namespace whose session leader is outside it; `ps`
        // reads the same /proc field, so it prints the same number.
        let (_, own_sid) = crate::tree::own_group_and_session();
        let out = read_all(child.stdout).await;
        assert_eq!(
            ids_of(&out),
            vec![pid, pid, own_sid as u32],
            "ps said {out:?}"
        );
        child.child.wait().await.expect("waits");
    }

    #[tokio::test]
    async fn merged_output_keeps_stdout_and_stderr_in_order_and_stdin_stays_open() {
        let script = sh("echo one; echo two >&2; read line; echo \"got $line\"");
        let mut child = spawn_piped(&script, PipeOptions::default()).expect("spawns");
        let mut stdin = child.stdin.take().expect("stdin pipe");
        stdin.write_all(b"hello\n").await.expect("writes");
        drop(stdin);
        let out = read_all(child.stdout).await;
        assert_eq!(out, "one\ntwo\ngot hello\n");
        let status = child.child.wait().await.expect("waits");
        assert!(status.success());
    }

    #[tokio::test]
    async fn separate_output_and_null_stdin_and_environment() {
        let command = sh("echo out; echo err >&2; cat; echo \"$FOO ${WARREN_TREE_ID:+marked}\"")
            .env("FOO", "bar");
        let options = PipeOptions {
            stdin: StdinMode::Null,
            output: OutputMode::Separate,
            leader: Leader::Session,
        };
        let mut child = spawn_piped(&command, options).expect("spawns");
        assert!(child.stdin.is_none());
        let stderr = child.stderr.take().expect("stderr pipe");
        let (out, err) = tokio::join!(read_all(child.stdout), read_all(stderr));
        assert_eq!(out, "out\nbar marked\n");
        assert_eq!(err, "err\n");
        child.child.wait().await.expect("waits");
    }

    #[tokio::test]
    async fn the_environment_is_the_policys_plus_additions_and_the_marker() {
        let marker = crate::TreeMarker::new();
        let hands = CommandSpec::new("/usr/bin/env", &marker)
            .env_policy(crate::EnvPolicy::Hands { pass: Vec::new() })
            .env("EXTRA", "1");
        let mut child = spawn_piped(&hands, PipeOptions::default()).expect("spawns");
        let out = read_all(child.stdout).await;
        child.child.wait().await.expect("waits");
        let mut names: Vec<&str> = out
            .lines()
            .map(|l| l.split('=').next().unwrap_or(l))
            .collect();
        names.sort();
        let mut expected: Vec<&str> = crate::env::HANDS_ALLOWLIST
            .iter()
            .copied()
            .filter(|name| std::env::var_os(name).is_some())
            .chain(["EXTRA", "WARREN_TREE_ID"])
            .collect();
        expected.sort();
        assert_eq!(names, expected, "{out:?}");
        let marker_line = format!("WARREN_TREE_ID={marker}");
        assert!(
            out.lines()
                .any(|l| l == marker_line || l.ends_with(&format!(":{marker}"))),
            "{out:?}"
        );
    }

    #[tokio::test]
    async fn a_child_carries_its_daemons_marker_before_its_own() {
        let marker = crate::TreeMarker::new();
        let command = CommandSpec::new("sh", &marker)
            .arg("-c")
            .arg("echo \"$WARREN_TREE_ID\"");
        let spec_env = command.environment();
        let (_, chain) = spec_env
            .iter()
            .find(|(k, _)| k == crate::tree::TREE_MARKER_VAR)
            .expect("a marker");
        let chain = chain.to_string_lossy().into_owned();
        match std::env::var(crate::tree::TREE_MARKER_VAR) {
            Ok(outer) => assert_eq!(chain, format!("{outer}:{marker}")),
            Err(_) => assert_eq!(chain, marker.to_string()),
        }
        let mut child = spawn_piped(&command, PipeOptions::default()).expect("spawns");
        let out = read_all(child.stdout).await;
        child.child.wait().await.expect("waits");
        assert_eq!(out.trim(), chain);
    }

    #[tokio::test]
    async fn missing_program_is_an_immediate_error() {
        let missing = CommandSpec::new("/nonexistent/program", &crate::TreeMarker::new());
        let err = spawn_piped(&missing, PipeOptions::default()).expect_err("fails");
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }
}
