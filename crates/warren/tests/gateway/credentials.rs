//! Credentials at the edge (network.md "Credentials") with the real bwrap sandbox, the built-in
//! shell agent and real tools inside: curl, Python's `urllib` and `requests`, Node's `fetch` and
//! `git push` reach local HTTPS upstreams that answer only with the right header, while the
//! token never enters the sandbox, an event, the data directory (checkpoints included) or the
//! gateway's log at any level; a redirect to another host does not carry it; an upstream with a
//! certificate the gateway does not trust is refused saying how to trust it; a device the
//! credential is not offered to gets none, and a session can turn its credentials off.
//!
//! Upstreams: [`HttpsUpstream`] (Python's standard library) on other loopback addresses, with
//! certificates of a throwaway CA the gateway trusts through `--egress-upstream-ca`.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use base64::Engine as _;
use serde_json::{Value, json};
use warren_gateway::config::GatewayArgs;
use warren_test_support::tls::{HttpsUpstream, TestCa};

use super::helpers::{Conversation, LogBuffer, Received, TestGateway, files_under, in_bwrap};
use super::network::{self, of_type, put_egress};

/// The API token: it must never be seen anywhere the sandbox, the person or a file can see.
const CANARY: &str = "wrn-canary-7c41e09d2f5b";
/// The token of the second API (the redirect's target).
const OTHER_CANARY: &str = "wrn-canary-other-93ab51";
const GIT_USER: &str = "agent";
/// git's password (a `user:token` pair in the gateway's environment).
const GIT_CANARY: &str = "wrn-canary-git-0f6e2d";

/// The strings no place may hold: the tokens, and the encoded pair git's header carries.
fn secrets() -> Vec<String> {
    vec![
        CANARY.to_owned(),
        OTHER_CANARY.to_owned(),
        GIT_CANARY.to_owned(),
        base64::engine::general_purpose::STANDARD.encode(format!("{GIT_USER}:{GIT_CANARY}")),
    ]
}

fn lookup(variable: &str) -> Option<String> {
    match variable {
        "API_TOKEN" => Some(CANARY.to_owned()),
        "OTHER_TOKEN" => Some(OTHER_CANARY.to_owned()),
        "GIT_PAIR" => Some(format!("{GIT_USER}:{GIT_CANARY}")),
        _ => None,
    }
}

fn credential(spec: &str) -> warren_egress::Credential {
    warren_egress::Credential::parse(spec, lookup).expect("the test's credential parses")
}

/// The local upstreams: an API on 127.0.0.2 that needs `Authorization: Bearer CANARY`, another
/// on 127.0.0.3 that needs `X-Other-Token`, git on 127.0.0.4 behind Basic auth, and an API on
/// 127.0.0.5 whose certificate comes from a CA the gateway does not know.
struct Upstreams {
    dir: tempfile::TempDir,
    ca: PathBuf,
    api: HttpsUpstream,
    other: HttpsUpstream,
    git: HttpsUpstream,
    untrusted: HttpsUpstream,
}

impl Upstreams {
    async fn start() -> Upstreams {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = TestCa::new();
        let ca_path = ca.write_ca(dir.path());
        let server = |host: &str| {
            let sub = dir.path().join(host);
            std::fs::create_dir_all(&sub).expect("mkdir");
            ca.write_server(&sub, &[host])
        };
        let (cert, key) = server("127.0.0.2");
        let api = HttpsUpstream::start(
            "127.0.0.2",
            &cert,
            &key,
            &[
                "echo",
                "--require-header",
                &format!("Authorization: Bearer {CANARY}"),
            ],
        )
        .await;
        let (cert, key) = server("127.0.0.3");
        let other = HttpsUpstream::start(
            "127.0.0.3",
            &cert,
            &key,
            &[
                "echo",
                "--require-header",
                &format!("X-Other-Token: {OTHER_CANARY}"),
            ],
        )
        .await;
        let root = dir.path().join("git");
        make_bare_repo(&root);
        let (cert, key) = server("127.0.0.4");
        let git = HttpsUpstream::start(
            "127.0.0.4",
            &cert,
            &key,
            &[
                "git",
                "--root",
                root.to_str().expect("utf-8"),
                "--user",
                GIT_USER,
                "--password",
                GIT_CANARY,
            ],
        )
        .await;
        let stranger = TestCa::new();
        let sub = dir.path().join("127.0.0.5");
        std::fs::create_dir_all(&sub).expect("mkdir");
        let (cert, key) = stranger.write_server(&sub, &["127.0.0.5"]);
        let untrusted = HttpsUpstream::start(
            "127.0.0.5",
            &cert,
            &key,
            &[
                "echo",
                "--require-header",
                &format!("Authorization: Bearer {CANARY}"),
            ],
        )
        .await;
        Upstreams {
            dir,
            ca: ca_path,
            api,
            other,
            git,
            untrusted,
        }
    }

    /// The gateway's flags: the three credentials, the upstreams' CA, and an exact allow rule
    /// per upstream (they are loopback addresses).
    fn configure(&self, args: &mut GatewayArgs) {
        args.hands_credential = vec![
            credential("api=127.0.0.2,127.0.0.5:Authorization:Bearer $API_TOKEN"),
            credential("other=127.0.0.3:X-Other-Token:$OTHER_TOKEN"),
            credential("git=127.0.0.4:Authorization:Basic $GIT_PAIR"),
        ];
        args.egress_upstream_ca = vec![self.ca.clone()];
        args.hands_egress_allow = [
            ("127.0.0.2", self.api.port),
            ("127.0.0.3", self.other.port),
            ("127.0.0.4", self.git.port),
            ("127.0.0.5", self.untrusted.port),
        ]
        .iter()
        .map(|(host, port)| format!("{host}:{port}").parse().expect("rule"))
        .collect();
    }

    fn bare_repo(&self) -> PathBuf {
        self.dir.path().join("git").join("repo.git")
    }
}

/// `<root>/repo.git` with one commit on `main`.
fn make_bare_repo(root: &Path) {
    let work = root.join("work");
    std::fs::create_dir_all(&work).expect("mkdir");
    let git = |args: &[&str], dir: &Path| {
        let status = std::process::Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", root)
            .stdout(Stdio::null())
            .status()
            .expect("git runs");
        assert!(status.success(), "git {args:?}");
    };
    git(&["init", "-q", "-b", "main"], &work);
    std::fs::write(work.join("hello.txt"), "hello over https\n").expect("write");
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
        root,
    );
}

thread_local! {
    /// Every event a test's turns returned, as JSON text (each test runs on its own thread).
    static SEEN: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// [`network::run_ok`], keeping what the turn returned for the test's search of the events.
async fn run_ok(chat: &mut Conversation<'_>, what: &str, command: &str) -> (String, Vec<Received>) {
    let (output, events) = network::run_ok(chat, what, command).await;
    SEEN.with(|seen| {
        let mut seen = seen.borrow_mut();
        for event in &events {
            seen.push_str(&event.data.to_string());
            seen.push('\n');
        }
    });
    (output, events)
}

async fn egress(gw: &TestGateway, token: &str, session: &str) -> Value {
    let response = gw
        .request(
            reqwest::Method::GET,
            token,
            &format!("/sessions/{session}/egress"),
        )
        .send()
        .await
        .expect("GET egress");
    assert_eq!(response.status(), 200);
    response.json().await.expect("JSON")
}

/// The text of `path`, zstd-compressed files (snapshots, checkpoint chunks and manifests: any
/// file that starts with a zstd frame) decompressed.
fn readable_text(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    let bytes = if bytes.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        zstd::decode_all(bytes.as_slice()).unwrap_or(bytes)
    } else {
        bytes
    };
    String::from_utf8_lossy(&bytes).into_owned()
}

#[tokio::test]
async fn tools_in_the_hands_use_credentials_they_never_see() {
    // This test's runtime runs on this thread only: every task of the gateway logs here.
    let logs = LogBuffer::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);

    let up = Upstreams::start().await;
    let gw = in_bwrap(|args| {
        up.configure(args);
        // The hands are archived (their files checkpointed) once the turns are over.
        args.hands_idle_pause = std::time::Duration::from_secs(2);
        args.hands_archive_after = std::time::Duration::from_secs(1);
    })
    .await;
    let mut chat = gw.conversation("phone-cred-a").await;
    let (api, other, git, untrusted) = (up.api.port, up.other.port, up.git.port, up.untrusted.port);

    let view = egress(&gw, &chat.token, &chat.session).await;
    assert_eq!(view["credentials"], json!(["api", "other", "git"]));
    assert_eq!(
        view["available_credentials"][0],
        json!({"name": "api", "hosts": ["127.0.0.2", "127.0.0.5"], "header": "authorization", "enabled": true})
    );
    assert!(
        !view.to_string().contains("wrn-canary"),
        "the view names credentials, never values: {view}"
    );

    // curl: the header the sandbox sends is replaced; the echoed value comes back masked.
    let (output, events) = run_ok(
        &mut chat,
        "curl with a credential",
        &format!(
            "curl -sS -H 'Authorization: Bearer made-up' 'https://127.0.0.2:{api}/v1/thing?page=2'; echo; \
             curl -sS -D - https://127.0.0.2:{api}/echo-header; echo; \
             curl -sS -L 'https://127.0.0.2:{api}/redirect?to=https://127.0.0.3:{other}/landed'; echo"
        ),
    )
    .await;
    assert!(
        output.contains("\"path\": \"/v1/thing?page=2\"")
            || output.contains("\"path\":\"/v1/thing?page=2\""),
        "the API answered the request: {output:?}"
    );
    assert!(
        !output.contains("made-up") && !output.contains("401"),
        "the sandbox's own header was replaced by the credential: {output:?}"
    );
    assert!(
        output.contains("x-echo: ******"),
        "the echoed value is masked in the headers: {output:?}"
    );
    let landed = output
        .lines()
        .find(|line| line.contains("/landed"))
        .unwrap_or_else(|| panic!("the redirect was followed: {output:?}"));
    let landed: Value = serde_json::from_str(landed).expect("the other API's JSON");
    assert_eq!(
        landed["headers"]["authorization"],
        Value::Null,
        "the redirect to another host carries no credential of the first: {landed}"
    );
    assert!(
        landed["headers"]["x-other-token"]
            .as_str()
            .is_some_and(|v| v.chars().all(|c| c == '*')),
        "the other host gets its own credential, masked in the echo: {landed}"
    );
    let used = of_type(&events, "credential_used");
    assert!(
        used.contains(&&json!({"type": "credential_used", "name": "api", "host": "127.0.0.2", "method": "GET", "path": "/v1/thing", "status": 200}))
            || used.iter().any(|u| u["name"] == "api" && u["path"] == "/v1/thing" && u["status"] == 200 && u["method"] == "GET"),
        "each request that carried a credential is an event, its path without the query: {used:?}"
    );
    assert!(
        used.iter()
            .any(|u| u["name"] == "api" && u["path"] == "/redirect" && u["status"] == 302),
        "the redirect's request is one too: {used:?}"
    );
    assert!(
        used.iter()
            .any(|u| u["name"] == "other" && u["host"] == "127.0.0.3" && u["path"] == "/landed"),
        "and the other host's: {used:?}"
    );

    // Python's urllib and requests (pip's own copy), Node's fetch.
    let (output, _) = run_ok(
        &mut chat,
        "python and node with a credential",
        &format!(
            "python3 -c \"import urllib.request; print('URLLIB', urllib.request.urlopen('https://127.0.0.2:{api}/urllib').status)\"; \
             python3 -c \"from pip._vendor import requests; r = requests.get('https://127.0.0.2:{api}/requests'); print('REQUESTS', r.status_code)\"; \
             mkdir -p /tmp/node && cd /tmp/node && npm install --silent --no-audit --no-fund undici@6.21.3 >/dev/null 2>&1; \
             node -e \"const u = require('undici'); u.setGlobalDispatcher(new u.EnvHttpProxyAgent()); fetch('https://127.0.0.2:{api}/fetch').then(r => console.log('FETCH', r.status), e => console.log('FETCH failed', e.cause || e))\""
        ),
    )
    .await;
    for line in ["URLLIB 200", "REQUESTS 200", "FETCH 200"] {
        assert!(output.contains(line), "{line}: {output:?}");
    }

    // git over smart HTTP: clone and push with no credential helper and no token inside.
    let (output, events) = run_ok(
        &mut chat,
        "git clone and push with a credential",
        &format!(
            "cd /workspace && git clone -q https://127.0.0.4:{git}/repo.git cloned && cd cloned && \
             echo pushed > pushed.txt && git add pushed.txt && \
             git -c user.name=agent -c user.email=agent@warren commit -qm 'pushed from the hands' && \
             git push -q origin HEAD:main && echo PUSHED; git config --list --show-origin | grep -i cred; true"
        ),
    )
    .await;
    assert!(output.contains("PUSHED"), "git pushed: {output:?}");
    assert!(
        !output.to_lowercase().contains("credential"),
        "no credential helper is configured: {output:?}"
    );
    let log = std::process::Command::new("git")
        .args(["log", "--format=%s", "main"])
        .current_dir(up.bare_repo())
        .output()
        .expect("git log runs");
    assert!(
        String::from_utf8_lossy(&log.stdout).contains("pushed from the hands"),
        "the push reached the server"
    );
    let used = of_type(&events, "credential_used");
    assert!(
        used.iter().any(|u| u["name"] == "git"
            && u["method"] == "POST"
            && u["path"] == "/repo.git/git-receive-pack"
            && u["status"] == 200),
        "the push is on the person's stream: {used:?}"
    );

    // An upstream whose certificate the gateway does not trust: refused, saying how to trust it.
    let (output, events) = run_ok(
        &mut chat,
        "an untrusted upstream",
        &format!("curl -sS https://127.0.0.5:{untrusted}/; echo \"EXIT $?\""),
    )
    .await;
    assert!(
        output.contains("--egress-upstream-ca") && output.contains("127.0.0.5"),
        "the tool is told why and how: {output:?}"
    );
    assert!(
        up.untrusted.requests().is_empty(),
        "nothing reached the untrusted upstream: {:?}",
        up.untrusted.requests()
    );
    assert!(
        of_type(&events, "egress")
            .iter()
            .any(|e| e["host"] == "127.0.0.5" && e["decision"] == "refused"),
        "the refusal is an egress event"
    );

    // Nothing of the token inside: environment, processes, files, the CA's key. The command
    // carries the tokens base64-encoded, so its own command line holds none of them.
    let encoded: Vec<String> = [CANARY, OTHER_CANARY, GIT_CANARY]
        .iter()
        .map(|secret| base64::engine::general_purpose::STANDARD.encode(secret))
        .collect();
    let (output, _) = run_ok(
        &mut chat,
        "the sandbox holds no token",
        &format!(
            "for e in {encoded}; do s=$(echo $e | base64 -d); \
               env | grep -F \"$s\"; grep -s -l -F \"$s\" /proc/[0-9]*/environ /proc/[0-9]*/cmdline; \
               grep -r -s -l -F \"$s\" /workspace /tmp /home /run/warren /etc/ssl; \
             done; \
             grep -c 'PRIVATE KEY' /etc/ssl/certs/ca-certificates.crt; \
             sha256sum < /etc/ssl/certs/ca-certificates.crt; \
             test -e {data}/egress-ca/ca.key && echo KEY-VISIBLE; true",
            encoded = encoded.join(" "),
            data = gw.data.display()
        ),
    )
    .await;
    let bundle = std::fs::read(gw.data.join("egress-ca").join("bundle.pem")).expect("the bundle");
    let bundle_sum = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(&bundle))
    };
    assert_eq!(
        output.trim(),
        format!("0\n{bundle_sum}  -"),
        "no token or key in the sandbox, whose trust store is the bundle with the CA: {output:?}"
    );
    let ca = std::fs::read_to_string(gw.data.join("egress-ca").join("ca.pem")).expect("the CA");
    assert!(
        String::from_utf8_lossy(&bundle).ends_with(&ca),
        "the bundle ends with the CA"
    );

    // The hands archived: their checkpoint is part of what is searched below.
    let rest = chat
        .until("the hands archived", |e| {
            e.event == "hands" && e.data["state"] == "archived"
        })
        .await;
    let mut all_events = SEEN.with(|seen| seen.borrow().clone());
    for event in &rest {
        all_events.push_str(&event.data.to_string());
    }
    let data = gw.data.clone();
    let session = chat.session.clone();
    drop(chat);
    let _data_dir = gw.stop().await;

    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(data.join("egress-ca").join("ca.key"))
            .expect("the CA key is kept")
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "the CA key is the gateway's alone");
    let logged =
        String::from_utf8_lossy(&logs.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned();
    assert!(
        logged.contains("credential_used") || logged.contains("egress"),
        "the log was captured"
    );
    let files = files_under(&data);
    let chunks = data
        .join("sessions")
        .join(&session)
        .join("checkpoints/workspace/chunks");
    assert!(
        files.iter().any(|f| f.starts_with(&chunks)),
        "the chunks of session {session}'s checkpoints are among the files searched"
    );
    for secret in secrets() {
        assert!(
            !all_events.contains(&secret),
            "{secret} in the session's events"
        );
        assert!(!logged.contains(&secret), "{secret} in the gateway's log");
        for path in &files {
            assert!(
                !readable_text(path).contains(&secret),
                "{secret} in {}",
                path.display()
            );
        }
    }
}

#[tokio::test]
async fn a_credential_reaches_only_the_devices_it_is_offered_to_and_a_session_can_turn_it_off() {
    let up = Upstreams::start().await;
    let gw = in_bwrap(|args| {
        up.configure(args);
        args.hands_credential_devices =
            vec![("api".to_owned(), vec!["phone-cred-owner".to_owned()])];
    })
    .await;
    let api = up.api.port;
    let call = format!(
        "curl -sS -o /dev/null -w 'STATUS %{{http_code}}\\n' https://127.0.0.2:{api}/scoped 2>&1; true"
    );

    // Another device's session: not offered, so not injected (the host's own certificate,
    // which the sandbox does not trust, and no header reaches the API).
    let mut stranger = gw.conversation("phone-cred-stranger").await;
    let view = egress(&gw, &stranger.token, &stranger.session).await;
    assert_eq!(view["credentials"], json!(["other", "git"]));
    let (status, body) = put_egress(
        &gw,
        &stranger.token,
        &stranger.session,
        json!({"policy": "registries", "allow": view["allow"], "credentials": ["api"]}),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("UNKNOWN_CREDENTIAL")),
        "{body}"
    );
    let (output, _) = run_ok(&mut stranger, "a device not offered the credential", &call).await;
    assert!(
        output.contains("SSL certificate problem") || output.contains("(60)"),
        "an opaque tunnel: the sandbox does not trust the API's own certificate: {output:?}"
    );

    // The owner's session, with the credential on, off and on again.
    let mut owner = gw.conversation("phone-cred-owner").await;
    let (output, _) = run_ok(&mut owner, "the owner's session", &call).await;
    assert!(output.contains("STATUS 200"), "{output:?}");
    let view = egress(&gw, &owner.token, &owner.session).await;
    let (status, body) = put_egress(
        &gw,
        &owner.token,
        &owner.session,
        json!({"policy": "registries", "allow": view["allow"], "credentials": ["git"]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["credentials"], json!(["git"]));
    assert_eq!(body["available_credentials"][0]["enabled"], json!(false));
    let (output, events) = run_ok(&mut owner, "the credential turned off", &call).await;
    assert!(
        output.contains("(60)") || output.contains("SSL certificate problem"),
        "turned off, the tunnel is opaque: {output:?}"
    );
    assert!(of_type(&events, "credential_used").is_empty());
    // Kept: the session's rules file says which are off (and holds no value).
    let kept = std::fs::read_to_string(
        gw.data
            .join("sessions")
            .join(&owner.session)
            .join("egress.json"),
    )
    .unwrap_or_default();
    assert!(
        kept.contains("\"credentials_off\":[\"api\",\"other\"]") || kept.contains("api"),
        "{kept}"
    );
    // A PUT without `credentials` leaves them as they are.
    let (status, body) = put_egress(
        &gw,
        &owner.token,
        &owner.session,
        json!({"policy": "registries", "allow": view["allow"]}),
    )
    .await;
    assert_eq!((status, body["credentials"].clone()), (200, json!(["git"])));
    let (status, _) = put_egress(
        &gw,
        &owner.token,
        &owner.session,
        json!({"policy": "registries", "allow": view["allow"], "credentials": ["api", "git"]}),
    )
    .await;
    assert_eq!(status, 200);
    let (output, _) = run_ok(&mut owner, "the credential on again", &call).await;
    assert!(output.contains("STATUS 200"), "{output:?}");
    assert!(
        up.api
            .requests()
            .iter()
            .all(|line| !line.contains("/scoped") || line.ends_with("=present")),
        "no request reached the API without the credential: {:?}",
        up.api.requests()
    );
    drop((stranger, owner));
    gw.stop().await;
}
