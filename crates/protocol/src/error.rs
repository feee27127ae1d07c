//! The JSON error body every Warren REST route answers with: `{"code": "...", "message": "..."}`.

use serde::{Deserialize, Serialize};

/// A machine-readable `code` (upper snake case) plus a human message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: String,
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
