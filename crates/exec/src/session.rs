//! One exec session: a command running on pipes or a PTY, the tasks that drain its output and
//! wait for it, and the state calls read from.
//!
//! Three tasks own the process side: the reader drains output into the bounded capture and the
//! raw log (it never stops reading, so the command never blocks on a full pipe), the waiter
//! waits for the exit and then drains the output by the policy every face shares
//! ([`warren_process::stop`]: a grandchild may hold the pipe open forever), and an optional
//! timer kills the tree when
//! `timeout_ms` expires. Everything calls need is in [`SessionState`] behind one mutex; changes
//! are announced on a `watch` channel so a waiting call never misses one. A session of a
//! watched engine also hands every byte the reader takes, and its exit, to its
//! [`crate::watch::Feed`].

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use warren_output::HeadTailCapture;
use warren_process::TreeId;
use warren_process::pty::{PtyControl, PtySize};
use warren_protocol::exec::SessionId;

use crate::config::EngineConfig;
use crate::watch::{Feed, SessionInput, SessionKind, WatchedSession, Watcher};

/// Size of one read from the command's output.
const READ_CHUNK: usize = 64 * 1024;
/// How often a waiting call looks in /proc for a process blocked reading its input.
const INPUT_POLL: Duration = Duration::from_millis(100);
/// Longest time one write to a command's stdin may block (a command that never reads).
const STDIN_WRITE_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) type BoxedWriter = Box<dyn AsyncWrite + Send + Unpin>;
pub(crate) type BoxedReader = Box<dyn AsyncRead + Send + Unpin>;
/// Bytes of output waiting in the pipe or terminal that the reader has not taken yet.
pub(crate) type PendingOutput = Box<dyn Fn() -> u64 + Send + Sync>;

/// How the process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl ExitInfo {
    pub fn from_status(status: std::process::ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        Self {
            code: status.code(),
            signal: status.signal(),
        }
    }

    /// The shell convention: the exit code, or 128 + the signal number.
    pub fn shell_code(&self) -> i32 {
        match (self.code, self.signal) {
            (Some(code), _) => code,
            (None, Some(signal)) => 128 + signal,
            (None, None) => -1,
        }
    }
}

/// What calls read and the process tasks write.
#[derive(Debug)]
pub(crate) struct SessionState {
    pub capture: HeadTailCapture,
    /// When output last arrived (or the session started).
    pub last_output: Instant,
    /// When a call last used the session: pruning order. Output does not count, so a chatty
    /// server the agent forgot about is not kept over sessions the agent works with.
    pub last_used: Instant,
    pub exit: Option<ExitInfo>,
    /// Output reached end of file.
    pub eof: bool,
    /// Exited and drained (or the drain gave up): the next result is the final one.
    pub finished: bool,
    /// `timeout_ms` expired and the tree was killed.
    pub timed_out: bool,
    /// Bytes written to the raw log; the log stops at `max_log_bytes`.
    pub log_bytes: u64,
    /// Bytes the reader took so far (the drain after the exit watches it move).
    pub bytes_read: u64,
    pub log_capped: bool,
    /// A result named the log file, so it must outlive the session for a while.
    pub log_named: bool,
    /// Stdin was closed (Ctrl-D on a pipe session), so the command cannot be waiting for us.
    pub stdin_closed: bool,
    /// A terminal's raw output tail.
    pub tail: Option<RawTail>,
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitOutcome {
    Finished,
    AwaitingInput,
    YieldExpired,
}

/// A live exec session. Shared between the registry, calls and its own tasks.
pub(crate) struct Session {
    pub id: SessionId,
    pub cmd: String,
    pub workdir: String,
    pub tty: bool,
    pub pid: u32,
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub tree: TreeId,
    /// Target of the command's fd 0 (`pipe:[N]` or `/dev/pts/N`), for awaiting-input checks.
    pub input_target: Option<PathBuf>,
    pub log_path: PathBuf,
    /// The raw log could be created (a result only names it then).
    pub has_log: bool,
    pub timeout: Option<Duration>,
    /// A terminal: never pruned, never returned by the exec calls, removed only on release.
    pub held: bool,
    state: Mutex<SessionState>,
    changed: watch::Sender<()>,
    stdin: tokio::sync::Mutex<Option<BoxedWriter>>,
    kill_grace: Duration,
    input_quiet: Duration,
    pending_output: PendingOutput,
    reader: Mutex<Option<tokio::task::AbortHandle>>,
    timer: Mutex<Option<tokio::task::AbortHandle>>,
    /// Calls (`exec_command`, `write_stdin`) waiting on this session right now.
    n_calls: std::sync::atomic::AtomicUsize,
    /// The terminal of a `tty` session: resizes and finds its foreground group.
    control: Option<Arc<PtyControl>>,
    /// Where a watched engine's output goes.
    feed: Option<Arc<dyn Feed>>,
}

impl Drop for Session {
    /// The engine dropped the last reference: the watcher forgets the session too.
    fn drop(&mut self) {
        if let Some(feed) = &self.feed {
            feed.removed();
        }
    }
}

/// Marks a call waiting on a session; pruning skips sessions with any. Dropped when the call
/// has built its result.
pub(crate) struct CallGuard {
    session: Arc<Session>,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.session
            .n_calls
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// What [`Session::start`] needs from a freshly spawned command.
pub(crate) struct Spawned {
    pub pid: u32,
    pub tree: TreeId,
    pub output: BoxedReader,
    pub stdin: Option<BoxedWriter>,
    pub pending_output: PendingOutput,
    /// The terminal, for a command on a PTY.
    pub control: Option<Arc<PtyControl>>,
    /// Resolves with the exit status; must release the pid to the reaper itself.
    pub wait: std::pin::Pin<
        Box<dyn std::future::Future<Output = std::io::Result<std::process::ExitStatus>> + Send>,
    >,
}

/// Description of the command, kept for listing.
pub(crate) struct SessionMeta {
    pub id: SessionId,
    pub cmd: String,
    /// What a watcher shows: `cmd`, or a terminal's program and arguments.
    pub command_line: String,
    pub workdir: String,
    pub tty: bool,
    pub log_path: PathBuf,
    pub timeout: Option<Duration>,
    /// Keep the raw output's last this many bytes: the session is a terminal.
    pub tail_limit: Option<usize>,
}

/// The last bytes of a terminal's raw output, bounded.
#[derive(Debug)]
pub(crate) struct RawTail {
    bytes: std::collections::VecDeque<u8>,
    limit: usize,
    total: u64,
}

impl RawTail {
    fn new(limit: usize) -> Self {
        Self {
            bytes: std::collections::VecDeque::new(),
            limit,
            total: 0,
        }
    }

    fn push(&mut self, data: &[u8]) {
        self.total += data.len() as u64;
        let keep = &data[data.len().saturating_sub(self.limit)..];
        let overflow = (self.bytes.len() + keep.len()).saturating_sub(self.limit);
        self.bytes.drain(..overflow.min(self.bytes.len()));
        self.bytes.extend(keep);
    }

    /// The kept bytes as text, and whether earlier bytes were dropped. A character cut in two
    /// by the limit is dropped whole rather than shown as a replacement character. While the
    /// output goes on (`complete` false), a trailing incomplete UTF-8 sequence is held back: its
    /// other bytes may still come, and a reader polling the text would otherwise see a
    /// replacement character that later turns into the real one.
    pub fn text(&self, complete: bool) -> (String, bool) {
        let truncated = self.total > self.bytes.len() as u64;
        let (front, back) = self.bytes.as_slices();
        let mut bytes = Vec::with_capacity(self.bytes.len());
        bytes.extend_from_slice(front);
        bytes.extend_from_slice(back);
        let start = if truncated {
            warren_output::utf8::first_char_boundary(&bytes)
        } else {
            0
        };
        let end = if complete {
            bytes.len()
        } else {
            warren_output::utf8::incomplete_suffix_start(&bytes).max(start)
        };
        (
            String::from_utf8_lossy(&bytes[start..end]).into_owned(),
            truncated,
        )
    }
}

impl Session {
    /// Wraps a spawned command and starts its reader, waiter and timer tasks. With a
    /// `watcher`, the session's feed is made before the reader runs, so it sees every byte.
    pub fn start(
        meta: SessionMeta,
        spawned: Spawned,
        config: &EngineConfig,
        watcher: Option<&dyn Watcher>,
    ) -> Arc<Self> {
        let now = Instant::now();
        let input_target = warren_process::procfs::fd_target(spawned.pid as i32, 0);
        let (changed, _) = watch::channel(());
        let log = open_log(&meta.log_path);
        let started_at = chrono::Utc::now();
        let held = meta.tail_limit.is_some();
        let session = Arc::new_cyclic(|weak: &std::sync::Weak<Session>| {
            let feed = watcher.map(|watcher| {
                watcher.started(WatchedSession {
                    id: meta.id,
                    kind: if held {
                        SessionKind::Terminal
                    } else {
                        SessionKind::Exec
                    },
                    command_line: meta.command_line.clone(),
                    tty: meta.tty,
                    started_at,
                    input: SessionInput::new(weak.clone()),
                })
            });
            Session {
                id: meta.id,
                cmd: meta.cmd,
                workdir: meta.workdir,
                tty: meta.tty,
                pid: spawned.pid,
                started_at,
                tree: spawned.tree,
                input_target,
                log_path: meta.log_path,
                has_log: log.is_some(),
                timeout: meta.timeout,
                held,
                state: Mutex::new(SessionState {
                    capture: HeadTailCapture::new(config.capture_bytes),
                    last_output: now,
                    last_used: now,
                    exit: None,
                    eof: false,
                    finished: false,
                    timed_out: false,
                    log_bytes: 0,
                    bytes_read: 0,
                    log_capped: false,
                    log_named: false,
                    stdin_closed: spawned.stdin.is_none(),
                    tail: meta.tail_limit.map(RawTail::new),
                }),
                changed,
                stdin: tokio::sync::Mutex::new(spawned.stdin),
                kill_grace: config.kill_grace,
                pending_output: spawned.pending_output,
                input_quiet: config.input_quiet,
                reader: Mutex::new(None),
                timer: Mutex::new(None),
                n_calls: std::sync::atomic::AtomicUsize::new(0),
                control: spawned.control,
                feed,
            }
        });

        let reader = tokio::spawn(read_output(
            Arc::clone(&session),
            spawned.output,
            log,
            config.max_log_bytes,
        ));
        *lock(&session.reader) = Some(reader.abort_handle());
        tokio::spawn(wait_for_exit(Arc::clone(&session), spawned.wait));
        if let Some(timeout) = session.timeout {
            let timed = Arc::clone(&session);
            let timer = tokio::spawn(async move {
                tokio::time::sleep(timeout).await;
                if timed.state().exit.is_none() {
                    timed.state().timed_out = true;
                    timed.kill().await;
                }
            });
            *lock(&session.timer) = Some(timer.abort_handle());
        }
        session
    }

    pub fn state(&self) -> MutexGuard<'_, SessionState> {
        lock(&self.state)
    }

    fn announce(&self) {
        self.changed.send_replace(());
    }

    /// Counts a call waiting on this session until the guard drops.
    pub fn begin_call(self: &Arc<Self>) -> CallGuard {
        self.n_calls
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        CallGuard {
            session: Arc::clone(self),
        }
    }

    /// True while some call waits on this session.
    pub fn has_calls(&self) -> bool {
        self.n_calls.load(std::sync::atomic::Ordering::SeqCst) > 0
    }

    pub fn touch(&self) {
        self.state().last_used = Instant::now();
    }

    /// Kills the whole process tree (SIGTERM, grace, SIGKILL) and returns once the kill is done;
    /// the waiter then records the exit.
    pub async fn kill(&self) {
        let report = warren_process::kill_tree(&self.tree, self.kill_grace).await;
        if !report.survivors.is_empty() {
            tracing::warn!(session = self.id, survivors = ?report.survivors, "processes survived SIGKILL");
        }
    }

    /// Waits until `deadline`, returning early when the session finishes or (unless
    /// `detect_input` is false) its process waits for input after `input_quiet` without output
    /// counted from `quiet_from`.
    pub async fn wait(
        &self,
        deadline: Instant,
        quiet_from: Instant,
        detect_input: bool,
    ) -> WaitOutcome {
        let mut changes = self.changed.subscribe();
        loop {
            let (finished, quiet_since, may_wait_for_input) = {
                let state = self.state();
                (
                    state.finished,
                    state.last_output.max(quiet_from),
                    state.exit.is_none() && (self.tty || !state.stdin_closed),
                )
            };
            if finished {
                return WaitOutcome::Finished;
            }
            let now = Instant::now();
            if now >= deadline {
                return WaitOutcome::YieldExpired;
            }
            let quiet_enough = now.duration_since(quiet_since) >= self.input_quiet;
            if detect_input
                && may_wait_for_input
                && quiet_enough
                && self.quietly_awaits_input().await
            {
                return WaitOutcome::AwaitingInput;
            }
            let next_check = if detect_input && may_wait_for_input {
                let quiet_end = quiet_since + self.input_quiet;
                deadline.min(quiet_end.max(now + INPUT_POLL))
            } else {
                deadline
            };
            tokio::select! {
                _ = changes.changed() => {}
                _ = tokio::time::sleep_until(next_check.into()) => {}
            }
        }
    }

    /// [`Self::awaits_input`], and all output so far has been taken by the reader (so the
    /// prompt is in the result, not still in the pipe) with none arriving during the check.
    async fn quietly_awaits_input(&self) -> bool {
        let before = self.state().last_output;
        if (self.pending_output)() > 0 || !self.awaits_input().await {
            return false;
        }
        (self.pending_output)() == 0 && self.state().last_output == before
    }

    /// True when a process of the tree is blocked reading the command's input.
    pub async fn awaits_input(&self) -> bool {
        let Some(input) = self.input_target.clone() else {
            return false;
        };
        let tree = self.tree.clone();
        let foreground_only = self.tty;
        tokio::task::spawn_blocking(move || {
            let members = warren_process::tree_members(&tree);
            warren_process::procfs::tree_awaits_input(&members, &input, foreground_only)
        })
        .await
        .unwrap_or(false)
    }

    /// Writes `chars` to the command. On pipe sessions `\u{3}` sends SIGINT to the process group
    /// and `\u{4}` closes stdin; on a PTY all bytes go to the terminal, which does that itself.
    pub async fn write_input(&self, chars: &str) -> Result<(), String> {
        let mut stdin = self.stdin.lock().await;
        if self.tty {
            return write_all(stdin.as_mut(), chars.as_bytes()).await;
        }
        let mut rest = chars;
        while !rest.is_empty() {
            let cut = rest.find(['\u{3}', '\u{4}']).unwrap_or(rest.len());
            write_all(stdin.as_mut(), &rest.as_bytes()[..cut]).await?;
            match rest[cut..].chars().next() {
                Some('\u{3}') => {
                    if let Err(e) = warren_process::signal_group(
                        self.tree.root_pid,
                        rustix::process::Signal::INT,
                    ) {
                        tracing::debug!(session = self.id, error = %e, "SIGINT not delivered");
                    }
                    rest = &rest[cut + 1..];
                }
                Some('\u{4}') => {
                    if let Some(mut pipe) = stdin.take() {
                        let _ = pipe.shutdown().await;
                    }
                    self.state().stdin_closed = true;
                    rest = &rest[cut + 1..];
                }
                _ => rest = "",
            }
        }
        Ok(())
    }

    /// Writes `bytes` to the command as they are (a watcher's typing; see
    /// [`SessionInput::write`]).
    pub async fn write_bytes(&self, bytes: &[u8]) -> std::io::Result<()> {
        let mut stdin = self.stdin.lock().await;
        write_all(stdin.as_mut(), bytes)
            .await
            .map_err(std::io::Error::other)
    }

    /// Sends `signal` to the terminal's foreground group (PTY) or the command's group (pipes).
    pub fn signal(&self, signal: rustix::process::Signal) -> std::io::Result<()> {
        match &self.control {
            Some(control) => control.signal_foreground(signal),
            None => warren_process::signal_group(self.tree.root_pid, signal),
        }
    }

    /// Resizes the command's terminal; a no-op on pipes.
    pub fn resize(&self, size: PtySize) -> std::io::Result<()> {
        match &self.control {
            Some(control) => control.resize(size),
            None => Ok(()),
        }
    }

    /// Stops the tasks that may still run (reader held open by a grandchild, timer).
    pub fn stop_tasks(&self) {
        if let Some(timer) = lock(&self.timer).take() {
            timer.abort();
        }
        if let Some(reader) = lock(&self.reader).take() {
            reader.abort();
        }
    }
}

async fn write_all(stdin: Option<&mut BoxedWriter>, bytes: &[u8]) -> Result<(), String> {
    if bytes.is_empty() {
        return Ok(());
    }
    let Some(stdin) = stdin else {
        return Err("stdin is closed".to_string());
    };
    let write = async {
        stdin.write_all(bytes).await?;
        stdin.flush().await
    };
    match tokio::time::timeout(STDIN_WRITE_TIMEOUT, write).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("writing to stdin failed: {e}")),
        Err(_) => {
            Err("writing to stdin timed out: the command is not reading its input".to_string())
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // State updates are single assignments; a panic elsewhere cannot leave them half done.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn open_log(path: &Path) -> Option<std::fs::File> {
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    match std::fs::File::create(path) {
        Ok(file) => Some(file),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot create session log");
            None
        }
    }
}

async fn read_output(
    session: Arc<Session>,
    mut output: BoxedReader,
    mut log: Option<std::fs::File>,
    max_log_bytes: u64,
) {
    let mut buf = vec![0u8; READ_CHUNK];
    let mut log_bytes = 0u64;
    loop {
        // A PTY reports EIO once the last process holding the terminal exits: end of output.
        let n = match output.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let data = &buf[..n];
        let mut capped = false;
        if let Some(file) = log.as_mut() {
            let room = max_log_bytes.saturating_sub(log_bytes) as usize;
            let part = &data[..room.min(n)];
            if !part.is_empty() && file.write_all(part).is_ok() {
                log_bytes += part.len() as u64;
            }
            capped = part.len() < n;
            if capped {
                log = None;
            }
        }
        {
            let mut state = session.state();
            state.capture.push(data);
            if let Some(tail) = state.tail.as_mut() {
                tail.push(data);
            }
            state.last_output = Instant::now();
            state.bytes_read += n as u64;
            state.log_bytes = log_bytes;
            state.log_capped |= capped;
        }
        if let Some(feed) = &session.feed {
            feed.output(data);
        }
        session.announce();
    }
    session.state().eof = true;
    session.announce();
}

async fn wait_for_exit(
    session: Arc<Session>,
    wait: std::pin::Pin<
        Box<dyn std::future::Future<Output = std::io::Result<std::process::ExitStatus>> + Send>,
    >,
) {
    let exit = match wait.await {
        Ok(status) => ExitInfo::from_status(status),
        Err(e) => {
            tracing::error!(session = session.id, error = %e, "waiting for the command failed");
            ExitInfo {
                code: None,
                signal: None,
            }
        }
    };
    session.state().exit = Some(exit);
    session.announce();
    let mut end_of_output = std::pin::pin!(end_of_output(&session));
    let reached = warren_process::stop::drain_after_exit(
        &mut end_of_output,
        || session.state().bytes_read,
        || (session.pending_output)(),
    )
    .await;
    if !reached {
        // Something the command started still holds the output open, with nothing queued;
        // stop reading it so the result is final. That process keeps running (it was put in
        // the background on purpose).
        if let Some(reader) = lock(&session.reader).take() {
            reader.abort();
        }
    }
    if let Some(timer) = lock(&session.timer).take() {
        timer.abort();
    }
    session.state().finished = true;
    if let Some(feed) = &session.feed {
        feed.finished(exit.code);
    }
    session.announce();
}

/// Resolves once the reader reached end of file.
async fn end_of_output(session: &Session) {
    let mut changes = session.changed.subscribe();
    while !session.state().eof {
        if changes.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RawTail;

    #[test]
    fn raw_tail_text_holds_an_incomplete_character_until_the_output_is_complete() {
        // (limit, pushes, complete, text, truncated)
        type Row<'a> = (usize, &'a [&'a [u8]], bool, &'a str, bool);
        let table: &[Row<'_>] = &[
            (64, &[b"ok\n"], false, "ok\n", false),
            (64, &[b"A\xe4\xbd"], false, "A", false),
            (64, &[b"A\xe4\xbd"], true, "A\u{fffd}", false),
            (64, &[b"A\xe4\xbd", b"\xa0\n"], false, "A\u{4f60}\n", false),
            (64, &[b"\xf0\x9f\x98"], false, "", false),
            (64, &[b"\xff"], false, "\u{fffd}", false),
            // The limit cut the first character: it is dropped whole.
            (4, &[b"\xe4\xbd\xa0abc"], false, "abc", true),
            (4, &[b"\xe4\xbd\xa0ab\xe5"], false, "ab", true),
        ];
        for (limit, pushes, complete, text, truncated) in table {
            let mut tail = RawTail::new(*limit);
            for data in *pushes {
                tail.push(data);
            }
            assert_eq!(
                tail.text(*complete),
                ((*text).to_owned(), *truncated),
                "pushes {pushes:?}, complete {complete}"
            );
        }
    }
}
