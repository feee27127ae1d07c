//! Hands: a session's sandbox, a `warren execd` with the session workspace as `--root`, and the
//! [`warren_brain::Host`] that serves the agent's `fs/*` and `terminal/*` requests from it
//! through the typed execd client: files through Warren's `/v1/files`, terminals through
//! `/v1/terminals` (the exec engine, raw bytes, real exit codes and signal names).
//!
//! [`Hands`] starts its execd lazily on first use ([`Hands::endpoint`]) through a
//! [`HandsProvider`]; [`LocalHands`] (the default) runs `<warren> execd --listen 127.0.0.1:0
//! --root <workspace>` through `warren_process::spawn` in its own process group, under the
//! hands environment policy (a clean allowlist plus `--hands-env`, never the gateway's
//! variables), with a random access token, reads the bound address from execd's first stdout
//! line, and kills the whole process tree on [`Hands::stop`]. Pause, archive, snapshots and
//! bwrap are deliberately absent: they are further providers or wrappers behind the same trait.
//!
//! Paths: the agent sees the workspace at its real absolute path (the `cwd` of `session/new`);
//! paths are checked to lie inside the workspace before anything is sent to execd.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncBufReadExt;
use tokio::sync::watch;
use warren_brain::{
    BoxFuture, Host, HostError, McpServerSpec, TerminalExit, TerminalOutput, TerminalSpec,
    select_lines,
};
use warren_execd_client::{ClientError, ExecdClient};
use warren_process::pipes::{Leader, OutputMode, PipeOptions, StdinMode};
use warren_process::{
    CommandSpec, Connect, EnvPolicy, HandsVar, TreeGuard, TreeMarker, TreeRegistry,
};
use warren_protocol::terminal::TerminalCreate;

/// How long a starting execd may take to print its address.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// SIGTERM grace when stopping hands.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// How long one `terminal/wait_for_exit` poll waits in execd before asking again.
const EXIT_POLL: Duration = Duration::from_secs(60);

/// Where a running hands' execd answers, and the token it requires.
#[derive(Clone, PartialEq, Eq)]
pub struct HandsEndpoint {
    /// `http://127.0.0.1:PORT`, no trailing slash.
    pub url: String,
    /// Sent as `X-EXECD-ACCESS-TOKEN`. Never logged.
    pub token: String,
}

impl HandsEndpoint {
    /// The typed client of this execd.
    pub fn client(&self) -> Result<ExecdClient, HandsError> {
        ExecdClient::new(&self.url, Some(self.token.clone()))
            .map_err(|e| HandsError::Start(e.to_string()))
    }
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
    /// `--hands-env`: variables the hands get besides the allowlist.
    env: Vec<HandsVar>,
}

impl LocalHands {
    /// `execd_program` is the `warren` binary (its `execd` subcommand is used).
    pub fn new(execd_program: impl Into<PathBuf>) -> Self {
        Self {
            execd_program: execd_program.into(),
            registry: None,
            env: Vec::new(),
        }
    }

    /// Lists each execd's process tree in `registry` from before it starts until it is stopped,
    /// so a gateway restarted after a crash can stop the hands this one leaves behind.
    pub fn registered_in(mut self, registry: Arc<TreeRegistry>) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Gives the hands these variables besides the allowlist (`--hands-env`).
    pub fn with_env(mut self, env: Vec<HandsVar>) -> Self {
        self.env = env;
        self
    }

    /// Uses the running executable (the normal case: the gateway is `warren`).
    pub fn from_current_exe() -> std::io::Result<Self> {
        Ok(Self::new(std::env::current_exe()?))
    }
}

struct LocalInstance {
    endpoint: HandsEndpoint,
    /// Kills the sandbox's tree on `stop`, or when dropped (an error path, a session dropped by
    /// mistake), and holds its registry entry until then.
    tree: TreeGuard,
    exit: watch::Receiver<Option<String>>,
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
            self.tree.kill().await;
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
        let marker = TreeMarker::new();
        let registered = self
            .registry
            .as_ref()
            .map(|registry| registry.register(&marker));
        let spec = CommandSpec::new(&self.execd_program, &marker)
            .arg("execd")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--root")
            .arg(workspace)
            .cwd(workspace)
            .env_policy(EnvPolicy::Hands {
                pass: self.env.clone(),
            })
            .env("EXECD_ACCESS_TOKEN", &token);
        let options = PipeOptions {
            stdin: StdinMode::Null,
            output: OutputMode::Separate,
            leader: Leader::ProcessGroup,
        };
        let spawned = warren_process::spawn(&spec, Connect::Pipes(options))
            .map_err(|e| fail(&format!("cannot run {}", self.execd_program.display()), &e))?
            .into_pipes();
        let pid = spawned.pid();
        let mut tree = TreeGuard::new(spawned.tree.clone(), STOP_GRACE, registered);
        let mut child = spawned.child;
        let Some(stderr) = spawned.stderr else {
            return Err(HandsError::Start("execd stdio pipes missing".into()));
        };
        let (exit_tx, exit_rx) = watch::channel(None);
        tokio::spawn(async move {
            let status = match child.wait().await {
                Ok(status) => status.to_string(),
                Err(error) => format!("wait failed: {error}"),
            };
            tracing::debug!(pid, %status, "hands execd exited");
            let _ = exit_tx.send(Some(status));
        });
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::debug!(target: "warren_gateway::hands_stderr", pid, "{line}");
            }
        });
        let mut stdout = tokio::io::BufReader::new(spawned.stdout).lines();
        let first_line = tokio::time::timeout(START_TIMEOUT, stdout.next_line()).await;
        let url = match first_line {
            Ok(Ok(Some(line))) => line
                .strip_prefix("warren execd listening on ")
                .map(|url| url.trim().trim_end_matches('/').to_owned()),
            _ => None,
        };
        let Some(url) = url else {
            tree.kill().await;
            return Err(HandsError::Start("execd did not print its address".into()));
        };
        // Keep draining stdout so execd never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = stdout.next_line().await {} });
        tracing::info!(pid, %url, workspace = %workspace.display(), "hands started");
        Ok(LocalInstance {
            endpoint: HandsEndpoint { url, token },
            tree,
            exit: exit_rx,
        })
    }
}

/// One session's hands: the sandbox (started on first use) and the agent-facing [`Host`].
pub struct Hands {
    provider: Arc<dyn HandsProvider>,
    workspace: PathBuf,
    instance: tokio::sync::Mutex<Option<Box<dyn HandsInstance>>>,
    /// The agent's terminals, each with the client of the execd that runs it (a terminal of
    /// hands that died is gone with them).
    terminals: Mutex<HashMap<String, ExecdClient>>,
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
        self.terminals().clear();
        if let Some(instance) = self.instance.lock().await.take() {
            instance.stop().await;
        }
    }

    fn terminals(&self) -> std::sync::MutexGuard<'_, HashMap<String, ExecdClient>> {
        self.terminals
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn terminal(&self, terminal_id: &str) -> Result<ExecdClient, HostError> {
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

    async fn client_for_host(&self) -> Result<ExecdClient, HostError> {
        self.endpoint()
            .await
            .and_then(|endpoint| endpoint.client())
            .map_err(|e| HostError::Failed(e.to_string()))
    }

    async fn read_file(
        &self,
        path: PathBuf,
        line: Option<u32>,
        limit: Option<u32>,
    ) -> Result<String, HostError> {
        // Hands first: they create the workspace, which path resolution needs.
        let client = self.client_for_host().await?;
        let execd_path = self.execd_path(&path)?;
        let bytes = client
            .read_file(&execd_path)
            .await
            .map_err(|e| host_error(e, &path))?;
        let text = String::from_utf8(bytes.to_vec())
            .map_err(|_| HostError::Invalid(format!("{} is not UTF-8 text", path.display())))?;
        Ok(select_lines(&text, line, limit))
    }

    async fn write_file(&self, path: PathBuf, content: String) -> Result<(), HostError> {
        // Hands first: they create the workspace, which path resolution needs.
        let client = self.client_for_host().await?;
        let execd_path = self.execd_path(&path)?;
        client
            .write_file(&execd_path, content)
            .await
            .map_err(|e| host_error(e, &path))
    }

    async fn start_terminal(&self, spec: TerminalSpec) -> Result<String, HostError> {
        let client = self.client_for_host().await?;
        let cwd = match &spec.cwd {
            Some(cwd) => self.execd_path(cwd)?,
            None => self.execd_path(&self.workspace)?,
        };
        let create = TerminalCreate {
            command: spec.command,
            args: spec.args,
            env: spec.env.into_iter().collect(),
            cwd: Some(cwd.clone()),
            output_byte_limit: spec.output_byte_limit,
        };
        let created = client
            .create_terminal(&create)
            .await
            .map_err(|e| host_error(e, Path::new(&cwd)))?;
        self.terminals().insert(created.terminal_id.clone(), client);
        Ok(created.terminal_id)
    }

    async fn output(&self, terminal_id: &str, wait: Duration) -> Result<TerminalOutput, HostError> {
        let client = self.terminal(terminal_id)?;
        let output = client
            .terminal_output(terminal_id, wait)
            .await
            .map_err(|e| host_error(e, Path::new(terminal_id)))?;
        Ok(TerminalOutput {
            output: output.output,
            truncated: output.truncated,
            exit: output.exit_status.map(|status| TerminalExit {
                exit_code: status.exit_code,
                signal: status.signal,
            }),
        })
    }
}

/// The one place execd's answers become the agent's errors.
fn host_error(error: ClientError, subject: &Path) -> HostError {
    let subject = subject.display();
    match error {
        ClientError::Api {
            status, message, ..
        } if status == reqwest::StatusCode::NOT_FOUND => {
            HostError::NotFound(format!("{subject}: {message}"))
        }
        ClientError::Api {
            status, message, ..
        } if status.is_client_error() => HostError::Invalid(format!("{subject}: {message}")),
        other => HostError::Failed(format!("{subject}: {other}")),
    }
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
        Box::pin(async move { self.output(&terminal_id, Duration::ZERO).await })
    }

    fn wait_for_terminal_exit(
        &self,
        terminal_id: String,
    ) -> BoxFuture<'_, Result<TerminalExit, HostError>> {
        Box::pin(async move {
            loop {
                if let Some(exit) = self.output(&terminal_id, EXIT_POLL).await?.exit {
                    return Ok(exit);
                }
            }
        })
    }

    fn kill_terminal(&self, terminal_id: String) -> BoxFuture<'_, Result<(), HostError>> {
        Box::pin(async move {
            let client = self.terminal(&terminal_id)?;
            client
                .kill_terminal(&terminal_id)
                .await
                .map_err(|e| host_error(e, Path::new(&terminal_id)))
        })
    }

    fn release_terminal(&self, terminal_id: String) -> BoxFuture<'_, Result<(), HostError>> {
        Box::pin(async move {
            let client = self.terminal(&terminal_id)?;
            let released = client.release_terminal(&terminal_id).await;
            self.terminals().remove(&terminal_id);
            match released {
                // The hands that ran it are gone, and the terminal with them.
                Err(ClientError::Api { status, .. })
                    if status == reqwest::StatusCode::NOT_FOUND =>
                {
                    Ok(())
                }
                other => other.map_err(|e| host_error(e, Path::new(&terminal_id))),
            }
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
