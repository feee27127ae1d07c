//! What a command in the hands can and cannot see: one test per row of the hands table
//! (workspace, `/tmp`, the host image, what is absent, processes, environment, user,
//! refused system calls, network), plus the PTYs execd needs inside and [`probe`].
//!
//! [`probe`]: warren_sandbox::probe

use std::os::unix::fs::MetadataExt;

use tokio::io::AsyncReadExt;
use warren_process::pipes::PipeOptions;
use warren_process::{CommandSpec, Connect, EnvPolicy, HandsVar, TreeMarker};
use warren_sandbox::Network;

use crate::support::{Fixture, expected_uid, run_ok};

#[tokio::test]
async fn writes_land_in_the_workspace_owned_by_the_hands_uid() {
    let fixture = Fixture::new();
    let out = run_ok(
        &fixture.spec(Network::None),
        "pwd; echo hello > made.txt && mkdir sub && echo deep > sub/f",
    )
    .await;
    assert_eq!(out, "/workspace\n");
    let made = fixture.workspace.join("made.txt");
    assert_eq!(std::fs::read_to_string(&made).expect("reads"), "hello\n");
    for path in [made, fixture.workspace.join("sub/f")] {
        let meta = std::fs::metadata(&path).expect("exists on the host");
        assert_eq!(meta.uid(), expected_uid(), "{}", path.display());
    }
}

#[tokio::test]
async fn tmp_is_private() {
    let fixture = Fixture::new();
    let host_marker =
        std::env::temp_dir().join(format!("warren-host-marker-{}", std::process::id()));
    std::fs::write(&host_marker, "host").expect("writes the host marker");
    let inside = std::env::temp_dir().join(format!("warren-inside-{}", std::process::id()));
    let script = format!(
        "test -e {host} && echo host-tmp-visible; echo x > {inside} && echo wrote; ls -A /tmp",
        host = host_marker.display(),
        inside = inside.display(),
    );
    let out = run_ok(&fixture.spec(Network::None), &script).await;
    let _ = std::fs::remove_file(&host_marker);
    let inside_name = inside
        .file_name()
        .expect("named")
        .to_string_lossy()
        .into_owned();
    assert_eq!(out, format!("wrote\n{inside_name}\n"));
    assert!(
        !inside.exists(),
        "a file written in the sandbox's /tmp appeared on the host"
    );
}

#[tokio::test]
async fn the_host_image_is_read_only() {
    let fixture = Fixture::new();
    let out = run_ok(
        &fixture.spec(Network::None),
        "for p in /usr/x /etc/x /bin/x /x /opt/warren/bin/warren /proc/x; do \
             if touch $p 2>/dev/null; then echo \"$p writable\"; fi; done; \
         test -x /usr/bin/sh && test -r /etc/passwd && echo readable",
    )
    .await;
    assert_eq!(out, "readable\n");
}

#[tokio::test]
async fn a_trust_bundle_replaces_the_hosts_certificates_read_only() {
    let fixture = Fixture::new();
    let bundle = fixture.root.path().join("bundle.pem");
    std::fs::write(&bundle, "the host's roots\nthe egress CA\n").expect("writes the bundle");
    std::fs::set_permissions(&bundle, std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .expect("the bundle is readable");
    let mut spec = fixture.spec(Network::None);
    spec.trust_bundle = Some(crate::support::open_path(&bundle));
    let out = run_ok(
        &spec,
        &format!(
            "cat {path}; (echo x >> {path}) 2>/dev/null && echo writable; true",
            path = warren_sandbox::TRUST_BUNDLE
        ),
    )
    .await;
    assert_eq!(out, "the host's roots\nthe egress CA\n");
    assert_eq!(
        std::fs::read_to_string(&bundle).expect("reads the bundle"),
        "the host's roots\nthe egress CA\n"
    );
}

#[tokio::test]
async fn the_rest_of_the_host_is_absent() {
    let fixture = Fixture::new();
    let mut absent = vec![
        "/root".to_owned(),
        "/work".to_owned(),
        "/var".to_owned(),
        "/srv".to_owned(),
        fixture.root.path().display().to_string(),
        fixture.other_session.display().to_string(),
        fixture.data_dir.display().to_string(),
        std::env::current_dir().expect("cwd").display().to_string(),
    ];
    for entry in std::fs::read_dir("/home").into_iter().flatten().flatten() {
        absent.push(entry.path().display().to_string());
    }
    let script = format!(
        "for p in {}; do test -e \"$p\" && echo \"$p present\"; done; ls -A /home; ls -A /opt/warren/bin; ls -A /",
        absent.join(" ")
    );
    let out = run_ok(&fixture.spec(Network::None), &script).await;
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("agent"), "{out}");
    assert_eq!(lines.next(), Some("warren"), "{out}");
    let mut top: Vec<&str> = lines.collect();
    top.sort();
    let mut expected = vec![
        "bin",
        "dev",
        "etc",
        "home",
        "lib",
        "lib64",
        "opt",
        "proc",
        "run",
        "sbin",
        "tmp",
        "usr",
        "workspace",
    ];
    expected.retain(|name| {
        let host = std::path::Path::new("/").join(name);
        !["bin", "lib", "lib64", "sbin"].contains(name) || host.exists()
    });
    assert_eq!(top, expected, "{out}");
}

#[tokio::test]
async fn only_the_sandboxs_own_processes_are_visible() {
    let fixture = Fixture::new();
    let out = run_ok(
        &fixture.spec(Network::None),
        "tr '\\0' ' ' < /proc/1/cmdline; echo; ls /proc | grep -c '^[0-9]'",
    )
    .await;
    let mut lines = out.lines();
    let pid1 = lines.next().unwrap_or_default();
    assert!(
        pid1.starts_with("bwrap ") || pid1.contains("/bwrap "),
        "pid 1 is {pid1:?}"
    );
    // bwrap's init, the stand-in warren (exec'd into sh) and grep, at most one more.
    let n_processes: u32 = lines.next().unwrap_or("").trim().parse().expect("a count");
    assert!(n_processes <= 4, "{n_processes} processes visible: {out}");
}

#[tokio::test]
async fn no_descriptor_of_the_launcher_reaches_a_command() {
    let fixture = Fixture::new();
    let out = run_ok(
        &fixture.spec(Network::None),
        "ls /proc/self/fd | tr '\\n' ' '",
    )
    .await;
    // 0-2 and the descriptor `ls` reads /proc/self/fd through.
    assert_eq!(out.trim(), "0 1 2 3");
}

/// Turns [`the_environment_is_the_allowlist_the_extras_and_the_marker`] into the helper that
/// runs with Warren's and a model's keys in its own environment.
const ENV_HELPER: &str = "WARREN_SANDBOX_TEST_ENV_HELPER";

#[tokio::test]
async fn the_environment_is_the_allowlist_the_extras_and_the_marker() {
    let fixture = Fixture::new();
    let mut spec = fixture.spec(Network::None);
    spec.extra_env = vec![
        "EXTRA_SET=1".parse::<HandsVar>().expect("valid"),
        "PATH=/opt/bin:/usr/bin:/bin".parse().expect("valid"),
    ];
    let out = run_ok(
        &spec,
        "echo '[pid 1]'; tr '\\0' '\\n' < /proc/1/environ; echo '[command]'; env",
    )
    .await;
    let allowed = [
        "PATH",
        "HOME",
        "LANG",
        "TERM",
        "USER",
        "EXTRA_SET",
        "WARREN_TREE_ID",
    ];
    let mut sections = 0;
    for line in out.lines() {
        if line.starts_with('[') {
            sections += 1;
            continue;
        }
        let (name, value) = line.split_once('=').unwrap_or((line, ""));
        // sh adds PWD (and may add OLDPWD/SHLVL/_) for its children; they say nothing of the host.
        if sections == 2 && ["PWD", "OLDPWD", "SHLVL", "_"].contains(&name) {
            continue;
        }
        assert!(allowed.contains(&name), "{name} reached the sandbox: {out}");
        assert!(!value.contains("secret"), "{line}");
    }
    for expected in [
        "HOME=/home/agent",
        "USER=agent",
        "PATH=/opt/bin:/usr/bin:/bin",
        "EXTRA_SET=1",
    ] {
        assert_eq!(
            out.matches(expected).count(),
            2,
            "{expected} in both: {out}"
        );
    }
    if std::env::var_os(ENV_HELPER).is_some() {
        return;
    }
    // The same check in a helper process that holds Warren's and a model's keys.
    let exe = std::env::current_exe().expect("own test binary");
    let helper = CommandSpec::new(exe, &TreeMarker::new())
        .args([
            "--exact",
            "isolation::the_environment_is_the_allowlist_the_extras_and_the_marker",
            "--test-threads=1",
        ])
        .env_policy(EnvPolicy::Daemon)
        .env(ENV_HELPER, "1")
        .env("WARREN_APP_KEY", "secret")
        .env("OPENAI_API_KEY", "secret-x")
        .env("GITHUB_TOKEN", "secret-y");
    let mut child = warren_process::spawn(&helper, Connect::Pipes(PipeOptions::default()))
        .expect("starts the helper")
        .into_pipes();
    let mut text = String::new();
    warren_test_support::within(
        "the helper's checks",
        child.stdout.read_to_string(&mut text),
    )
    .await
    .expect("reads");
    let code = child.child.wait_code().await;
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("1 passed"), "{text}");
}

#[tokio::test]
async fn commands_run_as_the_hands_uid_without_capabilities() {
    let fixture = Fixture::new();
    let out = run_ok(
        &fixture.spec(Network::None),
        "id -u; id -g; grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs):' /proc/self/status | tr -s '\\t' ' '; hostname",
    )
    .await;
    let uid = expected_uid();
    assert_eq!(
        out,
        format!(
            "{uid}\n{uid}\nCapPrm: 0000000000000000\nCapEff: 0000000000000000\nCapBnd: 0000000000000000\nNoNewPrivs: 1\nwarren\n"
        )
    );
}

#[tokio::test]
async fn denied_system_calls_fail_with_eperm() {
    let fixture = Fixture::new();
    let script = format!(
        r#"/usr/bin/python3 - <<'PY'
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
def check(name, result):
    err = ctypes.get_errno()
    print(name, "ok" if result == 0 else errno.errorcode.get(err, err))
check("mount", libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
check("unshare", libc.unshare(0x10000000))
check("keyctl", libc.syscall({keyctl}, 0, 0, 0, 0, 0))
check("ptrace", libc.ptrace(0, 0, None, None))
check("getpid", 0 if libc.getpid() > 0 else -1)
PY"#,
        keyctl = libc::SYS_keyctl
    );
    let out = run_ok(&fixture.spec(Network::None), &script).await;
    assert_eq!(
        out,
        "mount EPERM\nunshare EPERM\nkeyctl EPERM\nptrace EPERM\ngetpid ok\n"
    );
    // The shell tools see the same refusals.
    let out = run_ok(
        &fixture.spec(Network::None),
        "unshare -U true 2>/dev/null; echo unshare=$?; mkdir -p /tmp/m; mount -t tmpfs x /tmp/m 2>/dev/null; echo mount=$?",
    )
    .await;
    assert_eq!(out, "unshare=1\nmount=32\n");
}

#[tokio::test]
async fn network_none_has_only_loopback() {
    let fixture = Fixture::new();
    let out = run_ok(
        &fixture.spec(Network::None),
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
    )
    .await;
    assert_eq!(out, "lo\n");
}

#[tokio::test]
async fn network_host_reaches_a_host_port() {
    let fixture = Fixture::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let port = listener.local_addr().expect("address").port();
    let script = format!("echo from-the-hands > /dev/tcp/127.0.0.1/{port} && echo sent");
    let spec = fixture.spec(Network::Host);
    let sandbox = tokio::spawn(async move {
        crate::support::Sandbox::start(
            &spec,
            &warren_sandbox::Limits::default(),
            &format!("exec /bin/bash -c '{script}'"),
            warren_process::pipes::StdinMode::Null,
        )
        .finish()
        .await
    });
    let (mut stream, _) = warren_test_support::within("the hands connect", listener.accept())
        .await
        .expect("accepts");
    let mut got = String::new();
    warren_test_support::within("the hands' bytes", stream.read_to_string(&mut got))
        .await
        .expect("reads");
    assert_eq!(got, "from-the-hands\n");
    let (code, out) = sandbox.await.expect("joins");
    assert_eq!((code, out.as_str()), (0, "sent\n"));
}

#[tokio::test]
async fn ptys_work_inside() {
    let fixture = Fixture::new();
    let out = run_ok(
        &fixture.spec(Network::None),
        "/usr/bin/python3 -c 'import pty, sys; sys.exit(pty.spawn([\"/bin/sh\", \"-c\", \"tty; test -t 0 && echo on-a-terminal\"]))'",
    )
    .await;
    assert!(out.contains("/dev/pts/"), "{out:?}");
    assert!(out.contains("on-a-terminal"), "{out:?}");
}

#[tokio::test]
async fn one_spec_starts_sandboxes_again_and_again() {
    // bwrap reads the seccomp filter from the descriptor's offset: each start needs its own.
    let fixture = Fixture::new();
    let spec = fixture.spec(Network::None);
    for n in 0..3 {
        assert_eq!(run_ok(&spec, &format!("echo {n}")).await, format!("{n}\n"));
    }
}

#[tokio::test]
async fn the_probe_succeeds_here_and_names_what_fails() {
    let bwrap = warren_sandbox::find_bwrap().expect("bwrap is installed");
    warren_test_support::within("the probe", warren_sandbox::probe(&bwrap))
        .await
        .expect("bwrap works here");
    let err = warren_sandbox::probe(std::path::Path::new("/nonexistent/bwrap"))
        .await
        .expect_err("no bwrap there");
    assert!(err.contains("/nonexistent/bwrap"), "{err}");
    // A bwrap that runs but refuses: `false` stands in for one without user namespaces.
    let err = warren_sandbox::probe(std::path::Path::new("/usr/bin/false"))
        .await
        .expect_err("false fails");
    assert!(err.contains("failed"), "{err}");
}
