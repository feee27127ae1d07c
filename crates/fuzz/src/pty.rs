//! `pty_client_frame`: a PTY client's WebSocket frame, as execd's holder loop reads it
//! (`pty/ws.rs`). Text frames go through the real two-step parse (`ClientFrameKind`, then
//! `ClientFrame`); binary frames through the channel check and the replay frame codec.
//!
//! Oracle: no panic; a text frame that parses re-encodes to JSON that parses to the same frame;
//! an invalid one says why; a replay frame that decodes re-encodes to the same bytes.

use warren_execd::pty::ws::{Parsed, parse_client_frame};
use warren_protocol::pty::{CHANNEL_STDIN, ClientFrame, decode_replay, encode_replay};

pub fn pty_client_frame(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        text_frame(text);
    }
    binary_frame(data);
}

fn text_frame(text: &str) {
    match parse_client_frame(text) {
        Parsed::Ignore => assert!(
            serde_json::from_str::<serde_json::Value>(text).is_err(),
            "only text that is not JSON is ignored"
        ),
        Parsed::Invalid(reason) => assert!(!reason.is_empty(), "an invalid frame says why"),
        Parsed::Frame(frame) => {
            let json = serde_json::to_string(&frame).expect("client frames serialise");
            match parse_client_frame(&json) {
                Parsed::Frame(again) => assert_eq!(again, frame, "{json} round-trips"),
                _ => panic!("the re-encoded frame {json} does not parse"),
            }
            if let ClientFrame::Stdin { data } = &frame {
                assert!(json.len() >= data.len(), "stdin survives re-encoding");
            }
        }
    }
}

fn binary_frame(bytes: &[u8]) {
    // The holder's whole handling of a binary frame, restated from `pty/ws.rs`: channel 0 with
    // at least one byte is stdin, anything else is ignored.
    let stdin = (bytes.len() > 1 && bytes[0] == CHANNEL_STDIN).then(|| &bytes[1..]);
    assert!(stdin.is_none_or(|stdin| !stdin.is_empty()));
    if let Some((offset, payload)) = decode_replay(bytes) {
        assert_eq!(
            encode_replay(offset, payload),
            bytes,
            "a replay frame round-trips"
        );
    }
    let offset = bytes.get(..8).map_or(0, |head| {
        u64::from_be_bytes(head.try_into().expect("eight bytes"))
    });
    let frame = encode_replay(offset, bytes);
    assert_eq!(decode_replay(&frame), Some((offset, bytes)));
}
