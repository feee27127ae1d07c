//! Faults: a corrupt chunk, chunks collected under a checkpoint, a tampered manifest, a full
//! disk in the middle of a take, and requests that name nothing.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime};

use warren_checkpoint::{ChunkBatch, ChunkId, ChunkStore, Content, Error, LocalDisk};

use super::{chunk_files, local_store, names, noise, store_on, tree, write};

fn chunk_path(store_dir: &Path, id: &ChunkId) -> std::path::PathBuf {
    let hex = id.to_hex();
    store_dir.join("chunks").join(&hex[..2]).join(&hex[2..])
}

#[test]
fn a_corrupt_chunk_fails_the_restore_naming_its_file_and_leaves_the_target_untouched() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, target, store_dir) = (
        dir.path().join("ws"),
        dir.path().join("target"),
        dir.path().join("store"),
    );
    write(&root, "a.txt", b"the content that will rot\n");
    write(&root, "b.bin", &noise(1, 100_000));
    write(&target, "old.txt", b"what the target held\n");
    let before = tree(&target);
    let (store, _) = local_store(&store_dir);
    let (manifest, _) = store.take(&root, None).expect("takes");
    let Some(Content::File(chunks)) = manifest.entry("a.txt").map(|e| &e.content) else {
        panic!("a.txt is a file");
    };
    let rotten = chunks[0].id;
    // Valid zstd of other bytes, then plain garbage: both fail the hash.
    let other = zstd::bulk::compress(b"the content that will rot!\n", 3).expect("compresses");
    for stored in [other, b"garbage".to_vec()] {
        std::fs::write(chunk_path(&store_dir, &rotten), &stored).expect("corrupts");
        match store.restore(&manifest, &target, None) {
            Err(Error::Broken { path, chunk }) => {
                assert_eq!((path.as_str(), chunk), ("a.txt", rotten.to_hex()));
            }
            other => panic!("expected a broken chunk, got {other:?}"),
        }
        assert_eq!(tree(&target), before, "the target is as it was");
        assert_eq!(
            names(dir.path()),
            ["store", "target", "ws"],
            "no staging left"
        );
        let mut out = Vec::new();
        let read = store.read_file(&manifest, "a.txt", 0..5, &mut out);
        assert!(matches!(read, Err(Error::Broken { .. })), "{read:?}");
    }
}

#[test]
fn a_checkpoint_whose_chunks_were_collected_fails_clearly_and_restores_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, target) = (dir.path().join("ws"), dir.path().join("fork"));
    write(&root, "a.txt", b"soon collected\n");
    let (store, _) = local_store(&dir.path().join("store"));
    let (dropped, _) = store.take(&root, None).expect("takes");
    store.delete(&dropped.id).expect("deletes");
    let stats = store.collect(&[]).expect("collects");
    assert!(stats.n_deleted >= 2, "{stats:?}");

    match store.restore(&dropped, &target, None) {
        Err(Error::Missing { path, .. }) => assert_eq!(path, "a.txt"),
        other => panic!("expected a missing chunk, got {other:?}"),
    }
    assert!(
        !target.exists(),
        "a fork target the restore created is removed again"
    );
    assert!(matches!(store.load(&dropped.id), Err(Error::NotFound(_))));

    // A manifest still stored whose entry list was collected names what is missing.
    let (kept_root_only, _) = store.take(&root, None).expect("takes");
    store.collect(&[]).expect("collects");
    match store.load(&kept_root_only.id) {
        Err(Error::Missing { path, .. }) => assert!(path.contains(&kept_root_only.id), "{path}"),
        other => panic!("expected a missing chunk, got {other:?}"),
    }
}

/// Rewrites the entry list of stored manifest `id` with `edit`, storing the new list as a
/// properly hashed chunk and the root to match: what someone with write access to the store
/// could do.
fn tamper(store_dir: &Path, id: &str, edit: impl Fn(&str) -> String) {
    let root_path = store_dir.join("manifests").join(id);
    let stored = std::fs::read(&root_path).expect("reads the root");
    let json = zstd::bulk::decompress(&stored, 1 << 20).expect("decompresses");
    let mut root: serde_json::Value = serde_json::from_slice(&json).expect("parses");
    let hex = root["stream"][0][0]
        .as_str()
        .expect("a stream chunk")
        .to_owned();
    let old = ChunkId::from_hex(&hex).expect("an id");
    let chunk = std::fs::read(chunk_path(store_dir, &old)).expect("reads the chunk");
    let lines = String::from_utf8(zstd::bulk::decompress(&chunk, 1 << 20).expect("decompresses"))
        .expect("text");
    let edited = edit(&lines);
    assert_ne!(edited, lines, "the edit applies");
    let new = ChunkId::of(edited.as_bytes());
    let path = chunk_path(store_dir, &new);
    std::fs::create_dir_all(path.parent().expect("a fan directory")).expect("mkdir");
    std::fs::write(
        &path,
        zstd::bulk::compress(edited.as_bytes(), 3).expect("compresses"),
    )
    .expect("writes the chunk");
    root["stream"] = serde_json::json!([[new.to_hex(), edited.len()]]);
    let json = serde_json::to_vec(&root).expect("encodes");
    std::fs::write(
        &root_path,
        zstd::bulk::compress(&json, 3).expect("compresses"),
    )
    .expect("writes the root");
}

#[test]
fn a_tampered_manifest_that_leads_out_of_the_root_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, store_dir, outside) = (
        dir.path().join("ws"),
        dir.path().join("store"),
        dir.path().join("outside"),
    );
    write(&root, "ax", b"payload\n");
    std::fs::create_dir(&outside).expect("mkdir");
    let (store, _) = local_store(&store_dir);
    let (manifest, _) = store.take(&root, None).expect("takes");

    tamper(&store_dir, &manifest.id, |lines| {
        lines.replace(r#""p":"ax""#, r#""p":"../ax""#)
    });
    match store.load(&manifest.id) {
        Err(Error::Unsafe { path, reason }) => {
            assert_eq!(
                (path.as_str(), reason),
                ("../ax", "'.' or '..' in the path")
            );
        }
        other => panic!("expected an unsafe entry, got {other:?}"),
    }

    // A link to a directory outside, then a file "inside" it.
    let (manifest, _) = store.take(&root, None).expect("takes");
    let link = format!(
        r#"{{"p":"l","k":"l","m":511,"s":1,"t":0,"i":0,"d":0,"l":"{}"}}"#,
        outside.display()
    );
    tamper(&store_dir, &manifest.id, |lines| {
        let file_line = lines.trim_end().replace(r#""p":"ax""#, r#""p":"l/ax""#);
        format!("{link}\n{file_line}\n")
    });
    match store.load(&manifest.id) {
        Err(Error::Unsafe { path, reason }) => {
            assert_eq!(
                (path.as_str(), reason),
                ("l/ax", "parent is not a directory of the checkpoint")
            );
        }
        other => panic!("expected an unsafe entry, got {other:?}"),
    }
    assert!(names(&outside).is_empty());
}

/// A local disk whose writes fail with "no space left" once `budget` bytes were written.
struct FullDisk {
    inner: LocalDisk,
    budget: AtomicI64,
}

impl FullDisk {
    fn spend(&self, n: usize) -> Result<(), Error> {
        let n = n as i64;
        if self.budget.fetch_sub(n, Ordering::Relaxed) < n {
            return Err(Error::StorageFull(
                "No space left on device (os error 28)".to_owned(),
            ));
        }
        Ok(())
    }
}

struct FullBatch<'a> {
    disk: &'a FullDisk,
    inner: Box<dyn ChunkBatch + 'a>,
}

impl ChunkBatch for FullBatch<'_> {
    fn put(&self, id: &ChunkId, stored: &[u8]) -> Result<(), Error> {
        self.disk.spend(stored.len())?;
        self.inner.put(id, stored)
    }

    fn commit(self: Box<Self>) -> Result<(), Error> {
        self.inner.commit()
    }
}

impl ChunkStore for FullDisk {
    fn batch(&self) -> Result<Box<dyn ChunkBatch + '_>, Error> {
        Ok(Box::new(FullBatch {
            disk: self,
            inner: self.inner.batch()?,
        }))
    }
    fn chunk_written_at(&self, id: &ChunkId) -> Result<Option<SystemTime>, Error> {
        self.inner.chunk_written_at(id)
    }
    fn refresh_chunk(&self, id: &ChunkId, stored: &[u8]) -> Result<bool, Error> {
        self.inner.refresh_chunk(id, stored)
    }
    fn get_chunk(&self, id: &ChunkId) -> Result<Option<Vec<u8>>, Error> {
        self.inner.get_chunk(id)
    }
    fn list_chunks(&self) -> Result<Vec<(ChunkId, SystemTime)>, Error> {
        self.inner.list_chunks()
    }
    fn delete_chunk(&self, id: &ChunkId) -> Result<(), Error> {
        self.inner.delete_chunk(id)
    }
    fn put_manifest(&self, id: &str, stored: &[u8]) -> Result<(), Error> {
        self.spend(stored.len())?;
        self.inner.put_manifest(id, stored)
    }
    fn get_manifest(&self, id: &str) -> Result<Option<Vec<u8>>, Error> {
        self.inner.get_manifest(id)
    }
    fn list_manifests(&self) -> Result<Vec<String>, Error> {
        self.inner.list_manifests()
    }
    fn delete_manifest(&self, id: &str) -> Result<(), Error> {
        self.inner.delete_manifest(id)
    }
    fn clean_leftovers(&self, before: SystemTime) -> Result<u64, Error> {
        self.inner.clean_leftovers(before)
    }
}

#[test]
fn a_full_disk_fails_the_take_clearly_and_every_previous_checkpoint_stays_intact() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, store_dir) = (dir.path().join("ws"), dir.path().join("store"));
    write(&root, "a.txt", b"first version\n");
    write(&root, "b.bin", &noise(1, 200_000));
    let disk = Arc::new(FullDisk {
        inner: LocalDisk::open(&store_dir).expect("opens"),
        budget: AtomicI64::new(i64::MAX),
    });
    let store = store_on(disk.clone(), Duration::ZERO);
    let (previous, _) = store.take(&root, None).expect("takes");
    let before = tree(&root);
    let n_chunks = chunk_files(&store_dir).len();

    write(&root, "big.bin", &noise(2, 2 * 1024 * 1024));
    disk.budget.store(300_000, Ordering::Relaxed);
    match store.take(&root, Some(&previous)) {
        Err(error @ Error::StorageFull(_)) => {
            assert!(
                error
                    .to_string()
                    .starts_with("no space left for the checkpoint"),
                "{error}"
            );
        }
        other => panic!("expected a full disk, got {other:?}"),
    }
    assert_eq!(
        chunk_files(&store_dir).len(),
        n_chunks,
        "nothing of the failed take is visible"
    );
    assert!(
        names(&store_dir.join("tmp")).is_empty(),
        "its partial writes are gone"
    );
    let page = store.page(None, 10).expect("lists");
    assert_eq!(
        page.checkpoints.len(),
        1,
        "only the previous checkpoint is listed"
    );

    let loaded = store
        .load(&previous.id)
        .expect("the previous checkpoint loads");
    let target = dir.path().join("restored");
    store.restore(&loaded, &target, None).expect("and restores");
    assert_eq!(tree(&target), before);
}

#[test]
fn requests_that_name_nothing_get_clear_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("ws");
    write(&root, "d/f.txt", b"0123456789");
    let (store, _) = local_store(&dir.path().join("store"));
    let (manifest, _) = store.take(&root, None).expect("takes");
    for id in ["../../etc/passwd", "", "000000000000-00000000", "x"] {
        assert!(matches!(store.load(id), Err(Error::NotFound(_))), "{id}");
    }
    assert!(matches!(store.delete(".."), Err(Error::NotFound(_))));
    let mut out = Vec::new();
    // Past the end, and backwards.
    let cases = [
        ("d/f.txt", 5..11),
        ("d/f.txt", std::ops::Range { start: 6, end: 5 }),
    ];
    for (path, range) in cases {
        let read = store.read_file(&manifest, path, range.clone(), &mut out);
        assert!(
            matches!(read, Err(Error::Invalid(_))),
            "{path} {range:?}: {read:?}"
        );
    }
    assert!(matches!(
        store.read_file(&manifest, "d", 0..0, &mut out),
        Err(Error::WrongKind { .. })
    ));
    assert!(matches!(
        store.read_file(&manifest, "nope", 0..0, &mut out),
        Err(Error::NoEntry(_))
    ));
    assert!(matches!(
        store.list(&manifest, "d/f.txt", 1),
        Err(Error::WrongKind { .. })
    ));
    assert!(matches!(
        store.list(&manifest, "../d", 1),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        store.list(&manifest, "missing", 1),
        Err(Error::NoEntry(_))
    ));
    assert!(out.is_empty());
}
