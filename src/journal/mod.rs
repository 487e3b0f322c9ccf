//! The write-ahead journal: every MountDevice (and its format step), SetUp,
//! TearDown and UnmountDevice is written here as an intent before it touches
//! the OS and as an outcome after. This module is the only writer of the
//! journal. The daemon writes through the typed API of `ops` (announce,
//! confirm or begin an operation, finish or withdraw it, forget targets,
//! record reconstruction); the raw appends ([`Journal::append_record`],
//! [`Journal::append_record_lazy`], [`Journal::append_records`]) are for
//! tests, tools and migrations. Every record is sealed and written in one
//! private `insert_all`.
//!
//! # Layout
//!
//! A sled 0.34.7 database in the journal dir with three trees — `meta`
//! (schema version, journal id, node name), `records` (big-endian sequence
//! number → envelope) and `quarantine` (records cut off by a failed
//! checksum, kept, never deleted) — plus the `checkpoint` file (one
//! envelope, `checkpoint_file`; a fourth tree before schema 4) and the
//! `acked` watermark file (`watermark`). Every value is wrapped
//! in a versioned envelope with a per-journal CRC-32C ([`envelope`]); the
//! payloads are the on-disk types of [`record`], never model types. The
//! format is written down in `docs/journal-format.md`; format changes come
//! with a step in `migrations/`.
//!
//! # Durability
//!
//! [`Journal::append_record`] returns once its record is durable (and with
//! it every record before it, lazily appended ones included). sled's `flush`
//! does not call `fsync` on Linux: it writes its log buffers and calls
//! `sync_file_range(WAIT_BEFORE | WRITE | WAIT_AFTER)` on them (its
//! background flusher adds a `sync_all` every 500 ms). That survives the
//! death of the process — SIGKILL, a panic, the OOM killer — but not a power
//! cut: the disk's volatile cache and the log file's size are not flushed.
//! So every group flush ends with an `fdatasync` of sled's log file
//! (`<dir>/db`), which flushes both: an acknowledged record survives power
//! loss too (`tests/power_loss.rs` replays a recorded block log to every
//! flush point to show it). Power loss also reboots the machine: every mount
//! is gone and the boot id changes, so reconstruction trusts the host for
//! `mount` targets after a reboot, and a journal sled can no longer open is
//! moved aside and rebuilt from the host alone. Within one boot the `acked`
//! watermark turns a silent loss into a corruption error; after a reboot a
//! shortfall is reported, not fatal.
//!
//! Concurrent appenders share flushes (`commit`): one flush covers every
//! record inserted before it started. A failed write or flush (a full or
//! read-only disk, EIO) leaves the journal unwritable, not closed: nothing
//! that needs a durable record (an intent, a forget) is accepted, records
//! appended without waiting (outcomes) are kept in memory, and
//! [`Journal::recover`] reopens sled's files as the disk holds them and
//! writes every record not yet durable again from memory (`recover`).
//!
//! # Recovery
//!
//! `open` replays checkpoint + tail through [`replay::JournalState::apply`].
//! A value that fails its checksum ends the replay there and is reported
//! with its sequence number; the records from there on are moved to the
//! `quarantine` tree so new records can follow. A journal sled cannot open
//! (its checksums failed, it panicked, the watermark shows acknowledged
//! records missing, its checkpoint fails verification, or the schema
//! version is newer than this build) is moved aside to `<dir>.corrupt-<unix
//! time>` — never deleted, with sled's files as they were before sled's
//! recovery zeroed the damaged tail (`damage`) — and reported as a typed
//! [`JournalError`]; the caller reconstructs from the host alone. What is
//! kept aside is reported by [`Journal::damage`].

mod checkpoint;
mod checkpoint_file;
mod clean_close;
pub(crate) mod commit;
mod contain;
mod damage;
pub mod envelope;
mod error;
mod held;
mod open;
pub(crate) mod ops;
pub mod record;
mod recover;
pub(crate) mod replay;
pub(crate) mod watermark;

#[path = "../../migrations/mod.rs"]
pub mod migrations;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::time::{SystemTime, UNIX_EPOCH};

pub use checkpoint::{CheckpointReport, LONG_TAIL_FROM};
pub use checkpoint_file::{FILE as CHECKPOINT_FILE, TMP as CHECKPOINT_TMP};
pub use damage::{Damage, MovedAside};
pub use error::{Category, JournalError, environmental, errno_name};
pub use held::{NotOpened, Opened};
pub use open::{CheckpointInfo, Corruption, Replay};
pub use ops::{Announced, Decided, DurableIntent, Permit};
pub use replay::{Body, Entry, JournalState, OpResult, Pending, Record, SubpathEntry, TargetKey};

use commit::GroupCommit;
use envelope::Kind;
use record::RecordV3;
use recover::{Store, WriteErrors};
use watermark::{Acked, Watermark};

/// The journal layout version this build writes (`meta/schema_version`).
pub const SCHEMA_VERSION: u32 = 6;

/// What to do with a journal that cannot be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnCorrupt {
    /// Move it aside to `<dir>.corrupt-<time>` (the daemon).
    MoveAside,
    /// Leave everything as it is and report (inspection tools).
    Report,
}

/// How to open a journal.
#[derive(Debug, Clone)]
pub struct JournalConfig {
    /// The journal dir (sled's database lives directly in it).
    pub dir: PathBuf,
    /// The node name, stored in meta when the journal is created.
    pub node_name: String,
    /// The current boot id.
    pub boot_id: String,
    /// sled's page cache capacity in bytes: 1 MiB by default. The daemon
    /// appends small records under increasing keys and reads the journal
    /// back only when it opens it (replay keeps the state in memory), so
    /// only the tree's right edge is hot; sled's own default (1 GiB) or a
    /// bigger cache only lets RSS grow with the records written (daemon
    /// bench, memory per volume from 1,000 to 10,000 volumes: 2.5-2.8 KiB
    /// with 4 MiB, 2.1-2.3 KiB with 1 MiB; 512 KiB and 256 KiB were no
    /// better than 1 MiB).
    pub cache_capacity: u64,
    /// Create the journal when the dir holds none.
    pub create: bool,
    /// What to do with an untrustworthy journal.
    pub on_corrupt: OnCorrupt,
    /// How long to wait for sled's lock before reporting [`Category::Busy`].
    /// sled releases its file lock from background threads shortly after the
    /// last handle drops, so a reopen in the same process needs a moment.
    pub lock_wait: std::time::Duration,
}

impl JournalConfig {
    /// A daemon's config: creates the journal, moves a corrupt one aside.
    pub fn new(dir: impl Into<PathBuf>, node_name: &str, boot_id: &str) -> Self {
        Self {
            dir: dir.into(),
            node_name: node_name.to_owned(),
            boot_id: boot_id.to_owned(),
            cache_capacity: 1 << 20,
            create: true,
            on_corrupt: OnCorrupt::MoveAside,
            // an inspection holds the lock for a moment: the daemon waits
            lock_wait: std::time::Duration::from_secs(10),
        }
    }
    /// An inspection tool's config: opens an existing journal and changes
    /// nothing when it is damaged.
    pub fn inspect(dir: impl Into<PathBuf>, boot_id: &str) -> Self {
        Self {
            create: false,
            on_corrupt: OnCorrupt::Report,
            // a running daemon holds the lock for good: asked at once
            // (`Journal::open_or_ask`); this bounds the wait for an answer
            lock_wait: std::time::Duration::from_secs(2),
            ..Self::new(dir, "", boot_id)
        }
    }
}

/// Nanoseconds since the Unix epoch.
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

struct Writer {
    next_seq: u64,
    state: JournalState,
}

/// An open journal. `Send + Sync`: share it behind an `Arc`.
pub struct Journal {
    dir: PathBuf,
    /// sled's handles and its log file; `None` between a failed write and
    /// the [`Journal::recover`] that reopens them
    store: RwLock<Option<Store>>,
    /// sled's cache capacity, to reopen with
    cache_capacity: u64,
    journal_id: u64,
    boot_id: String,
    writer: Mutex<Writer>,
    inserted_through: AtomicU64,
    commit: GroupCommit,
    /// every record inserted and not yet durable, sealed, in order: what
    /// a recovery writes again (sled's own copy may be lost with a failed
    /// write, or read back from pages the disk never took)
    unsynced: Mutex<VecDeque<(u64, sled::IVec)>>,
    /// failed writes and flushes by errno, since the open
    write_errors: WriteErrors,
    watermark: Watermark,
    checkpoint_lock: Mutex<()>,
    /// what `open` found kept aside (the report does not change while open)
    damage: Damage,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("dir", &self.dir)
            .field("journal_id", &self.journal_id)
            .finish_non_exhaustive()
    }
}

impl Journal {
    /// Opens (or creates) the journal and replays it.
    pub fn open(cfg: &JournalConfig) -> Result<(Journal, Replay), JournalError> {
        open::open(cfg, || {})
    }

    /// [`Journal::open`], calling `locked` once sled holds the journal's
    /// lock, before the replay: from then on no other process can write
    /// the journal, nor act on the mounts it records, until this one lets
    /// go. The daemon starts its read of the mount table there. Not called
    /// when sled never opens (locked by another process, or unreadable).
    pub fn open_then(
        cfg: &JournalConfig,
        locked: impl FnOnce(),
    ) -> Result<(Journal, Replay), JournalError> {
        open::open(cfg, locked)
    }

    /// The journal dir.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The journal id mixed into every checksum.
    pub fn journal_id(&self) -> u64 {
        self.journal_id
    }

    /// The boot id stamped on new records.
    pub fn boot_id(&self) -> &str {
        &self.boot_id
    }

    /// The damage kept aside that `open` found: journals moved aside beside
    /// this one, quarantined records, a tail lost across a reboot.
    pub fn damage(&self) -> &Damage {
        &self.damage
    }

    /// How many flushes appends have caused.
    pub fn flush_count(&self) -> u64 {
        self.commit.flush_count()
    }

    /// The highest durable sequence number.
    pub fn synced_through(&self) -> u64 {
        self.commit.synced_through()
    }

    /// sled's handles, `None` while a failed write waits for a recovery.
    fn store(&self) -> RwLockReadGuard<'_, Option<Store>> {
        // a panic under the write lock leaves `None` or a whole store
        self.store.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The error for a call that needs the journal written now while it
    /// cannot be.
    fn unwritable(&self, reason: String) -> JournalError {
        JournalError::Flush {
            path: self.dir.clone(),
            reason,
        }
    }

    fn writer(&self) -> MutexGuard<'_, Writer> {
        // Every mutation under this lock is completed before anything that
        // could panic, so a poisoned lock still guards a consistent state.
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A copy of the state all records so far imply.
    pub fn state(&self) -> JournalState {
        self.writer().state.clone()
    }

    /// The state all records so far imply, closing the journal (an
    /// inspection reads it once and keeps it).
    pub fn into_state(self) -> JournalState {
        self.writer
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
            .state
    }

    /// Repacks the state's map of entries ([`JournalState::repack`]),
    /// under the writer's lock: appends (a job's intent) wait for it.
    pub fn repack_state(&self) {
        self.writer().state.repack();
    }

    /// Runs `f` on the current state without copying it.
    pub fn with_state<T>(&self, f: impl FnOnce(&JournalState) -> T) -> T {
        f(&self.writer().state)
    }

    /// Raw: appends a record and returns its sequence number once it is
    /// durable (it survives the death of the process; see the module docs).
    pub fn append_record(&self, body: Body) -> Result<u64, JournalError> {
        self.check_open()?;
        let seq = self.insert(body);
        self.wait_durable(seq)?;
        Ok(seq)
    }

    /// Raw: appends a record without waiting for it to be durable: it
    /// becomes durable with the next flush, anyone's (sled's log is flushed
    /// in order, so a later durable record makes every earlier one durable),
    /// or, while the journal cannot be written, with the recovery.
    pub fn append_record_lazy(&self, body: Body) -> Result<u64, JournalError> {
        Ok(self.insert(body))
    }

    /// Makes every record appended so far durable (one group flush, shared
    /// with concurrent waiters); a no-op when nothing is pending.
    pub fn flush_pending(&self) -> Result<(), JournalError> {
        let through = self.inserted_through.load(Ordering::SeqCst);
        if through == 0 || self.synced_through() >= through {
            return Ok(());
        }
        self.wait_durable(through)
    }

    /// Returns once the record `seq` (appended with
    /// [`append_record_lazy`](Self::append_record_lazy)) is durable: one group flush,
    /// shared with concurrent waiters, or none when a flush already covered
    /// it; [`Journal::confirm`] is the way an announced intent gets here.
    pub(super) fn make_durable(&self, seq: u64) -> Result<(), JournalError> {
        self.check_open()?;
        self.wait_durable(seq)
    }

    /// Whether records were appended that are not durable yet.
    pub fn has_pending(&self) -> bool {
        self.synced_through() < self.inserted_through.load(Ordering::SeqCst)
    }

    fn insert(&self, body: Body) -> u64 {
        self.insert_all(vec![body]).1
    }

    /// Fails while a failed write waits for [`Journal::recover`]: what
    /// needs a durable record is refused up front.
    fn check_open(&self) -> Result<(), JournalError> {
        match self.commit.failure() {
            Some(reason) => Err(self.unwritable(reason)),
            None => Ok(()),
        }
    }

    /// Why the journal cannot be written now (a write or flush failed and
    /// no recovery has succeeded since), `None` when it can.
    pub fn unwritable_reason(&self) -> Option<String> {
        self.commit.failure()
    }

    /// The one place records are sealed and written: `bodies` (at least
    /// one) as consecutive records, inserted atomically (one sled insert,
    /// or one batch: every record or none), kept until durable, then
    /// applied to the state. Returns the first and last sequence numbers.
    /// While the journal cannot be written (or when this insert fails),
    /// the records are kept in memory only: the recovery writes them, and
    /// whoever waits for them to be durable is told it failed meanwhile.
    /// So an insert itself never fails.
    fn insert_all(&self, bodies: Vec<Body>) -> (u64, u64) {
        self.insert_where(|_| bodies)
    }

    /// [`Journal::insert_all`] of the bodies `make` picks from the state
    /// as it is at the insert, under the same lock: no other record comes
    /// between the look and the insert.
    fn insert_where(&self, make: impl FnOnce(&JournalState) -> Vec<Body>) -> (u64, u64) {
        let mut w = self.writer();
        let bodies = make(&w.state);
        let first = w.next_seq;
        let wall_time_ns = now_ns();
        let records: Vec<Record> = (first..)
            .zip(bodies)
            .map(|(seq, body)| Record {
                seq,
                wall_time_ns,
                boot_id: self.boot_id.clone(),
                body,
            })
            .collect();
        if records.is_empty() {
            return (first, first.saturating_sub(1));
        }
        let sealed: Vec<(u64, sled::IVec)> = records
            .iter()
            .map(|rec| {
                let payload = record::encode(&RecordV3::from(rec));
                let value = envelope::seal(self.journal_id, Kind::Record, rec.seq, &payload);
                (rec.seq, sled::IVec::from(value))
            })
            .collect();
        if !self.commit.is_failed() {
            let written = match self.store().as_ref() {
                Some(store) => store.insert(&sealed),
                None => Err(sled::Error::ReportableBug(
                    "the journal's files are closed while it is writable".into(),
                )),
            };
            if let Err(e) = written {
                self.write_failed("insert", &e);
            }
        }
        self.unsynced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(sealed);
        for rec in &records {
            w.state.apply(rec);
        }
        let last = first + records.len() as u64 - 1;
        w.next_seq = last + 1;
        self.inserted_through.store(last, Ordering::SeqCst);
        (first, last)
    }

    /// Returns once `seq` is durable (group commit; a failed flush leaves
    /// the journal unwritable until [`Journal::recover`]).
    fn wait_durable(&self, seq: u64) -> Result<(), JournalError> {
        self.commit
            .wait_durable(
                seq,
                || self.inserted_through.load(Ordering::SeqCst),
                |through| self.flush_through(through),
            )
            .map_err(|reason| JournalError::Flush {
                path: self.dir.clone(),
                reason,
            })
    }

    /// Appends `bodies` in order as consecutive records and returns their
    /// sequence numbers once all of them are durable: one insert of the
    /// whole batch under the writer lock (sled applies it atomically: every
    /// record or none), then ONE durable wait through the group commit — so a
    /// batch of N records costs about one flush where N [`append_record`](Self::append_record)
    /// calls from one thread cost N. Replay applies the records in order, as
    /// if appended one by one. An empty batch appends and flushes nothing.
    ///
    /// Raw; the daemon's batches are [`Journal::forget`] and
    /// [`Journal::record_reconstruction`].
    pub fn append_records(&self, bodies: Vec<Body>) -> Result<Vec<u64>, JournalError> {
        self.check_open()?;
        if bodies.is_empty() {
            return Ok(Vec::new());
        }
        let (first, last) = self.insert_all(bodies);
        self.wait_durable(last)?;
        Ok((first..=last).collect())
    }

    /// Makes every record inserted through `through` durable: sled's
    /// flush, an `fdatasync` of its log, the watermark; then they are no
    /// longer kept for a recovery.
    fn flush_through(&self, through: u64) -> Result<(), String> {
        let store = self.store();
        let Some(store) = store.as_ref() else {
            return Err("the journal's files are closed until it recovers".into());
        };
        store.sync(&self.dir).map_err(|(what, e)| {
            self.write_errors.count(&e);
            format!("{what}: {e}")
        })?;
        self.write_acked(through)?;
        self.synced(through);
        Ok(())
    }

    /// Writes the watermark: everything through `through` is durable.
    fn write_acked(&self, through: u64) -> Result<(), String> {
        self.watermark
            .write(&Acked {
                journal_id: self.journal_id,
                seq: through,
                boot_id: self.boot_id.clone(),
            })
            .map_err(|e| {
                self.write_errors.count(&e);
                format!("write {}: {e}", self.watermark.path().display())
            })
    }

    /// Records through `through` are durable: no longer kept.
    fn synced(&self, through: u64) {
        let mut unsynced = self.unsynced.lock().unwrap_or_else(|p| p.into_inner());
        while unsynced.front().is_some_and(|(seq, _)| *seq <= through) {
            unsynced.pop_front();
        }
    }

    /// Flushes everything inserted so far; a failure leaves the journal
    /// unwritable until [`Journal::recover`].
    pub(super) fn flush_or_degrade(&self) -> Result<(), JournalError> {
        self.check_open()?;
        let through = self.inserted_through.load(Ordering::SeqCst);
        self.flush_through(through).map_err(|reason| {
            self.commit.fail(reason.clone());
            self.unwritable(reason)
        })
    }

    /// Flushes everything (shutdown; a journal left unwritable is given one
    /// more recovery first), folds a long tail into a checkpoint
    /// (`checkpoint_a_long_tail`), then has sled snapshot its log
    /// (`checkpoint::snapshot_log`) and notes its files as they are
    /// (`clean_close`).
    pub fn close(self) -> Result<(), JournalError> {
        if self.commit.failure().is_some() {
            self.recover()?;
        }
        self.flush_or_degrade()?;
        self.checkpoint_a_long_tail();
        let dir = self.dir.clone();
        drop(self);
        checkpoint::snapshot_log(&dir);
        clean_close::note(&dir);
        Ok(())
    }
}
