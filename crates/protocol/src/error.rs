//! The JSON error body every Warren REST route answers with: `{"code": "...", "message": "..."}`.

use serde::{Deserialize, Serialize};

/// A machine-readable `code` (upper snake case) plus a human message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// Upper snake case, e.g. `INVALID_REQUEST_BODY`.
    #[schema(example = "INVALID_REQUEST_BODY")]
    pub code: String,
    /// For people; its wording may change.
    pub message: String,
}

impl ErrorBody {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
        }
    }
}
