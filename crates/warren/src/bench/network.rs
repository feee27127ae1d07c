//! `warren bench network`: what the hands' egress proxy (network.md, `warren-egress`) costs
//! over going to the upstream directly. Serves one `Egress` in this process on a Unix socket
//! (as the gateway does per session), with an exact allow rule for a local upstream on
//! 127.0.0.1 that answers `GET /blob` with 64 MiB and `GET /small` with 16 bytes, over keep-alive
//! HTTP/1.1. Measured in one run, interleaved: a 64 MiB download through a `CONNECT` tunnel
//! against the same download direct (7 back-to-back pairs: the best of each and the median ratio); the round trip of a small request on a
//! kept tunnel against a kept direct connection (p50 added); `CONNECT` set-up (Unix connect to
//! `200`); and this process's resident memory with 200 tunnels open. The hop inside the sandbox
//! (execd's `--forward` from 127.0.0.1:3128 to the socket) is not part of it.
//!
//! Then credentials at the edge, in a second table: an HTTPS upstream in this process (hyper
//! over tokio-rustls, its certificate from a throwaway rcgen CA the proxy trusts through
//! `upstream_trust`) on 127.0.0.2, which a credential covers, and on 127.0.0.3, which none
//! does; one session's proxy with the gateway's CA (`Authority`) in a fresh directory. Small
//! `GET`s on one kept connection each, interleaved: direct TLS to 127.0.0.2, an opaque tunnel to
//! 127.0.0.3 (TLS end to end with the upstream) and an injecting tunnel to 127.0.0.2 (TLS with
//! the proxy, trusting the egress CA; the proxy's own TLS to the upstream). And new tunnels,
//! `CONNECT` to the first response, each a full handshake (no session resumption anywhere):
//! opaque, injecting with the host's certificate kept, and injecting through a proxy whose CA
//! has never seen the host (a fresh `Authority` each time, so the certificate is issued then).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::task::JoinHandle;
use tokio_rustls::{TlsAcceptor, TlsConnector};
use warren_egress::{
    Answer, AnswerFuture, Authority, Credential, Edge, Egress, Limits, Mode, Observer, Policy,
    upstream_trust,
};

use super::support::{Row, ms, percentile, print_table, rss_kib};

const BLOB_BYTES: usize = 64 * 1024 * 1024;
const N_BEST_OF: usize = 7;
const N_ROUND_TRIPS: usize = 2000;
const N_CONNECTS: usize = 500;
const N_TUNNELS: usize = 200;
const SMALL_BODY: &[u8] = b"0123456789abcdef";

/// Credential injection: requests on each kept connection before and while measuring, new
/// tunnels of each kind, first connections through a never-seen host's proxy, and certificates
/// issued alone.
const N_INJECT_WARM_UP: usize = 100;
const N_INJECT_REQUESTS: usize = 2000;
const N_NEW_TUNNELS: usize = 200;
const N_LEAF_ISSUED: usize = 20;
const N_LEAVES: usize = 50;
/// The upstream's address a credential covers, and the one none does.
const COVERED_IP: &str = "127.0.0.2";
const UNCOVERED_IP: &str = "127.0.0.3";
/// The credential's value (made up: the upstream only counts the requests that carry it).
const TOKEN: &str = "warren-bench-token-7d41c0a9e2";
/// The bound on each step (a connection, a handshake, a request) and on each table's run.
const STEP_WAIT: Duration = Duration::from_secs(10);
const SECTION_WAIT: Duration = Duration::from_secs(50);

/// An HTTP/1.1 client connection, kept alive between requests.
type Sender = SendRequest<Empty<Bytes>>;

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
    let result = both_tables(&dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn both_tables(dir: &Path) -> anyhow::Result<()> {
    let upstream = start_upstream().await?;
    let socket = dir.join("egress.sock");
    let mut policy = Policy::new(Mode::None);
    policy.allow.push(format!("127.0.0.1:{upstream}").parse()?);
    let limits = Limits {
        max_connections: 4 * N_TUNNELS,
        ..Limits::default()
    };
    let egress = Egress::new(policy, Arc::new(Quiet), limits, String::new());
    let listener = UnixListener::bind(&socket)?;
    let server = Aborted(vec![tokio::spawn(egress.serve(listener))]);
    let rows = bounded("the proxy's figures", bench(&socket, upstream)).await?;
    drop(server);
    print_table(&rows);

    let (heading, rows) = bounded("the credential injection figures", injection(dir)).await?;
    println!();
    println!("{heading}");
    println!();
    print_table(&rows);
    Ok(())
}

/// `future`, or an error once a table's run takes longer than [`SECTION_WAIT`].
async fn bounded<T>(
    what: &str,
    future: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::time::timeout(SECTION_WAIT, future)
        .await
        .map_err(|_| anyhow!("{what} took over {SECTION_WAIT:?}"))?
}

/// `future`, or an error once one step takes longer than [`STEP_WAIT`].
async fn step<T>(what: &str, future: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::time::timeout(STEP_WAIT, future)
        .await
        .map_err(|_| anyhow!("{what}: nothing within {STEP_WAIT:?}"))?
        .with_context(|| what.to_owned())
}

/// Tasks aborted when this is dropped (on every way out of a benchmark).
struct Aborted(Vec<JoinHandle<()>>);

impl Drop for Aborted {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
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

/// The credential injection table: its heading and rows.
async fn injection(dir: &Path) -> anyhow::Result<(String, Vec<Row>)> {
    let upstream = HttpsUpstream::start().await?;
    let trust_file = dir.join("upstream-ca.pem");
    std::fs::write(&trust_file, &upstream.ca_pem)?;
    let trust = upstream_trust(&[trust_file])?;
    let authority = Arc::new(Authority::open(&dir.join("egress-ca"))?);
    let credential = Arc::new(Credential::parse(
        &format!("bench={COVERED_IP}:Authorization:Bearer $BENCH_TOKEN"),
        |variable| (variable == "BENCH_TOKEN").then(|| TOKEN.to_owned()),
    )?);
    let socket = dir.join("egress-credentials.sock");
    let _proxy = start_proxy(
        &socket,
        &upstream,
        Edge::new(authority.clone(), trust.clone()),
        vec![credential.clone()],
    )?;
    // The client's trust: the upstream's CA (direct, opaque) or the egress CA (injecting).
    let upstream_client = client_config(&upstream.ca_der)?;
    let egress_client = client_config(authority.cert_der())?;
    let (covered, uncovered) = (upstream.covered, upstream.uncovered);
    let direct = Route {
        socket: None,
        target: covered,
        client: &upstream_client,
    };
    let opaque = Route {
        socket: Some(&socket),
        target: uncovered,
        client: &upstream_client,
    };
    let injecting = Route {
        socket: Some(&socket),
        target: covered,
        client: &egress_client,
    };
    // Requests the upstream should see the credential on.
    let mut injected = 0u64;

    // Warm-up: one new connection each (the covered host's certificate is issued here).
    let mut tls = String::new();
    for route in [&direct, &opaque, &injecting] {
        let (mut sender, _, described) = route.open().await?;
        route.get(&mut sender).await?;
        if tls.is_empty() {
            tls = described;
        }
    }
    injected += 1;

    // Small requests on one kept connection each, interleaved.
    let (mut kept_direct, _, _) = direct.open().await?;
    let (mut kept_opaque, _, _) = opaque.open().await?;
    let (mut kept_injecting, _, _) = injecting.open().await?;
    let mut times = [Vec::new(), Vec::new(), Vec::new()];
    for i in 0..N_INJECT_WARM_UP + N_INJECT_REQUESTS {
        let took = [
            direct.get(&mut kept_direct).await?,
            opaque.get(&mut kept_opaque).await?,
            injecting.get(&mut kept_injecting).await?,
        ];
        if i >= N_INJECT_WARM_UP {
            for (times, took) in times.iter_mut().zip(took) {
                times.push(took);
            }
        }
    }
    injected += (N_INJECT_WARM_UP + N_INJECT_REQUESTS) as u64;
    drop((kept_direct, kept_opaque, kept_injecting));
    let rps: Vec<f64> = times
        .iter()
        .map(|times| times.len() as f64 / times.iter().sum::<Duration>().as_secs_f64())
        .collect();
    for times in &mut times {
        times.sort();
    }
    let p50: Vec<Duration> = times.iter().map(|t| percentile(t, 0.5)).collect();
    let p99: Vec<Duration> = times.iter().map(|t| percentile(t, 0.99)).collect();

    // New tunnels, CONNECT (or the TCP connect) to the first response, interleaved.
    let mut first_response = [Vec::new(), Vec::new(), Vec::new()];
    let mut handshaken = [Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..N_NEW_TUNNELS {
        for (at, route) in [&direct, &opaque, &injecting].into_iter().enumerate() {
            let (tls_done, answered) = route.first_response().await?;
            handshaken[at].push(tls_done);
            first_response[at].push(answered);
        }
    }
    injected += N_NEW_TUNNELS as u64;
    for times in first_response.iter_mut().chain(handshaken.iter_mut()) {
        times.sort();
    }
    let new_p50: Vec<Duration> = first_response.iter().map(|t| percentile(t, 0.5)).collect();
    let new_p99: Vec<Duration> = first_response.iter().map(|t| percentile(t, 0.99)).collect();
    let tls_p50: Vec<Duration> = handshaken.iter().map(|t| percentile(t, 0.5)).collect();

    // The first connection to a host the CA has never seen: a fresh CA (and proxy) each time.
    let mut issued = Vec::with_capacity(N_LEAF_ISSUED);
    for i in 0..N_LEAF_ISSUED {
        let fresh = Arc::new(Authority::open(&dir.join(format!("egress-ca-{i}")))?);
        let fresh_socket = dir.join(format!("egress-fresh-{i}.sock"));
        let _fresh_proxy = start_proxy(
            &fresh_socket,
            &upstream,
            Edge::new(fresh.clone(), trust.clone()),
            vec![credential.clone()],
        )?;
        let fresh_client = client_config(fresh.cert_der())?;
        let route = Route {
            socket: Some(&fresh_socket),
            target: covered,
            client: &fresh_client,
        };
        issued.push(route.first_response().await?.1);
    }
    injected += N_LEAF_ISSUED as u64;
    issued.sort();
    let issued_p50 = percentile(&issued, 0.5);

    // Issuing alone: a certificate for a never-seen name, with its server configuration.
    let mut leaves = Vec::with_capacity(N_LEAVES);
    for i in 0..N_LEAVES {
        let started = Instant::now();
        authority.server_config(&format!("leaf-{i}.bench.test"))?;
        leaves.push(started.elapsed());
    }
    leaves.sort();

    let seen = upstream.authorized.load(Ordering::Acquire);
    if seen != injected {
        bail!(
            "the upstream saw the credential on {seen} requests; {injected} went through the \
             injecting tunnels (and none should have come any other way)"
        );
    }

    let three = |values: &[Duration], unit: fn(Duration) -> String| {
        format!(
            "{} / {} / {}",
            unit(values[0]),
            unit(values[1]),
            unit(values[2])
        )
    };
    let rows = vec![
        Row {
            measurement: format!(
                "small GET on a kept connection ({N_INJECT_REQUESTS} sequential, after \
                 {N_INJECT_WARM_UP}), rps: direct / opaque tunnel / injecting tunnel"
            ),
            result: format!("{:.0} / {:.0} / {:.0}", rps[0], rps[1], rps[2]),
            target: "reported",
        },
        Row {
            measurement: "small GET latency p50: direct / opaque tunnel / injecting tunnel".into(),
            result: three(&p50, us),
            target: "",
        },
        Row {
            measurement: "small GET latency p99: direct / opaque tunnel / injecting tunnel".into(),
            result: three(&p99, us),
            target: "",
        },
        Row {
            measurement: "added latency p50 over direct: opaque tunnel / injecting tunnel".into(),
            result: format!(
                "{} / {}",
                us(p50[1].saturating_sub(p50[0])),
                us(p50[2].saturating_sub(p50[0]))
            ),
            target: "reported",
        },
        Row {
            measurement: "injecting tunnel rps / direct rps".into(),
            result: format!("{:.2}×", rps[2] / rps[0]),
            target: "reported",
        },
        Row {
            measurement: format!(
                "new tunnel to first response p50 ({N_NEW_TUNNELS} each): direct (new TLS \
                 connection) / opaque / injecting (cached leaf)"
            ),
            result: three(&new_p50, ms),
            target: "reported",
        },
        Row {
            measurement: "new tunnel to first response p99: direct / opaque / injecting (cached \
                          leaf)"
                .into(),
            result: three(&new_p99, ms),
            target: "",
        },
        Row {
            measurement: "of which to the client's TLS handshake done, p50: direct / opaque / \
                          injecting (with the proxy)"
                .into(),
            result: three(&tls_p50, ms),
            target: "",
        },
        Row {
            measurement: format!(
                "new tunnel to first response p50, injecting (leaf issued: the first connection \
                 through a fresh CA, {N_LEAF_ISSUED})"
            ),
            result: format!(
                "{} (+{} over a cached leaf)",
                ms(issued_p50),
                ms(issued_p50.saturating_sub(new_p50[2]))
            ),
            target: "reported",
        },
        Row {
            measurement: format!(
                "leaf issued alone (Authority::server_config for a never-seen host) p50 / p99 \
                 ({N_LEAVES})"
            ),
            result: format!(
                "{} / {}",
                us(percentile(&leaves, 0.5)),
                us(percentile(&leaves, 0.99))
            ),
            target: "",
        },
    ];
    let heading = format!(
        "Credential injection: an HTTPS upstream in this process (hyper over tokio-rustls, \
         certificate from a throwaway CA) on {COVERED_IP} (a credential covers it: direct, \
         injecting) and {UNCOVERED_IP} (none does: opaque); {tls}; full handshakes (no session \
         resumption on any side); {} requests carried the credential, all on injecting tunnels.",
        injected
    );
    Ok((heading, rows))
}

/// A duration in whole microseconds (what a request on a kept loopback connection takes).
fn us(duration: Duration) -> String {
    format!("{:.0} µs", duration.as_secs_f64() * 1e6)
}

/// One session's proxy on `socket`: exact allow rules for both of the upstream's addresses,
/// `credentials` set through `edge`.
fn start_proxy(
    socket: &Path,
    upstream: &HttpsUpstream,
    edge: Arc<Edge>,
    credentials: Vec<Arc<Credential>>,
) -> anyhow::Result<Aborted> {
    let mut policy = Policy::new(Mode::None);
    for target in [upstream.covered, upstream.uncovered] {
        policy.allow.push(target.to_string().parse()?);
    }
    let limits = Limits {
        max_connections: 1024,
        ..Limits::default()
    };
    let egress = Egress::with_credentials(
        policy,
        Arc::new(Quiet),
        limits,
        String::new(),
        Some(edge),
        credentials,
    );
    let listener = UnixListener::bind(socket)?;
    Ok(Aborted(vec![tokio::spawn(egress.serve(listener))]))
}

/// A client's TLS: trusting `root` only, HTTP/1.1, no session resumption (every handshake
/// full).
fn client_config(root: &CertificateDer<'static>) -> anyhow::Result<Arc<ClientConfig>> {
    let mut roots = RootCertStore::empty();
    roots.add(root.clone())?;
    let mut config = ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.resumption = rustls::client::Resumption::disabled();
    Ok(Arc::new(config))
}

/// How a client reaches the upstream: directly, or through the proxy at `socket`.
struct Route<'a> {
    socket: Option<&'a Path>,
    target: SocketAddr,
    client: &'a Arc<ClientConfig>,
}

impl Route<'_> {
    /// A new connection, TLS and HTTP/1.1 on it: the sender, when the TLS handshake was done,
    /// and what the TLS is (protocol and key exchange).
    async fn open(&self) -> anyhow::Result<(Sender, Instant, String)> {
        let what = format!(
            "a connection to {} {}",
            self.target,
            if self.socket.is_some() {
                "through the proxy"
            } else {
                "direct"
            }
        );
        step(&what, async {
            match self.socket {
                Some(socket) => {
                    let tunnel = connect_tunnel(socket, &self.target.to_string()).await?;
                    self.tls_http(tunnel).await
                }
                None => {
                    let stream = TcpStream::connect(self.target).await?;
                    stream.set_nodelay(true)?;
                    self.tls_http(stream).await
                }
            }
        })
        .await
    }

    async fn tls_http<S>(&self, io: S) -> anyhow::Result<(Sender, Instant, String)>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let name = ServerName::from(self.target.ip());
        let tls = TlsConnector::from(self.client.clone())
            .connect(name, io)
            .await?;
        let handshaken = Instant::now();
        let (_, connection) = tls.get_ref();
        let described = format!(
            "{:?} with {:?}",
            connection
                .protocol_version()
                .context("no TLS protocol version")?,
            connection
                .negotiated_key_exchange_group()
                .context("no key exchange group")?
                .name()
        );
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok((sender, handshaken, described))
    }

    /// `GET /small` on `sender`, its whole answer checked; how long it took.
    async fn get(&self, sender: &mut Sender) -> anyhow::Result<Duration> {
        let started = Instant::now();
        step("a small GET", async {
            sender.ready().await?;
            let request = Request::get("/small")
                .header(header::HOST, self.target.to_string())
                .body(Empty::new())?;
            let response = sender.send_request(request).await?;
            let status = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            if status != StatusCode::OK || body != SMALL_BODY {
                bail!(
                    "{status} {:?} from {}",
                    String::from_utf8_lossy(&body),
                    self.target
                );
            }
            Ok(())
        })
        .await?;
        Ok(started.elapsed())
    }

    /// A new connection and one request on it: from the connect to the TLS handshake done,
    /// and to the first response.
    async fn first_response(&self) -> anyhow::Result<(Duration, Duration)> {
        let started = Instant::now();
        let (mut sender, handshaken, _) = self.open().await?;
        self.get(&mut sender).await?;
        Ok((handshaken - started, started.elapsed()))
    }
}

/// The HTTPS upstream: a certificate for both addresses from its own CA, keep-alive HTTP/1.1
/// answering every request with [`SMALL_BODY`], counting those that carry the credential. No
/// session is kept or ticket sent, so every handshake with it is a full one.
struct HttpsUpstream {
    ca_der: CertificateDer<'static>,
    ca_pem: String,
    covered: SocketAddr,
    uncovered: SocketAddr,
    authorized: Arc<AtomicU64>,
    _listeners: Aborted,
}

impl HttpsUpstream {
    async fn start() -> anyhow::Result<HttpsUpstream> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::default();
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "warren bench network upstream CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(ca_params, ca_key)?;
        let mut params =
            CertificateParams::new(vec![COVERED_IP.to_owned(), UNCOVERED_IP.to_owned()])?;
        params
            .distinguished_name
            .push(DnType::CommonName, COVERED_IP);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &ca)?;
        let mut config = ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let authorized = Arc::new(AtomicU64::new(0));
        let mut addresses = Vec::new();
        let mut tasks = Vec::new();
        for ip in [COVERED_IP, UNCOVERED_IP] {
            let listener = TcpListener::bind((ip, 0))
                .await
                .with_context(|| format!("binding the HTTPS upstream on {ip}"))?;
            addresses.push(listener.local_addr()?);
            tasks.push(tokio::spawn(serve_https(
                listener,
                acceptor.clone(),
                authorized.clone(),
            )));
        }
        Ok(HttpsUpstream {
            ca_der: ca.der().clone(),
            ca_pem: ca.pem(),
            covered: addresses[0],
            uncovered: addresses[1],
            authorized,
            _listeners: Aborted(tasks),
        })
    }
}

async fn serve_https(listener: TcpListener, acceptor: TlsAcceptor, authorized: Arc<AtomicU64>) {
    let expected = format!("Bearer {TOKEN}");
    while let Ok((stream, _)) = listener.accept().await {
        let _ = stream.set_nodelay(true);
        let (acceptor, authorized, expected) =
            (acceptor.clone(), authorized.clone(), expected.clone());
        tokio::spawn(async move {
            let Ok(Ok(tls)) = tokio::time::timeout(STEP_WAIT, acceptor.accept(stream)).await else {
                return;
            };
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                if request
                    .headers()
                    .get(header::AUTHORIZATION)
                    .is_some_and(|value| value.as_bytes() == expected.as_bytes())
                {
                    authorized.fetch_add(1, Ordering::AcqRel);
                }
                async {
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(
                        SMALL_BODY,
                    ))))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}
