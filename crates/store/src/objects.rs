//! Session files in S3-compatible object storage (`--snapshots s3://bucket/prefix`): one object
//! per session file at `<prefix>/sessions/<session id>/<name>`, through the `object_store`
//! crate, so any replica reads what another one wrote. Uploads are whole objects: S3 makes an
//! object visible only once its put (or multipart upload) completes, so a failed upload leaves
//! the previous object as it was. Every call has bounded timeouts and few retries: a dead
//! endpoint answers [`ObjectError::Unavailable`] within seconds, never a hang.
//!
//! Deliberately absent: buckets are not created here (that is the operator's), and nothing is
//! cached: callers keep their own local copies.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::{Stream, StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig,
    WriteMultipart,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Files larger than this go up as a multipart upload; smaller ones in a single put.
pub const MULTIPART_THRESHOLD: u64 = 8 * 1024 * 1024;
/// The size of one part of a multipart upload (S3's minimum is 5 MiB, bar the last part).
const PART_BYTES: usize = 8 * 1024 * 1024;
/// Parts uploaded at once.
const PARTS_IN_FLIGHT: usize = 2;
/// How much of a file is read at a time.
const READ_BYTES: usize = 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Why an object operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("no such object")]
    NotFound,
    /// The endpoint is down, timed out, refused the credentials or answered an error.
    #[error("object storage unavailable: {0}")]
    Unavailable(String),
    /// A bad URL, session id, name or range (the caller's mistake; retrying will not help).
    #[error("invalid object request: {0}")]
    Invalid(String),
}

impl From<object_store::Error> for ObjectError {
    fn from(error: object_store::Error) -> ObjectError {
        match error {
            object_store::Error::NotFound { .. } => ObjectError::NotFound,
            object_store::Error::InvalidPath { source } => ObjectError::Invalid(source.to_string()),
            other => ObjectError::Unavailable(other.to_string()),
        }
    }
}

/// `s3://bucket/prefix`: where the objects live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectUrl {
    pub bucket: String,
    /// Slash-separated, no leading or trailing slash; empty for the bucket's root.
    pub prefix: String,
}

impl ObjectUrl {
    pub fn parse(text: &str) -> Result<ObjectUrl, ObjectError> {
        let invalid = |why: &str| ObjectError::Invalid(format!("{text:?}: {why}"));
        let rest = text
            .strip_prefix("s3://")
            .ok_or_else(|| invalid("not an s3://bucket/prefix url"))?;
        if rest.contains(['?', '#', '\\']) || rest.chars().any(char::is_control) {
            return Err(invalid("a query, fragment, backslash or control character"));
        }
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(invalid("no bucket"));
        }
        let bucket_ok = bucket
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
        if !bucket_ok {
            return Err(invalid(
                "a bucket name has only lowercase letters, digits, '-' and '.'",
            ));
        }
        let prefix = prefix.trim_end_matches('/');
        if !prefix.is_empty() {
            for segment in prefix.split('/') {
                if segment.is_empty() || segment == "." || segment == ".." {
                    return Err(invalid("an empty, '.' or '..' segment in the prefix"));
                }
            }
        }
        Ok(ObjectUrl {
            bucket: bucket.to_owned(),
            prefix: prefix.to_owned(),
        })
    }
}

impl std::str::FromStr for ObjectUrl {
    type Err = ObjectError;

    fn from_str(text: &str) -> Result<ObjectUrl, ObjectError> {
        ObjectUrl::parse(text)
    }
}

impl std::fmt::Display for ObjectUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.prefix.is_empty() {
            write!(f, "s3://{}", self.bucket)
        } else {
            write!(f, "s3://{}/{}", self.bucket, self.prefix)
        }
    }
}

/// A bucket (and prefix) of session files; cheap to clone.
#[derive(Debug, Clone)]
pub struct Objects {
    store: Arc<dyn ObjectStore>,
    prefix: String,
}

static N_DOWNLOADS: AtomicU64 = AtomicU64::new(0);

impl Objects {
    /// The bucket of `url`, with the endpoint and credentials of the process's `AWS_*`
    /// variables (what `AmazonS3Builder::from_env` reads).
    pub fn from_url(url: &ObjectUrl) -> Result<Objects, ObjectError> {
        let env: Vec<(String, String)> = std::env::vars()
            .filter(|(key, _)| key.starts_with("AWS_"))
            .collect();
        let env: Vec<(&str, String)> = env
            .iter()
            .map(|(key, value)| (key.as_str(), value.clone()))
            .collect();
        Self::from_url_with(url, &env)
    }

    /// The bucket of `url` with the `AWS_*` settings given (`AWS_ENDPOINT_URL`,
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ALLOW_HTTP`, ...).
    /// Names `object_store` does not know are ignored, as `from_env` ignores them.
    pub fn from_url_with(url: &ObjectUrl, env: &[(&str, String)]) -> Result<Objects, ObjectError> {
        // The timeouts and retries come first: settings applied after them (the environment's
        // `AWS_ALLOW_HTTP`, say) amend the client options instead of replacing them.
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
            .with_bucket_name(&url.bucket)
            .build()
            .map_err(|e| ObjectError::Invalid(e.to_string()))?;
        Ok(Objects {
            store: Arc::new(store),
            prefix: url.prefix.clone(),
        })
    }

    /// The object store itself, for what keeps objects of its own under a session
    /// ([`Self::session_prefix`]): a session's checkpoints.
    pub fn store(&self) -> Arc<dyn ObjectStore> {
        self.store.clone()
    }

    /// `<prefix>/sessions/<session>`: everything of the session is beneath it (and goes with
    /// [`Self::delete_session`]).
    pub fn session_prefix(&self, session: &str) -> Result<String, ObjectError> {
        Ok(self.session_path(session)?.to_string())
    }

    /// `<prefix>/sessions/<session>`.
    fn session_path(&self, session: &str) -> Result<ObjectPath, ObjectError> {
        check_part("session id", session)?;
        let text = if self.prefix.is_empty() {
            format!("sessions/{session}")
        } else {
            format!("{}/sessions/{session}", self.prefix)
        };
        ObjectPath::parse(text).map_err(|e| ObjectError::Invalid(e.to_string()))
    }

    /// `<prefix>/sessions/<session>/<name>`.
    fn path(&self, session: &str, name: &str) -> Result<ObjectPath, ObjectError> {
        check_part("name", name)?;
        let text = format!("{}/{name}", self.session_path(session)?);
        ObjectPath::parse(text).map_err(|e| ObjectError::Invalid(e.to_string()))
    }

    /// Uploads the file at `file` as `<session>/<name>` and returns its size: one put up to
    /// [`MULTIPART_THRESHOLD`], a multipart upload above (aborted on any failure, so no part of
    /// it ever replaces the previous object).
    pub async fn put_file(
        &self,
        session: &str,
        name: &str,
        file: &Path,
    ) -> Result<u64, ObjectError> {
        let location = self.path(session, name)?;
        let mut opened = tokio::fs::File::open(file).await.map_err(local_error)?;
        let size = opened.metadata().await.map_err(local_error)?.len();
        if size <= MULTIPART_THRESHOLD {
            let mut contents = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
            opened
                .read_to_end(&mut contents)
                .await
                .map_err(local_error)?;
            let n_bytes = contents.len() as u64;
            self.store
                .put(&location, PutPayload::from(contents))
                .await?;
            return Ok(n_bytes);
        }
        let upload = self.store.put_multipart(&location).await?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
        match stream_parts(&mut opened, &mut writer).await {
            Ok(n_bytes) => {
                writer.finish().await?;
                Ok(n_bytes)
            }
            Err(e) => {
                if let Err(abort) = writer.abort().await {
                    tracing::warn!(error = %abort, %location, "cannot abort a failed upload");
                }
                Err(e)
            }
        }
    }

    /// Downloads `<session>/<name>` to `file`: streamed into a temp file beside it, fsynced and
    /// renamed over `file` only once complete.
    pub async fn get_to_file(
        &self,
        session: &str,
        name: &str,
        file: &Path,
    ) -> Result<u64, ObjectError> {
        let mut stream = std::pin::pin!(self.get_stream(session, name).await?);
        let file_name = file
            .file_name()
            .ok_or_else(|| ObjectError::Invalid(format!("{} names no file", file.display())))?;
        let temp = file.with_file_name(format!(
            "{}.download-{}-{}",
            file_name.to_string_lossy(),
            std::process::id(),
            N_DOWNLOADS.fetch_add(1, Ordering::Relaxed)
        ));
        let written = async {
            let mut out = tokio::fs::File::create(&temp).await.map_err(local_error)?;
            let mut n_bytes = 0u64;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                out.write_all(&chunk).await.map_err(local_error)?;
                n_bytes += chunk.len() as u64;
            }
            out.flush().await.map_err(local_error)?;
            out.sync_all().await.map_err(local_error)?;
            tokio::fs::rename(&temp, file).await.map_err(local_error)?;
            Ok::<u64, ObjectError>(n_bytes)
        }
        .await;
        if written.is_err() {
            let _ = tokio::fs::remove_file(&temp).await;
        }
        written
    }

    /// `<session>/<name>` as a stream of chunks; a missing object is [`ObjectError::NotFound`]
    /// before the stream starts.
    pub async fn get_stream(
        &self,
        session: &str,
        name: &str,
    ) -> Result<impl Stream<Item = Result<Bytes, ObjectError>> + Send + 'static, ObjectError> {
        let location = self.path(session, name)?;
        let result = self.store.get(&location).await?;
        Ok(result.into_stream().map_err(ObjectError::from))
    }

    /// The bytes `range` of `<session>/<name>`; a range that is empty or reaches past the
    /// object's end is [`ObjectError::Invalid`].
    pub async fn get_range(
        &self,
        session: &str,
        name: &str,
        range: Range<u64>,
    ) -> Result<Bytes, ObjectError> {
        let location = self.path(session, name)?;
        if range.start >= range.end {
            return Err(ObjectError::Invalid(format!(
                "the range {}..{} is empty",
                range.start, range.end
            )));
        }
        // S3 shortens a range that runs past the end instead of refusing it; asking the size
        // first makes that a clear error instead of fewer bytes than asked for.
        let size = self.store.head(&location).await?.size;
        if range.end > size {
            return Err(ObjectError::Invalid(format!(
                "the range {}..{} is past the end of a {size}-byte object",
                range.start, range.end
            )));
        }
        Ok(self.store.get_range(&location, range).await?)
    }

    /// The size and last-modified time of `<session>/<name>`, or `None` when there is none.
    pub async fn head(
        &self,
        session: &str,
        name: &str,
    ) -> Result<Option<(u64, SystemTime)>, ObjectError> {
        let location = self.path(session, name)?;
        match self.store.head(&location).await {
            Ok(meta) => Ok(Some((meta.size, SystemTime::from(meta.last_modified)))),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes `<session>/<name>` (a missing object is not an error).
    pub async fn delete(&self, session: &str, name: &str) -> Result<(), ObjectError> {
        let location = self.path(session, name)?;
        match self.store.delete(&location).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes every object of the session; returns how many there were.
    pub async fn delete_session(&self, session: &str) -> Result<usize, ObjectError> {
        let prefix = self.session_path(session)?;
        let locations = self
            .store
            .list(Some(&prefix))
            .map_ok(|meta| meta.location)
            .boxed();
        let deleted: Vec<ObjectPath> = self.store.delete_stream(locations).try_collect().await?;
        Ok(deleted.len())
    }
}

/// Reads `file` into `writer` a piece at a time, at most [`PARTS_IN_FLIGHT`] parts uploading.
async fn stream_parts(
    file: &mut tokio::fs::File,
    writer: &mut WriteMultipart,
) -> Result<u64, ObjectError> {
    let mut buffer = vec![0u8; READ_BYTES];
    let mut n_bytes = 0u64;
    loop {
        writer.wait_for_capacity(PARTS_IN_FLIGHT).await?;
        let n_read = file.read(&mut buffer).await.map_err(local_error)?;
        if n_read == 0 {
            return Ok(n_bytes);
        }
        writer.write(&buffer[..n_read]);
        n_bytes += n_read as u64;
    }
}

/// A local file that cannot be read or written is a fault of this machine, not of the store;
/// it is reported as unavailable with the path's error.
fn local_error(error: std::io::Error) -> ObjectError {
    ObjectError::Unavailable(format!("local file: {error}"))
}

/// A session id or name: one non-empty key segment, no `/`, no `..`.
fn check_part(what: &str, part: &str) -> Result<(), ObjectError> {
    let bad = part.is_empty()
        || part == "."
        || part.contains("..")
        || part.contains(['/', '\\'])
        || part.chars().any(char::is_control);
    if bad {
        return Err(ObjectError::Invalid(format!(
            "{what} {part:?} is not one non-empty segment without '/' or '..'"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_into_bucket_and_prefix_or_say_what_is_wrong() {
        let good = [
            ("s3://bucket", "bucket", ""),
            ("s3://bucket/", "bucket", ""),
            ("s3://bucket/warren", "bucket", "warren"),
            ("s3://my-bucket.2/a/b/", "my-bucket.2", "a/b"),
        ];
        for (text, bucket, prefix) in good {
            let url = ObjectUrl::parse(text).expect(text);
            assert_eq!(
                (url.bucket.as_str(), url.prefix.as_str()),
                (bucket, prefix),
                "{text}"
            );
        }
        let bad = [
            "",
            "bucket/prefix",
            "http://bucket/prefix",
            "gs://bucket",
            "s3://",
            "s3:///prefix",
            "s3://Bucket",
            "s3://bucket/../x",
            "s3://bucket/a/../b",
            "s3://bucket/a//b",
            "s3://bucket/./a",
            "s3://bucket/a?x=1",
        ];
        for text in bad {
            let parsed = ObjectUrl::parse(text);
            assert!(
                matches!(parsed, Err(ObjectError::Invalid(_))),
                "{text}: {parsed:?}"
            );
        }
    }

    #[test]
    fn session_ids_and_names_are_single_segments() {
        for part in ["", ".", "..", "a/b", "../x", "a..b", "x\\y", "a\nb"] {
            assert!(check_part("name", part).is_err(), "{part:?}");
        }
        for part in ["snapshot.tar.zst", "0f3a-11", "agent-home.tar.zst"] {
            assert!(check_part("name", part).is_ok(), "{part:?}");
        }
    }
}
