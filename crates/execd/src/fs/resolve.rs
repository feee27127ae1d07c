//! Path resolution beneath the files root, one directory entry at a time, with symlinks
//! interpreted here rather than by the kernel.
//!
//! `openat2(RESOLVE_BENEATH)` alone refuses every absolute symlink, even with the root `/` and
//! even when the target lies inside the root (`/var/run -> /run`). So a path is walked entry by
//! entry from an open handle of the root: each step opens one name relative to the handle of
//! the directory it is in, with `O_NOFOLLOW` and `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`
//! (plain `openat` where the kernel lacks `openat2`). A single name can neither climb nor jump,
//! so the kernel keeps every step inside; a symlink is opened as itself (`O_PATH`) and read
//! through that handle, so what is followed is what was checked, and a file swapped for a
//! symlink between two steps changes nothing. Symlink targets are then walked the same way:
//! - a relative target continues from the directory holding the link;
//! - an absolute target is allowed only when it lies under the root: it must spell the root's
//!   canonical path, with `.` and `..` applied lexically while still at the root or one of its
//!   ancestors (real directories, since the root is canonical, so lexical `..` is what the
//!   kernel would do there); the rest is walked from the root. Anything else is an escape.
//! - `..` pops the stack of directories actually entered, so it means the real parent; `..` at
//!   the root is an escape, except with the root `/`, where it stays at `/` as in the kernel;
//! - at most [`MAX_LINKS_FOLLOWED`] links per resolution, so a link loop is an error, not a hang.
//!
//! This keeps the refusal of links out of the root instead of chroot-like `RESOLVE_IN_ROOT`
//! semantics, under which `/etc/passwd` inside a link would silently mean `<root>/etc/passwd`
//! and a link spelling a real path under the root (`<root>/a`) would resolve to
//! `<root>/<root>/a`; with the root `/` both behave like the normal filesystem.
//!
//! The final entry is found as an `O_PATH` handle and its type checked before it is opened for
//! reading, so FIFOs and devices are not opened at all (outside a race, where the non-blocking
//! open is discarded because the inode changed). Nothing here knows about HTTP; refusals are
//! [`Refusal`]s inside `io::Error`.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStringExt as _;
use std::path::{Component, Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::Dir;
use rustix::fs::{FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

/// Most symlinks one resolution follows (Linux's own limit).
pub const MAX_LINKS_FOLLOWED: usize = 40;

/// One step of a path below the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Parent,
    Name(OsString),
}

/// Why a path was refused; carried inside `io::Error` so filesystem calls compose.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("path leads outside the root")]
    Escape,
    #[error("not a regular file")]
    NotRegular,
    /// The final entry is not a directory where one was wanted.
    #[error("not a directory")]
    NotDirectory,
    #[error("too many levels of symbolic links")]
    Loop,
}

impl From<Refusal> for io::Error {
    fn from(refusal: Refusal) -> Self {
        let kind = match refusal {
            Refusal::Escape | Refusal::NotRegular => io::ErrorKind::PermissionDenied,
            Refusal::NotDirectory => io::ErrorKind::NotADirectory,
            Refusal::Loop => io::ErrorKind::Other,
        };
        io::Error::new(kind, refusal)
    }
}

/// The refusal inside `err`, if it is one.
pub fn refusal(err: &io::Error) -> Option<&Refusal> {
    err.get_ref()?.downcast_ref()
}

/// What the final entry must be for [`Root::open`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// A regular file, opened for reading.
    File,
    /// A regular file or a directory, opened for reading.
    FileOrDir,
    /// A directory, opened for listing.
    Dir,
}

/// A directory entry below the root: the directory holding it and its name there (`.` for the
/// root itself).
pub struct Entry {
    pub dir: Dir,
    pub name: OsString,
}

impl Entry {
    pub fn is_root(&self) -> bool {
        self.name == "."
    }

    /// The entry's own metadata (a symlink is described, not followed).
    pub fn lstat(&self) -> io::Result<cap_std::fs::Metadata> {
        self.dir.symlink_metadata(&self.name)
    }
}

/// The root: an open handle and its canonical path.
pub struct Root {
    dir: Dir,
    path: PathBuf,
}

impl Root {
    /// Opens `path`, which should be canonical (absolute links are matched against it).
    pub fn new(path: &Path) -> io::Result<Self> {
        Ok(Self {
            dir: Dir::open_ambient_dir(path, ambient_authority())?,
            path: path.to_path_buf(),
        })
    }

    /// Whether the root is `/`, where `..` stays at the root as it does in the kernel.
    fn is_host_root(&self) -> bool {
        self.path.parent().is_none()
    }

    /// The parts of the absolute `path` below the root, `None` when it leads elsewhere.
    pub fn parts_of(&self, path: &Path) -> Option<Vec<Part>> {
        parts_beneath(&self.path, path)
    }

    /// The entry `parts` name, following symlinks on the way but not the last entry itself.
    pub fn locate(&self, parts: &[Part]) -> io::Result<Entry> {
        let mut walk = Walk::new(self, parts);
        let name = walk.walk_to_last(false)?;
        walk.into_entry(name)
    }

    /// Opens what `parts` name, following symlinks including the last entry; also returns where
    /// the opened file really is. An entry that is not what `want` asks for is refused before it
    /// is opened ([`Refusal::NotRegular`], or [`Refusal::NotDirectory`] for [`Want::Dir`]).
    pub fn open(&self, parts: &[Part], want: Want) -> io::Result<(OwnedFd, Entry)> {
        let oflags = match want {
            Want::Dir => OFlags::RDONLY | OFlags::DIRECTORY,
            Want::File | Want::FileOrDir => OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
        };
        let mut walk = Walk::new(self, parts);
        loop {
            let Some(name) = walk.walk_to_last(false)? else {
                if want == Want::File {
                    return Err(Refusal::NotRegular.into());
                }
                let fd = open_entry(self.dir.as_fd(), OsStr::new("."), oflags)?;
                return Ok((fd, walk.into_entry(None)?));
            };
            let handle = open_entry(walk.top(), &name, OFlags::PATH)?;
            let stat = rustix::fs::fstat(&handle)?;
            match (file_type(&stat), want) {
                (FileType::Symlink, _) => {
                    let target = read_link(&handle)?;
                    walk.follow(&target)?;
                    continue;
                }
                (FileType::Directory, Want::Dir | Want::FileOrDir)
                | (FileType::RegularFile, Want::File | Want::FileOrDir) => {}
                (_, Want::Dir) => return Err(Refusal::NotDirectory.into()),
                (_, Want::File | Want::FileOrDir) => return Err(Refusal::NotRegular.into()),
            }
            match open_entry(walk.top(), &name, oflags) {
                Ok(fd) => {
                    let opened = rustix::fs::fstat(&fd)?;
                    if (opened.st_dev, opened.st_ino) == (stat.st_dev, stat.st_ino) {
                        return Ok((fd, walk.into_entry(Some(name))?));
                    }
                }
                Err(err) if !changed_under_us(&err) => return Err(err),
                Err(_) => {}
            }
            // The entry was replaced between the check and the open: look at it again.
            walk.count_link()?;
            walk.pending.push_front(Part::Name(name));
        }
    }

    /// `mkdir -p`: creates every missing directory `parts` name, following symlinks on the way.
    pub fn create_dirs(&self, parts: &[Part]) -> io::Result<()> {
        let mut walk = Walk::new(self, parts);
        if let Some(name) = walk.walk_to_last(true)? {
            walk.pending.push_front(Part::Name(name));
            while let Some(part) = walk.pending.pop_front() {
                match part {
                    Part::Name(name) => walk.enter(name, true)?,
                    Part::Parent => walk.leave()?,
                }
            }
        }
        Ok(())
    }
}

impl Root {
    /// The deepest directory that `parts` reach and that exists (following symlinks on the
    /// way): where [`Root::create_dirs`] of the same parts would start creating.
    pub fn deepest_existing_dir(&self, parts: &[Part]) -> io::Result<OwnedFd> {
        let mut walk = Walk::new(self, parts);
        while let Some(part) = walk.pending.pop_front() {
            let step = match part {
                Part::Name(name) => walk.enter(name, false),
                Part::Parent => walk.leave(),
            };
            match step {
                Err(err) if err.kind() == io::ErrorKind::NotFound => break,
                step => step?,
            }
        }
        match walk.entered.pop() {
            Some((fd, _)) => Ok(fd),
            None => self.dir.as_fd().try_clone_to_owned(),
        }
    }

    /// Whether `dir` is the directory `ancestor` (`(st_dev, st_ino)`) or lies inside it, found
    /// by climbing `..` from `dir` until the root. A move of `ancestor` must not go there.
    pub fn is_inside(&self, dir: OwnedFd, ancestor: (u64, u64)) -> io::Result<bool> {
        let root = inode(&rustix::fs::fstat(&self.dir)?);
        let mut current = dir;
        // Each step goes one directory up, so this ends at the root or at the filesystem's
        // top; the bound only guards against a tree being reshaped under the climb forever.
        for _ in 0..MAX_CLIMB {
            let here = inode(&rustix::fs::fstat(&current)?);
            if here == ancestor {
                return Ok(true);
            }
            if here == root {
                return Ok(false);
            }
            let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
            let parent = rustix::fs::openat(&current, "..", flags, Mode::empty())?;
            if inode(&rustix::fs::fstat(&parent)?) == here {
                return Ok(false);
            }
            current = parent;
        }
        Ok(false)
    }
}

/// Most `..` steps [`Root::is_inside`] climbs.
const MAX_CLIMB: usize = 4096;

/// A file's identity: `(st_dev, st_ino)`.
fn inode(stat: &Stat) -> (u64, u64) {
    (stat.st_dev, stat.st_ino)
}

/// An error from opening an entry that was just checked means it changed in between.
fn changed_under_us(err: &io::Error) -> bool {
    [Errno::LOOP, Errno::NOTDIR, Errno::NOENT, Errno::NXIO]
        .iter()
        .any(|errno| err.raw_os_error() == Some(errno.raw_os_error()))
}

fn file_type(stat: &Stat) -> FileType {
    FileType::from_raw_mode(stat.st_mode)
}

/// Opens one entry of `dir` by name without following it, kernel-confined where possible.
fn open_entry(dir: BorrowedFd<'_>, name: &OsStr, oflags: OFlags) -> io::Result<OwnedFd> {
    let oflags = oflags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    match rustix::fs::openat2(dir, name, oflags, Mode::empty(), resolve) {
        // No `openat2` (old kernel, or filtered): one name with `O_NOFOLLOW` is confined anyway.
        Err(Errno::NOSYS | Errno::PERM) => {
            Ok(rustix::fs::openat(dir, name, oflags, Mode::empty())?)
        }
        result => Ok(result?),
    }
}

/// The target of the symlink `handle` (an `O_PATH` handle of the link itself).
fn read_link(handle: &OwnedFd) -> io::Result<PathBuf> {
    let target = rustix::fs::readlinkat(handle, "", Vec::new())?;
    Ok(PathBuf::from(OsString::from_vec(target.into_bytes())))
}

/// One resolution in progress: the directories entered below the root and what is left.
struct Walk<'r> {
    root: &'r Root,
    /// Directories entered below the root, innermost last, each with its name in its parent.
    entered: Vec<(OwnedFd, OsString)>,
    pending: VecDeque<Part>,
    n_links: usize,
}

impl<'r> Walk<'r> {
    fn new(root: &'r Root, parts: &[Part]) -> Self {
        Self {
            root,
            entered: Vec::new(),
            pending: parts.iter().cloned().collect(),
            n_links: 0,
        }
    }

    /// The directory the walk is in.
    fn top(&self) -> BorrowedFd<'_> {
        match self.entered.last() {
            Some((fd, _)) => fd.as_fd(),
            None => self.root.dir.as_fd(),
        }
    }

    /// Enters directories until one entry is left and returns its name; `None` when the path
    /// names the root itself.
    fn walk_to_last(&mut self, create: bool) -> io::Result<Option<OsString>> {
        loop {
            match self.pending.pop_front() {
                // The path ends in `..`: the answer is the directory entered last.
                None => return Ok(self.entered.pop().map(|(_, name)| name)),
                Some(Part::Parent) => self.leave()?,
                Some(Part::Name(name)) if self.pending.is_empty() => return Ok(Some(name)),
                Some(Part::Name(name)) => self.enter(name, create)?,
            }
        }
    }

    fn leave(&mut self) -> io::Result<()> {
        if self.entered.pop().is_none() && !self.root.is_host_root() {
            return Err(Refusal::Escape.into());
        }
        Ok(())
    }

    /// Enters the directory `name` (creating it if asked), or queues the target of the symlink
    /// `name`.
    fn enter(&mut self, name: OsString, create: bool) -> io::Result<()> {
        let handle = match open_entry(self.top(), &name, OFlags::PATH) {
            Err(err) if create && err.kind() == io::ErrorKind::NotFound => {
                match rustix::fs::mkdirat(self.top(), &name, Mode::RWXU | Mode::RWXG | Mode::RWXO) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(errno) => return Err(errno.into()),
                }
                open_entry(self.top(), &name, OFlags::PATH)?
            }
            result => result?,
        };
        match file_type(&rustix::fs::fstat(&handle)?) {
            FileType::Directory => {
                self.entered.push((handle, name));
                Ok(())
            }
            FileType::Symlink => {
                let target = read_link(&handle)?;
                self.follow(&target)
            }
            _ => Err(Errno::NOTDIR.into()),
        }
    }

    fn count_link(&mut self) -> io::Result<()> {
        self.n_links += 1;
        if self.n_links > MAX_LINKS_FOLLOWED {
            return Err(Refusal::Loop.into());
        }
        Ok(())
    }

    /// Continues with a symlink's target in place of the link.
    fn follow(&mut self, target: &Path) -> io::Result<()> {
        self.count_link()?;
        let parts = if target.is_absolute() {
            let parts = self.root.parts_of(target).ok_or(Refusal::Escape)?;
            self.entered.clear();
            parts
        } else {
            relative_parts(target)
        };
        for part in parts.into_iter().rev() {
            self.pending.push_front(part);
        }
        Ok(())
    }

    /// The entry `name` in the directory the walk is in (the root itself for `None`).
    fn into_entry(mut self, name: Option<OsString>) -> io::Result<Entry> {
        let Some(name) = name else {
            return Ok(Entry {
                dir: self.root.dir.try_clone()?,
                name: OsString::from("."),
            });
        };
        let dir = match self.entered.pop() {
            Some((fd, _)) => Dir::from(fd),
            None => self.root.dir.try_clone()?,
        };
        Ok(Entry { dir, name })
    }
}

/// A relative path as parts (`.` dropped).
fn relative_parts(path: &Path) -> Vec<Part> {
    path.components()
        .filter_map(|c| match c {
            Component::ParentDir => Some(Part::Parent),
            Component::Normal(name) => Some(Part::Name(name.to_owned())),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// The parts of the absolute `path` below `root` (canonical), `None` when it leads elsewhere:
/// the workspace's one rule for absolute paths and link targets
/// ([`warren_snapshot::path::beneath_root`], which a stored snapshot's walk follows too).
pub fn parts_beneath(root: &Path, path: &Path) -> Option<Vec<Part>> {
    let steps = warren_snapshot::path::beneath_root(root, path)?;
    Some(
        steps
            .into_iter()
            .map(|step| match step {
                warren_snapshot::path::Step::Parent => Part::Parent,
                warren_snapshot::path::Step::Name(name) => Part::Name(name.to_owned()),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_survive_the_trip_through_io_error() {
        let err = io::Error::from(Refusal::Escape);
        assert!(matches!(refusal(&err), Some(Refusal::Escape)));
        assert!(refusal(&io::Error::from(Errno::LOOP)).is_none());
    }
}
