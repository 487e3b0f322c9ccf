//! The nemesis soak (issue 42): every peer fault at once, at random,
//! overlapping times, while pods come and go, with the node's invariants
//! checked continuously against the truth.
//!
//! The real `volumed run` binary serves pods from the API-server fake
//! (`tests/support/apiserver/`, namespace `api`) *and* the static pod dir
//! (namespace `static`): memory and disk emptyDirs, a local PV (an ext4 on
//! a loop device; API pods), a raw block local PV (`volumeMode: Block` on
//! a second loop device; API pods), configMap, secret and projected
//! volumes, and CSI volumes of the test driver (`volumed-testdriver`):
//! filesystem ones, and a raw block one (`volumeMode: Block`, API pods,
//! several at once on its ReadWriteOnce claim: the driver's loop device,
//! published on each pod's file and mapped by volumed). A
//! long-poller asks the runtime API socket with `wait` all along. A steady churn
//! adds and deletes pods (each add a fresh UID) and rewrites the
//! ConfigMaps. Storms alternate with pauses. During a storm the nemesis
//! ([`Fault`]) SIGKILLs volumed and restarts it (sometimes only once the API
//! server is gone too); SIGKILLs, SIGSTOPs or restarts the CSI driver (its
//! socket replaced); takes the API server down (503s) or away (connection
//! refused), cuts its watches, compacts its history (410 on the next
//! watch) or answers `410 Gone` to pod watches; fills the local PV to its
//! last block; and now and then reboots the node (everything below the
//! root unmounted, the raw maps' loop holds detached, the driver killed, a
//! new boot id).
//!
//! The journal's disk is slow at times: the daemon's `--journal-dir` is
//! on `volumed-slowfs` (a FUSE passthrough, `tests/support/slowfs.rs`;
//! one level below its mount point, so a journal moved aside stays on
//! it), and the nemesis makes its writes and syncs wait 20–400 ms for a
//! while ([`Fault::SlowDisk`]). A reboot keeps that mount, as a disk
//! stays, and may come during a slow spell. Without `/dev/fuse` the soak says so loudly, in its output and
//! figures, and runs without the slow disk.
//!
//! Checked every tick (~150 ms) against the mount table, the driver's call
//! log, the fake's objects and the files ([`Soak::check`]):
//! - a mount of a running pod's volume is never removed (the bottom mount
//!   at each target keeps its mount id until the pod is deleted or the
//!   node reboots), a raw block map's bind on the pod's file included,
//!   and for the CSI raw block PV the driver's bind on the pod's publish
//!   file too;
//! - NodeStage/NodePublish is not issued again for a staging path or
//!   target never unstaged/unpublished, unless the earlier call was cut by
//!   a fault (volumed or the driver killed, stopped or restarted within
//!   [`CUT_WINDOW`] of it) or a reboot came between ([`cut_explains`]), or
//!   the driver answered the earlier call with an error (its outcome log:
//!   [`failed_answer`]); a block volume's staging dir and publish file
//!   count as paths alike ([`call_key`]);
//! - no payload file is torn as a reader sees it (a reader thread reads
//!   the ConfigMap's files continuously: each holds one whole generation);
//! - a pod the runtime API reports ready has all its volumes mounted;
//! - `/readyz` is never 200 while the API server has not been reachable
//!   once since this daemon started (so it cannot have listed).
//!
//! And after each storm, with every fault healed ([`Soak::settle`]): every
//! wanted pod ready within [`SETTLE_BOUND`], each of its targets mounted
//! exactly once, no stacked mount, no mount of a pod no source wants, a
//! staging or device mount only while a pod uses it, one loop hold per pod
//! mapping a raw block PV (local or CSI) and no other (none once every pod
//! is gone; any left when the soak fails are detached, the driver's
//! devices too); for the CSI raw block PV ([`Soak::csi_raw_settled`]) one
//! device of the driver's, each mapping pod's link naming its publish
//! file and both files showing that device, the volume reading back the
//! bytes written through a pod's link when it was first mapped (until a
//! NodeUnstage: the driver then drops its backing file), and once no pod
//! maps it no device of the driver's and no staging, publish or volume
//! dir left (nor at the end); and the journal
//! (`volumed dump`) holding every target `/debug/state` holds, in the same
//! state, and no other ([`journal_covers`]). The daemon's RSS, fds,
//! threads and the runtime API socket's long-polls waiting
//! (`volumed_runtime_api_long_polls`) are taken then; the last settle's
//! must not exceed the first after a storm beyond [`Slack`], and its
//! long-polls must equal the first's.
//!
//! A violation prints the seed, the schedule so far, the journal `dump`
//! and the mount table, ends the run and fails the test. At the end the
//! figures are printed (see them with `--nocapture`) and written to
//! `<target>/tmp/soak-summary.txt`.
//!
//! `VOLUMED_SOAK_SECS` sets the run's length (default 75 s: the short
//! form CI runs, under 3 minutes in all); `VOLUMED_SOAK_SEED` replays a
//! seed: the same seed draws the same decisions tick by tick (what they
//! meet depends on timing). As root only, in a private mount namespace.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::mount::{MntFlags, umount2};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use support::api_env::api_env;
use support::apiserver::FakeApiServer;
use support::apiserver::faults::{Action, Fault as ApiFault, Verb};
use support::csi_driver::{DriverOpts, TestDriver, read_calls_timed, read_outcomes};
use support::daemon::{Daemon, Env, NODE, targets, unix_get};
use support::slowfs::SlowFs;
use support::{LoopDevice, mkfs_ext4};
use volumed::host::mountinfo::MountTable;

/// The short form's length.
const DEFAULT_SECS: u64 = 75;
/// One tick of the nemesis, the churn and the checker.
const TICK: Duration = Duration::from_millis(150);
/// A storm's length.
const STORM: Duration = Duration::from_secs(18);
/// How long the node may take to settle once the nemesis pauses.
const SETTLE_BOUND: Duration = Duration::from_secs(60);
/// A CSI call is "cut" by a fault that starts within this long after it
/// arrived (the call, its reply and the journal's flush of its outcome).
const CUT_WINDOW: u64 = 3_000;
/// The test driver's name.
const DRIVER: &str = "soak.csi.test";
/// The CSI handles: static pods use the first, API pods the others.
const CSI_HANDLES: [&str; 3] = ["vol-s0", "vol-a0", "vol-a1"];
/// The CSI raw block PV (`volumeMode: Block`) and its handle.
const CSI_RAW_PV: &str = "pv-csiraw";
const CSI_RAW_HANDLE: &str = "vol-raw0";
/// The bytes at the start of the CSI raw block volume: written through a
/// pod's link when the volume is first mapped, read back at each settle.
const CSI_RAW_MAGIC_LEN: usize = 64;
/// Lines in each ConfigMap file (each one the generation, 8 digits).
const CONFIG_LINES: usize = 256;
/// Pods alive at a time: at least, at most.
const PODS_MIN: usize = 3;
const PODS_MAX: usize = 9;

/// The growth allowed from the first settle to the last (the pod count
/// differs between them, and a restarted daemon is a new process).
struct Slack;
impl Slack {
    const FDS: u64 = 24;
    const THREADS: u64 = 16;
    const RSS_KIB: u64 = 48 * 1024;
}

// ------------------------------------------------------------ random

/// A small seeded xorshift (as `tests/crash/churn.rs`): reproducible.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// True with probability `num/den`.
    fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
    /// A duration between `lo` and `hi` milliseconds.
    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

fn now_ms() -> u64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

// ------------------------------------------------------------ the pods

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// emptyDir, medium Memory: a tmpfs
    Tmp,
    /// emptyDir on disk: a dir
    Disk,
    /// the local PV (API pods): a bind of the device's mount
    Local,
    /// configMap: a dir
    Config,
    /// secret: a tmpfs
    Secret,
    /// projected (configMap, secret, downwardAPI): a tmpfs
    Projected,
    /// a CSI PV: the driver's bind of its staged tmpfs
    Csi(usize),
    /// a local PV in `volumeMode: Block` (API pods): the device bound on
    /// the pod's file in the global map dir, held open by a loop device
    Block,
    /// the CSI PV in `volumeMode: Block` (API pods): the driver's loop
    /// device, bound by the driver on the pod's publish file and by
    /// volumed on the pod's file in the volume's `dev` dir, held open by a
    /// loop device of volumed's
    CsiRaw,
}

const STATIC_KINDS: [Kind; 6] = [
    Kind::Tmp,
    Kind::Disk,
    Kind::Config,
    Kind::Secret,
    Kind::Projected,
    Kind::Csi(0),
];
const API_KINDS: [Kind; 10] = [
    Kind::Tmp,
    Kind::Disk,
    Kind::Local,
    Kind::Block,
    Kind::CsiRaw,
    Kind::Config,
    Kind::Secret,
    Kind::Projected,
    Kind::Csi(1),
    Kind::Csi(2),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    Api,
    Static,
}

impl Source {
    fn ns(self) -> &'static str {
        match self {
            Source::Api => "api",
            Source::Static => "static",
        }
    }
}

#[derive(Clone, Debug)]
struct Pod {
    source: Source,
    kinds: Vec<Kind>,
}

fn pv_name(i: usize) -> String {
    format!("pv-csi-{i}")
}

/// A pod's volume entry and the directory volumed sets it up in.
fn volume_of(k: Kind) -> (Value, &'static str, String) {
    match k {
        Kind::Tmp => (
            json!({"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}),
            "kubernetes.io~empty-dir",
            "tmp".into(),
        ),
        Kind::Disk => (
            json!({"name": "disk", "emptyDir": {}}),
            "kubernetes.io~empty-dir",
            "disk".into(),
        ),
        Kind::Local => (
            json!({"name": "local", "persistentVolumeClaim": {"claimName": "claim-local"}}),
            "kubernetes.io~local-volume",
            "pv-local".into(),
        ),
        Kind::Config => (
            json!({"name": "config", "configMap": {"name": "soak-config"}}),
            "kubernetes.io~configmap",
            "config".into(),
        ),
        Kind::Secret => (
            json!({"name": "secret", "secret": {"secretName": "soak-secret"}}),
            "kubernetes.io~secret",
            "secret".into(),
        ),
        Kind::Projected => (
            json!({"name": "proj", "projected": {"sources": [
                {"configMap": {"name": "soak-config"}},
                {"secret": {"name": "soak-secret"}},
                {"downwardAPI": {"items": [{"path": "ns",
                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ]}}),
            "kubernetes.io~projected",
            "proj".into(),
        ),
        Kind::Csi(i) => (
            json!({"name": format!("csi{i}"), "persistentVolumeClaim": {"claimName": format!("claim-csi-{i}")}}),
            "kubernetes.io~csi",
            format!("{}/mount", pv_name(i)),
        ),
        // its target is not below the pod's `volumes` (`Soak::target`)
        Kind::Block => (
            json!({"name": "raw", "persistentVolumeClaim": {"claimName": "claim-raw"}}),
            "kubernetes.io~local-volume",
            "pv-raw".into(),
        ),
        // nor is this one's
        Kind::CsiRaw => (
            json!({"name": "csiraw", "persistentVolumeClaim": {"claimName": "claim-csiraw"}}),
            "kubernetes.io~csi",
            CSI_RAW_PV.into(),
        ),
    }
}

/// Whether a kind's target is a mount (the others are directories).
fn is_mount(k: Kind) -> bool {
    !matches!(k, Kind::Disk | Kind::Config)
}

fn pod_object(uid: &str, pod: &Pod) -> Value {
    let volumes: Vec<Value> = pod.kinds.iter().map(|k| volume_of(*k).0).collect();
    let mut container = json!({"name": "c", "image": "busybox"});
    let mut devices = Vec::new();
    if pod.kinds.contains(&Kind::Block) {
        devices.push(json!({"name": "raw", "devicePath": "/dev/xvda"}));
    }
    if pod.kinds.contains(&Kind::CsiRaw) {
        devices.push(json!({"name": "csiraw", "devicePath": "/dev/xvdb"}));
    }
    if !devices.is_empty() {
        container["volumeDevices"] = Value::Array(devices);
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": uid, "namespace": pod.source.ns(), "uid": uid},
        "spec": {
            "nodeName": NODE,
            "containers": [container],
            "volumes": volumes,
        },
        "status": {"phase": "Running"},
    })
}

/// The ConfigMap's content at generation `gen`: every line the same.
fn config_text(generation: u64) -> String {
    format!("{generation:08}\n").repeat(CONFIG_LINES)
}

/// Whether `text` is one whole generation (None) or torn (what is wrong).
fn torn(text: &[u8]) -> Option<String> {
    if text.len() != 9 * CONFIG_LINES {
        return Some(format!("{} bytes, not {}", text.len(), 9 * CONFIG_LINES));
    }
    let first = &text[..9];
    let bad = text.chunks(9).position(|c| c != first)?;
    Some(format!(
        "line {bad} differs from line 0 ({:?})",
        String::from_utf8_lossy(first)
    ))
}

fn config_map(ns: &str, generation: u64) -> Value {
    let text = config_text(generation);
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "soak-config", "namespace": ns},
        "data": {"a": text, "b": text}})
}

fn secret(ns: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "soak-secret", "namespace": ns},
        "stringData": {"token": "soak-token-not-a-real-one"}})
}

fn csi_objects(i: usize, ns: &str) -> [Value; 2] {
    let (pv, claim) = (pv_name(i), format!("claim-csi-{i}"));
    [
        json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": pv},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                "claimRef": {"namespace": ns, "name": claim},
                "csi": {"driver": DRIVER, "volumeHandle": CSI_HANDLES[i]}}}),
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": ns},
            "spec": {"accessModes": ["ReadWriteMany"], "volumeName": pv,
                "resources": {"requests": {"storage": "1Gi"}}}}),
    ]
}

fn csi_driver_object() -> Value {
    json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
        "metadata": {"name": DRIVER}, "spec": {"attachRequired": false}})
}

fn local_objects(device: &Path) -> [Value; 2] {
    [
        json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pv-local"},
            "spec": {"capacity": {"storage": "32Mi"}, "accessModes": ["ReadWriteOnce"],
                "claimRef": {"namespace": "api", "name": "claim-local"},
                "local": {"path": device.display().to_string(), "fsType": "ext4"}}}),
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "claim-local", "namespace": "api"},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-local",
                "resources": {"requests": {"storage": "32Mi"}}}}),
    ]
}

/// The raw block PV on `device` and its claim (API pods).
fn raw_objects(device: &Path) -> [Value; 2] {
    [
        json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pv-raw"},
            "spec": {"capacity": {"storage": "8Mi"}, "accessModes": ["ReadWriteOnce"],
                "volumeMode": "Block",
                "claimRef": {"namespace": "api", "name": "claim-raw"},
                "local": {"path": device.display().to_string()}}}),
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "claim-raw", "namespace": "api"},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-raw",
                "volumeMode": "Block",
                "resources": {"requests": {"storage": "8Mi"}}}}),
    ]
}

/// The CSI raw block PV of the test driver and its claim (API pods):
/// ReadWriteOnce, as the local raw block PV, so that several pods of this
/// node map it at once.
fn csi_raw_objects() -> [Value; 2] {
    [
        json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": CSI_RAW_PV},
            "spec": {"capacity": {"storage": "16Mi"}, "accessModes": ["ReadWriteOnce"],
                "volumeMode": "Block",
                "claimRef": {"namespace": "api", "name": "claim-csiraw"},
                "csi": {"driver": DRIVER, "volumeHandle": CSI_RAW_HANDLE}}}),
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "claim-csiraw", "namespace": "api"},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": CSI_RAW_PV,
                "volumeMode": "Block",
                "resources": {"requests": {"storage": "16Mi"}}}}),
    ]
}

/// The loop devices (`loopN`) whose backing file is below `dir` (as the
/// kernel names it), with their backing file: the holds volumed takes on
/// raw block maps, the pod's file in the global map dir each.
fn holds_below(dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(dir) = fs::canonicalize(dir) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in fs::read_dir("/sys/block").into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(backing) = fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")) else {
            continue;
        };
        let backing = PathBuf::from(backing.trim_end_matches('\n'));
        if backing.starts_with(&dir) {
            found.push((name, backing));
        }
    }
    found.sort();
    found
}

/// The kubelet's paths of the CSI raw block PV (`src/model/layout/`).
struct CsiRawPaths {
    /// `plugins/kubernetes.io/csi/volumeDevices/<pv>`: `vol_data.json`,
    /// and each pod's file in `dev/` (volumed's bind and hold)
    volume: PathBuf,
    /// `volumeDevices/staging/<pv>`: NodeStage's dir (the test driver's
    /// backing file in it)
    staging: PathBuf,
    /// `volumeDevices/publish/<pv>`: each pod's publish file in it (the
    /// driver's bind of its device)
    publish: PathBuf,
    /// `pods/`, for each pod's link
    pods: PathBuf,
    /// the staging dir as the kernel names a loop device's backing file
    staging_real: PathBuf,
}

impl CsiRawPaths {
    fn new(root: &Path) -> CsiRawPaths {
        let devices = root.join("plugins/kubernetes.io/csi/volumeDevices");
        let staging = devices.join("staging").join(CSI_RAW_PV);
        // as the kernel will name it (the root may not be made yet)
        let real_root = root
            .ancestors()
            .find_map(|a| Some(fs::canonicalize(a).ok()?.join(root.strip_prefix(a).ok()?)))
            .unwrap();
        CsiRawPaths {
            volume: devices.join(CSI_RAW_PV),
            staging_real: real_root.join(staging.strip_prefix(root).unwrap()),
            staging,
            publish: devices.join("publish").join(CSI_RAW_PV),
            pods: root.join("pods"),
        }
    }
    fn pod_file(&self, uid: &str) -> PathBuf {
        self.volume.join("dev").join(uid)
    }
    fn publish_file(&self, uid: &str) -> PathBuf {
        self.publish.join(uid)
    }
    /// The pod's `volumeDevices` symlink (what the container is given).
    fn link(&self, uid: &str) -> PathBuf {
        self.pods
            .join(uid)
            .join("volumeDevices/kubernetes.io~csi")
            .join(CSI_RAW_PV)
    }
    /// The test driver's own loop devices of the volume (over the file in
    /// the staging dir), as opposed to volumed's holds.
    fn driver_devices(&self, below_root: &[(String, PathBuf)]) -> Vec<(String, PathBuf)> {
        below_root
            .iter()
            .filter(|(_, b)| b.starts_with(&self.staging_real))
            .cloned()
            .collect()
    }
    /// The volume's dirs still there (none once no pod maps it).
    fn leftovers(&self) -> Vec<PathBuf> {
        [&self.staging, &self.publish, &self.volume]
            .into_iter()
            .filter(|d| fs::symlink_metadata(d).is_ok())
            .cloned()
            .collect()
    }
}

/// What is written at the start of the CSI raw block volume the `n`th
/// time it is freshly mapped.
fn csi_raw_magic(seed: u64, n: u64) -> Vec<u8> {
    let mut m = format!("volumed soak {seed}: csi raw block volume, write {n}").into_bytes();
    m.resize(CSI_RAW_MAGIC_LEN, b'.');
    m
}

/// Writes `bytes` at the start of the device `path` names, durably.
fn write_device(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| format!("opening {} to write: {e}", path.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("writing {}: {e}", path.display()))
}

/// The first `n` bytes of the device `path` names.
fn read_device(path: &Path, n: usize) -> Result<Vec<u8>, String> {
    let mut buf = vec![0; n];
    fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut buf))
        .map_err(|e| format!("reading {}: {e}", path.display()))?;
    Ok(buf)
}

/// Detaches every loop device backed by a file below `dir` (what a reboot
/// does to the holds and the test driver's devices; and, when dropped,
/// what a failed soak leaves).
fn detach_holds(dir: &Path) {
    for (name, _) in holds_below(dir) {
        // quiet: the test driver's device (autoclear) may go by itself
        // once the holds over it are detached (ENXIO); a device truly
        // left is what the drain and the settles report
        let _ = std::process::Command::new("losetup")
            .args(["-d", &format!("/dev/{name}")])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// Detaches, when dropped, every hold volumed left below the root (and
/// the test driver's devices of staged block volumes): a soak that fails
/// midway leaves no loop device behind on the machine.
struct DropHolds(PathBuf);

impl Drop for DropHolds {
    fn drop(&mut self) {
        detach_holds(&self.0);
    }
}

/// Writes `text` to `path` by rename (no reader sees half a file).
fn write_atomic(path: &Path, text: &str) {
    let tmp = path.with_file_name(format!(
        ".{}.tmp",
        path.file_name().unwrap().to_string_lossy()
    ));
    fs::write(&tmp, text).unwrap();
    fs::rename(&tmp, path).unwrap();
}

fn sha256_hex(s: &str) -> String {
    let out = std::process::Command::new("sh")
        .args(["-c", "printf %s \"$1\" | sha256sum", "sh", s])
        .output()
        .expect("run sha256sum");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)[..64].to_owned()
}

/// A driver call-log line (`testdriver/state.rs`: `method`, the request's
/// paths, `access_type`, `at_ms`) as the re-issue check keys it: whether
/// it stages or publishes (true) or undoes that (false), and the path it
/// is about. A raw block volume's calls are keyed as a filesystem
/// volume's: its staging dir (`volumeDevices/staging/<pv>`) as the
/// staging path, the pod's publish *file* (`volumeDevices/publish/<pv>/
/// <uid>`) as the target. None for other calls.
fn call_key(c: &Value) -> Option<(bool, String)> {
    let path = |f: &str| c[f].as_str().unwrap_or("").to_owned();
    Some(match c["method"].as_str()? {
        "NodeStageVolume" => (true, format!("stage {}", path("staging_target_path"))),
        "NodeUnstageVolume" => (false, format!("stage {}", path("staging_target_path"))),
        "NodePublishVolume" => (true, format!("publish {}", path("target_path"))),
        "NodeUnpublishVolume" => (false, format!("publish {}", path("target_path"))),
        _ => return None,
    })
}

/// Whether a stage or publish that arrived at `prev` (ms) may have been
/// cut by a fault, so that the same call again (never undone between) is
/// a legitimate retry: a fault (volumed or the driver killed, stopped or
/// restarted) that began no later than [`CUT_WINDOW`] after the call and
/// ended no earlier than [`CUT_WINDOW`] before it, or one still open that
/// began by then. A reboot between forgets the first call instead.
fn cut_explains(prev: u64, cut_open: Option<u64>, cuts: &[(u64, u64)]) -> bool {
    cut_open.is_some_and(|s| s <= prev + CUT_WINDOW)
        || cuts
            .iter()
            .any(|(s, e)| *s <= prev + CUT_WINDOW && prev <= *e + CUT_WINDOW)
}

/// The code of the failed answer (`testdriver/state.rs`'s outcome log)
/// to the call `c` names that arrived at `prev`, if it failed: volumed
/// then calls again with backoff, a legitimate retry. None if it was
/// answered OK, or not at all.
fn failed_answer(outcomes: &[Value], c: &Value, prev: u64) -> Option<String> {
    let same = |o: &&Value| {
        o["at_ms"].as_u64() == Some(prev)
            && ["method", "staging_target_path", "target_path"]
                .iter()
                .all(|k| o[*k] == c[*k])
    };
    let code = outcomes.iter().find(same)?["code"].as_str()?;
    (code != "OK").then(|| code.to_owned())
}

// ------------------------------------------------------------ faults

/// What the nemesis does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    VolumedKill,
    VolumedKillApiGone,
    DriverKill,
    DriverHang,
    DriverRestart,
    ApiDown,
    ApiStop,
    CutWatches,
    Compact410,
    GoneStorm,
    FillPv,
    Reboot,
    /// the journal's disk waits 20–400 ms on each write and sync
    SlowDisk,
}

/// The nemesis's draw: each fault with its weight.
const WEIGHTS: [(Fault, u64); 13] = [
    (Fault::VolumedKill, 6),
    (Fault::VolumedKillApiGone, 2),
    (Fault::DriverKill, 3),
    (Fault::DriverHang, 3),
    (Fault::DriverRestart, 2),
    (Fault::ApiDown, 3),
    (Fault::ApiStop, 2),
    (Fault::CutWatches, 2),
    (Fault::Compact410, 2),
    (Fault::GoneStorm, 2),
    (Fault::FillPv, 2),
    (Fault::Reboot, 1),
    (Fault::SlowDisk, 4),
];

/// The nemesis's next fault, drawn by weight from `rng`.
fn draw_fault(rng: &mut Rng) -> Fault {
    let total: u64 = WEIGHTS.iter().map(|(_, w)| w).sum();
    let mut x = rng.below(total);
    for (f, w) in WEIGHTS {
        if x < w {
            return f;
        }
        x -= w;
    }
    Fault::VolumedKill
}

/// What a fault's end does, when it comes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    StartVolumed,
    StartDriver,
    ContDriver,
    ApiUp,
    ApiRestart,
    Unfill,
    DiskFast,
}

/// Figures of the daemon process after a settle.
#[derive(Clone, Copy, Debug)]
struct Proc {
    rss_kib: u64,
    fds: u64,
    threads: u64,
}

fn proc_figures(pid: u32) -> Option<Proc> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    let fds = fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
    Some(Proc {
        rss_kib: field("VmRSS:")?,
        fds: u64::try_from(fds).ok()?,
        threads: field("Threads:")?,
    })
}

/// The `pct`th percentile of `sorted` (nearest rank).
fn percentile(sorted: &[Duration], pct: usize) -> Duration {
    let Some(last) = sorted.len().checked_sub(1) else {
        return Duration::ZERO;
    };
    sorted[(last * pct).div_ceil(100).min(last)]
}

// ------------------------------------------------------------ the soak

/// The payload reader's shared state.
#[derive(Default)]
struct Reader {
    /// the ConfigMap files to read (of pods alive now)
    files: Mutex<Vec<PathBuf>>,
    /// torn reads seen
    torn: Mutex<Vec<String>>,
    reads: AtomicU64,
    stop: AtomicBool,
}

/// The long-poller's shared state: it asks the runtime API socket with
/// `wait` all the run long (waits that time out, that it abandons midway,
/// that a kill cuts), so the socket's slots are used, and given back.
#[derive(Default)]
struct Poller {
    /// the pods to ask about (of pods alive now)
    uids: Mutex<Vec<String>>,
    /// set by the checker: ask nothing new
    pause: AtomicBool,
    /// a request in flight (set before `pause` is looked at)
    busy: AtomicBool,
    stop: AtomicBool,
    asked: AtomicU64,
    abandoned: AtomicU64,
}

struct Soak {
    seed: u64,
    rng: Rng,
    start: Instant,
    api: FakeApiServer,
    daemon: Option<Daemon>,
    /// the journal's disk (dropped after the daemon), or why there is none
    slow_disk: Result<SlowFs, &'static str>,
    /// the delays of its slow spells, in ms
    slow_delays: Vec<u64>,
    /// volumed SIGKILLs (reboots too) during a slow spell, and the longest
    /// one took to reap (a killed process waits out the FUSE requests it
    /// had sent)
    slow_kills: usize,
    slow_kill_max: Duration,
    /// when the running daemon was spawned, and whether the API server
    /// has answered since (it may have listed)
    api_reachable_since_spawn: bool,
    driver: Option<TestDriver>,
    driver_opts: DriverOpts,
    driver_stopped: bool,
    api_down: bool,
    api_stopped: bool,
    /// the local PV's global mount
    local_global: PathBuf,
    /// the CSI staging paths, by handle index
    staging: Vec<PathBuf>,
    /// a filler file is on the local PV
    filled: bool,
    /// and is to be removed (as soon as the PV is mounted)
    unfill_wanted: bool,
    pods: BTreeMap<String, Pod>,
    next_uid: u64,
    config_gen: u64,
    /// target → (pod, bottom mount id) of running pods' mounts seen
    seen: BTreeMap<PathBuf, (String, u32)>,
    /// driver call log: lines handled, open stage/publish calls (key →
    /// when it arrived), and intervals in which a call may have been cut
    calls_done: usize,
    open_calls: BTreeMap<String, u64>,
    /// stage/publish calls made again and allowed: after a cut, and after
    /// a failed answer (by its code)
    retries_cut: usize,
    retries_failed: BTreeMap<String, usize>,
    cuts: Vec<(u64, u64)>,
    /// a cut that began and has not ended yet (driver dead or stopped)
    cut_open: Option<u64>,
    ends: Vec<(Instant, End)>,
    schedule: Vec<String>,
    faults: BTreeMap<Fault, usize>,
    restarts: usize,
    reboots: usize,
    adds: usize,
    /// pods added with the raw block PV
    block_adds: usize,
    deletes: usize,
    ready_checks: usize,
    settles: Vec<Duration>,
    procs: Vec<Proc>,
    plugin_ops: Vec<f64>,
    violations: Vec<String>,
    reader: Arc<Reader>,
    poller: Arc<Poller>,
    ticks: u64,
    /// the socket's long-polls waiting after each settle
    /// (`volumed_runtime_api_long_polls`)
    long_polls: Vec<f64>,
    /// the raw block PV's global map dir (each pod's file in it is bound
    /// to the device, and held by a loop device)
    raw_map: PathBuf,
    /// the CSI raw block PV's paths
    csi_raw: CsiRawPaths,
    /// the bytes written at the start of the CSI raw block volume when it
    /// was first mapped; None once it is unstaged (the test driver then
    /// removes its backing file: the next stage is a new, zeroed volume)
    csi_raw_magic: Option<Vec<u8>>,
    /// how many times magic bytes were written, and read back
    csi_raw_writes: u64,
    csi_raw_reads: u64,
    /// pods added with the CSI raw block PV
    csi_raw_adds: usize,
    // Last, in this order: the daemon and the driver are gone before the
    // holds are detached, the loop devices let go and the scratch dir (its
    // mounts) goes.
    _holds: DropHolds,
    _raw: LoopDevice,
    _dev: LoopDevice,
    env: Env,
}

impl Soak {
    fn new(seed: u64) -> Soak {
        let (mut env, api) = api_env("volumed-soak-");
        let base = env.scratch.path().to_owned();
        let slow_disk = match support::slowfs::unavailable() {
            None => {
                let disk = SlowFs::mount(
                    &base.join("disk-backing"),
                    &base.join("disk"),
                    &base.join("disk-delay"),
                );
                env.journal = disk.mountpoint.join("journal");
                Ok(disk)
            }
            Some(why) => {
                eprintln!(
                    "soak: SLOW DISK NOT AVAILABLE ({why}): the journal is on the plain \
                     disk and the nemesis never slows it"
                );
                Err(why)
            }
        };
        let image = base.join("local.img");
        mkfs_ext4(&image, 32);
        let dev = LoopDevice::attach(&image);
        let raw_image = base.join("raw.img");
        fs::File::create(&raw_image)
            .unwrap()
            .set_len(8 << 20)
            .unwrap();
        let raw = LoopDevice::attach(&raw_image);
        let mut driver_opts = DriverOpts::in_dir(DRIVER, &base.join("driver"));
        driver_opts.node_id = Some(NODE.to_owned());
        env.extra_args.extend([
            "--csi-driver".to_owned(),
            format!("{DRIVER}={}", driver_opts.endpoint.display()),
            "--csi-timeout".to_owned(),
            "5".to_owned(),
            "--sync-frequency".to_owned(),
            "1s".to_owned(),
            "--api-watch-timeout".to_owned(),
            "20s".to_owned(),
            "--checkpoint-every".to_owned(),
            "64".to_owned(),
        ]);
        // the objects: the static namespace's in the dir, the API's there
        let mut docs = vec![csi_driver_object(), secret("static")];
        docs.extend(csi_objects(0, "static"));
        // one object a file: a file of JSON holds one document
        for (i, d) in docs.iter().enumerate() {
            write_atomic(
                &env.objects.join(format!("object-{i}.json")),
                &d.to_string(),
            );
        }
        write_atomic(
            &env.objects.join("config.json"),
            &config_map("static", 0).to_string(),
        );
        api.put(csi_driver_object());
        api.put(secret("api"));
        api.put(config_map("api", 0));
        for i in 1..CSI_HANDLES.len() {
            for o in csi_objects(i, "api") {
                api.put(o);
            }
        }
        for o in local_objects(dev.path()) {
            api.put(o);
        }
        for o in raw_objects(raw.path()) {
            api.put(o);
        }
        for o in csi_raw_objects() {
            api.put(o);
        }
        let root = env.root.clone();
        let staging = CSI_HANDLES
            .iter()
            .map(|h| {
                root.join("plugins/kubernetes.io/csi")
                    .join(DRIVER)
                    .join(sha256_hex(h))
                    .join("globalmount")
            })
            .collect();
        let driver = TestDriver::spawn(driver_opts.clone());
        Soak {
            seed,
            rng: Rng::new(seed),
            start: Instant::now(),
            local_global: root.join("plugins/kubernetes.io/local-volume/mounts/pv-local"),
            staging,
            env,
            api,
            daemon: None,
            slow_disk,
            slow_delays: Vec::new(),
            slow_kills: 0,
            slow_kill_max: Duration::ZERO,
            api_reachable_since_spawn: true,
            driver: Some(driver),
            driver_opts,
            driver_stopped: false,
            api_down: false,
            api_stopped: false,
            raw_map: root.join("plugins/kubernetes.io~local-volume/volumeDevices/pv-raw"),
            csi_raw: CsiRawPaths::new(&root),
            csi_raw_magic: None,
            csi_raw_writes: 0,
            csi_raw_reads: 0,
            csi_raw_adds: 0,
            _holds: DropHolds(root.clone()),
            _raw: raw,
            _dev: dev,
            filled: false,
            unfill_wanted: false,
            pods: BTreeMap::new(),
            next_uid: 0,
            config_gen: 0,
            seen: BTreeMap::new(),
            calls_done: 0,
            open_calls: BTreeMap::new(),
            retries_cut: 0,
            retries_failed: BTreeMap::new(),
            cuts: Vec::new(),
            cut_open: None,
            ends: Vec::new(),
            schedule: Vec::new(),
            faults: BTreeMap::new(),
            restarts: 0,
            reboots: 0,
            adds: 0,
            block_adds: 0,
            deletes: 0,
            ready_checks: 0,
            settles: Vec::new(),
            procs: Vec::new(),
            plugin_ops: Vec::new(),
            violations: Vec::new(),
            reader: Arc::new(Reader::default()),
            poller: Arc::new(Poller::default()),
            ticks: 0,
            long_polls: Vec::new(),
        }
    }

    fn log(&mut self, what: impl AsRef<str>) {
        let line = format!(
            "{:8.3}s {}",
            self.start.elapsed().as_secs_f64(),
            what.as_ref()
        );
        self.schedule.push(line);
    }

    // -------------------------------------------------------- the daemon

    fn spawn_daemon(&mut self) {
        assert!(self.daemon.is_none(), "one daemon at a time");
        self.daemon = Some(self.env.spawn());
        self.api_reachable_since_spawn = !(self.api_down || self.api_stopped);
        self.log("volumed started");
    }

    fn kill_daemon(&mut self) {
        if let Some(d) = self.daemon.take() {
            let began = Instant::now();
            d.kill();
            self.restarts += 1;
            if self.busy(End::DiskFast) {
                self.slow_kills += 1;
                self.slow_kill_max = self.slow_kill_max.max(began.elapsed());
            }
            let t = now_ms();
            self.cuts.push((t, t));
        }
    }

    /// The daemon's TCP address, once its `daemon.json` names it.
    fn addr(&mut self) -> Option<std::net::SocketAddr> {
        let daemon = self.daemon.as_mut()?;
        if daemon.addr.is_none() {
            let pid = daemon.child.borrow().id();
            let info = fs::read(self.env.journal.join("daemon.json")).ok()?;
            let info: Value = serde_json::from_slice(&info).ok()?;
            if info["pid"] != pid {
                return None;
            }
            daemon.addr = info["listen"].as_str()?.parse().ok();
        }
        daemon.addr
    }

    fn readyz(&mut self) -> Option<u16> {
        let addr = self.addr()?;
        volumed::server::client::get(addr, "/readyz", Duration::from_secs(2))
            .ok()
            .map(|(s, _)| s)
    }

    /// GET on the daemon's unix socket: (status, body).
    fn socket_get(&self, path: &str) -> Option<(u16, String)> {
        self.daemon.as_ref()?;
        unix_get(
            &self.env.journal.join("api.sock"),
            path,
            Duration::from_secs(3),
        )
        .ok()
    }

    fn pod_ready(&self, uid: &str) -> Option<bool> {
        let (status, body) = self.socket_get(&format!("/v1/pods/{uid}/volumes"))?;
        if status != 200 {
            return Some(false);
        }
        let doc: Value = serde_json::from_str(&body).ok()?;
        Some(doc["ready"] == true)
    }

    // -------------------------------------------------------- the driver

    fn start_driver(&mut self) {
        if self.driver.is_none() {
            self.driver = Some(TestDriver::spawn(self.driver_opts.clone()));
            self.driver_stopped = false;
            self.log("driver started (socket replaced)");
        }
        self.close_cut();
    }

    fn signal_driver(&self, sig: Signal) {
        if let Some(pid) = self.driver.as_ref().and_then(TestDriver::pid) {
            let _ = kill(Pid::from_raw(i32::try_from(pid).unwrap()), sig);
        }
    }

    fn open_cut(&mut self) {
        self.cut_open.get_or_insert(now_ms());
    }

    fn close_cut(&mut self) {
        if let Some(s) = self.cut_open.take() {
            self.cuts.push((s, now_ms()));
        }
    }

    // -------------------------------------------------------- pods

    fn add_pod(&mut self) {
        let source = if self.rng.chance(1, 2) {
            Source::Api
        } else {
            Source::Static
        };
        let pool: &[Kind] = match source {
            Source::Api => &API_KINDS,
            Source::Static => &STATIC_KINDS,
        };
        let mut kinds: Vec<Kind> = pool
            .iter()
            .copied()
            .filter(|_| self.rng.chance(1, 3))
            .collect();
        if kinds.is_empty() {
            kinds.push(pool[usize::try_from(self.rng.below(pool.len() as u64)).unwrap()]);
        }
        self.next_uid += 1;
        let uid = format!("soak-{}-{:04}", source.ns(), self.next_uid);
        let pod = Pod { source, kinds };
        let obj = pod_object(&uid, &pod);
        match source {
            Source::Api => drop(self.api.put(obj)),
            Source::Static => {
                write_atomic(&self.env.pods.join(format!("{uid}.json")), &obj.to_string())
            }
        }
        self.log(format!("add pod {uid} {:?}", pod.kinds));
        self.block_adds += usize::from(pod.kinds.contains(&Kind::Block));
        self.csi_raw_adds += usize::from(pod.kinds.contains(&Kind::CsiRaw));
        self.pods.insert(uid, pod);
        self.adds += 1;
        self.publish_reader_files();
    }

    fn delete_pod(&mut self) {
        let n = self.pods.len() as u64;
        let i = usize::try_from(self.rng.below(n)).unwrap();
        let Some(uid) = self.pods.keys().nth(i).cloned() else {
            return;
        };
        let pod = self.pods.remove(&uid).unwrap();
        match pod.source {
            Source::Api => drop(self.api.delete("v1", "Pod", Some("api"), &uid)),
            Source::Static => drop(fs::remove_file(self.env.pods.join(format!("{uid}.json")))),
        }
        self.seen.retain(|_, (p, _)| *p != uid);
        self.log(format!("delete pod {uid}"));
        self.deletes += 1;
        self.publish_reader_files();
    }

    fn bump_config(&mut self) {
        self.config_gen += 1;
        let g = self.config_gen;
        self.api.put(config_map("api", g));
        write_atomic(
            &self.env.objects.join("config.json"),
            &config_map("static", g).to_string(),
        );
    }

    /// A pod's target of kind `k`: where its mount is (a raw block map:
    /// the bind on the pod's file in the global map dir) or its dir.
    fn target(&self, uid: &str, k: Kind) -> PathBuf {
        match k {
            Kind::Block => return self.raw_map.join(uid),
            Kind::CsiRaw => return self.csi_raw.pod_file(uid),
            _ => {}
        }
        let (_, plugin, name) = volume_of(k);
        self.env.pod_volume(uid, plugin, &name)
    }

    /// The mounts a running pod's volume of kind `k` keeps: its target,
    /// and for a CSI raw block map the driver's bind on the publish file
    /// too (a mount kind's only).
    fn mounts_of(&self, uid: &str, k: Kind) -> Vec<PathBuf> {
        let mut out = vec![self.target(uid, k)];
        if k == Kind::CsiRaw {
            out.push(self.csi_raw.publish_file(uid));
        }
        out
    }

    fn publish_reader_files(&self) {
        let mut files = Vec::new();
        for (uid, pod) in &self.pods {
            for k in &pod.kinds {
                match k {
                    Kind::Config => files.push(self.target(uid, *k).join("a")),
                    Kind::Projected => files.push(self.target(uid, *k).join("b")),
                    _ => {}
                }
            }
        }
        *self.reader.files.lock().unwrap() = files;
        *self.poller.uids.lock().unwrap() = self.pods.keys().cloned().collect();
    }

    // -------------------------------------------------------- nemesis

    fn draw_fault(&mut self) -> Fault {
        draw_fault(&mut self.rng)
    }

    fn busy(&self, end: End) -> bool {
        self.ends.iter().any(|(_, e)| *e == end)
    }

    fn after(&mut self, d: Duration, end: End) {
        self.ends.push((Instant::now() + d, end));
    }

    /// Starts `fault` unless its class is still in one (then nothing).
    fn strike(&mut self, fault: Fault) {
        // drawn whether or not the fault happens: a seed replays the draws
        let d = self.rng.ms(500, 6_000);
        let driver_busy = self.busy(End::StartDriver) || self.busy(End::ContDriver);
        let api_busy = self.busy(End::ApiUp) || self.busy(End::ApiRestart);
        let done = match fault {
            Fault::VolumedKill if self.daemon.is_some() => {
                self.kill_daemon();
                let d = d / 4;
                self.after(d, End::StartVolumed);
                true
            }
            Fault::VolumedKillApiGone if self.daemon.is_some() && !api_busy => {
                self.kill_daemon();
                self.api.stop();
                self.api_stopped = true;
                self.after(d / 4, End::StartVolumed);
                self.after(d, End::ApiRestart);
                true
            }
            Fault::DriverKill if !driver_busy && self.driver.is_some() => {
                self.open_cut();
                if let Some(mut drv) = self.driver.take() {
                    drv.kill();
                }
                self.after(d, End::StartDriver);
                true
            }
            Fault::DriverHang if !driver_busy && self.driver.is_some() => {
                self.open_cut();
                self.signal_driver(Signal::SIGSTOP);
                self.driver_stopped = true;
                self.after(d, End::ContDriver);
                true
            }
            Fault::DriverRestart if !driver_busy && self.driver.is_some() => {
                self.open_cut();
                if let Some(mut drv) = self.driver.take() {
                    drv.stop();
                }
                self.start_driver();
                true
            }
            Fault::ApiDown if !api_busy => {
                self.api.set_down(true);
                self.api_down = true;
                self.after(d, End::ApiUp);
                true
            }
            Fault::ApiStop if !api_busy => {
                self.api.stop();
                self.api_stopped = true;
                self.after(d, End::ApiRestart);
                true
            }
            Fault::CutWatches if !self.api_stopped => {
                self.api.cut_watches();
                true
            }
            Fault::Compact410 if !self.api_stopped => {
                self.api.compact();
                self.api.cut_watches();
                true
            }
            Fault::GoneStorm => {
                let n = usize::try_from(1 + self.rng.below(4)).unwrap();
                self.api.add_fault(ApiFault::times(
                    "/api/v1/pods",
                    Verb::Watch,
                    Action::GoneWatch,
                    n,
                ));
                if !self.api_stopped {
                    self.api.cut_watches();
                }
                true
            }
            Fault::FillPv if !self.filled && self.mounted(&self.local_global) => {
                match fill(&self.local_global) {
                    Ok(bytes) => {
                        self.filled = true;
                        self.log(format!("local PV filled ({bytes} bytes)"));
                        self.after(d, End::Unfill);
                        true
                    }
                    Err(e) => {
                        self.log(format!("local PV not filled: {e}"));
                        false
                    }
                }
            }
            Fault::SlowDisk if !self.busy(End::DiskFast) => match &self.slow_disk {
                Ok(disk) => {
                    let ms = 20 + self.rng.below(381);
                    disk.set_delay(ms);
                    self.slow_delays.push(ms);
                    self.log(format!("journal disk slow: {ms} ms a write or sync"));
                    // twice a fault's usual length: volumed kills and
                    // reboots meet it more often
                    self.after(2 * d, End::DiskFast);
                    true
                }
                Err(_) => false,
            },
            // a slow disk stays slow across a reboot: only it may be pending
            Fault::Reboot if self.ends.iter().all(|(_, e)| *e == End::DiskFast) => {
                self.reboot();
                true
            }
            _ => false,
        };
        if done {
            *self.faults.entry(fault).or_default() += 1;
            self.log(format!("FAULT {fault:?} ({} ms)", d.as_millis()));
        }
    }

    fn mounted(&self, path: &Path) -> bool {
        MountTable::read_self()
            .map(|t| t.entries().iter().any(|m| m.mount_point == path))
            .unwrap_or(false)
    }

    /// A reboot: volumed and the driver die, every mount below the root
    /// goes, the boot id changes; then both start again. The slow disk's
    /// mount is not below the root: it stays, as the disk does.
    fn reboot(&mut self) {
        self.kill_daemon();
        self.signal_driver(Signal::SIGCONT);
        if let Some(mut drv) = self.driver.take() {
            drv.kill();
        }
        self.open_cut();
        // a reboot lets go of every loop device too: the maps' holds
        // (first: a hold keeps the bind on its pod's file busy)
        detach_holds(&self.env.root);
        unmount_below(&self.env.root);
        self.reboots += 1;
        fs::write(
            &self.env.boot,
            format!("0e2e0e2e-1111-2222-3333-{:012}\n", self.reboots),
        )
        .unwrap();
        self.seen.clear();
        self.open_calls.clear();
        self.start_driver();
        self.spawn_daemon();
    }

    fn run_ends(&mut self, all: bool) {
        let now = Instant::now();
        let mut due: Vec<(Instant, End)> = Vec::new();
        self.ends.retain(|(t, e)| {
            let go = all || *t <= now;
            if go {
                due.push((*t, *e));
            }
            !go
        });
        due.sort_by_key(|(t, _)| *t);
        for (_, e) in due {
            match e {
                End::StartVolumed => {
                    if self.daemon.is_none() {
                        self.spawn_daemon();
                    }
                }
                End::StartDriver => self.start_driver(),
                End::ContDriver => {
                    self.signal_driver(Signal::SIGCONT);
                    self.driver_stopped = false;
                    self.log("driver continued");
                    self.close_cut();
                }
                End::ApiUp => {
                    self.api.set_down(false);
                    self.api_down = false;
                    self.log("API server up");
                }
                End::ApiRestart => {
                    self.api.restart();
                    self.api_stopped = false;
                    self.log("API server restarted");
                }
                End::Unfill => self.unfill_wanted = true,
                End::DiskFast => {
                    if let Ok(disk) = &self.slow_disk {
                        disk.set_delay(0);
                    }
                    self.log("journal disk fast again");
                }
            }
        }
        if !(self.api_down || self.api_stopped) {
            self.api_reachable_since_spawn = true;
        }
    }

    /// Removes the filler once it is due and the PV is mounted.
    fn unfill(&mut self) {
        if !(self.filled && self.unfill_wanted) {
            return;
        }
        if fs::remove_file(self.local_global.join("soak-filler")).is_ok() {
            self.filled = false;
            self.unfill_wanted = false;
            self.log("local PV emptied");
        }
    }

    // -------------------------------------------------------- checks

    fn violation(&mut self, what: String) {
        let mut text = format!(
            "VIOLATION (seed {}): {what}\n--- schedule so far ---\n{}\n",
            self.seed,
            self.schedule.join("\n")
        );
        let _ = writeln!(text, "--- mount table below the root ---");
        for m in self.env.mounts_below_root() {
            let _ = writeln!(
                text,
                "{} {} {}",
                m.mount_id,
                m.fs_type,
                m.mount_point.display()
            );
        }
        let _ = writeln!(text, "--- journal dump ---\n{}", dump_text(&self.env));
        if let Some(d) = &self.daemon {
            let _ = writeln!(text, "--- daemon stderr tail ---\n{}", d.log_tail());
        }
        eprintln!("{text}");
        self.log(format!("VIOLATION: {what}"));
        self.violations.push(what);
    }

    /// One checker pass (see the module doc).
    fn check(&mut self) {
        let table = MountTable::read_self().expect("read mountinfo");
        let mut at: BTreeMap<&Path, Vec<u32>> = BTreeMap::new();
        for m in table.entries() {
            at.entry(m.mount_point.as_path())
                .or_default()
                .push(m.mount_id);
        }
        // running pods' mounts are never removed
        let mut wanted = Vec::new();
        for (uid, pod) in &self.pods {
            for k in pod.kinds.iter().copied().filter(|k| is_mount(*k)) {
                for t in self.mounts_of(uid, k) {
                    wanted.push((uid.clone(), t));
                }
            }
        }
        let mut found = Vec::new();
        for (uid, t) in wanted {
            let now = at.get(t.as_path()).and_then(|v| v.first()).copied();
            match (self.seen.get(&t), now) {
                (Some((_, id)), now) if now != Some(*id) => found.push(format!(
                    "pod {uid}'s {} was mount {id}, now {now:?}, the pod still wanted",
                    t.display()
                )),
                (None, Some(id)) => {
                    self.seen.insert(t, (uid, id));
                }
                _ => {}
            }
        }
        drop(table);
        for f in found {
            self.violation(f);
        }
        self.check_calls();
        // /readyz is not 200 before the API server could be listed
        if !self.api_reachable_since_spawn && self.readyz() == Some(200) {
            self.violation(
                "/readyz 200 while the API server was never reachable since the daemon started"
                    .into(),
            );
        }
        // a pod reported ready has its volumes mounted
        if !self.pods.is_empty() && self.daemon.is_some() {
            let i = usize::try_from(self.ticks % self.pods.len() as u64).unwrap();
            let (uid, pod) = self
                .pods
                .iter()
                .nth(i)
                .map(|(u, p)| (u.clone(), p.clone()))
                .unwrap();
            if self.pod_ready(&uid) == Some(true) {
                self.ready_checks += 1;
                let table = MountTable::read_self().expect("read mountinfo");
                for k in &pod.kinds {
                    for t in self.mounts_of(&uid, *k) {
                        let ok = match is_mount(*k) {
                            true => table.entries().iter().any(|m| m.mount_point == t),
                            false => t.is_dir(),
                        };
                        if !ok {
                            self.violation(format!(
                                "pod {uid} reported ready, its {} not set up",
                                t.display()
                            ));
                        }
                    }
                }
            }
        }
        let torn: Vec<String> = std::mem::take(&mut *self.reader.torn.lock().unwrap());
        for t in torn {
            self.violation(t);
        }
    }

    /// The driver's new calls: no stage or publish again on a path never
    /// unstaged or unpublished, unless a fault may have cut the first.
    fn check_calls(&mut self) {
        let calls = read_calls_timed(&self.driver_opts.state);
        let new: Vec<Value> = calls.into_iter().skip(self.calls_done).collect();
        self.calls_done += new.len();
        let csi_raw_unstage = format!("stage {}", self.csi_raw.staging.display());
        let mut outcomes = None;
        for c in new {
            let at = c["at_ms"].as_u64().unwrap_or(0);
            let Some((open, key)) = call_key(&c) else {
                continue;
            };
            if !open {
                // the test driver removes a block volume's backing file at
                // NodeUnstage: what is staged next is a new volume
                if key == csi_raw_unstage {
                    self.csi_raw_magic = None;
                }
                self.open_calls.remove(&key);
                continue;
            }
            let Some(prev) = self.open_calls.insert(key.clone(), at) else {
                continue;
            };
            if cut_explains(prev, self.cut_open, &self.cuts) {
                self.retries_cut += 1;
                continue;
            }
            // the outcome log is read after the call log: the first
            // call's answer went out before the retry came
            let outcomes = outcomes.get_or_insert_with(|| read_outcomes(&self.driver_opts.state));
            match failed_answer(outcomes, &c, prev) {
                Some(code) => *self.retries_failed.entry(code).or_default() += 1,
                None => self.violation(format!(
                    "{} ({}) issued again at {at} ms, the one at {prev} ms answered OK \
                     (or not at all, uncut) and never undone ({key})",
                    c["method"],
                    c["access_type"].as_str().unwrap_or("no access type")
                )),
            }
        }
    }

    // -------------------------------------------------------- settle

    /// Heals every fault, then waits for the node to settle and checks it.
    fn settle(&mut self) {
        self.log("PAUSE: faults healed");
        self.run_ends(true);
        self.start_driver();
        if self.driver_stopped {
            self.signal_driver(Signal::SIGCONT);
            self.driver_stopped = false;
            self.close_cut();
        }
        if self.api_stopped {
            self.api.restart();
            self.api_stopped = false;
        }
        self.api.set_down(false);
        self.api_down = false;
        self.api.clear_faults();
        self.api_reachable_since_spawn = true;
        if self.daemon.is_none() {
            self.spawn_daemon();
        }
        let began = Instant::now();
        loop {
            self.check();
            self.unfill_wanted = true;
            self.unfill();
            let last = match self.settled() {
                Ok(()) => break,
                Err(why) => why,
            };
            if began.elapsed() > SETTLE_BOUND {
                self.violation(format!(
                    "not settled {SETTLE_BOUND:?} after the pause: {last}"
                ));
                return;
            }
            std::thread::sleep(TICK);
        }
        let took = began.elapsed();
        self.settles.push(took);
        let pid = self.daemon.as_ref().map(|d| d.child.borrow().id());
        if let Some(p) = pid.and_then(proc_figures) {
            self.procs.push(p);
        }
        if let Some(m) = self
            .addr()
            .and_then(|a| volumed::server::client::get(a, "/metrics", Duration::from_secs(5)).ok())
        {
            let text = String::from_utf8_lossy(&m.1).into_owned();
            let ops: f64 = support::daemon::series(&text, "volumed_plugin_operations_total")
                .iter()
                .map(|(_, v)| v)
                .sum();
            self.plugin_ops.push(ops);
            match self.socket_long_polls() {
                Some(n) => self.long_polls.push(n),
                None => self.violation("no volumed_runtime_api_long_polls on /metrics".into()),
            }
        }
        self.log(format!("settled in {took:?} with {} pods", self.pods.len()));
    }

    /// The socket's long-polls waiting once the poller is paused and done
    /// (an abandoned wait's slot may take a moment to come back: a few
    /// seconds are waited for it to show 0), from `/metrics`.
    fn socket_long_polls(&mut self) -> Option<f64> {
        self.poller.pause.store(true, Ordering::SeqCst);
        let began = Instant::now();
        while self.poller.busy.load(Ordering::SeqCst) && began.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut last = None;
        while began.elapsed() < Duration::from_secs(10) {
            let text = self.addr().and_then(|a| {
                volumed::server::client::get(a, "/metrics", Duration::from_secs(5)).ok()
            });
            last = text.and_then(|(_, body)| {
                support::daemon::series(
                    &String::from_utf8_lossy(&body),
                    "volumed_runtime_api_long_polls",
                )
                .into_iter()
                .find(|(k, _)| k.contains("listener=\"socket\""))
                .map(|(_, v)| v)
            });
            if last == Some(0.0) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.poller.pause.store(false, Ordering::SeqCst);
        last
    }

    /// Whether the node is settled; if not, what is still off.
    fn settled(&mut self) -> Result<(), String> {
        if self.readyz() != Some(200) {
            return Err("/readyz not 200".into());
        }
        let uids: Vec<String> = self.pods.keys().cloned().collect();
        for uid in &uids {
            if self.pod_ready(uid) != Some(true) {
                let why = self
                    .socket_get(&format!("/v1/pods/{uid}/volumes"))
                    .map(|(s, b)| format!("{s} {b}"))
                    .unwrap_or_default();
                return Err(format!("pod {uid} not ready: {why}"));
            }
        }
        let mut want: BTreeSet<PathBuf> = BTreeSet::new();
        for (uid, pod) in &self.pods {
            for k in pod.kinds.iter().copied().filter(|k| is_mount(*k)) {
                want.extend(self.mounts_of(uid, k));
                match k {
                    Kind::Local => drop(want.insert(self.local_global.clone())),
                    Kind::Csi(i) => drop(want.insert(self.staging[i].clone())),
                    _ => {}
                }
            }
        }
        let mut have: BTreeMap<PathBuf, usize> = BTreeMap::new();
        for m in self.env.mounts_below_root() {
            *have.entry(m.mount_point).or_default() += 1;
        }
        if let Some((p, n)) = have.iter().find(|(_, n)| **n > 1) {
            return Err(format!("{n} mounts stacked at {}", p.display()));
        }
        let have: BTreeSet<PathBuf> = have.into_keys().collect();
        if have != want {
            return Err(format!(
                "mounts below the root: missing {:?}, not wanted {:?}",
                want.difference(&have).collect::<Vec<_>>(),
                have.difference(&want).collect::<Vec<_>>()
            ));
        }
        // one loop hold per pod mapping a raw block PV (local or CSI), on
        // its file in the global map dir, and no other; the test driver's
        // own device of the CSI one (over its staging dir's file) is
        // checked apart (`Soak::csi_raw_settled`)
        let mapped: Vec<PathBuf> = self
            .pods
            .iter()
            .flat_map(|(uid, p)| p.kinds.iter().map(move |k| (uid, *k)))
            .filter(|(_, k)| matches!(k, Kind::Block | Kind::CsiRaw))
            .filter_map(|(uid, k)| fs::canonicalize(self.target(uid, k)).ok())
            .collect();
        let holds: Vec<(String, PathBuf)> = holds_below(&self.env.root)
            .into_iter()
            .filter(|(_, b)| !b.starts_with(&self.csi_raw.staging_real))
            .collect();
        let backing: Vec<&PathBuf> = holds.iter().map(|(_, b)| b).collect();
        let held_once = mapped
            .iter()
            .all(|m| backing.iter().filter(|b| **b == m).count() == 1);
        if !held_once || holds.len() != mapped.len() {
            return Err(format!(
                "loop holds below the root {holds:?}, not one for each map {mapped:?}"
            ));
        }
        self.csi_raw_settled()?;
        let state = self
            .socket_get("/debug/state")
            .and_then(|(_, b)| serde_json::from_str::<Value>(&b).ok())
            .ok_or("no /debug/state")?;
        let dump = dump_json(&self.env).ok_or("no dump")?;
        journal_covers(&dump["state"], &state)?;
        if targets(&state).values().any(|(_, s)| s == "uncertain") {
            return Err("a target is uncertain".into());
        }
        Ok(())
    }

    /// The CSI raw block PV once the rest has settled: with pods mapping
    /// it, the driver has one device for it, each pod's link names its
    /// publish file and both that file and the pod's file show that
    /// device, and the volume reads back (through every pod's link) what
    /// was written when it was first mapped (written now if it is new);
    /// with none, no device of the driver's and none of its dirs left.
    fn csi_raw_settled(&mut self) -> Result<(), String> {
        let uids: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, p)| p.kinds.contains(&Kind::CsiRaw))
            .map(|(u, _)| u.clone())
            .collect();
        let devices = self.csi_raw.driver_devices(&holds_below(&self.env.root));
        if uids.is_empty() {
            let dirs = self.csi_raw.leftovers();
            if !devices.is_empty() || !dirs.is_empty() {
                return Err(format!(
                    "no pod maps {CSI_RAW_PV}, yet the driver's devices {devices:?} and its dirs {dirs:?} are left"
                ));
            }
            return Ok(());
        }
        let [(name, _)] = devices.as_slice() else {
            return Err(format!(
                "the driver's devices of {CSI_RAW_PV}: {devices:?}, not one"
            ));
        };
        let device = Path::new("/dev").join(name);
        let rdev = fs::metadata(&device)
            .map_err(|e| format!("{}: {e}", device.display()))?
            .rdev();
        for uid in &uids {
            let (link, publish) = (self.csi_raw.link(uid), self.csi_raw.publish_file(uid));
            match fs::read_link(&link) {
                Ok(t) if t == publish => {}
                other => {
                    return Err(format!(
                        "pod {uid}'s link {} is {other:?}, not to {}",
                        link.display(),
                        publish.display()
                    ));
                }
            }
            for f in [publish, self.csi_raw.pod_file(uid)] {
                let m = fs::metadata(&f).map_err(|e| format!("{}: {e}", f.display()))?;
                if !m.file_type().is_block_device() || m.rdev() != rdev {
                    return Err(format!(
                        "pod {uid}'s {} is not the driver's device {}",
                        f.display(),
                        device.display()
                    ));
                }
            }
        }
        let Some(want) = self.csi_raw_magic.clone() else {
            return self.mark_csi_raw(&uids[0]);
        };
        for uid in &uids {
            let link = self.csi_raw.link(uid);
            let got = read_device(&link, want.len())?;
            self.csi_raw_reads += 1;
            if got != want {
                self.violation(format!(
                    "the CSI raw block volume through pod {uid}'s {} reads {:?}, not {:?} \
                     (written when it was first mapped, never unstaged since)",
                    link.display(),
                    String::from_utf8_lossy(&got),
                    String::from_utf8_lossy(&want)
                ));
                // once: what it reads now is what the next settle expects
                self.csi_raw_magic = Some(got);
                break;
            }
        }
        Ok(())
    }

    /// Writes the magic bytes at the start of the CSI raw block volume
    /// through pod `uid`'s link (a device: the map is whole).
    fn mark_csi_raw(&mut self, uid: &str) -> Result<(), String> {
        self.csi_raw_writes += 1;
        let magic = csi_raw_magic(self.seed, self.csi_raw_writes);
        write_device(&self.csi_raw.link(uid), &magic)?;
        self.csi_raw_magic = Some(magic);
        self.log(format!(
            "CSI raw block volume marked through pod {uid} (write {})",
            self.csi_raw_writes
        ));
        Ok(())
    }

    /// During a storm: the CSI raw block volume, freshly staged and mapped
    /// by a pod (its link shows a device), gets its magic bytes, so that
    /// the next settle reads them back (unless it was unstaged between;
    /// see `Soak::check_calls`).
    fn mark_csi_raw_when_mapped(&mut self) {
        if self.csi_raw_magic.is_some() {
            return;
        }
        let mapped = self.pods.iter().find(|(uid, p)| {
            p.kinds.contains(&Kind::CsiRaw)
                && fs::metadata(self.csi_raw.link(uid))
                    .is_ok_and(|m| m.file_type().is_block_device())
        });
        if let Some(uid) = mapped.map(|(u, _)| u.clone())
            && let Err(e) = self.mark_csi_raw(&uid)
        {
            // a pod deleted meanwhile: the next tick tries again
            self.csi_raw_magic = None;
            self.log(format!("CSI raw block volume not marked: {e}"));
        }
    }

    /// The end: every pod deleted, and nothing left mounted below the
    /// root within [`SETTLE_BOUND`] (no leaked pod, staging or device
    /// mount).
    fn drain(&mut self) {
        self.log("DRAIN: every pod deleted");
        while !self.pods.is_empty() {
            self.delete_pod();
        }
        let began = Instant::now();
        loop {
            self.check();
            self.unfill();
            let left = self.env.mounts_below_root();
            let holds = holds_below(&self.env.root);
            let dirs = self.csi_raw.leftovers();
            if left.is_empty() && holds.is_empty() && dirs.is_empty() {
                break;
            }
            if began.elapsed() > SETTLE_BOUND {
                let left: Vec<String> = left
                    .iter()
                    .map(|m| m.mount_point.display().to_string())
                    .collect();
                self.violation(format!(
                    "mounts left {SETTLE_BOUND:?} after every pod went: {left:?}; loop devices \
                     (volumed's holds, the driver's): {holds:?}; CSI raw block dirs: {dirs:?}"
                ));
                return;
            }
            std::thread::sleep(TICK);
        }
        self.log(format!("drained in {:?}", began.elapsed()));
    }

    // -------------------------------------------------------- the run

    fn tick(&mut self, storm: bool) {
        self.ticks += 1;
        // drawn every tick, used or not: a seed replays the draws
        let churn = self.rng.below(100);
        let fault = self.draw_fault();
        let strike = self.rng.below(100);
        let config = self.rng.below(100);
        if churn < 30 {
            let n = self.pods.len();
            let add = n < PODS_MIN || (n < PODS_MAX && churn < 16);
            if add {
                self.add_pod()
            } else {
                self.delete_pod()
            }
        }
        if config < 8 {
            self.bump_config();
        }
        if storm && strike < 9 {
            self.strike(fault);
        }
        self.run_ends(false);
        self.unfill();
        self.check();
        self.mark_csi_raw_when_mapped();
    }

    fn figures(&self) -> String {
        let mut s = String::new();
        let mut settles = self.settles.clone();
        settles.sort();
        let _ = writeln!(
            s,
            "soak: seed {}, {:.1} s run, {} ticks, {} violations",
            self.seed,
            self.start.elapsed().as_secs_f64(),
            self.ticks,
            self.violations.len()
        );
        let _ = writeln!(s, "faults: {:?}", self.faults);
        let _ = match &self.slow_disk {
            Ok(_) => writeln!(
                s,
                "slow disk: the journal on volumed-slowfs; slow spells {} (ms: {:?}); volumed killed while slow {} (reaped within {:?})",
                self.slow_delays.len(),
                self.slow_delays,
                self.slow_kills,
                self.slow_kill_max
            ),
            Err(why) => writeln!(s, "slow disk: not available, {why}"),
        };
        let _ = writeln!(
            s,
            "volumed restarts {} (reboots {}); pods added {} ({} mapping the raw block PV, {} the CSI raw block PV), deleted {}; ConfigMap generations {}; ready answers checked {}; payload reads {}",
            self.restarts,
            self.reboots,
            self.adds,
            self.block_adds,
            self.csi_raw_adds,
            self.deletes,
            self.config_gen,
            self.ready_checks,
            self.reader.reads.load(Ordering::Relaxed)
        );
        let mut rpcs: BTreeMap<String, usize> = BTreeMap::new();
        for c in read_calls_timed(&self.driver_opts.state) {
            *rpcs
                .entry(c["method"].as_str().unwrap_or("?").to_owned())
                .or_default() += 1;
        }
        let _ = writeln!(s, "CSI calls: {rpcs:?}");
        let _ = writeln!(
            s,
            "stage/publish made again: {} after a cut, after a failed answer {:?}",
            self.retries_cut, self.retries_failed
        );
        let _ = writeln!(
            s,
            "CSI raw block volume: magic bytes written {} times, read back {} times",
            self.csi_raw_writes, self.csi_raw_reads
        );
        let _ = writeln!(
            s,
            "plugin operations per settle (that daemon's count): {:?}",
            self.plugin_ops
        );
        let _ = writeln!(
            s,
            "settles {}: p50 {:?}, p99 {:?}, max {:?}",
            settles.len(),
            percentile(&settles, 50),
            percentile(&settles, 99),
            settles.last().copied().unwrap_or_default()
        );
        let procs: Vec<String> = self
            .procs
            .iter()
            .map(|p| format!("{} KiB/{} fds/{} thr", p.rss_kib, p.fds, p.threads))
            .collect();
        let _ = writeln!(s, "daemon after each settle: {}", procs.join(", "));
        let _ = writeln!(
            s,
            "runtime API long-polls asked {} (abandoned or cut {}); waiting on the socket after each settle: {:?}",
            self.poller.asked.load(Ordering::Relaxed),
            self.poller.abandoned.load(Ordering::Relaxed),
            self.long_polls
        );

        for v in &self.violations {
            let _ = writeln!(s, "violation: {v}");
        }
        s
    }
}

/// Fills the filesystem at `dir` to its last block with `soak-filler`.
fn fill(dir: &Path) -> Result<u64, String> {
    let path = dir.join("soak-filler");
    let mut f = fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut total = 0u64;
    for chunk in [1 << 16, 1 << 12, 1] {
        let buf = vec![0x5au8; chunk];
        loop {
            match f.write(&buf) {
                Ok(n) => total += n as u64,
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => break,
                Err(e) => return Err(format!("{}: {e}", path.display())),
            }
        }
    }
    Ok(total)
}

/// Unmounts everything strictly below `root`, deepest first (a reboot).
fn unmount_below(root: &Path) {
    for _ in 0..5 {
        let table = MountTable::read_self().expect("read mountinfo");
        let left: Vec<PathBuf> = table
            .entries()
            .iter()
            .filter(|e| e.mount_point.starts_with(root) && e.mount_point != root)
            .map(|e| e.mount_point.clone())
            .collect();
        if left.is_empty() {
            return;
        }
        for m in left.iter().rev() {
            let _ = umount2(m.as_path(), MntFlags::UMOUNT_NOFOLLOW);
        }
        // a loop device let go of may release its file a moment later
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("could not unmount everything below {}", root.display());
}

/// `volumed dump --format json`, or None.
fn dump_json(env: &Env) -> Option<Value> {
    let out = dump_cmd(env).arg("json").output().ok()?;
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

/// `volumed dump` as a table, or why not.
fn dump_text(env: &Env) -> String {
    match dump_cmd(env).arg("table").output() {
        Ok(o) => format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => format!("dump: {e}"),
    }
}

fn dump_cmd(env: &Env) -> std::process::Command {
    let mut c = std::process::Command::new(support::daemon::BIN);
    c.arg("dump")
        .arg("--journal-dir")
        .arg(&env.journal)
        .arg("--boot-id-file")
        .arg(&env.boot)
        .arg("--format");
    c
}

/// What the journal holds of a state document: its targets that are not
/// `none`, without the health report (as `tests/peer_faults.rs`).
fn journaled(state: &Value) -> Value {
    let mut volumes = Vec::new();
    for v in state["volumes"].as_array().into_iter().flatten() {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.remove("health");
        }
        if let Some(p) = v["pods"].as_array_mut() {
            p.retain(|p| p["kind"] != "none");
        }
        let pods_empty = v["pods"].as_array().is_none_or(Vec::is_empty);
        if !v["device"].is_null() || !pods_empty {
            volumes.push(v);
        }
    }
    json!({ "volumes": volumes })
}

/// Whether the journal (`dump`'s state) holds every target `/debug/state`
/// holds, in the same state (no acknowledged record lost), and no other:
/// a pod target torn down is forgotten, even while other pods keep its
/// volume, and so is a target reconstruction found not mounted once no
/// pod wants it (a pod deleted while volumed was down; the soak's second
/// finding, `src/reconciler/core/unheld.rs`).
fn journal_covers(journal: &Value, live: &Value) -> Result<(), String> {
    let (j, l) = (targets(&journaled(journal)), targets(&journaled(live)));
    if let Some((p, v)) = l.iter().find(|(p, v)| j.get(*p) != Some(*v)) {
        return Err(format!(
            "the journal has {} as {:?}, /debug/state as {v:?}",
            p.display(),
            j.get(p)
        ));
    }
    if let Some((p, (volume, state))) = j.iter().find(|(p, _)| !l.contains_key(*p)) {
        return Err(format!(
            "the journal has {} as {state} ({volume}), /debug/state does not have it",
            p.display()
        ));
    }
    Ok(())
}

/// The long-poller: asks the socket about the pods alive (and one no
/// source has) with `wait`, in turn: a wait that times out, one it
/// abandons before its answer, one answered when the pod is ready.
fn long_poll(poller: &Poller, socket: &Path) {
    let mut i = 0u64;
    while !poller.stop.load(Ordering::SeqCst) {
        poller.busy.store(true, Ordering::SeqCst);
        if poller.pause.load(Ordering::SeqCst) {
            poller.busy.store(false, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let uid = {
            let uids = poller.uids.lock().unwrap();
            let n = uids.len() as u64;
            (n > 0).then(|| uids[usize::try_from(i % n).unwrap()].clone())
        };
        let (path, timeout) = match (i % 3, uid) {
            (0, _) | (_, None) => ("/v1/pods/soak-nobody/volumes?wait=1".to_owned(), 3_000),
            (1, Some(u)) => (format!("/v1/pods/{u}/volumes?wait=3"), 200),
            (_, Some(u)) => (format!("/v1/pods/{u}/volumes?wait=3"), 5_000),
        };
        poller.asked.fetch_add(1, Ordering::Relaxed);
        if unix_get(socket, &path, Duration::from_millis(timeout)).is_err() {
            poller.abandoned.fetch_add(1, Ordering::Relaxed);
        }
        poller.busy.store(false, Ordering::SeqCst);
        i += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The payload reader: reads every ConfigMap file of the pods alive, over
/// and over; a read that succeeds must be one whole generation.
fn read_payloads(reader: &Reader) {
    while !reader.stop.load(Ordering::Relaxed) {
        let files = reader.files.lock().unwrap().clone();
        for f in files {
            if let Ok(text) = fs::read(&f) {
                reader.reads.fetch_add(1, Ordering::Relaxed);
                if let Some(why) = torn(&text) {
                    reader
                        .torn
                        .lock()
                        .unwrap()
                        .push(format!("payload {} torn: {why}", f.display()));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn seed() -> u64 {
    match std::env::var("VOLUMED_SOAK_SEED") {
        Ok(s) => s.parse().expect("VOLUMED_SOAK_SEED is a number"),
        Err(_) => {
            let t = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            u64::from(t.subsec_nanos()) ^ t.as_secs()
        }
    }
}

fn secs() -> u64 {
    std::env::var("VOLUMED_SOAK_SECS")
        .map(|s| s.parse().expect("VOLUMED_SOAK_SECS is a number of seconds"))
        .unwrap_or(DEFAULT_SECS)
}

/// The soak (see the module doc).
#[test]
fn nemesis_soak() {
    if !support::require_root("the nemesis soak") {
        return;
    }
    // the run, a final settle and the teardown, with room to spare
    let limit = Duration::from_secs(secs() + 2 * SETTLE_BOUND.as_secs() + 60);
    support::in_private_mount_ns_timeout(limit, || {
        let seed = seed();
        let secs = secs();
        eprintln!("soak: seed {seed} (VOLUMED_SOAK_SEED={seed} replays it), {secs} s");
        let mut soak = Soak::new(seed);
        let reader = Arc::clone(&soak.reader);
        let reading = std::thread::spawn(move || read_payloads(&reader));
        let poller = Arc::clone(&soak.poller);
        let socket = soak.env.journal.join("api.sock");
        let polling = std::thread::spawn(move || long_poll(&poller, &socket));
        for _ in 0..PODS_MIN {
            soak.add_pod();
        }
        soak.spawn_daemon();
        soak.settle();
        let run = Duration::from_secs(secs);
        let mut storms = 0;
        'run: while soak.start.elapsed() < run && soak.violations.is_empty() {
            soak.log("STORM");
            storms += 1;
            // the second storm opens with a reboot: every short run has one
            if storms == 2 {
                soak.strike(Fault::Reboot);
            }
            let storm = Instant::now();
            let mut next = Instant::now();
            while storm.elapsed() < STORM && soak.start.elapsed() < run {
                soak.tick(true);
                if !soak.violations.is_empty() {
                    break 'run;
                }
                next += TICK;
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
            soak.settle();
        }
        if soak.violations.is_empty() {
            soak.drain();
        }
        soak.reader.stop.store(true, Ordering::Relaxed);
        soak.poller.stop.store(true, Ordering::SeqCst);
        polling.join().unwrap();
        reading.join().unwrap();
        let figures = soak.figures();
        println!("{figures}");
        eprintln!("{figures}");
        let summary = Path::new(env!("CARGO_TARGET_TMPDIR")).join("soak-summary.txt");
        let _ = fs::write(&summary, &figures);
        assert!(
            soak.violations.is_empty(),
            "the soak found violations (seed {seed}):\n{figures}"
        );
        // no growth of the daemon from the first settle after a storm to
        // the last (the first of all, with fewer pods and fresh pools, is
        // no baseline)
        let (first, last) = (soak.procs.get(1).copied(), soak.procs.last().copied());
        if let (Some(a), Some(b)) = (first, last) {
            assert!(
                b.fds <= a.fds + Slack::FDS
                    && b.threads <= a.threads + Slack::THREADS
                    && b.rss_kib <= a.rss_kib + Slack::RSS_KIB,
                "the daemon grew from the first settle after a storm ({a:?}) to the last \
                 ({b:?}) beyond {} fds, {} threads, {} KiB (seed {seed})",
                Slack::FDS,
                Slack::THREADS,
                Slack::RSS_KIB
            );
        }
        // the socket's long-poll slots all come back: as many taken at
        // the last settle as at the first
        assert_eq!(
            soak.long_polls.first(),
            soak.long_polls.last(),
            "the socket's long-polls waiting at the first settle and at the last (seed {seed})"
        );
        if let Some(d) = soak.daemon.take() {
            d.stop();
        }
    });
}

/// The re-issue check's keys and cuts (no root needed): a block
/// volume's staging dir and publish file are keyed as a filesystem
/// volume's paths; a re-issue is explained only by a fault around the
/// first call.
#[test]
fn a_stage_or_publish_again_is_explained_only_by_a_cut() {
    let devices = "/r/plugins/kubernetes.io/csi/volumeDevices";
    let call = |method: &str, field: &str, path: &str| json!({"method": method, field: path, "access_type": "block", "at_ms": 1});
    let staging = format!("{devices}/staging/{CSI_RAW_PV}");
    let publish = format!("{devices}/publish/{CSI_RAW_PV}/soak-api-0001");
    let keys = [
        (
            call("NodeStageVolume", "staging_target_path", &staging),
            Some((true, format!("stage {staging}"))),
        ),
        (
            call("NodeUnstageVolume", "staging_target_path", &staging),
            Some((false, format!("stage {staging}"))),
        ),
        (
            call("NodePublishVolume", "target_path", &publish),
            Some((true, format!("publish {publish}"))),
        ),
        (
            call("NodeUnpublishVolume", "target_path", &publish),
            Some((false, format!("publish {publish}"))),
        ),
        (call("NodeExpandVolume", "volume_path", &publish), None),
        (json!({"method": "NodeGetCapabilities"}), None),
    ];
    for (c, want) in keys {
        assert_eq!(call_key(&c), want, "{c}");
    }
    let w = CUT_WINDOW;
    // (the first call at, an open cut since, closed cuts, explained)
    type Case<'a> = (u64, Option<u64>, &'a [(u64, u64)], bool);
    let cases: [Case<'_>; 9] = [
        (10_000, None, &[], false),
        // a driver kill, hang or restart cut soon after the call
        (10_000, None, &[(10_000 + w, 10_500 + w)], true),
        (10_000, None, &[(10_001 + w, 20_000)], false),
        // one that ended just before it (its retry still in flight)
        (10_000, None, &[(5_000, 10_000 - w)], true),
        (10_000, None, &[(5_000, 9_999 - w)], false),
        // a volumed kill: a cut of no length
        (10_000, None, &[(11_000, 11_000)], true),
        // a driver still dead or stopped
        (10_000, Some(9_000), &[], true),
        (10_000, Some(10_000 + w), &[], true),
        (10_000, Some(10_001 + w), &[(1, 2)], false),
    ];
    for (prev, open, cuts, want) in cases {
        assert_eq!(
            cut_explains(prev, open, cuts),
            want,
            "{prev} {open:?} {cuts:?}"
        );
    }
    // a first call that failed explains its retry; one answered OK, or
    // not answered, does not (nor another path's or time's failure)
    let publish_at = |at: u64, path: &str| json!({"method": "NodePublishVolume", "target_path": path, "at_ms": at});
    let outcome = |at: u64, path: &str, code: &str| {
        json!({"method": "NodePublishVolume", "target_path": path, "at_ms": at,
            "pid": 7, "code": code})
    };
    let other = format!("{devices}/publish/{CSI_RAW_PV}/soak-api-0002");
    let retry = publish_at(20_000, &publish);
    let logs: [(Vec<Value>, Option<&str>); 5] = [
        (
            vec![outcome(10_000, &publish, "FailedPrecondition")],
            Some("FailedPrecondition"),
        ),
        (vec![outcome(10_000, &publish, "OK")], None),
        (vec![], None),
        (vec![outcome(10_000, &other, "Internal")], None),
        (
            vec![
                outcome(9_999, &publish, "Internal"),
                outcome(10_000, &publish, "OK"),
            ],
            None,
        ),
    ];
    for (log, want) in logs {
        assert_eq!(
            failed_answer(&log, &retry, 10_000).as_deref(),
            want,
            "{log:?}"
        );
    }
}

/// One seed replays the nemesis's draws: the same faults in the same
/// order, every class drawn; another seed draws another schedule. Needs
/// no root.
#[test]
fn a_seed_replays_the_nemesis_s_draws() {
    let draws = |seed: u64| {
        let mut rng = Rng::new(seed);
        (0..2_000).map(|_| draw_fault(&mut rng)).collect::<Vec<_>>()
    };
    let first = draws(1156912479);
    assert_eq!(first, draws(1156912479));
    assert_ne!(first, draws(2110651315));
    for (fault, _) in WEIGHTS {
        assert!(first.contains(&fault), "{fault:?} is drawn");
    }
}
