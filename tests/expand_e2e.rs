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
//!   an unmount or a second publish.
//!
//! Each test runs as root in its own private mount namespace.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use support::api_env::api_env;
use support::apiserver::FakeApiServer;
use support::csi_driver::{DriverOpts, TestDriver};
use support::daemon::{Daemon, Env, NODE, all_mounted, real};

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

#[test]
fn a_claim_grown_by_its_controller_is_grown_on_the_node_when_mounted() {
    real("grows a CSI volume on the node", || {
        let (mut env, api) = api_env("volumed-expand-e2e-grow-");
        let driver = TestDriver::spawn(driver_opts(&mut env));
        put_objects(&api);
        let daemon = env.start();
        let target = target(&env);
        daemon.wait_until_showing(
            "the claim's status says the new size",
            || claim(&api)["status"]["capacity"]["storage"] == json!("8Mi"),
            || format!("{:#}\n{}", claim(&api), daemon.log_tail()),
        );
        assert!(mounted(&daemon, &target), "{}", daemon.get("/debug/state"));
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
        let error = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "NodeResizeError")
            .unwrap_or_else(|| panic!("a NodeResizeError condition: {status:#}"));
        assert_eq!(error["status"], "True");
        assert!(
            error["message"].as_str().is_some_and(
                |m| m.starts_with("failed to expand pvc with") && m.contains("no room for 8Mi")
            ),
            "{error:#}"
        );
        assert_eq!(status["capacity"]["storage"], "4Mi", "not grown");
        assert!(mounted(&daemon, &target), "the mount stays");
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
        let error = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "NodeResizeError")
            .unwrap_or_else(|| panic!("a NodeResizeError condition: {status:#}"));
        let message = error["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("capacity_bytes 1024")
                && message.contains("required_bytes 8388608")
                && message.contains("pod uid-grow: volume pv-grow:"),
            "{message}"
        );
        assert_eq!(status["capacity"]["storage"], "4Mi", "no success reported");
        assert!(mounted(&daemon, &target(&env)), "the mount stays");
        daemon.stop();
    });
}

#[test]
fn a_mounted_claim_grown_later_is_expanded_online() {
    real("grows a mounted CSI volume", || {
        let (mut env, api) = api_env("volumed-expand-e2e-online-");
        let driver = TestDriver::spawn(driver_opts(&mut env));
        put_objects(&api);
        // nothing pending yet: the PV and the claim both say 4 MiB
        let mut pv = api
            .get("v1", "PersistentVolume", None, "pv-grow")
            .expect("the PV");
        pv["spec"]["capacity"]["storage"] = json!("4Mi");
        api.put(pv.clone());
        let mut c = claim(&api);
        c["status"] = json!({"phase": "Bound", "capacity": {"storage": "4Mi"}});
        api.put(c);
        let daemon = env.start();
        let target = target(&env);
        daemon.wait_until_showing(
            "the CSI volume is published",
            || mounted(&daemon, &target),
            || daemon.get("/debug/state"),
        );
        assert_eq!(fs_bytes(&target), 4 * MI);
        assert_eq!(driver.count("NodeExpandVolume"), 0, "nothing pending");

        // the resize controller's work: the PV grows, then the claim says
        // it is the node's turn (the node may see the PV first and expand
        // on it alone, an older resizer's way: its status patch then meets
        // the claim's newer version, and is made again on it)
        pv["spec"]["capacity"]["storage"] = json!("8Mi");
        api.put(pv);
        let mut c = claim(&api);
        c["status"]["allocatedResources"] = json!({"storage": "8Mi"});
        c["status"]["allocatedResourceStatuses"] = json!({"storage": "NodeResizePending"});
        api.put(c);
        daemon.wait_until_showing(
            "the claim's status says the new size",
            || claim(&api)["status"]["capacity"]["storage"] == json!("8Mi"),
            || format!("{:#}\n{}", claim(&api), daemon.log_tail()),
        );
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
