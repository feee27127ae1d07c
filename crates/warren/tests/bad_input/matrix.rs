//! The matrix as data: a [`Route`] says what one route reads (a JSON body, a file path, a
//! `Range`, a credential, a WebSocket) and each category makes its cases from that, each with
//! the statuses the route documents for it. [`run`] sends every case, checks every answer and
//! returns every failure at once: a status outside the expected set (any 5xx included), an
//! error body not in the route's error shape, no answer within one second, an answer that
//! carries the secret beside the server's root, or a server that is unhealthy afterwards.

use std::net::SocketAddr;

use serde_json::Value;

use crate::servers::OUTSIDE_SECRET;
use crate::wire::{self, Body, Request};

/// How a route's errors are shaped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Warren's `{"code": "UPPER_SNAKE", "message": "..."}`.
    Warren,
    /// Warren's shape, except that a 401 is OpenSandbox's `{"error": "..."}` (execd's
    /// OpenSandbox and PTY routes, byte for byte what OpenSandbox's clients expect).
    OpenSandbox,
    /// envd's REST errors: `{"code": <the status>, "message": "..."}`.
    Envd,
    /// Connect's errors: `{"code": "lower_snake", "message": "..."}`.
    Connect,
    /// The model proxy answers as the provider would: `{"error": {"message": "...", ...}}`.
    Provider,
}

/// Where a route takes a file path.
#[derive(Clone, Debug)]
pub enum FileParam {
    /// In the target, where `{file}` stands (percent-encoded when substituted).
    Target,
    /// In the JSON body's field of this name (its sample's value is replaced).
    Field(&'static str),
}

/// A credential: the header that carries it and its good value.
#[derive(Clone, Debug)]
pub struct Credential {
    pub header: &'static str,
    pub good: String,
    /// Another device's good credential (the gateway), refused for this route's resources.
    pub other: Option<String>,
}

#[derive(Clone, Debug)]
pub struct Route {
    pub method: &'static str,
    /// The request target; `{file}` is the file parameter's place, if it has one there.
    pub target: String,
    pub addr: SocketAddr,
    pub shape: Shape,
    /// A sample of a good JSON body: the route reads one (`optional`: it may be absent).
    pub json: Option<Value>,
    pub optional_json: bool,
    pub file: Option<FileParam>,
    /// The route serves byte ranges of `{file}`.
    pub range: bool,
    /// The route changes the file it names: only the traversals that escape are sent (the
    /// others would change the root's own files).
    pub writes: bool,
    /// A body over the route's limit.
    pub huge: usize,
    pub credential: Option<Credential>,
    /// The route is a WebSocket.
    pub websocket: bool,
    /// Methods the route's path does not have.
    pub wrong_methods: &'static [&'static str],
    /// What the route may answer a well-formed request (state-dependent answers included),
    /// for the cases whose input is odd but not invalid (a NUL in a string, an empty optional
    /// body, `//` in a path).
    pub fine: &'static [u16],
    /// Statuses a category's cases may answer on this route besides the category's own:
    /// (category, statuses).
    pub also: &'static [(&'static str, &'static [u16])],
}

impl Route {
    pub fn new(method: &'static str, target: impl Into<String>, addr: SocketAddr) -> Self {
        Self {
            method,
            target: target.into(),
            addr,
            shape: Shape::Warren,
            json: None,
            optional_json: false,
            file: None,
            range: false,
            writes: false,
            huge: HUGE,
            credential: None,
            websocket: false,
            wrong_methods: &[],
            fine: &[200],
            also: &[],
        }
    }

    /// With a sample of the JSON body it reads.
    pub fn json(mut self, sample: Value) -> Self {
        self.json = Some(sample);
        self
    }

    /// Its JSON body may be absent.
    pub fn optional_json(mut self) -> Self {
        self.optional_json = true;
        self
    }

    /// Takes a file path where `{file}` stands in its target.
    pub fn file(mut self) -> Self {
        self.file = Some(FileParam::Target);
        self
    }

    /// Takes a file path in the JSON body's field `field`.
    pub fn file_field(mut self, field: &'static str) -> Self {
        self.file = Some(FileParam::Field(field));
        self
    }

    /// Serves byte ranges of its file.
    pub fn range(mut self) -> Self {
        self.range = true;
        self
    }

    /// Changes the file it names.
    pub fn writes(mut self) -> Self {
        self.writes = true;
        self
    }

    /// Is a WebSocket.
    pub fn websocket(mut self) -> Self {
        self.websocket = true;
        self
    }

    /// With a body of `size` over its limit.
    pub fn huge(mut self, size: usize) -> Self {
        self.huge = size;
        self
    }

    /// With what it may answer a well-formed request.
    pub fn fine(mut self, statuses: &'static [u16]) -> Self {
        self.fine = statuses;
        self
    }

    /// With statuses some categories may answer besides their own.
    pub fn also(mut self, also: &'static [(&'static str, &'static [u16])]) -> Self {
        self.also = also;
        self
    }

    /// With methods its path does not have.
    pub fn wrong(mut self, methods: &'static [&'static str]) -> Self {
        self.wrong_methods = methods;
        self
    }

    /// With errors in `shape`.
    pub fn shape(mut self, shape: Shape) -> Self {
        self.shape = shape;
        self
    }

    /// With `credential`.
    pub fn credential(mut self, credential: Credential) -> Self {
        self.credential = Some(credential);
        self
    }

    pub fn label(&self) -> String {
        format!("{} {}", self.method, self.target)
    }

    fn target_with(&self, file: &str) -> Vec<u8> {
        self.target.replace("{file}", file).into_bytes()
    }

    /// The target with the good file parameter.
    fn good_target(&self) -> Vec<u8> {
        self.target_with("hello.txt")
    }

    /// A request with the good credential and, if the route reads one, its sample body.
    fn base(&self) -> Request {
        let mut request = Request::new(self.method, self.good_target());
        if let Some(credential) = &self.credential {
            request = request.header(credential.header, credential.good.clone());
        }
        if let Some(sample) = &self.json {
            request = request
                .header("Content-Type", "application/json")
                .body(Body::Sized(sample.to_string().into_bytes()));
        }
        request
    }

    /// A [`Route::base`] request with `file` in the target's `{file}` as it is (not encoded).
    fn with_raw_file(&self, file: &str) -> Request {
        let mut request = self.base();
        request.target = self.target_with(file);
        request
    }

    fn json_body(&self, bytes: impl Into<Vec<u8>>) -> Request {
        self.base().body(Body::Sized(bytes.into()))
    }
}

/// Making a directory (`POST {files}/dir?path=`) and moving a file (`POST {files}/move`), which
/// execd's and the gateway's file APIs take alike: their rows, each made with `route`.
pub fn dir_and_move(route: impl Fn(&'static str, &str) -> Route, files: &str) -> [Route; 2] {
    [
        route("POST", &format!("{files}/dir?path={{file}}"))
            .file()
            .writes()
            .fine(&[200, 201, 204, 409])
            .wrong(&["GET"]),
        route("POST", &format!("{files}/move"))
            .json(serde_json::json!({"from": "absent.txt", "to": "moved.txt"}))
            .file_field("to")
            .writes()
            .fine(&[200, 204, 404])
            .wrong(&["GET"]),
    ]
}

/// One request of the matrix and what may come back.
pub struct Case {
    pub route: String,
    pub category: &'static str,
    pub variant: String,
    pub addr: SocketAddr,
    pub shape: Shape,
    pub request: Request,
    pub expect: Vec<u16>,
    /// A WebSocket case: the frame to send after the upgrade and the close codes allowed.
    pub frame: Option<(Vec<u8>, &'static [u16])>,
}

/// The sample with its first field's value (or first element) replaced by `value`.
fn replace_first(sample: &Value, value: Value) -> Value {
    let mut body = sample.clone();
    match &mut body {
        Value::Object(map) => {
            if let Some((_, first)) = map.iter_mut().next() {
                *first = value;
            }
        }
        Value::Array(items) => {
            if let Some(first) = items.first_mut() {
                *first = value;
            }
        }
        _ => {}
    }
    body
}

/// The sample with the string `value` in the field `field` (for file paths in bodies).
fn with_field(sample: &Value, field: &str, value: &str) -> Value {
    let mut body = sample.clone();
    fn set(body: &mut Value, field: &str, value: &str) {
        match body {
            Value::Object(map) => {
                if let Some(slot) = map.get_mut(field) {
                    *slot = Value::String(value.to_owned());
                } else {
                    map.values_mut().for_each(|v| set(v, field, value));
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| set(v, field, value)),
            _ => {}
        }
    }
    set(&mut body, field, value);
    body
}

/// The sample with a NUL inside every string value.
fn with_nul(sample: &Value) -> Value {
    match sample {
        Value::String(s) => Value::String(format!("{s}\u{0}x")),
        Value::Array(items) => Value::Array(items.iter().map(with_nul).collect()),
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), with_nul(v))).collect())
        }
        other => other.clone(),
    }
}

/// Percent-encodes everything but unreserved characters and `/`.
pub fn encode(value: &str) -> String {
    let mut out = String::new();
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~/".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Bigger than every JSON body limit but Connect's (axum's default, 2 MB).
pub const HUGE: usize = 3 * 1024 * 1024;
/// A path segment or file parameter of 60 KiB (the request line stays under http's URI limit).
const LONG: usize = 60 * 1024;

const ABSOLUTE: &str = "absolute outside";

/// The traversal variants of a file parameter: (name, raw value to encode, escapes the root).
fn traversals(outside_abs: &str) -> Vec<(&'static str, String, bool)> {
    vec![
        ("dotdot", "../outside/secret.txt".into(), true),
        ("dir-dotdot", "dir/../../outside/secret.txt".into(), true),
        ("deep-dotdot", "../../../../../../etc/passwd".into(), true),
        // Both servers resolve an absolute path beneath their root: no escape, but sent to
        // the routes that write too.
        (ABSOLUTE, outside_abs.to_owned(), true),
        ("double slash", "//hello.txt".into(), false),
        // On Linux a backslash is part of a name: this is one odd name inside the root.
        ("backslashes", "..\\outside\\secret.txt".into(), false),
        (
            "NUL-terminated",
            "hello.txt\u{0}../../outside/secret.txt".into(),
            true,
        ),
        ("dot segments", "./dir/./../hello.txt".into(), false),
    ]
}

/// The traversal cases of `route`'s file parameter as (variant, request, statuses expected),
/// `with_file` putting each value in its place: a route that writes gets only those that escape.
fn traversal_cases(
    route: &Route,
    outside_abs: &str,
    with_file: impl Fn(&str) -> Request,
) -> Vec<(&'static str, Request, Vec<u16>)> {
    traversals(outside_abs)
        .into_iter()
        .filter(|(_, _, escapes)| !route.writes || *escapes)
        .map(|(variant, value, escapes)| {
            let expect = if escapes && variant != ABSOLUTE {
                vec![400, 403, 404]
            } else {
                [route.fine, &[400, 403, 404, 409]].concat()
            };
            (variant, with_file(&value), expect)
        })
        .collect()
}

/// Every case of `routes`. `outside_abs` is the secret's absolute path on the host.
pub fn cases(routes: &[Route], outside_abs: &str) -> Vec<Case> {
    let mut cases = Vec::new();
    for route in routes {
        let mut add = |category: &'static str, variant: String, request: Request, own: &[u16]| {
            let mut expect = own.to_vec();
            for (c, more) in route.also {
                if *c == category {
                    expect.extend_from_slice(more);
                }
            }
            cases.push(Case {
                route: route.label(),
                category,
                variant,
                addr: route.addr,
                shape: route.shape,
                request,
                expect,
                frame: None,
            });
        };
        let fine_or = |more: &[u16]| -> Vec<u16> { [route.fine, more].concat() };

        if let Some(sample) = &route.json {
            add(
                "malformed JSON",
                "truncated".into(),
                route.json_body(&b"{\"a\": "[..]),
                &[400],
            );
            add(
                "malformed JSON",
                "trailing garbage".into(),
                route.json_body(format!("{sample} x")),
                &[400],
            );
            let mut wrong: Vec<(&str, Value)> = vec![
                ("null body", Value::Null),
                ("string body", Value::String("text".into())),
                ("number body", Value::from(7)),
            ];
            if sample.is_object() {
                wrong.push(("array body", Value::Array(vec![sample.clone()])));
                let first_is_number = sample
                    .as_object()
                    .and_then(|map| map.values().next())
                    .is_some_and(Value::is_number);
                let not_its_type = if first_is_number {
                    Value::from("7")
                } else {
                    Value::from(7)
                };
                wrong.push(("scalar field", replace_first(sample, not_its_type)));
                wrong.push(("array field", replace_first(sample, Value::Array(vec![]))));
                wrong.push(("object field", replace_first(sample, serde_json::json!({}))));
            } else {
                wrong.push(("object body", serde_json::json!({})));
                wrong.push(("number element", replace_first(sample, Value::from(7))));
            }
            for (variant, body) in wrong {
                add(
                    "wrong types",
                    variant.into(),
                    route.json_body(body.to_string()),
                    &[400],
                );
            }
            let empty: Vec<u16> = if route.optional_json {
                fine_or(&[])
            } else {
                vec![400]
            };
            add(
                "empty body",
                "Content-Length: 0".into(),
                route.base().body(Body::Sized(Vec::new())),
                &empty,
            );
            add(
                "empty body",
                "no body".into(),
                route.base().body(Body::None),
                &empty,
            );
            let huge = format!("{{\"pad\": \"{}\"}}", "a".repeat(route.huge)).into_bytes();
            add(
                "huge body",
                "with Content-Length".into(),
                route.base().body(Body::Sized(huge.clone())),
                &[413],
            );
            add(
                "huge body",
                "chunked".into(),
                route.base().body(Body::Chunked(huge)),
                &[413],
            );
            let mut invalid = sample.to_string().into_bytes();
            // A string's content replaced by bytes that are not UTF-8 (or, without one, a key).
            let at = invalid.iter().rposition(|b| *b == b'"').unwrap_or(1);
            invalid.splice(at..at, [0xC3, 0x28, 0xFF]);
            add(
                "invalid UTF-8",
                "in the body".into(),
                route.json_body(invalid),
                &[400],
            );
            add(
                "NUL bytes",
                "in the body's strings".into(),
                route.json_body(with_nul(sample).to_string()),
                &fine_or(&[400, 404]),
            );
            add(
                "NUL bytes",
                "a raw NUL byte in the body".into(),
                route.json_body(b"{\"a\":\"\x00\"}".to_vec()),
                &[400],
            );
            for (variant, content_type) in [
                ("text/plain", Some("text/plain")),
                ("form", Some("application/x-www-form-urlencoded")),
                ("missing", None),
            ] {
                let mut request = route.base().without("Content-Type");
                if let Some(content_type) = content_type {
                    request = request.header("Content-Type", content_type);
                }
                // An optional body's content type is not checked (clients that send no body
                // send no content type either): such a body is read as JSON all the same.
                let expect = if route.optional_json {
                    fine_or(&[400, 415])
                } else {
                    vec![400, 415]
                };
                add("wrong content type", variant.into(), request, &expect);
            }
        }

        match &route.file {
            Some(FileParam::Target) => {
                let with_file = |value: &str| route.with_raw_file(&encode(value));
                add(
                    "invalid UTF-8",
                    "in the file parameter".into(),
                    route.with_raw_file("hello%C3%28%FF.txt"),
                    // Query values are percent-decoded lossily (U+FFFD for what is not UTF-8),
                    // so this names an odd file inside the root.
                    &fine_or(&[400, 403, 404, 409]),
                );
                add(
                    "NUL bytes",
                    "in the file parameter".into(),
                    with_file("hel\u{0}lo.txt"),
                    &[400, 404],
                );
                add(
                    "long paths",
                    "60 KiB file parameter".into(),
                    with_file(&"a".repeat(LONG)),
                    &[400, 404, 414],
                );
                add(
                    "long paths",
                    "deep file parameter".into(),
                    with_file(&"a/".repeat(LONG / 2)),
                    &fine_or(&[400, 404, 414]),
                );
                for (variant, request, expect) in traversal_cases(route, outside_abs, with_file) {
                    add("traversal", variant.into(), request, &expect);
                }
                for (variant, file) in [
                    ("encoded dotdot in the target", "%2e%2e/outside/secret.txt"),
                    ("dotdot with an encoded slash", "..%2foutside%2fsecret.txt"),
                ] {
                    add(
                        "traversal",
                        variant.into(),
                        route.with_raw_file(file),
                        &[400, 403, 404],
                    );
                }
            }
            Some(FileParam::Field(field)) => {
                let sample = route.json.as_ref().expect("a body field needs a JSON body");
                let with_file =
                    |value: &str| route.json_body(with_field(sample, field, value).to_string());
                add(
                    "NUL bytes",
                    "in the file field".into(),
                    with_file("hel\u{0}lo.txt"),
                    &[400, 404],
                );
                add(
                    "long paths",
                    "60 KiB file field".into(),
                    with_file(&"a".repeat(LONG)),
                    &[400, 404],
                );
                for (variant, request, expect) in traversal_cases(route, outside_abs, with_file) {
                    add("traversal", variant.into(), request, &expect);
                }
            }
            None => {}
        }

        if route.range {
            for (variant, range, expect) in [
                ("not a number", "bytes=x-", &[200, 416][..]),
                ("end before start", "bytes=5-2", &[200, 416][..]),
                ("multi-range", "bytes=0-1,3-4", &[200, 206, 416][..]),
                (
                    "huge numbers",
                    "bytes=99999999999999999999999-",
                    &[200, 416][..],
                ),
                ("past the end", "bytes=1000-", &[416][..]),
                ("another unit", "items=0-1", &[200, 416][..]),
                ("empty", "bytes=", &[200, 416][..]),
                ("suffix of zero", "bytes=-0", &[200, 416][..]),
            ] {
                add(
                    "bad Range",
                    variant.into(),
                    route.base().header("Range", range),
                    expect,
                );
            }
        }

        if let Some(credential) = &route.credential {
            let without = || route.base().without(credential.header);
            add("bad tokens", "missing".into(), without(), &[401]);
            add(
                "bad tokens",
                "wrong".into(),
                without().header(credential.header, format!("{}x", credential.good)),
                &[401],
            );
            add(
                "bad tokens",
                "empty".into(),
                without().header(credential.header, ""),
                &[401],
            );
            add(
                "bad tokens",
                "not UTF-8".into(),
                without().header(credential.header, b"Bearer \xff\xfe".to_vec()),
                &[401],
            );
            if credential.header.eq_ignore_ascii_case("authorization") {
                let token = credential.good.trim_start_matches("Bearer ");
                add(
                    "bad tokens",
                    "Basic scheme".into(),
                    without().header(credential.header, format!("Basic {token}")),
                    &[401],
                );
                add(
                    "bad tokens",
                    "no scheme".into(),
                    without().header(credential.header, token),
                    &[401],
                );
                add(
                    "bad tokens",
                    "two tokens".into(),
                    without().header(credential.header, format!("Bearer {token} {token}")),
                    &[401],
                );
            }
            if let Some(other) = &credential.other {
                add(
                    "bad tokens",
                    "another device's".into(),
                    without().header(credential.header, other.clone()),
                    &[401, 403, 404],
                );
            }
        }

        for method in route.wrong_methods {
            let mut request = route.base();
            request.method = (*method).to_owned();
            add("wrong methods", (*method).into(), request, &[405]);
        }

        if route.websocket {
            add(
                "WebSocket handshake",
                "a GET without the upgrade".into(),
                route.base(),
                &[400, 426],
            );
            add(
                "WebSocket handshake",
                "a bad version".into(),
                route
                    .base()
                    .header("Upgrade", "websocket")
                    .header("Connection", "Upgrade")
                    .header("Sec-WebSocket-Version", "7")
                    .header("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
                &[400, 426],
            );
            let frames: [(&str, Vec<u8>, &'static [u16]); 7] = [
                (
                    "an unmasked frame",
                    wire::client_frame(0x82, b"\x00ls\n", false),
                    &[1002],
                ),
                (
                    "a reserved opcode",
                    wire::client_frame(0x83, b"x", true),
                    &[1002],
                ),
                (
                    "a reserved bit",
                    wire::client_frame(0xC2, b"x", true),
                    &[1002],
                ),
                (
                    "invalid UTF-8 text",
                    wire::client_frame(0x81, &[b'h', 0xC3, 0x28, b'i'], true),
                    &[1007],
                ),
                (
                    "an oversized ping",
                    wire::client_frame(0x89, &[b'p'; 200], true),
                    &[1002],
                ),
                (
                    "a bad close code",
                    wire::client_frame(0x88, &999u16.to_be_bytes(), true),
                    &[1002],
                ),
                (
                    "a fragmented ping",
                    wire::client_frame(0x09, b"p", true),
                    &[1002],
                ),
            ];
            for (variant, frame, codes) in frames {
                cases.push(Case {
                    route: route.label(),
                    category: "malformed WebSocket frames",
                    variant: variant.into(),
                    addr: route.addr,
                    shape: route.shape,
                    request: route.base(),
                    expect: vec![101],
                    frame: Some((frame, codes)),
                });
            }
        }
    }
    cases
}

/// Why an error body is not in `shape`, if it is not.
fn shape_problem(shape: Shape, status: u16, body: &[u8]) -> Option<String> {
    let Ok(json) = serde_json::from_slice::<Value>(body) else {
        return Some("not JSON".into());
    };
    let message_ok = json["message"].as_str().is_some_and(|m| !m.is_empty());
    let code = &json["code"];
    let ok = match shape {
        Shape::OpenSandbox if status == 401 => {
            json["error"].as_str().is_some_and(|e| !e.is_empty())
        }
        Shape::Warren | Shape::OpenSandbox => {
            message_ok
                && code.as_str().is_some_and(|c| {
                    !c.is_empty()
                        && c.bytes()
                            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
                })
        }
        // Every envd route answers a wrong method as Connect does ("Connect calls are POST").
        Shape::Envd if status == 405 => shape_problem(Shape::Connect, status, body).is_none(),
        Shape::Provider => json["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        Shape::Envd => message_ok && code.as_u64() == Some(u64::from(status)),
        // envd's token check answers in its REST shape unless the request is a Connect one.
        Shape::Connect if status == 401 && code.is_u64() => {
            shape_problem(Shape::Envd, status, body).is_none()
        }
        Shape::Connect => {
            message_ok
                && code.as_str().is_some_and(|c| {
                    !c.is_empty() && c.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                })
        }
    };
    (!ok).then(|| format!("not in the {shape:?} error shape"))
}

/// One failing case, as the report lists it.
pub struct Failure {
    pub case: String,
    pub problem: String,
}

/// Sends `case` and says what is wrong with the answer, if anything.
pub async fn check(case: &Case) -> Option<String> {
    if let Some((frame, codes)) = &case.frame {
        let mut stream = match wire::websocket(case.addr, &case.request).await {
            Ok(stream) => stream,
            Err(why) => return Some(why),
        };
        use tokio::io::AsyncWriteExt as _;
        if let Err(e) = stream.write_all(frame).await {
            return Some(format!("writing the frame: {e}"));
        }
        return match wire::close_code(&mut stream).await {
            Some(code) if codes.contains(&code) => None,
            Some(code) => Some(format!("closed with {code}, expected one of {codes:?}")),
            None => Some("no close frame within 1 s (a client sees 1006)".into()),
        };
    }
    let response = match wire::send(case.addr, &case.request).await {
        Ok(response) => response,
        Err(why) => return Some(why),
    };
    let body = String::from_utf8_lossy(&response.body);
    if body.contains(OUTSIDE_SECRET) {
        return Some(format!(
            "{}: the answer carries the file outside the root",
            response.status
        ));
    }
    if !case.expect.contains(&response.status) {
        return Some(format!(
            "status {}, expected one of {:?}: {}",
            response.status,
            case.expect,
            truncate(&body)
        ));
    }
    if response.status >= 400
        && let Some(problem) = shape_problem(case.shape, response.status, &response.body)
    {
        return Some(format!(
            "{}: {problem}: {:?}",
            response.status,
            truncate(&body)
        ));
    }
    None
}

fn truncate(text: &str) -> String {
    text.chars().take(300).collect()
}

/// The categories present in `cases`, with their case counts.
pub fn census(cases: &[Case]) -> Vec<(&'static str, usize)> {
    let mut counts: Vec<(&'static str, usize)> = Vec::new();
    for case in cases {
        match counts.iter_mut().find(|(c, _)| *c == case.category) {
            Some((_, n)) => *n += 1,
            None => counts.push((case.category, 1)),
        }
    }
    counts
}
