//! schemathesis against a real execd (its own test binary: the exec routes run the daemon's
//! reaper), served by `warren_execd::serve` with its timeouts and panic catcher on a temp root,
//! with an access token: every operation of `/openapi.json`, generated valid and invalid
//! inputs, every check schemathesis has (no 5xx, responses and statuses as documented, error
//! bodies `ErrorBody`, the token enforced, invalid input refused and valid input accepted).
//!
//! Bounded to finish in well under a minute on two cores, with a fixed seed. To run it longer
//! by hand, start a daemon (`warren execd --root $(mktemp -d) --access-token t`) and run
//! `target/warren-pyenv/bin/schemathesis run http://127.0.0.1:PORT/openapi.json -H
//! 'X-EXECD-ACCESS-TOKEN: t' --checks all --mode all --max-examples 500` (add
//! `--exclude-path /v1/files/watch`).

// Tests start real programs (shells, servers, the binary under test) directly.
#![allow(clippy::disallowed_methods)]

use std::path::PathBuf;

use warren_execd::{Config, Execd};

const TOKEN: &str = "schemathesis-token";

/// Operations schemathesis cannot test, each with why.
const EXCLUDED_PATHS: &[(&str, &str)] = &[(
    "/v1/files/watch",
    "an endless NDJSON stream: schemathesis reads a response to its end",
)];

/// schemathesis's configuration: which operations may refuse schema-valid input with a 400,
/// because the schema cannot say what the server checks against the world or beyond JSON
/// Schema. Everything else must accept every schema-valid request.
const CONFIG: &str = r#"
# A working directory that must exist, environment names without `=`, integers written as
# `1.0` (JSON Schema's integers include them, serde's do not).
[[operations]]
include-path = ["/v1/exec", "/v1/terminals", "/pty", "/v1/exec/{session_id}/stdin"]
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409", "429"]

# schemathesis sends plain GETs, never a WebSocket handshake: a documented 426 is the answer.
[[operations]]
include-path = ["/pty/{id}/ws", "/v1/agent-terminals/{name}/ws"]
checks.positive_data_acceptance.expected-statuses = ["101", "401", "404", "409", "426"]

# Random bytes are no snapshot: only a real archive restores.
[[operations]]
include-path = "/v1/workspace/restore"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "409"]

# Random bytes are no patch either: only one a checkpoint store wrote applies.
[[operations]]
include-path = "/v1/workspace/patch"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "409"]
"#;

/// Operations whose path names something that exists, so they reach more than their 404: a PTY
/// session and a terminal made before the run (one of each to read, one to delete). Exec
/// sessions are not seeded: an empty poll of a running one may wait up to 300 s, as specified.
fn seeded(ids: &Seeded) -> String {
    let Seeded {
        pty,
        pty_to_delete,
        terminal,
        terminal_to_release,
    } = ids;
    format!(
        r#"
[[operations]]
include-path = ["/pty/{{id}}", "/pty/{{id}}/ws"]
include-method = "GET"
parameters = {{ "path.id" = "{pty}" }}

[[operations]]
include-path = "/pty/{{id}}"
include-method = "DELETE"
parameters = {{ "path.id" = "{pty_to_delete}" }}

[[operations]]
include-path = ["/v1/terminals/{{terminal_id}}/output", "/v1/terminals/{{terminal_id}}/kill"]
parameters = {{ "path.terminal_id" = "{terminal}" }}

[[operations]]
include-path = "/v1/terminals/{{terminal_id}}"
include-method = "DELETE"
parameters = {{ "path.terminal_id" = "{terminal_to_release}" }}

[[operations]]
include-path = "/v1/agent-terminals/{{name}}/ws"
parameters = {{ "path.name" = "term-{terminal}" }}
"#
    )
}

struct Seeded {
    pty: String,
    pty_to_delete: String,
    terminal: String,
    terminal_to_release: String,
}

/// Makes what [`seeded`] names, over the real routes.
async fn seed(base: &str) -> Seeded {
    let http = reqwest::Client::new();
    let post = async |path: &str, body: serde_json::Value, field: &str| -> String {
        let response = http
            .post(format!("{base}{path}"))
            .header("X-EXECD-ACCESS-TOKEN", TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        assert!(
            response.status().is_success(),
            "POST {path}: {}",
            response.status()
        );
        let answer: serde_json::Value = response.json().await.expect("a JSON answer");
        answer[field].as_str().expect("an id").to_owned()
    };
    let terminal = serde_json::json!({ "command": "echo seeded" });
    let seeded = Seeded {
        pty: post("/pty", serde_json::json!({}), "session_id").await,
        pty_to_delete: post("/pty", serde_json::json!({}), "session_id").await,
        terminal: post("/v1/terminals", terminal.clone(), "terminal_id").await,
        terminal_to_release: post("/v1/terminals", terminal, "terminal_id").await,
    };
    // The terminal the run reads has exited before the run starts: every `wait_ms` on it then
    // answers at once, and a terminal that never finishes fails here, named, not as a timeout
    // of some request in the middle of the run.
    let exited = terminal_state(&http, base, &seeded.terminal, 20_000).await;
    assert!(
        exited["exit_status"].is_object(),
        "the seeded terminal `echo seeded` did not finish within 20 s: {exited}"
    );
    seeded
}

/// `GET /v1/terminals/{id}/output?wait_ms=…` as JSON (or what went wrong, as a string).
async fn terminal_state(
    http: &reqwest::Client,
    base: &str,
    id: &str,
    wait_ms: u64,
) -> serde_json::Value {
    let answer = http
        .get(format!("{base}/v1/terminals/{id}/output?wait_ms={wait_ms}"))
        .header("X-EXECD-ACCESS-TOKEN", TOKEN)
        .timeout(std::time::Duration::from_millis(wait_ms + 10_000))
        .send()
        .await;
    match answer {
        Ok(answer) => answer
            .json()
            .await
            .unwrap_or_else(|e| format!("not JSON: {e}").into()),
        Err(e) => format!("no answer: {e}").into(),
    }
}

/// What the daemon says of its terminals, and the processes it has, for a failed run.
async fn diagnosis(base: &str, ids: &Seeded) -> String {
    let http = reqwest::Client::new();
    let seeded = terminal_state(&http, base, &ids.terminal, 0).await;
    let list = http
        .get(format!("{base}/v1/terminals"))
        .header("X-EXECD-ACCESS-TOKEN", TOKEN)
        .timeout(std::time::Duration::from_secs(10))
        .send()
        .await;
    let list = match list {
        Ok(answer) => answer.text().await.unwrap_or_default(),
        Err(e) => format!("no answer: {e}"),
    };
    let me = std::process::id().to_string();
    let children: Vec<String> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("stat")).ok())
        .filter(|stat| {
            // `pid (comm) state ppid …`: the comm may hold spaces, so split after its `)`.
            let after = stat.rsplit_once(") ").map(|(_, rest)| rest).unwrap_or("");
            after.split(' ').nth(1) == Some(me.as_str())
        })
        .collect();
    format!(
        "the seeded terminal now: {seeded}\nthe terminals: {list}\nthis process's children:\n{}",
        children.join("")
    )
}

/// Examples per operation and phase; the seed makes a run repeatable.
const MAX_EXAMPLES: &str = "30";
const SEED: &str = "17";

async fn start_execd(root: &std::path::Path, home: &std::path::Path) -> String {
    warren_process::reaper::start().expect("become subreaper and start reaping");
    let config = Config {
        root: root.to_path_buf(),
        home: Some(home.to_path_buf()),
        access_token: Some(TOKEN.to_owned()),
        ..Config::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds 127.0.0.1:0");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(warren_execd::serve(
        Execd::new(config),
        listener,
        std::future::pending(),
    ));
    format!("http://{addr}")
}

fn schemathesis() -> PathBuf {
    warren_test_support::python()
        .parent()
        .expect("the venv's bin directory")
        .join("schemathesis")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_no_defect_in_any_operation() {
    let root = tempfile::tempdir().expect("temp root");
    let home = tempfile::tempdir().expect("temp home");
    let base = start_execd(root.path(), home.path()).await;
    let reports = tempfile::tempdir().expect("report dir");
    let junit = reports.path().join("junit.xml");
    let stdout_path = reports.path().join("stdout");
    let config = reports.path().join("schemathesis.toml");
    let ids = seed(&base).await;
    std::fs::write(&config, format!("{CONFIG}{}", seeded(&ids))).expect("writes the configuration");
    let mut command = std::process::Command::new(schemathesis());
    command
        .arg("--config-file")
        .arg(&config)
        .arg("run")
        .arg(format!("{base}/openapi.json"))
        .args(["--header", &format!("X-EXECD-ACCESS-TOKEN: {TOKEN}")])
        .args(["--checks", "all", "--mode", "all"])
        .args(["--max-examples", MAX_EXAMPLES, "--seed", SEED])
        .args(["--phases", "examples,coverage,fuzzing"])
        .args(["--workers", "1", "--request-timeout", "20"])
        .args(["--report", "junit"])
        .arg("--report-junit-path")
        .arg(&junit)
        .args(["--no-color", "--output-truncate", "false"])
        .current_dir(reports.path())
        .env("SCHEMATHESIS_TELEMETRY", "false")
        .stdout(std::fs::File::create(&stdout_path).expect("a stdout file"))
        .stderr(std::process::Stdio::inherit());
    for (path, _why) in EXCLUDED_PATHS {
        command.args(["--exclude-path", path]);
    }
    // Owned, so this binary's subreaper leaves its exit status to the wait below.
    let status =
        tokio::task::spawn_blocking(move || warren_test_support::status_owned(&mut command))
            .await
            .expect("the schemathesis thread");
    let output = std::fs::read_to_string(&stdout_path).unwrap_or_default();
    println!("{output}");
    let status = status.unwrap_or_else(|e| panic!("cannot run schemathesis: {e}"));
    if !status.success() {
        panic!(
            "schemathesis failed: {status}\n{}",
            diagnosis(&base, &ids).await
        );
    }
    let report = std::fs::read_to_string(&junit).expect("schemathesis wrote its report");
    assert!(report.contains("<testsuite"), "{report}");
    assert!(
        report.contains(r#"failures="0""#) && report.contains(r#"errors="0""#),
        "schemathesis found defects:\n{output}"
    );
}
