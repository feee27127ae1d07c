//! The Connect protocol (connectrpc.com/docs/protocol) as envd's SDKs speak it, server side:
//! unary calls (`application/json` or `application/proto` both ways), server streams and client
//! streams of enveloped messages (`application/connect+json` / `+proto`: one flag byte, a
//! four-byte big-endian length, the message), the end-of-stream envelope (flag `0x02`, `{}` or
//! `{"error":{"code","message"}}`), Connect's error codes and their HTTP statuses, and the
//! `Connect-Timeout-Ms` deadline.
//!
//! This is deliberately small: no compression (a compressed envelope or `Content-Encoding` is
//! refused with `unimplemented`), no GET for unary calls, no gRPC or gRPC-Web. Every malformed
//! input (a bad flag, a truncated envelope, one longer than [`MAX_MESSAGE_BYTES`], invalid JSON)
//! is a [`ConnectError`] the client sees; nothing here panics on client bytes. The generated
//! `prost` + `pbjson` types are the messages; this module is generic over them.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::{Buf, BytesMut};
use futures_util::StreamExt;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Largest message (an envelope's payload, or a unary body) accepted or sent.
pub const MAX_MESSAGE_BYTES: usize = 32 * 1024 * 1024;
/// Envelope flag: the payload is compressed (refused: no compression is negotiated).
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Envelope flag: the end-of-stream message.
pub const FLAG_END_STREAM: u8 = 0x02;
/// Bytes before an envelope's payload.
pub const ENVELOPE_HEADER_BYTES: usize = 5;

/// A Connect error code; the wire name is [`Code::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error with this code, as the Connect spec maps them.
    pub fn http_status(self) -> StatusCode {
        let code = match self {
            Code::Canceled => 499,
            Code::Unknown | Code::Internal | Code::DataLoss => 500,
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
            Code::DeadlineExceeded => 504,
            Code::NotFound => 404,
            Code::AlreadyExists | Code::Aborted => 409,
            Code::PermissionDenied => 403,
            Code::ResourceExhausted => 429,
            Code::Unimplemented => 501,
            Code::Unavailable => 503,
            Code::Unauthenticated => 401,
        };
        StatusCode::from_u16(code).expect("every Connect status is a valid HTTP status")
    }
}

/// An error as a Connect client sees it: a code and a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct ConnectError {
    pub code: Code,
    pub message: String,
}

impl ConnectError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Code::NotFound, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Code::Internal, message)
    }

    /// The JSON error body: `{"code":"...","message":"..."}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"code": self.code.as_str(), "message": self.message})
    }

    /// The answer to a unary call: the code's status with the JSON error body.
    pub fn into_unary_response(self) -> Response {
        let body = serde_json::to_vec(&self.to_json()).expect("a JSON value always serializes");
        (
            self.code.http_status(),
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response()
    }
}

/// How the messages of one call are encoded, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Json,
    Proto,
}

/// Unary or streaming, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Unary,
    Stream,
}

/// A message type of the protocol: the generated types are all of these.
pub trait Message:
    prost::Message + Serialize + DeserializeOwned + Default + Send + 'static
{
}
impl<T: prost::Message + Serialize + DeserializeOwned + Default + Send + 'static> Message for T {}

impl Codec {
    /// The codec and shape a `Content-Type` names; `None` for anything else.
    pub fn from_content_type(content_type: &str) -> Option<(Codec, Shape)> {
        let essence = content_type
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        match essence.as_str() {
            "application/json" => Some((Codec::Json, Shape::Unary)),
            "application/proto" => Some((Codec::Proto, Shape::Unary)),
            "application/connect+json" => Some((Codec::Json, Shape::Stream)),
            "application/connect+proto" => Some((Codec::Proto, Shape::Stream)),
            _ => None,
        }
    }

    pub fn content_type(self, shape: Shape) -> &'static str {
        match (self, shape) {
            (Codec::Json, Shape::Unary) => "application/json",
            (Codec::Proto, Shape::Unary) => "application/proto",
            (Codec::Json, Shape::Stream) => "application/connect+json",
            (Codec::Proto, Shape::Stream) => "application/connect+proto",
        }
    }

    /// Decodes one message. An empty JSON body is the empty message (as connect-go takes it).
    pub fn decode<T: Message>(self, bytes: &[u8]) -> Result<T, ConnectError> {
        match self {
            Codec::Json if bytes.iter().all(u8::is_ascii_whitespace) => Ok(T::default()),
            Codec::Json => serde_json::from_slice(bytes).map_err(|error| {
                ConnectError::invalid_argument(format!("invalid JSON message: {error}"))
            }),
            Codec::Proto => T::decode(bytes).map_err(|error| {
                ConnectError::invalid_argument(format!("invalid protobuf message: {error}"))
            }),
        }
    }

    pub fn encode<T: Message>(self, message: &T) -> Result<Vec<u8>, ConnectError> {
        match self {
            Codec::Json => serde_json::to_vec(message)
                .map_err(|error| ConnectError::internal(format!("encoding a message: {error}"))),
            Codec::Proto => Ok(message.encode_to_vec()),
        }
    }
}

/// One envelope: its flags and payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub flags: u8,
    pub data: Bytes,
}

impl Envelope {
    pub fn is_end_stream(&self) -> bool {
        self.flags & FLAG_END_STREAM != 0
    }
}

/// The envelope of `data` with `flags`.
pub fn envelope(flags: u8, data: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(ENVELOPE_HEADER_BYTES + data.len());
    out.extend_from_slice(&[flags]);
    // Callers never pass more than MAX_MESSAGE_BYTES, far below u32::MAX.
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    out.freeze()
}

/// The end-of-stream envelope: `{}`, or `{"error":{...}}`. Always JSON, whatever the codec.
pub fn end_stream(error: Option<&ConnectError>) -> Bytes {
    let body = match error {
        None => serde_json::json!({}),
        Some(error) => serde_json::json!({"error": error.to_json()}),
    };
    envelope(
        FLAG_END_STREAM,
        &serde_json::to_vec(&body).expect("a JSON value always serializes"),
    )
}

/// Splits a byte stream into envelopes, however its chunks fall.
#[derive(Debug)]
pub struct EnvelopeReader {
    buffer: BytesMut,
    max_message_bytes: usize,
}

impl Default for EnvelopeReader {
    fn default() -> Self {
        Self::new(MAX_MESSAGE_BYTES)
    }
}

impl EnvelopeReader {
    pub fn new(max_message_bytes: usize) -> Self {
        Self {
            buffer: BytesMut::new(),
            max_message_bytes,
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.buffer.extend_from_slice(chunk);
    }

    /// The next complete envelope, `None` until one has fully arrived. Unknown flags, a
    /// compressed payload and a length over the limit are errors as soon as the header is in.
    pub fn next_envelope(&mut self) -> Result<Option<Envelope>, ConnectError> {
        if self.buffer.len() < ENVELOPE_HEADER_BYTES {
            return Ok(None);
        }
        let flags = self.buffer[0];
        if flags & !(FLAG_COMPRESSED | FLAG_END_STREAM) != 0 {
            return Err(ConnectError::invalid_argument(format!(
                "invalid envelope flags {flags:#04x}"
            )));
        }
        if flags & FLAG_COMPRESSED != 0 {
            return Err(ConnectError::new(
                Code::Unimplemented,
                "compressed envelopes are not supported (no compression was negotiated)",
            ));
        }
        let length = u32::from_be_bytes([
            self.buffer[1],
            self.buffer[2],
            self.buffer[3],
            self.buffer[4],
        ]) as usize;
        if length > self.max_message_bytes {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!(
                    "message of {length} bytes is larger than the {} allowed",
                    self.max_message_bytes
                ),
            ));
        }
        if self.buffer.len() < ENVELOPE_HEADER_BYTES + length {
            return Ok(None);
        }
        self.buffer.advance(ENVELOPE_HEADER_BYTES);
        let data = self.buffer.split_to(length).freeze();
        Ok(Some(Envelope { flags, data }))
    }

    /// At the end of the body: bytes of an envelope that never completed are an error.
    pub fn finish(&self) -> Result<(), ConnectError> {
        if self.buffer.is_empty() {
            Ok(())
        } else {
            Err(ConnectError::invalid_argument(format!(
                "the body ended inside an envelope ({} bytes left over)",
                self.buffer.len()
            )))
        }
    }
}

/// Reads the request's envelopes as they arrive, decoded with `codec`: a client stream.
pub struct MessageStream {
    body: axum::body::BodyDataStream,
    reader: EnvelopeReader,
    codec: Codec,
    done: bool,
}

impl MessageStream {
    pub fn new(body: Body, codec: Codec) -> Self {
        Self {
            body: body.into_data_stream(),
            reader: EnvelopeReader::default(),
            codec,
            done: false,
        }
    }

    /// The next message; `Ok(None)` at the end of the stream (an end-stream envelope or the end
    /// of the body).
    pub async fn next<T: Message>(&mut self) -> Result<Option<T>, ConnectError> {
        if self.done {
            return Ok(None);
        }
        loop {
            if let Some(envelope) = self.reader.next_envelope()? {
                if envelope.is_end_stream() {
                    self.done = true;
                    return Ok(None);
                }
                return self.codec.decode(&envelope.data).map(Some);
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.reader.push(&chunk),
                Some(Err(error)) => {
                    self.done = true;
                    return Err(ConnectError::new(
                        Code::Canceled,
                        format!("reading the request stream: {error}"),
                    ));
                }
                None => {
                    self.done = true;
                    self.reader.finish()?;
                    return Ok(None);
                }
            }
        }
    }
}

/// The single request message of a server-streaming call: exactly one envelope.
pub async fn read_stream_request<T: Message>(body: Body, codec: Codec) -> Result<T, ConnectError> {
    let mut stream = MessageStream::new(body, codec);
    let message = stream
        .next()
        .await?
        .ok_or_else(|| ConnectError::invalid_argument("the request stream holds no message"))?;
    if stream.next::<T>().await?.is_some() {
        return Err(ConnectError::invalid_argument(
            "a server-streaming call takes exactly one request message",
        ));
    }
    Ok(message)
}

/// The body of a unary call, at most [`MAX_MESSAGE_BYTES`], decoded with `codec`.
pub async fn read_unary_request<T: Message>(body: Body, codec: Codec) -> Result<T, ConnectError> {
    let bytes = axum::body::to_bytes(body, MAX_MESSAGE_BYTES)
        .await
        .map_err(|error| {
            ConnectError::new(
                Code::ResourceExhausted,
                format!("reading the request body (at most {MAX_MESSAGE_BYTES} bytes): {error}"),
            )
        })?;
    codec.decode(&bytes)
}

/// The answer to a unary call.
pub fn unary_response<T: Message>(codec: Codec, result: Result<T, ConnectError>) -> Response {
    match result.and_then(|message| codec.encode(&message)) {
        Ok(body) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(codec.content_type(Shape::Unary)),
            )],
            body,
        )
            .into_response(),
        Err(error) => error.into_unary_response(),
    }
}

/// Sends the messages of one server stream; dropped, the stream ends without an end-stream
/// envelope, so callers always [`StreamSender::finish`].
pub struct StreamSender {
    codec: Codec,
    sender: tokio::sync::mpsc::Sender<Bytes>,
}

/// How many encoded messages a server stream buffers for a slow client.
const STREAM_BUFFER: usize = 64;

impl StreamSender {
    /// A sender and the 200 response whose body it feeds.
    pub fn response(codec: Codec) -> (Self, Response) {
        let (sender, receiver) = tokio::sync::mpsc::channel::<Bytes>(STREAM_BUFFER);
        let body = Body::from_stream(
            tokio_stream_from(receiver).map(Ok::<Bytes, std::convert::Infallible>),
        );
        let response = (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(codec.content_type(Shape::Stream)),
            )],
            body,
        )
            .into_response();
        (Self { codec, sender }, response)
    }

    /// Sends one message; `false` once the client has gone.
    pub async fn send<T: Message>(&self, message: &T) -> bool {
        match self.codec.encode(message) {
            Ok(data) => self.sender.send(envelope(0, &data)).await.is_ok(),
            Err(error) => {
                tracing::error!(%error, "encoding a stream message");
                false
            }
        }
    }

    /// Ends the stream, with `error` or without.
    pub async fn finish(self, error: Option<ConnectError>) {
        let _ = self.sender.send(end_stream(error.as_ref())).await;
    }

    /// Resolves when the client has gone (the response body was dropped).
    pub async fn closed(&self) {
        self.sender.closed().await;
    }
}

/// A stream whose only message is the end-stream envelope carrying `error`: how a streaming
/// call that fails before it starts answers (HTTP 200, as Connect streams always do).
pub fn stream_error_response(codec: Codec, error: &ConnectError) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(codec.content_type(Shape::Stream)),
        )],
        end_stream(Some(error)),
    )
        .into_response()
}

fn tokio_stream_from(
    mut receiver: tokio::sync::mpsc::Receiver<Bytes>,
) -> impl futures_util::Stream<Item = Bytes> + Send + 'static {
    futures_util::stream::poll_fn(move |context| receiver.poll_recv(context))
}

/// The call's deadline from `Connect-Timeout-Ms` (at most 10 digits, as the spec allows);
/// absent or `0` is none. Anything else is `invalid_argument`.
pub fn timeout(headers: &HeaderMap) -> Result<Option<Duration>, ConnectError> {
    let Some(value) = headers.get("connect-timeout-ms") else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or_default();
    if text.is_empty() || text.len() > 10 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ConnectError::invalid_argument(format!(
            "Connect-Timeout-Ms must be 1 to 10 digits, not {text:?}"
        )));
    }
    let ms: u64 = text.parse().unwrap_or(0);
    Ok((ms > 0).then(|| Duration::from_millis(ms)))
}

/// The codec and shape of a request, refusing compression; `Err` is the whole answer (415
/// for a content type that is not Connect's).
pub fn negotiate(headers: &HeaderMap) -> Result<(Codec, Shape), ConnectError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    let Some((codec, shape)) = Codec::from_content_type(content_type) else {
        return Err(ConnectError::invalid_argument(format!(
            "unsupported content type {content_type:?}: use application/json or \
             application/proto (unary), application/connect+json or application/connect+proto \
             (streams)"
        )));
    };
    let encoding_header = match shape {
        Shape::Unary => header::CONTENT_ENCODING.as_str(),
        Shape::Stream => "connect-content-encoding",
    };
    if let Some(encoding) = headers.get(encoding_header)
        && encoding.as_bytes() != b"identity"
    {
        return Err(ConnectError::new(
            Code::Unimplemented,
            format!("{encoding_header} {encoding:?} is not supported; send identity"),
        ));
    }
    Ok((codec, shape))
}

/// The 415 answer to a request whose content type is not Connect's.
pub fn unsupported_media_type(error: ConnectError) -> Response {
    let mut response = error.into_unary_response();
    *response.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
    response.headers_mut().insert(
        header::HeaderName::from_static("accept-post"),
        HeaderValue::from_static(
            "application/json, application/proto, application/connect+json, \
             application/connect+proto",
        ),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_the_statuses_of_the_connect_spec() {
        let table = [
            (Code::InvalidArgument, 400, "invalid_argument"),
            (Code::Unauthenticated, 401, "unauthenticated"),
            (Code::PermissionDenied, 403, "permission_denied"),
            (Code::NotFound, 404, "not_found"),
            (Code::AlreadyExists, 409, "already_exists"),
            (Code::ResourceExhausted, 429, "resource_exhausted"),
            (Code::Canceled, 499, "canceled"),
            (Code::Internal, 500, "internal"),
            (Code::Unimplemented, 501, "unimplemented"),
            (Code::Unavailable, 503, "unavailable"),
            (Code::DeadlineExceeded, 504, "deadline_exceeded"),
        ];
        for (code, status, name) in table {
            assert_eq!(code.http_status().as_u16(), status, "{name}");
            assert_eq!(code.as_str(), name);
        }
    }

    use super::super::proto::process::{ProcessSelector, SendSignalRequest, process_selector};

    fn read_all(reader: &mut EnvelopeReader) -> Vec<Envelope> {
        let mut envelopes = Vec::new();
        while let Some(envelope) = reader.next_envelope().expect("valid envelopes") {
            envelopes.push(envelope);
        }
        envelopes
    }

    #[test]
    fn envelopes_split_across_reads_come_out_whole() {
        let mut wire = envelope(0, br#"{"a":1}"#).to_vec();
        wire.extend_from_slice(&envelope(0, b""));
        wire.extend_from_slice(&end_stream(None));
        let mut reader = EnvelopeReader::default();
        let mut envelopes = Vec::new();
        for byte in &wire {
            reader.push(std::slice::from_ref(byte));
            envelopes.extend(read_all(&mut reader));
        }
        reader.finish().expect("nothing left over");
        assert_eq!(envelopes.len(), 3);
        assert_eq!(&envelopes[0].data[..], br#"{"a":1}"#);
        assert!(envelopes[1].data.is_empty());
        assert!(envelopes[2].is_end_stream());
        assert_eq!(&envelopes[2].data[..], b"{}");
    }

    #[test]
    fn a_16_mib_message_passes_and_one_over_the_limit_is_refused_from_its_header() {
        let big = vec![b'x'; 16 * 1024 * 1024];
        let mut reader = EnvelopeReader::default();
        for chunk in envelope(0, &big).chunks(64 * 1024) {
            reader.push(chunk);
        }
        let envelopes = read_all(&mut reader);
        assert_eq!(envelopes.len(), 1);
        assert_eq!(envelopes[0].data.len(), big.len());

        let mut reader = EnvelopeReader::default();
        let too_long = (MAX_MESSAGE_BYTES as u32 + 1).to_be_bytes();
        reader.push(&[0, too_long[0], too_long[1], too_long[2], too_long[3]]);
        let error = reader.next_envelope().expect_err("over the limit");
        assert_eq!(error.code, Code::ResourceExhausted);
    }

    #[test]
    fn bad_flags_compression_and_a_truncated_envelope_are_errors() {
        let table: [(&[u8], Code); 3] = [
            (&[0x80, 0, 0, 0, 0], Code::InvalidArgument),
            (&[0x04, 0, 0, 0, 0], Code::InvalidArgument),
            (&[FLAG_COMPRESSED, 0, 0, 0, 0], Code::Unimplemented),
        ];
        for (wire, code) in table {
            let mut reader = EnvelopeReader::default();
            reader.push(wire);
            assert_eq!(
                reader.next_envelope().expect_err("refused").code,
                code,
                "{wire:?}"
            );
        }
        let mut reader = EnvelopeReader::default();
        reader.push(&envelope(0, b"{}")[..4]);
        assert_eq!(
            reader.next_envelope().expect("incomplete is no error"),
            None
        );
        assert_eq!(
            reader.finish().expect_err("truncated").code,
            Code::InvalidArgument
        );
    }

    #[test]
    fn end_of_stream_carries_nothing_or_the_error() {
        let ok = end_stream(None);
        assert_eq!(ok[0], FLAG_END_STREAM);
        assert_eq!(&ok[5..], b"{}");
        let failed = end_stream(Some(&ConnectError::not_found("process 7 not found")));
        let body: serde_json::Value = serde_json::from_slice(&failed[5..]).expect("JSON");
        assert_eq!(
            body,
            serde_json::json!({"error": {"code": "not_found", "message": "process 7 not found"}})
        );
        assert_eq!(
            u32::from_be_bytes([failed[1], failed[2], failed[3], failed[4]]) as usize,
            failed.len() - 5
        );
    }

    #[test]
    fn json_follows_the_proto3_mapping_and_bad_json_is_invalid_argument() {
        let table = [
            (
                r#"{"process":{"pid":42},"signal":"SIGNAL_SIGKILL"}"#,
                Some((42, 9)),
            ),
            (r#"{"process":{"pid":"42"},"signal":9}"#, Some((42, 9))),
            (
                r#"{"process":{"pid":42},"signal":"SIGNAL_SIGKILL","futureField":1}"#,
                Some((42, 9)),
            ),
            (r#"{"process":{"pid":-1}}"#, None),
            (r#"{"process":"#, None),
            ("[]", None),
        ];
        for (json, expected) in table {
            let decoded = Codec::Json.decode::<SendSignalRequest>(json.as_bytes());
            match expected {
                Some((pid, signal)) => {
                    let request = decoded.expect(json);
                    assert_eq!(
                        request.process,
                        Some(ProcessSelector {
                            selector: Some(process_selector::Selector::Pid(pid))
                        }),
                        "{json}"
                    );
                    assert_eq!(request.signal, signal, "{json}");
                }
                None => assert_eq!(
                    decoded.expect_err(json).code,
                    Code::InvalidArgument,
                    "{json}"
                ),
            }
        }
        let entry = super::super::proto::filesystem::EntryInfo {
            size: 1 << 40,
            ..Default::default()
        };
        let json: serde_json::Value =
            serde_json::from_slice(&Codec::Json.encode(&entry).expect("encodes")).expect("JSON");
        assert_eq!(json["size"], "1099511627776", "int64 is a JSON string");
    }

    #[test]
    fn timeouts_come_from_connect_timeout_ms() {
        let table = [
            (None, Ok(None)),
            (Some("1500"), Ok(Some(Duration::from_millis(1500)))),
            (Some("0"), Ok(None)),
            (Some("-1"), Err(())),
            (Some("12345678901"), Err(())),
            (Some("abc"), Err(())),
        ];
        for (value, expected) in table {
            let mut headers = HeaderMap::new();
            if let Some(value) = value {
                headers.insert("connect-timeout-ms", HeaderValue::from_static(value));
            }
            assert_eq!(timeout(&headers).map_err(|_| ()), expected, "{value:?}");
        }
    }

    #[test]
    fn content_types_name_codec_and_shape() {
        let table = [
            ("application/json", Some((Codec::Json, Shape::Unary))),
            (
                "application/json; charset=utf-8",
                Some((Codec::Json, Shape::Unary)),
            ),
            ("application/proto", Some((Codec::Proto, Shape::Unary))),
            (
                "Application/Connect+JSON",
                Some((Codec::Json, Shape::Stream)),
            ),
            (
                "application/connect+proto",
                Some((Codec::Proto, Shape::Stream)),
            ),
            ("text/plain", None),
            ("application/grpc", None),
            ("", None),
        ];
        for (content_type, expected) in table {
            assert_eq!(
                Codec::from_content_type(content_type),
                expected,
                "{content_type}"
            );
        }
    }
}
