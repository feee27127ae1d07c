//! `path_resolver`: execd's confinement of client paths beneath `--root` (`fs::resolve`,
//! shared by Warren's `/v1/files*` and the OpenSandbox file routes), run on arbitrary path bytes
//! against a real tree. The tree is made once per process: nested directories, a relative and
//! an absolute symlink out of the root, an absolute one back in, a link loop, a link to `.`,
//! and a sibling `outside/` directory with a secret in it.
//!
//! Each input goes through the route's own checks (no NUL, at most `MAX_PATH_BYTES`, relative
//! paths taken from the root), `parts_beneath`, then the walk: `open` (file or directory, and
//! directory only), `locate`, and `create_dirs` (`mkdir -p`, undone afterwards).
//!
//! Oracle: no panic; whatever the walk opens or locates is, by its real path
//! (`/proc/self/fd`), the root or beneath it; `outside/` never changes, nothing appears next to
//! the root, and a directory `create_dirs` made opens as a directory beneath the root.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use warren_execd::files_api::MAX_PATH_BYTES;
use warren_execd::fs::resolve::{Root, Want, parts_beneath};

/// The tree every input is resolved in, made once per process.
struct Tree {
    /// Holds the root and `outside/`; removed when the process ends.
    _work: tempfile::TempDir,
    work: PathBuf,
    /// Canonical.
    root: PathBuf,
    /// Every entry the tree starts with, relative to the root.
    entries: BTreeSet<PathBuf>,
    /// Inputs run one at a time: `create_dirs` and its undoing must not interleave.
    lock: Mutex<()>,
}

fn tree() -> &'static Tree {
    static TREE: OnceLock<Tree> = OnceLock::new();
    TREE.get_or_init(|| {
        let work_dir = tempfile::tempdir().expect("a temporary directory");
        let work = std::fs::canonicalize(work_dir.path()).expect("canonical temp dir");
        let root = work.join("root");
        let outside = work.join("outside");
        std::fs::create_dir_all(root.join("a/b/c")).expect("nested dirs");
        std::fs::create_dir(&outside).expect("outside dir");
        std::fs::write(outside.join("secret.txt"), "secret").expect("secret");
        std::fs::write(root.join("file.txt"), "inside").expect("file");
        std::fs::write(root.join("a/b/c/deep.txt"), "deep").expect("deep file");
        let links: [(&str, PathBuf); 7] = [
            ("out", PathBuf::from("../outside")),
            ("abs_out", outside.clone()),
            ("abs_in", root.join("a")),
            ("loop1", PathBuf::from("loop2")),
            ("loop2", PathBuf::from("loop1")),
            ("here", PathBuf::from(".")),
            ("a/b/up", PathBuf::from("../../..")),
        ];
        for (name, target) in links {
            std::os::unix::fs::symlink(target, root.join(name)).expect("symlink");
        }
        let mut entries = BTreeSet::new();
        list(&root, Path::new(""), &mut entries);
        Tree {
            _work: work_dir,
            work,
            root,
            entries,
            lock: Mutex::new(()),
        }
    })
}

/// Every entry below `dir` (symlinks not followed), relative to the root.
fn list(dir: &Path, relative: &Path, into: &mut BTreeSet<PathBuf>) {
    let Ok(read) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in read.flatten() {
        let name = relative.join(entry.file_name());
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            list(&entry.path(), &name, into);
        }
        into.insert(name);
    }
}

pub fn path_resolver(data: &[u8]) {
    let tree = tree();
    let _one_at_a_time = tree
        .lock
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // The checks `files_api`'s `dir_target` makes before resolving.
    if data.contains(&0) || data.len() > MAX_PATH_BYTES {
        return;
    }
    let path = Path::new(OsStr::from_bytes(data));
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        tree.root.join(path)
    };
    let Some(parts) = parts_beneath(&tree.root, &absolute) else {
        return;
    };
    let root = Root::new(&tree.root).expect("the root opens");
    for want in [Want::FileOrDir, Want::Dir, Want::File] {
        if let Ok((fd, entry)) = root.open(&parts, want) {
            assert_inside(tree, &fd_path(fd.as_raw_fd()), data, "opened");
            assert_inside(
                tree,
                &fd_path(entry.dir.as_fd().as_raw_fd()),
                data,
                "its directory",
            );
        }
    }
    if let Ok(entry) = root.locate(&parts) {
        assert_inside(
            tree,
            &fd_path(entry.dir.as_fd().as_raw_fd()),
            data,
            "located in",
        );
    }
    if root.create_dirs(&parts).is_ok() {
        let (fd, _) = root
            .open(&parts, Want::Dir)
            .unwrap_or_else(|error| panic!("{:?} was created but does not open: {error}", path));
        assert_inside(tree, &fd_path(fd.as_raw_fd()), data, "created");
    }
    undo_and_check(tree, data);
}

fn fd_path(fd: i32) -> PathBuf {
    std::fs::read_link(format!("/proc/self/fd/{fd}")).expect("an open descriptor has a path")
}

fn assert_inside(tree: &Tree, real: &Path, input: &[u8], what: &str) {
    assert!(
        real.starts_with(&tree.root),
        "{:?}: {what} {} is outside the root {}",
        String::from_utf8_lossy(input),
        real.display(),
        tree.root.display()
    );
}

/// Removes what `create_dirs` made, then checks that nothing outside the root changed.
fn undo_and_check(tree: &Tree, input: &[u8]) {
    let mut now = BTreeSet::new();
    list(&tree.root, Path::new(""), &mut now);
    for extra in now.difference(&tree.entries) {
        // A parent removed first takes its children with it.
        let _ = std::fs::remove_dir_all(tree.root.join(extra));
    }
    let mut outside = BTreeSet::new();
    list(&tree.work.join("outside"), Path::new(""), &mut outside);
    assert_eq!(
        outside,
        BTreeSet::from([PathBuf::from("secret.txt")]),
        "{:?} changed the directory outside the root",
        String::from_utf8_lossy(input)
    );
    let beside: BTreeSet<_> = std::fs::read_dir(&tree.work)
        .expect("work dir")
        .flatten()
        .map(|entry| entry.file_name())
        .collect();
    assert_eq!(
        beside.len(),
        2,
        "{:?} created something beside the root",
        String::from_utf8_lossy(input)
    );
}
