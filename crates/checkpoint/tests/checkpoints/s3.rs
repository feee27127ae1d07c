//! The same store in an S3 bucket (moto on loopback, through `object_store` as
//! `--snapshots s3://…` uses it): round trip, dedup, ranged reads, paging, collection and a
//! collected checkpoint's clear error.

use std::sync::Arc;
use std::time::Duration;

use warren_checkpoint::{Bucket, ChunkStore, Error};
use warren_test_support::services::S3;

use super::{noise, store_on, tree, write};

#[test]
fn checkpoints_round_trip_dedup_and_collect_in_an_s3_bucket() {
    let s3 = S3::start();
    s3.create_bucket("checkpoints");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let bucket = Arc::new(
        Bucket::s3(
            "checkpoints",
            "warren/checkpoints",
            &s3.env(),
            runtime.handle().clone(),
        )
        .expect("a bucket"),
    );
    let store = store_on(bucket.clone(), Duration::ZERO);
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("ws");
    write(&root, "src/lib.rs", b"pub fn answer() -> u32 { 42 }\n");
    write(&root, "data.bin", &noise(1, 400_000));
    write(&root, "empty", b"");
    std::os::unix::fs::symlink("src/lib.rs", root.join("link")).expect("symlink");

    let (first, stats) = store.take(&root, None).expect("takes");
    assert!(stats.bytes_new > 400_000);
    let target = dir.path().join("restored");
    let loaded = store.load(&first.id).expect("loads from the bucket");
    assert_eq!(loaded, first);
    store.restore(&loaded, &target, None).expect("restores");
    assert_eq!(tree(&target), tree(&root));

    let n_chunks = bucket.list_chunks().expect("lists").len();
    let (second, stats) = store.take(&root, Some(&first)).expect("takes again");
    assert_eq!(
        bucket.list_chunks().expect("lists").len(),
        n_chunks,
        "no new chunk"
    );
    assert!(stats.bytes_new < 1024, "{}", stats.bytes_new);
    let mut out = Vec::new();
    store
        .read_file(&second, "data.bin", 100_000..300_000, &mut out)
        .expect("reads a range");
    assert!(out[..] == noise(1, 400_000)[100_000..300_000]);
    let page = store.page(None, 10).expect("lists");
    let ids: Vec<&str> = page.checkpoints.iter().map(|l| l.id.as_str()).collect();
    assert_eq!(ids, [second.id.as_str(), first.id.as_str()]);

    write(&root, "data.bin", &noise(2, 400_000));
    let (third, _) = store.take(&root, Some(&second)).expect("takes a third");
    store.delete(&first.id).expect("deletes");
    store.delete(&second.id).expect("deletes");
    let stats = store.collect(&[&third]).expect("collects");
    assert!(stats.n_deleted >= 3, "the old data's chunks: {stats:?}");
    let fresh = dir.path().join("third");
    store
        .restore(&store.load(&third.id).expect("loads"), &fresh, None)
        .expect("restores");
    assert_eq!(tree(&fresh), tree(&root));

    store.delete(&third.id).expect("deletes");
    store.collect(&[]).expect("collects everything");
    assert!(bucket.list_chunks().expect("lists").is_empty());
    match store.restore(&third, &dir.path().join("fork"), None) {
        Err(Error::Missing { .. }) => {}
        other => panic!("expected a missing chunk, got {other:?}"),
    }
}
