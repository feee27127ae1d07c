//! [`Manifest`]: what one checkpoint holds, and its stored form.
//!
//! A manifest is stored in two parts. Its entries, one JSON line each in path order, form a
//! byte stream that is cut and stored like file content: consecutive checkpoints of a large
//! tree differ in a few lines, so they share all but a chunk or two of it, and 100 checkpoints
//! of a 20,000-file workspace cost little more than one. The root, `manifests/<id>`, is a
//! small zstd-compressed JSON object: the checkpoint's id, times and counts, and the chunk list
//! of that stream.
//!
//! Decoding treats the bytes as hostile ([`Manifest::check`]): every path canonical
//! (`crate::path`), entries strictly sorted (so no duplicates), every parent an earlier
//! directory entry (so no path runs through a link or a file), every file's size the sum of
//! its chunks, every chunk within the chunker's bounds.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::Error;
use crate::chunk::{ChunkId, ChunkRef, MAX_CHUNK};
use crate::path;

/// The root's format version.
const VERSION: u32 = 1;
/// The largest root this crate decompresses.
const MAX_ROOT_BYTES: usize = 64 * 1024 * 1024;
/// The largest entry stream this crate loads (about five million entries).
const MAX_STREAM_BYTES: u64 = 1 << 30;
/// How long before a checkpoint began an entry's mtime must be for the quick check to trust
/// it next time: a file changed again within the file system's timestamp granularity after it
/// was read keeps its mtime, so one written just before the walk is read again (2 s covers
/// coarse kernel clocks and the coarsest file systems).
const QUICK_CHECK_MARGIN_NS: i64 = 2_000_000_000;

/// One checkpoint: its entries sorted by path (bytewise), and what the walk skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// Opaque; the name it is stored under.
    pub id: String,
    /// When the checkpoint was taken, in milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    pub entries: Vec<Entry>,
    /// FIFOs, sockets, devices, names that are not UTF-8 and what could not be read.
    pub skipped: u64,
    /// Paths that changed while they were read (stored as one read saw them) or vanished
    /// between the listing and the read (not stored).
    pub changed_under: Vec<String>,
    /// What the caller said of the checkpoint when it was taken (why, for which turn): kept
    /// in the root, opaque to this crate; `null` when nothing was said.
    pub label: serde_json::Value,
    /// Counted when taken: kept in the root, so a listing needs no entries.
    pub summary: Summary,
    /// When the walk began, in nanoseconds since the epoch ([`QUICK_CHECK_MARGIN_NS`]).
    pub(crate) started_ns: i64,
    /// Where the entries are stored: the chunks of their JSON lines.
    pub(crate) stream: Vec<ChunkRef>,
}

impl Manifest {
    /// The manifest of an empty tree, stored nowhere: what a patch into a tree whose content
    /// is unknown starts from (everything is sent, everything else removed).
    pub fn empty() -> Manifest {
        Manifest {
            id: String::new(),
            created_at_ms: 0,
            entries: Vec::new(),
            skipped: 0,
            changed_under: Vec::new(),
            label: serde_json::Value::Null,
            summary: Summary::default(),
            started_ns: 0,
            stream: Vec::new(),
        }
    }
}

/// A checkpoint's counts, kept in its root.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// Regular files.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Files and links added, removed or changed since the checkpoint taken before it.
    pub files_changed: u64,
}

/// One path of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Relative to the checkpoint's root, `/`-separated.
    pub path: String,
    pub content: Content,
    /// Permission bits (`0o7777` at most).
    pub mode: u32,
    /// A file's length; a symlink's target length; 0 for a directory.
    pub size: u64,
    pub mtime_ns: i64,
    /// The inode and device as the walk saw them: the quick check's other half.
    pub(crate) ino: u64,
    pub(crate) dev: u64,
}

/// What an entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// A regular file: its chunks in order (none when empty).
    File(Vec<ChunkRef>),
    Dir,
    /// A symlink and its target, as written (never followed).
    Symlink(String),
}

impl Manifest {
    /// The entry at `path`.
    pub fn entry(&self, path: &str) -> Option<&Entry> {
        self.entries
            .binary_search_by(|entry| entry.path.as_str().cmp(path))
            .ok()
            .map(|i| &self.entries[i])
    }

    /// The number of regular files.
    pub fn n_files(&self) -> u64 {
        self.entries
            .iter()
            .filter(|e| matches!(e.content, Content::File(_)))
            .count() as u64
    }

    /// The bytes of every regular file.
    pub fn n_bytes(&self) -> u64 {
        self.entries
            .iter()
            .filter(|e| matches!(e.content, Content::File(_)))
            .map(|e| e.size)
            .sum()
    }

    /// True when the quick check may take `entry`'s stat as proof its content is unchanged:
    /// its mtime is older than the walk that recorded it by the margin.
    pub(crate) fn trusts(&self, entry: &Entry) -> bool {
        entry.mtime_ns < self.started_ns.saturating_sub(QUICK_CHECK_MARGIN_NS)
    }

    /// Every chunk this manifest needs: its stream's and its files'.
    pub(crate) fn chunk_ids(&self) -> impl Iterator<Item = ChunkId> + '_ {
        self.stream.iter().map(|c| c.id).chain(
            self.entries
                .iter()
                .filter_map(|e| match &e.content {
                    Content::File(chunks) => Some(chunks),
                    _ => None,
                })
                .flatten()
                .map(|c| c.id),
        )
    }

    /// Refuses entries a restore must not write: see the module's docs.
    pub(crate) fn check(entries: &[Entry]) -> Result<(), Error> {
        let unsafe_entry = |path: &str, reason| Error::Unsafe {
            path: path.to_owned(),
            reason,
        };
        let mut dirs: HashSet<&str> = HashSet::new();
        let mut last: Option<&str> = None;
        for entry in entries {
            let path = entry.path.as_str();
            if let Some(reason) = path::refusal(path) {
                return Err(unsafe_entry(path, reason));
            }
            if last.is_some_and(|last| last >= path) {
                return Err(unsafe_entry(path, "entries out of order or repeated"));
            }
            last = Some(path);
            if let Some(parent) = path::parent(path)
                && !dirs.contains(parent)
            {
                return Err(unsafe_entry(
                    path,
                    "parent is not a directory of the checkpoint",
                ));
            }
            if entry.mode > 0o7777 {
                return Err(unsafe_entry(path, "mode beyond permission bits"));
            }
            match &entry.content {
                Content::Dir => {
                    dirs.insert(path);
                }
                Content::Symlink(target) => {
                    if target.is_empty() || target.contains('\0') {
                        return Err(unsafe_entry(path, "symlink target empty or with NUL"));
                    }
                }
                Content::File(chunks) => {
                    let mut total = 0u64;
                    for chunk in chunks {
                        if chunk.len == 0 || chunk.len as usize > MAX_CHUNK {
                            return Err(Error::Corrupt(format!(
                                "{path:?}: a chunk of {} bytes",
                                chunk.len
                            )));
                        }
                        total += u64::from(chunk.len);
                    }
                    if total != entry.size {
                        return Err(Error::Corrupt(format!(
                            "{path:?}: size {} but chunks of {total} bytes",
                            entry.size
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

/// One entry as a JSON line: short keys, since there may be a million of them.
#[derive(Serialize, Deserialize)]
struct Line {
    /// Path.
    p: String,
    /// Kind: `f` file, `d` directory, `l` symlink.
    k: char,
    m: u32,
    s: u64,
    t: i64,
    i: u64,
    d: u64,
    /// A symlink's target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    l: Option<String>,
    /// A file's chunks: hex id and length.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    c: Vec<(String, u32)>,
}

/// The entries as the byte stream that is stored.
pub(crate) fn encode_entries(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * 160);
    for entry in entries {
        let (k, l, c) = match &entry.content {
            Content::File(chunks) => (
                'f',
                None,
                chunks.iter().map(|c| (c.id.to_hex(), c.len)).collect(),
            ),
            Content::Dir => ('d', None, Vec::new()),
            Content::Symlink(target) => ('l', Some(target.clone()), Vec::new()),
        };
        let line = Line {
            p: entry.path.clone(),
            k,
            m: entry.mode,
            s: entry.size,
            t: entry.mtime_ns,
            i: entry.ino,
            d: entry.dev,
            l,
            c,
        };
        // A struct of strings and numbers always serializes.
        if serde_json::to_writer(&mut out, &line).is_ok() {
            out.push(b'\n');
        }
    }
    out
}

/// The entries from their stored stream; checked with [`Manifest::check`].
pub(crate) fn decode_entries(stream: &[u8]) -> Result<Vec<Entry>, Error> {
    let mut entries = Vec::new();
    for (n, line) in stream.split(|b| *b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let line: Line = serde_json::from_slice(line)
            .map_err(|e| Error::Corrupt(format!("entry line {}: {e}", n + 1)))?;
        let content = match (line.k, line.l, line.c) {
            ('d', None, c) if c.is_empty() => Content::Dir,
            ('l', Some(target), c) if c.is_empty() => Content::Symlink(target),
            ('f', None, c) => Content::File(
                c.into_iter()
                    .map(|(hex, len)| {
                        ChunkId::from_hex(&hex)
                            .map(|id| ChunkRef { id, len })
                            .ok_or_else(|| {
                                Error::Corrupt(format!("entry line {}: chunk id {hex:?}", n + 1))
                            })
                    })
                    .collect::<Result<_, _>>()?,
            ),
            (kind, _, _) => {
                return Err(Error::Corrupt(format!(
                    "entry line {}: kind {kind:?} with fields it cannot have",
                    n + 1
                )));
            }
        };
        entries.push(Entry {
            path: line.p,
            content,
            mode: line.m,
            size: line.s,
            mtime_ns: line.t,
            ino: line.i,
            dev: line.d,
        });
    }
    Manifest::check(&entries)?;
    Ok(entries)
}

/// The stored root of a manifest.
#[derive(Serialize, Deserialize)]
struct Root {
    v: u32,
    id: String,
    created_at_ms: u64,
    started_ns: i64,
    skipped: u64,
    changed_under: Vec<String>,
    #[serde(default)]
    label: serde_json::Value,
    #[serde(default)]
    summary: Summary,
    /// The entry stream's chunks: hex id and length.
    stream: Vec<(String, u32)>,
}

/// The root of `manifest`, compressed for storage.
pub(crate) fn encode_root(manifest: &Manifest) -> Result<Vec<u8>, Error> {
    let root = Root {
        v: VERSION,
        id: manifest.id.clone(),
        created_at_ms: manifest.created_at_ms,
        started_ns: manifest.started_ns,
        skipped: manifest.skipped,
        changed_under: manifest.changed_under.clone(),
        label: manifest.label.clone(),
        summary: manifest.summary,
        stream: manifest
            .stream
            .iter()
            .map(|c| (c.id.to_hex(), c.len))
            .collect(),
    };
    let json = serde_json::to_vec(&root)
        .map_err(|e| Error::Corrupt(format!("cannot encode the manifest: {e}")))?;
    zstd::bulk::compress(&json, 3).map_err(|e| Error::io("cannot compress the manifest", e))
}

/// A manifest whose root is `stored` and whose entries are not loaded yet (`entries` empty):
/// the caller fetches `stream` and calls [`decode_entries`].
pub(crate) fn decode_root(id: &str, stored: &[u8]) -> Result<Manifest, Error> {
    let json = zstd::bulk::decompress(stored, MAX_ROOT_BYTES)
        .map_err(|e| Error::Corrupt(format!("manifest {id:?} does not decompress: {e}")))?;
    let root: Root = serde_json::from_slice(&json)
        .map_err(|e| Error::Corrupt(format!("manifest {id:?}: {e}")))?;
    if root.v != VERSION {
        return Err(Error::Corrupt(format!(
            "manifest {id:?} has version {}, not {VERSION}",
            root.v
        )));
    }
    if root.id != id {
        return Err(Error::Corrupt(format!(
            "manifest stored as {id:?} names itself {:?}",
            root.id
        )));
    }
    let mut total = 0u64;
    let mut stream = Vec::with_capacity(root.stream.len());
    for (hex, len) in root.stream {
        let id = ChunkId::from_hex(&hex)
            .ok_or_else(|| Error::Corrupt(format!("manifest stream chunk id {hex:?}")))?;
        if len == 0 || len as usize > MAX_CHUNK {
            return Err(Error::Corrupt(format!("a manifest chunk of {len} bytes")));
        }
        total += u64::from(len);
        stream.push(ChunkRef { id, len });
    }
    if total > MAX_STREAM_BYTES {
        return Err(Error::Corrupt(format!(
            "manifest entries of {total} bytes, more than {MAX_STREAM_BYTES}"
        )));
    }
    Ok(Manifest {
        id: root.id,
        created_at_ms: root.created_at_ms,
        entries: Vec::new(),
        skipped: root.skipped,
        changed_under: root.changed_under,
        label: root.label,
        summary: root.summary,
        started_ns: root.started_ns,
        stream,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, chunks: &[u32]) -> Entry {
        let chunks: Vec<ChunkRef> = chunks
            .iter()
            .map(|len| ChunkRef {
                id: ChunkId::of(&len.to_le_bytes()),
                len: *len,
            })
            .collect();
        Entry {
            path: path.to_owned(),
            size: chunks.iter().map(|c| u64::from(c.len)).sum(),
            content: Content::File(chunks),
            mode: 0o644,
            mtime_ns: 1_700_000_000_123_456_789,
            ino: 42,
            dev: 7,
        }
    }

    fn dir(path: &str) -> Entry {
        Entry {
            path: path.to_owned(),
            content: Content::Dir,
            mode: 0o755,
            size: 0,
            mtime_ns: 1,
            ino: 1,
            dev: 7,
        }
    }

    fn link(path: &str, target: &str) -> Entry {
        Entry {
            path: path.to_owned(),
            content: Content::Symlink(target.to_owned()),
            mode: 0o777,
            size: target.len() as u64,
            mtime_ns: 1,
            ino: 2,
            dev: 7,
        }
    }

    #[test]
    fn entries_round_trip_through_their_stream() {
        let entries = vec![
            file("a.txt", &[10, 20]),
            dir("d"),
            file("d/empty", &[]),
            link("d/l", "../a.txt"),
            link("venv-python", "/usr/bin/python3"),
        ];
        let stream = encode_entries(&entries);
        assert_eq!(decode_entries(&stream).expect("decodes"), entries);
    }

    #[test]
    fn a_tampered_entry_list_is_refused_with_the_reason() {
        let cases: Vec<(Vec<Entry>, &str)> = vec![
            (vec![file("../x", &[1])], "'.' or '..' in the path"),
            (vec![file("/etc/passwd", &[1])], "absolute path"),
            (
                vec![link("l", "/etc"), file("l/passwd", &[1])],
                "parent is not a directory of the checkpoint",
            ),
            (
                vec![file("f", &[1]), file("f/x", &[1])],
                "parent is not a directory of the checkpoint",
            ),
            (
                vec![file("d/x", &[1])],
                "parent is not a directory of the checkpoint",
            ),
            (
                vec![file("a", &[1]), file("a", &[1])],
                "entries out of order or repeated",
            ),
            (
                vec![file("b", &[1]), file("a", &[1])],
                "entries out of order or repeated",
            ),
            (vec![link("l", "")], "symlink target empty or with NUL"),
        ];
        for (entries, reason) in cases {
            let stream = encode_entries(&entries);
            match decode_entries(&stream) {
                Err(Error::Unsafe { reason: got, .. }) => assert_eq!(got, reason),
                other => panic!("expected {reason:?}, got {other:?}"),
            }
        }
    }

    #[test]
    fn inconsistent_sizes_and_garbage_are_corrupt() {
        let mut wrong_size = file("a", &[10]);
        wrong_size.size = 11;
        let oversized = file("a", &[MAX_CHUNK as u32 + 1]);
        for entries in [vec![wrong_size], vec![oversized]] {
            let stream = encode_entries(&entries);
            assert!(matches!(decode_entries(&stream), Err(Error::Corrupt(_))));
        }
        let garbage: [&[u8]; 3] = [
            b"not json\n",
            br#"{"p":"a","k":"x","m":0,"s":0,"t":0,"i":0,"d":0}"#,
            br#"{"p":"a","k":"d","m":0,"s":0,"t":0,"i":0,"d":0,"l":"x"}"#,
        ];
        for stream in garbage {
            assert!(matches!(decode_entries(stream), Err(Error::Corrupt(_))));
        }
    }

    #[test]
    fn a_root_decodes_only_under_its_own_id() {
        let manifest = Manifest {
            id: "ck-1".to_owned(),
            created_at_ms: 5,
            entries: Vec::new(),
            skipped: 2,
            changed_under: vec!["x".to_owned()],
            label: serde_json::json!({"turn": 3}),
            summary: Summary {
                files: 1,
                bytes: 2,
                files_changed: 1,
            },
            started_ns: 9,
            stream: vec![ChunkRef {
                id: ChunkId::of(b"s"),
                len: 1,
            }],
        };
        let stored = encode_root(&manifest).expect("encodes");
        assert_eq!(decode_root("ck-1", &stored).expect("decodes"), manifest);
        assert!(matches!(
            decode_root("ck-2", &stored),
            Err(Error::Corrupt(_))
        ));
        assert!(matches!(
            decode_root("ck-1", b"junk"),
            Err(Error::Corrupt(_))
        ));
    }

    #[test]
    fn the_quick_check_trusts_only_mtimes_older_than_the_walk_by_the_margin() {
        let manifest = Manifest {
            started_ns: 10_000_000_000,
            ..Manifest::empty()
        };
        let mut entry = file("a", &[1]);
        for (mtime_ns, trusted) in [
            (1_000_000_000, true),
            (7_999_999_999, true),
            (8_000_000_000, false),
            (10_000_000_000, false),
            (20_000_000_000, false),
        ] {
            entry.mtime_ns = mtime_ns;
            assert_eq!(manifest.trusts(&entry), trusted, "{mtime_ns}");
        }
    }
}
