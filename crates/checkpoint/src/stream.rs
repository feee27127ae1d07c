//! Checkpoints of a tree on another machine, streamed by the process that can read it (a
//! sandbox's execd). [`produce`] walks the tree exactly as a local take does
//! (`crate::take::walk_tree`) and writes every entry, with content only for the files whose
//! stat the previous checkpoint's [`Known`] stamps cannot vouch for; `take_streamed`
//! ([`consume`]) reads that stream, cuts and stores the content with the same chunker as a
//! local take (so a file streamed and the same file walked share their chunks) and stores the
//! manifest. The producer needs no store; the consumer never sees the tree.
//!
//! # The stream (`application/vnd.warren.checkpoint-changes`)
//!
//! Frames: a tag byte, the payload's length (u32, big-endian), the payload. Every payload but
//! content is a JSON object.
//!
//! | tag | payload | meaning |
//! |-----|---------|---------|
//! | `H` | `{"v":1,"started_ns":N}` | first, once: the producer's clock when its walk began |
//! | `d` | entry | a directory |
//! | `l` | entry with `"target"` | a symlink (never followed) |
//! | `u` | entry | a regular file whose stamp equals its `Known` stamp: no content follows |
//! | `f` | entry | a regular file: its content follows |
//! | `c` | raw bytes | the next bytes of the file of the last `f` |
//! | `r` | stamp | that file changed while read: the content so far is dropped and it is read again from here (once per file at most) |
//! | `x` | empty | that file could not be read: it is dropped (and counted in `skipped`) |
//! | `E` | `{"skipped":N,"changed_under":[path…]}` | last, once: nothing follows it |
//!
//! An entry is `{"path","mode","size","mtime_ns","ino","dev"}` (and `"target"` for a link) with
//! a manifest entry's meaning: a directory's size is 0, a link's the length of its target, a
//! file's as its stat said. A stamp is an entry without `path` and `target`. Entries come in
//! walk order (a directory's names right after it), not path order; the consumer sorts them.
//! A file's content is the `c` frames after its `f` or `r`, up to the next other frame: its
//! declared size only sizes a buffer, and the entry keeps the bytes that came, with the stamp
//! of the `f` or `r` they follow. A file whose stat moved while read is read once more; when
//! it moved again it keeps what that read saw and is named in `changed_under` (as a local take
//! does).
//!
//! The consumer takes the stream as hostile: every path is checked as a manifest's is (and the
//! whole list with `Manifest::check`), a frame longer than its kind allows (content 1 MiB,
//! metadata 64 KiB, `E` 64 MiB) or more than five million entries is refused before anything is
//! allocated for it, a `u` must name a file `previous` trusts with exactly that stamp, and a
//! stream that ends before its `E` record (or has bytes after it) is truncated: each is
//! [`Error::Corrupt`] or [`Error::Unsafe`], and nothing the take stored becomes visible. A
//! reader that fails (the connection broke) is [`Error::Io`]. What the stream cannot be
//! checked for is whether it tells the truth about the tree: a sandbox can only misdescribe
//! its own checkpoint. Nor is the total of its content bounded here, as a local tree's is
//! not: a caller that wants a bound reads `changes` through a `Read` that stops at it.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::ops::ControlFlow;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::Error;
use crate::backend::ChunkBatch;
use crate::chunk::{CutError, Packer};
use crate::chunks::{Chunks, Seen};
use crate::manifest::{Content, Entry, Manifest};
use crate::path;
use crate::take::{self, Found, Naming, Stamp, TakeStats, Taken, now_ns};

/// The content type of a changes stream.
pub const CHANGES_CONTENT_TYPE: &str = "application/vnd.warren.checkpoint-changes";

/// The stream's format version, in its header.
const VERSION: u32 = 1;

const HEADER: u8 = b'H';
const DIR: u8 = b'd';
const SYMLINK: u8 = b'l';
const UNCHANGED: u8 = b'u';
const FILE: u8 = b'f';
const CONTENT: u8 = b'c';
const REREAD: u8 = b'r';
const UNREADABLE: u8 = b'x';
const END: u8 = b'E';

/// File bytes the producer puts in one `c` frame.
const CONTENT_FRAME_BYTES: usize = 64 * 1024;
/// The longest `c` frame the consumer accepts.
const MAX_CONTENT_FRAME: u32 = 1024 * 1024;
/// The longest metadata frame: a path and a link target of 4095 bytes each, even with every
/// byte escaped by JSON, fit.
const MAX_METADATA_FRAME: u32 = 64 * 1024;
/// The longest `E` frame (its `changed_under` list).
const MAX_END_FRAME: u32 = 64 * 1024 * 1024;
/// The longest link target the producer sends (the kernel's own limit); a longer one is
/// skipped.
const MAX_TARGET: usize = 4095;
/// The most entries the consumer accepts (what a manifest's entry list holds at most).
const MAX_ENTRIES: usize = 5_000_000;

/// What the previous checkpoint says of the files it trusts (`Manifest::trusts`): each one's
/// stamp by path. A file whose stat still equals its stamp is sent without content. The JSON
/// body of `POST /v1/workspace/changes`:
/// `{"files":{"src/main.rs":{"size":13,"mtime_ns":1700000000123456789,"ino":42,"dev":7}}}`.
/// `Known::default()` knows nothing: every file is sent (a first checkpoint).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Known {
    /// Path (relative to the tree's root, `/`-separated) → stamp.
    #[serde(default)]
    pub files: BTreeMap<String, KnownFile>,
}

/// A trusted file's stat as the previous checkpoint recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KnownFile {
    pub size: u64,
    pub mtime_ns: i64,
    pub ino: u64,
    pub dev: u64,
}

impl Known {
    /// The number of files known.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// True when the file at `path` with `stamp` is one the previous checkpoint trusts,
    /// unchanged.
    fn vouches(&self, path: &str, stamp: &Stamp) -> bool {
        self.files.get(path).is_some_and(|known| {
            known.size == stamp.size
                && known.mtime_ns == stamp.mtime_ns
                && known.ino == stamp.ino
                && known.dev == stamp.dev
        })
    }
}

impl Manifest {
    /// The files of this checkpoint the quick check may trust next time, for [`produce`].
    pub fn known(&self) -> Known {
        let files = self
            .entries
            .iter()
            .filter(|entry| matches!(entry.content, Content::File(_)) && self.trusts(entry))
            .map(|entry| {
                let stamp = KnownFile {
                    size: entry.size,
                    mtime_ns: entry.mtime_ns,
                    ino: entry.ino,
                    dev: entry.dev,
                };
                (entry.path.clone(), stamp)
            })
            .collect();
        Known { files }
    }
}

/// What [`produce`] walked and sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProduceStats {
    /// Entries sent: directories, links and files (unchanged or with content).
    pub entries: u64,
    /// Files sent with their content.
    pub files_read: u64,
    /// Files sent as unchanged, without content.
    pub files_unchanged: u64,
    /// File bytes read and sent (a file read twice counts twice).
    pub bytes_read: u64,
    /// Entries skipped: FIFOs, sockets, devices, names that are not UTF-8, unreadable ones.
    pub skipped: u64,
    /// Paths that changed while read, or vanished between the listing and the read (sorted).
    pub changed_under: Vec<String>,
    pub elapsed: Duration,
}

/// The `H` record.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    v: u32,
    started_ns: i64,
}

/// The `d`, `l`, `u` and `f` records.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryRecord {
    path: String,
    mode: u32,
    size: u64,
    mtime_ns: i64,
    ino: u64,
    dev: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target: Option<String>,
}

/// The `r` record: the stat from before the read that follows.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StampRecord {
    mode: u32,
    size: u64,
    mtime_ns: i64,
    ino: u64,
    dev: u64,
}

/// The `E` record.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct End {
    skipped: u64,
    changed_under: Vec<String>,
}

impl EntryRecord {
    fn of(path: String, stamp: &Stamp, size: u64, target: Option<String>) -> EntryRecord {
        EntryRecord {
            path,
            mode: stamp.mode,
            size,
            mtime_ns: stamp.mtime_ns,
            ino: stamp.ino,
            dev: stamp.dev,
            target,
        }
    }

    fn stamp(&self) -> StampRecord {
        StampRecord {
            mode: self.mode,
            size: self.size,
            mtime_ns: self.mtime_ns,
            ino: self.ino,
            dev: self.dev,
        }
    }
}

impl StampRecord {
    fn of(stamp: &Stamp) -> StampRecord {
        StampRecord {
            mode: stamp.mode,
            size: stamp.size,
            mtime_ns: stamp.mtime_ns,
            ino: stamp.ino,
            dev: stamp.dev,
        }
    }

    fn entry(&self, path: String, content: Content, size: u64) -> Entry {
        Entry {
            path,
            content,
            mode: self.mode,
            size,
            mtime_ns: self.mtime_ns,
            ino: self.ino,
            dev: self.dev,
        }
    }
}

/// Walks the tree beneath `root` and writes the stream of its changes since the checkpoint
/// `known` comes from (see the module's docs) to `out`. File content goes out in frames as it
/// is read, so memory stays bounded whatever the files' sizes. Fails when `root` cannot be
/// listed or `out` cannot be written; the stream is then unfinished (no `E` record), which its
/// consumer refuses.
pub fn produce(root: &Path, known: &Known, out: &mut dyn Write) -> Result<ProduceStats, Error> {
    let started = Instant::now();
    let started_ns = now_ns();
    let root_fd = take::open_root(root)?;
    let mut producer = Producer {
        out,
        buffer: vec![0; CONTENT_FRAME_BYTES],
        stats: ProduceStats::default(),
    };
    producer.record(
        HEADER,
        &Header {
            v: VERSION,
            started_ns,
        },
    )?;
    let mut failure = None;
    let quick_check = |path: &str, stamp: &Stamp| known.vouches(path, stamp).then_some(());
    take::walk_tree(root_fd, quick_check, |found| match producer.send(found) {
        Ok(()) => ControlFlow::Continue(()),
        Err(error) => {
            failure = Some(error);
            ControlFlow::Break(())
        }
    })?;
    if let Some(error) = failure {
        return Err(error);
    }
    let mut stats = producer.stats;
    stats.changed_under.sort_unstable();
    let end = End {
        skipped: stats.skipped,
        changed_under: stats.changed_under,
    };
    let payload = encode(&end)?;
    if payload.len() > MAX_END_FRAME as usize {
        return Err(Error::Invalid(format!(
            "{} paths changed while read: more than a changes stream carries",
            end.changed_under.len()
        )));
    }
    write_frame(producer.out, END, &payload)?;
    producer
        .out
        .flush()
        .map_err(|e| Error::io("cannot write the changes stream", e))?;
    stats.changed_under = end.changed_under;
    stats.elapsed = started.elapsed();
    Ok(stats)
}

/// The producer's side: where the stream goes, a buffer for content and what it counted.
struct Producer<'a> {
    out: &'a mut dyn Write,
    buffer: Vec<u8>,
    stats: ProduceStats,
}

/// What became of a file [`Producer::content`] read.
enum Sent {
    Read {
        changed_under: bool,
    },
    /// Reading failed part way (an I/O error of the tree): the consumer drops it.
    Unreadable,
}

impl Producer<'_> {
    fn record(&mut self, tag: u8, record: &impl Serialize) -> Result<(), Error> {
        write_frame(self.out, tag, &encode(record)?)
    }

    /// Sends what the walk found.
    fn send(&mut self, found: Found<()>) -> Result<(), Error> {
        match found {
            Found::Dir { path, stamp } => {
                self.record(DIR, &EntryRecord::of(path, &stamp, 0, None))?;
            }
            Found::Symlink { target, .. } if target.len() > MAX_TARGET => {
                self.stats.skipped += 1;
                return Ok(());
            }
            Found::Symlink {
                path,
                stamp,
                target,
            } => {
                let size = target.len() as u64;
                self.record(SYMLINK, &EntryRecord::of(path, &stamp, size, Some(target)))?;
            }
            Found::Unchanged { path, stamp, .. } => {
                self.record(UNCHANGED, &EntryRecord::of(path, &stamp, stamp.size, None))?;
                self.stats.files_unchanged += 1;
            }
            Found::Opened {
                path,
                stamp,
                mut file,
            } => {
                self.record(
                    FILE,
                    &EntryRecord::of(path.clone(), &stamp, stamp.size, None),
                )?;
                match self.content(&mut file, stamp)? {
                    Sent::Read { changed_under } => {
                        self.stats.files_read += 1;
                        if changed_under {
                            self.stats.changed_under.push(path);
                        }
                    }
                    Sent::Unreadable => {
                        write_frame(self.out, UNREADABLE, &[])?;
                        self.stats.skipped += 1;
                        return Ok(());
                    }
                }
            }
            Found::Skipped => {
                self.stats.skipped += 1;
                return Ok(());
            }
            Found::Vanished(path) => {
                self.stats.changed_under.push(path);
                return Ok(());
            }
        }
        self.stats.entries += 1;
        Ok(())
    }

    /// Sends `file`'s content: at most two reads, the second (after an `r` record) when its
    /// stat moved during the first, as `crate::take` reads a file.
    fn content(&mut self, file: &mut File, mut before: Stamp) -> Result<Sent, Error> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            if file.seek(SeekFrom::Start(0)).is_err() {
                return Ok(Sent::Unreadable);
            }
            let mut size = 0u64;
            loop {
                match file.read(&mut self.buffer) {
                    Ok(0) => break,
                    Ok(n) => {
                        write_frame(self.out, CONTENT, &self.buffer[..n])?;
                        size += n as u64;
                        self.stats.bytes_read += n as u64;
                    }
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return Ok(Sent::Unreadable),
                }
            }
            let Ok(after) = Stamp::of_file(file) else {
                return Ok(Sent::Unreadable);
            };
            let steady = after == before && after.size == size;
            if steady || attempt == 2 {
                return Ok(Sent::Read {
                    changed_under: !steady,
                });
            }
            self.record(REREAD, &StampRecord::of(&after))?;
            before = after;
        }
    }
}

fn encode(record: &impl Serialize) -> Result<Vec<u8>, Error> {
    serde_json::to_vec(record)
        .map_err(|e| Error::Invalid(format!("cannot encode a changes record: {e}")))
}

fn write_frame(out: &mut dyn Write, tag: u8, payload: &[u8]) -> Result<(), Error> {
    let len = u32::try_from(payload.len())
        .map_err(|_| Error::Invalid(format!("a changes frame of {} bytes", payload.len())))?;
    let mut header = [0u8; 5];
    header[0] = tag;
    header[1..].copy_from_slice(&len.to_be_bytes());
    out.write_all(&header)
        .and_then(|()| out.write_all(payload))
        .map_err(|e| Error::io("cannot write the changes stream", e))
}

/// Takes and stores checkpoint `naming.id` from the stream `changes` (see the module's docs).
pub(crate) fn consume(
    chunks: &Chunks,
    changes: &mut dyn Read,
    previous: Option<&Manifest>,
    naming: Naming,
) -> Result<(Manifest, TakeStats), Error> {
    let started = Instant::now();
    let mut incoming = Incoming {
        reader: changes,
        pending: None,
        content_left: 0,
        fault: None,
    };
    let (tag, len) = incoming.header()?;
    if tag != HEADER {
        return Err(Error::Corrupt(format!(
            "the changes stream starts with a {} frame, not its header",
            tag_name(tag)
        )));
    }
    let header: Header = incoming.record(tag, len)?;
    if header.v != VERSION {
        return Err(Error::Corrupt(format!(
            "a changes stream of version {}, not {VERSION}",
            header.v
        )));
    }
    let batch = chunks.backend.batch()?;
    let seen = Seen::with(previous.into_iter().flat_map(Manifest::chunk_ids));
    let mut receiver = Receiver {
        chunks,
        batch: &*batch,
        seen: &seen,
        packer: Packer::new()?,
        window: Vec::new(),
        stats: TakeStats::default(),
    };
    let mut entries: Vec<Entry> = Vec::new();
    let end: End = loop {
        let (tag, len) = incoming.header()?;
        if tag == END {
            break incoming.record(tag, len)?;
        }
        if entries.len() >= MAX_ENTRIES {
            return Err(Error::Corrupt(format!(
                "a changes stream of more than {MAX_ENTRIES} entries"
            )));
        }
        let entry = match tag {
            DIR => {
                let record: EntryRecord = incoming.record(tag, len)?;
                let path = checked_path(record.path)?;
                if record.size != 0 || record.target.is_some() {
                    return Err(Error::Corrupt(format!(
                        "directory {path:?} with a size or a target"
                    )));
                }
                Some(Entry {
                    path,
                    content: Content::Dir,
                    mode: record.mode,
                    size: 0,
                    mtime_ns: record.mtime_ns,
                    ino: record.ino,
                    dev: record.dev,
                })
            }
            SYMLINK => {
                let record: EntryRecord = incoming.record(tag, len)?;
                let path = checked_path(record.path)?;
                let Some(target) = record.target else {
                    return Err(Error::Corrupt(format!("symlink {path:?} without a target")));
                };
                if record.size != target.len() as u64 {
                    return Err(Error::Corrupt(format!(
                        "symlink {path:?} of size {} with a target of {} bytes",
                        record.size,
                        target.len()
                    )));
                }
                Some(Entry {
                    path,
                    size: record.size,
                    content: Content::Symlink(target),
                    mode: record.mode,
                    mtime_ns: record.mtime_ns,
                    ino: record.ino,
                    dev: record.dev,
                })
            }
            UNCHANGED => {
                let record: EntryRecord = incoming.record(tag, len)?;
                Some(unchanged(record, previous)?)
            }
            FILE => {
                let record: EntryRecord = incoming.record(tag, len)?;
                receiver.file(&mut incoming, record)?
            }
            other => {
                return Err(Error::Corrupt(format!(
                    "a {} frame where an entry belongs",
                    tag_name(other)
                )));
            }
        };
        entries.extend(entry);
    };
    incoming.expect_end()?;
    for path in &end.changed_under {
        if let Some(reason) = path::refusal(path) {
            return Err(Error::Unsafe {
                path: path.clone(),
                reason,
            });
        }
    }
    entries.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    Manifest::check(&entries)?;
    let mut changed_under = end.changed_under;
    changed_under.sort_unstable();
    let mut stats = receiver.stats;
    let taken = Taken {
        entries,
        skipped: end.skipped,
        changed_under,
        started_ns: header.started_ns,
    };
    let manifest =
        take::store_checkpoint(chunks, batch, &seen, previous, naming, taken, &mut stats)?;
    stats.elapsed = started.elapsed();
    Ok((manifest, stats))
}

/// `path` when a manifest may hold it.
fn checked_path(path: String) -> Result<String, Error> {
    match path::refusal(&path) {
        Some(reason) => Err(Error::Unsafe { path, reason }),
        None => Ok(path),
    }
}

/// The entry of a file the stream says is unchanged: `previous`'s, which must be a file it
/// trusts with exactly the stamp the stream gives, with the stream's mode.
fn unchanged(record: EntryRecord, previous: Option<&Manifest>) -> Result<Entry, Error> {
    let path = checked_path(record.path)?;
    let vouched = previous.and_then(|previous| {
        let entry = previous.entry(&path)?;
        let same = matches!(entry.content, Content::File(_))
            && record.target.is_none()
            && entry.size == record.size
            && entry.mtime_ns == record.mtime_ns
            && entry.ino == record.ino
            && entry.dev == record.dev
            && previous.trusts(entry);
        same.then_some(entry)
    });
    let Some(entry) = vouched else {
        return Err(Error::Corrupt(format!(
            "{path:?} is sent as unchanged, but the previous checkpoint holds no trusted file \
             with its stamp"
        )));
    };
    Ok(Entry {
        path,
        content: entry.content.clone(),
        mode: record.mode,
        size: record.size,
        mtime_ns: record.mtime_ns,
        ino: record.ino,
        dev: record.dev,
    })
}

/// The consumer's side of the store: where chunks go and what it counted.
struct Receiver<'a> {
    chunks: &'a Chunks,
    batch: &'a dyn ChunkBatch,
    seen: &'a Seen,
    packer: Packer,
    window: Vec<u8>,
    stats: TakeStats,
}

impl Receiver<'_> {
    /// Cuts and stores the content after the `f` record `record`; `None` when the producer
    /// could not read the file.
    fn file(
        &mut self,
        incoming: &mut Incoming<'_>,
        record: EntryRecord,
    ) -> Result<Option<Entry>, Error> {
        let mut stamp = record.stamp();
        let path = checked_path(record.path)?;
        if record.target.is_some() {
            return Err(Error::Corrupt(format!("file {path:?} with a target")));
        }
        let mut reread = false;
        loop {
            let put = self.chunks.put_stream(
                self.batch,
                self.seen,
                &mut self.packer,
                &mut self.window,
                &mut FileContent(incoming),
                stamp.size,
            );
            let (chunks, size) = match put {
                Ok(put) => {
                    self.stats.bytes_new += put.bytes_new;
                    (put.chunks, put.size)
                }
                Err(CutError::Store(error)) => return Err(error),
                Err(CutError::Read(error)) => {
                    return Err(incoming
                        .fault
                        .take()
                        .unwrap_or_else(|| Error::io("cannot read the changes stream", error)));
                }
            };
            self.stats.bytes_read += size;
            let (tag, len) = incoming.header()?;
            match tag {
                REREAD if !reread => {
                    stamp = incoming.record(tag, len)?;
                    reread = true;
                }
                REREAD => {
                    return Err(Error::Corrupt(format!("{path:?} is sent a third time")));
                }
                UNREADABLE if len == 0 => return Ok(None),
                UNREADABLE => {
                    return Err(Error::Corrupt(format!(
                        "an unreadable mark of {len} bytes for {path:?}"
                    )));
                }
                _ => {
                    incoming.pending = Some((tag, len));
                    return Ok(Some(stamp.entry(path, Content::File(chunks), size)));
                }
            }
        }
    }
}

/// The stream as the consumer reads it: frame headers, payloads within their limits, and a
/// file's content through [`FileContent`].
struct Incoming<'a> {
    reader: &'a mut dyn Read,
    /// A header that ended a file's content: the next frame's.
    pending: Option<(u8, u32)>,
    /// Bytes of the current `c` frame not read yet.
    content_left: u32,
    /// Why [`FileContent`] failed, when the stream was at fault rather than the reader.
    fault: Option<Error>,
}

fn truncated() -> Error {
    Error::Corrupt("the changes stream ends before its end record: truncated".to_owned())
}

fn tag_name(tag: u8) -> String {
    if tag.is_ascii_graphic() {
        format!("{:?}", char::from(tag))
    } else {
        format!("0x{tag:02x}")
    }
}

fn read_error(error: io::Error) -> Error {
    Error::io("cannot read the changes stream", error)
}

impl Incoming<'_> {
    /// The next frame's tag and length; `None` when the stream ends cleanly here.
    fn next_header(&mut self) -> Result<Option<(u8, u32)>, Error> {
        if let Some(header) = self.pending.take() {
            return Ok(Some(header));
        }
        let mut header = [0u8; 5];
        let mut filled = 0;
        while filled < header.len() {
            match self.reader.read(&mut header[filled..]) {
                Ok(0) if filled == 0 => return Ok(None),
                Ok(0) => return Err(truncated()),
                Ok(n) => filled += n,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(read_error(error)),
            }
        }
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
        Ok(Some((header[0], len)))
    }

    /// The next frame's tag and length; the stream must go on.
    fn header(&mut self) -> Result<(u8, u32), Error> {
        self.next_header()?.ok_or_else(truncated)
    }

    /// The JSON payload of the frame whose header was just read.
    fn record<T: DeserializeOwned>(&mut self, tag: u8, len: u32) -> Result<T, Error> {
        let max = if tag == END {
            MAX_END_FRAME
        } else {
            MAX_METADATA_FRAME
        };
        if len > max {
            return Err(Error::Corrupt(format!(
                "a {} frame of {len} bytes, more than {max}",
                tag_name(tag)
            )));
        }
        let mut payload = Vec::new();
        (&mut *self.reader)
            .take(u64::from(len))
            .read_to_end(&mut payload)
            .map_err(read_error)?;
        if payload.len() != len as usize {
            return Err(truncated());
        }
        serde_json::from_slice(&payload)
            .map_err(|e| Error::Corrupt(format!("a {} frame: {e}", tag_name(tag))))
    }

    /// Refuses anything after the end record.
    fn expect_end(&mut self) -> Result<(), Error> {
        let mut byte = [0u8; 1];
        loop {
            match self.reader.read(&mut byte) {
                Ok(0) => return Ok(()),
                Ok(_) => {
                    return Err(Error::Corrupt(
                        "bytes after the changes stream's end record".to_owned(),
                    ));
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(read_error(error)),
            }
        }
    }

    /// Keeps `error` for the caller of [`FileContent`] and gives `Read` an error to return.
    fn fail(&mut self, error: Error) -> io::Error {
        let message = error.to_string();
        self.fault = Some(error);
        io::Error::other(message)
    }
}

/// A file's content: the `c` frames up to the next other frame, whose header is left in
/// `pending` (then this reads as the end of the file).
struct FileContent<'i, 'a>(&'i mut Incoming<'a>);

impl Read for FileContent<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let incoming = &mut *self.0;
        if buf.is_empty() {
            return Ok(0);
        }
        while incoming.content_left == 0 {
            if incoming.pending.is_some() {
                return Ok(0);
            }
            match incoming.next_header() {
                Ok(Some((CONTENT, len))) if len <= MAX_CONTENT_FRAME => {
                    incoming.content_left = len;
                }
                Ok(Some((CONTENT, len))) => {
                    return Err(incoming.fail(Error::Corrupt(format!(
                        "a content frame of {len} bytes, more than {MAX_CONTENT_FRAME}"
                    ))));
                }
                Ok(Some(header)) => {
                    incoming.pending = Some(header);
                    return Ok(0);
                }
                Ok(None) => return Err(incoming.fail(truncated())),
                Err(error) => return Err(incoming.fail(error)),
            }
        }
        let wanted = buf.len().min(incoming.content_left as usize);
        loop {
            match incoming.reader.read(&mut buf[..wanted]) {
                Ok(0) => return Err(incoming.fail(truncated())),
                Ok(n) => {
                    // `n <= wanted <= content_left`, a u32.
                    incoming.content_left -= n as u32;
                    return Ok(n);
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(incoming.fail(read_error(error))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{CheckpointStore, Config, LocalDisk};

    fn store(dir: &Path) -> CheckpointStore {
        let disk = LocalDisk::open(dir).expect("opens the store");
        CheckpointStore::new(Arc::new(disk), Config::default())
    }

    fn frame(stream: &mut Vec<u8>, tag: u8, payload: &[u8]) {
        write_frame(stream, tag, payload).expect("writes to a Vec");
    }

    fn json(stream: &mut Vec<u8>, tag: u8, value: serde_json::Value) {
        frame(stream, tag, &serde_json::to_vec(&value).expect("encodes"));
    }

    fn stamp_json(size: u64, ino: u64) -> serde_json::Value {
        serde_json::json!({"mode": 0o644, "size": size, "mtime_ns": 5, "ino": ino, "dev": 1})
    }

    fn file_json(path: &str, size: u64) -> serde_json::Value {
        serde_json::json!({"path": path, "mode": 0o600, "size": size, "mtime_ns": 5, "ino": 9, "dev": 1})
    }

    fn start() -> Vec<u8> {
        let mut stream = Vec::new();
        json(
            &mut stream,
            HEADER,
            serde_json::json!({"v": 1, "started_ns": 100}),
        );
        stream
    }

    fn end(stream: &mut Vec<u8>, skipped: u64, changed_under: &[&str]) {
        json(
            stream,
            END,
            serde_json::json!({"skipped": skipped, "changed_under": changed_under}),
        );
    }

    fn take(store: &CheckpointStore, stream: &[u8]) -> Result<(Manifest, TakeStats), Error> {
        store.take_streamed(&mut &stream[..], None, serde_json::Value::Null)
    }

    #[test]
    fn a_reread_file_keeps_the_second_read_and_its_stamp() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = store(dir.path());
        let mut stream = start();
        json(&mut stream, FILE, file_json("log", 3));
        frame(&mut stream, CONTENT, b"abc");
        json(&mut stream, REREAD, stamp_json(5, 10));
        frame(&mut stream, CONTENT, b"abc");
        frame(&mut stream, CONTENT, b"defg");
        end(&mut stream, 0, &["log"]);
        let (manifest, stats) = take(&store, &stream).expect("takes");
        let entry = manifest.entry("log").expect("kept");
        assert_eq!((entry.size, entry.ino, entry.mode), (7, 10, 0o644));
        assert_eq!(stats.bytes_read, 10, "both reads");
        assert_eq!(manifest.changed_under, ["log"]);
        assert_eq!(manifest.started_ns, 100, "the producer's clock");
        let mut content = Vec::new();
        store
            .read_file(&manifest, "log", 0..7, &mut content)
            .expect("reads");
        assert_eq!(content, b"abcdefg");
    }

    #[test]
    fn an_unreadable_file_is_dropped_and_a_third_read_is_corrupt() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = store(dir.path());
        let mut stream = start();
        json(&mut stream, FILE, file_json("gone", 3));
        frame(&mut stream, CONTENT, b"ab");
        frame(&mut stream, UNREADABLE, b"");
        json(&mut stream, FILE, file_json("kept", 1));
        frame(&mut stream, CONTENT, b"k");
        end(&mut stream, 1, &[]);
        let (manifest, stats) = take(&store, &stream).expect("takes");
        let paths: Vec<&str> = manifest.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["kept"]);
        assert_eq!(stats.skipped, 1);

        let mut stream = start();
        json(&mut stream, FILE, file_json("f", 0));
        json(&mut stream, REREAD, stamp_json(0, 1));
        json(&mut stream, REREAD, stamp_json(0, 2));
        end(&mut stream, 0, &[]);
        assert!(matches!(take(&store, &stream), Err(Error::Corrupt(_))));
    }

    #[test]
    fn known_holds_only_the_files_the_checkpoint_trusts() {
        let entry = |path: &str, content: Content, mtime_ns: i64| Entry {
            path: path.to_owned(),
            content,
            mode: 0o644,
            size: 0,
            mtime_ns,
            ino: 3,
            dev: 4,
        };
        let manifest = Manifest {
            id: String::new(),
            created_at_ms: 0,
            entries: vec![
                entry("d", Content::Dir, 1),
                entry("new", Content::File(Vec::new()), 9_000_000_000),
                entry("old", Content::File(Vec::new()), 1),
                entry("l", Content::Symlink("old".to_owned()), 1),
            ],
            skipped: 0,
            changed_under: Vec::new(),
            label: serde_json::Value::Null,
            summary: Default::default(),
            started_ns: 10_000_000_000,
            stream: Vec::new(),
        };
        let known = manifest.known();
        let expected = KnownFile {
            size: 0,
            mtime_ns: 1,
            ino: 3,
            dev: 4,
        };
        assert_eq!(
            known.files.into_iter().collect::<Vec<_>>(),
            [("old".to_owned(), expected)]
        );
        let json = serde_json::to_value(manifest.known()).expect("encodes");
        assert_eq!(
            json,
            serde_json::json!({"files": {"old": {"size": 0, "mtime_ns": 1, "ino": 3, "dev": 4}}})
        );
        assert_eq!(
            serde_json::from_str::<Known>("{}").expect("decodes"),
            Known::default()
        );
    }

    /// Every truncation of a stream is refused, and no flipped byte panics or is taken for
    /// more than it says (a property test over every position of a small stream).
    #[test]
    fn every_cut_is_refused_and_no_flipped_byte_panics() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = store(dir.path());
        let mut stream = start();
        json(
            &mut stream,
            DIR,
            serde_json::json!({"path": "d", "mode": 0o755, "size": 0, "mtime_ns": 1, "ino": 1, "dev": 1}),
        );
        json(
            &mut stream,
            SYMLINK,
            serde_json::json!({"path": "d/l", "mode": 0o777, "size": 1, "mtime_ns": 1, "ino": 2, "dev": 1, "target": "x"}),
        );
        json(&mut stream, FILE, file_json("d/f", 4));
        frame(&mut stream, CONTENT, b"da");
        frame(&mut stream, CONTENT, b"ta");
        json(&mut stream, REREAD, stamp_json(4, 3));
        frame(&mut stream, CONTENT, b"data");
        end(&mut stream, 2, &["d/f"]);
        take(&store, &stream).expect("the whole stream is taken");
        for cut in 0..stream.len() {
            match take(&store, &stream[..cut]) {
                Err(Error::Corrupt(_)) => {}
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
        for position in 0..stream.len() {
            for flip in [0x01, 0x80, 0xff] {
                let mut mutated = stream.clone();
                mutated[position] ^= flip;
                if let Ok((manifest, _)) = take(&store, &mutated) {
                    Manifest::check(&manifest.entries).expect("whatever is taken is checked");
                }
            }
        }
    }
}
