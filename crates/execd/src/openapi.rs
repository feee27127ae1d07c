//! The OpenAPI 3.1 document of execd's Warren routes, served at `GET /openapi.json` without the
//! access token (it holds no secret). The operations come from the handlers' `#[utoipa::path]`
//! annotations, collected by `utoipa_axum::routes!`, the same macro that routes them, so a route
//! cannot be served without being documented. [`document`] adds what every route shares: the
//! errors of the layers around the handlers (the hands nonce check, the access token, the body
//! extractors, the panic catcher) and, with `--access-token`, the security scheme.
//!
//! The routes that follow other projects' specs (OpenSandbox's, `/proxy/{port}`, `/mcp`; the E2B
//! envd API is on a listener of its own) are deliberately left out; [`UNDOCUMENTED`] lists them.

use serde_json::{Map, Value, json};

use crate::auth::ACCESS_TOKEN_HEADER;

/// A route execd serves that the document leaves out, and why.
#[derive(Debug, Clone, Copy)]
pub struct Undocumented {
    /// The route as the router has it (axum's syntax).
    pub route: &'static str,
    /// A request path that reaches it, for a test to try.
    pub sample_path: &'static str,
    /// A method it answers.
    pub method: &'static str,
    pub why: &'static str,
}

const OPENSANDBOX: &str = "an OpenSandbox-compatible route: OpenSandbox's execd spec describes it";
const NOT_SUPPORTED: &str =
    "an OpenSandbox route Warren does not implement (501 NOT_SUPPORTED for every method)";

/// Every route of execd's router that is not in the document.
pub const UNDOCUMENTED: &[Undocumented] = &[
    Undocumented {
        route: "/openapi.json",
        sample_path: "/openapi.json",
        method: "GET",
        why: "this document itself",
    },
    Undocumented {
        route: "/mcp",
        sample_path: "/mcp",
        method: "POST",
        why: "MCP's streamable HTTP transport: the MCP specification describes it",
    },
    Undocumented {
        route: "/proxy/{port}",
        sample_path: "/proxy/1",
        method: "GET",
        why: "OpenSandbox's reverse proxy: any method and body, whatever the upstream serves",
    },
    Undocumented {
        route: "/proxy/{port}/",
        sample_path: "/proxy/1/",
        method: "GET",
        why: "OpenSandbox's reverse proxy",
    },
    Undocumented {
        route: "/proxy/{port}/{*rest}",
        sample_path: "/proxy/1/a/b",
        method: "GET",
        why: "OpenSandbox's reverse proxy",
    },
    Undocumented {
        route: "/ping",
        sample_path: "/ping",
        method: "GET",
        why: OPENSANDBOX,
    },
    Undocumented {
        route: "/metrics",
        sample_path: "/metrics",
        method: "GET",
        why: OPENSANDBOX,
    },
    Undocumented {
        route: "/metrics/watch",
        sample_path: "/metrics/watch",
        method: "GET",
        why: OPENSANDBOX,
    },
    Undocumented {
        route: "/command",
        sample_path: "/command",
        method: "POST",
        why: OPENSANDBOX,
    },
    Undocumented {
        route: "/command/status/{id}",
        sample_path: "/command/status/x",
        method: "GET",
        why: OPENSANDBOX,
    },
    Undocumented {
        route: "/command/{id}/logs",
        sample_path: "/command/x/logs",
        method: "GET",
        why: OPENSANDBOX,
    },
    Undocumented {
        route: "/session",
        sample_path: "/session",
        method: "POST",
        why: OPENSANDBOX,
    },
    Undocumented {
        route: "/session/{id}",
        sample_path: "/session/x",
        method: "DELETE",
        why: OPENSANDBOX,
    },
    Undocumented {
        route: "/session/{id}/run",
        sample_path: "/session/x/run",
        method: "POST",
        why: OPENSANDBOX,
    },
    Undocumented {
        route: "/files",
        sample_path: "/files",
        method: "DELETE",
        why: OPENSANDBOX,
    },
    Undocumented {
        route: "/files/info",
        sample_path: "/files/info",
        method: "GET",
        why: OPENSANDBOX,
    },
    Undocumented {
        route: "/files/mv",
        sample_path: "/files/mv",
        method: "POST",
        why: OPENSANDBOX,
    },
    Undocumented {
        route: "/files/permissions",
        sample_path: "/files/permissions",
        method: "POST",
        why: OPENSANDBOX,
    },
    Undocumented {
        route: "/files/search",
        sample_path: "/files/search",
        method: "GET",
        why: OPENSANDBOX,
    },
    Undocumented {
        route: "/files/replace",
        sample_path: "/files/replace",
        method: "POST",
        why: OPENSANDBOX,
    },
    Undocumented {
        route: "/files/upload",
        sample_path: "/files/upload",
        method: "POST",
        why: OPENSANDBOX,
    },
    Undocumented {
        route: "/files/download",
        sample_path: "/files/download",
        method: "GET",
        why: OPENSANDBOX,
    },
    Undocumented {
        route: "/directories",
        sample_path: "/directories",
        method: "POST",
        why: OPENSANDBOX,
    },
    Undocumented {
        route: "/directories/list",
        sample_path: "/directories/list",
        method: "GET",
        why: OPENSANDBOX,
    },
    Undocumented {
        route: "/code",
        sample_path: "/code",
        method: "POST",
        why: NOT_SUPPORTED,
    },
    Undocumented {
        route: "/code/{*rest}",
        sample_path: "/code/context",
        method: "POST",
        why: NOT_SUPPORTED,
    },
    Undocumented {
        route: "/v1/isolated/{*rest}",
        sample_path: "/v1/isolated/x",
        method: "POST",
        why: NOT_SUPPORTED,
    },
];

/// The name of the access token's security scheme.
pub const SECURITY_SCHEME: &str = "access_token";

const DESCRIPTION: &str = "Warren's own routes of `warren execd`: PTY sessions (`/pty*`, \
pty-sessions.md), the agent exec API (`/v1/exec*`), the agent's terminals (`/v1/terminals*`, \
`/v1/agent-terminals*`), files (`/v1/files*`), workspace snapshots (`/v1/workspace/*`) and the \
hands' identity. Every error body is `{\"code\", \"message\"}` (`ErrorBody`), except a 401 \
outside `/v1/exec*`, which is OpenSandbox's `{\"error\"}` as pty-sessions.md requires. The \
OpenSandbox-compatible routes (`/ping`, `/command*`, `/session*`, `/files*`, `/directories*`, \
`/metrics*`, `/code*`), `/proxy/{port}`, `/mcp` and the E2B envd API (its own listener) follow \
other projects' specs and are not in this document. A request carrying \
`X-Warren-Hands-Nonce` with another execd's nonce answers 409 `HANDS_IDENTITY_MISMATCH` on \
every route.";

/// The finished document: `api` as the routes' annotations made it, with its info, the errors
/// every route shares and, when execd runs with an access token, the security scheme.
pub fn document(api: utoipa::openapi::OpenApi, access_token: bool) -> Value {
    let mut document = serde_json::to_value(&api).expect("an OpenAPI document serializes");
    document["info"] = json!({
        "title": "warren execd",
        "version": env!("CARGO_PKG_VERSION"),
        "description": DESCRIPTION,
        "license": { "name": env!("CARGO_PKG_LICENSE") },
    });
    let components = document
        .as_object_mut()
        .expect("an OpenAPI document is an object")
        .entry("components")
        .or_insert_with(|| json!({}));
    components["schemas"]["OpenSandboxUnauthorized"] = json!({
        "type": "object",
        "description": "OpenSandbox's 401 body, byte for byte",
        "required": ["error"],
        "properties": { "error": { "type": "string" } },
    });
    if access_token {
        components["securitySchemes"] = json!({
            SECURITY_SCHEME: {
                "type": "apiKey",
                "in": "header",
                "name": ACCESS_TOKEN_HEADER,
                "description": "execd's `--access-token`",
            }
        });
        document["security"] = json!([{ SECURITY_SCHEME: [] }]);
    }
    unsigned_ranges(&mut document);
    if let Some(paths) = document.get_mut("paths").and_then(Value::as_object_mut) {
        for (path, item) in paths.iter_mut() {
            let Some(item) = item.as_object_mut() else {
                continue;
            };
            for (method, operation) in item.iter_mut() {
                if !is_method(method) {
                    continue;
                }
                absent_not_null(operation);
                add_shared_errors(path, operation, access_token);
            }
        }
    }
    document
}

/// utoipa describes a `u64` as `int64` with a minimum of 0, which a client reads as at most
/// 2^63 - 1; serde takes every `u64` (and `u32`). The schemas say the range the server reads.
fn unsigned_ranges(value: &mut Value) {
    match value {
        Value::Object(object) => {
            let integer = match object.get("type") {
                Some(Value::String(name)) => name == "integer",
                Some(Value::Array(names)) => names.contains(&json!("integer")),
                _ => false,
            };
            let unsigned = integer && object.get("minimum") == Some(&json!(0));
            if unsigned {
                match object.get("format").and_then(Value::as_str) {
                    Some("int64") => {
                        object.insert("format".into(), json!("uint64"));
                        object.insert("maximum".into(), json!(u64::MAX));
                    }
                    Some("int32") => {
                        object.insert("format".into(), json!("uint32"));
                        object.insert("maximum".into(), json!(u32::MAX));
                    }
                    _ => {}
                }
            }
            object.values_mut().for_each(unsigned_ranges);
        }
        Value::Array(items) => items.iter_mut().for_each(unsigned_ranges),
        _ => {}
    }
}

fn is_method(key: &str) -> bool {
    matches!(
        key,
        "get" | "put" | "post" | "delete" | "patch" | "head" | "options" | "trace"
    )
}

/// An optional body (`Option<T>` in an annotation) is left out when there is none, never sent as
/// `null`, which the body extractors refuse: its schema is `T` alone.
fn absent_not_null(operation: &mut Value) {
    let Some(body) = operation.get_mut("requestBody") else {
        return;
    };
    if body["required"] == Value::Bool(true) {
        return;
    }
    let Some(content) = body.get_mut("content").and_then(Value::as_object_mut) else {
        return;
    };
    for media_type in content.values_mut() {
        let schema = &mut media_type["schema"];
        let Some(choices) = schema.get("oneOf").and_then(Value::as_array) else {
            continue;
        };
        let not_null: Vec<Value> = choices
            .iter()
            .filter(|choice| choice["type"] != "null")
            .cloned()
            .collect();
        if let [only] = not_null.as_slice() {
            *schema = only.clone();
        }
    }
}

/// The errors of the layers around every handler, added where the handler's own annotation does
/// not already give that status (and appended to its description where it does).
fn add_shared_errors(path: &str, operation: &mut Value, access_token: bool) {
    let has_parameters = operation
        .get("parameters")
        .and_then(Value::as_array)
        .is_some_and(|parameters| !parameters.is_empty());
    let json_body = operation
        .pointer("/requestBody/content/application~1json")
        .is_some();
    let any_body = operation.get("requestBody").is_some();
    let responses = operation
        .as_object_mut()
        .expect("an operation is an object")
        .entry("responses")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .expect("responses are an object");
    let mut add = |status: &str, description: &str, schema: &str| {
        let Some(entry) = responses.get_mut(status) else {
            responses.insert(status.to_owned(), error_response(description, schema));
            return;
        };
        let text = entry["description"].as_str().unwrap_or_default();
        if !text.contains(description) {
            entry["description"] = Value::String(format!("{text}; {description}"));
        }
    };
    if has_parameters || any_body {
        add(
            "400",
            "`INVALID_REQUEST_BODY`: the request cannot be read",
            "ErrorBody",
        );
    }
    if json_body {
        add(
            "413",
            "`INVALID_REQUEST_BODY`: the body is larger than the route reads",
            "ErrorBody",
        );
    }
    if any_body {
        add(
            "408",
            "`REQUEST_TIMEOUT`: the body stopped arriving",
            "ErrorBody",
        );
    }
    add(
        "409",
        "`HANDS_IDENTITY_MISMATCH`: `X-Warren-Hands-Nonce` names another execd",
        "ErrorBody",
    );
    add(
        "500",
        "`RUNTIME_ERROR`: an internal failure (logged, never shown)",
        "ErrorBody",
    );
    if access_token {
        let schema = if crate::auth::is_warren_route(path) {
            "ErrorBody"
        } else {
            "OpenSandboxUnauthorized"
        };
        add(
            "401",
            "`UNAUTHORIZED`: a missing or wrong `X-EXECD-ACCESS-TOKEN`",
            schema,
        );
    }
}

fn error_response(description: &str, schema: &str) -> Value {
    json!({
        "description": description,
        "content": {
            "application/json": {
                "schema": { "$ref": format!("#/components/schemas/{schema}") }
            }
        }
    })
}

/// The document as `GET /openapi.json` serves it.
pub fn to_bytes(document: &Value) -> bytes::Bytes {
    bytes::Bytes::from(serde_json::to_vec(document).expect("a JSON value serializes"))
}

/// Every operation of `document`: method (upper case), path and the operation object.
pub fn operations(document: &Value) -> Vec<(String, String, &Map<String, Value>)> {
    let mut operations = Vec::new();
    let Some(paths) = document.get("paths").and_then(Value::as_object) else {
        return operations;
    };
    for (path, item) in paths {
        let Some(item) = item.as_object() else {
            continue;
        };
        for (method, operation) in item {
            if let (true, Some(operation)) = (is_method(method), operation.as_object()) {
                operations.push((method.to_uppercase(), path.clone(), operation));
            }
        }
    }
    operations
}
