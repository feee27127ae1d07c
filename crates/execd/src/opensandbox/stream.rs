//! The OpenSandbox event stream: each event is one compact JSON object on one line followed by
//! a blank line (`{...}\n\n`, no `data:` prefix), sent as `text/event-stream` while the command
//! runs. Also the line splitter that turns raw output bytes into one event text per line, and
//! the headers of every streamed answer ([`streaming_response`]).
//!
//! The stream ends when its sender is dropped, which is right after the final event: there is
//! no grace-period sleep.

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;
use warren_protocol::opensandbox::{EventError, EventType, ServerEvent};

/// Unix time in milliseconds.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// How many encoded events may wait for a slow client before the producer waits too.
const STREAM_BUFFER: usize = 256;

/// The producing half of a stream. Sends never fail loudly: a client that left just stops
/// receiving, the command keeps running (the spec says leaving does not kill it).
#[derive(Clone)]
pub struct EventSink {
    tx: mpsc::Sender<Bytes>,
}

impl EventSink {
    /// Encodes and sends one event; returns false once the client is gone.
    pub async fn send(&self, event: &ServerEvent) -> bool {
        if self.tx.is_closed() {
            return false;
        }
        self.tx.send(encode_event(event)).await.is_ok()
    }

    pub async fn send_kind(&self, kind: EventType) -> bool {
        self.send(&ServerEvent::new(kind, now_ms())).await
    }

    pub async fn send_text(&self, kind: EventType, text: impl Into<String>) -> bool {
        self.send(&ServerEvent::new(kind, now_ms()).with_text(text))
            .await
    }

    pub async fn send_complete(&self, execution_time_ms: u64) -> bool {
        let mut event = ServerEvent::new(EventType::ExecutionComplete, now_ms());
        event.execution_time = Some(execution_time_ms);
        self.send(&event).await
    }

    pub async fn send_error(&self, ename: &str, evalue: String, traceback: Vec<String>) -> bool {
        let mut event = ServerEvent::new(EventType::Error, now_ms());
        event.error = Some(EventError {
            ename: ename.to_owned(),
            evalue,
            traceback,
        });
        self.send(&event).await
    }

    /// The error event of a command that exited with `exit_code` (-1: signal or timeout).
    pub async fn send_exit_error(&self, exit_code: i32) -> bool {
        let traceback = if exit_code < 0 {
            "killed by a signal".to_owned()
        } else {
            format!("exit status {exit_code}")
        };
        self.send_error("CommandExecError", exit_code.to_string(), vec![traceback])
            .await
    }
}

/// `{json}\n\n`.
pub fn encode_event(event: &ServerEvent) -> Bytes {
    let mut line = serde_json::to_vec(event).expect("a ServerEvent always serializes");
    line.extend_from_slice(b"\n\n");
    Bytes::from(line)
}

/// A sink plus the streaming response that delivers what is sent to it.
pub fn channel() -> (EventSink, Response) {
    let (tx, rx) = mpsc::channel::<Bytes>(STREAM_BUFFER);
    let body = tokio_stream_from(rx).map(Ok::<Bytes, std::convert::Infallible>);
    let response = streaming_response(Body::from_stream(body), "text/event-stream");
    (EventSink { tx }, response)
}

/// A 200 that streams `body` as `content_type`, uncached, and unbuffered by proxies that honour
/// `X-Accel-Buffering` (every event or line is sent as soon as it is made).
pub fn streaming_response(body: Body, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

fn tokio_stream_from(rx: mpsc::Receiver<Bytes>) -> impl futures_util::Stream<Item = Bytes> {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) })
}

/// Longest line kept in memory; a longer one is sent in pieces of this size.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// Splits output into lines the OpenSandbox way: `\r` and `\n` both end a line, `\r\n` counts
/// once, an empty line is reported as `"\n"`, and [`LineSplitter::finish`] flushes a final
/// partial line. Lines are returned without their terminator.
#[derive(Debug, Default)]
pub struct LineSplitter {
    partial: Vec<u8>,
    /// The previous chunk ended with `\r`, so a leading `\n` completes that terminator.
    after_cr: bool,
}

impl LineSplitter {
    pub fn push(&mut self, chunk: &[u8]) -> Vec<String> {
        let mut lines = Vec::new();
        for &byte in chunk {
            let after_cr = std::mem::replace(&mut self.after_cr, false);
            match byte {
                b'\n' if after_cr => {}
                b'\n' | b'\r' => {
                    lines.push(self.take_line());
                    self.after_cr = byte == b'\r';
                }
                _ => {
                    self.partial.push(byte);
                    if self.partial.len() >= MAX_LINE_BYTES {
                        // A character cut by the piece's end goes whole into the next piece.
                        let cut = warren_output::utf8::incomplete_suffix_start(&self.partial);
                        let rest = self.partial.split_off(cut);
                        lines.push(self.take_line());
                        self.partial = rest;
                    }
                }
            }
        }
        lines
    }

    /// The final partial line, if any.
    pub fn finish(&mut self) -> Option<String> {
        self.after_cr = false;
        (!self.partial.is_empty()).then(|| self.take_line())
    }

    fn take_line(&mut self) -> String {
        let line = std::mem::take(&mut self.partial);
        if line.is_empty() {
            return "\n".to_owned();
        }
        match String::from_utf8(line) {
            Ok(text) => text,
            Err(err) => String::from_utf8_lossy(err.as_bytes()).into_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]]) -> Vec<String> {
        let mut splitter = LineSplitter::default();
        let mut lines: Vec<String> = chunks.iter().flat_map(|c| splitter.push(c)).collect();
        lines.extend(splitter.finish());
        lines
    }

    #[test]
    fn splits_lines_like_opensandbox() {
        let table: &[(&[&[u8]], &[&str])] = &[
            (&[b"a\nb\n"], &["a", "b"]),
            (&[b"a\r\nb"], &["a", "b"]),
            (&[b"a\r", b"\nb\n"], &["a", "b"]),
            (&[b"a\rb\r"], &["a", "b"]),
            (&[b"a\n\nb\n"], &["a", "\n", "b"]),
            (&[b"\n"], &["\n"]),
            (&[b"partial"], &["partial"]),
            (&[b"par", b"tial\n"], &["partial"]),
            (&[b""], &[]),
            (&[b"\xffok\n"], &["\u{fffd}ok"]),
        ];
        for (chunks, expected) in table {
            assert_eq!(split(chunks), *expected, "input {chunks:?}");
        }
    }

    #[test]
    fn overlong_lines_are_sent_in_pieces() {
        let long = vec![b'x'; MAX_LINE_BYTES + 10];
        let lines = split(&[&long, b"\n"]);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].len(), MAX_LINE_BYTES);
        assert_eq!(lines[1].len(), 10);
    }

    #[test]
    fn a_character_at_the_end_of_an_overlong_piece_is_not_split() {
        let mut long = vec![b'x'; MAX_LINE_BYTES - 1];
        long.extend_from_slice("你好".as_bytes());
        let lines = split(&[&long, b"\n"]);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].len(), MAX_LINE_BYTES - 1);
        assert_eq!(lines[1], "你好");
    }

    #[test]
    fn events_are_one_json_line_and_a_blank_line() {
        let bytes = encode_event(&ServerEvent::new(EventType::Ping, 5).with_text("pong"));
        assert_eq!(
            &bytes[..],
            b"{\"type\":\"ping\",\"text\":\"pong\",\"timestamp\":5}\n\n"
        );
    }
}
