//! Raw block volumes (issue 43, item 1), end to end on the real `volumed
//! run` binary with a real loop device as a local PV in `volumeMode:
//! Block`: the kubelet's layout on the host (the device bound on the pod's
//! file in the global map dir, the pod's `volumeDevices` symlink to it),
//! each step journaled with a `block` target (`dump`), the device held
//! open by one loop device while the pod maps it (sysfs), never
//! formatted, and everything undone when the pod goes.
//!
//! Each test runs as root in its own private mount namespace with its own
//! scratch dir, so they run in parallel. Every wait is bounded.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::fs;
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};

use serde_json::Value;
use support::LoopDevice;
use support::daemon::{Env, all_mounted, delete_all_and_wait, real};
use support::holds::{LoopSweep, loops_below};

/// What the test writes on the device before the daemon sees it.
const MAGIC: &[u8] = b"volumed raw block: never formatted";

/// A block PV `pv` on `device` bound to the claim `raw`, and the claim.
fn objects(pv: &str, device: &Path) -> String {
    format!(
        "apiVersion: v1
kind: PersistentVolume
metadata: {{name: {pv}}}
spec:
  volumeMode: Block
  accessModes: [ReadWriteOnce]
  claimRef: {{namespace: default, name: raw}}
  local: {{path: {device}}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: raw, namespace: default}}
spec: {{volumeName: {pv}, volumeMode: Block}}
",
        device = device.display()
    )
}

/// A pod `uid` mapping the claim `raw` at `/dev/xvda`.
fn pod(uid: &str) -> String {
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

/// A loop device as the local block PV `pv-raw` (MAGIC written at its
/// start), pod `p1` mapping it, and where the kubelet's layout puts the
/// map. Its fields drop in order: the holds swept, then the device.
struct BlockNode {
    _holds: LoopSweep,
    lo: LoopDevice,
    /// the pod's `volumeDevices` symlink
    link: PathBuf,
    /// the global map dir
    map_dir: PathBuf,
    /// the pod's file in it, the device bound on it
    pod_file: PathBuf,
}

impl BlockNode {
    /// The device, and the link, map dir and pod file paths.
    fn parts(&self) -> (&LoopDevice, PathBuf, PathBuf, PathBuf) {
        let p = (&self.link, &self.map_dir, &self.pod_file);
        (&self.lo, p.0.clone(), p.1.clone(), p.2.clone())
    }
}

/// A scratch env named `name` (`--journal off` if `journal_off`) with a
/// [`BlockNode`] written in it, not started.
fn block_node(name: &str, journal_off: bool) -> (Env, BlockNode) {
    let mut env = Env::new(name);
    if journal_off {
        env.extra_args = vec!["--journal".into(), "off".into()];
    }
    let backing = env.scratch.path().join("disk.img");
    fs::File::create(&backing)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let lo = LoopDevice::attach(&backing);
    let mut f = fs::OpenOptions::new().write(true).open(lo.path()).unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.write_all(MAGIC).unwrap();
    f.sync_all().unwrap();
    fs::write(env.objects.join("pv.yaml"), objects("pv-raw", lo.path())).unwrap();
    env.write_pod("p.yaml", &pod("p1"));
    let plugin = "kubernetes.io~local-volume";
    let link = env
        .root
        .join("pods/p1/volumeDevices")
        .join(plugin)
        .join("pv-raw");
    let map_dir = env
        .root
        .join("plugins")
        .join(plugin)
        .join("volumeDevices/pv-raw");
    let node = BlockNode {
        _holds: LoopSweep(env.root.clone()),
        lo,
        link,
        pod_file: map_dir.join("p1"),
        map_dir,
    };
    (env, node)
}

/// The first bytes of the device at `path`.
fn head(path: &Path) -> Vec<u8> {
    let mut buf = vec![0; MAGIC.len()];
    fs::File::open(path).unwrap().read_exact(&mut buf).unwrap();
    buf
}

/// The (op, target kind) of every intent in `dump` for `volume`.
fn intents(dump: &Value, volume: &str) -> Vec<(String, String)> {
    dump["records"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["type"] == "intent" && r["volume"] == volume)
        .map(|r| {
            (
                r["op"].as_str().unwrap_or_default().to_owned(),
                r["params"]["kind"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[test]
fn a_local_block_pv_is_mapped_at_the_kubelet_s_paths_and_unmapped() {
    real("maps a loop device into a pod raw", || {
        let (mut env, node) = block_node("volumed-block-local", false);
        let (lo, link, map_dir, pod_file) = node.parts();

        let daemon = env.start();
        daemon.wait_until("the device and pod maps are done", || {
            all_mounted(&daemon.state(), &[map_dir.clone(), link.clone()])
        });

        // the device is held open by exactly one loop device, backed by
        // the pod's bound file, of the device's size
        let held = loops_below(&pod_file);
        assert_eq!(held.len(), 1, "{held:?}");
        let sectors = fs::read_to_string(format!(
            "/sys/block/{}/size",
            held[0].file_name().unwrap().to_string_lossy()
        ))
        .unwrap();
        assert_eq!(sectors.trim(), (8u64 << 20 >> 9).to_string());

        // the pod's symlink names the device, the kubelet's way
        assert_eq!(fs::read_link(&link).unwrap(), lo.path());
        let dev = fs::metadata(lo.path()).unwrap();
        // the device is bound on the pod's file in the global map dir
        let bound = fs::symlink_metadata(&pod_file).unwrap();
        assert!(bound.file_type().is_block_device(), "{pod_file:?}");
        assert_eq!(bound.rdev(), dev.rdev());
        assert!(
            env.mounts_below_root()
                .iter()
                .any(|m| m.mount_point == pod_file),
            "a bind mount at {pod_file:?}"
        );
        assert_eq!(head(&link), MAGIC, "the pod reads the raw device");
        // nothing mounts the device as a filesystem
        assert!(
            env.mounts_below_root()
                .iter()
                .all(|m| m.mount_point == pod_file),
            "{:?}",
            env.mounts_below_root()
        );

        // the runtime API gives the container the pod's link as a device
        let doc: Value =
            serde_json::from_str(&daemon.get("/v1/pods/p1/containers/app/mounts")).unwrap();
        assert_eq!(doc["ready"], Value::Bool(true), "{doc:#}");
        assert_eq!(
            doc["devices"],
            serde_json::json!([{
                "name": "data",
                "container_path": "/dev/xvda",
                "host_path": link.to_str().unwrap(),
                "permissions": "mrw",
            }]),
            "{doc:#}"
        );

        let volume = "kubernetes.io/local-volume/pv-raw";
        let dump = env.dump();
        let ops = intents(&dump, volume);
        let want = [
            ("map_device".to_owned(), "block".to_owned()),
            ("map_pod_device".to_owned(), "block".to_owned()),
        ];
        assert_eq!(ops, want, "{dump:#}");

        // A restart with the journal keeps both maps, the host showing
        // them whole: no step runs again and the bind is not stacked.
        daemon.stop();
        let daemon = env.start();
        daemon.wait_until("the maps are known again", || {
            all_mounted(&daemon.state(), &[map_dir.clone(), link.clone()])
        });
        assert_eq!(fs::read_link(&link).unwrap(), lo.path());
        let binds = env.mounts_below_root();
        assert_eq!(
            binds.iter().filter(|m| m.mount_point == pod_file).count(),
            1,
            "{binds:?}"
        );
        assert_eq!(intents(&env.dump(), volume), want, "nothing ran again");
        assert_eq!(loops_below(&pod_file), held, "the same single hold");

        delete_all_and_wait(&env, &daemon);
        daemon.wait_until("the global map dir is removed", || !map_dir.exists());
        assert!(
            fs::symlink_metadata(&link).is_err(),
            "the pod's link is gone"
        );
        assert!(
            fs::symlink_metadata(&pod_file).is_err(),
            "the pod's file is gone"
        );
        assert_eq!(
            loops_below(&pod_file),
            Vec::<PathBuf>::new(),
            "the hold is released"
        );
        let ops = intents(&env.dump(), volume);
        let undo: Vec<&str> = ops
            .iter()
            .rev()
            .take(2)
            .rev()
            .map(|(op, _)| op.as_str())
            .collect();
        assert_eq!(undo, ["unmap_pod_device", "unmap_device"]);
        assert_eq!(head(lo.path()), MAGIC, "the device was never formatted");
        daemon.stop();
        drop(node);
    });
}

/// A pod deleted while the daemon is down: the restart's merge keeps the
/// journal's maps (the host shows them whole), so the pod's unmaps
/// run and nothing is left: no bind, no symlink, no map dir.
#[test]
fn a_block_pod_deleted_while_the_daemon_is_down_is_unmapped_after_the_restart() {
    real(
        "unmaps a block pod that went while volumed was down",
        || {
            let (mut env, node) = block_node("volumed-block-down", false);
            let (_, link, map_dir, pod_file) = node.parts();
            let daemon = env.start();
            daemon.wait_until("the maps are done", || {
                all_mounted(&daemon.state(), &[map_dir.clone(), link.clone()])
            });
            assert_eq!(loops_below(&pod_file).len(), 1);
            daemon.stop();
            // the hold outlives the daemon, as the kubelet's outlives it
            assert_eq!(loops_below(&pod_file).len(), 1);

            env.remove_pod("p.yaml");
            let daemon = env.start();
            daemon.wait_until("the pod's bind is unmounted", || {
                env.mounts_below_root().is_empty()
            });
            daemon.wait_until("the map dir is removed", || !map_dir.exists());
            assert!(
                fs::symlink_metadata(&link).is_err(),
                "the pod's link is gone"
            );
            assert_eq!(
                loops_below(&pod_file),
                Vec::<PathBuf>::new(),
                "the hold is released"
            );
            let volume = "kubernetes.io/local-volume/pv-raw";
            let ops: Vec<String> = intents(&env.dump(), volume)
                .into_iter()
                .map(|(op, _)| op)
                .collect();
            assert_eq!(
                ops,
                [
                    "map_device",
                    "map_pod_device",
                    "unmap_pod_device",
                    "unmap_device"
                ]
            );
            daemon.stop();
            drop(node);
        },
    );
}

/// A map lost outside volumed while it was down is noticed by the
/// restart's scan (docs/merge-table.md) and made again: the pod's symlink
/// alone removed (a map in part: uncertain, MapPodDevice runs again and
/// reuses the hold), then the whole map (symlink, hold and bind: unmapped
/// outside, mapped again). Each time one bind and one hold, no more.
#[test]
fn a_block_map_lost_outside_volumed_is_made_again_after_a_restart() {
    real("maps again a block map lost while volumed was down", || {
        let (mut env, node) = block_node("volumed-block-lost", false);
        let (lo, link, map_dir, pod_file) = node.parts();
        let mapped = |daemon: &support::daemon::Daemon| {
            all_mounted(&daemon.state(), &[map_dir.clone(), link.clone()])
                && fs::read_link(&link).is_ok_and(|l| l == lo.path())
        };
        let binds = |env: &Env| {
            env.mounts_below_root()
                .iter()
                .filter(|m| m.mount_point == pod_file)
                .count()
        };
        let volume = "kubernetes.io/local-volume/pv-raw";
        let pod_maps = |env: &Env| {
            intents(&env.dump(), volume)
                .iter()
                .filter(|(op, _)| op == "map_pod_device")
                .count()
        };

        let daemon = env.start();
        daemon.wait_until("the maps are done", || mapped(&daemon));
        daemon.stop();
        let held = loops_below(&pod_file);
        assert_eq!(held.len(), 1, "{held:?}");

        // the symlink alone goes: the map in part is made whole again
        fs::remove_file(&link).unwrap();
        let daemon = env.start();
        daemon.wait_until("the pod's symlink is back", || mapped(&daemon));
        assert_eq!(binds(&env), 1, "{:?}", env.mounts_below_root());
        assert_eq!(loops_below(&pod_file), held, "the same hold, reused");
        assert_eq!(pod_maps(&env), 2, "map_pod_device ran again");
        daemon.stop();

        // the whole map goes: symlink, hold, bind
        fs::remove_file(&link).unwrap();
        let status = std::process::Command::new("losetup")
            .arg("-d")
            .arg(&held[0])
            .status()
            .unwrap();
        assert!(status.success());
        nix::mount::umount(&pod_file).unwrap();
        assert_eq!(binds(&env), 0);
        let daemon = env.start();
        daemon.wait_until("the map is made again", || mapped(&daemon));
        assert_eq!(binds(&env), 1, "{:?}", env.mounts_below_root());
        assert_eq!(loops_below(&pod_file).len(), 1, "one hold again");
        assert_eq!(pod_maps(&env), 3, "map_pod_device ran again");
        assert_eq!(head(&link).len(), MAGIC.len(), "the pod reads the device");

        delete_all_and_wait(&env, &daemon);
        daemon.wait_until("the global map dir is removed", || !map_dir.exists());
        assert_eq!(
            loops_below(&pod_file),
            Vec::<PathBuf>::new(),
            "the hold is released"
        );
        daemon.stop();
        drop(node);
    });
}

/// Without a journal (`--journal off`, as for a map the kubelet made) the
/// restart finds a pod's map by its bind in the mount table and rebuilds
/// it from the host, uncertain, with its global map dir (KEP-3756): a pod
/// still there is mapped again in place (one bind, one hold), one gone is
/// unmapped and its dir removed, the hold released.
#[test]
fn a_block_map_without_a_journal_record_is_found_and_kept_or_undone() {
    real("finds a block map no journal knows", || {
        let (mut env, node) = block_node("volumed-block-nojournal", true);
        let (lo, link, map_dir, pod_file) = node.parts();
        let daemon = env.start();
        daemon.wait_until("the maps are done", || {
            all_mounted(&daemon.state(), &[map_dir.clone(), link.clone()])
        });
        daemon.stop();
        let held = loops_below(&pod_file);
        assert_eq!(held.len(), 1, "{held:?}");

        // the pod stays: found, uncertain, mapped again in place
        let daemon = env.start();
        daemon.wait_until("the maps are known again", || {
            all_mounted(&daemon.state(), &[map_dir.clone(), link.clone()])
        });
        let binds = env.mounts_below_root();
        assert_eq!(binds.len(), 1, "{binds:?}");
        assert_eq!(binds[0].mount_point, pod_file);
        assert_eq!(loops_below(&pod_file), held, "the same hold");
        assert_eq!(fs::read_link(&link).unwrap(), lo.path());
        daemon.stop();

        // the pod goes while the daemon is down: found and undone
        env.remove_pod("p.yaml");
        let daemon = env.start();
        daemon.wait_until("the pod's bind is unmounted", || {
            env.mounts_below_root().is_empty()
        });
        daemon.wait_until("the map dir is removed", || !map_dir.exists());
        assert!(
            fs::symlink_metadata(&link).is_err(),
            "the pod's link is gone"
        );
        assert_eq!(
            loops_below(&pod_file),
            Vec::<PathBuf>::new(),
            "the hold is released"
        );
        assert_eq!(head(lo.path()).len(), MAGIC.len());
        daemon.stop();
        drop(node);
    });
}

/// A map left as its symlink alone (its hold and bind gone, as a reboot
/// leaves it) that no journal knows: the pod-dir walk finds the symlink,
/// the pod being gone it is unmapped and the global map dir removed.
#[test]
fn a_block_symlink_left_alone_without_a_journal_is_undone() {
    real("undoes a block symlink no journal knows", || {
        let (mut env, node) = block_node("volumed-block-link", true);
        let (_, link, map_dir, pod_file) = node.parts();
        let daemon = env.start();
        daemon.wait_until("the maps are done", || {
            all_mounted(&daemon.state(), &[map_dir.clone(), link.clone()])
        });
        daemon.stop();
        // as a reboot leaves it: no hold, no bind; the symlink stays
        let held = loops_below(&pod_file);
        let status = std::process::Command::new("losetup")
            .arg("-d")
            .arg(&held[0])
            .status()
            .unwrap();
        assert!(status.success());
        nix::mount::umount(&pod_file).unwrap();
        env.remove_pod("p.yaml");

        let daemon = env.start();
        daemon.wait_until("the pod's symlink is removed", || {
            fs::symlink_metadata(&link).is_err()
        });
        daemon.wait_until("the map dir is removed", || !map_dir.exists());
        assert!(env.mounts_below_root().is_empty());
        assert_eq!(loops_below(&pod_file), Vec::<PathBuf>::new());
        daemon.stop();
        drop(node);
    });
}
