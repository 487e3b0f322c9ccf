//! CSI end to end: the real `volumed run` binary with the real test CSI
//! driver (`volumed-testdriver`, a child process with real tmpfs and bind
//! mounts), each test as root in its own private mount namespace, asserting
//! exactly which RPCs the driver received (its call log), what the mount
//! table shows, and what `/debug/state` and `/metrics` say:
//!
//! 1. a PVC-bound CSI PV: one NodeStage, one NodePublish, the kubelet's
//!    paths and `vol_data.json`, the data path, the metrics;
//! 2. two pods on one RWX volume: one stage, two publishes, and the
//!    unpublish / unstage order as the pods go;
//! 3. restarts: graceful and SIGKILL with the journal re-issue no RPC;
//!    `--journal off` (the kubelet's way) re-issues them, and with a driver
//!    that stacks mounts on a second NodePublish only that restart stacks;
//! 4. discovery through `<root>/plugins_registry/`, and a restarted driver
//!    registering again while the daemon runs;
//! 5. a driver that starts after the daemon;
//! 6. injected RPC faults: one retryable, one permanent;
//! 7. Secrets and podInfoOnMount: what NodeStage and NodePublish get, and
//!    no Secret value in the daemon's log, journal or `dump`;
//! 8. an inline ephemeral volume: published, never staged;
//! 9. a driver that needs attaching waits for its VolumeAttachment;
//! 10. a NodeStage that outlives its timeout while its pod goes (k8s
//!     #86360): the late mount is found and unstaged;
//! 11. a restart between NodeUnpublish and NodeUnstage with the pod dir
//!     gone (k8s #85476, #121937);
//! 12. `requiresRepublish`: NodePublish again each sync period.
//!
//! Every test has its own scratch dir, driver sockets and port, so they run
//! in parallel; every wait is bounded; the driver and daemon are killed when
//! the test ends, and the namespace takes any mount left with it.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use support::csi_driver::{DriverOpts, TestDriver, read_calls};
use support::daemon::{Daemon, Env, NODE, real, series, targets};
use volumed::host::mountinfo::{MountInfo, MountTable};

const DRIVER: &str = "e2e.csi.volumed.dev";
const PV: &str = "pv-csi";
const PVC: &str = "data-csi";
const HANDLE: &str = "vol-e2e-1";
/// `sha256sum` of [`HANDLE`], computed outside the project.
const HANDLE_SHA256: &str = "4a4b6db9b9d9ec9cc04713970e1fff792c1b4a5897fb07e59669a205c8ab84fb";
const VOLUME: &str = "kubernetes.io/csi/e2e.csi.volumed.dev^vol-e2e-1";
const CSI_DIR: &str = "kubernetes.io~csi";
const POD_A: &str = "csi-pod-a";
const POD_B: &str = "csi-pod-b";
/// The four RPCs that change a volume on the node.
const VOLUME_RPCS: [&str; 4] = [
    "NodeStageVolume",
    "NodePublishVolume",
    "NodeUnpublishVolume",
    "NodeUnstageVolume",
];
const STAGE: &str = "NodeStageVolume";
const PUBLISH: &str = "NodePublishVolume";
const UNPUBLISH: &str = "NodeUnpublishVolume";
const UNSTAGE: &str = "NodeUnstageVolume";

// ---------------------------------------------------------------- setup

/// The CSI PV (access mode `access`), its bound claim and the CSIDriver.
fn csi_objects(access: &str) -> String {
    format!(
        "apiVersion: v1
kind: PersistentVolume
metadata:
  name: {PV}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [{access}]
  persistentVolumeReclaimPolicy: Retain
  claimRef: {{namespace: default, name: {PVC}}}
  csi:
    driver: {DRIVER}
    volumeHandle: {HANDLE}
    fsType: ext4
    volumeAttributes: {{tier: gold}}
    readOnly: false
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {PVC}
  namespace: default
spec:
  accessModes: [{access}]
  volumeName: {PV}
  resources:
    requests: {{storage: 1Gi}}
---
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata:
  name: {DRIVER}
spec:
  attachRequired: false
"
    )
}

/// A static pod mounting the claim as `data`.
fn csi_pod(uid: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {uid}, namespace: default, uid: {uid}}}
spec:
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

/// An [`Env`] with the CSI objects written and the driver's socket and
/// state in `<scratch>/driver`; `--csi-driver` names that socket when
/// `flag`.
fn csi_env(prefix: &str, access: &str, flag: bool) -> (Env, DriverOpts) {
    let mut env = Env::new(prefix);
    fs::write(env.objects.join("csi.yaml"), csi_objects(access)).unwrap();
    let mut opts = DriverOpts::in_dir(DRIVER, &env.scratch.path().join("driver"));
    opts.node_id = Some(NODE.to_owned());
    if flag {
        env.extra_args = vec![
            "--csi-driver".to_owned(),
            format!("{DRIVER}={}", opts.endpoint.display()),
        ];
    }
    (env, opts)
}

/// The staging path: `<root>/plugins/kubernetes.io/csi/<driver>/<sha256>/globalmount`.
fn staging(env: &Env) -> PathBuf {
    env.root
        .join("plugins/kubernetes.io/csi")
        .join(DRIVER)
        .join(HANDLE_SHA256)
        .join("globalmount")
}

/// The pod's publish target: `<root>/pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount`.
fn target(env: &Env, uid: &str) -> PathBuf {
    env.pod_volume(uid, CSI_DIR, PV).join("mount")
}

/// The volume RPCs the driver has logged, oldest first.
fn volume_calls(driver: &TestDriver) -> Vec<String> {
    driver
        .calls()
        .iter()
        .filter_map(|c| c["method"].as_str())
        .filter(|m| VOLUME_RPCS.contains(m))
        .map(str::to_owned)
        .collect()
}

/// What a failed assertion shows: the mounts below the root, the driver's
/// volume RPCs and the daemon's stderr tail.
fn report(env: &Env, driver: &TestDriver, daemon: &Daemon) -> String {
    format!(
        "{}\n--- daemon stderr tail ---\n{}",
        seen(env, driver),
        daemon.log_tail()
    )
}

/// The mounts below the root and the driver's volume RPCs.
fn seen(env: &Env, driver: &TestDriver) -> String {
    let mounts: Vec<String> = env
        .mounts_below_root()
        .iter()
        .map(|m| {
            format!(
                "{} (parent {}) {} {} {:?} {}",
                m.mount_id,
                m.parent_id,
                m.dev,
                m.fs_type,
                m.propagation.shared,
                m.mount_point.display()
            )
        })
        .collect();
    format!(
        "--- mounts below the root ---\n{}\n--- volume RPCs ---\n{:?}",
        mounts.join("\n"),
        volume_calls(driver),
    )
}

/// The mounts stacked exactly at `path`, bottom first.
fn mounts_at(path: &Path) -> Vec<MountInfo> {
    MountTable::read_self()
        .unwrap()
        .entries()
        .iter()
        .filter(|m| m.mount_point == path)
        .cloned()
        .collect()
}

/// The state `/debug/state` gives `path`, if it names it.
fn state_of(daemon: &Daemon, path: &Path) -> Option<String> {
    targets(&daemon.state()).get(path).map(|(_, s)| s.clone())
}

/// Whether `/debug/state` shows every path in `want` mounted.
fn mounted(daemon: &Daemon, want: &[PathBuf]) -> bool {
    let t = targets(&daemon.state());
    want.iter()
        .all(|p| t.get(p).is_some_and(|(v, s)| v == VOLUME && s == "mounted"))
}

/// The mount table below the root is exactly one tmpfs at the staging path
/// and one bind of it at each pod's target.
#[track_caller]
fn assert_staged_and_published_once(env: &Env, pods: &[&str]) {
    let below = env.mounts_below_root();
    let dump = || {
        below
            .iter()
            .map(|m| format!("{} {} {}", m.dev, m.fs_type, m.mount_point.display()))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let stage = mounts_at(&staging(env));
    assert!(
        stage.len() == 1 && stage[0].fs_type == "tmpfs",
        "one tmpfs at the staging path:\n{}",
        dump()
    );
    for uid in pods {
        let bind = mounts_at(&target(env, uid));
        assert!(
            bind.len() == 1 && bind[0].dev == stage[0].dev,
            "one bind of the staged tmpfs at pod {uid}'s target:\n{}",
            dump()
        );
    }
    assert_eq!(
        below.len(),
        1 + pods.len(),
        "mounts below the root:\n{}",
        dump()
    );
}

/// A JSON file's object as key → string value.
fn vol_data(file: &Path) -> BTreeMap<String, String> {
    let text = fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let v: BTreeMap<String, Value> = serde_json::from_slice(&text).unwrap();
    v.into_iter()
        .map(|(k, v)| (k, v.as_str().unwrap_or_else(|| panic!("{v}")).to_owned()))
        .collect()
}

/// Deletes every manifest and waits until nothing is mounted below the
/// root and the driver has unstaged the volume.
fn delete_all_and_wait(env: &Env, driver: &TestDriver, daemon: &Daemon) {
    for e in fs::read_dir(&env.pods).unwrap() {
        fs::remove_file(e.unwrap().path()).unwrap();
    }
    daemon.wait_until_showing(
        "nothing mounted below the root, the volume unstaged",
        || {
            env.mounts_below_root().is_empty()
                && volume_calls(driver).last().is_some_and(|m| m == UNSTAGE)
        },
        || seen(env, driver),
    );
}

// ---------------------------------------------------------------- tests

/// One pod on a PVC-bound CSI PV: NodeStage once, then NodePublish once,
/// at the kubelet's paths, each with its `vol_data.json`; data written
/// through the pod's path is on the staged volume; the CSI metrics move.
#[test]
fn a_csi_pv_is_staged_then_published_once_at_the_kubelet_paths() {
    real("mounts through a CSI driver", || {
        let (mut env, opts) = csi_env("volumed-csi-e2e-one-", "ReadWriteOnce", true);
        let driver = TestDriver::spawn(opts);
        env.write_pod("a.yaml", &csi_pod(POD_A));
        let daemon = env.start();
        let (stage, pod) = (staging(&env), target(&env, POD_A));
        daemon.wait_until("the volume staged and published", || {
            mounted(&daemon, &[stage.clone(), pod.clone()])
        });
        assert_eq!(volume_calls(&driver), [STAGE, PUBLISH]);
        let calls = driver.calls();
        let stage_call = calls.iter().find(|c| c["method"] == STAGE).unwrap();
        assert_eq!(stage_call["volume_id"], HANDLE);
        assert_eq!(stage_call["staging_target_path"], stage.to_str().unwrap());
        assert_eq!(stage_call["fs_type"], "ext4");
        assert_eq!(stage_call["volume_context"]["tier"], "gold");
        let publish_call = calls.iter().find(|c| c["method"] == PUBLISH).unwrap();
        assert_eq!(publish_call["volume_id"], HANDLE);
        assert_eq!(publish_call["target_path"], pod.to_str().unwrap());
        assert_eq!(publish_call["staging_target_path"], stage.to_str().unwrap());
        assert_eq!(publish_call["readonly"], false);
        assert_staged_and_published_once(&env, &[POD_A]);

        let pod_data = vol_data(&pod.parent().unwrap().join("vol_data.json"));
        let keys: Vec<&str> = pod_data.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "attachmentID",
                "driverName",
                "nodeName",
                "seLinuxMountContext",
                "specVolID",
                "volumeHandle",
                "volumeLifecycleMode"
            ],
            "{pod_data:?}"
        );
        assert_eq!(pod_data["specVolID"], PV);
        assert_eq!(pod_data["volumeHandle"], HANDLE);
        assert_eq!(pod_data["driverName"], DRIVER);
        assert_eq!(pod_data["nodeName"], NODE);
        assert_eq!(pod_data["volumeLifecycleMode"], "Persistent");
        let device_data = vol_data(&stage.parent().unwrap().join("vol_data.json"));
        assert_eq!(
            device_data,
            BTreeMap::from([
                ("driverName".to_owned(), DRIVER.to_owned()),
                ("volumeHandle".to_owned(), HANDLE.to_owned()),
            ])
        );

        fs::write(pod.join("through-the-pod.txt"), "hello from pod A").unwrap();
        assert_eq!(
            fs::read_to_string(stage.join("through-the-pod.txt")).unwrap(),
            "hello from pod A",
            "the pod's path shows the staged volume"
        );

        let metrics = daemon.metrics();
        let csi = series(&metrics, "csi_operations_seconds_count");
        for method in ["NodeStageVolume", "NodePublishVolume"] {
            assert!(
                csi.iter()
                    .any(|(l, v)| l.contains(&format!("driver_name=\"{DRIVER}\""))
                        && l.contains(&format!("method_name=\"/csi.v1.Node/{method}\""))
                        && *v >= 1.0),
                "{method}: {csi:#?}"
            );
        }
        let storage = series(&metrics, "storage_operation_duration_seconds_count");
        assert!(
            storage.iter().any(|(l, v)| l
                .contains(&format!("volume_plugin=\"kubernetes.io/csi:{DRIVER}\""))
                && *v >= 1.0),
            "{storage:#?}"
        );

        delete_all_and_wait(&env, &driver, &daemon);
        daemon.wait_until("NodeUnstage", || driver.count(UNSTAGE) == 1);
        assert_eq!(volume_calls(&driver), [STAGE, PUBLISH, UNPUBLISH, UNSTAGE]);
        daemon.stop();
    });
}

/// Two pods on one RWX volume: one NodeStage, two NodePublish. The first
/// pod going unpublishes only its target; the last one unpublishes and then
/// unstages, and its mounts and dirs go.
#[test]
fn two_pods_share_one_stage_and_the_last_one_out_unstages() {
    real("mounts through a CSI driver for two pods", || {
        let (mut env, opts) = csi_env("volumed-csi-e2e-two-", "ReadWriteMany", true);
        let driver = TestDriver::spawn(opts);
        env.write_pod("a.yaml", &csi_pod(POD_A));
        env.write_pod("b.yaml", &csi_pod(POD_B));
        let daemon = env.start();
        let (stage, a, b) = (staging(&env), target(&env, POD_A), target(&env, POD_B));
        daemon.wait_until("both pods published", || {
            mounted(&daemon, &[stage.clone(), a.clone(), b.clone()])
        });
        assert_eq!(driver.count(STAGE), 1);
        assert_eq!(driver.count(PUBLISH), 2);
        assert_eq!(
            volume_calls(&driver).len(),
            3,
            "{:?}",
            volume_calls(&driver)
        );
        assert_staged_and_published_once(&env, &[POD_A, POD_B]);
        fs::write(b.join("b.txt"), "pod b").unwrap();

        env.remove_pod("a.yaml");
        daemon.wait_until("pod A unpublished", || driver.count(UNPUBLISH) == 1);
        daemon.wait_until("pod A's target gone from /debug/state", || {
            state_of(&daemon, &a).is_none_or(|s| s == "not_mounted")
        });
        daemon.wait_until("pod A's volume dir removed", || {
            !env.pod_volume(POD_A, CSI_DIR, PV).exists()
        });
        // many reconciler passes to do what it must not
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(volume_calls(&driver), [STAGE, PUBLISH, PUBLISH, UNPUBLISH]);
        let calls = driver.calls();
        let unpublish = calls.iter().find(|c| c["method"] == UNPUBLISH).unwrap();
        assert_eq!(unpublish["target_path"], a.to_str().unwrap());
        assert_staged_and_published_once(&env, &[POD_B]);
        assert_eq!(fs::read_to_string(b.join("b.txt")).unwrap(), "pod b");

        env.remove_pod("b.yaml");
        daemon.wait_until("the volume unstaged", || driver.count(UNSTAGE) == 1);
        daemon.wait_until("nothing mounted below the root", || {
            env.mounts_below_root().is_empty()
        });
        assert_eq!(
            volume_calls(&driver),
            [STAGE, PUBLISH, PUBLISH, UNPUBLISH, UNPUBLISH, UNSTAGE]
        );
        daemon.wait_until("the pod volume dirs and the staging dir removed", || {
            !env.pod_volume(POD_A, CSI_DIR, PV).exists()
                && !env.pod_volume(POD_B, CSI_DIR, PV).exists()
                && !stage.exists()
        });
        daemon.wait_until("no target mounted in /debug/state", || {
            targets(&daemon.state())
                .values()
                .all(|(_, s)| s == "not_mounted")
        });
        daemon.stop();
    });
}

/// Runs one pod's volume, then restarts the daemon gracefully and by
/// SIGKILL while idle: the journal and the host agree, so no CSI RPC is
/// issued again and each mount stays single.
#[test]
fn a_restart_with_the_journal_reissues_no_csi_rpc() {
    real("restarts the daemon over CSI mounts", || {
        let (mut env, opts) = csi_env("volumed-csi-e2e-restart-", "ReadWriteOnce", true);
        let driver = TestDriver::spawn(opts);
        env.write_pod("a.yaml", &csi_pod(POD_A));
        let want = [staging(&env), target(&env, POD_A)];
        let daemon = env.start();
        daemon.wait_until("staged and published", || mounted(&daemon, &want));
        assert_eq!(volume_calls(&driver), [STAGE, PUBLISH]);
        let before = env.mounts_below_root();

        // graceful, then SIGKILL while idle: neither restart makes a call
        daemon.stop();
        let daemon =
            restarted_without_rpcs(&mut env, &driver, &want, &before, "a graceful restart");
        daemon.kill();
        let daemon = restarted_without_rpcs(&mut env, &driver, &want, &before, "a SIGKILL");
        // the volume the journal carried over is torn down with its
        // journaled arguments
        delete_all_and_wait(&env, &driver, &daemon);
        assert_eq!(volume_calls(&driver), [STAGE, PUBLISH, UNPUBLISH, UNSTAGE]);
        daemon.stop();
    });
}

/// Starts the daemon again after `how`: every volume is mounted again,
/// exactly once as `before`, and the driver got no RPC beyond the first
/// stage and publish.
fn restarted_without_rpcs(
    env: &mut Env,
    driver: &TestDriver,
    want: &[PathBuf],
    before: &[MountInfo],
    how: &str,
) -> Daemon {
    let daemon = env.start();
    daemon.wait_until(&format!("mounted after {how}"), || mounted(&daemon, want));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        volume_calls(driver),
        [STAGE, PUBLISH],
        "no RPC after {how}\n{}",
        daemon.log_tail()
    );
    assert_staged_and_published_once(env, &[POD_A]);
    assert_eq!(env.mounts_below_root(), before);
    daemon
}

/// Mounts one pod's volume, stops the daemon and starts it again with
/// `--journal off`; returns the new daemon once it has re-issued
/// NodePublish and shows both targets mounted.
fn restart_with_the_journal_off(env: &mut Env, driver: &TestDriver) -> Daemon {
    env.write_pod("a.yaml", &csi_pod(POD_A));
    let want = [staging(env), target(env, POD_A)];
    let daemon = env.start();
    daemon.wait_until("staged and published", || mounted(&daemon, &want));
    assert_eq!(volume_calls(driver), [STAGE, PUBLISH]);
    daemon.stop();

    env.extra_args
        .extend(["--journal".to_owned(), "off".to_owned()]);
    let daemon = env.start();
    daemon.wait_until_showing(
        "NodePublish re-issued and both targets mounted",
        || driver.count(PUBLISH) == 2 && mounted(&daemon, &want),
        || seen(env, driver),
    );
    // many reconciler passes to issue anything more
    std::thread::sleep(Duration::from_secs(2));
    daemon
}

/// `--journal off` on restart rebuilds the volumes from the host alone, as
/// the kubelet does (KEP-3756): the staging path and the pod target are
/// found mounted in the kubelet layout beside their `vol_data.json`, but
/// with no journal nothing says the last NodeStage and NodePublish
/// finished, so the reconstructed device and pod targets are uncertain and
/// both operations run again: NodeStage and NodePublish are re-issued once
/// each (observed: exactly `[Stage, Publish, Stage, Publish]`). A driver
/// that keeps the spec's idempotency answers OK to both without mounting
/// again, so the table still shows each mount once.
#[test]
fn a_restart_with_the_journal_off_reissues_stage_and_publish() {
    real("restarts the daemon over CSI mounts", || {
        let (mut env, opts) = csi_env("volumed-csi-e2e-off-", "ReadWriteOnce", true);
        let driver = TestDriver::spawn(opts);
        let daemon = restart_with_the_journal_off(&mut env, &driver);
        assert_eq!(
            volume_calls(&driver),
            [STAGE, PUBLISH, STAGE, PUBLISH],
            "{}",
            report(&env, &driver, &daemon)
        );
        let calls = driver.calls();
        let publishes: Vec<&Value> = calls.iter().filter(|c| c["method"] == PUBLISH).collect();
        assert_eq!(
            publishes[0], publishes[1],
            "NodePublish re-issued with the same arguments"
        );
        assert_staged_and_published_once(&env, &[POD_A]);
        daemon.stop();
    });
}

/// After a `--journal off` restart re-issued NodeStage and NodePublish,
/// deleting the pod must unpublish and unstage the volume like any other.
#[test]
fn a_volume_rebuilt_with_the_journal_off_is_unpublished_and_unstaged() {
    real("restarts the daemon over CSI mounts", || {
        let (mut env, opts) = csi_env("volumed-csi-e2e-off-down-", "ReadWriteOnce", true);
        let driver = TestDriver::spawn(opts);
        let daemon = restart_with_the_journal_off(&mut env, &driver);
        delete_all_and_wait(&env, &driver, &daemon);
        assert_eq!(
            volume_calls(&driver),
            [STAGE, PUBLISH, STAGE, PUBLISH, UNPUBLISH, UNSTAGE]
        );
        daemon.wait_until("the pod volume dir and the staging dir removed", || {
            !env.pod_volume(POD_A, CSI_DIR, PV).exists() && !staging(&env).exists()
        });
        daemon.stop();
    });
}

/// With a driver that stacks a second mount when NodePublish is called on
/// a published target (`--stack`, as some real drivers do): a restart with
/// the journal never calls it, so the target keeps one mount; a restart
/// with `--journal off` calls it again and the target ends with two (and,
/// by propagation, the staging path too).
#[test]
fn only_a_journal_off_restart_stacks_a_second_publish_mount() {
    real("restarts the daemon over a stacking CSI driver", || {
        let (mut env, mut opts) = csi_env("volumed-csi-e2e-stack-", "ReadWriteOnce", true);
        opts.stack = true;
        let driver = TestDriver::spawn(opts);
        env.write_pod("a.yaml", &csi_pod(POD_A));
        let pod = target(&env, POD_A);
        let want = [staging(&env), pod.clone()];
        let daemon = env.start();
        daemon.wait_until("staged and published", || mounted(&daemon, &want));
        assert_eq!(mounts_at(&pod).len(), 1);
        daemon.stop();

        let daemon = env.start();
        daemon.wait_until("mounted after the restart", || mounted(&daemon, &want));
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(volume_calls(&driver), [STAGE, PUBLISH]);
        assert_eq!(
            mounts_at(&pod).len(),
            1,
            "journal on: no second mount at the target"
        );
        daemon.stop();

        env.extra_args
            .extend(["--journal".to_owned(), "off".to_owned()]);
        let daemon = env.start();
        daemon.wait_until("NodePublish re-issued", || driver.count(PUBLISH) == 2);
        std::thread::sleep(Duration::from_secs(2));
        let shown = report(&env, &driver, &daemon);
        assert_eq!(volume_calls(&driver), [STAGE, PUBLISH, STAGE, PUBLISH]);
        let at_pod = mounts_at(&pod);
        assert_eq!(
            at_pod.len(),
            2,
            "journal off: NodePublish on the published target stacked a second bind\n{shown}"
        );
        assert_eq!(at_pod[1].parent_id, at_pod[0].mount_id, "{shown}");
        // The staging path shows a second mount too, though NodeStage found
        // it mounted and did nothing: the root is a shared mount, so the
        // staged tmpfs and its first bind are peers, and the second bind,
        // made on top of the first, propagates onto the staging path. One
        // stacked NodePublish thus leaves two extra mounts, all four in one
        // peer group.
        let at_stage = mounts_at(&staging(&env));
        assert_eq!(at_stage.len(), 2, "{shown}");
        assert_eq!(at_stage[1].parent_id, at_stage[0].mount_id, "{shown}");
        let group = at_stage[0].propagation.shared;
        assert!(group.is_some(), "{shown}");
        assert!(
            at_pod
                .iter()
                .chain(&at_stage)
                .all(|m| m.propagation.shared == group),
            "one peer group\n{shown}"
        );
        daemon.kill();
    });
}

/// The registration calls (GetInfo, NotifyRegistrationStatus) the driver
/// with `pid` logged in `state`.
fn registrations(state: &Path, pid: u32) -> Vec<Value> {
    read_calls(state)
        .into_iter()
        .filter(|c| c["pid"] == pid)
        .filter(|c| c["method"] == "GetInfo" || c["method"] == "NotifyRegistrationStatus")
        .collect()
}

/// A driver with a registration socket in `<root>/plugins_registry/` and
/// no `--csi-driver` flag, pod A using its RWX volume, the daemon started:
/// returns once the daemon registered the driver (GetInfo, then
/// NotifyRegistrationStatus with `plugin_registered: true`) and pod A is
/// published.
fn registered_driver(prefix: &str) -> (Env, DriverOpts, TestDriver, Daemon) {
    let (mut env, mut opts) = csi_env(prefix, "ReadWriteMany", false);
    opts.registration_dir = Some(env.root.join("plugins_registry"));
    let driver = TestDriver::spawn(opts.clone());
    let pid = driver.pid().unwrap();
    env.write_pod("a.yaml", &csi_pod(POD_A));
    let daemon = env.start();
    let want = [staging(&env), target(&env, POD_A)];
    daemon.wait_until("pod A published", || mounted(&daemon, &want));
    let reg = registrations(&opts.state, pid);
    assert!(
        reg.len() >= 2
            && reg[0]["method"] == "GetInfo"
            && reg[1]["method"] == "NotifyRegistrationStatus"
            && reg[1]["plugin_registered"] == true
            && reg[1]["error"] == "",
        "{reg:#?}"
    );
    assert_eq!(volume_calls(&driver), [STAGE, PUBLISH]);
    assert_staged_and_published_once(&env, &[POD_A]);
    (env, opts, driver, daemon)
}

/// No `--csi-driver` flag: the driver registers through
/// `<root>/plugins_registry/` and its volume mounts, and is torn down.
#[test]
fn a_driver_found_through_plugins_registry_is_registered_and_used() {
    real("mounts through a CSI driver found by registration", || {
        let (env, _opts, driver, daemon) = registered_driver("volumed-csi-e2e-reg-");
        assert!(
            daemon.log().contains("CSI driver registered"),
            "{}",
            daemon.log_tail()
        );
        delete_all_and_wait(&env, &driver, &daemon);
        assert_eq!(volume_calls(&driver), [STAGE, PUBLISH, UNPUBLISH, UNSTAGE]);
        daemon.stop();
    });
}

/// The registered driver is killed and started again while the daemon
/// runs; it removes its stale registration socket and makes a new one.
/// docs/csi.md: a registration socket that is replaced (a restarted
/// registrar makes a new socket file) registers its driver again — GetInfo and NotifyRegistrationStatus
/// reach the new process — and a new pod using the volume is published by
/// it.
#[test]
fn a_restarted_driver_is_registered_again_and_publishes_a_new_pod() {
    real("mounts through a CSI driver found by registration", || {
        let (env, opts, mut driver, daemon) = registered_driver("volumed-csi-e2e-rereg-");
        driver.kill();
        let driver = TestDriver::spawn(opts.clone());
        let pid = driver.pid().unwrap();
        let registry = env.root.join("plugins_registry");
        daemon.wait_until_showing(
            "the restarted driver registered again",
            || {
                registrations(&opts.state, pid)
                    .iter()
                    .any(|c| c["plugin_registered"] == true)
            },
            || {
                let listing: Vec<_> = fs::read_dir(&registry)
                    .map(|d| d.flatten().map(|e| e.file_name()).collect())
                    .unwrap_or_default();
                format!(
                    "--- plugins_registry ---\n{listing:?}\n--- driver calls ---\n{:#?}",
                    driver.calls()
                )
            },
        );
        env.write_pod("b.yaml", &csi_pod(POD_B));
        let want = [staging(&env), target(&env, POD_A), target(&env, POD_B)];
        daemon.wait_until("pod B published", || mounted(&daemon, &want));
        let by_new: Vec<String> = driver
            .calls()
            .iter()
            .filter(|c| c["pid"] == pid)
            .filter_map(|c| c["method"].as_str())
            .filter(|m| VOLUME_RPCS.contains(m))
            .map(str::to_owned)
            .collect();
        assert_eq!(by_new, [PUBLISH], "the restarted driver published pod B");
        assert_staged_and_published_once(&env, &[POD_A, POD_B]);
        delete_all_and_wait(&env, &driver, &daemon);
        daemon.stop();
    });
}

/// The pod's driver is named by `--csi-driver` but not running yet: the
/// volume fails with an error naming the driver; once the driver starts on
/// that socket the volume mounts, without restarting the daemon.
#[test]
fn a_volume_waits_for_its_driver_to_start() {
    real("mounts through a CSI driver started late", || {
        let (mut env, opts) = csi_env("volumed-csi-e2e-late-", "ReadWriteOnce", true);
        env.write_pod("a.yaml", &csi_pod(POD_A));
        let daemon = env.start();
        daemon.wait_until("an error naming the driver for the pod", || {
            let e = daemon.pod_errors(POD_A);
            e.contains(DRIVER) && e.contains("not reachable")
        });
        assert!(
            daemon
                .log()
                .lines()
                .any(|l| l.contains(DRIVER) && l.contains("not reachable")),
            "{}",
            daemon.log_tail()
        );
        assert!(env.mounts_below_root().is_empty());

        let driver = TestDriver::spawn(opts);
        let want = [staging(&env), target(&env, POD_A)];
        daemon.wait_until("mounted once the driver runs", || mounted(&daemon, &want));
        assert_eq!(volume_calls(&driver), [STAGE, PUBLISH]);
        assert_staged_and_published_once(&env, &[POD_A]);
        delete_all_and_wait(&env, &driver, &daemon);
        daemon.stop();
    });
}

/// NodePublish answers `Unavailable` once: the daemon retries it and the
/// volume ends published, once.
#[test]
fn a_retryable_publish_error_is_retried_until_the_volume_mounts() {
    real("mounts through a faulty CSI driver", || {
        let (mut env, opts) = csi_env("volumed-csi-e2e-retry-", "ReadWriteOnce", true);
        let driver = TestDriver::spawn(opts);
        driver.set_faults(json!([
            {"method": PUBLISH, "code": "Unavailable", "message": "try later", "times": 1}
        ]));
        env.write_pod("a.yaml", &csi_pod(POD_A));
        let daemon = env.start();
        let want = [staging(&env), target(&env, POD_A)];
        daemon.wait_until("mounted after the retry", || mounted(&daemon, &want));
        assert_eq!(volume_calls(&driver), [STAGE, PUBLISH, PUBLISH]);
        assert_eq!(driver.faults()[0]["times"], 0, "the fault was used");
        assert_staged_and_published_once(&env, &[POD_A]);
        delete_all_and_wait(&env, &driver, &daemon);
        daemon.stop();
    });
}

/// NodeUnstage fails (a final status) when the last pod goes: the device
/// is uncertain then, as the kubelet's `MarkDeviceAsUncertain`, so the
/// next pod of the volume gets NodeStage again before its NodePublish, and
/// NodeUnstage when it goes in turn.
#[test]
fn after_a_failed_unstage_the_next_pod_is_staged_again_then_unstaged() {
    real("mounts through a CSI driver whose unstage fails", || {
        let (mut env, opts) = csi_env("volumed-csi-e2e-restage-", "ReadWriteOnce", true);
        let driver = TestDriver::spawn(opts);
        env.write_pod("a.yaml", &csi_pod(POD_A));
        let daemon = env.start();
        let (stage, a, b) = (staging(&env), target(&env, POD_A), target(&env, POD_B));
        daemon.wait_until("pod A published", || {
            mounted(&daemon, &[stage.clone(), a.clone()])
        });
        driver.set_faults(json!([
            {"method": UNSTAGE, "code": "Internal", "message": "unstage broke for e2e"}
        ]));
        env.remove_pod("a.yaml");
        daemon.wait_until_showing(
            "NodeUnstage failed",
            || driver.count(UNSTAGE) >= 1,
            || report(&env, &driver, &daemon),
        );
        daemon.wait_until_showing(
            "the device uncertain in /debug/state",
            || state_of(&daemon, &stage).as_deref() == Some("uncertain"),
            || report(&env, &driver, &daemon),
        );
        let unstages = driver.count(UNSTAGE);
        env.write_pod("b.yaml", &csi_pod(POD_B));
        daemon.wait_until_showing(
            "pod B published",
            || mounted(&daemon, &[stage.clone(), b.clone()]),
            || report(&env, &driver, &daemon),
        );
        let calls = volume_calls(&driver);
        assert_eq!(driver.count(STAGE), 2, "staged again: {calls:?}");
        assert_eq!(
            calls[calls.len() - 2..],
            [STAGE, PUBLISH],
            "NodeStage before pod B's NodePublish: {calls:?}"
        );
        assert!(
            driver.count(UNSTAGE) <= unstages + 1,
            "no unstage once pod B wants the volume: {calls:?}"
        );
        assert_staged_and_published_once(&env, &[POD_B]);

        driver.clear_faults();
        let before = driver.count(UNSTAGE);
        env.remove_pod("b.yaml");
        daemon.wait_until_showing(
            "pod B unpublished and the volume unstaged",
            || driver.count(UNSTAGE) > before && env.mounts_below_root().is_empty(),
            || report(&env, &driver, &daemon),
        );
        assert_eq!(
            volume_calls(&driver).last().map(String::as_str),
            Some(UNSTAGE)
        );
        daemon.stop();
    });
}

/// NodeStage answers `InvalidArgument` every time: the pod's volume reports
/// the error and nothing is published.
#[test]
fn a_permanent_stage_error_is_reported_and_nothing_is_published() {
    real("mounts through a failing CSI driver", || {
        let (mut env, opts) = csi_env("volumed-csi-e2e-fail-", "ReadWriteOnce", true);
        let driver = TestDriver::spawn(opts);
        driver.set_faults(json!([
            {"method": STAGE, "code": "InvalidArgument", "message": "bad fsType for e2e"}
        ]));
        env.write_pod("a.yaml", &csi_pod(POD_A));
        let daemon = env.start();
        daemon.wait_until("the pod reports the stage error", || {
            daemon.pod_errors(POD_A).contains("bad fsType for e2e")
        });
        daemon.wait_until("NodeStage retried with backoff", || {
            driver.count(STAGE) >= 2
        });
        std::thread::sleep(Duration::from_secs(1));
        let calls = volume_calls(&driver);
        assert!(calls.iter().all(|m| m == STAGE), "{calls:?}");
        assert!(
            env.mounts_below_root().is_empty(),
            "{:#?}",
            env.mounts_below_root()
        );
        assert_ne!(
            state_of(&daemon, &target(&env, POD_A)).as_deref(),
            Some("mounted")
        );
        assert!(!target(&env, POD_A).exists(), "nothing published");
        daemon.stop();
    });
}

// ------------------------------------------- secrets, inline, attach, races

/// The stage Secret's value (given base64-encoded in `data`).
const STAGE_SECRET: &str = "stage-pw-9d41c7e2b8";
/// [`STAGE_SECRET`] in base64, computed outside the project.
const STAGE_SECRET_B64: &str = "c3RhZ2UtcHctOWQ0MWM3ZTJiOA==";
/// The publish Secret's value (given in `stringData`).
const PUBLISH_SECRET: &str = "publish-tok-51e0a6f3cc";
/// The pod's `securityContext.fsGroup`.
const FS_GROUP: u32 = 4242;
/// The inline volume's name in the pod.
const INLINE: &str = "scratch";
/// The VolumeAttachment's name (not the kubelet's `csi-<sha256>`, so the
/// pod's `attachmentID` shows where it came from).
const ATTACHMENT: &str = "va-e2e-1";

/// An [`Env`] whose objects dir holds `objects` and whose `--csi-driver`
/// names the driver's socket in `<scratch>/driver`.
fn env_with_objects(prefix: &str, objects: &str) -> (Env, DriverOpts) {
    let mut env = Env::new(prefix);
    fs::write(env.objects.join("csi.yaml"), objects).unwrap();
    let mut opts = DriverOpts::in_dir(DRIVER, &env.scratch.path().join("driver"));
    opts.node_id = Some(NODE.to_owned());
    env.extra_args = vec![
        "--csi-driver".to_owned(),
        format!("{DRIVER}={}", opts.endpoint.display()),
    ];
    (env, opts)
}

/// The PV of [`csi_objects`] with both secret refs, its claim, the two
/// Secrets, and a CSIDriver with `podInfoOnMount`.
fn secret_objects() -> String {
    format!(
        "apiVersion: v1
kind: PersistentVolume
metadata:
  name: {PV}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  claimRef: {{namespace: default, name: {PVC}}}
  csi:
    driver: {DRIVER}
    volumeHandle: {HANDLE}
    fsType: ext4
    volumeAttributes: {{tier: gold}}
    nodeStageSecretRef: {{name: stage-creds, namespace: default}}
    nodePublishSecretRef: {{name: publish-creds, namespace: default}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: {PVC}, namespace: default}}
spec:
  accessModes: [ReadWriteOnce]
  volumeName: {PV}
  resources:
    requests: {{storage: 1Gi}}
---
apiVersion: v1
kind: Secret
metadata: {{name: stage-creds, namespace: default}}
data: {{password: {STAGE_SECRET_B64}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: publish-creds, namespace: default}}
stringData: {{token: {PUBLISH_SECRET}}}
---
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {{name: {DRIVER}}}
spec:
  attachRequired: false
  podInfoOnMount: true
"
    )
}

/// Every file below `dir`, with its bytes.
fn files_below(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    support::daemon::tree(dir)
        .into_iter()
        .map(|rel| dir.join(rel))
        .filter(|p| p.is_file())
        .map(|p| {
            let bytes = fs::read(&p).unwrap_or_default();
            (p, bytes)
        })
        .collect()
}

/// Whether `needle` occurs in `hay`.
fn contains_bytes(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// `volumed dump --format json` of the env's journal, while the daemon runs.
fn dump_json(env: &Env, daemon: &Daemon) -> String {
    let out = std::process::Command::new(support::daemon::BIN)
        .arg("dump")
        .arg("--journal-dir")
        .arg(&env.journal)
        .arg("--boot-id-file")
        .arg(&env.boot)
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "dump: {}\n--- daemon stderr tail ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        daemon.log_tail()
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The one logged call of `method`.
#[track_caller]
fn only_call(driver: &TestDriver, method: &str) -> Value {
    let calls: Vec<Value> = driver
        .calls()
        .into_iter()
        .filter(|c| c["method"] == method)
        .collect();
    assert_eq!(calls.len(), 1, "one {method}: {calls:#?}");
    calls.into_iter().next().unwrap()
}

/// A string map as the call log holds it.
fn string_map(pairs: &[(&str, &str)]) -> Value {
    Value::Object(
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
            .collect(),
    )
}

/// A PVC-bound CSI PV whose Secrets the CSIDriver's pod info and the pod's
/// fsGroup go with: NodeStage gets the stage Secret and only the PV's
/// attributes; NodePublish gets the publish Secret, the
/// `csi.storage.k8s.io/` pod keys (the static pod's name is
/// `<name>-<node>`) and the fsGroup as `volume_mount_group` (the driver
/// advertises VOLUME_MOUNT_GROUP). No Secret value reaches the daemon's
/// log, a journal file or `volumed dump`.
#[test]
fn secrets_and_pod_info_reach_the_driver_and_nothing_else() {
    real("mounts through a CSI driver with secrets", || {
        let (mut env, mut opts) = env_with_objects("volumed-csi-e2e-secrets-", &secret_objects());
        opts.caps = Some("GET_VOLUME_STATS,VOLUME_CONDITION,VOLUME_MOUNT_GROUP".to_owned());
        let driver = TestDriver::spawn(opts);
        env.write_pod(
            "a.yaml",
            &format!(
                "apiVersion: v1
kind: Pod
metadata: {{name: {POD_A}, namespace: default, uid: {POD_A}}}
spec:
  serviceAccountName: e2e-sa
  securityContext: {{fsGroup: {FS_GROUP}}}
  containers:
  - name: app
    image: busybox
    volumeMounts: [{{name: data, mountPath: /data}}]
  volumes:
  - name: data
    persistentVolumeClaim: {{claimName: {PVC}}}
"
            ),
        );
        let daemon = env.start();
        let (stage, pod) = (staging(&env), target(&env, POD_A));
        daemon.wait_until_showing(
            "the volume staged and published",
            || mounted(&daemon, &[stage.clone(), pod.clone()]),
            || format!("{}\n{}", seen(&env, &driver), daemon.pod_errors(POD_A)),
        );
        assert_eq!(volume_calls(&driver), [STAGE, PUBLISH]);

        let stage_call = only_call(&driver, STAGE);
        assert_eq!(
            stage_call["secrets"],
            string_map(&[("password", STAGE_SECRET)])
        );
        assert_eq!(
            stage_call["volume_context"],
            string_map(&[("tier", "gold")]),
            "no pod keys on NodeStage"
        );
        let publish_call = only_call(&driver, PUBLISH);
        assert_eq!(
            publish_call["secrets"],
            string_map(&[("token", PUBLISH_SECRET)])
        );
        let pod_name = format!("{POD_A}-{NODE}");
        assert_eq!(
            publish_call["volume_context"],
            string_map(&[
                ("tier", "gold"),
                ("csi.storage.k8s.io/pod.name", &pod_name),
                ("csi.storage.k8s.io/pod.namespace", "default"),
                ("csi.storage.k8s.io/pod.uid", POD_A),
                ("csi.storage.k8s.io/serviceAccount.name", "e2e-sa"),
                ("csi.storage.k8s.io/ephemeral", "false"),
            ])
        );
        assert_eq!(publish_call["volume_mount_group"], FS_GROUP.to_string());
        assert_eq!(
            stage_call["volume_mount_group"],
            FS_GROUP.to_string(),
            "NodeStage gets the staging pod's fsGroup too, as the kubelet's MountDevice"
        );
        assert_staged_and_published_once(&env, &[POD_A]);

        let dump = dump_json(&env, &daemon);
        delete_all_and_wait(&env, &driver, &daemon);
        let log_file = daemon.log.clone();
        daemon.stop();
        let log = fs::read(log_file).unwrap();
        let journal = files_below(&env.journal);
        assert!(!journal.is_empty(), "the journal has files");
        for secret in [STAGE_SECRET, PUBLISH_SECRET, STAGE_SECRET_B64] {
            assert!(
                !contains_bytes(&log, secret.as_bytes()),
                "{secret} in the daemon's log"
            );
            for (file, bytes) in &journal {
                assert!(
                    !contains_bytes(bytes, secret.as_bytes()),
                    "{secret} in {}",
                    file.display()
                );
            }
            assert!(!dump.contains(secret), "{secret} in dump: {dump}");
        }
        // the references are journaled, so the search above reads the
        // journal's bytes as they are (not compressed away)
        for name in ["stage-creds", "publish-creds"] {
            assert!(
                journal
                    .iter()
                    .any(|(_, bytes)| contains_bytes(bytes, name.as_bytes())),
                "the Secret reference {name} is in a journal file"
            );
        }
    });
}

/// A pod with an inline CSI volume [`INLINE`] of [`DRIVER`].
fn inline_pod(uid: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {uid}, namespace: default, uid: {uid}}}
spec:
  containers:
  - name: app
    image: busybox
    volumeMounts: [{{name: {INLINE}, mountPath: /scratch}}]
  volumes:
  - name: {INLINE}
    csi:
      driver: {DRIVER}
      volumeAttributes: {{size: 1Mi}}
"
    )
}

/// `sha256sum` of `text`, by the coreutils tool.
fn sha256sum(text: &str) -> String {
    let out = std::process::Command::new("sh")
        .args(["-c", "printf %s \"$1\" | sha256sum", "sh", text])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()[..64].to_owned()
}

/// An inline (ephemeral) CSI volume: never staged, published once at
/// `pods/<uid>/volumes/kubernetes.io~csi/<name>/mount` with the kubelet's
/// handle `csi-<sha256(uid + name)>`, unique name
/// `kubernetes.io/csi/<uid>-<name>` and `vol_data.json` saying
/// `Ephemeral`; the pod going unpublishes it and unstages nothing.
#[test]
fn an_inline_ephemeral_volume_is_published_once_and_never_staged() {
    real("mounts an inline CSI volume", || {
        let objects = format!(
            "apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {{name: {DRIVER}}}
spec:
  attachRequired: false
  podInfoOnMount: true
  volumeLifecycleModes: [Ephemeral]
"
        );
        let (mut env, opts) = env_with_objects("volumed-csi-e2e-inline-", &objects);
        let driver = TestDriver::spawn(opts);
        env.write_pod("a.yaml", &inline_pod(POD_A));
        let daemon = env.start();
        let pod = env.pod_volume(POD_A, CSI_DIR, INLINE).join("mount");
        let unique = format!("kubernetes.io/csi/{POD_A}-{INLINE}");
        daemon.wait_until_showing(
            "the inline volume published",
            || {
                targets(&daemon.state())
                    .get(&pod)
                    .is_some_and(|(v, s)| *v == unique && s == "mounted")
            },
            || {
                format!(
                    "{}\n{:#?}\n{}",
                    seen(&env, &driver),
                    targets(&daemon.state()),
                    daemon.pod_errors(POD_A)
                )
            },
        );
        assert_eq!(volume_calls(&driver), [PUBLISH]);
        let handle = format!("csi-{}", sha256sum(&format!("{POD_A}{INLINE}")));
        let publish_call = only_call(&driver, PUBLISH);
        assert_eq!(publish_call["volume_id"], handle);
        assert_eq!(publish_call["target_path"], pod.to_str().unwrap());
        assert_eq!(publish_call["staging_target_path"], "");
        assert_eq!(publish_call["volume_context"]["size"], "1Mi");
        assert_eq!(
            publish_call["volume_context"]["csi.storage.k8s.io/ephemeral"],
            "true"
        );
        let below = env.mounts_below_root();
        assert!(
            below.len() == 1 && below[0].mount_point == pod && below[0].fs_type == "tmpfs",
            "one tmpfs, at the pod's target\n{}",
            seen(&env, &driver)
        );
        assert!(
            !env.root
                .join("plugins/kubernetes.io/csi")
                .join(DRIVER)
                .exists(),
            "no staging dir"
        );
        let data = vol_data(&pod.parent().unwrap().join("vol_data.json"));
        assert_eq!(data["volumeLifecycleMode"], "Ephemeral", "{data:?}");
        assert_eq!(data["volumeHandle"], handle);
        assert_eq!(data["specVolID"], INLINE);
        assert_eq!(data["driverName"], DRIVER);

        env.remove_pod("a.yaml");
        daemon.wait_until_showing(
            "unpublished, nothing mounted",
            || driver.count(UNPUBLISH) == 1 && env.mounts_below_root().is_empty(),
            || seen(&env, &driver),
        );
        daemon.wait_until("the pod's volume dir removed", || {
            !env.pod_volume(POD_A, CSI_DIR, INLINE).exists()
        });
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(volume_calls(&driver), [PUBLISH, UNPUBLISH]);
        let unpublish = only_call(&driver, UNPUBLISH);
        assert_eq!(unpublish["volume_id"], handle);
        assert_eq!(unpublish["target_path"], pod.to_str().unwrap());
        daemon.stop();
    });
}

/// The PV, claim and a CSIDriver that leaves `attachRequired` at its
/// default (true).
fn attach_objects() -> String {
    csi_objects("ReadWriteOnce").replace("  attachRequired: false\n", "  podInfoOnMount: false\n")
}

/// A VolumeAttachment [`ATTACHMENT`] of [`PV`] to this node.
fn attachment(status: &str) -> String {
    format!(
        "apiVersion: storage.k8s.io/v1
kind: VolumeAttachment
metadata: {{name: {ATTACHMENT}}}
spec:
  attacher: {DRIVER}
  nodeName: {NODE}
  source: {{persistentVolumeName: {PV}}}
status:
{status}"
    )
}

/// Writes the objects-dir file `file` by rename.
fn write_object(env: &Env, file: &str, text: &str) {
    let tmp = env.scratch.path().join(format!(".{file}.tmp"));
    fs::write(&tmp, text).unwrap();
    fs::rename(&tmp, env.objects.join(file)).unwrap();
}

/// A driver that needs attaching: with no VolumeAttachment the volume is
/// not mounted and the pod's error names what it waits for; one with
/// `attached: false` still leaves it waiting; `attached: true` with
/// `attachmentMetadata` mounts it, NodeStage and NodePublish get the
/// metadata as `publish_context`, and `vol_data.json`'s `attachmentID` is
/// the VolumeAttachment's name.
#[test]
fn a_volume_that_needs_attaching_waits_for_its_volume_attachment() {
    real("mounts a CSI volume that needs attaching", || {
        let (mut env, opts) = env_with_objects("volumed-csi-e2e-attach-", &attach_objects());
        let driver = TestDriver::spawn(opts);
        env.write_pod("a.yaml", &csi_pod(POD_A));
        let daemon = env.start();
        daemon.wait_until("an error naming the missing VolumeAttachment", || {
            let e = daemon.pod_errors(POD_A);
            e.contains("VolumeAttachment") && e.contains(PV) && e.contains(NODE)
        });
        std::thread::sleep(Duration::from_secs(1));
        assert!(volume_calls(&driver).is_empty(), "{}", seen(&env, &driver));
        assert!(env.mounts_below_root().is_empty());
        // the wait is told as the attach/detach controller's reason
        let events: Value = serde_json::from_str(&daemon.get("/debug/events")).unwrap();
        let attach_waits = events.as_array().unwrap().iter().filter(|e| {
            e["reason"] == "FailedAttachVolume"
                && e["pod_uid"] == POD_A
                && e["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("VolumeAttachment"))
        });
        assert_eq!(attach_waits.count(), 1, "{events:#}");

        write_object(&env, "va.yaml", &attachment("  attached: false\n"));
        daemon.wait_until("an error naming the unattached VolumeAttachment", || {
            let e = daemon.pod_errors(POD_A);
            e.contains(ATTACHMENT) && e.contains("not attached")
        });
        std::thread::sleep(Duration::from_secs(1));
        assert!(volume_calls(&driver).is_empty(), "{}", seen(&env, &driver));
        assert!(env.mounts_below_root().is_empty());

        write_object(
            &env,
            "va.yaml",
            &attachment("  attached: true\n  attachmentMetadata: {lun: \"7\"}\n"),
        );
        let (stage, pod) = (staging(&env), target(&env, POD_A));
        daemon.wait_until_showing(
            "staged and published once attached",
            || mounted(&daemon, &[stage.clone(), pod.clone()]),
            || format!("{}\n{}", seen(&env, &driver), daemon.pod_errors(POD_A)),
        );
        assert_eq!(volume_calls(&driver), [STAGE, PUBLISH]);
        let lun = string_map(&[("lun", "7")]);
        assert_eq!(only_call(&driver, STAGE)["publish_context"], lun);
        assert_eq!(only_call(&driver, PUBLISH)["publish_context"], lun);
        let data = vol_data(&pod.parent().unwrap().join("vol_data.json"));
        assert_eq!(data["attachmentID"], ATTACHMENT, "{data:?}");
        assert_eq!(daemon.pod_errors(POD_A), "");
        assert_staged_and_published_once(&env, &[POD_A]);
        delete_all_and_wait(&env, &driver, &daemon);
        daemon.stop();
    });
}

/// NodeStage outlives `--csi-timeout 1` (the driver sleeps 3 s first, then
/// mounts) and the pod is deleted while the driver still works on it. The
/// daemon must not take its own unstage, made before the late stage
/// mounted, for the end: the volume ends unstaged — no mount at the
/// staging path once the late stage has mounted and a NodeUnstage has
/// followed it — and nothing is ever published (k8s #86360).
#[test]
fn a_stage_that_outlives_its_timeout_ends_unstaged_when_the_pod_goes() {
    real("unstages a CSI volume whose stage timed out", || {
        let (mut env, opts) = csi_env("volumed-csi-e2e-late-stage-", "ReadWriteOnce", true);
        env.extra_args
            .extend(["--csi-timeout".to_owned(), "1".to_owned()]);
        let driver = TestDriver::spawn(opts);
        driver.set_faults(json!([{"method": STAGE, "delay_ms": 3000, "times": 1}]));
        env.write_pod("a.yaml", &csi_pod(POD_A));
        let daemon = env.start();
        daemon.wait_until("NodeStage called", || driver.count(STAGE) == 1);
        env.remove_pod("a.yaml");
        let stage = staging(&env);
        daemon.wait_until_showing(
            "the late stage done, then unstaged: nothing mounted",
            || {
                late_unstage(&driver).is_some()
                    && env.mounts_below_root().is_empty()
                    && volume_calls(&driver).last().is_some_and(|m| m == UNSTAGE)
            },
            || {
                format!(
                    "{}\n--- /debug/state targets ---\n{:#?}",
                    seen(&env, &driver),
                    targets(&daemon.state())
                )
            },
        );
        // many reconciler passes to leave it otherwise
        std::thread::sleep(Duration::from_secs(2));
        let shown = report(&env, &driver, &daemon);
        assert!(env.mounts_below_root().is_empty(), "{shown}");
        assert!(mounts_at(&stage).is_empty(), "{shown}");
        let calls = volume_calls(&driver);
        assert_eq!(calls.first().map(String::as_str), Some(STAGE), "{shown}");
        assert_eq!(calls.last().map(String::as_str), Some(UNSTAGE), "{shown}");
        assert!(!calls.iter().any(|m| m == PUBLISH), "{shown}");
        assert!(
            late_unstage(&driver).is_some(),
            "a NodeUnstage after the late NodeStage mounted\n{shown}"
        );
        assert!(!target(&env, POD_A).exists(), "nothing published\n{shown}");
        daemon.stop();
    });
}

/// A NodeUnstage that arrived once the first NodeStage's 3 s delay was
/// over (the driver's own arrival times: the test's polling lags under
/// load), with how long after the stage it came.
fn late_unstage(driver: &TestDriver) -> Option<u64> {
    let calls = driver.calls_timed();
    let at = |c: &Value| c["at_ms"].as_u64();
    let stage = calls.iter().find(|c| c["method"] == STAGE).and_then(at)?;
    calls
        .iter()
        .filter(|c| c["method"] == UNSTAGE)
        .filter_map(at)
        .map(|t| t.saturating_sub(stage))
        .find(|after| *after >= 3000)
}

/// Calls NodeUnpublishVolume on the driver as the daemon would.
fn unpublish_directly(driver: &TestDriver, target: &Path) {
    use volumed::csi::proto::csi_v1::{NodeUnpublishVolumeRequest, node_client::NodeClient};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let channel = volumed::csi::connect_unix(driver.endpoint()).await.unwrap();
        NodeClient::new(channel)
            .node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: HANDLE.to_owned(),
                target_path: target.to_str().unwrap().to_owned(),
            })
            .await
            .unwrap();
    });
}

/// The daemon dies (SIGKILL) between NodeUnpublish and NodeUnstage: the
/// pod's manifest is gone, its target unpublished through the driver and
/// its whole `pods/<uid>` dir removed, the volume still staged. Started
/// again, the daemon finds the staged volume in its journal and unstages
/// it (k8s #85476, #121937: the kubelet, finding no pod dir, leaks the
/// staging mount).
#[test]
fn a_staged_volume_whose_pod_dir_is_gone_is_unstaged_after_a_restart() {
    real("unstages a CSI volume after a restart", || {
        let (mut env, opts) = csi_env("volumed-csi-e2e-no-pod-dir-", "ReadWriteOnce", true);
        let driver = TestDriver::spawn(opts);
        env.write_pod("a.yaml", &csi_pod(POD_A));
        let (stage, pod) = (staging(&env), target(&env, POD_A));
        let daemon = env.start();
        daemon.wait_until("staged and published", || {
            mounted(&daemon, &[stage.clone(), pod.clone()])
        });
        daemon.kill();

        env.remove_pod("a.yaml");
        unpublish_directly(&driver, &pod);
        assert!(mounts_at(&pod).is_empty(), "{}", seen(&env, &driver));
        let pod_dir = env.root.join("pods").join(POD_A);
        fs::remove_dir_all(&pod_dir).unwrap();
        assert_eq!(mounts_at(&stage).len(), 1, "{}", seen(&env, &driver));
        assert_eq!(volume_calls(&driver), [STAGE, PUBLISH, UNPUBLISH]);

        let daemon = env.start();
        daemon.wait_until_showing(
            "unstaged, nothing mounted",
            || {
                env.mounts_below_root().is_empty()
                    && volume_calls(&driver).last().is_some_and(|m| m == UNSTAGE)
            },
            || seen(&env, &driver),
        );
        std::thread::sleep(Duration::from_secs(2));
        let shown = report(&env, &driver, &daemon);
        // The journal says the target was published and nothing says it
        // was unpublished, so the daemon unpublishes it again (the driver
        // answers OK for a target that is gone) before it unstages.
        assert_eq!(
            volume_calls(&driver),
            [STAGE, PUBLISH, UNPUBLISH, UNPUBLISH, UNSTAGE],
            "{shown}"
        );
        let calls = driver.calls();
        let unpublishes: Vec<&Value> = calls.iter().filter(|c| c["method"] == UNPUBLISH).collect();
        assert_eq!(unpublishes[1]["volume_id"], HANDLE);
        assert_eq!(unpublishes[1]["target_path"], pod.to_str().unwrap());
        let unstage = only_call(&driver, UNSTAGE);
        assert_eq!(unstage["volume_id"], HANDLE);
        assert_eq!(unstage["staging_target_path"], stage.to_str().unwrap());
        daemon.wait_until("the staging dir removed", || !stage.exists());
        assert!(!pod_dir.exists(), "{shown}");
        daemon.stop();
    });
}

/// A CSIDriver with `requiresRepublish: true` gets NodePublishVolume again
/// each sync period (`--sync-frequency 1s` here) while the volume is
/// mounted — never NodeStage again, and across a restart too; once the pod
/// is gone, no more. Every other test's driver, without it, is published
/// once.
#[test]
fn a_driver_that_requires_republish_is_published_again_each_sync_period() {
    real("republishes a CSI volume", || {
        let (mut env, opts) = csi_env("volumed-csi-e2e-republish-", "ReadWriteOnce", true);
        let objects = csi_objects("ReadWriteOnce").replace(
            "  attachRequired: false\n",
            "  attachRequired: false\n  requiresRepublish: true\n",
        );
        fs::write(env.objects.join("csi.yaml"), objects).unwrap();
        env.extra_args
            .extend(["--sync-frequency".to_owned(), "1s".to_owned()]);
        let driver = TestDriver::spawn(opts);
        env.write_pod("a.yaml", &csi_pod(POD_A));
        let want = [staging(&env), target(&env, POD_A)];
        let daemon = env.start();
        daemon.wait_until("staged and published", || mounted(&daemon, &want));
        daemon.wait_until("published three times", || driver.count(PUBLISH) >= 3);
        assert_eq!(driver.count(STAGE), 1, "{}", seen(&env, &driver));
        assert_staged_and_published_once(&env, &[POD_A]);

        daemon.stop();
        let before = driver.count(PUBLISH);
        let daemon = env.start();
        daemon.wait_until("published again after a restart", || {
            driver.count(PUBLISH) >= before + 2
        });
        assert_eq!(driver.count(STAGE), 1, "{}", seen(&env, &driver));

        delete_all_and_wait(&env, &driver, &daemon);
        let after = driver.count(PUBLISH);
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(driver.count(PUBLISH), after, "{}", seen(&env, &driver));
        assert_eq!(
            volume_calls(&driver).last().map(String::as_str),
            Some(UNSTAGE)
        );
        daemon.stop();
    });
}
