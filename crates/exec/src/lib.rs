//! The exec engine behind the agent tools `exec_command`, `write_stdin`, `list_sessions` and
//! `kill_session` (see `docs/exec-tools.md`). It owns exec sessions: commands started on pipes
//! (stdin kept open) or a PTY, each in its own session and process group, polled by later calls
//! until they exit, are killed, or are pruned.
//!
//! The engine knows no HTTP or MCP: servers call [`Engine`] and map [`ExecError`] to their own
//! error shapes. Output goes through `warren-output`; spawning, /proc inspection and killing
//! through `warren-process`. Every result carries the Codex-format text ([`render_text`]).
//! An engine made [`Engine::with_watcher`] also hands every session's raw output to a
//! [`Watcher`] as it is read ([`watch`]), so a person can watch and answer the agent's commands.
//!
//! Architecture invariant: the two waits never merge. `yield_time_ms` only decides when a call
//! returns; only `timeout_ms`, `kill_session`, pruning and shutdown kill.

mod config;
mod error;
pub mod render;
mod session;
pub mod watch;

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use warren_output::RenderOptions;
use warren_protocol::exec::{
    ExecCommandArgs, ExecResult, ExecStatus, SessionId, SessionInfo, SessionList, WriteStdinArgs,
};
use warren_protocol::terminal::{
    TerminalCreate, TerminalCreated, TerminalExitStatus, TerminalInfo, TerminalList, TerminalOutput,
};

pub use config::EngineConfig;
pub use error::ExecError;
pub use render::render_text;
pub use watch::{Feed, SessionInput, SessionKind, WatchedSession, Watcher};

use session::{CallGuard, Session, SessionMeta, Spawned, WaitOutcome};

/// A place in the registry, and the id, held for a session being spawned; dropping it unused
/// gives both back.
struct SlotReservation<'a> {
    engine: &'a Engine,
    id: SessionId,
    armed: bool,
}

impl Drop for SlotReservation<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _sessions = self.engine.lock_sessions();
            let engine = self.engine;
            engine.release_reservation(self);
        }
    }
}

/// The session pruning removes from a full registry: beyond the `n_protected` most recently
/// used, the least recently used exited one, else the least recently used running one, else
/// the least recently used of all. Sessions a call is waiting on are never chosen; `None` when
/// every session is in use.
fn prune_victim(
    sessions: &HashMap<SessionId, Arc<Session>>,
    n_protected: usize,
) -> Option<SessionId> {
    let mut by_use: Vec<(Instant, bool, bool, SessionId)> = sessions
        .values()
        .map(|s| {
            let state = s.state();
            (
                state.last_used,
                state.finished,
                s.has_calls() || s.held,
                s.id,
            )
        })
        .collect();
    by_use.sort_by_key(|entry| std::cmp::Reverse(entry.0));
    let idle = |entry: &&(Instant, bool, bool, SessionId)| !entry.2;
    let candidates = by_use.get(n_protected..).unwrap_or(&[]);
    candidates
        .iter()
        .rev()
        .filter(idle)
        .find(|entry| entry.1)
        .or_else(|| candidates.iter().rev().find(idle))
        .or_else(|| by_use.iter().rev().find(idle))
        .map(|entry| entry.3)
}

/// `yield_time_ms` of `exec_command`: default and clamp.
pub const EXEC_YIELD_DEFAULT_MS: u64 = 10_000;
pub const EXEC_YIELD_RANGE_MS: (u64, u64) = (250, 30_000);
/// `yield_time_ms` of `write_stdin` with chars: default and clamp.
pub const WRITE_YIELD_DEFAULT_MS: u64 = 250;
pub const WRITE_YIELD_RANGE_MS: (u64, u64) = (250, 30_000);
/// `yield_time_ms` of an empty `write_stdin` (a poll): clamp.
pub const POLL_YIELD_RANGE_MS: (u64, u64) = (5_000, 300_000);
/// Output a terminal keeps when `output_byte_limit` is not given, and the most it may ask.
pub const DEFAULT_TERMINAL_OUTPUT_BYTES: u64 = 1024 * 1024;
pub const MAX_TERMINAL_OUTPUT_BYTES: u64 = 16 * 1024 * 1024;
/// Default `max_output_tokens`.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u64 = 10_000;

/// The exec engine: a registry of sessions. Create one per daemon with [`Engine::new`].
pub struct Engine {
    config: EngineConfig,
    /// The shell used when a request names none: `bash` when it is installed, else `sh`.
    default_shell: String,
    sessions: Mutex<HashMap<SessionId, Arc<Session>>>,
    /// Logs of finished sessions that a result named, oldest first.
    retained_logs: Mutex<VecDeque<PathBuf>>,
    /// Ids of recently ended sessions, not handed out again soon, so an agent polling an old id
    /// gets "unknown" instead of someone else's session.
    retired_ids: Mutex<VecDeque<SessionId>>,
    /// Ids (and places) reserved by `exec_command` calls that are still spawning. Changed only
    /// while the sessions lock is held, so the registry and the reservations are counted
    /// together and no id is handed to two sessions.
    reserved: Mutex<HashSet<SessionId>>,
    shutting_down: std::sync::atomic::AtomicBool,
    next_log: std::sync::atomic::AtomicU64,
    /// Hears of every session and gets its output live.
    watcher: Option<Arc<dyn Watcher>>,
}

impl Engine {
    pub fn new(config: EngineConfig) -> Arc<Self> {
        Self::build(config, None)
    }

    /// An engine whose sessions are all watched by `watcher` (see [`watch`]).
    pub fn with_watcher(config: EngineConfig, watcher: Arc<dyn Watcher>) -> Arc<Self> {
        Self::build(config, Some(watcher))
    }

    fn build(config: EngineConfig, watcher: Option<Arc<dyn Watcher>>) -> Arc<Self> {
        let default_shell = warren_process::shell::default_shell().program;
        Arc::new(Self {
            config,
            default_shell: default_shell.to_owned(),
            sessions: Mutex::new(HashMap::new()),
            retained_logs: Mutex::new(VecDeque::new()),
            retired_ids: Mutex::new(VecDeque::new()),
            reserved: Mutex::new(HashSet::new()),
            shutting_down: std::sync::atomic::AtomicBool::new(false),
            next_log: std::sync::atomic::AtomicU64::new(1),
            watcher,
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// `exec_command`: starts `args.cmd` and waits up to the yield time for it to finish or to
    /// wait for input. A command still running gets a `session_id` to poll.
    pub async fn exec_command(&self, args: ExecCommandArgs) -> Result<ExecResult, ExecError> {
        let call_start = Instant::now();
        let yield_ms = exec_yield_ms(args.yield_time_ms);
        let max_tokens = args.max_output_tokens.unwrap_or(DEFAULT_MAX_OUTPUT_TOKENS);
        let (session, _call) = self.launch(&args, &[], None, args.cmd.clone())?;
        let deadline = call_start + Duration::from_millis(yield_ms);
        let outcome = session.wait(deadline, call_start, true).await;
        Ok(self.result_of(&session, outcome, max_tokens, call_start))
    }

    /// Validates `args`, spawns the command (with `extra_args` after `cmd`, as `$0 $1...` of
    /// the shell) and lists the new session, with a call already waiting on it so it cannot be
    /// pruned before the caller looks. A `tail_limit` makes a held session (a terminal): its
    /// raw output tail is kept and only `release_terminal` removes it.
    fn launch(
        &self,
        args: &ExecCommandArgs,
        extra_args: &[String],
        tail_limit: Option<usize>,
        command_line: String,
    ) -> Result<(Arc<Session>, CallGuard), ExecError> {
        if self.shutting_down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ExecError::ShuttingDown);
        }
        if args.cmd.trim().is_empty() {
            return Err(ExecError::InvalidArgument("cmd must not be empty".into()));
        }
        check_command_text(args)?;
        let workdir = self.resolve_workdir(args.workdir.as_deref())?;
        let tty = args.tty.unwrap_or(false);
        let shell = args
            .shell
            .clone()
            .unwrap_or_else(|| self.default_shell.clone());
        let login = args.login.unwrap_or(true);
        for (name, value) in &args.env {
            if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
                return Err(ExecError::InvalidArgument(format!(
                    "invalid environment variable name or value for {name:?}"
                )));
            }
        }
        if extra_args.iter().any(|arg| arg.contains('\0')) {
            return Err(ExecError::InvalidArgument(
                "arguments must not contain a NUL byte".into(),
            ));
        }
        if !warren_process::shell::program_exists(&shell) {
            let source =
                std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
            return Err(ExecError::Spawn {
                program: shell,
                source,
            });
        }
        let command = warren_process::CommandSpec::new(&shell, &warren_process::TreeMarker::new())
            .arg(if login { "-lc" } else { "-c" })
            .arg(&args.cmd)
            .args(extra_args)
            .cwd(&workdir)
            .env_policy(warren_process::EnvPolicy::Exec {
                base: self.config.base_env.clone(),
                pass_env: self.config.pass_env.clone(),
                tty,
            });
        let command = args
            .env
            .iter()
            .fold(command, |command, (name, value)| command.env(name, value));

        let slot = self.reserve_slot()?;
        let id = slot.id;
        let log_serial = self
            .next_log
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log_path = self
            .config
            .log_dir
            .join(format!("exec-{log_serial}-{id}.log"));
        let spawned =
            spawn_session(&command, tty, &self.config).map_err(|source| ExecError::Spawn {
                program: shell.clone(),
                source,
            })?;
        let meta = SessionMeta {
            id,
            cmd: args.cmd.clone(),
            command_line,
            workdir: workdir.display().to_string(),
            tty,
            log_path,
            timeout: args.timeout_ms.map(Duration::from_millis),
            tail_limit,
        };
        let session = Session::start(meta, spawned, &self.config, self.watcher.as_deref());
        // The call waits on the session from the moment it is listed: it cannot be pruned.
        let call = session.begin_call();
        self.register(Arc::clone(&session), slot);
        Ok((session, call))
    }

    /// ACP `terminal/create`: starts `create.command` (a shell line, or with `args` a program
    /// and its arguments) on pipes without waiting. The terminal's raw output (its last
    /// `output_byte_limit` bytes) and exit stay readable until [`Engine::release_terminal`];
    /// a terminal is never pruned.
    pub fn start_terminal(&self, create: TerminalCreate) -> Result<TerminalCreated, ExecError> {
        let limit = create
            .output_byte_limit
            .unwrap_or(DEFAULT_TERMINAL_OUTPUT_BYTES)
            .min(MAX_TERMINAL_OUTPUT_BYTES) as usize;
        // A program with arguments runs as `sh -c 'exec "$0" "$@"' program args...`: the same
        // spawn path as every other command, without quoting anything.
        let (cmd, extra) = if create.args.is_empty() {
            (create.command.clone(), Vec::new())
        } else {
            let mut extra = vec![create.command.clone()];
            extra.extend(create.args.iter().cloned());
            ("exec \"$0\" \"$@\"".to_owned(), extra)
        };
        let command_line = std::iter::once(&create.command)
            .chain(&create.args)
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(" ");
        let args = ExecCommandArgs {
            cmd,
            workdir: create.cwd.clone(),
            login: Some(false),
            env: create.env.clone(),
            ..ExecCommandArgs::default()
        };
        let (session, _call) = self.launch(&args, &extra, Some(limit), command_line)?;
        Ok(TerminalCreated {
            terminal_id: session.id.to_string(),
            pid: session.pid,
        })
    }

    /// ACP `terminal/output` (and, with a `wait`, `terminal/wait_for_exit`): the raw output
    /// kept so far and the exit status once the command exited and its output is drained.
    /// Waits up to `wait` for that exit.
    pub async fn terminal_output(
        &self,
        terminal_id: &str,
        wait: Duration,
    ) -> Result<TerminalOutput, ExecError> {
        let (session, _call) = self.get_terminal(terminal_id)?;
        if !wait.is_zero() {
            session
                .wait(Instant::now() + wait, Instant::now(), false)
                .await;
        }
        let state = session.state();
        let (output, truncated) = state
            .tail
            .as_ref()
            .map(|tail| tail.text(state.finished))
            .unwrap_or_default();
        let exit_status = match (state.finished, state.exit) {
            (true, Some(exit)) => Some(TerminalExitStatus {
                exit_code: exit.code.map(|code| code as u32),
                signal: exit.signal.map(signal_name),
            }),
            _ => None,
        };
        Ok(TerminalOutput {
            output,
            truncated,
            exit_status,
        })
    }

    /// ACP `terminal/kill`: kills the command's whole tree; the terminal stays readable.
    pub async fn kill_terminal(&self, terminal_id: &str) -> Result<(), ExecError> {
        let (session, _call) = self.get_terminal(terminal_id)?;
        session.kill().await;
        Ok(())
    }

    /// ACP `terminal/release`: kills the command if it still runs and forgets the terminal.
    pub async fn release_terminal(&self, terminal_id: &str) -> Result<(), ExecError> {
        let (session, call) = self.get_terminal(terminal_id)?;
        if session.state().exit.is_none() {
            session.kill().await;
        }
        drop(call);
        session.state().log_named = false;
        self.remove(session.id);
        Ok(())
    }

    /// The terminals (held sessions) that exist.
    pub fn list_terminals(&self) -> TerminalList {
        let mut terminals: Vec<TerminalInfo> = self
            .lock_sessions()
            .values()
            .filter(|s| s.held)
            .map(|s| TerminalInfo {
                terminal_id: s.id.to_string(),
                command: s.cmd.clone(),
                pid: s.pid,
                running: s.state().exit.is_none(),
            })
            .collect();
        terminals.sort_by(|a, b| a.terminal_id.cmp(&b.terminal_id));
        TerminalList { terminals }
    }

    fn get_terminal(&self, terminal_id: &str) -> Result<(Arc<Session>, CallGuard), ExecError> {
        let unknown = || ExecError::UnknownTerminal(terminal_id.to_owned());
        let id: SessionId = terminal_id.parse().map_err(|_| unknown())?;
        let sessions = self.lock_sessions();
        let session = sessions
            .get(&id)
            .filter(|s| s.held)
            .cloned()
            .ok_or_else(unknown)?;
        let call = session.begin_call();
        Ok((session, call))
    }

    /// `write_stdin`: writes `chars` (if any) to a session and waits for output, exit or a
    /// prompt. Unknown ids are [`ExecError::UnknownSession`].
    pub async fn write_stdin(&self, args: WriteStdinArgs) -> Result<ExecResult, ExecError> {
        let call_start = Instant::now();
        let (session, _call) = self.get_for_call(args.session_id)?;
        session.touch();
        let max_tokens = args.max_output_tokens.unwrap_or(DEFAULT_MAX_OUTPUT_TOKENS);
        let yield_ms = write_yield_ms(args.yield_time_ms, args.chars.is_empty());
        let mut note = None;
        if !args.chars.is_empty() {
            let exited = session.state().exit.is_some();
            if !exited && let Err(e) = session.write_input(&args.chars).await {
                note = Some(format!("[{e}]\n"));
            }
        }
        let deadline = call_start + Duration::from_millis(yield_ms);
        let outcome = session.wait(deadline, Instant::now(), true).await;
        let mut result = self.result_of(&session, outcome, max_tokens, call_start);
        if let Some(note) = note {
            result.output.push_str(&note);
            result.text = render_text(&result);
        }
        Ok(result)
    }

    /// `list_sessions`: every live session and every exited one whose output was not read yet.
    pub async fn list_sessions(&self) -> SessionList {
        let sessions: Vec<Arc<Session>> = self
            .lock_sessions()
            .values()
            .filter(|s| !s.held)
            .cloned()
            .collect();
        let mut infos = Vec::with_capacity(sessions.len());
        for session in sessions {
            let (finished, exit, timed_out, idle, unread, quiet) = {
                let state = session.state();
                let now = Instant::now();
                (
                    state.finished,
                    state.exit,
                    state.timed_out,
                    now.duration_since(state.last_used.max(state.last_output)),
                    state.capture.len(),
                    now.duration_since(state.last_output) >= self.config.input_quiet,
                )
            };
            let status = if finished || exit.is_some() {
                ExecStatus::Exited
            } else if quiet && session.awaits_input().await {
                ExecStatus::AwaitingInput
            } else {
                ExecStatus::Running
            };
            infos.push(SessionInfo {
                session_id: session.id,
                cmd: session.cmd.clone(),
                workdir: session.workdir.clone(),
                tty: session.tty,
                status,
                exit_code: exit.map(|e| if timed_out { 124 } else { e.shell_code() }),
                pid: session.pid,
                started_at: session
                    .started_at
                    .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                idle_ms: idle.as_millis() as u64,
                unread_bytes: unread,
            });
        }
        infos.sort_by_key(|info| info.session_id);
        SessionList { sessions: infos }
    }

    /// `kill_session`: kills the session's whole process tree and returns its final output and
    /// exit code. The id is unknown afterwards.
    pub async fn kill_session(&self, session_id: SessionId) -> Result<ExecResult, ExecError> {
        let call_start = Instant::now();
        let session = self.get(session_id)?;
        session.kill().await;
        // The tree is dead; the waiter records the exit and drains (bounded) right after.
        let deadline = Instant::now() + warren_process::stop::DRAIN_MAX + Duration::from_secs(5);
        let outcome = session.wait(deadline, call_start, false).await;
        if outcome != WaitOutcome::Finished {
            tracing::warn!(
                session = session_id,
                "killed session did not finish in time"
            );
            session.stop_tasks();
        }
        let mut result = self.result_of(
            &session,
            WaitOutcome::Finished,
            DEFAULT_MAX_OUTPUT_TOKENS,
            call_start,
        );
        if result.exit_code.is_none() {
            result.exit_code = Some(-1);
        }
        self.remove(session_id);
        result.text = render_text(&result);
        Ok(result)
    }

    /// Kills every session's process tree and deletes all session logs. New commands are
    /// refused from now on.
    pub async fn shutdown(&self) {
        self.shutting_down
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let sessions: Vec<Arc<Session>> = self.lock_sessions().drain().map(|(_, s)| s).collect();
        let mut kills = tokio::task::JoinSet::new();
        for session in sessions {
            kills.spawn(async move {
                session.kill().await;
                session.stop_tasks();
                let _ = std::fs::remove_file(&session.log_path);
            });
        }
        while kills.join_next().await.is_some() {}
        for path in lock(&self.retained_logs).drain(..) {
            let _ = std::fs::remove_file(path);
        }
        let _ = std::fs::remove_dir(&self.config.log_dir);
    }

    /// The session and a guard that keeps it from being pruned while the call waits on it.
    /// The guard is taken under the registry lock, so a prune cannot slip in between.
    fn get_for_call(&self, id: SessionId) -> Result<(Arc<Session>, CallGuard), ExecError> {
        let sessions = self.lock_sessions();
        let session = sessions
            .get(&id)
            .cloned()
            .ok_or(ExecError::UnknownSession(id))?;
        let call = session.begin_call();
        Ok((session, call))
    }

    /// An exec session (never a terminal: those answer only to the terminal calls).
    fn get(&self, id: SessionId) -> Result<Arc<Session>, ExecError> {
        self.lock_sessions()
            .get(&id)
            .filter(|s| !s.held)
            .cloned()
            .ok_or(ExecError::UnknownSession(id))
    }

    fn lock_sessions(&self) -> MutexGuard<'_, HashMap<SessionId, Arc<Session>>> {
        lock(&self.sessions)
    }

    fn resolve_workdir(&self, workdir: Option<&str>) -> Result<PathBuf, ExecError> {
        let path = match workdir {
            None | Some("") => self.config.default_workdir.clone(),
            Some(dir) => self.config.default_workdir.join(dir),
        };
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_dir() => Ok(path),
            Ok(_) => Err(ExecError::InvalidWorkdir {
                path,
                reason: "not a directory".into(),
            }),
            Err(e) => Err(ExecError::InvalidWorkdir {
                path,
                reason: e.to_string(),
            }),
        }
    }

    /// A fresh id: not listed, not reserved by a call still spawning, not recently retired.
    /// The caller holds the sessions lock and reserves the id before releasing it.
    fn allocate_id(
        &self,
        sessions: &HashMap<SessionId, Arc<Session>>,
        reserved: &HashSet<SessionId>,
    ) -> SessionId {
        let retired = lock(&self.retired_ids);
        loop {
            let id: SessionId = rand::random_range(1000..100_000);
            if !sessions.contains_key(&id) && !reserved.contains(&id) && !retired.contains(&id) {
                return id;
            }
        }
    }

    /// Reserves a place for one more session, pruning first when the registry is full: keep
    /// the `n_protected_recent` most recently used; among the rest remove the least recently
    /// used exited session, else the least recently used running one (its tree is killed).
    /// A session some call is waiting on (`exec_command` or `write_stdin` in flight) is never
    /// pruned: when every session is in use, the new call gets [`ExecError::TooManySessions`]
    /// instead of killing another caller's command.
    fn reserve_slot(&self) -> Result<SlotReservation<'_>, ExecError> {
        let max_sessions = self.config.max_sessions.max(1);
        let mut pruned = Vec::new();
        let reserved = {
            let mut sessions = self.lock_sessions();
            loop {
                let mut reserved = lock(&self.reserved);
                if sessions.len() + reserved.len() < max_sessions {
                    let id = self.allocate_id(&sessions, &reserved);
                    reserved.insert(id);
                    break Some(id);
                }
                drop(reserved);
                let Some(victim) = prune_victim(&sessions, self.config.n_protected_recent) else {
                    break None;
                };
                if let Some(removed) = sessions.remove(&victim) {
                    self.retire_id(victim);
                    pruned.push(removed);
                }
            }
        };
        for victim in pruned {
            tracing::info!(session = victim.id, cmd = %victim.cmd, "pruning exec session");
            tokio::spawn(async move {
                victim.kill().await;
                victim.stop_tasks();
                let _ = std::fs::remove_file(&victim.log_path);
            });
        }
        match reserved {
            Some(id) => Ok(SlotReservation {
                engine: self,
                id,
                armed: true,
            }),
            None => Err(ExecError::TooManySessions(max_sessions)),
        }
    }

    /// Adds a session in the place `slot` reserved.
    fn register(&self, session: Arc<Session>, mut slot: SlotReservation<'_>) {
        let mut sessions = self.lock_sessions();
        let replaced = sessions.insert(session.id, session);
        debug_assert!(
            replaced.is_none(),
            "a reserved id belongs to no other session"
        );
        self.release_reservation(&mut slot);
    }

    /// Gives a reservation's place back; the caller holds the sessions lock or takes it here.
    fn release_reservation(&self, slot: &mut SlotReservation<'_>) {
        if std::mem::take(&mut slot.armed) {
            lock(&self.reserved).remove(&slot.id);
        }
    }

    fn retire_id(&self, id: SessionId) {
        const N_RETIRED_IDS: usize = 1024;
        let mut retired = lock(&self.retired_ids);
        if retired.len() >= N_RETIRED_IDS {
            retired.pop_front();
        }
        retired.push_back(id);
    }

    /// Forgets a finished session. Its log is kept (bounded) when a result named it, so the
    /// `output_file` an agent was given stays readable; otherwise it is deleted now.
    fn remove(&self, id: SessionId) {
        let Some(session) = self.lock_sessions().remove(&id) else {
            return;
        };
        self.retire_id(id);
        session.stop_tasks();
        if session.state().log_named {
            let mut retained = lock(&self.retained_logs);
            retained.push_back(session.log_path.clone());
            while retained.len() > self.config.n_retained_logs {
                if let Some(old) = retained.pop_front() {
                    let _ = std::fs::remove_file(old);
                }
            }
        } else {
            let _ = std::fs::remove_file(&session.log_path);
        }
    }

    /// Takes the unread output and builds the result; a finished session is removed.
    fn result_of(
        &self,
        session: &Arc<Session>,
        outcome: WaitOutcome,
        max_tokens: u64,
        call_start: Instant,
    ) -> ExecResult {
        let options = RenderOptions {
            max_output_tokens: max_tokens,
            rows: self.config.tty_rows,
            cols: self.config.tty_cols,
        };
        let (captured, exit, timed_out, log_bytes, log_capped) = {
            let mut state = session.state();
            state.last_used = Instant::now();
            let finished = outcome == WaitOutcome::Finished;
            let captured = state.capture.take(!finished);
            (
                captured,
                state.exit,
                state.timed_out,
                state.log_bytes,
                state.log_capped,
            )
        };
        let rendered = warren_output::render_chunk(&captured, options);
        let mut output = rendered.text;
        let mut output_file = None;
        if rendered.truncated && !session.has_log {
            output.push_str(
                "[the full output is not available: its log file could not be created]\n",
            );
        }
        if rendered.truncated && session.has_log {
            let path = session.log_path.display().to_string();
            let extent = if log_capped {
                format!("its first {log_bytes} bytes")
            } else {
                format!("{log_bytes} bytes so far")
            };
            if !output.ends_with('\n') && !output.is_empty() {
                output.push('\n');
            }
            output.push_str(&format!(
                "[full output of this session in {path} ({extent}); read a range with \
                 `sed -n '1,200p' {path}` or `tail -c 20000 {path}`]\n"
            ));
            session.state().log_named = true;
            output_file = Some(path);
        }
        let finished = outcome == WaitOutcome::Finished;
        if finished && timed_out {
            let ms = session.timeout.map(|t| t.as_millis()).unwrap_or(0);
            output.push_str(&format!(
                "[command timed out after {ms} ms; process tree killed]\n"
            ));
        }
        let (status, exit_code, signal, session_id) = match outcome {
            WaitOutcome::Finished => {
                let exit = exit.unwrap_or(session::ExitInfo {
                    code: None,
                    signal: None,
                });
                let code = if timed_out { 124 } else { exit.shell_code() };
                (
                    ExecStatus::Exited,
                    Some(code),
                    exit.signal.map(signal_name),
                    None,
                )
            }
            WaitOutcome::AwaitingInput => (ExecStatus::AwaitingInput, None, None, Some(session.id)),
            WaitOutcome::YieldExpired => (ExecStatus::Running, None, None, Some(session.id)),
        };
        let mut result = ExecResult {
            chunk_id: chunk_id(),
            wall_time_seconds: call_start.elapsed().as_secs_f64(),
            status,
            exit_code,
            signal,
            session_id,
            original_token_count: rendered.original_token_count,
            output,
            output_file,
            text: String::new(),
        };
        result.text = render_text(&result);
        if finished {
            self.remove(session.id);
        }
        result
    }
}

/// Linux refuses a single argument longer than this (`MAX_ARG_STRLEN`), and `cmd` is one.
pub const MAX_CMD_BYTES: usize = 128 * 1024;

/// Refuses what the kernel would refuse at exec time with an unhelpful error: a NUL byte in
/// `cmd`, `workdir` or `shell`, and a `cmd` longer than [`MAX_CMD_BYTES`].
fn check_command_text(args: &ExecCommandArgs) -> Result<(), ExecError> {
    let fields = [
        ("cmd", Some(args.cmd.as_str())),
        ("workdir", args.workdir.as_deref()),
        ("shell", args.shell.as_deref()),
    ];
    for (name, value) in fields {
        if value.is_some_and(|v| v.contains('\0')) {
            return Err(ExecError::InvalidArgument(format!(
                "{name} must not contain a NUL byte"
            )));
        }
    }
    if args.cmd.len() > MAX_CMD_BYTES {
        return Err(ExecError::InvalidArgument(format!(
            "cmd is {} bytes; the limit is {MAX_CMD_BYTES} (write long scripts to a file and run that)",
            args.cmd.len()
        )));
    }
    Ok(())
}

fn clamp(value: u64, (low, high): (u64, u64)) -> u64 {
    value.clamp(low, high)
}

/// The yield of an `exec_command` call asking for `requested` ms.
fn exec_yield_ms(requested: Option<u64>) -> u64 {
    clamp(
        requested.unwrap_or(EXEC_YIELD_DEFAULT_MS),
        EXEC_YIELD_RANGE_MS,
    )
}

/// The yield of a `write_stdin` call asking for `requested` ms. An empty write is a poll:
/// agents poll long-running commands, so its yield is longer.
fn write_yield_ms(requested: Option<u64>, is_poll: bool) -> u64 {
    if is_poll {
        clamp(
            requested.unwrap_or(POLL_YIELD_RANGE_MS.0),
            POLL_YIELD_RANGE_MS,
        )
    } else {
        clamp(
            requested.unwrap_or(WRITE_YIELD_DEFAULT_MS),
            WRITE_YIELD_RANGE_MS,
        )
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Registry updates are single inserts and removes; a poisoned lock is still consistent.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn chunk_id() -> String {
    format!("{:06x}", rand::random_range(0..0x100_0000u32))
}

/// The name of a Linux signal (`SIGTERM`), or `SIG<n>` for real-time and unknown ones.
fn signal_name(signal: i32) -> String {
    const NAMES: [&str; 31] = [
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    usize::try_from(signal)
        .ok()
        .and_then(|n| n.checked_sub(1))
        .and_then(|i| NAMES.get(i))
        .map_or_else(|| format!("SIG{signal}"), |name| (*name).to_owned())
}

/// Starts `command` on a PTY of the configured size (`tty`) or on pipes (stdin a pipe, output
/// merged, its own session), and hands the engine what its session tasks need.
fn spawn_session(
    command: &warren_process::CommandSpec,
    tty: bool,
    config: &EngineConfig,
) -> std::io::Result<Spawned> {
    use warren_process::pipes::{Leader, OutputMode, PipeOptions, StdinMode};
    use warren_process::{Connect, pty::PtySize};
    let connect = if tty {
        Connect::Pty(PtySize {
            rows: config.tty_rows,
            cols: config.tty_cols,
        })
    } else {
        Connect::Pipes(PipeOptions {
            stdin: StdinMode::Pipe,
            output: OutputMode::Merged,
            leader: Leader::Session,
        })
    };
    Ok(match warren_process::spawn(command, connect)? {
        warren_process::Spawned::Pty(child) => {
            let pid = child.child.pid();
            let mut process = child.child;
            let control = Arc::new(child.control);
            let probe = Arc::clone(&control);
            Spawned {
                pid,
                tree: child.tree,
                output: Box::new(child.reader),
                stdin: Some(Box::new(child.writer)),
                pending_output: Box::new(move || probe.pending_output().unwrap_or(0)),
                control: Some(control),
                wait: Box::pin(async move { process.wait().await }),
            }
        }
        warren_process::Spawned::Pipes(child) => {
            let pid = child.pid();
            let probe =
                rustix::io::fcntl_dupfd_cloexec(std::os::fd::AsFd::as_fd(&child.stdout), 0)?;
            let mut process = child.child;
            Spawned {
                pid,
                tree: child.tree,
                output: Box::new(child.stdout),
                stdin: child.stdin.map(|s| Box::new(s) as session::BoxedWriter),
                pending_output: Box::new(move || rustix::io::ioctl_fionread(&probe).unwrap_or(0)),
                control: None,
                wait: Box::pin(async move { process.wait().await }),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: ids were drawn before the session was listed, so two calls spawning at once
    /// could get the same one; the second listing replaced the first session, and the first
    /// call's end then removed (and stopped the reader of) the second: its output was lost.
    #[test]
    fn an_id_reserved_by_a_call_still_spawning_is_never_handed_out_again() {
        let engine = Engine::new(EngineConfig::default());
        let mut reserved: HashSet<SessionId> = (1000..100_000).collect();
        reserved.remove(&4242);
        let sessions = HashMap::new();
        assert_eq!(engine.allocate_id(&sessions, &reserved), 4242);
        let first = engine.reserve_slot().expect("a place");
        let second = engine.reserve_slot().expect("a place");
        assert_ne!(first.id, second.id);
        assert_eq!(lock(&engine.reserved).len(), 2);
        drop(first);
        assert_eq!(*lock(&engine.reserved), HashSet::from([second.id]));
    }

    #[test]
    fn yields_default_and_clamp_as_the_spec_says() {
        let exec_table = [
            (None, 10_000),
            (Some(0), 250),
            (Some(249), 250),
            (Some(1_000), 1_000),
            (Some(30_000), 30_000),
            (Some(u64::MAX), 30_000),
        ];
        for (requested, expected) in exec_table {
            assert_eq!(exec_yield_ms(requested), expected, "exec {requested:?}");
        }
        let write_table = [
            (None, false, 250),
            (Some(0), false, 250),
            (Some(2_000), false, 2_000),
            (Some(60_000), false, 30_000),
            (None, true, 5_000),
            (Some(250), true, 5_000),
            (Some(60_000), true, 60_000),
            (Some(1_000_000), true, 300_000),
        ];
        for (requested, is_poll, expected) in write_table {
            assert_eq!(
                write_yield_ms(requested, is_poll),
                expected,
                "write {requested:?} poll {is_poll}"
            );
        }
    }

    #[test]
    fn signal_names_are_linuxs() {
        let table = [
            (1, "SIGHUP"),
            (2, "SIGINT"),
            (9, "SIGKILL"),
            (15, "SIGTERM"),
            (31, "SIGSYS"),
            (34, "SIG34"),
            (0, "SIG0"),
            (-3, "SIG-3"),
        ];
        for (signal, name) in table {
            assert_eq!(signal_name(signal), name);
        }
    }

    #[test]
    fn config_defaults_are_the_specs() {
        let config = EngineConfig::default();
        assert_eq!(DEFAULT_MAX_OUTPUT_TOKENS, 10_000);
        assert_eq!(
            (config.max_sessions, config.n_protected_recent),
            (64, 8),
            "64 live sessions, the 8 most recently used never pruned"
        );
        assert_eq!(config.capture_bytes, 1024 * 1024);
        assert_eq!(config.max_log_bytes, 64 * 1024 * 1024);
        assert_eq!(config.kill_grace, Duration::from_secs(2));
        assert_eq!(
            warren_process::stop::DRAIN_MAX,
            Duration::from_secs(2),
            "output is drained at most 2 s after the exit"
        );
        assert_eq!(config.input_quiet, Duration::from_millis(300));
        assert_eq!((config.tty_rows, config.tty_cols), (24, 80));
    }
}
