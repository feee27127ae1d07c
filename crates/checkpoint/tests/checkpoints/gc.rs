//! Collection: what kept checkpoints use stays, the rest goes once past the grace, and a chunk
//! a new checkpoint reuses is never collected under it. Stored checkpoints page newest first.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use warren_checkpoint::{ChunkStore, Error};

use super::{chunk_files, local_store, noise, store_on, tree, walk, write};

#[test]
fn a_sweep_frees_what_no_kept_checkpoint_uses_and_keeps_the_rest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, store_dir) = (dir.path().join("ws"), dir.path().join("store"));
    write(&root, "same.bin", &noise(1, 200_000));
    write(&root, "changes.bin", &noise(2, 200_000));
    let (store, _) = local_store(&store_dir);
    let (dropped, _) = store.take(&root, None).expect("takes");
    write(&root, "changes.bin", &noise(3, 200_000));
    let (kept, _) = store.take(&root, Some(&dropped)).expect("takes again");
    let expected = tree(&root);

    store.delete(&dropped.id).expect("deletes");
    let stats = store.collect(&[&kept]).expect("collects");
    assert!(
        stats.n_deleted >= 3,
        "the dropped file's chunks and manifest: {stats:?}"
    );
    assert_eq!(stats.n_spared, 0);

    let on_disk: BTreeSet<String> = chunk_files(&store_dir)
        .iter()
        .map(|p| {
            let fan = p.parent().and_then(|d| d.file_name()).expect("a fan");
            format!(
                "{}{}",
                fan.to_string_lossy(),
                p.file_name().expect("a name").to_string_lossy()
            )
        })
        .collect();
    let loaded = store.load(&kept.id).expect("the kept checkpoint loads");
    let target = dir.path().join("restored");
    store.restore(&loaded, &target, None).expect("and restores");
    assert_eq!(tree(&target), expected);
    assert_eq!(
        stats.n_kept as usize,
        on_disk.len(),
        "every chunk left is a kept one's"
    );
    assert!(matches!(store.load(&dropped.id), Err(Error::NotFound(_))));
}

#[test]
fn chunks_written_within_the_grace_are_spared() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, store_dir) = (dir.path().join("ws"), dir.path().join("store"));
    write(&root, "a.bin", &noise(1, 100_000));
    let (_, disk) = local_store(&store_dir);
    let store = store_on(disk, Duration::from_secs(3600));
    let (manifest, _) = store.take(&root, None).expect("takes");
    store.delete(&manifest.id).expect("deletes");
    let n_chunks = chunk_files(&store_dir).len();
    let stats = store.collect(&[]).expect("collects");
    assert_eq!((stats.n_deleted, stats.n_spared as usize), (0, n_chunks));
}

#[test]
fn a_chunk_reused_by_content_after_it_aged_is_refreshed_so_a_sweep_that_missed_its_checkpoint_spares_it()
 {
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, store_dir) = (dir.path().join("ws"), dir.path().join("store"));
    write(&root, "a.bin", &noise(1, 100_000));
    let (_, disk) = local_store(&store_dir);
    let store = store_on(disk.clone(), Duration::from_secs(3600));
    let (old, _) = store.take(&root, None).expect("takes");
    store.delete(&old.id).expect("deletes");
    let two_hours_ago = SystemTime::now() - Duration::from_secs(7200);
    for chunk in walk(&store_dir.join("chunks"))
        .into_iter()
        .filter(|p| p.is_file())
    {
        std::fs::File::open(&chunk)
            .and_then(|f| f.set_modified(two_hours_ago))
            .expect("ages the chunk");
    }
    let aged: Vec<_> = disk.list_chunks().expect("lists");
    assert!(
        aged.iter()
            .all(|(_, written)| *written < SystemTime::now() - Duration::from_secs(3600))
    );

    // A take that finds the old chunks (no quick check: no previous) refreshes them; a sweep
    // whose kept list predates that take spares them.
    let (new, _) = store.take(&root, None).expect("takes again");
    let stats = store.collect(&[]).expect("collects");
    assert_eq!(stats.n_deleted, 0, "{stats:?}");
    let target = dir.path().join("restored");
    store
        .restore(&new, &target, None)
        .expect("the new checkpoint restores");
    assert_eq!(tree(&target), tree(&root));
}

#[test]
fn stored_checkpoints_page_newest_first_and_ignore_foreign_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, disk) = local_store(&dir.path().join("store"));
    for i in 0..250u64 {
        disk.put_manifest(&format!("{:012x}-0000abcd", 1_700_000_000_000 + i), b"root")
            .expect("stores");
    }
    disk.put_manifest("not-a-checkpoint", b"x").expect("stores");
    let mut seen = Vec::new();
    let mut before: Option<String> = None;
    loop {
        let page = store.page(before.as_deref(), 100).expect("lists");
        assert!(page.checkpoints.len() <= 100);
        seen.extend(
            page.checkpoints
                .iter()
                .map(|l| l.created_at_ms - 1_700_000_000_000),
        );
        match page.next {
            Some(next) => before = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, (0..250).rev().collect::<Vec<u64>>());
}

#[test]
fn what_an_interrupted_batch_wrote_is_never_listed_and_is_swept_once_old() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store_dir = dir.path().join("store");
    let (_, disk) = local_store(&store_dir);
    let id = warren_checkpoint::ChunkId::of(b"half written");
    let batch = disk.batch().expect("a batch");
    batch.put(&id, b"stored form").expect("puts");
    // A crash: the batch neither commits nor cleans up.
    std::mem::forget(batch);
    assert!(disk.list_chunks().expect("lists").is_empty());
    assert_eq!(disk.chunk_written_at(&id).expect("stats"), None);
    assert_eq!(chunk_files(&store_dir).len(), 1, "the hidden leftover");

    let not_yet = SystemTime::now() - Duration::from_secs(60);
    assert_eq!(
        disk.clean_leftovers(not_yet).expect("cleans"),
        0,
        "too recent"
    );
    let later = SystemTime::now() + Duration::from_secs(1);
    assert_eq!(disk.clean_leftovers(later).expect("cleans"), 1);
    assert!(chunk_files(&store_dir).is_empty());
}
