//! Warren's file routes (`/v1/files*`, docs/exec-tools.md "Files"): downloads with a byte
//! range, streamed uploads, listings, `mkdir -p`, moves, removal, and the change feed.
//!
//! Downloads, uploads and the feed go over the client without an overall timeout, since they
//! last as long as the file is large or the subscriber listens. A 416 is an answer a file
//! browser acts on (the size is in `Content-Range`), so [`ExecdClient::download`] returns it
//! instead of failing.

use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use reqwest::{StatusCode, header};
use serde::de::DeserializeOwned;
use warren_protocol::files::{FileChanges, FileList, FileWritten, MoveRequest};

use crate::{ClientError, ExecdClient, error_chain};

/// Longest line of the change feed a client reads (1,000 paths of at most 4,096 bytes each fit
/// well within it).
const MAX_FEED_LINE_BYTES: usize = 16 * 1024 * 1024;

/// The answer to [`ExecdClient::download`].
pub struct Download {
    /// 200 (the whole file), 206 (the range asked for) or 416 (no byte of it exists).
    pub status: StatusCode,
    pub content_length: Option<u64>,
    /// `bytes a-b/size` on a 206, `bytes */size` on a 416.
    pub content_range: Option<String>,
    /// The bytes, as execd reads them; a body cut midway ends with an error item. On a 416 it
    /// is execd's error body.
    pub body: BoxStream<'static, Result<bytes::Bytes, ClientError>>,
}

impl std::fmt::Debug for Download {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Download")
            .field("status", &self.status)
            .field("content_length", &self.content_length)
            .field("content_range", &self.content_range)
            .finish_non_exhaustive()
    }
}

/// The answer to [`ExecdClient::upload`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uploaded {
    /// The file did not exist before (201); else it was replaced (200).
    pub created: bool,
    pub written: FileWritten,
}

impl ExecdClient {
    /// `GET /v1/files/list?path=P&depth=N`: the entries below a directory (`""` or `.`: the
    /// root), `depth` levels deep (1 to 5), sorted by path.
    pub async fn list_files(&self, path: &str, depth: u32) -> Result<FileList, ClientError> {
        let request = self
            .request(reqwest::Method::GET, "/v1/files/list")
            .query(&[("path", path), ("depth", &depth.to_string())]);
        self.send(request).await
    }

    /// `GET /v1/files?path=P`, with `Range: <range>` if given (`bytes=0-99`).
    pub async fn download(&self, path: &str, range: Option<&str>) -> Result<Download, ClientError> {
        let mut request = self
            .request_on(&self.streaming, reqwest::Method::GET, "/v1/files")
            .query(&[("path", path)]);
        if let Some(range) = range {
            request = request.header(header::RANGE, range);
        }
        let response = request.send().await.map_err(|e| self.unreachable(&e))?;
        let response = match response.status() {
            StatusCode::RANGE_NOT_SATISFIABLE => response,
            _ => self.check(response).await?,
        };
        let header_text = |name| {
            response
                .headers()
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        };
        let content_length = header_text(header::CONTENT_LENGTH).and_then(|v| v.parse().ok());
        let content_range = header_text(header::CONTENT_RANGE);
        Ok(Download {
            status: response.status(),
            content_length,
            content_range,
            body: self.body_chunks(response, "download").boxed(),
        })
    }

    /// `PUT /v1/files?path=P`: replaces or creates the file with `body`, streamed, atomically
    /// (a body that fails midway leaves the file as it was). No overall timeout.
    pub async fn upload(&self, path: &str, body: reqwest::Body) -> Result<Uploaded, ClientError> {
        self.upload_on(&self.streaming, path, body).await
    }

    pub(crate) async fn upload_on(
        &self,
        http: &reqwest::Client,
        path: &str,
        body: reqwest::Body,
    ) -> Result<Uploaded, ClientError> {
        let request = self
            .request_on(http, reqwest::Method::PUT, "/v1/files")
            .query(&[("path", path)])
            .body(body);
        let response = self.checked(request).await?;
        let created = response.status() == StatusCode::CREATED;
        let written = self.read_json(response).await?;
        Ok(Uploaded { created, written })
    }

    /// `POST /v1/files/dir?path=P`: `mkdir -p`.
    pub async fn make_dir(&self, path: &str) -> Result<(), ClientError> {
        let request = self
            .request(reqwest::Method::POST, "/v1/files/dir")
            .query(&[("path", path)]);
        self.send_empty(request).await
    }

    /// `POST /v1/files/move`.
    pub async fn move_file(&self, request: &MoveRequest) -> Result<(), ClientError> {
        let request = self
            .request(reqwest::Method::POST, "/v1/files/move")
            .json(request);
        self.send_empty(request).await
    }

    /// `DELETE /v1/files?path=P&recursive=B`: a file, a symlink (not its target), an empty
    /// directory, or with `recursive` a whole tree.
    pub async fn delete_file(&self, path: &str, recursive: bool) -> Result<(), ClientError> {
        let request = self
            .request(reqwest::Method::DELETE, "/v1/files")
            .query(&[("path", path), ("recursive", &recursive.to_string())]);
        self.send_empty(request).await
    }

    /// `GET /v1/files/watch`: returns once execd's watch is in place (its first line came), so
    /// every change after the call is seen; then yields each later line with paths (execd's
    /// empty keep-alive lines are skipped). A feed cut midway ends with an error item; one
    /// execd ended (it is stopping) just ends.
    pub async fn watch_files(
        &self,
    ) -> Result<BoxStream<'static, Result<FileChanges, ClientError>>, ClientError> {
        let request = self.request_on(&self.streaming, reqwest::Method::GET, "/v1/files/watch");
        let response = self.checked(request).await?;
        let mut lines =
            json_lines::<FileChanges, _>(response.bytes_stream(), self.base_url.clone());
        match lines.next().await {
            Some(Ok(_ready)) => {}
            Some(Err(error)) => return Err(error),
            None => {
                return Err(ClientError::Unreachable {
                    url: self.base_url.clone(),
                    detail: "the file watch ended before it was ready".into(),
                });
            }
        }
        Ok(lines
            .try_filter(|changes| std::future::ready(!changes.paths.is_empty()))
            .boxed())
    }
}

/// A body of one JSON value per line (blank lines skipped) as a stream of values. A line that
/// does not parse, one longer than [`MAX_FEED_LINE_BYTES`], or a body that breaks is the last
/// item, an error.
fn json_lines<T, E>(
    chunks: impl futures_util::Stream<Item = Result<bytes::Bytes, E>> + Send + 'static,
    url: String,
) -> BoxStream<'static, Result<T, ClientError>>
where
    T: DeserializeOwned + Send + 'static,
    E: std::error::Error + 'static,
{
    struct Reading<E> {
        chunks: BoxStream<'static, Result<bytes::Bytes, E>>,
        buffer: Vec<u8>,
        url: String,
        failed: bool,
    }
    let reading = Reading {
        chunks: chunks.boxed(),
        buffer: Vec::new(),
        url,
        failed: false,
    };
    futures_util::stream::unfold(reading, |mut reading| async move {
        if reading.failed {
            return None;
        }
        let broken = |reading: &mut Reading<E>, detail: String| {
            reading.failed = true;
            Err(ClientError::Unreachable {
                url: reading.url.clone(),
                detail,
            })
        };
        loop {
            if let Some(end) = reading.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = reading.buffer.drain(..=end).collect();
                if line.trim_ascii().is_empty() {
                    continue;
                }
                let item = match serde_json::from_slice(&line) {
                    Ok(item) => Ok(item),
                    Err(e) => broken(&mut reading, format!("unreadable line in a feed: {e}")),
                };
                return Some((item, reading));
            }
            if reading.buffer.len() > MAX_FEED_LINE_BYTES {
                let item = broken(&mut reading, "a feed line is too long".into());
                return Some((item, reading));
            }
            match reading.chunks.next().await {
                Some(Ok(chunk)) => reading.buffer.extend_from_slice(&chunk),
                Some(Err(e)) => {
                    let item = broken(&mut reading, format!("feed broken: {}", error_chain(&e)));
                    return Some((item, reading));
                }
                None => return None,
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The feed's lines parsed from `chunks`, errors as `Err(detail)`.
    async fn parse(chunks: &[&'static str]) -> Vec<Result<Vec<String>, String>> {
        let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = chunks
            .iter()
            .map(|chunk| Ok(bytes::Bytes::from_static(chunk.as_bytes())))
            .collect();
        json_lines::<FileChanges, _>(futures_util::stream::iter(chunks), "http://x".into())
            .map(|item| item.map(|changes| changes.paths).map_err(|e| e.to_string()))
            .collect()
            .await
    }

    #[tokio::test]
    async fn lines_are_split_wherever_the_chunks_end() {
        let lines = parse(&["{\"paths\":[]}\n{\"pa", "ths\":[\"a\",\"b/c\"]}", "\n\n"]).await;
        assert_eq!(lines, [Ok(vec![]), Ok(vec!["a".into(), "b/c".into()])]);
    }

    #[tokio::test]
    async fn an_unreadable_line_ends_the_feed_with_an_error() {
        let lines = parse(&["{\"paths\":[\"a\"]}\nnot json\n{\"paths\":[]}\n"]).await;
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(lines[0], Ok(vec!["a".into()]));
        let error = lines[1].as_ref().expect_err("an error");
        assert!(error.contains("unreadable line"), "{error}");
    }
}
