//! `Cached`: checkpoints in a remote store with this replica's copy. The remote is a local
//! directory behind a switch that makes every call fail as an unreachable object store does.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use warren_checkpoint::{Cached, ChunkBatch, ChunkId, ChunkStore, Error, LocalDisk};

use super::{noise, store_on, tree, write};

/// A store that answers `Unavailable` to everything while `down`.
struct Remote {
    inner: LocalDisk,
    down: AtomicBool,
}

impl Remote {
    fn check(&self) -> Result<(), Error> {
        if self.down.load(Ordering::Relaxed) {
            return Err(Error::Unavailable("the endpoint does not answer".into()));
        }
        Ok(())
    }
}

struct RemoteBatch<'a> {
    remote: &'a Remote,
    inner: Box<dyn ChunkBatch + 'a>,
}

impl ChunkBatch for RemoteBatch<'_> {
    fn put(&self, id: &ChunkId, stored: &[u8]) -> Result<(), Error> {
        self.remote.check()?;
        self.inner.put(id, stored)
    }
    fn commit(self: Box<Self>) -> Result<(), Error> {
        self.remote.check()?;
        self.inner.commit()
    }
}

impl ChunkStore for Remote {
    fn batch(&self) -> Result<Box<dyn ChunkBatch + '_>, Error> {
        self.check()?;
        Ok(Box::new(RemoteBatch {
            remote: self,
            inner: self.inner.batch()?,
        }))
    }
    fn chunk_written_at(&self, id: &ChunkId) -> Result<Option<SystemTime>, Error> {
        self.check()?;
        self.inner.chunk_written_at(id)
    }
    fn refresh_chunk(&self, id: &ChunkId, stored: &[u8]) -> Result<bool, Error> {
        self.check()?;
        self.inner.refresh_chunk(id, stored)
    }
    fn get_chunk(&self, id: &ChunkId) -> Result<Option<Vec<u8>>, Error> {
        self.check()?;
        self.inner.get_chunk(id)
    }
    fn list_chunks(&self) -> Result<Vec<(ChunkId, SystemTime)>, Error> {
        self.check()?;
        self.inner.list_chunks()
    }
    fn delete_chunk(&self, id: &ChunkId) -> Result<(), Error> {
        self.check()?;
        self.inner.delete_chunk(id)
    }
    fn put_manifest(&self, id: &str, stored: &[u8]) -> Result<(), Error> {
        self.check()?;
        self.inner.put_manifest(id, stored)
    }
    fn get_manifest(&self, id: &str) -> Result<Option<Vec<u8>>, Error> {
        self.check()?;
        self.inner.get_manifest(id)
    }
    fn list_manifests(&self) -> Result<Vec<String>, Error> {
        self.check()?;
        self.inner.list_manifests()
    }
    fn delete_manifest(&self, id: &str) -> Result<(), Error> {
        self.check()?;
        self.inner.delete_manifest(id)
    }
    fn clean_leftovers(&self, before: SystemTime) -> Result<u64, Error> {
        self.check()?;
        self.inner.clean_leftovers(before)
    }
}

fn remote_in(dir: &Path) -> Arc<Remote> {
    Arc::new(Remote {
        inner: LocalDisk::open(dir).expect("opens the remote"),
        down: AtomicBool::new(false),
    })
}

#[test]
fn the_copy_restores_while_the_remote_is_down_and_a_take_then_fails_leaving_both_as_they_were() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, target) = (dir.path().join("ws"), dir.path().join("target"));
    write(&root, "a.txt", b"kept twice\n");
    write(&root, "b.bin", &noise(1, 300_000));
    let remote = remote_in(&dir.path().join("remote"));
    let copy = Arc::new(LocalDisk::open(&dir.path().join("copy")).expect("opens the copy"));
    let store = store_on(
        Arc::new(Cached::new(remote.clone(), copy.clone())),
        Duration::ZERO,
    );
    let (taken, _) = store.take(&root, None).expect("takes");
    // Both hold it: the remote (another replica reads there) and the copy.
    assert_eq!(
        remote.list_manifests().expect("lists"),
        vec![taken.id.clone()]
    );
    assert_eq!(
        copy.list_manifests().expect("lists"),
        vec![taken.id.clone()]
    );
    assert_eq!(
        remote.list_chunks().expect("lists").len(),
        copy.list_chunks().expect("lists").len()
    );

    remote.down.store(true, Ordering::Relaxed);
    let page = store.page(None, 10).expect("listed from the copy");
    assert_eq!(page.checkpoints[0].id, taken.id);
    let loaded = store.load(&taken.id).expect("loads from the copy");
    store
        .restore(&loaded, &target, None)
        .expect("restores from the copy");
    assert_eq!(tree(&target), tree(&root));

    write(&root, "c.bin", &noise(2, 100_000));
    match store.take(&root, Some(&loaded)) {
        Err(Error::Unavailable(_)) => {}
        other => panic!("a take while the remote is down is Unavailable, got {other:?}"),
    }
    remote.down.store(false, Ordering::Relaxed);
    assert_eq!(
        remote.list_manifests().expect("lists"),
        vec![taken.id.clone()]
    );
    assert_eq!(copy.list_manifests().expect("lists"), vec![taken.id]);
}

#[test]
fn what_only_the_remote_holds_is_read_from_it_and_a_delete_reaches_both() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, target) = (dir.path().join("ws"), dir.path().join("target"));
    write(&root, "a.txt", b"written by another replica\n");
    write(&root, "b.bin", &noise(3, 200_000));
    let remote = remote_in(&dir.path().join("remote"));
    // Another replica's take: in the remote only.
    let (theirs, _) = store_on(remote.clone(), Duration::ZERO)
        .take(&root, None)
        .expect("takes");
    let copy = Arc::new(LocalDisk::open(&dir.path().join("copy")).expect("opens the copy"));
    let store = store_on(
        Arc::new(Cached::new(remote.clone(), copy.clone())),
        Duration::ZERO,
    );
    let loaded = store.load(&theirs.id).expect("loads from the remote");
    store
        .restore(&loaded, &target, None)
        .expect("restores from the remote");
    assert_eq!(tree(&target), tree(&root));
    assert!(copy.list_manifests().expect("lists").is_empty());

    store.delete(&theirs.id).expect("deletes");
    store.collect(&[]).expect("collects");
    assert!(remote.list_manifests().expect("lists").is_empty());
    assert!(remote.list_chunks().expect("lists").is_empty());
}
