//! SELinux end to end on a real SELinux kernel: volumed inside a QEMU VM.
//!
//! This machine's kernel cannot turn SELinux on, so the test boots a Debian
//! kernel under QEMU with `security=selinux` (software emulation, `-accel
//! tcg -cpu max`: KVM hangs here, see `../shared/reference/selinux-real-kernel.md`)
//! and runs the real `volumed` binary in it, against a blank 64 MiB virtio
//! disk that is a local PV (`/dev/vda`, ext4, ReadWriteOncePod).
//!
//! - `tests/selinux_vm/build.sh base DIR` makes the kernel and a base
//!   initramfs from Debian packages only (it installs the host tools it
//!   needs, downloads the kernel, the refpolicy and the SELinux userland with
//!   `apt-get download`, builds the binary policy with the extracted
//!   `semodule` plus `container.cil`, and packs busybox-static, modules and a
//!   few host glibc tools). It is cached in `<target>/selinux-vm/` and reused
//!   while its inputs (the script, the package versions) are unchanged:
//!   about 60 s the first time, under a second after.
//! - `build.sh payload` appends an archive with this build's `volumed`
//!   (`CARGO_BIN_EXE_volumed`, dynamically linked, debug info stripped, with
//!   the libraries `ldd` names: it is exactly the binary under test, and no
//!   second static build is needed) and `tests/selinux_vm/scenario.sh`.
//! - The VM's `/init` loads the policy (enforcing by default;
//!   `VOLUMED_SELINUX_VM_MODE=permissive` for the other mode) and runs the
//!   scenario once: pod A with level `s0:c10,c20`, then pod B with
//!   `s0:c30,c40` on the same claim, `kill -9` and restart of volumed, pod A
//!   removed. The scenario only drives and gathers evidence — mount tables,
//!   file labels, `/metrics`, `/debug/state`, `dump`, the daemon's log —
//!   written as `@@BEGIN name … @@END name` blocks and `@@STEP name ok|timeout`
//!   lines to the second serial port; every assertion is made here, and all
//!   of them are reported before the test fails, with the console log.
//!
//! - With the cargo feature `failpoints` (`.ci/run` runs it so), a second
//!   boot runs `crash.sh`: labelled volumes through every crash point of the
//!   four journaled operations and the format step — volumed dies by SIGKILL
//!   there, the dry run may call only a cut format uncertain, and the restart
//!   converges with the label on the device and pod targets (or nothing
//!   mounted after a teardown point). Both scenarios run after `common.sh`.
//!
//! Needs root (for `apt-get`) and says it was skipped otherwise. Nothing is
//! mounted on the host; each run has its own scratch dir, so it runs twice
//! in a row or beside other tests. One boot takes about a minute of emulation.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_volumed");
const HERE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/selinux_vm");
/// How long the VM may run, boot to power-off (the scenario's own waits add
/// up to less).
const VM_TIMEOUT: Duration = Duration::from_secs(300);
/// How long building the base image may take (apt downloads included).
const BUILD_TIMEOUT: Duration = Duration::from_secs(900);

const PV: &str = "pv-sel";
const VOLUME: &str = "kubernetes.io/local-volume/pv-sel";
const UID_A: &str = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa";
const UID_B: &str = "bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb";
const LABEL_A: &str = "system_u:object_r:container_file_t:s0:c10,c20";
const LABEL_B: &str = "system_u:object_r:container_file_t:s0:c30,c40";
const ROOT: &str = "/var/lib/kubelet";
const MISMATCH_METRIC: &str = "volume_manager_selinux_volume_context_mismatch_errors_total";

fn device_target() -> String {
    format!("{ROOT}/plugins/kubernetes.io/local-volume/mounts/{PV}")
}

fn pod_target(uid: &str) -> String {
    format!("{ROOT}/pods/{uid}/volumes/kubernetes.io~local-volume/{PV}")
}

/// The kubelet's message for the refused pod.
fn conflict_message() -> String {
    format!("conflicting SELinux labels of volume {PV}: \"{LABEL_A}\" and \"{LABEL_B}\"")
}

// ---------------------------------------------------------------- the VM

/// The target dir (the parent of `CARGO_TARGET_TMPDIR`), where the base
/// image is cached.
fn cache_dir() -> PathBuf {
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
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
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
struct Run {
    scratch: tempfile::TempDir,
    console: String,
    results: String,
    status: String,
    build_secs: f64,
    boot_secs: f64,
}

/// Boots the VM once with `scenario` (a file in `tests/selinux_vm/`, run
/// after `common.sh`).
fn boot_vm(scenario: &str) -> Run {
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
    let build_secs = t0.elapsed().as_secs_f64();

    let mode = std::env::var("VOLUMED_SELINUX_VM_MODE").unwrap_or_else(|_| "enforcing".into());
    let console = dir.join("console.log");
    let results = dir.join("results.log");
    let t1 = Instant::now();
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
        .arg(format!("file={},format=raw,if=virtio", disk.display()))
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .arg("-serial")
        .arg(format!("file:{}", results.display()));
    let qlog = dir.join("qemu.log");
    let out = fs::File::create(&qlog).expect("create qemu.log");
    let err = out.try_clone().expect("clone qemu.log handle");
    qemu.stdin(Stdio::null()).stdout(out).stderr(err);
    let mut child = KillOnDrop(qemu.spawn().expect("spawn qemu-system-x86_64"));
    let status = match wait_timeout(&mut child.0, VM_TIMEOUT) {
        Some(s) => s.to_string(),
        None => format!("killed after {} s", VM_TIMEOUT.as_secs()),
    };
    let boot_secs = t1.elapsed().as_secs_f64();
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

// ---------------------------------------------------------------- evidence

/// The scenario's output, parsed.
#[derive(Default)]
struct Evidence {
    blocks: BTreeMap<String, String>,
    /// step name → (ok, seconds)
    steps: BTreeMap<String, (bool, String)>,
    done: bool,
}

impl Evidence {
    fn parse(text: &str) -> Self {
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

    fn block(&self, name: &str) -> Result<&str, String> {
        self.blocks
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| format!("no evidence block {name:?} (the scenario did not get there)"))
    }

    fn step(&self, name: &str) -> Result<String, String> {
        match self.steps.get(name) {
            Some((true, secs)) => Ok(format!("after {secs} s")),
            Some((false, secs)) => Err(format!("timed out after {secs} s")),
            None => Err("never reached".to_owned()),
        }
    }

    fn json(&self, name: &str) -> Result<Value, String> {
        let text = self.block(name)?;
        serde_json::from_str(text).map_err(|e| format!("{name} is not JSON ({e}): {text}"))
    }
}

/// One mountinfo line, the fields the checks need.
struct Mount {
    mount_point: String,
    source: String,
    super_options: String,
}

fn mounts(table: &str) -> Vec<Mount> {
    table
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mount_point = left.split(' ').nth(4)?.to_owned();
            let mut r = right.split(' ');
            let _fstype = r.next()?;
            Some(Mount {
                mount_point,
                source: r.next()?.to_owned(),
                super_options: r.next().unwrap_or("").to_owned(),
            })
        })
        .collect()
}

/// `path` is a mount of `/dev/vda` whose super options carry `context="label"`.
fn mounted_with(ev: &Evidence, block: &str, path: &str, label: &str) -> Result<String, String> {
    let table = ev.block(block)?;
    let all = mounts(table);
    let found: Vec<&Mount> = all.iter().filter(|m| m.mount_point == path).collect();
    let want = format!("context=\"{label}\"");
    match found.as_slice() {
        [] => Err(format!("{path} is not mounted")),
        [m] if m.source == "/dev/vda" && m.super_options.contains(&want) => {
            Ok(m.super_options.clone())
        }
        [m] => Err(format!(
            "{path} is mounted from {} with super options {:?}, expected {want}",
            m.source, m.super_options
        )),
        many => Err(format!("{path} is mounted {} times", many.len())),
    }
}

/// The file's label as `stat -c %C` printed it, and whether `ls -Z` agrees.
fn file_label(ev: &Evidence, block: &str, file: &str, label: &str) -> Result<String, String> {
    let text = ev.block(block)?;
    let stat = text
        .lines()
        .find_map(|l| l.strip_suffix(&format!(" {file}")))
        .ok_or_else(|| format!("no stat line for {file}:\n{text}"))?;
    if stat != label {
        return Err(format!(
            "stat -c %C {file} says {stat:?}, expected {label:?}"
        ));
    }
    let ls = text
        .lines()
        .any(|l| l.split_whitespace().collect::<Vec<_>>() == [label, "hello.txt"]);
    if !ls {
        return Err(format!("ls -Z does not show {label} hello.txt:\n{text}"));
    }
    Ok(format!("{file}: {stat}"))
}

/// The value of a metric series whose labels include all of `labels`.
fn metric(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| labels.iter().all(|lab| l.contains(lab)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .reduce(f64::max)
}

/// The target of `volume` in a `dump`/`/debug/state` state document: the
/// device (`pod` None) or a pod's.
fn target<'a>(state: &'a Value, pod: Option<&str>) -> Result<&'a Value, String> {
    let vol = state["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["volume"] == VOLUME)
        .ok_or_else(|| format!("no volume {VOLUME} in {state}"))?;
    match pod {
        None => Ok(&vol["device"]),
        Some(uid) => vol["pods"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["pod_uid"] == uid)
            .ok_or_else(|| format!("no pod {uid} on {VOLUME}")),
    }
}

fn mounted_in_dump(t: &Value, label: &str) -> Result<String, String> {
    if t["state"] == "mounted" && t["selinux_context"] == label {
        Ok(format!("state mounted, selinux_context {label}"))
    } else {
        Err(format!(
            "expected state mounted with selinux_context {label:?}, got {t}"
        ))
    }
}

// ---------------------------------------------------------------- checks

type Outcome = Result<String, String>;

fn selinux_active(ev: &Evidence, mode: &str) -> Outcome {
    let want = if mode == "permissive" {
        "Permissive"
    } else {
        "Enforcing"
    };
    let env = ev.block("env")?;
    let lsm_ok = env.lines().any(|l| l.split(',').any(|m| m == "selinux"));
    let fs_ok = env.contains(" /sys/fs/selinux ") && env.contains("selinuxfs");
    let mode_ok = env.lines().any(|l| l == want);
    if lsm_ok && fs_ok && mode_ok {
        Ok(format!("selinux LSM, selinuxfs, {want}"))
    } else {
        Err(format!(
            "expected selinux in the LSM list, selinuxfs and {want}:\n{env}"
        ))
    }
}

fn control_mount(ev: &Evidence) -> Outcome {
    let t = ev.block("control_mountinfo")?;
    let l = ev.block("control_labels")?;
    if t.contains(&format!("context=\"{LABEL_A}\"")) && l.contains(LABEL_A) {
        Ok("tmpfs mounted with the label, its file reports it".into())
    } else {
        Err(format!("mountinfo: {t}labels: {l}"))
    }
}

fn mismatch_metric(ev: &Evidence) -> Outcome {
    let text = ev.block("b_metrics")?;
    let labels = [
        "access_mode=\"RWOP\"",
        "volume_plugin=\"kubernetes.io/local-volume\"",
    ];
    match metric(text, MISMATCH_METRIC, &labels) {
        Some(v) if v >= 1.0 => Ok(format!("{MISMATCH_METRIC} = {v}")),
        Some(v) => Err(format!("{MISMATCH_METRIC} = {v}")),
        None => Err(format!("no {MISMATCH_METRIC} series with {labels:?}")),
    }
}

fn message_in_log(ev: &Evidence) -> Outcome {
    let log = ev.block("volumed_log")?;
    let msg = conflict_message();
    let escaped = msg.replace('"', "\\\"");
    if log.contains(&msg) || log.contains(&escaped) {
        Ok(msg)
    } else {
        Err(format!("the log does not contain {msg:?}"))
    }
}

fn message_in_debug_state(ev: &Evidence) -> Outcome {
    let state = ev.json("b_debug_state")?;
    let msg = conflict_message();
    let errors = &state["pod_errors"][UID_B];
    let found = errors
        .as_array()
        .into_iter()
        .flatten()
        .any(|e| e.as_str().is_some_and(|s| s.contains(&msg)));
    if found {
        Ok(msg)
    } else {
        Err(format!(
            "pod_errors[{UID_B}] = {errors}, expected an entry containing {msg:?}"
        ))
    }
}

fn nothing_mounted_for_b(ev: &Evidence) -> Outcome {
    let table = ev.block("b_mountinfo")?;
    let prefix = format!("{ROOT}/pods/{UID_B}/");
    let b: Vec<String> = mounts(table)
        .into_iter()
        .filter(|m| m.mount_point.starts_with(&prefix))
        .map(|m| format!("{} {}", m.mount_point, m.super_options))
        .collect();
    if b.is_empty() {
        Ok("nothing mounted under pod B".into())
    } else {
        Err(format!("pod B has mounts: {b:?}"))
    }
}

fn dump_target(ev: &Evidence, pod: Option<&str>) -> Outcome {
    let dump = ev.json("restart_dump")?;
    mounted_in_dump(target(&dump["state"], pod)?, LABEL_A)
}

fn nothing_uncertain(ev: &Evidence) -> Outcome {
    let text = ev.block("restart_metrics")?;
    let name = "volumed_reconstruct_decisions_total";
    let uncertain = metric(text, name, &["result=\"uncertain\""]);
    let mounted = metric(text, name, &["result=\"mounted\""]);
    match (uncertain, mounted) {
        (Some(u), Some(m)) if u == 0.0 && m >= 1.0 => {
            Ok("no uncertain series above 0; targets decided mounted".into())
        }
        _ => Err(format!(
            "uncertain max {uncertain:?}, mounted max {mounted:?}:\n{}",
            text.lines()
                .filter(|l| l.starts_with(name) && !l.ends_with(" 0"))
                .collect::<Vec<_>>()
                .join("\n")
        )),
    }
}

fn a_target_gone(ev: &Evidence) -> Outcome {
    let table = ev.block("final_mountinfo")?;
    let a = pod_target(UID_A);
    if mounts(table).iter().any(|m| m.mount_point == a) {
        Err(format!("{a} is still mounted"))
    } else {
        Ok(format!("{a} not mounted"))
    }
}

fn sigterm_exit(ev: &Evidence) -> Outcome {
    ev.step("sigterm_exit")?;
    match ev.block("sigterm_status")?.trim() {
        "0" => Ok("exit status 0".into()),
        other => Err(format!("exit status {other}")),
    }
}

fn no_avc_denial(ev: &Evidence) -> Outcome {
    let dmesg = ev.block("dmesg")?;
    let denials: Vec<&str> = dmesg
        .lines()
        .filter(|l| l.contains("avc:  denied"))
        .collect();
    if denials.is_empty() {
        Ok("none in dmesg".into())
    } else {
        Err(denials.join("\n"))
    }
}

fn checks(ev: &Evidence, mode: &str) -> Vec<(String, Outcome)> {
    let hello = |uid: &str| format!("{}/hello.txt", pod_target(uid));
    vec![
        ("vm: SELinux is active", selinux_active(ev, mode)),
        (
            "vm: the kernel takes context= from util-linux mount (control)",
            control_mount(ev),
        ),
        ("pod A: volumed ready", ev.step("a_ready")),
        ("pod A: volume mounted", ev.step("a_mounted")),
        (
            "pod A: device target mounted with context= s0:c10,c20",
            mounted_with(ev, "a_mountinfo", &device_target(), LABEL_A),
        ),
        (
            "pod A: pod target mounted with context= s0:c10,c20",
            mounted_with(ev, "a_mountinfo", &pod_target(UID_A), LABEL_A),
        ),
        (
            "pod A: a file written there has the label (stat %C, ls -Z)",
            file_label(ev, "a_labels", &hello(UID_A), LABEL_A),
        ),
        (
            "pod B: mismatch counted within the wait",
            ev.step("b_refused"),
        ),
        (
            "pod B: mismatch metric (RWOP, local-volume) >= 1",
            mismatch_metric(ev),
        ),
        (
            "pod B: the kubelet's message in the daemon log",
            message_in_log(ev),
        ),
        (
            "pod B: the message in /debug/state pod_errors",
            message_in_debug_state(ev),
        ),
        (
            "pod B: no mount while pod A holds the volume",
            nothing_mounted_for_b(ev),
        ),
        (
            "restart: volumed ready after kill -9",
            ev.step("restart_ready"),
        ),
        (
            "restart: dump shows the device mounted with the label",
            dump_target(ev, None),
        ),
        (
            "restart: dump shows pod A mounted with the label",
            dump_target(ev, Some(UID_A)),
        ),
        (
            "restart: no reconstruction decision is uncertain",
            nothing_uncertain(ev),
        ),
        (
            "restart: pod A's mount kept its label",
            mounted_with(ev, "restart_mountinfo", &pod_target(UID_A), LABEL_A),
        ),
        (
            "pod A removed: pod B mounted with its label within the wait",
            ev.step("b_mounted"),
        ),
        (
            "pod A removed: device target remounted with context= s0:c30,c40",
            mounted_with(ev, "final_mountinfo", &device_target(), LABEL_B),
        ),
        (
            "pod A removed: pod B's target mounted with context= s0:c30,c40",
            mounted_with(ev, "final_mountinfo", &pod_target(UID_B), LABEL_B),
        ),
        ("pod A removed: pod A's target is gone", a_target_gone(ev)),
        (
            "pod A removed: the file now reports pod B's label",
            file_label(ev, "final_labels", &hello(UID_B), LABEL_B),
        ),
        ("vm: volumed exits 0 on SIGTERM", sigterm_exit(ev)),
        ("vm: no AVC denial", no_avc_denial(ev)),
        (
            "vm: the scenario ran to its end",
            if ev.done {
                Ok("@@DONE".into())
            } else {
                Err("no @@DONE line".into())
            },
        ),
    ]
    .into_iter()
    .map(|(name, outcome)| (name.to_owned(), outcome))
    .collect()
}

#[test]
fn selinux_labels_on_a_real_selinux_kernel() {
    if !support::require_root("boots a QEMU VM with a Debian SELinux kernel (apt-get, qemu)") {
        return;
    }
    let mode = std::env::var("VOLUMED_SELINUX_VM_MODE").unwrap_or_else(|_| "enforcing".into());
    let run = boot_vm("scenario.sh");
    let ev = Evidence::parse(&run.results);
    let results = checks(&ev, &mode);
    report(run, &mode, &results);
}

/// Prints every check's outcome; fails (with the logs) if any failed.
fn report(run: Run, mode: &str, results: &[(String, Outcome)]) {
    let mut report = format!(
        "selinux-vm ({mode}): image {:.1} s, VM {:.1} s ({}), scratch {}\n",
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
    let _ = writeln!(
        report,
        "selinux-vm checks: {} of {} passed",
        results.len() - failed,
        results.len()
    );
    if failed > 0 {
        // Keep the logs for a look afterwards, not the 100 MB of images.
        for big in ["disk.raw", "initrd.img", "payload.cpio"] {
            let _ = fs::remove_file(run.scratch.path().join(big));
        }
        let kept = run.scratch.keep();
        panic!(
            "{failed} SELinux VM check(s) failed\n{report}\
             --- console (ttyS0) ---\n{}\n--- scenario output (ttyS1) ---\n{}\n\
             (logs kept in {})",
            run.console,
            run.results,
            kept.display()
        );
    }
    eprint!("{report}");
}

// ---------------------------------------------------------------- crash points

/// The crash points `crash.sh` goes through, in order, with the targets the
/// dry run after each may call uncertain (as `fixtures/crash/` expects them
/// on an unlabelled host: only a format cut in the middle).
#[cfg(feature = "failpoints")]
const CRASH_POINTS: [(&str, &[&str]); 9] = [
    ("format_device.after_op", &["device"]),
    ("mount_device.after_intent", &[]),
    ("mount_device.after_op", &[]),
    ("setup.after_intent", &[]),
    ("setup.after_op", &[]),
    ("teardown.after_intent", &[]),
    ("teardown.after_op", &[]),
    ("unmount_device.after_intent", &[]),
    ("unmount_device.after_op", &[]),
];

/// The targets a dry run decided uncertain, as `device` / `pod`.
#[cfg(feature = "failpoints")]
fn uncertain_targets(doc: &Value) -> Vec<String> {
    doc["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["decision"] == "uncertain")
        .map(|t| t["target"].as_str().unwrap_or("?").to_owned())
        .collect()
}

#[cfg(feature = "failpoints")]
fn crash_checks(ev: &Evidence) -> Vec<(String, Outcome)> {
    let mut out = Vec::new();
    for (point, may_be_uncertain) in CRASH_POINTS {
        let mounts_side = !point.starts_with("teardown") && !point.starts_with("unmount_device");
        out.push((
            format!("{point}: volumed died there"),
            ev.step(&format!("{point}.died")).and_then(|d| {
                let log = ev.block(&format!("{point}.log"))?;
                if log.contains(&format!("crash point {point} reached")) {
                    Ok(d)
                } else {
                    Err(format!("the log does not name the crash point: {log:?}"))
                }
            }),
        ));
        out.push((
            format!("{point}: the dry run is uncertain only where a format was cut"),
            ev.json(&format!("{point}.dryrun")).and_then(|doc| {
                let got = uncertain_targets(&doc);
                if got.iter().all(|t| may_be_uncertain.contains(&t.as_str())) {
                    Ok(format!("uncertain: {got:?}"))
                } else {
                    Err(format!(
                        "uncertain {got:?}, allowed {may_be_uncertain:?}: {doc:#}"
                    ))
                }
            }),
        ));
        out.push((
            format!("{point}: restarted and converged"),
            ev.step(&format!("{point}.converged")),
        ));
        if mounts_side {
            out.push((
                format!("{point}: device and pod A mounted with pod A's label"),
                mounted_with(ev, &format!("{point}.mountinfo"), &device_target(), LABEL_A)
                    .and_then(|_| {
                        mounted_with(
                            ev,
                            &format!("{point}.mountinfo"),
                            &pod_target(UID_A),
                            LABEL_A,
                        )
                    }),
            ));
            out.push((
                format!("{point}: dump says mounted with the label"),
                ev.json(&format!("{point}.dump")).and_then(|d| {
                    mounted_in_dump(target(&d["state"], None)?, LABEL_A)?;
                    mounted_in_dump(target(&d["state"], Some(UID_A))?, LABEL_A)
                }),
            ));
        } else {
            out.push((
                format!("{point}: nothing of the volume left mounted"),
                ev.block(&format!("{point}.mountinfo")).and_then(|t| {
                    let left: Vec<String> = mounts(t)
                        .into_iter()
                        .filter(|m| {
                            m.mount_point == device_target() || m.mount_point == pod_target(UID_A)
                        })
                        .map(|m| m.mount_point)
                        .collect();
                    if left.is_empty() {
                        Ok("none".into())
                    } else {
                        Err(format!("still mounted: {left:?}"))
                    }
                }),
            ));
        }
    }
    out.push((
        "crash: the scenario ran to its end".into(),
        if ev.done {
            Ok("@@DONE".into())
        } else {
            Err("no @@DONE line".into())
        },
    ));
    out
}

/// Issue #6's crash fixtures with labelled volumes: every crash point of the
/// journaled operations, on a real SELinux kernel, with the volume labelled.
/// Needs the crash points compiled in: `.ci/run` runs it with
/// `--features failpoints`.
#[cfg(feature = "failpoints")]
#[test]
fn labelled_volumes_through_every_crash_point_on_a_real_selinux_kernel() {
    if !support::require_root("boots a QEMU VM with a Debian SELinux kernel (apt-get, qemu)") {
        return;
    }
    let mode = std::env::var("VOLUMED_SELINUX_VM_MODE").unwrap_or_else(|_| "enforcing".into());
    let run = boot_vm("crash.sh");
    let ev = Evidence::parse(&run.results);
    let results = crash_checks(&ev);
    report(run, &mode, &results);
}
