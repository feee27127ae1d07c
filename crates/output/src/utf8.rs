//! UTF-8 helpers for output read in pieces: where a trailing incomplete sequence starts, and
//! where the first whole character of a tail that was cut mid-stream begins.

/// Index where a trailing incomplete UTF-8 sequence starts (`bytes.len()` when the end is
/// complete or not UTF-8 at all). Only the last 3 bytes can belong to such a sequence.
pub fn incomplete_suffix_start(bytes: &[u8]) -> usize {
    let len = bytes.len();
    for back in 1..=len.min(3) {
        let byte = bytes[len - back];
        if byte & 0b1100_0000 == 0b1000_0000 {
            continue; // a continuation byte: look further back for the lead byte
        }
        let needed = match byte {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => return len,
        };
        return if needed > back { len - back } else { len };
    }
    len
}

/// Index of the first byte that is not a UTF-8 continuation byte (at most 3 skipped), for a
/// tail whose beginning was cut off.
pub fn first_char_boundary(bytes: &[u8]) -> usize {
    bytes
        .iter()
        .take(3)
        .take_while(|b| *b & 0b1100_0000 == 0b1000_0000)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_incomplete_suffixes() {
        let euro = "€".as_bytes(); // e2 82 ac
        let emoji = "😀".as_bytes(); // f0 9f 98 80
        let table: &[(&[u8], usize)] = &[
            (b"", 0),
            (b"abc", 3),
            (euro, 3),
            (&euro[..1], 0),
            (&euro[..2], 0),
            (&[b'a', euro[0], euro[1]], 1),
            (&emoji[..3], 0),
            (emoji, 4),
            (&[b'x', 0x80], 2),
            (&[0xff], 1),
        ];
        for (bytes, expected) in table {
            assert_eq!(incomplete_suffix_start(bytes), *expected, "{bytes:x?}");
        }
    }

    #[test]
    fn skips_leading_continuation_bytes() {
        let euro = "€".as_bytes();
        let table: &[(&[u8], usize)] = &[(b"abc", 0), (&euro[1..], 2), (&euro[2..], 1), (euro, 0)];
        for (bytes, expected) in table {
            assert_eq!(first_char_boundary(bytes), *expected, "{bytes:x?}");
        }
    }
}
