//! EIO from a failing device under the journal (issue 39, item 4): the
//! daemon degrades, loses nothing, and goes on once the device works.
//!
//! This machine's kernel has no device-mapper, so the fault is made in the
//! SELinux test VM (`tests/support/vm.rs`; a Debian kernel under QEMU
//! TCG, booted permissive): `tests/selinux_vm/disk_eio.sh` puts the dm
//! device `eio` over the 64 MiB `/dev/vda` and `eioj` over `/dev/vdb`; an
//! ext4 on `eio` with its jbd2 journal on `eioj`, mounted
//! `errors=continue`, holds volumed's root and so its journal; volumed
//! runs with static pods whose volumes are memory emptyDirs. A fault
//! switches a table live from `linear` to `flakey … error_writes` (every
//! write fails with EIO, reads go through), and back.
//!
//! Fault 1, `eio` alone, pod A mounted, pod B added during it. What the
//! kernel does (Debian's 6.1, the scenario's `fault.kernel` block): each
//! write-back of sled's log fails ("ext4_end_bio: I/O error 10 writing
//! to inode …", "Buffer I/O error on device dm-0") and the journal's
//! flush gets EIO (sled's flush, `sync_file_range`); every recovery during
//! the fault fails with EIO too (sled writes as it reopens). ext4 raises
//! no error: only file data failed, `data_err=ignore` (the default) keeps
//! jbd2 from aborting on it, and jbd2's device works. So
//! `errors=continue` is never even consulted, ext4 stays read-write, and
//! the in-place path runs: once the table is linear again the daemon's
//! own recovery (sled reopened on what the disk holds, the records kept
//! in memory written again) succeeds, with no restart.
//!
//! Fault 2, both devices, pod C added during it. volumed's writes alone
//! give jbd2 nothing to commit (sled rewrites blocks its log already
//! has), so another writer on the disk makes a commit: it fails,
//! "Aborting journal on device dm-1", then "Detected aborted journal",
//! "Remounting filesystem read-only" on volumed's next write. The
//! daemon sees EIO still. ext4 takes no write once the devices work again,
//! so the scenario repairs it as `tests/disk_faults.rs` does (SIGKILL,
//! every mount below the disk unmounted, `e2fsck`, mounted, started):
//! the repair path.
//!
//! Checked, each reported by name:
//! - during fault 1: `/readyz` 503 naming the unwritable journal (and
//!   still 503 seconds later), `volumed_journal_writable 0` and
//!   `volumed_journal_write_errors_total{errno="EIO"}` at least 1, A's
//!   tmpfs still mounted and B's not, no `volumed.corrupt-*` beside the
//!   journal;
//! - after it, with no restart: ext4 raised no error, B mounted,
//!   `/readyz` 200, `volumed_journal_writable 1`, every record `dump`
//!   showed before the fault still there and unchanged, A's one SetUp
//!   intent with its success and one plugin operation more than before
//!   (B's: nothing re-issued for A), B set up once, still nothing moved
//!   aside;
//! - during fault 2: 503, writable 0, more write errors by errno, A and B
//!   mounted and C not, nothing moved aside; ext4 aborted (the kernel
//!   says so) and was repaired;
//! - after the repair: A, B and C mounted, `/readyz` 200, every record of
//!   the dump before fault 2 unchanged, C set up once, nothing moved
//!   aside; in the end SIGTERM exits 0.
//!
//! One thing the journal keeps that a reader may not expect: B's first
//! try appends its SetUp intent during fault 1; the flush fails, so the
//! operation never starts, and the journal closes that intent with a
//! final failure ("not started: ..."); the recovery makes both durable
//! like every record. B then has that closed intent beside the one that
//! ran, with its success. (C's first intent, never durable, went with the
//! SIGKILL.)
//!
//! Needs root (apt-get for the VM image) and says it was skipped
//! otherwise. One boot: about 45 s of emulation.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::collections::BTreeMap;

use serde_json::Value;

use support::vm::{self, Disk, Evidence, Outcome, boot_vm_with};

const UID_A: &str = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa";
const UID_B: &str = "bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb";
const UID_C: &str = "cccccccc-cccc-4ccc-8ccc-cccccccccccc";
/// Where the ext4 is mounted in the VM; the root is `<MNT>/kubelet`.
const MNT: &str = "/media/eio";
/// What `/readyz` says while the journal cannot be written.
const UNWRITABLE: &str = "journal cannot be written";

fn mem_target(uid: &str) -> String {
    format!("{MNT}/kubelet/pods/{uid}/volumes/kubernetes.io~empty-dir/mem")
}

/// Whether the mount table in `block` has a tmpfs at `path`.
fn tmpfs_at(ev: &Evidence, block: &str, path: &str) -> Result<bool, String> {
    Ok(ev.block(block)?.lines().any(|l| {
        l.split_once(" - ").is_some_and(|(left, right)| {
            left.split(' ').nth(4) == Some(path) && right.starts_with("tmpfs ")
        })
    }))
}

/// Every sample of the metric `name` in `block`: labels → value.
fn samples(ev: &Evidence, block: &str, name: &str) -> Result<BTreeMap<String, f64>, String> {
    let text = ev.block(block)?;
    Ok(text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            let labels = match key.strip_prefix(name)? {
                "" => "",
                rest if rest.starts_with('{') => rest,
                _ => return None,
            };
            Some((labels.to_owned(), value.parse().ok()?))
        })
        .collect())
}

/// The one unlabelled sample of `name` in `block`.
fn gauge(ev: &Evidence, block: &str, name: &str) -> Result<f64, String> {
    samples(ev, block, name)?
        .get("")
        .copied()
        .ok_or_else(|| format!("{block} has no {name}"))
}

/// The sum of every sample of `name` in `block`.
fn total(ev: &Evidence, block: &str, name: &str) -> Result<f64, String> {
    Ok(samples(ev, block, name)?.values().sum())
}

/// The HTTP answer in `block`: (status, body).
fn answer(ev: &Evidence, block: &str) -> Result<(u16, String), String> {
    let text = ev.block(block)?;
    let status = text
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{block} is no HTTP answer: {text:?}"))?;
    // the evidence's lines lost their `\r`: the head ends at a blank line
    let body = text
        .split_once("\n\n")
        .map_or("", |(_, b)| b)
        .trim()
        .to_owned();
    Ok((status, body))
}

fn readyz_ok(ev: &Evidence, block: &str) -> Outcome {
    match answer(ev, block)? {
        (200, body) => Ok(format!("200 {body}")),
        (status, body) => Err(format!("{status} {body:?}, expected 200")),
    }
}

fn readyz_degraded(ev: &Evidence, block: &str) -> Outcome {
    match answer(ev, block)? {
        (503, body) if body.contains(UNWRITABLE) => Ok(format!("503 {body}")),
        (status, body) => Err(format!(
            "{status} {body:?}, expected 503 naming {UNWRITABLE:?}"
        )),
    }
}

/// The fault really is EIO on writes: the table the device had.
fn fault_table(ev: &Evidence) -> Outcome {
    let t = ev.block("fault.table")?.trim();
    if t.contains(" flakey ") && t.contains("error_writes") {
        Ok(t.to_owned())
    } else {
        Err(format!("the table during the fault is {t:?}"))
    }
}

fn write_errors(ev: &Evidence) -> Outcome {
    let errors = samples(ev, "fault.metrics", "volumed_journal_write_errors_total")?;
    let eio = errors.get("{errno=\"EIO\"}").copied().unwrap_or(0.0);
    if eio >= 1.0 {
        Ok(format!("{errors:?}"))
    } else {
        Err(format!("no EIO counted: {errors:?}"))
    }
}

fn writable(ev: &Evidence, block: &str, want: f64) -> Outcome {
    let v = gauge(ev, block, "volumed_journal_writable")?;
    if v.to_bits() == want.to_bits() {
        Ok(format!("volumed_journal_writable {v}"))
    } else {
        Err(format!("volumed_journal_writable {v}, expected {want}"))
    }
}

/// The tmpfs of each pod in `want` is mounted (true) or not (false) in
/// the mount table in `block`.
fn mounts_are(ev: &Evidence, block: &str, want: &[(&str, bool)]) -> Outcome {
    let mut seen = Vec::new();
    for &(uid, _) in want {
        seen.push((&uid[..1], tmpfs_at(ev, block, &mem_target(uid))?));
    }
    let expected: Vec<(&str, bool)> = want.iter().map(|&(u, m)| (&u[..1], m)).collect();
    if seen == expected {
        Ok(format!("mounted: {seen:?}"))
    } else {
        Err(format!("mounted: {seen:?}, expected {expected:?}"))
    }
}

/// No journal moved aside: `ls -a <root>` in `block` (after the mount
/// line) has no `volumed.corrupt-*`.
fn nothing_moved_aside(ev: &Evidence, block: &str) -> Outcome {
    let text = ev.block(block)?;
    let names: Vec<&str> = text.lines().skip(1).map(str::trim).collect();
    if !names.contains(&"volumed") {
        return Err(format!("no journal dir in {names:?}"));
    }
    let aside: Vec<&&str> = names
        .iter()
        .filter(|n| n.starts_with("volumed.corrupt-"))
        .collect();
    if aside.is_empty() {
        Ok(names.join(" "))
    } else {
        Err(format!("moved aside: {aside:?}"))
    }
}

fn records(ev: &Evidence, block: &str) -> Result<BTreeMap<u64, Value>, String> {
    let doc = ev.json(block)?;
    let all = doc["records"]
        .as_array()
        .ok_or_else(|| format!("{block} has no records"))?;
    Ok(all
        .iter()
        .filter_map(|r| Some((r["seq"].as_u64()?, r.clone())))
        .collect())
}

/// Every record of the dump `before` is in the dump `after`, unchanged.
fn records_kept(ev: &Evidence, before: &str, after: &str) -> Outcome {
    let before = records(ev, before)?;
    let after = records(ev, after)?;
    if before.is_empty() {
        return Err("the dump before the fault shows no record".into());
    }
    let lost: Vec<u64> = before
        .iter()
        .filter(|(seq, r)| after.get(seq) != Some(r))
        .map(|(seq, _)| *seq)
        .collect();
    if lost.is_empty() {
        Ok(format!(
            "{} records before, all kept; {} after",
            before.len(),
            after.len()
        ))
    } else {
        Err(format!("records {lost:?} lost or changed"))
    }
}

/// The SetUp intents of `uid` in the dump `block`: (seq, the outcome's
/// result, if one names it).
fn setups_of(ev: &Evidence, block: &str, uid: &str) -> Result<Vec<(u64, Option<String>)>, String> {
    let all = records(ev, block)?;
    let result_of = |seq: u64| {
        all.values()
            .find(|r| r["type"] == "outcome" && r["intent_seq"].as_u64() == Some(seq))
            .map(|r| r["result"].as_str().unwrap_or_default().to_owned())
    };
    Ok(all
        .iter()
        .filter(|(_, r)| r["type"] == "intent" && r["op"] == "setup" && r["pod_uid"] == uid)
        .map(|(&seq, _)| (seq, result_of(seq)))
        .collect())
}

/// A's SetUp was not re-issued: its one intent, with its success, is
/// all the journal has for A.
fn one_setup_for_a(ev: &Evidence) -> Outcome {
    match setups_of(ev, "final.dump", UID_A)?.as_slice() {
        [(seq, Some(r))] if r == "success" => Ok(format!("intent {seq}, success")),
        other => Err(format!("A's SetUp intents (seq, result): {other:?}")),
    }
}

/// The pod added during a fault was set up once: one intent with a
/// success. The intent its first try appended during the fault (its
/// flush failed, so the operation never started) may be there too,
/// closed with a final failure; no intent is left without an outcome.
fn set_up_once(ev: &Evidence, block: &str, uid: &str) -> Outcome {
    let all = setups_of(ev, block, uid)?;
    let done: Vec<u64> = all
        .iter()
        .filter(|(_, r)| r.as_deref() == Some("success"))
        .map(|(seq, _)| *seq)
        .collect();
    let other: Vec<&(u64, Option<String>)> = all
        .iter()
        .filter(|(_, r)| !matches!(r.as_deref(), Some("success" | "failed_final")))
        .collect();
    if done.len() == 1 && other.is_empty() {
        Ok(format!("SetUp intents (seq, result): {all:?}"))
    } else {
        Err(format!(
            "SetUp intents (seq, result): {all:?}, expected one success"
        ))
    }
}

/// One plugin operation more than before the fault: B's SetUp, none
/// re-issued for A (the daemon ran on, so its counters did too).
fn nothing_reissued(ev: &Evidence) -> Outcome {
    let name = "volumed_plugin_operations_total";
    let (before, after) = (
        total(ev, "before.metrics", name)?,
        total(ev, "final.metrics", name)?,
    );
    if before >= 1.0 && (after - before - 1.0).abs() < f64::EPSILON {
        Ok(format!("{before} before, {after} after"))
    } else {
        Err(format!("{before} before, {after} after: expected one more"))
    }
}

fn in_place(ev: &Evidence) -> Outcome {
    let path = ev.block("path")?.trim();
    let state = ev.block("after.state")?.lines().next().unwrap_or("");
    let kernel = ev.block("fault.kernel")?;
    if kernel.contains("Aborting journal") || kernel.contains("EXT4-fs error") {
        return Err(format!("ext4 raised an error: {kernel}"));
    }
    if path == "in-place" {
        Ok(format!("ext4 still read-write: {state}"))
    } else {
        Err(format!(
            "the ext4 did not take writes after the fault ({state}); path {path}"
        ))
    }
}

/// Fault 2: jbd2's commit failed, ext4 aborted its journal and took no
/// write once the devices worked again, so the scenario repaired it.
fn aborted_and_repaired(ev: &Evidence) -> Outcome {
    let path = ev.block("abort.path")?.trim();
    let kernel = ev.block("abort.kernel")?;
    let lines: Vec<&str> = kernel
        .lines()
        .filter(|l| {
            ["Aborting journal", "aborted journal", "read-only", "JBD2"]
                .iter()
                .any(|w| l.contains(w))
        })
        .collect();
    let state = ev.block("abort.after.state")?.lines().next().unwrap_or("");
    if path == "repair" && lines.iter().any(|l| l.contains("Aborting journal")) {
        let e2fsck = ev.block("abort.e2fsck")?;
        Ok(format!(
            "{state}\n{}\ne2fsck: {}",
            lines.join("\n"),
            e2fsck.trim()
        ))
    } else {
        Err(format!("path {path}, {state}, kernel: {kernel}"))
    }
}

/// Write errors counted during fault 2 beyond those of fault 1, by errno.
fn more_errors(ev: &Evidence) -> Outcome {
    let name = "volumed_journal_write_errors_total";
    let before = samples(ev, "final.metrics", name)?;
    let during = samples(ev, "abort.metrics", name)?;
    let more: BTreeMap<&String, f64> = during
        .iter()
        .map(|(k, v)| (k, v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect();
    if more.is_empty() {
        Err(format!("no more write errors: {before:?} then {during:?}"))
    } else {
        Ok(format!("{more:?}"))
    }
}

fn step(ev: &Evidence, name: &str) -> Outcome {
    ev.step(name)
}

fn checks(ev: &Evidence) -> Vec<(String, Outcome)> {
    let mut out: Vec<(&str, Outcome)> = [
        "dm.created",
        "fs.mounted",
        "ready",
        "a.mounted",
        "fault.on",
        "degraded",
        "fault.off",
        "b.mounted",
        "ready.again",
        "abort.on",
        "abort.degraded",
        "abort.aborted",
        "abort.off",
        "abort.killed",
        "abort.remounted",
        "c.mounted",
        "ready.repaired",
        "stopped",
    ]
    .into_iter()
    .map(|s| (s, step(ev, s)))
    .collect();
    out.extend([
        (
            "fault: the device fails writes (flakey, error_writes)",
            fault_table(ev),
        ),
        (
            "fault: /readyz 503 naming the journal",
            readyz_degraded(ev, "fault.readyz"),
        ),
        (
            "fault: /readyz still 503 seconds later",
            readyz_degraded(ev, "fault.readyz.later"),
        ),
        (
            "fault: volumed_journal_writable 0",
            writable(ev, "fault.metrics", 0.0),
        ),
        ("fault: EIO counted by errno", write_errors(ev)),
        (
            "fault: A stays mounted, B waits",
            mounts_are(ev, "fault.mountinfo", &[(UID_A, true), (UID_B, false)]),
        ),
        (
            "fault: no journal moved aside",
            nothing_moved_aside(ev, "fault.state"),
        ),
        ("after: ext4 usable, recovered in place", in_place(ev)),
        (
            "after: A and B mounted",
            mounts_are(ev, "final.mountinfo", &[(UID_A, true), (UID_B, true)]),
        ),
        ("after: /readyz 200", readyz_ok(ev, "final.readyz")),
        (
            "after: volumed_journal_writable 1",
            writable(ev, "final.metrics", 1.0),
        ),
        (
            "after: every record from before the fault kept",
            records_kept(ev, "before.dump", "final.dump"),
        ),
        (
            "after: A's one SetUp intent, not re-issued",
            one_setup_for_a(ev),
        ),
        ("after: B set up once", set_up_once(ev, "final.dump", UID_B)),
        ("after: no operation re-issued for A", nothing_reissued(ev)),
        (
            "after: no journal moved aside",
            nothing_moved_aside(ev, "final.state"),
        ),
        (
            "fault 2: /readyz 503 naming the journal",
            readyz_degraded(ev, "abort.readyz"),
        ),
        (
            "fault 2: volumed_journal_writable 0",
            writable(ev, "abort.metrics", 0.0),
        ),
        ("fault 2: write errors counted by errno", more_errors(ev)),
        (
            "fault 2: A and B stay mounted, C waits",
            mounts_are(
                ev,
                "abort.mountinfo",
                &[(UID_A, true), (UID_B, true), (UID_C, false)],
            ),
        ),
        (
            "fault 2: no journal moved aside",
            nothing_moved_aside(ev, "abort.state"),
        ),
        (
            "fault 2: ext4 aborted its journal, repaired",
            aborted_and_repaired(ev),
        ),
        (
            "repaired: A, B and C mounted",
            mounts_are(
                ev,
                "repaired.mountinfo",
                &[(UID_A, true), (UID_B, true), (UID_C, true)],
            ),
        ),
        ("repaired: /readyz 200", readyz_ok(ev, "repaired.readyz")),
        (
            "repaired: every record from before fault 2 kept",
            records_kept(ev, "final.dump", "repaired.dump"),
        ),
        (
            "repaired: C set up once",
            set_up_once(ev, "repaired.dump", UID_C),
        ),
        (
            "repaired: no journal moved aside",
            nothing_moved_aside(ev, "repaired.state"),
        ),
        (
            "SIGTERM exits 0",
            match ev.block("volumed.exit") {
                Ok(c) if c.trim() == "0" => Ok("0".into()),
                Ok(c) => Err(format!("exit {}", c.trim())),
                Err(e) => Err(e),
            },
        ),
        (
            "the scenario ran to its end",
            if ev.done {
                Ok("@@DONE".into())
            } else {
                Err("no @@DONE line".into())
            },
        ),
    ]);
    out.into_iter().map(|(n, o)| (n.to_owned(), o)).collect()
}

#[test]
fn eio_under_the_journal_degrades_the_daemon_and_loses_nothing_in_place_or_across_a_repair() {
    if !support::vm_wanted("boots a QEMU VM with a Debian kernel for dm-flakey (apt-get, qemu)") {
        return;
    }
    let run = boot_vm_with(
        "disk_eio.sh",
        false,
        &[Disk {
            name: "journal.raw",
            size: 32 << 20,
        }],
        Some("permissive"),
    );
    let ev = Evidence::parse(&run.results);
    let results = checks(&ev);
    vm::report(
        run,
        "disk-eio-vm",
        "disk EIO",
        &["disk.raw", "journal.raw", "initrd.img", "payload.cpio"],
        &results,
    );
}
