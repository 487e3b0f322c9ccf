//! The `full-*` fixtures: the journal's disk fills at a crash point.
//!
//! The journal dir is on a 128 MiB btrfs of its own (a loop device). A
//! full btrfs refuses every buffered write with `ENOSPC`, even one into a
//! page the file already has (copy-on-write reserves room for each
//! write): a tmpfs or an ext4 take a write that still fits the last page
//! or block of sled's log, so there the fault would meet some later write,
//! not the point's. The daemon is started with
//! `VOLUMED_HOLD_AT=<point>:<n>` (`src/failpoint.rs`): the thread reaching
//! the point waits there while the runner takes `dump` and the
//! acknowledged-through watermark (`<journal>/acked`), fills the btrfs to
//! its last byte, and lets it go on. From then on:
//!
//! 1. the daemon must degrade on the writes that follow the point (the
//!    held operation's outcome, the next intent, the checkpoint's record
//!    drops), with no pod added: `/readyz` 503 naming the journal;
//!    an event `JournalUnwritable` names the journal's filesystem (and,
//!    with `free`, `JournalWritable` once it recovered);
//! 2. degraded, nothing new is mounted: a pod `late` is added, and for
//!    1.5 s it stays unmounted, the mount table does not change and
//!    `/readyz` stays 503;
//! 3. `free`: the filler is removed while the daemon runs (and btrfs's
//!    transaction committed, `sync -f`: btrfs gives an unlinked file's
//!    blocks back only then), and it must recover by itself. `kill`: it is SIGKILLed while the disk is full and
//!    started on the full disk, where it must exit 75 (`EX_TEMPFAIL`,
//!    saying nothing was moved aside) or run unready; then the filler is
//!    removed and it is started again;
//! 4. then it must converge to every desired pod ([`Node::converge`]:
//!    every mount exactly once, none stacked or leaked, nothing uncertain,
//!    `dump` = `/debug/state`); no `<journal>.corrupt-*` at any step; the
//!    last `dump` holds every record the dump at the point held (`kill`:
//!    every one the watermark acknowledged), the same type and operation
//!    under the same sequence number, or a checkpoint covers it; no
//!    `mount_device` or `setup` intent after the fault for a target that
//!    was mounted at it (nothing re-issued); SIGTERM exits 0 and every
//!    file written to the PV is there.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::fixture::{AfterFull, Fixture, Full, Kind, Ref};
use crate::node::Node;
use crate::scenario::{Figures, FullFigures, apply};
use crate::support::{LoopDevice, fill_fs, mkdirs, mount_device};

/// The journal's btrfs, in MiB (mkfs.btrfs takes no less than about 110).
const SIZE_MB: u64 = 128;
/// How long the daemon may take to reach the point.
const HOLD_LIMIT: Duration = Duration::from_secs(30);
/// How long the daemon may take to degrade once the point goes on.
const DEGRADE_LIMIT: Duration = Duration::from_secs(10);
/// How long a degraded daemon is watched for new mounts.
const WATCH: Duration = Duration::from_millis(1500);

/// `/readyz` answers 503 naming the journal.
fn degraded(node: &Node) -> bool {
    matches!(node.get("/readyz"), Ok((503, body)) if body.contains("journal cannot be written"))
}

/// `/debug/events` holds an event `reason` naming the journal's
/// filesystem (mounted at `disk`).
fn said(node: &Node, reason: &str, disk: &Path) -> Result<(), String> {
    fn any(v: &Value, hit: &dyn Fn(&Value) -> bool) -> bool {
        hit(v)
            || match v {
                Value::Array(a) => a.iter().any(|x| any(x, hit)),
                Value::Object(o) => o.values().any(|x| any(x, hit)),
                _ => false,
            }
    }
    let (_, body) = node.get("/debug/events")?;
    let events: Value = serde_json::from_str(&body).map_err(|e| format!("/debug/events: {e}"))?;
    let place = format!("mounted at {}", disk.display());
    let named = any(&events, &|e| {
        e["reason"] == reason && e["message"].as_str().is_some_and(|m| m.contains(&place))
    });
    if named {
        Ok(())
    } else {
        Err(format!("no {reason} event naming {place}: {body}"))
    }
}

/// Journals moved aside beside `jdir` (`<journal>.corrupt-*`).
fn moved_aside(jdir: &Path) -> Vec<PathBuf> {
    let name = jdir.file_name().unwrap_or_default().to_string_lossy();
    let prefix = format!("{name}.corrupt-");
    jdir.parent()
        .and_then(|p| fs::read_dir(p).ok())
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        })
        .collect()
}

fn none_moved_aside(jdir: &Path, when: &str) -> Result<(), String> {
    let aside = moved_aside(jdir);
    if aside.is_empty() {
        Ok(())
    } else {
        Err(format!("{when}: the journal was moved aside: {aside:?}"))
    }
}

/// The acknowledged-through sequence number in `<jdir>/acked` (the
/// watermark's layout: magic `VMDW` at 0, the seq as u64 LE at 16).
fn acked(jdir: &Path) -> Result<u64, String> {
    let b = fs::read(jdir.join("acked")).map_err(|e| format!("read the watermark: {e}"))?;
    if b.len() < 24 || &b[..4] != b"VMDW" {
        return Err(format!("the watermark is not one: {b:?}"));
    }
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&b[16..24]);
    Ok(u64::from_le_bytes(seq))
}

/// Waits for the held daemon's `<hold>/held` naming `point`.
fn wait_held(node: &mut Node, hold: &Path, point: &str) -> Result<(), String> {
    let deadline = Instant::now() + HOLD_LIMIT;
    loop {
        if fs::read_to_string(hold.join("held")).is_ok_and(|p| p == point) {
            return Ok(());
        }
        if !node.alive() {
            return Err(format!(
                "the daemon died before {point}\n{}",
                node.log_tail()
            ));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "crash point {point} never held within {HOLD_LIMIT:?}\n{}",
                node.log_tail()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether the pod `pod` (one `tmp` volume) is mounted.
fn mounted(node: &Node, pod: &str) -> bool {
    node.mounts()
        .contains_key(&node.path(&Ref::Pod(pod.to_owned(), Kind::Tmp)))
}

/// Waits for the daemon to degrade on the writes that follow the point
/// (the held operation's outcome, the next intents, the checkpoint's
/// record drops): no pod is added before it.
fn wait_degraded(node: &mut Node, point: &str) -> Result<(), String> {
    let deadline = Instant::now() + DEGRADE_LIMIT;
    while !degraded(node) {
        if !node.alive() {
            return Err(format!(
                "the daemon died on the full disk\n{}",
                node.log_tail()
            ));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "not degraded {DEGRADE_LIMIT:?} after {point} met the full disk: /readyz {:?}\n{}",
                node.get("/readyz"),
                node.log_tail()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Degraded, nothing new is mounted: `late` added stays unmounted, the
/// mount table stays as it is, `/readyz` stays 503.
fn nothing_new_while_degraded(node: &mut Node) -> Result<(), String> {
    node.add_pod("late", &[Kind::Tmp]);
    // an operation in flight at the fault may still finish
    std::thread::sleep(Duration::from_millis(300));
    let before: Vec<PathBuf> = node.mounts().into_keys().collect();
    std::thread::sleep(WATCH);
    let after: Vec<PathBuf> = node.mounts().into_keys().collect();
    if !degraded(node) {
        return Err(format!(
            "no longer degraded on the full disk: /readyz {:?}",
            node.get("/readyz")
        ));
    }
    if mounted(node, "late") {
        return Err("pod late mounted while the journal cannot be written".into());
    }
    if before != after {
        return Err(format!(
            "the mounts changed while degraded: {before:?} -> {after:?}"
        ));
    }
    Ok(())
}

/// (seq, type, op) of every record in a dump.
fn records(dump: &Value) -> Vec<(u64, String, String)> {
    dump["records"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| {
            Some((
                r["seq"].as_u64()?,
                r["type"].as_str().unwrap_or_default().to_owned(),
                r["op"].as_str().unwrap_or_default().to_owned(),
            ))
        })
        .collect()
}

/// Every record of `before` through `through` is in `after`, or covered
/// by its checkpoint.
fn kept(before: &Value, through: u64, after: &Value) -> Result<(), String> {
    let covered = after["checkpoint"]["through_seq"].as_u64().unwrap_or(0);
    let now = records(after);
    let lost: Vec<_> = records(before)
        .into_iter()
        .filter(|r| r.0 <= through && r.0 > covered && !now.contains(r))
        .collect();
    if !after["corruption"].is_null() {
        return Err(format!(
            "the last dump reports damage: {}",
            after["corruption"]
        ));
    }
    if lost.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "records acknowledged before the fault are gone: {lost:?} (the dump holds {now:?})"
        ))
    }
}

/// The mounting intents (`mount_device`, `setup`) after `seq` for a target
/// in `mounted`: operations re-issued for what was mounted at the fault.
fn reissued(dump: &Value, seq: u64, mounted: &BTreeSet<PathBuf>) -> Vec<String> {
    dump["records"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["type"] == "intent" && r["seq"].as_u64().is_some_and(|s| s > seq))
        .filter(|r| r["op"] == "mount_device" || r["op"] == "setup")
        .filter_map(|r| {
            let key = if r["pod_uid"].is_null() {
                "device_mount_path"
            } else {
                "pod_mount_path"
            };
            let path = r["params"][key].as_str()?;
            let op = r["op"].as_str().unwrap_or_default();
            mounted
                .contains(Path::new(path))
                .then(|| format!("{} {op} {path}", r["seq"]))
        })
        .collect()
}

/// A fresh btrfs of [`SIZE_MB`] on a loop device, mounted at `at`.
fn journal_disk(image: &Path, at: &Path) -> Result<LoopDevice, String> {
    fs::File::create(image)
        .and_then(|f| f.set_len(SIZE_MB << 20))
        .map_err(|e| format!("create {}: {e}", image.display()))?;
    let out = std::process::Command::new("mkfs.btrfs")
        .arg("-q")
        .arg(image)
        .output()
        .map_err(|e| format!("run mkfs.btrfs (btrfs-progs): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "mkfs.btrfs: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let dev = LoopDevice::attach(image);
    mkdirs(at);
    mount_device(dev.path(), at, "btrfs");
    Ok(dev)
}

/// Removes the filler and commits btrfs's transaction (`sync -f`, as an
/// operator's `rm` then `sync`): btrfs gives an unlinked file's blocks
/// back only at the commit, up to 30 s later.
fn free(filler: &Path, disk: &Path) -> Result<(), String> {
    fs::remove_file(filler).map_err(|e| format!("free the space: {e}"))?;
    let st = std::process::Command::new("sync")
        .arg("-f")
        .arg(disk)
        .status()
        .map_err(|e| format!("sync -f: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("sync -f {}: {st}", disk.display()))
    }
}

/// Runs a `full` fixture (module doc).
pub fn run(f: &Fixture, full: &Full, figures: &mut Figures) -> Result<(), String> {
    let mut node = Node::new(f.blank_device, f.uses_csi());
    node.checkpoint_every = f.checkpoint_every;
    let disk = node.scratch.path().join("journal-fs");
    let _disk_dev = journal_disk(&node.scratch.path().join("journal.img"), &disk)?;
    node.jdir = disk.join("journal");
    let hold = node.scratch.path().join("hold");
    mkdirs(&hold);
    node.env = vec![
        (
            "VOLUMED_HOLD_AT".to_owned(),
            format!("{}:{}", full.point, full.n),
        ),
        ("VOLUMED_HOLD_DIR".to_owned(), hold.display().to_string()),
    ];
    for (p, kinds) in &f.pods {
        node.add_pod(p, kinds);
    }
    node.start(None)?;
    node.env.clear();
    let mut early = None;
    if !f.trigger.is_empty() {
        node.converge(&|_| Ok(()))
            .map_err(|e| format!("before the fault: {e}"))?;
        node.write_pv_files("before-full")?;
        // `checkpoint.mid` holds the checkpoint lock, which the daemon's
        // `/debug/journal` waits for: the records are read before
        early = Some(node.dump()?);
        for c in &f.trigger {
            apply(&mut node, c);
        }
    }
    wait_held(&mut node, &hold, &full.point)?;
    figures.point = Some(full.point.clone());
    let before = match early {
        Some(d) if full.point == "checkpoint.mid" => d,
        _ => node.dump()?,
    };
    let acked_at_fault = acked(&node.jdir)?;
    let through = match full.then {
        AfterFull::Free => u64::MAX,
        AfterFull::Kill => acked_at_fault,
    };
    let mounted_at_fault: BTreeSet<PathBuf> = node.mounts().into_keys().collect();
    let filler = fill_fs(&disk);
    fs::write(hold.join("go"), "").map_err(|e| format!("release the point: {e}"))?;

    wait_degraded(&mut node, &full.point)?;
    said(&node, "JournalUnwritable", &disk)?;
    let mut ff = FullFigures::default();
    nothing_new_while_degraded(&mut node)?;
    none_moved_aside(&node.jdir, "degraded")?;

    match full.then {
        AfterFull::Free => free(&filler, &disk)?,
        AfterFull::Kill => {
            node.kill();
            match node.start_or_exit(None)? {
                Some(st) if st.code() == Some(75) => {
                    let log = node.log_tail();
                    node.kill();
                    if !log.contains("nothing was moved aside or lost") {
                        return Err(format!("exit 75 without saying nothing was lost\n{log}"));
                    }
                    ff.restart = Some("exit 75");
                }
                Some(st) => {
                    return Err(format!(
                        "started on the full disk: {st}, not 75 (EX_TEMPFAIL) nor running unready\n{}",
                        node.log_tail()
                    ));
                }
                None => {
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while !degraded(&node) {
                        if Instant::now() > deadline {
                            return Err(format!(
                                "started on the full disk: running, /readyz {:?}, not 503 naming the journal\n{}",
                                node.get("/readyz"),
                                node.log_tail()
                            ));
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    nothing_new_while_degraded(&mut node)?;
                    node.kill();
                    ff.restart = Some("unready");
                }
            }
            none_moved_aside(&node.jdir, "the start on the full disk")?;
            free(&filler, &disk)?;
            node.start(None)?;
        }
    }
    figures.full = Some(ff);
    node.converge(&|_| Ok(()))
        .map_err(|e| format!("after the space was freed: {e}"))?;
    if full.then == AfterFull::Free {
        said(&node, "JournalWritable", &disk)?;
    }
    if f.uses_csi() {
        std::thread::sleep(Duration::from_secs(1));
        node.converge(&|_| Ok(()))?;
    }
    let mut problems = Vec::new();
    if let Err(e) = none_moved_aside(&node.jdir, "after the space was freed") {
        problems.push(e);
    }
    let after = node.dump()?;
    if let Err(e) = kept(&before, through, &after) {
        problems.push(e);
    }
    let again = reissued(&after, acked_at_fault, &mounted_at_fault);
    if !again.is_empty() {
        problems.push(format!(
            "operations re-issued for what was mounted at the fault: {again:?}"
        ));
    }
    node.stop()?;
    if let Err(e) = node.check_pv_files() {
        problems.push(e);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("{}\n{}", problems.join("\n"), node.log_tail()))
    }
}
