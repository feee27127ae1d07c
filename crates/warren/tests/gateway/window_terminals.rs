//! The session's terminals through the gateway: `GET /v1/sessions/{id}/terminals/{name}/ws`
//! carries execd's PTY protocol unchanged (real bwrap hands, a real WebSocket client). The
//! person's shell answers, a viewer sees the holder's output, `takeover=1` evicts the holder
//! with 4001, a reconnect with `since` gets exactly the missing bytes. The agent's commands
//! (`kind: "agent"`: its ACP terminals and exec-tool sessions) are listed, watched and answered
//! by a takeover while the agent waits on them. Bad names, unknown agent terminals and other
//! devices' tokens are refused.

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use super::helpers::{TestGateway, WAIT, agent_text, in_bwrap, test_agent_bin, text_of};

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn open(gw: &TestGateway, token: &str, session: &str, name: &str, query: &str) -> Socket {
    let url = format!(
        "{}/v1/sessions/{session}/terminals/{name}/ws?access_token={token}&{query}",
        gw.url.replacen("http", "ws", 1)
    );
    let request = url.into_client_request().expect("request");
    let (socket, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("the terminal's WebSocket opens");
    socket
}

/// Reads until the output (live `0x01` or replay `0x03` frames) contains `needle`; returns
/// all output read.
async fn read_until(socket: &mut Socket, needle: &str) -> String {
    let mut output = String::new();
    tokio::time::timeout(WAIT, async {
        while !output.contains(needle) {
            match socket.next().await {
                Some(Ok(Message::Binary(frame))) => match frame.first() {
                    Some(0x01) => output.push_str(&String::from_utf8_lossy(&frame[1..])),
                    Some(0x03) if frame.len() >= 9 => {
                        output.push_str(&String::from_utf8_lossy(&frame[9..]))
                    }
                    _ => {}
                },
                Some(Ok(_)) => {}
                other => panic!("the socket ended before {needle:?}: {other:?}; read {output:?}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {needle:?} within the wait; read {output:?}"));
    output
}

async fn send_line(socket: &mut Socket, line: &str) {
    let mut frame = vec![0u8];
    frame.extend_from_slice(format!("{line}\n").as_bytes());
    socket
        .send(Message::Binary(frame.into()))
        .await
        .expect("stdin sent");
}

#[tokio::test]
async fn the_persons_shell_in_the_hands_speaks_the_pty_protocol_through_the_gateway() {
    let gw = in_bwrap(|_| {}).await;
    let token = gw.register("phone-terminal-1").await;
    let session = gw.create_session(&token).await;

    let mut holder = open(&gw, &token, &session, "default", "").await;
    send_line(&mut holder, "echo at-$(pwd)-as-$(id -u)").await;
    read_until(&mut holder, "at-/workspace-as-1000").await;

    let listed: Value = gw
        .get_json(&token, &format!("/sessions/{session}/terminals"))
        .await;
    assert_eq!(listed[0]["name"], "default", "{listed}");
    assert_eq!(listed[0]["kind"], "shell");
    assert_eq!(listed[0]["running"], true);
    let offset = listed[0]["output_offset"].as_u64().expect("offset");
    assert!(offset > 0);

    // A viewer sees what the holder's shell prints.
    let mut viewer = open(&gw, &token, &session, "default", "mode=viewer").await;
    send_line(&mut holder, "echo seen-by-$((2+2))-viewers").await;
    read_until(&mut viewer, "seen-by-4-viewers").await;

    // A takeover evicts the holder with 4001; the new holder drives the same shell.
    let mut taker = open(&gw, &token, &session, "default", "takeover=1").await;
    let evicted = tokio::time::timeout(WAIT, async {
        loop {
            match holder.next().await {
                Some(Ok(Message::Close(Some(frame)))) => return u16::from(frame.code),
                Some(Ok(_)) => continue,
                other => panic!("no close frame: {other:?}"),
            }
        }
    })
    .await
    .expect("the holder is evicted");
    assert_eq!(evicted, 4001);
    send_line(&mut taker, "echo taken-$((40+2))").await;
    read_until(&mut taker, "taken-42").await;
    drop(taker);
    drop(viewer);

    // A reconnect with `since` gets exactly what came after it.
    let before: Value = gw
        .get_json(&token, &format!("/sessions/{session}/terminals"))
        .await;
    let since = before[0]["output_offset"].as_u64().expect("offset");
    let mut again = open(&gw, &token, &session, "default", &format!("since={since}")).await;
    send_line(&mut again, "echo after-$((1+1))").await;
    let output = read_until(&mut again, "after-2").await;
    assert!(
        !output.contains("taken-42"),
        "nothing from before `since`: {output:?}"
    );
    drop(again);
    gw.stop().await;
}

#[tokio::test]
async fn bad_terminal_names_and_other_devices_are_refused() {
    let gw = in_bwrap(|_| {}).await;
    let token = gw.register("phone-terminal-2").await;
    let session = gw.create_session(&token).await;
    for name in ["Default", "a_b", &"x".repeat(33)] {
        let answer = gw
            .get(&token, &format!("/sessions/{session}/terminals/{name}/ws"))
            .await;
        assert_eq!(answer.status(), 400, "{name}");
        let body: Value = answer.json().await.expect("json");
        assert_eq!(body["code"], "INVALID_REQUEST_BODY");
    }
    let other = gw.register("phone-terminal-3").await;
    for path in [
        format!("/sessions/{session}/terminals"),
        format!("/sessions/{session}/terminals/default/ws"),
    ] {
        let answer = gw.get(&other, &path).await;
        assert_eq!(answer.status(), 404, "{path}");
        let body: Value = answer.json().await.expect("json");
        assert_eq!(body["code"], "SESSION_NOT_FOUND");
    }
    // Listing never starts the hands.
    let listed: Value = gw
        .get_json(&token, &format!("/sessions/{session}/terminals"))
        .await;
    assert_eq!(listed, serde_json::json!([]));
    assert_eq!(gw.session_info(&token, &session).await["hands"], "none");
    gw.stop().await;
}

/// Which agent a gateway of these tests runs.
enum Agent {
    /// The built-in shell agent: each message is one ACP terminal.
    Shell,
    /// `warren-test-agent`, whose `mcp` and `mcp-poll` run the exec tools.
    Scripted,
}

/// A gateway with bwrap hands and `agent`.
async fn gateway_in_bwrap(agent: Agent) -> TestGateway {
    in_bwrap(|args| {
        if let Agent::Scripted = agent {
            args.agent = Some(test_agent_bin().display().to_string());
        }
    })
    .await
}

/// Polls `GET /terminals` until it lists a running agent terminal; returns that entry.
async fn running_agent_terminal(gw: &TestGateway, token: &str, session: &str) -> Value {
    let path = format!("/sessions/{session}/terminals");
    tokio::time::timeout(WAIT, async {
        loop {
            let listed: Value = gw.get_json(token, &path).await;
            let found = listed.as_array().and_then(|terminals| {
                terminals
                    .iter()
                    .find(|t| t["kind"] == "agent" && t["running"] == true)
                    .cloned()
            });
            if let Some(found) = found {
                return found;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("a running agent terminal is listed")
}

/// Reads until a JSON frame of `kind`, skipping output.
async fn read_text(socket: &mut Socket, kind: &str) -> Value {
    tokio::time::timeout(WAIT, async {
        loop {
            match socket.next().await {
                Some(Ok(Message::Text(text))) => {
                    let frame: Value = serde_json::from_str(text.as_str()).expect("JSON frame");
                    if frame["type"] == kind {
                        return frame;
                    }
                }
                Some(Ok(_)) => {}
                other => panic!("the socket ended before a {kind:?} frame: {other:?}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {kind:?} frame within the wait"))
}

#[tokio::test]
async fn an_agents_acp_terminal_is_watched_and_its_prompt_answered_by_a_takeover() {
    let gw = gateway_in_bwrap(Agent::Shell).await;
    let mut chat = gw.conversation("phone-agent-terminal-1").await;
    // On pipes bash's `read -p` prints no prompt, so the command prints its own.
    chat.accept(r#"printf 'name? '; read n; echo "hello $n""#)
        .await;
    let listed = running_agent_terminal(&gw, &chat.token, &chat.session).await;
    let name = listed["name"].as_str().expect("name").to_owned();
    assert!(name.starts_with("term-"), "{listed}");
    assert!(
        listed["title"]
            .as_str()
            .is_some_and(|t| t.contains("read n")),
        "{listed}"
    );
    assert!(listed["created_at"].is_string(), "{listed}");

    let mut viewer = open(&gw, &chat.token, &chat.session, &name, "mode=viewer").await;
    read_until(&mut viewer, "name? ").await;
    // A viewer's typing is refused and reaches nothing.
    send_line(&mut viewer, "intruder").await;
    assert_eq!(read_text(&mut viewer, "error").await["code"], "READ_ONLY");

    let mut person = open(&gw, &chat.token, &chat.session, &name, "takeover=1").await;
    read_until(&mut person, "name? ").await;
    send_line(&mut person, "warren").await;
    read_until(&mut viewer, "hello warren").await;
    assert_eq!(read_text(&mut viewer, "exit").await["exit_code"], 0);

    let events = chat.until_turn_end("the answered prompt").await;
    let seen = agent_text(&events);
    assert!(seen.contains("hello warren"), "the agent read it: {seen:?}");
    assert!(!seen.contains("intruder"), "{seen:?}");
    gw.stop().await;
}

#[tokio::test]
async fn an_agents_exec_tool_session_is_listed_and_answered_by_a_takeover() {
    let gw = gateway_in_bwrap(Agent::Scripted).await;
    let mut chat = gw.conversation("phone-agent-terminal-2").await;
    let started = chat
        .turn(r#"mcp printf 'name? '; read n; echo "hello $n""#)
        .await;
    assert!(text_of(&started).contains("mcp: "), "{started:#?}");
    let listed = running_agent_terminal(&gw, &chat.token, &chat.session).await;
    let name = listed["name"].as_str().expect("name").to_owned();
    let session_id = name.strip_prefix("exec-").expect("an exec session's name");

    let mut viewer = open(&gw, &chat.token, &chat.session, &name, "mode=viewer").await;
    read_until(&mut viewer, "name? ").await;
    let mut person = open(&gw, &chat.token, &chat.session, &name, "takeover=1").await;
    send_line(&mut person, "warren").await;
    read_until(&mut person, "hello warren").await;
    read_until(&mut viewer, "hello warren").await;

    // The agent's own next read of its session sees what the person typed.
    let polled = chat.turn(&format!("mcp-poll {session_id}")).await;
    let seen = agent_text(&polled);
    assert!(seen.contains("hello warren"), "{seen:?}");
    gw.stop().await;
}

#[tokio::test]
async fn a_reconnect_to_an_agent_terminal_with_since_gets_exactly_the_missing_bytes() {
    let gw = gateway_in_bwrap(Agent::Shell).await;
    let mut chat = gw.conversation("phone-agent-terminal-3").await;
    chat.accept(r"printf 'one\n'; read a; printf 'two\n'; read b; printf 'three\n'")
        .await;
    let listed = running_agent_terminal(&gw, &chat.token, &chat.session).await;
    let name = listed["name"].as_str().expect("name").to_owned();
    let mut first = open(&gw, &chat.token, &chat.session, &name, "takeover=1").await;
    read_until(&mut first, "one\n").await;
    drop(first);
    let since = "one\n".len();
    // Output the person misses while away.
    let mut other = open(&gw, &chat.token, &chat.session, &name, "takeover=1").await;
    send_line(&mut other, "a").await;
    read_until(&mut other, "two\n").await;
    drop(other);

    let query = format!("takeover=1&since={since}");
    let mut back = open(&gw, &chat.token, &chat.session, &name, &query).await;
    send_line(&mut back, "b").await;
    let output = read_until(&mut back, "three\n").await;
    assert_eq!(output, "two\nthree\n", "exactly the bytes after `since`");
    chat.until_turn_end("the three lines").await;
    gw.stop().await;
}

#[tokio::test]
async fn bad_names_unknown_agent_terminals_and_other_devices_are_refused() {
    let gw = gateway_in_bwrap(Agent::Shell).await;
    let mut chat = gw.conversation("phone-agent-terminal-4").await;
    let session = chat.session.clone();
    let ws = |name: &str| format!("/sessions/{session}/terminals/{name}/ws");
    for name in ["Bad_Name", &"a".repeat(33)] {
        let answer = gw.get(&chat.token, &ws(name)).await;
        assert_eq!(answer.status(), 400, "{name}");
        let body: Value = answer.json().await.expect("json");
        assert_eq!(body["code"], "INVALID_REQUEST_BODY", "{name}");
    }
    // Without running hands no agent terminal exists, and asking starts none.
    let answer = gw.get(&chat.token, &ws("term-1")).await;
    assert_eq!(answer.status(), 404);
    let body: Value = answer.json().await.expect("json");
    assert_eq!(body["code"], "TERMINAL_NOT_FOUND");
    assert_eq!(
        gw.session_info(&chat.token, &chat.session).await["hands"],
        "none"
    );
    // With running hands, a name they do not know is as unknown.
    chat.turn("echo hands-up").await;
    for name in ["term-1", "exec-99999"] {
        let answer = gw.get(&chat.token, &ws(name)).await;
        assert_eq!(answer.status(), 404, "{name}");
        let body: Value = answer.json().await.expect("json");
        assert_eq!(body["code"], "TERMINAL_NOT_FOUND", "{name}");
    }
    let other = gw.register("phone-agent-terminal-5").await;
    let answer = gw.get(&other, &ws("term-1")).await;
    assert_eq!(answer.status(), 404);
    let body: Value = answer.json().await.expect("json");
    assert_eq!(body["code"], "SESSION_NOT_FOUND");
    gw.stop().await;
}
