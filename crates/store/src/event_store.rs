//! One session's stored events, chosen once when its log is opened: the lines of an
//! `events.jsonl` file (one JSON event per line) or the session's rows of the `events` table.
//! [`EventStore`] opens (and repairs) them, appends a batch, syncs, reads back after a seq, and
//! starts again after a failed write, the same way on both; the gateway's event log keeps the
//! seqs, the in-memory tail and the subscribers.
//!
//! Architecture Invariant: a file keeps a +1 chain of seqs. On open a torn last line is cut off
//! in place (which needs no free space), and unparsable lines or any line whose seq breaks the
//! chain are dropped by rewriting the file atomically; after a failed write the file is cut back
//! to its last whole line before anything else is written.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::events::EventRow;
use crate::file;
use crate::leases::Lease;
use crate::pg::{Store, StoreError};

/// How many rows one page read from PostgreSQL holds at most.
const PG_PAGE_MAX: usize = 512;

/// One stored event: its seq, its type (the SSE `event:` name) and its JSON line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    pub seq: u64,
    pub kind: &'static str,
    pub json: Arc<str>,
}

/// What opening a file had to repair.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Repair {
    /// A last line without its newline (or unparsable) was cut off.
    pub torn_tail: bool,
    /// Complete lines dropped because they did not parse or broke the seq chain.
    pub n_dropped_lines: usize,
}

/// Why [`EventStore::append`] wrote nothing.
#[derive(Debug)]
pub enum AppendFailure {
    /// Another replica owns the session now (its lease is no longer this one's).
    Superseded(String),
    /// The write failed (a full disk, a database that is away).
    Failed(io::Error),
}

/// Where one session's events are.
pub enum EventStore {
    File(Arc<EventFile>),
    Postgres(EventTable),
}

/// An `events.jsonl` file and where each of its lines starts.
pub struct EventFile {
    path: PathBuf,
    file: File,
    lines: Mutex<Lines>,
}

struct Lines {
    /// The seq of the first line.
    first_seq: u64,
    /// Byte offset of line `i` (seq `first_seq + i`).
    offsets: Vec<u64>,
    /// The length of the whole lines written.
    len: u64,
}

/// The session's rows of the `events` table.
pub struct EventTable {
    store: Store,
    session_id: String,
    /// The session's lease as this replica took it: every append is fenced by it (`None`
    /// without replicas, or before a lease was taken).
    fence: Mutex<Option<Lease>>,
}

impl EventStore {
    /// Opens (creating if needed) the file at `path` and repairs it. `parse` reads a line (its
    /// seq and what the caller makes of it); `keep` gets every kept line in order. Blocking.
    pub fn open_file<T>(
        path: &Path,
        mut parse: impl FnMut(&str) -> Option<(u64, T)>,
        mut keep: impl FnMut(T),
    ) -> io::Result<(EventStore, Repair)> {
        let mut bytes = Vec::new();
        match File::open(path) {
            Ok(mut file) => {
                file.read_to_end(&mut bytes)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let mut repair = Repair::default();
        let mut kept = Vec::with_capacity(bytes.len());
        let mut offsets = Vec::new();
        let mut first_seq = None;
        let mut next_seq = 1u64;
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let Some(newline) = rest.iter().position(|&b| b == b'\n') else {
                repair.torn_tail = true;
                break;
            };
            let line = &rest[..newline];
            rest = &rest[newline + 1..];
            let Some((seq, parsed)) = std::str::from_utf8(line).ok().and_then(&mut parse) else {
                if rest.is_empty() {
                    repair.torn_tail = true;
                } else {
                    repair.n_dropped_lines += 1;
                }
                continue;
            };
            let in_chain = match first_seq {
                None => seq >= 1,
                Some(_) => seq == next_seq,
            };
            if !in_chain {
                repair.n_dropped_lines += 1;
                continue;
            }
            first_seq.get_or_insert(seq);
            next_seq = seq + 1;
            offsets.push(kept.len() as u64);
            kept.extend_from_slice(line);
            kept.push(b'\n');
            keep(parsed);
        }
        if repair.n_dropped_lines > 0 {
            tracing::warn!(path = %path.display(), ?repair, "event log repaired");
            file::write_atomic(path, &kept)?;
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        if repair.torn_tail && repair.n_dropped_lines == 0 {
            // Only the end is bad, so what is kept is a prefix of the file: cutting it off in
            // place works even on a full disk, where a rewrite could not.
            tracing::warn!(path = %path.display(), ?repair, "event log repaired");
            file.set_len(kept.len() as u64)?;
            file.sync_data()?;
        }
        let lines = Lines {
            first_seq: first_seq.unwrap_or(next_seq),
            offsets,
            len: kept.len() as u64,
        };
        let store = EventFile {
            path: path.to_path_buf(),
            file,
            lines: Mutex::new(lines),
        };
        Ok((EventStore::File(Arc::new(store)), repair))
    }

    /// Opens the rows of `session_id`, passing each to `parse` and `keep` as
    /// [`EventStore::open_file`] does. A row that does not parse or breaks the +1 chain (none
    /// should: the key and the append's check forbid it) ends what is read, with a warning.
    pub async fn open_postgres<T>(
        store: Store,
        session_id: &str,
        mut parse: impl FnMut(&str) -> Option<(u64, T)>,
        mut keep: impl FnMut(T),
    ) -> Result<EventStore, StoreError> {
        let mut first_seq = None;
        let mut next_seq = 1u64;
        'pages: loop {
            let rows = store
                .read_events_after(session_id, next_seq - 1, PG_PAGE_MAX)
                .await?;
            if rows.is_empty() {
                break;
            }
            for row in rows {
                let Some((seq, parsed)) = parse(&row.json) else {
                    tracing::warn!(
                        session = session_id,
                        seq = row.seq,
                        "unparsable stored event; the log ends before it"
                    );
                    break 'pages;
                };
                if first_seq.is_some() && seq != next_seq {
                    tracing::warn!(
                        session = session_id,
                        seq,
                        "stored events break the seq chain; the log ends before it"
                    );
                    break 'pages;
                }
                first_seq.get_or_insert(seq);
                next_seq = seq + 1;
                keep(parsed);
            }
        }
        Ok(EventStore::Postgres(EventTable {
            store,
            session_id: session_id.to_owned(),
            fence: Mutex::new(None),
        }))
    }

    /// A name for logs: the file's path, or `postgres:<session>`.
    pub fn name(&self) -> String {
        match self {
            EventStore::File(file) => file.path.display().to_string(),
            EventStore::Postgres(table) => format!("postgres:{}", table.session_id),
        }
    }

    /// Appends `batch` (consecutive seqs following the last stored one): at the file's end in
    /// one `write(2)`, or in one transaction fenced by the session's lease. On failure nothing
    /// of the batch counts as stored (a file is cut back to its last whole line).
    pub async fn append(&self, batch: &[Arc<StoredEvent>]) -> Result<(), AppendFailure> {
        match self {
            EventStore::File(file) => {
                let file = file.clone();
                let mut bytes = Vec::new();
                let mut line_lens = Vec::with_capacity(batch.len());
                for event in batch {
                    bytes.extend_from_slice(event.json.as_bytes());
                    bytes.push(b'\n');
                    line_lens.push(event.json.len() as u64 + 1);
                }
                tokio::task::spawn_blocking(move || file.append(&bytes, &line_lens))
                    .await
                    .map_err(|e| AppendFailure::Failed(io::Error::other(e)))?
                    .map_err(AppendFailure::Failed)
            }
            EventStore::Postgres(table) => {
                let rows: Vec<EventRow> = batch
                    .iter()
                    .map(|event| EventRow {
                        seq: event.seq,
                        kind: event.kind.to_owned(),
                        json: event.json.to_string(),
                    })
                    .collect();
                let fence = lock(&table.fence).clone();
                match table
                    .store
                    .append_events_fenced(&table.session_id, &rows, fence.as_ref())
                    .await
                {
                    Ok(()) => Ok(()),
                    Err(StoreError::Conflict(why)) => Err(AppendFailure::Superseded(why)),
                    Err(e) => Err(AppendFailure::Failed(io::Error::other(e))),
                }
            }
        }
    }

    /// Waits until everything appended survives a power loss: the file fdatasynced (a committed
    /// transaction already does).
    pub async fn sync(&self) -> io::Result<()> {
        match self {
            EventStore::File(file) => {
                let file = file.clone();
                tokio::task::spawn_blocking(move || file.file.sync_data())
                    .await
                    .map_err(io::Error::other)?
            }
            EventStore::Postgres(_) => Ok(()),
        }
    }

    /// The JSON lines of up to `limit` stored events after `after`, oldest first; only what
    /// this store holds (a file never has more than its log wrote; a table may have rows
    /// another replica committed).
    pub async fn read_after(&self, after: u64, limit: usize) -> io::Result<Vec<String>> {
        match self {
            EventStore::File(file) => {
                let Some((start, end)) = file.range_after(after, limit) else {
                    return Ok(Vec::new());
                };
                let path = file.path.clone();
                tokio::task::spawn_blocking(move || read_range(&path, start, end))
                    .await
                    .map_err(io::Error::other)?
            }
            EventStore::Postgres(table) => Ok(table
                .store
                .read_events_after(&table.session_id, after, limit)
                .await
                .map_err(io::Error::other)?
                .into_iter()
                .map(|row| row.json)
                .collect()),
        }
    }

    /// After a failed append, before the held events are appended again: a file is cut back to
    /// its last whole line (the failed write may have left part of one); a refused
    /// transaction wrote nothing.
    pub async fn resume(&self) -> io::Result<()> {
        match self {
            EventStore::File(file) => {
                let file = file.clone();
                tokio::task::spawn_blocking(move || {
                    let len = file.lock().len;
                    file.file.set_len(len)
                })
                .await
                .map_err(io::Error::other)?
            }
            EventStore::Postgres(_) => Ok(()),
        }
    }

    /// Fences every later append by `lease`, the session's lease this replica just took (see
    /// `Store::append_events_fenced`). A file has no other writer to fence.
    pub fn set_fence(&self, lease: Lease) {
        if let EventStore::Postgres(table) = self {
            *lock(&table.fence) = Some(lease);
        }
    }
}

impl EventFile {
    fn lock(&self) -> MutexGuard<'_, Lines> {
        lock(&self.lines)
    }

    /// Writes `bytes` (whole lines of `line_lens` bytes each) at the end; a failed write is cut
    /// back off.
    fn append(&self, bytes: &[u8], line_lens: &[u64]) -> io::Result<()> {
        // One writer at a time (the log's writer job), so `len` is the file's end.
        let len = self.lock().len;
        // The file is opened for appending: this lands after the last whole line.
        if let Err(e) = (&self.file).write_all(bytes) {
            let _ = self.file.set_len(len);
            return Err(e);
        }
        let mut lines = self.lock();
        for line_len in line_lens {
            let offset = lines.len;
            lines.offsets.push(offset);
            lines.len += line_len;
        }
        Ok(())
    }

    /// The byte range of up to `limit` lines after seq `after`; `None` when there are none.
    fn range_after(&self, after: u64, limit: usize) -> Option<(u64, u64)> {
        let lines = self.lock();
        let end_seq = lines.first_seq + lines.offsets.len() as u64;
        let from_seq = (after + 1).max(lines.first_seq);
        let to_seq = from_seq.saturating_add(limit as u64).min(end_seq);
        if from_seq >= to_seq {
            return None;
        }
        let index = |seq: u64| (seq - lines.first_seq) as usize;
        let start = lines.offsets[index(from_seq)];
        let end = match lines.offsets.get(index(to_seq)) {
            Some(&offset) => offset,
            None => lines.len,
        };
        Some((start, end))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section is a few assignments; a poisoned lock still holds a valid value.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn read_range(path: &Path, start: u64, end: u64) -> io::Result<Vec<String>> {
    let mut file = File::open(path)?;
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = vec![0u8; (end - start) as usize];
    file.read_exact(&mut bytes)?;
    let text =
        String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok(text.lines().map(str::to_owned).collect())
}
