//! The web console (console.md): static files the gateway serves to a browser, with no token
//! (the console signs in itself, through the public API).
//!
//! Routes: `GET /` answers `index.html`; every other file is `GET /console/{path}`, its path
//! below `crates/gateway/console/` (`/console/main.js`, `/console/app.css`,
//! `/console/vendor/xterm/xterm.mjs`, ...; `index.html` refers to them by these absolute paths,
//! since relative ones would resolve against `/`). Two files are also at the root, where a
//! browser wants them (phone.md "Installable"): `GET /manifest.webmanifest` (the web app
//! manifest) and `GET /sw.js` (the service worker, whose scope can only be `/` from there). The files are embedded in the binary at
//! compile time (`build.rs`: every file of `crates/gateway/console/` but `test/`, dot files and
//! `node_modules/`), so a clean clone builds with `cargo build` alone.
//!
//! Development: `WARREN_CONSOLE_DIR=<dir>` (or `--console-dir <dir>`) serves the files from that
//! directory instead, read at every request, so the front end can be edited without rebuilding:
//! `WARREN_CONSOLE_DIR=crates/gateway/console cargo run -- serve`, then reload the page. Paths
//! with `..` are refused as for the embedded files; links inside the directory are followed (it
//! is the developer's own checkout, not untrusted input).
//!
//! Every answer (200, 304 and 404 alike) carries console.md's headers:
//! `Content-Security-Policy` ([`content_security_policy`], `frame-src` the origins of the
//! preview URLs the same request's host gets, [`crate::previews::frame_source_of`]),
//! `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer`. Caching: the URLs carry
//! no version, so every file is `Cache-Control: no-cache` with a strong `ETag` (SHA-256 of the
//! content, computed once per file) and `If-None-Match` answers 304; a reload costs one small
//! request per file. Text files (HTML, JS, CSS, JSON, SVG, ...) are gzip-compressed once, as the
//! gateway opens (a console directory's at every request), and sent compressed to a client whose
//! `Accept-Encoding` takes gzip (an ETag of its own, `Vary: Accept-Encoding`). A path that names
//! no file is 404 in the API's JSON shape.
//!
//! The app shell: the files a browser keeps to open the console without a network ([`Shell`]:
//! the page, styles, modules, icons, the manifest, the vendored xterm.js; not the license texts,
//! READMEs or `sw.js` itself), and its version, a hash of their paths and contents (and of
//! `sw.js`). `sw.js` is served with one line put before it, `const WARREN_SHELL = {"version":
//! …, "files": [URL, …]};`, which it caches under that version: a console whose files changed
//! is a new worker with a new cache. The page's answers carry the version as `X-Warren-Shell`,
//! so an outdated worker sees that the gateway has a newer console than its cache.
//!
//! Deliberately absent: templating, any other rewriting of the files, directory listings, and
//! any route that needs a device token.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock};

use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::Gateway;
use crate::error::{GatewayError, Path};

/// The files `build.rs` embedded: `(path below console/, content)`, sorted by path.
static EMBEDDED_FILES: &[(&str, &[u8])] = include!(concat!(env!("OUT_DIR"), "/console_files.rs"));

/// The embedded app shell, computed once per process.
static EMBEDDED_SHELL: LazyLock<Arc<Shell>> = LazyLock::new(|| {
    Arc::new(Shell::of(
        EMBEDDED_FILES
            .iter()
            .map(|(path, content)| (*path, *content)),
    ))
});

/// The embedded files ready to serve, hashed and compressed once per process (`sw.js` with its
/// shell line).
static EMBEDDED: LazyLock<HashMap<&'static str, Arc<Asset>>> = LazyLock::new(|| {
    EMBEDDED_FILES
        .iter()
        .map(|(path, content)| {
            let content = if *path == SERVICE_WORKER {
                Bytes::from(EMBEDDED_SHELL.service_worker(content))
            } else {
                Bytes::from_static(content)
            };
            (*path, Arc::new(Asset::new(path, content)))
        })
        .collect()
});

/// The service worker's file below `console/`.
const SERVICE_WORKER: &str = "sw.js";
/// The page's file below `console/`.
const PAGE: &str = "index.html";
/// The header naming the shell version on the page's answers.
const SHELL_VERSION_HEADER: HeaderName = HeaderName::from_static("x-warren-shell");

/// The routes: `/`, `/manifest.webmanifest`, `/sw.js` and `/console/{path}`. None takes a
/// credential.
pub fn routes() -> axum::Router<Arc<Gateway>> {
    axum::Router::new()
        .route("/", get(index))
        .route("/manifest.webmanifest", get(manifest))
        .route("/sw.js", get(service_worker))
        .route("/console/{*path}", get(file))
}

async fn index(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    answer(&gateway, PAGE, &headers).await
}

async fn manifest(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    answer(&gateway, "manifest.webmanifest", &headers).await
}

async fn service_worker(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    answer(&gateway, SERVICE_WORKER, &headers).await
}

async fn file(
    State(gateway): State<Arc<Gateway>>,
    Path(path): Path<String>,
    headers: HeaderMap,
) -> Response {
    answer(&gateway, &path, &headers).await
}

/// [`Console::answer`] with the `frame-src` of the preview URLs this request's host gets
/// ([`crate::previews::frame_source_of`]).
async fn answer(gateway: &Gateway, path: &str, headers: &HeaderMap) -> Response {
    let frame_source = crate::previews::frame_source_of(gateway, headers);
    gateway.console.answer(path, headers, &frame_source).await
}

/// Where the console's files come from, and the headers every answer carries.
pub struct Console {
    source: Source,
    /// The policy with the `frame-src` of a console opened on this machine (or at
    /// `--preview-base-url`), and that `frame-src`.
    content_security_policy: HeaderValue,
    frame_source: String,
}

enum Source {
    /// The files embedded at compile time.
    Embedded,
    /// `WARREN_CONSOLE_DIR`: read from this directory at every request.
    Dir(PathBuf),
}

impl Console {
    /// The console of a gateway whose previews are served at `preview_frame_source` (a CSP
    /// source, see [`crate::previews::Previews::frame_source`]); `dir` serves the files from
    /// disk instead of the embedded ones. Prepares the embedded files (hash, gzip) off the
    /// async workers.
    pub async fn open(
        dir: Option<PathBuf>,
        preview_frame_source: &str,
    ) -> Result<Console, GatewayError> {
        let content_security_policy = HeaderValue::from_str(&content_security_policy(
            preview_frame_source,
        ))
        .map_err(|_| {
            GatewayError::InvalidRequest(format!(
                "the preview origin {preview_frame_source:?} does not fit in a header"
            ))
        })?;
        let source = match dir {
            Some(dir) if dir.is_dir() => {
                tracing::info!(dir = %dir.display(), "serving the console from a directory");
                Source::Dir(dir)
            }
            Some(dir) => {
                return Err(GatewayError::InvalidRequest(format!(
                    "--console-dir {} is not a directory",
                    dir.display()
                )));
            }
            None => {
                tokio::task::spawn_blocking(|| {
                    LazyLock::force(&EMBEDDED_SHELL);
                    LazyLock::force(&EMBEDDED).len()
                })
                .await
                .map_err(|e| GatewayError::Internal(e.to_string()))?;
                Source::Embedded
            }
        };
        Ok(Console {
            source,
            content_security_policy,
            frame_source: preview_frame_source.to_owned(),
        })
    }

    /// The answer to a `GET` of the console file `path` (below `console/`), with the
    /// console's headers whatever it is, `frame_source` the preview origins in its policy.
    async fn answer(&self, path: &str, request: &HeaderMap, frame_source: &str) -> Response {
        let mut response = match self.asset(path).await {
            Ok(asset) => asset.answer(request),
            Err(error) => error.into_response(),
        };
        if path == PAGE && response.status() != StatusCode::NOT_FOUND {
            match self.shell().await {
                Ok(shell) => {
                    if let Ok(version) = HeaderValue::from_str(&shell.version) {
                        response.headers_mut().insert(SHELL_VERSION_HEADER, version);
                    }
                }
                Err(error) => tracing::warn!(%error, "no shell version for the page"),
            }
        }
        let policy = if frame_source == self.frame_source {
            self.content_security_policy.clone()
        } else {
            // A source from a checked `Host` (only host characters) always fits a header.
            HeaderValue::from_str(&content_security_policy(frame_source))
                .unwrap_or_else(|_| self.content_security_policy.clone())
        };
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_SECURITY_POLICY, policy);
        headers.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        headers.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        );
        response
    }

    async fn asset(&self, path: &str) -> Result<Arc<Asset>, GatewayError> {
        let not_found = || GatewayError::ConsoleFileNotFound(path.to_owned());
        if !is_plain_relative(path) {
            return Err(not_found());
        }
        match &self.source {
            Source::Embedded => EMBEDDED.get(path).cloned().ok_or_else(not_found),
            Source::Dir(dir) => {
                let file = dir.join(path);
                let content = match tokio::fs::read(&file).await {
                    Ok(content) => content,
                    // A directory, a missing file or an unreadable one: not a console file.
                    Err(error) => {
                        tracing::debug!(file = %file.display(), %error, "no console file");
                        return Err(not_found());
                    }
                };
                let content = if path == SERVICE_WORKER {
                    self.shell().await?.service_worker(&content)
                } else {
                    content
                };
                let path = path.to_owned();
                tokio::task::spawn_blocking(move || Arc::new(Asset::new(&path, content.into())))
                    .await
                    .map_err(|e| GatewayError::Internal(e.to_string()))
            }
        }
    }

    /// The app shell as it is now: the embedded one, or the console directory's, read again.
    async fn shell(&self) -> Result<Arc<Shell>, GatewayError> {
        match &self.source {
            Source::Embedded => Ok(EMBEDDED_SHELL.clone()),
            Source::Dir(dir) => {
                let dir = dir.clone();
                tokio::task::spawn_blocking(move || {
                    let mut files = Vec::new();
                    read_console_dir(&dir, "", &mut files);
                    Arc::new(Shell::of(
                        files
                            .iter()
                            .map(|(path, content)| (path.as_str(), content.as_slice())),
                    ))
                })
                .await
                .map_err(|e| GatewayError::Internal(e.to_string()))
            }
        }
    }
}

/// The app shell (see the module docs): the URLs the service worker caches and their version.
#[derive(Debug, PartialEq)]
struct Shell {
    /// A hash of the shell's URLs and contents, and of `sw.js`: 16 hex digits.
    version: String,
    /// Absolute URLs, sorted: `/` for the page, `/manifest.webmanifest`, `/console/{path}`.
    files: Vec<String>,
}

impl Shell {
    /// The shell of a console made of `files` (`(path below console/, content)`).
    fn of<'a>(files: impl Iterator<Item = (&'a str, &'a [u8])>) -> Shell {
        let mut shell: Vec<(String, &[u8])> = Vec::new();
        let mut worker: &[u8] = b"";
        for (path, content) in files {
            if path == SERVICE_WORKER {
                worker = content;
            } else if let Some(url) = shell_url(path) {
                shell.push((url, content));
            }
        }
        shell.sort();
        let mut hash = Sha256::new();
        for (url, content) in shell
            .iter()
            .map(|(url, content)| (url.as_str(), *content))
            .chain(std::iter::once((SERVICE_WORKER, worker)))
        {
            hash.update(url.as_bytes());
            hash.update([0]);
            hash.update((content.len() as u64).to_le_bytes());
            hash.update(content);
        }
        Shell {
            version: hex::encode(&hash.finalize()[..8]),
            files: shell.into_iter().map(|(url, _)| url).collect(),
        }
    }

    /// `sw.js` as served: the shell's line, then the file.
    fn service_worker(&self, template: &[u8]) -> Vec<u8> {
        let shell = serde_json::json!({ "version": self.version, "files": self.files });
        let mut content = format!(
            "// Filled in by the gateway: the app shell's version and files.\n\
             const WARREN_SHELL = {shell};\n"
        )
        .into_bytes();
        content.extend_from_slice(template);
        content
    }
}

/// The URL a browser loads the console file `path` (below `console/`) by, when the file is
/// part of the app shell: what the page loads (markup, styles, scripts, images, fonts, the
/// manifest), not the license texts, READMEs or the service worker itself.
fn shell_url(path: &str) -> Option<String> {
    let (content_type, _) = content_type(path);
    let loaded = !(content_type.starts_with("text/plain")
        || content_type == "application/json"
        || content_type == "application/octet-stream");
    match path {
        PAGE => Some("/".to_owned()),
        SERVICE_WORKER => None,
        "manifest.webmanifest" => Some("/manifest.webmanifest".to_owned()),
        _ if content_type.starts_with("text/html") => None,
        _ => loaded.then(|| format!("/console/{path}")),
    }
}

/// Every file below `dir` as `(its path below the console with `/` separators, its content)`,
/// leaving out what `build.rs` leaves out of the embedded console (`test/`, dot files,
/// `node_modules/`) and what cannot be read.
fn read_console_dir(dir: &std::path::Path, prefix: &str, files: &mut Vec<(String, Vec<u8>)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let path = format!("{prefix}{name}");
        if name.starts_with('.') || name == "node_modules" || path == "test" {
            continue;
        }
        let file = entry.path();
        if file.is_dir() {
            read_console_dir(&file, &format!("{path}/"), files);
        } else if let Ok(content) = std::fs::read(&file) {
            files.push((path, content));
        }
    }
}

/// Whether `path` is a path below the console's root: `/`-separated names, none empty, `.` or
/// `..`, no backslash or NUL. Anything else names no console file (and never leaves the
/// directory `WARREN_CONSOLE_DIR` names).
fn is_plain_relative(path: &str) -> bool {
    path.split('/')
        .all(|name| !name.is_empty() && name != "." && name != ".." && !name.contains(['\\', '\0']))
}

/// console.md's policy, with `frame_source` (the preview origins) as `frame-src`, and
/// `manifest-src 'self'` (phone.md: the browser loads the web app manifest under the page's
/// policy, which `default-src 'none'` would refuse).
pub fn content_security_policy(frame_source: &str) -> String {
    format!(
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
         connect-src 'self'; font-src 'self'; manifest-src 'self'; frame-src {frame_source}; \
         base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    )
}

/// One console file, ready to answer: its type, content and ETag, and the gzip encoding of a
/// text file when that is smaller.
struct Asset {
    content_type: &'static str,
    content: Bytes,
    etag: HeaderValue,
    gzip: Option<(Bytes, HeaderValue)>,
}

impl Asset {
    fn new(path: &str, content: Bytes) -> Asset {
        let (content_type, compressible) = content_type(path);
        let hash = hex::encode(&Sha256::digest(&content)[..16]);
        let gzip = compressible
            .then(|| gzip(&content))
            .filter(|gzip| gzip.len() < content.len())
            .map(|gzip| (Bytes::from(gzip), etag(&format!("{hash}-gzip"))));
        Asset {
            content_type,
            content,
            etag: etag(&hash),
            gzip,
        }
    }

    /// 200 with the file (gzip-encoded when the request takes it), or 304 when the request's
    /// `If-None-Match` names this file as it is.
    fn answer(&self, request: &HeaderMap) -> Response {
        let accepts_gzip = request
            .get_all(header::ACCEPT_ENCODING)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .any(accepts_gzip);
        let (content, etag, encoding) = match &self.gzip {
            Some((gzip, gzip_etag)) if accepts_gzip => (gzip, gzip_etag, Some("gzip")),
            _ => (&self.content, &self.etag, None),
        };
        let cached = request
            .get_all(header::IF_NONE_MATCH)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .any(|value| {
                // Either encoding is this file's current content.
                std::iter::once(&self.etag)
                    .chain(self.gzip.as_ref().map(|(_, gzip_etag)| gzip_etag))
                    .any(|etag| none_match_names(value, etag.as_bytes()))
            });
        let mut headers: Vec<(HeaderName, HeaderValue)> = vec![
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (header::ETAG, etag.clone()),
        ];
        if self.gzip.is_some() {
            headers.push((header::VARY, HeaderValue::from_static("accept-encoding")));
        }
        if cached {
            return with_headers(StatusCode::NOT_MODIFIED.into_response(), headers);
        }
        headers.push((
            header::CONTENT_TYPE,
            HeaderValue::from_static(self.content_type),
        ));
        if let Some(encoding) = encoding {
            headers.push((header::CONTENT_ENCODING, HeaderValue::from_static(encoding)));
        }
        // `Bytes` answers `application/octet-stream`; the file's own type replaces it.
        with_headers(content.clone().into_response(), headers)
    }
}

/// `response` with `headers` set, each replacing any value it had.
fn with_headers(mut response: Response, headers: Vec<(HeaderName, HeaderValue)>) -> Response {
    for (name, value) in headers {
        response.headers_mut().insert(name, value);
    }
    response
}

fn etag(tag: &str) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{tag}\"")).expect("a hex tag is a header value")
}

fn gzip(content: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder
        .write_all(content)
        .and_then(|()| encoder.finish())
        .expect("compressing into memory cannot fail")
}

/// The `Content-Type` of a console file by its extension, and whether it is text worth
/// compressing.
fn content_type(path: &str) -> (&'static str, bool) {
    let name = path.rsplit('/').next().unwrap_or(path);
    let extension = name
        .rsplit_once('.')
        .map(|(_, extension)| extension.to_ascii_lowercase());
    match extension.as_deref() {
        Some("html" | "htm") => ("text/html; charset=utf-8", true),
        Some("js" | "mjs") => ("text/javascript; charset=utf-8", true),
        Some("css") => ("text/css; charset=utf-8", true),
        Some("json" | "map") => ("application/json", true),
        Some("webmanifest") => ("application/manifest+json", true),
        Some("svg") => ("image/svg+xml", true),
        Some("txt" | "md") => ("text/plain; charset=utf-8", true),
        Some("png") => ("image/png", false),
        Some("jpg" | "jpeg") => ("image/jpeg", false),
        Some("gif") => ("image/gif", false),
        Some("webp") => ("image/webp", false),
        Some("ico") => ("image/x-icon", false),
        Some("woff2") => ("font/woff2", false),
        Some("woff") => ("font/woff", false),
        Some("ttf") => ("font/ttf", false),
        Some("wasm") => ("application/wasm", true),
        // `LICENSE`, `NOTICE`: the vendored code's license texts.
        None => ("text/plain; charset=utf-8", true),
        Some(_) => ("application/octet-stream", false),
    }
}

/// Whether one `Accept-Encoding` header value takes gzip: an explicit `gzip` (or `x-gzip`)
/// with a q-value above 0, else a `*` with one.
fn accepts_gzip(accept_encoding: &str) -> bool {
    let mut wildcard = None;
    for item in accept_encoding.split(',') {
        let mut params = item.split(';');
        let coding = params.next().unwrap_or("").trim();
        let quality = params
            .filter_map(|param| {
                let (name, value) = param.split_once('=')?;
                name.trim()
                    .eq_ignore_ascii_case("q")
                    .then(|| value.trim().parse::<f32>().unwrap_or(0.0))
            })
            .next()
            .unwrap_or(1.0);
        if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
            return quality > 0.0;
        }
        if coding == "*" {
            wildcard = Some(quality > 0.0);
        }
    }
    wildcard.unwrap_or(false)
}

/// Whether an `If-None-Match` value (`*` or a list of entity tags) names `etag`, by the weak
/// comparison RFC 9110 prescribes for it (a `W/` prefix is ignored).
fn none_match_names(if_none_match: &str, etag: &[u8]) -> bool {
    if_none_match.trim() == "*"
        || if_none_match
            .split(',')
            .map(|tag| tag.trim())
            .any(|tag| tag.strip_prefix("W/").unwrap_or(tag).as_bytes() == etag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_encoding_table() {
        let cases = [
            ("gzip", true),
            ("gzip, deflate, br, zstd", true),
            ("br;q=1.0, gzip;q=0.8, *;q=0.1", true),
            ("GZIP", true),
            ("x-gzip", true),
            ("gzip;q=0", false),
            ("gzip; q=0.000", false),
            ("gzip;q=0, *", false),
            ("*", true),
            ("*;q=0", false),
            ("br", false),
            ("identity", false),
            ("", false),
        ];
        for (value, want) in cases {
            assert_eq!(accepts_gzip(value), want, "{value:?}");
        }
    }

    #[test]
    fn if_none_match_table() {
        let etag = "\"abc\"";
        let cases = [
            ("\"abc\"", true),
            ("W/\"abc\"", true),
            ("\"x\", \"abc\"", true),
            ("*", true),
            ("\"abcd\"", false),
            ("abc", false),
            ("", false),
        ];
        for (value, want) in cases {
            assert_eq!(none_match_names(value, etag.as_bytes()), want, "{value:?}");
        }
    }

    #[test]
    fn console_paths_table() {
        let cases = [
            ("index.html", true),
            ("vendor/xterm/xterm.js", true),
            ("", false),
            ("/etc/passwd", false),
            ("../Cargo.toml", false),
            ("vendor/../../x", false),
            ("./app.js", false),
            ("vendor//x.js", false),
            ("vendor\\x.js", false),
            ("a\0b", false),
        ];
        for (path, want) in cases {
            assert_eq!(is_plain_relative(path), want, "{path:?}");
        }
    }

    #[test]
    fn shell_urls_table() {
        let cases = [
            ("index.html", Some("/")),
            ("manifest.webmanifest", Some("/manifest.webmanifest")),
            ("main.js", Some("/console/main.js")),
            ("app.css", Some("/console/app.css")),
            ("icons/icon-192.png", Some("/console/icons/icon-192.png")),
            ("icons/icon.svg", Some("/console/icons/icon.svg")),
            (
                "vendor/xterm/xterm.mjs",
                Some("/console/vendor/xterm/xterm.mjs"),
            ),
            (
                "vendor/xterm/xterm.css",
                Some("/console/vendor/xterm/xterm.css"),
            ),
            ("sw.js", None),
            ("README.md", None),
            ("vendor/xterm/LICENSE", None),
            ("other.html", None),
            ("data.json", None),
            ("blob.bin", None),
        ];
        for (path, want) in cases {
            assert_eq!(shell_url(path).as_deref(), want, "{path}");
        }
    }

    #[test]
    fn the_shell_version_follows_the_shell_and_the_worker_only() {
        let console = |main: &'static [u8], worker: &'static [u8], readme: &'static [u8]| {
            Shell::of(
                [
                    ("index.html", &b"<!doctype html>"[..]),
                    ("main.js", main),
                    ("sw.js", worker),
                    ("README.md", readme),
                ]
                .into_iter(),
            )
        };
        let shell = console(b"one", b"worker", b"notes");
        assert_eq!(shell.files, ["/", "/console/main.js"]);
        assert_eq!(shell.version.len(), 16);
        assert_eq!(shell, console(b"one", b"worker", b"other notes"));
        assert_ne!(shell.version, console(b"two", b"worker", b"notes").version);
        assert_ne!(
            shell.version,
            console(b"one", b"worker 2", b"notes").version
        );

        let served = String::from_utf8(shell.service_worker(b"self.x = 1;\n")).expect("UTF-8");
        let (head, rest) = served
            .split_once("const WARREN_SHELL = ")
            .expect("the shell line");
        assert!(head.starts_with("//"), "{served}");
        let (json, template) = rest.split_once(";\n").expect("the end of the shell line");
        let json: serde_json::Value = serde_json::from_str(json).expect("JSON");
        assert_eq!(
            json,
            serde_json::json!({"version": shell.version, "files": ["/", "/console/main.js"]})
        );
        assert_eq!(template, "self.x = 1;\n");
    }

    #[test]
    fn content_types_table() {
        let cases = [
            ("index.html", "text/html; charset=utf-8", true),
            ("app.js", "text/javascript; charset=utf-8", true),
            ("lib/x.MJS", "text/javascript; charset=utf-8", true),
            ("app.css", "text/css; charset=utf-8", true),
            ("icon.svg", "image/svg+xml", true),
            ("icon.png", "image/png", false),
            ("manifest.json", "application/json", true),
            ("manifest.webmanifest", "application/manifest+json", true),
            ("vendor/font.woff2", "font/woff2", false),
            ("vendor/xterm/LICENSE", "text/plain; charset=utf-8", true),
            ("blob.bin", "application/octet-stream", false),
        ];
        for (path, want_type, want_compressible) in cases {
            assert_eq!(content_type(path), (want_type, want_compressible), "{path}");
        }
    }
}
