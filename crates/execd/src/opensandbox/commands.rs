//! `POST /command`, `GET /command/status/{id}`, `GET /command/{id}/logs`, `DELETE /command`:
//! one-shot commands streamed as events (foreground) or recorded to a capped log file
//! (background).
//!
//! A foreground stream ends the moment the final event is written (no tail sleep) and output is
//! forwarded as it is read. Records of finished commands expire after the retention period (and
//! beyond `--command-records-max`), taking their log files with them. Killing and the drain
//! after an exit follow the policy every face shares (`warren_process::stop`); every child is
//! reaped by its own task.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, SecondsFormat, Utc};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use warren_process::{OwnedChild, TreeId};
use warren_protocol::opensandbox::{CommandStatus, EventType, RunCommandRequest};

use super::CompatError;
use super::stream::{EventSink, LineSplitter};
use warren_process::pipes::{Leader, OutputMode, PipeOptions, PipedChild, StdinMode};
use warren_process::{CommandSpec, TreeMarker};

/// Most bytes of output kept per background command; later output is counted and dropped.
pub const MAX_LOG_BYTES: u64 = 8 * 1024 * 1024;
/// How often a `ping` event is sent while a command runs.
pub const PING_INTERVAL: Duration = Duration::from_secs(3);

/// The registry of commands started through `POST /command`.
pub struct Commands {
    records: Mutex<HashMap<String, Arc<CommandRecord>>>,
    log_dir: PathBuf,
    retention: Duration,
    /// Most finished records kept regardless of age; the oldest go first.
    max_finished: usize,
    default_cwd: PathBuf,
}

struct CommandRecord {
    id: String,
    content: String,
    started_at: DateTime<Utc>,
    tree: TreeId,
    /// Background commands only.
    log: Option<Arc<CommandLog>>,
    state: Mutex<RecordState>,
}

#[derive(Default)]
struct RecordState {
    running: bool,
    exit_code: Option<i32>,
    error: Option<String>,
    finished_at: Option<DateTime<Utc>>,
    finished: Option<Instant>,
}

struct CommandLog {
    path: PathBuf,
    /// Bytes on disk that readers may see.
    n_bytes: AtomicU64,
}

/// A validated `POST /command`.
struct Launch {
    content: String,
    spec: CommandSpec,
    background: bool,
    timeout: Option<Duration>,
}

impl Commands {
    pub fn new(
        log_dir: PathBuf,
        retention: Duration,
        max_finished: usize,
        default_cwd: PathBuf,
    ) -> Self {
        Self {
            records: Mutex::new(HashMap::new()),
            log_dir,
            retention,
            max_finished,
            default_cwd,
        }
    }

    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }

    fn records(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<CommandRecord>>> {
        // Every critical section is a single map operation, so a poisoned lock is consistent.
        self.records
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn validate(&self, request: RunCommandRequest) -> Result<Launch, CompatError> {
        let invalid = |m: &str| CompatError::InvalidRequest(m.to_owned());
        let (content, program, args) = match (request.command, request.argv) {
            (Some(_), Some(_)) => return Err(invalid("command and argv are mutually exclusive")),
            (Some(command), None) => {
                if command.trim().is_empty() {
                    return Err(invalid("command must not be empty"));
                }
                let shell = warren_process::shell::default_shell().program;
                (
                    command.clone(),
                    shell.to_owned(),
                    vec!["-c".to_owned(), command],
                )
            }
            (None, Some(argv)) => {
                let Some(program) = argv.first().filter(|p| !p.is_empty()).cloned() else {
                    return Err(invalid("argv needs a non-empty executable"));
                };
                if argv.iter().any(|arg| arg.contains('\0')) {
                    return Err(invalid("argv must not contain NUL"));
                }
                (argv.join(" "), program, argv[1..].to_vec())
            }
            (None, None) => return Err(invalid("command or argv is required")),
        };
        let timeout = match request.timeout {
            Some(ms) if ms < 1 => return Err(invalid("timeout must be at least 1 ms")),
            Some(ms) => Some(Duration::from_millis(ms as u64)),
            None => None,
        };
        if request.gid.is_some() && request.uid.is_none() {
            return Err(invalid("gid requires uid"));
        }
        let cwd = match request.cwd.as_deref().filter(|c| !c.is_empty()) {
            Some(cwd) => {
                let expanded = crate::fs::expand_path(cwd).map_err(CompatError::InvalidRequest)?;
                let path = PathBuf::from(expanded);
                if !path.is_dir() {
                    return Err(CompatError::InvalidRequest(format!(
                        "cwd {cwd} does not exist or is not a directory"
                    )));
                }
                path
            }
            None => self.default_cwd.clone(),
        };
        // The daemon's environment minus Warren's credentials, plus the request's variables.
        let mut spec = CommandSpec::new(program, &TreeMarker::new())
            .args(args)
            .cwd(cwd);
        for (name, value) in request.envs.unwrap_or_default() {
            spec = spec.env(name, value);
        }
        spec.uid = request.uid;
        spec.gid = request.gid;
        Ok(Launch {
            content,
            spec,
            background: request.background,
            timeout,
        })
    }

    /// Validates and starts a command; events go to `sink` (the response of `POST /command`).
    pub fn run(&self, request: RunCommandRequest, sink: EventSink) -> Result<(), CompatError> {
        let launch = self.validate(request)?;
        self.sweep();
        let id = uuid::Uuid::new_v4().simple().to_string();
        let started = Instant::now();
        let started_at = Utc::now();
        let spawned = spawn_piped(&launch.spec, false, launch.background);
        match spawned {
            Err(err) => {
                let message = format!("failed to start command: {err}");
                let record = Arc::new(CommandRecord {
                    id: id.clone(),
                    content: launch.content,
                    started_at,
                    tree: TreeId::new(0, None),
                    log: None,
                    state: Mutex::new(RecordState::default()),
                });
                record.finish(-1, Some(message.clone()));
                self.records().insert(id.clone(), record);
                tokio::spawn(async move {
                    sink.send_text(EventType::Init, id).await;
                    sink.send_error("CommandExecError", message.clone(), vec![message])
                        .await;
                });
            }
            Ok(spawned) => {
                let log = launch.background.then(|| {
                    Arc::new(CommandLog {
                        path: self.log_dir.join(format!("{id}.log")),
                        n_bytes: AtomicU64::new(0),
                    })
                });
                let record = Arc::new(CommandRecord {
                    id: id.clone(),
                    content: launch.content,
                    started_at,
                    tree: spawned.tree.clone(),
                    log: log.clone(),
                    state: Mutex::new(RecordState {
                        running: true,
                        ..RecordState::default()
                    }),
                });
                self.records().insert(id.clone(), Arc::clone(&record));
                match log {
                    Some(log) => {
                        tokio::spawn(async move {
                            sink.send_text(EventType::Init, id).await;
                            sink.send_text(EventType::Ping, "pong").await;
                            sink.send_complete(started.elapsed().as_millis() as u64)
                                .await;
                            drop(sink);
                            drive_background(record, spawned, log, launch.timeout).await;
                        });
                    }
                    None => {
                        tokio::spawn(async move {
                            drive_foreground(record, spawned, sink, launch.timeout, started).await;
                        });
                    }
                }
            }
        }
        Ok(())
    }

    fn get(&self, id: &str) -> Option<Arc<CommandRecord>> {
        self.sweep();
        self.records().get(id).cloned()
    }

    pub fn status(&self, id: &str) -> Result<CommandStatus, CompatError> {
        let record = self
            .get(id)
            .ok_or_else(|| CompatError::CommandNotFound(id.to_owned()))?;
        Ok(record.status())
    }

    /// Background output from `cursor`, and the cursor to ask for next time.
    pub async fn logs(&self, id: &str, cursor: u64) -> Result<(Vec<u8>, u64), CompatError> {
        let record = self
            .get(id)
            .ok_or_else(|| CompatError::InvalidRequest(format!("command not found: {id}")))?;
        let Some(log) = record.log.clone() else {
            return Err(CompatError::InvalidRequest(format!(
                "command {id} is not a background command"
            )));
        };
        let end = log.n_bytes.load(Ordering::Acquire);
        let start = cursor.min(end);
        if start == end {
            return Ok((Vec::new(), end));
        }
        let path = log.path.clone();
        let bytes = tokio::task::spawn_blocking(move || read_range(&path, start, end - start))
            .await
            .map_err(|e| CompatError::Internal(format!("log reader panicked: {e}")))?
            .map_err(|e| CompatError::Internal(format!("reading command log: {e}")))?;
        let next = start + bytes.len() as u64;
        Ok((bytes, next))
    }

    /// `DELETE /command?id=`: kills a running command's tree.
    pub async fn interrupt(&self, id: &str) -> Result<(), CompatError> {
        let record = self
            .get(id)
            .ok_or_else(|| CompatError::Runtime(format!("command not found: {id}")))?;
        if !record.is_running() {
            return Err(CompatError::Runtime(format!("command {id} is not running")));
        }
        warren_process::stop::end_tree(&record.tree).await;
        Ok(())
    }

    /// Drops expired finished records (and their logs).
    fn sweep(&self) {
        let now = Instant::now();
        let mut expired = Vec::new();
        {
            let mut records = self.records();
            let mut finished: Vec<(Instant, String)> = records
                .values()
                .filter_map(|r| r.finished_instant().map(|at| (at, r.id.clone())))
                .collect();
            finished.sort();
            let n_over = finished.len().saturating_sub(self.max_finished);
            for (index, (at, id)) in finished.into_iter().enumerate() {
                if (index < n_over || now.duration_since(at) >= self.retention)
                    && let Some(record) = records.remove(&id)
                {
                    expired.push(record);
                }
            }
        }
        let paths: Vec<PathBuf> = expired
            .iter()
            .filter_map(|r| r.log.as_ref().map(|l| l.path.clone()))
            .collect();
        if !paths.is_empty() {
            tokio::task::spawn_blocking(move || {
                for path in paths {
                    if let Err(err) = std::fs::remove_file(&path)
                        && err.kind() != std::io::ErrorKind::NotFound
                    {
                        tracing::warn!(path = %path.display(), %err, "removing a command log");
                    }
                }
            });
        }
    }

    /// Kills every running command (daemon shutdown).
    pub async fn shutdown(&self) {
        let trees: Vec<TreeId> = self
            .records()
            .values()
            .filter(|r| r.is_running())
            .map(|r| r.tree.clone())
            .collect();
        futures_util::future::join_all(trees.iter().map(warren_process::stop::end_tree)).await;
    }
}

impl CommandRecord {
    fn state(&self) -> std::sync::MutexGuard<'_, RecordState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn is_running(&self) -> bool {
        self.state().running
    }

    fn finished_instant(&self) -> Option<Instant> {
        self.state().finished
    }

    fn finish(&self, exit_code: i32, error: Option<String>) {
        let mut state = self.state();
        state.running = false;
        state.exit_code = Some(exit_code);
        state.error = error;
        state.finished_at = Some(Utc::now());
        state.finished = Some(Instant::now());
    }

    fn status(&self) -> CommandStatus {
        let state = self.state();
        CommandStatus {
            id: self.id.clone(),
            content: self.content.clone(),
            running: state.running,
            exit_code: state.exit_code,
            error: state.error.clone(),
            started_at: rfc3339(self.started_at),
            finished_at: state.finished_at.map(rfc3339),
        }
    }
}

pub fn rfc3339(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn read_range(path: &Path, start: u64, len: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path)?;
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(len).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Waits for the child, killing its tree when `timeout` passes first. Returns the exit code
/// (-1 after a signal or the timeout) and the record's error text.
async fn wait_with_timeout(
    child: &mut OwnedChild,
    tree: TreeId,
    timeout: Option<Duration>,
) -> (i32, Option<String>) {
    let Some(timeout) = timeout else {
        let code = child.wait_code().await;
        return (code, (code < 0).then(|| "killed by a signal".to_owned()));
    };
    tokio::select! {
        code = child.wait_code() => (code, (code < 0).then(|| "killed by a signal".to_owned())),
        () = tokio::time::sleep(timeout) => {
            warren_process::stop::end_tree(&tree).await;
            child.wait_code().await;
            (-1, Some(format!("timed out after {} ms", timeout.as_millis())))
        }
    }
}

/// Runs a background command to its end, recording its output and exit.
async fn drive_background(
    record: Arc<CommandRecord>,
    spawned: PipedChild,
    log: Arc<CommandLog>,
    timeout: Option<Duration>,
) {
    let PipedChild {
        mut child,
        tree,
        stdout,
        ..
    } = spawned;
    let mut copier = tokio::spawn(copy_to_log(stdout, Arc::clone(&log)));
    let (exit_code, error) = wait_with_timeout(&mut child, tree, timeout).await;
    // Output written just before the exit is on disk before the record says finished. The
    // copier itself runs to end of file: descendants that keep the pipe open (`nohup server &`)
    // keep it going, bounded by MAX_LOG_BYTES.
    warren_process::stop::drain_after_exit(
        &mut copier,
        || log.n_bytes.load(Ordering::SeqCst),
        || 0,
    )
    .await;
    record.finish(exit_code, error);
}

/// Copies a background command's merged output to its log, keeping at most [`MAX_LOG_BYTES`].
async fn copy_to_log(mut output: pipe::Receiver, log: Arc<CommandLog>) {
    let mut file = match tokio::fs::File::create(&log.path).await {
        Ok(file) => file,
        Err(err) => {
            tracing::error!(path = %log.path.display(), %err, "cannot create a command log");
            return;
        }
    };
    let mut buf = vec![0u8; 64 * 1024];
    let mut n_written = 0u64;
    let mut truncated = false;
    loop {
        let n = match output.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if truncated {
            continue;
        }
        let room = MAX_LOG_BYTES.saturating_sub(n_written);
        let take = (n as u64).min(room) as usize;
        let mut chunk = buf[..take].to_vec();
        if take < n {
            truncated = true;
            chunk.extend_from_slice(
                format!("\n[warren: output truncated after {MAX_LOG_BYTES} bytes]\n").as_bytes(),
            );
        }
        if let Err(err) = file.write_all(&chunk).await {
            tracing::warn!(path = %log.path.display(), %err, "writing a command log");
            break;
        }
        if file.flush().await.is_err() {
            break;
        }
        n_written += chunk.len() as u64;
        log.n_bytes.store(n_written, Ordering::Release);
    }
}

/// Streams a foreground command: `init`, `ping`, one event per output line, then the final
/// event. The client leaving does not stop the command; its output is then just discarded.
///
/// Waiting for the exit (and killing at the timeout) runs in its own task, so a client that
/// stops reading, which stalls the forwarding below, delays neither the timeout nor the record.
async fn drive_foreground(
    record: Arc<CommandRecord>,
    spawned: PipedChild,
    sink: EventSink,
    timeout: Option<Duration>,
    started: Instant,
) {
    let PipedChild {
        mut child,
        tree,
        stdout,
        stderr,
        ..
    } = spawned;
    sink.send_text(EventType::Init, record.id.clone()).await;
    sink.send_text(EventType::Ping, "pong").await;

    let (exit_tx, mut exit_rx) = tokio::sync::oneshot::channel::<i32>();
    let waited = Arc::clone(&record);
    tokio::spawn(async move {
        let (code, error) = wait_with_timeout(&mut child, tree, timeout).await;
        waited.finish(code, error);
        let _ = exit_tx.send(code);
    });

    let mut stdout = Some(stdout);
    let mut stderr = stderr;
    let (mut out_lines, mut err_lines) = (LineSplitter::default(), LineSplitter::default());
    let (mut out_buf, mut err_buf) = (vec![0u8; 32 * 1024], vec![0u8; 32 * 1024]);
    let mut ping =
        tokio::time::interval_at(tokio::time::Instant::now() + PING_INTERVAL, PING_INTERVAL);
    let mut exit_code: Option<i32> = None;
    let mut drain: Option<warren_process::stop::Drain> = None;
    let far_future = tokio::time::Instant::now() + Duration::from_secs(86400 * 365);

    loop {
        if exit_code.is_some() && stdout.is_none() && stderr.is_none() {
            break;
        }
        tokio::select! {
            read = read_some(&mut stdout, &mut out_buf) => {
                match read {
                    Some(n) => {
                        if let Some(drain) = drain.as_mut() {
                            drain.output();
                        }
                        for line in out_lines.push(&out_buf[..n]) {
                            sink.send_text(EventType::Stdout, line).await;
                        }
                    }
                    None => stdout = None,
                }
            }
            read = read_some(&mut stderr, &mut err_buf) => {
                match read {
                    Some(n) => {
                        if let Some(drain) = drain.as_mut() {
                            drain.output();
                        }
                        for line in err_lines.push(&err_buf[..n]) {
                            sink.send_text(EventType::Stderr, line).await;
                        }
                    }
                    None => stderr = None,
                }
            }
            code = &mut exit_rx, if exit_code.is_none() => {
                // The waiter never drops the sender without sending; -1 is only a fallback.
                exit_code = Some(code.unwrap_or(-1));
                drain = Some(warren_process::stop::Drain::start());
            }
            // The drain's deadline moves with each output; reaching it ends the drain.
            () = tokio::time::sleep_until(drain.map_or(far_future, |d| d.deadline())), if drain.is_some() => break,
            _ = ping.tick() => {
                sink.send_text(EventType::Ping, "pong").await;
            }
        }
    }
    if let Some(line) = out_lines.finish() {
        sink.send_text(EventType::Stdout, line).await;
    }
    if let Some(line) = err_lines.finish() {
        sink.send_text(EventType::Stderr, line).await;
    }
    let code = exit_code.unwrap_or(-1);
    if code == 0 {
        sink.send_complete(started.elapsed().as_millis() as u64)
            .await;
    } else {
        sink.send_exit_error(code).await;
    }
}

/// Reads from an open pipe; `None` at end of file. Pends forever when the pipe is closed
/// already, so a `select!` branch on it simply never fires.
async fn read_some(pipe: &mut Option<pipe::Receiver>, buf: &mut [u8]) -> Option<usize> {
    match pipe {
        Some(receiver) => match receiver.read(buf).await {
            Ok(0) | Err(_) => None,
            Ok(n) => Some(n),
        },
        None => std::future::pending().await,
    }
}

/// Starts `spec` on pipes as the leader of its own session: stdin a pipe (session shells) or
/// `/dev/null`, stdout and stderr merged in write order or apart.
pub(super) fn spawn_piped(
    spec: &CommandSpec,
    stdin_pipe: bool,
    merge_output: bool,
) -> std::io::Result<PipedChild> {
    let options = PipeOptions {
        stdin: if stdin_pipe {
            StdinMode::Pipe
        } else {
            StdinMode::Null
        },
        output: if merge_output {
            OutputMode::Merged
        } else {
            OutputMode::Separate
        },
        leader: Leader::Session,
    };
    warren_process::spawn(spec, warren_process::Connect::Pipes(options))
        .map(warren_process::Spawned::into_pipes)
}
