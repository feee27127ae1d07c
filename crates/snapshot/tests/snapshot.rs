//! `warren-snapshot` against real trees and hand-built hostile archives: every refusal rule of
//! `unpack` (each leaving the root empty), `pack` over a tree with FIFOs, sockets, link loops
//! and changing files, `list` and `read_file` with ranges and hard links, and a property test
//! that pack → unpack is the identity on random trees.

use std::collections::BTreeMap;
use std::io::{Cursor, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use proptest::prelude::*;
use sha2::{Digest, Sha256};
use tar::{EntryType, Header};
use warren_snapshot::{
    EntryKind, SnapshotError, UnpackLimits, UnpackStats, list, pack, read_file, unpack,
};

/// One entry of a hand-built archive: written with raw header bytes, so `tar::Builder`'s own
/// path checks cannot stop a hostile name.
struct Raw {
    kind: EntryType,
    path: &'static str,
    link: Option<&'static str>,
    data: &'static [u8],
    /// The size the header claims, if not `data`'s length.
    claimed_size: Option<u64>,
}

fn file(path: &'static str, data: &'static [u8]) -> Raw {
    Raw {
        kind: EntryType::Regular,
        path,
        link: None,
        data,
        claimed_size: None,
    }
}

fn dir(path: &'static str) -> Raw {
    Raw {
        kind: EntryType::Directory,
        path,
        link: None,
        data: b"",
        claimed_size: None,
    }
}

fn symlink(path: &'static str, target: &'static str) -> Raw {
    Raw {
        kind: EntryType::Symlink,
        path,
        link: Some(target),
        data: b"",
        claimed_size: None,
    }
}

fn hard_link(path: &'static str, target: &'static str) -> Raw {
    Raw {
        kind: EntryType::Link,
        path,
        link: Some(target),
        data: b"",
        claimed_size: None,
    }
}

fn special(kind: EntryType, path: &'static str) -> Raw {
    Raw {
        kind,
        path,
        link: None,
        data: b"",
        claimed_size: None,
    }
}

/// The uncompressed tar of `entries`.
fn raw_tar(entries: &[Raw]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        let mut header = Header::new_gnu();
        header.set_entry_type(entry.kind);
        header.set_mode(if entry.kind == EntryType::Directory {
            0o755
        } else {
            0o644
        });
        header.set_mtime(1_700_000_000);
        header.set_size(entry.claimed_size.unwrap_or(entry.data.len() as u64));
        let gnu = header.as_gnu_mut().expect("a GNU header");
        gnu.name[..entry.path.len()].copy_from_slice(entry.path.as_bytes());
        if entry.kind == EntryType::GNUSparse {
            gnu.set_real_size(0);
        }
        if let Some(link) = entry.link {
            gnu.linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        header.set_cksum();
        builder.append(&header, entry.data).expect("appends");
    }
    builder.into_inner().expect("finishes")
}

fn zstd_bytes(tar: &[u8]) -> Vec<u8> {
    zstd_compress(tar)
}

fn zstd_compress(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = zstd::stream::Encoder::new(Vec::new(), 3).expect("encoder");
    encoder.write_all(bytes).expect("compresses");
    encoder.finish().expect("finishes")
}

fn is_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).expect("lists").next().is_none()
}

/// `unpack` of `archive` into `root` with the default limits.
fn unpack_default(archive: &[u8], root: &Path) -> Result<UnpackStats, SnapshotError> {
    unpack(Cursor::new(archive), root, &UnpackLimits::default())
}

/// A new temporary directory that `archive` was unpacked into (`what` says why it must unpack).
fn restored(archive: &[u8], what: &str) -> tempfile::TempDir {
    let restored = tempfile::tempdir().expect("tempdir");
    unpack_default(archive, restored.path()).expect(what);
    restored
}

/// Asserts that unpacking `archive` into the empty `root` is refused as `expected` and leaves
/// `root` empty.
#[track_caller]
fn assert_refused(archive: &[u8], root: &Path, expected: Expected, what: &str) {
    let error = unpack_default(archive, root).expect_err(what);
    assert_eq!(kind_of(&error), Some(expected), "{what}: {error}");
    assert!(is_empty(root), "{what}: root not empty after {error}");
}

#[derive(Debug, PartialEq, Eq)]
enum Expected {
    Unsafe,
    TooLarge,
    Corrupt,
}

fn kind_of(error: &SnapshotError) -> Option<Expected> {
    match error {
        SnapshotError::Unsafe { .. } => Some(Expected::Unsafe),
        SnapshotError::TooLarge { .. } => Some(Expected::TooLarge),
        SnapshotError::Corrupt(_) => Some(Expected::Corrupt),
        _ => None,
    }
}

#[test]
fn every_hostile_archive_is_refused_and_leaves_the_root_empty() {
    use Expected::*;
    // Each starts with harmless entries (a read-only directory among them), so the cleanup has
    // something to remove.
    let prefix = || vec![dir("ro"), file("ro/kept", b"ok"), file("a.txt", b"hello")];
    let unsafe_cases: Vec<(&str, Vec<Raw>)> = vec![
        ("parent component", vec![file("../x", b"x")]),
        ("parent inside", vec![file("a/../../x", b"x")]),
        ("absolute path", vec![file("/etc/x", b"x")]),
        ("symlink to the root", vec![symlink("l", "/")]),
        (
            "symlink to an absolute file",
            vec![symlink("l", "/etc/passwd")],
        ),
        ("symlink climbing out", vec![symlink("l", "a/../../x")]),
        (
            "nested symlink climbing out",
            vec![symlink("d/l", "../../x")],
        ),
        (
            "hard link to an absolute path",
            vec![hard_link("h", "/etc/passwd")],
        ),
        ("hard link climbing out", vec![hard_link("h", "../x")]),
        (
            "hard link to a later entry",
            vec![hard_link("h", "later"), file("later", b"x")],
        ),
        ("hard link to a directory", vec![hard_link("h", "ro")]),
        (
            "hard link to a symlink",
            vec![symlink("s", "a.txt"), hard_link("h", "s")],
        ),
        (
            "write through a symlink",
            vec![dir("sub"), symlink("link", "sub"), file("link/x", b"x")],
        ),
        (
            "dir through a symlink",
            vec![symlink("link", "."), dir("link/d")],
        ),
        (
            "file over a symlink",
            vec![symlink("s", "a.txt"), file("s", b"x")],
        ),
        ("duplicate file", vec![file("a.txt", b"again")]),
        ("char device", vec![special(EntryType::Char, "tty")]),
        ("block device", vec![special(EntryType::Block, "sda")]),
        ("fifo", vec![special(EntryType::Fifo, "pipe")]),
        ("gnu sparse", vec![special(EntryType::GNUSparse, "sparse")]),
    ];
    let too_large = Raw {
        claimed_size: Some(10_000_000_000),
        ..file("big", b"few bytes")
    };
    let cases = unsafe_cases
        .into_iter()
        .map(|(name, hostile)| (name, hostile, Unsafe))
        .chain([("10 GB size claim", vec![too_large], TooLarge)]);
    for (name, hostile, expected) in cases {
        let mut entries = prefix();
        entries.extend(hostile);
        let archive = zstd_bytes(&raw_tar(&entries));
        let root = tempfile::tempdir().expect("tempdir");
        assert_refused(&archive, root.path(), expected, name);
    }
}

#[test]
fn a_symlink_chained_through_another_symlink_out_of_the_root_is_refused() {
    // Each link alone stays inside the root when read lexically; followed, `x` is the root's
    // parent. Both orders, since a later link can turn an earlier one into an escape.
    let chains: [Vec<Raw>; 3] = [
        vec![dir("d"), symlink("d/l", ".."), symlink("x", "d/l/..")],
        vec![dir("d"), symlink("x", "d/l/.."), symlink("d/l", "..")],
        vec![
            dir("e"),
            dir("e/f"),
            symlink("d", "e/f"),
            symlink("e/f/l", "../.."),
            symlink("x", "d/l/../.."),
        ],
    ];
    for entries in chains {
        let archive = zstd_bytes(&raw_tar(&entries));
        let root = tempfile::tempdir().expect("tempdir");
        let what = "a chained escape is refused";
        assert_refused(&archive, root.path(), Expected::Unsafe, what);
    }
    // Chains that stay inside still unpack.
    let inside = vec![dir("d"), symlink("d/l", ".."), symlink("x", "d/l/d")];
    restored(
        &zstd_bytes(&raw_tar(&inside)),
        "a chain that stays inside unpacks",
    );
}

#[test]
fn truncated_and_garbage_streams_are_corrupt_and_leave_the_root_empty() {
    let source = tempfile::tempdir().expect("tempdir");
    for i in 0..50 {
        std::fs::write(
            source.path().join(format!("f{i}")),
            format!("{i}").repeat(5000),
        )
        .expect("writes");
    }
    let mut archive = Vec::new();
    pack(source.path(), &mut archive).expect("packs");
    let cases: Vec<(String, Vec<u8>)> = vec![
        ("empty".into(), Vec::new()),
        (
            "garbage".into(),
            b"this is not a snapshot at all".repeat(40),
        ),
        ("zstd of garbage".into(), zstd_compress(&[0x5a; 4096])),
        (
            "cut at a quarter".into(),
            archive[..archive.len() / 4].to_vec(),
        ),
        ("cut at half".into(), archive[..archive.len() / 2].to_vec()),
        (
            "cut before the end".into(),
            archive[..archive.len() - 1].to_vec(),
        ),
    ];
    for (name, bytes) in cases {
        let root = tempfile::tempdir().expect("tempdir");
        assert_refused(&bytes, root.path(), Expected::Corrupt, &name);
    }
}

#[test]
fn a_non_empty_root_is_refused_and_left_as_it_was() {
    let archive = zstd_bytes(&raw_tar(&[file("a", b"a")]));
    let root = tempfile::tempdir().expect("tempdir");
    std::fs::write(root.path().join("mine"), "keep").expect("writes");
    let error = unpack_default(&archive, root.path()).expect_err("non-empty root");
    assert!(matches!(error, SnapshotError::NotEmpty), "{error}");
    assert_eq!(
        std::fs::read_to_string(root.path().join("mine")).expect("reads"),
        "keep"
    );
    assert!(!root.path().join("a").exists());
}

#[test]
fn limits_count_declared_bytes_and_entries() {
    let archive = zstd_bytes(&raw_tar(&[file("a", b"12345"), file("b", b"67890")]));
    let cases = [
        (
            UnpackLimits {
                max_bytes: 10,
                max_entries: 2,
            },
            true,
        ),
        (
            UnpackLimits {
                max_bytes: 9,
                max_entries: 2,
            },
            false,
        ),
        (
            UnpackLimits {
                max_bytes: 10,
                max_entries: 1,
            },
            false,
        ),
    ];
    for (limits, fits) in cases {
        let root = tempfile::tempdir().expect("tempdir");
        let result = unpack(Cursor::new(archive.clone()), root.path(), &limits);
        match (result, fits) {
            (Ok(stats), true) => assert_eq!((stats.n_files, stats.bytes), (2, 10)),
            (Err(SnapshotError::TooLarge { .. }), false) => assert!(is_empty(root.path())),
            (other, _) => panic!("{limits:?}: {other:?}"),
        }
    }
}

#[test]
fn unpack_strips_setuid_and_keeps_mtimes_and_readonly_directories() {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = Header::new_gnu();
    header.set_entry_type(EntryType::Directory);
    header.set_mode(0o555);
    header.set_mtime(1_600_000_000);
    header.set_size(0);
    builder
        .append_data(&mut header, "ro", std::io::empty())
        .expect("dir");
    let mut header = Header::new_gnu();
    header.set_mode(0o4755);
    header.set_mtime(1_500_000_000);
    header.set_size(2);
    builder
        .append_data(&mut header, "ro/tool", &b"#!"[..])
        .expect("file");
    let archive = zstd_bytes(&builder.into_inner().expect("finishes"));
    let root = restored(&archive, "unpacks");
    let tool = std::fs::metadata(root.path().join("ro/tool")).expect("tool");
    assert_eq!(tool.mode() & 0o7777, 0o755);
    assert_eq!(tool.mtime(), 1_500_000_000);
    let ro = std::fs::metadata(root.path().join("ro")).expect("ro");
    assert_eq!(ro.mode() & 0o7777, 0o555);
    assert_eq!(ro.mtime(), 1_600_000_000);
}

#[test]
fn pack_skips_fifos_and_sockets_and_stores_link_loops_as_links() {
    let source = tempfile::tempdir().expect("tempdir");
    let root = source.path();
    std::fs::write(root.join("plain"), "content").expect("writes");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        root.join("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .expect("mkfifo");
    let _socket = std::os::unix::net::UnixListener::bind(root.join("sock")).expect("binds");
    std::os::unix::fs::symlink("b", root.join("a")).expect("a -> b");
    std::os::unix::fs::symlink("a", root.join("b")).expect("b -> a");
    std::os::unix::fs::symlink(".", root.join("self")).expect("self -> .");
    std::fs::create_dir(root.join("empty")).expect("mkdir");
    // Mode 000: as root it is still readable (stored); as anyone else it is skipped.
    std::fs::write(root.join("locked"), "secret").expect("writes");
    std::fs::set_permissions(root.join("locked"), std::fs::Permissions::from_mode(0o000))
        .expect("chmod");

    let mut archive = Vec::new();
    let stats = pack(root, &mut archive).expect("packs");
    assert_eq!(stats.n_dirs, 1);
    assert_eq!(stats.n_links, 3);
    assert_eq!(stats.n_files + stats.n_skipped, 2 + 2, "{stats:?}");
    let entries = list(Cursor::new(&archive)).expect("lists");
    let paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
    assert!(
        !paths.contains(&"fifo") && !paths.contains(&"sock"),
        "{paths:?}"
    );
    let a = entries.iter().find(|e| e.path == "a").expect("a listed");
    assert_eq!(
        (a.kind, a.link_target.as_deref()),
        (EntryKind::Symlink, Some("b"))
    );

    let restored = restored(&archive, "unpacks");
    assert_eq!(
        std::fs::read_link(restored.path().join("b")).expect("b"),
        Path::new("a")
    );
    assert!(restored.path().join("empty").is_dir());
}

/// A live tree may hold links `unpack` refuses (a venv's `bin/python -> /usr/bin/python3`,
/// `../../outside`): `pack` skips them and counts them, so the archive restores whole.
#[test]
fn pack_skips_links_out_of_the_tree_so_every_archive_restores() {
    let source = tempfile::tempdir().expect("tempdir");
    let root = source.path();
    std::fs::create_dir_all(root.join("venv/bin")).expect("mkdir");
    std::os::unix::fs::symlink("/usr/bin/python3", root.join("venv/bin/python")).expect("abs");
    std::os::unix::fs::symlink("../../../outside", root.join("venv/bin/up")).expect("up");
    std::os::unix::fs::symlink("../lib", root.join("venv/bin/lib")).expect("inside");
    std::fs::write(root.join("venv/pyvenv.cfg"), "home = /usr/bin\n").expect("writes");

    let mut archive = Vec::new();
    let stats = pack(root, &mut archive).expect("packs");
    assert_eq!((stats.n_links, stats.n_skipped), (1, 2), "{stats:?}");
    let restored = restored(&archive, "an archive pack made always unpacks");
    assert_eq!(
        std::fs::read_link(restored.path().join("venv/bin/lib")).expect("kept"),
        Path::new("../lib")
    );
    assert!(!restored.path().join("venv/bin/python").exists());
    assert!(restored.path().join("venv/pyvenv.cfg").is_file());
}

/// A link the sandbox made with the workspace's own absolute path (`ln -s /workspace/a.txt`)
/// is kept as written and restores into a root at that same path; spelled beneath another root,
/// or climbing out of this one through `..`, it is skipped by `pack` and refused by `unpack`.
#[test]
fn an_absolute_link_spelling_the_root_is_kept_and_restored_as_written() {
    let source = tempfile::tempdir().expect("tempdir");
    let root = std::fs::canonicalize(source.path()).expect("real root");
    let spelled = |rest: &str| format!("{}/{rest}", root.display());
    std::fs::create_dir(root.join("d")).expect("mkdir");
    std::fs::write(root.join("a.txt"), "a").expect("writes");
    std::fs::write(root.join("d/x.txt"), "x").expect("writes");
    std::os::unix::fs::symlink(spelled("a.txt"), root.join("link")).expect("abs file");
    std::os::unix::fs::symlink(spelled("d"), root.join("d/self")).expect("abs dir");
    std::os::unix::fs::symlink(spelled("../outside"), root.join("climb")).expect("climb");
    std::os::unix::fs::symlink("/etc/passwd", root.join("out")).expect("out");

    let mut archive = Vec::new();
    let stats = pack(&root, &mut archive).expect("packs");
    assert_eq!((stats.n_links, stats.n_skipped), (2, 2), "{stats:?}");

    // Into the same root (emptied first, as a restore does): the links come back as written.
    for name in ["a.txt", "link", "climb", "out", "d"] {
        let path = root.join(name);
        if path.is_dir() && !path.is_symlink() {
            std::fs::remove_dir_all(path).expect("empties");
        } else {
            std::fs::remove_file(path).expect("empties");
        }
    }
    unpack_default(&archive, &root).expect("restores");
    assert_eq!(
        std::fs::read_link(root.join("link")).expect("link"),
        Path::new(&spelled("a.txt"))
    );
    assert_eq!(
        std::fs::read_to_string(root.join("d/self/x.txt")).expect("follows"),
        "x"
    );
    assert!(!root.join("climb").exists() && !root.join("out").exists());

    // Another root does not spell those targets: there they would lead out.
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let what = "an absolute link into another tree";
    assert_refused(&archive, elsewhere.path(), Expected::Unsafe, what);

    // A hand-built archive whose absolute link climbs out through `..` is refused too.
    let target_dir = tempfile::tempdir().expect("tempdir");
    let target = std::fs::canonicalize(target_dir.path()).expect("real root");
    let climbing: &'static str = Box::leak(format!("{}/../x", target.display()).into_boxed_str());
    let hostile = zstd_bytes(&raw_tar(&[file("a.txt", b"a"), symlink("l", climbing)]));
    assert_refused(&hostile, &target, Expected::Unsafe, "climbs out");
}

#[test]
fn pack_output_is_deterministic_and_sorted() {
    let source = tempfile::tempdir().expect("tempdir");
    for name in ["zeta", "alpha", "mid/inner", "mid/another"] {
        let path = source.path().join(name);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, name).expect("writes");
    }
    let (mut first, mut second) = (Vec::new(), Vec::new());
    pack(source.path(), &mut first).expect("packs");
    pack(source.path(), &mut second).expect("packs");
    assert_eq!(first, second);
    let paths: Vec<String> = list(Cursor::new(&first))
        .expect("lists")
        .into_iter()
        .map(|e| e.path)
        .collect();
    assert_eq!(paths, ["alpha", "mid", "mid/another", "mid/inner", "zeta"]);
}

#[test]
fn read_file_streams_files_ranges_and_hard_links() {
    let source = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(source.path().join("d")).expect("mkdir");
    std::fs::write(source.path().join("d/data"), "0123456789").expect("writes");
    std::fs::hard_link(source.path().join("d/data"), source.path().join("z-link")).expect("links");
    std::os::unix::fs::symlink("d/data", source.path().join("sym")).expect("symlink");
    let mut archive = Vec::new();
    let stats = pack(source.path(), &mut archive).expect("packs");
    assert_eq!((stats.n_files, stats.n_links), (1, 2));

    let read = |path: &str, range: Option<std::ops::Range<u64>>| {
        let mut out = Vec::new();
        read_file(Cursor::new(&archive), path, range, &mut out)
            .map(|size| (size, String::from_utf8(out).expect("utf-8")))
    };
    assert_eq!(
        read("d/data", None).expect("file"),
        (10, "0123456789".into())
    );
    assert_eq!(
        read("d/data", Some(2..5)).expect("range"),
        (10, "234".into())
    );
    assert_eq!(
        read("d/data", Some(8..100)).expect("clamped"),
        (10, "89".into())
    );
    assert_eq!(
        read("z-link", Some(0..3)).expect("hard link"),
        (10, "012".into())
    );
    assert!(matches!(
        read("missing", None),
        Err(SnapshotError::NotFound(_))
    ));
    assert!(matches!(read("d", None), Err(SnapshotError::NotAFile(_))));
    assert!(matches!(read("sym", None), Err(SnapshotError::NotAFile(_))));

    let link = list(Cursor::new(&archive))
        .expect("lists")
        .into_iter()
        .find(|e| e.path == "z-link")
        .expect("listed");
    assert_eq!(
        (link.kind, link.link_target.as_deref()),
        (EntryKind::HardLink, Some("d/data"))
    );

    let restored = restored(&archive, "unpacks");
    let (a, b) = (
        std::fs::metadata(restored.path().join("d/data")).expect("data"),
        std::fs::metadata(restored.path().join("z-link")).expect("link"),
    );
    assert_eq!(a.ino(), b.ino(), "the hard link is a hard link again");
}

/// `(path → (kind, mode, content hash or link target, hard-link group))` of a tree.
type Manifest = BTreeMap<String, (String, u32, String, Option<String>)>;

fn manifest(root: &Path) -> Manifest {
    let mut groups: BTreeMap<(u64, u64), String> = BTreeMap::new();
    let mut out = Manifest::new();
    let mut stack = vec![String::new()];
    while let Some(dir) = stack.pop() {
        let mut names: Vec<String> = std::fs::read_dir(root.join(&dir))
            .expect("lists")
            .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
            .collect();
        names.sort();
        for name in names {
            let relative = if dir.is_empty() {
                name
            } else {
                format!("{dir}/{name}")
            };
            let full = root.join(&relative);
            let metadata = std::fs::symlink_metadata(&full).expect("lstat");
            let mode = metadata.mode() & 0o777;
            let entry = if metadata.file_type().is_symlink() {
                let target = std::fs::read_link(&full).expect("readlink");
                (
                    "symlink".to_owned(),
                    0,
                    target.to_string_lossy().into_owned(),
                    None,
                )
            } else if metadata.is_dir() {
                stack.push(relative.clone());
                ("dir".to_owned(), mode, String::new(), None)
            } else {
                let content = std::fs::read(&full).expect("reads");
                let group = (metadata.nlink() > 1).then(|| {
                    groups
                        .entry((metadata.dev(), metadata.ino()))
                        .or_insert_with(|| relative.clone())
                        .clone()
                });
                (
                    "file".to_owned(),
                    mode,
                    hex::encode(Sha256::digest(&content)),
                    group,
                )
            };
            out.insert(relative, entry);
        }
    }
    out
}

#[derive(Debug, Clone)]
enum Node {
    Dir { mode: u32 },
    File { content: Vec<u8>, mode: u32 },
    Symlink { target: String },
    HardLinkTo { index: usize },
}

fn name_strategy() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["a", "b c", "ünï", "日本", "x.txt", "-dash", "  ", "z"])
        .prop_map(str::to_owned)
}

fn node_strategy() -> impl Strategy<Value = (Vec<String>, Node)> {
    let node = prop_oneof![
        (0o000u32..0o100).prop_map(|bits| Node::Dir { mode: 0o700 | bits }),
        (prop::collection::vec(any::<u8>(), 0..300), 0o400u32..0o1000)
            .prop_map(|(content, mode)| Node::File { content, mode }),
        prop::sample::select(vec![
            "a",
            "../a",
            "b c/ünï",
            ".",
            "missing",
            "../../x/../b c"
        ])
        .prop_map(|t| Node::Symlink {
            target: t.to_owned()
        }),
        (0usize..20).prop_map(|index| Node::HardLinkTo { index }),
    ];
    (prop::collection::vec(name_strategy(), 1..4), node)
}

/// Builds a tree from the generated nodes, skipping any whose place is taken or whose parent
/// is not a directory. Returns nothing: the manifest is the truth.
fn build_tree(root: &Path, nodes: &[(Vec<String>, Node)]) {
    let mut files: Vec<std::path::PathBuf> = Vec::new();
    let mut dir_modes = Vec::new();
    for (components, node) in nodes {
        let relative = components.join("/");
        let full = root.join(&relative);
        let Some(parent) = full.parent() else {
            continue;
        };
        if std::fs::create_dir_all(parent).is_err() || std::fs::symlink_metadata(&full).is_ok() {
            continue;
        }
        // A symlink among the parents would put the entry somewhere else; skip it.
        if parent
            .ancestors()
            .any(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink()))
        {
            continue;
        }
        match node {
            Node::Dir { mode } => {
                if std::fs::create_dir(&full).is_ok() {
                    dir_modes.push((full, *mode));
                }
            }
            Node::File { content, mode } => {
                std::fs::write(&full, content).expect("writes");
                std::fs::set_permissions(&full, std::fs::Permissions::from_mode(*mode))
                    .expect("chmod");
                files.push(full);
            }
            Node::Symlink { target } => {
                // Only links that stay inside: the depth of the link's directory decides.
                let depth = components.len() as i64 - 1;
                let mut level = depth;
                let inside = Path::new(target).components().all(|c| {
                    level += match c {
                        std::path::Component::ParentDir => -1,
                        _ => 1,
                    };
                    level >= 0
                });
                if inside {
                    std::os::unix::fs::symlink(target, &full).expect("symlinks");
                }
            }
            Node::HardLinkTo { index } => {
                if let Some(original) = files.get(index % files.len().max(1)) {
                    std::fs::hard_link(original, &full).expect("links");
                }
            }
        }
    }
    for (dir, mode) in dir_modes {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn pack_then_unpack_is_the_identity(nodes in prop::collection::vec(node_strategy(), 0..25)) {
        let source = tempfile::tempdir().expect("tempdir");
        build_tree(source.path(), &nodes);
        let mut archive = Vec::new();
        pack(source.path(), &mut archive).expect("packs");
        let restored = restored(&archive, "unpacks");
        prop_assert_eq!(manifest(source.path()), manifest(restored.path()));
    }
}
