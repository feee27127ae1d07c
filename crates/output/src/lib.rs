//! The output pipeline for exec results: what a command printed, turned into something an agent
//! can read within its token budget. Each stage is a pure function with table tests:
//!
//! 1. [`capture`]: at most 1 MiB per chunk as head + tail, counting what was dropped, so the
//!    reader can keep draining and memory stays bounded.
//! 2. (The full raw log lives with the session in `warren-exec`.)
//! 3. [`binary`]: output with NUL bytes or mostly invalid UTF-8 is withheld.
//! 4. [`clean`]: terminal cleaning (redraws, backspace, cursor and erase sequences, colours,
//!    alternate screens).
//! 5. [`fold`]: head + tail folding to `max_output_tokens` (bytes / 4).
//!
//! [`render_chunk`] runs stages 3-5 on a captured chunk. Nothing here does I/O.

pub mod binary;
pub mod capture;
pub mod clean;
pub mod fold;
pub mod utf8;

pub use capture::{Captured, HeadTailCapture};
pub use fold::estimate_tokens;

/// Settings for [`render_chunk`].
#[derive(Debug, Clone, Copy)]
pub struct RenderOptions {
    pub max_output_tokens: u64,
    /// Screen size used to render alternate-screen programs and cursor addressing.
    pub rows: u16,
    pub cols: u16,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            max_output_tokens: 10_000,
            rows: 24,
            cols: 80,
        }
    }
}

/// One chunk of output ready to show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub text: String,
    /// Estimated tokens of the chunk before folding (after cleaning; dropped bytes count raw).
    pub original_token_count: u64,
    /// Some output is not in `text` (capture cap, folding or binary refusal).
    pub truncated: bool,
    /// Set when the chunk was withheld as binary: how many bytes.
    pub binary_bytes: Option<u64>,
}

/// Runs binary refusal, terminal cleaning and folding on a captured chunk.
pub fn render_chunk(captured: &Captured, options: RenderOptions) -> Rendered {
    let total = captured.total_bytes();
    if binary::is_binary(&captured.head) || binary::is_binary(&captured.tail) {
        return Rendered {
            text: binary::withheld_message(total),
            original_token_count: estimate_tokens(total),
            truncated: true,
            binary_bytes: Some(total),
        };
    }
    let head_raw = String::from_utf8_lossy(&captured.head);
    let tail_bytes = &captured.tail[utf8::first_char_boundary(&captured.tail)..];
    let tail_raw = String::from_utf8_lossy(tail_bytes);
    let head = clean::clean_terminal(&head_raw, options.rows, options.cols);
    let tail = clean::clean_terminal(&tail_raw, options.rows, options.cols);
    let input = fold::FoldInput {
        head: &head,
        gap_bytes: captured.dropped_bytes,
        gap_lines: captured.dropped_lines,
        tail: &tail,
    };
    let original = head.len() as u64 + captured.dropped_bytes + tail.len() as u64;
    let folded = fold::fold_to_tokens(input, options.max_output_tokens);
    Rendered {
        text: folded.text,
        original_token_count: estimate_tokens(original),
        truncated: folded.truncated,
        binary_bytes: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(bytes: &[u8], capture_bytes: usize, max_output_tokens: u64) -> Rendered {
        let mut capture = HeadTailCapture::new(capture_bytes);
        capture.push(bytes);
        let options = RenderOptions {
            max_output_tokens,
            ..RenderOptions::default()
        };
        render_chunk(&capture.take(false), options)
    }

    #[test]
    fn runs_every_stage_in_order() {
        let progress: Vec<u8> = (0..=100)
            .flat_map(|p| format!("\r{p:3}% [{}]", "#".repeat(p / 10)).into_bytes())
            .collect();
        let table: Vec<(Vec<u8>, usize, u64, &str, bool)> = vec![
            (b"hello\n".to_vec(), 1024, 100, "hello\n", false),
            (progress, 1 << 20, 100, "100% [##########]", false),
            (
                b"\x1b[1;31merror\x1b[0m\n".to_vec(),
                1024,
                100,
                "error\n",
                false,
            ),
            (
                b"a\0b".to_vec(),
                1024,
                100,
                "[binary output withheld: 3 bytes",
                true,
            ),
            (
                b"first\nmiddle\nmiddle\nmiddle\nlast\n".to_vec(),
                12,
                100,
                "Total output lines: 5\n\nfirst\n…6 tokens truncated…\nlast\n",
                true,
            ),
        ];
        for (bytes, capture_bytes, max_tokens, expected_start, truncated) in table {
            let rendered = render(&bytes, capture_bytes, max_tokens);
            assert!(
                rendered.text.starts_with(expected_start),
                "{:?} rendered as {:?}",
                String::from_utf8_lossy(&bytes),
                rendered.text
            );
            assert_eq!(rendered.truncated, truncated, "{:?}", rendered.text);
        }
    }

    #[test]
    fn original_token_count_is_measured_before_folding() {
        let rendered = render(&vec![b'x'; 4000], 1 << 20, 10);
        assert_eq!(rendered.original_token_count, 1000);
        assert!(rendered.text.len() < 200);
    }
}
