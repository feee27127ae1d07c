//! Taking and restoring: the tree comes back as it was, content is stored once, the quick
//! check skips unchanged files, and a file written during the take is stored as one read saw
//! it and reported.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use warren_checkpoint::Content;

use super::{Node, age, chunk_files, local_store, names, noise, tree, write};

/// Files of several sizes (one of several chunks), an empty file, nested and empty
/// directories, modes, relative, absolute and dangling links, a link to a directory outside
/// holding a secret, and a FIFO.
fn varied_tree(root: &Path, outside: &Path) {
    write(root, "README.md", b"# hello\n");
    write(root, "src/main.rs", b"fn main() {}\n");
    write(root, "src/deep/er/still.txt", b"deep\n");
    write(root, "data/blob.bin", &noise(1, 600 * 1024));
    write(root, "empty", b"");
    std::fs::create_dir_all(root.join("empty-dir")).expect("mkdir");
    write(root, "bin/run.sh", b"#!/bin/sh\necho hi\n");
    std::fs::set_permissions(
        root.join("bin/run.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .expect("chmod");
    std::fs::set_permissions(
        root.join("README.md"),
        std::fs::Permissions::from_mode(0o600),
    )
    .expect("chmod");
    std::fs::set_permissions(
        root.join("src/deep"),
        std::fs::Permissions::from_mode(0o750),
    )
    .expect("chmod");
    std::os::unix::fs::symlink("src/main.rs", root.join("main-link")).expect("symlink");
    std::os::unix::fs::symlink("/usr/bin/python3", root.join("python")).expect("symlink");
    std::os::unix::fs::symlink("nowhere/at/all", root.join("dangling")).expect("symlink");
    write(outside, "secret.txt", b"not for the checkpoint");
    std::os::unix::fs::symlink(outside, root.join("escape")).expect("symlink");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        root.join("pipe"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .expect("mkfifo");
}

#[test]
fn a_tree_comes_back_with_its_files_dirs_links_modes_and_mtimes_and_a_fifo_is_skipped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, outside, target) = (
        dir.path().join("ws"),
        dir.path().join("outside"),
        dir.path().join("restored"),
    );
    varied_tree(&root, &outside);
    let (store, _) = local_store(&dir.path().join("store"));

    let (manifest, stats) = store.take(&root, None).expect("takes");
    assert_eq!(stats.skipped, 1, "the FIFO is skipped and counted");
    assert_eq!(stats.files, 6);
    assert!(stats.changed_under.is_empty());
    assert_eq!(
        manifest.entry("escape").map(|e| &e.content),
        Some(&Content::Symlink(outside.to_string_lossy().into_owned())),
        "a link is stored as a link"
    );
    assert!(
        manifest.entry("escape/secret.txt").is_none(),
        "the walk never follows a link"
    );
    assert_eq!(store.load(&manifest.id).expect("loads"), manifest);

    store.restore(&manifest, &target, None).expect("restores");
    let mut expected = tree(&root);
    expected.remove("pipe");
    assert_eq!(tree(&target), expected);
    assert!(!expected.values().any(|node| *node == Node::Other));
    assert_eq!(
        names(dir.path()),
        ["outside", "restored", "store", "ws"],
        "no staging left"
    );
}

#[test]
fn a_second_take_of_the_same_tree_stores_no_new_chunk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("ws");
    write(&root, "a.bin", &noise(2, 300 * 1024));
    write(&root, "b.txt", &b"some text\n".repeat(1000));
    let store_dir = dir.path().join("store");
    let (store, _) = local_store(&store_dir);
    let (first, stats) = store.take(&root, None).expect("takes");
    assert!(
        stats.bytes_new > 300 * 1024,
        "the first take stores the content"
    );
    let n_chunks = chunk_files(&store_dir).len();

    let (second, stats) = store.take(&root, Some(&first)).expect("takes again");
    assert_eq!(chunk_files(&store_dir).len(), n_chunks, "no new chunk");
    assert!(
        stats.bytes_new < 1024,
        "only the manifest's root is new: {}",
        stats.bytes_new
    );
    assert_eq!(stats.files_changed, 0);
    assert_eq!(second.entries, first.entries);
}

#[test]
fn a_megabyte_changed_in_the_middle_of_20_mib_stores_about_a_megabyte() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("ws");
    let mut content = noise(3, 20 * 1024 * 1024);
    write(&root, "big.bin", &content);
    let (store, _) = local_store(&dir.path().join("store"));
    let (first, _) = store.take(&root, None).expect("takes");

    content[10 * 1024 * 1024..11 * 1024 * 1024].copy_from_slice(&noise(4, 1024 * 1024));
    write(&root, "big.bin", &content);
    let (second, stats) = store.take(&root, Some(&first)).expect("takes again");
    assert_eq!(stats.files_changed, 1);
    assert!(
        (1024 * 1024..2 * 1024 * 1024).contains(&stats.bytes_new),
        "stored {} bytes for a 1 MiB change",
        stats.bytes_new
    );
    let mut read = Vec::new();
    store
        .read_file(&second, "big.bin", 0..content.len() as u64, &mut read)
        .expect("reads");
    assert!(read == content, "the new checkpoint holds the new content");
}

#[test]
fn the_quick_check_skips_reading_files_whose_stat_is_unchanged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("ws");
    for i in 0..20 {
        write(
            &root,
            &format!("f{i}.txt"),
            format!("file {i}\n").repeat(100).as_bytes(),
        );
    }
    age(&root);
    let (store, _) = local_store(&dir.path().join("store"));
    let (first, stats) = store.take(&root, None).expect("takes");
    assert_eq!(stats.bytes_read, stats.bytes);

    let (second, stats) = store.take(&root, Some(&first)).expect("takes again");
    assert_eq!(stats.bytes_read, 0, "nothing read when nothing changed");
    assert_eq!(second.entries, first.entries);

    write(&root, "f3.txt", &b"changed!\n".repeat(100));
    let (third, stats) = store.take(&root, Some(&second)).expect("takes a third");
    assert_eq!(stats.bytes_read, 900, "only the changed file is read");
    assert_eq!(stats.files_changed, 1);
    let mut read = Vec::new();
    store
        .read_file(&third, "f3.txt", 0..900, &mut read)
        .expect("reads");
    assert_eq!(read, b"changed!\n".repeat(100));
}

#[test]
fn a_file_written_just_before_a_take_is_read_again_next_time_even_when_its_stat_matches() {
    // Within the file system's timestamp granularity a second write keeps the mtime, so a
    // fresh mtime proves nothing.
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("ws");
    write(&root, "fresh.txt", b"just written\n");
    let (store, _) = local_store(&dir.path().join("store"));
    let (first, _) = store.take(&root, None).expect("takes");
    let (_, stats) = store.take(&root, Some(&first)).expect("takes again");
    assert_eq!(stats.bytes_read, 13);
}

#[test]
fn a_file_growing_while_it_is_read_is_stored_as_one_read_saw_it_and_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("ws");
    write(&root, "log.bin", &noise(5, 16 * 1024 * 1024));
    write(&root, "calm.txt", b"calm\n");
    let (store, _) = local_store(&dir.path().join("store"));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, path) = (stop.clone(), root.join("log.bin"));
        std::thread::spawn(move || {
            use std::io::Write;
            let mut file = std::fs::OpenOptions::new()
                .append(true)
                .open(path)
                .expect("opens");
            let deadline = Instant::now() + Duration::from_secs(60);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                file.write_all(b"x").expect("appends");
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    let taken = store.take(&root, None);
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("the writer ends");
    let (manifest, stats) = taken.expect("takes");
    assert_eq!(stats.changed_under, ["log.bin"]);
    assert_eq!(manifest.changed_under, ["log.bin"]);

    let entry = manifest.entry("log.bin").expect("stored anyway");
    let now = std::fs::read(root.join("log.bin")).expect("reads");
    let mut stored = Vec::new();
    store
        .read_file(&manifest, "log.bin", 0..entry.size, &mut stored)
        .expect("reads");
    assert!(entry.size >= 16 * 1024 * 1024 && entry.size < now.len() as u64);
    assert!(
        stored[..] == now[..stored.len()],
        "exactly the bytes one read saw"
    );

    // Its recorded stat no longer matches, so the next take reads it again.
    let (_, stats) = store.take(&root, Some(&manifest)).expect("takes again");
    assert!(stats.bytes_read >= now.len() as u64);
}

#[test]
fn a_rewind_leaves_unchanged_files_in_place_and_the_next_take_reads_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("ws");
    for i in 0..10 {
        write(
            &root,
            &format!("src/f{i}.txt"),
            format!("version one {i}\n").as_bytes(),
        );
    }
    write(&root, "gone-later.txt", b"will be removed\n");
    age(&root);
    let (store, _) = local_store(&dir.path().join("store"));
    let (old, _) = store.take(&root, None).expect("takes");
    let before = tree(&root);

    write(&root, "src/f1.txt", b"version two\n");
    write(&root, "new/file.txt", b"added\n");
    std::fs::remove_file(root.join("gone-later.txt")).expect("removes");
    age(&root);
    let (current, _) = store
        .take(&root, Some(&old))
        .expect("takes the current state");
    let unchanged_ino = std::fs::metadata(root.join("src/f5.txt"))
        .expect("stats")
        .ino_of();

    let restored = store.restore(&old, &root, Some(&current)).expect("rewinds");
    assert_eq!(tree(&root), before);
    let ino = std::fs::metadata(root.join("src/f5.txt"))
        .expect("stats")
        .ino_of();
    assert_eq!(
        ino, unchanged_ino,
        "an unchanged file stays, never written again"
    );
    assert_eq!(names(dir.path()), ["store", "ws"], "no staging left");

    let (_, stats) = store
        .take(&root, Some(&restored))
        .expect("takes after the rewind");
    assert_eq!(
        stats.bytes_read, 0,
        "the restored manifest carries the new inodes"
    );
    assert_eq!(stats.files_changed, 0);
}

trait Ino {
    fn ino_of(&self) -> u64;
}

impl Ino for std::fs::Metadata {
    fn ino_of(&self) -> u64 {
        std::os::unix::fs::MetadataExt::ino(self)
    }
}

#[test]
fn a_rewind_over_kinds_swapped_links_retargeted_and_files_changed_after_the_last_checkpoint_ends_exactly_at_the_checkpoint()
 {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("ws");
    write(&root, "was-file", b"a file\n");
    write(&root, "was-dir/inner.txt", b"inside\n");
    write(&root, "mode.sh", b"#!/bin/sh\n");
    write(&root, "touched-later.txt", b"original\n");
    std::os::unix::fs::symlink("was-file", root.join("link")).expect("symlink");
    age(&root);
    let (store, _) = local_store(&dir.path().join("store"));
    let (old, _) = store.take(&root, None).expect("takes");
    let before = tree(&root);

    std::fs::remove_file(root.join("was-file")).expect("removes");
    write(&root, "was-file/now-a-dir.txt", b"dir now\n");
    std::fs::remove_dir_all(root.join("was-dir")).expect("removes");
    write(&root, "was-dir", b"file now\n");
    std::fs::set_permissions(root.join("mode.sh"), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    std::fs::remove_file(root.join("link")).expect("removes");
    std::os::unix::fs::symlink("elsewhere", root.join("link")).expect("symlink");
    age(&root);
    let (current, _) = store
        .take(&root, Some(&old))
        .expect("takes the current state");
    // After the checkpoint of now: a new file, a FIFO, and a file changed in place.
    write(&root, "after/new.txt", b"new\n");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        root.join("after/pipe"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .expect("mkfifo");
    write(&root, "touched-later.txt", b"changed!\n");

    let restored = store.restore(&old, &root, Some(&current)).expect("rewinds");
    assert_eq!(tree(&root), before);
    assert_eq!(names(dir.path()), ["store", "ws"], "no staging left");
    let (_, stats) = store
        .take(&root, Some(&restored))
        .expect("takes after the rewind");
    assert_eq!(stats.files_changed, 0);
}

#[test]
fn a_rewind_that_needs_a_broken_chunk_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, store_dir) = (dir.path().join("ws"), dir.path().join("store"));
    write(&root, "a.txt", b"will rot\n");
    write(&root, "b.txt", b"stays\n");
    age(&root);
    let (store, _) = local_store(&store_dir);
    let (old, _) = store.take(&root, None).expect("takes");
    write(&root, "a.txt", b"changed\n");
    write(&root, "c.txt", b"new\n");
    age(&root);
    let (current, _) = store
        .take(&root, Some(&old))
        .expect("takes the current state");
    let now = tree(&root);
    let Some(Content::File(chunks)) = old.entry("a.txt").map(|e| &e.content) else {
        panic!("a file");
    };
    let hex = chunks[0].id.to_hex();
    std::fs::write(
        store_dir.join("chunks").join(&hex[..2]).join(&hex[2..]),
        b"rot",
    )
    .expect("corrupts");
    let rewound = store.restore(&old, &root, Some(&current));
    assert!(
        matches!(rewound, Err(warren_checkpoint::Error::Broken { ref path, .. }) if path == "a.txt"),
        "{rewound:?}"
    );
    assert_eq!(tree(&root), now, "the workspace is as it was");
    assert_eq!(names(dir.path()), ["store", "ws"], "no staging left");
}

#[test]
fn a_label_and_the_counts_are_kept_in_the_root_and_read_without_the_entries() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("tree");
    write(&root, "a.txt", b"one");
    write(&root, "sub/b.bin", &noise(1, 100_000));
    let (store, _) = local_store(&dir.path().join("store"));
    let label = serde_json::json!({"reason": "turn", "turn": 7});
    let (first, _) = store
        .take_labelled(&root, None, label.clone())
        .expect("takes");
    write(&root, "a.txt", b"two!");
    let (second, stats) = store.take(&root, Some(&first)).expect("takes again");
    let head = store.head(&first.id).expect("the first's root");
    assert_eq!(head.label, label);
    assert!(head.entries.is_empty(), "a head reads no entries");
    assert_eq!(
        (
            head.summary.files,
            head.summary.bytes,
            head.summary.files_changed
        ),
        (2, 100_003, 2)
    );
    let head = store.head(&second.id).expect("the second's root");
    assert_eq!(head.label, serde_json::Value::Null);
    assert_eq!(head.summary.files_changed, stats.files_changed);
    assert_eq!(head.summary.files_changed, 1);
    assert!(matches!(
        store.head("000000000001-00000000"),
        Err(warren_checkpoint::Error::NotFound(_))
    ));
}

#[test]
fn an_import_copies_only_the_chunks_a_checkpoint_needs_and_restores_from_its_new_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("tree");
    write(&root, "big.bin", &noise(2, 400_000));
    write(&root, "a.txt", b"kept");
    let (source, _) = local_store(&dir.path().join("source"));
    let (first, _) = source.take(&root, None).expect("takes");
    write(&root, "other.bin", &noise(3, 300_000));
    let (_second, _) = source.take(&root, Some(&first)).expect("takes again");
    let target_dir = dir.path().join("target");
    let (target, _) = local_store(&target_dir);
    let copied = target.import(&source, &first).expect("imports");
    assert!(
        (400_000..600_000).contains(&copied),
        "the first's chunks and root only, not other.bin's: {copied}"
    );
    let stored = chunk_bytes(&target_dir);
    let again = target.import(&source, &first).expect("imports again");
    assert!(
        again < 4096,
        "a second import copies only the root: {again}"
    );
    assert_eq!(chunk_bytes(&target_dir), stored, "no chunk written twice");
    let loaded = target.load(&first.id).expect("loads in the new store");
    let restored = dir.path().join("restored");
    target
        .restore(&loaded, &restored, None)
        .expect("restores from the new store");
    assert_eq!(
        std::fs::read(restored.join("big.bin")).expect("big"),
        noise(2, 400_000)
    );
    assert!(!restored.join("other.bin").exists());
}

/// The bytes of every chunk file in a store.
fn chunk_bytes(store_dir: &Path) -> u64 {
    chunk_files(store_dir)
        .iter()
        .map(|p| std::fs::metadata(p).expect("a chunk").len())
        .sum()
}

/// The ids a restore gives its entries in this test: `nobody` when the test runs as root
/// (CI does), else the process's own (the only ones an unprivileged process may give).
fn owner_for_test() -> (u32, u32) {
    if rustix::process::geteuid().is_root() {
        (65534, 65534)
    } else {
        (
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        )
    }
}

/// Every path beneath `root` with its owner, links not followed.
fn owners(root: &Path) -> Vec<(String, u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    super::walk(root)
        .into_iter()
        .map(|path| {
            let metadata = std::fs::symlink_metadata(&path).expect("stats");
            let shown = path
                .strip_prefix(root)
                .expect("beneath")
                .display()
                .to_string();
            (shown, metadata.uid(), metadata.gid())
        })
        .collect()
}

#[test]
fn a_restore_and_a_rewind_give_every_entry_they_write_to_the_owner_asked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, outside, target) = (
        dir.path().join("ws"),
        dir.path().join("outside"),
        dir.path().join("restored"),
    );
    varied_tree(&root, &outside);
    std::fs::remove_file(root.join("pipe")).expect("no FIFO in this tree");
    let (uid, gid) = owner_for_test();
    let store = warren_checkpoint::CheckpointStore::new(
        Arc::new(warren_checkpoint::LocalDisk::open(&dir.path().join("store")).expect("opens")),
        warren_checkpoint::Config {
            owner: Some((uid, gid)),
            ..warren_checkpoint::Config::default()
        },
    );
    let (first, _) = store.take(&root, None).expect("takes");
    let restored = store.restore(&first, &target, None).expect("restores");
    let owned = owners(&target);
    assert!(owned.len() > 5, "{owned:?}");
    for (path, entry_uid, entry_gid) in &owned {
        assert_eq!((*entry_uid, *entry_gid), (uid, gid), "{path}");
    }

    // A rewind over the restored tree: what it writes anew is the owner's too.
    write(&root, "new/dir/file.txt", b"made by a later turn\n");
    std::os::unix::fs::symlink("file.txt", root.join("new/dir/link")).expect("a link");
    let (second, _) = store.take(&root, Some(&first)).expect("takes again");
    store
        .restore(&second, &target, Some(&restored))
        .expect("rewinds");
    for path in ["new", "new/dir", "new/dir/file.txt", "new/dir/link"] {
        let metadata = std::fs::symlink_metadata(target.join(path)).expect("stats");
        use std::os::unix::fs::MetadataExt;
        assert_eq!((metadata.uid(), metadata.gid()), (uid, gid), "{path}");
    }
}
