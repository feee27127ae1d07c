//! The durable event stream of every session: rows in `events` and the `LISTEN/NOTIFY` channel
//! `warren_events` that tells other replicas a session has new rows. The gateway keeps its own
//! in-memory tail and subscribers; this module only writes, reads and announces rows.
//!
//! Architecture Invariant: a session's seqs are 1, 2, 3, … with no gap and no duplicate, across
//! replicas. [`Store::append_events`] takes a per-session transaction lock, checks that the
//! first row is the last seq + 1, and writes every row or none; an owner's appends are also
//! fenced by its lease ([`Store::append_events_fenced`]).
//!
//! Architecture Invariant: a notice is a hint, never data. Its payload only names a session and
//! its last seq (PostgreSQL delivers it after the commit, so the rows are there); subscribers
//! read the rows from the table. Notices can be missed while the listener reconnects, so every
//! re-established `LISTEN` is announced as [`Notice::Reconnected`], upon which subscribers
//! re-read from their last seq. A malformed payload is logged and ignored.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_postgres::AsyncMessage;

use crate::pg::{Store, StoreError, connect_unpooled, to_bigint, unsigned};

/// The `LISTEN/NOTIFY` channel of appended events.
const CHANNEL: &str = "warren_events";

/// The first key of the transaction advisory locks that serialize one session's appends (the
/// second is the hash of the session id).
const APPEND_LOCK_CLASS: i32 = 0x5745_0001;

/// How many notices a slow subscriber may fall behind before it sees `Lagged` (then it re-reads
/// from its last seq, as after `Reconnected`).
const NOTICE_BACKLOG: usize = 1024;

const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(100);
const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// How long [`Store::listen`] waits for its first `LISTEN` before returning anyway (the listener
/// keeps trying and says [`Notice::Reconnected`] once it is listening).
const FIRST_LISTEN_WAIT: Duration = Duration::from_secs(5);

/// One event of a session as stored: its seq, its kind and its JSON body (kept as text, as the
/// gateway wrote it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRow {
    pub seq: u64,
    pub kind: String,
    pub json: String,
}

impl Store {
    /// Appends `rows` to the session's stream in one transaction. The rows' seqs must be
    /// consecutive and the first must be the last stored seq + 1; otherwise (a duplicate, a gap)
    /// nothing is written and the answer is [`StoreError::Conflict`]. No rows is Ok; an empty
    /// session id or a seq beyond `i64::MAX` is [`StoreError::Invalid`]. Other
    /// replicas are told by a notice sent with the commit.
    pub async fn append_events(
        &self,
        session_id: &str,
        rows: &[EventRow],
    ) -> Result<(), StoreError> {
        self.append_events_fenced(session_id, rows, None).await
    }

    /// [`Store::append_events`] by the holder of `fence`, the session's lease: the rows are
    /// written only while the lease row still names its replica and epoch, and the transaction
    /// holds that row (`FOR SHARE`) until it commits, so a takeover waits for it and reads what
    /// it wrote. A replica that lost the lease (it stalled and another took the session) is
    /// refused with [`StoreError::Conflict`] and never writes after the new owner.
    pub async fn append_events_fenced(
        &self,
        session_id: &str,
        rows: &[EventRow],
        fence: Option<&crate::leases::Lease>,
    ) -> Result<(), StoreError> {
        // The notice names the session first: an empty id could not be told from a malformed
        // notice.
        if session_id.is_empty() {
            return Err(StoreError::Invalid("an empty session id".into()));
        }
        let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
            return Ok(());
        };
        let seqs = rows
            .iter()
            .map(|row| i64::try_from(row.seq))
            .collect::<Result<Vec<i64>, _>>()
            .map_err(|_| StoreError::Invalid(format!("a seq beyond {}", i64::MAX)))?;
        let consecutive = seqs
            .windows(2)
            .all(|pair| pair[0].checked_add(1) == Some(pair[1]));
        if !consecutive {
            return Err(StoreError::Conflict(format!(
                "the seqs of the rows to append to {session_id} are not consecutive"
            )));
        }
        let kinds: Vec<&str> = rows.iter().map(|row| row.kind.as_str()).collect();
        let bodies: Vec<&str> = rows.iter().map(|row| row.json.as_str()).collect();

        let mut client = self.client().await?;
        let transaction = client.transaction().await?;
        transaction
            .execute(
                "SELECT pg_advisory_xact_lock($1, hashtext($2))",
                &[&APPEND_LOCK_CLASS, &session_id],
            )
            .await?;
        if let Some(lease) = fence {
            let held = transaction
                .query_opt(
                    "SELECT 1 FROM leases
                     WHERE session_id = $1 AND replica_id = $2 AND epoch = $3
                     FOR SHARE",
                    &[&lease.session_id, &lease.replica_id, &lease.epoch],
                )
                .await?;
            if held.is_none() || lease.session_id != session_id {
                return Err(StoreError::Conflict(format!(
                    "the lease of {session_id} is no longer {}'s (epoch {})",
                    lease.replica_id, lease.epoch
                )));
            }
        }
        let stored_last: i64 = transaction
            .query_one(
                "SELECT coalesce(max(seq), 0) FROM events WHERE session_id = $1",
                &[&session_id],
            )
            .await?
            .try_get(0)?;
        if stored_last.checked_add(1) != Some(seqs[0]) {
            return Err(StoreError::Conflict(format!(
                "{session_id} is at seq {stored_last}: cannot append seq {}",
                first.seq
            )));
        }
        transaction
            .execute(
                "INSERT INTO events (session_id, seq, kind, body)
                 SELECT $1, seq, kind, body
                 FROM unnest($2::bigint[], $3::text[], $4::text[]) AS rows (seq, kind, body)",
                &[&session_id, &seqs, &kinds, &bodies],
            )
            .await?;
        transaction
            .execute(
                "SELECT pg_notify($1, $2)",
                &[&CHANNEL, &format!("{session_id} {}", last.seq)],
            )
            .await?;
        transaction.commit().await?;
        Ok(())
    }

    /// Up to `limit` rows of the session with a seq above `after`, in ascending order.
    pub async fn read_events_after(
        &self,
        session_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<EventRow>, StoreError> {
        let Ok(after) = i64::try_from(after) else {
            // No stored seq is that large.
            return Ok(Vec::new());
        };
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT seq, kind, body FROM events WHERE session_id = $1 AND seq > $2
                 ORDER BY seq LIMIT $3",
                &[&session_id, &after, &to_bigint(limit)],
            )
            .await?;
        rows.iter()
            .map(|row| {
                Ok(EventRow {
                    seq: unsigned(row.try_get(0)?, "seq")?,
                    kind: row.try_get(1)?,
                    json: row.try_get(2)?,
                })
            })
            .collect()
    }

    /// The session's last stored seq; 0 when it has none.
    pub async fn last_event_seq(&self, session_id: &str) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let last: i64 = client
            .query_one(
                "SELECT coalesce(max(seq), 0) FROM events WHERE session_id = $1",
                &[&session_id],
            )
            .await?
            .try_get(0)?;
        unsigned(last, "seq")
    }

    /// Deletes every event of the session; returns how many there were.
    pub async fn delete_events(&self, session_id: &str) -> Result<u64, StoreError> {
        let client = self.client().await?;
        Ok(client
            .execute("DELETE FROM events WHERE session_id = $1", &[&session_id])
            .await?)
    }

    /// Starts listening for appended events on a connection of its own. Returns once the first
    /// `LISTEN` is in place (or after a few seconds if PostgreSQL cannot be reached; the listener
    /// keeps trying and says [`Notice::Reconnected`] when it is listening).
    pub async fn listen(&self) -> Notices {
        let (sender, _) = broadcast::channel(NOTICE_BACKLOG);
        let (stop, stopped) = oneshot::channel();
        let (first_listen, first_listen_done) = oneshot::channel();
        tokio::spawn(run_listener(
            (*self.config).clone(),
            sender.clone(),
            stopped,
            first_listen,
        ));
        let _ = tokio::time::timeout(FIRST_LISTEN_WAIT, first_listen_done).await;
        Notices {
            sender,
            _stop: Arc::new(StopOnDrop(Some(stop))),
        }
    }
}

/// What the listener says to subscribers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// The session has rows up to `seq` (read them from the table).
    Appended { session_id: String, seq: u64 },
    /// The listener lost its connection and listens again: notices may have been missed, so
    /// re-read every stream from its last seq.
    Reconnected,
}

/// The handle of a listener task; the task ends when this and every clone are dropped.
#[derive(Clone)]
pub struct Notices {
    sender: broadcast::Sender<Notice>,
    _stop: Arc<StopOnDrop>,
}

impl Notices {
    /// A receiver of every notice from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Notice> {
        self.sender.subscribe()
    }
}

impl std::fmt::Debug for Notices {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Notices")
            .field("n_subscribers", &self.sender.receiver_count())
            .finish()
    }
}

/// Tells the listener task to end when the last [`Notices`] goes.
struct StopOnDrop(Option<oneshot::Sender<()>>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(stop) = self.0.take() {
            let _ = stop.send(());
        }
    }
}

/// Parses a notice payload, `<session id> <seq>` (the id may itself hold spaces: the seq is what
/// follows the last one).
pub fn parse_notice_payload(payload: &str) -> Option<Notice> {
    let (session_id, seq) = payload.rsplit_once(' ')?;
    if session_id.is_empty() {
        return None;
    }
    let seq = seq.parse::<u64>().ok().filter(|seq| *seq >= 1)?;
    Some(Notice::Appended {
        session_id: session_id.to_owned(),
        seq,
    })
}

/// Why one listening connection ended.
enum Ended {
    /// Every [`Notices`] is gone.
    Stopped,
    /// The connection failed or closed (after listening, or before): reconnect.
    Lost { error: String, listened: bool },
}

/// Listens until told to stop, reconnecting with backoff whenever the connection goes.
async fn run_listener(
    config: tokio_postgres::Config,
    sender: broadcast::Sender<Notice>,
    mut stopped: oneshot::Receiver<()>,
    first_listen: oneshot::Sender<()>,
) {
    let mut first_listen = Some(first_listen);
    let mut backoff = RECONNECT_BACKOFF_MIN;
    // Every LISTEN after the first attempt (failed or not) is announced as a reconnection:
    // appends may have happened while nobody listened.
    let mut attempted_before = false;
    loop {
        let ended = tokio::select! {
            _ = &mut stopped => Ended::Stopped,
            ended = listen_once(&config, &sender, attempted_before, &mut first_listen) => ended,
        };
        let Ended::Lost { error, listened } = ended else {
            return;
        };
        tracing::warn!(%error, "the event listener lost PostgreSQL; reconnecting");
        // The first attempt failed: whoever waits in `listen` stops waiting.
        if let Some(first_listen) = first_listen.take() {
            let _ = first_listen.send(());
        }
        attempted_before = true;
        if listened {
            backoff = RECONNECT_BACKOFF_MIN;
        }
        tokio::select! {
            _ = &mut stopped => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(RECONNECT_BACKOFF_MAX);
    }
}

/// Connects, listens and forwards notices until the connection ends.
async fn listen_once(
    config: &tokio_postgres::Config,
    sender: &broadcast::Sender<Notice>,
    announce: bool,
    first_listen: &mut Option<oneshot::Sender<()>>,
) -> Ended {
    let (client, mut connection) = match connect_unpooled(config).await {
        Ok(pair) => pair,
        Err(error) => {
            return Ended::Lost {
                error: error.to_string(),
                listened: false,
            };
        }
    };
    // The connection is driven by a task of its own so the client's LISTEN can run while it
    // forwards notifications; the task ends with the connection.
    let (notifications, mut received) = mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(notification)) => {
                    if notifications.send(notification).is_err() {
                        return "the listener is gone".to_owned();
                    }
                }
                Ok(AsyncMessage::Notice(notice)) => {
                    tracing::debug!(message = notice.message(), "PostgreSQL notice");
                }
                Ok(_) => {}
                Err(error) => return error.to_string(),
            }
        }
        "the connection closed".to_owned()
    });
    let mut driver = AbortOnDrop(driver);
    let listened = forward(client, &mut received, sender, announce, first_listen).await;
    let was_listening = listened.is_ok();
    let error = match listened {
        Err(error) => error,
        // The driver has ended (it dropped its sender): its answer is why.
        Ok(()) => (&mut driver.0)
            .await
            .unwrap_or_else(|error| format!("the listening connection's task failed: {error}")),
    };
    Ended::Lost {
        error,
        listened: was_listening,
    }
}

/// Aborts the connection's task when listening ends in any way, cancellation included.
struct AbortOnDrop(tokio::task::JoinHandle<String>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Listens, then forwards notices until the connection's task ends; `Err` when the `LISTEN`
/// itself failed.
async fn forward(
    client: tokio_postgres::Client,
    received: &mut mpsc::UnboundedReceiver<tokio_postgres::Notification>,
    sender: &broadcast::Sender<Notice>,
    announce: bool,
    first_listen: &mut Option<oneshot::Sender<()>>,
) -> Result<(), String> {
    if let Err(error) = client.batch_execute(&format!("LISTEN {CHANNEL}")).await {
        return Err(error.to_string());
    }
    if announce {
        let _ = sender.send(Notice::Reconnected);
    }
    if let Some(first_listen) = first_listen.take() {
        let _ = first_listen.send(());
    }
    while let Some(notification) = received.recv().await {
        match parse_notice_payload(notification.payload()) {
            Some(notice) => {
                // No subscriber right now is not an error.
                let _ = sender.send(notice);
            }
            None => tracing::warn!(
                payload = notification.payload(),
                "ignored a malformed event notice"
            ),
        }
    }
    // The driver ended: the connection is gone. `client` is dropped here, not earlier, so the
    // LISTEN stays in place while notices flow.
    drop(client);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notice_payloads_parse_or_are_rejected() {
        let appended = |session_id: &str, seq| {
            Some(Notice::Appended {
                session_id: session_id.to_owned(),
                seq,
            })
        };
        let table: &[(&str, Option<Notice>)] = &[
            ("s1 7", appended("s1", 7)),
            ("a b c 18446744073709551615", appended("a b c", u64::MAX)),
            ("s1 0", None),
            ("s1 -1", None),
            ("s1 18446744073709551616", None),
            ("s1", None),
            (" 5", None),
            ("", None),
            ("s1 7x", None),
            ("s1 ", None),
        ];
        for (payload, expected) in table {
            assert_eq!(&parse_notice_payload(payload), expected, "{payload:?}");
        }
    }
}
