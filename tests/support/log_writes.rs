//! A reader of the log that the kernel's `dm-log-writes` target writes,
//! and a replayer that rebuilds the logged device as of any entry — the
//! host half of `tests/power_loss.rs`, which has no device-mapper.
//!
//! The format (the kernel's `Documentation/admin-guide/device-mapper/
//! log-writes.rst` and `drivers/md/dm-log-writes.c`), all little endian:
//! block 0 of the log device is the super block (`magic` u64, `version`
//! u64, `nr_entries` u64, `sectorsize` u32, where `sectorsize` is the logged
//! device's logical block size). The entries follow from byte `sectorsize`
//! on, each one block holding `sector` u64, `nr_sectors` u64, `flags` u64,
//! `data_len` u64 (sectors in `sectorsize` units), then — unless it is a
//! discard or a mark — `nr_sectors` blocks of the data written. A mark keeps
//! its name in its own block after the header (`data_len` bytes).
//!
//! The kernel logs a write only once it has completed, and a flush only
//! after every write that completed before it, so the log is the order in
//! which data reached the disk's cache; what is durable at a crash is
//! everything before the last FLUSH (or a FUA write itself).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The super block's magic.
const MAGIC: u64 = 0x006a_7366_7773_6872;
/// The only version there is.
const VERSION: u64 = 1;
/// `flags`: a cache flush (everything logged before it is durable).
pub const FLUSH: u64 = 1;
/// `flags`: a write that bypassed the cache (durable itself).
pub const FUA: u64 = 1 << 1;
/// `flags`: a discard (no data in the log).
pub const DISCARD: u64 = 1 << 2;
/// `flags`: a mark made with `dmsetup message <dev> 0 mark <name>`.
pub const MARK: u64 = 1 << 3;
/// The mark the kernel logs when the target is removed.
pub const END_MARK: &str = "dm-log-writes-end";

/// One logged entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// first block written (in `sectorsize` units)
    pub sector: u64,
    /// blocks written or discarded
    pub nr_sectors: u64,
    /// [`FLUSH`], [`FUA`], [`DISCARD`], [`MARK`] (and the kernel's
    /// metadata bit, ignored)
    pub flags: u64,
    /// the name of a mark
    pub mark: Option<String>,
    /// where its data starts in the log, in bytes
    data_at: u64,
}

impl Entry {
    /// Whether replaying it changes the device.
    pub fn changes_data(&self) -> bool {
        self.flags & MARK == 0 && self.nr_sectors > 0
    }

    /// Whether everything up to and including it is durable.
    pub fn durable_point(&self) -> bool {
        self.flags & (FLUSH | FUA) != 0
    }
}

/// A parsed log: its entries, read lazily from the file for their data.
pub struct Log {
    file: File,
    /// the logged device's logical block size
    pub sectorsize: u64,
    /// the entries, in log order
    pub entries: Vec<Entry>,
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

fn invalid(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

impl Log {
    /// Reads the super block and every entry header of the log in `path`.
    pub fn open(path: &Path) -> io::Result<Log> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        let mut sb = [0u8; 32];
        file.read_exact_at(&mut sb, 0)?;
        let (magic, version) = (u64_at(&sb, 0), u64_at(&sb, 8));
        if magic != MAGIC || version != VERSION {
            return Err(invalid(format!(
                "not a dm-log-writes log: magic {magic:#x}, version {version}"
            )));
        }
        let nr_entries = u64_at(&sb, 16);
        let sectorsize = u64::from(u32::from_le_bytes([sb[24], sb[25], sb[26], sb[27]]));
        if !(512..=65536).contains(&sectorsize) || !sectorsize.is_power_of_two() {
            return Err(invalid(format!("sector size {sectorsize}")));
        }
        let bs = usize::try_from(sectorsize).map_err(|e| invalid(e.to_string()))?;
        let mut entries = Vec::new();
        let mut at = sectorsize;
        let mut head = vec![0u8; bs];
        for i in 0..nr_entries {
            if at + sectorsize > len {
                return Err(invalid(format!(
                    "entry {i} of {nr_entries} starts at byte {at}, past the log's end {len}"
                )));
            }
            file.read_exact_at(&mut head, at)?;
            let (sector, nr_sectors, flags, data_len) = (
                u64_at(&head, 0),
                u64_at(&head, 8),
                u64_at(&head, 16),
                u64_at(&head, 24),
            );
            let mark = (flags & MARK != 0).then(|| {
                let n = usize::try_from(data_len).unwrap_or(usize::MAX).min(bs - 32);
                String::from_utf8_lossy(&head[32..32 + n]).into_owned()
            });
            let data_at = at + sectorsize;
            at = data_at;
            if flags & (DISCARD | MARK) == 0 {
                at += nr_sectors * sectorsize;
            }
            if at > len {
                return Err(invalid(format!(
                    "entry {i}'s data ends at byte {at}, past the log's end {len}"
                )));
            }
            entries.push(Entry {
                sector,
                nr_sectors,
                flags,
                mark,
                data_at,
            });
        }
        Ok(Log {
            file,
            sectorsize,
            entries,
        })
    }

    /// The index of the mark `name`, the first if there are several.
    pub fn mark(&self, name: &str) -> Option<usize> {
        self.entries
            .iter()
            .position(|e| e.mark.as_deref() == Some(name))
    }
}

/// The logged device rebuilt entry by entry, from zeros (the device was
/// blank when the log started).
pub struct Replay<'a> {
    log: &'a Log,
    image: Vec<u8>,
    /// entries applied so far: `0..applied`
    applied: usize,
}

impl<'a> Replay<'a> {
    /// A blank device of `size` bytes, nothing applied yet.
    pub fn new(log: &'a Log, size: usize) -> Replay<'a> {
        Replay {
            log,
            image: vec![0; size],
            applied: 0,
        }
    }

    /// Applies the entries up to and including `last` (entries are applied
    /// once, in order: `last` only grows).
    pub fn apply_through(&mut self, last: usize) -> io::Result<()> {
        assert!(
            last + 1 >= self.applied,
            "replay only goes forward: at {}, asked for {last}",
            self.applied
        );
        while self.applied <= last {
            self.apply_entry(self.applied)?;
            self.applied += 1;
        }
        Ok(())
    }

    /// A copy of the device as replayed so far, for a state where only
    /// some of the later writes reached the disk ([`Replay::apply_one`]).
    pub fn fork(&self) -> Replay<'a> {
        Replay {
            log: self.log,
            image: self.image.clone(),
            applied: self.applied,
        }
    }

    /// Applies entry `i` alone, whatever was applied before: between two
    /// flushes a disk's cache may write back any subset of what it holds.
    pub fn apply_one(&mut self, i: usize) -> io::Result<()> {
        self.apply_entry(i)
    }

    fn apply_entry(&mut self, i: usize) -> io::Result<()> {
        let e = &self.log.entries[i];
        if !e.changes_data() {
            return Ok(());
        }
        let ss = self.log.sectorsize;
        let (from, n) = (e.sector * ss, e.nr_sectors * ss);
        let range = usize::try_from(from).map_err(|x| invalid(x.to_string()))?
            ..usize::try_from(from + n).map_err(|x| invalid(x.to_string()))?;
        let size = self.image.len();
        let Some(dst) = self.image.get_mut(range) else {
            return Err(invalid(format!(
                "entry {i} writes bytes {from}+{n}, past the device's {size} bytes"
            )));
        };
        if e.flags & DISCARD != 0 {
            // What a discarded range reads is up to the device: zeros are
            // one thing it may return.
            dst.fill(0);
        } else {
            self.log.file.read_exact_at(dst, e.data_at)?;
        }
        Ok(())
    }

    /// Writes the device as replayed so far to `path`, sparse (the zero
    /// 64 KiB chunks are holes).
    pub fn write_image(&self, path: &Path) -> io::Result<()> {
        let f = File::create(path)?;
        f.set_len(self.image.len() as u64)?;
        let mut at = 0u64;
        for chunk in self.image.chunks(64 << 10) {
            if chunk.iter().any(|&b| b != 0) {
                f.write_all_at(chunk, at)?;
            }
            at += chunk.len() as u64;
        }
        Ok(())
    }
}
