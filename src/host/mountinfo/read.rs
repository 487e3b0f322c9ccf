//! Reading a mount table: the file whole or in pieces, and a table built
//! line by line as the pieces arrive (also on a second thread).

use std::fs::File;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::parse::parse_line;
use super::{LineError, MAX_MOUNTINFO_BYTES, MountInfo, MountTable};
use crate::host::HostError;

/// Reads `path` to end-of-file and hands it to `piece` in pieces of about
/// [`OVERLAP_CHUNK`] bytes, until `piece` returns false; a file over
/// [`MAX_MOUNTINFO_BYTES`] is an error.
pub(crate) fn read_pieces(
    path: &Path,
    piece: &mut dyn FnMut(Vec<u8>) -> bool,
) -> Result<(), HostError> {
    let err = |source| HostError::ReadMountInfo {
        path: path.to_owned(),
        source,
    };
    let mut file = File::open(path).map_err(err)?;
    let mut total = 0;
    loop {
        let mut buf = Vec::with_capacity(OVERLAP_CHUNK);
        let n = (&mut file)
            .take(OVERLAP_CHUNK as u64)
            .read_to_end(&mut buf)
            .map_err(err)?;
        if n == 0 {
            return Ok(());
        }
        total += n;
        if total > MAX_MOUNTINFO_BYTES {
            return Err(HostError::MountInfoTooLarge {
                path: path.to_owned(),
                limit: MAX_MOUNTINFO_BYTES,
            });
        }
        if !piece(buf) {
            return Ok(());
        }
    }
}

/// Reads a whole mountinfo file to end-of-file into one buffer (see the
/// module docs for why that takes several `read()` calls for large tables).
pub fn read_mountinfo(path: &Path) -> Result<Vec<u8>, HostError> {
    let err = |source| HostError::ReadMountInfo {
        path: path.to_owned(),
        source,
    };
    let mut file = File::open(path).map_err(err)?;
    let mut buf = Vec::with_capacity(256 << 10);
    (&mut file)
        .take(MAX_MOUNTINFO_BYTES as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(err)?;
    if buf.len() > MAX_MOUNTINFO_BYTES {
        return Err(HostError::MountInfoTooLarge {
            path: path.to_owned(),
            limit: MAX_MOUNTINFO_BYTES,
        });
    }
    Ok(buf)
}

/// How much of the table [`MountTable::read_overlapped`]'s reader gathers
/// (in reads of at most a page: see the module docs) before handing it on.
const OVERLAP_CHUNK: usize = 64 << 10;

/// A table parsed line by line as its bytes arrive in pieces cut anywhere
/// ([`MountTable::parse`] is one piece; [`MountTable::read_overlapped`]
/// feeds the pieces of a read in progress).
#[derive(Debug, Default)]
pub(super) struct TableBuilder {
    entries: Vec<MountInfo>,
    errors: Vec<LineError>,
    warnings: Vec<LineError>,
    /// lines parsed so far
    lines: usize,
    /// the start of a line cut at the end of the last piece
    partial: Vec<u8>,
    /// bytes fed so far
    bytes: usize,
}

impl TableBuilder {
    fn line(&mut self, line: &[u8]) {
        self.lines += 1;
        let line_no = self.lines;
        let warnings = &mut self.warnings;
        match parse_line(line, &mut |kind| {
            warnings.push(LineError {
                line: line_no,
                kind,
            })
        }) {
            Ok(entry) => self.entries.push(entry),
            Err(kind) => self.errors.push(LineError {
                line: line_no,
                kind,
            }),
        }
    }

    /// Parses every line `piece` completes; a line cut at its end waits.
    pub(super) fn feed(&mut self, piece: &[u8]) {
        self.bytes += piece.len();
        let Some(last) = piece.iter().rposition(|&b| b == b'\n') else {
            self.partial.extend_from_slice(piece);
            return;
        };
        let (complete, rest) = (&piece[..last], &piece[last + 1..]);
        let mut lines = complete.split(|&b| b == b'\n');
        if !self.partial.is_empty() {
            let mut first = std::mem::take(&mut self.partial);
            first.extend_from_slice(lines.next().unwrap_or_default());
            self.line(&first);
        }
        for line in lines {
            self.line(line);
        }
        self.partial.extend_from_slice(rest);
    }

    pub(super) fn finish(mut self) -> MountTable {
        if !self.partial.is_empty() {
            let last = std::mem::take(&mut self.partial);
            self.line(&last);
        } else if self.bytes == 1 && self.lines == 1 {
            // a lone newline is an empty table, as an empty file is
            self.errors.clear();
            self.lines = 0;
        }
        MountTable::from_parts(self.entries, self.errors, self.warnings)
    }
}

impl MountTable {
    /// Parses a whole mountinfo file. Never fails: bad lines are collected
    /// in [`MountTable::errors`].
    pub fn parse(input: &[u8]) -> Self {
        let mut b = TableBuilder {
            entries: Vec::with_capacity(input.len() / 110 + 1),
            ..TableBuilder::default()
        };
        b.feed(input);
        b.finish()
    }

    /// Parses what `read` hands over (a mountinfo read in pieces, e.g.
    /// [`Sys::read_mountinfo_pieces`](crate::host::sys::Sys::read_mountinfo_pieces)),
    /// and runs `meanwhile` during the read: `read` runs on a thread of its
    /// own, and this thread parses its lines as they arrive once
    /// `meanwhile` is done. The kernel formatting the table is most of a
    /// read's time (one page per `read()`), so the parse, and whatever
    /// `meanwhile` does, costs little more than the read alone when a
    /// second core is free. Without a thread to be had, reads first.
    pub fn read_overlapped<T, E: Send>(
        read: impl FnOnce(&mut dyn FnMut(Vec<u8>) -> bool) -> Result<(), E> + Send,
        meanwhile: impl FnOnce() -> T,
    ) -> (Result<Self, E>, T) {
        // the reader, taken by the thread or, without one, by this thread
        let slot = std::sync::Mutex::new(Some(read));
        let take = || slot.lock().ok().and_then(|mut r| r.take());
        std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::channel::<Result<Vec<u8>, E>>();
            let spawned = std::thread::Builder::new()
                .name("volumed-mountinfo".into())
                .spawn_scoped(scope, {
                    let tx = tx.clone();
                    move || {
                        if let Some(read) = take()
                            && let Err(e) = read(&mut |piece| tx.send(Ok(piece)).is_ok())
                        {
                            let _ = tx.send(Err(e));
                        }
                    }
                });
            let done = meanwhile();
            let mut b = TableBuilder {
                entries: Vec::with_capacity(16 << 10),
                ..TableBuilder::default()
            };
            if spawned.is_err()
                && let Some(read) = take()
            {
                drop(tx);
                return match read(&mut |piece| {
                    b.feed(&piece);
                    true
                }) {
                    Ok(()) => (Ok(b.finish()), done),
                    Err(e) => (Err(e), done),
                };
            }
            drop(tx);
            for piece in rx {
                match piece {
                    Ok(bytes) => b.feed(&bytes),
                    Err(e) => return (Err(e), done),
                }
            }
            (Ok(b.finish()), done)
        })
    }

    /// A table from parsed lines, indexed by path.
    fn from_parts(
        entries: Vec<MountInfo>,
        errors: Vec<LineError>,
        warnings: Vec<LineError>,
    ) -> Self {
        let mut by_path: Vec<usize> = (0..entries.len()).collect();
        by_path.sort_by(|&a, &b| {
            let (pa, pb) = (&entries[a].mount_point, &entries[b].mount_point);
            pa.as_os_str()
                .as_bytes()
                .cmp(pb.as_os_str().as_bytes())
                .then(a.cmp(&b))
        });
        Self {
            entries,
            by_path,
            errors,
            warnings,
        }
    }

    /// Reads and parses a mountinfo file (`/proc/<pid>/mountinfo` or a capture).
    pub fn read(path: &Path) -> Result<Self, HostError> {
        Ok(Self::parse(&read_mountinfo(path)?))
    }

    /// Reads `/proc/self/mountinfo`.
    pub fn read_self() -> Result<Self, HostError> {
        Self::read(Path::new("/proc/self/mountinfo"))
    }
}
