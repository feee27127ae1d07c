//! `POST /v1/workspace/changes?tree=workspace|home`: what changed in this execd's tree since a
//! checkpoint the gateway holds, for the gateway to take the next checkpoint of a tree it
//! cannot read. The body is what that checkpoint knows (`warren_checkpoint::Known`: each
//! trusted file's size, mtime, inode and device); the answer is the stream
//! `warren_checkpoint::produce` writes (every entry of the tree, with content only for files
//! whose stat no longer matches), which the gateway hands to `CheckpointStore::take_streamed`.
//!
//! As the snapshot route does, it runs the sync walk on a blocking thread joined to the
//! response body by a bounded channel, so memory is bounded whatever the tree's size, and a
//! failure midway aborts the body (the stream then lacks its end record, which its consumer
//! refuses as truncated). The body is bounded ([`MAX_KNOWN_BYTES`]); the walk changes nothing
//! in the tree.

use std::collections::BTreeMap;
use std::io;

use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc;
use warren_checkpoint::Known;
use warren_protocol::error::ErrorBody;

use super::{CHUNK_BYTES, CHUNKS_IN_FLIGHT, ChannelWriter, TreeQuery, Workspace, WorkspaceError};
use crate::error::{ApiError, Json};
use crate::route_helpers;

/// The largest body the route reads: `Known` of about half a million files.
pub(super) const MAX_KNOWN_BYTES: usize = 64 * 1024 * 1024;

/// The request body's schema: `warren_checkpoint::Known`, which the body is parsed as (that
/// crate knows no HTTP, so it derives no schema).
#[derive(utoipa::ToSchema)]
#[schema(as = Known)]
#[allow(dead_code)] // Documentation only.
struct KnownSchema {
    /// Path (relative to the tree's root, `/`-separated) → the stat the last checkpoint
    /// recorded; absent or empty when there is no checkpoint to compare with.
    files: Option<BTreeMap<String, KnownFileSchema>>,
}

/// `warren_checkpoint::KnownFile`.
#[derive(utoipa::ToSchema)]
#[schema(as = KnownFile)]
#[allow(dead_code)] // Documentation only.
struct KnownFileSchema {
    size: u64,
    /// Nanoseconds since the epoch.
    mtime_ns: i64,
    ino: u64,
    dev: u64,
}

/// Streams what changed in the tree since the checkpoint the body describes.
#[utoipa::path(
    post, path = "/v1/workspace/changes", tag = "workspace",
    params(TreeQuery),
    request_body(content = KnownSchema, content_type = "application/json", description = "What the last checkpoint of the tree knows: each file it trusts, by path, with its size, mtime, inode and device. `{}` knows nothing: every file's content is sent"),
    responses(
        (status = 200, description = "The changes stream (`warren_checkpoint::produce`: every entry, with content only for files whose stat differs from the body's); a failure midway aborts the body", content_type = "application/vnd.warren.checkpoint-changes", body = [u8]),
        (status = 400, description = "`INVALID_REQUEST_BODY`: a body that is not JSON of this shape, an unknown `tree` or a query that does not parse", body = ErrorBody),
        (status = 413, description = "`INVALID_REQUEST_BODY`: a body over 64 MiB", body = ErrorBody),
        (status = 500, description = "`RUNTIME_ERROR`: the tree cannot be read", body = ErrorBody),
    )
)]
pub(super) async fn changes(
    State(workspace): State<Workspace>,
    query: Result<Query<TreeQuery>, QueryRejection>,
    Json(known): Json<Known>,
) -> Result<Response, ApiError> {
    let query = route_helpers::query(query)?;
    let root = workspace.tree(&query)?;
    // A root that cannot be read is an error answer, not a broken stream.
    drop(
        tokio::fs::read_dir(root.as_path())
            .await
            .map_err(WorkspaceError::Unreadable)?,
    );
    let (sender, receiver) = mpsc::channel::<io::Result<Bytes>>(CHUNKS_IN_FLIGHT);
    tokio::task::spawn_blocking(move || {
        let mut writer = ChannelWriter {
            sender: sender.clone(),
            buffer: Vec::with_capacity(CHUNK_BYTES),
        };
        // `produce` flushes the writer: the last chunk goes before the stream ends.
        let produced = warren_checkpoint::produce(&root, &known, &mut writer);
        match produced {
            Ok(stats) => tracing::info!(
                entries = stats.entries,
                files_read = stats.files_read,
                files_unchanged = stats.files_unchanged,
                bytes_read = stats.bytes_read,
                skipped = stats.skipped,
                n_changed_under = stats.changed_under.len(),
                elapsed_ms = stats.elapsed.as_millis() as u64,
                "checkpoint changes streamed"
            ),
            Err(error) => {
                tracing::warn!(%error, "checkpoint changes failed midway; aborting the body");
                // The client may be gone already; then there is nobody to tell.
                let _ = sender.blocking_send(Err(io::Error::other(error.to_string())));
            }
        }
    });
    let chunks = futures_util::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|chunk| (chunk, receiver))
    });
    Ok((
        [(
            header::CONTENT_TYPE,
            warren_checkpoint::CHANGES_CONTENT_TYPE,
        )],
        Body::from_stream(chunks),
    )
        .into_response())
}
