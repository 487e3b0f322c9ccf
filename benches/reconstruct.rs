//! Reconstruction benchmark on a real mount table: what a restart costs up
//! to a ready actual state of the world with N pod mounts and a journal that
//! agrees with them, next to the physical floor of reading the mount table
//! at all.
//!
//! The bench moves itself into a private mount namespace first (it is one
//! single-threaded process; see `tests/support`), so every mount it makes
//! lives and dies with it and none reaches the host, however it ends. There
//! it builds a kubelet layout with N real pod mounts — half tmpfs emptyDirs,
//! half bind mounts of one ext4-on-loop local-PV device mount (binds are the
//! cheaper mounts to make) — in pods of two volumes each, and a journal in
//! the scratch dir holding what the daemon would have written for them:
//! MountDevice for the device target, SetUp for each pod target (intent +
//! success outcome with the observed mount), appended with
//! [`Journal::append_records`]. Neither is timed (mounting is slow, and
//! slower as the table grows). Then, median of several runs each:
//!
//! - **floor**: one read + parse of `/proc/self/mountinfo`
//!   ([`MountTable::read`]): the kernel formatting the table dominates, and
//!   no reconstruction can skip it;
//! - **ready ASW**: the daemon's phase 1
//!   ([`read_and_reconstruct_ready`]): the same read and parse, the
//!   mount-table part of the scan, every journal target's observation, the
//!   merge, the records that change the journal (none here: it agrees — the
//!   bench asserts it) and the fill of a fresh [`ActualStateOfWorld`]
//!   (which the daemon makes from the journal on one core while the other
//!   reads the table, and keeps because the merge agrees with the journal;
//!   the same core then parses the table's lines as they arrive,
//!   [`MountTable::read_overlapped`]). The floor stays the plain read +
//!   parse; the daemon's overlapped read + parse alone is printed too, with
//!   the ratio to it.
//!
//! It prints `reconstruct bench: N mounts, ready ASW X ms, floor Y ms, ratio
//! Z.ZZx (target <= 1.5x); leftovers walk W ms (after ready)`, where the
//! leftovers walk is phase 2 ([`reconstruct_leftovers`]: the pod-dir walk
//! and its decisions), which runs after the ASW is ready (see
//! docs/merge-table.md, "Two phases at startup"). Breakdown lines show where the time goes: the scan's mount-table
//! part and its pod-dir walk alone, and phase 1 split into read, decide
//! (`reconstruct_ready`), record check and ASW fill (the record check on its
//! own, as [`changed_journal_records`]: the daemon's phase 1 makes it inside
//! the merge, entry by entry, without a second walk of the journal). The
//! bench asserts that
//! every pod target was decided `mounted` with reason `mounted_matches`, so
//! it measured real work.
//!
//! Sizes: N = 10,000 under `cargo bench --bench reconstruct`; 1,000 with
//! `--quick` or `VOLUMED_BENCH_QUICK=1`, and also when run without `--bench`
//! (`cargo test --benches` smoke run); `VOLUMED_BENCH_MOUNTS=<n>` overrides.
//! Needs root; otherwise prints what it skipped and exits 0.

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::{
    LoopDevice, Scratch, bind_mount, enter_private_mount_ns, mkdirs, mkfs_ext4, mount_device,
    mount_tmpfs, require_root, umount,
};
use volumed::host::boot::read_boot_id;
use volumed::host::mountinfo::MountTable;
use volumed::host::scan::{scan_host, scan_mounts, walk_pod_dirs};
use volumed::host::sys::{LinuxSys, Sys};
// the generator the unit tests use, compiled into the bench: it is not
// part of the library
#[path = "../src/host/testgen.rs"]
#[allow(dead_code)] // the bench uses the generator, not the table builder
mod testgen;
use testgen::XorShift;
use volumed::journal::{Body, Journal, JournalConfig, OpResult};
use volumed::model::{
    Layout, MountState, Operation, PluginName, PodUid, PodVolume, Steps, StorageMedium, TargetKind,
    TargetParams, TargetRef, UniqueVolumeName, VolumeSpec,
};
use volumed::reconstruct::edge::{
    HostInput, JournalInput, read_and_reconstruct_ready, reconstruct_leftovers, reconstruct_ready,
};
use volumed::reconstruct::{Reason, apply_to_asw, changed_journal_records};
use volumed::state::ActualStateOfWorld;

const MOUNTINFO: &str = "/proc/self/mountinfo";
/// Runs per measurement; the median is reported.
const RUNS: usize = 21;
/// The local PV bound into every other pod.
const PV: &str = "pv-bench";

fn median_ms<T>(runs: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut times = Vec::with_capacity(runs);
    let mut last = None;
    for _ in 0..runs {
        let start = Instant::now();
        let out = f();
        times.push(start.elapsed());
        last = Some(out);
    }
    (median(times), last.expect("at least one run"))
}

/// The median of `times`, in milliseconds.
fn median(mut times: Vec<Duration>) -> f64 {
    times.sort();
    times[times.len() / 2].as_secs_f64() * 1e3
}

fn mount_count() -> usize {
    let args: Vec<String> = std::env::args().collect();
    if let Some(n) = std::env::var("VOLUMED_BENCH_MOUNTS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return n;
    }
    let quick = args.iter().any(|a| a == "--quick")
        || std::env::var("VOLUMED_BENCH_QUICK").is_ok_and(|v| v == "1")
        || !args.iter().any(|a| a == "--bench");
    if quick { 1_000 } else { 10_000 }
}

/// A memory emptyDir as the daemon's SetUp records it (as
/// `tests/reconstruct_real.rs` builds it).
fn tmpfs_params(layout: &Layout, pod: &PodUid, name: &str) -> TargetParams {
    let spec = VolumeSpec::EmptyDir {
        medium: StorageMedium::Memory,
        size_limit: None,
    };
    TargetParams::at(
        PodVolume::unique_name(&spec, pod, name),
        PluginName::EmptyDir,
        name.into(),
        TargetRef::Pod(pod.clone()),
        TargetKind::Mount,
        Some(
            layout
                .pod_target_path(pod, PluginName::EmptyDir, name)
                .into(),
        ),
    )
    .with_mount_options(vec!["size=1m".into()].into())
    .with_fs_type(Some("tmpfs".into()))
}

/// The local PV's device target or one pod's bind of it.
fn local_params(layout: &Layout, device: &Path, target: TargetRef) -> TargetParams {
    let pod_path = target.pod().map(|p| {
        layout
            .pod_target_path(p, PluginName::LocalVolume, PV)
            .into()
    });
    TargetParams::at(
        UniqueVolumeName::shared(PluginName::LocalVolume, PV),
        PluginName::LocalVolume,
        PV.into(),
        target,
        TargetKind::Mount,
        None,
    )
    .with_pod_mount_path(pod_path)
    .with_device_path(Some(device.to_owned().into()))
    .with_device_mount_path(Some(layout.local_device_path(PV).into()))
    .with_fs_type(Some("ext4".into()))
}

/// Journals every operation in `ops` as done (intent, then success outcome
/// with the mount the table shows): two batches.
fn journal_done(j: &Journal, ops: &[(Operation, TargetParams)], table: &MountTable) {
    let intents = ops
        .iter()
        .map(|(op, p)| Body::Intent {
            op: *op,
            steps: Steps::Single,
            target: p.clone().into(),
        })
        .collect();
    let seqs = j.append_records(intents).expect("append intents");
    let outcomes = ops
        .iter()
        .zip(seqs)
        .map(|((op, p), intent_seq)| {
            let path = p.path().expect("a target path");
            let top = table
                .top_at(path)
                .unwrap_or_else(|| panic!("nothing mounted at {}", path.display()));
            Body::Outcome {
                intent_seq,
                op: *op,
                result: OpResult::Success,
                observed: Some(top.identity()),
            }
        })
        .collect();
    j.append_records(outcomes).expect("append outcomes");
}

fn main() {
    let n = mount_count();
    if !require_root("the reconstruct bench makes real mounts") {
        return;
    }
    enter_private_mount_ns();

    let scratch = Scratch::new("volumed-reconstruct-bench-");
    let layout = Layout::new(scratch.path().join("kubelet"));
    let image = scratch.path().join("pv-bench.img");
    mkfs_ext4(&image, 16);
    let lo = LoopDevice::attach(&image);
    let device = layout.local_device_path(PV);
    mkdirs(&device);
    mount_device(lo.path(), &device, "ext4");

    let start = Instant::now();
    let mut rng = XorShift::new(0x5eed);
    let mut pod = PodUid::new(rng.pod_uid()).expect("generated uid");
    let mut mounts: Vec<PathBuf> = Vec::with_capacity(n);
    let mut ops = vec![(
        Operation::MountDevice,
        local_params(&layout, lo.path(), TargetRef::Device),
    )];
    for i in 0..n {
        let p = if i % 2 == 0 {
            pod = PodUid::new(rng.pod_uid()).expect("generated uid");
            let p = tmpfs_params(&layout, &pod, "cache");
            let t = p.pod_mount_path.clone().expect("pod path");
            mkdirs(&t);
            mount_tmpfs(&t, "size=1m");
            mounts.push(t.to_path_buf());
            p
        } else {
            let p = local_params(&layout, lo.path(), TargetRef::Pod(pod.clone()));
            let t = p.pod_mount_path.clone().expect("pod path");
            mkdirs(&t);
            bind_mount(&device, &t);
            mounts.push(t.to_path_buf());
            p
        };
        ops.push((Operation::SetUp, p));
    }
    let setup = start.elapsed();

    // The agreeing journal: what the daemon wrote while making those mounts.
    let start = Instant::now();
    let boot = read_boot_id(None).expect("boot id");
    let (journal, _) = Journal::open(&JournalConfig::new(
        scratch.path().join("journal"),
        "bench-node",
        boot.as_str(),
    ))
    .expect("open journal");
    journal_done(
        &journal,
        &ops,
        &MountTable::read_self().expect("read mountinfo"),
    );
    let journaled = start.elapsed();

    let mi = Path::new(MOUNTINFO);
    // Floor and ready runs alternate, so both see the same machine (sled's
    // background flush of the records just written, page cache, another
    // process): a drift lands on both sides of the ratio, not on one.
    let ready_once = || {
        let r = read_and_reconstruct_ready(&journal, None, &LinuxSys, &layout, &boot, None)
            .expect("phase 1");
        // the journal agrees: the ASW filled while the table was read is kept
        assert!(r.asw_from_journal, "the ASW was filled after the merge");
        (r.outcome, r.asw, r.table)
    };
    let (mut floors, mut readies) = (Vec::with_capacity(RUNS), Vec::with_capacity(RUNS));
    let mut last = None;
    for _ in 0..RUNS {
        let start = Instant::now();
        let t = MountTable::read(mi).expect("read mountinfo");
        floors.push(start.elapsed());
        drop(t);
        let start = Instant::now();
        let out = ready_once();
        readies.push(start.elapsed());
        last = Some(out);
    }
    let (floor, ready) = (median(floors), median(readies));
    let (outcome, asw, table) = last.expect("at least one run");
    let (read_only, bytes) = median_ms(RUNS, || {
        volumed::host::mountinfo::read_mountinfo(mi).expect("read mountinfo")
    });
    let (parse_only, _) = median_ms(RUNS, || MountTable::parse(&bytes));
    // the daemon's own way to read: parsed on this thread as a second one reads
    let (overlapped, _) = median_ms(RUNS, || {
        MountTable::read_overlapped(|piece| LinuxSys.read_mountinfo_pieces(piece), || ())
            .0
            .expect("read mountinfo")
    });
    let host = HostInput {
        layout: &layout,
        table: &table,
        boot_id: &boot,
        sys: &LinuxSys,
    };
    // the bench must have measured real work
    let out = &outcome.reconstruction.output;
    assert_eq!(
        out.decisions.len(),
        n + 1,
        "one decision per journal target"
    );
    let pods: Vec<_> = out
        .decisions
        .iter()
        .filter(|d| matches!(d.key.target, TargetRef::Pod(_)))
        .collect();
    assert_eq!(pods.len(), n, "pod targets decided");
    for d in &pods {
        assert_eq!(
            (d.result, d.reason),
            (MountState::Mounted, Reason::MountedMatches),
            "{:?}",
            d.key
        );
    }
    assert!(out.failed.is_empty(), "{:?}", out.failed);
    assert!(outcome.asw_errors.is_empty(), "{:?}", outcome.asw_errors);
    assert!(
        outcome.appended.is_empty(),
        "the journal agrees: nothing to append, got {}",
        outcome.appended.len()
    );
    assert_eq!(outcome.unchanged, n + 1);
    let asw_pods: usize = asw.snapshot().volumes.iter().map(|v| v.pods.len()).sum();
    assert_eq!(asw_pods, n, "every pod target is in the ASW");

    // Phase 2, after ready: the pod-dir walk and its (here: no) decisions.
    let (leftovers, left) = median_ms(RUNS, || {
        journal.with_state(|s| {
            reconstruct_leftovers(&host, JournalInput::Replayed(s), &outcome.reconstruction)
        })
    });
    assert!(
        left.output.decisions.is_empty(),
        "{:?}",
        left.output.decisions
    );

    // where the time goes, on the already-read table
    let (scan, view) = median_ms(RUNS, || {
        scan_host(&LinuxSys, &layout, mi, None).expect("scan host")
    });
    assert_eq!(view.pod_targets.len(), n, "pod targets found");
    assert_eq!(view.device_targets.len(), 1, "device targets found");
    assert!(view.problems.is_empty(), "{:?}", view.problems);
    let (mounts_part, _) = median_ms(RUNS, || scan_mounts(&table, &layout));
    let (walk_part, _) = median_ms(RUNS, || {
        walk_pod_dirs(&LinuxSys, &layout, &table, &mut Vec::new())
    });
    let (decide, r) = median_ms(RUNS, || {
        journal.with_state(|s| reconstruct_ready(&host, JournalInput::Replayed(s)))
    });
    let (check, changed) = median_ms(RUNS, || {
        journal.with_state(|s| changed_journal_records(&r.output, s, boot.as_str()).len())
    });
    assert_eq!(changed, 0);
    let (fill, _) = median_ms(RUNS, || {
        let mut asw = ActualStateOfWorld::new();
        apply_to_asw(&r.output, &mut asw);
        asw
    });

    println!(
        "setup: {n} pod mounts + 1 device mount made in {:.2} s ({:.0} µs each), \
         {} journal records in {:.2} s (not timed below)",
        setup.as_secs_f64(),
        setup.as_secs_f64() * 1e6 / n.max(1) as f64,
        2 * ops.len(),
        journaled.as_secs_f64()
    );
    println!(
        "table: {} lines; {} decisions, {} appended, {} unchanged",
        table.len(),
        out.decisions.len(),
        outcome.appended.len(),
        outcome.unchanged
    );
    println!(
        "scan breakdown: mount-table part {mounts_part:.2} ms, pod-dir walk {walk_part:.2} ms \
         (+ boot id, read + parse, vol_data: full scan_host {scan:.2} ms)"
    );
    println!(
        "ready breakdown: read + parse {floor:.2} ms (read {read_only:.2}, parse {parse_only:.2}), reconstruct_ready {decide:.2} ms, \
         record check {check:.2} ms, ASW fill {fill:.2} ms"
    );
    println!(
        "reconstruct bench: {n} mounts, ready ASW {ready:.2} ms, floor {floor:.2} ms, \
         ratio {:.2}x (target <= 1.5x); leftovers walk {leftovers:.2} ms (after ready)",
        ready / floor
    );
    println!(
        "  the daemon's read + parse alone (parsed as a second thread reads): \
         {overlapped:.2} ms; ready ASW to it: {:.2}x",
        ready / overlapped
    );

    drop(journal);
    let start = Instant::now();
    for m in mounts.iter().rev() {
        umount(m);
    }
    umount(&device);
    assert!(
        lo.close_and_wait_unbound(Duration::from_secs(5)),
        "loop device still bound after the bench"
    );
    println!(
        "teardown: {} unmounts in {:.2} s",
        n + 1,
        start.elapsed().as_secs_f64()
    );
}
