//! Reading a checkpoint without restoring it: a file's bytes (only the chunks a range needs,
//! each verified), a directory's listing, and what changed between two checkpoints with a
//! unified diff for each text file up to 1 MiB. Links are listed, never followed.

use std::io::Write;
use std::ops::Range;
use std::time::Duration;

use crate::Error;
use crate::chunks::Chunks;
use crate::manifest::{Content, Entry, Manifest};
use crate::path;

/// Text files up to this size on both sides get a unified diff.
const MAX_DIFF_BYTES: u64 = 1024 * 1024;
/// The most file content one diff reads for its text diffs; past it, files are still listed.
const MAX_DIFF_TOTAL_BYTES: u64 = 64 * 1024 * 1024;
/// How much of a large file decides whether it is binary.
const SNIFF_BYTES: u64 = 8 * 1024;
/// The time one file's diff may take before `similar` settles for a coarser one.
const DIFF_TIMEOUT: Duration = Duration::from_millis(500);

/// What changed from one checkpoint to another, each list sorted by path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diff {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub modified: Vec<Modified>,
}

/// A path in both checkpoints whose content, link target, mode or kind differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Modified {
    pub path: String,
    pub old_size: u64,
    pub new_size: u64,
    /// Either side is not UTF-8 text (or holds a NUL).
    pub binary: bool,
    /// A unified diff, for text files of at most 1 MiB on both sides.
    pub diff: Option<String>,
}

/// The file entry at `path`, or why there is none.
fn file_at<'a>(manifest: &'a Manifest, path: &str) -> Result<&'a Entry, Error> {
    let entry = manifest
        .entry(path)
        .ok_or_else(|| Error::NoEntry(path.to_owned()))?;
    match entry.content {
        Content::File(_) => Ok(entry),
        _ => Err(Error::WrongKind {
            path: path.to_owned(),
            expected: "regular file",
        }),
    }
}

/// Writes the bytes `range` of the file at `path` to `out`, fetching only the chunks it
/// overlaps; returns the bytes written.
pub(crate) fn read_file(
    chunks: &Chunks,
    manifest: &Manifest,
    path: &str,
    range: Range<u64>,
    out: &mut dyn Write,
) -> Result<u64, Error> {
    let entry = file_at(manifest, path)?;
    if range.start > range.end || range.end > entry.size {
        return Err(Error::Invalid(format!(
            "the range {}..{} is not within the {} bytes of {path:?}",
            range.start, range.end, entry.size
        )));
    }
    let Content::File(file_chunks) = &entry.content else {
        return Ok(0);
    };
    let mut offset = 0u64;
    let mut written = 0u64;
    for chunk in file_chunks {
        let end = offset + u64::from(chunk.len);
        if end > range.start && offset < range.end {
            let content = chunks.fetch(&chunk.id, path)?;
            let from = (range.start.max(offset) - offset) as usize;
            let to = (range.end.min(end) - offset) as usize;
            out.write_all(&content[from..to])
                .map_err(|e| Error::io(format!("cannot write the content of {path:?}"), e))?;
            written += (to - from) as u64;
        }
        if end >= range.end {
            break;
        }
        offset = end;
    }
    Ok(written)
}

/// The entries beneath `dir` (`""` for the root) at most `depth` levels down (1: its
/// children), in path order.
pub(crate) fn list<'a>(
    manifest: &'a Manifest,
    dir: &str,
    depth: usize,
) -> Result<Vec<&'a Entry>, Error> {
    if !dir.is_empty() {
        if let Some(reason) = path::refusal(dir) {
            return Err(Error::Invalid(format!("the path {dir:?}: {reason}")));
        }
        let entry = manifest
            .entry(dir)
            .ok_or_else(|| Error::NoEntry(dir.to_owned()))?;
        if entry.content != Content::Dir {
            return Err(Error::WrongKind {
                path: dir.to_owned(),
                expected: "directory",
            });
        }
    }
    let prefix = if dir.is_empty() {
        String::new()
    } else {
        format!("{dir}/")
    };
    // Paths sharing a prefix are contiguous in bytewise order.
    let start = manifest
        .entries
        .partition_point(|e| e.path.as_str() < prefix.as_str());
    Ok(manifest.entries[start..]
        .iter()
        .take_while(|e| e.path.starts_with(&prefix))
        .filter(|e| e.path[prefix.len()..].split('/').count() <= depth.max(1))
        .collect())
}

/// What changed from `old` to `new`.
pub(crate) fn diff(chunks: &Chunks, old: &Manifest, new: &Manifest) -> Result<Diff, Error> {
    let mut result = Diff::default();
    let mut budget = MAX_DIFF_TOTAL_BYTES;
    let (mut a, mut b) = (old.entries.iter().peekable(), new.entries.iter().peekable());
    loop {
        let order = match (a.peek(), b.peek()) {
            (None, None) => return Ok(result),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some(x), Some(y)) => x.path.cmp(&y.path),
        };
        match order {
            std::cmp::Ordering::Less => {
                if let Some(x) = a.next() {
                    result.removed.push(x.path.clone());
                }
            }
            std::cmp::Ordering::Greater => {
                if let Some(y) = b.next() {
                    result.added.push(y.path.clone());
                }
            }
            std::cmp::Ordering::Equal => {
                let (Some(x), Some(y)) = (a.next(), b.next()) else {
                    return Ok(result);
                };
                let both_dirs = x.content == Content::Dir && y.content == Content::Dir;
                if !both_dirs && (x.content != y.content || x.mode != y.mode) {
                    result
                        .modified
                        .push(modified(chunks, old, new, x, y, &mut budget)?);
                }
            }
        }
    }
}

fn modified(
    chunks: &Chunks,
    old: &Manifest,
    new: &Manifest,
    x: &Entry,
    y: &Entry,
    budget: &mut u64,
) -> Result<Modified, Error> {
    let mut change = Modified {
        path: y.path.clone(),
        old_size: x.size,
        new_size: y.size,
        binary: false,
        diff: None,
    };
    let (Content::File(_), Content::File(_)) = (&x.content, &y.content) else {
        return Ok(change);
    };
    let small = x.size <= MAX_DIFF_BYTES && y.size <= MAX_DIFF_BYTES;
    if small && x.size + y.size <= *budget {
        *budget -= x.size + y.size;
        let before = whole(chunks, old, &x.path, x.size)?;
        let after = whole(chunks, new, &y.path, y.size)?;
        match (text(&before, true), text(&after, true)) {
            (Some(before), Some(after)) => {
                let lines = similar::TextDiff::configure()
                    .timeout(DIFF_TIMEOUT)
                    .diff_lines(before, after);
                let unified = lines
                    .unified_diff()
                    .context_radius(3)
                    .header(&format!("a/{}", x.path), &format!("b/{}", y.path))
                    .to_string();
                change.diff = Some(unified);
            }
            _ => change.binary = true,
        }
        return Ok(change);
    }
    let head = |manifest: &Manifest, entry: &Entry| -> Result<bool, Error> {
        let n = entry.size.min(SNIFF_BYTES);
        Ok(text(&whole(chunks, manifest, &entry.path, n)?, n == entry.size).is_none())
    };
    change.binary = head(old, x)? || head(new, y)?;
    Ok(change)
}

/// The first `n` bytes of the file at `path`.
fn whole(chunks: &Chunks, manifest: &Manifest, path: &str, n: u64) -> Result<Vec<u8>, Error> {
    let mut bytes = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
    read_file(chunks, manifest, path, 0..n, &mut bytes)?;
    Ok(bytes)
}

/// `bytes` as text: UTF-8 without NUL. When `complete` is false they are a file's head, which
/// may end inside a character.
fn text(bytes: &[u8], complete: bool) -> Option<&str> {
    if bytes.contains(&0) {
        return None;
    }
    match std::str::from_utf8(bytes) {
        Ok(text) => Some(text),
        Err(e) if !complete && e.error_len().is_none() => {
            std::str::from_utf8(&bytes[..e.valid_up_to()]).ok()
        }
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_utf8_without_nul_and_a_head_may_end_mid_character() {
        let cut = "é".as_bytes();
        let table: [(&[u8], bool, bool); 6] = [
            (b"hello\n", true, true),
            (b"", true, true),
            (b"a\0b", true, false),
            (&[0xff, 0xfe], true, false),
            (&cut[..1], false, true),
            (&cut[..1], true, false),
        ];
        for (bytes, complete, is_text) in table {
            assert_eq!(
                text(bytes, complete).is_some(),
                is_text,
                "{bytes:?} {complete}"
            );
        }
    }
}
