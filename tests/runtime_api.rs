//! The runtime API end to end (docs/runtime-api.md): the real daemon
//! binary, real HTTP on its TCP listeners, the real unix socket
//! `<journal-dir>/api.sock`, real mounts, and `volumed wait-pod`:
//!
//! - a long-poll started before its pod exists returns once the pod's
//!   volumes are mounted, on both listeners and through `wait-pod`;
//! - a long-poll for `unmounted=1` returns once the deleted pod's volumes
//!   are unmounted, and `wait-pod --unmounted` says the same (exit 1 while
//!   they are mounted, 0 once gone);
//! - a local PV whose device is missing: the wait ends at its time with
//!   `ready: false` and the blocking errors, `wait-pod` exits 1;
//! - an unknown pod is 404, a malformed uid or wait 400 naming it, and the
//!   daemon keeps serving;
//! - the socket is mode 0600, replaces a stale one, and goes at stop;
//!   `wait-pod` with no daemon exits 2 saying so;
//! - the TCP listener serves only the probes and `/metrics`: `/v1/*` and
//!   `/debug/*` are refused there (403) at once, served on the socket, and
//!   on TCP only with `--debug-listen`;
//! - long-polls in flight do not keep `/metrics`, `/healthz` or `/readyz`
//!   from answering, and SIGTERM answers them at once.
//!
//! Each test runs as root in its own private mount namespace (the daemon
//! makes its root a shared mount), as `daemon_e2e` does.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::fs;
use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::daemon::{BIN, Daemon, Env, real};
use volumed::host::mountinfo::MountTable;

const POD: &str = "rt-pod-a";
const PV: &str = "pv-rt";
const PVC: &str = "data-rt";

/// A pod with a tmpfs emptyDir `cache` and a disk emptyDir `scratch`.
fn emptydir_pod(uid: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {uid}, namespace: default, uid: {uid}}}
spec:
  containers:
  - name: app
    image: busybox
    volumeMounts: [{{name: cache, mountPath: /cache}}, {{name: scratch, mountPath: /scratch}}]
  volumes:
  - name: cache
    emptyDir: {{medium: Memory}}
  - name: scratch
    emptyDir: {{}}
"
    )
}

/// A local PV on `device` with its bound claim, and a pod using it as
/// `data` beside a tmpfs `cache`.
fn pv_and_pod(device: &Path, uid: &str) -> (String, String) {
    let objects = format!(
        "apiVersion: v1
kind: PersistentVolume
metadata: {{name: {PV}}}
spec:
  capacity: {{storage: 64Mi}}
  accessModes: [ReadWriteOnce]
  storageClassName: local
  claimRef: {{namespace: default, name: {PVC}}}
  local: {{path: {device}, fsType: ext4}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: {PVC}, namespace: default}}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: local
  volumeName: {PV}
  resources: {{requests: {{storage: 64Mi}}}}
",
        device = device.display()
    );
    let pod = format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {uid}, namespace: default, uid: {uid}}}
spec:
  containers: [{{name: app, image: busybox}}]
  volumes:
  - name: cache
    emptyDir: {{medium: Memory}}
  - name: data
    persistentVolumeClaim: {{claimName: {PVC}}}
"
    );
    (objects, pod)
}

/// One GET over the daemon's unix socket: (status, body).
fn unix_get(journal: &Path, path: &str, timeout: Duration) -> (u16, String) {
    support::daemon::unix_get(&journal.join("api.sock"), path, timeout)
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// One GET on the daemon's TCP listener with a long bound: (status, body).
fn tcp_get(daemon: &Daemon, path: &str, timeout: Duration) -> (u16, String) {
    let (status, body) = volumed::server::client::get(daemon.addr.unwrap(), path, timeout).unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// `volumed wait-pod` against the env's journal dir.
fn wait_pod(env: &Env, uid: &str, timeout: u64) -> Output {
    Command::new(BIN)
        .arg("wait-pod")
        .arg(uid)
        .args(["--timeout", &timeout.to_string()])
        .arg("--journal-dir")
        .arg(&env.journal)
        .output()
        .unwrap()
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[test]
fn a_long_poll_for_a_pod_not_yet_added_returns_once_its_volumes_are_mounted() {
    real("mounts tmpfs through the daemon", || {
        let mut env = Env::new("volumed-rt-wait");
        let daemon = env.start();
        let journal = env.journal.clone();
        let path = format!("/v1/pods/{POD}/volumes?wait=60");
        let asked = Instant::now();
        let over_unix = {
            let (journal, path) = (journal.clone(), path.clone());
            std::thread::spawn(move || unix_get(&journal, &path, Duration::from_secs(90)))
        };
        let over_unix_too = {
            let (journal, path) = (journal.clone(), path.clone());
            std::thread::spawn(move || unix_get(&journal, &path, Duration::from_secs(90)))
        };
        // both are waiting (the pod is unknown) before the pod exists
        std::thread::sleep(Duration::from_millis(500));
        assert!(!over_unix.is_finished() && !over_unix_too.is_finished());
        env.write_pod("a.yaml", &emptydir_pod(POD));

        let (status, body) = over_unix.join().unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(
            asked.elapsed() < Duration::from_secs(50),
            "woken, not timed out"
        );
        let doc = json(&body);
        assert_eq!(doc["pod_uid"], POD);
        assert_eq!(doc["ready"], true, "{doc:#}");
        assert_eq!(doc["errors"], serde_json::json!([]), "{doc:#}");
        let table = MountTable::read_self().unwrap();
        let vols = doc["volumes"].as_array().unwrap();
        let names: Vec<&str> = vols.iter().map(|v| v["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["cache", "scratch"], "{doc:#}");
        let cache = Path::new(vols[0]["host_path"].as_str().unwrap());
        assert_eq!(
            cache,
            env.pod_volume(POD, "kubernetes.io~empty-dir", "cache")
        );
        let fs_type = table.top_at(cache).map(|m| m.fs_type.clone());
        assert_eq!(fs_type.as_deref(), Some("tmpfs"), "the tmpfs is there");
        assert_eq!(vols[0]["read_only"], false);
        assert_eq!(vols[0]["selinux_context"], Value::Null);
        assert_eq!(
            vols[0]["selinux_relabel"], true,
            "an emptyDir is relabelled"
        );
        let (status, other_body) = over_unix_too.join().unwrap();
        assert_eq!(status, 200);
        assert_eq!(json(&other_body), doc, "same answer");

        // ready already: the CLI answers at once, exit 0, a line per volume
        let out = wait_pod(&env, POD, 30);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        assert_eq!(stdout.lines().count(), 2, "{stdout}");
        assert!(stdout.contains(cache.to_str().unwrap()), "{stdout}");
        daemon.stop();
    });
}

/// `volumed wait-pod --unmounted` against the env's journal dir.
fn wait_unmounted(env: &Env, uid: &str, timeout: u64) -> Output {
    Command::new(BIN)
        .args(["wait-pod", "--unmounted", uid])
        .args(["--timeout", &timeout.to_string()])
        .arg("--journal-dir")
        .arg(&env.journal)
        .output()
        .unwrap()
}

#[test]
fn a_long_poll_for_unmounted_returns_once_the_deleted_pod_s_volumes_are_gone() {
    real("mounts tmpfs through the daemon", || {
        let mut env = Env::new("volumed-rt-unmount");
        env.write_pod("a.yaml", &emptydir_pod(POD));
        let daemon = env.start();
        let t = Duration::from_secs(90);
        let (status, body) = unix_get(&env.journal, &format!("/v1/pods/{POD}/volumes?wait=60"), t);
        assert_eq!(
            (status, json(&body)["ready"].clone()),
            (200, Value::Bool(true))
        );

        // mounted: the answer at once says which, and the CLI exits 1
        let (status, body) = unix_get(
            &env.journal,
            &format!("/v1/pods/{POD}/volumes?unmounted=1"),
            t,
        );
        assert_eq!(status, 200, "{body}");
        let doc = json(&body);
        assert_eq!(doc["pod_uid"], POD);
        assert_eq!(doc["unmounted"], false, "{doc:#}");
        assert_eq!(doc["mounted"], serde_json::json!(["cache", "scratch"]));
        let out = wait_unmounted(&env, POD, 1);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert!(
            stderr.contains("mounted volumes=[cache scratch]"),
            "{stderr}"
        );

        let asked = Instant::now();
        let waiter = {
            let journal = env.journal.clone();
            let path = format!("/v1/pods/{POD}/volumes?unmounted=1&wait=60");
            std::thread::spawn(move || unix_get(&journal, &path, t))
        };
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            !waiter.is_finished(),
            "waits while the pod's volumes are mounted"
        );
        let cache = env.pod_volume(POD, "kubernetes.io~empty-dir", "cache");
        env.remove_pod("a.yaml");
        let (status, body) = waiter.join().unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(
            asked.elapsed() < Duration::from_secs(50),
            "woken, not timed out"
        );
        let doc = json(&body);
        assert_eq!(doc["unmounted"], true, "{doc:#}");
        assert_eq!(doc["mounted"], serde_json::json!([]));
        let table = MountTable::read_self().unwrap();
        assert!(table.top_at(&cache).is_none(), "the tmpfs is gone");

        let out = wait_unmounted(&env, POD, 5);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        // a pod volumed never knew has nothing mounted
        assert_eq!(wait_unmounted(&env, "nobody", 0).status.code(), Some(0));
        let (status, body) = unix_get(&env.journal, "/v1/pods/x/volumes?unmounted=maybe", t);
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("unmounted \"maybe\""), "{body}");
        daemon.stop();
    });
}

#[test]
fn a_local_pv_whose_device_is_missing_blocks_the_wait_with_its_error() {
    real("mounts through the daemon", || {
        let mut env = Env::new("volumed-rt-missing");
        let missing = env.scratch.path().join("no-such-disk");
        let (objects, pod) = pv_and_pod(&missing, POD);
        fs::write(env.objects.join("pv.yaml"), objects).unwrap();
        env.write_pod("a.yaml", &pod);
        let daemon = env.start();

        let asked = Instant::now();
        let (status, body) = unix_get(
            &env.journal,
            &format!("/v1/pods/{POD}/volumes?wait=3"),
            Duration::from_secs(30),
        );
        assert_eq!(status, 200, "{body}");
        assert!(asked.elapsed() >= Duration::from_secs(3), "waited its time");
        let doc = json(&body);
        assert_eq!(doc["ready"], false, "{doc:#}");
        let names: Vec<&str> = doc["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["cache"], "the mounted one is listed: {doc:#}");
        let errors: Vec<&str> = doc["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap())
            .collect();
        assert_eq!(errors[0], "unmounted volumes=[data]", "{doc:#}");
        let missing = missing.to_str().unwrap();
        assert!(
            errors[1..].iter().any(|e| e.contains(missing)),
            "an error names the missing device: {errors:?}"
        );

        let out = wait_pod(&env, POD, 1);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert!(stderr.contains("unmounted volumes=[data]"), "{stderr}");
        assert!(stderr.contains(missing), "{stderr}");
        daemon.stop();
    });
}

#[test]
fn unknown_pods_are_404_and_bad_requests_400_while_the_daemon_keeps_serving() {
    real("runs the daemon", || {
        let mut env = Env::new("volumed-rt-bad");
        let daemon = env.start();
        let j = env.journal.clone();
        let t = Duration::from_secs(30);

        let (status, body) = unix_get(&j, "/v1/pods/nobody/volumes", t);
        assert_eq!(
            (status, body.trim()),
            (404, "pod nobody: volumed does not know this pod")
        );
        let asked = Instant::now();
        let (status, _) = unix_get(&j, "/v1/pods/nobody/volumes?wait=1", t);
        assert_eq!(status, 404, "still unknown when the wait is over");
        assert!(asked.elapsed() >= Duration::from_secs(1));

        let (status, body) = unix_get(&j, "/v1/pods/a%20b/volumes", t);
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("pod uid \"a%20b\""), "names the uid: {body}");
        for (wait, says) in [
            ("soon", "wait \"soon\": not a whole number of seconds"),
            ("-1", "wait \"-1\""),
            ("99999", "wait 99999: longer than"),
        ] {
            let (status, body) = unix_get(&j, &format!("/v1/pods/x/volumes?wait={wait}"), t);
            assert_eq!(status, 400, "{body}");
            assert!(body.contains(says), "{wait}: {body}");
        }
        let (status, _) = unix_get(&j, "/v1/pods//volumes", t);
        assert_eq!(status, 400, "an empty uid");

        let out = wait_pod(&env, "nobody", 0);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert!(stderr.contains("does not know this pod"), "{stderr}");
        let out = wait_pod(&env, "a/b", 0);
        assert_eq!(out.status.code(), Some(2), "a bad uid: {out:?}");

        assert_eq!(tcp_get(&daemon, "/healthz", t).0, 200);
        assert_eq!(unix_get(&j, "/readyz", t).0, 200);
        daemon.stop();
    });
}

#[test]
fn the_socket_is_0600_replaces_a_stale_one_and_goes_at_stop() {
    real("runs the daemon", || {
        let mut env = Env::new("volumed-rt-socket");
        let sock = env.journal.join("api.sock");
        fs::create_dir_all(&env.journal).unwrap();
        // left by a daemon that died: nobody listens on it
        drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
        let out = wait_pod(&env, POD, 0);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        assert!(stderr.contains("no volumed daemon is running"), "{stderr}");
        assert!(stderr.contains("nobody listens"), "{stderr}");

        let daemon = env.start();
        let meta = fs::metadata(&sock).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(
            unix_get(&env.journal, "/healthz", Duration::from_secs(10)).0,
            200
        );
        daemon.stop();
        assert!(!sock.exists(), "removed at stop");
        let out = wait_pod(&env, POD, 0);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        assert!(stderr.contains("does not exist"), "{stderr}");
    });
}

#[test]
fn long_polls_in_flight_leave_metrics_and_probes_answering_and_stop_answers_them() {
    real("runs the daemon", || {
        let mut env = Env::new("volumed-rt-busy");
        let daemon = env.start();
        // more waiters than the server has threads
        let waiters: Vec<_> = (0..24)
            .map(|i| {
                let journal = env.journal.clone();
                std::thread::spawn(move || {
                    let path = format!("/v1/pods/nobody-{i}/volumes?wait=300");
                    unix_get(&journal, &path, Duration::from_secs(120)).0
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            waiters.iter().all(|w| !w.is_finished()),
            "all still waiting"
        );
        let t = Duration::from_secs(5);
        for path in ["/metrics", "/healthz", "/readyz"] {
            let asked = Instant::now();
            assert_eq!(tcp_get(&daemon, path, t).0, 200, "{path}");
            assert!(asked.elapsed() < t, "{path}");
        }
        assert_eq!(unix_get(&env.journal, "/metrics", t).0, 200);
        assert_eq!(unix_get(&env.journal, "/debug/state", t).0, 200);

        let asked = Instant::now();
        daemon.stop();
        for w in waiters {
            assert_eq!(w.join().unwrap(), 404, "answered with what is true then");
        }
        assert!(
            asked.elapsed() < Duration::from_secs(20),
            "the waiters did not hold the stop for their 300 s"
        );
    });
}

#[test]
fn the_tcp_listener_refuses_the_runtime_api_and_debug_which_the_socket_serves() {
    real("runs the daemon", || {
        let mut env = Env::new("volumed-rt-scope");
        // a free port for the lab listener (bound, read, let go)
        let debug = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        env.extra_args = vec!["--debug-listen".into(), debug.to_string()];
        env.write_pod("a.yaml", &emptydir_pod(POD));
        let daemon = env.start();
        let t = Duration::from_secs(30);
        let (status, body) = unix_get(&env.journal, &format!("/v1/pods/{POD}/volumes?wait=60"), t);
        assert_eq!(
            (status, json(&body)["ready"].clone()),
            (200, Value::Bool(true))
        );
        for path in [
            format!("/v1/pods/{POD}/volumes"),
            "/v1/pods/nobody/volumes?wait=300".to_owned(),
            format!("/v1/pods/{POD}/volumes?unmounted=1&wait=300"),
            "/debug/state".to_owned(),
            "/debug/journal".to_owned(),
            "/debug/events".to_owned(),
            "/debug/health".to_owned(),
        ] {
            let asked = Instant::now();
            let (status, body) = tcp_get(&daemon, &path, t);
            assert_eq!(status, 403, "{path}: {body}");
            assert!(body.contains("api.sock"), "{path}: {body}");
            let root = env.root.to_string_lossy().into_owned();
            assert!(!body.contains(&root), "{path}: no path of the node: {body}");
            assert!(
                asked.elapsed() < Duration::from_secs(10),
                "{path}: answered at once"
            );
            let on_socket = unix_get(&env.journal, &path.replace("wait=300", "wait=0"), t).0;
            assert!(
                on_socket != 403 && on_socket != 0,
                "{path} is served on the socket: {on_socket}"
            );
        }
        for path in ["/healthz", "/readyz", "/metrics"] {
            assert_eq!(tcp_get(&daemon, path, t).0, 200, "{path}");
        }
        // daemon.json names the lab listener; the lab listener serves
        // everything over TCP
        let file = volumed::server::daemon_file::DaemonFile::read(&env.journal)
            .unwrap()
            .unwrap();
        assert_eq!(file.debug_listen, Some(debug.to_string()), "{file:?}");
        let (status, body) =
            volumed::server::client::get(debug, &format!("/v1/pods/{POD}/volumes"), t).unwrap();
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        assert_eq!(
            volumed::server::client::get(debug, "/debug/state", t)
                .unwrap()
                .0,
            200
        );
        daemon.stop();
    });
}
