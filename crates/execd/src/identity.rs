//! The hands' identity: `GET /v1/hands/identity` answers this execd's nonce and start time, and
//! [`require_matching_nonce`] refuses (409 `HANDS_IDENTITY_MISMATCH`) every request that
//! carries `X-Warren-Hands-Nonce` with another nonce, so a gateway that reconnects to a socket
//! or port now served by another sandbox finds out before anything runs there. Requests without
//! the header pass; `/ping` is checked like every other route.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use warren_protocol::hands::{HANDS_NONCE_HEADER, HandsIdentity};

use crate::error::ApiError;

/// Who this execd is; fixed at start.
#[derive(Debug, Clone)]
pub struct Identity {
    inner: Arc<HandsIdentity>,
}

impl Identity {
    /// `nonce`, or a random one, now as the start time, and the workspace `root`.
    pub fn new(nonce: Option<String>, root: &std::path::Path) -> Self {
        let nonce = nonce.unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
        let started_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let root = std::fs::canonicalize(root)
            .unwrap_or_else(|_| root.to_path_buf())
            .to_string_lossy()
            .into_owned();
        Self {
            inner: Arc::new(HandsIdentity {
                nonce,
                started_at,
                root,
            }),
        }
    }

    pub fn nonce(&self) -> &str {
        &self.inner.nonce
    }
}

pub fn routes(identity: Identity) -> OpenApiRouter {
    OpenApiRouter::new()
        .routes(routes!(identity_route))
        .with_state(identity)
}

/// This execd's nonce, start time and root.
#[utoipa::path(
    get, path = "/v1/hands/identity", tag = "hands",
    responses((status = 200, description = "Who this execd is", body = HandsIdentity))
)]
async fn identity_route(State(identity): State<Identity>) -> Json<HandsIdentity> {
    Json(HandsIdentity::clone(&identity.inner))
}

pub async fn require_matching_nonce(
    State(identity): State<Identity>,
    request: Request,
    next: Next,
) -> Response {
    match request.headers().get(HANDS_NONCE_HEADER) {
        Some(presented) if presented.as_bytes() != identity.nonce().as_bytes() => {
            ApiError::HandsIdentityMismatch.into_response()
        }
        _ => next.run(request).await,
    }
}
