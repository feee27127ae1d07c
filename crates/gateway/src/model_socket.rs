//! The model proxy on a Unix socket in a session's run directory (`model.sock`, at
//! `/run/warren/model.sock` inside the sandbox), for hands without a network
//! (`--hands-network none`): their execd forwards a loopback port of the sandbox to it
//! (`warren execd --forward`), so the agent reaches the proxy at `http://127.0.0.1:4180`.
//! Only the proxy's routes answer there; everything else is 404. One listener per session,
//! replaced when the session's brain starts again and stopped when the session goes away.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::engine::Engine;
use crate::error::GatewayError;

/// The file name of the socket in the session's run directory, and the sandbox-local port the
/// hands' execd forwards to it (the hands' side of the contract).
pub use warren_hands::local::{MODEL_PORT as FORWARD_PORT, MODEL_SOCKET as SOCKET_NAME};

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

    /// Serves the model proxy at `run_dir/model.sock` for `session_id` (replacing an earlier
    /// listener). The socket is connectable by the sandbox's uid: the run directory is
    /// already private to it.
    pub fn serve(
        &self,
        gateway: &Arc<Engine>,
        session_id: &str,
        run_dir: &Path,
    ) -> Result<(), GatewayError> {
        use std::os::unix::fs::PermissionsExt;
        let path = run_dir.join(SOCKET_NAME);
        if let Some(old) = self.map().remove(session_id) {
            old.abort();
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        let listener = tokio::net::UnixListener::bind(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
        let router = gateway
            .model_router()
            .fallback(|| async { GatewayError::RouteNotFound });
        let config = gateway.args.serve_config();
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

    /// Stops every listener (gateway shutdown).
    pub fn stop_all(&self) {
        for (_, task) in self.map().drain() {
            task.abort();
        }
    }
}
