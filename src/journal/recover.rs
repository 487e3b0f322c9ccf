//! sled's handles as one replaceable [`Store`], and the way back from a
//! failed write ([`Journal::recover`]).
//!
//! A full disk, a filesystem remounted read-only or a failing device make
//! a sled insert or flush, the `fdatasync` after it or the watermark write
//! fail. sled 0.34 keeps such an error for good (every later call returns
//! it), and the page cache may hold log pages the disk never took. So a
//! recovery does not flush again: it drops the old handles and the log's
//! cached pages, reopens sled on what the disk holds (sled's own recovery
//! cuts a torn tail), and writes every record not yet durable again from
//! the journal's memory, in order, under their own sequence numbers; then
//! one flush, an `fdatasync` on a fresh descriptor and the watermark.
//! Nothing is acknowledged that was not written after the reopen.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use super::contain::Failed;
use super::error::errno_name;
use super::held::open_sled;
use super::{Journal, JournalError};

/// How long a reopen waits for sled's lock: the old handles' background
/// thread lets go of it just after they are dropped.
const REOPEN_LOCK_WAIT: Duration = Duration::from_secs(2);

/// sled's database, its `records` tree and its log file.
pub(super) struct Store {
    pub(super) db: sled::Db,
    pub(super) records: sled::Tree,
    /// sled's log file (`<dir>/db`), made durable after each sled flush
    log_file: std::fs::File,
}

impl Store {
    /// The store over an open database: the journal dir synced once (so
    /// the files sled and the watermark created survive a power cut too)
    /// and the log file opened to `fdatasync` it after each flush.
    pub(super) fn new(dir: &Path, db: sled::Db, records: sled::Tree) -> Result<Self, JournalError> {
        let durable = |path: PathBuf| move |cause| JournalError::Durable { path, cause };
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(durable(dir.to_path_buf()))?;
        let log = dir.join("db");
        let log_file = std::fs::File::open(&log).map_err(durable(log))?;
        Ok(Self {
            db,
            records,
            log_file,
        })
    }

    /// Inserts sealed records (one insert, or one batch: all or none).
    pub(super) fn insert(&self, sealed: &[(u64, sled::IVec)]) -> Result<(), sled::Error> {
        match sealed {
            [] => Ok(()),
            [(seq, v)] => self.records.insert(seq.to_be_bytes(), v.clone()).map(drop),
            many => {
                let mut batch = sled::Batch::default();
                for (seq, v) in many {
                    batch.insert(&seq.to_be_bytes(), v.clone());
                }
                self.records.apply_batch(batch)
            }
        }
    }

    /// sled's flush, then an `fdatasync` of its log: sled's flush is
    /// `sync_file_range`, which leaves the disk's cache and the log file's
    /// new size unflushed, and a power cut would then take records already
    /// acknowledged (the power-loss replay in `tests/power_loss.rs` caught
    /// one). The error names the step.
    pub(super) fn sync(&self, dir: &Path) -> Result<(), (String, std::io::Error)> {
        self.db
            .flush()
            .map_err(|e| ("sled flush".to_owned(), into_io(e)))?;
        self.log_file
            .sync_data()
            .map_err(|e| (format!("fdatasync {}", dir.join("db").display()), e))
    }
}

fn into_io(e: sled::Error) -> std::io::Error {
    match e {
        sled::Error::Io(e) => e,
        other => std::io::Error::other(other.to_string()),
    }
}

/// sled 0.34 writes a snapshot to `snap.<lsn>.generating` and renames it
/// once whole, yet its open takes every `snap.*` file but `*.in___motion`
/// as a snapshot: one cut short by a full disk fails the next open as
/// corrupt (found by `tests/disk_faults.rs`: the start after the disk had
/// room again moved sled's conf and snapshot aside). Such a file is never
/// a snapshot sled finished: removed, sled reads the one before it, or
/// replays its log. A removal that fails leaves the old behaviour.
pub(super) fn remove_unfinished_snapshots(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap.") && name.ends_with(".generating") {
            match std::fs::remove_file(e.path()) {
                Ok(()) => {
                    tracing::info!(path = %e.path().display(), "removed a snapshot sled left unfinished")
                }
                Err(err) => {
                    tracing::warn!(path = %e.path().display(), "remove a snapshot sled left unfinished: {err}")
                }
            }
        }
    }
}

/// Failed writes and flushes by errno (`volumed_journal_write_errors_total`).
#[derive(Debug, Default)]
pub(super) struct WriteErrors(Mutex<BTreeMap<String, u64>>);

impl WriteErrors {
    pub(super) fn count(&self, e: &std::io::Error) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry(errno_name(e)).or_default() += 1;
    }

    fn all(&self) -> Vec<(String, u64)> {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }
}

impl Journal {
    /// A sled insert failed (`what`): the journal is unwritable until
    /// [`Journal::recover`]; the record stays in memory.
    pub(super) fn write_failed(&self, what: &str, e: &sled::Error) {
        let reason = format!("{what}: {e}");
        if let sled::Error::Io(io) = e {
            self.write_errors.count(io);
        } else {
            self.write_errors
                .count(&std::io::Error::other(reason.clone()));
        }
        tracing::error!(journal = %self.dir.display(), "journal write failed: {reason}");
        self.commit.fail(reason);
    }

    /// Failed writes and flushes since the open, by errno name (`ENOSPC`;
    /// `other` for an error without one).
    pub fn write_errors(&self) -> Vec<(String, u64)> {
        self.write_errors.all()
    }

    /// After a failed write or flush: reopens sled's files as the disk has
    /// them and writes every record not yet durable again from memory (see
    /// the module doc). `Ok(true)`: the journal is writable again and every
    /// record appended so far is durable; `Ok(false)`: nothing had failed.
    /// An error (the disk is still full, read-only, failing) leaves it
    /// unwritable, with nothing lost from memory: call again later.
    pub fn recover(&self) -> Result<bool, JournalError> {
        // no checkpoint, and no insert, while the files are replaced
        let _one_at_a_time = self
            .checkpoint_lock
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let _no_insert = self.writer();
        let through = self
            .inserted_through
            .load(std::sync::atomic::Ordering::SeqCst);
        let recovered = self.commit.recover(|| self.rewrite(through));
        match recovered {
            Ok(true) => {
                tracing::info!(journal = %self.dir.display(), through, "journal writable again: every record kept in memory is durable");
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(reason) => Err(self.unwritable(reason)),
        }
    }

    /// Replaces the store and writes the records kept in memory through
    /// `through` durably; returns `through`.
    fn rewrite(&self, through: u64) -> Result<u64, String> {
        let mut slot = self.store.write().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = slot.take() {
            forget_cached_pages(&old.log_file);
            drop(old);
        }
        let store = self.reopen()?;
        let pending: Vec<(u64, sled::IVec)> = self
            .unsynced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect();
        let fail = |what: &str, e: std::io::Error| {
            self.write_errors.count(&e);
            format!("{what}: {e}")
        };
        store
            .insert(&pending)
            .map_err(|e| fail("write the records kept in memory", into_io(e)))?;
        store.sync(&self.dir).map_err(|(what, e)| fail(&what, e))?;
        self.write_acked(through)?;
        *slot = Some(store);
        drop(slot);
        self.synced(through);
        Ok(through)
    }

    /// sled reopened on the same journal (its id checked).
    fn reopen(&self) -> Result<Store, String> {
        let db =
            open_sled(&self.dir, self.cache_capacity, REOPEN_LOCK_WAIT, true).map_err(|e| {
                if let Failed::Sled(sled::Error::Io(io)) = &e {
                    self.write_errors.count(io);
                }
                format!("reopen sled's files: {e}")
            })?;
        let id = db
            .open_tree("meta")
            .and_then(|m| m.get(super::open::META_ID))
            .map_err(|e| format!("read the reopened journal's id: {e}"))?;
        let id = id
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map(u64::from_le_bytes);
        if id != Some(self.journal_id) {
            return Err(format!(
                "the journal reopened at {} is not this one (id {id:x?}, want {:x})",
                self.dir.display(),
                self.journal_id
            ));
        }
        let records = db
            .open_tree("records")
            .map_err(|e| format!("open the reopened records: {e}"))?;
        Store::new(&self.dir, db, records).map_err(|e| e.to_string())
    }
}

/// Drops the log's clean cached pages (`POSIX_FADV_DONTNEED`): after a
/// failed write-back the kernel may keep pages marked clean that the disk
/// never took, and the reopen must read what the disk holds. Advice only:
/// a failure changes nothing but the reopen's view.
fn forget_cached_pages(file: &std::fs::File) {
    use nix::fcntl::{PosixFadviseAdvice, posix_fadvise};
    if let Err(e) = posix_fadvise(file, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED) {
        tracing::debug!("drop the journal log's cached pages: {e}");
    }
}
