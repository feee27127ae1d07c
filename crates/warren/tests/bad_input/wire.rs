//! HTTP/1.1 and WebSocket on raw TCP, so a request can carry exactly the bytes a case needs
//! (no client library repairs a bad path, header or frame first): one request per connection,
//! an answer read within [`ANSWER_WITHIN`], and the WebSocket frames the matrix sends.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// What the issue promises for every bad request: an answer within one second.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(1);

/// How a request's body goes out.
#[derive(Clone, Debug)]
pub enum Body {
    None,
    /// With `Content-Length`.
    Sized(Vec<u8>),
    /// `Transfer-Encoding: chunked`, no `Content-Length`, in 64 KiB chunks.
    Chunked(Vec<u8>),
}

/// One request, byte for byte: `target` is the request line's path and query as sent.
#[derive(Clone, Debug)]
pub struct Request {
    pub method: String,
    pub target: Vec<u8>,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Body,
}

impl Request {
    pub fn new(method: &str, target: impl Into<Vec<u8>>) -> Self {
        Self {
            method: method.to_owned(),
            target: target.into(),
            headers: Vec::new(),
            body: Body::None,
        }
    }

    pub fn header(mut self, name: &str, value: impl Into<Vec<u8>>) -> Self {
        self.headers.push((name.to_owned(), value.into()));
        self
    }

    /// Drops every header called `name` (case-insensitive).
    pub fn without(mut self, name: &str) -> Self {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self
    }

    pub fn body(mut self, body: Body) -> Self {
        self.body = body;
        self
    }

    fn head_bytes(&self, host: SocketAddr) -> Vec<u8> {
        let mut head = Vec::new();
        head.extend_from_slice(self.method.as_bytes());
        head.push(b' ');
        head.extend_from_slice(&self.target);
        head.extend_from_slice(b" HTTP/1.1\r\n");
        head.extend_from_slice(format!("Host: {host}\r\nConnection: close\r\n").as_bytes());
        for (name, value) in &self.headers {
            head.extend_from_slice(name.as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(value);
            head.extend_from_slice(b"\r\n");
        }
        match &self.body {
            Body::None => {}
            Body::Sized(bytes) => {
                head.extend_from_slice(format!("Content-Length: {}\r\n", bytes.len()).as_bytes())
            }
            Body::Chunked(_) => head.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
        }
        head.extend_from_slice(b"\r\n");
        head
    }

    fn body_bytes(&self) -> Vec<u8> {
        match &self.body {
            Body::None => Vec::new(),
            Body::Sized(bytes) => bytes.clone(),
            Body::Chunked(bytes) => {
                let mut out = Vec::with_capacity(bytes.len() + bytes.len() / 1024 + 16);
                for chunk in bytes.chunks(64 * 1024) {
                    out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                    out.extend_from_slice(chunk);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"0\r\n\r\n");
                out
            }
        }
    }
}

/// An answer: status, headers (names lowercased) and, for anything but 1xx/2xx, the body.
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Sends `request` on a new connection and reads the answer, within [`ANSWER_WITHIN`]. The body
/// is written while the answer is read, so a server that answers 413 before reading a huge body
/// is seen answering. Bodies of 1xx/2xx answers are not read (they may be endless streams).
pub async fn send(addr: SocketAddr, request: &Request) -> Result<Response, String> {
    tokio::time::timeout(ANSWER_WITHIN, exchange(addr, request))
        .await
        .map_err(|_| format!("no answer within {ANSWER_WITHIN:?}"))?
}

async fn exchange(addr: SocketAddr, request: &Request) -> Result<Response, String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut reader, mut writer) = stream.into_split();
    let head = request.head_bytes(addr);
    let body = request.body_bytes();
    let writing = tokio::spawn(async move {
        // A server may answer and close before the whole body is read: that is not a failure.
        if writer.write_all(&head).await.is_ok() {
            let _ = writer.write_all(&body).await;
        }
        writer
    });
    let answer = read_response(&mut reader).await;
    writing.abort();
    answer
}

async fn read_response(reader: &mut (impl AsyncReadExt + Unpin)) -> Result<Response, String> {
    let mut buffer = Vec::new();
    let head_end = loop {
        if let Some(end) = find(&buffer, b"\r\n\r\n") {
            break end;
        }
        let mut chunk = [0u8; 8192];
        let n = reader
            .read(&mut chunk)
            .await
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err(format!(
                "connection closed without an answer (read {:?})",
                String::from_utf8_lossy(&buffer)
            ));
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("a status line, got {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut response = Response {
        status,
        headers,
        body: Vec::new(),
    };
    if status < 300 {
        return Ok(response);
    }
    let mut rest = buffer[head_end + 4..].to_vec();
    let mut chunk = [0u8; 8192];
    let length = response
        .header("content-length")
        .and_then(|v| v.parse::<usize>().ok());
    let chunked = response
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    loop {
        if length.is_some_and(|len| rest.len() >= len) {
            rest.truncate(length.unwrap_or_default());
            break;
        }
        if chunked && find(&rest, b"0\r\n\r\n").is_some() {
            rest = dechunk(&rest);
            break;
        }
        let n = reader.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            if chunked {
                rest = dechunk(&rest);
            }
            break;
        }
        rest.extend_from_slice(&chunk[..n]);
    }
    response.body = rest;
    Ok(response)
}

fn dechunk(mut bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(line_end) = find(bytes, b"\r\n") {
        let size = std::str::from_utf8(&bytes[..line_end])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next().unwrap_or("").trim(), 16).ok())
            .unwrap_or(0);
        if size == 0 || bytes.len() < line_end + 2 + size {
            break;
        }
        out.extend_from_slice(&bytes[line_end + 2..line_end + 2 + size]);
        bytes = &bytes[(line_end + 4 + size).min(bytes.len())..];
    }
    out
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Sends `request` as HTTP/1.0 (a sized body with its `Content-Length`, any other body as none)
/// and reads the whole answer, however long it takes: for the fixtures a matrix needs first,
/// not for its cases.
pub async fn fetch(addr: SocketAddr, request: &Request) -> Vec<u8> {
    let mut stream = TcpStream::connect(addr).await.expect("connects");
    let mut bytes = format!("{} ", request.method).into_bytes();
    bytes.extend_from_slice(&request.target);
    bytes.extend_from_slice(b" HTTP/1.0\r\n");
    for (name, value) in &request.headers {
        bytes.extend_from_slice(format!("{name}: ").as_bytes());
        bytes.extend_from_slice(value);
        bytes.extend_from_slice(b"\r\n");
    }
    let body = match &request.body {
        Body::Sized(body) => body.as_slice(),
        _ => &[],
    };
    bytes.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
    bytes.extend_from_slice(body);
    stream.write_all(&bytes).await.expect("writes");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("reads");
    answer
}

/// The body of a whole answer [`fetch`] read: what follows its head.
pub fn body_of(answer: &[u8]) -> &[u8] {
    let at = find(answer, b"\r\n\r\n").expect("a head");
    &answer[at + 4..]
}

/// Opens a WebSocket with `request` (the upgrade's headers added), returning the stream after a
/// 101, or what came instead.
pub async fn websocket(addr: SocketAddr, request: &Request) -> Result<TcpStream, String> {
    let attempt = async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        let mut head = request
            .clone()
            .header("Upgrade", "websocket")
            .header("Connection", "Upgrade")
            .header("Sec-WebSocket-Version", "13")
            .header("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
            .head_bytes(addr);
        // The `Connection: close` of ordinary requests would contradict the upgrade.
        let close = b"Connection: close\r\n";
        if let Some(at) = find(&head, close) {
            head.drain(at..at + close.len());
        }
        stream.write_all(&head).await.ok()?;
        let mut buffer = Vec::new();
        let mut byte = [0u8; 1];
        while find(&buffer, b"\r\n\r\n").is_none() {
            if stream.read(&mut byte).await.ok()? == 0 {
                return None;
            }
            buffer.push(byte[0]);
        }
        Some((stream, buffer))
    };
    let Ok(Some((stream, head))) = tokio::time::timeout(ANSWER_WITHIN, attempt).await else {
        return Err(format!("no upgrade answer within {ANSWER_WITHIN:?}"));
    };
    let head = String::from_utf8_lossy(&head).into_owned();
    if head.starts_with("HTTP/1.1 101") {
        return Ok(stream);
    }
    Err(format!("not a 101: {head}"))
}

/// A client frame: FIN and opcode in `first_byte`, `payload`, masked as clients must (with a
/// zero mask, so the payload goes out as given) or unmasked when `masked` is false.
pub fn client_frame(first_byte: u8, payload: &[u8], masked: bool) -> Vec<u8> {
    let mut frame = vec![first_byte];
    let mask_bit = if masked { 0x80 } else { 0 };
    match payload.len() {
        len if len < 126 => frame.push(mask_bit | len as u8),
        len if len <= usize::from(u16::MAX) => {
            frame.push(mask_bit | 126);
            frame.extend_from_slice(&(len as u16).to_be_bytes());
        }
        len => {
            frame.push(mask_bit | 127);
            frame.extend_from_slice(&(len as u64).to_be_bytes());
        }
    }
    if masked {
        frame.extend_from_slice(&[0, 0, 0, 0]);
    }
    frame.extend_from_slice(payload);
    frame
}

/// Reads server frames until a close frame and returns its code; `None` if the connection ended
/// without one (what a client reports as 1006) or nothing came within [`ANSWER_WITHIN`].
pub async fn close_code(stream: &mut TcpStream) -> Option<u16> {
    let read = async {
        loop {
            let first = stream.read_u8().await.ok()?;
            let second = stream.read_u8().await.ok()?;
            let len = match second & 0x7f {
                126 => u64::from(stream.read_u16().await.ok()?),
                127 => stream.read_u64().await.ok()?,
                n => u64::from(n),
            };
            let mut payload = vec![0u8; usize::try_from(len).ok()?];
            stream.read_exact(&mut payload).await.ok()?;
            if first & 0x0f == 0x8 {
                return Some(u16::from_be_bytes([*payload.first()?, *payload.get(1)?]));
            }
        }
    };
    tokio::time::timeout(ANSWER_WITHIN, read).await.ok()?
}
