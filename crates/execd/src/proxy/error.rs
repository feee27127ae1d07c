//! What the proxy routes fail with, before any status exists (`crate::error` picks them): a
//! leaf that names nothing else of execd.

/// Why a proxied request failed.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("{0:?} is not a port (1 to 65535)")]
    InvalidPort(String),
    /// Nothing answers at the port (refused, reset, or not HTTP).
    #[error("nothing answers at 127.0.0.1:{port}: {detail}")]
    Unreachable { port: u16, detail: String },
}
