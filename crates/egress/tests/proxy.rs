//! The egress proxy over its real Unix socket against real loopback upstreams: a tunnel and a
//! plain HTTP request that pass by an exact rule, with their byte counts; every refusal (a
//! private address, `localhost`, `[::1]`, metadata, a name no rule covers and the person
//! denies), each with its status and the reason in the body; the person's "allow for this
//! session"; bad requests; the connection cap (500 at once, another session's proxy unaffected);
//! and an upstream that never answers.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixStream};
use warren_egress::{Answer, AnswerFuture, Egress, Limits, Mode, Observer, Policy};
use warren_test_support::{WAIT, eventually_async};

#[derive(Default)]
struct Seen {
    asked: Mutex<Vec<String>>,
    decided: Mutex<Vec<(String, bool, String)>>,
    closed: Mutex<Vec<(String, u64, u64)>>,
    answer: Mutex<Option<Answer>>,
}

impl Observer for Seen {
    fn ask(&self, host: &str, port: u16) -> AnswerFuture {
        self.asked
            .lock()
            .expect("lock")
            .push(format!("{host}:{port}"));
        let answer = self.answer.lock().expect("lock").unwrap_or(Answer::Deny);
        Box::pin(async move { answer })
    }

    fn decided(&self, host: &str, port: u16, allowed: bool, rule: &str) {
        self.decided.lock().expect("lock").push((
            format!("{host}:{port}"),
            allowed,
            rule.to_owned(),
        ));
    }

    fn closed(&self, host: &str, port: u16, bytes_up: u64, bytes_down: u64) {
        self.closed
            .lock()
            .expect("lock")
            .push((format!("{host}:{port}"), bytes_up, bytes_down));
    }
}

struct Proxy {
    socket: std::path::PathBuf,
    seen: Arc<Seen>,
    egress: Arc<Egress>,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn start(policy: Policy, limits: Limits) -> Proxy {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("egress.sock");
    let listener = tokio::net::UnixListener::bind(&socket).expect("binds");
    let seen = Arc::new(Seen::default());
    let egress = Egress::new(
        policy,
        Arc::clone(&seen) as Arc<dyn Observer>,
        limits,
        "Allow it in the console's Network view.".to_owned(),
    );
    let task = tokio::spawn(Arc::clone(&egress).serve(listener));
    Proxy {
        socket,
        seen,
        egress,
        _dir: dir,
        task,
    }
}

fn policy(mode: Mode, allow: &[&str]) -> Policy {
    let mut policy = Policy::new(mode);
    policy.allow = allow.iter().map(|rule| rule.parse().expect(rule)).collect();
    policy
}

/// Sends `head` and reads the answer's head (and, for a refusal, its body) until the server
/// closes or the head and `Content-Length` bytes are in.
async fn ask_raw(proxy: &Proxy, head: &str) -> (UnixStream, String) {
    let mut stream = UnixStream::connect(&proxy.socket).await.expect("connects");
    stream.write_all(head.as_bytes()).await.expect("sends");
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(WAIT, async {
        loop {
            let text = String::from_utf8_lossy(&answer).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head
                    .lines()
                    .find_map(|line| {
                        line.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|n| n.trim().parse::<usize>().unwrap_or(0))
                    })
                    .unwrap_or(0);
                if body.len() >= length {
                    break;
                }
            }
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("an answer to {head:?}"));
    (stream, String::from_utf8_lossy(&answer).into_owned())
}

fn status_of(answer: &str) -> u16 {
    answer
        .split(' ')
        .nth(1)
        .and_then(|status| status.parse().ok())
        .unwrap_or_else(|| panic!("a status line in {answer:?}"))
}

/// An echo server on 127.0.0.2.
async fn echo_upstream() -> u16 {
    echo_upstream_on("127.0.0.2").await
}

/// An echo server on `ip`.
async fn echo_upstream_on(ip: &str) -> u16 {
    let listener = TcpListener::bind((ip, 0)).await.expect("binds");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut reader, mut writer) = stream.split();
                let _ = tokio::io::copy(&mut reader, &mut writer).await;
            });
        }
    });
    port
}

#[tokio::test]
async fn a_tunnel_allowed_by_an_exact_rule_carries_bytes_both_ways_and_is_counted() {
    let port = echo_upstream().await;
    let proxy = start(
        policy(Mode::None, &[&format!("127.0.0.2:{port}")]),
        Limits::default(),
    );
    let (mut stream, answer) = ask_raw(
        &proxy,
        &format!("CONNECT 127.0.0.2:{port} HTTP/1.1\r\nHost: 127.0.0.2:{port}\r\n\r\n"),
    )
    .await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    stream
        .write_all(b"ping through the tunnel")
        .await
        .expect("writes");
    let mut echoed = [0u8; 23];
    tokio::time::timeout(WAIT, stream.read_exact(&mut echoed))
        .await
        .expect("in time")
        .expect("reads");
    assert_eq!(&echoed, b"ping through the tunnel");
    drop(stream);
    let target = format!("127.0.0.2:{port}");
    eventually_async("the tunnel's close is reported", || async {
        !proxy.seen.closed.lock().expect("lock").is_empty()
    })
    .await;
    assert_eq!(
        proxy.seen.closed.lock().expect("lock")[0],
        (target.clone(), 23, 23)
    );
    assert_eq!(
        proxy.seen.decided.lock().expect("lock")[0],
        (target.clone(), true, format!("allow {target}"))
    );
}

#[tokio::test]
async fn a_plain_http_request_goes_on_in_origin_form_with_its_host() {
    let listener = TcpListener::bind("127.0.0.2:0").await.expect("binds");
    let port = listener.local_addr().expect("addr").port();
    let upstream = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.expect("accepts");
        let mut request = Vec::new();
        let mut buf = [0u8; 1024];
        while !request.ends_with(b"\r\n\r\n") {
            let n = stream.read(&mut buf).await.expect("reads");
            assert!(n > 0, "the request's head");
            request.extend_from_slice(&buf[..n]);
        }
        stream
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
            .await
            .expect("answers");
        String::from_utf8_lossy(&request).into_owned()
    });
    let proxy = start(
        policy(Mode::None, &[&format!("127.0.0.2:{port}")]),
        Limits::default(),
    );
    let (_stream, answer) = ask_raw(
        &proxy,
        &format!(
            "GET http://127.0.0.2:{port}/pkg/a?b=1 HTTP/1.1\r\nHost: 127.0.0.2:{port}\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: Basic eDp5\r\n\r\n"
        ),
    )
    .await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    assert!(answer.ends_with("hello"), "{answer}");
    let request = tokio::time::timeout(WAIT, upstream)
        .await
        .expect("in time")
        .expect("the upstream saw it");
    assert!(
        request.starts_with("GET /pkg/a?b=1 HTTP/1.1\r\n"),
        "{request}"
    );
    let lower = request.to_ascii_lowercase();
    assert!(
        lower.contains(&format!("host: 127.0.0.2:{port}")),
        "{request}"
    );
    assert!(
        !lower.contains("proxy-"),
        "no proxy header goes upstream: {request}"
    );
}

#[tokio::test]
async fn every_refused_destination_gets_a_403_that_says_why_and_how_to_allow_it() {
    let port = echo_upstream().await;
    let proxy = start(policy(Mode::Open, &[]), Limits::default());
    // (request target, what the body names)
    for (target, why) in [
        (
            format!("127.0.0.2:{port}"),
            "127.0.0.2 is a loopback address".to_owned(),
        ),
        (
            format!("localhost:{port}"),
            "is a loopback address".to_owned(),
        ),
        (
            "[::1]:80".to_owned(),
            "::1 is a loopback address".to_owned(),
        ),
        (
            "10.0.0.1:443".to_owned(),
            "10.0.0.1 is a private address".to_owned(),
        ),
        (
            "169.254.169.254:80".to_owned(),
            "169.254.169.254 is a metadata address".to_owned(),
        ),
        (
            "[fd00:ec2::254]:80".to_owned(),
            "fd00:ec2::254 is a metadata address".to_owned(),
        ),
    ] {
        let (_stream, answer) = ask_raw(
            &proxy,
            &format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n"),
        )
        .await;
        assert_eq!(status_of(&answer), 403, "{target}: {answer}");
        assert!(answer.contains("text/plain"), "{answer}");
        assert!(answer.contains(&why), "{target}: {answer}");
        assert!(answer.contains("console's Network view"), "{answer}");
    }
    // The same for plain HTTP.
    let (_stream, answer) = ask_raw(
        &proxy,
        &format!("GET http://127.0.0.2:{port}/ HTTP/1.1\r\nHost: x\r\n\r\n"),
    )
    .await;
    assert_eq!(status_of(&answer), 403, "{answer}");
    // A deny rule wins over the mode.
    proxy.egress.set_policy(Policy {
        deny: vec!["*.example.com".parse().expect("rule")],
        ..Policy::new(Mode::Open)
    });
    let (_stream, answer) = ask_raw(
        &proxy,
        "CONNECT a.example.com:443 HTTP/1.1\r\nHost: a\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&answer), 403);
    assert!(answer.contains("(deny *.example.com)"), "{answer}");
    assert!(
        proxy.seen.asked.lock().expect("lock").is_empty(),
        "nothing was asked"
    );
}

#[tokio::test]
async fn a_host_no_rule_covers_is_asked_and_the_answer_holds() {
    // `localhost` is a name no rule covers, so it is asked; its address 127.0.0.1 is opened by
    // a rule naming that address exactly (answers never open a range).
    let port = echo_upstream_on("127.0.0.1").await;
    let address_rule = format!("127.0.0.1:{port}");
    let target = format!("localhost:{port}");
    let proxy = start(policy(Mode::Ask, &[&address_rule]), Limits::default());
    *proxy.seen.answer.lock().expect("lock") = Some(Answer::Deny);
    let head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    let (_stream, answer) = ask_raw(&proxy, &head).await;
    assert_eq!(status_of(&answer), 403, "{answer}");
    assert!(answer.contains("denied by the person"), "{answer}");
    *proxy.seen.answer.lock().expect("lock") = Some(Answer::TimedOut);
    let (_stream, answer) = ask_raw(&proxy, &head).await;
    assert_eq!(status_of(&answer), 403, "{answer}");
    assert!(answer.contains("did not answer in time"), "{answer}");
    // Allowed for the session: the next connection is not asked.
    *proxy.seen.answer.lock().expect("lock") = Some(Answer::AllowSession);
    let (_stream, answer) = ask_raw(&proxy, &head).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    let (_stream, answer) = ask_raw(&proxy, &head).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    assert_eq!(proxy.seen.asked.lock().expect("lock").len(), 3);
    let answered: Vec<String> = proxy
        .egress
        .policy()
        .answered
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(answered, [target]);
    // Nobody is asked about a host that would be refused anyway: 127.0.0.2 is loopback, and
    // no rule names it.
    let loopback = format!("127.0.0.2:{port}");
    let head = format!("CONNECT {loopback} HTTP/1.1\r\nHost: {loopback}\r\n\r\n");
    let (_stream, answer) = ask_raw(&proxy, &head).await;
    assert_eq!(status_of(&answer), 403, "{answer}");
    assert!(answer.contains("is a loopback address"), "{answer}");
    assert_eq!(proxy.seen.asked.lock().expect("lock").len(), 3, "not asked");
}

#[tokio::test]
async fn one_sessions_cap_leaves_another_sessions_proxy_serving() {
    let port = echo_upstream().await;
    let target = format!("127.0.0.2:{port}");
    let limits = Limits {
        max_connections: 500,
        ..Limits::default()
    };
    let busy = start(policy(Mode::None, &[&target]), limits);
    let quiet = start(policy(Mode::None, &[&target]), limits);
    let head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    let mut open = Vec::new();
    for _ in 0..500 {
        let (stream, answer) = ask_raw(&busy, &head).await;
        assert_eq!(status_of(&answer), 200, "{answer}");
        open.push(stream);
    }
    let (_stream, answer) = ask_raw(&busy, &head).await;
    assert_eq!(
        status_of(&answer),
        429,
        "the 501st connection at once: {answer}"
    );
    assert!(answer.contains("500 allowed"), "{answer}");
    let (_stream, answer) = ask_raw(&quiet, &head).await;
    assert_eq!(
        status_of(&answer),
        200,
        "another session's proxy is unaffected: {answer}"
    );
    drop(open);
    eventually_async("the busy proxy's slots free again", || async {
        let (_stream, answer) = ask_raw(&busy, &head).await;
        status_of(&answer) == 200
    })
    .await;
}

#[tokio::test]
async fn bad_requests_get_400_and_the_cap_gets_429() {
    let port = echo_upstream().await;
    let target = format!("127.0.0.2:{port}");
    let proxy = start(
        policy(Mode::None, &[&target]),
        Limits {
            max_connections: 2,
            ..Limits::default()
        },
    );
    for head in [
        "GET /origin-form HTTP/1.1\r\nHost: example.com\r\n\r\n",
        "GET https://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n",
        "CONNECT example.com HTTP/1.1\r\nHost: example.com\r\n\r\n",
        "CONNECT bad_host!:443 HTTP/1.1\r\nHost: x\r\n\r\n",
        "NOT A REQUEST\r\n\r\n",
        // No Host and no absolute URI: nothing names where to go.
        "GET / HTTP/1.1\r\n\r\n",
        "CONNECT / HTTP/1.1\r\n\r\n",
    ] {
        let (_stream, answer) = ask_raw(&proxy, head).await;
        assert_eq!(status_of(&answer), 400, "{head:?}: {answer}");
    }
    let connect = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
    let (_first, answer) = ask_raw(&proxy, &connect).await;
    assert_eq!(status_of(&answer), 200);
    let (_second, answer) = ask_raw(&proxy, &connect).await;
    assert_eq!(status_of(&answer), 200);
    let (_third, answer) = ask_raw(&proxy, &connect).await;
    assert_eq!(status_of(&answer), 429, "{answer}");
}

#[tokio::test]
async fn an_upstream_that_never_answers_gets_504() {
    let listener = TcpListener::bind("127.0.0.2:0").await.expect("binds");
    let port = listener.local_addr().expect("addr").port();
    // Accepts and holds the connection without a word.
    let _holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let proxy = start(
        policy(Mode::None, &[&format!("127.0.0.2:{port}")]),
        Limits {
            response_timeout: Duration::from_millis(300),
            ..Limits::default()
        },
    );
    let (_stream, answer) = ask_raw(
        &proxy,
        &format!("GET http://127.0.0.2:{port}/ HTTP/1.1\r\nHost: x\r\n\r\n"),
    )
    .await;
    assert_eq!(status_of(&answer), 504, "{answer}");
    assert!(answer.contains("sent no response"), "{answer}");
}
