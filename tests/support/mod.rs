//! Real-kernel test harness: a private mount namespace per test, mount
//! helpers, loop devices that cannot leak, and a root check; the test CSI
//! driver as a child process is in [`csi_driver`]; the daemon binary end to
//! end ([`Env`](daemon::Env), [`Daemon`](daemon::Daemon)) in [`daemon`]; a
//! fake Kubernetes API server for the real `kube` client in [`apiserver`];
//! the SELinux test VM (image, boot, evidence) in [`vm`]; the dm-log-writes
//! log reader and replayer in [`log_writes`]; the loop devices a raw block
//! map holds, found and swept, in [`holds`]; the slow journal disk
//! (`volumed-slowfs`, a FUSE passthrough) in [`slowfs`].
//!
//! Used by integration tests (`mod support;`) and benches
//! (`#[path = "../tests/support/mod.rs"] mod support;`).
//!
//! # Why re-exec and not fork-and-run-the-closure
//!
//! A test binary is multi-threaded (libtest runs tests on threads, in
//! parallel). After `fork` only the forking thread exists in the child, and
//! any lock another thread held at that instant (std's environment lock, a
//! logger, an allocator arena in a less careful libc) stays locked forever, so
//! running arbitrary Rust code — let alone `Command::spawn` of the daemon —
//! in a forked child of a threaded process can deadlock. Doing the `unshare`
//! in the test's own thread instead is no better: a mount namespace belongs to
//! a *thread*, and `/proc/self/mountinfo` shows the thread-group leader's,
//! not ours.
//!
//! So [`in_private_mount_ns`] re-executes the current test binary to run only
//! this test (`<name> --exact`) in a child process that enters its own mount
//! namespace *before* `exec`: the `pre_exec` hook (between fork and exec,
//! where only async-signal-safe calls are allowed) does just three raw
//! syscalls — `unshare(CLONE_NEWNS)`, `mount(NULL, "/", NULL,
//! MS_REC|MS_PRIVATE, NULL)` and `prctl(PR_SET_PDEATHSIG, SIGKILL)` — with no
//! allocation. The re-executed binary is then a fresh process whose every
//! thread, `/proc/self` and every process it spawns (the `volumed` binary)
//! live in the private namespace. Nothing it mounts propagates to the host,
//! and when its last process exits the namespace and all its mounts die with
//! it, however the test ended.
//!
//! In the child an environment variable names the test, so the same call runs
//! the closure instead of spawning again; it first checks that it really is in
//! another mount namespace than the parent and that `/` is not shared, and
//! refuses to run otherwise. The parent waits with a timeout (a hang becomes a
//! failure: the child's whole process group is SIGKILLed), checks that the
//! child ran exactly one test, and turns a failure into a panic carrying the
//! child's output. For a single-threaded process that wants to move itself
//! (a bench's `main`), [`enter_private_mount_ns`] does the same in place.
//!
//! # Loop devices that cannot leak
//!
//! [`LoopDevice::attach`] does not shell out to `losetup`: `losetup -f --show`
//! leaves the device bound without autoclear, so a test killed before its
//! cleanup leaks the device on the host. Instead it asks
//! `/dev/loop-control` for a free device and binds it with one
//! `LOOP_CONFIGURE` ioctl carrying `LO_FLAGS_AUTOCLEAR`, so there is no
//! instant when the device is bound without autoclear. Two tests can be handed
//! the same free number; the loser gets `EBUSY` and retries with a fresh one.
//! The [`LoopDevice`] keeps the device open; with autoclear the kernel unbinds
//! it when the last reference goes — our fd (closed by `Drop`, or by the
//! process dying) and any mount of it (unmounted by the test, or torn down
//! with the namespace). Never a fixed loop number.
#![allow(dead_code)] // each test target uses a different part of the harness

use std::ffi::CStr;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, unshare};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use volumed::host::mountinfo::MountTable;

pub mod api_env;
pub mod apiserver;
pub mod csi_driver;
pub mod daemon;
pub mod holds;
pub mod log_writes;
pub mod runc;
pub mod slowfs;
pub mod vm;

/// Set in the re-executed child: the name of the test it runs.
const CHILD_ENV: &str = "VOLUMED_TEST_MOUNT_NS_CHILD";
/// Set in the re-executed child: the parent's mount namespace (`mnt:[N]`).
const PARENT_NS_ENV: &str = "VOLUMED_TEST_PARENT_MOUNT_NS";
/// How long a namespaced test may run before it is killed and failed.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Whether we are root. When not, prints `skipped: needs root (<what>)` and
/// returns false, so `cargo test` as a normal user passes and says what it
/// did not exercise. Written to the real stderr, past libtest's capture, so
/// the skip shows in a normal `cargo test` run.
pub fn require_root(what: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    let _ = writeln!(io::stderr(), "skipped: needs root ({what})");
    false
}

/// Whether a test that boots the QEMU VM runs: as root ([`require_root`]),
/// unless a developer set `VOLUMED_SKIP_VM=1` to spare the boots locally
/// (then it prints `skipped: ...`). Under `CI=true` the variable is an
/// error: CI runs every boot.
pub fn vm_wanted(what: &str) -> bool {
    if std::env::var_os("VOLUMED_SKIP_VM").is_some_and(|v| v != "0" && !v.is_empty()) {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "VOLUMED_SKIP_VM is set under CI=true: CI runs every VM boot"
        );
        let _ = writeln!(io::stderr(), "skipped: VOLUMED_SKIP_VM is set ({what})");
        return false;
    }
    require_root(what)
}

/// Runs `f` in a private mount namespace (see the module docs), with
/// [`DEFAULT_TIMEOUT`]. Call it from a `#[test]` function, once, as the whole
/// body after [`require_root`]: the child re-runs that test function by name.
pub fn in_private_mount_ns<F: FnOnce()>(f: F) {
    in_private_mount_ns_timeout(DEFAULT_TIMEOUT, f);
}

/// [`in_private_mount_ns`] with a chosen timeout.
pub fn in_private_mount_ns_timeout<F: FnOnce()>(timeout: Duration, f: F) {
    let name = current_test_name();
    if std::env::var_os(CHILD_ENV).is_some_and(|v| v == name.as_str()) {
        assert_in_private_ns();
        f();
    } else {
        run_in_child(&name, timeout);
    }
}

/// The running test's full name: libtest names each test's thread after it.
fn current_test_name() -> String {
    match std::thread::current().name() {
        Some(n) if n != "main" => n.to_owned(),
        other => panic!(
            "in_private_mount_ns must be called from a libtest #[test] thread (thread name {other:?})"
        ),
    }
}

fn mount_ns_link() -> String {
    fs::read_link("/proc/self/ns/mnt")
        .expect("read /proc/self/ns/mnt")
        .to_string_lossy()
        .into_owned()
}

/// Refuses to go on unless this process is in another mount namespace than
/// the parent test process and `/` is not shared with anyone.
fn assert_in_private_ns() {
    let parent = std::env::var(PARENT_NS_ENV).expect("parent mount namespace not passed");
    let mine = mount_ns_link();
    assert_ne!(
        mine, parent,
        "refusing to run: still in the parent's mount namespace"
    );
    let table = MountTable::read_self().expect("read own mountinfo");
    let root = table.top_at(Path::new("/")).expect("no / in own mountinfo");
    assert!(
        root.propagation.shared.is_none(),
        "refusing to run: / is still shared ({:?})",
        root.propagation
    );
}

/// The `pre_exec` hook: only async-signal-safe raw syscalls, no allocation
/// (`CStr` literals and `None` paths make nix pass pointers straight through).
fn enter_ns_before_exec() -> io::Result<()> {
    unshare(CloneFlags::CLONE_NEWNS)?;
    mount(
        None::<&CStr>,
        c"/",
        None::<&CStr>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&CStr>,
    )?;
    // A parent test process that dies (or is killed) takes the child along.
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
    Ok(())
}

fn run_in_child(name: &str, timeout: Duration) {
    match run_test_in_private_mount_ns(name, &[], timeout) {
        Ok(report) => println!("{report}"),
        Err(report) => panic!("{report}"),
    }
}

/// Runs the test `name` of the current test binary (ignored tests included)
/// in a child process in a fresh private mount namespace, with `env` added
/// to its environment; the test must call [`in_private_mount_ns`] (which
/// then runs its closure). `Ok` carries the child's output, `Err` a report
/// of why it failed (a failure, a timeout — the child's whole process group
/// is SIGKILLed — or not exactly one test run) with the child's output.
/// For runners that start several namespaced runs from one test (the crash
/// fixtures: one namespace per scenario).
pub fn run_test_in_private_mount_ns(
    name: &str,
    env: &[(&str, String)],
    timeout: Duration,
) -> Result<String, String> {
    let exe = std::env::current_exe().expect("current test binary");
    let out = tempfile::tempdir().expect("tempdir for child output");
    let (out_path, err_path) = (out.path().join("stdout"), out.path().join("stderr"));
    let mut cmd = Command::new(&exe);
    cmd.args([
        name,
        "--exact",
        "--include-ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, name)
    .env(PARENT_NS_ENV, mount_ns_link())
    .envs(env.iter().map(|(k, v)| (k, v)))
    .stdin(Stdio::null())
    .stdout(File::create(&out_path).expect("child stdout file"))
    .stderr(File::create(&err_path).expect("child stderr file"))
    // its own process group, so a timeout kills whatever it spawned too
    .process_group(0);
    // SAFETY: the hook runs between fork and exec in the child and only makes
    // raw syscalls through nix with pre-built C strings (no allocation, no
    // locks), which is async-signal-safe.
    unsafe {
        cmd.pre_exec(enter_ns_before_exec);
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {} in a new mount namespace: {e}", exe.display()));
    let status = wait_timeout(&mut child, timeout);
    let stdout = fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = fs::read_to_string(&err_path).unwrap_or_default();
    let report = format!(
        "--- child stdout ---\n{stdout}--- child stderr ---\n{stderr}--- end of child output ---"
    );
    match status {
        None => Err(format!(
            "test {name} timed out after {timeout:?} in its mount namespace; killed\n{report}"
        )),
        Some(s) if !s.success() => Err(format!(
            "test {name} failed in its mount namespace ({s})\n{report}"
        )),
        Some(_) if !stdout.contains(" 1 passed;") => Err(format!(
            "test {name}: the child did not run exactly this one test\n{report}"
        )),
        Some(_) => Ok(report),
    }
}

/// Waits for `child`; on timeout SIGKILLs its process group and returns None.
fn wait_timeout(child: &mut std::process::Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = child.try_wait().expect("wait for namespaced child") {
            return Some(s);
        }
        if Instant::now() >= deadline {
            let pgid = Pid::from_raw(i32::try_from(child.id()).expect("pid fits i32"));
            let _ = killpg(pgid, Signal::SIGKILL);
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Moves the calling process into a new private mount namespace in place
/// (`unshare(CLONE_NEWNS)` + `/` made `rprivate`). Only for a single-threaded
/// process (a bench's `main`): a mount namespace is per thread, so in a
/// threaded process the others would stay behind. Panics otherwise.
pub fn enter_private_mount_ns() {
    let threads = fs::read_dir("/proc/self/task")
        .expect("read /proc/self/task")
        .count();
    assert_eq!(
        threads, 1,
        "enter_private_mount_ns needs a single-threaded process"
    );
    let before = mount_ns_link();
    enter_ns_before_exec().expect("enter a private mount namespace");
    assert_ne!(mount_ns_link(), before, "mount namespace did not change");
}

/// Mounts a tmpfs at `target` with `options` (e.g. `size=1m`; empty for none).
#[track_caller]
pub fn mount_tmpfs(target: &Path, options: &str) {
    let data = (!options.is_empty()).then_some(options);
    mount(Some("tmpfs"), target, Some("tmpfs"), MsFlags::empty(), data)
        .unwrap_or_else(|e| panic!("mount tmpfs on {}: {e}", target.display()));
}

/// Fills the filesystem holding `dir` to its last byte with one file,
/// `<dir>/filler`, and returns it (removing it frees the space): 64 KiB,
/// then 4 KiB, then single bytes written until each size meets `ENOSPC`,
/// so not even a partial block is left. Any other error panics.
pub fn fill_fs(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut f = File::create(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    for chunk in [1 << 16, 1 << 12, 1] {
        let buf = vec![0xa5u8; chunk];
        loop {
            match f.write(&buf) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => break,
                Err(e) => panic!("fill {}: {e}", path.display()),
            }
        }
    }
    let st = nix::sys::statvfs::statvfs(dir).expect("statvfs");
    assert_eq!(st.blocks_available(), 0, "{} is full", dir.display());
    path
}

/// Mounts the block device `device` (of type `fs_type`) at `target`.
#[track_caller]
pub fn mount_device(device: &Path, target: &Path, fs_type: &str) {
    mount(
        Some(device),
        target,
        Some(fs_type),
        MsFlags::empty(),
        None::<&str>,
    )
    .unwrap_or_else(|e| {
        panic!(
            "mount {} ({fs_type}) on {}: {e}",
            device.display(),
            target.display()
        )
    });
}

/// Bind-mounts `source` on `target` (not recursive).
#[track_caller]
pub fn bind_mount(source: &Path, target: &Path) {
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap_or_else(|e| {
        panic!(
            "bind mount {} on {}: {e}",
            source.display(),
            target.display()
        )
    });
}

/// (inode, mtime) of each path, a link itself rather than its target:
/// what "nothing was rewritten" compares.
pub fn stamps(paths: &[PathBuf]) -> Vec<(u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    paths
        .iter()
        .map(|p| {
            let m = fs::symlink_metadata(p).unwrap();
            (m.ino(), m.mtime(), m.mtime_nsec())
        })
        .collect()
}

/// Unmounts `target` (no lazy detach: a busy mount is a test failure).
#[track_caller]
pub fn umount(target: &Path) {
    umount2(target, MntFlags::UMOUNT_NOFOLLOW)
        .unwrap_or_else(|e| panic!("umount {}: {e}", target.display()));
}

/// Creates `dir` and its parents.
#[track_caller]
pub fn mkdirs(dir: &Path) {
    fs::create_dir_all(dir).unwrap_or_else(|e| panic!("mkdir -p {}: {e}", dir.display()));
}

/// Makes `file` a sparse file of `size_mb` MiB holding an empty ext4
/// (`mkfs.ext4 -q -F`).
#[track_caller]
pub fn mkfs_ext4(file: &Path, size_mb: u64) {
    File::create(file)
        .and_then(|f| f.set_len(size_mb << 20))
        .unwrap_or_else(|e| panic!("create image {}: {e}", file.display()));
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("run mkfs.ext4: {e}"));
    assert!(
        out.status.success(),
        "mkfs.ext4 {}: {}\n{}",
        file.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A temporary directory that is a safe place to mount in: on drop it first
/// lazily unmounts whatever is still mounted below it (deepest first, so a
/// panicking test never leaves `remove_dir_all` fighting a mount), then
/// removes it. Its path is canonical, as mountinfo shows it.
pub struct Scratch {
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
}

impl Scratch {
    /// A fresh, uniquely named directory under the system temp dir.
    pub fn new(prefix: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .expect("create scratch dir");
        let path = fs::canonicalize(dir.path()).expect("canonicalize scratch dir");
        Self {
            dir: Some(dir),
            path,
        }
    }

    /// The canonical path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every mount point at or below the scratch dir, in table order.
    pub fn mounts_below(&self) -> Vec<PathBuf> {
        let table = MountTable::read_self().expect("read own mountinfo");
        table
            .entries()
            .iter()
            .filter(|m| m.mount_point.starts_with(&self.path))
            .map(|m| m.mount_point.clone())
            .collect()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Newest first: children were mounted after their parents.
        for _ in 0..3 {
            let left = self.mounts_below();
            if left.is_empty() {
                break;
            }
            for m in left.iter().rev() {
                let _ = umount2(m.as_path(), MntFlags::MNT_DETACH);
            }
        }
        if let Some(d) = self.dir.take() {
            let _ = d.close();
        }
    }
}

/// The kernel's loop ABI and one bind, shared with the test CSI driver
/// (its own binary: it cannot use this crate's code).
#[path = "../../testdriver/loopdev.rs"]
mod loopdev;

/// A loop device bound to a file with autoclear (see the module docs). It is
/// unbound by the kernel once this is dropped and nothing mounts it.
pub struct LoopDevice(loopdev::Loop);

impl LoopDevice {
    /// Binds a free loop device to `backing` with `LO_FLAGS_AUTOCLEAR` in one
    /// `LOOP_CONFIGURE`, retrying when another process takes the free device
    /// first.
    #[track_caller]
    pub fn attach(backing: &Path) -> LoopDevice {
        let lo = loopdev::Loop::attach(backing)
            .unwrap_or_else(|e| panic!("a loop device for {}: {e}", backing.display()));
        LoopDevice(lo)
    }

    /// `/dev/loopN`.
    pub fn path(&self) -> &Path {
        &self.0.path
    }

    /// N.
    pub fn number(&self) -> u32 {
        self.0.number
    }

    /// Whether this device is still bound to our file (a device number can
    /// be reused by a parallel test once we let go of it).
    pub fn is_bound(&self) -> bool {
        loopdev::bound_to(self.0.number, &self.0.backing)
    }

    /// Closes our reference and waits (up to `timeout`) for autoclear to
    /// unbind the device; false if it is still bound to our file (something
    /// still mounts it).
    pub fn close_and_wait_unbound(self, timeout: Duration) -> bool {
        self.0.detach(timeout)
    }
}
