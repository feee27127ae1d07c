//! Where the exec tools run: an in-process [`Engine`] (this machine is the sandbox) or a remote
//! `warren execd` reached over its `/v1/exec` HTTP API (the sandbox is elsewhere).
//!
//! Both answer the four calls with the same protocol types, and both report failures as
//! [`BackendError`], so the MCP layer above does not know which one it talks to. This module
//! does no rendering and knows nothing about MCP.

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use warren_exec::Engine;
use warren_protocol::error::ErrorBody;
use warren_protocol::exec::{
    ExecCommandArgs, ExecResult, SessionId, SessionList, WriteStdinArgs, WriteStdinBody,
};

/// The header execd checks its access token in.
pub const ACCESS_TOKEN_HEADER: &str = "X-EXECD-ACCESS-TOKEN";

/// Why a call failed. Messages are written for the model that made the call.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The session id is not (or no longer) known: it never existed, or its exit was already
    /// reported.
    #[error("Unknown process id {0}")]
    UnknownSession(SessionId),
    /// The request itself was wrong (bad workdir, invalid arguments): the message says how.
    #[error("{0}")]
    Rejected(String),
    /// The command could not be started or the engine failed; the message says why.
    #[error("{0}")]
    Failed(String),
    /// The remote execd could not be reached or answered something unreadable.
    #[error("execd at {url} unreachable: {detail}")]
    Unreachable { url: String, detail: String },
    /// `--execd` is not an `http://host:port` URL.
    #[error("invalid execd URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    /// The remote execd refused the access token.
    #[error("execd at {url} rejected the access token (set --token or WARREN_EXECD_TOKEN)")]
    Unauthorized { url: String },
}

/// The engine the tools drive.
#[derive(Clone)]
pub enum ExecBackend {
    /// Commands run on this machine, in this process's engine.
    Local(Arc<Engine>),
    /// Commands run on a remote `warren execd`.
    Remote(RemoteExecd),
}

impl ExecBackend {
    pub async fn exec_command(&self, args: ExecCommandArgs) -> Result<ExecResult, BackendError> {
        match self {
            Self::Local(engine) => engine.exec_command(args).await.map_err(local_error),
            Self::Remote(remote) => remote.exec_command(&args).await,
        }
    }

    pub async fn write_stdin(&self, args: WriteStdinArgs) -> Result<ExecResult, BackendError> {
        match self {
            Self::Local(engine) => engine.write_stdin(args).await.map_err(local_error),
            Self::Remote(remote) => remote.write_stdin(args).await,
        }
    }

    pub async fn list_sessions(&self) -> Result<SessionList, BackendError> {
        match self {
            Self::Local(engine) => Ok(engine.list_sessions().await),
            Self::Remote(remote) => remote.list_sessions().await,
        }
    }

    pub async fn kill_session(&self, session_id: SessionId) -> Result<ExecResult, BackendError> {
        match self {
            Self::Local(engine) => engine.kill_session(session_id).await.map_err(local_error),
            Self::Remote(remote) => remote.kill_session(session_id).await,
        }
    }
}

/// The one place engine errors become backend errors.
fn local_error(error: warren_exec::ExecError) -> BackendError {
    use warren_exec::ExecError;
    match error {
        ExecError::UnknownSession(session_id) => BackendError::UnknownSession(session_id),
        ExecError::InvalidArgument(_) | ExecError::InvalidWorkdir { .. } => {
            BackendError::Rejected(error.to_string())
        }
        ExecError::TooManySessions(_) | ExecError::UnknownTerminal(_) => {
            BackendError::Rejected(error.to_string())
        }
        ExecError::Spawn { .. } | ExecError::ShuttingDown => {
            BackendError::Failed(error.to_string())
        }
    }
}

/// A client of a remote execd's `/v1/exec` routes.
#[derive(Clone)]
pub struct RemoteExecd {
    http: reqwest::Client,
    /// The execd base URL without a trailing slash, e.g. `http://10.0.0.5:44772`.
    base_url: String,
    access_token: Option<String>,
}

impl RemoteExecd {
    /// A client for the execd at `base_url` (`http://host:port`, optionally with a path prefix).
    pub fn new(base_url: &str, access_token: Option<String>) -> Result<Self, BackendError> {
        let invalid = |reason: &str| BackendError::InvalidUrl {
            url: base_url.to_owned(),
            reason: reason.to_owned(),
        };
        let parsed = reqwest::Url::parse(base_url).map_err(|e| invalid(&e.to_string()))?;
        match parsed.scheme() {
            "http" => {}
            // Built without TLS on purpose (execd sits on a private network or behind a tunnel);
            // saying so beats a confusing error on the first call.
            "https" => {
                return Err(invalid(
                    "https is not supported; use http:// on a private network or an SSH tunnel",
                ));
            }
            _ => return Err(invalid("expected http://host:port")),
        }
        if parsed.host_str().is_none() || parsed.query().is_some() {
            return Err(invalid("expected http://host:port"));
        }
        let base_url = base_url.trim_end_matches('/').to_owned();
        // No call legitimately takes longer than the longest poll (300 s) plus the kill grace
        // and drain; past that the execd is stuck and the agent should hear about it.
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(360))
            .build()
            .map_err(|e| BackendError::Unreachable {
                url: base_url.clone(),
                detail: e.to_string(),
            })?;
        Ok(Self {
            http,
            base_url,
            access_token,
        })
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    async fn exec_command(&self, args: &ExecCommandArgs) -> Result<ExecResult, BackendError> {
        let request = self.request(reqwest::Method::POST, "/v1/exec").json(args);
        self.send(request, None).await
    }

    async fn write_stdin(&self, args: WriteStdinArgs) -> Result<ExecResult, BackendError> {
        let session_id = args.session_id;
        let body = WriteStdinBody {
            chars: args.chars,
            yield_time_ms: args.yield_time_ms,
            max_output_tokens: args.max_output_tokens,
        };
        let path = format!("/v1/exec/{session_id}/stdin");
        let request = self.request(reqwest::Method::POST, &path).json(&body);
        self.send(request, Some(session_id)).await
    }

    async fn list_sessions(&self) -> Result<SessionList, BackendError> {
        let request = self.request(reqwest::Method::GET, "/v1/exec");
        self.send(request, None).await
    }

    async fn kill_session(&self, session_id: SessionId) -> Result<ExecResult, BackendError> {
        let path = format!("/v1/exec/{session_id}");
        let request = self.request(reqwest::Method::DELETE, &path);
        self.send(request, Some(session_id)).await
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self
            .http
            .request(method, format!("{}{path}", self.base_url));
        match &self.access_token {
            Some(token) => request.header(ACCESS_TOKEN_HEADER, token),
            None => request,
        }
    }

    /// Sends `request` and decodes a 200 body as `T`, or maps the error answer. `session_id`
    /// names the session a 404 is about.
    async fn send<T: serde::de::DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
        session_id: Option<SessionId>,
    ) -> Result<T, BackendError> {
        let unreachable = |detail: String| BackendError::Unreachable {
            url: self.base_url.clone(),
            detail,
        };
        let response = request
            .send()
            .await
            .map_err(|e| unreachable(error_chain(&e)))?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|e| unreachable(error_chain(&e)))?;
        if status.is_success() {
            return serde_json::from_slice(&body)
                .map_err(|e| unreachable(format!("unreadable {status} answer: {e}")));
        }
        if status == StatusCode::UNAUTHORIZED {
            return Err(BackendError::Unauthorized {
                url: self.base_url.clone(),
            });
        }
        let Ok(error) = serde_json::from_slice::<ErrorBody>(&body) else {
            let text = String::from_utf8_lossy(&body);
            return Err(unreachable(format!("answered {status}: {}", text.trim())));
        };
        Err(match (status, session_id) {
            (StatusCode::NOT_FOUND, Some(session_id)) if error.code == "SESSION_NOT_FOUND" => {
                BackendError::UnknownSession(session_id)
            }
            (status, _) if status.is_client_error() => BackendError::Rejected(error.message),
            _ => BackendError::Failed(error.message),
        })
    }
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
        ];
        for (url, expected) in cases {
            match (RemoteExecd::new(url, None), expected) {
                (Ok(remote), Ok(base_url)) => assert_eq!(remote.base_url(), base_url),
                (Err(error), Err(needle)) => {
                    assert!(error.to_string().contains(needle), "{url}: {error}")
                }
                (Ok(_), Err(needle)) => panic!("{url} accepted, expected {needle:?}"),
                (Err(error), Ok(_)) => panic!("{url} rejected: {error}"),
            }
        }
    }
}
