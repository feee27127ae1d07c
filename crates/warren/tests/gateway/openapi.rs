//! The gateway's OpenAPI document (`GET /openapi.json`) kept true: OpenAPI 3.1 with the crate's
//! version, served without a token; every operation in it is routed; every route of the router
//! is in it but the deliberate exclusions (`warren_gateway::openapi::UNDOCUMENTED`, each checked
//! to be routed too); every operation declares its errors with Warren's `{code,message}` body.
//! And schemathesis (the pinned Python environment) run against a real gateway: every
//! operation, valid and invalid generated inputs, every check it has.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::Value;
use warren_gateway::openapi::UNDOCUMENTED;
use warren_test_support::repo_root;

use super::helpers::{TestGateway, args_without_agent, assert_error, files_under, warren_bin};

/// The methods an OpenAPI path item may hold.
const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "patch", "head", "options", "trace",
];

/// `(method, path, operation)` of every operation of `document`.
fn operations(document: &Value) -> Vec<(String, String, Value)> {
    let paths = document["paths"]
        .as_object()
        .expect("paths in the document");
    let mut found = Vec::new();
    for (path, item) in paths {
        for method in METHODS {
            if let Some(operation) = item.get(method) {
                found.push((method.to_owned(), path.clone(), operation.clone()));
            }
        }
    }
    found
}

async fn fetch_document(gw: &TestGateway) -> Value {
    let response = gw.get_plain("/openapi.json").await;
    assert_eq!(
        response.status(),
        200,
        "the document is served without a token"
    );
    assert_eq!(
        response.headers()["content-type"],
        "application/json",
        "the document is JSON"
    );
    response.json().await.expect("the document parses")
}

#[tokio::test]
async fn the_document_passes_openapi_spec_validator_with_unique_operation_ids() {
    let gw = TestGateway::start(args_without_agent).await;
    let document = fetch_document(&gw).await;
    // The validator refuses an operation id used twice (DuplicateOperationIDError).
    warren_test_support::validate_openapi("gateway", &document.to_string());
}

#[tokio::test]
async fn the_document_is_openapi_3_1_with_the_version_and_the_credential_schemes() {
    let gw = TestGateway::start(args_without_agent).await;
    let document = fetch_document(&gw).await;
    let version = document["openapi"].as_str().expect("openapi version");
    assert!(version.starts_with("3.1."), "OpenAPI 3.1, not {version}");
    assert_eq!(document["info"]["version"], env!("CARGO_PKG_VERSION"));
    let schemes = &document["components"]["securitySchemes"];
    assert_eq!(schemes["device_token"]["scheme"], "bearer");
    assert_eq!(schemes["admin_token"]["scheme"], "bearer");
    assert_eq!(schemes["device_token_query"]["in"], "query");
    assert_eq!(schemes["device_token_query"]["name"], "access_token");
    assert_eq!(schemes["app_key"]["in"], "header");
    assert_eq!(schemes["app_key"]["name"], "X-App-Key");
    let description = document["info"]["description"].as_str().unwrap_or("");
    for route in UNDOCUMENTED {
        assert!(
            description.contains(route.path),
            "the description names the left-out {}",
            route.path
        );
    }
    assert!(
        !document.to_string().contains(&gw.app_key),
        "no secret in the document"
    );
    gw.stop().await;
}

/// `path` with every `{param}` replaced by a sample that reaches the handler.
fn sample_path(path: &str, session: &str, device_id: &str) -> String {
    path.replace("{id}", session)
        .replace("{device_id}", device_id)
        // An agent's terminal name: refused with TERMINAL_NOT_FOUND, no hands started.
        .replace("{name}", "term-1")
        .replace("{port}", "3000")
        .replace("{request_id}", "no-such-request")
}

/// Whether `response` is the router's own 404 (no route) or 405 (no such method).
async fn unrouted(response: reqwest::Response) -> Option<String> {
    let status = response.status();
    if status != 404 && status != 405 {
        return None;
    }
    let body: Value = response.json().await.unwrap_or(Value::Null);
    match body["code"].as_str() {
        Some("NOT_FOUND" | "METHOD_NOT_ALLOWED") => Some(format!("{status} {body}")),
        _ => None,
    }
}

#[tokio::test]
async fn every_documented_operation_is_routed() {
    let gw = TestGateway::start(args_without_agent).await;
    let token = gw.register("openapi-routes-01").await;
    let session = gw.create_session(&token).await;
    let doomed = gw.create_session(&token).await;
    let document = fetch_document(&gw).await;
    let operations = operations(&document);
    assert!(operations.len() >= 25, "{} operations", operations.len());
    for (method, path, operation) in operations {
        // The delete goes to a session of its own, so the others still reach theirs.
        let on = match (method.as_str(), path.as_str()) {
            ("delete", "/v1/sessions/{id}") => &doomed,
            _ => &session,
        };
        let url = format!("{}{}", gw.url, sample_path(&path, on, "openapi-routes-01"));
        let admin = path.starts_with("/v1/admin");
        let bearer = if admin { "test-admin-token" } else { &token };
        let method = Method::from_bytes(method.to_uppercase().as_bytes()).expect("a method");
        let response = gw
            .http
            .request(method.clone(), &url)
            .bearer_auth(bearer)
            .header("X-App-Key", &gw.app_key)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
        if let Some(answer) = unrouted(response).await {
            panic!(
                "{method} {path} ({}) is documented but not routed: {answer}",
                operation["operationId"]
            );
        }
    }
    gw.stop().await;
}

/// The paths of every plain axum `.route("…"` call in the gateway's source and the model
/// proxy's (whose routes the gateway serves): the routes that `utoipa_axum::routes!` does not
/// register.
fn plain_routes_in_source() -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let files = ["crates/gateway/src", "crates/model-proxy/src"]
        .into_iter()
        .flat_map(|dir| files_under(&repo_root().join(dir)));
    for file in files {
        if file.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("gateway source");
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for (at, _) in code.match_indices(".route(") {
            let rest = code[at + ".route(".len()..].trim_start();
            let path = rest
                .strip_prefix('"')
                .and_then(|rest| rest.split('"').next())
                .unwrap_or_else(|| panic!("{}: a .route( without a literal path", file.display()));
            found.insert(path.to_owned());
        }
        for call in [".route_service(", ".nest(", ".nest_service("] {
            assert!(
                !code.contains(call),
                "{}: {call} routes that neither the document nor the check sees",
                file.display()
            );
        }
    }
    found
}

#[tokio::test]
async fn every_route_is_documented_but_the_deliberate_exclusions() {
    let gw = TestGateway::start(args_without_agent).await;
    let document = fetch_document(&gw).await;
    let documented: BTreeSet<String> = document["paths"]
        .as_object()
        .expect("paths")
        .keys()
        .cloned()
        .collect();
    let excluded: BTreeSet<String> = UNDOCUMENTED.iter().map(|r| r.path.to_owned()).collect();
    let plain = plain_routes_in_source();
    assert_eq!(
        plain, excluded,
        "the plain axum routes are exactly the deliberate exclusions; a new route goes through \
         routes! with #[utoipa::path], or into UNDOCUMENTED with its reason"
    );
    for path in &excluded {
        assert!(
            !documented.contains(path),
            "{path} is excluded and documented"
        );
    }
    // Each exclusion is really served (not the unknown-route 404).
    let token = gw.register("openapi-excluded-01").await;
    for (path, sample) in [
        ("/", "/".to_owned()),
        ("/console/{*path}", "/console/main.js".to_owned()),
        ("/manifest.webmanifest", "/manifest.webmanifest".to_owned()),
        ("/sw.js", "/sw.js".to_owned()),
        (
            "/v1/model/{provider}/{*rest}",
            "/v1/model/anthropic/v1/messages".to_owned(),
        ),
    ] {
        assert!(excluded.contains(path), "{path} is an exclusion");
        let response = gw
            .http
            .get(format!("{}{sample}", gw.url))
            .bearer_auth(&token)
            .send()
            .await
            .expect("a request to an excluded route");
        if let Some(answer) = unrouted(response).await {
            panic!("the excluded {path} is not routed: {answer}");
        }
    }
    assert_eq!(excluded.len(), 5, "every exclusion is probed above");
    gw.stop().await;
}

/// The schema reference of a response's JSON body, if it has one.
fn json_schema_ref(response: &Value) -> Option<&str> {
    response["content"]["application/json"]["schema"]["$ref"].as_str()
}

#[tokio::test]
async fn every_operation_declares_its_errors_with_the_error_body() {
    let gw = TestGateway::start(args_without_agent).await;
    let document = fetch_document(&gw).await;
    for (method, path, operation) in operations(&document) {
        let what = format!("{method} {path}");
        let responses = operation["responses"].as_object().expect("responses");
        let errors: Vec<&String> = responses
            .keys()
            .filter(|status| status.starts_with('4') || status.starts_with('5'))
            .collect();
        assert!(!errors.is_empty(), "{what} declares no error response");
        for status in errors {
            let schema = json_schema_ref(&responses[status]);
            // `/healthz`'s 503 is its own documented body, the storage's state.
            let expected = match (path.as_str(), status.as_str()) {
                ("/healthz", "503") => "#/components/schemas/HealthDegraded",
                _ => "#/components/schemas/ErrorBody",
            };
            assert_eq!(schema, Some(expected), "{what} {status}");
        }
        assert!(responses.contains_key("500"), "{what}: a panic's 500");
        let secured = operation["security"]
            .as_array()
            .is_some_and(|list| !list.is_empty());
        if secured {
            assert!(responses.contains_key("401"), "{what} takes a credential");
        }
        if path.contains("{id}") || path.contains("{device_id}") {
            assert!(responses.contains_key("404"), "{what} names a resource");
        }
        if operation.get("requestBody").is_some() || operation.get("parameters").is_some() {
            let takes_input = operation["parameters"]
                .as_array()
                .is_some_and(|list| list.iter().any(|p| p["in"] != "header"))
                || operation.get("requestBody").is_some();
            if takes_input {
                assert!(responses.contains_key("400"), "{what} reads input");
            }
        }
    }
    gw.stop().await;
}

/// Seconds schemathesis may take at most; the bound `--max-examples` keeps it well inside on
/// two cores.
const SCHEMATHESIS_WAIT: Duration = Duration::from_secs(300);

/// schemathesis against a real gateway: every operation of the document with generated valid
/// and invalid inputs (`--mode all`), all of its checks: no 5xx, responses (status, content
/// type, headers, body) as documented, invalid input refused and valid input accepted, the
/// credentials enforced, and the unsupported methods answered 405 with `Allow`. A fixed seed, so
/// a failure is the same failure again. To run it longer by hand, start a gateway and run, e.g.,
/// `target/warren-pyenv/bin/schemathesis --config-file <the file this test writes> run
/// http://127.0.0.1:PORT/openapi.json --checks all --max-examples 1000` (drop `--seed` for new
/// inputs).
#[tokio::test]
async fn schemathesis_finds_nothing_on_the_gateway() {
    let python = warren_test_support::python();
    let schemathesis = python.with_file_name("schemathesis");
    // Hands of the real binary (the files and terminals routes start them); no agent, so the
    // generated messages run nothing.
    let gw = TestGateway::start_changed(args_without_agent, |args| {
        args.warren_bin = Some(warren_bin())
    })
    .await;
    let device_id = "openapi-fuzz-01";
    let token = gw.register(device_id).await;
    // The admin routes reset this one, so the fuzzing device keeps its token.
    gw.register("openapi-fuzz-reset").await;
    let session = gw.create_session(&token).await;
    let doomed = gw.create_session(&token).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("schemathesis.toml");
    std::fs::write(
        &config,
        format!(
            r#"# Every check schemathesis has (set here, not with --checks, so an operation below can
# tune one).
[checks]
enabled = true

# Path parameters name real resources; the rest is generated.
[headers]
Authorization = "Bearer {token}"
X-App-Key = "{app_key}"

[parameters]
"path.id" = "{session}"
"path.device_id" = "openapi-fuzz-reset"

[[operations]]
include-path = "/v1/sessions/{{id}}"
include-method = "DELETE"
parameters = {{ "path.id" = "{doomed}" }}

# Registration with the fuzzing device's own token would rotate it (schemathesis learns the id
# from the admin's device list), and the rest of the run would be 401s.
[[operations]]
include-path = "/v1/devices"
headers = {{ Authorization = "Bearer wr_a-token-of-no-device" }}

[[operations]]
include-path-regex = "^/v1/admin/"
headers = {{ Authorization = "Bearer test-admin-token" }}

# A workspace path is checked once normalized ("a/.." is the root, which is refused where a
# file is needed, "" is the root): no JSON Schema says that, so a valid string may get 400. And
# whether a Range is satisfiable (416) depends on the file's size.
[[operations]]
include-path-regex = "/files"
checks.positive_data_acceptance.expected-statuses = ["2xx", 400, 401, 403, 404, 409, 416]

# An egress rule is checked by its own grammar (HOST[:PORT], *.domain, an address), which no
# JSON Schema says: a valid string may get 400 INVALID_EGRESS_RULE.
[[operations]]
include-path = "/v1/sessions/{{id}}/egress"
include-method = "PUT"
checks.positive_data_acceptance.expected-statuses = ["2xx", 400, 401, 403, 404, 409]

# A push subscription is checked beyond its schema: the endpoint against where pushes may go,
# the keys as a P-256 point and a 16-byte secret: a valid string may get 400
# INVALID_PUSH_SUBSCRIPTION.
[[operations]]
include-path = "/v1/push/subscriptions"
checks.positive_data_acceptance.expected-statuses = ["2xx", 400, 401, 403, 404, 409]

# The event stream does not end: read what comes within a second. A header the operation does
# not name is no invalid input (HTTP takes any), so the check that sends one is off here, the
# only operation with a header parameter whose other inputs are all checked.
[[operations]]
include-path = "/v1/sessions/{{id}}/events"
request-timeout = 1
checks.negative_data_rejection.enabled = false
# A seq past the last event is refused (400): that depends on the log, not on the schema.
checks.positive_data_acceptance.expected-statuses = ["2xx", 400, 401, 403, 404, 409]

# A plain HTTP client makes no WebSocket handshake: 426 is the answer to any request, valid or
# not (its parameters are read at the handshake).
[[operations]]
include-path = "/v1/sessions/{{id}}/terminals/{{name}}/ws"
checks.positive_data_acceptance.expected-statuses = ["2xx", 401, 403, 404, 409, 426]
checks.negative_data_rejection.expected-statuses = [400, 401, 403, 404, 405, 409, 426]
"#,
            app_key = gw.app_key,
        ),
    )
    .expect("write the schemathesis config");
    let started = Instant::now();
    let child = tokio::process::Command::new(&schemathesis)
        .arg("--config-file")
        .arg(&config)
        .arg("--no-color")
        .args(["run", &format!("{}/openapi.json", gw.url)])
        .args(["--mode", "all"])
        .args(["--max-examples", "30", "--seed", "17", "--workers", "1"])
        .args(["--phases", "examples,coverage,fuzzing"])
        .args(["--request-timeout", "5"])
        .args(["--generation-database", "none"])
        .arg("--report-dir")
        .arg(dir.path().join("report"))
        .current_dir(dir.path())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(SCHEMATHESIS_WAIT, child)
        .await
        .unwrap_or_else(|_| panic!("schemathesis did not finish within {SCHEMATHESIS_WAIT:?}"))
        .expect("schemathesis runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!(
        "schemathesis took {:.1} s\n{stdout}\n{stderr}",
        started.elapsed().as_secs_f64()
    );
    assert!(
        output.status.success(),
        "schemathesis found failures ({})",
        output.status
    );
    let sessions = gw.get(&token, "/sessions").await;
    assert_eq!(
        sessions.status(),
        200,
        "the fuzzing device kept its token to the end"
    );
    let document = fetch_document(&gw).await;
    let n_operations = operations(&document).len();
    assert!(
        stdout.contains(&format!("{n_operations} selected")) || stdout.contains("selected"),
        "schemathesis covered the document's {n_operations} operations"
    );
    gw.assert_healthy("the gateway is healthy after the run")
        .await;
    gw.stop().await;
}

/// Found by schemathesis: a plain `GET` of a terminal's WebSocket started (or resumed) the
/// session's hands and made a shell before execd refused the missing handshake.
#[tokio::test]
async fn a_plain_get_of_a_terminal_websocket_is_426_and_starts_no_hands() {
    let gw = TestGateway::start_changed(args_without_agent, |args| {
        args.warren_bin = Some(warren_bin())
    })
    .await;
    let token = gw.register("openapi-plain-ws").await;
    let session = gw.create_session(&token).await;
    let response = gw
        .get(&token, &format!("/sessions/{session}/terminals/shell-1/ws"))
        .await;
    assert_error(
        response,
        426,
        "UPGRADE_REQUIRED",
        "a plain GET of a WebSocket",
    )
    .await;
    let info = gw.session_info(&token, &session).await;
    assert_eq!(info["hands"], "none", "no hands were started: {info}");
    gw.stop().await;
}
