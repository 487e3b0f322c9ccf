//! The per-container mounts endpoint end to end (docs/http.md): the real
//! daemon, the real unix socket, real tmpfs and disk emptyDirs, real
//! subpath binds, and `volumed mounts`:
//!
//! - a container's mounts in CRI's shape: `read_only` the volume's OR the
//!   mount's, `propagation` translated, a `subPath` and a `subPathExpr`
//!   bound at `pods/<uid>/volume-subpaths/<volume>/<container>/<index>`
//!   (a missing subpath made as a directory), asked twice without a
//!   second mount stacked;
//! - a subpath through a symlink that stays inside its volume (as a
//!   configMap key goes through `..data`) is bound to the file it names;
//! - refusals naming container, mount and path, with no mount made: a
//!   symlink out of the volume, a socket, `..`, a `subPathExpr` naming an
//!   unknown variable, `Bidirectional` in an unprivileged container;
//! - deleting the pod unmounts every subpath bind before the volumes' and
//!   leaves no pod dir;
//! - a kubelet node's leftover subpath bind of a dead pod is unmounted and
//!   its pod dir removed.
//!
//! Each test runs as root in its own private mount namespace.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::ffi::OsStr;
use std::fs;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use support::daemon::{BIN, Env, pod_gone_from_state, real};
use volumed::host::mountinfo::MountTable;

const POD: &str = "sub-pod-a";

fn pod() -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: web, namespace: default, uid: {POD}}}
spec:
  containers:
  - name: app
    image: busybox
    env:
    - {{name: SHARD, value: s1}}
    - name: POD
      valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}
    volumeMounts:
    - {{name: data, mountPath: /data, readOnly: true, mountPropagation: HostToContainer}}
    - {{name: data, mountPath: /logs, subPath: logs/app}}
    - {{name: scratch, mountPath: /shard, subPathExpr: '$(SHARD)/$(POD)'}}
    - {{name: scratch, mountPath: /escape, subPath: link/passwd}}
    - {{name: scratch, mountPath: /sock, subPath: s.sock}}
    - {{name: scratch, mountPath: /up, subPath: a/../../b}}
    - {{name: scratch, mountPath: /unknown, subPathExpr: '$(NOPE)'}}
    - {{name: data, mountPath: /bidi, mountPropagation: Bidirectional}}
    - {{name: data, mountPath: /file, subPath: conf/app.conf}}
    - {{name: data, mountPath: /via-link, subPath: cur/app.conf}}
  volumes:
  - name: data
    emptyDir: {{medium: Memory}}
  - name: scratch
    emptyDir: {{}}
"
    )
}

/// One GET over the daemon's unix socket: (status, body).
fn unix_get(journal: &Path, path: &str) -> (u16, String) {
    support::daemon::unix_get(&journal.join("api.sock"), path, Duration::from_secs(90))
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

fn ask(env: &Env) -> Value {
    let (status, body) = unix_get(
        &env.journal,
        &format!("/v1/pods/{POD}/containers/app/mounts?wait=60"),
    );
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

fn subpath(env: &Env, volume: &str, index: usize) -> PathBuf {
    env.root
        .join("pods")
        .join(POD)
        .join("volume-subpaths")
        .join(volume)
        .join("app")
        .join(index.to_string())
}

/// How many mounts sit at `path`.
fn mounts_at(path: &Path) -> usize {
    let table = MountTable::read_self().unwrap();
    table
        .entries()
        .iter()
        .filter(|m| m.mount_point == path)
        .count()
}

#[test]
fn a_container_s_mounts_bind_its_subpaths_refuse_escapes_and_go_with_the_pod() {
    real("mounts tmpfs and binds through the daemon", || {
        let mut env = Env::new("volumed-subpath");
        let daemon = env.start();
        env.write_pod("a.yaml", &pod());
        let data = env.pod_volume(POD, "kubernetes.io~empty-dir", "data");
        let scratch = env.pod_volume(POD, "kubernetes.io~empty-dir", "scratch");
        // the volumes first (the answer waits for them); then what a
        // hostile container could have left in its own volume: a symlink
        // out of it, a socket, and a file for the file subpath
        let (status, _) = unix_get(&env.journal, &format!("/v1/pods/{POD}/volumes?wait=60"));
        assert_eq!(status, 200);
        std::os::unix::fs::symlink("/etc", scratch.join("link")).unwrap();
        let _listener = UnixListener::bind(scratch.join("s.sock")).unwrap();
        fs::create_dir_all(data.join("conf")).unwrap();
        fs::write(data.join("conf/app.conf"), "k=v\n").unwrap();
        // a symlink that stays inside, as a configMap key goes through `..data`
        std::os::unix::fs::symlink("conf", data.join("cur")).unwrap();

        let doc = ask(&env);
        assert_eq!(doc["pod_uid"], POD);
        assert_eq!(doc["container"], "app");
        assert_eq!(doc["ready"], false, "refused mounts: not ready");
        assert_eq!(doc["devices"], json!([]));
        assert_eq!(doc["supplemental_groups"], json!([]));
        let mounts = doc["mounts"].as_array().unwrap();
        let got: Vec<(&str, &str, bool, &str)> = mounts
            .iter()
            .map(|m| {
                (
                    m["container_path"].as_str().unwrap(),
                    m["host_path"].as_str().unwrap(),
                    m["read_only"].as_bool().unwrap(),
                    m["propagation"].as_str().unwrap(),
                )
            })
            .collect();
        let logs = subpath(&env, "data", 1);
        let shard = subpath(&env, "scratch", 2);
        let file = subpath(&env, "data", 8);
        let via_link = subpath(&env, "data", 9);
        assert_eq!(
            got,
            [
                ("/data", data.to_str().unwrap(), true, "rslave"),
                ("/logs", logs.to_str().unwrap(), false, "private"),
                ("/shard", shard.to_str().unwrap(), false, "private"),
                ("/file", file.to_str().unwrap(), false, "private"),
                ("/via-link", via_link.to_str().unwrap(), false, "private"),
            ],
            "{doc:#}"
        );
        assert!(mounts.iter().all(|m| m["selinux_relabel"] == true));
        // the missing subpaths were made as directories, and each bind
        // shows its volume's files
        assert!(data.join("logs/app").is_dir() && scratch.join("s1/web-e2e-node").is_dir());
        fs::write(logs.join("written-through-the-bind"), "x").unwrap();
        assert!(data.join("logs/app/written-through-the-bind").exists());
        assert_eq!(fs::read_to_string(&file).unwrap(), "k=v\n");
        assert_eq!(fs::read_to_string(&via_link).unwrap(), "k=v\n");
        assert!(via_link.is_file(), "bound onto a file, not the link");
        for p in [&logs, &shard, &file, &via_link] {
            assert_eq!(mounts_at(p), 1, "{}", p.display());
        }
        // each bind is journaled: dump's subpaths, mounted, with the
        // subpath it serves (the refused ones are failed, not mounted)
        let journaled = |doc: &Value| -> Vec<(String, u64, String, String)> {
            doc["subpaths"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(|b| {
                    (
                        b["name"].as_str().unwrap().to_owned(),
                        b["index"].as_u64().unwrap(),
                        b["sub_path"].as_str().unwrap().to_owned(),
                        b["state"].as_str().unwrap().to_owned(),
                    )
                })
                .filter(|b| b.3 == "mounted")
                .collect()
        };
        let (status, body) = unix_get(&env.journal, "/debug/journal");
        assert_eq!(status, 200, "{body}");
        let dump: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            journaled(&dump),
            [
                ("data".into(), 1, "logs/app".into(), "mounted".into()),
                ("data".into(), 8, "conf/app.conf".into(), "mounted".into()),
                ("data".into(), 9, "cur/app.conf".into(), "mounted".into()),
                (
                    "scratch".into(),
                    2,
                    "s1/web-e2e-node".into(),
                    "mounted".into()
                ),
            ],
            "{:#}",
            dump["subpaths"]
        );

        let errors: Vec<&str> = doc["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap())
            .collect();
        // the spec's refusals first, then those found on the host
        let want = [
            ("\"/up\"", "a/../../b", "must not contain '..'"),
            ("\"/unknown\"", "$(NOPE)", "missing value for NOPE"),
            ("\"/bidi\"", "", "privileged"),
            ("\"/escape\"", "link/passwd", "resolves out of the volume"),
            ("\"/sock\"", "s.sock", "is a socket"),
        ];
        assert_eq!(errors.len(), want.len(), "{errors:#?}");
        for (e, (at, path, why)) in errors.iter().zip(want) {
            assert!(e.starts_with("container \"app\": volumeMount "), "{e}");
            assert!(e.contains(at) && e.contains(path) && e.contains(why), "{e}");
        }
        for index in [3, 4, 5, 6] {
            let p = subpath(&env, "scratch", index);
            assert_eq!(mounts_at(&p), 0, "no mount for a refused subpath");
        }
        assert!(!subpath(&env, "scratch", 3).exists(), "nothing made for it");

        // asked again (and through the CLI): the same binds, none stacked
        assert_eq!(ask(&env)["mounts"], doc["mounts"]);
        let out = Command::new(BIN)
            .args(["mounts", POD, "app", "--json", "--timeout", "5"])
            .arg("--journal-dir")
            .arg(&env.journal)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "not ready: {out:?}");
        let cli: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(cli["mounts"], doc["mounts"]);
        for p in [&logs, &shard, &file] {
            assert_eq!(mounts_at(p), 1, "{}", p.display());
        }
        let out = Command::new(BIN)
            .args(["mounts", POD, "nope", "--timeout", "0"])
            .arg("--journal-dir")
            .arg(&env.journal)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("no container \"nope\""));

        // the pod goes: binds first, then the volumes, then the pod dir
        env.remove_pod("a.yaml");
        daemon.wait_until("the pod's targets are gone", || {
            pod_gone_from_state(&daemon.state(), &env.root, POD)
        });
        daemon.wait_until("the pod dir is gone", || {
            !env.root.join("pods").join(POD).exists()
        });
        assert!(
            env.mounts_below_root().is_empty(),
            "{:?}",
            env.mounts_below_root()
        );
        // and the journal keeps none of its binds
        let (_, body) = unix_get(&env.journal, "/debug/journal");
        let dump: Value = serde_json::from_str(&body).unwrap();
        assert!(journaled(&dump).is_empty(), "{:#}", dump["subpaths"]);
        let unbinds = dump["records"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["op"] == "unbind_subpath" && r["type"] == "outcome")
            .count();
        assert!(unbinds >= 4, "each bind unbound, journaled: {unbinds}");
        daemon.stop();
    });
}

/// A kubelet node taken over: a dead pod's subpath bind (the kubelet's
/// `volume-subpaths/<volume>/<container>/<index>`, a bind of a directory
/// of its old emptyDir) is unmounted and the pod dir removed, the source's
/// files untouched.
#[test]
fn a_kubelet_s_leftover_subpath_bind_of_a_dead_pod_is_unmounted_and_removed() {
    real("bind-mounts a kubelet leftover", || {
        let mut env = Env::new("volumed-subpath-leftover");
        let uid = "kubelet-gone-pod";
        let mount = |args: &[&OsStr]| {
            let status = Command::new("mount").args(args).status().unwrap();
            assert!(status.success(), "mount {args:?}");
        };
        // the kubelet's root: a shared bind of itself, as the kubelet leaves it
        fs::create_dir_all(&env.root).unwrap();
        let root = env.root.as_os_str();
        mount(&["--bind".as_ref(), root, root]);
        mount(&["--make-shared".as_ref(), root]);
        let volume = env.pod_volume(uid, "kubernetes.io~empty-dir", "logs");
        fs::create_dir_all(volume.join("app")).unwrap();
        fs::write(volume.join("app/kept"), "data").unwrap();
        let bind = env
            .root
            .join("pods")
            .join(uid)
            .join("volume-subpaths/logs/app/0");
        fs::create_dir_all(&bind).unwrap();
        mount(&[
            "--bind".as_ref(),
            volume.join("app").as_os_str(),
            bind.as_os_str(),
        ]);
        assert_eq!(mounts_at(&bind), 1);

        let daemon = env.start();
        daemon.wait_until("the leftover bind is unmounted", || mounts_at(&bind) == 0);
        daemon.wait_until("the dead pod's dir is gone", || {
            !env.root.join("pods").join(uid).exists()
        });
        assert!(env.mounts_below_root().is_empty());
        daemon.stop();
    });
}
