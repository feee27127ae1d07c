//! `range_header` and `last_event_id`: the two request headers Warren parses by hand.
//!
//! - `range_header`: `warren_http::range::parse_range` on arbitrary header bytes and a file size
//!   taken from the input (mostly small, sometimes huge), and `range_header`'s joining of
//!   repeated field lines. Oracle: a `Part` lies within `0..size` with `start <= end`; a header
//!   that cannot be a header value is never reached by a server, but still parses.
//! - `last_event_id`: the gateway's `sse::resume_after` on an arbitrary `Last-Event-ID` header
//!   and `after` query. Oracle: success is the number the header (else the query) spells, a
//!   refusal is the 400 `InvalidRequest`, and without either it resumes from 0.

use http::{HeaderMap, HeaderValue, header};
use warren_gateway::error::GatewayError;
use warren_http::range::{RangeAnswer, content_range, parse_range, range_header as joined_range};

pub fn range_header(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    // Small sizes reach every branch (empty file, suffix longer than the file); eight bytes of
    // input give any u64.
    let (size, header) = if selector & 1 == 0 || rest.len() < 8 {
        (u64::from(selector >> 1), rest)
    } else {
        let (size, header) = rest.split_at(8);
        (
            u64::from_be_bytes(size.try_into().expect("eight bytes")),
            header,
        )
    };
    check_answer(parse_range(header, size), size);
    if let Ok(value) = HeaderValue::from_bytes(header) {
        let mut headers = HeaderMap::new();
        headers.append(header::RANGE, value.clone());
        assert_eq!(joined_range(&headers).as_deref(), Some(header));
        headers.append(header::RANGE, value);
        let twice = joined_range(&headers).expect("two field lines");
        check_answer(parse_range(&twice, size), size);
    }
}

fn check_answer(answer: RangeAnswer, size: u64) {
    if let RangeAnswer::Part { start, end } = answer {
        assert!(start <= end, "{start}-{end} is backwards");
        assert!(end < size, "{start}-{end} is past the end of {size} bytes");
        assert!(!content_range(start, end, size).is_empty());
    }
}

pub fn last_event_id(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    // The header and the query are split at the first 0xff, which neither can usefully hold.
    let (header_bytes, query_bytes) = match rest.iter().position(|&b| b == 0xff) {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (rest, &[][..]),
    };
    let header = (selector & 1 != 0)
        .then(|| HeaderValue::from_bytes(header_bytes).ok())
        .flatten();
    let query = String::from_utf8_lossy(query_bytes);
    let query = (selector & 2 != 0).then_some(&*query);
    let expected = match (&header, query) {
        (Some(header), _) => header.to_str().ok().and_then(seq),
        (None, Some(query)) => seq(query),
        (None, None) => Some(0),
    };
    match warren_gateway::sse::resume_after(header.as_ref(), query) {
        Ok(after) => assert_eq!(Some(after), expected),
        Err(error) => {
            assert!(
                matches!(error, GatewayError::InvalidRequest(_)),
                "{error:?} is a 400"
            );
            assert_eq!(expected, None, "{error:?} refused a valid seq");
        }
    }
}

/// A seq as the SSE routes read one: a decimal u64, surrounding whitespace ignored.
fn seq(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}
