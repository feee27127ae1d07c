//! [`Cached`]: checkpoints kept in an object store, with this replica's copy on its own disk.
//!
//! The remote store is where the checkpoints are: another replica reads them there, and a write
//! counts only once the remote took it. The local store is a copy of what this replica wrote,
//! so an archived session is restored while the remote cannot be reached (as a whole-tar
//! snapshot's local copy was). Writes go to the remote first; the copy follows, and a failure
//! of it is logged, never the write's. Reads try the copy first: a chunk is checked against its
//! hash above this trait, and a manifest's id never names another manifest. Which manifests
//! exist is the remote's answer, the copy's only while the remote is unavailable. Deletes go to
//! both; chunk times and refreshes (what the sweep decides by) are the remote's.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::Error;
use crate::backend::{ChunkBatch, ChunkStore};
use crate::chunk::ChunkId;

/// A remote store with a local copy (see the module docs).
pub struct Cached {
    remote: Arc<dyn ChunkStore>,
    local: Arc<dyn ChunkStore>,
}

impl Cached {
    pub fn new(remote: Arc<dyn ChunkStore>, local: Arc<dyn ChunkStore>) -> Cached {
        Cached { remote, local }
    }
}

/// Logs a failed write to the copy: it costs a restore during an outage, never a checkpoint.
fn copy_failed(what: &str, error: &Error) {
    tracing::warn!(error = %error, "the local copy of a checkpoint's {what} was not written");
}

impl ChunkStore for Cached {
    fn batch(&self) -> Result<Box<dyn ChunkBatch + '_>, Error> {
        let local = self
            .local
            .batch()
            .inspect_err(|e| copy_failed("chunks", e))
            .ok();
        Ok(Box::new(CachedBatch {
            remote: self.remote.batch()?,
            local: Mutex::new(local),
        }))
    }

    fn chunk_written_at(&self, id: &ChunkId) -> Result<Option<SystemTime>, Error> {
        self.remote.chunk_written_at(id)
    }

    fn refresh_chunk(&self, id: &ChunkId, stored: &[u8]) -> Result<bool, Error> {
        self.remote.refresh_chunk(id, stored)
    }

    fn get_chunk(&self, id: &ChunkId) -> Result<Option<Vec<u8>>, Error> {
        match self.local.get_chunk(id) {
            Ok(Some(stored)) => Ok(Some(stored)),
            _ => self.remote.get_chunk(id),
        }
    }

    fn list_chunks(&self) -> Result<Vec<(ChunkId, SystemTime)>, Error> {
        self.remote.list_chunks()
    }

    fn delete_chunk(&self, id: &ChunkId) -> Result<(), Error> {
        self.remote.delete_chunk(id)?;
        self.local.delete_chunk(id)
    }

    fn put_manifest(&self, id: &str, stored: &[u8]) -> Result<(), Error> {
        self.remote.put_manifest(id, stored)?;
        if let Err(e) = self.local.put_manifest(id, stored) {
            copy_failed("manifest", &e);
        }
        Ok(())
    }

    fn get_manifest(&self, id: &str) -> Result<Option<Vec<u8>>, Error> {
        match self.local.get_manifest(id) {
            Ok(Some(stored)) => Ok(Some(stored)),
            _ => self.remote.get_manifest(id),
        }
    }

    fn list_manifests(&self) -> Result<Vec<String>, Error> {
        match self.remote.list_manifests() {
            Err(Error::Unavailable(why)) => {
                tracing::warn!(
                    why,
                    "the object store is unavailable: checkpoints listed from the local copy"
                );
                self.local.list_manifests()
            }
            listed => listed,
        }
    }

    fn delete_manifest(&self, id: &str) -> Result<(), Error> {
        self.remote.delete_manifest(id)?;
        self.local.delete_manifest(id)
    }

    fn clean_leftovers(&self, before: SystemTime) -> Result<u64, Error> {
        Ok(self.remote.clean_leftovers(before)? + self.local.clean_leftovers(before)?)
    }
}

/// The remote's batch, and the copy's while it has not failed.
struct CachedBatch<'a> {
    remote: Box<dyn ChunkBatch + 'a>,
    local: Mutex<Option<Box<dyn ChunkBatch + 'a>>>,
}

impl<'a> CachedBatch<'a> {
    fn local(&self) -> std::sync::MutexGuard<'_, Option<Box<dyn ChunkBatch + 'a>>> {
        self.local
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl ChunkBatch for CachedBatch<'_> {
    fn put(&self, id: &ChunkId, stored: &[u8]) -> Result<(), Error> {
        self.remote.put(id, stored)?;
        let mut local = self.local();
        if let Some(batch) = local.as_ref()
            && let Err(e) = batch.put(id, stored)
        {
            copy_failed("chunks", &e);
            *local = None;
        }
        Ok(())
    }

    fn commit(self: Box<Self>) -> Result<(), Error> {
        let CachedBatch { remote, local } = *self;
        remote.commit()?;
        let local = local
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(batch) = local
            && let Err(e) = batch.commit()
        {
            copy_failed("chunks", &e);
        }
        Ok(())
    }
}
