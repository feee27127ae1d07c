//! One agent process and its ACP connection. [`Worker::spawn`] starts the process in its own
//! process group (through the subreaper's `spawn_owned`), connects the ACP client to its stdio and
//! sends `initialize`. Requests the agent sends (permission, `fs/*`, `terminal/*`) are answered
//! from tasks outside the SDK's dispatch loop, so a slow permission answer never blocks the
//! session's updates; updates themselves are handed to the sink inside the loop, which keeps them
//! in the agent's order and before the `session/prompt` response.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    ClientCapabilities, CloseSessionRequest, CreateTerminalRequest, CreateTerminalResponse,
    EnvVariable, FileSystemCapabilities, Implementation, InitializeRequest, KillTerminalRequest,
    KillTerminalResponse, LoadSessionRequest, McpServer, McpServerStdio, NewSessionRequest,
    ReadTextFileRequest, ReadTextFileResponse, ReleaseTerminalRequest, ReleaseTerminalResponse,
    RequestPermissionOutcome, RequestPermissionResponse, ResumeSessionRequest,
    SelectedPermissionOutcome, SessionId, TerminalExitStatus, TerminalId, TerminalOutputRequest,
    TerminalOutputResponse, WaitForTerminalExitRequest, WaitForTerminalExitResponse,
    WriteTextFileRequest, WriteTextFileResponse,
};
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{
    Agent, ByteStreams, Client, ErrorCode, JsonRpcRequest, JsonRpcResponse,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{oneshot, watch};
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};
use warren_process::pipes::{Leader, OutputMode, PipeOptions, StdinMode};
use warren_process::{CommandSpec, Connect, EnvPolicy, TreeGuard, TreeMarker, TreeRegistry};

use crate::host::{
    BoxFuture, Host, HostError, PermissionOutcome, TerminalExit, TerminalSpec, TurnSink,
};
use crate::session::{BrainSession, Resumed};
use crate::{AgentCommand, BrainError, McpServerSpec};

/// How long `initialize` and session setup may take before the worker is given up.
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `session/close` may take before the worker is killed anyway.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// The last stderr line is kept to this many characters.
const STDERR_LINE_MAX_CHARS: usize = 300;
/// After the connection breaks, how long to wait for the process's exit status.
const EXIT_STATUS_WAIT: Duration = Duration::from_secs(3);

/// The byte streams of an agent that runs elsewhere (see [`Worker::connect`]).
pub struct AgentIo {
    pub stdin: Pin<Box<dyn AsyncWrite + Send>>,
    pub stdout: Pin<Box<dyn AsyncRead + Send>>,
    pub stderr: Pin<Box<dyn AsyncRead + Send>>,
    /// Resolves with a description of how the agent ended.
    pub exited: BoxFuture<'static, String>,
    /// The agent's pid where it runs (0 when unknown), for logs.
    pub pid: u32,
}

/// Ends an agent that runs elsewhere; run at most once, by [`Worker`]'s kill or its drop.
pub struct RemoteStop(Option<Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>>);

impl RemoteStop {
    pub fn new(stop: impl FnOnce() -> BoxFuture<'static, ()> + Send + 'static) -> RemoteStop {
        RemoteStop(Some(Box::new(stop)))
    }

    async fn run(mut self) {
        if let Some(stop) = self.0.take() {
            stop().await;
        }
    }
}

impl Drop for RemoteStop {
    fn drop(&mut self) {
        // Dropped without `run` (a worker dropped without kill): the stop still happens.
        if let Some(stop) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(stop());
        }
    }
}

/// How a worker's agent is stopped.
enum Stopper {
    /// A local process tree: SIGTERM, grace, SIGKILL.
    Tree(TreeGuard),
    Remote(RemoteStop),
}

impl Stopper {
    async fn stop(self) {
        match self {
            Stopper::Tree(mut tree) => {
                tree.kill().await;
            }
            Stopper::Remote(stop) => stop.run().await,
        }
    }
}

/// A spawned, `initialize`d agent process, not yet bound to a session. Serves one session only.
pub struct Worker {
    pub(crate) conn: Arc<Connection>,
}

/// What the agent advertised in `initialize` that the gateway acts on.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AgentCaps {
    pub load_session: bool,
    pub resume_session: bool,
    pub close_session: bool,
}

/// `session/update` as the agent sent it: the `update` is forwarded unchanged (the typed schema
/// would drop fields and update kinds this SDK version does not know).
#[derive(
    Debug, Clone, serde::Serialize, serde::Deserialize, agent_client_protocol::JsonRpcNotification,
)]
#[notification(method = "session/update")]
struct RawSessionUpdate {
    #[serde(rename = "sessionId")]
    session_id: String,
    update: serde_json::Value,
}

/// `session/request_permission` with the tool call and options kept as the agent sent them.
#[derive(
    Debug, Clone, serde::Serialize, serde::Deserialize, agent_client_protocol::JsonRpcRequest,
)]
#[request(method = "session/request_permission", response = RequestPermissionResponse)]
struct RawPermissionRequest {
    #[serde(rename = "sessionId")]
    session_id: String,
    #[serde(rename = "toolCall")]
    tool_call: serde_json::Value,
    options: serde_json::Value,
}

/// The session's host and sink, bound when the worker gets its session.
struct Binding {
    host: Arc<dyn Host>,
    sink: Arc<dyn TurnSink>,
}

/// State shared between the connection's handlers and the session handle.
pub(crate) struct Shared {
    binding: RwLock<Option<Binding>>,
    /// Bumped by every cancel; pending permission requests watch it.
    cancel_generation: watch::Sender<u64>,
    /// Set by cancel, cleared when a turn starts: a permission asked after a cancel in the same
    /// turn is answered `cancelled` at once.
    turn_cancelled: AtomicBool,
    /// While `session/load` replays history, its updates are not forwarded (the gateway has them).
    replaying: AtomicBool,
}

impl Shared {
    fn host(&self) -> Option<Arc<dyn Host>> {
        let binding = self
            .binding
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        binding.as_ref().map(|b| b.host.clone())
    }

    fn sink(&self) -> Option<Arc<dyn TurnSink>> {
        let binding = self
            .binding
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        binding.as_ref().map(|b| b.sink.clone())
    }

    pub(crate) fn cancel_pending(&self) {
        self.turn_cancelled.store(true, Ordering::SeqCst);
        self.cancel_generation
            .send_modify(|generation| *generation += 1);
    }

    pub(crate) fn start_turn(&self) {
        self.turn_cancelled.store(false, Ordering::SeqCst);
    }

    fn on_update(&self, notification: RawSessionUpdate) {
        if self.replaying.load(Ordering::SeqCst) {
            return;
        }
        let Some(sink) = self.sink() else {
            tracing::debug!("session/update before a session was bound; dropped");
            return;
        };
        sink.update(notification.update);
    }

    async fn ask_permission(&self, request: RawPermissionRequest) -> RequestPermissionOutcome {
        let mut cancelled = self.cancel_generation.subscribe();
        if self.turn_cancelled.load(Ordering::SeqCst) {
            return RequestPermissionOutcome::Cancelled;
        }
        let Some(sink) = self.sink() else {
            return RequestPermissionOutcome::Cancelled;
        };
        let (tool_call, options) = (request.tool_call, request.options);
        let answer = sink.request_permission(tool_call, options);
        tokio::select! {
            outcome = answer => match outcome {
                PermissionOutcome::Selected(option_id) => RequestPermissionOutcome::Selected(
                    SelectedPermissionOutcome::new(option_id),
                ),
                PermissionOutcome::Cancelled => RequestPermissionOutcome::Cancelled,
            },
            _ = cancelled.changed() => RequestPermissionOutcome::Cancelled,
        }
    }
}

/// The live connection to one agent process.
pub(crate) struct Connection {
    pub(crate) cx: ConnectionTo<Agent>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) caps: AgentCaps,
    pid: u32,
    /// `Some(status)` once the process has exited.
    exit: watch::Receiver<Option<String>>,
    /// Dropping or firing this ends the ACP connection task (closes the agent's stdin).
    stop_connection: Mutex<Option<oneshot::Sender<()>>>,
    /// How the agent is stopped: for a local process its tree (and registry entry), killed by
    /// [`Connection::kill`] or on drop. After the agent exited, its (dead) pid still roots the
    /// tree: it has no descendants any more, and survivors (an MCP server, a background job)
    /// are found by the marker variable.
    tree: Mutex<Option<Stopper>>,
}

impl Connection {
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    pub(crate) fn exit_status(&self) -> Option<String> {
        self.exit.borrow().clone()
    }

    pub(crate) async fn wait_exit(&self) -> String {
        let mut exit = self.exit.clone();
        match exit.wait_for(Option::is_some).await {
            Ok(status) => status.clone().unwrap_or_default(),
            Err(_) => "unknown".to_owned(),
        }
    }

    /// Awaits `request` unless the process exits first; maps every failure to a [`BrainError`].
    /// A setup request (`initialize`, `session/new`, `session/resume`, `session/load`), bounded
    /// by [`SETUP_TIMEOUT`].
    pub(crate) async fn setup_call<Request: JsonRpcRequest>(
        &self,
        method: &'static str,
        request: Request,
    ) -> Result<Request::Response, BrainError> {
        self.call(
            method,
            Some(SETUP_TIMEOUT),
            self.cx.send_request(request).block_task(),
        )
        .await
    }

    pub(crate) async fn call<T>(
        &self,
        method: &'static str,
        timeout: Option<Duration>,
        request: impl std::future::Future<Output = Result<T, agent_client_protocol::Error>>,
    ) -> Result<T, BrainError> {
        let mut exit = self.exit.clone();
        let exited = async move {
            let _ = exit.wait_for(Option::is_some).await;
        };
        let limited =
            async {
                match timeout {
                    Some(limit) => tokio::time::timeout(limit, request).await.map_err(|_| {
                        BrainError::Timeout {
                            method,
                            timeout_ms: limit.as_millis() as u64,
                        }
                    }),
                    None => Ok(request.await),
                }
            };
        tokio::select! {
            biased;
            result = limited => match result? {
                Ok(value) => Ok(value),
                Err(error) => Err(self.map_error(method, error).await),
            },
            () = exited => Err(BrainError::WorkerExited {
                status: self.exit_status().unwrap_or_default(),
            }),
        }
    }

    async fn map_error(
        &self,
        method: &'static str,
        error: agent_client_protocol::Error,
    ) -> BrainError {
        let broken = agent_client_protocol::is_connection_terminated(&error)
            || agent_client_protocol::is_incoming_transport_closed(&error);
        if broken || self.exit_status().is_some() {
            let status = tokio::time::timeout(EXIT_STATUS_WAIT, self.wait_exit())
                .await
                .unwrap_or_else(|_| "connection closed".to_owned());
            return BrainError::WorkerExited { status };
        }
        BrainError::Agent {
            method,
            code: error.code.value(),
            message: error.message,
        }
    }

    /// Ends the connection and kills the process tree (SIGTERM, grace, SIGKILL). Idempotent.
    pub(crate) async fn kill(&self) {
        self.end_connection();
        let guard = self.tree.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(stopper) = guard else {
            return;
        };
        stopper.stop().await;
        let _ = tokio::time::timeout(EXIT_STATUS_WAIT, self.wait_exit()).await;
    }

    fn end_connection(&self) {
        let sender = self
            .stop_connection
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(sender) = sender {
            let _ = sender.send(());
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // A worker dropped without `close` (a pool shut down, a gateway error path) must not
        // leave an agent process behind: the tree guard kills it as it drops.
        self.end_connection();
    }
}

impl Worker {
    /// Spawns the agent and sends `initialize`, offering `fs.readTextFile`, `fs.writeTextFile`
    /// and `terminal`. Must be called inside a tokio runtime.
    pub async fn spawn(command: &AgentCommand) -> Result<Self, BrainError> {
        Self::spawn_registered(command, None).await
    }

    /// [`Worker::spawn`], listing the agent's process tree in `registry` from before it starts
    /// until it is killed, so a gateway restarted after a crash can stop it.
    pub async fn spawn_registered(
        command: &AgentCommand,
        registry: Option<&Arc<TreeRegistry>>,
    ) -> Result<Self, BrainError> {
        let marker = TreeMarker::new();
        let registered = registry.map(|registry| registry.register(&marker));
        // The gateway's environment minus Warren's own credentials, plus `--agent-env`.
        let spec = command.env.iter().fold(
            CommandSpec::new(&command.program, &marker)
                .args(&command.args)
                .env_policy(EnvPolicy::Agent),
            |spec, (name, value)| spec.env(name, value),
        );
        let options = PipeOptions {
            stdin: StdinMode::Pipe,
            output: OutputMode::Separate,
            leader: Leader::ProcessGroup,
        };
        let spawned = warren_process::spawn(&spec, Connect::Pipes(options))
            .map_err(|source| BrainError::Spawn {
                program: command.program.clone(),
                source,
            })?
            .into_pipes();
        let pid = spawned.pid();
        let tree = TreeGuard::new(
            spawned.tree.clone(),
            warren_process::stop::KILL_GRACE,
            registered,
        );
        let mut child = spawned.child;
        let (Some(stdin), Some(stderr)) = (spawned.stdin, spawned.stderr) else {
            return Err(BrainError::Spawn {
                program: command.program.clone(),
                source: std::io::Error::other("stdio pipes missing"),
            });
        };
        let exited = Box::pin(async move {
            match child.wait().await {
                Ok(status) => status.to_string(),
                Err(error) => format!("wait failed: {error}"),
            }
        });
        let io = AgentIo {
            stdin: Box::pin(stdin),
            stdout: Box::pin(spawned.stdout),
            stderr: Box::pin(stderr),
            exited,
            pid,
        };
        Self::start(io, Stopper::Tree(tree)).await
    }

    /// A worker for an agent that runs elsewhere (inside a sandbox), reached through `io`:
    /// `initialize` is sent as for a local process, and `stop` ends the agent when the worker
    /// is killed or dropped.
    pub async fn connect(io: AgentIo, stop: RemoteStop) -> Result<Self, BrainError> {
        Self::start(io, Stopper::Remote(stop)).await
    }

    async fn start(io: AgentIo, stopper: Stopper) -> Result<Self, BrainError> {
        let AgentIo {
            stdin,
            stdout,
            stderr,
            exited,
            pid,
        } = io;
        let (exit_tx, exit_rx) = watch::channel(None);
        // The agent's last stderr line usually says why it died ("API key not set"): it goes
        // into the exit status the gateway reports.
        let last_stderr_line = Arc::new(Mutex::new(String::new()));
        let n_stderr_lines = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut stderr_reader = tokio::spawn({
            let last_stderr_line = last_stderr_line.clone();
            let n_stderr_lines = Arc::clone(&n_stderr_lines);
            async move {
                use tokio::io::AsyncBufReadExt;
                let mut lines = tokio::io::BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    n_stderr_lines.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    tracing::debug!(target: "warren_brain::agent_stderr", pid, "{line}");
                    if !line.trim().is_empty() {
                        let mut last = last_stderr_line.lock().unwrap_or_else(|p| p.into_inner());
                        *last = line.chars().take(STDERR_LINE_MAX_CHARS).collect();
                    }
                }
            }
        });
        tokio::spawn(async move {
            let mut status = exited.await;
            // Bounded by the shared drain policy: a grandchild may keep the agent's stderr open.
            let drained = warren_process::stop::drain_after_exit(
                &mut stderr_reader,
                || n_stderr_lines.load(std::sync::atomic::Ordering::SeqCst),
                || 0,
            )
            .await;
            if !drained {
                stderr_reader.abort();
            }
            let last = last_stderr_line
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            if !last.is_empty() {
                status = format!("{status}; its last stderr line: {last}");
            }
            tracing::debug!(pid, %status, "agent process exited");
            let _ = exit_tx.send(Some(status));
        });

        let shared = Arc::new(Shared {
            binding: RwLock::new(None),
            cancel_generation: watch::channel(0).0,
            turn_cancelled: AtomicBool::new(false),
            replaying: AtomicBool::new(false),
        });
        let (cx_tx, cx_rx) = oneshot::channel();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let transport = ByteStreams::new(stdin.compat_write(), stdout.compat());
        let builder = client_builder(shared.clone());
        tokio::spawn(async move {
            let result = builder
                .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
                    let _ = cx_tx.send(cx.clone());
                    tokio::select! {
                        _ = stop_rx => {}
                        () = cx.incoming_closed() => {}
                    }
                    Ok(())
                })
                .await;
            if let Err(error) = result {
                tracing::debug!(pid, %error, "agent connection ended with an error");
            }
        });
        let Ok(cx) = cx_rx.await else {
            stopper.stop().await;
            return Err(BrainError::WorkerExited {
                status: "the ACP connection failed to start".into(),
            });
        };

        let mut conn = Connection {
            cx,
            shared,
            caps: AgentCaps::default(),
            pid,
            exit: exit_rx,
            stop_connection: Mutex::new(Some(stop_tx)),
            tree: Mutex::new(Some(stopper)),
        };
        let initialize = InitializeRequest::new(ProtocolVersion::V1)
            .client_capabilities(
                ClientCapabilities::new()
                    .fs(FileSystemCapabilities::new()
                        .read_text_file(true)
                        .write_text_file(true))
                    .terminal(true),
            )
            .client_info(Implementation::new("warren", env!("CARGO_PKG_VERSION")));
        let response = conn.setup_call("initialize", initialize).await;
        let response = match response {
            Ok(response) => response,
            Err(error) => {
                conn.kill().await;
                return Err(error);
            }
        };
        let capabilities = &response.agent_capabilities;
        conn.caps = AgentCaps {
            load_session: capabilities.load_session,
            resume_session: capabilities.session_capabilities.resume.is_some(),
            close_session: capabilities.session_capabilities.close.is_some(),
        };
        tracing::debug!(pid, caps = ?conn.caps, "agent initialized");
        Ok(Self {
            conn: Arc::new(conn),
        })
    }

    /// The agent process id.
    pub fn pid(&self) -> u32 {
        self.conn.pid()
    }

    /// False once the process has exited.
    pub fn is_alive(&self) -> bool {
        self.conn.exit_status().is_none()
    }

    /// Creates the ACP session (`session/new`) and binds `host` and `sink` to it.
    pub async fn new_session(
        self,
        cwd: PathBuf,
        mcp_servers: Vec<McpServerSpec>,
        host: Arc<dyn Host>,
        sink: Arc<dyn TurnSink>,
    ) -> Result<BrainSession, BrainError> {
        self.bind(host, sink);
        let request = NewSessionRequest::new(cwd).mcp_servers(to_acp_mcp(&mcp_servers));
        let conn = &self.conn;
        let response = conn.setup_call("session/new", request).await?;
        Ok(BrainSession::new(self.conn, response.session_id))
    }

    /// Continues `acp_session_id` (created by an earlier worker of the same agent):
    /// `session/resume` when advertised, else `session/load` (history replay not forwarded),
    /// else, or when those fail, a new session with [`Resumed::ContextLost`].
    pub async fn resume_session(
        self,
        acp_session_id: String,
        cwd: PathBuf,
        mcp_servers: Vec<McpServerSpec>,
        host: Arc<dyn Host>,
        sink: Arc<dyn TurnSink>,
    ) -> Result<(BrainSession, Resumed), BrainError> {
        self.bind(host, sink);
        let conn = self.conn.clone();
        let session_id = SessionId::new(acp_session_id.as_str());
        let mcp = to_acp_mcp(&mcp_servers);
        if conn.caps.resume_session {
            let request =
                ResumeSessionRequest::new(session_id.clone(), cwd.clone()).mcp_servers(mcp.clone());
            let result = conn.setup_call("session/resume", request).await;
            match result {
                Ok(_) => return Ok((BrainSession::new(self.conn, session_id), Resumed::Resumed)),
                Err(BrainError::Agent { code, message, .. }) => {
                    tracing::info!(code, %message, "session/resume refused; trying further");
                }
                Err(error) => return Err(error),
            }
        }
        if conn.caps.load_session {
            let request =
                LoadSessionRequest::new(session_id.clone(), cwd.clone()).mcp_servers(mcp.clone());
            conn.shared.replaying.store(true, Ordering::SeqCst);
            let result = conn.setup_call("session/load", request).await;
            conn.shared.replaying.store(false, Ordering::SeqCst);
            match result {
                Ok(_) => return Ok((BrainSession::new(self.conn, session_id), Resumed::Loaded)),
                Err(BrainError::Agent { code, message, .. }) => {
                    tracing::info!(code, %message, "session/load refused; starting a new session");
                }
                Err(error) => return Err(error),
            }
        }
        let request = NewSessionRequest::new(cwd).mcp_servers(mcp);
        let response = conn.setup_call("session/new", request).await?;
        Ok((
            BrainSession::new(self.conn, response.session_id),
            Resumed::ContextLost,
        ))
    }

    /// Stops the process (used for workers that never got a session).
    pub async fn kill(self) {
        self.conn.kill().await;
    }

    fn bind(&self, host: Arc<dyn Host>, sink: Arc<dyn TurnSink>) {
        let mut binding = self
            .conn
            .shared
            .binding
            .write()
            .unwrap_or_else(|p| p.into_inner());
        *binding = Some(Binding { host, sink });
    }
}

fn to_acp_mcp(servers: &[McpServerSpec]) -> Vec<McpServer> {
    servers
        .iter()
        .map(|server| {
            McpServer::Stdio(
                McpServerStdio::new(server.name.clone(), server.command.clone())
                    .args(server.args.clone())
                    .env(
                        server
                            .env
                            .iter()
                            .map(|(k, v)| EnvVariable::new(k, v))
                            .collect(),
                    ),
            )
        })
        .collect()
}

fn host_error(error: HostError) -> agent_client_protocol::Error {
    let code = match error {
        HostError::NotFound(_) => ErrorCode::RESOURCE_NOT_FOUND,
        HostError::Invalid(_) => ErrorCode::INVALID_PARAMS,
        HostError::Failed(_) => ErrorCode::INTERNAL_ERROR,
    };
    agent_client_protocol::Error::new(code, error.to_string())
}

/// Answers `responder` from a task outside the dispatch loop, with the session's host.
fn serve_host<T, F, Fut>(shared: &Arc<Shared>, responder: Responder<T>, work: F)
where
    T: JsonRpcResponse + Send + 'static,
    F: FnOnce(Arc<dyn Host>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T, HostError>> + Send + 'static,
{
    let host = shared.host();
    tokio::spawn(async move {
        let result = match host {
            Some(host) => work(host).await.map_err(host_error),
            None => Err(agent_client_protocol::Error::new(
                ErrorCode::INVALID_REQUEST,
                "no session has been created on this connection yet",
            )),
        };
        let _ = responder.respond_with_result(result);
    });
}

fn exit_status(exit: TerminalExit) -> TerminalExitStatus {
    TerminalExitStatus::new()
        .exit_code(exit.exit_code)
        .signal(exit.signal)
}

/// Registers the handler of one host-served request on a client builder: the handler answers
/// from `$work`, run on the session's host in a task of its own (see [`serve_host`]).
macro_rules! on_host_request {
    ($builder:expr, $shared:expr, |$host:ident, $request:ident: $Request:ty| $work:block) => {{
        let shared = $shared.clone();
        $builder.on_receive_request(
            async move |$request: $Request, responder, _cx| {
                serve_host(&shared, responder, move |$host| async move { $work });
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
    }};
}

fn client_builder(
    shared: Arc<Shared>,
) -> agent_client_protocol::v1::Builder<Client, impl agent_client_protocol::HandleDispatchFrom<Agent>>
{
    let on_update = shared.clone();
    let on_permission = shared.clone();
    let builder = Client
        .v1()
        .name("warren-gateway")
        .on_receive_notification(
            async move |notification: RawSessionUpdate, _cx| {
                on_update.on_update(notification);
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: RawPermissionRequest, responder, _cx| {
                let shared = on_permission.clone();
                tokio::spawn(async move {
                    let outcome = shared.ask_permission(request).await;
                    let _ = responder.respond(RequestPermissionResponse::new(outcome));
                });
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        );
    let builder = on_host_request!(builder, shared, |host, request: ReadTextFileRequest| {
        let content = host
            .read_text_file(request.path, request.line, request.limit)
            .await?;
        Ok(ReadTextFileResponse::new(content))
    });
    let builder = on_host_request!(builder, shared, |host, request: WriteTextFileRequest| {
        host.write_text_file(request.path, request.content).await?;
        Ok(WriteTextFileResponse::new())
    });
    let builder = on_host_request!(builder, shared, |host, request: CreateTerminalRequest| {
        let spec = TerminalSpec {
            command: request.command,
            args: request.args,
            env: request
                .env
                .into_iter()
                .map(|var| (var.name, var.value))
                .collect(),
            cwd: request.cwd,
            output_byte_limit: request.output_byte_limit,
        };
        let terminal_id = host.create_terminal(spec).await?;
        Ok(CreateTerminalResponse::new(TerminalId::new(terminal_id)))
    });
    let builder = on_host_request!(builder, shared, |host, request: TerminalOutputRequest| {
        let output = host
            .terminal_output(request.terminal_id.0.to_string())
            .await?;
        Ok(TerminalOutputResponse::new(output.output, output.truncated)
            .exit_status(output.exit.map(exit_status)))
    });
    let builder = on_host_request!(
        builder,
        shared,
        |host, request: WaitForTerminalExitRequest| {
            let exit = host
                .wait_for_terminal_exit(request.terminal_id.0.to_string())
                .await?;
            Ok(WaitForTerminalExitResponse::new(exit_status(exit)))
        }
    );
    let builder = on_host_request!(builder, shared, |host, request: KillTerminalRequest| {
        host.kill_terminal(request.terminal_id.0.to_string())
            .await?;
        Ok(KillTerminalResponse::new())
    });
    on_host_request!(builder, shared, |host, request: ReleaseTerminalRequest| {
        host.release_terminal(request.terminal_id.0.to_string())
            .await?;
        Ok(ReleaseTerminalResponse::new())
    })
}

/// `session/close`, bounded; errors are logged, the caller kills the worker next.
pub(crate) async fn close_session(conn: &Connection, session_id: SessionId) {
    if !conn.caps.close_session || conn.exit_status().is_some() {
        return;
    }
    let request = CloseSessionRequest::new(session_id);
    if let Err(error) = conn
        .call(
            "session/close",
            Some(CLOSE_TIMEOUT),
            conn.cx.send_request(request).block_task(),
        )
        .await
    {
        tracing::debug!(%error, "session/close failed; killing the worker");
    }
}
