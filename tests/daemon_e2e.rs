//! The daemon end to end: the real `volumed run` binary on a throwaway root,
//! real mounts (tmpfs emptyDir, ext4 local PV on a loop device, binds), real
//! static pod and object folders, driven only through its contracts (the
//! manifest folders, `/proc/self/mountinfo`, `/debug/state`, `/metrics`,
//! `dump`, SIGTERM). What the daemon issue's "What it must show" lists:
//!
//! 1. every volume of two pods sharing a local PV is mounted exactly once
//!    (one device mount, one bind per pod, one tmpfs per pod);
//! 2. deleting a manifest unmounts and removes that pod's volumes and leaves
//!    the other pod's alone; the device mount goes with the last pod;
//! 3. a file on the PV survives its pods being deleted and re-added;
//! 4. a graceful restart re-issues no plugin operation for volumes that
//!    stayed mounted;
//! 5. malformed and hostile manifests next to good ones: the good ones
//!    mount, the bad files are logged by name, nothing lands outside the root;
//! 6. `dump --format json` while the daemon runs agrees with `/debug/state`.
//!
//! Each test runs as root in its own private mount namespace
//! (`support::in_private_mount_ns`: the daemon makes its root a shared
//! mount), with its own scratch dir, loop device and port, so they run in
//! parallel. Every wait is bounded and fails with the daemon's stderr tail.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::daemon::{
    BIN, BOOT, Daemon, Env, NODE, WAIT, all_mounted, delete_all_and_wait, pod_gone_from_state,
    real, series, targets, tree,
};
use support::{LoopDevice, Scratch};
use volumed::host::mountinfo::MountTable;
use volumed::model::DevId;

/// The local PV every test uses, and its claim.
const PV: &str = "pv-e2e";
const PVC: &str = "data-e2e";
const PV_VOLUME: &str = "kubernetes.io/local-volume/pv-e2e";
const POD_A: &str = "e2e-pod-a";
const POD_B: &str = "e2e-pod-b";
const EMPTY_DIR: &str = "kubernetes.io~empty-dir";
const LOCAL: &str = "kubernetes.io~local-volume";

/// The local PV's place in an [`Env`].
trait LocalPv {
    /// Writes the PV on `device` and its bound claim.
    fn write_pv(&self, device: &Path);
    /// The PV's device target.
    fn device_target(&self) -> PathBuf;
}

impl LocalPv for Env {
    fn write_pv(&self, device: &Path) {
        fs::write(self.objects.join("pv.yaml"), pv_objects(device)).unwrap();
    }

    fn device_target(&self) -> PathBuf {
        self.root
            .join("plugins/kubernetes.io/local-volume/mounts")
            .join(PV)
    }
}

// ---------------------------------------------------------------- manifests

/// The PV on `device` (ext4, RWO, claimRef to the claim) and the claim bound to it.
fn pv_objects(device: &Path) -> String {
    format!(
        "apiVersion: v1
kind: PersistentVolume
metadata:
  name: {PV}
spec:
  capacity: {{storage: 64Mi}}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: local
  claimRef: {{namespace: default, name: {PVC}}}
  local:
    path: {device}
    fsType: ext4
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - {{key: kubernetes.io/hostname, operator: Exists}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {PVC}
  namespace: default
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: local
  volumeName: {PV}
  resources:
    requests: {{storage: 64Mi}}
",
        device = device.display()
    )
}

/// A pod with a tmpfs emptyDir `cache`, a disk emptyDir `scratch` and the
/// claim as `data`.
fn full_pod(uid: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {uid}
  namespace: default
  uid: {uid}
spec:
  containers:
  - name: app
    image: busybox
    volumeMounts:
    - {{name: cache, mountPath: /cache}}
    - {{name: scratch, mountPath: /scratch}}
    - {{name: data, mountPath: /data}}
  volumes:
  - name: cache
    emptyDir: {{medium: Memory, sizeLimit: 16Mi}}
  - name: scratch
    emptyDir: {{}}
  - name: data
    persistentVolumeClaim: {{claimName: {PVC}}}
"
    )
}

/// A pod with only the claim.
fn pv_pod(uid: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {uid}, namespace: default, uid: {uid}}}
spec:
  containers: [{{name: app, image: busybox}}]
  volumes:
  - name: data
    persistentVolumeClaim: {{claimName: {PVC}}}
"
    )
}

// ---------------------------------------------------------------- checks

/// The first line of the daemon's log holding `needle` (empty if none).
fn log_line(daemon: &support::daemon::Daemon, needle: &str) -> String {
    daemon
        .log()
        .lines()
        .find(|l| l.contains(needle))
        .map(str::to_owned)
        .unwrap_or_default()
}

fn dev_of(device: &Path) -> DevId {
    let rdev = fs::metadata(device).unwrap().rdev();
    DevId {
        major: libc::major(rdev),
        minor: libc::minor(rdev),
    }
}

/// The targets of `pods` (all of [`full_pod`]'s volumes when `full`) plus
/// the PV's device target.
fn expected_targets(env: &Env, pods: &[&str], full: bool) -> Vec<PathBuf> {
    let mut out = vec![env.device_target()];
    for uid in pods {
        out.push(env.pod_volume(uid, LOCAL, PV));
        if full {
            out.push(env.pod_volume(uid, EMPTY_DIR, "cache"));
            out.push(env.pod_volume(uid, EMPTY_DIR, "scratch"));
        }
    }
    out
}

/// The mount table below the root is exactly: one ext4 mount of `dev` at
/// the device target, one bind of it per pod in `pods`, one tmpfs per pod
/// when `full` (its disk emptyDir a plain directory), nothing twice, and
/// nothing else.
#[track_caller]
fn assert_mount_table(env: &Env, pods: &[&str], full: bool, dev: DevId) {
    let below = env.mounts_below_root();
    let dump = || {
        below
            .iter()
            .map(|m| {
                format!(
                    "{} {} {} {}",
                    m.dev,
                    m.fs_type,
                    m.root.display(),
                    m.mount_point.display()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let mut seen = BTreeSet::new();
    for m in &below {
        assert!(
            seen.insert(m.mount_point.clone()),
            "{} is mounted more than once:\n{}",
            m.mount_point.display(),
            dump()
        );
    }
    let at = |p: &Path| {
        below
            .iter()
            .filter(|m| m.mount_point == p)
            .collect::<Vec<_>>()
    };
    let device = at(&env.device_target());
    assert!(
        device.len() == 1 && device[0].fs_type == "ext4" && device[0].dev == dev,
        "one ext4 mount of {dev} at the device target:\n{}",
        dump()
    );
    let mut expected = 1;
    for uid in pods {
        let bind = at(&env.pod_volume(uid, LOCAL, PV));
        assert!(
            bind.len() == 1 && bind[0].dev == dev && bind[0].root == Path::new("/"),
            "one bind of {dev} (root /) for pod {uid}:\n{}",
            dump()
        );
        expected += 1;
        if full {
            let cache = at(&env.pod_volume(uid, EMPTY_DIR, "cache"));
            assert!(
                cache.len() == 1 && cache[0].fs_type == "tmpfs",
                "one tmpfs for pod {uid}'s cache:\n{}",
                dump()
            );
            expected += 1;
            let scratch = env.pod_volume(uid, EMPTY_DIR, "scratch");
            assert!(
                scratch.is_dir() && at(&scratch).is_empty(),
                "pod {uid}'s scratch is a plain directory:\n{}",
                dump()
            );
        }
    }
    assert_eq!(below.len(), expected, "mounts below the root:\n{}", dump());
    let table = MountTable::read_self().unwrap();
    assert_eq!(
        table.by_dev(dev).count(),
        1 + pods.len(),
        "the loop device is mounted nowhere else:\n{}",
        dump()
    );
}

/// A loop device holding a fresh ext4.
fn ext4_loop(env: &Env) -> LoopDevice {
    let image = env.scratch.path().join("disk.img");
    support::mkfs_ext4(&image, 64);
    LoopDevice::attach(&image)
}

// ---------------------------------------------------------------- tests

#[test]
fn every_volume_is_mounted_exactly_once() {
    real(
        "mounts tmpfs, ext4 on loop and binds through the daemon",
        || {
            let mut env = Env::new("volumed-e2e-once");
            let disk = ext4_loop(&env);
            let dev = dev_of(disk.path());
            env.write_pv(disk.path());
            env.write_pod("a.yaml", &full_pod(POD_A));
            env.write_pod("b.yaml", &full_pod(POD_B));
            let daemon = env.start();
            let want = expected_targets(&env, &[POD_A, POD_B], true);
            daemon.wait_until("every target mounted in /debug/state", || {
                all_mounted(&daemon.state(), &want)
            });
            assert_mount_table(&env, &[POD_A, POD_B], true, dev);
            let state = daemon.state();
            let t = targets(&state);
            assert_eq!(t[&env.device_target()].0, PV_VOLUME, "{state:#}");
            assert!(t.values().all(|(_, s)| s == "mounted"), "{state:#}");
            let dev_entry = state["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["volume"] == PV_VOLUME)
                .unwrap();
            assert_eq!(
                dev_entry["device"]["device_path"],
                disk.path().to_str().unwrap(),
                "{state:#}"
            );
            assert_eq!(dev_entry["pods"].as_array().unwrap().len(), 2, "{state:#}");

            delete_all_and_wait(&env, &daemon);
            daemon.stop();
        },
    );
}

#[test]
fn deleting_a_manifest_unmounts_and_cleans_up_only_that_pod() {
    real("mounts and unmounts through the daemon", || {
        let mut env = Env::new("volumed-e2e-delete");
        let disk = ext4_loop(&env);
        let dev = dev_of(disk.path());
        env.write_pv(disk.path());
        env.write_pod("a.yaml", &full_pod(POD_A));
        env.write_pod("b.yaml", &full_pod(POD_B));
        let daemon = env.start();
        let want = expected_targets(&env, &[POD_A, POD_B], true);
        daemon.wait_until("every target mounted in /debug/state", || {
            all_mounted(&daemon.state(), &want)
        });
        assert_mount_table(&env, &[POD_A, POD_B], true, dev);
        let b_volumes = [(EMPTY_DIR, "cache"), (EMPTY_DIR, "scratch"), (LOCAL, PV)];
        for (plugin, name) in b_volumes {
            let f = env.pod_volume(POD_B, plugin, name).join("b.txt");
            fs::write(&f, format!("pod b in {name}")).unwrap();
        }

        env.remove_pod("a.yaml");
        let a_pod = env.root.join("pods").join(POD_A);
        let a_volumes = a_pod.join("volumes");
        daemon.wait_until("pod A's mounts gone", || {
            env.mounts_below_root()
                .iter()
                .all(|m| !m.mount_point.starts_with(&a_pod))
        });
        daemon.wait_until("pod A gone from /debug/state", || {
            pod_gone_from_state(&daemon.state(), &env.root, POD_A)
        });
        // Its volume dirs (and a disk emptyDir's `.deleting~` rename) go, and
        // the emptyDirs' `plugins/…/<vol>/ready` markers with them; empty
        // per-plugin dirs may stay (pod dirs are the kubelet's housekeeping).
        let a_plugins = a_pod.join("plugins");
        daemon.wait_until("pod A's volume dirs gone", || {
            let shallow = |d: &Path| tree(d).iter().all(|p| p.components().count() < 2);
            shallow(&a_volumes) && shallow(&a_plugins)
        });
        for (plugin, name) in b_volumes {
            assert!(
                !env.pod_volume(POD_A, plugin, name).exists(),
                "pod A's {name}"
            );
        }
        // The other pod and the device mount it uses are untouched.
        assert_mount_table(&env, &[POD_B], true, dev);
        for (plugin, name) in b_volumes {
            let f = env.pod_volume(POD_B, plugin, name).join("b.txt");
            assert_eq!(
                fs::read_to_string(&f).unwrap(),
                format!("pod b in {name}"),
                "{}",
                f.display()
            );
        }
        let want_b = expected_targets(&env, &[POD_B], true);
        assert!(all_mounted(&daemon.state(), &want_b));

        // The last pod using the PV goes: the device mount goes with it.
        env.remove_pod("b.yaml");
        daemon.wait_until("nothing mounted below the root", || {
            env.mounts_below_root().is_empty()
        });
        daemon.wait_until("every target dir gone", || want.iter().all(|p| !p.exists()));
        daemon.wait_until("no target mounted in /debug/state", || {
            targets(&daemon.state())
                .values()
                .all(|(_, s)| s == "not_mounted")
        });
        assert!(
            disk.close_and_wait_unbound(Duration::from_secs(10)),
            "the loop device is still held (mounted) after the last pod went\n{}",
            daemon.log_tail()
        );
        daemon.stop();
    });
}

#[test]
fn a_file_on_the_pv_survives_its_pods_being_deleted_and_readded() {
    real("mounts an ext4 local PV through the daemon", || {
        let mut env = Env::new("volumed-e2e-survive");
        let disk = ext4_loop(&env);
        let dev = dev_of(disk.path());
        env.write_pv(disk.path());
        env.write_pod("a.yaml", &pv_pod(POD_A));
        env.write_pod("b.yaml", &pv_pod(POD_B));
        let daemon = env.start();
        let want = expected_targets(&env, &[POD_A, POD_B], false);
        daemon.wait_until("both pods' PV mounted", || {
            all_mounted(&daemon.state(), &want)
        });
        assert_mount_table(&env, &[POD_A, POD_B], false, dev);
        let text = format!("written through pod A at {:?}", Instant::now());
        fs::write(env.pod_volume(POD_A, LOCAL, PV).join("kept.txt"), &text).unwrap();
        assert_eq!(
            fs::read_to_string(env.pod_volume(POD_B, LOCAL, PV).join("kept.txt")).unwrap(),
            text,
            "both binds show the one filesystem"
        );

        delete_all_and_wait(&env, &daemon);
        daemon.wait_until("the device target dir gone", || {
            !env.device_target().exists()
        });
        assert!(disk.is_bound());

        env.write_pod("a.yaml", &pv_pod(POD_A));
        env.write_pod("b.yaml", &pv_pod(POD_B));
        daemon.wait_until("both pods' PV mounted again", || {
            all_mounted(&daemon.state(), &want)
        });
        assert_mount_table(&env, &[POD_A, POD_B], false, dev);
        for uid in [POD_A, POD_B] {
            let f = env.pod_volume(uid, LOCAL, PV).join("kept.txt");
            assert_eq!(
                fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display())),
                text,
                "the file survived (pod {uid})"
            );
        }
        delete_all_and_wait(&env, &daemon);
        daemon.stop();
    });
}

#[test]
fn a_graceful_restart_reissues_no_plugin_operation() {
    real("restarts the daemon over real mounts", || {
        let mut env = Env::new("volumed-e2e-restart");
        let disk = ext4_loop(&env);
        let dev = dev_of(disk.path());
        env.write_pv(disk.path());
        env.write_pod("a.yaml", &full_pod(POD_A));
        env.write_pod("b.yaml", &full_pod(POD_B));
        let want = expected_targets(&env, &[POD_A, POD_B], true);
        let daemon = env.start();
        daemon.wait_until("every target mounted in /debug/state", || {
            all_mounted(&daemon.state(), &want)
        });
        let first = daemon.metrics();
        let ops = series(&first, "volumed_plugin_operations_total");
        assert!(
            ops.iter().map(|(_, v)| v).sum::<f64>() >= 7.0,
            "the first start mounted (1 device, 6 pod targets): {ops:?}"
        );
        for uid in [POD_A, POD_B] {
            for name in ["cache", "scratch"] {
                let f = env.pod_volume(uid, EMPTY_DIR, name).join("kept.txt");
                fs::write(&f, format!("{uid} {name}")).unwrap();
            }
        }
        let table_of = |env: &Env| {
            env.mounts_below_root()
                .iter()
                .map(|m| (m.mount_point.clone(), m.dev, m.fs_type.clone()))
                .collect::<Vec<_>>()
        };
        let before = table_of(&env);
        // what the manifests and the objects file parsed to is kept once
        // they settled (100 ms after they were written)
        let cache = env.journal.join("static-pods.cache");
        daemon.wait_until("the parsed-manifest cache written", || cache.exists());
        let objects_cache = env.journal.join("static-objects.cache");
        daemon.wait_until("the objects cache written", || objects_cache.exists());
        daemon.stop();
        assert_eq!(table_of(&env), before, "stopping unmounts nothing");

        // Restarted with the root dir named through a symlink (as with
        // `/var/lib/kubelet` -> `/data/kubelet`): the daemon resolves it, so
        // its targets are the same paths the journal and the table hold.
        let link = env.scratch.path().join("root-link");
        std::os::unix::fs::symlink(&env.root, &link).unwrap();
        env.root_arg = Some(link);
        let daemon = env.start();
        daemon.wait_until(
            "every target mounted in /debug/state after the restart",
            || all_mounted(&daemon.state(), &want),
        );
        let listed = log_line(&daemon, "phase=\"sources_listed\"");
        assert!(
            listed.contains("pods=2")
                && listed.contains(" from_cache=2")
                && listed.contains("objects_from_cache=1"),
            "both manifests and the PV's file came from the caches, none was parsed: {listed:?}"
        );
        // A fresh tmpfs's identity is journaled when it is mounted, so the
        // merge agrees with the journal on the two memory emptyDirs (and the
        // two disk ones, no mounts) and records only the local PV's three
        // mounts, whose identity a fresh mount does not look up.
        let ready = log_line(&daemon, "phase=\"asw_ready\"");
        assert!(ready.contains("targets=7 recorded=3"), "{ready:?}");
        // Give the reconciler many passes (sources polled every 100 ms) to
        // do something it should not.
        std::thread::sleep(Duration::from_secs(2));
        let metrics = daemon.metrics();
        let storage = series(&metrics, "storage_operation_duration_seconds_count");
        assert!(
            storage.iter().all(|(_, v)| *v == 0.0),
            "no storage operation after the restart: {storage:#?}\n{}",
            daemon.log_tail()
        );
        let ops = series(&metrics, "volumed_plugin_operations_total");
        assert!(
            !ops.is_empty(),
            "volumed_plugin_operations_total is exported"
        );
        assert!(
            ops.iter().all(|(_, v)| *v == 0.0),
            "no plugin operation after the restart: {ops:#?}\n{}",
            daemon.log_tail()
        );
        let state = daemon.state();
        assert!(all_mounted(&state, &want), "{state:#}");
        assert!(
            targets(&state).values().all(|(_, s)| s == "mounted"),
            "{state:#}"
        );
        assert_mount_table(&env, &[POD_A, POD_B], true, dev);
        assert_eq!(table_of(&env), before, "the same mounts, none added");
        for uid in [POD_A, POD_B] {
            for name in ["cache", "scratch"] {
                let f = env.pod_volume(uid, EMPTY_DIR, name).join("kept.txt");
                assert_eq!(fs::read_to_string(&f).unwrap(), format!("{uid} {name}"));
            }
        }
        delete_all_and_wait(&env, &daemon);
        daemon.stop();
    });
}

/// A static pod without `metadata.uid` gets a UID hashed from its
/// manifest's path: the same pods whether the daemon is given its dirs as
/// absolute or relative paths. Started once with absolute paths and once,
/// from the scratch dir, with relative ones: the pod keeps its UID, its
/// disk emptyDir and the file in it.
#[test]
fn relative_source_paths_give_a_pod_the_same_uid() {
    real("restarts the daemon with relative paths", || {
        let mut env = Env::new("volumed-e2e-relative");
        env.write_pod(
            "nouid.yaml",
            "apiVersion: v1
kind: Pod
metadata: {name: nouid, namespace: default}
spec:
  containers:
  - name: app
    image: busybox
    volumeMounts: [{name: scratch, mountPath: /scratch}]
  volumes:
  - name: scratch
    emptyDir: {}
",
        );
        let pods = env.root.join("pods");
        let uids = |d: &Daemon| -> Vec<String> {
            let mut found: Vec<String> = targets(&d.state())
                .keys()
                .filter_map(|t| t.strip_prefix(&pods).ok()?.iter().next())
                .map(|u| u.to_string_lossy().into_owned())
                .collect();
            found.dedup();
            found
        };
        let daemon = env.start();
        daemon.wait_until("the pod's emptyDir is set up", || uids(&daemon).len() == 1);
        let uid = uids(&daemon).remove(0);
        let kept = env.pod_volume(&uid, EMPTY_DIR, "scratch").join("kept.txt");
        fs::write(&kept, "kept").unwrap();
        daemon.stop();

        env.relative = true;
        let daemon = env.start();
        daemon.wait_until("the pod is known again", || !uids(&daemon).is_empty());
        // many passes and an orphan sweep (every 2 s) to do what it should not
        std::thread::sleep(Duration::from_secs(3));
        assert_eq!(
            uids(&daemon),
            std::slice::from_ref(&uid),
            "{}",
            daemon.log_tail()
        );
        assert_eq!(fs::read_to_string(&kept).unwrap(), "kept");
        let dirs: Vec<_> = fs::read_dir(&pods)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(dirs, [std::ffi::OsString::from(&uid)]);
        daemon.stop();
    });
}

/// A tmpfs emptyDir unmounted by someone else while volumed was down (same
/// boot) is reported at the next start — a warning naming it, the metric,
/// and a finding in `/debug/state` — and mounted again, as its pod still
/// wants it.
#[test]
fn a_target_unmounted_outside_is_reported_and_mounted_again() {
    real("unmounts a target behind the daemon's back", || {
        let mut env = Env::new("volumed-e2e-outside");
        env.write_pod(
            "a.yaml",
            &format!(
                "apiVersion: v1
kind: Pod
metadata: {{name: {POD_A}, namespace: default, uid: {POD_A}}}
spec:
  containers: [{{name: app, image: busybox}}]
  volumes:
  - name: cache
    emptyDir: {{medium: Memory}}
"
            ),
        );
        let target = env.pod_volume(POD_A, EMPTY_DIR, "cache");
        let mounted = |d: &Daemon| all_mounted(&d.state(), std::slice::from_ref(&target));
        let daemon = env.start();
        daemon.wait_until("the tmpfs is mounted", || mounted(&daemon));
        daemon.stop();
        support::umount(&target);
        assert!(!MountTable::read_self().unwrap().is_mount_point(&target));

        let daemon = env.start();
        let state = daemon.state();
        let found = state["unmounted_outside"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(found.len(), 1, "{state:#}");
        assert_eq!(found[0]["target"], "pod");
        assert_eq!(found[0]["pod_uid"], POD_A);
        assert_eq!(found[0]["path"], target.to_str().unwrap());
        let outside = series(&daemon.metrics(), "volumed_unmounted_outside_total");
        assert_eq!(outside.first().map(|(_, v)| *v), Some(1.0), "{outside:?}");
        assert!(
            daemon.log().contains("unmounted outside volumed"),
            "{}",
            daemon.log_tail()
        );
        daemon.wait_until("the tmpfs is mounted again", || {
            mounted(&daemon) && MountTable::read_self().unwrap().is_mount_point(&target)
        });
        delete_all_and_wait(&env, &daemon);
        daemon.stop();
    });
}

/// A local PV that is a directory (the README's example) is bound straight
/// into its pod. After a graceful restart the journal and the host agree on
/// that bind: it is `mounted`, not uncertain, and no plugin operation runs.
#[test]
fn a_directory_pv_bind_survives_a_graceful_restart_untouched() {
    real("restarts the daemon over a directory PV bind", || {
        let mut env = Env::new("volumed-e2e-dir-pv");
        let dir = env.scratch.path().join("pv-dir");
        support::mkdirs(&dir);
        env.write_pv(&dir);
        env.write_pod("a.yaml", &pv_pod(POD_A));
        let target = env.pod_volume(POD_A, LOCAL, PV);
        let bound = |d: &Daemon| all_mounted(&d.state(), std::slice::from_ref(&target));
        let daemon = env.start();
        daemon.wait_until("the directory is bound into the pod", || bound(&daemon));
        fs::write(target.join("kept.txt"), "kept").unwrap();
        daemon.stop();

        let daemon = env.start();
        daemon.wait_until("the bind is mounted after the restart", || bound(&daemon));
        std::thread::sleep(Duration::from_secs(2));
        let metrics = daemon.metrics();
        let ops = series(&metrics, "volumed_plugin_operations_total");
        assert!(
            !ops.is_empty() && ops.iter().all(|(_, v)| *v == 0.0),
            "no plugin operation after the restart: {ops:#?}\n{}",
            daemon.log_tail()
        );
        let decided = series(&metrics, "volumed_reconstruct_decisions_total");
        assert!(
            decided
                .iter()
                .any(|(l, v)| l.contains("reason=\"mounted_matches\"") && *v >= 1.0),
            "{decided:#?}"
        );
        assert!(
            decided
                .iter()
                .all(|(l, v)| !l.contains("uncertain") || *v == 0.0),
            "nothing uncertain: {decided:#?}"
        );
        assert_eq!(fs::read_to_string(dir.join("kept.txt")).unwrap(), "kept");
        delete_all_and_wait(&env, &daemon);
        daemon.stop();
    });
}

#[test]
fn bad_manifests_are_logged_and_contained_while_good_ones_mount() {
    real("mounts good pods next to bad manifests", || {
        let mut env = Env::new("volumed-e2e-hostile");
        let disk = ext4_loop(&env);
        let dev = dev_of(disk.path());
        env.write_pv(disk.path());
        env.write_pod("a.yaml", &full_pod(POD_A));
        env.write_pod("b.yaml", &full_pod(POD_B));
        let bad = [
            (
                "broken.yaml",
                "apiVersion: v1\nkind: Pod\nmetadata: {name: broken, uid: [oops\nspec:\n  volumes: - {\n",
            ),
            (
                "hostile-volume.yaml",
                "apiVersion: v1\nkind: Pod\nmetadata: {name: hostile-volume, uid: e2e-hostile}\nspec:\n  containers: [{name: app, image: busybox}]\n  volumes:\n  - name: ../etc\n    emptyDir: {}\n",
            ),
            (
                "hostile-uid.yaml",
                "apiVersion: v1\nkind: Pod\nmetadata: {name: hostile-uid, uid: ../x}\nspec:\n  containers: [{name: app, image: busybox}]\n  volumes:\n  - name: data\n    emptyDir: {}\n",
            ),
        ];
        for (file, text) in bad {
            env.write_pod(file, text);
        }
        let outside = |env: &Env| {
            let mut t = tree(env.scratch.path());
            t.retain(|p| {
                !p.starts_with("root") && !p.starts_with("journal") && !p.starts_with("pods")
            });
            t
        };
        let before = outside(&env);
        let daemon = env.start();
        let want = expected_targets(&env, &[POD_A, POD_B], true);
        daemon.wait_until("the good pods mounted", || {
            all_mounted(&daemon.state(), &want)
        });
        assert_mount_table(&env, &[POD_A, POD_B], true, dev);
        for (file, _) in bad {
            let path = env.pods.join(file);
            let path = path.to_str().unwrap();
            daemon.wait_until(&format!("an error naming {path} in the log"), || {
                daemon
                    .log()
                    .lines()
                    .any(|l| l.contains("ERROR") && l.contains(path))
            });
        }
        // Nothing outside the root but the daemon's own log and journal.
        let mut after = outside(&env);
        after.retain(|p| !p.to_string_lossy().starts_with("daemon-"));
        assert_eq!(after, before, "created outside the root");
        assert!(!env.scratch.path().join("etc").exists());
        assert!(!env.scratch.path().join("x").exists());
        // Inside the root: only the good pods, no `etc` or `x` anywhere.
        let pods: BTreeSet<String> = fs::read_dir(env.root.join("pods"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            pods.iter()
                .all(|p| p == POD_A || p == POD_B || p == "e2e-hostile"),
            "{pods:?}"
        );
        let stray: Vec<_> = tree(&env.root)
            .into_iter()
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n == "etc" || n == "x" || n == "..")
            })
            .collect();
        assert!(stray.is_empty(), "created from a hostile name: {stray:?}");
        let state = daemon.state();
        for p in targets(&state).keys() {
            assert!(
                p.starts_with(&env.root) && !p.to_string_lossy().contains(".."),
                "{}",
                p.display()
            );
        }
        assert!(
            targets(&state)
                .keys()
                .all(|p| !p.starts_with(env.root.join("pods/e2e-hostile"))),
            "{state:#}"
        );
        delete_all_and_wait(&env, &daemon);
        daemon.stop();
    });
}

/// A `dump`/`/debug/state` state with only the journaled targets (hostPath
/// pod targets, kind `none`, are not journaled) and without the live
/// `health` (the journal has none).
fn journaled(state: &Value) -> Value {
    let mut volumes = Vec::new();
    for v in state["volumes"].as_array().unwrap() {
        let mut v = v.clone();
        v.as_object_mut().unwrap().remove("health");
        v["pods"]
            .as_array_mut()
            .unwrap()
            .retain(|p| p["kind"] != "none");
        if !v["device"].is_null() || !v["pods"].as_array().unwrap().is_empty() {
            volumes.push(v);
        }
    }
    serde_json::json!({ "volumes": volumes })
}

#[test]
fn dump_json_while_running_equals_debug_state() {
    real("runs the daemon and dump against it", || {
        let mut env = Env::new("volumed-e2e-dump");
        let disk = ext4_loop(&env);
        env.write_pv(disk.path());
        env.write_pod("a.yaml", &full_pod(POD_A));
        env.write_pod("b.yaml", &full_pod(POD_B));
        let host_dir = env.scratch.path().join("hostpath");
        env.write_pod(
            "c.json",
            &serde_json::json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "c", "uid": "e2e-pod-c"},
                "spec": {"containers": [{"name": "app", "image": "busybox"}],
                    "volumes": [{"name": "host",
                        "hostPath": {"path": host_dir, "type": "DirectoryOrCreate"}}]}
            })
            .to_string(),
        );
        let daemon = env.start();
        let want = expected_targets(&env, &[POD_A, POD_B], true);
        daemon.wait_until("every target mounted in /debug/state", || {
            all_mounted(&daemon.state(), &want)
        });
        let dump = |extra: &[&str]| {
            let out = Command::new(BIN)
                .arg("dump")
                .arg("--journal-dir")
                .arg(&env.journal)
                .arg("--boot-id-file")
                .arg(&env.boot)
                .args(extra)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "dump {extra:?}: {}\n--- daemon stderr tail ---\n{}",
                String::from_utf8_lossy(&out.stderr),
                daemon.log_tail()
            );
            String::from_utf8(out.stdout).unwrap()
        };
        let mut last = (Value::Null, Value::Null);
        daemon.wait_until("dump's state to equal /debug/state", || {
            let doc: Value = serde_json::from_str(&dump(&["--format", "json"])).unwrap();
            let live = daemon.state();
            last = (journaled(&doc["state"]), journaled(&live));
            last.0 == last.1
        });
        let (from_dump, from_state) = last;
        assert!(all_mounted(&from_dump, &want), "{from_dump:#}");
        assert_eq!(
            targets(&from_dump).len(),
            want.len(),
            "exactly the journaled targets: {from_dump:#}"
        );
        assert_eq!(from_dump, from_state);
        let doc: Value = serde_json::from_str(&dump(&["--format", "json"])).unwrap();
        assert_eq!(doc["boot_id"], BOOT);
        let records = doc["records"].as_array().unwrap();
        assert!(
            records.iter().any(|r| r["type"] == "intent")
                && records.iter().any(|r| r["type"] == "outcome"),
            "{doc:#}"
        );
        let table = dump(&[]);
        assert!(table.contains(PV_VOLUME), "{table}");
        let one = dump(&["--format", "json", "--volume", PV_VOLUME]);
        let one: Value = serde_json::from_str(&one).unwrap();
        assert_eq!(
            one["state"]["volumes"].as_array().unwrap().len(),
            1,
            "{one:#}"
        );
        delete_all_and_wait(&env, &daemon);
        daemon.stop();
    });
}

/// The one-time forced cleanup of failed reconstructions (KEP-3756, last
/// startup step): before the daemon starts, three targets of pods no source
/// names sit mounted in the layout, none of which reconstruction can
/// rebuild, and none of a volume type volumed has a plugin for:
/// - a CSI pod target without its `vol_data.json`: a bind of a dir outside
///   the root holding a file;
/// - a CSI pod target like it with a foreign mount nested inside;
/// - a volume of a plugin volumed lacks (nfs), here a tmpfs.
///
/// Each is counted once by `force_cleaned_failed_volume_operations_total`
/// and once by `…_errors_total` (the kubelet's count for "no plugin"), and
/// left exactly as it is (docs/layout.md: volumed never force-cleans plugin
/// dirs of volume types it has no plugin for, and without `vol_data.json`
/// there is no handle to call NodeUnpublish with): still mounted, files intact, nothing journaled, the
/// pod dirs kept by orphan cleanup. A restart counts them once more.
#[test]
fn failed_reconstructions_without_a_plugin_are_left_and_reported() {
    real("mounts targets reconstruction cannot rebuild", || {
        let mut env = Env::new("volumed-e2e-forced");
        const CSI: &str = "kubernetes.io~csi";
        // A node a kubelet ran: the root is already a mount point, so the
        // daemon does not bind it onto itself over the mounts below it.
        support::mkdirs(&env.root);
        support::bind_mount(&env.root, &env.root);
        let outside = env.scratch.path().join("outside");
        support::mkdirs(&outside);
        fs::write(outside.join("data.txt"), "kept").unwrap();

        let gone = env.pod_volume("gone-csi", CSI, "pv-gone").join("mount");
        support::mkdirs(&gone);
        support::bind_mount(&outside, &gone);

        let nested = env
            .pod_volume("gone-nested", CSI, "pv-nested")
            .join("mount");
        let nested_src = env.scratch.path().join("nested-src");
        support::mkdirs(&nested_src);
        support::mkdirs(&nested_src.join("inner"));
        fs::write(nested_src.join("file.txt"), "nested").unwrap();
        support::mkdirs(&nested);
        support::bind_mount(&nested_src, &nested);
        support::mount_tmpfs(&nested.join("inner"), "size=1m");
        fs::write(nested.join("inner/in-tmpfs.txt"), "inner").unwrap();

        let secret = env.pod_volume("gone-secret", "kubernetes.io~nfs", "token");
        support::mkdirs(&secret);
        support::mount_tmpfs(&secret, "size=1m");
        fs::write(secret.join("token"), "s3cr3t").unwrap();

        let counted = |d: &Daemon| {
            let m = d.metrics();
            let one = |name: &str| series(&m, name).first().map_or(-1.0, |(_, v)| *v);
            (
                one("force_cleaned_failed_volume_operations_total"),
                one("force_cleaned_failed_volume_operation_errors_total"),
            )
        };
        let pods_dir = env.root.join("pods");
        let all_left = |d: &Daemon| {
            let table = MountTable::read_self().unwrap();
            for t in [&gone, &nested, &nested.join("inner"), &secret] {
                assert!(table.is_mount_point(t), "{} left mounted", t.display());
            }
            assert_eq!(fs::read_to_string(gone.join("data.txt")).unwrap(), "kept");
            assert_eq!(
                fs::read_to_string(nested.join("inner/in-tmpfs.txt")).unwrap(),
                "inner"
            );
            assert_eq!(
                fs::read_to_string(nested.join("file.txt")).unwrap(),
                "nested"
            );
            assert_eq!(fs::read_to_string(secret.join("token")).unwrap(), "s3cr3t");
            for pod in ["gone-csi", "gone-nested", "gone-secret"] {
                assert!(pods_dir.join(pod).exists(), "{pod} kept");
            }
            let log = d.log();
            assert_eq!(
                log.matches("no plugin for this volume type").count(),
                3,
                "{}",
                d.log_tail()
            );
            assert!(!log.contains("forced cleanup: unmounting"), "{log}");
        };

        let daemon = env.start();
        daemon.wait_until("three forced cleanups counted, all three errors", || {
            counted(&daemon) == (3.0, 3.0)
        });
        // orphan cleanup has examined the three gone pods' dirs and left
        // them (each holds a mount point): they must still be there
        daemon.wait_until("an orphan sweep examined the gone pods", || {
            daemon.log().contains("orphaned pod dirs swept")
        });
        all_left(&daemon);
        let journal: Value = serde_json::from_str(&daemon.get("/debug/journal")).unwrap();
        assert!(
            !journal.to_string().contains("pv-gone"),
            "nothing journaled for a target volumed cannot tear down: {journal:#}"
        );
        daemon.stop();

        // One shot per start: the next start finds and counts all three again.
        let daemon = env.start();
        daemon.wait_until("the restart counts them again", || {
            counted(&daemon) == (3.0, 3.0)
        });
        all_left(&daemon);
        daemon.stop();
    });
}

/// A pod with the claim as `data`, mounted by a container whose pod asks
/// for the SELinux level `level`.
fn labelled_pv_pod(uid: &str, level: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {uid}, namespace: default, uid: {uid}}}
spec:
  securityContext:
    seLinuxOptions: {{level: '{level}'}}
  containers:
  - name: app
    image: busybox
    volumeMounts: [{{name: data, mountPath: /data}}]
  volumes:
  - name: data
    persistentVolumeClaim: {{claimName: {PVC}}}
"
    )
}

/// Whether this host does SELinux (then the next test does not apply: the
/// QEMU test in `tests/selinux_vm.rs` covers that side).
fn host_has_selinux() -> bool {
    let table = MountTable::read_self().unwrap();
    table
        .top_at(Path::new("/sys/fs/selinux"))
        .is_some_and(|m| m.fs_type == "selinuxfs")
        && Path::new("/etc/selinux/config").exists()
}

/// On a host without SELinux no `context=` reaches the
/// kernel (a raw `mount(2)` would fail with EINVAL): two pods whose labels
/// differ and would conflict on an SELinux host both get the PV, mounted
/// without a context, and no SELinux metric moves.
#[test]
fn no_selinux_context_reaches_the_kernel_on_a_host_without_selinux() {
    if host_has_selinux() {
        eprintln!("skipped: this host does SELinux; tests/selinux_vm.rs covers it");
        return;
    }
    real("mounts an ext4 local PV for two labelled pods", || {
        let mut env = Env::new("volumed-e2e-nosel");
        let disk = ext4_loop(&env);
        env.write_pv(disk.path());
        env.write_pod("a.yaml", &labelled_pv_pod(POD_A, "s0:c10,c20"));
        env.write_pod("b.yaml", &labelled_pv_pod(POD_B, "s0:c30,c40"));
        let daemon = env.start();
        let want = vec![
            env.device_target(),
            env.pod_volume(POD_A, LOCAL, PV),
            env.pod_volume(POD_B, LOCAL, PV),
        ];
        daemon.wait_until("both pods' PV targets mounted", || {
            all_mounted(&daemon.state(), &want)
        });
        let mounts = env.mounts_below_root();
        assert_eq!(mounts.len(), 3, "{mounts:#?}");
        for m in &mounts {
            let opts = m.super_options_raw.to_string_lossy().into_owned();
            assert!(
                !opts.contains("context="),
                "{}: {opts}",
                m.mount_point.display()
            );
        }
        let state = daemon.state();
        let vol = state["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["volume"] == PV_VOLUME)
            .unwrap();
        assert_eq!(vol["device"]["selinux_context"], "", "{state:#}");
        for p in vol["pods"].as_array().unwrap() {
            assert_eq!(p["selinux_context"], "", "{state:#}");
        }
        assert!(state.get("pod_errors").is_none(), "{state:#}");
        let metrics = daemon.metrics();
        assert!(
            !metrics.contains("volume_manager_selinux_volumes_admitted_total{")
                && !metrics.contains("volume_manager_selinux_volume_context_mismatch"),
            "{metrics}"
        );
        assert!(
            daemon.log().contains("SELinux mount labels off"),
            "{}",
            daemon.log_tail()
        );
        delete_all_and_wait(&env, &daemon);
        daemon.stop();
    });
}

/// `--selinux enabled` where the host cannot, and a bad `--feature-gates`,
/// stop the daemon at startup with a message naming the cause.
#[test]
fn impossible_selinux_settings_are_startup_errors() {
    let scratch = Scratch::new("volumed-e2e-selflags");
    let root = scratch.path().join("root");
    let run = |extra: &[&str]| {
        let out = Command::new(BIN)
            .arg("run")
            .arg("--root-dir")
            .arg(&root)
            .args(["--listen", "127.0.0.1:0", "--node-name", NODE])
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (status, err) = run(&["--feature-gates", "SELinuxMount=maybe"]);
    assert!(!status.success(), "{err}");
    assert!(err.contains("SELinuxMount=\"maybe\""), "{err}");
    let (status, err) = run(&["--feature-gates", "NoSuchGate=true"]);
    assert!(!status.success() && err.contains("\"NoSuchGate\""), "{err}");
    if host_has_selinux() {
        eprintln!("skipped the --selinux enabled half: this host does SELinux");
        return;
    }
    let (status, err) = run(&["--selinux", "enabled"]);
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("--selinux enabled: this host does not support SELinux mounts"),
        "{err}"
    );
    assert!(!root.exists(), "nothing was set up before the error");
}

/// A pod with only a tmpfs emptyDir `cache`.
fn memory_pod(uid: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {uid}, namespace: default, uid: {uid}}}
spec:
  containers:
  - name: app
    image: busybox
    volumeMounts: [{{name: cache, mountPath: /cache}}]
  volumes:
  - name: cache
    emptyDir: {{medium: Memory}}
"
    )
}

/// A node a kubelet ran, whose root is not a mount point and sits on a
/// private mount, with a volume still mounted beneath it: binding the root
/// onto itself would hide the volume or (recursively) duplicate it, the
/// original then out of reach of any unmount. The daemon refuses to start,
/// naming the mount and the fix, and leaves it exactly as it was.
#[test]
fn a_root_on_a_private_mount_with_mounts_beneath_refuses_to_start_and_leaves_them() {
    real(
        "mounts a tmpfs below a root that is not a mount point",
        || {
            let mut env = Env::new("volumed-e2e-root-private-");
            let cache = env.pod_volume(POD_A, EMPTY_DIR, "cache");
            support::mkdirs(&cache);
            support::mount_tmpfs(&cache, "size=1m");
            fs::write(cache.join("data"), b"pod A").unwrap();
            let daemon = env.spawn();
            let daemon_json = env.journal.join("daemon.json");
            let pid = daemon.child.borrow().id();
            // until it exits, or has started (it then bound the root already)
            let deadline = Instant::now() + WAIT;
            let status = loop {
                let exited = daemon.child.borrow_mut().try_wait().unwrap();
                if exited.is_some()
                    || daemon.wrote_json(&daemon_json, pid)
                    || Instant::now() >= deadline
                {
                    break exited;
                }
                std::thread::sleep(Duration::from_millis(50));
            };
            let table = MountTable::read_self().unwrap();
            let (at_cache, at_root) = (table.at(&cache).count(), table.at(&env.root).count());
            let Some(status) = status else {
                panic!(
                    "the daemon started instead of refusing: {at_cache} mount(s) at {}, {at_root} at the root\n--- daemon stderr tail ---\n{}",
                    cache.display(),
                    daemon.log_tail()
                );
            };
            daemon.exited.set(true);
            assert!(!status.success(), "{status}\n{}", daemon.log_tail());
            let log = daemon.log();
            assert!(
                log.contains(cache.to_str().unwrap()),
                "names the mount:\n{log}"
            );
            assert!(
                log.contains("mount --make-rshared"),
                "names the fix:\n{log}"
            );
            assert_eq!(at_cache, 1, "neither duplicated nor unmounted");
            assert_eq!(at_root, 0, "nothing bound over it");
            assert_eq!(
                fs::read(cache.join("data")).unwrap(),
                b"pod A",
                "not hidden"
            );
        },
    );
}

/// The same node with the root's holding mount shared (as systemd makes
/// `/`): the kubelet's rule, nothing to bind. The daemon starts, keeps the
/// pod's tmpfs, and the mount table shows it once and the root unbound.
#[test]
fn a_root_on_a_shared_mount_is_used_as_it_is_and_mounts_beneath_stay_single() {
    real("mounts a shared tmpfs holding the root", || {
        let mut env = Env::new("volumed-e2e-root-shared-");
        let host = env.scratch.path().join("host");
        support::mkdirs(&host);
        support::mount_tmpfs(&host, "");
        nix::mount::mount(
            None::<&str>,
            &host,
            None::<&str>,
            nix::mount::MsFlags::MS_SHARED,
            None::<&str>,
        )
        .unwrap();
        env.root = host.join("root");
        let cache = env.pod_volume(POD_A, EMPTY_DIR, "cache");
        support::mkdirs(&cache);
        support::mount_tmpfs(&cache, "");
        fs::write(cache.join("data"), b"pod A").unwrap();
        env.write_pod("a.yaml", &memory_pod(POD_A));
        let daemon = env.start();
        daemon.wait_until("the pod's tmpfs is mounted in /debug/state", || {
            targets(&daemon.state())
                .get(&cache)
                .is_some_and(|(_, s)| s == "mounted")
        });
        let table = MountTable::read_self().unwrap();
        assert_eq!(table.at(&cache).count(), 1, "not duplicated");
        assert_eq!(table.at(&env.root).count(), 0, "nothing bound over it");
        assert_eq!(
            fs::read(cache.join("data")).unwrap(),
            b"pod A",
            "the same tmpfs"
        );
        daemon.stop();
    });
}

/// The `size=` (in kB, as the kernel shows it) of the tmpfs at `path`.
fn tmpfs_size_k(env: &Env, path: &Path) -> Option<String> {
    env.mounts_below_root()
        .into_iter()
        .find(|m| m.mount_point == path && m.fs_type == "tmpfs")
        .and_then(|m| {
            let opts = m.super_options_raw.to_string_lossy().into_owned();
            opts.split(',')
                .find_map(|o| o.strip_prefix("size=").map(str::to_owned))
        })
}

/// A memory emptyDir is sized as the kubelet sizes it: the pod's memory
/// limit when every container sets one, capped by `sizeLimit`, else the
/// node's allocatable memory (here `--node-allocatable-memory`).
#[test]
fn a_memory_emptydir_is_sized_by_the_pod_s_limit_or_the_node_s_memory() {
    real("mounts tmpfs through the daemon", || {
        let mut env = Env::new("volumed-e2e-tmpfs-size");
        env.extra_args = vec!["--node-allocatable-memory".into(), "48Mi".into()];
        let limited = format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: {POD_A}, namespace: default, uid: {POD_A}}}
spec:
  initContainers:
  - {{name: init, image: busybox, resources: {{limits: {{memory: 4Mi}}}}}}
  containers:
  - {{name: a, image: busybox, resources: {{limits: {{memory: 12Mi}}}}}}
  - {{name: b, image: busybox, resources: {{limits: {{memory: 4Mi}}}}}}
  volumes:
  - {{name: cache, emptyDir: {{medium: Memory}}}}
  - {{name: small, emptyDir: {{medium: Memory, sizeLimit: 8Mi}}}}
"
        );
        let unlimited = format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: {POD_B}, namespace: default, uid: {POD_B}}}
spec:
  containers:
  - {{name: a, image: busybox, resources: {{limits: {{memory: 12Mi}}}}}}
  - {{name: b, image: busybox}}
  volumes:
  - {{name: cache, emptyDir: {{medium: Memory, sizeLimit: 1Gi}}}}
"
        );
        env.write_pod("a.yaml", &limited);
        env.write_pod("b.yaml", &unlimited);
        let daemon = env.start();
        let dir = "kubernetes.io~empty-dir";
        let want = [
            (env.pod_volume(POD_A, dir, "cache"), "16384k"),
            (env.pod_volume(POD_A, dir, "small"), "8192k"),
            (env.pod_volume(POD_B, dir, "cache"), "49152k"),
        ];
        let paths: Vec<PathBuf> = want.iter().map(|(p, _)| p.clone()).collect();
        daemon.wait_until("the three tmpfs mounted", || {
            all_mounted(&daemon.state(), &paths)
        });
        for (path, size) in &want {
            assert_eq!(
                tmpfs_size_k(&env, path).as_deref(),
                Some(*size),
                "{}",
                path.display()
            );
        }
        delete_all_and_wait(&env, &daemon);
        daemon.stop();
    });
}

/// Whether `dump`'s journal holds a target of pod `uid`.
fn journal_has_pod(env: &Env, uid: &str) -> bool {
    let prefix = env.root.join("pods").join(uid);
    targets(&env.dump()["state"])
        .keys()
        .any(|p| p.starts_with(&prefix))
}

/// The nemesis soak's finding: a pod whose mounts went while volumed was
/// down (a reboot) and which was deleted before the restart. Reconstruction
/// decides its target not mounted and keeps it out of the ASW, so no plan
/// ever forgot it: `dump` kept it for good while `/debug/state` did not.
/// Now it is forgotten once every source has listed; the other pod's is
/// mounted again.
#[test]
fn a_pod_deleted_while_down_after_a_reboot_leaves_the_journal() {
    real(
        "mounts tmpfs emptyDirs, reboots and restarts the daemon",
        || {
            let mut env = Env::new("volumed-e2e-gone-down");
            env.write_pod("a.yaml", &memory_pod(POD_A));
            env.write_pod("b.yaml", &memory_pod(POD_B));
            let (a, b) = (
                env.pod_volume(POD_A, EMPTY_DIR, "cache"),
                env.pod_volume(POD_B, EMPTY_DIR, "cache"),
            );
            let daemon = env.start();
            daemon.wait_until("both tmpfs mounted", || {
                all_mounted(&daemon.state(), &[a.clone(), b.clone()])
            });
            daemon.kill();
            // a reboot: the mounts are gone and the boot id is new
            support::umount(&a);
            support::umount(&b);
            fs::write(&env.boot, "0e2e0e2e-1111-2222-3333-555555555555\n").unwrap();
            env.remove_pod("a.yaml");
            assert!(journal_has_pod(&env, POD_A), "{:#}", env.dump());

            let daemon = env.start();
            daemon.wait_until("b's tmpfs mounted again", || {
                all_mounted(&daemon.state(), std::slice::from_ref(&b))
                    && MountTable::read_self().unwrap().is_mount_point(&b)
            });
            daemon.wait_until_showing(
                "the deleted pod's target leaves the journal",
                || !journal_has_pod(&env, POD_A),
                || format!("{:#}", env.dump()),
            );
            assert!(
                pod_gone_from_state(&daemon.state(), &env.root, POD_A),
                "{:#}",
                daemon.state()
            );
            assert!(journal_has_pod(&env, POD_B), "{:#}", env.dump());
            delete_all_and_wait(&env, &daemon);
            daemon.stop();
        },
    );
}

/// The same for a pod target of a volume another pod keeps mounted: a
/// pod's bind of the local PV unmounted outside volumed while it was down,
/// the pod deleted meanwhile. Its target leaves the journal at once, not
/// only when the last pod lets the volume go; the other pod's bind and the
/// device mount stay, untouched.
#[test]
fn a_deleted_pod_s_target_of_a_volume_still_in_use_leaves_the_journal() {
    real(
        "mounts a local PV for two pods and restarts the daemon",
        || {
            let mut env = Env::new("volumed-e2e-gone-shared");
            let disk = ext4_loop(&env);
            env.write_pv(disk.path());
            env.write_pod("a.yaml", &pv_pod(POD_A));
            env.write_pod("b.yaml", &pv_pod(POD_B));
            let (a, b) = (
                env.pod_volume(POD_A, LOCAL, PV),
                env.pod_volume(POD_B, LOCAL, PV),
            );
            let daemon = env.start();
            daemon.wait_until("both binds mounted", || {
                all_mounted(
                    &daemon.state(),
                    &[a.clone(), b.clone(), env.device_target()],
                )
            });
            let bottom = |p: &Path| {
                MountTable::read_self()
                    .unwrap()
                    .entries()
                    .iter()
                    .find(|m| m.mount_point == p)
                    .map(|m| m.mount_id)
            };
            let kept = (bottom(&b), bottom(&env.device_target()));
            daemon.kill();
            support::umount(&a);
            env.remove_pod("a.yaml");

            let daemon = env.start();
            daemon.wait_until_showing(
                "the deleted pod's target leaves the journal",
                || !journal_has_pod(&env, POD_A),
                || format!("{:#}", env.dump()),
            );
            assert!(
                all_mounted(&env.dump()["state"], &[b.clone(), env.device_target()]),
                "{:#}",
                env.dump()
            );
            assert_eq!(
                (bottom(&b), bottom(&env.device_target())),
                kept,
                "b's bind and the device mount untouched"
            );
            delete_all_and_wait(&env, &daemon);
            daemon.stop();
            drop(disk);
        },
    );
}

/// A pod whose mount failed (final: a symlink where its tmpfs belongs is
/// refused, never mounted through) and which is then deleted: the
/// journal's not-mounted target of it goes with it, though the ASW never
/// held it.
#[test]
fn a_pod_deleted_after_its_mount_failed_leaves_the_journal() {
    real(
        "refuses a symlinked tmpfs target, then deletes the pod",
        || {
            let mut env = Env::new("volumed-e2e-failed-gone");
            let a = env.pod_volume(POD_A, EMPTY_DIR, "cache");
            let elsewhere = env.scratch.path().join("elsewhere");
            fs::create_dir_all(&elsewhere).unwrap();
            fs::create_dir_all(a.parent().unwrap()).unwrap();
            std::os::unix::fs::symlink(&elsewhere, &a).unwrap();
            env.write_pod("a.yaml", &memory_pod(POD_A));
            env.write_pod("b.yaml", &memory_pod(POD_B));
            let b = env.pod_volume(POD_B, EMPTY_DIR, "cache");
            let daemon = env.start();
            daemon.wait_until("b's tmpfs mounted", || {
                all_mounted(&daemon.state(), std::slice::from_ref(&b))
            });
            daemon.wait_until_showing(
                "a's refused mount in the journal",
                || journal_has_pod(&env, POD_A) && !daemon.pod_errors(POD_A).is_empty(),
                || format!("{:#}\n{}", env.dump(), daemon.pod_errors(POD_A)),
            );
            env.remove_pod("a.yaml");
            daemon.wait_until_showing(
                "the deleted pod's target leaves the journal",
                || !journal_has_pod(&env, POD_A),
                || format!("{:#}", env.dump()),
            );
            assert!(
                !MountTable::read_self().unwrap().is_mount_point(&elsewhere),
                "nothing mounted through the symlink"
            );
            assert!(journal_has_pod(&env, POD_B), "{:#}", env.dump());
            delete_all_and_wait(&env, &daemon);
            daemon.stop();
        },
    );
}
