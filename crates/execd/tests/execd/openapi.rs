//! execd's OpenAPI document against the real router: it is OpenAPI 3.1 of this version, served
//! without the token; every operation in it is routed (a request with sample parameters never
//! reaches the unknown-route or unknown-method fallback) and declares an `ErrorBody` error;
//! every route of the router is in it or in the one list of routes deliberately left out
//! (`warren_execd::openapi::UNDOCUMENTED`), and every entry of that list is routed and absent.
//! schemathesis runs against the document in `tests/openapi_fuzz.rs`.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;
use warren_execd::Config;
use warren_execd::openapi::{SECURITY_SCHEME, UNDOCUMENTED, operations};

use crate::pty_support::{self, WAIT};

const TOKEN: &str = "openapi-test-token";

/// A daemon on a temp root (kept alive by the returned guard), with `token` if given.
async fn daemon(token: Option<&str>) -> (pty_support::Daemon, tempfile::TempDir) {
    let root = tempfile::tempdir().expect("temp root");
    let config = Config {
        root: root.path().to_path_buf(),
        access_token: token.map(str::to_owned),
        ..Config::default()
    };
    (pty_support::start_with(config).await, root)
}

/// `GET path_and_query`, answered within the wait.
async fn get(daemon: &pty_support::Daemon, path_and_query: &str) -> reqwest::Response {
    let request = daemon.http.get(format!("{}{path_and_query}", daemon.base));
    tokio::time::timeout(WAIT, request.send())
        .await
        .expect("answers within the wait")
        .unwrap_or_else(|e| panic!("GET {path_and_query}: {e}"))
}

async fn fetch_document(daemon: &pty_support::Daemon) -> Value {
    let response = get(daemon, "/openapi.json").await;
    assert_eq!(response.status(), 200, "GET /openapi.json without a token");
    assert_eq!(
        response.headers()["content-type"],
        "application/json",
        "content type"
    );
    response.json().await.expect("the document is JSON")
}

/// `path` with every `{name}` replaced by a sample value that parses (`1` for an exec session).
fn sample_path(path: &str) -> String {
    let mut sample = String::new();
    let mut rest = path;
    while let Some(open) = rest.find('{') {
        sample.push_str(&rest[..open]);
        let close = rest[open..].find('}').expect("a closed parameter") + open;
        sample.push_str(match &rest[open + 1..close] {
            "session_id" => "1",
            _ => "sample",
        });
        rest = &rest[close + 1..];
    }
    sample.push_str(rest);
    sample
}

/// Sends `method path` (with the query parameters a route requires) and returns the status and
/// the error `code` if the answer was a JSON error body. Only the head is awaited: the change
/// feed never ends.
async fn probe(daemon: &pty_support::Daemon, method: &str, path: &str) -> (u16, Option<String>) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
    let url = format!("{}{path}", daemon.base);
    let mut request = daemon.http.request(method, url);
    if path.starts_with("/v1/files") && !path.ends_with("/move") {
        request = request.query(&[("path", "probe.txt")]);
    }
    let response = tokio::time::timeout(WAIT, request.send())
        .await
        .unwrap_or_else(|_| panic!("{path}: no answer within {WAIT:?}"))
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    let status = response.status().as_u16();
    let is_json = response
        .headers()
        .get("content-type")
        .is_some_and(|value| value.as_bytes().starts_with(b"application/json"));
    if !is_json || path == "/openapi.json" {
        return (status, None);
    }
    let body: Value = response.json().await.unwrap_or(Value::Null);
    (status, body["code"].as_str().map(str::to_owned))
}

/// The answer of the router's fallbacks, which no route gives.
fn is_fallback(code: Option<&str>) -> bool {
    matches!(code, Some("NOT_FOUND" | "METHOD_NOT_ALLOWED"))
}

#[tokio::test]
async fn the_document_is_openapi_3_1_of_this_version_served_without_the_token() {
    let (daemon, _root) = daemon(Some(TOKEN)).await;
    let document = fetch_document(&daemon).await;
    assert!(
        document["openapi"]
            .as_str()
            .is_some_and(|version| version.starts_with("3.1.")),
        "{}",
        document["openapi"]
    );
    assert_eq!(document["info"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        document["components"]["securitySchemes"][SECURITY_SCHEME],
        serde_json::json!({
            "type": "apiKey",
            "in": "header",
            "name": "X-EXECD-ACCESS-TOKEN",
            "description": "execd's `--access-token`",
        })
    );
    assert_eq!(
        document["security"],
        serde_json::json!([{ SECURITY_SCHEME: [] }])
    );
    for (method, path, operation) in operations(&document) {
        let unauthorized = &operation["responses"]["401"];
        let schema = unauthorized
            .pointer("/content/application~1json/schema/$ref")
            .and_then(Value::as_str);
        let expected = if path.starts_with("/v1/exec") {
            "#/components/schemas/ErrorBody"
        } else {
            "#/components/schemas/OpenSandboxUnauthorized"
        };
        assert_eq!(schema, Some(expected), "{method} {path}: its 401");
    }
}

#[tokio::test]
async fn the_document_passes_openapi_spec_validator_with_unique_operation_ids() {
    let (daemon, _root) = daemon(Some(TOKEN)).await;
    let document = fetch_document(&daemon).await;
    // The validator refuses an operation id used twice (DuplicateOperationIDError).
    warren_test_support::validate_openapi("execd", &document.to_string());
}

#[tokio::test]
async fn without_a_token_the_document_has_no_security_scheme_and_no_401() {
    let (daemon, _root) = daemon(None).await;
    let document = fetch_document(&daemon).await;
    assert!(
        document.get("security").is_none(),
        "{}",
        document["security"]
    );
    assert!(document["components"].get("securitySchemes").is_none());
    for (method, path, operation) in operations(&document) {
        assert!(
            operation["responses"].get("401").is_none(),
            "{method} {path} documents a 401 that cannot happen"
        );
    }
}

#[tokio::test]
async fn every_documented_operation_is_routed_and_answers_a_documented_status() {
    let (daemon, _root) = daemon(None).await;
    let document = fetch_document(&daemon).await;
    let operations = operations(&document);
    assert!(operations.len() >= 20, "{} operations", operations.len());
    for (method, path, operation) in operations {
        let (status, code) = probe(&daemon, &method, &sample_path(&path)).await;
        assert!(
            !is_fallback(code.as_deref()),
            "{method} {path}: the router has no such route ({status} {code:?})"
        );
        assert!(
            operation["responses"].get(status.to_string()).is_some(),
            "{method} {path}: {status} {code:?} is not among its documented responses"
        );
    }
}

#[tokio::test]
async fn every_operation_declares_an_error_body() {
    let (daemon, _root) = daemon(None).await;
    let document = fetch_document(&daemon).await;
    assert!(document["components"]["schemas"]["ErrorBody"].is_object());
    for (method, path, operation) in operations(&document) {
        let responses = operation["responses"].as_object().expect("responses");
        let error_bodies = responses
            .iter()
            .filter(|(status, _)| status.starts_with('4') || status.starts_with('5'))
            .filter(|(_, response)| {
                response
                    .pointer("/content/application~1json/schema/$ref")
                    .and_then(Value::as_str)
                    == Some("#/components/schemas/ErrorBody")
            })
            .count();
        assert!(error_bodies > 0, "{method} {path} declares no ErrorBody");
        assert!(
            operation["operationId"].is_string(),
            "{method} {path} has no operationId"
        );
    }
}

/// Every route literal of execd's sources: `.route("...")` and `.route_service("...")`. The
/// E2B envd API is left out: it is another router, on its own listener.
fn routes_in_sources() -> BTreeSet<String> {
    fn walk(dir: &Path, routes: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).expect("reads the sources") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                if path.file_name().is_some_and(|name| name != "e2b") {
                    walk(&path, routes);
                }
                continue;
            }
            if path.extension().is_none_or(|extension| extension != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("reads a source file");
            for call in [".route(", ".route_service("] {
                for (at, _) in text.match_indices(call) {
                    let rest = text[at + call.len()..].trim_start();
                    if let Some(literal) = rest.strip_prefix('"') {
                        let end = literal.find('"').expect("a closed string literal");
                        routes.insert(literal[..end].to_owned());
                    }
                }
            }
        }
    }
    let mut routes = BTreeSet::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut routes,
    );
    routes
}

#[tokio::test]
async fn every_route_is_documented_or_listed_as_deliberately_left_out() {
    let listed: BTreeSet<String> = UNDOCUMENTED
        .iter()
        .map(|undocumented| undocumented.route.to_owned())
        .collect();
    // Warren's routes are registered by `routes!` from their annotations; a plain `.route` is
    // one the document leaves out, and then it must be listed (and every listed one must exist).
    assert_eq!(routes_in_sources(), listed);

    let (daemon, _root) = daemon(None).await;
    let document = fetch_document(&daemon).await;
    let documented: BTreeSet<String> = document["paths"]
        .as_object()
        .expect("paths")
        .keys()
        .cloned()
        .collect();
    for undocumented in UNDOCUMENTED {
        assert!(
            !documented.contains(undocumented.route),
            "{} is documented and listed as left out",
            undocumented.route
        );
        assert!(!undocumented.why.is_empty());
        let (status, code) = probe(&daemon, undocumented.method, undocumented.sample_path).await;
        assert!(
            !is_fallback(code.as_deref()),
            "{} {}: not routed ({status} {code:?})",
            undocumented.method,
            undocumented.sample_path
        );
    }
}

/// GETs `path_and_query`, which must answer a JSON 400 `INVALID_REQUEST_BODY` (a plain-text
/// body fails); the body.
async fn get_json_400(daemon: &pty_support::Daemon, path_and_query: &str) -> Value {
    let response = get(daemon, path_and_query).await;
    let status = response.status().as_u16();
    let text = response.text().await.expect("a body");
    let body: Value = serde_json::from_str(&text)
        .unwrap_or_else(|_| panic!("{path_and_query}: not JSON: {text:?}"));
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["code"], "INVALID_REQUEST_BODY", "{body}");
    body
}

#[tokio::test]
async fn a_terminal_id_that_does_not_decode_is_a_json_400_not_plain_text() {
    let (daemon, _root) = daemon(None).await;
    get_json_400(&daemon, "/v1/terminals/%FF/output").await;
}

#[tokio::test]
async fn a_workspace_query_that_does_not_parse_is_a_json_400_not_plain_text() {
    let (daemon, _root) = daemon(None).await;
    let body = get_json_400(&daemon, "/v1/workspace/snapshot?tree=a&tree=b").await;
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("duplicate")),
        "{body}"
    );
}
