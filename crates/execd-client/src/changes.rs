//! `POST /v1/workspace/changes`: what changed in the hands' tree since a checkpoint the gateway
//! holds, as the stream `warren_checkpoint::produce` writes there, for
//! `CheckpointStore::take_streamed` here. Over the client without an overall timeout, like a
//! snapshot: the stream is as long as what changed.

use futures_util::Stream;
use warren_checkpoint::Known;

use crate::{ClientError, ExecdClient, Tree};

impl ExecdClient {
    /// `POST /v1/workspace/changes?tree=…` with `known` (`Manifest::known` of the tree's last
    /// checkpoint, `Known::default()` for a first one): the changes stream, chunk by chunk as
    /// execd walks the tree. A stream execd aborted (a failure midway, a cut connection) ends
    /// with an error item, never early with success; `take_streamed` also refuses a stream
    /// without its end record.
    pub async fn changes(
        &self,
        tree: Tree,
        known: &Known,
    ) -> Result<impl Stream<Item = Result<bytes::Bytes, ClientError>> + Send + 'static, ClientError>
    {
        let request = self
            .request_on(
                &self.streaming,
                reqwest::Method::POST,
                "/v1/workspace/changes",
            )
            .query(&[("tree", tree.name())])
            .json(known);
        let response = self.checked(request).await?;
        Ok(self.body_chunks(response, "checkpoint changes"))
    }
}
