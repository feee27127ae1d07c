//! `terminal_clean`: the output pipeline on arbitrary command output. The terminal cleaner
//! (`warren_output::clean::clean_terminal`) on the input as text, with a screen size from the
//! first two bytes; then the whole pipeline an exec result goes through (head + tail capture in
//! chunks, binary refusal, cleaning, folding to a token budget) via `render_chunk`.
//!
//! Oracle: no panic; text without control characters comes back unchanged; cleaned text is
//! bounded by the input (no line grows past the cursor limit, no screen past its size); the
//! capture counts every byte it dropped; the rendered text stays within its token budget plus
//! the fold's header and marker.

use warren_output::clean::{clean_terminal, needs_cleaning};
use warren_output::{HeadTailCapture, RenderOptions, render_chunk};

/// The cleaner's cursor limit (`clean::MAX_COL`) plus the newline.
const MAX_LINE_BYTES: usize = 4096 + 1;
/// Room for the fold's `Total output lines: N` header and `…N tokens truncated…` marker.
const FOLD_OVERHEAD_BYTES: usize = 128;

pub fn terminal_clean(data: &[u8]) {
    let [rows, cols, rest @ ..] = data else {
        return;
    };
    // Real screens: 1-64 rows, 1-256 columns (the PTY size an exec runs with).
    let rows = u16::from(rows % 64) + 1;
    let cols = u16::from(*cols) + 1;
    let text = String::from_utf8_lossy(rest);
    let cleaned = clean_terminal(&text, rows, cols);
    if !needs_cleaning(&text) {
        assert_eq!(
            cleaned, text,
            "text without control characters is left alone"
        );
    }
    let n_alt_screens = text.matches("\x1b[?").count() + 1;
    let screen_bytes = usize::from(rows) * (usize::from(cols) * 4 + 1) * n_alt_screens;
    let bound = (text.len() + 1) * MAX_LINE_BYTES + screen_bytes;
    assert!(
        cleaned.len() <= bound,
        "{} bytes cleaned to {} (bound {bound})",
        text.len(),
        cleaned.len()
    );

    let capture_bytes = usize::from(rest.first().copied().unwrap_or(0)) * 4;
    let max_output_tokens = u64::from(rest.last().copied().unwrap_or(0));
    let mut capture = HeadTailCapture::new(capture_bytes);
    for chunk in rest.chunks(usize::from(cols)) {
        capture.push(chunk);
    }
    assert_eq!(
        capture.len(),
        rest.len() as u64,
        "the capture counts every byte"
    );
    let captured = capture.take(false);
    assert_eq!(captured.total_bytes(), rest.len() as u64);
    let kept = captured.head.len() + captured.tail.len();
    assert!(
        kept <= capture_bytes,
        "{kept} bytes kept by a {capture_bytes}-byte capture"
    );
    let options = RenderOptions {
        max_output_tokens,
        rows,
        cols,
    };
    let rendered = render_chunk(&captured, options);
    if rendered.binary_bytes.is_none() && rendered.truncated {
        let budget = usize::try_from(max_output_tokens * 4).expect("small budget");
        assert!(
            rendered.text.len() <= budget + FOLD_OVERHEAD_BYTES + 8,
            "{} bytes rendered for a budget of {budget}",
            rendered.text.len()
        );
    }
}
