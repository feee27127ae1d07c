//! What a brain session needs from the gateway: a [`Host`] that serves the agent's `fs/*` and
//! `terminal/*` requests (the session's hands) and a [`TurnSink`] that receives what the agent
//! says (`session/update`) and asks (`session/request_permission`). Both are object-safe traits
//! returning boxed futures so the gateway can hand over `Arc<dyn ...>`.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

/// A boxed, `Send` future (the traits here are used as `Arc<dyn Trait>`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why the host could not serve a request. Becomes a JSON-RPC error for the agent.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HostError {
    /// A file or terminal that does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// The request itself is wrong (a path outside the workspace, a bad argument).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// Anything else (hands unavailable, I/O failure).
    #[error("{0}")]
    Failed(String),
}

/// `terminal/create` parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminalSpec {
    pub command: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    /// Keep at most this many bytes of output (the oldest are dropped first).
    pub output_byte_limit: Option<u64>,
}

/// How a terminal's command ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TerminalExit {
    pub exit_code: Option<u32>,
    pub signal: Option<String>,
}

/// `terminal/output` result: the output so far (after truncation) and the exit, if any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TerminalOutput {
    pub output: String,
    pub truncated: bool,
    pub exit: Option<TerminalExit>,
}

/// ACP's `line` (1-based) and `limit` (lines) of `fs/read_text_file` applied to a file's text:
/// what every [`Host::read_text_file`] answers.
pub fn select_lines(text: &str, line: Option<u32>, limit: Option<u32>) -> String {
    if line.is_none() && limit.is_none() {
        return text.to_owned();
    }
    let skip = line.map_or(0, |l| l.saturating_sub(1) as usize);
    let take = limit.map_or(usize::MAX, |l| l as usize);
    text.split_inclusive('\n').skip(skip).take(take).collect()
}

/// Serves one session's client-side capabilities. Paths are absolute, as ACP requires.
pub trait Host: Send + Sync + 'static {
    /// `fs/read_text_file`: `line` is 1-based, `limit` a number of lines.
    fn read_text_file(
        &self,
        path: PathBuf,
        line: Option<u32>,
        limit: Option<u32>,
    ) -> BoxFuture<'_, Result<String, HostError>>;
    /// `fs/write_text_file`: creates or replaces the file.
    fn write_text_file(
        &self,
        path: PathBuf,
        content: String,
    ) -> BoxFuture<'_, Result<(), HostError>>;
    /// `terminal/create`: starts the command, returns a terminal id at once.
    fn create_terminal(&self, spec: TerminalSpec) -> BoxFuture<'_, Result<String, HostError>>;
    /// `terminal/output`: the output so far, without waiting.
    fn terminal_output(
        &self,
        terminal_id: String,
    ) -> BoxFuture<'_, Result<TerminalOutput, HostError>>;
    /// `terminal/wait_for_exit`: resolves when the command has exited.
    fn wait_for_terminal_exit(
        &self,
        terminal_id: String,
    ) -> BoxFuture<'_, Result<TerminalExit, HostError>>;
    /// `terminal/kill`: kills the command; the terminal stays readable.
    fn kill_terminal(&self, terminal_id: String) -> BoxFuture<'_, Result<(), HostError>>;
    /// `terminal/release`: kills the command if still running and forgets the terminal.
    fn release_terminal(&self, terminal_id: String) -> BoxFuture<'_, Result<(), HostError>>;
}

/// The answer to a permission request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PermissionOutcome {
    /// The client picked this `optionId`.
    Selected(String),
    /// The turn was cancelled (or the client went away).
    Cancelled,
}

/// Receives what the agent sends during a session. Calls arrive in the agent's order.
pub trait TurnSink: Send + Sync + 'static {
    /// One `session/update` notification's `update` object, unchanged, as it arrives.
    fn update(&self, update: serde_json::Value);
    /// A `session/request_permission`: `tool_call` and `options` as the agent sent them. The
    /// future resolves with the client's answer; it is dropped (and the agent told `cancelled`)
    /// if the turn is cancelled first.
    fn request_permission(
        &self,
        tool_call: serde_json::Value,
        options: serde_json::Value,
    ) -> BoxFuture<'static, PermissionOutcome>;
}
