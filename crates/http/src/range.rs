//! HTTP byte ranges (RFC 9110 §14) for the file downloads of execd and the gateway:
//! [`parse_range`] decides what a `Range` header asks of a file of a known size, and
//! [`range_header`] reads that header from a request the way RFC 9110 §5.3 combines repeated
//! field lines. Pure functions of untrusted bytes; the callers open, seek and stream.
//!
//! Only a single range is ever served (no `multipart/byteranges`); what a server may ignore is
//! ignored, so the answer is then the whole file.

use axum::http::{HeaderMap, header};

/// The request's `Range` header: several field lines joined with commas, as RFC 9110 §5.3
/// combines them (which gives a header that names several ranges or is invalid, and so is
/// ignored by [`parse_range`]); `None` without one.
pub fn range_header(headers: &HeaderMap) -> Option<Vec<u8>> {
    headers
        .get_all(header::RANGE)
        .iter()
        .map(|value| value.as_bytes().to_vec())
        .reduce(|mut joined, value| {
            joined.extend_from_slice(b", ");
            joined.extend_from_slice(&value);
            joined
        })
}

/// What a download answers to a `Range` header, for a file of a given size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeAnswer {
    /// 200 with the whole file.
    Whole,
    /// 206 with bytes `start..=end` (both within the file).
    Part { start: u64, end: u64 },
    /// 416 with `Content-Range: bytes */<size>`.
    Unsatisfiable,
}

/// Reads a `Range` header (RFC 9110 §14) against a file of `size` bytes. A pure function of
/// untrusted bytes: it never panics, and a `Part` always lies within the file.
///
/// Only a single byte range is served. The RFC lets a server ignore a Range header, and this
/// one is ignored (the whole file, 200) when it is not valid UTF-8, names a unit other than
/// `bytes` (case-insensitive), is not valid syntax (`bytes=abc`, `bytes=4-2`, `bytes= 0-1`), or
/// asks for several ranges (`bytes=0-1,4-5`: no `multipart/byteranges`). Empty list elements
/// (`bytes=0-1,`) are allowed, as in every HTTP list. A valid single range that starts at or
/// past the end, or the suffix `-0`, is unsatisfiable. A suffix longer than the file is the
/// whole file as a 206; on an empty file, where no byte can be named, a suffix is the (empty)
/// whole file. Positions too large for a `u64` are as good as `u64::MAX`.
pub fn parse_range(header: &[u8], size: u64) -> RangeAnswer {
    let Ok(text) = std::str::from_utf8(header) else {
        return RangeAnswer::Whole;
    };
    let Some((unit, set)) = text.trim().split_once('=') else {
        return RangeAnswer::Whole;
    };
    if !unit.eq_ignore_ascii_case("bytes") {
        return RangeAnswer::Whole;
    }
    let mut specs = set
        .split(',')
        .map(str::trim)
        .filter(|spec| !spec.is_empty());
    let (Some(spec), None) = (specs.next(), specs.next()) else {
        return RangeAnswer::Whole;
    };
    let Some((first, last)) = spec.split_once('-') else {
        return RangeAnswer::Whole;
    };
    if first.is_empty() {
        return match digits(last) {
            None => RangeAnswer::Whole,
            Some(0) => RangeAnswer::Unsatisfiable,
            Some(_) if size == 0 => RangeAnswer::Whole,
            Some(suffix) => RangeAnswer::Part {
                start: size.saturating_sub(suffix),
                end: size - 1,
            },
        };
    }
    let Some(first) = digits(first) else {
        return RangeAnswer::Whole;
    };
    let last = match last {
        "" => None,
        last => match digits(last) {
            Some(last) if last >= first => Some(last),
            // Not a number, or before the first position: not a valid range.
            _ => return RangeAnswer::Whole,
        },
    };
    if first >= size {
        return RangeAnswer::Unsatisfiable;
    }
    RangeAnswer::Part {
        start: first,
        end: last.map_or(size - 1, |last| last.min(size - 1)),
    }
}

/// `1*DIGIT` as a number, saturating at `u64::MAX`; `None` for anything else (`+1`, ` 1`).
fn digits(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(text.bytes().fold(0u64, |n, digit| {
        n.saturating_mul(10).saturating_add(u64::from(digit - b'0'))
    }))
}

/// The `Content-Range` value of a 206 with bytes `start..=end` of a file of `size` bytes.
pub fn content_range(start: u64, end: u64, size: u64) -> String {
    format!("bytes {start}-{end}/{size}")
}

/// The `Content-Range` value of a 416 for a file of `size` bytes.
pub fn unsatisfied_range(size: u64) -> String {
    format!("bytes */{size}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_follow_rfc_9110() {
        use RangeAnswer::{Part, Unsatisfiable, Whole};
        let part = |start, end| Part { start, end };
        let table: &[(&[u8], u64, RangeAnswer)] = &[
            // Satisfiable single ranges.
            (b"bytes=0-3", 10, part(0, 3)),
            (b"bytes=5-", 10, part(5, 9)),
            (b"bytes=-3", 10, part(7, 9)),
            (b"bytes=-30", 10, part(0, 9)),
            (b"bytes=8-100", 10, part(8, 9)),
            (b"bytes=9-9", 10, part(9, 9)),
            (b"BYTES=0-0", 10, part(0, 0)),
            (b"  bytes=1-2  ", 10, part(1, 2)),
            (b"bytes=1-2,", 10, part(1, 2)),
            (b"bytes=, 1-2", 10, part(1, 2)),
            (b"bytes=0-18446744073709551616", 10, part(0, 9)),
            (b"bytes=-18446744073709551616", 10, part(0, 9)),
            // Valid but unsatisfiable.
            (b"bytes=10-", 10, Unsatisfiable),
            (b"bytes=999999-", 12, Unsatisfiable),
            (b"bytes=18446744073709551616-", 10, Unsatisfiable),
            (b"bytes=-0", 10, Unsatisfiable),
            (b"bytes=0-0", 0, Unsatisfiable),
            (b"bytes=0-", 0, Unsatisfiable),
            // A suffix of an empty file names no byte: the empty whole file.
            (b"bytes=-5", 0, Whole),
            // Several ranges: the whole file, never multipart/byteranges.
            (b"bytes=0-1,4-5", 10, Whole),
            (b"bytes=0-1, 0-1", 10, Whole),
            (b"bytes=50-,60-", 10, Whole),
            // Another unit, or not a valid header: ignored.
            (b"items=0-5", 10, Whole),
            (b"bytes=abc", 10, Whole),
            (b"bytes=4-2", 10, Whole),
            (b"bytes=+1-2", 10, Whole),
            (b"bytes=1-+2", 10, Whole),
            (b"bytes= 1 - 2", 10, Whole),
            (b"bytes =0-1", 10, Whole),
            (b"bytes=1", 10, Whole),
            (b"bytes=-", 10, Whole),
            (b"bytes=--1", 10, Whole),
            (b"bytes=0-1-2", 10, Whole),
            (b"bytes=", 10, Whole),
            (b"bytes=,", 10, Whole),
            (b"bytes", 10, Whole),
            (b"", 10, Whole),
            (b"bytes=0-1\xff", 10, Whole),
            (b"\xff\xfe", 10, Whole),
        ];
        for (header, size, expected) in table {
            let shown = String::from_utf8_lossy(header);
            assert_eq!(parse_range(header, *size), *expected, "{shown:?} of {size}");
        }
    }

    /// Every short header over the characters that matter: no panic, and a part lies within
    /// the file.
    #[test]
    fn every_short_range_header_gives_an_answer_within_the_file() {
        let alphabet = b"0 9-,=b\xff";
        let mut headers: Vec<Vec<u8>> = vec![Vec::new()];
        for _ in 0..5 {
            let longer: Vec<Vec<u8>> = headers
                .iter()
                .filter(|h| h.len() == headers.last().map_or(0, Vec::len))
                .flat_map(|h| {
                    alphabet.iter().map(move |c| {
                        let mut h = h.clone();
                        h.push(*c);
                        h
                    })
                })
                .collect();
            headers.extend(longer);
        }
        for rest in &headers {
            for prefix in [&b""[..], b"bytes=", b"Bytes=1"] {
                let header = [prefix, rest.as_slice()].concat();
                for size in [0, 1, 2, 10, u64::MAX] {
                    if let RangeAnswer::Part { start, end } = parse_range(&header, size) {
                        assert!(start <= end && end < size, "{header:?} of {size}");
                    }
                }
            }
        }
    }

    #[test]
    fn repeated_range_lines_are_joined_with_commas() {
        let mut headers = HeaderMap::new();
        assert_eq!(range_header(&headers), None);
        headers.append(header::RANGE, "bytes=0-1".parse().expect("header value"));
        assert_eq!(range_header(&headers).as_deref(), Some(&b"bytes=0-1"[..]));
        headers.append(header::RANGE, "bytes=4-5".parse().expect("header value"));
        let joined = range_header(&headers).expect("a Range header");
        assert_eq!(joined, b"bytes=0-1, bytes=4-5");
        assert_eq!(parse_range(&joined, 10), RangeAnswer::Whole);
    }
}
