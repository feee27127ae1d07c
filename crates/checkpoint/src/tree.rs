//! What restoring and rewinding do to a directory tree, in one place: reaching a directory of
//! the target without following a link ([`DirCursor`]), writing a file from verified chunks,
//! setting times, and removing a tree this crate staged. Nothing here decides what to write.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rustix::fs::{AtFlags, Mode, OFlags, Timespec, Timestamps};

use crate::Error;
use crate::chunks::Chunks;
use crate::manifest::{Content, Entry};

/// How a restore writes: on how many threads, and as whom.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Writer {
    pub n_threads: usize,
    /// The uid and gid every written entry gets; `None`: the process's own.
    pub owner: Option<(u32, u32)>,
}

impl Writer {
    /// Gives `name` in `dir` (not following a link) to the owner, if there is one.
    pub(crate) fn own_at(&self, dir: BorrowedFd<'_>, name: &str) -> std::io::Result<()> {
        if let Some((uid, gid)) = self.owner {
            rustix::fs::chownat(
                dir,
                name,
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(gid)),
                AtFlags::SYMLINK_NOFOLLOW,
            )?;
        }
        Ok(())
    }

    /// Gives `path` (not following a link; a path in a staging directory only this process
    /// uses) to the owner, if there is one.
    pub(crate) fn own(&self, path: &Path) -> std::io::Result<()> {
        match self.owner {
            Some((uid, gid)) => std::os::unix::fs::lchown(path, Some(uid), Some(gid)),
            None => Ok(()),
        }
    }
}

/// The directory at `path`, open.
pub(crate) fn open_dir(path: &Path) -> Result<OwnedFd, Error> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::io(format!("cannot open {}", path.display()), e.into()))
}

/// Writes the file `entry` at `path` (which must not exist) from its chunks, each verified,
/// with its mode (without setuid, setgid and sticky), owner and mtime; returns its inode and
/// device.
pub(crate) fn write_file(
    chunks: &Chunks,
    entry: &Entry,
    path: &Path,
    owner: Option<(u32, u32)>,
) -> Result<(u64, u64), Error> {
    let Content::File(file_chunks) = &entry.content else {
        return Err(Error::Invalid(format!("{:?} is not a file", entry.path)));
    };
    let io_error = |e| Error::io(format!("cannot write {}", path.display()), e);
    let mut file = File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map_err(io_error)?;
    for chunk in file_chunks {
        let content = chunks.fetch(&chunk.id, &entry.path)?;
        file.write_all(&content).map_err(io_error)?;
    }
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::fchown(&file, Some(uid), Some(gid)).map_err(io_error)?;
    }
    file.set_permissions(std::fs::Permissions::from_mode(entry.mode & 0o777))
        .map_err(io_error)?;
    let when = u64::try_from(entry.mtime_ns)
        .map(|ns| SystemTime::UNIX_EPOCH + Duration::from_nanos(ns))
        .unwrap_or(SystemTime::UNIX_EPOCH);
    file.set_modified(when).map_err(io_error)?;
    let metadata = file.metadata().map_err(io_error)?;
    Ok((metadata.ino(), metadata.dev()))
}

fn timespec(mtime_ns: i64) -> Timespec {
    Timespec {
        tv_sec: mtime_ns.div_euclid(1_000_000_000),
        tv_nsec: mtime_ns.rem_euclid(1_000_000_000) as _,
    }
}

/// Sets the access and modification times of `path` (not following a link).
pub(crate) fn set_mtime(path: &Path, mtime_ns: i64) -> std::io::Result<()> {
    let times = Timestamps {
        last_access: timespec(mtime_ns),
        last_modification: timespec(mtime_ns),
    };
    rustix::fs::utimensat(rustix::fs::CWD, path, &times, AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(())
}

/// Sets the access and modification times of `name` in `dir` (not following a link).
pub(crate) fn set_mtime_at(dir: BorrowedFd<'_>, name: &str, mtime_ns: i64) -> std::io::Result<()> {
    let times = Timestamps {
        last_access: timespec(mtime_ns),
        last_modification: timespec(mtime_ns),
    };
    rustix::fs::utimensat(dir, name, &times, AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(())
}

/// Directory descriptors from a root down to the directory last asked for, each opened
/// `O_NOFOLLOW` beneath the one above; asking in path order reopens little.
pub(crate) struct DirCursor<'a> {
    root: &'a OwnedFd,
    /// `(path, descriptor)` from the root's child down.
    open: Vec<(String, OwnedFd)>,
}

impl<'a> DirCursor<'a> {
    pub(crate) fn new(root: &'a OwnedFd) -> DirCursor<'a> {
        DirCursor {
            root,
            open: Vec::new(),
        }
    }

    /// The directory `dir` (relative, `""` for the root) reached without following a link.
    pub(crate) fn dir(&mut self, dir: &str) -> std::io::Result<BorrowedFd<'_>> {
        while let Some((open, _)) = self.open.last() {
            let below = dir == open
                || dir
                    .strip_prefix(open.as_str())
                    .is_some_and(|rest| rest.starts_with('/'));
            if below {
                break;
            }
            self.open.pop();
        }
        let done = self.open.last().map_or(0, |(open, _)| open.len());
        let rest = dir[done..].trim_start_matches('/');
        if !rest.is_empty() {
            for name in rest.split('/') {
                let parent = self
                    .open
                    .last()
                    .map_or(self.root.as_fd(), |(_, fd)| fd.as_fd());
                let fd = rustix::fs::openat(
                    parent,
                    name,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )?;
                let path = match self.open.last() {
                    Some((open, _)) => format!("{open}/{name}"),
                    None => name.to_owned(),
                };
                self.open.push((path, fd));
            }
        }
        Ok(self
            .open
            .last()
            .map_or(self.root.as_fd(), |(_, fd)| fd.as_fd()))
    }

    /// Forgets every open directory (after the tree changed beneath them).
    pub(crate) fn reset(&mut self) {
        self.open.clear();
    }
}

/// `path`'s directory and name: `("a/b", "c")` for `a/b/c`, `("", "c")` for `c`.
pub(crate) fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

/// Removes `path` and everything beneath it, making directories writable first (a restored
/// one may be read-only). Never follows a symlink.
pub(crate) fn remove_tree(path: &Path) -> std::io::Result<()> {
    let metadata = match std::fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !metadata.is_dir() {
        return std::fs::remove_file(path);
    }
    if metadata.mode() & 0o700 != 0o700 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))?;
    }
    let children: Vec<PathBuf> = std::fs::read_dir(path)?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    for child in children {
        remove_tree(&child)?;
    }
    std::fs::remove_dir(path)
}
