//! The SELinux test VM's plumbing, shared by `tests/selinux_vm.rs`,
//! `tests/power_loss.rs` and `tests/disk_eio_vm.rs`: building the image (`tests/selinux_vm/build.sh`
//! base and payload, the base cached in `<target>/selinux-vm/`), booting
//! it once under QEMU (TCG, one VM at a time per test binary) with a
//! scenario after `common.sh`, the blank virtio disks it gets, and parsing
//! the `@@BEGIN`/`@@STEP`/`@@DONE` evidence the scenario writes to the
//! second serial port.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_volumed");
const DRIVER_BIN: &str = env!("CARGO_BIN_EXE_volumed-testdriver");
/// The scenarios, `build.sh`, `init` and `common.sh`.
pub const HERE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/selinux_vm");
/// How long the VM may run, boot to power-off (the scenario's own waits add
/// up to less).
const VM_TIMEOUT: Duration = Duration::from_secs(300);
/// Held while a VM runs (the tests of one binary run on parallel threads).
static VM_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
/// How long building the base image may take (apt downloads included).
const BUILD_TIMEOUT: Duration = Duration::from_secs(900);

/// The target dir (the parent of `CARGO_TARGET_TMPDIR`), where the base
/// image is cached.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("VOLUMED_SELINUX_VM_DIR") {
        return PathBuf::from(dir);
    }
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("CARGO_TARGET_TMPDIR has a parent")
        .join("selinux-vm")
}

/// Runs a command to its end within `timeout`; its stdout and stderr go to
/// `log`. Returns whether it exited 0.
fn run_logged(mut cmd: Command, log: &Path, timeout: Duration) -> bool {
    let out = fs::File::create(log).expect("create build log");
    let err = out.try_clone().expect("clone build log handle");
    cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    let child = cmd.spawn().expect("spawn build.sh");
    let mut child = KillOnDrop(child);
    wait_timeout(&mut child.0, timeout).is_some_and(|s| s.success())
}

/// A child that is SIGKILLed if still running when dropped (a panicking test
/// never leaves QEMU behind).
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            return Some(status);
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What one boot left behind.
pub struct Run {
    /// the boot's scratch dir: logs, images and the disks (`disk.raw`, then
    /// the extra disks by name)
    pub scratch: tempfile::TempDir,
    /// the first serial port (kernel and scenario messages)
    pub console: String,
    /// the second serial port (the evidence)
    pub results: String,
    /// how QEMU ended
    pub status: String,
    /// seconds spent building the image
    pub build_secs: f64,
    /// seconds the VM ran
    pub boot_secs: f64,
}

/// A virtio disk given to the VM after `/dev/vda` (the 64 MiB `disk.raw`):
/// a sparse file of `size` bytes in the scratch dir named `name`, read by
/// the test after the VM is gone.
pub struct Disk {
    /// its file name in the scratch dir
    pub name: &'static str,
    /// its size in bytes
    pub size: u64,
}

/// Boots the VM once with `scenario` (a file in `tests/selinux_vm/`, run
/// after `common.sh`), with the test CSI driver in it when `driver`.
pub fn boot_vm(scenario: &str, driver: bool) -> Run {
    boot_vm_with(scenario, driver, &[], None)
}

/// [`boot_vm`] with `disks` as `/dev/vdb`, `/dev/vdc`, … in order, and
/// SELinux in `mode` (`None`: `VOLUMED_SELINUX_VM_MODE`, else enforcing).
pub fn boot_vm_with(scenario: &str, driver: bool, disks: &[Disk], mode: Option<&str>) -> Run {
    let scratch = tempfile::Builder::new()
        .prefix("volumed-selinux-vm-")
        .tempdir()
        .expect("create scratch dir");
    let dir = scratch.path().to_owned();
    let cache = cache_dir();
    let build = format!("{HERE}/build.sh");

    let t0 = Instant::now();
    let mut cmd = Command::new("bash");
    cmd.arg(&build).arg("base").arg(&cache);
    let log = dir.join("build.log");
    if !run_logged(cmd, &log, BUILD_TIMEOUT) {
        panic!(
            "build.sh base {} failed\n--- build log ---\n{}",
            cache.display(),
            fs::read_to_string(&log).unwrap_or_default()
        );
    }
    let payload = dir.join("payload.cpio");
    let script = dir.join("scenario.sh");
    let mut text = fs::read_to_string(format!("{HERE}/common.sh")).expect("read common.sh");
    text.push_str(&fs::read_to_string(format!("{HERE}/{scenario}")).expect("read the scenario"));
    fs::write(&script, text).expect("write the scenario");
    let mut cmd = Command::new("bash");
    cmd.arg(&build)
        .arg("payload")
        .arg(&cache)
        .arg(BIN)
        .arg(&script)
        .arg(&payload);
    if driver {
        cmd.arg(DRIVER_BIN);
    }
    let log = dir.join("payload.log");
    if !run_logged(cmd, &log, BUILD_TIMEOUT) {
        panic!(
            "build.sh payload failed\n--- log ---\n{}",
            fs::read_to_string(&log).unwrap_or_default()
        );
    }
    // The kernel unpacks concatenated archives in order: base, then payload.
    // An uncompressed archive is recognised only at a 4-byte aligned offset;
    // zero bytes between archives are skipped, so pad the gzip member.
    let initrd = dir.join("initrd.img");
    let mut bytes = fs::read(cache.join("base.cpio.gz")).expect("read base.cpio.gz");
    bytes.resize(bytes.len().next_multiple_of(512), 0);
    bytes.extend(fs::read(&payload).expect("read payload.cpio"));
    fs::write(&initrd, bytes).expect("write initrd.img");
    let disk = dir.join("disk.raw");
    fs::File::create(&disk)
        .and_then(|f| f.set_len(64 << 20))
        .expect("create the 64 MiB disk");
    for d in disks {
        fs::File::create(dir.join(d.name))
            .and_then(|f| f.set_len(d.size))
            .unwrap_or_else(|e| panic!("create the disk {}: {e}", d.name));
    }
    let build_secs = t0.elapsed().as_secs_f64();

    let mode = mode.map_or_else(
        || std::env::var("VOLUMED_SELINUX_VM_MODE").unwrap_or_else(|_| "enforcing".into()),
        str::to_owned,
    );
    let console = dir.join("console.log");
    let results = dir.join("results.log");
    let mut qemu = Command::new("qemu-system-x86_64");
    qemu.args(["-accel", "tcg", "-cpu", "max", "-m", "512", "-smp", "1"])
        .args([
            "-nographic",
            "-no-reboot",
            "-monitor",
            "none",
            "-nic",
            "none",
        ])
        .arg("-kernel")
        .arg(cache.join("vmlinuz"))
        .arg("-initrd")
        .arg(&initrd)
        .arg("-append")
        .arg(format!(
            "console=ttyS0 security=selinux quiet panic=-1 vmtest.selinux={mode}"
        ))
        .arg("-drive")
        .arg(format!("file={},format=raw,if=virtio", disk.display()));
    for d in disks {
        qemu.arg("-drive").arg(format!(
            "file={},format=raw,if=virtio",
            dir.join(d.name).display()
        ));
    }
    qemu.arg("-serial")
        .arg(format!("file:{}", console.display()))
        .arg("-serial")
        .arg(format!("file:{}", results.display()));
    let qlog = dir.join("qemu.log");
    let out = fs::File::create(&qlog).expect("create qemu.log");
    let err = out.try_clone().expect("clone qemu.log handle");
    qemu.stdin(Stdio::null()).stdout(out).stderr(err);
    // One VM at a time: each is a single-threaded emulation that needs a
    // core of its own, and the scenarios' waits assume it has one.
    let one_vm = VM_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let t1 = Instant::now();
    let mut child = KillOnDrop(qemu.spawn().expect("spawn qemu-system-x86_64"));
    let status = match wait_timeout(&mut child.0, VM_TIMEOUT) {
        Some(s) => s.to_string(),
        None => format!("killed after {} s", VM_TIMEOUT.as_secs()),
    };
    let boot_secs = t1.elapsed().as_secs_f64();
    drop(child);
    drop(one_vm);
    let read = |p: &Path| String::from_utf8_lossy(&fs::read(p).unwrap_or_default()).into_owned();
    let qemu_out = read(&qlog);
    Run {
        console: read(&console),
        results: read(&results),
        status: if qemu_out.trim().is_empty() {
            status
        } else {
            format!("{status}; qemu said: {}", qemu_out.trim())
        },
        scratch,
        build_secs,
        boot_secs,
    }
}

/// The scenario's output, parsed.
#[derive(Default)]
pub struct Evidence {
    /// block name → its text
    pub blocks: BTreeMap<String, String>,
    /// step name → (ok, seconds)
    pub steps: BTreeMap<String, (bool, String)>,
    /// whether `@@DONE` came
    pub done: bool,
}

impl Evidence {
    /// Parses the second serial port's text.
    pub fn parse(text: &str) -> Self {
        let mut ev = Self::default();
        let mut open: Option<(String, String)> = None;
        for line in text.lines() {
            let line = line.trim_end_matches('\r');
            if let Some((name, body)) = &mut open {
                if line == format!("@@END {name}") {
                    let (name, body) = open.take().expect("an open block");
                    ev.blocks.insert(name, body);
                } else {
                    body.push_str(line);
                    body.push('\n');
                }
                continue;
            }
            if let Some(name) = line.strip_prefix("@@BEGIN ") {
                open = Some((name.to_owned(), String::new()));
            } else if let Some(rest) = line.strip_prefix("@@STEP ") {
                let mut f = rest.split_whitespace();
                if let (Some(name), Some(result)) = (f.next(), f.next()) {
                    let secs = f.next().unwrap_or("?").to_owned();
                    ev.steps.insert(name.to_owned(), (result == "ok", secs));
                }
            } else if line.starts_with("@@DONE") {
                ev.done = true;
            }
        }
        ev
    }

    /// The block `name`, or why it is missing.
    pub fn block(&self, name: &str) -> Result<&str, String> {
        self.blocks
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| format!("no evidence block {name:?} (the scenario did not get there)"))
    }

    /// How the step `name` ended: `Ok("after N s")`, or why not.
    pub fn step(&self, name: &str) -> Result<String, String> {
        match self.steps.get(name) {
            Some((true, secs)) => Ok(format!("after {secs} s")),
            Some((false, secs)) => Err(format!("timed out after {secs} s")),
            None => Err("never reached".to_owned()),
        }
    }

    /// The block `name` parsed as JSON.
    pub fn json(&self, name: &str) -> Result<Value, String> {
        let text = self.block(name)?;
        serde_json::from_str(text).map_err(|e| format!("{name} is not JSON ({e}): {text}"))
    }
}

/// One check of a VM scenario: what it found, or why it failed.
pub type Outcome = Result<String, String>;

/// Prints every check's outcome under `title`; fails (with the console,
/// the scenario's output and the logs kept) if any failed. The `big`
/// images in the scratch dir are removed first: the logs are kept for a
/// look afterwards, not hundreds of MB of disks.
pub fn report(run: Run, title: &str, failing: &str, big: &[&str], results: &[(String, Outcome)]) {
    use std::fmt::Write as _;
    let mut report = format!(
        "{title}: image {:.1} s, VM {:.1} s ({}), scratch {}\n",
        run.build_secs,
        run.boot_secs,
        run.status,
        run.scratch.path().display()
    );
    let failed = results.iter().filter(|(_, r)| r.is_err()).count();
    for (name, r) in results {
        let (tag, detail) = match r {
            Ok(d) => ("PASS", d),
            Err(d) => ("FAIL", d),
        };
        let _ = writeln!(
            report,
            "  {tag} {name}: {}",
            detail.replace('\n', "\n       ")
        );
    }
    let title_word = title.split(' ').next().unwrap_or(title);
    let _ = writeln!(
        report,
        "{title_word} checks: {} of {} passed",
        results.len() - failed,
        results.len()
    );
    if failed > 0 {
        for b in big {
            let _ = std::fs::remove_file(run.scratch.path().join(b));
        }
        let kept = run.scratch.keep();
        panic!(
            "{failed} {failing} check(s) failed\n{report}\
             --- console (ttyS0) ---\n{}\n--- scenario output (ttyS1) ---\n{}\n\
             (logs kept in {})",
            run.console,
            run.results,
            kept.display()
        );
    }
    eprint!("{report}");
}
