//! `Daemon::start` whole on the recording fake: every host read and change
//! goes through the seam, so the daemon runs with no kernel underneath
//! (a real journal and a real static pods folder: inputs, not host state).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Daemon, DaemonConfig};
use crate::host::boot::BootId;
use crate::host::recording_sys::{RecordingSys, SysCall};
use crate::journal::{Journal, JournalConfig};
use crate::metrics::Metrics;
use crate::model::{Layout, PluginName, PodUid};

const ROOT: &str = "/var/lib/kubelet";
const NODE: &str = "node-1";
const BOOT: &str = "0b0b0b0b-1111-2222-3333-444444444444";
const UID: &str = "5a5a5a5a-1111-2222-3333-444444444444";

const POD: &str = "apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: default
  uid: 5a5a5a5a-1111-2222-3333-444444444444
spec:
  nodeName: node-1
  containers:
  - name: app
    image: busybox
    volumeMounts:
    - {name: cache, mountPath: /cache}
  volumes:
  - name: cache
    emptyDir: {medium: Memory}
";

fn start(sys: &Arc<RecordingSys>, dir: &Path) -> Daemon {
    try_start(sys, dir).expect("the daemon starts on the fake")
}

/// A daemon over `dir`'s `pods/` and `journal/`, the journal opened by the
/// start as `volumed run` does (its decode runs beside the sources').
fn try_start(sys: &Arc<RecordingSys>, dir: &Path) -> Result<Daemon, super::DaemonError> {
    let journal = JournalConfig::new(dir.join("journal"), NODE, BOOT);
    let boot = BootId::new(BOOT).expect("a boot id");
    let mut cfg = DaemonConfig::new(Layout::new(ROOT), NODE, boot);
    cfg.static_pods = Some(dir.join("pods"));
    cfg.poll_interval = Duration::from_millis(20);
    cfg.workers = 2;
    Daemon::start_opening(
        cfg,
        Some(journal.dir.clone()),
        |_| {
            let (j, _) = Journal::open(&journal).expect("open the journal");
            Ok((Some(Arc::new(j)), None))
        },
        sys.clone(),
        Arc::new(Metrics::new().expect("metrics")),
    )
}

/// A temp dir with `pods/web.yaml` ([`POD`]).
fn with_pod() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temp dir");
    std::fs::create_dir(dir.path().join("pods")).expect("the pods dir");
    std::fs::write(dir.path().join("pods/web.yaml"), POD).expect("the manifest");
    dir
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Calls that mount something below the pods dir.
fn pod_mounts(sys: &RecordingSys) -> Vec<SysCall> {
    let pods = Layout::new(ROOT).pods_dir();
    sys.calls()
        .into_iter()
        .filter(|c| matches!(c, SysCall::Mount { target, .. } if target.starts_with(&pods)))
        .collect()
}

#[test]
fn the_daemon_runs_on_the_fake_and_a_restart_mounts_nothing_again() {
    let dir = with_pod();
    let sys = Arc::new(RecordingSys::new());
    let uid = PodUid::new(UID).expect("a pod uid");
    let target = Layout::new(ROOT).pod_target_path(&uid, PluginName::EmptyDir, "cache");

    let daemon = start(&sys, dir.path());
    let provider = daemon.provider();
    wait_for("the emptyDir mount", || {
        sys.mounts()
            .iter()
            .any(|m| m.target == target && m.fstype == "tmpfs")
    });
    wait_for("readiness", || provider.ready().is_ok());
    assert_eq!(pod_mounts(&sys).len(), 1, "{:?}", pod_mounts(&sys));
    daemon.stop();
    drop(provider);

    // the same host and journal: reconstruction finds the mount the journal
    // names, and the reconciler has nothing to do
    sys.clear_calls();
    let daemon = start(&sys, dir.path());
    let provider = daemon.provider();
    wait_for("readiness after the restart", || provider.ready().is_ok());
    // a resync's worth of the loop: any mount it would issue is issued by now
    std::thread::sleep(Duration::from_millis(300));
    daemon.stop();
    assert!(pod_mounts(&sys).is_empty(), "{:?}", pod_mounts(&sys));
    let mounted: Vec<_> = sys
        .mounts()
        .into_iter()
        .filter(|m| m.target == target)
        .collect();
    assert_eq!(mounted.len(), 1, "mounted once: {mounted:?}");
}

/// The loop starts before reconstruction's phase 1; when phase 1 fails
/// (its mount table cannot be read), the start stops that loop, returns
/// the error and mounts nothing. Each read of the table in turn is made
/// to fail: one of them is phase 1's.
#[test]
fn a_failed_phase_one_stops_the_loop_it_started_and_mounts_nothing() {
    let mut failed_starts = 0;
    for nth in 1..=3 {
        let dir = with_pod();
        let sys = Arc::new(RecordingSys::new());
        sys.fail_nth(
            crate::host::sys::Call::ReadMountinfo,
            nth,
            nix::errno::Errno::EIO,
        );
        let (tx, rx) = std::sync::mpsc::channel();
        let (s, d) = (sys.clone(), dir.path().to_owned());
        std::thread::spawn(move || {
            let r = try_start(&s, &d).map(|daemon| daemon.stop());
            let _ = tx.send(r.err().map(|e| e.to_string()));
        });
        let failed = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the start returns: the loop it started is stopped");
        // the earlier read (making the root shared) fails before the loop
        if failed.is_some_and(|e| e.starts_with("reconstruct")) {
            failed_starts += 1;
            assert!(pod_mounts(&sys).is_empty(), "{:?}", pod_mounts(&sys));
        }
    }
    assert_eq!(failed_starts, 1, "phase 1 read failed exactly one start");
}

/// After a restart the DSW (whose names come from the pod sources) and the
/// ASW (whose names come from the journal's decode) hold one allocation
/// of the volume's name and the pod's UID, not one each.
#[test]
fn a_restarted_daemons_states_share_the_names_of_the_node() {
    let dir = with_pod();
    let sys = Arc::new(RecordingSys::new());
    let daemon = start(&sys, dir.path());
    let provider = daemon.provider();
    wait_for("readiness", || provider.ready().is_ok());
    let world = daemon.world.clone();
    wait_for("the mount in the ASW", || {
        lock(&world).asw.volumes().next().is_some()
    });
    daemon.stop();
    drop((provider, world));

    let same = |a: &str, b: &str| std::ptr::eq(a.as_ptr(), b.as_ptr());
    let daemon = start(&sys, dir.path());
    let provider = daemon.provider();
    wait_for("readiness after the restart", || provider.ready().is_ok());
    let w = lock(&daemon.world);
    let (asw_name, asw) = w.asw.volumes().next().expect("reconstructed");
    let (dsw_name, _) = w.dsw.volumes().next().expect("listed");
    assert_eq!(asw_name, dsw_name);
    let asw_uid = asw.pods.keys().next().expect("its pod");
    let dsw_uid = w.pods.keys().next().expect("the pod listed");
    assert_eq!(asw_uid, dsw_uid);
    assert!(
        same(asw_name.as_str(), dsw_name.as_str()),
        "two copies of the volume name"
    );
    assert!(
        same(asw_uid.as_str(), dsw_uid.as_str()),
        "two copies of the pod UID"
    );
    drop(w);
    daemon.stop();
}

fn lock(w: &std::sync::Mutex<super::World>) -> std::sync::MutexGuard<'_, super::World> {
    w.lock().unwrap_or_else(|p| p.into_inner())
}
