//! [`unpack`]: a snapshot into an existing empty directory, treating the archive as hostile.
//!
//! Refused (as [`SnapshotError::Unsafe`]): `..` and absolute paths; a path beneath an entry
//! that is a symlink (so nothing is ever written through a link the archive made); symlinks
//! whose target climbs out of the root, resolved lexically from the link's directory, or is
//! absolute and does not spell the root's own path (`crate::path::beneath_root`: a link made in
//! a sandbox as `/workspace/a.txt` restores into a root at `/workspace`); hard links to anything but an earlier regular file of this archive; devices,
//! FIFOs, GNU sparse files and every other entry type except file, directory, symlink and hard
//! link (pax and GNU long-name headers are read by `tar`). A second entry for a path that
//! exists is refused too, except a directory over a directory. Files are created with
//! `create_new` and `O_NOFOLLOW`.
//!
//! The declared sizes are summed before any data is written, so a header that claims 10 GB is
//! refused at once. On any error everything unpacked so far is removed: the root is empty again.
//! Permission bits are kept without setuid, setgid and sticky; owners are never changed.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tar::EntryType;

use crate::SnapshotError;
use crate::path::{escaping_link, from_link_dir, link_stays_inside, normalize, parents};

/// The most an archive may hold before [`unpack`] refuses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnpackLimits {
    /// Sum of the declared sizes of all regular files.
    pub max_bytes: u64,
    /// Number of entries (directories and links included).
    pub max_entries: u64,
}

impl Default for UnpackLimits {
    fn default() -> Self {
        Self {
            max_bytes: 8 << 30,
            max_entries: 1_000_000,
        }
    }
}

/// What [`unpack`] wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnpackStats {
    /// Regular files and hard links created.
    pub n_files: u64,
    /// File content bytes written.
    pub bytes: u64,
}

/// Unpacks the zstd-compressed tar on `input` into `root`, an existing empty directory. On
/// error `root` is left empty.
pub fn unpack(
    input: impl Read,
    root: &Path,
    limits: &UnpackLimits,
) -> Result<UnpackStats, SnapshotError> {
    if std::fs::read_dir(root)?.next().is_some() {
        return Err(SnapshotError::NotEmpty);
    }
    let mut unpacker = Unpacker {
        root: root.to_owned(),
        real_root: std::fs::canonicalize(root)?,
        limits: *limits,
        kinds: HashMap::new(),
        directories: Vec::new(),
        symlinks: Vec::new(),
        declared_bytes: 0,
        n_entries: 0,
        stats: UnpackStats::default(),
    };
    match unpacker.run(input) {
        Ok(()) => Ok(unpacker.stats),
        Err(error) => {
            if let Err(cleanup) = empty_directory(root) {
                tracing::error!(root = %root.display(), %cleanup, "cannot empty the directory after a failed unpack");
            }
            Err(error)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    Symlink,
}

struct Unpacker {
    root: PathBuf,
    limits: UnpackLimits,
    /// Every path created so far (parents made implicitly included).
    kinds: HashMap<String, Kind>,
    /// Directories with their mode and mtime, applied at the end (a read-only directory would
    /// refuse its children, and every child changes its directory's mtime).
    directories: Vec<(String, u32, u64)>,
    /// The root's canonical path, which an absolute link inside the tree spells.
    real_root: PathBuf,
    /// Every symlink with its target (spelled from its directory), checked together at the end
    /// (a later link can make an earlier one lead out).
    symlinks: Vec<(String, PathBuf)>,
    declared_bytes: u64,
    n_entries: u64,
    stats: UnpackStats,
}

impl Unpacker {
    fn run(&mut self, input: impl Read) -> Result<(), SnapshotError> {
        let decoder = zstd::stream::Decoder::new(input).map_err(SnapshotError::corrupt)?;
        let mut archive = tar::Archive::new(decoder);
        for entry in archive.entries().map_err(SnapshotError::corrupt)? {
            let mut entry = entry.map_err(SnapshotError::corrupt)?;
            self.entry(&mut entry)?;
        }
        // The rest of the stream must decode too: a cut stream is corrupt even if the cut falls
        // after the last entry.
        let mut rest = archive.into_inner();
        io::copy(&mut rest, &mut io::sink()).map_err(SnapshotError::corrupt)?;
        if let Some(path) = escaping_link(&self.symlinks) {
            return Err(SnapshotError::Unsafe {
                path: path.to_owned(),
                reason: "symlink points outside the root through another symlink",
            });
        }
        self.finish_directories()
    }

    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<(), SnapshotError> {
        let entry_type = entry.header().entry_type();
        if entry_type == EntryType::XGlobalHeader {
            return Ok(());
        }
        self.n_entries += 1;
        if self.n_entries > self.limits.max_entries {
            return Err(SnapshotError::TooLarge {
                limit: self.limits.max_entries,
            });
        }
        let raw_path = entry.path().map_err(SnapshotError::corrupt)?.into_owned();
        let path = normalize(&raw_path)?;
        let unsafe_entry = |reason| SnapshotError::Unsafe {
            path: path.clone(),
            reason,
        };
        let mode = entry.header().mode().map_err(SnapshotError::corrupt)? & 0o777;
        let mtime = entry.header().mtime().map_err(SnapshotError::corrupt)?;
        if path.is_empty() {
            // `./` is the root itself, which already exists.
            return match entry_type {
                EntryType::Directory => Ok(()),
                _ => Err(unsafe_entry("empty path")),
            };
        }
        match entry_type {
            EntryType::Regular | EntryType::Directory | EntryType::Symlink | EntryType::Link => {}
            EntryType::Char | EntryType::Block => return Err(unsafe_entry("device")),
            EntryType::Fifo => return Err(unsafe_entry("fifo")),
            EntryType::GNUSparse => return Err(unsafe_entry("sparse file")),
            _ => return Err(unsafe_entry("unsupported entry type")),
        }
        self.prepare_parents(&path)?;
        if let Some(existing) = self.kinds.get(&path) {
            if *existing == Kind::Dir && entry_type == EntryType::Directory {
                self.directories.push((path, mode, mtime));
                return Ok(());
            }
            return Err(unsafe_entry("duplicate entry"));
        }
        let full = self.root.join(&path);
        match entry_type {
            EntryType::Directory => {
                std::fs::create_dir(&full)?;
                self.kinds.insert(path.clone(), Kind::Dir);
                self.directories.push((path, mode, mtime));
            }
            EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(SnapshotError::corrupt)?
                    .ok_or_else(|| unsafe_entry("symlink without a target"))?
                    .into_owned();
                if target.as_os_str().is_empty() {
                    return Err(unsafe_entry("symlink without a target"));
                }
                // An absolute target is kept as written when it spells this root (a link the
                // sandbox made as `/workspace/...`); it is checked as the same place spelled
                // from the link's directory.
                let from_dir = from_link_dir(&self.real_root, &path, &target)
                    .ok_or_else(|| unsafe_entry("symlink to an absolute path outside the root"))?;
                if !link_stays_inside(&path, &from_dir) {
                    return Err(unsafe_entry("symlink points outside the root"));
                }
                std::os::unix::fs::symlink(&target, &full)?;
                self.symlinks.push((path.clone(), from_dir));
                self.kinds.insert(path, Kind::Symlink);
                set_link_mtime(&full, mtime)?;
            }
            EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(SnapshotError::corrupt)?
                    .ok_or_else(|| unsafe_entry("hard link without a target"))?
                    .into_owned();
                let target =
                    normalize(&target).map_err(|_| unsafe_entry("hard link outside the root"))?;
                if self.kinds.get(&target) != Some(&Kind::File) {
                    return Err(unsafe_entry("hard link to no earlier file of this archive"));
                }
                std::fs::hard_link(self.root.join(&target), &full)?;
                self.kinds.insert(path, Kind::File);
                self.stats.n_files += 1;
            }
            _ => {
                let size = entry.header().size().map_err(SnapshotError::corrupt)?;
                self.declared_bytes = self.declared_bytes.saturating_add(size);
                if self.declared_bytes > self.limits.max_bytes {
                    return Err(SnapshotError::TooLarge {
                        limit: self.limits.max_bytes,
                    });
                }
                let mut file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
                    .open(&full)?;
                self.kinds.insert(path, Kind::File);
                let written = copy_entry(entry, &mut file)?;
                file.set_permissions(std::fs::Permissions::from_mode(mode))?;
                file.set_modified(system_time(mtime))?;
                self.stats.n_files += 1;
                self.stats.bytes += written;
            }
        }
        Ok(())
    }

    /// Creates the missing parents of `path`; refuses one that is a symlink or a file.
    fn prepare_parents(&mut self, path: &str) -> Result<(), SnapshotError> {
        for parent in parents(path) {
            match self.kinds.get(parent) {
                Some(Kind::Dir) => {}
                Some(Kind::Symlink) => {
                    return Err(SnapshotError::Unsafe {
                        path: path.to_owned(),
                        reason: "path goes through a symlink",
                    });
                }
                Some(Kind::File) => {
                    return Err(SnapshotError::Unsafe {
                        path: path.to_owned(),
                        reason: "path goes through a file",
                    });
                }
                None => {
                    std::fs::create_dir(self.root.join(parent))?;
                    self.kinds.insert(parent.to_owned(), Kind::Dir);
                }
            }
        }
        Ok(())
    }

    /// Directory modes and mtimes, deepest first.
    fn finish_directories(&mut self) -> Result<(), SnapshotError> {
        self.directories.sort_by(|a, b| b.0.cmp(&a.0));
        for (path, mode, mtime) in &self.directories {
            let full = self.root.join(path);
            std::fs::set_permissions(&full, std::fs::Permissions::from_mode(*mode))?;
            File::open(&full)?.set_modified(system_time(*mtime))?;
        }
        Ok(())
    }
}

/// Copies an entry's data to `file`. Reading fails as corrupt (a cut or broken stream), writing
/// as an I/O error (a full disk).
fn copy_entry(entry: &mut impl Read, file: &mut File) -> Result<u64, SnapshotError> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut written = 0u64;
    loop {
        let n = match entry.read(&mut buf) {
            Ok(0) => return Ok(written),
            Ok(n) => n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(SnapshotError::corrupt(error)),
        };
        file.write_all(&buf[..n])?;
        written += n as u64;
    }
}

/// A header's mtime; one too large for the clock is the epoch.
fn system_time(mtime: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH
        .checked_add(Duration::from_secs(mtime))
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

fn set_link_mtime(path: &Path, mtime: u64) -> io::Result<()> {
    use rustix::fs::{AtFlags, CWD, Timespec, Timestamps, utimensat};
    let when = Timespec {
        tv_sec: i64::try_from(mtime).unwrap_or(i64::MAX),
        tv_nsec: 0,
    };
    let times = Timestamps {
        last_access: when,
        last_modification: when,
    };
    utimensat(CWD, path, &times, AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(())
}

/// Removes everything beneath `root`, making directories writable first (an unpacked one may be
/// read-only). Never follows a symlink.
fn empty_directory(root: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(root)? {
        let path = entry?.path();
        let metadata = std::fs::symlink_metadata(&path)?;
        if metadata.is_dir() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))?;
            empty_directory(&path)?;
            std::fs::remove_dir(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}
