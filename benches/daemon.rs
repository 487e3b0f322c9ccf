//! Daemon benchmark: the real `volumed run` binary at scale, in a private
//! mount namespace, next to the kernel floor of the same work.
//!
//! The bench moves itself into a private mount namespace first (it is one
//! single-threaded process; see `tests/support`); the daemons it spawns live
//! there too, so every mount lives and dies with the bench. It reports three
//! figures, never asserting them (shared VMs vary by several times):
//!
//! 1. **Mass start.** P pods (500) of two volumes each: a tmpfs emptyDir
//!    (`medium: Memory`, no size limit) and a claim bound to a local PV that
//!    is a *directory* of its own (one PV per pod, so every pod gets a real
//!    bind mount and no device target). The PVs and claims are in
//!    `--static-objects` before the daemon starts; the daemon starts with
//!    its `--static-pods` dir missing (complete and empty) and is waited on
//!    until `/readyz` says 200. The clock starts when a fully written dir of
//!    P manifests is `rename(2)`d into place, and stops when the daemon's
//!    `volume_manager_total_volumes{state="actual_state_of_world"}` reaches
//!    2P (polled on `/metrics` every 5 ms; it is set at the end of each
//!    reconcile pass, after the finished jobs are applied to the ASW, so
//!    every intent and outcome is journaled by then). The time when the DSW
//!    gauge reached 2P (manifests seen, parsed, claims resolved) is printed
//!    as a split. **Floor:** the same directories and mounts made by the
//!    bench itself in the same namespace, under a root made a shared bind
//!    mount as the daemon makes its own: per pod `mkdir -p` + tmpfs mount +
//!    `chmod 0777` (the emptyDir's setupDir), `mkdir -p` of the emptyDir's
//!    ready-marker dir (`pods/<uid>/plugins/kubernetes.io~empty-dir/cache`:
//!    three more dirs per pod, which the kubelet and the daemon make) and
//!    `mkdir -p` + bind mount of the PV dir (median of 3 runs, each on fresh
//!    dirs, torn down after). Not in the floor: the marker file itself, the
//!    journal, the mount-table checks the plugins make before mounting. The
//!    same floor without the marker's dirs is printed beside it, with its
//!    ratio, for reference.
//! 2. **Idle CPU** of a daemon holding V_hi mounted volumes (measured
//!    after 3.) (10,000; quick 1,000), over 65 s (quick 5 s), started
//!    right after a health pass asked for then (the one that learns the new
//!    mounts from the table), so the window holds one periodic pass at the
//!    monitor's default 60 s period: utime + stime of the daemon from
//!    `/proc/<pid>/stat`, as a percentage of one core. The bench sleeps
//!    meanwhile. The daemon polls its sources every `--poll-ms` (100 ms
//!    here, as the issue runs it; the default is 1 s).
//! 3. **Memory per volume:** VmRSS (and RssAnon) of a daemon at V_lo and
//!    V_hi mounted volumes (1,000 and 10,000; quick 200 and 1,000), reached
//!    by adding manifests (each written under a name the sources skip, then
//!    renamed) and waiting for the ASW gauge, then until the daemon's CPU
//!    is quiet for a second (at least 2 s: its sweeps and trims over); the slope
//!    in KiB per volume. sled's page cache may grow to
//!    `JournalConfig::cache_capacity` (printed) with the journal's records,
//!    which is part of what the slope shows. The slope differs by a few
//!    tenths of a KiB from one daemon to the next (where the allocator
//!    happened to put what), so it is measured in 3 rounds (quick: 1), each
//!    a fresh daemon with its root on a fresh ext4 as the mass start's, and
//!    the median is the figure; the last round's daemon is the one whose
//!    idle CPU is measured (2.).
//!
//! Sizes: full under `cargo bench --bench daemon` (about 2 min on a 2-core
//! VM, 65 s of it the idle window: one health pass falls in it); `--quick`, `VOLUMED_BENCH_QUICK=1` or a
//! run without `--bench` (`cargo test --benches`) is the small set (about
//! 15 s). Knobs for experiments: `VOLUMED_BENCH_PODS=<n>` (the mass start's
//! P), `VOLUMED_BENCH_POLL_MS=<ms>` (the daemons' `--poll-ms`),
//! `VOLUMED_BENCH_DAEMON_ARGS="--journal off"` (more `volumed run`
//! arguments), `VOLUMED_BENCH_ONLY=mass` (stop after the mass start),
//! `VOLUMED_BENCH_ONLY=memory` (stop after the memory figure),
//! `VOLUMED_BENCH_PROBE=<program>` (run after each memory point with the
//! daemon's pid and volume count as arguments, e.g. a script that has gdb
//! call `malloc_stats()` into the daemon's log, to split RSS into the heap
//! in use and free pages).
//! The journal dir is under `$VOLUMED_BENCH_DIR`, else cargo's
//! `CARGO_TARGET_TMPDIR` (the real disk, not a tmpfs `/tmp`); the root dir
//! and the PV dirs are in a scratch dir under the system temp dir. Needs
//! root; otherwise prints what it skipped and exits 0. Each daemon is
//! stopped with SIGTERM at the end (the time it takes is printed); its
//! stderr log is kept in the scratch dir while the bench runs and its tail
//! printed when something goes wrong.

#[path = "support/mod.rs"]
mod bench_support;
#[path = "../tests/support/mod.rs"]
mod support;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bench_support::{
    BIN, Daemon, POLL, boot_id_file, clk_tck, cpu_ticks, fresh_ext4, journal_tempdir, mounts_below,
    poll_ms, quick_mode, rss_kib, settle_cpu, shared_root, stop_on_ext4, thread_ticks,
    threads_since, uid, write_pods,
};
use nix::mount::{MntFlags, umount2};
use support::{Scratch, bind_mount, enter_private_mount_ns, mkdirs, mount_tmpfs, require_root};
use volumed::journal::JournalConfig;
use volumed::model::{Layout, PluginName, PodUid};

/// Floor runs; the median is reported.
const FLOOR_RUNS: usize = 3;

#[derive(Debug, Clone, Copy)]
struct Sizes {
    quick: bool,
    /// pods in the mass start (two volumes each)
    mass_pods: usize,
    /// volumes at the low and high memory points (even)
    mem_lo: usize,
    mem_hi: usize,
    /// memory rounds, each a fresh daemon on a fresh root (median reported)
    mem_rounds: usize,
    /// idle CPU window
    idle: Duration,
    /// how long to wait for a set of mounts before giving up
    wait: Duration,
}

impl Sizes {
    fn from_args() -> Self {
        let quick = quick_mode();
        let mass_pods = std::env::var("VOLUMED_BENCH_PODS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(500);
        if quick {
            Sizes {
                quick,
                mass_pods,
                mem_lo: 200,
                mem_hi: 1_000,
                mem_rounds: 1,
                idle: Duration::from_secs(5),
                wait: Duration::from_secs(300),
            }
        } else {
            Sizes {
                quick,
                mass_pods,
                mem_lo: 1_000,
                mem_hi: 10_000,
                mem_rounds: 3,
                // longer than the health monitor's default 60 s period, so
                // the window holds one periodic pass over every volume
                idle: Duration::from_secs(65),
                wait: Duration::from_secs(1_800),
            }
        }
    }
}

fn pv_name(i: usize) -> String {
    format!("pv-{i:05}")
}

/// Pod `i`'s manifest: a tmpfs emptyDir and the claim of PV `i`.
fn pod_manifest(i: usize) -> String {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": format!("bench-{i:05}"), "namespace": "default", "uid": uid(i)},
        "spec": {
            "containers": [{
                "name": "app",
                "image": "busybox",
                "volumeMounts": [
                    {"name": "cache", "mountPath": "/cache"},
                    {"name": "data", "mountPath": "/data"}
                ]
            }],
            "volumes": [
                {"name": "cache", "emptyDir": {"medium": "Memory"}},
                {"name": "data", "persistentVolumeClaim": {"claimName": format!("claim-{i:05}")}}
            ]
        }
    })
    .to_string()
}

/// PV `i` (a directory under `pvs`) and the claim bound to it.
fn objects_manifest(i: usize, pvs: &Path) -> String {
    let pv = pv_name(i);
    let claim = format!("claim-{i:05}");
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": pv},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "local",
                    "claimRef": {"namespace": "default", "name": claim},
                    "local": {"path": pvs.join(&pv)},
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "Exists"}
                    ]}]}}
                }
            },
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "namespace": "default"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "local",
                    "volumeName": pv,
                    "resources": {"requests": {"storage": "1Gi"}}
                }
            }
        ]
    })
    .to_string()
}

/// Writes PV dirs and objects for pods `range` into `pvs` / `objects`.
fn write_objects(range: std::ops::Range<usize>, pvs: &Path, objects: &Path) {
    mkdirs(objects);
    for i in range {
        mkdirs(&pvs.join(pv_name(i)));
        fs::write(
            objects.join(format!("objects-{i:05}.json")),
            objects_manifest(i, pvs),
        )
        .expect("write objects manifest");
    }
}

/// One floor run: the daemon's directories and mounts for `pods` pods, done
/// directly; returns the time, then detaches everything. `marker_dirs`:
/// also the dirs of each emptyDir's ready marker
/// (`pods/<uid>/plugins/kubernetes.io~empty-dir/<vol>`), which the daemon
/// makes as the kubelet does.
fn floor_once(root: &Path, pvs: &Path, pods: usize, marker_dirs: bool) -> Duration {
    shared_root(root);
    let layout = Layout::new(root);
    let targets: Vec<(PathBuf, PathBuf, Option<PathBuf>)> = (0..pods)
        .map(|i| {
            let pod = PodUid::new(uid(i)).expect("uid");
            (
                layout.pod_target_path(&pod, PluginName::EmptyDir, "cache"),
                layout.pod_target_path(&pod, PluginName::LocalVolume, &pv_name(i)),
                marker_dirs.then(|| {
                    let marker = layout.empty_dir_ready_marker(&pod, "cache");
                    marker.parent().expect("the marker's dir").to_owned()
                }),
            )
        })
        .collect();
    let start = Instant::now();
    for (i, (tmpfs, bind, marker_dir)) in targets.iter().enumerate() {
        mkdirs(tmpfs);
        mount_tmpfs(tmpfs, "");
        fs::set_permissions(tmpfs, fs::Permissions::from_mode(0o777)).expect("chmod");
        if let Some(d) = marker_dir {
            mkdirs(d);
        }
        mkdirs(bind);
        bind_mount(&pvs.join(pv_name(i)), bind);
    }
    let took = start.elapsed();
    umount2(root, MntFlags::MNT_DETACH).expect("detach floor root");
    took
}

fn main() {
    let sizes = Sizes::from_args();
    if !require_root("the daemon bench runs volumed, which makes real mounts") {
        return;
    }
    enter_private_mount_ns();
    let started = Instant::now();

    let scratch = Scratch::new("volumed-daemon-bench-");
    let jbase = journal_tempdir("volumed-daemon-bench-journal-");
    let boot_file = boot_id_file(scratch.path());
    let pvs = scratch.path().join("pvs");
    let objects = scratch.path().join("objects");
    let p = sizes.mass_pods;
    let objects_for = (sizes.mem_hi / 2).max(p);
    write_objects(0..objects_for, &pvs, &objects);
    println!(
        "daemon bench ({} mode): binary {BIN}; journal under {}; sled cache_capacity {} MiB \
         (JournalConfig default)",
        if sizes.quick { "quick" } else { "full" },
        jbase.path().display(),
        JournalConfig::new("x", "n", "b").cache_capacity >> 20
    );

    // 1. Mass start: floor, then the daemon, each root on a fresh ext4. The
    // floor without the ready markers' dirs runs beside it, for reference.
    let floor_run = |r: usize, marker_dirs: bool| {
        let fs_dir = scratch.path().join(format!("floor-fs-{r}-{marker_dirs}"));
        let dev = fresh_ext4(&fs_dir, 512);
        let took = floor_once(&fs_dir.join("root"), &pvs, p, marker_dirs);
        umount2(&fs_dir, MntFlags::MNT_DETACH).expect("detach the floor's ext4");
        drop(dev);
        took
    };
    // (which of the two runs first alternates between rounds)
    let (mut floors, mut bare_floors): (Vec<Duration>, Vec<Duration>) = (0..FLOOR_RUNS)
        .map(|r| match r % 2 {
            0 => (floor_run(r, true), floor_run(r, false)),
            _ => {
                let bare = floor_run(r, false);
                (floor_run(r, true), bare)
            }
        })
        .unzip();
    floors.sort();
    bare_floors.sort();
    let floor = floors[floors.len() / 2];
    let bare_floor = bare_floors[bare_floors.len() / 2];

    let fs_a = scratch.path().join("daemon-fs-a");
    let dev_a = fresh_ext4(&fs_a, 512);
    let root_a = fs_a.join("root");
    let pods_a = scratch.path().join("pods-a");
    let staged = scratch.path().join("pods-a.staged");
    write_pods(0..p, &staged, pod_manifest);
    let mut a = Daemon::start(
        &root_a,
        &jbase.path().join("journal-a"),
        &pods_a,
        Some(&objects),
        &boot_file,
        scratch.path().join("daemon-a.log"),
    );
    let ready = a.wait_ready(POLL, Duration::from_secs(120));
    let t0 = Instant::now();
    fs::rename(&staged, &pods_a).expect("move the manifests into place");
    let want = 2 * p as u64;
    match a.wait_mounted(want, t0, sizes.wait) {
        Some((dsw_at, asw_at)) => {
            let ratio = asw_at.as_secs_f64() / floor.as_secs_f64();
            println!(
                "mass start: {p} pods x 2 volumes (tmpfs emptyDir + bind of a per-pod local PV dir); \
                 ready {:.0} ms after the spawn, then the manifests moved in; all in the DSW after {:.0} ms",
                ready.as_secs_f64() * 1e3,
                dsw_at.as_secs_f64() * 1e3
            );
            println!(
                "mass start bench: {want} volumes mounted in {:.2} s, floor {:.3} s \
                 (mkdirs incl. the ready markers' dirs + mounts, median of {FLOOR_RUNS}: {}), ratio {ratio:.2}x (target <= 2x); \
                 {:.0} volumes/s",
                asw_at.as_secs_f64(),
                floor.as_secs_f64(),
                floors
                    .iter()
                    .map(|f| format!("{:.3}", f.as_secs_f64()))
                    .collect::<Vec<_>>()
                    .join("/"),
                want as f64 / asw_at.as_secs_f64()
            );
            println!(
                "  floor without the ready markers' dirs: {:.3} s (median of {FLOOR_RUNS}), \
                 ratio {:.2}x",
                bare_floor.as_secs_f64(),
                asw_at.as_secs_f64() / bare_floor.as_secs_f64()
            );
            println!(
                "  check: {} mounts below the root (want {want})",
                mounts_below(&root_a)
            );
        }
        None => println!("mass start: did not finish; log tail:\n{}", a.log_tail()),
    }
    let (rss, anon) = rss_kib(a.pid());
    println!(
        "  daemon after the mass start: VmRSS {rss} KiB (RssAnon {anon} KiB), \
         CPU {:.2} s",
        cpu_ticks(a.pid()) as f64 / clk_tck()
    );
    stop_on_ext4(a, &fs_a, dev_a);

    if std::env::var("VOLUMED_BENCH_ONLY").is_ok_and(|v| v == "mass") {
        return;
    }

    // 2 + 3. Memory at V_lo and V_hi, in rounds of a fresh daemon on a fresh
    // root each (the slope varies by some tenths of a KiB from one daemon
    // to the next: the median is the figure), then idle CPU at V_hi with
    // the last round's daemon.
    let mut slopes = Vec::new();
    let mut last = None;
    for round in 0..sizes.mem_rounds {
        let fs_b = scratch.path().join(format!("daemon-fs-b{round}"));
        let dev_b = fresh_ext4(&fs_b, 2048);
        let pods_b = scratch.path().join(format!("pods-b{round}"));
        let mut b = Daemon::start(
            &fs_b.join("root"),
            &jbase.path().join(format!("journal-b{round}")),
            &pods_b,
            Some(&objects),
            &boot_file,
            scratch.path().join(format!("daemon-b{round}.log")),
        );
        b.wait_ready(POLL, Duration::from_secs(120));
        let (rss0, anon0) = rss_kib(b.pid());
        let mut points = Vec::new();
        let mut from = 0;
        for vols in [sizes.mem_lo, sizes.mem_hi] {
            let t = Instant::now();
            write_pods(from..vols / 2, &pods_b, pod_manifest);
            from = vols / 2;
            let Some((_, at)) = b.wait_mounted(vols as u64, t, sizes.wait) else {
                println!("memory: stopped at {vols}; log tail:\n{}", b.log_tail());
                break;
            };
            settle_cpu(b.pid(), Duration::from_secs(2), sizes.wait);
            let (rss, anon) = rss_kib(b.pid());
            println!(
                "  round {round}: {vols} volumes mounted ({} added in {:.1} s): VmRSS {rss} KiB, \
                 RssAnon {anon} KiB",
                vols - points.last().map_or(0, |(v, _, _)| *v),
                at.as_secs_f64()
            );
            points.push((vols, rss, anon));
            if let Some(probe) = std::env::var_os("VOLUMED_BENCH_PROBE") {
                let _ = Command::new(probe)
                    .arg(b.pid().to_string())
                    .arg(vols.to_string())
                    .status();
            }
        }
        let [(v0, r0, a0), (v1, r1, a1)] = points[..] else {
            stop_on_ext4(b, &fs_b, dev_b);
            break;
        };
        let dv = (v1 - v0) as f64;
        let slope = (r1 as f64 - r0 as f64) / dv;
        println!(
            "  round {round}: VmRSS {r0} KiB at {v0} volumes, {r1} KiB at {v1} (empty: {rss0} KiB, \
             RssAnon {anon0}); slope {slope:.2} KiB/volume (RssAnon {:.2})",
            (a1 as f64 - a0 as f64) / dv,
        );
        slopes.push(slope);
        if round + 1 < sizes.mem_rounds {
            stop_on_ext4(b, &fs_b, dev_b);
        } else {
            last = Some((b, fs_b, dev_b, v1));
        }
    }
    if let Some((b, fs_b, dev_b, v1)) = last {
        let mut sorted = slopes.clone();
        sorted.sort_by(f64::total_cmp);
        println!(
            "memory bench: VmRSS slope {:.2} KiB/volume from {} to {} volumes, median of {} \
             rounds ({}) ({}); sled cache_capacity {} MiB",
            sorted[sorted.len() / 2],
            sizes.mem_lo,
            sizes.mem_hi,
            sorted.len(),
            slopes
                .iter()
                .map(|s| format!("{s:.2}"))
                .collect::<Vec<_>>()
                .join("/"),
            // At 200 -> 1,000 volumes the fixed costs that grow in steps
            // (hash tables, sled's buffers) are most of the slope.
            match sizes.quick {
                true => "quick mode: too few volumes to compare with the 2 KiB target",
                false => "target <= 2 KiB",
            },
            JournalConfig::new("x", "n", "b").cache_capacity >> 20
        );
        // a pass now learns every mount from the table (the monitor's
        // first look at them, once per mount); the window then holds the
        // next periodic pass, one of those every period costs
        let (status, _) = b.get("/debug/health?fresh=1");
        assert_eq!(status, 200, "a health pass before the idle window");
        let before = cpu_ticks(b.pid());
        let threads_before = thread_ticks(b.pid());
        let t = Instant::now();
        if !std::env::var("VOLUMED_BENCH_ONLY").is_ok_and(|v| v == "memory") {
            std::thread::sleep(sizes.idle);
            let ticks = cpu_ticks(b.pid()) - before;
            let secs = t.elapsed().as_secs_f64();
            println!(
                "idle CPU bench: {v1} volumes, {:.2} s CPU over {secs:.1} s = {:.3}% of one core \
                 (target <= 0.5%); --poll-ms {}",
                ticks as f64 / clk_tck(),
                100.0 * ticks as f64 / clk_tck() / secs,
                poll_ms()
            );
            println!(
                "  idle CPU by thread: {}",
                threads_since(b.pid(), &threads_before)
            );
            println!(
                "  check: {} mounts below the root",
                mounts_below(&fs_b.join("root"))
            );
        }
        stop_on_ext4(b, &fs_b, dev_b);
    }
    println!(
        "daemon bench: done in {:.0} s",
        started.elapsed().as_secs_f64()
    );
}
