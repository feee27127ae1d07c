//! The replay ring: the last `capacity` bytes of a session's output, addressed by absolute
//! offsets that count every byte the session ever produced.
//!
//! The byte at absolute offset `o` lives at index `o % capacity`. The buffer starts empty and
//! grows as output arrives (an idle session costs nothing), reaching `capacity` only once that
//! much output exists; after that it wraps. The ring does no locking itself: the session keeps
//! it behind the same lock as its subscribers, so a snapshot and a subscription are atomic.

/// Bytes retained per session.
pub const RING_CAPACITY: usize = 1024 * 1024;

#[derive(Debug)]
pub struct ReplayRing {
    buf: Vec<u8>,
    capacity: usize,
    total: u64,
}

impl ReplayRing {
    pub fn new(capacity: usize) -> Self {
        assert!(
            capacity > 0,
            "a replay ring needs room for at least one byte"
        );
        Self {
            buf: Vec::new(),
            capacity,
            total: 0,
        }
    }

    /// Every byte ever written, including evicted ones: the offset the next byte will get.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Offset of the oldest retained byte.
    pub fn oldest(&self) -> u64 {
        self.total - self.buf.len() as u64
    }

    /// Bytes of memory currently allocated for retained output.
    pub fn allocated(&self) -> usize {
        self.buf.capacity()
    }

    /// Appends `bytes`. A write larger than the ring keeps its tail; `total` advances by the
    /// full length either way.
    pub fn write(&mut self, bytes: &[u8]) {
        let n = bytes.len();
        let new_total = self.total + n as u64;
        if new_total <= self.capacity as u64 {
            // Still filling: offsets equal indices, so a plain append keeps `o % capacity`.
            if self.buf.capacity() < new_total as usize {
                let grown = (self.buf.capacity() * 2).clamp(new_total as usize, self.capacity);
                self.buf.reserve_exact(grown - self.buf.len());
            }
            self.buf.extend_from_slice(bytes);
            self.total = new_total;
            return;
        }
        if self.buf.len() < self.capacity {
            // From here on the ring wraps, so every index must exist.
            self.buf.reserve_exact(self.capacity - self.buf.len());
            self.buf.resize(self.capacity, 0);
        }
        let kept = if n > self.capacity {
            &bytes[n - self.capacity..]
        } else {
            bytes
        };
        let first_offset = new_total - kept.len() as u64;
        let start = (first_offset % self.capacity as u64) as usize;
        let until_end = self.capacity - start;
        if kept.len() <= until_end {
            self.buf[start..start + kept.len()].copy_from_slice(kept);
        } else {
            self.buf[start..].copy_from_slice(&kept[..until_end]);
            self.buf[..kept.len() - until_end].copy_from_slice(&kept[until_end..]);
        }
        self.total = new_total;
    }

    /// Where a read from `since` really starts: clamped to what is retained.
    pub fn clamp(&self, since: u64) -> u64 {
        since.clamp(self.oldest(), self.total)
    }

    /// Appends to `out` the retained bytes from `since` (clamped to the oldest retained byte),
    /// at most `max_bytes` of them. Returns the offset of the first byte appended.
    pub fn read_into(&self, since: u64, max_bytes: usize, out: &mut Vec<u8>) -> u64 {
        let from = self.clamp(since);
        let len = ((self.total - from) as usize).min(max_bytes);
        if len == 0 {
            return from;
        }
        let start = (from % self.capacity as u64) as usize;
        let until_end = self.buf.len() - start;
        if len <= until_end {
            out.extend_from_slice(&self.buf[start..start + len]);
        } else {
            out.extend_from_slice(&self.buf[start..]);
            out.extend_from_slice(&self.buf[..len - until_end]);
        }
        from
    }

    /// The retained bytes from `since` (clamped) and the offset of the first one.
    pub fn read_from(&self, since: u64) -> (u64, Vec<u8>) {
        let mut out = Vec::new();
        let from = self.read_into(since, usize::MAX, &mut out);
        (from, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring_after(capacity: usize, writes: &[&str]) -> ReplayRing {
        let mut ring = ReplayRing::new(capacity);
        for w in writes {
            ring.write(w.as_bytes());
        }
        ring
    }

    #[test]
    fn reads_follow_the_spec_table() {
        // (capacity, writes, since) -> (offset, bytes, total)
        type Case<'a> = (usize, &'a [&'a str], u64, u64, &'a str, u64);
        let cases: &[Case] = &[
            (8, &[], 0, 0, "", 0),
            (8, &["abc"], 0, 0, "abc", 3),
            (8, &["abc"], 1, 1, "bc", 3),
            (8, &["abc"], 3, 3, "", 3),
            (8, &["abc"], 99, 3, "", 3),
            (8, &["abcdef", "ghij"], 0, 2, "cdefghij", 10),
            (8, &["abcdef", "ghij"], 5, 5, "fghij", 10),
            (8, &["abcdefgh", "ij"], 1, 2, "cdefghij", 10),
            (4, &["abcdefghij"], 0, 6, "ghij", 10),
            (4, &["ab", "cdefghij"], 7, 7, "hij", 10),
            (4, &["abc", "d", "e"], 0, 1, "bcde", 5),
            (3, &["a", "b", "c", "d", "e", "f", "g"], 5, 5, "fg", 7),
        ];
        for &(capacity, writes, since, offset, bytes, total) in cases {
            let ring = ring_after(capacity, writes);
            let (got_offset, got) = ring.read_from(since);
            assert_eq!(
                (
                    got_offset,
                    String::from_utf8_lossy(&got).as_ref(),
                    ring.total()
                ),
                (offset, bytes, total),
                "capacity {capacity}, writes {writes:?}, since {since}"
            );
        }
    }

    #[test]
    fn eviction_drops_the_oldest_bytes_first() {
        let mut ring = ReplayRing::new(10);
        for i in 0..100u8 {
            ring.write(&[i]);
        }
        assert_eq!(ring.oldest(), 90);
        assert_eq!(ring.read_from(0), (90, (90..100).collect::<Vec<u8>>()));
    }

    #[test]
    fn since_before_oldest_is_clamped_to_oldest() {
        let ring = ring_after(4, &["0123456789"]);
        assert_eq!(ring.read_from(2), (6, b"6789".to_vec()));
        assert_eq!(ring.clamp(0), 6);
        assert_eq!(ring.clamp(100), 10);
    }

    #[test]
    fn write_larger_than_the_ring_keeps_its_tail_and_counts_every_byte() {
        let mut ring = ring_after(4, &["ab"]);
        ring.write(b"0123456789");
        assert_eq!(ring.total(), 12);
        assert_eq!(ring.read_from(0), (8, b"6789".to_vec()));
        ring.write(b"x");
        assert_eq!(ring.read_from(0), (9, b"789x".to_vec()));
    }

    #[test]
    fn read_into_respects_max_bytes() {
        let ring = ring_after(8, &["abcdefghij"]);
        let mut out = Vec::new();
        assert_eq!(ring.read_into(0, 3, &mut out), 2);
        assert_eq!(out, b"cde");
    }

    #[test]
    fn memory_grows_only_as_output_arrives() {
        let mut ring = ReplayRing::new(RING_CAPACITY);
        assert_eq!(ring.allocated(), 0);
        ring.write(b"$ ");
        assert!(ring.allocated() < 1024, "allocated {}", ring.allocated());
        ring.write(&vec![b'x'; 3 * RING_CAPACITY]);
        assert_eq!(ring.allocated(), RING_CAPACITY);
    }

    #[test]
    fn concurrent_writers_keep_total_exact() {
        use std::sync::{Arc, Mutex};
        let ring = Arc::new(Mutex::new(ReplayRing::new(1000)));
        let writers: Vec<_> = (0..8)
            .map(|i| {
                let ring = Arc::clone(&ring);
                std::thread::spawn(move || {
                    for n in 0..500 {
                        let chunk = vec![b'a' + i as u8; 1 + (n * 7 + i) % 300];
                        ring.lock().expect("ring lock").write(&chunk);
                    }
                })
            })
            .collect();
        for writer in writers {
            writer.join().expect("writer thread");
        }
        let expected: u64 = (0..8)
            .flat_map(|i| (0..500).map(move |n| 1 + (n * 7 + i) % 300))
            .sum::<usize>() as u64;
        let ring = ring.lock().expect("ring lock");
        assert_eq!(ring.total(), expected);
        assert_eq!(ring.read_from(0).1.len(), 1000);
    }
}
