//! The exec tools over MCP streamable HTTP, as a tower service that execd mounts at `/mcp`
//! behind its access-token layer.
//!
//! This module does not listen or authenticate: the router it is nested in does both. It only
//! decides which `Host` headers rmcp accepts (its DNS-rebinding defence) and ties the MCP
//! sessions' lifetime to a cancellation token, so the daemon's graceful shutdown does not wait
//! forever on open SSE streams.

use std::sync::Arc;

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;
use warren_exec::Engine;

use crate::backend::ExecBackend;
use crate::tools::ExecTools;

/// The tower service to mount at `/mcp` (`Router::nest_service` or `route_service`).
pub type McpHttpService = StreamableHttpService<ExecTools, LocalSessionManager>;

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
    StreamableHttpService::new(move || Ok(tools.clone()), Arc::default(), config)
}
