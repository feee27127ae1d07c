//! The web console as the gateway serves it (console.md, docs/console.md): `/` and
//! `/console/{path}` answered without a token, console.md's security headers on every answer,
//! the ETag round trip, gzip, the JSON 404, `frame-src` following `--preview-base-url`, a console
//! directory served from disk, and what a first load and a reload cost. The embedded files are
//! the real front end, `crates/gateway/console/`.

use std::io::Read;

use reqwest::StatusCode;
use reqwest::header::{
    ACCEPT_ENCODING, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_TYPE, ETAG, IF_NONE_MATCH, VARY,
};
use serde_json::Value;
use warren_test_support::repo_root;

use super::helpers::{TestGateway, args_without_agent, files_under};

/// console.md's policy, spelled out, with `frame_src` the preview origins (and phone.md's
/// `manifest-src 'self'`: the web app manifest loads under the page's policy).
fn policy(frame_src: &str) -> String {
    format!(
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
         connect-src 'self'; font-src 'self'; manifest-src 'self'; frame-src {frame_src}; \
         base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    )
}

/// The preview origins of a gateway with the default `--preview-base-url`.
fn default_frame_src(gw: &TestGateway) -> String {
    let port = gw.url.rsplit(':').next().expect("the gateway's port");
    format!("http://*.localhost:{port}")
}

/// A header of `response` as text, "" when it is absent.
fn header(response: &reqwest::Response, name: impl reqwest::header::AsHeaderName) -> &str {
    response
        .headers()
        .get(name)
        .map_or("", |value| value.to_str().expect("an ASCII header"))
}

/// Asserts the headers console.md puts on every console answer.
fn assert_console_headers(response: &reqwest::Response, frame_src: &str) {
    let url = response.url().path().to_owned();
    assert_eq!(
        header(response, "content-security-policy"),
        policy(frame_src),
        "{url}"
    );
    assert_eq!(
        header(response, "x-content-type-options"),
        "nosniff",
        "{url}"
    );
    assert_eq!(header(response, "referrer-policy"), "no-referrer", "{url}");
}

/// `GET path` with no credential and the given request headers.
async fn get(gw: &TestGateway, path: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut request = gw.http.get(format!("{}{path}", gw.url));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

async fn body(response: reqwest::Response) -> Vec<u8> {
    let path = response.url().path().to_owned();
    response
        .bytes()
        .await
        .unwrap_or_else(|e| panic!("the body of {path}: {e}"))
        .to_vec()
}

fn gunzip(compressed: &[u8]) -> Vec<u8> {
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(compressed)
        .read_to_end(&mut plain)
        .expect("a gzip body decodes");
    plain
}

/// What a file of the console refers to, as the absolute paths they resolve to from `path`:
/// `src="..."` and `href="..."` in HTML, `url(...)` in CSS, and in JavaScript the specifiers of
/// static and dynamic `import`s and any string that is a `/console/` path (a stylesheet it
/// links). Data URLs, other origins and bare specifiers are left out.
fn references(path: &str, text: &str) -> Vec<String> {
    let script = path.ends_with(".js") || path.ends_with(".mjs");
    let needles: &[&str] = if path == "/" || path.ends_with(".html") {
        &["src=", "href="]
    } else if path.ends_with(".css") {
        &["url("]
    } else if script {
        &["from ", "import ", "import("]
    } else {
        &[]
    };
    let quoted = |rest: &str| -> Option<String> {
        let quote = rest.chars().next().filter(|c| matches!(c, '"' | '\''))?;
        let rest = &rest[1..];
        rest.find(quote).map(|end| rest[..end].to_owned())
    };
    let mut found = Vec::new();
    for needle in needles {
        for (at, _) in text.match_indices(needle) {
            found.extend(quoted(text[at + needle.len()..].trim_start()));
        }
    }
    if script {
        for quote in ["\"/console/", "'/console/"] {
            for (at, _) in text.match_indices(quote) {
                found.extend(quoted(&text[at..]));
            }
        }
    }
    let directory = &path[..path.rfind('/').map_or(0, |at| at + 1)];
    let mut resolved: Vec<String> = found
        .into_iter()
        .filter_map(|target| {
            let joined = if target.starts_with('/') && !target.starts_with("//") {
                target
            } else if target.starts_with("./") || target.starts_with("../") {
                format!("{directory}{target}")
            } else {
                // `data:`, another origin, a bare specifier: not a file of the console.
                return None;
            };
            Some(normalize(&joined))
        })
        .collect();
    resolved.sort();
    resolved.dedup();
    resolved
}

/// `/a/./b/../c` → `/a/c`.
fn normalize(path: &str) -> String {
    let mut names: Vec<&str> = Vec::new();
    for name in path.split('/') {
        match name {
            "" | "." => {}
            ".." => {
                names.pop();
            }
            name => names.push(name),
        }
    }
    format!("/{}", names.join("/"))
}

#[tokio::test]
async fn the_console_is_html_at_the_root_without_a_token_with_every_security_header() {
    let gw = TestGateway::start(args_without_agent).await;
    let response = get(&gw, "/", &[]).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(&response, CONTENT_TYPE), "text/html; charset=utf-8");
    assert_eq!(header(&response, CACHE_CONTROL), "no-cache");
    assert!(header(&response, ETAG).starts_with('"'), "a strong ETag");
    assert_console_headers(&response, &default_frame_src(&gw));
    let html = String::from_utf8(body(response).await).expect("UTF-8 HTML");
    assert!(
        html.trim_start()
            .to_ascii_lowercase()
            .starts_with("<!doctype html"),
        "{html}"
    );
}

#[tokio::test]
async fn a_script_is_text_javascript_and_its_etag_answers_304() {
    let gw = TestGateway::start(args_without_agent).await;
    let index = String::from_utf8(body(get(&gw, "/", &[]).await).await).expect("UTF-8");
    let script = references("/", &index)
        .into_iter()
        .find(|path| path.ends_with(".js") || path.ends_with(".mjs"))
        .unwrap_or_else(|| panic!("index.html loads a script: {index}"));

    let first = get(&gw, &script, &[]).await;
    assert_eq!(first.status(), StatusCode::OK, "{script}");
    assert_eq!(
        header(&first, CONTENT_TYPE),
        "text/javascript; charset=utf-8"
    );
    let etag = header(&first, ETAG).to_owned();
    assert!(etag.starts_with('"') && etag.len() > 2, "{etag}");

    let again = get(&gw, &script, &[(IF_NONE_MATCH.as_str(), &etag)]).await;
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED, "{script}");
    assert_eq!(header(&again, ETAG), etag);
    assert_eq!(header(&again, CACHE_CONTROL), "no-cache");
    assert_console_headers(&again, &default_frame_src(&gw));
    assert!(body(again).await.is_empty(), "a 304 has no body");

    let changed = get(&gw, &script, &[(IF_NONE_MATCH.as_str(), "\"another\"")]).await;
    assert_eq!(
        changed.status(),
        StatusCode::OK,
        "another ETag gets the file"
    );
}

#[tokio::test]
async fn text_files_are_gzipped_when_the_client_accepts_gzip() {
    let gw = TestGateway::start(args_without_agent).await;
    // The largest file of the console (xterm.js): gzip matters most there.
    let path = "/console/vendor/xterm/xterm.mjs";
    let plain = get(&gw, path, &[]).await;
    assert_eq!(plain.status(), StatusCode::OK, "{path}");
    assert_eq!(header(&plain, CONTENT_ENCODING), "", "not asked for gzip");
    assert_eq!(header(&plain, VARY), "accept-encoding");
    let plain_etag = header(&plain, ETAG).to_owned();
    let plain = body(plain).await;

    let gzipped = get(
        &gw,
        path,
        &[(ACCEPT_ENCODING.as_str(), "gzip, deflate, br")],
    )
    .await;
    assert_eq!(gzipped.status(), StatusCode::OK);
    assert_eq!(header(&gzipped, CONTENT_ENCODING), "gzip");
    assert_eq!(header(&gzipped, VARY), "accept-encoding");
    assert_eq!(
        header(&gzipped, CONTENT_TYPE),
        "text/javascript; charset=utf-8"
    );
    let gzip_etag = header(&gzipped, ETAG).to_owned();
    assert_ne!(gzip_etag, plain_etag, "each encoding has its own ETag");
    assert_console_headers(&gzipped, &default_frame_src(&gw));
    let compressed = body(gzipped).await;
    assert!(
        compressed.len() * 2 < plain.len(),
        "gzip of {} bytes is {} bytes",
        plain.len(),
        compressed.len()
    );
    assert_eq!(gunzip(&compressed), plain, "the gzip body is the file");

    let refused = get(&gw, path, &[(ACCEPT_ENCODING.as_str(), "gzip;q=0, br")]).await;
    assert_eq!(
        header(&refused, CONTENT_ENCODING),
        "",
        "gzip;q=0 refuses it"
    );

    // A cache holding either encoding has the file as it is.
    let cached = get(
        &gw,
        path,
        &[
            (ACCEPT_ENCODING.as_str(), "gzip"),
            (IF_NONE_MATCH.as_str(), &plain_etag),
        ],
    )
    .await;
    assert_eq!(cached.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(header(&cached, ETAG), gzip_etag);
}

#[tokio::test]
async fn an_unknown_console_file_is_404_in_the_api_error_shape() {
    let gw = TestGateway::start(args_without_agent).await;
    let mut paths = vec![
        "/console/no-such-file.js".to_owned(),
        "/console/vendor/no-such-dir/x.js".to_owned(),
        "/console/vendor".to_owned(),
        // (A client resolves `/console/../x` itself; `%2f` it sends as it is.)
        "/console/..%2f..%2fCargo.toml".to_owned(),
    ];
    // The front end's unit tests are not part of the console a browser gets.
    let console_dir = repo_root().join("crates/gateway/console");
    if let Some(file) = files_under(&console_dir.join("test")).first() {
        let below = file.strip_prefix(&console_dir).expect("below the console");
        paths.push(format!("/console/{}", below.display()));
    }
    for path in &paths {
        let response = get(&gw, path, &[]).await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{path}");
        assert_eq!(
            header(&response, CONTENT_TYPE),
            "application/json",
            "{path}"
        );
        assert_console_headers(&response, &default_frame_src(&gw));
        let error: Value = serde_json::from_slice(&body(response).await).expect("JSON");
        assert_eq!(error["code"], "NOT_FOUND", "{path}: {error}");
        assert!(
            error["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{error}"
        );
    }
}

#[tokio::test]
async fn the_frame_src_names_the_preview_origins_of_preview_base_url() {
    let gw = TestGateway::start_changed(args_without_agent, |args| {
        args.preview_base_url = Some("https://{token}.preview.example.com".into())
    })
    .await;
    for path in [
        "/",
        "/console/vendor/xterm/xterm.mjs",
        "/console/missing.css",
    ] {
        let response = get(&gw, path, &[]).await;
        assert_console_headers(&response, "https://*.preview.example.com");
    }
}

#[tokio::test]
async fn the_api_answers_beside_the_console() {
    let gw = TestGateway::start(args_without_agent).await;
    let health = get(&gw, "/healthz", &[]).await;
    assert_eq!(health.status(), StatusCode::OK);

    let sessions = get(&gw, "/v1/sessions", &[]).await;
    assert_eq!(sessions.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        header(&sessions, "content-security-policy"),
        "",
        "API answers are not console answers"
    );
    let error: Value = serde_json::from_slice(&body(sessions).await).expect("JSON");
    assert_eq!(error["code"], "UNAUTHORIZED");

    let token = gw.register("console-device-01").await;
    let session = gw.create_session(&token).await;
    let info = gw.session_info(&token, &session).await;
    assert_eq!(info["id"], session.as_str());

    let unknown = get(&gw, "/v1/no-such-route", &[]).await;
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
    let posted = gw.send_plain(reqwest::Method::POST, "/").await;
    assert_eq!(posted.status(), StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn a_console_dir_is_served_from_disk_and_an_edit_shows_at_the_next_request() {
    let console_dir = tempfile::tempdir().expect("temp console dir");
    let index = console_dir.path().join("index.html");
    std::fs::write(&index, "<!doctype html><p>first</p>").expect("writes index.html");
    std::fs::create_dir(console_dir.path().join("lib")).expect("mkdir lib");
    std::fs::write(
        console_dir.path().join("lib/app.js"),
        "export const n = 1;\n",
    )
    .expect("writes app.js");
    let dir = console_dir.path().to_path_buf();
    let gw = TestGateway::start(move |data| {
        let mut args = args_without_agent(data);
        args.console_dir = Some(dir);
        args
    })
    .await;

    let first = get(&gw, "/", &[]).await;
    assert_console_headers(&first, &default_frame_src(&gw));
    let first_etag = header(&first, ETAG).to_owned();
    assert_eq!(body(first).await, b"<!doctype html><p>first</p>");
    let script = get(&gw, "/console/lib/app.js", &[]).await;
    assert_eq!(
        header(&script, CONTENT_TYPE),
        "text/javascript; charset=utf-8"
    );
    assert_eq!(body(script).await, b"export const n = 1;\n");

    std::fs::write(&index, "<!doctype html><p>second</p>").expect("rewrites index.html");
    let second = get(&gw, "/", &[(IF_NONE_MATCH.as_str(), &first_etag)]).await;
    assert_eq!(
        second.status(),
        StatusCode::OK,
        "the old ETag no longer matches"
    );
    assert_ne!(header(&second, ETAG), first_etag);
    assert_eq!(body(second).await, b"<!doctype html><p>second</p>");

    let outside = get(&gw, "/console/..%2f..%2fetc%2fpasswd", &[]).await;
    assert_eq!(
        outside.status(),
        StatusCode::NOT_FOUND,
        "nothing outside the directory"
    );
}

/// Loads the console as a browser does (`/`, then everything each file refers to), gzip
/// accepted, then again with the ETags it got: prints the bytes of both (the numbers in
/// docs/console.md) and keeps the first load small.
#[tokio::test]
async fn every_file_the_console_loads_is_served_and_a_reload_is_all_304() {
    /// A first load above this is a regression worth a look (xterm.js is most of it).
    const FIRST_LOAD_MAX_BYTES: usize = 256 * 1024;
    let gw = TestGateway::start(args_without_agent).await;
    let gzip = (ACCEPT_ENCODING.as_str(), "gzip");
    let mut to_load = vec!["/".to_owned()];
    // (path, ETag, bytes on the wire)
    let mut loaded: Vec<(String, String, usize)> = Vec::new();
    let mut n_file_bytes = 0;
    while let Some(path) = to_load.pop() {
        if loaded.iter().any(|(seen, _, _)| *seen == path) {
            continue;
        }
        let response = get(&gw, &path, &[gzip]).await;
        assert_eq!(
            response.status(),
            StatusCode::OK,
            "{path}, which the console refers to"
        );
        let etag = header(&response, ETAG).to_owned();
        let gzipped = header(&response, CONTENT_ENCODING) == "gzip";
        let wire = body(response).await;
        let n_wire = wire.len();
        let file = if gzipped { gunzip(&wire) } else { wire };
        n_file_bytes += file.len();
        to_load.extend(references(&path, &String::from_utf8_lossy(&file)));
        loaded.push((path, etag, n_wire));
    }
    let mut n_reload_bytes = 0;
    for (path, etag, _) in &loaded {
        let response = get(&gw, path, &[gzip, (IF_NONE_MATCH.as_str(), etag)]).await;
        assert_eq!(
            response.status(),
            StatusCode::NOT_MODIFIED,
            "reloading {path}"
        );
        n_reload_bytes += body(response).await.len();
    }
    let n_wire_bytes: usize = loaded.iter().map(|(_, _, n)| n).sum();
    let files: Vec<String> = loaded
        .iter()
        .map(|(path, _, n)| format!("{path} {n}"))
        .collect();
    eprintln!(
        "console first load: {} files, {n_wire_bytes} body bytes on the wire (gzip), \
         {n_file_bytes} uncompressed ({}); reload: {} x 304, {n_reload_bytes} body bytes",
        loaded.len(),
        files.join(", "),
        loaded.len()
    );
    assert!(loaded.len() > 1, "index.html refers to files: {loaded:?}");
    assert_eq!(n_reload_bytes, 0);
    assert!(
        n_wire_bytes < FIRST_LOAD_MAX_BYTES,
        "the first load is {n_wire_bytes} bytes: {loaded:?}"
    );
}

/// The width and height of a PNG, from its signature and `IHDR` chunk; `None` if it is not one.
fn png_size(bytes: &[u8]) -> Option<(u32, u32)> {
    let signature = b"\x89PNG\r\n\x1a\n";
    if bytes.len() < 24 || &bytes[..8] != signature || &bytes[12..16] != b"IHDR" {
        return None;
    }
    let number = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    Some((number(16), number(20)))
}

/// The shell line the gateway puts before `sw.js`: `(version, files)`.
fn service_worker_shell(script: &str) -> (String, Vec<String>) {
    let start = "const WARREN_SHELL = ";
    let at = script
        .find(start)
        .unwrap_or_else(|| panic!("sw.js starts with its shell line: {script}"));
    let rest = &script[at + start.len()..];
    let end = rest.find(";\n").expect("the shell line ends with ;");
    let shell: Value = serde_json::from_str(&rest[..end]).expect("the shell line is JSON");
    let version = shell["version"].as_str().expect("a version").to_owned();
    let files = shell["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|file| file.as_str().expect("a URL").to_owned())
        .collect();
    (version, files)
}

#[tokio::test]
async fn the_manifest_makes_the_console_installable_with_png_icons_of_their_size() {
    let gw = TestGateway::start(args_without_agent).await;
    let index = String::from_utf8(body(get(&gw, "/", &[]).await).await).expect("UTF-8");
    for link in [
        r#"<link rel="manifest" href="/manifest.webmanifest">"#,
        r#"<link rel="apple-touch-icon" href="/console/icons/icon-192.png">"#,
        r##"<meta name="theme-color" content="#ffffff" media="(prefers-color-scheme: light)">"##,
        r##"<meta name="theme-color" content="#0d1117" media="(prefers-color-scheme: dark)">"##,
    ] {
        assert!(index.contains(link), "index.html has {link}");
    }

    let response = get(&gw, "/manifest.webmanifest", &[]).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(&response, CONTENT_TYPE), "application/manifest+json");
    assert_eq!(header(&response, CACHE_CONTROL), "no-cache");
    assert_console_headers(&response, &default_frame_src(&gw));
    let manifest: Value = serde_json::from_slice(&body(response).await).expect("JSON");
    assert_eq!(manifest["name"], "Warren");
    assert_eq!(manifest["short_name"], "Warren");
    assert_eq!(manifest["start_url"], "/");
    assert_eq!(manifest["scope"], "/");
    assert_eq!(manifest["display"], "standalone");
    for color in ["theme_color", "background_color"] {
        let value = manifest[color].as_str().unwrap_or_default();
        assert!(
            value.len() == 7 && value.starts_with('#'),
            "{color}: {manifest}"
        );
    }

    let icons = manifest["icons"].as_array().expect("icons");
    let mut seen = Vec::new();
    for icon in icons {
        let src = icon["src"].as_str().expect("an icon's src");
        let sizes = icon["sizes"].as_str().expect("an icon's sizes");
        let purpose = icon["purpose"].as_str().unwrap_or("any");
        assert_eq!(icon["type"], "image/png", "{icon}");
        let response = get(&gw, src, &[]).await;
        assert_eq!(response.status(), StatusCode::OK, "{src}");
        assert_eq!(header(&response, CONTENT_TYPE), "image/png", "{src}");
        let (width, height) =
            png_size(&body(response).await).unwrap_or_else(|| panic!("{src} is a PNG"));
        assert_eq!(format!("{width}x{height}"), sizes, "{src}");
        seen.push((width, purpose.to_owned()));
    }
    for want in [(192, "any"), (512, "any"), (512, "maskable")] {
        assert!(
            seen.iter()
                .any(|(size, purpose)| *size == want.0 && purpose == want.1),
            "an icon of {} px for {}: {manifest}",
            want.0,
            want.1
        );
    }
}

#[tokio::test]
async fn the_service_worker_is_at_the_root_and_caches_every_file_the_console_loads() {
    let gw = TestGateway::start(args_without_agent).await;
    let response = get(&gw, "/sw.js", &[]).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        header(&response, CONTENT_TYPE),
        "text/javascript; charset=utf-8"
    );
    assert_eq!(header(&response, CACHE_CONTROL), "no-cache");
    assert_console_headers(&response, &default_frame_src(&gw));
    let script = String::from_utf8(body(response).await).expect("UTF-8");
    let (version, files) = service_worker_shell(&script);
    assert!(
        version.len() >= 8 && version.bytes().all(|b| b.is_ascii_hexdigit()),
        "{version}"
    );
    assert!(script.contains("addEventListener(\"fetch\""), "{script}");

    // The page names the same version, so a worker can tell it is outdated.
    let page = get(&gw, "/", &[]).await;
    assert_eq!(header(&page, "x-warren-shell"), version);

    // Everything the console loads (the page, what it refers to, what that refers to: xterm.js
    // included) is in the shell; nothing of the API is.
    let mut to_load = vec!["/".to_owned()];
    let mut loaded = Vec::new();
    while let Some(path) = to_load.pop() {
        if loaded.contains(&path) {
            continue;
        }
        let response = get(&gw, &path, &[]).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        let text = String::from_utf8_lossy(&body(response).await).into_owned();
        to_load.extend(references(&path, &text));
        loaded.push(path);
    }
    for path in &loaded {
        assert!(files.contains(path), "{path} is in the shell: {files:?}");
    }
    for want in [
        "/manifest.webmanifest",
        "/console/install.js",
        "/console/vendor/xterm/xterm.mjs",
        "/console/vendor/xterm/xterm.css",
        "/console/vendor/addon-fit/addon-fit.mjs",
        "/console/icons/icon-512.png",
        "/console/icons/maskable-512.png",
    ] {
        assert!(files.iter().any(|file| file == want), "{want}: {files:?}");
    }
    for file in &files {
        assert!(
            file == "/" || file == "/manifest.webmanifest" || file.starts_with("/console/"),
            "{file}"
        );
        assert!(
            !file.ends_with("LICENSE") && !file.ends_with(".md") && !file.ends_with("sw.js"),
            "{file} is not something the page loads"
        );
        let response = get(&gw, file, &[]).await;
        assert_eq!(response.status(), StatusCode::OK, "{file} of the shell");
    }
}

#[tokio::test]
async fn the_shell_version_changes_when_a_file_of_the_shell_changes() {
    let console_dir = tempfile::tempdir().expect("temp console dir");
    let write = |path: &str, content: &str| {
        std::fs::write(console_dir.path().join(path), content)
            .unwrap_or_else(|e| panic!("writes {path}: {e}"));
    };
    write("index.html", "<!doctype html><p>first</p>");
    write("main.js", "export const n = 1;\n");
    write("README.md", "notes\n");
    write("sw.js", "self.addEventListener(\"fetch\", () => {});\n");
    let dir = console_dir.path().to_path_buf();
    let gw = TestGateway::start(move |data| {
        let mut args = args_without_agent(data);
        args.console_dir = Some(dir);
        args
    })
    .await;
    let shell = || async {
        let script = String::from_utf8(body(get(&gw, "/sw.js", &[]).await).await).expect("UTF-8");
        let page = header(&get(&gw, "/", &[]).await, "x-warren-shell").to_owned();
        let shell = service_worker_shell(&script);
        assert_eq!(page, shell.0, "the page's version is the worker's");
        assert!(
            script.ends_with("self.addEventListener(\"fetch\", () => {});\n"),
            "{script}"
        );
        shell
    };

    let (first, files) = shell().await;
    assert_eq!(files, ["/", "/console/main.js"]);
    write("README.md", "other notes\n");
    assert_eq!(shell().await.0, first, "a README is not part of the shell");
    write("main.js", "export const n = 2;\n");
    let (second, _) = shell().await;
    assert_ne!(second, first, "a changed module is a new shell");
    write("index.html", "<!doctype html><p>second</p>");
    let (third, _) = shell().await;
    assert_ne!(third, second, "a changed page is a new shell");
}
