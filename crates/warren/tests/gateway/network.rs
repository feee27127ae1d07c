//! The hands' network (network.md) with the real bwrap sandbox, the built-in shell agent and
//! real tools inside: `--hands-network private` (the default) gives each session a loopback of
//! its own and egress only through its proxy; the registries policy lets pip, npm and curl reach
//! the real package registries; an exact rule lets git reach a local server; a host no rule
//! covers is asked of the person; each refusal says why, as the tool printed it; a tunnel open
//! while the hands are paused carries on when they resume.
//!
//! Local upstreams listen on 127.0.0.2 (another loopback address, so nothing the sandbox's own
//! loopback answers can be taken for them): `python3 -m http.server` on a port it picks.

use std::path::Path;
use std::process::Stdio;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use warren_gateway::hands::local::NetworkMode;
use warren_test_support::{first_line, within};

use super::helpers::{Conversation, Received, TestGateway, agent_text, in_bwrap};

/// `python3 -m http.server` serving `dir` on 127.0.0.2 (port chosen by the server, read from
/// its first line); stopped when dropped.
struct Upstream {
    _child: tokio::process::Child,
    port: u16,
}

async fn upstream(dir: &Path) -> Upstream {
    let mut child = tokio::process::Command::new("python3")
        .args(["-u", "-m", "http.server", "0", "--bind", "127.0.0.2"])
        .arg("--directory")
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 -m http.server starts");
    let line = first_line(&mut child, "the upstream's first line").await;
    // "Serving HTTP on 127.0.0.2 port 41234 (http://127.0.0.2:41234/) ..."
    let port = line
        .split_whitespace()
        .skip_while(|word| *word != "port")
        .nth(1)
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("a port in {line:?}"));
    Upstream {
        _child: child,
        port,
    }
}

/// The exit code the agent reported for the turn's command.
pub(super) fn exit_code(events: &[Received]) -> Option<i64> {
    events
        .iter()
        .filter(|e| e.event == "update")
        .filter(|e| e.data["update"]["sessionUpdate"] == "tool_call_update")
        .find_map(|e| e.data["update"]["rawOutput"]["exit_code"].as_i64())
}

/// Runs `command` through the shell agent and returns its output, asserting it exited 0.
pub(super) async fn run_ok(
    chat: &mut Conversation<'_>,
    what: &str,
    command: &str,
) -> (String, Vec<Received>) {
    let events = chat.turn(command).await;
    let output = agent_text(&events);
    assert_eq!(
        exit_code(&events),
        Some(0),
        "{what}: `{command}` exits 0; it printed {output:?}"
    );
    (output, events)
}

/// `PUT /v1/sessions/{session}/egress` with `body`: the status and the JSON answer.
pub(super) async fn put_egress(
    gw: &TestGateway,
    token: &str,
    session: &str,
    body: Value,
) -> (u16, Value) {
    let response = gw
        .request(
            reqwest::Method::PUT,
            token,
            &format!("/sessions/{session}/egress"),
        )
        .json(&body)
        .send()
        .await
        .expect("PUT egress");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The data of `events` of type `kind`.
pub(super) fn of_type<'a>(events: &'a [Received], kind: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e.event == kind)
        .map(|e| &e.data)
        .collect()
}

#[tokio::test]
async fn two_sessions_listen_on_one_port_and_reach_nothing_of_the_host() {
    let gw = in_bwrap(|_| {}).await;
    let host_service = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a service on the host's loopback");
    let host_port = host_service.local_addr().expect("addr").port();
    let gateway_port = gw.gateway.args.listen.port();
    let mut a = gw.conversation("phone-net-a").await;
    let mut b = gw.conversation("phone-net-b").await;
    let serve = |who: &str| {
        format!(
            "echo {who}-side > who.txt; setsid python3 -m http.server 5173 --bind 127.0.0.1 \
             >server.log 2>&1 </dev/null & for i in $(seq 100); do curl -s \
             http://127.0.0.1:5173/who.txt && exit 0; sleep 0.1; done; cat server.log; exit 1"
        )
    };
    let (output, _) = run_ok(&mut a, "A's dev server", &serve("a")).await;
    assert!(
        output.contains("a-side"),
        "A reaches its own server: {output:?}"
    );
    let (output, _) = run_ok(&mut b, "B's dev server on the same port", &serve("b")).await;
    assert!(
        output.contains("b-side") && !output.contains("a-side"),
        "B serves 5173 too and reaches its own, not A's: {output:?}"
    );
    let info = b.info().await;
    assert_eq!(
        info["network"], "private",
        "the session says its network: {info}"
    );

    // Straight at the host's loopback (ignoring the proxy): nothing listens there inside.
    let (output, _) = run_ok(
        &mut b,
        "the host's loopback, directly",
        &format!(
            "for p in {host_port} {gateway_port}; do curl -sS --noproxy '*' -m 20 \
             http://127.0.0.1:$p/ >/dev/null 2>&1; echo \"DIRECT $p $?\"; done; \
             curl -sS --noproxy '*' -m 20 http://203.0.113.80/ >/dev/null 2>&1; \
             echo \"OUTSIDE $?\"; ip -o link 2>/dev/null | cut -d: -f2; true"
        ),
    )
    .await;
    for port in [host_port, gateway_port] {
        assert!(
            output.contains(&format!("DIRECT {port} 7")),
            "port {port} of the host's loopback is refused at once inside (curl exit 7): {output:?}"
        );
    }
    // No route out: an immediate failure (6 cannot resolve, 7 cannot connect), never curl's
    // timeout (28).
    assert!(
        output.contains("OUTSIDE 6") || output.contains("OUTSIDE 7"),
        "a tool that ignores the proxy fails at once: {output:?}"
    );
    drop(host_service);
    gw.stop().await;
}

#[tokio::test]
async fn the_proxy_refuses_the_hosts_loopback_metadata_and_private_ranges_saying_why() {
    let gw = in_bwrap(|_| {}).await;
    let mut chat = gw.conversation("phone-net-r").await;
    let (output, events) = run_ok(
        &mut chat,
        "refused destinations through the proxy",
        "for u in http://127.0.0.1:9/ http://localhost:9/ 'http://[::1]:9/' \
         http://169.254.169.254/latest/meta-data/ http://10.1.2.3/ http://192.168.0.1:8080/; do \
         echo \"URL $u\"; curl -sS -m 20 --noproxy '' -x http://127.0.0.1:3128 \"$u\"; echo; \
         done; curl -sS -m 20 --noproxy '' -x http://127.0.0.1:3128 https://127.0.0.1:9/ 2>&1; \
         echo \"CONNECT $?\"; \
         python3 -c 'import urllib.request as r; r.urlopen(\"https://169.254.169.254/\", timeout=20)' \
         2>&1 | tail -n 1; true",
    )
    .await;
    for (host, port, range) in [
        ("127.0.0.1", 9, "loopback"),
        ("localhost", 9, "loopback"),
        ("::1", 9, "loopback"),
        ("169.254.169.254", 80, "metadata"),
        ("10.1.2.3", 80, "private"),
        ("192.168.0.1", 8080, "private"),
    ] {
        assert!(
            output.contains(&format!("warren egress: {host}:{port} refused"))
                && output.contains(&format!("a {range} address")),
            "curl prints why {host}:{port} was refused ({range}): {output:?}"
        );
    }
    assert!(
        output.contains("CONNECT tunnel failed, response 403") && output.contains("CONNECT 56"),
        "an https CONNECT gets 403 before any tunnel: {output:?}"
    );
    assert!(
        output.contains("403 Forbidden by Warren egress: 169.254.169.254:443"),
        "Python prints the refusal's reason phrase: {output:?}"
    );
    assert!(
        output.contains("PUT /v1/sessions/"),
        "each refusal says how to allow it: {output:?}"
    );
    let refused: Vec<&Value> = of_type(&events, "egress")
        .into_iter()
        .filter(|e| e["decision"] == "refused")
        .collect();
    assert!(
        refused
            .iter()
            .any(|e| e["host"] == "169.254.169.254" && e["port"] == 80),
        "a refused destination is an egress event: {refused:?}"
    );
    assert!(
        of_type(&events, "egress_request").is_empty(),
        "nobody is asked about a destination that would be refused anyway"
    );
    gw.stop().await;
}

#[tokio::test]
async fn the_registries_policy_lets_curl_pip_and_npm_through_without_a_question() {
    let gw = in_bwrap(|_| {}).await;
    let mut chat = gw.conversation("phone-net-p").await;
    let (output, events) = run_ok(
        &mut chat,
        "curl, pip download and npm view through the proxy",
        "set -e; curl -sS -o /dev/null -w 'CURL %{http_code}\\n' https://pypi.org/simple/six/; \
         /usr/bin/python3 -m pip download --no-deps --no-cache-dir -q -d /tmp/dl six==1.16.0; \
         ls /tmp/dl | sed 's/^/PIP /'; echo \"NPM $(npm view is-number@7.0.0 version)\"",
    )
    .await;
    assert!(output.contains("CURL 200"), "curl: {output:?}");
    assert!(
        output.contains("PIP six-1.16.0-py2.py3-none-any.whl"),
        "pip downloads the wheel: {output:?}"
    );
    assert!(output.contains("NPM 7.0.0"), "npm view: {output:?}");
    assert!(
        of_type(&events, "egress_request").is_empty(),
        "registries pass without a question: {events:?}",
        events = of_type(&events, "egress_request")
    );
    let allowed: Vec<&Value> = of_type(&events, "egress")
        .into_iter()
        .filter(|e| e["decision"] == "allowed")
        .collect();
    for host in ["pypi.org", "files.pythonhosted.org", "registry.npmjs.org"] {
        let seen: Vec<&&Value> = allowed.iter().filter(|e| e["host"] == host).collect();
        assert_eq!(
            seen.len(),
            1,
            "{host} is one `egress` event in the turn, however many connections: {allowed:?}"
        );
        assert_eq!(seen[0]["rule"], "policy registries");
    }
    // The byte counts come as summaries, at most one a second per host.
    let summaries = within("the byte summaries", async {
        loop {
            let view = chat
                .gw
                .get_json(&chat.token, &format!("/sessions/{}/egress", chat.session))
                .await;
            let pypi = view["recent"].as_array().and_then(|recent| {
                recent
                    .iter()
                    .find(|d| d["host"] == "files.pythonhosted.org")
                    .cloned()
            });
            if let Some(pypi) = pypi
                && pypi["bytes_down"].as_u64().unwrap_or(0) > 10_000
            {
                return view;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await;
    assert_eq!(summaries["network"], "private");
    assert_eq!(summaries["policy"], "registries");
    gw.stop().await;
}

#[tokio::test]
async fn git_clones_over_http_from_a_local_server_an_exact_rule_allows() {
    let served = tempfile::tempdir().expect("temp dir");
    let repo = served.path().join("repo.git");
    let work = served.path().join("work");
    let git = |args: &[&str], dir: &Path| {
        let status = std::process::Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", served.path())
            .stdout(Stdio::null())
            .status()
            .expect("git runs");
        assert!(status.success(), "git {args:?}");
    };
    std::fs::create_dir_all(&work).expect("mkdir");
    git(&["init", "-q", "-b", "main"], &work);
    std::fs::write(work.join("hello.txt"), "hello over http\n").expect("write");
    git(&["add", "hello.txt"], &work);
    git(
        &[
            "-c",
            "user.name=w",
            "-c",
            "user.email=w@x",
            "commit",
            "-qm",
            "one",
        ],
        &work,
    );
    git(
        &[
            "clone",
            "-q",
            "--bare",
            work.to_str().expect("utf-8"),
            "repo.git",
        ],
        served.path(),
    );
    git(&["update-server-info"], &repo);
    let server = upstream(served.path()).await;
    let port = server.port;
    let gw = in_bwrap(|args| {
        args.hands_egress_allow = vec![format!("127.0.0.2:{port}").parse().expect("rule")];
    })
    .await;
    let mut chat = gw.conversation("phone-net-g").await;
    let (output, events) = run_ok(
        &mut chat,
        "git clone through the proxy",
        &format!(
            "git clone -q http://127.0.0.2:{port}/repo.git cloned && cat cloned/hello.txt; \
             git clone -q http://127.0.0.3:{port}/repo.git other 2>&1; echo \"OTHER $?\"; \
             curl -sS http://127.0.0.3:{port}/; true"
        ),
    )
    .await;
    assert!(output.contains("hello over http"), "git cloned: {output:?}");
    assert!(
        output.contains("The requested URL returned error: 403") && output.contains("OTHER 128"),
        "a host the rule does not name is refused: {output:?}"
    );
    assert!(
        output.contains("warren egress: 127.0.0.3:")
            && output.contains("is a loopback address, reachable only through an allow rule"),
        "and the proxy says why: {output:?}"
    );
    let egress = of_type(&events, "egress");
    assert!(
        egress.iter().any(|e| e["host"] == "127.0.0.2"
            && e["decision"] == "allowed"
            && e["rule"] == format!("allow 127.0.0.2:{port}")),
        "the rule that let git through is in the event: {egress:?}"
    );
    gw.stop().await;
}

/// The request and the turn's events up to it.
async fn until_request(chat: &mut Conversation<'_>, what: &str) -> Value {
    let seen = chat
        .until(what, |e| {
            e.event == "egress_request" || e.event == "turn_end"
        })
        .await;
    let last = seen.last().expect("an event");
    assert_eq!(
        last.event, "egress_request",
        "{what}: asked before the turn ends"
    );
    last.data.clone()
}

#[tokio::test]
async fn a_host_no_rule_covers_is_asked_and_the_persons_answer_decides() {
    let served = tempfile::tempdir().expect("temp dir");
    std::fs::write(served.path().join("hello"), "hello from upstream\n").expect("write");
    let server = upstream(served.path()).await;
    let port = server.port;
    let gw = in_bwrap(|args| {
        args.egress_ask_timeout = std::time::Duration::from_secs(2);
    })
    .await;
    let mut chat = gw.conversation("phone-net-q").await;
    let egress_path = format!("/sessions/{}/egress", chat.session);
    // 127.0.0.2 is a loopback address: only a rule naming it exactly opens it; no question is
    // asked about it.
    let (status, _) = put_egress(
        &gw,
        &chat.token,
        &chat.session,
        json!({"policy": "registries", "allow": [format!("127.0.0.2:{port}")]}),
    )
    .await;
    assert_eq!(status, 200);
    let url = format!("http://127.0.0.2:{port}/hello");
    let (output, _) = run_ok(&mut chat, "an allowed upstream", &format!("curl -sS {url}")).await;
    assert!(output.contains("hello from upstream"), "{output:?}");

    // Asked: a destination no rule covers, in the `ask` policy.
    let (status, _) = put_egress(&gw, &chat.token, &chat.session, json!({"policy": "ask"})).await;
    assert_eq!(status, 200);
    let ask = "curl -sS -m 30 https://pypi.org/simple/six/ -o /dev/null -w 'A %{http_code}\\n' & \
               curl -sS -m 30 https://pypi.org/simple/six/ -o /dev/null -w 'B %{http_code}\\n' & \
               wait";
    chat.accept(ask).await;
    let request = until_request(&mut chat, "the question about pypi.org").await;
    assert_eq!(request["host"], "pypi.org");
    assert_eq!(request["port"], 443);
    assert_eq!(
        request["options"],
        json!(["allow_once", "allow_session", "deny"])
    );
    let request_id = request["request_id"]
        .as_str()
        .expect("request id")
        .to_owned();
    // A bad option and another device's session are refused.
    let bad = chat.answer_permission(&request_id, "always").await;
    assert_eq!(bad.status(), 400);
    let other = gw.register("phone-net-z").await;
    let foreign = gw
        .answer_permission(&other, &chat.session, &request_id, "allow_once")
        .await;
    assert_eq!(
        foreign.status(),
        404,
        "another device's session is not found"
    );
    let answered = chat.answer_permission(&request_id, "allow_once").await;
    assert_eq!(answered.status(), 204);
    let again = chat.answer_permission(&request_id, "deny").await;
    assert_eq!(again.status(), 404, "a question is answered once");
    let rest = chat.until_turn_end("the asked curls").await;
    let output = agent_text(&rest);
    assert!(
        output.contains("A 200") && output.contains("B 200"),
        "both connections waited for the one answer: {output:?}"
    );
    let questions = of_type(&rest, "egress_request");
    assert!(
        questions.is_empty(),
        "concurrent connections share one question: {questions:?}"
    );
    let resolved = of_type(&rest, "permission_resolved");
    assert_eq!(resolved.len(), 1, "{resolved:?}");
    assert_eq!(resolved[0]["request_id"], request_id.as_str());
    assert_eq!(resolved[0]["outcome"], "selected");
    assert_eq!(resolved[0]["option_id"], "allow_once");

    // Allow for the session: the next connection is not asked.
    chat.accept(
        "curl -sS -o /dev/null -w 'C %{http_code}\\n' https://registry.npmjs.org/is-number",
    )
    .await;
    let request = until_request(&mut chat, "the question about registry.npmjs.org").await;
    let request_id = request["request_id"].as_str().expect("id").to_owned();
    assert_eq!(
        chat.answer_permission(&request_id, "allow_session")
            .await
            .status(),
        204
    );
    let rest = chat
        .until_turn_end("the curl allowed for the session")
        .await;
    assert!(
        agent_text(&rest).contains("C 200"),
        "{rest:?}",
        rest = agent_text(&rest)
    );
    // Past the few seconds an answer holds for its destination's burst: the rule answers.
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    let (output, events) = run_ok(
        &mut chat,
        "registry.npmjs.org again",
        "curl -sS -o /dev/null -w 'D %{http_code}\\n' https://registry.npmjs.org/is-number",
    )
    .await;
    assert!(output.contains("D 200"), "{output:?}");
    assert!(
        of_type(&events, "egress_request").is_empty(),
        "not asked again"
    );
    let view = chat.gw.get_json(&chat.token, &egress_path).await;
    assert_eq!(view["allow"], json!(["registry.npmjs.org:443"]), "{view}");

    // Deny (which holds for the retry just after it), and no answer in time: refused, with the
    // reason.
    chat.accept("curl -sS -m 30 http://pypi.org/simple/; curl -sS -m 30 http://pypi.org/simple/")
        .await;
    let request = until_request(&mut chat, "the question about pypi.org:80").await;
    let request_id = request["request_id"].as_str().expect("id").to_owned();
    assert_eq!(
        chat.answer_permission(&request_id, "deny").await.status(),
        204
    );
    let rest = chat.until_turn_end("the denied curls").await;
    let output = agent_text(&rest);
    assert_eq!(
        output
            .matches("warren egress: pypi.org:80 refused (denied by the person)")
            .count(),
        2,
        "both refused: {output:?}"
    );
    assert!(
        of_type(&rest, "egress_request").is_empty(),
        "the retry just after the answer is not asked again"
    );
    chat.accept("curl -sS -m 30 http://files.pythonhosted.org/; echo \"F $?\"")
        .await;
    let request = until_request(&mut chat, "the question nobody answers").await;
    let rest = chat.until_turn_end("the unanswered curl").await;
    let resolved = of_type(&rest, "permission_resolved");
    assert!(
        resolved
            .iter()
            .any(|r| r["request_id"] == request["request_id"] && r["outcome"] == "timed_out"),
        "no answer in time is refused: {resolved:?}"
    );
    let output = agent_text(&rest);
    assert!(
        output.contains("files.pythonhosted.org:80 refused (the person did not answer in time)"),
        "{output:?}"
    );
    gw.stop().await;
}

#[tokio::test]
async fn the_sessions_rules_are_read_and_replaced_at_run_time() {
    let gw = in_bwrap(|args| {
        args.hands_egress_deny = vec!["*.example.com".parse().expect("rule")];
    })
    .await;
    let token = gw.register("phone-net-e").await;
    let session = gw.create_session(&token).await;
    let path = format!("/sessions/{session}/egress");
    let view = gw.get_json(&token, &path).await;
    assert_eq!(
        view,
        json!({"network": "private", "policy": "registries", "allow": [], "deny": ["*.example.com"],
               "credentials": [], "available_credentials": [], "ask_timeout_s": 60, "recent": []})
    );
    let (status, body) = put_egress(
        &gw,
        &token,
        &session,
        json!({"policy": "open", "allow": ["github.com", "bad rule"]}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["code"], "INVALID_EGRESS_RULE");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or("")
            .contains("\"bad rule\""),
        "the message names the rule: {body}"
    );
    for (bad, why) in [
        (json!({"policy": "sometimes"}), "an unknown policy"),
        (
            json!({"policy": "open", "allow": "github.com"}),
            "rules not in a list",
        ),
        (json!({"policy": "open", "extra": 1}), "an unknown field"),
        (json!({"policy": "open", "deny": ["*"]}), "a bare wildcard"),
        (json!({"policy": "open", "allow": ["host:0"]}), "port 0"),
        (json!({"allow": []}), "no policy"),
    ] {
        let (status, body) = put_egress(&gw, &token, &session, bad).await;
        assert_eq!(status, 400, "{why}: {body}");
    }
    let unchanged = gw.get_json(&token, &path).await;
    assert_eq!(
        unchanged["policy"], "registries",
        "a refused PUT changes nothing"
    );
    let (status, body) = put_egress(
        &gw,
        &token,
        &session,
        json!({"policy": "ask", "allow": ["*.npmjs.org:443", "[::1]:8080"], "deny": ["evil.test"]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["policy"], "ask");
    assert_eq!(body["allow"], json!(["*.npmjs.org:443", "[::1]:8080"]));
    assert_eq!(body["deny"], json!(["evil.test"]));
    assert_eq!(
        gw.get_json(&token, &path).await,
        body,
        "GET reads what PUT stored"
    );
    let kept = std::fs::read_to_string(gw.data.join("sessions").join(&session).join("egress.json"))
        .expect("the session's rules are kept beside it");
    assert!(kept.contains("evil.test"), "{kept}");

    let other = gw.register("phone-net-f").await;
    assert_eq!(
        gw.get(&other, &path).await.status(),
        404,
        "another device's session"
    );
    let (status, _) = put_egress(&gw, &other, &session, json!({"policy": "open"})).await;
    assert_eq!(status, 404);
    gw.stop().await;
}

#[tokio::test]
async fn host_network_is_said_in_the_session_and_has_no_rules_to_change() {
    let gw = in_bwrap(|args| args.hands_network = NetworkMode::Host).await;
    let token = gw.register("phone-net-h").await;
    let session = gw.create_session(&token).await;
    let info = gw.session_info(&token, &session).await;
    assert_eq!(info["network"], "host", "{info}");
    let view = gw
        .get_json(&token, &format!("/sessions/{session}/egress"))
        .await;
    assert_eq!(view["network"], "host");
    let (status, body) = put_egress(&gw, &token, &session, json!({"policy": "open"})).await;
    assert_eq!(status, 409);
    assert_eq!(body["code"], "NO_EGRESS_PROXY");
    gw.stop().await;
}

#[tokio::test]
async fn a_tunnel_open_while_the_hands_are_paused_carries_on_when_they_resume() {
    // An upstream that answers `pong` only when the test says so.
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0")
        .await
        .expect("an upstream on 127.0.0.2");
    let port = listener.local_addr().expect("addr").port();
    let (heard_tx, heard_rx) = tokio::sync::oneshot::channel::<String>();
    let (answer_tx, answer_rx) = tokio::sync::oneshot::channel::<()>();
    let upstream = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let (stream, _) = listener.accept().await.expect("the tunnel's connection");
        let (reader, mut writer) = stream.into_split();
        let mut line = String::new();
        BufReader::new(reader)
            .read_line(&mut line)
            .await
            .expect("reads the ping");
        let _ = heard_tx.send(line);
        let _ = answer_rx.await;
        writer.write_all(b"pong\n").await.expect("answers");
        // Held open until the test ends.
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
    });
    let gw = in_bwrap(|args| {
        args.hands_idle_pause = std::time::Duration::from_millis(700);
        args.hands_egress_allow = vec![format!("127.0.0.2:{port}").parse().expect("rule")];
    })
    .await;
    let mut chat = gw.conversation("phone-net-z").await;
    // A background client in the hands: a CONNECT tunnel through the proxy, `ping`, and the
    // line it gets back into answer.txt.
    let client = format!(
        "import socket\n\
         s = socket.create_connection(('127.0.0.1', 3128))\n\
         s.sendall(b'CONNECT 127.0.0.2:{port} HTTP/1.1\\r\\nHost: 127.0.0.2:{port}\\r\\n\\r\\n')\n\
         head = b''\n\
         while not head.endswith(b'\\r\\n\\r\\n'): head += s.recv(1)\n\
         s.sendall(b'ping\\n')\n\
         open('answer.txt', 'w').write(s.makefile().readline())\n"
    );
    std::fs::create_dir_all(chat.workspace()).expect("workspace");
    std::fs::write(chat.workspace().join("client.py"), client).expect("client.py");
    run_ok(
        &mut chat,
        "the background client",
        "setsid nohup python3 client.py >client.log 2>&1 </dev/null & echo started",
    )
    .await;
    let heard = within("the ping through the tunnel", heard_rx)
        .await
        .expect("the upstream heard");
    assert_eq!(heard, "ping\n");
    chat.until("the idle hands paused", |e| {
        e.event == "hands" && e.data["state"] == "paused"
    })
    .await;
    answer_tx.send(()).expect("the upstream waits");
    let (output, _) = run_ok(
        &mut chat,
        "the answer after the resume",
        "for i in $(seq 100); do [ -s answer.txt ] && break; sleep 0.1; done; cat answer.txt client.log",
    )
    .await;
    assert_eq!(output.trim(), "pong", "the tunnel carried on: {output:?}");
    upstream.abort();
    gw.stop().await;
}
