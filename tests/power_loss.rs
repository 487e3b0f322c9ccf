//! Power loss, replayed (issue 18): every block write of the journal's
//! filesystem during a busy run is recorded, and the daemon is started on
//! the filesystem as a power cut could have left it at many instants.
//!
//! This machine's kernel has no device-mapper, so the recording happens in
//! the SELinux test VM (`tests/support/vm.rs`; a Debian kernel under QEMU
//! TCG): `tests/selinux_vm/power_loss.sh` puts `dm-log-writes` over the
//! 64 MiB `/dev/vda` with `/dev/vdb` (a 1 GiB sparse host file) as the log,
//! makes an ext4 on it holding volumed's root, journal and static pod
//! folder, and runs volumed while pods with a tmpfs and a disk emptyDir
//! come and go, marking the log with `durable-<seq>` each time
//! `volumed_journal_durable_seq` says `seq` is fsynced.
//!
//! Here, on the host, [`support::log_writes`] reads the log and rebuilds
//! the device from zeros, entry by entry. The crash states, CrashMonkey's
//! way, from the `fs-ready` mark (an empty ext4, before volumed ran) to
//! the end: the image after every FLUSH and FUA entry (what a power cut
//! right then leaves) and at every mark; after random entries between them
//! (the cache wrote back a prefix of what was pending;
//! `VOLUMED_POWERLOSS_RANDOM`, default 40); and reordered ones, a durable
//! point plus a random proper subset of the writes before the next one
//! (the cache wrote back some of it, in any order;
//! `VOLUMED_POWERLOSS_REORDERED`, default 30). Seeded
//! (`VOLUMED_POWERLOSS_SEED`); consecutive states with no data write and no
//! mark between them are one. Replaying the whole log must give the VM's
//! disk byte for byte (the replayer's own check).
//! `VOLUMED_POWERLOSS_KEEP=1` keeps the recording (its scratch dir is
//! printed) and `VOLUMED_POWERLOSS_RECORDING=<dir>` replays it again
//! without the VM, e.g. with more states or another seed.
//!
//! Each state is loop-mounted (ext4 replays its journal) at the path it
//! had in the VM, `/media/powerloss`, inside this test's private mount
//! namespace (a tmpfs hides the host's `/media`), and with the boot id of
//! this host, which is not the VM's: a new boot, where every tmpfs the
//! journal remembers is gone. Checked on each:
//! - `volumed dump` reads it: no record through the last `durable-<seq>`
//!   mark before the state is missing (every seq past the checkpoint up to
//!   `seq` is there), every record recovered is the one the daemon wrote
//!   (as the VM's `dump` after each round shows it; the daemon there
//!   checkpoints every 40 records, so compaction is recorded too), no
//!   corruption is reported, and a tail is
//!   reported lost exactly when the `acked` watermark found on disk is past
//!   what sled recovered (with those two numbers). What a state must keep
//!   is every record volumed acknowledged before it ([`required_seq`]):
//!   each journal flush ends with an `fdatasync` of sled's log file, so an
//!   acknowledged record is durable at once (an earlier version, whose
//!   flush was sled's `sync_file_range` alone, lost acknowledged records
//!   here without a word);
//! - `volumed run` starts and gets ready (no panic, no crash loop), its
//!   `/debug/state` reports the same lost tail, and never a tmpfs emptyDir
//!   as mounted that `/proc/self/mountinfo` does not show, neither right
//!   at ready nor after reconciling;
//! - it reconciles: every pod whose manifest is whole in the image's pod
//!   folder gets its tmpfs mounted, no pod without a manifest does; then
//!   SIGTERM exits 0.
//!
//! Needs root (apt-get for the VM image, loop devices, mounts) and says it
//! was skipped otherwise. About a minute for the VM, then about 0.9 s a
//! state: 160 states in about 3 minutes in all.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use serde_json::Value;
use volumed::host::mountinfo::MountTable;

use support::daemon::{BIN, Env, targets};
use support::log_writes::{Log, Replay};
use support::vm::{Disk, Evidence, Run, boot_vm_with};

/// Where the ext4 was mounted in the VM, and each state is here.
const MNT: &str = "/media/powerloss";
/// The data device's size (`disk.raw`, `/dev/vda`).
const DATA_SIZE: usize = 64 << 20;
/// The log device's size (sparse).
const LOG_SIZE: u64 = 1 << 30;
/// Random states between the durable points, by default.
const RANDOM_STATES: usize = 40;
/// Reordered states (a subset of a segment's writes), by default.
const REORDERED_STATES: usize = 30;
/// The default seed of the random states.
const SEED: u64 = 0x5eed_1e55_0fc0_de00;

fn root() -> PathBuf {
    Path::new(MNT).join("kubelet")
}

fn pods_dir() -> PathBuf {
    Path::new(MNT).join("pods")
}

/// The scenario's pod uid for pod number `n` (`uid_of` in power_loss.sh).
fn uid_of(n: u32) -> String {
    format!("pl{n:06}-0000-4000-8000-000000000000")
}

fn mem_target(uid: &str) -> PathBuf {
    root()
        .join("pods")
        .join(uid)
        .join("volumes/kubernetes.io~empty-dir/mem")
}

/// A small seeded generator (xorshift64*): the states must be the same
/// for the same seed, and nothing more is asked of it.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).expect("below n fits usize")
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// ---------------------------------------------------------------- the states

/// Why a state was chosen (for the counts printed at the end).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Kind {
    Durable,
    Mark,
    Random,
    Reordered,
    End,
}

/// The crash states: (last entry applied, why), in log order, from the
/// `fs-ready` mark on, without repeats of an identical image.
fn choose_states(log: &Log, seed: u64, random: usize) -> Vec<(usize, Kind)> {
    let first = log.mark("fs-ready").expect("the log has the fs-ready mark");
    let last = log.entries.len() - 1;
    let mut chosen: Vec<(usize, Kind)> = vec![(first, Kind::Mark), (last, Kind::End)];
    let mut between = Vec::new();
    for i in first + 1..=last {
        let e = &log.entries[i];
        if e.durable_point() {
            chosen.push((i, Kind::Durable));
        } else if e.mark.is_some() {
            chosen.push((i, Kind::Mark));
        } else if e.changes_data() {
            between.push(i);
        }
    }
    let mut rng = Rng(seed | 1);
    for _ in 0..random.min(between.len()) {
        let i = between.swap_remove(rng.below(between.len()));
        chosen.push((i, Kind::Random));
    }
    chosen.sort_unstable();
    chosen.dedup_by_key(|c| c.0);
    // One state per distinct image and requirement.
    let mut out: Vec<(usize, Kind)> = Vec::new();
    for c in chosen {
        let differs = out.last().is_none_or(|&(prev, _)| {
            log.entries[prev + 1..=c.0]
                .iter()
                .any(|e| e.changes_data() || e.mark.is_some())
        });
        if differs {
            out.push(c);
        }
    }
    out
}

/// The sequence number a state with entries `..=i` must keep: the highest
/// `durable-<seq>` mark up to `i` (0 before any). `durable-<seq>` is what
/// volumed acknowledged, and it acknowledges a record only once the
/// `fdatasync` of sled's log file returned (ARCHITECTURE.md,
/// "Durability"): its cache flush and the file's new size are in the log
/// before the mark.
fn required_seq(log: &Log, i: usize) -> u64 {
    let acked = log.entries[..=i].iter().filter_map(|e| {
        let mark = e.mark.as_deref()?;
        mark.strip_prefix("durable-")?.parse::<u64>().ok()
    });
    acked.max().unwrap_or(0)
}

/// Reordered states: from a durable point `base`, a random proper subset
/// of the writes logged before the next one (the disk's cache wrote back
/// some of what it held, in any order), `n` of them over random segments
/// with at least two writes, from the `fs-ready` mark on.
fn choose_reordered(log: &Log, seed: u64, n: usize) -> Vec<(usize, Vec<usize>)> {
    let first = log.mark("fs-ready").expect("the log has the fs-ready mark");
    let mut bases: Vec<usize> = vec![first];
    bases.extend((first + 1..log.entries.len()).filter(|&i| log.entries[i].durable_point()));
    let segments: Vec<(usize, Vec<usize>)> = bases
        .iter()
        .map(|&b| {
            let writes = (b + 1..log.entries.len())
                .take_while(|&i| !log.entries[i].durable_point())
                .filter(|&i| log.entries[i].changes_data())
                .collect::<Vec<_>>();
            (b, writes)
        })
        .filter(|(_, w)| w.len() >= 2)
        .collect();
    if segments.is_empty() {
        return Vec::new();
    }
    let mut rng = Rng(seed.rotate_left(17) | 1);
    let mut out: Vec<(usize, Vec<usize>)> = (0..n)
        .map(|_| {
            let (base, writes) = &segments[rng.below(segments.len())];
            // Each write in or out by a coin; never all of them (that is
            // a prefix state) and never none (that is the base).
            let skip = rng.below(writes.len());
            let mut subset: Vec<usize> = writes
                .iter()
                .enumerate()
                .filter(|&(k, _)| k != skip && rng.next() & 1 == 1)
                .map(|(_, &i)| i)
                .collect();
            if subset.is_empty() {
                subset.push(writes[(skip + 1) % writes.len()]);
            }
            (*base, subset)
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

// ---------------------------------------------------------------- one state

/// What one state showed.
#[derive(Default)]
struct Seen {
    /// the journal existed
    journal: bool,
    /// the highest record (or checkpoint) sled recovered
    recovered: u64,
    /// the watermark on disk
    acked: Option<u64>,
    /// the lost tail dump reported: (acked, recovered)
    lost_tail: Option<(u64, u64)>,
    /// pods with a whole manifest, mounted after reconciling
    pods: usize,
    /// the journal had a checkpoint
    checkpoint: bool,
}

/// The acknowledged-through seq in `<journal>/acked` (layout in
/// `src/journal/watermark.rs`: magic `VMDW`, seq at bytes 16..24).
fn read_acked(journal: &Path) -> Option<u64> {
    let b = fs::read(journal.join("acked")).ok()?;
    if b.len() != 68 || &b[..4] != b"VMDW" {
        return None;
    }
    Some(u64::from_le_bytes(b[16..24].try_into().ok()?))
}

/// The lost tail a dump or `/debug/state` reports: (acked, recovered).
fn lost_tail(doc: &Value) -> Option<(u64, u64)> {
    let l = &doc["journal_damage"]["lost_tail"];
    Some((
        l["acked_through"].as_u64()?,
        l["recovered_through"].as_u64()?,
    ))
}

/// `volumed dump` of the state's journal; checks what it must say against
/// the records the VM's daemon had at the end (`written`, by seq).
fn check_dump(
    env: &Env,
    need: u64,
    written: &BTreeMap<u64, Value>,
    seen: &mut Seen,
) -> Result<(), String> {
    let out = Command::new(BIN)
        .arg("dump")
        .arg("--journal-dir")
        .arg(&env.journal)
        .args(["--format", "json", "--boot-id-file"])
        .arg(&env.boot)
        .env("VOLUMED_LOG", "warn")
        .output()
        .map_err(|e| format!("spawn volumed dump: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || stderr.contains("panicked") {
        return Err(format!("volumed dump: {}: {stderr}", out.status));
    }
    let doc: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("dump is not JSON ({e}): {stderr}"))?;
    let records = doc["records"].as_array().ok_or("dump has no records")?;
    let newest = records.iter().filter_map(|r| r["seq"].as_u64()).max();
    let checkpoint = doc["checkpoint"]["through_seq"].as_u64();
    seen.checkpoint = checkpoint.is_some();
    seen.recovered = newest.max(checkpoint).unwrap_or(0);
    if seen.recovered < need {
        return Err(format!(
            "DURABILITY: records through {need} were acknowledged and committed by ext4 before this state, sled recovered only through {} ({} records, checkpoint {checkpoint:?})",
            seen.recovered,
            records.len()
        ));
    }
    // Records go only by a checkpoint (through its seq) or quarantine, so
    // every seq past the checkpoint up to `need` must be there...
    let have: BTreeMap<u64, &Value> = records
        .iter()
        .filter_map(|r| Some((r["seq"].as_u64()?, r)))
        .collect();
    let from = checkpoint.map_or(1, |c| c + 1);
    let gaps: Vec<u64> = (from..=need).filter(|q| !have.contains_key(q)).collect();
    if !gaps.is_empty() {
        return Err(format!(
            "DURABILITY: records {gaps:?} were acknowledged and committed by ext4 before this state and are missing (checkpoint {checkpoint:?})"
        ));
    }
    // ...and every record recovered is the one the daemon wrote.
    for (q, r) in &have {
        if let Some(w) = written.get(q)
            && *r != w
        {
            return Err(format!("record {q} recovered as {r}, the daemon wrote {w}"));
        }
    }
    if !doc["corruption"].is_null() {
        return Err(format!("dump reports corruption: {}", doc["corruption"]));
    }
    let moved = &doc["journal_damage"]["moved_aside"];
    if moved.as_array().is_some_and(|m| !m.is_empty()) {
        return Err(format!("dump moved the journal aside: {moved}"));
    }
    let want = seen
        .acked
        .filter(|&a| a > seen.recovered)
        .map(|a| (a, seen.recovered));
    let got = lost_tail(&doc);
    if got != want {
        return Err(format!(
            "dump's lost tail is {got:?}, the watermark {:?} and sled's {} call for {want:?}",
            seen.acked, seen.recovered
        ));
    }
    seen.lost_tail = got;
    Ok(())
}

/// The tmpfs mount points below the pods dir.
fn tmpfs_below_pods() -> BTreeSet<PathBuf> {
    let pods = root().join("pods");
    MountTable::read_self()
        .expect("read /proc/self/mountinfo")
        .entries()
        .iter()
        .filter(|m| m.fs_type == "tmpfs" && m.mount_point.starts_with(&pods))
        .map(|m| m.mount_point.clone())
        .collect()
}

/// "Never invent a mount": every tmpfs emptyDir `/debug/state` calls
/// mounted is in the mount table.
fn invented(state: &Value) -> Vec<PathBuf> {
    let real = tmpfs_below_pods();
    targets(state)
        .into_iter()
        .filter(|(p, (_, s))| s == "mounted" && p.ends_with("mem") && !real.contains(p))
        .map(|(p, _)| p)
        .collect()
}

/// The pods of the image's pod folder: (uid with a whole manifest, uid
/// with a torn one).
fn manifests() -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut whole, mut torn) = (BTreeSet::new(), BTreeSet::new());
    for e in fs::read_dir(pods_dir()).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(n) = name
            .strip_prefix("pod-")
            .and_then(|n| n.strip_suffix(".yaml"))
            .and_then(|n| n.parse().ok())
        else {
            continue;
        };
        let text = fs::read_to_string(e.path()).unwrap_or_default();
        if text.ends_with("# end\n") {
            whole.insert(uid_of(n));
        } else {
            torn.insert(uid_of(n));
        }
    }
    (whole, torn)
}

/// The daemon on the mounted state: ready, honest, reconciled, stopped.
fn check_daemon(env: &mut Env, seen: &mut Seen) -> Result<(), String> {
    let daemon = env.start();
    let state = daemon.state();
    let bad = invented(&state);
    if !bad.is_empty() {
        return Err(format!(
            "at ready /debug/state calls {bad:?} mounted, the mount table does not show them"
        ));
    }
    if seen.journal && lost_tail(&state) != seen.lost_tail {
        return Err(format!(
            "/debug/state's lost tail is {:?}, dump said {:?}",
            lost_tail(&state),
            seen.lost_tail
        ));
    }
    let (whole, torn) = manifests();
    let uid_of_mount = |p: &Path| {
        p.strip_prefix(root().join("pods"))
            .ok()
            .and_then(|r| r.iter().next())
            .map(|u| u.to_string_lossy().into_owned())
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mounted = tmpfs_below_pods();
        let state = daemon.state();
        let missing: Vec<&String> = whole
            .iter()
            .filter(|u| !mounted.contains(&mem_target(u)))
            .collect();
        let stray: Vec<&PathBuf> = mounted
            .iter()
            .filter(|p| uid_of_mount(p).is_none_or(|u| !whole.contains(&u) && !torn.contains(&u)))
            .collect();
        let bad = invented(&state);
        if !bad.is_empty() {
            return Err(format!(
                "/debug/state calls {bad:?} mounted, the mount table does not show them"
            ));
        }
        if missing.is_empty() && stray.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "not reconciled after 30 s: pods {missing:?} have no tmpfs, {stray:?} belong to no manifest\n--- daemon log ---\n{}",
                daemon.log_tail()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    seen.pods = whole.len();
    daemon.stop();
    Ok(())
}

/// Every mount below `dir`, deepest first, detached; then `dir` itself.
fn unmount_all(dir: &Path) {
    let table = MountTable::read_self().expect("read /proc/self/mountinfo");
    let mut below: Vec<PathBuf> = table
        .entries()
        .iter()
        .filter(|m| m.mount_point.starts_with(dir) && m.mount_point != dir)
        .map(|m| m.mount_point.clone())
        .collect();
    below.sort_by(|a, b| b.cmp(a));
    for m in below {
        umount2(&m, MntFlags::MNT_DETACH).unwrap_or_else(|e| panic!("umount {}: {e}", m.display()));
    }
    support::umount(dir);
}

/// Mounts `image` at [`MNT`], checks the journal and the daemon on it,
/// unmounts everything and lets the loop device go.
fn check_state(
    env: &mut Env,
    image: &Path,
    need: u64,
    written: &BTreeMap<u64, Value>,
) -> Result<Seen, String> {
    let dev = support::LoopDevice::attach(image);
    mount(
        Some(dev.path()),
        MNT,
        Some("ext4"),
        MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|e| format!("the replayed ext4 does not mount: {e}"))?;
    let mut seen = Seen {
        journal: env.journal.is_dir(),
        acked: read_acked(&env.journal),
        ..Seen::default()
    };
    let result = catch_unwind(AssertUnwindSafe(|| {
        if seen.journal {
            check_dump(env, need, written, &mut seen)?;
        } else if need > 0 {
            return Err(format!(
                "DURABILITY: records through {need} were acknowledged and committed, the journal dir is gone"
            ));
        }
        check_daemon(env, &mut seen)
    }))
    .unwrap_or_else(|panic| {
        Err(panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "panicked".to_owned()))
    });
    unmount_all(Path::new(MNT));
    assert!(
        dev.close_and_wait_unbound(Duration::from_secs(10)),
        "the loop device stayed bound"
    );
    result.map(|()| seen)
}

// ---------------------------------------------------------------- the test

/// The VM's run, checked enough to trust its log; panics with its output
/// otherwise.
fn recorded(run: &Run) {
    let ev = Evidence::parse(&run.results);
    let problems: Vec<String> = [
        "dm.created",
        "fs.mounted",
        "ready",
        "converged",
        "dm.removed",
    ]
    .iter()
    .filter_map(|s| ev.step(s).err().map(|e| format!("{s}: {e}")))
    .chain((!ev.done).then(|| "no @@DONE".to_owned()))
    .collect();
    assert!(
        problems.is_empty(),
        "the recording VM failed ({}): {problems:?}\n--- console ---\n{}\n--- scenario output ---\n{}\nthe recording VM failed: {problems:?}",
        run.status,
        run.console,
        run.results
    );
}

/// Every record in the VM's dumps (`dump.<round>`, `final.dump`), by seq;
/// panics if two dumps disagree on one (a record never changes).
fn written_records(ev: &Evidence) -> BTreeMap<u64, Value> {
    let mut written: BTreeMap<u64, Value> = BTreeMap::new();
    for name in ev
        .blocks
        .keys()
        .filter(|n| n.starts_with("dump.") || *n == "final.dump")
    {
        let doc = ev.json(name).unwrap_or_else(|e| panic!("the VM's {e}"));
        for r in doc["records"].as_array().into_iter().flatten() {
            let Some(seq) = r["seq"].as_u64() else {
                continue;
            };
            if let Some(old) = written.insert(seq, r.clone()) {
                assert_eq!(&old, r, "record {seq} differs between the VM's dumps");
            }
        }
    }
    assert!(!written.is_empty(), "the VM's dumps show no record");
    written
}

fn replay_every_state() {
    let t0 = Instant::now();
    // VOLUMED_POWERLOSS_RECORDING=<dir> replays a kept recording (its
    // log.raw and disk.raw) instead of booting the VM.
    let (run, dir) = match std::env::var_os("VOLUMED_POWERLOSS_RECORDING") {
        Some(dir) => (None, PathBuf::from(dir)),
        None => {
            let run = boot_vm_with(
                "power_loss.sh",
                false,
                &[Disk {
                    name: "log.raw",
                    size: LOG_SIZE,
                }],
                Some("permissive"),
            );
            recorded(&run);
            let dir = run.scratch.path().to_owned();
            (Some(run), dir)
        }
    };
    let vm_secs = t0.elapsed().as_secs_f64();
    // The records the daemon wrote, from its dumps after every round and
    // at the end (a checkpoint drops the older ones from later dumps).
    let results = fs::read_to_string(dir.join("results.log")).expect("read the VM's results.log");
    let written = written_records(&Evidence::parse(&results));
    let log = Log::open(&dir.join("log.raw")).expect("read the dm-log-writes log");
    assert_eq!(
        log.entries.last().and_then(|e| e.mark.as_deref()),
        Some(support::log_writes::END_MARK),
        "the log ends with the mark of the target's removal"
    );

    // The replayer's own check: the whole log gives the VM's disk.
    let mut whole = Replay::new(&log, DATA_SIZE);
    whole
        .apply_through(log.entries.len() - 1)
        .expect("replay the whole log");
    let img = dir.join("whole.raw");
    whole.write_image(&img).expect("write the replayed image");
    let disk = fs::read(dir.join("disk.raw")).expect("read the VM's disk");
    assert!(
        fs::read(&img).expect("read the replayed image") == disk,
        "replaying the whole log does not give the VM's disk"
    );
    drop(whole);
    let _ = fs::remove_file(&img);

    let seed = env_number("VOLUMED_POWERLOSS_SEED", SEED);
    let how_many = |var: &str, default: usize| {
        usize::try_from(env_number(var, default as u64)).unwrap_or(default)
    };
    let states = choose_states(
        &log,
        seed,
        how_many("VOLUMED_POWERLOSS_RANDOM", RANDOM_STATES),
    );
    let reordered = choose_reordered(
        &log,
        seed,
        how_many("VOLUMED_POWERLOSS_REORDERED", REORDERED_STATES),
    );
    // Prefix states and reordered ones in log order: a reordered state
    // forks the replay at its base.
    let mut plan: Vec<(usize, Kind, &[usize])> =
        states.iter().map(|&(i, k)| (i, k, &[][..])).collect();
    plan.extend(
        reordered
            .iter()
            .map(|(b, w)| (*b, Kind::Reordered, w.as_slice())),
    );
    plan.sort_by_key(|p| (p.0, p.1));

    // A tmpfs over /media (in this namespace only) holds the images and the
    // mount point the VM had (Debian's base-files makes /media; an empty
    // one is made where it is missing).
    support::mkdirs(Path::new("/media"));
    support::mount_tmpfs(Path::new("/media"), "size=1g");
    support::mkdirs(Path::new(MNT));
    let image = Path::new("/media/image.raw");
    let mut env = Env::new("volumed-powerloss-");
    env.root = root();
    env.journal = root().join("volumed");
    env.pods = pods_dir();
    env.objects = Path::new(MNT).join("objects");

    let t1 = Instant::now();
    let final_seq = required_seq(&log, log.entries.len() - 1);
    let mut replay = Replay::new(&log, DATA_SIZE);
    let mut failures = Vec::new();
    let (mut lost, mut with_journal, mut pods, mut max_need, mut dropped) = (0, 0, 0, 0, 0);
    let mut checkpointed = 0;
    for &(i, kind, subset) in &plan {
        replay.apply_through(i).expect("replay the log");
        if subset.is_empty() {
            replay.write_image(image).expect("write the state's image");
        } else {
            let mut fork = replay.fork();
            for &w in subset {
                fork.apply_one(w).expect("replay a write of the subset");
            }
            fork.write_image(image).expect("write the state's image");
        }
        let need = required_seq(&log, i);
        max_need = max_need.max(need);
        match check_state(&mut env, image, need, &written) {
            Ok(seen) => {
                lost += usize::from(seen.lost_tail.is_some());
                with_journal += usize::from(seen.journal);
                dropped += usize::from(seen.journal && seen.recovered < final_seq);
                pods += seen.pods;
                checkpointed += usize::from(seen.checkpoint);
            }
            Err(why) => failures.push(format!(
                "entry {i} ({kind:?}, {:?} flags {:#x}{}), records through {need} required: {why}",
                log.entries[i].mark,
                log.entries[i].flags,
                if subset.is_empty() {
                    String::new()
                } else {
                    format!(", then only entries {subset:?}")
                }
            )),
        }
    }
    let count = |k: Kind| plan.iter().filter(|s| s.1 == k).count();
    let summary = format!(
        "power-loss: {} crash states checked ({} flush/FUA, {} marks, {} random prefixes, {} reordered, 1 end) of {} log entries, seed {seed:#x}; {with_journal} with a journal ({checkpointed} with a checkpoint), {dropped} of them without the last records, {lost} reported a lost tail, {pods} pods reconciled, records required up to seq {max_need} of {final_seq}; VM {vm_secs:.0} s, states {:.0} s",
        plan.len(),
        count(Kind::Durable),
        count(Kind::Mark),
        count(Kind::Random),
        count(Kind::Reordered),
        log.entries.len(),
        t1.elapsed().as_secs_f64()
    );
    eprintln!("{summary}");
    if failures.is_empty() && std::env::var_os("VOLUMED_POWERLOSS_KEEP").is_some() {
        if let Some(r) = run {
            eprintln!("recording kept in {}", r.scratch.keep().display());
        }
        return;
    }
    if !failures.is_empty() {
        let kept = run.map_or(dir, |r| r.scratch.keep());
        panic!(
            "{} of {} crash states failed (log kept in {}):\n{}\n{summary}",
            failures.len(),
            plan.len(),
            kept.display(),
            failures.join("\n")
        );
    }
}

#[test]
fn after_replayed_power_loss_the_daemon_starts_keeps_committed_records_and_invents_no_mount() {
    if !support::vm_wanted(
        "boots a QEMU VM with a Debian kernel for dm-log-writes (apt-get, qemu), loop-mounts the replayed images",
    ) {
        return;
    }
    support::in_private_mount_ns_timeout(Duration::from_secs(1800), replay_every_state);
}

#[test]
fn the_replayer_applies_writes_and_discards_in_log_order() {
    // A hand-made log of four entries: a write of two blocks, a flush, a
    // mark, a discard of the first block.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("log");
    let ss = 512usize;
    let mut log = vec![0u8; ss];
    let le = |v: u64| v.to_le_bytes();
    log[..8].copy_from_slice(&le(0x006a_7366_7773_6872));
    log[8..16].copy_from_slice(&le(1));
    log[16..24].copy_from_slice(&le(4));
    log[24..28].copy_from_slice(&512u32.to_le_bytes());
    let mut entry = |sector: u64, n: u64, flags: u64, extra: &[u8], data: &[u8]| {
        let mut h = vec![0u8; ss];
        h[..8].copy_from_slice(&le(sector));
        h[8..16].copy_from_slice(&le(n));
        h[16..24].copy_from_slice(&le(flags));
        h[24..32].copy_from_slice(&le(extra.len() as u64));
        h[32..32 + extra.len()].copy_from_slice(extra);
        log.extend(h);
        log.extend(data);
    };
    entry(1, 2, 0, b"", &[7u8; 1024]);
    entry(0, 0, support::log_writes::FLUSH, b"", b"");
    entry(0, 0, support::log_writes::MARK, b"here", b"");
    entry(1, 1, support::log_writes::DISCARD, b"", b"");
    fs::write(&path, &log).expect("write the log");

    let log = Log::open(&path).expect("parse the log");
    assert_eq!(log.entries.len(), 4);
    assert_eq!(log.mark("here"), Some(2));
    assert!(log.entries[1].durable_point() && !log.entries[0].durable_point());
    let mut r = Replay::new(&log, 4 * ss);
    r.apply_through(2).expect("apply through the mark");
    let img = dir.path().join("img");
    r.write_image(&img).expect("write");
    let b = fs::read(&img).expect("read");
    assert!(b[..ss].iter().all(|&x| x == 0) && b[ss..3 * ss].iter().all(|&x| x == 7));
    r.apply_through(3).expect("apply the discard");
    r.write_image(&img).expect("write");
    let b = fs::read(&img).expect("read");
    assert!(b[..2 * ss].iter().all(|&x| x == 0) && b[2 * ss..3 * ss].iter().all(|&x| x == 7));
}
