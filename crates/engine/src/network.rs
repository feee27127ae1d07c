//! The hands' network as the gateway runs it (network.md): with `--hands-network private`, one
//! egress proxy per session ([`warren_egress::Egress`]) on `egress.sock` in the session's run
//! directory, listening from the moment the session's hands are installed (started, adopted
//! after a restart, or a warm sandbox taken) until the session goes away; the person's questions
//! (`egress_request`, answered through the permissions route); the `egress` events; and the
//! session's policy and rules, changed at run time and kept in `egress.json` beside its
//! workspace; and the credentials the proxy sets at the edge (`--hands-credential`): the
//! gateway's CA, the trust bundle the sandboxes get, which device's sessions are offered which
//! credential, which are on per session, and a `credential_used` event per request.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use warren_egress::{
    Answer, AnswerFuture, Authority, Credential, CredentialUse, Edge, Egress, Mode, Policy, Rule,
};
use warren_protocol::gateway::EventBody;

use crate::config::GatewayArgs;
use crate::engine_error::EngineError;
use crate::hands::local::EGRESS_SOCKET;
use crate::session::Session;
use warren_store::file;

/// The answers an `egress_request` offers.
pub const OPTIONS: [&str; 3] = ["allow_once", "allow_session", "deny"];
/// Destinations kept for the Network view.
const N_RECENT: usize = 50;
/// How long an answer also holds for new connections to its destination (a tool's burst: pip
/// opening several connections, a retry), so one question covers them.
const ANSWER_HOLDS: Duration = Duration::from_secs(5);
/// How often, at most, a destination's byte counts are an event.
const SUMMARY_PERIOD: Duration = Duration::from_secs(1);
/// Where a session's policy and rules are kept, in its directory.
const POLICY_FILE: &str = "egress.json";
/// The gateway's CA for credentialed hosts, in the data directory.
const CA_DIR: &str = "egress-ca";
/// The trust bundle the sandboxes get (the host's and the CA's certificates), in [`CA_DIR`].
const BUNDLE_FILE: &str = "bundle.pem";
/// The host's bundle of trusted certificates, which a sandbox sees at the same path.
pub const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The gateway's credentials (`--hands-credential`), who may use each, and the edge that sets
/// them on requests.
pub struct Credentials {
    edge: Arc<Edge>,
    all: Vec<Arc<Credential>>,
    /// `--hands-credential-devices`: the devices a credential is offered to (absent: every
    /// device).
    devices: HashMap<String, Vec<String>>,
    /// What sandboxes trust: the host's bundle and the CA's certificate.
    bundle: PathBuf,
}

impl Credentials {
    /// The credentials the flags name, with the CA (made on first use, kept in `<data>/egress-ca`)
    /// and the trust bundle; `None` without any. A start-up error for a credential the hands'
    /// network cannot carry, a device list for no credential, two credentials of one name, or an
    /// upstream CA that does not load.
    pub fn open(args: &GatewayArgs) -> Result<Option<Credentials>, EngineError> {
        let bad = |why: String| EngineError::InvalidRequest(why);
        let mut names = HashSet::new();
        for credential in &args.hands_credential {
            if !names.insert(credential.name()) {
                return Err(bad(format!(
                    "--hands-credential {} is given twice",
                    credential.name()
                )));
            }
        }
        let mut devices = HashMap::new();
        for (name, ids) in &args.hands_credential_devices {
            if !names.contains(name.as_str()) {
                return Err(bad(format!(
                    "--hands-credential-devices names {name}, which no --hands-credential defines"
                )));
            }
            devices
                .entry(name.clone())
                .or_insert_with(Vec::new)
                .extend(ids.iter().cloned());
        }
        if args.hands_credential.is_empty() {
            return Ok(None);
        }
        if args.hands_network != crate::hands::local::NetworkMode::Private
            || args.hands_provider != crate::config::HandsProviderKind::Local
        {
            return Err(bad(
                "--hands-credential needs local hands with --hands-network private: the egress proxy sets credentials"
                    .into(),
            ));
        }
        let system = std::fs::read_to_string(SYSTEM_BUNDLE).map_err(|e| {
            bad(format!(
                "--hands-credential needs the host's {SYSTEM_BUNDLE} (apt install ca-certificates): {e}"
            ))
        })?;
        let dir = args.data.join(CA_DIR);
        let authority = Authority::open(&dir).map_err(|e| bad(e.to_string()))?;
        let upstream = warren_egress::upstream_trust(&args.egress_upstream_ca)
            .map_err(|e| bad(e.to_string()))?;
        let bundle = dir.join(BUNDLE_FILE);
        let mut text = system;
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(authority.cert_pem());
        file::write_atomic(&bundle, text.as_bytes())?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&bundle, std::fs::Permissions::from_mode(0o644))?;
        }
        for credential in &args.hands_credential {
            tracing::info!(credential = %credential, "the egress proxy sets this credential; its value stays in the gateway");
        }
        Ok(Some(Credentials {
            edge: Edge::new(Arc::new(authority), upstream),
            all: args
                .hands_credential
                .iter()
                .cloned()
                .map(Arc::new)
                .collect(),
            devices,
            bundle,
        }))
    }

    /// The trust bundle the sandboxes get.
    pub fn bundle(&self) -> &Path {
        &self.bundle
    }

    /// The credentials `device`'s sessions are offered.
    fn offered(&self, device: &str) -> Vec<Arc<Credential>> {
        self.all
            .iter()
            .filter(|credential| {
                self.devices
                    .get(credential.name())
                    .is_none_or(|ids| ids.iter().any(|id| id == device))
            })
            .cloned()
            .collect()
    }
}

/// The hands' network of every session here.
pub struct Network {
    /// `private`, `none`, `host` or `remote` (the hands provider's).
    label: &'static str,
    defaults: Policy,
    ask_timeout: Duration,
    /// `<data>/run/hands`: each session's run directory is `<id>` in it.
    run_dir: PathBuf,
    credentials: Option<Credentials>,
    by_session: Mutex<HashMap<String, Arc<SessionNetwork>>>,
}

/// `GET /v1/sessions/{id}/egress`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EgressView {
    /// The hands' network: `private` (egress through this policy), `none`, `host` or `remote`
    /// (no egress proxy: the policy does not apply).
    pub network: String,
    /// `none`, `registries`, `ask` or `open`.
    pub policy: String,
    /// Allow rules, with those the person's answers added ("allow for this session").
    pub allow: Vec<String>,
    pub deny: Vec<String>,
    /// Names of the credentials the session's requests carry now (never their values).
    pub credentials: Vec<String>,
    /// Every credential the session's device may use, on or off.
    pub available_credentials: Vec<CredentialView>,
    /// How long a question waits for an answer before the connection is refused.
    pub ask_timeout_s: u64,
    /// The destinations used lately, newest first (at most 50).
    pub recent: Vec<Destination>,
}

/// `PUT /v1/sessions/{id}/egress`: the session's new policy and rules (replacing the old).
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressUpdate {
    pub policy: EgressPolicy,
    #[serde(default)]
    /// The allow rules (replacing every earlier one).
    pub allow: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
    /// The names of the credentials to have on (each one of `available_credentials`); absent:
    /// unchanged.
    #[serde(default)]
    pub credentials: Option<Vec<String>>,
}

/// A credential a session may use (never its value).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CredentialView {
    pub name: String,
    /// The hosts it is set for (`*.` wildcards kept), on any port, over HTTPS only.
    pub hosts: Vec<String>,
    /// The header it sets.
    pub header: String,
    /// Whether this session's requests carry it now.
    pub enabled: bool,
}

/// What passes without asking (network.md "Policy").
#[derive(Debug, Clone, Copy, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EgressPolicy {
    /// Nothing.
    None,
    /// The built-in registries and code hosts; anything else is asked.
    Registries,
    /// Nothing: everything is asked.
    Ask,
    /// Any public address.
    Open,
}

impl From<EgressPolicy> for Mode {
    fn from(policy: EgressPolicy) -> Mode {
        match policy {
            EgressPolicy::None => Mode::None,
            EgressPolicy::Registries => Mode::Registries,
            EgressPolicy::Ask => Mode::Ask,
            EgressPolicy::Open => Mode::Open,
        }
    }
}

/// One destination of the session's egress.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Destination {
    pub host: String,
    pub port: u16,
    /// `allowed` or `refused`, as last decided.
    pub decision: String,
    /// The rule that decided.
    pub rule: String,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// Connections let through.
    pub connections: u64,
    pub last_seen: String,
}

/// `egress.json`.
#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    policy: Mode,
    allow: Vec<String>,
    deny: Vec<String>,
    /// Rules added by the person's answers ([`Policy::answered`]).
    #[serde(default)]
    answered: Vec<String>,
    /// Credentials turned off for the session (so one added later starts on).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    credentials_off: Vec<String>,
}

impl Network {
    /// `label` is the hands' network as the provider gives it ([`crate::hands::HandsProvider::network`]).
    pub fn new(
        args: &GatewayArgs,
        label: &'static str,
        credentials: Option<Credentials>,
    ) -> Network {
        Network {
            label,
            defaults: Policy {
                mode: args.hands_egress,
                allow: args.hands_egress_allow.clone(),
                deny: args.hands_egress_deny.clone(),
                answered: Vec::new(),
            },
            ask_timeout: args.egress_ask_timeout,
            run_dir: args.data.join("run").join("hands"),
            credentials,
            by_session: Mutex::new(HashMap::new()),
        }
    }

    /// The sessions' network: `private`, `none`, `host` or `remote`.
    pub fn label(&self) -> &'static str {
        self.label
    }

    fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<SessionNetwork>>> {
        self.by_session
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Gives `session` its egress proxy (with `private`; nothing otherwise): its policy as last
    /// kept, listening whenever its hands are installed, now if they already are.
    pub fn attach(&self, session: &Arc<Session>) {
        if self.label != "private" {
            return;
        }
        let policy_file = session.dir.join(POLICY_FILE);
        let (policy, off) =
            read_policy(&policy_file).unwrap_or_else(|| (self.defaults.clone(), Vec::new()));
        let offered = self
            .credentials
            .as_ref()
            .map(|credentials| credentials.offered(&session.device_id))
            .unwrap_or_default();
        let enabled = offered
            .iter()
            .filter(|credential| !off.iter().any(|name| name == credential.name()))
            .cloned()
            .collect();
        let watcher = Arc::new_cyclic(|me| Watcher {
            session: Arc::downgrade(session),
            ask_timeout: self.ask_timeout,
            questions: Mutex::default(),
            answers: Mutex::default(),
            seen: Mutex::default(),
            traffic: Mutex::default(),
            flush_due: AtomicBool::new(false),
            recent: Mutex::default(),
            policy_file,
            offered,
            egress: std::sync::OnceLock::new(),
            me: me.clone(),
        });
        let how_to_allow = format!(
            "The person can allow it in the Warren console (Network), or with PUT \
             /v1/sessions/{}/egress.",
            session.id
        );
        let egress = Egress::with_credentials(
            policy,
            watcher.clone(),
            warren_egress::Limits::default(),
            how_to_allow,
            self.credentials
                .as_ref()
                .map(|credentials| credentials.edge.clone()),
            enabled,
        );
        let _ = watcher.egress.set(Arc::downgrade(&egress));
        let network = Arc::new(SessionNetwork {
            egress,
            watcher,
            socket: self.run_dir.join(&session.id).join(EGRESS_SOCKET),
            server: Mutex::new(None),
        });
        let listening = Arc::downgrade(&network);
        session.hands.set_on_install(Box::new(move || {
            if let Some(network) = listening.upgrade() {
                network.listen();
            }
        }));
        if session.hands.is_running() {
            network.listen();
        }
        if let Some(earlier) = self.map().insert(session.id.clone(), network) {
            earlier.stop();
        }
    }

    /// The session's egress proxy, if it has one.
    pub fn get(&self, session_id: &str) -> Option<Arc<SessionNetwork>> {
        self.map().get(session_id).cloned()
    }

    /// Session delete: stops its proxy (its questions are answered `deny`).
    pub fn detach(&self, session_id: &str) {
        if let Some(network) = self.map().remove(session_id) {
            network.stop();
        }
    }

    /// Gateway shutdown.
    pub fn stop_all(&self) {
        for (_, network) in self.map().drain() {
            network.stop();
        }
    }

    /// `GET /v1/sessions/{id}/egress`.
    pub fn view(&self, session_id: &str) -> EgressView {
        match self.get(session_id) {
            Some(network) => network.view(self.ask_timeout),
            None => view_of(
                self.label,
                &self.defaults,
                self.ask_timeout,
                &[],
                &[],
                Vec::new(),
            ),
        }
    }

    /// `PUT /v1/sessions/{id}/egress`: 400 `INVALID_EGRESS_RULE` for a rule that does not parse,
    /// 400 `UNKNOWN_CREDENTIAL` for a credential the session is not offered, 409
    /// `NO_EGRESS_PROXY` when the session's hands have none.
    pub async fn replace(
        &self,
        session_id: &str,
        update: EgressUpdate,
    ) -> Result<EgressView, EngineError> {
        let mode = Mode::from(update.policy);
        let allow = parse_rules(&update.allow)?;
        let deny = parse_rules(&update.deny)?;
        let network = self
            .get(session_id)
            .ok_or(EngineError::NoEgressProxy(self.label))?;
        let credentials = match &update.credentials {
            Some(names) => {
                let offered = &network.watcher.offered;
                for name in names {
                    if !offered.iter().any(|credential| credential.name() == name) {
                        return Err(EngineError::UnknownCredential(name.clone()));
                    }
                }
                Some(
                    offered
                        .iter()
                        .filter(|credential| names.iter().any(|name| name == credential.name()))
                        .cloned()
                        .collect::<Vec<_>>(),
                )
            }
            None => None,
        };
        // A rule the person's answer added stays one (it opens no refused range) when the new
        // list still holds it.
        let before = network.egress.policy();
        let (answered, allow) = allow
            .into_iter()
            .partition(|rule| before.answered.contains(rule));
        network.egress.set_policy(Policy {
            mode,
            allow,
            deny,
            answered,
        });
        if let Some(credentials) = credentials {
            network.egress.set_credentials(credentials);
        }
        network.watcher.keep_policy().await?;
        Ok(network.view(self.ask_timeout))
    }

    /// `POST /v1/sessions/{id}/permissions/{request_id}` for an `egress_request`: `None` when
    /// the id is no egress question of the session (an ACP permission's, or unknown).
    pub async fn answer(
        &self,
        session_id: &str,
        request_id: &str,
        option_id: &str,
    ) -> Option<Result<(), EngineError>> {
        let network = self.get(session_id)?;
        network.watcher.answer(request_id, option_id).await
    }
}

fn parse_rules(rules: &[String]) -> Result<Vec<Rule>, EngineError> {
    rules
        .iter()
        .map(|rule| rule.trim().parse::<Rule>().map_err(EngineError::from))
        .collect()
}

/// A session's kept policy and the credentials turned off for it.
fn read_policy(path: &Path) -> Option<(Policy, Vec<String>)> {
    let text = std::fs::read(path).ok()?;
    let stored: Stored = match serde_json::from_slice(&text) {
        Ok(stored) => stored,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "an egress policy file does not parse; the defaults apply");
            return None;
        }
    };
    let parse = |rules: &[String]| -> Vec<Rule> {
        rules.iter().filter_map(|rule| rule.parse().ok()).collect()
    };
    Some((
        Policy {
            mode: stored.policy,
            allow: parse(&stored.allow),
            deny: parse(&stored.deny),
            answered: parse(&stored.answered),
        },
        stored.credentials_off,
    ))
}

fn view_of(
    network: &str,
    policy: &Policy,
    ask_timeout: Duration,
    offered: &[Arc<Credential>],
    enabled: &[Arc<Credential>],
    recent: Vec<Destination>,
) -> EgressView {
    let is_on = |credential: &Credential| enabled.iter().any(|on| on.name() == credential.name());
    EgressView {
        network: network.to_owned(),
        policy: policy.mode.to_string(),
        allow: policy
            .allow
            .iter()
            .chain(&policy.answered)
            .map(Rule::to_string)
            .collect(),
        deny: policy.deny.iter().map(Rule::to_string).collect(),
        credentials: enabled.iter().map(|c| c.name().to_owned()).collect(),
        available_credentials: offered
            .iter()
            .map(|credential| CredentialView {
                name: credential.name().to_owned(),
                hosts: credential.hosts(),
                header: credential.header().to_string(),
                enabled: is_on(credential),
            })
            .collect(),
        ask_timeout_s: ask_timeout.as_secs(),
        recent,
    }
}

/// One session's egress proxy and what it tells the session.
pub struct SessionNetwork {
    egress: Arc<Egress>,
    watcher: Arc<Watcher>,
    socket: PathBuf,
    server: Mutex<Option<tokio::task::AbortHandle>>,
}

impl SessionNetwork {
    /// (Re)binds the socket and serves it (the run directory exists once hands were started).
    fn listen(&self) {
        use std::os::unix::fs::PermissionsExt;
        let bound = (|| {
            match std::fs::remove_file(&self.socket) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            let listener = tokio::net::UnixListener::bind(&self.socket)?;
            // The run directory is private to the sandbox's uid; the socket is for it.
            std::fs::set_permissions(&self.socket, std::fs::Permissions::from_mode(0o666))?;
            Ok(listener)
        })();
        let listener = match bound {
            Ok(listener) => listener,
            Err(e) => {
                tracing::error!(socket = %self.socket.display(), error = %e, "the egress proxy cannot listen: the hands reach nothing outside");
                return;
            }
        };
        let task = tokio::spawn(self.egress.clone().serve(listener));
        let earlier = self
            .server
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .replace(task.abort_handle());
        if let Some(earlier) = earlier {
            earlier.abort();
        }
    }

    fn stop(&self) {
        if let Some(server) = self
            .server
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
        {
            server.abort();
        }
        self.watcher.deny_all();
    }

    fn view(&self, ask_timeout: Duration) -> EgressView {
        let recent = self.watcher.recent().iter().cloned().collect();
        view_of(
            "private",
            &self.egress.policy(),
            ask_timeout,
            &self.watcher.offered,
            &self.egress.credentials(),
            recent,
        )
    }
}

/// One open question: every connection to its destination waits on `answer`.
struct Question {
    request_id: String,
    host: String,
    port: u16,
    answer: watch::Sender<Option<Answer>>,
}

/// The destinations (host, port, allowed) the turn `turn` used so far.
#[derive(Default)]
struct SeenInTurn {
    turn: Option<u64>,
    destinations: HashSet<(String, u16, bool)>,
}

/// What one destination carried since its last summary.
#[derive(Default)]
struct Traffic {
    bytes_up: u64,
    bytes_down: u64,
    connections: u64,
}

/// The proxy's [`warren_egress::Observer`]: questions, events and the recent destinations.
struct Watcher {
    session: Weak<Session>,
    ask_timeout: Duration,
    /// Open questions by destination.
    questions: Mutex<HashMap<(String, u16), Arc<Question>>>,
    /// The last answer per destination and when it came ([`ANSWER_HOLDS`]).
    answers: Mutex<HashMap<(String, u16), (Answer, std::time::Instant)>>,
    /// The destinations first used in the current turn.
    seen: Mutex<SeenInTurn>,
    /// Byte counts not yet in an event.
    traffic: Mutex<HashMap<(String, u16), Traffic>>,
    /// A summary is scheduled.
    flush_due: AtomicBool,
    recent: Mutex<VecDeque<Destination>>,
    policy_file: PathBuf,
    /// The credentials the session's device may use.
    offered: Vec<Arc<Credential>>,
    egress: std::sync::OnceLock<Weak<Egress>>,
    me: Weak<Watcher>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Watcher {
    fn recent(&self) -> MutexGuard<'_, VecDeque<Destination>> {
        lock(&self.recent)
    }

    /// Appends `body` to the session's log in its running turn, if any; false when the session
    /// is gone or the log refused it.
    fn emit(&self, body: EventBody) -> bool {
        let Some(session) = self.session.upgrade() else {
            return false;
        };
        session.append_outside_turns(body)
    }

    /// Keeps the proxy's policy and rules in `egress.json`.
    async fn keep_policy(&self) -> Result<(), EngineError> {
        let Some(egress) = self.egress.get().and_then(Weak::upgrade) else {
            return Ok(());
        };
        let policy = egress.policy();
        let stored = Stored {
            policy: policy.mode,
            allow: policy.allow.iter().map(Rule::to_string).collect(),
            deny: policy.deny.iter().map(Rule::to_string).collect(),
            answered: policy.answered.iter().map(Rule::to_string).collect(),
            credentials_off: {
                let on = egress.credentials();
                self.offered
                    .iter()
                    .filter(|credential| !on.iter().any(|c| c.name() == credential.name()))
                    .map(|credential| credential.name().to_owned())
                    .collect()
            },
        };
        let path = self.policy_file.clone();
        tokio::task::spawn_blocking(move || file::write_json_atomic(&path, &stored))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))??;
        Ok(())
    }

    async fn answer(&self, request_id: &str, option_id: &str) -> Option<Result<(), EngineError>> {
        let question = lock(&self.questions)
            .values()
            .find(|question| question.request_id == request_id)
            .cloned()?;
        let answer = match option_id {
            "allow_once" => Answer::AllowOnce,
            "allow_session" => Answer::AllowSession,
            "deny" => Answer::Deny,
            _ => {
                return Some(Err(EngineError::InvalidRequest(format!(
                    "option_id must be one of {OPTIONS:?}"
                ))));
            }
        };
        if answer == Answer::AllowSession
            && let Some(egress) = self.egress.get().and_then(Weak::upgrade)
            && let Some(rule) = Rule::exact(&question.host, question.port)
        {
            let mut policy = egress.policy();
            if !policy.answered.contains(&rule) {
                policy.answered.push(rule);
                egress.set_policy(policy);
            }
            if let Err(e) = self.keep_policy().await {
                tracing::warn!(error = %e, "the session's new egress rule is not kept on disk");
            }
        }
        if !self.resolve(&question, answer, Some(option_id)) {
            // Resolved meanwhile (the time ran out, or another answer came first).
            return Some(Err(EngineError::PermissionNotFound));
        }
        Some(Ok(()))
    }

    /// Closes `question` with `answer` (`option_id` when the person chose it, else it timed
    /// out); false when it was already closed.
    fn resolve(&self, question: &Question, answer: Answer, option_id: Option<&str>) -> bool {
        {
            let mut questions = lock(&self.questions);
            let key = (question.host.clone(), question.port);
            match questions.get(&key) {
                Some(open) if open.request_id == question.request_id => {
                    questions.remove(&key);
                }
                _ => return false,
            }
        }
        let _ = question.answer.send(Some(answer));
        {
            let mut answers = lock(&self.answers);
            answers.retain(|_, (_, at)| at.elapsed() < ANSWER_HOLDS);
            answers.insert(
                (question.host.clone(), question.port),
                (answer, std::time::Instant::now()),
            );
        }
        self.emit(EventBody::PermissionResolved {
            request_id: question.request_id.clone(),
            outcome: match option_id {
                Some(_) => "selected",
                None => "timed_out",
            }
            .to_owned(),
            option_id: option_id.map(str::to_owned),
        });
        true
    }

    /// The session is going away: every waiting connection is refused.
    fn deny_all(&self) {
        for (_, question) in lock(&self.questions).drain() {
            let _ = question.answer.send(Some(Answer::Deny));
        }
    }

    fn note(&self, host: &str, port: u16, decision: &str, rule: &str) {
        let now = file::now_rfc3339();
        let mut recent = self.recent();
        let found = recent
            .iter()
            .position(|dest| dest.host == host && dest.port == port);
        let mut destination = match found.and_then(|at| recent.remove(at)) {
            Some(destination) => destination,
            None => Destination {
                host: host.to_owned(),
                port,
                decision: String::new(),
                rule: String::new(),
                bytes_up: 0,
                bytes_down: 0,
                connections: 0,
                last_seen: String::new(),
            },
        };
        decision.clone_into(&mut destination.decision);
        rule.clone_into(&mut destination.rule);
        destination.last_seen = now;
        if decision == "allowed" {
            destination.connections += 1;
        }
        recent.push_front(destination);
        recent.truncate(N_RECENT);
    }

    fn flush(&self) {
        self.flush_due.store(false, Ordering::Release);
        let traffic: Vec<_> = lock(&self.traffic).drain().collect();
        for ((host, port), traffic) in traffic {
            self.emit(EventBody::Egress {
                host,
                port,
                decision: None,
                rule: None,
                bytes_up: Some(traffic.bytes_up),
                bytes_down: Some(traffic.bytes_down),
                connections: Some(traffic.connections),
            });
        }
    }
}

impl warren_egress::Observer for Watcher {
    fn ask(&self, host: &str, port: u16) -> AnswerFuture {
        let key = (host.to_owned(), port);
        let held = lock(&self.answers)
            .get(&key)
            .filter(|(_, at)| at.elapsed() < ANSWER_HOLDS)
            .map(|(answer, _)| *answer);
        if let Some(answer) = held {
            return Box::pin(async move { answer });
        }
        let (question, asked_now) = {
            let mut questions = lock(&self.questions);
            match questions.get(&key) {
                Some(question) => (question.clone(), false),
                None => {
                    let question = Arc::new(Question {
                        request_id: format!("egress-{}", uuid::Uuid::new_v4().simple()),
                        host: host.to_owned(),
                        port,
                        answer: watch::channel(None).0,
                    });
                    questions.insert(key, question.clone());
                    (question, true)
                }
            }
        };
        let mut answer = question.answer.subscribe();
        if asked_now {
            let asked = self.emit(EventBody::EgressRequest {
                request_id: question.request_id.clone(),
                host: host.to_owned(),
                port,
                options: OPTIONS.map(str::to_owned).to_vec(),
            });
            if !asked {
                // No one can see the question: refused now rather than after the wait.
                lock(&self.questions).remove(&(host.to_owned(), port));
                return Box::pin(async { Answer::Deny });
            }
            let me = self.me.clone();
            let timeout = self.ask_timeout;
            tokio::spawn(async move {
                tokio::time::sleep(timeout).await;
                if let Some(watcher) = me.upgrade() {
                    watcher.resolve(&question, Answer::TimedOut, None);
                }
            });
        }
        Box::pin(async move {
            match answer.wait_for(Option::is_some).await {
                Ok(answer) => answer.unwrap_or(Answer::Deny),
                Err(_) => Answer::Deny,
            }
        })
    }

    fn decided(&self, host: &str, port: u16, allowed: bool, rule: &str) {
        let decision = if allowed { "allowed" } else { "refused" };
        self.note(host, port, decision, rule);
        let turn = self.session.upgrade().and_then(|s| s.running_turn());
        let first = {
            let mut seen = lock(&self.seen);
            if seen.turn != turn {
                *seen = SeenInTurn {
                    turn,
                    destinations: HashSet::new(),
                };
            }
            seen.destinations.insert((host.to_owned(), port, allowed))
        };
        if first {
            self.emit(EventBody::Egress {
                host: host.to_owned(),
                port,
                decision: Some(decision.to_owned()),
                rule: Some(rule.to_owned()),
                bytes_up: None,
                bytes_down: None,
                connections: None,
            });
        }
    }

    fn credential_used(&self, used: CredentialUse) {
        self.emit(EventBody::CredentialUsed {
            name: used.name,
            host: used.host,
            method: used.method,
            path: used.path,
            status: used.status,
        });
    }

    fn closed(&self, host: &str, port: u16, bytes_up: u64, bytes_down: u64) {
        {
            let mut traffic = lock(&self.traffic);
            let entry = traffic.entry((host.to_owned(), port)).or_default();
            entry.bytes_up += bytes_up;
            entry.bytes_down += bytes_down;
            entry.connections += 1;
        }
        if let Some(destination) = self
            .recent()
            .iter_mut()
            .find(|dest| dest.host == host && dest.port == port)
        {
            destination.bytes_up += bytes_up;
            destination.bytes_down += bytes_down;
        }
        if !self.flush_due.swap(true, Ordering::AcqRel) {
            let me = self.me.clone();
            tokio::spawn(async move {
                tokio::time::sleep(SUMMARY_PERIOD).await;
                if let Some(watcher) = me.upgrade() {
                    watcher.flush();
                }
            });
        }
    }
}
