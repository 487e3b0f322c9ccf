//! Node expansion end to end: the real `volumed` binary watching the
//! API-server fake, the test CSI driver (`--caps …,EXPAND_VOLUME`) with a
//! real tmpfs, a claim whose PV grew beyond its status (the resize
//! controller's work, written into the fake by hand):
//!
//! - the pod's volume is mounted and grown at once: statvfs in the pod's
//!   dir shows the PV's size, the driver's log has NodeExpandVolume with
//!   the kubelet's arguments, the claim's status says the new capacity with
//!   no resize status or condition left (`NodeResizeInProgress` patched
//!   first), and the pod has a `FileSystemResizeSuccessful` Normal event;
//! - a driver that refuses the size (OUT_OF_RANGE) leaves the volume as it
//!   was and the claim `NodeResizeInfeasible` with a `NodeResizeError`
//!   condition carrying the driver's words; the pod stays mounted;
//! - a driver that answers a capacity below the request is not believed:
//!   the claim is marked the same way, with both figures in the message;
//! - a claim grown while its pod runs is expanded online, once, without
//!   an unmount or a second publish;
//! - the same on a real ext4 on a loop device (the driver's `ext4`
//!   backing): `resize2fs` grows it under the running pod, a file written
//!   before is intact, and deleting the pod unstages it and frees the loop
//!   device;
//! - a raw block claim (`volumeMode: Block`) mapped into its pod: the
//!   driver's loop device grows (`LOOP_SET_CAPACITY`), the device the
//!   pod's path shows is the PV's size, NodeExpandVolume had the block
//!   capability, the publish file and the staging dir, the claim's status
//!   says it once, and a restart calls nothing again;
//! - a NodeExpandVolume that hangs past `--csi-timeout`, and one whose
//!   driver dies after growing the volume and before answering, are each
//!   made again once (the RPC is idempotent) and only the answered call's
//!   success reaches the claim.
//!
//! Each test runs as root in its own private mount namespace.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use support::api_env::api_env;
use support::apiserver::FakeApiServer;
use support::csi_driver::{DriverOpts, TestDriver};
use support::daemon::{Daemon, Env, NODE, all_mounted, real};
use support::holds::{LoopSweep, loops_below};

const DRIVER: &str = "expand.csi.volumed.test";
const MI: u64 = 1 << 20;

fn driver_opts(env: &mut Env) -> DriverOpts {
    let mut opts = DriverOpts::in_dir(DRIVER, &env.scratch.path().join("driver"));
    opts.caps = Some("GET_VOLUME_STATS,EXPAND_VOLUME".to_owned());
    env.extra_args.extend([
        "--csi-driver".to_owned(),
        format!("{DRIVER}={}", opts.endpoint.display()),
    ]);
    opts
}

/// A PV of 8 MiB whose driver makes a 4 MiB tmpfs (its `size=` mount
/// option), its claim still saying 4 MiB with the node's turn to resize,
/// a CSIDriver that needs no attaching, and a pod mounting the claim.
fn put_objects(api: &FakeApiServer) {
    let objects = [
        json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pv-grow"},
            "spec": {"capacity": {"storage": "8Mi"}, "accessModes": ["ReadWriteOnce"],
                "mountOptions": ["size=4m"],
                "claimRef": {"namespace": "apps", "name": "data"},
                "csi": {"driver": DRIVER, "volumeHandle": "vol-grow", "fsType": "ext4"}}}),
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "namespace": "apps"},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-grow",
                "resources": {"requests": {"storage": "8Mi"}}},
            "status": {"phase": "Bound",
                "capacity": {"storage": "4Mi"},
                "allocatedResources": {"storage": "8Mi"},
                "allocatedResourceStatuses": {"storage": "NodeResizePending"},
                "conditions": [{"type": "FileSystemResizePending", "status": "True",
                    "message": "Waiting for user to (re-)start a pod to finish file system resize of volume on node."}]}}),
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
            "metadata": {"name": DRIVER}, "spec": {"attachRequired": false}}),
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "grower", "namespace": "apps", "uid": "uid-grow"},
            "spec": {"nodeName": NODE,
                "containers": [{"name": "app", "image": "busybox"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]},
            "status": {"phase": "Running"}}),
    ];
    for o in objects {
        api.put(o);
    }
}

fn target(env: &Env) -> PathBuf {
    env.pod_volume("uid-grow", "kubernetes.io~csi", "pv-grow")
        .join("mount")
}

fn fs_bytes(path: &Path) -> u64 {
    let vfs = nix::sys::statvfs::statvfs(path).expect("statvfs");
    vfs.blocks() * vfs.fragment_size()
}

fn claim(api: &FakeApiServer) -> Value {
    api.get("v1", "PersistentVolumeClaim", Some("apps"), "data")
        .expect("the claim")
}

fn mounted(daemon: &Daemon, path: &Path) -> bool {
    all_mounted(&daemon.state(), &[path.to_path_buf()])
}

fn wait_published(daemon: &Daemon, target: &Path) {
    daemon.wait_until_showing(
        "the CSI volume is published",
        || mounted(daemon, target),
        || daemon.get("/debug/state"),
    );
}

fn wait_claim_size(daemon: &Daemon, api: &FakeApiServer, size: &str) {
    daemon.wait_until_showing(
        "the claim's status says the new size",
        || claim(api)["status"]["capacity"]["storage"] == json!(size),
        || format!("{:#}\n{}", claim(api), daemon.log_tail()),
    );
}

/// The claim's PATCHes of its status that set a capacity.
/// The claim's `NodeResizeError` condition, if it has one.
fn resize_error(api: &FakeApiServer) -> Option<Value> {
    claim(api)["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "NodeResizeError")
        .cloned()
}

/// Waits for the claim's `NodeResizeError` (`what` names why) and
/// returns its message.
fn wait_resize_error(daemon: &Daemon, api: &FakeApiServer, what: &str) -> String {
    daemon.wait_until_showing(
        what,
        || resize_error(api).is_some(),
        || format!("{:#}\n{}", claim(api), daemon.log_tail()),
    );
    let error = resize_error(api).unwrap_or_else(|| panic!("{what}: the condition went"));
    error["message"].as_str().unwrap_or_default().to_owned()
}

fn capacity_patches(api: &FakeApiServer) -> Vec<Value> {
    api.requests()
        .into_iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with("/persistentvolumeclaims/data/status"))
        .filter_map(|r| serde_json::from_str::<Value>(&r.body).ok())
        .filter(|b| b["status"].get("capacity").is_some())
        .collect()
}

/// The claim of `put_objects` grown by its controller: the PV at `to`,
/// the claim's status at `from` with the node's turn to resize.
fn grow_claim(api: &FakeApiServer, to: &str) {
    let mut pv = api
        .get("v1", "PersistentVolume", None, "pv-grow")
        .expect("the PV");
    pv["spec"]["capacity"]["storage"] = json!(to);
    api.put(pv);
    let mut c = claim(api);
    c["status"]["allocatedResources"] = json!({"storage": to});
    c["status"]["allocatedResourceStatuses"] = json!({"storage": "NodeResizePending"});
    api.put(c);
}

/// `put_objects` with nothing pending: the PV and the claim both at
/// `size`, and the PV's volume attributes set to `attributes`.
fn settled_objects(api: &FakeApiServer, size: &str, attributes: Value) {
    put_objects(api);
    let mut pv = api
        .get("v1", "PersistentVolume", None, "pv-grow")
        .expect("the PV");
    pv["spec"]["capacity"]["storage"] = json!(size);
    if attributes != json!({}) {
        pv["spec"]["csi"]["volumeAttributes"] = attributes;
        // an ext4 image is sized by its attributes, not a tmpfs option
        pv["spec"]
            .as_object_mut()
            .expect("a spec")
            .remove("mountOptions");
    }
    api.put(pv);
    let mut c = claim(api);
    c["status"] = json!({"phase": "Bound", "capacity": {"storage": size}});
    api.put(c);
}

/// The loop devices backing `image` (`losetup -j`).
fn loops_of(image: &Path) -> Vec<String> {
    let out = Command::new("losetup")
        .args(["-n", "-O", "NAME", "-j"])
        .arg(image)
        .output()
        .expect("run losetup");
    assert!(out.status.success(), "losetup -j: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect()
}

/// A block device's size in bytes, from sysfs (`/dev/loop3` → 512-byte
/// sectors in `/sys/block/loop3/size`).
fn device_bytes(device: &str) -> u64 {
    let name = device.trim_start_matches("/dev/");
    let text = std::fs::read_to_string(format!("/sys/block/{name}/size")).expect("its size");
    text.trim().parse::<u64>().expect("a number") * 512
}

#[test]
fn a_claim_grown_by_its_controller_is_grown_on_the_node_when_mounted() {
    real("grows a CSI volume on the node", || {
        let (mut env, api) = api_env("volumed-expand-e2e-grow-");
        let driver = TestDriver::spawn(driver_opts(&mut env));
        put_objects(&api);
        let daemon = env.start();
        let target = target(&env);
        // the claim's patch is sent as the expansion returns, the job that
        // mounted and grew the volume reports back after it: either first
        daemon.wait_until_showing(
            "the claim's status says the new size, the volume mounted",
            || {
                claim(&api)["status"]["capacity"]["storage"] == json!("8Mi")
                    && mounted(&daemon, &target)
            },
            || format!("{:#}\n{}", claim(&api), daemon.get("/debug/state")),
        );
        assert_eq!(fs_bytes(&target), 8 * MI, "the pod sees the PV's size");

        let status = &claim(&api)["status"];
        assert!(
            status["allocatedResourceStatuses"].get("storage").is_none(),
            "{status:#}"
        );
        assert!(
            !status["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "FileSystemResizePending"),
            "{status:#}"
        );
        assert_eq!(status["phase"], "Bound", "the rest of the status kept");

        let calls: Vec<Value> = driver
            .calls()
            .into_iter()
            .filter(|c| c["method"] == "NodeExpandVolume")
            .collect();
        assert_eq!(calls.len(), 1, "{calls:#?}");
        assert_eq!(calls[0]["volume_path"], target.display().to_string());
        assert_eq!(calls[0]["required_bytes"], 8 * MI);
        assert_eq!(calls[0]["access_type"], "mount");
        assert!(
            calls[0]["staging_target_path"]
                .as_str()
                .is_some_and(|s| s.ends_with("/globalmount")),
            "{calls:#?}"
        );

        // NodeResizeInProgress first, then the new capacity
        let patches: Vec<Value> = api
            .requests()
            .into_iter()
            .filter(|r| {
                r.method == "PATCH" && r.path.ends_with("/persistentvolumeclaims/data/status")
            })
            .map(|r| serde_json::from_str(&r.body).expect("a JSON body"))
            .collect();
        assert_eq!(patches.len(), 2, "{patches:#?}");
        assert_eq!(
            patches[0]["status"]["allocatedResourceStatuses"]["storage"],
            "NodeResizeInProgress"
        );
        assert_eq!(patches[1]["status"]["capacity"]["storage"], "8Mi");

        daemon.wait_until_showing(
            "a FileSystemResizeSuccessful Normal event on the pod",
            || {
                api.list("v1", "Event").iter().any(|e| {
                    e["reason"] == "FileSystemResizeSuccessful"
                        && e["type"] == "Normal"
                        && e["involvedObject"]["name"] == "grower"
                })
            },
            || format!("{:#?}", api.list("v1", "Event")),
        );
        daemon.stop();
    });
}

#[test]
fn a_size_the_driver_refuses_marks_the_claim_infeasible_and_keeps_the_mount() {
    real("a refused node expansion", || {
        let (mut env, api) = api_env("volumed-expand-e2e-refuse-");
        let opts = driver_opts(&mut env);
        support::csi_driver::write_faults(
            &opts.state,
            &json!([{"method": "NodeExpandVolume", "code": "OutOfRange", "message": "no room for 8Mi"}]),
        );
        let driver = TestDriver::spawn(opts);
        put_objects(&api);
        let daemon = env.start();
        let target = target(&env);
        daemon.wait_until_showing(
            "the claim is marked infeasible",
            || {
                claim(&api)["status"]["allocatedResourceStatuses"]["storage"]
                    == json!("NodeResizeInfeasible")
            },
            || format!("{:#}\n{}", claim(&api), daemon.log_tail()),
        );
        let status = &claim(&api)["status"];
        let error =
            resize_error(&api).unwrap_or_else(|| panic!("a NodeResizeError condition: {status:#}"));
        assert_eq!(error["status"], "True");
        assert!(
            error["message"].as_str().is_some_and(
                |m| m.starts_with("failed to expand pvc with") && m.contains("no room for 8Mi")
            ),
            "{error:#}"
        );
        assert_eq!(status["capacity"]["storage"], "4Mi", "not grown");
        // the job reports back after the claim is told: wait for it
        daemon.wait_until("the mount stays", || mounted(&daemon, &target));
        assert_eq!(fs_bytes(&target), 4 * MI, "the volume as it was");
        assert_eq!(driver.count("NodeExpandVolume"), 1);
        daemon.stop();
    });
}

#[test]
fn a_driver_answering_less_than_asked_is_not_believed() {
    real("a short NodeExpandVolume answer", || {
        let (mut env, api) = api_env("volumed-expand-e2e-short-");
        let opts = driver_opts(&mut env);
        // the driver grows the tmpfs, then says it holds 1 KiB
        support::csi_driver::write_faults(
            &opts.state,
            &json!([{"method": "NodeExpandVolume", "capacity_bytes": 1024}]),
        );
        let _driver = TestDriver::spawn(opts);
        put_objects(&api);
        let daemon = env.start();
        daemon.wait_until_showing(
            "the claim is marked infeasible",
            || {
                claim(&api)["status"]["allocatedResourceStatuses"]["storage"]
                    == json!("NodeResizeInfeasible")
            },
            || format!("{:#}\n{}", claim(&api), daemon.log_tail()),
        );
        let status = &claim(&api)["status"];
        let error =
            resize_error(&api).unwrap_or_else(|| panic!("a NodeResizeError condition: {status:#}"));
        let message = error["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("capacity_bytes 1024")
                && message.contains("required_bytes 8388608")
                && message.contains("pod uid-grow: volume pv-grow:"),
            "{message}"
        );
        assert_eq!(status["capacity"]["storage"], "4Mi", "no success reported");
        let target = target(&env);
        daemon.wait_until("the mount stays", || mounted(&daemon, &target));
        daemon.stop();
    });
}

#[test]
fn a_mounted_claim_grown_later_is_expanded_online() {
    real("grows a mounted CSI volume", || {
        let (mut env, api) = api_env("volumed-expand-e2e-online-");
        let driver = TestDriver::spawn(driver_opts(&mut env));
        // nothing pending yet: the PV and the claim both say 4 MiB
        settled_objects(&api, "4Mi", json!({}));
        let daemon = env.start();
        let target = target(&env);
        wait_published(&daemon, &target);
        assert_eq!(fs_bytes(&target), 4 * MI);
        assert_eq!(driver.count("NodeExpandVolume"), 0, "nothing pending");

        // the resize controller's work: the PV grows, then the claim says
        // it is the node's turn (the node may see the PV first and expand
        // on it alone, an older resizer's way: its status patch then meets
        // the claim's newer version, and is made again on it)
        grow_claim(&api, "8Mi");
        wait_claim_size(&daemon, &api, "8Mi");
        assert_eq!(fs_bytes(&target), 8 * MI, "grown under the running pod");
        assert!(mounted(&daemon, &target), "never unmounted");
        assert_eq!(driver.count("NodeExpandVolume"), 1);
        assert_eq!(driver.count("NodeUnpublishVolume"), 0);
        assert_eq!(driver.count("NodePublishVolume"), 1, "no remount");
        // the claim's status caught up: no second call
        std::thread::sleep(std::time::Duration::from_millis(500));
        assert_eq!(driver.count("NodeExpandVolume"), 1);
        daemon.stop();
    });
}

#[test]
fn an_ext4_volume_is_grown_by_resize2fs_where_the_kernel_lets_it() {
    real("grows a mounted ext4 on a loop device", || {
        let (mut env, api) = api_env("volumed-expand-e2e-ext4-");
        let driver = TestDriver::spawn(driver_opts(&mut env));
        settled_objects(
            &api,
            "16Mi",
            json!({"volumed.test/backing": "ext4", "volumed.test/size-mib": "16"}),
        );
        let daemon = env.start();
        let target = target(&env);
        daemon.wait_until_showing(
            "the ext4 volume is published",
            || mounted(&daemon, &target),
            || daemon.get("/debug/state"),
        );
        let image = driver
            .opts()
            .state
            .join("images")
            .join(format!("{}.img", hex("vol-grow")));
        let loops = loops_of(&image);
        assert_eq!(loops.len(), 1, "one loop device holds the image: {loops:?}");
        assert_eq!(device_bytes(&loops[0]), 16 * MI);
        let before = fs_bytes(&target);
        assert!(before < 16 * MI, "an ext4 of 16 MiB: {before}");
        let kept = target.join("kept");
        std::fs::write(&kept, b"written before the resize").expect("write in the volume");

        grow_claim(&api, "32Mi");
        if !has_cap_sys_resource() {
            // the kernel grows a mounted ext4 only for CAP_SYS_RESOURCE,
            // which some sandboxes withhold even from root: the driver's
            // resize2fs fails, and that failure is what this host can show
            eprintln!(
                "note: no CAP_SYS_RESOURCE here, so resize2fs cannot grow a mounted ext4; \
                 checking that the driver's failure leaves the claim and the volume as they were"
            );
            daemon.wait_until_showing(
                "NodeExpandVolume tried again after the driver's failure",
                || driver.count("NodeExpandVolume") >= 2,
                || daemon.log_tail(),
            );
            assert!(capacity_patches(&api).is_empty(), "no success reported");
            assert_eq!(claim(&api)["status"]["capacity"]["storage"], "16Mi");
            assert_eq!(fs_bytes(&target), before, "the filesystem as it was");
        } else {
            daemon.wait_until_showing(
                "the claim's status says the new size",
                || claim(&api)["status"]["capacity"]["storage"] == json!("32Mi"),
                || format!("{:#}\n{}", claim(&api), daemon.log_tail()),
            );
            assert_eq!(device_bytes(&loops[0]), 32 * MI, "the loop device grew");
            let after = fs_bytes(&target);
            assert!(
                after > before + 12 * MI,
                "resize2fs grew the filesystem the pod sees: {before} -> {after}"
            );
            assert_eq!(driver.count("NodeExpandVolume"), 1);
        }
        assert_eq!(
            std::fs::read(&kept).expect("read it back"),
            b"written before the resize",
            "the data survives"
        );
        assert_eq!(driver.count("NodePublishVolume"), 1, "no remount");
        assert_eq!(driver.count("NodeUnpublishVolume"), 0);

        // the pod goes: unpublished, unstaged, and the loop device with it
        assert!(api.delete("v1", "Pod", Some("apps"), "grower"));
        daemon.wait_until_showing(
            "the volume is unstaged and its loop device gone",
            || driver.count("NodeUnstageVolume") == 1 && loops_of(&image).is_empty(),
            || format!("{:?}\n{}", loops_of(&image), daemon.log_tail()),
        );
        daemon.stop();
    });
}

/// Whether this process holds CAP_SYS_RESOURCE (bit 24 of `CapEff`).
fn has_cap_sys_resource() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").expect("read our status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 24) != 0)
}

/// `text`'s bytes in hex, as the driver names an image.
fn hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn an_expansion_past_the_csi_timeout_is_made_again_once() {
    real("a NodeExpandVolume that hangs", || {
        let (mut env, api) = api_env("volumed-expand-e2e-hang-");
        let opts = driver_opts(&mut env);
        env.extra_args
            .extend(["--csi-timeout".to_owned(), "1".to_owned()]);
        support::csi_driver::write_faults(
            &opts.state,
            &json!([{"method": "NodeExpandVolume", "hang": true, "times": 1}]),
        );
        let driver = TestDriver::spawn(opts);
        settled_objects(&api, "4Mi", json!({}));
        let daemon = env.start();
        let target = target(&env);
        wait_published(&daemon, &target);
        grow_claim(&api, "8Mi");
        wait_claim_size(&daemon, &api, "8Mi");
        assert_eq!(fs_bytes(&target), 8 * MI);
        assert_eq!(
            driver.count("NodeExpandVolume"),
            2,
            "the hung call, then one more"
        );
        assert_eq!(
            capacity_patches(&api).len(),
            1,
            "one success, reported once"
        );
        // the job reports back after the claim is told: wait for it
        daemon.wait_until("the mount stays", || mounted(&daemon, &target));
        assert_eq!(driver.count("NodeUnpublishVolume"), 0);
        daemon.stop();
    });
}

#[test]
fn an_expansion_whose_driver_dies_mid_call_is_made_again_once() {
    real("a driver killed inside NodeExpandVolume", || {
        let (mut env, api) = api_env("volumed-expand-e2e-die-");
        let opts = driver_opts(&mut env);
        // the driver grows the tmpfs, then dies before it answers
        support::csi_driver::write_faults(
            &opts.state,
            &json!([{"method": "NodeExpandVolume", "die_after_work": true, "times": 1}]),
        );
        let mut driver = TestDriver::spawn(opts.clone());
        settled_objects(&api, "4Mi", json!({}));
        let daemon = env.start();
        let target = target(&env);
        wait_published(&daemon, &target);
        grow_claim(&api, "8Mi");
        let status = driver.wait_exit(Duration::from_secs(30));
        assert!(!status.success(), "the driver died: {status:?}");
        assert_eq!(driver.count("NodeExpandVolume"), 1);
        assert!(
            capacity_patches(&api).is_empty(),
            "no answer, so no success: {:#?}",
            capacity_patches(&api)
        );
        let driver = TestDriver::spawn(opts);
        wait_claim_size(&daemon, &api, "8Mi");
        let calls: Vec<Value> = driver
            .calls()
            .into_iter()
            .filter(|c| c["method"] == "NodeExpandVolume")
            .collect();
        assert_eq!(calls.len(), 2, "{calls:#?}");
        assert_ne!(
            calls[0]["pid"], calls[1]["pid"],
            "made again by the new driver"
        );
        assert_eq!(fs_bytes(&target), 8 * MI);
        assert_eq!(
            capacity_patches(&api).len(),
            1,
            "one success, reported once"
        );
        // the job reports back after the claim is told: wait for it
        daemon.wait_until("the mount stays", || mounted(&daemon, &target));
        assert_eq!(driver.count("NodeUnpublishVolume"), 0);
        daemon.stop();
    });
}

/// The block PV `pv-raw` (its driver's loop device is 16 MiB) grown to
/// 32 MiB by its controller, its claim at 16 MiB with the node's turn,
/// the CSIDriver, and a pod mapping the claim raw.
fn put_block_objects(api: &FakeApiServer) {
    let objects = [
        json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pv-raw"},
            "spec": {"capacity": {"storage": "32Mi"}, "accessModes": ["ReadWriteOnce"],
                "volumeMode": "Block",
                "claimRef": {"namespace": "apps", "name": "raw"},
                "csi": {"driver": DRIVER, "volumeHandle": "vol-raw"}}}),
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "raw", "namespace": "apps"},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-raw",
                "volumeMode": "Block",
                "resources": {"requests": {"storage": "32Mi"}}},
            "status": {"phase": "Bound",
                "capacity": {"storage": "16Mi"},
                "allocatedResources": {"storage": "32Mi"},
                "allocatedResourceStatuses": {"storage": "NodeResizePending"}}}),
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
            "metadata": {"name": DRIVER}, "spec": {"attachRequired": false}}),
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "raw-pod", "namespace": "apps", "uid": "uid-raw"},
            "spec": {"nodeName": NODE,
                "containers": [{"name": "app", "image": "busybox",
                    "volumeDevices": [{"name": "data", "devicePath": "/dev/xvda"}]}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "raw"}}]},
            "status": {"phase": "Running"}}),
    ];
    for o in objects {
        api.put(o);
    }
}

/// The size in bytes of the block device `path` shows (a symlink
/// followed), from sysfs by its device number.
fn device_bytes_at(path: &Path) -> u64 {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    let m = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        m.file_type().is_block_device(),
        "{} is a device",
        path.display()
    );
    let rdev = m.rdev();
    let sysfs = format!(
        "/sys/dev/block/{}:{}/size",
        nix::sys::stat::major(rdev),
        nix::sys::stat::minor(rdev)
    );
    let text = std::fs::read_to_string(&sysfs).unwrap_or_else(|e| panic!("{sysfs}: {e}"));
    text.trim().parse::<u64>().expect("a number") * 512
}

#[test]
fn a_mapped_block_claim_grown_by_its_controller_is_grown_on_the_node() {
    real("grows a CSI raw block volume on the node", || {
        grow_block(true)
    });
}

/// The same with a driver that does not stage: no staging path is sent,
/// the device is the one the publish made.
#[test]
fn a_mapped_block_claim_of_a_driver_that_does_not_stage_is_grown() {
    real("grows an unstaged CSI raw block volume", || {
        grow_block(false)
    });
}

/// A mapped block claim grown from 16 to 32 MiB, with a driver that
/// stages (`stage`) or not.
fn grow_block(stage: bool) {
    let (mut env, api) = api_env("volumed-expand-e2e-block-");
    let _loops = LoopSweep(env.scratch.path().to_owned());
    let mut opts = driver_opts(&mut env);
    opts.no_stage = !stage;
    let driver = TestDriver::spawn(opts);
    put_block_objects(&api);
    let csi = env.root.join("plugins/kubernetes.io/csi/volumeDevices");
    let staging = csi.join("staging/pv-raw");
    let publish = csi.join("publish/pv-raw/uid-raw");
    let link = env
        .root
        .join("pods/uid-raw/volumeDevices/kubernetes.io~csi/pv-raw");
    let daemon = env.start();
    let claim_of = || {
        api.get("v1", "PersistentVolumeClaim", Some("apps"), "raw")
            .expect("the claim")
    };
    daemon.wait_until_showing(
        "the block claim's status says the new size, the device mapped",
        || {
            claim_of()["status"]["capacity"]["storage"] == json!("32Mi")
                && all_mounted(&daemon.state(), &[staging.clone(), link.clone()])
        },
        || format!("{:#}\n{}", claim_of(), daemon.log_tail()),
    );
    // the device the pod's path shows grew, with no remap
    assert_eq!(
        device_bytes_at(&link),
        32 * MI,
        "the pod sees the PV's size"
    );

    // NodeExpandVolume once, with the kubelet's block arguments: the
    // publish file (the device path) and the staging dir
    let calls: Vec<Value> = driver
        .calls()
        .into_iter()
        .filter(|c| c["method"] == "NodeExpandVolume")
        .collect();
    assert_eq!(calls.len(), 1, "{calls:#?}");
    assert_eq!(calls[0]["access_type"], "block", "{calls:#?}");
    assert_eq!(calls[0]["volume_path"], publish.display().to_string());
    let sent_staging = match stage {
        true => staging.display().to_string(),
        false => String::new(),
    };
    assert_eq!(calls[0]["staging_target_path"], sent_staging);
    assert_eq!(calls[0]["required_bytes"], 32 * MI);
    assert_eq!(driver.count("NodePublishVolume"), 1, "no remap");

    // the claim's status as for a filesystem: in progress, then the
    // capacity, no resize status left, said once
    let status = &claim_of()["status"];
    assert!(
        status["allocatedResourceStatuses"].get("storage").is_none(),
        "{status:#}"
    );
    let patches: Vec<Value> = api
        .requests()
        .into_iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with("/persistentvolumeclaims/raw/status"))
        .filter_map(|r| serde_json::from_str::<Value>(&r.body).ok())
        .collect();
    let capacity: Vec<&Value> = patches
        .iter()
        .filter(|b| b["status"].get("capacity").is_some())
        .collect();
    assert_eq!(capacity.len(), 1, "{patches:#?}");
    assert_eq!(capacity[0]["status"]["capacity"]["storage"], "32Mi");
    assert_eq!(
        patches[0]["status"]["allocatedResourceStatuses"]["storage"],
        "NodeResizeInProgress"
    );
    daemon.wait_until_showing(
        "a FileSystemResizeSuccessful Normal event on the pod",
        || {
            api.list("v1", "Event").iter().any(|e| {
                e["reason"] == "FileSystemResizeSuccessful"
                    && e["involvedObject"]["name"] == "raw-pod"
            })
        },
        || format!("{:#?}", api.list("v1", "Event")),
    );

    // a restart re-issues nothing: the claim says the new size
    daemon.stop();
    let daemon = env.start();
    daemon.wait_until("the map stands after the restart", || {
        all_mounted(&daemon.state(), &[staging.clone(), link.clone()])
    });
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(driver.count("NodeExpandVolume"), 1, "not again");
    assert_eq!(driver.count("NodeStageVolume"), usize::from(stage));
    assert_eq!(driver.count("NodePublishVolume"), 1);
    assert_eq!(device_bytes_at(&link), 32 * MI);

    // the pod goes: unmapped, unpublished (and unstaged), the
    // driver's device gone
    assert!(api.delete("v1", "Pod", Some("apps"), "raw-pod"));
    let scratch = env.scratch.path().to_owned();
    daemon.wait_until_showing(
        "the volume is unpublished and no loop device left",
        || {
            driver.count("NodeUnpublishVolume") == 1
                && driver.count("NodeUnstageVolume") == usize::from(stage)
                && loops_below(&scratch).is_empty()
        },
        || daemon.log_tail(),
    );
    daemon.stop();
}

/// A PV's `nodeExpandSecretRef` is read from the API server when the call
/// is made: while the Secret is missing no call is made, the claim's
/// `NodeResizeError` names the pod, the volume and the Secret and no
/// success is reported; once it is there the call carries its data,
/// which is never logged nor journaled.
#[test]
fn the_node_expand_secret_reaches_the_driver_and_a_missing_one_is_named() {
    real("NodeExpandVolume with nodeExpandSecretRef", || {
        let (mut env, api) = api_env("volumed-expand-e2e-secret-");
        let driver = TestDriver::spawn(driver_opts(&mut env));
        put_objects(&api);
        let mut pv = api
            .get("v1", "PersistentVolume", None, "pv-grow")
            .expect("the PV");
        pv["spec"]["csi"]["nodeExpandSecretRef"] = json!({"namespace": "apps", "name": "expand-s"});
        api.put(pv);
        let daemon = env.start();
        let target = target(&env);
        let message = wait_resize_error(&daemon, &api, "the claim says the Secret is missing");
        for part in [
            "pod uid-grow",
            "volume pv-grow",
            "nodeExpandSecretRef",
            "Secret apps/expand-s",
        ] {
            assert!(message.contains(part), "{part:?} in {message}");
        }
        assert_eq!(driver.count("NodeExpandVolume"), 0, "no call without it");
        assert!(capacity_patches(&api).is_empty(), "no success reported");
        assert_ne!(
            claim(&api)["status"]["allocatedResourceStatuses"]["storage"],
            "NodeResizeInfeasible",
            "retried, not given up"
        );

        api.put(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "expand-s", "namespace": "apps"},
            "stringData": {"password": "s3cr3t-expand"}}));
        wait_claim_size(&daemon, &api, "8Mi");
        assert_eq!(fs_bytes(&target), 8 * MI);
        let calls: Vec<Value> = driver
            .calls()
            .into_iter()
            .filter(|c| c["method"] == "NodeExpandVolume")
            .collect();
        assert_eq!(calls.len(), 1, "{calls:#?}");
        assert_eq!(calls[0]["secrets"], json!({"password": "s3cr3t-expand"}));
        assert!(
            resize_error(&api).is_none(),
            "the error condition is gone once grown"
        );
        assert!(
            !daemon.log().contains("s3cr3t-expand"),
            "a Secret's data is never logged"
        );
        daemon.stop();
        assert!(
            !env.dump().to_string().contains("s3cr3t-expand"),
            "nor journaled"
        );
    });
}

/// A PV whose capacity is below its claim's status (a shrink, which no
/// volume undergoes): the volume is mounted as it is, no call is made,
/// and the claim's `NodeResizeError` names the pod, the volume and both
/// fields, its capacity unchanged and nothing marked infeasible.
#[test]
fn a_pv_smaller_than_its_claim_is_an_error_on_the_claim_and_no_call() {
    real("a PV below its claim", || {
        let (mut env, api) = api_env("volumed-expand-e2e-shrink-");
        let driver = TestDriver::spawn(driver_opts(&mut env));
        settled_objects(&api, "8Mi", json!({}));
        let mut pv = api
            .get("v1", "PersistentVolume", None, "pv-grow")
            .expect("the PV");
        pv["spec"]["capacity"]["storage"] = json!("4Mi");
        api.put(pv);
        let daemon = env.start();
        let target = target(&env);
        let message = wait_resize_error(&daemon, &api, "the claim says the PV is below it");
        for part in [
            "pod uid-grow",
            "volume data",
            "PersistentVolume pv-grow spec.capacity.storage (4194304 bytes)",
            "claim apps/data status.capacity.storage (8388608 bytes)",
        ] {
            assert!(message.contains(part), "{part:?} in {message}");
        }
        wait_published(&daemon, &target);
        assert_eq!(driver.count("NodeExpandVolume"), 0, "never shrunk");
        let status = &claim(&api)["status"];
        assert_eq!(status["capacity"]["storage"], "8Mi", "{status:#}");
        assert!(capacity_patches(&api).is_empty());
        assert!(status["allocatedResourceStatuses"].get("storage").is_none());
        daemon.stop();
    });
}
