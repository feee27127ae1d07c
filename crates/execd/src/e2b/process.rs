//! envd's `process.Process` service: processes started on pipes or a PTY through
//! `warren-process` (so every one is in the daemon's tree registry and killed as a tree), one
//! registry keyed by pid, and the output fan-out to the streams attached to each.
//!
//! A process belongs to no stream: `Start` attaches the first one, `Connect` more, and the
//! process runs on when they go (until its deadline, `SendSignal` or shutdown). Output is read
//! by one task per pipe (or the PTY) and handed to every attached stream with `try_send`, so a
//! slow client never stalls the process or the other streams; a stream that falls
//! [`SUBSCRIBER_BUFFER`] chunks behind is dropped and ends with `data_loss`. Every signal ends
//! the whole tree (SIGTERM, [`warren_process::stop::KILL_GRACE`], SIGKILL): upstream envd signals only its direct
//! child, so a `sleep` behind `bash -c` would outlive it.
//!
//! A finished process leaves the registry, but its end is kept for [`FINISHED_RETENTION`] (at
//! most [`MAX_FINISHED`] of them), as envd keeps it: a `Connect` that comes just too late
//! still gets `start{pid}` and the `end` instead of `not_found`, so the SDKs learn the exit
//! code. Only `Connect` sees these; every other call names running processes only.

use std::collections::{HashMap, VecDeque};
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use warren_process::pipes::{Leader, OutputMode, PipeOptions, StdinMode};
use warren_process::pty::{PtyControl, PtySize};
use warren_process::{CommandSpec, Connect, OwnedChild, Spawned, TreeId, TreeMarker};

use super::connect::{Code, ConnectError, StreamSender};
use super::proto::process::{
    ListResponse, ProcessConfig, ProcessEvent, ProcessInfo, ProcessInput, ProcessSelector, Signal,
    StartRequest, process_event, process_input, process_selector,
};

/// Output chunks one attached stream may have pending before it is dropped.
pub const SUBSCRIBER_BUFFER: usize = 1024;
/// Longest one input write may wait for a process that does not read its stdin.
const INPUT_WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Most bytes one read of a process's output takes.
const READ_CHUNK_BYTES: usize = 32 * 1024;
/// How long a finished process's end is kept for a late `Connect` (envd's
/// `terminatedRetentionTTL`).
pub const FINISHED_RETENTION: Duration = Duration::from_secs(30);
/// Most finished processes whose end is kept at once, whatever their age: a client starting
/// many short commands cannot grow the registry without limit. The oldest go first.
pub const MAX_FINISHED: usize = 1024;

/// Which output a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Stdout,
    Stderr,
    Pty,
}

/// What an attached stream receives.
#[derive(Debug, Clone)]
pub enum Event {
    Data(Output, Bytes),
    End(Ended),
}

/// How a process ended.
#[derive(Debug, Clone)]
pub struct Ended {
    pub end: process_event::EndEvent,
    /// It was killed at its `Connect-Timeout-Ms` deadline.
    pub timed_out: Option<Duration>,
}

/// How a process is started: the validated request.
pub struct Launch {
    pub spec: CommandSpec,
    pub config: ProcessConfig,
    pub tag: Option<String>,
    pub pty: Option<PtySize>,
    pub stdin: bool,
    pub timeout: Option<Duration>,
}

/// The registry of running processes, by pid, and the ends of recently finished ones.
#[derive(Default)]
pub struct Processes {
    by_pid: Mutex<HashMap<u32, Arc<Process>>>,
    finished: Mutex<FinishedEnds>,
}

/// One finished process's end, kept until `expires_at`.
struct Finished {
    pid: u32,
    tag: Option<String>,
    ended: Ended,
    expires_at: Instant,
}

/// The ends of finished processes in the order they finished (so also in order of expiry),
/// at most [`MAX_FINISHED`].
#[derive(Default)]
struct FinishedEnds {
    entries: VecDeque<Finished>,
}

impl FinishedEnds {
    /// Keeps `ended` for [`FINISHED_RETENTION`] from `now`, dropping the oldest beyond
    /// [`MAX_FINISHED`].
    fn record(&mut self, pid: u32, tag: Option<String>, ended: Ended, now: Instant) {
        self.prune(now);
        self.entries.retain(|f| f.pid != pid);
        self.entries.push_back(Finished {
            pid,
            tag,
            ended,
            expires_at: now + FINISHED_RETENTION,
        });
        while self.entries.len() > MAX_FINISHED {
            self.entries.pop_front();
        }
    }

    /// Forgets what a new process with this pid or tag would be mistaken for (as envd does):
    /// a `Connect` by either must reach the new one, not a predecessor's end.
    fn forget_reused(&mut self, pid: u32, tag: Option<&str>) {
        self.entries
            .retain(|f| f.pid != pid && (tag.is_none() || f.tag.as_deref() != tag));
    }

    /// The end a selector names, the most recent first for a tag.
    fn find(
        &mut self,
        selector: &process_selector::Selector,
        now: Instant,
    ) -> Option<(u32, Ended)> {
        self.prune(now);
        self.entries
            .iter()
            .rev()
            .find(|f| match selector {
                process_selector::Selector::Pid(pid) => f.pid == *pid,
                process_selector::Selector::Tag(tag) => f.tag.as_deref() == Some(tag.as_str()),
            })
            .map(|f| (f.pid, f.ended.clone()))
    }

    fn prune(&mut self, now: Instant) {
        while self.entries.front().is_some_and(|f| f.expires_at <= now) {
            self.entries.pop_front();
        }
    }
}

/// One running process.
pub struct Process {
    pub pid: u32,
    tree: TreeId,
    info: ProcessInfo,
    input: tokio::sync::Mutex<Input>,
    pty: Option<PtyControl>,
    fanout: Mutex<Fanout>,
}

enum Input {
    /// The write end of its stdin pipe; `None` without one or once closed.
    Pipe(Option<tokio::net::unix::pipe::Sender>),
    Pty(Box<dyn AsyncWrite + Send + Unpin>),
}

#[derive(Default)]
struct Fanout {
    subscribers: Vec<mpsc::Sender<Event>>,
    ended: Option<Ended>,
}

/// A stream's view of a process: live events, or the end if it came first.
pub enum Subscription {
    Live(mpsc::Receiver<Event>),
    Ended(Ended),
}

type Reader = Pin<Box<dyn AsyncRead + Send>>;

impl Processes {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<Process>>> {
        // Every critical section is one map operation, so a poisoned lock is consistent.
        self.by_pid.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts `launch` and subscribes the starting stream before any output is read.
    pub fn start(
        self: &Arc<Self>,
        launch: Launch,
    ) -> Result<(Arc<Process>, Subscription), ConnectError> {
        let connect = match launch.pty {
            Some(size) => Connect::Pty(size),
            None => Connect::Pipes(PipeOptions {
                stdin: if launch.stdin {
                    StdinMode::Pipe
                } else {
                    StdinMode::Null
                },
                output: OutputMode::Separate,
                leader: Leader::Session,
            }),
        };
        let spawned = warren_process::spawn(&launch.spec, connect).map_err(|error| {
            ConnectError::invalid_argument(format!("cannot start {}: {error}", launch.config.cmd))
        })?;
        let (child, tree, input, pty, readers): (
            OwnedChild,
            TreeId,
            Input,
            _,
            Vec<(Output, Reader)>,
        ) = match spawned {
            Spawned::Pty(pty) => (
                pty.child,
                pty.tree,
                Input::Pty(Box::new(pty.writer)),
                Some(pty.control),
                vec![(Output::Pty, Box::pin(pty.reader) as Reader)],
            ),
            Spawned::Pipes(pipes) => {
                let mut readers = vec![(Output::Stdout, Box::pin(pipes.stdout) as Reader)];
                if let Some(stderr) = pipes.stderr {
                    readers.push((Output::Stderr, Box::pin(stderr) as Reader));
                }
                (
                    pipes.child,
                    pipes.tree,
                    Input::Pipe(pipes.stdin),
                    None,
                    readers,
                )
            }
        };
        let pid = child.pid();
        let process = Arc::new(Process {
            pid,
            tree,
            info: ProcessInfo {
                config: Some(launch.config),
                pid,
                tag: launch.tag,
            },
            input: tokio::sync::Mutex::new(input),
            pty,
            fanout: Mutex::new(Fanout::default()),
        });
        let subscription = process.subscribe();
        self.finished_ends()
            .forget_reused(pid, process.info.tag.as_deref());
        self.map().insert(pid, Arc::clone(&process));
        let registry = Arc::clone(self);
        let driven = Arc::clone(&process);
        tokio::spawn(async move {
            let ended = drive(&driven, child, readers, launch.timeout).await;
            driven.publish_end(ended.clone());
            registry.finish(&driven, ended);
        });
        Ok((process, subscription))
    }

    fn finished_ends(&self) -> std::sync::MutexGuard<'_, FinishedEnds> {
        // Every critical section leaves the queue consistent, so a poisoned lock is too.
        self.finished.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Moves an ended process from the running ones to the finished ones. Its end is kept
    /// before it leaves the map, so a `Connect` racing the exit finds one or the other.
    fn finish(&self, process: &Arc<Process>, ended: Ended) {
        let mut map = self.map();
        if !map
            .get(&process.pid)
            .is_some_and(|p| Arc::ptr_eq(p, process))
        {
            // The pid already belongs to a newer process: this end would be mistaken for its.
            return;
        }
        self.finished_ends()
            .record(process.pid, process.info.tag.clone(), ended, Instant::now());
        map.remove(&process.pid);
    }

    /// What `Connect` attaches to: a running process's live events, or the kept end of one
    /// that finished within [`FINISHED_RETENTION`]; `not_found` otherwise.
    pub fn connect(
        &self,
        selector: Option<&ProcessSelector>,
    ) -> Result<(u32, Subscription), ConnectError> {
        match self.find(selector) {
            Ok(process) => Ok((process.pid, process.subscribe())),
            Err(not_found) => {
                let Some(selector) = selector.and_then(|s| s.selector.as_ref()) else {
                    return Err(not_found);
                };
                self.finished_ends()
                    .find(selector, Instant::now())
                    .map(|(pid, ended)| (pid, Subscription::Ended(ended)))
                    .ok_or(not_found)
            }
        }
    }

    /// The process a selector names: `not_found` for a pid or tag that is not one of ours.
    pub fn find(&self, selector: Option<&ProcessSelector>) -> Result<Arc<Process>, ConnectError> {
        let selector = selector.and_then(|s| s.selector.as_ref()).ok_or_else(|| {
            ConnectError::invalid_argument("a process selector (pid or tag) is required")
        })?;
        let map = self.map();
        let found = match selector {
            process_selector::Selector::Pid(pid) => map.get(pid).cloned(),
            process_selector::Selector::Tag(tag) => map
                .values()
                .find(|p| p.info.tag.as_deref() == Some(tag.as_str()))
                .cloned(),
        };
        found.ok_or_else(|| match selector {
            process_selector::Selector::Pid(pid) => {
                ConnectError::not_found(format!("process with pid {pid} not found"))
            }
            process_selector::Selector::Tag(tag) => {
                ConnectError::not_found(format!("process with tag {tag:?} not found"))
            }
        })
    }

    pub fn list(&self) -> ListResponse {
        let mut processes: Vec<ProcessInfo> = self.map().values().map(|p| p.info.clone()).collect();
        processes.sort_by_key(|p| p.pid);
        ListResponse { processes }
    }

    /// Ends every process's tree (daemon shutdown).
    pub async fn shutdown(&self) {
        let trees: Vec<TreeId> = self.map().values().map(|p| p.tree.clone()).collect();
        futures_util::future::join_all(trees.iter().map(warren_process::stop::end_tree)).await;
    }
}

impl Process {
    fn fanout(&self) -> std::sync::MutexGuard<'_, Fanout> {
        self.fanout.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Attaches a stream: every event from now on, or the end when it has come.
    pub fn subscribe(&self) -> Subscription {
        let mut fanout = self.fanout();
        if let Some(ended) = &fanout.ended {
            return Subscription::Ended(ended.clone());
        }
        let (sender, receiver) = mpsc::channel(SUBSCRIBER_BUFFER);
        fanout.subscribers.push(sender);
        Subscription::Live(receiver)
    }

    /// Hands `event` to every attached stream without waiting; one that is full is dropped
    /// (its receiver sees the channel close without an end).
    fn publish(&self, event: &Event) {
        self.fanout()
            .subscribers
            .retain(|subscriber| match subscriber.try_send(event.clone()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    tracing::warn!("an e2b process stream fell behind; dropping it");
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            });
    }

    fn publish_end(&self, ended: Ended) {
        let mut fanout = self.fanout();
        fanout.ended = Some(ended.clone());
        for subscriber in std::mem::take(&mut fanout.subscribers) {
            let _ = subscriber.try_send(Event::End(ended.clone()));
        }
    }

    /// Ends the whole tree: SIGTERM to every group, [`warren_process::stop::KILL_GRACE`], then
    /// SIGKILL.
    pub async fn kill(&self, signal: Signal) -> Result<(), ConnectError> {
        match signal {
            Signal::Sigterm | Signal::Sigkill => {
                warren_process::stop::end_tree(&self.tree).await;
                Ok(())
            }
            Signal::Unspecified => Err(ConnectError::invalid_argument(
                "signal must be SIGNAL_SIGTERM or SIGNAL_SIGKILL",
            )),
        }
    }

    /// Writes input to its stdin or PTY.
    pub async fn send_input(&self, input: Option<ProcessInput>) -> Result<(), ConnectError> {
        let Some(input) = input.and_then(|i| i.input) else {
            return Ok(());
        };
        let (bytes, to_pty) = match input {
            process_input::Input::Stdin(bytes) => (bytes, false),
            process_input::Input::Pty(bytes) => (bytes, true),
        };
        let mut guard = self.input.lock().await;
        let writer: &mut (dyn AsyncWrite + Send + Unpin) = match &mut *guard {
            Input::Pty(writer) => writer.as_mut(),
            Input::Pipe(_) if to_pty => {
                return Err(ConnectError::new(
                    Code::FailedPrecondition,
                    format!("process {} has no PTY; send stdin", self.pid),
                ));
            }
            Input::Pipe(Some(sender)) => sender,
            Input::Pipe(None) => {
                return Err(ConnectError::new(
                    Code::FailedPrecondition,
                    format!(
                        "process {} has no open stdin (started without stdin, or closed)",
                        self.pid
                    ),
                ));
            }
        };
        let written = tokio::time::timeout(INPUT_WRITE_TIMEOUT, async {
            writer.write_all(&bytes).await?;
            writer.flush().await
        })
        .await;
        match written {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(ConnectError::new(
                Code::FailedPrecondition,
                format!("writing to process {}: {error}", self.pid),
            )),
            Err(_) => Err(ConnectError::new(
                Code::DeadlineExceeded,
                format!(
                    "process {} did not read its input within {} s",
                    self.pid,
                    INPUT_WRITE_TIMEOUT.as_secs()
                ),
            )),
        }
    }

    pub async fn close_stdin(&self) -> Result<(), ConnectError> {
        match &mut *self.input.lock().await {
            Input::Pipe(sender) => {
                sender.take();
                Ok(())
            }
            Input::Pty(_) => Err(ConnectError::new(
                Code::FailedPrecondition,
                "a PTY has no stdin to close; send Ctrl-D (0x04) as pty input",
            )),
        }
    }

    pub fn resize(&self, rows: u32, cols: u32) -> Result<(), ConnectError> {
        let Some(control) = &self.pty else {
            return Err(ConnectError::new(
                Code::FailedPrecondition,
                format!("process {} has no PTY to resize", self.pid),
            ));
        };
        control
            .resize(pty_size(rows, cols)?)
            .map_err(|error| ConnectError::internal(format!("resizing the PTY: {error}")))
    }
}

/// A PTY size from the request's `u32`s: both 1 to 65535.
pub fn pty_size(rows: u32, cols: u32) -> Result<PtySize, ConnectError> {
    let (Ok(rows), Ok(cols)) = (u16::try_from(rows), u16::try_from(cols)) else {
        return Err(ConnectError::invalid_argument(
            "PTY rows and cols must be below 65536",
        ));
    };
    if rows == 0 || cols == 0 {
        return Err(ConnectError::invalid_argument(
            "PTY rows and cols must be at least 1",
        ));
    }
    Ok(PtySize { rows, cols })
}

/// Reads the process's output into the fan-out and waits for its end, killing the tree at the
/// deadline.
async fn drive(
    process: &Arc<Process>,
    mut child: OwnedChild,
    readers: Vec<(Output, Reader)>,
    timeout: Option<Duration>,
) -> Ended {
    let mut copiers = tokio::task::JoinSet::new();
    let n_read = Arc::new(std::sync::atomic::AtomicU64::new(0));
    for (output, mut reader) in readers {
        let process = Arc::clone(process);
        let n_read = Arc::clone(&n_read);
        copiers.spawn(async move {
            let mut buf = vec![0u8; READ_CHUNK_BYTES];
            loop {
                match reader.read(&mut buf).await {
                    // EIO on a PTY: every slave side is closed.
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        n_read.fetch_add(n as u64, std::sync::atomic::Ordering::SeqCst);
                        process.publish(&Event::Data(output, Bytes::copy_from_slice(&buf[..n])))
                    }
                }
            }
        });
    }
    let deadline = async {
        match timeout {
            Some(timeout) => tokio::time::sleep(timeout).await,
            None => std::future::pending().await,
        }
    };
    let mut timed_out = None;
    let status = tokio::select! {
        status = child.wait() => status,
        () = deadline => {
            timed_out = timeout;
            warren_process::stop::end_tree(&process.tree).await;
            child.wait().await
        }
    };
    // Output written just before the exit is forwarded before the end; descendants that keep
    // a pipe open (`server &`) are cut off after the drain, by the policy every face shares.
    {
        let mut all_copied = std::pin::pin!(async { while copiers.join_next().await.is_some() {} });
        warren_process::stop::drain_after_exit(
            &mut all_copied,
            || n_read.load(std::sync::atomic::Ordering::SeqCst),
            || 0,
        )
        .await;
    }
    copiers.abort_all();
    let end = match status {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => process_event::EndEvent {
                exit_code: code,
                exited: true,
                status: format!("exit status {code}"),
                error: None,
            },
            (None, signal) => process_event::EndEvent {
                exit_code: -1,
                exited: false,
                status: format!("signal: {}", signal_name(signal.unwrap_or(0))),
                error: None,
            },
        },
        Err(error) => process_event::EndEvent {
            exit_code: -1,
            exited: false,
            status: "unknown".into(),
            error: Some(format!("waiting for the process failed: {error}")),
        },
    };
    Ended { end, timed_out }
}

fn signal_name(signal: i32) -> String {
    match signal {
        9 => "killed".into(),
        15 => "terminated".into(),
        2 => "interrupt".into(),
        1 => "hangup".into(),
        13 => "broken pipe".into(),
        other => format!("signal {other}"),
    }
}

/// Forwards a process's events to a stream: `start{pid}` first, then output and keepalives,
/// then the end (or why the stream ended early). `wrap` makes the service's response message
/// of each event; `stream_timeout` bounds this stream only (`Connect`), not the process.
pub async fn forward<T: super::connect::Message>(
    pid: u32,
    subscription: Subscription,
    sender: StreamSender,
    wrap: impl Fn(ProcessEvent) -> T,
    keepalive: Duration,
    stream_timeout: Option<Duration>,
    stopping: CancellationToken,
) {
    let event = |event| wrap(ProcessEvent { event: Some(event) });
    if !sender
        .send(&event(process_event::Event::Start(
            process_event::StartEvent { pid },
        )))
        .await
    {
        return;
    }
    let mut receiver = match subscription {
        Subscription::Ended(ended) => {
            finish_ended(sender, &event, ended).await;
            return;
        }
        Subscription::Live(receiver) => receiver,
    };
    let stream_deadline = async {
        match stream_timeout {
            Some(timeout) => tokio::time::sleep(timeout).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(stream_deadline);
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + keepalive, keepalive);
    loop {
        tokio::select! {
            received = receiver.recv() => match received {
                Some(Event::Data(output, bytes)) => {
                    let bytes = bytes.to_vec();
                    let output = match output {
                        Output::Stdout => process_event::data_event::Output::Stdout(bytes),
                        Output::Stderr => process_event::data_event::Output::Stderr(bytes),
                        Output::Pty => process_event::data_event::Output::Pty(bytes),
                    };
                    let data = process_event::DataEvent { output: Some(output) };
                    if !sender.send(&event(process_event::Event::Data(data))).await {
                        return;
                    }
                }
                Some(Event::End(ended)) => {
                    finish_ended(sender, &event, ended).await;
                    return;
                }
                None => {
                    sender.finish(Some(ConnectError::new(
                        Code::DataLoss,
                        format!("the client fell more than {SUBSCRIBER_BUFFER} output chunks behind; reconnect to follow process {pid}"),
                    ))).await;
                    return;
                }
            },
            _ = ping.tick() => {
                let keepalive = process_event::Event::Keepalive(process_event::KeepAlive {});
                if !sender.send(&event(keepalive)).await {
                    return;
                }
            }
            () = &mut stream_deadline => {
                sender.finish(Some(ConnectError::new(Code::DeadlineExceeded, "the stream's Connect-Timeout-Ms passed; the process runs on"))).await;
                return;
            }
            () = stopping.cancelled() => {
                sender.finish(Some(ConnectError::new(Code::Unavailable, "execd is shutting down"))).await;
                return;
            }
            () = sender.closed() => return,
        }
    }
}

async fn finish_ended<T: super::connect::Message>(
    sender: StreamSender,
    event: &impl Fn(process_event::Event) -> T,
    ended: Ended,
) {
    if let Some(timeout) = ended.timed_out {
        let message = format!(
            "the process exceeded its timeout of {} ms and its process tree was killed",
            timeout.as_millis()
        );
        sender
            .finish(Some(ConnectError::new(Code::DeadlineExceeded, message)))
            .await;
        return;
    }
    if sender
        .send(&event(process_event::Event::End(ended.end)))
        .await
    {
        sender.finish(None).await;
    }
}

/// Whom a process runs as: uid and gid (`None`: the daemon's own) and that user's home.
pub struct RunAs<'a> {
    pub ids: Option<(u32, u32)>,
    /// Its `HOME` (below `/init`'s and the request's own variables), as envd sets it.
    pub home: Option<&'a Path>,
}

/// Validates a `StartRequest` into a [`Launch`]: `cmd` required, no NUL anywhere, `cwd`
/// absolute or relative to `default_cwd` and an existing directory.
pub fn launch(
    request: StartRequest,
    default_cwd: &Path,
    base_envs: &HashMap<String, String>,
    user: RunAs<'_>,
    timeout: Option<Duration>,
) -> Result<Launch, ConnectError> {
    let config = request
        .process
        .ok_or_else(|| ConnectError::invalid_argument("process is required"))?;
    if config.cmd.is_empty() {
        return Err(ConnectError::invalid_argument(
            "process.cmd must not be empty",
        ));
    }
    let has_nul = std::iter::once(&config.cmd)
        .chain(&config.args)
        .chain(config.envs.keys())
        .chain(config.envs.values())
        .chain(config.cwd.iter())
        .any(|s| s.contains('\0'));
    if has_nul {
        return Err(ConnectError::invalid_argument(
            "process fields must not contain NUL",
        ));
    }
    if config.envs.keys().any(|k| k.is_empty() || k.contains('=')) {
        return Err(ConnectError::invalid_argument(
            "environment names must be non-empty and free of '='",
        ));
    }
    let cwd = match config.cwd.as_deref().filter(|c| !c.is_empty()) {
        Some(cwd) => {
            let path = default_cwd.join(cwd);
            if !path.is_dir() {
                return Err(ConnectError::invalid_argument(format!(
                    "cwd {cwd} does not exist or is not a directory"
                )));
            }
            path
        }
        None => PathBuf::from(default_cwd),
    };
    let mut spec = CommandSpec::new(&config.cmd, &TreeMarker::new())
        .args(config.args.clone())
        .cwd(cwd);
    if let Some(home) = user.home {
        spec = spec.env("HOME", home);
    }
    for (name, value) in base_envs.iter().chain(&config.envs) {
        spec = spec.env(name, value);
    }
    if let Some((uid, gid)) = user.ids {
        spec.uid = Some(uid);
        spec.gid = Some(gid);
    }
    let pty = request
        .pty
        .map(|pty| {
            let size = pty.size.unwrap_or_default();
            pty_size(size.rows, size.cols)
        })
        .transpose()?;
    Ok(Launch {
        spec,
        config,
        tag: request.tag,
        pty,
        // Absent means true, for SDKs older than the field.
        stdin: request.stdin.unwrap_or(true),
        timeout,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(exit_code: i32) -> Ended {
        Ended {
            end: process_event::EndEvent {
                exit_code,
                exited: true,
                status: format!("exit status {exit_code}"),
                error: None,
            },
            timed_out: None,
        }
    }

    fn pid(pid: u32) -> process_selector::Selector {
        process_selector::Selector::Pid(pid)
    }

    fn tag(tag: &str) -> process_selector::Selector {
        process_selector::Selector::Tag(tag.to_owned())
    }

    fn exit_code(found: Option<(u32, Ended)>) -> Option<(u32, i32)> {
        found.map(|(pid, ended)| (pid, ended.end.exit_code))
    }

    #[test]
    fn a_finished_end_is_found_by_pid_or_tag_until_it_expires() {
        let t0 = Instant::now();
        let mut ends = FinishedEnds::default();
        ends.record(10, Some("job".into()), ended(3), t0);
        ends.record(11, None, ended(0), t0 + Duration::from_secs(5));
        let just_before = t0 + FINISHED_RETENTION - Duration::from_millis(1);
        let table = [
            (pid(10), t0, Some((10, 3))),
            (tag("job"), t0, Some((10, 3))),
            (pid(11), t0, Some((11, 0))),
            (pid(12), t0, None),
            (tag("other"), t0, None),
            (pid(10), just_before, Some((10, 3))),
            // Expired: 10 is gone, 11 finished 5 s later and is still kept.
            (pid(10), t0 + FINISHED_RETENTION, None),
            (pid(11), t0 + FINISHED_RETENTION, Some((11, 0))),
        ];
        for (selector, now, expected) in table {
            assert_eq!(
                exit_code(ends.find(&selector, now)),
                expected,
                "{selector:?} at +{:?}",
                now - t0
            );
        }
    }

    #[test]
    fn a_new_process_hides_the_end_of_the_one_whose_pid_or_tag_it_reuses() {
        let t0 = Instant::now();
        let mut ends = FinishedEnds::default();
        ends.record(10, Some("job".into()), ended(3), t0);
        ends.record(20, Some("other".into()), ended(4), t0);
        ends.forget_reused(10, None);
        assert!(ends.find(&pid(10), t0).is_none());
        assert!(ends.find(&tag("job"), t0).is_none());
        ends.forget_reused(30, Some("other"));
        assert!(ends.find(&pid(20), t0).is_none());
    }

    #[test]
    fn at_most_max_finished_ends_are_kept_the_oldest_go_first() {
        let t0 = Instant::now();
        let mut ends = FinishedEnds::default();
        for n in 0..MAX_FINISHED + 10 {
            let n = u32::try_from(n).expect("a small count");
            ends.record(n + 1, None, ended(0), t0);
        }
        assert_eq!(ends.entries.len(), MAX_FINISHED);
        assert!(ends.find(&pid(10), t0).is_none(), "the oldest went");
        let newest = u32::try_from(MAX_FINISHED + 10).expect("a small count");
        assert!(ends.find(&pid(newest), t0).is_some());
        // The same pid again replaces its older end.
        ends.record(newest, None, ended(7), t0);
        assert_eq!(exit_code(ends.find(&pid(newest), t0)), Some((newest, 7)));
        assert_eq!(ends.entries.len(), MAX_FINISHED);
    }
}
