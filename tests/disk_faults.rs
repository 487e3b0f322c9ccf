//! The journal on a disk that fails under it, with real faults: a small
//! tmpfs filled to the last byte (ENOSPC at the write itself), and a
//! loop-backed ext4 remounted read-only. A failed write leaves the journal
//! unwritable, never closed, never moved aside: [`Journal::recover`] writes
//! what waited once the disk takes writes again, and an open on a full disk
//! either works or ends with the journal as it was.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

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
        let filler = support::fill_fs(&fs);
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
        // An intent announced (appended unflushed) that cannot be confirmed
        // never starts, and the journal closes it with a final failure.
        let announced = j
            .announce(Operation::SetUp, Steps::Single, &target(2))
            .unwrap();
        let never = announced.seq();
        assert!(j.confirm(announced).is_err());
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
        for seq in durable.iter().chain([&kept, &after, &never]) {
            assert!(
                seqs.iter().any(|(s, _)| s == seq),
                "record {seq} lost; replayed {}",
                seqs.len()
            );
        }
        assert!(moved_aside(&dir).is_empty());
        let (j, _) = Journal::open(&JournalConfig::new(&dir, "node", BOOT)).unwrap();
        let closed = j.with_state(|s| {
            s.entries()
                .filter_map(|(_, e)| e.pending.as_ref())
                .all(|p| p.intent_seq != never)
        });
        assert!(closed, "the intent that never started is still pending");
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
        let filler = support::fill_fs(&fs);
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

/// Copies the dir `from` to `to` (the fixtures are flat but for `blobs/`).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// A journal of schema 3 (the committed fixture) opened on a full disk:
/// its migration to the current schema cannot write, which is the host's
/// error, not damage: nothing is moved aside, and with room again the
/// migration runs and every record is there.
#[test]
fn a_migration_on_a_full_disk_moves_nothing_aside() {
    if !support::require_root("mount a tmpfs") {
        return;
    }
    support::in_private_mount_ns(|| {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/journal/v3/journal");
        let scratch = support::Scratch::new("disk-full-migrate");
        // what the fixture replays to with room
        let roomy = scratch.path().join("roomy");
        copy_dir(&fixture, &roomy);
        let (j, want) = Journal::open(&JournalConfig::new(&roomy, "node", BOOT)).unwrap();
        drop(j);
        assert!(want.schema_version > 3 && !want.tail.is_empty());
        let fs = scratch.path().join("fs");
        support::mkdirs(&fs);
        support::mount_tmpfs(&fs, "size=4m");
        let dir = fs.join("journal");
        copy_dir(&fixture, &dir);
        // An inspection first (it does not migrate): sled's own recovery
        // and snapshot are written while there is room, so what the full
        // disk refuses next is the migration's writes.
        let (j, _) = Journal::open(&JournalConfig::inspect(&dir, BOOT)).unwrap();
        drop(j);
        let filler = support::fill_fs(&fs);
        match Journal::open(&JournalConfig::new(&dir, "node", BOOT)) {
            Err(e) => {
                assert_eq!(e.category(), Category::Io, "{e}");
                assert!(matches!(e, JournalError::Unavailable { .. }), "{e:?}");
            }
            Ok(_) => panic!("a migration on a full disk wrote nothing"),
        }
        assert!(moved_aside(&dir).is_empty(), "{:?}", moved_aside(&dir));
        std::fs::remove_file(&filler).unwrap();
        let (_, got) = Journal::open(&JournalConfig::new(&dir, "node", BOOT)).unwrap();
        assert_eq!(got.schema_version, want.schema_version);
        let seqs = |r: &volumed::journal::Replay| r.tail.iter().map(|r| r.seq).collect::<Vec<_>>();
        assert_eq!(seqs(&got), seqs(&want));
        assert!(moved_aside(&dir).is_empty());
    });
}

// ------------------------------------------------------- the daemon itself

mod daemon {
    use std::path::{Path, PathBuf};
    use std::time::{Duration, Instant};

    use serde_json::Value;

    use super::moved_aside;
    use super::support::daemon::{Daemon, Env, real, series};
    use super::support::{LoopDevice, mkfs_ext4, mount_device};

    /// A pod with one memory emptyDir `cache` (a tmpfs: its mount needs no
    /// room on the root's disk, only its dir does).
    fn pod(uid: &str) -> String {
        format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: {uid}, namespace: default, uid: {uid}}}
spec:
  containers: [{{name: app, image: busybox, volumeMounts: [{{name: cache, mountPath: /cache}}]}}]
  volumes:
  - name: cache
    emptyDir: {{medium: Memory, sizeLimit: 1Mi}}
"
        )
    }

    /// The env with its root (and so the journal, the manifest cache and
    /// daemon.json) on a 32 MiB ext4 of its own; returns the disk's mount
    /// point and its loop device.
    fn on_small_ext4(env: &mut Env, options: &str) -> (PathBuf, LoopDevice) {
        let image = env.scratch.path().join("disk.img");
        mkfs_ext4(&image, 32);
        let dev = LoopDevice::attach(&image);
        let disk = env.scratch.path().join("disk");
        super::support::mkdirs(&disk);
        if options.is_empty() {
            mount_device(dev.path(), &disk, "ext4");
        } else {
            nix::mount::mount(
                Some(dev.path()),
                &disk,
                Some("ext4"),
                nix::mount::MsFlags::empty(),
                Some(options),
            )
            .unwrap();
        }
        env.root = disk.join("root");
        env.journal = env.root.join("volumed");
        (disk, dev)
    }

    fn cache_of(env: &Env, uid: &str) -> PathBuf {
        env.pod_volume(uid, "kubernetes.io~empty-dir", "cache")
    }

    fn is_tmpfs_mount(env: &Env, uid: &str) -> bool {
        let want = cache_of(env, uid);
        env.mounts_below_root()
            .iter()
            .any(|m| m.mount_point == want && m.fs_type == "tmpfs")
    }

    fn plugin_ops(d: &Daemon) -> f64 {
        series(&d.metrics(), "volumed_plugin_operations_total")
            .iter()
            .map(|(_, v)| v)
            .sum()
    }

    /// The SetUp intents the journal holds, by pod uid.
    fn setups(dump: &Value) -> std::collections::BTreeMap<String, usize> {
        let mut by_pod = std::collections::BTreeMap::new();
        for r in dump["records"].as_array().unwrap() {
            if r["type"] == "intent" && r["op"] == "setup" {
                let pod = r["pod_uid"].as_str().unwrap_or_default().to_owned();
                *by_pod.entry(pod).or_default() += 1;
            }
        }
        by_pod
    }

    /// The pods whose SetUp intent the journal holds.
    fn journaled_pods(dump: &Value) -> Vec<String> {
        setups(dump).into_keys().collect()
    }

    /// `/readyz` answers 503 naming the unwritable journal.
    fn degraded(d: &Daemon) -> bool {
        let (status, body) = d.try_get("/readyz");
        status == 503 && body.contains("journal cannot be written")
    }

    /// Starts the daemon and waits until it exits (`Err`: its exit code
    /// and log) or serves HTTP.
    fn exited_or_serving(env: &mut Env) -> Result<Daemon, (Option<i32>, String)> {
        let mut d = env.spawn();
        let pid = d.child.borrow().id();
        let json = env.journal.join("daemon.json");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = d.child.borrow_mut().try_wait().unwrap() {
                d.exited.set(true);
                return Err((status.code(), d.log()));
            }
            if d.wrote_json(&json, pid) {
                let info: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
                d.addr = Some(info["listen"].as_str().unwrap().parse().unwrap());
                return Ok(d);
            }
            assert!(Instant::now() < deadline, "{}", d.log_tail());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The new user: volumed's root on a small ext4, two pods
    /// mounted, the disk filled to the last block, a third pod added. The
    /// daemon says it is not ready (503 with the reason, the metrics, an
    /// event naming the disk and its free space), keeps both mounts, and
    /// once space is freed mounts the third pod by itself, with no
    /// operation re-issued for the first two. Killed (SIGKILL) with the
    /// disk full again and a fourth pod waiting, it restarts without
    /// moving the journal aside (exiting 75 while it cannot write, or
    /// running unready), and with room again `dump` holds every pod's
    /// records and all four are mounted.
    #[test]
    fn a_full_root_disk_degrades_the_daemon_and_it_goes_on_by_itself() {
        real("an ext4 root on a loop device, filled", || {
            let mut env = Env::new("disk-full-daemon");
            let (disk, _dev) = on_small_ext4(&mut env, "");
            env.write_pod("a.yaml", &pod("pod-a"));
            env.write_pod("b.yaml", &pod("pod-b"));
            let d = env.start();
            d.wait_until("a and b mounted", || {
                is_tmpfs_mount(&env, "pod-a") && is_tmpfs_mount(&env, "pod-b")
            });
            d.wait_until("both SetUps counted", || plugin_ops(&d) == 2.0);

            let filler = super::support::fill_fs(&disk);
            env.write_pod("c.yaml", &pod("pod-c"));
            d.wait_until("/readyz 503 naming the journal", || degraded(&d));
            let metrics = d.metrics();
            assert_eq!(
                series(&metrics, "volumed_journal_writable"),
                vec![("volumed_journal_writable".to_owned(), 0.0)]
            );
            let enospc = series(&metrics, "volumed_journal_write_errors_total");
            assert!(
                enospc
                    .iter()
                    .any(|(k, v)| k.contains("ENOSPC") && *v >= 1.0),
                "{enospc:?}"
            );
            let events = d.get("/debug/events");
            let mount_point = disk.display().to_string();
            assert!(
                events.contains("JournalUnwritable")
                    && events.contains(&format!("mounted at {mount_point}"))
                    && events.contains("free of"),
                "{events}"
            );
            assert!(is_tmpfs_mount(&env, "pod-a") && is_tmpfs_mount(&env, "pod-b"));
            assert!(!is_tmpfs_mount(&env, "pod-c"));
            // it stays degraded while the disk is full (several recoveries)
            std::thread::sleep(Duration::from_secs(2));
            assert!(degraded(&d) && !is_tmpfs_mount(&env, "pod-c"));

            std::fs::remove_file(&filler).unwrap();
            d.wait_until("/readyz 200 again", || d.try_get("/readyz").0 == 200);
            d.wait_until("c mounted", || is_tmpfs_mount(&env, "pod-c"));
            // Nothing re-issued for a and b: one SetUp each, ever (c may
            // have one more, failed for lack of room for its dir).
            let counts = setups(&env.dump());
            assert_eq!((counts["pod-a"], counts["pod-b"]), (1, 1), "{counts:?}");
            assert!(d.get("/debug/events").contains("JournalWritable"));
            assert_eq!(series(&d.metrics(), "volumed_journal_writable")[0].1, 1.0);

            let c_setups = counts["pod-c"];
            // Full again, d waiting: SIGKILL, then a start on the full disk.
            let filler = super::support::fill_fs(&disk);
            env.write_pod("d.yaml", &pod("pod-d"));
            // Whether the journal or d's dir meets the full disk first
            // depends on the room sled's log had left after the recovery.
            d.wait_until("d refused for lack of room", || {
                degraded(&d) || d.pod_errors("pod-d").contains("No space left")
            });
            d.kill();
            let restarted = exited_or_serving(&mut env);
            match &restarted {
                Err((code, log)) => {
                    assert_eq!(*code, Some(75), "EX_TEMPFAIL\n{log}");
                    assert!(log.contains("nothing was moved aside or lost"), "{log}");
                }
                Ok(d) => d.wait_until("/readyz 503 while full", || degraded(d)),
            }
            assert!(moved_aside(&env.journal).is_empty());
            std::fs::remove_file(&filler).unwrap();
            let d = match restarted {
                Ok(d) => d,
                Err(_) => env.start(),
            };
            d.wait_until("/readyz 200", || d.try_get("/readyz").0 == 200);
            d.wait_until("all four mounted", || {
                ["pod-a", "pod-b", "pod-c", "pod-d"]
                    .iter()
                    .all(|p| is_tmpfs_mount(&env, p))
            });
            // Many passes later: nothing re-issued for a, b and c.
            std::thread::sleep(Duration::from_secs(1));
            let dump = env.dump();
            assert_eq!(
                journaled_pods(&dump),
                vec!["pod-a", "pod-b", "pod-c", "pod-d"]
            );
            let counts = setups(&dump);
            assert_eq!((counts["pod-a"], counts["pod-b"]), (1, 1), "{counts:?}");
            assert_eq!(counts["pod-c"], c_setups, "{counts:?}");
            let aside = moved_aside(&env.journal);
            assert!(
                aside.is_empty(),
                "{:?}\n{}",
                aside
                    .iter()
                    .map(
                        |a| std::fs::read_to_string(a.join("volumed-moved-aside.txt"))
                            .unwrap_or_default()
                    )
                    .collect::<Vec<_>>(),
                d.log()
            );
            d.stop();
        });
    }

    /// A real filesystem error on the root's ext4 (`trigger_fs_error` with
    /// `errors=remount-ro`: the kernel aborts the ext4 journal and turns
    /// the filesystem read-only for good, as a failing disk does): the
    /// daemon degrades (503, EROFS counted, the mounts kept); killed and
    /// started again on the broken disk it exits 75 or runs unready, and
    /// moves nothing aside; after the repair (every mount below the disk
    /// unmounted, `e2fsck`, mounted again) it starts from the same
    /// journal: the pod mounted before the fault is there with its records,
    /// and the pod added during it is mounted.
    #[test]
    fn a_failing_root_disk_loses_no_journal_record_across_its_repair() {
        real("an ext4 root on a loop device, failing", || {
            let mut env = Env::new("disk-err-daemon");
            let (disk, dev) = on_small_ext4(&mut env, "errors=remount-ro");
            env.write_pod("a.yaml", &pod("pod-a"));
            let d = env.start();
            d.wait_until("a mounted", || is_tmpfs_mount(&env, "pod-a"));
            let before = env.dump();
            assert_eq!(setups(&before).get("pod-a"), Some(&1), "{before:#}");
            let name = dev
                .path()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let trigger = Path::new("/sys/fs/ext4")
                .join(&name)
                .join("trigger_fs_error");
            std::fs::write(&trigger, "volumed test: a failing disk\n").unwrap();
            env.write_pod("b.yaml", &pod("pod-b"));
            d.wait_until("/readyz 503 naming the journal", || degraded(&d));
            let errors = series(&d.metrics(), "volumed_journal_write_errors_total");
            assert!(
                errors
                    .iter()
                    .any(|(k, _)| k.contains("EROFS") || k.contains("EIO")),
                "{errors:?}"
            );
            assert!(is_tmpfs_mount(&env, "pod-a"));
            d.kill();
            match exited_or_serving(&mut env) {
                Err((code, log)) => {
                    assert_eq!(code, Some(75), "EX_TEMPFAIL\n{log}");
                    assert!(log.contains("nothing was moved aside or lost"), "{log}");
                }
                Ok(d) => {
                    d.wait_until("/readyz 503 on the broken disk", || degraded(&d));
                    d.kill();
                }
            }
            assert!(moved_aside(&env.journal).is_empty());
            // The repair: what is mounted below the disk goes (deepest
            // first), then the disk; e2fsck; the disk mounted again.
            let mut below: Vec<PathBuf> = volumed::host::mountinfo::MountTable::read_self()
                .unwrap()
                .entries()
                .iter()
                .map(|m| m.mount_point.clone())
                .filter(|p| p.starts_with(&disk))
                .collect();
            below.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
            for p in &below {
                nix::mount::umount(p.as_path())
                    .unwrap_or_else(|e| panic!("umount {}: {e}", p.display()));
            }
            let fsck = std::process::Command::new("e2fsck")
                .args(["-f", "-y"])
                .arg(dev.path())
                .output()
                .unwrap();
            assert!(
                matches!(fsck.status.code(), Some(0..=2)),
                "e2fsck: {}",
                String::from_utf8_lossy(&fsck.stdout)
            );
            mount_device(dev.path(), &disk, "ext4");
            let d = env.start();
            d.wait_until("a and b mounted", || {
                is_tmpfs_mount(&env, "pod-a") && is_tmpfs_mount(&env, "pod-b")
            });
            assert!(moved_aside(&env.journal).is_empty());
            let after = env.dump();
            // every record written before the fault is still there
            let seqs = |doc: &Value| -> Vec<u64> {
                doc["records"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(|r| r["seq"].as_u64())
                    .collect()
            };
            let kept = seqs(&after);
            for seq in seqs(&before) {
                assert!(kept.contains(&seq), "record {seq} lost: {after:#}");
            }
            assert!(journaled_pods(&after).contains(&"pod-b".to_owned()));
            d.stop();
        });
    }
}
