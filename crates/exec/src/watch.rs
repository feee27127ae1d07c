//! Watching sessions live: a [`Watcher`] given to [`crate::Engine::with_watcher`] hears of every
//! session as it starts and gets a [`Feed`] that receives the command's raw output from its
//! first byte (exactly what the reader took from the pipe or terminal, before any capture or
//! rendering), its exit once the output is drained, and its removal from the engine. A
//! [`SessionInput`] lets the watcher type into the command (the same stdin the agent's
//! `write_stdin` uses), signal it and resize its terminal. execd's agent terminals are built on
//! this; the engine itself knows nothing of WebSockets or viewers.
//!
//! A feed is called on the session's own tasks, so it must never wait: a slow consumer is the
//! feed's problem, not the command's.

use std::sync::{Arc, Weak};

use rustix::process::Signal;
use warren_process::pty::PtySize;
use warren_protocol::exec::SessionId;

use crate::session::Session;

/// Hears of every session the engine starts.
pub trait Watcher: Send + Sync + 'static {
    /// Session `session` started; its output goes to the returned feed. Called before the
    /// session's reader runs, so the feed sees every byte.
    fn started(&self, session: WatchedSession) -> Arc<dyn Feed>;
}

/// Where one session's output, exit and removal go.
pub trait Feed: Send + Sync {
    /// Raw output bytes, in order, as they are read.
    fn output(&self, bytes: &[u8]);
    /// The command exited and all of its output has been given to [`Feed::output`]: the exit
    /// code, or `None` when a signal ended it.
    fn finished(&self, exit_code: Option<i32>);
    /// The engine forgot the session (released, read to its end, pruned, shut down).
    fn removed(&self);
}

/// Which engine call started a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionKind {
    /// `exec_command` (`/v1/exec`, the MCP tools).
    Exec,
    /// ACP `terminal/create` (`/v1/terminals`).
    Terminal,
}

/// What a watcher learns of a new session.
pub struct WatchedSession {
    pub id: SessionId,
    pub kind: SessionKind,
    /// The command line as the agent gave it (a terminal's program and arguments joined).
    pub command_line: String,
    /// On a PTY rather than pipes.
    pub tty: bool,
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub input: SessionInput,
}

/// Input to one session, for someone other than the agent. Holds the session weakly: once the
/// engine forgot it, every call fails with "the command is gone".
#[derive(Clone)]
pub struct SessionInput {
    session: Weak<Session>,
}

impl SessionInput {
    pub(crate) fn new(session: Weak<Session>) -> Self {
        Self { session }
    }

    fn session(&self) -> std::io::Result<Arc<Session>> {
        self.session
            .upgrade()
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "the command is gone"))
    }

    /// Writes `bytes` to the command's stdin (its terminal, on a PTY) as they are: unlike the
    /// agent's `write_stdin`, Ctrl-C and Ctrl-D are not interpreted on pipes.
    pub async fn write(&self, bytes: &[u8]) -> std::io::Result<()> {
        self.session()?.write_bytes(bytes).await
    }

    /// Sends `signal` to what Ctrl-C would hit: the terminal's foreground process group on a
    /// PTY, the command's process group on pipes.
    pub fn signal(&self, signal: Signal) -> std::io::Result<()> {
        self.session()?.signal(signal)
    }

    /// Resizes the command's terminal; nothing on pipes.
    pub fn resize(&self, size: PtySize) -> std::io::Result<()> {
        self.session()?.resize(size)
    }
}
