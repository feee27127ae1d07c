//! What the fs routes fail with, before any status exists (`crate::error` picks them): a
//! leaf that names nothing else of execd.

/// A path the client named that cannot be used, for reasons OpenSandbox's codes have no name
/// for. Also used for a bash session's working directory. No HTTP in here; the `From` impl
/// below is the only place these statuses are picked: 400 when the request could never
/// succeed as written, 409 when the filesystem holds something else than the request needs.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// Empty, containing NUL, or naming an undefined variable.
    #[error("{0}")]
    InvalidPath(String),
    /// A name longer than the filesystem allows (`ENAMETOOLONG`).
    #[error("{0}")]
    NameTooLong(String),
    /// The path, or a directory on its way, is something other than a directory.
    #[error("{0}")]
    NotADirectory(String),
    /// The OS refused the daemon access (`EACCES`, `EPERM`).
    #[error("{0}")]
    PermissionDenied(String),
    /// A move that cannot be done: a directory into itself, the root, across filesystems.
    #[error("{0}")]
    InvalidMove(String),
}
