//! The [`warren_brain::Host`] of a session's hands: the agent's `fs/*` and `terminal/*`
//! requests served by the running hands' execd through the typed client, files through
//! Warren's `/v1/files`, terminals through `/v1/terminals` (the exec engine: raw bytes, real
//! exit codes and signal names). Every request is a use of the hands ([`Hands::endpoint`]): it
//! starts, thaws or restores them first.
//!
//! Paths: an agent on the host sees the workspace at its absolute path on the gateway's disk,
//! an agent in the hands where execd does (`/workspace` in a bwrap sandbox): the `cwd` of
//! `session/new`. A path is checked to lie inside it and then rewritten beneath the root
//! execd sees before anything is sent. With [`Hands::set_empty_missing_reads`] (Gemini), a
//! read of a missing file answers empty content instead of an error.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use warren_brain::{
    BoxFuture, Host, HostError, TerminalExit, TerminalOutput, TerminalSpec, select_lines,
};
use warren_execd_client::{ClientError, ExecdClient};
use warren_protocol::terminal::TerminalCreate;

use super::Hands;

/// How long one `terminal/wait_for_exit` poll waits in execd before asking again.
const EXIT_POLL: Duration = Duration::from_secs(60);

impl Hands {
    fn terminals(&self) -> std::sync::MutexGuard<'_, HashMap<String, ExecdClient>> {
        self.terminals
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn terminal(&self, terminal_id: &str) -> Result<ExecdClient, HostError> {
        self.terminals()
            .get(terminal_id)
            .cloned()
            .ok_or_else(|| HostError::NotFound(format!("terminal {terminal_id}")))
    }

    /// Checks that `path` is absolute and inside the workspace (lexically; execd enforces the
    /// rest without following links out) and returns it beneath `root`, execd's view of the
    /// workspace.
    fn execd_path(&self, path: &Path, root: &str) -> Result<String, HostError> {
        if !path.is_absolute() {
            return Err(HostError::Invalid(format!(
                "path {} is not absolute",
                path.display()
            )));
        }
        let mut normal = PathBuf::new();
        for component in path.components() {
            match component {
                Component::ParentDir => {
                    normal.pop();
                }
                Component::CurDir => {}
                other => normal.push(other),
            }
        }
        // The agent on the host sees the workspace at its path on the gateway's disk; an agent
        // inside the hands sees it where execd does.
        let relative = normal
            .strip_prefix(self.workspace())
            .or_else(|_| normal.strip_prefix(root));
        let Ok(relative) = relative else {
            return Err(HostError::Invalid(format!(
                "path {} is outside the workspace {}",
                path.display(),
                self.workspace().display()
            )));
        };
        if relative.as_os_str().is_empty() {
            return Ok(root.to_string());
        }
        Ok(Path::new(root)
            .join(relative)
            .to_string_lossy()
            .into_owned())
    }

    /// The running hands' client and root (a use: starts, thaws or restores them first).
    async fn client_for_host(&self) -> Result<(ExecdClient, String), HostError> {
        let (endpoint, root) = self
            .endpoint_and_root()
            .await
            .map_err(|e| HostError::Failed(e.to_string()))?;
        let client = endpoint
            .client()
            .map_err(|e| HostError::Failed(e.to_string()))?;
        Ok((client, root))
    }

    async fn read_file(
        &self,
        path: PathBuf,
        line: Option<u32>,
        limit: Option<u32>,
    ) -> Result<String, HostError> {
        // Hands first: they create the workspace, which path resolution needs.
        let (client, root) = self.client_for_host().await?;
        let execd_path = self.execd_path(&path, &root)?;
        let bytes = match client.read_file(&execd_path).await {
            Ok(bytes) => bytes,
            Err(e) => match host_error(e, &path) {
                // Gemini reads a file before it creates it and fails the write on an error.
                HostError::NotFound(_) if self.empty_missing_reads() => return Ok(String::new()),
                error => return Err(error),
            },
        };
        let text = String::from_utf8(bytes.to_vec())
            .map_err(|_| HostError::Invalid(format!("{} is not UTF-8 text", path.display())))?;
        Ok(select_lines(&text, line, limit))
    }

    async fn write_file(&self, path: PathBuf, content: String) -> Result<(), HostError> {
        // Hands first: they create the workspace, which path resolution needs.
        let (client, root) = self.client_for_host().await?;
        let execd_path = self.execd_path(&path, &root)?;
        client
            .write_file(&execd_path, content)
            .await
            .map_err(|e| host_error(e, &path))
    }

    async fn start_terminal(&self, spec: TerminalSpec) -> Result<String, HostError> {
        let (client, root) = self.client_for_host().await?;
        let cwd = match &spec.cwd {
            Some(cwd) => self.execd_path(cwd, &root)?,
            None => root.clone(),
        };
        let create = TerminalCreate {
            command: spec.command,
            args: spec.args,
            env: spec.env.into_iter().collect(),
            cwd: Some(cwd.clone()),
            output_byte_limit: spec.output_byte_limit,
        };
        let created = client
            .create_terminal(&create)
            .await
            .map_err(|e| host_error(e, Path::new(&cwd)))?;
        self.terminals().insert(created.terminal_id.clone(), client);
        Ok(created.terminal_id)
    }

    async fn output(&self, terminal_id: &str, wait: Duration) -> Result<TerminalOutput, HostError> {
        let client = self.terminal(terminal_id)?;
        let output = client
            .terminal_output(terminal_id, wait)
            .await
            .map_err(|e| host_error(e, Path::new(terminal_id)))?;
        Ok(TerminalOutput {
            output: output.output,
            truncated: output.truncated,
            exit: output.exit_status.map(|status| TerminalExit {
                exit_code: status.exit_code,
                signal: status.signal,
            }),
        })
    }
}

/// The one place execd's answers become the agent's errors.
pub fn host_error(error: ClientError, subject: &Path) -> HostError {
    let subject = subject.display();
    match error {
        ClientError::Api {
            status, message, ..
        } if status == reqwest::StatusCode::NOT_FOUND => {
            HostError::NotFound(format!("{subject}: {message}"))
        }
        ClientError::Api {
            status, message, ..
        } if status.is_client_error() => HostError::Invalid(format!("{subject}: {message}")),
        other => HostError::Failed(format!("{subject}: {other}")),
    }
}

impl Host for Hands {
    fn read_text_file(
        &self,
        path: PathBuf,
        line: Option<u32>,
        limit: Option<u32>,
    ) -> BoxFuture<'_, Result<String, HostError>> {
        Box::pin(self.read_file(path, line, limit))
    }

    fn write_text_file(
        &self,
        path: PathBuf,
        content: String,
    ) -> BoxFuture<'_, Result<(), HostError>> {
        Box::pin(self.write_file(path, content))
    }

    fn create_terminal(&self, spec: TerminalSpec) -> BoxFuture<'_, Result<String, HostError>> {
        Box::pin(self.start_terminal(spec))
    }

    fn terminal_output(
        &self,
        terminal_id: String,
    ) -> BoxFuture<'_, Result<TerminalOutput, HostError>> {
        Box::pin(async move { self.output(&terminal_id, Duration::ZERO).await })
    }

    fn wait_for_terminal_exit(
        &self,
        terminal_id: String,
    ) -> BoxFuture<'_, Result<TerminalExit, HostError>> {
        Box::pin(async move {
            loop {
                if let Some(exit) = self.output(&terminal_id, EXIT_POLL).await?.exit {
                    return Ok(exit);
                }
            }
        })
    }

    fn kill_terminal(&self, terminal_id: String) -> BoxFuture<'_, Result<(), HostError>> {
        Box::pin(async move {
            let client = self.terminal(&terminal_id)?;
            client
                .kill_terminal(&terminal_id)
                .await
                .map_err(|e| host_error(e, Path::new(&terminal_id)))
        })
    }

    fn release_terminal(&self, terminal_id: String) -> BoxFuture<'_, Result<(), HostError>> {
        Box::pin(async move {
            let client = self.terminal(&terminal_id)?;
            let released = client.release_terminal(&terminal_id).await;
            self.terminals().remove(&terminal_id);
            match released {
                // The hands that ran it are gone, and the terminal with them.
                Err(ClientError::Api { status, .. })
                    if status == reqwest::StatusCode::NOT_FOUND =>
                {
                    Ok(())
                }
                other => other.map_err(|e| host_error(e, Path::new(&terminal_id))),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_lines_follows_acp_line_and_limit() {
        let text = "a\nb\nc\n";
        let cases = [
            (None, None, "a\nb\nc\n"),
            (Some(2), None, "b\nc\n"),
            (Some(2), Some(1), "b\n"),
            (None, Some(2), "a\nb\n"),
            (Some(9), None, ""),
            (Some(0), Some(1), "a\n"),
        ];
        for (line, limit, expected) in cases {
            assert_eq!(
                select_lines(text, line, limit),
                expected,
                "line {line:?} limit {limit:?}"
            );
        }
    }

    #[test]
    fn paths_outside_the_workspace_are_refused_and_inside_ones_rewritten_beneath_execds_root() {
        let provider = crate::remote::RemoteHands::new("http://127.0.0.1:9/{session}", "t", None);
        let hands = Hands::new(
            std::sync::Arc::new(provider),
            "s1",
            Path::new("/w/s1"),
            crate::BrainPlacement::Host,
        );
        let cases = [
            ("/w/s1/workspace/a.txt", Some("/workspace/a.txt")),
            ("/w/s1/workspace/sub/../b.txt", Some("/workspace/b.txt")),
            ("/w/s1/workspace", Some("/workspace")),
            ("/w/s1/workspace/../../s2/workspace/a.txt", None),
            ("/w/s1/meta.json", None),
            ("relative.txt", None),
            ("/etc/passwd", None),
        ];
        for (path, expected) in cases {
            assert_eq!(
                hands
                    .execd_path(Path::new(path), "/workspace")
                    .ok()
                    .as_deref(),
                expected,
                "{path}"
            );
        }
    }
}
