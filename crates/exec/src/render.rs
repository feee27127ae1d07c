//! The Codex text layout of a result: the MCP text content and the HTTP `text` field.
//!
//! ```text
//! Chunk ID: 3fa91c
//! Wall time: 0.5123 seconds
//! Process exited with code 0            (or: Process running with session ID 48213)
//! Original token count: 8991
//! Output:
//! <output>
//! ```
//! Warren adds `Process is waiting for input` after the status line when that is the case.

use std::fmt::Write;

use warren_protocol::exec::{ExecResult, ExecStatus};

/// Renders `result` (its `text` field is ignored).
pub fn render_text(result: &ExecResult) -> String {
    let mut text = String::with_capacity(result.output.len() + 160);
    // Writing to a String cannot fail.
    let _ = writeln!(text, "Chunk ID: {}", result.chunk_id);
    let _ = writeln!(text, "Wall time: {:.4} seconds", result.wall_time_seconds);
    match (result.status, result.session_id, result.exit_code) {
        (ExecStatus::Exited, _, code) => {
            let _ = writeln!(text, "Process exited with code {}", code.unwrap_or(-1));
        }
        (_, Some(id), _) => {
            let _ = writeln!(text, "Process running with session ID {id}");
        }
        (_, None, _) => {
            let _ = writeln!(text, "Process running");
        }
    }
    if result.status == ExecStatus::AwaitingInput {
        text.push_str("Process is waiting for input\n");
    }
    let _ = writeln!(
        text,
        "Original token count: {}",
        result.original_token_count
    );
    text.push_str("Output:\n");
    text.push_str(&result.output);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(status: ExecStatus, exit_code: Option<i32>, session_id: Option<u32>) -> ExecResult {
        ExecResult {
            chunk_id: "3fa91c".into(),
            wall_time_seconds: 0.51234,
            status,
            exit_code,
            signal: None,
            session_id,
            original_token_count: 2,
            output: "hi\n".into(),
            output_file: None,
            text: String::new(),
        }
    }

    #[test]
    fn renders_the_codex_layout_for_each_status() {
        let table = [
            (
                result(ExecStatus::Exited, Some(0), None),
                "Chunk ID: 3fa91c\nWall time: 0.5123 seconds\nProcess exited with code 0\nOriginal token count: 2\nOutput:\nhi\n",
            ),
            (
                result(ExecStatus::Running, None, Some(48213)),
                "Chunk ID: 3fa91c\nWall time: 0.5123 seconds\nProcess running with session ID 48213\nOriginal token count: 2\nOutput:\nhi\n",
            ),
            (
                result(ExecStatus::AwaitingInput, None, Some(7)),
                "Chunk ID: 3fa91c\nWall time: 0.5123 seconds\nProcess running with session ID 7\nProcess is waiting for input\nOriginal token count: 2\nOutput:\nhi\n",
            ),
        ];
        for (input, expected) in table {
            assert_eq!(render_text(&input), expected);
        }
    }
}
