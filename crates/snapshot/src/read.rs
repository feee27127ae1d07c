//! Reading a stored snapshot without unpacking it: [`list`] its entries, stream one file's bytes
//! with [`read_file`] (optionally a byte range). Both read the compressed stream sequentially
//! and hold no file content in memory; this is how an archived session's files are listed and
//! downloaded.

use std::io::{self, Read, Seek, Write};
use std::ops::Range;

use tar::EntryType;

use crate::SnapshotError;
use crate::path::normalize;

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    /// A hard link: the same content as the regular file at `link_target`.
    HardLink,
}

/// One entry of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchivedEntry {
    /// Relative to the workspace root, `/`-separated.
    pub path: String,
    pub kind: EntryKind,
    /// Content size of a regular file; 0 for the rest.
    pub size: u64,
    /// Permission bits (`0o7777`).
    pub mode: u32,
    /// Seconds since the epoch.
    pub mtime: i64,
    /// A symlink's target as stored, or a hard link's file (relative to the root).
    pub link_target: Option<String>,
}

/// Every entry of the snapshot on `input`, in archive order.
pub fn list(input: impl Read) -> Result<Vec<ArchivedEntry>, SnapshotError> {
    let mut entries = Vec::new();
    for_each_entry(input, |archived, _| {
        entries.push(archived);
        Ok(Visit::Next)
    })?;
    Ok(entries)
}

/// Streams the content of the regular file at `path` to `out` (a hard link resolves to its
/// file's content), only bytes `range` of it if given (clamped to the file), and returns the
/// file's total size. A hard link's content comes before it in the archive, so `input` is read
/// a second time from its start for one.
pub fn read_file<R: Read + Seek>(
    mut input: R,
    path: &str,
    range: Option<Range<u64>>,
    mut out: impl Write,
) -> Result<u64, SnapshotError> {
    let wanted = normalize(std::path::Path::new(path))
        .map_err(|_| SnapshotError::NotFound(path.to_owned()))?;
    let mut hard_link_target = None;
    let found = read_one(
        &mut input,
        &wanted,
        range.clone(),
        &mut out,
        &mut hard_link_target,
    )?;
    if let Some(size) = found {
        return Ok(size);
    }
    let Some(target) = hard_link_target else {
        return Err(SnapshotError::NotFound(path.to_owned()));
    };
    input.seek(io::SeekFrom::Start(0))?;
    let mut ignored = None;
    read_one(&mut input, &target, range, &mut out, &mut ignored)?
        .ok_or_else(|| SnapshotError::Corrupt(format!("hard link {path:?} to missing {target:?}")))
}

/// One pass: the size of `wanted` if its content was written, or `None` (with the target of a
/// hard link at `wanted` in `hard_link_target`).
fn read_one(
    input: &mut impl Read,
    wanted: &str,
    range: Option<Range<u64>>,
    out: &mut impl Write,
    hard_link_target: &mut Option<String>,
) -> Result<Option<u64>, SnapshotError> {
    let mut found = None;
    for_each_entry(input, |archived, entry| {
        if archived.path != wanted {
            return Ok(Visit::Next);
        }
        match archived.kind {
            EntryKind::File => {
                copy_range(entry, archived.size, range.clone(), out)?;
                found = Some(archived.size);
                Ok(Visit::Stop)
            }
            EntryKind::HardLink => {
                *hard_link_target = archived.link_target;
                Ok(Visit::Stop)
            }
            EntryKind::Dir | EntryKind::Symlink => Err(SnapshotError::NotAFile(archived.path)),
        }
    })?;
    Ok(found)
}

/// Writes bytes `range` (clamped to `size`) of `entry` to `out`.
fn copy_range(
    entry: &mut dyn Read,
    size: u64,
    range: Option<Range<u64>>,
    out: &mut impl Write,
) -> Result<(), SnapshotError> {
    let range = range.unwrap_or(0..size);
    let end = range.end.min(size);
    let start = range.start.min(end);
    let skipped =
        io::copy(&mut entry.take(start), &mut io::sink()).map_err(SnapshotError::corrupt)?;
    if skipped < start {
        return Err(SnapshotError::Corrupt(
            "entry shorter than its header".to_owned(),
        ));
    }
    let mut buf = vec![0u8; 64 * 1024];
    let mut limited = entry.take(end - start);
    loop {
        let n = match limited.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(SnapshotError::corrupt(error)),
        };
        out.write_all(&buf[..n])?;
    }
}

enum Visit {
    Next,
    Stop,
}

/// Calls `visit` with every entry of the stream (pax global headers left out) until it says
/// stop. Read to its end, the whole stream must decode (a cut after the last entry is corrupt
/// too). Unknown entry types are corrupt: `pack` never writes them.
fn for_each_entry(
    input: impl Read,
    mut visit: impl FnMut(ArchivedEntry, &mut dyn Read) -> Result<Visit, SnapshotError>,
) -> Result<(), SnapshotError> {
    let decoder = zstd::stream::Decoder::new(input).map_err(SnapshotError::corrupt)?;
    let mut archive = tar::Archive::new(decoder);
    for entry in archive.entries().map_err(SnapshotError::corrupt)? {
        let mut entry = entry.map_err(SnapshotError::corrupt)?;
        let header = entry.header();
        let kind = match header.entry_type() {
            EntryType::XGlobalHeader => continue,
            EntryType::Regular => EntryKind::File,
            EntryType::Directory => EntryKind::Dir,
            EntryType::Symlink => EntryKind::Symlink,
            EntryType::Link => EntryKind::HardLink,
            _ => {
                return Err(SnapshotError::Corrupt(
                    "entry of a type snapshots never hold".to_owned(),
                ));
            }
        };
        let size = match kind {
            EntryKind::File => header.size().map_err(SnapshotError::corrupt)?,
            _ => 0,
        };
        let mode = header.mode().map_err(SnapshotError::corrupt)? & 0o7777;
        let mtime = header.mtime().map_err(SnapshotError::corrupt)?;
        let path = normalize(&entry.path().map_err(SnapshotError::corrupt)?)?;
        let link_target = match kind {
            EntryKind::Symlink => entry
                .link_name()
                .map_err(SnapshotError::corrupt)?
                .map(|target| target.to_string_lossy().into_owned()),
            EntryKind::HardLink => match entry.link_name().map_err(SnapshotError::corrupt)? {
                Some(target) => Some(normalize(&target)?),
                None => None,
            },
            _ => None,
        };
        let archived = ArchivedEntry {
            path,
            kind,
            size,
            mode,
            mtime: i64::try_from(mtime).unwrap_or(i64::MAX),
            link_target,
        };
        if let Visit::Stop = visit(archived, &mut entry)? {
            return Ok(());
        }
    }
    let mut rest = archive.into_inner();
    io::copy(&mut rest, &mut io::sink()).map_err(SnapshotError::corrupt)?;
    Ok(())
}
