//! `warren shell-agent`: the built-in deterministic ACP agent, spoken to on stdio. Each prompt's
//! text is run as one shell command (`bash -c <text>`) in the client's terminal (the hands),
//! through the ACP terminal methods: `terminal/create`, `terminal/output` (polled, every new piece
//! of output streamed as an `agent_message_chunk`), `terminal/wait_for_exit`, `terminal/release`.
//! The command is also reported as a `tool_call` whose status follows it. Commands that start
//! with `rm`, `sudo` or `git push` are run only after `session/request_permission` says so.
//! `session/cancel` kills the command and ends the turn `cancelled`.
//!
//! It has no model and no memory beyond the working directory, so `session/resume` and
//! `session/close` are trivially supported. It needs a client with the `terminal` capability.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, CancelNotification, CloseSessionRequest, CloseSessionResponse, ContentBlock,
    ContentChunk, CreateTerminalRequest, Implementation, InitializeRequest, InitializeResponse,
    KillTerminalRequest, NewSessionRequest, NewSessionResponse, PermissionOption,
    PermissionOptionKind, PromptRequest, PromptResponse, ReleaseTerminalRequest,
    RequestPermissionOutcome, RequestPermissionRequest, ResumeSessionRequest,
    ResumeSessionResponse, SessionCapabilities, SessionCloseCapabilities, SessionId,
    SessionNotification, SessionResumeCapabilities, SessionUpdate, StopReason, Terminal,
    TerminalExitStatus, TerminalId, TerminalOutputRequest, TextContent, ToolCall, ToolCallContent,
    ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields, ToolKind, WaitForTerminalExitRequest,
};
use agent_client_protocol::{Agent, ByteStreams, Client};
use tokio::sync::watch;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

/// How often a running command's output is polled and streamed.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Output kept by the client per command.
const OUTPUT_BYTE_LIMIT: u64 = 1024 * 1024;

/// Serves ACP on stdin/stdout until the client closes stdin.
pub async fn run() -> anyhow::Result<()> {
    let transport = ByteStreams::new(
        tokio::io::stdout().compat_write(),
        tokio::io::stdin().compat(),
    );
    serve(transport)
        .await
        .map_err(|e| anyhow::anyhow!("shell agent: {e}"))
}

#[derive(Default)]
struct Sessions {
    by_id: Mutex<HashMap<String, SessionState>>,
    n_created: std::sync::atomic::AtomicU64,
}

#[derive(Clone)]
struct SessionState {
    cwd: PathBuf,
    /// Bumped by `session/cancel`.
    cancel: Arc<watch::Sender<u64>>,
}

impl Sessions {
    fn get(&self, session_id: &SessionId) -> Option<SessionState> {
        self.by_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&*session_id.0)
            .cloned()
    }

    fn insert(&self, session_id: &str, cwd: PathBuf) {
        let state = SessionState {
            cwd,
            cancel: Arc::new(watch::channel(0).0),
        };
        self.by_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(session_id.to_owned(), state);
    }

    fn remove(&self, session_id: &SessionId) {
        self.by_id
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&*session_id.0);
    }
}

/// Serves the shell agent on any ACP transport (stdio in production, in-memory in tests).
pub async fn serve(
    transport: impl agent_client_protocol::ConnectTo<Agent> + 'static,
) -> agent_client_protocol::Result<()> {
    let sessions = Arc::new(Sessions::default());
    let on_new = sessions.clone();
    let on_resume = sessions.clone();
    let on_close = sessions.clone();
    let on_prompt = sessions.clone();
    let on_cancel = sessions;
    Agent
        .v1()
        .name("warren-shell-agent")
        .on_receive_request(
            async move |request: InitializeRequest, responder, _cx| {
                let capabilities = AgentCapabilities::new().session_capabilities(
                    SessionCapabilities::new()
                        .resume(SessionResumeCapabilities::new())
                        .close(SessionCloseCapabilities::new()),
                );
                responder.respond(
                    InitializeResponse::new(request.protocol_version)
                        .agent_capabilities(capabilities)
                        .agent_info(Implementation::new(
                            "warren-shell-agent",
                            env!("CARGO_PKG_VERSION"),
                        )),
                )
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: NewSessionRequest, responder, _cx| {
                let n = on_new
                    .n_created
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let session_id = format!("shell-{}-{n}", std::process::id());
                on_new.insert(&session_id, request.cwd);
                responder.respond(NewSessionResponse::new(session_id))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: ResumeSessionRequest, responder, _cx| {
                on_resume.insert(&request.session_id.0, request.cwd);
                responder.respond(ResumeSessionResponse::new())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: CloseSessionRequest, responder, _cx| {
                on_close.remove(&request.session_id);
                responder.respond(CloseSessionResponse::new())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |notification: CancelNotification, _cx| {
                if let Some(state) = on_cancel.get(&notification.session_id) {
                    state.cancel.send_modify(|generation| *generation += 1);
                }
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: PromptRequest, responder, cx: ConnectionTo<Client>| {
                let Some(state) = on_prompt.get(&request.session_id) else {
                    return responder.respond_with_error(agent_client_protocol::Error::new(
                        agent_client_protocol::ErrorCode::RESOURCE_NOT_FOUND,
                        format!("unknown session {}", request.session_id.0),
                    ));
                };
                // Watch for cancel from here, inside the dispatch loop: a `session/cancel` right
                // behind this prompt is then seen even if the turn's task has not started yet.
                let mut cancel = state.cancel.subscribe();
                cancel.mark_unchanged();
                // The turn waits for the client (permission, terminal): run it outside the
                // dispatch loop so cancel notifications and responses keep flowing.
                tokio::spawn(async move {
                    let result = run_turn(&cx, request, state, cancel).await;
                    let _ = responder.respond_with_result(result.map(PromptResponse::new));
                });
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_to(transport)
        .await
}

/// The person's text: every text block except Warren's notices.
fn prompt_text(prompt: &[ContentBlock]) -> String {
    prompt
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text(text) if notice_of(text).is_none() => Some(text.text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Warren's notices in the prompt (a block with `_meta["warren/notice"]`), shown, never run.
fn prompt_notices(prompt: &[ContentBlock]) -> Vec<&str> {
    prompt
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text(text) if notice_of(text).is_some() => Some(text.text.as_str()),
            _ => None,
        })
        .collect()
}

fn notice_of(text: &TextContent) -> Option<&str> {
    text.meta.as_ref()?.get(crate::NOTICE_META_KEY)?.as_str()
}

/// Whether `command` needs the user's permission first: `rm`, `sudo`, `git push`.
pub fn needs_permission(command: &str) -> bool {
    let mut words = command.split_whitespace();
    match words.next() {
        Some("rm") | Some("sudo") => true,
        Some("git") => words.next() == Some("push"),
        _ => false,
    }
}

fn say(cx: &ConnectionTo<Client>, session_id: &SessionId, text: impl Into<String>) {
    let chunk = ContentChunk::new(ContentBlock::Text(TextContent::new(text.into())));
    let _ = cx.send_notification(SessionNotification::new(
        session_id.clone(),
        SessionUpdate::AgentMessageChunk(chunk),
    ));
}

fn update_tool(cx: &ConnectionTo<Client>, session_id: &SessionId, update: ToolCallUpdate) {
    let _ = cx.send_notification(SessionNotification::new(
        session_id.clone(),
        SessionUpdate::ToolCallUpdate(update),
    ));
}

async fn run_turn(
    cx: &ConnectionTo<Client>,
    request: PromptRequest,
    state: SessionState,
    mut cancel: watch::Receiver<u64>,
) -> agent_client_protocol::Result<StopReason> {
    let session_id = request.session_id;
    for notice in prompt_notices(&request.prompt) {
        say(cx, &session_id, format!("{notice}\n"));
    }
    let command = prompt_text(&request.prompt).trim().to_owned();
    if command.is_empty() {
        say(
            cx,
            &session_id,
            "Send a shell command to run it in the workspace.\n",
        );
        return Ok(StopReason::EndTurn);
    }
    let tool_call_id = format!("cmd-{}", request_counter());
    let tool_call = ToolCall::new(tool_call_id.clone(), command.clone())
        .kind(ToolKind::Execute)
        .status(ToolCallStatus::Pending)
        .raw_input(serde_json::json!({ "command": command }));
    let _ = cx.send_notification(SessionNotification::new(
        session_id.clone(),
        SessionUpdate::ToolCall(tool_call),
    ));

    if needs_permission(&command) {
        let options = vec![
            PermissionOption::new("allow", "Run it", PermissionOptionKind::AllowOnce),
            PermissionOption::new("reject", "Don't run it", PermissionOptionKind::RejectOnce),
        ];
        let ask = RequestPermissionRequest::new(
            session_id.clone(),
            ToolCallUpdate::new(
                tool_call_id.clone(),
                ToolCallUpdateFields::new().title(command.clone()),
            ),
            options,
        );
        let answer = tokio::select! {
            answer = cx.send_request(ask).block_task() => answer?.outcome,
            _ = cancel.changed() => RequestPermissionOutcome::Cancelled,
        };
        let allowed = matches!(&answer, RequestPermissionOutcome::Selected(selected) if &*selected.option_id.0 == "allow");
        if !allowed {
            let fields = ToolCallUpdateFields::new().status(ToolCallStatus::Failed);
            update_tool(cx, &session_id, ToolCallUpdate::new(tool_call_id, fields));
            if matches!(answer, RequestPermissionOutcome::Cancelled) {
                return Ok(StopReason::Cancelled);
            }
            say(
                cx,
                &session_id,
                format!("Not run: permission to run `{command}` was refused.\n"),
            );
            return Ok(StopReason::EndTurn);
        }
    }

    let create = CreateTerminalRequest::new(session_id.clone(), "bash")
        .args(vec!["-c".to_owned(), command.clone()])
        .cwd(state.cwd.clone())
        .output_byte_limit(OUTPUT_BYTE_LIMIT);
    let terminal_id = match cx.send_request(create).block_task().await {
        Ok(created) => created.terminal_id,
        Err(error) => {
            let fields = ToolCallUpdateFields::new().status(ToolCallStatus::Failed);
            update_tool(cx, &session_id, ToolCallUpdate::new(tool_call_id, fields));
            say(
                cx,
                &session_id,
                format!("Cannot start the command: {}\n", error.message),
            );
            return Ok(StopReason::EndTurn);
        }
    };
    let fields = ToolCallUpdateFields::new()
        .status(ToolCallStatus::InProgress)
        .content(vec![ToolCallContent::Terminal(Terminal::new(
            terminal_id.clone(),
        ))]);
    update_tool(
        cx,
        &session_id,
        ToolCallUpdate::new(tool_call_id.clone(), fields),
    );

    let outcome = stream_terminal(cx, &session_id, &terminal_id, &mut cancel).await;
    let _ = cx
        .send_request(ReleaseTerminalRequest::new(session_id.clone(), terminal_id))
        .block_task()
        .await;
    match outcome? {
        TerminalEnd::Cancelled => {
            let fields = ToolCallUpdateFields::new().status(ToolCallStatus::Failed);
            update_tool(cx, &session_id, ToolCallUpdate::new(tool_call_id, fields));
            Ok(StopReason::Cancelled)
        }
        TerminalEnd::Exited { exit_code, signal } => {
            let ok = exit_code == Some(0);
            let status = if ok {
                ToolCallStatus::Completed
            } else {
                ToolCallStatus::Failed
            };
            let fields = ToolCallUpdateFields::new()
                .status(status)
                .raw_output(serde_json::json!({ "exit_code": exit_code, "signal": signal }));
            update_tool(cx, &session_id, ToolCallUpdate::new(tool_call_id, fields));
            if !ok {
                let how = match (exit_code, signal) {
                    (Some(code), _) => format!("exit code {code}"),
                    (None, Some(signal)) => format!("signal {signal}"),
                    (None, None) => "an unknown status".to_owned(),
                };
                say(cx, &session_id, format!("[command ended with {how}]\n"));
            }
            Ok(StopReason::EndTurn)
        }
    }
}

enum TerminalEnd {
    Exited {
        exit_code: Option<u32>,
        signal: Option<String>,
    },
    Cancelled,
}

/// Polls the terminal's output, streaming what is new, until the command exits or the turn is
/// cancelled (then the command is killed).
async fn stream_terminal(
    cx: &ConnectionTo<Client>,
    session_id: &SessionId,
    terminal_id: &TerminalId,
    cancel: &mut watch::Receiver<u64>,
) -> agent_client_protocol::Result<TerminalEnd> {
    // `terminal/wait_for_exit` runs alongside the polling, so a short command's turn ends as
    // soon as it exits instead of at the next poll.
    let mut wait_for_exit = Box::pin(
        cx.send_request(WaitForTerminalExitRequest::new(
            session_id.clone(),
            terminal_id.clone(),
        ))
        .block_task(),
    );
    let mut exit: Option<TerminalExitStatus> = None;
    let mut shown = String::new();
    loop {
        let output = cx
            .send_request(TerminalOutputRequest::new(
                session_id.clone(),
                terminal_id.clone(),
            ))
            .block_task()
            .await?;
        let new_text = match output.output.strip_prefix(shown.as_str()) {
            Some(rest) => rest.to_owned(),
            // The client dropped old output (byte limit): show the rest as it now stands.
            None => output.output.clone(),
        };
        if !new_text.is_empty() {
            say(cx, session_id, new_text);
        }
        shown = output.output;
        // The output read after the exit is complete: the turn can end. The exit comes from
        // whichever answered first: the waiting `terminal/wait_for_exit` or this read.
        if let Some(exit) = exit.take().or(output.exit_status) {
            return Ok(TerminalEnd::Exited {
                exit_code: exit.exit_code,
                signal: exit.signal,
            });
        }
        tokio::select! {
            result = &mut wait_for_exit => exit = Some(result?.exit_status),
            _ = cancel.changed() => {
                let _ = cx
                    .send_request(KillTerminalRequest::new(session_id.clone(), terminal_id.clone()))
                    .block_task()
                    .await;
                return Ok(TerminalEnd::Cancelled);
            }
            () = tokio::time::sleep(POLL_INTERVAL) => {}
        }
    }
}

fn request_counter() -> u64 {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::needs_permission;

    #[test]
    fn permission_is_asked_for_rm_sudo_and_git_push_only() {
        let cases = [
            ("rm -rf build", true),
            ("  rm x", true),
            ("sudo ls", true),
            ("git push origin main", true),
            ("git status", false),
            ("echo rm", false),
            ("rmdir x", false),
            ("ls", false),
            ("", false),
        ];
        for (command, expected) in cases {
            assert_eq!(needs_permission(command), expected, "{command:?}");
        }
    }
}
