//! Stage 1, the capture cap: keep at most `max_bytes` of a stream as head + tail, counting what
//! was dropped in between, so memory stays bounded however much a command prints while the
//! reader keeps draining the pipe.
//!
//! A capture holds the output produced since the last [`HeadTailCapture::take`]. `take` can hold
//! back a trailing incomplete UTF-8 sequence (a multi-byte character split across two reads) so
//! it is shown whole in the next chunk instead of as two replacement characters.

/// The captured bytes of one chunk.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    /// The first bytes of the chunk (all of it when nothing was dropped).
    pub head: Vec<u8>,
    /// The last bytes, after the gap; empty when nothing was dropped.
    pub tail: Vec<u8>,
    /// Bytes dropped between head and tail.
    pub dropped_bytes: u64,
    /// Newlines among the dropped bytes.
    pub dropped_lines: u64,
}

impl Captured {
    /// All bytes the chunk had, including dropped ones.
    pub fn total_bytes(&self) -> u64 {
        self.head.len() as u64 + self.dropped_bytes + self.tail.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.total_bytes() == 0
    }
}

/// A bounded head + tail buffer.
#[derive(Debug, Clone)]
pub struct HeadTailCapture {
    head_max: usize,
    tail_max: usize,
    head: Vec<u8>,
    /// Ring buffer of the last `tail_max` bytes after the head filled; `tail_start` is the
    /// oldest byte once the ring is full.
    tail: Vec<u8>,
    tail_start: usize,
    dropped_bytes: u64,
    dropped_lines: u64,
}

impl HeadTailCapture {
    /// A capture keeping at most `max_bytes` (half head, half tail).
    pub fn new(max_bytes: usize) -> Self {
        let head_max = max_bytes / 2;
        Self {
            head_max,
            tail_max: max_bytes - head_max,
            head: Vec::new(),
            tail: Vec::new(),
            tail_start: 0,
            dropped_bytes: 0,
            dropped_lines: 0,
        }
    }

    /// Bytes pushed since the last take (including dropped ones).
    pub fn len(&self) -> u64 {
        (self.head.len() + self.tail.len()) as u64 + self.dropped_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn push(&mut self, mut data: &[u8]) {
        if self.head.len() < self.head_max {
            let n = (self.head_max - self.head.len()).min(data.len());
            self.head.extend_from_slice(&data[..n]);
            data = &data[n..];
        }
        if data.is_empty() {
            return;
        }
        if self.tail_max == 0 {
            self.drop_bytes(data);
            return;
        }
        if data.len() >= self.tail_max {
            // Everything in the ring and the front of `data` fall into the gap.
            let ring = std::mem::take(&mut self.tail);
            let (older, newer) = ring.split_at(self.tail_start);
            self.drop_bytes(newer);
            self.drop_bytes(older);
            let cut = data.len() - self.tail_max;
            self.drop_bytes(&data[..cut]);
            self.tail = data[cut..].to_vec();
            self.tail_start = 0;
            return;
        }
        let room = self.tail_max - self.tail.len();
        if room > 0 {
            let n = room.min(data.len());
            self.tail.extend_from_slice(&data[..n]);
            data = &data[n..];
        }
        // The ring is full: overwrite the oldest bytes, which fall into the gap.
        while !data.is_empty() {
            let n = (self.tail_max - self.tail_start).min(data.len());
            let range = self.tail_start..self.tail_start + n;
            let lines = count_newlines(&self.tail[range.clone()]);
            self.dropped_bytes += n as u64;
            self.dropped_lines += lines;
            self.tail[range].copy_from_slice(&data[..n]);
            self.tail_start = (self.tail_start + n) % self.tail_max;
            data = &data[n..];
        }
    }

    fn drop_bytes(&mut self, data: &[u8]) {
        self.dropped_bytes += data.len() as u64;
        self.dropped_lines += count_newlines(data);
    }

    /// Returns everything captured since the last take and starts a new chunk. With
    /// `hold_incomplete_utf8`, a trailing incomplete UTF-8 sequence stays for the next chunk.
    pub fn take(&mut self, hold_incomplete_utf8: bool) -> Captured {
        let mut tail = std::mem::take(&mut self.tail);
        tail.rotate_left(self.tail_start);
        self.tail_start = 0;
        let mut captured = Captured {
            head: std::mem::take(&mut self.head),
            tail,
            dropped_bytes: std::mem::take(&mut self.dropped_bytes),
            dropped_lines: std::mem::take(&mut self.dropped_lines),
        };
        if captured.dropped_bytes == 0 {
            let tail = std::mem::take(&mut captured.tail);
            captured.head.extend_from_slice(&tail);
        }
        if hold_incomplete_utf8 {
            let last = if captured.tail.is_empty() {
                &mut captured.head
            } else {
                &mut captured.tail
            };
            let cut = crate::utf8::incomplete_suffix_start(last);
            let rest = last.split_off(cut);
            self.push(&rest);
        }
        captured
    }
}

pub(crate) fn count_newlines(data: &[u8]) -> u64 {
    data.iter().filter(|&&b| b == b'\n').count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capture_of(max: usize, pushes: &[&[u8]]) -> Captured {
        let mut capture = HeadTailCapture::new(max);
        for data in pushes {
            capture.push(data);
        }
        capture.take(false)
    }

    #[test]
    fn keeps_head_and_tail_and_counts_the_gap() {
        /// (max bytes, pushes, head, tail, dropped bytes, dropped newlines)
        type Row<'a> = (usize, &'a [&'a [u8]], &'a [u8], &'a [u8], u64, u64);
        let table: &[Row<'_>] = &[
            (8, &[b"abc"], b"abc", b"", 0, 0),
            (8, &[b"abcd", b"efgh"], b"abcdefgh", b"", 0, 0),
            (8, &[b"abcdefghij"], b"abcd", b"ghij", 2, 0),
            (8, &[b"abcd", b"e\nf\ng", b"hij"], b"abcd", b"ghij", 4, 2),
            (
                8,
                &[b"ab", b"cd", b"ef", b"gh", b"ij", b"kl"],
                b"abcd",
                b"ijkl",
                4,
                0,
            ),
            (
                8,
                &[b"abcd", b"1\n3", b"4", b"5\n7", b"8"],
                b"abcd",
                b"5\n78",
                4,
                1,
            ),
            (0, &[b"a\nb"], b"", b"", 3, 1),
        ];
        for (i, (max, pushes, head, tail, dropped, dropped_lines)) in table.iter().enumerate() {
            let got = capture_of(*max, pushes);
            assert_eq!(got.head, *head, "row {i} head");
            assert_eq!(got.tail, *tail, "row {i} tail");
            assert_eq!(
                (got.dropped_bytes, got.dropped_lines),
                (*dropped, *dropped_lines),
                "row {i}"
            );
        }
    }

    #[test]
    fn take_starts_a_new_chunk() {
        let mut capture = HeadTailCapture::new(4);
        capture.push(b"abcdef");
        assert_eq!(capture.take(false).total_bytes(), 6);
        capture.push(b"xy");
        let second = capture.take(false);
        assert_eq!(
            (second.head.as_slice(), second.dropped_bytes),
            (&b"xy"[..], 0)
        );
    }

    #[test]
    fn take_holds_back_an_incomplete_utf8_sequence() {
        let euro = "€".as_bytes();
        let mut capture = HeadTailCapture::new(1024);
        capture.push(b"price: ");
        capture.push(&euro[..2]);
        assert_eq!(capture.take(true).head, b"price: ");
        capture.push(&euro[2..]);
        assert_eq!(capture.take(true).head, euro);
    }

    #[test]
    fn memory_stays_bounded_over_many_megabytes() {
        let mut capture = HeadTailCapture::new(1024);
        let block = vec![b'x'; 4096];
        for _ in 0..4096 {
            capture.push(&block);
        }
        assert!(capture.head.capacity() + capture.tail.capacity() <= 8192);
        let got = capture.take(false);
        assert_eq!(got.total_bytes(), 4096 * 4096);
        assert_eq!(got.head.len() + got.tail.len(), 1024);
    }
}
