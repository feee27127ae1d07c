//! The PTY session routes (`/pty`, pty-sessions.md): create, delete, and the session's
//! WebSocket, over the same TCP or Unix socket as the other routes, and the list of agent
//! terminals (`/v1/agent-terminals`), the engine's commands served with the same protocol. The
//! gateway runs agents in the hands on pipe-mode sessions and proxies the person's terminals
//! (shells and agent terminals alike) through them.

use std::path::PathBuf;

use tokio::net::{TcpStream, UnixStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_util::either::Either;
use warren_protocol::hands::HANDS_NONCE_HEADER;
use warren_protocol::pty::{CreatePtyRequest, CreatePtyResponse, PtyStatus};
use warren_protocol::terminal::AgentTerminalList;

use crate::{ACCESS_TOKEN_HEADER, ClientError, ExecdClient};

/// A PTY session's WebSocket, over TCP or the execd's Unix socket.
pub type PtySocket = WebSocketStream<Either<UnixStream, TcpStream>>;

impl ExecdClient {
    /// `POST /pty`: a session whose shell starts at the first holder attach.
    pub async fn create_pty(
        &self,
        request: &CreatePtyRequest,
    ) -> Result<CreatePtyResponse, ClientError> {
        let request = self.request(reqwest::Method::POST, "/pty").json(request);
        self.send(request).await
    }

    /// `GET /pty/{id}`: whether its shell runs and how much output it ever produced.
    pub async fn pty_status(&self, id: &str) -> Result<PtyStatus, ClientError> {
        let request = self.request(reqwest::Method::GET, &format!("/pty/{id}"));
        self.send(request).await
    }

    /// `DELETE /pty/{id}`: every process the session started is killed.
    pub async fn delete_pty(&self, id: &str) -> Result<(), ClientError> {
        let request = self.request(reqwest::Method::DELETE, &format!("/pty/{id}"));
        self.send_empty(request).await
    }

    /// `GET /v1/agent-terminals`: the agent's commands a person can watch, oldest first.
    pub async fn agent_terminals(&self) -> Result<AgentTerminalList, ClientError> {
        let request = self.request(reqwest::Method::GET, "/v1/agent-terminals");
        self.send(request).await
    }

    /// `GET /pty/{id}/ws?{query}` as a WebSocket (`query` as pty-sessions.md names it, e.g.
    /// `pty=0` or `mode=viewer&since=12`). A refused handshake is [`ClientError::Api`] with
    /// execd's status (the code is `HANDSHAKE_REFUSED`: the body is not read).
    pub async fn connect_pty(&self, id: &str, query: &str) -> Result<PtySocket, ClientError> {
        let path = format!("/pty/{id}/ws?{query}");
        let (stream, url) = match self.socket_path() {
            Some(socket) => {
                let stream = UnixStream::connect(&socket)
                    .await
                    .map_err(|e| self.unreachable(&e))?;
                (Either::Left(stream), format!("ws://hands{path}"))
            }
            None => {
                let base =
                    reqwest::Url::parse(self.base_url()).map_err(|e| self.unreachable(&e))?;
                let host = base.host_str().unwrap_or("127.0.0.1");
                let port = base.port_or_known_default().unwrap_or(80);
                let stream = TcpStream::connect((host, port))
                    .await
                    .map_err(|e| self.unreachable(&e))?;
                let prefix = base.path().trim_end_matches('/');
                (
                    Either::Right(stream),
                    format!("ws://{host}:{port}{prefix}{path}"),
                )
            }
        };
        let mut request = url
            .into_client_request()
            .map_err(|e| self.unreachable(&e))?;
        let headers = request.headers_mut();
        let mut set = |name: &'static str, value: &str| -> Result<(), ClientError> {
            let value = value.parse().map_err(|_| ClientError::InvalidUrl {
                url: self.base_url().to_owned(),
                reason: format!("{name} is not a valid header value"),
            })?;
            headers.insert(name, value);
            Ok(())
        };
        if let Some(token) = &self.access_token {
            set(ACCESS_TOKEN_HEADER, token)?;
        }
        if let Some(nonce) = &self.hands_nonce {
            set(HANDS_NONCE_HEADER, nonce)?;
        }
        match tokio_tungstenite::client_async(request, stream).await {
            Ok((socket, _response)) => Ok(socket),
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => Err(ClientError::Api {
                status: response.status(),
                code: "HANDSHAKE_REFUSED".to_owned(),
                message: format!("execd refused the WebSocket for pty session {id}"),
            }),
            Err(e) => Err(self.unreachable(&e)),
        }
    }

    fn socket_path(&self) -> Option<PathBuf> {
        self.base_url().strip_prefix("unix:").map(PathBuf::from)
    }
}
