//! The person's files (files-terminals-previews.md "Files"): list, download (with `Range`),
//! upload, mkdir, move and delete in a session's workspace.
//!
//! Where an answer comes from: running hands answer through their execd's confined file routes,
//! so the walk happens inside the sandbox (`..`, links out, swaps, FIFOs and devices are refused
//! there, and a read never leaves the sandbox's view). Hands that do not run are never started or
//! resumed to be browsed: paused, archived or lost hands are answered from the session's newest
//! checkpoint (a pause stores one, so it holds the files as they are; links are described, not
//! followed), or, for remote hands and sessions archived before checkpoints kept their files, from
//! the whole-tar snapshot, following its own links by the same rule; a session with neither lists
//! an empty root. Mutations start, resume or restore the hands, go through execd, and are followed
//! by a checkpoint or snapshot ([`Hands::snapshot_soon`]).
//!
//! Paths are normalized here first, one rule for both sources: `/`-separated and relative to the
//! workspace root (a leading `/` is the root, never the host's), `.` dropped, `..` resolved
//! lexically and refused with 403 `PATH_ESCAPE` when it climbs above the root; NUL bytes, paths
//! over [`MAX_PATH_BYTES`] and query values that are not UTF-8 are 400 `INVALID_PATH`.
//!
//! [`Hands::snapshot_soon`]: crate::hands::Hands::snapshot_soon

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{FromRequestParts, Request};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use warren_execd_client::{ClientError, ExecdClient};
use warren_http::range::{RangeAnswer, parse_range};
use warren_protocol::error::ErrorBody;
use warren_protocol::files::{FileEntry, FileKind, FileList, MoveRequest};
use warren_snapshot::{ArchivedEntry, EntryKind};

use crate::Gateway;
use crate::auth::Device;
use crate::error::{GatewayError, Json, Path};
use crate::files_error::{FilesError, FilesErrorKind, shown};
use crate::hands::HandsError;
use crate::hands::snapshots::SnapshotStore;
use crate::session::Session;
use warren_snapshot::SnapshotError;

/// The longest path a request may name.
pub const MAX_PATH_BYTES: usize = 4096;
/// The deepest listing one request may ask for.
pub const MAX_DEPTH: u32 = 5;
/// The most entries one listing answers (then `truncated`), as execd's.
pub const MAX_LISTED: usize = 10_000;
/// Links followed in a snapshot before the path is refused (the kernel's limit).
const MAX_LINKS: usize = 40;

/// execd's answer as the gateway's error: its file codes as [`FilesError`]s, the rest as the
/// hands failing.
fn execd_error(error: ClientError) -> GatewayError {
    if let ClientError::Api { code, message, .. } = &error {
        if let Some(kind) = FilesErrorKind::from_execd(code) {
            return FilesError::new(kind, message.clone()).into();
        }
        if code == "HANDS_IDENTITY_MISMATCH" {
            return HandsError::IdentityMismatch(message.clone()).into();
        }
    }
    HandsError::Failed(error.to_string()).into()
}

/// `raw` as a workspace-relative path (`""` for the root); see the module docs.
pub fn workspace_path(raw: &str) -> Result<String, FilesError> {
    if raw.contains('\0') {
        return Err(FilesError::new(
            FilesErrorKind::InvalidPath,
            "the path contains a NUL byte",
        ));
    }
    if raw.len() > MAX_PATH_BYTES {
        return Err(FilesError::new(
            FilesErrorKind::InvalidPath,
            format!(
                "the path is {} bytes long; at most {MAX_PATH_BYTES} are taken",
                raw.len()
            ),
        ));
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in raw.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(FilesError::escape(raw));
                }
            }
            name => parts.push(name),
        }
    }
    Ok(parts.join("/"))
}

/// The query parameters of the files routes, percent-decoded (`+` is a space, as browsers'
/// `URLSearchParams` write it).
#[derive(Debug, Default)]
pub(crate) struct FileQuery {
    path: Option<String>,
    depth: Option<String>,
    recursive: Option<String>,
}

impl FileQuery {
    pub(crate) fn parse(query: Option<&str>) -> Result<Self, FilesError> {
        let mut parsed = FileQuery::default();
        for pair in query
            .unwrap_or("")
            .split('&')
            .filter(|pair| !pair.is_empty())
        {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let slot = match key {
                "path" => &mut parsed.path,
                "depth" => &mut parsed.depth,
                "recursive" => &mut parsed.recursive,
                _ => continue,
            };
            let value = value.replace('+', " ");
            let bytes: Vec<u8> = percent_encoding::percent_decode_str(&value).collect();
            let text = String::from_utf8(bytes).map_err(|_| {
                FilesError::new(
                    FilesErrorKind::InvalidPath,
                    format!("the {key} parameter is not valid UTF-8"),
                )
            })?;
            *slot = Some(text);
        }
        Ok(parsed)
    }

    /// The normalized `path` (absent: the root).
    pub(crate) fn path(&self) -> Result<String, FilesError> {
        workspace_path(self.path.as_deref().unwrap_or(""))
    }

    /// The normalized `path`, which must name something below the root.
    pub(crate) fn file_path(&self) -> Result<String, FilesError> {
        let path = self.path()?;
        if path.is_empty() {
            return Err(FilesError::new(
                FilesErrorKind::InvalidPath,
                "the path names the workspace root, not a file in it",
            ));
        }
        Ok(path)
    }

    pub(crate) fn depth(&self) -> Result<u32, FilesError> {
        match self.depth.as_deref() {
            None => Ok(1),
            Some(text) => text
                .parse::<u32>()
                .ok()
                .filter(|depth| (1..=MAX_DEPTH).contains(depth))
                .ok_or_else(|| {
                    FilesError::new(
                        FilesErrorKind::InvalidQuery,
                        format!("depth must be 1 to {MAX_DEPTH}, not {text:?}"),
                    )
                }),
        }
    }

    fn recursive(&self) -> Result<bool, FilesError> {
        match self.recursive.as_deref() {
            None | Some("false" | "0") => Ok(false),
            Some("true" | "1") => Ok(true),
            Some(other) => Err(FilesError::new(
                FilesErrorKind::InvalidQuery,
                format!("recursive must be true or false, not {other:?}"),
            )),
        }
    }
}

/// What every files route starts from: the device's session (another device's is 404
/// `SESSION_NOT_FOUND`) and the parsed query.
struct FileRequest {
    gateway: Arc<Gateway>,
    session: Arc<Session>,
    query: FileQuery,
}

impl FromRequestParts<Arc<Gateway>> for FileRequest {
    type Rejection = GatewayError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        gateway: &Arc<Gateway>,
    ) -> Result<Self, GatewayError> {
        let Device(device_id) = Device::from_request_parts(parts, gateway).await?;
        let Path(id) = Path::<String>::from_request_parts(parts, gateway).await?;
        let session = gateway.engine.sessions.get(&device_id, &id)?;
        let query = FileQuery::parse(parts.uri.query())?;
        Ok(Self {
            gateway: gateway.clone(),
            session,
            query,
        })
    }
}

/// The files routes, each registered by the `routes!` call that documents it.
pub fn routes() -> OpenApiRouter<Arc<Gateway>> {
    OpenApiRouter::new()
        .routes(routes!(list, delete))
        .routes(routes!(download, upload))
        .routes(routes!(make_dir))
        .routes(routes!(move_file))
}

/// `PUT /files/content`'s answer.
#[derive(serde::Serialize, utoipa::ToSchema)]
struct Uploaded {
    /// Workspace-relative.
    path: String,
    size: u64,
}

/// `POST /files/dir`'s answer.
#[derive(serde::Serialize, utoipa::ToSchema)]
struct DirMade {
    /// Workspace-relative (`""` for the root).
    path: String,
}

/// `POST /files/move`'s answer.
#[derive(serde::Serialize, utoipa::ToSchema)]
struct Moved {
    from: String,
    to: String,
}

/// The stored files' entries by path, as read once per checkpoint or snapshot file.
struct Listing {
    entries: BTreeMap<String, ArchivedEntry>,
    /// The workspace as the hands' execd sees it (`/workspace` in bwrap), which an absolute
    /// link inside the workspace spells; `None` when unknown (absolute links then lead out).
    root: Option<std::path::PathBuf>,
    /// Where the files' bytes are read.
    origin: Origin,
}

/// Where an archived listing's files are.
enum Origin {
    /// The session's newest checkpoint.
    Checkpoint {
        store: Arc<warren_checkpoint::CheckpointStore>,
        manifest: Arc<warren_checkpoint::Manifest>,
    },
    /// The whole-tar snapshot.
    Snapshot(SnapshotStore),
}

/// Which checkpoint, or which version of the snapshot file, a listing was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum StoredVersion {
    Checkpoint(String),
    Snapshot {
        modified: std::time::SystemTime,
        len: u64,
        inode: u64,
    },
}

/// The files routes' state: each session's last snapshot listing (archived sessions are browsed
/// page by page; the archive is decompressed once per snapshot, not once per page).
#[derive(Default)]
pub struct Files {
    listings: Mutex<HashMap<String, (StoredVersion, Arc<Listing>)>>,
}

impl Files {
    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, (StoredVersion, Arc<Listing>)>> {
        self.listings
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Forgets the session's listing (it is deleted).
    pub fn forget(&self, session_id: &str) {
        self.cache().remove(session_id);
    }

    /// The listing `version` of the session read before, if it is still the one asked for.
    fn cached(
        &self,
        session_id: &str,
        version: &StoredVersion,
        root: &Option<std::path::PathBuf>,
    ) -> Option<Arc<Listing>> {
        let cache = self.cache();
        let (cached, listing) = cache.get(session_id)?;
        (cached == version && listing.root == *root).then(|| listing.clone())
    }

    fn keep(&self, session_id: &str, version: StoredVersion, listing: &Arc<Listing>) {
        self.cache()
            .insert(session_id.to_owned(), (version, listing.clone()));
    }

    /// The session's snapshot listing, read anew when the snapshot changed.
    async fn snapshot_listing(
        &self,
        session_id: &str,
        store: &SnapshotStore,
        root: Option<std::path::PathBuf>,
    ) -> Result<Arc<Listing>, GatewayError> {
        use std::os::unix::fs::MetadataExt;
        let metadata = tokio::fs::metadata(store.cached_path().await?).await?;
        let version = StoredVersion::Snapshot {
            modified: metadata.modified()?,
            len: metadata.len(),
            inode: metadata.ino(),
        };
        if let Some(listing) = self.cached(session_id, &version, &root) {
            return Ok(listing);
        }
        let entries = store.list().await.map_err(snapshot_error)?;
        let listing = Arc::new(Listing {
            entries: entries
                .into_iter()
                .map(|entry| (entry.path.clone(), entry))
                .collect(),
            root,
            origin: Origin::Snapshot(store.clone()),
        });
        self.keep(session_id, version, &listing);
        Ok(listing)
    }

    /// The listing of the session's checkpoint `id`, read once: its entries as a snapshot
    /// would hold them (a link that leads out of the workspace is not kept, by `pack`'s rule).
    async fn checkpoint_listing(
        &self,
        gateway: &Gateway,
        session: &Session,
        id: String,
        root: Option<std::path::PathBuf>,
    ) -> Result<Arc<Listing>, GatewayError> {
        let version = StoredVersion::Checkpoint(id.clone());
        if let Some(listing) = self.cached(&session.id, &version, &root) {
            return Ok(listing);
        }
        let (stores, loaded) = gateway.engine.checkpoints.load(session, &id, false).await?;
        let manifest = loaded.workspace;
        let mut entries = BTreeMap::new();
        for entry in &manifest.entries {
            let (kind, size, link_target) = match &entry.content {
                warren_checkpoint::Content::File(_) => (EntryKind::File, entry.size, None),
                warren_checkpoint::Content::Dir => (EntryKind::Dir, 0, None),
                warren_checkpoint::Content::Symlink(target) => {
                    let target_path = std::path::Path::new(target);
                    if !warren_snapshot::path::link_kept(root.as_deref(), &entry.path, target_path)
                    {
                        continue;
                    }
                    (EntryKind::Symlink, 0, Some(target.clone()))
                }
            };
            let archived = ArchivedEntry {
                path: entry.path.clone(),
                kind,
                size,
                mode: entry.mode,
                mtime: entry.mtime_ns.div_euclid(1_000_000_000),
                link_target,
            };
            entries.insert(entry.path.clone(), archived);
        }
        let listing = Arc::new(Listing {
            entries,
            root,
            origin: Origin::Checkpoint {
                store: stores.workspace.clone(),
                manifest: Arc::new(manifest),
            },
        });
        self.keep(&session.id, version, &listing);
        Ok(listing)
    }
}

fn snapshot_error(error: SnapshotError) -> GatewayError {
    GatewayError::Internal(format!("cannot read the snapshot: {error}"))
}

/// Where a browsing request is answered from.
enum Source {
    /// The running hands (held awake while the answer is made).
    Live(ExecdClient, crate::hands::HandsHold),
    /// The session's stored files (the hands do not run): its newest checkpoint, or the
    /// whole-tar snapshot of remote hands and of sessions archived before checkpoints kept
    /// their files.
    Snapshot(Arc<Listing>),
    /// No hands and no snapshot: an empty workspace.
    Empty,
}

async fn source(gateway: &Gateway, session: &Session) -> Result<Source, GatewayError> {
    if let Some((endpoint, hold)) = session.hands.running_endpoint().await {
        return Ok(Source::Live(endpoint.client()?, hold));
    }
    let root = session.hands.root_as_seen();
    if session.hands.keeper().is_some()
        && let Some(newest) = gateway.engine.checkpoints.newest(session).await
    {
        let listing = gateway
            .files
            .checkpoint_listing(gateway, session, newest.id, root);
        return Ok(Source::Snapshot(listing.await?));
    }
    let store = session.hands.snapshots();
    if !store.is_stored().await {
        return Ok(Source::Empty);
    }
    Ok(Source::Snapshot(
        gateway
            .files
            .snapshot_listing(&session.id, store, root)
            .await?,
    ))
}

impl Listing {
    /// The archive path `path` names, following the snapshot's links as the live walk does: an
    /// absolute link continues from the root when it spells the workspace's own path
    /// ([`warren_snapshot::path::beneath_root`], execd's rule too), and a link that leads
    /// anywhere else or climbs out is an escape.
    fn resolve(&self, path: &str) -> Result<String, FilesError> {
        let mut pending: std::collections::VecDeque<String> =
            path.split('/').map(str::to_owned).collect();
        let mut resolved: Vec<String> = Vec::new();
        let mut links = 0;
        while let Some(part) = pending.pop_front() {
            match part.as_str() {
                "" | "." => continue,
                ".." => {
                    if resolved.pop().is_none() {
                        return Err(FilesError::escape(path));
                    }
                    continue;
                }
                _ => {}
            }
            resolved.push(part);
            let key = resolved.join("/");
            let Some(entry) = self.entries.get(&key) else {
                return Err(FilesError::not_found(path));
            };
            match entry.kind {
                EntryKind::Symlink => {
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(FilesError::new(
                            FilesErrorKind::InvalidPath,
                            format!("{}: too many levels of symbolic links", shown(path)),
                        ));
                    }
                    let target = entry.link_target.clone().unwrap_or_default();
                    resolved.pop();
                    if target.starts_with('/') {
                        let steps = self.root.as_deref().and_then(|root| {
                            warren_snapshot::path::beneath_root(root, std::path::Path::new(&target))
                        });
                        let Some(steps) = steps else {
                            return Err(FilesError::escape(path));
                        };
                        resolved.clear();
                        for step in steps.into_iter().rev() {
                            pending.push_front(match step {
                                warren_snapshot::path::Step::Parent => "..".to_owned(),
                                warren_snapshot::path::Step::Name(name) => {
                                    name.to_string_lossy().into_owned()
                                }
                            });
                        }
                    } else {
                        for part in target.split('/').rev() {
                            pending.push_front(part.to_owned());
                        }
                    }
                }
                EntryKind::Dir => {}
                EntryKind::File | EntryKind::HardLink if !pending.is_empty() => {
                    return Err(FilesError::new(
                        FilesErrorKind::NotADirectory,
                        format!("{}: a component of it is not a directory", shown(path)),
                    ));
                }
                EntryKind::File | EntryKind::HardLink => {}
            }
        }
        Ok(resolved.join("/"))
    }

    /// The size of the file at archive path `path` (a hard link's is its target's).
    fn file_size(&self, path: &str) -> Result<u64, FilesError> {
        let entry = self
            .entries
            .get(path)
            .ok_or_else(|| FilesError::not_found(path))?;
        match entry.kind {
            EntryKind::File => Ok(entry.size),
            EntryKind::HardLink => Ok(entry
                .link_target
                .as_deref()
                .and_then(|target| self.entries.get(target))
                .map_or(0, |target| target.size)),
            EntryKind::Dir | EntryKind::Symlink => Err(FilesError::new(
                FilesErrorKind::NotRegular,
                format!("{} is not a regular file", shown(path)),
            )),
        }
    }

    fn is_dir(&self, path: &str) -> bool {
        path.is_empty()
            || self
                .entries
                .get(path)
                .is_some_and(|entry| entry.kind == EntryKind::Dir)
    }

    /// `GET /files` of `path` (as asked, normalized) from the snapshot.
    fn list(&self, path: &str, depth: u32) -> Result<FileList, FilesError> {
        let dir = self.resolve(path)?;
        if !self.is_dir(&dir) {
            return Err(FilesError::new(
                FilesErrorKind::NotADirectory,
                format!("{} is not a directory", shown(path)),
            ));
        }
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        let mut entries = Vec::new();
        let mut truncated = false;
        let below = self
            .entries
            .range(prefix.clone()..)
            .take_while(|(key, _)| key.starts_with(&prefix));
        for (key, entry) in below {
            let relative = &key[prefix.len()..];
            if relative.is_empty() || relative.split('/').count() > depth as usize {
                continue;
            }
            if entries.len() == MAX_LISTED {
                truncated = true;
                break;
            }
            entries.push(self.entry(path, relative, entry));
        }
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(FileList {
            path: path.to_owned(),
            entries,
            truncated,
        })
    }

    fn entry(&self, listed: &str, relative: &str, entry: &ArchivedEntry) -> FileEntry {
        let name = relative.rsplit('/').next().unwrap_or(relative).to_owned();
        let path = if listed.is_empty() {
            relative.to_owned()
        } else {
            format!("{listed}/{relative}")
        };
        let (kind, size, target) = match entry.kind {
            EntryKind::File => (FileKind::File, entry.size, None),
            EntryKind::HardLink => (
                FileKind::File,
                self.file_size(&entry.path).unwrap_or(0),
                None,
            ),
            EntryKind::Dir => (FileKind::Dir, 0, None),
            EntryKind::Symlink => (FileKind::Symlink, 0, entry.link_target.clone()),
        };
        let modified_at = chrono::DateTime::<chrono::Utc>::from_timestamp(entry.mtime, 0)
            .unwrap_or_default()
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        FileEntry {
            name,
            path,
            kind,
            size,
            mode: entry.mode,
            modified_at,
            target,
        }
    }
}

/// `GET /v1/sessions/{id}/files?path=&depth=`.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/files",
    tag = "files",
    params(("id" = String, Path, description = "The session's id"), ("path" = Option<String>, Query, description = "Workspace-relative (a leading `/` is the root); absent: the root"), ("depth" = Option<u32>, Query, minimum = 1, maximum = 5, description = "Levels listed, 1 to 5 (default 1)")),
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 200, description = "The directory's entries (live, or from the snapshot while the hands do not run)", body = FileList),
        (status = 400, description = "INVALID_PATH (NUL, too long, not UTF-8, the root where a file is needed), INVALID_QUERY or NAME_TOO_LONG", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 403, description = "PATH_ESCAPE (leads outside the workspace), NOT_REGULAR_FILE or PERMISSION_DENIED", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND, or FILE_NOT_FOUND", body = ErrorBody),
        (status = 409, description = "NOT_A_DIRECTORY, FILE_EXISTS, DIR_NOT_EMPTY, or HANDS_IDENTITY_MISMATCH", body = ErrorBody),
        (status = 502, description = "HANDS_FAILED: the hands' execd failed", body = ErrorBody),
    ),
)]
async fn list(request: FileRequest) -> Result<axum::Json<FileList>, GatewayError> {
    let FileRequest {
        gateway,
        session,
        query,
    } = request;
    let (path, depth) = (query.path()?, query.depth()?);
    let listed = match source(&gateway, &session).await? {
        Source::Live(client, _hold) => {
            let mut listed = client
                .list_files(if path.is_empty() { "." } else { &path }, depth)
                .await
                .map_err(execd_error)?;
            listed.path = path;
            listed
        }
        Source::Snapshot(listing) => listing.list(&path, depth)?,
        Source::Empty if path.is_empty() => FileList {
            path,
            entries: Vec::new(),
            truncated: false,
        },
        Source::Empty => return Err(FilesError::not_found(&path).into()),
    };
    Ok(axum::Json(listed))
}

/// `Content-Disposition: attachment` naming `path`'s last component: an ASCII `filename` for
/// old clients and RFC 5987's `filename*` with the exact name.
fn attachment(path: &str) -> HeaderValue {
    let name = path.rsplit('/').next().unwrap_or(path);
    let fallback: String = name
        .chars()
        .map(|c| match c {
            ' '..='~' if c != '"' && c != '\\' => c,
            _ => '_',
        })
        .collect();
    // RFC 5987 attr-char: ALPHA / DIGIT / "!#$&+-.^_`|~"; everything else percent-encoded.
    const ATTR: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'!')
        .remove(b'#')
        .remove(b'$')
        .remove(b'&')
        .remove(b'+')
        .remove(b'-')
        .remove(b'.')
        .remove(b'^')
        .remove(b'_')
        .remove(b'`')
        .remove(b'|')
        .remove(b'~');
    let encoded = percent_encoding::utf8_percent_encode(name, ATTR);
    HeaderValue::from_str(&format!(
        "attachment; filename=\"{fallback}\"; filename*=UTF-8''{encoded}"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("attachment"))
}

/// The headers every download answer carries.
pub(crate) fn download_headers(path: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    headers.insert(header::CONTENT_DISPOSITION, attachment(path));
    headers
}

/// 416 with `Content-Range: bytes */size`.
pub(crate) fn unsatisfiable(content_range: Option<String>) -> Response {
    let mut response = warren_http::error_response(
        StatusCode::RANGE_NOT_SATISFIABLE,
        "RANGE_NOT_SATISFIABLE",
        "the range lies outside the file".to_owned(),
    );
    if let Some(value) = content_range.and_then(|v| HeaderValue::from_str(&v).ok()) {
        response.headers_mut().insert(header::CONTENT_RANGE, value);
    }
    response
}

/// `GET /v1/sessions/{id}/files/content?path=`.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/files/content",
    tag = "files",
    params(("id" = String, Path, description = "The session's id"), ("path" = String, Query, description = "Workspace-relative file path"), ("Range" = Option<String>, Header, nullable = false, description = "One byte range, `bytes=start-end`")),
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 200, description = "The file", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 206, description = "The asked range, with Content-Range", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 400, description = "INVALID_PATH (NUL, too long, not UTF-8, the root where a file is needed), INVALID_QUERY or NAME_TOO_LONG", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 403, description = "PATH_ESCAPE (leads outside the workspace), NOT_REGULAR_FILE or PERMISSION_DENIED", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND, or FILE_NOT_FOUND", body = ErrorBody),
        (status = 409, description = "NOT_A_DIRECTORY, FILE_EXISTS, DIR_NOT_EMPTY, or HANDS_IDENTITY_MISMATCH", body = ErrorBody),
        (status = 416, description = "RANGE_NOT_SATISFIABLE: the range lies outside the file (Content-Range: bytes */size)", body = ErrorBody),
        (status = 502, description = "HANDS_FAILED: the hands' execd failed", body = ErrorBody),
    ),
)]
async fn download(request: FileRequest, asked: HeaderMap) -> Result<Response, GatewayError> {
    let FileRequest {
        gateway,
        session,
        query,
    } = request;
    let path = query.file_path()?;
    let range = asked
        .get(header::RANGE)
        .map(|value| value.as_bytes().to_vec());
    let mut headers = download_headers(&path);
    match source(&gateway, &session).await? {
        Source::Live(client, hold) => {
            let range = range.map(|r| String::from_utf8_lossy(&r).into_owned());
            let answer = client
                .download(&path, range.as_deref())
                .await
                .map_err(execd_error)?;
            if answer.status == StatusCode::RANGE_NOT_SATISFIABLE {
                return Ok(unsatisfiable(answer.content_range));
            }
            if let Some(length) = answer.content_length {
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
            }
            if let Some(value) = answer
                .content_range
                .and_then(|value| HeaderValue::from_str(&value).ok())
            {
                headers.insert(header::CONTENT_RANGE, value);
            }
            // The hold lives as long as the body: the hands do not pause mid-download.
            let body = answer.body.map(move |chunk| {
                let _held = &hold;
                chunk.map_err(std::io::Error::other)
            });
            Ok((answer.status, headers, Body::from_stream(body)).into_response())
        }
        Source::Snapshot(listing) => {
            let archived = listing.resolve(&path)?;
            let size = listing.file_size(&archived)?;
            let (status, range) = match range.map(|r| parse_range(&r, size)) {
                None | Some(RangeAnswer::Whole) => (StatusCode::OK, 0..size),
                Some(RangeAnswer::Part { start, end }) => {
                    headers.insert(
                        header::CONTENT_RANGE,
                        HeaderValue::from_str(&format!("bytes {start}-{end}/{size}"))
                            .map_err(|e| GatewayError::Internal(e.to_string()))?,
                    );
                    (StatusCode::PARTIAL_CONTENT, start..end + 1)
                }
                Some(RangeAnswer::Unsatisfiable) => {
                    return Ok(unsatisfiable(Some(format!("bytes */{size}"))));
                }
            };
            headers.insert(
                header::CONTENT_LENGTH,
                HeaderValue::from(range.end - range.start),
            );
            let body = match &listing.origin {
                Origin::Snapshot(store) => snapshot_body(store.clone(), archived, range),
                Origin::Checkpoint { store, manifest } => {
                    let (store, manifest) = (store.clone(), manifest.clone());
                    crate::checkpoints::checkpoint_body(store, manifest, archived, range).await?
                }
            };
            Ok((status, headers, body).into_response())
        }
        Source::Empty => Err(FilesError::not_found(&path).into()),
    }
}

/// One file (a range of it) of a stored snapshot as a streamed body: the archive is read on a
/// blocking thread into a small channel, so memory stays flat whatever the file's size.
fn snapshot_body(store: SnapshotStore, path: String, range: std::ops::Range<u64>) -> Body {
    let (sender, receiver) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(4);
    let failed = sender.clone();
    tokio::spawn(async move {
        let out = std::io::BufWriter::with_capacity(64 * 1024, ChannelWriter(sender));
        if let Err(e) = store.read_file(&path, Some(range), out).await {
            tracing::debug!(error = %e, path, "snapshot download ended early");
            let _ = failed.send(Err(std::io::Error::other(e.to_string()))).await;
        }
    });
    Body::from_stream(tokio_stream_of(receiver))
}

pub(crate) fn tokio_stream_of<T: Send + 'static>(
    mut receiver: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + 'static {
    futures_util::stream::poll_fn(move |cx| receiver.poll_recv(cx))
}

/// A blocking writer into a body channel (a download that went away ends the read).
pub(crate) struct ChannelWriter(pub(crate) tokio::sync::mpsc::Sender<std::io::Result<Bytes>>);

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .blocking_send(Ok(Bytes::copy_from_slice(buf)))
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The hands for a mutation (started, resumed or restored), held awake while it runs.
async fn hands_for_change(
    session: &Session,
) -> Result<(ExecdClient, crate::hands::HandsHold), GatewayError> {
    let endpoint = session.hands.endpoint().await?;
    Ok((endpoint.client()?, session.hands.hold()))
}

/// `PUT /v1/sessions/{id}/files/content?path=`: the body streamed into the hands (a temp file
/// renamed into place by execd), at most `--upload-max` bytes.
#[utoipa::path(
    put,
    path = "/v1/sessions/{id}/files/content",
    tag = "files",
    params(("id" = String, Path, description = "The session's id"), ("path" = String, Query, description = "Workspace-relative file path")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The file's bytes, at most --upload-max"),
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 200, description = "Replaced", body = Uploaded),
        (status = 201, description = "Created", body = Uploaded),
        (status = 400, description = "INVALID_PATH, NAME_TOO_LONG, or INVALID_REQUEST_BODY: the upload was cut off", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 403, description = "PATH_ESCAPE (leads outside the workspace), NOT_REGULAR_FILE or PERMISSION_DENIED", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND, or FILE_NOT_FOUND", body = ErrorBody),
        (status = 409, description = "NOT_A_DIRECTORY, FILE_EXISTS, DIR_NOT_EMPTY, or HANDS_IDENTITY_MISMATCH", body = ErrorBody),
        (status = 413, description = "FILE_TOO_LARGE: over --upload-max", body = ErrorBody),
        (status = 502, description = "HANDS_FAILED: the hands' execd failed", body = ErrorBody),
        (status = 503, description = "HANDS_UNAVAILABLE: the hands cannot start", body = ErrorBody),
    ),
)]
async fn upload(files: FileRequest, request: Request) -> Result<Response, GatewayError> {
    let FileRequest {
        gateway,
        session,
        query,
    } = files;
    let path = query.file_path()?;
    let limit = gateway.args.upload_max;
    let too_large = || {
        FilesError::new(
            FilesErrorKind::TooLarge,
            format!("uploads are limited to {limit} bytes (--upload-max)"),
        )
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit) {
        return Err(too_large().into());
    }
    let (client, _hold) = hands_for_change(&session).await?;
    // Counted as it streams: past the limit (or when the client breaks off) the stream fails,
    // execd sees a broken body and removes its temp file, and nothing is left behind.
    let over = Arc::new(AtomicBool::new(false));
    let broken = Arc::new(AtomicBool::new(false));
    let (over_flag, broken_flag) = (over.clone(), broken.clone());
    let mut seen: u64 = 0;
    let body = request.into_body().into_data_stream().map(move |chunk| {
        let chunk = chunk.map_err(|e| {
            broken_flag.store(true, Ordering::Relaxed);
            std::io::Error::other(e.to_string())
        })?;
        seen += chunk.len() as u64;
        if seen > limit {
            over_flag.store(true, Ordering::Relaxed);
            return Err(std::io::Error::other("the upload is over --upload-max"));
        }
        Ok::<_, std::io::Error>(chunk)
    });
    let uploaded = client.upload(&path, reqwest::Body::wrap_stream(body)).await;
    session.hands.snapshot_soon();
    let uploaded = match uploaded {
        Ok(uploaded) => uploaded,
        Err(_) if over.load(Ordering::Relaxed) => return Err(too_large().into()),
        Err(_) if broken.load(Ordering::Relaxed) => {
            return Err(GatewayError::InvalidRequest(
                "the upload was cut off before its end; nothing was kept".into(),
            ));
        }
        Err(e) => return Err(execd_error(e)),
    };
    let status = if uploaded.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let written = Uploaded {
        path,
        size: uploaded.written.size,
    };
    Ok((status, axum::Json(written)).into_response())
}

/// `POST /v1/sessions/{id}/files/dir?path=`: mkdir -p (the root always exists).
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/files/dir",
    tag = "files",
    params(("id" = String, Path, description = "The session's id"), ("path" = Option<String>, Query, description = "Workspace-relative (a leading `/` is the root); absent: the root")),
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 201, description = "The directory exists (made with its parents)", body = DirMade),
        (status = 400, description = "INVALID_PATH (NUL, too long, not UTF-8, the root where a file is needed), INVALID_QUERY or NAME_TOO_LONG", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 403, description = "PATH_ESCAPE (leads outside the workspace), NOT_REGULAR_FILE or PERMISSION_DENIED", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND, or FILE_NOT_FOUND", body = ErrorBody),
        (status = 409, description = "NOT_A_DIRECTORY, FILE_EXISTS, DIR_NOT_EMPTY, or HANDS_IDENTITY_MISMATCH", body = ErrorBody),
        (status = 502, description = "HANDS_FAILED: the hands' execd failed", body = ErrorBody),
        (status = 503, description = "HANDS_UNAVAILABLE: the hands cannot start", body = ErrorBody),
    ),
)]
async fn make_dir(request: FileRequest) -> Result<Response, GatewayError> {
    let FileRequest { session, query, .. } = request;
    let path = query.path()?;
    if !path.is_empty() {
        let (client, _hold) = hands_for_change(&session).await?;
        client.make_dir(&path).await.map_err(execd_error)?;
        session.hands.snapshot_soon();
    }
    Ok((StatusCode::CREATED, axum::Json(DirMade { path })).into_response())
}

/// `POST /v1/sessions/{id}/files/move {"from","to","overwrite"?}`.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/files/move",
    tag = "files",
    params(("id" = String, Path, description = "The session's id")),
    request_body = MoveRequest,
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 200, description = "Moved", body = Moved),
        (status = 400, description = "INVALID_PATH (the root, NUL, too long), NAME_TOO_LONG, or INVALID_REQUEST_BODY: not a JSON object of this shape", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 403, description = "PATH_ESCAPE (leads outside the workspace), NOT_REGULAR_FILE or PERMISSION_DENIED", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND, or FILE_NOT_FOUND", body = ErrorBody),
        (status = 409, description = "NOT_A_DIRECTORY, FILE_EXISTS, DIR_NOT_EMPTY, or HANDS_IDENTITY_MISMATCH", body = ErrorBody),
        (status = 408, description = "REQUEST_TIMEOUT: the body did not arrive in time", body = ErrorBody),
        (status = 413, description = "BODY_TOO_LARGE", body = ErrorBody),
        (status = 502, description = "HANDS_FAILED: the hands' execd failed", body = ErrorBody),
        (status = 503, description = "HANDS_UNAVAILABLE: the hands cannot start", body = ErrorBody),
    ),
)]
async fn move_file(
    request: FileRequest,
    Json(body): Json<MoveRequest>,
) -> Result<Response, GatewayError> {
    let session = request.session;
    let (from, to) = (workspace_path(&body.from)?, workspace_path(&body.to)?);
    if from.is_empty() || to.is_empty() {
        return Err(FilesError::new(
            FilesErrorKind::InvalidPath,
            "the workspace root cannot be moved, nor anything moved onto it",
        )
        .into());
    }
    let (client, _hold) = hands_for_change(&session).await?;
    let request = MoveRequest {
        from: from.clone(),
        to: to.clone(),
        overwrite: body.overwrite,
    };
    client.move_file(&request).await.map_err(execd_error)?;
    session.hands.snapshot_soon();
    Ok(axum::Json(Moved { from, to }).into_response())
}

/// `DELETE /v1/sessions/{id}/files?path=&recursive=`.
#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}/files",
    tag = "files",
    params(("id" = String, Path, description = "The session's id"), ("path" = String, Query, description = "Workspace-relative; not the root"), ("recursive" = Option<bool>, Query, description = "Delete a non-empty directory too")),
    security(("device_token" = []), ("device_token_query" = [])),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "INVALID_PATH (NUL, too long, not UTF-8, the root where a file is needed), INVALID_QUERY or NAME_TOO_LONG", body = ErrorBody),
        (status = 401, description = "UNAUTHORIZED: a missing, unknown, revoked or expired device token", body = ErrorBody),
        (status = 403, description = "PATH_ESCAPE (leads outside the workspace), NOT_REGULAR_FILE or PERMISSION_DENIED", body = ErrorBody),
        (status = 404, description = "SESSION_NOT_FOUND, or FILE_NOT_FOUND", body = ErrorBody),
        (status = 409, description = "NOT_A_DIRECTORY, FILE_EXISTS, DIR_NOT_EMPTY, or HANDS_IDENTITY_MISMATCH", body = ErrorBody),
        (status = 502, description = "HANDS_FAILED: the hands' execd failed", body = ErrorBody),
        (status = 503, description = "HANDS_UNAVAILABLE: the hands cannot start", body = ErrorBody),
    ),
)]
async fn delete(request: FileRequest) -> Result<StatusCode, GatewayError> {
    let FileRequest { session, query, .. } = request;
    let recursive = query.recursive()?;
    let path = query.path()?;
    if path.is_empty() {
        return Err(FilesError::new(
            FilesErrorKind::InvalidPath,
            "the workspace root cannot be deleted",
        )
        .into());
    }
    let (client, _hold) = hands_for_change(&session).await?;
    client
        .delete_file(&path, recursive)
        .await
        .map_err(execd_error)?;
    session.hands.snapshot_soon();
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalized_beneath_the_root() {
        for (raw, want) in [
            ("", ""),
            (".", ""),
            ("/", ""),
            ("/src/main.rs", "src/main.rs"),
            ("src//./main.rs", "src/main.rs"),
            ("a/../b", "b"),
            ("a/b/..", "a"),
        ] {
            assert_eq!(workspace_path(raw).expect(raw), want, "{raw}");
        }
        for raw in ["..", "../etc/passwd", "a/../../b", "/.."] {
            let refused = workspace_path(raw).expect_err(raw);
            assert_eq!(refused.kind, FilesErrorKind::Escape, "{raw}");
        }
        for raw in ["a\0b", &"x".repeat(MAX_PATH_BYTES + 1)] {
            let refused = workspace_path(raw).expect_err("refused");
            assert_eq!(refused.kind, FilesErrorKind::InvalidPath);
        }
    }

    #[test]
    fn query_values_are_percent_decoded_and_must_be_utf8() {
        let query = FileQuery::parse(Some("path=%2e%2e%2Fx&depth=2")).expect("parsed");
        assert_eq!(query.path.as_deref(), Some("../x"));
        assert_eq!(
            query.path().expect_err("escape").kind,
            FilesErrorKind::Escape
        );
        assert_eq!(query.depth().expect("depth"), 2);
        let spaced = FileQuery::parse(Some("path=my+notes%20v2.txt")).expect("parsed");
        assert_eq!(spaced.path().expect("path"), "my notes v2.txt");
        let invalid = FileQuery::parse(Some("path=%ff")).expect_err("not UTF-8");
        assert_eq!(invalid.kind, FilesErrorKind::InvalidPath);
        for depth in ["0", "6", "x", "-1"] {
            let query = FileQuery::parse(Some(&format!("depth={depth}"))).expect("parsed");
            assert_eq!(
                query.depth().expect_err(depth).kind,
                FilesErrorKind::InvalidQuery
            );
        }
        let query = FileQuery::parse(Some("recursive=maybe")).expect("parsed");
        assert_eq!(
            query.recursive().expect_err("maybe").kind,
            FilesErrorKind::InvalidQuery
        );
    }

    #[test]
    fn attachment_names_are_quoted_safely_and_exactly() {
        let value = attachment("dir/résumé \"final\".txt");
        assert_eq!(
            value.to_str().expect("ascii header"),
            "attachment; filename=\"r_sum_ _final_.txt\"; \
             filename*=UTF-8''r%C3%A9sum%C3%A9%20%22final%22.txt"
        );
    }

    fn entry(path: &str, kind: EntryKind, size: u64, target: Option<&str>) -> ArchivedEntry {
        ArchivedEntry {
            path: path.to_owned(),
            kind,
            size,
            mode: 0o644,
            mtime: 1_700_000_000,
            link_target: target.map(str::to_owned),
        }
    }

    fn listing() -> Listing {
        let entries = [
            entry("src", EntryKind::Dir, 0, None),
            entry("src/main.rs", EntryKind::File, 13, None),
            entry("src/deep", EntryKind::Dir, 0, None),
            entry("src/deep/x.txt", EntryKind::File, 2, None),
            entry("code", EntryKind::Symlink, 0, Some("src")),
            entry("etc", EntryKind::Symlink, 0, Some("/etc")),
            entry("up", EntryKind::Symlink, 0, Some("../outside")),
            entry("loop", EntryKind::Symlink, 0, Some("loop")),
            entry("same.rs", EntryKind::HardLink, 0, Some("src/main.rs")),
            entry("abs", EntryKind::Symlink, 0, Some("/workspace/src/main.rs")),
            entry("abs-dir", EntryKind::Symlink, 0, Some("/workspace/src")),
            entry("abs-up", EntryKind::Symlink, 0, Some("/workspace/../etc")),
            entry(
                "abs-climb",
                EntryKind::Symlink,
                0,
                Some("/workspace/src/../.."),
            ),
        ];
        Listing {
            entries: entries.into_iter().map(|e| (e.path.clone(), e)).collect(),
            root: Some("/workspace".into()),
            origin: Origin::Snapshot(SnapshotStore::new(std::path::Path::new("/nowhere"), None)),
        }
    }

    #[test]
    fn a_snapshot_is_walked_like_the_live_workspace() {
        let listing = listing();
        for (path, archived) in [
            ("code/main.rs", "src/main.rs"),
            ("abs", "src/main.rs"),
            ("abs-dir/deep/x.txt", "src/deep/x.txt"),
        ] {
            assert_eq!(listing.resolve(path).expect(path), archived, "{path}");
        }
        let unknown_root = Listing {
            root: None,
            entries: listing.entries.clone(),
            origin: Origin::Snapshot(SnapshotStore::new(std::path::Path::new("/nowhere"), None)),
        };
        assert_eq!(
            unknown_root.resolve("abs").expect_err("no root").kind,
            FilesErrorKind::Escape
        );
        for (path, kind) in [
            ("etc/passwd", FilesErrorKind::Escape),
            ("abs-up", FilesErrorKind::Escape),
            ("abs-climb", FilesErrorKind::Escape),
            ("up", FilesErrorKind::Escape),
            ("missing", FilesErrorKind::NotFound),
            ("src/main.rs/x", FilesErrorKind::NotADirectory),
            ("loop", FilesErrorKind::InvalidPath),
        ] {
            assert_eq!(listing.resolve(path).expect_err(path).kind, kind, "{path}");
        }
        assert_eq!(listing.file_size("same.rs").expect("hard link"), 13);
        assert_eq!(
            listing.file_size("src").expect_err("dir").kind,
            FilesErrorKind::NotRegular
        );
        let top = listing.list("", 1).expect("root");
        let paths: Vec<&str> = top.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "abs",
                "abs-climb",
                "abs-dir",
                "abs-up",
                "code",
                "etc",
                "loop",
                "same.rs",
                "src",
                "up"
            ]
        );
        let deep = listing.list("code", 2).expect("through the link");
        let paths: Vec<&str> = deep.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["code/deep", "code/deep/x.txt", "code/main.rs"]);
        assert_eq!(
            listing.list("src/main.rs", 1).expect_err("a file").kind,
            FilesErrorKind::NotADirectory
        );
    }
}
