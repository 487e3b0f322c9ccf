//! Opening a journal: sled under `catch_unwind` (sled may panic on a damaged
//! file), meta and schema checks, migrations, replay of checkpoint + tail,
//! the watermark check, quarantine of records behind a bad checksum, and
//! moving an untrustworthy journal aside.

use std::collections::VecDeque;
use std::io::Read;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, RwLock};

use super::checkpoint_file::{self, CHECKPOINT_TREE};
use super::commit::GroupCommit;
use super::contain::{Failed, contain};
use super::damage::{self, AsFound, Damage};
use super::held::open_sled;
use super::record;
use super::recover::Store;
use super::replay::{JournalState, Record};
use super::watermark::{Acked, Watermark};
use super::{
    Journal, JournalConfig, JournalError, OnCorrupt, SCHEMA_VERSION, Writer, migrations, now_ns,
};

const META_SCHEMA: &[u8] = b"schema_version";
pub(super) const META_ID: &[u8] = b"journal_id";
const META_NODE: &[u8] = b"node_name";
const META_CREATED: &[u8] = b"created_ns";

/// Where replay stopped on a value that failed verification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corruption {
    /// the sequence number of the bad value
    pub seq: u64,
    /// what was wrong with it
    pub reason: String,
}

/// The checkpoint replay started from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// the last record it covers
    pub through_seq: u64,
    /// when it was written
    pub wall_time_ns: u64,
    /// targets in it
    pub entries: usize,
}

/// What `open` found. The state that checkpoint + tail imply is not here:
/// it is moved into the journal's writer (one copy of a state as big as the
/// node), read with [`Journal::with_state`], [`Journal::state`] or
/// [`Journal::into_state`].
#[derive(Debug, Clone)]
pub struct Replay {
    /// the records after the checkpoint, in order
    pub tail: Vec<Record>,
    /// the checkpoint, if any
    pub checkpoint: Option<CheckpointInfo>,
    /// a value that failed verification ended replay here
    pub corruption: Option<Corruption>,
    /// sequence numbers moved to the quarantine tree by this open
    pub quarantined: Vec<u64>,
    /// after a reboot: (acknowledged through, recovered through) when the
    /// tail written before power loss is gone
    pub lost_tail: Option<(u64, u64)>,
    /// whether this open created the journal
    pub created: bool,
    /// the node name in meta
    pub node_name: String,
    /// the schema version in meta
    pub schema_version: u32,
    /// what is kept aside: journals moved aside beside this one, every
    /// record in the quarantine tree (this open's and earlier ones'), a
    /// lost tail
    pub damage: Damage,
}

fn has_journal(dir: &Path) -> bool {
    dir.join("conf").exists() || dir.join("db").exists()
}

fn random_id() -> u64 {
    let mut b = [0u8; 8];
    let from_urandom = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    if from_urandom.is_err() {
        b = (now_ns() ^ u64::from(std::process::id()).rotate_left(32)).to_le_bytes();
    }
    u64::from_le_bytes(b) | 1
}

fn u64_of(bytes: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(bytes).ok().map(u64::from_be_bytes)
}

/// The journal as read, before it is trusted.
struct Read_ {
    db: sled::Db,
    /// the state checkpoint + tail imply
    state: JournalState,
    records: sled::Tree,
    quarantine: sled::Tree,
    journal_id: u64,
    replay: Replay,
    /// highest sequence number present anywhere
    max_seen: u64,
}

/// Why a journal is not opened.
enum Distrust {
    Corrupt(String),
    Newer(u32),
    /// the host refused a file: the journal is left as it is
    Unavailable {
        step: String,
        cause: std::io::Error,
    },
}

/// A failed sled call during `what`, judged: the host refusing a file (no
/// space, a read-only or failing disk) says nothing about the journal's
/// bytes; anything else is damage.
fn judged(what: &str, f: Failed) -> Distrust {
    match f {
        Failed::Sled(sled::Error::Io(cause)) if super::error::environmental(&cause) => {
            Distrust::Unavailable {
                step: what.to_owned(),
                cause,
            }
        }
        f => Distrust::Corrupt(format!("{what}: {f}")),
    }
}

pub(super) fn open(
    cfg: &JournalConfig,
    locked: impl FnOnce(),
) -> Result<(Journal, Replay), JournalError> {
    // A journal another process holds is waited for before anything is
    // copied: an open that finds it held for good (a dump beside the
    // daemon, asked again and again by `open_or_ask`) copies nothing.
    if !super::held::wait_for_lock(&cfg.dir, cfg.lock_wait) {
        return Err(JournalError::Locked {
            path: cfg.dir.clone(),
        });
    }
    // Before sled's recovery can zero a damaged log's tail (see `AsFound`).
    let as_found = has_journal(&cfg.dir)
        .then(|| AsFound::save(&cfg.dir, cfg.on_corrupt == OnCorrupt::Report))
        .flatten();
    let opened = open_found(cfg, as_found.as_ref(), locked);
    if let Some(found) = as_found {
        found.settle(&cfg.dir, opened.as_ref().err());
    }
    opened
}

fn open_found(
    cfg: &JournalConfig,
    as_found: Option<&AsFound>,
    locked: impl FnOnce(),
) -> Result<(Journal, Replay), JournalError> {
    let dir = &cfg.dir;
    if !has_journal(dir) {
        if !cfg.create {
            return Err(JournalError::NotFound { path: dir.clone() });
        }
        std::fs::create_dir_all(dir).map_err(|cause| JournalError::CreateDir {
            path: dir.clone(),
            cause,
        })?;
    }
    let daemon = cfg.on_corrupt == OnCorrupt::MoveAside;
    let try_open = || open_sled(dir, cfg.cache_capacity, cfg.lock_wait, daemon);
    let opened = try_open();
    // Set when sled opened only with its conf and snapshot moved aside.
    let mut derived_aside = None;
    let db = match opened {
        Ok(db) => db,
        Err(e) if e.is_locked() => {
            return Err(JournalError::Locked { path: dir.clone() });
        }
        // No space, a read-only or failing disk: sled's files are as they
        // were, and neither they nor the journal are moved.
        Err(e) if e.host_error().is_some() => {
            return distrusted(cfg, judged("sled cannot open its files", e));
        }
        // sled's snapshot and conf are derived (a cache of its log, the
        // settings we always open with), yet a damaged one fails the open
        // of a whole log: the daemon retries once from the log alone with
        // them moved aside (the watermark still catches a lost record).
        Err(e) => {
            let aside = daemon
                .then(|| damage::move_derived_aside(dir, &e.to_string()))
                .flatten();
            match aside.as_ref().map(|aside| (aside, try_open())) {
                Some((aside, Ok(db))) => {
                    derived_aside = Some(aside.clone());
                    db
                }
                Some((aside, Err(again))) if again.host_error().is_some() => {
                    damage::put_derived_back(dir, aside);
                    return distrusted(cfg, judged("sled cannot open its log", again));
                }
                Some((aside, Err(again))) => {
                    // The log itself is bad: the journal goes aside whole.
                    damage::put_derived_back(dir, aside);
                    let why =
                        format!("sled cannot open it: {e}; without its conf and snapshot: {again}");
                    return distrusted(cfg, Distrust::Corrupt(why));
                }
                None => {
                    return distrusted(cfg, Distrust::Corrupt(format!("sled cannot open it: {e}")));
                }
            }
        }
    };
    locked();
    let read = match read(cfg, db) {
        Ok(r) => r,
        Err(why) => return distrusted_whole(cfg, why, derived_aside.as_deref()),
    };
    let watermark = Watermark::open(dir).map_err(|cause| JournalError::Watermark {
        path: dir.join("acked"),
        cause,
    })?;
    let mut read = read;
    match watermark.read() {
        Ok(Some(acked)) if acked.journal_id != read.journal_id => {
            let why = format!(
                "watermark belongs to journal {:x}, meta says {:x}",
                acked.journal_id, read.journal_id
            );
            drop(read);
            return distrusted_whole(cfg, Distrust::Corrupt(why), derived_aside.as_deref());
        }
        Ok(Some(acked)) if acked.seq > read.max_seen => {
            if acked.boot_id == cfg.boot_id {
                let why = format!(
                    "records through {} were acknowledged but sled recovered only through {}",
                    acked.seq, read.max_seen
                );
                drop(read);
                return distrusted_whole(cfg, Distrust::Corrupt(why), derived_aside.as_deref());
            }
            tracing::warn!(
                acked = acked.seq,
                recovered = read.max_seen,
                "journal lost its tail across a reboot (power loss); mounts are gone too"
            );
            // sled zeroed what it could not read: keep the files as found.
            if let Some(found) = as_found {
                let why = format!(
                    "records through {} were acknowledged before a reboot, sled recovered only through {}; these are sled's files as found before its recovery",
                    acked.seq, read.max_seen
                );
                found.keep_aside(&damage::aside_path(dir), &why);
            }
            read.replay.lost_tail = Some((acked.seq, read.max_seen));
        }
        _ => {}
    }
    if read.replay.corruption.is_some() && cfg.on_corrupt == OnCorrupt::MoveAside {
        quarantine(cfg, &mut read)?;
    }
    read.replay.damage = Damage {
        moved_aside: damage::moved_aside_beside(dir),
        quarantined: read
            .quarantine
            .iter()
            .keys()
            .filter_map(|k| k.ok().and_then(|k| u64_of(&k)))
            .collect(),
        lost_tail: read.replay.lost_tail,
    };
    let next_seq = read.max_seen + 1;
    watermark
        .write(&Acked {
            journal_id: read.journal_id,
            seq: read.max_seen,
            boot_id: cfg.boot_id.clone(),
        })
        .map_err(|cause| JournalError::Watermark {
            path: watermark.path().to_owned(),
            cause,
        })?;
    let store = Store::new(dir, read.db, read.records)?;
    let journal = Journal {
        dir: dir.clone(),
        store: RwLock::new(Some(store)),
        cache_capacity: cfg.cache_capacity,
        journal_id: read.journal_id,
        boot_id: cfg.boot_id.clone(),
        writer: Mutex::new(Writer {
            next_seq,
            state: read.state,
        }),
        inserted_through: AtomicU64::new(read.max_seen),
        commit: GroupCommit::new(read.max_seen),
        unsynced: Mutex::new(VecDeque::new()),
        write_errors: Default::default(),
        watermark,
        checkpoint_lock: Mutex::new(()),
        damage: read.replay.damage.clone(),
    };
    Ok((journal, read.replay))
}

fn read(cfg: &JournalConfig, db: sled::Db) -> Result<Read_, Distrust> {
    let tree = |name: &str| contain(|| db.open_tree(name)).map_err(|e| judged(name, e));
    let (meta, records, quarantine) = (tree("meta")?, tree("records")?, tree("quarantine")?);
    // a journal of schema 4 on has none
    let legacy_checkpoint =
        contain(|| checkpoint_file::legacy_tree(&db)).map_err(|e| judged(CHECKPOINT_TREE, e))?;
    let get = |k: &[u8]| contain(|| meta.get(k)).map_err(|e| judged("meta", e));
    let mut created = false;
    let (schema, journal_id) = match (get(META_SCHEMA)?, get(META_ID)?) {
        (Some(v), Some(id)) => {
            let schema = <[u8; 4]>::try_from(v.as_ref())
                .map(u32::from_le_bytes)
                .map_err(|_| Distrust::Corrupt("meta schema_version is not 4 bytes".into()))?;
            let id = <[u8; 8]>::try_from(id.as_ref())
                .map(u64::from_le_bytes)
                .map_err(|_| Distrust::Corrupt("meta journal_id is not 8 bytes".into()))?;
            (schema, id)
        }
        (None, None)
            if records.is_empty()
                && legacy_checkpoint.as_ref().is_none_or(|t| t.is_empty())
                && !cfg.dir.join(checkpoint_file::FILE).exists() =>
        {
            let id = random_id();
            let put = |k: &[u8], v: Vec<u8>| {
                contain(|| meta.insert(k, v)).map_err(|e| judged("write meta", e))
            };
            put(META_SCHEMA, SCHEMA_VERSION.to_le_bytes().to_vec())?;
            put(META_ID, id.to_le_bytes().to_vec())?;
            put(META_NODE, cfg.node_name.as_bytes().to_vec())?;
            put(META_CREATED, now_ns().to_le_bytes().to_vec())?;
            contain(|| db.flush()).map_err(|e| judged("flush meta", e))?;
            created = true;
            (SCHEMA_VERSION, id)
        }
        _ => {
            return Err(Distrust::Corrupt(
                "meta is missing but records exist".into(),
            ));
        }
    };
    if schema > SCHEMA_VERSION {
        return Err(Distrust::Newer(schema));
    }
    // An inspection (`dump`, `reconstruct --dry-run`) changes nothing, so it
    // reads an older journal in its own format instead of migrating it.
    let read_schema = if schema < SCHEMA_VERSION && cfg.on_corrupt != OnCorrupt::Report {
        migrations::migrate(&db, &cfg.dir, schema, SCHEMA_VERSION).map_err(|e| {
            let step = format!("migration from schema {schema}: {e}");
            // a migration's errors are text: the errno it carries tells
            // a full or read-only disk from damage
            match super::error::environmental_text(&e) {
                Some(cause) => Distrust::Unavailable { step, cause },
                None => Distrust::Corrupt(step),
            }
        })?;
        SCHEMA_VERSION
    } else {
        schema
    };
    let node_name = get(META_NODE)?
        .map(|v| String::from_utf8_lossy(&v).into_owned())
        .unwrap_or_default();

    let mut state = JournalState::default();
    let mut replay = Replay {
        tail: Vec::new(),
        checkpoint: None,
        corruption: None,
        quarantined: Vec::new(),
        lost_tail: None,
        created,
        node_name,
        schema_version: read_schema,
        damage: Damage::default(),
    };
    let mut through = 0;
    let stored = checkpoint_file::Stored {
        dir: &cfg.dir,
        schema: read_schema,
        journal_id,
        legacy: legacy_checkpoint.as_ref(),
    };
    let found = stored
        .load(&records, &quarantine)
        .map_err(|e| judged("checkpoint", e))?;
    if let Some((claimed, decoded)) = found {
        match decoded {
            Ok((decoded, through_seq, wall_time_ns, entries)) => {
                through = through_seq;
                replay.checkpoint = Some(CheckpointInfo {
                    through_seq,
                    wall_time_ns,
                    entries,
                });
                state = decoded;
            }
            // The records a checkpoint covers were dropped once it was
            // durable: without it the tail alone implies a wrong state, and
            // quarantining from its seq would leave the bad checkpoint in
            // place to cut every later start's new records off again. Only
            // moving the whole journal aside keeps everything.
            Err(reason) if cfg.on_corrupt == OnCorrupt::MoveAside => {
                return Err(Distrust::Corrupt(format!(
                    "checkpoint (through seq {claimed}) failed verification: {reason}"
                )));
            }
            Err(reason) => {
                replay.corruption = Some(Corruption {
                    seq: claimed,
                    reason: format!("checkpoint: {reason}"),
                });
            }
        }
    }
    let mut max_seen = through;
    let iterated = contain(|| {
        for kv in records.iter() {
            let (k, v) = kv?;
            let Some(seq) = u64_of(&k) else {
                if replay.corruption.is_none() {
                    replay.corruption = Some(Corruption {
                        seq: max_seen + 1,
                        reason: format!("record key {k:02x?} is not 8 bytes"),
                    });
                }
                continue;
            };
            max_seen = max_seen.max(seq);
            if seq <= through || replay.corruption.is_some() {
                continue;
            }
            match record::open_record_of(read_schema, journal_id, seq, &v) {
                Ok(rec) => {
                    state.apply(&rec);
                    replay.tail.push(rec);
                }
                Err(reason) => replay.corruption = Some(Corruption { seq, reason }),
            }
        }
        Ok(())
    });
    iterated.map_err(|e| judged("records", e))?;
    if let Ok(Some((k, _))) = contain(|| quarantine.last()) {
        max_seen = max_seen.max(u64_of(&k).unwrap_or(0));
    }
    if let Some(c) = &replay.corruption {
        tracing::error!(seq = c.seq, reason = %c.reason, "journal replay stopped at a value that failed verification");
    }
    Ok(Read_ {
        db,
        state,
        records,
        quarantine,
        journal_id,
        replay,
        max_seen,
    })
}

/// Moves every record from the corrupt one on into the quarantine tree, so
/// new records can follow and a later replay does not stop at the same place.
fn quarantine(cfg: &JournalConfig, read: &mut Read_) -> Result<(), JournalError> {
    let Some(c) = &read.replay.corruption else {
        return Ok(());
    };
    let write = |cause| JournalError::Write {
        what: "quarantine",
        path: cfg.dir.clone(),
        cause,
    };
    let keys: Vec<_> = read
        .records
        .range(c.seq.to_be_bytes()..)
        .collect::<Result<Vec<_>, _>>()
        .map_err(write)?;
    for (k, v) in keys {
        read.quarantine.insert(&k, v).map_err(write)?;
        read.records.remove(&k).map_err(write)?;
        read.replay.quarantined.extend(u64_of(&k));
    }
    read.db.flush().map_err(write)?;
    Ok(())
}

/// [`distrusted`] after sled opened only with its conf and snapshot moved
/// aside: they go back first, so the journal moved aside is whole.
fn distrusted_whole<T>(
    cfg: &JournalConfig,
    why: Distrust,
    derived_aside: Option<&Path>,
) -> Result<T, JournalError> {
    if let Some(aside) = derived_aside {
        damage::put_derived_back(&cfg.dir, aside);
    }
    distrusted(cfg, why)
}

fn distrusted<T>(cfg: &JournalConfig, why: Distrust) -> Result<T, JournalError> {
    let moved_to = || match cfg.on_corrupt {
        OnCorrupt::Report => Ok(None),
        OnCorrupt::MoveAside => damage::move_aside(&cfg.dir).map(Some),
    };
    let err = match why {
        Distrust::Corrupt(reason) => JournalError::Corrupt {
            path: cfg.dir.clone(),
            reason,
            moved_to: moved_to()?,
        },
        Distrust::Newer(found) => JournalError::NewerSchema {
            path: cfg.dir.clone(),
            found,
            supported: SCHEMA_VERSION,
            moved_to: moved_to()?,
        },
        // Never moved: the next open, once the host lets it, finds the
        // journal exactly as this one did.
        Distrust::Unavailable { step, cause } => JournalError::Unavailable {
            path: cfg.dir.clone(),
            step,
            cause,
        },
    };
    tracing::error!("{err}");
    Err(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{Body, OpResult};
    use crate::model::UniqueVolumeName;
    use crate::model::{Operation, PluginName, Steps, TargetKind, TargetParams, TargetRef};

    const BOOT: &str = "b0000000-1111-2222-3333-444444444444";

    fn sled_retrying(dir: &Path) -> sled::Db {
        // A journal just dropped holds sled's lock for a moment.
        for _ in 0..500 {
            match sled::open(dir) {
                Ok(db) => return db,
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
            }
        }
        sled::open(dir).unwrap()
    }

    fn outcome(intent_seq: u64) -> Body {
        Body::Outcome {
            intent_seq,
            op: Operation::SetUp,
            result: OpResult::Success,
            observed: None,
        }
    }

    /// Bug found by `tests/journal_torture.rs`: a checkpoint that failed
    /// verification ended replay with nothing before it, and stayed in
    /// place, so every later start replayed an empty state and quarantined
    /// the records written since. Now the journal is moved aside whole.
    #[test]
    fn a_bad_checkpoint_moves_the_journal_aside_instead_of_replaying_without_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("journal");
        let cfg = JournalConfig::new(&dir, "n", BOOT);
        let (j, _) = Journal::open(&cfg).unwrap();
        let target = std::sync::Arc::new(TargetParams::at(
            UniqueVolumeName::from_raw("v1"),
            PluginName::EmptyDir,
            "cache".into(),
            TargetRef::Device,
            TargetKind::Dir,
            None,
        ));
        let intent = j
            .append_record(Body::Intent {
                op: Operation::SetUp,
                steps: Steps::Single,
                target,
            })
            .unwrap();
        j.append_record(outcome(intent)).unwrap();
        j.checkpoint().unwrap();
        j.append_record(outcome(intent)).unwrap();
        drop(j);
        let file = dir.join(checkpoint_file::FILE);
        let mut v = std::fs::read(&file).unwrap();
        v[30] ^= 0xff;
        std::fs::write(&file, v).unwrap();
        // An inspection reports it and changes nothing.
        let (j, replay) = Journal::open(&JournalConfig::inspect(&dir, BOOT)).unwrap();
        assert!(replay.corruption.unwrap().reason.contains("checkpoint"));
        drop(j);
        // The daemon moves the whole journal aside, with a note saying why.
        let Err(JournalError::Corrupt {
            moved_to: Some(to),
            reason,
            ..
        }) = Journal::open(&cfg)
        else {
            panic!("a bad checkpoint was not reported as corruption");
        };
        assert!(reason.contains("checkpoint"), "{reason}");
        assert!(to.join("db").exists() && !dir.exists());
        assert!(
            to.join(checkpoint_file::FILE).exists(),
            "the checkpoint went too"
        );
        let note = std::fs::read_to_string(to.join(damage::NOTE)).unwrap();
        assert!(note.contains("checkpoint"), "{note}");
        // The next start gets a fresh journal that reports the one moved aside.
        let (_, replay) = Journal::open(&cfg).unwrap();
        assert!(replay.created && replay.corruption.is_none());
        assert_eq!(replay.damage.moved_aside.len(), 1);
        assert_eq!(replay.damage.moved_aside[0].path, to);
    }

    /// A journal at `dir` whose records 1 to 3 are checkpointed (dropped
    /// from sled) and record 4 is after the checkpoint, still open.
    fn checkpointed(dir: &Path) -> Journal {
        let (j, _) = Journal::open(&JournalConfig::new(dir, "n", BOOT)).unwrap();
        for i in 0..3 {
            j.append_record(outcome(i)).unwrap();
        }
        j.checkpoint().unwrap();
        j.append_record(outcome(9)).unwrap();
        j
    }

    /// The checkpoint is a file beside sled's (schema 4): one that is gone
    /// while the records it covered are dropped is refused like a damaged
    /// one, never replayed as the tail alone.
    #[test]
    fn a_missing_checkpoint_file_is_refused_when_records_were_dropped() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("journal");
        let cfg = JournalConfig::new(&dir, "n", BOOT);
        drop(checkpointed(&dir));
        std::fs::remove_file(dir.join(checkpoint_file::FILE)).unwrap();
        let (_, replay) = Journal::open(&JournalConfig::inspect(&dir, BOOT)).unwrap();
        let reason = replay.corruption.unwrap().reason;
        assert!(
            reason.contains("checkpoint") && reason.contains("seq 4"),
            "{reason}"
        );
        let Err(JournalError::Corrupt {
            moved_to: Some(_),
            reason,
            ..
        }) = Journal::open(&cfg)
        else {
            panic!("a missing checkpoint was not reported as corruption");
        };
        assert!(reason.contains("missing"), "{reason}");
    }

    /// A stale checkpoint file (one older than the checkpoint that dropped
    /// the records after it) is refused: replaying it would skip them.
    #[test]
    fn a_stale_checkpoint_file_is_refused_when_records_after_it_are_gone() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("journal");
        let j = checkpointed(&dir);
        let stale = std::fs::read(dir.join(checkpoint_file::FILE)).unwrap();
        for i in 4..6 {
            j.append_record(outcome(i)).unwrap();
        }
        j.checkpoint().unwrap();
        j.append_record(outcome(9)).unwrap();
        drop(j);
        // the current file opens; the stale one does not
        let (_, replay) = Journal::open(&JournalConfig::inspect(&dir, BOOT)).unwrap();
        assert!(replay.corruption.is_none(), "{:?}", replay.corruption);
        std::fs::write(dir.join(checkpoint_file::FILE), stale).unwrap();
        let (_, replay) = Journal::open(&JournalConfig::inspect(&dir, BOOT)).unwrap();
        let reason = replay.corruption.expect("a stale checkpoint").reason;
        assert!(
            reason.contains("seq 3") && reason.contains("seq 7"),
            "{reason}"
        );
    }

    /// Another journal's checkpoint file (another journal id) fails
    /// verification; a garbage `checkpoint.tmp` (a write cut short) is
    /// never read.
    #[test]
    fn a_foreign_checkpoint_is_refused_and_a_leftover_tmp_is_ignored() {
        let tmp = tempfile::tempdir().unwrap();
        let journal = |name: &str| {
            let dir = tmp.path().join(name);
            drop(checkpointed(&dir));
            dir
        };
        let (ours, theirs) = (journal("ours"), journal("theirs"));
        std::fs::write(ours.join(checkpoint_file::TMP), b"VMDJ garbage").unwrap();
        let (_, replay) = Journal::open(&JournalConfig::inspect(&ours, BOOT)).unwrap();
        assert!(replay.corruption.is_none(), "{:?}", replay.corruption);
        assert_eq!(replay.checkpoint.map(|c| c.through_seq), Some(3));
        assert_eq!(replay.tail.len(), 1);

        std::fs::copy(
            theirs.join(checkpoint_file::FILE),
            ours.join(checkpoint_file::FILE),
        )
        .unwrap();
        let (_, replay) = Journal::open(&JournalConfig::inspect(&ours, BOOT)).unwrap();
        let reason = replay
            .corruption
            .expect("another journal's checkpoint")
            .reason;
        assert!(reason.contains("checkpoint"), "{reason}");
    }

    /// A journal never checkpointed has no file and its first record is
    /// seq 1, in `records` or, once quarantined, in `quarantine`: nothing
    /// is missing.
    #[test]
    fn a_journal_never_checkpointed_needs_no_checkpoint_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("journal");
        let cfg = JournalConfig::new(&dir, "n", BOOT);
        let (j, _) = Journal::open(&cfg).unwrap();
        for i in 0..3 {
            j.append_record(outcome(i)).unwrap();
        }
        drop(j);
        let (_, replay) = Journal::open(&cfg).unwrap();
        assert!(replay.corruption.is_none() && replay.checkpoint.is_none());
        assert_eq!(replay.tail.len(), 3);
        assert!(!dir.join(checkpoint_file::FILE).exists());
        // seq 1 damaged: 1..=3 go to quarantine, later records start at 4
        {
            let db = sled_retrying(&dir);
            let records = db.open_tree("records").unwrap();
            let mut v = records.get(1u64.to_be_bytes()).unwrap().unwrap().to_vec();
            v[30] ^= 0xff;
            records.insert(1u64.to_be_bytes(), v).unwrap();
            db.flush().unwrap();
        }
        let (j, replay) = Journal::open(&cfg).unwrap();
        assert_eq!(replay.quarantined, vec![1, 2, 3]);
        assert_eq!(j.append_record(outcome(9)).unwrap(), 4);
        drop(j);
        let (_, replay) = Journal::open(&cfg).unwrap();
        assert!(replay.corruption.is_none(), "{:?}", replay.corruption);
        assert_eq!(replay.tail.len(), 1);
    }

    /// Bug found by `tests/journal_torture.rs`: sled's recovery zeroes its
    /// log from a damaged message to the end before it reports anything,
    /// so the journal moved aside held nothing past the damage (a flip at
    /// offset 5,000 left 0 of 524 record envelopes after it). The files as
    /// found are now copied first and kept in the journal moved aside.
    #[test]
    fn a_journal_moved_aside_keeps_sleds_files_as_they_were_found() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("journal");
        let cfg = JournalConfig::new(&dir, "n", BOOT);
        let (j, _) = Journal::open(&cfg).unwrap();
        for i in 0..100 {
            j.append_record(outcome(i)).unwrap();
            // the checkpoint file is kept with them: without it the copy
            // would not read back as the journal it was
            if i == 10 {
                j.checkpoint().unwrap();
            }
        }
        drop(j);
        let checkpoint = std::fs::read(dir.join(checkpoint_file::FILE)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        let mut db = std::fs::read(dir.join("db")).unwrap();
        db[5000] ^= 0xff;
        std::fs::write(dir.join("db"), &db).unwrap();
        let Err(JournalError::Corrupt {
            moved_to: Some(to), ..
        }) = Journal::open(&cfg)
        else {
            panic!("the flipped byte was not reported as corruption");
        };
        assert_eq!(
            std::fs::read(to.join(damage::AS_FOUND).join("db")).unwrap(),
            db
        );
        let kept = to.join(damage::AS_FOUND).join(checkpoint_file::FILE);
        assert_eq!(std::fs::read(kept).unwrap(), checkpoint);
        let note = std::fs::read_to_string(to.join(damage::NOTE)).unwrap();
        assert!(note.contains(damage::AS_FOUND), "{note}");
    }

    /// A journal of 20 records in a temp dir, closed, then opened and
    /// dropped once more by sled alone, which leaves a snapshot of its page
    /// table beside its log.
    fn twenty_records_snapshotted() -> (tempfile::TempDir, std::path::PathBuf, JournalConfig) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("journal");
        let cfg = JournalConfig::new(&dir, "n", BOOT);
        let (j, _) = Journal::open(&cfg).unwrap();
        for i in 0..20 {
            j.append_record(outcome(i)).unwrap();
        }
        drop(j);
        drop(sled_retrying(&dir));
        (tmp, dir, cfg)
    }

    /// Found by `tests/journal_torture.rs`: sled refuses to open a journal
    /// whose `snap.*` (a cache of its log) is damaged, and the whole
    /// journal was moved aside for it. The daemon now moves the snapshot
    /// aside and replays the log alone: every record is still there.
    #[test]
    fn a_damaged_snapshot_is_moved_aside_and_the_log_replayed() {
        let (_tmp, dir, cfg) = twenty_records_snapshotted();
        let snap = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("snap.")
            })
            .expect("sled wrote a snapshot");
        let mut bytes = std::fs::read(&snap).unwrap();
        bytes[0] ^= 0xff;
        std::fs::write(&snap, &bytes).unwrap();
        // An inspection only reports it.
        assert!(Journal::open(&JournalConfig::inspect(&dir, BOOT)).is_err());
        assert_eq!(std::fs::read(&snap).unwrap(), bytes);
        let (_, replay) = Journal::open(&cfg).unwrap();
        assert_eq!(replay.tail.len(), 20);
        let [aside] = replay.damage.moved_aside.as_slice() else {
            panic!("{:?}", replay.damage);
        };
        let name = snap.file_name().unwrap();
        assert_eq!(std::fs::read(aside.path.join(name)).unwrap(), bytes);
        assert!(
            aside
                .reason
                .as_deref()
                .unwrap_or_default()
                .contains("snapshot")
        );
    }

    /// Found by `tests/disk_faults.rs`: sled writes a snapshot to
    /// `snap.<lsn>.generating` before renaming it, and a full disk cuts it
    /// short; sled's next open took it for a snapshot and failed, so the
    /// start after the disk had room again moved sled's conf and snapshot
    /// aside (reported as damage). The daemon now removes it first.
    #[test]
    fn a_snapshot_left_unfinished_is_removed_not_reported_as_damage() {
        let (_tmp, dir, cfg) = twenty_records_snapshotted();
        let unfinished = dir.join("snap.00000000FFFFFFFF.generating");
        std::fs::write(&unfinished, b"cut short by ENOSPC").unwrap();
        let (_, replay) = Journal::open(&cfg).unwrap();
        assert_eq!(replay.tail.len(), 20);
        assert!(replay.damage.is_empty(), "{:?}", replay.damage);
        assert!(!unfinished.exists());
    }

    /// Found by `tests/journal_torture.rs`, like the snapshot above: a
    /// damaged `conf` (sled's settings, which volumed never changes) moved
    /// the whole journal aside. It is now moved aside alone.
    #[test]
    fn a_damaged_sled_conf_is_moved_aside_and_the_log_replayed() {
        let (_tmp, dir, cfg) = twenty_records_snapshotted();
        let mut conf = std::fs::read(dir.join("conf")).unwrap();
        conf[4] ^= 0xff;
        std::fs::write(dir.join("conf"), &conf).unwrap();
        let (_, replay) = Journal::open(&cfg).unwrap();
        assert_eq!(replay.tail.len(), 20);
        let [aside] = replay.damage.moved_aside.as_slice() else {
            panic!("{:?}", replay.damage);
        };
        assert_eq!(std::fs::read(aside.path.join("conf")).unwrap(), conf);
    }
}
