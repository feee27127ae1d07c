//! Bounded waits. Every wait ends after [`WAIT`] naming what it waited for; none sleeps to let
//! things settle. Polling (every 20 ms) is for state that no event announces: another
//! process's exit, a file appearing, a status route.

use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

/// How long any wait in the tests lasts before it fails. Generous, because the machine is shared
/// and loaded: it bounds a failure, it never delays a passing test.
pub const WAIT: Duration = Duration::from_secs(60);

const POLL: Duration = Duration::from_millis(20);

/// Awaits `future` for at most [`WAIT`]; the panic names `what` was expected.
pub async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    try_within(what, future)
        .await
        .unwrap_or_else(|timed_out| panic!("{timed_out}"))
}

/// Awaits `future` for at most [`WAIT`], for tests that return errors instead of panicking.
pub async fn try_within<T>(what: &str, future: impl Future<Output = T>) -> Result<T, TimedOut> {
    tokio::time::timeout(WAIT, future)
        .await
        .map_err(|_| TimedOut {
            what: what.to_owned(),
        })
}

/// A wait that lasted [`WAIT`]; it says what was expected.
#[derive(Debug)]
pub struct TimedOut {
    what: String,
}

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "timed out after {WAIT:?} waiting for {}", self.what)
    }
}

impl std::error::Error for TimedOut {}

/// Polls `condition` until it holds; panics after [`WAIT`] naming `what`.
pub async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    within(what, async {
        while !condition() {
            tokio::time::sleep(POLL).await;
        }
    })
    .await;
}

/// Polls the asynchronous `check` until it is [`Done`] (`true`, or `Some` value, which is
/// returned); panics after [`WAIT`] naming `what`.
pub async fn eventually_async<F, Fut>(what: &str, mut check: F) -> <Fut::Output as Done>::Value
where
    F: FnMut() -> Fut,
    Fut: Future,
    Fut::Output: Done,
{
    within(what, async {
        loop {
            if let Some(value) = check().await.done() {
                return value;
            }
            tokio::time::sleep(POLL).await;
        }
    })
    .await
}

/// [`eventually`] for code outside a runtime: blocks the thread while it polls.
pub fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {WAIT:?} waiting for {what}"
        );
        std::thread::sleep(POLL);
    }
}

/// What a polled check returns: `bool` (done when true) or `Option<T>` (done with its value).
pub trait Done {
    type Value;
    fn done(self) -> Option<Self::Value>;
}

impl Done for bool {
    type Value = ();
    fn done(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Done for Option<T> {
    type Value = T;
    fn done(self) -> Option<T> {
        self
    }
}
