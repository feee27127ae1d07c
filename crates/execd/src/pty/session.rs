//! One PTY session: its replay ring, the shell currently running (if any), the holder slot and
//! the machinery that moves the shell's output into the ring and out to connections.
//!
//! State lives in exactly one place, [`Session::state`], behind a short-held lock that the
//! output path also takes, so "snapshot the ring and subscribe" is atomic with respect to new
//! output. Output flows two ways: the holder gets each chunk pushed into an unbounded queue
//! whose byte count is capped (a holder that falls further behind is disconnected, never
//! waited for), and viewers pull from the ring when the progress watch ticks (a viewer that
//! falls more than the ring behind skips ahead). Nothing on the output path ever waits for a
//! client, so no client can stall the shell.
//!
//! Attaches (holder start, takeover) are serialised by [`Session::attach_lock`], which is held
//! across the waits a takeover needs but never by the output path.
//!
//! A session either starts its own shells ([`Session::new`], `POST /pty`) or carries a command
//! the exec engine runs ([`Session::adopted`], an agent terminal): then its output is handed in
//! ([`Session::publish_output`], [`Session::finish_adopted`]), its input goes to the engine, it
//! never starts anything, and the agent counts as a holder that is never evicted, so only a
//! takeover gets the holder slot.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::FutureExt;
use futures_util::future::Shared;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};
use warren_process::TreeId;
use warren_process::pipes::{Leader, OutputMode, PipeOptions, StdinMode};
use warren_process::pty::{PtyControl, PtySize};
use warren_process::{CommandSpec, Connect, OwnedChild, exit_code, signal_group};
use warren_protocol::pty::{
    CHANNEL_REPLAY, CHANNEL_STDERR, CHANNEL_STDOUT, MAX_LIVE_PAYLOAD, PtyMode, REPLAY_HEADER_LEN,
};

use super::ring::{RING_CAPACITY, ReplayRing};

/// Output bytes a holder may have queued before it is disconnected as too slow. Generous, so a
/// briefly descheduled client survives a burst; memory is only used while it lags.
pub const HOLDER_MAX_QUEUED_BYTES: usize = 16 * 1024 * 1024;
/// Most bytes in one viewer frame.
const MAX_VIEWER_PAYLOAD: usize = 128 * 1024;
/// First read buffer of a pump; it grows to a full frame only while output streams.
const SMALL_READ: usize = 4096;

/// Why a holder connection is being closed by the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kick {
    TakenOver,
    TooSlow,
}

/// What the session sends a holder, in order.
#[derive(Debug)]
pub enum HolderEvent {
    /// A live frame: channel byte then at most [`MAX_LIVE_PAYLOAD`] bytes.
    Output(Bytes),
    Exit(i32),
}

/// Where a client's signals go: the terminal's foreground group, or the shell's group.
#[derive(Debug, Clone)]
pub enum SignalTarget {
    Foreground(Arc<PtyControl>),
    Group(i32),
}

impl SignalTarget {
    pub fn send(&self, signal: rustix::process::Signal) -> std::io::Result<()> {
        match self {
            SignalTarget::Foreground(control) => control.signal_foreground(signal),
            SignalTarget::Group(pgrp) => signal_group(*pgrp, signal),
        }
    }
}

type StdinWriter = Box<dyn AsyncWrite + Unpin + Send>;

/// The running shell, as connections see it.
#[derive(Clone)]
pub struct Shell {
    pub generation: u64,
    pub mode: PtyMode,
    input: ShellInput,
}

/// Where a holder's stdin, signals and resizes go.
#[derive(Clone)]
enum ShellInput {
    /// A shell this session started.
    Own {
        stdin: Arc<tokio::sync::Mutex<StdinWriter>>,
        signals: SignalTarget,
        /// Present in PTY mode: resizes the terminal.
        control: Option<Arc<PtyControl>>,
    },
    /// A command of the exec engine.
    Engine(warren_exec::SessionInput),
}

impl Shell {
    pub async fn write_stdin(&self, bytes: &[u8]) -> std::io::Result<()> {
        match &self.input {
            ShellInput::Own { stdin, .. } => {
                let mut stdin = stdin.lock().await;
                stdin.write_all(bytes).await?;
                stdin.flush().await
            }
            ShellInput::Engine(input) => input.write(bytes).await,
        }
    }

    /// Resizes the terminal; a no-op in pipe mode.
    pub fn resize(&self, size: PtySize) -> std::io::Result<()> {
        match &self.input {
            ShellInput::Own {
                control: Some(control),
                ..
            } => control.resize(size),
            ShellInput::Own { control: None, .. } => Ok(()),
            ShellInput::Engine(input) => input.resize(size),
        }
    }

    /// Sends `signal` where pty-sessions.md says: the terminal's foreground group in PTY mode,
    /// the shell's group in pipe mode.
    pub fn signal(&self, signal: rustix::process::Signal) -> std::io::Result<()> {
        match &self.input {
            ShellInput::Own { signals, .. } => signals.send(signal),
            ShellInput::Engine(input) => input.signal(signal),
        }
    }

    /// Takes nothing and signals nothing: what a holder gets when the shell already exited.
    fn exited(generation: u64, mode: PtyMode) -> Self {
        Self {
            generation,
            mode,
            input: ShellInput::Own {
                stdin: Arc::new(tokio::sync::Mutex::new(Box::new(tokio::io::sink()))),
                signals: SignalTarget::Group(0),
                control: None,
            },
        }
    }
}

/// Where a session's shells come from.
enum Origin {
    /// `POST /pty`: a shell started at a holder's attach (again after it exited).
    Own {
        cwd: PathBuf,
        command: Option<String>,
        /// `POST /pty`'s `env`, added to every shell this session starts.
        env: Vec<(String, String)>,
    },
    /// A command the exec engine started and runs; the session only carries it.
    Adopted { mode: PtyMode },
}

#[derive(Debug, Clone, Copy)]
struct ExitRecord {
    generation: u64,
    exit_code: i32,
    /// Ring total when the shell's output was complete.
    at_offset: u64,
}

struct HolderSlot {
    conn_id: u64,
    events: mpsc::UnboundedSender<HolderEvent>,
    queued_bytes: Arc<AtomicUsize>,
    /// Set to tell the connection to go; a takeover that gave up waiting sets it back to `None`.
    kick: watch::Sender<Option<Kick>>,
    /// Resolves (with an error) once the holder's connection task has ended.
    finished: Shared<oneshot::Receiver<()>>,
}

struct State {
    ring: ReplayRing,
    shell: Option<Shell>,
    /// Generation of the last shell started; 0 before the first.
    generation: u64,
    last_exit: Option<ExitRecord>,
    holder: Option<HolderSlot>,
    /// Every shell's process tree, for teardown (leftovers of earlier shells included).
    trees: Vec<TreeId>,
    deleted: bool,
    next_conn_id: u64,
}

pub struct Session {
    pub id: String,
    origin: Origin,
    state: Mutex<State>,
    /// Bumped after every output chunk and every exit; viewers wait on it.
    progress: watch::Sender<u64>,
    attach_lock: tokio::sync::Mutex<()>,
    /// How long a takeover waits for the old holder to go.
    takeover_timeout: Duration,
}

/// Why an attach did not happen.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("another client is already connected to pty session {0}")]
    AlreadyConnected(String),
    #[error("failed to start shell: {0}")]
    StartFailed(String),
    #[error("pty session {0} was deleted")]
    Deleted(String),
    #[error("pty session {0} has no running shell")]
    NotRunning(String),
    #[error("the agent drives {0}: watch it with mode=viewer or answer it with takeover=1")]
    AgentHolds(String),
}

/// A holder's subscription.
pub struct HolderAttach {
    pub shell: Shell,
    /// Retained output from `since`: offset of the first byte and the bytes.
    pub replay: Option<(u64, Vec<u8>)>,
    pub events: mpsc::UnboundedReceiver<HolderEvent>,
    pub queued_bytes: Arc<AtomicUsize>,
    /// Changes to `Some` when the session wants the connection closed (it may change back to
    /// `None` if a takeover gave up); the sender is dropped when the shell exits.
    pub kick: watch::Receiver<Option<Kick>>,
    /// Dropped when the connection task ends; a takeover waits for that.
    pub finished: oneshot::Sender<()>,
}

/// A viewer's subscription: it reads the ring itself from `offset`.
pub struct ViewerAttach {
    pub generation: u64,
    pub mode: PtyMode,
    pub offset: u64,
    pub progress: watch::Receiver<u64>,
}

/// What a viewer reads next.
pub enum ViewerRead {
    /// A complete `0x03` frame.
    Frame(Vec<u8>),
    Exit(i32),
    Idle,
}

impl Session {
    pub fn new(
        id: String,
        cwd: PathBuf,
        command: Option<String>,
        env: Vec<(String, String)>,
        takeover_timeout: Duration,
    ) -> Self {
        Self::with_origin(
            id,
            Origin::Own { cwd, command, env },
            None,
            takeover_timeout,
        )
    }

    /// A session carrying a command of the exec engine, running from the start, with its
    /// input going to `input`.
    pub fn adopted(
        id: String,
        mode: PtyMode,
        input: warren_exec::SessionInput,
        takeover_timeout: Duration,
    ) -> Self {
        let shell = Shell {
            generation: 1,
            mode,
            input: ShellInput::Engine(input),
        };
        Self::with_origin(id, Origin::Adopted { mode }, Some(shell), takeover_timeout)
    }

    fn with_origin(
        id: String,
        origin: Origin,
        shell: Option<Shell>,
        takeover_timeout: Duration,
    ) -> Self {
        Self {
            id,
            origin,
            state: Mutex::new(State {
                ring: ReplayRing::new(RING_CAPACITY),
                generation: shell.as_ref().map_or(0, |shell| shell.generation),
                shell,
                last_exit: None,
                holder: None,
                trees: Vec::new(),
                deleted: false,
                next_conn_id: 0,
            }),
            progress: watch::Sender::new(0),
            attach_lock: tokio::sync::Mutex::new(()),
            takeover_timeout,
        }
    }

    /// How the shell's output reaches the session: an adopted command's, or the running
    /// shell's (PTY when none runs).
    pub fn mode(&self) -> PtyMode {
        match self.origin {
            Origin::Adopted { mode } => mode,
            Origin::Own { .. } => self
                .lock()
                .shell
                .as_ref()
                .map_or(PtyMode::Pty, |shell| shell.mode),
        }
    }

    /// True for a command of the exec engine ([`Session::adopted`]).
    pub fn is_adopted(&self) -> bool {
        matches!(self.origin, Origin::Adopted { .. })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the state consistent before anything can panic, so a
        // poisoned lock (a panic elsewhere while held) still guards valid data.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn is_running(&self) -> bool {
        self.lock().shell.is_some()
    }

    /// A connection holds the session, or (for an adopted command) the agent does: it always
    /// drives its own command, so a new holder needs `takeover=1`.
    pub fn has_holder(&self) -> bool {
        self.is_adopted() || self.lock().holder.is_some()
    }

    pub fn output_offset(&self) -> u64 {
        self.lock().ring.total()
    }

    /// Attaches a holder: evicts the current one if `takeover` (waiting up to the takeover
    /// timeout; if it is still there then, it keeps the session and this attach fails), starts
    /// a shell if none runs, then snapshots and subscribes.
    pub async fn attach_holder(
        self: &Arc<Self>,
        since: u64,
        takeover: bool,
        mode: PtyMode,
    ) -> Result<HolderAttach, AttachError> {
        let _attach = self.attach_lock.lock().await;
        if self.is_adopted() && !takeover {
            return Err(AttachError::AgentHolds(self.id.clone()));
        }
        let evicting = {
            let state = self.lock();
            if state.deleted {
                return Err(AttachError::Deleted(self.id.clone()));
            }
            match &state.holder {
                Some(_) if !takeover => {
                    return Err(AttachError::AlreadyConnected(self.id.clone()));
                }
                Some(slot) => {
                    // The slot stays until the old task ends and releases it, so the old
                    // holder keeps the session if it cannot be evicted in time.
                    slot.kick.send_replace(Some(Kick::TakenOver));
                    Some((slot.conn_id, slot.finished.clone()))
                }
                None => None,
            }
        };
        if let Some((conn_id, finished)) = evicting {
            if tokio::time::timeout(self.takeover_timeout, finished)
                .await
                .is_err()
            {
                let state = self.lock();
                if let Some(slot) = state.holder.as_ref().filter(|s| s.conn_id == conn_id) {
                    slot.kick.send_replace(None);
                }
                tracing::info!(session = %self.id, conn = conn_id, "takeover gave up: the holder did not go in time");
                return Err(AttachError::AlreadyConnected(self.id.clone()));
            }
            // Ended tasks release their slot themselves; this one is gone for good.
            let mut state = self.lock();
            if state.holder.as_ref().is_some_and(|s| s.conn_id == conn_id) {
                state.holder = None;
            }
        }
        if !self.is_adopted() && !self.is_running() {
            self.start_shell(mode)?;
        }
        let mut state = self.lock();
        if state.deleted {
            return Err(AttachError::Deleted(self.id.clone()));
        }
        let (events_tx, events) = mpsc::unbounded_channel();
        let (kick_tx, kick) = watch::channel(None);
        let (finished, finished_rx) = oneshot::channel();
        let queued_bytes = Arc::new(AtomicUsize::new(0));
        let (offset, bytes) = state.ring.read_from(since);
        let replay = (!bytes.is_empty()).then_some((offset, bytes));
        let shell = match state.shell.clone() {
            Some(shell) => {
                state.next_conn_id += 1;
                state.holder = Some(HolderSlot {
                    conn_id: state.next_conn_id,
                    events: events_tx,
                    queued_bytes: Arc::clone(&queued_bytes),
                    kick: kick_tx,
                    finished: finished_rx.shared(),
                });
                shell
            }
            None => {
                // The shell we just started has already exited and its output is all in the
                // replay: the holder gets it, then the exit.
                let exit = state.last_exit.map_or(-1, |record| record.exit_code);
                let _ = events_tx.send(HolderEvent::Exit(exit));
                let mode = match self.origin {
                    Origin::Adopted { mode } => mode,
                    Origin::Own { .. } => mode,
                };
                Shell::exited(state.generation, mode)
            }
        };
        Ok(HolderAttach {
            shell,
            replay,
            events,
            queued_bytes,
            kick,
            finished,
        })
    }

    /// Attaches a read-only viewer from `since`. Needs a running shell.
    pub fn attach_viewer(&self, since: u64) -> Result<ViewerAttach, AttachError> {
        let state = self.lock();
        let Some(shell) = &state.shell else {
            return Err(AttachError::NotRunning(self.id.clone()));
        };
        Ok(ViewerAttach {
            generation: shell.generation,
            mode: shell.mode,
            offset: state.ring.clamp(since),
            progress: self.progress.subscribe(),
        })
    }

    /// The next frame for a viewer at `offset` attached to shell `generation`, advancing the
    /// offset. Output after that shell's exit is not the viewer's: it gets the exit instead.
    pub fn viewer_read(&self, offset: &mut u64, generation: u64) -> ViewerRead {
        self.viewer_read_at_most(offset, generation, MAX_VIEWER_PAYLOAD)
    }

    /// A viewer's replay: everything retained from `offset` in one frame, read under one lock
    /// so its bytes are contiguous (the shell cannot evict the middle of it while it is read).
    pub fn viewer_replay(&self, offset: &mut u64, generation: u64) -> ViewerRead {
        self.viewer_read_at_most(offset, generation, RING_CAPACITY)
    }

    fn viewer_read_at_most(
        &self,
        offset: &mut u64,
        generation: u64,
        max_bytes: usize,
    ) -> ViewerRead {
        let state = self.lock();
        let exit = state
            .last_exit
            .filter(|record| record.generation >= generation);
        let end = exit.map_or(state.ring.total(), |record| record.at_offset);
        let from = state.ring.clamp(*offset);
        if from < end {
            let max = usize::try_from(end - from).map_or(max_bytes, |n| n.min(max_bytes));
            let mut frame = Vec::with_capacity(REPLAY_HEADER_LEN + max);
            frame.push(CHANNEL_REPLAY);
            frame.extend_from_slice(&from.to_be_bytes());
            let start = state.ring.read_into(from, max, &mut frame);
            frame[1..REPLAY_HEADER_LEN].copy_from_slice(&start.to_be_bytes());
            *offset = start + (frame.len() - REPLAY_HEADER_LEN) as u64;
            return ViewerRead::Frame(frame);
        }
        match exit {
            Some(record) => ViewerRead::Exit(record.exit_code),
            None => ViewerRead::Idle,
        }
    }

    /// Called by a holder connection when it ends, so a later attach does not wait for it.
    pub fn release_holder(&self, finished_conn: &Arc<AtomicUsize>) {
        let mut state = self.lock();
        if state
            .holder
            .as_ref()
            .is_some_and(|slot| Arc::ptr_eq(&slot.queued_bytes, finished_conn))
        {
            state.holder = None;
        }
    }

    /// Appends one live frame (channel byte + payload) to the ring and hands it to the holder.
    fn publish(&self, frame: Bytes) {
        let payload_len = frame.len() - 1;
        let total = {
            let mut state = self.lock();
            state.ring.write(&frame[1..]);
            let too_slow = state.holder.as_ref().is_some_and(|slot| {
                let queued = slot.queued_bytes.fetch_add(payload_len, Ordering::AcqRel);
                queued + payload_len > HOLDER_MAX_QUEUED_BYTES
            });
            if too_slow {
                if let Some(slot) = state.holder.take() {
                    tracing::info!(session = %self.id, conn = slot.conn_id, "holder fell behind; disconnecting it");
                    slot.kick.send_replace(Some(Kick::TooSlow));
                }
            } else if let Some(slot) = &state.holder {
                // A send error means the connection task is gone; it releases its slot itself.
                let _ = slot.events.send(HolderEvent::Output(frame));
            }
            state.ring.total()
        };
        self.progress.send_replace(total);
    }

    /// Appends an adopted command's output, in live frames of at most [`MAX_LIVE_PAYLOAD`].
    pub fn publish_output(&self, bytes: &[u8]) {
        for piece in bytes.chunks(MAX_LIVE_PAYLOAD) {
            let mut frame = BytesMut::with_capacity(1 + piece.len());
            frame.put_u8(CHANNEL_STDOUT);
            frame.put_slice(piece);
            self.publish(frame.freeze());
        }
    }

    /// Records an adopted command's exit, once all its output was published.
    pub fn finish_adopted(&self, exit_code: i32) {
        self.finish(1, exit_code);
    }

    /// Records the exit of shell `generation` once all its output is in the ring.
    fn finish(&self, generation: u64, code: i32) {
        let total = {
            let mut state = self.lock();
            if state
                .shell
                .as_ref()
                .is_some_and(|shell| shell.generation == generation)
            {
                state.shell = None;
            }
            let at_offset = state.ring.total();
            state.last_exit = Some(ExitRecord {
                generation,
                exit_code: code,
                at_offset,
            });
            if let Some(slot) = state.holder.take() {
                let _ = slot.events.send(HolderEvent::Exit(code));
                // The slot's kick sender is dropped here: the holder closes after the exit.
            }
            at_offset
        };
        tracing::info!(session = %self.id, generation, exit_code = code, "shell exited");
        self.progress.send_replace(total);
    }

    fn shell_command(
        cwd: &std::path::Path,
        script: Option<&str>,
        env: &[(String, String)],
    ) -> CommandSpec {
        let shell = warren_process::shell::default_shell();
        let mut command = CommandSpec::new(shell.program, &warren_process::TreeMarker::new());
        if shell.is_bash {
            command = command.arg("--noprofile").arg("--norc");
        }
        if let Some(script) = script {
            command = command.arg("-c").arg(script);
        }
        let command = env
            .iter()
            .fold(command, |command, (name, value)| command.env(name, value));
        command.cwd(cwd)
    }

    /// Starts a shell and the task that drives it. Called with the attach lock held.
    fn start_shell(self: &Arc<Self>, mode: PtyMode) -> Result<(), AttachError> {
        let Origin::Own { cwd, command, env } = &self.origin else {
            return Err(AttachError::StartFailed(
                "an agent's command is never started again".into(),
            ));
        };
        std::fs::create_dir_all(cwd).map_err(|e| {
            AttachError::StartFailed(format!("cannot create cwd {}: {e}", cwd.display()))
        })?;
        let command = Self::shell_command(cwd, command.as_deref(), env);
        let failed = |e: std::io::Error| AttachError::StartFailed(e.to_string());
        let (child, tree, shell_parts, readers): (OwnedChild, TreeId, _, Vec<Pump>) = match mode {
            PtyMode::Pty => {
                let command = command.env("TERM", "xterm-256color");
                let spawned = warren_process::spawn(&command, Connect::Pty(PtySize::DEFAULT))
                    .map_err(failed)?
                    .into_pty();
                let control = Arc::new(spawned.control);
                let stdin: StdinWriter = Box::new(spawned.writer);
                let parts = (
                    stdin,
                    SignalTarget::Foreground(Arc::clone(&control)),
                    Some(control),
                );
                let pumps = vec![Pump::new(Box::new(spawned.reader), CHANNEL_STDOUT)];
                (spawned.child, spawned.tree, parts, pumps)
            }
            PtyMode::Pipe => {
                // Its own process group in the daemon's session, stdout and stderr apart.
                let options = PipeOptions {
                    stdin: StdinMode::Pipe,
                    output: OutputMode::Separate,
                    leader: Leader::ProcessGroup,
                };
                let spawned = warren_process::spawn(&command, Connect::Pipes(options))
                    .map_err(failed)?
                    .into_pipes();
                let missing = || failed(std::io::Error::other("spawned shell lacks a pipe"));
                let stdin: StdinWriter = Box::new(spawned.stdin.ok_or_else(missing)?);
                let stderr = spawned.stderr.ok_or_else(missing)?;
                let parts = (stdin, SignalTarget::Group(spawned.tree.root_pid), None);
                let pumps = vec![
                    Pump::new(Box::new(spawned.stdout), CHANNEL_STDOUT),
                    Pump::new(Box::new(stderr), CHANNEL_STDERR),
                ];
                (spawned.child, spawned.tree, parts, pumps)
            }
        };
        let (stdin, signals, control) = shell_parts;
        let generation = {
            let mut state = self.lock();
            state.generation += 1;
            state.trees.push(tree);
            state.shell = Some(Shell {
                generation: state.generation,
                mode,
                input: ShellInput::Own {
                    stdin: Arc::new(tokio::sync::Mutex::new(stdin)),
                    signals,
                    control,
                },
            });
            state.generation
        };
        tracing::info!(session = %self.id, generation, pid = child.pid(), ?mode, "shell started");
        tokio::spawn(Arc::clone(self).drive(generation, child, readers));
        Ok(())
    }

    /// Moves output into the ring until the shell has exited and its output is drained, then
    /// records the exit.
    async fn drive(self: Arc<Self>, generation: u64, mut child: OwnedChild, mut pumps: Vec<Pump>) {
        let mut all = std::pin::pin!(futures_util::future::join_all(
            pumps.iter_mut().map(|pump| pump.run(&self))
        ));
        let mut pumps_done = false;
        let status = tokio::select! {
            status = child.wait() => status,
            _ = &mut all => {
                pumps_done = true;
                child.wait().await
            }
        };
        // Whatever the shell printed before exiting is already readable; a background job may
        // hold the terminal open, so the drain follows the policy every face shares.
        if !pumps_done {
            warren_process::stop::drain_after_exit(&mut all, || self.output_offset(), || 0).await;
        }
        let code = match status {
            Ok(status) => exit_code(status),
            Err(e) => {
                tracing::warn!(session = %self.id, error = %e, "waiting for the shell failed");
                -1
            }
        };
        self.finish(generation, code);
    }

    /// Marks the session deleted and kills every process any of its shells started. Blocks
    /// (in a blocking task) until they are gone.
    pub async fn teardown(&self) {
        // Holding the attach lock means no attach is between "not deleted" and starting a
        // shell, so no shell can start after its tree was collected here.
        let _attach = self.attach_lock.lock().await;
        let trees = {
            let mut state = self.lock();
            state.deleted = true;
            std::mem::take(&mut state.trees)
        };
        for tree in trees {
            warren_process::stop::hang_up(&tree).await;
        }
    }
}

/// Reads one output stream into live frames: waits for the first bytes, then takes whatever
/// else is already readable (up to one full frame) before publishing, so a stream is copied in
/// large frames while a keystroke echo goes out at once.
struct Pump {
    reader: Box<dyn AsyncRead + Unpin + Send>,
    channel: u8,
    buf: BytesMut,
    streaming: bool,
}

impl Pump {
    fn new(reader: Box<dyn AsyncRead + Unpin + Send>, channel: u8) -> Self {
        Self {
            reader,
            channel,
            buf: BytesMut::new(),
            streaming: false,
        }
    }

    async fn run(&mut self, session: &Session) {
        while let Some(frame) = self.next_frame().await {
            session.publish(frame);
        }
    }

    /// The next frame, or `None` at end of output. Cancel-safe: the only await is the first
    /// read, before which nothing is buffered.
    async fn next_frame(&mut self) -> Option<Bytes> {
        let want = if self.streaming {
            MAX_LIVE_PAYLOAD
        } else {
            SMALL_READ
        };
        self.buf.clear();
        if self.buf.capacity() < 1 + want {
            self.buf.reserve(1 + want);
        }
        self.buf.put_u8(self.channel);
        let limit = 1 + want;
        match self.read_some(limit).await {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
        while self.buf.len() < limit {
            match self.read_some(limit).now_or_never() {
                Some(Ok(n)) if n > 0 => {}
                _ => break,
            }
        }
        self.streaming = self.buf.len() - 1 > SMALL_READ / 2;
        Some(self.buf.split().freeze())
    }

    async fn read_some(&mut self, limit: usize) -> std::io::Result<usize> {
        let room = limit
            .saturating_sub(self.buf.len())
            .min(self.buf.capacity() - self.buf.len());
        if room == 0 {
            return Ok(0);
        }
        let mut limited = (&mut self.buf).limit(room);
        // A PTY reports EIO once every slave side is closed; that is its end of output.
        self.reader.read_buf(&mut limited).await
    }
}
