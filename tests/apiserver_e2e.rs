//! The API server as a pod source, end to end: the real `volumed` binary
//! with `--kubeconfig`, the real kube client inside it, real HTTP to the
//! API-server fake in `tests/support/apiserver/` (whose module doc lists
//! what a real API server does that the fake does not), real mounts.
//!
//! - pods arriving and leaving through the watch are mounted and
//!   unmounted; another node's pod and a mirror pod are not mounted;
//! - the API server down at startup: static pods are mounted, `/readyz`
//!   waits, and nothing is unmounted — a pod deleted while volumed was
//!   down is unmounted only once the API server is back and listed;
//! - a watch cut mid-stream and a `410 Gone`: the watcher relists and no
//!   pod's volume is unmounted on the way;
//! - a mount that keeps failing is one `FailedMount` Event whose count
//!   grows, not a flood;
//! - the runtime API's wait on an API pod ends with the blocking error,
//!   then ready once its claim arrives;
//! - `node.status.volumesInUse` after a restart lists the reconstructed
//!   attachable CSI volume, patched without touching other status fields;
//!   the CSINode and the node id annotation name the registered driver;
//!   the node's `volumesAttached` fills no devicePath after the restart
//!   (the journal knew it);
//! - a volume health condition is a `VolumeConditionAbnormal` Event on the
//!   pod and an entry in its `status.volumeHealth`;
//! - an attachable volume is mounted only once `volumesInUse` lists it, and
//!   a mount waiting for that updates the node status at once.
//!
//! Each test runs as root in its own private mount namespace.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::api_env::api_env;
use support::apiserver::FakeApiServer;
use support::daemon::{Daemon, Env, NODE, all_mounted, pod_gone_from_state, real, series};

/// A pod on `node` with a tmpfs emptyDir `cache`.
fn pod(uid: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("pod-{uid}"), "namespace": "apps", "uid": uid},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "app", "image": "busybox"}],
            "volumes": [{"name": "cache", "emptyDir": {"medium": "Memory"}}],
        },
        "status": {"phase": "Running"},
    })
}

fn cache_of(env: &Env, uid: &str) -> PathBuf {
    env.pod_volume(uid, "kubernetes.io~empty-dir", "cache")
}

fn mounted(daemon: &Daemon, paths: &[&PathBuf]) -> bool {
    let paths: Vec<PathBuf> = paths.iter().map(|p| (*p).clone()).collect();
    all_mounted(&daemon.state(), &paths)
}

/// The teardowns run so far (`volumed_plugin_operations_total` is per
/// plugin and operation).
fn teardowns(daemon: &Daemon) -> f64 {
    series(&daemon.metrics(), "volumed_plugin_operations_total")
        .iter()
        .filter(|(k, _)| k.contains("operation=\"teardown\""))
        .map(|(_, v)| v)
        .sum()
}

/// Waits until the fake holds an Event that `matches`.
#[track_caller]
fn wait_for_event(
    daemon: &Daemon,
    api: &FakeApiServer,
    what: &str,
    matches: impl Fn(&Value) -> bool,
) {
    let events = || api.list("v1", "Event");
    daemon.wait_until_showing(
        what,
        || events().iter().any(&matches),
        || format!("{:#?}", events()),
    );
}

/// Keeps checking for `for_` that `cond` stays true.
#[track_caller]
fn stays(what: &str, for_: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + for_;
    while Instant::now() < end {
        assert!(cond(), "{what}: no longer true");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_pod_from_the_watch_is_mounted_and_unmounted_when_deleted() {
    real("mounts pods from the API server", || {
        let (mut env, api) = api_env("volumed-api-e2e-watch-");
        api.put(pod("uid-a", NODE));
        let daemon = env.start();
        let a = cache_of(&env, "uid-a");
        daemon.wait_until("pod a (listed) is mounted", || mounted(&daemon, &[&a]));

        // Through the watch now: one for this node, one for another, and
        // the API copy of a static pod.
        api.put(pod("uid-b", NODE));
        api.put(pod("uid-elsewhere", "other-node"));
        let mut mirror = pod("uid-mirror", NODE);
        mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "abc"});
        api.put(mirror);
        let b = cache_of(&env, "uid-b");
        daemon.wait_until("pod b (watched) is mounted", || mounted(&daemon, &[&b]));
        std::thread::sleep(Duration::from_millis(500));
        let state = daemon.state();
        for uid in ["uid-elsewhere", "uid-mirror"] {
            assert!(
                pod_gone_from_state(&state, &env.root, uid),
                "{uid} is not this node's to mount: {state}"
            );
        }

        assert!(api.delete("v1", "Pod", Some("apps"), "pod-uid-a"));
        daemon.wait_until("pod a is unmounted once deleted", || {
            pod_gone_from_state(&daemon.state(), &env.root, "uid-a")
        });
        assert!(mounted(&daemon, &[&b]), "pod b stays");

        let pod_watches: Vec<_> = api
            .requests()
            .into_iter()
            .filter(|r| r.path == "/api/v1/pods")
            .collect();
        assert!(!pod_watches.is_empty());
        for r in &pod_watches {
            assert_eq!(
                r.param("fieldSelector").as_deref(),
                Some(format!("spec.nodeName={NODE}").as_str()),
                "every pod request is for this node: {} {}",
                r.path,
                r.query
            );
        }
        daemon.stop();
    });
}

#[test]
fn the_api_server_down_at_startup_delays_unmounts_only() {
    real("restarts with the API server down", || {
        let (mut env, api) = api_env("volumed-api-e2e-down-");
        api.put(pod("uid-a", NODE));
        api.put(pod("uid-gone", NODE));
        let daemon = env.start();
        let (a, gone) = (cache_of(&env, "uid-a"), cache_of(&env, "uid-gone"));
        daemon.wait_until("both pods mounted", || mounted(&daemon, &[&a, &gone]));
        daemon.stop();

        // While volumed is down, one pod is deleted; then the API server
        // goes down too, and a static pod is added.
        assert!(api.delete("v1", "Pod", Some("apps"), "pod-uid-gone"));
        api.set_down(true);
        env.write_pod(
            "static.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: s, namespace: default, uid: uid-static}\n\
             spec:\n  containers: [{name: c, image: busybox}]\n  volumes: [{name: cache, emptyDir: {medium: Memory}}]\n",
        );
        let daemon = env.start_serving();
        let s = cache_of(&env, "uid-static");
        daemon.wait_until("the static pod is mounted with the API server down", || {
            mounted(&daemon, &[&s])
        });
        assert_ne!(
            daemon.try_get("/readyz").0,
            200,
            "not every source has listed"
        );
        stays(
            "both API pods' volumes stay mounted while the API server is down",
            Duration::from_secs(3),
            || mounted(&daemon, &[&a, &gone]),
        );

        api.set_down(false);
        daemon.wait_until("/readyz once the API server answers", || {
            daemon.try_get("/readyz").0 == 200
        });
        daemon.wait_until(
            "the pod deleted while volumed was down is unmounted",
            || pod_gone_from_state(&daemon.state(), &env.root, "uid-gone"),
        );
        assert!(mounted(&daemon, &[&a, &s]), "the others stay");
        daemon.stop();
    });
}

#[test]
fn a_cut_watch_and_a_410_relist_without_unmounting_anything() {
    real("relists after a 410", || {
        let (mut env, api) = api_env("volumed-api-e2e-relist-");
        api.put(pod("uid-a", NODE));
        let daemon = env.start();
        let a = cache_of(&env, "uid-a");
        daemon.wait_until("pod a mounted", || mounted(&daemon, &[&a]));
        let before = teardowns(&daemon);
        let lists = |api: &FakeApiServer| {
            api.requests()
                .iter()
                .filter(|r| r.path == "/api/v1/pods" && r.is_list())
                .count()
        };
        let listed = lists(&api);

        // A pod added while the watch is down, after the history is gone.
        api.cut_watches();
        api.compact();
        api.put(pod("uid-b", NODE));
        api.compact();
        api.cut_watches();
        let b = cache_of(&env, "uid-b");
        daemon.wait_until("pod b mounted after the relist", || {
            mounted(&daemon, &[&a, &b])
        });
        assert!(lists(&api) > listed, "the pods were listed again");
        assert_eq!(
            teardowns(&daemon),
            before,
            "nothing was torn down on the way"
        );
        daemon.stop();
    });
}

#[test]
fn a_mount_that_keeps_failing_is_one_failed_mount_event_counted() {
    real("records FailedMount events", || {
        let (mut env, api) = api_env("volumed-api-e2e-events-");
        let mut p = pod("uid-bad", NODE);
        p["spec"]["volumes"] = json!([{
            "name": "host",
            "hostPath": {"path": "/nonexistent/volumed-e2e", "type": "Directory"},
        }]);
        api.put(p);
        let daemon = env.start();
        wait_for_event(
            &daemon,
            &api,
            "a FailedMount event on the pod, counted twice",
            |e| {
                e["reason"] == "FailedMount"
                    && e["involvedObject"]["uid"] == "uid-bad"
                    && e["count"].as_u64().is_some_and(|c| c >= 2)
            },
        );
        let all = api.list("v1", "Event");
        assert_eq!(
            all.len(),
            1,
            "one Event object, its count patched: {all:#?}"
        );
        let e = &all[0];
        assert_eq!(e["type"], "Warning");
        assert_eq!(e["involvedObject"]["name"], "pod-uid-bad");
        assert_eq!(e["metadata"]["namespace"], "apps");
        assert!(
            e["message"]
                .as_str()
                .is_some_and(|m| m.contains("/nonexistent/volumed-e2e")),
            "the message names what failed: {e}"
        );
        daemon.stop();
    });
}

const DRIVER: &str = "hostpath.csi.volumed.test";
const HANDLE: &str = "vol-api-1";

/// The test driver's options, its socket given to the daemon with
/// `--csi-driver`.
fn driver_opts(env: &mut Env) -> support::csi_driver::DriverOpts {
    let opts = support::csi_driver::DriverOpts::in_dir(DRIVER, &env.scratch.path().join("driver"));
    env.extra_args.extend([
        "--csi-driver".to_owned(),
        format!("{DRIVER}={}", opts.endpoint.display()),
    ]);
    opts
}

/// A CSI PV that needs attaching, its claim, its driver's CSIDriver and
/// an attached VolumeAttachment, and a pod mounting the claim.
fn put_csi_objects(api: &FakeApiServer) {
    let objects = [
        json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pv-api"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "claimRef": {"namespace": "apps", "name": "data"},
                "csi": {"driver": DRIVER, "volumeHandle": HANDLE, "fsType": "ext4"}}}),
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "namespace": "apps"},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-api",
                "resources": {"requests": {"storage": "1Gi"}}}}),
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
            "metadata": {"name": DRIVER}, "spec": {"attachRequired": true}}),
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
            "metadata": {"name": "va-api"},
            "spec": {"attacher": DRIVER, "nodeName": NODE,
                "source": {"persistentVolumeName": "pv-api"}},
            "status": {"attached": true}}),
    ];
    for o in objects {
        api.put(o);
    }
    let mut p = pod("uid-csi", NODE);
    p["spec"]["volumes"] =
        json!([{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]);
    api.put(p);
}

fn node_of(api: &FakeApiServer) -> Value {
    api.get("v1", "Node", None, NODE).expect("the node")
}

#[test]
fn volumes_in_use_and_the_csi_node_follow_the_node() {
    use support::csi_driver::TestDriver;
    real("reports volumesInUse and CSINode", || {
        let (mut env, api) = api_env("volumed-api-e2e-inuse-");
        let mut opts = driver_opts(&mut env);
        opts.node_id = Some("node-id-7".to_owned());
        let _driver = TestDriver::spawn(opts);
        put_csi_objects(&api);
        let daemon = env.start();
        let unique = format!("kubernetes.io/csi/{DRIVER}^{HANDLE}");
        let target = env
            .pod_volume("uid-csi", "kubernetes.io~csi", "pv-api")
            .join("mount");
        daemon.wait_until_showing(
            "the CSI volume is published",
            || mounted(&daemon, &[&target]),
            || daemon.get("/debug/state"),
        );
        let in_use = |api: &FakeApiServer| node_of(api)["status"]["volumesInUse"].clone();
        daemon.wait_until_showing(
            "volumesInUse lists the attachable volume",
            || in_use(&api) == json!([unique]),
            || format!("{:#}", node_of(&api)),
        );
        let node = node_of(&api);
        assert_eq!(
            node["status"]["nodeInfo"]["kubeletVersion"], "v1.37.0",
            "other status fields kept"
        );
        assert_eq!(node["metadata"]["labels"]["keep"], "me", "labels kept");
        daemon.wait_until_showing(
            "the CSINode and the node id annotation name the driver",
            || {
                let csinode = api.get("storage.k8s.io/v1", "CSINode", None, NODE);
                let ann =
                    node_of(&api)["metadata"]["annotations"]["csi.volume.kubernetes.io/nodeid"]
                        .clone();
                csinode.is_some_and(|c| {
                    c["spec"]["drivers"] == json!([{"name": DRIVER, "nodeID": "node-id-7"}])
                }) && ann == json!(format!("{{\"{DRIVER}\":\"node-id-7\"}}"))
            },
            || format!("{:#?}", api.get("storage.k8s.io/v1", "CSINode", None, NODE)),
        );
        // After a restart the reconstructed volume is still in use, and the
        // patch that says so touches only volumesInUse.
        daemon.stop();
        let mut node = node_of(&api);
        node["status"]["volumesInUse"] = Value::Null;
        // what an attach/detach controller reports for it
        node["status"]["volumesAttached"] = json!([{"name": unique, "devicePath": "csi-0123"}]);
        api.put(node);
        api.clear_requests();
        let daemon = env.start();
        daemon.wait_until_showing(
            "volumesInUse again after the restart",
            || in_use(&api) == json!([unique]),
            || format!("{:#}", node_of(&api)),
        );
        // The journal knew the staged device's path: the node's status
        // fills none (KEP-3756's volumesNeedUpdateFromNodeStatus).
        assert!(
            daemon.log().contains("listed=1 filled=0"),
            "devicePaths from node status: {}",
            daemon.log_tail()
        );
        let patches: Vec<_> = api
            .requests()
            .into_iter()
            // the node's status only: a pod's `status.volumeHealth` patch
            // (the health monitor's first pass) may come meanwhile
            .filter(|r| r.method == "PATCH" && r.path.ends_with(&format!("/nodes/{NODE}/status")))
            .collect();
        assert!(!patches.is_empty());
        for p in &patches {
            let body: Value = serde_json::from_str(&p.body).expect("a JSON patch body");
            assert_eq!(
                body.as_object()
                    .map(|o| o.keys().cloned().collect::<Vec<_>>()),
                Some(vec!["status".to_owned()]),
                "{body}"
            );
            assert_eq!(
                body["status"]
                    .as_object()
                    .map(|o| o.keys().cloned().collect::<Vec<_>>()),
                Some(vec!["volumesInUse".to_owned()]),
                "{body}"
            );
        }
        // The pod goes: the volume is unpublished, then no longer in use.
        assert!(api.delete("v1", "Pod", Some("apps"), "pod-uid-csi"));
        daemon.wait_until_showing(
            "volumesInUse empty once the volume is gone",
            || in_use(&api).is_null(),
            || format!("{:#}", node_of(&api)),
        );
        daemon.stop();
    });
}

/// The health monitor's findings reach the API server: a pod's tmpfs
/// unmounted behind volumed's back is a `VolumeConditionAbnormal` Warning
/// Event on that pod and an abnormal entry for the volume in the pod's
/// `status.volumeHealth` (the 1.37 field), patched on the status
/// subresource; the pod beside it gets no event and no condition.
#[test]
fn a_volume_health_condition_is_an_event_and_the_pods_volume_health() {
    real("reports volume health to the API server", || {
        let (mut env, api) = api_env("volumed-api-e2e-health-");
        // passes only on demand (`/debug/health?fresh=1`)
        env.extra_args
            .extend(["--health-period".to_owned(), "1h".to_owned()]);
        api.put(pod("uid-sick", NODE));
        api.put(pod("uid-well", NODE));
        let daemon = env.start();
        let (sick, well) = (cache_of(&env, "uid-sick"), cache_of(&env, "uid-well"));
        daemon.wait_until_showing(
            "both pods mounted",
            || mounted(&daemon, &[&sick, &well]),
            || daemon.get("/debug/state"),
        );
        support::umount(&sick);
        daemon.get("/debug/health?fresh=1");
        let status_of = |uid: &str| {
            let p = api.get("v1", "Pod", Some("apps"), &format!("pod-{uid}"));
            p.map(|p| p["status"]["volumeHealth"].clone())
                .unwrap_or_default()
        };
        daemon.wait_until_showing(
            "the sick pod's status.volumeHealth names the vanished mount",
            || {
                let h = status_of("uid-sick");
                h[0]["name"] == "cache"
                    && h[0]["healthConditions"]
                        .as_array()
                        .is_some_and(|c| c.iter().any(|c| c["reason"] == "MountVanished"))
            },
            || format!("{:#}", status_of("uid-sick")),
        );
        wait_for_event(
            &daemon,
            &api,
            "a VolumeConditionAbnormal event on the sick pod",
            |e| {
                e["reason"] == "VolumeConditionAbnormal"
                    && e["involvedObject"]["uid"] == "uid-sick"
                    && e["type"] == "Warning"
            },
        );
        let events = || api.list("v1", "Event");
        // a healthy volume is reported without conditions, if at all
        let well_health = status_of("uid-well");
        assert!(
            well_health
                .as_array()
                .into_iter()
                .flatten()
                .all(|v| v["healthConditions"].as_array().is_none_or(Vec::is_empty)),
            "{well_health:#}"
        );
        let about_well = events()
            .into_iter()
            .filter(|e| e["involvedObject"]["uid"] == "uid-well")
            .collect::<Vec<_>>();
        assert!(about_well.is_empty(), "{about_well:#?}");
        // volumeHealth goes through the status subresource only
        let patches: Vec<_> = api
            .requests()
            .into_iter()
            .filter(|r| r.method == "PATCH" && r.path.contains("/pods/"))
            .collect();
        assert!(!patches.is_empty());
        assert!(
            patches.iter().all(|r| r.path.ends_with("/status")),
            "{patches:#?}"
        );
        daemon.stop();
    });
}

/// Sets the value of a flag `api_env` gave.
fn set_flag(env: &mut Env, flag: &str, value: &str) {
    let at = env.extra_args.iter().position(|a| a == flag).expect(flag);
    env.extra_args[at + 1] = value.to_owned();
}

/// An attachable volume is mounted only once `node.status.volumesInUse`
/// lists it (the kubelet's `reportedInUse`: the attach/detach controller
/// must not detach what is being mounted). With no Node to patch the pod
/// waits with that error and the driver gets no call; once the Node
/// exists the status update is retried at once and the volume mounts —
/// with a status period of an hour, so the update was not the periodic one.
#[test]
fn an_attachable_volume_mounts_only_once_volumes_in_use_lists_it() {
    use support::csi_driver::TestDriver;
    real("waits for volumesInUse", || {
        let (mut env, api) = api_env("volumed-api-e2e-gate-");
        set_flag(&mut env, "--node-status-update-frequency", "1h");
        let node = node_of(&api);
        assert!(api.delete("v1", "Node", None, NODE));
        let opts = driver_opts(&mut env);
        let driver = TestDriver::spawn(opts);
        put_csi_objects(&api);
        let daemon = env.start();
        daemon.wait_until_showing(
            "the pod waits for volumesInUse",
            || daemon.pod_errors("uid-csi").contains("volumesInUse"),
            || daemon.get("/debug/state"),
        );
        stays(
            "no call changes the volume while it waits",
            Duration::from_secs(1),
            || driver.count("NodeStageVolume") + driver.count("NodePublishVolume") == 0,
        );
        api.put(node);
        let target = env
            .pod_volume("uid-csi", "kubernetes.io~csi", "pv-api")
            .join("mount");
        daemon.wait_until_showing(
            "the volume is published once the Node took the patch",
            || mounted(&daemon, &[&target]),
            || daemon.get("/debug/state"),
        );
        let unique = format!("kubernetes.io/csi/{DRIVER}^{HANDLE}");
        assert_eq!(node_of(&api)["status"]["volumesInUse"], json!([unique]));
        daemon.stop();
    });
}

/// A CSI PV's `nodeStageSecretRef` is read from the API server through a
/// watch of that one Secret (never a list of the node's Secrets): the
/// stage waits for it, then gets its data.
#[test]
fn a_csi_secret_is_watched_by_name_and_reaches_the_driver() {
    use support::csi_driver::TestDriver;
    real("reads CSI secrets from the API server", || {
        let (mut env, api) = api_env("volumed-api-e2e-secret-");
        let opts = driver_opts(&mut env);
        let driver = TestDriver::spawn(opts);
        put_csi_objects(&api);
        let mut pv = api
            .get("v1", "PersistentVolume", None, "pv-api")
            .expect("pv");
        pv["spec"]["csi"]["nodeStageSecretRef"] = json!({"namespace": "apps", "name": "stage-s"});
        api.put(pv);
        let daemon = env.start();
        daemon.wait_until_showing(
            "the pod's error names the missing Secret",
            || {
                daemon.get("/debug/state").contains("stage-s") || {
                    let calls = driver.calls();
                    calls.iter().any(|c| c["method"] == "NodeStageVolume")
                }
            },
            || daemon.get("/debug/state"),
        );
        assert!(
            !driver
                .calls()
                .iter()
                .any(|c| c["method"] == "NodeStageVolume"),
            "no stage without its Secret"
        );
        api.put(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "stage-s", "namespace": "apps"},
            "stringData": {"password": "hunter2"}}));
        let target = env
            .pod_volume("uid-csi", "kubernetes.io~csi", "pv-api")
            .join("mount");
        daemon.wait_until_showing(
            "published once the Secret is there",
            || mounted(&daemon, &[&target]),
            || daemon.get("/debug/state"),
        );
        let stage: Vec<_> = driver
            .calls()
            .into_iter()
            .filter(|c| c["method"] == "NodeStageVolume")
            .collect();
        assert_eq!(
            stage.last().map(|c| c["secrets"].clone()),
            Some(json!({"password": "hunter2"})),
            "{stage:#?}"
        );
        let secret_requests: Vec<_> = api
            .requests()
            .into_iter()
            .filter(|r| r.path.contains("/secrets"))
            .collect();
        assert!(!secret_requests.is_empty());
        for r in &secret_requests {
            assert_eq!(r.path, "/api/v1/namespaces/apps/secrets", "{}", r.path);
            assert_eq!(
                r.param("fieldSelector").as_deref(),
                Some("metadata.name=stage-s")
            );
        }
        assert!(
            !daemon.log().contains("hunter2"),
            "a Secret's data is never logged"
        );
        daemon.stop();
    });
}

/// The runtime API's wait on a pod from the API server: while its claim
/// does not resolve it ends at its time with the blocking error naming the
/// claim; a wait in flight when the claim and its PV arrive returns ready
/// with both volumes.
#[test]
fn the_runtime_wait_for_an_api_pod_returns_its_blocking_error_then_ready() {
    real("waits on an API pod's volumes", || {
        let (mut env, api) = api_env("volumed-api-e2e-wait-");
        let mut p = pod("uid-w", NODE);
        p["spec"]["volumes"] = json!([
            {"name": "cache", "emptyDir": {"medium": "Memory"}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "data-w"}},
        ]);
        api.put(p);
        let daemon = env.start();
        let (status, body) = daemon.try_get("/v1/pods/uid-w/volumes?wait=2");
        assert_eq!(status, 200, "{body}");
        let doc: Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(doc["ready"], false, "{doc:#}");
        let errors = doc["errors"].to_string();
        assert!(
            errors.contains("failed to process volumes=[data]") && errors.contains("apps/data-w"),
            "the blocking error names the claim: {errors}"
        );

        let socket = daemon.socket.clone();
        let waiter = std::thread::spawn(move || {
            support::daemon::unix_get(
                &socket,
                "/v1/pods/uid-w/volumes?wait=60",
                Duration::from_secs(90),
            )
        });
        std::thread::sleep(Duration::from_millis(300));
        let dir = env.scratch.path().join("local-w");
        std::fs::create_dir_all(&dir).expect("the local PV's dir");
        api.put(json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pv-w"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "claimRef": {"namespace": "apps", "name": "data-w"},
                "local": {"path": dir.display().to_string()}}}));
        api.put(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data-w", "namespace": "apps"},
            "spec": {"volumeName": "pv-w", "accessModes": ["ReadWriteOnce"]}}));
        let (status, body) = waiter.join().expect("the waiter").expect("an answer");
        assert_eq!(status, 200, "{body}");
        let doc: Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(doc["ready"], true, "{doc:#}");
        let mut names: Vec<&str> = doc["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .filter_map(|v| v["name"].as_str())
            .collect();
        names.sort_unstable();
        assert_eq!(names, ["cache", "data"], "{doc:#}");
        daemon.stop();
    });
}
