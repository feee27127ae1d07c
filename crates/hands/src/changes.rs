//! `files_changed` events while the hands run (files-terminals-previews.md "Files").
//!
//! The changes come from execd's change feed (`GET /v1/files/watch`: inotify inside the
//! sandbox, through the `notify` crate). Watching rather than diffing after each tool call,
//! because the agents that matter run their tools inside their own process (no tool call
//! reaches the gateway to diff after), a dev server or a background job writes files between
//! calls, and a diff costs a walk of the whole workspace each time while inotify costs nothing
//! when nothing changes. Watching inside the sandbox rather than on the gateway's copy of the
//! workspace, because remote hands have no such copy and the feed then sees exactly what the
//! sandbox sees. The feed is coalesced here: at most one event per [`MIN_INTERVAL`], at most
//! [`MAX_PATHS`] paths, `truncated` when more changed.

use std::collections::BTreeSet;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::time::Instant;
use warren_execd_client::ExecdClient;

/// The most paths one event carries.
pub const MAX_PATHS: usize = 100;
/// The shortest time between two events of one session.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// How long connecting to the feed may take before the hands go on without it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The paths changed since the last event.
#[derive(Debug, Default)]
struct Pending {
    paths: BTreeSet<String>,
    truncated: bool,
}

impl Pending {
    fn add(&mut self, paths: Vec<String>) {
        for path in paths {
            // execd's mark for "more changed than it could name" (or the kernel dropped events).
            if path.is_empty() {
                self.truncated = true;
                continue;
            }
            if self.paths.len() == MAX_PATHS {
                if !self.paths.contains(&path) {
                    self.truncated = true;
                }
                continue;
            }
            self.paths.insert(path);
        }
    }

    fn take(&mut self) -> Option<(Vec<String>, bool)> {
        if self.paths.is_empty() && !self.truncated {
            return None;
        }
        let paths = std::mem::take(&mut self.paths).into_iter().collect();
        Some((paths, std::mem::take(&mut self.truncated)))
    }
}

/// Connects to the execd's change feed and, once it is in place, forwards it coalesced to
/// `emit(paths, truncated)` until the feed ends (the sandbox stopped). Returns when the feed is
/// in place (or could not be: then nothing is reported, and the failure is logged).
pub async fn start(
    client: ExecdClient,
    session_id: String,
    emit: impl Fn(Vec<String>, bool) + Send + 'static,
) {
    let feed = match tokio::time::timeout(CONNECT_TIMEOUT, client.watch_files()).await {
        Ok(Ok(feed)) => feed,
        Ok(Err(e)) => {
            tracing::warn!(session = %session_id, error = %e, "no files_changed events: the hands' change feed is unavailable");
            return;
        }
        Err(_) => {
            tracing::warn!(session = %session_id, "no files_changed events: the hands' change feed did not answer");
            return;
        }
    };
    tokio::spawn(async move {
        let mut feed = feed;
        let mut pending = Pending::default();
        let mut last_emit: Option<Instant> = None;
        loop {
            let due = (!pending.paths.is_empty() || pending.truncated)
                .then(|| last_emit.map_or_else(Instant::now, |at| at + MIN_INTERVAL));
            tokio::select! {
                changes = feed.next() => match changes {
                    Some(Ok(changes)) => pending.add(changes.paths),
                    Some(Err(e)) => {
                        tracing::debug!(session = %session_id, error = %e, "change feed ended");
                        break;
                    }
                    None => break,
                },
                () = sleep_until(due) => {
                    if let Some((paths, truncated)) = pending.take() {
                        emit(paths, truncated);
                        last_emit = Some(Instant::now());
                    }
                }
            }
        }
        if let Some((paths, truncated)) = pending.take() {
            emit(paths, truncated);
        }
    });
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_paths_are_deduplicated_and_capped() {
        let mut pending = Pending::default();
        pending.add(vec!["a".into(), "b".into(), "a".into()]);
        assert_eq!(pending.take(), Some((vec!["a".into(), "b".into()], false)));
        assert_eq!(pending.take(), None);
        pending.add(vec!["".into(), "c".into()]);
        assert_eq!(pending.take(), Some((vec!["c".into()], true)));
        pending.add((0..150).map(|i| format!("f{i:03}")).collect());
        // A path already kept is no reason to say more changed.
        pending.add(vec!["f000".into()]);
        let (paths, truncated) = pending.take().expect("changes");
        assert_eq!(paths.len(), MAX_PATHS);
        assert!(truncated);
    }
}
