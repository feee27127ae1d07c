//! A session's stored snapshot, `sessions/<id>/snapshot.tar.zst` (hands.md "Snapshots"): written
//! from the hands' `GET /v1/workspace/snapshot` stream into a temp file, fsynced and renamed over
//! the previous one only once complete (a full disk or a broken stream leaves the previous one
//! intact); read back as a request body for `POST /v1/workspace/restore`; and, for an archived
//! session, listed and read file by file straight from the compressed stream (with a byte
//! range), never unpacked on the gateway's disk.
//!
//! With `--snapshots s3://bucket/prefix` (the provider's [`Objects`], handed to
//! [`SnapshotStore::new`]) the object `<prefix>/sessions/<id>/snapshot.tar.zst` is the snapshot
//! and the local file is this replica's cache of it: a write uploads the complete temp file
//! before renaming it (a failed upload fails the write, and S3 keeps the previous object, which
//! becomes visible to no one half-written); every read first makes sure the cache matches the
//! object (its size, and a cache no older than the object), downloading it when it does not.
//! Whether there is a snapshot at all is the local copy's say when there is one, else the
//! object store's ([`SnapshotStore::is_stored`]): a replica that never held the session sees
//! the snapshot another one stored. Without the flag nothing of this runs and the file store
//! behaves as it always did.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tokio::io::AsyncWriteExt;
use warren_snapshot::{ArchivedEntry, SnapshotError};
use warren_store::objects::{ObjectError, Objects};

/// When the stored snapshot was taken and how large it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// RFC 3339.
    pub taken_at: String,
    pub bytes: u64,
}

/// Why a snapshot could not be stored.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("snapshot stream broke: {0}")]
    Stream(String),
    #[error("cannot write the snapshot: {0}")]
    Io(#[from] std::io::Error),
    #[error("cannot upload the snapshot: {0}")]
    Upload(#[from] ObjectError),
}

/// Where a session's snapshot lives in object storage.
#[derive(Debug, Clone)]
struct Remote {
    objects: Objects,
    session_id: String,
    /// `snapshot.tar.zst`.
    name: String,
}

/// The snapshot file of one session.
#[derive(Debug, Clone)]
pub struct SnapshotStore {
    path: PathBuf,
    temp: PathBuf,
    /// Set with `--snapshots`: the object is the snapshot, `path` its local cache.
    remote: Option<Remote>,
}

impl SnapshotStore {
    /// The workspace's snapshot, `snapshot.tar.zst`, kept in `objects` when given (the local
    /// file is then its cache).
    pub fn new(session_dir: &Path, objects: Option<&Objects>) -> SnapshotStore {
        Self::named(session_dir, "snapshot", objects)
    }

    /// Another snapshot of the session, `<stem>.tar.zst` (the agent's home: `agent-home`).
    pub fn named(session_dir: &Path, stem: &str, objects: Option<&Objects>) -> SnapshotStore {
        let name = format!("{stem}.{}", warren_snapshot::EXTENSION);
        // A session's directory is named after its id (`data/sessions/<id>`).
        let remote = objects
            .zip(session_dir.file_name())
            .map(|(objects, id)| Remote {
                objects: objects.clone(),
                session_id: id.to_string_lossy().into_owned(),
                name: name.clone(),
            });
        SnapshotStore {
            path: session_dir.join(&name),
            temp: session_dir.join(format!("{name}.tmp")),
            remote,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this replica has a copy of the snapshot (with object storage, maybe a stale
    /// one; reads refresh it). See [`SnapshotStore::is_stored`] for whether there is a snapshot.
    pub fn exists(&self) -> bool {
        self.path.is_file()
    }

    /// Whether the session has a stored snapshot: this replica's copy when it has one (no
    /// request), else the object store's answer. An object store that cannot be asked counts
    /// as no snapshot, logged: what there is to read is unreachable anyway.
    pub async fn is_stored(&self) -> bool {
        if self.exists() {
            return true;
        }
        let Some(remote) = &self.remote else {
            return false;
        };
        match remote.objects.head(&remote.session_id, &remote.name).await {
            Ok(found) => found.is_some(),
            Err(e) => {
                tracing::warn!(session = %remote.session_id, error = %e, "cannot ask the object store for the snapshot");
                false
            }
        }
    }

    /// The local copy's path, made current first (downloaded from object storage when absent
    /// or stale): for a caller that reads the file itself.
    pub async fn cached_path(&self) -> std::io::Result<&Path> {
        self.cache_locally().await?;
        Ok(&self.path)
    }

    /// Removes every object of the session, this snapshot's and the others' (session delete);
    /// the local copies go with the session's directory. Returns how many there were: none
    /// without object storage.
    pub async fn delete_session_objects(&self) -> Result<usize, ObjectError> {
        match &self.remote {
            Some(remote) => remote.objects.delete_session(&remote.session_id).await,
            None => Ok(0),
        }
    }

    /// The stored snapshot's time (its file's mtime, or the object's last-modified time) and
    /// size, if there is one. While the object store cannot be asked, this replica's copy
    /// answers: a write succeeds only once its upload did, so the copy is what was stored last.
    pub async fn info(&self) -> Option<SnapshotInfo> {
        if let Some(remote) = &self.remote {
            return match remote.objects.head(&remote.session_id, &remote.name).await {
                Ok(found) => found.map(|(bytes, modified)| SnapshotInfo {
                    taken_at: rfc3339(modified),
                    bytes,
                }),
                Err(e) => {
                    tracing::warn!(session = %remote.session_id, error = %e, "cannot ask the object store for the snapshot");
                    self.local_info().await
                }
            };
        }
        self.local_info().await
    }

    async fn local_info(&self) -> Option<SnapshotInfo> {
        let metadata = tokio::fs::metadata(&self.path).await.ok()?;
        let modified = metadata.modified().ok()?;
        Some(SnapshotInfo {
            taken_at: rfc3339(modified),
            bytes: metadata.len(),
        })
    }

    /// Stores `stream` as the new snapshot: temp file, fsync, rename, fsync of the directory.
    /// Any failure removes the temp file and leaves the previous snapshot as it was.
    pub async fn write<E: std::fmt::Display>(
        &self,
        stream: impl Stream<Item = Result<Bytes, E>>,
    ) -> Result<SnapshotInfo, StoreError> {
        let mut written = self.write_temp(stream).await;
        if let (Ok(()), Some(remote)) = (&written, &self.remote) {
            written = remote
                .objects
                .put_file(&remote.session_id, &remote.name, &self.temp)
                .await
                .map(|_| ())
                .map_err(StoreError::from);
        }
        if let Err(e) = written {
            let _ = tokio::fs::remove_file(&self.temp).await;
            return Err(e);
        }
        tokio::fs::rename(&self.temp, &self.path).await?;
        if let Some(dir) = self.path.parent() {
            let dir = dir.to_path_buf();
            tokio::task::spawn_blocking(move || std::fs::File::open(dir)?.sync_all())
                .await
                .map_err(std::io::Error::other)??;
        }
        // The local copy, just renamed, has the object's bytes: no request needed to say them.
        self.local_info()
            .await
            .ok_or_else(|| StoreError::Io(std::io::Error::other("the snapshot vanished")))
    }

    async fn write_temp<E: std::fmt::Display>(
        &self,
        stream: impl Stream<Item = Result<Bytes, E>>,
    ) -> Result<(), StoreError> {
        let mut file = tokio::fs::File::create(&self.temp).await?;
        let mut stream = std::pin::pin!(stream);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| StoreError::Stream(e.to_string()))?;
            file.write_all(&chunk).await?;
        }
        file.flush().await?;
        file.sync_all().await?;
        Ok(())
    }

    /// Makes the local file the stored snapshot (object storage only; a no-op otherwise):
    /// downloaded when absent, of another size or older than the object. When the object store
    /// cannot be reached, or has lost the object, the local copy (this replica's latest write or
    /// download) is used if there is one.
    async fn cache_locally(&self) -> std::io::Result<()> {
        let Some(remote) = &self.remote else {
            return Ok(());
        };
        let local = tokio::fs::metadata(&self.path).await.ok();
        let unavailable = match remote.objects.head(&remote.session_id, &remote.name).await {
            Ok(Some((bytes, modified))) => {
                let fresh = local.as_ref().is_some_and(|local| {
                    local.len() == bytes && local.modified().is_ok_and(|time| time >= modified)
                });
                if fresh {
                    return Ok(());
                }
                match remote
                    .objects
                    .get_to_file(&remote.session_id, &remote.name, &self.path)
                    .await
                {
                    Ok(_) => return Ok(()),
                    Err(e) => e,
                }
            }
            Ok(None) => ObjectError::NotFound,
            Err(e) => e,
        };
        if local.is_some() {
            tracing::warn!(session = %remote.session_id, error = %unavailable, "the snapshot is read from this replica's copy");
            return Ok(());
        }
        Err(match unavailable {
            ObjectError::NotFound => std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no snapshot in object storage",
            ),
            other => std::io::Error::other(other),
        })
    }

    /// The stored snapshot as a streamed request body (for a restore). With object storage the
    /// object is downloaded to the local cache first rather than streamed through: a restore
    /// tried twice (or an archived download next) then reads it once, the body has a known
    /// length, and a restore still works from this replica's copy while the store is down.
    pub async fn body(&self) -> std::io::Result<reqwest::Body> {
        self.cache_locally().await?;
        let file = tokio::fs::File::open(&self.path).await?;
        Ok(reqwest::Body::wrap_stream(
            tokio_util::io::ReaderStream::new(file),
        ))
    }

    /// Every entry of the stored snapshot (an archived session's file list).
    pub async fn list(&self) -> Result<Vec<ArchivedEntry>, SnapshotError> {
        self.cache_locally().await.map_err(SnapshotError::Io)?;
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let file = std::fs::File::open(&path).map_err(SnapshotError::Io)?;
            warren_snapshot::list(std::io::BufReader::new(file))
        })
        .await
        .map_err(|e| SnapshotError::Io(std::io::Error::other(e)))?
    }

    /// Streams one file of the stored snapshot (optionally a byte range) into `out`, reading the
    /// compressed archive sequentially on a blocking thread; returns the file's total size.
    pub async fn read_file(
        &self,
        file_path: &str,
        range: Option<std::ops::Range<u64>>,
        out: impl std::io::Write + Send + 'static,
    ) -> Result<u64, SnapshotError> {
        // The compressed archive is read from its start whatever the range, so one ranged
        // request would not spare the download: the cached copy is read instead.
        self.cache_locally().await.map_err(SnapshotError::Io)?;
        let path = self.path.clone();
        let file_path = file_path.to_string();
        tokio::task::spawn_blocking(move || {
            let file = std::fs::File::open(&path).map_err(SnapshotError::Io)?;
            warren_snapshot::read_file(std::io::BufReader::new(file), &file_path, range, out)
        })
        .await
        .map_err(|e| SnapshotError::Io(std::io::Error::other(e)))?
    }
}

fn rfc3339(time: std::time::SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(time).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(
        parts: Vec<Result<&'static [u8], &'static str>>,
    ) -> impl Stream<Item = Result<Bytes, &'static str>> {
        futures_util::stream::iter(parts.into_iter().map(|part| part.map(Bytes::from_static)))
    }

    #[tokio::test]
    async fn a_complete_stream_replaces_the_snapshot_and_a_broken_one_leaves_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SnapshotStore::new(dir.path(), None);
        assert!(!store.exists());
        let info = store
            .write(chunks(vec![Ok(b"first "), Ok(b"snapshot")]))
            .await
            .expect("first snapshot stored");
        assert_eq!(info.bytes, 14);
        let broken = store
            .write(chunks(vec![Ok(b"half of a"), Err("connection reset")]))
            .await;
        assert!(matches!(broken, Err(StoreError::Stream(_))), "{broken:?}");
        assert_eq!(
            std::fs::read(store.path()).expect("snapshot readable"),
            b"first snapshot"
        );
        assert!(!store.temp.exists(), "the temp file is removed");
    }

    #[tokio::test]
    async fn an_archived_snapshot_is_listed_and_read_by_range_without_unpacking() {
        let dir = tempfile::tempdir().expect("temp dir");
        let workspace = dir.path().join("ws");
        std::fs::create_dir_all(workspace.join("src")).expect("mkdir");
        std::fs::write(workspace.join("src/main.rs"), b"fn main() {}\n").expect("write");
        let mut packed = Vec::new();
        warren_snapshot::pack(&workspace, &mut packed).expect("pack");
        let store = SnapshotStore::new(dir.path(), None);
        store
            .write(futures_util::stream::iter([Ok::<_, &str>(Bytes::from(
                packed,
            ))]))
            .await
            .expect("stored");
        let entries = store.list().await.expect("listed");
        assert!(
            entries
                .iter()
                .any(|e| e.path == "src/main.rs" && e.size == 13),
            "{entries:?}"
        );
        let out = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let size = store
            .read_file("src/main.rs", Some(3..7), SharedVec(out.clone()))
            .await
            .expect("read");
        assert_eq!(size, 13);
        assert_eq!(&*out.lock().expect("lock"), b"main");
        let missing = store.read_file("nope.txt", None, std::io::sink()).await;
        assert!(
            matches!(missing, Err(SnapshotError::NotFound(_))),
            "{missing:?}"
        );
    }

    struct SharedVec(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for SharedVec {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::Error::other("poisoned"))?
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}
