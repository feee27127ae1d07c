//! The agent inside the hands (agents.md "The brain runs inside the session's hands"): the
//! agent process is a pipe-mode PTY session of the hands' execd (`POST /pty` with the
//! program as its command and the preset's variables as its `env`), and its ACP stdio travels
//! over that session's WebSocket: stdin as `0x00` frames, stdout from `0x01`, stderr from
//! `0x02`, and the `exit` frame (or the socket closing) is the process ending. The agent is
//! stopped by deleting the PTY session, which kills every process it started.
//!
//! Only live frames carry stdout: the process starts when the socket attaches and answers
//! nothing before `initialize`, so the replay frame (which merges stdout and stderr) can only
//! hold early stderr, and is read as stderr.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;
use warren_brain::{AgentCommand, AgentIo, BrainError, RemoteStop, Worker};
use warren_protocol::pty::CreatePtyRequest;

use super::HandsEndpoint;
use crate::shell_quote;

/// How long stopping an agent in the hands may take (frozen hands do not answer).
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes buffered between the socket and the ACP connection, each way.
const PIPE_BUFFER: usize = 256 * 1024;
/// The largest stdin frame sent (execd's live frames are at most 32 KiB too).
const STDIN_FRAME_MAX: usize = 32 * 1024;

/// Starts `command` inside the hands at `endpoint` (cwd: the workspace) and connects ACP to it.
/// Returns the worker and the id of the agent's PTY session.
pub async fn spawn_in_hands(
    endpoint: &HandsEndpoint,
    command: &AgentCommand,
) -> Result<(Worker, String), BrainError> {
    let failed = |what: &str, error: &dyn std::fmt::Display| BrainError::Spawn {
        program: command.program.clone(),
        source: std::io::Error::other(format!("{what}: {error}")),
    };
    let client = endpoint
        .client()
        .map_err(|e| failed("cannot reach the hands", &e))?;
    let request = CreatePtyRequest {
        cwd: None,
        command: Some(shell_line(command)),
        env: Some(command.env.iter().cloned().collect()),
    };
    let created = client
        .create_pty(&request)
        .await
        .map_err(|e| failed("the hands refused the agent", &e))?;
    let id = created.session_id;
    let pty_id = id.clone();
    let socket = match client.connect_pty(&id, "pty=0").await {
        Ok(socket) => socket,
        Err(e) => {
            let _ = client.delete_pty(&id).await;
            return Err(failed("cannot attach to the agent in the hands", &e));
        }
    };
    let (mut to_agent, mut from_agent) = socket.split();
    let (stdout_tx, stdout) = tokio::io::duplex(PIPE_BUFFER);
    let (stderr_tx, stderr) = tokio::io::duplex(PIPE_BUFFER);
    let (stdin, mut stdin_rx) = tokio::io::duplex(PIPE_BUFFER);
    let (exit_tx, exit_rx) = tokio::sync::oneshot::channel::<String>();

    tokio::spawn(async move {
        let (mut stdout_tx, mut stderr_tx) = (stdout_tx, stderr_tx);
        let mut status = "the connection to the agent in the hands closed".to_owned();
        while let Some(message) = from_agent.next().await {
            let Ok(message) = message else { break };
            match message {
                Message::Binary(frame) => {
                    let Some((&channel, payload)) = frame.split_first() else {
                        continue;
                    };
                    let written = match channel {
                        0x01 => stdout_tx.write_all(payload).await,
                        0x02 => stderr_tx.write_all(payload).await,
                        // A replay: 8 bytes of offset, then output from before the attach.
                        0x03 if payload.len() >= 8 => stderr_tx.write_all(&payload[8..]).await,
                        _ => Ok(()),
                    };
                    if written.is_err() {
                        break;
                    }
                }
                Message::Text(text) => {
                    let Ok(frame) = serde_json::from_str::<serde_json::Value>(&text) else {
                        continue;
                    };
                    match frame["type"].as_str() {
                        Some("exit") => {
                            status = format!("exit code {}", frame["exit_code"]);
                        }
                        Some("error") => {
                            status = format!(
                                "{}: {}",
                                frame["code"].as_str().unwrap_or("ERROR"),
                                frame["error"].as_str().unwrap_or("")
                            );
                        }
                        _ => {}
                    }
                }
                Message::Close(_) => break,
                _ => {}
            }
        }
        // End of output first, so ACP reads everything the agent said before it ended.
        drop(stdout_tx);
        drop(stderr_tx);
        let _ = exit_tx.send(status);
    });
    tokio::spawn(async move {
        let mut buffer = vec![0u8; STDIN_FRAME_MAX];
        loop {
            let n = match stdin_rx.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mut frame = Vec::with_capacity(n + 1);
            frame.push(0x00);
            frame.extend_from_slice(&buffer[..n]);
            if to_agent.send(Message::Binary(frame.into())).await.is_err() {
                break;
            }
        }
        let _ = to_agent.close().await;
    });

    let io = AgentIo {
        stdin: Box::pin(stdin),
        stdout: Box::pin(stdout),
        stderr: Box::pin(stderr),
        exited: Box::pin(async move {
            exit_rx
                .await
                .unwrap_or_else(|_| "the agent in the hands ended".to_owned())
        }),
        pid: 0,
    };
    let stop = RemoteStop::new(move || {
        Box::pin(async move {
            match tokio::time::timeout(STOP_TIMEOUT, client.delete_pty(&id)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(error = %e, "the agent's pty session was gone"),
                Err(_) => tracing::warn!("the hands did not stop the agent in time"),
            }
        })
    });
    Ok((Worker::connect(io, stop).await?, pty_id))
}

/// Stops an earlier agent of the session that may still run in its hands (left by a gateway
/// that died, or frozen when its brain was stopped): deleting its PTY session kills it and
/// everything it started; one that is gone already is fine.
pub async fn stop_earlier_agent(endpoint: &HandsEndpoint, pty_id: &str) {
    let Ok(client) = endpoint.client() else {
        return;
    };
    match tokio::time::timeout(STOP_TIMEOUT, client.delete_pty(pty_id)).await {
        Ok(Ok(())) => tracing::info!(pty_id, "stopped an earlier agent left in the hands"),
        Ok(Err(_)) => {}
        Err(_) => tracing::warn!(pty_id, "the hands did not stop an earlier agent in time"),
    }
}

/// `exec program args…`, each word quoted for the POSIX shell execd runs it with.
fn shell_line(command: &AgentCommand) -> String {
    let words = std::iter::once(&command.program).chain(&command.args);
    let quoted: Vec<String> = words.map(|word| shell_quote(word)).collect();
    format!("exec {}", quoted.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_command_line_is_quoted_for_the_shell() {
        let command = AgentCommand {
            program: "/opt/warren/agent/bin/my agent".into(),
            args: vec!["--acp".into(), "it's".into(), "$HOME".into()],
            env: Vec::new(),
        };
        assert_eq!(
            shell_line(&command),
            r"exec '/opt/warren/agent/bin/my agent' '--acp' 'it'\''s' '$HOME'"
        );
    }
}
