//! envd's plain HTTP routes: `GET /files` (download), `POST /files` (upload, multipart or
//! octet-stream, parents created), `GET /envs` and `POST /init`.
//!
//! Relative paths start at the home of the `username=` user (the daemon's own user without
//! one), as envd takes them.
//!
//! Errors are envd's HTTP shape, `{"code": <status>, "message": "..."}`, with the status the
//! Connect code maps to (404 for a missing file, which the SDKs raise as their not-found
//! error). Uploads stream into a temporary file beside the target and are renamed into place,
//! so a reader never sees half a file and a broken upload leaves nothing behind.

use std::collections::HashMap;

use axum::extract::{FromRequest, Multipart, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::{Stream, StreamExt, TryStreamExt};
use serde::Deserialize;
use tokio::io::AsyncWriteExt;

use super::E2b;
use super::connect::{Code, ConnectError};
use super::filesystem::{Filesystem, Target, fs_error};
use crate::fs::confined::{self, TempFile};
use crate::fs::resolve::Part;
use crate::route_helpers::open_file;

/// envd's error body with the status of the error's code.
pub fn http_error(error: ConnectError) -> Response {
    let status = error.code.http_status();
    let body = serde_json::json!({"code": status.as_u16(), "message": error.message});
    (status, axum::Json(body)).into_response()
}

#[derive(Debug, Deserialize)]
pub struct FileQuery {
    path: Option<String>,
    #[serde(default)]
    username: Option<String>,
}

/// `username=` must be a user the request may act as (see `user.rs`); files are read and
/// written by the daemon itself, so only its own user (or none) is accepted.
fn check_username(username: Option<&str>) -> Result<(), ConnectError> {
    let Some(name) = username.filter(|n| !n.is_empty()) else {
        return Ok(());
    };
    let own = rustix::process::getuid().as_raw();
    if super::user::user_name(own).as_deref() == Some(name) || own == 0 {
        return Ok(());
    }
    Err(ConnectError::new(
        Code::PermissionDenied,
        format!("cannot act as user {name:?}: execd's files are its own user's; omit the user"),
    ))
}

/// `GET /files?path=P`: the file's bytes.
pub async fn download(
    State(e2b): State<E2b>,
    query: Result<Query<FileQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let result = async {
        let Query(query) = query.map_err(|e| ConnectError::invalid_argument(e.body_text()))?;
        check_username(query.username.as_deref())?;
        let path = query
            .path
            .ok_or_else(|| ConnectError::invalid_argument("path is required"))?;
        let fs = &e2b.inner.filesystem;
        let base = fs.base(query.username.as_deref())?;
        let target = fs.target(&path, &base)?;
        let (file, size) = fs
            .with_root(move |_, root| {
                open_file(root, &target.parts).map_err(|e| fs_error(&target.shown, e))
            })
            .await?;
        let (status, headers, body) = confined::file_download(file, size, None)
            .await
            .map_err(|e| fs_error(&path, e))?;
        Ok::<_, ConnectError>((status, headers, body).into_response())
    }
    .await;
    result.unwrap_or_else(http_error)
}

/// `POST /files?path=P`: the body (`application/octet-stream`) or each `file` part of a
/// multipart body is written; answers the written entries as envd does.
pub async fn upload(
    State(e2b): State<E2b>,
    query: Result<Query<FileQuery>, axum::extract::rejection::QueryRejection>,
    request: Request,
) -> Response {
    let result = async {
        let Query(query) = query.map_err(|e| ConnectError::invalid_argument(e.body_text()))?;
        check_username(query.username.as_deref())?;
        if let Some(encoding) = request.headers().get(header::CONTENT_ENCODING)
            && encoding.as_bytes() != b"identity"
        {
            return Err(ConnectError::new(
                Code::Unimplemented,
                format!("Content-Encoding {encoding:?} is not supported; upload uncompressed"),
            ));
        }
        let fs = std::sync::Arc::clone(&e2b.inner.filesystem);
        let base = fs.base(query.username.as_deref())?;
        let content_type = content_type(request.headers());
        let mut written = Vec::new();
        if content_type.starts_with("multipart/form-data") {
            let mut multipart = Multipart::from_request(request, &())
                .await
                .map_err(|e| ConnectError::invalid_argument(e.body_text()))?;
            while let Some(field) = multipart
                .next_field()
                .await
                .map_err(|e| ConnectError::invalid_argument(e.body_text()))?
            {
                let path = match (&query.path, field.file_name()) {
                    (Some(path), _) => path.clone(),
                    (None, Some(name)) => name.to_owned(),
                    (None, None) => {
                        return Err(ConnectError::invalid_argument(
                            "a part without a file name needs ?path=",
                        ));
                    }
                };
                let chunks = field.map_err(|e| ConnectError::invalid_argument(e.body_text()));
                written.push(write_file(&fs, &base, &path, chunks).await?);
            }
        } else {
            let path = query
                .path
                .ok_or_else(|| ConnectError::invalid_argument("path is required"))?;
            let chunks = request
                .into_body()
                .into_data_stream()
                .map_err(|e| ConnectError::new(Code::Canceled, format!("reading the upload: {e}")));
            written.push(write_file(&fs, &base, &path, chunks).await?);
        }
        if written.is_empty() {
            return Err(ConnectError::invalid_argument("the upload holds no file"));
        }
        Ok(axum::Json(written).into_response())
    }
    .await;
    result.unwrap_or_else(http_error)
}

fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase()
}

/// Streams `chunks` into `path` (relative ones from `base`) atomically; envd's
/// `{"name","type":"file","path"}`.
async fn write_file(
    fs: &std::sync::Arc<Filesystem>,
    base: &std::path::Path,
    path: &str,
    mut chunks: impl Stream<Item = Result<bytes::Bytes, ConnectError>> + Unpin,
) -> Result<serde_json::Value, ConnectError> {
    let target = fs.target(path, base)?;
    let Some(Part::Name(name)) = target.parts.last().cloned() else {
        return Err(ConnectError::invalid_argument(format!(
            "{path} names no file"
        )));
    };
    let Target {
        shown,
        parts,
        absolute,
    } = target;
    let (entry, temp, file) = fs
        .with_root(move |_, root| {
            root.create_dirs(&parts[..parts.len() - 1])
                .map_err(|e| fs_error(&shown, e))?;
            let entry = root.locate(&parts).map_err(|e| fs_error(&shown, e))?;
            if let Ok(meta) = entry.lstat()
                && meta.is_dir()
            {
                return Err(ConnectError::invalid_argument(format!(
                    "{shown} is a directory"
                )));
            }
            let (temp, file) = TempFile::create_beside(&entry).map_err(|e| fs_error(&shown, e))?;
            Ok((entry, temp, file))
        })
        .await?;
    // Any way out before `persist` (an error, the client hanging up) drops `temp`, which
    // removes the temporary file.
    let mut writer = tokio::fs::File::from_std(file.into_std());
    while let Some(chunk) = chunks.next().await {
        writer
            .write_all(&chunk?)
            .await
            .map_err(|e| fs_error(path, e))?;
    }
    writer.flush().await.map_err(|e| fs_error(path, e))?;
    let file = writer.into_std().await;
    let shown = path.to_owned();
    fs.with_root(move |_, _| {
        file.sync_all().map_err(|e| fs_error(&shown, e))?;
        temp.persist(&entry).map_err(|e| fs_error(&shown, e))
    })
    .await?;
    Ok(serde_json::json!({
        "name": name.to_string_lossy(),
        "type": "file",
        "path": absolute,
    }))
}

/// `GET /envs`: the variables `/init` set.
pub async fn envs(State(e2b): State<E2b>) -> axum::Json<HashMap<String, String>> {
    axum::Json(e2b.init_envs())
}

/// What `POST /init` may carry; everything else (the clock, DNS, mounts) is ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitRequest {
    #[serde(default)]
    env_vars: HashMap<String, String>,
    access_token: Option<String>,
}

/// `POST /init`: merges `envVars` into every later process's environment and, when execd has
/// no token, sets one (as envd's first `/init` does). A token different from the configured one
/// is refused; the host's clock, hosts file and mounts are never touched.
pub async fn init(
    State(e2b): State<E2b>,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    // Over the route's limit (`DefaultBodyLimit`, 1 MiB) is 413, as on every other route.
    let bytes = match body {
        Ok(bytes) => bytes,
        Err(rejection) => {
            let status = rejection.status();
            let message = format!("reading /init: {}", rejection.body_text());
            let body = serde_json::json!({"code": status.as_u16(), "message": message});
            return (status, axum::Json(body)).into_response();
        }
    };
    let result = async {
        let request: InitRequest = if bytes.iter().all(u8::is_ascii_whitespace) {
            InitRequest::default()
        } else {
            serde_json::from_slice(&bytes)
                .map_err(|e| ConnectError::invalid_argument(format!("invalid /init body: {e}")))?
        };
        if request
            .env_vars
            .iter()
            .any(|(k, v)| k.is_empty() || k.contains(['=', '\0']) || v.contains('\0'))
        {
            return Err(ConnectError::invalid_argument(
                "envVars names must be non-empty, without '=' or NUL",
            ));
        }
        if let Some(token) = request.access_token.filter(|t| !t.is_empty()) {
            let mut current = e2b
                .inner
                .access_token
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match current.as_deref() {
                None => *current = Some(token),
                Some(existing) if existing == token => {}
                Some(_) => {
                    return Err(ConnectError::new(
                        Code::PermissionDenied,
                        "the access token is set by execd's configuration and cannot be changed",
                    ));
                }
            }
        }
        e2b.inner
            .init_envs
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend(request.env_vars);
        Ok(StatusCode::NO_CONTENT.into_response())
    }
    .await;
    result.unwrap_or_else(http_error)
}
