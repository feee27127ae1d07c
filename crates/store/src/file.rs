//! The local data directory: atomic JSON files (temp file, fsync, rename, fsync of the
//! directory), its lock, a probe for free space, and the clock format every record uses. These
//! block; callers on an async runtime move them to `spawn_blocking`.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// `ENOSPC` and `EDQUOT` on Linux, for errors whose kind the standard library does not map.
const ENOSPC: i32 = 28;
const EDQUOT: i32 = 122;

/// Whether `error` says the disk (or the quota) is full.
pub fn is_storage_full(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    ) || matches!(error.raw_os_error(), Some(ENOSPC | EDQUOT))
}

/// Bytes [`probe_space`] writes: more than a few events, so the slack at the end of a file's
/// last block does not pass for free space.
const PROBE_BYTES: usize = 256 * 1024;

/// Writes, syncs and removes a scratch file in `data_dir`: succeeds once the disk takes writes
/// again.
pub fn probe_space(data_dir: &Path) -> io::Result<()> {
    let path = data_dir.join(".storage-probe");
    let result = (|| {
        let mut file = File::create(&path)?;
        file.write_all(&vec![0u8; PROBE_BYTES])?;
        file.sync_data()
    })();
    let removed = fs::remove_file(&path);
    result?;
    removed
}

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
    // A gateway that just ended may leave its lock to a child between fork and exec for a
    // moment (a forked child shares the lock until its exec closes the descriptor): a held
    // lock is tried again for a short while before another gateway is taken to be running.
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(file),
            Err(rustix::io::Errno::WOULDBLOCK) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "another gateway is using the data directory {}",
                        data_dir.display()
                    ),
                ));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// How long [`lock_data_dir`] waits for a lock that is held.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Now, as RFC 3339 UTC with milliseconds.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_disk_errors_are_recognised_by_kind_and_by_errno() {
        let cases = [
            (io::Error::from_raw_os_error(ENOSPC), true),
            (io::Error::from_raw_os_error(EDQUOT), true),
            (io::Error::from(io::ErrorKind::StorageFull), true),
            (io::Error::from_raw_os_error(5), false),
            (io::Error::from(io::ErrorKind::PermissionDenied), false),
        ];
        for (error, want) in cases {
            assert_eq!(is_storage_full(&error), want, "{error}");
        }
    }

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
