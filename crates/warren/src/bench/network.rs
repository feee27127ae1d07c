//! `warren bench network`: what the hands' egress proxy (network.md, `warren-egress`) costs
//! over going to the upstream directly. Serves one `Egress` in this process on a Unix socket
//! (as the gateway does per session), with an exact allow rule for a local upstream on
//! 127.0.0.1 that answers `GET /blob` with 64 MiB and `GET /small` with 16 bytes, over keep-alive
//! HTTP/1.1. Measured in one run, interleaved: a 64 MiB download through a `CONNECT` tunnel
//! against the same download direct (7 back-to-back pairs: the best of each and the median ratio); the round trip of a small request on a
//! kept tunnel against a kept direct connection (p50 added); `CONNECT` set-up (Unix connect to
//! `200`); and this process's resident memory with 200 tunnels open. The hop inside the sandbox
//! (execd's `--forward` from 127.0.0.1:3128 to the socket) is not part of it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use warren_egress::{Answer, AnswerFuture, Egress, Limits, Mode, Observer, Policy};

use super::support::{Row, ms, percentile, print_table, rss_kib};

const BLOB_BYTES: usize = 64 * 1024 * 1024;
const N_BEST_OF: usize = 7;
const N_ROUND_TRIPS: usize = 2000;
const N_CONNECTS: usize = 500;
const N_TUNNELS: usize = 200;
const SMALL_BODY: &[u8] = b"0123456789abcdef";

/// An observer that lets everything pass it is asked about and records nothing.
struct Quiet;

impl Observer for Quiet {
    fn ask(&self, _host: &str, _port: u16) -> AnswerFuture {
        Box::pin(async { Answer::AllowOnce })
    }
    fn decided(&self, _host: &str, _port: u16, _allowed: bool, _rule: &str) {}
    fn closed(&self, _host: &str, _port: u16, _bytes_up: u64, _bytes_down: u64) {}
}

pub async fn run() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("warren-bench-network-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let upstream = start_upstream().await?;
    let socket = dir.join("egress.sock");
    let mut policy = Policy::new(Mode::None);
    policy.allow.push(format!("127.0.0.1:{upstream}").parse()?);
    let limits = Limits {
        max_connections: 4 * N_TUNNELS,
        ..Limits::default()
    };
    let egress = Egress::new(policy, Arc::new(Quiet), limits, String::new());
    let listener = tokio::net::UnixListener::bind(&socket)?;
    let server = tokio::spawn(egress.serve(listener));
    let result = bench(&socket, upstream).await;
    server.abort();
    let _ = std::fs::remove_dir_all(&dir);
    let rows = result?;
    print_table(&rows);
    Ok(())
}

async fn bench(socket: &std::path::Path, port: u16) -> anyhow::Result<Vec<Row>> {
    let target = format!("127.0.0.1:{port}");
    let mut rows = Vec::new();

    // Throughput: a 64 MiB download, N times each, interleaved in pairs.
    let (mut best_direct, mut best_proxied) = (Duration::MAX, Duration::MAX);
    let mut ratios = Vec::with_capacity(N_BEST_OF);
    for _ in 0..N_BEST_OF {
        let mut direct = TcpStream::connect(&target).await?;
        let direct_took = download(&mut direct).await?;
        let mut tunnel = connect_tunnel(socket, &target).await?;
        let proxied_took = download(&mut tunnel).await?;
        best_direct = best_direct.min(direct_took);
        best_proxied = best_proxied.min(proxied_took);
        ratios.push(direct_took.as_secs_f64() / proxied_took.as_secs_f64());
    }
    ratios.sort_by(f64::total_cmp);
    let median_ratio = ratios[ratios.len() / 2];
    let mib = BLOB_BYTES as f64 / (1024.0 * 1024.0);
    let rate = |took: Duration| mib / took.as_secs_f64();
    rows.push(Row {
        measurement: format!("64 MiB download, direct (best of {N_BEST_OF})"),
        result: format!("{:.0} MiB/s", rate(best_direct)),
        target: "",
    });
    rows.push(Row {
        measurement: format!(
            "64 MiB download through the proxy, CONNECT tunnel (best of {N_BEST_OF})"
        ),
        result: format!(
            "{:.0} MiB/s ({:.2}× the best direct)",
            rate(best_proxied),
            best_direct.as_secs_f64() / best_proxied.as_secs_f64()
        ),
        target: "≥ 0.8× direct",
    });
    rows.push(Row {
        measurement: format!("proxied / direct, median of {N_BEST_OF} back-to-back pairs"),
        result: format!("{median_ratio:.2}×"),
        target: "≥ 0.8×",
    });

    // Latency: small requests on a kept connection, interleaved.
    let mut direct = TcpStream::connect(&target).await?;
    direct.set_nodelay(true)?;
    let mut tunnel = connect_tunnel(socket, &target).await?;
    let (mut direct_times, mut proxied_times) = (Vec::new(), Vec::new());
    for _ in 0..N_ROUND_TRIPS {
        direct_times.push(small_round_trip(&mut direct).await?);
        proxied_times.push(small_round_trip(&mut tunnel).await?);
    }
    direct_times.sort();
    proxied_times.sort();
    let (direct_p50, proxied_p50) = (
        percentile(&direct_times, 0.5),
        percentile(&proxied_times, 0.5),
    );
    rows.push(Row {
        measurement: format!(
            "small request on a kept connection, p50 ({N_ROUND_TRIPS}): direct / proxied"
        ),
        result: format!("{} / {}", ms(direct_p50), ms(proxied_p50)),
        target: "",
    });
    rows.push(Row {
        measurement: "latency the proxy adds, p50".into(),
        result: ms(proxied_p50.saturating_sub(direct_p50)),
        target: "< 1 ms",
    });

    // CONNECT set-up: from the Unix connect to the proxy's 200.
    let mut setups = Vec::with_capacity(N_CONNECTS);
    for _ in 0..N_CONNECTS {
        let started = Instant::now();
        let tunnel = connect_tunnel(socket, &target).await?;
        setups.push(started.elapsed());
        drop(tunnel);
    }
    setups.sort();
    rows.push(Row {
        measurement: format!("CONNECT set-up p50 / p99 ({N_CONNECTS})"),
        result: format!(
            "{} / {}",
            ms(percentile(&setups, 0.5)),
            ms(percentile(&setups, 0.99))
        ),
        target: "p50 < 2 ms",
    });

    // Memory: this process (proxy, upstream and clients) with 200 tunnels open, each having
    // carried one request.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = rss_kib(std::process::id())?;
    let mut open = Vec::with_capacity(N_TUNNELS);
    for _ in 0..N_TUNNELS {
        let mut tunnel = connect_tunnel(socket, &target).await?;
        small_round_trip(&mut tunnel).await?;
        open.push(tunnel);
    }
    let after = rss_kib(std::process::id())?;
    rows.push(Row {
        measurement: format!("resident memory with {N_TUNNELS} open tunnels (whole process)"),
        result: format!(
            "+{} KiB ({:.1} KiB a tunnel, both ends and the upstream's side)",
            after.saturating_sub(before),
            after.saturating_sub(before) as f64 / N_TUNNELS as f64
        ),
        target: "reported",
    });
    drop(open);
    Ok(rows)
}

/// A `CONNECT` tunnel to `target` through the proxy at `socket`, ready to carry bytes.
async fn connect_tunnel(socket: &std::path::Path, target: &str) -> anyhow::Result<UnixStream> {
    let mut stream = UnixStream::connect(socket).await?;
    stream
        .write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await?;
    let head = read_head(&mut stream).await?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("the proxy refused the tunnel: {head:?}");
    }
    Ok(stream)
}

/// Reads an HTTP head (to the blank line) byte by byte, so nothing after it is consumed.
async fn read_head(stream: &mut (impl AsyncRead + Unpin)) -> anyhow::Result<String> {
    let mut head = Vec::with_capacity(256);
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await? == 0 {
            bail!("the connection closed inside a head");
        }
        head.push(byte[0]);
        if head.len() > 16 * 1024 {
            bail!("a head over 16 KiB");
        }
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

fn content_length(head: &str) -> anyhow::Result<usize> {
    head.lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .context("no content-length")
}

/// `GET /blob` and the whole body; how long it took.
async fn download(stream: &mut (impl AsyncRead + AsyncWrite + Unpin)) -> anyhow::Result<Duration> {
    let started = Instant::now();
    stream
        .write_all(b"GET /blob HTTP/1.1\r\nHost: upstream\r\n\r\n")
        .await?;
    let head = read_head(stream).await?;
    let mut left = content_length(&head)?;
    let mut buffer = vec![0u8; 256 * 1024];
    while left > 0 {
        let n = stream.read(&mut buffer[..left.min(256 * 1024)]).await?;
        if n == 0 {
            bail!("the download ended {left} bytes early");
        }
        left -= n;
    }
    Ok(started.elapsed())
}

/// `GET /small` and its 16-byte body; how long the round trip took.
async fn small_round_trip(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    stream
        .write_all(b"GET /small HTTP/1.1\r\nHost: upstream\r\n\r\n")
        .await?;
    let head = read_head(stream).await?;
    let mut body = vec![0u8; content_length(&head)?];
    stream.read_exact(&mut body).await?;
    Ok(started.elapsed())
}

/// The upstream on 127.0.0.1: keep-alive HTTP/1.1, `/blob` 64 MiB, anything else 16 bytes.
async fn start_upstream() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let blob: Arc<Vec<u8>> = Arc::new((0..BLOB_BYTES).map(|i| (i % 251) as u8).collect());
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            let blob = blob.clone();
            tokio::spawn(async move {
                while let Ok(head) = read_head(&mut stream).await {
                    let body: &[u8] = if head.starts_with("GET /blob ") {
                        &blob
                    } else {
                        SMALL_BODY
                    };
                    let answer =
                        format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
                    if stream.write_all(answer.as_bytes()).await.is_err()
                        || stream.write_all(body).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    Ok(port)
}
