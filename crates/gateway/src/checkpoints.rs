//! A session's checkpoints (checkpoints.md): the list, a listing or a file as of one, the diff
//! between two, rewind and fork. What they are and when they are taken is the engine's
//! (`warren_engine::checkpoints`); this module reads requests and shapes answers. Another
//! owner's session is 404 `SESSION_NOT_FOUND`, an id that names no checkpoint of this session
//! 404 `CHECKPOINT_NOT_FOUND`; paths follow the files routes' rule (`files::workspace_path`).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::FromRequestParts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use warren_checkpoint::{Content, Entry};
use warren_engine::checkpoints::{CheckpointPage, MAX_PAGE};
use warren_http::range::{RangeAnswer, parse_range};
use warren_protocol::error::ErrorBody;
use warren_protocol::files::{FileEntry, FileKind, FileList};
use warren_protocol::gateway::SessionInfo;

use crate::Gateway;
use crate::auth::Device;
use crate::error::{GatewayError, OptionalJson, Path};
use crate::files::{
    ChannelWriter, FileQuery, MAX_LISTED, download_headers, tokio_stream_of, unsatisfiable,
};
use crate::session::Session;

pub fn routes() -> OpenApiRouter<Arc<Gateway>> {
    OpenApiRouter::new()
        .routes(routes!(list_checkpoints))
        .routes(routes!(checkpoint_files))
        .routes(routes!(checkpoint_file))
        .routes(routes!(checkpoint_diff))
        .routes(routes!(export_checkpoint))
        .routes(routes!(rewind_checkpoint))
        .routes(routes!(fork_checkpoint))
}

/// The device's session named by the path's `{id}`, and the checkpoint id when there is one.
struct CheckpointRequest {
    gateway: Arc<Gateway>,
    device_id: String,
    session: Arc<Session>,
    checkpoint: String,
}

impl FromRequestParts<Arc<Gateway>> for CheckpointRequest {
    type Rejection = GatewayError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        gateway: &Arc<Gateway>,
    ) -> Result<Self, GatewayError> {
        let Device(device_id) = Device::from_request_parts(parts, gateway).await?;
        let Path(mut params) =
            Path::<std::collections::HashMap<String, String>>::from_request_parts(parts, gateway)
                .await?;
        let id = params.remove("id").unwrap_or_default();
        let session = gateway.engine.sessions.get(&device_id, &id)?;
        Ok(CheckpointRequest {
            gateway: gateway.clone(),
            device_id,
            session,
            checkpoint: params.remove("cid").unwrap_or_default(),
        })
    }
}

/// The value of query parameter `key` (percent-decoded), if given.
fn query_value(uri: &axum::http::Uri, key: &str) -> Result<Option<String>, GatewayError> {
    for pair in uri.query().unwrap_or("").split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name == key {
            let bytes: Vec<u8> =
                percent_encoding::percent_decode_str(&value.replace('+', " ")).collect();
            return String::from_utf8(bytes)
                .map(Some)
                .map_err(|_| invalid_query(format!("the {key} parameter is not valid UTF-8")));
        }
    }
    Ok(None)
}

fn invalid_query(message: String) -> GatewayError {
    crate::files_error::FilesError::new(crate::files_error::FilesErrorKind::InvalidQuery, message)
        .into()
}

/// `GET /v1/sessions/{id}/checkpoints?before=&limit=`.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/checkpoints",
    tag = "checkpoints",
    params(("id" = String, Path, description = "The session's id"), ("before" = Option<String>, Query, description = "Continue after this checkpoint (a page's `next`)"), ("limit" = Option<u32>, Query, minimum = 1, maximum = 200, description = "At most this many (default 50)")),
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 200, description = "The session's checkpoints, newest first", body = CheckpointPage),
        (status = 400, description = "INVALID_QUERY: a limit that is not 1 to 200", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND, or CHECKPOINT_NOT_FOUND (`before`)", body = ErrorBody),
    ),
)]
async fn list_checkpoints(
    request: CheckpointRequest,
    uri: axum::http::Uri,
) -> Result<axum::Json<CheckpointPage>, GatewayError> {
    let before = query_value(&uri, "before")?;
    let limit = match query_value(&uri, "limit")?.as_deref() {
        None => 50,
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_PAGE).contains(n))
            .ok_or_else(|| invalid_query(format!("limit must be 1 to {MAX_PAGE}, not {text:?}")))?,
    };
    let page = request
        .gateway
        .engine
        .checkpoints
        .page(&request.session, before, limit)
        .await?;
    Ok(axum::Json(page))
}

/// `GET /v1/sessions/{id}/checkpoints/{cid}/files?path=&depth=`.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/checkpoints/{cid}/files",
    tag = "checkpoints",
    params(("id" = String, Path, description = "The session's id"), ("cid" = String, Path, description = "The checkpoint's id"), ("path" = Option<String>, Query, description = "Workspace-relative directory; absent: the root"), ("depth" = Option<u32>, Query, minimum = 1, maximum = 5, description = "Levels listed, 1 to 5 (default 1)")),
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 200, description = "The directory's entries as of the checkpoint (links are described, never followed)", body = FileList),
        (status = 400, description = "INVALID_PATH or INVALID_QUERY", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 403, description = "PATH_ESCAPE: the path climbs above the workspace", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND, CHECKPOINT_NOT_FOUND or FILE_NOT_FOUND", body = ErrorBody),
        (status = 409, description = "NOT_A_DIRECTORY, or CHECKPOINT_BROKEN: its entry list does not match its hashes", body = ErrorBody),
    ),
)]
async fn checkpoint_files(
    request: CheckpointRequest,
    uri: axum::http::Uri,
) -> Result<axum::Json<FileList>, GatewayError> {
    let query = FileQuery::parse(uri.query())?;
    let (path, depth) = (query.path()?, query.depth()?);
    let listed = list_as_of(
        &request.gateway,
        &request.session,
        &request.checkpoint,
        path,
        depth,
    )
    .await?;
    Ok(axum::Json(listed))
}

/// The directory `path` (normalized) as of checkpoint `id`, `depth` levels.
async fn list_as_of(
    gateway: &Gateway,
    session: &Session,
    id: &str,
    path: String,
    depth: u32,
) -> Result<FileList, GatewayError> {
    let (stores, loaded) = gateway.engine.checkpoints.load(session, id, false).await?;
    let listed = stores
        .workspace
        .list(&loaded.workspace, &path, depth as usize)
        .map_err(warren_engine::EngineError::from)?;
    let truncated = listed.len() > MAX_LISTED;
    Ok(FileList {
        path,
        entries: listed
            .into_iter()
            .take(MAX_LISTED)
            .map(file_entry)
            .collect(),
        truncated,
    })
}

fn file_entry(entry: &Entry) -> FileEntry {
    let (kind, target) = match &entry.content {
        Content::File(_) => (FileKind::File, None),
        Content::Dir => (FileKind::Dir, None),
        Content::Symlink(target) => (FileKind::Symlink, Some(target.clone())),
    };
    let modified = chrono::DateTime::from_timestamp_nanos(entry.mtime_ns);
    FileEntry {
        name: entry
            .path
            .rsplit('/')
            .next()
            .unwrap_or(&entry.path)
            .to_owned(),
        path: entry.path.clone(),
        kind,
        size: entry.size,
        mode: entry.mode,
        modified_at: modified.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        target,
    }
}

/// `GET /v1/sessions/{id}/checkpoints/{cid}/files/content?path=`.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/checkpoints/{cid}/files/content",
    tag = "checkpoints",
    params(("id" = String, Path, description = "The session's id"), ("cid" = String, Path, description = "The checkpoint's id"), ("path" = String, Query, description = "Workspace-relative file path"), ("Range" = Option<String>, Header, nullable = false, description = "One byte range, `bytes=start-end`")),
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 200, description = "The file as of the checkpoint", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 206, description = "The asked range, with Content-Range", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 400, description = "INVALID_PATH (NUL, too long, not UTF-8, the root)", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 403, description = "PATH_ESCAPE, or NOT_REGULAR_FILE: a directory or a link", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND, CHECKPOINT_NOT_FOUND or FILE_NOT_FOUND", body = ErrorBody),
        (status = 409, description = "CHECKPOINT_BROKEN: a chunk does not match its hash or is gone", body = ErrorBody),
        (status = 416, description = "RANGE_NOT_SATISFIABLE (Content-Range: bytes */size)", body = ErrorBody),
    ),
)]
async fn checkpoint_file(
    request: CheckpointRequest,
    uri: axum::http::Uri,
    asked: HeaderMap,
) -> Result<Response, GatewayError> {
    let query = FileQuery::parse(uri.query())?;
    let path = query.file_path()?;
    content_as_of(
        &request.gateway,
        &request.session,
        &request.checkpoint,
        path,
        &asked,
    )
    .await
}

/// The file `path` (normalized) as of checkpoint `id`, the `Range` in `asked` honoured.
async fn content_as_of(
    gateway: &Gateway,
    session: &Session,
    id: &str,
    path: String,
    asked: &HeaderMap,
) -> Result<Response, GatewayError> {
    let (stores, loaded) = gateway.engine.checkpoints.load(session, id, false).await?;
    let manifest = loaded.workspace;
    let size = match manifest.entry(&path) {
        Some(entry) if matches!(entry.content, Content::File(_)) => entry.size,
        Some(_) => {
            return Err(
                warren_engine::EngineError::from(warren_checkpoint::Error::WrongKind {
                    path,
                    expected: "regular file",
                })
                .into(),
            );
        }
        None => {
            return Err(
                warren_engine::EngineError::from(warren_checkpoint::Error::NoEntry(path)).into(),
            );
        }
    };
    let mut headers = download_headers(&path);
    let (status, range) = match asked
        .get(header::RANGE)
        .map(|r| parse_range(r.as_bytes(), size))
    {
        None | Some(RangeAnswer::Whole) => (StatusCode::OK, 0..size),
        Some(RangeAnswer::Part { start, end }) => {
            if let Ok(value) = HeaderValue::from_str(&format!("bytes {start}-{end}/{size}")) {
                headers.insert(header::CONTENT_RANGE, value);
            }
            (StatusCode::PARTIAL_CONTENT, start..end + 1)
        }
        Some(RangeAnswer::Unsatisfiable) => {
            return Ok(unsatisfiable(Some(format!("bytes */{size}"))));
        }
    };
    headers.insert(
        header::CONTENT_LENGTH,
        HeaderValue::from(range.end - range.start),
    );
    let manifest = Arc::new(manifest);
    let body = checkpoint_body(stores.workspace.clone(), manifest, path, range).await?;
    Ok((status, headers, body).into_response())
}

/// The bytes `range` of the file `path` of checkpoint `manifest` as a streamed body. Its first
/// chunk is read before the answer starts, so a broken checkpoint is a 409 and not a cut-off
/// body (the files route answers an archived session's download with it too).
pub(crate) async fn checkpoint_body(
    store: Arc<warren_checkpoint::CheckpointStore>,
    manifest: Arc<warren_checkpoint::Manifest>,
    path: String,
    range: std::ops::Range<u64>,
) -> Result<Body, GatewayError> {
    if range.start < range.end {
        let first = range.start..(range.start + 1).min(range.end);
        let (store, manifest, path) = (store.clone(), manifest.clone(), path.clone());
        tokio::task::spawn_blocking(move || {
            store.read_file(&manifest, &path, first, &mut std::io::sink())
        })
        .await
        .map_err(|e| GatewayError::Internal(e.to_string()))?
        .map_err(warren_engine::EngineError::from)?;
    }
    let (sender, receiver) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(4);
    let failed = sender.clone();
    tokio::task::spawn_blocking(move || {
        let mut out = std::io::BufWriter::with_capacity(64 * 1024, ChannelWriter(sender));
        let read = store
            .read_file(&manifest, &path, range, &mut out)
            .and_then(|_| {
                std::io::Write::flush(&mut out)
                    .map_err(|e| warren_checkpoint::Error::Invalid(e.to_string()))
            });
        if let Err(e) = read {
            tracing::debug!(error = %e, path, "checkpoint download ended early");
            let _ = failed.blocking_send(Err(std::io::Error::other(e.to_string())));
        }
    });
    Ok(Body::from_stream(tokio_stream_of(receiver)))
}

/// An added or removed path.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct DiffPath {
    path: String,
    /// A file's bytes, a link's target length, 0 for a directory.
    size: u64,
    #[serde(rename = "type")]
    kind: FileKind,
}

/// A path whose content, target, mode or kind differs.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct DiffModified {
    path: String,
    old_size: u64,
    new_size: u64,
    /// Either side is not UTF-8 text.
    binary: bool,
    /// A unified diff for text files of at most 1 MiB on both sides.
    diff: Option<String>,
}

/// `GET …/checkpoints/{cid}/diff`'s answer: what changed from `against` to `cid`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct DiffAnswer {
    /// The checkpoint compared from (`null`: none before; everything is added).
    against: Option<String>,
    added: Vec<DiffPath>,
    removed: Vec<DiffPath>,
    modified: Vec<DiffModified>,
}

/// `GET /v1/sessions/{id}/checkpoints/{cid}/diff?against=`.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/checkpoints/{cid}/diff",
    tag = "checkpoints",
    params(("id" = String, Path, description = "The session's id"), ("cid" = String, Path, description = "The checkpoint's id"), ("against" = Option<String>, Query, description = "The checkpoint to compare from; absent: the one taken before")),
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 200, description = "What changed from `against` to the checkpoint", body = DiffAnswer),
        (status = 400, description = "INVALID_QUERY", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND or CHECKPOINT_NOT_FOUND (either side)", body = ErrorBody),
        (status = 409, description = "CHECKPOINT_BROKEN", body = ErrorBody),
    ),
)]
async fn checkpoint_diff(
    request: CheckpointRequest,
    uri: axum::http::Uri,
) -> Result<axum::Json<DiffAnswer>, GatewayError> {
    let against = query_value(&uri, "against")?;
    let checkpoints = &request.gateway.engine.checkpoints;
    let (stores, new) = checkpoints
        .load(&request.session, &request.checkpoint, false)
        .await?;
    let against = match against {
        Some(against) => Some(against),
        None => {
            checkpoints
                .previous_of(&request.session, &request.checkpoint)
                .await?
        }
    };
    let old = match &against {
        Some(against) => Some(checkpoints.load(&request.session, against, false).await?.1),
        None => None,
    };
    let answer = tokio::task::spawn_blocking(move || {
        let old = old.map(|old| old.workspace).unwrap_or_else(|| {
            let mut empty = new.workspace.clone();
            empty.entries.clear();
            empty
        });
        let new = new.workspace;
        let diff = stores.workspace.diff(&old, &new)?;
        let path_of = |manifest: &warren_checkpoint::Manifest, path: String| {
            let entry = manifest.entry(&path);
            DiffPath {
                size: entry.map_or(0, |e| e.size),
                kind: entry.map_or(FileKind::Other, |e| file_entry(e).kind),
                path,
            }
        };
        Ok::<_, warren_checkpoint::Error>(DiffAnswer {
            against,
            added: diff.added.into_iter().map(|p| path_of(&new, p)).collect(),
            removed: diff.removed.into_iter().map(|p| path_of(&old, p)).collect(),
            modified: diff
                .modified
                .into_iter()
                .map(|m| DiffModified {
                    path: m.path,
                    old_size: m.old_size,
                    new_size: m.new_size,
                    binary: m.binary,
                    diff: m.diff,
                })
                .collect(),
        })
    })
    .await
    .map_err(|e| GatewayError::Internal(e.to_string()))?
    .map_err(warren_engine::EngineError::from)?;
    Ok(axum::Json(answer))
}

/// `GET /v1/sessions/{id}/checkpoints/{cid}/export`.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/checkpoints/{cid}/export",
    tag = "checkpoints",
    params(("id" = String, Path, description = "The session's id"), ("cid" = String, Path, description = "The checkpoint's id")),
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 200, description = "The workspace as of the checkpoint, a zstd-compressed tar (`<session>-<checkpoint>.tar.zst`), streamed; a chunk found broken part way cuts the stream", content_type = "application/zstd", body = Vec<u8>),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND or CHECKPOINT_NOT_FOUND", body = ErrorBody),
        (status = 409, description = "CHECKPOINT_BROKEN: its entry list does not match its hashes", body = ErrorBody),
    ),
)]
async fn export_checkpoint(request: CheckpointRequest) -> Result<Response, GatewayError> {
    let (stores, loaded) = request
        .gateway
        .engine
        .checkpoints
        .load(&request.session, &request.checkpoint, false)
        .await?;
    let name = format!(
        "{}-{}.{}",
        request.session.id,
        request.checkpoint,
        warren_snapshot::EXTENSION
    );
    let mut headers = download_headers(&name);
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/zstd"),
    );
    headers.remove(header::ACCEPT_RANGES);
    let (sender, receiver) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(4);
    let failed = sender.clone();
    let (store, manifest) = (stores.workspace.clone(), loaded.workspace);
    tokio::task::spawn_blocking(move || {
        let mut out = std::io::BufWriter::with_capacity(64 * 1024, ChannelWriter(sender));
        if let Err(e) = store.export(&manifest, &mut out) {
            tracing::debug!(error = %e, "checkpoint export ended early");
            let _ = failed.blocking_send(Err(std::io::Error::other(e.to_string())));
        }
    });
    Ok((
        StatusCode::OK,
        headers,
        Body::from_stream(tokio_stream_of(receiver)),
    )
        .into_response())
}

/// `POST …/rewind` body.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct RewindBody {
    /// Also stop the sandbox's processes (the next use starts new ones); default false.
    #[serde(default)]
    restart: bool,
}

/// `POST …/rewind`'s answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct Rewound {
    /// The checkpoint the workspace now holds.
    checkpoint: warren_engine::checkpoints::CheckpointInfo,
    restart: bool,
}

/// `POST /v1/sessions/{id}/checkpoints/{cid}/rewind {"restart"}`.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/checkpoints/{cid}/rewind",
    tag = "checkpoints",
    params(("id" = String, Path, description = "The session's id"), ("cid" = String, Path, description = "The checkpoint's id")),
    request_body(content = RewindBody, description = "Optional"),
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 202, description = "The workspace (and the agent's home) are the checkpoint's; what they held was kept as a checkpoint first; the agent's next prompt says so", body = Rewound),
        (status = 400, description = "INVALID_REQUEST_BODY", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND or CHECKPOINT_NOT_FOUND", body = ErrorBody),
        (status = 409, description = "TURN_RUNNING: a turn runs; or CHECKPOINT_BROKEN: nothing was changed", body = ErrorBody),
        (status = 502, description = "HANDS_FAILED: remote hands' execd could not stream or apply the change; nothing was changed", body = ErrorBody),
        (status = 507, description = "STORAGE_FULL", body = ErrorBody),
    ),
)]
async fn rewind_checkpoint(
    request: CheckpointRequest,
    OptionalJson(body): OptionalJson<RewindBody>,
) -> Result<Response, GatewayError> {
    let checkpoint = request
        .gateway
        .engine
        .checkpoints
        .rewind(&request.session, &request.checkpoint, body.restart)
        .await?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(Rewound {
            checkpoint,
            restart: body.restart,
        }),
    )
        .into_response())
}

/// `POST …/fork` body.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct ForkBody {
    /// At most 200 characters; default: the source's title and "(fork)".
    #[serde(default)]
    title: Option<String>,
}

/// `POST /v1/sessions/{id}/checkpoints/{cid}/fork {"title"}`.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/checkpoints/{cid}/fork",
    tag = "checkpoints",
    params(("id" = String, Path, description = "The session's id"), ("cid" = String, Path, description = "The checkpoint's id")),
    request_body(content = ForkBody, description = "Optional"),
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 201, description = "The new session: its workspace and agent home are the checkpoint's, its first event `forked`", body = SessionInfo),
        (status = 400, description = "INVALID_REQUEST_BODY, or a title over 200 characters", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND or CHECKPOINT_NOT_FOUND", body = ErrorBody),
        (status = 409, description = "CHECKPOINT_BROKEN: a chunk is corrupt or was collected; no session was made", body = ErrorBody),
        (status = 429, description = "QUOTA_EXCEEDED or SERVER_BUSY", body = ErrorBody),
        (status = 502, description = "HANDS_FAILED: the new session's remote hands could not take the files; no session was made", body = ErrorBody),
        (status = 507, description = "STORAGE_FULL", body = ErrorBody),
    ),
)]
async fn fork_checkpoint(
    request: CheckpointRequest,
    OptionalJson(body): OptionalJson<ForkBody>,
) -> Result<Response, GatewayError> {
    if let Some(title) = &body.title {
        crate::api::check_title(title)?;
    }
    let forked = warren_engine::sessions::fork_session(
        &request.gateway.engine,
        &request.session,
        &request.checkpoint,
        &request.device_id,
        body.title,
    )
    .await?;
    Ok((StatusCode::CREATED, axum::Json(forked.info())).into_response())
}
