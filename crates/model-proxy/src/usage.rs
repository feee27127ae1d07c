//! Reading a model answer's token usage as it streams through the proxy: an incremental SSE
//! reader and, for a plain JSON answer, a bounded buffer parsed at the end, each feeding the
//! provider's own usage fields (not normalised): Anthropic `message_start`/`message_delta`,
//! OpenAI `response.*` events and Chat Completions `usage`, Gemini `usageMetadata`.
//!
//! Pure and bounded: the bytes are only observed (the proxy forwards them unchanged), at most
//! one partial SSE line and one event's data of [`MAX_SSE_EVENT_BYTES`] are held, and at most
//! [`MAX_JSON_BYTES`] of a JSON answer; what does not fit is skipped, never an error.

use serde_json::Value;

use super::provider::Provider;

/// The most one SSE line, or one event's data, may hold before it is skipped.
pub const MAX_SSE_EVENT_BYTES: usize = 1 << 20;
/// The most of a non-SSE answer kept for parsing at its end.
pub const MAX_JSON_BYTES: usize = 4 << 20;

/// The counts one answer reported, in the provider's own terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    pub model: Option<String>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
}

/// How the answer's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `text/event-stream`.
    Sse,
    /// Anything else: one JSON value (a Gemini stream without `alt=sse` is a JSON array).
    Json,
}

impl Framing {
    pub fn of_content_type(content_type: Option<&str>) -> Framing {
        let is_sse = content_type.is_some_and(|ct| {
            ct.split(';')
                .next()
                .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("text/event-stream"))
        });
        if is_sse { Framing::Sse } else { Framing::Json }
    }
}

/// Feeds on an answer's body chunk by chunk; [`UsageParser::finish`] says what it reported.
#[derive(Debug)]
pub struct UsageParser {
    provider: Provider,
    framing: Framing,
    usage: Usage,
    /// SSE: the line read so far; JSON: the body so far.
    pending: Vec<u8>,
    /// SSE: the current line is too long and is skipped up to its end; JSON: the body is too
    /// long and is not parsed.
    skipping: bool,
    /// SSE: the `data` lines of the current event, joined by `\n`.
    data: Vec<u8>,
    /// SSE: the current event's data is too long and is dropped at its end.
    data_too_long: bool,
}

impl UsageParser {
    /// `model` is what the request named, if known without reading its body (Gemini's path).
    pub fn new(provider: Provider, framing: Framing, model: Option<String>) -> UsageParser {
        UsageParser {
            provider,
            framing,
            usage: Usage {
                model,
                ..Usage::default()
            },
            pending: Vec::new(),
            skipping: false,
            data: Vec::new(),
            data_too_long: false,
        }
    }

    pub fn feed(&mut self, mut chunk: &[u8]) {
        match self.framing {
            Framing::Json => {
                if self.pending.len() + chunk.len() > MAX_JSON_BYTES {
                    self.skipping = true;
                    self.pending = Vec::new();
                }
                if !self.skipping {
                    self.pending.extend_from_slice(chunk);
                }
            }
            Framing::Sse => {
                while let Some(newline) = chunk.iter().position(|&b| b == b'\n') {
                    let (head, tail) = chunk.split_at(newline);
                    chunk = &tail[1..];
                    if self.skipping {
                        self.skipping = false;
                        self.pending.clear();
                        continue;
                    }
                    let line = if self.pending.is_empty() {
                        head.to_vec()
                    } else {
                        let mut line = std::mem::take(&mut self.pending);
                        line.extend_from_slice(head);
                        line
                    };
                    self.sse_line(&line);
                }
                if self.skipping {
                    return;
                }
                if self.pending.len() + chunk.len() > MAX_SSE_EVENT_BYTES {
                    self.skipping = true;
                    self.pending = Vec::new();
                } else {
                    self.pending.extend_from_slice(chunk);
                }
            }
        }
    }

    /// The usage the answer reported (zeros when it reported none).
    pub fn finish(mut self) -> Usage {
        match self.framing {
            Framing::Json => {
                if !self.skipping
                    && let Ok(value) = serde_json::from_slice::<Value>(&self.pending)
                {
                    match value {
                        // A Gemini stream without `alt=sse`: an array of chunks.
                        Value::Array(items) => items.iter().for_each(|item| self.apply(item)),
                        value => self.apply(&value),
                    }
                }
            }
            Framing::Sse => {
                // An answer cut off after a last line without its newline or blank line.
                if !self.skipping && !self.pending.is_empty() {
                    let line = std::mem::take(&mut self.pending);
                    self.sse_line(&line);
                }
                self.dispatch();
            }
        }
        self.usage
    }

    fn sse_line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            self.dispatch();
            return;
        }
        let Some(value) = line.strip_prefix(b"data:") else {
            // `event:`, `id:`, `retry:` and comments: the data says all the parser needs.
            return;
        };
        let value = value.strip_prefix(b" ").unwrap_or(value);
        if self.data_too_long {
            return;
        }
        if self.data.len() + value.len() + 1 > MAX_SSE_EVENT_BYTES {
            self.data_too_long = true;
            self.data = Vec::new();
            return;
        }
        if !self.data.is_empty() {
            self.data.push(b'\n');
        }
        self.data.extend_from_slice(value);
    }

    fn dispatch(&mut self) {
        let data = std::mem::take(&mut self.data);
        let too_long = std::mem::replace(&mut self.data_too_long, false);
        if too_long || data.is_empty() || data == b"[DONE]" {
            return;
        }
        if let Ok(value) = serde_json::from_slice::<Value>(&data) {
            self.apply(&value);
        }
    }

    fn apply(&mut self, value: &Value) {
        match self.provider {
            Provider::Anthropic => self.anthropic(value),
            Provider::OpenAi => self.openai(value),
            Provider::Gemini => self.gemini(value),
        }
    }

    /// `message_start.message` and a whole `message` carry the model and the usage so far;
    /// `message_delta.usage` updates the counts it names (`output_tokens` is cumulative).
    fn anthropic(&mut self, value: &Value) {
        let message = match value["type"].as_str() {
            Some("message_start") => &value["message"],
            Some("message") => value,
            Some("message_delta") => {
                self.anthropic_usage(&value["usage"]);
                return;
            }
            _ => return,
        };
        self.answer_model(&message["model"]);
        self.anthropic_usage(&message["usage"]);
    }

    fn anthropic_usage(&mut self, usage: &Value) {
        set(&mut self.usage.input_tokens, &usage["input_tokens"]);
        set(&mut self.usage.output_tokens, &usage["output_tokens"]);
        set(
            &mut self.usage.cache_read_tokens,
            &usage["cache_read_input_tokens"],
        );
        set(
            &mut self.usage.cache_write_tokens,
            &usage["cache_creation_input_tokens"],
        );
    }

    /// Responses: `response.*` events carry the `response` (usage on `response.completed`,
    /// `response.incomplete`, `response.failed`), a whole answer is a `response` object. Chat
    /// Completions: a chunk's or the answer's `usage`.
    fn openai(&mut self, value: &Value) {
        let response = if value["type"]
            .as_str()
            .is_some_and(|t| t.starts_with("response."))
        {
            &value["response"]
        } else if value["object"] == "response" {
            value
        } else {
            self.answer_model(&value["model"]);
            let usage = &value["usage"];
            set(&mut self.usage.input_tokens, &usage["prompt_tokens"]);
            set(&mut self.usage.output_tokens, &usage["completion_tokens"]);
            set(
                &mut self.usage.cache_read_tokens,
                &usage["prompt_tokens_details"]["cached_tokens"],
            );
            return;
        };
        self.answer_model(&response["model"]);
        let usage = &response["usage"];
        set(&mut self.usage.input_tokens, &usage["input_tokens"]);
        set(&mut self.usage.output_tokens, &usage["output_tokens"]);
        set(
            &mut self.usage.cache_read_tokens,
            &usage["input_tokens_details"]["cached_tokens"],
        );
    }

    /// The last chunk's `usageMetadata` counts; thoughts are output. The model is the one the
    /// path named, else the answer's `modelVersion`.
    fn gemini(&mut self, value: &Value) {
        if self.usage.model.is_none()
            && let Some(version) = value["modelVersion"].as_str()
        {
            self.usage.model = Some(version.to_string());
        }
        let metadata = &value["usageMetadata"];
        if !metadata.is_object() {
            return;
        }
        let count = |name: &str| metadata[name].as_u64().unwrap_or(0);
        self.usage.input_tokens = count("promptTokenCount");
        self.usage.output_tokens = count("candidatesTokenCount") + count("thoughtsTokenCount");
        self.usage.cache_read_tokens = count("cachedContentTokenCount");
    }

    /// The model the answer names (Anthropic, OpenAI): it is what ran, so it wins.
    fn answer_model(&mut self, model: &Value) {
        if let Some(model) = model.as_str().filter(|m| !m.is_empty()) {
            self.usage.model = Some(model.to_string());
        }
    }
}

/// Overwrites `field` with `value` when the answer reports it.
fn set(field: &mut u64, value: &Value) {
    if let Some(n) = value.as_u64() {
        *field = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANTHROPIC_STREAM: &str = concat!(
        "event: message_start\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-5-20250929\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":12,\"cache_creation_input_tokens\":300,\"cache_read_input_tokens\":4000,\"output_tokens\":1}}}\n",
        "\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n",
        "\n",
        "event: ping\n",
        "data: {\"type\": \"ping\"}\n",
        "\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n",
        "\n",
        "event: content_block_stop\n",
        "data: {\"type\":\"content_block_stop\",\"index\":0}\n",
        "\n",
        "event: message_delta\n",
        "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n",
        "\n",
        "event: message_delta\n",
        "data: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"output_tokens\":42}}\n",
        "\n",
        "event: message_stop\n",
        "data: {\"type\":\"message_stop\"}\n",
        "\n",
    );

    const OPENAI_RESPONSES_STREAM: &str = concat!(
        "event: response.created\r\n",
        "data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"model\":\"gpt-5-codex\",\"usage\":null}}\r\n",
        "\r\n",
        "event: response.output_text.delta\r\n",
        "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":4,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hi\"}\r\n",
        "\r\n",
        "event: response.completed\r\n",
        "data: {\"type\":\"response.completed\",\"sequence_number\":9,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"completed\",\"model\":\"gpt-5-codex-2025\",\"usage\":{\"input_tokens\":328,\"input_tokens_details\":{\"cached_tokens\":256},\"output_tokens\":52,\"output_tokens_details\":{\"reasoning_tokens\":32},\"total_tokens\":380}}}\r\n",
        "\r\n",
    );

    const OPENAI_CHAT_STREAM: &str = concat!(
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o-2024-08-06\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o-2024-08-06\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o-2024-08-06\",\"choices\":[],\"usage\":{\"prompt_tokens\":19,\"completion_tokens\":10,\"total_tokens\":29,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n",
        "data: [DONE]\n\n",
    );

    const GEMINI_STREAM: &str = concat!(
        "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"Hel\"}],\"role\": \"model\"},\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 9,\"totalTokenCount\": 9},\"modelVersion\": \"gemini-2.5-pro\"}\r\n\r\n",
        "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"lo\"}],\"role\": \"model\"},\"finishReason\": \"STOP\",\"index\": 0}],\"usageMetadata\": {\"promptTokenCount\": 1200,\"candidatesTokenCount\": 30,\"totalTokenCount\": 1250,\"cachedContentTokenCount\": 1024,\"thoughtsTokenCount\": 20},\"modelVersion\": \"gemini-2.5-pro\",\"responseId\": \"abc\"}\r\n\r\n",
    );

    fn usage(model: &str, counts: [u64; 4]) -> Usage {
        Usage {
            model: Some(model.to_string()),
            input_tokens: counts[0],
            output_tokens: counts[1],
            cache_read_tokens: counts[2],
            cache_write_tokens: counts[3],
        }
    }

    fn parse(provider: Provider, framing: Framing, model: Option<&str>, chunks: &[&[u8]]) -> Usage {
        let mut parser = UsageParser::new(provider, framing, model.map(str::to_string));
        for chunk in chunks {
            parser.feed(chunk);
        }
        parser.finish()
    }

    #[test]
    fn recorded_answers_report_the_providers_numbers() {
        // What, provider, framing, the request's model, the answer, what it reported.
        type Case<'a> = (&'a str, Provider, Framing, Option<&'a str>, &'a str, Usage);
        let cases: Vec<Case> = vec![
            (
                "anthropic stream: message_start, then the last message_delta's output",
                Provider::Anthropic,
                Framing::Sse,
                None,
                ANTHROPIC_STREAM,
                usage("claude-sonnet-4-5-20250929", [12, 42, 4000, 300]),
            ),
            (
                "anthropic message",
                Provider::Anthropic,
                Framing::Json,
                None,
                r#"{"id":"msg_02","type":"message","role":"assistant","model":"claude-haiku-4-5","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","usage":{"input_tokens":7,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":3}}"#,
                usage("claude-haiku-4-5", [7, 3, 0, 0]),
            ),
            (
                "openai responses stream",
                Provider::OpenAi,
                Framing::Sse,
                None,
                OPENAI_RESPONSES_STREAM,
                usage("gpt-5-codex-2025", [328, 52, 256, 0]),
            ),
            (
                "openai response",
                Provider::OpenAi,
                Framing::Json,
                None,
                r#"{"id":"resp_2","object":"response","model":"gpt-4.1","output":[],"usage":{"input_tokens":5,"input_tokens_details":{"cached_tokens":0},"output_tokens":6,"total_tokens":11}}"#,
                usage("gpt-4.1", [5, 6, 0, 0]),
            ),
            (
                "openai chat completions stream with include_usage",
                Provider::OpenAi,
                Framing::Sse,
                None,
                OPENAI_CHAT_STREAM,
                usage("gpt-4o-2024-08-06", [19, 10, 0, 0]),
            ),
            (
                "openai chat completion",
                Provider::OpenAi,
                Framing::Json,
                None,
                r#"{"id":"chatcmpl-2","object":"chat.completion","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":2006,"completion_tokens":300,"total_tokens":2306,"prompt_tokens_details":{"cached_tokens":1920}}}"#,
                usage("gpt-4o-mini", [2006, 300, 1920, 0]),
            ),
            (
                "gemini sse stream: the last usageMetadata, thoughts as output",
                Provider::Gemini,
                Framing::Sse,
                Some("gemini-2.5-pro"),
                GEMINI_STREAM,
                usage("gemini-2.5-pro", [1200, 50, 1024, 0]),
            ),
            (
                "gemini stream without alt=sse: a JSON array; model from the answer",
                Provider::Gemini,
                Framing::Json,
                None,
                r#"[{"candidates":[],"usageMetadata":{"promptTokenCount":4},"modelVersion":"gemini-2.5-flash-001"},
{"candidates":[],"usageMetadata":{"promptTokenCount":4,"candidatesTokenCount":8,"totalTokenCount":12},"modelVersion":"gemini-2.5-flash-001"}]"#,
                usage("gemini-2.5-flash-001", [4, 8, 0, 0]),
            ),
            (
                "gemini generateContent",
                Provider::Gemini,
                Framing::Json,
                Some("gemini-2.5-flash"),
                r#"{"candidates":[],"usageMetadata":{"promptTokenCount":3,"candidatesTokenCount":1,"totalTokenCount":4},"modelVersion":"gemini-2.5-flash-002"}"#,
                usage("gemini-2.5-flash", [3, 1, 0, 0]),
            ),
            (
                "an error answer reports nothing",
                Provider::Anthropic,
                Framing::Json,
                None,
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
                Usage::default(),
            ),
            (
                "an anthropic stream cut off after message_start keeps its numbers",
                Provider::Anthropic,
                Framing::Sse,
                None,
                &ANTHROPIC_STREAM[..ANTHROPIC_STREAM
                    .find("event: content_block_start")
                    .expect("in the stream")
                    - 1],
                usage("claude-sonnet-4-5-20250929", [12, 1, 4000, 300]),
            ),
            (
                "a last event without its blank line still counts",
                Provider::OpenAi,
                Framing::Sse,
                None,
                OPENAI_CHAT_STREAM
                    .trim_end_matches("data: [DONE]\n\n")
                    .trim_end(),
                usage("gpt-4o-2024-08-06", [19, 10, 0, 0]),
            ),
        ];
        for (what, provider, framing, model, body, expected) in cases {
            let got = parse(provider, framing, model, &[body.as_bytes()]);
            assert_eq!(got, expected, "{what}");
        }
    }

    #[test]
    fn events_split_at_any_byte_read_the_same() {
        let body = ANTHROPIC_STREAM.as_bytes();
        let whole = parse(Provider::Anthropic, Framing::Sse, None, &[body]);
        for at in 0..=body.len() {
            let (head, tail) = body.split_at(at);
            let split = parse(Provider::Anthropic, Framing::Sse, None, &[head, tail]);
            assert_eq!(split, whole, "split at byte {at}");
        }
        let bytes: Vec<&[u8]> = OPENAI_RESPONSES_STREAM.as_bytes().chunks(1).collect();
        assert_eq!(
            parse(Provider::OpenAi, Framing::Sse, None, &bytes),
            usage("gpt-5-codex-2025", [328, 52, 256, 0]),
            "byte by byte, CRLF lines"
        );
    }

    #[test]
    fn an_oversized_line_is_skipped_and_memory_stays_bounded() {
        let mut parser = UsageParser::new(Provider::Anthropic, Framing::Sse, None);
        let start = ANTHROPIC_STREAM.split("\n\n").next().expect("first event");
        parser.feed(start.as_bytes());
        parser.feed(b"\n\ndata: {\"type\":\"content_block_delta\",\"text\":\"");
        let filler = vec![b'x'; 64 * 1024];
        for _ in 0..(2 * MAX_SSE_EVENT_BYTES / filler.len()) {
            parser.feed(&filler);
            assert!(parser.pending.len() <= MAX_SSE_EVENT_BYTES);
            assert!(parser.data.len() <= MAX_SSE_EVENT_BYTES);
        }
        parser.feed(b"\"}\n\n");
        parser.feed(b"data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\n");
        assert_eq!(
            parser.finish(),
            usage("claude-sonnet-4-5-20250929", [12, 9, 4000, 300])
        );

        let mut parser = UsageParser::new(Provider::OpenAi, Framing::Json, None);
        let filler = vec![b' '; 1 << 20];
        for _ in 0..5 {
            parser.feed(&filler);
            assert!(parser.pending.len() <= MAX_JSON_BYTES);
        }
        parser.feed(br#"{"object":"chat.completion","usage":{"prompt_tokens":1}}"#);
        assert_eq!(
            parser.finish(),
            Usage::default(),
            "past 4 MiB nothing is read"
        );
    }

    #[test]
    fn content_types_pick_the_framing() {
        let cases = [
            (Some("text/event-stream"), Framing::Sse),
            (Some("text/event-stream; charset=utf-8"), Framing::Sse),
            (Some("Text/Event-Stream"), Framing::Sse),
            (Some("application/json"), Framing::Json),
            (None, Framing::Json),
        ];
        for (content_type, expected) in cases {
            assert_eq!(
                Framing::of_content_type(content_type),
                expected,
                "{content_type:?}"
            );
        }
    }
}
