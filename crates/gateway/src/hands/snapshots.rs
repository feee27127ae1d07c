//! A session's stored snapshot, `sessions/<id>/snapshot.tar.zst` (hands.md "Snapshots"): written
//! from the hands' `GET /v1/workspace/snapshot` stream into a temp file, fsynced and renamed over
//! the previous one only once complete (a full disk or a broken stream leaves the previous one
//! intact); read back as a request body for `POST /v1/workspace/restore`; and, for an archived
//! session, listed and read file by file straight from the compressed stream (with a byte
//! range), never unpacked on the gateway's disk.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tokio::io::AsyncWriteExt;
use warren_snapshot::{ArchivedEntry, SnapshotError};

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
}

/// The snapshot file of one session.
#[derive(Debug, Clone)]
pub struct SnapshotStore {
    path: PathBuf,
    temp: PathBuf,
}

impl SnapshotStore {
    /// The workspace's snapshot, `snapshot.tar.zst`.
    pub fn new(session_dir: &Path) -> SnapshotStore {
        Self::named(session_dir, "snapshot")
    }

    /// Another snapshot of the session, `<stem>.tar.zst` (the agent's home: `agent-home`).
    pub fn named(session_dir: &Path, stem: &str) -> SnapshotStore {
        let name = format!("{stem}.{}", warren_snapshot::EXTENSION);
        SnapshotStore {
            path: session_dir.join(&name),
            temp: session_dir.join(format!("{name}.tmp")),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn exists(&self) -> bool {
        self.path.is_file()
    }

    /// The stored snapshot's time (its file's mtime) and size, if there is one.
    pub async fn info(&self) -> Option<SnapshotInfo> {
        let metadata = tokio::fs::metadata(&self.path).await.ok()?;
        let modified = metadata.modified().ok()?;
        let taken_at = chrono::DateTime::<chrono::Utc>::from(modified)
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        Some(SnapshotInfo {
            taken_at,
            bytes: metadata.len(),
        })
    }

    /// Stores `stream` as the new snapshot: temp file, fsync, rename, fsync of the directory.
    /// Any failure removes the temp file and leaves the previous snapshot as it was.
    pub async fn write<E: std::fmt::Display>(
        &self,
        stream: impl Stream<Item = Result<Bytes, E>>,
    ) -> Result<SnapshotInfo, StoreError> {
        let written = self.write_temp(stream).await;
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
        self.info()
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

    /// The stored snapshot as a streamed request body (for a restore).
    pub async fn body(&self) -> std::io::Result<reqwest::Body> {
        let file = tokio::fs::File::open(&self.path).await?;
        Ok(reqwest::Body::wrap_stream(
            tokio_util::io::ReaderStream::new(file),
        ))
    }

    /// Every entry of the stored snapshot (an archived session's file list).
    pub async fn list(&self) -> Result<Vec<ArchivedEntry>, SnapshotError> {
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
        let store = SnapshotStore::new(dir.path());
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
        let store = SnapshotStore::new(dir.path());
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
