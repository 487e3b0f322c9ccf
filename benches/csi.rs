//! CSI benchmark (issue 14): the real `volumed run` binary driving the real
//! test CSI driver (`volumed-testdriver`, one process, started by the bench,
//! given to the daemon with `--csi-driver NAME=SOCKET`), next to floors
//! measured in the same run. Figures are printed, never asserted.
//!
//! The bench moves itself into a private mount namespace first (as
//! `benches/daemon.rs`; one single-threaded process), so every mount — the
//! driver's and the daemons' — lives and dies with it. Every volume is a
//! PersistentVolume with `spec.csi {driver, volumeHandle}` bound to a claim
//! of its own (one per pod), with a CSIDriver object of `attachRequired:
//! false`, all in `--static-objects` before the daemon starts. The driver
//! stages with a tmpfs at `plugins/kubernetes.io/csi/<driver>/<sha256 of
//! handle>/globalmount` and publishes with a bind at
//! `pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount`; it logs every RPC to
//! `<state>/calls.jsonl` (fsynced, before the work), which the bench reads to
//! count the calls. Each root (daemon's and floors') is a fresh ext4 on an
//! autoclear loop device, made a shared bind mount of itself as the daemon
//! makes its own.
//!
//! 1. **Mass start.** P pods (200; quick 50) of one CSI volume each. The
//!    daemon starts with its `--static-pods` dir missing and is waited on
//!    until `/readyz` says 200; the clock starts when a fully written dir of
//!    P manifests is `rename(2)`d into place and stops when
//!    `volume_manager_total_volumes{state="actual_state_of_world"}` reaches
//!    P (polled on `/metrics` every 5 ms). **Floor:** the same
//!    NodeStageVolume + NodePublishVolume calls (the daemon's staging and
//!    target path layout under a fresh root, the same request fields, fresh
//!    volume handles) made by the bench through `volumed::csi::CsiClient`
//!    over `volumed::csi::connect_unix` to a fresh driver process of the same
//!    binary (after its NodeGetInfo + NodeGetCapabilities, not timed):
//!    one volume after another (stage, then publish), and with the daemon's
//!    parallelism (16 tasks, each staging then publishing its share), median
//!    of 3 runs each (quick: 1). Both ratios are printed; the target
//!    is the daemon at most 1.2x the direct calls. Then the driver's call log
//!    of the daemon's run, by method, and a check that every volume got
//!    exactly one NodeStageVolume and one NodePublishVolume.
//! 2. **Restart.** R pods (1,000; quick 100) of one CSI volume each, in
//!    `--static-pods` before the spawn; once all are in the ASW the daemon is
//!    stopped with SIGTERM (the mounts and the driver stay) and spawned
//!    again on the same root, journal and manifests: the time from the spawn
//!    to `/readyz` 200 (asked every 5 ms), against two **floors** of the
//!    same mount table, right after the stop (median of 11 each): the
//!    kernel's raw read of `/proc/self/mountinfo` (its bytes, no parse) and
//!    one read and parse with our own parser (`MountTable::read`), both
//!    ratios printed. From 10,000 to 50,000 pods the restart is judged
//!    against the goal of issue 43, within 5x the raw read: a `DEFECT` line
//!    over it (as `benches/scale.rs` prints them). Then the daemon's startup
//!    phase lines (`phase=… elapsed_ms=…`), and the RPCs the driver
//!    logged from the restart until the ASW held R volumes again and 1 s
//!    (quick 0.5 s) more (the target is no NodeStageVolume and no
//!    NodePublishVolume; any is a `DEFECT` line). Then the same after a
//!    SIGKILL of the restarted daemon.
//!
//! Sizes: full under `cargo bench --bench csi` (about 1 min on a 2-core
//! VM); `--quick`, `VOLUMED_BENCH_QUICK=1` or a run without `--bench`
//! (`cargo test --benches`) is the small set (a few seconds).
//! `VOLUMED_BENCH_CSI_PODS=<n>` and `VOLUMED_BENCH_CSI_RESTART=<n>` pick
//! other P and R; `VOLUMED_BENCH_POLL_MS` and `VOLUMED_BENCH_DAEMON_ARGS` are
//! passed on as in `benches/daemon.rs`. Journals are under
//! `$VOLUMED_BENCH_DIR`, else cargo's `CARGO_TARGET_TMPDIR`; roots, driver
//! sockets and call logs in a scratch dir under the system temp dir. Needs
//! root; otherwise prints what it skipped and exits 0. The driver processes
//! and daemons are children of the bench, killed if it panics.

#[path = "support/mod.rs"]
mod bench_support;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use bench_support::{
    BIN, Daemon, MOUNTED_POLL, POLL, RESTART_GOAL_FROM, RESTART_GOAL_RAW, TableFloors,
    boot_id_file, drop_ext4, fresh_ext4, journal_tempdir, median, mounts_below, quick_mode,
    shared_root, table_floors, uid, write_pods,
};
use nix::mount::{MntFlags, umount2};
use support::csi_driver::{DriverOpts, TestDriver, read_calls};
use support::{Scratch, enter_private_mount_ns, mkdirs, require_root};
use volumed::csi::client::{DEFAULT_TIMEOUT, access_mode, mount_capability};
use volumed::csi::proto::csi_v1 as pb;
use volumed::csi::{CsiClient, NodeCaps, connect_unix};
use volumed::model::{AccessMode, Layout, PluginName, PodUid};

/// The driver's name (GetPluginInfo, the PVs' `spec.csi.driver`).
const DRIVER: &str = "bench.csi.volumed";
/// The daemon's default worker count: the parallel floor's tasks.
const DAEMON_WORKERS: usize = 16;
/// The fresh ext4 root for `pods` pods of one CSI volume: about 200 KiB
/// each, so with ext4's one inode per 16 KiB a pod has some 12 inodes (it
/// takes about 9: the pod's dirs, the staging dir, two `vol_data.json`).
fn ext4_mb(pods: usize) -> u64 {
    (pods as u64 * 200 / 1024).max(512)
}
const STAGE: &str = "NodeStageVolume";
const PUBLISH: &str = "NodePublishVolume";
/// Reads of the mount table per floor; the median is the floor.
const READ_RUNS: usize = 11;

#[derive(Debug, Clone, Copy)]
struct Sizes {
    quick: bool,
    /// pods in the mass start (one CSI volume each)
    mass_pods: usize,
    /// pods restarted over (one CSI volume each)
    restart_pods: usize,
    /// floor runs per mode (median reported)
    floor_runs: usize,
    /// how long to keep counting RPCs after the restarted daemon's ASW is full
    settle: Duration,
    /// how long to wait for a set of mounts before giving up
    wait: Duration,
}

impl Sizes {
    fn from_args() -> Self {
        let quick = quick_mode();
        let env = |name: &str, default: usize| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        let (mass_pods, restart_pods) = (
            env("VOLUMED_BENCH_CSI_PODS", if quick { 50 } else { 200 }),
            env("VOLUMED_BENCH_CSI_RESTART", if quick { 100 } else { 1_000 }),
        );
        // a first start of n volumes reads a mount table of up to 2n lines
        // after each call: a wait long enough for 10,000 grows with n
        let per_pod = Duration::from_millis(300)
            * u32::try_from(mass_pods.max(restart_pods)).unwrap_or(u32::MAX);
        Sizes {
            quick,
            mass_pods,
            restart_pods,
            floor_runs: if quick { 1 } else { 3 },
            settle: Duration::from_millis(if quick { 500 } else { 1_000 }),
            wait: Duration::from_secs(if quick { 30 } else { 600 }).max(per_pod),
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn pv_name(prefix: &str, i: usize) -> String {
    format!("{prefix}pv-{i:05}")
}

fn handle(prefix: &str, i: usize) -> String {
    format!("{prefix}vol-{i:05}")
}

/// Pod `i`'s manifest: one volume, the claim of PV `i`.
fn pod_manifest(i: usize) -> String {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": format!("bench-{i:05}"), "namespace": "default", "uid": uid(i)},
        "spec": {
            "containers": [{
                "name": "app",
                "image": "busybox",
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]
            }],
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": format!("claim-{i:05}")}}
            ]
        }
    })
    .to_string()
}

/// Writes the CSIDriver (`attachRequired: false`) and, for each `i` in
/// `0..n`, PV `<prefix>pv-i` (handle `<prefix>vol-i`) and the claim bound to it.
fn write_objects(n: usize, prefix: &str, objects: &Path) {
    mkdirs(objects);
    let driver = serde_json::json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSIDriver",
        "metadata": {"name": DRIVER},
        "spec": {"attachRequired": false}
    });
    fs::write(objects.join("csidriver.json"), driver.to_string()).expect("write the CSIDriver");
    for i in 0..n {
        let pv = pv_name(prefix, i);
        let claim = format!("claim-{i:05}");
        let list = serde_json::json!({
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
                        "claimRef": {"namespace": "default", "name": claim},
                        "csi": {"driver": DRIVER, "volumeHandle": handle(prefix, i)}
                    }
                },
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {"name": claim, "namespace": "default"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "volumeName": pv,
                        "resources": {"requests": {"storage": "1Gi"}}
                    }
                }
            ]
        });
        fs::write(
            objects.join(format!("objects-{i:05}.json")),
            list.to_string(),
        )
        .expect("write objects manifest");
    }
}

/// A `volumed-testdriver` with its socket and state (call log) in `dir`.
fn spawn_driver(dir: &Path) -> TestDriver {
    mkdirs(dir);
    TestDriver::spawn(DriverOpts::in_dir(DRIVER, dir))
}

/// The calls logged by the driver whose state is in `state`, from the
/// `from`th on, counted by method.
fn count_by_method(state: &Path, from: usize) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for c in read_calls(state).iter().skip(from) {
        let m = c["method"].as_str().unwrap_or("?").to_owned();
        *out.entry(m).or_insert(0) += 1;
    }
    out
}

fn counts_text(counts: &BTreeMap<String, usize>) -> String {
    if counts.is_empty() {
        return "none".to_owned();
    }
    counts
        .iter()
        .map(|(m, n)| format!("{m} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks the call log against "one `method` per volume of `handles`":
/// a line naming the volumes that got none, more than one, or were not
/// expected.
fn per_volume_check(calls: &[serde_json::Value], method: &str, handles: &[String]) -> String {
    let mut per: BTreeMap<&str, usize> = BTreeMap::new();
    for c in calls.iter().filter(|c| c["method"] == method) {
        *per.entry(c["volume_id"].as_str().unwrap_or("?"))
            .or_insert(0) += 1;
    }
    let missing: Vec<&str> = handles
        .iter()
        .map(String::as_str)
        .filter(|h| !per.contains_key(h))
        .collect();
    let repeated: Vec<String> = per
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(h, n)| format!("{h} x{n}"))
        .collect();
    let unexpected: Vec<&str> = per
        .keys()
        .copied()
        .filter(|h| !handles.iter().any(|x| x == h))
        .collect();
    if missing.is_empty() && repeated.is_empty() && unexpected.is_empty() {
        return format!(
            "exactly one {method} for each of the {} volumes",
            handles.len()
        );
    }
    let few = |v: &[&str]| v.iter().take(5).copied().collect::<Vec<_>>().join(", ");
    format!(
        "{method}: {} volumes without one ({}), {} with more than one ({}), {} not expected ({})",
        missing.len(),
        few(&missing),
        repeated.len(),
        repeated
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join(", "),
        unexpected.len(),
        few(&unexpected)
    )
}

/// One volume's two requests, as the daemon makes them for a PV with
/// `spec.csi {driver, volumeHandle}`, ReadWriteOnce, no fsType, no
/// attributes, no secrets, no SELinux label.
fn requests(
    layout: &Layout,
    i: usize,
    caps: NodeCaps,
) -> (pb::NodeStageVolumeRequest, pb::NodePublishVolumeRequest) {
    let vol = handle("floor-", i);
    let staging = layout.csi_device_path(DRIVER, &Layout::csi_handle_hash(&vol));
    let pod = PodUid::new(uid(i)).expect("uid");
    let target = layout.pod_target_path(&pod, PluginName::Csi, &pv_name("floor-", i));
    let path = |p: &Path| p.to_str().expect("utf-8 path").to_owned();
    let cap = || {
        Some(mount_capability(
            None,
            &[],
            None,
            access_mode(&[AccessMode::ReadWriteOnce], caps),
        ))
    };
    (
        pb::NodeStageVolumeRequest {
            volume_id: vol.clone(),
            staging_target_path: path(&staging),
            volume_capability: cap(),
            ..Default::default()
        },
        pb::NodePublishVolumeRequest {
            volume_id: vol,
            staging_target_path: path(&staging),
            target_path: path(&target),
            volume_capability: cap(),
            readonly: false,
            ..Default::default()
        },
    )
}

/// One floor run on a fresh root (a fresh ext4) with a fresh driver
/// process: NodeStage + NodePublish of `n` volumes over `tasks` concurrent
/// tasks (1: one after another). Returns the time, after checking the
/// mounts; tears everything down.
fn floor_once(scratch: &Path, run: &str, n: usize, tasks: usize) -> Duration {
    let fs_dir = scratch.join(format!("floor-fs-{run}"));
    let dev = fresh_ext4(&fs_dir, ext4_mb(n));
    let root = fs_dir.join("root");
    shared_root(&root);
    let mut driver = spawn_driver(&scratch.join(format!("floor-driver-{run}")));
    let layout = Layout::new(&root);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let took = rt.block_on(async {
        let channel = connect_unix(driver.endpoint())
            .await
            .expect("connect to the driver");
        let client = CsiClient::new(DRIVER, channel, DEFAULT_TIMEOUT, None);
        client.node_info().await.expect("NodeGetInfo");
        let caps = client.node_caps().await.expect("NodeGetCapabilities");
        assert!(caps.stage_unstage, "the test driver stages");
        let reqs: Vec<_> = (0..n).map(|i| requests(&layout, i, caps)).collect();
        let start = Instant::now();
        if tasks <= 1 {
            for (stage, publish) in reqs {
                client.stage(stage).await.expect("NodeStageVolume");
                client.publish(publish).await.expect("NodePublishVolume");
            }
        } else {
            let mut shares: Vec<Vec<_>> = (0..tasks).map(|_| Vec::new()).collect();
            for (i, r) in reqs.into_iter().enumerate() {
                shares[i % tasks].push(r);
            }
            let handles: Vec<_> = shares
                .into_iter()
                .map(|share| {
                    let client = client.clone();
                    tokio::spawn(async move {
                        for (stage, publish) in share {
                            client.stage(stage).await.expect("NodeStageVolume");
                            client.publish(publish).await.expect("NodePublishVolume");
                        }
                    })
                })
                .collect();
            for h in handles {
                h.await.expect("floor task");
            }
        }
        start.elapsed()
    });
    drop(rt);
    let below = mounts_below(&root);
    if below != 2 * n {
        println!(
            "  floor {run}: {below} mounts below the root, want {}",
            2 * n
        );
    }
    driver.stop();
    umount2(&root, MntFlags::MNT_DETACH).expect("detach the floor root");
    drop_ext4(&fs_dir, dev);
    took
}

fn times_text(times: &[Duration]) -> String {
    times
        .iter()
        .map(|t| format!("{:.3}", t.as_secs_f64()))
        .collect::<Vec<_>>()
        .join("/")
}

fn mass_start(sizes: &Sizes, scratch: &Path, journals: &Path, boot_file: &Path) {
    let p = sizes.mass_pods;
    // which mode runs first alternates between rounds
    let (mut seq, mut par) = (Vec::new(), Vec::new());
    for r in 0..sizes.floor_runs {
        if r % 2 == 0 {
            seq.push(floor_once(scratch, &format!("seq-{r}"), p, 1));
            par.push(floor_once(scratch, &format!("par-{r}"), p, DAEMON_WORKERS));
        } else {
            par.push(floor_once(scratch, &format!("par-{r}"), p, DAEMON_WORKERS));
            seq.push(floor_once(scratch, &format!("seq-{r}"), p, 1));
        }
    }
    let (seq_all, par_all) = (times_text(&seq), times_text(&par));
    let (floor_seq, floor_par) = (median(&mut seq), median(&mut par));

    let objects = scratch.join("mass-objects");
    write_objects(p, "", &objects);
    let driver_dir = scratch.join("mass-driver");
    let driver = spawn_driver(&driver_dir);
    let state = driver.opts().state.clone();
    let fs_dir = scratch.join("mass-fs");
    let dev = fresh_ext4(&fs_dir, ext4_mb(p));
    let root = fs_dir.join("root");
    let pods = scratch.join("mass-pods");
    let staged = scratch.join("mass-pods.staged");
    write_pods(0..p, &staged, pod_manifest);
    let mut d = Daemon::start_with(
        &root,
        &journals.join("journal-mass"),
        &pods,
        Some(&objects),
        boot_file,
        scratch.join("mass-daemon.log"),
        &[
            "--csi-driver".to_owned(),
            format!("{DRIVER}={}", driver.endpoint().display()),
        ],
    );
    let ready = d.wait_ready(POLL, Duration::from_secs(120));
    let t0 = Instant::now();
    fs::rename(&staged, &pods).expect("move the manifests into place");
    match d.wait_mounted(p as u64, t0, sizes.wait) {
        Some((dsw_at, asw_at)) => {
            println!(
                "mass start: {p} pods x 1 CSI volume (NodeStage: tmpfs, NodePublish: bind); \
                 ready {:.0} ms after the spawn, then the manifests moved in; all in the DSW after {:.0} ms",
                ms(ready),
                ms(dsw_at)
            );
            println!(
                "mass start bench: {p} CSI volumes staged and published in {:.3} s ({:.0} volumes/s); \
                 floor one by one {:.3} s (median of {}: {seq_all}), ratio {:.2}x; \
                 floor {DAEMON_WORKERS} in parallel {:.3} s (median of {}: {par_all}), ratio {:.2}x \
                 (target <= 1.2x)",
                asw_at.as_secs_f64(),
                p as f64 / asw_at.as_secs_f64(),
                floor_seq.as_secs_f64(),
                sizes.floor_runs,
                asw_at.as_secs_f64() / floor_seq.as_secs_f64(),
                floor_par.as_secs_f64(),
                sizes.floor_runs,
                asw_at.as_secs_f64() / floor_par.as_secs_f64(),
            );
        }
        None => println!("mass start: did not finish; log tail:\n{}", d.log_tail()),
    }
    let calls = read_calls(&state);
    let handles: Vec<String> = (0..p).map(|i| handle("", i)).collect();
    println!(
        "  driver RPCs during the mass start: {}",
        counts_text(&count_by_method(&state, 0))
    );
    println!(
        "  check: {}; {}",
        per_volume_check(&calls, STAGE, &handles),
        per_volume_check(&calls, PUBLISH, &handles)
    );
    println!(
        "  check: {} mounts below the root (want {}: a staging tmpfs and a publish bind per volume)",
        mounts_below(&root),
        2 * p
    );
    let stop = d.stop();
    println!("  SIGTERM to exit: {:.0} ms", ms(stop));
    drop(driver);
    drop_ext4(&fs_dir, dev);
}

/// After a restart: the time to `/readyz` 200, then the wait for the full
/// ASW and `settle` more, and the RPCs the driver logged since call `from`.
/// Returns the daemon (still running) and the calls logged so far.
#[allow(clippy::too_many_arguments)]
fn restart_once(
    what: &str,
    sizes: &Sizes,
    scratch: &Path,
    journal: &Path,
    root: &Path,
    pods: &Path,
    objects: &Path,
    boot_file: &Path,
    driver: &TestDriver,
    from: usize,
) -> (Daemon, usize) {
    let r = sizes.restart_pods;
    let read = read_floor(root, r);
    // a daemon that did not exit cleanly left its daemon.json: not the new one's
    let _ = fs::remove_file(journal.join("daemon.json"));
    let mut d = Daemon::start_with(
        root,
        journal,
        pods,
        Some(objects),
        boot_file,
        scratch.join(format!("restart-{what}.log")),
        &[
            "--csi-driver".to_owned(),
            format!("{DRIVER}={}", driver.endpoint().display()),
        ],
    );
    let ready = d.wait_ready(MOUNTED_POLL, sizes.wait);
    let since = d.spawned;
    let mounted = d.wait_mounted(r as u64, since, sizes.wait).map(|m| m.1);
    std::thread::sleep(sizes.settle);
    let state = &driver.opts().state;
    let counts = count_by_method(state, from);
    let total = read_calls(state).len();
    let reissued =
        counts.get(STAGE).copied().unwrap_or(0) + counts.get(PUBLISH).copied().unwrap_or(0);
    println!(
        "restart bench ({what}): {r} staged and published CSI volumes; spawn to /readyz 200 {:.1} ms; \
         floors (median of {READ_RUNS}): {}; all in the ASW after {}; \
         NodeStage + NodePublish re-issued: {reissued} (target 0)",
        ms(ready),
        read.ratios_text(ready),
        mounted.map_or("never".to_owned(), |m| format!("{:.0} ms", ms(m))),
    );
    match read.judge(&format!("CSI node ({what})"), r, ready) {
        Some(line) => println!("{line}"),
        None => println!(
            "  (the goal, restart → readyz within {RESTART_GOAL_RAW:.0}x the raw read, is judged \
             from {RESTART_GOAL_FROM} pods: VOLUMED_BENCH_CSI_RESTART={RESTART_GOAL_FROM})"
        ),
    }
    if reissued > 0 {
        println!(
            "DEFECT: CSI node ({what}): {reissued} NodeStage + NodePublish re-issued after the restart"
        );
    }
    println!(
        "  driver RPCs from the restart to {:.1} s after the full ASW: {}",
        sizes.settle.as_secs_f64(),
        counts_text(&counts)
    );
    // the daemon's own breakdown, so a regression names its phase
    let phases: Vec<String> = d
        .log_text()
        .lines()
        .filter_map(|l| {
            let name = l.split("phase=").nth(1)?.split_whitespace().next()?;
            let took = l.split("elapsed_ms=").nth(1)?.split_whitespace().next()?;
            Some(format!("{}={took}", name.trim_matches('"')))
        })
        .collect();
    println!("  startup phases (ms): {}", phases.join(" "));
    // what the journal open had to replay: a tail of records is the cost
    // a kill leaves that a clean stop's checkpoint does not
    let log = d.log_text();
    if let Some(l) = log.lines().find(|l| l.contains("journal opened")) {
        let field = |k: &str| l.split(k).nth(1)?.split_whitespace().next();
        println!(
            "  journal open: {} tail records, {} targets, checkpoint through {}",
            field("records=").unwrap_or("?"),
            field("targets=").unwrap_or("?"),
            field("checkpoint=").unwrap_or("?")
        );
    }
    if reissued > 0 || mounted.is_none() {
        println!("  daemon log tail:\n{}", d.log_tail());
    }
    (d, total)
}

/// The floors of this namespace's mount table (holding the `n` volumes'
/// mounts below `root`): its raw read and one read + parse, median of
/// [`READ_RUNS`] each.
fn read_floor(root: &Path, n: usize) -> TableFloors {
    let floors = table_floors(READ_RUNS);
    let below = mounts_below(root);
    if below != 2 * n {
        println!(
            "  check: {below} mounts below the root before the restart, want {}",
            2 * n
        );
    }
    println!(
        "  mount table: {} entries ({} KiB), {below} below the root",
        floors.entries,
        floors.bytes / 1024
    );
    floors
}

fn restart(sizes: &Sizes, scratch: &Path, journals: &Path, boot_file: &Path) {
    let r = sizes.restart_pods;
    let objects = scratch.join("restart-objects");
    write_objects(r, "r-", &objects);
    let pods = scratch.join("restart-pods");
    write_pods(0..r, &pods, pod_manifest);
    let driver = spawn_driver(&scratch.join("restart-driver"));
    let state = driver.opts().state.clone();
    let fs_dir = scratch.join("restart-fs");
    let dev = fresh_ext4(&fs_dir, ext4_mb(r));
    let root = fs_dir.join("root");
    let journal = journals.join("journal-restart");
    let mut d = Daemon::start_with(
        &root,
        &journal,
        &pods,
        Some(&objects),
        boot_file,
        scratch.join("restart-first.log"),
        &[
            "--csi-driver".to_owned(),
            format!("{DRIVER}={}", driver.endpoint().display()),
        ],
    );
    let since = d.spawned;
    let Some((_, mounted)) = d.wait_mounted(r as u64, since, sizes.wait) else {
        println!(
            "restart: the first start did not mount everything; log tail:\n{}",
            d.log_tail()
        );
        d.stop();
        drop(driver);
        drop_ext4(&fs_dir, dev);
        return;
    };
    let calls = read_calls(&state);
    let handles: Vec<String> = (0..r).map(|i| handle("r-", i)).collect();
    println!(
        "restart: first start, {r} CSI volumes in the ASW {:.0} ms after the spawn; driver RPCs: {}",
        ms(mounted),
        counts_text(&count_by_method(&state, 0))
    );
    println!(
        "  check: {}; {}",
        per_volume_check(&calls, STAGE, &handles),
        per_volume_check(&calls, PUBLISH, &handles)
    );
    let stop = d.stop_keep_mounts();
    println!("  SIGTERM to exit: {:.0} ms", ms(stop));

    let (d, from) = restart_once(
        "after SIGTERM",
        sizes,
        scratch,
        &journal,
        &root,
        &pods,
        &objects,
        boot_file,
        &driver,
        calls.len(),
    );
    d.kill_keep_mounts();
    let (d, _) = restart_once(
        "after SIGKILL",
        sizes,
        scratch,
        &journal,
        &root,
        &pods,
        &objects,
        boot_file,
        &driver,
        from,
    );
    let stop = d.stop();
    println!("  SIGTERM to exit: {:.0} ms", ms(stop));
    drop(driver);
    drop_ext4(&fs_dir, dev);
}

fn main() {
    let sizes = Sizes::from_args();
    if !require_root("the CSI bench runs volumed and a CSI driver, which make real mounts") {
        return;
    }
    enter_private_mount_ns();
    let started = Instant::now();
    let scratch = Scratch::new("volumed-csi-bench-");
    let journals = journal_tempdir("volumed-csi-bench-journal-");
    let boot_file = boot_id_file(scratch.path());
    println!(
        "csi bench ({} mode): binary {BIN}; driver {}; journals under {}",
        if sizes.quick { "quick" } else { "full" },
        env!("CARGO_BIN_EXE_volumed-testdriver"),
        journals.path().display()
    );
    mass_start(&sizes, scratch.path(), journals.path(), &boot_file);
    restart(&sizes, scratch.path(), journals.path(), &boot_file);
    println!(
        "csi bench: done in {:.0} s",
        started.elapsed().as_secs_f64()
    );
}
