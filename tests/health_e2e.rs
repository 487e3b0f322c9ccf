//! Volume health end to end: the real `volumed run` binary, real faults,
//! each test as root in its own private mount namespace with its own loop
//! device (detached on drop) or test CSI driver, and checked only through
//! the daemon's contracts: `/debug/health?fresh=1` (a pass now),
//! `/debug/state`, `/debug/events`, `/metrics`.
//!
//! 1. a local PV on a loop device filled to the last block: `OutOfSpace`,
//!    the gauges and a `VolumeConditionAbnormal` event for the pod; freed
//!    again: normal, a `VolumeConditionNormal` event;
//! 2. `trigger_fs_error` on the mounted ext4: `FilesystemErrors`; then the
//!    volume remounted read-only under the read-write pod;
//! 3. a pod's tmpfs emptyDir unmounted outside volumed: `MountVanished`
//!    (and one volume asked for, `?volume=` and `volumed health --volume`,
//!    is that volume alone); a disk emptyDir's files past its
//!    `sizeLimit`: `SizeLimitExceeded`;
//! 4. the test CSI driver reporting abnormal, then failing the call (the
//!    condition stays, the failure is counted), then normal;
//! 5. a driver without `VOLUME_CONDITION`: usage only, no condition.
//!
//! The daemon runs with `--health-period 1h`, so every pass is one the
//! test asked for.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use support::LoopDevice;
use support::csi_driver::{DriverOpts, TestDriver};
use support::daemon::{Daemon, Env, NODE, real, series};

const PV: &str = "pv-health";
const PVC: &str = "data-health";
const POD: &str = "health-pod-a";
const LOCAL_VOLUME: &str = "kubernetes.io/local-volume/pv-health";
const DRIVER: &str = "health.csi.volumed.dev";
const HANDLE: &str = "vol-health-1";
const CSI_VOLUME: &str = "kubernetes.io/csi/health.csi.volumed.dev^vol-health-1";

fn quiet(env: &mut Env) {
    env.extra_args
        .extend(["--health-period".to_owned(), "1h".to_owned()]);
}

/// The local PV on `device` and its claim.
fn local_objects(device: &Path) -> String {
    format!(
        "apiVersion: v1
kind: PersistentVolume
metadata: {{name: {PV}}}
spec:
  capacity: {{storage: 16Mi}}
  accessModes: [ReadWriteOnce]
  claimRef: {{namespace: default, name: {PVC}}}
  local: {{path: {device}, fsType: ext4}}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - {{key: kubernetes.io/hostname, operator: Exists}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: {PVC}, namespace: default}}
spec:
  accessModes: [ReadWriteOnce]
  volumeName: {PV}
  resources: {{requests: {{storage: 16Mi}}}}
",
        device = device.display()
    )
}

/// A pod with the claim as `data` and a memory emptyDir `cache`.
fn pod(uid: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {uid}, namespace: default, uid: {uid}}}
spec:
  containers: [{{name: app, image: busybox}}]
  volumes:
  - name: data
    persistentVolumeClaim: {{claimName: {PVC}}}
  - name: cache
    emptyDir: {{medium: Memory}}
"
    )
}

/// A pass now; the volume `name`'s entry of `/debug/health`.
fn checked(daemon: &Daemon, name: &str) -> Value {
    let doc: Value = serde_json::from_str(&daemon.get("/debug/health?fresh=1")).unwrap();
    doc["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["volume"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("{name} not in {doc:#}"))
}

fn events(daemon: &Daemon) -> Vec<Value> {
    serde_json::from_str::<Value>(&daemon.get("/debug/events"))
        .unwrap()
        .as_array()
        .cloned()
        .unwrap()
}

/// The events of `reason` for `pod`.
fn events_of(daemon: &Daemon, reason: &str, pod: &str) -> Vec<Value> {
    events(daemon)
        .into_iter()
        .filter(|e| e["reason"] == reason && e["pod_uid"] == pod)
        .collect()
}

/// The value of metric `name` for the test's claim.
fn claim_metric(daemon: &Daemon, name: &str) -> Option<f64> {
    let labels = format!(r#"{name}{{namespace="default",persistentvolumeclaim="{PVC}"}}"#);
    series(&daemon.metrics(), name)
        .into_iter()
        .find(|(k, _)| *k == labels)
        .map(|(_, v)| v)
}

/// The env, the loop device and the daemon with the pod's volumes mounted.
fn local_pv_pod(prefix: &str) -> (Env, LoopDevice, Daemon) {
    let mut env = Env::new(prefix);
    quiet(&mut env);
    let image = env.scratch.path().join("disk.img");
    support::mkfs_ext4(&image, 16);
    let disk = LoopDevice::attach(&image);
    fs::write(env.objects.join("pv.yaml"), local_objects(disk.path())).unwrap();
    env.write_pod("a.yaml", &pod(POD));
    let daemon = env.start();
    let target = data_target(&env);
    daemon.wait_until("the claim is mounted in the pod", || {
        support::daemon::all_mounted(&daemon.state(), std::slice::from_ref(&target))
    });
    (env, disk, daemon)
}

fn data_target(env: &Env) -> PathBuf {
    env.pod_volume(POD, "kubernetes.io~local-volume", PV)
}

fn device_target(env: &Env) -> PathBuf {
    env.root
        .join("plugins/kubernetes.io/local-volume/mounts")
        .join(PV)
}

/// Writes zeros to `file` until the filesystem refuses (ENOSPC).
fn fill(file: &Path) {
    let mut f = fs::File::create(file).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    loop {
        match f.write(&chunk) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    // the last partial blocks
    let _ = f.write_all(&[0u8; 512]);
    let _ = f.sync_all();
}

#[test]
fn a_local_pv_filled_to_the_last_block_is_out_of_space_until_freed() {
    real("fills a loop-device local PV", || {
        let (env, _disk, daemon) = local_pv_pod("volumed-health-full-");
        let v = checked(&daemon, LOCAL_VOLUME);
        assert_eq!(v["health"]["abnormal"], false, "{v:#}");
        assert_eq!(v["health"]["source"], "native");
        assert_eq!(
            claim_metric(&daemon, "kubelet_volume_stats_health_status_abnormal"),
            Some(0.0)
        );
        assert!(claim_metric(&daemon, "kubelet_volume_stats_capacity_bytes").unwrap() > 0.0);

        let filler = data_target(&env).join("filler");
        fill(&filler);
        let v = checked(&daemon, LOCAL_VOLUME);
        assert_eq!(v["health"]["abnormal"], true, "{v:#}");
        assert_eq!(v["health"]["reason"], "OutOfSpace", "{v:#}");
        assert_eq!(v["usage"]["available_bytes"], 0, "{v:#}");
        assert_eq!(
            claim_metric(&daemon, "kubelet_volume_stats_health_status_abnormal"),
            Some(1.0)
        );
        assert_eq!(
            claim_metric(&daemon, "kubelet_volume_stats_available_bytes"),
            Some(0.0)
        );
        let warned = events_of(&daemon, "VolumeConditionAbnormal", POD);
        assert_eq!(warned.len(), 1, "{:#?}", events(&daemon));
        assert_eq!(warned[0]["type"], "Warning");
        assert_eq!(warned[0]["namespace"], "default");
        // a static pod's name is `<name>-<node>`, as the kubelet names its mirror
        assert_eq!(warned[0]["pod"], format!("{POD}-{NODE}"));
        assert!(
            warned[0]["message"]
                .as_str()
                .unwrap()
                .starts_with("Volume data: "),
            "{warned:#?}"
        );
        let state = daemon.state();
        let vol = state["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["volume"] == LOCAL_VOLUME)
            .unwrap();
        assert_eq!(vol["health"]["reason"], "OutOfSpace", "{state:#}");
        let pod_health = &state["pod_volume_health"][POD];
        let data = pod_health
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["name"] == "data")
            .unwrap_or_else(|| panic!("{state:#}"));
        assert_eq!(
            data["healthConditions"],
            json!([{"status": "Degraded", "reason": "OutOfSpace",
                    "message": data["healthConditions"][0]["message"]}])
        );

        fs::remove_file(&filler).unwrap();
        let v = checked(&daemon, LOCAL_VOLUME);
        assert_eq!(v["health"]["abnormal"], false, "{v:#}");
        assert_eq!(
            claim_metric(&daemon, "kubelet_volume_stats_health_status_abnormal"),
            Some(0.0)
        );
        let normal = events_of(&daemon, "VolumeConditionNormal", POD);
        assert_eq!(normal.len(), 1, "{:#?}", events(&daemon));
        assert_eq!(normal[0]["type"], "Normal");
        daemon.stop();
    });
}

#[test]
fn ext4_errors_and_a_read_only_remount_are_reported() {
    real("triggers an ext4 error on a loop device", || {
        let (env, disk, daemon) = local_pv_pod("volumed-health-fserr-");
        let name = format!("loop{}", disk.number());
        let trigger = Path::new("/sys/fs/ext4")
            .join(&name)
            .join("trigger_fs_error");
        assert!(trigger.exists(), "this test needs {}", trigger.display());
        assert_eq!(checked(&daemon, LOCAL_VOLUME)["health"]["abnormal"], false);
        fs::write(&trigger, "volumed health test\n").unwrap();
        daemon.wait_until("the error is reported", || {
            checked(&daemon, LOCAL_VOLUME)["health"]["reason"] == "FilesystemErrors"
        });
        let v = checked(&daemon, LOCAL_VOLUME);
        assert_eq!(v["health"]["abnormal"], true, "{v:#}");
        assert_eq!(events_of(&daemon, "VolumeConditionAbnormal", POD).len(), 1);

        let out = Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(device_target(&env))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let v = checked(&daemon, LOCAL_VOLUME);
        let message = v["health"]["message"].as_str().unwrap();
        assert!(message.contains("read-only"), "{v:#}");
        let state = daemon.state();
        let reasons: Vec<&Value> = state["pod_volume_health"][POD]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["name"] == "data")
            .unwrap()["healthConditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| &c["reason"])
            .collect();
        assert_eq!(
            reasons,
            [&json!("FilesystemErrors"), &json!("ReadOnlyFilesystem")],
            "{state:#}"
        );
        daemon.kill();
    });
}

#[test]
fn a_pod_volume_unmounted_outside_volumed_is_reported_vanished() {
    real("unmounts a pod's tmpfs behind the daemon's back", || {
        let (env, _disk, daemon) = local_pv_pod("volumed-health-vanish-");
        let cache = env.pod_volume(POD, "kubernetes.io~empty-dir", "cache");
        let name = format!("kubernetes.io/empty-dir/{POD}-cache");
        assert_eq!(checked(&daemon, &name)["health"]["abnormal"], false);
        support::umount(&cache);
        let v = checked(&daemon, &name);
        assert_eq!(v["health"]["abnormal"], true, "{v:#}");
        assert_eq!(v["health"]["reason"], "MountVanished", "{v:#}");
        let warned = events_of(&daemon, "VolumeConditionAbnormal", POD);
        assert_eq!(warned.len(), 1, "{warned:#?}");
        assert!(
            warned[0]["message"]
                .as_str()
                .unwrap()
                .starts_with("Volume cache: ")
        );
        // the PV beside it is untouched
        assert_eq!(checked(&daemon, LOCAL_VOLUME)["health"]["abnormal"], false);
        // one volume asked for, over HTTP and through `volumed health`
        let query = volumed::server::client::with_query(
            "/debug/health",
            &[Some(("fresh", "1")), Some(("volume", &name))],
        );
        let doc: Value = serde_json::from_str(&daemon.get(&query)).unwrap();
        let only = doc["volumes"].as_array().unwrap();
        assert_eq!(only.len(), 1, "{doc:#}");
        assert_eq!(only[0]["volume"], name.as_str(), "{doc:#}");
        let out = Command::new(support::daemon::BIN)
            .args(["health", "--format", "json", "--volume", LOCAL_VOLUME])
            .arg("--journal-dir")
            .arg(&env.journal)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
        let only = doc["volumes"].as_array().unwrap();
        assert_eq!(only.len(), 1, "{doc:#}");
        assert_eq!(only[0]["volume"], LOCAL_VOLUME, "{doc:#}");
        daemon.kill();
    });
}

/// A disk emptyDir shares the node's filesystem, so its `sizeLimit` is
/// judged by the blocks of its own files (as the kubelet's eviction
/// manager runs `du`), nested ones included: over the limit, then under
/// it again once a file is removed.
#[test]
fn a_disk_empty_dir_over_its_size_limit_is_found_by_walking_it() {
    real("fills a disk emptyDir past its sizeLimit", || {
        let mut env = Env::new("volumed-health-sizelimit-");
        quiet(&mut env);
        env.write_pod(
            "s.yaml",
            &format!(
                "apiVersion: v1
kind: Pod
metadata: {{name: {POD}, namespace: default, uid: {POD}}}
spec:
  containers: [{{name: app, image: busybox}}]
  volumes:
  - name: scratch
    emptyDir: {{sizeLimit: 64Ki}}
"
            ),
        );
        let daemon = env.start();
        let dir = env.pod_volume(POD, "kubernetes.io~empty-dir", "scratch");
        let name = format!("kubernetes.io/empty-dir/{POD}-scratch");
        daemon.wait_until("the emptyDir is set up", || {
            support::daemon::all_mounted(&daemon.state(), std::slice::from_ref(&dir))
        });
        assert_eq!(checked(&daemon, &name)["health"]["abnormal"], false);
        fs::create_dir_all(dir.join("nested/deeper")).unwrap();
        let big = dir.join("nested/deeper/blob");
        let mut f = fs::File::create(&big).unwrap();
        f.write_all(&vec![7u8; 256 * 1024]).unwrap();
        f.sync_all().unwrap();
        let v = checked(&daemon, &name);
        assert_eq!(v["health"]["abnormal"], true, "{v:#}");
        assert_eq!(v["health"]["reason"], "SizeLimitExceeded", "{v:#}");
        assert!(
            v["health"]["message"].as_str().unwrap().contains("65536"),
            "{v:#}"
        );
        fs::remove_file(&big).unwrap();
        let v = checked(&daemon, &name);
        assert_eq!(v["health"]["abnormal"], false, "{v:#}");
        daemon.kill();
    });
}

// ---------------------------------------------------------------- CSI

fn csi_objects() -> String {
    format!(
        "apiVersion: v1
kind: PersistentVolume
metadata: {{name: pv-csi-health}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  claimRef: {{namespace: default, name: {PVC}}}
  csi: {{driver: {DRIVER}, volumeHandle: {HANDLE}, fsType: ext4}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: {PVC}, namespace: default}}
spec:
  accessModes: [ReadWriteOnce]
  volumeName: pv-csi-health
  resources: {{requests: {{storage: 1Gi}}}}
---
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {{name: {DRIVER}}}
spec: {{attachRequired: false}}
"
    )
}

fn csi_pod() -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {POD}, namespace: default, uid: {POD}}}
spec:
  containers: [{{name: app, image: busybox}}]
  volumes:
  - name: data
    persistentVolumeClaim: {{claimName: {PVC}}}
"
    )
}

/// A daemon with the CSI pod's volume published by a driver with `caps`.
fn csi_pod_running(prefix: &str, caps: Option<&str>) -> (Env, TestDriver, Daemon) {
    let mut env = Env::new(prefix);
    quiet(&mut env);
    fs::write(env.objects.join("csi.yaml"), csi_objects()).unwrap();
    let mut opts = DriverOpts::in_dir(DRIVER, &env.scratch.path().join("driver"));
    opts.node_id = Some(NODE.to_owned());
    opts.caps = caps.map(str::to_owned);
    env.extra_args.extend([
        "--csi-driver".to_owned(),
        format!("{DRIVER}={}", opts.endpoint.display()),
    ]);
    let driver = TestDriver::spawn(opts);
    env.write_pod("a.yaml", &csi_pod());
    let daemon = env.start();
    let target = env
        .pod_volume(POD, "kubernetes.io~csi", "pv-csi-health")
        .join("mount");
    daemon.wait_until("the CSI volume is published", || {
        support::daemon::all_mounted(&daemon.state(), std::slice::from_ref(&target))
    });
    (env, driver, daemon)
}

#[test]
fn a_csi_condition_is_relayed_and_a_failed_call_keeps_it() {
    real("runs the test CSI driver", || {
        let (env, driver, daemon) = csi_pod_running("volumed-health-csi-", None);
        driver.set_faults(json!([{"method": "NodeGetVolumeStats", "abnormal": "disk on fire"}]));
        let v = checked(&daemon, CSI_VOLUME);
        assert_eq!(v["health"]["abnormal"], true, "{v:#}");
        assert_eq!(v["health"]["source"], "csi");
        assert_eq!(v["health"]["reason"], "VolumeConditionAbnormal");
        assert_eq!(v["health"]["message"], "disk on fire");
        assert_eq!(
            claim_metric(&daemon, "kubelet_volume_stats_health_status_abnormal"),
            Some(1.0)
        );
        let warned = events_of(&daemon, "VolumeConditionAbnormal", POD);
        assert_eq!(warned.len(), 1, "{warned:#?}");
        assert_eq!(warned[0]["message"], "Volume data: disk on fire");
        let asked = driver.calls();
        let call = asked
            .iter()
            .rev()
            .find(|c| c["method"] == "NodeGetVolumeStats")
            .unwrap();
        let publish = env
            .pod_volume(POD, "kubernetes.io~csi", "pv-csi-health")
            .join("mount");
        assert_eq!(call["volume_id"], HANDLE);
        assert_eq!(call["volume_path"], publish.to_str().unwrap());
        assert!(
            call["staging_target_path"]
                .as_str()
                .unwrap()
                .ends_with("/globalmount"),
            "{call}"
        );

        driver.set_faults(
            json!([{"method": "NodeGetVolumeStats", "code": "Unavailable", "message": "down"}]),
        );
        let v = checked(&daemon, CSI_VOLUME);
        assert_eq!(
            v["health"]["abnormal"], true,
            "a failed call is no recovery: {v:#}"
        );
        assert_eq!(v["health"]["message"], "disk on fire");
        let errors = series(&daemon.metrics(), "volumed_health_check_errors_total");
        assert!(
            errors
                .iter()
                .any(|(k, n)| k.contains(r#"source="csi""#) && *n >= 1.0),
            "{errors:?}"
        );
        assert!(events_of(&daemon, "VolumeConditionNormal", POD).is_empty());

        driver.clear_faults();
        let v = checked(&daemon, CSI_VOLUME);
        assert_eq!(v["health"]["abnormal"], false, "{v:#}");
        assert_eq!(v["health"]["reason"], "VolumeConditionNormal");
        assert_eq!(
            claim_metric(&daemon, "kubelet_volume_stats_health_status_abnormal"),
            Some(0.0)
        );
        assert_eq!(events_of(&daemon, "VolumeConditionNormal", POD).len(), 1);
        daemon.kill();
    });
}

#[test]
fn a_driver_without_volume_condition_reports_usage_only() {
    real("runs the test CSI driver without VOLUME_CONDITION", || {
        let (_env, driver, daemon) =
            csi_pod_running("volumed-health-csi-usage-", Some("GET_VOLUME_STATS"));
        driver.set_faults(json!([{"method": "NodeGetVolumeStats", "abnormal": "ignored"}]));
        let v = checked(&daemon, CSI_VOLUME);
        assert_eq!(v["health"], Value::Null, "{v:#}");
        assert!(v["usage"]["capacity_bytes"].as_u64().unwrap() > 0, "{v:#}");
        assert!(claim_metric(&daemon, "kubelet_volume_stats_capacity_bytes").unwrap() > 0.0);
        assert_eq!(
            claim_metric(&daemon, "kubelet_volume_stats_health_status_abnormal"),
            None
        );
        assert!(driver.count("NodeGetVolumeStats") >= 1);
        assert!(events(&daemon).is_empty());
        daemon.kill();
    });
}
