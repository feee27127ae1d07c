//! `POST /v1/workspace/patch?tree=workspace|home`: a rewind of this execd's tree to a
//! checkpoint the gateway holds. The body is a patch `CheckpointStore::patch` wrote (what turns
//! the tree as the gateway last checkpointed it into the checkpoint wanted), streamed into
//! `warren_checkpoint::apply_patch` on a blocking thread through `SyncIoBridge`, holding the
//! lock the restore route holds, so a patch and a restore never race in one tree.
//!
//! The route has no body size limit of its own: the patch's format bounds what it reads, and
//! nothing in the tree changes until the whole patch has arrived and checked out (a cut,
//! garbage or unsafe patch changes nothing). What execd writes is its own user's, as a restore's
//! is: execd runs as the sandbox's user, so no owner is given.

use std::io;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use futures_util::TryStreamExt;
use tokio_util::io::{StreamReader, SyncIoBridge};
use warren_protocol::error::ErrorBody;
use warren_protocol::hands::PatchResult;

use super::{TreeQuery, Workspace};
use crate::error::ApiError;
use crate::route_helpers;

/// Why a patch failed, before any status exists (`crate::error` picks them).
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// What `apply_patch` refused or failed with.
    #[error(transparent)]
    Apply(#[from] warren_checkpoint::Error),
    /// The blocking task ended without an answer (it panicked).
    #[error("patch task failed: {0}")]
    Task(String),
}

/// Applies a patch (the body) to the tree.
#[utoipa::path(
    post, path = "/v1/workspace/patch", tag = "workspace",
    params(TreeQuery),
    request_body(content = [u8], content_type = "application/octet-stream", description = "A patch as the gateway's checkpoint store writes it (`warren_checkpoint::CheckpointStore::patch`; the content type is not checked)"),
    responses(
        (status = 200, description = "Applied: the tree is the checkpoint's", body = PatchResult),
        (status = 400, description = "`INVALID_REQUEST_BODY` (an unknown `tree`), `PATCH_CORRUPT` (cut, garbage, a chunk that does not match its hash) or `PATCH_UNSAFE_ENTRY` (a path out of the tree or through a link); the tree is unchanged", body = ErrorBody),
        (status = 409, description = "`PATCH_STALE`: a file the patch keeps is missing or of another size (the tree changed since the checkpoint the patch was made against); the tree is unchanged", body = ErrorBody),
        (status = 500, description = "`RUNTIME_ERROR`", body = ErrorBody),
        (status = 507, description = "`STORAGE_FULL`", body = ErrorBody),
    )
)]
pub(super) async fn patch(
    State(workspace): State<Workspace>,
    query: Result<Query<TreeQuery>, QueryRejection>,
    body: Body,
) -> Result<Json<PatchResult>, ApiError> {
    let query = route_helpers::query(query)?;
    let root = workspace.tree(&query)?;
    let _restoring = workspace.restoring.lock().await;
    let stream = body.into_data_stream().map_err(io::Error::other);
    let mut reader = SyncIoBridge::new(StreamReader::new(stream));
    let applied = tokio::task::spawn_blocking(move || {
        warren_checkpoint::apply_patch(&root, &mut reader, None)
    })
    .await
    .map_err(|e| PatchError::Task(e.to_string()))?;
    let stats = applied.map_err(PatchError::Apply)?;
    tracing::info!(?stats, "workspace patched");
    Ok(Json(PatchResult {
        files_written: stats.files_written,
        bytes_written: stats.bytes_written,
        removed: stats.removed,
    }))
}
