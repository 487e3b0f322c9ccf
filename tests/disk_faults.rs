//! The journal on a disk that fails under it, with real faults: a small
//! tmpfs filled to the last byte (ENOSPC at the write itself), and a
//! loop-backed ext4 remounted read-only. A failed write leaves the journal
//! unwritable, never closed, never moved aside: [`Journal::recover`] writes
//! what waited once the disk takes writes again, and an open on a full disk
//! either works or ends with the journal as it was.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::io::Write;
use std::path::{Path, PathBuf};

use volumed::journal::{
    Body, Category, Journal, JournalConfig, JournalError, OpResult, environmental,
};
use volumed::model::{
    Operation, PluginName, PodUid, Steps, TargetKind, TargetParams, TargetRef, UniqueVolumeName,
};

const BOOT: &str = "d15cfa11-2222-3333-4444-555555555555";

fn target(i: u64) -> std::sync::Arc<TargetParams> {
    let pod = PodUid::new(format!("pod-{i}")).unwrap();
    std::sync::Arc::new(TargetParams::at(
        UniqueVolumeName::from_raw(format!("kubernetes.io/empty-dir/pod-{i}-cache")),
        PluginName::EmptyDir,
        "cache".into(),
        TargetRef::Pod(pod.clone()),
        TargetKind::Dir,
        Some(format!("/r/pods/{pod}/volumes/kubernetes.io~empty-dir/cache").into()),
    ))
}

fn intent(i: u64) -> Body {
    Body::Intent {
        op: Operation::SetUp,
        steps: Steps::Single,
        target: target(i),
    }
}

fn outcome(intent_seq: u64) -> Body {
    Body::Outcome {
        intent_seq,
        op: Operation::SetUp,
        result: OpResult::Success,
        observed: None,
    }
}

/// Fills the filesystem holding `dir` to its last byte with one file, and
/// returns it (removing it frees the space). The last writes go one byte at
/// a time, so not even a partial block is left.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    for chunk in [1 << 16, 1 << 12, 1] {
        let buf = vec![0xa5u8; chunk];
        loop {
            match f.write(&buf) {
                Ok(n) if n == chunk => {}
                Ok(_) => continue,
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => break,
                Err(e) => panic!("fill {}: {e}", path.display()),
            }
        }
    }
    path
}

/// Journals moved aside beside `dir` (`<dir>.corrupt-*`).
fn moved_aside(dir: &Path) -> Vec<PathBuf> {
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::read_dir(dir.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&format!("{name}.corrupt-"))
        })
        .collect()
}

/// The records a fresh open replays: (seq, whether an intent).
fn replayed(dir: &Path) -> Vec<(u64, bool)> {
    let (j, replay) = Journal::open(&JournalConfig::new(dir, "node", BOOT)).unwrap();
    drop(j);
    replay
        .tail
        .iter()
        .map(|r| (r.seq, matches!(r.body, Body::Intent { .. })))
        .collect()
}

/// A journal on a 4 MiB tmpfs: writing until the disk is full makes a
/// write or a flush fail with ENOSPC. From then on nothing durable is
/// accepted, the outcomes appended lazily are kept in memory, and once
/// the filler is gone `recover` makes every one of them durable: a fresh
/// open replays all records, none moved aside.
#[test]
fn a_full_disk_leaves_the_journal_unwritable_until_a_recovery_writes_what_waited() {
    if !support::require_root("mount a tmpfs") {
        return;
    }
    support::in_private_mount_ns(|| {
        let scratch = support::Scratch::new("disk-full");
        let fs = scratch.path().join("fs");
        support::mkdirs(&fs);
        support::mount_tmpfs(&fs, "size=4m");
        let dir = fs.join("journal");
        let (j, _) = Journal::open(&JournalConfig::new(&dir, "node", BOOT)).unwrap();
        let mut durable = Vec::new();
        for i in 0..20 {
            durable.push(j.append_record(intent(i)).unwrap());
        }
        let filler = fill(&fs);
        // Records keep coming until one fails: the first failure is the
        // disk's (sled buffers some writes in memory first).
        let mut failed = None;
        for i in 20..20_000 {
            match j.append_record(intent(i)) {
                Ok(seq) => durable.push(seq),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let failed = failed.expect("a full disk failed no write");
        assert_eq!(failed.category(), Category::Io, "{failed}");
        assert!(
            matches!(&failed, JournalError::Flush { reason, .. } if reason.contains("No space left")),
            "{failed}"
        );
        let reason = j
            .unwritable_reason()
            .expect("the journal says it is unwritable");
        assert!(reason.contains("No space left"), "{reason}");
        assert!(
            j.write_errors()
                .iter()
                .any(|(errno, n)| errno == "ENOSPC" && *n > 0),
            "{:?}",
            j.write_errors()
        );
        // An intent is refused up front; an outcome is kept in memory.
        let last = *durable.last().unwrap();
        assert!(matches!(
            j.begin(Operation::SetUp, Steps::Single, &target(1)),
            Err(JournalError::Flush { .. })
        ));
        let kept = j.append_record_lazy(outcome(last)).unwrap();
        // Still full: a recovery fails, and changes nothing.
        assert!(j.recover().is_err());
        assert!(j.unwritable_reason().is_some());
        std::fs::remove_file(&filler).unwrap();
        assert!(j.recover().unwrap(), "the recovery wrote again");
        assert_eq!(j.unwritable_reason(), None);
        assert!(j.synced_through() >= kept);
        // writable again: an intent is durable as before
        let after = j.append_record(intent(99_999)).unwrap();
        j.close().unwrap();
        let seqs = replayed(&dir);
        for seq in durable.iter().chain([&kept, &after]) {
            assert!(
                seqs.iter().any(|(s, _)| s == seq),
                "record {seq} lost; replayed {}",
                seqs.len()
            );
        }
        assert!(moved_aside(&dir).is_empty());
    });
}

/// A journal written, closed, then its disk filled: an open either works
/// (sled needs no new block to read) or fails as the host's error, and in
/// both cases nothing is moved aside or dropped; with space again every
/// record is there.
#[test]
fn an_open_on_a_full_disk_moves_nothing_aside_and_loses_nothing() {
    if !support::require_root("mount a tmpfs") {
        return;
    }
    support::in_private_mount_ns(|| {
        let scratch = support::Scratch::new("disk-full-open");
        let fs = scratch.path().join("fs");
        support::mkdirs(&fs);
        support::mount_tmpfs(&fs, "size=4m");
        let dir = fs.join("journal");
        let (j, _) = Journal::open(&JournalConfig::new(&dir, "node", BOOT)).unwrap();
        let mut seqs = Vec::new();
        for i in 0..50 {
            let seq = j.append_record(intent(i)).unwrap();
            seqs.push(seq);
            seqs.push(j.append_record(outcome(seq)).unwrap());
        }
        // dropped, not closed: the next open runs sled's recovery and
        // takes an as-found copy, both of which want room
        drop(j);
        let filler = fill(&fs);
        for _ in 0..3 {
            match Journal::open(&JournalConfig::new(&dir, "node", BOOT)) {
                Ok((j, replay)) => {
                    assert_eq!(replay.tail.len(), seqs.len());
                    drop(j);
                }
                Err(e) => {
                    assert_eq!(e.category(), Category::Io, "{e}");
                    assert!(e.to_string().contains("nothing was moved aside"), "{e}");
                    assert!(
                        matches!(&e, JournalError::Unavailable { cause, .. } if environmental(cause)),
                        "{e:?}"
                    );
                }
            }
            assert!(moved_aside(&dir).is_empty(), "{:?}", moved_aside(&dir));
            assert!(!dir.join("as-found").exists(), "a partial copy was left");
        }
        std::fs::remove_file(&filler).unwrap();
        let got: Vec<u64> = replayed(&dir).into_iter().map(|(s, _)| s).collect();
        assert_eq!(got, seqs);
        assert!(moved_aside(&dir).is_empty());
    });
}
