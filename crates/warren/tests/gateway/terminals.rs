//! The agent's terminals through the whole gateway (the built-in shell agent runs each message
//! with ACP `terminal/*`, served by the hands' `/v1/terminals`): output arrives as exactly the
//! bytes the command wrote, and the exit is the real code or the real signal name.

use serde_json::Value;

use super::helpers::{Received, TestGateway, agent_text, args_with_shell_agent};

/// The `raw_output` the agent reported for the terminal's end (`exit_code`, `signal`).
fn reported_exit(events: &[Received]) -> Value {
    events
        .iter()
        .filter(|e| e.event == "update")
        .filter_map(|e| e.data["update"].get("rawOutput"))
        .find(|raw| raw.get("exit_code").is_some() || raw.get("signal").is_some())
        .cloned()
        .unwrap_or_else(|| panic!("a terminal end among {events:#?}"))
}

#[tokio::test]
async fn terminal_output_reaches_the_agent_as_exactly_the_bytes_written() {
    let gw = TestGateway::start(args_with_shell_agent).await;
    let mut chat = gw.conversation("phone-bytes-1").await;
    let seen = chat
        .turn(r"printf 'p10\rp100\n'; printf 'no-newline'")
        .await;
    let output = agent_text(&seen);
    assert!(
        output.ends_with("p10\rp100\nno-newline"),
        "carriage return kept, nothing added or split: {output:?}"
    );
    assert!(!output.contains("no-newline\n"), "{output:?}");
    assert_eq!(reported_exit(&seen)["exit_code"], 0);
    gw.stop().await;
}

#[tokio::test]
async fn a_terminal_reports_the_real_exit_code_and_signal_name() {
    let gw = TestGateway::start(args_with_shell_agent).await;
    let mut chat = gw.conversation("phone-bytes-2").await;
    let cases = [
        ("exit 3", Some(3), None),
        ("kill -TERM $$", None, Some("SIGTERM")),
        ("kill -INT $$", None, Some("SIGINT")),
        ("kill -9 $$", None, Some("SIGKILL")),
    ];
    for (command, exit_code, signal) in cases {
        let seen = chat.turn(command).await;
        let exit = reported_exit(&seen);
        assert_eq!(
            exit["exit_code"].as_u64(),
            exit_code.map(|c: u64| c),
            "{command}: {exit}"
        );
        assert_eq!(exit["signal"].as_str(), signal, "{command}: {exit}");
    }
    gw.stop().await;
}
