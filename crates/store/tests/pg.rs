//! The PostgreSQL store against a real PostgreSQL: each test takes a fresh database of the
//! shared cluster (or, for the restart fault, a cluster of its own), and two `Store`s on one
//! database stand for two gateway replicas.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::{Barrier, broadcast};
use warren_store::admission::{Admit, HeldSlot};
use warren_store::events::{EventRow, Notice, Notices};
use warren_store::leases::Acquired;
use warren_store::pg::{Store, StoreError};
use warren_test_support::services::{Postgres, free_port};

/// How long any single wait of these tests may take.
const WAIT: Duration = Duration::from_secs(10);

/// A fresh database on the shared cluster: its URL and its name (for `psql`).
async fn fresh_database() -> (String, String) {
    let url = tokio::task::spawn_blocking(|| Postgres::shared().fresh_database())
        .await
        .expect("the shared cluster makes a database");
    let name = url.rsplit('/').next().expect("a database name").to_owned();
    (url, name)
}

async fn connect(url: &str) -> Store {
    tokio::time::timeout(WAIT, Store::connect(url))
        .await
        .expect("connect finishes in time")
        .expect("connects and migrates")
}

/// Two replicas on one fresh database.
async fn two_replicas() -> (Store, Store) {
    let (url, _) = fresh_database().await;
    let a = connect(&url).await;
    let b = connect(&url).await;
    (a, b)
}

fn row(seq: u64) -> EventRow {
    EventRow {
        seq,
        kind: "message".to_owned(),
        json: format!(r#"{{"n":{seq}}}"#),
    }
}

fn rows(seqs: std::ops::RangeInclusive<u64>) -> Vec<EventRow> {
    seqs.map(row).collect()
}

async fn next_notice(receiver: &mut broadcast::Receiver<Notice>, expected: &str) -> Notice {
    tokio::time::timeout(WAIT, receiver.recv())
        .await
        .unwrap_or_else(|_| panic!("no notice in time; expected {expected}"))
        .unwrap_or_else(|error| panic!("the notices ended ({error}); expected {expected}"))
}

/// Waits until `check` holds, polling; panics saying `what` when it never does.
async fn wait_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + WAIT;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---- pg: connecting, errors, migrations

#[tokio::test]
async fn urls_that_are_not_postgres_urls_are_invalid() {
    for url in [
        "",
        "file:/var/lib/warren",
        "http://127.0.0.1:5432/db",
        "postgres://h:99999999/db",
    ] {
        let error = Store::connect(url).await.expect_err("a bad URL is refused");
        assert!(
            matches!(error, StoreError::Invalid(_)),
            "{url:?}: {error:?}"
        );
    }
}

#[tokio::test]
async fn a_server_that_is_not_there_is_unavailable_within_seconds() {
    let url = format!("postgres://warren@127.0.0.1:{}/warren", free_port());
    let error = tokio::time::timeout(WAIT, Store::connect(&url))
        .await
        .expect("connect gives up in time")
        .expect_err("nothing listens there");
    assert!(error.is_unavailable(), "{error:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_replicas_starting_together_apply_each_migration_once() {
    let (url, name) = fresh_database().await;
    let connects = (0..4).map(|_| {
        let url = url.clone();
        tokio::spawn(async move { Store::connect(&url).await })
    });
    for connect in futures_util::future::join_all(connects).await {
        connect
            .expect("the connect task ends")
            .expect("every replica connects");
    }
    // A later start finds everything applied.
    connect(&url).await;
    let applied = tokio::task::spawn_blocking(move || {
        Postgres::shared().psql(
            &name,
            "SELECT version || ':' || count(*) FROM warren_schema GROUP BY version ORDER BY version",
        )
    })
    .await
    .expect("psql runs");
    assert_eq!(applied.trim().replace('\n', " "), "1:1 2:1 3:1");
}

#[tokio::test]
async fn text_postgres_rejects_as_data_is_invalid_not_unavailable() {
    let (store, _) = two_replicas().await;
    let error = store
        .put_device("a\0b", &json!({}))
        .await
        .expect_err("a NUL in text is refused");
    assert!(matches!(error, StoreError::Invalid(_)), "{error:?}");
}

// ---- events

#[tokio::test]
async fn an_empty_stream_is_at_seq_zero_and_an_empty_append_is_ok() {
    let (store, _) = two_replicas().await;
    assert_eq!(store.last_event_seq("s").await.expect("reads"), 0);
    store.append_events("s", &[]).await.expect("no rows is ok");
    assert_eq!(
        store.read_events_after("s", 0, 10).await.expect("reads"),
        vec![]
    );
}

#[tokio::test]
async fn events_are_read_after_a_seq_in_order_up_to_a_limit_and_deleted() {
    let (store, _) = two_replicas().await;
    store
        .append_events("s", &rows(1..=3))
        .await
        .expect("appends");
    store
        .append_events("s", &rows(4..=5))
        .await
        .expect("appends");
    store
        .append_events("other", &rows(1..=1))
        .await
        .expect("appends");
    assert_eq!(store.last_event_seq("s").await.expect("reads"), 5);
    assert_eq!(
        store.read_events_after("s", 1, 2).await.expect("reads"),
        rows(2..=3)
    );
    assert_eq!(
        store.read_events_after("s", 0, 100).await.expect("reads"),
        rows(1..=5)
    );
    assert_eq!(
        store
            .read_events_after("s", u64::MAX, 100)
            .await
            .expect("reads"),
        vec![]
    );
    assert_eq!(store.delete_events("s").await.expect("deletes"), 5);
    assert_eq!(store.last_event_seq("s").await.expect("reads"), 0);
    assert_eq!(store.last_event_seq("other").await.expect("reads"), 1);
}

#[tokio::test]
async fn a_duplicate_a_gap_or_unordered_rows_are_conflicts_and_write_nothing() {
    let (store, _) = two_replicas().await;
    store
        .append_events("s", &rows(1..=2))
        .await
        .expect("appends");
    let bad: &[(&str, Vec<EventRow>)] = &[
        ("a duplicate", rows(2..=3)),
        ("a gap", rows(4..=4)),
        ("a gap inside", vec![row(3), row(5)]),
        ("unordered", vec![row(4), row(3)]),
        ("seq 0 on a new stream", rows(0..=0)),
    ];
    for (what, bad_rows) in bad {
        let error = store
            .append_events("s", bad_rows)
            .await
            .expect_err("refused");
        assert!(
            matches!(error, StoreError::Conflict(_)),
            "{what}: {error:?}"
        );
    }
    let error = store
        .append_events("new", &rows(0..=0))
        .await
        .expect_err("seq 0 refused");
    assert!(matches!(error, StoreError::Conflict(_)), "{error:?}");
    let error = store
        .append_events("s", &[row(u64::MAX)])
        .await
        .expect_err("refused");
    assert!(matches!(error, StoreError::Invalid(_)), "{error:?}");
    let error = store
        .append_events("", &rows(1..=1))
        .await
        .expect_err("an empty session id is refused");
    assert!(matches!(error, StoreError::Invalid(_)), "{error:?}");
    assert_eq!(
        store.read_events_after("s", 0, 100).await.expect("reads"),
        rows(1..=2)
    );
}

#[tokio::test]
async fn an_append_whose_notice_cannot_be_sent_writes_nothing() {
    let (store, _) = two_replicas().await;
    // PostgreSQL refuses a notice payload of 8000 bytes or more.
    let session_id = "s".repeat(9000);
    let error = store
        .append_events(&session_id, &rows(1..=1))
        .await
        .expect_err("refused");
    assert!(matches!(error, StoreError::Invalid(_)), "{error:?}");
    assert_eq!(store.last_event_seq(&session_id).await.expect("reads"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_appended_on_one_replica_are_noticed_and_read_on_another() {
    let (a, b) = two_replicas().await;
    let notices = b.listen().await;
    let mut receiver = notices.subscribe();
    a.append_events("s", &rows(1..=2)).await.expect("appends");
    a.append_events("s", &rows(3..=3)).await.expect("appends");
    // Each notice names the last seq of its append, in commit order; by the time it arrives
    // its rows are readable on B.
    let mut read: Vec<EventRow> = Vec::new();
    for expected_seq in [2, 3] {
        let notice = next_notice(&mut receiver, "an Appended notice").await;
        assert_eq!(
            notice,
            Notice::Appended {
                session_id: "s".to_owned(),
                seq: expected_seq
            }
        );
        let after = read.last().map_or(0, |row| row.seq);
        read.extend(b.read_events_after("s", after, 100).await.expect("B reads"));
        assert!(
            read.last().is_some_and(|row| row.seq >= expected_seq),
            "B reads up to seq {expected_seq}"
        );
    }
    assert_eq!(read, rows(1..=3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_notice_is_ignored() {
    let (url, name) = fresh_database().await;
    let store = connect(&url).await;
    let notices = store.listen().await;
    let mut receiver = notices.subscribe();
    tokio::task::spawn_blocking(move || {
        let psql = |sql: &str| Postgres::shared().psql(&name, sql);
        psql("NOTIFY warren_events, 'garbage'");
        psql("NOTIFY warren_events, 's -4'");
        psql("NOTIFY warren_events, ''");
    })
    .await
    .expect("psql runs");
    store
        .append_events("s", &rows(1..=1))
        .await
        .expect("appends");
    assert_eq!(
        next_notice(&mut receiver, "the real append's notice").await,
        Notice::Appended {
            session_id: "s".to_owned(),
            seq: 1
        }
    );
}

#[tokio::test]
async fn the_listener_ends_when_its_notices_are_dropped() {
    let (store, _) = two_replicas().await;
    let notices: Notices = store.listen().await;
    let clone = notices.clone();
    let mut receiver = notices.subscribe();
    drop(notices);
    store
        .append_events("s", &rows(1..=1))
        .await
        .expect("appends");
    assert!(
        matches!(
            next_notice(&mut receiver, "a notice while a clone lives").await,
            Notice::Appended { .. }
        ),
        "a clone keeps the listener"
    );
    drop(clone);
    let ended = tokio::time::timeout(WAIT, receiver.recv())
        .await
        .expect("the listener ends in time");
    assert_eq!(ended, Err(broadcast::error::RecvError::Closed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_appenders_win_each_seq_exactly_once() {
    const N_APPENDERS: usize = 8;
    const N_SEQS: u64 = 20;
    let (a, b) = two_replicas().await;
    let barrier = Arc::new(Barrier::new(N_APPENDERS));
    let appenders = (0..N_APPENDERS).map(|appender| {
        let store = if appender % 2 == 0 {
            a.clone()
        } else {
            b.clone()
        };
        let barrier = barrier.clone();
        tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for seq in 1..=N_SEQS {
                barrier.wait().await;
                let event = EventRow {
                    seq,
                    kind: "message".to_owned(),
                    json: format!(r#"{{"by":{appender}}}"#),
                };
                outcomes.push(store.append_events("s", &[event]).await);
                // Everyone has tried this seq before anyone tries the next one.
                barrier.wait().await;
            }
            outcomes
        })
    });
    let outcomes = futures_util::future::join_all(appenders).await;
    for seq in 1..=N_SEQS {
        let index = usize::try_from(seq - 1).expect("small");
        let mut n_won = 0;
        for outcomes in &outcomes {
            match &outcomes.as_ref().expect("the appender ends")[index] {
                Ok(()) => n_won += 1,
                Err(StoreError::Conflict(_)) => {}
                Err(error) => panic!("seq {seq}: only conflicts may lose: {error:?}"),
            }
        }
        assert_eq!(n_won, 1, "seq {seq} is won exactly once");
    }
    let stored = a.read_events_after("s", 0, 1000).await.expect("reads");
    let seqs: Vec<u64> = stored.iter().map(|row| row.seq).collect();
    assert_eq!(
        seqs,
        (1..=N_SEQS).collect::<Vec<_>>(),
        "no gap, no duplicate"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_is_unavailable_then_works_and_the_listener_reconnects() {
    let mut postgres = tokio::task::spawn_blocking(|| {
        let postgres = Postgres::start();
        postgres.psql("postgres", "CREATE DATABASE warren");
        postgres
    })
    .await
    .expect("starts a cluster");
    let url = postgres.url("warren");
    let store = connect(&url).await;
    let notices = store.listen().await;
    let mut receiver = notices.subscribe();
    store
        .append_events("s", &rows(1..=1))
        .await
        .expect("appends");
    assert!(matches!(
        next_notice(&mut receiver, "the first append's notice").await,
        Notice::Appended { seq: 1, .. }
    ));

    let mut postgres = tokio::task::spawn_blocking(move || {
        postgres.stop();
        postgres
    })
    .await
    .expect("stops the cluster");
    let append = tokio::time::timeout(WAIT, store.append_events("s", &rows(2..=2)))
        .await
        .expect("an append while stopped does not hang");
    assert!(
        append.as_ref().is_err_and(StoreError::is_unavailable),
        "{append:?}"
    );
    let read = tokio::time::timeout(WAIT, store.read_events_after("s", 0, 10))
        .await
        .expect("a read while stopped does not hang");
    assert!(
        read.as_ref().is_err_and(StoreError::is_unavailable),
        "{read:?}"
    );
    let last = tokio::time::timeout(WAIT, store.last_event_seq("s"))
        .await
        .expect("no hang");
    assert!(
        last.as_ref().is_err_and(StoreError::is_unavailable),
        "{last:?}"
    );

    let postgres = tokio::task::spawn_blocking(move || {
        postgres.start_again();
        postgres
    })
    .await
    .expect("starts the cluster again");
    assert_eq!(
        next_notice(&mut receiver, "Reconnected after the restart").await,
        Notice::Reconnected
    );
    store
        .append_events("s", &rows(2..=2))
        .await
        .expect("appends after the restart");
    assert_eq!(
        store.read_events_after("s", 0, 10).await.expect("reads"),
        rows(1..=2)
    );
    assert_eq!(
        next_notice(&mut receiver, "the new append's notice").await,
        Notice::Appended {
            session_id: "s".to_owned(),
            seq: 2
        }
    );
    drop(postgres);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_started_while_postgres_is_down_says_reconnected_once_it_listens() {
    let mut postgres = tokio::task::spawn_blocking(|| {
        let postgres = Postgres::start();
        postgres.psql("postgres", "CREATE DATABASE warren");
        postgres
    })
    .await
    .expect("starts a cluster");
    let store = connect(&postgres.url("warren")).await;
    postgres = tokio::task::spawn_blocking(move || {
        postgres.stop();
        postgres
    })
    .await
    .expect("stops the cluster");
    let notices = tokio::time::timeout(WAIT, store.listen())
        .await
        .expect("listen returns while PostgreSQL is down");
    let mut receiver = notices.subscribe();
    let postgres = tokio::task::spawn_blocking(move || {
        postgres.start_again();
        postgres
    })
    .await
    .expect("starts the cluster again");
    assert_eq!(
        next_notice(&mut receiver, "Reconnected once listening").await,
        Notice::Reconnected
    );
    store
        .append_events("s", &rows(1..=1))
        .await
        .expect("appends");
    assert!(matches!(
        next_notice(&mut receiver, "the append's notice").await,
        Notice::Appended { seq: 1, .. }
    ));
    drop(postgres);
}

// ---- leases

const TTL: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquires_from_two_replicas_make_exactly_one_owner() {
    let (a, b) = two_replicas().await;
    let acquires = (0..50).map(|n| {
        let (store, replica_id) = if n % 2 == 0 {
            (a.clone(), "a")
        } else {
            (b.clone(), "b")
        };
        tokio::spawn(async move {
            store
                .acquire_lease("s", replica_id, &format!("http://{replica_id}"), TTL)
                .await
        })
    });
    let mut owners = BTreeSet::new();
    let mut holders = BTreeSet::new();
    for acquired in futures_util::future::join_all(acquires).await {
        match acquired
            .expect("the task ends")
            .expect("acquires or is refused")
        {
            Acquired::Owned {
                lease,
                took_over_from,
            } => {
                assert_eq!(took_over_from, None);
                assert_eq!(lease.epoch, 1);
                owners.insert(lease.replica_id);
            }
            Acquired::HeldBy {
                replica_id,
                replica_url,
                ..
            } => {
                assert_eq!(replica_url, format!("http://{replica_id}"));
                holders.insert(replica_id);
            }
        }
    }
    assert_eq!(owners.len(), 1, "one owner: {owners:?}");
    assert!(
        holders.is_subset(&owners),
        "refusals name the owner: {holders:?}"
    );
}

#[tokio::test]
async fn a_replica_that_lost_its_lease_cannot_append_after_the_new_owner() {
    let (a, b) = two_replicas().await;
    let Acquired::Owned { lease: old, .. } = a
        .acquire_lease("s", "a", "http://a", Duration::from_secs(1))
        .await
        .expect("acquires")
    else {
        panic!("a free session is owned");
    };
    a.append_events_fenced("s", &rows(1..=2), Some(&old))
        .await
        .expect("the holder appends");
    // a stalls past its lease; b takes the session over and goes on from what a committed.
    wait_until("a's lease has expired", || async {
        matches!(b.lease_holder("s").await, Ok(Some((_, _, None))))
    })
    .await;
    let Acquired::Owned { lease: new, .. } = b
        .acquire_lease("s", "b", "http://b", TTL)
        .await
        .expect("acquires")
    else {
        panic!("an expired lease is taken");
    };
    // a wakes with events queued at the next seq: refused, though the seq is free.
    let refused = a
        .append_events_fenced("s", &rows(3..=3), Some(&old))
        .await
        .expect_err("a's lease is gone");
    assert!(matches!(refused, StoreError::Conflict(_)), "{refused:?}");
    assert_eq!(a.last_event_seq("s").await.expect("reads"), 2);
    b.append_events_fenced("s", &rows(3..=4), Some(&new))
        .await
        .expect("the new owner appends");
    let wrong_session = warren_store::leases::Lease {
        session_id: "other".into(),
        ..new.clone()
    };
    assert!(matches!(
        b.append_events_fenced("s", &rows(5..=5), Some(&wrong_session))
            .await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(b.last_event_seq("s").await.expect("reads"), 4);
}

#[tokio::test]
async fn an_expired_lease_is_taken_over_and_its_old_holder_cannot_renew() {
    let (a, b) = two_replicas().await;
    let Acquired::Owned { lease: old, .. } = a
        .acquire_lease("s", "a", "http://a", Duration::from_secs(1))
        .await
        .expect("acquires")
    else {
        panic!("a free session is owned");
    };
    let refused = b
        .acquire_lease("s", "b", "http://b", TTL)
        .await
        .expect("answers");
    let Acquired::HeldBy {
        replica_id,
        replica_url,
        expires_in,
    } = refused
    else {
        panic!("an unexpired lease is held: {refused:?}");
    };
    assert_eq!(
        (replica_id.as_str(), replica_url.as_str()),
        ("a", "http://a")
    );
    assert!(expires_in <= Duration::from_secs(1), "{expires_in:?}");
    wait_until("a's lease has expired", || async {
        matches!(b.lease_holder("s").await, Ok(Some((_, _, None))))
    })
    .await;
    let taken = b
        .acquire_lease("s", "b", "http://b", TTL)
        .await
        .expect("acquires");
    let Acquired::Owned {
        lease,
        took_over_from,
    } = taken
    else {
        panic!("an expired lease is taken: {taken:?}");
    };
    assert_eq!(took_over_from.as_deref(), Some("a"));
    assert_eq!((lease.replica_id.as_str(), lease.epoch), ("b", 2));
    assert!(
        !a.renew_lease(&old, TTL).await.expect("answers"),
        "a lost it"
    );
    let (holder, url, left) = a.lease_holder("s").await.expect("reads").expect("held");
    assert_eq!((holder.as_str(), url.as_str()), ("b", "http://b"));
    assert!(
        left.is_some_and(|left| left > Duration::from_secs(20)),
        "{left:?}"
    );
}

#[tokio::test]
async fn renewing_extends_a_lease_and_reacquiring_keeps_its_epoch() {
    let (a, _) = two_replicas().await;
    let Acquired::Owned { lease, .. } = a
        .acquire_lease("s", "a", "http://a", Duration::from_secs(1))
        .await
        .expect("acquires")
    else {
        panic!("a free session is owned");
    };
    assert!(a.renew_lease(&lease, TTL).await.expect("renews"));
    let (_, _, left) = a.lease_holder("s").await.expect("reads").expect("held");
    assert!(
        left.is_some_and(|left| left > Duration::from_secs(20)),
        "{left:?}"
    );
    let again = a
        .acquire_lease("s", "a", "http://a", TTL)
        .await
        .expect("acquires");
    assert_eq!(
        again,
        Acquired::Owned {
            lease: lease.clone(),
            took_over_from: None
        }
    );
}

#[tokio::test]
async fn a_released_lease_is_taken_at_once_without_a_takeover() {
    let (a, b) = two_replicas().await;
    let Acquired::Owned { lease, .. } = a
        .acquire_lease("s", "a", "http://a", TTL)
        .await
        .expect("acquires")
    else {
        panic!("a free session is owned");
    };
    assert!(a.release_lease(&lease).await.expect("releases"));
    assert_eq!(b.lease_holder("s").await.expect("reads"), None);
    assert!(
        !a.renew_lease(&lease, TTL).await.expect("answers"),
        "released"
    );
    let taken = b
        .acquire_lease("s", "b", "http://b", TTL)
        .await
        .expect("acquires");
    let Acquired::Owned {
        lease: taken,
        took_over_from,
    } = taken
    else {
        panic!("a released lease is free: {taken:?}");
    };
    assert_eq!(took_over_from, None, "nothing was running");
    assert_eq!(taken.epoch, 2, "epochs continue");
    assert!(
        !a.release_lease(&lease).await.expect("answers"),
        "not a's any more"
    );
    assert_eq!(
        b.lease_holder("s").await.expect("reads").map(|h| h.0),
        Some("b".to_owned())
    );
}

#[tokio::test]
async fn a_lease_that_expired_but_was_not_taken_is_renewed() {
    let (a, _) = two_replicas().await;
    let Acquired::Owned { lease, .. } = a
        .acquire_lease("s", "a", "http://a", Duration::from_millis(200))
        .await
        .expect("acquires")
    else {
        panic!("a free session is owned");
    };
    wait_until("the lease has expired", || async {
        matches!(a.lease_holder("s").await, Ok(Some((_, _, None))))
    })
    .await;
    assert!(
        a.renew_lease(&lease, TTL).await.expect("renews"),
        "nobody took it"
    );
    let (holder, _, left) = a.lease_holder("s").await.expect("reads").expect("held");
    assert_eq!(holder, "a");
    assert!(left.is_some(), "unexpired again");
}

#[tokio::test]
async fn a_session_never_leased_has_no_holder() {
    let (a, _) = two_replicas().await;
    assert_eq!(a.lease_holder("nobody").await.expect("reads"), None);
}

// ---- admission

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_session_creations_across_replicas_never_exceed_the_device_limit() {
    let (a, b) = two_replicas().await;
    let creations = (0..50).map(|n| {
        let store = if n % 2 == 0 { a.clone() } else { b.clone() };
        tokio::spawn(async move {
            store
                .create_session_within(&format!("s{n}"), "d", &json!({ "n": n }), 20)
                .await
        })
    });
    let (mut n_admitted, mut n_refused) = (0, 0);
    for admit in futures_util::future::join_all(creations).await {
        match admit.expect("the task ends").expect("answers") {
            Admit::Admitted => n_admitted += 1,
            Admit::DeviceLimit { limit: 20 } => n_refused += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((n_admitted, n_refused), (20, 30));
    let sessions = a.load_sessions().await.expect("loads");
    assert_eq!(
        sessions
            .iter()
            .filter(|(_, device, _)| device == "d")
            .count(),
        20
    );
}

#[tokio::test]
async fn sessions_are_created_read_updated_and_deleted() {
    let (a, _) = two_replicas().await;
    let admit = a
        .create_session_within("s1", "d", &json!({ "title": "one" }), 5)
        .await
        .expect("creates");
    assert_eq!(admit, Admit::Admitted);
    let again = a
        .create_session_within("s1", "d", &json!({}), 5)
        .await
        .expect_err("an existing id");
    assert!(matches!(again, StoreError::Conflict(_)), "{again:?}");
    assert!(
        a.update_session_meta("s1", &json!({ "title": "uno" }))
            .await
            .expect("updates")
    );
    assert!(
        !a.update_session_meta("none", &json!({}))
            .await
            .expect("answers")
    );
    assert_eq!(
        a.session_meta("s1").await.expect("reads"),
        Some(json!({ "title": "uno" }))
    );
    assert_eq!(
        a.load_sessions().await.expect("loads"),
        vec![("s1".to_owned(), "d".to_owned(), json!({ "title": "uno" }))]
    );
    assert!(a.delete_session("s1").await.expect("deletes"));
    assert!(!a.delete_session("s1").await.expect("answers"));
    assert_eq!(a.session_meta("s1").await.expect("reads"), None);
    assert_eq!(
        a.create_session_within("s2", "d", &json!({}), 0)
            .await
            .expect("answers"),
        Admit::DeviceLimit { limit: 0 }
    );
}

#[tokio::test]
async fn brain_slots_are_limited_per_device_and_freed_by_release_or_expiry() {
    let (a, b) = two_replicas().await;
    let slot = |session_id, device_id, token| HeldSlot {
        session_id,
        device_id,
        token,
    };
    let reserve = |store: &Store, session: &'static str, replica: &'static str, ttl| {
        let store = store.clone();
        async move {
            store
                .reserve_brain(slot(session, "d", "t1"), replica, 2, ttl)
                .await
                .expect("answers")
        }
    };
    assert_eq!(reserve(&a, "s1", "a", TTL).await, Admit::Admitted);
    assert_eq!(
        reserve(&b, "s2", "b", Duration::from_millis(300)).await,
        Admit::Admitted
    );
    assert_eq!(
        reserve(&a, "s3", "a", TTL).await,
        Admit::DeviceLimit { limit: 2 }
    );
    assert_eq!(
        reserve(&a, "s1", "a", TTL).await,
        Admit::Admitted,
        "its own slot"
    );
    assert_eq!(
        a.reserve_brain(slot("s9", "other", "t1"), "a", 2, TTL)
            .await
            .expect("answers"),
        Admit::Admitted,
        "another device"
    );
    // b stops renewing (it died): its slot frees itself.
    wait_until("b's slot has expired", || async {
        a.reserve_brain(slot("s3", "d", "t1"), "a", 2, TTL)
            .await
            .expect("answers")
            == Admit::Admitted
    })
    .await;
    assert_eq!(
        a.renew_brain_slots("a", &[slot("s1", "d", "t1"), slot("s3", "d", "t1")], TTL)
            .await
            .expect("renews"),
        2
    );
    assert_eq!(b.renew_brain_slots("b", &[], TTL).await.expect("renews"), 0);
    // A release names its reservation: an earlier one of the session frees nothing.
    assert!(!a.release_brain("s1", "t0").await.expect("answers"));
    assert!(a.release_brain("s1", "t1").await.expect("releases"));
    assert!(!a.release_brain("s1", "t1").await.expect("answers"));
    assert_eq!(reserve(&b, "s4", "b", TTL).await, Admit::Admitted);
    assert_eq!(
        reserve(&b, "s5", "b", TTL).await,
        Admit::DeviceLimit { limit: 2 }
    );
    // A renewal writes back a slot whose row went missing: the replica runs that brain.
    assert!(a.release_brain("s3", "t1").await.expect("releases"));
    assert_eq!(
        a.renew_brain_slots("a", &[slot("s3", "d", "t2")], TTL)
            .await
            .expect("renews"),
        1
    );
    assert_eq!(
        reserve(&b, "s5", "b", TTL).await,
        Admit::DeviceLimit { limit: 2 }
    );
    // A replica that shuts down frees all of its slots at once.
    assert_eq!(a.release_replica_brains("a").await.expect("releases"), 2);
    assert_eq!(reserve(&b, "s5", "b", TTL).await, Admit::Admitted);
}

// ---- records

#[tokio::test]
async fn a_device_is_replaced_only_while_its_record_is_the_expected_one() {
    let (a, b) = two_replicas().await;
    let first = json!({ "token_sha256": "aa", "n": 1 });
    assert!(a.put_device_if("d1", None, &first).await.expect("inserts"));
    assert!(
        !b.put_device_if("d1", None, &json!({ "n": 2 }))
            .await
            .expect("answers"),
        "a second first registration loses"
    );
    let second = json!({ "token_sha256": "bb", "n": 2 });
    assert!(
        b.put_device_if("d1", Some(&first), &second)
            .await
            .expect("replaces")
    );
    assert!(
        !a.put_device_if("d1", Some(&first), &json!({ "n": 3 }))
            .await
            .expect("answers"),
        "a replacement of a record that changed meanwhile loses"
    );
    assert_eq!(
        a.device_by_token_hash("bb").await.expect("finds"),
        Some(("d1".to_string(), second))
    );
    assert_eq!(a.device_by_token_hash("aa").await.expect("answers"), None);
    a.ping().await.expect("the database answers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_are_put_read_listed_and_deleted() {
    let (a, b) = two_replicas().await;
    a.put_device("d2", &json!({ "name": "two" }))
        .await
        .expect("puts");
    a.put_device("d1", &json!({ "name": "one" }))
        .await
        .expect("puts");
    a.put_device("d1", &json!({ "name": "uno" }))
        .await
        .expect("replaces");
    assert_eq!(
        b.device("d1").await.expect("reads"),
        Some(json!({ "name": "uno" }))
    );
    assert_eq!(b.device("none").await.expect("reads"), None);
    assert_eq!(
        b.devices().await.expect("lists"),
        vec![
            ("d1".to_owned(), json!({ "name": "uno" })),
            ("d2".to_owned(), json!({ "name": "two" }))
        ]
    );
    assert!(b.delete_device("d1").await.expect("deletes"));
    assert!(!b.delete_device("d1").await.expect("answers"));
    assert_eq!(b.devices().await.expect("lists").len(), 1);
}

#[tokio::test]
async fn preview_tokens_are_found_until_they_expire_or_their_session_goes() {
    let (a, b) = two_replicas().await;
    let now_ms = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_millis(),
    )
    .expect("fits");
    let hour_ms = 3_600_000;
    a.put_preview_token("h1", "s", &json!({ "port": 3000 }), now_ms + hour_ms)
        .await
        .expect("puts");
    a.put_preview_token("h2", "s", &json!({ "port": 3001 }), now_ms + hour_ms)
        .await
        .expect("puts");
    a.put_preview_token("old", "s", &json!({}), now_ms - hour_ms)
        .await
        .expect("puts");
    assert_eq!(
        b.preview_token("h1").await.expect("reads"),
        Some(("s".to_owned(), json!({ "port": 3000 })))
    );
    assert_eq!(
        b.preview_token("old").await.expect("reads"),
        None,
        "expired"
    );
    assert_eq!(b.preview_token("none").await.expect("reads"), None);
    assert_eq!(b.delete_preview_tokens("s").await.expect("deletes"), 3);
    assert_eq!(b.preview_token("h2").await.expect("reads"), None);
}

#[tokio::test]
async fn preview_tokens_of_one_port_are_deleted_and_no_others() {
    let (a, b) = two_replicas().await;
    let now_ms = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_millis(),
    )
    .expect("fits");
    let hour_ms = 3_600_000;
    let record = |port: u16| json!({ "port": port, "expires_at": "2100-01-01T00:00:00Z" });
    for (hash, session, port) in [("h1", "s", 3000), ("h2", "s", 3001), ("h3", "t", 3000)] {
        a.put_preview_token(hash, session, &record(port), now_ms + hour_ms)
            .await
            .expect("puts");
    }
    let port_3000 = json!({ "port": 3000 });
    assert_eq!(
        b.delete_preview_tokens_matching("s", &port_3000)
            .await
            .expect("deletes"),
        1
    );
    assert_eq!(b.preview_token("h1").await.expect("reads"), None);
    assert_eq!(
        b.preview_token("h2").await.expect("reads"),
        Some(("s".to_owned(), record(3001))),
        "another port stays"
    );
    assert_eq!(
        b.preview_token("h3").await.expect("reads"),
        Some(("t".to_owned(), record(3000))),
        "another session's stays"
    );
    assert_eq!(
        b.delete_preview_tokens_matching("s", &port_3000)
            .await
            .expect("answers"),
        0
    );
}
