//! A rewind: restoring a checkpoint over the directory it came from, touching only what
//! differs, so its cost follows the change rather than the tree's size.
//!
//! 1. The target is walked as it is now (stat only, every directory opened `O_NOFOLLOW`
//!    beneath its parent). Anything this path does not handle (a name that is not UTF-8, a
//!    directory it cannot list) makes it give way to the full staged restore.
//! 2. The plan, entry by entry: a file stays when `current` (the checkpoint just taken of this
//!    directory) vouches that it holds the wanted chunks (same chunks, its stat still the one
//!    `current` recorded, and old enough to trust); a link stays when its target is the one
//!    wanted; a directory stays when it is one. Everything else the checkpoint holds is
//!    staged: files written from verified chunks, and links, in a staging directory beside the
//!    target. Whatever the target holds that the checkpoint does not is removed.
//! 3. Only when staging succeeded (every chunk matched its hash) does the target change:
//!    removals deepest first, then directories made and staged entries renamed over their
//!    places in path order, then modes and times. Every step is an `*at` call beneath a
//!    directory reached without following a link, so a tree that changes meanwhile can make a
//!    step fail but never act outside the target. A step that fails with an I/O error leaves
//!    the rewind part done, which the error says; a second rewind finishes it.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::Error;
use crate::chunks::Chunks;
use crate::manifest::{Content, Entry, Manifest};
use crate::path;
use crate::restore::write_files;
use crate::take::{Stamp, names_of};
use crate::tree::{DirCursor, Writer, open_dir, remove_tree, settle_modes_and_times, split};

/// What the target holds at a path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Found {
    File(Stamp),
    Dir,
    Link(String),
    /// A FIFO, socket or device: removed, never kept.
    Other,
}

/// Restores `manifest` over `target` as described in the module's docs; `None` when the target
/// holds something only the full restore handles.
pub(crate) fn rewind(
    chunks: &Chunks,
    manifest: &Manifest,
    target: &Path,
    staging: &Path,
    current: &Manifest,
    writer: Writer,
) -> Result<Option<Vec<Entry>>, Error> {
    let target_fd = open_dir(target)?;
    let Some(found) = walk(&target_fd) else {
        return Ok(None);
    };
    let plan = plan(manifest, current, &found);
    let mut entries = manifest.entries.clone();

    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(staging)
        .map_err(|e| Error::io(format!("cannot create {}", staging.display()), e))?;
    let staged = stage(chunks, &entries, &plan, staging, writer);
    let applied = staged.and_then(|written| {
        for (index, ino, dev) in written {
            entries[index].ino = ino;
            entries[index].dev = dev;
        }
        let staging_fd = open_dir(staging)?;
        apply(&entries, &plan, &target_fd, &staging_fd, writer).map_err(|(what, e)| {
            Error::io(
                format!(
                    "the rewind of {} stopped part way ({what}); rewinding again finishes it",
                    target.display()
                ),
                e,
            )
        })
    });
    if let Err(error) = remove_tree(staging) {
        tracing::warn!(dir = %staging.display(), %error, "cannot remove a rewind's staging directory");
    }
    applied?;
    for (index, stamp) in &plan.kept {
        if let Some(stamp) = stamp {
            entries[*index].ino = stamp.ino;
            entries[*index].dev = stamp.dev;
        }
    }
    Ok(Some(entries))
}

/// What the target holds, sorted by path; `None` when something only the full restore handles.
fn walk(root: &OwnedFd) -> Option<Vec<(String, Found)>> {
    let mut found = Vec::new();
    let reopened = rustix::fs::openat(
        root,
        c".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let mut frames: Vec<(OwnedFd, String, Vec<CString>)> =
        vec![(reopened, String::new(), names_of(root).ok()?)];
    while let Some((dir_fd, dir, names)) = frames.last_mut() {
        let Some(name) = names.pop() else {
            frames.pop();
            continue;
        };
        let relative = path::join(dir, name.to_str().ok()?);
        path::refusal(&relative).is_none().then_some(())?;
        let stat = match rustix::fs::statat(&*dir_fd, &name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            // Gone since the listing: nothing to keep or remove.
            Err(Errno::NOENT) => continue,
            Err(_) => return None,
        };
        let kind = match FileType::from_raw_mode(stat.st_mode) {
            FileType::RegularFile => Found::File(Stamp::of(&stat)),
            FileType::Symlink => match rustix::fs::readlinkat(&*dir_fd, &name, Vec::new()) {
                Ok(link) => Found::Link(link.into_string().ok()?),
                Err(Errno::NOENT) => continue,
                Err(_) => return None,
            },
            FileType::Directory => {
                let fd = rustix::fs::openat(
                    &*dir_fd,
                    &name,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .ok()?;
                let names = names_of(&fd).ok()?;
                found.push((relative.clone(), Found::Dir));
                frames.push((fd, relative, names));
                continue;
            }
            _ => Found::Other,
        };
        found.push((relative, kind));
    }
    found.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    Some(found)
}

/// What a rewind does, by entry index of the manifest (or path, for what it removes).
#[derive(Default)]
struct Plan {
    /// Paths of the target to remove (not wanted, or of another kind), with whether each is a
    /// directory.
    removed: Vec<(String, bool)>,
    /// Directories to make.
    made: Vec<usize>,
    /// Files and links to stage and rename into place.
    staged: Vec<usize>,
    /// Files (with their stat: a file's mode and times may still change) and links that stay.
    kept: Vec<(usize, Option<Stamp>)>,
}

fn plan(manifest: &Manifest, current: &Manifest, found: &[(String, Found)]) -> Plan {
    let mut plan = Plan::default();
    let (mut wanted, mut there) = (
        manifest.entries.iter().enumerate().peekable(),
        found.iter().peekable(),
    );
    loop {
        let order = match (wanted.peek(), there.peek()) {
            (None, None) => return plan,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some((_, entry)), Some((path, _))) => entry.path.as_str().cmp(path.as_str()),
        };
        match order {
            std::cmp::Ordering::Less => {
                if let Some((index, entry)) = wanted.next() {
                    plan.create(index, entry);
                }
            }
            std::cmp::Ordering::Greater => {
                if let Some((path, kind)) = there.next() {
                    plan.removed.push((path.clone(), *kind == Found::Dir));
                }
            }
            std::cmp::Ordering::Equal => {
                let (Some((index, entry)), Some((path, kind))) = (wanted.next(), there.next())
                else {
                    return plan;
                };
                match (&entry.content, kind) {
                    (Content::Dir, Found::Dir) => {}
                    (Content::File(_), Found::File(stamp)) if vouched(current, entry, stamp) => {
                        plan.kept.push((index, Some(*stamp)));
                    }
                    (Content::Symlink(want), Found::Link(have)) if want == have => {
                        plan.kept.push((index, None));
                    }
                    // A file or link over one: renamed over it, never missing meanwhile.
                    (Content::File(_) | Content::Symlink(_), Found::File(_) | Found::Link(_)) => {
                        plan.staged.push(index);
                    }
                    _ => {
                        plan.removed.push((path.clone(), *kind == Found::Dir));
                        plan.create(index, entry);
                    }
                }
            }
        }
    }
}

impl Plan {
    fn create(&mut self, index: usize, entry: &Entry) {
        match entry.content {
            Content::Dir => self.made.push(index),
            Content::File(_) | Content::Symlink(_) => self.staged.push(index),
        }
    }
}

/// True when `current` vouches that the file with stat `stamp` holds `entry`'s chunks.
fn vouched(current: &Manifest, entry: &Entry, stamp: &Stamp) -> bool {
    current.entry(&entry.path).is_some_and(|known| {
        known.content == entry.content
            && known.size == stamp.size
            && known.mtime_ns == stamp.mtime_ns
            && known.ino == stamp.ino
            && known.dev == stamp.dev
            && current.trusts(known)
    })
}

/// Writes the staged files (verified) and links into `staging`, named by entry index.
fn stage(
    chunks: &Chunks,
    entries: &[Entry],
    plan: &Plan,
    staging: &Path,
    writer: Writer,
) -> Result<Vec<(usize, u64, u64)>, Error> {
    let (files, links): (Vec<usize>, Vec<usize>) = plan
        .staged
        .iter()
        .partition(|i| matches!(entries[**i].content, Content::File(_)));
    for index in links {
        if let Content::Symlink(link) = &entries[index].content {
            let path = staging.join(index.to_string());
            std::os::unix::fs::symlink(link, &path)
                .and_then(|()| writer.own(&path))
                .map_err(|e| Error::io(format!("cannot create {}", path.display()), e))?;
        }
    }
    write_files(chunks, entries, &files, writer, None, |index, _| {
        staging.join(index.to_string())
    })
}

/// Changes the target: removals, then creations, then modes and times. On failure, what was
/// being done and the error.
fn apply(
    entries: &[Entry],
    plan: &Plan,
    target: &OwnedFd,
    staging: &OwnedFd,
    writer: Writer,
) -> Result<(), (String, std::io::Error)> {
    let fail = |what: &str, path: &str| {
        let what = format!("{what} {path:?}");
        move |e: Errno| (what, std::io::Error::from(e))
    };
    let mut cursor = DirCursor::new(target);
    // Deepest first: a directory's children go before it.
    for (path, is_dir) in plan.removed.iter().rev() {
        let (dir, name) = split(path);
        let flags = if *is_dir {
            AtFlags::REMOVEDIR
        } else {
            AtFlags::empty()
        };
        let dir_fd = cursor
            .dir(dir)
            .map_err(|e| (format!("reaching {dir:?}"), e))?;
        rustix::fs::unlinkat(dir_fd, name, flags).map_err(fail("removing", path))?;
    }
    cursor.reset();

    let mut created: Vec<usize> = plan.made.iter().chain(&plan.staged).copied().collect();
    created.sort_unstable();
    for index in created {
        let entry = &entries[index];
        let (dir, name) = split(&entry.path);
        let dir_fd = cursor
            .dir(dir)
            .map_err(|e| (format!("reaching {dir:?}"), e))?;
        match entry.content {
            Content::Dir => rustix::fs::mkdirat(dir_fd, name, Mode::from_raw_mode(0o700))
                .map_err(fail("making", &entry.path))
                .and_then(|()| {
                    writer
                        .own_at(dir_fd, name)
                        .map_err(|e| (format!("owning {:?}", entry.path), e))
                })?,
            _ => rustix::fs::renameat(staging, index.to_string(), dir_fd, name)
                .map_err(fail("placing", &entry.path))?,
        }
    }
    cursor.reset();

    let kept = plan
        .kept
        .iter()
        .filter_map(|(index, stamp)| Some((&entries[*index], stamp.as_ref()?)));
    settle_modes_and_times(&mut cursor, entries, kept)
}
