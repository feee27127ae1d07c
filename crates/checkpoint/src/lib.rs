//! Checkpoints: a directory tree (a session's workspace, an agent's home) as of a moment, kept
//! deduplicated. Files are cut into content-defined chunks (FastCDC: 16 KiB minimum, 64 KiB
//! average, 256 KiB maximum), each named by the BLAKE3 hash of its content, zstd-compressed and
//! stored once, on local disk ([`LocalDisk`]) or in an object store ([`Bucket`]). A checkpoint is
//! a [`Manifest`]: every entry's path, type, mode, size, mtime, link target and chunk list.
//!
//! [`CheckpointStore`] has the verbs: `take` (only what changed since the previous checkpoint is
//! read: size, mtime, inode and device are the quick check), `take_streamed` (the same of a tree
//! on another machine, from the stream its execd's [`produce`] wrote given [`Manifest::known`]),
//! `load`, `restore` (every chunk
//! verified before anything in the target changes; a rewind over the tree the checkpoint came
//! from touches only what differs), `restore_from` (a fork's: files of the tree the checkpoint
//! was taken of that the quick check still vouches for are copied in the kernel, the rest built
//! from chunks), `import` (a checkpoint's chunks linked into another store), `patch` (what
//! turns a remote tree into a checkpoint, for [`apply_patch`] there), `read_file`,
//! `list`, `diff`, `page` (the stored checkpoints, newest first), `delete` and `collect` (the
//! chunks no kept checkpoint uses); [`to_drop`] is the retention policy. Manifests read from storage
//! are treated as hostile: no path in one can make a restore write outside its target or
//! through a link.
//!
//! Synchronous, like `warren-snapshot`: servers call it on a blocking thread (the object store
//! backend runs its requests on the Tokio runtime it is given). It knows no session, no HTTP and
//! no event; owners are not kept, and hard links are restored as separate files.

mod backend;
mod bucket;
mod cached;
mod chunk;
mod chunks;
mod export;
mod gc;
mod listing;
mod local;
mod manifest;
mod patch;
mod path;
mod read;
mod restore;
mod rewind;
mod store;
mod stream;
mod take;
mod tree;

pub use backend::{ChunkBatch, ChunkStore};
pub use bucket::Bucket;
pub use cached::Cached;
pub use chunk::{ChunkId, ChunkRef};
pub use gc::{CollectStats, to_drop};
pub use listing::{Listed, Page};
pub use local::LocalDisk;
pub use manifest::{Content, Entry, Manifest, Summary};
pub use patch::{ApplyStats, PatchStats, apply_patch};
pub use read::{Diff, Modified};
pub use store::{CheckpointStore, Config};
pub use stream::{CHANGES_CONTENT_TYPE, Known, KnownFile, ProduceStats, produce};
pub use take::TakeStats;

/// Why a checkpoint could not be taken, read, restored or collected.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No stored checkpoint has this id.
    #[error("no checkpoint {0:?}")]
    NotFound(String),
    /// A chunk whose content does not match its hash: the checkpoint is broken.
    #[error("checkpoint broken: chunk {chunk} of {path:?} does not match its hash")]
    Broken { path: String, chunk: String },
    /// A chunk the checkpoint names is not in the store (collected, or never written).
    #[error("checkpoint broken: chunk {chunk} of {path:?} is missing from the store")]
    Missing { path: String, chunk: String },
    /// A manifest entry that could write outside the target or through a link.
    #[error("unsafe manifest entry {path:?}: {reason}")]
    Unsafe { path: String, reason: &'static str },
    /// A manifest that is not one this crate wrote: garbage, a wrong version, inconsistent
    /// sizes.
    #[error("corrupt manifest: {0}")]
    Corrupt(String),
    /// No entry has this path in the checkpoint.
    #[error("no entry {0:?} in the checkpoint")]
    NoEntry(String),
    /// The entry is a directory or a symlink where file content was asked for, or not a
    /// directory where a listing was.
    #[error("entry {path:?} is not a {expected}")]
    WrongKind {
        path: String,
        expected: &'static str,
    },
    /// A request this crate refuses whatever the store holds: a bad range, id or path.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The store's disk is full; nothing stored before this checkpoint changed.
    #[error("no space left for the checkpoint: {0}")]
    StorageFull(String),
    /// The object store is down, timed out or answered an error.
    #[error("checkpoint storage unavailable: {0}")]
    Unavailable(String),
    /// Reading the tree, or writing the store or a restore, failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// An I/O error with what was being done; a full disk becomes [`Error::StorageFull`].
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        let context = context.into();
        if source.kind() == std::io::ErrorKind::StorageFull
            || source.raw_os_error() == Some(rustix::io::Errno::DQUOT.raw_os_error())
        {
            return Error::StorageFull(format!("{context}: {source}"));
        }
        Error::Io { context, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_or_quota_is_storage_full_and_other_errors_keep_their_context() {
        for errno in [rustix::io::Errno::NOSPC, rustix::io::Errno::DQUOT] {
            let error = Error::io("cannot write x", std::io::Error::from(errno));
            assert!(matches!(error, Error::StorageFull(_)), "{error:?}");
        }
        let error = Error::io(
            "cannot write x",
            std::io::Error::from(rustix::io::Errno::ACCESS),
        );
        assert_eq!(
            error.to_string(),
            "cannot write x: Permission denied (os error 13)"
        );
    }
}
