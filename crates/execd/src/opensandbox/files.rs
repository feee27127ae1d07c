//! The files API (`/files/*`, `/directories*`), confined to `--root`.
//!
//! Every path is expanded (`~`, `$VAR`), must lie under the root, and is then resolved by
//! [`super::resolve`] from an open handle of the root, one entry at a time with `O_NOFOLLOW`
//! and `openat2(RESOLVE_BENEATH)`: a `..`, relative link or absolute link target that leads out
//! of the root is refused, an absolute link to a place inside the root is followed (with the
//! default root `/`, every absolute link), and a file swapped for a symlink between two checks
//! cannot escape. Contents are only read or written through a handle whose type was checked
//! first, so FIFOs and devices are never read or written. Refusals are 403 `PATH_ESCAPE` /
//! `NOT_REGULAR_FILE`; a symlink loop is a 500 `RUNTIME_ERROR` that says so.
//!
//! All filesystem work runs on the blocking pool. Uploads are streamed into a temporary file next
//! to the destination, fsynced and renamed into place (a file part sent before its metadata is
//! first staged in an unnamed temporary file). `/files/replace` rewrites the file a
//! symlink points to, leaving the link in place; an upload replaces the link itself.
//!
//! Search and listing walk below the directory named without following symlinks, skip any
//! entry that cannot be read instead of failing, and stop at fixed limits (entries returned,
//! entries read, depth); what was skipped or cut is said in response headers, since
//! OpenSandbox's answer is a bare array. A path the client got wrong is a [`PathError`] with a
//! code of its own, never a 500.

use std::collections::HashMap;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::Multipart;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use cap_fs_ext::DirExt;
use cap_std::fs::{Dir, File, Metadata, MetadataExt};
use chrono::{DateTime, Utc};
use tokio::io::AsyncWriteExt;
use warren_http::range::{RangeAnswer, parse_range};
use warren_protocol::files::FileKind;
use warren_protocol::opensandbox::{
    FileInfo, FileMetadata, FileType, Permission, RenameItem, ReplaceItem, ReplaceResult,
};

use super::CompatError;
use super::commands::rfc3339;
use crate::fs::confined::{self, Gaps, MoveError, MoveRefusal, Seen, TempFile, enough_when, walk};
use crate::fs::resolve::{self, Entry, Part, Refusal, Root, Want};
use crate::fs::{PathError, checked_path, is_escape, path_error};
/// Header of a search or listing answer that a limit cut short: `true`.
pub const TRUNCATED_HEADER: &str = "warren-truncated";
/// Header of a search or listing answer that left out entries it could not read: how many.
pub const UNREADABLE_HEADER: &str = "warren-unreadable-entries";
/// Largest file `/files/replace` rewrites, and most bytes a line-range download returns.
pub const MAX_TEXT_BYTES: u64 = 64 * 1024 * 1024;
/// Largest `metadata` part of an upload.
const MAX_METADATA_BYTES: usize = 64 * 1024;

/// The confined filesystem: the canonical root every path is resolved beneath.
pub struct Files {
    root: PathBuf,
}

/// A request path as parts below the root.
#[derive(Debug, Clone)]
struct Target {
    /// The path as the client wrote it (after expansion); used in messages and answers.
    shown: String,
    parts: Vec<Part>,
}

impl Target {
    /// The parts of the directory holding the target, `None` for the root itself.
    fn parent_parts(&self) -> Option<&[Part]> {
        self.parts.split_last().map(|(_, parent)| parent)
    }
}

/// Maps an I/O error on `path` to the API's error.
fn fs_error(path: &str, err: io::Error) -> CompatError {
    if is_escape(&err) {
        return CompatError::PathEscape(format!("path {path} leads outside the root"));
    }
    match resolve::refusal(&err) {
        Some(Refusal::NotRegular) => {
            return CompatError::NotRegularFile(format!("{path} is not a regular file"));
        }
        Some(Refusal::Loop) => {
            return CompatError::Runtime(format!(
                "too many levels of symbolic links resolving {path} (more than {} links, or a \
                 loop)",
                resolve::MAX_LINKS_FOLLOWED
            ));
        }
        Some(Refusal::NotDirectory) => {
            return PathError::NotADirectory(format!("{path} is not a directory")).into();
        }
        Some(Refusal::Escape) | None => {}
    }
    if let Some(path_error) = path_error(path, &err) {
        return path_error.into();
    }
    match err.kind() {
        io::ErrorKind::NotFound => CompatError::FileNotFound(format!("file not found: {path}")),
        _ => CompatError::Runtime(format!("error accessing file {path}: {err}")),
    }
}

/// Runs blocking filesystem work on the blocking pool.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, CompatError> + Send + 'static,
) -> Result<T, CompatError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| CompatError::Internal(format!("filesystem task failed: {e}")))?
}

/// User and group names from `/etc/passwd` and `/etc/group`, read once per request.
#[derive(Default)]
struct Names {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl Names {
    fn load() -> Self {
        Self {
            users: read_id_file("/etc/passwd"),
            groups: read_id_file("/etc/group"),
        }
    }

    fn user(&self, uid: u32) -> String {
        self.users
            .get(&uid)
            .cloned()
            .unwrap_or_else(|| uid.to_string())
    }

    fn group(&self, gid: u32) -> String {
        self.groups
            .get(&gid)
            .cloned()
            .unwrap_or_else(|| gid.to_string())
    }
}

/// `name:x:id:...` lines to id → name.
fn read_id_file(path: &str) -> HashMap<u32, String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            let id = fields.nth(1)?.parse().ok()?;
            Some((id, name.to_owned()))
        })
        .collect()
}

/// A user or group given by name (or number) to its id.
fn lookup_id(path: &str, name: &str) -> Option<u32> {
    if let Ok(id) = name.parse() {
        return Some(id);
    }
    read_id_file(path)
        .into_iter()
        .find(|(_, n)| n == name)
        .map(|(id, _)| id)
}

/// `755` (octal digits written in decimal) to `0o755`.
fn octal_mode(mode: u32) -> Result<u32, CompatError> {
    u32::from_str_radix(&mode.to_string(), 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| {
            CompatError::InvalidRequest(format!("mode {mode} is not octal permission bits"))
        })
}

/// `0o755` to `755`.
fn decimal_mode(mode: u32) -> u32 {
    format!("{:o}", mode & 0o777)
        .parse()
        .expect("octal digits are decimal digits")
}

fn system_time(time: io::Result<cap_std::time::SystemTime>) -> Option<DateTime<Utc>> {
    time.ok().map(|t| DateTime::<Utc>::from(t.into_std()))
}

fn file_info(shown: String, meta: &Metadata, names: &Names) -> FileInfo {
    let file_type = match confined::file_kind(meta) {
        FileKind::Symlink => FileType::Symlink,
        FileKind::Dir => FileType::Directory,
        FileKind::File => FileType::File,
        FileKind::Other => FileType::Other,
    };
    let modified = system_time(meta.modified())
        .or_else(|| DateTime::from_timestamp(meta.mtime(), meta.mtime_nsec() as u32))
        .unwrap_or_default();
    // Birth time when the filesystem records it, else the inode change time.
    let created = system_time(meta.created())
        .or_else(|| DateTime::from_timestamp(meta.ctime(), meta.ctime_nsec() as u32))
        .unwrap_or(modified);
    FileInfo {
        path: shown,
        file_type,
        size: meta.len(),
        modified_at: rfc3339(modified),
        created_at: rfc3339(created),
        owner: names.user(meta.uid()),
        group: names.group(meta.gid()),
        mode: decimal_mode(meta.mode()),
    }
}

/// Opens a path (following symlinks) for reading its contents or changing its attributes:
/// only regular files (and directories when `allow_dir`); anything else is refused before it is
/// opened. Also returns where the file really is, for writing it back.
fn open_checked(
    root: &Root,
    target: &Target,
    allow_dir: bool,
) -> Result<(File, Metadata, Entry), CompatError> {
    let want = if allow_dir {
        Want::FileOrDir
    } else {
        Want::File
    };
    let (fd, entry) = root
        .open(&target.parts, want)
        .map_err(|e| fs_error(&target.shown, e))?;
    let file = File::from(fd);
    let meta = file.metadata().map_err(|e| fs_error(&target.shown, e))?;
    Ok((file, meta, entry))
}

/// The entry a path names, without following a final symlink.
fn locate(root: &Root, target: &Target) -> Result<Entry, CompatError> {
    root.locate(&target.parts)
        .map_err(|e| fs_error(&target.shown, e))
}

/// The entry a path names and its metadata (final symlink not followed), or `None` when the
/// path does not exist: deleting something missing is not an error.
fn locate_existing(
    root: &Root,
    target: &Target,
) -> Result<Option<(Entry, cap_std::fs::Metadata)>, CompatError> {
    let entry = match root.locate(&target.parts) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(fs_error(&target.shown, e)),
        Ok(entry) => entry,
    };
    match entry.lstat() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(fs_error(&target.shown, e)),
        Ok(meta) => Ok(Some((entry, meta))),
    }
}

/// A removal that found nothing to remove (someone else got there first) is not an error.
fn ignore_missing(target: &Target, removed: io::Result<()>) -> Result<(), CompatError> {
    match removed {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(fs_error(&target.shown, e)),
        _ => Ok(()),
    }
}

fn apply_permission(root: &Root, target: &Target, perm: &Permission) -> Result<(), CompatError> {
    let mode = perm.mode.filter(|m| *m != 0).map(octal_mode).transpose()?;
    let owner = perm.owner.as_deref().filter(|o| !o.is_empty());
    let group = perm.group.as_deref().filter(|g| !g.is_empty());
    if mode.is_none() && owner.is_none() && group.is_none() {
        return Ok(());
    }
    let (file, _, _) = open_checked(root, target, true)?;
    let file = file.into_std();
    set_owner_and_mode(&file, &target.shown, owner, group, mode)
}

fn set_owner_and_mode(
    file: &std::fs::File,
    shown: &str,
    owner: Option<&str>,
    group: Option<&str>,
    mode: Option<u32>,
) -> Result<(), CompatError> {
    let uid = owner
        .map(|o| {
            lookup_id("/etc/passwd", o)
                .ok_or_else(|| CompatError::InvalidRequest(format!("unknown user {o}")))
        })
        .transpose()?;
    let gid = group
        .map(|g| {
            lookup_id("/etc/group", g)
                .ok_or_else(|| CompatError::InvalidRequest(format!("unknown group {g}")))
        })
        .transpose()?;
    if uid.is_some() || gid.is_some() {
        std::os::unix::fs::fchown(file, uid, gid).map_err(|e| fs_error(shown, e))?;
    }
    if let Some(mode) = mode {
        file.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(|e| fs_error(shown, e))?;
    }
    Ok(())
}

/// `mkdir -p` below the root, following symlinks that stay inside it.
fn create_dirs(root: &Root, parts: &[Part], shown: &str) -> Result<(), CompatError> {
    root.create_dirs(parts).map_err(|err| fs_error(shown, err))
}

impl Files {
    pub fn new(root: &Path) -> Self {
        let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
        Self { root }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn open_root(&self) -> Result<Root, CompatError> {
        Root::new(&self.root).map_err(|e| {
            CompatError::Internal(format!("cannot open root {}: {e}", self.root.display()))
        })
    }

    /// Expands `raw` and makes it parts below the root; lexically outside → `PATH_ESCAPE`.
    fn target(&self, raw: &str) -> Result<Target, CompatError> {
        if raw.is_empty() {
            return Err(PathError::InvalidPath("path must not be empty".to_owned()).into());
        }
        let shown = checked_path(raw)?;
        let path = Path::new(&shown);
        let absolute = if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.root.join(path)
        };
        let parts = resolve::parts_beneath(&self.root, &absolute)
            .ok_or_else(|| CompatError::PathEscape(format!("path {shown} is outside the root")))?;
        Ok(Target { shown, parts })
    }

    pub async fn info(
        self: &Arc<Self>,
        paths: Vec<String>,
    ) -> Result<HashMap<String, FileInfo>, CompatError> {
        let files = Arc::clone(self);
        blocking(move || {
            let root = files.open_root()?;
            let names = Names::load();
            let mut answer = HashMap::new();
            for raw in paths {
                let target = files.target(&raw)?;
                let meta = locate(&root, &target)?
                    .lstat()
                    .map_err(|e| fs_error(&target.shown, e))?;
                answer.insert(raw, file_info(target.shown, &meta, &names));
            }
            Ok(answer)
        })
        .await
    }

    /// Runs `each` on the blocking pool for every `(path, item)` in order, stopping at the
    /// first error: the shared loop of the routes that act on a list of paths.
    async fn for_each_path<T: Send + 'static>(
        self: &Arc<Self>,
        items: impl IntoIterator<Item = (String, T)> + Send + 'static,
        each: impl Fn(&Root, &Target, T) -> Result<(), CompatError> + Send + 'static,
    ) -> Result<(), CompatError> {
        let files = Arc::clone(self);
        blocking(move || {
            let root = files.open_root()?;
            for (raw, item) in items {
                each(&root, &files.target(&raw)?, item)?;
            }
            Ok(())
        })
        .await
    }

    /// [`Files::for_each_path`] over `paths` without following the last link, skipping those
    /// that do not exist: `each` gets the entry and its metadata.
    async fn for_each_existing(
        self: &Arc<Self>,
        paths: Vec<String>,
        each: impl Fn(&Target, Entry, Metadata) -> Result<(), CompatError> + Send + 'static,
    ) -> Result<(), CompatError> {
        let items = paths.into_iter().map(|path| (path, ()));
        self.for_each_path(items, move |root, target, ()| {
            match locate_existing(root, target)? {
                Some((entry, meta)) => each(target, entry, meta),
                None => Ok(()),
            }
        })
        .await
    }

    pub async fn delete_files(self: &Arc<Self>, paths: Vec<String>) -> Result<(), CompatError> {
        self.for_each_existing(paths, |target, entry, meta| {
            if meta.is_dir() {
                return Err(CompatError::Runtime(format!(
                    "error removing file {}: is a directory",
                    target.shown
                )));
            }
            ignore_missing(target, entry.dir.remove_file_or_symlink(&entry.name))
        })
        .await
    }

    pub async fn rename(self: &Arc<Self>, items: Vec<RenameItem>) -> Result<(), CompatError> {
        let files = Arc::clone(self);
        blocking(move || {
            let root = files.open_root()?;
            for item in items {
                let src = files.target(&item.src)?;
                let dest = files.target(&item.dest)?;
                confined::move_entry(&root, &src.parts, &dest.parts, false).map_err(|error| {
                    match error {
                        MoveError::Refused(MoveRefusal::Exists) => CompatError::Runtime(
                            MoveRefusal::Exists.message(&src.shown, &dest.shown),
                        ),
                        MoveError::Refused(refusal) => {
                            PathError::InvalidMove(refusal.message(&src.shown, &dest.shown)).into()
                        }
                        MoveError::From(e) => fs_error(&src.shown, e),
                        MoveError::To(e) => fs_error(&dest.shown, e),
                    }
                })?;
            }
            Ok(())
        })
        .await
    }

    /// Applies each path's permission of `request`, after making the directory when `make`.
    async fn permit_each(
        self: &Arc<Self>,
        request: HashMap<String, Permission>,
        make: bool,
    ) -> Result<(), CompatError> {
        self.for_each_path(request, move |root, target, perm| {
            if make {
                create_dirs(root, &target.parts, &target.shown)?;
            }
            apply_permission(root, target, &perm)
        })
        .await
    }

    pub async fn set_permissions(
        self: &Arc<Self>,
        request: HashMap<String, Permission>,
    ) -> Result<(), CompatError> {
        self.permit_each(request, false).await
    }

    pub async fn make_dirs(
        self: &Arc<Self>,
        request: HashMap<String, Permission>,
    ) -> Result<(), CompatError> {
        self.permit_each(request, true).await
    }

    pub async fn remove_dirs(self: &Arc<Self>, paths: Vec<String>) -> Result<(), CompatError> {
        self.for_each_existing(paths, |target, entry, meta| {
            if entry.is_root() {
                return Err(CompatError::Runtime(
                    "refusing to remove the root".to_owned(),
                ));
            }
            let removed = if meta.is_dir() {
                entry.dir.remove_dir_all(&entry.name)
            } else {
                entry.dir.remove_file_or_symlink(&entry.name)
            };
            ignore_missing(target, removed)
        })
        .await
    }

    /// `GET /files/search`: files (not directories) under `raw` whose base name matches the
    /// glob, sorted by path.
    pub async fn search(
        self: &Arc<Self>,
        raw: String,
        pattern: Option<String>,
    ) -> Result<Listing, CompatError> {
        let pattern = pattern
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "**".to_owned());
        let matcher = globset::Glob::new(&pattern)
            .map_err(|e| CompatError::InvalidRequest(format!("invalid pattern {pattern}: {e}")))?
            .compile_matcher();
        let is_match = move |seen: &Seen<'_>| {
            !seen.meta.is_dir() && matcher.is_match(&*seen.name.to_string_lossy())
        };
        let mut found = self.walk_below(raw, usize::MAX, is_match).await?;
        found.entries.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(found)
    }

    /// `GET /directories/list`: every entry under `raw` down to `depth` levels, in pre-order.
    pub async fn list(self: &Arc<Self>, raw: String, depth: usize) -> Result<Listing, CompatError> {
        if depth == 0 {
            return Ok(Listing::default());
        }
        self.walk_below(raw, depth, |_| true).await
    }

    /// The entries under the directory `raw` down to `depth` levels that `keep` takes, in
    /// pre-order: the walk search and list share.
    async fn walk_below(
        self: &Arc<Self>,
        raw: String,
        depth: usize,
        keep: impl Fn(&Seen<'_>) -> bool + Send + 'static,
    ) -> Result<Listing, CompatError> {
        let files = Arc::clone(self);
        blocking(move || {
            let root = files.open_root()?;
            let target = files.target(&raw)?;
            let dir = open_dir(&root, &target)?;
            let names = Names::load();
            let mut entries = Vec::new();
            let gaps = walk(&dir, &target.shown, depth, &mut |seen| {
                if keep(&seen) {
                    entries.push(file_info(seen.path, seen.meta, &names));
                }
                enough_when(entries.len())
            })
            .map_err(|e| fs_error(&target.shown, e))?;
            Ok(Listing { entries, gaps })
        })
        .await
    }

    pub async fn replace(
        self: &Arc<Self>,
        request: HashMap<String, ReplaceItem>,
    ) -> Result<HashMap<String, ReplaceResult>, CompatError> {
        if request.values().any(|item| item.old.is_empty()) {
            return Err(CompatError::InvalidRequest(
                "old content must not be empty".to_owned(),
            ));
        }
        let files = Arc::clone(self);
        blocking(move || {
            let root = files.open_root()?;
            let mut results = HashMap::new();
            for (raw, item) in request {
                let target = files.target(&raw)?;
                let (file, meta, entry) = open_checked(&root, &target, false)?;
                if meta.len() > MAX_TEXT_BYTES {
                    return Err(CompatError::Runtime(format!(
                        "{} is larger than {MAX_TEXT_BYTES} bytes",
                        target.shown
                    )));
                }
                let mut content = Vec::with_capacity(meta.len() as usize);
                file.into_std()
                    .read_to_end(&mut content)
                    .map_err(|e| fs_error(&target.shown, e))?;
                let (replaced, n_replaced) =
                    replace_all(&content, item.old.as_bytes(), item.new.as_bytes());
                if n_replaced > 0 {
                    write_atomically(&entry, &target.shown, &replaced, &meta)?;
                }
                results.insert(
                    raw,
                    ReplaceResult {
                        replaced_count: n_replaced,
                    },
                );
            }
            Ok(results)
        })
        .await
    }

    /// `POST /files/upload`: pairs `metadata` and `file` parts by index, in either order, and
    /// streams each file to disk. A file part that comes before its metadata is staged in an
    /// unnamed temporary file until the metadata arrives.
    pub async fn upload(self: &Arc<Self>, mut multipart: Multipart) -> Result<(), CompatError> {
        let mut pending: std::collections::VecDeque<FileMetadata> = Default::default();
        let mut staged: std::collections::VecDeque<std::fs::File> = Default::default();
        let mut n_files = 0usize;
        loop {
            let field = multipart
                .next_field()
                .await
                .map_err(|e| CompatError::InvalidFileContent(format!("bad multipart body: {e}")))?;
            let Some(mut field) = field else { break };
            match field.name() {
                Some("metadata") => {
                    let mut bytes = Vec::new();
                    while let Some(chunk) = field.chunk().await.map_err(|e| {
                        CompatError::InvalidFileMetadata(format!("reading metadata: {e}"))
                    })? {
                        bytes.extend_from_slice(&chunk);
                        if bytes.len() > MAX_METADATA_BYTES {
                            return Err(CompatError::InvalidFileMetadata(
                                "metadata part is too large".to_owned(),
                            ));
                        }
                    }
                    let metadata: FileMetadata = serde_json::from_slice(&bytes).map_err(|e| {
                        CompatError::InvalidFileMetadata(format!("invalid metadata JSON: {e}"))
                    })?;
                    if metadata.path.is_empty() {
                        return Err(CompatError::InvalidFileMetadata(
                            "metadata path is empty".to_owned(),
                        ));
                    }
                    match staged.pop_front() {
                        Some(content) => {
                            self.upload_one(metadata, Content::Staged(content)).await?;
                            n_files += 1;
                        }
                        None => pending.push_back(metadata),
                    }
                }
                Some("file") => match pending.pop_front() {
                    Some(metadata) => {
                        self.upload_one(metadata, Content::Part(&mut field)).await?;
                        n_files += 1;
                    }
                    None => staged.push_back(stage(&mut field).await?),
                },
                _ => {
                    // Unknown parts are skipped (their bytes are drained by the next call).
                }
            }
        }
        if !pending.is_empty() {
            return Err(CompatError::InvalidFile(
                "metadata part without a file part".to_owned(),
            ));
        }
        if !staged.is_empty() {
            return Err(CompatError::InvalidFileMetadata(
                "file part without a metadata part".to_owned(),
            ));
        }
        if n_files == 0 {
            return Err(CompatError::InvalidFile(
                "no file part in the upload".to_owned(),
            ));
        }
        Ok(())
    }

    async fn upload_one(
        self: &Arc<Self>,
        metadata: FileMetadata,
        content: Content<'_, '_>,
    ) -> Result<(), CompatError> {
        let target = self.target(&metadata.path)?;
        let mode = metadata
            .mode
            .filter(|m| *m != 0)
            .map(octal_mode)
            .transpose()?;
        let files = Arc::clone(self);
        let prepared = target.clone();
        let (entry, temp, file) = blocking(move || {
            let root = files.open_root()?;
            if let Some(parent) = prepared.parent_parts() {
                create_dirs(&root, parent, &prepared.shown)?;
            }
            let entry = locate(&root, &prepared)?;
            match entry.lstat() {
                Ok(meta) if !meta.is_file() && !meta.is_symlink() => {
                    return Err(CompatError::NotRegularFile(format!(
                        "{} exists and is not a regular file",
                        prepared.shown
                    )));
                }
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(fs_error(&prepared.shown, e));
                }
                _ => {}
            }
            let (temp, file) = create_temp_beside(&entry, &prepared.shown)?;
            Ok((entry, temp, file))
        })
        .await?;
        let (file, streamed) = match content {
            Content::Part(field) => {
                let mut writer = tokio::fs::File::from_std(file.into_std());
                let streamed = copy_part(field, &mut writer)
                    .await
                    .map_err(|e| e.into_compat(&target.shown));
                (writer.into_std().await, streamed)
            }
            Content::Staged(mut staged) => {
                let mut out = file.into_std();
                let shown = target.shown.clone();
                blocking(move || {
                    let copied = staged
                        .seek(SeekFrom::Start(0))
                        .and_then(|_| io::copy(&mut staged, &mut out))
                        .map(drop)
                        .map_err(|e| fs_error(&shown, e));
                    Ok((out, copied))
                })
                .await?
            }
        };
        blocking(move || {
            let finish = || -> Result<(), CompatError> {
                streamed?;
                set_owner_and_mode(
                    &file,
                    &target.shown,
                    metadata.owner.as_deref().filter(|o| !o.is_empty()),
                    metadata.group.as_deref().filter(|g| !g.is_empty()),
                    mode,
                )?;
                file.sync_all().map_err(|e| fs_error(&target.shown, e))?;
                temp.persist(&entry).map_err(|e| fs_error(&target.shown, e))
            };
            // A failure drops `temp`, which removes the temporary file.
            finish()
        })
        .await
    }

    /// `GET /files/download`. `range` is the `Range` header's value
    /// ([`warren_http::range::range_header`]); a Range that [`parse_range`] says to ignore is
    /// ignored, also next to `offset`/`limit`.
    pub async fn download(
        self: &Arc<Self>,
        raw: String,
        range: Option<Vec<u8>>,
        lines: Option<(u64, Option<u64>)>,
    ) -> Result<Response, CompatError> {
        let files = Arc::clone(self);
        let (file, meta, shown) = blocking(move || {
            let root = files.open_root()?;
            let target = files.target(&raw)?;
            let (file, meta, _) = open_checked(&root, &target, false)?;
            Ok((file.into_std(), meta, target.shown))
        })
        .await?;
        let size = meta.len();
        let range = range.map_or(RangeAnswer::Whole, |header| parse_range(&header, size));
        if range != RangeAnswer::Whole && lines.is_some() {
            return Err(CompatError::InvalidRequest(
                "Range and offset/limit are mutually exclusive".to_owned(),
            ));
        }
        let name = Path::new(&shown)
            .file_name()
            .map(|n| n.to_string_lossy().replace(['"', '\\', '\r', '\n'], "_"))
            .unwrap_or_else(|| "file".to_owned());
        let disposition = HeaderValue::from_str(&format!("attachment; filename=\"{name}\""))
            .unwrap_or_else(|_| HeaderValue::from_static("attachment"));

        if let Some((offset, limit)) = lines {
            let text =
                blocking(move || read_lines(file, offset, limit).map_err(|e| fs_error(&shown, e)))
                    .await?;
            let mut response = text.into_response();
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            return Ok(response);
        }

        let part = match range {
            RangeAnswer::Whole => None,
            RangeAnswer::Part { start, end } => Some((start, end)),
            RangeAnswer::Unsatisfiable => return Err(CompatError::RangeNotSatisfiable(size)),
        };
        let (status, mut headers, body) = confined::file_download(file, size, part)
            .await
            .map_err(|e| fs_error(&shown, e))?;
        headers.insert(header::CONTENT_DISPOSITION, disposition);
        Ok((status, headers, body).into_response())
    }
}

/// Opens the directory a path names (following symlinks) for listing.
fn open_dir(root: &Root, target: &Target) -> Result<Dir, CompatError> {
    let (fd, _) = root
        .open(&target.parts, Want::Dir)
        .map_err(|e| fs_error(&target.shown, e))?;
    Ok(Dir::from(fd))
}

/// Creates a temporary file beside `entry` for writing (see [`TempFile`]).
fn create_temp_beside(entry: &Entry, shown: &str) -> Result<(TempFile, File), CompatError> {
    if entry.is_root() {
        return Err(CompatError::InvalidRequest(format!(
            "{shown} names no file"
        )));
    }
    TempFile::create_beside(entry).map_err(|e| fs_error(shown, e))
}

/// Where an uploaded file's bytes come from.
enum Content<'a, 'b> {
    /// The multipart part being read (its metadata came first).
    Part(&'a mut axum::extract::multipart::Field<'b>),
    /// A part read earlier into an unnamed temporary file (it came before its metadata).
    Staged(std::fs::File),
}

/// A failure while copying a multipart part: reading the request or writing the file.
enum PartError {
    Read(String),
    Write(io::Error),
}

impl PartError {
    fn into_compat(self, shown: &str) -> CompatError {
        match self {
            PartError::Read(e) => {
                CompatError::InvalidFileContent(format!("reading file part: {e}"))
            }
            PartError::Write(e) => fs_error(shown, e),
        }
    }
}

/// Streams a multipart part's bytes into `writer` and flushes it.
async fn copy_part(
    field: &mut axum::extract::multipart::Field<'_>,
    writer: &mut tokio::fs::File,
) -> Result<(), PartError> {
    while let Some(chunk) = field
        .chunk()
        .await
        .map_err(|e| PartError::Read(e.to_string()))?
    {
        writer.write_all(&chunk).await.map_err(PartError::Write)?;
    }
    writer.flush().await.map_err(PartError::Write)
}

/// Reads a file part that arrived before its metadata into an unnamed temporary file (gone
/// with its handle, so an abandoned upload leaves nothing behind).
async fn stage(
    field: &mut axum::extract::multipart::Field<'_>,
) -> Result<std::fs::File, CompatError> {
    let file = blocking(|| {
        tempfile::tempfile()
            .map_err(|e| CompatError::Internal(format!("creating an upload staging file: {e}")))
    })
    .await?;
    let mut writer = tokio::fs::File::from_std(file);
    copy_part(field, &mut writer)
        .await
        .map_err(|e| e.into_compat("the upload staging file"))?;
    Ok(writer.into_std().await)
}

/// Writes `content` to a temporary file next to `entry`, gives it the old file's mode and
/// owner, fsyncs it and renames it over `entry`.
fn write_atomically(
    entry: &Entry,
    shown: &str,
    content: &[u8],
    old: &Metadata,
) -> Result<(), CompatError> {
    let (temp, file) = create_temp_beside(entry, shown)?;
    let mut file = file.into_std();
    // A failure drops `temp`, which removes the temporary file.
    (|| {
        file.write_all(content)?;
        let _ = std::os::unix::fs::fchown(&file, Some(old.uid()), Some(old.gid()));
        file.set_permissions(std::fs::Permissions::from_mode(old.mode() & 0o7777))?;
        file.sync_all()?;
        temp.persist(entry)
    })()
    .map_err(|err| fs_error(shown, err))
}

/// The answer of a search or listing: the entries found, and what kept it from being
/// complete. OpenSandbox's answer is a bare JSON array, so the gaps travel in headers
/// ([`TRUNCATED_HEADER`], [`UNREADABLE_HEADER`]), sent only when there are any.
#[derive(Debug, Default)]
pub struct Listing {
    pub entries: Vec<FileInfo>,
    pub gaps: Gaps,
}

impl IntoResponse for Listing {
    fn into_response(self) -> Response {
        let mut response = axum::Json(self.entries).into_response();
        let headers = response.headers_mut();
        if self.gaps.truncated {
            headers.insert(TRUNCATED_HEADER, HeaderValue::from_static("true"));
        }
        if self.gaps.n_unreadable > 0 {
            headers.insert(UNREADABLE_HEADER, HeaderValue::from(self.gaps.n_unreadable));
        }
        response
    }
}

/// Replaces every non-overlapping `old` with `new`; returns the result and the count.
fn replace_all(content: &[u8], old: &[u8], new: &[u8]) -> (Vec<u8>, u64) {
    let mut out = Vec::with_capacity(content.len());
    let mut n = 0u64;
    let mut i = 0;
    while i < content.len() {
        if content[i..].starts_with(old) {
            out.extend_from_slice(new);
            i += old.len();
            n += 1;
        } else {
            out.push(content[i]);
            i += 1;
        }
    }
    (out, n)
}

/// Lines `offset..offset+limit` (1-based), with their terminators, at most [`MAX_TEXT_BYTES`].
fn read_lines(file: std::fs::File, offset: u64, limit: Option<u64>) -> io::Result<Vec<u8>> {
    use std::io::BufRead;
    let mut reader = io::BufReader::new(file);
    let mut out = Vec::new();
    let mut line = Vec::new();
    let mut number = 0u64;
    let mut n_taken = 0u64;
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        number += 1;
        if number < offset {
            continue;
        }
        if limit.is_some_and(|limit| n_taken >= limit) {
            break;
        }
        if out.len() as u64 + line.len() as u64 > MAX_TEXT_BYTES {
            break;
        }
        out.extend_from_slice(&line);
        n_taken += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_octal_digits_in_decimal() {
        assert_eq!(octal_mode(755).ok(), Some(0o755));
        assert_eq!(octal_mode(4755).ok(), Some(0o4755));
        assert!(octal_mode(758).is_err());
        assert_eq!(decimal_mode(0o100644), 644);
    }

    #[test]
    fn replace_counts_non_overlapping_matches() {
        assert_eq!(replace_all(b"aaaa", b"aa", b"b"), (b"bb".to_vec(), 2));
        assert_eq!(replace_all(b"abc", b"x", b"y"), (b"abc".to_vec(), 0));
    }
}
