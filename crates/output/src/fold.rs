//! Stage 5, head + tail folding to a token budget, and the token estimate (bytes / 4, rounded
//! up). Folding keeps the head and the tail (where the first error and the final summary are),
//! cuts on line boundaries where that loses less than half of a side's budget, and says what was
//! cut: a `Total output lines: N` header, then the head, `…N tokens truncated…`, the tail.
//!
//! The input can already have a gap (bytes the capture cap dropped); the gap counts as cut.

/// Estimated tokens of `n_bytes` of text: bytes / 4, rounded up.
pub fn estimate_tokens(n_bytes: u64) -> u64 {
    n_bytes.div_ceil(4)
}

/// Text to fold: a head, an optional gap of dropped bytes and lines, and a tail.
#[derive(Debug, Clone, Copy, Default)]
pub struct FoldInput<'a> {
    pub head: &'a str,
    pub gap_bytes: u64,
    pub gap_lines: u64,
    pub tail: &'a str,
}

impl<'a> FoldInput<'a> {
    pub fn whole(text: &'a str) -> Self {
        Self {
            head: text,
            ..Self::default()
        }
    }

    fn total_bytes(&self) -> u64 {
        self.head.len() as u64 + self.gap_bytes + self.tail.len() as u64
    }

    fn total_lines(&self) -> u64 {
        let newlines = crate::capture::count_newlines(self.head.as_bytes())
            + self.gap_lines
            + crate::capture::count_newlines(self.tail.as_bytes());
        let last = if self.tail.is_empty() && self.gap_bytes == 0 {
            self.head
        } else {
            self.tail
        };
        let unterminated = !last.is_empty() && !last.ends_with('\n');
        newlines + u64::from(unterminated)
    }
}

/// A folded text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Folded {
    pub text: String,
    /// Something was cut (by the capture cap or by folding).
    pub truncated: bool,
}

/// Folds `input` to at most about `max_tokens` tokens (plus the header and marker).
pub fn fold_to_tokens(input: FoldInput<'_>, max_tokens: u64) -> Folded {
    let budget = usize::try_from(max_tokens.saturating_mul(4)).unwrap_or(usize::MAX);
    if input.gap_bytes == 0 && input.total_bytes() <= budget as u64 {
        let mut text = String::with_capacity(input.head.len() + input.tail.len());
        text.push_str(input.head);
        text.push_str(input.tail);
        return Folded {
            text,
            truncated: false,
        };
    }
    let joined;
    let (head_src, tail_src) = if input.gap_bytes == 0 {
        joined = [input.head, input.tail].concat();
        (joined.as_str(), joined.as_str())
    } else {
        (input.head, input.tail)
    };
    let head_budget = budget / 2;
    let tail_budget = budget - head_budget;
    let cut_inside = input.gap_bytes > 0;
    let head = head_cut(head_src, head_budget, cut_inside);
    let mut tail = tail_cut(tail_src, tail_budget, cut_inside);
    if input.gap_bytes == 0 && head.len() + tail.len() > head_src.len() {
        tail = &tail[tail.len() - (head_src.len() - head.len())..];
    }
    let kept = (head.len() + tail.len()) as u64;
    let cut_tokens = estimate_tokens(input.total_bytes().saturating_sub(kept));
    let mut text = String::with_capacity(head.len() + tail.len() + 64);
    text.push_str(&format!("Total output lines: {}\n\n", input.total_lines()));
    text.push_str(head);
    if !head.is_empty() && !head.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&format!("…{cut_tokens} tokens truncated…\n"));
    text.push_str(tail);
    Folded {
        text,
        truncated: true,
    }
}

fn floor_char_boundary(text: &str, mut at: usize) -> usize {
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// The longest prefix within `budget` bytes, ending after a newline if that keeps at least half.
/// `cut_after` says the text was already cut at its end, so its last line is partial.
fn head_cut(text: &str, budget: usize, cut_after: bool) -> &str {
    let end = floor_char_boundary(text, budget);
    if end == text.len() && (!cut_after || text.ends_with('\n')) {
        return text;
    }
    match text[..end].rfind('\n') {
        Some(nl) if nl + 1 >= end / 2 => &text[..nl + 1],
        _ => &text[..end],
    }
}

/// The longest suffix within `budget` bytes, starting after a newline if that keeps at least
/// half. `cut_before` says the text was already cut at its start, so its first line is partial.
fn tail_cut(text: &str, budget: usize, cut_before: bool) -> &str {
    if text.len() <= budget && !cut_before {
        return text;
    }
    let mut start = text.len().saturating_sub(budget);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    let window = &text[start..];
    match window.find('\n') {
        Some(nl) if nl + 1 < window.len() && window.len() - (nl + 1) >= window.len() / 2 => {
            &window[nl + 1..]
        }
        _ => window,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_bytes_over_four_rounded_up() {
        for (bytes, tokens) in [(0, 0), (1, 1), (4, 1), (5, 2), (8991 * 4, 8991)] {
            assert_eq!(estimate_tokens(bytes), tokens, "{bytes}");
        }
    }

    #[test]
    fn folds_to_head_and_tail_with_header_and_marker() {
        let numbered: String = (1..=100).map(|i| format!("line {i:03}\n")).collect();
        let table: Vec<(FoldInput<'_>, u64, &str)> = vec![
            (FoldInput::whole("short\n"), 10, "short\n"),
            (FoldInput::whole(""), 0, ""),
            (
                FoldInput::whole(&numbered),
                10, // 40 bytes: 20 for the head (two lines), 20 for the tail (two lines)
                "Total output lines: 100\n\nline 001\nline 002\n…216 tokens truncated…\nline 099\nline 100\n",
            ),
            (
                FoldInput::whole("abcdefghijklmnopqrstuvwxyz"),
                2,
                "Total output lines: 1\n\nabcd\n…5 tokens truncated…\nwxyz",
            ),
            (
                FoldInput {
                    head: "error: first\n",
                    gap_bytes: 1000,
                    gap_lines: 50,
                    tail: "summary: 3 failed\n",
                },
                100,
                "Total output lines: 52\n\nerror: first\n…250 tokens truncated…\nsummary: 3 failed\n",
            ),
            (
                FoldInput::whole("héllo wörld"),
                1,
                "Total output lines: 1\n\nh\n…3 tokens truncated…\nld",
            ),
        ];
        for (input, max_tokens, expected) in table {
            let folded = fold_to_tokens(input, max_tokens);
            assert_eq!(
                folded.text, expected,
                "input {input:?} at {max_tokens} tokens"
            );
            assert_eq!(folded.truncated, expected.starts_with("Total output lines"));
        }
    }

    #[test]
    fn folded_output_stays_near_the_budget() {
        let big: String = (0..20_000)
            .map(|i| format!("{i} some log line text\n"))
            .collect();
        let folded = fold_to_tokens(FoldInput::whole(&big), 1000);
        assert!(folded.text.len() <= 4000 + 80, "{}", folded.text.len());
        assert!(folded.text.contains("0 some log line text\n"));
        assert!(folded.text.ends_with("19999 some log line text\n"));
    }
}
