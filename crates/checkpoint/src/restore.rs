//! Restoring a checkpoint into a directory, all or nothing.
//!
//! Into a new or unrelated directory the whole tree is built first in a staging directory
//! beside the target (`<parent>/.<name>.restore-…`, so the target's parent must be on the same
//! file system and not writable by whoever uses the target): directories, symlinks as written
//! (never followed), and files whose every chunk was fetched and matched its hash, with their
//! modes (without setuid, setgid and sticky) and mtimes. Any failure (a broken or missing
//! chunk, a full disk) removes the staging directory and leaves the target as it was. Only then
//! are the target's top-level names swapped with the staging directory's (`renameat2` with
//! `RENAME_EXCHANGE`; names only one side has are moved), so the target directory itself stays
//! the same inode (a sandbox's bind mount of it sees the restored tree), and the old tree, now
//! in the staging directory, is removed. A failed rename undoes the ones before it.
//!
//! [`CheckpointStore::restore_from`] (a fork) builds the staging directory the same way, but
//! copies a file from the tree the checkpoint was taken of when that still holds it
//! (`crate::tree::Source`) rather than writing it from chunks: a fork of a large tree costs
//! the kernel's copy of it, not the chunks' reading, hashing and decompression.
//!
//! Over a directory checkpointed a moment before (`current`, as a rewind does), only what
//! differs is touched (`crate::rewind`), with the same rule: nothing changes until every chunk
//! it needs has been verified. Manifests are checked before anything is written
//! (`Manifest::check`), so no entry can lead outside the target.

use std::collections::BTreeSet;
use std::ffi::{CString, OsStr};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, mpsc};

use rustix::fs::RenameFlags;

use crate::Error;
use crate::chunks::Chunks;
use crate::manifest::{Content, Entry, Manifest};
use crate::rewind;
use crate::store::CheckpointStore;
use crate::take::{names_of, now_ns};
use crate::tree::{Source, Writer, open_dir, remove_tree, set_mtime, write_file};

static N_STAGINGS: AtomicU64 = AtomicU64::new(0);

impl CheckpointStore {
    /// Makes `target` (created when missing) hold exactly `manifest`'s tree, as
    /// [`Self::restore`] does without a `current`, taking the content of files from `source`
    /// where it still holds them: `source` is the directory the checkpoint was taken of (a
    /// fork's source session's workspace), on the same file system as `target` for the copy
    /// to be a reflink or an in-kernel copy. A file of `source` is copied only when its stat
    /// (size, mtime, inode, device) is the one the checkpoint recorded, the checkpoint trusts
    /// that mtime (the quick check a take relies on), its ctime is older than the checkpoint's
    /// walk too (nothing written since, even with the mtime put back), and its stat has not
    /// changed by the end of the copy; every other file (changed since, replaced by a link or
    /// anything else, missing, or reached only through a link) is written from chunks, each
    /// verified, and `None` writes every file from chunks. The rest is the restore's rule: the
    /// tree is built in a staging directory and swapped in, so a broken or missing chunk
    /// leaves `target` as it was, and what is written belongs to the store's owner. Returns
    /// `manifest` with the restored files' inodes: the next take's `previous`.
    pub fn restore_from(
        &self,
        manifest: &Manifest,
        target: &Path,
        source: Option<&Path>,
    ) -> Result<Manifest, Error> {
        let writer = Writer {
            n_threads: self.n_threads,
            owner: self.owner,
        };
        restore_with(&self.chunks, manifest, target, None, source, writer)
    }
}

/// Restores `manifest` into `target` (created when missing); returns the manifest with the
/// restored files' inodes, to be the next take's `previous`.
pub(crate) fn restore(
    chunks: &Chunks,
    manifest: &Manifest,
    target: &Path,
    current: Option<&Manifest>,
    writer: Writer,
) -> Result<Manifest, Error> {
    restore_with(chunks, manifest, target, current, None, writer)
}

/// [`restore`], copying files from `source` where it holds them ([`Source`]) when the whole
/// tree is staged.
fn restore_with(
    chunks: &Chunks,
    manifest: &Manifest,
    target: &Path,
    current: Option<&Manifest>,
    source: Option<&Path>,
    writer: Writer,
) -> Result<Manifest, Error> {
    Manifest::check(&manifest.entries)?;
    let started_ns = now_ns();
    let (Some(parent), Some(name)) = (target.parent(), target.file_name()) else {
        return Err(Error::Invalid(format!(
            "{} has no parent to stage a restore in",
            target.display()
        )));
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let created = match std::fs::create_dir(target) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(Error::io(format!("cannot create {}", target.display()), e)),
    };
    let staging = parent.join(format!(
        ".{}.restore-{}-{}",
        name.to_string_lossy(),
        std::process::id(),
        N_STAGINGS.fetch_add(1, Ordering::Relaxed)
    ));
    let restored = (|| match current {
        Some(current) if !created => {
            match rewind::rewind(chunks, manifest, target, &staging, current, writer)? {
                Some(entries) => Ok(entries),
                None => stage_and_swap(chunks, manifest, target, &staging, source, writer),
            }
        }
        _ => stage_and_swap(chunks, manifest, target, &staging, source, writer),
    })();
    if restored.is_err() && created {
        // A target this restore created goes again: a failed fork leaves nothing behind.
        let _ = std::fs::remove_dir(target);
    }
    Ok(Manifest {
        id: manifest.id.clone(),
        created_at_ms: manifest.created_at_ms,
        entries: restored?,
        skipped: manifest.skipped,
        changed_under: manifest.changed_under.clone(),
        label: manifest.label.clone(),
        summary: manifest.summary,
        started_ns,
        stream: manifest.stream.clone(),
    })
}

/// Builds the tree in `staging` and swaps it into `target`; returns the restored entries.
fn stage_and_swap(
    chunks: &Chunks,
    manifest: &Manifest,
    target: &Path,
    staging: &Path,
    source: Option<&Path>,
    writer: Writer,
) -> Result<Vec<Entry>, Error> {
    let target_fd = open_dir(target)?;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(staging)
        .map_err(|e| Error::io(format!("cannot create {}", staging.display()), e))?;
    let source = source.and_then(|source| Source::open(source, manifest));
    let built = build(chunks, manifest, staging, source.as_ref(), writer).and_then(|entries| {
        let staging_fd = open_dir(staging)?;
        swap_in(&target_fd, &staging_fd, target)?;
        Ok(entries)
    });
    if let Err(error) = remove_tree(staging) {
        tracing::warn!(dir = %staging.display(), %error, "cannot remove a restore's staging directory");
    }
    built
}

/// Builds the tree in `staging`; returns the entries with the written files' inodes.
fn build(
    chunks: &Chunks,
    manifest: &Manifest,
    staging: &Path,
    source: Option<&Source<'_>>,
    writer: Writer,
) -> Result<Vec<Entry>, Error> {
    let mut entries = manifest.entries.clone();
    for entry in &entries {
        let path = staging.join(&entry.path);
        let made = match &entry.content {
            // Writable until the files are in; the modes come last.
            Content::Dir => std::fs::DirBuilder::new().mode(0o700).create(&path),
            Content::Symlink(link_target) => std::os::unix::fs::symlink(link_target, &path),
            Content::File(_) => continue,
        };
        made.and_then(|()| writer.own(&path))
            .map_err(|e| Error::io(format!("cannot create {}", path.display()), e))?;
    }
    let files: Vec<usize> = (0..entries.len())
        .filter(|i| matches!(entries[*i].content, Content::File(_)))
        .collect();
    for (index, ino, dev) in write_files(chunks, &entries, &files, writer, source, |_, entry| {
        staging.join(&entry.path)
    })? {
        entries[index].ino = ino;
        entries[index].dev = dev;
    }
    // Links and directories get their times once nothing more is created in them; directories
    // deepest first, since setting a child's time does not change its directory's.
    for entry in entries.iter_mut().rev() {
        let path = staging.join(&entry.path);
        let set = match &entry.content {
            Content::File(_) => continue,
            Content::Symlink(_) => set_mtime(&path, entry.mtime_ns),
            Content::Dir => {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(entry.mode & 0o777))
                    .and_then(|()| set_mtime(&path, entry.mtime_ns))
            }
        };
        set.map_err(|e| Error::io(format!("cannot set the times of {}", path.display()), e))?;
        if let Ok(metadata) = std::fs::symlink_metadata(&path) {
            entry.ino = metadata.ino();
            entry.dev = metadata.dev();
        }
    }
    Ok(entries)
}

/// Writes the files `entries[i]` for each `i` of `files` at `path_of(i, entry)`, copied from
/// `source` where it holds them and otherwise from verified chunks, on the writer's threads
/// and as its owner; returns each one's index, inode and device. The first failure stops every
/// thread.
pub(crate) fn write_files(
    chunks: &Chunks,
    entries: &[Entry],
    files: &[usize],
    writer: Writer,
    source: Option<&Source<'_>>,
    path_of: impl Fn(usize, &Entry) -> std::path::PathBuf + Sync,
) -> Result<Vec<(usize, u64, u64)>, Error> {
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let first_error = Mutex::new(None);
    let (done_tx, done_rx) = mpsc::channel::<(usize, u64, u64)>();
    std::thread::scope(|scope| {
        for _ in 0..writer.n_threads.max(1) {
            let done_tx = done_tx.clone();
            let (next, failed, first_error, path_of) = (&next, &failed, &first_error, &path_of);
            scope.spawn(move || {
                while !failed.load(Ordering::Relaxed) {
                    let Some(&index) = files.get(next.fetch_add(1, Ordering::Relaxed)) else {
                        return;
                    };
                    let entry = &entries[index];
                    let path = path_of(index, entry);
                    match write_file(chunks, entry, &path, writer.owner, source) {
                        Ok((ino, dev)) => {
                            let _ = done_tx.send((index, ino, dev));
                        }
                        Err(error) => {
                            failed.store(true, Ordering::Relaxed);
                            first_error
                                .lock()
                                .unwrap_or_else(|poisoned| poisoned.into_inner())
                                .get_or_insert(error);
                            return;
                        }
                    }
                }
            });
        }
    });
    drop(done_tx);
    if let Some(error) = first_error
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
    {
        return Err(error);
    }
    Ok(done_rx.iter().collect())
}

/// One top-level rename of the swap, to undo it.
enum Moved {
    /// Both had the name; exchanged.
    Exchanged(CString),
    /// Only the staging directory had it; now in the target.
    In(CString),
    /// Only the target had it; now in the staging directory.
    Out(CString),
}

/// Swaps the target's top-level names with the staging directory's; on failure undoes the
/// renames made so far.
fn swap_in(target_fd: &OwnedFd, staging_fd: &OwnedFd, target: &Path) -> Result<(), Error> {
    let listing = |fd: &OwnedFd| {
        names_of(fd)
            .map(|names| names.into_iter().collect::<BTreeSet<CString>>())
            .map_err(|e| Error::io(format!("cannot list {}", target.display()), e))
    };
    let old = listing(target_fd)?;
    let new = listing(staging_fd)?;
    let mut moved: Vec<Moved> = Vec::new();
    for name in old.union(&new) {
        let result = match (old.contains(name), new.contains(name)) {
            (true, true) => {
                exchange(staging_fd, target_fd, name).map(|()| Moved::Exchanged(name.clone()))
            }
            (false, true) => match rename(staging_fd, target_fd, name) {
                // Created in the target since the listing: exchanged instead.
                Err(rustix::io::Errno::EXIST) => {
                    exchange(staging_fd, target_fd, name).map(|()| Moved::Exchanged(name.clone()))
                }
                other => other.map(|()| Moved::In(name.clone())),
            },
            _ => match rename(target_fd, staging_fd, name) {
                // Gone from the target since the listing: nothing to move.
                Err(rustix::io::Errno::NOENT) => continue,
                other => other.map(|()| Moved::Out(name.clone())),
            },
        };
        match result {
            Ok(step) => moved.push(step),
            Err(errno) => {
                for step in moved.iter().rev() {
                    let undone = match step {
                        Moved::Exchanged(name) => exchange(staging_fd, target_fd, name),
                        Moved::In(name) => rename(target_fd, staging_fd, name),
                        Moved::Out(name) => rename(staging_fd, target_fd, name),
                    };
                    if let Err(undo) = undone {
                        tracing::error!(target = %target.display(), %undo, "cannot undo a restore's rename");
                    }
                }
                let shown = OsStr::from_bytes(name.to_bytes())
                    .to_string_lossy()
                    .into_owned();
                return Err(Error::io(
                    format!("cannot move {shown:?} into {}", target.display()),
                    errno.into(),
                ));
            }
        }
    }
    Ok(())
}

fn exchange(a: &OwnedFd, b: &OwnedFd, name: &CString) -> rustix::io::Result<()> {
    rustix::fs::renameat_with(
        a,
        name.as_c_str(),
        b,
        name.as_c_str(),
        RenameFlags::EXCHANGE,
    )
}

fn rename(from: &OwnedFd, to: &OwnedFd, name: &CString) -> rustix::io::Result<()> {
    rustix::fs::renameat_with(
        from,
        name.as_c_str(),
        to,
        name.as_c_str(),
        RenameFlags::NOREPLACE,
    )
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, RwLock};
    use std::time::Duration;

    use super::*;
    use crate::LocalDisk;

    fn entry(path: &str, content: Content) -> Entry {
        Entry {
            path: path.to_owned(),
            content,
            mode: 0o644,
            size: 0,
            mtime_ns: 0,
            ino: 0,
            dev: 0,
        }
    }

    #[test]
    fn a_manifest_made_in_memory_is_checked_before_anything_is_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let chunks = Chunks {
            backend: Arc::new(LocalDisk::open(&dir.path().join("store")).expect("opens")),
            gate: RwLock::new(()),
            grace: Duration::ZERO,
        };
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).expect("mkdir");
        let target = dir.path().join("target");
        std::fs::create_dir(&target).expect("mkdir");
        std::fs::write(target.join("kept.txt"), b"kept").expect("writes");
        let hostile = [
            vec![entry("../pwned", Content::File(Vec::new()))],
            vec![
                entry(
                    "l",
                    Content::Symlink(outside.to_string_lossy().into_owned()),
                ),
                entry("l/pwned", Content::File(Vec::new())),
            ],
        ];
        for entries in hostile {
            let manifest = Manifest {
                id: "x".to_owned(),
                created_at_ms: 0,
                entries,
                skipped: 0,
                changed_under: Vec::new(),
                label: serde_json::Value::Null,
                summary: Default::default(),
                started_ns: 0,
                stream: Vec::new(),
            };
            let writer = Writer {
                n_threads: 1,
                owner: None,
            };
            let restored = restore(&chunks, &manifest, &target, None, writer);
            assert!(
                matches!(restored, Err(Error::Unsafe { .. })),
                "{restored:?}"
            );
            assert_eq!(names_of_dir(&outside), Vec::<String>::new());
            assert_eq!(names_of_dir(&target), ["kept.txt"]);
            assert_eq!(names_of_dir(dir.path()), ["outside", "store", "target"]);
        }
    }

    fn names_of_dir(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("lists")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}
