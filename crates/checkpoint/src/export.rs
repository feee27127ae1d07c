//! A checkpoint as a zstd-compressed tar stream (`.tar.zst`, the form of a whole-tar
//! snapshot): a session's files as of a checkpoint, made on demand
//! (`GET …/checkpoints/{cid}/export`) rather than kept. Entries in the manifest's order
//! (parents first): directories, links as written, files with their modes and mtimes, each
//! file's chunks fetched and verified one at a time as the stream is written, so memory stays
//! at one chunk whatever the tree's size. A chunk that is broken or gone fails the export with
//! its error, mid-stream: the stream is then cut, never a shorter archive that ends cleanly.

use std::io::{Read, Write};

use crate::Error;
use crate::chunk::ChunkRef;
use crate::chunks::Chunks;
use crate::manifest::{Content, Manifest};

/// Writes `manifest`'s tree to `out` as a zstd-compressed tar archive.
pub(crate) fn export(
    chunks: &Chunks,
    manifest: &Manifest,
    out: &mut dyn Write,
) -> Result<(), Error> {
    let encoder = zstd::stream::write::Encoder::new(out, 3)
        .map_err(|e| Error::io("cannot start the export".to_owned(), e))?;
    let mut builder = tar::Builder::new(encoder);
    for entry in &manifest.entries {
        let mut header = tar::Header::new_gnu();
        header.set_mode(entry.mode & 0o7777);
        header.set_mtime(u64::try_from(entry.mtime_ns.div_euclid(1_000_000_000)).unwrap_or(0));
        let written = match &entry.content {
            Content::Dir => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                builder.append_data(&mut header, &entry.path, std::io::empty())
            }
            Content::Symlink(target) => {
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_size(0);
                builder.append_link(&mut header, &entry.path, target)
            }
            Content::File(refs) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(entry.size);
                let mut reader = FileReader {
                    chunks,
                    refs,
                    path: &entry.path,
                    next: 0,
                    buffer: Vec::new(),
                    at: 0,
                    failed: None,
                };
                let appended = builder.append_data(&mut header, &entry.path, &mut reader);
                if let Some(error) = reader.failed {
                    return Err(error);
                }
                appended
            }
        };
        written.map_err(|e| Error::io(format!("cannot export {:?}", entry.path), e))?;
    }
    builder
        .into_inner()
        .and_then(|encoder| encoder.finish())
        .and_then(|out| out.flush())
        .map_err(|e| Error::io("cannot end the export".to_owned(), e))
}

/// A file's content, read chunk by chunk, each verified against its hash when fetched.
struct FileReader<'a> {
    chunks: &'a Chunks,
    refs: &'a [ChunkRef],
    path: &'a str,
    next: usize,
    buffer: Vec<u8>,
    at: usize,
    /// The error that ended the read (the tar writer only sees an I/O error).
    failed: Option<Error>,
}

impl Read for FileReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.buffer.len() {
            let Some(chunk) = self.refs.get(self.next) else {
                return Ok(0);
            };
            self.next += 1;
            match self.chunks.fetch(&chunk.id, self.path) {
                Ok(content) => {
                    self.buffer = content;
                    self.at = 0;
                }
                Err(error) => {
                    let message = error.to_string();
                    self.failed = Some(error);
                    return Err(std::io::Error::other(message));
                }
            }
        }
        let n = out.len().min(self.buffer.len() - self.at);
        out[..n].copy_from_slice(&self.buffer[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}
