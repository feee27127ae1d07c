//! Workspace snapshots: a zstd-compressed tar of a directory tree, made by [`pack`], put back by
//! [`unpack`] into an empty directory, and read without unpacking by [`list`] and [`read_file`]
//! (an archived session's file listing and its downloads, with Range).
//!
//! Packing stores symlinks as symlinks (never followed), hard links within the tree as tar hard
//! links, keeps permission bits and mtimes, and skips FIFOs, sockets, devices and whatever it
//! cannot read. Unpacking reads untrusted bytes: it refuses every entry that could write outside
//! the root or through a link, bounds the total size before writing data, and on any error
//! leaves the root empty again. This crate is sync and knows no HTTP; servers run it on a
//! blocking thread.

mod pack;
pub mod path;
mod read;
mod unpack;

pub use pack::{PackStats, pack};
pub use read::{ArchivedEntry, EntryKind, list, read_file};
pub use unpack::{UnpackLimits, UnpackStats, unpack};

/// The file extension of a stored snapshot (`sessions/<id>/snapshot.tar.zst`).
pub const EXTENSION: &str = "tar.zst";

/// The media type of a snapshot stream.
pub const CONTENT_TYPE: &str = "application/zstd";

/// The zstd level `pack` compresses with: fast enough for 100 MiB/s on one core.
const ZSTD_LEVEL: i32 = 3;

/// Why packing, unpacking or reading a snapshot failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// An entry that could write outside the root, through a link, or create a device.
    #[error("unsafe entry {path:?}: {reason}")]
    Unsafe { path: String, reason: &'static str },
    /// The archive declares more bytes or entries than the limit allows.
    #[error("snapshot exceeds the limit of {limit}")]
    TooLarge { limit: u64 },
    /// Not a snapshot: garbage, a truncated stream, a broken header.
    #[error("corrupt snapshot: {0}")]
    Corrupt(String),
    /// `unpack` only writes into an empty directory.
    #[error("the target directory is not empty")]
    NotEmpty,
    /// No entry has this path.
    #[error("no entry {0:?} in the snapshot")]
    NotFound(String),
    /// The entry is a directory or a symlink, not file content.
    #[error("entry {0:?} is not a regular file")]
    NotAFile(String),
    /// Reading the tree or writing files or the output failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl SnapshotError {
    /// An error reading the archive stream: whatever went wrong, the stream is not a snapshot
    /// this crate can read (a cut connection shows up as a truncated stream).
    fn corrupt(error: std::io::Error) -> Self {
        SnapshotError::Corrupt(error.to_string())
    }
}
