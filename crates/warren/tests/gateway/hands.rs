//! Hands against a real `warren execd` child (the `warren` binary of this package): lazy start,
//! the access token, files and terminals for the agent through execd's HTTP routes, stop killing
//! the sandbox, and the whole brain path (the built-in shell agent running a message in the
//! hands).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use warren_brain::{
    AgentCommand, BoxFuture, Host, HostError, PermissionOutcome, TerminalSpec, TurnSink, Worker,
};
use warren_gateway::hands::local::{LocalConfig, LocalHands};
use warren_gateway::hands::{BrainPlacement, Hands, HandsProvider};
use warren_test_support::{alive, eventually, within};

use super::helpers::{kill, test_agent_bin, warren_bin};

/// The local provider as `warren serve` makes it (bwrap where it works), with its run
/// directory in `data`.
pub async fn local_provider(data: &std::path::Path) -> Arc<dyn HandsProvider> {
    let config = LocalConfig::with_defaults(warren_bin(), data.join("run").join("hands"));
    std::fs::create_dir_all(&config.run_dir).expect("run dir");
    Arc::new(LocalHands::new(config).await)
}

/// One session's hands in a fresh data directory; the guard stops whatever the hands left
/// running when the test ends, passed or not.
async fn new_hands() -> (Arc<Hands>, HandsCleanup) {
    let dir = tempfile::tempdir().expect("temp dir");
    let provider = local_provider(dir.path()).await;
    let session_dir = dir.path().join("sessions").join("s1");
    std::fs::create_dir_all(session_dir.join("workspace")).expect("workspace");
    let hands = Hands::new(provider, "s1", &session_dir, BrainPlacement::Host);
    (hands, HandsCleanup(dir))
}

/// Stops every sandbox recorded in the data directory on drop.
pub struct HandsCleanup(pub tempfile::TempDir);

impl Drop for HandsCleanup {
    fn drop(&mut self) {
        super::helpers::stop_left_hands(self.0.path());
    }
}

fn bash(script: &str) -> TerminalSpec {
    TerminalSpec {
        command: "bash".into(),
        args: vec!["-c".into(), script.into()],
        env: vec![],
        cwd: None,
        output_byte_limit: None,
    }
}

#[tokio::test]
async fn hands_start_on_first_use_require_their_token_and_stop_completely() {
    let (hands, _dir) = new_hands().await;
    assert!(!hands.is_running(), "creating hands starts nothing");
    let endpoint = within("hands start", hands.endpoint())
        .await
        .expect("hands start");
    assert!(hands.is_running());
    assert!(hands.workspace().is_dir(), "the workspace is created");
    let without_token = warren_execd_client::ExecdClient::new(&endpoint.url, None)
        .expect("client")
        .list_terminals()
        .await
        .expect_err("execd refuses requests without the token");
    assert_eq!(without_token.status().map(|s| s.as_u16()), Some(401));
    let client = endpoint.client().expect("client");
    client.ping().await.expect("ping with token and nonce");
    let identity = client.identity().await.expect("identity");
    assert_eq!(identity.nonce, endpoint.nonce);
    assert_eq!(
        hands.endpoint().await.expect("same hands"),
        endpoint,
        "one execd per session"
    );

    within("hands stop", hands.stop()).await;
    assert!(!hands.is_running());
    assert!(client.ping().await.is_err(), "execd is gone after stop");
    assert!(
        hands.endpoint().await.is_err(),
        "stopped hands stay stopped"
    );
}

#[tokio::test]
async fn agent_file_writes_and_reads_go_through_execd() {
    let (hands, _dir) = new_hands().await;
    let path = hands.workspace().join("src/notes.txt");
    within(
        "write",
        hands.write_text_file(path.clone(), "one\ntwo\nthree\n".into()),
    )
    .await
    .expect("write");
    assert_eq!(
        std::fs::read_to_string(&path).expect("on disk"),
        "one\ntwo\nthree\n"
    );
    let all = within("read", hands.read_text_file(path.clone(), None, None))
        .await
        .expect("read");
    assert_eq!(all, "one\ntwo\nthree\n");
    let middle = within("read lines", hands.read_text_file(path, Some(2), Some(1)))
        .await
        .expect("read");
    assert_eq!(middle, "two\n");
    let missing = hands
        .read_text_file(hands.workspace().join("nope.txt"), None, None)
        .await;
    assert!(
        matches!(missing, Err(HostError::NotFound(_))),
        "{missing:?}"
    );
    let outside = hands
        .read_text_file(PathBuf::from("/etc/passwd"), None, None)
        .await;
    assert!(matches!(outside, Err(HostError::Invalid(_))), "{outside:?}");
    hands.stop().await;
}

#[tokio::test]
async fn terminals_run_in_the_workspace_and_report_output_and_exit_code() {
    let (hands, _dir) = new_hands().await;
    let id = within(
        "create",
        hands.create_terminal(bash("pwd; echo err >&2; exit 3")),
    )
    .await
    .expect("terminal");
    let exit = within("exit", hands.wait_for_terminal_exit(id.clone()))
        .await
        .expect("exit");
    assert_eq!(exit.exit_code, Some(3));
    let output = hands.terminal_output(id.clone()).await.expect("output");
    let (_, root) = hands.endpoint_and_root().await.expect("root");
    assert!(
        output.output.starts_with(&format!("{root}\n")),
        "the command runs in the workspace as execd sees it ({root}): {:?}",
        output.output
    );
    assert!(output.output.contains("err\n"), "{:?}", output.output);
    assert_eq!(output.exit.and_then(|e| e.exit_code), Some(3));
    hands.release_terminal(id.clone()).await.expect("release");
    assert!(matches!(
        hands.terminal_output(id).await,
        Err(HostError::NotFound(_))
    ));
    hands.stop().await;
}

#[tokio::test]
async fn killing_a_terminal_ends_its_command() {
    let (hands, _dir) = new_hands().await;
    let id = within("create", hands.create_terminal(bash("echo up; sleep 60")))
        .await
        .expect("terminal");
    within("the command printed", async {
        while !hands
            .terminal_output(id.clone())
            .await
            .expect("output")
            .output
            .contains("up")
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    within("kill", hands.kill_terminal(id.clone()))
        .await
        .expect("kill");
    let exit = within("exit after kill", hands.wait_for_terminal_exit(id))
        .await
        .expect("exit");
    assert_ne!(exit.exit_code, Some(0), "{exit:?}");
    hands.stop().await;
}

#[derive(Default)]
struct Collect {
    updates: Mutex<Vec<serde_json::Value>>,
}

impl Collect {
    fn agent_text(&self) -> String {
        let updates = self.updates.lock().expect("lock");
        updates
            .iter()
            .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
            .filter_map(|u| u["content"]["text"].as_str())
            .collect()
    }
}

impl TurnSink for Collect {
    fn update(&self, update: serde_json::Value) {
        self.updates.lock().expect("lock").push(update);
    }

    fn request_permission(
        &self,
        _tool_call: serde_json::Value,
        _options: serde_json::Value,
    ) -> BoxFuture<'static, PermissionOutcome> {
        Box::pin(async { PermissionOutcome::Selected("allow".into()) })
    }
}

/// Starts `agent` and opens an ACP session in the hands' workspace, with the hands' MCP server
/// (whose command is `warren mcp ...`) and a sink that allows every permission request.
async fn session_in_hands(
    agent: &AgentCommand,
    hands: &Arc<Hands>,
) -> (warren_brain::BrainSession, Arc<Collect>) {
    let worker = within("the agent to start", Worker::spawn(agent))
        .await
        .expect("worker");
    let sink = Arc::new(Collect::default());
    let mcp = within(
        "hands for MCP",
        hands.mcp_server(&warren_bin().display().to_string()),
    )
    .await
    .expect("mcp entry");
    assert_eq!(mcp.args[0], "mcp");
    let session = within(
        "session/new",
        worker.new_session(
            hands.workspace().to_owned(),
            vec![mcp],
            hands.clone(),
            sink.clone(),
        ),
    )
    .await
    .expect("session");
    (session, sink)
}

#[tokio::test]
async fn the_built_in_shell_agent_runs_a_message_in_the_hands() {
    let (hands, _dir) = new_hands().await;
    let agent = AgentCommand::shell_agent(warren_bin().display().to_string());
    let (session, sink) = session_in_hands(&agent, &hands).await;
    let stop_reason = within(
        "turn",
        session.prompt("echo hi > made.txt; cat made.txt".into()),
    )
    .await
    .expect("turn");
    assert_eq!(stop_reason, "end_turn");
    assert!(sink.agent_text().contains("hi"), "{}", sink.agent_text());
    assert_eq!(
        std::fs::read_to_string(hands.workspace().join("made.txt")).expect("made in the workspace"),
        "hi\n"
    );
    within("close", session.close()).await;
    hands.stop().await;
}

#[tokio::test]
async fn stopping_hands_kills_background_and_setsid_processes_they_started() {
    let (hands, _dir) = new_hands().await;
    let script = "sleep 300 & echo bg=$!; setsid sleep 301 & echo sid=$!";
    let id = within("create", hands.create_terminal(bash(script)))
        .await
        .expect("terminal");
    within("exit", hands.wait_for_terminal_exit(id.clone()))
        .await
        .expect("exit");
    let output = hands.terminal_output(id).await.expect("output").output;
    assert_eq!(output.lines().count(), 2, "{output:?}");
    // The sleepers as the host sees them: below the sandbox's root, by name.
    let root = hands.sandbox_pid().await.expect("a local sandbox");
    let sleepers: Vec<u32> =
        warren_process::tree_members(&warren_process::TreeId::new(root as i32, None))
            .into_iter()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/cmdline")).is_ok_and(|cmd| {
                    cmd.starts_with("sleep\u{0}300") || cmd.starts_with("sleep\u{0}301")
                })
            })
            .map(|pid| pid as u32)
            .collect();
    assert_eq!(sleepers.len(), 2, "both sleepers outlive their command");
    within("hands stop", hands.stop()).await;
    eventually("every process of the hands is gone", || {
        !sleepers.iter().any(|pid| alive(*pid)) && !alive(root)
    })
    .await;
}

#[tokio::test]
async fn the_mcp_server_given_in_session_new_runs_exec_tools_in_the_hands() {
    let (hands, _dir) = new_hands().await;
    let agent = AgentCommand {
        env: Vec::new(),
        program: test_agent_bin().display().to_string(),
        args: vec![],
    };
    let (session, sink) = session_in_hands(&agent, &hands).await;
    within(
        "mcp turn",
        session.prompt("mcp echo from-mcp > via-mcp.txt; pwd".into()),
    )
    .await
    .expect("turn");
    let text = sink.agent_text();
    assert!(text.starts_with("mcp: "), "{text}");
    assert!(text.contains("exited with code 0"), "{text}");
    assert_eq!(
        std::fs::read_to_string(hands.workspace().join("via-mcp.txt"))
            .expect("made by the exec tool in the hands"),
        "from-mcp\n"
    );
    within("close", session.close()).await;
    hands.stop().await;
}

#[tokio::test]
async fn hands_that_died_are_noticed_at_once_and_rebuilt_on_next_use() {
    let (hands, _dir) = new_hands().await;
    within("hands start", hands.endpoint())
        .await
        .expect("start");
    let pid = hands
        .sandbox_pid()
        .await
        .expect("a local sandbox has a pid");
    kill("9", pid, "the sandbox this test started");
    eventually("the dead hands are noticed", || {
        hands.state() == warren_gateway::hands::HandsState::Lost
    })
    .await;
    let path = hands.workspace().join("after.txt");
    within(
        "write after the rebuild",
        hands.write_text_file(path.clone(), "again".into()),
    )
    .await
    .expect("write through new hands");
    assert_ne!(hands.sandbox_pid().await, Some(pid), "new hands");
    assert!(
        hands.take_notice().is_some_and(|n| n.contains("reset")),
        "the agent's next prompt says processes were reset"
    );
    assert_eq!(std::fs::read_to_string(path).expect("written"), "again");
    hands.stop().await;
}
