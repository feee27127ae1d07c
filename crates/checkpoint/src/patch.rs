//! A rewind of a tree on another machine: [`CheckpointStore::patch`] writes, on the gateway,
//! what turns a tree that `current` (a checkpoint of it just taken) describes into `target`;
//! [`apply_patch`] applies it there (in its execd), knowing nothing of the store.
//!
//! # Wire format (version 1)
//!
//! Integers are little-endian. A patch is the 8 bytes `WPATCH01`, then one record per entry of
//! `target` in the manifest's order (parents first), then an end record. Every record starts
//! with a tag byte; an entry record then has its path (`u16` length and UTF-8 bytes), its mode
//! (`u32`, permission bits) and its mtime (`i64`, nanoseconds since the epoch), then by tag:
//!
//! - `d` a directory: nothing more.
//! - `l` a symlink: its target (`u16` length and UTF-8 bytes), as written.
//! - `k` a regular file the receiver keeps as it is (`current` has the same chunks): its size
//!   (`u64`), which the receiver checks.
//! - `f` a regular file with its content: the number of chunks (`u32`), each chunk's id (64
//!   lowercase hex digits, the BLAKE3 hash of its content) and length (`u32`), then the content
//!   of every chunk in order, exactly its length each. The receiver checks each chunk against
//!   its id.
//!
//! The end record is `.`, the number of entry records (`u64`) and of content bytes (`u64`);
//! nothing may follow it. A patch without one is cut, and applies nothing.
//!
//! # Applying
//!
//! The patch is hostile input even though the gateway made it: lengths are bounded before
//! anything is allocated (a name by its `u16`, a chunk by the chunker's maximum, the entry
//! records together by [`MAX_LISTING_BYTES`]), the entries pass the manifest's checks
//! (`Manifest::check`: canonical paths, sorted, every parent an earlier directory entry, so no
//! path leads outside the root or through a link), and garbage is [`Error::Corrupt`].
//!
//! All or nothing: file contents and links are written into a staging directory inside the root
//! as the patch is read. Its name is `.warren-patch-<pid>-<n>` followed by the byte `0xff`,
//! which makes it a name that is not UTF-8: a checkpoint's walk and a snapshot's pack skip such
//! names (manifests and archives hold UTF-8 paths only), so they never record it, and skipping
//! it cannot hide a file they would otherwise have recorded. Inside the root (rather than beside
//! it) the staged files are on the root's file system and mount, so renaming them in cannot fail
//! with `EXDEV` when the root is a mount point, as a sandbox's workspace often is. The staging
//! directory goes at the end, whatever happened; a root whose file system refuses such a name
//! cannot be patched.
//!
//! Only after the end record has been read, the entries checked and every file staged is the
//! root looked at and changed, each step an `*at` call beneath a directory reached without
//! following a link (`O_NOFOLLOW`), so a link the sandbox planted is never followed: names the
//! target lacks removed (a directory with everything beneath it, links never followed), then
//! directories made and staged files and links renamed over their places in path order, then
//! modes and times. A file the patch keeps and a directory in both are not replaced: a process
//! with one open, or a directory as its working directory, keeps it. A file the patch keeps that
//! is missing or of another size means the tree changed since `current` was taken: nothing
//! changes and the error is [`Error::Invalid`]. A step that fails with an I/O error once
//! changes began leaves the tree part way, which the error says; a new patch finishes it.
//!
//! What is created is given to `owner` when there is one (execd running as root for a sandbox's
//! user); modes lose setuid, setgid and sticky, as in a restore.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::Error;
use crate::chunk::{ChunkId, ChunkRef, MAX_CHUNK};
use crate::manifest::{Content, Entry, Manifest};
use crate::path;
use crate::store::CheckpointStore;
use crate::take::Stamp;
use crate::tree::{DirCursor, Writer, open_dir, set_mtime_at, settle_modes_and_times, split};

/// The first bytes of every patch: the format and its version.
const MAGIC: &[u8; 8] = b"WPATCH01";
const DIR: u8 = b'd';
const LINK: u8 = b'l';
const KEPT: u8 = b'k';
const FILE: u8 = b'f';
const END: u8 = b'.';
/// The most bytes of entry records (content excluded) a receiver reads: the manifest's own
/// bound on its entry stream, about five million entries.
const MAX_LISTING_BYTES: u64 = 1 << 30;
/// The buffers between a patch and its reader or writer.
const BUFFER_BYTES: usize = 64 * 1024;

static N_STAGINGS: AtomicU64 = AtomicU64::new(0);

/// What [`CheckpointStore::patch`] wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PatchStats {
    /// Entry records: every entry of the target.
    pub n_entries: u64,
    /// Files sent with their content (new, or changed since `current`).
    pub n_files_sent: u64,
    /// Their content bytes.
    pub bytes_sent: u64,
}

/// What [`apply_patch`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApplyStats {
    /// Files written from the patch's content.
    pub files_written: u64,
    /// Their bytes.
    pub bytes_written: u64,
    /// Paths removed, every entry beneath a removed directory counted.
    pub removed: u64,
}

impl CheckpointStore {
    /// Writes to `out` the patch (see the module's docs) that makes the tree `current`
    /// describes into `target`'s: every entry of `target`, with the content of the files
    /// `current` lacks or holds other chunks for. Chunks are fetched and verified one at a
    /// time; a broken or missing one fails it with [`Error::Broken`] or [`Error::Missing`],
    /// and the stream then lacks its end record, so it applies nothing.
    pub fn patch(
        &self,
        target: &Manifest,
        current: &Manifest,
        out: &mut dyn Write,
    ) -> Result<PatchStats, Error> {
        Manifest::check(&target.entries)?;
        Manifest::check(&current.entries)?;
        let mut out = BufWriter::with_capacity(BUFFER_BYTES, out);
        let mut stats = PatchStats::default();
        write_all(&mut out, MAGIC)?;
        for entry in &target.entries {
            let chunks = match &entry.content {
                Content::File(chunks)
                    if current.entry(&entry.path).map(|e| &e.content) != Some(&entry.content) =>
                {
                    Some(chunks)
                }
                _ => None,
            };
            write_all(&mut out, &entry_record(entry, chunks.is_some())?)?;
            stats.n_entries += 1;
            let Some(chunks) = chunks else {
                continue;
            };
            for chunk in chunks {
                let content = self.chunks.fetch(&chunk.id, &entry.path)?;
                if content.len() != chunk.len as usize {
                    return Err(Error::Corrupt(format!(
                        "{:?}: chunk {} has {} bytes, not {}",
                        entry.path,
                        chunk.id,
                        content.len(),
                        chunk.len
                    )));
                }
                write_all(&mut out, &content)?;
            }
            stats.n_files_sent += 1;
            stats.bytes_sent += entry.size;
        }
        let mut end = vec![END];
        end.extend_from_slice(&stats.n_entries.to_le_bytes());
        end.extend_from_slice(&stats.bytes_sent.to_le_bytes());
        write_all(&mut out, &end)?;
        out.flush()
            .map_err(|e| Error::io("cannot write the patch", e))?;
        Ok(stats)
    }
}

fn write_all(out: &mut impl Write, bytes: &[u8]) -> Result<(), Error> {
    out.write_all(bytes)
        .map_err(|e| Error::io("cannot write the patch", e))
}

/// `entry`'s record: a file with its chunk list when `with_content` (its content follows), else
/// as kept. A link target or chunk list too long for the format is a manifest no take makes.
fn entry_record(entry: &Entry, with_content: bool) -> Result<Vec<u8>, Error> {
    let tag = match (&entry.content, with_content) {
        (Content::Dir, _) => DIR,
        (Content::Symlink(_), _) => LINK,
        (Content::File(_), false) => KEPT,
        (Content::File(_), true) => FILE,
    };
    let mut record = Vec::with_capacity(32 + entry.path.len());
    record.push(tag);
    put_text(&mut record, &entry.path)?;
    record.extend_from_slice(&entry.mode.to_le_bytes());
    record.extend_from_slice(&entry.mtime_ns.to_le_bytes());
    match &entry.content {
        Content::Dir => {}
        Content::Symlink(target) => put_text(&mut record, target)?,
        Content::File(_) if !with_content => record.extend_from_slice(&entry.size.to_le_bytes()),
        Content::File(chunks) => {
            let n_chunks = u32::try_from(chunks.len()).map_err(|_| {
                Error::Corrupt(format!("{:?}: {} chunks", entry.path, chunks.len()))
            })?;
            record.extend_from_slice(&n_chunks.to_le_bytes());
            for chunk in chunks {
                record.extend_from_slice(chunk.id.to_hex().as_bytes());
                record.extend_from_slice(&chunk.len.to_le_bytes());
            }
        }
    }
    Ok(record)
}

/// `text` with its `u16` length (a checked path has at most 4,095 bytes; the kernel makes no
/// longer link target).
fn put_text(record: &mut Vec<u8>, text: &str) -> Result<(), Error> {
    let n = u16::try_from(text.len())
        .map_err(|_| Error::Corrupt(format!("a path or link target of {} bytes", text.len())))?;
    record.extend_from_slice(&n.to_le_bytes());
    record.extend_from_slice(text.as_bytes());
    Ok(())
}

/// Applies the patch read from `patch` to the tree beneath `root`, as the module's docs say;
/// what is created is given to `owner` when there is one.
pub fn apply_patch(
    root: &Path,
    patch: &mut dyn Read,
    owner: Option<(u32, u32)>,
) -> Result<ApplyStats, Error> {
    let root_fd = open_dir(root)?;
    let writer = Writer {
        n_threads: 1,
        owner,
    };
    let staging = Staging::create(&root_fd, root)?;
    let applied = (|| {
        let mut reader = PatchReader {
            inner: BufReader::with_capacity(BUFFER_BYTES, patch),
            listing_bytes: 0,
        };
        let listing = read_patch(&mut reader, &staging.fd, writer)?;
        Manifest::check(&listing.entries)?;
        stage_links(&listing.entries, &staging.fd, writer)?;
        let plan = plan(&root_fd, &staging.name, &listing)?;
        let removed = apply(&listing.entries, &plan, &root_fd, &staging.fd, writer).map_err(
            |(what, e)| {
                Error::io(
                    format!(
                        "the patch of {} stopped part way ({what}); a new patch finishes it",
                        root.display()
                    ),
                    e,
                )
            },
        )?;
        Ok(ApplyStats {
            files_written: listing.n_files,
            bytes_written: listing.n_bytes,
            removed,
        })
    })();
    if let Err(error) = staging.remove(&root_fd) {
        tracing::warn!(root = %root.display(), %error, "cannot remove a patch's staging directory");
    }
    applied
}

/// The staging directory inside the root, open.
struct Staging {
    name: CString,
    fd: OwnedFd,
}

impl Staging {
    fn create(root_fd: &OwnedFd, root: &Path) -> Result<Staging, Error> {
        let mut name = format!(
            ".warren-patch-{}-{}",
            std::process::id(),
            N_STAGINGS.fetch_add(1, Ordering::Relaxed)
        )
        .into_bytes();
        // Never part of a UTF-8 name: see the module's docs.
        name.push(0xff);
        let name = CString::new(name).expect("the staging name holds no NUL");
        let fail = |e: Errno| {
            Error::io(
                format!("cannot create a staging directory in {}", root.display()),
                e.into(),
            )
        };
        rustix::fs::mkdirat(root_fd, &name, Mode::from_raw_mode(0o700)).map_err(fail)?;
        match open_beneath(root_fd.as_fd(), &name) {
            Ok(fd) => Ok(Staging { name, fd }),
            Err(e) => {
                let _ = rustix::fs::unlinkat(root_fd, &name, AtFlags::REMOVEDIR);
                Err(fail(e))
            }
        }
    }

    /// Removes the staging directory and what is left in it, unless its name has come to
    /// mean another directory meanwhile (the sandbox may rename what is in its root).
    fn remove(self, root_fd: &OwnedFd) -> std::io::Result<()> {
        let ours = rustix::fs::fstat(&self.fd)?;
        match rustix::fs::statat(root_fd, &self.name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(there) if there.st_ino == ours.st_ino && there.st_dev == ours.st_dev => {
                remove_at(root_fd.as_fd(), &self.name).map(drop)
            }
            Ok(_) | Err(Errno::NOENT) => {
                tracing::warn!("a patch's staging directory was moved; its content is removed");
                for name in names_in(self.fd.as_fd())? {
                    remove_at(self.fd.as_fd(), &name)?;
                }
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// The directory `name` in `dir`, opened without following a link.
fn open_beneath(dir: BorrowedFd<'_>, name: &CStr) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// The names in the directory `dir`, without `.` and `..`.
fn names_in(dir: BorrowedFd<'_>) -> std::io::Result<Vec<CString>> {
    let mut listing = rustix::fs::Dir::read_from(dir)?;
    let mut names = Vec::new();
    while let Some(entry) = listing.read() {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_bytes() != b"." && name.to_bytes() != b".." {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

/// Removes `name` in `dir` and, when it is a directory, everything beneath it, never following
/// a link (directories are made writable first: one may be read-only). Returns how many paths
/// went; one already gone is not an error.
fn remove_at(dir: BorrowedFd<'_>, name: &CStr) -> std::io::Result<u64> {
    let is_dir =
        |stat: &rustix::fs::Stat| FileType::from_raw_mode(stat.st_mode) == FileType::Directory;
    let stat = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => stat,
        Err(Errno::NOENT) => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    if !is_dir(&stat) {
        return match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
            Ok(()) => Ok(1),
            Err(Errno::NOENT) => Ok(0),
            Err(e) => Err(e.into()),
        };
    }
    let open = |parent: BorrowedFd<'_>, name: &CStr| -> std::io::Result<RemovalFrame> {
        let fd = open_beneath(parent, name)?;
        let stat = rustix::fs::fstat(&fd)?;
        if stat.st_mode & 0o700 != 0o700 {
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o700))?;
        }
        let names = names_in(fd.as_fd())?;
        Ok(RemovalFrame {
            fd,
            name: name.to_owned(),
            names,
        })
    };
    // A stack rather than recursion: a sandbox can make a tree deeper than any thread's stack.
    let mut frames = vec![open(dir, name)?];
    let mut removed = 0u64;
    while let Some(frame) = frames.last_mut() {
        if let Some(child) = frame.names.pop() {
            let stat = match rustix::fs::statat(&frame.fd, &child, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            };
            if is_dir(&stat) {
                let below = open(frame.fd.as_fd(), &child)?;
                frames.push(below);
            } else {
                match rustix::fs::unlinkat(&frame.fd, &child, AtFlags::empty()) {
                    Ok(()) => removed += 1,
                    Err(Errno::NOENT) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            continue;
        }
        let done = frames.pop().expect("the frame just looked at");
        let parent = frames.last().map_or(dir, |frame| frame.fd.as_fd());
        rustix::fs::unlinkat(parent, &done.name, AtFlags::REMOVEDIR)?;
        removed += 1;
    }
    Ok(removed)
}

/// A directory being removed: its descriptor, its name in the one above, names left.
struct RemovalFrame {
    fd: OwnedFd,
    name: CString,
    names: Vec<CString>,
}

/// A patch as it is read: every read bounded, every shortfall [`Error::Corrupt`].
struct PatchReader<'a> {
    inner: BufReader<&'a mut dyn Read>,
    /// Bytes of entry records read so far (content excluded), at most [`MAX_LISTING_BYTES`].
    listing_bytes: u64,
}

impl PatchReader<'_> {
    fn exact(&mut self, out: &mut [u8]) -> Result<(), Error> {
        self.inner.read_exact(out).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => {
                Error::Corrupt("the patch ends before its end record".to_owned())
            }
            _ => Error::Corrupt(format!("the patch cannot be read: {e}")),
        })
    }

    /// `N` bytes of an entry record.
    fn listed<const N: usize>(&mut self) -> Result<[u8; N], Error> {
        self.listing_bytes += N as u64;
        if self.listing_bytes > MAX_LISTING_BYTES {
            return Err(Error::Corrupt(format!(
                "entry records of more than {MAX_LISTING_BYTES} bytes"
            )));
        }
        let mut bytes = [0u8; N];
        self.exact(&mut bytes)?;
        Ok(bytes)
    }

    fn u8(&mut self) -> Result<u8, Error> {
        Ok(self.listed::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, Error> {
        Ok(u16::from_le_bytes(self.listed()?))
    }

    fn u32(&mut self) -> Result<u32, Error> {
        Ok(u32::from_le_bytes(self.listed()?))
    }

    fn u64(&mut self) -> Result<u64, Error> {
        Ok(u64::from_le_bytes(self.listed()?))
    }

    fn i64(&mut self) -> Result<i64, Error> {
        Ok(i64::from_le_bytes(self.listed()?))
    }

    /// A path or link target: its `u16` length, then UTF-8.
    fn text(&mut self, what: &str) -> Result<String, Error> {
        let n = self.u16()?;
        self.listing_bytes += u64::from(n);
        if self.listing_bytes > MAX_LISTING_BYTES {
            return Err(Error::Corrupt(format!(
                "entry records of more than {MAX_LISTING_BYTES} bytes"
            )));
        }
        let mut bytes = vec![0u8; usize::from(n)];
        self.exact(&mut bytes)?;
        String::from_utf8(bytes).map_err(|_| Error::Corrupt(format!("{what} is not UTF-8")))
    }

    /// True when nothing follows.
    fn at_end(&mut self) -> Result<bool, Error> {
        let mut byte = [0u8; 1];
        loop {
            match self.inner.read(&mut byte) {
                Ok(n) => return Ok(n == 0),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::Corrupt(format!("the patch cannot be read: {e}"))),
            }
        }
    }
}

/// The target's entries as a patch lists them, its content staged.
struct Listing {
    /// A kept file is listed as an empty one (no chunks, size 0), which the manifest's checks
    /// accept; its size is in `kept`.
    entries: Vec<Entry>,
    /// The kept files' indexes, ascending, and sizes.
    kept: Vec<(usize, u64)>,
    n_files: u64,
    n_bytes: u64,
}

/// Reads the whole patch, writing each file's content into `staging` (named by its index) as
/// it comes.
fn read_patch(
    reader: &mut PatchReader<'_>,
    staging: &OwnedFd,
    writer: Writer,
) -> Result<Listing, Error> {
    let mut magic = [0u8; 8];
    reader.exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(Error::Corrupt("not a patch of this version".to_owned()));
    }
    let mut listing = Listing {
        entries: Vec::new(),
        kept: Vec::new(),
        n_files: 0,
        n_bytes: 0,
    };
    let mut buffer = Vec::new();
    loop {
        let tag = reader.u8()?;
        if tag == END {
            let (n_entries, n_bytes) = (reader.u64()?, reader.u64()?);
            if n_entries != listing.entries.len() as u64 || n_bytes != listing.n_bytes {
                return Err(Error::Corrupt(format!(
                    "the end record counts {n_entries} entries and {n_bytes} bytes, not {} and {}",
                    listing.entries.len(),
                    listing.n_bytes
                )));
            }
            if !reader.at_end()? {
                return Err(Error::Corrupt("bytes after the end record".to_owned()));
            }
            return Ok(listing);
        }
        let path = reader.text("a path")?;
        if let Some(reason) = path::refusal(&path) {
            return Err(Error::Unsafe { path, reason });
        }
        let mode = reader.u32()?;
        let mtime_ns = reader.i64()?;
        let index = listing.entries.len();
        let (content, size) = match tag {
            DIR => (Content::Dir, 0),
            LINK => {
                let target = reader.text("a link target")?;
                let size = target.len() as u64;
                (Content::Symlink(target), size)
            }
            KEPT => {
                listing.kept.push((index, reader.u64()?));
                (Content::File(Vec::new()), 0)
            }
            FILE => {
                let n_chunks = reader.u32()?;
                let mut chunks = Vec::new();
                let mut size = 0u64;
                for _ in 0..n_chunks {
                    let hex = reader.listed::<64>()?;
                    let id = std::str::from_utf8(&hex)
                        .ok()
                        .and_then(ChunkId::from_hex)
                        .ok_or_else(|| Error::Corrupt(format!("{path:?}: a chunk id not hex")))?;
                    let len = reader.u32()?;
                    if len == 0 || len as usize > MAX_CHUNK {
                        return Err(Error::Corrupt(format!("{path:?}: a chunk of {len} bytes")));
                    }
                    chunks.push(ChunkRef { id, len });
                    size += u64::from(len);
                }
                (Content::File(chunks), size)
            }
            other => {
                return Err(Error::Corrupt(format!("a record tagged {other:#04x}")));
            }
        };
        let entry = Entry {
            path,
            content,
            mode,
            size,
            mtime_ns,
            ino: 0,
            dev: 0,
        };
        if tag == FILE {
            stage_file(reader, &entry, index, staging, writer, &mut buffer)?;
            listing.n_files += 1;
            listing.n_bytes += entry.size;
        }
        listing.entries.push(entry);
    }
}

/// Writes the content that follows `entry`'s record to `staging/<index>`, each chunk checked
/// against its id, with the entry's mode (permission bits only), owner and mtime.
fn stage_file(
    reader: &mut PatchReader<'_>,
    entry: &Entry,
    index: usize,
    staging: &OwnedFd,
    writer: Writer,
    buffer: &mut Vec<u8>,
) -> Result<(), Error> {
    let Content::File(chunks) = &entry.content else {
        return Ok(());
    };
    let name = index.to_string();
    let io_error = |e: std::io::Error| Error::io(format!("cannot stage {:?}", entry.path), e);
    let fd = rustix::fs::openat(
        staging,
        &name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| io_error(e.into()))?;
    let mut file = File::from(fd);
    for chunk in chunks {
        buffer.resize(chunk.len as usize, 0);
        reader.exact(buffer)?;
        if ChunkId::of(buffer) != chunk.id {
            return Err(Error::Corrupt(format!(
                "{:?}: chunk {} does not match its hash",
                entry.path, chunk.id
            )));
        }
        file.write_all(buffer).map_err(io_error)?;
    }
    if let Some((uid, gid)) = writer.owner {
        std::os::unix::fs::fchown(&file, Some(uid), Some(gid)).map_err(io_error)?;
    }
    rustix::fs::fchmod(&file, Mode::from_raw_mode(entry.mode & 0o777))
        .map_err(|e| io_error(e.into()))?;
    drop(file);
    set_mtime_at(staging.as_fd(), &name, entry.mtime_ns).map_err(io_error)
}

/// Makes every link of the target in `staging/<index>`, owned as the writer says.
fn stage_links(entries: &[Entry], staging: &OwnedFd, writer: Writer) -> Result<(), Error> {
    for (index, entry) in entries.iter().enumerate() {
        if let Content::Symlink(target) = &entry.content {
            let name = index.to_string();
            rustix::fs::symlinkat(target.as_str(), staging, &name)
                .map_err(std::io::Error::from)
                .and_then(|()| writer.own_at(staging.as_fd(), &name))
                .map_err(|e| Error::io(format!("cannot stage the link {:?}", entry.path), e))?;
        }
    }
    Ok(())
}

/// What the root holds at a path the target has.
#[derive(Debug, Clone)]
enum Found {
    File(Stamp),
    Dir,
    Link(Vec<u8>),
    /// A FIFO, socket or device: replaced, never kept.
    Other,
}

/// What applying does, by entry index (or name, for what it removes).
#[derive(Default)]
struct Plan {
    /// Names to remove, each with the directory (of the target) it is in.
    removed: Vec<(String, CString)>,
    /// Directories to make.
    made: Vec<usize>,
    /// Staged files and links to rename into place.
    placed: Vec<usize>,
    /// Files that stay, with their stat (their mode and mtime may still change).
    kept: Vec<(usize, Stamp)>,
}

/// Compares the root with the target's entries, looking only beneath directories both have.
fn plan(root_fd: &OwnedFd, staging_name: &CStr, listing: &Listing) -> Result<Plan, Error> {
    let entries = &listing.entries;
    let mut found: Vec<Option<Found>> = vec![None; entries.len()];
    let mut plan = Plan::default();
    let mut cursor = DirCursor::new(root_fd);
    // A directory is looked into after its parent (path order), once known to be one.
    look_into(
        &mut cursor,
        "",
        staging_name,
        entries,
        &mut found,
        &mut plan,
    )?;
    for (index, entry) in entries.iter().enumerate() {
        if entry.content == Content::Dir && matches!(found[index], Some(Found::Dir)) {
            look_into(
                &mut cursor,
                &entry.path,
                staging_name,
                entries,
                &mut found,
                &mut plan,
            )?;
        }
    }
    let stale = |path: &str, what: &str| {
        Error::Invalid(format!(
            "the tree changed since the checkpoint the patch was made against: {path:?} {what}"
        ))
    };
    let mut kept = listing.kept.iter().peekable();
    for (index, entry) in entries.iter().enumerate() {
        let there = found[index].take();
        let kept_size = kept
            .next_if(|(kept_index, _)| *kept_index == index)
            .map(|(_, size)| *size);
        let replace = |plan: &mut Plan, there: &Option<Found>| {
            if matches!(there, Some(Found::Dir)) {
                let (dir, name) = split(&entry.path);
                let name = CString::new(name).expect("a checked path holds no NUL");
                plan.removed.push((dir.to_owned(), name));
            }
            plan.placed.push(index);
        };
        match (&entry.content, kept_size) {
            (Content::Dir, _) => match there {
                Some(Found::Dir) => {}
                None => plan.made.push(index),
                Some(_) => {
                    let (dir, name) = split(&entry.path);
                    let name = CString::new(name).expect("a checked path holds no NUL");
                    plan.removed.push((dir.to_owned(), name));
                    plan.made.push(index);
                }
            },
            (Content::File(_), Some(size)) => match there {
                Some(Found::File(stamp)) if stamp.size == size => plan.kept.push((index, stamp)),
                Some(Found::File(_)) => return Err(stale(&entry.path, "has another size")),
                Some(_) => return Err(stale(&entry.path, "is no longer a regular file")),
                None => return Err(stale(&entry.path, "is missing")),
            },
            (Content::File(_), None) => replace(&mut plan, &there),
            (Content::Symlink(target), _) => match &there {
                // The same link stays (its time is set with the others').
                Some(Found::Link(have)) if have == target.as_bytes() => {}
                _ => replace(&mut plan, &there),
            },
        }
    }
    Ok(plan)
}

/// Lists the directory `dir` (a directory of both the root and the target): names the target
/// lacks go to `plan.removed`, what is at each name it has goes to `found`.
fn look_into(
    cursor: &mut DirCursor<'_>,
    dir: &str,
    staging_name: &CStr,
    entries: &[Entry],
    found: &mut [Option<Found>],
    plan: &mut Plan,
) -> Result<(), Error> {
    let fail = |e: std::io::Error| {
        let shown = if dir.is_empty() { "the root" } else { dir };
        Error::io(format!("cannot look into {shown:?}"), e)
    };
    let dir_fd = cursor.dir(dir).map_err(fail)?;
    for name in names_in(dir_fd).map_err(fail)? {
        if dir.is_empty() && name.as_c_str() == staging_name {
            continue;
        }
        let index = name.to_str().ok().and_then(|name| {
            let path = path::join(dir, name);
            entries
                .binary_search_by(|entry| entry.path.as_str().cmp(&path))
                .ok()
        });
        let Some(index) = index else {
            // Not in the target (a name that is not UTF-8 never is).
            plan.removed.push((dir.to_owned(), name));
            continue;
        };
        let stat = match rustix::fs::statat(dir_fd, &name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(fail(e.into())),
        };
        found[index] = Some(match FileType::from_raw_mode(stat.st_mode) {
            FileType::RegularFile => Found::File(Stamp::of(&stat)),
            FileType::Directory => Found::Dir,
            FileType::Symlink => Found::Link(
                rustix::fs::readlinkat(dir_fd, &name, Vec::new())
                    .map_err(|e| fail(e.into()))?
                    .into_bytes(),
            ),
            _ => Found::Other,
        });
    }
    Ok(())
}

/// Changes the root: removals, then creations in path order, then modes and times. Returns the
/// paths removed; on failure, what was being done and the error.
fn apply(
    entries: &[Entry],
    plan: &Plan,
    root_fd: &OwnedFd,
    staging: &OwnedFd,
    writer: Writer,
) -> Result<u64, (String, std::io::Error)> {
    let fail = |what: &str, path: &str| {
        let what = format!("{what} {path:?}");
        move |e: Errno| (what, std::io::Error::from(e))
    };
    let reach = |dir: &str| {
        let dir = dir.to_owned();
        move |e: std::io::Error| (format!("reaching {dir:?}"), e)
    };
    let mut cursor = DirCursor::new(root_fd);
    // The directories names go from or come into must be writable (one may be read-only, which
    // stops only a process that is not root); the last step gives them their modes.
    let mut changed_dirs: Vec<&str> = plan
        .removed
        .iter()
        .map(|(dir, _)| dir.as_str())
        .chain(
            plan.made
                .iter()
                .chain(&plan.placed)
                .map(|index| split(&entries[*index].path).0),
        )
        .filter(|dir| !dir.is_empty())
        .collect();
    changed_dirs.sort_unstable();
    changed_dirs.dedup();
    for dir in changed_dirs {
        // One the patch makes does not exist yet, and is made writable.
        let Ok(dir_fd) = cursor.dir(dir) else {
            continue;
        };
        let stat = rustix::fs::fstat(dir_fd).map_err(fail("reaching", dir))?;
        if stat.st_mode & 0o700 != 0o700 {
            rustix::fs::fchmod(dir_fd, Mode::from_raw_mode((stat.st_mode | 0o700) & 0o777))
                .map_err(fail("changing the mode of", dir))?;
        }
    }
    cursor.reset();

    let mut removed = 0u64;
    for (dir, name) in &plan.removed {
        let dir_fd = cursor.dir(dir).map_err(reach(dir))?;
        removed += remove_at(dir_fd, name).map_err(|e| {
            let shown = path::join(dir, &name.to_string_lossy());
            (format!("removing {shown:?}"), e)
        })?;
    }
    cursor.reset();

    let mut created: Vec<usize> = plan.made.iter().chain(&plan.placed).copied().collect();
    created.sort_unstable();
    for index in created {
        let entry = &entries[index];
        let (dir, name) = split(&entry.path);
        let dir_fd = cursor.dir(dir).map_err(reach(dir))?;
        match entry.content {
            Content::Dir => {
                rustix::fs::mkdirat(dir_fd, name, Mode::from_raw_mode(0o700))
                    .map_err(fail("making", &entry.path))?;
                writer
                    .own_at(dir_fd, name)
                    .map_err(|e| (format!("owning {:?}", entry.path), e))?;
            }
            _ => rustix::fs::renameat(staging, index.to_string(), dir_fd, name)
                .map_err(fail("placing", &entry.path))?,
        }
    }
    cursor.reset();

    let kept = plan
        .kept
        .iter()
        .map(|(index, stamp)| (&entries[*index], stamp));
    settle_modes_and_times(&mut cursor, entries, kept)?;
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    /// An entry and, for a file sent with its content, the content.
    type Record = (Entry, Option<Vec<u8>>);

    fn entry(path: &str, content: Content, mode: u32) -> Entry {
        let size = match &content {
            Content::File(chunks) => chunks.iter().map(|c| u64::from(c.len)).sum(),
            Content::Symlink(target) => target.len() as u64,
            Content::Dir => 0,
        };
        Entry {
            path: path.to_owned(),
            content,
            mode,
            size,
            mtime_ns: 1_600_000_000_000_000_000,
            ino: 0,
            dev: 0,
        }
    }

    fn dir(path: &str) -> Record {
        (entry(path, Content::Dir, 0o755), None)
    }

    fn link(path: &str, target: &str) -> Record {
        (
            entry(path, Content::Symlink(target.to_owned()), 0o777),
            None,
        )
    }

    /// A file sent with `content` (one chunk).
    fn file(path: &str, content: &[u8]) -> Record {
        let chunks = if content.is_empty() {
            Vec::new()
        } else {
            vec![ChunkRef {
                id: ChunkId::of(content),
                len: content.len() as u32,
            }]
        };
        (
            entry(path, Content::File(chunks), 0o644),
            Some(content.to_vec()),
        )
    }

    /// A patch as `CheckpointStore::patch` writes it, of entries made by hand.
    fn patch_of(records: &[Record]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        let mut n_bytes = 0u64;
        for (entry, content) in records {
            out.extend(entry_record(entry, content.is_some()).expect("encodes"));
            if let Some(content) = content {
                out.extend_from_slice(content);
                n_bytes += content.len() as u64;
            }
        }
        out.push(END);
        out.extend_from_slice(&(records.len() as u64).to_le_bytes());
        out.extend_from_slice(&n_bytes.to_le_bytes());
        out
    }

    /// `path → (kind, mode, content or link target)` beneath `root`, links not followed.
    fn snapshot(root: &Path) -> Vec<(String, char, u32, Vec<u8>)> {
        let mut out = Vec::new();
        let mut pending = vec![root.to_path_buf()];
        while let Some(dir) = pending.pop() {
            for child in std::fs::read_dir(&dir).expect("lists") {
                let path = child.expect("an entry").path();
                let metadata = std::fs::symlink_metadata(&path).expect("stats");
                let shown = path
                    .strip_prefix(root)
                    .expect("beneath")
                    .display()
                    .to_string();
                let mode = metadata.mode() & 0o7777;
                if metadata.file_type().is_symlink() {
                    let target = std::fs::read_link(&path).expect("reads the link");
                    out.push((shown, 'l', 0, target.into_os_string().into_encoded_bytes()));
                } else if metadata.is_dir() {
                    pending.push(path);
                    out.push((shown, 'd', mode, Vec::new()));
                } else {
                    out.push((shown, 'f', mode, std::fs::read(&path).expect("reads")));
                }
            }
        }
        out.sort();
        out
    }

    /// A root `dir/ws` holding `a.txt`, `d/b.txt` and a link `out` to `dir/outside`.
    fn tree_with_a_link_out(dir: &Path) -> std::path::PathBuf {
        let root = dir.join("ws");
        std::fs::create_dir_all(root.join("d")).expect("mkdir");
        std::fs::create_dir(dir.join("outside")).expect("mkdir");
        std::fs::write(root.join("a.txt"), b"a\n").expect("writes");
        std::fs::write(root.join("d/b.txt"), b"b\n").expect("writes");
        std::os::unix::fs::symlink(dir.join("outside"), root.join("out")).expect("symlink");
        root
    }

    #[test]
    fn entries_that_could_lead_outside_the_root_are_refused_and_nothing_changes() {
        let temp = tempfile::tempdir().expect("tempdir");
        let root = tree_with_a_link_out(temp.path());
        let before = snapshot(&root);
        let cases: Vec<(Vec<Record>, &str)> = vec![
            (vec![file("../x", b"pwned")], "'.' or '..' in the path"),
            (vec![file("/abs", b"pwned")], "absolute path"),
            (
                vec![dir("d"), file("d/../../x", b"pwned")],
                "'.' or '..' in the path",
            ),
            (
                // Through the link the tree has, which the patch keeps.
                vec![link("out", "../outside"), file("out/x", b"pwned")],
                "parent is not a directory of the checkpoint",
            ),
            (
                vec![file("a.txt", b"a\n"), file("a.txt/x", b"pwned")],
                "parent is not a directory of the checkpoint",
            ),
            (
                vec![file("b", b"1"), file("a", b"2")],
                "entries out of order or repeated",
            ),
            (vec![link("l", "")], "symlink target empty or with NUL"),
        ];
        for (records, reason) in cases {
            let applied = apply_patch(&root, &mut &patch_of(&records)[..], None);
            match applied {
                Err(Error::Unsafe { reason: got, .. }) => assert_eq!(got, reason),
                other => panic!("expected {reason:?}, got {other:?}"),
            }
            assert_eq!(snapshot(&root), before, "{reason}");
            assert_eq!(names(&temp.path().join("outside")), Vec::<String>::new());
            assert_eq!(names(temp.path()), ["outside", "ws"]);
        }
    }

    #[test]
    fn a_directory_where_the_tree_has_a_link_replaces_the_link_and_writes_nothing_through_it() {
        let temp = tempfile::tempdir().expect("tempdir");
        let root = tree_with_a_link_out(temp.path());
        let patch = patch_of(&[dir("out"), file("out/x", b"inside\n")]);
        let applied = apply_patch(&root, &mut &patch[..], None).expect("applies");
        assert_eq!(applied.files_written, 1);
        assert_eq!(
            snapshot(&root),
            [
                ("out".to_owned(), 'd', 0o755, Vec::new()),
                ("out/x".to_owned(), 'f', 0o644, b"inside\n".to_vec()),
            ]
        );
        assert_eq!(names(&temp.path().join("outside")), Vec::<String>::new());
    }

    #[test]
    fn garbage_and_impossible_lengths_are_corrupt_without_allocating_them() {
        let temp = tempfile::tempdir().expect("tempdir");
        let root = tree_with_a_link_out(temp.path());
        let before = snapshot(&root);
        let record = |tag: u8, rest: &[u8]| {
            let mut out = MAGIC.to_vec();
            out.push(tag);
            out.extend_from_slice(&1u16.to_le_bytes());
            out.push(b'x');
            out.extend_from_slice(&0o644u32.to_le_bytes());
            out.extend_from_slice(&0i64.to_le_bytes());
            out.extend_from_slice(rest);
            out
        };
        let mut huge_chunk = u32::MAX.to_le_bytes().to_vec();
        huge_chunk.extend_from_slice(ChunkId::of(b"x").to_hex().as_bytes());
        huge_chunk.extend_from_slice(&((MAX_CHUNK + 1) as u32).to_le_bytes());
        let mut not_hex = 1u32.to_le_bytes().to_vec();
        not_hex.extend_from_slice(&[b'z'; 64]);
        let mut not_utf8 = MAGIC.to_vec();
        not_utf8.push(DIR);
        not_utf8.extend_from_slice(&1u16.to_le_bytes());
        not_utf8.push(0xff);
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("empty", Vec::new()),
            ("another format", b"not a patch at all".to_vec()),
            ("an unknown tag", record(b'?', &[])),
            (
                "u32::MAX chunks, then nothing",
                record(FILE, &u32::MAX.to_le_bytes()),
            ),
            ("a chunk over the maximum", record(FILE, &huge_chunk)),
            ("a chunk id that is not hex", record(FILE, &not_hex)),
            ("a name that is not UTF-8", not_utf8),
            ("a path's length and nothing more", {
                let mut out = MAGIC.to_vec();
                out.push(DIR);
                out.extend_from_slice(&u16::MAX.to_le_bytes());
                out
            }),
        ];
        for (what, bytes) in cases {
            let applied = apply_patch(&root, &mut &bytes[..], None);
            assert!(
                matches!(applied, Err(Error::Corrupt(_))),
                "{what}: {applied:?}"
            );
            assert_eq!(snapshot(&root), before, "{what}");
            assert_eq!(
                names(&root),
                ["a.txt", "d", "out"],
                "{what}: no staging left"
            );
        }
    }

    #[test]
    fn random_damage_to_a_patch_never_panics_and_never_leaves_the_staging_directory() {
        let temp = tempfile::tempdir().expect("tempdir");
        let root = tree_with_a_link_out(temp.path());
        let patch = patch_of(&[
            file("a.txt", b"changed\n"),
            dir("d"),
            file("d/b.txt", b"b\n"),
            dir("e"),
            link("e/l", "../a.txt"),
            file("e/new", &[7u8; 5000]),
        ]);
        apply_patch(&root, &mut &patch[..], None).expect("the undamaged patch applies");
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..500 {
            let mut damaged = patch.clone();
            for _ in 0..=next() % 3 {
                let at = (next() % damaged.len() as u64) as usize;
                match next() % 3 {
                    0 => damaged[at] = next() as u8,
                    1 => damaged.truncate(at),
                    _ => damaged.insert(at, next() as u8),
                }
                if damaged.is_empty() {
                    break;
                }
            }
            // Some damage still makes a valid patch (a changed mode or time): then it applies.
            let _ = apply_patch(&root, &mut &damaged[..], None);
            let left: Vec<String> = names(&root)
                .into_iter()
                .filter(|name| name.starts_with(".warren-patch"))
                .collect();
            assert!(left.is_empty(), "{left:?}");
        }
    }

    #[test]
    fn what_a_patch_creates_is_given_to_the_owner() {
        let temp = tempfile::tempdir().expect("tempdir");
        let root = tree_with_a_link_out(temp.path());
        let (uid, gid) = if rustix::process::geteuid().is_root() {
            (65534, 65534)
        } else {
            (
                rustix::process::geteuid().as_raw(),
                rustix::process::getegid().as_raw(),
            )
        };
        let patch = patch_of(&[
            file("a.txt", b"rewritten\n"),
            dir("new"),
            file("new/f", b"f\n"),
            link("new/l", "f"),
        ]);
        apply_patch(&root, &mut &patch[..], Some((uid, gid))).expect("applies");
        for path in ["a.txt", "new", "new/f", "new/l"] {
            let metadata = std::fs::symlink_metadata(root.join(path)).expect("stats");
            assert_eq!((metadata.uid(), metadata.gid()), (uid, gid), "{path}");
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("lists")
            .map(|e| {
                e.expect("an entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        names
    }
}
