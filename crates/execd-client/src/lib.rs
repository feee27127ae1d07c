//! A typed client of `warren execd`'s Warren routes, on `warren-protocol` types: the exec tools
//! (`/v1/exec`), the agent's terminals (`/v1/terminals`), files (`/v1/files*`, in [`files`]:
//! downloads with ranges, uploads, listings, moves, removal, the change feed), the hands'
//! identity and workspace snapshots (`/v1/hands/identity`, `/v1/workspace/*`), the PTY sessions
//! (`/pty`, in [`pty`]) and `/ping`, over
//! TCP (`http://host:port`) or a Unix socket (`unix:/path`). The gateway (hands),
//! `warren mcp --execd` and the tests use it; nobody builds execd bodies by hand or parses its
//! answers by string keys.
//!
//! Every non-2xx answer becomes [`ClientError::Api`] with execd's `{code,message}`, so callers
//! match on the machine-readable code; with [`ExecdClient::with_nonce`] every request carries
//! the hands nonce, and an execd that is another sandbox answers `HANDS_IDENTITY_MISMATCH`. The
//! OpenSandbox routes are deliberately absent: they are for third-party SDKs.

mod changes;
mod files;
mod patch;
mod pty;

use std::path::PathBuf;
use std::time::Duration;

use futures_util::{Stream, TryStreamExt};
use reqwest::StatusCode;
use serde::de::DeserializeOwned;
use warren_protocol::error::ErrorBody;
use warren_protocol::exec::{
    ExecCommandArgs, ExecResult, SessionId, SessionList, WriteStdinArgs, WriteStdinBody,
};
use warren_protocol::hands::{HANDS_NONCE_HEADER, HandsIdentity, RestoreResult};
use warren_protocol::terminal::{TerminalCreate, TerminalCreated, TerminalList, TerminalOutput};

pub use files::{Download, Uploaded};
pub use pty::PtySocket;

/// The header execd reads its access token from.
pub const ACCESS_TOKEN_HEADER: &str = "X-EXECD-ACCESS-TOKEN";

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid execd URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    /// No answer, or one that is not execd's (a proxy's page, a cut connection).
    #[error("execd at {url} is unreachable: {detail}")]
    Unreachable { url: String, detail: String },
    #[error("execd at {url} refused the access token (401)")]
    Unauthorized { url: String },
    /// execd answered with its error shape.
    #[error("execd answered {status}: {code}: {message}")]
    Api {
        status: StatusCode,
        code: String,
        message: String,
    },
}

impl ClientError {
    /// The machine-readable code of an [`ClientError::Api`] answer.
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    pub fn status(&self) -> Option<StatusCode> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            ClientError::Unauthorized { .. } => Some(StatusCode::UNAUTHORIZED),
            _ => None,
        }
    }
}

/// Which tree of the hands a snapshot is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tree {
    /// `--root`.
    Workspace,
    /// The agent's home (`--home`).
    Home,
}

impl Tree {
    fn name(self) -> &'static str {
        match self {
            Tree::Workspace => "workspace",
            Tree::Home => "home",
        }
    }
}

/// The host name requests over a Unix socket carry (execd never resolves it).
const UNIX_SOCKET_BASE: &str = "http://hands";

/// A client of one execd. Cheap to clone.
#[derive(Clone)]
pub struct ExecdClient {
    http: reqwest::Client,
    /// The same connection settings without the overall timeout, for snapshots and restores,
    /// which take as long as the workspace is large.
    streaming: reqwest::Client,
    /// Where requests go: `http://host:port` (optionally with a path prefix) or
    /// [`UNIX_SOCKET_BASE`], no trailing slash.
    request_base: String,
    /// The URL as given (trailing slash trimmed): `http://...` or `unix:/path`.
    base_url: String,
    access_token: Option<String>,
    hands_nonce: Option<String>,
}

impl std::fmt::Debug for ExecdClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecdClient")
            .field("base_url", &self.base_url)
            .field("hands_nonce", &self.hands_nonce)
            .field(
                "access_token",
                &self.access_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl ExecdClient {
    /// A client for the execd at `base_url`: `http://host:port`, or `unix:/path/to/execd.sock`.
    pub fn new(base_url: &str, access_token: Option<String>) -> Result<Self, ClientError> {
        let invalid = |reason: &str| ClientError::InvalidUrl {
            url: base_url.to_owned(),
            reason: reason.to_owned(),
        };
        let socket = match base_url.strip_prefix("unix:") {
            Some("") => return Err(invalid("expected unix:/path/to/execd.sock")),
            Some(path) => Some(PathBuf::from(path)),
            None => {
                check_http_url(base_url).map_err(invalid)?;
                None
            }
        };
        let base_url = base_url.trim_end_matches('/').to_owned();
        let request_base = match socket {
            Some(_) => UNIX_SOCKET_BASE.to_owned(),
            None => base_url.clone(),
        };
        // execd closes a keep-alive connection idle for its header read timeout (30 s by
        // default); dropping ours well before means a request never races that close.
        let builder = || {
            let builder = reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .pool_idle_timeout(Duration::from_secs(15));
            match &socket {
                Some(path) => builder.unix_socket(path.clone()),
                None => builder,
            }
        };
        let unreachable = |e: reqwest::Error| ClientError::Unreachable {
            url: base_url.clone(),
            detail: e.to_string(),
        };
        // No call legitimately takes longer than the longest poll (300 s) plus the kill grace
        // and drain; past that the execd is stuck and the caller should hear about it.
        let http = builder()
            .timeout(Duration::from_secs(360))
            .build()
            .map_err(unreachable)?;
        let streaming = builder().build().map_err(unreachable)?;
        Ok(Self {
            http,
            streaming,
            request_base,
            base_url,
            access_token,
            hands_nonce: None,
        })
    }

    /// Sends `X-Warren-Hands-Nonce: nonce` on every request: an execd with another nonce
    /// answers 409 `HANDS_IDENTITY_MISMATCH` instead of serving it.
    pub fn with_nonce(mut self, nonce: impl Into<String>) -> Self {
        self.hands_nonce = Some(nonce.into());
        self
    }

    /// The URL as given: `http://host:port` or `unix:/path`.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// `GET /ping`.
    pub async fn ping(&self) -> Result<(), ClientError> {
        let request = self.request(reqwest::Method::GET, "/ping");
        self.send_empty(request).await
    }

    /// `GET /v1/hands/identity`: the execd's nonce and start time.
    pub async fn identity(&self) -> Result<HandsIdentity, ClientError> {
        let request = self.request(reqwest::Method::GET, "/v1/hands/identity");
        self.send(request).await
    }

    /// `GET /v1/workspace/snapshot`: the workspace as a zstd-compressed tar, chunk by chunk as
    /// execd packs it. A stream execd aborted (a failure midway, a cut connection) ends with an
    /// error item, never early with success. No overall timeout.
    pub async fn snapshot(
        &self,
    ) -> Result<impl Stream<Item = Result<bytes::Bytes, ClientError>> + Send + 'static, ClientError>
    {
        self.snapshot_of(Tree::Workspace).await
    }

    /// [`ExecdClient::snapshot`] of `tree` (`?tree=home`: the agent's home).
    pub async fn snapshot_of(
        &self,
        tree: Tree,
    ) -> Result<impl Stream<Item = Result<bytes::Bytes, ClientError>> + Send + 'static, ClientError>
    {
        let request = self
            .request_on(
                &self.streaming,
                reqwest::Method::GET,
                "/v1/workspace/snapshot",
            )
            .query(&[("tree", tree.name())]);
        let response = self.checked(request).await?;
        Ok(self.body_chunks(response, "snapshot"))
    }

    /// `POST /v1/workspace/restore`: unpacks `body` (a snapshot) into the execd's empty
    /// workspace. No overall timeout.
    pub async fn restore(&self, body: reqwest::Body) -> Result<RestoreResult, ClientError> {
        self.restore_to(Tree::Workspace, body).await
    }

    /// [`ExecdClient::restore`] into `tree`, which must be empty.
    pub async fn restore_to(
        &self,
        tree: Tree,
        body: reqwest::Body,
    ) -> Result<RestoreResult, ClientError> {
        let request = self
            .request_on(
                &self.streaming,
                reqwest::Method::POST,
                "/v1/workspace/restore",
            )
            .query(&[("tree", tree.name())])
            .header(reqwest::header::CONTENT_TYPE, "application/zstd")
            .body(body);
        self.send(request).await
    }

    /// `POST /v1/exec`.
    pub async fn exec_command(&self, args: &ExecCommandArgs) -> Result<ExecResult, ClientError> {
        let request = self.request(reqwest::Method::POST, "/v1/exec").json(args);
        self.send(request).await
    }

    /// `POST /v1/exec/{id}/stdin`.
    pub async fn write_stdin(&self, args: WriteStdinArgs) -> Result<ExecResult, ClientError> {
        let path = format!("/v1/exec/{}/stdin", args.session_id);
        let body = WriteStdinBody {
            chars: args.chars,
            yield_time_ms: args.yield_time_ms,
            max_output_tokens: args.max_output_tokens,
        };
        let request = self.request(reqwest::Method::POST, &path).json(&body);
        self.send(request).await
    }

    /// `GET /v1/exec`.
    pub async fn list_sessions(&self) -> Result<SessionList, ClientError> {
        let request = self.request(reqwest::Method::GET, "/v1/exec");
        self.send(request).await
    }

    /// `DELETE /v1/exec/{id}`.
    pub async fn kill_session(&self, session_id: SessionId) -> Result<ExecResult, ClientError> {
        let path = format!("/v1/exec/{session_id}");
        let request = self.request(reqwest::Method::DELETE, &path);
        self.send(request).await
    }

    /// `POST /v1/terminals`.
    pub async fn create_terminal(
        &self,
        create: &TerminalCreate,
    ) -> Result<TerminalCreated, ClientError> {
        let request = self
            .request(reqwest::Method::POST, "/v1/terminals")
            .json(create);
        self.send(request).await
    }

    /// `GET /v1/terminals/{id}/output?wait_ms=N`: waits up to `wait` for the exit.
    pub async fn terminal_output(
        &self,
        terminal_id: &str,
        wait: Duration,
    ) -> Result<TerminalOutput, ClientError> {
        let path = format!("/v1/terminals/{terminal_id}/output");
        let request = self
            .request(reqwest::Method::GET, &path)
            .query(&[("wait_ms", wait.as_millis().to_string())]);
        self.send(request).await
    }

    /// `POST /v1/terminals/{id}/kill`.
    pub async fn kill_terminal(&self, terminal_id: &str) -> Result<(), ClientError> {
        let path = format!("/v1/terminals/{terminal_id}/kill");
        let request = self.request(reqwest::Method::POST, &path);
        self.send_empty(request).await
    }

    /// `DELETE /v1/terminals/{id}`.
    pub async fn release_terminal(&self, terminal_id: &str) -> Result<(), ClientError> {
        let path = format!("/v1/terminals/{terminal_id}");
        let request = self.request(reqwest::Method::DELETE, &path);
        self.send_empty(request).await
    }

    /// `GET /v1/terminals`.
    pub async fn list_terminals(&self) -> Result<TerminalList, ClientError> {
        let request = self.request(reqwest::Method::GET, "/v1/terminals");
        self.send(request).await
    }

    /// `GET /v1/files?path=P`: the whole file.
    pub async fn read_file(&self, path: &str) -> Result<bytes::Bytes, ClientError> {
        let request = self
            .request(reqwest::Method::GET, "/v1/files")
            .query(&[("path", path)]);
        let response = self.checked(request).await?;
        response.bytes().await.map_err(|e| self.unreachable(&e))
    }

    /// `PUT /v1/files?path=P`: replaces the file atomically ([`ExecdClient::upload`] with the
    /// overall timeout, for contents at hand).
    pub async fn write_file(
        &self,
        path: &str,
        content: impl Into<reqwest::Body>,
    ) -> Result<(), ClientError> {
        self.upload_on(&self.http, path, content.into())
            .await
            .map(drop)
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.request_on(&self.http, method, path)
    }

    fn request_on(
        &self,
        http: &reqwest::Client,
        method: reqwest::Method,
        path: &str,
    ) -> reqwest::RequestBuilder {
        let mut request = http.request(method, format!("{}{path}", self.request_base));
        if let Some(token) = &self.access_token {
            request = request.header(ACCESS_TOKEN_HEADER, token);
        }
        if let Some(nonce) = &self.hands_nonce {
            request = request.header(HANDS_NONCE_HEADER, nonce);
        }
        request
    }

    /// `response`'s body chunk by chunk; a body cut midway ends with an error item that says
    /// which (`what`) stream broke.
    fn body_chunks(
        &self,
        response: reqwest::Response,
        what: &'static str,
    ) -> impl Stream<Item = Result<bytes::Bytes, ClientError>> + Send + 'static {
        let url = self.base_url.clone();
        response
            .bytes_stream()
            .map_err(move |e| ClientError::Unreachable {
                url: url.clone(),
                detail: format!("{what} stream broken: {}", error_chain(&e)),
            })
    }

    fn unreachable(&self, error: &dyn std::error::Error) -> ClientError {
        ClientError::Unreachable {
            url: self.base_url.clone(),
            detail: error_chain(error),
        }
    }

    /// Sends `request`; a 2xx answer is returned, anything else becomes the error it says.
    async fn checked(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ClientError> {
        let response = request.send().await.map_err(|e| self.unreachable(&e))?;
        self.check(response).await
    }

    /// A 2xx `response` as it is; anything else becomes the error it says.
    async fn check(&self, response: reqwest::Response) -> Result<reqwest::Response, ClientError> {
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        if status == StatusCode::UNAUTHORIZED {
            return Err(ClientError::Unauthorized {
                url: self.base_url.clone(),
            });
        }
        let body = response.bytes().await.map_err(|e| self.unreachable(&e))?;
        match serde_json::from_slice::<ErrorBody>(&body) {
            Ok(error) => Err(ClientError::Api {
                status,
                code: error.code,
                message: error.message,
            }),
            Err(_) => Err(ClientError::Unreachable {
                url: self.base_url.clone(),
                detail: format!(
                    "answered {status}: {}",
                    String::from_utf8_lossy(&body).trim()
                ),
            }),
        }
    }

    async fn send<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<T, ClientError> {
        let response = self.checked(request).await?;
        self.read_json(response).await
    }

    /// The JSON body of a 2xx `response`.
    async fn read_json<T: DeserializeOwned>(
        &self,
        response: reqwest::Response,
    ) -> Result<T, ClientError> {
        let status = response.status();
        let body = response.bytes().await.map_err(|e| self.unreachable(&e))?;
        serde_json::from_slice(&body).map_err(|e| ClientError::Unreachable {
            url: self.base_url.clone(),
            detail: format!("unreadable {status} answer: {e}"),
        })
    }

    async fn send_empty(&self, request: reqwest::RequestBuilder) -> Result<(), ClientError> {
        self.checked(request).await.map(drop)
    }
}

/// Why `url` is not a plain `http://host[:port][/prefix]` URL, if it is not.
fn check_http_url(url: &str) -> Result<(), &'static str> {
    let parsed = reqwest::Url::parse(url).map_err(|_| "expected http://host:port or unix:/path")?;
    match parsed.scheme() {
        "http" => {}
        // Built without TLS on purpose (execd sits on a private network or behind a tunnel);
        // saying so beats a confusing error on the first call.
        "https" => {
            return Err(
                "https is not supported; use http:// on a private network or an SSH tunnel",
            );
        }
        _ => return Err("expected http://host:port"),
    }
    if parsed.host_str().is_none() || parsed.query().is_some() {
        return Err("expected http://host:port");
    }
    Ok(())
}

/// `reqwest`'s top-level message hides the cause (`error sending request`); the chain names it
/// (`connection refused`).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn execd_urls_must_be_plain_http() {
        let cases = [
            ("http://10.0.0.5:44772", Ok("http://10.0.0.5:44772")),
            ("http://127.0.0.1:1/", Ok("http://127.0.0.1:1")),
            ("http://sandbox/prefix/", Ok("http://sandbox/prefix")),
            (
                "10.0.0.5:44772",
                Err("invalid execd URL \"10.0.0.5:44772\""),
            ),
            ("https://sandbox:44772", Err("https is not supported")),
            ("ftp://sandbox", Err("expected http://host:port")),
            ("http://sandbox?x=1", Err("expected http://host:port")),
            (
                "unix:/run/hands/execd.sock",
                Ok("unix:/run/hands/execd.sock"),
            ),
            ("unix:", Err("expected unix:/path")),
        ];
        for (url, expected) in cases {
            match (ExecdClient::new(url, None), expected) {
                (Ok(client), Ok(base_url)) => assert_eq!(client.base_url(), base_url),
                (Err(error), Err(needle)) => {
                    assert!(error.to_string().contains(needle), "{url}: {error}")
                }
                (Ok(_), Err(needle)) => panic!("{url} accepted, expected {needle:?}"),
                (Err(error), Ok(_)) => panic!("{url} rejected: {error}"),
            }
        }
    }

    #[test]
    fn the_token_is_never_printed() {
        let client =
            ExecdClient::new("http://127.0.0.1:1", Some("secret-token".into())).expect("valid URL");
        assert!(!format!("{client:?}").contains("secret-token"));
    }
}
