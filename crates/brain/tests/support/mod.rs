//! Test helpers: a [`LocalHost`] serving files and terminals from a temp dir with real
//! processes, a [`RecordingSink`] that records updates and hands permission requests to the test,
//! and ways to start agents and run turns. Every wait is `warren_test_support::within` (with a
//! timeout naming what was expected).

// Tests start real programs (shells, servers, the binary under test) directly.
#![allow(clippy::disallowed_methods)]
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, oneshot, watch};
use warren_brain::{
    AgentCommand, BoxFuture, BrainError, BrainSession, Host, HostError, PermissionOutcome, Resumed,
    TerminalExit, TerminalOutput, TerminalSpec, TurnSink, Worker,
};
use warren_test_support::{python, repo_root, within};

pub fn test_agent(args: &[&str]) -> AgentCommand {
    AgentCommand {
        env: Vec::new(),
        program: env!("CARGO_BIN_EXE_warren-test-agent").to_owned(),
        args: args.iter().map(|a| (*a).to_owned()).collect(),
    }
}

/// Spawns `command`, creates a session in a fresh temp workspace, and returns it with its sink
/// and host.
pub async fn spawn_session(
    command: AgentCommand,
) -> (BrainSession, Arc<RecordingSink>, Arc<LocalHost>) {
    let worker = within("the agent to start and initialize", Worker::spawn(&command))
        .await
        .expect("spawn worker");
    let host = LocalHost::new();
    let sink = RecordingSink::new();
    let session = within(
        "session/new",
        worker.new_session(host.root().to_owned(), vec![], host.clone(), sink.clone()),
    )
    .await
    .expect("new session");
    (session, sink, host)
}

/// Prompts `text` and returns the turn's stop reason, failing the test on an error.
pub async fn prompt(session: &BrainSession, what: &str, text: &str) -> String {
    within(what, session.prompt(text.to_owned()))
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Runs a turn in the background so the test can answer or cancel it meanwhile.
pub fn start_turn(
    session: &Arc<BrainSession>,
    text: &str,
) -> tokio::task::JoinHandle<Result<String, BrainError>> {
    let session = Arc::clone(session);
    let text = text.to_owned();
    tokio::spawn(async move { session.prompt(text).await })
}

/// Waits for a turn started with [`start_turn`] and returns its stop reason.
pub async fn finish_turn(
    what: &str,
    turn: tokio::task::JoinHandle<Result<String, BrainError>>,
) -> String {
    within(what, turn)
        .await
        .expect("the turn task does not panic")
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Closes `session`, then asks a new worker of `command` to resume its ACP session with the same
/// host. Returns the old ACP session id, the new session and how it was resumed.
pub async fn resume_in_new_worker(
    session: BrainSession,
    command: &AgentCommand,
    host: &Arc<LocalHost>,
    sink: Arc<RecordingSink>,
) -> (String, BrainSession, Resumed) {
    let acp_session_id = session.acp_session_id().to_owned();
    session.close().await;
    let worker = within("the new worker to start", Worker::spawn(command))
        .await
        .expect("worker");
    let (session, resumed) = within(
        "the resumed session",
        worker.resume_session(
            acp_session_id.clone(),
            host.root().to_owned(),
            vec![],
            host.clone(),
            sink,
        ),
    )
    .await
    .expect("resume_session");
    (acp_session_id, session, resumed)
}

/// The Python test agent built on the PyPI ACP package.
pub fn python_agent() -> AgentCommand {
    let script = repo_root().join("tests/python/acp_echo_agent.py");
    AgentCommand {
        env: Vec::new(),
        program: python().display().to_string(),
        args: vec![script.display().to_string()],
    }
}

pub struct PendingPermission {
    pub tool_call: Value,
    pub options: Value,
    answer: oneshot::Sender<PermissionOutcome>,
}

impl PendingPermission {
    pub fn answer(self, outcome: PermissionOutcome) {
        let _ = self.answer.send(outcome);
    }

    /// Resolves when the brain stopped waiting for this answer.
    pub async fn answer_dropped(mut self) {
        self.answer.closed().await;
    }
}

pub struct RecordingSink {
    updates: Mutex<Vec<Value>>,
    n_updates: watch::Sender<usize>,
    permissions_tx: mpsc::UnboundedSender<PendingPermission>,
    permissions_rx: tokio::sync::Mutex<mpsc::UnboundedReceiver<PendingPermission>>,
}

impl RecordingSink {
    pub fn new() -> Arc<Self> {
        let (permissions_tx, permissions_rx) = mpsc::unbounded_channel();
        Arc::new(Self {
            updates: Mutex::new(Vec::new()),
            n_updates: watch::channel(0).0,
            permissions_tx,
            permissions_rx: tokio::sync::Mutex::new(permissions_rx),
        })
    }

    pub fn updates(&self) -> Vec<Value> {
        self.updates.lock().expect("updates lock").clone()
    }

    pub fn update_kinds(&self) -> Vec<String> {
        self.updates()
            .iter()
            .filter_map(|u| u["sessionUpdate"].as_str().map(str::to_owned))
            .collect()
    }

    pub fn last_of_kind(&self, kind: &str) -> Option<Value> {
        self.updates()
            .into_iter()
            .rev()
            .find(|u| u["sessionUpdate"] == kind)
    }

    pub fn n_message_chunks(&self) -> usize {
        self.update_kinds()
            .iter()
            .filter(|k| *k == "agent_message_chunk")
            .count()
    }

    pub fn agent_text(&self) -> String {
        self.updates()
            .iter()
            .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
            .filter_map(|u| u["content"]["text"].as_str().map(str::to_owned))
            .collect()
    }

    pub async fn wait_for_text(&self, needle: &str) {
        let mut n_updates = self.n_updates.subscribe();
        while !self.agent_text().contains(needle) {
            if n_updates.changed().await.is_err() {
                return;
            }
        }
    }

    pub async fn next_permission(&self) -> PendingPermission {
        within("a permission request", async {
            self.permissions_rx.lock().await.recv().await
        })
        .await
        .expect("sink alive")
    }
}

impl TurnSink for RecordingSink {
    fn update(&self, update: Value) {
        let n = {
            let mut updates = self.updates.lock().expect("updates lock");
            updates.push(update);
            updates.len()
        };
        self.n_updates.send_replace(n);
    }

    fn request_permission(
        &self,
        tool_call: Value,
        options: Value,
    ) -> BoxFuture<'static, PermissionOutcome> {
        let (answer, answered) = oneshot::channel();
        let _ = self.permissions_tx.send(PendingPermission {
            tool_call,
            options,
            answer,
        });
        Box::pin(async move { answered.await.unwrap_or(PermissionOutcome::Cancelled) })
    }
}

struct LocalTerminal {
    output: Arc<Mutex<String>>,
    exit: watch::Receiver<Option<TerminalExit>>,
    pid: u32,
}

/// Files and terminals on the local machine, in a temp dir.
pub struct LocalHost {
    root: tempfile::TempDir,
    terminals: Mutex<HashMap<String, LocalTerminal>>,
    n_terminals: std::sync::atomic::AtomicU64,
}

impl LocalHost {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            root: tempfile::tempdir().expect("temp dir"),
            terminals: Mutex::new(HashMap::new()),
            n_terminals: std::sync::atomic::AtomicU64::new(0),
        })
    }

    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// Resolves once every terminal created so far has exited.
    pub async fn wait_no_running_terminals(&self) {
        let exits: Vec<_> = self
            .terminals
            .lock()
            .expect("lock")
            .values()
            .map(|t| t.exit.clone())
            .collect();
        for mut exit in exits {
            // An error means the waiter task is gone, which only happens after it sent the exit.
            let _ = exit.wait_for(Option::is_some).await;
        }
    }

    fn with_terminal<T>(
        &self,
        id: &str,
        f: impl FnOnce(&LocalTerminal) -> T,
    ) -> Result<T, HostError> {
        let terminals = self.terminals.lock().expect("lock");
        terminals
            .get(id)
            .map(f)
            .ok_or_else(|| HostError::NotFound(id.to_owned()))
    }
}

impl Host for LocalHost {
    fn read_text_file(
        &self,
        path: PathBuf,
        line: Option<u32>,
        limit: Option<u32>,
    ) -> BoxFuture<'_, Result<String, HostError>> {
        Box::pin(async move {
            let text = tokio::fs::read_to_string(&path)
                .await
                .map_err(|e| HostError::NotFound(e.to_string()))?;
            Ok(warren_brain::select_lines(&text, line, limit))
        })
    }

    fn write_text_file(
        &self,
        path: PathBuf,
        content: String,
    ) -> BoxFuture<'_, Result<(), HostError>> {
        Box::pin(async move {
            tokio::fs::write(&path, content)
                .await
                .map_err(|e| HostError::Failed(e.to_string()))
        })
    }

    fn create_terminal(&self, spec: TerminalSpec) -> BoxFuture<'_, Result<String, HostError>> {
        Box::pin(async move {
            let mut command = tokio::process::Command::new(&spec.command);
            command
                .args(&spec.args)
                .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .current_dir(spec.cwd.unwrap_or_else(|| self.root().to_owned()))
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .process_group(0);
            let mut child = command
                .spawn()
                .map_err(|e| HostError::Failed(e.to_string()))?;
            let pid = child.id().expect("pid of a just spawned child");
            let output = Arc::new(Mutex::new(String::new()));
            let mut readers = Vec::new();
            for mut pipe in [
                Box::new(child.stdout.take().expect("stdout"))
                    as Box<dyn tokio::io::AsyncRead + Send + Unpin>,
                Box::new(child.stderr.take().expect("stderr")),
            ] {
                let output = output.clone();
                readers.push(tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = pipe.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        output
                            .lock()
                            .expect("lock")
                            .push_str(&String::from_utf8_lossy(&buf[..n]));
                    }
                }));
            }
            let (exit_tx, exit_rx) = watch::channel(None);
            tokio::spawn(async move {
                let status = child.wait().await.expect("wait");
                for reader in readers {
                    let _ = reader.await;
                }
                use std::os::unix::process::ExitStatusExt;
                let exit = TerminalExit {
                    exit_code: status.code().map(|c| c as u32),
                    signal: status.signal().map(|s| s.to_string()),
                };
                let _ = exit_tx.send(Some(exit));
            });
            let id = format!(
                "t{}",
                self.n_terminals
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            );
            self.terminals.lock().expect("lock").insert(
                id.clone(),
                LocalTerminal {
                    output,
                    exit: exit_rx,
                    pid,
                },
            );
            Ok(id)
        })
    }

    fn terminal_output(
        &self,
        terminal_id: String,
    ) -> BoxFuture<'_, Result<TerminalOutput, HostError>> {
        Box::pin(async move {
            self.with_terminal(&terminal_id, |t| TerminalOutput {
                output: t.output.lock().expect("lock").clone(),
                truncated: false,
                exit: t.exit.borrow().clone(),
            })
        })
    }

    fn wait_for_terminal_exit(
        &self,
        terminal_id: String,
    ) -> BoxFuture<'_, Result<TerminalExit, HostError>> {
        Box::pin(async move {
            let mut exit = self.with_terminal(&terminal_id, |t| t.exit.clone())?;
            let exit = exit
                .wait_for(Option::is_some)
                .await
                .map_err(|e| HostError::Failed(e.to_string()))?;
            Ok(exit.clone().unwrap_or_default())
        })
    }

    fn kill_terminal(&self, terminal_id: String) -> BoxFuture<'_, Result<(), HostError>> {
        Box::pin(async move {
            let pid = self.with_terminal(&terminal_id, |t| t.pid)?;
            let tree = warren_process::TreeId::new(pid as i32, None);
            let _ = tokio::task::spawn_blocking(move || {
                warren_process::kill_tree_blocking(&tree, Duration::from_secs(1))
            })
            .await;
            Ok(())
        })
    }

    fn release_terminal(&self, terminal_id: String) -> BoxFuture<'_, Result<(), HostError>> {
        Box::pin(async move {
            self.kill_terminal(terminal_id.clone()).await?;
            Ok(())
        })
    }
}
