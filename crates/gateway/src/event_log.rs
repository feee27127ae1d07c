//! A session's durable event stream: `append`, `read_after(seq)` and `subscribe`, backed by one
//! `events.jsonl` file (one JSON [`Event`] per line).
//!
//! Invariants: seq strictly increases by 1 and never repeats; an event is written to the file
//! before any subscriber sees it; the writer never waits for a reader: each subscriber has a
//! queue of [`SUBSCRIBER_QUEUE_MAX`] events and is dropped (its stream ends, the client resumes
//! from its last id) when that queue is full.
//!
//! No file I/O happens on the caller's thread, which is usually an async worker: `append` gives
//! the event its seq and queues it, and one writer job per log (on the blocking pool, started
//! when something is queued, gone when nothing is) writes the queue in seq order, a batch per
//! `write(2)`, then publishes what it wrote. [`EventLog::sync`] waits until everything appended
//! before it is written and fdatasynced (turn end, shutdown); every written event already
//! survives a crash of the gateway process.
//!
//! A write that fails (a full disk) fails the log: the unwritten events stay queued, in order and
//! unpublished, later appends are refused with [`AppendError::Failing`], and the failure is
//! reported to the gateway's [`StorageHealth`]. [`EventLog::resume`] (once space is back) writes
//! the held events first, so the file never has a hole and no seq is reused.
//!
//! On open the file is repaired: a torn last line is cut off in place (which needs no free
//! space), and unparsable lines or any line whose seq breaks the +1 chain are dropped by
//! rewriting the file atomically.
//!
//! The same log can keep its events in PostgreSQL instead ([`EventLog::open_postgres`], the
//! `--store postgres://…` of a replicated gateway): the writer job then appends each batch in one
//! transaction (rows keyed by `(session_id, seq)`, with the `NOTIFY` other replicas listen to) and
//! publishes it only once committed; a write the database refuses fails the log exactly as a full
//! disk does. A replica that does not own the session keeps the same log as a follower:
//! [`EventLog::follow`] reads what the owner committed and publishes it to this replica's
//! subscribers, so an SSE client may stream from any replica.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{mpsc, oneshot};
use warren_protocol::gateway::{Event, EventBody};

use warren_store::file;
use warren_store::health::StorageHealth;

/// A subscriber whose queue holds this many undelivered events is disconnected.
pub const SUBSCRIBER_QUEUE_MAX: usize = 512;
/// How many recent events are kept in memory; older ones are read back from the file.
const TAIL_CACHE_MAX: usize = 4096;
/// The most bytes the writer puts in one `write(2)`.
const WRITE_BATCH_MAX_BYTES: usize = 1 << 20;

/// Counts every subscriber dropped for being too slow, across all logs (for `/metrics`).
pub static SLOW_SUBSCRIBERS_DROPPED: AtomicU64 = AtomicU64::new(0);
/// Counts every event written, across all logs (for `/metrics`).
pub static EVENTS_APPENDED: AtomicU64 = AtomicU64::new(0);

/// One stored event: its seq, its type (the SSE `event:` name) and its JSON line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    pub seq: u64,
    pub kind: &'static str,
    pub json: Arc<str>,
}

impl StoredEvent {
    fn from_line(line: &str) -> Option<(Event, StoredEvent)> {
        let event: Event = serde_json::from_str(line).ok()?;
        let stored = StoredEvent {
            seq: event.seq,
            kind: event.body.kind(),
            json: Arc::from(line),
        };
        Some((event, stored))
    }
}

/// Why an append (or a sync) was refused.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AppendError {
    /// The log was closed (session deleted or gateway shutting down).
    #[error("the event log is closed")]
    Closed,
    /// A write failed; nothing more is taken until [`EventLog::resume`] succeeds.
    #[error("the event log cannot be written: {0}")]
    Failing(Arc<io::Error>),
}

/// What [`EventLog::open`] had to repair.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Repair {
    /// A last line without its newline (or unparsable) was cut off.
    pub torn_tail: bool,
    /// Complete lines dropped because they did not parse or broke the seq chain.
    pub n_dropped_lines: usize,
}

/// Why [`EventLog::subscribe`] could not hand out a live subscription.
#[derive(Debug, PartialEq, Eq)]
pub enum SubscribeError {
    /// The requested position is older than the in-memory tail: page with `read_after` first.
    Behind,
    /// The log was closed (session deleted or gateway shutting down).
    Closed,
}

/// A live subscription: the events after the requested seq that were already stored, then every
/// new event through `live`. When `dropped` is set the subscriber fell too far behind and must
/// stop (and resume from its last seq).
pub struct Subscription {
    pub backlog: Vec<Arc<StoredEvent>>,
    pub live: mpsc::Receiver<Arc<StoredEvent>>,
    pub dropped: Arc<AtomicBool>,
}

struct Subscriber {
    tx: mpsc::Sender<Arc<StoredEvent>>,
    dropped: Arc<AtomicBool>,
}

/// A caller of [`EventLog::sync`]: answered once every event up to `seq` is written and synced.
struct SyncWaiter {
    seq: u64,
    done: oneshot::Sender<Result<(), AppendError>>,
}

/// Where a file log's events are: its descriptor and the offset of each line.
struct FileState {
    file: Arc<File>,
    /// Byte offset in the file of stored event `first_seq + i`.
    offsets: Vec<u64>,
    file_len: u64,
}

/// A log kept in PostgreSQL: the store and the session the rows belong to.
struct PgBackend {
    store: warren_store::pg::Store,
    session_id: String,
    /// The session's lease as this replica took it: every append is fenced by it (`None`
    /// without replicas, or before a lease was taken).
    fence: Mutex<Option<warren_store::leases::Lease>>,
}

/// How many events go into one PostgreSQL transaction at most.
const PG_BATCH_MAX: usize = 512;

struct Inner {
    /// `None` for a log kept in PostgreSQL.
    file: Option<FileState>,
    /// Set by `close`: appends and subscriptions are refused, the queue is still written.
    closed: bool,
    first_seq: u64,
    /// The seq the next append gets; every seq below it is stored or queued.
    next_seq: u64,
    /// The seq after the newest stored event.
    stored_end: u64,
    /// The newest stored events.
    tail: VecDeque<Arc<StoredEvent>>,
    subscribers: Vec<Subscriber>,
    /// Appended, not yet written, oldest first; after a failed write, held until `resume`.
    queue: VecDeque<Arc<StoredEvent>>,
    /// A writer job runs. At most one does, so the file gets the events in seq order.
    writing: bool,
    sync_waiters: Vec<SyncWaiter>,
    /// The write error that failed the log, until `resume` clears it.
    failure: Option<Arc<io::Error>>,
}

impl Inner {
    /// A log just opened: events `first_seq..next_seq` stored (the newest in `tail`), nothing
    /// queued, nobody subscribed.
    fn opened(
        file: Option<FileState>,
        first_seq: u64,
        next_seq: u64,
        tail: VecDeque<Arc<StoredEvent>>,
    ) -> Inner {
        Inner {
            file,
            closed: false,
            first_seq,
            next_seq,
            stored_end: next_seq,
            tail,
            subscribers: Vec::new(),
            queue: VecDeque::new(),
            writing: false,
            sync_waiters: Vec::new(),
            failure: None,
        }
    }

    /// The seq after the newest stored event.
    fn stored_end(&self) -> u64 {
        self.stored_end
    }

    fn file(&self) -> &FileState {
        self.file
            .as_ref()
            .expect("only a file log reaches its file state")
    }
}

/// What the writer job needs, shared between the log and the job.
struct Shared {
    /// The file (or, for PostgreSQL, a name for the logs: `postgres:<session>`).
    path: PathBuf,
    pg: Option<PgBackend>,
    inner: Mutex<Inner>,
    runtime: tokio::runtime::Handle,
    health: Arc<StorageHealth>,
}

pub struct EventLog {
    shared: Arc<Shared>,
}

impl EventLog {
    /// Opens (creating if needed) the log at `path`, repairs it, and calls `visit` with every
    /// kept event in order so the caller can rebuild its own state. Write failures are reported
    /// to `health`. Call inside a tokio runtime (the writer runs on its blocking pool).
    pub fn open(
        path: &Path,
        health: Arc<StorageHealth>,
        mut visit: impl FnMut(&Event),
    ) -> io::Result<(EventLog, Repair)> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| io::Error::other(format!("the event log needs a tokio runtime: {e}")))?;
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
        let mut tail = VecDeque::new();
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
            let parsed = std::str::from_utf8(line)
                .ok()
                .and_then(StoredEvent::from_line);
            let Some((event, stored)) = parsed else {
                if rest.is_empty() {
                    repair.torn_tail = true;
                } else {
                    repair.n_dropped_lines += 1;
                }
                continue;
            };
            let in_chain = match first_seq {
                None => event.seq >= 1,
                Some(_) => event.seq == next_seq,
            };
            if !in_chain {
                repair.n_dropped_lines += 1;
                continue;
            }
            first_seq.get_or_insert(event.seq);
            next_seq = event.seq + 1;
            offsets.push(kept.len() as u64);
            kept.extend_from_slice(line);
            kept.push(b'\n');
            visit(&event);
            tail.push_back(Arc::new(stored));
            if tail.len() > TAIL_CACHE_MAX {
                tail.pop_front();
            }
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
        let log = EventLog {
            shared: Arc::new(Shared {
                path: path.to_path_buf(),
                pg: None,
                inner: Mutex::new(Inner::opened(
                    Some(FileState {
                        file: Arc::new(file),
                        offsets,
                        file_len: kept.len() as u64,
                    }),
                    first_seq.unwrap_or(next_seq),
                    next_seq,
                    tail,
                )),
                runtime,
                health,
            }),
        };
        Ok((log, repair))
    }

    /// Opens the log of `session_id` kept in PostgreSQL and calls `visit` with every stored
    /// event in order (as [`EventLog::open`] does for a file). Rows that break the +1 chain (none
    /// should: the key and the append's check forbid it) end what is read, with a warning.
    pub async fn open_postgres(
        store: warren_store::pg::Store,
        session_id: &str,
        health: Arc<StorageHealth>,
        mut visit: impl FnMut(&Event),
    ) -> io::Result<EventLog> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| io::Error::other(format!("the event log needs a tokio runtime: {e}")))?;
        let pg = PgBackend {
            store,
            session_id: session_id.to_owned(),
            fence: Mutex::new(None),
        };
        let mut tail = VecDeque::new();
        let mut first_seq = None;
        let mut next_seq = 1u64;
        'pages: loop {
            let rows = pg
                .store
                .read_events_after(session_id, next_seq - 1, PG_BATCH_MAX)
                .await
                .map_err(io::Error::other)?;
            if rows.is_empty() {
                break;
            }
            for row in rows {
                let Some((event, stored)) = StoredEvent::from_line(&row.json) else {
                    tracing::warn!(
                        session = session_id,
                        seq = row.seq,
                        "unparsable stored event; the log ends before it"
                    );
                    break 'pages;
                };
                if first_seq.is_some() && event.seq != next_seq {
                    tracing::warn!(
                        session = session_id,
                        seq = event.seq,
                        "stored events break the seq chain; the log ends before it"
                    );
                    break 'pages;
                }
                first_seq.get_or_insert(event.seq);
                next_seq = event.seq + 1;
                visit(&event);
                tail.push_back(Arc::new(stored));
                if tail.len() > TAIL_CACHE_MAX {
                    tail.pop_front();
                }
            }
        }
        Ok(EventLog {
            shared: Arc::new(Shared {
                path: PathBuf::from(format!("postgres:{session_id}")),
                pg: Some(pg),
                inner: Mutex::new(Inner::opened(
                    None,
                    first_seq.unwrap_or(next_seq),
                    next_seq,
                    tail,
                )),
                runtime,
                health,
            }),
        })
    }

    /// For a replica that does not own the session: reads what the owner committed after this
    /// log's newest event and publishes it to this replica's subscribers, in order. Does nothing
    /// for a file log or while this log has events of its own on the way (it is the owner).
    /// Returns the events it published.
    pub async fn follow(&self) -> io::Result<Vec<Arc<StoredEvent>>> {
        let mut published = Vec::new();
        loop {
            let page = self.read_followed().await?;
            if page.is_empty() {
                return Ok(published);
            }
            published.extend(self.publish_followed(page));
        }
    }

    /// [`EventLog::follow`]'s read: the next page of what the owner committed after this log's
    /// newest event, not published yet; empty when there is nothing (or this log is a file's,
    /// closed, or has events of its own on the way).
    pub async fn read_followed(&self) -> io::Result<Vec<Arc<StoredEvent>>> {
        let Some(pg) = &self.shared.pg else {
            return Ok(Vec::new());
        };
        let after = {
            let inner = self.lock();
            if inner.closed || !inner.queue.is_empty() {
                return Ok(Vec::new());
            }
            inner.stored_end - 1
        };
        read_postgres(pg, after, PG_BATCH_MAX).await
    }

    /// [`EventLog::follow`]'s publish: the events of `page` that come next, handed to this
    /// replica's subscribers in order; returns those (another follow, or a takeover's append,
    /// may have published some meanwhile).
    pub fn publish_followed(&self, page: Vec<Arc<StoredEvent>>) -> Vec<Arc<StoredEvent>> {
        let mut inner = self.lock();
        let mut published = Vec::new();
        for event in page {
            if event.seq != inner.stored_end || !inner.queue.is_empty() {
                continue;
            }
            inner.next_seq = inner.next_seq.max(event.seq + 1);
            publish(&mut inner, event.clone());
            published.push(event);
        }
        published
    }

    /// Fences every later append of a PostgreSQL log by `lease`, the session's lease this
    /// replica just took (see `Store::append_events_fenced`). Nothing for a file log.
    pub fn set_fence(&self, lease: warren_store::leases::Lease) {
        if let Some(pg) = &self.shared.pg {
            *pg.fence
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(lease);
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.shared.lock()
    }

    /// Gives the event the next seq and queues it for the writer, which stores it and then
    /// publishes it to every subscriber. Returns the event as it will be stored. Never waits,
    /// neither for the disk nor for a subscriber.
    pub fn append(
        &self,
        turn: Option<u64>,
        body: EventBody,
    ) -> Result<Arc<StoredEvent>, AppendError> {
        let mut inner = self.lock();
        if inner.closed {
            return Err(AppendError::Closed);
        }
        if let Some(failure) = &inner.failure {
            return Err(AppendError::Failing(failure.clone()));
        }
        let seq = inner.next_seq;
        let kind = body.kind();
        let event = Event {
            seq,
            ts: file::now_rfc3339(),
            turn,
            body,
        };
        let json =
            serde_json::to_string(&event).expect("an event (strings and JSON values) serializes");
        let stored = Arc::new(StoredEvent {
            seq,
            kind,
            json: Arc::from(json),
        });
        inner.next_seq += 1;
        inner.queue.push_back(stored.clone());
        self.shared.start_writer(&mut inner);
        Ok(stored)
    }

    /// Up to `limit` stored events (in the file, not still queued) with a seq greater than
    /// `after`, oldest first.
    pub async fn read_after(&self, after: u64, limit: usize) -> io::Result<Vec<Arc<StoredEvent>>> {
        /// Where the asked events are, decided under the lock and read after it.
        enum Source<'a> {
            Tail(Vec<Arc<StoredEvent>>),
            Postgres {
                pg: &'a PgBackend,
                after: u64,
                limit: usize,
            },
            File {
                start: u64,
                end: u64,
            },
        }
        let source = {
            let inner = self.lock();
            let stored_end = inner.stored_end();
            let tail_first = inner.tail.front().map_or(stored_end, |e| e.seq);
            let from_seq = (after + 1).max(inner.first_seq);
            if after.saturating_add(1) >= tail_first {
                Source::Tail(
                    inner
                        .tail
                        .iter()
                        .filter(|e| e.seq > after)
                        .take(limit)
                        .cloned()
                        .collect(),
                )
            } else if let Some(pg) = &self.shared.pg {
                Source::Postgres {
                    pg,
                    after: from_seq - 1,
                    limit: limit.min((stored_end - from_seq) as usize),
                }
            } else {
                let to_seq = from_seq.saturating_add(limit as u64).min(stored_end);
                let index = |seq: u64| (seq - inner.first_seq) as usize;
                let file = inner.file();
                let start = file.offsets[index(from_seq)];
                let end = if to_seq >= stored_end {
                    file.file_len
                } else {
                    file.offsets[index(to_seq)]
                };
                Source::File { start, end }
            }
        };
        match source {
            Source::Tail(events) => Ok(events),
            Source::Postgres { pg, after, limit } => read_postgres(pg, after, limit).await,
            Source::File { start, end } => {
                let path = self.shared.path.clone();
                tokio::task::spawn_blocking(move || read_range(&path, start, end))
                    .await
                    .map_err(io::Error::other)?
            }
        }
    }

    /// Registers a live subscriber positioned after `after` (see [`Subscription`]).
    pub fn subscribe(&self, after: u64) -> Result<Subscription, SubscribeError> {
        let mut inner = self.lock();
        if inner.closed {
            return Err(SubscribeError::Closed);
        }
        let tail_first = inner.tail.front().map_or(inner.stored_end(), |e| e.seq);
        if after.saturating_add(1) < tail_first {
            return Err(SubscribeError::Behind);
        }
        let backlog = inner
            .tail
            .iter()
            .filter(|e| e.seq > after)
            .cloned()
            .collect();
        let (tx, live) = mpsc::channel(SUBSCRIBER_QUEUE_MAX);
        let dropped = Arc::new(AtomicBool::new(false));
        inner.subscribers.push(Subscriber {
            tx,
            dropped: dropped.clone(),
        });
        Ok(Subscription {
            backlog,
            live,
            dropped,
        })
    }

    /// The seq of the oldest stored event (events before it were compacted away), or the next
    /// seq when the log is empty.
    pub fn first_seq(&self) -> u64 {
        self.lock().first_seq
    }

    /// The seq of the newest event (stored or on its way to the file), 0 when empty.
    pub fn last_seq(&self) -> u64 {
        self.lock().next_seq - 1
    }

    pub fn n_subscribers(&self) -> usize {
        let mut inner = self.lock();
        inner.subscribers.retain(|s| !s.tx.is_closed());
        inner.subscribers.len()
    }

    /// Whether a failed write stopped the log (see [`EventLog::resume`]).
    pub fn is_failing(&self) -> bool {
        self.lock().failure.is_some()
    }

    /// Waits until every event appended before the call is written and fdatasynced.
    pub async fn sync(&self) -> Result<(), AppendError> {
        let done = {
            let mut inner = self.lock();
            if let Some(failure) = &inner.failure {
                return Err(AppendError::Failing(failure.clone()));
            }
            let (done, answer) = oneshot::channel();
            let seq = inner.next_seq - 1;
            inner.sync_waiters.push(SyncWaiter { seq, done });
            self.shared.start_writer(&mut inner);
            answer
        };
        done.await.unwrap_or(Err(AppendError::Closed))
    }

    /// After a failed write: cuts off whatever part of the failed batch reached the file, writes
    /// the held events and syncs. On success the log takes appends again; on failure it stays
    /// failed (and the failure is reported again).
    pub async fn resume(&self) -> Result<(), AppendError> {
        if self.shared.pg.is_some() {
            // A refused transaction wrote nothing: the held events are simply sent again.
            if self.lock().failure.take().is_none() {
                return Ok(());
            }
            tracing::info!(log = %self.shared.path.display(), "event log writes again");
            return self.sync().await;
        }
        let (file, file_len) = {
            let inner = self.lock();
            if inner.failure.is_none() {
                return Ok(());
            }
            let file = inner.file();
            (file.file.clone(), file.file_len)
        };
        // The failed write may have left part of a line: cut back to the last stored byte.
        let truncated = tokio::task::spawn_blocking(move || file.set_len(file_len))
            .await
            .map_err(|e| AppendError::Failing(Arc::new(io::Error::other(e))))?;
        if let Err(e) = truncated {
            let error = Arc::new(e);
            self.shared.health.report(&error);
            return Err(AppendError::Failing(error));
        }
        // No writer runs while the log fails, so nothing was stored since `file_len` was read.
        self.lock().failure = None;
        tracing::info!(path = %self.shared.path.display(), "event log writes again");
        self.sync().await
    }

    /// Refuses further appends and subscriptions, writes and syncs what is queued, then ends
    /// every subscription (after they got the last events).
    pub async fn close(&self) {
        {
            let mut inner = self.lock();
            if inner.closed {
                return;
            }
            inner.closed = true;
        }
        if let Err(e) = self.sync().await {
            let n_lost = self.lock().queue.len();
            tracing::error!(path = %self.shared.path.display(), error = %e, n_lost, "event log closed with events it could not write");
        }
        self.lock().subscribers.clear();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every critical section leaves `Inner` consistent before anything that can panic, so a
        // poisoned lock is still usable.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts the writer job unless one runs (it then picks up what was just queued).
    fn start_writer(self: &Arc<Self>, inner: &mut Inner) {
        if inner.writing {
            return;
        }
        inner.writing = true;
        let shared = self.clone();
        // Dropping the join handle detaches the job; it ends when nothing is left to write.
        if self.pg.is_some() {
            drop(
                self.runtime
                    .spawn(async move { shared.write_queued_postgres().await }),
            );
        } else {
            drop(self.runtime.spawn_blocking(move || shared.write_queued()));
        }
    }

    /// The writer job: writes queued events in batches, publishes them, answers syncs, and ends
    /// when there is nothing left (or the log failed).
    fn write_queued(&self) {
        loop {
            let (batch, bytes, file, sync_wanted) = {
                let mut inner = self.lock();
                if inner.failure.is_some()
                    || (inner.queue.is_empty() && inner.sync_waiters.is_empty())
                {
                    inner.writing = false;
                    return;
                }
                let mut bytes = Vec::new();
                let mut batch = Vec::new();
                for event in &inner.queue {
                    if !bytes.is_empty() && bytes.len() + event.json.len() > WRITE_BATCH_MAX_BYTES {
                        break;
                    }
                    bytes.extend_from_slice(event.json.as_bytes());
                    bytes.push(b'\n');
                    batch.push(event.clone());
                }
                (
                    batch,
                    bytes,
                    inner.file().file.clone(),
                    !inner.sync_waiters.is_empty(),
                )
            };
            if !bytes.is_empty() {
                // The file is opened for appending: this lands at its end, after the last
                // stored event.
                let written = (&*file).write_all(&bytes);
                let mut inner = self.lock();
                if let Err(e) = written {
                    let _ = file.set_len(inner.file().file_len);
                    self.fail(inner, e);
                    return;
                }
                self.stored(&mut inner, batch);
            }
            if sync_wanted {
                let synced_to = self.lock().stored_end() - 1;
                let synced = file.sync_data();
                let mut inner = self.lock();
                if let Err(e) = synced {
                    self.fail(inner, e);
                    return;
                }
                let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut inner.sync_waiters)
                    .into_iter()
                    .partition(|waiter| waiter.seq <= synced_to);
                inner.sync_waiters = waiting;
                drop(inner);
                for waiter in done {
                    let _ = waiter.done.send(Ok(()));
                }
            }
        }
    }

    /// Records a written batch (the front of the queue) and publishes it.
    fn stored(&self, inner: &mut Inner, batch: Vec<Arc<StoredEvent>>) {
        for stored in batch {
            inner.queue.pop_front();
            if let Some(file) = &mut inner.file {
                let offset = file.file_len;
                file.offsets.push(offset);
                file.file_len += stored.json.len() as u64 + 1;
            }
            publish(inner, stored);
        }
    }

    /// The writer job of a PostgreSQL log: each batch in one transaction, published once
    /// committed (a committed transaction is durable, so a sync needs no more).
    async fn write_queued_postgres(self: Arc<Self>) {
        let Some(pg) = &self.pg else {
            return;
        };
        loop {
            let batch: Vec<Arc<StoredEvent>> = {
                let mut inner = self.lock();
                if inner.failure.is_some()
                    || (inner.queue.is_empty() && inner.sync_waiters.is_empty())
                {
                    inner.writing = false;
                    return;
                }
                inner.queue.iter().take(PG_BATCH_MAX).cloned().collect()
            };
            if !batch.is_empty() {
                let rows: Vec<warren_store::events::EventRow> = batch
                    .iter()
                    .map(|event| warren_store::events::EventRow {
                        seq: event.seq,
                        kind: event.kind.to_owned(),
                        json: event.json.to_string(),
                    })
                    .collect();
                let fence = pg
                    .fence
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .clone();
                let appended = pg
                    .store
                    .append_events_fenced(&pg.session_id, &rows, fence.as_ref())
                    .await;
                let mut inner = self.lock();
                match appended {
                    Ok(()) => {}
                    Err(warren_store::pg::StoreError::Conflict(why)) => {
                        self.superseded(inner, &why);
                        return;
                    }
                    Err(e) => {
                        self.fail(inner, io::Error::other(e));
                        return;
                    }
                }
                self.stored(&mut inner, batch);
            }
            let mut inner = self.lock();
            let stored_to = inner.stored_end() - 1;
            let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut inner.sync_waiters)
                .into_iter()
                .partition(|waiter| waiter.seq <= stored_to);
            inner.sync_waiters = waiting;
            drop(inner);
            for waiter in done {
                let _ = waiter.done.send(Ok(()));
            }
        }
    }
}

/// Puts one stored event in the tail and hands it to every subscriber (dropping the ones whose
/// queue is full).
fn publish(inner: &mut Inner, stored: Arc<StoredEvent>) {
    inner.stored_end = stored.seq + 1;
    inner.tail.push_back(stored.clone());
    if inner.tail.len() > TAIL_CACHE_MAX {
        inner.tail.pop_front();
    }
    inner
        .subscribers
        .retain(|subscriber| match subscriber.tx.try_send(stored.clone()) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                subscriber.dropped.store(true, Ordering::Release);
                SLOW_SUBSCRIBERS_DROPPED.fetch_add(1, Ordering::Relaxed);
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        });
    EVENTS_APPENDED.fetch_add(1, Ordering::Relaxed);
}

impl Shared {
    /// Another replica owns the session now (this one stalled past its lease and the session
    /// was taken over): what is queued here was never published, and goes, untold to anyone
    /// but the log; the store's rows are the session's history, which this log follows from
    /// here. Nothing is reported: the storage is fine, and the replica's other sessions go on.
    fn superseded(&self, mut inner: MutexGuard<'_, Inner>, why: &str) {
        let n_dropped = inner.queue.len();
        inner.queue.clear();
        inner.next_seq = inner.stored_end;
        inner.writing = false;
        let waiters = std::mem::take(&mut inner.sync_waiters);
        drop(inner);
        tracing::warn!(path = %self.path.display(), why, n_dropped, "another replica owns this session: the events queued here are dropped, and the log follows the store");
        let error = Arc::new(io::Error::other(format!(
            "another replica owns the session: {why}"
        )));
        for waiter in waiters {
            let _ = waiter.done.send(Err(AppendError::Failing(error.clone())));
        }
    }

    /// Fails the log after a write error: the queue is held, syncs are answered with the error,
    /// the writer job ends and the failure is reported.
    fn fail(&self, mut inner: MutexGuard<'_, Inner>, error: io::Error) {
        let error = Arc::new(error);
        inner.failure = Some(error.clone());
        inner.writing = false;
        let waiters = std::mem::take(&mut inner.sync_waiters);
        let n_held = inner.queue.len();
        drop(inner);
        tracing::error!(path = %self.path.display(), %error, n_held, "cannot write the event log; appends are refused until storage recovers");
        // Reported before anyone waiting hears of it: whoever a sync fails for finds the
        // failure in the storage health already.
        self.health.report(&error);
        for waiter in waiters {
            let _ = waiter.done.send(Err(AppendError::Failing(error.clone())));
        }
    }
}

/// Up to `limit` events after `after` from PostgreSQL, each checked as a file line would be.
async fn read_postgres(
    pg: &PgBackend,
    after: u64,
    limit: usize,
) -> io::Result<Vec<Arc<StoredEvent>>> {
    let rows = pg
        .store
        .read_events_after(&pg.session_id, after, limit)
        .await
        .map_err(io::Error::other)?;
    rows.iter()
        .map(|row| {
            StoredEvent::from_line(&row.json)
                .map(|(_, stored)| Arc::new(stored))
                .ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidData, "unparsable stored event")
                })
        })
        .collect()
}

fn read_range(path: &Path, start: u64, end: u64) -> io::Result<Vec<Arc<StoredEvent>>> {
    let mut file = File::open(path)?;
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = vec![0u8; (end - start) as usize];
    file.read_exact(&mut bytes)?;
    let text =
        std::str::from_utf8(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    text.lines()
        .map(|line| {
            StoredEvent::from_line(line)
                .map(|(_, stored)| Arc::new(stored))
                .ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidData, "unparsable stored event")
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(text: &str) -> EventBody {
        EventBody::UserMessage { text: text.into() }
    }

    fn open(path: &Path, visit: impl FnMut(&Event)) -> (EventLog, Repair) {
        EventLog::open(path, Arc::new(StorageHealth::default()), visit).expect("open")
    }

    fn seqs(events: &[Arc<StoredEvent>]) -> Vec<u64> {
        events.iter().map(|e| e.seq).collect()
    }

    #[tokio::test]
    async fn append_numbers_from_one_and_reads_back_after_reopen() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("events.jsonl");
        let (log, repair) = open(&path, |_| {});
        assert_eq!(repair, Repair::default());
        for i in 0..5 {
            let stored = log
                .append(Some(1), message(&format!("m{i}")))
                .expect("append");
            assert_eq!(stored.seq, i + 1);
        }
        log.sync().await.expect("sync");
        drop(log);
        let mut visited = Vec::new();
        let (log, _) = open(&path, |e| visited.push(e.seq));
        assert_eq!(visited, vec![1, 2, 3, 4, 5]);
        assert_eq!(log.append(None, message("next")).expect("append").seq, 6);
        log.sync().await.expect("sync");
        assert_eq!(
            seqs(&log.read_after(3, 100).await.expect("read")),
            vec![4, 5, 6]
        );
    }

    #[tokio::test]
    async fn read_after_pages_through_the_file_beyond_the_memory_tail() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (log, _) = open(&dir.path().join("events.jsonl"), |_| {});
        let n = TAIL_CACHE_MAX as u64 + 1000;
        for i in 0..n {
            log.append(None, message(&i.to_string())).expect("append");
        }
        log.sync().await.expect("sync");
        let mut after = 0;
        let mut all = Vec::new();
        loop {
            let page = log.read_after(after, 700).await.expect("read");
            if page.is_empty() {
                break;
            }
            after = page.last().expect("non-empty page").seq;
            all.extend(seqs(&page));
        }
        assert_eq!(all, (1..=n).collect::<Vec<_>>());
        assert_eq!(log.subscribe(0).err(), Some(SubscribeError::Behind));
    }

    /// Table: file content → (kept seqs, repair).
    #[tokio::test]
    async fn open_repairs_torn_tail_and_broken_chains() {
        let line = |seq: u64| {
            let event = Event {
                seq,
                ts: "t".into(),
                turn: None,
                body: message("x"),
            };
            serde_json::to_string(&event).expect("serialize") + "\n"
        };
        let cases: Vec<(String, Vec<u64>, Repair)> = vec![
            (String::new(), vec![], Repair::default()),
            (line(1) + &line(2), vec![1, 2], Repair::default()),
            (
                line(1) + "{\"seq\":2,\"ts",
                vec![1],
                Repair {
                    torn_tail: true,
                    n_dropped_lines: 0,
                },
            ),
            (
                line(1) + "garbage\n",
                vec![1],
                Repair {
                    torn_tail: true,
                    n_dropped_lines: 0,
                },
            ),
            (
                line(1) + &line(3) + &line(2),
                vec![1, 2],
                Repair {
                    torn_tail: false,
                    n_dropped_lines: 1,
                },
            ),
            (
                line(1) + &line(1) + &line(2),
                vec![1, 2],
                Repair {
                    torn_tail: false,
                    n_dropped_lines: 1,
                },
            ),
            (
                line(1) + "junk\n" + &line(2),
                vec![1, 2],
                Repair {
                    torn_tail: false,
                    n_dropped_lines: 1,
                },
            ),
        ];
        for (content, want_seqs, want_repair) in cases {
            let dir = tempfile::tempdir().expect("temp dir");
            let path = dir.path().join("events.jsonl");
            std::fs::write(&path, &content).expect("write fixture");
            let mut got = Vec::new();
            let (log, repair) = open(&path, |e| got.push(e.seq));
            assert_eq!(
                (got.clone(), repair),
                (want_seqs.clone(), want_repair),
                "content {content:?}"
            );
            let next = log.append(None, message("after")).expect("append").seq;
            assert_eq!(
                next,
                want_seqs.last().copied().unwrap_or(0) + 1,
                "content {content:?}"
            );
            log.sync().await.expect("sync");
            drop(log);
            let mut reread = Vec::new();
            let (_, repair) = open(&path, |e| reread.push(e.seq));
            assert_eq!(
                repair,
                Repair::default(),
                "repaired file is clean: {content:?}"
            );
            assert_eq!(reread.len(), want_seqs.len() + 1);
        }
    }

    #[tokio::test]
    async fn slow_subscriber_is_dropped_and_writer_never_waits() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (log, _) = open(&dir.path().join("events.jsonl"), |_| {});
        let slow = log.subscribe(0).expect("subscribe");
        let mut fast = log.subscribe(0).expect("subscribe");
        let mut n_fast = 0;
        for i in 0..(SUBSCRIBER_QUEUE_MAX as u64 + 10) {
            log.append(None, message(&i.to_string())).expect("append");
            // Written and published by the writer job: wait for it, then drain the fast queue.
            log.sync().await.expect("sync");
            while let Ok(event) = fast.live.try_recv() {
                n_fast += 1;
                assert_eq!(event.seq, n_fast);
            }
        }
        assert_eq!(n_fast, SUBSCRIBER_QUEUE_MAX as u64 + 10);
        assert!(
            slow.dropped.load(Ordering::Acquire),
            "slow subscriber marked dropped"
        );
        assert!(!fast.dropped.load(Ordering::Acquire));
        assert_eq!(log.n_subscribers(), 1);
    }

    #[tokio::test]
    async fn subscribe_hands_backlog_then_live_without_gap() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (log, _) = open(&dir.path().join("events.jsonl"), |_| {});
        for i in 0..3 {
            log.append(None, message(&i.to_string())).expect("append");
        }
        log.sync().await.expect("sync");
        let mut sub = log.subscribe(1).expect("subscribe");
        log.append(None, message("live")).expect("append");
        assert_eq!(seqs(&sub.backlog), vec![2, 3]);
        let live = tokio::time::timeout(std::time::Duration::from_secs(30), sub.live.recv())
            .await
            .expect("the live event within 30 s");
        assert_eq!(live.expect("live event").seq, 4);
        log.close().await;
        assert!(matches!(
            log.append(None, message("closed")),
            Err(AppendError::Closed)
        ));
        assert_eq!(log.subscribe(0).err(), Some(SubscribeError::Closed));
    }

    #[tokio::test]
    async fn a_subscriber_sees_an_event_only_once_it_is_in_the_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("events.jsonl");
        let (log, _) = open(&path, |_| {});
        let mut sub = log.subscribe(0).expect("subscribe");
        for i in 1..=200u64 {
            log.append(None, message(&i.to_string())).expect("append");
        }
        for want in 1..=200u64 {
            let event = tokio::time::timeout(std::time::Duration::from_secs(30), sub.live.recv())
                .await
                .unwrap_or_else(|_| panic!("event {want} within 30 s"))
                .expect("live event");
            assert_eq!(event.seq, want);
            let stored = std::fs::read_to_string(&path).expect("read the file");
            assert!(
                stored.lines().any(|line| line == &*event.json),
                "event {want} is in the file before the subscriber sees it"
            );
        }
    }

    /// A PostgreSQL log on a fresh database of the shared test cluster, and a second
    /// connection to it (another replica).
    async fn postgres_pair() -> (warren_store::pg::Store, warren_store::pg::Store) {
        let url = tokio::task::spawn_blocking(|| {
            warren_test_support::services::Postgres::shared().fresh_database()
        })
        .await
        .expect("the cluster starts");
        let a = warren_store::pg::Store::connect(&url)
            .await
            .expect("replica A connects");
        let b = warren_store::pg::Store::connect(&url)
            .await
            .expect("replica B connects");
        (a, b)
    }

    async fn open_pg(store: &warren_store::pg::Store, visit: impl FnMut(&Event)) -> EventLog {
        EventLog::open_postgres(
            store.clone(),
            "s1",
            Arc::new(StorageHealth::default()),
            visit,
        )
        .await
        .expect("opens the PostgreSQL log")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_postgres_log_stores_reopens_and_pages_beyond_the_memory_tail() {
        let (a, _) = postgres_pair().await;
        let log = open_pg(&a, |_| {}).await;
        let n = TAIL_CACHE_MAX as u64 + 100;
        for i in 0..n {
            log.append(Some(1), message(&i.to_string()))
                .expect("append");
        }
        log.sync().await.expect("sync");
        assert_eq!(log.last_seq(), n);
        let mut visited = Vec::new();
        let reopened = open_pg(&a, |event| visited.push(event.seq)).await;
        assert_eq!(visited, (1..=n).collect::<Vec<_>>());
        assert_eq!(reopened.last_seq(), n);
        // The first 100 are older than the memory tail: they come from the database.
        let page = reopened.read_after(0, 150).await.expect("reads back");
        assert_eq!(seqs(&page), (1..=150).collect::<Vec<_>>());
        let next = reopened.append(None, message("after")).expect("append");
        assert_eq!(next.seq, n + 1, "seq goes on +1 after a reopen");
        reopened.sync().await.expect("sync");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_follower_on_another_replica_publishes_every_committed_event_once_in_order() {
        let (a, b) = postgres_pair().await;
        let owner = open_pg(&a, |_| {}).await;
        let follower = open_pg(&b, |_| {}).await;
        let mut sub = follower.subscribe(0).expect("subscribes on the follower");
        let notices = b.listen().await;
        let mut notices_rx = notices.subscribe();
        let mut seen = Vec::new();
        for i in 1..=50u64 {
            owner.append(None, message(&i.to_string())).expect("append");
            owner.sync().await.expect("sync");
            // The notice of this append reaches the other replica, which then reads the row.
            loop {
                let notice =
                    tokio::time::timeout(std::time::Duration::from_secs(30), notices_rx.recv())
                        .await
                        .expect("a notice within 30 s")
                        .expect("the listener runs");
                if let warren_store::events::Notice::Appended { session_id, seq } = notice {
                    assert_eq!(session_id, "s1");
                    if seq >= i {
                        break;
                    }
                }
            }
            follower.follow().await.expect("follows");
            while let Ok(event) = sub.live.try_recv() {
                seen.push(event.seq);
            }
        }
        assert_eq!(seen, (1..=50).collect::<Vec<_>>());
        assert_eq!(follower.last_seq(), 50);
        assert!(
            follower.follow().await.expect("follows").is_empty(),
            "nothing twice"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_postgres_log_whose_database_is_gone_holds_its_events_and_writes_them_once_back() {
        let mut postgres =
            tokio::task::spawn_blocking(warren_test_support::services::Postgres::start)
                .await
                .expect("the cluster starts");
        let url = postgres.fresh_database();
        let store = warren_store::pg::Store::connect(&url)
            .await
            .expect("connects");
        let health = Arc::new(StorageHealth::default());
        let log = EventLog::open_postgres(store.clone(), "s1", health.clone(), |_| {})
            .await
            .expect("opens");
        log.append(None, message("before")).expect("append");
        log.sync().await.expect("sync");
        let mut postgres = tokio::task::spawn_blocking(move || {
            postgres.stop();
            postgres
        })
        .await
        .expect("stops");
        log.append(None, message("while down")).expect("queued");
        let synced = tokio::time::timeout(std::time::Duration::from_secs(30), log.sync())
            .await
            .expect("the failed write is reported, no hang");
        assert!(matches!(synced, Err(AppendError::Failing(_))), "{synced:?}");
        assert!(log.is_failing());
        assert!(health.failure().is_some(), "reported to the storage health");
        assert!(matches!(
            log.append(None, message("refused")),
            Err(AppendError::Failing(_))
        ));
        let postgres = tokio::task::spawn_blocking(move || {
            postgres.start_again();
            postgres
        })
        .await
        .expect("starts again");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while log.resume().await.is_err() {
            assert!(std::time::Instant::now() < deadline, "the log writes again");
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        let mut stored = Vec::new();
        let _reopened = open_pg(&store, |event| stored.push(event.seq)).await;
        assert_eq!(
            stored,
            vec![1, 2],
            "the held event is stored once, with no gap"
        );
        drop(store);
        drop(postgres);
    }
}
