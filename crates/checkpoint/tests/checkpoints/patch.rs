//! Patches, a rewind of a tree on another machine: `CheckpointStore::patch` made against the
//! checkpoint of the tree as it is now and `apply_patch` over that tree end exactly at the
//! earlier checkpoint, carrying only what changed; a broken store fails the patch; a cut,
//! corrupt or stale patch changes nothing; unchanged files keep their inodes; the staging
//! directory never stays.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use warren_checkpoint::{ApplyStats, CheckpointStore, Content, Error, Manifest, apply_patch};

use super::{age, local_store, names, noise, tree, write};

/// A tree with what a session changes between turns: files kept, changed and removed, a
/// directory removed, kinds swapped, a link retargeted, modes changed, and a megabyte that
/// stays.
fn before_tree(root: &Path) {
    write(root, "kept.txt", b"never changes\n");
    write(root, "big.bin", &noise(7, 1 << 20));
    write(root, "src/main.rs", b"fn main() { println!(\"a\"); }\n");
    write(root, "src/kept.rs", b"// kept\n");
    write(root, "removed.txt", b"the agent deletes this\n");
    write(root, "removed-dir/a.txt", b"a\n");
    write(root, "removed-dir/deeper/b.txt", b"b\n");
    write(root, "file-then-link", b"a file first\n");
    write(root, "dir-then-file/inner.txt", b"inside\n");
    write(root, "file-then-dir", b"a file first, then a directory\n");
    write(root, "mode.sh", b"#!/bin/sh\necho hi\n");
    write(root, "private/notes.txt", b"notes\n");
    std::os::unix::fs::symlink("kept.txt", root.join("link")).expect("symlink");
    std::fs::set_permissions(root.join("private"), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
}

/// What the agent did after the checkpoint `before_tree` was taken in.
fn change_tree(root: &Path) {
    // Another length: `age` gives both the same mtime, and the quick check trusts the stat.
    write(root, "src/main.rs", b"fn main() { println!(\"bb\"); }\n");
    write(root, "added.txt", b"new\n");
    write(root, "added-dir/x/y.txt", b"new and deep\n");
    std::fs::remove_file(root.join("removed.txt")).expect("rm");
    std::fs::remove_dir_all(root.join("removed-dir")).expect("rm -r");
    std::fs::remove_file(root.join("file-then-link")).expect("rm");
    std::os::unix::fs::symlink("/etc", root.join("file-then-link")).expect("symlink");
    std::fs::remove_dir_all(root.join("dir-then-file")).expect("rm -r");
    write(root, "dir-then-file", b"a file now\n");
    std::fs::remove_file(root.join("file-then-dir")).expect("rm");
    write(root, "file-then-dir/z.txt", b"in a dir now\n");
    std::fs::set_permissions(root.join("mode.sh"), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    std::fs::set_permissions(root.join("private"), std::fs::Permissions::from_mode(0o700))
        .expect("chmod");
    std::fs::remove_file(root.join("link")).expect("rm");
    std::os::unix::fs::symlink("src/main.rs", root.join("link")).expect("symlink");
}

/// A store in `dir/store`, the tree `dir/ws` taken as `before` (A), changed and taken as
/// `current` (B).
fn a_and_b(dir: &Path) -> (CheckpointStore, Manifest, Manifest) {
    let root = dir.join("ws");
    before_tree(&root);
    age(&root);
    let (store, _) = local_store(&dir.join("store"));
    let (before, _) = store.take(&root, None).expect("takes A");
    change_tree(&root);
    age(&root);
    let (current, _) = store.take(&root, Some(&before)).expect("takes B");
    (store, before, current)
}

fn patch_bytes(store: &CheckpointStore, target: &Manifest, current: &Manifest) -> Vec<u8> {
    let mut out = Vec::new();
    store
        .patch(target, current, &mut out)
        .expect("makes the patch");
    out
}

fn apply(root: &Path, patch: &[u8]) -> Result<ApplyStats, Error> {
    apply_patch(root, &mut &patch[..], None)
}

/// True when no staging directory is left in `root` (its name is not UTF-8, so it shows with
/// a replacement character).
fn no_staging(root: &Path) -> bool {
    !names(root)
        .iter()
        .any(|name| name.starts_with(".warren-patch"))
}

#[test]
fn a_patch_against_the_current_checkpoint_ends_exactly_at_the_earlier_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, before, current) = a_and_b(dir.path());
    let root = dir.path().join("ws");
    let patch = patch_bytes(&store, &before, &current);

    let applied = apply(&root, &patch).expect("applies");

    let expected = dir.path().join("expected");
    store.restore(&before, &expected, None).expect("restores A");
    assert_eq!(tree(&root), tree(&expected));
    assert!(no_staging(&root));
    // Removed: what B has and A lacks (added.txt; added-dir, x and y.txt), the file where A
    // has a directory, and the directory and its file where A has a file.
    assert_eq!(applied.removed, 7, "{applied:?}");
}

#[test]
fn only_the_content_of_files_that_differ_from_the_current_checkpoint_is_sent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, before, current) = a_and_b(dir.path());
    let mut patch = Vec::new();
    let stats = store
        .patch(&before, &current, &mut patch)
        .expect("makes the patch");

    let sent = [
        "src/main.rs",
        "removed.txt",
        "removed-dir/a.txt",
        "removed-dir/deeper/b.txt",
        "file-then-link",
        "dir-then-file/inner.txt",
        "file-then-dir",
    ];
    let sent_bytes: u64 = sent
        .iter()
        .map(|path| before.entry(path).expect("in A").size)
        .sum();
    assert_eq!(stats.n_files_sent, sent.len() as u64);
    assert_eq!(stats.bytes_sent, sent_bytes);
    assert_eq!(stats.n_entries, before.entries.len() as u64);
    // The megabyte that stayed is not in it: the patch is its listing and the changed bytes.
    assert!(
        (patch.len() as u64) < sent_bytes + 2048,
        "{} bytes for {sent_bytes} changed",
        patch.len()
    );

    let applied = apply(&dir.path().join("ws"), &patch).expect("applies");
    assert_eq!(
        (applied.files_written, applied.bytes_written),
        (stats.n_files_sent, stats.bytes_sent)
    );
}

#[test]
fn unchanged_files_and_directories_in_both_keep_their_inodes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, before, current) = a_and_b(dir.path());
    let root = dir.path().join("ws");
    let ino = |path: &str| {
        std::fs::symlink_metadata(root.join(path))
            .expect("stats")
            .ino()
    };
    let kept = [
        "kept.txt",
        "big.bin",
        "src",
        "src/kept.rs",
        "private",
        "mode.sh",
    ];
    let inodes: Vec<u64> = kept.iter().map(|path| ino(path)).collect();
    // A process holding a kept file open keeps reading the same file.
    let open = std::fs::File::open(root.join("kept.txt")).expect("opens");

    apply(&root, &patch_bytes(&store, &before, &current)).expect("applies");

    let after: Vec<u64> = kept.iter().map(|path| ino(path)).collect();
    assert_eq!(after, inodes);
    assert_eq!(open.metadata().expect("stats").nlink(), 1, "still linked");
    // And mode.sh and private got A's modes back in place.
    let mode = |path: &str| {
        std::fs::symlink_metadata(root.join(path))
            .expect("stats")
            .mode()
            & 0o777
    };
    assert_eq!((mode("mode.sh"), mode("private")), (0o644, 0o755));
}

#[test]
fn a_broken_or_missing_chunk_fails_the_patch_and_what_it_wrote_applies_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, before, current) = a_and_b(dir.path());
    let root = dir.path().join("ws");
    let store_dir = dir.path().join("store");
    let Some(Content::File(chunks)) = before.entry("src/main.rs").map(|e| &e.content) else {
        panic!("a file");
    };
    let hex = chunks[0].id.to_hex();
    let chunk_file = store_dir.join("chunks").join(&hex[..2]).join(&hex[2..]);
    let now = tree(&root);

    std::fs::write(&chunk_file, b"rot").expect("corrupts");
    let mut cut = Vec::new();
    match store.patch(&before, &current, &mut cut) {
        Err(Error::Broken { path, chunk }) => {
            assert_eq!((path.as_str(), chunk), ("src/main.rs", hex.clone()))
        }
        other => panic!("expected a broken chunk, got {other:?}"),
    }
    assert!(matches!(apply(&root, &cut), Err(Error::Corrupt(_))));
    assert_eq!(tree(&root), now, "the tree is as it was");
    assert!(no_staging(&root));

    std::fs::remove_file(&chunk_file).expect("loses the chunk");
    let mut cut = Vec::new();
    let made = store.patch(&before, &current, &mut cut);
    assert!(
        matches!(made, Err(Error::Missing { ref path, .. }) if path == "src/main.rs"),
        "{made:?}"
    );
    assert!(matches!(apply(&root, &cut), Err(Error::Corrupt(_))));
    assert_eq!(tree(&root), now, "the tree is as it was");
    assert!(no_staging(&root));
}

#[test]
fn a_cut_or_corrupt_patch_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, before, current) = a_and_b(dir.path());
    let root = dir.path().join("ws");
    let patch = patch_bytes(&store, &before, &current);
    let now = tree(&root);

    let content = b"fn main() { println!(\"a\"); }\n";
    let at = patch
        .windows(content.len())
        .position(|window| window == content)
        .expect("the changed file's content is in the patch");
    let flipped = |index: usize| {
        let mut patch = patch.clone();
        patch[index] ^= 0x01;
        patch
    };
    let mut trailing = patch.clone();
    trailing.push(0);
    let mut cases: Vec<(String, Vec<u8>)> =
        [0, 4, 8, 9, 100, at + 3, patch.len() - 17, patch.len() - 1]
            .iter()
            .map(|n| (format!("cut at {n}"), patch[..*n].to_vec()))
            .collect();
    cases.extend([
        ("a content byte flipped".to_owned(), flipped(at + 3)),
        ("the magic flipped".to_owned(), flipped(0)),
        ("the first tag flipped".to_owned(), flipped(8)),
        (
            "the end record's count flipped".to_owned(),
            flipped(patch.len() - 16),
        ),
        ("a byte after the end".to_owned(), trailing),
    ]);
    for (what, bytes) in cases {
        let applied = apply(&root, &bytes);
        assert!(
            matches!(applied, Err(Error::Corrupt(_))),
            "{what}: {applied:?}"
        );
        assert_eq!(tree(&root), now, "{what}: the tree is as it was");
        assert!(no_staging(&root), "{what}");
    }
}

#[test]
fn a_patch_over_a_tree_that_changed_since_the_current_checkpoint_is_refused_unapplied() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, before, current) = a_and_b(dir.path());
    let root = dir.path().join("ws");
    let patch = patch_bytes(&store, &before, &current);
    // A file the patch keeps, gone and then grown since B was taken.
    std::fs::remove_file(root.join("kept.txt")).expect("rm");
    let now = tree(&root);
    let applied = apply(&root, &patch);
    assert!(matches!(applied, Err(Error::Invalid(_))), "{applied:?}");
    assert_eq!(tree(&root), now);
    write(&root, "kept.txt", b"never changes... until now\n");
    let now = tree(&root);
    let applied = apply(&root, &patch);
    assert!(matches!(applied, Err(Error::Invalid(_))), "{applied:?}");
    assert_eq!(tree(&root), now);
    assert!(no_staging(&root));
}

#[test]
fn a_patch_that_changes_nothing_touches_nothing_but_times() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("ws");
    before_tree(&root);
    age(&root);
    let (store, _) = local_store(&dir.path().join("store"));
    let (taken, _) = store.take(&root, None).expect("takes");
    let now = tree(&root);
    let mut patch = Vec::new();
    let stats = store.patch(&taken, &taken, &mut patch).expect("patches");
    assert_eq!((stats.n_files_sent, stats.bytes_sent), (0, 0));
    let applied = apply(&root, &patch).expect("applies");
    assert_eq!(applied, ApplyStats::default());
    assert_eq!(tree(&root), now);
    assert!(no_staging(&root));
}
