//! `GET /v1/files/watch`: the change feed of everything beneath `--root`, as NDJSON, one
//! [`FileChanges`] per line.
//!
//! Each subscriber gets its own recursive inotify watcher (`notify`, symlinks not followed, so
//! a link out of the root is never watched); the watcher lives exactly as long as the response
//! body. The first line, `{"paths":[]}`, is sent once the watch is in place: every change
//! after it is reported. Events are batched: the first change opens a window of
//! [`BATCH_WINDOW`], then the root-relative paths seen (created, modified, removed, renamed:
//! both names) go out as one line, deduplicated and sorted, at most [`MAX_PATHS_PER_LINE`].
//! When more changed, or the kernel's queue overflowed, the line holds `""` (the root) and the
//! first paths: the client should re-read what it shows.
//!
//! inotify watches a new directory only once it exists, so entries made in it before its
//! watch are found by walking it (confined, not following links) when the batch is sent.
//! Opens and closes are not changes; PUT's temporary files (`.<name>.warren-<uuid>`) are left
//! out, the renamed target is reported. Without a change for [`HEARTBEAT`], an empty line
//! `{"paths":[]}` is sent: it keeps proxies from timing the stream out and lets execd notice a
//! client that went away. Only names are reported, never contents.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::Response;
use cap_std::fs::Dir;
use notify::event::{CreateKind, ModifyKind, RenameMode};
use notify::{EventKind, Watcher as _};
use warren_protocol::files::FileChanges;

use super::{FilesApi, FilesError};
use crate::error::ApiError;
use crate::fs::confined::{self, MAX_WALK_DEPTH, Visit};
use crate::fs::resolve::{Part, Root, Want};
use crate::opensandbox::stream::streaming_response;

/// How long changes are collected after the first one before they are sent.
pub const BATCH_WINDOW: Duration = Duration::from_millis(200);
/// Most paths one line holds (`""` included).
pub const MAX_PATHS_PER_LINE: usize = 1000;
/// How long the feed may be silent before an empty line is sent.
pub const HEARTBEAT: Duration = Duration::from_secs(30);

/// `GET /v1/files/watch`.
/// The change feed: one JSON line ([`FileChanges`]) per batch, endless.
#[utoipa::path(
    get, path = "/v1/files/watch", tag = "files",
    responses(
        (status = 200, description = "One `FileChanges` object per line, the first with no paths; the stream never ends", content_type = "application/x-ndjson", body = FileChanges),
        (status = 500, description = "`RUNTIME_ERROR`: the watch could not be set up", body = warren_protocol::error::ErrorBody),
        (status = 503, description = "`WATCH_UNAVAILABLE`", body = warren_protocol::error::ErrorBody),
    )
)]
pub(super) async fn watch(State(files): State<FilesApi>) -> Result<Response, ApiError> {
    let root = Arc::clone(&files.root);
    if root.parent().is_none() {
        // /proc, /sys and every mount: nothing inotify could watch recursively.
        return Err(FilesError::WatchUnavailable(
            "the root is /, which cannot be watched; run execd with --root <dir>".into(),
        )
        .into());
    }
    let pending = Arc::new(Pending::default());
    let watcher = {
        let pending = Arc::clone(&pending);
        // Adding the recursive watch walks the whole tree.
        super::blocking(move || start_watcher(root, pending)).await?
    };
    let feed = Feed {
        files,
        pending,
        _watcher: watcher,
        ready_sent: false,
    };
    let lines = futures_util::stream::unfold(feed, |mut feed| async move {
        let line = feed.next_line().await?;
        Some((Ok::<Bytes, Infallible>(line), feed))
    });
    Ok(streaming_response(
        Body::from_stream(lines),
        "application/x-ndjson",
    ))
}

fn start_watcher(
    root: Arc<PathBuf>,
    pending: Arc<Pending>,
) -> Result<notify::RecommendedWatcher, FilesError> {
    let unavailable = |error: notify::Error| {
        FilesError::WatchUnavailable(format!("cannot watch {}: {error}", root.display()))
    };
    let handler_root = Arc::clone(&root);
    let handler = move |event| pending.record(&handler_root, event);
    let config = notify::Config::default().with_follow_symlinks(false);
    let mut watcher = notify::RecommendedWatcher::new(handler, config).map_err(unavailable)?;
    watcher
        .watch(&root, notify::RecursiveMode::Recursive)
        .map_err(unavailable)?;
    Ok(watcher)
}

/// One subscriber's feed: what its watcher recorded, and the watcher itself, dropped (and so
/// stopped) with the response body.
struct Feed {
    files: FilesApi,
    pending: Arc<Pending>,
    _watcher: notify::RecommendedWatcher,
    ready_sent: bool,
}

impl Feed {
    /// The next line to send; `None` ends the feed (the daemon stops).
    async fn next_line(&mut self) -> Option<Bytes> {
        if !self.ready_sent {
            self.ready_sent = true;
            return Some(encode(Vec::new()));
        }
        loop {
            tokio::select! {
                () = self.files.stopping.cancelled() => return None,
                () = self.pending.changed.notified() => {}
                () = tokio::time::sleep(HEARTBEAT) => return Some(encode(Vec::new())),
            }
            tokio::select! {
                () = self.files.stopping.cancelled() => return None,
                () = tokio::time::sleep(BATCH_WINDOW) => {}
            }
            let mut batch = self.pending.take();
            if !batch.new_dirs.is_empty() {
                batch = match self
                    .files
                    .with_root(|root| Ok(batch.with_contents(root)))
                    .await
                {
                    Ok(batch) => batch,
                    // The root is gone or unreadable: nothing more can be said.
                    Err(_) => Batch::overflowed(),
                };
            }
            let paths = batch.into_paths();
            if !paths.is_empty() {
                return Some(encode(paths));
            }
        }
    }
}

fn encode(paths: Vec<String>) -> Bytes {
    let mut line = serde_json::to_vec(&FileChanges { paths }).expect("paths always serialize");
    line.push(b'\n');
    Bytes::from(line)
}

/// What the watcher thread recorded since the last line, and the signal that there is some.
#[derive(Default)]
struct Pending {
    batch: Mutex<Batch>,
    changed: tokio::sync::Notify,
}

impl Pending {
    /// Called on the watcher's thread for every event (or error).
    fn record(&self, root: &Path, event: notify::Result<notify::Event>) {
        let mut batch = self.batch.lock().unwrap_or_else(PoisonError::into_inner);
        match event {
            Err(error) => {
                // A watch that could not be added (the inotify limit) or a failed read: changes
                // may go unseen.
                tracing::warn!(%error, "file watch error; reporting that changes may be missed");
                batch.overflowed = true;
            }
            // The kernel's queue overflowed: events were dropped.
            Ok(event) if event.need_rescan() => batch.overflowed = true,
            // Opens and closes change nothing.
            Ok(event) if matches!(event.kind, EventKind::Access(_)) => return,
            Ok(event) => batch.add_event(root, &event),
        }
        drop(batch);
        self.changed.notify_one();
    }

    fn take(&self) -> Batch {
        std::mem::take(&mut *self.batch.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// The changes of one line in the making.
#[derive(Debug, Default)]
struct Batch {
    paths: BTreeSet<String>,
    /// Directories created or moved in: their entries may predate their watch.
    new_dirs: BTreeSet<String>,
    /// More changed than [`MAX_PATHS_PER_LINE`], or events were lost.
    overflowed: bool,
}

impl Batch {
    fn overflowed() -> Self {
        Self {
            overflowed: true,
            ..Self::default()
        }
    }

    fn add_event(&mut self, root: &Path, event: &notify::Event) {
        let new_dir_at = match event.kind {
            EventKind::Create(CreateKind::Folder)
            | EventKind::Modify(ModifyKind::Name(RenameMode::To)) => Some(0),
            // `[from, to]`.
            EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => Some(1),
            _ => None,
        };
        for (index, path) in event.paths.iter().enumerate() {
            let Some(relative) = relative_path(root, path) else {
                continue;
            };
            let added = self.add(relative.clone());
            if matches!(added, Visit::More) && new_dir_at == Some(index) {
                self.new_dirs.insert(relative);
            }
        }
    }

    /// Adds a path while there is room; [`Visit::Enough`] once the batch is full.
    fn add(&mut self, path: String) -> Visit {
        if self.paths.len() < MAX_PATHS_PER_LINE || self.paths.contains(&path) {
            self.paths.insert(path);
            Visit::More
        } else {
            self.overflowed = true;
            Visit::Enough
        }
    }

    /// The batch with the entries of its new directories (a name renamed in that turns out to
    /// be a file has none), each walked once, below the root.
    fn with_contents(mut self, root: &Root) -> Self {
        let new_dirs = std::mem::take(&mut self.new_dirs);
        let mut walked: Option<&str> = None;
        for dir in &new_dirs {
            // Sorted, so a directory's subdirectories come right after it: its walk saw them.
            if walked.is_some_and(|parent| dir.starts_with(&format!("{parent}/"))) {
                continue;
            }
            walked = Some(dir);
            let parts: Vec<Part> = dir.split('/').map(|name| Part::Name(name.into())).collect();
            let Ok((fd, _)) = root.open(&parts, Want::Dir) else {
                continue;
            };
            let _ = confined::walk(&Dir::from(fd), dir, MAX_WALK_DEPTH, &mut |seen| {
                if confined::is_temp_name(seen.name) {
                    return Visit::More;
                }
                self.add(seen.path)
            });
            if self.overflowed {
                break;
            }
        }
        self
    }

    /// The line's paths: sorted, and `""` first (in place of the last) when it overflowed.
    fn into_paths(self) -> Vec<String> {
        if !self.overflowed {
            return self.paths.into_iter().collect();
        }
        std::iter::once(String::new())
            .chain(self.paths.into_iter().take(MAX_PATHS_PER_LINE - 1))
            .collect()
    }
}

/// `path` relative to `root`, `/`-separated; `None` for the root itself, a path elsewhere, or
/// one of PUT's temporary files.
fn relative_path(root: &Path, path: &Path) -> Option<String> {
    let relative = path.strip_prefix(root).ok()?;
    if relative.file_name().is_some_and(confined::is_temp_name) {
        return None;
    }
    let mut names = Vec::new();
    for component in relative.components() {
        match component {
            Component::Normal(name) => names.push(name.to_string_lossy()),
            _ => return None,
        }
    }
    (!names.is_empty()).then(|| names.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_root_relative_and_leave_out_the_root_temp_files_and_elsewhere() {
        let root = Path::new("/srv/root");
        let table = [
            ("/srv/root/a.txt", Some("a.txt")),
            ("/srv/root/sub/inner.txt", Some("sub/inner.txt")),
            ("/srv/root", None),
            ("/srv/rootless/a", None),
            ("/etc/passwd", None),
            (
                "/srv/root/sub/.inner.txt.warren-0123456789abcdef0123456789abcdef",
                None,
            ),
        ];
        for (path, expected) in table {
            assert_eq!(
                relative_path(root, Path::new(path)).as_deref(),
                expected,
                "{path}"
            );
        }
    }

    #[test]
    fn a_full_batch_says_so_with_the_root_first() {
        let mut batch = Batch::default();
        for n in 0..MAX_PATHS_PER_LINE + 5 {
            batch.add(format!("f{n:05}"));
        }
        assert!(batch.overflowed);
        let paths = batch.into_paths();
        assert_eq!(paths.len(), MAX_PATHS_PER_LINE);
        assert_eq!(paths[..2], ["".to_owned(), "f00000".to_owned()]);
    }

    #[test]
    fn a_new_directory_brings_what_was_made_in_it_before_its_watch() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(dir.path().join("new/nested")).expect("dirs");
        std::fs::write(dir.path().join("new/nested/early.txt"), "x").expect("file");
        let temp = "new/.early.txt.warren-0123456789abcdef0123456789abcdef";
        std::fs::write(dir.path().join(temp), "x").expect("file");
        std::fs::write(dir.path().join("a-file"), "x").expect("file");
        let mut batch = Batch::default();
        for path in ["new", "new/nested", "a-file"] {
            batch.add(path.into());
            batch.new_dirs.insert(path.into());
        }
        let root = Root::new(dir.path()).expect("root");
        let paths = batch.with_contents(&root).into_paths();
        assert_eq!(
            paths,
            ["a-file", "new", "new/nested", "new/nested/early.txt"]
        );
    }

    #[test]
    fn a_rename_reports_both_names_and_looks_into_the_new_one() {
        let root = Path::new("/srv/root");
        let event = notify::Event::new(EventKind::Modify(ModifyKind::Name(RenameMode::Both)))
            .add_path(root.join("old"))
            .add_path(root.join("new"));
        let mut batch = Batch::default();
        batch.add_event(root, &event);
        assert_eq!(batch.paths, BTreeSet::from(["new".into(), "old".into()]));
        assert_eq!(batch.new_dirs, BTreeSet::from(["new".into()]));
        assert!(!batch.overflowed);
    }
}
