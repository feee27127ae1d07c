//! A fork's restore (`restore_from`): files the source tree still holds unchanged are copied
//! from it, everything else comes from verified chunks, and the restore's rules (the owner,
//! all or nothing) hold for both.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use warren_checkpoint::{CheckpointStore, Config, Content, Error, LocalDisk, Manifest};

use super::{chunk_files, local_store, names, noise, tree, write};

/// A small tree: files of one and of several chunks, an empty file, nested directories with
/// modes, and a link.
fn source_tree(root: &Path) {
    write(root, "README.md", b"# the source session\n");
    write(root, "src/lib.rs", b"pub fn answer() -> u32 { 42 }\n");
    write(root, "data/blob.bin", &noise(5, 700 * 1024));
    write(root, "empty", b"");
    std::fs::set_permissions(root.join("src"), std::fs::Permissions::from_mode(0o750))
        .expect("chmod");
    std::fs::set_permissions(
        root.join("README.md"),
        std::fs::Permissions::from_mode(0o600),
    )
    .expect("chmod");
    std::os::unix::fs::symlink("src/lib.rs", root.join("lib-link")).expect("symlink");
}

/// Takes a checkpoint of `root` once every inode in it is older than the walk by the quick
/// check's margin (2 s): only then may a restore take the tree's files for the checkpoint's.
fn take_settled(store: &CheckpointStore, root: &Path) -> Manifest {
    let written = Instant::now();
    while written.elapsed() < Duration::from_millis(2_100) {
        std::thread::sleep(Duration::from_millis(100));
    }
    store.take(root, None).expect("takes").0
}

/// Removes every chunk file of the store: a restore that still succeeds copied every file.
fn remove_chunks(store_dir: &Path) {
    for chunk in chunk_files(store_dir) {
        std::fs::remove_file(chunk).expect("removes a chunk");
    }
}

fn chunks_of(manifest: &Manifest, path: &str) -> Vec<warren_checkpoint::ChunkId> {
    match manifest.entry(path).map(|e| &e.content) {
        Some(Content::File(chunks)) => chunks.iter().map(|c| c.id).collect(),
        other => panic!("{path} is not a file: {other:?}"),
    }
}

fn chunk_path(store_dir: &Path, id: &warren_checkpoint::ChunkId) -> std::path::PathBuf {
    let hex = id.to_hex();
    store_dir.join("chunks").join(&hex[..2]).join(&hex[2..])
}

#[test]
fn a_restore_from_a_source_that_still_holds_the_tree_gives_what_a_restore_gives() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("ws");
    source_tree(&root);
    let (store, _) = local_store(&dir.path().join("store"));
    let manifest = take_settled(&store, &root);

    let (restored, forked) = (dir.path().join("restored"), dir.path().join("forked"));
    store.restore(&manifest, &restored, None).expect("restores");
    let returned = store
        .restore_from(&manifest, &forked, Some(&root))
        .expect("restores from the source");
    assert_eq!(tree(&forked), tree(&restored));
    assert_eq!(tree(&forked), tree(&root));
    // The returned manifest is the next take's `previous`: it vouches for every file as is.
    let (_, stats) = store
        .take(&forked, Some(&returned))
        .expect("takes the fork");
    assert_eq!((stats.files_changed, stats.bytes_read), (0, 0), "{stats:?}");
}

#[test]
fn files_the_source_holds_unchanged_are_copied_without_reading_a_chunk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, store_dir) = (dir.path().join("ws"), dir.path().join("store"));
    source_tree(&root);
    let (store, _) = local_store(&store_dir);
    let manifest = take_settled(&store, &root);
    remove_chunks(&store_dir);

    let forked = dir.path().join("forked");
    store
        .restore_from(&manifest, &forked, Some(&root))
        .expect("every file copied from the source");
    assert_eq!(tree(&forked), tree(&root));
    let restored = store.restore(&manifest, &dir.path().join("restored"), None);
    assert!(
        matches!(restored, Err(Error::Missing { .. })),
        "{restored:?}"
    );
}

#[test]
fn a_source_file_changed_since_the_checkpoint_is_restored_from_its_chunks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, store_dir) = (dir.path().join("ws"), dir.path().join("store"));
    let original = noise(9, 200_000);
    for name in ["same-size", "grown", "replaced", "gone"] {
        write(&root, &format!("{name}.bin"), &original);
    }
    let (store, _) = local_store(&store_dir);
    let manifest = take_settled(&store, &root);
    let mtime_of = |name: &str| {
        std::fs::metadata(root.join(name))
            .and_then(|m| m.modified())
            .expect("an mtime")
    };
    let put_back = |name: &str, when| {
        std::fs::File::options()
            .write(true)
            .open(root.join(name))
            .and_then(|f| f.set_modified(when))
            .expect("puts the mtime back");
    };

    // The same size and mtime as recorded, the same inode: only the ctime tells.
    let when = mtime_of("same-size.bin");
    std::fs::write(root.join("same-size.bin"), noise(10, 200_000)).expect("rewrites");
    put_back("same-size.bin", when);
    let when = mtime_of("grown.bin");
    let mut grown = original.clone();
    grown.extend_from_slice(b"and more");
    std::fs::write(root.join("grown.bin"), &grown).expect("grows");
    put_back("grown.bin", when);
    // Another file with the content and the mtime: another inode.
    let when = mtime_of("replaced.bin");
    std::fs::remove_file(root.join("replaced.bin")).expect("removes");
    write(&root, "replaced.bin", &noise(11, 200_000));
    put_back("replaced.bin", when);
    std::fs::remove_file(root.join("gone.bin")).expect("removes");

    let forked = dir.path().join("forked");
    store
        .restore_from(&manifest, &forked, Some(&root))
        .expect("restores");
    for name in ["same-size.bin", "grown.bin", "replaced.bin", "gone.bin"] {
        assert_eq!(
            std::fs::read(forked.join(name)).expect("reads"),
            original,
            "{name} holds the checkpoint's content"
        );
    }
}

#[test]
fn a_source_reached_through_a_link_is_never_copied() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, outside, store_dir) = (
        dir.path().join("ws"),
        dir.path().join("outside"),
        dir.path().join("store"),
    );
    write(&root, "file.txt", b"the file itself\n");
    write(&root, "sub/inner.txt", b"a file in a directory\n");
    std::fs::create_dir_all(&outside).expect("mkdir");
    let (store, _) = local_store(&store_dir);
    let manifest = take_settled(&store, &root);
    // The very inodes (stat unchanged but for the ctime of a rename), now reached by a link
    // where the checkpoint has a file, and through a link where it has a directory.
    std::fs::rename(root.join("file.txt"), outside.join("file.txt")).expect("moves");
    std::os::unix::fs::symlink(outside.join("file.txt"), root.join("file.txt")).expect("link");
    std::fs::rename(root.join("sub"), outside.join("sub")).expect("moves");
    std::os::unix::fs::symlink(outside.join("sub"), root.join("sub")).expect("link");

    let forked = dir.path().join("forked");
    store
        .restore_from(&manifest, &forked, Some(&root))
        .expect("restores from chunks");
    assert_eq!(
        std::fs::read(forked.join("file.txt")).expect("reads"),
        b"the file itself\n"
    );
    assert!(
        std::fs::symlink_metadata(forked.join("sub"))
            .expect("stats")
            .is_dir()
    );
    // Without its chunks neither can be restored: neither was copied through the link.
    for path in ["file.txt", "sub/inner.txt"] {
        let again = dir.path().join("again");
        let chunks: Vec<_> = chunks_of(&manifest, path)
            .iter()
            .map(|id| chunk_path(&store_dir, id))
            .collect();
        let kept: Vec<Vec<u8>> = chunks
            .iter()
            .map(|chunk| std::fs::read(chunk).expect("reads the chunk"))
            .collect();
        for chunk in &chunks {
            std::fs::remove_file(chunk).expect("removes the chunk");
        }
        match store.restore_from(&manifest, &again, Some(&root)) {
            Err(Error::Missing { path: missing, .. }) => assert_eq!(missing, path),
            other => panic!("expected {path}'s chunk missing, got {other:?}"),
        }
        assert!(!again.exists(), "a failed fork leaves no target");
        for (chunk, stored) in chunks.iter().zip(&kept) {
            std::fs::write(chunk, stored).expect("puts the chunk back");
        }
    }
}

#[test]
fn a_missing_or_unusable_source_restores_every_file_from_chunks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("ws");
    source_tree(&root);
    let (store, _) = local_store(&dir.path().join("store"));
    let manifest = take_settled(&store, &root);
    let expected = tree(&root);
    let file_instead = dir.path().join("a-file");
    std::fs::write(&file_instead, b"not a directory").expect("writes");
    for (n, source) in [
        None,
        Some(dir.path().join("nowhere")),
        Some(file_instead.clone()),
    ]
    .into_iter()
    .enumerate()
    {
        let forked = dir.path().join(format!("forked-{n}"));
        store
            .restore_from(&manifest, &forked, source.as_deref())
            .expect("restores from chunks");
        assert_eq!(tree(&forked), expected, "{source:?}");
    }
}

#[test]
fn copied_files_belong_to_the_owner_asked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, store_dir) = (dir.path().join("ws"), dir.path().join("store"));
    source_tree(&root);
    let (uid, gid) = if rustix::process::geteuid().is_root() {
        (65534, 65534)
    } else {
        (
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        )
    };
    let store = CheckpointStore::new(
        Arc::new(LocalDisk::open(&store_dir).expect("opens")),
        Config {
            owner: Some((uid, gid)),
            ..Config::default()
        },
    );
    let manifest = take_settled(&store, &root);
    remove_chunks(&store_dir);

    let forked = dir.path().join("forked");
    store
        .restore_from(&manifest, &forked, Some(&root))
        .expect("every file copied");
    let mut n_checked = 0;
    for path in super::walk(&forked) {
        let metadata = std::fs::symlink_metadata(&path).expect("stats");
        assert_eq!((metadata.uid(), metadata.gid()), (uid, gid), "{path:?}");
        n_checked += 1;
    }
    assert_eq!(n_checked, tree(&root).len());
}

#[test]
fn a_broken_chunk_of_a_changed_file_fails_the_whole_fork_and_leaves_the_target_as_it_was() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, store_dir, target) = (
        dir.path().join("ws"),
        dir.path().join("store"),
        dir.path().join("target"),
    );
    source_tree(&root);
    write(&root, "changed.txt", b"what the checkpoint holds\n");
    let (store, _) = local_store(&store_dir);
    let manifest = take_settled(&store, &root);
    write(&root, "changed.txt", b"written after the checkpoint\n");
    let rotten = chunks_of(&manifest, "changed.txt")[0];
    std::fs::write(chunk_path(&store_dir, &rotten), b"garbage").expect("breaks the chunk");
    write(&target, "old.txt", b"what the target held\n");
    let before = tree(&target);

    match store.restore_from(&manifest, &target, Some(&root)) {
        Err(Error::Broken { path, chunk }) => {
            assert_eq!((path.as_str(), chunk), ("changed.txt", rotten.to_hex()));
        }
        other => panic!("expected a broken chunk, got {other:?}"),
    }
    assert_eq!(tree(&target), before, "the target is as it was");
    assert_eq!(
        names(dir.path()),
        ["store", "target", "ws"],
        "no staging left"
    );
}
