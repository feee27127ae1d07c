//! The person's terminals (files-terminals-previews.md "Terminals"): interactive shells in the
//! session's hands, each a PTY session of its execd, named `default` or any
//! `[a-z0-9-]{1,32}`. `GET /terminals/{name}/ws` makes the shell on first attach (`POST /pty`)
//! and then carries the WebSocket to execd's `/pty/{id}/ws` unchanged
//! ([`crate::hands::tunnel`]), so the whole pty-sessions.md protocol holds through the gateway:
//! holder, `mode=viewer`, `takeover=1` with 4001, `since`, resize, signals, exit. An attached
//! terminal holds the hands awake. A shell belongs to one hands instance: after the hands were
//! rebuilt or restored, the name gets a new shell.

use std::collections::HashMap;
use std::sync::Mutex;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use warren_protocol::pty::CreatePtyRequest;

use crate::error::GatewayError;
use crate::session::Session;

/// One terminal as `GET /terminals` lists it.
#[derive(Debug, Clone, Serialize)]
pub struct TerminalInfo {
    pub name: String,
    /// `shell`: the person's.
    pub kind: &'static str,
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

    /// The session's terminals. Listing never starts or resumes the hands: when they do not
    /// run, every shell is reported not running.
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
        let live = match session.hands.state() {
            crate::hands::HandsState::Running => session.hands.endpoint().await.ok(),
            _ => None,
        };
        let mut list = Vec::with_capacity(known.len());
        for (name, pty_id, nonce, created_at) in known {
            let status = match &live {
                Some(endpoint) if endpoint.nonce == nonce => match endpoint.client() {
                    Ok(client) => client.pty_status(&pty_id).await.ok(),
                    Err(_) => None,
                },
                _ => None,
            };
            list.push(TerminalInfo {
                title: name.clone(),
                name,
                kind: "shell",
                running: status.as_ref().is_some_and(|s| s.running),
                output_offset: status.map_or(0, |s| s.output_offset),
                created_at,
            });
        }
        list.sort_by(|a, b| a.name.cmp(&b.name));
        list
    }

    /// `GET /terminals/{name}/ws`: the shell's WebSocket (made on first attach), holding the
    /// hands awake while it is open.
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
                    created_at: crate::store::now_rfc3339(),
                };
                self.map()
                    .entry(session.id.clone())
                    .or_default()
                    .insert(name.to_owned(), terminal);
                created.session_id
            }
        };
        // Only pty-sessions.md's parameters go on; the access token stays here.
        let query: Vec<&str> = request
            .uri()
            .query()
            .unwrap_or("")
            .split('&')
            .filter(|pair| {
                ["since=", "mode=", "takeover=", "pty="]
                    .iter()
                    .any(|key| pair.starts_with(key))
            })
            .collect();
        let path = format!("/pty/{pty_id}/ws?{}", query.join("&"));
        // The hands stay awake while the terminal is attached.
        let hold = session.hands.hold();
        let answer = crate::hands::tunnel::forward(&endpoint, &path, request, hold)
            .await
            .map_err(|e| GatewayError::Internal(e.to_string()))?;
        Ok(answer.into_response())
    }
}

#[cfg(test)]
mod tests {
    use super::valid_name;

    #[test]
    fn terminal_names_are_short_lowercase_words() {
        for good in ["default", "a", "build-2", &"x".repeat(32)] {
            assert!(valid_name(good), "{good}");
        }
        for bad in ["", "Default", "a b", "../x", "x_y", &"x".repeat(33), "é"] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}
