//! The PostgreSQL store the gateway replicas share: [`Store`] (a connection pool and the URL it
//! was made from), [`StoreError`] (every fault of the database said as one of three kinds), and
//! the schema migrations that [`Store::connect`] runs.
//!
//! Architecture Invariant: migrations are versioned and each is applied exactly once, however many
//! replicas start together: they run under a session-level advisory lock on a connection of
//! their own (outside the pool), so the lock ends with that connection even when a migration
//! fails half-way.
//!
//! Architecture Invariant: no fault of the database is a panic or a hang. Connecting has a short
//! timeout, waiting for a pooled connection has one too, and pooled connections are checked
//! before reuse; a stopped or unreachable server is [`StoreError::Unavailable`].
//!
//! The other modules (`events`, `leases`, `admission`, `records`) add their methods to
//! [`Store`]; this one owns only the pool, the errors and the schema.

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;

/// How long connecting to PostgreSQL may take, and how long a caller waits for a pooled
/// connection when all are busy.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a transaction may wait for its client's next statement before the server ends it.
/// Warren's transactions send their statements back to back: only a stalled replica waits.
const STALLED_TRANSACTION: Duration = Duration::from_secs(5);

/// The most connections one replica holds.
const MAX_CONNECTIONS: usize = 16;

/// The key of the session-level advisory lock migrations run under ("WARREN" and a 1).
const MIGRATION_LOCK_KEY: i64 = 0x5741_5252_454e_0001;

/// The schema, in order. A version is never reused or edited once released: a change is a new
/// migration.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "initial",
        sql: include_str!("../migrations/0001_initial.sql"),
    },
    Migration {
        version: 2,
        name: "device_tokens",
        sql: include_str!("../migrations/0002_device_tokens.sql"),
    },
    Migration {
        version: 3,
        name: "brain_slot_tokens",
        sql: include_str!("../migrations/0003_brain_slot_tokens.sql"),
    },
];

struct Migration {
    version: i32,
    name: &'static str,
    sql: &'static str,
}

/// Every fault of the store, in the kinds its callers act on.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// PostgreSQL cannot be reached or did not answer (refused, closed, timed out, shutting
    /// down, pool exhausted) or failed in a way the caller cannot fix; worth retrying later.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The write lost a race or breaks a uniqueness rule (a taken seq, an existing id).
    #[error("store conflict: {0}")]
    Conflict(String),
    /// The input can never succeed (a bad URL, a value PostgreSQL rejects as data).
    #[error("invalid store input: {0}")]
    Invalid(String),
    /// A file of the data directory could not be read or written (a full disk among others).
    #[error("store file: {0}")]
    File(#[from] std::io::Error),
}

impl StoreError {
    /// Whether this is [`StoreError::Unavailable`] (the gateway answers 503 `STORE_UNAVAILABLE`).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

/// Whether `error` carries a [`StoreError::Unavailable`] (what the PostgreSQL event log fails
/// with while the database is away).
pub fn is_store_unavailable(error: &std::io::Error) -> bool {
    error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<StoreError>())
        .is_some_and(|store| store.is_unavailable())
}

impl From<tokio_postgres::Error> for StoreError {
    /// A unique violation is a conflict and a data exception (class 22: bad encoding, a NUL in
    /// text, a value out of range) is invalid input; everything else, connection faults
    /// included, is unavailability.
    fn from(error: tokio_postgres::Error) -> StoreError {
        let message = error.to_string();
        match error.code() {
            Some(code) if *code == SqlState::UNIQUE_VIOLATION => StoreError::Conflict(message),
            Some(code) if code.code().starts_with("22") => StoreError::Invalid(message),
            _ => StoreError::Unavailable(message),
        }
    }
}

impl From<PoolError> for StoreError {
    fn from(error: PoolError) -> StoreError {
        match error {
            PoolError::Backend(error) => StoreError::from(error),
            PoolError::Timeout(kind) => {
                StoreError::Unavailable(format!("no store connection in time ({kind:?})"))
            }
            PoolError::Closed => StoreError::Unavailable("the connection pool is closed".into()),
            PoolError::NoRuntimeSpecified | PoolError::PostCreateHook(_) => {
                StoreError::Unavailable(error.to_string())
            }
        }
    }
}

/// The shared PostgreSQL store of a replica. Cloning is cheap: clones share one pool.
#[derive(Clone)]
pub struct Store {
    pub(crate) pool: Pool,
    /// The parsed URL, for connections outside the pool (migrations, the listener).
    pub(crate) config: std::sync::Arc<tokio_postgres::Config>,
    url: String,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password: only the pool's state is shown.
        formatter
            .debug_struct("Store")
            .field("pool", &self.pool.status())
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Parses `url` (`postgres://` or `postgresql://`), builds the pool and runs the migrations
    /// that are not applied yet.
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        let config = parse_url(url)?;
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                // A connection cut while idle (PostgreSQL restarted) fails this check and is
                // replaced instead of failing the caller's query.
                recycling_method: RecyclingMethod::Verified,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(MAX_CONNECTIONS)
            .wait_timeout(Some(CONNECT_TIMEOUT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .recycle_timeout(Some(CONNECT_TIMEOUT))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|error| StoreError::Invalid(format!("cannot build the pool: {error}")))?;
        migrate(&config).await?;
        Ok(Store {
            pool,
            config: std::sync::Arc::new(config),
            url: url.to_owned(),
        })
    }

    /// The URL this store was made from (it may carry a password: do not log it).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether the database answers a trivial query now (the gateway's storage watch probes
    /// with it while the store fails).
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.client().await?.simple_query("SELECT 1").await?;
        Ok(())
    }

    /// A pooled connection.
    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Client, StoreError> {
        Ok(self.pool.get().await?)
    }
}

/// The connection settings of `url`, with the timeouts and keepalives every connection uses.
fn parse_url(url: &str) -> Result<tokio_postgres::Config, StoreError> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(StoreError::Invalid(
            "the store URL must start with postgres:// or postgresql://".into(),
        ));
    }
    let mut config = tokio_postgres::Config::from_str(url)
        .map_err(|error| StoreError::Invalid(format!("bad store URL: {error}")))?;
    if config.get_hosts().is_empty() {
        return Err(StoreError::Invalid("the store URL names no host".into()));
    }
    config
        .connect_timeout(CONNECT_TIMEOUT)
        .application_name("warren")
        // A server that vanishes without closing its sockets is noticed in about 20 s rather
        // than never.
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(10))
        .keepalives_interval(Duration::from_secs(5))
        .keepalives_retries(2)
        .tcp_user_timeout(Duration::from_secs(20));
    // A replica stopped in the middle of a transaction (SIGSTOP, a swap storm) would hold its
    // row and advisory locks for ever, and every other replica's takeover and append would wait
    // on them: the server ends such a transaction instead.
    let stalled = format!(
        "-c idle_in_transaction_session_timeout={}",
        STALLED_TRANSACTION.as_millis()
    );
    let options = match config.get_options() {
        Some(own) if !own.is_empty() => format!("{own} {stalled}"),
        _ => stalled,
    };
    config.options(&options);
    Ok(config)
}

/// A connection of its own (not pooled), driven by a task that logs how it ended.
pub(crate) async fn connect_unpooled(
    config: &tokio_postgres::Config,
) -> Result<
    (
        tokio_postgres::Client,
        tokio_postgres::Connection<tokio_postgres::Socket, tokio_postgres::tls::NoTlsStream>,
    ),
    StoreError,
> {
    Ok(config.connect(NoTls).await?)
}

/// Applies every migration not recorded in `warren_schema`, each in its own transaction, under
/// an advisory lock held by a connection that ends when this returns.
async fn migrate(config: &tokio_postgres::Config) -> Result<(), StoreError> {
    let (mut client, connection) = connect_unpooled(config).await?;
    let driver = tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "the migration connection ended");
        }
    });
    let result = migrate_on(&mut client).await;
    // Dropping the client ends the session, and with it the advisory lock, whatever happened.
    drop(client);
    let _ = driver.await;
    result
}

async fn migrate_on(client: &mut tokio_postgres::Client) -> Result<(), StoreError> {
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK_KEY])
        .await?;
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS warren_schema (
                version integer PRIMARY KEY,
                name text NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now()
            )",
        )
        .await?;
    for migration in MIGRATIONS {
        let transaction = client.transaction().await?;
        let applied = transaction
            .query_opt(
                "SELECT 1 FROM warren_schema WHERE version = $1",
                &[&migration.version],
            )
            .await?
            .is_some();
        if applied {
            continue;
        }
        transaction.batch_execute(migration.sql).await?;
        transaction
            .execute(
                "INSERT INTO warren_schema (version, name) VALUES ($1, $2)",
                &[&migration.version, &migration.name],
            )
            .await?;
        transaction.commit().await?;
        tracing::info!(
            version = migration.version,
            name = migration.name,
            "applied a store migration"
        );
    }
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK_KEY])
        .await?;
    Ok(())
}

/// A count or limit as PostgreSQL's `bigint`; larger values saturate (no table holds that many
/// rows).
pub(crate) fn to_bigint(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A duration as whole milliseconds in `bigint`, saturating.
pub(crate) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// A row's `bigint` that must not be negative (seqs, counts); a negative one means the table was
/// written by something else and is said as such, not panicked on.
pub(crate) fn unsigned(value: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(value)
        .map_err(|_| StoreError::Unavailable(format!("the store holds a negative {what}: {value}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_that_are_not_postgres_urls_are_invalid() {
        for url in [
            "",
            "file:/var/lib/warren",
            "host=localhost user=warren",
            "mysql://warren@localhost/db",
            "postgres://warren@localhost:notaport/db",
            "postgres://warren@localhost/db?sslmode=nonsense",
        ] {
            assert!(
                matches!(parse_url(url), Err(StoreError::Invalid(_))),
                "{url:?} is invalid"
            );
        }
        assert!(parse_url("postgres://warren@127.0.0.1:5432/warren").is_ok());
        assert!(parse_url("postgresql://warren:secret@db.internal/warren").is_ok());
    }

    /// A replica stopped inside a transaction (its client sends nothing more) loses the
    /// transaction to the server after [`STALLED_TRANSACTION`], and with it the locks another
    /// replica's takeover waits for.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_transaction_whose_client_stalls_is_ended_and_frees_its_locks() {
        let url = tokio::task::spawn_blocking(|| {
            warren_test_support::services::Postgres::shared().fresh_database()
        })
        .await
        .expect("a database");
        let store = Store::connect(&url).await.expect("connects");
        let stalled = store.client().await.expect("a connection");
        stalled
            .batch_execute("BEGIN; SELECT pg_advisory_xact_lock(7)")
            .await
            .expect("takes the lock in a transaction");
        let waiting = store.client().await.expect("another connection");
        let started = std::time::Instant::now();
        let taken = tokio::time::timeout(
            STALLED_TRANSACTION * 4,
            waiting.batch_execute("BEGIN; SELECT pg_advisory_xact_lock(7); COMMIT"),
        )
        .await
        .expect("the lock is freed once the server ends the stalled transaction");
        taken.expect("takes the lock");
        assert!(
            started.elapsed() >= STALLED_TRANSACTION / 2,
            "{:?}",
            started.elapsed()
        );
        let after = stalled.batch_execute("COMMIT").await;
        assert!(
            after.is_err(),
            "the stalled transaction was ended: {after:?}"
        );
    }
}
