//! `warren bench hands`: the hands lifecycle with the local provider (bwrap where it works, as
//! the gateway would run it), driven through the gateway's own `Hands`: create and the first
//! tool call, pause and resume with 50 processes in the hands, snapshot and restore throughput
//! on a 100 MiB / 10,000-file workspace, the archive → restore round trip, and the memory of an
//! idle paused sandbox. Prints one markdown table with the targets of hands.md beside it.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use warren_brain::{Host, TerminalSpec};
use warren_gateway::hands::local::{LocalConfig, LocalHands};
use warren_gateway::hands::{BrainPlacement, Hands, HandsProvider};

const N_CREATES: usize = 10;
const N_PAUSES: usize = 10;
const N_PROCESSES: usize = 50;
const N_FILES: usize = 10_000;
const FILE_BYTES: usize = 10 * 1024 + 486; // 10,000 files ≈ 100 MiB

struct Row {
    what: String,
    value: String,
    target: &'static str,
}

pub async fn run() -> anyhow::Result<()> {
    let data = std::env::temp_dir().join(format!("warren-bench-hands-{}", std::process::id()));
    std::fs::create_dir_all(&data)?;
    let result = bench(&data).await;
    let run_dir = data.join("run").join("hands");
    warren_gateway::hands::local::stop_left_hands_blocking(&run_dir);
    let _ = std::fs::remove_dir_all(&data);
    let (isolation, rows) = result?;
    println!("hands isolation: {isolation}");
    println!("| measurement | result | target (hands.md) |");
    println!("|---|---|---|");
    for row in rows {
        println!("| {} | {} | {} |", row.what, row.value, row.target);
    }
    Ok(())
}

fn ms(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1000.0)
}

/// Median and worst of `samples`.
fn summary(samples: &mut [Duration]) -> String {
    samples.sort();
    let median = samples[samples.len() / 2];
    let worst = samples[samples.len() - 1];
    format!("{} (worst {})", ms(median), ms(worst))
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

/// Runs `script` in the hands and returns its output once it exited.
async fn run_in(hands: &Arc<Hands>, script: &str) -> anyhow::Result<String> {
    let id = hands
        .create_terminal(bash(script))
        .await
        .map_err(|e| anyhow::anyhow!("create terminal: {e}"))?;
    hands
        .wait_for_terminal_exit(id.clone())
        .await
        .map_err(|e| anyhow::anyhow!("wait: {e}"))?;
    let output = hands
        .terminal_output(id.clone())
        .await
        .map_err(|e| anyhow::anyhow!("output: {e}"))?;
    let _ = hands.release_terminal(id).await;
    Ok(output.output)
}

async fn bench(data: &Path) -> anyhow::Result<(String, Vec<Row>)> {
    let warren_bin = std::env::current_exe()?;
    let config = LocalConfig::with_defaults(warren_bin, data.join("run").join("hands"));
    std::fs::create_dir_all(&config.run_dir)?;
    let provider: Arc<dyn HandsProvider> = Arc::new(LocalHands::new(config).await);
    let isolation = provider.isolation().label().to_string();
    let mut rows = Vec::new();
    let session_dir = |n: usize| data.join("sessions").join(format!("bench-{n}"));

    // Create, and the first tool call of a new session against the same call on warm hands.
    let mut creates = Vec::new();
    let mut first_calls = Vec::new();
    let mut warm_calls = Vec::new();
    for n in 0..N_CREATES {
        let dir = session_dir(n);
        std::fs::create_dir_all(dir.join("workspace"))?;
        let hands = Hands::new(
            provider.clone(),
            &format!("bench-{n}"),
            &dir,
            BrainPlacement::Host,
        );
        let started = Instant::now();
        hands.endpoint().await.context("create hands")?;
        creates.push(started.elapsed());
        hands.stop().await;

        let hands = Hands::new(
            provider.clone(),
            &format!("bench-{n}b"),
            &dir,
            BrainPlacement::Host,
        );
        let started = Instant::now();
        run_in(&hands, "true").await?;
        first_calls.push(started.elapsed());
        let started = Instant::now();
        run_in(&hands, "true").await?;
        warm_calls.push(started.elapsed());
        hands.stop().await;
    }
    rows.push(Row {
        what: "create (incl. bwrap), to execd answering".into(),
        value: summary(&mut creates),
        target: "< 100 ms",
    });
    let mut overheads: Vec<Duration> = first_calls
        .iter()
        .zip(&warm_calls)
        .map(|(first, warm)| first.saturating_sub(*warm))
        .collect();
    rows.push(Row {
        what: "first tool call of a new session, over the same call on warm hands".into(),
        value: format!(
            "{} (warm call {})",
            summary(&mut overheads),
            summary(&mut warm_calls)
        ),
        target: "< 150 ms",
    });

    // Pause and resume with 50 processes.
    let dir = session_dir(100);
    std::fs::create_dir_all(dir.join("workspace"))?;
    let hands = Hands::new(provider.clone(), "bench-pause", &dir, BrainPlacement::Host);
    run_in(
        &hands,
        &format!("for i in $(seq {N_PROCESSES}); do setsid sleep 100000 >/dev/null 2>&1 & done; echo started"),
    )
    .await?;
    let mut pauses = Vec::new();
    let mut resumes = Vec::new();
    for _ in 0..N_PAUSES {
        let started = Instant::now();
        hands.pause(None).await;
        pauses.push(started.elapsed());
        let started = Instant::now();
        hands.endpoint().await.context("resume")?;
        resumes.push(started.elapsed());
    }
    rows.push(Row {
        what: format!("pause (snapshot of a tiny workspace + freeze), {N_PROCESSES} processes"),
        value: summary(&mut pauses),
        target: "< 20 ms",
    });
    rows.push(Row {
        what: format!("resume (thaw), {N_PROCESSES} processes"),
        value: summary(&mut resumes),
        target: "< 20 ms",
    });
    hands.pause(None).await;
    let rss_kib = hands
        .sandbox_pid()
        .await
        .map(tree_rss_kib)
        .unwrap_or_default();
    rows.push(Row {
        what: "RSS of an idle paused sandbox (bwrap + execd, without the 50 sleepers)".into(),
        value: format!("{:.1} MiB", rss_kib.0 as f64 / 1024.0),
        target: "—",
    });
    hands.stop().await;

    // Snapshot and restore of 100 MiB in 10,000 files.
    let dir = session_dir(200);
    let workspace = dir.join("workspace");
    fill_workspace(&workspace)?;
    let hands = Hands::new(
        provider.clone(),
        "bench-snapshot",
        &dir,
        BrainPlacement::Host,
    );
    hands.endpoint().await.context("start")?;
    let total_mib = (N_FILES * FILE_BYTES) as f64 / (1024.0 * 1024.0);
    let started = Instant::now();
    let info = hands
        .snapshot()
        .await
        .context("snapshot of the 100 MiB workspace")?;
    let snapshot_time = started.elapsed();
    rows.push(Row {
        what: format!(
            "snapshot, {N_FILES} files / {total_mib:.0} MiB (compressed to {:.1} MiB)",
            info.bytes as f64 / (1024.0 * 1024.0)
        ),
        value: format!("{:.0} MiB/s", total_mib / snapshot_time.as_secs_f64()),
        target: "≥ 100 MiB/s",
    });
    hands.pause(None).await;
    let started = Instant::now();
    hands.archive(u64::MAX).await;
    let archive_time = started.elapsed();
    anyhow::ensure!(
        !workspace.exists(),
        "the archive removed the live workspace"
    );
    let started = Instant::now();
    hands.endpoint().await.context("restore")?;
    let restore_time = started.elapsed();
    let n_restored = count_files(&workspace);
    anyhow::ensure!(
        n_restored == N_FILES,
        "restored {n_restored} of {N_FILES} files"
    );
    rows.push(Row {
        what: "restore into new hands (incl. their start)".into(),
        value: format!("{:.0} MiB/s", total_mib / restore_time.as_secs_f64()),
        target: "≥ 100 MiB/s",
    });
    rows.push(Row {
        what: "archive → restore round trip, 100 MiB".into(),
        value: format!(
            "{} (archive {}, restore {})",
            ms(archive_time + restore_time),
            ms(archive_time),
            ms(restore_time)
        ),
        target: "—",
    });
    hands.stop().await;

    // The same round trip on a few KB, the production system's measured case.
    let dir = session_dir(300);
    std::fs::create_dir_all(dir.join("workspace"))?;
    std::fs::write(
        dir.join("workspace").join("notes.txt"),
        "a few bytes\n".repeat(300),
    )?;
    let hands = Hands::new(provider.clone(), "bench-small", &dir, BrainPlacement::Host);
    hands.endpoint().await.context("start")?;
    let started = Instant::now();
    hands.pause(None).await;
    hands.archive(u64::MAX).await;
    hands.endpoint().await.context("restore small")?;
    rows.push(Row {
        what: "pause + archive + restore of a few KB".into(),
        value: ms(started.elapsed()),
        target: "— (production: 2–3 s)",
    });
    hands.stop().await;
    Ok((isolation, rows))
}

/// 10,000 files of pseudo-random (incompressible) bytes in 100 directories (readable by the
/// sandbox's uid; the prepared workspace directory itself is made its own).
fn fill_workspace(workspace: &Path) -> anyhow::Result<()> {
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let mut buffer = vec![0u8; FILE_BYTES];
    for n in 0..N_FILES {
        let dir = workspace.join(format!("d{:03}", n % 100));
        std::fs::create_dir_all(&dir)?;
        for chunk in buffer.chunks_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let bytes = state.to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        std::fs::write(dir.join(format!("f{n:05}.bin")), &buffer)?;
    }
    Ok(())
}

fn count_files(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => count_files(&entry.path()),
            Ok(kind) if kind.is_file() => 1,
            _ => 0,
        })
        .sum()
}

/// Resident memory of `root` and its descendants that are not `sleep` (KiB).
#[derive(Default)]
struct Kib(u64);

fn tree_rss_kib(root: u32) -> Kib {
    let tree = warren_process::TreeId::new(root as i32, None);
    let total = warren_process::tree_members(&tree)
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|comm| comm.trim() != "sleep")
                .unwrap_or(false)
        })
        .filter_map(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|value| {
                    value
                        .trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
        })
        .sum();
    Kib(total)
}
