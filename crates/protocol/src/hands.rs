//! Wire types of the hands' own routes on execd: who this execd is (`GET /v1/hands/identity`,
//! the nonce the gateway checks on every (re)connect, so another sandbox is never taken for
//! this one), what a workspace restore wrote (`POST /v1/workspace/restore`) and what a patch
//! did (`POST /v1/workspace/patch`). The snapshot itself is a zstd-compressed tar and the patch
//! a binary stream (`warren_checkpoint::apply_patch`), not JSON.

use serde::{Deserialize, Serialize};

/// The header a client sends with the nonce it expects; a different one answers 409
/// `HANDS_IDENTITY_MISMATCH`.
pub const HANDS_NONCE_HEADER: &str = "X-Warren-Hands-Nonce";

/// `GET /v1/hands/identity`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HandsIdentity {
    /// Random per hands instance (given by `--hands-nonce`, else made at start).
    pub nonce: String,
    /// When this execd started, RFC 3339.
    pub started_at: String,
    /// The workspace as this execd sees it (its `--root`, e.g. `/workspace` in a sandbox):
    /// paths the gateway sends are beneath it.
    pub root: String,
}

/// The answer to `POST /v1/workspace/restore`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RestoreResult {
    /// Regular files (hard links included) written.
    pub files: u64,
    /// File content bytes written.
    pub bytes: u64,
}

/// The answer to `POST /v1/workspace/patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PatchResult {
    /// Files written from the patch's content (new or changed since the checkpoint it was made
    /// against).
    pub files_written: u64,
    /// Their bytes.
    pub bytes_written: u64,
    /// Paths removed, every entry beneath a removed directory counted.
    pub removed: u64,
}
