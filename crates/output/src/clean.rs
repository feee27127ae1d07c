//! Stage 4, terminal cleaning: turn what a terminal would have shown into plain text.
//!
//! Carriage-return redraws keep only each line's final state (a five-minute progress bar becomes
//! one line), backspaces apply, cursor movement and erase sequences are interpreted, colour (SGR)
//! and OSC/DCS strings are removed. A full-screen program (alternate screen) is rendered as its
//! final screen with `vt100`. Text without control characters is returned untouched, so
//! cleaning only costs something where it changes something.
//!
//! The line model has no width: lines grow as needed and never wrap. Absolute cursor positions
//! are taken relative to the last `rows` lines (the visible screen), and clearing the screen
//! keeps what was printed before as scrollback, which is what an agent wants to read.

use std::borrow::Cow;

const ESC: char = '\x1b';

/// Cursor addressing never goes further right than this (a terminal would stop at its width;
/// lines here do not wrap, so printed text may still make them longer).
const MAX_COL: usize = 4096;

/// Alternate-screen switches: `?1049`, `?1047` and `?47`, set (`h`) or reset (`l`).
const ALT_ENTER: &[&str] = &["\x1b[?1049h", "\x1b[?1047h", "\x1b[?47h"];
const ALT_LEAVE: &[&str] = &["\x1b[?1049l", "\x1b[?1047l", "\x1b[?47l"];

/// True when `text` has anything the cleaner would act on.
pub fn needs_cleaning(text: &str) -> bool {
    text.bytes()
        .any(|b| (b < 0x20 && b != b'\n' && b != b'\t') || b == 0x7f)
}

/// Cleans `text` as a `rows` x `cols` terminal would have shown it.
pub fn clean_terminal(text: &str, rows: u16, cols: u16) -> Cow<'_, str> {
    if !needs_cleaning(text) {
        return Cow::Borrowed(text);
    }
    let flattened = render_alternate_screens(text, rows, cols);
    let mut screen = LineModel::new(usize::from(rows.max(1)));
    screen.feed(&flattened);
    Cow::Owned(screen.finish())
}

fn find_first(text: &str, needles: &[&str]) -> Option<(usize, usize)> {
    needles
        .iter()
        .filter_map(|n| text.find(n).map(|at| (at, n.len())))
        .min_by_key(|(at, _)| *at)
}

/// Replaces each alternate-screen region with the plain text of its final screen.
fn render_alternate_screens(text: &str, rows: u16, cols: u16) -> Cow<'_, str> {
    let Some(_) = find_first(text, ALT_ENTER) else {
        return Cow::Borrowed(text);
    };
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some((enter, enter_len)) = find_first(rest, ALT_ENTER) {
        out.push_str(&rest[..enter]);
        let region_start = enter + enter_len;
        let (region, after) = match find_first(&rest[region_start..], ALT_LEAVE) {
            Some((leave, leave_len)) => (
                &rest[region_start..region_start + leave],
                &rest[region_start + leave + leave_len..],
            ),
            None => (&rest[region_start..], ""),
        };
        let rows = std::num::NonZeroU16::new(rows).unwrap_or(std::num::NonZeroU16::MIN);
        let cols = std::num::NonZeroU16::new(cols).unwrap_or(std::num::NonZeroU16::MIN);
        let mut parser = vt100::Parser::new(rows, cols, 0);
        parser.process(region.as_bytes());
        let contents = parser.screen().contents();
        let contents = contents.trim_end_matches(['\n', ' ']);
        if !out.is_empty() && !out.ends_with('\n') {
            out.push_str("\r\n");
        }
        out.push_str(contents);
        if !contents.is_empty() {
            out.push_str("\r\n");
        }
        rest = after;
    }
    out.push_str(rest);
    Cow::Owned(out)
}

fn is_control(c: char) -> bool {
    (c as u32) < 0x20 || c == '\x7f'
}

fn put_char(line: &mut Vec<char>, col: &mut usize, c: char) {
    if *col < line.len() {
        line[*col] = c;
    } else {
        if *col > line.len() {
            line.resize(*col, ' ');
        }
        line.push(c);
    }
    *col += 1;
}

/// A widthless terminal: a list of lines and a cursor. Rows are absolute line numbers; lines
/// that scrolled above the screen (where no cursor movement can reach them) are moved into
/// `done` as text, so memory follows the screen, not the whole output.
struct LineModel {
    done: String,
    /// Absolute row of `lines[0]`: how many lines were moved into `done`.
    base: usize,
    lines: std::collections::VecDeque<Vec<char>>,
    row: usize,
    col: usize,
    rows: usize,
    /// Lines above this row are scrollback that cursor addressing never reaches.
    floor: usize,
    saved: Option<(usize, usize)>,
}

impl LineModel {
    fn new(rows: usize) -> Self {
        Self {
            done: String::new(),
            base: 0,
            lines: std::collections::VecDeque::from([Vec::new()]),
            row: 0,
            col: 0,
            rows,
            floor: 0,
            saved: None,
        }
    }

    fn total(&self) -> usize {
        self.base + self.lines.len()
    }

    fn screen_top(&self) -> usize {
        self.floor
            .max(self.total().saturating_sub(self.rows))
            .max(self.base)
    }

    fn current(&mut self) -> &mut Vec<char> {
        let index = self.row - self.base;
        &mut self.lines[index]
    }

    /// Moves lines no cursor movement can reach any more into `done`.
    fn retire_scrolled_lines(&mut self) {
        let mut keep_from = self.screen_top().min(self.row);
        if let Some((saved_row, _)) = self.saved {
            keep_from = keep_from.min(saved_row);
        }
        while self.base < keep_from && self.lines.len() > 1 {
            let Some(line) = self.lines.pop_front() else {
                break;
            };
            self.done.extend(line.iter());
            self.done.push('\n');
            self.base += 1;
        }
    }

    fn restore_cursor(&mut self) {
        if let Some((row, col)) = self.saved {
            self.row = row.clamp(self.base, self.total() - 1);
            self.col = col;
        }
    }

    /// Moves the cursor down `n` lines; like a terminal it stops at the bottom of the screen
    /// (or of what was printed), so a hostile `ESC[999999999B` allocates nothing.
    fn move_down(&mut self, n: usize) {
        let bottom = (self.total() - 1).max(self.screen_top() + self.rows - 1);
        self.row = self.row.saturating_add(n).min(bottom);
        self.ensure_row(self.row);
    }

    /// Moves the cursor to screen row `row` (1-based), clamped to the screen.
    fn set_screen_row(&mut self, row: usize) {
        self.row = self.screen_top() + row.clamp(1, self.rows) - 1;
        self.ensure_row(self.row);
    }

    /// Moves the cursor to column `col`, clamped so cursor addressing cannot make a line huge.
    fn set_col(&mut self, col: usize) {
        self.col = col.min(MAX_COL);
    }

    fn ensure_row(&mut self, row: usize) {
        while self.total() <= row {
            self.lines.push_back(Vec::new());
        }
    }

    fn put(&mut self, c: char) {
        let mut col = self.col;
        put_char(self.current(), &mut col, c);
        self.col = col;
    }

    fn newline(&mut self) {
        self.row += 1;
        self.ensure_row(self.row);
        self.col = 0;
        self.retire_scrolled_lines();
    }

    fn feed(&mut self, text: &str) {
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\n' => self.newline(),
                '\r' => self.col = 0,
                '\x08' => self.col = self.col.saturating_sub(1),
                '\t' => self.put('\t'),
                ESC => self.escape(&mut chars),
                c if is_control(c) => {}
                c => {
                    // A run of printable characters lands on one line: borrow it once.
                    let index = self.row - self.base;
                    let line = &mut self.lines[index];
                    put_char(line, &mut self.col, c);
                    while let Some(&next) = chars.peek() {
                        if is_control(next) {
                            break;
                        }
                        put_char(line, &mut self.col, next);
                        chars.next();
                    }
                }
            }
        }
    }

    fn escape(&mut self, chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
        let Some(kind) = chars.next() else { return };
        match kind {
            '[' => self.csi(chars),
            // OSC, DCS, SOS, PM, APC: strings ended by BEL or ESC \.
            ']' | 'P' | 'X' | '^' | '_' => {
                while let Some(c) = chars.next() {
                    if c == '\x07' {
                        break;
                    }
                    if c == ESC {
                        if chars.peek() == Some(&'\\') {
                            chars.next();
                        }
                        break;
                    }
                }
            }
            // Character set selection takes one more character.
            '(' | ')' | '*' | '+' | '-' | '.' | '/' | '#' | '%' => {
                chars.next();
            }
            '7' => self.saved = Some((self.row, self.col)),
            '8' => self.restore_cursor(),
            'M' => {
                self.row = self
                    .row
                    .saturating_sub(1)
                    .max(self.screen_top().min(self.row))
            }
            'E' => self.newline(),
            'D' => {
                let col = self.col;
                self.newline();
                self.col = col;
            }
            _ => {}
        }
    }

    fn csi(&mut self, chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
        // Parameters are parsed in place (no allocation: progress bars send two SGR
        // sequences per redraw). At most 16 numbers are kept; more never matter here.
        let mut numbers = [0usize; 16];
        let mut n_numbers = 1;
        let mut private = false;
        let mut final_char = None;
        for c in chars.by_ref() {
            match c {
                '0'..='9' => {
                    let slot = &mut numbers[n_numbers - 1];
                    *slot = slot
                        .saturating_mul(10)
                        .saturating_add(c as usize - '0' as usize);
                }
                ';' | ':' => n_numbers = (n_numbers + 1).min(numbers.len()),
                '?' | '>' | '<' | '=' => private = true,
                '\x40'..='\x7e' => {
                    final_char = Some(c);
                    break;
                }
                _ => {}
            }
        }
        let Some(final_char) = final_char else { return };
        if private {
            return; // private modes (cursor visibility, bracketed paste...) change no text
        }
        let numbers = &numbers[..n_numbers];
        let arg = |i: usize, default: usize| match numbers.get(i) {
            Some(0) | None => default,
            Some(n) => *n,
        };
        match final_char {
            'A' => {
                self.row = self
                    .row
                    .saturating_sub(arg(0, 1))
                    .max(self.screen_top().min(self.row))
            }
            'B' | 'e' => self.move_down(arg(0, 1)),
            'C' | 'a' => self.set_col(self.col.saturating_add(arg(0, 1))),
            'D' => self.col = self.col.saturating_sub(arg(0, 1)),
            'E' => {
                self.move_down(arg(0, 1));
                self.col = 0;
            }
            'F' => {
                self.row = self
                    .row
                    .saturating_sub(arg(0, 1))
                    .max(self.screen_top().min(self.row));
                self.col = 0;
            }
            'G' | '`' => self.set_col(arg(0, 1) - 1),
            'H' | 'f' => {
                self.set_screen_row(arg(0, 1));
                self.set_col(arg(1, 1) - 1);
            }
            'd' => self.set_screen_row(arg(0, 1)),
            'K' => {
                let index = self.row - self.base;
                let line = &mut self.lines[index];
                match numbers.first().copied().unwrap_or(0) {
                    0 => line.truncate(self.col),
                    1 => {
                        let end = (self.col + 1).min(line.len());
                        line[..end].fill(' ');
                    }
                    _ => line.clear(),
                }
            }
            'J' => match numbers.first().copied().unwrap_or(0) {
                0 => {
                    let col = self.col;
                    self.current().truncate(col);
                    self.lines.truncate(self.row - self.base + 1);
                }
                1 => {}
                _ => {
                    // Clear screen: what was shown stays as scrollback; drawing restarts on
                    // a fresh screen below it.
                    let last_used = self.lines.iter().rposition(|l| !l.is_empty());
                    if let Some(last_used) = last_used {
                        self.lines.truncate(last_used + 1);
                        self.lines.push_back(Vec::new());
                        self.floor = self.total() - 1;
                        self.row = self.floor;
                        self.col = 0;
                    }
                }
            },
            'X' => {
                let index = self.row - self.base;
                let line = &mut self.lines[index];
                let end = (self.col + arg(0, 1)).min(line.len());
                if self.col < end {
                    line[self.col..end].fill(' ');
                }
            }
            'P' => {
                let index = self.row - self.base;
                let line = &mut self.lines[index];
                if self.col < line.len() {
                    let end = (self.col + arg(0, 1)).min(line.len());
                    line.drain(self.col..end);
                }
            }
            '@' => {
                let index = self.row - self.base;
                let line = &mut self.lines[index];
                if self.col < line.len() {
                    let n = arg(0, 1).min(MAX_COL);
                    line.splice(self.col..self.col, std::iter::repeat_n(' ', n));
                }
            }
            's' => self.saved = Some((self.row, self.col)),
            'u' => self.restore_cursor(),
            _ => {} // SGR colours ('m') and everything else leave the text alone
        }
    }

    fn finish(self) -> String {
        let n_chars: usize = self.lines.iter().map(|l| l.len() + 1).sum();
        let mut out = self.done;
        out.reserve(n_chars);
        for (i, line) in self.lines.iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            out.extend(line.iter());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(text: &str) -> String {
        clean_terminal(text, 24, 80).into_owned()
    }

    #[test]
    fn cleans_like_a_terminal() {
        let table = [
            ("plain\ntext\n", "plain\ntext\n"),
            ("tabs\tstay\n", "tabs\tstay\n"),
            ("crlf\r\nline\r\n", "crlf\nline\n"),
            (
                " 10%|#   |\r 50%|##  |\r100%|####|\ndone\n",
                "100%|####|\ndone\n",
            ),
            ("long line\rshort\n", "shortline\n"),
            ("long line\r\x1b[Kshort\n", "short\n"),
            ("abc\x08\x08X\n", "aXc\n"),
            ("ab\x08\x08\x08\x08cd\n", "cd\n"),
            (
                "\x1b[31mred\x1b[0m and \x1b[1;32mgreen\x1b[m\n",
                "red and green\n",
            ),
            ("\x1b]0;window title\x07prompt$ \n", "prompt$ \n"),
            ("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\\n", "link\n"),
            ("a\x1b[5Cb\n", "a     b\n"),
            ("abcdef\x1b[3D\x1b[K\n", "abc\n"),
            ("abcdef\x1b[3G!\n", "ab!def\n"),
            ("abcdef\x1b[2K\rnew\n", "new\n"),
            ("x\x1b[1Ky\n", " y\n"),
            ("bar 1\nbar 2\n\x1b[2A\rBAR 1\n\rBAR 2\n", "BAR 1\nBAR 2\n"),
            ("line\x1b7 save\x1b8d\n", "linedsave\n"),
            ("keep\n\x1b[H\x1b[2Jscreen\n", "keep\nscreen\n"),
            ("bell\x07 and \x1b(Bcharset\n", "bell and charset\n"),
            ("\x1b[?25lhidden cursor\x1b[?25h\n", "hidden cursor\n"),
            ("abc\x1b[2D\x1b[2P\n", "a\n"),
            ("abc\x1b[2D\x1b[2@\n", "a  bc\n"),
            ("trailing escape \x1b[", "trailing escape "),
            ("é\rx\n", "x\n"),
        ];
        for (input, expected) in table {
            assert_eq!(clean(input), expected, "input {input:?}");
        }
    }

    #[test]
    fn cursor_movement_reaches_the_screen_but_not_scrollback() {
        let lines: String = (0..100).map(|i| format!("l{i}\n")).collect();
        let expected = |replaced: usize, with: &str| -> String {
            (0..100)
                .map(|i| {
                    if i == replaced {
                        format!("{with}\n")
                    } else {
                        format!("l{i}\n")
                    }
                })
                .collect()
        };
        let table = [
            (format!("{lines}\x1b[2AX\n"), expected(98, "X98")),
            (format!("{lines}\x1b[50AX\n"), expected(77, "X77")),
            (format!("{lines}\x1b[1;1HX\x1b[24;1H"), expected(77, "X77")),
        ];
        for (input, expected) in table {
            assert_eq!(
                clean(&input),
                expected,
                "input ending {:?}",
                &input[input.len() - 12..]
            );
        }
    }

    #[test]
    fn hostile_cursor_addressing_stays_bounded() {
        let table = [
            "\x1b[999999999B\x1b[999999999Cx\n",
            "\x1b[999999999;999999999Hx\n",
            "\x1b[999999999dx\x1b[999999999Gy\n",
            "ab\x1b[1D\x1b[999999999@\n",
            "\x1b[99999999999999999999999999999Ex\n",
        ];
        for input in table {
            let cleaned = clean(input);
            assert!(
                cleaned.len() < 4096 + 64,
                "{input:?} grew to {} bytes",
                cleaned.len()
            );
        }
    }

    /// Deterministic fuzzing: random mixes of text, control characters and escape fragments
    /// never panic, never leave an escape character behind, and never grow without bound.
    #[test]
    fn random_terminal_noise_never_panics_or_explodes() {
        const PIECES: &[&str] = &[
            "a",
            "é",
            "😀",
            " ",
            "\n",
            "\r",
            "\x08",
            "\t",
            "\x07",
            "\x00",
            "\x1b",
            "\x1b[",
            "\x1b]",
            "\x1b[2J",
            "\x1b[H",
            "\x1b[K",
            "\x1b[1K",
            "\x1b[0J",
            "\x1b[5A",
            "\x1b[3B",
            "\x1b[9C",
            "\x1b[4D",
            "\x1b[31m",
            "\x1b[?25l",
            "\x1b7",
            "\x1b8",
            "\x1bM",
            "\x1b[2P",
            "\x1b[3@",
            "\x1b[2X",
            ";",
            "9",
            "\x1b\\",
            "\x1b[?1049h",
            "\x1b[?1049l",
            "\x1b(B",
            "\x1b[s",
            "\x1b[u",
        ];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..3000 {
            let n_pieces = (next() % 60) as usize;
            let input: String = (0..n_pieces)
                .map(|_| PIECES[(next() % PIECES.len() as u64) as usize])
                .collect();
            let cleaned = clean_terminal(&input, 24, 80);
            assert!(
                !cleaned.contains('\x1b'),
                "{input:?} left an escape: {cleaned:?}"
            );
            assert!(
                cleaned.len() <= input.len() * 8 + 80 * 26,
                "{input:?} exploded"
            );
        }
    }

    #[test]
    fn plain_text_is_borrowed_untouched() {
        assert!(matches!(
            clean_terminal("no escapes here\n", 24, 80),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn alternate_screen_programs_show_their_final_screen() {
        let table = [
            (
                "before\n\x1b[?1049h\x1b[H\x1b[2Jfirst frame\x1b[H\x1b[2J\x1b[1;1Htop\x1b[3;5Hmiddle\x1b[?1049lafter\n",
                "before\ntop\n\n    middle\nafter\n",
            ),
            ("\x1b[?1049h\x1b[Hstill open", "still open\n"),
            (
                "\x1b[?47hx\x1b[?47l\x1b[?1049h\x1b[?1049ldone\n",
                "x\ndone\n",
            ),
        ];
        for (input, expected) in table {
            assert_eq!(clean(input), expected, "input {input:?}");
        }
    }
}
