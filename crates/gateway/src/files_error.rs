//! What the person's file routes refuse ([`FilesError`]: a kind with its status and code, and
//! what to tell the person), a leaf that names nothing else of the gateway.

use axum::http::StatusCode;

/// What a file request got wrong, or what the workspace refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilesErrorKind {
    /// 400 `INVALID_PATH`: NUL, too long, not UTF-8, the root where a file is needed.
    InvalidPath,
    /// 400 `INVALID_QUERY`: `depth` or `recursive` out of range.
    InvalidQuery,
    /// 400 `NAME_TOO_LONG`: one component longer than the file system takes.
    NameTooLong,
    /// 403 `PATH_ESCAPE`: the path leads out of the workspace.
    Escape,
    /// 403 `NOT_REGULAR_FILE`: a FIFO, socket, device (or a directory, for a download).
    NotRegular,
    /// 403 `PERMISSION_DENIED`.
    PermissionDenied,
    /// 404 `FILE_NOT_FOUND`.
    NotFound,
    /// 409 `NOT_A_DIRECTORY`: a file where a directory is needed.
    NotADirectory,
    /// 409 `FILE_EXISTS`: a move onto an existing file without `overwrite`, a file where mkdir
    /// needs a directory.
    Exists,
    /// 409 `DIR_NOT_EMPTY`: delete of a non-empty directory without `recursive=true`.
    DirNotEmpty,
    /// 413 `FILE_TOO_LARGE`: an upload over `--upload-max`.
    TooLarge,
}

impl FilesErrorKind {
    pub fn status_and_code(self) -> (StatusCode, &'static str) {
        use FilesErrorKind as K;
        match self {
            K::InvalidPath => (StatusCode::BAD_REQUEST, "INVALID_PATH"),
            K::InvalidQuery => (StatusCode::BAD_REQUEST, "INVALID_QUERY"),
            K::NameTooLong => (StatusCode::BAD_REQUEST, "NAME_TOO_LONG"),
            K::Escape => (StatusCode::FORBIDDEN, "PATH_ESCAPE"),
            K::NotRegular => (StatusCode::FORBIDDEN, "NOT_REGULAR_FILE"),
            K::PermissionDenied => (StatusCode::FORBIDDEN, "PERMISSION_DENIED"),
            K::NotFound => (StatusCode::NOT_FOUND, "FILE_NOT_FOUND"),
            K::NotADirectory => (StatusCode::CONFLICT, "NOT_A_DIRECTORY"),
            K::Exists => (StatusCode::CONFLICT, "FILE_EXISTS"),
            K::DirNotEmpty => (StatusCode::CONFLICT, "DIR_NOT_EMPTY"),
            K::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "FILE_TOO_LARGE"),
        }
    }

    /// The kind of one of execd's file codes.
    pub(crate) fn from_execd(code: &str) -> Option<Self> {
        use FilesErrorKind as K;
        Some(match code {
            "INVALID_PATH" | "INVALID_MOVE" => K::InvalidPath,
            "NAME_TOO_LONG" => K::NameTooLong,
            "PATH_ESCAPE" => K::Escape,
            "NOT_REGULAR_FILE" => K::NotRegular,
            "PERMISSION_DENIED" => K::PermissionDenied,
            "FILE_NOT_FOUND" => K::NotFound,
            "NOT_A_DIRECTORY" => K::NotADirectory,
            "FILE_EXISTS" => K::Exists,
            "DIR_NOT_EMPTY" => K::DirNotEmpty,
            "FILE_TOO_LARGE" => K::TooLarge,
            _ => return None,
        })
    }
}

/// A refused file request: its kind (status and code) and what to tell the person.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct FilesError {
    pub kind: FilesErrorKind,
    pub message: String,
}

impl FilesError {
    pub(crate) fn new(kind: FilesErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    pub(crate) fn not_found(path: &str) -> Self {
        Self::new(
            FilesErrorKind::NotFound,
            format!("{} does not exist", shown(path)),
        )
    }

    pub(crate) fn escape(path: &str) -> Self {
        Self::new(
            FilesErrorKind::Escape,
            format!("{} leads outside the workspace", shown(path)),
        )
    }
}

/// A path as messages show it (`/` for the root).
pub(crate) fn shown(path: &str) -> String {
    format!("/{path}")
}
