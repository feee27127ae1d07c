//! What a command in a session's hands can and cannot see, through the gateway's HTTP API and
//! the built-in shell agent, with the real bwrap sandbox (hands.md's table), and the faults one
//! session's hands must survive alone.
//!
//! Every probe is a message the shell agent runs as `bash -c <text>` in the hands; the tests read
//! its output from the `update` events and its exit code from the `tool_call_update`. Probes print
//! one `WORD value` line per fact so a failure names the row of the table that broke. The
//! `--hands-isolation bwrap` case with a bwrap that does not work is not here: no flag points the
//! gateway at another bwrap binary.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use tokio::io::AsyncReadExt;
use warren_gateway::GatewayArgs;
use warren_gateway::config::HandsProviderKind;
use warren_gateway::hands::local::{IsolationMode, NetworkMode};
use warren_test_support::{eventually, first_line, processes_mentioning, within};

use super::helpers::{
    Conversation, Received, TestGateway, agent_text, args_with_shell_agent, listening_url,
    warren_bin,
};

/// The gateway's own secrets, distinctive so a leak into the hands is unmistakable.
const APP_KEY: &str = "sandbox-probe-app-key-7d1e";
const ADMIN_TOKEN: &str = "sandbox-probe-admin-token-9b4c";

/// The uid the sandbox runs as when the gateway is root (the tests run as root).
const HANDS_UID: u32 = 1000;

/// What a command's environment may hold: hands.md's allowlist, the tree marker every spawned
/// process carries, the variables the exec pipeline sets so tools neither page nor prompt, the
/// `PWD` and `SHLVL` of the login shell (`bash -lc`) the exec engine starts the command
/// through, and the egress proxy's variables.
const ALLOWED_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "LANG",
    "TERM",
    "USER",
    "WARREN_TREE_ID",
    "PAGER",
    "GIT_PAGER",
    "GH_PAGER",
    "GIT_TERMINAL_PROMPT",
    "NO_COLOR",
    "PWD",
    "SHLVL",
    // The egress proxy's, with `--hands-network private` (network.md).
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "NO_PROXY",
    "no_proxy",
    "NODE_USE_ENV_PROXY",
    "npm_config_proxy",
    "npm_config_https_proxy",
    "PIP_PROXY",
    "CARGO_HTTP_PROXY",
];

/// A gateway with the shell agent whose hands must be bwrap sandboxes (no unconfined fallback),
/// carrying [`APP_KEY`] and [`ADMIN_TOKEN`].
fn sandboxed_args(data: PathBuf) -> GatewayArgs {
    let mut args = args_with_shell_agent(data);
    args.hands_isolation = IsolationMode::Bwrap;
    args.app_key = Some(APP_KEY.into());
    args.admin_token = Some(ADMIN_TOKEN.into());
    args
}

async fn sandboxed_gateway(configure: impl FnOnce(&mut GatewayArgs)) -> TestGateway {
    TestGateway::start(|data| {
        let mut args = sandboxed_args(data);
        configure(&mut args);
        args
    })
    .await
}

/// One message run by the shell agent to its `turn_end`.
struct Ran {
    /// What the command printed (stdout and stderr, as the agent streamed it).
    output: String,
    /// The command's exit code from the agent's `tool_call_update`, `None` when it reported none.
    exit_code: Option<i64>,
    events: Vec<Received>,
}

impl Ran {
    /// The values of every `WORD value` line the probe printed for `word`.
    fn values(&self, word: &str) -> Vec<&str> {
        self.output
            .lines()
            .filter_map(|line| line.strip_prefix(word)?.strip_prefix(' '))
            .collect()
    }

    /// The one value the probe printed for `word`.
    fn value(&self, word: &str) -> &str {
        match self.values(word)[..] {
            [value] => value,
            _ => panic!("one `{word} ...` line in {:?}", self.output),
        }
    }
}

/// The exit code the agent reported for the turn's command.
fn exit_code_of(events: &[Received]) -> Option<i64> {
    events
        .iter()
        .filter(|e| e.event == "update")
        .filter(|e| e.data["update"]["sessionUpdate"] == "tool_call_update")
        .find_map(|e| e.data["update"]["rawOutput"]["exit_code"].as_i64())
}

/// Runs `command` in the session's hands through the shell agent.
async fn run(chat: &mut Conversation<'_>, command: &str) -> Ran {
    let events = chat.turn(command).await;
    Ran {
        output: agent_text(&events),
        exit_code: exit_code_of(&events),
        events,
    }
}

/// Runs `command` and asserts it exited 0, naming `what` it was for.
async fn run_ok(chat: &mut Conversation<'_>, what: &str, command: &str) -> Ran {
    let ran = run(chat, command).await;
    assert_eq!(
        ran.exit_code,
        Some(0),
        "{what}: `{command}` exits 0; it printed {:?}",
        ran.output
    );
    ran
}

fn hands_events(events: &[Received]) -> Vec<&Received> {
    events.iter().filter(|e| e.event == "hands").collect()
}

/// The names in a NUL-separated environ dump that `tr '\0' '\n'` turned into lines.
fn env_names<'a>(lines: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
    lines
        .into_iter()
        .filter_map(|line| line.split_once('=').map(|(name, _)| name.to_string()))
        .collect()
}

/// Asserts an environment holds only [`ALLOWED_ENV`] (plus `extra`), no secret-looking name and
/// none of the gateway's secrets.
fn assert_clean_env(whose: &str, lines: &[&str], extra: &[&str]) {
    let names = env_names(lines.iter().copied());
    assert!(names.contains("PATH"), "{whose} has PATH: {lines:?}");
    let unexpected: Vec<&String> = names
        .iter()
        .filter(|name| !ALLOWED_ENV.contains(&name.as_str()) && !extra.contains(&name.as_str()))
        .collect();
    assert!(
        unexpected.is_empty(),
        "{whose} holds only the allowlist {ALLOWED_ENV:?}; also found {unexpected:?} in {lines:?}"
    );
    let secret_looking: Vec<&String> = names
        .iter()
        .filter(|name| {
            ["KEY", "TOKEN", "SECRET"]
                .iter()
                .any(|part| name.contains(part))
        })
        .collect();
    assert!(
        secret_looking.is_empty(),
        "{whose} holds no *KEY*, *TOKEN* or *SECRET* name: {secret_looking:?}"
    );
    for secret in [APP_KEY, ADMIN_TOKEN] {
        assert!(
            !lines.iter().any(|line| line.contains(secret)),
            "{whose} does not carry the gateway's secret {secret:?}: {lines:?}"
        );
    }
}

/// Single-quotes `text` for bash.
fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// A probe printing `ABSENT <path>` for each path that does not exist inside (`stat` says
/// ENOENT) and `PRESENT <path>: <stat's answer>` for any other: a path that is there but
/// cannot be searched (EACCES) is present, not absent.
fn existence_probe(paths: &[String]) -> String {
    let quoted_paths: Vec<String> = paths.iter().map(|p| quoted(p)).collect();
    format!(
        "for p in {}; do if err=$(stat -c %n -- \"$p\" 2>&1); then echo \"PRESENT $p: exists\"; \
         else case \"$err\" in *'No such file or directory'*) echo \"ABSENT $p\";; \
         *) echo \"PRESENT $p: $err\";; esac; fi; done",
        quoted_paths.join(" ")
    )
}

#[tokio::test]
async fn writes_in_the_cwd_land_in_the_session_workspace_owned_by_the_hands_uid() {
    let gw = sandboxed_gateway(|_| {}).await;
    let mut chat = gw.conversation("phone-0001").await;
    let ran = run_ok(
        &mut chat,
        "a write in the cwd",
        "echo \"CWD $PWD\"; mkdir -p made/inside && echo written-inside > made/inside/note.txt",
    )
    .await;
    assert_eq!(ran.value("CWD"), "/workspace", "the cwd is the workspace");
    let note = chat.workspace().join("made/inside/note.txt");
    let text = std::fs::read_to_string(&note)
        .unwrap_or_else(|e| panic!("the write landed at {}: {e}", note.display()));
    assert_eq!(text, "written-inside\n");
    for path in [note.clone(), chat.workspace().join("made")] {
        let meta = std::fs::metadata(&path).expect("metadata of the written path");
        assert_eq!(
            (meta.uid(), meta.gid()),
            (HANDS_UID, HANDS_UID),
            "{} is owned by the hands uid",
            path.display()
        );
    }
    let info = chat.info().await;
    assert_eq!(info["isolation"], "bwrap", "{info}");
    gw.stop().await;
}

#[tokio::test]
async fn tmp_is_a_private_tmpfs_not_the_hosts() {
    let gw = sandboxed_gateway(|_| {}).await;
    let mut chat = gw.conversation("phone-0001").await;
    let host_marker = tempfile::Builder::new()
        .prefix("warren-sandbox-host-marker-")
        .tempfile_in("/tmp")
        .expect("a marker in the host's /tmp");
    let host_name = host_marker
        .path()
        .file_name()
        .and_then(|n| n.to_str())
        .expect("marker name")
        .to_string();
    let inside_name = format!("warren-sandbox-inside-marker-{}", std::process::id());
    let inside_on_host = Path::new("/tmp").join(&inside_name);
    let _ = std::fs::remove_file(&inside_on_host);
    let ran = run_ok(
        &mut chat,
        "the /tmp probe",
        &format!(
            "{}; echo from-inside > /tmp/{inside_name} && echo \"WROTE $(cat /tmp/{inside_name})\"",
            existence_probe(&[format!("/tmp/{host_name}")])
        ),
    )
    .await;
    // Checked and cleaned up first, so a failing sandbox leaves nothing in the host's /tmp.
    let leaked = inside_on_host.exists();
    let _ = std::fs::remove_file(&inside_on_host);
    assert!(
        !leaked,
        "a file written in /tmp inside does not appear in the host's /tmp ({})",
        inside_on_host.display()
    );
    assert_eq!(
        ran.values("ABSENT"),
        [format!("/tmp/{host_name}")],
        "the host's /tmp marker is not visible inside: {:?}",
        ran.output
    );
    assert_eq!(ran.value("WROTE"), "from-inside", "/tmp is writable inside");
    gw.stop().await;
}

#[tokio::test]
async fn the_host_image_is_read_only() {
    let gw = sandboxed_gateway(|_| {}).await;
    let mut chat = gw.conversation("phone-0001").await;
    let probe_name = format!("warren-sandbox-ro-probe-{}", std::process::id());
    let dirs = ["/usr", "/etc", "/bin"];
    let ran = run(
        &mut chat,
        &format!(
            "for d in {}; do test -d $d/. || echo \"MISSING $d\"; \
             if touch $d/{probe_name} 2>/dev/null; then echo \"WRITABLE $d\"; \
             else echo \"READONLY $d\"; fi; done",
            dirs.join(" ")
        ),
    )
    .await;
    // Checked and cleaned up first, so a failing sandbox leaves nothing in the host image.
    let created: Vec<PathBuf> = dirs
        .iter()
        .map(|dir| Path::new(dir).join(&probe_name))
        .filter(|path| path.exists())
        .collect();
    for path in &created {
        let _ = std::fs::remove_file(path);
    }
    assert!(created.is_empty(), "created on the host: {created:?}");
    assert!(
        ran.values("MISSING").is_empty(),
        "the host image is there: {:?}",
        ran.output
    );
    assert_eq!(
        ran.values("READONLY"),
        dirs,
        "no write into /usr, /etc or /bin succeeds: {:?}",
        ran.output
    );
    gw.stop().await;
}

#[tokio::test]
async fn host_paths_outside_the_sandbox_are_absent() {
    let gw = sandboxed_gateway(|_| {}).await;
    // Another session with live hands, so its workspace exists on the host.
    let mut other = gw.conversation("phone-0002").await;
    run_ok(&mut other, "the other session", "echo other > other.txt").await;
    let other_workspace = other.workspace();
    assert!(other_workspace.join("other.txt").exists());
    let mut chat = gw.conversation("phone-0001").await;
    let home_probe = tempfile::Builder::new()
        .prefix("warren-sandbox-home-")
        .tempdir_in("/home")
        .expect("a directory in the host's /home");
    let test_cwd = std::env::current_dir().expect("the test's cwd");
    let repo = warren_test_support::repo_root();
    let paths: Vec<String> = [
        PathBuf::from("/root"),
        gw.data.clone(),
        chat.workspace(),
        other_workspace,
        home_probe.path().to_path_buf(),
        test_cwd,
        repo,
        warren_bin(),
    ]
    .iter()
    .map(|p| p.display().to_string())
    .collect();
    let ran = run(
        &mut chat,
        &format!(
            "{}; echo \"HOME_ENTRIES $(ls -A /home | tr '\\n' ' ')\"; \
             test -x /opt/warren/bin/warren && echo 'WARREN_AT /opt/warren/bin/warren'",
            existence_probe(&paths)
        ),
    )
    .await;
    assert!(
        ran.values("PRESENT").is_empty(),
        "absent inside: /root, the data dir, this and another session's workspace paths, \
         host /home entries, the test's cwd and repo, the warren binary's host path; \
         present: {:?}",
        ran.values("PRESENT")
    );
    assert_eq!(ran.values("ABSENT"), paths, "{:?}", ran.output);
    assert_eq!(
        ran.value("HOME_ENTRIES").trim(),
        "agent",
        "/home holds only the agent's home"
    );
    assert_eq!(
        ran.value("WARREN_AT"),
        "/opt/warren/bin/warren",
        "the warren binary is bound at its fixed inside path"
    );
    gw.stop().await;
}

#[tokio::test]
async fn proc_shows_the_sandbox_alone_with_bwrap_as_pid_1() {
    let gw = sandboxed_gateway(|_| {}).await;
    let mut chat = gw.conversation("phone-0001").await;
    let gateway_pid = std::process::id();
    let ran = run_ok(
        &mut chat,
        "the /proc probe",
        &format!(
            "test -e /proc/{gateway_pid} && echo 'GATEWAY_VISIBLE {gateway_pid}'; \
             echo \"PID1 $(tr '\\0' ' ' < /proc/1/cmdline)\"; \
             for p in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $p/cmdline 2>/dev/null) && \
             echo \"PROC ${{p#/proc/}} $c\"; done; true"
        ),
    )
    .await;
    assert!(
        ran.values("GATEWAY_VISIBLE").is_empty(),
        "the gateway's pid {gateway_pid} is not in the sandbox's /proc"
    );
    let pid1 = ran.value("PID1");
    let launcher = pid1.split(' ').next().unwrap_or_default();
    assert!(
        launcher.ends_with("bwrap"),
        "/proc/1 is the bwrap launcher: {pid1:?}"
    );
    let test_binary = std::env::current_exe().expect("the test binary");
    let test_binary = test_binary.to_string_lossy();
    let processes = ran.values("PROC");
    assert!(
        processes
            .iter()
            .any(|process| process.contains("/opt/warren/bin/warren execd")),
        "the probe lists the sandbox's own execd in /proc: {processes:#?}"
    );
    for process in &processes {
        assert!(
            !process.contains(&*test_binary) && !process.contains("shell-agent"),
            "no gateway or brain process is visible inside: {process:?} among {processes:#?}"
        );
    }
    gw.stop().await;
}

#[tokio::test]
async fn a_command_and_the_launcher_get_only_the_clean_environment() {
    let gw = sandboxed_gateway(|_| {}).await;
    let mut chat = gw.conversation("phone-0001").await;
    // `/proc/$$/environ` is what the command's shell was started with, before bash adds its own
    // PWD, SHLVL and `_`.
    let ran = run_ok(
        &mut chat,
        "the environment probe",
        "tr '\\0' '\\n' < /proc/$$/environ | sed 's/^/CMD /'; \
         tr '\\0' '\\n' < /proc/1/environ | sed 's/^/LAUNCHER /'",
    )
    .await;
    let command_env = ran.values("CMD");
    assert_clean_env("the command's environment", &command_env, &[]);
    assert!(
        command_env.contains(&"HOME=/home/agent"),
        "HOME is the agent's home: {command_env:?}"
    );
    let launcher_env = ran.values("LAUNCHER");
    assert_clean_env("bwrap's environment (/proc/1/environ)", &launcher_env, &[]);
    gw.stop().await;
}

#[tokio::test]
async fn hands_env_adds_a_variable_to_the_commands_environment() {
    let gw = sandboxed_gateway(|args| {
        args.hands_env = vec![
            "WARREN_PROBE_VAR=passed-through"
                .parse()
                .expect("a HandsVar"),
        ];
    })
    .await;
    let mut chat = gw.conversation("phone-0001").await;
    let ran = run_ok(
        &mut chat,
        "the --hands-env probe",
        "tr '\\0' '\\n' < /proc/$$/environ | sed 's/^/CMD /'",
    )
    .await;
    let command_env = ran.values("CMD");
    assert!(
        command_env.contains(&"WARREN_PROBE_VAR=passed-through"),
        "--hands-env WARREN_PROBE_VAR=passed-through reaches the command: {command_env:?}"
    );
    assert_clean_env(
        "the command's environment",
        &command_env,
        &["WARREN_PROBE_VAR"],
    );
    gw.stop().await;
}

#[tokio::test]
async fn commands_run_as_the_unprivileged_hands_uid_without_capabilities() {
    let gw = sandboxed_gateway(|_| {}).await;
    let mut chat = gw.conversation("phone-0001").await;
    let ran = run_ok(
        &mut chat,
        "the user probe",
        "echo \"UID $(id -u)\"; grep -E '^(CapEff|CapPrm|NoNewPrivs):' /proc/self/status \
         | sed 's/:[[:space:]]*/ /'",
    )
    .await;
    assert_eq!(ran.value("UID"), HANDS_UID.to_string(), "id -u inside");
    assert_eq!(
        ran.value("CapEff"),
        "0000000000000000",
        "no effective capabilities"
    );
    assert_eq!(
        ran.value("CapPrm"),
        "0000000000000000",
        "no permitted capabilities"
    );
    assert_eq!(ran.value("NoNewPrivs"), "1", "no_new_privs is set");
    // On the host too every process of the sandbox runs as the hands uid, never root.
    let pids = super::helpers::hands_processes(&gw.data, &chat.session);
    assert!(!pids.is_empty(), "the hands run");
    for pid in pids {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let uids = status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .expect("a Uid line");
        let uids: Vec<u32> = uids
            .split_whitespace()
            .map(|uid| uid.parse().expect("a numeric uid"))
            .collect();
        assert_eq!(
            uids, [HANDS_UID; 4],
            "host pid {pid} of the hands runs as uid {HANDS_UID} (real, effective, saved, fs)"
        );
    }
    gw.stop().await;
}

#[tokio::test]
async fn mounting_and_new_user_namespaces_are_refused() {
    let gw = sandboxed_gateway(|_| {}).await;
    let mut chat = gw.conversation("phone-0001").await;
    // The mount(2) call itself, on a mount point that exists: util-linux's `mount` would refuse
    // a non-root user before the kernel is asked. A mount that did succeed is detached at once,
    // so a failing sandbox leaves no mount on the host.
    let ran = run(
        &mut chat,
        "mkdir -p mnt; python3 -c 'import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); \
         r = libc.mount(b\"x\", b\"mnt\", b\"tmpfs\", 0, None); \
         print(\"MOUNT\", r, os.strerror(ctypes.get_errno()) if r else \"mounted\"); \
         r == 0 and libc.umount2(b\"mnt\", 2)'; \
         command -v unshare >/dev/null && echo UNSHARE_FOUND; \
         unshare -U true; echo \"UNSHARE $?\"",
    )
    .await;
    let mount = ran.value("MOUNT");
    assert!(
        mount.starts_with("-1 "),
        "mount -t tmpfs fails inside: {mount:?}"
    );
    assert!(
        ran.output.lines().any(|line| line == "UNSHARE_FOUND"),
        "unshare is installed inside, so its failure is the sandbox's: {:?}",
        ran.output
    );
    let unshare = ran.value("UNSHARE");
    assert_ne!(
        unshare, "0",
        "unshare -U true fails inside: {:?}",
        ran.output
    );
    assert!(
        !chat
            .workspace()
            .join("mnt")
            .read_dir()
            .expect("mnt")
            .any(|_| true),
        "nothing was mounted on the workspace"
    );
    gw.stop().await;
}

#[tokio::test]
async fn the_execd_environment_is_not_readable_from_a_command() {
    let gw = sandboxed_gateway(|_| {}).await;
    let mut chat = gw.conversation("phone-0001").await;
    let ran = run(
        &mut chat,
        "echo \"PID2 $(tr '\\0' ' ' < /proc/2/cmdline)\"; \
         cat /proc/2/environ > /dev/null; echo \"ENVIRON $?\"; \
         cat /proc/$$/environ > /dev/null; echo \"OWN_ENVIRON $?\"",
    )
    .await;
    assert_eq!(
        ran.value("OWN_ENVIRON"),
        "0",
        "a command reads its own environ, so the refusal below is execd's: {:?}",
        ran.output
    );
    assert!(
        ran.value("PID2").contains("execd"),
        "pid 2 inside is the hands' execd: {:?}",
        ran.output
    );
    assert_ne!(
        ran.value("ENVIRON"),
        "0",
        "cat /proc/2/environ fails (execd is non-dumpable): {:?}",
        ran.output
    );
    assert!(
        ran.output.contains("Permission denied"),
        "the kernel refuses execd's environ: {:?}",
        ran.output
    );
    gw.stop().await;
}

#[tokio::test]
async fn network_none_leaves_only_loopback() {
    let gw = sandboxed_gateway(|args| args.hands_network = NetworkMode::None).await;
    let mut chat = gw.conversation("phone-0001").await;
    let ran = run_ok(
        &mut chat,
        "the network probe",
        "tail -n +3 /proc/net/dev | cut -d: -f1 | sed 's/^ */IFACE /'",
    )
    .await;
    assert_eq!(
        ran.values("IFACE"),
        ["lo"],
        "--hands-network none: only lo in /proc/net/dev"
    );
    gw.stop().await;
}

#[tokio::test]
async fn network_host_reaches_a_port_on_the_hosts_loopback() {
    let gw = sandboxed_gateway(|args| args.hands_network = NetworkMode::Host).await;
    let mut chat = gw.conversation("phone-0001").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port on the host's loopback");
    let port = listener.local_addr().expect("local addr").port();
    let accepted = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.expect("accept");
        let mut text = String::new();
        stream
            .read_to_string(&mut text)
            .await
            .expect("read what the hands sent");
        text
    });
    run_ok(
        &mut chat,
        "a connection to the host's loopback",
        &format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo hello-from-hands >&3"),
    )
    .await;
    let text = within("the hands' connection to the test's port", accepted)
        .await
        .expect("accept task");
    assert_eq!(text, "hello-from-hands\n");
    gw.stop().await;
}

#[tokio::test]
async fn two_sessions_see_neither_each_others_files_nor_processes() {
    let gw = sandboxed_gateway(|_| {}).await;
    let mut a = gw.conversation("phone-000a").await;
    let mut b = gw.conversation("phone-000b").await;
    let sleep_arg = format!("86400.{}", std::process::id());
    run_ok(
        &mut a,
        "session A's background sleep",
        &format!("setsid -f sleep {sleep_arg} >/dev/null 2>&1 < /dev/null; echo a-only > a.txt"),
    )
    .await;
    eventually("session A's sleep runs on the host", || {
        !processes_mentioning(&sleep_arg).is_empty()
    })
    .await;
    let a_workspace = a.workspace();
    assert!(a_workspace.join("a.txt").exists());

    let ran = run(
        &mut b,
        &format!(
            "ls {}; echo \"LS $?\"",
            quoted(&a_workspace.display().to_string())
        ),
    )
    .await;
    assert_ne!(
        ran.value("LS"),
        "0",
        "B cannot list A's workspace host path: {:?}",
        ran.output
    );
    assert!(
        ran.output.contains("No such file or directory"),
        "A's workspace path does not exist in B's view (not merely unreadable): {:?}",
        ran.output
    );
    // The same listing in A shows A's own sleep: a listing can see a sleep at all.
    let ran = run_ok(&mut a, "A's process listing", "ps ax -o args=").await;
    assert!(
        ran.output.contains(&format!("sleep {sleep_arg}")),
        "A's ps ax shows its own sleep: {:?}",
        ran.output
    );
    let ran = run_ok(
        &mut b,
        "B's process listing",
        "ps ax -o args= | sed 's/^/PS /'; \
         for p in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $p/cmdline 2>/dev/null) && \
         echo \"PROC ${p#/proc/} $c\"; done; true",
    )
    .await;
    assert!(
        !ran.output.contains(&sleep_arg),
        "B's ps ax and /proc show no sign of A's `sleep {sleep_arg}`: {:?}",
        ran.output
    );
    assert!(
        ran.values("PS")
            .iter()
            .any(|args| args.starts_with("ps ax")),
        "B's ps ax lists processes (itself at least): {:?}",
        ran.output
    );
    // Everything B sees is its own sandbox: the launcher, its execd and the probe itself.
    let own = ["bwrap", "/opt/warren/bin/warren", "bash", "ps", "sed", "tr"];
    for process in ran.values("PROC") {
        let command = process.split(' ').nth(1).unwrap_or_default();
        let program = command.rsplit('/').next().unwrap_or_default();
        assert!(
            own.iter().any(|name| command == *name || program == *name),
            "B sees only its own hands' processes ({own:?}), not {process:?}"
        );
    }
    // A's sleep still runs: B's probes touched nothing of A.
    assert!(
        !processes_mentioning(&sleep_arg).is_empty(),
        "A's sleep outlives B's probes"
    );
    gw.stop().await;
    assert!(
        processes_mentioning(&sleep_arg).is_empty(),
        "stopping the gateway stopped A's sleep with its hands"
    );
}

/// Sends `text` to a session whose hands will die of it, and reads until both its `hands` event
/// `lost` and the turn's end were seen; returns the `lost` event.
async fn turn_that_loses_the_hands(chat: &mut Conversation<'_>, text: &str) -> Received {
    chat.accept(text).await;
    let mut seen = chat
        .until(&format!("hands lost after {text:?}"), |e| {
            e.event == "hands" && e.data["state"] == "lost"
        })
        .await;
    let lost = seen.last().expect("the lost event").clone();
    if !seen.iter().any(|e| e.event == "turn_end") {
        seen = chat
            .until_turn_end(&format!("{text:?} after its hands were lost"))
            .await;
        assert!(seen.last().is_some_and(|e| e.event == "turn_end"));
    }
    lost
}

/// After `a` lost its hands: the gateway answers `/healthz`, `b` still runs a command and `a`'s
/// next message runs on new hands, announced `reset`.
async fn others_go_on_and_the_next_message_gets_new_hands(
    gw: &TestGateway,
    a: &mut Conversation<'_>,
    b: &mut Conversation<'_>,
) {
    gw.assert_healthy("the gateway answers /healthz").await;
    let ran = run_ok(b, "session B after A's hands died", "echo b-still-fine").await;
    assert!(ran.output.contains("b-still-fine"), "{:?}", ran.output);
    let b_info = b.info().await;
    assert_eq!(
        b_info["hands"], "running",
        "B's hands were untouched: {b_info}"
    );

    let ran = run_ok(a, "session A's next message", "echo a-again").await;
    assert!(ran.output.contains("a-again"), "{:?}", ran.output);
    let reset = hands_events(&ran.events)
        .into_iter()
        .find(|e| e.data["state"] == "running" && e.data["reset"] == true);
    assert!(
        reset.is_some(),
        "A's new hands are announced with reset: true: {:#?}",
        hands_events(&ran.events)
    );
    let a_info = a.info().await;
    assert_eq!(a_info["hands"], "running", "{a_info}");
}

#[tokio::test]
async fn a_fork_bomb_loses_only_its_own_hands() {
    let gw = sandboxed_gateway(|args| args.hands_pids = Some(64)).await;
    let mut b = gw.conversation("phone-000b").await;
    run_ok(&mut b, "session B before the bomb", "echo b-ready").await;
    let mut a = gw.conversation("phone-000a").await;
    run_ok(&mut a, "session A before the bomb", "echo a-ready").await;

    let lost = turn_that_loses_the_hands(&mut a, ":(){ :|:& };:").await;
    let error = lost.data["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("process limit"),
        "the lost event names the process limit: {:?}",
        lost.data
    );
    assert_eq!(a.info().await["hands"], "lost");
    others_go_on_and_the_next_message_gets_new_hands(&gw, &mut a, &mut b).await;
    gw.stop().await;
}

#[tokio::test]
async fn a_memory_hog_loses_only_its_own_hands() {
    let gw = sandboxed_gateway(|args| args.hands_memory = Some(128 << 20)).await;
    let mut b = gw.conversation("phone-000b").await;
    run_ok(&mut b, "session B before the hog", "echo b-ready").await;
    let mut a = gw.conversation("phone-000a").await;
    run_ok(&mut a, "session A before the hog", "echo a-ready").await;

    let lost =
        turn_that_loses_the_hands(&mut a, "python3 -c 'x = b\"x\" * (1 << 30); print(len(x))'")
            .await;
    let error = lost.data["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("memory limit"),
        "the lost event names the memory limit: {:?}",
        lost.data
    );
    assert_eq!(a.info().await["hands"], "lost");
    others_go_on_and_the_next_message_gets_new_hands(&gw, &mut a, &mut b).await;
    gw.stop().await;
}

#[tokio::test]
async fn isolation_none_is_said_everywhere_and_keeps_the_clean_environment() {
    let gw = sandboxed_gateway(|args| args.hands_isolation = IsolationMode::None).await;
    let mut chat = gw.conversation("phone-0001").await;
    let ran = run_ok(
        &mut chat,
        "a command in unconfined hands",
        "tr '\\0' '\\n' < /proc/$$/environ | sed 's/^/CMD /'",
    )
    .await;
    let hands = hands_events(&ran.events);
    assert!(!hands.is_empty(), "the first message started the hands");
    for event in &hands {
        assert_eq!(
            event.data["isolation"], "none",
            "every hands event says isolation none: {:?}",
            event.data
        );
    }
    let info = chat.info().await;
    assert_eq!(info["isolation"], "none", "the session object: {info}");
    assert_clean_env(
        "an unconfined command's environment",
        &ran.values("CMD"),
        &[],
    );
    gw.stop().await;
}

/// A `warren execd` on TCP that the test runs, as something outside the gateway would.
pub struct RemoteExecd {
    child: tokio::process::Child,
    pub url: String,
    pub root: tempfile::TempDir,
}

impl RemoteExecd {
    pub async fn start(token: &str) -> RemoteExecd {
        let root = tempfile::tempdir().expect("the execd's root");
        let mut child = tokio::process::Command::new(warren_bin())
            .args(["execd", "--listen", "127.0.0.1:0", "--root"])
            .arg(root.path())
            .env("EXECD_ACCESS_TOKEN", token)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("warren execd starts");
        let line = first_line(&mut child, "the execd's `listening on` line").await;
        let url = listening_url(&line, "execd");
        RemoteExecd { child, url, root }
    }

    /// Kills the execd by its pid and reaps it.
    pub async fn stop(mut self) {
        let pid = self.child.id().expect("the execd still runs");
        self.child.start_kill().expect("kill the execd");
        within(&format!("execd pid {pid} exits"), self.child.wait())
            .await
            .expect("wait for the execd");
    }
}

#[tokio::test]
async fn remote_hands_run_commands_in_the_remote_execds_root() {
    let execd = RemoteExecd::start("t").await;
    let url = execd.url.clone();
    let gw = TestGateway::start_changed(args_with_shell_agent, |args| {
        args.hands_provider = HandsProviderKind::Remote;
        args.hands_url_template = Some(url);
        args.hands_token = Some("t".into());
    })
    .await;
    let mut chat = gw.conversation("phone-0001").await;
    let ran = run_ok(
        &mut chat,
        "a message on remote hands",
        "echo remote > r.txt",
    )
    .await;
    let landed = execd.root.path().join("r.txt");
    let text = std::fs::read_to_string(&landed)
        .unwrap_or_else(|e| panic!("r.txt landed in the execd's root {}: {e}", landed.display()));
    assert_eq!(text, "remote\n");
    assert!(
        !chat.workspace().join("r.txt").exists(),
        "nothing ran in the gateway's own workspace"
    );
    for event in hands_events(&ran.events) {
        assert_eq!(event.data["isolation"], "remote", "{:?}", event.data);
    }
    let info = chat.info().await;
    assert_eq!(info["isolation"], "remote", "the session object: {info}");
    gw.stop().await;
    execd.stop().await;
}
