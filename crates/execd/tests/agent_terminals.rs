//! `/v1/agent-terminals` over real HTTP and WebSockets: a real execd router on 127.0.0.1:0,
//! commands the agent starts through `/v1/terminals` and `/v1/exec` with the typed client the
//! gateway uses, and pty-sessions.md's WebSocket client watching and answering them. Its own
//! test binary: it runs the daemon's reaper, as the engine's commands need.

// Tests start real programs (shells, servers, the binary under test) directly.
#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use serde_json::{Value, json};
use warren_protocol::exec::{ExecCommandArgs, ExecStatus, WriteStdinArgs};
use warren_protocol::pty::PtyMode;
use warren_protocol::terminal::{AgentTerminalInfo, AgentTerminalSource, TerminalCreate};
use warren_test_support::pty::{Client, Daemon, Event};
use warren_test_support::{WAIT, eventually_async};

#[path = "support/engine_execd.rs"]
mod engine_execd;

/// execd, with the agent's side (the typed client) and the person's (the PTY protocol's).
struct Server {
    execd: engine_execd::Server,
    daemon: Daemon,
}

async fn start() -> Server {
    let execd = engine_execd::start().await;
    let daemon = Daemon::at(execd.client.base_url().to_owned(), None);
    Server { execd, daemon }
}

impl Server {
    /// Starts `command` as the agent's ACP terminal (a shell line, on pipes); its name.
    async fn terminal(&self, command: &str) -> (String, String) {
        let create = TerminalCreate {
            command: command.into(),
            cwd: Some(self.execd.root.path().display().to_string()),
            ..TerminalCreate::default()
        };
        let created = self
            .execd
            .client
            .create_terminal(&create)
            .await
            .expect("terminal created");
        let name = format!("term-{}", created.terminal_id);
        (created.terminal_id, name)
    }

    /// The agent terminal `name` as listed.
    async fn listed(&self, name: &str) -> Option<AgentTerminalInfo> {
        let list = self.execd.client.agent_terminals().await.expect("list");
        list.terminals.into_iter().find(|t| t.name == name)
    }

    async fn connect(&self, name: &str, query: &str) -> Client {
        self.daemon
            .connect_path(&format!("/v1/agent-terminals/{name}/ws"), query)
            .await
    }

    async fn refused(&self, name: &str, query: &str) -> (u16, Value) {
        match self
            .daemon
            .try_connect_path(&format!("/v1/agent-terminals/{name}/ws"), query)
            .await
        {
            Ok(_) => panic!("{name}?{query} was accepted"),
            Err(refused) => refused,
        }
    }

    /// The agent's own view of a terminal once it exited: `terminal/output` after the exit.
    async fn agent_output(&self, terminal_id: &str) -> (String, Option<u32>) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let output = self
                .execd
                .client
                .terminal_output(terminal_id, Duration::from_secs(5))
                .await
                .expect("terminal output");
            if let Some(status) = output.exit_status {
                return (output.output, status.exit_code);
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "terminal {terminal_id} did not exit; output {:?}",
                output.output
            );
        }
    }
}

/// Waits for the `exit` frame and returns its code.
async fn exit_code(client: &mut Client) -> i64 {
    client.wait_text("exit").await["exit_code"]
        .as_i64()
        .expect("exit_code is a number")
}

const PROMPT: &str = r#"printf 'name? '; read n; echo "hello $n""#;

#[tokio::test]
async fn an_acp_terminal_is_listed_running_with_its_command_as_title() {
    let server = start().await;
    let (terminal_id, name) = server.terminal(PROMPT).await;
    let listed = server.listed(&name).await.expect("listed");
    assert_eq!(listed.source, AgentTerminalSource::Terminal);
    assert_eq!(listed.mode, PtyMode::Pipe);
    assert_eq!(listed.title, PROMPT);
    assert!(listed.running);
    assert!(listed.started_at.ends_with('Z'), "{}", listed.started_at);
    server
        .execd
        .client
        .release_terminal(&terminal_id)
        .await
        .expect("released");
    eventually_async("a released terminal leaves the list", || async {
        server.listed(&name).await.is_none()
    })
    .await;
}

#[tokio::test]
async fn a_takeover_answers_the_prompt_the_agent_and_viewers_see_the_answer() {
    let server = start().await;
    let (terminal_id, name) = server.terminal(PROMPT).await;
    let mut viewer = server.connect(&name, "mode=viewer").await;
    assert_eq!(viewer.texts[0]["role"], "viewer");
    assert_eq!(viewer.texts[0]["mode"], "pipe");
    viewer.wait_output("name? ").await;

    let mut person = server.connect(&name, "takeover=1").await;
    assert_eq!(person.texts[0]["role"], "holder");
    assert_eq!(person.texts[0]["session_id"], name.as_str());
    person.wait_output("name? ").await;
    person.send_stdin("warren\n").await;
    person.wait_output("hello warren").await;
    assert_eq!(exit_code(&mut person).await, 0);
    viewer.wait_output("hello warren").await;
    assert_eq!(exit_code(&mut viewer).await, 0);

    let (output, exit) = server.agent_output(&terminal_id).await;
    assert_eq!(output, "name? hello warren\n");
    assert_eq!(exit, Some(0));
    let listed = server.listed(&name).await.expect("listed until released");
    assert!(!listed.running);
    assert_eq!(listed.output_offset, output.len() as u64);
}

#[tokio::test]
async fn a_viewer_cannot_type_into_the_agents_command() {
    let server = start().await;
    let (terminal_id, name) = server.terminal(PROMPT).await;
    let mut viewer = server.connect(&name, "mode=viewer").await;
    viewer.wait_output("name? ").await;
    viewer.send_stdin("intruder\n").await;
    assert_eq!(viewer.wait_text("error").await["code"], "READ_ONLY");
    viewer
        .send_json(json!({"type": "signal", "signal": "SIGKILL"}))
        .await;
    assert_eq!(viewer.wait_text("error").await["code"], "READ_ONLY");
    viewer.ping().await;
    // The command still waits for its answer: only a takeover's typing reaches it.
    let output = server
        .execd
        .client
        .terminal_output(&terminal_id, Duration::ZERO)
        .await
        .expect("output");
    assert_eq!(output.output, "name? ");
    assert!(output.exit_status.is_none());
    let mut person = server.connect(&name, "takeover=1").await;
    person.send_stdin("warren\n").await;
    assert_eq!(exit_code(&mut person).await, 0);
    let (output, _) = server.agent_output(&terminal_id).await;
    assert_eq!(output, "name? hello warren\n");
}

#[tokio::test]
async fn an_exec_session_on_a_pty_is_answered_and_resized_by_a_takeover() {
    let server = start().await;
    let args = ExecCommandArgs {
        cmd: r#"read -p 'name? ' n; stty size; echo "hello $n""#.into(),
        tty: Some(true),
        login: Some(false),
        ..ExecCommandArgs::default()
    };
    let started = server.execd.client.exec_command(&args).await.expect("exec");
    assert_eq!(
        started.status,
        ExecStatus::AwaitingInput,
        "{}",
        started.text
    );
    let session_id = started.session_id.expect("a session to answer");
    let name = format!("exec-{session_id}");
    let listed = server.listed(&name).await.expect("listed");
    assert_eq!(listed.source, AgentTerminalSource::Exec);
    assert_eq!(listed.mode, PtyMode::Pty);
    assert!(listed.running);

    let mut person = server.connect(&name, "takeover=1").await;
    assert_eq!(person.texts[0]["mode"], "pty");
    person.wait_output("name? ").await;
    person
        .send_json(json!({"type": "resize", "cols": 120, "rows": 40}))
        .await;
    person.send_stdin("warren\n").await;
    person.wait_output("hello warren").await;
    assert!(
        person.output_text().contains("40 120"),
        "{}",
        person.output_text()
    );
    assert_eq!(exit_code(&mut person).await, 0);

    // The agent's next poll sees what the person typed and the command's end.
    let poll = server
        .execd
        .client
        .write_stdin(WriteStdinArgs {
            session_id,
            ..WriteStdinArgs::default()
        })
        .await
        .expect("poll");
    assert_eq!(poll.status, ExecStatus::Exited, "{}", poll.text);
    assert!(poll.output.contains("hello warren"), "{}", poll.output);
    eventually_async(
        "a finished exec session leaves the list once read",
        || async { server.listed(&name).await.is_none() },
    )
    .await;
}

#[tokio::test]
async fn a_reconnect_with_since_gets_exactly_the_missing_bytes() {
    let server = start().await;
    let (_, name) = server
        .terminal("printf 'one\\n'; read a; printf 'two\\n'; read b; printf 'three\\n'")
        .await;
    let mut person = server.connect(&name, "takeover=1").await;
    person.wait_output("one\n").await;
    let since = server.listed(&name).await.expect("listed").output_offset;
    assert_eq!(since, 4);
    drop(person);
    // Output the person misses while away.
    let mut other = server.connect(&name, "takeover=1").await;
    other.send_stdin("a\n").await;
    other.wait_output("two\n").await;
    drop(other);

    let mut back = server
        .connect(&name, &format!("takeover=1&since={since}"))
        .await;
    let replay = back.replays.first().cloned().expect("a replay frame");
    assert_eq!(replay, (4, b"two\n".to_vec()));
    back.send_stdin("b\n").await;
    back.wait_output("three\n").await;
    assert_eq!(back.output_text(), "two\nthree\n");
}

#[tokio::test]
async fn a_holders_signal_reaches_the_agents_command() {
    let server = start().await;
    let (terminal_id, name) = server.terminal("echo sleeping; sleep 300").await;
    let mut person = server.connect(&name, "takeover=1").await;
    person.wait_output("sleeping").await;
    person
        .send_json(json!({"type": "signal", "signal": "SIGTERM"}))
        .await;
    assert_eq!(exit_code(&mut person).await, -1);
    let output = server
        .execd
        .client
        .terminal_output(&terminal_id, Duration::from_secs(5))
        .await
        .expect("output");
    let status = output.exit_status.expect("exited");
    assert_eq!(status.signal.as_deref(), Some("SIGTERM"));
}

#[tokio::test]
async fn a_second_takeover_evicts_the_first_person_with_4001() {
    let server = start().await;
    let (_, name) = server.terminal(PROMPT).await;
    let mut first = server.connect(&name, "takeover=1").await;
    let mut second = server.connect(&name, "takeover=1").await;
    assert_eq!(first.wait_close().await.0, 4001);
    second.send_stdin("two\n").await;
    second.wait_output("hello two").await;
}

#[tokio::test]
async fn the_agent_holds_its_command_so_a_plain_attach_is_refused() {
    let server = start().await;
    let (_, name) = server.terminal(PROMPT).await;
    let (status, body) = server.refused(&name, "").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["code"], "ALREADY_CONNECTED");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("takeover=1")),
        "{body}"
    );
}

#[tokio::test]
async fn unknown_and_ended_agent_terminals_are_refused() {
    let server = start().await;
    for name in ["term-1", "exec-99999", "nothing"] {
        let (status, body) = server.refused(name, "mode=viewer").await;
        assert_eq!(status, 404, "{name}: {body}");
        assert_eq!(body["code"], "TERMINAL_NOT_FOUND", "{name}");
    }
    let (terminal_id, name) = server.terminal("echo done").await;
    server.agent_output(&terminal_id).await;
    let (status, body) = server.refused(&name, "mode=viewer").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["code"], "VIEWER_REQUIRES_RUNNING_SESSION");
    // A takeover of an ended command still gets its output and its exit.
    let mut late = server.connect(&name, "takeover=1").await;
    assert_eq!(exit_code(&mut late).await, 0);
    assert_eq!(late.output_text(), "done\n");
    assert!(matches!(
        late.next_event("the close").await,
        Event::Close(1000, _)
    ));
}
