//! [`BrainSession`]: one ACP session on its own worker. Runs turns (`session/prompt`), cancels
//! them (`session/cancel`), and stops the worker (`session/close`, then kill).

use std::sync::Arc;

use agent_client_protocol::v1::schema::{
    CancelNotification, ContentBlock, PromptRequest, SessionId, TextContent,
};

use tokio_util::sync::CancellationToken;

use crate::BrainError;
use crate::worker::{Connection, close_session};

/// ACP's stop reason of a cancelled turn.
const STOP_CANCELLED: &str = "cancelled";
/// The `_meta` key that marks a prompt block as Warren's notice, not the person's text.
pub const NOTICE_META_KEY: &str = "warren/notice";
/// Its value for "the hands were reset" (hands.md "Restore").
pub const HANDS_RESET_NOTICE: &str = "hands_reset";
/// The notice after a rewind: the workspace became a checkpoint's.
pub const REWOUND_NOTICE: &str = "rewound";
/// Beside a `rewound` notice: the checkpoint's id.
pub const CHECKPOINT_META_KEY: &str = "warren/checkpoint";

/// Something Warren tells the agent before the person's text, in a block of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// `_meta["warren/notice"]`: [`HANDS_RESET_NOTICE`] or [`REWOUND_NOTICE`].
    pub kind: &'static str,
    pub text: String,
    /// `_meta["warren/checkpoint"]`, for a rewind.
    pub checkpoint: Option<String>,
}

/// How [`crate::Worker::resume_session`] continued the conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resumed {
    /// `session/resume` succeeded: the agent kept its context.
    Resumed,
    /// `session/load` succeeded: the agent rebuilt its context from its own history.
    Loaded,
    /// Neither was possible: a new ACP session; the agent's earlier context is lost.
    ContextLost,
}

/// A live ACP session bound to one worker process.
pub struct BrainSession {
    conn: Arc<Connection>,
    session_id: SessionId,
    acp_session_id: String,
    turn: tokio::sync::Mutex<()>,
}

impl BrainSession {
    pub(crate) fn new(conn: Arc<Connection>, session_id: SessionId) -> Self {
        let acp_session_id = session_id.0.to_string();
        Self {
            conn,
            session_id,
            acp_session_id,
            turn: tokio::sync::Mutex::new(()),
        }
    }

    /// The agent's session id (store it to resume after the worker is stopped).
    pub fn acp_session_id(&self) -> &str {
        &self.acp_session_id
    }

    /// The agent process id.
    pub fn pid(&self) -> u32 {
        self.conn.pid()
    }

    /// False once the agent process has exited.
    pub fn is_alive(&self) -> bool {
        self.conn.exit_status().is_none()
    }

    /// Resolves with the exit status once the agent process has exited.
    pub async fn exited(&self) -> String {
        self.conn.wait_exit().await
    }

    /// Whether the agent can continue this session in a later worker (`session/resume` or
    /// `session/load`).
    pub fn can_resume(&self) -> bool {
        self.conn.caps.resume_session || self.conn.caps.load_session
    }

    /// Runs one turn: sends `text` as the prompt and returns ACP's stop reason (`end_turn`,
    /// `cancelled`, `max_tokens`, `refusal`, ...). Every `session/update` of the turn has reached
    /// the sink when this returns. One turn at a time ([`BrainError::TurnInProgress`]).
    pub async fn prompt(&self, text: String) -> Result<String, BrainError> {
        self.prompt_cancellable(text, Vec::new(), &CancellationToken::new())
            .await
    }

    /// [`prompt`](Self::prompt) that `cancel` ends. Fired before the prompt was sent, nothing is
    /// sent and the stop reason is `cancelled`; fired later, pending permission requests are
    /// answered `cancelled`, `session/cancel` follows the prompt, and the agent's own stop reason
    /// comes back. The token is a latch, so a cancel is never lost between the check and the send.
    ///
    /// `notices` (the hands were reset, the workspace rewound) go first, each as its own text
    /// block marked `_meta: {"warren/notice": kind}` (and `"warren/checkpoint"` after a
    /// rewind), so an agent can tell them from the person's text.
    pub async fn prompt_cancellable(
        &self,
        text: String,
        notices: Vec<Notice>,
        cancel: &CancellationToken,
    ) -> Result<String, BrainError> {
        if cancel.is_cancelled() {
            return Ok(STOP_CANCELLED.to_owned());
        }
        let _turn = self
            .turn
            .try_lock()
            .map_err(|_| BrainError::TurnInProgress)?;
        self.conn.shared.start_turn();
        let mut prompt = Vec::with_capacity(notices.len() + 1);
        for notice in notices {
            let mut meta = serde_json::Map::new();
            meta.insert(NOTICE_META_KEY.into(), notice.kind.into());
            if let Some(checkpoint) = notice.checkpoint {
                meta.insert(CHECKPOINT_META_KEY.into(), checkpoint.into());
            }
            prompt.push(ContentBlock::Text(TextContent::new(notice.text).meta(meta)));
        }
        prompt.push(ContentBlock::Text(TextContent::new(text)));
        let request = PromptRequest::new(self.session_id.clone(), prompt);
        let conn = &self.conn;
        // `send_request` queues the prompt at once: a `session/cancel` sent below always reaches
        // the agent after it, never before (where the agent would ignore it).
        let response = conn.cx.send_request(request).block_task();
        let answered = async {
            let mut response = std::pin::pin!(response);
            tokio::select! {
                biased;
                result = &mut response => return result,
                () = cancel.cancelled() => {}
            }
            self.send_cancel();
            response.await
        };
        let response = conn.call("session/prompt", None, answered).await?;
        let stop_reason = match serde_json::to_value(response.stop_reason) {
            Ok(serde_json::Value::String(reason)) => reason,
            Ok(other) => other.to_string(),
            Err(error) => format!("unknown ({error})"),
        };
        Ok(stop_reason)
    }

    /// Cancels the running turn: pending permission requests are answered `cancelled` and
    /// `session/cancel` is sent. The running [`prompt`](Self::prompt) then returns the agent's
    /// stop reason (`cancelled` for a well-behaved agent). A turn whose prompt may not have been
    /// sent yet is cancelled with the token of [`prompt_cancellable`](Self::prompt_cancellable).
    pub async fn cancel(&self) {
        self.send_cancel();
    }

    fn send_cancel(&self) {
        self.conn.shared.cancel_pending();
        if let Err(error) = self
            .conn
            .cx
            .send_notification(CancelNotification::new(self.session_id.clone()))
        {
            tracing::debug!(%error, "cannot send session/cancel");
        }
    }

    /// Stops the worker: `session/close` if the agent supports it, then kills its process group.
    pub async fn close(self) {
        close_session(&self.conn, self.session_id.clone()).await;
        self.conn.kill().await;
    }

    /// Kills the agent's whole process tree now, while a turn may still hold this session (its
    /// prompt then fails with the worker's exit).
    pub async fn kill(&self) {
        self.conn.kill().await;
    }
}
