//! Chunks: where a byte stream is cut (FastCDC 2020 over a sliding window, so a file of any
//! size is cut exactly as if it were chunked whole, in bounded memory), what a chunk is named
//! (the BLAKE3 hash of its uncompressed content) and how it is stored (one zstd frame).
//! Opening a stored chunk checks both its size and its hash. No I/O to the store here.

use std::io::{self, Read};

use fastcdc::v2020::FastCDC;

use crate::Error;

/// The smallest chunk FastCDC cuts (except a stream's last).
pub(crate) const MIN_CHUNK: usize = 16 * 1024;
/// The chunk size FastCDC aims for.
pub(crate) const AVG_CHUNK: usize = 64 * 1024;
/// The largest chunk: a cut is forced here, and no stored chunk may decompress to more.
pub(crate) const MAX_CHUNK: usize = 256 * 1024;
/// How much of a stream is held at once while cutting it (at least two chunks).
const WINDOW: usize = 4 * 1024 * 1024;
/// The zstd level chunks are compressed with (the level `warren-snapshot` uses).
const ZSTD_LEVEL: i32 = 3;

/// A chunk's name: the BLAKE3 hash of its uncompressed content.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkId([u8; 32]);

impl ChunkId {
    /// The id of `content`.
    pub fn of(content: &[u8]) -> ChunkId {
        ChunkId(*blake3::hash(content).as_bytes())
    }

    /// 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        let mut text = String::with_capacity(64);
        for byte in self.0 {
            text.push(char::from(HEX[usize::from(byte >> 4)]));
            text.push(char::from(HEX[usize::from(byte & 0xf)]));
        }
        text
    }

    /// The id spelled by 64 lowercase hex digits; `None` for anything else.
    pub fn from_hex(text: &str) -> Option<ChunkId> {
        let bytes = text.as_bytes();
        if bytes.len() != 64 {
            return None;
        }
        let mut id = [0u8; 32];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            id[i] = (hex_digit(pair[0])? << 4) | hex_digit(pair[1])?;
        }
        Some(ChunkId(id))
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

impl std::fmt::Display for ChunkId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl std::fmt::Debug for ChunkId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ChunkId({})", self.to_hex())
    }
}

/// One chunk of a file: its id and uncompressed length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRef {
    pub id: ChunkId,
    pub len: u32,
}

/// Cuts what `reader` yields into chunks and hands each to `each`, in order; returns the bytes
/// read. `window` is the caller's buffer, reused across calls: it grows to what `size_hint`
/// (the stream's expected length) needs, at least two of the largest chunks and at most
/// [`WINDOW`], so a small file costs a small buffer (a longer stream is cut all the same).
pub(crate) fn cut_stream(
    reader: &mut impl Read,
    window: &mut Vec<u8>,
    size_hint: u64,
    mut each: impl FnMut(&[u8]) -> Result<(), Error>,
) -> Result<u64, CutError> {
    let wanted = usize::try_from(size_hint.saturating_add(1))
        .unwrap_or(WINDOW)
        .clamp(2 * MAX_CHUNK, WINDOW);
    if window.len() < wanted {
        window.resize(wanted, 0);
    }
    let capacity = window.len();
    let mut filled = 0usize;
    let mut eof = false;
    let mut total = 0u64;
    loop {
        while !eof && filled < capacity {
            match reader.read(&mut window[filled..]) {
                Ok(0) => eof = true,
                Ok(n) => {
                    filled += n;
                    total += n as u64;
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(CutError::Read(error)),
            }
        }
        if filled == 0 {
            return Ok(total);
        }
        let mut consumed = 0usize;
        for chunk in FastCDC::new(&window[..filled], MIN_CHUNK, AVG_CHUNK, MAX_CHUNK) {
            // A chunk that could reach past the window may be cut where the window ends rather
            // than where the content says: it waits for the next fill (the window holds at
            // least two chunks, so the first one never waits).
            if !eof && chunk.offset + MAX_CHUNK > filled {
                break;
            }
            each(&window[chunk.offset..chunk.offset + chunk.length]).map_err(CutError::Store)?;
            consumed = chunk.offset + chunk.length;
        }
        window.copy_within(consumed..filled, 0);
        filled -= consumed;
    }
}

/// Why [`cut_stream`] stopped: the reader failed, or `each` did.
#[derive(Debug)]
pub(crate) enum CutError {
    Read(io::Error),
    Store(Error),
}

/// Compresses chunks for storage, reusing one zstd context.
pub(crate) struct Packer(zstd::bulk::Compressor<'static>);

impl Packer {
    pub(crate) fn new() -> Result<Packer, Error> {
        zstd::bulk::Compressor::new(ZSTD_LEVEL)
            .map(Packer)
            .map_err(|e| Error::io("cannot start zstd", e))
    }

    pub(crate) fn pack(&mut self, content: &[u8]) -> Result<Vec<u8>, Error> {
        self.0
            .compress(content)
            .map_err(|e| Error::io("cannot compress a chunk", e))
    }
}

thread_local! {
    /// One zstd decompression context per thread: making one costs more than a small chunk.
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// The content of chunk `id` from its stored bytes; `None` when they do not decompress to at
/// most [`MAX_CHUNK`] bytes whose hash is `id` (a broken chunk).
pub(crate) fn unpack(id: &ChunkId, stored: &[u8]) -> Option<Vec<u8>> {
    let content = DECOMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = zstd::bulk::Decompressor::new().ok();
        }
        match slot.as_mut() {
            Some(decompressor) => decompressor.decompress(stored, MAX_CHUNK).ok(),
            None => zstd::bulk::decompress(stored, MAX_CHUNK).ok(),
        }
    })?;
    (ChunkId::of(&content) == *id).then_some(content)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic bytes that do not repeat (xorshift), so FastCDC finds real cut points.
    fn noise(seed: u64, n: usize) -> Vec<u8> {
        let mut state = seed | 1;
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect()
    }

    fn cut_all(data: &[u8]) -> Vec<(usize, ChunkId)> {
        let mut window = Vec::new();
        let mut chunks = Vec::new();
        let read = cut_stream(&mut &data[..], &mut window, data.len() as u64, |chunk| {
            chunks.push((chunk.len(), ChunkId::of(chunk)));
            Ok(())
        })
        .expect("cuts");
        assert_eq!(read, data.len() as u64);
        chunks
    }

    #[test]
    fn a_stream_is_cut_where_chunking_it_whole_would_cut() {
        // Longer than the window, so cuts straddle refills.
        let data = noise(7, WINDOW * 2 + 12_345);
        let whole: Vec<(usize, ChunkId)> = FastCDC::new(&data, MIN_CHUNK, AVG_CHUNK, MAX_CHUNK)
            .map(|c| (c.length, ChunkId::of(&data[c.offset..c.offset + c.length])))
            .collect();
        assert_eq!(cut_all(&data), whole);
        assert!(whole.iter().all(|(len, _)| *len <= MAX_CHUNK));
    }

    #[test]
    fn chunk_sizes_stay_within_the_bounds() {
        let data = noise(3, 3 * 1024 * 1024);
        let chunks = cut_all(&data);
        let (last, rest) = chunks.split_last().expect("chunks");
        assert!(
            rest.iter()
                .all(|(len, _)| (MIN_CHUNK..=MAX_CHUNK).contains(len))
        );
        assert!(last.0 <= MAX_CHUNK);
        let average = data.len() / chunks.len();
        assert!(
            (AVG_CHUNK / 2..=AVG_CHUNK * 2).contains(&average),
            "average {average}"
        );
        assert!(cut_all(&[]).is_empty());
        assert_eq!(cut_all(b"tiny").len(), 1);
    }

    #[test]
    fn a_stored_chunk_opens_only_to_the_content_its_id_names() {
        let mut packer = Packer::new().expect("zstd");
        let content = b"hello chunk".repeat(100);
        let id = ChunkId::of(&content);
        let stored = packer.pack(&content).expect("packs");
        assert_eq!(unpack(&id, &stored).as_deref(), Some(&content[..]));
        let other = packer.pack(b"other content").expect("packs");
        assert_eq!(unpack(&id, &other), None, "content of another id");
        assert_eq!(unpack(&id, b"not zstd at all"), None, "garbage");
        let huge = packer.pack(&vec![0u8; MAX_CHUNK + 1]).expect("packs");
        assert_eq!(unpack(&ChunkId::of(&vec![0u8; MAX_CHUNK + 1]), &huge), None);
    }

    #[test]
    fn ids_round_trip_through_hex_and_refuse_anything_else() {
        let id = ChunkId::of(b"x");
        assert_eq!(ChunkId::from_hex(&id.to_hex()), Some(id));
        assert_eq!(
            id.to_hex(),
            "3ae7d805f6789a6402acb70ad4096a85a56bf6804eaf25c0493ac697548d30b5"
        );
        let upper = id.to_hex().to_uppercase();
        for bad in [
            "",
            "00",
            &upper,
            &format!("{}0", id.to_hex()),
            &"g".repeat(64),
        ] {
            assert_eq!(ChunkId::from_hex(bad), None, "{bad}");
        }
    }
}
