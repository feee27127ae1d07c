//! The `remote` provider (`--hands-provider remote`): hands on another machine, a container or
//! a pod that something else runs, one execd per session at `--hands-url-template` (`{session}`
//! is replaced by the session id), reached with `--hands-token`. The gateway assumes no local
//! process: it learns the execd's nonce from `GET /v1/hands/identity` when it connects, sends it
//! on every request (another sandbox at that address answers 409), and watches the identity:
//! an execd that stops answering, or answers with another nonce, makes the hands `lost`, and the
//! next use connects again. Remote hands cannot be frozen (they are never paused or archived);
//! snapshots, restore, files and terminals use the same routes as local hands. With
//! `--snapshots` their snapshots are in object storage, so the files of hands whose machine is
//! gone are still read from there; they are never restored by themselves, since no local
//! directory tells whether their files are still on their machine.
//!
//! A gateway that stops lets go of its remote hands and touches nothing in them, so their
//! processes and files outlive it (tests/gateway/remote_netns.rs). The next gateway adopts
//! nothing at start (its sessions' hands read `none`) and connects again on first use. The nonce
//! the execd last reported is kept in the session's meta (the file or the store's row), so that
//! gateway, or another replica taking the session over, tells an execd replaced at the URL while
//! no gateway watched from the same one: the hands come up `reset`, with the notice for the
//! agent.

use std::time::Duration;

use tokio::sync::watch;
use warren_brain::BoxFuture;
use warren_execd_client::ExecdClient;

use warren_store::objects::Objects;

use super::{HandsEndpoint, HandsError, HandsInstance, HandsProvider, Isolation, StartSpec};

/// How often a remote execd's identity is checked while the session uses it.
const WATCH_PERIOD: Duration = Duration::from_secs(2);
/// Failed identity checks in a row before the hands count as lost.
const MAX_MISSES: u32 = 3;

/// Hands at a URL per session.
#[derive(Clone)]
pub struct RemoteHands {
    template: String,
    token: String,
    /// `--snapshots`: the hands' snapshots in object storage, readable by every replica.
    snapshots: Option<Objects>,
}

impl std::fmt::Debug for RemoteHands {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteHands")
            .field("template", &self.template)
            .field("token", &"<redacted>")
            .finish()
    }
}

impl RemoteHands {
    pub fn new(
        template: impl Into<String>,
        token: impl Into<String>,
        snapshots: Option<Objects>,
    ) -> RemoteHands {
        RemoteHands {
            template: template.into(),
            token: token.into(),
            snapshots,
        }
    }

    fn url_for(&self, session_id: &str) -> String {
        self.template
            .replace("{session}", session_id)
            .trim_end_matches('/')
            .to_string()
    }

    async fn connect(&self, session_id: &str) -> Result<RemoteInstance, HandsError> {
        let url = self.url_for(session_id);
        let client = ExecdClient::new(&url, Some(self.token.clone()))
            .map_err(|e| HandsError::Start(format!("{url}: {e}")))?;
        let identity = client
            .identity()
            .await
            .map_err(|e| HandsError::Start(format!("remote hands at {url}: {e}")))?;
        let endpoint = HandsEndpoint {
            url,
            token: self.token.clone(),
            nonce: identity.nonce,
        };
        let (exit_tx, exit_rx) = watch::channel(None);
        let watched = endpoint.client()?;
        let watcher = tokio::spawn(async move {
            let mut misses = 0;
            loop {
                tokio::time::sleep(WATCH_PERIOD).await;
                match watched.identity().await {
                    Ok(_) => misses = 0,
                    Err(e) if e.code() == Some("HANDS_IDENTITY_MISMATCH") => {
                        let _ = exit_tx.send(Some(format!("another sandbox answers: {e}")));
                        return;
                    }
                    Err(e) => {
                        misses += 1;
                        if misses >= MAX_MISSES {
                            let _ = exit_tx.send(Some(format!("remote hands unreachable: {e}")));
                            return;
                        }
                    }
                }
            }
        });
        tracing::info!(session = session_id, url = %endpoint.url, "remote hands connected");
        Ok(RemoteInstance {
            endpoint,
            root: identity.root,
            exit: exit_rx,
            watcher,
        })
    }
}

struct RemoteInstance {
    endpoint: HandsEndpoint,
    root: String,
    exit: watch::Receiver<Option<String>>,
    watcher: tokio::task::JoinHandle<()>,
}

impl HandsInstance for RemoteInstance {
    fn endpoint(&self) -> &HandsEndpoint {
        &self.endpoint
    }

    fn root(&self) -> &str {
        &self.root
    }

    fn isolation(&self) -> Isolation {
        Isolation::Remote
    }

    fn pid(&self) -> Option<u32> {
        None
    }

    fn exited(&self) -> watch::Receiver<Option<String>> {
        self.exit.clone()
    }

    fn can_pause(&self) -> bool {
        false
    }

    fn is_frozen(&self) -> bool {
        false
    }

    fn freeze(&self) -> BoxFuture<'_, Result<(), HandsError>> {
        Box::pin(async { Ok(()) })
    }

    fn thaw(&self) -> BoxFuture<'_, Result<(), HandsError>> {
        Box::pin(async { Ok(()) })
    }

    fn stop(self: Box<Self>) -> BoxFuture<'static, ()> {
        self.watcher.abort();
        Box::pin(async {})
    }

    fn detach(self: Box<Self>) {
        self.watcher.abort();
    }
}

impl HandsProvider for RemoteHands {
    fn isolation(&self) -> Isolation {
        Isolation::Remote
    }

    fn start(&self, spec: StartSpec) -> BoxFuture<'_, Result<Box<dyn HandsInstance>, HandsError>> {
        Box::pin(async move {
            let instance = self.connect(&spec.session_id).await?;
            Ok(Box::new(instance) as Box<dyn HandsInstance>)
        })
    }

    fn adopt(
        &self,
        _session_id: &str,
    ) -> BoxFuture<'_, Result<Option<Box<dyn HandsInstance>>, HandsError>> {
        // Remote hands are connected on first use; nothing was left behind here.
        Box::pin(async { Ok(None) })
    }

    fn stop_strays(&self, _live: &[String]) -> BoxFuture<'_, usize> {
        Box::pin(async { 0 })
    }

    fn forget(&self, _session_id: &str) {}

    fn network(&self) -> &'static str {
        "remote"
    }

    fn snapshot_objects(&self) -> Option<&Objects> {
        self.snapshots.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_names_each_sessions_execd() {
        let remote = RemoteHands::new("http://hands-{session}.warren.svc:44772/", "t", None);
        assert_eq!(remote.url_for("abc"), "http://hands-abc.warren.svc:44772");
        let debug = format!("{remote:?}");
        assert!(!debug.contains("\"t\""), "{debug}");
    }
}
