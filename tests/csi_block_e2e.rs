//! CSI raw block volumes (issue 43, item 1, the CSI half), end to end on
//! the real `volumed run` binary with the real test driver, which backs
//! each staged block volume with a real loop device:
//!
//! 1. a `volumeMode: Block` CSI PV is staged and published with the block
//!    access type at the kubelet's paths, the published device bound on
//!    the pod's file in the global map path and the pod's `volumeDevices`
//!    symlink made; bytes written through the pod's path reach the loop
//!    device; `vol_data.json`, the journal's intents and the runtime API's
//!    `devices` say so; a restart (graceful, then SIGKILL) re-issues no
//!    RPC; the pod going unmaps, unpublishes and unstages in the kubelet's
//!    order, and no loop device is left;
//! 2. a driver without raw block volumes (`--no-block`) refuses the block
//!    access type: the pod gets an error naming the volume and its
//!    `volumeMode`, and a filesystem pod on the same driver is served;
//! 3. a block pod deleted while the daemon was killed is unmapped from
//!    the journal after the restart;
//! 4. two pods on one block volume: one stage, a publish each (one
//!    retried), the last one out unstages;
//! 5. a driver without STAGE_UNSTAGE_VOLUME: published only;
//! 6. with `--journal off`, a SIGKILL restart finds the map by its bind
//!    and rebuilds it from the host as the kubelet does (uncertain, so
//!    staged and published once more, nothing bound or held twice), and
//!    the pod's deletion unmaps it whole;
//! 7. a hold lost outside volumed (its loop device detached, the bind
//!    and symlink kept) is not taken again at a restart: 0 RPCs, the map
//!    kept; the unmap then finds no hold and completes.
//!
//! Each test runs as root in its own private mount namespace with its own
//! scratch dir, driver and port, so they run in parallel. Every wait is
//! bounded.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use support::csi_driver::{DriverOpts, TestDriver};
use support::daemon::{Env, NODE, all_mounted, real};
use support::holds::{LoopSweep, loops_below};

const DRIVER: &str = "block.csi.volumed.dev";
const PV: &str = "pv-raw";
const HANDLE: &str = "vol-raw-1";
const VOLUME: &str = "kubernetes.io/csi/block.csi.volumed.dev^vol-raw-1";
const POD: &str = "raw-pod";
const STAGE: &str = "NodeStageVolume";
const PUBLISH: &str = "NodePublishVolume";
const UNPUBLISH: &str = "NodeUnpublishVolume";
const UNSTAGE: &str = "NodeUnstageVolume";
/// What the test writes through the pod's path.
const MAGIC: &[u8] = b"volumed csi raw block: through the pod's path";

/// The PV `pv` (handle `handle`, mode `mode`) bound to the claim `claim`,
/// and the claim.
fn pv_and_claim(pv: &str, handle: &str, claim: &str, mode: &str) -> String {
    format!(
        "apiVersion: v1
kind: PersistentVolume
metadata: {{name: {pv}}}
spec:
  volumeMode: {mode}
  capacity: {{storage: 16Mi}}
  accessModes: [ReadWriteOnce]
  claimRef: {{namespace: default, name: {claim}}}
  csi: {{driver: {DRIVER}, volumeHandle: {handle}}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: {claim}, namespace: default}}
spec: {{volumeName: {pv}, volumeMode: {mode}, accessModes: [ReadWriteOnce]}}
---
"
    )
}

/// The block PV and its claim, and the CSIDriver.
fn objects() -> String {
    format!(
        "{}apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {{name: {DRIVER}}}
spec: {{attachRequired: false}}
",
        pv_and_claim(PV, HANDLE, "raw", "Block")
    )
}

/// A pod `uid` mapping the claim `raw` at `/dev/xvda`.
fn block_pod(uid: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {uid}, namespace: default, uid: {uid}}}
spec:
  containers:
  - name: app
    image: busybox
    volumeDevices: [{{name: data, devicePath: /dev/xvda}}]
  volumes:
  - name: data
    persistentVolumeClaim: {{claimName: raw}}
"
    )
}

/// An env with the objects written and a driver's options (`--csi-driver`
/// naming its socket).
fn block_env(prefix: &str, extra_objects: &str) -> (Env, DriverOpts) {
    let mut env = Env::new(prefix);
    fs::write(
        env.objects.join("csi.yaml"),
        format!("{}---\n{extra_objects}", objects()),
    )
    .unwrap();
    let mut opts = DriverOpts::in_dir(DRIVER, &env.scratch.path().join("driver"));
    opts.node_id = Some(NODE.to_owned());
    env.extra_args = vec![
        "--csi-driver".to_owned(),
        format!("{DRIVER}={}", opts.endpoint.display()),
    ];
    (env, opts)
}

/// The kubelet's CSI block paths of [`PV`] for pod [`POD`].
struct Paths {
    staging: PathBuf,
    publish: PathBuf,
    volume_dir: PathBuf,
    pod_file: PathBuf,
    vol_data: PathBuf,
    link: PathBuf,
}

fn paths(env: &Env) -> Paths {
    let csi = env.root.join("plugins/kubernetes.io/csi/volumeDevices");
    Paths {
        staging: csi.join("staging").join(PV),
        publish: csi.join("publish").join(PV).join(POD),
        volume_dir: csi.join(PV),
        pod_file: csi.join(PV).join("dev").join(POD),
        vol_data: csi.join(PV).join("data/vol_data.json"),
        link: env
            .root
            .join("pods")
            .join(POD)
            .join("volumeDevices/kubernetes.io~csi")
            .join(PV),
    }
}

/// Nothing of a volume left once it is unmapped whole: no mount below
/// the root, none of `gone` there (not even as a dangling symlink), and
/// no loop device bound to a file below the root.
fn nothing_left(env: &Env, gone: &[&Path]) {
    let mounts = env.mounts_below_root();
    assert!(mounts.is_empty(), "{mounts:?}");
    for path in gone {
        assert!(fs::symlink_metadata(path).is_err(), "{path:?} is gone");
    }
    assert_eq!(
        loops_below(&env.root),
        Vec::<PathBuf>::new(),
        "no loop left"
    );
}

/// The volume RPCs the driver has logged, oldest first.
fn volume_calls(driver: &TestDriver) -> Vec<String> {
    driver
        .calls()
        .iter()
        .filter_map(|c| c["method"].as_str())
        .filter(|m| [STAGE, PUBLISH, UNPUBLISH, UNSTAGE].contains(m))
        .map(str::to_owned)
        .collect()
}

/// The (op, target kind) of every intent in `dump` for [`VOLUME`].
fn intents(dump: &Value) -> Vec<(String, String)> {
    dump["records"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["type"] == "intent" && r["volume"] == VOLUME)
        .map(|r| {
            (
                r["op"].as_str().unwrap_or_default().to_owned(),
                r["params"]["kind"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// A JSON file's object as key → string value.
fn vol_data(file: &Path) -> BTreeMap<String, String> {
    let text = fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let v: BTreeMap<String, Value> = serde_json::from_slice(&text).unwrap();
    v.into_iter()
        .map(|(k, v)| (k, v.as_str().unwrap().to_owned()))
        .collect()
}

#[test]
fn a_csi_block_pv_is_staged_published_and_mapped_at_the_kubelet_s_paths() {
    real("maps a CSI driver's loop device into a pod raw", || {
        let (mut env, opts) = block_env("volumed-csi-block", "");
        let _loops = LoopSweep(env.scratch.path().to_owned());
        let driver = TestDriver::spawn(opts);
        env.write_pod("p.yaml", &block_pod(POD));
        let p = paths(&env);
        let daemon = env.start();
        daemon.wait_until("the volume staged, published and mapped", || {
            all_mounted(&daemon.state(), &[p.staging.clone(), p.link.clone()])
        });

        // NodeStage and NodePublish once each, with the block access type
        // and the kubelet's staging dir and publish file
        assert_eq!(volume_calls(&driver), [STAGE, PUBLISH]);
        let calls = driver.calls();
        let stage = calls.iter().find(|c| c["method"] == STAGE).unwrap();
        assert_eq!(stage["access_type"], "block", "{stage:#}");
        assert_eq!(stage["volume_id"], HANDLE);
        assert_eq!(stage["staging_target_path"], p.staging.to_str().unwrap());
        let publish = calls.iter().find(|c| c["method"] == PUBLISH).unwrap();
        assert_eq!(publish["access_type"], "block", "{publish:#}");
        assert_eq!(publish["target_path"], p.publish.to_str().unwrap());
        assert_eq!(publish["staging_target_path"], p.staging.to_str().unwrap());
        assert_eq!(publish["readonly"], false);

        // the driver's loop device, bound on the publish file, then by
        // volumed on the pod's file in the global map path
        let loops = loops_below(&p.staging);
        assert_eq!(loops.len(), 1, "the driver's loop device: {loops:?}");
        let lo = &loops[0];
        // and volumed's hold, a loop device over the pod's map file
        let holds = loops_below(p.pod_file.parent().unwrap());
        assert_eq!(holds.len(), 1, "volumed holds the device: {holds:?}");
        let rdev = fs::metadata(lo).unwrap().rdev();
        for file in [&p.publish, &p.pod_file] {
            let m = fs::symlink_metadata(file).unwrap();
            assert!(m.file_type().is_block_device(), "{file:?}");
            assert_eq!(m.rdev(), rdev, "{file:?} shows the driver's loop device");
        }
        let mounts = env.mounts_below_root();
        let at = |path: &Path| mounts.iter().filter(|m| m.mount_point == path).count();
        assert_eq!(at(&p.pod_file), 1, "one bind at the pod's file: {mounts:?}");
        assert_eq!(at(&p.publish), 1, "the driver's bind: {mounts:?}");
        assert_eq!(mounts.len(), 2, "nothing else mounted: {mounts:?}");
        // the pod's symlink names the publish file, as the kubelet's does
        assert_eq!(fs::read_link(&p.link).unwrap(), p.publish);

        // raw bytes through the pod's path land on the loop device
        {
            let mut f = fs::OpenOptions::new().write(true).open(&p.link).unwrap();
            f.write_all(MAGIC).unwrap();
            f.sync_all().unwrap();
        }
        let mut back = vec![0; MAGIC.len()];
        fs::File::open(lo).unwrap().read_exact(&mut back).unwrap();
        assert_eq!(back, MAGIC, "read back from {lo:?}");

        // vol_data.json with the kubelet's block keys
        let data = vol_data(&p.vol_data);
        let want_keys = [
            "attachmentID",
            "driverName",
            "nodeName",
            "specVolID",
            "volumeHandle",
        ];
        assert_eq!(
            data.keys().map(String::as_str).collect::<Vec<_>>(),
            want_keys
        );
        assert_eq!(data["specVolID"], PV);
        assert_eq!(data["volumeHandle"], HANDLE);
        assert_eq!(data["driverName"], DRIVER);
        assert_eq!(data["nodeName"], NODE);
        assert!(data["attachmentID"].starts_with("csi-"), "{data:?}");

        // each step journaled with its intent, as a block target
        let want = [
            ("map_device".to_owned(), "block".to_owned()),
            ("map_pod_device".to_owned(), "block".to_owned()),
        ];
        let dump = env.dump();
        assert_eq!(intents(&dump), want, "{dump:#}");

        // the runtime API hands the container the pod's symlink
        let doc: Value =
            serde_json::from_str(&daemon.get("/v1/pods/raw-pod/containers/app/mounts")).unwrap();
        assert_eq!(doc["ready"], Value::Bool(true), "{doc:#}");
        assert_eq!(
            doc["devices"],
            json!([{
                "name": "data",
                "container_path": "/dev/xvda",
                "host_path": p.link.to_str().unwrap(),
                "permissions": "mrw",
            }]),
            "{doc:#}"
        );

        // a restart: the journal stands for both block targets, no RPC
        // is made again and nothing is bound twice
        daemon.stop();
        let daemon = env.start();
        daemon.wait_until("the maps are known again", || {
            all_mounted(&daemon.state(), &[p.staging.clone(), p.link.clone()])
        });
        std::thread::sleep(std::time::Duration::from_secs(1));
        assert_eq!(volume_calls(&driver), [STAGE, PUBLISH], "0 RPCs re-issued");
        assert_eq!(intents(&env.dump()), want, "nothing ran again");
        let mounts = env.mounts_below_root();
        assert_eq!(mounts.len(), 2, "{mounts:?}");
        // and after a SIGKILL, the journal not closed: the same
        daemon.kill();
        let daemon = env.start();
        daemon.wait_until("the maps are known again after a kill", || {
            all_mounted(&daemon.state(), &[p.staging.clone(), p.link.clone()])
        });
        std::thread::sleep(std::time::Duration::from_secs(1));
        assert_eq!(volume_calls(&driver), [STAGE, PUBLISH], "0 RPCs re-issued");
        assert_eq!(intents(&env.dump()), want, "nothing ran again");
        assert_eq!(env.mounts_below_root().len(), 2);

        // the pod goes: unmap, NodeUnpublish, NodeUnstage, in that order
        fs::remove_file(env.pods.join("p.yaml")).unwrap();
        daemon.wait_until("the volume unstaged", || driver.count(UNSTAGE) == 1);
        daemon.wait_until("the volume's dir removed", || !p.volume_dir.exists());
        assert_eq!(volume_calls(&driver), [STAGE, PUBLISH, UNPUBLISH, UNSTAGE]);
        let calls = driver.calls();
        let unpublish = calls.iter().find(|c| c["method"] == UNPUBLISH).unwrap();
        assert_eq!(unpublish["target_path"], p.publish.to_str().unwrap());
        let unstage = calls.iter().find(|c| c["method"] == UNSTAGE).unwrap();
        assert_eq!(unstage["staging_target_path"], p.staging.to_str().unwrap());
        let ops: Vec<String> = intents(&env.dump()).into_iter().map(|(op, _)| op).collect();
        assert_eq!(
            ops,
            [
                "map_device",
                "map_pod_device",
                "unmap_pod_device",
                "unmap_device"
            ]
        );
        nothing_left(&env, &[&p.link, &p.pod_file, &p.publish, &p.staging]);
        assert!(
            !p.publish.parent().unwrap().exists(),
            "the publish dir is gone"
        );
        // the orphan sweep the unmap asks for removes the pod's dir
        let pod_dir = env.root.join("pods").join(POD);
        daemon.wait_until("the pod's dir removed", || !pod_dir.exists());
        daemon.stop();
    });
}

#[test]
fn a_driver_without_raw_block_volumes_fails_only_the_block_pod() {
    real("refuses a block claim on a driver without block", || {
        let fs_pv = pv_and_claim("pv-fs", "vol-fs-1", "files", "Filesystem");
        let (mut env, mut opts) = block_env("volumed-csi-noblock", &fs_pv);
        let _loops = LoopSweep(env.scratch.path().to_owned());
        opts.no_block = true;
        let driver = TestDriver::spawn(opts);
        env.write_pod("p.yaml", &block_pod(POD));
        env.write_pod(
            "f.yaml",
            "apiVersion: v1
kind: Pod
metadata: {name: fs-pod, namespace: default, uid: fs-pod}
spec:
  containers:
  - name: app
    image: busybox
    volumeMounts: [{name: data, mountPath: /data}]
  volumes:
  - name: data
    persistentVolumeClaim: {claimName: files}
",
        );
        let p = paths(&env);
        let daemon = env.start();
        let fs_target = env
            .root
            .join("pods/fs-pod/volumes/kubernetes.io~csi/pv-fs/mount");
        daemon.wait_until("the filesystem pod is served", || {
            all_mounted(&daemon.state(), std::slice::from_ref(&fs_target))
        });
        daemon.wait_until("the block pod has its error", || {
            daemon.pod_errors(POD).contains("volumeMode is Block")
        });
        let errors = daemon.pod_errors(POD);
        assert!(errors.contains(VOLUME), "names the volume: {errors}");
        assert!(errors.contains("block access type"), "{errors}");
        assert!(errors.contains(DRIVER), "names the driver: {errors}");
        assert!(daemon.pod_errors("fs-pod").is_empty());
        // the refusal is final: nothing was published, nothing left bound
        assert_eq!(driver.count(PUBLISH), 1, "only the filesystem pod's");
        assert!(fs::symlink_metadata(&p.link).is_err());
        assert_eq!(loops_below(&env.root), Vec::<PathBuf>::new());
        daemon.stop();
    });
}

/// A block pod deleted while the daemon is down (SIGKILLed): the restart's merge
/// keeps the journal's maps, so the unmaps, NodeUnpublish and
/// NodeUnstage run from the journal's arguments, in that order, and
/// nothing is left: no bind, no link, no dir, no loop device.
#[test]
fn a_csi_block_pod_deleted_while_the_daemon_is_down_is_unmapped_after_the_restart() {
    real(
        "unmaps a CSI block pod that went while volumed was down",
        || {
            let (mut env, opts) = block_env("volumed-csi-block-down", "");
            let _loops = LoopSweep(env.scratch.path().to_owned());
            let driver = TestDriver::spawn(opts);
            env.write_pod("p.yaml", &block_pod(POD));
            let p = paths(&env);
            let daemon = env.start();
            daemon.wait_until("the volume staged, published and mapped", || {
                all_mounted(&daemon.state(), &[p.staging.clone(), p.link.clone()])
            });
            daemon.kill();

            env.remove_pod("p.yaml");
            let daemon = env.start();
            daemon.wait_until("the volume unstaged", || driver.count(UNSTAGE) == 1);
            daemon.wait_until("the volume's dir removed", || !p.volume_dir.exists());
            assert_eq!(volume_calls(&driver), [STAGE, PUBLISH, UNPUBLISH, UNSTAGE]);
            let ops: Vec<String> = intents(&env.dump()).into_iter().map(|(op, _)| op).collect();
            assert_eq!(
                ops,
                [
                    "map_device",
                    "map_pod_device",
                    "unmap_pod_device",
                    "unmap_device"
                ]
            );
            nothing_left(&env, &[&p.link, &p.pod_file, &p.publish, &p.staging]);
            daemon.stop();
        },
    );
}

/// Two pods on one ReadWriteMany block volume: one NodeStage, one
/// NodePublish per pod (each its own publish file and map file); the
/// first publish refused once as UNAVAILABLE is made again. The first
/// pod going unpublishes only its own file; the last one unstages.
#[test]
fn two_pods_map_one_csi_block_volume_and_the_last_one_out_unstages() {
    real("maps one CSI block volume into two pods", || {
        let (mut env, opts) = block_env("volumed-csi-block-two", "");
        let _loops = LoopSweep(env.scratch.path().to_owned());
        fs::write(
            env.objects.join("csi.yaml"),
            objects().replace("ReadWriteOnce", "ReadWriteMany"),
        )
        .unwrap();
        let driver = TestDriver::spawn(opts);
        driver.set_faults(json!([
            {"method": PUBLISH, "times": 1, "code": "Unavailable", "message": "try later"}
        ]));
        env.write_pod("a.yaml", &block_pod("pod-a"));
        env.write_pod("b.yaml", &block_pod("pod-b"));
        let csi = env.root.join("plugins/kubernetes.io/csi/volumeDevices");
        let staging = csi.join("staging").join(PV);
        let root = env.root.clone();
        let link = |uid: &str| {
            root.join("pods")
                .join(uid)
                .join("volumeDevices/kubernetes.io~csi")
                .join(PV)
        };
        let publish = |uid: &str| csi.join("publish").join(PV).join(uid);
        let daemon = env.start();
        daemon.wait_until("both pods mapped", || {
            all_mounted(
                &daemon.state(),
                &[staging.clone(), link("pod-a"), link("pod-b")],
            )
        });
        assert_eq!(driver.count(STAGE), 1);
        assert_eq!(driver.count(PUBLISH), 3, "two, one of them twice");
        let calls = driver.calls();
        let publishes: Vec<&str> = calls
            .iter()
            .filter(|c| c["method"] == PUBLISH)
            .filter_map(|c| c["target_path"].as_str())
            .collect();
        for uid in ["pod-a", "pod-b"] {
            assert!(
                publishes.contains(&publish(uid).to_str().unwrap()),
                "{publishes:?}"
            );
            assert_eq!(fs::read_link(link(uid)).unwrap(), publish(uid));
            let pod_file = csi.join(PV).join("dev").join(uid);
            assert!(
                fs::symlink_metadata(&pod_file)
                    .unwrap()
                    .file_type()
                    .is_block_device()
            );
        }
        // both pods see the one device
        {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .open(link("pod-a"))
                .unwrap();
            f.write_all(MAGIC).unwrap();
            f.sync_all().unwrap();
        }
        let mut back = vec![0; MAGIC.len()];
        fs::File::open(link("pod-b"))
            .unwrap()
            .read_exact(&mut back)
            .unwrap();
        assert_eq!(back, MAGIC);

        env.remove_pod("a.yaml");
        daemon.wait_until("pod A unpublished", || driver.count(UNPUBLISH) == 1);
        daemon.wait_until("pod A's link removed", || {
            fs::symlink_metadata(link("pod-a")).is_err()
        });
        std::thread::sleep(std::time::Duration::from_secs(1));
        assert_eq!(driver.count(UNSTAGE), 0, "pod B still maps it");
        let calls = driver.calls();
        let unpublish = calls.iter().find(|c| c["method"] == UNPUBLISH).unwrap();
        assert_eq!(unpublish["target_path"], publish("pod-a").to_str().unwrap());
        let mut back = vec![0; MAGIC.len()];
        fs::File::open(link("pod-b"))
            .unwrap()
            .read_exact(&mut back)
            .unwrap();
        assert_eq!(back, MAGIC, "pod B still reads the device");

        env.remove_pod("b.yaml");
        daemon.wait_until("the volume unstaged", || driver.count(UNSTAGE) == 1);
        daemon.wait_until("the volume's dir removed", || !csi.join(PV).exists());
        let calls = volume_calls(&driver);
        assert_eq!(calls.last().map(String::as_str), Some(UNSTAGE), "{calls:?}");
        assert_eq!(driver.count(UNPUBLISH), 2);
        nothing_left(&env, &[]);
        daemon.stop();
    });
}

/// A driver without STAGE_UNSTAGE_VOLUME: the kubelet's block mapper
/// makes the staging dir but never calls NodeStage, and NodePublish gets
/// no staging path; the driver attaches the device at publish and lets
/// it go at unpublish, the last call made.
#[test]
fn a_csi_block_volume_of_a_driver_that_does_not_stage_is_only_published() {
    real("maps a CSI block volume without staging", || {
        let (mut env, mut opts) = block_env("volumed-csi-block-nostage", "");
        let _loops = LoopSweep(env.scratch.path().to_owned());
        opts.no_stage = true;
        let driver = TestDriver::spawn(opts);
        env.write_pod("p.yaml", &block_pod(POD));
        let p = paths(&env);
        let daemon = env.start();
        daemon.wait_until("the volume published and mapped", || {
            all_mounted(&daemon.state(), &[p.staging.clone(), p.link.clone()])
        });
        assert_eq!(volume_calls(&driver), [PUBLISH]);
        let calls = driver.calls();
        let publish = calls.iter().find(|c| c["method"] == PUBLISH).unwrap();
        assert_eq!(publish["staging_target_path"], "", "{publish:#}");
        assert_eq!(publish["target_path"], p.publish.to_str().unwrap());
        assert!(
            p.staging.is_dir(),
            "the staging dir is made, as the kubelet does"
        );
        let loops = loops_below(&env.scratch.path().join("driver"));
        assert_eq!(loops.len(), 1, "the driver's: {loops:?}");
        let holds = loops_below(p.pod_file.parent().unwrap());
        assert_eq!(holds.len(), 1, "volumed's hold: {holds:?}");
        let rdev = fs::metadata(&loops[0]).unwrap().rdev();
        assert_eq!(fs::metadata(&p.link).unwrap().rdev(), rdev);
        assert_eq!(fs::symlink_metadata(&p.pod_file).unwrap().rdev(), rdev);

        env.remove_pod("p.yaml");
        daemon.wait_until("the volume's dir removed", || !p.volume_dir.exists());
        assert_eq!(volume_calls(&driver), [PUBLISH, UNPUBLISH]);
        assert!(!p.staging.exists(), "the staging dir is removed");
        assert!(
            env.mounts_below_root().is_empty(),
            "{:?}",
            env.mounts_below_root()
        );
        daemon.wait_until("no loop left", || {
            loops_below(env.scratch.path()).is_empty()
        });
        daemon.stop();
    });
}

/// `--journal off`: the host alone says what is mapped. A CSI block pod
/// mapped, the daemon SIGKILLed and started again: the scan finds the
/// map by volumed's bind on the pod's file and names the volume by its
/// `vol_data.json`; the pod's map and the staging dir are rebuilt
/// uncertain, as the kubelet's reconstruction marks a block volume's pod
/// and device, so exactly one NodeStage and one NodePublish are made
/// again (the kubelet's MapVolume stages a device not known as staged,
/// then publishes), and none is made for a pod that is gone. Nothing is
/// bound twice, the hold is reused, the device's bytes stay; the pod's
/// deletion then unmaps, unpublishes and unstages, leaving no loop device.
#[test]
fn with_the_journal_off_a_csi_block_map_is_rebuilt_from_the_host() {
    real("rebuilds a CSI block map from the host alone", || {
        let (mut env, opts) = block_env("volumed-csi-block-off", "");
        let _loops = LoopSweep(env.scratch.path().to_owned());
        env.extra_args
            .extend(["--journal".to_owned(), "off".to_owned()]);
        let driver = TestDriver::spawn(opts);
        env.write_pod("p.yaml", &block_pod(POD));
        let p = paths(&env);
        let daemon = env.start();
        daemon.wait_until("the volume staged, published and mapped", || {
            all_mounted(&daemon.state(), &[p.staging.clone(), p.link.clone()])
        });
        assert_eq!(volume_calls(&driver), [STAGE, PUBLISH]);
        let holds = loops_below(p.pod_file.parent().unwrap());
        assert_eq!(holds.len(), 1, "volumed's hold: {holds:?}");
        {
            let mut f = fs::OpenOptions::new().write(true).open(&p.link).unwrap();
            f.write_all(MAGIC).unwrap();
            f.sync_all().unwrap();
        }
        daemon.kill();

        let daemon = env.start();
        daemon.wait_until("the map rebuilt and mapped again", || {
            all_mounted(&daemon.state(), &[p.staging.clone(), p.link.clone()])
        });
        // a late call would be counted: let the reconciler run a while
        std::thread::sleep(std::time::Duration::from_secs(1));
        assert_eq!(
            volume_calls(&driver),
            [STAGE, PUBLISH, STAGE, PUBLISH],
            "the uncertain map staged and published once more, as the kubelet does"
        );
        assert_eq!(
            loops_below(p.pod_file.parent().unwrap()),
            holds,
            "the same hold, reused"
        );
        let mounts = env.mounts_below_root();
        let at = |path: &Path| mounts.iter().filter(|m| m.mount_point == path).count();
        assert_eq!(at(&p.pod_file), 1, "one bind at the pod's file: {mounts:?}");
        assert_eq!(at(&p.publish), 1, "the driver's bind: {mounts:?}");
        assert_eq!(mounts.len(), 2, "nothing else mounted: {mounts:?}");
        assert_eq!(fs::read_link(&p.link).unwrap(), p.publish);
        let mut back = vec![0; MAGIC.len()];
        fs::File::open(&p.link)
            .unwrap()
            .read_exact(&mut back)
            .unwrap();
        assert_eq!(back, MAGIC, "the device's bytes through the pod's path");

        // killed again, the pod deleted while down: unmapped from the host
        // alone, with no stage nor publish first
        daemon.kill();
        env.remove_pod("p.yaml");
        let daemon = env.start();
        daemon.wait_until("the volume unstaged", || driver.count(UNSTAGE) == 1);
        daemon.wait_until("the volume's dir removed", || !p.volume_dir.exists());
        assert_eq!(
            volume_calls(&driver),
            [STAGE, PUBLISH, STAGE, PUBLISH, UNPUBLISH, UNSTAGE]
        );
        let calls = driver.calls();
        let unpublish = calls.iter().find(|c| c["method"] == UNPUBLISH).unwrap();
        assert_eq!(unpublish["volume_id"], HANDLE, "named by vol_data.json");
        assert_eq!(unpublish["target_path"], p.publish.to_str().unwrap());
        nothing_left(&env, &[&p.link, &p.pod_file, &p.publish, &p.staging]);
        daemon.stop();
    });
}

/// A hold lost outside volumed while the bind and the symlink stay (an
/// operator's `losetup -d`): the restart's merge finds the map whole and
/// takes nothing again, as the kubelet's reconstruction never looks at
/// loop devices (docs/merge-table.md, "Raw block maps", says why): no
/// RPC, no hold, the pod keeps its device. The pod's deletion then
/// unmaps it (no hold to release: a warning), unpublishes and unstages.
#[test]
fn a_hold_lost_outside_volumed_is_not_taken_again_at_a_restart() {
    real("leaves a lost hold lost across a restart", || {
        let (mut env, opts) = block_env("volumed-csi-block-hold", "");
        let _loops = LoopSweep(env.scratch.path().to_owned());
        let driver = TestDriver::spawn(opts);
        env.write_pod("p.yaml", &block_pod(POD));
        let p = paths(&env);
        let daemon = env.start();
        daemon.wait_until("the volume staged, published and mapped", || {
            all_mounted(&daemon.state(), &[p.staging.clone(), p.link.clone()])
        });
        let holds = loops_below(p.pod_file.parent().unwrap());
        assert_eq!(holds.len(), 1, "volumed's hold: {holds:?}");
        daemon.kill();
        let status = std::process::Command::new("losetup")
            .arg("-d")
            .arg(&holds[0])
            .status()
            .unwrap();
        assert!(status.success(), "losetup -d {:?}", holds[0]);
        assert!(loops_below(p.pod_file.parent().unwrap()).is_empty());

        let daemon = env.start();
        daemon.wait_until("the map known again", || {
            all_mounted(&daemon.state(), &[p.staging.clone(), p.link.clone()])
        });
        std::thread::sleep(std::time::Duration::from_secs(1));
        assert_eq!(volume_calls(&driver), [STAGE, PUBLISH], "0 RPCs re-issued");
        assert!(
            loops_below(p.pod_file.parent().unwrap()).is_empty(),
            "the hold is not taken again"
        );
        assert_eq!(env.mounts_below_root().len(), 2, "the binds kept");
        assert_eq!(fs::read_link(&p.link).unwrap(), p.publish);

        fs::remove_file(env.pods.join("p.yaml")).unwrap();
        daemon.wait_until("the volume unstaged", || driver.count(UNSTAGE) == 1);
        assert_eq!(volume_calls(&driver), [STAGE, PUBLISH, UNPUBLISH, UNSTAGE]);
        nothing_left(&env, &[]);
        daemon.stop();
    });
}
