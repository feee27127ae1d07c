//! Workspace snapshots over HTTP: `GET /v1/workspace/snapshot` streams `warren_snapshot::pack`
//! of `--root` as it is made, and `POST /v1/workspace/restore` streams the request body into
//! `warren_snapshot::unpack` into an empty `--root`. With `?tree=home` both work on the agent's
//! home (`--home`) instead, which the gateway keeps as a second snapshot of the session. Both run the sync snapshot code on a
//! blocking thread joined to the HTTP body by a bounded channel (or `SyncIoBridge`), so memory
//! is bounded whatever the workspace's size.
//!
//! `POST /v1/workspace/changes` (in [`changes`]) streams what changed since a checkpoint, for
//! the gateway to take the next one, and `POST /v1/workspace/patch` (in [`patch`]) applies a
//! rewind's patch, whole or not at all.
//!
//! A snapshot that fails midway aborts the response body: the client sees a broken stream
//! (and `unpack` of what it got fails as corrupt), never a short archive that looks whole. The
//! restore route has no body size limit of its own: `UnpackLimits` bounds what it writes.

use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::Arc;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::TryStreamExt;
use tokio::sync::mpsc;
use tokio_util::io::{StreamReader, SyncIoBridge};
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouterExt};
use utoipa_axum::routes;
use warren_protocol::error::ErrorBody;
use warren_protocol::hands::RestoreResult;
use warren_snapshot::{SnapshotError, UnpackLimits};

use crate::error::ApiError;
use crate::route_helpers;

mod changes;
pub mod error;
pub mod patch;
pub use error::WorkspaceError;

/// Bytes the packer hands to the response at once, and chunks in flight: about 1 MiB queued.
const CHUNK_BYTES: usize = 64 * 1024;
const CHUNKS_IN_FLIGHT: usize = 16;

/// `?tree=workspace|home` (default `workspace`).
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TreeQuery {
    /// `workspace` (the default) or `home` (with `--home`).
    #[serde(default)]
    #[param(pattern = "^(workspace|home)$")]
    tree: Option<String>,
}

/// The workspace routes' state: the root, and one lock so two restores never race into it.
#[derive(Clone)]
pub struct Workspace {
    root: Arc<PathBuf>,
    /// The agent's home (`--home`), the other tree a snapshot may be of.
    home: Option<Arc<PathBuf>>,
    limits: UnpackLimits,
    restoring: Arc<tokio::sync::Mutex<()>>,
}

impl Workspace {
    pub fn new(root: PathBuf, home: Option<PathBuf>) -> Self {
        Self {
            root: Arc::new(root),
            home: home.map(Arc::new),
            limits: UnpackLimits::default(),
            restoring: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// The directory `?tree=` names.
    fn tree(&self, query: &TreeQuery) -> Result<Arc<PathBuf>, WorkspaceError> {
        match (query.tree.as_deref(), &self.home) {
            (None | Some("workspace"), _) => Ok(Arc::clone(&self.root)),
            (Some("home"), Some(home)) => Ok(Arc::clone(home)),
            (Some(other), _) => Err(WorkspaceError::UnknownTree(other.to_owned())),
        }
    }
}

pub fn routes(workspace: Workspace) -> OpenApiRouter {
    OpenApiRouter::new()
        .routes(routes!(snapshot))
        .routes(routes!(restore))
        .routes(routes!(patch::patch))
        // The restore and patch routes read bodies as streams, bounded by what they write.
        .layer(DefaultBodyLimit::disable())
        // Added after that layer, so it keeps a limit of its own: a JSON body read whole.
        .routes(routes!(changes::changes).layer(DefaultBodyLimit::max(changes::MAX_KNOWN_BYTES)))
        .with_state(workspace)
}

/// The tree as a zstd-compressed tar, streamed as it is made.
#[utoipa::path(
    get, path = "/v1/workspace/snapshot", tag = "workspace",
    params(TreeQuery),
    responses(
        (status = 200, description = "The snapshot; a failure midway aborts the body", content_type = "application/zstd", body = [u8]),
        (status = 400, description = "`INVALID_REQUEST_BODY`: an unknown `tree` or a query that does not parse", body = ErrorBody),
        (status = 500, description = "`RUNTIME_ERROR`: the tree cannot be read", body = ErrorBody),
    )
)]
async fn snapshot(
    State(workspace): State<Workspace>,
    query: Result<Query<TreeQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let query = route_helpers::query(query)?;
    // A root that cannot be read is an error answer, not a broken stream.
    let root = workspace.tree(&query)?;
    drop(
        tokio::fs::read_dir(root.as_path())
            .await
            .map_err(|e| WorkspaceError::Snapshot(SnapshotError::Io(e)))?,
    );
    let (sender, receiver) = mpsc::channel::<io::Result<Bytes>>(CHUNKS_IN_FLIGHT);
    tokio::task::spawn_blocking(move || {
        let mut writer = ChannelWriter {
            sender: sender.clone(),
            buffer: Vec::with_capacity(CHUNK_BYTES),
        };
        let packed = warren_snapshot::pack(&root, &mut writer).and_then(|stats| {
            writer.flush()?;
            Ok(stats)
        });
        match packed {
            Ok(stats) => tracing::info!(?stats, "workspace snapshot streamed"),
            Err(error) => {
                tracing::warn!(%error, "workspace snapshot failed midway; aborting the body");
                // The client may be gone already; then there is nobody to tell.
                let _ = sender.blocking_send(Err(io::Error::other(error.to_string())));
            }
        }
    });
    let chunks = futures_util::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|chunk| (chunk, receiver))
    });
    Ok((
        [(header::CONTENT_TYPE, warren_snapshot::CONTENT_TYPE)],
        Body::from_stream(chunks),
    )
        .into_response())
}

/// A `Write` that sends full chunks to the response body, blocking while the channel is full
/// (so a slow client slows the packer down instead of filling memory).
struct ChannelWriter {
    sender: mpsc::Sender<io::Result<Bytes>>,
    buffer: Vec<u8>,
}

impl ChannelWriter {
    fn send_buffer(&mut self) -> io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(
            &mut self.buffer,
            Vec::with_capacity(CHUNK_BYTES),
        ));
        self.sender
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the client went away"))
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = CHUNK_BYTES - self.buffer.len();
        let n = data.len().min(room);
        self.buffer.extend_from_slice(&data[..n]);
        if self.buffer.len() >= CHUNK_BYTES {
            self.send_buffer()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send_buffer()
    }
}

/// Unpacks a snapshot (the body) into the tree, which must be empty; after a failure it is
/// empty again.
#[utoipa::path(
    post, path = "/v1/workspace/restore", tag = "workspace",
    params(TreeQuery),
    request_body(content = [u8], content_type = "application/octet-stream", description = "A snapshot as `GET /v1/workspace/snapshot` makes it (a zstd-compressed tar; the content type is not checked)"),
    responses(
        (status = 200, description = "Restored", body = RestoreResult),
        (status = 400, description = "`INVALID_REQUEST_BODY` (an unknown `tree`), `SNAPSHOT_CORRUPT` or `SNAPSHOT_UNSAFE_ENTRY`", body = ErrorBody),
        (status = 409, description = "`WORKSPACE_NOT_EMPTY`", body = ErrorBody),
        (status = 413, description = "`SNAPSHOT_TOO_LARGE`: over the unpack limits", body = ErrorBody),
        (status = 500, description = "`RUNTIME_ERROR`", body = ErrorBody),
        (status = 507, description = "`STORAGE_FULL`", body = ErrorBody),
    )
)]
async fn restore(
    State(workspace): State<Workspace>,
    query: Result<Query<TreeQuery>, QueryRejection>,
    body: Body,
) -> Result<Json<RestoreResult>, ApiError> {
    let query = route_helpers::query(query)?;
    let root = workspace.tree(&query)?;
    let _restoring = workspace.restoring.lock().await;
    let stream = body.into_data_stream().map_err(io::Error::other);
    let reader = SyncIoBridge::new(StreamReader::new(stream));
    let limits = workspace.limits;
    let unpacked =
        tokio::task::spawn_blocking(move || warren_snapshot::unpack(reader, &root, &limits))
            .await
            .map_err(|e| WorkspaceError::Task(e.to_string()))?;
    let stats = unpacked.map_err(WorkspaceError::Snapshot)?;
    tracing::info!(?stats, "workspace restored");
    Ok(Json(RestoreResult {
        files: stats.n_files,
        bytes: stats.bytes,
    }))
}
