//! The filesystem work both file APIs share (OpenSandbox's `/files/*` and Warren's
//! `/v1/files*`), on top of [`super::resolve`]: the walk behind listings and searches, moves,
//! temporary files beside a target that never outlive a failed or abandoned write, and the
//! streamed body of a download.
//!
//! Everything here speaks `io::Error` (with [`super::resolve::Refusal`] inside) or a small enum of its
//! own ([`MoveError`]); each API names the failures in its own codes. Nothing here picks an
//! HTTP status.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use cap_fs_ext::DirExt;
use cap_std::fs::{Dir, File, Metadata, MetadataExt, OpenOptions, OpenOptionsExt};
use rustix::io::Errno;
use warren_protocol::files::FileKind;

use super::resolve::{Entry, Part, Root};

/// Most entries one search or listing returns.
pub const MAX_LISTED_ENTRIES: usize = 10_000;
/// Most directory entries one search or listing reads. A search may pass over many entries
/// that do not match; this bounds its work (one `lstat` per entry) and the names it holds,
/// whatever the tree (`/`, `/proc`) holds.
pub const MAX_READ_ENTRIES: usize = 100_000;
/// Most levels a search or listing descends below the directory it starts from; this also
/// bounds the recursion and the directories held open at once.
pub const MAX_WALK_DEPTH: usize = 64;

/// What a walk could not see; every entry it did see is in the answer anyway.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Gaps {
    /// A limit ([`MAX_LISTED_ENTRIES`], [`MAX_READ_ENTRIES`], [`MAX_WALK_DEPTH`]) left entries
    /// out.
    pub truncated: bool,
    /// Entries left out because they could not be read: an entry whose metadata failed, or a
    /// directory that could not be opened or listed (its contents are missing, it is counted
    /// once). Entries that vanished during the walk are not counted: they are gone.
    pub n_unreadable: u64,
}

/// Whether a walk's visitor wants more entries.
pub enum Visit {
    More,
    Enough,
}

/// [`Visit::Enough`] once an answer holds [`MAX_LISTED_ENTRIES`].
pub fn enough_when(n_entries: usize) -> Visit {
    if n_entries >= MAX_LISTED_ENTRIES {
        Visit::Enough
    } else {
        Visit::More
    }
}

/// One entry a walk came across.
pub struct Seen<'a> {
    /// The entry's path: the walk's starting path joined with the names below it.
    pub path: String,
    /// The directory holding it, to read a symlink's target through.
    pub dir: &'a Dir,
    pub name: &'a OsStr,
    /// The entry's own metadata (a symlink is described, not followed).
    pub meta: &'a Metadata,
}

/// Pre-order walk below `dir`: each entry (not following symlinks), then its descendants, in
/// lexical order, down to `depth` levels (at most [`MAX_WALK_DEPTH`]), reading at most
/// [`MAX_READ_ENTRIES`] entries, until `visit` has enough. Entry paths are `shown` joined with
/// the names below it (just the names when `shown` is empty).
///
/// Only `dir` itself must be listable; that failure is the caller's error. Below it, an entry
/// that fails for any reason (`EACCES` on `/proc/1/fdinfo`, an entry removed or swapped for a
/// symlink mid-walk, `ELOOP`, ...) is skipped and counted in [`Gaps`], so one bad entry never
/// costs the whole answer.
pub fn walk(
    dir: &Dir,
    shown: &str,
    depth: usize,
    visit: &mut dyn FnMut(Seen<'_>) -> Visit,
) -> io::Result<Gaps> {
    let mut walker = Walker {
        depth,
        n_reads_left: MAX_READ_ENTRIES,
        enough: false,
        gaps: Gaps::default(),
        visit,
    };
    let names = walker.read_names(dir)?;
    walker.level(dir, shown, 1, names);
    Ok(walker.gaps)
}

/// One walk in progress.
struct Walker<'v> {
    /// Levels asked for (1: the entries of the starting directory only).
    depth: usize,
    n_reads_left: usize,
    /// The visitor has enough: any further entry means the answer is truncated.
    enough: bool,
    gaps: Gaps,
    visit: &'v mut dyn FnMut(Seen<'_>) -> Visit,
}

impl Walker<'_> {
    /// The names in `dir`, sorted, drawn from the walk's read budget. Only opening the listing
    /// fails; an error part way through keeps the names read so far and counts the directory
    /// as unreadable.
    fn read_names(&mut self, dir: &Dir) -> io::Result<Vec<OsString>> {
        let mut names = Vec::new();
        for entry in dir.entries()? {
            let entry = match entry {
                Ok(entry) => entry,
                Err(err) => {
                    self.unreadable(&err);
                    break;
                }
            };
            if self.n_reads_left == 0 {
                self.gaps.truncated = true;
                break;
            }
            self.n_reads_left -= 1;
            names.push(entry.file_name());
        }
        names.sort();
        Ok(names)
    }

    fn unreadable(&mut self, err: &io::Error) {
        if err.kind() != io::ErrorKind::NotFound {
            self.gaps.n_unreadable += 1;
        }
    }

    /// Visits `names` (the entries of `dir`, at `level`) and what lies below them.
    fn level(&mut self, dir: &Dir, shown: &str, level: usize, names: Vec<OsString>) {
        for name in names {
            if self.enough {
                self.gaps.truncated = true;
                return;
            }
            let meta = match dir.symlink_metadata(&name) {
                Ok(meta) => meta,
                Err(err) => {
                    self.unreadable(&err);
                    continue;
                }
            };
            let child_shown = join_shown(shown, &name.to_string_lossy());
            let seen = Seen {
                path: child_shown.clone(),
                dir,
                name: &name,
                meta: &meta,
            };
            if let Visit::Enough = (self.visit)(seen) {
                self.enough = true;
            }
            if !meta.is_dir() || level >= self.depth {
                continue;
            }
            if level >= MAX_WALK_DEPTH {
                self.gaps.truncated = true;
                continue;
            }
            // Never through a symlink, even if the entry was swapped for one after the lstat.
            let listed = dir
                .open_dir_nofollow(&name)
                .and_then(|child| Ok((self.read_names(&child)?, child)));
            match listed {
                Ok((names, child)) => self.level(&child, &child_shown, level + 1, names),
                Err(err) => self.unreadable(&err),
            }
        }
    }
}

/// `base/name`; just `name` below the empty base (the root, in root-relative paths).
pub fn join_shown(base: &str, name: &str) -> String {
    if base.is_empty() {
        name.to_owned()
    } else if base.ends_with('/') {
        format!("{base}{name}")
    } else {
        format!("{base}/{name}")
    }
}

/// What an entry's own metadata (an lstat) describes.
pub fn file_kind(meta: &Metadata) -> FileKind {
    if meta.is_symlink() {
        FileKind::Symlink
    } else if meta.is_dir() {
        FileKind::Dir
    } else if meta.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    }
}

/// The target of the symlink `name` in `dir`, as stored.
pub fn link_target(dir: &Dir, name: &OsStr) -> io::Result<OsString> {
    // cap-std's `read_link` refuses absolute targets; the stored bytes are what is wanted.
    let target = rustix::fs::readlinkat(dir.as_fd(), name, Vec::new())?;
    Ok(OsString::from_vec(target.into_bytes()))
}

/// Most bytes of the destination's name a temporary file's name repeats: with the dot, the
/// `.warren-` and the uuid it stays within the 255 bytes every Linux filesystem allows, so a
/// file whose own name is that long can still be written.
const TEMP_NAME_STEM_BYTES: usize = 200;

/// What follows the stem in a temporary file's name, before the 32 hex digits of a uuid.
const TEMP_NAME_MARK: &[u8] = b".warren-";

/// A temporary file `.<name>.warren-<uuid>` beside the entry it will replace. It is removed
/// when dropped unless [`TempFile::persist`] renamed it over the entry: a write that fails, or
/// whose request is dropped midway (a client that hung up), leaves nothing behind.
pub struct TempFile {
    /// The directory holding it (a handle of its own, so the guard outlives any `Entry`).
    dir: Dir,
    name: OsString,
    persisted: bool,
}

impl TempFile {
    /// Creates the temporary file beside `entry`, exclusively, mode 0644, for writing.
    pub fn create_beside(entry: &Entry) -> io::Result<(Self, File)> {
        let stem = entry.name.as_bytes();
        let mut name = b".".to_vec();
        name.extend_from_slice(&stem[..stem.len().min(TEMP_NAME_STEM_BYTES)]);
        name.extend_from_slice(TEMP_NAME_MARK);
        name.extend_from_slice(uuid::Uuid::new_v4().simple().to_string().as_bytes());
        let name = OsString::from_vec(name);
        let mut options = OpenOptions::new();
        options.write(true).create_new(true).mode(0o644);
        let file = entry.dir.open_with(&name, &options)?;
        let guard = Self {
            dir: entry.dir.try_clone()?,
            name,
            persisted: false,
        };
        Ok((guard, file))
    }

    /// Renames the temporary file over `entry` (the entry it was created beside).
    pub fn persist(mut self, entry: &Entry) -> io::Result<()> {
        self.dir.rename(&self.name, &entry.dir, &entry.name)?;
        self.persisted = true;
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        // One unlink, even when this runs on an async thread (a request future dropped
        // midway): cheaper than handing it to the blocking pool, and it cannot be forgotten.
        if !self.persisted {
            let _ = self.dir.remove_file(&self.name);
        }
    }
}

/// Whether `name` is one of [`TempFile`]'s: `.<stem>.warren-<32 hex digits>`.
pub fn is_temp_name(name: &OsStr) -> bool {
    let name = name.as_bytes();
    let Some(rest) = name.strip_prefix(b".") else {
        return false;
    };
    let Some(stem_and_mark) = rest.len().checked_sub(32) else {
        return false;
    };
    let (stem_and_mark, uuid) = rest.split_at(stem_and_mark);
    stem_and_mark.ends_with(TEMP_NAME_MARK)
        && uuid
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
}

/// A move [`move_entry`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveRefusal {
    /// The source or the destination is the root itself.
    Root,
    /// A directory into itself or below itself.
    IntoItself,
    /// The destination exists and the move may not replace it.
    Exists,
    /// Source and destination are on different filesystems (a mount below the root).
    CrossDevice,
}

impl MoveRefusal {
    /// Why the move of `from` to `to` was refused, for the client.
    pub fn message(self, from: &str, to: &str) -> String {
        match self {
            MoveRefusal::Root => format!("cannot move {from} to {to}: one of them is the root"),
            MoveRefusal::IntoItself => format!("cannot move directory {from} into itself ({to})"),
            MoveRefusal::Exists => format!("destination {to} already exists"),
            MoveRefusal::CrossDevice => {
                format!("cannot move {from} to {to}: they are on different filesystems")
            }
        }
    }
}

/// Why [`move_entry`] did not move; each file API names these in its own codes.
#[derive(Debug)]
pub enum MoveError {
    Refused(MoveRefusal),
    /// Resolving or renaming the source failed (missing, a link out, ...).
    From(io::Error),
    /// Resolving the destination, creating its parents, or replacing it failed.
    To(io::Error),
}

impl From<MoveRefusal> for MoveError {
    fn from(refusal: MoveRefusal) -> Self {
        MoveError::Refused(refusal)
    }
}

/// Moves the entry `from` names (a final symlink is moved itself, not followed) to `to`,
/// creating `to`'s missing parents. Without `overwrite`, an existing `to` is refused by the
/// kernel (`renameat2(RENAME_NOREPLACE)`), so nothing created meanwhile is ever replaced. A
/// directory is never moved into itself: that is checked before any parent is created, so a
/// refused move leaves nothing behind (the kernel's `EINVAL` catches what a race slips by).
pub fn move_entry(
    root: &Root,
    from: &[Part],
    to: &[Part],
    overwrite: bool,
) -> Result<(), MoveError> {
    let source = root.locate(from).map_err(MoveError::From)?;
    let source_meta = source.lstat().map_err(MoveError::From)?;
    if source.is_root() {
        return Err(MoveRefusal::Root.into());
    }
    // A destination whose parents are missing cannot be the root.
    if root.locate(to).is_ok_and(|entry| entry.is_root()) {
        return Err(MoveRefusal::Root.into());
    }
    let parent = to.split_last().map_or(&[][..], |(_, parent)| parent);
    if source_meta.is_dir() {
        let nearest = root.deepest_existing_dir(parent).map_err(MoveError::To)?;
        let inside = root
            .is_inside(nearest, (source_meta.dev(), source_meta.ino()))
            .map_err(MoveError::To)?;
        if inside {
            return Err(MoveRefusal::IntoItself.into());
        }
    }
    root.create_dirs(parent).map_err(MoveError::To)?;
    let destination = root.locate(to).map_err(MoveError::To)?;
    if destination.is_root() {
        return Err(MoveRefusal::Root.into());
    }
    let flags = if overwrite {
        rustix::fs::RenameFlags::empty()
    } else {
        rustix::fs::RenameFlags::NOREPLACE
    };
    let renamed = rustix::fs::renameat_with(
        source.dir.as_fd(),
        &source.name,
        destination.dir.as_fd(),
        &destination.name,
        flags,
    );
    match renamed {
        Ok(()) => Ok(()),
        Err(Errno::EXIST) if !overwrite => Err(MoveRefusal::Exists.into()),
        Err(Errno::INVAL) => Err(MoveRefusal::IntoItself.into()),
        Err(Errno::XDEV) => Err(MoveRefusal::CrossDevice.into()),
        // What stands at the destination: a non-empty directory, a directory for a file, a
        // file for a directory.
        Err(errno @ (Errno::NOTEMPTY | Errno::EXIST | Errno::ISDIR | Errno::NOTDIR)) => {
            Err(MoveError::To(errno.into()))
        }
        Err(errno) => Err(MoveError::From(errno.into())),
    }
}

/// Whether `err` says a directory still has entries (`ENOTEMPTY`, or `EEXIST`, which POSIX
/// allows `rmdir` and `rename` to answer instead).
pub fn is_not_empty(err: &io::Error) -> bool {
    matches!(
        Errno::from_io_error(err),
        Some(Errno::NOTEMPTY | Errno::EXIST)
    )
}

/// A download of an open regular file of `size` bytes (taken from the same descriptor): 200
/// with all of it, or 206 with bytes `start..=end` of `part`, with `Content-Type:
/// application/octet-stream`, `Accept-Ranges: bytes`, `Content-Length` and, on a 206,
/// `Content-Range`. The body is streamed and ends after exactly that many bytes, even if the
/// file grows meanwhile.
pub async fn file_download(
    file: std::fs::File,
    size: u64,
    part: Option<(u64, u64)>,
) -> io::Result<(StatusCode, HeaderMap, Body)> {
    use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};
    let (status, start, len) = match part {
        None => (StatusCode::OK, 0, size),
        Some((start, end)) => (StatusCode::PARTIAL_CONTENT, start, end - start + 1),
    };
    let mut file = tokio::fs::File::from_std(file);
    if start > 0 {
        file.seek(io::SeekFrom::Start(start)).await?;
    }
    let body = Body::from_stream(tokio_util::io::ReaderStream::with_capacity(
        file.take(len),
        64 * 1024,
    ));
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    if let Some((start, end)) = part {
        let value = warren_http::range::content_range(start, end, size);
        headers.insert(
            header::CONTENT_RANGE,
            HeaderValue::from_str(&value).expect("digits and dashes are a valid header"),
        );
    }
    Ok((status, headers, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_names_are_recognised_and_nothing_else() {
        let table = [
            (".notes.txt.warren-0123456789abcdef0123456789abcdef", true),
            ("..warren-0123456789abcdef0123456789abcdef", true),
            (".warren-0123456789abcdef0123456789abcdef", false),
            (".notes.txt.warren-0123456789abcdef0123456789abcdeF", false),
            (".notes.txt.warren-0123456789abcdef0123456789abcde", false),
            ("notes.txt.warren-0123456789abcdef0123456789abcdef", false),
            (".notes.txt.warren0123456789abcdef0123456789abcdef", false),
            ("notes.txt", false),
            ("", false),
        ];
        for (name, expected) in table {
            assert_eq!(is_temp_name(OsStr::new(name)), expected, "{name}");
        }
    }

    #[test]
    fn shown_paths_join_below_the_empty_root() {
        let table = [("", "a"), ("sub", "sub/a"), ("/abs/", "/abs/a")];
        for (base, expected) in table {
            assert_eq!(join_shown(base, "a"), expected, "{base}");
        }
    }

    #[test]
    fn a_temp_file_is_removed_unless_persisted() {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = Root::new(dir.path()).expect("root");
        let entry = root
            .locate(&[Part::Name("target".into())])
            .expect("locates");
        let (dropped, _) = TempFile::create_beside(&entry).expect("creates");
        drop(dropped);
        assert_eq!(std::fs::read_dir(dir.path()).expect("lists").count(), 0);
        let (kept, file) = TempFile::create_beside(&entry).expect("creates");
        std::io::Write::write_all(&mut file.into_std(), b"x").expect("writes");
        kept.persist(&entry).expect("renames");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("lists")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["target"]);
        assert_eq!(
            std::fs::read(dir.path().join("target")).expect("reads"),
            b"x"
        );
    }
}
