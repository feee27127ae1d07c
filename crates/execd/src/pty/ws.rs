//! The WebSocket side of a PTY session: the handshake checks, then one task per connection that
//! sends output (holder: live `0x01`/`0x02` frames pushed by the session; viewer: `0x03` frames
//! it pulls from the ring) and handles the client's frames, pings and timeouts.
//!
//! A connection task owns its socket alone; it never holds the session lock across an await.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use rustix::process::Signal;
use warren_protocol::pty::{
    CHANNEL_STDIN, CLIENT_FRAME_TYPES, CLOSE_EXITED_REASON, CLOSE_TAKEN_OVER,
    CLOSE_TAKEN_OVER_REASON, ClientFrame, ClientFrameKind, FrameErrorCode, PtyMode, PtyRole,
    ServerFrame, encode_replay,
};

use warren_protocol::error::ErrorBody;

use crate::error::Path as UrlPath;

use super::session::{AttachError, HolderAttach, HolderEvent, Kick, Session, Shell, ViewerRead};
use super::{PtyError, PtySessions, PtyTimings, QueryMap, WsParams, upgrade_or_error};

/// Incoming frames larger than this are refused with close code 1009.
pub const MAX_INCOMING_BYTES: usize = 1024 * 1024;
/// Rejected frames after which a viewer is disconnected.
const MAX_VIEWER_VIOLATIONS: u32 = 5;
/// Read buffer of a connection (larger frames still arrive; they take more reads).
const READ_BUFFER_BYTES: usize = 8 * 1024;
/// While output streams, a viewer waits this long after being woken so it sends a few large
/// frames instead of one per terminal read: viewers then cost the holder little CPU.
const VIEWER_BATCH_DELAY: Duration = Duration::from_millis(2);
/// Bytes sent in one wake-up above which a viewer counts as streaming.
const VIEWER_STREAMING_BYTES: usize = 16 * 1024;

const CLOSE_NORMAL: u16 = 1000;
/// The client broke the WebSocket protocol.
const CLOSE_PROTOCOL_ERROR: u16 = 1002;
/// A text frame (or close reason) that is not UTF-8.
const CLOSE_INVALID_PAYLOAD: u16 = 1007;
const CLOSE_POLICY: u16 = 1008;
const CLOSE_TOO_BIG: u16 = 1009;
const CLOSE_INTERNAL: u16 = 1011;
/// A holder that fell more than its queue behind; it may reconnect with `since`.
const CLOSE_TRY_AGAIN: u16 = 1013;

/// `GET /pty/{id}/ws`.
#[utoipa::path(
    get, path = "/pty/{id}/ws", tag = "pty", operation_id = "attach_pty",
    description = "Attaches to a session over WebSocket (pty-sessions.md's frames): the holder, \
        a viewer (`mode=viewer`) or a takeover (`takeover=1`); the first holder starts the shell.",
    params(
        ("id" = String, Path, description = "From `POST /pty`"),
        super::WsQuery,
    ),
    responses(
        (status = 101, description = "Switching protocols: the WebSocket"),
        (status = 404, description = "`CONTEXT_NOT_FOUND`", body = ErrorBody),
        (status = 409, description = "`ALREADY_CONNECTED` (a holder is attached; ask `takeover=1`) or `VIEWER_REQUIRES_RUNNING_SESSION`", body = ErrorBody),
        (status = 426, description = "`UPGRADE_REQUIRED`: a plain request, not a WebSocket handshake", body = ErrorBody),
    )
)]
pub async fn attach(
    State(sessions): State<PtySessions>,
    UrlPath(id): UrlPath<String>,
    axum::extract::Query(query): QueryMap,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, PtyError> {
    let session = sessions.get(&id)?;
    serve(session, sessions.timings(), &query, upgrade)
}

/// The handshake checks and then the connection of `session`, holder or viewer as `query`
/// says: every route that speaks pty-sessions.md's WebSocket protocol ends here.
pub fn serve(
    session: Arc<Session>,
    timings: PtyTimings,
    query: &std::collections::HashMap<String, String>,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, PtyError> {
    let params = WsParams::parse(query);
    let upgrade = upgrade_or_error(&session, params, upgrade)?;
    Ok(upgrade
        .max_message_size(MAX_INCOMING_BYTES)
        .max_frame_size(MAX_INCOMING_BYTES)
        // tungstenite zero-fills its whole read buffer before each read, so its size is
        // resident memory per connection; client frames are mostly keystrokes.
        .read_buffer_size(READ_BUFFER_BYTES)
        .on_upgrade(move |socket| async move {
            let conn = Conn {
                socket,
                last_seen: Instant::now(),
                timings,
            };
            if params.viewer {
                serve_viewer(conn, session, params).await;
            } else {
                serve_holder(conn, session, params).await;
            }
        }))
}

/// What to do after handling one incoming message.
enum Next {
    Continue,
    Close(u16, &'static str),
    /// The client went away or the socket failed: just stop.
    Stop,
}

struct Conn {
    socket: WebSocket,
    last_seen: Instant,
    timings: PtyTimings,
}

impl Conn {
    /// Sends one message within the write timeout; false means the connection is unusable.
    async fn send(&mut self, message: Message) -> bool {
        matches!(
            tokio::time::timeout(self.timings.write_timeout, self.socket.send(message)).await,
            Ok(Ok(()))
        )
    }

    async fn send_frame(&mut self, frame: &ServerFrame) -> bool {
        self.send(Message::Text(frame.to_json().into())).await
    }

    /// The opening of an attach: the replay frame, if there is one, then `connected`.
    async fn open(&mut self, replay_frame: Option<Vec<u8>>, connected: &ServerFrame) -> bool {
        if let Some(frame) = replay_frame
            && !self.send(Message::Binary(frame.into())).await
        {
            return false;
        }
        self.send_frame(connected).await
    }

    async fn close(mut self, code: u16, reason: &str) {
        let frame = CloseFrame {
            code,
            reason: reason.into(),
        };
        let _ = self.send(Message::Close(Some(frame))).await;
    }

    /// Writes what tungstenite queued on its own: its reply to the peer's close frame (the
    /// echo, or 1002 for a close code no endpoint may send), so the closing handshake completes
    /// instead of ending in silence.
    async fn finish(mut self) {
        use futures_util::SinkExt as _;
        let _ = tokio::time::timeout(self.timings.write_timeout, self.socket.flush()).await;
    }

    /// Keepalive on a ping tick: false when the peer has been silent too long or the ping
    /// cannot be written.
    async fn keepalive(&mut self) -> bool {
        if self.last_seen.elapsed() > self.timings.silence_timeout {
            return false;
        }
        self.send(Message::Ping(Default::default())).await
    }

    fn ping_timer(&self) -> tokio::time::Interval {
        let every = self.timings.ping_interval;
        let mut timer = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        timer
    }
}

/// A receive error, answered with the close code RFC 6455 gives it before the connection is
/// dropped, so the client learns why instead of seeing 1006: 1009 for an oversized frame, 1007
/// for text that is not UTF-8, 1002 for any other protocol violation (an unmasked or
/// reserved-opcode frame, a bad close frame...). A peer that went away, or an I/O failure, just
/// ends the connection. axum passes tungstenite's error through boxed, so it is downcast.
fn receive_failed(error: axum::Error) -> Next {
    use tungstenite::error::{Error as WsError, ProtocolError};
    let error = error.into_inner();
    let Some(error) = error.downcast_ref::<WsError>() else {
        return Next::Stop;
    };
    match error {
        WsError::Capacity(_) => Next::Close(CLOSE_TOO_BIG, "frame too large"),
        WsError::Utf8(_) => Next::Close(CLOSE_INVALID_PAYLOAD, "text frame is not valid UTF-8"),
        WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake) => Next::Stop,
        WsError::Protocol(violation) => {
            tracing::debug!(%violation, "websocket protocol violation");
            Next::Close(CLOSE_PROTOCOL_ERROR, "websocket protocol violation")
        }
        _ => Next::Stop,
    }
}

async fn serve_holder(mut conn: Conn, session: Arc<Session>, params: WsParams) {
    let mode = if params.pipe {
        PtyMode::Pipe
    } else {
        PtyMode::Pty
    };
    let attach = match session
        .attach_holder(params.since, params.takeover, mode)
        .await
    {
        Ok(attach) => attach,
        Err(error) => {
            let (code, close) = match &error {
                AttachError::AlreadyConnected(_) | AttachError::AgentHolds(_) => {
                    (FrameErrorCode::AlreadyConnected, CLOSE_POLICY)
                }
                AttachError::StartFailed(_) => (FrameErrorCode::StartFailed, CLOSE_INTERNAL),
                AttachError::Deleted(_) | AttachError::NotRunning(_) => {
                    (FrameErrorCode::StartFailed, CLOSE_NORMAL)
                }
            };
            tracing::info!(session = %session.id, %error, "holder attach refused");
            if conn
                .send_frame(&ServerFrame::error(code, error.to_string()))
                .await
            {
                conn.close(close, "attach failed").await;
            }
            return;
        }
    };
    let HolderAttach {
        shell,
        replay,
        mut events,
        queued_bytes,
        mut kick,
        finished,
    } = attach;
    let outcome = async {
        let connected = ServerFrame::Connected {
            session_id: session.id.clone(),
            mode: shell.mode,
            role: PtyRole::Holder,
        };
        let replay_frame = replay.map(|(offset, bytes)| encode_replay(offset, &bytes));
        if !conn.open(replay_frame, &connected).await {
            return Next::Stop;
        }
        let mut ping = conn.ping_timer();
        let mut kick_open = true;
        loop {
            tokio::select! {
                biased;
                kicked = kick.changed(), if kick_open => match kicked {
                    Ok(()) => if let Some(kicked) = *kick.borrow_and_update() {
                        return kick_close(kicked);
                    },
                    // The session released the slot (the shell exited): the exit event follows.
                    Err(_) => kick_open = false,
                },
                event = events.recv() => match event {
                    Some(HolderEvent::Output(frame)) => {
                        queued_bytes.fetch_sub(frame.len() - 1, Ordering::AcqRel);
                        // A send can wait on a slow client: a takeover must not wait for it.
                        tokio::select! {
                            biased;
                            kicked = kick.changed(), if kick_open => match kicked {
                                Ok(()) => if let Some(kicked) = *kick.borrow_and_update() {
                                    return kick_close(kicked);
                                },
                                Err(_) => kick_open = false,
                            },
                            sent = conn.send(Message::Binary(frame)) => if !sent { return Next::Stop },
                        }
                    }
                    Some(HolderEvent::Exit(exit_code)) => {
                        if !conn.send_frame(&ServerFrame::Exit { exit_code }).await {
                            return Next::Stop;
                        }
                        return Next::Close(CLOSE_NORMAL, CLOSE_EXITED_REASON);
                    }
                    None => return Next::Stop,
                },
                message = conn.socket.recv() => {
                    conn.last_seen = Instant::now();
                    match holder_message(&mut conn, &shell, message).await {
                        Next::Continue => {}
                        other => return other,
                    }
                }
                _ = ping.tick() => if !conn.keepalive().await { return Next::Stop },
            }
        }
    }
    .await;
    session.release_holder(&queued_bytes);
    // A takeover waits for this, not for the close below, which a client that stopped reading
    // could hold up for the whole write timeout.
    drop(finished);
    match outcome {
        Next::Close(code, reason) => conn.close(code, reason).await,
        _ => conn.finish().await,
    }
}

fn kick_close(kick: Kick) -> Next {
    match kick {
        Kick::TakenOver => Next::Close(CLOSE_TAKEN_OVER, CLOSE_TAKEN_OVER_REASON),
        Kick::TooSlow => Next::Close(CLOSE_TRY_AGAIN, "holder fell behind; reconnect with since"),
    }
}

async fn holder_message(
    conn: &mut Conn,
    shell: &Shell,
    message: Option<Result<Message, axum::Error>>,
) -> Next {
    let message = match message {
        None => return Next::Stop,
        Some(Err(error)) => return receive_failed(error),
        Some(Ok(message)) => message,
    };
    match message {
        Message::Binary(bytes) => {
            // Empty frames and unknown channels are ignored, as in OpenSandbox.
            if bytes.len() > 1 && bytes[0] == CHANNEL_STDIN {
                return write_stdin(conn, shell, &bytes[1..]).await;
            }
            Next::Continue
        }
        Message::Text(text) => match parse_client_frame(text.as_str()) {
            Parsed::Ignore => Next::Continue,
            Parsed::Invalid(error) => reply(conn, FrameErrorCode::InvalidFrame, error).await,
            Parsed::Frame(ClientFrame::Ping) => {
                if conn.send_frame(&ServerFrame::Pong).await {
                    Next::Continue
                } else {
                    Next::Stop
                }
            }
            Parsed::Frame(ClientFrame::Stdin { data }) => {
                if data.is_empty() {
                    return Next::Continue;
                }
                write_stdin(conn, shell, data.as_bytes()).await
            }
            Parsed::Frame(ClientFrame::Resize { cols, rows }) => {
                if cols <= 0 || rows <= 0 {
                    return Next::Continue;
                }
                let (Ok(cols), Ok(rows)) = (u16::try_from(cols), u16::try_from(rows)) else {
                    return reply(
                        conn,
                        FrameErrorCode::InvalidFrame,
                        format!("resize {cols}x{rows} is too large (at most 65535 each)"),
                    )
                    .await;
                };
                let size = warren_process::pty::PtySize { rows, cols };
                if let Err(error) = shell.resize(size) {
                    tracing::debug!(%error, "resize failed (the shell may have exited)");
                }
                Next::Continue
            }
            Parsed::Frame(ClientFrame::Signal { signal }) => match signal_by_name(&signal) {
                Some(sig) => {
                    if let Err(error) = shell.signal(sig) {
                        tracing::debug!(%error, signal, "signal not delivered (the shell may have exited)");
                    }
                    Next::Continue
                }
                None => {
                    let error = format!(
                        "unknown signal {signal:?}; expected SIGINT, SIGTERM, SIGKILL, SIGQUIT or SIGHUP"
                    );
                    reply(conn, FrameErrorCode::InvalidFrame, error).await
                }
            },
        },
        Message::Close(_) => Next::Stop,
        Message::Ping(_) | Message::Pong(_) => Next::Continue,
    }
}

async fn write_stdin(conn: &mut Conn, shell: &Shell, bytes: &[u8]) -> Next {
    let error =
        match tokio::time::timeout(conn.timings.write_timeout, shell.write_stdin(bytes)).await {
            Ok(Ok(())) => return Next::Continue,
            Ok(Err(error)) => format!("writing stdin failed: {error}"),
            Err(_) => "writing stdin timed out (the shell is not reading its input)".to_string(),
        };
    reply(conn, FrameErrorCode::StdinWriteFailed, error).await
}

async fn reply(conn: &mut Conn, code: FrameErrorCode, error: String) -> Next {
    if conn.send_frame(&ServerFrame::error(code, error)).await {
        Next::Continue
    } else {
        Next::Stop
    }
}

/// A client text frame as the holder's loop reads it (public for the fuzz targets).
#[doc(hidden)]
pub enum Parsed {
    /// Not JSON: ignored.
    Ignore,
    /// JSON, but an unknown `type` or bad fields.
    Invalid(String),
    Frame(ClientFrame),
}

#[doc(hidden)]
pub fn parse_client_frame(text: &str) -> Parsed {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(text) else {
        return Parsed::Ignore;
    };
    let kind = match serde_json::from_value::<ClientFrameKind>(value.clone()) {
        Ok(kind) => kind.kind,
        Err(_) => {
            return Parsed::Invalid(
                "a text frame must be a JSON object with a string \"type\"".into(),
            );
        }
    };
    if !CLIENT_FRAME_TYPES.contains(&kind.as_str()) {
        return Parsed::Invalid(format!(
            "unknown frame type {kind:?}; expected stdin, resize, signal or ping"
        ));
    }
    match serde_json::from_value::<ClientFrame>(value) {
        Ok(frame) => Parsed::Frame(frame),
        Err(error) => Parsed::Invalid(format!("invalid {kind} frame: {error}")),
    }
}

fn signal_by_name(name: &str) -> Option<Signal> {
    let name = name.strip_prefix("SIG").unwrap_or(name);
    Some(match name {
        "INT" => Signal::INT,
        "TERM" => Signal::TERM,
        "KILL" => Signal::KILL,
        "QUIT" => Signal::QUIT,
        "HUP" => Signal::HUP,
        _ => return None,
    })
}

async fn serve_viewer(mut conn: Conn, session: Arc<Session>, params: WsParams) {
    let attach = match session.attach_viewer(params.since) {
        Ok(attach) => attach,
        Err(error) => {
            let frame = ServerFrame::error(FrameErrorCode::InvalidFrame, error.to_string());
            if conn.send_frame(&frame).await {
                conn.close(CLOSE_POLICY, "viewer requires a running session")
                    .await;
            }
            return;
        }
    };
    let generation = attach.generation;
    let mut offset = attach.offset;
    let mut progress = attach.progress;
    let outcome = async {
        // The first frame is the replay of everything retained from `since`, read in one step:
        // pieces read one after another could straddle an eviction and so have a gap that the
        // one offset in the header would hide.
        let replay = match session.viewer_replay(&mut offset, generation) {
            ViewerRead::Frame(frame) => Some(frame),
            ViewerRead::Exit(_) | ViewerRead::Idle => None,
        };
        let connected = ServerFrame::Connected {
            session_id: session.id.clone(),
            mode: attach.mode,
            role: PtyRole::Viewer,
        };
        if !conn.open(replay, &connected).await {
            return Next::Stop;
        }
        let mut ping = conn.ping_timer();
        let mut violations = 0;
        // Check once before waiting: output or an exit may have come after the replay.
        let mut pending = true;
        let mut streaming = false;
        loop {
            if pending {
                pending = false;
                let mut n_sent = 0;
                loop {
                    match session.viewer_read(&mut offset, generation) {
                        ViewerRead::Frame(frame) => {
                            n_sent += frame.len();
                            if !conn.send(Message::Binary(frame.into())).await {
                                return Next::Stop;
                            }
                        }
                        ViewerRead::Exit(exit_code) => {
                            if !conn.send_frame(&ServerFrame::Exit { exit_code }).await {
                                return Next::Stop;
                            }
                            return Next::Close(CLOSE_NORMAL, CLOSE_EXITED_REASON);
                        }
                        ViewerRead::Idle => break,
                    }
                }
                streaming = n_sent >= VIEWER_STREAMING_BYTES;
            }
            tokio::select! {
                changed = progress.changed() => {
                    if changed.is_err() {
                        return Next::Stop;
                    }
                    if streaming {
                        tokio::time::sleep(VIEWER_BATCH_DELAY).await;
                    }
                    pending = true;
                }
                message = conn.socket.recv() => {
                    conn.last_seen = Instant::now();
                    match viewer_message(&mut conn, message, &mut violations).await {
                        Next::Continue => {}
                        other => return other,
                    }
                }
                _ = ping.tick() => if !conn.keepalive().await { return Next::Stop },
            }
        }
    }
    .await;
    match outcome {
        Next::Close(code, reason) => conn.close(code, reason).await,
        _ => conn.finish().await,
    }
}

/// A viewer may only ping; anything that would act on the shell is refused with `READ_ONLY`,
/// and the fifth refusal disconnects it with close code 1008.
async fn viewer_message(
    conn: &mut Conn,
    message: Option<Result<Message, axum::Error>>,
    violations: &mut u32,
) -> Next {
    let message = match message {
        None => return Next::Stop,
        Some(Err(error)) => return receive_failed(error),
        Some(Ok(message)) => message,
    };
    let refused = match message {
        Message::Binary(bytes) => bytes.first() == Some(&CHANNEL_STDIN),
        Message::Text(text) => match parse_client_frame(text.as_str()) {
            Parsed::Ignore => false,
            Parsed::Invalid(error) => {
                return reply(conn, FrameErrorCode::InvalidFrame, error).await;
            }
            Parsed::Frame(ClientFrame::Ping) => {
                return if conn.send_frame(&ServerFrame::Pong).await {
                    Next::Continue
                } else {
                    Next::Stop
                };
            }
            Parsed::Frame(_) => true,
        },
        Message::Close(_) => return Next::Stop,
        Message::Ping(_) | Message::Pong(_) => false,
    };
    if !refused {
        return Next::Continue;
    }
    *violations += 1;
    let frame = ServerFrame::error(FrameErrorCode::ReadOnly, "viewers are read-only");
    if !conn.send_frame(&frame).await {
        return Next::Stop;
    }
    if *violations >= MAX_VIEWER_VIOLATIONS {
        return Next::Close(CLOSE_POLICY, "viewer kept writing");
    }
    Next::Continue
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_frames_are_classified() {
        let cases = [
            ("not json", "ignore"),
            ("", "ignore"),
            ("[1,2]", "invalid"),
            (r#"{"data":"x"}"#, "invalid"),
            (r#"{"type":"dance"}"#, "invalid"),
            (r#"{"type":"resize","cols":"wide"}"#, "invalid"),
            (r#"{"type":"stdin"}"#, "invalid"),
            (r#"{"type":"ping"}"#, "frame"),
            (r#"{"type":"stdin","data":"ls\n"}"#, "frame"),
            (r#"{"type":"resize","cols":0,"rows":99999999}"#, "frame"),
        ];
        for (text, expected) in cases {
            let got = match parse_client_frame(text) {
                Parsed::Ignore => "ignore",
                Parsed::Invalid(_) => "invalid",
                Parsed::Frame(_) => "frame",
            };
            assert_eq!(got, expected, "{text}");
        }
    }

    #[test]
    fn signal_names_map_with_or_without_prefix() {
        assert_eq!(signal_by_name("SIGINT"), Some(Signal::INT));
        assert_eq!(signal_by_name("KILL"), Some(Signal::KILL));
        assert_eq!(signal_by_name("SIGSEGV"), None);
        assert_eq!(signal_by_name("sigint"), None);
    }
}
