//! Starting a command or a session shell for the OpenSandbox routes on top of
//! `warren_process::pipes` (own session and process group, stdin from `/dev/null` or a pipe,
//! stdout and stderr on pipes merged or apart, the tree marker, the reaper registration).
//! This module only maps a request to a `CommandSpec`: the daemon's environment minus its
//! access token, plus the request's variables, the ids to run as, and the shell to use.
//!
//! Killing and reaping stay in `warren_process` (`kill_tree`, `OwnedChild`); the owner of a
//! [`Spawned`] must [`wait`] it, which releases the pid to the reaper.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::path::PathBuf;
use std::sync::OnceLock;

use warren_process::pipes::{Leader, OutputMode, PipeOptions, PipedChild, StdinMode, spawn_piped};
use warren_process::{CommandSpec, OwnedChild, TreeId};

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

/// A started process. Dropping it neither kills nor reaps it; call [`wait`].
pub type Spawned = PipedChild;

/// Waits for the child and hands its pid back to the reaper. Returns the exit code (-1 after a
/// signal, or when waiting failed).
pub async fn wait(child: &mut OwnedChild) -> i32 {
    match child.wait().await {
        Ok(status) => warren_process::exit_code(status),
        Err(err) => {
            tracing::warn!(pid = child.pid(), %err, "waiting for a command failed");
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

/// Starts `spec` through `warren_process::pipes` (own session and process group, tree marker,
/// registered with the reaper). Must be called inside a tokio runtime.
pub fn spawn(spec: &SpawnSpec) -> io::Result<Spawned> {
    let command = CommandSpec {
        program: spec.program.clone(),
        args: spec.args.clone(),
        cwd: Some(spec.cwd.clone()),
        env: spec
            .envs
            .iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect(),
        env_remove: HIDDEN_ENV.iter().map(OsString::from).collect(),
        env_clear: false,
        uid: spec.uid,
        gid: spec.gid,
    };
    let options = PipeOptions {
        stdin: if spec.stdin_pipe {
            StdinMode::Pipe
        } else {
            StdinMode::Null
        },
        output: if spec.merge_output {
            OutputMode::Merged
        } else {
            OutputMode::Separate
        },
        leader: Leader::Session,
    };
    spawn_piped(&command, options)
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
