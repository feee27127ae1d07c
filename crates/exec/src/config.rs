//! The engine's settings: limits, defaults and where session logs go. Every field has the value
//! the spec gives; servers override only what their flags change.

use std::path::PathBuf;
use std::time::Duration;

/// Settings for one [`crate::Engine`].
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Working directory for commands without `workdir`, and the base for relative ones.
    pub default_workdir: PathBuf,
    /// Names of variables passed to commands although they look like secrets.
    pub pass_env: Vec<String>,
    /// The environment commands start from (before scrubbing and defaults). `None` uses the
    /// daemon's own environment.
    pub base_env: Option<Vec<(String, String)>>,
    /// Most live sessions; starting one more prunes (spec: 64).
    pub max_sessions: usize,
    /// Sessions never pruned because they were used most recently (spec: 8).
    pub n_protected_recent: usize,
    /// Output kept per session between two reads, as head + tail (spec: 1 MiB).
    pub capture_bytes: usize,
    /// Directory for the per-session raw output logs. Created on demand.
    pub log_dir: PathBuf,
    /// Largest raw log per session (spec: 64 MiB); output past it is counted, not written.
    pub max_log_bytes: u64,
    /// Logs of finished sessions kept so a named `output_file` stays readable; older ones are
    /// deleted.
    pub n_retained_logs: usize,
    /// Time between SIGTERM and SIGKILL when a tree is killed (spec: 2 s, the policy every
    /// face shares: [`warren_process::stop`]).
    pub kill_grace: Duration,
    /// Quiet time after which a process blocked reading its input counts as awaiting input.
    pub input_quiet: Duration,
    /// PTY size of `tty: true` sessions.
    pub tty_rows: u16,
    pub tty_cols: u16,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            default_workdir: std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
            pass_env: Vec::new(),
            base_env: None,
            max_sessions: 64,
            n_protected_recent: 8,
            capture_bytes: 1024 * 1024,
            log_dir: std::env::temp_dir().join(format!("warren-exec-{}", std::process::id())),
            max_log_bytes: 64 * 1024 * 1024,
            n_retained_logs: 32,
            kill_grace: warren_process::stop::KILL_GRACE,
            input_quiet: Duration::from_millis(300),
            tty_rows: 24,
            tty_cols: 80,
        }
    }
}
