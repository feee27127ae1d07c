//! Real agents in the hands (agents.md "Proven"): `claude-agent-acp`, `codex-acp` and
//! `gemini --acp` from npm (pinned in `tests/agents/`, installed by `scripts/agents-env.sh`),
//! each run by the gateway's preset inside the session's bwrap sandbox, against a fake model
//! server (`tests/python/fake_model.py`) reached through the model proxy. What the agent's
//! shell tool printed is read back from the fake server's log of the next request.

// Tests start real programs (the fake model server, the install script) directly.
#![allow(clippy::disallowed_methods)]

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};
use warren_test_support::{python, repo_root};

use warren_gateway::hands::local::NetworkMode;

use super::helpers::{Received, TestGateway, args_with_shell_agent, first_of, stop_reason};

/// The real key the gateway holds: it must reach the fake upstream and nothing else.
const REAL_KEY: &str = "sk-real-3c1f9e-never-in-the-hands";
/// What the model asks the agent to run: the hands' view, and a marker computed by the shell.
const PROBE: &str = "env; id; ls /; cat /etc/hostname; ls /root /data 2>&1; touch /etc/x 2>&1; echo MARKER-$((6*7))";
/// Gemini refuses `$(` in commands: the same probe with a marker the shell joins.
const PROBE_NO_SUBSTITUTION: &str =
    "env; id; ls /; cat /etc/hostname; ls /root /data 2>&1; touch /etc/x 2>&1; echo MARKER-4''2";

/// The directory of the pinned agents' programs (`node_modules/.bin`).
fn agents_bin() -> PathBuf {
    let output = Command::new(repo_root().join("scripts/agents-env.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("scripts/agents-env.sh runs");
    assert!(output.status.success(), "the agents install");
    PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}

/// The fake model server, stopped (by pid) on drop.
struct FakeModel {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl FakeModel {
    fn start(script: Value) -> FakeModel {
        let dir = tempfile::tempdir().expect("temp dir");
        let script_path = dir.path().join("script.json");
        std::fs::write(&script_path, script.to_string()).expect("script written");
        let log = dir.path().join("log.jsonl");
        let mut child = Command::new(python())
            .arg(repo_root().join("tests/python/fake_model.py"))
            .args(["--port", "0", "--log"])
            .arg(&log)
            .arg("--script")
            .arg(&script_path)
            .args(["--key", REAL_KEY])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("fake model starts");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the fake model prints its port");
        let port = line
            .trim()
            .strip_prefix("PORT=")
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        FakeModel {
            child,
            port,
            log,
            _dir: dir,
        }
    }

    fn origin(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request the fake server answered, in order.
    fn requests(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// What the fake refused: a step the request could not carry out (no shell or file tool
    /// offered), a body that was not JSON or a request without the real key.
    fn refusals(&self) -> Vec<String> {
        self.requests()
            .iter()
            .filter_map(|request| request["refused"].as_str().map(str::to_owned))
            .collect()
    }

    /// The bodies of the main (tool-declaring) requests, as text.
    fn main_bodies(&self) -> Vec<String> {
        self.requests()
            .iter()
            .filter(|request| request["kind"] == "main")
            .map(|request| request["body"].to_string())
            .collect()
    }
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A gateway running `preset` (its program from the pinned install) in bwrap hands, with the
/// real key in a key file and the fake server as the provider's upstream.
async fn gateway_with(preset: &str, program: &str, fake: &FakeModel) -> TestGateway {
    gateway_on(preset, program, fake, NetworkMode::Host, None).await
}

async fn gateway_on(
    preset: &str,
    program: &str,
    fake: &FakeModel,
    network: NetworkMode,
    budget: Option<u64>,
) -> TestGateway {
    let program = agents_bin().join(program);
    let upstream = format!("{}={}", provider_of(preset), fake.origin());
    TestGateway::start(|data| {
        let key_file = data.join("model-keys.env");
        std::fs::create_dir_all(&data).expect("data dir");
        std::fs::write(
            &key_file,
            format!("ANTHROPIC_API_KEY={REAL_KEY}\nOPENAI_API_KEY={REAL_KEY}\nGEMINI_API_KEY={REAL_KEY}\n"),
        )
        .expect("key file");
        let mut args = args_with_shell_agent(data);
        args.agent = Some(preset.to_owned());
        args.agent_program = Some(program);
        args.brain_placement = None;
        args.warm_workers = 0;
        args.hands_isolation = warren_gateway::hands::local::IsolationMode::Bwrap;
        args.hands_network = network;
        args.model.model_key_file = Some(key_file);
        args.model.model_budget_tokens = budget;
        args.model.model_upstream =
            vec![warren_gateway::model_proxy::parse_upstream(&upstream).expect("upstream")];
        args
    })
    .await
}

fn provider_of(preset: &str) -> &'static str {
    match preset {
        "claude" => "anthropic",
        "codex" => "openai",
        _ => "gemini",
    }
}

/// Answers every permission request of the turn with its first allow option until the turn
/// ends; returns the turn's events and how many questions were answered.
async fn run_turn_allowing(
    chat: &mut super::helpers::Conversation<'_>,
    text: &str,
) -> (Vec<Received>, usize) {
    chat.accept(text).await;
    let mut events = Vec::new();
    let mut answered = 0;
    loop {
        let batch = chat
            .until(
                &format!("a permission question or the end of {text:?}"),
                |e| e.event == "permission_request" || e.event == "turn_end",
            )
            .await;
        let last = batch.last().cloned();
        events.extend(batch);
        let Some(last) = last else { break };
        if last.event == "turn_end" {
            break;
        }
        let options = last.data["options"].as_array().cloned().unwrap_or_default();
        let allow = options
            .iter()
            .find(|o| o["kind"] == "allow_once")
            .or_else(|| {
                options
                    .iter()
                    .find(|o| o["kind"].as_str().is_some_and(|k| k.starts_with("allow")))
            })
            .unwrap_or_else(|| panic!("an allow option in {options:?}"));
        let request_id = last.data["request_id"].as_str().expect("request id");
        let option_id = allow["optionId"].as_str().expect("option id");
        assert_eq!(
            chat.answer_permission(request_id, option_id).await.status(),
            204
        );
        answered += 1;
    }
    (events, answered)
}

/// Every file under `dir` whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    super::helpers::files_under(dir)
        .into_iter()
        .filter(|path| {
            std::fs::read(path).is_ok_and(|bytes| {
                // Checkpoint chunks and snapshots are zstd frames: searched decompressed.
                let bytes = if bytes.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
                    zstd::decode_all(bytes.as_slice()).unwrap_or(bytes)
                } else {
                    bytes
                };
                bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
            })
        })
        .collect()
}

/// The whole proof for one preset: the hands' view in the tool output, the real key nowhere
/// but upstream, the agent's edit in the workspace, a permission round trip, usage events with
/// the fake numbers, and the conversation resumed from the agent's home after an archive.
async fn a_real_agent_runs_in_the_hands(preset: &str, program: &str, probe: &str) {
    let fake = FakeModel::start(json!([
        {"shell": probe},
        {"write": {"path": "notes.txt", "content": "written by the agent\n"}},
        {"text": "finished"},
    ]));
    let gw = gateway_with(preset, program, &fake).await;
    let mut chat = gw.conversation("phone-real-agent").await;

    let (events, answered) = run_turn_allowing(&mut chat, "please run the probe").await;
    assert_eq!(
        fake.refusals(),
        Vec::<String>::new(),
        "the fake refused a step"
    );
    assert_eq!(stop_reason(&events), "end_turn", "{events:#?}");
    // The agent knows its model: no fallback warning reaches the person as agent text.
    for event in &events {
        let text = event.data.to_string();
        assert!(
            !text.contains("Model metadata") && !text.contains("fallback metadata"),
            "a warning reached the stream: {event:?}"
        );
    }
    // The file was written with the agent's own file tool (Codex: apply_patch).
    let write_step = fake
        .requests()
        .into_iter()
        .find(|request| request["kind"] == "main" && request["step"] == 1)
        .expect("the write step was asked for");
    let tool = write_step["answer"][0][1]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let expected_tool = match preset {
        "claude" => "Write",
        "codex" => "apply_patch",
        _ => "write_file",
    };
    assert_eq!(tool, expected_tool, "{write_step}");
    assert!(answered >= 1, "{preset} asked before running its command");
    assert_eq!(chat.info().await["brain_placement"], "hands");

    // What the shell tool printed reached the model in the next request.
    let bodies = fake.main_bodies();
    let after_tool = bodies
        .iter()
        .find(|body| body.contains("MARKER-42"))
        .unwrap_or_else(|| panic!("a request carrying the tool output; requests: {bodies:#?}"));
    assert!(
        after_tool.contains("uid=1000"),
        "not root inside: {after_tool}"
    );
    assert!(
        after_tool.contains("workspace"),
        "the workspace is at /workspace"
    );
    assert!(
        !after_tool.contains(REAL_KEY),
        "the real key is not in the hands"
    );
    assert!(
        after_tool.contains("wm_"),
        "the agent holds the session token only"
    );
    // Nothing of the gateway's environment (the test process's, with cargo's variables) and
    // no credential of Warren's is inside.
    for absent in [
        "CARGO_MANIFEST_DIR=",
        "EXECD_ACCESS_TOKEN=",
        "WARREN_APP_KEY=",
        "HOME=/root",
    ] {
        assert!(!after_tool.contains(absent), "no {absent} inside");
    }
    // The real key went upstream, swapped in by the proxy, and the token did not.
    let requests = fake.requests();
    assert!(
        requests
            .iter()
            .all(|r| !r["headers"].to_string().contains("wm_"))
    );
    assert!(
        requests
            .iter()
            .any(|r| r["headers"].to_string().contains(REAL_KEY))
    );

    // The agent's edit is in the session's workspace.
    let notes = chat.workspace().join("notes.txt");
    assert_eq!(
        std::fs::read_to_string(&notes).expect("notes.txt in the workspace"),
        "written by the agent\n"
    );

    // Usage: one event per model request, with the fake server's counts for its steps.
    let usage: Vec<&Received> = events.iter().filter(|e| e.event == "usage").collect();
    assert!(!usage.is_empty(), "usage events");
    let first_main = requests
        .iter()
        .find(|r| r["kind"] == "main")
        .expect("a main request");
    let expected_input = first_main["usage"]["input"].as_u64().expect("input count");
    assert!(
        usage
            .iter()
            .any(|e| e.data["input_tokens"] == expected_input
                && e.data["provider"] == provider_of(preset)),
        "a usage event with the fake's input count {expected_input}: {usage:#?}"
    );
    let turn_end = first_of(&events, "turn_end");
    assert!(
        turn_end.data["usage"]["requests"].as_u64().unwrap_or(0) >= 2,
        "{turn_end:?}"
    );

    // No event, no file of the data directory and no sandbox file holds the real key.
    for event in &events {
        assert!(!event.data.to_string().contains(REAL_KEY), "{event:?}");
    }
    let leaks: Vec<PathBuf> = files_containing(&gw.data, REAL_KEY)
        .into_iter()
        .filter(|path| !path.ends_with("model-keys.env"))
        .collect();
    assert!(leaks.is_empty(), "the real key leaked into {leaks:?}");

    // Archive (processes stopped, workspace removed), then a new turn: the agent resumes its
    // session from its home and the model sees the earlier conversation.
    let session = gw.session(&chat.session);
    session.hands.pause(None).await;
    session.hands.archive(u64::MAX).await;
    assert_eq!(
        session.hands.state(),
        warren_gateway::hands::HandsState::Archived
    );
    // The agent's home is part of the checkpoint: archived with the workspace, then restored.
    let session_dir = gw.data.join("sessions").join(&chat.session);
    assert!(
        !session_dir.join("agent-home").exists(),
        "the archived home is removed"
    );
    assert!(
        std::fs::read_dir(session_dir.join("checkpoints/home/manifests"))
            .is_ok_and(|mut manifests| manifests.next().is_some()),
        "its checkpoint is kept"
    );
    let before = fake.main_bodies().len();
    let (events, _) = run_turn_allowing(&mut chat, "what did we do before?").await;
    assert_eq!(stop_reason(&events), "end_turn", "{events:#?}");
    let later = fake.main_bodies();
    let resumed = later[before..]
        .iter()
        .find(|body| body.contains("please run the probe"))
        .unwrap_or_else(|| {
            let errors: Vec<&Received> = events.iter().filter(|e| e.event == "error").collect();
            panic!(
                "the turn after the restore carries the earlier conversation; errors: {errors:#?}"
            )
        });
    assert!(resumed.contains("MARKER-42"));
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_runs_in_the_hands_through_the_model_proxy() {
    a_real_agent_runs_in_the_hands("claude", "claude-agent-acp", PROBE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_runs_in_the_hands_through_the_model_proxy() {
    a_real_agent_runs_in_the_hands("codex", "codex-acp", PROBE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_runs_in_the_hands_through_the_model_proxy() {
    a_real_agent_runs_in_the_hands("gemini", "gemini", PROBE_NO_SUBSTITUTION).await;
}

/// Without a network the agent still reaches the proxy: the hands' execd forwards a loopback
/// port of the sandbox to the session's model socket. The sandbox reaches nothing else (the
/// fake model's own port is on the host's loopback, which the sandbox does not share).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_network_the_agent_reaches_the_model_through_the_forwarded_socket() {
    // bash's /dev/tcp: the host's loopback port of the fake model is not reachable, the
    // forwarded port of the sandbox is.
    let probe = "echo MARKER-$((6*7)); \
        (echo > /dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo REACHED-HOST || echo NO-HOST-NETWORK; \
        (echo > /dev/tcp/127.0.0.1/4180) 2>/dev/null && echo FORWARD-OPEN";
    let fake = FakeModel::start(json!([{"shell": "placeholder"}, {"text": "finished"}]));
    let probe = probe.replace("{port}", &fake.port.to_string());
    let script = json!([{"shell": probe}, {"text": "finished"}]);
    let reset = reqwest::Client::new()
        .post(format!("{}/_fake/script", fake.origin()))
        .body(script.to_string())
        .send()
        .await
        .expect("script replaced");
    assert!(reset.status().is_success());
    let gw = gateway_on("claude", "claude-agent-acp", &fake, NetworkMode::None, None).await;
    let mut chat = gw.conversation("phone-no-network").await;
    let (events, _) = run_turn_allowing(&mut chat, "probe without a network").await;
    assert_eq!(stop_reason(&events), "end_turn", "{events:#?}");
    let bodies = fake.main_bodies();
    let after_tool = bodies
        .iter()
        .find(|body| body.contains("MARKER-42"))
        .unwrap_or_else(|| panic!("the tool output reached the model: {bodies:#?}"));
    assert!(after_tool.contains("NO-HOST-NETWORK"), "{after_tool}");
    assert!(after_tool.contains("FORWARD-OPEN"), "{after_tool}");
    assert!(events.iter().any(|e| e.event == "usage"));
    gw.stop().await;
}

#[tokio::test]
async fn a_preset_whose_program_is_missing_says_how_to_install_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut args = args_with_shell_agent(dir.path().to_path_buf());
    args.agent = Some("gemini".into());
    args.agent_program = Some(dir.path().join("no-such-gemini"));
    let error = match warren_gateway::Gateway::open(args).await {
        Ok(_) => panic!("a gateway without its agent's program refuses to start"),
        Err(error) => error.to_string(),
    };
    assert!(
        error.contains("npm install -g @google/gemini-cli"),
        "{error}"
    );
}

/// `--model-budget-tokens`: the first model call (the fake's step 0 counts 100 + 20 + 7 + 3 =
/// 130 tokens) uses the budget up; the agent's next call gets the API's 429 without reaching
/// the fake server, and an `error` event says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_budget_stops_the_next_model_call() {
    let fake = FakeModel::start(json!([{"shell": "echo MARKER-$((6*7))"}, {"text": "finished"}]));
    let gw = gateway_on(
        "claude",
        "claude-agent-acp",
        &fake,
        NetworkMode::Host,
        Some(130),
    )
    .await;
    let mut chat = gw.conversation("phone-budget").await;
    // Claude asks before running its command; the answer leads to the second model call.
    let question = chat.permission_request_for("run it").await;
    let options = question.data["options"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let allow = options
        .iter()
        .find(|o| o["kind"] == "allow_once")
        .expect("an allow option");
    let answered = chat
        .answer_permission(
            question.data["request_id"].as_str().expect("request id"),
            allow["optionId"].as_str().expect("option id"),
        )
        .await;
    assert_eq!(answered.status(), 204);
    let seen = chat
        .until("the budget error", |e| {
            e.event == "error" && e.data["code"] == "MODEL_BUDGET_EXCEEDED"
        })
        .await;
    let error = seen.last().expect("the error event");
    assert!(
        error.data["message"].as_str().unwrap_or("").contains("130"),
        "{error:?}"
    );
    assert_eq!(
        fake.main_bodies().len(),
        1,
        "the over-budget call never reached upstream"
    );
    let refused = match seen
        .iter()
        .find(|e| e.event == "usage" && e.data["status"] == 429)
    {
        Some(refused) => refused.clone(),
        None => chat
            .until("the refused call's usage event", |e| {
                e.event == "usage" && e.data["status"] == 429
            })
            .await
            .pop()
            .expect("a usage event with status 429"),
    };
    assert_eq!(refused.data["input_tokens"], 0);
    // Claude retries a 429 with backoff; the person stops the turn.
    let _ = chat.cancel().await;
    gw.stop().await;
}
