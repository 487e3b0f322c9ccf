//! Checkpoints (the whole state written as one envelope, then the records
//! it covers dropped) and the read-back of an open journal that `dump` and
//! `/debug/journal` show; and the snapshot sled is left with at a clean close.

use std::path::Path;

use super::checkpoint_file;
use super::envelope::{self, Kind};
use super::open::{self, Corruption, Replay};
use super::record::{self, CheckpointV5};
use super::{Journal, JournalError, SCHEMA_VERSION, now_ns};

/// What a checkpoint did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointReport {
    /// the last record folded in
    pub through_seq: u64,
    /// targets in the checkpoint
    pub entries: usize,
    /// records dropped after it was durable
    pub dropped: usize,
}

impl Journal {
    /// Writes the state implied by every record so far (pending intents
    /// included) as one checkpoint, makes it durable (its own fsynced file,
    /// `checkpoint_file`), then drops the records it covers. A crash
    /// between the two steps (`checkpoint.mid`) leaves old records that
    /// replay skips.
    pub fn checkpoint(&self) -> Result<CheckpointReport, JournalError> {
        let _one_at_a_time = self
            .checkpoint_lock
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let (ck, through) = {
            let w = self.writer();
            (CheckpointV5::of(&w.state, now_ns()), w.state.last_seq())
        };
        let write_err = |what, cause| JournalError::Write {
            what,
            path: self.dir.clone(),
            cause,
        };
        let value = envelope::seal(
            self.journal_id,
            Kind::Checkpoint,
            through,
            &record::encode(&ck),
        );
        self.check_open()?;
        checkpoint_file::write(&self.dir, &value)?;
        drop(value);
        self.flush_or_degrade()?;
        crate::failpoint::hit("checkpoint.mid");
        let mut dropped = 0;
        {
            let store = self.store();
            let records = &store
                .as_ref()
                .ok_or_else(|| self.unwritable("the journal's files are closed".into()))?
                .records;
            for key in records.range(..=through.to_be_bytes()).keys() {
                let key = key.map_err(|e| write_err("record drop", e))?;
                records
                    .remove(key)
                    .map_err(|e| write_err("record drop", e))?;
                dropped += 1;
            }
        }
        self.flush_or_degrade()?;
        Ok(CheckpointReport {
            through_seq: through,
            entries: ck.entries.len(),
            dropped,
        })
    }

    /// What `dump` would show, read from the open journal: the checkpoint
    /// info and the records after it (the live state: [`Journal::state`]).
    /// For the daemon's
    /// `/debug/journal`, while it holds sled's lock.
    pub fn current(&self, node_name: &str) -> Result<Replay, JournalError> {
        let read_err = |cause| JournalError::Write {
            what: "read back",
            path: self.dir.clone(),
            cause,
        };
        // one view: a checkpoint between reading the file and the records
        // would hide the records it drops from both
        let _no_checkpoint_meanwhile = self
            .checkpoint_lock
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let checkpoint = checkpoint_file::read(&self.dir)
            .map_err(|e| read_err(sled::Error::Io(e)))?
            .and_then(|v| {
                let seq = envelope::claimed_seq(&v)?;
                let payload = envelope::open(self.journal_id, Kind::Checkpoint, seq, &v).ok()?;
                let (through_seq, wall_time_ns, entries) = record::checkpoint_head(payload)?;
                Some(open::CheckpointInfo {
                    through_seq,
                    wall_time_ns,
                    entries,
                })
            });
        let mut tail = Vec::new();
        let mut corruption = None;
        let unwritable = self.commit.failure().is_some();
        if let Some(store) = self.store().as_ref() {
            for kv in store.records.iter() {
                let (k, v) = match kv {
                    Ok(kv) => kv,
                    // sled refuses reads too after a failed write: the
                    // records it holds are in memory as well (below)
                    Err(_) if unwritable => break,
                    Err(e) => return Err(read_err(e)),
                };
                let Ok(key) = <[u8; 8]>::try_from(k.as_ref()) else {
                    continue;
                };
                let seq = u64::from_be_bytes(key);
                if checkpoint.as_ref().is_some_and(|c| seq <= c.through_seq) {
                    continue;
                }
                match record::open_record(self.journal_id, seq, &v) {
                    Ok(r) => tail.push(r),
                    Err(reason) => {
                        corruption = Some(Corruption { seq, reason });
                        break;
                    }
                }
            }
        }
        // Records not yet durable (every one since a failed write) are
        // shown from memory, where the recovery will write them from.
        let last = tail.last().map_or(0, |r: &super::Record| r.seq);
        if corruption.is_none() {
            let unsynced = self.unsynced.lock().unwrap_or_else(|p| p.into_inner());
            for (seq, v) in unsynced.iter().filter(|(seq, _)| *seq > last) {
                if let Ok(r) = record::open_record(self.journal_id, *seq, v) {
                    tail.push(r);
                }
            }
        }
        Ok(Replay {
            tail,
            checkpoint,
            corruption,
            quarantined: Vec::new(),
            lost_tail: None,
            created: false,
            node_name: node_name.to_owned(),
            schema_version: SCHEMA_VERSION,
            damage: self.damage.clone(),
        })
    }
}

/// A tail of at least this many records that also outnumbers the targets
/// is worth folding into a checkpoint ([`Journal::long_tail`]): a clean
/// close does, and the daemon does once its start has settled (the start
/// replayed it record by record; the next one then need not).
pub const LONG_TAIL_FROM: u64 = 1024;

impl Journal {
    /// How many records follow the checkpoint (from the first record kept
    /// to the last applied) when they are worth a checkpoint: at least
    /// [`LONG_TAIL_FROM`] and more than the targets. A start replays them
    /// one at a time (a sled read, a CRC and a decode each) but decodes the
    /// checkpoint's targets from one value, so folding pays O(targets)
    /// once, at most what each later start saves. 0 otherwise, or when the
    /// first record cannot be read.
    pub fn long_tail(&self) -> u64 {
        // the store's guard is let go before the writer's lock is taken:
        // an insert takes them the other way round
        let first = match self.store().as_ref().map(|s| s.records.first()) {
            Some(Ok(Some((first, _)))) => <[u8; 8]>::try_from(first.as_ref()).ok(),
            _ => None,
        };
        let Some(first) = first.map(u64::from_be_bytes) else {
            return 0;
        };
        let (last, targets) = {
            let w = self.writer();
            (w.state.last_seq(), w.state.len() as u64)
        };
        let tail = (last + 1).saturating_sub(first);
        if tail < LONG_TAIL_FROM || tail <= targets {
            return 0;
        }
        tail
    }

    /// At a clean close, a long tail ([`Journal::long_tail`]: a node that
    /// never reached `--checkpoint-every` records, say 1,000 CSI volumes:
    /// 4,000 records over 2,000 targets) is folded into a checkpoint. A
    /// failure only leaves the tail to replay.
    pub(super) fn checkpoint_a_long_tail(&self) {
        if self.long_tail() == 0 {
            return;
        }
        if let Err(e) = self.checkpoint() {
            tracing::warn!(dir = %self.dir.display(), error = %e, "journal: checkpoint at close");
        }
    }
}

/// sled 0.34 writes the snapshot of its page table only while it opens, so
/// each start replays every log message written since the previous start
/// (after a first start, one per record of every volume). Opened once more
/// after a clean close, sled leaves a snapshot that covers the whole log,
/// and the next start reads that instead. An
/// optimisation only: when it fails (another process took the lock, the
/// disk is full) the next start replays the log as before.
pub(super) fn snapshot_log(dir: &Path) {
    // sled's flusher lets go of the lock as its thread ends, just after
    // the drop that stopped it
    match super::held::open_sled(dir, 1 << 20, SNAPSHOT_LOCK_WAIT, false) {
        Ok(db) => drop(db),
        Err(e) => {
            tracing::debug!(dir = %dir.display(), error = %e, "journal: no sled snapshot at close")
        }
    }
}

/// How long [`snapshot_log`] waits for the lock the closed journal's
/// handles still hold.
const SNAPSHOT_LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(100);
