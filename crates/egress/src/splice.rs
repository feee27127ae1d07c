//! A tunnel's bytes moved by splice(2): from one socket into a pipe, from the pipe into the
//! other, each direction on its own 1 MiB pipe, so the bytes never enter this process and large
//! transfers cost few system calls. A direction that reads the end shuts down the other side's
//! writing (dropping its write half), as a TCP proxy must for half-closed connections.

use std::io;
use std::os::fd::AsFd;

use rustix::pipe::{PipeFlags, SpliceFlags};
use tokio::io::Interest;
use tokio::net::{TcpStream, UnixStream};

/// How much a pipe holds (and one splice moves); the kernel may give less.
const PIPE_BYTES: usize = 1 << 20;

/// The readiness a direction needs of a socket: `UnixStream` and `TcpStream` alike.
trait Socket: AsFd {
    async fn wait(&self, interest: Interest) -> io::Result<()>;
    fn attempt<R>(&self, interest: Interest, f: impl FnOnce() -> io::Result<R>) -> io::Result<R>;
}

impl Socket for UnixStream {
    async fn wait(&self, interest: Interest) -> io::Result<()> {
        self.ready(interest).await.map(drop)
    }
    fn attempt<R>(&self, interest: Interest, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        self.try_io(interest, f)
    }
}

impl Socket for TcpStream {
    async fn wait(&self, interest: Interest) -> io::Result<()> {
        self.ready(interest).await.map(drop)
    }
    fn attempt<R>(&self, interest: Interest, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        self.try_io(interest, f)
    }
}

/// Carries bytes both ways until both directions end: `(client to upstream, upstream to
/// client)`, as far as each got.
pub async fn tunnel(client: UnixStream, upstream: TcpStream) -> (u64, u64) {
    // A Unix socket's default send buffer (about 200 KiB) would split each pipeful into many
    // wake-ups of the reader.
    let _ = rustix::net::sockopt::set_socket_send_buffer_size(&client, PIPE_BYTES);
    let (client_read, client_write) = client.into_split();
    let (upstream_read, upstream_write) = upstream.into_split();
    let up = async move {
        let moved = one_way(client_read.as_ref(), upstream_write.as_ref()).await;
        drop(upstream_write);
        moved
    };
    let down = async move {
        let moved = one_way(upstream_read.as_ref(), client_write.as_ref()).await;
        drop(client_write);
        moved
    };
    tokio::join!(up, down)
}

/// Splices `from` into `to` until `from` ends or either fails; the bytes moved.
async fn one_way(from: &impl Socket, to: &impl Socket) -> u64 {
    let Ok((pipe_out, pipe_in)) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)
    else {
        return 0;
    };
    // A smaller pipe (the limit of an unprivileged process) only means more calls.
    let _ = rustix::pipe::fcntl_setpipe_size(&pipe_in, PIPE_BYTES);
    let mut moved = 0;
    loop {
        let filled = retry(from, Interest::READABLE, || {
            splice(from, &pipe_in, PIPE_BYTES)
        })
        .await;
        let mut left = match filled {
            Ok(0) | Err(_) => return moved,
            Ok(n) => n,
        };
        // The pipe is emptied before it is filled again, so a would-block here is the socket's.
        while left > 0 {
            match retry(to, Interest::WRITABLE, || splice(&pipe_out, to, left)).await {
                Ok(0) | Err(_) => return moved,
                Ok(n) => {
                    left -= n;
                    moved += n as u64;
                }
            }
        }
    }
}

fn splice(from: impl AsFd, to: impl AsFd, len: usize) -> io::Result<usize> {
    let flags = SpliceFlags::NONBLOCK | SpliceFlags::MOVE;
    rustix::pipe::splice(from, None, to, None, len, flags).map_err(io::Error::from)
}

/// `f` once `socket` is ready for `interest`, again whenever it would block.
async fn retry<S: Socket>(
    socket: &S,
    interest: Interest,
    mut f: impl FnMut() -> io::Result<usize>,
) -> io::Result<usize> {
    loop {
        socket.wait(interest).await?;
        match socket.attempt(interest, &mut f) {
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
            done => return done,
        }
    }
}
