//! Checkpoints taken from a changes stream (`produce` → `take_streamed`): the same checkpoint
//! as a local take of the same tree, sharing its chunks; only changed files travel; a file
//! changing while streamed is reread and reported; and a stream that is cut, lies about a file
//! being unchanged, names an unsafe path, declares an oversized frame or is garbage is refused
//! with nothing stored.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use warren_checkpoint::{CheckpointStore, Error, Known, KnownFile, Manifest, produce};

use super::{age, local_store, noise, write};

/// A tree of every kind a checkpoint holds: files of several sizes (one of several chunks),
/// an empty file, nested and empty directories, modes, links, a name that sorts between a
/// directory and its children (`a.txt` beside `a/`), and a FIFO (skipped).
fn varied_tree(root: &Path) {
    write(root, "README.md", b"# hello\n");
    write(root, "a/inner.txt", b"inner\n");
    write(root, "a.txt", b"beside a/\n");
    write(root, "src/deep/er/still.txt", b"deep\n");
    write(root, "data/blob.bin", &noise(11, 700 * 1024));
    write(root, "empty", b"");
    std::fs::create_dir_all(root.join("empty-dir")).expect("mkdir");
    write(root, "bin/run.sh", b"#!/bin/sh\necho hi\n");
    std::fs::set_permissions(
        root.join("bin/run.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .expect("chmod");
    std::os::unix::fs::symlink("a/inner.txt", root.join("inner-link")).expect("symlink");
    std::os::unix::fs::symlink("/usr/bin/python3", root.join("python")).expect("symlink");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        root.join("pipe"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .expect("mkfifo");
}

/// The changes stream of `root` given what `previous` knows.
fn changes_of(root: &Path, previous: Option<&Manifest>) -> Vec<u8> {
    let known = previous.map(Manifest::known).unwrap_or_default();
    let mut stream = Vec::new();
    produce(root, &known, &mut stream).expect("produces the stream");
    stream
}

fn take_streamed(
    store: &CheckpointStore,
    stream: &[u8],
    previous: Option<&Manifest>,
) -> Result<(Manifest, warren_checkpoint::TakeStats), Error> {
    store.take_streamed(&mut &stream[..], previous, serde_json::Value::Null)
}

/// The ids of the stored checkpoints, newest first.
fn stored(store: &CheckpointStore) -> Vec<String> {
    store
        .page(None, 100)
        .expect("lists")
        .checkpoints
        .into_iter()
        .map(|listed| listed.id)
        .collect()
}

struct Setup {
    _dir: tempfile::TempDir,
    root: PathBuf,
    store: CheckpointStore,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("ws");
    std::fs::create_dir_all(&root).expect("mkdir");
    let (store, _) = local_store(&dir.path().join("store"));
    Setup {
        root,
        store,
        _dir: dir,
    }
}

#[test]
fn a_streamed_take_is_the_checkpoint_a_local_take_of_the_same_tree_makes() {
    let Setup { root, store, _dir } = setup();
    varied_tree(&root);
    age(&root);
    let (other_store, _) = local_store(&_dir.path().join("other-store"));

    let (local, local_stats) = store
        .take_labelled(&root, None, serde_json::json!("local"))
        .expect("takes locally");
    let (streamed, streamed_stats) = other_store
        .take_streamed(
            &mut &changes_of(&root, None)[..],
            None,
            serde_json::json!("streamed"),
        )
        .expect("takes from the stream");
    assert_eq!(streamed.entries, local.entries, "entries and chunk lists");
    assert_eq!(streamed.summary, local.summary);
    assert_eq!(streamed.skipped, 1, "the FIFO");
    assert_eq!(streamed.skipped, local.skipped);
    assert_eq!(streamed.changed_under, local.changed_under);
    assert_eq!(streamed.label, serde_json::json!("streamed"));
    for (streamed, local) in [
        (streamed_stats.files, local_stats.files),
        (streamed_stats.bytes, local_stats.bytes),
        (streamed_stats.files_changed, local_stats.files_changed),
        (streamed_stats.bytes_read, local_stats.bytes_read),
        (
            streamed_stats.bytes_new - streamed_stats.manifest_bytes_new,
            local_stats.bytes_new - local_stats.manifest_bytes_new,
        ),
    ] {
        assert_eq!(streamed, local, "{streamed_stats:?} vs {local_stats:?}");
    }
    assert_eq!(
        other_store.load(&streamed.id).expect("loads"),
        streamed,
        "stored as returned"
    );

    // The next take of each, one file changed, one removed: still the same checkpoint.
    write(&root, "a/inner.txt", b"changed\n");
    std::fs::remove_file(root.join("README.md")).expect("rm");
    let (local_next, local_stats) = store.take(&root, Some(&local)).expect("takes again");
    let (streamed_next, streamed_stats) = take_streamed(
        &other_store,
        &changes_of(&root, Some(&streamed)),
        Some(&streamed),
    )
    .expect("takes again from a stream");
    assert_eq!(streamed_next.entries, local_next.entries);
    assert_eq!(streamed_next.summary, local_next.summary);
    assert_eq!(streamed_stats.files_changed, 2);
    assert_eq!(streamed_stats.bytes_read, local_stats.bytes_read);
}

#[test]
fn a_streamed_take_shares_the_chunks_of_a_local_take_in_the_same_store() {
    let Setup { root, store, _dir } = setup();
    write(&root, "big.bin", &noise(12, 2 * 1024 * 1024));
    let (local, _) = store.take(&root, None).expect("takes locally");
    let (streamed, stats) =
        take_streamed(&store, &changes_of(&root, None), None).expect("takes from the stream");
    assert_eq!(stats.bytes_read, 2 * 1024 * 1024, "nothing known: all sent");
    assert_eq!(
        stats.bytes_new, stats.manifest_bytes_new,
        "no content chunk is new"
    );
    assert_eq!(streamed.entries, local.entries);
}

#[test]
fn only_changed_files_travel_and_a_changed_megabyte_stores_less_than_two() {
    let Setup { root, store, _dir } = setup();
    let mut big = noise(13, 16 * 1024 * 1024);
    write(&root, "big.bin", &big);
    for i in 0..20 {
        write(&root, &format!("src/file{i}.txt"), &noise(100 + i, 4096));
    }
    age(&root);
    let first_stream = changes_of(&root, None);
    assert!(first_stream.len() > big.len() + 20 * 4096);
    let (first, _) = take_streamed(&store, &first_stream, None).expect("first take");
    assert_eq!(first.known().len(), 21, "every file is trusted");

    // Nothing changed: every file goes as unchanged, without content.
    let stream = changes_of(&root, Some(&first));
    assert!(
        stream.len() < 8 * 1024,
        "{} bytes for no change",
        stream.len()
    );
    let (second, stats) = take_streamed(&store, &stream, Some(&first)).expect("second take");
    assert_eq!(stats.bytes_read, 0);
    assert_eq!(stats.files_changed, 0);
    assert_eq!(second.entries, first.entries);

    // One small file changed: only it travels. (Aged, so the next take trusts it too.)
    write(&root, "src/file3.txt", b"new content\n");
    age(&root);
    let stream = changes_of(&root, Some(&second));
    assert!(
        stream.len() < 8 * 1024,
        "{} bytes for 12 changed",
        stream.len()
    );
    let (third, stats) = take_streamed(&store, &stream, Some(&second)).expect("third take");
    assert_eq!(stats.bytes_read, 12);
    assert_eq!(stats.files_changed, 1);

    // A megabyte changed in the middle of the big file: it travels whole, little is stored.
    big[8 * 1024 * 1024..9 * 1024 * 1024].copy_from_slice(&noise(14, 1024 * 1024));
    write(&root, "big.bin", &big);
    let stream = changes_of(&root, Some(&third));
    assert!(
        stream.len() < big.len() + 64 * 1024,
        "{} bytes: more than the big file and the metadata",
        stream.len()
    );
    let (fourth, stats) = take_streamed(&store, &stream, Some(&third)).expect("fourth take");
    assert_eq!(stats.bytes_read, big.len() as u64);
    assert_eq!(stats.files_changed, 1);
    assert!(
        (1024 * 1024..2 * 1024 * 1024).contains(&stats.bytes_new),
        "stored {} bytes for a 1 MiB change",
        stats.bytes_new
    );
    let mut read = Vec::new();
    store
        .read_file(&fourth, "big.bin", 0..big.len() as u64, &mut read)
        .expect("reads");
    assert!(read == big, "the stored file is the changed one");
}

/// A `Write` that appends to `file` when the first content frame of a read of it is written
/// (after its `f` or `r` record), for the first `n_reads` reads: the file moves under the
/// producer's read, deterministically.
struct AppendingWhileRead {
    stream: Vec<u8>,
    file: PathBuf,
    n_reads: usize,
    /// An `f` or `r` record was written: the next content frame starts a read.
    read_starting: bool,
}

impl Write for AppendingWhileRead {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        // The producer writes each frame's header (a tag, then a length) on its own.
        if data.len() == 5 {
            match data[0] {
                b'f' | b'r' => self.read_starting = true,
                b'c' if self.read_starting && self.n_reads > 0 => {
                    self.read_starting = false;
                    self.n_reads -= 1;
                    let mut file = std::fs::OpenOptions::new().append(true).open(&self.file)?;
                    file.write_all(&[b'+'; 100])?;
                }
                _ => {}
            }
        }
        self.stream.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_file_growing_while_streamed_is_reread_and_kept_as_one_read_saw_it() {
    let Setup { root, store, _dir } = setup();
    let original = noise(15, 200 * 1024);
    for (n_reads, changed_under) in [(1, false), (2, true)] {
        write(&root, "log.bin", &original);
        let mut out = AppendingWhileRead {
            stream: Vec::new(),
            file: root.join("log.bin"),
            n_reads,
            read_starting: false,
        };
        let produced = produce(&root, &Known::default(), &mut out).expect("produces");
        let (manifest, stats) =
            take_streamed(&store, &out.stream, None).expect("takes from the stream");
        let expected: &[&str] = if changed_under { &["log.bin"] } else { &[] };
        assert_eq!(produced.changed_under, expected);
        assert_eq!(stats.changed_under, expected);
        assert_eq!(manifest.changed_under, expected);
        let entry = manifest.entry("log.bin").expect("kept");
        assert!(
            stats.bytes_read > original.len() as u64 * 2,
            "read twice: {}",
            stats.bytes_read
        );
        let mut content = Vec::new();
        store
            .read_file(&manifest, "log.bin", 0..entry.size, &mut content)
            .expect("reads");
        assert_eq!(content.len() as u64, entry.size);
        assert!(content.starts_with(&original));
        assert!(
            content[original.len()..].iter().all(|b| *b == b'+'),
            "the original and whole appends"
        );
        if !changed_under {
            let on_disk = std::fs::read(root.join("log.bin")).expect("reads");
            assert!(content == on_disk, "the reread saw the file whole");
        }
    }
}

/// Frames written by hand, as a hostile producer would.
#[derive(Default)]
struct Frames(Vec<u8>);

impl Frames {
    fn raw(mut self, tag: u8, payload: &[u8]) -> Frames {
        self.0.push(tag);
        self.0
            .extend_from_slice(&(payload.len() as u32).to_be_bytes());
        self.0.extend_from_slice(payload);
        self
    }

    fn json(self, tag: u8, value: serde_json::Value) -> Frames {
        let payload = serde_json::to_vec(&value).expect("encodes");
        self.raw(tag, &payload)
    }

    fn header(self) -> Frames {
        self.json(
            b'H',
            serde_json::json!({"v": 1, "started_ns": 1_700_000_000_000_000_000i64}),
        )
    }

    fn dir(self, path: &str) -> Frames {
        self.json(
            b'd',
            serde_json::json!({"path": path, "mode": 0o755, "size": 0, "mtime_ns": 1, "ino": 1, "dev": 1}),
        )
    }

    fn file(self, path: &str, content: &[u8]) -> Frames {
        self.json(
            b'f',
            serde_json::json!({"path": path, "mode": 0o644, "size": content.len(), "mtime_ns": 1, "ino": 2, "dev": 1}),
        )
        .raw(b'c', content)
    }

    fn end(self) -> Frames {
        self.json(b'E', serde_json::json!({"skipped": 0, "changed_under": []}))
    }
}

/// Refused with a corrupt or unsafe error, and nothing stored beyond `before`.
fn assert_refused(store: &CheckpointStore, stream: &[u8], previous: Option<&Manifest>, what: &str) {
    let before = stored(store);
    match take_streamed(store, stream, previous) {
        Err(Error::Corrupt(_) | Error::Unsafe { .. }) => {}
        other => panic!("{what}: expected corrupt or unsafe, got {other:?}"),
    }
    assert_eq!(stored(store), before, "{what}: nothing stored");
}

#[test]
fn a_hand_made_stream_is_taken_and_its_entries_sorted() {
    let Setup { store, _dir, .. } = setup();
    let stream = Frames::default()
        .header()
        .dir("d")
        .file("d/x", b"hello")
        .file("c", b"")
        .end();
    let (manifest, stats) = take_streamed(&store, &stream.0, None).expect("takes");
    let paths: Vec<&str> = manifest.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["c", "d", "d/x"]);
    assert_eq!(stats.bytes_read, 5);
    assert_eq!(stored(&store), std::slice::from_ref(&manifest.id));
}

#[test]
fn a_cut_stream_is_truncated_and_stores_nothing() {
    let Setup { root, store, _dir } = setup();
    varied_tree(&root);
    let (first, _) = store.take(&root, None).expect("an earlier checkpoint");
    write(&root, "data/blob.bin", &noise(16, 300 * 1024));
    let stream = changes_of(&root, Some(&first));
    // Every cut inside the header, at a frame boundary, in a content frame, before the end
    // record's last byte.
    let cuts = [
        0,
        3,
        5,
        20,
        stream.len() / 3,
        stream.len() / 2,
        stream.len() - 1,
    ];
    for cut in cuts {
        assert_refused(
            &store,
            &stream[..cut],
            Some(&first),
            &format!("cut at {cut}"),
        );
    }
    let mut trailing = stream.clone();
    trailing.push(0);
    assert_refused(&store, &trailing, Some(&first), "a byte after the end");
    take_streamed(&store, &stream, Some(&first)).expect("the whole stream is taken");
}

#[test]
fn an_unchanged_claim_the_previous_checkpoint_does_not_back_is_corrupt() {
    let Setup { root, store, _dir } = setup();
    write(&root, "trusted.txt", b"old and trusted\n");
    age(&root);
    write(&root, "fresh.txt", b"written just now\n");
    let (first, _) = store.take(&root, None).expect("an earlier checkpoint");
    assert_eq!(
        first.known().files.keys().collect::<Vec<_>>(),
        ["trusted.txt"]
    );

    // The producer is told the fresh file is known: it claims it unchanged.
    let stamp = |path: &str| {
        let entry = first.entry(path).expect("taken");
        let metadata = std::fs::metadata(root.join(path)).expect("stats");
        KnownFile {
            size: entry.size,
            mtime_ns: entry.mtime_ns,
            ino: std::os::unix::fs::MetadataExt::ino(&metadata),
            dev: std::os::unix::fs::MetadataExt::dev(&metadata),
        }
    };
    let mut lying = first.known();
    lying
        .files
        .insert("fresh.txt".to_owned(), stamp("fresh.txt"));
    let mut stream = Vec::new();
    produce(&root, &lying, &mut stream).expect("produces");
    assert_refused(
        &store,
        &stream,
        Some(&first),
        "an untrusted file claimed unchanged",
    );

    // A claim of a file with another stamp, and any claim without a previous checkpoint.
    let forged = Frames::default()
        .header()
        .json(
            b'u',
            serde_json::json!({"path": "trusted.txt", "mode": 0o644, "size": 17,
                "mtime_ns": stamp("trusted.txt").mtime_ns, "ino": stamp("trusted.txt").ino,
                "dev": stamp("trusted.txt").dev}),
        )
        .end();
    assert_refused(&store, &forged.0, Some(&first), "another size");
    let honest = changes_of(&root, Some(&first));
    assert_refused(
        &store,
        &honest,
        None,
        "unchanged with no previous checkpoint",
    );
    take_streamed(&store, &honest, Some(&first)).expect("the honest stream is taken");
}

#[test]
fn unsafe_paths_oversized_frames_and_garbage_are_refused() {
    let Setup { store, _dir, .. } = setup();
    for path in ["../x", "/etc/passwd", ".", "a/../../x", "a//b", ""] {
        let stream = Frames::default().header().file(path, b"x").end();
        match take_streamed(&store, &stream.0, None) {
            Err(Error::Unsafe { path: got, .. }) => assert_eq!(got, path),
            other => panic!("{path:?}: expected unsafe, got {other:?}"),
        }
        let stream = Frames::default().header().dir(path).end();
        assert_refused(&store, &stream.0, None, path);
    }
    let no_parent = Frames::default().header().file("d/x", b"x").end();
    assert_refused(&store, &no_parent.0, None, "a file in no directory");
    let twice = Frames::default()
        .header()
        .file("x", b"1")
        .file("x", b"2")
        .end();
    assert_refused(&store, &twice.0, None, "a path twice");

    let oversized = |tag: u8| {
        let mut stream = Frames::default().header().file("x", b"").0;
        stream.push(tag);
        stream.extend_from_slice(&u32::MAX.to_be_bytes());
        stream
    };
    for tag in [b'c', b'd', b'f', b'E', b'r'] {
        assert_refused(
            &store,
            &oversized(tag),
            None,
            &format!("a {} frame of 4 GiB", char::from(tag)),
        );
    }
    let bad_json = Frames::default().header().raw(b'd', b"{not json").end();
    assert_refused(&store, &bad_json.0, None, "a record that is not JSON");
    let unknown_tag = Frames::default().header().raw(b'Z', b"").end();
    assert_refused(&store, &unknown_tag.0, None, "an unknown tag");
    let no_header = Frames::default().dir("d").end();
    assert_refused(&store, &no_header.0, None, "no header");
    let wrong_version = Frames::default()
        .json(b'H', serde_json::json!({"v": 2, "started_ns": 0}))
        .end();
    assert_refused(&store, &wrong_version.0, None, "another version");
    let stray_content = Frames::default().header().raw(b'c', b"x").end();
    assert_refused(&store, &stray_content.0, None, "content outside a file");
    for seed in 0..50 {
        let garbage = noise(seed, 1 + (seed as usize * 997) % 10_000);
        assert_refused(&store, &garbage, None, &format!("garbage {seed}"));
        let mut after_header = Frames::default().header().0;
        after_header.extend_from_slice(&garbage);
        assert_refused(
            &store,
            &after_header,
            None,
            &format!("garbage {seed} after the header"),
        );
    }
    assert!(stored(&store).is_empty());
}
