//! What keeps a session's files while its hands do not run, when their tree is on this disk:
//! the session's checkpoints (checkpoints.md), kept by the engine and handed to the hands as a
//! [`Keeper`]. A pause stores one (or finds the newest still current), an archive removes the
//! trees once one holds them, and a restore rebuilds the trees from the newest before the
//! sandbox starts. Hands reached by URL have no tree here and keep the whole-tar snapshot.

use warren_brain::BoxFuture;

use crate::snapshots::SnapshotInfo;

/// A session's checkpoints, as the hands' lifecycle uses them.
pub trait Keeper: Send + Sync {
    /// A checkpoint of the workspace (and the agent's home) as they are now, `reason` its
    /// label (`pause`, `files`); the newest one when nothing changed since it. An error
    /// leaves every earlier checkpoint as it was.
    fn keep(&self, reason: &'static str) -> BoxFuture<'_, Result<SnapshotInfo, String>>;

    /// The newest checkpoint, if there is one.
    fn newest(&self) -> BoxFuture<'_, Option<SnapshotInfo>>;

    /// Rebuilds the workspace (and the agent's home, when the checkpoint holds one) from the
    /// newest checkpoint, whole or not at all; no sandbox uses them meanwhile.
    fn restore_newest(&self) -> BoxFuture<'_, Result<(), String>>;
}
