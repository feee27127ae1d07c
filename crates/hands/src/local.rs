//! The local provider: each session's hands are `warren execd` on this machine, inside a
//! bubblewrap sandbox (`warren-sandbox`: user, pid, mount, ipc, uts and optionally net
//! namespaces, seccomp, no capabilities, an unprivileged uid, the workspace its only writable
//! mount besides a private `/tmp`) or, where `--hands-isolation auto` finds no working bwrap,
//! unconfined with a loud warning. Each sandbox gets its own cgroup where the host has them
//! (freezing for pause, `--hands-memory` / `--hands-pids`, killing everything at once).
//!
//! Transport: execd listens on a Unix socket in the session's run directory
//! (`<data>/run/hands/<id>/execd.sock`, bound at `/run/warren` inside), the only part of the
//! data directory the sandbox sees. The access token and the instance's nonce reach execd
//! through a pipe it reads and closes at start (never argv or the environment, which
//! `/proc` would show inside), and execd makes itself non-dumpable.
//!
//! Hands outlive the gateway: they get no parent-death signal, lead their own session, and are
//! described by a record (`<data>/run/hands/<id>.json`: pid and its start time, nonce, token,
//! cgroup) that the next gateway reads to adopt them ([`HandsProvider::adopt`]). An instance
//! whose pid is gone, or whose execd reports another nonce, is stopped and never taken for the
//! session's hands.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncBufReadExt;
use tokio::sync::watch;
use warren_brain::BoxFuture;
use warren_process::pipes::{Leader, OutputMode, PipeOptions, StdinMode};
use warren_process::{CommandSpec, Connect, EnvPolicy, HandsVar, TreeId, TreeMarker};
use warren_sandbox::{CgroupRoots, HandsCgroup, Limits, Network, SandboxSpec};
use warren_store::objects::Objects;

use super::{HandsEndpoint, HandsError, HandsInstance, HandsProvider, Isolation, StartSpec};

/// How long a starting execd may take to print its address.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// SIGTERM grace when stopping unconfined hands (a sandbox's cgroup is killed at once).
const STOP_GRACE: Duration = Duration::from_secs(2);
/// How long a killed sandbox's cgroup may take to empty before it is removed.
const CGROUP_EMPTY_WAIT: Duration = Duration::from_secs(10);
/// How often an adopted sandbox's pid and every sandbox's limit counters are checked.
const WATCH_PERIOD: Duration = Duration::from_millis(250);
/// The fd execd reads its secrets from (`--secrets-fd`); the sandbox's own fds are 3 to 9.
const SECRETS_FD: i32 = 10;
/// Where the `warren` binary is inside a sandbox.
const INNER_WARREN: &str = "/opt/warren/bin/warren";
/// The workspace and run directory inside a sandbox.
const INNER_WORKSPACE: &str = "/workspace";
const INNER_RUN: &str = "/run/warren";
const SOCKET_NAME: &str = "execd.sock";

/// `--hands-isolation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum IsolationMode {
    /// bwrap when it is installed and works, else unconfined with a warning.
    Auto,
    /// bwrap or no hands (503 `HANDS_UNAVAILABLE`).
    Bwrap,
    /// Unconfined: only the environment allowlist holds.
    None,
}

/// `--hands-network` (network.md "Modes").
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NetworkMode {
    /// A network namespace of their own, loopback only; egress only through the session's
    /// egress proxy ([`EGRESS_SOCKET`], at [`EGRESS_PORT`] inside).
    Private,
    /// A namespace of their own, loopback only, no proxy (the model proxy still works).
    None,
    /// The host's network, shared with every other session.
    Host,
}

impl NetworkMode {
    pub fn label(self) -> &'static str {
        match self {
            NetworkMode::Private => "private",
            NetworkMode::None => "none",
            NetworkMode::Host => "host",
        }
    }
}

/// The file name of the model proxy's socket in a session's run directory (served by the
/// gateway), at `/run/warren/model.sock` inside the sandbox.
pub const MODEL_SOCKET: &str = "model.sock";
/// The sandbox-local port the hands' execd forwards to the model socket.
pub const MODEL_PORT: u16 = 4180;
/// The file name of the session's egress proxy socket in its run directory.
pub const EGRESS_SOCKET: &str = "egress.sock";
/// The sandbox-local port the hands' execd forwards to the egress socket.
pub const EGRESS_PORT: u16 = 3128;
/// Where tools in the hands find the egress proxy.
const EGRESS_URL: &str = "http://127.0.0.1:3128";

/// What the hands' tools need to send their connections through the egress proxy (each is set
/// unless `--hands-env` sets it; docs/network.md lists them): the common proxy variables in both
/// cases (curl, git, pip, Python, Go, cargo, apt, Deno, Bun), Node's switch to honour them in
/// `fetch` and `http`, and npm's, pip's and cargo's own settings.
fn proxy_env() -> Vec<(String, String)> {
    let no_proxy = "localhost,127.0.0.1,::1";
    let mut vars = Vec::new();
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        vars.push((name.to_owned(), EGRESS_URL.to_owned()));
        vars.push((name.to_lowercase(), EGRESS_URL.to_owned()));
    }
    vars.push(("NO_PROXY".to_owned(), no_proxy.to_owned()));
    vars.push(("no_proxy".to_owned(), no_proxy.to_owned()));
    for name in [
        "npm_config_proxy",
        "npm_config_https_proxy",
        "PIP_PROXY",
        "CARGO_HTTP_PROXY",
    ] {
        vars.push((name.to_owned(), EGRESS_URL.to_owned()));
    }
    vars.push(("NODE_USE_ENV_PROXY".to_owned(), "1".to_owned()));
    vars
}

/// What the hands' tools need to trust the egress proxy's certificates for credentialed hosts
/// (the host's bundle with the gateway's CA, bound over the host's path): each common tool's
/// own variable, unless `--hands-env` sets it (docs/network.md lists them).
fn trust_env() -> Vec<(String, String)> {
    [
        "SSL_CERT_FILE",
        "NODE_EXTRA_CA_CERTS",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "GIT_SSL_CAINFO",
        "PIP_CERT",
        "CARGO_HTTP_CAINFO",
        "npm_config_cafile",
        "DENO_CERT",
    ]
    .into_iter()
    .map(|name| (name.to_owned(), warren_sandbox::TRUST_BUNDLE.to_owned()))
    .collect()
}

/// What the local provider needs.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// The `warren` binary (its `execd` subcommand runs in the hands).
    pub warren_bin: PathBuf,
    /// `<data>/run/hands`: records and per-session run directories.
    pub run_dir: PathBuf,
    pub isolation: IsolationMode,
    /// The bwrap program; `None` looks for `bwrap` on PATH.
    pub bwrap: Option<PathBuf>,
    pub network: NetworkMode,
    /// The unprivileged host uid (and gid) the sandbox runs as when the gateway is root.
    pub uid: u32,
    pub memory_bytes: Option<u64>,
    pub pids: Option<u64>,
    /// `--hands-env`.
    pub env: Vec<HandsVar>,
    /// The directory the agent that runs in the hands is installed in (bound read-only at
    /// `/opt/warren/agent`), when it is not under `/usr`.
    pub agent_prefix: Option<PathBuf>,
    /// `--snapshots`: the object storage the sessions' snapshots are kept in.
    pub snapshots: Option<Objects>,
    /// The certificates sandboxes with a private network trust (the host's and the gateway's
    /// egress CA), when the gateway has credentials.
    pub trust_bundle: Option<PathBuf>,
}

impl LocalConfig {
    /// The flags' defaults: `--hands-isolation auto`, `--hands-network private`, `--hands-uid
    /// 1000`, no limits, no `--hands-env`.
    pub fn with_defaults(warren_bin: PathBuf, run_dir: PathBuf) -> LocalConfig {
        LocalConfig {
            warren_bin,
            run_dir,
            isolation: IsolationMode::Auto,
            bwrap: None,
            network: NetworkMode::Private,
            uid: 1000,
            memory_bytes: None,
            pids: None,
            env: Vec::new(),
            agent_prefix: None,
            snapshots: None,
            trust_bundle: None,
        }
    }
}

/// The local provider (see the module docs).
pub struct LocalHands {
    config: LocalConfig,
    /// How hands are confined here, decided once at start.
    isolation: Isolation,
    bwrap: Option<PathBuf>,
    /// Why hands cannot start (`--hands-isolation bwrap` without a working bwrap).
    unavailable: Option<String>,
    cgroups: CgroupRoots,
}

/// `<data>/run/hands/<id>.json`: what the next gateway needs to adopt a sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    session_id: String,
    pid: u32,
    /// The pid's start time (clock ticks after boot), so a reused pid is never taken for it.
    start_time: u64,
    nonce: String,
    token: String,
    isolation: String,
    /// The cgroup name, when the sandbox has one.
    cgroup: Option<String>,
    marker: String,
    root: String,
}

impl LocalHands {
    /// The network these hands get: `--hands-network`, except that unconfined hands share
    /// the host's whatever was asked.
    pub fn network(&self) -> NetworkMode {
        match self.isolation {
            Isolation::Bwrap => self.config.network,
            Isolation::None | Isolation::Remote => NetworkMode::Host,
        }
    }

    /// Decides the isolation (probing bwrap once) and finds the cgroups. Never fails: a missing
    /// bwrap under `--hands-isolation bwrap` makes every start answer `HANDS_UNAVAILABLE`.
    pub async fn new(config: LocalConfig) -> LocalHands {
        let cgroups = CgroupRoots::discover();
        tracing::info!(cgroups = %cgroups.describe(), "hands cgroups");
        let found = config.bwrap.clone().or_else(warren_sandbox::find_bwrap);
        let probed = match &found {
            Some(bwrap) => warren_sandbox::probe(bwrap).await,
            None => Err("bwrap (Debian package bubblewrap) is not installed".to_string()),
        };
        let (isolation, bwrap, unavailable) = match (config.isolation, probed) {
            (IsolationMode::None, _) => (Isolation::None, None, None),
            (_, Ok(())) => (Isolation::Bwrap, found, None),
            (IsolationMode::Bwrap, Err(why)) => {
                tracing::error!(%why, "--hands-isolation bwrap: bwrap does not work here; hands cannot start");
                (Isolation::Bwrap, None, Some(why))
            }
            (IsolationMode::Auto, Err(why)) => (Isolation::None, None, Some(why)),
        };
        let unavailable = match (config.isolation, unavailable) {
            (IsolationMode::Auto, Some(why)) => {
                tracing::warn!(
                    %why,
                    "HANDS RUN UNCONFINED: bwrap does not work here, so a model's commands run \
                     as the gateway's user with the host's files in view. Install bubblewrap \
                     (or pass --hands-isolation bwrap to refuse to run without it)."
                );
                None
            }
            (_, unavailable) => unavailable,
        };
        if config.isolation == IsolationMode::None {
            tracing::warn!(
                "HANDS RUN UNCONFINED (--hands-isolation none): a model's commands run as the \
                 gateway's user with the host's files in view"
            );
        }
        if config.network == NetworkMode::Host {
            tracing::warn!(
                "HANDS SHARE THE HOST'S NETWORK (--hands-network host): every session's commands \
                 reach each other's ports, the gateway, this host's loopback services and the \
                 LAN, with no egress policy. --hands-network private gives each its own."
            );
        } else if isolation != Isolation::Bwrap {
            tracing::warn!(
                network = config.network.label(),
                "HANDS SHARE THE HOST'S NETWORK: --hands-network {} needs bwrap, and these hands \
                 run unconfined",
                config.network.label()
            );
        }
        LocalHands {
            config,
            isolation,
            bwrap,
            unavailable,
            cgroups,
        }
    }

    fn record_path(&self, session_id: &str) -> PathBuf {
        self.config.run_dir.join(format!("{session_id}.json"))
    }

    fn session_run_dir(&self, session_id: &str) -> PathBuf {
        self.config.run_dir.join(session_id)
    }

    /// The host uid and gid the sandbox runs as: `--hands-uid` when the gateway is root (and
    /// can switch), else the gateway's own, which is not root.
    fn sandbox_ids(&self) -> Option<(u32, u32)> {
        let root = rustix::process::geteuid().is_root();
        (root && self.isolation == Isolation::Bwrap).then_some((self.config.uid, self.config.uid))
    }

    async fn start_local(&self, spec: &StartSpec) -> Result<LocalInstance, HandsError> {
        if let Some(why) = &self.unavailable {
            return Err(HandsError::Unavailable(why.clone()));
        }
        let fail = |what: &str, error: &dyn std::fmt::Display| {
            HandsError::Start(format!("{what}: {error}"))
        };
        let ids = self.sandbox_ids();
        let run_dir = self.session_run_dir(&spec.session_id);
        let workspace = spec.workspace.clone();
        let prepared = {
            let run_dir = run_dir.clone();
            let agent_home = spec.agent_home.clone();
            tokio::task::spawn_blocking(move || {
                prepare_dirs(&workspace, agent_home.as_deref(), &run_dir, ids)
            })
            .await
            .map_err(|e| fail("cannot prepare the hands", &e))?
        };
        prepared.map_err(|e| fail("cannot prepare the workspace", &e))?;
        // What an earlier instance of this session left (a stale record, a cgroup) goes first.
        self.stop_recorded(&spec.session_id).await;

        let nonce = hex::encode(rand::random::<[u8; 16]>());
        let marker = TreeMarker::new();
        let cgroup_name = format!("{}-{}", spec.session_id, &nonce[..8]);
        let limits = Limits {
            memory_bytes: self.config.memory_bytes,
            pids: self.config.pids,
        };
        let roots = &self.cgroups;
        let any_hierarchy = roots.v2.is_some()
            || roots.freezer.is_some()
            || roots.memory.is_some()
            || roots.pids.is_some();
        let cgroup = if any_hierarchy {
            match HandsCgroup::create(&self.cgroups, &cgroup_name, &limits) {
                Ok(cgroup) => Some(cgroup),
                Err(e) => {
                    tracing::warn!(error = %e, "no cgroup for the hands: pause falls back to SIGSTOP and limits are off");
                    None
                }
            }
        } else {
            None
        };
        // Whatever fails from here to the spawn must not leave the new cgroup behind.
        let built = self.build_command(spec, &run_dir, ids, &marker, &nonce, cgroup.as_ref());
        let command = match built {
            Ok(command) => command,
            Err(e) => {
                if let Some(cgroup) = cgroup {
                    remove_cgroup(cgroup).await;
                }
                return Err(e);
            }
        };
        let (command, root) = command;
        let options = PipeOptions {
            stdin: StdinMode::Null,
            output: OutputMode::Separate,
            leader: Leader::ProcessGroup,
        };
        let spawned = match warren_process::spawn(&command, Connect::Pipes(options)) {
            Ok(spawned) => spawned.into_pipes(),
            Err(e) => {
                if let Some(cgroup) = cgroup {
                    remove_cgroup(cgroup).await;
                }
                return Err(fail("cannot start the hands", &e));
            }
        };
        let pid = spawned.pid();
        let tree = spawned.tree.clone();
        let mut child = spawned.child;
        let (exit_tx, exit_rx) = watch::channel(None);
        let limit_hit: Arc<Mutex<Option<String>>> = Arc::default();
        let why_limit = limit_hit.clone();
        tokio::spawn(async move {
            let status = match child.wait().await {
                Ok(status) => status.to_string(),
                Err(error) => format!("wait failed: {error}"),
            };
            let why = match why_limit.lock().map(|hit| hit.clone()) {
                Ok(Some(limit)) => limit,
                _ => format!("the sandbox exited ({status})"),
            };
            tracing::debug!(pid, %why, "hands exited");
            let _ = exit_tx.send(Some(why));
        });
        if let Some(stderr) = spawned.stderr {
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::debug!(target: "warren_gateway::hands_stderr", pid, "{line}");
                }
            });
        }
        let mut instance = LocalInstance {
            endpoint: HandsEndpoint {
                url: format!("unix:{}", run_dir.join(SOCKET_NAME).display()),
                token: spec.token.clone(),
                nonce: nonce.clone(),
            },
            root,
            isolation: self.isolation,
            tree,
            cgroup: cgroup.map(Arc::new),
            exit: exit_rx,
            record: self.record_path(&spec.session_id),
            run_dir,
            watchers: Vec::new(),
            frozen: Default::default(),
        };
        // Recorded at once, before execd is up: a gateway killed while the sandbox starts leaves
        // a record, so the next one stops (or adopts) it rather than never learning of it.
        let start_time = warren_process::procfs::stat(pid as i32)
            .map(|stat| stat.start_time)
            .unwrap_or_default();
        let record = Record {
            session_id: spec.session_id.clone(),
            pid,
            start_time,
            nonce,
            token: spec.token.clone(),
            isolation: self.isolation.label().to_string(),
            cgroup: instance.cgroup.as_ref().map(|_| cgroup_name.clone()),
            marker: marker.to_string(),
            root: instance.root.clone(),
        };
        if let Err(e) = write_record(&instance.record, &record) {
            tracing::warn!(error = %e, "cannot write the hands record; a restarted gateway will not adopt these hands");
        }
        let mut stdout = tokio::io::BufReader::new(spawned.stdout).lines();
        let first_line = tokio::time::timeout(START_TIMEOUT, stdout.next_line()).await;
        let listening = matches!(
            &first_line,
            Ok(Ok(Some(line))) if line.starts_with("warren execd listening on ")
        );
        if !listening {
            let why = instance.exit.borrow().clone();
            Box::new(instance).stop().await;
            return Err(HandsError::Start(format!(
                "execd did not start{}",
                why.map(|why| format!(" ({why})")).unwrap_or_default()
            )));
        }
        // Keep draining stdout so execd never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = stdout.next_line().await {} });
        if let Err(e) = check_identity(&instance.endpoint).await {
            Box::new(instance).stop().await;
            return Err(e);
        }
        instance.watch_limits(limit_hit);
        tracing::info!(
            pid,
            session = %spec.session_id,
            isolation = self.isolation.label(),
            "hands started"
        );
        Ok(instance)
    }

    /// The command that starts the sandbox (bwrap, or execd unconfined) and execd's view of the
    /// workspace.
    fn build_command(
        &self,
        spec: &StartSpec,
        run_dir: &Path,
        ids: Option<(u32, u32)>,
        marker: &TreeMarker,
        nonce: &str,
        cgroup: Option<&HandsCgroup>,
    ) -> Result<(CommandSpec, String), HandsError> {
        let fail = |what: &str, error: &dyn std::fmt::Display| {
            HandsError::Start(format!("{what}: {error}"))
        };
        let secrets = secrets_pipe(&spec.token, nonce)
            .map_err(|e| fail("cannot pass the hands their secrets", &e))?;
        let (command, root) = match self.isolation {
            Isolation::Bwrap => {
                let bwrap = self
                    .bwrap
                    .clone()
                    .ok_or_else(|| HandsError::Unavailable("bwrap not found".into()))?;
                let sandbox = SandboxSpec {
                    bwrap,
                    workspace: open_path(&spec.workspace)
                        .map_err(|e| fail("cannot open the workspace", &e))?,
                    run_dir: open_path(run_dir).map_err(|e| fail("cannot open the run dir", &e))?,
                    warren_bin: open_path(&self.config.warren_bin)
                        .map_err(|e| fail("cannot open the warren binary", &e))?,
                    home: match &spec.agent_home {
                        Some(home) => Some(
                            open_path(home).map_err(|e| fail("cannot open the agent home", &e))?,
                        ),
                        None => None,
                    },
                    agent_prefix: match &self.config.agent_prefix {
                        Some(prefix) => Some(
                            open_path(prefix)
                                .map_err(|e| fail("cannot open the agent's install prefix", &e))?,
                        ),
                        None => None,
                    },
                    network: match self.config.network {
                        NetworkMode::Host => Network::Host,
                        NetworkMode::None | NetworkMode::Private => Network::None,
                    },
                    uid: ids.map(|(uid, _)| uid),
                    gid: ids.map(|(_, gid)| gid),
                    seccomp: warren_sandbox::seccomp_memfd()
                        .map_err(|e| fail("cannot build the seccomp filter", &e))?,
                    cgroup_procs: cgroup.map(HandsCgroup::procs_files).unwrap_or_default(),
                    extra_env: self.config.env.clone(),
                    env_defaults: match (self.config.network, &self.config.trust_bundle) {
                        (NetworkMode::Private, Some(_)) => {
                            proxy_env().into_iter().chain(trust_env()).collect()
                        }
                        (NetworkMode::Private, None) => proxy_env(),
                        (NetworkMode::None | NetworkMode::Host, _) => Vec::new(),
                    },
                    trust_bundle: match (self.config.network, &self.config.trust_bundle) {
                        (NetworkMode::Private, Some(bundle)) => Some(
                            open_path(bundle)
                                .map_err(|e| fail("cannot open the trust bundle", &e))?,
                        ),
                        _ => None,
                    },
                };
                let socket = format!("unix:{INNER_RUN}/{SOCKET_NAME}");
                let mut args = execd_args(&socket, INNER_WORKSPACE);
                if spec.agent_home.is_some() {
                    args.extend(["--home".into(), warren_sandbox::HOME.into()]);
                }
                if self.config.network != NetworkMode::Host {
                    // The agent's way to the model proxy (the gateway's model socket).
                    args.extend([
                        "--forward".into(),
                        format!("127.0.0.1:{}=unix:{INNER_RUN}/{}", MODEL_PORT, MODEL_SOCKET)
                            .into(),
                    ]);
                }
                if self.config.network == NetworkMode::Private {
                    // Every other way out: the session's egress proxy (the gateway's network).
                    args.extend([
                        "--forward".into(),
                        format!("127.0.0.1:{EGRESS_PORT}=unix:{INNER_RUN}/{EGRESS_SOCKET}").into(),
                    ]);
                }
                (
                    sandbox.command(marker, INNER_WARREN, &args),
                    INNER_WORKSPACE.to_string(),
                )
            }
            Isolation::None | Isolation::Remote => {
                let root = std::fs::canonicalize(&spec.workspace)
                    .map_err(|e| fail("cannot resolve the workspace", &e))?;
                let socket = format!("unix:{}", run_dir.join(SOCKET_NAME).display());
                let root_text = root.to_string_lossy().into_owned();
                let mut args = execd_args(&socket, &root_text);
                if let Some(home) = &spec.agent_home {
                    args.extend(["--home".into(), home.clone().into_os_string()]);
                }
                let mut command = CommandSpec::new(&self.config.warren_bin, marker)
                    .args(args)
                    .cwd(&root)
                    .env_policy(EnvPolicy::Hands {
                        pass: self.config.env.clone(),
                    });
                if let Some(home) = &spec.agent_home {
                    command = command.env("HOME", home);
                }
                let command = command
                    .join_cgroups(cgroup.map(HandsCgroup::procs_files).unwrap_or_default())
                    .outlive_daemon();
                (command, root_text)
            }
        };
        Ok((command.fd(SECRETS_FD, secrets), root))
    }

    /// Stops whatever a record says runs for `session_id` (any instance, adopted or stale),
    /// removes its cgroup and the record.
    async fn stop_recorded(&self, session_id: &str) {
        let path = self.record_path(session_id);
        let cgroups = self.cgroups.clone();
        let _ = tokio::task::spawn_blocking(move || stop_record_blocking(&cgroups, &path)).await;
    }

    async fn adopt_local(&self, session_id: &str) -> Result<Option<LocalInstance>, HandsError> {
        let path = self.record_path(session_id);
        let Some(record) = read_record(&path) else {
            return Ok(None);
        };
        let cgroup = record
            .cgroup
            .as_deref()
            .and_then(|name| HandsCgroup::open(&self.cgroups, name));
        if !same_process(record.pid, record.start_time) {
            // What is left of it (its cgroup, a job that outlived the root) goes with the record.
            drop(cgroup);
            self.stop_recorded(session_id).await;
            return Err(HandsError::Failed(
                "the hands an earlier gateway left have exited".into(),
            ));
        }
        let run_dir = self.session_run_dir(session_id);
        let endpoint = HandsEndpoint {
            url: format!("unix:{}", run_dir.join(SOCKET_NAME).display()),
            token: record.token.clone(),
            nonce: record.nonce.clone(),
        };
        let cgroup = cgroup.map(Arc::new);
        // A frozen execd cannot answer: thaw for the check, freeze again after.
        let was_frozen = cgroup.as_ref().is_some_and(|c| c.is_frozen());
        if let Some(cgroup) = &cgroup {
            let _ = cgroup.thaw();
        } else {
            warren_process::signal_tree(
                &TreeId::new(record.pid as i32, Some(record.marker.clone())),
                rustix::process::Signal::CONT,
            );
        }
        if let Err(e) = check_identity(&endpoint).await {
            tracing::error!(session = session_id, error = %e, "refusing to adopt hands: they do not prove their identity; stopping them");
            drop(cgroup);
            self.stop_recorded(session_id).await;
            return Err(e);
        }
        let isolation = match record.isolation.as_str() {
            "bwrap" => Isolation::Bwrap,
            _ => Isolation::None,
        };
        let (exit_tx, exit_rx) = watch::channel(None);
        let pid = record.pid;
        let start_time = record.start_time;
        let watcher = tokio::spawn(async move {
            loop {
                tokio::time::sleep(WATCH_PERIOD).await;
                if !same_process(pid, start_time) {
                    let _ = exit_tx.send(Some("the sandbox exited".into()));
                    return;
                }
            }
        });
        let mut instance = LocalInstance {
            endpoint,
            root: record.root.clone(),
            isolation,
            tree: TreeId::new(record.pid as i32, Some(record.marker.clone())),
            cgroup,
            exit: exit_rx,
            record: path,
            run_dir,
            watchers: vec![watcher],
            frozen: Default::default(),
        };
        instance.watch_limits(Arc::default());
        // Paused hands stay paused; hands a killed gateway left running stay running.
        if was_frozen && let Err(e) = instance.freeze_now().await {
            tracing::warn!(session = session_id, error = %e, "cannot freeze adopted hands again");
        }
        tracing::info!(
            session = session_id,
            pid,
            "adopted hands an earlier gateway left"
        );
        Ok(Some(instance))
    }
}

/// Stops every sandbox recorded under `run_dir` (`<data>/run/hands`) and removes the records:
/// for a process that owns a data directory and wants no hands left behind (tests, a gateway
/// told to clean up). Blocking; kills by cgroup or by the recorded pid and marker.
pub fn stop_left_hands_blocking(run_dir: &Path) -> usize {
    let cgroups = CgroupRoots::discover();
    let Ok(entries) = std::fs::read_dir(run_dir) else {
        return 0;
    };
    let mut n_stopped = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        if stop_record_blocking(&cgroups, &path) {
            n_stopped += 1;
        }
    }
    n_stopped
}

/// Stops the sandbox the record at `path` describes and removes the record: its whole cgroup
/// when it has one, else its process tree by marker (rooted at the recorded pid only while that
/// pid is still the process that started then). False when there was no readable record.
fn stop_record_blocking(cgroups: &CgroupRoots, path: &Path) -> bool {
    let Some(record) = read_record(path) else {
        return false;
    };
    let cgroup = record
        .cgroup
        .as_deref()
        .and_then(|name| HandsCgroup::open(cgroups, name));
    match cgroup {
        Some(cgroup) => remove_cgroup_blocking(cgroup),
        None => {
            let root = if same_process(record.pid, record.start_time) {
                record.pid as i32
            } else {
                0
            };
            let tree = TreeId::new(root, Some(record.marker.clone()));
            // Stopped processes never act on SIGTERM: wake a paused tree first.
            warren_process::signal_tree(&tree, rustix::process::Signal::CONT);
            warren_process::kill_tree_blocking(&tree, STOP_GRACE);
        }
    }
    let _ = std::fs::remove_file(path);
    true
}

/// Kills what is left in `cgroup`, waits (bounded) until the kernel emptied it (`cgroup.kill`
/// is asynchronous) and removes it, so no empty cgroup is left behind.
fn remove_cgroup_blocking(cgroup: HandsCgroup) {
    let _ = cgroup.kill_all();
    // Exits take longer on a loaded machine; the wait ends as soon as the cgroup is empty.
    let deadline = std::time::Instant::now() + CGROUP_EMPTY_WAIT;
    while !cgroup.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if let Err(e) = cgroup.remove() {
        tracing::warn!(error = %e, "cannot remove a hands cgroup");
    }
}

async fn remove_cgroup(cgroup: HandsCgroup) {
    let _ = tokio::task::spawn_blocking(move || remove_cgroup_blocking(cgroup)).await;
}

/// The execd command line in the hands; its secrets come through [`SECRETS_FD`].
fn execd_args(listen: &str, root: &str) -> Vec<OsString> {
    [
        "execd",
        "--listen",
        listen,
        "--root",
        root,
        "--secrets-fd",
        &SECRETS_FD.to_string(),
    ]
    .into_iter()
    .map(OsString::from)
    .collect()
}

/// A pipe holding the token and nonce (execd reads it to the end and closes it; whatever else
/// holds the read end afterwards finds it empty).
fn secrets_pipe(token: &str, nonce: &str) -> std::io::Result<Arc<OwnedFd>> {
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let secrets = format!("EXECD_ACCESS_TOKEN={token}\nWARREN_HANDS_NONCE={nonce}\n");
    let mut file = std::fs::File::from(write);
    std::io::Write::write_all(&mut file, secrets.as_bytes())?;
    drop(file);
    Ok(Arc::new(read))
}

fn open_path(path: &Path) -> std::io::Result<Arc<OwnedFd>> {
    let fd = rustix::fs::open(
        path,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    Ok(Arc::new(fd))
}

/// The workspace and the agent's home (owned by the sandbox's uid, so it can write there) and
/// the session's run directory (the same, mode 0700, with no stale socket).
fn prepare_dirs(
    workspace: &Path,
    agent_home: Option<&Path>,
    run_dir: &Path,
    ids: Option<(u32, u32)>,
) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(workspace)?;
    if let Some(home) = agent_home {
        std::fs::create_dir_all(home)?;
        std::fs::set_permissions(home, std::fs::Permissions::from_mode(0o700))?;
        if let Some((uid, gid)) = ids {
            std::os::unix::fs::chown(home, Some(uid), Some(gid))?;
        }
    }
    std::fs::create_dir_all(run_dir)?;
    std::fs::set_permissions(run_dir, std::fs::Permissions::from_mode(0o700))?;
    match std::fs::remove_file(run_dir.join(SOCKET_NAME)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    if let Some((uid, gid)) = ids {
        std::os::unix::fs::chown(workspace, Some(uid), Some(gid))?;
        std::os::unix::fs::chown(run_dir, Some(uid), Some(gid))?;
    }
    Ok(())
}

async fn check_identity(endpoint: &HandsEndpoint) -> Result<(), HandsError> {
    let client = endpoint.client()?;
    match client.identity().await {
        Ok(identity) if identity.nonce == endpoint.nonce => Ok(()),
        Ok(identity) => Err(HandsError::IdentityMismatch(format!(
            "expected nonce {}, the execd at {} reports {}",
            endpoint.nonce, endpoint.url, identity.nonce
        ))),
        Err(e) if e.code() == Some("HANDS_IDENTITY_MISMATCH") => Err(HandsError::IdentityMismatch(
            format!("the execd at {} is another sandbox: {e}", endpoint.url),
        )),
        Err(e) => Err(HandsError::Start(format!(
            "the hands at {} do not answer: {e}",
            endpoint.url
        ))),
    }
}

/// True while `pid` is the process that started at `start_time` (not a zombie).
fn same_process(pid: u32, start_time: u64) -> bool {
    warren_process::procfs::stat(pid as i32)
        .is_some_and(|stat| stat.start_time == start_time && !stat.is_zombie())
}

fn read_record(path: &Path) -> Option<Record> {
    let bytes = std::fs::read(path).ok()?;
    match serde_json::from_slice(&bytes) {
        Ok(record) => Some(record),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "unreadable hands record ignored");
            None
        }
    }
}

fn write_record(path: &Path, record: &Record) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let temp = path.with_extension("json.tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temp)?;
    file.write_all(&serde_json::to_vec(record).map_err(std::io::Error::other)?)?;
    file.sync_all()?;
    std::fs::rename(&temp, path)
}

/// One local sandbox, started here or adopted.
struct LocalInstance {
    endpoint: HandsEndpoint,
    root: String,
    isolation: Isolation,
    /// The sandbox's process tree (bwrap or execd at its root, the marker below).
    tree: TreeId,
    cgroup: Option<Arc<HandsCgroup>>,
    exit: watch::Receiver<Option<String>>,
    record: PathBuf,
    run_dir: PathBuf,
    watchers: Vec<tokio::task::JoinHandle<()>>,
    /// Set by a freeze, cleared by a thaw.
    frozen: std::sync::atomic::AtomicBool,
}

impl LocalInstance {
    /// Kills the whole sandbox when it hits its memory or process limit: a fork bomb or a
    /// memory hog takes down its own hands (`lost`, saying which limit), nothing else.
    fn watch_limits(&mut self, limit_hit: Arc<Mutex<Option<String>>>) {
        let Some(cgroup) = self.cgroup.clone() else {
            return;
        };
        let baseline = cgroup.limit_hits();
        let mut exit = self.exit.clone();
        self.watchers.push(tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = exit.wait_for(Option::is_some) => return,
                    () = tokio::time::sleep(WATCH_PERIOD) => {}
                }
                let hits = cgroup.limit_hits();
                let why = if hits.oom_kills > baseline.oom_kills {
                    "the sandbox hit its memory limit (--hands-memory) and was stopped"
                } else if hits.pids_max > baseline.pids_max {
                    "the sandbox hit its process limit (--hands-pids) and was stopped"
                } else {
                    continue;
                };
                if let Ok(mut hit) = limit_hit.lock() {
                    *hit = Some(why.to_string());
                }
                tracing::warn!(why, "hands over a limit");
                let _ = cgroup.kill_all();
                return;
            }
        }));
    }

    async fn freeze_now(&self) -> Result<(), HandsError> {
        self.set_frozen(true);
        match &self.cgroup {
            Some(cgroup) if cgroup.can_freeze() => {
                let cgroup = cgroup.clone();
                tokio::task::spawn_blocking(move || cgroup.freeze())
                    .await
                    .map_err(|e| HandsError::Failed(e.to_string()))?
                    .map_err(|e| HandsError::Failed(format!("freeze: {e}")))
            }
            _ => {
                warren_process::signal_tree(&self.tree, rustix::process::Signal::STOP);
                Ok(())
            }
        }
    }

    fn set_frozen(&self, frozen: bool) {
        self.frozen
            .store(frozen, std::sync::atomic::Ordering::SeqCst);
    }

    async fn thaw_now(&self) -> Result<(), HandsError> {
        self.set_frozen(false);
        match &self.cgroup {
            Some(cgroup) if cgroup.can_freeze() => {
                let cgroup = cgroup.clone();
                tokio::task::spawn_blocking(move || cgroup.thaw())
                    .await
                    .map_err(|e| HandsError::Failed(e.to_string()))?
                    .map_err(|e| HandsError::Failed(format!("thaw: {e}")))
            }
            _ => {
                warren_process::signal_tree(&self.tree, rustix::process::Signal::CONT);
                Ok(())
            }
        }
    }
}

impl HandsInstance for LocalInstance {
    fn endpoint(&self) -> &HandsEndpoint {
        &self.endpoint
    }

    fn root(&self) -> &str {
        &self.root
    }

    fn isolation(&self) -> Isolation {
        self.isolation
    }

    fn pid(&self) -> Option<u32> {
        u32::try_from(self.tree.root_pid).ok()
    }

    fn exited(&self) -> watch::Receiver<Option<String>> {
        self.exit.clone()
    }

    fn can_pause(&self) -> bool {
        true
    }

    fn is_frozen(&self) -> bool {
        self.frozen.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn freeze(&self) -> BoxFuture<'_, Result<(), HandsError>> {
        Box::pin(self.freeze_now())
    }

    fn thaw(&self) -> BoxFuture<'_, Result<(), HandsError>> {
        Box::pin(self.thaw_now())
    }

    fn stop(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            match &self.cgroup {
                Some(cgroup) => {
                    if let Err(e) = cgroup.kill_all() {
                        tracing::warn!(error = %e, "cannot kill the hands' cgroup");
                    }
                }
                None => {
                    // Stopped processes never act on SIGTERM: wake a paused tree first.
                    warren_process::signal_tree(&self.tree, rustix::process::Signal::CONT);
                    warren_process::kill_tree(&self.tree, STOP_GRACE).await;
                }
            }
            let mut exit = self.exit.clone();
            let _ = tokio::time::timeout(STOP_GRACE * 2, exit.wait_for(Option::is_some)).await;
            // cgroup.kill is asynchronous: stopped means every process is gone, not signalled.
            if let Some(cgroup) = &self.cgroup {
                let deadline = tokio::time::Instant::now() + STOP_GRACE;
                while !cgroup.is_empty() && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            let this = *self;
            // The limit watcher holds the cgroup too: wait for it to go, so the cgroup can be
            // removed rather than left behind empty.
            for watcher in this.watchers {
                watcher.abort();
                let _ = watcher.await;
            }
            match this.cgroup.map(Arc::try_unwrap) {
                Some(Ok(cgroup)) => remove_cgroup(cgroup).await,
                Some(Err(_)) => tracing::warn!("the hands' cgroup is still in use; left in place"),
                None => {}
            }
            let _ = std::fs::remove_file(&this.record);
            let _ = std::fs::remove_file(this.run_dir.join(SOCKET_NAME));
        })
    }

    fn detach(self: Box<Self>) {
        for watcher in &self.watchers {
            watcher.abort();
        }
        tracing::info!(pid = self.tree.root_pid, "hands left for the next gateway");
    }
}

impl HandsProvider for LocalHands {
    fn isolation(&self) -> Isolation {
        self.isolation
    }

    fn tree_owner(&self) -> Option<(u32, u32)> {
        self.sandbox_ids()
    }

    fn start(&self, spec: StartSpec) -> BoxFuture<'_, Result<Box<dyn HandsInstance>, HandsError>> {
        Box::pin(async move {
            let instance = self.start_local(&spec).await?;
            Ok(Box::new(instance) as Box<dyn HandsInstance>)
        })
    }

    fn adopt(
        &self,
        session_id: &str,
    ) -> BoxFuture<'_, Result<Option<Box<dyn HandsInstance>>, HandsError>> {
        let session_id = session_id.to_string();
        Box::pin(async move {
            let adopted = self.adopt_local(&session_id).await?;
            Ok(adopted.map(|instance| Box::new(instance) as Box<dyn HandsInstance>))
        })
    }

    fn snapshot_objects(&self) -> Option<&Objects> {
        self.config.snapshots.as_ref()
    }

    fn stop_strays(&self, live: &[String]) -> BoxFuture<'_, usize> {
        let live: std::collections::HashSet<String> = live.iter().cloned().collect();
        Box::pin(async move {
            let Ok(entries) = std::fs::read_dir(&self.config.run_dir) else {
                return 0;
            };
            let mut n_stopped = 0;
            for entry in entries.flatten() {
                let path = entry.path();
                let Some(session_id) = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.strip_suffix(".json"))
                    .map(str::to_string)
                else {
                    continue;
                };
                if live.contains(&session_id) {
                    continue;
                }
                tracing::warn!(session = %session_id, "stopping hands whose session is gone");
                self.stop_recorded(&session_id).await;
                let _ = std::fs::remove_dir_all(self.session_run_dir(&session_id));
                n_stopped += 1;
            }
            n_stopped
        })
    }

    fn network(&self) -> &'static str {
        LocalHands::network(self).label()
    }

    fn forget(&self, session_id: &str) {
        let _ = std::fs::remove_file(self.record_path(session_id));
        let _ = std::fs::remove_dir_all(self.session_run_dir(session_id));
    }
}
