//! `warren bench gateway --store postgres://…`: the session event log kept in PostgreSQL, next
//! to the file log's figures of the same run. Two connections to the database stand for two
//! replicas: the owner appends; the other follows through `LISTEN/NOTIFY` and reads the rows, as
//! a replica serving an SSE client of a session it does not own does. Measured: the append
//! rate, fan-out to 100 subscribers spread over both replicas (every event checked once and in
//! order on each), and the delay from an append on the owner to its delivery on the other
//! replica (p50/p99). Each run writes a session id of its own and deletes its rows after.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use warren_gateway::event_log::{EventLog, Subscription};
use warren_protocol::gateway::EventBody;
use warren_store::events::Notice;
use warren_store::health::StorageHealth;
use warren_store::pg::Store;

use super::gateway::{Row, percentile};

const N_APPENDS: u64 = 20_000;
const N_SUBSCRIBERS: usize = 100;
const N_FANOUT_EVENTS: u64 = 2_000;
const N_LATENCY_SAMPLES: usize = 200;

fn update() -> EventBody {
    EventBody::Update {
        update: serde_json::json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x".repeat(100)}}),
    }
}

fn session_id(what: &str) -> String {
    format!("bench-{what}-{}", uuid::Uuid::new_v4().simple())
}

async fn open(store: &Store, session: &str) -> anyhow::Result<EventLog> {
    EventLog::open_postgres(
        store.clone(),
        session,
        Arc::new(StorageHealth::default()),
        |_| {},
    )
    .await
    .context("opens the PostgreSQL event log")
}

/// Feeds `follower` from the notices of `store` until the task is aborted.
async fn follow(store: &Store, follower: Arc<EventLog>) -> tokio::task::JoinHandle<()> {
    let notices = store.listen().await;
    tokio::spawn(async move {
        let mut rx = notices.subscribe();
        loop {
            match rx.recv().await {
                Ok(Notice::Appended { .. } | Notice::Reconnected)
                | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    let _ = follower.follow().await;
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    })
}

/// Receives `n` events on `subscription` and checks they are 1..=n, once each, in order.
async fn drain(mut subscription: Subscription, n: u64) -> anyhow::Result<()> {
    let mut expected = 1;
    for event in subscription.backlog.drain(..) {
        anyhow::ensure!(
            event.seq == expected,
            "seq {} where {expected} was due",
            event.seq
        );
        expected += 1;
    }
    while expected <= n {
        let event = tokio::time::timeout(Duration::from_secs(60), subscription.live.recv())
            .await
            .context("an event within 60 s")?
            .context("the subscription ended early")?;
        anyhow::ensure!(
            event.seq == expected,
            "seq {} where {expected} was due",
            event.seq
        );
        expected += 1;
    }
    Ok(())
}

pub async fn rows(url: &str) -> anyhow::Result<Vec<Row>> {
    let a = Store::connect(url)
        .await
        .context("connects to the store (replica A)")?;
    let b = Store::connect(url)
        .await
        .context("connects to the store (replica B)")?;
    let mut sessions = Vec::new();
    let result = async {
        let mut rows = Vec::new();

        let session = session_id("append");
        sessions.push(session.clone());
        let log = open(&a, &session).await?;
        let started = Instant::now();
        for _ in 0..N_APPENDS {
            log.append(Some(1), update())?;
        }
        log.sync().await?;
        let elapsed = started.elapsed();
        rows.push(Row {
            what: "event-log append, PostgreSQL".into(),
            value: format!("{:.0} events/s", N_APPENDS as f64 / elapsed.as_secs_f64()),
            note: format!(
                "{N_APPENDS} events of ~200 B, timed until all are committed; batches of up to \
                 512 per transaction, each with its NOTIFY"
            ),
        });

        let session = session_id("fanout");
        sessions.push(session.clone());
        let owner = open(&a, &session).await?;
        let follower = Arc::new(open(&b, &session).await?);
        let following = follow(&b, follower.clone()).await;
        let mut drains = Vec::new();
        for i in 0..N_SUBSCRIBERS {
            let log = if i % 2 == 0 { &owner } else { &*follower };
            let subscription = log
                .subscribe(0)
                .map_err(|e| anyhow::anyhow!("subscribe: {e:?}"))?;
            drains.push(tokio::spawn(drain(subscription, N_FANOUT_EVENTS)));
        }
        let started = Instant::now();
        for _ in 0..N_FANOUT_EVENTS {
            owner.append(Some(1), update())?;
            // A steady producer, not one burst: the subscribers' queues hold 512 events.
            if owner.last_seq() % 256 == 0 {
                owner.sync().await?;
            }
        }
        owner.sync().await?;
        for drain in drains {
            drain.await??;
        }
        let elapsed = started.elapsed();
        following.abort();
        rows.push(Row {
            what: "fan-out to 100 subscribers over two replicas, PostgreSQL".into(),
            value: format!(
                "{:.0} deliveries/s",
                (N_FANOUT_EVENTS * N_SUBSCRIBERS as u64) as f64 / elapsed.as_secs_f64()
            ),
            note: format!(
                "{N_FANOUT_EVENTS} events, 50 in-process subscribers of the log on the owner and 50 on the other \
                 replica (LISTEN/NOTIFY, rows read back); each got every event once, in order"
            ),
        });

        let session = session_id("latency");
        sessions.push(session.clone());
        let owner = open(&a, &session).await?;
        let follower = Arc::new(open(&b, &session).await?);
        let following = follow(&b, follower.clone()).await;
        let mut subscription = follower
            .subscribe(0)
            .map_err(|e| anyhow::anyhow!("subscribe: {e:?}"))?;
        let mut samples = Vec::with_capacity(N_LATENCY_SAMPLES);
        for i in 1..=N_LATENCY_SAMPLES as u64 {
            let started = Instant::now();
            owner.append(Some(1), update())?;
            let event = tokio::time::timeout(Duration::from_secs(30), subscription.live.recv())
                .await
                .context("the event reaches the other replica within 30 s")?
                .context("the subscription ended early")?;
            anyhow::ensure!(event.seq == i, "seq {} where {i} was due", event.seq);
            samples.push(started.elapsed());
        }
        following.abort();
        rows.push(Row {
            what: "cross-replica delivery, PostgreSQL".into(),
            value: format!(
                "p50 {:.2} ms, p99 {:.2} ms",
                percentile(&mut samples, 0.50).as_secs_f64() * 1e3,
                percentile(&mut samples, 0.99).as_secs_f64() * 1e3
            ),
            note: format!(
                "{N_LATENCY_SAMPLES} events one at a time: append on the owner to delivery on a \
                 subscriber of the other replica (commit, NOTIFY, read of the row)"
            ),
        });
        anyhow::Ok(rows)
    }
    .await;
    for session in &sessions {
        let _ = a.delete_events(session).await;
    }
    result
}
