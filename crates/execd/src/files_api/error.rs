//! What the files_api routes fail with, before any status exists (`crate::error` picks them): a
//! leaf that names nothing else of execd.

use std::io;

use crate::fs::error::PathError;

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
    #[error("{0}")]
    Exists(String),
    #[error("directory {0} is not empty")]
    DirNotEmpty(String),
    #[error("requested range not satisfiable for a file of {0} bytes")]
    RangeNotSatisfiable(u64),
    /// The change feed cannot be set up (the inotify limits, the root `/`).
    #[error("{0}")]
    WatchUnavailable(String),
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
