//! [`Chunks`]: the backend with the two rules every write and read of a chunk follows.
//!
//! Writing ([`Chunks::put`]): a chunk is stored once. One the previous checkpoint names is
//! taken as stored without asking the backend ([`Seen`]). One already stored is not written again,
//! but when it was last written more than half the grace ago it is refreshed, so a sweep that
//! started before the manifest naming it was stored spares it (`crate::gc` explains the
//! grace). The check and the refresh hold the gate shared; a sweep re-checks and deletes each
//! chunk holding it exclusively, so in one process a reused chunk is never deleted between the
//! two.
//!
//! Reading ([`Chunks::fetch`]): a chunk is returned only when its content hashes to its id; a
//! missing one is [`Error::Missing`], a mismatched one [`Error::Broken`], both naming the path
//! that needed it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use crate::Error;
use crate::backend::{ChunkBatch, ChunkStore};
use std::io::Read;

use crate::chunk::{ChunkId, ChunkRef, CutError, Packer, cut_stream, unpack};

/// A backend and the rules of its chunks.
pub(crate) struct Chunks {
    pub(crate) backend: Arc<dyn ChunkStore>,
    /// Held shared by writers checking and refreshing, exclusively by a sweep deleting.
    pub(crate) gate: RwLock<()>,
    /// A sweep deletes only chunks written longer ago than this before it started.
    pub(crate) grace: Duration,
}

/// The chunks one checkpoint has already handled, so a chunk repeated in the tree is checked
/// and written once. It starts with every chunk of the previous checkpoint: those are stored,
/// and safe from a sweep as long as the caller keeps that checkpoint (as it must until this
/// one is stored), so they are neither checked nor refreshed.
#[derive(Default)]
pub(crate) struct Seen(Mutex<HashSet<ChunkId>>);

impl Seen {
    pub(crate) fn with(known: impl Iterator<Item = ChunkId>) -> Seen {
        Seen(Mutex::new(known.collect()))
    }

    /// True the first time `id` is offered.
    fn first(&self, id: &ChunkId) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(*id)
    }
}

/// What [`Chunks::put_stream`] made of a stream: its chunks, its length and the stored bytes
/// that were new.
pub(crate) struct PutStream {
    pub(crate) chunks: Vec<ChunkRef>,
    pub(crate) size: u64,
    pub(crate) bytes_new: u64,
}

impl Chunks {
    /// Cuts `content` (about `size_hint` bytes) into chunks and [`Self::put`]s each one: what a
    /// take does with every file it reads and with its manifest's entry list.
    pub(crate) fn put_stream(
        &self,
        batch: &dyn ChunkBatch,
        seen: &Seen,
        packer: &mut Packer,
        window: &mut Vec<u8>,
        content: &mut impl Read,
        size_hint: u64,
    ) -> Result<PutStream, CutError> {
        let mut chunks = Vec::new();
        let mut bytes_new = 0u64;
        let size = cut_stream(content, window, size_hint, |chunk| {
            let id = ChunkId::of(chunk);
            bytes_new += self.put(batch, seen, packer, &id, chunk)?;
            chunks.push(ChunkRef {
                id,
                len: chunk.len() as u32,
            });
            Ok(())
        })?;
        Ok(PutStream {
            chunks,
            size,
            bytes_new,
        })
    }

    /// Stores chunk `id` with `content` in `batch` unless the store has it; returns the stored
    /// (compressed) bytes written, 0 when it was there already.
    pub(crate) fn put(
        &self,
        batch: &dyn ChunkBatch,
        seen: &Seen,
        packer: &mut Packer,
        id: &ChunkId,
        content: &[u8],
    ) -> Result<u64, Error> {
        if !seen.first(id) {
            return Ok(0);
        }
        let _shared = self
            .gate
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let written = self.backend.chunk_written_at(id)?;
        if written.is_some_and(|written| self.fresh(written)) {
            return Ok(0);
        }
        let stored = packer.pack(content)?;
        if written.is_some() && self.backend.refresh_chunk(id, &stored)? {
            return Ok(0);
        }
        batch.put(id, &stored)?;
        Ok(stored.len() as u64)
    }

    /// Copies chunk `id` from `from` (another store) into `batch` unless this store has it:
    /// linked when both keep chunks as files on one file system (a restore verifies it), else
    /// verified on the way. Returns the stored bytes brought. `path` names who needed it.
    pub(crate) fn copy_from(
        &self,
        batch: &dyn ChunkBatch,
        seen: &Seen,
        from: &Chunks,
        id: &ChunkId,
        path: &str,
    ) -> Result<u64, Error> {
        if !seen.first(id) {
            return Ok(0);
        }
        let _shared = self
            .gate
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let written = self.backend.chunk_written_at(id)?;
        if written.is_some_and(|written| self.fresh(written)) {
            return Ok(0);
        }
        if written.is_none()
            && let Some(file) = from.backend.chunk_file(id)
            && let Some(len) = batch.put_link(id, &file)?
        {
            return Ok(len);
        }
        let stored = from.backend.get_chunk(id)?.ok_or_else(|| Error::Missing {
            path: path.to_owned(),
            chunk: id.to_hex(),
        })?;
        if unpack(id, &stored).is_none() {
            return Err(Error::Broken {
                path: path.to_owned(),
                chunk: id.to_hex(),
            });
        }
        if written.is_some() && self.backend.refresh_chunk(id, &stored)? {
            return Ok(0);
        }
        batch.put(id, &stored)?;
        Ok(stored.len() as u64)
    }

    /// True when a chunk written at `written` needs no refresh yet.
    fn fresh(&self, written: SystemTime) -> bool {
        written
            .checked_add(self.grace / 2)
            .is_some_and(|until| until > SystemTime::now())
    }

    /// The content of chunk `id`, verified; `path` is who needed it, for the error.
    pub(crate) fn fetch(&self, id: &ChunkId, path: &str) -> Result<Vec<u8>, Error> {
        let stored = self.backend.get_chunk(id)?.ok_or_else(|| Error::Missing {
            path: path.to_owned(),
            chunk: id.to_hex(),
        })?;
        unpack(id, &stored).ok_or_else(|| Error::Broken {
            path: path.to_owned(),
            chunk: id.to_hex(),
        })
    }
}
