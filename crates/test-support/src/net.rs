//! Raw TCP for tests that send what no client library would: connecting within [`WAIT`] and
//! reading until the server closes the connection.

use tokio::io::AsyncReadExt as _;
use tokio::net::TcpStream;

use crate::WAIT;

/// Connects to `addr` (`host:port`); panics if that fails or takes longer than [`WAIT`].
pub async fn connect(addr: &str) -> TcpStream {
    crate::within(&format!("a connection to {addr}"), TcpStream::connect(addr))
        .await
        .unwrap_or_else(|e| panic!("connects to {addr}: {e}"))
}

/// Reads until the server closes the connection (or it fails) and returns what was received,
/// as text; panics naming `what` if it is still open after [`WAIT`].
pub async fn read_until_closed(stream: &mut TcpStream, what: &str) -> String {
    let mut received = Vec::new();
    let mut chunk = [0u8; 4096];
    let closed = crate::try_within(what, async {
        while let Ok(n @ 1..) = stream.read(&mut chunk).await {
            received.extend_from_slice(&chunk[..n]);
        }
    })
    .await;
    assert!(closed.is_ok(), "{what}: not closed within {WAIT:?}");
    String::from_utf8_lossy(&received).into_owned()
}
