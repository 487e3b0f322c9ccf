//! Pods as real workloads write them, started by a real OCI runtime
//! (Debian's `runc`, busybox-static for the root filesystem): the
//! containers' mounts come from volumed's answer alone, as a CRI runtime's
//! would, and the containers' own reads and writes show the result.
//!
//! Each test runs as root in its own private mount namespace
//! (`support::daemon::real`).
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::fs;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use support::daemon::{BIN, Env};
use support::runc::{self, Bind, Process, Runtime};
use volumed::host::mountinfo::MountTable;

/// The pod of `fixtures/workload/pods/web.yaml`.
const UID: &str = "7e57a11d-0000-4000-8000-00000000d0c5";
/// Its `securityContext.fsGroup`.
const FS_GROUP: u32 = 2000;
/// The local PV's directory as the fixture spells it (a test puts its own).
const FIXTURE_PV: &str = "/tmp/volumed-workload-pv";

/// `volumed mounts UID CONTAINER --json`, as a runtime hook would ask it.
fn mounts(env: &Env, container: &str, timeout_s: u32) -> Value {
    let out = Command::new(BIN)
        .args(["mounts", UID, container, "--json", "--timeout"])
        .arg(timeout_s.to_string())
        .arg("--journal-dir")
        .arg(&env.journal)
        .output()
        .expect("run volumed mounts");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("volumed mounts {container}: {e}: {out:?}");
    })
}

/// The mount points below `dir` in this namespace's mount table.
fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    MountTable::read_self()
        .unwrap()
        .entries()
        .iter()
        .map(|m| m.mount_point.clone())
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// The runtime itself, before volumed is in the picture: a read-only bind
/// refuses a write with EROFS, a read-write bind's write reaches the host,
/// and the process runs as the uid and groups it is given.
#[test]
fn runc_runs_busybox_with_the_binds_it_is_given() {
    if !runc::available("runc_runs_busybox_with_the_binds_it_is_given") {
        return;
    }
    support::daemon::real("runc_runs_busybox_with_the_binds_it_is_given", || {
        let scratch = support::Scratch::new("runc-self");
        let dir = scratch.path();
        let shared = dir.join("shared");
        let ro = dir.join("ro");
        fs::create_dir_all(&shared).unwrap();
        fs::create_dir_all(&ro).unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).unwrap();
        fs::write(ro.join("hello"), "from the host\n").unwrap();
        let mut rt = Runtime::new(&dir.join("runc"));
        let binds = [
            Bind {
                host_path: shared.clone(),
                container_path: "/shared".into(),
                read_only: false,
                propagation: "rprivate".into(),
            },
            Bind {
                host_path: ro.clone(),
                container_path: "/ro".into(),
                read_only: true,
                propagation: "rprivate".into(),
            },
        ];
        let exit = rt.run(
            "self",
            &Process {
                uid: 1000,
                gid: 1000,
                groups: vec![2000],
                script: "id -u; id -G; cat /ro/hello; echo written > /shared/out; \
                         touch /ro/x 2>&1; echo touch=$?"
                    .into(),
            },
            &binds,
        );
        assert_eq!(exit.code, 0, "container failed: {exit:?}");
        let lines: Vec<&str> = exit.stdout.lines().collect();
        assert_eq!(lines[0], "1000", "{exit:?}");
        assert_eq!(lines[1], "1000 2000", "{exit:?}");
        assert_eq!(lines[2], "from the host", "{exit:?}");
        assert!(
            lines[3].contains("Read-only file system") && lines[4] == "touch=1",
            "a write to a read-only bind must fail with EROFS: {exit:?}"
        );
        assert_eq!(fs::read_to_string(shared.join("out")).unwrap(), "written\n");
        assert!(!ro.join("x").exists());
    });
}

/// The walkthrough of `docs/workloads.md`, on the fixture the README uses:
/// one pod of three containers running as uid 1000 with fsGroup 2000.
/// `writer` writes into a disk emptyDir, reads one file of a configMap
/// mounted by subPath, and is refused a write to the claim the pod mounts
/// `readOnly` (EROFS); `reader` reads what `writer` wrote; `sneaky` asks for
/// a subPath that leaves the claim through a symlink and is refused, with
/// no mount made. Once the pod is deleted no subpath mount and no pod dir
/// remain.
#[test]
fn a_pod_of_three_containers_runs_on_what_volumed_mounts() {
    if !runc::available("a_pod_of_three_containers_runs_on_what_volumed_mounts") {
        return;
    }
    support::daemon::real(
        "a_pod_of_three_containers_runs_on_what_volumed_mounts",
        || {
            let mut env = Env::new("runc-workload");
            let pv = env.scratch.path().join("pv");
            fs::create_dir_all(&pv).unwrap();
            fs::write(pv.join("seed.txt"), "seeded\n").unwrap();
            symlink("/etc", pv.join("escape")).unwrap();
            let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/workload");
            let objects = fs::read_to_string(fixture.join("objects/objects.yaml")).unwrap();
            assert!(objects.contains(FIXTURE_PV));
            let objects = objects.replace(FIXTURE_PV, pv.to_str().unwrap());
            fs::write(env.objects.join("objects.yaml"), objects).unwrap();
            let pod = fs::read_to_string(fixture.join("pods/web.yaml")).unwrap();
            env.write_pod("web.yaml", &pod);
            let daemon = env.start();

            let writer = mounts(&env, "writer", 60);
            let reader = mounts(&env, "reader", 60);
            assert_eq!(writer["ready"], true, "{writer:#}");
            assert_eq!(reader["ready"], true, "{reader:#}");
            let sneaky = mounts(&env, "sneaky", 1);
            assert_eq!(sneaky["ready"], false, "{sneaky:#}");

            let mut rt = Runtime::new(&env.scratch.path().join("runc"));
            let mut run = |name: &str, answer: &Value, script: &str| {
                let mut groups = vec![FS_GROUP];
                groups.extend(
                    answer["supplemental_groups"]
                        .as_array()
                        .expect("supplemental_groups")
                        .iter()
                        .map(|g| u32::try_from(g.as_u64().expect("a gid")).expect("a gid")),
                );
                let binds: Vec<Bind> = answer["mounts"]
                    .as_array()
                    .expect("mounts")
                    .iter()
                    .map(Bind::from_answer)
                    .collect();
                let process = Process {
                    uid: 1000,
                    gid: 1000,
                    groups,
                    script: script.into(),
                };
                rt.run(name, &process, &binds)
            };

            let w = run(
                "writer",
                &writer,
                "echo hello from writer > /shared/msg && cat /etc/app.conf /data/seed.txt; \
             touch /data/x 2>&1; echo touch=$?",
            );
            assert_eq!(w.code, 0, "writer: {w:?}");
            let lines: Vec<&str> = w.stdout.lines().collect();
            assert_eq!(lines.first(), Some(&"color=blue"), "writer: {w:?}");
            assert_eq!(lines.get(1), Some(&"seeded"), "writer: {w:?}");
            assert!(
                lines
                    .get(2)
                    .is_some_and(|l| l.contains("Read-only file system")),
                "a write to the readOnly claim must fail with EROFS: {w:?}"
            );
            assert_eq!(lines.get(3), Some(&"touch=1"), "writer: {w:?}");
            assert!(!pv.join("x").exists());

            // fsGroup: the emptyDir is the group's and setgid, so the
            // writer's file is the group's too (the kubelet's
            // SetVolumeOwnership)
            let shared = PathBuf::from(writer["mounts"][0]["host_path"].as_str().unwrap());
            let dir = fs::metadata(&shared).unwrap();
            assert_eq!(dir.gid(), FS_GROUP, "the emptyDir's group");
            assert!(
                dir.mode() & 0o2000 != 0,
                "setgid on the emptyDir: {:o}",
                dir.mode()
            );
            assert_eq!(fs::metadata(shared.join("msg")).unwrap().gid(), FS_GROUP);

            let r = run(
                "reader",
                &reader,
                "cat /shared/msg; touch /shared/y 2>&1; echo touch=$?",
            );
            assert_eq!(r.code, 0, "reader: {r:?}");
            let lines: Vec<&str> = r.stdout.lines().collect();
            assert_eq!(lines.first(), Some(&"hello from writer"), "reader: {r:?}");
            assert!(
                lines
                    .get(1)
                    .is_some_and(|l| l.contains("Read-only file system")),
                "the reader's volumeMount is readOnly: {r:?}"
            );

            let errors = sneaky["errors"].to_string();
            assert!(
                errors.contains("sneaky") && errors.contains("escape"),
                "the refusal names the container and the path: {sneaky:#}"
            );
            let subpaths = env.root.join("pods").join(UID).join("volume-subpaths");
            assert!(
                mounts_below(&subpaths.join("data").join("sneaky")).is_empty(),
                "no mount for the refused subPath"
            );
            let binds = mounts_below(&subpaths);
            assert_eq!(binds.len(), 1, "the configMap file alone: {binds:?}");

            env.remove_pod("web.yaml");
            let out = Command::new(BIN)
                .args([
                    "wait-pod",
                    UID,
                    "--unmounted",
                    "--timeout",
                    "60",
                    "--journal-dir",
                ])
                .arg(&env.journal)
                .output()
                .unwrap();
            assert!(out.status.success(), "wait-pod --unmounted: {out:?}");
            let pod_dir = env.root.join("pods").join(UID);
            daemon.wait_until("the pod dir is removed", || !pod_dir.exists());
            let left = mounts_below(&env.root.join("pods"));
            assert!(left.is_empty(), "mounts left under pods/: {left:?}");
            assert_eq!(fs::read_to_string(pv.join("seed.txt")).unwrap(), "seeded\n");
            daemon.stop();
        },
    );
}
