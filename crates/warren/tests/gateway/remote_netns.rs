//! Remote hands on a second "machine": a real `warren execd` in a network namespace of its own,
//! joined to the host by a veth pair and reached by the gateway only by URL
//! (`--hands-provider remote`), and the next gateway keeping those hands and a process running in
//! them: on the file store a restart on the same data directory, on PostgreSQL another replica on
//! a data directory of its own taking the session over (scale-out.md's failover with remote
//! hands).
//!
//! The test makes the namespace and the link itself (it runs as root, as CI does) and a guard
//! removes the execd, every process in the namespace, the link and the namespace, also when an
//! assertion fails. A machine where `ip netns` cannot work fails the test with the reason; it is
//! never skipped.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::Value;
use tokio::io::AsyncBufReadExt;
use warren_gateway::GatewayArgs;
use warren_gateway::config::HandsProviderKind;
use warren_test_support::{WAIT, alive, eventually, within};

use super::helpers::{
    Conversation, Received, TestGateway, agent_text, args_with_shell_agent, host_links,
    listening_url, on_postgres, store_for, warren_bin,
};

const TOKEN: &str = "netns-hands-token";

/// Tells this process's namespaces apart (tests of one binary run in parallel).
static N_NAMESPACES: AtomicU32 = AtomicU32::new(0);

/// Runs `ip` with `args`; the error names the command and what it printed.
fn ip(args: &[&str]) -> Result<String, String> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("`ip {}` cannot run: {e}", args.join(" ")))?;
    if !output.status.success() {
        return Err(format!(
            "`ip {}` failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Runs `ip` and panics with a message saying what the test needs when it fails.
fn ip_or_fail(args: &[&str]) -> String {
    ip(args).unwrap_or_else(|e| {
        panic!(
            "this test needs network namespaces and veth links (root with CAP_SYS_ADMIN and \
             CAP_NET_ADMIN, iproute2's `ip`): {e}"
        )
    })
}

/// The network namespace a process is in, as `readlink /proc/PID/ns/net` prints it.
fn net_namespace_of(pid: &str) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/net"))
        .unwrap_or_else(|e| panic!("the network namespace of process {pid}: {e}"))
        .display()
        .to_string()
}

/// A network namespace, the veth pair that joins it to the host and the `/30` between them.
/// Dropping it removes everything it made and every process in the namespace.
struct Netns {
    name: String,
    host_link: String,
    /// The host's end of the link, `.1` of the `/30`.
    host_addr: Ipv4Addr,
    /// The namespace's end, `.2`: where the execd listens.
    hands_addr: Ipv4Addr,
    /// The execd the test started in it, killed by pid first.
    execd_pid: Option<u32>,
}

impl Netns {
    /// Makes a namespace of a name no other test uses, a veth pair with one end in it, a `/30`
    /// of 10.231.0.0/16 no interface of the host has, and brings both ends and the namespace's
    /// `lo` up.
    fn make() -> Netns {
        let pid = std::process::id();
        let n = N_NAMESPACES.fetch_add(1, Ordering::Relaxed);
        let name = format!("warren-t-{pid}-{n}");
        // Interface names are at most 15 bytes: `wt` + at most 7 digits of pid + `h`/`n` + n.
        let host_link = format!("wt{pid}h{n}");
        let hands_link = format!("wt{pid}n{n}");
        assert!(host_link.len() <= 15, "{host_link} fits an interface name");
        let host_addresses = ip_or_fail(&["-4", "-o", "addr", "show"]);
        // One of the 16384 `/30`s of 10.231.0.0/16, starting at one picked from the pid so
        // tests of other processes start elsewhere, skipping any the host already has.
        let start = (pid.wrapping_mul(64) + n) % 16384;
        let (host_addr, hands_addr) = (0..16384)
            .map(|i| (start + i) % 16384)
            .map(|block| {
                let base = u32::from(Ipv4Addr::new(10, 231, 0, 0)) + block * 4;
                (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2))
            })
            .find(|(host, hands)| {
                !host_addresses.contains(&format!("inet {host}/"))
                    && !host_addresses.contains(&format!("inet {hands}/"))
            })
            .expect("a free /30 in 10.231.0.0/16");
        ip_or_fail(&["netns", "add", &name]);
        // From here on the guard removes whatever was made, whichever step fails.
        let netns = Netns {
            name,
            host_link,
            host_addr,
            hands_addr,
            execd_pid: None,
        };
        let name = netns.name.as_str();
        let host_cidr = format!("{host_addr}/30");
        let hands_cidr = format!("{hands_addr}/30");
        ip_or_fail(&[
            "link",
            "add",
            &netns.host_link,
            "type",
            "veth",
            "peer",
            "name",
            &hands_link,
        ]);
        ip_or_fail(&["link", "set", &hands_link, "netns", name]);
        ip_or_fail(&["addr", "add", &host_cidr, "dev", &netns.host_link]);
        ip_or_fail(&["link", "set", &netns.host_link, "up"]);
        ip_or_fail(&["-n", name, "addr", "add", &hands_cidr, "dev", &hands_link]);
        ip_or_fail(&["-n", name, "link", "set", &hands_link, "up"]);
        ip_or_fail(&["-n", name, "link", "set", "lo", "up"]);
        netns
    }

    /// Starts `warren execd` inside the namespace, listening only on `port` (0: any; it prints
    /// the one it got) of the namespace's end of the link, with its access token and `root` as
    /// workspace; returns its URL. A given port may still be held for a moment by an execd just
    /// killed: the start is tried again until [`WAIT`] has passed.
    async fn start_execd(&mut self, root: &Path, port: u16) -> String {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            match self.try_start_execd(root, port).await {
                Some(url) => return url,
                None if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
                None => panic!("no execd starts on port {port} of {}", self.hands_addr),
            }
        }
    }

    /// One start of the execd: `None` when it exits before it listens.
    async fn try_start_execd(&mut self, root: &Path, port: u16) -> Option<String> {
        let listen = format!("{}:{port}", self.hands_addr);
        // `ip netns exec` enters the namespace and execs the command: the child is the execd.
        let mut child = tokio::process::Command::new("ip")
            .args(["netns", "exec", &self.name])
            .arg(warren_bin())
            .args(["execd", "--listen", &listen, "--root"])
            .arg(root)
            .env("EXECD_ACCESS_TOKEN", TOKEN)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("`ip netns exec ... warren execd` starts");
        self.execd_pid = child.id();
        let stdout = child.stdout.take().expect("execd stdout");
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let line = within("the execd's `listening on` line", lines.next_line())
            .await
            .expect("read execd stdout");
        let Some(line) = line else {
            let _ = child.wait().await;
            self.execd_pid = None;
            return None;
        };
        let url = listening_url(&line, "execd");
        // Keep reading so the execd never blocks on a full pipe; the guard kills it by pid, and
        // the child handle reaps it then.
        tokio::spawn(async move {
            while let Ok(Some(_)) = lines.next_line().await {}
            let _ = child.wait().await;
        });
        Some(url)
    }

    /// Every process in the namespace (`ip netns pids`).
    fn pids(&self) -> Vec<u32> {
        ip(&["netns", "pids", &self.name])
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|pid| pid.parse().ok())
            .collect()
    }

    /// Kills the execd, then every process left in the namespace, then deletes the link and the
    /// namespace. Safe to run twice.
    fn remove(&mut self) -> Vec<String> {
        let mut failures = Vec::new();
        if let Some(pid) = self.execd_pid.take() {
            kill(pid);
        }
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let left: Vec<u32> = self.pids().into_iter().filter(|pid| alive(*pid)).collect();
            if left.is_empty() {
                break;
            }
            if std::time::Instant::now() > deadline {
                failures.push(format!(
                    "processes {left:?} outlived SIGKILL in {}",
                    self.name
                ));
                break;
            }
            for pid in left {
                kill(pid);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // Deleting one end of a veth pair deletes both; the namespace's end also goes with it.
        if self.link_exists()
            && let Err(e) = ip(&["link", "del", &self.host_link])
        {
            failures.push(e);
        }
        if self.namespace_exists()
            && let Err(e) = ip(&["netns", "del", &self.name])
        {
            failures.push(e);
        }
        failures
    }

    fn link_exists(&self) -> bool {
        ip(&["link", "show", "dev", &self.host_link]).is_ok()
    }

    fn namespace_exists(&self) -> bool {
        ip(&["netns", "list"])
            .unwrap_or_default()
            .lines()
            .any(|line| line.split_whitespace().next() == Some(self.name.as_str()))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for failure in self.remove() {
            eprintln!("cleaning up network namespace {}: {failure}", self.name);
        }
    }
}

/// SIGKILL to one process by pid; one that is already gone is no error.
fn kill(pid: u32) {
    let Ok(pid) = i32::try_from(pid) else {
        return;
    };
    if let Some(pid) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
}

/// The execd's identity as a client reaching `url` gets it, or why it could not.
async fn identity_at(url: &str) -> Result<Value, String> {
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .expect("a reqwest client");
    let response = http
        .get(format!("{url}/v1/hands/identity"))
        .header("X-EXECD-ACCESS-TOKEN", TOKEN)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if response.status() != 200 {
        return Err(format!("status {}", response.status()));
    }
    response.json().await.map_err(|e| e.to_string())
}

/// A next gateway of the test's session on `data`, with the store of the first one's
/// `first_data` (on PostgreSQL the same database; on files, `data` is `first_data`).
async fn next_gateway(data: &Path, first_data: &Path, url: &str) -> TestGateway {
    let mut args = remote_args(data.to_path_buf(), url);
    if on_postgres() {
        args.store = store_for(first_data);
    }
    TestGateway::start_in(args).await
}

/// `session`'s conversation on `gw`, its stream from after the last event stored.
async fn rejoin(gw: &TestGateway, token: String, session: String) -> Conversation<'_> {
    let last_seq = gw.session_info(&token, &session).await["last_seq"]
        .as_u64()
        .expect("the session's last_seq");
    let events = gw.events(&token, &session, Some(last_seq)).await;
    Conversation {
        gw,
        token,
        session,
        events,
    }
}

fn remote_args(data: PathBuf, url: &str) -> GatewayArgs {
    let mut args = args_with_shell_agent(data);
    args.hands_provider = HandsProviderKind::Remote;
    args.hands_url_template = Some(url.to_string());
    args.hands_token = Some(TOKEN.into());
    args
}

/// Runs `command` through the shell agent to its `turn_end`; asserts the agent reported exit 0
/// and returns the command's output and the turn's events.
async fn run_ok(chat: &mut Conversation<'_>, command: &str) -> (String, Vec<Received>) {
    let events = chat.turn(command).await;
    let output = agent_text(&events);
    let exit_code = events
        .iter()
        .filter(|e| e.event == "update")
        .filter(|e| e.data["update"]["sessionUpdate"] == "tool_call_update")
        .find_map(|e| e.data["update"]["rawOutput"]["exit_code"].as_i64());
    assert_eq!(
        exit_code,
        Some(0),
        "`{command}` exits 0; it printed {output:?}"
    );
    (output, events)
}

/// The one value of the `WORD value` line `word` in a probe's output.
fn value<'a>(output: &'a str, word: &str) -> &'a str {
    let values: Vec<&str> = output
        .lines()
        .filter_map(|line| line.strip_prefix(word)?.strip_prefix(' '))
        .collect();
    match values[..] {
        [value] => value.trim(),
        _ => panic!("one `{word} ...` line in {output:?}"),
    }
}

#[tokio::test]
async fn remote_hands_in_another_network_namespace_keep_their_processes_for_the_next_gateway() {
    // Declared first, dropped last: the link is gone before the browser may run again.
    let _links = host_links().await;
    let mut netns = Netns::make();
    let root = tempfile::tempdir().expect("the execd's root");
    let url = netns.start_execd(root.path(), 0).await;
    let execd_pid = netns.execd_pid.expect("the execd's pid");
    let port = url.rsplit(':').next().expect("a port in the execd's url");
    assert_eq!(url, format!("http://{}:{port}", netns.hands_addr));

    // A second machine: the execd is in another network namespace than this test...
    let own_namespace = net_namespace_of("self");
    let cmdline = std::fs::read(format!("/proc/{execd_pid}/cmdline")).expect("the execd's cmdline");
    assert!(
        cmdline.split(|b| *b == 0).any(|arg| arg == b"execd"),
        "pid {execd_pid} is the execd itself (`ip netns exec` execs it): {:?}",
        String::from_utf8_lossy(&cmdline)
    );
    let hands_namespace = net_namespace_of(&execd_pid.to_string());
    assert_ne!(
        hands_namespace, own_namespace,
        "the execd runs in a namespace of its own"
    );
    // ...reached over the link, and not on this host's loopback.
    let identity = within("the execd's identity over the veth link", identity_at(&url))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the execd answers at {url} from the host's end of the link {}: {e}",
                netns.host_addr
            )
        });
    let loopback = format!("http://127.0.0.1:{port}");
    if let Ok(other) = within("a request to loopback", identity_at(&loopback)).await {
        assert_ne!(
            other["nonce"], identity["nonce"],
            "the execd in the namespace is not reachable on the host's {loopback}"
        );
    }

    let data = tempfile::tempdir().expect("the gateway's data directory");
    let gw = TestGateway::start_in(remote_args(data.path().to_path_buf(), &url)).await;
    let mut chat = gw.conversation("phone-netns").await;
    let (output, events) = run_ok(
        &mut chat,
        "echo netns > proof.txt; echo \"NETNS $(readlink /proc/self/ns/net)\"; \
         sleep 300 & echo \"SLEEPER $!\"",
    )
    .await;
    let hands: Vec<&Received> = events.iter().filter(|e| e.event == "hands").collect();
    assert!(
        !hands.is_empty() && hands.iter().all(|e| e.data["isolation"] == "remote"),
        "the first message started remote hands: {hands:#?}"
    );
    assert_eq!(
        value(&output, "NETNS"),
        hands_namespace,
        "the command ran in the execd's network namespace, not the gateway's {own_namespace}"
    );
    let proof = root.path().join("proof.txt");
    assert_eq!(
        std::fs::read_to_string(&proof).expect("proof.txt landed in the execd's root"),
        "netns\n"
    );
    assert!(
        !chat.workspace().join("proof.txt").exists(),
        "nothing ran in the gateway's own workspace"
    );
    let sleeper = value(&output, "SLEEPER").to_string();
    let sleeper_pid: u32 = sleeper.parse().expect("the sleeper's pid");
    assert!(alive(sleeper_pid), "the sleeper runs");
    assert_eq!(net_namespace_of(&sleeper), hands_namespace);
    let (token, session) = (chat.token.clone(), chat.session.clone());
    drop(chat);

    // The gateway stops the way SIGTERM stops it (giving its leases up). On the file store a new
    // one opens the same data directory; on PostgreSQL another replica, with a data directory
    // of its own and the same database, takes the session over at its first request.
    gw.stop_leaving_hands().await;
    assert!(
        alive(sleeper_pid),
        "the sleeper outlives the gateway that started it"
    );
    let other_data = tempfile::tempdir().expect("the other replica's data directory");
    let replica_data = |own: &Path| match on_postgres() {
        true => own.to_path_buf(),
        false => data.path().to_path_buf(),
    };
    let gw = next_gateway(&replica_data(other_data.path()), data.path(), &url).await;
    // The stream resumes after what the first gateway's turn appended.
    let mut chat = rejoin(&gw, token, session).await;
    let (output, events) = run_ok(
        &mut chat,
        &format!(
            "cat proof.txt | sed 's/^/PROOF /'; kill -0 {sleeper} && echo \"ALIVE {sleeper}\""
        ),
    )
    .await;
    assert_eq!(
        value(&output, "PROOF"),
        "netns",
        "the workspace file is still there"
    );
    assert_eq!(
        value(&output, "ALIVE"),
        sleeper,
        "the sleeper started before the restart is seen from the hands after it"
    );
    let new_hands: Vec<&Received> = events.iter().filter(|e| e.event == "hands").collect();
    assert!(
        new_hands.iter().any(|e| e.data["state"] == "running")
            && new_hands.iter().all(|e| e.data.get("reset").is_none()),
        "the new gateway connected the same hands, not reset ones: {new_hands:#?}"
    );
    let info = chat.info().await;
    assert_eq!(info["isolation"], "remote", "the session object: {info}");
    assert_eq!(info["hands"], "running", "the session object: {info}");
    let (token, session) = (chat.token.clone(), chat.session.clone());
    drop(chat);
    gw.stop_leaving_hands().await;

    // That gateway again: it has the snapshot its turn took, but the hands' files are on their
    // own machine (on PostgreSQL this replica never had a workspace of the session), so it
    // connects the same hands and restores nothing into them.
    let gw = next_gateway(&replica_data(other_data.path()), data.path(), &url).await;
    let mut chat = rejoin(&gw, token, session).await;
    let (output, events) = run_ok(
        &mut chat,
        &format!("kill -0 {sleeper} && echo \"ALIVE {sleeper}\""),
    )
    .await;
    assert_eq!(value(&output, "ALIVE"), sleeper, "the same hands");
    let hands: Vec<&Received> = events.iter().filter(|e| e.event == "hands").collect();
    assert!(
        hands
            .iter()
            .all(|e| e.data["state"] != "restoring" && e.data.get("reset").is_none()),
        "nothing restored into the live hands: {hands:#?}"
    );
    let (token, session) = (chat.token.clone(), chat.session.clone());
    drop(chat);
    // On PostgreSQL a third replica, with nothing of the session on its disk (no snapshot to
    // restore from): what it knows of the hands is the session's stored meta.
    let third_data = tempfile::tempdir().expect("the third replica's data directory");
    gw.stop_leaving_hands().await;

    // While no gateway runs, another execd takes the address: the next gateway knows the nonce
    // the session's hands had (it is in the session's meta), so it tells the new execd from the
    // old one and says the hands were reset.
    let old_execd = netns.execd_pid.take().expect("the execd's pid");
    kill(old_execd);
    eventually("the first execd is gone", || !alive(old_execd)).await;
    let port: u16 = port.parse().expect("a port number");
    let again = netns.start_execd(root.path(), port).await;
    assert_eq!(again, url, "the new execd answers at the same address");
    let gw = next_gateway(&replica_data(third_data.path()), data.path(), &url).await;
    let mut chat = rejoin(&gw, token, session).await;
    let (output, events) = run_ok(&mut chat, "cat proof.txt | sed 's/^/PROOF /'").await;
    assert_eq!(value(&output, "PROOF"), "netns", "the files are the root's");
    let replaced: Vec<&Received> = events.iter().filter(|e| e.event == "hands").collect();
    assert!(
        replaced
            .iter()
            .any(|e| e.data["state"] == "running" && e.data["reset"] == true),
        "an execd replaced at the address is new hands, reset: {replaced:#?}"
    );
    drop(chat);
    gw.stop().await;

    // Removing the namespace takes the execd and the sleeper with it, and nothing is left.
    let failures = netns.remove();
    assert!(failures.is_empty(), "cleanup: {failures:?}");
    assert!(!alive(execd_pid), "the execd is gone");
    eventually("the sleeper is gone", || !alive(sleeper_pid)).await;
    assert!(
        !netns.link_exists(),
        "the veth link {} is gone",
        netns.host_link
    );
    assert!(
        !netns.namespace_exists(),
        "the namespace {} is gone",
        netns.name
    );
}
