//! The acknowledged-through watermark, kept beside sled.
//!
//! sled 0.34.7 does not report a damaged log: on recovery it keeps the
//! prefix before the first bad message and silently drops the rest
//! (measured: 16 bytes flipped at offset 1,000 of a 180 KB `db` file leave 2
//! of 200 records, and `open` says `Ok`). To notice that, the journal writes
//! the highest acknowledged sequence number to `<dir>/acked` after every group
//! flush. On open, if sled returns less than that within the same boot, the
//! journal is corrupt. After a reboot a shortfall is what power loss does to
//! the unflushed device cache: every mount is gone too, so it is reported and
//! not treated as corruption.
//!
//! The file is rewritten in place with one `pwrite` (never fsynced: it guards
//! against the death of the process, which a write into the page cache
//! survives, like sled's own `sync_file_range`).
//!
//! Layout (68 bytes): magic `VMDW`, u16 LE version 1, u16 reserved, u64 LE
//! journal id, u64 LE acked seq, 40 bytes boot id (NUL padded), u32 LE CRC-32C
//! of the preceding bytes.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 4] = b"VMDW";
const LEN: usize = 68;

/// What the watermark file said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Acked {
    /// the journal it belongs to
    pub journal_id: u64,
    /// highest acknowledged sequence number
    pub seq: u64,
    /// boot id when it was written
    pub boot_id: String,
}

/// The open watermark file.
#[derive(Debug)]
pub(crate) struct Watermark {
    file: File,
    path: PathBuf,
}

impl Watermark {
    /// Opens or creates `<dir>/acked`.
    pub(crate) fn open(dir: &Path) -> io::Result<Self> {
        let path = dir.join("acked");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        Ok(Self { file, path })
    }

    /// The file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the file: `Ok(None)` when empty or unreadable as a watermark
    /// (a damaged watermark only loses the check, never the journal).
    pub(crate) fn read(&self) -> io::Result<Option<Acked>> {
        let mut buf = [0u8; LEN];
        let n = self.file.read_at(&mut buf, 0)?;
        Ok(if n == LEN { decode(&buf) } else { None })
    }

    /// Records that everything through `seq` is acknowledged.
    pub(crate) fn write(&self, acked: &Acked) -> io::Result<()> {
        self.file.write_all_at(&encode(acked), 0)
    }
}

fn encode(a: &Acked) -> [u8; LEN] {
    let mut buf = [0u8; LEN];
    buf[0..4].copy_from_slice(MAGIC);
    buf[4..6].copy_from_slice(&1u16.to_le_bytes());
    buf[8..16].copy_from_slice(&a.journal_id.to_le_bytes());
    buf[16..24].copy_from_slice(&a.seq.to_le_bytes());
    let boot = a.boot_id.as_bytes();
    let n = boot.len().min(40);
    buf[24..24 + n].copy_from_slice(&boot[..n]);
    let crc = crc32c::crc32c(&buf[..64]);
    buf[64..68].copy_from_slice(&crc.to_le_bytes());
    buf
}

fn decode(buf: &[u8; LEN]) -> Option<Acked> {
    let crc = u32::from_le_bytes([buf[64], buf[65], buf[66], buf[67]]);
    if &buf[0..4] != MAGIC || crc != crc32c::crc32c(&buf[..64]) {
        return None;
    }
    let u64_at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&buf[i..i + 8]);
        u64::from_le_bytes(b)
    };
    let boot = &buf[24..64];
    let end = boot.iter().position(|&b| b == 0).unwrap_or(40);
    Some(Acked {
        journal_id: u64_at(8),
        seq: u64_at(16),
        boot_id: String::from_utf8_lossy(&boot[..end]).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_then_read_and_damage_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let w = Watermark::open(dir.path()).unwrap();
        assert_eq!(w.read().unwrap(), None);
        let a = Acked {
            journal_id: 9,
            seq: 1234,
            boot_id: "140d4c7e-2852-40f1-9e85-e3366b0ced06".into(),
        };
        w.write(&a).unwrap();
        assert_eq!(w.read().unwrap(), Some(a));
        w.file.write_all_at(b"x", 20).unwrap();
        assert_eq!(w.read().unwrap(), None);
    }
}
