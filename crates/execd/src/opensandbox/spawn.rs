//! Starting a command or a session shell for the OpenSandbox routes: its own process group,
//! stdin from `/dev/null` or a pipe, stdout and stderr on pipes (merged or apart), the tree
//! marker in its environment, and registration with the subreaper so its exit status is ours.
//!
//! Killing and reaping stay in `warren_process` (`kill_tree`, `reaper`); the owner of a
//! [`Spawned`] must [`Spawned::wait`] it, which releases the pid from the reaper.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::OnceLock;

use tokio::net::unix::pipe;
use tokio::process::{Child, ChildStdin};
use warren_process::TreeId;
use warren_process::reaper;
use warren_process::tree::TREE_MARKER_VAR;

/// Variables of the daemon that commands must not inherit.
const HIDDEN_ENV: &[&str] = &["EXECD_ACCESS_TOKEN"];

/// What to start.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    pub program: OsString,
    pub args: Vec<OsString>,
    pub cwd: PathBuf,
    /// Added to (and overriding) the daemon's environment.
    pub envs: BTreeMap<String, String>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// A pipe for stdin (session shells) instead of `/dev/null`.
    pub stdin_pipe: bool,
    /// One pipe for stdout and stderr, in write order.
    pub merge_output: bool,
}

impl SpawnSpec {
    pub fn new(program: impl Into<OsString>, cwd: PathBuf) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            cwd,
            envs: BTreeMap::new(),
            uid: None,
            gid: None,
            stdin_pipe: false,
            merge_output: false,
        }
    }
}

/// A started process. Dropping it neither kills nor reaps it; call [`Spawned::wait`].
#[derive(Debug)]
pub struct Spawned {
    pub child: Child,
    pub pid: u32,
    pub tree: TreeId,
    pub stdin: Option<ChildStdin>,
    pub stdout: pipe::Receiver,
    /// `None` when output is merged.
    pub stderr: Option<pipe::Receiver>,
}

/// Exit code of a finished process, -1 when a signal ended it.
pub fn exit_code(status: std::process::ExitStatus) -> i32 {
    status.code().unwrap_or(-1)
}

/// Waits for the child and hands its pid back to the reaper. Returns the exit code (-1 after a
/// signal, or when waiting failed).
pub async fn wait(child: &mut Child, pid: u32) -> i32 {
    let status = child.wait().await;
    reaper::release(pid);
    match status {
        Ok(status) => exit_code(status),
        Err(err) => {
            tracing::warn!(pid, %err, "waiting for a command failed");
            -1
        }
    }
}

/// `bash` when it is installed, else `sh` (without bash-only flags).
pub fn shell() -> &'static str {
    static SHELL: OnceLock<&'static str> = OnceLock::new();
    SHELL.get_or_init(|| {
        let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
        let has_bash = std::env::split_paths(&path).any(|dir| dir.join("bash").is_file());
        if has_bash { "bash" } else { "sh" }
    })
}

/// Starts `spec`. Must be called inside a tokio runtime.
pub fn spawn(spec: &SpawnSpec) -> io::Result<Spawned> {
    let marker = TreeId::new_marker();
    let mut cmd = tokio::process::Command::new(&spec.program);
    cmd.args(&spec.args).current_dir(&spec.cwd);
    for name in HIDDEN_ENV {
        cmd.env_remove(name);
    }
    cmd.envs(&spec.envs);
    cmd.env(TREE_MARKER_VAR, &marker);
    if let Some(uid) = spec.uid {
        cmd.uid(uid);
    }
    if let Some(gid) = spec.gid {
        cmd.gid(gid);
    }
    // Its own process group: signals aimed at the command never reach the daemon's group.
    cmd.process_group(0);
    cmd.kill_on_drop(false);
    cmd.stdin(if spec.stdin_pipe {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let (out_read, out_write) = io::pipe()?;
    let err_read = if spec.merge_output {
        cmd.stderr(Stdio::from(out_write.try_clone()?));
        None
    } else {
        let (err_read, err_write) = io::pipe()?;
        cmd.stderr(Stdio::from(err_write));
        Some(err_read)
    };
    cmd.stdout(Stdio::from(out_write));

    let mut child = reaper::spawn_owned(|| {
        let child = cmd.spawn()?;
        let pid = child.id();
        Ok((child, pid))
    })?;
    // The write ends now belong to the child only, so the read ends see end of file when the
    // command and everything it started close them.
    drop(cmd);
    let pid = child
        .id()
        .expect("a child that was never waited for has a pid");
    let stdin = child.stdin.take();
    let stdout = pipe::Receiver::from_owned_fd(OwnedFd::from(out_read))?;
    let stderr = err_read
        .map(|r| pipe::Receiver::from_owned_fd(OwnedFd::from(r)))
        .transpose()?;
    Ok(Spawned {
        child,
        pid,
        tree: TreeId::new(pid as i32, Some(marker)),
        stdin,
        stdout,
        stderr,
    })
}

/// Kills the whole tree (TERM, `grace`, KILL) on the blocking pool.
pub async fn kill(tree: TreeId, grace: std::time::Duration) {
    let result = tokio::task::spawn_blocking(move || warren_process::kill_tree(&tree, grace)).await;
    if let Ok(report) = result
        && !report.survivors.is_empty()
    {
        tracing::warn!(survivors = ?report.survivors, "processes survived SIGKILL");
    }
}
