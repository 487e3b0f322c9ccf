//! Claims as pods write them, end to end on the real `volumed run` binary
//! with real binds of directory local PVs (issue 41, items 1, 4 and 5):
//!
//! 1. a claim the pod mounts `readOnly` is bound read-only (a write there
//!    fails with EROFS) while another pod of the same PV writes; `dump`
//!    and the runtime API say `read_only`;
//! 2. a ReadWriteOncePod PV goes to one pod: the second is refused with
//!    the kubelet's message until the first is deleted, then mounted;
//! 3. a generic ephemeral volume's claim is used only once the pod owns it;
//! 4. a read-only claim on a CSI PV is published `readonly: true` (the test
//!    driver then mounts it `ro`), the other pod's not, and a restart with
//!    the journal takes the read-only target as mounted (no RPC);
//! 5. from the API server: an ephemeral volume's claim is mounted for the
//!    pod that owns it, and a second pod naming the ReadWriteOncePod claim
//!    gets a `FailedMount` Event with the kubelet's message until the
//!    first pod is deleted.
//!
//! Each test runs as root in its own private mount namespace with its own
//! scratch dir, so they run in parallel. Every wait is bounded.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::fs;
use std::io::ErrorKind;
use std::path::Path;

use serde_json::Value;
use support::daemon::{Env, all_mounted, delete_all_and_wait, pod_gone_from_state, real};

const LOCAL: &str = "kubernetes.io~local-volume";

/// A directory PV `pv` with the access modes `modes`, bound to the claim
/// `claim`, and that claim; `owner`: the UID of the pod that controls the
/// claim (a generic ephemeral volume's).
fn pv_objects(pv: &str, dir: &Path, modes: &str, claim: &str, owner: Option<&str>) -> String {
    let owner = owner.map_or(String::new(), |uid| {
        format!(
            "  ownerReferences:\n  - {{apiVersion: v1, kind: Pod, name: x, uid: {uid}, controller: true}}\n"
        )
    });
    format!(
        "apiVersion: v1
kind: PersistentVolume
metadata: {{name: {pv}}}
spec:
  accessModes: [{modes}]
  claimRef: {{namespace: default, name: {claim}}}
  local: {{path: {dir}}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {claim}
  namespace: default
{owner}spec: {{volumeName: {pv}}}
",
        dir = dir.display()
    )
}

/// A pod `uid` whose volume `data` is `source` (a YAML flow mapping).
fn pod(uid: &str, source: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {uid}, namespace: default, uid: {uid}}}
spec:
  containers: [{{name: app, image: busybox}}]
  volumes:
  - name: data
    {source}
"
    )
}

/// The runtime API's answer for `uid`.
fn runtime(daemon: &support::daemon::Daemon, uid: &str) -> Value {
    serde_json::from_str(&daemon.get(&format!("/v1/pods/{uid}/volumes"))).unwrap()
}

/// The `params` of the last intent `dump` shows for the target at `path`.
fn dumped_params(env: &Env, path: &Path) -> Value {
    let dump = env.dump();
    let records = dump["records"].as_array().cloned().unwrap_or_default();
    records
        .iter()
        .rev()
        .find_map(|r| {
            let p = &r["params"];
            (p["pod_mount_path"].as_str() == path.to_str()).then(|| p.clone())
        })
        .unwrap_or_else(|| panic!("no record of {path:?} in {dump:#}"))
}

#[test]
fn a_read_only_claim_is_bound_read_only_for_its_pod_alone() {
    real("binds a directory PV read-only for one pod", || {
        let mut env = Env::new("volumed-claims-ro");
        let dir = env.scratch.path().join("pv-dir");
        support::mkdirs(&dir);
        fs::write(
            env.objects.join("pv.yaml"),
            pv_objects("pv-ro", &dir, "ReadWriteMany", "shared", None),
        )
        .unwrap();
        env.write_pod(
            "reader.yaml",
            &pod(
                "reader",
                "persistentVolumeClaim: {claimName: shared, readOnly: true}",
            ),
        );
        env.write_pod(
            "writer.yaml",
            &pod("writer", "persistentVolumeClaim: {claimName: shared}"),
        );
        let reader = env.pod_volume("reader", LOCAL, "pv-ro");
        let writer = env.pod_volume("writer", LOCAL, "pv-ro");
        let daemon = env.start();
        daemon.wait_until("both pods' binds are mounted", || {
            all_mounted(&daemon.state(), &[reader.clone(), writer.clone()])
        });

        fs::write(writer.join("by-writer.txt"), "w").expect("the writer writes");
        let err = fs::write(reader.join("by-reader.txt"), "r").expect_err("read-only");
        assert_eq!(err.kind(), ErrorKind::ReadOnlyFilesystem, "{err}");
        assert_eq!(
            fs::read_to_string(reader.join("by-writer.txt")).unwrap(),
            "w",
            "the reader sees the volume"
        );
        assert!(!dir.join("by-reader.txt").exists());
        let ro_of = |path: &Path| {
            let m = env.mounts_below_root();
            let m = m.iter().find(|m| m.mount_point == path).expect("mounted");
            m.identity().read_only
        };
        assert!(ro_of(&reader), "the reader's bind is ro in the mount table");
        assert!(!ro_of(&writer), "the writer's is not");

        let answer = |uid: &str| runtime(&daemon, uid)["volumes"][0]["read_only"].clone();
        assert_eq!(answer("reader"), Value::Bool(true));
        assert_eq!(answer("writer"), Value::Bool(false));
        let params = dumped_params(&env, &reader);
        assert_eq!(params["read_only"], Value::Bool(true), "{params:#}");
        assert!(
            params["mount_options"]
                .as_array()
                .is_some_and(|o| o.iter().any(|o| o == "ro")),
            "journaled with the target: {params:#}"
        );
        assert_eq!(
            dumped_params(&env, &writer)["read_only"],
            Value::Bool(false)
        );

        delete_all_and_wait(&env, &daemon);
        daemon.stop();
    });
}

#[test]
fn a_read_write_once_pod_volume_waits_for_its_holder_to_go() {
    real(
        "hands a ReadWriteOncePod PV from one pod to the next",
        || {
            let mut env = Env::new("volumed-claims-rwop");
            let dir = env.scratch.path().join("pv-dir");
            support::mkdirs(&dir);
            fs::write(
                env.objects.join("pv.yaml"),
                pv_objects("pv-rwop", &dir, "ReadWriteOncePod", "solo", None),
            )
            .unwrap();
            let claim = "persistentVolumeClaim: {claimName: solo}";
            env.write_pod("first.yaml", &pod("first", claim));
            let first = env.pod_volume("first", LOCAL, "pv-rwop");
            let second = env.pod_volume("second", LOCAL, "pv-rwop");
            let daemon = env.start();
            daemon.wait_until("the first pod holds it", || {
                all_mounted(&daemon.state(), std::slice::from_ref(&first))
            });

            env.write_pod("second.yaml", &pod("second", claim));
            let message = "MountVolume.SetUp failed for volume \"pv-rwop\" : volume uses the \
                       ReadWriteOncePod access mode and is already in use by another pod";
            daemon.wait_until("the second pod is refused", || {
                daemon.pod_errors("second").contains(message)
            });
            let answer = runtime(&daemon, "second");
            assert_eq!(answer["ready"], Value::Bool(false), "{answer:#}");
            assert!(
                answer["errors"]
                    .as_array()
                    .is_some_and(|e| e.iter().any(|e| e == message)),
                "{answer:#}"
            );
            assert!(
                !second.exists()
                    || env
                        .mounts_below_root()
                        .iter()
                        .all(|m| m.mount_point != second)
            );

            env.remove_pod("first.yaml");
            daemon.wait_until("the second pod gets it once the first is gone", || {
                let state = daemon.state();
                pod_gone_from_state(&state, &env.root, "first")
                    && all_mounted(&state, std::slice::from_ref(&second))
            });
            assert_eq!(runtime(&daemon, "second")["ready"], Value::Bool(true));

            delete_all_and_wait(&env, &daemon);
            daemon.stop();
        },
    );
}

#[test]
fn an_ephemeral_volume_mounts_its_claim_only_once_the_pod_owns_it() {
    real("mounts a generic ephemeral volume's claim", || {
        let mut env = Env::new("volumed-claims-eph");
        let dir = env.scratch.path().join("pv-dir");
        support::mkdirs(&dir);
        // a static pod's name is `<name>-<node>`: its claim is that and the volume's
        let claim = format!("eph-{}-data", support::daemon::NODE);
        let objects = |owner| pv_objects("pv-eph", &dir, "ReadWriteOnce", &claim, Some(owner));
        fs::write(env.objects.join("pv.yaml"), objects("someone-else")).unwrap();
        env.write_pod(
            "eph.yaml",
            &pod(
                "eph",
                "ephemeral: {volumeClaimTemplate: {spec: {accessModes: [ReadWriteOnce]}}}",
            ),
        );
        let target = env.pod_volume("eph", LOCAL, "pv-eph");
        let daemon = env.start();
        let refused = format!(
            "PVC default/{claim} was not created for pod default/eph-{} (pod is not owner)",
            support::daemon::NODE
        );
        daemon.wait_until("a claim another pod owns is refused", || {
            daemon.pod_errors("eph").contains(&refused)
        });
        assert!(env.mounts_below_root().is_empty(), "nothing mounted");

        fs::write(env.objects.join("pv.yaml"), objects("eph")).unwrap();
        daemon.wait_until("the pod's own claim is mounted", || {
            all_mounted(&daemon.state(), std::slice::from_ref(&target))
        });
        fs::write(target.join("f"), "x").unwrap();
        assert_eq!(fs::read_to_string(dir.join("f")).unwrap(), "x");

        delete_all_and_wait(&env, &daemon);
        daemon.stop();
    });
}

/// The journal says the reader's bind is `ro`; after a restart the host
/// shows it writable (remounted behind volumed's back): the merge does
/// not take it as mounted, and the daemon binds it read-only again.
#[test]
fn a_read_only_bind_found_writable_after_a_restart_is_made_read_only_again() {
    real("restarts over a read-only bind made writable", || {
        let mut env = Env::new("volumed-claims-ro-restart");
        let dir = env.scratch.path().join("pv-dir");
        support::mkdirs(&dir);
        fs::write(
            env.objects.join("pv.yaml"),
            pv_objects("pv-ro", &dir, "ReadWriteOnce", "claim", None),
        )
        .unwrap();
        env.write_pod(
            "reader.yaml",
            &pod(
                "reader",
                "persistentVolumeClaim: {claimName: claim, readOnly: true}",
            ),
        );
        let reader = env.pod_volume("reader", LOCAL, "pv-ro");
        let read_only = |env: &Env| {
            let m = env.mounts_below_root();
            m.iter()
                .filter(|m| m.mount_point == reader)
                .map(|m| m.identity().read_only)
                .collect::<Vec<_>>()
        };
        let daemon = env.start();
        daemon.wait_until("the bind is mounted", || {
            all_mounted(&daemon.state(), std::slice::from_ref(&reader))
        });
        assert_eq!(read_only(&env), [true]);
        daemon.stop();

        let status = std::process::Command::new("mount")
            .args(["-o", "remount,bind,rw"])
            .arg(&reader)
            .status()
            .unwrap();
        assert!(status.success(), "remount rw");
        assert_eq!(read_only(&env), [false], "writable behind volumed's back");

        let daemon = env.start();
        daemon.wait_until("the bind is read-only again", || {
            all_mounted(&daemon.state(), std::slice::from_ref(&reader)) && read_only(&env) == [true]
        });
        let metrics = daemon.metrics();
        let decided = support::daemon::series(&metrics, "volumed_reconstruct_decisions_total");
        assert!(
            decided
                .iter()
                .any(|(l, v)| l.contains("reason=\"mounted_differs\"") && *v >= 1.0),
            "{decided:#?}"
        );
        let err = fs::write(reader.join("f"), "x").expect_err("read-only");
        assert_eq!(err.kind(), ErrorKind::ReadOnlyFilesystem, "{err}");

        delete_all_and_wait(&env, &daemon);
        daemon.stop();
    });
}

/// A CSI PV (ReadWriteMany, no attach) of the test driver, its claim and
/// its CSIDriver.
fn csi_objects(driver: &str) -> String {
    format!(
        "apiVersion: v1
kind: PersistentVolume
metadata: {{name: pv-csi}}
spec:
  accessModes: [ReadWriteMany]
  claimRef: {{namespace: default, name: shared}}
  csi: {{driver: {driver}, volumeHandle: vol-ro, fsType: ext4}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: shared, namespace: default}}
spec: {{volumeName: pv-csi}}
---
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {{name: {driver}}}
spec: {{attachRequired: false}}
"
    )
}

#[test]
fn a_read_only_csi_claim_is_published_readonly_for_its_pod_alone() {
    real("publishes a CSI PV read-only for one pod", || {
        use support::csi_driver::{DriverOpts, TestDriver};
        const DRIVER: &str = "ro.csi.volumed.dev";
        let mut env = Env::new("volumed-claims-csi-ro");
        fs::write(env.objects.join("csi.yaml"), csi_objects(DRIVER)).unwrap();
        let mut opts = DriverOpts::in_dir(DRIVER, &env.scratch.path().join("driver"));
        opts.node_id = Some(support::daemon::NODE.to_owned());
        env.extra_args = vec![
            "--csi-driver".to_owned(),
            format!("{DRIVER}={}", opts.endpoint.display()),
        ];
        let driver = TestDriver::spawn(opts);
        env.write_pod(
            "reader.yaml",
            &pod(
                "reader",
                "persistentVolumeClaim: {claimName: shared, readOnly: true}",
            ),
        );
        env.write_pod(
            "writer.yaml",
            &pod("writer", "persistentVolumeClaim: {claimName: shared}"),
        );
        let target = |uid: &str| {
            env.pod_volume(uid, "kubernetes.io~csi", "pv-csi")
                .join("mount")
        };
        let (reader, writer) = (target("reader"), target("writer"));
        let daemon = env.start();
        daemon.wait_until("both pods published", || {
            all_mounted(&daemon.state(), &[reader.clone(), writer.clone()])
        });
        let published: Vec<(String, Value)> = driver
            .calls()
            .into_iter()
            .filter(|c| c["method"] == "NodePublishVolume")
            .map(|c| {
                (
                    c["target_path"].as_str().unwrap_or("").to_owned(),
                    c["readonly"].clone(),
                )
            })
            .collect();
        assert_eq!(published.len(), 2, "{published:?}");
        for (path, readonly) in &published {
            let want = Path::new(path) == reader;
            assert_eq!(*readonly, Value::Bool(want), "{path}");
        }
        fs::write(writer.join("w.txt"), "w").expect("the writer writes");
        let err = fs::write(reader.join("r.txt"), "r").expect_err("read-only");
        assert_eq!(err.kind(), ErrorKind::ReadOnlyFilesystem, "{err}");
        assert_eq!(
            runtime(&daemon, "reader")["volumes"][0]["read_only"],
            Value::Bool(true)
        );
        daemon.stop();

        // the journal says the reader's target is `ro`, the host agrees
        let daemon = env.start();
        daemon.wait_until("both mounted after the restart", || {
            all_mounted(&daemon.state(), &[reader.clone(), writer.clone()])
        });
        std::thread::sleep(std::time::Duration::from_secs(2));
        assert_eq!(driver.count("NodePublishVolume"), 2, "no publish again");
        assert_eq!(driver.count("NodeStageVolume"), 1, "no stage again");

        for e in fs::read_dir(&env.pods).unwrap() {
            fs::remove_file(e.unwrap().path()).unwrap();
        }
        daemon.wait_until("nothing mounted below the root, unstaged", || {
            env.mounts_below_root().is_empty() && driver.count("NodeUnstageVolume") == 1
        });
        daemon.stop();
    });
}

#[test]
fn api_pods_get_their_ephemeral_claim_and_a_failed_mount_event_for_rwop() {
    real("ephemeral and ReadWriteOncePod claims of API pods", || {
        use serde_json::json;
        let (mut env, api) = support::api_env::api_env("volumed-claims-api");
        let dir = env.scratch.path().join("pv-dir");
        support::mkdirs(&dir);
        api.put(json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pv-eph"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOncePod"],
                "claimRef": {"namespace": "apps", "name": "web-scratch"},
                "local": {"path": dir.display().to_string()}}}));
        api.put(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "web-scratch", "namespace": "apps",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "web",
                    "uid": "u-web", "controller": true}]},
            "spec": {"volumeName": "pv-eph", "accessModes": ["ReadWriteOncePod"]}}));
        let api_pod = |name: &str, uid: &str, volume: Value| {
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "apps", "uid": uid},
                "spec": {"nodeName": support::daemon::NODE,
                    "containers": [{"name": "app", "image": "busybox"}],
                    "volumes": [volume]},
                "status": {"phase": "Running"}})
        };
        api.put(api_pod(
            "web",
            "u-web",
            json!({"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}),
        ));
        let web = env.pod_volume("u-web", LOCAL, "pv-eph");
        let thief = env.pod_volume("u-thief", LOCAL, "pv-eph");
        let daemon = env.start();
        daemon.wait_until("the ephemeral claim is mounted for its pod", || {
            all_mounted(&daemon.state(), std::slice::from_ref(&web))
        });

        // another pod naming the claim directly: ReadWriteOncePod holds
        api.put(api_pod(
            "thief",
            "u-thief",
            json!({"name": "data", "persistentVolumeClaim": {"claimName": "web-scratch"}}),
        ));
        let message = "MountVolume.SetUp failed for volume \"pv-eph\" : volume uses the \
                       ReadWriteOncePod access mode and is already in use by another pod";
        let failed_mount = || {
            api.list("v1", "Event").into_iter().any(|e| {
                e["reason"] == "FailedMount"
                    && e["involvedObject"]["name"] == "thief"
                    && e["message"].as_str().is_some_and(|m| m.contains(message))
            })
        };
        daemon.wait_until_showing("a FailedMount event on the thief", failed_mount, || {
            format!("{:#?}", api.list("v1", "Event"))
        });
        assert!(!all_mounted(&daemon.state(), std::slice::from_ref(&thief)));

        assert!(api.delete("v1", "Pod", Some("apps"), "web"));
        daemon.wait_until("the thief gets it once web is gone", || {
            let state = daemon.state();
            pod_gone_from_state(&state, &env.root, "u-web")
                && all_mounted(&state, std::slice::from_ref(&thief))
        });
        assert!(api.delete("v1", "Pod", Some("apps"), "thief"));
        daemon.wait_until("nothing mounted below the root", || {
            env.mounts_below_root().is_empty()
        });
        daemon.stop();
    });
}
