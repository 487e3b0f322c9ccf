//! A real OCI runtime: Debian's `runc` starting containers whose root is
//! busybox-static, with the bind mounts a test gives it. The tests that use
//! it ask volumed for a container's mounts exactly as a CRI runtime would,
//! then hand them to `runc` unchanged: nothing here knows volumes.
//!
//! `.ci/run` installs `runc` and `busybox-static`. Outside CI a machine
//! without them skips the test and says so; under `CI=true` their absence
//! fails it.

use std::fs;
use std::io::Read;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Where Debian's busybox-static puts its binary.
const BUSYBOX: &str = "/bin/busybox";
/// How long one container may run.
const RUN_MAX: Duration = Duration::from_secs(60);

/// Whether `runc` and busybox are here. When not, prints `skipped: ...`
/// and returns false; under `CI=true` it panics instead (CI installs them).
pub fn available(what: &str) -> bool {
    let runc = Command::new("runc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let busybox = Path::new(BUSYBOX).is_file();
    if runc && busybox {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "runc ({runc}) and {BUSYBOX} ({busybox}) are needed under CI=true: .ci/run installs them"
    );
    eprintln!("skipped: needs runc and busybox-static ({what})");
    false
}

/// One bind mount into a container, as a CRI `Mount` says it.
#[derive(Debug, Clone)]
pub struct Bind {
    /// the path on the host
    pub host_path: PathBuf,
    /// the path in the container
    pub container_path: String,
    /// mounted read-only
    pub read_only: bool,
    /// `private`, `rslave` or `rshared`
    pub propagation: String,
}

impl Bind {
    /// A bind from one entry of volumed's container answer
    /// (`/v1/pods/<uid>/containers/<name>/mounts`).
    pub fn from_answer(m: &Value) -> Bind {
        Bind {
            host_path: PathBuf::from(m["host_path"].as_str().expect("host_path")),
            container_path: m["container_path"]
                .as_str()
                .expect("container_path")
                .to_owned(),
            read_only: m["read_only"].as_bool().expect("read_only"),
            propagation: m["propagation"].as_str().expect("propagation").to_owned(),
        }
    }
}

/// The process to run in a container.
#[derive(Debug, Clone)]
pub struct Process {
    /// uid
    pub uid: u32,
    /// primary gid
    pub gid: u32,
    /// supplemental groups (a pod's fsGroup among them, as CRI adds it)
    pub groups: Vec<u32>,
    /// a busybox `sh -c` script
    pub script: String,
}

/// What a container printed and how it ended.
#[derive(Debug)]
pub struct Exit {
    /// the exit status (`-1`: killed by a signal)
    pub code: i32,
    /// its standard output
    pub stdout: String,
    /// its standard error
    pub stderr: String,
}

/// A busybox root filesystem and runc's state dir, under `dir`.
pub struct Runtime {
    dir: PathBuf,
    rootfs: PathBuf,
    runs: usize,
}

impl Runtime {
    /// Makes a root filesystem under `dir`: busybox, one symlink per applet,
    /// empty `/proc`, `/dev` and `/tmp`.
    pub fn new(dir: &Path) -> Runtime {
        let rootfs = dir.join("rootfs");
        let bin = rootfs.join("bin");
        fs::create_dir_all(&bin).unwrap();
        for d in ["proc", "dev", "tmp", "etc"] {
            fs::create_dir_all(rootfs.join(d)).unwrap();
        }
        fs::copy(BUSYBOX, bin.join("busybox")).unwrap();
        let list = Command::new(BUSYBOX).arg("--list").output().unwrap();
        for applet in String::from_utf8_lossy(&list.stdout).lines() {
            if applet != "busybox" && !applet.is_empty() {
                symlink("busybox", bin.join(applet)).unwrap();
            }
        }
        fs::create_dir_all(dir.join("state")).unwrap();
        Runtime {
            dir: dir.to_owned(),
            rootfs,
            runs: 0,
        }
    }

    /// Runs `process` in a new container with `binds`, to its end.
    pub fn run(&mut self, name: &str, process: &Process, binds: &[Bind]) -> Exit {
        self.runs += 1;
        let id = format!("{name}-{}-{}", std::process::id(), self.runs);
        let bundle = self.dir.join(&id);
        fs::create_dir_all(&bundle).unwrap();
        let config = config(&self.rootfs, process, binds);
        fs::write(bundle.join("config.json"), config.to_string()).unwrap();
        let mut child = Command::new("runc")
            .arg("--root")
            .arg(self.dir.join("state"))
            .args(["run", "--bundle"])
            .arg(&bundle)
            .arg(&id)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start runc");
        let deadline = Instant::now() + RUN_MAX;
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = Command::new("runc")
                    .arg("--root")
                    .arg(self.dir.join("state"))
                    .args(["delete", "--force", &id])
                    .status();
                panic!("container {id} still running after {RUN_MAX:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stdout = String::new();
        let mut stderr = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut stdout)
            .unwrap();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        Exit {
            code: status.code().unwrap_or(-1),
            stdout,
            stderr,
        }
    }
}

/// An OCI runtime config: a read-only busybox root, `/proc`, a small
/// `/dev` and `/tmp`, the binds, and new pid, ipc, uts and mount
/// namespaces; no capability for a non-root process.
fn config(rootfs: &Path, p: &Process, binds: &[Bind]) -> Value {
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "mode=755", "size=1m"]}),
        json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "nodev", "mode=1777", "size=1m"]}),
    ];
    for b in binds {
        let mut options = vec!["rbind".to_owned(), b.propagation.clone()];
        if b.read_only {
            options.push("ro".to_owned());
        }
        mounts.push(json!({
            "destination": b.container_path,
            "type": "bind",
            "source": b.host_path,
            "options": options,
        }));
    }
    let caps: Vec<&str> = if p.uid == 0 {
        vec!["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER"]
    } else {
        vec![]
    };
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": p.uid, "gid": p.gid, "additionalGids": p.groups},
            "args": ["/bin/sh", "-c", p.script],
            "env": ["PATH=/bin"],
            "cwd": "/",
            "noNewPrivileges": true,
            "capabilities": {
                "bounding": caps, "effective": caps, "permitted": caps,
            },
        },
        "root": {"path": rootfs, "readonly": true},
        "hostname": "volumed-test",
        "mounts": mounts,
        "linux": {
            "namespaces": [
                {"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
            ],
        },
    })
}
