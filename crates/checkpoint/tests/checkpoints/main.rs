//! The checkpoint store against real trees in temporary directories: round trips, dedup, the
//! quick check, files changing while read, broken and missing chunks, tampered manifests, a
//! full disk, collection, reads and diffs, the same on S3 (moto on loopback), checkpoints
//! taken from a changes stream, and a fork's restore copying from the tree it was taken of.

mod cached;
mod faults;
mod fork;
mod gc;
mod patch;
mod reads;
mod round_trip;
mod s3;
mod stream;

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use warren_checkpoint::{CheckpointStore, ChunkStore, Config, LocalDisk};

/// A store on a local directory with no grace (tests collect what they just dropped) and two
/// threads.
pub fn local_store(dir: &Path) -> (CheckpointStore, Arc<LocalDisk>) {
    let disk = Arc::new(LocalDisk::open(dir).expect("opens the store"));
    (store_on(disk.clone(), Duration::ZERO), disk)
}

pub fn store_on(backend: Arc<dyn ChunkStore>, grace: Duration) -> CheckpointStore {
    CheckpointStore::new(
        backend,
        Config {
            grace,
            n_threads: 2,
            owner: None,
        },
    )
}

/// Deterministic bytes that do not repeat (xorshift): incompressible, and cut by content.
pub fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(n);
    out
}

/// Writes `bytes` to `root/path`, creating parents.
pub fn write(root: &Path, path: &str, bytes: &[u8]) {
    let full = root.join(path);
    if let Some(parent) = full.parent() {
        std::fs::create_dir_all(parent).expect("creates parents");
    }
    std::fs::write(&full, bytes).expect("writes the file");
}

/// Sets the mtime of every file and directory beneath `root` to one fixed moment in 2020, so
/// the quick check trusts them and two calls agree.
pub fn age(root: &Path) {
    let hour_ago = SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000);
    for path in walk(root) {
        let metadata = std::fs::symlink_metadata(&path).expect("stats");
        if metadata.is_file() || metadata.is_dir() {
            std::fs::File::open(&path)
                .and_then(|f| f.set_modified(hour_ago))
                .expect("sets the mtime");
        }
    }
}

/// Every path beneath `root`, parents first, never through a link.
pub fn walk(root: &Path) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    let mut pending = vec![root.to_owned()];
    while let Some(dir) = pending.pop() {
        let mut children: Vec<PathBuf> = std::fs::read_dir(&dir)
            .expect("lists")
            .map(|e| e.expect("an entry").path())
            .collect();
        children.sort();
        for child in children {
            if std::fs::symlink_metadata(&child).expect("stats").is_dir() {
                pending.push(child.clone());
            }
            paths.push(child);
        }
    }
    paths
}

/// What a tree holds, as a comparable description: per path its kind, permission bits,
/// content or target, and mtime in nanoseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    File {
        mode: u32,
        content: Vec<u8>,
        mtime_ns: i64,
    },
    Dir {
        mode: u32,
        mtime_ns: i64,
    },
    Link {
        target: String,
        mtime_ns: i64,
    },
    Other,
}

pub fn tree(root: &Path) -> BTreeMap<String, Node> {
    walk(root)
        .into_iter()
        .map(|path| {
            let metadata = std::fs::symlink_metadata(&path).expect("stats");
            let mtime_ns = metadata.mtime() * 1_000_000_000 + metadata.mtime_nsec();
            let mode = metadata.permissions().mode() & 0o7777;
            let node = if metadata.is_file() {
                Node::File {
                    mode,
                    content: std::fs::read(&path).expect("reads"),
                    mtime_ns,
                }
            } else if metadata.is_dir() {
                Node::Dir { mode, mtime_ns }
            } else if metadata.file_type().is_symlink() {
                Node::Link {
                    target: std::fs::read_link(&path)
                        .expect("reads the link")
                        .to_string_lossy()
                        .into_owned(),
                    mtime_ns,
                }
            } else {
                Node::Other
            };
            let relative = path
                .strip_prefix(root)
                .expect("beneath the root")
                .to_string_lossy()
                .into_owned();
            (relative, node)
        })
        .collect()
}

/// The chunk files in a local store.
pub fn chunk_files(store_dir: &Path) -> Vec<PathBuf> {
    walk(&store_dir.join("chunks"))
        .into_iter()
        .filter(|p| p.is_file())
        .collect()
}

/// The names under `dir` (empty when it does not exist).
pub fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|e| {
                    e.expect("an entry")
                        .file_name()
                        .to_string_lossy()
                        .into_owned()
                })
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}
