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
//!    after 3.) (10,000; quick
//!    1,000), over 30 s (quick 5 s): utime + stime of the daemon from
//!    `/proc/<pid>/stat`, as a percentage of one core. The bench sleeps
//!    meanwhile. The daemon polls its sources every `--poll-ms` (100 ms
//!    here, as the issue runs it; the default is 1 s).
//! 3. **Memory per volume:** VmRSS (and RssAnon) of a daemon at V_lo and
//!    V_hi mounted volumes (1,000 and 10,000; quick 200 and 1,000), reached
//!    by adding manifests (each written under a name the sources skip, then
//!    renamed) and waiting for the ASW gauge, then 2 s of quiet; the slope
//!    in KiB per volume. sled's page cache may grow to
//!    `JournalConfig::cache_capacity` (printed) with the journal's records,
//!    which is part of what the slope shows. The slope differs by a few
//!    tenths of a KiB from one daemon to the next (where the allocator
//!    happened to put what), so it is measured in 3 rounds (quick: 1), each
//!    a fresh daemon with its root on a fresh ext4 as the mass start's, and
//!    the median is the figure; the last round's daemon is the one whose
//!    idle CPU is measured (2.).
//!
//! Sizes: full under `cargo bench --bench daemon` (about 1 min on a 2-core
//! VM, 30 s of it the idle window); `--quick`, `VOLUMED_BENCH_QUICK=1` or a
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

#[path = "../tests/support/mod.rs"]
mod support;

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use support::{
    LoopDevice, Scratch, bind_mount, enter_private_mount_ns, mkdirs, mount_tmpfs, require_root,
};
use volumed::host::boot::read_boot_id;
use volumed::journal::JournalConfig;
use volumed::model::{Layout, PluginName, PodUid};

const BIN: &str = env!("CARGO_BIN_EXE_volumed");
const NODE: &str = "bench-node";
/// How often the bench asks the daemon's `/metrics` while waiting.
const POLL: Duration = Duration::from_millis(20);
/// How often [`Daemon::wait_mounted`] asks: the mass start's clock stops at
/// the first answer that shows every volume, so it reads up to this late
/// (at 20 ms, a tenth of the figure). Each ask costs the daemon one
/// `/metrics` render, which is small next to the work it waits for.
const MOUNTED_POLL: Duration = Duration::from_millis(5);
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
        let args: Vec<String> = std::env::args().collect();
        let quick = args.iter().any(|a| a == "--quick")
            || std::env::var("VOLUMED_BENCH_QUICK").is_ok_and(|v| v == "1")
            || !args.iter().any(|a| a == "--bench");
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
                idle: Duration::from_secs(30),
                wait: Duration::from_secs(1_800),
            }
        }
    }
}

/// Where the journal goes: the real disk, not a tmpfs.
fn journal_base() -> PathBuf {
    std::env::var_os("VOLUMED_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")))
}

fn uid(i: usize) -> String {
    format!("00000000-0000-4000-8000-{i:012}")
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

/// Writes the manifests of pods `range` into `dir`, each under a name the
/// sources skip and then renamed, so no poll sees half a file.
fn write_pods(range: std::ops::Range<usize>, dir: &Path) {
    mkdirs(dir);
    for i in range {
        let tmp = dir.join(format!(".bench-{i:05}.json.tmp"));
        fs::write(&tmp, pod_manifest(i)).expect("write pod manifest");
        fs::rename(&tmp, dir.join(format!("bench-{i:05}.json"))).expect("rename pod manifest");
    }
}

/// Makes `root` a shared bind mount of itself, as the daemon does its own.
fn shared_root(root: &Path) {
    mkdirs(root);
    bind_mount(root, root);
    mount(
        None::<&str>,
        root,
        None::<&str>,
        MsFlags::MS_SHARED | MsFlags::MS_REC,
        None::<&str>,
    )
    .expect("make root shared");
}

/// A freshly made ext4 (sparse image, loop device with autoclear) mounted on
/// `dir`. The mass start's roots live on one each, floor and daemon alike:
/// on a filesystem that earlier runs and tests filled and emptied, ext4's
/// inode allocator scans the recently deleted inodes on every `mkdir`
/// (perf: `__ext4_new_inode → find_inode_bit → recently_deleted`), which
/// made the same floor take 0.07 s or 1.1 s from one run to the next.
/// The memory rounds' roots get one too (`size_mb` is larger there: 10,000
/// volumes need more inodes than 512 MiB of ext4 has).
fn fresh_ext4(dir: &Path, size_mb: u64) -> LoopDevice {
    let image = dir.with_extension("img");
    support::mkfs_ext4(&image, size_mb);
    let dev = LoopDevice::attach(&image);
    mkdirs(dir);
    support::mount_device(dev.path(), dir, "ext4");
    dev
}

/// Stops a daemon (printing how long SIGTERM took), then detaches the fresh
/// ext4 its root was on and its loop device.
fn stop_on_ext4(daemon: Daemon, fs: &Path, dev: LoopDevice) {
    let stop = daemon.stop();
    println!("  SIGTERM to exit: {:.0} ms", stop.as_secs_f64() * 1e3);
    umount2(fs, MntFlags::MNT_DETACH).expect("detach the daemon's ext4");
    drop(dev);
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

/// `--poll-ms` for the daemons: 100, or `VOLUMED_BENCH_POLL_MS`.
fn poll_ms() -> String {
    std::env::var("VOLUMED_BENCH_POLL_MS").unwrap_or_else(|_| "100".into())
}

/// More `volumed run` arguments from `VOLUMED_BENCH_DAEMON_ARGS` (split on
/// whitespace), for experiments such as `--journal off`.
fn extra_args() -> Vec<String> {
    std::env::var("VOLUMED_BENCH_DAEMON_ARGS")
        .map(|v| v.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// A spawned `volumed run`, SIGKILLed if dropped while still running.
struct Daemon {
    child: Child,
    addr: String,
    log: PathBuf,
    root: PathBuf,
}

impl Daemon {
    fn start(
        root: &Path,
        journal: &Path,
        pods: &Path,
        objects: &Path,
        boot_file: &Path,
        log: PathBuf,
    ) -> Daemon {
        let child = Command::new(BIN)
            .arg("run")
            .arg("--root-dir")
            .arg(root)
            .arg("--journal-dir")
            .arg(journal)
            .arg("--static-pods")
            .arg(pods)
            .arg("--static-objects")
            .arg(objects)
            .args(["--listen", "127.0.0.1:0", "--node-name", NODE])
            .arg("--boot-id-file")
            .arg(boot_file)
            .args(["--poll-ms", &poll_ms()])
            .args(extra_args())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).expect("daemon log file"))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {BIN}: {e}"));
        let mut d = Daemon {
            child,
            addr: String::new(),
            log,
            root: root.to_owned(),
        };
        let info = journal.join("daemon.json");
        let deadline = Instant::now() + Duration::from_secs(60);
        while !info.exists() {
            d.check_alive();
            assert!(Instant::now() < deadline, "no daemon.json after 60 s");
            std::thread::sleep(Duration::from_millis(10));
        }
        let v: serde_json::Value =
            serde_json::from_slice(&fs::read(&info).expect("read daemon.json"))
                .expect("parse daemon.json");
        d.addr = v["listen"].as_str().expect("listen address").to_owned();
        d
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).expect("pid fits i32"))
    }

    fn log_tail(&self) -> String {
        let log = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    fn check_alive(&mut self) {
        if let Some(s) = self.child.try_wait().expect("wait daemon") {
            panic!(
                "the daemon exited early ({s}); log tail:\n{}",
                self.log_tail()
            );
        }
    }

    fn get(&self, path: &str) -> (u16, String) {
        http_get(&self.addr, path)
    }

    fn wait_ready(&mut self) -> Duration {
        let start = Instant::now();
        loop {
            self.check_alive();
            if self.get("/readyz").0 == 200 {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "not ready after 120 s"
            );
            std::thread::sleep(POLL);
        }
    }

    /// (desired, actual) volume counts from `/metrics`.
    fn volume_counts(&self) -> (u64, u64) {
        let (status, body) = self.get("/metrics");
        assert_eq!(status, 200, "/metrics: {body}");
        let (mut dsw, mut asw) = (0, 0);
        for line in body.lines() {
            let Some(rest) = line.strip_prefix("volume_manager_total_volumes{") else {
                continue;
            };
            let n: u64 = rest
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
            if rest.contains("state=\"actual_state_of_world\"") {
                asw += n;
            } else if rest.contains("state=\"desired_state_of_world\"") {
                dsw += n;
            }
        }
        (dsw, asw)
    }

    /// Waits until the ASW holds `want` mounted volumes: the times (from
    /// `since`) at which the DSW and the ASW reached it, or `None` on timeout.
    fn wait_mounted(
        &mut self,
        want: u64,
        since: Instant,
        limit: Duration,
    ) -> Option<(Duration, Duration)> {
        let mut dsw_at = None;
        loop {
            self.check_alive();
            let (dsw, asw) = self.volume_counts();
            if dsw_at.is_none() && dsw >= want {
                dsw_at = Some(since.elapsed());
            }
            if asw >= want {
                let at = since.elapsed();
                return Some((dsw_at.unwrap_or(at), at));
            }
            if since.elapsed() > limit {
                println!(
                    "  gave up after {:.0} s: DSW {dsw}, ASW {asw} of {want} volumes",
                    limit.as_secs_f64()
                );
                return None;
            }
            std::thread::sleep(MOUNTED_POLL);
        }
    }

    /// SIGTERM, wait (bounded), then detach the root's mounts.
    fn stop(mut self) -> Duration {
        let start = Instant::now();
        let _ = kill(self.pid(), Signal::SIGTERM);
        let deadline = start + Duration::from_secs(120);
        while self.child.try_wait().expect("wait daemon").is_none() {
            if Instant::now() > deadline {
                println!("  the daemon did not stop within 120 s of SIGTERM; killed");
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let took = start.elapsed();
        let _ = umount2(&self.root, MntFlags::MNT_DETACH);
        took
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A minimal HTTP/1.1 GET (`Connection: close`): status and body.
fn http_get(addr: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send request");
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).expect("read response");
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, body.to_owned())
}

/// utime + stime of `pid` in clock ticks (`/proc/<pid>/stat` fields 14, 15).
fn cpu_ticks(pid: Pid) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("read stat");
    // the command may hold spaces: fields are counted after the last ')'
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state), so field 14 is index 11
    f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
}

/// utime + stime per thread name of `pid`, in clock ticks.
fn thread_ticks(pid: Pid) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let Ok(stat) = fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = stat[open + 1..close].to_owned();
        let f: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        let ticks = f.get(11).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0)
            + f.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
        *out.entry(name).or_insert(0) += ticks;
    }
    out
}

/// (VmRSS, RssAnon) of `pid` in KiB.
fn rss_kib(pid: Pid) -> (u64, u64) {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("RssAnon:"))
}

fn mounts_below(root: &Path) -> usize {
    let table = volumed::host::mountinfo::MountTable::read_self().expect("read mountinfo");
    table
        .entries()
        .iter()
        .filter(|m| m.mount_point.starts_with(root) && m.mount_point != root)
        .count()
}

fn main() {
    let sizes = Sizes::from_args();
    if !require_root("the daemon bench runs volumed, which makes real mounts") {
        return;
    }
    enter_private_mount_ns();
    let started = Instant::now();

    let scratch = Scratch::new("volumed-daemon-bench-");
    let jbase = tempfile::Builder::new()
        .prefix("volumed-daemon-bench-journal-")
        .tempdir_in({
            let b = journal_base();
            mkdirs(&b);
            b
        })
        .expect("journal tempdir");
    let boot_file = scratch.path().join("boot_id");
    fs::write(
        &boot_file,
        read_boot_id(None).expect("boot id").as_str().to_owned() + "\n",
    )
    .expect("write boot id");
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
    write_pods(0..p, &staged);
    let mut a = Daemon::start(
        &root_a,
        &jbase.path().join("journal-a"),
        &pods_a,
        &objects,
        &boot_file,
        scratch.path().join("daemon-a.log"),
    );
    let ready = a.wait_ready();
    let t0 = Instant::now();
    fs::rename(&staged, &pods_a).expect("move the manifests into place");
    let want = 2 * p as u64;
    match a.wait_mounted(want, t0, sizes.wait) {
        Some((dsw_at, asw_at)) => {
            let ratio = asw_at.as_secs_f64() / floor.as_secs_f64();
            println!(
                "mass start: {p} pods x 2 volumes (tmpfs emptyDir + bind of a per-pod local PV dir); \
                 ready {:.0} ms before the manifests moved in; all in the DSW after {:.0} ms",
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
            &objects,
            &boot_file,
            scratch.path().join(format!("daemon-b{round}.log")),
        );
        b.wait_ready();
        let (rss0, anon0) = rss_kib(b.pid());
        let mut points = Vec::new();
        let mut from = 0;
        for vols in [sizes.mem_lo, sizes.mem_hi] {
            let t = Instant::now();
            write_pods(from..vols / 2, &pods_b);
            from = vols / 2;
            let Some((_, at)) = b.wait_mounted(vols as u64, t, sizes.wait) else {
                println!("memory: stopped at {vols}; log tail:\n{}", b.log_tail());
                break;
            };
            std::thread::sleep(Duration::from_secs(2));
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
            let by_thread: Vec<String> = thread_ticks(b.pid())
                .into_iter()
                .filter_map(|(name, t)| {
                    let d = t.saturating_sub(threads_before.get(&name).copied().unwrap_or(0));
                    (d > 0).then(|| format!("{name} {:.2} s", d as f64 / clk_tck()))
                })
                .collect();
            println!("  idle CPU by thread: {}", by_thread.join(", "));
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

fn clk_tck() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}
