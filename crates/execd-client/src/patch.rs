//! `POST /v1/workspace/patch`: a rewind of the hands' tree to a checkpoint the gateway holds,
//! as a patch (`warren_checkpoint::CheckpointStore::patch`) streamed in the body. Over the
//! client without an overall timeout, like a restore: a patch is as long as what changed.

use warren_protocol::hands::PatchResult;

use crate::{ClientError, ExecdClient, Tree};

impl ExecdClient {
    /// `POST /v1/workspace/patch?tree=…`: applies `body` (a patch) to `tree`. Nothing in the
    /// tree changes unless the whole patch arrived and checked out; 409 `PATCH_STALE` says the
    /// tree changed since the checkpoint the patch was made against.
    pub async fn patch(&self, tree: Tree, body: reqwest::Body) -> Result<PatchResult, ClientError> {
        let request = self
            .request_on(
                &self.streaming,
                reqwest::Method::POST,
                "/v1/workspace/patch",
            )
            .query(&[("tree", tree.name())])
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(body);
        self.send(request).await
    }
}
