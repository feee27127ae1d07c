//! [`CheckpointStore`]: the handle with every verb, over one [`ChunkStore`]. It holds no
//! checkpoint in memory and no session: callers keep the manifests they need (the previous
//! one, for the next take) and decide which checkpoints to keep ([`crate::to_drop`]).

use std::io::{Read, Write};
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use crate::Error;
use crate::backend::ChunkStore;
use crate::chunk::ChunkId;
use crate::chunks::{Chunks, Seen};
use crate::gc::{self, CollectStats};
use crate::listing::{self, Page};
use crate::manifest::{self, Content, Entry, Manifest};
use crate::read::{self, Diff};
use crate::restore;
use crate::stream;
use crate::take::{self, Naming, TakeStats};
use crate::tree::Writer;

/// A new checkpoint's id and time, now, with `label`.
fn naming(label: serde_json::Value) -> Naming {
    let now_ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    let (id, created_at_ms) = listing::new_id(now_ms);
    Naming {
        id,
        created_at_ms,
        label,
    }
}

/// How a store works, chosen once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// A chunk no kept checkpoint names is deleted only when written longer ago than this
    /// before the sweep (`crate::gc`); the default is an hour.
    pub grace: Duration,
    /// Threads that read, hash and compress files during a take, and write them during a
    /// restore; the default is the machine's cores, at most 4.
    pub n_threads: usize,
    /// The owner (uid, gid) of what a restore or rewind writes: the sandbox's ids when the
    /// process is root and the tree is a sandbox's; `None` keeps the process's own.
    pub owner: Option<(u32, u32)>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            grace: Duration::from_secs(3600),
            n_threads: std::thread::available_parallelism()
                .map(|n| n.get().min(4))
                .unwrap_or(2),
            owner: None,
        }
    }
}

/// Checkpoints kept in one [`ChunkStore`]. Every verb is synchronous: call it from a blocking
/// thread. It may be shared by threads (`Arc`); takes may run at once.
pub struct CheckpointStore {
    pub(crate) chunks: Chunks,
    pub(crate) n_threads: usize,
    pub(crate) owner: Option<(u32, u32)>,
}

impl CheckpointStore {
    pub fn new(backend: Arc<dyn ChunkStore>, config: Config) -> CheckpointStore {
        CheckpointStore {
            chunks: Chunks {
                backend,
                gate: RwLock::new(()),
                grace: config.grace,
            },
            n_threads: config.n_threads.max(1),
            owner: config.owner,
        }
    }

    /// Takes and stores a checkpoint of the tree beneath `root` (not `root` itself). Files
    /// whose stat matches `previous` (the last checkpoint of this tree, kept until this one
    /// is stored) are not read again.
    pub fn take(
        &self,
        root: &Path,
        previous: Option<&Manifest>,
    ) -> Result<(Manifest, TakeStats), Error> {
        self.take_labelled(root, previous, serde_json::Value::Null)
    }

    /// [`Self::take`], keeping `label` (what the caller wants to know of it later, such as
    /// why and for which turn it was taken) in the checkpoint's root.
    pub fn take_labelled(
        &self,
        root: &Path,
        previous: Option<&Manifest>,
        label: serde_json::Value,
    ) -> Result<(Manifest, TakeStats), Error> {
        take::take(&self.chunks, root, previous, self.n_threads, naming(label))
    }

    /// Takes and stores a checkpoint from `changes`, a stream [`crate::produce`] wrote of a
    /// tree on another machine (its execd's) given `previous.known()`, exactly as
    /// [`Self::take_labelled`] would have taken it there. The stream is hostile input: a path,
    /// length or claim it cannot make, or a stream cut short, fails the take with
    /// [`Error::Corrupt`] or [`Error::Unsafe`], and nothing it stored becomes visible.
    pub fn take_streamed(
        &self,
        changes: &mut dyn Read,
        previous: Option<&Manifest>,
        label: serde_json::Value,
    ) -> Result<(Manifest, TakeStats), Error> {
        stream::consume(&self.chunks, changes, previous, naming(label))
    }

    /// Checkpoint `id`'s root only (its label and summary; `entries` empty): what a listing
    /// shows, without reading the entries.
    pub fn head(&self, id: &str) -> Result<Manifest, Error> {
        let id = listing::checked(id)?;
        let stored = self
            .chunks
            .backend
            .get_manifest(id)?
            .ok_or_else(|| Error::NotFound(id.to_owned()))?;
        manifest::decode_root(id, &stored)
    }

    /// Stores `manifest`, a checkpoint of `from`, in this store under the same id: every chunk
    /// it needs is copied (verified on the way; those this store has are not) before its root.
    /// A fork's first checkpoint. Returns the stored bytes copied.
    pub fn import(&self, from: &CheckpointStore, manifest: &Manifest) -> Result<u64, Error> {
        let id = listing::checked(&manifest.id)?;
        let root = from
            .chunks
            .backend
            .get_manifest(id)?
            .ok_or_else(|| Error::NotFound(id.to_owned()))?;
        let batch = self.chunks.backend.batch()?;
        let seen = Seen::default();
        let what = format!("the manifest of {id}");
        // Every chunk with who needs it; the copies (mostly links) run on the store's threads.
        let needed: Vec<(&ChunkId, &str)> = manifest
            .stream
            .iter()
            .map(|chunk| (&chunk.id, what.as_str()))
            .chain(manifest.entries.iter().flat_map(|entry| {
                match &entry.content {
                    Content::File(chunks) => chunks
                        .iter()
                        .map(|chunk| (&chunk.id, entry.path.as_str()))
                        .collect::<Vec<_>>(),
                    _ => Vec::new(),
                }
            }))
            .collect();
        let per_thread = needed.len().div_ceil(self.n_threads).max(1);
        // Set by the first thread that fails: the others stop.
        let stop = std::sync::atomic::AtomicBool::new(false);
        let copied = std::thread::scope(|scope| {
            let workers: Vec<_> = needed
                .chunks(per_thread)
                .map(|part| {
                    let (batch, seen, stop) = (&*batch, &seen, &stop);
                    scope.spawn(move || -> Result<u64, Error> {
                        let mut copied = 0u64;
                        for (id, path) in part {
                            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                                break;
                            }
                            match self.chunks.copy_from(batch, seen, &from.chunks, id, path) {
                                Ok(n) => copied += n,
                                Err(e) => {
                                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                                    return Err(e);
                                }
                            }
                        }
                        Ok(copied)
                    })
                })
                .collect();
            let mut copied = 0u64;
            let mut failed = None;
            for worker in workers {
                match worker.join() {
                    Ok(Ok(n)) => copied += n,
                    Ok(Err(e)) => failed = failed.or(Some(e)),
                    Err(_) => {
                        let panicked = std::io::Error::other("an import thread panicked");
                        failed = failed.or(Some(Error::io("importing a checkpoint", panicked)));
                    }
                }
            }
            failed.map_or(Ok(copied), Err)
        })?;
        batch.commit()?;
        self.chunks.backend.put_manifest(id, &root)?;
        Ok(copied + root.len() as u64)
    }

    /// The stored checkpoint `id`, every chunk of its entry list verified.
    pub fn load(&self, id: &str) -> Result<Manifest, Error> {
        let id = listing::checked(id)?;
        let stored = self
            .chunks
            .backend
            .get_manifest(id)?
            .ok_or_else(|| Error::NotFound(id.to_owned()))?;
        let mut manifest = manifest::decode_root(id, &stored)?;
        let what = format!("the manifest of {id}");
        let mut stream = Vec::new();
        for chunk in &manifest.stream {
            let content = self.chunks.fetch(&chunk.id, &what)?;
            if content.len() != chunk.len as usize {
                return Err(Error::Corrupt(format!(
                    "{what}: chunk {} has {} bytes, not {}",
                    chunk.id,
                    content.len(),
                    chunk.len
                )));
            }
            stream.extend_from_slice(&content);
        }
        manifest.entries = manifest::decode_entries(&stream)?;
        Ok(manifest)
    }

    /// Makes `target` (created when missing) hold exactly `manifest`'s tree; a broken or
    /// missing chunk leaves it as it was. `current`, a checkpoint of `target` just taken (a
    /// rewind), lets the restore touch only what differs. Returns `manifest` with the restored
    /// files' inodes: the next take's `previous`.
    pub fn restore(
        &self,
        manifest: &Manifest,
        target: &Path,
        current: Option<&Manifest>,
    ) -> Result<Manifest, Error> {
        let writer = Writer {
            n_threads: self.n_threads,
            owner: self.owner,
        };
        restore::restore(&self.chunks, manifest, target, current, writer)
    }

    /// Writes the bytes `range` of the file at `path` to `out`; returns how many.
    pub fn read_file(
        &self,
        manifest: &Manifest,
        path: &str,
        range: Range<u64>,
        out: &mut dyn Write,
    ) -> Result<u64, Error> {
        read::read_file(&self.chunks, manifest, path, range, out)
    }

    /// Writes the checkpoint's tree to `out` as a zstd-compressed tar archive, each chunk
    /// verified as it is written; a broken one fails it part way.
    pub fn export(&self, manifest: &Manifest, out: &mut dyn Write) -> Result<(), Error> {
        crate::export::export(&self.chunks, manifest, out)
    }

    /// The entries beneath `dir` (`""` for the root) at most `depth` levels down.
    pub fn list<'a>(
        &self,
        manifest: &'a Manifest,
        dir: &str,
        depth: usize,
    ) -> Result<Vec<&'a Entry>, Error> {
        read::list(manifest, dir, depth)
    }

    /// What changed from `old` to `new`.
    pub fn diff(&self, old: &Manifest, new: &Manifest) -> Result<Diff, Error> {
        read::diff(&self.chunks, old, new)
    }

    /// Stored checkpoints, newest first: at most `limit` older than `before`.
    pub fn page(&self, before: Option<&str>, limit: usize) -> Result<Page, Error> {
        let mut listed: Vec<_> = self
            .chunks
            .backend
            .list_manifests()?
            .iter()
            .filter_map(|id| listing::parse_id(id))
            .collect();
        listing::newest_first(&mut listed);
        Ok(listing::page_of(&listed, before, limit))
    }

    /// Removes checkpoint `id`'s manifest; its chunks go at the next [`Self::collect`].
    pub fn delete(&self, id: &str) -> Result<(), Error> {
        let id = listing::checked(id)?;
        self.chunks.backend.delete_manifest(id)
    }

    /// Deletes every chunk none of `kept` names (and that is older than the grace).
    pub fn collect(&self, kept: &[&Manifest]) -> Result<CollectStats, Error> {
        gc::collect(&self.chunks, kept)
    }
}
