//! Interactive PTY sessions (pty-sessions.md): long-lived shells over REST + WebSocket that
//! clients can reconnect to (`since`), watch (`mode=viewer`) and take over (`takeover=1`).
//!
//! This module holds the session registry and the REST routes; [`session`] owns one session's
//! state and output path, [`ring`] the replay ring, [`ws`] the WebSocket connections, [`agent`]
//! the exec engine's commands served with the same protocol. Spawning and killing processes is
//! `warren-process`'s job. [`PtyError`] is this feature's error type;
//! its statuses are picked in `crate::error`, with every other execd error's.

pub mod agent;
pub mod ring;
pub mod session;
pub mod ws;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use warren_protocol::error::ErrorBody;
use warren_protocol::pty::{CreatePtyRequest, CreatePtyResponse, PtyStatus};

use crate::Config;
use crate::error::{ApiError, OptionalJson, Path as UrlPath};
use session::Session;

pub mod error;
pub use error::PtyError;

impl IntoResponse for PtyError {
    fn into_response(self) -> Response {
        ApiError::from(self).into_response()
    }
}

/// The registry of PTY sessions, shared by every route.
#[derive(Clone)]
pub struct PtySessions {
    inner: Arc<Registry>,
}

struct Registry {
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    max_sessions: usize,
    default_cwd: PathBuf,
    timings: PtyTimings,
}

/// The keepalive and takeover durations. The defaults are the spec's; the daemon takes them
/// from (hidden) flags so tests can shorten them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PtyTimings {
    /// Interval between server WebSocket pings.
    pub ping_interval: Duration,
    /// A connection from which nothing arrived for this long is dropped (checked at each ping).
    pub silence_timeout: Duration,
    /// One write to the client or to the shell's stdin gives up after this long.
    pub write_timeout: Duration,
    /// How long a takeover waits for the old holder to go.
    pub takeover_timeout: Duration,
}

impl Default for PtyTimings {
    fn default() -> Self {
        Self {
            ping_interval: Duration::from_secs(30),
            silence_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(10),
            takeover_timeout: Duration::from_secs(5),
        }
    }
}

impl PtyTimings {
    pub fn from_config(config: &Config) -> Self {
        // A zero interval would make tokio's timer panic; a millisecond is the floor.
        let ms = |n: u64| Duration::from_millis(n.max(1));
        Self {
            ping_interval: ms(config.pty_ping_interval_ms),
            silence_timeout: ms(config.pty_silence_timeout_ms),
            write_timeout: ms(config.pty_write_timeout_ms),
            takeover_timeout: ms(config.pty_takeover_timeout_ms),
        }
    }
}

impl PtySessions {
    pub fn new(config: &Config) -> Self {
        Self {
            inner: Arc::new(Registry {
                sessions: Mutex::new(HashMap::new()),
                max_sessions: config.max_pty_sessions,
                default_cwd: config.root.clone(),
                timings: PtyTimings::from_config(config),
            }),
        }
    }

    pub fn timings(&self) -> PtyTimings {
        self.inner.timings
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Session>>> {
        // Inserts and removes cannot leave the map half-updated, so a poisoned lock is usable.
        self.inner
            .sessions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Creates a session (no shell yet). `cwd` is made if missing; relative paths are taken
    /// from the daemon's root directory.
    pub fn create(&self, request: CreatePtyRequest) -> Result<String, PtyError> {
        // Checked before the cwd is made too, so a refused request leaves no directory behind.
        if self.sessions().len() >= self.inner.max_sessions {
            return Err(PtyError::TooManySessions(self.inner.max_sessions));
        }
        for (name, value) in request.env.iter().flatten() {
            if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
                return Err(PtyError::InvalidBody(format!(
                    "env: {name:?} is not a valid variable name, or its value holds a NUL byte"
                )));
            }
        }
        let cwd = match request.cwd.as_deref() {
            None | Some("") => self.inner.default_cwd.clone(),
            Some(dir) => self.inner.default_cwd.join(Path::new(dir)),
        };
        std::fs::create_dir_all(&cwd).map_err(|e| {
            PtyError::InvalidBody(format!("cannot create cwd {}: {e}", cwd.display()))
        })?;
        let id = uuid::Uuid::new_v4().to_string();
        let mut sessions = self.sessions();
        if sessions.len() >= self.inner.max_sessions {
            return Err(PtyError::TooManySessions(self.inner.max_sessions));
        }
        let command = request.command.filter(|c| !c.is_empty());
        let env: Vec<(String, String)> = request.env.unwrap_or_default().into_iter().collect();
        sessions.insert(
            id.clone(),
            Arc::new(Session::new(
                id.clone(),
                cwd,
                command,
                env,
                self.inner.timings.takeover_timeout,
            )),
        );
        Ok(id)
    }

    pub fn get(&self, id: &str) -> Result<Arc<Session>, PtyError> {
        self.sessions()
            .get(id)
            .cloned()
            .ok_or_else(|| PtyError::NotFound(id.to_string()))
    }

    /// Removes the session and kills every process it started.
    pub async fn delete(&self, id: &str) -> Result<(), PtyError> {
        let session = self
            .sessions()
            .remove(id)
            .ok_or_else(|| PtyError::NotFound(id.to_string()))?;
        session.teardown().await;
        Ok(())
    }

    /// Kills every session's processes (daemon shutdown).
    pub async fn shutdown(&self) {
        let sessions: Vec<_> = self
            .sessions()
            .drain()
            .map(|(_, session)| session)
            .collect();
        futures_util::future::join_all(sessions.iter().map(|session| session.teardown())).await;
    }
}

pub fn routes(state: PtySessions) -> OpenApiRouter {
    OpenApiRouter::new()
        .routes(routes!(create_session))
        .routes(routes!(session_status, delete_session))
        .routes(routes!(ws::attach))
        .with_state(state)
}

/// The query of a WebSocket attach, as the document shows it; the handlers read the raw map
/// ([`WsParams::parse`]), since the spec matches exact strings and ignores anything else.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(crate) struct WsQuery {
    /// Replay from this output offset (lenient: the leading integer, else 0).
    since: Option<String>,
    /// `viewer` attaches read-only beside the holder.
    mode: Option<String>,
    /// `1` takes the session over from its holder (close code 4001 for the old one).
    takeover: Option<String>,
    /// `0` runs the command on pipes instead of a PTY (pipe mode).
    pty: Option<String>,
}

/// Creates a session; its shell starts when the first holder attaches.
#[utoipa::path(
    post, path = "/pty", tag = "pty",
    request_body(content = Option<CreatePtyRequest>, description = "May be empty"),
    responses(
        (status = 201, description = "Created", body = CreatePtyResponse),
        (status = 400, description = "`INVALID_REQUEST_BODY`: unreadable, an unknown field, a bad `env` or a `cwd` that cannot be made", body = ErrorBody),
        (status = 429, description = "`TOO_MANY_SESSIONS`: over `--max-pty-sessions`", body = ErrorBody),
    )
)]
async fn create_session(
    State(sessions): State<PtySessions>,
    OptionalJson(request): OptionalJson<CreatePtyRequest>,
) -> Result<Response, PtyError> {
    let session_id = sessions.create(request)?;
    Ok((
        StatusCode::CREATED,
        axum::Json(CreatePtyResponse { session_id }),
    )
        .into_response())
}

/// Whether the session's shell runs, and how much output it produced.
#[utoipa::path(
    get, path = "/pty/{id}", tag = "pty",
    params(("id" = String, Path, description = "From `POST /pty`")),
    responses(
        (status = 200, description = "The session", body = PtyStatus),
        (status = 404, description = "`CONTEXT_NOT_FOUND`", body = ErrorBody),
    )
)]
async fn session_status(
    State(sessions): State<PtySessions>,
    UrlPath(id): UrlPath<String>,
) -> Result<axum::Json<PtyStatus>, PtyError> {
    let session = sessions.get(&id)?;
    Ok(axum::Json(PtyStatus {
        session_id: id,
        running: session.is_running(),
        output_offset: session.output_offset(),
    }))
}

/// Removes the session and kills every process it started.
#[utoipa::path(
    delete, path = "/pty/{id}", tag = "pty",
    params(("id" = String, Path, description = "From `POST /pty`")),
    responses(
        (status = 200, description = "Deleted"),
        (status = 404, description = "`CONTEXT_NOT_FOUND`", body = ErrorBody),
    )
)]
async fn delete_session(
    State(sessions): State<PtySessions>,
    UrlPath(id): UrlPath<String>,
) -> Result<StatusCode, PtyError> {
    sessions.delete(&id).await?;
    Ok(StatusCode::OK)
}

/// The WebSocket query parameters, exact string matches as the spec says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WsParams {
    pub pipe: bool,
    pub since: u64,
    pub takeover: bool,
    pub viewer: bool,
}

impl WsParams {
    pub fn parse(query: &HashMap<String, String>) -> Self {
        let is = |key: &str, value: &str| query.get(key).is_some_and(|v| v == value);
        Self {
            pipe: is("pty", "0"),
            since: query.get("since").map_or(0, |s| parse_since(s)),
            takeover: is("takeover", "1"),
            viewer: is("mode", "viewer"),
        }
    }
}

/// OpenSandbox's lenient `since`: the leading integer; anything without one, negative, or too
/// large for an offset means 0 (replay everything retained).
pub fn parse_since(text: &str) -> u64 {
    let text = text.trim_start();
    let (negative, rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let digits_len = rest.bytes().take_while(u8::is_ascii_digit).count();
    if negative || digits_len == 0 {
        return 0;
    }
    rest[..digits_len].parse().unwrap_or(0)
}

/// Handshake checks before the upgrade, in the spec's order.
fn check_handshake(session: &Session, params: WsParams, is_upgrade: bool) -> Result<(), PtyError> {
    if params.viewer {
        if !session.is_running() {
            return Err(PtyError::ViewerRequiresRunningSession(session.id.clone()));
        }
        return Ok(());
    }
    if session.is_adopted() && !params.takeover {
        return Err(PtyError::AgentHolds(session.id.clone()));
    }
    if session.has_holder() && !(params.takeover && is_upgrade) {
        return Err(PtyError::AlreadyConnected(session.id.clone()));
    }
    Ok(())
}

pub(crate) fn upgrade_or_error(
    session: &Session,
    params: WsParams,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<WebSocketUpgrade, PtyError> {
    check_handshake(session, params, upgrade.is_ok())?;
    upgrade.map_err(|rejection| PtyError::UpgradeRequired(rejection.body_text()))
}

pub(crate) type QueryMap = Query<HashMap<String, String>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_is_parsed_leniently() {
        let cases = [
            ("", 0),
            ("0", 0),
            ("42", 42),
            ("12abc", 12),
            ("abc", 0),
            ("-5", 0),
            ("+7", 7),
            ("99999999999999999999", 0),
            ("18446744073709551615", u64::MAX),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_since(text), expected, "since={text:?}");
        }
    }

    #[test]
    fn query_flags_match_exact_strings_only() {
        let query = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>()
        };
        let params = WsParams::parse(&query(&[
            ("pty", "0"),
            ("takeover", "1"),
            ("mode", "viewer"),
        ]));
        assert_eq!(
            params,
            WsParams {
                pipe: true,
                since: 0,
                takeover: true,
                viewer: true
            }
        );
        let params = WsParams::parse(&query(&[
            ("pty", "false"),
            ("takeover", "true"),
            ("mode", "Viewer"),
        ]));
        assert_eq!(params, WsParams::default());
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        config: Config,
    }

    #[test]
    fn timings_default_to_the_spec_from_flags_and_from_config_default() {
        use clap::Parser;
        let spec = PtyTimings {
            ping_interval: Duration::from_secs(30),
            silence_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(10),
            takeover_timeout: Duration::from_secs(5),
        };
        assert_eq!(PtyTimings::default(), spec);
        assert_eq!(PtyTimings::from_config(&Config::default()), spec);
        let parsed = Cli::try_parse_from(["execd"]).expect("parses no flags");
        assert_eq!(PtyTimings::from_config(&parsed.config), spec);
        let flags = [
            "execd",
            "--pty-ping-interval-ms=100",
            "--pty-silence-timeout-ms=200",
            "--pty-write-timeout-ms=300",
            "--pty-takeover-timeout-ms=0",
        ];
        let parsed = Cli::try_parse_from(flags).expect("parses the hidden flags");
        let timings = PtyTimings::from_config(&parsed.config);
        assert_eq!(timings.ping_interval, Duration::from_millis(100));
        assert_eq!(timings.silence_timeout, Duration::from_millis(200));
        assert_eq!(timings.write_timeout, Duration::from_millis(300));
        // Zero would make the timers panic; it is raised to a millisecond.
        assert_eq!(timings.takeover_timeout, Duration::from_millis(1));
    }
}
