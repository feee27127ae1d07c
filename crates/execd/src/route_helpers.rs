//! What several route modules share: a query that does not parse as Warren's usual 400, and a
//! confined file opened for download.

use std::io;

use axum::extract::Query;
use axum::extract::rejection::QueryRejection;

use crate::error::ApiError;
use crate::fs::resolve::{Part, Root, Want};

/// The query, or Warren's 400 for one that does not fit the route (axum's own rejection is
/// plain text).
pub(crate) fn query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    query
        .map(|Query(q)| q)
        .map_err(|e| warren_http::RequestError::InvalidQuery(e.body_text()).into())
}

/// The regular file at `parts` below `root`, opened through the confined walk, and its size
/// taken from that descriptor (so a file swapped midway can never make it read anything else).
pub(crate) fn open_file(root: &Root, parts: &[Part]) -> io::Result<(std::fs::File, u64)> {
    let (fd, _) = root.open(parts, Want::File)?;
    let file = std::fs::File::from(fd);
    let size = file.metadata()?.len();
    Ok((file, size))
}
