//! The web console (console.md): static files the gateway serves to a browser, with no token
//! (the console signs in itself, through the public API).
//!
//! Routes: `GET /` answers `index.html`; every other file is `GET /console/{path}`, its path
//! below `crates/gateway/console/` (`/console/main.js`, `/console/app.css`,
//! `/console/vendor/xterm/xterm.mjs`, ...; `index.html` refers to them by these absolute paths,
//! since relative ones would resolve against `/`). The files are embedded in the binary at
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
//! `Content-Security-Policy` ([`content_security_policy`], `frame-src` the preview origins),
//! `X-Content-Type-Options: nosniff`, `Referrer-Policy: no-referrer`. Caching: the URLs carry
//! no version, so every file is `Cache-Control: no-cache` with a strong `ETag` (SHA-256 of the
//! content, computed once per file) and `If-None-Match` answers 304; a reload costs one small
//! request per file. Text files (HTML, JS, CSS, JSON, SVG, ...) are gzip-compressed once, as the
//! gateway opens (a console directory's at every request), and sent compressed to a client whose
//! `Accept-Encoding` takes gzip (an ETag of its own, `Vary: Accept-Encoding`). A path that names
//! no file is 404 in the API's JSON shape.
//!
//! Deliberately absent: templating, rewriting of the files, directory listings, and any route
//! that needs a device token.

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

/// The embedded files ready to serve, hashed and compressed once per process.
static EMBEDDED: LazyLock<HashMap<&'static str, Arc<Asset>>> = LazyLock::new(|| {
    EMBEDDED_FILES
        .iter()
        .map(|(path, content)| {
            (
                *path,
                Arc::new(Asset::new(path, Bytes::from_static(content))),
            )
        })
        .collect()
});

/// The routes: `/` and `/console/{path}`. Neither takes a credential.
pub fn routes() -> axum::Router<Arc<Gateway>> {
    axum::Router::new()
        .route("/", get(index))
        .route("/console/{*path}", get(file))
}

async fn index(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    gateway.console.answer("index.html", &headers).await
}

async fn file(
    State(gateway): State<Arc<Gateway>>,
    Path(path): Path<String>,
    headers: HeaderMap,
) -> Response {
    gateway.console.answer(&path, &headers).await
}

/// Where the console's files come from, and the headers every answer carries.
pub struct Console {
    source: Source,
    content_security_policy: HeaderValue,
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
                tokio::task::spawn_blocking(|| LazyLock::force(&EMBEDDED).len())
                    .await
                    .map_err(|e| GatewayError::Internal(e.to_string()))?;
                Source::Embedded
            }
        };
        Ok(Console {
            source,
            content_security_policy,
        })
    }

    /// The answer to a `GET` of the console file `path` (below `console/`), with the
    /// console's headers whatever it is.
    async fn answer(&self, path: &str, request: &HeaderMap) -> Response {
        let mut response = match self.asset(path).await {
            Ok(asset) => asset.answer(request),
            Err(error) => error.into_response(),
        };
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            self.content_security_policy.clone(),
        );
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
                let path = path.to_owned();
                tokio::task::spawn_blocking(move || Arc::new(Asset::new(&path, content.into())))
                    .await
                    .map_err(|e| GatewayError::Internal(e.to_string()))
            }
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

/// console.md's policy, with `frame_source` (the preview origins) as `frame-src`.
pub fn content_security_policy(frame_source: &str) -> String {
    format!(
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
         connect-src 'self'; font-src 'self'; frame-src {frame_source}; base-uri 'none'; \
         form-action 'self'; frame-ancestors 'none'"
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
    fn content_types_table() {
        let cases = [
            ("index.html", "text/html; charset=utf-8", true),
            ("app.js", "text/javascript; charset=utf-8", true),
            ("lib/x.MJS", "text/javascript; charset=utf-8", true),
            ("app.css", "text/css; charset=utf-8", true),
            ("icon.svg", "image/svg+xml", true),
            ("icon.png", "image/png", false),
            ("manifest.json", "application/json", true),
            ("vendor/font.woff2", "font/woff2", false),
            ("vendor/xterm/LICENSE", "text/plain; charset=utf-8", true),
            ("blob.bin", "application/octet-stream", false),
        ];
        for (path, want_type, want_compressible) in cases {
            assert_eq!(content_type(path), (want_type, want_compressible), "{path}");
        }
    }
}
