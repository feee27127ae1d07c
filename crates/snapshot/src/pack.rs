//! [`pack`]: a directory tree into a zstd-compressed tar, streamed entry by entry (memory is
//! bounded by one directory listing per level and the hard-link table, never by a file's size).
//!
//! Paths are relative to the root and sorted per directory, so the same tree packs the same
//! way. Regular files, directories (empty ones too), symlinks (stored as links, never followed)
//! and hard links within the tree (the first path carries the data, later ones are tar hard
//! links) are stored with their permission bits and mtime; owners are not. FIFOs, sockets,
//! devices, symlinks that [`crate::unpack`] would refuse (climbing out of the root, or absolute
//! and not spelling the root's own path: a Python venv's `bin/python`, Codex's helper links;
//! `/workspace/a.txt` packed from the root `/workspace` is kept as written) and whatever cannot be opened or
//! listed are skipped and counted, so every archive `pack` makes can be restored. A file that changes
//! size while it is read is stored with exactly the size its header declares (cut or padded
//! with zeros), so the archive is never corrupt.

use std::collections::HashMap;
use std::fs::{File, Metadata};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use tar::{EntryType, Header};

use crate::{SnapshotError, ZSTD_LEVEL};

/// What [`pack`] stored and skipped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PackStats {
    pub n_files: u64,
    pub n_dirs: u64,
    /// Symlinks and hard links.
    pub n_links: u64,
    /// FIFOs, sockets, devices, symlinks out of the tree, and files or directories that could
    /// not be read.
    pub n_skipped: u64,
    /// File content bytes stored (before compression).
    pub bytes: u64,
}

/// Packs the tree beneath `root` (not `root` itself) into `out` as a zstd-compressed tar.
/// Errors are failures to write `out` or to read `root` itself; anything beneath that cannot be
/// read is skipped and counted.
pub fn pack(root: &Path, out: impl Write) -> Result<PackStats, SnapshotError> {
    let encoder = zstd::stream::Encoder::new(out, ZSTD_LEVEL)?;
    let mut builder = tar::Builder::new(encoder);
    builder.follow_symlinks(false);
    let mut packer = Packer {
        builder,
        stats: PackStats::default(),
        hard_links: HashMap::new(),
        // Absolute links are judged against the root's real path, as the kernel follows them.
        root: std::fs::canonicalize(root).unwrap_or_else(|_| root.to_owned()),
    };
    // Directories still to list, deepest last; each holds its own sorted names in reverse so
    // `pop` gives them in order.
    let mut pending: Vec<(String, Vec<std::ffi::OsString>)> =
        vec![(String::new(), sorted_names(root)?)];
    while let Some((dir, names)) = pending.last_mut() {
        let Some(name) = names.pop() else {
            pending.pop();
            continue;
        };
        let Some(name) = name.to_str() else {
            // Archive paths are UTF-8 (the listing and the file routes speak JSON).
            packer.stats.n_skipped += 1;
            continue;
        };
        let relative = if dir.is_empty() {
            name.to_owned()
        } else {
            format!("{dir}/{name}")
        };
        let full = root.join(&relative);
        let Ok(metadata) = std::fs::symlink_metadata(&full) else {
            packer.stats.n_skipped += 1;
            continue;
        };
        let file_type = metadata.file_type();
        if file_type.is_dir() {
            // Listed first, so an unreadable directory is skipped whole rather than stored
            // empty.
            match sorted_names(&full) {
                Ok(names) => {
                    packer.directory(&relative, &metadata)?;
                    pending.push((relative, names));
                }
                Err(_) => packer.stats.n_skipped += 1,
            }
        } else if file_type.is_symlink() {
            packer.symlink(&relative, &full, &metadata)?;
        } else if file_type.is_file() {
            packer.file(&relative, &full, &metadata)?;
        } else {
            packer.stats.n_skipped += 1;
        }
    }
    let encoder = packer.builder.into_inner()?;
    encoder.finish()?.flush()?;
    Ok(packer.stats)
}

/// The names in `dir`, sorted in reverse (so popping gives them in order).
fn sorted_names(dir: &Path) -> io::Result<Vec<std::ffi::OsString>> {
    let mut names = std::fs::read_dir(dir)?
        .map(|entry| entry.map(|e| e.file_name()))
        .collect::<io::Result<Vec<_>>>()?;
    names.sort_unstable_by(|a, b| b.cmp(a));
    Ok(names)
}

struct Packer<W: Write> {
    builder: tar::Builder<W>,
    stats: PackStats,
    /// The first path of every file with more than one link, by (device, inode).
    hard_links: HashMap<(u64, u64), String>,
    /// The root's canonical path, which an absolute link inside the tree spells.
    root: std::path::PathBuf,
}

impl<W: Write> Packer<W> {
    fn directory(&mut self, relative: &str, metadata: &Metadata) -> Result<(), SnapshotError> {
        let mut header = header(EntryType::Directory, metadata);
        self.builder
            .append_data(&mut header, relative, io::empty())?;
        self.stats.n_dirs += 1;
        Ok(())
    }

    fn symlink(
        &mut self,
        relative: &str,
        full: &Path,
        metadata: &Metadata,
    ) -> Result<(), SnapshotError> {
        let Ok(target) = std::fs::read_link(full) else {
            self.stats.n_skipped += 1;
            return Ok(());
        };
        if !crate::path::link_kept(Some(&self.root), relative, &target) {
            self.stats.n_skipped += 1;
            return Ok(());
        }
        let mut header = header(EntryType::Symlink, metadata);
        self.builder.append_link(&mut header, relative, &target)?;
        self.stats.n_links += 1;
        Ok(())
    }

    fn file(
        &mut self,
        relative: &str,
        full: &Path,
        metadata: &Metadata,
    ) -> Result<(), SnapshotError> {
        let key = (metadata.dev(), metadata.ino());
        if metadata.nlink() > 1
            && let Some(first) = self.hard_links.get(&key)
        {
            let mut header = header(EntryType::Link, metadata);
            let first = PathBuf::from(first);
            self.builder.append_link(&mut header, relative, &first)?;
            self.stats.n_links += 1;
            return Ok(());
        }
        // O_NOFOLLOW: a file swapped for a link since the lstat is not followed; O_NONBLOCK: one
        // swapped for a FIFO does not hang the open. The header comes from the open file.
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(
                (rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32,
            )
            .open(full);
        let Ok(file) = opened else {
            self.stats.n_skipped += 1;
            return Ok(());
        };
        let Ok(metadata) = file.metadata() else {
            self.stats.n_skipped += 1;
            return Ok(());
        };
        if !metadata.is_file() {
            self.stats.n_skipped += 1;
            return Ok(());
        }
        let mut header = header(EntryType::Regular, &metadata);
        let size = metadata.len();
        header.set_size(size);
        self.builder
            .append_data(&mut header, relative, ExactSize::new(file, size))?;
        if metadata.nlink() > 1 {
            self.hard_links.insert(key, relative.to_owned());
        }
        self.stats.n_files += 1;
        self.stats.bytes += size;
        Ok(())
    }
}

/// A header of `kind` with the permission bits and mtime of `metadata`, owner 0, size 0.
fn header(kind: EntryType, metadata: &Metadata) -> Header {
    let mut header = Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(metadata.mode() & 0o7777);
    header.set_mtime(u64::try_from(metadata.mtime()).unwrap_or(0));
    header.set_uid(0);
    header.set_gid(0);
    header.set_size(0);
    header
}

/// Exactly `size` bytes of a file: cut where it grew, zeros where it shrank.
struct ExactSize {
    file: io::Take<File>,
    remaining: u64,
}

impl ExactSize {
    fn new(file: File, size: u64) -> Self {
        Self {
            file: file.take(size),
            remaining: size,
        }
    }
}

impl Read for ExactSize {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 || buf.is_empty() {
            return Ok(0);
        }
        let n = match self.file.read(buf)? {
            0 => {
                let n = usize::try_from(self.remaining)
                    .unwrap_or(usize::MAX)
                    .min(buf.len());
                buf[..n].fill(0);
                n
            }
            n => n,
        };
        self.remaining -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_changed_size_is_read_as_exactly_its_header_size() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        std::fs::write(&path, b"0123456789").expect("writes");
        // (size in the header, what the archive gets): grown files are cut, shrunk ones padded.
        let cases: [(u64, &[u8]); 3] =
            [(4, b"0123"), (10, b"0123456789"), (13, b"0123456789\0\0\0")];
        for (size, expected) in cases {
            let mut read = Vec::new();
            let file = File::open(&path).expect("opens");
            ExactSize::new(file, size)
                .read_to_end(&mut read)
                .expect("reads");
            assert_eq!(read, expected, "size {size}");
        }
    }
}
