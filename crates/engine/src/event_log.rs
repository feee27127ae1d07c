//! A session's durable event stream: `append`, `read_after(seq)` and `subscribe`, over the
//! session's [`EventStore`] (an `events.jsonl` file, or rows in PostgreSQL with `--store
//! postgres://…`; `warren-store` owns both and repairs a file on open).
//!
//! Invariants: seq strictly increases by 1 and never repeats; an event is stored before any
//! subscriber sees it; the writer never waits for a reader: each subscriber has a queue of
//! [`SUBSCRIBER_QUEUE_MAX`] events and is dropped (its stream ends, the client resumes from its
//! last id) when that queue is full.
//!
//! No I/O happens on the caller's thread, which is usually an async worker: `append` gives the
//! event its seq and queues it, and one writer job per log (a task started when something is
//! queued, gone when nothing is) appends the queue in seq order, a batch at a time (one
//! `write(2)`, or one transaction), then publishes what was stored. [`EventLog::sync`] waits
//! until everything appended before it is stored and synced (turn end, shutdown); every
//! written event already survives a crash of the gateway process.
//!
//! An append that fails (a full disk, a database that is away) fails the log: the unwritten
//! events stay queued, in order and unpublished, later appends are refused with
//! [`AppendError::Failing`], and the failure is reported to the gateway's [`StorageHealth`].
//! [`EventLog::resume`] (once storage is back) appends the held events first, so the stream
//! never has a hole and no seq is reused.
//!
//! A [`Tap`] ([`EventLog::tap`]) is told of each event this log's writer stored, after it is
//! stored and published, outside the log's lock, and must not block (the gateway's pushes queue
//! what they need and return). Events a follower reads are not tapped: their owner's log was.
//!
//! A replica that does not own a session keeps the same log as a follower: [`EventLog::follow`]
//! reads what the owner committed and publishes it to this replica's subscribers, so an SSE
//! client may stream from any replica; an owner that lost its lease is superseded (its queued
//! events go, and it follows the store from there).

use std::collections::VecDeque;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tokio::sync::{mpsc, oneshot};
use warren_protocol::gateway::{Event, EventBody};
use warren_store::event_store::{AppendFailure, EventStore};
pub use warren_store::event_store::{Repair, StoredEvent};
use warren_store::health::StorageHealth;

/// Told of every event a log's writer stored (see the module docs); it must not block.
pub type Tap = Box<dyn Fn(&Arc<StoredEvent>) + Send + Sync>;

/// A subscriber whose queue holds this many undelivered events is disconnected.
pub const SUBSCRIBER_QUEUE_MAX: usize = 512;
/// How many recent events are kept in memory; older ones are read back from the file.
const TAIL_CACHE_MAX: usize = 4096;
/// The most bytes the writer appends at once (one `write(2)` to a file).
const WRITE_BATCH_MAX_BYTES: usize = 1 << 20;
/// The most events the writer appends at once (one transaction in PostgreSQL).
const WRITE_BATCH_MAX_EVENTS: usize = 512;

/// Counts every subscriber dropped for being too slow, across all logs (for `/metrics`).
pub static SLOW_SUBSCRIBERS_DROPPED: AtomicU64 = AtomicU64::new(0);
/// Counts every event written, across all logs (for `/metrics`).
pub static EVENTS_APPENDED: AtomicU64 = AtomicU64::new(0);

/// A stored line as an event (to rebuild state) and as stored (to serve).
fn parse_line(line: &str) -> Option<(Event, StoredEvent)> {
    let event: Event = serde_json::from_str(line).ok()?;
    let stored = StoredEvent {
        seq: event.seq,
        kind: event.body.kind(),
        json: Arc::from(line),
    };
    Some((event, stored))
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

struct Inner {
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
    fn opened(first_seq: u64, next_seq: u64, tail: VecDeque<Arc<StoredEvent>>) -> Inner {
        Inner {
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
}

/// What the writer job needs, shared between the log and the job.
struct Shared {
    store: EventStore,
    /// The store's name, for logs.
    name: String,
    inner: Mutex<Inner>,
    runtime: tokio::runtime::Handle,
    health: Arc<StorageHealth>,
    /// Told of every event the writer stored; set once.
    tap: OnceLock<Tap>,
}

pub struct EventLog {
    shared: Arc<Shared>,
}

impl EventLog {
    /// Opens (creating if needed) the log at `path`, repairs it, and calls `visit` with every
    /// kept event in order so the caller can rebuild its own state. Write failures are reported
    /// to `health`. Call inside a tokio runtime (the writer runs on it). Blocking.
    pub fn open(
        path: &Path,
        health: Arc<StorageHealth>,
        mut visit: impl FnMut(&Event),
    ) -> io::Result<(EventLog, Repair)> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| io::Error::other(format!("the event log needs a tokio runtime: {e}")))?;
        let mut opened = Opened::default();
        let (store, repair) = EventStore::open_file(path, parse_seq, |(event, stored)| {
            visit(&event);
            opened.keep(stored);
        })?;
        Ok((opened.into_log(store, runtime, health), repair))
    }

    /// Opens the log of `session_id` kept in PostgreSQL and calls `visit` with every stored
    /// event in order (as [`EventLog::open`] does for a file).
    pub async fn open_postgres(
        store: warren_store::pg::Store,
        session_id: &str,
        health: Arc<StorageHealth>,
        mut visit: impl FnMut(&Event),
    ) -> io::Result<EventLog> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| io::Error::other(format!("the event log needs a tokio runtime: {e}")))?;
        let mut opened = Opened::default();
        let store = EventStore::open_postgres(store, session_id, parse_seq, |(event, stored)| {
            visit(&event);
            opened.keep(stored);
        })
        .await
        .map_err(io::Error::other)?;
        Ok(opened.into_log(store, runtime, health))
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
        let after = {
            let inner = self.lock();
            if inner.closed || !inner.queue.is_empty() {
                return Ok(Vec::new());
            }
            inner.stored_end - 1
        };
        self.read_stored(after, WRITE_BATCH_MAX_EVENTS).await
    }

    /// What the store holds after `after` (up to `limit` events), each line checked.
    async fn read_stored(&self, after: u64, limit: usize) -> io::Result<Vec<Arc<StoredEvent>>> {
        let lines = self.shared.store.read_after(after, limit).await?;
        lines
            .iter()
            .map(|line| {
                parse_line(line)
                    .map(|(_, stored)| Arc::new(stored))
                    .ok_or_else(|| {
                        io::Error::new(io::ErrorKind::InvalidData, "unparsable stored event")
                    })
            })
            .collect()
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

    /// Tells `tap` of every event this log's writer stores from now on (see the module docs).
    /// A log has at most one tap: a second is ignored.
    pub fn tap(&self, tap: Tap) {
        let _ = self.shared.tap.set(tap);
    }

    /// Fences every later append of a PostgreSQL log by `lease`, the session's lease this
    /// replica just took (see `Store::append_events_fenced`). Nothing for a file log.
    pub fn set_fence(&self, lease: warren_store::leases::Lease) {
        self.shared.store.set_fence(lease);
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
            ts: warren_store::file::now_rfc3339(),
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
        let (after, limit) = {
            let inner = self.lock();
            let stored_end = inner.stored_end();
            let tail_first = inner.tail.front().map_or(stored_end, |e| e.seq);
            if after.saturating_add(1) >= tail_first {
                return Ok(inner
                    .tail
                    .iter()
                    .filter(|e| e.seq > after)
                    .take(limit)
                    .cloned()
                    .collect());
            }
            // Only what is published: the store may hold a batch the writer has not
            // published yet.
            let from_seq = (after + 1).max(inner.first_seq);
            (from_seq - 1, limit.min((stored_end - from_seq) as usize))
        };
        self.read_stored(after, limit).await
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
        if self.lock().failure.is_none() {
            return Ok(());
        }
        // No writer runs while the log fails, so the store is as the failed append left it.
        if let Err(e) = self.shared.store.resume().await {
            let error = Arc::new(e);
            self.shared.health.report(&error);
            return Err(AppendError::Failing(error));
        }
        self.lock().failure = None;
        tracing::info!(log = %self.shared.name, "event log writes again");
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
            tracing::error!(log = %self.shared.name, error = %e, n_lost, "event log closed with events it could not write");
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
        drop(
            self.runtime
                .spawn(async move { shared.write_queued().await }),
        );
    }

    /// The writer job: appends queued events in batches, publishes each once stored, answers
    /// syncs, and ends when there is nothing left (or the log failed).
    async fn write_queued(self: Arc<Self>) {
        loop {
            let (batch, sync_wanted) = {
                let mut inner = self.lock();
                if inner.failure.is_some()
                    || (inner.queue.is_empty() && inner.sync_waiters.is_empty())
                {
                    inner.writing = false;
                    return;
                }
                let mut n_bytes = 0;
                let mut batch = Vec::new();
                for event in &inner.queue {
                    let full = batch.len() == WRITE_BATCH_MAX_EVENTS
                        || n_bytes + event.json.len() > WRITE_BATCH_MAX_BYTES;
                    if !batch.is_empty() && full {
                        break;
                    }
                    n_bytes += event.json.len() + 1;
                    batch.push(event.clone());
                }
                (batch, !inner.sync_waiters.is_empty())
            };
            if !batch.is_empty() {
                let appended = self.store.append(&batch).await;
                let mut inner = self.lock();
                match appended {
                    Ok(()) => {
                        self.stored(&mut inner, &batch);
                        drop(inner);
                        if let Some(tap) = self.tap.get() {
                            batch.iter().for_each(tap);
                        }
                    }
                    Err(AppendFailure::Superseded(why)) => {
                        self.superseded(inner, &why);
                        return;
                    }
                    Err(AppendFailure::Failed(e)) => {
                        self.fail(inner, e);
                        return;
                    }
                }
            }
            if sync_wanted {
                let synced_to = self.lock().stored_end() - 1;
                let synced = self.store.sync().await;
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
    fn stored(&self, inner: &mut Inner, batch: &[Arc<StoredEvent>]) {
        for stored in batch {
            inner.queue.pop_front();
            publish(inner, stored.clone());
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
        tracing::warn!(log = %self.name, why, n_dropped, "another replica owns this session: the events queued here are dropped, and the log follows the store");
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
        tracing::error!(log = %self.name, %error, n_held, "cannot write the event log; appends are refused until storage recovers");
        // Reported before anyone waiting hears of it: whoever a sync fails for finds the
        // failure in the storage health already.
        self.health.report(&error);
        for waiter in waiters {
            let _ = waiter.done.send(Err(AppendError::Failing(error.clone())));
        }
    }
}

/// A stored line's seq, with the line as an event and as stored.
fn parse_seq(line: &str) -> Option<(u64, (Event, StoredEvent))> {
    parse_line(line).map(|(event, stored)| (event.seq, (event, stored)))
}

/// What an open kept: the seqs and the newest events.
#[derive(Default)]
struct Opened {
    first_seq: Option<u64>,
    next_seq: Option<u64>,
    tail: VecDeque<Arc<StoredEvent>>,
}

impl Opened {
    fn keep(&mut self, stored: StoredEvent) {
        self.first_seq.get_or_insert(stored.seq);
        self.next_seq = Some(stored.seq + 1);
        self.tail.push_back(Arc::new(stored));
        if self.tail.len() > TAIL_CACHE_MAX {
            self.tail.pop_front();
        }
    }

    fn into_log(
        self,
        store: EventStore,
        runtime: tokio::runtime::Handle,
        health: Arc<StorageHealth>,
    ) -> EventLog {
        let next_seq = self.next_seq.unwrap_or(1);
        let first_seq = self.first_seq.unwrap_or(next_seq);
        EventLog {
            shared: Arc::new(Shared {
                name: store.name(),
                store,
                inner: Mutex::new(Inner::opened(first_seq, next_seq, self.tail)),
                runtime,
                health,
                tap: OnceLock::new(),
            }),
        }
    }
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
    async fn a_tap_is_told_of_each_event_once_stored_in_seq_order() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("events.jsonl");
        let (log, _) = open(&path, |_| {});
        log.append(None, message("before the tap")).expect("append");
        log.sync().await.expect("sync");
        let tapped = Arc::new(Mutex::new(Vec::new()));
        let seen = tapped.clone();
        let file = path.clone();
        log.tap(Box::new(move |event| {
            let on_disk = std::fs::read_to_string(&file).expect("the log reads");
            assert!(
                on_disk.contains(&*event.json),
                "stored before the tap is told"
            );
            seen.lock().expect("not poisoned").push(event.seq);
        }));
        for i in 0..50 {
            log.append(Some(1), message(&i.to_string()))
                .expect("append");
        }
        log.sync().await.expect("sync");
        assert_eq!(
            *tapped.lock().expect("not poisoned"),
            (2..=51).collect::<Vec<u64>>()
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
