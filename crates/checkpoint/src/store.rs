//! [`CheckpointStore`]: the handle with every verb, over one [`ChunkStore`]. It holds no
//! checkpoint in memory and no session: callers keep the manifests they need (the previous
//! one, for the next take) and decide which checkpoints to keep ([`crate::to_drop`]).

use std::io::Write;
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use crate::Error;
use crate::backend::ChunkStore;
use crate::chunks::{Chunks, Seen};
use crate::gc::{self, CollectStats};
use crate::listing::{self, Page};
use crate::manifest::{self, Content, Entry, Manifest};
use crate::read::{self, Diff};
use crate::restore;
use crate::take::{self, TakeStats};
use crate::tree::Writer;

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
    chunks: Chunks,
    n_threads: usize,
    owner: Option<(u32, u32)>,
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
        let now_ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        let (id, created_at_ms) = listing::new_id(now_ms);
        take::take(
            &self.chunks,
            root,
            previous,
            self.n_threads,
            id,
            created_at_ms,
            label,
        )
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
        let mut copied = 0u64;
        let what = format!("the manifest of {id}");
        for chunk in &manifest.stream {
            copied += self
                .chunks
                .copy_from(&*batch, &seen, &from.chunks, &chunk.id, &what)?;
        }
        for entry in &manifest.entries {
            if let Content::File(chunks) = &entry.content {
                for chunk in chunks {
                    copied += self.chunks.copy_from(
                        &*batch,
                        &seen,
                        &from.chunks,
                        &chunk.id,
                        &entry.path,
                    )?;
                }
            }
        }
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
