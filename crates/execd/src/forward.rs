//! `--forward 127.0.0.1:PORT=unix:/path`: a TCP port of the sandbox that leads to a Unix
//! socket outside it. With `--hands-network none` a sandbox has loopback only; the gateway's
//! model proxy listens on a socket in the run directory and the agent reaches it at this port
//! (agents.md). Bytes are copied both ways unchanged; each connection gets its own socket
//! connection, and ends when either side does.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use tokio::net::{TcpListener, UnixStream};

/// One `--forward LISTEN=unix:PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    pub listen: SocketAddr,
    pub socket: PathBuf,
}

impl FromStr for Forward {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let usage = || {
            format!(
                "{text:?} is not ADDR=unix:/path (e.g. 127.0.0.1:4180=unix:/run/warren/model.sock)"
            )
        };
        let (listen, target) = text.split_once('=').ok_or_else(usage)?;
        let listen: SocketAddr = listen.parse().map_err(|_| usage())?;
        let socket = target
            .strip_prefix("unix:")
            .filter(|p| p.starts_with('/'))
            .ok_or_else(usage)?;
        Ok(Forward {
            listen,
            socket: PathBuf::from(socket),
        })
    }
}

/// Binds the port and forwards every connection until the daemon ends.
pub async fn start(forward: Forward) -> std::io::Result<()> {
    let listener = TcpListener::bind(forward.listen).await?;
    tokio::spawn(async move {
        loop {
            let Ok((mut tcp, _)) = listener.accept().await else {
                continue;
            };
            let socket = forward.socket.clone();
            tokio::spawn(async move {
                match UnixStream::connect(&socket).await {
                    Ok(mut unix) => {
                        let _ = tokio::io::copy_bidirectional(&mut tcp, &mut unix).await;
                    }
                    Err(e) => {
                        tracing::debug!(socket = %socket.display(), error = %e, "forward target unreachable")
                    }
                }
            });
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forward_is_an_address_and_an_absolute_socket_path() {
        let forward: Forward = "127.0.0.1:4180=unix:/run/warren/model.sock"
            .parse()
            .expect("parses");
        assert_eq!(forward.listen, "127.0.0.1:4180".parse().expect("addr"));
        assert_eq!(forward.socket, PathBuf::from("/run/warren/model.sock"));
        for bad in [
            "127.0.0.1:4180",
            "x=unix:/s",
            "127.0.0.1:1=/s",
            "127.0.0.1:1=unix:rel",
        ] {
            assert!(bad.parse::<Forward>().is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn bytes_cross_both_ways() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("s.sock");
        let unix = tokio::net::UnixListener::bind(&socket).expect("binds");
        let port = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("probe");
            probe.local_addr().expect("addr").port()
        };
        let listen: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        start(Forward { listen, socket }).await.expect("starts");
        let echo = tokio::spawn(async move {
            let (mut stream, _) = unix.accept().await.expect("accepts");
            let mut buffer = [0u8; 5];
            stream.read_exact(&mut buffer).await.expect("reads");
            stream.write_all(&buffer).await.expect("echoes");
        });
        let mut tcp = tokio::net::TcpStream::connect(listen)
            .await
            .expect("connects");
        tcp.write_all(b"hello").await.expect("writes");
        let mut back = [0u8; 5];
        tcp.read_exact(&mut back).await.expect("reads back");
        assert_eq!(&back, b"hello");
        echo.await.expect("echo task");
    }
}
