//! Warren's own file routes: the agent's `fs/read_text_file` and `fs/write_text_file` and the
//! gateway's file browser (docs/exec-tools.md, "Files").
//!
//! - `GET /v1/files?path=P`: the file's bytes, or one byte range of them (`Range`, 206/416).
//!   The file is opened once through the confined walk and its size taken from that descriptor,
//!   so a file swapped for a symlink midway can never make it read anything else.
//! - `PUT /v1/files?path=P`: streams the body into a temporary file beside the target, fsyncs
//!   it and renames it into place (creating missing parent directories), so a reader never sees
//!   half a file; a body that breaks off leaves the target as it was and no temporary file.
//! - `GET /v1/files/list?path=P&depth=N`, `POST /v1/files/dir?path=P` (`mkdir -p`),
//!   `POST /v1/files/move`, `DELETE /v1/files?path=P&recursive=B`.
//! - `GET /v1/files/watch`: the change feed, in [`watch`].
//!
//! Paths are absolute or relative to `--root`, and confined beneath it by the same walk as the
//! OpenSandbox file routes (`fs::resolve`: no `..`, symlink or swap leads out, FIFOs
//! and devices are never opened); listings and recursive removal never follow a symlink. The
//! filesystem work both APIs share is `fs::confined`. Errors are [`FilesError`];
//! `crate::error` maps them.

mod watch;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use cap_std::fs::{Dir, MetadataExt};
use futures_util::TryStreamExt;
use serde::Deserialize;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use warren_http::range::{RangeAnswer, parse_range};
use warren_protocol::error::ErrorBody;
use warren_protocol::files::{FileEntry, FileKind, FileList, FileWritten, MoveRequest};

use crate::error::{ApiError, Json};
use crate::fs::confined::{self, MoveError, MoveRefusal, Seen, TempFile, enough_when};
use crate::fs::resolve::{self, Part, Refusal, Root, Want};
use crate::fs::{PathError, is_escape, path_error};
use crate::route_helpers::{open_file, query};

pub mod error;
pub use error::FilesError;

/// Longest path a request may name, in bytes (Linux's `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;
/// Most levels `GET /v1/files/list` descends.
pub const MAX_LIST_DEPTH: u32 = 5;

/// The file routes' state: the canonical root, and the end of every change feed.
#[derive(Clone)]
pub struct FilesApi {
    root: Arc<PathBuf>,
    /// Cancelled when the daemon stops: ends the open watches, which graceful shutdown would
    /// otherwise wait for forever.
    stopping: CancellationToken,
}

/// A path from a request: as the client wrote it (for messages and answers) and as parts below
/// the root.
struct Target {
    shown: String,
    parts: Vec<Part>,
}

impl Target {
    /// The path root-relative, `/`-separated, `.` and `..` applied lexically (`""`: the root).
    fn relative(&self) -> String {
        let mut names = Vec::new();
        for part in &self.parts {
            match part {
                Part::Name(name) => names.push(name.to_string_lossy()),
                Part::Parent => {
                    names.pop();
                }
            }
        }
        names.join("/")
    }
}

impl FilesApi {
    pub fn new(root: &Path) -> Self {
        let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
        Self {
            root: Arc::new(root),
            stopping: CancellationToken::new(),
        }
    }

    /// Ends every open change feed (called when the daemon shuts down).
    pub fn stop_watches(&self) {
        self.stopping.cancel();
    }

    /// `raw` below the root: absolute paths must lie under it, relative ones are taken from it.
    /// Empty is refused (a file or entry is needed).
    fn target(&self, raw: &str) -> Result<Target, FilesError> {
        if raw.is_empty() {
            return Err(FilesError::InvalidPath("path must not be empty".into()));
        }
        self.dir_target(raw)
    }

    /// [`FilesApi::target`] where `""` means the root, as `.` does.
    fn dir_target(&self, raw: &str) -> Result<Target, FilesError> {
        if raw.contains('\0') {
            return Err(FilesError::InvalidPath(
                "path must be free of NUL bytes".into(),
            ));
        }
        if raw.len() > MAX_PATH_BYTES {
            return Err(FilesError::InvalidPath(format!(
                "path is {} bytes long, more than the {MAX_PATH_BYTES} allowed",
                raw.len()
            )));
        }
        let path = Path::new(raw);
        let absolute = if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.root.join(path)
        };
        let parts = resolve::parts_beneath(&self.root, &absolute)
            .ok_or_else(|| FilesError::Escape(raw.into()))?;
        Ok(Target {
            shown: raw.to_owned(),
            parts,
        })
    }

    /// Runs `work` with an open root on the blocking pool.
    async fn with_root<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Root) -> Result<T, FilesError> + Send + 'static,
    ) -> Result<T, FilesError> {
        let root_path = Arc::clone(&self.root);
        blocking(move || {
            let root = Root::new(&root_path).map_err(|source| FilesError::Io {
                path: root_path.display().to_string(),
                source,
            })?;
            work(&root)
        })
        .await
    }
}

pub fn routes(state: FilesApi) -> OpenApiRouter {
    OpenApiRouter::new()
        .routes(routes!(read, write, remove))
        .routes(routes!(list))
        .routes(routes!(make_dir))
        .routes(routes!(rename))
        .routes(routes!(watch::watch))
        .with_state(state)
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct PathQuery {
    /// Absolute beneath the root, or relative to it.
    #[param(min_length = 1)]
    path: String,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    #[serde(default)]
    path: String,
    /// Levels to descend (default 1).
    #[param(minimum = 1, maximum = 5)]
    depth: Option<u32>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct DeleteQuery {
    /// Absolute beneath the root, or relative to it.
    #[param(min_length = 1)]
    path: String,
    #[serde(default)]
    recursive: bool,
}

fn fs_error(shown: &str, err: io::Error) -> FilesError {
    if is_escape(&err) {
        return FilesError::Escape(shown.into());
    }
    match resolve::refusal(&err) {
        Some(Refusal::NotRegular) => return FilesError::NotRegular(shown.into()),
        Some(Refusal::NotDirectory) => {
            return PathError::NotADirectory(format!("{shown} is not a directory")).into();
        }
        Some(Refusal::Loop) => {
            return FilesError::InvalidPath(format!("{shown}: too many levels of symbolic links"));
        }
        Some(Refusal::Escape) | None => {}
    }
    if let Some(path_error) = path_error(shown, &err) {
        return path_error.into();
    }
    match err.raw_os_error() {
        Some(code) if code == rustix::io::Errno::LOOP.raw_os_error() => {
            FilesError::InvalidPath(format!("{shown}: too many levels of symbolic links"))
        }
        // A directory where a file was meant (made there meanwhile, e.g. while a write's
        // temporary file was filled): the same refusal as one found there first.
        Some(code) if code == rustix::io::Errno::ISDIR.raw_os_error() => {
            FilesError::NotRegular(shown.into())
        }
        _ if err.kind() == io::ErrorKind::NotFound => FilesError::NotFound(shown.into()),
        _ => FilesError::Io {
            path: shown.into(),
            source: err,
        },
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, FilesError> + Send + 'static,
) -> Result<T, FilesError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| FilesError::Io {
            path: String::new(),
            source: io::Error::other(e.to_string()),
        })?
}

/// `GET /v1/files?path=P`: the file's bytes; with `Range: bytes=a-b`, those (206), or 416 with
/// `Content-Range: bytes */size` when none of the file is named. An invalid Range, or several
/// ranges, is ignored (200 with the whole file).
/// The file's bytes, or one byte range of them.
#[utoipa::path(
    get, path = "/v1/files", tag = "files",
    params(
        PathQuery,
        ("Range" = Option<String>, Header, description = "One byte range, `bytes=START-END`, `bytes=START-` or `bytes=-SUFFIX`; anything else is ignored (the whole file)"),
    ),
    responses(
        (status = 200, description = "The whole file", content_type = "application/octet-stream", body = [u8]),
        (status = 206, description = "The range asked for (`Content-Range`)", content_type = "application/octet-stream", body = [u8]),
        (status = 400, description = "`INVALID_REQUEST_BODY` (a query that does not parse), `INVALID_PATH` or `NAME_TOO_LONG`", body = ErrorBody),
        (status = 403, description = "`PATH_ESCAPE`, `NOT_REGULAR_FILE` or `PERMISSION_DENIED`", body = ErrorBody),
        (status = 404, description = "`FILE_NOT_FOUND`", body = ErrorBody),
        (status = 409, description = "`NOT_A_DIRECTORY`: a parent in the path is a file", body = ErrorBody),
        (status = 416, description = "`RANGE_NOT_SATISFIABLE` (`Content-Range: bytes */SIZE`)", body = ErrorBody),
        (status = 500, description = "`RUNTIME_ERROR`: the file could not be read", body = ErrorBody),
    )
)]
async fn read(
    State(files): State<FilesApi>,
    query_result: Result<Query<PathQuery>, QueryRejection>,
    request_headers: HeaderMap,
) -> Result<Response, ApiError> {
    let PathQuery { path } = query(query_result)?;
    let target = files.target(&path)?;
    let (file, size) = files
        .with_root(move |root| {
            open_file(root, &target.parts).map_err(|e| fs_error(&target.shown, e))
        })
        .await?;
    let range = warren_http::range::range_header(&request_headers)
        .map_or(RangeAnswer::Whole, |header| parse_range(&header, size));
    let part = match range {
        RangeAnswer::Whole => None,
        RangeAnswer::Part { start, end } => Some((start, end)),
        RangeAnswer::Unsatisfiable => return Err(FilesError::RangeNotSatisfiable(size).into()),
    };
    let (status, mut headers, body) = confined::file_download(file, size, part)
        .await
        .map_err(|e| fs_error(&path, e))?;
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    Ok((status, headers, body).into_response())
}

/// `PUT /v1/files?path=P`: replaces (200) or creates (201) the file with the body, atomically;
/// answers [`FileWritten`].
/// Writes the body to the file atomically, creating missing parent directories.
#[utoipa::path(
    put, path = "/v1/files", tag = "files",
    params(PathQuery),
    request_body(content = [u8], content_type = "application/octet-stream", description = "The file's new bytes"),
    responses(
        (status = 200, description = "Replaced", body = FileWritten),
        (status = 201, description = "Created", body = FileWritten),
        (status = 400, description = "`INVALID_REQUEST_BODY` (a query that does not parse), `INVALID_PATH` or `NAME_TOO_LONG`", body = ErrorBody),
        (status = 403, description = "`PATH_ESCAPE`, `NOT_REGULAR_FILE` or `PERMISSION_DENIED`", body = ErrorBody),
        (status = 409, description = "`NOT_A_DIRECTORY`: a parent in the path is a file", body = ErrorBody),
        (status = 500, description = "`RUNTIME_ERROR`: the file could not be written", body = ErrorBody),
        (status = 507, description = "`STORAGE_FULL`", body = ErrorBody),
    )
)]
async fn write(
    State(files): State<FilesApi>,
    query_result: Result<Query<PathQuery>, QueryRejection>,
    body: Body,
) -> Result<Response, ApiError> {
    let PathQuery { path } = query(query_result)?;
    let target = files.target(&path)?;
    let Some(Part::Name(_)) = target.parts.last() else {
        return Err(FilesError::InvalidPath(format!("{path} names no file")).into());
    };
    let (entry, temp, file, existed) = files
        .with_root(move |root| {
            let shown = &target.shown;
            let parent = &target.parts[..target.parts.len() - 1];
            root.create_dirs(parent).map_err(|e| fs_error(shown, e))?;
            let entry = root.locate(&target.parts).map_err(|e| fs_error(shown, e))?;
            let existed = match entry.lstat() {
                Ok(meta) if !meta.is_file() && !meta.is_symlink() => {
                    return Err(FilesError::NotRegular(shown.clone()));
                }
                Ok(_) => true,
                Err(e) if e.kind() == io::ErrorKind::NotFound => false,
                Err(e) => return Err(fs_error(shown, e)),
            };
            let (temp, file) = TempFile::create_beside(&entry).map_err(|e| fs_error(shown, e))?;
            Ok((entry, temp, file, existed))
        })
        .await?;
    // From here on, any way out (an error, or this future dropped because the client hung up)
    // drops `temp`, which removes the temporary file; only the rename below keeps it.
    let mut writer = tokio::fs::File::from_std(file.into_std());
    let mut stream = body.into_data_stream();
    let mut size = 0u64;
    while let Some(chunk) = stream
        .try_next()
        .await
        .map_err(|e| warren_http::body_read_error(&e))?
    {
        writer
            .write_all(&chunk)
            .await
            .map_err(|e| fs_error(&path, e))?;
        size += chunk.len() as u64;
    }
    writer.flush().await.map_err(|e| fs_error(&path, e))?;
    let file = writer.into_std().await;
    let shown = path.clone();
    blocking(move || {
        file.sync_all().map_err(|e| fs_error(&shown, e))?;
        temp.persist(&entry).map_err(|e| fs_error(&shown, e))
    })
    .await?;
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, axum::Json(FileWritten { path, size })).into_response())
}

/// `GET /v1/files/list?path=P&depth=N`: the entries below a directory, `depth` levels deep
/// (1 to [`MAX_LIST_DEPTH`]), sorted by path, symlinks described and never followed.
/// The entries below a directory, sorted by path.
#[utoipa::path(
    get, path = "/v1/files/list", tag = "files", operation_id = "list_files",
    params(ListQuery),
    responses(
        (status = 200, description = "The listing", body = FileList),
        (status = 400, description = "`INVALID_REQUEST_BODY` (a query that does not parse), `INVALID_PATH` or `NAME_TOO_LONG`", body = ErrorBody),
        (status = 403, description = "`PATH_ESCAPE`, `NOT_REGULAR_FILE` or `PERMISSION_DENIED`", body = ErrorBody),
        (status = 404, description = "`FILE_NOT_FOUND`", body = ErrorBody),
        (status = 409, description = "`NOT_A_DIRECTORY`", body = ErrorBody),
        (status = 500, description = "`RUNTIME_ERROR`: the directory could not be read", body = ErrorBody),
    )
)]
async fn list(
    State(files): State<FilesApi>,
    query_result: Result<Query<ListQuery>, QueryRejection>,
) -> Result<axum::Json<FileList>, ApiError> {
    let ListQuery { path, depth } = query(query_result)?;
    let depth = depth.unwrap_or(1);
    if !(1..=MAX_LIST_DEPTH).contains(&depth) {
        return Err(warren_http::RequestError::InvalidQuery(format!(
            "depth must be 1 to {MAX_LIST_DEPTH}, not {depth}"
        ))
        .into());
    }
    let target = files.dir_target(&path)?;
    let listed = files
        .with_root(move |root| {
            let (fd, _) = root
                .open(&target.parts, Want::Dir)
                .map_err(|e| fs_error(&target.shown, e))?;
            let relative = target.relative();
            let mut entries = Vec::new();
            let gaps = confined::walk(&Dir::from(fd), &relative, depth as usize, &mut |seen| {
                entries.push(file_entry(seen));
                enough_when(entries.len())
            })
            .map_err(|e| fs_error(&target.shown, e))?;
            entries.sort_by(|a: &FileEntry, b| a.path.cmp(&b.path));
            Ok(FileList {
                path: relative,
                entries,
                truncated: gaps.truncated,
            })
        })
        .await?;
    Ok(axum::Json(listed))
}

/// One listed entry (a symlink described, its target read but not followed).
fn file_entry(seen: Seen<'_>) -> FileEntry {
    let meta = seen.meta;
    let kind = confined::file_kind(meta);
    let target = (kind == FileKind::Symlink)
        .then(|| confined::link_target(seen.dir, seen.name).ok())
        .flatten()
        .map(|target| target.to_string_lossy().into_owned());
    let modified_at = chrono::DateTime::from_timestamp(meta.mtime(), meta.mtime_nsec() as u32)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    FileEntry {
        name: seen.name.to_string_lossy().into_owned(),
        path: seen.path,
        kind,
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        modified_at,
        target,
    }
}

/// `POST /v1/files/dir?path=P`: `mkdir -p` (201, also when the directory was there already).
/// `mkdir -p`.
#[utoipa::path(
    post, path = "/v1/files/dir", tag = "files",
    params(PathQuery),
    responses(
        (status = 201, description = "The directory exists"),
        (status = 400, description = "`INVALID_REQUEST_BODY` (a query that does not parse), `INVALID_PATH` or `NAME_TOO_LONG`", body = ErrorBody),
        (status = 403, description = "`PATH_ESCAPE`, `NOT_REGULAR_FILE` or `PERMISSION_DENIED`", body = ErrorBody),
        (status = 409, description = "`FILE_EXISTS` (something else is there) or `NOT_A_DIRECTORY`", body = ErrorBody),
        (status = 500, description = "`RUNTIME_ERROR`", body = ErrorBody),
        (status = 507, description = "`STORAGE_FULL`", body = ErrorBody),
    )
)]
async fn make_dir(
    State(files): State<FilesApi>,
    query_result: Result<Query<PathQuery>, QueryRejection>,
) -> Result<StatusCode, ApiError> {
    let PathQuery { path } = query(query_result)?;
    let target = files.target(&path)?;
    files
        .with_root(move |root| {
            let Err(err) = root.create_dirs(&target.parts) else {
                return Ok(());
            };
            // The last entry exists and is something else than a directory (or a link to one).
            let in_the_way = err.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error())
                && root
                    .locate(&target.parts)
                    .and_then(|entry| entry.lstat())
                    .is_ok_and(|meta| !meta.is_dir());
            if in_the_way {
                return Err(FilesError::Exists(format!(
                    "{} exists and is not a directory",
                    target.shown
                )));
            }
            Err(fs_error(&target.shown, err))
        })
        .await?;
    Ok(StatusCode::CREATED)
}

/// `POST /v1/files/move`: renames `from` to `to` (an empty 200), creating `to`'s parents.
/// Renames `from` to `to`, creating `to`'s parents.
#[utoipa::path(
    post, path = "/v1/files/move", tag = "files",
    request_body = MoveRequest,
    responses(
        (status = 200, description = "Moved"),
        (status = 400, description = "`INVALID_REQUEST_BODY`, `INVALID_PATH`, `NAME_TOO_LONG` or `INVALID_MOVE`", body = ErrorBody),
        (status = 403, description = "`PATH_ESCAPE` or `PERMISSION_DENIED`", body = ErrorBody),
        (status = 404, description = "`FILE_NOT_FOUND`: no `from`", body = ErrorBody),
        (status = 409, description = "`FILE_EXISTS`, `DIR_NOT_EMPTY` or `NOT_A_DIRECTORY`", body = ErrorBody),
        (status = 500, description = "`RUNTIME_ERROR`", body = ErrorBody),
        (status = 507, description = "`STORAGE_FULL`", body = ErrorBody),
    )
)]
async fn rename(
    State(files): State<FilesApi>,
    Json(request): Json<MoveRequest>,
) -> Result<StatusCode, ApiError> {
    let from = files.target(&request.from)?;
    let to = files.target(&request.to)?;
    files
        .with_root(move |root| {
            confined::move_entry(root, &from.parts, &to.parts, request.overwrite).map_err(|error| {
                match error {
                    MoveError::Refused(MoveRefusal::Exists) => {
                        FilesError::Exists(MoveRefusal::Exists.message(&from.shown, &to.shown))
                    }
                    MoveError::Refused(refusal) => {
                        FilesError::InvalidPath(refusal.message(&from.shown, &to.shown))
                    }
                    MoveError::From(e) => fs_error(&from.shown, e),
                    MoveError::To(e) if confined::is_not_empty(&e) => {
                        FilesError::DirNotEmpty(to.shown.clone())
                    }
                    MoveError::To(e)
                        if e.raw_os_error() == Some(rustix::io::Errno::ISDIR.raw_os_error()) =>
                    {
                        FilesError::Exists(format!("{} is a directory", to.shown))
                    }
                    MoveError::To(e) => fs_error(&to.shown, e),
                }
            })
        })
        .await?;
    Ok(StatusCode::OK)
}

/// `DELETE /v1/files?path=P&recursive=B`: removes a file, a symlink (never what it points to)
/// or an empty directory; with `recursive=true` a directory and everything below it, links
/// removed, not followed (204).
/// Removes a file, a symlink or an empty directory; with `recursive=true` a whole tree.
#[utoipa::path(
    delete, path = "/v1/files", tag = "files",
    params(DeleteQuery),
    responses(
        (status = 204, description = "Removed"),
        (status = 400, description = "`INVALID_REQUEST_BODY` (a query that does not parse), `INVALID_PATH` or `NAME_TOO_LONG`", body = ErrorBody),
        (status = 403, description = "`PATH_ESCAPE`, `NOT_REGULAR_FILE` or `PERMISSION_DENIED`", body = ErrorBody),
        (status = 404, description = "`FILE_NOT_FOUND`", body = ErrorBody),
        (status = 409, description = "`DIR_NOT_EMPTY` or `NOT_A_DIRECTORY`", body = ErrorBody),
        (status = 500, description = "`RUNTIME_ERROR`", body = ErrorBody),
    )
)]
async fn remove(
    State(files): State<FilesApi>,
    query_result: Result<Query<DeleteQuery>, QueryRejection>,
) -> Result<StatusCode, ApiError> {
    let DeleteQuery { path, recursive } = query(query_result)?;
    let target = files.target(&path)?;
    files
        .with_root(move |root| {
            let shown = &target.shown;
            let entry = root.locate(&target.parts).map_err(|e| fs_error(shown, e))?;
            if entry.is_root() {
                return Err(FilesError::InvalidPath(format!(
                    "{shown} is the root, which cannot be removed"
                )));
            }
            let meta = entry.lstat().map_err(|e| fs_error(shown, e))?;
            let removed = match (meta.is_dir(), recursive) {
                (true, true) => entry.dir.remove_dir_all(&entry.name),
                (true, false) => entry.dir.remove_dir(&entry.name),
                (false, _) => cap_fs_ext::DirExt::remove_file_or_symlink(&entry.dir, &entry.name),
            };
            removed.map_err(|e| {
                if confined::is_not_empty(&e) {
                    FilesError::DirNotEmpty(shown.clone())
                } else {
                    fs_error(shown, e)
                }
            })
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::{FilesError, fs_error};

    /// A write's rename onto a directory made meanwhile (the bad-input matrix raced one):
    /// EISDIR is the not-a-regular-file refusal, not an internal error.
    #[test]
    fn a_write_whose_target_became_a_directory_is_refused_not_500() {
        let eisdir = std::io::Error::from_raw_os_error(rustix::io::Errno::ISDIR.raw_os_error());
        assert!(matches!(fs_error("x", eisdir), FilesError::NotRegular(_)));
    }
}
