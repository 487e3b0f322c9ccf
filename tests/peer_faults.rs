//! Faults of the peers, end to end: the real `volumed run` binary while a
//! CSI driver or the API server misbehaves. In every test the rest of the
//! node keeps being served during the fault — a static pod's memory
//! emptyDir is mounted *and* unmounted, `/readyz`, `/metrics` and `volumed
//! dump` answer — and once the fault clears nothing is lost: the affected
//! volume mounts (once), the volumes of running pods were never unmounted
//! (the same mount, by mount id, from before the fault to after it), every
//! running pod is still in the DSW (the runtime API knows it, ready), and
//! the journal says what `/debug/state` says.
//!
//! CSI (the real test driver, `volumed-testdriver`, with its fault file):
//! 1. calls that hang (never answered) hold only their driver's workers:
//!    emptyDirs and another driver's volume go on before the timeout
//!    fires; then the targets are uncertain and the calls retried; once
//!    the driver answers, each volume mounts once;
//! 2. a driver SIGKILLed in the middle of NodeStage and then of
//!    NodePublish, restarted each time: each call is made again, and the
//!    volume ends staged once and published once;
//! 3. a driver that dies after staging, before answering, its pod deleted
//!    while it is down: unstaged once it is back, nothing leaked;
//! 4. a socket that answers bytes that are not HTTP/2: an error naming
//!    the driver, retried with backoff, no panic; a real driver on that
//!    socket then mounts it;
//! 5. a gRPC reply whose message is not protobuf: the same.
//!
//! API server (the fake of `tests/support/apiserver/`, its fault rules):
//! 6. 500s on every list and watch of pods for a while: known pods stay
//!    mounted, a pod added meanwhile arrives once it recovers;
//! 7. a watch that sends its headers and then nothing: given up after the
//!    watch timeout (`--api-watch-timeout`, kube's 290 s otherwise), and
//!    what changed meanwhile arrives;
//! 8. a storm of `410 Gone` on every watch: relists that drop no pod and
//!    unmount nothing, spaced by the watcher's backoff.
//!
//! Each test runs as root in its own private mount namespace; every wait
//! is on a condition with a generous deadline, and the only timing
//! asserted is a lower bound (backoff), which load can only lengthen.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::apiserver::FakeApiServer;
use support::apiserver::faults::{Action, Fault, Verb};
use support::csi_driver::{DriverOpts, TestDriver};
use support::daemon::{Daemon, Env, NODE, pod_gone_from_state, real, series, targets};
use volumed::host::mountinfo::MountTable;

const EMPTY_DIR: &str = "kubernetes.io~empty-dir";
const CSI_DIR: &str = "kubernetes.io~csi";
const STAGE: &str = "NodeStageVolume";
const PUBLISH: &str = "NodePublishVolume";
const UNPUBLISH: &str = "NodeUnpublishVolume";
const UNSTAGE: &str = "NodeUnstageVolume";
const VOLUME_RPCS: [&str; 4] = [STAGE, PUBLISH, UNPUBLISH, UNSTAGE];
/// The static pod whose emptyDir is mounted before every fault and must
/// stay mounted through it.
const STEADY: &str = "steady-pod";
/// The pods' collection path on the API server.
const PODS: &str = "/api/v1/pods";

// ------------------------------------------------------------ the node

/// A static pod with a memory emptyDir `cache`.
fn static_pod(uid: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {uid}, namespace: default, uid: {uid}}}\n\
         spec:\n  containers: [{{name: c, image: busybox}}]\n  \
         volumes: [{{name: cache, emptyDir: {{medium: Memory}}}}]\n"
    )
}

fn cache_of(env: &Env, uid: &str) -> PathBuf {
    env.pod_volume(uid, EMPTY_DIR, "cache")
}

/// The id of the top mount exactly at `path`, if any.
fn mount_id(path: &Path) -> Option<u32> {
    MountTable::read_self()
        .unwrap()
        .entries()
        .iter()
        .rev()
        .find(|m| m.mount_point == path)
        .map(|m| m.mount_id)
}

/// How many mounts are stacked exactly at `path`.
fn mounts_at(path: &Path) -> usize {
    MountTable::read_self()
        .unwrap()
        .entries()
        .iter()
        .filter(|m| m.mount_point == path)
        .count()
}

/// The state `/debug/state` gives `path`, if it names it.
fn state_of(daemon: &Daemon, path: &Path) -> Option<String> {
    targets(&daemon.state()).get(path).map(|(_, s)| s.clone())
}

fn all_mounted(daemon: &Daemon, paths: &[PathBuf]) -> bool {
    let t = targets(&daemon.state());
    paths
        .iter()
        .all(|p| t.get(p).is_some_and(|(_, s)| s == "mounted"))
}

/// The errors `/debug/state` holds for `uid`, joined.
fn pod_errors(daemon: &Daemon, uid: &str) -> String {
    daemon.state()["pod_errors"][uid]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// The mounts that must survive a fault untouched: path → mount id.
struct Survivors(BTreeMap<PathBuf, u32>);

impl Survivors {
    /// Takes the mount ids of `paths`, each of which must be mounted.
    #[track_caller]
    fn of(paths: &[PathBuf]) -> Self {
        Survivors(
            paths
                .iter()
                .map(|p| {
                    let id = mount_id(p).unwrap_or_else(|| panic!("{} not mounted", p.display()));
                    (p.clone(), id)
                })
                .collect(),
        )
    }

    /// Each is still the very same mount (never unmounted and mounted
    /// again) and `mounted` in `/debug/state`.
    #[track_caller]
    fn check(&self, daemon: &Daemon) {
        let t = targets(&daemon.state());
        for (p, id) in &self.0 {
            assert_eq!(
                mount_id(p),
                Some(*id),
                "{} is still the mount it was before the fault\n{}",
                p.display(),
                daemon.log_tail()
            );
            assert_eq!(
                t.get(p).map(|(_, s)| s.as_str()),
                Some("mounted"),
                "{} in /debug/state",
                p.display()
            );
        }
    }
}

/// The rest of the node is served while a peer misbehaves: a new static
/// pod's emptyDir is mounted, then unmounted once its manifest goes, and
/// `/readyz`, `/metrics` and `dump` answer. `round` names the pod.
#[track_caller]
fn others_keep_going(env: &Env, daemon: &Daemon, round: &str) {
    let uid = format!("churn-{round}");
    let file = format!("{uid}.yaml");
    env.write_pod(&file, &static_pod(&uid));
    let cache = cache_of(env, &uid);
    daemon.wait_until(&format!("{uid}'s emptyDir mounted"), || {
        all_mounted(daemon, std::slice::from_ref(&cache)) && mount_id(&cache).is_some()
    });
    env.remove_pod(&file);
    daemon.wait_until(&format!("{uid}'s emptyDir unmounted"), || {
        pod_gone_from_state(&daemon.state(), &env.root, &uid) && mount_id(&cache).is_none()
    });
    assert_eq!(daemon.try_get("/readyz").0, 200, "/readyz");
    assert!(
        daemon.metrics().contains("volumed_"),
        "/metrics answers volumed's series"
    );
    assert!(env.dump()["state"]["volumes"].is_array(), "dump");
}

/// The runtime API knows `uid` (it is in the DSW) and says it is ready.
#[track_caller]
fn in_dsw_and_ready(daemon: &Daemon, uid: &str) {
    let (status, body) = daemon.try_get(&format!("/v1/pods/{uid}/volumes"));
    assert_eq!(status, 200, "pod {uid} in the DSW: {body}");
    let doc: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["ready"], true, "pod {uid} ready: {doc}");
}

/// What the journal holds of a state document: its targets that are not
/// `none`, without the health report (as in `daemon_e2e`).
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
    json!({ "volumes": volumes })
}

/// The journal (read by `dump`) comes to say what `/debug/state` says.
#[track_caller]
fn journal_consistent(env: &Env, daemon: &Daemon) {
    let deadline = Instant::now() + support::daemon::WAIT;
    loop {
        let (journal, live) = (journaled(&env.dump()["state"]), journaled(&daemon.state()));
        if journal == live {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the journal says what /debug/state says:\n{journal:#}\n---\n{live:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// After a fault: every pod of `ready` in the DSW and ready, the journal
/// saying what `/debug/state` says, no panic in the log; then the daemon
/// stopped.
#[track_caller]
fn nothing_lost(env: &Env, daemon: Daemon, ready: &[&str]) {
    for uid in ready {
        in_dsw_and_ready(&daemon, uid);
    }
    journal_consistent(env, &daemon);
    no_panic(&daemon);
    daemon.stop();
}

/// No panic in the daemon's log.
#[track_caller]
fn no_panic(daemon: &Daemon) {
    let log = daemon.log();
    assert!(!log.contains("panicked"), "{}", daemon.log_tail());
}

/// An env with the steady static pod, started, its emptyDir mounted.
fn started_with_steady(env: &mut Env) -> Daemon {
    env.write_pod("steady.yaml", &static_pod(STEADY));
    let daemon = env.start();
    let steady = cache_of(env, STEADY);
    daemon.wait_until("the steady pod's emptyDir mounted", || {
        all_mounted(&daemon, std::slice::from_ref(&steady)) && mount_id(&steady).is_some()
    });
    daemon
}

// ------------------------------------------------------------- CSI

/// One CSI driver's objects: PV `pv-<driver>-<i>` with handle
/// `vol-<driver>-<i>` and its bound claim `claim-<driver>-<i>` for each
/// of `volumes`, and the CSIDriver (no attach).
fn csi_objects(driver: &str, volumes: usize) -> String {
    let mut text = format!(
        "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {{name: {driver}}}\n\
         spec: {{attachRequired: false}}\n"
    );
    for i in 0..volumes {
        text.push_str(&format!(
            "---
apiVersion: v1
kind: PersistentVolume
metadata: {{name: pv-{driver}-{i}}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteMany]
  claimRef: {{namespace: default, name: claim-{driver}-{i}}}
  csi: {{driver: {driver}, volumeHandle: vol-{driver}-{i}}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: claim-{driver}-{i}, namespace: default}}
spec:
  accessModes: [ReadWriteMany]
  volumeName: pv-{driver}-{i}
  resources: {{requests: {{storage: 1Gi}}}}
"
        ));
    }
    text
}

/// A static pod mounting `driver`'s claim `i` as `data`.
fn csi_pod(uid: &str, driver: &str, i: usize) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {uid}, namespace: default, uid: {uid}}}\n\
         spec:\n  containers: [{{name: c, image: busybox}}]\n  \
         volumes: [{{name: data, persistentVolumeClaim: {{claimName: claim-{driver}-{i}}}}}]\n"
    )
}

/// `uid`'s publish target for `driver`'s PV `i`.
fn csi_target(env: &Env, uid: &str, driver: &str, i: usize) -> PathBuf {
    env.pod_volume(uid, CSI_DIR, &format!("pv-{driver}-{i}"))
        .join("mount")
}

/// `driver`'s staging path of volume `i` (the kubelet's `<sha256 of the
/// handle>`).
fn staging(env: &Env, driver: &str, i: usize) -> PathBuf {
    let out = std::process::Command::new("sh")
        .args(["-c", "printf %s \"$1\" | sha256sum", "sh"])
        .arg(format!("vol-{driver}-{i}"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let sha = String::from_utf8(out.stdout).unwrap()[..64].to_owned();
    env.root
        .join("plugins/kubernetes.io/csi")
        .join(driver)
        .join(sha)
        .join("globalmount")
}

/// Adds `driver`'s objects (`volumes` PVs) to the env and its
/// `--csi-driver` flag; the driver's socket and state go in
/// `<scratch>/<driver>/`.
fn add_driver(env: &mut Env, driver: &str, volumes: usize) -> DriverOpts {
    fs::write(
        env.objects.join(format!("{driver}.yaml")),
        csi_objects(driver, volumes),
    )
    .unwrap();
    let mut opts = DriverOpts::in_dir(driver, &env.scratch.path().join(driver));
    opts.node_id = Some(NODE.to_owned());
    env.extra_args.extend([
        "--csi-driver".to_owned(),
        format!("{driver}={}", opts.endpoint.display()),
    ]);
    opts
}

/// The volume RPCs a driver logged, with the pid that got each.
fn volume_calls(driver: &TestDriver) -> Vec<(String, u64)> {
    driver
        .calls()
        .iter()
        .filter_map(|c| {
            let m = c["method"].as_str()?;
            VOLUME_RPCS
                .contains(&m)
                .then(|| (m.to_owned(), c["pid"].as_u64().unwrap_or(0)))
        })
        .collect()
}

fn methods(driver: &TestDriver) -> Vec<String> {
    volume_calls(driver).into_iter().map(|(m, _)| m).collect()
}

/// Staged once (one mount at the staging path) and published once (one
/// bind of it at the target).
#[track_caller]
fn staged_and_published_once(env: &Env, driver: &str, uid: &str, i: usize) {
    let (stage, target) = (staging(env, driver, i), csi_target(env, uid, driver, i));
    assert_eq!(mounts_at(&stage), 1, "one mount at {}", stage.display());
    assert_eq!(mounts_at(&target), 1, "one mount at {}", target.display());
}

/// Two NodeStage calls that never answer hold both workers of their
/// driver (`--workers 2`): while they hang, emptyDirs are mounted and
/// unmounted and another driver's volume mounts — before either call
/// has timed out. Then `--csi-timeout 10` fires: the staging targets are
/// uncertain and the pods' errors say DeadlineExceeded naming the driver,
/// and the stages are retried (hanging again). Once the driver answers,
/// both volumes mount, once each.
#[test]
fn a_hung_csi_call_times_out_and_blocks_nothing_else() {
    real("CSI calls that hang", || {
        const HUNG: &str = "hung.csi.test";
        const GOOD: &str = "good.csi.test";
        let mut env = Env::new("volumed-peer-hang-");
        let hung_opts = add_driver(&mut env, HUNG, 2);
        let good_opts = add_driver(&mut env, GOOD, 1);
        env.extra_args
            .extend(["--csi-timeout", "10", "--workers", "2"].map(str::to_owned));
        let hung = TestDriver::spawn(hung_opts);
        let good = TestDriver::spawn(good_opts);
        hung.set_faults(json!([{"method": STAGE, "hang": true}]));
        let daemon = started_with_steady(&mut env);
        let survivors = Survivors::of(&[cache_of(&env, STEADY)]);

        env.write_pod("h0.yaml", &csi_pod("pod-h0", HUNG, 0));
        env.write_pod("h1.yaml", &csi_pod("pod-h1", HUNG, 1));
        daemon.wait_until("both stages called, and hanging", || hung.count(STAGE) >= 2);
        // Meanwhile: emptyDirs, and another driver's volume.
        env.write_pod("g.yaml", &csi_pod("pod-g", GOOD, 0));
        others_keep_going(&env, &daemon, "hang");
        let good_target = csi_target(&env, "pod-g", GOOD, 0);
        daemon.wait_until("the other driver's volume mounted", || {
            all_mounted(&daemon, std::slice::from_ref(&good_target))
        });
        let timed_out = |uid| pod_errors(&daemon, uid).contains("DeadlineExceeded");
        assert!(
            hung.count(STAGE) == 2 && !timed_out("pod-h0") && !timed_out("pod-h1"),
            "the other volumes went on while both hung calls were still out: {:?}\n{}",
            methods(&hung),
            daemon.log_tail()
        );

        daemon.wait_until("both stages timed out and were called again", || {
            hung.count(STAGE) >= 3 && timed_out("pod-h0") && timed_out("pod-h1")
        });
        for (uid, i) in [("pod-h0", 0), ("pod-h1", 1)] {
            assert!(
                pod_errors(&daemon, uid).contains(HUNG),
                "{}",
                pod_errors(&daemon, uid)
            );
            let state = state_of(&daemon, &staging(&env, HUNG, i));
            assert!(
                matches!(state.as_deref(), Some("uncertain") | None),
                "a stage that timed out is uncertain (the kubelet's rule), never mounted: {state:?}"
            );
        }

        hung.clear_faults();
        let want = [
            csi_target(&env, "pod-h0", HUNG, 0),
            csi_target(&env, "pod-h1", HUNG, 1),
        ];
        daemon.wait_until("both hung volumes mounted once the driver answers", || {
            all_mounted(&daemon, &want)
        });
        staged_and_published_once(&env, HUNG, "pod-h0", 0);
        staged_and_published_once(&env, HUNG, "pod-h1", 1);
        staged_and_published_once(&env, GOOD, "pod-g", 0);
        assert_eq!(methods(&good), [STAGE, PUBLISH]);
        let calls = methods(&hung);
        assert_eq!(
            calls.iter().filter(|m| *m == PUBLISH).count(),
            2,
            "{calls:?}"
        );
        survivors.check(&daemon);
        nothing_lost(&env, daemon, &[STEADY, "pod-h0", "pod-h1", "pod-g"]);
    });
}

/// Waits until `driver`'s calls include `n` of `method`.
fn wait_calls(daemon: &Daemon, driver: &TestDriver, method: &str, n: usize) {
    daemon.wait_until(&format!("{n} {method} call(s)"), || {
        driver.count(method) >= n
    });
}

/// The driver is SIGKILLed while it works on NodeStage (inside a delay,
/// before it mounted), restarted, then SIGKILLed again inside NodePublish
/// and restarted: each call is made again on the new process, and the
/// volume ends staged once and published once. The emptyDirs go on while
/// each call is in flight and while the driver is dead.
#[test]
fn a_driver_killed_mid_call_and_restarted_mounts_once() {
    real("a CSI driver SIGKILLed in the middle of calls", || {
        let mut env = Env::new("volumed-peer-midcall-");
        let opts = add_driver(&mut env, "dies.csi.test", 1);
        env.extra_args
            .extend(["--csi-timeout".to_owned(), "60".to_owned()]);
        let mut driver = TestDriver::spawn(opts.clone());
        driver.set_faults(json!([
            {"method": STAGE, "delay_ms": 60000, "times": 1},
            {"method": PUBLISH, "delay_ms": 60000, "times": 1}
        ]));
        let daemon = started_with_steady(&mut env);
        let survivors = Survivors::of(&[cache_of(&env, STEADY)]);
        env.write_pod("d.yaml", &csi_pod("pod-d", "dies.csi.test", 0));

        for (method, round) in [(STAGE, "stage"), (PUBLISH, "publish")] {
            wait_calls(&daemon, &driver, method, 1);
            others_keep_going(&env, &daemon, &format!("{round}-in-flight"));
            driver.kill();
            others_keep_going(&env, &daemon, &format!("{round}-driver-dead"));
            driver = TestDriver::spawn(opts.clone());
            wait_calls(&daemon, &driver, method, 2);
        }
        let target = csi_target(&env, "pod-d", "dies.csi.test", 0);
        daemon.wait_until("mounted after the restarts", || {
            all_mounted(
                &daemon,
                &[staging(&env, "dies.csi.test", 0), target.clone()],
            )
        });
        let calls = volume_calls(&driver);
        let shown = format!("{calls:?}\n{}", daemon.log_tail());
        let names: Vec<&str> = calls.iter().map(|(m, _)| m.as_str()).collect();
        assert_eq!(names, [STAGE, STAGE, PUBLISH, PUBLISH], "{shown}");
        let pids: Vec<u64> = calls.iter().map(|(_, p)| *p).collect();
        assert!(
            pids[0] != pids[1] && pids[1] == pids[2] && pids[2] != pids[3],
            "each call made again on the restarted driver: {shown}"
        );
        staged_and_published_once(&env, "dies.csi.test", "pod-d", 0);
        survivors.check(&daemon);
        in_dsw_and_ready(&daemon, "pod-d");
        in_dsw_and_ready(&daemon, STEADY);
        journal_consistent(&env, &daemon);

        env.remove_pod("d.yaml");
        daemon.wait_until("unpublished and unstaged", || {
            methods(&driver).last().is_some_and(|m| m == UNSTAGE) && mount_id(&target).is_none()
        });
        no_panic(&daemon);
        daemon.stop();
    });
}

/// The pod is deleted while its NodeStage is in flight; the driver
/// mounts, then dies before it answers (SIGKILL, `die_after_work`). The
/// lost answer is a transport error: grpc-go reports it to the kubelet as
/// UNAVAILABLE, not final, so the staging target is uncertain and, no pod
/// wanting it, unstaged. Once the driver is back the volume is unstaged —
/// its tmpfs not leaked — and nothing is published.
#[test]
fn a_driver_dead_after_staging_is_unstaged_once_the_pod_goes() {
    real("a CSI driver that dies after staging", || {
        const DRIVER: &str = "dies.csi.test";
        let mut env = Env::new("volumed-peer-dead-after-stage-");
        let opts = add_driver(&mut env, DRIVER, 1);
        let mut driver = TestDriver::spawn(opts.clone());
        driver.set_faults(json!([
            {"method": STAGE, "delay_ms": 1000, "die_after_work": true, "times": 1}
        ]));
        let daemon = started_with_steady(&mut env);
        let survivors = Survivors::of(&[cache_of(&env, STEADY)]);
        env.write_pod("d.yaml", &csi_pod("pod-d", DRIVER, 0));
        wait_calls(&daemon, &driver, STAGE, 1);
        env.remove_pod("d.yaml");
        driver.wait_exit(support::daemon::WAIT);
        let stage = staging(&env, DRIVER, 0);
        assert_eq!(mounts_at(&stage), 1, "the driver staged before it died");
        daemon.wait_until("the lost answer logged as UNAVAILABLE", || {
            daemon.log().lines().any(|l| {
                l.contains("NodeStageVolume on driver dies.csi.test: Unavailable: transport error")
            })
        });
        daemon.wait_until("the staging target uncertain", || {
            state_of(&daemon, &stage).as_deref() == Some("uncertain")
        });
        others_keep_going(&env, &daemon, "driver-dead");
        let driver = TestDriver::spawn(opts);
        daemon.wait_until("unstaged once the driver is back", || {
            mounts_at(&stage) == 0 && methods(&driver).last().is_some_and(|m| m == UNSTAGE)
        });
        let calls = methods(&driver);
        assert!(!calls.iter().any(|m| m == PUBLISH), "{calls:?}");
        daemon.wait_until("the volume gone from /debug/state", || {
            pod_gone_from_state(&daemon.state(), &env.root, "pod-d")
                && state_of(&daemon, &stage).is_none_or(|s| s == "not_mounted")
        });
        survivors.check(&daemon);
        nothing_lost(&env, daemon, &[]);
    });
}

/// A unix socket that accepts connections and answers each with bytes
/// that are neither HTTP/2 nor gRPC, then closes it; counts connections.
struct GarbageSocket {
    path: PathBuf,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl GarbageSocket {
    fn bind(path: &Path) -> Self {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        let listener = UnixListener::bind(path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let (accepted, stop) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (a, s) = (accepted.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((mut conn, _)) => {
                        a.fetch_add(1, Ordering::SeqCst);
                        // an HTTP/1.1 answer: as an HTTP/2 frame header its
                        // length is 4.7 MB, over any frame size allowed
                        let _ = conn.write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nnot grpc\n\x00\xff\xfe",
                        );
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        GarbageSocket {
            path: path.to_owned(),
            accepted,
            stop,
            thread: Some(thread),
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Stops answering and removes the socket.
    fn close(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        let _ = fs::remove_file(&self.path);
    }
}

/// The driver's socket answers bytes that are not HTTP/2: the pod's
/// volume fails with an error naming the driver, the daemon keeps trying
/// with backoff (few connections, not a loop) and does not panic; a real
/// driver started on that socket then mounts the volume once.
#[test]
fn a_socket_that_answers_garbage_is_an_error_naming_the_driver() {
    real("a CSI socket that speaks garbage", || {
        let mut env = Env::new("volumed-peer-garbage-socket-");
        let opts = add_driver(&mut env, "garbage.csi.test", 1);
        env.extra_args
            .extend(["--csi-timeout".to_owned(), "2".to_owned()]);
        let garbage = GarbageSocket::bind(&opts.endpoint);
        let daemon = started_with_steady(&mut env);
        let survivors = Survivors::of(&[cache_of(&env, STEADY)]);
        env.write_pod("x.yaml", &csi_pod("pod-x", "garbage.csi.test", 0));
        daemon.wait_until("an error naming the driver", || {
            pod_errors(&daemon, "pod-x").contains("garbage.csi.test")
        });
        let since = Instant::now();
        let first = garbage.accepted();
        others_keep_going(&env, &daemon, "garbage-socket");
        std::thread::sleep(Duration::from_secs(2));
        let (n, secs) = (garbage.accepted() - first, since.elapsed().as_secs_f64());
        // A reconnect loop would make thousands a second; the operation's
        // backoff (500 ms doubling) a few, each try one or two connections.
        assert!(
            n as f64 <= 4.0 * (secs + 1.0) + 10.0,
            "{n} connections in {secs:.1} s\n{}",
            daemon.log_tail()
        );
        let target = csi_target(&env, "pod-x", "garbage.csi.test", 0);
        assert!(mount_id(&target).is_none(), "nothing published");
        no_panic(&daemon);

        garbage.close();
        let driver = TestDriver::spawn(opts);
        daemon.wait_until("mounted once a real driver answers", || {
            all_mounted(&daemon, std::slice::from_ref(&target))
        });
        assert_eq!(methods(&driver), [STAGE, PUBLISH]);
        staged_and_published_once(&env, "garbage.csi.test", "pod-x", 0);
        survivors.check(&daemon);
        nothing_lost(&env, daemon, &["pod-x"]);
    });
}

/// NodePublish answers OK three times with a message that is not
/// protobuf (well framed, undecodable): each is an error naming the
/// driver, retried with the operation's backoff (the calls spread over
/// at least 500 ms + 1 s + 2 s less slack), no panic; the fourth publish
/// mounts, once.
#[test]
fn an_undecodable_grpc_reply_is_an_error_naming_the_driver() {
    real("a CSI driver that answers undecodable messages", || {
        let mut env = Env::new("volumed-peer-garbage-reply-");
        let opts = add_driver(&mut env, "babble.csi.test", 1);
        let driver = TestDriver::spawn(opts);
        driver.set_faults(json!([{"method": PUBLISH, "garbage_reply": true, "times": 3}]));
        let daemon = started_with_steady(&mut env);
        let survivors = Survivors::of(&[cache_of(&env, STEADY)]);
        env.write_pod("b.yaml", &csi_pod("pod-b", "babble.csi.test", 0));
        wait_calls(&daemon, &driver, PUBLISH, 1);
        let first = Instant::now();
        daemon.wait_until("an error naming the driver", || {
            let e = pod_errors(&daemon, "pod-b");
            e.contains("babble.csi.test") && e.contains("decode")
        });
        others_keep_going(&env, &daemon, "garbage-reply");
        wait_calls(&daemon, &driver, PUBLISH, 4);
        let spread = first.elapsed();
        let target = csi_target(&env, "pod-b", "babble.csi.test", 0);
        daemon.wait_until("mounted once the replies decode", || {
            all_mounted(&daemon, std::slice::from_ref(&target))
        });
        assert!(
            spread >= Duration::from_millis(2500),
            "three failed publishes backed off, not retried at once: {spread:?}"
        );
        assert_eq!(
            methods(&driver),
            [STAGE, PUBLISH, PUBLISH, PUBLISH, PUBLISH]
        );
        assert_eq!(driver.faults()[0]["times"], 0);
        staged_and_published_once(&env, "babble.csi.test", "pod-b", 0);
        assert!(
            daemon
                .log()
                .lines()
                .any(|l| l.contains("babble.csi.test") && l.contains("decode")),
            "the log names the driver and the decoding failure\n{}",
            daemon.log_tail()
        );
        survivors.check(&daemon);
        nothing_lost(&env, daemon, &["pod-b"]);
    });
}

// ------------------------------------------------------- API server

/// [`support::api_env::api_env`] with more `run` arguments.
fn api_env(prefix: &str, extra: &[&str]) -> (Env, FakeApiServer) {
    let (mut env, api) = support::api_env::api_env(prefix);
    env.extra_args.extend(extra.iter().map(|s| (*s).to_owned()));
    (env, api)
}

/// An API pod on this node with a memory emptyDir `cache`.
fn api_pod(uid: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("pod-{uid}"), "namespace": "apps", "uid": uid},
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "app", "image": "busybox"}],
            "volumes": [{"name": "cache", "emptyDir": {"medium": "Memory"}}],
        },
        "status": {"phase": "Running"},
    })
}

/// The teardowns run so far.
fn teardowns(daemon: &Daemon) -> f64 {
    series(&daemon.metrics(), "volumed_plugin_operations_total")
        .iter()
        .filter(|(k, _)| k.contains("operation=\"teardown\""))
        .map(|(_, v)| v)
        .sum()
}

/// The requests on the pods' collection, lists and watches.
fn pod_requests(api: &FakeApiServer) -> usize {
    api.requests().iter().filter(|r| r.path == PODS).count()
}

/// The API daemon with the steady static pod and API pod `api-a` mounted.
fn api_started(env: &mut Env, api: &FakeApiServer) -> (Daemon, Survivors) {
    api.put(api_pod("api-a"));
    let daemon = started_with_steady(env);
    let a = cache_of(env, "api-a");
    daemon.wait_until("API pod a mounted", || {
        all_mounted(&daemon, std::slice::from_ref(&a)) && mount_id(&a).is_some()
    });
    let survivors = Survivors::of(&[cache_of(env, STEADY), a]);
    (daemon, survivors)
}

/// The pods' watch answers 500 twice (kube retries it from the same
/// resourceVersion, backing off), then 410, and every list after it 500
/// until the fault clears: pod a, known before, stays mounted and in the
/// DSW, nothing is torn down, requests stay few (backoff); pod b, added
/// meanwhile, mounts once the API server recovers.
#[test]
fn api_500s_keep_known_pods_and_new_ones_arrive_after() {
    real("an API server answering 500", || {
        let (mut env, api) = api_env("volumed-peer-api500-", &[]);
        let (daemon, survivors) = api_started(&mut env, &api);
        let before = teardowns(&daemon);

        api.add_fault(Fault::times(PODS, Verb::Watch, Action::Status(500), 2));
        api.add_fault(Fault::times(PODS, Verb::Watch, Action::GoneWatch, 1));
        api.add_fault(Fault::always(PODS, Verb::List, Action::Status(500)));
        let requests_before = pod_requests(&api);
        let since = Instant::now();
        api.cut_watches();
        api.put(api_pod("api-b"));
        daemon.wait_until("watches, then lists answered 500", || {
            api.fault_uses_left(0) == Some(0)
                && api.fault_hits().iter().filter(|h| h.rule == 2).count() >= 3
        });
        others_keep_going(&env, &daemon, "api-500");
        let b = cache_of(&env, "api-b");
        assert!(mount_id(&b).is_none(), "pod b cannot be known yet");
        survivors.check(&daemon);
        in_dsw_and_ready(&daemon, "api-a");
        let (n, secs) = (
            pod_requests(&api) - requests_before,
            since.elapsed().as_secs_f64(),
        );
        assert!(
            n as f64 <= 3.0 * secs + 5.0,
            "{n} pod requests in {secs:.1} s: backed off\n{}",
            daemon.log_tail()
        );

        api.clear_faults();
        daemon.wait_until("pod b mounted once the API server recovers", || {
            all_mounted(&daemon, std::slice::from_ref(&b))
        });
        survivors.check(&daemon);
        assert_eq!(
            teardowns(&daemon),
            before + 1.0,
            "only the churned emptyDir torn down"
        );
        nothing_lost(&env, daemon, &[STEADY, "api-a", "api-b"]);
    });
}

/// The pods' watch sends its headers and then nothing: with
/// `--api-watch-timeout 2s` kube's watcher gives it up after 2 + 5 s of
/// silence and watches again from where it was, and so pod b, added
/// while it hung, is mounted and pod gone, deleted meanwhile, unmounted;
/// pod a never is.
#[test]
fn a_hung_watch_is_given_up_and_what_changed_meanwhile_arrives() {
    real("an API server whose watch hangs", || {
        let (mut env, api) = api_env("volumed-peer-hung-watch-", &["--api-watch-timeout", "2s"]);
        api.put(api_pod("api-gone"));
        let (daemon, survivors) = api_started(&mut env, &api);
        let gone = cache_of(&env, "api-gone");
        daemon.wait_until("pod gone mounted", || {
            all_mounted(&daemon, std::slice::from_ref(&gone))
        });
        let before = teardowns(&daemon);

        api.add_fault(Fault::times(PODS, Verb::Watch, Action::HangWatch, 1));
        api.cut_watches();
        daemon.wait_until("the pods' watch hangs", || !api.fault_hits().is_empty());
        let hung_at = Instant::now();
        api.put(api_pod("api-b"));
        assert!(api.delete("v1", "Pod", Some("apps"), "pod-api-gone"));
        others_keep_going(&env, &daemon, "hung-watch");

        let b = cache_of(&env, "api-b");
        daemon.wait_until("pod b mounted, pod gone unmounted", || {
            let s = daemon.state();
            all_mounted(&daemon, std::slice::from_ref(&b))
                && pod_gone_from_state(&s, &env.root, "api-gone")
        });
        let seen_after = hung_at.elapsed();
        // nothing else told the daemon: only a new watch, after the hung
        // one was given up (2 s + kube's 5 s margin)
        assert!(
            seen_after >= Duration::from_secs(4),
            "the changes came through a new watch: {seen_after:?}"
        );
        let watches_after = api
            .requests()
            .iter()
            .filter(|r| r.path == PODS && r.is_watch())
            .count();
        assert!(watches_after >= 2, "watched again");
        survivors.check(&daemon);
        assert_eq!(
            teardowns(&daemon),
            before + 2.0,
            "only the churned emptyDir and the deleted pod's torn down"
        );
        nothing_lost(&env, daemon, &[STEADY, "api-a", "api-b"]);
    });
}

/// Every watch of pods is answered `410 Gone` for six rounds: the watcher
/// relists each time (the lists see pod b, added during the storm), no
/// pod is dropped, nothing is torn down, and the rounds are spaced by the
/// watcher's backoff (800 ms and more each), not a hot loop.
#[test]
fn a_410_storm_relists_without_loss_and_backs_off() {
    real("an API server answering 410 to every watch", || {
        const ROUNDS: usize = 6;
        let (mut env, api) = api_env("volumed-peer-410-", &[]);
        let (daemon, survivors) = api_started(&mut env, &api);
        let before = teardowns(&daemon);
        let lists_before = api
            .requests()
            .iter()
            .filter(|r| r.path == PODS && r.is_list())
            .count();

        api.add_fault(Fault::times(PODS, Verb::Watch, Action::GoneWatch, ROUNDS));
        api.cut_watches();
        api.put(api_pod("api-b"));
        others_keep_going(&env, &daemon, "410-storm");
        daemon.wait_until("every 410 round answered", || {
            api.fault_uses_left(0) == Some(0)
        });
        let b = cache_of(&env, "api-b");
        daemon.wait_until("pod b mounted", || {
            all_mounted(&daemon, std::slice::from_ref(&b))
        });
        let hits = api.fault_hits();
        assert_eq!(hits.len(), ROUNDS);
        let span = hits[ROUNDS - 1].at - hits[0].at;
        // each round waits out a backoff of at least 800 ms; half of it
        // is the bound, so a slow machine cannot fail it
        assert!(
            span >= Duration::from_millis(400 * (ROUNDS as u64 - 1)),
            "{ROUNDS} rounds of 410 in {span:?}: not backed off"
        );
        let lists = || {
            api.requests()
                .iter()
                .filter(|r| r.path == PODS && r.is_list())
                .count()
                - lists_before
        };
        daemon.wait_until("a relist after each round", || lists() >= ROUNDS);
        // the last relist's watch is a plain one: no more lists come
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(lists(), ROUNDS, "one relist per 410 round");
        survivors.check(&daemon);
        assert_eq!(
            teardowns(&daemon),
            before + 1.0,
            "only the churned emptyDir torn down"
        );
        others_keep_going(&env, &daemon, "after-410-storm");
        nothing_lost(&env, daemon, &[STEADY, "api-a", "api-b"]);
    });
}
