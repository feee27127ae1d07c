//! Agent terminals: every command the exec engine runs (the agent's ACP terminals and its
//! exec-tool sessions) as a PTY-protocol session a person can watch and answer.
//! `GET /v1/agent-terminals` lists them; `GET /v1/agent-terminals/{name}/ws` speaks
//! pty-sessions.md's WebSocket protocol for one, through the same [`super::ws`] code as `/pty`.
//!
//! [`AgentTerminals`] is the engine's [`Watcher`]: each session the engine starts becomes an
//! adopted [`Session`] named `term-<terminal_id>` or `exec-<session_id>`, fed every output byte
//! from the first and its exit once drained, and forgotten when the engine forgets the command.
//! The agent keeps driving its command through its own engine calls and is never evicted: a
//! connection is a viewer (`mode=viewer`) or, with `takeover=1`, the one holder whose typing
//! goes to the command's stdin beside the agent's. Nothing here starts or kills a process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use axum::extract::State;
use axum::extract::ws::WebSocketUpgrade;
use axum::response::Response;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use warren_exec::{Feed, SessionKind, WatchedSession, Watcher};
use warren_protocol::error::ErrorBody;
use warren_protocol::pty::PtyMode;
use warren_protocol::terminal::{AgentTerminalInfo, AgentTerminalList, AgentTerminalSource};

use super::session::Session;
use super::{PtyError, PtyTimings, QueryMap};
use crate::Config;
use crate::error::Path as UrlPath;

/// Most characters of a title.
const MAX_TITLE_CHARS: usize = 80;

/// The engine's commands as sessions, by name. Cheap to clone.
#[derive(Clone)]
pub struct AgentTerminals {
    registry: Arc<Registry>,
}

struct Registry {
    terminals: Mutex<HashMap<String, Entry>>,
    timings: PtyTimings,
}

struct Entry {
    session: Arc<Session>,
    source: AgentTerminalSource,
    title: String,
    started_at: chrono::DateTime<chrono::Utc>,
}

impl Registry {
    fn terminals(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        // Single inserts and removes: a poisoned lock still guards a consistent map.
        self.terminals
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl AgentTerminals {
    pub fn new(config: &Config) -> Self {
        Self {
            registry: Arc::new(Registry {
                terminals: Mutex::new(HashMap::new()),
                timings: PtyTimings::from_config(config),
            }),
        }
    }

    /// Every agent terminal, oldest first.
    pub fn list(&self) -> AgentTerminalList {
        let mut entries: Vec<(chrono::DateTime<chrono::Utc>, AgentTerminalInfo)> = self
            .registry
            .terminals()
            .iter()
            .map(|(name, entry)| {
                let info = AgentTerminalInfo {
                    name: name.clone(),
                    source: entry.source,
                    title: entry.title.clone(),
                    mode: entry.session.mode(),
                    running: entry.session.is_running(),
                    output_offset: entry.session.output_offset(),
                    started_at: entry
                        .started_at
                        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                };
                (entry.started_at, info)
            })
            .collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.name.cmp(&b.1.name)));
        AgentTerminalList {
            terminals: entries.into_iter().map(|(_, info)| info).collect(),
        }
    }

    fn get(&self, name: &str) -> Result<Arc<Session>, PtyError> {
        self.registry
            .terminals()
            .get(name)
            .map(|entry| Arc::clone(&entry.session))
            .ok_or_else(|| PtyError::UnknownAgentTerminal(name.to_owned()))
    }
}

impl Watcher for AgentTerminals {
    fn started(&self, command: WatchedSession) -> Arc<dyn Feed> {
        let (prefix, source) = match command.kind {
            SessionKind::Terminal => ("term", AgentTerminalSource::Terminal),
            SessionKind::Exec => ("exec", AgentTerminalSource::Exec),
        };
        let name = format!("{prefix}-{}", command.id);
        let mode = if command.tty {
            PtyMode::Pty
        } else {
            PtyMode::Pipe
        };
        let session = Arc::new(Session::adopted(
            name.clone(),
            mode,
            command.input,
            self.registry.timings.takeover_timeout,
        ));
        let entry = Entry {
            session: Arc::clone(&session),
            source,
            title: title_of(&command.command_line),
            started_at: command.started_at,
        };
        self.registry.terminals().insert(name.clone(), entry);
        Arc::new(AgentFeed {
            name,
            session,
            registry: Arc::downgrade(&self.registry),
        })
    }
}

/// One command's feed: output and exit into its session, removal out of the registry.
struct AgentFeed {
    name: String,
    session: Arc<Session>,
    registry: Weak<Registry>,
}

impl Feed for AgentFeed {
    fn output(&self, bytes: &[u8]) {
        self.session.publish_output(bytes);
    }

    fn finished(&self, exit_code: Option<i32>) {
        // pty-sessions.md's exit frame says -1 for a command a signal ended.
        self.session.finish_adopted(exit_code.unwrap_or(-1));
    }

    fn removed(&self) {
        let Some(registry) = self.registry.upgrade() else {
            return;
        };
        let mut terminals = registry.terminals();
        // Ids are not reused soon, but a newer command under this name stays.
        if terminals
            .get(&self.name)
            .is_some_and(|entry| Arc::ptr_eq(&entry.session, &self.session))
        {
            terminals.remove(&self.name);
        }
    }
}

/// A command line as a title: on one line (every run of whitespace and control characters
/// one space) and at most [`MAX_TITLE_CHARS`] characters, the last of them `…` when cut.
pub fn title_of(command_line: &str) -> String {
    let one_line = command_line
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|word| !word.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    if one_line.chars().count() <= MAX_TITLE_CHARS {
        return one_line;
    }
    let mut title: String = one_line.chars().take(MAX_TITLE_CHARS - 1).collect();
    title.push('…');
    title
}

pub fn routes(state: AgentTerminals) -> OpenApiRouter {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(attach))
        .with_state(state)
}

/// Every command of the exec engine, oldest first.
#[utoipa::path(
    get, path = "/v1/agent-terminals", tag = "agent-terminals", operation_id = "list_agent_terminals",
    responses((status = 200, description = "The agent's commands", body = AgentTerminalList))
)]
async fn list(State(terminals): State<AgentTerminals>) -> axum::Json<AgentTerminalList> {
    axum::Json(terminals.list())
}

/// `GET /v1/agent-terminals/{name}/ws`: the handshake checks of pty-sessions.md (a holder
/// needs `takeover=1`), then a viewer or the holder.
#[utoipa::path(
    get, path = "/v1/agent-terminals/{name}/ws", tag = "agent-terminals",
    operation_id = "attach_agent_terminal",
    description = "Watches (`mode=viewer`) or answers (`takeover=1`) one of the agent's commands \
        over pty-sessions.md's WebSocket protocol.",
    params(
        ("name" = String, Path, description = "`term-<terminal_id>` or `exec-<session_id>`"),
        super::WsQuery,
    ),
    responses(
        (status = 101, description = "Switching protocols: the WebSocket"),
        (status = 404, description = "`TERMINAL_NOT_FOUND`", body = ErrorBody),
        (status = 409, description = "`ALREADY_CONNECTED` (the agent drives it: ask `mode=viewer` or `takeover=1`) or `VIEWER_REQUIRES_RUNNING_SESSION`", body = ErrorBody),
        (status = 426, description = "`UPGRADE_REQUIRED`: a plain request, not a WebSocket handshake", body = ErrorBody),
    )
)]
async fn attach(
    State(terminals): State<AgentTerminals>,
    UrlPath(name): UrlPath<String>,
    axum::extract::Query(query): QueryMap,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, PtyError> {
    let session = terminals.get(&name)?;
    super::ws::serve(session, terminals.registry.timings, &query, upgrade)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles_are_one_shortened_line() {
        let long = "x".repeat(100);
        let cut = format!("{}…", "x".repeat(79));
        let cases = [
            ("ls -l", "ls -l"),
            ("  make \t test  ", "make test"),
            ("printf 'a'\nread n\r\necho $n", "printf 'a' read n echo $n"),
            ("bash -c printf\u{1b}[31m", "bash -c printf [31m"),
            (&long, &cut),
            (&"é".repeat(80), &"é".repeat(80)),
            ("", ""),
        ];
        for (command_line, title) in cases {
            assert_eq!(title_of(command_line), title, "{command_line:?}");
        }
        assert_eq!(title_of(&long).chars().count(), MAX_TITLE_CHARS);
    }
}
