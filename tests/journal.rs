//! The journal on a real sled database: durability across SIGKILL, group
//! commit, checkpoint + tail replay, and every corruption path.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use volumed::journal::{
    Body, Category, Journal, JournalConfig, JournalError, JournalState, OpResult, SCHEMA_VERSION,
};
use volumed::model::{
    Operation, PluginName, PodUid, Steps, TargetKind, TargetParams, TargetRef, UniqueVolumeName,
};

const BOOT: &str = "11111111-2222-3333-4444-555555555555";

fn cfg(dir: &Path) -> JournalConfig {
    JournalConfig::new(dir, "node-a", BOOT)
}

/// Opens the journal's sled database directly (to damage it). A journal
/// just dropped may still hold sled's file lock for a moment, from a
/// background thread that has not exited yet (the journal's own open waits
/// for it the same way), so a lock error is retried for a few seconds.
fn open_sled(dir: &Path) -> sled::Db {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match sled::open(dir) {
            Ok(db) => return db,
            Err(e)
                if e.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => panic!("open sled at {}: {e}", dir.display()),
        }
    }
}

fn target(i: u64) -> TargetParams {
    let pod = PodUid::new(format!("pod-{}", i % 7)).unwrap();
    TargetParams::at(
        UniqueVolumeName::from_raw(format!("kubernetes.io/empty-dir/pod-{}-v{i}", i % 7)),
        PluginName::EmptyDir,
        format!("v{i}").into(),
        TargetRef::Pod(pod.clone()),
        TargetKind::Mount,
        Some(format!("/r/pods/{pod}/volumes/kubernetes.io~empty-dir/v{i}").into()),
    )
    .with_mount_options(vec![format!("size={i}k")].into())
    .with_fs_type(Some("tmpfs".into()))
}

fn intent(i: u64) -> Body {
    Body::Intent {
        op: Operation::SetUp,
        steps: Steps::Single,
        target: target(i).into(),
    }
}

/// A deterministic mix of intents and outcomes over a few targets.
fn workload(journal: &Journal, n: u64) {
    let mut pending = Vec::new();
    for i in 0..n {
        if i % 3 == 2
            && let Some(seq) = pending.pop()
        {
            let result = if i % 5 == 0 {
                OpResult::FailedFinal("exit 32".into())
            } else {
                OpResult::Success
            };
            journal
                .append_record(Body::Outcome {
                    intent_seq: seq,
                    op: Operation::SetUp,
                    result,
                    observed: None,
                })
                .unwrap();
            continue;
        }
        pending.push(journal.append_record(intent(i % 11)).unwrap());
    }
}

#[test]
fn append_survives_reopen_and_sequence_numbers_continue() {
    let dir = tempfile::tempdir().unwrap();
    let (j, replay) = Journal::open(&cfg(dir.path())).unwrap();
    assert!(replay.created);
    assert_eq!(j.append_record(intent(1)).unwrap(), 1);
    assert_eq!(j.append_record(intent(2)).unwrap(), 2);
    let before = j.state();
    j.close().unwrap();
    let (j, replay) = Journal::open(&cfg(dir.path())).unwrap();
    assert!(!replay.created);
    assert_eq!(replay.node_name, "node-a");
    assert_eq!(replay.tail.len(), 2);
    assert_eq!(j.state(), before);
    assert_eq!(j.append_record(intent(3)).unwrap(), 3);
}

/// sled's snapshot files (`snap.<log position in hex>`), newest last.
fn snapshots(dir: &Path) -> Vec<u64> {
    let mut lsns: Vec<u64> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().ok()?;
            u64::from_str_radix(name.strip_prefix("snap.")?, 16).ok()
        })
        .collect();
    lsns.sort_unstable();
    lsns
}

/// sled writes its snapshot only when it opens; a clean close leaves one
/// that covers every record, so the next start does not replay sled's log
/// message by message. A journal dropped without `close` (a crash) leaves
/// the snapshot of its open.
#[test]
fn a_clean_close_leaves_a_sled_snapshot_past_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(&cfg(dir.path())).unwrap();
    workload(&j, 200);
    drop(j);
    let after_crash = snapshots(dir.path());
    let (j, _) = Journal::open(&cfg(dir.path())).unwrap();
    let at_open = snapshots(dir.path());
    assert!(
        at_open.last() > after_crash.last(),
        "an open snapshots what it replayed: {after_crash:?} then {at_open:?}"
    );
    workload(&j, 200);
    j.close().unwrap();
    let at_close = snapshots(dir.path());
    assert!(
        at_close.last() > at_open.last(),
        "close snapshots the records written since the open: {at_open:?} then {at_close:?}"
    );
    let (j, replay) = Journal::open(&cfg(dir.path())).unwrap();
    assert_eq!(
        snapshots(dir.path()).last(),
        at_close.last(),
        "nothing left to replay: the open wrote no newer snapshot"
    );
    assert_eq!(replay.tail.len(), 400);
    assert_eq!(j.append_record(intent(1)).unwrap(), 401);
}

/// A clean close folds a tail of 1,024 records or more that outnumbers the
/// targets into a checkpoint, so the next start decodes the targets once
/// instead of replaying every record; a shorter tail, or one the targets
/// outnumber, stays as it is. The state is the same either way.
/// `long_tail`, which the daemon's start goes by, answers the same rule.
#[test]
fn a_clean_close_checkpoints_a_tail_longer_than_the_state() {
    // (records appended, tail left for the next open)
    let cases: [(u64, Option<usize>); 2] = [(1000, Some(1000)), (1200, None)];
    for (n, tail) in cases {
        let dir = tempfile::tempdir().unwrap();
        let (j, _) = Journal::open(&cfg(dir.path())).unwrap();
        workload(&j, n);
        let before = j.state();
        assert!(before.len() < 20, "a few targets");
        let long = if tail.is_some() { 0 } else { n };
        assert_eq!(j.long_tail(), long, "{n} records");
        j.close().unwrap();
        let (j, replay) = Journal::open(&cfg(dir.path())).unwrap();
        match tail {
            Some(t) => {
                assert_eq!(replay.tail.len(), t, "{n} records: short, kept");
                assert!(replay.checkpoint.is_none());
            }
            None => {
                assert!(replay.tail.is_empty(), "{n} records: folded");
                let ck = replay.checkpoint.expect("a checkpoint at close");
                assert_eq!(ck.through_seq, n);
            }
        }
        assert_eq!(j.state(), before, "{n} records");
        assert_eq!(j.append_record(intent(1)).unwrap(), n + 1);
        drop(j);
    }

    // 1,100 targets written once each: the tail does not outnumber them
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(&cfg(dir.path())).unwrap();
    for i in 0..1100 {
        let mut t = target(i);
        t.volume = UniqueVolumeName::from_raw(format!("kubernetes.io/empty-dir/solo-{i}"));
        j.append_record(Body::Intent {
            op: Operation::SetUp,
            steps: Steps::Single,
            target: t.into(),
        })
        .unwrap();
    }
    assert_eq!(j.long_tail(), 0, "outnumbered by its targets");
    j.close().unwrap();
    let (_, replay) = Journal::open(&cfg(dir.path())).unwrap();
    assert_eq!(replay.tail.len(), 1100);
    assert!(replay.checkpoint.is_none());
}

/// `open_then` calls its function once, with sled's lock already held:
/// what the daemon starts there (its read of the mount table) cannot race
/// with another process that still holds the journal.
#[test]
fn open_then_calls_back_once_holding_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(&cfg(dir.path())).unwrap();
    workload(&j, 10);
    j.close().unwrap();
    let calls = std::cell::Cell::new(0);
    let (j, replay) = Journal::open_then(&cfg(dir.path()), || {
        calls.set(calls.get() + 1);
        let other = Journal::open(&JournalConfig::inspect(dir.path(), BOOT));
        assert!(
            matches!(&other, Err(e) if e.category() == Category::Busy),
            "another open while the callback runs: {:?}",
            other.map(|_| ())
        );
    })
    .unwrap();
    assert_eq!(calls.get(), 1);
    assert_eq!(replay.tail.len(), 10);
    // held by `j`: a second daemon's open never gets to call back
    let held = Journal::open_then(&cfg(dir.path()), || calls.set(calls.get() + 1));
    assert!(matches!(&held, Err(e) if e.category() == Category::Busy));
    assert_eq!(calls.get(), 1);
    drop(j);
}

/// `append_record_lazy` (operation outcomes) is not waited for: it becomes durable
/// with the next durable append or `flush_pending`, in log order.
#[test]
fn lazy_appends_become_durable_with_the_next_flush() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(&cfg(dir.path())).unwrap();
    assert!(!j.has_pending());
    j.flush_pending().unwrap();
    let flushes = j.flush_count();
    let lazy = j.append_record_lazy(intent(1)).unwrap();
    assert!(j.has_pending());
    assert!(j.synced_through() < lazy);
    assert_eq!(j.flush_count(), flushes, "no flush of its own");
    let durable = j.append_record(intent(2)).unwrap();
    assert!(j.synced_through() >= durable && durable > lazy);
    assert!(!j.has_pending(), "the later append carried the lazy one");
    let lazy = j.append_record_lazy(intent(3)).unwrap();
    j.flush_pending().unwrap();
    assert!(j.synced_through() >= lazy);
    assert!(!j.has_pending());
    let before = j.state();
    j.close().unwrap();
    let (j, replay) = Journal::open(&cfg(dir.path())).unwrap();
    assert_eq!(replay.tail.len(), 3);
    assert_eq!(j.state(), before);
}

#[test]
fn replay_of_checkpoint_plus_tail_equals_replay_of_everything() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(&cfg(dir.path())).unwrap();
    workload(&j, 300);
    let mut all: Vec<_> = Vec::new();
    // Keep every record as written so far, to replay them from scratch.
    {
        let (_, replay) = {
            drop(j);
            Journal::open(&cfg(dir.path())).unwrap()
        };
        all.extend(replay.tail);
    }
    let (j, _) = Journal::open(&cfg(dir.path())).unwrap();
    let report = j.checkpoint().unwrap();
    assert_eq!(report.through_seq, 300);
    assert_eq!(report.dropped, 300);
    workload(&j, 100);
    drop(j);
    let (j, replay) = Journal::open(&cfg(dir.path())).unwrap();
    assert_eq!(replay.checkpoint.as_ref().unwrap().through_seq, 300);
    assert_eq!(replay.tail.len(), 100);
    assert_eq!(replay.tail[0].seq, 301);
    all.extend(replay.tail.iter().cloned());
    let mut from_scratch = JournalState::default();
    for r in &all {
        from_scratch.apply(r);
    }
    let replayed = j.state();
    assert_eq!(
        replayed.entries().collect::<Vec<_>>(),
        from_scratch.entries().collect::<Vec<_>>()
    );
    assert!(
        replayed.entries().any(|(_, e)| e.pending.is_some()),
        "pending intents survive the checkpoint"
    );
}

#[test]
fn concurrent_appenders_share_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(&cfg(dir.path())).unwrap();
    let j = Arc::new(j);
    let threads = 64;
    let per_thread = 20;
    let barrier = Arc::new(std::sync::Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let j = j.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                (0..per_thread)
                    .map(|i| {
                        j.append_record(intent((t * per_thread + i) as u64))
                            .unwrap()
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut seqs: Vec<u64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    seqs.sort_unstable();
    let n = (threads * per_thread) as u64;
    assert_eq!(
        seqs,
        (1..=n).collect::<Vec<_>>(),
        "every append got its own sequence number"
    );
    let flushes = j.flush_count();
    assert!(
        flushes < n / 2,
        "{n} appends from {threads} threads caused {flushes} flushes"
    );
    assert!(j.synced_through() >= n);
}

/// The child side of the SIGKILL test: appends forever, printing each
/// acknowledged sequence number. Runs only when re-executed by the parent.
#[test]
fn child_appender() {
    let Ok(dir) = std::env::var("VOLUMED_TEST_CHILD_JOURNAL") else {
        return;
    };
    let (j, _) = Journal::open(&cfg(Path::new(&dir))).unwrap();
    let mut out = std::io::stdout().lock();
    for i in 0.. {
        let seq = j.append_record(intent(i)).unwrap();
        use std::io::Write;
        writeln!(out, "ACK {seq}").unwrap();
        out.flush().unwrap();
    }
}

#[test]
fn every_acknowledged_record_survives_sigkill() {
    for round in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_appender",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("VOLUMED_TEST_CHILD_JOURNAL", dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut acked = 0u64;
        let stop_after = 200 + round * 150;
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if let Some(seq) = line.strip_prefix("ACK ") {
                acked = seq.parse().unwrap();
                if acked >= stop_after {
                    nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(child.id() as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    )
                    .unwrap();
                    break;
                }
            }
        }
        let status = child.wait().unwrap();
        assert!(!status.success(), "the child was killed");
        assert!(acked >= stop_after);
        let (_, replay) = Journal::open(&cfg(dir.path())).unwrap();
        let last = replay.tail.last().map(|r| r.seq).unwrap_or(0);
        assert!(
            last >= acked,
            "acknowledged {acked}, recovered through {last}"
        );
        let seqs: Vec<u64> = replay.tail.iter().map(|r| r.seq).collect();
        assert_eq!(
            seqs,
            (1..=last).collect::<Vec<_>>(),
            "no hole in the recovered records"
        );
    }
}

#[test]
fn a_bad_value_stops_replay_at_its_sequence_number_and_is_quarantined() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(&cfg(dir.path())).unwrap();
    for i in 0..10 {
        j.append_record(intent(i)).unwrap();
    }
    drop(j);
    {
        let db = open_sled(dir.path());
        let records = db.open_tree("records").unwrap();
        let mut v = records.get(5u64.to_be_bytes()).unwrap().unwrap().to_vec();
        v[30] ^= 0x40;
        records.insert(5u64.to_be_bytes(), v).unwrap();
        db.flush().unwrap();
    }
    // An inspection tool reports it and changes nothing.
    let (j, replay) = Journal::open(&JournalConfig::inspect(dir.path(), BOOT)).unwrap();
    let c = replay.corruption.clone().expect("corruption reported");
    assert_eq!(c.seq, 5);
    assert!(c.reason.contains("checksum"), "{}", c.reason);
    assert_eq!(replay.tail.len(), 4);
    assert!(replay.quarantined.is_empty());
    drop(j);
    // The daemon quarantines 5..=10 and goes on from 11.
    let (j, replay) = Journal::open(&cfg(dir.path())).unwrap();
    assert_eq!(replay.corruption.unwrap().seq, 5);
    assert_eq!(replay.quarantined, (5..=10).collect::<Vec<_>>());
    assert_eq!(j.append_record(intent(99)).unwrap(), 11);
    drop(j);
    let (_, replay) = Journal::open(&cfg(dir.path())).unwrap();
    assert!(replay.corruption.is_none());
    assert_eq!(
        replay.tail.iter().map(|r| r.seq).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 11]
    );
    let db = open_sled(dir.path());
    assert_eq!(
        db.open_tree("quarantine").unwrap().len(),
        6,
        "quarantined records are kept"
    );
}

fn flip_bytes(file: &Path, offset: u64, len: usize) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .unwrap();
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, offset).unwrap();
    for b in &mut buf {
        *b ^= 0xff;
    }
    f.write_all_at(&buf, offset).unwrap();
}

fn corrupt_dirs(parent: &Path, name: &str) -> Vec<PathBuf> {
    std::fs::read_dir(parent)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{name}.corrupt-")))
        })
        .collect()
}

#[test]
fn flipped_bytes_in_sleds_files_move_the_journal_aside() {
    // Offsets across the log: sled silently truncates at a bad message, the
    // watermark turns that into a typed error. (A damaged `conf`, sled's
    // settings, no longer costs the journal: journal::open's unit tests.)
    let cases: &[(&str, u64)] = &[("db", 0), ("db", 1000), ("db", 20_000)];
    for &(file, offset) in cases {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("journal");
        let (j, _) = Journal::open(&cfg(&dir)).unwrap();
        for i in 0..200 {
            j.append_record(intent(i)).unwrap();
        }
        drop(j);
        let size = std::fs::metadata(dir.join(file)).unwrap().len();
        flip_bytes(&dir.join(file), offset.min(size - 16), 16);
        let err = Journal::open(&cfg(&dir)).expect_err(&format!("{file}@{offset} not detected"));
        assert_eq!(
            err.category(),
            Category::Corruption,
            "{file}@{offset}: {err}"
        );
        let JournalError::Corrupt {
            moved_to: Some(to), ..
        } = &err
        else {
            panic!("{file}@{offset}: not moved aside: {err}");
        };
        assert!(to.exists() && !dir.exists(), "moved, not deleted");
        assert_eq!(corrupt_dirs(parent.path(), "journal"), vec![to.clone()]);
        assert!(to.join(file).exists());
        // The next start gets a fresh journal.
        let (_, replay) = Journal::open(&cfg(&dir)).unwrap();
        assert!(replay.created, "{file}@{offset}");
    }
}

#[test]
fn a_lost_tail_after_a_reboot_is_reported_not_fatal() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("journal");
    let (j, _) = Journal::open(&cfg(&dir)).unwrap();
    for i in 0..200 {
        j.append_record(intent(i)).unwrap();
    }
    drop(j);
    flip_bytes(&dir.join("db"), 20_000, 16);
    let after_reboot = JournalConfig::new(&dir, "node-a", "99999999-2222-3333-4444-555555555555");
    let damaged = std::fs::read(dir.join("db")).unwrap();
    let (_, replay) = Journal::open(&after_reboot).unwrap();
    let (acked, recovered) = replay.lost_tail.expect("lost tail reported");
    assert_eq!(acked, 200);
    assert!(recovered < 200);
    // sled zeroed what it could not read; the files as found are kept aside.
    assert_eq!(replay.damage.lost_tail, Some((acked, recovered)));
    let [kept] = replay.damage.moved_aside.as_slice() else {
        panic!("{:?}", replay.damage);
    };
    assert_eq!(
        corrupt_dirs(parent.path(), "journal"),
        vec![kept.path.clone()]
    );
    assert_eq!(std::fs::read(kept.path.join("db")).unwrap(), damaged);
    assert!(
        kept.reason
            .as_deref()
            .unwrap_or_default()
            .contains("reboot")
    );
}

#[test]
fn a_newer_schema_version_moves_the_journal_aside() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("journal");
    let (j, _) = Journal::open(&cfg(&dir)).unwrap();
    j.append_record(intent(1)).unwrap();
    drop(j);
    {
        let db = open_sled(&dir);
        let meta = db.open_tree("meta").unwrap();
        meta.insert(
            "schema_version",
            (SCHEMA_VERSION + 1).to_le_bytes().to_vec(),
        )
        .unwrap();
        db.flush().unwrap();
    }
    let err = Journal::open(&JournalConfig::inspect(&dir, BOOT)).unwrap_err();
    assert!(
        matches!(err, JournalError::NewerSchema { moved_to: None, .. }),
        "{err}"
    );
    assert!(dir.exists(), "inspection moves nothing");
    let err = Journal::open(&cfg(&dir)).unwrap_err();
    let JournalError::NewerSchema {
        found,
        supported,
        moved_to: Some(to),
        ..
    } = &err
    else {
        panic!("{err}");
    };
    assert_eq!((*found, *supported), (SCHEMA_VERSION + 1, SCHEMA_VERSION));
    assert!(to.exists() && !dir.exists());
    assert_eq!(err.category(), Category::Corruption);
    assert!(err.to_string().contains("newer than this build"), "{err}");
}

#[test]
fn a_locked_journal_is_busy_and_a_missing_one_is_not_created_by_inspection() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nothing-here");
    let err = Journal::open(&JournalConfig::inspect(&missing, BOOT)).unwrap_err();
    assert_eq!(err.category(), Category::NotFound);
    assert!(!missing.exists());
    let (_j, _) = Journal::open(&cfg(dir.path())).unwrap();
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_open_reports_busy", "--nocapture"])
        .env("VOLUMED_TEST_BUSY_JOURNAL", dir.path())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&child.stdout);
    assert!(out.contains("BUSY"), "child said: {out}");
}

/// Child side: sled's lock is per process (flock), so the busy case needs a
/// second process.
#[test]
fn child_open_reports_busy() {
    let Ok(dir) = std::env::var("VOLUMED_TEST_BUSY_JOURNAL") else {
        return;
    };
    match Journal::open(&JournalConfig::inspect(Path::new(&dir), BOOT)) {
        Err(e) if e.category() == Category::Busy => println!("BUSY {e}"),
        other => println!("UNEXPECTED {:?}", other.map(|_| ())),
    }
}

#[test]
fn current_reads_the_open_journal_like_a_reopen_would() {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(&cfg(dir.path())).unwrap();
    workload(&j, 30);
    j.checkpoint().unwrap();
    workload(&j, 12);
    let live = j.current("node-a").unwrap();
    let live_state = j.into_state();
    let (j, reopened) = Journal::open(&cfg(dir.path())).unwrap();
    assert_eq!(live.tail, reopened.tail);
    assert_eq!(live.checkpoint, reopened.checkpoint);
    assert_eq!(live_state, j.state());
    assert_eq!(live.tail.len(), 12);
}

#[test]
fn a_batch_of_a_thousand_costs_one_flush_and_replays_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("j");
    let (j, _) = Journal::open(&cfg(&dir)).unwrap();
    let first = j.append_record(intent(0)).unwrap();
    assert!(j.append_records(Vec::new()).unwrap().is_empty());
    let flushes = j.flush_count();
    let bodies: Vec<Body> = (1..=1_000).map(intent).collect();
    let seqs = j.append_records(bodies.clone()).unwrap();
    assert_eq!(
        seqs,
        (first + 1..=first + 1_000).collect::<Vec<_>>(),
        "consecutive sequence numbers, in order"
    );
    assert_eq!(
        j.flush_count() - flushes,
        1,
        "one flush for the whole batch"
    );
    assert!(j.synced_through() >= first + 1_000);
    let live = j.state();
    drop(j);

    let (j, replay) = Journal::open(&cfg(&dir)).unwrap();
    let tail: Vec<(u64, &Body)> = replay.tail.iter().map(|r| (r.seq, &r.body)).collect();
    let want: Vec<(u64, &Body)> = seqs.iter().copied().zip(&bodies).collect();
    assert_eq!(tail.first().map(|t| t.0), Some(first));
    assert_eq!(&tail[1..], &want[..], "replayed in order");
    assert_eq!(j.state(), live, "replay implies the state the writer built");
}
