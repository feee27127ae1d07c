//! The session's terminals (files-terminals-previews.md "Terminals"), named `[a-z0-9-]{1,32}`:
//! - `kind: "shell"`, the person's interactive shells in the hands, each a PTY session of its
//!   execd. `GET /terminals/{name}/ws` makes the shell on first attach (`POST /pty`) and then
//!   carries the WebSocket to execd's `/pty/{id}/ws`. A shell belongs to one hands instance:
//!   after the hands were rebuilt or restored, the name gets a new shell.
//! - `kind: "agent"`, the commands the agent runs in the hands (its ACP terminals and exec-tool
//!   sessions), named `term-<id>` and `exec-<id>` by execd, which lists them at
//!   `/v1/agent-terminals` and serves each at `/v1/agent-terminals/{name}/ws`. They are watched
//!   (`mode=viewer`) or answered (`takeover=1`); the agent keeps driving them meanwhile. Names
//!   beginning `term-` or `exec-` are never shells.
//!
//! Both WebSockets are carried unchanged ([`crate::tunnel`]), so the whole
//! pty-sessions.md protocol holds through the gateway: holder, `mode=viewer`, `takeover=1` with
//! 4001, `since`, resize, signals, exit. An attached terminal holds the hands awake; listing
//! never starts or resumes them.

use std::collections::HashMap;
use std::sync::Mutex;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use warren_protocol::pty::CreatePtyRequest;

use crate::error::GatewayError;
use crate::session::Session;

/// Name prefixes of the agent's terminals (execd's `term-<terminal_id>`, `exec-<session_id>`).
const AGENT_PREFIXES: [&str; 2] = ["term-", "exec-"];

/// Whose a terminal is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TerminalKind {
    /// The person's shell.
    Shell,
    /// A command the agent runs.
    Agent,
}

/// One terminal as `GET /terminals` lists it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct TerminalInfo {
    pub name: String,
    pub kind: TerminalKind,
    /// A shell's name, or the agent's command line (shortened by execd).
    pub title: String,
    pub running: bool,
    pub output_offset: u64,
    pub created_at: String,
}

struct Terminal {
    pty_id: String,
    /// The hands instance it lives in.
    nonce: String,
    created_at: String,
}

/// The person's shells of every session, by session and name.
#[derive(Default)]
pub struct Terminals {
    by_session: Mutex<HashMap<String, HashMap<String, Terminal>>>,
}

/// Whether `name` is a terminal name: `[a-z0-9-]{1,32}`.
pub fn valid_name(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Whether `headers` ask for a WebSocket: `Upgrade: websocket` and `upgrade` among the
/// `Connection` tokens (RFC 6455 §4.1, both case-insensitive).
fn is_websocket_handshake(headers: &axum::http::HeaderMap) -> bool {
    use axum::http::header;
    let upgrade = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("websocket"));
    let connection = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    upgrade && connection
}

/// Whether `name` (a valid one) names an agent's terminal rather than a shell.
pub fn is_agent_name(name: &str) -> bool {
    AGENT_PREFIXES.iter().any(|prefix| name.starts_with(prefix))
}

/// The pty-sessions.md query parameters of `request` that go on to execd, `keys` of them;
/// everything else (the access token above all) stays in the gateway.
fn forwarded_query(request: &Request, keys: &[&str]) -> String {
    request
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|pair| {
            keys.iter()
                .any(|key| pair.split_once('=').is_some_and(|(k, _)| k == *key))
        })
        .collect::<Vec<_>>()
        .join("&")
}

impl Terminals {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, HashMap<String, Terminal>>> {
        self.by_session
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Forgets the session's terminals (it is deleted).
    pub fn forget(&self, session_id: &str) {
        self.map().remove(session_id);
    }

    /// The session's terminals: its shells, then the agent's commands. Listing never starts or
    /// resumes the hands: when they do not run, every shell is reported not running and the
    /// agent's commands (which live only in running hands) are not listed.
    pub async fn list(&self, session: &Session) -> Vec<TerminalInfo> {
        let known: Vec<(String, String, String, String)> = self
            .map()
            .get(&session.id)
            .map(|terminals| {
                terminals
                    .iter()
                    .map(|(name, t)| {
                        (
                            name.clone(),
                            t.pty_id.clone(),
                            t.nonce.clone(),
                            t.created_at.clone(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        // Not a use of the hands: looking at the list keeps nothing awake.
        let running = session.hands.running_endpoint().await;
        let live = running.as_ref().map(|(endpoint, _hold)| endpoint.clone());
        let client = live.as_ref().and_then(|endpoint| endpoint.client().ok());
        let mut list = Vec::with_capacity(known.len());
        for (name, pty_id, nonce, created_at) in known {
            let status = match (&live, &client) {
                (Some(endpoint), Some(client)) if endpoint.nonce == nonce => {
                    client.pty_status(&pty_id).await.ok()
                }
                _ => None,
            };
            list.push(TerminalInfo {
                title: name.clone(),
                name,
                kind: TerminalKind::Shell,
                running: status.as_ref().is_some_and(|s| s.running),
                output_offset: status.map_or(0, |s| s.output_offset),
                created_at,
            });
        }
        list.sort_by(|a, b| a.name.cmp(&b.name));
        if let Some(client) = client {
            match client.agent_terminals().await {
                Ok(agent) => list.extend(agent.terminals.into_iter().map(|t| TerminalInfo {
                    name: t.name,
                    kind: TerminalKind::Agent,
                    title: t.title,
                    running: t.running,
                    output_offset: t.output_offset,
                    created_at: t.started_at,
                })),
                Err(error) => {
                    tracing::warn!(session = %session.id, %error, "cannot list the agent's terminals");
                }
            }
        }
        list
    }

    /// `GET /terminals/{name}/ws`: the WebSocket of a shell (made on first attach) or of an
    /// agent's command, holding the hands awake while it is open.
    pub async fn attach(
        &self,
        session: &std::sync::Arc<Session>,
        name: &str,
        request: Request,
    ) -> Result<Response, GatewayError> {
        if !valid_name(name) {
            return Err(GatewayError::InvalidRequest(format!(
                "{name:?} is not a terminal name ([a-z0-9-], 1 to 32 characters)"
            )));
        }
        // An agent's terminal starts nothing (only running hands have one), and running hands'
        // execd judges the handshake.
        if is_agent_name(name) {
            return attach_agent(session, name, request).await;
        }
        // Refused before anything starts: a plain request would start (or resume) the hands and
        // make a shell for nothing.
        if !is_websocket_handshake(request.headers()) {
            return Err(GatewayError::UpgradeRequired);
        }
        let endpoint = session.hands.endpoint().await?;
        let client = endpoint.client()?;
        let existing = self
            .map()
            .get(&session.id)
            .and_then(|terminals| terminals.get(name))
            .filter(|t| t.nonce == endpoint.nonce)
            .map(|t| t.pty_id.clone());
        let pty_id = match existing {
            Some(id) if client.pty_status(&id).await.is_ok() => id,
            _ => {
                let created = client
                    .create_pty(&CreatePtyRequest::default())
                    .await
                    .map_err(|e| GatewayError::Internal(format!("cannot make the shell: {e}")))?;
                let terminal = Terminal {
                    pty_id: created.session_id.clone(),
                    nonce: endpoint.nonce.clone(),
                    created_at: warren_store::file::now_rfc3339(),
                };
                self.map()
                    .entry(session.id.clone())
                    .or_default()
                    .insert(name.to_owned(), terminal);
                created.session_id
            }
        };
        let query = forwarded_query(&request, &["since", "mode", "takeover", "pty"]);
        let path = format!("/pty/{pty_id}/ws?{query}");
        // The hands stay awake while the terminal is attached.
        let hold = session.hands.hold();
        let answer = crate::tunnel::forward(&endpoint, &path, request, hold)
            .await
            .map_err(|e| GatewayError::Internal(e.to_string()))?;
        Ok(answer.into_response())
    }
}

/// An agent's command: only in hands that run (or are paused, and then resumed: attaching is a
/// use), never in new ones, and a 404 from execd is this gateway's `TERMINAL_NOT_FOUND`.
async fn attach_agent(
    session: &std::sync::Arc<Session>,
    name: &str,
    request: Request,
) -> Result<Response, GatewayError> {
    if !session.hands.is_running() {
        return Err(GatewayError::TerminalNotFound(name.to_owned()));
    }
    let endpoint = session.hands.endpoint().await?;
    // `pty=0` only matters when an attach starts a shell, which never happens here.
    let query = forwarded_query(&request, &["since", "mode", "takeover"]);
    let path = format!("/v1/agent-terminals/{name}/ws?{query}");
    let hold = session.hands.hold();
    let answer = crate::tunnel::forward(&endpoint, &path, request, hold)
        .await
        .map_err(|e| GatewayError::Internal(e.to_string()))?;
    if answer.status() == axum::http::StatusCode::NOT_FOUND {
        return Err(GatewayError::TerminalNotFound(name.to_owned()));
    }
    Ok(answer.into_response())
}

#[cfg(test)]
mod tests {
    use super::{is_agent_name, valid_name};

    #[test]
    fn terminal_names_are_short_lowercase_words() {
        for good in ["default", "a", "build-2", &"x".repeat(32)] {
            assert!(valid_name(good), "{good}");
        }
        for bad in ["", "Default", "a b", "../x", "x_y", &"x".repeat(33), "é"] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn agent_terminals_are_the_term_and_exec_names() {
        let cases = [
            ("term-48213", true),
            ("exec-1000", true),
            ("exec-", true),
            ("default", false),
            ("terminal", false),
            ("my-term-1", false),
            ("executor", false),
        ];
        for (name, agent) in cases {
            assert_eq!(is_agent_name(name), agent, "{name}");
        }
    }
}
