//! Starting a gateway in-process, registering devices, and reading SSE streams with timeouts
//! that name what was expected.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures_util::StreamExt;
use serde_json::Value;
use warren_gateway::{Gateway, GatewayArgs};
pub use warren_test_support::{WAIT, files_under};

/// Stops every hands sandbox recorded in `data` (by cgroup or recorded pid).
pub fn stop_left_hands(data: &Path) {
    warren_gateway::hands::local::stop_left_hands_blocking(&data.join("run").join("hands"));
}

/// Stops the hands left in a data directory when dropped: for tests whose gateways leave their
/// hands for a next one, so nothing outlives the test, passed or not.
pub struct LeftHands(pub PathBuf);

impl Drop for LeftHands {
    fn drop(&mut self) {
        stop_left_hands(&self.0);
    }
}

/// The live processes of a session's hands: the sandbox's root, from the record the gateway
/// keeps for the next gateway, and everything below it. Empty when no hands run.
pub fn hands_processes(data: &Path, session: &str) -> Vec<u32> {
    let record = data
        .join("run")
        .join("hands")
        .join(format!("{session}.json"));
    let Ok(text) = std::fs::read_to_string(record) else {
        return Vec::new();
    };
    let record: Value = serde_json::from_str(&text).expect("the hands record parses");
    let Some(pid) = record["pid"].as_u64() else {
        return Vec::new();
    };
    let tree = warren_process::TreeId::new(pid as i32, None);
    warren_process::tree_members(&tree)
        .into_iter()
        .filter_map(|pid| u32::try_from(pid).ok())
        .filter(|pid| warren_test_support::alive(*pid))
        .collect()
}

/// A client of one gateway's HTTP API: registration with its app key, and a device's requests.
/// A [`TestGateway`] and a [`GatewayProcess`] are one (their methods are these).
pub struct Client {
    pub url: String,
    pub app_key: String,
    pub http: reqwest::Client,
}

/// Whether this test binary runs the suite against the PostgreSQL store: `gateway_postgres`
/// (tests/gateway_postgres.rs) is this same suite with every gateway on a database of its own.
pub fn on_postgres() -> bool {
    env!("CARGO_CRATE_NAME") == "gateway_postgres"
}

/// The store a gateway on `data` uses in this suite: the data directory, or (on PostgreSQL) a
/// fresh database per data directory, the same one again for a gateway restarted on it.
pub fn store_for(data: &Path) -> warren_gateway::config::StoreUrl {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static DATABASES: Mutex<Option<HashMap<PathBuf, String>>> = Mutex::new(None);
    if !on_postgres() {
        return warren_gateway::config::StoreUrl::File;
    }
    let mut databases = DATABASES.lock().unwrap_or_else(|p| p.into_inner());
    let url = databases
        .get_or_insert_with(HashMap::new)
        .entry(data.to_path_buf())
        .or_insert_with(|| warren_test_support::services::Postgres::shared().fresh_database())
        .clone();
    warren_gateway::config::StoreUrl::Postgres(url)
}

/// Every row the PostgreSQL store of the gateway on `data` holds (devices, sessions, events,
/// preview tokens), as text: for tests that check what is stored.
pub fn stored_rows(data: &Path) -> String {
    let warren_gateway::config::StoreUrl::Postgres(url) = store_for(data) else {
        return String::new();
    };
    let database = url.rsplit('/').next().expect("the URL names a database");
    let tables = ["devices", "sessions", "events", "preview_tokens"];
    tables
        .iter()
        .map(|table| {
            warren_test_support::services::Postgres::shared().psql(
                database,
                &format!("SELECT coalesce(string_agg(t::text, E'\\n'), '') FROM {table} t"),
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// On PostgreSQL, asserts the rows of the gateway on `data` hold `marker` (so they were read)
/// and none of `secrets`, and returns true; on the file store (whose files the test reads
/// itself) returns false.
pub fn stored_rows_keep_none_of(data: &Path, marker: &str, secrets: &[&str]) -> bool {
    if !on_postgres() {
        return false;
    }
    let stored = stored_rows(data);
    assert!(stored.contains(marker), "the rows were read: {stored}");
    for secret in secrets {
        assert!(!stored.contains(secret), "{secret} in the store");
    }
    true
}

/// On PostgreSQL, deletes the session's row from the store of the gateway on `data` (what
/// removing its directory is for the file store); nothing otherwise.
pub fn delete_stored_session(data: &Path, session: &str) {
    let warren_gateway::config::StoreUrl::Postgres(url) = store_for(data) else {
        return;
    };
    let database = url.rsplit('/').next().expect("the URL names a database");
    warren_test_support::services::Postgres::shared().psql(
        database,
        &format!("DELETE FROM sessions WHERE id = '{session}'"),
    );
}

/// Every id of `events` follows the one before it by exactly 1, from `after + 1`: no gap, no
/// duplicate (`what` names the stream in the failure).
pub fn assert_seq_from(events: &[Received], after: u64, what: &str) {
    for (expected, event) in (after + 1..).zip(events) {
        assert_eq!(
            event.id,
            Some(expected),
            "{what}: seq continues +1 ({})",
            event.event
        );
    }
}

/// Appends a `status` event (the brain `ready`) to `session`'s log, as the gateway would;
/// returns its seq.
pub fn append_ready_status(session: &warren_gateway::sessions::Session) -> u64 {
    let ready = warren_protocol::gateway::EventBody::Status {
        brain: Some("ready".into()),
        hands: None,
        message: None,
    };
    session.log.append(None, ready).expect("append").seq
}

/// Asserts `response` is `status` with the error `code` (`what` names the request); returns its
/// JSON body.
pub async fn assert_error(
    response: reqwest::Response,
    status: u16,
    code: &str,
    what: &str,
) -> Value {
    assert_eq!(response.status(), status, "{what}");
    let body: Value = response.json().await.expect("a JSON error body");
    assert_eq!(body["code"], code, "{what}: {body}");
    body
}

/// Of `answers` to session creations: how many made a session (201) and how many the device
/// quota refused (429 `QUOTA_EXCEEDED`); any other answer fails the test.
pub async fn created_and_refused(
    answers: Vec<reqwest::Result<reqwest::Response>>,
) -> (usize, usize) {
    let (mut n_created, mut n_refused) = (0, 0);
    for answer in answers {
        let answer = answer.expect("a creation is answered");
        match answer.status().as_u16() {
            201 => n_created += 1,
            429 => {
                assert_error(answer, 429, "QUOTA_EXCEEDED", "a creation over the quota").await;
                n_refused += 1;
            }
            other => panic!("a creation answered {other}"),
        }
    }
    (n_created, n_refused)
}

/// Asserts `response` is 201 (`what` names the request) and returns the string `field` of its
/// JSON body.
async fn created(response: reqwest::Response, what: &str, field: &str) -> String {
    assert_eq!(response.status(), 201, "{what}");
    let body: Value = response.json().await.expect("a JSON body");
    body[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} in {body}"))
        .to_owned()
}

/// Sends `request` and returns the JSON it answers; panics naming `what` if either fails.
pub async fn json_of(request: reqwest::RequestBuilder, what: &str) -> Value {
    let response = request
        .send()
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    response
        .json()
        .await
        .unwrap_or_else(|e| panic!("{what}: a JSON body: {e}"))
}

/// Reads `events` to the next `turn_end`, asserting its ids go on +1 from `after` (`what` names
/// the stream) and that the turn is the one of the message `text`.
pub async fn assert_turn_follows(events: &mut EventStream, text: &str, after: u64, what: &str) {
    let turn = events
        .until(&format!("turn_end of {text}"), |e| e.event == "turn_end")
        .await;
    assert_seq_from(&turn, after, what);
    assert!(
        turn.iter()
            .any(|e| e.event == "user_message" && e.data["text"] == text),
        "the turn of {text:?} is in the stream"
    );
}

/// For a test of the file store's own files (`events.jsonl`, `meta.json`, a full data disk):
/// true, with a note, when the suite runs on PostgreSQL, where those files do not exist (the
/// store's own faults are tested in tests/gateway/store_faults.rs).
pub fn file_store_only(what: &str) -> bool {
    if on_postgres() {
        eprintln!("not run on the PostgreSQL store: {what}");
    }
    on_postgres()
}

/// A gateway in this process: its [`Client`] (by `Deref`), the [`Gateway`] itself and its data
/// directory.
pub struct TestGateway {
    client: Client,
    pub gateway: Arc<Gateway>,
    pub data: PathBuf,
    _data_dir: Option<tempfile::TempDir>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

/// Arguments for a gateway with no agent needed: no warm workers, an agent that cannot start.
pub fn args_without_agent(data: PathBuf) -> GatewayArgs {
    let mut args = GatewayArgs::with_data(data);
    args.app_key = Some("test-app-key".into());
    args.admin_token = Some("test-admin-token".into());
    args.warm_workers = 0;
    args.agent = Some("/nonexistent/agent".into());
    // The agents of these tests run beside the gateway; tests of agents in the hands say so.
    args.brain_placement = Some(warren_gateway::config::BrainPlacement::Host);
    args
}

/// Arguments for a gateway whose agent is the built-in shell agent of the real `warren` binary.
pub fn args_with_shell_agent(data: PathBuf) -> GatewayArgs {
    let mut args = args_without_agent(data);
    let warren = warren_bin();
    args.warren_bin = Some(warren.clone());
    args.agent = Some(format!("{} shell-agent", warren.display()));
    args.warm_workers = 1;
    args
}

/// Held while a test changes this host's network interfaces (a veth link) and while the browser
/// runs: Chromium aborts every load in flight (`net::ERR_NETWORK_CHANGED`) when a link comes or
/// goes, so the two never overlap.
static HOST_LINKS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits (bounded: the browser run's own bound) until no other test changes the host's links.
pub async fn host_links() -> tokio::sync::MutexGuard<'static, ()> {
    tokio::time::timeout(std::time::Duration::from_secs(20 * 60), HOST_LINKS.lock())
        .await
        .expect("another test kept the host's links for 20 minutes")
}

/// A gateway with the shell agent whose hands must be bwrap sandboxes, its arguments then
/// changed by `configure`.
pub async fn in_bwrap(configure: impl FnOnce(&mut GatewayArgs)) -> TestGateway {
    TestGateway::start_changed(args_with_shell_agent, |args| {
        args.hands_isolation = warren_gateway::hands::local::IsolationMode::Bwrap;
        configure(args);
    })
    .await
}

impl Drop for TestGateway {
    /// A test that failed before stopping its gateway leaves no sandbox behind.
    fn drop(&mut self) {
        if self.stop.is_some() {
            stop_left_hands(&self.data);
        }
    }
}

impl TestGateway {
    pub async fn start(configure: impl FnOnce(PathBuf) -> GatewayArgs) -> TestGateway {
        let dir = tempfile::tempdir().expect("temp data dir");
        let mut gateway = Self::start_in(configure(dir.path().to_path_buf())).await;
        gateway._data_dir = Some(dir);
        gateway
    }

    /// Starts a gateway on the arguments `base` makes, then changed by `configure`.
    pub async fn start_changed(
        base: impl FnOnce(PathBuf) -> GatewayArgs,
        configure: impl FnOnce(&mut GatewayArgs),
    ) -> TestGateway {
        Self::start(|data| {
            let mut args = base(data);
            configure(&mut args);
            args
        })
        .await
    }

    pub async fn start_in(mut args: GatewayArgs) -> TestGateway {
        let data = args.data.clone();
        if args.store == warren_gateway::config::StoreUrl::File {
            let for_data = data.clone();
            args.store = tokio::task::spawn_blocking(move || store_for(&for_data))
                .await
                .expect("a store");
        }
        let app_key = args.app_key.clone().expect("tests pass an app key");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        // As `warren gateway` does: agents reach the model proxy at the real port.
        args.listen = listener.local_addr().expect("local addr");
        let gateway = Gateway::open(args).await.expect("gateway opens");
        let url = format!("http://{}", listener.local_addr().expect("local addr"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(warren_gateway::serve(gateway.clone(), listener, async {
            let _ = stopped.await;
        }));
        TestGateway {
            client: Client {
                url,
                app_key,
                http: reqwest::Client::new(),
            },
            gateway,
            data,
            _data_dir: None,
            stop: Some(stop),
            server: Some(server),
        }
    }

    /// Stops the server the way SIGTERM does and waits for it, then stops the hands it left
    /// paused for a next gateway. Returns the temp data dir so a test can inspect it afterwards.
    pub async fn stop(self) -> Option<tempfile::TempDir> {
        let data = self.data.clone();
        let dir = self.stop_leaving_hands().await;
        stop_left_hands(&data);
        dir
    }

    /// Stops the server the way SIGTERM does, leaving its hands paused for the next gateway on
    /// the same data directory (whose test must stop them, e.g. with [`TestGateway::stop`]).
    pub async fn stop_leaving_hands(mut self) -> Option<tempfile::TempDir> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            let result = tokio::time::timeout(WAIT, server)
                .await
                .expect("gateway stops within the timeout");
            result.expect("server task").expect("server result");
        }
        self._data_dir.take()
    }

    /// The engine's session `id`, whichever device's it is.
    pub fn session(&self, id: &str) -> Arc<warren_gateway::sessions::Session> {
        self.gateway.engine.sessions.by_id(id).expect("the session")
    }

    /// The engine's session `id` of the device `device_id`.
    pub fn session_of(&self, device_id: &str, id: &str) -> Arc<warren_gateway::sessions::Session> {
        let sessions = &self.gateway.engine.sessions;
        sessions.get(device_id, id).expect("the device's session")
    }

    /// A [`TestGateway::conversation`] for `device_id` once `command` ran in it to an
    /// `end_turn`.
    pub async fn conversation_after(&self, device_id: &str, command: &str) -> Conversation<'_> {
        let mut chat = self.conversation(device_id).await;
        chat.turn_ok(command).await;
        chat
    }

    /// Registers `device_id`, creates a session and opens its event stream.
    pub async fn conversation(&self, device_id: &str) -> Conversation<'_> {
        let token = self.register(device_id).await;
        let session = self.create_session(&token).await;
        let events = self.events(&token, &session, None).await;
        Conversation {
            gw: self,
            token,
            session,
            events,
        }
    }
}

impl std::ops::Deref for TestGateway {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Client {
    /// `POST /v1/devices` for `device_id` with the app key, not sent yet.
    pub fn registration(&self, device_id: &str) -> reqwest::RequestBuilder {
        self.http
            .post(format!("{}/v1/devices", self.url))
            .header("X-App-Key", &self.app_key)
            .json(&serde_json::json!({ "device_id": device_id }))
    }

    pub async fn register(&self, device_id: &str) -> String {
        let request = self.registration(device_id);
        let response = request.send().await.expect("register request");
        created(response, &format!("registering {device_id}"), "token").await
    }

    pub async fn create_session(&self, token: &str) -> String {
        let response = self
            .request(reqwest::Method::POST, token, "/sessions")
            .json(&serde_json::json!({ "title": "test" }))
            .send()
            .await
            .expect("create session request");
        created(response, "creating a session", "id").await
    }

    pub async fn post_message(&self, token: &str, session: &str, text: &str) -> reqwest::Response {
        self.http
            .post(format!("{}/v1/sessions/{session}/messages", self.url))
            .bearer_auth(token)
            .json(&serde_json::json!({ "text": text }))
            .send()
            .await
            .expect("message request")
    }

    /// A request with the device's token: `GET`/`POST`/`DELETE` of `path` (below `/v1`).
    pub fn request(
        &self,
        method: reqwest::Method,
        token: &str,
        path: &str,
    ) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}/v1{path}", self.url))
            .bearer_auth(token)
    }

    /// Sends a request without a body; panics naming it if it cannot be sent.
    pub async fn send(
        &self,
        method: reqwest::Method,
        token: &str,
        path: &str,
    ) -> reqwest::Response {
        self.request(method.clone(), token, path)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// Sends `method` of `path` (from the root, e.g. `/healthz`) with no token; panics naming
    /// it if it cannot be sent.
    pub async fn send_plain(&self, method: reqwest::Method, path: &str) -> reqwest::Response {
        self.http
            .request(method.clone(), format!("{}{path}", self.url))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// `GET` of `path` (from the root, e.g. `/healthz`) with no token.
    pub async fn get_plain(&self, path: &str) -> reqwest::Response {
        self.send_plain(reqwest::Method::GET, path).await
    }

    /// Asserts `GET /healthz` answers 200 (`what` says why it should).
    pub async fn assert_healthy(&self, what: &str) {
        let health = self.get_plain("/healthz").await;
        assert_eq!(health.status(), 200, "{what}");
    }

    pub async fn get(&self, token: &str, path: &str) -> reqwest::Response {
        self.send(reqwest::Method::GET, token, path).await
    }

    pub async fn get_json(&self, token: &str, path: &str) -> Value {
        self.get(token, path)
            .await
            .json()
            .await
            .unwrap_or_else(|e| panic!("JSON body of GET {path}: {e}"))
    }

    pub async fn delete(&self, token: &str, path: &str) -> reqwest::Response {
        self.send(reqwest::Method::DELETE, token, path).await
    }

    pub async fn session_info(&self, token: &str, session: &str) -> Value {
        self.get_json(token, &format!("/sessions/{session}")).await
    }

    pub async fn cancel(&self, token: &str, session: &str) -> reqwest::Response {
        let path = format!("/sessions/{session}/cancel");
        self.send(reqwest::Method::POST, token, &path).await
    }

    pub async fn answer_permission(
        &self,
        token: &str,
        session: &str,
        request_id: &str,
        option_id: &str,
    ) -> reqwest::Response {
        self.request(
            reqwest::Method::POST,
            token,
            &format!("/sessions/{session}/permissions/{request_id}"),
        )
        .json(&serde_json::json!({ "option_id": option_id }))
        .send()
        .await
        .expect("permission answer request")
    }

    pub async fn events(
        &self,
        token: &str,
        session: &str,
        last_event_id: Option<u64>,
    ) -> EventStream {
        let mut request = self
            .http
            .get(format!("{}/v1/sessions/{session}/events", self.url))
            .bearer_auth(token);
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id.to_string());
        }
        let response = request.send().await.expect("events request");
        assert_eq!(response.status(), 200, "opening the event stream");
        EventStream::new(response)
    }
}

impl Client {
    /// Sends `text` to `session` with the device's `token`, asserts 202 and reads `events`
    /// until its `turn_end` (what [`Conversation::turn`] does without a [`Conversation`]).
    pub async fn turn(
        &self,
        token: &str,
        session: &str,
        events: &mut EventStream,
        text: &str,
    ) -> Vec<Received> {
        let status = self.post_message(token, session, text).await.status();
        assert_eq!(status, 202, "message {text:?} accepted");
        events
            .until(&format!("turn_end of {text:?}"), |e| e.event == "turn_end")
            .await
    }
}

/// `warren gateway` as a child process, the real binary in a process group of its own: for
/// tests that need what is the process's own, such as the `AWS_*` settings `--snapshots` reads
/// from its environment. Its agent is the built-in shell agent beside it, without warm workers;
/// `extra_args` and `env` come on top. Its [`Client`] by `Deref`. Dropping it stops it by its pid
/// (SIGTERM, SIGKILL after [`WAIT`]) and then the hands it left for a next gateway.
pub struct GatewayProcess {
    client: Client,
    pub data: PathBuf,
    child: std::process::Child,
}

impl GatewayProcess {
    pub fn start(data: &Path, extra_args: &[String], env: &[(&str, String)]) -> GatewayProcess {
        use std::io::BufRead;
        use std::os::unix::process::CommandExt;
        let warren = warren_bin();
        let app_key = "process-app-key";
        let mut child = std::process::Command::new(&warren)
            .args(["gateway", "--listen", "127.0.0.1:0", "--app-key", app_key])
            .args(["--warm-workers", "0", "--brain-placement", "host"])
            .arg("--agent")
            .arg(format!("{} shell-agent", warren.display()))
            .arg("--data")
            .arg(data)
            .args(extra_args)
            .env("WARREN_BIN", &warren)
            .env_remove("WARREN_APP_KEY")
            .env("WARREN_LOG", "warn")
            .envs(env.iter().map(|(name, value)| (name, value)))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .process_group(0)
            .spawn()
            .expect("starts warren gateway");
        let stdout = child.stdout.take().expect("stdout piped");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                let _ = tx.send(line);
            }
        });
        let line = lines
            .recv_timeout(WAIT)
            .expect("the gateway prints its address");
        let url = listening_url(&line, "gateway");
        GatewayProcess {
            client: Client {
                url,
                app_key: app_key.to_owned(),
                http: reqwest::Client::new(),
            },
            data: data.to_path_buf(),
            child,
        }
    }
}

impl GatewayProcess {
    /// Sends the gateway process itself (not its agents) `signal` (`STOP`, `CONT`, ...), as
    /// `kill -<signal> <pid>` does.
    pub fn signal(&self, signal: &str) {
        kill(signal, self.child.id(), "the gateway process");
    }

    /// SIGKILL to the gateway's whole process group (it and the agents it runs on the host),
    /// as a machine that dies would; waits until the gateway is gone. Its hands are left.
    pub fn kill_9(&mut self) {
        // A group already gone is not an error: the gateway may have died by itself.
        let _ = warren_process::signal_group(self.child.id() as i32, rustix::process::Signal::KILL);
        let _ = self.child.wait();
    }
}

impl std::ops::Deref for GatewayProcess {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = std::time::Instant::now() + WAIT;
        while matches!(self.child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        stop_left_hands(&self.data);
    }
}

/// One device's session with its event stream open: what most turn tests talk to.
pub struct Conversation<'a> {
    pub gw: &'a TestGateway,
    pub token: String,
    pub session: String,
    pub events: EventStream,
}

impl Conversation<'_> {
    pub async fn send(&self, text: &str) -> reqwest::Response {
        self.gw.post_message(&self.token, &self.session, text).await
    }

    /// Sends `text` and asserts it was accepted (202).
    pub async fn accept(&self, text: &str) {
        let status = self.send(text).await.status();
        assert_eq!(status, 202, "message {text:?} accepted");
    }

    /// Sends `text`, asserts 202 and reads until the agent asks for a permission; returns the
    /// `permission_request`.
    pub async fn permission_request_for(&mut self, text: &str) -> Received {
        self.accept(text).await;
        let seen = self
            .until(&format!("the permission request of {text:?}"), |e| {
                e.event == "permission_request"
            })
            .await;
        seen.last().expect("a permission_request").clone()
    }

    /// Reads until the first event satisfying `done`, returning everything read including it.
    pub async fn until(
        &mut self,
        what: &str,
        done: impl FnMut(&Received) -> bool,
    ) -> Vec<Received> {
        self.events.until(what, done).await
    }

    /// Sends `text`, asserts 202 and reads until the agent's first update on it: the turn is
    /// running.
    pub async fn start_working(&mut self, text: &str) -> Vec<Received> {
        self.accept(text).await;
        self.events
            .until(&format!("the agent working on {text:?}"), |e| {
                e.event == "update"
            })
            .await
    }

    /// Sends `text`, reads until its `turn_end` and asserts the turn ended well (`end_turn`).
    pub async fn turn_ok(&mut self, text: &str) -> Vec<Received> {
        let seen = self.turn(text).await;
        assert_eq!(stop_reason(&seen), "end_turn", "{text}: {seen:#?}");
        seen
    }

    /// Reads until the next `turn_end`.
    pub async fn until_turn_end(&mut self, what: &str) -> Vec<Received> {
        self.events
            .until(&format!("turn_end of {what}"), |e| e.event == "turn_end")
            .await
    }

    /// Sends `text`, asserts 202 and reads until its `turn_end`.
    pub async fn turn(&mut self, text: &str) -> Vec<Received> {
        self.accept(text).await;
        self.until_turn_end(&format!("{text:?}")).await
    }

    pub async fn cancel(&self) -> reqwest::Response {
        self.gw.cancel(&self.token, &self.session).await
    }

    pub async fn info(&self) -> Value {
        self.gw.session_info(&self.token, &self.session).await
    }

    pub async fn answer_permission(&self, request_id: &str, option_id: &str) -> reqwest::Response {
        self.gw
            .answer_permission(&self.token, &self.session, request_id, option_id)
            .await
    }

    /// `POST /sessions/{id}/previews` of `port` (any JSON value, so bad ones can be sent too).
    pub async fn create_preview(&self, port: Value) -> reqwest::Response {
        let path = format!("/sessions/{}/previews", self.session);
        self.gw
            .request(reqwest::Method::POST, &self.token, &path)
            .json(&serde_json::json!({ "port": port }))
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"))
    }

    /// `DELETE /sessions/{id}/previews/{port}`.
    pub async fn revoke_preview(&self, port: u16) -> reqwest::Response {
        let path = format!("/sessions/{}/previews/{port}", self.session);
        self.gw.delete(&self.token, &path).await
    }

    /// The session's workspace directory on disk.
    pub fn workspace(&self) -> PathBuf {
        self.gw
            .data
            .join("sessions")
            .join(&self.session)
            .join("workspace")
    }
}

/// The text of every `update` event, concatenated.
pub fn text_of(events: &[Received]) -> String {
    events
        .iter()
        .filter(|e| e.event == "update")
        .map(|e| e.data["update"].to_string())
        .collect()
}

/// The agent's streamed text: its `agent_message_chunk`s, in order.
pub fn agent_text(events: &[Received]) -> String {
    events
        .iter()
        .filter(|e| e.event == "update")
        .filter(|e| e.data["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|e| e.data["update"]["content"]["text"].as_str())
        .collect()
}

/// The `stop_reason` of the last event read (a `turn_end`).
pub fn stop_reason(events: &[Received]) -> &Value {
    &events.last().expect("a turn_end was read").data["stop_reason"]
}

/// The first event of kind `event`.
pub fn first_of<'a>(events: &'a [Received], event: &str) -> &'a Received {
    events
        .iter()
        .find(|e| e.event == event)
        .unwrap_or_else(|| panic!("a {event} event among {events:#?}"))
}

/// One SSE event as the client saw it.
#[derive(Debug, Clone)]
pub struct Received {
    pub id: Option<u64>,
    pub event: String,
    pub data: Value,
}

type ByteStream = std::pin::Pin<
    Box<dyn futures_util::Stream<Item = Result<sse_stream::Sse, sse_stream::Error>> + Send>,
>;

pub struct EventStream {
    inner: ByteStream,
}

impl EventStream {
    pub fn new(response: reqwest::Response) -> EventStream {
        EventStream {
            inner: Box::pin(sse_stream::SseByteStream::new(response.bytes_stream())),
        }
    }

    /// The next event (heartbeat comments skipped), or `None` when the stream ended.
    pub async fn next(&mut self, what: &str) -> Option<Received> {
        loop {
            let item = tokio::time::timeout(WAIT, self.inner.next())
                .await
                .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
            match item {
                None | Some(Err(_)) => return None,
                Some(Ok(sse)) => {
                    let Some(data) = sse.data else { continue };
                    return Some(Received {
                        id: sse.id.and_then(|id| id.parse().ok()),
                        event: sse.event.unwrap_or_default(),
                        data: serde_json::from_str(&data).expect("event data is JSON"),
                    });
                }
            }
        }
    }

    /// Reads until an event satisfies `done`, returning everything read including it.
    pub async fn until(
        &mut self,
        what: &str,
        mut done: impl FnMut(&Received) -> bool,
    ) -> Vec<Received> {
        let mut seen = Vec::new();
        loop {
            let event = self
                .next(what)
                .await
                .unwrap_or_else(|| panic!("stream ended before {what}; saw {seen:#?}"));
            let finished = done(&event);
            seen.push(event);
            if finished {
                return seen;
            }
        }
    }
}

/// The URL in a `warren <program> listening on <url>` line.
pub fn listening_url(line: &str, program: &str) -> String {
    line.strip_prefix(&format!("warren {program} listening on "))
        .unwrap_or_else(|| panic!("a `warren {program} listening on` line, got {line:?}"))
        .trim()
        .to_owned()
}

/// Sends `signal` (`9`, `TERM`, `STOP`, ...) to `pid` as `kill -<signal> <pid>` does, and
/// asserts it was delivered (`what` names the process).
pub fn kill(signal: &str, pid: impl std::fmt::Display, what: &str) {
    let sent = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .unwrap_or_else(|e| panic!("kill -{signal} {what}: {e}"));
    assert!(sent.success(), "kill -{signal} {what} (pid {pid})");
}

/// The `warren` binary of this package, which cargo builds for its tests.
pub fn warren_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_warren"))
}

/// `warren-test-agent`, the scripted ACP agent of `warren-brain`, next to the `warren` binary.
/// Cargo builds it with the workspace (`cargo test --workspace --all-targets`), not for this
/// package alone.
pub fn test_agent_bin() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_warren")).with_file_name("warren-test-agent");
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build -p warren-brain --bin warren-test-agent`, or \
         run the tests with `cargo test --workspace --all-targets`",
        path.display()
    );
    path
}

/// Collects everything a test's gateway logs, at every level (a `tracing` writer into memory).
#[derive(Clone, Default)]
pub struct LogBuffer(pub std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
