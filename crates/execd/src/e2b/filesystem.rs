//! envd's `filesystem.Filesystem` service and the `/files` upload and download, confined
//! beneath `--root` by the same walk as execd's other file routes (`opensandbox::resolve`: no
//! `..`, symlink or swap leads out; listings never follow a link).
//!
//! Paths are absolute (and must lie under the root) or relative to the root; entries report
//! absolute paths. `WatchDir` and the watcher RPCs watch the directory through the descriptor
//! the confined walk opened (`/proc/self/fd/N`), so what is watched is what was checked even if
//! a name on the way is swapped for a link afterwards; `notify` recurses without following
//! links. Events are reported relative to the watched directory, as envd does.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use cap_std::fs::Dir;
use notify::event::{ModifyKind, RenameMode};
use notify::{EventKind, Watcher as _};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::connect::{Code, ConnectError, StreamSender};
use super::proto::filesystem::{
    EntryInfo, EventType, FileType, FilesystemEvent, WatchDirResponse, watch_dir_response,
};
use crate::opensandbox::confined;
use crate::opensandbox::resolve::{self, Part, Refusal, Root, Want};
use crate::opensandbox::{is_escape, path_error};

/// Longest path a request may name, in bytes (Linux's `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;
/// Most events a watcher holds between two `GetWatcherEvents`, or a stream has pending; more
/// are dropped (and logged).
pub const MAX_PENDING_EVENTS: usize = 10_000;
/// Most watchers made with `CreateWatcher` that may exist at once.
pub const MAX_WATCHERS: usize = 256;

/// A path from a request: as the client wrote it, and its parts below the root.
pub struct Target {
    pub shown: String,
    pub parts: Vec<Part>,
}

/// The files root and the watchers made with `CreateWatcher`.
pub struct Filesystem {
    root: PathBuf,
    watchers: Mutex<HashMap<String, Arc<PolledWatch>>>,
}

impl Filesystem {
    pub fn new(root: &Path) -> Self {
        let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
        Self {
            root,
            watchers: Mutex::new(HashMap::new()),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `raw` below the root: absolute paths must lie under it, relative ones are taken from it.
    pub fn target(&self, raw: &str) -> Result<Target, ConnectError> {
        if raw.is_empty() {
            return Err(ConnectError::invalid_argument("path must not be empty"));
        }
        if raw.contains('\0') {
            return Err(ConnectError::invalid_argument(
                "path must be free of NUL bytes",
            ));
        }
        if raw.len() > MAX_PATH_BYTES {
            return Err(ConnectError::invalid_argument(format!(
                "path is {} bytes long, more than the {MAX_PATH_BYTES} allowed",
                raw.len()
            )));
        }
        let path = Path::new(raw);
        let absolute = if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.root.join(path)
        };
        let parts = resolve::parts_beneath(&self.root, &absolute).ok_or_else(|| escape(raw))?;
        Ok(Target {
            shown: raw.to_owned(),
            parts,
        })
    }

    /// The absolute path of `parts` as the client sees it (`.`/`..` applied lexically).
    fn shown_path(&self, parts: &[Part]) -> String {
        let mut path = self.root.clone();
        for part in parts {
            match part {
                Part::Name(name) => path.push(name),
                Part::Parent => {
                    if path != self.root {
                        path.pop();
                    }
                }
            }
        }
        path.to_string_lossy().into_owned()
    }

    /// Runs `work` with an open root on the blocking pool.
    pub async fn with_root<T: Send + 'static>(
        self: &Arc<Self>,
        work: impl FnOnce(&Filesystem, &Root) -> Result<T, ConnectError> + Send + 'static,
    ) -> Result<T, ConnectError> {
        let this = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let root = Root::new(&this.root).map_err(|error| {
                tracing::error!(root = %this.root.display(), %error, "cannot open the files root");
                ConnectError::internal("cannot open the files root")
            })?;
            work(&this, &root)
        })
        .await
        .map_err(|error| ConnectError::internal(format!("file task failed: {error}")))?
    }

    pub fn stat(&self, root: &Root, target: &Target) -> Result<EntryInfo, ConnectError> {
        let entry = root
            .locate(&target.parts)
            .map_err(|e| fs_error(&target.shown, e))?;
        let meta = entry.lstat().map_err(|e| fs_error(&target.shown, e))?;
        let link = meta
            .is_symlink()
            .then(|| confined::link_target(&entry.dir, &entry.name).ok())
            .flatten();
        Ok(entry_info(
            &entry.name,
            self.shown_path(&target.parts),
            &Stats::from_cap(&meta),
            link.as_deref(),
        ))
    }

    /// `mkdir -p`; `already_exists` when the directory (or anything) is there.
    pub fn make_dir(&self, root: &Root, target: &Target) -> Result<EntryInfo, ConnectError> {
        if let Ok(entry) = root.locate(&target.parts)
            && entry.lstat().is_ok()
        {
            return Err(ConnectError::new(
                Code::AlreadyExists,
                format!("{} already exists", target.shown),
            ));
        }
        root.create_dirs(&target.parts)
            .map_err(|e| fs_error(&target.shown, e))?;
        self.stat(root, target)
    }

    /// Renames (replacing what is at the destination, as envd's `os.Rename` does).
    pub fn rename(
        &self,
        root: &Root,
        from: &Target,
        to: &Target,
    ) -> Result<EntryInfo, ConnectError> {
        confined::move_entry(root, &from.parts, &to.parts, true).map_err(|error| match error {
            confined::MoveError::Refused(refusal) => {
                ConnectError::invalid_argument(refusal.message(&from.shown, &to.shown))
            }
            confined::MoveError::From(e) => fs_error(&from.shown, e),
            confined::MoveError::To(e) => fs_error(&to.shown, e),
        })?;
        self.stat(root, to)
    }

    /// Removes a file, a link or a directory with everything below it (links not followed).
    /// A missing path is no error, as with envd's `os.RemoveAll`.
    pub fn remove(&self, root: &Root, target: &Target) -> Result<(), ConnectError> {
        let entry = match root.locate(&target.parts) {
            Ok(entry) => entry,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(fs_error(&target.shown, e)),
        };
        if entry.is_root() {
            return Err(ConnectError::invalid_argument(format!(
                "{} is the root, which cannot be removed",
                target.shown
            )));
        }
        let meta = match entry.lstat() {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(fs_error(&target.shown, e)),
        };
        let removed = if meta.is_dir() {
            entry.dir.remove_dir_all(&entry.name)
        } else {
            cap_fs_ext::DirExt::remove_file_or_symlink(&entry.dir, &entry.name)
        };
        removed.map_err(|e| fs_error(&target.shown, e))
    }

    /// The entries below a directory, `depth` levels (0 means 1), symlinks described.
    pub fn list(
        &self,
        root: &Root,
        target: &Target,
        depth: u32,
    ) -> Result<Vec<EntryInfo>, ConnectError> {
        let (fd, _) = root
            .open(&target.parts, Want::Dir)
            .map_err(|e| fs_error(&target.shown, e))?;
        let base = self.shown_path(&target.parts);
        let mut entries = Vec::new();
        confined::walk(&Dir::from(fd), &base, depth.max(1) as usize, &mut |seen| {
            let link = seen
                .meta
                .is_symlink()
                .then(|| confined::link_target(seen.dir, seen.name).ok())
                .flatten();
            entries.push(entry_info(
                seen.name,
                seen.path,
                &Stats::from_cap(seen.meta),
                link.as_deref(),
            ));
            confined::enough_when(entries.len())
        })
        .map_err(|e| fs_error(&target.shown, e))?;
        Ok(entries)
    }

    /// Opens the directory to watch through the confined walk: `not_found` when it is missing.
    fn open_watch_dir(&self, root: &Root, target: &Target) -> Result<OwnedFd, ConnectError> {
        let (fd, _) = root.open(&target.parts, Want::Dir).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                ConnectError::not_found(format!("directory {} does not exist", target.shown))
            } else {
                fs_error(&target.shown, e)
            }
        })?;
        Ok(fd)
    }

    /// Starts watching a directory; events go to `sink`.
    pub async fn watch(
        self: &Arc<Self>,
        target: Target,
        recursive: bool,
        include_entry: bool,
        sink: EventSink,
    ) -> Result<DirWatch, ConnectError> {
        self.with_root(move |fs, root| {
            let fd = fs.open_watch_dir(root, &target)?;
            DirWatch::start(fd, recursive, include_entry, sink).map_err(|error| {
                ConnectError::internal(format!("cannot watch {}: {error}", target.shown))
            })
        })
        .await
    }

    /// `CreateWatcher`: a watch whose events are collected until fetched.
    pub async fn create_watcher(
        self: &Arc<Self>,
        target: Target,
        recursive: bool,
        include_entry: bool,
    ) -> Result<String, ConnectError> {
        if self.polled().len() >= MAX_WATCHERS {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!("at most {MAX_WATCHERS} watchers may exist; remove one first"),
            ));
        }
        let events = Arc::new(Mutex::new(Vec::new()));
        let watch = self
            .watch(
                target,
                recursive,
                include_entry,
                EventSink::Collect(Arc::clone(&events)),
            )
            .await?;
        let id = uuid::Uuid::new_v4().to_string();
        self.polled().insert(
            id.clone(),
            Arc::new(PolledWatch {
                _watch: watch,
                events,
            }),
        );
        Ok(id)
    }

    pub fn watcher_events(&self, id: &str) -> Result<Vec<FilesystemEvent>, ConnectError> {
        let watch = self
            .polled()
            .get(id)
            .cloned()
            .ok_or_else(|| ConnectError::not_found(format!("watcher {id} not found")))?;
        let mut events = watch.events.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(std::mem::take(&mut *events))
    }

    pub fn remove_watcher(&self, id: &str) -> Result<(), ConnectError> {
        self.polled()
            .remove(id)
            .map(|_| ())
            .ok_or_else(|| ConnectError::not_found(format!("watcher {id} not found")))
    }

    /// Drops every watcher (daemon shutdown).
    pub fn stop_watchers(&self) {
        self.polled().clear();
    }

    fn polled(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<PolledWatch>>> {
        self.watchers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

struct PolledWatch {
    _watch: DirWatch,
    events: Arc<Mutex<Vec<FilesystemEvent>>>,
}

/// Where a watch's events go.
#[derive(Clone)]
pub enum EventSink {
    Stream(mpsc::Sender<FilesystemEvent>),
    Collect(Arc<Mutex<Vec<FilesystemEvent>>>),
}

impl EventSink {
    fn push(&self, event: FilesystemEvent) {
        match self {
            EventSink::Stream(sender) => {
                if let Err(mpsc::error::TrySendError::Full(_)) = sender.try_send(event) {
                    tracing::warn!("an e2b watch stream fell behind; dropping an event");
                }
            }
            EventSink::Collect(events) => {
                let mut events = events.lock().unwrap_or_else(PoisonError::into_inner);
                if events.len() < MAX_PENDING_EVENTS {
                    events.push(event);
                } else {
                    tracing::warn!(
                        "an e2b watcher holds {MAX_PENDING_EVENTS} events; dropping one"
                    );
                }
            }
        }
    }
}

/// One watch on a directory held open by its descriptor: stopped when dropped.
pub struct DirWatch {
    _watcher: notify::RecommendedWatcher,
    _dir: OwnedFd,
}

impl DirWatch {
    fn start(
        dir: OwnedFd,
        recursive: bool,
        include_entry: bool,
        sink: EventSink,
    ) -> notify::Result<Self> {
        // The kernel resolves this magic link to the very directory the walk opened.
        let base = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
        let handler_base = base.clone();
        let handler = move |event: notify::Result<notify::Event>| match event {
            Ok(event) => {
                for event in translate(&handler_base, &event, include_entry) {
                    sink.push(event);
                }
            }
            Err(error) => tracing::warn!(%error, "e2b watch error; changes may be missed"),
        };
        let config = notify::Config::default().with_follow_symlinks(false);
        let mut watcher = notify::RecommendedWatcher::new(handler, config)?;
        let mode = if recursive {
            notify::RecursiveMode::Recursive
        } else {
            notify::RecursiveMode::NonRecursive
        };
        watcher.watch(&base, mode)?;
        Ok(Self {
            _watcher: watcher,
            _dir: dir,
        })
    }
}

/// envd's events for one `notify` event: names relative to the watched directory. A rename
/// is `rename` for the old name and `create` for the new one (as fsnotify reports them).
pub fn translate(base: &Path, event: &notify::Event, include_entry: bool) -> Vec<FilesystemEvent> {
    let kind = match event.kind {
        EventKind::Create(_) | EventKind::Modify(ModifyKind::Name(RenameMode::To)) => {
            EventType::Create
        }
        EventKind::Modify(ModifyKind::Name(RenameMode::From)) => EventType::Rename,
        // The pair was reported as From and To already.
        EventKind::Modify(ModifyKind::Name(_)) => return Vec::new(),
        EventKind::Modify(ModifyKind::Metadata(_)) => EventType::Chmod,
        EventKind::Modify(_) => EventType::Write,
        EventKind::Remove(_) => EventType::Remove,
        EventKind::Access(_) | EventKind::Any | EventKind::Other => return Vec::new(),
    };
    event
        .paths
        .iter()
        .filter_map(|path| {
            let name = relative_name(base, path)?;
            let entry = (include_entry
                && matches!(
                    kind,
                    EventType::Create | EventType::Write | EventType::Chmod
                ))
            .then(|| std::fs::symlink_metadata(path).ok())
            .flatten()
            .map(|meta| {
                let file_name = path.file_name().unwrap_or_default();
                let link = meta
                    .file_type()
                    .is_symlink()
                    .then(|| std::fs::read_link(path).ok())
                    .flatten();
                entry_info(
                    file_name,
                    name.clone(),
                    &Stats::from_std(&meta),
                    link.as_deref().map(Path::as_os_str),
                )
            });
            Some(FilesystemEvent {
                name,
                r#type: kind as i32,
                entry,
            })
        })
        .collect()
}

/// `path` relative to `base`, `/`-separated; `None` for `base` itself or a path elsewhere.
fn relative_name(base: &Path, path: &Path) -> Option<String> {
    let relative = path.strip_prefix(base).ok()?;
    let mut names = Vec::new();
    for component in relative.components() {
        match component {
            Component::Normal(name) => names.push(name.to_string_lossy()),
            _ => return None,
        }
    }
    (!names.is_empty()).then(|| names.join("/"))
}

/// Streams a watch: `start{}` once it is in place, then each event, keepalives between.
pub async fn forward_watch(
    watch: DirWatch,
    mut events: mpsc::Receiver<FilesystemEvent>,
    sender: StreamSender,
    keepalive: Duration,
    stream_timeout: Option<Duration>,
    stopping: CancellationToken,
) {
    let message = |event| WatchDirResponse { event: Some(event) };
    if !sender
        .send(&message(watch_dir_response::Event::Start(
            watch_dir_response::StartEvent {},
        )))
        .await
    {
        return;
    }
    let deadline = async {
        match stream_timeout {
            Some(timeout) => tokio::time::sleep(timeout).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + keepalive, keepalive);
    loop {
        tokio::select! {
            event = events.recv() => {
                let Some(event) = event else { break };
                if !sender.send(&message(watch_dir_response::Event::Filesystem(event))).await {
                    return;
                }
            }
            _ = ping.tick() => {
                let keepalive = watch_dir_response::Event::Keepalive(watch_dir_response::KeepAlive {});
                if !sender.send(&message(keepalive)).await {
                    return;
                }
            }
            () = &mut deadline => {
                // The SDK's `timeout` bounds a watch; its end is the normal end of the stream.
                break;
            }
            () = stopping.cancelled() => {
                sender.finish(Some(ConnectError::new(Code::Unavailable, "execd is shutting down"))).await;
                return;
            }
            () = sender.closed() => return,
        }
    }
    drop(watch);
    sender.finish(None).await;
}

/// What an entry's metadata says, from either `std` or `cap-std`.
pub struct Stats {
    kind: FileType,
    size: u64,
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: i64,
    mtime_nsec: i64,
}

/// envd's file type of an entry that is (not) a link or a directory.
fn file_type(is_symlink: bool, is_dir: bool) -> FileType {
    if is_symlink {
        FileType::Symlink
    } else if is_dir {
        FileType::Directory
    } else {
        FileType::File
    }
}

impl Stats {
    pub fn from_cap(meta: &cap_std::fs::Metadata) -> Self {
        use cap_std::fs::MetadataExt as _;
        Self {
            kind: file_type(meta.is_symlink(), meta.is_dir()),
            size: meta.len(),
            mode: meta.mode(),
            uid: meta.uid(),
            gid: meta.gid(),
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec(),
        }
    }

    pub fn from_std(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt as _;
        let kind = meta.file_type();
        Self {
            kind: file_type(kind.is_symlink(), kind.is_dir()),
            size: meta.len(),
            mode: meta.mode(),
            uid: meta.uid(),
            gid: meta.gid(),
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec(),
        }
    }
}

/// envd's `EntryInfo`: permissions as `ls -l` shows them (Go's `FileMode.String`), owner and
/// group by name where the system names them.
pub fn entry_info(name: &OsStr, path: String, stats: &Stats, link: Option<&OsStr>) -> EntryInfo {
    EntryInfo {
        name: name.to_string_lossy().into_owned(),
        r#type: stats.kind as i32,
        path,
        size: i64::try_from(stats.size).unwrap_or(i64::MAX),
        mode: stats.mode & 0o7777,
        permissions: permissions(stats.kind, stats.mode),
        owner: super::user::user_name(stats.uid).unwrap_or_else(|| stats.uid.to_string()),
        group: super::user::group_name(stats.gid).unwrap_or_else(|| stats.gid.to_string()),
        modified_time: Some(pbjson_types::Timestamp {
            seconds: stats.mtime,
            nanos: i32::try_from(stats.mtime_nsec).unwrap_or(0),
        }),
        symlink_target: link.map(|target| target.to_string_lossy().into_owned()),
    }
}

/// `drwxr-xr-x`, `-rw-r--r--`, `Lrwxrwxrwx` (Go spells a symlink `L`).
pub fn permissions(kind: FileType, mode: u32) -> String {
    let mut text = String::with_capacity(10);
    text.push(match kind {
        FileType::Directory => 'd',
        FileType::Symlink => 'L',
        FileType::File | FileType::Unspecified => '-',
    });
    for (bit, letter) in [
        (0o400, 'r'),
        (0o200, 'w'),
        (0o100, 'x'),
        (0o040, 'r'),
        (0o020, 'w'),
        (0o010, 'x'),
        (0o004, 'r'),
        (0o002, 'w'),
        (0o001, 'x'),
    ] {
        text.push(if mode & bit != 0 { letter } else { '-' });
    }
    text
}

fn escape(shown: &str) -> ConnectError {
    ConnectError::new(
        Code::PermissionDenied,
        format!("{shown} leads outside the root"),
    )
}

/// The Connect error for a failed filesystem call on `shown`.
pub fn fs_error(shown: &str, err: io::Error) -> ConnectError {
    if is_escape(&err) {
        return escape(shown);
    }
    match resolve::refusal(&err) {
        Some(Refusal::NotRegular) => {
            return ConnectError::invalid_argument(format!("{shown} is not a regular file"));
        }
        Some(Refusal::NotDirectory) => {
            return ConnectError::invalid_argument(format!("{shown} is not a directory"));
        }
        Some(Refusal::Loop) => {
            return ConnectError::invalid_argument(format!(
                "{shown}: too many levels of symbolic links"
            ));
        }
        Some(Refusal::Escape) | None => {}
    }
    if err.kind() == io::ErrorKind::NotFound {
        return ConnectError::not_found(format!("{shown} does not exist"));
    }
    if let Some(path_error) = path_error(shown, &err) {
        let code = match path_error {
            crate::opensandbox::PathError::PermissionDenied(_) => Code::PermissionDenied,
            _ => Code::InvalidArgument,
        };
        return ConnectError::new(code, path_error.to_string());
    }
    match rustix::io::Errno::from_io_error(&err) {
        Some(rustix::io::Errno::NOTEMPTY) => ConnectError::new(
            Code::FailedPrecondition,
            format!("directory {shown} is not empty"),
        ),
        Some(rustix::io::Errno::EXIST) => {
            ConnectError::new(Code::AlreadyExists, format!("{shown} already exists"))
        }
        Some(rustix::io::Errno::ISDIR) => {
            ConnectError::invalid_argument(format!("{shown} is a directory"))
        }
        _ => {
            tracing::error!(path = shown, %err, "e2b file operation failed");
            ConnectError::internal(format!("{shown}: file operation failed"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions_read_like_ls() {
        let table = [
            (FileType::Directory, 0o40755, "drwxr-xr-x"),
            (FileType::File, 0o100644, "-rw-r--r--"),
            (FileType::Symlink, 0o120777, "Lrwxrwxrwx"),
            (FileType::File, 0o100000, "----------"),
        ];
        for (kind, mode, expected) in table {
            assert_eq!(permissions(kind, mode), expected);
        }
    }

    #[test]
    fn a_rename_is_rename_then_create_relative_to_the_watched_directory() {
        let base = Path::new("/proc/self/fd/7");
        let from = notify::Event::new(EventKind::Modify(ModifyKind::Name(RenameMode::From)))
            .add_path(base.join("old.txt"));
        let to = notify::Event::new(EventKind::Modify(ModifyKind::Name(RenameMode::To)))
            .add_path(base.join("sub/new.txt"));
        let both = notify::Event::new(EventKind::Modify(ModifyKind::Name(RenameMode::Both)))
            .add_path(base.join("old.txt"))
            .add_path(base.join("sub/new.txt"));
        let names = |event: &notify::Event| {
            translate(base, event, false)
                .into_iter()
                .map(|e| (e.name, e.r#type))
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&from), [("old.txt".into(), EventType::Rename as i32)]);
        assert_eq!(
            names(&to),
            [("sub/new.txt".into(), EventType::Create as i32)]
        );
        assert!(names(&both).is_empty());
        let outside = notify::Event::new(EventKind::Remove(notify::event::RemoveKind::File))
            .add_path(PathBuf::from("/etc/passwd"));
        assert!(names(&outside).is_empty());
    }
}
