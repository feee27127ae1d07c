//! A scripted ACP agent used only by Warren's tests (not shipped in the `warren` binary). Each
//! prompt is one instruction:
//! - `echo TEXT`: streams TEXT back as three `agent_message_chunk`s.
//! - `perm`: asks `session/request_permission` (options `allow`, `reject`) and reports the answer
//!   as `permission: <option id>` or ends the turn `cancelled`.
//! - `wait`: says `waiting`, then waits for `session/cancel` and ends the turn `cancelled`.
//! - `write PATH TEXT` / `read PATH`: `fs/write_text_file` / `fs/read_text_file`.
//! - `term COMMAND`: runs `bash -c COMMAND` through the terminal methods and reports
//!   `exit N: OUTPUT`.
//! - `crash`: says `crashing` and exits with status 3 in the middle of the turn.
//! - `mcp CMD`: starts the first stdio MCP server given in `session/new`, calls its
//!   `exec_command` tool with `cmd` = CMD and says `mcp: <text result>`.
//! - `mcp-poll ID`: the same server's `write_stdin` tool with `session_id` = ID and no chars (a
//!   poll of a command an earlier `mcp` left running), said as `mcp: <text result>`.
//! - `bg`: starts `sleep 300` itself, in its own process group, and says `bg=<pid>` (a child
//!   that must not outlive the worker).
//!
//! Flags: `--resume` advertises `session/resume`, `--load` advertises `session/load` (and replays
//! one history chunk while loading), `--close` advertises `session/close`. `--gate-session PATH`
//! holds back the answers to `session/new`, `session/resume` and `session/load` until PATH exists
//! (a brain that is still starting, for as long as a test needs). `shell` as the first argument
//! runs the built-in shell agent instead (so brain tests need no `warren` binary).

// A stand-in for third-party agents, which start their helpers (MCP servers, commands) themselves.
#![allow(clippy::disallowed_methods)]

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, CancelNotification, CloseSessionRequest, CloseSessionResponse, ContentBlock,
    ContentChunk, CreateTerminalRequest, InitializeRequest, InitializeResponse, LoadSessionRequest,
    LoadSessionResponse, McpServer, McpServerStdio, NewSessionRequest, NewSessionResponse,
    PermissionOption, PermissionOptionKind, PromptRequest, PromptResponse, ReadTextFileRequest,
    ReleaseTerminalRequest, RequestPermissionOutcome, RequestPermissionRequest,
    ResumeSessionRequest, ResumeSessionResponse, SessionCapabilities, SessionCloseCapabilities,
    SessionId, SessionNotification, SessionResumeCapabilities, SessionUpdate, StopReason,
    TerminalOutputRequest, TextContent, ToolCallUpdate, ToolCallUpdateFields,
    WaitForTerminalExitRequest, WriteTextFileRequest,
};
use agent_client_protocol::{Agent, ByteStreams, Client};
use tokio::sync::watch;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("shell") {
        return warren_brain::shell_agent::run().await;
    }
    let session_gate = args
        .iter()
        .position(|a| a == "--gate-session")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from);
    let flags = Flags {
        resume: args.iter().any(|a| a == "--resume"),
        load: args.iter().any(|a| a == "--load"),
        close: args.iter().any(|a| a == "--close"),
        session_gate: session_gate.map(Arc::new),
    };
    let transport = ByteStreams::new(
        tokio::io::stdout().compat_write(),
        tokio::io::stdin().compat(),
    );
    serve(flags, transport)
        .await
        .map_err(|e| anyhow::anyhow!("test agent: {e}"))
}

#[derive(Clone)]
struct Flags {
    resume: bool,
    load: bool,
    close: bool,
    /// `--gate-session PATH`.
    session_gate: Option<Arc<PathBuf>>,
}

/// Resolves once the `--gate-session` file exists (at once without the flag). Polls: the agent
/// has no other way to hear about the file, and it only ever waits in tests.
async fn session_gate_open(gate: Option<Arc<PathBuf>>) {
    let Some(gate) = gate else { return };
    while !gate.exists() {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

fn say(cx: &ConnectionTo<Client>, session_id: &SessionId, text: impl Into<String>) {
    let chunk = ContentChunk::new(ContentBlock::Text(TextContent::new(text.into())));
    let _ = cx.send_notification(SessionNotification::new(
        session_id.clone(),
        SessionUpdate::AgentMessageChunk(chunk),
    ));
}

async fn serve(
    flags: Flags,
    transport: impl agent_client_protocol::ConnectTo<Agent> + 'static,
) -> agent_client_protocol::Result<()> {
    let cancel = Arc::new(watch::channel(0u64).0);
    let on_cancel = cancel.clone();
    let n_sessions = Arc::new(AtomicU64::new(0));
    let mcp_servers: Arc<std::sync::Mutex<Vec<McpServer>>> = Arc::default();
    let on_new_mcp = mcp_servers.clone();
    let (gate_new, gate_resume, gate_load) = (
        flags.session_gate.clone(),
        flags.session_gate.clone(),
        flags.session_gate.clone(),
    );
    let (resume, load, close) = (flags.resume, flags.load, flags.close);
    Agent
        .v1()
        .name("warren-test-agent")
        .on_receive_request(
            async move |request: InitializeRequest, responder, _cx| {
                let mut session = SessionCapabilities::new();
                if resume {
                    session = session.resume(SessionResumeCapabilities::new());
                }
                if close {
                    session = session.close(SessionCloseCapabilities::new());
                }
                let capabilities = AgentCapabilities::new()
                    .load_session(load)
                    .session_capabilities(session);
                responder.respond(
                    InitializeResponse::new(request.protocol_version)
                        .agent_capabilities(capabilities),
                )
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: NewSessionRequest, responder, _cx| {
                *on_new_mcp.lock().unwrap_or_else(|p| p.into_inner()) = request.mcp_servers;
                let n = n_sessions.fetch_add(1, Ordering::SeqCst);
                let gate = gate_new.clone();
                // Waits off the dispatch loop, so notifications keep flowing meanwhile.
                tokio::spawn(async move {
                    session_gate_open(gate).await;
                    let _ = responder.respond(NewSessionResponse::new(format!(
                        "test-{}-{n}",
                        std::process::id()
                    )));
                });
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |_request: ResumeSessionRequest, responder, _cx| {
                let gate = gate_resume.clone();
                tokio::spawn(async move {
                    session_gate_open(gate).await;
                    let _ = responder.respond(ResumeSessionResponse::new());
                });
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: LoadSessionRequest, responder, cx: ConnectionTo<Client>| {
                let gate = gate_load.clone();
                tokio::spawn(async move {
                    session_gate_open(gate).await;
                    say(&cx, &request.session_id, "replayed history");
                    let _ = responder.respond(LoadSessionResponse::new());
                });
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |_request: CloseSessionRequest, responder, _cx| {
                responder.respond(CloseSessionResponse::new())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |_notification: CancelNotification, _cx| {
                on_cancel.send_modify(|generation| *generation += 1);
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: PromptRequest, responder, cx: ConnectionTo<Client>| {
                let mut cancelled = cancel.subscribe();
                cancelled.mark_unchanged();
                let mcp = mcp_servers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                tokio::spawn(async move {
                    let result = run_turn(&cx, request, &mut cancelled, mcp).await;
                    let _ = responder.respond_with_result(result.map(PromptResponse::new));
                });
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_to(transport)
        .await
}

async fn run_turn(
    cx: &ConnectionTo<Client>,
    request: PromptRequest,
    cancelled: &mut watch::Receiver<u64>,
    mcp_servers: Vec<McpServer>,
) -> agent_client_protocol::Result<StopReason> {
    let session_id = request.session_id;
    let text: String = request
        .prompt
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text(text) => Some(text.text.clone()),
            _ => None,
        })
        .collect();
    let (instruction, rest) = text.split_once(' ').unwrap_or((text.as_str(), ""));
    match instruction {
        "echo" => {
            let third = rest.len() / 3;
            let cut = |i: usize| {
                (0..=i)
                    .rev()
                    .find(|&j| rest.is_char_boundary(j))
                    .unwrap_or(0)
            };
            let (a, b) = (cut(third), cut(2 * third));
            for piece in [&rest[..a], &rest[a..b], &rest[b..]] {
                say(cx, &session_id, piece);
            }
            Ok(StopReason::EndTurn)
        }
        "perm" => {
            let options = vec![
                PermissionOption::new("allow", "Allow", PermissionOptionKind::AllowOnce),
                PermissionOption::new("reject", "Reject", PermissionOptionKind::RejectOnce),
            ];
            let tool_call = ToolCallUpdate::new(
                "tool-1",
                ToolCallUpdateFields::new().title("dangerous thing"),
            );
            let ask = RequestPermissionRequest::new(session_id.clone(), tool_call, options);
            let answer = cx.send_request(ask).block_task().await?;
            match answer.outcome {
                RequestPermissionOutcome::Selected(selected) => {
                    say(
                        cx,
                        &session_id,
                        format!("permission: {}", selected.option_id.0),
                    );
                    Ok(StopReason::EndTurn)
                }
                _ => Ok(StopReason::Cancelled),
            }
        }
        "wait" => {
            say(cx, &session_id, "waiting");
            let _ = cancelled.changed().await;
            Ok(StopReason::Cancelled)
        }
        "write" => {
            let (path, content) = rest.split_once(' ').unwrap_or((rest, ""));
            cx.send_request(WriteTextFileRequest::new(session_id.clone(), path, content))
                .block_task()
                .await?;
            say(cx, &session_id, format!("wrote {path}"));
            Ok(StopReason::EndTurn)
        }
        "read" => {
            let read = cx
                .send_request(ReadTextFileRequest::new(session_id.clone(), rest))
                .block_task()
                .await;
            match read {
                Ok(read) => say(cx, &session_id, format!("content: {}", read.content)),
                Err(error) => say(cx, &session_id, format!("read failed: {}", error.message)),
            }
            Ok(StopReason::EndTurn)
        }
        "term" => {
            let create = CreateTerminalRequest::new(session_id.clone(), "bash")
                .args(vec!["-c".into(), rest.into()]);
            let terminal_id = cx.send_request(create).block_task().await?.terminal_id;
            let exit = cx
                .send_request(WaitForTerminalExitRequest::new(
                    session_id.clone(),
                    terminal_id.clone(),
                ))
                .block_task()
                .await?
                .exit_status;
            let output = cx
                .send_request(TerminalOutputRequest::new(
                    session_id.clone(),
                    terminal_id.clone(),
                ))
                .block_task()
                .await?;
            cx.send_request(ReleaseTerminalRequest::new(session_id.clone(), terminal_id))
                .block_task()
                .await?;
            let code = exit
                .exit_code
                .map_or_else(|| "none".to_owned(), |c| c.to_string());
            say(cx, &session_id, format!("exit {code}: {}", output.output));
            Ok(StopReason::EndTurn)
        }
        "crash" => {
            say(cx, &session_id, "crashing");
            // A round trip to the client proves the chunk above was written (same pipe, in
            // order) before the process dies in the middle of the turn.
            let probe = ReadTextFileRequest::new(session_id.clone(), "/nonexistent/probe");
            let _ = cx.send_request(probe).block_task().await;
            std::process::exit(3);
        }
        "mcp" | "mcp-poll" => {
            let Some(McpServer::Stdio(server)) = mcp_servers.into_iter().next() else {
                say(cx, &session_id, "mcp: no stdio MCP server was given");
                return Ok(StopReason::EndTurn);
            };
            let call = match instruction {
                "mcp" => Some(("exec_command", serde_json::json!({"cmd": rest}))),
                _ => rest.trim().parse::<u64>().ok().map(|id| {
                    let poll = serde_json::json!({"session_id": id, "chars": ""});
                    ("write_stdin", poll)
                }),
            };
            let text = match call {
                Some((tool, arguments)) => call_tool(&server, tool, arguments)
                    .await
                    .unwrap_or_else(|error| format!("failed: {error}")),
                None => format!("{rest:?} is not a session id"),
            };
            say(cx, &session_id, format!("mcp: {text}"));
            Ok(StopReason::EndTurn)
        }
        "bg" => {
            let child = std::process::Command::new("sleep")
                .arg("300")
                .process_group(0)
                .spawn()
                .map_err(agent_client_protocol::Error::into_internal_error)?;
            say(cx, &session_id, format!("bg={}", child.id()));
            Ok(StopReason::EndTurn)
        }
        other => {
            say(cx, &session_id, format!("unknown instruction {other:?}"));
            Ok(StopReason::EndTurn)
        }
    }
}

/// A minimal MCP client over stdio: `initialize`, `notifications/initialized`, then one
/// `tools/call` of `tool` with `arguments`; returns the first text content of the result.
async fn call_tool(
    server: &McpServerStdio,
    tool: &str,
    arguments: serde_json::Value,
) -> anyhow::Result<String> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let mut child = tokio::process::Command::new(&server.command)
        .args(&server.args)
        .envs(
            server
                .env
                .iter()
                .map(|var| (var.name.clone(), var.value.clone())),
        )
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdin"))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let messages = [
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "warren-test-agent", "version": "0"}}}),
        serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": tool, "arguments": arguments}}),
    ];
    for message in messages {
        stdin.write_all(format!("{message}\n").as_bytes()).await?;
    }
    stdin.flush().await?;
    while let Some(line) = lines.next_line().await? {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if message["id"] == 2 {
            if let Some(error) = message.get("error") {
                anyhow::bail!("tools/call failed: {error}");
            }
            let text = message["result"]["content"][0]["text"]
                .as_str()
                .unwrap_or_default();
            return Ok(text.to_owned());
        }
    }
    anyhow::bail!("the MCP server closed its output before answering")
}
