//! The model proxy on a Unix socket per session (`model.sock` in the session's run directory,
//! at `/run/warren/model.sock` inside the sandbox), for hands with a network of their own: their
//! execd forwards a loopback port of the sandbox to it (`warren execd --forward`), so the agent
//! reaches the proxy at `http://127.0.0.1:4180`. Only the proxy's routes answer there;
//! everything else is 404. One listener per session, replaced when the session's brain starts
//! again and stopped when the session goes away.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::{Ledger, ModelProxy};

/// The running listeners, by session id.
#[derive(Default)]
pub struct ModelSockets {
    by_session: Mutex<HashMap<String, tokio::task::AbortHandle>>,
}

impl ModelSockets {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, tokio::task::AbortHandle>> {
        self.by_session
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Serves `proxy` for `ledger`'s sessions at `path` for `session_id` (replacing an earlier
    /// listener). The socket is connectable by any uid: its directory is private to the
    /// sandbox's.
    pub fn serve(
        &self,
        proxy: Arc<ModelProxy>,
        ledger: Arc<dyn Ledger>,
        session_id: &str,
        path: &Path,
        config: warren_http::ServeConfig,
    ) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        if let Some(old) = self.map().remove(session_id) {
            old.abort();
        }
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = tokio::net::UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
        let router = crate::router(proxy, ledger).fallback(|| async {
            // As the gateway's own listener answers a route it does not have.
            warren_http::error_response(axum::http::StatusCode::NOT_FOUND, "NOT_FOUND", "not found")
        });
        let task = tokio::spawn(async move {
            let never = std::future::pending::<()>();
            if let Err(e) = warren_http::serve(listener, router, config, never).await {
                tracing::warn!(error = %e, "the model socket stopped");
            }
        });
        self.map()
            .insert(session_id.to_owned(), task.abort_handle());
        Ok(())
    }

    /// Stops the session's listener, if any.
    pub fn stop(&self, session_id: &str) {
        if let Some(task) = self.map().remove(session_id) {
            task.abort();
        }
    }

    /// Stops every listener (shutdown).
    pub fn stop_all(&self) {
        for (_, task) in self.map().drain() {
            task.abort();
        }
    }
}
