//! Small file helpers for the local data directory: atomic JSON files (temp file, fsync, rename,
//! fsync of the directory) and the clock format every record uses. Blocking; callers on the
//! async runtime keep these writes small or move them to `spawn_blocking`.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Writes `value` as JSON to `path` so that a crash leaves either the old or the new file.
pub fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> io::Result<()> {
    let bytes = serde_json::to_vec_pretty(value).map_err(io::Error::other)?;
    write_atomic(path, &bytes)
}

/// Writes `bytes` to `path` through a temp file in the same directory, fsynced, then renamed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::other("path has no parent directory"))?;
    let file_name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(
        ".{file_name}.{}.tmp",
        uuid::Uuid::new_v4().simple()
    ));
    let result = (|| {
        let mut file = File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// fsyncs a directory so a rename or a new file in it survives power loss.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Reads a JSON file written by [`write_json_atomic`].
pub fn read_json<T: DeserializeOwned>(path: &Path) -> io::Result<T> {
    let bytes = fs::read(path)?;
    serde_json::from_slice(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Takes the exclusive lock on `data_dir/.lock`, so two gateways never share a data directory.
/// The lock lives as long as the returned file (the kernel drops it when the process dies, even
/// by kill -9; the descriptor is close-on-exec, so children never inherit it).
pub fn lock_data_dir(data_dir: &Path) -> io::Result<File> {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(data_dir.join(".lock"))?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(file),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            format!(
                "another gateway is using the data directory {}",
                data_dir.display()
            ),
        )),
        Err(e) => Err(e.into()),
    }
}

/// Now, as RFC 3339 UTC with milliseconds.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_dir_is_locked_by_one_holder_at_a_time() {
        let dir = tempfile::tempdir().expect("temp dir");
        let held = lock_data_dir(dir.path()).expect("first lock");
        let second = lock_data_dir(dir.path()).expect_err("second lock refused");
        assert_eq!(second.kind(), io::ErrorKind::WouldBlock);
        drop(held);
        lock_data_dir(dir.path()).expect("lock again after release");
    }

    #[test]
    fn atomic_write_replaces_content_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("meta.json");
        write_json_atomic(&path, &serde_json::json!({"a": 1})).expect("first write");
        write_json_atomic(&path, &serde_json::json!({"a": 2})).expect("second write");
        let value: serde_json::Value = read_json(&path).expect("read back");
        assert_eq!(value["a"], 2);
        let names: Vec<_> = fs::read_dir(dir.path())
            .expect("list dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("meta.json")]);
    }
}
