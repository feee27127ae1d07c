//! `warren bench checkpoints`: the deduplicated checkpoint store (`warren-checkpoint`) on a
//! workspace built in a temporary directory: 1 GiB in 20,000 files by default, a tree of small
//! source-like files (a `node_modules` of 995 packages of 20 files, compressible text) and 100
//! large files of incompressible bytes making up the rest. Measured in one run on local disk:
//! the first checkpoint (MiB/s), a checkpoint with nothing changed, 100 turns that each change
//! 1 MiB (768 KiB in place in a large file and 16 small files rewritten with 16 KiB) and are
//! checkpointed (time and bytes stored per turn, and the store's total against one full copy),
//! a restore into a fresh directory, a fork (an import into a new store, then a restore that
//! copies the files the workspace still holds unchanged), a rewind in place to the checkpoint
//! ten turns back (the current state checkpointed first, as a rewind does), and a collection
//! keeping the newest ten (without the grace, so the sweep has something to delete). `--s3 s3://bucket/prefix`
//! (the `AWS_*` variables set) repeats the first checkpoint, ten turns and the fresh restore
//! against that bucket. The workspace is in the page cache when it is read, and dirty pages of
//! earlier steps are written back before each timed step: these are the store's figures, not
//! the disk's.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use warren_checkpoint::{Bucket, CheckpointStore, Config, LocalDisk, Manifest, to_drop};

use super::support::{Row, ms, print_table};

const MIB: u64 = 1024 * 1024;
/// Packages in the `node_modules` tree and files in each.
const N_PACKAGES: usize = 995;
const FILES_PER_PACKAGE: usize = 20;
/// What one turn changes: in place in a large file, and small files rewritten.
const TURN_IN_PLACE: usize = 768 * 1024;
const TURN_SMALL_FILES: usize = 16;
const TURN_SMALL_BYTES: usize = 16 * 1024;
/// How many turns back the rewind goes, and how many checkpoints the collection keeps.
const REWIND_TURNS: usize = 10;
const KEEP_N: usize = 10;
/// Turns measured against the bucket with `--s3`.
const S3_TURNS: usize = 10;

#[derive(Debug, clap::Args)]
pub struct CheckpointsArgs {
    /// The workspace's size in MiB.
    #[arg(long, default_value_t = 1024)]
    pub size_mib: u64,
    /// Turns of 1 MiB each, checkpointed one by one.
    #[arg(long, default_value_t = 100)]
    pub turns: usize,
    /// Also measure against this bucket (`s3://bucket/prefix`; endpoint and credentials from
    /// the `AWS_*` variables).
    #[arg(long)]
    pub s3: Option<String>,
}

pub async fn run(args: CheckpointsArgs) -> anyhow::Result<()> {
    if args.turns <= REWIND_TURNS {
        bail!("--turns must be more than {REWIND_TURNS}");
    }
    let runtime = tokio::runtime::Handle::current();
    let dir = std::env::temp_dir().join(format!("warren-bench-checkpoints-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let bench_dir = dir.clone();
    let result = tokio::task::spawn_blocking(move || bench(&bench_dir, &args, runtime)).await;
    let _ = std::fs::remove_dir_all(&dir);
    let rows = result.context("the benchmark's thread")??;
    print_table(&rows);
    Ok(())
}

fn bench(
    dir: &Path,
    args: &CheckpointsArgs,
    runtime: tokio::runtime::Handle,
) -> anyhow::Result<Vec<Row>> {
    let root = dir.join("workspace");
    let started = Instant::now();
    let mut rng = Rng(0x5eed_c0ff_ee00_0001);
    let workspace = build_workspace(&root, args.size_mib * MIB, &mut rng)?;
    let mut rows = vec![Row {
        measurement: "workspace".to_owned(),
        result: format!(
            "{} MiB in {} files ({} small, {} large), built in {:.1} s",
            workspace.bytes / MIB,
            workspace.small.len() + workspace.large.len(),
            workspace.small.len(),
            workspace.large.len(),
            started.elapsed().as_secs_f64()
        ),
        target: "",
    }];

    let store_dir = dir.join("store");
    let disk = Arc::new(LocalDisk::open(&store_dir)?);
    let store = CheckpointStore::new(disk.clone(), Config::default());
    // The sweep is measured without the grace, which would spare every chunk of this run.
    let sweeper = CheckpointStore::new(
        disk,
        Config {
            grace: Duration::ZERO,
            ..Config::default()
        },
    );
    rows.extend(measure(
        &store,
        &root,
        dir,
        &workspace,
        args.turns,
        &mut rng,
        Some((&store_dir, &sweeper)),
    )?);

    if let Some(url) = &args.s3 {
        let (bucket, prefix) = url
            .strip_prefix("s3://")
            .and_then(|rest| rest.split_once('/').or(Some((rest, ""))))
            .context("--s3 takes s3://bucket/prefix")?;
        let env: Vec<(String, String)> = std::env::vars()
            .filter(|(k, _)| k.starts_with("AWS_"))
            .collect();
        let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let prefix = format!(
            "{}/bench-{}",
            prefix.trim_end_matches('/'),
            std::process::id()
        );
        let bucket = Arc::new(Bucket::s3(
            bucket,
            prefix.trim_start_matches('/'),
            &env,
            runtime,
        )?);
        let store = CheckpointStore::new(bucket, Config::default());
        let s3_rows = measure(&store, &root, dir, &workspace, S3_TURNS, &mut rng, None)?;
        rows.extend(s3_rows.into_iter().map(|mut row| {
            row.measurement = format!("S3: {}", row.measurement);
            row
        }));
    }
    Ok(rows)
}

/// The workspace's files: the small ones and the large ones, and all their bytes.
struct Workspace {
    small: Vec<PathBuf>,
    large: Vec<PathBuf>,
    bytes: u64,
}

fn build_workspace(root: &Path, total: u64, rng: &mut Rng) -> anyhow::Result<Workspace> {
    let mut small = Vec::new();
    let mut bytes = 0u64;
    for package in 0..N_PACKAGES {
        let dir = root.join(format!("node_modules/pkg-{package:04}"));
        std::fs::create_dir_all(dir.join("lib"))?;
        for file in 0..FILES_PER_PACKAGE {
            let path = match file {
                0 => dir.join("package.json"),
                1 => dir.join("README.md"),
                2 => dir.join("index.js"),
                n => dir.join(format!("lib/mod-{n:02}.js")),
            };
            let size = 1024 + (rng.next() % (11 * 1024)) as usize;
            let content = source_text(rng, package, file, size);
            std::fs::write(&path, &content)?;
            bytes += content.len() as u64;
            small.push(path);
        }
    }
    let n_large = 100u64;
    let each = total.saturating_sub(bytes) / n_large;
    if each < 2 * TURN_IN_PLACE as u64 {
        bail!("--size-mib is too small for 100 large files next to the small ones");
    }
    let mut large = Vec::new();
    std::fs::create_dir_all(root.join("data"))?;
    for n in 0..n_large {
        let path = root.join(format!("data/blob-{n:03}.bin"));
        std::fs::write(&path, rng.bytes(each as usize))?;
        bytes += each;
        large.push(path);
    }
    Ok(Workspace {
        small,
        large,
        bytes,
    })
}

/// Compressible, per-file-unique text that looks like source.
fn source_text(rng: &mut Rng, package: usize, file: usize, size: usize) -> Vec<u8> {
    let mut text = format!("// pkg-{package:04} file {file}\n");
    while text.len() < size {
        let n = rng.next() % 10_000;
        text.push_str(&format!(
            "export function f{n}_{package}(a, b) {{ return a * {} + b - {}; }}\n",
            n % 97,
            n % 13
        ));
    }
    text.truncate(size);
    text.into_bytes()
}

/// One turn's change: 768 KiB in place in a large file and 16 small files rewritten.
fn change_one_mib(workspace: &Workspace, rng: &mut Rng, turn: usize) -> anyhow::Result<()> {
    let large = &workspace.large[turn % workspace.large.len()];
    let size = std::fs::metadata(large)?.len();
    let offset = rng.next() % (size - TURN_IN_PLACE as u64);
    std::fs::OpenOptions::new()
        .write(true)
        .open(large)?
        .write_all_at(&rng.bytes(TURN_IN_PLACE), offset)?;
    for _ in 0..TURN_SMALL_FILES {
        let index = (rng.next() % workspace.small.len() as u64) as usize;
        let content = source_text(rng, index, turn, TURN_SMALL_BYTES);
        std::fs::write(&workspace.small[index], content)?;
    }
    Ok(())
}

/// The measurements on one store; on local disk (its directory, and a store without the grace
/// to sweep with) also its size against one copy, a rewind and a collection.
fn measure(
    store: &CheckpointStore,
    root: &Path,
    dir: &Path,
    workspace: &Workspace,
    turns: usize,
    rng: &mut Rng,
    local: Option<(&Path, &CheckpointStore)>,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    settle();
    let (first, stats) = store.take(root, None)?;
    let mib = workspace.bytes as f64 / MIB as f64;
    rows.push(Row {
        measurement: "first checkpoint".to_owned(),
        result: format!(
            "{:.2} s, {:.0} MiB/s; {:.0} MiB stored ({:.2}× the workspace)",
            stats.elapsed.as_secs_f64(),
            mib / stats.elapsed.as_secs_f64(),
            stats.bytes_new as f64 / MIB as f64,
            stats.bytes_new as f64 / workspace.bytes as f64
        ),
        target: "",
    });
    rows.push(Row {
        measurement: format!("manifest of {} entries, stored", first.entries.len()),
        result: format!("{:.0} KiB", stats.manifest_bytes_new as f64 / 1024.0),
        target: "",
    });

    // The workspace was just written: its mtimes are too fresh for the quick check, so the
    // second checkpoint reads it again (hashing only); the third finds nothing to read.
    let (second, _) = store.take(root, Some(&first))?;
    let (mut previous, stats) = store.take(root, Some(&second))?;
    rows.push(Row {
        measurement: "checkpoint with nothing changed".to_owned(),
        result: format!(
            "{}, {} bytes stored, {} bytes read",
            ms(stats.elapsed),
            stats.bytes_new,
            stats.bytes_read
        ),
        target: "",
    });

    let mut times = Vec::new();
    let mut stored = Vec::new();
    let mut history: Vec<Manifest> = vec![previous.clone()];
    let mut changed_per_turn = Vec::new();
    for turn in 0..turns {
        change_one_mib(workspace, rng, turn)?;
        let (manifest, stats) = store.take(root, Some(&previous))?;
        times.push(stats.elapsed);
        stored.push(stats.bytes_new);
        changed_per_turn.push(stats.files_changed);
        history.push(manifest.clone());
        previous = manifest;
    }
    times.sort();
    stored.sort();
    rows.push(Row {
        measurement: format!("a turn changing 1 MiB ({turns} turns): checkpoint time p50 / max"),
        result: format!(
            "{} / {}",
            ms(times[times.len() / 2]),
            ms(times[times.len() - 1])
        ),
        target: "< 300 ms",
    });
    rows.push(Row {
        measurement: "a turn changing 1 MiB: bytes stored p50 / max".to_owned(),
        result: format!(
            "{:.2} MiB / {:.2} MiB",
            stored[stored.len() / 2] as f64 / MIB as f64,
            stored[stored.len() - 1] as f64 / MIB as f64
        ),
        target: "< 2 MiB",
    });
    if let Some((store_dir, _)) = local {
        let total = dir_bytes(store_dir)?;
        rows.push(Row {
            measurement: format!("{turns} such turns: the store against one full copy"),
            result: format!(
                "{:.0} MiB, {:.3}×",
                total as f64 / MIB as f64,
                total as f64 / workspace.bytes as f64
            ),
            target: "< 1.2×",
        });
    }

    let fresh = dir.join("restored");
    settle();
    let started = Instant::now();
    let restored = store.restore(&previous, &fresh, None)?;
    let restore_time = started.elapsed();
    let (n_files, n_bytes) = (restored.n_files(), restored.n_bytes());
    if (n_files, n_bytes) != (previous.n_files(), previous.n_bytes()) {
        bail!(
            "the restore holds {n_files} files of {n_bytes} bytes, not {} of {}",
            previous.n_files(),
            previous.n_bytes()
        );
    }
    same_file(&workspace.large[0], root, &fresh)?;
    same_file(&workspace.small[7], root, &fresh)?;
    rows.push(Row {
        measurement: "restore into a fresh directory".to_owned(),
        result: format!(
            "{:.2} s, {:.0} MiB/s",
            restore_time.as_secs_f64(),
            n_bytes as f64 / MIB as f64 / restore_time.as_secs_f64()
        ),
        target: "",
    });

    if local.is_some() {
        rows.extend(fork_and_tar(store, &previous, root, dir)?);
    }
    // Trees are deleted only after the steps that write: a file system deleting 20,000 files
    // in the background (XFS) slows whatever writes next.
    std::fs::remove_dir_all(&fresh)?;

    if let Some((_, sweeper)) = local {
        let back = &history[history.len() - 1 - REWIND_TURNS];
        settle();
        let started = Instant::now();
        let (current, _) = store.take(root, Some(&previous))?;
        let checkpointed = started.elapsed();
        let rewound = store.restore(back, root, Some(&current))?;
        let total = started.elapsed();
        let (_, after) = store.take(root, Some(&rewound))?;
        if after.files_changed != 0 {
            bail!(
                "the rewound workspace differs from its checkpoint in {} files",
                after.files_changed
            );
        }
        rows.push(Row {
            measurement: format!(
                "rewind in place {REWIND_TURNS} turns back (checkpoint of now + restore)"
            ),
            result: format!(
                "{} ({} checkpoint, {} restore)",
                ms(total),
                ms(checkpointed),
                ms(total - checkpointed)
            ),
            target: "< 1 s",
        });

        let listed = store.page(None, usize::MAX)?.checkpoints;
        let dropped = to_drop(
            &listed,
            KEEP_N,
            Duration::from_secs(30 * 24 * 3600),
            SystemTime::now(),
        );
        let kept_ids: Vec<String> = listed
            .iter()
            .map(|l| l.id.clone())
            .filter(|id| !dropped.contains(id))
            .collect();
        let started = Instant::now();
        for id in &dropped {
            store.delete(id)?;
        }
        let kept: Vec<Manifest> = kept_ids
            .iter()
            .map(|id| store.load(id))
            .collect::<Result<_, _>>()?;
        let kept_refs: Vec<&Manifest> = kept.iter().collect();
        let collected = sweeper.collect(&kept_refs)?;
        rows.push(Row {
            measurement: format!("collect keeping the newest {KEEP_N} of {}", listed.len()),
            result: format!(
                "{}, {} chunks kept, {} deleted",
                ms(started.elapsed()),
                collected.n_kept,
                collected.n_deleted
            ),
            target: "",
        });
    }
    Ok(rows)
}

/// A fork (the checkpoint's chunks copied into a new session's store, then restored into its
/// workspace, copying the files the source workspace still holds unchanged, as the engine's
/// fork does) and an archived session's restore from its last checkpoint, against the
/// whole-tar snapshot of the same tree (`warren-snapshot`, what archives were before).
fn fork_and_tar(
    store: &CheckpointStore,
    last: &Manifest,
    root: &Path,
    dir: &Path,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    let fork_store_dir = dir.join("fork-store");
    let forked = CheckpointStore::new(
        Arc::new(LocalDisk::open(&fork_store_dir)?),
        Config::default(),
    );
    let fork_ws = dir.join("fork-workspace");
    settle();
    let started = Instant::now();
    let copied = forked.import(store, last)?;
    let imported = started.elapsed();
    forked.restore_from(last, &fork_ws, Some(root))?;
    let total = started.elapsed();
    same_file(&root.join("data/blob-000.bin"), root, &fork_ws)?;
    rows.push(Row {
        measurement: "fork (chunks linked into the new session's store + restore from the source)"
            .to_owned(),
        result: format!(
            "{} ({} linking {:.0} MiB, {} restoring)",
            ms(total),
            ms(imported),
            copied as f64 / MIB as f64,
            ms(total - imported)
        ),
        target: "< 1 s",
    });

    let tar = dir.join("snapshot.tar.zst");
    settle();
    let started = Instant::now();
    let packed = warren_snapshot::pack(root, std::fs::File::create(&tar)?)
        .map_err(|e| anyhow::anyhow!("pack: {e}"))?;
    let pack_time = started.elapsed();
    let tar_bytes = std::fs::metadata(&tar)?.len();
    rows.push(Row {
        measurement: "whole-tar snapshot of the same tree (archives before checkpoints)".to_owned(),
        result: format!(
            "{:.2} s, {:.0} MiB written every time ({} files)",
            pack_time.as_secs_f64(),
            tar_bytes as f64 / MIB as f64,
            packed.n_files
        ),
        target: "",
    });
    let untarred = dir.join("untarred");
    std::fs::create_dir_all(&untarred)?;
    settle();
    let started = Instant::now();
    warren_snapshot::unpack(
        std::fs::File::open(&tar)?,
        &untarred,
        &warren_snapshot::UnpackLimits::default(),
    )
    .map_err(|e| anyhow::anyhow!("unpack: {e}"))?;
    let unpack_time = started.elapsed();
    let restored = dir.join("archived-restore");
    settle();
    let started = Instant::now();
    store.restore(last, &restored, None)?;
    let restore_time = started.elapsed();
    rows.push(Row {
        measurement: "an archived session's restore: its last checkpoint vs the whole tar"
            .to_owned(),
        result: format!(
            "{} vs {} ({:.2}×)",
            ms(restore_time),
            ms(unpack_time),
            restore_time.as_secs_f64() / unpack_time.as_secs_f64()
        ),
        target: "",
    });
    for done in [&untarred, &restored, &fork_ws, &fork_store_dir] {
        std::fs::remove_dir_all(done)?;
    }
    std::fs::remove_file(&tar)?;
    Ok(rows)
}

/// Writes back what earlier steps left dirty (the workspace just built, a tree just
/// deleted), so a timed step pays only for its own writes.
fn settle() {
    rustix::fs::sync();
}

fn same_file(path: &Path, root: &Path, other_root: &Path) -> anyhow::Result<()> {
    let relative = path.strip_prefix(root)?;
    if std::fs::read(path)? != std::fs::read(other_root.join(relative))? {
        bail!("{} differs after the restore", relative.display());
    }
    Ok(())
}

/// The bytes of every file beneath `dir`.
fn dir_bytes(dir: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let metadata = entry.metadata()?;
            if metadata.is_dir() {
                pending.push(entry.path());
            } else {
                total += metadata.len();
            }
        }
    }
    Ok(total)
}

/// xorshift64: fast, deterministic, incompressible output.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n + 8);
        while out.len() < n {
            out.extend_from_slice(&self.next().to_le_bytes());
        }
        out.truncate(n);
        out
    }
}
