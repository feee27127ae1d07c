//! [`LocalDisk`]: chunks and manifests in a directory of the data directory.
//!
//! Layout: `chunks/ab/cdef…` (the id's first two hex digits name the directory, the other 62
//! the file), `manifests/<checkpoint id>`, and `tmp/` for manifests being written. A batch
//! writes each chunk beside its place under a hidden name of its own (`chunks/ab/.cdef….<batch>`,
//! so two writers rarely wait on one directory); `commit` makes the file system durable
//! (`syncfs`), renames every chunk into place, and syncs again, so a chunk under its name is
//! always complete and durable before any manifest can name it, at the cost of two syncs per
//! checkpoint rather than one per chunk. A manifest is written to `tmp/`, fsynced and renamed
//! into `manifests/`. A failed write (a full disk) leaves only hidden or `tmp/` files, removed
//! by the batch when dropped or by [`ChunkStore::clean_leftovers`] after a crash: no chunk or
//! manifest already stored is ever touched by a write.

use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use crate::Error;
use crate::backend::{ChunkBatch, ChunkStore};
use crate::chunk::ChunkId;

/// A directory holding chunks and manifests.
#[derive(Debug)]
pub struct LocalDisk {
    root: PathBuf,
    /// The root, open: `syncfs` needs a descriptor on the file system.
    root_fd: OwnedFd,
    n_temps: AtomicU64,
}

impl LocalDisk {
    /// The store in `root`, creating it (and its parents) when missing.
    pub fn open(root: &Path) -> Result<LocalDisk, Error> {
        for dir in ["chunks", "manifests", "tmp"] {
            let path = root.join(dir);
            std::fs::create_dir_all(&path)
                .map_err(|e| Error::io(format!("cannot create {}", path.display()), e))?;
        }
        let root_fd = rustix::fs::open(
            root,
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| Error::io(format!("cannot open {}", root.display()), e.into()))?;
        Ok(LocalDisk {
            root: root.to_owned(),
            root_fd,
            n_temps: AtomicU64::new(0),
        })
    }

    fn chunk_path(&self, id: &ChunkId) -> PathBuf {
        let hex = id.to_hex();
        self.root.join("chunks").join(&hex[..2]).join(&hex[2..])
    }

    fn manifest_path(&self, id: &str) -> PathBuf {
        self.root.join("manifests").join(id)
    }

    /// A name under `tmp/` no other write of this process or another uses.
    fn temp_path(&self, what: &str) -> PathBuf {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        self.root.join("tmp").join(format!(
            "{what}-{}-{}-{nanos}",
            std::process::id(),
            self.n_temps.fetch_add(1, Ordering::Relaxed)
        ))
    }

    fn sync(&self) -> Result<(), Error> {
        rustix::fs::syncfs(&self.root_fd).map_err(|e| {
            Error::io(
                format!("cannot sync the file system of {}", self.root.display()),
                e.into(),
            )
        })
    }
}

/// The outcome of an operation on `path`: a missing file is `None`, any other error names the
/// path and `what` was being done.
fn or_missing<T>(path: &Path, what: &str, result: std::io::Result<T>) -> Result<Option<T>, Error> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(format!("cannot {what} {}", path.display()), e)),
    }
}

/// Writes `bytes` to a new file at `path` and optionally fsyncs it.
fn write_new(path: &Path, bytes: &[u8], fsync: bool) -> std::io::Result<()> {
    let mut file = File::options().write(true).create_new(true).open(path)?;
    file.write_all(bytes)?;
    if fsync {
        file.sync_all()?;
    }
    Ok(())
}

impl ChunkStore for LocalDisk {
    fn chunk_file(&self, id: &ChunkId) -> Option<PathBuf> {
        Some(self.chunk_path(id))
    }

    fn batch(&self) -> Result<Box<dyn ChunkBatch + '_>, Error> {
        let tag = self
            .temp_path("batch")
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(Box::new(LocalBatch {
            disk: self,
            tag,
            pending: Mutex::new(Vec::new()),
            linked: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    fn chunk_written_at(&self, id: &ChunkId) -> Result<Option<SystemTime>, Error> {
        let path = self.chunk_path(id);
        let metadata = or_missing(&path, "stat", std::fs::symlink_metadata(&path))?;
        metadata
            .map(|m| m.modified())
            .transpose()
            .map_err(|e| Error::io(format!("cannot stat {}", path.display()), e))
    }

    fn refresh_chunk(&self, id: &ChunkId, _stored: &[u8]) -> Result<bool, Error> {
        let path = self.chunk_path(id);
        let now = rustix::fs::Timestamps {
            last_access: rustix::fs::Timespec {
                tv_sec: 0,
                tv_nsec: rustix::fs::UTIME_OMIT,
            },
            last_modification: rustix::fs::Timespec {
                tv_sec: 0,
                tv_nsec: rustix::fs::UTIME_NOW,
            },
        };
        match rustix::fs::utimensat(
            rustix::fs::CWD,
            &path,
            &now,
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        ) {
            Ok(()) => Ok(true),
            Err(rustix::io::Errno::NOENT) => Ok(false),
            Err(e) => Err(Error::io(
                format!("cannot refresh {}", path.display()),
                e.into(),
            )),
        }
    }

    fn get_chunk(&self, id: &ChunkId) -> Result<Option<Vec<u8>>, Error> {
        let path = self.chunk_path(id);
        or_missing(&path, "read", std::fs::read(&path))
    }

    fn list_chunks(&self) -> Result<Vec<(ChunkId, SystemTime)>, Error> {
        let chunks = self.root.join("chunks");
        let listing = |dir: &Path| {
            std::fs::read_dir(dir)
                .map_err(|e| Error::io(format!("cannot list {}", dir.display()), e))
        };
        let mut found = Vec::new();
        for fan in listing(&chunks)? {
            let fan = fan.map_err(|e| Error::io("cannot list the chunks", e))?;
            let Some(prefix) = fan.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if prefix.len() != 2 {
                continue;
            }
            for entry in listing(&fan.path())? {
                let entry = entry.map_err(|e| Error::io("cannot list the chunks", e))?;
                let Some(id) = entry
                    .file_name()
                    .to_str()
                    .and_then(|rest| ChunkId::from_hex(&format!("{prefix}{rest}")))
                else {
                    continue;
                };
                // A chunk deleted since the listing is simply not there any more.
                let path = entry.path();
                if let Some(metadata) = or_missing(&path, "stat", std::fs::symlink_metadata(&path))?
                {
                    let written = metadata
                        .modified()
                        .map_err(|e| Error::io(format!("cannot stat {}", path.display()), e))?;
                    found.push((id, written));
                }
            }
        }
        Ok(found)
    }

    fn delete_chunk(&self, id: &ChunkId) -> Result<(), Error> {
        let path = self.chunk_path(id);
        or_missing(&path, "remove", std::fs::remove_file(&path)).map(|_| ())
    }

    fn put_manifest(&self, id: &str, stored: &[u8]) -> Result<(), Error> {
        let temp = self.temp_path("manifest");
        let path = self.manifest_path(id);
        let written = write_new(&temp, stored, true)
            .and_then(|()| std::fs::rename(&temp, &path))
            .and_then(|()| File::open(self.root.join("manifests"))?.sync_all());
        written.map_err(|e| {
            let _ = std::fs::remove_file(&temp);
            Error::io(format!("cannot store {}", path.display()), e)
        })
    }

    fn get_manifest(&self, id: &str) -> Result<Option<Vec<u8>>, Error> {
        let path = self.manifest_path(id);
        or_missing(&path, "read", std::fs::read(&path))
    }

    fn list_manifests(&self) -> Result<Vec<String>, Error> {
        let dir = self.root.join("manifests");
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| Error::io(format!("cannot list {}", dir.display()), e))?;
        let mut ids = Vec::new();
        for entry in entries {
            let entry =
                entry.map_err(|e| Error::io(format!("cannot list {}", dir.display()), e))?;
            if let Some(name) = entry.file_name().to_str() {
                ids.push(name.to_owned());
            }
        }
        Ok(ids)
    }

    fn delete_manifest(&self, id: &str) -> Result<(), Error> {
        let path = self.manifest_path(id);
        or_missing(&path, "remove", std::fs::remove_file(&path)).map(|_| ())
    }

    fn clean_leftovers(&self, before: SystemTime) -> Result<u64, Error> {
        // Manifests being written, and chunks of batches that never committed.
        let mut n_removed = remove_old(&self.root.join("tmp"), before, |_| true)?;
        let chunks = self.root.join("chunks");
        for fan in std::fs::read_dir(&chunks)
            .map_err(|e| Error::io(format!("cannot list {}", chunks.display()), e))?
        {
            let fan = fan.map_err(|e| Error::io("cannot list the chunks", e))?;
            if fan.file_name().len() == 2 {
                n_removed += remove_old(&fan.path(), before, |name| name.starts_with('.'))?;
            }
        }
        Ok(n_removed)
    }
}

/// Removes the files in `dir` whose name `wanted` accepts, last modified before `before`;
/// returns how many.
fn remove_old(dir: &Path, before: SystemTime, wanted: impl Fn(&str) -> bool) -> Result<u64, Error> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| Error::io(format!("cannot list {}", dir.display()), e))?;
    let mut n_removed = 0;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("cannot list {}", dir.display()), e))?;
        if !entry.file_name().to_str().is_some_and(&wanted) {
            continue;
        }
        let path = entry.path();
        let Some(metadata) = or_missing(&path, "stat", std::fs::symlink_metadata(&path))? else {
            continue;
        };
        if metadata.is_dir() || metadata.modified().is_ok_and(|written| written >= before) {
            continue;
        }
        if or_missing(&path, "remove", std::fs::remove_file(&path))?.is_some() {
            n_removed += 1;
        }
    }
    Ok(n_removed)
}

/// Chunks written as `chunks/ab/.cdef….<tag>` beside their place (so writers in different
/// fan directories never wait on one directory's lock), renamed into place at commit.
struct LocalBatch<'a> {
    disk: &'a LocalDisk,
    /// Ends every temporary name of this batch: no other batch of any process uses it.
    tag: String,
    /// The chunks written so far and their temporary paths.
    pending: Mutex<Vec<(ChunkId, PathBuf)>>,
    /// Chunks linked into place ([`ChunkBatch::put_link`]): the commit makes the links durable.
    linked: std::sync::atomic::AtomicBool,
}

impl LocalBatch<'_> {
    fn pending(&self) -> std::sync::MutexGuard<'_, Vec<(ChunkId, PathBuf)>> {
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl LocalBatch<'_> {
    /// The hidden name chunk `id` is written under until the commit (its fan directory made).
    fn temp_for(&self, id: &ChunkId) -> Result<PathBuf, Error> {
        let path = self.disk.chunk_path(id);
        let (Some(fan), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(Error::Invalid(format!("{} names no chunk", path.display())));
        };
        match std::fs::create_dir(fan) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io(format!("cannot create {}", fan.display()), e)),
        }
        Ok(fan.join(format!(".{}.{}", name.to_string_lossy(), self.tag)))
    }
}

impl ChunkBatch for LocalBatch<'_> {
    /// Links straight into place: the content is already complete and durable in the store it
    /// comes from, so it may be seen before the commit, which makes the link itself durable.
    fn put_link(&self, id: &ChunkId, from: &Path) -> Result<Option<u64>, Error> {
        let path = self.disk.chunk_path(id);
        let mut linked = std::fs::hard_link(from, &path);
        // The fan directory is made only when missing: a fork links tens of thousands of
        // chunks into a few hundred directories.
        if linked
            .as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
            && let Some(fan) = path.parent()
            && !fan.is_dir()
        {
            std::fs::create_dir_all(fan)
                .map_err(|e| Error::io(format!("cannot create {}", fan.display()), e))?;
            linked = std::fs::hard_link(from, &path);
        }
        match linked {
            Ok(()) => {}
            // Already stored (or put twice): the one in place stands.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(Some(0)),
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    || e.kind() == std::io::ErrorKind::CrossesDevices
                    || e.raw_os_error() == Some(rustix::io::Errno::MLINK.raw_os_error()) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(Error::io(format!("cannot link {}", path.display()), e)),
        }
        self.linked
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(Some(std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0)))
    }

    fn put(&self, id: &ChunkId, stored: &[u8]) -> Result<(), Error> {
        let temp = self.temp_for(id)?;
        match write_new(&temp, stored, false) {
            Ok(()) => {}
            // Put twice in this batch: the first write stands.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
            Err(e) => {
                let _ = std::fs::remove_file(&temp);
                return Err(Error::io(format!("cannot write {}", temp.display()), e));
            }
        }
        self.pending().push((*id, temp));
        Ok(())
    }

    fn commit(self: Box<Self>) -> Result<(), Error> {
        let pending = std::mem::take(&mut *self.pending());
        if pending.is_empty() {
            // Links alone: their names are durable before a manifest names them.
            if self.linked.load(std::sync::atomic::Ordering::Relaxed) {
                return self.disk.sync();
            }
            return Ok(());
        }
        let placed = (|| {
            // Every chunk's content is on disk before any of them is in place.
            self.disk.sync()?;
            for (id, temp) in &pending {
                let path = self.disk.chunk_path(id);
                std::fs::rename(temp, &path)
                    .map_err(|e| Error::io(format!("cannot store {}", path.display()), e))?;
            }
            // Every rename is durable before a manifest names the chunks.
            self.disk.sync()
        })();
        if placed.is_err() {
            // What is not in place yet goes; what is stays for a sweep (no manifest names it).
            for (_, temp) in &pending {
                let _ = std::fs::remove_file(temp);
            }
        }
        placed
    }
}

impl Drop for LocalBatch<'_> {
    fn drop(&mut self) {
        for (_, temp) in self.pending().drain(..) {
            if let Err(error) = std::fs::remove_file(&temp)
                && error.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(file = %temp.display(), %error, "cannot remove an abandoned chunk");
            }
        }
    }
}
