//! Session files in object storage, against a real S3 endpoint (moto on loopback): round trips
//! small and multipart, ranges, missing objects, and a dead endpoint answering `Unavailable`
//! quickly while the objects already stored stay intact.

use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use warren_store::objects::{ObjectError, ObjectUrl, Objects};
use warren_test_support::services::{S3, free_port};

/// A started endpoint with a fresh bucket, and `Objects` for `s3://<bucket>/warren`.
fn endpoint(bucket: &str) -> (S3, Objects) {
    let s3 = S3::start();
    s3.create_bucket(bucket);
    let url = ObjectUrl::parse(&format!("s3://{bucket}/warren")).expect("a valid url");
    let objects = Objects::from_url_with(&url, &s3.env()).expect("objects for moto");
    (s3, objects)
}

/// `n_bytes` of a pattern that differs in every part (a swapped or repeated part shows).
fn contents(n_bytes: usize) -> Vec<u8> {
    (0..n_bytes)
        .map(|i| (i as u64).wrapping_mul(2_654_435_761).rotate_right(13) as u8)
        .collect()
}

#[tokio::test]
async fn a_small_file_and_a_multipart_one_come_back_byte_for_byte() {
    let (_s3, objects) = endpoint("round-trips");
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, n_bytes) in [("small.bin", 1000), ("large.bin", 20 * 1024 * 1024 + 17)] {
        let data = contents(n_bytes);
        let source = dir.path().join(name);
        std::fs::write(&source, &data).expect("writes the source");
        let uploaded = objects
            .put_file("s1", name, &source)
            .await
            .expect("uploads");
        assert_eq!(uploaded, n_bytes as u64, "{name}");
        let (size, _modified) = objects
            .head("s1", name)
            .await
            .expect("head answers")
            .expect("the object exists");
        assert_eq!(size, n_bytes as u64, "{name}");

        let copy = dir.path().join(format!("{name}.copy"));
        let downloaded = objects
            .get_to_file("s1", name, &copy)
            .await
            .expect("downloads");
        assert_eq!(downloaded, n_bytes as u64);
        assert!(
            std::fs::read(&copy).expect("reads the copy") == data,
            "{name} differs"
        );

        let streamed: Vec<u8> = objects
            .get_stream("s1", name)
            .await
            .expect("streams")
            .try_fold(Vec::new(), |mut all, chunk| async move {
                all.extend_from_slice(&chunk);
                Ok(all)
            })
            .await
            .expect("the stream completes");
        assert!(streamed == data, "{name} streamed differs");
    }
}

#[tokio::test]
async fn ranges_give_the_bytes_asked_for_and_past_the_end_is_invalid() {
    let (_s3, objects) = endpoint("ranges");
    let dir = tempfile::tempdir().expect("temp dir");
    let data = contents(10_000);
    let source = dir.path().join("f");
    std::fs::write(&source, &data).expect("writes");
    objects.put_file("s1", "f", &source).await.expect("uploads");
    for range in [0..1, 4000..4100, 9999..10_000, 0..10_000] {
        let bytes = objects
            .get_range("s1", "f", range.clone())
            .await
            .expect("a range inside the object");
        assert_eq!(
            &bytes[..],
            &data[range.start as usize..range.end as usize],
            "{range:?}"
        );
    }
    for range in [9999..10_001, 10_000..10_001, 20_000..20_010, 5..5] {
        let past = objects.get_range("s1", "f", range.clone()).await;
        assert!(
            matches!(past, Err(ObjectError::Invalid(_))),
            "{range:?}: {past:?}"
        );
    }
}

#[tokio::test]
async fn a_missing_object_is_not_found_and_deleting_a_session_removes_its_objects() {
    let (_s3, objects) = endpoint("missing");
    let dir = tempfile::tempdir().expect("temp dir");
    assert!(matches!(
        objects.get_range("s1", "nope", 0..1).await,
        Err(ObjectError::NotFound)
    ));
    assert!(matches!(
        objects.get_stream("s1", "nope").await.map(|_| ()),
        Err(ObjectError::NotFound)
    ));
    let target = dir.path().join("target");
    assert!(matches!(
        objects.get_to_file("s1", "nope", &target).await,
        Err(ObjectError::NotFound)
    ));
    assert!(!target.exists(), "a failed download leaves no file");
    assert!(objects.head("s1", "nope").await.expect("head").is_none());

    let source = dir.path().join("f");
    std::fs::write(&source, b"x").expect("writes");
    for name in ["a", "b"] {
        objects
            .put_file("s1", name, &source)
            .await
            .expect("uploads");
    }
    objects.put_file("s2", "a", &source).await.expect("uploads");
    objects.delete("s1", "a").await.expect("deletes");
    objects
        .delete("s1", "a")
        .await
        .expect("deleting again is fine");
    assert!(objects.head("s1", "a").await.expect("head").is_none());
    assert_eq!(objects.delete_session("s1").await.expect("deletes s1"), 1);
    assert!(objects.head("s1", "b").await.expect("head").is_none());
    assert!(
        objects.head("s2", "a").await.expect("head").is_some(),
        "another session's objects stay"
    );
}

#[tokio::test]
async fn bad_session_ids_and_names_are_invalid_before_any_request() {
    // No endpoint at all: validation answers first.
    let url = ObjectUrl::parse("s3://bucket").expect("url");
    let env = vec![
        (
            "AWS_ENDPOINT_URL",
            format!("http://127.0.0.1:{}", free_port()),
        ),
        ("AWS_ALLOW_HTTP", "true".to_owned()),
        ("AWS_REGION", "us-east-1".to_owned()),
        ("AWS_ACCESS_KEY_ID", "k".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "s".to_owned()),
    ];
    let objects = Objects::from_url_with(&url, &env).expect("objects");
    for (session, name) in [
        ("", "n"),
        ("s", ""),
        ("a/b", "n"),
        ("..", "n"),
        ("s", "../x"),
    ] {
        let head = objects.head(session, name).await;
        assert!(
            matches!(head, Err(ObjectError::Invalid(_))),
            "{session:?} {name:?}: {head:?}"
        );
    }
}

#[tokio::test]
async fn a_dead_endpoint_is_unavailable_within_seconds_and_the_stored_object_stays() {
    let (s3, objects) = endpoint("faults");
    let dir = tempfile::tempdir().expect("temp dir");
    let v1 = contents(5000);
    let source = dir.path().join("snapshot");
    std::fs::write(&source, &v1).expect("writes v1");
    objects
        .put_file("s1", "snapshot.tar.zst", &source)
        .await
        .expect("uploads v1");

    // The same bucket through an endpoint where nothing listens.
    let mut dead_env = s3.env();
    for (key, value) in &mut dead_env {
        if *key == "AWS_ENDPOINT_URL" {
            *value = format!("http://127.0.0.1:{}", free_port());
        }
    }
    let url = ObjectUrl::parse("s3://faults/warren").expect("url");
    let dead = Objects::from_url_with(&url, &dead_env).expect("objects");
    std::fs::write(&source, contents(6000)).expect("writes v2");
    let started = Instant::now();
    let failed = dead.put_file("s1", "snapshot.tar.zst", &source).await;
    assert!(
        matches!(failed, Err(ObjectError::Unavailable(_))),
        "{failed:?}"
    );
    let head = dead.head("s1", "snapshot.tar.zst").await;
    assert!(matches!(head, Err(ObjectError::Unavailable(_))), "{head:?}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "a dead endpoint answered after {:?}",
        started.elapsed()
    );

    let kept = objects
        .get_range("s1", "snapshot.tar.zst", 0..5000)
        .await
        .expect("v1 is still readable");
    assert!(kept[..] == v1[..], "v1 is intact");
}

#[tokio::test]
async fn a_stopped_endpoint_is_unavailable_within_seconds() {
    let (mut s3, objects) = endpoint("stopped");
    s3.stop();
    let started = Instant::now();
    let head = objects.head("s1", "snapshot.tar.zst").await;
    assert!(matches!(head, Err(ObjectError::Unavailable(_))), "{head:?}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "answered after {:?}",
        started.elapsed()
    );
    // Back again (empty: moto keeps nothing across a restart), it answers as before.
    s3.start_again();
    s3.create_bucket("stopped");
    assert!(
        objects
            .head("s1", "snapshot.tar.zst")
            .await
            .expect("head")
            .is_none()
    );
}
