//! The files beneath a directory, as the tests walk them: what a secret must not be in, what a
//! tidiness check reads.

use std::path::{Path, PathBuf};

/// Every regular file beneath `dir`, in no particular order; links are not followed and
/// directories that cannot be read are skipped.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            match std::fs::symlink_metadata(&path) {
                Ok(meta) if meta.is_dir() => stack.push(path),
                Ok(meta) if meta.is_file() => files.push(path),
                _ => {}
            }
        }
    }
    files
}
