//! Wire types of execd's Warren file routes (`/v1/files*`), the gateway's file browser: a
//! directory listing, a move, what an upload wrote, and one line of the change feed
//! (`GET /v1/files/watch`, one JSON object per line). See `docs/exec-tools.md`.
//!
//! Every `path` here is relative to execd's `--root`, `/`-separated, without a leading `/`
//! (`"sub/inner.txt"`; `""` is the root itself), except the paths of a [`MoveRequest`] and
//! [`FileWritten::path`], which are as the client wrote them (relative or absolute beneath the
//! root).

use serde::{Deserialize, Serialize};

/// What a directory entry is. A symlink is described, never followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    /// A FIFO, socket or device.
    Other,
}

/// One entry of a [`FileList`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FileEntry {
    /// The entry's own name (lossy UTF-8).
    pub name: String,
    /// Root-relative: `"sub/inner.txt"`.
    pub path: String,
    #[serde(rename = "type")]
    pub kind: FileKind,
    /// Bytes; for a symlink the length of its target.
    pub size: u64,
    /// Permission bits (`0o7777` of `st_mode`), e.g. `0o644` = 420.
    pub mode: u32,
    /// Last modification, RFC 3339 UTC with milliseconds: `2026-12-01T10:00:00.000Z`.
    pub modified_at: String,
    /// A symlink's target as stored (lossy UTF-8); only on symlinks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// `GET /v1/files/list?path=P&depth=N`: the entries below a directory, sorted by `path`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FileList {
    /// The listed directory, root-relative (`""` for the root).
    pub path: String,
    pub entries: Vec<FileEntry>,
    /// A limit (10,000 entries) left entries out.
    #[serde(default)]
    pub truncated: bool,
}

/// `POST /v1/files/move`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MoveRequest {
    #[schema(min_length = 1)]
    pub from: String,
    #[schema(min_length = 1)]
    pub to: String,
    /// Replace an existing `to` (without it, an existing `to` is 409 `FILE_EXISTS`).
    #[serde(default)]
    pub overwrite: bool,
}

/// The answer to `PUT /v1/files?path=P` (201 created, 200 replaced).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FileWritten {
    /// The path as the request gave it.
    pub path: String,
    /// Bytes written.
    pub size: u64,
}

/// One line of `GET /v1/files/watch`: root-relative paths created, modified, removed or
/// renamed since the last line. The first line has no paths (the watch is in place); `""`
/// among the paths means more changed than one line holds, or the kernel dropped events:
/// whatever a client shows may be stale.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FileChanges {
    pub paths: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_name_their_type_in_lowercase_and_keep_target_only_on_links() {
        let entry = FileEntry {
            name: "inner.txt".into(),
            path: "sub/inner.txt".into(),
            kind: FileKind::File,
            size: 3,
            mode: 0o644,
            modified_at: "2026-12-01T10:00:00.000Z".into(),
            target: None,
        };
        assert_eq!(
            serde_json::to_value(&entry).expect("serializes"),
            serde_json::json!({
                "name": "inner.txt", "path": "sub/inner.txt", "type": "file", "size": 3,
                "mode": 420, "modified_at": "2026-12-01T10:00:00.000Z"
            })
        );
        let link: FileEntry = serde_json::from_value(serde_json::json!({
            "name": "l", "path": "l", "type": "symlink", "size": 4, "mode": 511,
            "modified_at": "2026-12-01T10:00:00.000Z", "target": "/etc"
        }))
        .expect("parses");
        assert_eq!(
            (link.kind, link.target.as_deref()),
            (FileKind::Symlink, Some("/etc"))
        );
        let kinds = [FileKind::Dir, FileKind::Other];
        let names = kinds.map(|kind| serde_json::to_string(&kind).expect("serializes"));
        assert_eq!(names, ["\"dir\"", "\"other\""]);
    }

    #[test]
    fn optional_fields_default() {
        let list: FileList = serde_json::from_str(r#"{"path":"","entries":[]}"#).expect("parses");
        assert!(!list.truncated);
        let request: MoveRequest =
            serde_json::from_str(r#"{"from":"a","to":"b"}"#).expect("parses");
        assert!(!request.overwrite);
    }
}
