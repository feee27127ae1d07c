//! `snapshot_unpack` and `snapshot_read`: workspace snapshots (`warren-snapshot`) from arbitrary
//! bytes. The first input byte chooses whether the rest is the stored stream itself or a tar to
//! be zstd-compressed first, so that the tar layer is reached as often as the zstd layer.
//!
//! - `snapshot_unpack`: `unpack` into a fresh empty root (small limits) next to a canary
//!   directory. Oracle: no panic; the canary and the directory holding both never change;
//!   after an error the root is empty; after success every entry lies inside the root, no
//!   symlink in it leads out, and nothing has the setuid, setgid or sticky bit.
//! - `snapshot_read`: `list`, then `read_file` of each listed file (and of a name from the
//!   input) with a range from the input. Oracle: no panic; a read never returns more bytes than
//!   the range asks for or than the file's size.

use std::io::Cursor;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path};

use warren_snapshot::{EntryKind, UnpackLimits, list, read_file, unpack};

/// Small enough that a fuzzed header claiming gigabytes is refused before anything is written.
const LIMITS: UnpackLimits = UnpackLimits {
    max_bytes: 1 << 20,
    max_entries: 1_000,
};

/// The stored stream the input stands for.
fn stream(data: &[u8]) -> Option<Vec<u8>> {
    let (&selector, rest) = data.split_first()?;
    if selector & 1 == 0 {
        Some(rest.to_vec())
    } else {
        Some(zstd::encode_all(rest, 1).expect("compressing into memory"))
    }
}

pub fn snapshot_unpack(data: &[u8]) {
    let Some(stream) = stream(data) else {
        return;
    };
    let work = tempfile::tempdir().expect("a temporary directory");
    let work_path = std::fs::canonicalize(work.path()).expect("canonical temp dir");
    let root = work_path.join("root");
    let canary = work_path.join("canary");
    std::fs::create_dir(&root).expect("root");
    std::fs::create_dir(&canary).expect("canary");
    std::fs::write(canary.join("keep"), "keep").expect("canary file");

    let result = unpack(Cursor::new(&stream), &root, &LIMITS);

    let canary_names: Vec<_> = std::fs::read_dir(&canary)
        .expect("canary")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(canary_names, ["keep"], "the canary directory changed");
    assert_eq!(
        std::fs::read(canary.join("keep")).expect("canary file"),
        b"keep"
    );
    let beside = std::fs::read_dir(&work_path).expect("work").count();
    assert_eq!(beside, 2, "something was created beside the root");
    match result {
        Err(error) => {
            let left = std::fs::read_dir(&root).expect("root").count();
            assert_eq!(left, 0, "{error} left {left} entries in the root");
        }
        Ok(stats) => {
            assert!(stats.bytes <= LIMITS.max_bytes);
            check_inside(&root, &root);
        }
    }
}

/// Every entry below `dir` is a real entry of the root; symlinks stay inside it, lexically and
/// when followed.
fn check_inside(root: &Path, dir: &Path) {
    for entry in std::fs::read_dir(dir)
        .expect("an unpacked directory reads")
        .flatten()
    {
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path).expect("an unpacked entry has metadata");
        assert_eq!(
            meta.permissions().mode() & 0o7000,
            0,
            "{} keeps a special bit",
            path.display()
        );
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&path).expect("a symlink reads");
            assert!(
                !target.is_absolute(),
                "{} links to {}",
                path.display(),
                target.display()
            );
            let relative = path
                .parent()
                .expect("below the root")
                .strip_prefix(root)
                .expect("below");
            let mut depth = relative.components().count() as i64;
            for component in target.components() {
                match component {
                    Component::ParentDir => depth -= 1,
                    Component::Normal(_) => depth += 1,
                    _ => {}
                }
                assert!(
                    depth >= 0,
                    "{} climbs out through {}",
                    path.display(),
                    target.display()
                );
            }
            // Lexically inside is not enough when links chain: where it really leads counts.
            if let Ok(real) = std::fs::canonicalize(&path) {
                assert!(
                    real.starts_with(root),
                    "{} really leads to {}",
                    path.display(),
                    real.display()
                );
            }
        } else if meta.is_dir() {
            check_inside(root, &path);
        }
    }
}

pub fn snapshot_read(data: &[u8]) {
    let Some(stream) = stream(data) else {
        return;
    };
    let Ok(entries) = list(Cursor::new(&stream)) else {
        return;
    };
    let (start, len) = match data.get(1..3) {
        Some(&[a, b]) => (u64::from(a), u64::from(b)),
        _ => (0, 0),
    };
    let range = (len != 0).then(|| start..start + len);
    let mut names: Vec<&str> = entries
        .iter()
        .filter(|e| matches!(e.kind, EntryKind::File | EntryKind::HardLink))
        .map(|e| e.path.as_str())
        .take(8)
        .collect();
    names.push("../escape");
    for name in names {
        let mut out = Vec::new();
        if let Ok(size) = read_file(Cursor::new(&stream), name, range.clone(), &mut out) {
            let n = out.len() as u64;
            assert!(n <= size, "{name}: {n} bytes of a {size}-byte file");
            if let Some(range) = &range {
                assert!(
                    n <= range.end - range.start,
                    "{name}: {n} bytes for {range:?}"
                );
            }
        }
    }
}
