//! Journal schema migrations: one pure step per version, applied in order
//! when a journal written by an older build is opened.
//!
//! Format v1 was the first released format; v2 adds the CSI arguments to
//! every target; v3 adds a payload volume's hash and object versions; v4
//! moves the checkpoint out of sled into its own file; v5 adds subPath
//! binds: two operations, one record body, and the checkpoint's list of
//! binds; v6 (the current one, documented in `docs/journal-format.md`)
//! adds raw block volumes' map steps, NodeExpandVolume and the `block`
//! target kind. To
//! change the format: bump `journal::SCHEMA_VERSION`, add a `Step` from
//! the old version whose `run` rewrites the old trees into the new layout
//! (re-encoding every value; it must be idempotent, since a crash can cut it
//! short and the next open runs it again), keep a journal written by the old
//! build under `fixtures/journal/v<old>/`, and add a test that opens it.

use std::path::Path;

/// One migration step.
#[derive(Debug)]
pub struct Step {
    /// The schema version it reads.
    pub from: u32,
    /// The schema version it writes.
    pub to: u32,
    /// Rewrites the database (and the files beside it in the journal dir);
    /// must be idempotent.
    pub run: fn(&sled::Db, &Path) -> Result<(), String>,
}

/// Every step, in order.
pub const STEPS: &[Step] = &[
    Step {
        from: 1,
        to: 2,
        run: v1_to_v2,
    },
    Step {
        from: 2,
        to: 3,
        run: v2_to_v3,
    },
    Step {
        from: 3,
        to: 4,
        run: v3_to_v4,
    },
    Step {
        from: 4,
        to: 5,
        run: v4_to_v5,
    },
    Step {
        from: 5,
        to: 6,
        run: v5_to_v6,
    },
];

/// v1 → v2: every record, quarantined record and the checkpoint re-encoded
/// with a `TargetV2` (v1's fields, then no CSI arguments). One sled
/// transaction writes them all and the new schema version, so a crash leaves
/// either the v1 journal or the v2 one, never a mix; running it again on a
/// v1 journal is the same step. A value that does not open as v1 (a damaged
/// one) is left exactly as it is, for replay to find and report.
fn v1_to_v2(db: &sled::Db, _: &Path) -> Result<(), String> {
    reencode(db, 2, record_v1_to_v2, checkpoint_v1_to_v2)
}

/// v2 → v3: the same re-encoding, every target a `TargetV3` (v2's fields,
/// then no payload), in one transaction with the new schema version.
fn v2_to_v3(db: &sled::Db, _: &Path) -> Result<(), String> {
    reencode(db, 3, record_v2_to_v3, checkpoint_v2_to_v3)
}

/// v3 → v4: the checkpoint envelope moves, byte for byte, from the
/// `checkpoint` tree's `current` to the file `<dir>/checkpoint` (see
/// `journal::checkpoint_file`), so sled's cache no longer holds it for the
/// life of the process. In this order, each step durable before the next:
/// the file is written and fsynced, then the key is removed and schema 4
/// recorded in one transaction, and flushed (`migrate` records 4 again).
/// A crash before the transaction runs the step again (the same bytes
/// written again); after it, the journal is v4. A schema-3 journal never
/// lacks its in-sled checkpoint, so a build that reads only v3 never
/// replays one without it. A damaged checkpoint moves as it is, for the
/// open to refuse it as before.
fn v3_to_v4(db: &sled::Db, dir: &Path) -> Result<(), String> {
    let err = |what: &str, e: &dyn std::fmt::Display| format!("{what}: {e}");
    let Some(tree) = super::checkpoint_file::legacy_tree(db).map_err(|e| err("checkpoint", &e))?
    else {
        return Ok(());
    };
    let key = super::checkpoint_file::CHECKPOINT_KEY;
    let Some(value) = tree.get(key).map_err(|e| err("checkpoint", &e))? else {
        return Ok(());
    };
    super::checkpoint_file::write(dir, &value).map_err(|e| e.to_string())?;
    // the key goes with the schema bump, in one transaction: a build that
    // reads v3 must never find a schema-3 journal without its checkpoint
    use sled::Transactional;
    let meta = db.open_tree("meta").map_err(|e| err("meta", &e))?;
    (&tree, &meta)
        .transaction(|(c, m)| {
            c.remove(key)?;
            m.insert("schema_version", 4u32.to_le_bytes().to_vec())?;
            Ok::<_, sled::transaction::ConflictableTransactionError<()>>(())
        })
        .map_err(|e| format!("transaction: {e:?}"))?;
    db.flush().map_err(|e| err("flush", &e))?;
    Ok(())
}

/// v4 → v5: records are unchanged (v5 only adds an operation pair and a
/// body, which no v4 record holds); the checkpoint file is re-sealed as
/// v5, v4's fields followed by no subPath binds, durably (temp file,
/// fsync, rename, dir fsync); `migrate` records schema 5 after. Cut
/// short, the step runs again: a v5 checkpoint reads as v4's fields with
/// bytes after them (bincode leaves trailing bytes), and is written again
/// the same. A damaged checkpoint is left as it is, for the open to
/// refuse it as before.
fn v4_to_v5(db: &sled::Db, dir: &Path) -> Result<(), String> {
    let err = |what: &str, e: &dyn std::fmt::Display| format!("{what}: {e}");
    let Some(value) = super::checkpoint_file::read(dir).map_err(|e| err("checkpoint", &e))? else {
        return Ok(());
    };
    let meta = db.open_tree("meta").map_err(|e| err("meta", &e))?;
    let id = journal_id(&meta)?;
    if let Some(v5) = checkpoint_v4_to_v5(id, &value) {
        super::checkpoint_file::write(dir, &v5).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// v5 → v6: nothing to rewrite. v6 appends five operations (a block
/// volume's four map steps and NodeExpandVolume) and a target kind
/// (`block`, stored as 3), none of which a v5 record or checkpoint holds;
/// `migrate` records schema 6. The bump is what makes a build that knows
/// only v5 refuse a journal holding them, instead of reading them as
/// damage.
fn v5_to_v6(_: &sled::Db, _: &Path) -> Result<(), String> {
    Ok(())
}

/// The journal's id from its `meta` tree (every checksum mixes it in).
fn journal_id(meta: &sled::Tree) -> Result<u64, String> {
    meta.get("journal_id")
        .map_err(|e| format!("meta: {e}"))?
        .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
        .map(u64::from_le_bytes)
        .ok_or_else(|| "meta journal_id is missing".to_owned())
}

/// The v4 checkpoint envelope re-sealed as v5, or `None` when it does not
/// open as v4. The step's pure part.
pub fn checkpoint_v4_to_v5(id: u64, value: &[u8]) -> Option<Vec<u8>> {
    use super::envelope::{self, Kind};
    use super::record::{self, CheckpointV3, CheckpointV5};

    let seq = envelope::claimed_seq(value).unwrap_or(0);
    let payload = envelope::open(id, Kind::Checkpoint, seq, value).ok()?;
    let v4: CheckpointV3 = record::decode(payload).ok()?;
    let v5 = CheckpointV5 {
        through_seq: v4.through_seq,
        wall_time_ns: v4.wall_time_ns,
        entries: v4.entries,
        subpaths: Vec::new(),
    };
    Some(envelope::seal(
        id,
        Kind::Checkpoint,
        seq,
        &record::encode(&v5),
    ))
}

/// Re-seals every record, quarantined record and the checkpoint through
/// `record` and `checkpoint` (a value they return `None` for is left as
/// it is) and writes `schema_version = to`, all in one sled transaction.
fn reencode(
    db: &sled::Db,
    to: u32,
    record: fn(u64, u64, &[u8]) -> Option<Vec<u8>>,
    reseal_checkpoint: fn(u64, &[u8]) -> Option<Vec<u8>>,
) -> Result<(), String> {
    use sled::Transactional;

    let err = |what: &str, e: &dyn std::fmt::Display| format!("{what}: {e}");
    let tree = |name: &str| db.open_tree(name).map_err(|e| err(name, &e));
    let (meta, records, quarantine, checkpoint) = (
        tree("meta")?,
        tree("records")?,
        tree("quarantine")?,
        tree("checkpoint")?,
    );
    let id = journal_id(&meta)?;

    let record_v2 = |seq: u64, value: &[u8]| record(id, seq, value);
    let rewrite = |t: &sled::Tree| -> Result<Vec<(sled::IVec, Vec<u8>)>, String> {
        let mut out = Vec::new();
        for kv in t.iter() {
            let (k, v) = kv.map_err(|e| err("read", &e))?;
            let seq = <[u8; 8]>::try_from(k.as_ref()).map(u64::from_be_bytes);
            if let Some(new) = seq.ok().and_then(|seq| record_v2(seq, &v)) {
                out.push((k, new));
            }
        }
        Ok(out)
    };
    let new_records = rewrite(&records)?;
    let new_quarantine = rewrite(&quarantine)?;
    let new_checkpoint = match checkpoint
        .get("current")
        .map_err(|e| err("checkpoint", &e))?
    {
        Some(v) => reseal_checkpoint(id, &v),
        None => None,
    };

    (&records, &quarantine, &checkpoint, &meta)
        .transaction(|(r, q, c, m)| {
            for (k, v) in &new_records {
                r.insert(k, v.as_slice())?;
            }
            for (k, v) in &new_quarantine {
                q.insert(k, v.as_slice())?;
            }
            if let Some(v) = &new_checkpoint {
                c.insert("current", v.as_slice())?;
            }
            m.insert("schema_version", to.to_le_bytes().to_vec())?;
            Ok::<_, sled::transaction::ConflictableTransactionError<()>>(())
        })
        .map_err(|e| format!("transaction: {e:?}"))?;
    db.flush().map_err(|e| err("flush", &e))?;
    Ok(())
}

/// One stored v1 record value re-sealed as v2, or `None` when it does not
/// open as v1 (then it stays as it is). The step's pure part, per value.
pub fn record_v1_to_v2(id: u64, seq: u64, value: &[u8]) -> Option<Vec<u8>> {
    use super::envelope::{self, Kind};
    use super::record::{self, RecordOf, TargetV1, TargetV2};

    let payload = envelope::open(id, Kind::Record, seq, value).ok()?;
    let v1: RecordOf<TargetV1> = record::decode(payload).ok()?;
    let v2: RecordOf<TargetV2> = v1.map_target(TargetV2::from);
    Some(envelope::seal(id, Kind::Record, seq, &record::encode(&v2)))
}

/// The stored v1 checkpoint value re-sealed as v2, or `None` when it does
/// not open as v1.
pub fn checkpoint_v1_to_v2(id: u64, value: &[u8]) -> Option<Vec<u8>> {
    use super::envelope::{self, Kind};
    use super::record::{self, CheckpointOf, TargetV1, TargetV2};

    let seq = envelope::claimed_seq(value).unwrap_or(0);
    let payload = envelope::open(id, Kind::Checkpoint, seq, value).ok()?;
    let v1: CheckpointOf<TargetV1> = record::decode(payload).ok()?;
    let v2: CheckpointOf<TargetV2> = v1.map_target(TargetV2::from);
    Some(envelope::seal(
        id,
        Kind::Checkpoint,
        seq,
        &record::encode(&v2),
    ))
}

/// One stored v2 record value re-sealed as v3, or `None` when it does not
/// open as v2.
pub fn record_v2_to_v3(id: u64, seq: u64, value: &[u8]) -> Option<Vec<u8>> {
    use super::envelope::{self, Kind};
    use super::record::{self, RecordOf, TargetV2, TargetV3};

    let payload = envelope::open(id, Kind::Record, seq, value).ok()?;
    let v2: RecordOf<TargetV2> = record::decode(payload).ok()?;
    let v3: RecordOf<TargetV3> = v2.map_target(TargetV3::from);
    Some(envelope::seal(id, Kind::Record, seq, &record::encode(&v3)))
}

/// The stored v2 checkpoint value re-sealed as v3, or `None` when it does
/// not open as v2.
pub fn checkpoint_v2_to_v3(id: u64, value: &[u8]) -> Option<Vec<u8>> {
    use super::envelope::{self, Kind};
    use super::record::{self, CheckpointOf, TargetV2, TargetV3};

    let seq = envelope::claimed_seq(value).unwrap_or(0);
    let payload = envelope::open(id, Kind::Checkpoint, seq, value).ok()?;
    let v2: CheckpointOf<TargetV2> = record::decode(payload).ok()?;
    let v3: CheckpointOf<TargetV3> = v2.map_target(TargetV3::from);
    Some(envelope::seal(
        id,
        Kind::Checkpoint,
        seq,
        &record::encode(&v3),
    ))
}

/// The chain of steps that leads from `from` to `to`, or why there is none.
pub fn plan(steps: &[Step], from: u32, to: u32) -> Result<Vec<&Step>, String> {
    let mut at = from;
    let mut chain = Vec::new();
    while at < to {
        let step = steps
            .iter()
            .find(|s| s.from == at)
            .ok_or_else(|| format!("no migration step from schema {at}"))?;
        if step.to <= at {
            return Err(format!("migration step from {at} does not advance"));
        }
        chain.push(step);
        at = step.to;
    }
    if at != to {
        return Err(format!("migrations overshoot schema {to} (reach {at})"));
    }
    Ok(chain)
}

/// Runs the steps from `from` to `to`, then records the new version in meta.
/// `dir` is the journal dir, for a step that writes files beside sled's.
pub fn migrate(db: &sled::Db, dir: &Path, from: u32, to: u32) -> Result<(), String> {
    for step in plan(STEPS, from, to)? {
        (step.run)(db, dir)?;
        let meta = db.open_tree("meta").map_err(|e| e.to_string())?;
        meta.insert("schema_version", step.to.to_le_bytes().to_vec())
            .map_err(|e| e.to_string())?;
        db.flush().map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(_: &sled::Db, _: &Path) -> Result<(), String> {
        Ok(())
    }

    #[test]
    fn plans_chain_and_refuse_gaps() {
        let steps = [
            Step {
                from: 1,
                to: 2,
                run: ok,
            },
            Step {
                from: 2,
                to: 3,
                run: ok,
            },
        ];
        let chain: Vec<_> = plan(&steps, 1, 3).unwrap().iter().map(|s| s.to).collect();
        assert_eq!(chain, vec![2, 3]);
        assert!(plan(&steps, 1, 1).unwrap().is_empty());
        assert!(plan(&steps, 0, 3).unwrap_err().contains("from schema 0"));
        assert!(plan(STEPS, 1, 1).unwrap().is_empty());
        assert_eq!(plan(STEPS, 1, 2).unwrap().len(), 1);
        assert_eq!(plan(STEPS, 1, 3).unwrap().len(), 2);
        assert_eq!(plan(STEPS, 1, 4).unwrap().len(), 3);
    }
}
