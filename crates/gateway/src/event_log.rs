//! A session's durable event stream: `append`, `read_after(seq)` and `subscribe`, backed by one
//! `events.jsonl` file (one JSON [`Event`] per line).
//!
//! Invariants: seq strictly increases by 1 and never repeats; an event is written to the file
//! (one `write(2)` of the whole line) before any subscriber sees it; the writer never waits for a
//! reader: each subscriber has a queue of [`SUBSCRIBER_QUEUE_MAX`] events and is dropped (its
//! stream ends, the client resumes from its last id) when that queue is full. Durability: every
//! event reaches the kernel before it is published, so it survives a crash of the gateway
//! process; [`EventLog::sync`] (called at turn end and shutdown) fsyncs for power loss.
//!
//! On open the file is repaired: a torn last line, unparsable lines and any line whose seq breaks
//! the +1 chain are dropped and the file is rewritten atomically. Storage is deliberately only
//! this module's business (no trait yet), so Redis Streams or PostgreSQL can replace the file
//! behind the same three operations.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::mpsc;
use warren_protocol::gateway::{Event, EventBody};

use crate::store;

/// A subscriber whose queue holds this many undelivered events is disconnected.
pub const SUBSCRIBER_QUEUE_MAX: usize = 512;
/// How many recent events are kept in memory; older ones are read back from the file.
const TAIL_CACHE_MAX: usize = 4096;

/// Counts every subscriber dropped for being too slow, across all logs (for `/metrics`).
pub static SLOW_SUBSCRIBERS_DROPPED: AtomicU64 = AtomicU64::new(0);
/// Counts every appended event across all logs (for `/metrics`).
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

struct Inner {
    file: Option<File>,
    first_seq: u64,
    next_seq: u64,
    /// Byte offset in the file of event `first_seq + i`.
    offsets: Vec<u64>,
    file_len: u64,
    tail: VecDeque<Arc<StoredEvent>>,
    subscribers: Vec<Subscriber>,
}

pub struct EventLog {
    path: PathBuf,
    inner: Mutex<Inner>,
}

impl EventLog {
    /// Opens (creating if needed) the log at `path`, repairs it, and calls `visit` with every
    /// kept event in order so the caller can rebuild its own state.
    pub fn open(path: &Path, mut visit: impl FnMut(&Event)) -> io::Result<(EventLog, Repair)> {
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
        if repair != Repair::default() {
            tracing::warn!(path = %path.display(), ?repair, "event log repaired");
            store::write_atomic(path, &kept)?;
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let log = EventLog {
            path: path.to_path_buf(),
            inner: Mutex::new(Inner {
                file: Some(file),
                first_seq: first_seq.unwrap_or(next_seq),
                next_seq,
                offsets,
                file_len: kept.len() as u64,
                tail,
                subscribers: Vec::new(),
            }),
        };
        Ok((log, repair))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every critical section leaves `Inner` consistent before anything that can panic, so a
        // poisoned lock is still usable.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Stores the next event and then publishes it to every subscriber. Returns the stored
    /// event. Never waits for a subscriber.
    pub fn append(&self, turn: Option<u64>, body: EventBody) -> io::Result<Arc<StoredEvent>> {
        let mut inner = self.lock();
        let seq = inner.next_seq;
        let kind = body.kind();
        let event = Event {
            seq,
            ts: store::now_rfc3339(),
            turn,
            body,
        };
        let json = serde_json::to_string(&event).map_err(io::Error::other)?;
        let mut line = Vec::with_capacity(json.len() + 1);
        line.extend_from_slice(json.as_bytes());
        line.push(b'\n');
        let file_len = inner.file_len;
        let Some(file) = inner.file.as_mut() else {
            return Err(io::Error::other("event log is closed"));
        };
        if let Err(e) = file.write_all(&line) {
            // Cut a partial line off so the next append does not glue onto it.
            let _ = file.set_len(file_len);
            return Err(e);
        }
        inner.offsets.push(file_len);
        inner.file_len += line.len() as u64;
        inner.next_seq += 1;
        let stored = Arc::new(StoredEvent {
            seq,
            kind,
            json: Arc::from(json),
        });
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
        Ok(stored)
    }

    /// Up to `limit` stored events with a seq greater than `after`, oldest first.
    pub async fn read_after(&self, after: u64, limit: usize) -> io::Result<Vec<Arc<StoredEvent>>> {
        let (start, end) = {
            let inner = self.lock();
            let tail_first = inner.tail.front().map_or(inner.next_seq, |e| e.seq);
            if after.saturating_add(1) >= tail_first {
                return Ok(inner
                    .tail
                    .iter()
                    .filter(|e| e.seq > after)
                    .take(limit)
                    .cloned()
                    .collect());
            }
            let from_seq = (after + 1).max(inner.first_seq);
            let to_seq = from_seq.saturating_add(limit as u64).min(inner.next_seq);
            let index = |seq: u64| (seq - inner.first_seq) as usize;
            let start = inner.offsets[index(from_seq)];
            let end = if to_seq >= inner.next_seq {
                inner.file_len
            } else {
                inner.offsets[index(to_seq)]
            };
            (start, end)
        };
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || read_range(&path, start, end))
            .await
            .map_err(io::Error::other)?
    }

    /// Registers a live subscriber positioned after `after` (see [`Subscription`]).
    pub fn subscribe(&self, after: u64) -> Result<Subscription, SubscribeError> {
        let mut inner = self.lock();
        if inner.file.is_none() {
            return Err(SubscribeError::Closed);
        }
        let tail_first = inner.tail.front().map_or(inner.next_seq, |e| e.seq);
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

    /// The seq of the newest event, 0 when empty.
    pub fn last_seq(&self) -> u64 {
        self.lock().next_seq - 1
    }

    pub fn n_subscribers(&self) -> usize {
        let mut inner = self.lock();
        inner.subscribers.retain(|s| !s.tx.is_closed());
        inner.subscribers.len()
    }

    /// fsyncs the file (turn end, shutdown).
    pub fn sync(&self) -> io::Result<()> {
        let inner = self.lock();
        match inner.file.as_ref() {
            Some(file) => file.sync_data(),
            None => Ok(()),
        }
    }

    /// Stops accepting appends and ends every subscription.
    pub fn close(&self) {
        let mut inner = self.lock();
        if let Some(file) = inner.file.take() {
            let _ = file.sync_data();
        }
        inner.subscribers.clear();
    }
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

    fn seqs(events: &[Arc<StoredEvent>]) -> Vec<u64> {
        events.iter().map(|e| e.seq).collect()
    }

    #[tokio::test]
    async fn append_numbers_from_one_and_reads_back_after_reopen() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("events.jsonl");
        let (log, repair) = EventLog::open(&path, |_| {}).expect("open");
        assert_eq!(repair, Repair::default());
        for i in 0..5 {
            let stored = log
                .append(Some(1), message(&format!("m{i}")))
                .expect("append");
            assert_eq!(stored.seq, i + 1);
        }
        drop(log);
        let mut visited = Vec::new();
        let (log, _) = EventLog::open(&path, |e| visited.push(e.seq)).expect("reopen");
        assert_eq!(visited, vec![1, 2, 3, 4, 5]);
        assert_eq!(log.append(None, message("next")).expect("append").seq, 6);
        assert_eq!(
            seqs(&log.read_after(3, 100).await.expect("read")),
            vec![4, 5, 6]
        );
    }

    #[tokio::test]
    async fn read_after_pages_through_the_file_beyond_the_memory_tail() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (log, _) = EventLog::open(&dir.path().join("events.jsonl"), |_| {}).expect("open");
        let n = TAIL_CACHE_MAX as u64 + 1000;
        for i in 0..n {
            log.append(None, message(&i.to_string())).expect("append");
        }
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
    #[test]
    fn open_repairs_torn_tail_and_broken_chains() {
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
            let (log, repair) = EventLog::open(&path, |e| got.push(e.seq)).expect("open");
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
            drop(log);
            let mut reread = Vec::new();
            let (_, repair) = EventLog::open(&path, |e| reread.push(e.seq)).expect("reopen");
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
        let (log, _) = EventLog::open(&dir.path().join("events.jsonl"), |_| {}).expect("open");
        let slow = log.subscribe(0).expect("subscribe");
        let mut fast = log.subscribe(0).expect("subscribe");
        let mut n_fast = 0;
        for i in 0..(SUBSCRIBER_QUEUE_MAX as u64 + 10) {
            log.append(None, message(&i.to_string())).expect("append");
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

    #[test]
    fn subscribe_hands_backlog_then_live_without_gap() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (log, _) = EventLog::open(&dir.path().join("events.jsonl"), |_| {}).expect("open");
        for i in 0..3 {
            log.append(None, message(&i.to_string())).expect("append");
        }
        let mut sub = log.subscribe(1).expect("subscribe");
        log.append(None, message("live")).expect("append");
        assert_eq!(seqs(&sub.backlog), vec![2, 3]);
        assert_eq!(sub.live.try_recv().expect("live event").seq, 4);
        log.close();
        assert!(log.append(None, message("closed")).is_err());
        assert_eq!(log.subscribe(0).err(), Some(SubscribeError::Closed));
    }
}
