//! The exec tools over MCP streamable HTTP, as a tower service that execd mounts at `/mcp`
//! behind its access-token layer.
//!
//! This module does not listen or authenticate: the router it is nested in does both. It
//! decides which `Host` headers rmcp accepts (its DNS-rebinding defence), ties the MCP sessions'
//! lifetime to a cancellation token, so the daemon's graceful shutdown does not wait forever on
//! open SSE streams, and gives rmcp's plain-text HTTP errors (406, 415, unknown session...)
//! Warren's `{"code","message"}` body. JSON-RPC error responses are MCP's own protocol and pass
//! through unchanged.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;
use warren_exec::Engine;
use warren_protocol::error::ErrorBody;

use crate::backend::ExecBackend;
use crate::tools::ExecTools;

type RmcpService = StreamableHttpService<ExecTools, LocalSessionManager>;
type McpResponse = Response<BoxBody<Bytes, Infallible>>;

/// The tower service to mount at `/mcp` (`Router::nest_service` or `route_service`).
#[derive(Clone)]
pub struct McpHttpService {
    rmcp: Arc<RmcpService>,
}

/// Which `Host` headers `/mcp` accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedHosts {
    /// Any host. Right when an access token guards the route: a DNS-rebinding page cannot know
    /// the token.
    Any,
    /// Only these hosts (`name` or `name:port`). Loopback names are always added.
    Only(Vec<String>),
}

/// The MCP streamable-HTTP service for `engine`. Cancelling `shutdown` ends every MCP session
/// and open stream.
pub fn streamable_http_service(
    engine: Arc<Engine>,
    allowed_hosts: AllowedHosts,
    shutdown: CancellationToken,
) -> McpHttpService {
    let tools = ExecTools::new(ExecBackend::Local(engine));
    let config = StreamableHttpServerConfig::default().with_cancellation_token(shutdown);
    let config = match allowed_hosts {
        AllowedHosts::Any => config.disable_allowed_hosts(),
        AllowedHosts::Only(hosts) => {
            let loopback = ["localhost", "127.0.0.1", "::1"].map(String::from);
            config.with_allowed_hosts(loopback.into_iter().chain(hosts))
        }
    };
    McpHttpService {
        rmcp: Arc::new(StreamableHttpService::new(
            move || Ok(tools.clone()),
            Arc::default(),
            config,
        )),
    }
}

impl<B> tower::Service<Request<B>> for McpHttpService
where
    B: http_body::Body + Send + 'static,
    B::Error: std::fmt::Display,
{
    type Response = McpResponse;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<McpResponse, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let rmcp = self.rmcp.clone();
        Box::pin(async move {
            let response = rmcp.handle(request).await;
            Ok(with_error_shape(response).await)
        })
    }
}

/// An rmcp error answered in plain text becomes `{"code","message"}` with the same status and
/// headers; every other response is returned as it is.
async fn with_error_shape(response: McpResponse) -> McpResponse {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) || is_json(&response) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    // rmcp's error bodies are short texts built in memory; the error type is `Infallible`.
    let text = match body.collect().await {
        Ok(collected) => String::from_utf8_lossy(&collected.to_bytes()).into_owned(),
        Err(never) => match never {},
    };
    let code = code_for(status);
    let message = if status.is_server_error() {
        tracing::error!(%status, detail = %text, "MCP request failed");
        "internal error".to_owned()
    } else {
        text
    };
    let json = serde_json::to_vec(&ErrorBody::new(code, message))
        .expect("an error body always serializes to JSON");
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, Full::new(Bytes::from(json)).boxed())
}

fn is_json(response: &McpResponse) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            let essence = v.split(';').next().unwrap_or_default().trim();
            essence.eq_ignore_ascii_case("application/json")
        })
}

/// The `code` for each status rmcp answers with in plain text.
fn code_for(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST => "INVALID_REQUEST",
        StatusCode::FORBIDDEN => "HOST_NOT_ALLOWED",
        StatusCode::NOT_FOUND => "SESSION_NOT_FOUND",
        StatusCode::METHOD_NOT_ALLOWED => "METHOD_NOT_ALLOWED",
        StatusCode::NOT_ACCEPTABLE => "NOT_ACCEPTABLE",
        StatusCode::PAYLOAD_TOO_LARGE => "BODY_TOO_LARGE",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "UNSUPPORTED_MEDIA_TYPE",
        status if status.is_server_error() => "RUNTIME_ERROR",
        _ => "INVALID_REQUEST",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(status: StatusCode, text: &'static str) -> McpResponse {
        Response::builder()
            .status(status)
            .header(header::ALLOW, "GET, POST, DELETE")
            .body(Full::new(Bytes::from(text)).boxed())
            .expect("valid response")
    }

    async fn body_of(response: McpResponse) -> String {
        let bytes = response
            .into_body()
            .collect()
            .await
            .unwrap_or_else(|never| match never {})
            .to_bytes();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    #[tokio::test]
    async fn plain_text_errors_get_the_error_shape_and_keep_status_and_headers() {
        let cases = [
            (
                StatusCode::NOT_ACCEPTABLE,
                "Not Acceptable: x",
                "NOT_ACCEPTABLE",
                "Not Acceptable: x",
            ),
            (
                StatusCode::NOT_FOUND,
                "Not Found: Session not found",
                "SESSION_NOT_FOUND",
                "Not Found: Session not found",
            ),
            (
                StatusCode::METHOD_NOT_ALLOWED,
                "Method Not Allowed",
                "METHOD_NOT_ALLOWED",
                "Method Not Allowed",
            ),
            (
                StatusCode::FORBIDDEN,
                "Forbidden: Host",
                "HOST_NOT_ALLOWED",
                "Forbidden: Host",
            ),
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "create session: io error /tmp/x",
                "RUNTIME_ERROR",
                "internal error",
            ),
        ];
        for (status, text, code, message) in cases {
            let response = with_error_shape(plain(status, text)).await;
            assert_eq!(response.status(), status);
            assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
            assert_eq!(response.headers()[header::ALLOW], "GET, POST, DELETE");
            let body: serde_json::Value =
                serde_json::from_str(&body_of(response).await).expect("JSON body");
            assert_eq!(body, serde_json::json!({"code": code, "message": message}));
        }
    }

    #[tokio::test]
    async fn json_rpc_errors_and_successes_pass_through() {
        let rpc_error = Response::builder()
            .status(StatusCode::BAD_REQUEST)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(r#"{"jsonrpc":"2.0","error":{}}"#)).boxed())
            .expect("valid response");
        let response = with_error_shape(rpc_error).await;
        assert_eq!(body_of(response).await, r#"{"jsonrpc":"2.0","error":{}}"#);
        let ok = with_error_shape(plain(StatusCode::OK, "fine")).await;
        assert_eq!(body_of(ok).await, "fine");
    }
}
