//! The slow disk (`volumed-slowfs`, source in `slowfs/`) as a child
//! process: a FUSE passthrough of a backing dir whose writes and syncs
//! wait the delay its delay file names. Mounted from inside a test's
//! private mount namespace, the mount stays there.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::mount::{MntFlags, umount2};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long the mount may take to be ready.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How often `volumed-slowfs` reads its delay file (its `DELAY_POLL`),
/// with room: a delay written is in force once this has passed.
pub const DELAY_TAKES: Duration = Duration::from_millis(300);

/// Whether FUSE can be mounted here: `/dev/fuse` exists and the kernel
/// knows the `fuse` filesystem. When not, why.
pub fn unavailable() -> Option<&'static str> {
    if !Path::new("/dev/fuse").exists() {
        return Some("no /dev/fuse");
    }
    let known = fs::read_to_string("/proc/filesystems")
        .map(|t| {
            t.lines()
                .any(|l| l.split_whitespace().last() == Some("fuse"))
        })
        .unwrap_or(false);
    (!known).then_some("no fuse in /proc/filesystems")
}

/// A mounted `volumed-slowfs`; stopped (SIGTERM, then SIGKILL and a lazy
/// unmount) when dropped.
pub struct SlowFs {
    child: Option<Child>,
    /// where the tree is served
    pub mountpoint: PathBuf,
    /// the tree's real place
    pub backing: PathBuf,
    /// the file holding the delay in milliseconds
    pub delay_file: PathBuf,
}

impl SlowFs {
    /// Mounts `backing` (created if missing) on `mountpoint` (likewise),
    /// the delay read from `delay_file`; waits until it prints `ready`.
    #[track_caller]
    pub fn mount(backing: &Path, mountpoint: &Path, delay_file: &Path) -> SlowFs {
        super::mkdirs(backing);
        super::mkdirs(mountpoint);
        let mut child = Command::new(env!("CARGO_BIN_EXE_volumed-slowfs"))
            .arg("--backing")
            .arg(backing)
            .arg("--mountpoint")
            .arg(mountpoint)
            .arg("--delay-file")
            .arg(delay_file)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn volumed-slowfs: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let first = BufReader::new(stdout).lines().next();
            let _ = tx.send(first);
        });
        let fs = SlowFs {
            child: Some(child),
            mountpoint: mountpoint.to_owned(),
            backing: backing.to_owned(),
            delay_file: delay_file.to_owned(),
        };
        match rx.recv_timeout(READY_TIMEOUT) {
            Ok(Some(Ok(line))) if line == "ready" => fs,
            other => panic!(
                "volumed-slowfs on {} did not print ready: {other:?}",
                mountpoint.display()
            ),
        }
    }

    /// Sets the delay (by rename: the reader never sees half a number);
    /// in force within [`DELAY_TAKES`].
    pub fn set_delay(&self, ms: u64) {
        let tmp = self.delay_file.with_extension("tmp");
        fs::write(&tmp, format!("{ms}\n")).unwrap();
        fs::rename(&tmp, &self.delay_file).unwrap();
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Waits up to `timeout` for the process to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = child.try_wait().unwrap() {
                self.child = None;
                return Some(s);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM and the exit status (None: still running after 10 s).
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let pid = self.pid()?;
        let _ = kill(Pid::from_raw(i32::try_from(pid).unwrap()), Signal::SIGTERM);
        self.wait_exit(Duration::from_secs(10))
    }
}

impl Drop for SlowFs {
    fn drop(&mut self) {
        if self.child.is_some() && self.stop().is_none() {
            if let Some(mut c) = self.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
            let _ = umount2(&self.mountpoint, MntFlags::MNT_DETACH);
        }
    }
}
