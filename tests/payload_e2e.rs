//! Payload volumes through the real daemon: a static pod with a secret and
//! a configMap volume, their objects in the static objects folder.
//!
//! 1. the files land where the kubelet puts them, the secret on a tmpfs;
//! 2. the journal the setup wrote holds the objects' versions but not one
//!    copy of the secret's value, in any of sled's files (nor the log);
//! 3. a graceful restart rewrites nothing: same inodes and mtimes, no
//!    plugin operation.
//!
//! Each test runs as root in its own private mount namespace.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;
use support::daemon::{Env, all_mounted, delete_all_and_wait, real, series};

const POD: &str = "7c1e2d3c-4b5a-4968-8776-655443322110";
/// A value distinctive enough that finding it anywhere is no accident.
const SECRET_VALUE: &str = "s3cr3t-7f2b9c41d0e6-never-journaled";
const SECRET_UID: &str = "5ec2e700-0000-4000-8000-00000000c0de";

fn objects(config: &str) -> String {
    format!(
        "apiVersion: v1
kind: Secret
metadata:
  name: creds
  namespace: default
  uid: {SECRET_UID}
  resourceVersion: \"11\"
stringData:
  password: {SECRET_VALUE}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: app
  namespace: default
  uid: c0f19000-0000-4000-8000-000000000001
  resourceVersion: \"3\"
data:
  app.conf: \"{config}\"
"
    )
}

fn pod() -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: payload
  namespace: default
  uid: {POD}
spec:
  securityContext: {{fsGroup: 3000}}
  containers:
  - name: app
    image: busybox
  volumes:
  - name: creds
    secret:
      secretName: creds
      defaultMode: 0400
      items: [{{key: password, path: db/password}}]
  - name: app
    configMap: {{name: app}}
"
    )
}

/// Every regular file below `dir`, whole.
fn files_below(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    support::daemon::tree(dir)
        .into_iter()
        .map(|rel| dir.join(rel))
        .filter(|p| fs::symlink_metadata(p).is_ok_and(|m| m.is_file()))
        .map(|p| {
            let bytes = fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect()
}

/// The timestamped payload dirs of an atomically written volume.
fn payload_dirs(volume: &Path) -> Vec<String> {
    fs::read_dir(volume)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("..") && n != "..data")
                .collect()
        })
        .unwrap_or_default()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn a_secret_is_written_journaled_without_its_bytes_and_kept_across_a_restart() {
    real("mounts payload volumes through the daemon", || {
        let mut env = Env::new("volumed-e2e-payload");
        fs::write(env.objects.join("objects.yaml"), objects("v=1")).unwrap();
        env.write_pod("p.yaml", &pod());
        let secret = env.pod_volume(POD, "kubernetes.io~secret", "creds");
        let config = env.pod_volume(POD, "kubernetes.io~configmap", "app");
        let want = [secret.clone(), config.clone()];
        let daemon = env.start();
        daemon.wait_until("both payload volumes set up", || {
            all_mounted(&daemon.state(), &want)
        });

        assert_eq!(
            fs::read_to_string(secret.join("db/password")).unwrap(),
            SECRET_VALUE
        );
        assert_eq!(fs::read_to_string(config.join("app.conf")).unwrap(), "v=1");
        let on_tmpfs = env
            .mounts_below_root()
            .iter()
            .any(|m| m.mount_point == secret && m.fs_type == "tmpfs");
        assert!(on_tmpfs, "the secret is on a tmpfs");
        let meta = fs::metadata(secret.join("db/password")).unwrap();
        assert_eq!((meta.mode() & 0o777, meta.gid()), (0o440, 3000));
        // What a runtime is told (the kubelet's CRI mount): read-only, no
        // context= mount, so the runtime relabels the files.
        let doc: serde_json::Value =
            serde_json::from_str(&daemon.get(&format!("/v1/pods/{POD}/volumes"))).unwrap();
        for v in doc["volumes"].as_array().unwrap() {
            assert_eq!(
                (
                    &v["read_only"],
                    &v["selinux_context"],
                    &v["selinux_relabel"]
                ),
                (&json!(true), &json!(null), &json!(true)),
                "{v:#}"
            );
        }

        let watched: Vec<PathBuf> = [
            secret.join("db/password"),
            secret.join("..data"),
            secret.join("db"),
            config.join("app.conf"),
            config.join("..data"),
        ]
        .into_iter()
        .collect();
        let before = support::stamps(&watched);
        // what `dump` shows: the payload's hash and the Secret's version
        let dumped = daemon.get("/debug/journal");
        assert!(dumped.contains(SECRET_UID), "{dumped}");
        assert!(dumped.contains("\"resource_version\": \"11\""), "{dumped}");
        assert!(!dumped.contains(SECRET_VALUE), "dump shows the secret");
        let log = daemon.log();
        daemon.stop();

        // The journal: the Secret's uid is there (so these are the files
        // that hold the records), its value is not.
        let journal = files_below(&env.journal);
        assert!(
            journal
                .iter()
                .any(|(_, b)| contains(b, SECRET_UID.as_bytes())),
            "the payload's object versions are journaled"
        );
        for (path, bytes) in &journal {
            assert!(
                !contains(bytes, SECRET_VALUE.as_bytes()),
                "{} holds the secret's value",
                path.display()
            );
        }
        assert!(!log.contains(SECRET_VALUE), "the log holds the secret");

        let daemon = env.start();
        daemon.wait_until("both payload volumes set up after the restart", || {
            all_mounted(&daemon.state(), &want)
        });
        std::thread::sleep(Duration::from_secs(2));
        let ops = series(&daemon.metrics(), "volumed_plugin_operations_total");
        assert!(
            ops.iter().all(|(_, v)| *v == 0.0),
            "no plugin operation after the restart: {ops:#?}\n{}",
            daemon.log_tail()
        );
        assert_eq!(support::stamps(&watched), before, "nothing rewritten");

        delete_all_and_wait(&env, &daemon);
        // No mount left is not yet no dir left: a secret's dir is removed
        // after its unmount, and a configMap's dir is not a mount at all.
        daemon.wait_until("both payload volume dirs removed", || {
            !secret.exists() && !config.exists()
        });
        daemon.stop();
    });
}

/// A changed ConfigMap is written again within the sync period, whole
/// (one payload dir left), and the journal records the new version.
#[test]
fn a_changed_config_map_is_rewritten_within_the_sync_period() {
    real("mounts payload volumes through the daemon", || {
        let mut env = Env::new("volumed-e2e-payload-update");
        env.extra_args = vec!["--sync-frequency".into(), "1s".into()];
        fs::write(env.objects.join("objects.yaml"), objects("v=1")).unwrap();
        env.write_pod("p.yaml", &pod());
        let config = env.pod_volume(POD, "kubernetes.io~configmap", "app");
        let daemon = env.start();
        daemon.wait_until("the configMap written", || {
            fs::read_to_string(config.join("app.conf")).is_ok_and(|c| c == "v=1")
        });
        let first = fs::read_link(config.join("..data")).unwrap();
        // written by rename, so the poller never reads half a file
        let tmp = env.scratch.path().join("objects.tmp");
        fs::write(&tmp, objects("v=2")).unwrap();
        fs::rename(&tmp, env.objects.join("objects.yaml")).unwrap();
        // The new file shows as soon as `..data` is swapped; the old
        // payload dir is removed just after, so the count is waited for.
        daemon.wait_until_showing(
            "the new configMap written, one payload dir left",
            || {
                fs::read_to_string(config.join("app.conf")).is_ok_and(|c| c == "v=2")
                    && payload_dirs(&config).len() == 1
            },
            || format!("payload dirs: {:?}", payload_dirs(&config)),
        );
        assert_ne!(fs::read_link(config.join("..data")).unwrap(), first);
        delete_all_and_wait(&env, &daemon);
        daemon.stop();
    });
}
