//! The hands' cgroups on a real sandbox: freezing stops and thawing resumes the same
//! processes (also one blocked reading stdin), the pids and memory limits hold and are
//! counted, `kill_all` empties the cgroup, and a restarted gateway finds it again by name.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use warren_process::pipes::StdinMode;
use warren_sandbox::{CgroupRoots, HandsCgroup, Limits, Network};

use crate::support::{Fixture, Sandbox};

fn file_len(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).map_or(0, |meta| meta.len())
}

#[test]
fn this_host_offers_freezing_and_both_limits() {
    let roots = CgroupRoots::discover();
    let described = roots.describe();
    assert!(roots.v2.is_some() || roots.freezer.is_some(), "{described}");
    assert!(
        roots.memory.is_some() && roots.pids.is_some(),
        "{described}"
    );
}

#[test]
fn discoveries_running_at_once_in_one_process_all_find_the_same_hierarchies() {
    let expected = CgroupRoots::discover().describe();
    let found: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..16)
            .map(|_| {
                scope.spawn(|| {
                    (0..20)
                        .map(|_| CgroupRoots::discover().describe())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|handle| handle.join().expect("discovery thread"))
            .collect()
    });
    assert!(
        found.iter().all(|described| *described == expected),
        "a concurrent probe never hides a hierarchy: {:?}",
        found.iter().find(|described| **described != expected)
    );
}

#[tokio::test]
async fn freezing_stops_a_ticker_and_thawing_resumes_the_same_process() {
    let fixture = Fixture::new();
    let tick = fixture.workspace.join("tick");
    let sandbox = Sandbox::start(
        &fixture.spec(Network::None),
        &Limits::default(),
        "while :; do echo $$ >> tick; sleep 0.02; done",
        StdinMode::Null,
    );
    let cgroup = sandbox.cgroup.get();
    assert!(cgroup.can_freeze());
    warren_test_support::eventually("the ticker ticks", || file_len(&tick) > 0).await;
    let pids_before = cgroup.pids();
    cgroup.freeze().expect("freezes");
    assert!(cgroup.is_frozen());
    let frozen_len = file_len(&tick);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        file_len(&tick),
        frozen_len,
        "the ticker ticked while frozen"
    );
    // bwrap's init and the shell are the same processes (a `sleep` may come and go).
    let pids_frozen = cgroup.pids();
    for pid in &pids_frozen {
        assert!(pids_before.contains(pid) || pids_frozen.len() >= pids_before.len());
    }
    cgroup.thaw().expect("thaws");
    assert!(!cgroup.is_frozen());
    warren_test_support::eventually("the ticker ticks again", || file_len(&tick) > frozen_len)
        .await;
    let text = std::fs::read_to_string(&tick).expect("reads the ticks");
    let shells: std::collections::BTreeSet<&str> = text.lines().collect();
    assert_eq!(shells.len(), 1, "one shell wrote every tick: {shells:?}");
    cgroup.kill_all().expect("kills");
    let (code, _) = sandbox.finish().await;
    assert_eq!(code, -1, "bwrap was killed");
}

#[tokio::test]
async fn a_process_blocked_reading_stdin_freezes_and_thaws() {
    let fixture = Fixture::new();
    let mut sandbox = Sandbox::start(
        &fixture.spec(Network::None),
        &Limits::default(),
        "echo ready > ready; read line; echo \"got $line\"",
        StdinMode::Pipe,
    );
    let ready = fixture.workspace.join("ready");
    warren_test_support::eventually("the shell is about to read", || ready.exists()).await;
    let cgroup = sandbox.cgroup.get();
    cgroup.freeze().expect("freezes a reader");
    assert!(cgroup.is_frozen());
    cgroup.thaw().expect("thaws");
    let mut stdin = sandbox.child.stdin.take().expect("stdin pipe");
    stdin.write_all(b"hello\n").await.expect("writes");
    drop(stdin);
    let (code, out) = sandbox.finish().await;
    assert_eq!((code, out.as_str()), (0, "got hello\n"));
}

#[tokio::test]
async fn the_pids_limit_refuses_forks_and_is_counted() {
    let fixture = Fixture::new();
    let limits = Limits {
        memory_bytes: None,
        pids: Some(16),
    };
    let sandbox = Sandbox::start(
        &fixture.spec(Network::None),
        &limits,
        "/usr/bin/python3 - <<'PY'
import os, time
kids, refused = [], 0
for i in range(40):
    try:
        pid = os.fork()
    except BlockingIOError:
        refused += 1
        continue
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    kids.append(pid)
print('refused', refused > 0, 'forked below the limit', len(kids) < 16)
for kid in kids:
    os.kill(kid, 9)
    os.waitpid(kid, 0)
PY",
        StdinMode::Null,
    );
    let (code, out, hits) = sandbox.finish_with_hits().await;
    assert!(hits.pids_max > 0, "{hits:?} {out:?}");
    assert_eq!(
        (code, out.as_str()),
        (0, "refused True forked below the limit True\n")
    );
}

#[tokio::test]
async fn the_memory_limit_kills_a_hog_and_is_counted() {
    let fixture = Fixture::new();
    let limits = Limits {
        memory_bytes: Some(64 << 20),
        pids: None,
    };
    let sandbox = Sandbox::start(
        &fixture.spec(Network::None),
        &limits,
        "/usr/bin/python3 -c 'b = b\"x\" * (512 << 20); print(\"survived\", len(b))'; echo \"python=$?\"",
        StdinMode::Null,
    );
    let (code, out, hits) = sandbox.finish_with_hits().await;
    assert!(hits.oom_kills > 0, "{hits:?} {out:?}");
    // The kernel's OOM killer SIGKILLs python (137); the shell that reports it lives on.
    assert_eq!((code, out.as_str()), (0, "Killed\npython=137\n"));
}

#[tokio::test]
async fn kill_all_empties_the_cgroup_and_a_restarted_gateway_finds_it() {
    let fixture = Fixture::new();
    let sandbox = Sandbox::start(
        &fixture.spec(Network::None),
        &Limits::default(),
        "sleep 1000 & sleep 1000 & (sleep 1000 &) ; wait",
        StdinMode::Null,
    );
    let cgroup = sandbox.cgroup.get();
    // bwrap, its init, the shell and three sleepers.
    warren_test_support::eventually("every sleeper started", || cgroup.pids().len() >= 5).await;
    let name = cgroup
        .procs_files()
        .first()
        .and_then(|file| {
            file.parent()?
                .file_name()?
                .to_str()?
                .strip_prefix("warren-hands-")
                .map(str::to_owned)
        })
        .expect("a hands cgroup name");
    let reopened = HandsCgroup::open(&CgroupRoots::discover(), &name).expect("found by name");
    assert_eq!(&reopened, cgroup);
    assert_eq!(reopened.pids(), cgroup.pids());
    reopened.kill_all().expect("kills every process");
    assert!(cgroup.is_empty());
    let (code, _) = sandbox.finish().await;
    assert_eq!(code, -1);
    assert!(HandsCgroup::open(&CgroupRoots::discover(), "never-created").is_none());
}
