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
use std::os::unix::fs::PermissionsExt as _;

use support::runc::{self, Bind, Process, Runtime};

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
