//! [`ChunkStore`]: what a place that keeps checkpoints must do, in the fewest verbs the store
//! needs: chunks by id (written in batches that become visible and durable together), manifests
//! by checkpoint id, listing and deleting both. [`crate::LocalDisk`] and [`crate::Bucket`] are
//! the two places; tests wrap one to inject faults. What is deduplicated, verified or collected
//! is decided above this trait, never by a backend.

use std::time::SystemTime;

use crate::Error;
use crate::chunk::ChunkId;

/// Where chunks and manifests are kept. Every method may be called from several threads.
pub trait ChunkStore: Send + Sync {
    /// A new batch of chunk writes: what it puts is visible (and durable) once `commit`
    /// returns, and never if the batch is dropped uncommitted.
    fn batch(&self) -> Result<Box<dyn ChunkBatch + '_>, Error>;
    /// When chunk `id` was last written or refreshed; `None` when there is no such chunk.
    fn chunk_written_at(&self, id: &ChunkId) -> Result<Option<SystemTime>, Error>;
    /// Makes chunk `id` count as written now (a sweep spares chunks written after it started);
    /// `stored` is its stored form, for a backend that can only refresh by writing again.
    /// Returns false when the chunk is gone (deleted since it was seen), so it must be written.
    fn refresh_chunk(&self, id: &ChunkId, stored: &[u8]) -> Result<bool, Error>;
    /// Chunk `id` as stored (compressed), `None` when there is none.
    fn get_chunk(&self, id: &ChunkId) -> Result<Option<Vec<u8>>, Error>;
    /// Every chunk with when it was last written or refreshed.
    fn list_chunks(&self) -> Result<Vec<(ChunkId, SystemTime)>, Error>;
    /// Removes chunk `id`; a missing chunk is not an error.
    fn delete_chunk(&self, id: &ChunkId) -> Result<(), Error>;
    /// Stores the manifest of checkpoint `id` whole and durably, or not at all.
    fn put_manifest(&self, id: &str, stored: &[u8]) -> Result<(), Error>;
    /// The manifest of checkpoint `id` as stored, `None` when there is none.
    fn get_manifest(&self, id: &str) -> Result<Option<Vec<u8>>, Error>;
    /// The ids of every stored manifest, in any order.
    fn list_manifests(&self) -> Result<Vec<String>, Error>;
    /// Removes the manifest of checkpoint `id`; a missing one is not an error.
    fn delete_manifest(&self, id: &str) -> Result<(), Error>;
    /// The file holding chunk `id`'s stored form, when this backend keeps chunks as files a
    /// batch of another store on the same file system may link ([`ChunkBatch::put_link`]).
    fn chunk_file(&self, _id: &ChunkId) -> Option<std::path::PathBuf> {
        None
    }
    /// Removes what failed or interrupted writes left behind before `before` (never the
    /// partial writes of a batch still open); returns how many were removed.
    fn clean_leftovers(&self, before: SystemTime) -> Result<u64, Error>;
}

/// Chunk writes that become visible together ([`ChunkStore::batch`]).
pub trait ChunkBatch: Send + Sync {
    /// Writes chunk `id` (its stored form) into the batch; putting an id twice is harmless.
    fn put(&self, id: &ChunkId, stored: &[u8]) -> Result<(), Error>;
    /// Puts chunk `id` by linking `from` (another store's [`ChunkStore::chunk_file`]), sharing
    /// its bytes; returns its size, or `None` when this backend cannot (another file system,
    /// no such file): the caller then writes it with [`Self::put`]. Its content being complete
    /// and durable already, a linked chunk may be visible before the commit (a dropped batch
    /// leaves it for the sweep); the commit makes the link durable.
    fn put_link(&self, _id: &ChunkId, _from: &std::path::Path) -> Result<Option<u64>, Error> {
        Ok(None)
    }
    /// Makes every chunk put so far visible and durable.
    fn commit(self: Box<Self>) -> Result<(), Error>;
}
