//! envd's `filesystem.Filesystem` service and the `/files` upload and download, confined
//! beneath `--root` by the same walk as execd's other file routes (`fs::resolve`: no
//! `..`, symlink or swap leads out; listings never follow a link).
//!
//! Paths are absolute (and must lie under the root) or relative to the home of the request's
//! user (`~` and `~/x` too), as envd takes them; a home that does not lie beneath the root is
//! replaced by the root, so confinement never depends on it. Entries report absolute paths,
//! and a symlink's target as envd does: the absolute path it finally resolves to (every link on
//! the way followed, inside the root), or the link's own path when that cannot be resolved.
//!
//! `WatchDir` and the watcher RPCs watch the directory through the descriptor the confined
//! walk opened (`/proc/self/fd/N`), so what is watched is what was checked even if a name on
//! the way is swapped for a link afterwards; `notify` recurses without following links, and a
//! directory made during a recursive watch is read once its own watch is in place, so what was
//! made in it before that is reported too. Events are reported relative to the watched
//! directory, as envd does. Warren's own temporary files (an atomic write's
//! `.<name>.warren-<hex>`) are never reported: the rename that completes a write is reported
//! as envd reports its in-place write, `create` then `write` of the file's name.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use cap_fs_ext::DirExt as _;
use cap_std::fs::Dir;
use notify::event::{CreateKind, ModifyKind, RenameMode};
use notify::{EventKind, Watcher as _};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::connect::{Code, ConnectError, StreamSender};
use super::proto::filesystem::{
    EntryInfo, EventType, FileType, FilesystemEvent, WatchDirResponse, watch_dir_response,
};
use crate::fs::confined::{self, MAX_WALK_DEPTH, Visit};
use crate::fs::resolve::{self, Part, Refusal, Root, Want};
use crate::fs::{is_escape, path_error};

/// Longest path a request may name, in bytes (Linux's `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;
/// Most events a watcher holds between two `GetWatcherEvents`, or a stream has pending; more
/// are dropped (and logged).
pub const MAX_PENDING_EVENTS: usize = 10_000;
/// Most watchers made with `CreateWatcher` that may exist at once.
pub const MAX_WATCHERS: usize = 256;
/// Most renames of Warren's temporary files one watch remembers between their two halves
/// (`MOVED_FROM` and `MOVED_TO` arrive one after the other, so a few suffice).
const MAX_PENDING_TEMP_RENAMES: usize = 64;

/// A path from a request: as the client wrote it, its parts below the root, and the absolute
/// path envd would answer for it (as written when absolute, else joined to the home and
/// cleaned).
pub struct Target {
    pub shown: String,
    pub parts: Vec<Part>,
    pub absolute: String,
}

/// The files root, the daemon's own user's home and the watchers made with `CreateWatcher`.
pub struct Filesystem {
    root: PathBuf,
    own_home: Option<PathBuf>,
    watchers: Mutex<HashMap<String, Arc<PolledWatch>>>,
}

impl Filesystem {
    /// `own_home` is the home of the daemon's own user (`user::own_home`).
    pub fn new(root: &Path, own_home: Option<PathBuf>) -> Self {
        let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
        Self {
            root,
            own_home,
            watchers: Mutex::new(HashMap::new()),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The home of the daemon's own user, unresolved (what its processes get as `HOME`).
    pub fn own_home(&self) -> Option<&Path> {
        self.own_home.as_deref()
    }

    /// Where relative paths of a request for `user` (`None`: the daemon's own user) start: the
    /// user's home as `cd ~ && pwd -P` shows it, when that lies beneath the root; else the root.
    pub fn base(&self, user: Option<&str>) -> Result<PathBuf, ConnectError> {
        let home = super::user::home_of(user, self.own_home.as_deref())?;
        Ok(self.confined_home(home))
    }

    fn confined_home(&self, home: Option<PathBuf>) -> PathBuf {
        let Some(home) = home.filter(|home| home.is_absolute()) else {
            return self.root.clone();
        };
        // `pwd -P`: the real path; a home that does not exist yet is taken as written.
        let home = std::fs::canonicalize(&home).unwrap_or(home);
        match resolve::parts_beneath(&self.root, &home) {
            Some(_) => home,
            None => self.root.clone(),
        }
    }

    /// `raw` below the root: absolute paths must lie under it; `~`, `~/x` and relative paths
    /// are taken from `base` (the request's [`Filesystem::base`]), as envd takes them from the
    /// user's home.
    pub fn target(&self, raw: &str, base: &Path) -> Result<Target, ConnectError> {
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
        // envd expands `~` and `~/...` to the home; `~user` is refused there too.
        let relative = match raw.strip_prefix('~') {
            Some("") => Some(""),
            Some(rest) if rest.starts_with('/') => Some(rest.trim_start_matches('/')),
            Some(_) => {
                return Err(ConnectError::invalid_argument(format!(
                    "{raw}: only the request's own home (~) can be expanded"
                )));
            }
            None if Path::new(raw).is_absolute() => None,
            None => Some(raw),
        };
        let absolute = match relative {
            Some(relative) => base.join(relative),
            None => PathBuf::from(raw),
        };
        let parts = resolve::parts_beneath(&self.root, &absolute).ok_or_else(|| escape(raw))?;
        let absolute = match relative {
            Some(_) => self.shown_path(&parts),
            None => raw.to_owned(),
        };
        Ok(Target {
            shown: raw.to_owned(),
            parts,
            absolute,
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
        let path = self.shown_path(&target.parts);
        let link = meta.is_symlink().then(|| {
            self.resolved_link(root, &entry.dir, &entry.name)
                .unwrap_or_else(|| path.clone())
        });
        Ok(entry_info(
            &entry.name,
            path,
            &Stats::from_cap(&meta),
            link.as_deref().map(OsStr::new),
        ))
    }

    /// Where the symlink `name` in `dir` leads, as envd reports it (Go's
    /// `filepath.EvalSymlinks`): the absolute path of what it finally names, every link on the
    /// way followed by the confined walk. `None` when that is missing, a loop, or outside the
    /// root (envd then reports the link's own path).
    fn resolved_link(&self, root: &Root, dir: &Dir, name: &OsStr) -> Option<String> {
        let mut dir_path = self.real_path(dir.as_fd())?;
        let mut target = PathBuf::from(confined::link_target(dir, name).ok()?);
        for _ in 0..resolve::MAX_LINKS_FOLLOWED {
            // An absolute target replaces `dir_path`; a relative one continues from it.
            let parts = resolve::parts_beneath(&self.root, &dir_path.join(&target))?;
            let entry = root.locate(&parts).ok()?;
            let meta = entry.lstat().ok()?;
            let entry_dir = self.real_path(entry.dir.as_fd())?;
            if !meta.is_symlink() {
                let path = if entry.is_root() {
                    entry_dir
                } else {
                    entry_dir.join(&entry.name)
                };
                return Some(path.to_string_lossy().into_owned());
            }
            target = PathBuf::from(confined::link_target(&entry.dir, &entry.name).ok()?);
            dir_path = entry_dir;
        }
        None
    }

    /// The real path of the open directory `fd` (the kernel's, as `pwd -P` shows it), when it
    /// lies beneath the root and still exists.
    fn real_path(&self, fd: BorrowedFd<'_>) -> Option<PathBuf> {
        let path = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
        let beneath = path.starts_with(&self.root)
            && !path.as_os_str().as_encoded_bytes().ends_with(b" (deleted)");
        beneath.then_some(path)
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
            let link = seen.meta.is_symlink().then(|| {
                self.resolved_link(root, seen.dir, seen.name)
                    .unwrap_or_else(|| seen.path.clone())
            });
            entries.push(entry_info(
                seen.name,
                seen.path,
                &Stats::from_cap(seen.meta),
                link.as_deref().map(OsStr::new),
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
        let (watch, new_dirs) = self
            .with_root(move |fs, root| {
                let fd = fs.open_watch_dir(root, &target)?;
                let events = EventMaker {
                    shown_dir: fs.shown_path(&target.parts),
                    root: fs.root.clone(),
                    include_entry,
                };
                DirWatch::start(fd, recursive, events, sink).map_err(|error| {
                    ConnectError::internal(format!("cannot watch {}: {error}", target.shown))
                })
            })
            .await?;
        if let Some(new_dirs) = new_dirs {
            tokio::spawn(new_dirs.follow());
        }
        Ok(watch)
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
    _watcher: Arc<Mutex<notify::RecommendedWatcher>>,
    _dir: Arc<OwnedFd>,
}

impl DirWatch {
    /// Watches `dir` (and, `recursive`, every directory below it); the second half follows the
    /// directories made later and must be run (`NewDirs::follow`) for a recursive watch.
    fn start(
        dir: OwnedFd,
        recursive: bool,
        events: EventMaker,
        sink: EventSink,
    ) -> notify::Result<(Self, Option<NewDirs>)> {
        // The kernel resolves this magic link to the very directory the walk opened. The `.`
        // makes the path itself a directory rather than a link, which notify's recursive walk
        // needs to watch it (it does not follow links); `Path` equality ignores the `.`, so
        // notify's own bookkeeping of `<base>/./sub` still finds `<base>/.`.
        let base = PathBuf::from(format!("/proc/self/fd/{}/.", dir.as_raw_fd()));
        let dir = Arc::new(dir);
        let (new_dir_tx, new_dir_rx) = mpsc::unbounded_channel();
        let mut translator = Translator {
            base: base.clone(),
            events: events.clone(),
            new_dirs: recursive.then_some(new_dir_tx),
            temp_renames: VecDeque::new(),
        };
        let handler_sink = sink.clone();
        let handler = move |event: notify::Result<notify::Event>| match event {
            Ok(event) => {
                for event in translator.translate(&event) {
                    handler_sink.push(event);
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
        let watcher = Arc::new(Mutex::new(watcher));
        let new_dirs = recursive.then(|| NewDirs {
            receiver: new_dir_rx,
            scanner: Arc::new(Scanner {
                watcher: Arc::downgrade(&watcher),
                dir: Arc::clone(&dir),
                base,
                events,
                sink,
            }),
        });
        Ok((
            Self {
                _watcher: watcher,
                _dir: dir,
            },
            new_dirs,
        ))
    }
}

/// How a watch's events are made: names relative to the watched directory, entries (when
/// asked for) with the absolute paths the client sees.
#[derive(Clone)]
pub struct EventMaker {
    /// The watched directory as the client sees it.
    shown_dir: String,
    /// The files root, which a reported link target must lie beneath.
    root: PathBuf,
    include_entry: bool,
}

impl EventMaker {
    /// The event `kind` of `name` (relative to the watched directory), whose entry is at `path`
    /// (below `/proc/self/fd/N`). Only creates, writes and chmods carry an entry, as in envd: a
    /// removed or renamed name may already be something else.
    fn event(&self, name: String, kind: EventType, path: &Path) -> FilesystemEvent {
        let carries_entry = matches!(
            kind,
            EventType::Create | EventType::Write | EventType::Chmod
        );
        let entry = (self.include_entry && carries_entry)
            .then(|| std::fs::symlink_metadata(path).ok())
            .flatten()
            .map(|meta| {
                let shown = confined::join_shown(&self.shown_dir, &name);
                let link = meta
                    .file_type()
                    .is_symlink()
                    .then(|| self.link_target(path, &shown));
                entry_info(
                    path.file_name().unwrap_or_default(),
                    shown,
                    &Stats::from_std(&meta),
                    link.as_deref().map(OsStr::new),
                )
            });
        FilesystemEvent {
            name,
            r#type: kind as i32,
            entry,
        }
    }

    /// A link's target in an event's entry: where it resolves, when that lies beneath the root,
    /// else the link's own path (as envd reports a link it cannot resolve). Only a path is
    /// reported, nothing is opened.
    fn link_target(&self, path: &Path, shown: &str) -> String {
        std::fs::canonicalize(path)
            .ok()
            .filter(|target| target.starts_with(&self.root))
            .map_or_else(
                || shown.to_owned(),
                |target| target.to_string_lossy().into_owned(),
            )
    }
}

/// Turns one watch's `notify` events into envd's; runs on notify's thread, so it only
/// translates and hands work on.
struct Translator {
    base: PathBuf,
    events: EventMaker,
    /// For a recursive watch: where the directories it creates are announced, to be read once
    /// their own watch is in place.
    new_dirs: Option<mpsc::UnboundedSender<PathBuf>>,
    /// The rename cookies of Warren's temporary files moved away (a write completing), the
    /// newest last.
    temp_renames: VecDeque<usize>,
}

impl Translator {
    /// envd's events for one `notify` event: names relative to the watched directory. A rename
    /// is `rename` for the old name and `create` for the new one (as fsnotify reports them);
    /// Warren's temporary files are left out, and the rename that completes an atomic write is
    /// `create` and `write` of the written name, as envd's in-place write is.
    fn translate(&mut self, event: &notify::Event) -> Vec<FilesystemEvent> {
        let mut events = Vec::new();
        for path in &event.paths {
            let Some(name) = relative_name(&self.base, path) else {
                continue;
            };
            let temp = path.file_name().is_some_and(confined::is_temp_name);
            let kinds: &[EventType] = match event.kind {
                EventKind::Create(_) if temp => continue,
                EventKind::Create(kind) => {
                    if kind == CreateKind::Folder
                        && let Some(new_dirs) = &self.new_dirs
                        && let Ok(relative) = path.strip_prefix(&self.base)
                    {
                        // The watch stops when the receiver is gone: nothing is left to tell.
                        let _ = new_dirs.send(relative.to_path_buf());
                    }
                    &[EventType::Create]
                }
                EventKind::Modify(ModifyKind::Name(RenameMode::From)) => {
                    // Without a cookie it is the watched directory itself moving (`MOVE_SELF`).
                    let Some(cookie) = event.tracker() else {
                        continue;
                    };
                    if temp {
                        self.temp_renames.push_back(cookie);
                        if self.temp_renames.len() > MAX_PENDING_TEMP_RENAMES {
                            self.temp_renames.pop_front();
                        }
                        continue;
                    }
                    &[EventType::Rename]
                }
                EventKind::Modify(ModifyKind::Name(RenameMode::To)) if temp => continue,
                EventKind::Modify(ModifyKind::Name(RenameMode::To)) => {
                    let completes_write = event.tracker().is_some_and(|cookie| {
                        let position = self.temp_renames.iter().position(|c| *c == cookie);
                        position.and_then(|i| self.temp_renames.remove(i)).is_some()
                    });
                    if completes_write {
                        &[EventType::Create, EventType::Write]
                    } else {
                        &[EventType::Create]
                    }
                }
                // The pair was reported as From and To already.
                EventKind::Modify(ModifyKind::Name(_)) => continue,
                EventKind::Modify(_) | EventKind::Remove(_) if temp => continue,
                EventKind::Modify(ModifyKind::Metadata(_)) => &[EventType::Chmod],
                EventKind::Modify(_) => &[EventType::Write],
                EventKind::Remove(_) => &[EventType::Remove],
                EventKind::Access(_) | EventKind::Any | EventKind::Other => continue,
            };
            for kind in kinds {
                events.push(self.events.event(name.clone(), *kind, path));
            }
        }
        events
    }
}

/// The directories a recursive watch made since it started, announced by its [`Translator`].
pub struct NewDirs {
    receiver: mpsc::UnboundedReceiver<PathBuf>,
    scanner: Arc<Scanner>,
}

impl NewDirs {
    /// Reads each new directory once its watch is in place, until the watch stops (its
    /// translator, the only sender, goes with notify's thread).
    pub async fn follow(mut self) {
        while let Some(relative) = self.receiver.recv().await {
            let scanner = Arc::clone(&self.scanner);
            let scanned = tokio::task::spawn_blocking(move || scanner.scan_new_dir(&relative));
            if !matches!(scanned.await, Ok(true)) {
                break;
            }
        }
    }
}

/// Reads the directories a recursive watch made, for what was made in them before they were
/// watched.
struct Scanner {
    /// Weak, so the watch stops when its `DirWatch` goes even while directories are queued.
    watcher: Weak<Mutex<notify::RecommendedWatcher>>,
    /// The watched directory: kept open while the base path names it.
    dir: Arc<OwnedFd>,
    base: PathBuf,
    events: EventMaker,
    sink: EventSink,
}

impl Scanner {
    /// Waits until notify watches the new directory `relative`, then reports what is in it
    /// (and below it) as created. Everything made in it after its watch was added is the
    /// watch's to report, everything made before is found here; an entry made in between may
    /// be reported twice, never not at all. `false` once the watch has stopped.
    fn scan_new_dir(&self, relative: &Path) -> bool {
        let Some(watcher) = self.watcher.upgrade() else {
            return false;
        };
        // notify adds the watches of new directories after handing over the batch of events
        // that announced them, on its one event-loop thread; a round trip through that loop
        // (a `configure` that changes nothing) returns after they are in place.
        let barrier = watcher
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .configure(notify::Config::default());
        drop(watcher);
        if barrier.is_err() {
            return false;
        }
        let Some(dir) = self.open_below(relative) else {
            // Gone again, or swapped for a link: nothing in it to report.
            return true;
        };
        let shown = relative.to_string_lossy();
        let mut n_reported = 0;
        let walked = confined::walk(&dir, &shown, MAX_WALK_DEPTH, &mut |seen| {
            if confined::is_temp_name(seen.name) {
                return Visit::More;
            }
            let path = self.base.join(&seen.path);
            self.sink
                .push(self.events.event(seen.path, EventType::Create, &path));
            n_reported += 1;
            confined::enough_when(n_reported)
        });
        if let Ok(gaps) = walked
            && gaps.truncated
        {
            tracing::warn!(
                directory = %shown,
                "an e2b watch reported only part of a new directory's contents"
            );
        }
        true
    }

    /// `relative` below the watched directory, opened without following any link.
    fn open_below(&self, relative: &Path) -> Option<Dir> {
        let mut dir = Dir::from(self.dir.try_clone().ok()?);
        for component in relative.components() {
            match component {
                Component::Normal(name) => dir = dir.open_dir_nofollow(name).ok()?,
                Component::CurDir => {}
                _ => return None,
            }
        }
        Some(dir)
    }
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
            crate::fs::PathError::PermissionDenied(_) => Code::PermissionDenied,
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

    fn translator(base: &Path) -> Translator {
        Translator {
            base: base.to_path_buf(),
            events: EventMaker {
                shown_dir: "/srv/root/watched".into(),
                root: PathBuf::from("/srv/root"),
                include_entry: false,
            },
            new_dirs: None,
            temp_renames: VecDeque::new(),
        }
    }

    fn names(translator: &mut Translator, event: &notify::Event) -> Vec<(String, EventType)> {
        translator
            .translate(event)
            .into_iter()
            .map(|e| {
                let kind = EventType::try_from(e.r#type).expect("a known event type");
                (e.name, kind)
            })
            .collect()
    }

    fn rename(mode: RenameMode, path: PathBuf, cookie: usize) -> notify::Event {
        notify::Event::new(EventKind::Modify(ModifyKind::Name(mode)))
            .add_path(path)
            .set_tracker(cookie)
    }

    #[test]
    fn a_rename_is_rename_then_create_relative_to_the_watched_directory() {
        let base = Path::new("/proc/self/fd/7/.");
        let mut translator = translator(base);
        let from = rename(RenameMode::From, base.join("old.txt"), 1);
        let to = rename(RenameMode::To, base.join("sub/new.txt"), 1);
        let both = notify::Event::new(EventKind::Modify(ModifyKind::Name(RenameMode::Both)))
            .add_path(base.join("old.txt"))
            .add_path(base.join("sub/new.txt"));
        assert_eq!(
            names(&mut translator, &from),
            [("old.txt".into(), EventType::Rename)]
        );
        assert_eq!(
            names(&mut translator, &to),
            [("sub/new.txt".into(), EventType::Create)]
        );
        assert!(names(&mut translator, &both).is_empty());
        let outside = notify::Event::new(EventKind::Remove(notify::event::RemoveKind::File))
            .add_path(PathBuf::from("/etc/passwd"));
        assert!(names(&mut translator, &outside).is_empty());
        // The watched directory itself moving has no cookie and no name below it.
        let moved_self = notify::Event::new(EventKind::Modify(ModifyKind::Name(RenameMode::From)))
            .add_path(base.to_path_buf());
        assert!(names(&mut translator, &moved_self).is_empty());
    }

    #[test]
    fn an_atomic_write_is_reported_as_create_and_write_of_its_own_name_only() {
        let base = Path::new("/proc/self/fd/7/.");
        let temp = base.join("sub/.inner.txt.warren-0123456789abcdef0123456789abcdef");
        let target = base.join("sub/inner.txt");
        let mut translator = translator(base);
        let quiet = [
            notify::Event::new(EventKind::Create(CreateKind::File)).add_path(temp.clone()),
            notify::Event::new(EventKind::Modify(ModifyKind::Data(
                notify::event::DataChange::Any,
            )))
            .add_path(temp.clone()),
            notify::Event::new(EventKind::Modify(ModifyKind::Metadata(
                notify::event::MetadataKind::Any,
            )))
            .add_path(temp.clone()),
            rename(RenameMode::From, temp.clone(), 42),
        ];
        for event in &quiet {
            assert!(names(&mut translator, event).is_empty(), "{event:?}");
        }
        assert_eq!(
            names(&mut translator, &rename(RenameMode::To, target.clone(), 42)),
            [
                ("sub/inner.txt".into(), EventType::Create),
                ("sub/inner.txt".into(), EventType::Write),
            ]
        );
        // A later rename onto the same name is a plain one again.
        assert_eq!(
            names(&mut translator, &rename(RenameMode::To, target, 43)),
            [("sub/inner.txt".into(), EventType::Create)]
        );
        // A write that failed removes its temporary file, which is not reported either.
        let removed =
            notify::Event::new(EventKind::Remove(notify::event::RemoveKind::File)).add_path(temp);
        assert!(names(&mut translator, &removed).is_empty());
    }

    #[test]
    fn relative_paths_and_tilde_start_at_the_base_absolute_ones_at_the_root() {
        let root = tempfile::tempdir().expect("a temporary root");
        let root_path = std::fs::canonicalize(root.path()).expect("canonical root");
        let fs = Filesystem::new(&root_path, None);
        let home = root_path.join("home/user");
        let shown = |raw: &str| -> Result<(String, usize), String> {
            fs.target(raw, &home)
                .map(|t| (t.absolute, t.parts.len()))
                .map_err(|e| e.code.as_str().to_owned())
        };
        let at = |rel: &str| {
            let path = if rel.is_empty() {
                root_path.clone()
            } else {
                root_path.join(rel)
            };
            path.to_string_lossy().into_owned()
        };
        let table = [
            ("x/y.txt", Ok((at("home/user/x/y.txt"), 4))),
            ("./x/../y.txt", Ok((at("home/user/y.txt"), 5))),
            ("~", Ok((at("home/user"), 2))),
            ("~/x", Ok((at("home/user/x"), 3))),
            ("~other/x", Err("invalid_argument".to_owned())),
            // Below the root `..` is left to the walk, which refuses to climb out of it.
            ("../../../..", Ok((at(""), 6))),
            ("/etc/passwd", Err("permission_denied".to_owned())),
            ("", Err("invalid_argument".to_owned())),
        ];
        for (raw, expected) in table {
            assert_eq!(shown(raw), expected, "{raw:?}");
        }
        let absolute = at("a/b");
        assert_eq!(
            fs.target(&absolute, &home).map(|t| t.absolute).ok(),
            Some(absolute.clone()),
            "an absolute path is answered as written"
        );
    }

    #[test]
    fn a_home_outside_the_root_or_missing_leaves_relative_paths_at_the_root() {
        let root = tempfile::tempdir().expect("a temporary root");
        let root_path = std::fs::canonicalize(root.path()).expect("canonical root");
        std::fs::create_dir(root_path.join("real-home")).expect("a home");
        std::os::unix::fs::symlink("real-home", root_path.join("home-link")).expect("a link");
        std::os::unix::fs::symlink("/etc", root_path.join("out-link")).expect("a link");
        let fs = Filesystem::new(&root_path, None);
        let table = [
            (
                Some(root_path.join("home-link")),
                root_path.join("real-home"),
            ),
            (Some(root_path.join("not-yet")), root_path.join("not-yet")),
            (Some(root_path.join("out-link")), root_path.clone()),
            (Some(PathBuf::from("/")), root_path.clone()),
            (Some(PathBuf::from("relative")), root_path.clone()),
            (None, root_path.clone()),
        ];
        for (home, expected) in table {
            assert_eq!(fs.confined_home(home.clone()), expected, "{home:?}");
        }
    }
}
