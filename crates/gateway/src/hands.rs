//! Hands: a session's sandbox, a `warren execd` with the session workspace as `--root`, and the
//! [`warren_brain::Host`] that serves the agent's `fs/*` and `terminal/*` requests from it over
//! HTTP (files through the OpenSandbox-compatible `/files/download` and `/files/upload`,
//! terminals through the streaming `POST /command`).
//!
//! [`Hands`] starts its execd lazily on first use ([`Hands::endpoint`]) through a
//! [`HandsProvider`]; [`LocalHands`] (the default) runs `<warren> execd --listen 127.0.0.1:0
//! --root <workspace>` as a child in its own process group, with a random access token in
//! `EXECD_ACCESS_TOKEN`, reads the bound address from execd's first stdout line, and kills the
//! whole process tree on [`Hands::stop`]. Pause, archive, snapshots and bwrap are deliberately
//! absent: they are further providers or wrappers behind the same trait.
//!
//! Paths: the agent sees the workspace at its real absolute path (the `cwd` of `session/new`);
//! paths are checked to lie inside the workspace before anything is sent to execd.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::AsyncBufReadExt;
use tokio::sync::watch;
use warren_brain::{
    BoxFuture, Host, HostError, McpServerSpec, TerminalExit, TerminalOutput, TerminalSpec,
    select_lines,
};
use warren_process::{Registered, TreeId, TreeRegistry};

/// How long a starting execd may take to print its address.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// SIGTERM grace when stopping hands.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// Bound on one file transfer or kill request to execd.
const FILE_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// Output kept per terminal when the agent names no limit.
const DEFAULT_OUTPUT_LIMIT: u64 = 1024 * 1024;

/// Where a running hands' execd answers, and the token it requires.
#[derive(Clone, PartialEq, Eq)]
pub struct HandsEndpoint {
    /// `http://127.0.0.1:PORT`, no trailing slash.
    pub url: String,
    /// Sent as `X-EXECD-ACCESS-TOKEN`. Never logged.
    pub token: String,
}

impl std::fmt::Debug for HandsEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandsEndpoint")
            .field("url", &self.url)
            .field("token", &"<redacted>")
            .finish()
    }
}

/// Why hands could not be started or used.
#[derive(Debug, thiserror::Error)]
pub enum HandsError {
    #[error("cannot start hands: {0}")]
    Start(String),
    #[error("hands are stopped")]
    Stopped,
}

/// One running sandbox.
pub trait HandsInstance: Send + Sync {
    fn endpoint(&self) -> &HandsEndpoint;
    /// False once the sandbox died (the next use starts a new one).
    fn is_alive(&self) -> bool;
    /// Stops every process of the sandbox.
    fn stop(self: Box<Self>) -> BoxFuture<'static, ()>;
}

/// Creates sandboxes for workspaces. Local processes today; paused, archived, bwrap'd or remote
/// hands are further implementations.
pub trait HandsProvider: Send + Sync + 'static {
    fn start(
        &self,
        workspace: PathBuf,
    ) -> BoxFuture<'_, Result<Box<dyn HandsInstance>, HandsError>>;
}

/// Runs `<execd_program> execd` as a local child process per sandbox.
#[derive(Debug, Clone)]
pub struct LocalHands {
    execd_program: PathBuf,
    /// Where each execd's tree is listed while it runs, if anywhere.
    registry: Option<Arc<TreeRegistry>>,
}

impl LocalHands {
    /// `execd_program` is the `warren` binary (its `execd` subcommand is used).
    pub fn new(execd_program: impl Into<PathBuf>) -> Self {
        Self {
            execd_program: execd_program.into(),
            registry: None,
        }
    }

    /// Lists each execd's process tree in `registry` from before it starts until it is stopped,
    /// so a gateway restarted after a crash can stop the hands this one leaves behind.
    pub fn registered_in(mut self, registry: Arc<TreeRegistry>) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Uses the running executable (the normal case: the gateway is `warren`).
    pub fn from_current_exe() -> std::io::Result<Self> {
        Ok(Self::new(std::env::current_exe()?))
    }
}

struct LocalInstance {
    endpoint: HandsEndpoint,
    tree: TreeId,
    /// The tree's registry entry, dropped once the tree is killed.
    registered: Option<Registered>,
    exit: watch::Receiver<Option<String>>,
    /// Set by `stop`; otherwise dropping the instance kills the sandbox.
    stopped: std::sync::atomic::AtomicBool,
}

impl Drop for LocalInstance {
    fn drop(&mut self) {
        // Hands dropped without `stop` (an error path, a session dropped by mistake) must not
        // leave an execd and its commands running.
        if self.stopped.load(std::sync::atomic::Ordering::SeqCst) || !self.is_alive() {
            return;
        }
        let tree = self.tree.clone();
        let registered = self.registered.take();
        std::thread::spawn(move || {
            warren_process::kill_tree(&tree, STOP_GRACE);
            drop(registered);
        });
    }
}

impl HandsInstance for LocalInstance {
    fn endpoint(&self) -> &HandsEndpoint {
        &self.endpoint
    }

    fn is_alive(&self) -> bool {
        self.exit.borrow().is_none()
    }

    fn stop(mut self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            self.stopped
                .store(true, std::sync::atomic::Ordering::SeqCst);
            let tree = self.tree.clone();
            let registered = self.registered.take();
            let _ = tokio::task::spawn_blocking(move || {
                warren_process::kill_tree(&tree, STOP_GRACE);
                drop(registered);
            })
            .await;
            let mut exit = self.exit.clone();
            let _ = tokio::time::timeout(STOP_GRACE * 2, exit.wait_for(Option::is_some)).await;
        })
    }
}

impl HandsProvider for LocalHands {
    fn start(
        &self,
        workspace: PathBuf,
    ) -> BoxFuture<'_, Result<Box<dyn HandsInstance>, HandsError>> {
        Box::pin(async move {
            let instance = self.start_local(&workspace).await?;
            Ok(Box::new(instance) as Box<dyn HandsInstance>)
        })
    }
}

impl LocalHands {
    async fn start_local(&self, workspace: &Path) -> Result<LocalInstance, HandsError> {
        let fail = |what: &str, error: &dyn std::fmt::Display| {
            HandsError::Start(format!("{what}: {error}"))
        };
        tokio::fs::create_dir_all(workspace)
            .await
            .map_err(|e| fail("cannot create the workspace", &e))?;
        let token = hex::encode(rand::random::<[u8; 32]>());
        let marker = TreeId::new_marker();
        let registered = self
            .registry
            .as_ref()
            .map(|registry| registry.register(&marker));
        let mut command = tokio::process::Command::new(&self.execd_program);
        command
            .arg("execd")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--root")
            .arg(workspace)
            .env("EXECD_ACCESS_TOKEN", &token)
            .env(warren_process::tree::TREE_MARKER_VAR, &marker)
            .current_dir(workspace)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = warren_process::reaper::spawn_owned(|| {
            let child = command.spawn()?;
            let pid = child.id();
            Ok((child, pid))
        })
        .map_err(|e| fail(&format!("cannot run {}", self.execd_program.display()), &e))?;
        let pid = child
            .id()
            .ok_or_else(|| HandsError::Start("execd exited at once".into()))?;
        let tree = TreeId::new(pid as i32, Some(marker));
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(HandsError::Start("execd stdio pipes missing".into()));
        };
        let (exit_tx, exit_rx) = watch::channel(None);
        tokio::spawn(async move {
            let status = match child.wait().await {
                Ok(status) => status.to_string(),
                Err(error) => format!("wait failed: {error}"),
            };
            warren_process::reaper::release(pid);
            tracing::debug!(pid, %status, "hands execd exited");
            let _ = exit_tx.send(Some(status));
        });
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::debug!(target: "warren_gateway::hands_stderr", pid, "{line}");
            }
        });
        let mut stdout = tokio::io::BufReader::new(stdout).lines();
        let first_line = tokio::time::timeout(START_TIMEOUT, stdout.next_line()).await;
        let url = match first_line {
            Ok(Ok(Some(line))) => line
                .strip_prefix("warren execd listening on ")
                .map(|url| url.trim().trim_end_matches('/').to_owned()),
            _ => None,
        };
        let Some(url) = url else {
            let _ =
                tokio::task::spawn_blocking(move || warren_process::kill_tree(&tree, STOP_GRACE))
                    .await;
            return Err(HandsError::Start("execd did not print its address".into()));
        };
        // Keep draining stdout so execd never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = stdout.next_line().await {} });
        tracing::info!(pid, %url, workspace = %workspace.display(), "hands started");
        Ok(LocalInstance {
            endpoint: HandsEndpoint { url, token },
            tree,
            registered,
            exit: exit_rx,
            stopped: std::sync::atomic::AtomicBool::new(false),
        })
    }
}

/// One session's hands: the sandbox (started on first use) and the agent-facing [`Host`].
pub struct Hands {
    provider: Arc<dyn HandsProvider>,
    workspace: PathBuf,
    instance: tokio::sync::Mutex<Option<Box<dyn HandsInstance>>>,
    http: reqwest::Client,
    terminals: Mutex<HashMap<String, Arc<Terminal>>>,
    stopped: std::sync::atomic::AtomicBool,
    n_starts: std::sync::atomic::AtomicU64,
}

impl Hands {
    /// Hands for `workspace` (made absolute); nothing starts until first use.
    pub fn new(provider: Arc<dyn HandsProvider>, workspace: PathBuf) -> Arc<Self> {
        let workspace = std::path::absolute(&workspace).unwrap_or(workspace);
        Arc::new(Self {
            provider,
            workspace,
            instance: tokio::sync::Mutex::new(None),
            // A hung execd must not hang the agent forever; `/command` streams carry no total
            // timeout (commands may run long), the file and kill requests do (below).
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .build()
                .unwrap_or_default(),
            terminals: Mutex::new(HashMap::new()),
            stopped: std::sync::atomic::AtomicBool::new(false),
            n_starts: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The workspace's absolute path: the `cwd` to give the agent in `session/new`.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    /// The running sandbox's endpoint, starting (or restarting a dead) sandbox first.
    pub async fn endpoint(&self) -> Result<HandsEndpoint, HandsError> {
        if self.stopped.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(HandsError::Stopped);
        }
        let mut instance = self.instance.lock().await;
        if let Some(running) = instance.as_ref() {
            if running.is_alive() {
                return Ok(running.endpoint().clone());
            }
            tracing::warn!(workspace = %self.workspace.display(), "hands died; starting new ones");
            if let Some(dead) = instance.take() {
                dead.stop().await;
            }
        }
        let started = self.provider.start(self.workspace.clone()).await?;
        self.n_starts
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let endpoint = started.endpoint().clone();
        *instance = Some(started);
        Ok(endpoint)
    }

    /// Warren's exec tools bound to these hands, for `session/new` (starts the hands).
    pub async fn mcp_server(&self, warren_exe: &str) -> Result<McpServerSpec, HandsError> {
        let endpoint = self.endpoint().await?;
        Ok(McpServerSpec::warren_exec(
            warren_exe,
            &endpoint.url,
            &endpoint.token,
        ))
    }

    /// How many sandboxes these hands have started: more than one means earlier ones died (or
    /// were stopped) and processes and shell state were reset.
    pub fn n_starts(&self) -> u64 {
        self.n_starts.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// True while a sandbox runs (without starting one).
    pub fn is_running(&self) -> bool {
        match self.instance.try_lock() {
            Ok(instance) => instance.as_ref().is_some_and(|i| i.is_alive()),
            // Someone is starting or stopping it right now.
            Err(_) => true,
        }
    }

    /// Stops the sandbox and every process in it; later uses fail with [`HandsError::Stopped`].
    pub async fn stop(&self) {
        self.stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let terminals: Vec<Arc<Terminal>> = self.terminals().drain().map(|(_, t)| t).collect();
        for terminal in terminals {
            terminal.reader.abort();
        }
        if let Some(instance) = self.instance.lock().await.take() {
            instance.stop().await;
        }
    }

    fn terminals(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Terminal>>> {
        self.terminals
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn terminal(&self, terminal_id: &str) -> Result<Arc<Terminal>, HostError> {
        self.terminals()
            .get(terminal_id)
            .cloned()
            .ok_or_else(|| HostError::NotFound(format!("terminal {terminal_id}")))
    }

    /// Checks that `path` is absolute and inside the workspace (lexically; execd enforces the
    /// rest without following links out) and returns it as execd expects it.
    fn execd_path(&self, path: &Path) -> Result<String, HostError> {
        if !path.is_absolute() {
            return Err(HostError::Invalid(format!(
                "path {} is not absolute",
                path.display()
            )));
        }
        let mut normal = PathBuf::new();
        for component in path.components() {
            match component {
                Component::ParentDir => {
                    normal.pop();
                }
                Component::CurDir => {}
                other => normal.push(other),
            }
        }
        let Ok(relative) = normal.strip_prefix(&self.workspace) else {
            return Err(HostError::Invalid(format!(
                "path {} is outside the workspace {}",
                path.display(),
                self.workspace.display()
            )));
        };
        // execd canonicalizes its root (symlinked temp dirs, `./warren-data`); speak its terms.
        let root =
            std::fs::canonicalize(&self.workspace).unwrap_or_else(|_| self.workspace.clone());
        Ok(root.join(relative).to_string_lossy().into_owned())
    }

    async fn endpoint_for_host(&self) -> Result<HandsEndpoint, HostError> {
        self.endpoint()
            .await
            .map_err(|e| HostError::Failed(e.to_string()))
    }

    async fn read_file(
        &self,
        path: PathBuf,
        line: Option<u32>,
        limit: Option<u32>,
    ) -> Result<String, HostError> {
        // Hands first: they create the workspace, which path resolution needs.
        let endpoint = self.endpoint_for_host().await?;
        let execd_path = self.execd_path(&path)?;
        let response = self
            .http
            .get(format!("{}/files/download", endpoint.url))
            .header("X-EXECD-ACCESS-TOKEN", &endpoint.token)
            .query(&[("path", execd_path.as_str())])
            .timeout(FILE_REQUEST_TIMEOUT)
            .send()
            .await
            .map_err(|e| HostError::Failed(format!("hands unreachable: {e}")))?;
        let response = check_status(response, &path).await?;
        let bytes = response
            .bytes()
            .await
            .map_err(|e| HostError::Failed(format!("reading {}: {e}", path.display())))?;
        let text = String::from_utf8(bytes.to_vec())
            .map_err(|_| HostError::Invalid(format!("{} is not UTF-8 text", path.display())))?;
        Ok(select_lines(&text, line, limit))
    }

    async fn write_file(&self, path: PathBuf, content: String) -> Result<(), HostError> {
        // Hands first: they create the workspace, which path resolution needs.
        let endpoint = self.endpoint_for_host().await?;
        let execd_path = self.execd_path(&path)?;
        let metadata = serde_json::json!({ "path": execd_path }).to_string();
        let metadata_part = reqwest::multipart::Part::text(metadata)
            .file_name("metadata")
            .mime_str("application/json")
            .map_err(|e| HostError::Failed(e.to_string()))?;
        let file_name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "file".into());
        let file_part = reqwest::multipart::Part::bytes(content.into_bytes()).file_name(file_name);
        let form = reqwest::multipart::Form::new()
            .part("metadata", metadata_part)
            .part("file", file_part);
        let response = self
            .http
            .post(format!("{}/files/upload", endpoint.url))
            .header("X-EXECD-ACCESS-TOKEN", &endpoint.token)
            .multipart(form)
            .timeout(FILE_REQUEST_TIMEOUT)
            .send()
            .await
            .map_err(|e| HostError::Failed(format!("hands unreachable: {e}")))?;
        check_status(response, &path).await?;
        Ok(())
    }

    async fn start_terminal(&self, spec: TerminalSpec) -> Result<String, HostError> {
        let endpoint = self.endpoint_for_host().await?;
        let cwd = match &spec.cwd {
            Some(cwd) => self.execd_path(cwd)?,
            None => self.execd_path(&self.workspace)?,
        };
        let mut words = Vec::with_capacity(spec.args.len() + 1);
        words.push(spec.command.as_str());
        words.extend(spec.args.iter().map(String::as_str));
        // With arguments, ACP means a program and its argv; without, `command` may be a shell line.
        let command_line = if spec.args.is_empty() {
            spec.command.clone()
        } else {
            shlex::try_join(words)
                .map_err(|e| HostError::Invalid(format!("cannot quote the command: {e}")))?
        };
        let envs: HashMap<&str, &str> = spec
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let body = serde_json::json!({ "command": command_line, "cwd": cwd, "envs": envs });
        let response = self
            .http
            .post(format!("{}/command", endpoint.url))
            .header("X-EXECD-ACCESS-TOKEN", &endpoint.token)
            .json(&body)
            .send()
            .await
            .map_err(|e| HostError::Failed(format!("hands unreachable: {e}")))?;
        let response = check_status(response, Path::new(&cwd)).await?;
        let terminal_id = format!("term-{}", hex::encode(rand::random::<[u8; 8]>()));
        let limit = spec.output_byte_limit.unwrap_or(DEFAULT_OUTPUT_LIMIT);
        let state = Arc::new(Mutex::new(TerminalState::default()));
        let (exit_tx, exit_rx) = watch::channel(None);
        let reader = tokio::spawn(read_command_stream(response, state.clone(), exit_tx, limit));
        let terminal = Arc::new(Terminal {
            state,
            exit: exit_rx,
            reader,
            endpoint,
        });
        self.terminals().insert(terminal_id.clone(), terminal);
        Ok(terminal_id)
    }

    async fn kill(&self, terminal: &Terminal) -> Result<(), HostError> {
        if terminal.exit.borrow().is_some() {
            return Ok(());
        }
        let mut exit = terminal.exit.clone();
        // The command id arrives with the stream's first event; wait briefly for it.
        let command_id = {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                let id = terminal.state().command_id.clone();
                if let Some(id) = id {
                    break Some(id);
                }
                if exit.borrow().is_some() || tokio::time::Instant::now() >= deadline {
                    break None;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let Some(command_id) = command_id else {
            return Ok(());
        };
        let result = self
            .http
            .delete(format!("{}/command", terminal.endpoint.url))
            .header("X-EXECD-ACCESS-TOKEN", &terminal.endpoint.token)
            .query(&[("id", command_id.as_str())])
            .timeout(FILE_REQUEST_TIMEOUT)
            .send()
            .await;
        if let Err(error) = result {
            return Err(HostError::Failed(format!("hands unreachable: {error}")));
        }
        // The stream reports the exit; bounded so a lost stream cannot hang the agent.
        let _ = tokio::time::timeout(Duration::from_secs(10), exit.wait_for(Option::is_some)).await;
        Ok(())
    }
}

/// One `terminal/create`: the command's output so far and how it ended.
struct Terminal {
    state: Arc<Mutex<TerminalState>>,
    exit: watch::Receiver<Option<TerminalExit>>,
    reader: tokio::task::JoinHandle<()>,
    endpoint: HandsEndpoint,
}

impl Terminal {
    fn state(&self) -> std::sync::MutexGuard<'_, TerminalState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[derive(Default)]
struct TerminalState {
    output: String,
    truncated: bool,
    command_id: Option<String>,
}

impl TerminalState {
    /// Appends and drops the oldest bytes beyond `limit` (on a character boundary).
    fn push(&mut self, text: &str, limit: u64) {
        self.output.push_str(text);
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        if self.output.len() > limit {
            let mut cut = self.output.len() - limit;
            while !self.output.is_char_boundary(cut) {
                cut += 1;
            }
            self.output.drain(..cut);
            self.truncated = true;
        }
    }
}

/// Reads `POST /command`'s event stream (one JSON object per line, optionally `data: `-prefixed)
/// into the terminal state until the command ends.
async fn read_command_stream(
    response: reqwest::Response,
    state: Arc<Mutex<TerminalState>>,
    exit_tx: watch::Sender<Option<TerminalExit>>,
    limit: u64,
) {
    fn lock(state: &Mutex<TerminalState>) -> std::sync::MutexGuard<'_, TerminalState> {
        state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
    let mut body = response.bytes_stream();
    let mut pending = Vec::new();
    let mut exit = None;
    'stream: while let Some(chunk) = body.next().await {
        let Ok(chunk) = chunk else { break };
        pending.extend_from_slice(&chunk);
        while let Some(newline) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=newline).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim();
            let line = line.strip_prefix("data:").map(str::trim).unwrap_or(line);
            if line.is_empty() {
                continue;
            }
            let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let text = event.get("text").and_then(|t| t.as_str()).unwrap_or("");
            match event.get("type").and_then(|t| t.as_str()).unwrap_or("") {
                "init" => lock(&state).command_id = Some(text.to_owned()),
                "stdout" | "stderr" => {
                    let mut state = lock(&state);
                    if text == "\n" {
                        state.push("\n", limit);
                    } else {
                        state.push(text, limit);
                        state.push("\n", limit);
                    }
                }
                "execution_complete" => {
                    exit = Some(TerminalExit {
                        exit_code: Some(0),
                        signal: None,
                    });
                    break 'stream;
                }
                "error" => {
                    let error = event.get("error");
                    let evalue = error
                        .and_then(|e| e.get("evalue"))
                        .and_then(|v| v.as_str())
                        .unwrap_or("");
                    exit = Some(match evalue.parse::<i64>() {
                        Ok(code) if code >= 0 => TerminalExit {
                            exit_code: u32::try_from(code).ok(),
                            signal: None,
                        },
                        Ok(_) => TerminalExit {
                            exit_code: None,
                            signal: Some("SIGKILL".into()),
                        },
                        Err(_) => {
                            // A start failure: the OS message is the output.
                            lock(&state).push(&format!("{evalue}\n"), limit);
                            TerminalExit {
                                exit_code: Some(127),
                                signal: None,
                            }
                        }
                    });
                    break 'stream;
                }
                _ => {}
            }
        }
    }
    let exit = exit.unwrap_or(TerminalExit {
        exit_code: None,
        signal: Some("hands connection lost".into()),
    });
    let _ = exit_tx.send(Some(exit));
}

async fn check_status(
    response: reqwest::Response,
    path: &Path,
) -> Result<reqwest::Response, HostError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body = response.text().await.unwrap_or_default();
    let message = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
        .unwrap_or(body);
    Err(match status.as_u16() {
        404 => HostError::NotFound(format!("{}: {message}", path.display())),
        400 | 403 | 413 | 416 => HostError::Invalid(format!("{}: {message}", path.display())),
        _ => HostError::Failed(format!(
            "{}: hands answered {status}: {message}",
            path.display()
        )),
    })
}

impl Host for Hands {
    fn read_text_file(
        &self,
        path: PathBuf,
        line: Option<u32>,
        limit: Option<u32>,
    ) -> BoxFuture<'_, Result<String, HostError>> {
        Box::pin(self.read_file(path, line, limit))
    }

    fn write_text_file(
        &self,
        path: PathBuf,
        content: String,
    ) -> BoxFuture<'_, Result<(), HostError>> {
        Box::pin(self.write_file(path, content))
    }

    fn create_terminal(&self, spec: TerminalSpec) -> BoxFuture<'_, Result<String, HostError>> {
        Box::pin(self.start_terminal(spec))
    }

    fn terminal_output(
        &self,
        terminal_id: String,
    ) -> BoxFuture<'_, Result<TerminalOutput, HostError>> {
        Box::pin(async move {
            let terminal = self.terminal(&terminal_id)?;
            let exit = terminal.exit.borrow().clone();
            let state = terminal.state();
            Ok(TerminalOutput {
                output: state.output.clone(),
                truncated: state.truncated,
                exit,
            })
        })
    }

    fn wait_for_terminal_exit(
        &self,
        terminal_id: String,
    ) -> BoxFuture<'_, Result<TerminalExit, HostError>> {
        Box::pin(async move {
            let terminal = self.terminal(&terminal_id)?;
            let mut exit = terminal.exit.clone();
            let exit = exit
                .wait_for(Option::is_some)
                .await
                .map_err(|_| HostError::Failed("the terminal was released".into()))?;
            Ok(exit.clone().unwrap_or_default())
        })
    }

    fn kill_terminal(&self, terminal_id: String) -> BoxFuture<'_, Result<(), HostError>> {
        Box::pin(async move {
            let terminal = self.terminal(&terminal_id)?;
            self.kill(&terminal).await
        })
    }

    fn release_terminal(&self, terminal_id: String) -> BoxFuture<'_, Result<(), HostError>> {
        Box::pin(async move {
            let terminal = self.terminal(&terminal_id)?;
            self.kill(&terminal).await?;
            terminal.reader.abort();
            self.terminals().remove(&terminal_id);
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_lines_follows_acp_line_and_limit() {
        let text = "a\nb\nc\n";
        let cases = [
            (None, None, "a\nb\nc\n"),
            (Some(2), None, "b\nc\n"),
            (Some(2), Some(1), "b\n"),
            (None, Some(2), "a\nb\n"),
            (Some(9), None, ""),
            (Some(0), Some(1), "a\n"),
        ];
        for (line, limit, expected) in cases {
            assert_eq!(
                select_lines(text, line, limit),
                expected,
                "line {line:?} limit {limit:?}"
            );
        }
    }

    #[test]
    fn terminal_output_keeps_the_newest_bytes_within_the_limit() {
        let mut state = TerminalState::default();
        state.push("hello ", 8);
        state.push("wörld", 8);
        assert!(state.truncated);
        assert!(state.output.len() <= 8, "{:?}", state.output);
        assert!(state.output.ends_with("wörld"));
    }

    #[test]
    fn paths_outside_the_workspace_are_refused() {
        let hands = Hands::new(
            Arc::new(LocalHands::new("/nonexistent")),
            PathBuf::from("/w/s1"),
        );
        assert_eq!(
            hands.execd_path(Path::new("/w/s1/a.txt")).ok().as_deref(),
            Some("/w/s1/a.txt")
        );
        assert!(hands.execd_path(Path::new("/w/s1/../s2/a.txt")).is_err());
        assert!(hands.execd_path(Path::new("relative.txt")).is_err());
        assert!(hands.execd_path(Path::new("/etc/passwd")).is_err());
    }
}
