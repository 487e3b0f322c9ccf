//! SELinux end to end on a real SELinux kernel: volumed inside a QEMU VM.
//!
//! This machine's kernel cannot turn SELinux on, so the test boots a Debian
//! kernel under QEMU with `security=selinux` (software emulation, `-accel
//! tcg -cpu max`: `/dev/kvm` here is the `kvm_pvm` nested-virtualisation
//! module, under which a stock Debian kernel hangs at boot)
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
//!   second static build is needed), the scenario, and for the CSI scenario
//!   the test CSI driver (`CARGO_BIN_EXE_volumed-testdriver`) the same way.
//! - The VM's `/init` loads the policy (enforcing by default;
//!   `VOLUMED_SELINUX_VM_MODE=permissive` for the other mode) and runs one
//!   scenario per boot; the first boot's, `scenario.sh`: pod A with level
//!   `s0:c10,c20`, then pod B with `s0:c30,c40` on the same claim, `kill -9`
//!   and restart of volumed, pod A removed. A scenario only drives and
//!   gathers evidence — mount tables,
//!   file labels, `/metrics`, `/debug/state`, `dump`, the daemon's log —
//!   written as `@@BEGIN name … @@END name` blocks and `@@STEP name ok|timeout`
//!   lines to the second serial port; every assertion is made here, and all
//!   of them are reported before the test fails, with the console log.
//!
//! - A second boot runs `csi.sh`: a CSIDriver with `seLinuxMount: true`
//!   and `attachRequired: false`, `volumed-testdriver` running in the VM
//!   (it mounts a tmpfs at NodeStage with the mount flags it gets, binds it
//!   at NodePublish), a ReadWriteOncePod CSI PV and pod A with level
//!   `s0:c10,c20`. Checked: NodeStage's mount flags carry `context="…"` in
//!   the driver's call log (NodePublish's none), the staged tmpfs and the
//!   pod's bind show it in the mount table, a file in the pod's target
//!   reads the label, `/debug/state` and `dump` show it on both targets;
//!   after `kill -9` and a restart no NodeStage or NodePublish is re-issued
//!   (the call log's counts) and `/debug/state` has the label again; pod B
//!   with `s0:c30,c40` on the same claim gets the conflict error and no
//!   mount; both pods gone, one NodeUnpublish and one NodeUnstage leave
//!   nothing mounted.
//! - With the cargo feature `failpoints` (`.ci/run` runs it so), a third
//!   boot runs `crash.sh`: labelled volumes through every crash point of the
//!   four journaled operations and the format step — volumed dies by SIGKILL
//!   there, the dry run may call only a cut format uncertain, and the restart
//!   converges with the label on the device and pod targets (or nothing
//!   mounted after a teardown point). Every scenario runs after
//!   `common.sh`, and one VM runs at a time.
//!
//! Building and booting the VM and parsing the evidence live in
//! `tests/support/vm.rs` (shared with `tests/power_loss.rs`).
//!
//! Needs root (for `apt-get`) and says it was skipped otherwise. Nothing is
//! mounted on the host; each run has its own scratch dir, so it runs twice
//! in a row or beside other tests. One boot takes about 35 s to a minute
//! of emulation.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use serde_json::Value;

use support::vm::{self, Evidence, Outcome, boot_vm};

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

/// The kubelet's message for the refused pod (`pv`: the PV's name).
fn conflict_message(pv: &str) -> String {
    format!("conflicting SELinux labels of volume {pv}: \"{LABEL_A}\" and \"{LABEL_B}\"")
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
    mounted_from(ev, block, path, "/dev/vda", label)
}

/// `path` is a mount of `source` whose super options carry `context="label"`.
fn mounted_from(
    ev: &Evidence,
    block: &str,
    path: &str,
    source: &str,
    label: &str,
) -> Result<String, String> {
    let table = ev.block(block)?;
    let all = mounts(table);
    let found: Vec<&Mount> = all.iter().filter(|m| m.mount_point == path).collect();
    let want = format!("context=\"{label}\"");
    match found.as_slice() {
        [] => Err(format!("{path} is not mounted")),
        [m] if m.source == source && m.super_options.contains(&want) => Ok(m.super_options.clone()),
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

/// The target of the local PV in a `dump`/`/debug/state` state document:
/// the device (`pod` None) or a pod's.
fn target<'a>(state: &'a Value, pod: Option<&str>) -> Result<&'a Value, String> {
    volume_target(state, VOLUME, pod)
}

/// The target of `volume` in a state document: the device (`pod` None) or
/// a pod's.
fn volume_target<'a>(
    state: &'a Value,
    volume: &str,
    pod: Option<&str>,
) -> Result<&'a Value, String> {
    let vol = state["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["volume"] == volume)
        .ok_or_else(|| format!("no volume {volume} in {state}"))?;
    match pod {
        None => Ok(&vol["device"]),
        Some(uid) => vol["pods"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["pod_uid"] == uid)
            .ok_or_else(|| format!("no pod {uid} on {volume}")),
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

fn mismatch_metric(ev: &Evidence, plugin: &str) -> Outcome {
    let text = ev.block("b_metrics")?;
    let plugin = format!("volume_plugin=\"{plugin}\"");
    let labels = ["access_mode=\"RWOP\"", plugin.as_str()];
    match metric(text, MISMATCH_METRIC, &labels) {
        Some(v) if v >= 1.0 => Ok(format!("{MISMATCH_METRIC} = {v}")),
        Some(v) => Err(format!("{MISMATCH_METRIC} = {v}")),
        None => Err(format!("no {MISMATCH_METRIC} series with {labels:?}")),
    }
}

fn message_in_log(ev: &Evidence, pv: &str) -> Outcome {
    let log = ev.block("volumed_log")?;
    let msg = conflict_message(pv);
    let escaped = msg.replace('"', "\\\"");
    if log.contains(&msg) || log.contains(&escaped) {
        Ok(msg)
    } else {
        Err(format!("the log does not contain {msg:?}"))
    }
}

fn message_in_debug_state(ev: &Evidence, pv: &str) -> Outcome {
    let state = ev.json("b_debug_state")?;
    let msg = conflict_message(pv);
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

fn nothing_uncertain(ev: &Evidence, block: &str) -> Outcome {
    let text = ev.block(block)?;
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
            mismatch_metric(ev, "kubernetes.io/local-volume"),
        ),
        (
            "pod B: the kubelet's message in the daemon log",
            message_in_log(ev, PV),
        ),
        (
            "pod B: the message in /debug/state pod_errors",
            message_in_debug_state(ev, PV),
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
            nothing_uncertain(ev, "restart_metrics"),
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
    if !support::vm_wanted("boots a QEMU VM with a Debian SELinux kernel (apt-get, qemu)") {
        return;
    }
    let mode = std::env::var("VOLUMED_SELINUX_VM_MODE").unwrap_or_else(|_| "enforcing".into());
    let run = boot_vm("scenario.sh", false);
    let ev = Evidence::parse(&run.results);
    let results = checks(&ev, &mode);
    report(run, &mode, &results);
}

/// Every check's outcome, as `support::vm::report` prints it for this VM.
fn report(run: vm::Run, mode: &str, results: &[(String, Outcome)]) {
    // the logs are kept on a failure, not the images
    let images = ["disk.raw", "initrd.img", "payload.cpio"];
    vm::report(
        run,
        &format!("selinux-vm ({mode})"),
        "SELinux VM",
        &images,
        results,
    );
}

// ---------------------------------------------------------------- CSI

const CSI_DRIVER: &str = "sel.csi.volumed.dev";
const CSI_PV: &str = "pv-csi-sel";
const CSI_VOLUME: &str = "kubernetes.io/csi/sel.csi.volumed.dev^vol-sel-1";
/// `sha256sum` of the volume handle `vol-sel-1`, computed outside the project.
const CSI_HANDLE_SHA256: &str = "883fd955fd733f9069b4e324081ef100408ab1be0dc7ac2d512868bcb3486ab8";

fn csi_staging() -> String {
    format!("{ROOT}/plugins/kubernetes.io/csi/{CSI_DRIVER}/{CSI_HANDLE_SHA256}/globalmount")
}

fn csi_target(uid: &str) -> String {
    format!("{ROOT}/pods/{uid}/volumes/kubernetes.io~csi/{CSI_PV}/mount")
}

/// The driver's call log as it was when `block` was taken.
fn rpc_calls(ev: &Evidence, block: &str) -> Result<Vec<Value>, String> {
    ev.block(block)?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(|e| format!("{block}: {l:?} is not JSON: {e}")))
        .collect()
}

/// The calls of `block` per volume RPC, in the order stage, publish,
/// unpublish, unstage.
fn rpc_counts(ev: &Evidence, block: &str) -> Result<[usize; 4], String> {
    let calls = rpc_calls(ev, block)?;
    let count = |m: &str| calls.iter().filter(|c| c["method"] == m).count();
    Ok([
        count("NodeStageVolume"),
        count("NodePublishVolume"),
        count("NodeUnpublishVolume"),
        count("NodeUnstageVolume"),
    ])
}

/// The volume RPCs in `block` are exactly `want` (stage, publish,
/// unpublish, unstage).
fn rpcs_are(ev: &Evidence, block: &str, want: [usize; 4]) -> Outcome {
    let got = rpc_counts(ev, block)?;
    let show = |n: [usize; 4]| {
        format!(
            "NodeStage {}, NodePublish {}, NodeUnpublish {}, NodeUnstage {}",
            n[0], n[1], n[2], n[3]
        )
    };
    if got == want {
        Ok(show(got))
    } else {
        Err(format!("{}, expected {}", show(got), show(want)))
    }
}

/// NodeStage's mount flags carry `context="LABEL_A"`; NodePublish, a bind
/// of the staged superblock, carries none.
fn label_in_stage_flags(ev: &Evidence) -> Outcome {
    let calls = rpc_calls(ev, "a_calls")?;
    let flags = |m: &str| -> Result<Vec<String>, String> {
        let c = calls
            .iter()
            .find(|c| c["method"] == m)
            .ok_or_else(|| format!("no {m} in the call log"))?;
        Ok(c["mount_flags"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f.as_str().map(str::to_owned))
            .collect())
    };
    let stage = flags("NodeStageVolume")?;
    let publish = flags("NodePublishVolume")?;
    let want = format!("context=\"{LABEL_A}\"");
    if !stage.contains(&want) {
        return Err(format!(
            "NodeStageVolume mount_flags {stage:?}, expected {want}"
        ));
    }
    if publish.iter().any(|f| f.starts_with("context=")) {
        return Err(format!(
            "NodePublishVolume mount_flags {publish:?} carry a context"
        ));
    }
    Ok(format!(
        "NodeStageVolume {stage:?}, NodePublishVolume {publish:?}"
    ))
}

/// The device and pod A's targets in the state document of `block` (a
/// `/debug/state` body, or `dump`'s whole document when `dump`).
fn csi_state_labelled(ev: &Evidence, block: &str, dump: bool) -> Outcome {
    let doc = ev.json(block)?;
    let state = if dump { &doc["state"] } else { &doc };
    let device = mounted_in_dump(volume_target(state, CSI_VOLUME, None)?, LABEL_A)?;
    let pod = mounted_in_dump(volume_target(state, CSI_VOLUME, Some(UID_A))?, LABEL_A)?;
    Ok(format!("device: {device}; pod A: {pod}"))
}

/// No mount under the kubelet's plugin and pod dirs.
fn csi_nothing_mounted(ev: &Evidence) -> Outcome {
    let table = ev.block("final_mountinfo")?;
    let left: Vec<String> = mounts(table)
        .into_iter()
        .filter(|m| {
            m.mount_point.starts_with(&format!("{ROOT}/plugins/"))
                || m.mount_point.starts_with(&format!("{ROOT}/pods/"))
        })
        .map(|m| m.mount_point)
        .collect();
    if left.is_empty() {
        Ok("nothing under plugins/ or pods/".into())
    } else {
        Err(format!("still mounted: {left:?}"))
    }
}

/// The final `/debug/state` has no mounted target of the CSI volume.
fn csi_state_empty(ev: &Evidence) -> Outcome {
    let state = ev.json("final_debug_state")?;
    let Ok(device) = volume_target(&state, CSI_VOLUME, None) else {
        return Ok(format!("{CSI_VOLUME} not in the state"));
    };
    let pods = state["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["volume"] == CSI_VOLUME)
        .flat_map(|v| v["pods"].as_array().cloned().unwrap_or_default())
        .filter(|p| p["state"] == "mounted")
        .count();
    if device["state"] != "mounted" && pods == 0 {
        Ok(format!("device {}, no pod mounted", device["state"]))
    } else {
        Err(format!("still mounted in the state: {state}"))
    }
}

/// `ls -d` found neither the staging dir nor pod A's target.
fn csi_dirs_gone(ev: &Evidence) -> Outcome {
    let text = ev.block("final_dirs")?;
    let gone = |p: &str| {
        text.lines()
            .any(|l| l.contains(p) && l.contains("No such file or directory"))
    };
    if gone(&csi_staging()) && gone(&csi_target(UID_A)) {
        Ok("globalmount and pod A's mount dir removed".into())
    } else {
        Err(format!("ls -d says:\n{text}"))
    }
}

fn csi_checks(ev: &Evidence, mode: &str) -> Vec<(String, Outcome)> {
    let staging = csi_staging();
    let target_a = csi_target(UID_A);
    let hello = format!("{target_a}/hello.txt");
    let plugin = format!("kubernetes.io/csi/{CSI_DRIVER}");
    vec![
        ("vm: SELinux is active", selinux_active(ev, mode)),
        ("csi: the test driver listens", ev.step("driver_ready")),
        ("pod A: volumed ready", ev.step("a_ready")),
        ("pod A: volume published", ev.step("a_mounted")),
        (
            "pod A: NodeStage's mount flags carry the label, NodePublish's none",
            label_in_stage_flags(ev),
        ),
        (
            "pod A: one NodeStage, one NodePublish",
            rpcs_are(ev, "a_calls", [1, 1, 0, 0]),
        ),
        (
            "pod A: the staged tmpfs has context= s0:c10,c20 in the mount table",
            mounted_from(ev, "a_mountinfo", &staging, "tmpfs", LABEL_A),
        ),
        (
            "pod A: the published bind shows the same context=",
            mounted_from(ev, "a_mountinfo", &target_a, "tmpfs", LABEL_A),
        ),
        (
            "pod A: a file written in the pod's target has the label (stat %C, ls -Z)",
            file_label(ev, "a_labels", &hello, LABEL_A),
        ),
        (
            "pod A: /debug/state shows the label on the device and pod targets",
            csi_state_labelled(ev, "a_debug_state", false),
        ),
        (
            "pod A: dump shows the label on the device and pod targets",
            csi_state_labelled(ev, "a_dump", true),
        ),
        (
            "restart: volumed ready after kill -9",
            ev.step("restart_ready"),
        ),
        (
            "restart: no NodeStage or NodePublish re-issued",
            rpcs_are(ev, "restart_calls", [1, 1, 0, 0]),
        ),
        (
            "restart: the label reconstructed in /debug/state",
            csi_state_labelled(ev, "restart_debug_state", false),
        ),
        (
            "restart: no reconstruction decision is uncertain",
            nothing_uncertain(ev, "restart_metrics"),
        ),
        (
            "restart: the staged tmpfs kept its label",
            mounted_from(ev, "restart_mountinfo", &staging, "tmpfs", LABEL_A),
        ),
        (
            "pod B: mismatch counted within the wait",
            ev.step("b_refused"),
        ),
        (
            "pod B: mismatch metric (RWOP, the CSI driver) >= 1",
            mismatch_metric(ev, &plugin),
        ),
        (
            "pod B: the kubelet's message in /debug/state pod_errors",
            message_in_debug_state(ev, CSI_PV),
        ),
        (
            "pod B: the kubelet's message in the daemon log",
            message_in_log(ev, CSI_PV),
        ),
        (
            "pod B: no mount while pod A holds the volume",
            nothing_mounted_for_b(ev),
        ),
        (
            "pod B: no RPC for it",
            rpc_calls(ev, "final_calls").and_then(|calls| {
                let for_b: Vec<&Value> = calls
                    .iter()
                    .filter(|c| c.to_string().contains(UID_B))
                    .collect();
                if for_b.is_empty() {
                    Ok("no call names pod B".into())
                } else {
                    Err(format!("calls for pod B: {for_b:?}"))
                }
            }),
        ),
        (
            "pods gone: nothing mounted within the wait",
            ev.step("gone"),
        ),
        (
            "pods gone: one NodeUnpublish, one NodeUnstage",
            rpcs_are(ev, "final_calls", [1, 1, 1, 1]),
        ),
        (
            "pods gone: no mount left under plugins/ or pods/",
            csi_nothing_mounted(ev),
        ),
        (
            "pods gone: /debug/state has no mounted target",
            csi_state_empty(ev),
        ),
        ("pods gone: the target dirs removed", csi_dirs_gone(ev)),
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

/// Issue #14 item 8: a CSIDriver with `seLinuxMount: true` and a driver
/// that really mounts, on a real SELinux kernel.
#[test]
fn a_labelled_csi_volume_on_a_real_selinux_kernel() {
    if !support::vm_wanted("boots a QEMU VM with a Debian SELinux kernel (apt-get, qemu)") {
        return;
    }
    let mode = std::env::var("VOLUMED_SELINUX_VM_MODE").unwrap_or_else(|_| "enforcing".into());
    let run = boot_vm("csi.sh", true);
    let ev = Evidence::parse(&run.results);
    let results = csi_checks(&ev, &mode);
    report(run, &mode, &results);
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
    if !support::vm_wanted("boots a QEMU VM with a Debian SELinux kernel (apt-get, qemu)") {
        return;
    }
    let mode = std::env::var("VOLUMED_SELINUX_VM_MODE").unwrap_or_else(|_| "enforcing".into());
    let run = boot_vm("crash.sh", false);
    let ev = Evidence::parse(&run.results);
    let results = crash_checks(&ev);
    report(run, &mode, &results);
}
