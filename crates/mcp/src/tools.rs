//! The MCP server: four tools (`exec_command`, `write_stdin`, `list_sessions`,
//! `kill_session`) over an [`ExecBackend`].
//!
//! Each tool's text content is the Codex-layout text the engine renders and its structured
//! content is the JSON result. Every failure a model can cause or fix (bad arguments, unknown
//! session, bad workdir, unreachable execd) is a tool error (`isError: true`) whose text says
//! what went wrong, so the model sees it and can correct itself; only an unknown tool name is a
//! protocol error. The arguments are parsed here rather than by rmcp's `Parameters` extractor
//! for that reason: its parse failures are protocol errors the model never sees.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde::de::DeserializeOwned;
use serde_json::Value;
use warren_protocol::exec::{
    ExecCommandArgs, ExecResult, KillSessionArgs, ListSessionsArgs, SessionList, WriteStdinArgs,
};

use crate::backend::{BackendError, ExecBackend};
use crate::schema::{input_schema, output_schema};

const EXEC_COMMAND_DESCRIPTION: &str = "\
Run a shell command (`bash -lc <cmd>`) and return its output.
Two separate waits: `yield_time_ms` (default 10000, max 30000) is how long this call waits \
before returning; it never kills. If the command is still running then, the result has a \
`session_id`: poll it with write_stdin and empty `chars`. `timeout_ms` is the command's \
lifetime: when it expires the process tree is killed and the exit code is 124.
The call also returns early when the command waits for input (a password, `[Y/n]`, a REPL \
prompt): status `awaiting_input`. Answer with write_stdin or kill it with kill_session.
Use `tty: true` for programs that need a terminal. Start servers and watchers here and poll \
them; they keep running between calls.";

const WRITE_STDIN_DESCRIPTION: &str = "\
Write `chars` to a running session's stdin and return its new output. No newline is added: \
send `\\n` to press Enter.
Empty `chars` polls: the call waits `yield_time_ms` (default 5000, up to 300000) and returns \
early when the command exits or waits for input. Poll to follow a long command instead of \
starting it again. `\\u0003` interrupts the command (Ctrl-C), `\\u0004` closes its stdin (Ctrl-D).
When a result shows the exit code, the session is gone and its id is unknown afterwards.";

const LIST_SESSIONS_DESCRIPTION: &str = "\
List the sessions that are still running or have unread output: id, command, workdir, \
status, pid, idle time, unread bytes. Use it to find a session id you lost.";

const KILL_SESSION_DESCRIPTION: &str = "\
Kill a session's whole process tree (SIGTERM, then SIGKILL after a grace period) and return \
its final output and exit code.";

/// Server instructions sent at initialization.
const INSTRUCTIONS: &str = "\
Warren runs shell commands for you: exec_command starts one, write_stdin answers prompts or \
polls, list_sessions finds running sessions, kill_session stops one. Commands that outlive \
a call keep running; poll them instead of starting them again.";

/// The exec tools as an MCP server. Cheap to clone: one per MCP connection.
#[derive(Clone)]
pub struct ExecTools {
    backend: ExecBackend,
    tools: Arc<[Tool]>,
}

impl ExecTools {
    pub fn new(backend: ExecBackend) -> Self {
        Self {
            backend,
            tools: tool_definitions().into(),
        }
    }

    /// Runs the tool `name` with `arguments`. Unknown names are the only protocol error.
    pub async fn call(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
    ) -> Result<CallToolResult, ErrorData> {
        let arguments = arguments.unwrap_or_default();
        let outcome = match name {
            "exec_command" => match parse::<ExecCommandArgs>(arguments) {
                Ok(args) => self.backend.exec_command(args).await.map(exec_result),
                Err(message) => Err(message),
            },
            "write_stdin" => match parse::<WriteStdinArgs>(arguments) {
                Ok(args) => self.backend.write_stdin(args).await.map(exec_result),
                Err(message) => Err(message),
            },
            "list_sessions" => match parse::<ListSessionsArgs>(arguments) {
                Ok(ListSessionsArgs {}) => self.backend.list_sessions().await.map(session_list),
                Err(message) => Err(message),
            },
            "kill_session" => match parse::<KillSessionArgs>(arguments) {
                Ok(args) => self
                    .backend
                    .kill_session(args.session_id)
                    .await
                    .map(exec_result),
                Err(message) => Err(message),
            },
            _ => {
                return Err(ErrorData::invalid_params(
                    format!("unknown tool {name:?}"),
                    None,
                ));
            }
        };
        Ok(outcome.unwrap_or_else(|error| {
            tracing::debug!(tool = name, %error, "tool call failed");
            CallToolResult::error(vec![ContentBlock::text(format!("{name} failed: {error}"))])
        }))
    }
}

impl ServerHandler for ExecTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("warren", env!("CARGO_PKG_VERSION")).with_title("Warren"),
            )
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools.to_vec()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|tool| tool.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.call(&request.name, request.arguments)
            .await
            .map(CallToolResponse::from)
    }
}

/// The four tool definitions, with schemas generated from the protocol types.
pub fn tool_definitions() -> Vec<Tool> {
    let result_schema = output_schema::<ExecResult>(&["text"]);
    vec![
        Tool::new(
            "exec_command",
            EXEC_COMMAND_DESCRIPTION,
            input_schema::<ExecCommandArgs>(),
        )
        .with_title("Run a shell command")
        .with_raw_output_schema(result_schema.clone())
        .with_annotations(
            ToolAnnotations::with_title("Run a shell command")
                .read_only(false)
                .destructive(true)
                .idempotent(false)
                .open_world(true),
        ),
        Tool::new(
            "write_stdin",
            WRITE_STDIN_DESCRIPTION,
            input_schema::<WriteStdinArgs>(),
        )
        .with_title("Write to or poll a session")
        .with_raw_output_schema(result_schema.clone())
        .with_annotations(
            ToolAnnotations::with_title("Write to or poll a session")
                .read_only(false)
                .destructive(true)
                .idempotent(false)
                .open_world(true),
        ),
        Tool::new(
            "list_sessions",
            LIST_SESSIONS_DESCRIPTION,
            input_schema::<ListSessionsArgs>(),
        )
        .with_title("List exec sessions")
        .with_raw_output_schema(output_schema::<SessionList>(&[]))
        .with_annotations(
            ToolAnnotations::with_title("List exec sessions")
                .read_only(true)
                .idempotent(true)
                .open_world(false),
        ),
        Tool::new(
            "kill_session",
            KILL_SESSION_DESCRIPTION,
            input_schema::<KillSessionArgs>(),
        )
        .with_title("Kill a session")
        .with_raw_output_schema(result_schema)
        .with_annotations(
            ToolAnnotations::with_title("Kill a session")
                .read_only(false)
                .destructive(true)
                .idempotent(false)
                .open_world(false),
        ),
    ]
}

/// Deserializes tool arguments; the error names the field (`missing field `cmd``).
fn parse<T: DeserializeOwned>(mut arguments: JsonObject) -> Result<T, BackendError> {
    arguments.values_mut().for_each(integral_float_to_integer);
    serde_json::from_value(Value::Object(arguments))
        .map_err(|e| BackendError::Rejected(format!("invalid arguments: {e}")))
}

/// Some clients send every number as a float (`"yield_time_ms": 5000.0`); a whole float means
/// the integer, so it should not be refused as a wrong type. Fractions still are.
fn integral_float_to_integer(value: &mut Value) {
    let Some(float) = value.as_f64().filter(|_| value.is_f64()) else {
        return;
    };
    if float.fract() == 0.0 && float >= 0.0 && float <= u64::MAX as f64 {
        *value = Value::from(float as u64);
    } else if float.fract() == 0.0 && float < 0.0 && float >= i64::MIN as f64 {
        *value = Value::from(float as i64);
    }
}

/// Text content: the rendered Codex-layout text; structured content: the result without it.
fn exec_result(result: ExecResult) -> CallToolResult {
    let mut structured = match serde_json::to_value(&result) {
        Ok(Value::Object(object)) => object,
        // A struct of strings and numbers always serializes to an object; an empty object is
        // the least surprising stand-in should that ever change.
        _ => JsonObject::new(),
    };
    structured.remove("text");
    // Rendered here rather than taken from `result.text`, so both backends give the same
    // layout whatever the remote execd's version filled in.
    let text = warren_exec::render_text(&result);
    let mut call_result = CallToolResult::success(vec![ContentBlock::text(text)]);
    call_result.structured_content = Some(Value::Object(structured));
    call_result
}

fn session_list(list: SessionList) -> CallToolResult {
    let text = render_session_list(&list);
    let structured =
        serde_json::to_value(&list).unwrap_or_else(|_| Value::Object(JsonObject::new()));
    let mut call_result = CallToolResult::success(vec![ContentBlock::text(text)]);
    call_result.structured_content = Some(structured);
    call_result
}

/// One line per session, most useful fields first, the command last (it may be long).
pub fn render_session_list(list: &SessionList) -> String {
    if list.sessions.is_empty() {
        return "No sessions.".to_owned();
    }
    let mut text = match list.sessions.len() {
        1 => "1 session:\n".to_owned(),
        n => format!("{n} sessions:\n"),
    };
    for session in &list.sessions {
        let status = match (session.status, session.exit_code) {
            (_, Some(code)) => format!("exited with code {code}"),
            (warren_protocol::exec::ExecStatus::AwaitingInput, None) => {
                "waiting for input".to_owned()
            }
            _ => "running".to_owned(),
        };
        let mode = if session.tty { "tty" } else { "pipes" };
        text.push_str(&format!(
            "Session {}: {status}, pid {}, {mode}, idle {:.1} s, {} unread bytes, workdir {}, started {}: {}\n",
            session.session_id,
            session.pid,
            session.idle_ms as f64 / 1000.0,
            session.unread_bytes,
            session.workdir,
            session.started_at,
            session.cmd,
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use warren_protocol::exec::{ExecStatus, SessionInfo};

    use super::*;
    use crate::backend::RemoteExecd;

    /// A server whose backend would fail every call: argument errors must come first.
    fn tools_without_backend() -> ExecTools {
        let remote = RemoteExecd::new("http://127.0.0.1:9", None).expect("client builds");
        ExecTools::new(ExecBackend::Remote(remote))
    }

    fn object(value: Value) -> Option<JsonObject> {
        match value {
            Value::Object(object) => Some(object),
            _ => None,
        }
    }

    #[tokio::test]
    async fn bad_arguments_are_tool_errors_that_name_the_field() {
        let tools = tools_without_backend();
        let cases = [
            (
                "exec_command",
                None,
                "exec_command failed: invalid arguments: missing field `cmd`",
            ),
            (
                "exec_command",
                object(json!({"cmd": "ls", "tty": "yes"})),
                "exec_command failed: invalid arguments: invalid type: string \"yes\", expected a boolean",
            ),
            (
                "write_stdin",
                object(json!({"chars": "y\n"})),
                "write_stdin failed: invalid arguments: missing field `session_id`",
            ),
            (
                "kill_session",
                object(json!({"session_id": -4})),
                "kill_session failed: invalid arguments: invalid value: integer `-4`, expected u32",
            ),
        ];
        for (name, arguments, expected) in cases {
            let result = tools.call(name, arguments).await.expect("a tool result");
            assert_eq!(result.is_error, Some(true), "{name}");
            let text = result.content[0]
                .as_text()
                .map(|t| t.text.clone())
                .unwrap_or_default();
            assert_eq!(text, expected);
            assert_eq!(result.structured_content, None);
        }
    }

    #[test]
    fn whole_floats_are_accepted_as_integers_and_fractions_are_not() {
        let parsed: Result<WriteStdinArgs, _> =
            parse(object(json!({"session_id": 4242.0, "yield_time_ms": 5000.0})).expect("object"));
        let parsed = parsed.expect("whole floats parse");
        assert_eq!(
            (parsed.session_id, parsed.yield_time_ms),
            (4242, Some(5000))
        );
        let fraction: Result<WriteStdinArgs, _> =
            parse(object(json!({"session_id": 4242.5})).expect("object"));
        let error = fraction
            .expect_err("a fraction is not a session id")
            .to_string();
        assert!(
            error.contains("invalid type: floating point `4242.5`"),
            "{error}"
        );
        let negative: Result<KillSessionArgs, _> =
            parse(object(json!({"session_id": -3.0})).expect("object"));
        let error = negative.expect_err("negative").to_string();
        assert!(error.contains("invalid value: integer `-3`"), "{error}");
    }

    #[tokio::test]
    async fn unknown_tool_is_a_protocol_error() {
        let error = tools_without_backend()
            .call("rm", None)
            .await
            .expect_err("unknown tool");
        assert!(error.message.contains("unknown tool \"rm\""), "{error:?}");
    }

    #[test]
    fn every_tool_has_an_object_input_schema_and_a_description() {
        let tools = tool_definitions();
        assert_eq!(tools.len(), 4);
        for tool in &tools {
            assert_eq!(
                tool.input_schema.get("type"),
                Some(&json!("object")),
                "{}",
                tool.name
            );
            assert!(tool.output_schema.is_some(), "{}", tool.name);
            assert!(
                tool.description.as_deref().is_some_and(|d| d.len() > 80),
                "{}",
                tool.name
            );
        }
    }

    #[test]
    fn descriptions_teach_the_semantics() {
        let tools = tool_definitions();
        let description = |name: &str| {
            tools
                .iter()
                .find(|tool| tool.name == name)
                .and_then(|tool| tool.description.as_deref())
                .unwrap_or_default()
                .to_owned()
        };
        let cases: [(&str, &[&str]); 4] = [
            (
                "exec_command",
                &[
                    "`yield_time_ms`",
                    "never kills",
                    "`timeout_ms`",
                    "124",
                    "empty `chars`",
                    "awaiting_input",
                    "kill_session",
                ],
            ),
            (
                "write_stdin",
                &[
                    "Empty `chars` polls",
                    "`\\u0003`",
                    "`\\u0004`",
                    "No newline is added",
                ],
            ),
            ("list_sessions", &["session id you lost"]),
            ("kill_session", &["process tree", "exit code"]),
        ];
        for (name, needles) in cases {
            let text = description(name);
            for needle in needles {
                assert!(text.contains(needle), "{name} lacks {needle:?}: {text}");
            }
        }
    }

    #[tokio::test]
    async fn unknown_argument_fields_are_ignored() {
        let parsed: Result<ExecCommandArgs, _> =
            parse(object(json!({"cmd": "true", "justification": "why"})).expect("object"));
        assert_eq!(parsed.expect("parses").cmd, "true");
        let parsed: Result<ListSessionsArgs, _> =
            parse(object(json!({"verbose": true})).expect("object"));
        assert!(parsed.is_ok());
    }

    #[test]
    fn exec_result_text_is_codex_layout_and_json_omits_it() {
        let result = ExecResult {
            chunk_id: "3fa91c".into(),
            wall_time_seconds: 0.5,
            status: ExecStatus::Running,
            exit_code: None,
            signal: None,
            session_id: Some(48213),
            original_token_count: 1,
            output: "hi\n".into(),
            output_file: None,
            text: "stale text from an old execd".into(),
        };
        let call_result = exec_result(result);
        let text = call_result.content[0]
            .as_text()
            .map(|t| t.text.clone())
            .unwrap_or_default();
        assert!(text.starts_with("Chunk ID: 3fa91c\n"), "{text}");
        assert!(
            text.contains("Process running with session ID 48213\n"),
            "{text}"
        );
        assert!(text.ends_with("Output:\nhi\n"), "{text}");
        let structured = call_result.structured_content.expect("structured");
        assert_eq!(structured["session_id"], 48213);
        assert_eq!(structured["status"], "running");
        assert!(structured.get("text").is_none());
    }

    #[test]
    fn session_list_renders_one_line_per_session() {
        let session = |session_id, status, exit_code| SessionInfo {
            session_id,
            cmd: "npm run dev".into(),
            workdir: "/app".into(),
            tty: false,
            status,
            exit_code,
            pid: 4242,
            started_at: "2026-11-30T01:00:00Z".into(),
            idle_ms: 1500,
            unread_bytes: 12,
        };
        let cases = [
            (vec![], "No sessions."),
            (
                vec![session(48213, ExecStatus::Running, None)],
                "1 session:\nSession 48213: running, pid 4242, pipes, idle 1.5 s, 12 unread bytes, \
                 workdir /app, started 2026-11-30T01:00:00Z: npm run dev\n",
            ),
            (
                vec![
                    session(1111, ExecStatus::AwaitingInput, None),
                    session(2222, ExecStatus::Exited, Some(1)),
                ],
                "2 sessions:\nSession 1111: waiting for input, pid 4242, pipes, idle 1.5 s, 12 \
                 unread bytes, workdir /app, started 2026-11-30T01:00:00Z: npm run dev\n\
                 Session 2222: exited with code 1, pid 4242, pipes, idle 1.5 s, 12 unread bytes, \
                 workdir /app, started 2026-11-30T01:00:00Z: npm run dev\n",
            ),
        ];
        for (sessions, expected) in cases {
            assert_eq!(render_session_list(&SessionList { sessions }), expected);
        }
    }
}
