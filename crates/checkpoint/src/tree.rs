//! What restoring and rewinding do to a directory tree, in one place: reaching a directory of
//! the target without following a link ([`DirCursor`]), writing a file from verified chunks or
//! copying it from a tree that still holds it ([`Source`]), setting times, and removing a tree
//! this crate staged. Nothing here decides what to write.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Timespec, Timestamps};
use rustix::io::Errno;

use crate::Error;
use crate::chunks::Chunks;
use crate::manifest::{Content, Entry, Manifest};
use crate::take::Stamp;

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

/// Writes the file `entry` at `path` (which must not exist) with its mode (without setuid,
/// setgid and sticky), owner and mtime; returns its inode and device. Its content is copied
/// from `source` when the file there is the one the checkpoint recorded ([`Source`]), else
/// written from its chunks, each verified.
pub(crate) fn write_file(
    chunks: &Chunks,
    entry: &Entry,
    path: &Path,
    owner: Option<(u32, u32)>,
    source: Option<&Source<'_>>,
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
    let copied = match source {
        Some(source) => source.copy_into(entry, &file).map_err(io_error)?,
        None => false,
    };
    if !copied {
        for chunk in file_chunks {
            let content = chunks.fetch(&chunk.id, &entry.path)?;
            file.write_all(&content).map_err(io_error)?;
        }
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

/// A tree that may still hold a checkpoint's files: the directory it was taken of (a fork's
/// source session's workspace). A file there whose stat (size, mtime, inode and device) is the
/// one the checkpoint recorded, with an mtime the checkpoint trusts ([`Manifest::trusts`]),
/// holds the content the checkpoint has for it: the quick check a take relies on to not read
/// a file again, made stricter by the file's ctime, which must be older than the checkpoint's
/// walk too (a file written since with its mtime put back is not taken). Such a file is copied in the kernel (a reflink where the file system
/// shares blocks, else `copy_file_range`) instead of being written from chunks, and its stat
/// is checked again after the copy, so a file written to meanwhile is not kept. It is reached
/// beneath the source's root without following any link (`openat2` with `RESOLVE_BENEATH`
/// and `RESOLVE_NO_SYMLINKS`); anything else (a link, a missing or changed file, a kernel
/// without `openat2`) is written from chunks instead.
pub(crate) struct Source<'a> {
    root: OwnedFd,
    manifest: &'a Manifest,
    /// Cleared once the file system refuses a reflink: the copies that follow skip trying.
    reflink: AtomicBool,
    /// Cleared once the kernel cannot copy from the source at all (another file system).
    copies: AtomicBool,
}

impl<'a> Source<'a> {
    /// The tree at `root` as a source of `manifest`'s files; `None` when it cannot be opened
    /// (every file is then written from chunks).
    pub(crate) fn open(root: &Path, manifest: &'a Manifest) -> Option<Source<'a>> {
        let root = rustix::fs::open(
            root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .inspect_err(|error| {
            tracing::debug!(source = %root.display(), %error, "a restore's source cannot be opened; every file comes from chunks");
        })
        .ok()?;
        Some(Source {
            root,
            manifest,
            reflink: AtomicBool::new(true),
            copies: AtomicBool::new(true),
        })
    }

    /// Copies `entry`'s content from the source into `file` (new and empty); false when the
    /// source's file is not the one the checkpoint recorded or could not be copied, and
    /// `file` is then empty again. An error is the target's (a full disk).
    pub(crate) fn copy_into(&self, entry: &Entry, file: &File) -> std::io::Result<bool> {
        if !self.manifest.trusts(entry) {
            return Ok(false);
        }
        let Some((from, before)) = self.open_recorded(entry) else {
            return Ok(false);
        };
        let copied = self.copy(&from, file, entry.size);
        // A write during the copy changes the file's mtime or ctime.
        let unchanged = Stamp::of_file(&from).is_ok_and(|after| after == before);
        match copied {
            Ok(true) if unchanged => return Ok(true),
            Err(errno) if target_error(errno) => return Err(errno.into()),
            _ => {}
        }
        file.set_len(0)?;
        Ok(false)
    }

    /// The source's file at `entry`'s path, open, and its stat, when that is the stat the
    /// checkpoint recorded for it.
    fn open_recorded(&self, entry: &Entry) -> Option<(File, Stamp)> {
        // Non-blocking: a FIFO put in the file's place must not hang the open.
        let from = rustix::fs::openat2(
            &self.root,
            entry.path.as_str(),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
        .ok()?;
        let stat = rustix::fs::fstat(&from).ok()?;
        let stamp = Stamp::of(&stat);
        let recorded = FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile
            && stamp.size == entry.size
            && stamp.mtime_ns == entry.mtime_ns
            && stamp.ino == entry.ino
            && stamp.dev == entry.dev
            && self.unchanged_since_walk(&stat);
        recorded.then(|| (File::from(from), stamp))
    }

    /// True when the inode last changed (its ctime, which no caller can set) before the
    /// checkpoint's walk, by the margin [`Manifest::trusts`] gives an mtime: content written
    /// since, even with the mtime put back, is never taken for the checkpoint's.
    // The field types of `struct stat` differ between architectures.
    #[allow(clippy::unnecessary_cast)]
    fn unchanged_since_walk(&self, stat: &rustix::fs::Stat) -> bool {
        let ctime_ns = (stat.st_ctime as i64)
            .saturating_mul(1_000_000_000)
            .saturating_add(stat.st_ctime_nsec as i64);
        self.manifest.trusts(&Entry {
            path: String::new(),
            content: Content::Dir,
            mode: 0,
            size: 0,
            mtime_ns: ctime_ns,
            ino: 0,
            dev: 0,
        })
    }

    /// Copies `size` bytes of `from` into `to` in the kernel; false when `from` ended early.
    fn copy(&self, from: &File, to: &File, size: u64) -> Result<bool, Errno> {
        if size == 0 {
            return Ok(true);
        }
        if self.reflink.load(Ordering::Relaxed) {
            match rustix::fs::ioctl_ficlone(to, from) {
                Ok(()) => return Ok(true),
                // Another file system, or one that shares no blocks: copy instead, and do not
                // ask again for the files that follow.
                Err(
                    Errno::OPNOTSUPP | Errno::XDEV | Errno::INVAL | Errno::NOTTY | Errno::NOSYS,
                ) => {
                    self.reflink.store(false, Ordering::Relaxed);
                }
                Err(errno) => return Err(errno),
            }
        }
        if !self.copies.load(Ordering::Relaxed) {
            return Ok(false);
        }
        // Explicit offsets leave both files' positions at 0, for a write from chunks after a
        // copy that stopped part way.
        let (mut offset_in, mut offset_out) = (0u64, 0u64);
        while offset_in < size {
            let left = usize::try_from(size - offset_in)
                .unwrap_or(usize::MAX)
                .min(1 << 30);
            match rustix::fs::copy_file_range(
                from,
                Some(&mut offset_in),
                to,
                Some(&mut offset_out),
                left,
            ) {
                Ok(0) => return Ok(false),
                Ok(_) => {}
                Err(Errno::INTR) => {}
                // Across file systems, or not supported at all: every file comes from chunks.
                Err(Errno::XDEV | Errno::OPNOTSUPP | Errno::NOSYS) => {
                    self.copies.store(false, Ordering::Relaxed);
                    return Ok(false);
                }
                Err(errno) => return Err(errno),
            }
        }
        Ok(true)
    }
}

/// True for a copy's errors that are the target's, which writing from chunks would meet too.
fn target_error(errno: Errno) -> bool {
    matches!(errno, Errno::NOSPC | Errno::DQUOT | Errno::FBIG)
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

/// The last step of changing a tree in place (a rewind, a patch), once every name is where it
/// belongs: the modes and times of the files kept (`kept`, each with its stat as looked at),
/// then links' times and directories' modes and times, deepest first (making or renaming
/// something in a directory changes its time). Every step is beneath a directory reached
/// without following a link; a mode is changed through a descriptor opened `O_NOFOLLOW`, so a
/// file swapped for a link since it was looked at fails here rather than changing what the
/// link points at.
pub(crate) fn settle_modes_and_times<'a>(
    cursor: &mut DirCursor<'_>,
    entries: &[Entry],
    kept: impl Iterator<Item = (&'a Entry, &'a Stamp)>,
) -> Result<(), (String, std::io::Error)> {
    let fail = |what: &str, path: &str| {
        let what = format!("{what} {path:?}");
        move |e: std::io::Error| (what, e)
    };
    for (entry, stamp) in kept {
        let (dir, name) = split(&entry.path);
        let dir_fd = cursor.dir(dir).map_err(fail("reaching", dir))?;
        if stamp.mode != entry.mode & 0o777 {
            let file = rustix::fs::openat(
                dir_fd,
                name,
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| fail("opening", &entry.path)(e.into()))?;
            rustix::fs::fchmod(&file, Mode::from_raw_mode(entry.mode & 0o777))
                .map_err(|e| fail("changing the mode of", &entry.path)(e.into()))?;
        }
        if stamp.mtime_ns != entry.mtime_ns {
            set_mtime_at(dir_fd, name, entry.mtime_ns)
                .map_err(fail("setting the time of", &entry.path))?;
        }
    }
    for entry in entries.iter().rev() {
        let (dir, name) = split(&entry.path);
        match entry.content {
            Content::Symlink(_) => {
                let dir_fd = cursor.dir(dir).map_err(fail("reaching", dir))?;
                set_mtime_at(dir_fd, name, entry.mtime_ns)
                    .map_err(fail("setting the time of", &entry.path))?;
            }
            Content::Dir => {
                let own = cursor
                    .dir(&entry.path)
                    .map_err(fail("reaching", &entry.path))?;
                rustix::fs::fchmod(own, Mode::from_raw_mode(entry.mode & 0o777))
                    .map_err(|e| fail("changing the mode of", &entry.path)(e.into()))?;
                let dir_fd = cursor.dir(dir).map_err(fail("reaching", dir))?;
                set_mtime_at(dir_fd, name, entry.mtime_ns)
                    .map_err(fail("setting the time of", &entry.path))?;
            }
            Content::File(_) => {}
        }
    }
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
