//! [`Bucket`]: chunks and manifests in an object store (S3 for `--snapshots s3://…`), through
//! the `object_store` crate the snapshots use: `<prefix>/chunks/ab/cdef…` and
//! `<prefix>/manifests/<checkpoint id>`. A put is one request and S3 shows an object only once
//! its put completed, so a batch writes each chunk at once and its commit has nothing left to
//! do; a failed checkpoint leaves at most chunks no manifest names, which a sweep collects.
//!
//! The store's verbs are synchronous: each request runs on the Tokio runtime the bucket was
//! given and the calling thread waits for it (bounded). Call them from a blocking thread
//! (`spawn_blocking`), as every verb of the store is meant to be.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::TryStreamExt;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig,
};

use crate::Error;
use crate::backend::{ChunkBatch, ChunkStore};
use crate::chunk::ChunkId;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest a caller waits for one request, retries included.
const CALL_TIMEOUT: Duration = Duration::from_secs(90);

/// Chunks and manifests under a prefix of an object store.
pub struct Bucket {
    store: Arc<dyn ObjectStore>,
    /// Slash-separated, no leading or trailing slash; empty for the store's root.
    prefix: String,
    runtime: tokio::runtime::Handle,
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket")
            .field("store", &self.store.to_string())
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl Bucket {
    /// Checkpoints under `prefix` of `store`, whose requests run on `runtime`.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        runtime: tokio::runtime::Handle,
    ) -> Result<Bucket, Error> {
        let prefix = prefix.trim_matches('/');
        let bad = prefix
            .split('/')
            .any(|segment| segment == "." || segment == ".." || segment.is_empty())
            && !prefix.is_empty();
        if bad || prefix.chars().any(char::is_control) {
            return Err(Error::Invalid(format!(
                "the prefix {prefix:?} has an empty, '.' or '..' segment or a control character"
            )));
        }
        Ok(Bucket {
            store,
            prefix: prefix.to_owned(),
            runtime,
        })
    }

    /// The S3 bucket `bucket` with the `AWS_*` settings given (`AWS_ENDPOINT_URL`,
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ALLOW_HTTP`, ...; the
    /// names `object_store` does not know are ignored), with the snapshots' bounded timeouts
    /// and few retries, so a dead endpoint fails within seconds.
    pub fn s3(
        bucket: &str,
        prefix: &str,
        env: &[(&str, String)],
        runtime: tokio::runtime::Handle,
    ) -> Result<Bucket, Error> {
        let client = ClientOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT);
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_millis(500),
                base: 2.0,
            },
            max_retries: 2,
            retry_timeout: Duration::from_secs(10),
        };
        let mut builder = AmazonS3Builder::new()
            .with_client_options(client)
            .with_retry(retry);
        for (key, value) in env {
            if let Ok(config_key) = key.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() {
                builder = builder.with_config(config_key, value.clone());
            }
        }
        let store = builder
            .with_bucket_name(bucket)
            .build()
            .map_err(|e| Error::Invalid(e.to_string()))?;
        Bucket::new(Arc::new(store), prefix, runtime)
    }

    fn path(&self, rest: &str) -> ObjectPath {
        if self.prefix.is_empty() {
            ObjectPath::from(rest)
        } else {
            ObjectPath::from(format!("{}/{rest}", self.prefix))
        }
    }

    fn chunk_path(&self, id: &ChunkId) -> ObjectPath {
        let hex = id.to_hex();
        self.path(&format!("chunks/{}/{}", &hex[..2], &hex[2..]))
    }

    fn manifest_path(&self, id: &str) -> ObjectPath {
        self.path(&format!("manifests/{id}"))
    }

    /// Runs `request` on the runtime and waits for it, at most [`CALL_TIMEOUT`].
    fn run<T: Send + 'static>(
        &self,
        what: &str,
        request: impl Future<Output = object_store::Result<T>> + Send + 'static,
    ) -> Result<T, object_store::Error> {
        let (done, answer) = std::sync::mpsc::sync_channel(1);
        self.runtime.spawn(async move {
            let _ = done.send(request.await);
        });
        let generic = |message: String| object_store::Error::Generic {
            store: "checkpoints",
            source: message.into(),
        };
        match answer.recv_timeout(CALL_TIMEOUT) {
            Ok(result) => result,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(generic(format!(
                "{what} took longer than {} s",
                CALL_TIMEOUT.as_secs()
            ))),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                Err(generic(format!("{what}: the runtime is shutting down")))
            }
        }
    }

    fn get(&self, path: ObjectPath) -> Result<Option<Vec<u8>>, Error> {
        let store = self.store.clone();
        let shown = path.to_string();
        let got = self.run(
            "a read",
            async move { store.get(&path).await?.bytes().await },
        );
        match got {
            Ok(bytes) => Ok(Some(bytes.to_vec())),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(unavailable(&shown, e)),
        }
    }

    fn put(&self, path: ObjectPath, stored: &[u8]) -> Result<(), Error> {
        let store = self.store.clone();
        let shown = path.to_string();
        let payload = PutPayload::from(stored.to_vec());
        self.run("a write", async move { store.put(&path, payload).await })
            .map(|_| ())
            .map_err(|e| unavailable(&shown, e))
    }

    fn delete(&self, path: ObjectPath) -> Result<(), Error> {
        let store = self.store.clone();
        let shown = path.to_string();
        match self.run("a delete", async move { store.delete(&path).await }) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(unavailable(&shown, e)),
        }
    }

    /// Every object under `<prefix>/<under>/`, with its name after that and its time.
    fn list(&self, under: &str) -> Result<Vec<(String, SystemTime)>, Error> {
        let store = self.store.clone();
        let prefix = self.path(under);
        let listed_prefix = prefix.clone();
        let metas = self
            .run("a listing", async move {
                store
                    .list(Some(&listed_prefix))
                    .try_collect::<Vec<_>>()
                    .await
            })
            .map_err(|e| unavailable(prefix.as_ref(), e))?;
        let skip = prefix.as_ref().len() + 1;
        Ok(metas
            .into_iter()
            .filter_map(|meta| {
                let name = meta.location.as_ref().get(skip..)?.to_owned();
                Some((name, SystemTime::from(meta.last_modified)))
            })
            .collect())
    }
}

fn unavailable(path: &str, error: object_store::Error) -> Error {
    Error::Unavailable(format!("{path}: {error}"))
}

impl ChunkStore for Bucket {
    fn batch(&self) -> Result<Box<dyn ChunkBatch + '_>, Error> {
        Ok(Box::new(BucketBatch { bucket: self }))
    }

    fn chunk_written_at(&self, id: &ChunkId) -> Result<Option<SystemTime>, Error> {
        let store = self.store.clone();
        let path = self.chunk_path(id);
        let shown = path.to_string();
        match self.run("a head", async move { store.head(&path).await }) {
            Ok(meta) => Ok(Some(SystemTime::from(meta.last_modified))),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(unavailable(&shown, e)),
        }
    }

    fn refresh_chunk(&self, id: &ChunkId, stored: &[u8]) -> Result<bool, Error> {
        // An object's time changes only when it is written.
        self.put(self.chunk_path(id), stored).map(|()| true)
    }

    fn get_chunk(&self, id: &ChunkId) -> Result<Option<Vec<u8>>, Error> {
        self.get(self.chunk_path(id))
    }

    fn list_chunks(&self) -> Result<Vec<(ChunkId, SystemTime)>, Error> {
        Ok(self
            .list("chunks")?
            .into_iter()
            .filter_map(|(name, written)| {
                let (fan, rest) = name.split_once('/')?;
                (fan.len() == 2)
                    .then(|| ChunkId::from_hex(&format!("{fan}{rest}")))
                    .flatten()
                    .map(|id| (id, written))
            })
            .collect())
    }

    fn delete_chunk(&self, id: &ChunkId) -> Result<(), Error> {
        self.delete(self.chunk_path(id))
    }

    fn put_manifest(&self, id: &str, stored: &[u8]) -> Result<(), Error> {
        self.put(self.manifest_path(id), stored)
    }

    fn get_manifest(&self, id: &str) -> Result<Option<Vec<u8>>, Error> {
        self.get(self.manifest_path(id))
    }

    fn list_manifests(&self) -> Result<Vec<String>, Error> {
        Ok(self
            .list("manifests")?
            .into_iter()
            .map(|(name, _)| name)
            .filter(|name| !name.contains('/'))
            .collect())
    }

    fn delete_manifest(&self, id: &str) -> Result<(), Error> {
        self.delete(self.manifest_path(id))
    }

    fn clean_leftovers(&self, _before: SystemTime) -> Result<u64, Error> {
        // Single puts leave nothing behind when they fail.
        Ok(0)
    }
}

/// Puts go straight to the bucket: an object is whole once its put returns.
struct BucketBatch<'a> {
    bucket: &'a Bucket,
}

impl ChunkBatch for BucketBatch<'_> {
    fn put(&self, id: &ChunkId, stored: &[u8]) -> Result<(), Error> {
        self.bucket.put(self.bucket.chunk_path(id), stored)
    }

    fn commit(self: Box<Self>) -> Result<(), Error> {
        Ok(())
    }
}
