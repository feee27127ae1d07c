//! What the workspace routes fail with, before any status exists (`crate::error` picks them): a
//! leaf that names nothing else of execd.

use warren_snapshot::SnapshotError;

/// Why a snapshot, restore or changes stream failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// The blocking task ended without an answer (it panicked).
    #[error("snapshot task failed: {0}")]
    Task(String),
    /// The tree cannot be opened or listed (before anything of a stream was sent).
    #[error("cannot read the tree: {0}")]
    Unreadable(std::io::Error),
    /// `?tree=` names no tree this execd has (`workspace`, or `home` with `--home`).
    #[error("no tree {0:?} here: `workspace`, or `home` when execd runs with --home")]
    UnknownTree(String),
}
