//! Reconstruction benchmark on a real mount table: what the host side of a
//! restart costs with N pod mounts, next to the physical floor of reading the
//! mount table at all.
//!
//! The bench moves itself into a private mount namespace first (it is one
//! single-threaded process; see `tests/support`), so every mount it makes
//! lives and dies with it and none reaches the host, however it ends. There
//! it builds a kubelet layout with N real pod mounts — half tmpfs emptyDirs,
//! half bind mounts of one ext4-on-loop local-PV device mount (binds are the
//! cheaper mounts to make) — in pods of two volumes each. Making them is not
//! timed (storage-facts C1: ~0.2 ms per mount at 10k). Then, median of
//! several runs each:
//!
//! - **floor**: one read + parse of `/proc/self/mountinfo`
//!   ([`MountTable::read`]): the kernel formatting the table dominates, and
//!   no reconstruction can skip it;
//! - **scan**: [`scan_host`] over the same table: boot id, the same read and
//!   parse, the mount-table part, the pod-dir walk and CSI `vol_data.json`.
//!
//! plus, for where the time goes, the scan's pure mount-table part and its
//! pod-dir walk alone on the already-read table; and prints `reconstruct bench: N mounts, scan X ms, floor Y ms, ratio
//! Z.ZZx`. The merge with the journal and the ASW fill are not measured yet:
//! [`reconstruct_hook`] is where the reconstruction edge plugs in.
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
use volumed::host::mountinfo::MountTable;
use volumed::host::scan::{HostView, scan_host, scan_mounts, walk_pod_dirs};
use volumed::host::testgen::XorShift;
use volumed::model::{Layout, PluginName, PodUid};

const MOUNTINFO: &str = "/proc/self/mountinfo";
/// Runs per measurement; the median is reported.
const RUNS: usize = 7;

/// HOOK for the reconstruction edge: the person wiring journal × host into
/// the daemon adds the merge (`volumed::reconstruct::merge` over the replayed
/// journal and this view) and the ASW fill (`apply_to_asw`) here, and times
/// it beside the scan. Until then it only counts what the scan found, so the
/// view is used and cannot be optimised away.
fn reconstruct_hook(view: &HostView) -> usize {
    view.device_targets.len() + view.pod_targets.len() + view.found_dirs.len()
}

fn median_ms<T>(runs: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut times = Vec::with_capacity(runs);
    let mut last = None;
    for _ in 0..runs {
        let start = Instant::now();
        let out = f();
        times.push(start.elapsed());
        last = Some(out);
    }
    times.sort();
    let ms = times[times.len() / 2].as_secs_f64() * 1e3;
    (ms, last.expect("at least one run"))
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
    let device = layout.local_device_path("pv-bench");
    mkdirs(&device);
    mount_device(lo.path(), &device, "ext4");

    let start = Instant::now();
    let mut rng = XorShift::new(0x5eed);
    let mut pod = PodUid::new(rng.pod_uid()).expect("generated uid");
    let mut mounts: Vec<PathBuf> = Vec::with_capacity(n);
    for i in 0..n {
        if i % 2 == 0 {
            pod = PodUid::new(rng.pod_uid()).expect("generated uid");
            let t = layout.pod_target_path(&pod, PluginName::EmptyDir, "cache");
            mkdirs(&t);
            mount_tmpfs(&t, "size=1m");
            mounts.push(t);
        } else {
            let t = layout.pod_target_path(&pod, PluginName::LocalVolume, "pv-bench");
            mkdirs(&t);
            bind_mount(&device, &t);
            mounts.push(t);
        }
    }
    let setup = start.elapsed();

    let mi = Path::new(MOUNTINFO);
    let (floor, table) = median_ms(RUNS, || MountTable::read(mi).expect("read mountinfo"));
    let (scan, view) = median_ms(RUNS, || scan_host(&layout, mi, None).expect("scan host"));
    // where the scan's time goes, on the already-read table
    let (mounts_part, _) = median_ms(RUNS, || scan_mounts(&table, &layout));
    let (walk_part, _) = median_ms(RUNS, || walk_pod_dirs(&layout, &table, &mut Vec::new()));
    let found = reconstruct_hook(&view);
    // the bench must have measured real work
    assert_eq!(view.pod_targets.len(), n, "pod targets found");
    assert_eq!(view.device_targets.len(), 1, "device targets found");
    assert!(view.problems.is_empty(), "{:?}", view.problems);

    println!(
        "setup: {n} pod mounts + 1 device mount made in {:.2} s ({:.0} µs each, not timed below)",
        setup.as_secs_f64(),
        setup.as_secs_f64() * 1e6 / n.max(1) as f64
    );
    println!(
        "table: {} lines; hook saw {found} targets (merge + ASW fill not wired yet)",
        table.len()
    );
    println!(
        "scan breakdown: mount-table part {mounts_part:.2} ms, pod-dir walk {walk_part:.2} ms \
         (+ boot id, read + parse, vol_data)"
    );
    println!(
        "reconstruct bench: {n} mounts, scan {scan:.2} ms, floor {floor:.2} ms, ratio {:.2}x",
        scan / floor
    );

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
