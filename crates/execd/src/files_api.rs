//! Warren's own file routes, which the gateway uses for the agent's `fs/read_text_file` and
//! `fs/write_text_file`: `GET /v1/files?path=P` answers the file's bytes, `PUT /v1/files?path=P`
//! streams the body into a temporary file beside the target, fsyncs it and renames it into
//! place (creating missing parent directories), so a reader never sees half a file.
//!
//! Paths are absolute or relative to `--root`, and confined beneath it by the same walk as the
//! OpenSandbox file routes (`opensandbox::resolve`: no `..`, symlink or swap leads out, FIFOs
//! and devices are never opened). Errors are [`FilesError`], mapped to statuses in one place.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::TryStreamExt;
use serde::Deserialize;
use tokio::io::AsyncWriteExt;

use crate::error::ApiError;
use crate::opensandbox::resolve::{self, Part, Refusal, Root, Want};
use crate::opensandbox::{PathError, path_error};

/// The file routes' state: the canonical root.
#[derive(Clone)]
pub struct FilesApi {
    root: Arc<PathBuf>,
}

/// Why a file request failed.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    #[error("{0}")]
    InvalidPath(String),
    #[error("{0} does not exist")]
    NotFound(String),
    #[error("{0} leads outside the root")]
    Escape(String),
    #[error("{0} is not a regular file")]
    NotRegular(String),
    /// A path the OS refuses for a reason the client can fix (a name too long, a file where a
    /// directory should be, no permission): the same codes as the OpenSandbox file routes.
    #[error(transparent)]
    Path(#[from] PathError),
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
}

impl From<FilesError> for ApiError {
    fn from(error: FilesError) -> Self {
        let error = match error {
            FilesError::Path(path_error) => return path_error.into(),
            other => other,
        };
        let (status, code) = match &error {
            FilesError::InvalidPath(_) => (StatusCode::BAD_REQUEST, "INVALID_PATH"),
            FilesError::NotFound(_) => (StatusCode::NOT_FOUND, "FILE_NOT_FOUND"),
            FilesError::Escape(_) => (StatusCode::FORBIDDEN, "PATH_ESCAPE"),
            FilesError::NotRegular(_) => (StatusCode::BAD_REQUEST, "NOT_REGULAR_FILE"),
            FilesError::Path(_) => unreachable!("returned above"),
            FilesError::Io { source, .. } if source.kind() == io::ErrorKind::StorageFull => {
                (StatusCode::INSUFFICIENT_STORAGE, "STORAGE_FULL")
            }
            FilesError::Io { .. } => return ApiError::internal(error),
        };
        ApiError::new(status, code, error.to_string())
    }
}

impl FilesApi {
    pub fn new(root: &Path) -> Self {
        let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
        Self {
            root: Arc::new(root),
        }
    }

    /// The parts of `raw` below the root: absolute paths must lie under it, relative ones are
    /// taken from it.
    fn parts(&self, raw: &str) -> Result<Vec<Part>, FilesError> {
        if raw.is_empty() || raw.contains('\0') {
            return Err(FilesError::InvalidPath(
                "path must be non-empty and free of NUL bytes".into(),
            ));
        }
        let path = Path::new(raw);
        let absolute = if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.root.join(path)
        };
        resolve::parts_beneath(&self.root, &absolute).ok_or_else(|| FilesError::Escape(raw.into()))
    }

    fn open_root(&self) -> Result<Root, FilesError> {
        Root::new(&self.root).map_err(|source| FilesError::Io {
            path: self.root.display().to_string(),
            source,
        })
    }
}

pub fn routes(state: FilesApi) -> Router {
    Router::new()
        .route("/v1/files", get(read).put(write))
        .with_state(state)
}

#[derive(Debug, Deserialize)]
struct PathQuery {
    path: String,
}

fn path_query(
    query: Result<Query<PathQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<String, ApiError> {
    query
        .map(|Query(q)| q.path)
        .map_err(|e| ApiError::bad_request(e.body_text()))
}

fn fs_error(shown: &str, err: io::Error) -> FilesError {
    match resolve::refusal(&err) {
        Some(Refusal::Escape) => return FilesError::Escape(shown.into()),
        Some(Refusal::NotRegular) => return FilesError::NotRegular(shown.into()),
        Some(Refusal::NotDirectory) => {
            return PathError::NotADirectory(format!(
                "{shown}: a component of it is not a directory"
            ))
            .into();
        }
        Some(Refusal::Loop) | None => {}
    }
    if let Some(path_error) = path_error(shown, &err) {
        return path_error.into();
    }
    match err.raw_os_error() {
        Some(code) if code == rustix::io::Errno::LOOP.raw_os_error() => {
            FilesError::InvalidPath(format!("{shown}: too many levels of symbolic links"))
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

/// `GET /v1/files?path=P`: the file's bytes.
async fn read(
    State(files): State<FilesApi>,
    query: Result<Query<PathQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let raw = path_query(query)?;
    let parts = files.parts(&raw)?;
    let shown = raw.clone();
    let (fd, len) = blocking(move || {
        let root = files.open_root()?;
        let (fd, _) = root
            .open(&parts, Want::File)
            .map_err(|e| fs_error(&shown, e))?;
        let file = std::fs::File::from(fd);
        let len = file.metadata().map_err(|e| fs_error(&shown, e))?.len();
        Ok((file, len))
    })
    .await?;
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(fd));
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (header::CONTENT_LENGTH, len.to_string()),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_owned()),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// `PUT /v1/files?path=P`: replaces (or creates) the file with the body, atomically.
async fn write(
    State(files): State<FilesApi>,
    query: Result<Query<PathQuery>, axum::extract::rejection::QueryRejection>,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let raw = path_query(query)?;
    let parts = files.parts(&raw)?;
    let Some((Part::Name(name), parent)) = parts.split_last().map(|(l, p)| (l.clone(), p.to_vec()))
    else {
        return Err(FilesError::InvalidPath(format!("{raw} names no file")).into());
    };
    let shown = raw.clone();
    let (dir, temp, file) = blocking(move || {
        let root = files.open_root()?;
        root.create_dirs(&parent).map_err(|e| fs_error(&shown, e))?;
        let mut all = parent;
        all.push(Part::Name(name));
        let entry = root.locate(&all).map_err(|e| fs_error(&shown, e))?;
        match entry.lstat() {
            Ok(meta) if !meta.is_file() && !meta.is_symlink() => {
                return Err(FilesError::NotRegular(shown));
            }
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(fs_error(&shown, e)),
            _ => {}
        }
        let temp = OsString::from(format!(
            ".{}.warren-{}",
            entry.name.to_string_lossy(),
            uuid::Uuid::new_v4().simple()
        ));
        let mut options = cap_std::fs::OpenOptions::new();
        cap_fs_ext::OpenOptionsExt::mode(&mut options, 0o644);
        options.write(true).create_new(true);
        let file = entry
            .dir
            .open_with(&temp, &options)
            .map_err(|e| fs_error(&shown, e))?;
        Ok(((entry.dir, entry.name), temp, file))
    })
    .await?;
    let mut writer = tokio::fs::File::from_std(file.into_std());
    let copied = async {
        let mut stream = body.into_data_stream();
        while let Some(chunk) = stream.try_next().await.map_err(io::Error::other)? {
            writer.write_all(&chunk).await?;
        }
        writer.flush().await
    }
    .await;
    let file = writer.into_std().await;
    let shown = raw.clone();
    blocking(move || {
        let (dir, name) = dir;
        let finish = || -> io::Result<()> {
            copied?;
            file.sync_all()?;
            dir.rename(&temp, &dir, &name)
        };
        let result = finish();
        if result.is_err() {
            let _ = dir.remove_file(&temp);
        }
        result.map_err(|e| fs_error(&shown, e))
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}
