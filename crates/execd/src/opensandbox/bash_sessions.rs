//! Bash sessions (`POST /session`, `POST /session/{id}/run`, `DELETE /session/{id}`): one
//! long-lived `bash --noprofile --norc` per session on pipes, so exported variables and the
//! working directory persist from one run to the next.
//!
//! Each run writes `eval '<command>' </dev/null` to the shell's stdin followed by a `printf` of
//! a per-run random sentinel and `$?`; output lines up to the sentinel are the run's output
//! (stderr merged, empty lines skipped). Runs of one session are serialised. A run that makes
//! the shell exit (`exit 3`), or that times out (the whole shell tree is killed), ends with the
//! shell's fate; the next run starts a fresh shell in the session's directory.
//!
//! The session's directory is created when the session is; a `cwd` with a NUL byte, below a
//! file, naming a file or with a name too long is refused then with the files API's codes
//! (`INVALID_PATH`, `NOT_A_DIRECTORY`, `NAME_TOO_LONG`), not found out by the first run. It is
//! not confined to `--root`: the shell can go anywhere anyway.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use warren_process::{OwnedChild, TreeId};
use warren_protocol::opensandbox::{EventType, RunInSessionRequest};

use super::CompatError;
use super::commands::PING_INTERVAL;
use super::stream::{EventSink, LineSplitter};
use crate::fs::{PathError, path_error};
use warren_process::{CommandSpec, TreeMarker};

/// The registry of bash sessions.
pub struct Sessions {
    map: Mutex<HashMap<String, Arc<BashSession>>>,
    /// Most sessions that may exist at once.
    max: usize,
}

struct BashSession {
    id: String,
    cwd: PathBuf,
    /// The running shell; held for the whole of a run, which serialises runs.
    shell: tokio::sync::Mutex<Option<Shell>>,
    /// The shell's tree, readable without waiting for a run to end (deletion kills it).
    tree: Mutex<Option<TreeId>>,
}

struct Shell {
    child: OwnedChild,
    stdin: pipe::Sender,
    output: pipe::Receiver,
    lines: LineSplitter,
}

/// How a run ended.
enum RunEnd {
    /// The sentinel arrived with this exit code.
    Finished(i32),
    /// The shell died (exit code, -1 for a signal); it must be restarted.
    ShellGone(i32),
    TimedOut,
}

impl Sessions {
    pub fn new(max: usize) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            max,
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<BashSession>>> {
        // Single map operations only, so a poisoned lock is still consistent.
        self.map
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `POST /session`: registers a session; its shell starts with the first run.
    pub async fn create(&self, cwd: PathBuf) -> Result<String, CompatError> {
        if self.map().len() >= self.max {
            return Err(CompatError::TooManySessions(self.max));
        }
        let dir = cwd.clone();
        tokio::task::spawn_blocking(move || std::fs::create_dir_all(&dir))
            .await
            .map_err(|e| CompatError::Internal(format!("mkdir task panicked: {e}")))?
            .map_err(|e| cwd_error(&cwd, &e))?;
        let id = uuid::Uuid::new_v4().to_string();
        let session = Arc::new(BashSession {
            id: id.clone(),
            cwd,
            shell: tokio::sync::Mutex::new(None),
            tree: Mutex::new(None),
        });
        // Checked again under the lock that inserts: creations may race past the early check.
        let mut map = self.map();
        if map.len() >= self.max {
            return Err(CompatError::TooManySessions(self.max));
        }
        map.insert(id.clone(), session);
        Ok(id)
    }

    pub fn contains(&self, id: &str) -> bool {
        self.map().contains_key(id)
    }

    /// `POST /session/{id}/run`: validates, then runs in the background of the response.
    pub fn run(
        &self,
        id: &str,
        request: RunInSessionRequest,
        sink: EventSink,
    ) -> Result<(), CompatError> {
        let session = self
            .map()
            .get(id)
            .cloned()
            .ok_or(CompatError::SessionRunNotFound)?;
        if request.command.trim().is_empty() {
            return Err(CompatError::InvalidRequest(
                "command must not be empty".to_owned(),
            ));
        }
        let cwd = match request.cwd.as_deref().filter(|c| !c.is_empty()) {
            Some(cwd) => Some(crate::fs::checked_path(cwd)?),
            None => None,
        };
        let timeout = match request.timeout {
            Some(ms) if ms < 0 => {
                return Err(CompatError::InvalidRequest(
                    "timeout must not be negative".to_owned(),
                ));
            }
            Some(ms) if ms > 0 => Some(Duration::from_millis(ms as u64)),
            _ => None,
        };
        tokio::spawn(async move {
            session
                .run(&request.command, cwd.as_deref(), timeout, sink)
                .await;
        });
        Ok(())
    }

    /// `DELETE /session/{id}` (and `DELETE /command?id=` with a session id).
    pub async fn delete(&self, id: &str) -> Result<(), CompatError> {
        let session = self
            .map()
            .remove(id)
            .ok_or_else(|| CompatError::SessionNotFound(id.to_owned()))?;
        session.close().await;
        Ok(())
    }

    pub async fn shutdown(&self) {
        let sessions: Vec<Arc<BashSession>> = self.map().drain().map(|(_, s)| s).collect();
        futures_util::future::join_all(sessions.iter().map(|s| s.close())).await;
    }
}

/// Why a session's directory could not be made: the path's fault is the client's to fix
/// (`NOT_A_DIRECTORY`, `NAME_TOO_LONG`, `PERMISSION_DENIED`), anything else a runtime error.
fn cwd_error(cwd: &Path, err: &std::io::Error) -> CompatError {
    let shown = cwd.display().to_string();
    // `create_dir_all` answers EEXIST only when something other than a directory is there.
    if err.kind() == std::io::ErrorKind::AlreadyExists {
        return PathError::NotADirectory(format!("{shown} exists and is not a directory")).into();
    }
    match path_error(&shown, err) {
        Some(path_error) => path_error.into(),
        None => CompatError::Runtime(format!("cannot create directory {shown}: {err}")),
    }
}

/// Sends one event, giving up when `deadline` passes first (a client that stopped reading must
/// not hold off the run's timeout). False means the deadline passed.
async fn send_by(
    sink: &EventSink,
    deadline: Option<tokio::time::Instant>,
    kind: EventType,
    text: String,
) -> bool {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, sink.send_text(kind, text))
            .await
            .is_ok(),
        None => {
            sink.send_text(kind, text).await;
            true
        }
    }
}

/// Single-quotes `text` for the shell.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

impl BashSession {
    fn set_tree(&self, tree: Option<TreeId>) {
        *self
            .tree
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = tree;
    }

    fn tree(&self) -> Option<TreeId> {
        self.tree
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Kills the shell and everything it started, then reaps it.
    async fn close(&self) {
        if let Some(tree) = self.tree() {
            warren_process::stop::end_tree(&tree).await;
        }
        // A run in progress sees end of file now and releases the lock promptly.
        if let Ok(mut shell) =
            tokio::time::timeout(Duration::from_secs(10), self.shell.lock()).await
            && let Some(mut shell) = shell.take()
        {
            shell.child.wait_code().await;
        }
        self.set_tree(None);
    }

    fn start_shell(&self) -> std::io::Result<Shell> {
        let shell = warren_process::shell::default_shell();
        let mut spec = CommandSpec::new(shell.program, &TreeMarker::new()).cwd(self.cwd.clone());
        if shell.is_bash {
            spec = spec.arg("--noprofile").arg("--norc");
        }
        let spawned = super::commands::spawn_piped(&spec, true, true)?;
        let stdin = spawned.stdin.expect("stdin_pipe gives a stdin pipe");
        self.set_tree(Some(spawned.tree));
        Ok(Shell {
            child: spawned.child,
            stdin,
            output: spawned.stdout,
            lines: LineSplitter::default(),
        })
    }

    async fn run(
        &self,
        command: &str,
        cwd: Option<&str>,
        timeout: Option<Duration>,
        sink: EventSink,
    ) {
        let mut guard = self.shell.lock().await;
        let started = Instant::now();
        sink.send_text(EventType::Init, self.id.clone()).await;
        if guard.is_none() {
            match self.start_shell() {
                Ok(shell) => *guard = Some(shell),
                Err(err) => {
                    let message = format!("failed to start the session shell: {err}");
                    sink.send_error("CommandExecError", message.clone(), vec![message])
                        .await;
                    return;
                }
            }
        }
        let shell = guard.as_mut().expect("a shell was just ensured");
        sink.send_text(EventType::Ping, "pong").await;
        let end = shell.run(command, cwd, timeout, &sink).await;
        let code = match end {
            RunEnd::Finished(code) => code,
            RunEnd::ShellGone(code) => {
                if let Some(mut shell) = guard.take() {
                    shell.child.wait_code().await;
                }
                self.set_tree(None);
                code
            }
            RunEnd::TimedOut => {
                if let Some(tree) = self.tree() {
                    warren_process::stop::end_tree(&tree).await;
                }
                if let Some(mut shell) = guard.take() {
                    shell.child.wait_code().await;
                }
                self.set_tree(None);
                -1
            }
        };
        if code == 0 {
            sink.send_complete(started.elapsed().as_millis() as u64)
                .await;
        } else {
            sink.send_exit_error(code).await;
        }
    }
}

impl Shell {
    async fn run(
        &mut self,
        command: &str,
        cwd: Option<&str>,
        timeout: Option<Duration>,
        sink: &EventSink,
    ) -> RunEnd {
        let sentinel = format!("__WARREN_RUN_DONE_{}__", uuid::Uuid::new_v4().simple());
        let cd = cwd
            .map(|c| format!("cd -- {} && ", shell_quote(c)))
            .unwrap_or_default();
        // The leading newline of the sentinel ends any partial last line of output; the empty
        // line it may leave is skipped like every empty line of a session run.
        let script = format!(
            "{cd}eval {} </dev/null\nprintf '\\n%s %s\\n' '{sentinel}' \"$?\"\n",
            shell_quote(command)
        );
        if self.stdin.write_all(script.as_bytes()).await.is_err() {
            return RunEnd::ShellGone(self.exit_code().await);
        }
        let _ = self.stdin.flush().await;
        // A timeout too large to represent is no timeout at all.
        let deadline = timeout.and_then(|t| tokio::time::Instant::now().checked_add(t));
        let far_future = tokio::time::Instant::now() + Duration::from_secs(86400 * 365);
        let mut ping =
            tokio::time::interval_at(tokio::time::Instant::now() + PING_INTERVAL, PING_INTERVAL);
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            tokio::select! {
                read = self.output.read(&mut buf) => {
                    let n = match read {
                        Ok(0) | Err(_) => {
                            if let Some(line) = self.lines.finish()
                                && !line.starts_with(&sentinel)
                                && line != "
            "
                            {
                                sink.send_text(EventType::Stdout, line).await;
                            }
                            return RunEnd::ShellGone(self.exit_code().await);
                        }
                        Ok(n) => n,
                    };
                    for line in self.lines.push(&buf[..n]) {
                        if let Some(rest) = line.strip_prefix(&sentinel) {
                            return RunEnd::Finished(rest.trim().parse().unwrap_or(-1));
                        }
                        if line != "\n" && !send_by(sink, deadline, EventType::Stdout, line).await {
                            return RunEnd::TimedOut;
                        }
                    }
                }
                () = tokio::time::sleep_until(deadline.unwrap_or(far_future)), if deadline.is_some() => {
                    return RunEnd::TimedOut;
                }
                _ = ping.tick() => {
                    if !send_by(sink, deadline, EventType::Ping, "pong".to_owned()).await {
                        return RunEnd::TimedOut;
                    }
                }
            }
        }
    }

    /// The exit code of a shell whose output ended.
    async fn exit_code(&mut self) -> i32 {
        match tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await {
            Ok(Ok(status)) => warren_process::exit_code(status),
            _ => -1,
        }
    }
}
