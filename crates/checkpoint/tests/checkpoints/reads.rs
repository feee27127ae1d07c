//! Reading a checkpoint without restoring it: ranges across chunk boundaries, listings by
//! depth, and diffs between two checkpoints.

use warren_checkpoint::{Content, Modified};

use super::{local_store, noise, write};

#[test]
fn any_range_of_a_file_reads_exactly_those_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("ws");
    let content = noise(9, 700_000);
    write(&root, "f.bin", &content);
    write(&root, "empty", b"");
    let (store, _) = local_store(&dir.path().join("store"));
    let (manifest, _) = store.take(&root, None).expect("takes");
    let Some(Content::File(chunks)) = manifest.entry("f.bin").map(|e| &e.content) else {
        panic!("a file");
    };
    assert!(chunks.len() > 3, "several chunks");
    let first_cut = u64::from(chunks[0].len);
    let n = content.len() as u64;
    for range in [
        0..n,
        0..1,
        first_cut - 3..first_cut + 3,
        first_cut..first_cut,
        n - 1..n,
        12_345..654_321,
    ] {
        let mut out = Vec::new();
        let written = store
            .read_file(&manifest, "f.bin", range.clone(), &mut out)
            .expect("reads");
        let expected = &content[range.start as usize..range.end as usize];
        assert_eq!(written, expected.len() as u64, "{range:?}");
        assert!(out == expected, "{range:?}");
    }
    let mut out = Vec::new();
    assert_eq!(
        store
            .read_file(&manifest, "empty", 0..0, &mut out)
            .expect("reads"),
        0
    );
}

#[test]
fn a_listing_holds_the_entries_beneath_a_directory_to_the_depth_asked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("ws");
    for path in [
        "a/x.txt",
        "a/b/y.txt",
        "a/b/c/z.txt",
        "a-sibling.txt",
        "top.txt",
    ] {
        write(&root, path, b"x");
    }
    let (store, _) = local_store(&dir.path().join("store"));
    let (manifest, _) = store.take(&root, None).expect("takes");
    let paths = |dir: &str, depth| -> Vec<String> {
        store
            .list(&manifest, dir, depth)
            .expect("lists")
            .iter()
            .map(|e| e.path.clone())
            .collect()
    };
    assert_eq!(paths("", 1), ["a", "a-sibling.txt", "top.txt"]);
    assert_eq!(paths("a", 1), ["a/b", "a/x.txt"]);
    assert_eq!(paths("a", 2), ["a/b", "a/b/c", "a/b/y.txt", "a/x.txt"]);
    assert_eq!(paths("a/b/c", 5), ["a/b/c/z.txt"]);
}

#[test]
fn a_diff_lists_added_removed_and_modified_with_a_unified_diff_for_text() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("ws");
    write(&root, "notes.txt", b"one\ntwo\nthree\n");
    write(&root, "image.bin", &[0u8, 1, 2, 3]);
    write(&root, "removed.txt", b"bye\n");
    write(&root, "big.txt", &b"line\n".repeat(300_000));
    let (store, _) = local_store(&dir.path().join("store"));
    let (old, _) = store.take(&root, None).expect("takes");

    write(&root, "notes.txt", b"one\n2\nthree\n");
    write(&root, "image.bin", &[0u8, 9, 9, 3]);
    std::fs::remove_file(root.join("removed.txt")).expect("removes");
    write(&root, "added/new.txt", b"hi\n");
    write(&root, "big.txt", &b"line\n".repeat(300_001));
    let (new, _) = store.take(&root, Some(&old)).expect("takes again");

    let diff = store.diff(&old, &new).expect("diffs");
    assert_eq!(diff.added, ["added", "added/new.txt"]);
    assert_eq!(diff.removed, ["removed.txt"]);
    let expected = vec![
        Modified {
            path: "big.txt".to_owned(),
            old_size: 1_500_000,
            new_size: 1_500_005,
            binary: false,
            diff: None,
        },
        Modified {
            path: "image.bin".to_owned(),
            old_size: 4,
            new_size: 4,
            binary: true,
            diff: None,
        },
        Modified {
            path: "notes.txt".to_owned(),
            old_size: 14,
            new_size: 12,
            binary: false,
            diff: Some(
                "--- a/notes.txt\n+++ b/notes.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+2\n three\n"
                    .to_owned(),
            ),
        },
    ];
    assert_eq!(diff.modified, expected);
}

#[test]
fn an_export_is_a_tar_of_the_tree_and_a_broken_chunk_cuts_it() {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("ws");
    let big = noise(4, 900_000);
    write(&root, "a/b/big.bin", &big);
    write(&root, "a/small.txt", b"small\n");
    write(&root, "empty", b"");
    let long = format!("{}/deep.txt", "n".repeat(120));
    write(&root, &long, b"a path over 100 bytes\n");
    std::fs::set_permissions(
        root.join("a/small.txt"),
        std::fs::Permissions::from_mode(0o640),
    )
    .expect("chmod");
    std::os::unix::fs::symlink("a/small.txt", root.join("link")).expect("a link");
    let (store, _) = local_store(&dir.path().join("store"));
    let (manifest, _) = store.take(&root, None).expect("takes");

    let mut exported = Vec::new();
    store.export(&manifest, &mut exported).expect("exports");
    let tarred = zstd::decode_all(&exported[..]).expect("zstd");
    let mut archive = tar::Archive::new(&tarred[..]);
    let mut seen = Vec::new();
    for entry in archive.entries().expect("a tar") {
        let mut entry = entry.expect("an entry");
        let path = entry.path().expect("a path").to_string_lossy().into_owned();
        let kind = entry.header().entry_type();
        let mode = entry.header().mode().expect("a mode");
        let link = entry
            .link_name()
            .expect("a link name")
            .map(|l| l.to_string_lossy().into_owned());
        let mut content = Vec::new();
        entry.read_to_end(&mut content).expect("the content");
        seen.push((path, kind, mode, link, content));
    }
    let find = |path: &str| {
        seen.iter()
            .find(|(p, ..)| p.trim_end_matches('/') == path)
            .unwrap_or_else(|| {
                panic!(
                    "{path} in the export: {:?}",
                    seen.iter().map(|s| &s.0).collect::<Vec<_>>()
                )
            })
    };
    assert_eq!(seen.len(), manifest.entries.len(), "every entry once");
    assert_eq!(find("a/b/big.bin").4, big);
    assert_eq!(find("a/small.txt").2 & 0o777, 0o640);
    assert_eq!(find(&long).4, b"a path over 100 bytes\n");
    assert_eq!(find("empty").4, b"");
    assert_eq!(find("a/b").1, tar::EntryType::Directory);
    assert_eq!(find("link").1, tar::EntryType::Symlink);
    assert_eq!(find("link").3.as_deref(), Some("a/small.txt"));

    // A chunk of big.bin rotted: the export fails naming it, part way.
    let Some(Content::File(chunks)) = manifest.entry("a/b/big.bin").map(|e| &e.content) else {
        panic!("a file");
    };
    let hex = chunks[1].id.to_hex();
    std::fs::write(
        dir.path()
            .join("store/chunks")
            .join(&hex[..2])
            .join(&hex[2..]),
        b"rot",
    )
    .expect("corrupts a chunk");
    let mut cut = Vec::new();
    let error = store
        .export(&manifest, &mut cut)
        .expect_err("a broken chunk");
    assert!(error.to_string().contains("checkpoint broken"), "{error}");
    assert!(cut.len() < exported.len(), "cut, not ended");
}
