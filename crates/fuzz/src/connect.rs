//! `connect_envelope`: execd's E2B Connect envelope codec (`e2b/connect.rs`). The input is read
//! as a request stream twice, once whole and once in chunks cut where the input's first byte
//! says, and every envelope's payload is decoded as a message in both codecs.
//!
//! Oracle: no panic; how the chunks fall changes nothing (the same envelopes, then the same
//! error or the same leftover); every envelope re-encodes to the bytes it was read from; a
//! payload that decodes as a message encodes and decodes back to the same message.

use warren_execd::e2b::connect::{
    Codec, ConnectError, ENVELOPE_HEADER_BYTES, Envelope, EnvelopeReader, Message, envelope,
};
use warren_execd::e2b::proto::{filesystem, process};

/// A small message limit for one of the readers, so the limit is reached with short inputs.
const SMALL_LIMIT: usize = 64;

pub fn connect_envelope(data: &[u8]) {
    let Some((&selector, stream)) = data.split_first() else {
        return;
    };
    let limit = if selector & 0x80 != 0 {
        SMALL_LIMIT
    } else {
        warren_execd::e2b::connect::MAX_MESSAGE_BYTES
    };
    let whole = read_all(stream, &[stream.len()], limit);
    let chunk_sizes: Vec<usize> = (0..stream.len())
        .map(|i| usize::from(selector & 0x0f).wrapping_add(i) % 7 + 1)
        .collect();
    let chunked = read_all(stream, &chunk_sizes, limit);
    assert_eq!(whole, chunked, "chunking changed the envelopes");

    let mut consumed = 0;
    for env in &whole.envelopes {
        let encoded = envelope(env.flags, &env.data);
        let end = consumed + ENVELOPE_HEADER_BYTES + env.data.len();
        assert_eq!(
            &encoded[..],
            &stream[consumed..end],
            "an envelope re-encodes to its bytes"
        );
        consumed = end;
        for codec in [Codec::Json, Codec::Proto] {
            match selector % 6 {
                0 => round_trip::<process::StartRequest>(codec, &env.data),
                1 => round_trip::<process::ConnectRequest>(codec, &env.data),
                2 => round_trip::<process::StreamInputRequest>(codec, &env.data),
                3 => round_trip::<process::SendSignalRequest>(codec, &env.data),
                4 => round_trip::<filesystem::ListDirRequest>(codec, &env.data),
                _ => round_trip::<filesystem::WatchDirRequest>(codec, &env.data),
            }
        }
    }
}

/// What a reader made of a stream.
#[derive(Debug, PartialEq)]
struct Read {
    envelopes: Vec<Envelope>,
    /// The error that stopped it, or the end-of-body check's verdict.
    end: Result<(), String>,
}

fn read_all(stream: &[u8], chunk_sizes: &[usize], limit: usize) -> Read {
    let mut reader = EnvelopeReader::new(limit);
    let mut envelopes = Vec::new();
    let mut rest = stream;
    for &size in chunk_sizes {
        if rest.is_empty() {
            break;
        }
        let (chunk, after) = rest.split_at(size.min(rest.len()));
        rest = after;
        reader.push(chunk);
        loop {
            match reader.next_envelope() {
                Ok(Some(env)) => envelopes.push(env),
                Ok(None) => break,
                Err(error) => return stopped(envelopes, &error),
            }
        }
    }
    let end = reader.finish().map_err(|error| describe(&error));
    Read { envelopes, end }
}

fn stopped(envelopes: Vec<Envelope>, error: &ConnectError) -> Read {
    Read {
        envelopes,
        end: Err(describe(error)),
    }
}

fn describe(error: &ConnectError) -> String {
    assert!(!error.message.is_empty(), "a Connect error says why");
    format!("{}: {}", error.code.as_str(), error.message)
}

fn round_trip<T: Message + PartialEq + std::fmt::Debug>(codec: Codec, payload: &[u8]) {
    let Ok(message) = codec.decode::<T>(payload) else {
        return;
    };
    let encoded = codec.encode(&message).expect("a decoded message encodes");
    let again = codec
        .decode::<T>(&encoded)
        .expect("an encoded message decodes");
    assert_eq!(again, message, "a message round-trips");
}
