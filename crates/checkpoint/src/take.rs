//! Taking a checkpoint: a walk of the tree and a few threads reading what changed.
//!
//! The walk ([`walk_tree`], on the calling thread; `crate::stream::produce` walks the same way)
//! lists each directory through a descriptor opened `O_NOFOLLOW` beneath its parent's, so it
//! never leaves the root, whatever the tree does while it is walked: a symlink is stored as a
//! link and never followed, and a directory swapped for a link is not entered. A regular file
//! whose size, mtime, inode and device match the previous checkpoint's entry (and whose mtime
//! was old enough then to trust, see `Manifest::trusts`) keeps that entry's chunks unread; any
//! other is opened (`O_NOFOLLOW`, beneath its directory) and handed to a worker. At most twice
//! as many files as workers are open at once.
//!
//! A worker cuts the file into chunks, hashes and stores the new ones, then compares the file's
//! stat before and after: when size, mtime or ctime moved, it reads the file once more; if it
//! moved again the entry keeps exactly what that last read saw and is listed in
//! `changed_under`, and its recorded stat (from before that read) no longer matches the file,
//! so the next checkpoint reads it again. FIFOs, sockets, devices, names that are not UTF-8
//! and what cannot be opened or read are skipped and counted. When anything fails to store,
//! the take fails and its batch is dropped: nothing it wrote becomes visible. Storing what was
//! found ([`store_checkpoint`]: the entry list's chunks, the commit, the root) is shared with a
//! take from a stream.

use std::ffi::CString;
use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::ops::ControlFlow;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, SyncSender};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::Error;
use crate::backend::ChunkBatch;
use crate::chunk::{ChunkRef, CutError, Packer};
use crate::chunks::{Chunks, Seen};
use crate::manifest::{Content, Entry, Manifest, Summary, encode_entries, encode_root};
use crate::path;

/// What a take read, wrote and found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TakeStats {
    /// Regular files in the checkpoint.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Files and links added, removed or changed (content, target or mode) since the previous
    /// checkpoint; every file and link when there was none.
    pub files_changed: u64,
    /// File bytes read: only files the quick check could not vouch for.
    pub bytes_read: u64,
    /// Bytes this take added to the store (compressed chunks, the manifest's included).
    pub bytes_new: u64,
    /// Of those, the manifest's: its root and the chunks of its entry list that were new.
    pub manifest_bytes_new: u64,
    /// Entries skipped: FIFOs, sockets, devices, names that are not UTF-8, unreadable ones.
    pub skipped: u64,
    /// Paths that changed while read, or vanished between the listing and the read.
    pub changed_under: Vec<String>,
    pub elapsed: Duration,
}

/// A stat reduced to what a checkpoint compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub(crate) size: u64,
    pub(crate) mtime_ns: i64,
    ctime_ns: i64,
    pub(crate) ino: u64,
    pub(crate) dev: u64,
    pub(crate) mode: u32,
}

impl Stamp {
    // The field types of `struct stat` differ between architectures.
    #[allow(clippy::unnecessary_cast)]
    pub(crate) fn of(stat: &rustix::fs::Stat) -> Stamp {
        Stamp {
            size: stat.st_size.max(0) as u64,
            mtime_ns: (stat.st_mtime as i64)
                .saturating_mul(1_000_000_000)
                .saturating_add(stat.st_mtime_nsec as i64),
            ctime_ns: (stat.st_ctime as i64)
                .saturating_mul(1_000_000_000)
                .saturating_add(stat.st_ctime_nsec as i64),
            ino: stat.st_ino as u64,
            dev: stat.st_dev as u64,
            mode: (stat.st_mode as u32) & 0o7777,
        }
    }

    pub(crate) fn of_file(file: &File) -> std::io::Result<Stamp> {
        let m = file.metadata()?;
        Ok(Stamp {
            size: m.size(),
            mtime_ns: m
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(m.mtime_nsec()),
            ctime_ns: m
                .ctime()
                .saturating_mul(1_000_000_000)
                .saturating_add(m.ctime_nsec()),
            ino: m.ino(),
            dev: m.dev(),
            mode: m.mode() & 0o7777,
        })
    }

    pub(crate) fn entry(&self, path: String, content: Content, size: u64) -> Entry {
        Entry {
            path,
            content,
            mode: self.mode,
            size,
            mtime_ns: self.mtime_ns,
            ino: self.ino,
            dev: self.dev,
        }
    }
}

/// Nanoseconds since the epoch, now.
pub(crate) fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A file for a worker: where its entry is, the open file and its stat when opened.
struct Job {
    index: usize,
    file: File,
    stamp: Stamp,
}

/// What a worker made of a file.
enum Outcome {
    Read {
        chunks: Vec<ChunkRef>,
        size: u64,
        /// The stat from before the read whose content is kept.
        stamp: Stamp,
        changed_under: bool,
        bytes_read: u64,
        bytes_new: u64,
    },
    /// Reading failed part way (an I/O error of the tree): skipped.
    Unreadable,
}

/// What the workers share.
struct Shared<'a> {
    chunks: &'a Chunks,
    batch: &'a dyn ChunkBatch,
    seen: &'a Seen,
    /// Set by the first worker that fails to store: the walk and the others stop.
    failed: AtomicBool,
}

/// The name a checkpoint is stored under and what its caller said of it.
pub(crate) struct Naming {
    pub(crate) id: String,
    pub(crate) created_at_ms: u64,
    pub(crate) label: serde_json::Value,
}

/// What a take found, ready to store: entries sorted by path, `changed_under` sorted, and when
/// the walk began by the clock of the machine whose tree it is.
pub(crate) struct Taken {
    pub(crate) entries: Vec<Entry>,
    pub(crate) skipped: u64,
    pub(crate) changed_under: Vec<String>,
    pub(crate) started_ns: i64,
}

/// Opens the directory a checkpoint is taken of.
pub(crate) fn open_root(root: &Path) -> Result<OwnedFd, Error> {
    rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::io(format!("cannot open {}", root.display()), e.into()))
}

/// Takes a checkpoint of the tree beneath `root`, reusing `previous`'s chunks where the quick
/// check allows, and stores it.
pub(crate) fn take(
    chunks: &Chunks,
    root: &Path,
    previous: Option<&Manifest>,
    n_threads: usize,
    naming: Naming,
) -> Result<(Manifest, TakeStats), Error> {
    let started = Instant::now();
    let started_ns = now_ns();
    let root_fd = open_root(root)?;
    let batch = chunks.backend.batch()?;
    let seen = Seen::with(previous.into_iter().flat_map(Manifest::chunk_ids));
    let shared = Shared {
        chunks,
        batch: &*batch,
        seen: &seen,
        failed: AtomicBool::new(false),
    };
    let n_threads = n_threads.max(1);
    let (jobs_tx, jobs_rx) = mpsc::sync_channel::<Job>(n_threads * 2);
    let jobs_rx = Mutex::new(jobs_rx);
    let (done_tx, done_rx) = mpsc::channel::<(usize, Result<Outcome, Error>)>();
    let walked = std::thread::scope(|scope| {
        for _ in 0..n_threads {
            let (shared, jobs_rx, done_tx) = (&shared, &jobs_rx, done_tx.clone());
            scope.spawn(move || worker(shared, jobs_rx, done_tx));
        }
        drop(done_tx);
        let walked = walk(root_fd, previous, &jobs_tx, &shared.failed);
        drop(jobs_tx);
        walked
    });
    let mut outcomes: Vec<(usize, Outcome)> = Vec::new();
    for (index, result) in done_rx.iter() {
        // A storage failure is the cause of everything after it; report it first.
        outcomes.push((index, result?));
    }
    let mut walked = walked?;
    let mut stats = TakeStats::default();
    let mut removed = vec![false; walked.entries.len()];
    for (index, outcome) in outcomes {
        match outcome {
            Outcome::Read {
                chunks,
                size,
                stamp,
                changed_under,
                bytes_read,
                bytes_new,
            } => {
                let entry = &mut walked.entries[index];
                if changed_under {
                    walked.changed_under.push(entry.path.clone());
                }
                *entry = stamp.entry(std::mem::take(&mut entry.path), Content::File(chunks), size);
                stats.bytes_read += bytes_read;
                stats.bytes_new += bytes_new;
            }
            Outcome::Unreadable => {
                removed[index] = true;
                walked.skipped += 1;
            }
        }
    }
    let mut entries: Vec<Entry> = walked
        .entries
        .into_iter()
        .zip(removed)
        .filter_map(|(entry, removed)| (!removed).then_some(entry))
        .collect();
    entries.sort_unstable_by(|a, b| a.path.cmp(&b.path));
    walked.changed_under.sort_unstable();
    let taken = Taken {
        entries,
        skipped: walked.skipped,
        changed_under: walked.changed_under,
        started_ns,
    };
    let manifest = store_checkpoint(chunks, batch, &seen, previous, naming, taken, &mut stats)?;
    stats.elapsed = started.elapsed();
    Ok((manifest, stats))
}

/// Stores `taken` as checkpoint `naming.id`: the entry list's chunks go into `batch`, which is
/// committed before the root is written, so a checkpoint that fails here leaves nothing
/// visible. Fills in `stats` but for what the caller counted (`bytes_read`, the content's
/// `bytes_new`) and `elapsed`.
pub(crate) fn store_checkpoint<'a>(
    chunks: &'a Chunks,
    batch: Box<dyn ChunkBatch + 'a>,
    seen: &Seen,
    previous: Option<&Manifest>,
    naming: Naming,
    taken: Taken,
    stats: &mut TakeStats,
) -> Result<Manifest, Error> {
    let mut packer = Packer::new()?;
    let stream = encode_entries(&taken.entries);
    let put = chunks
        .put_stream(
            &*batch,
            seen,
            &mut packer,
            &mut Vec::new(),
            &mut &stream[..],
            stream.len() as u64,
        )
        .map_err(|e| match e {
            CutError::Store(e) => e,
            CutError::Read(e) => Error::io("cannot read the manifest's entries", e),
        })?;
    stats.manifest_bytes_new += put.bytes_new;
    let stream_chunks = put.chunks;
    batch.commit()?;

    let mut manifest = Manifest {
        id: naming.id,
        created_at_ms: naming.created_at_ms,
        entries: taken.entries,
        skipped: taken.skipped,
        changed_under: taken.changed_under,
        label: naming.label,
        summary: Summary::default(),
        started_ns: taken.started_ns,
        stream: stream_chunks,
    };
    manifest.summary = Summary {
        files: manifest.n_files(),
        bytes: manifest.n_bytes(),
        files_changed: n_changed(previous, &manifest.entries),
    };
    let root_bytes = encode_root(&manifest)?;
    chunks.backend.put_manifest(&manifest.id, &root_bytes)?;
    stats.manifest_bytes_new += root_bytes.len() as u64;
    stats.bytes_new += stats.manifest_bytes_new;
    stats.files = manifest.summary.files;
    stats.bytes = manifest.summary.bytes;
    stats.files_changed = manifest.summary.files_changed;
    stats.skipped = manifest.skipped;
    stats.changed_under = manifest.changed_under.clone();
    Ok(manifest)
}

fn worker(
    shared: &Shared<'_>,
    jobs: &Mutex<Receiver<Job>>,
    done: Sender<(usize, Result<Outcome, Error>)>,
) {
    let mut packer = match Packer::new() {
        Ok(packer) => packer,
        Err(error) => {
            shared.failed.store(true, Ordering::Relaxed);
            let _ = done.send((usize::MAX, Err(error)));
            return;
        }
    };
    let mut window = Vec::new();
    loop {
        let job = jobs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .recv();
        let Ok(mut job) = job else {
            return;
        };
        if shared.failed.load(Ordering::Relaxed) {
            continue;
        }
        let result = read_file(shared, &mut packer, &mut window, &mut job.file, job.stamp);
        if result.is_err() {
            shared.failed.store(true, Ordering::Relaxed);
        }
        if done.send((job.index, result)).is_err() {
            return;
        }
    }
}

/// Chunks and stores `file`: at most two reads, the second when the first saw it change.
fn read_file(
    shared: &Shared<'_>,
    packer: &mut Packer,
    window: &mut Vec<u8>,
    file: &mut File,
    mut before: Stamp,
) -> Result<Outcome, Error> {
    let mut bytes_read = 0u64;
    let mut bytes_new = 0u64;
    let mut attempt = 0;
    loop {
        attempt += 1;
        if file.seek(SeekFrom::Start(0)).is_err() {
            return Ok(Outcome::Unreadable);
        }
        let put =
            shared
                .chunks
                .put_stream(shared.batch, shared.seen, packer, window, file, before.size);
        let (chunks, size) = match put {
            Ok(put) => {
                bytes_new += put.bytes_new;
                (put.chunks, put.size)
            }
            Err(CutError::Read(_)) => return Ok(Outcome::Unreadable),
            Err(CutError::Store(error)) => return Err(error),
        };
        bytes_read += size;
        let Ok(after) = Stamp::of_file(file) else {
            return Ok(Outcome::Unreadable);
        };
        let steady = after == before && after.size == size;
        if steady || attempt == 2 {
            return Ok(Outcome::Read {
                chunks,
                size,
                stamp: before,
                changed_under: !steady,
                bytes_read,
                bytes_new,
            });
        }
        before = after;
    }
}

/// The walk's result: entries in walk order (files to read hold no chunks yet), and what it
/// skipped or saw vanish.
struct Walked {
    entries: Vec<Entry>,
    skipped: u64,
    changed_under: Vec<String>,
}

/// A directory being walked: its descriptor, path and the names still to visit (sorted in
/// reverse, so `pop` gives them in order).
struct Frame {
    fd: OwnedFd,
    path: String,
    names: Vec<CString>,
}

/// The names in the directory `fd`, sorted in reverse, without `.` and `..`.
pub(crate) fn names_of(fd: &OwnedFd) -> std::io::Result<Vec<CString>> {
    let mut dir = rustix::fs::Dir::read_from(fd)?;
    let mut names = Vec::new();
    while let Some(entry) = dir.read() {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_bytes() != b"." && name.to_bytes() != b".." {
            names.push(name.to_owned());
        }
    }
    names.sort_unstable_by(|a, b| b.cmp(a));
    Ok(names)
}

/// True for the errors of a name that was there when listed and is gone or swapped now.
fn vanished(errno: Errno) -> bool {
    matches!(
        errno,
        Errno::NOENT | Errno::LOOP | Errno::NOTDIR | Errno::NXIO
    )
}

/// What the walk found at one name, in walk order: a directory's names (sorted bytewise)
/// right after it, before its next sibling.
pub(crate) enum Found<T> {
    Dir {
        path: String,
        stamp: Stamp,
    },
    Symlink {
        path: String,
        stamp: Stamp,
        target: String,
    },
    /// A regular file the quick check vouched for (`known` is what it answered); not opened.
    Unchanged {
        path: String,
        stamp: Stamp,
        known: T,
    },
    /// Any other regular file, opened (`O_NOFOLLOW | O_NONBLOCK`, beneath its directory);
    /// `stamp` is the open file's.
    Opened {
        path: String,
        stamp: Stamp,
        file: File,
    },
    /// A FIFO, socket or device, a name that is not UTF-8 or not a safe path, what could not
    /// be stat'ed, opened or listed, an empty or non-UTF-8 link target.
    Skipped,
    /// A name that was listed and was gone or swapped by the time it was looked at.
    Vanished(String),
}

/// Walks the tree beneath `root_fd` (see the module's docs), asking `quick_check` about each
/// regular file before opening it and handing everything found to `each`, which may stop the
/// walk. Fails only when the root cannot be listed.
pub(crate) fn walk_tree<T>(
    root_fd: OwnedFd,
    mut quick_check: impl FnMut(&str, &Stamp) -> Option<T>,
    mut each: impl FnMut(Found<T>) -> ControlFlow<()>,
) -> Result<(), Error> {
    let root_names =
        names_of(&root_fd).map_err(|e| Error::io("cannot list the checkpoint's root", e))?;
    let mut frames = vec![Frame {
        fd: root_fd,
        path: String::new(),
        names: root_names,
    }];
    while let Some(frame) = frames.last_mut() {
        let Some(name) = frame.names.pop() else {
            frames.pop();
            continue;
        };
        let Ok(name_text) = name.to_str() else {
            if each(Found::Skipped).is_break() {
                break;
            }
            continue;
        };
        let relative = path::join(&frame.path, name_text);
        let found = if path::refusal(&relative).is_some() {
            Found::Skipped
        } else {
            match rustix::fs::statat(&frame.fd, &name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => match visit(frame, &name, relative, &stat, &mut quick_check) {
                    Visited::Found(found) => found,
                    Visited::Dir { found, frame } => {
                        frames.push(frame);
                        found
                    }
                },
                Err(errno) if vanished(errno) => Found::Vanished(relative),
                Err(_) => Found::Skipped,
            }
        };
        if each(found).is_break() {
            break;
        }
    }
    Ok(())
}

/// What [`visit`] made of a name: a directory also gives the frame to walk it.
enum Visited<T> {
    Found(Found<T>),
    Dir { found: Found<T>, frame: Frame },
}

/// Looks at the name `name` of `frame`, whose lstat is `stat`.
fn visit<T>(
    frame: &Frame,
    name: &CString,
    relative: String,
    stat: &rustix::fs::Stat,
    quick_check: &mut impl FnMut(&str, &Stamp) -> Option<T>,
) -> Visited<T> {
    let stamp = Stamp::of(stat);
    let found = match FileType::from_raw_mode(stat.st_mode) {
        FileType::Directory => {
            let opened = rustix::fs::openat(
                &frame.fd,
                name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            );
            let fd = match opened {
                Ok(fd) => fd,
                Err(errno) if vanished(errno) => return Visited::Found(Found::Vanished(relative)),
                Err(_) => return Visited::Found(Found::Skipped),
            };
            let Ok(names) = names_of(&fd) else {
                return Visited::Found(Found::Skipped);
            };
            return Visited::Dir {
                found: Found::Dir {
                    path: relative.clone(),
                    stamp,
                },
                frame: Frame {
                    fd,
                    path: relative,
                    names,
                },
            };
        }
        FileType::Symlink => match rustix::fs::readlinkat(&frame.fd, name, Vec::new()) {
            Ok(target) => match target.into_string() {
                Ok(target) if !target.is_empty() => Found::Symlink {
                    path: relative,
                    stamp,
                    target,
                },
                _ => Found::Skipped,
            },
            Err(errno) if vanished(errno) || errno == Errno::INVAL => Found::Vanished(relative),
            Err(_) => Found::Skipped,
        },
        FileType::RegularFile => {
            if let Some(known) = quick_check(&relative, &stamp) {
                return Visited::Found(Found::Unchanged {
                    path: relative,
                    stamp,
                    known,
                });
            }
            // O_NONBLOCK: a file swapped for a FIFO since the stat does not hang the open.
            let opened = rustix::fs::openat(
                &frame.fd,
                name,
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                Mode::empty(),
            );
            let file = match opened {
                Ok(fd) => File::from(fd),
                Err(errno) if vanished(errno) => return Visited::Found(Found::Vanished(relative)),
                Err(_) => return Visited::Found(Found::Skipped),
            };
            match (Stamp::of_file(&file), file.metadata()) {
                (Ok(stamp), Ok(metadata)) if metadata.is_file() => Found::Opened {
                    path: relative,
                    stamp,
                    file,
                },
                _ => Found::Vanished(relative),
            }
        }
        _ => Found::Skipped,
    };
    Visited::Found(found)
}

/// The walk of a take: entries in walk order (the files handed to workers hold no chunks
/// yet), stopped when a worker failed.
fn walk(
    root_fd: OwnedFd,
    previous: Option<&Manifest>,
    jobs: &SyncSender<Job>,
    failed: &AtomicBool,
) -> Result<Walked, Error> {
    let mut walked = Walked {
        entries: Vec::new(),
        skipped: 0,
        changed_under: Vec::new(),
    };
    let quick_check = |path: &str, stamp: &Stamp| {
        unchanged(previous, path, stamp).map(|entry| entry.content.clone())
    };
    walk_tree(root_fd, quick_check, |found| {
        if failed.load(Ordering::Relaxed) {
            return ControlFlow::Break(());
        }
        match found {
            Found::Dir { path, stamp } => {
                walked.entries.push(stamp.entry(path, Content::Dir, 0));
            }
            Found::Symlink {
                path,
                stamp,
                target,
            } => {
                let size = target.len() as u64;
                walked
                    .entries
                    .push(stamp.entry(path, Content::Symlink(target), size));
            }
            Found::Unchanged { path, stamp, known } => {
                walked.entries.push(stamp.entry(path, known, stamp.size));
            }
            Found::Opened { path, stamp, file } => {
                let index = walked.entries.len();
                walked
                    .entries
                    .push(stamp.entry(path, Content::File(Vec::new()), 0));
                if jobs.send(Job { index, file, stamp }).is_err() {
                    // Every worker is gone: one failed, and its error is reported.
                    return ControlFlow::Break(());
                }
            }
            Found::Skipped => walked.skipped += 1,
            Found::Vanished(path) => walked.changed_under.push(path),
        }
        ControlFlow::Continue(())
    })?;
    Ok(walked)
}

/// The previous entry of `path` when the quick check vouches that the file did not change.
fn unchanged<'a>(previous: Option<&'a Manifest>, path: &str, stamp: &Stamp) -> Option<&'a Entry> {
    let previous = previous?;
    let entry = previous.entry(path)?;
    let same = matches!(entry.content, Content::File(_))
        && entry.size == stamp.size
        && entry.mtime_ns == stamp.mtime_ns
        && entry.ino == stamp.ino
        && entry.dev == stamp.dev
        && previous.trusts(entry);
    same.then_some(entry)
}

/// Files and links added, removed or changed from `previous` to `entries` (both sorted).
pub(crate) fn n_changed(previous: Option<&Manifest>, entries: &[Entry]) -> u64 {
    let counted = |e: &Entry| !matches!(e.content, Content::Dir);
    let Some(previous) = previous else {
        return entries.iter().filter(|e| counted(e)).count() as u64;
    };
    let (mut old, mut new) = (
        previous.entries.iter().peekable(),
        entries.iter().peekable(),
    );
    let mut n = 0u64;
    loop {
        match (old.peek(), new.peek()) {
            (None, None) => return n,
            (Some(a), None) => {
                n += u64::from(counted(a));
                old.next();
            }
            (None, Some(b)) => {
                n += u64::from(counted(b));
                new.next();
            }
            (Some(a), Some(b)) => match a.path.cmp(&b.path) {
                std::cmp::Ordering::Less => {
                    n += u64::from(counted(a));
                    old.next();
                }
                std::cmp::Ordering::Greater => {
                    n += u64::from(counted(b));
                    new.next();
                }
                std::cmp::Ordering::Equal => {
                    let differ = a.content != b.content || a.mode != b.mode;
                    n += u64::from((counted(a) || counted(b)) && differ);
                    old.next();
                    new.next();
                }
            },
        }
    }
}
