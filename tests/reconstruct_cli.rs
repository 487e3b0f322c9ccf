//! `volumed reconstruct --dry-run` through the real binary: the journal-off
//! baseline on a captured mount table, a journal that agrees with some
//! mounts and not others (and is unchanged afterwards), and a dry run while
//! a running daemon holds the journal. Nothing is mounted: the mount table
//! is the `kubelet-node.txt` fixture, the root dir `/var/lib/kubelet` is
//! only a prefix in it (absent on disk here), journals live in temp dirs.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use volumed::journal::{Body, Journal, JournalConfig, OpResult};
use volumed::model::{
    DevId, Layout, MountIdentity, Operation, PluginName, PodUid, SeLinuxContext, Steps, TargetKind,
    TargetParams, TargetRef, UniqueVolumeName,
};

const BIN: &str = env!("CARGO_BIN_EXE_volumed");
const BOOT: &str = "11111111-2222-3333-4444-555555555555";
const ROOT: &str = "/var/lib/kubelet";
const P1: &str = "6f1b2c3d-0a4e-4b5f-9c8d-1e2f3a4b5c6d";
const P2: &str = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d";

fn fixture() -> PathBuf {
    fixture_named("kubelet-node.txt")
}

fn fixture_named(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/mountinfo")
        .join(name)
}

fn boot_file(dir: &Path) -> PathBuf {
    let f = dir.join("boot_id");
    std::fs::write(&f, format!("{BOOT}\n")).unwrap();
    f
}

fn ok(out: &Output) -> &[u8] {
    assert!(
        out.status.success(),
        "status {:?}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    &out.stdout
}

/// `reconstruct --dry-run` against the fixture, as JSON.
fn dry_run(tmp: &Path, journal: Option<&Path>) -> Value {
    dry_run_on(&fixture(), tmp, journal)
}

/// `reconstruct --dry-run` against the mount table `table`, as JSON.
fn dry_run_on(table: &Path, tmp: &Path, journal: Option<&Path>) -> Value {
    let mut cmd = Command::new(BIN);
    cmd.args([
        "reconstruct",
        "--dry-run",
        "--root-dir",
        ROOT,
        "--format",
        "json",
    ])
    .arg("--mountinfo")
    .arg(table)
    .arg("--boot-id-file")
    .arg(boot_file(tmp));
    match journal {
        Some(dir) => cmd.args(["--journal", "on"]).arg("--journal-dir").arg(dir),
        None => cmd.args(["--journal", "off"]),
    };
    let out = cmd.output().unwrap();
    serde_json::from_slice(ok(&out)).unwrap()
}

fn dump(tmp: &Path, journal: &Path) -> Output {
    Command::new(BIN)
        .args(["dump", "--format", "json", "--journal-dir"])
        .arg(journal)
        .arg("--boot-id-file")
        .arg(boot_file(tmp))
        .output()
        .unwrap()
}

fn local(target: TargetRef) -> TargetParams {
    let layout = Layout::new(ROOT);
    let pod_path = target.pod().map(|uid| {
        layout
            .pod_target_path(uid, PluginName::LocalVolume, "pv-local-1")
            .into()
    });
    TargetParams::at(
        UniqueVolumeName::shared(PluginName::LocalVolume, "pv-local-1"),
        PluginName::LocalVolume,
        "pv-local-1".into(),
        target,
        TargetKind::Mount,
        None,
    )
    .with_pod_mount_path(pod_path)
    .with_device_path(Some("/dev/loop0".into()))
    .with_device_mount_path(Some(layout.local_device_path("pv-local-1").into()))
    .with_fs_type(Some("ext4".into()))
}

fn ext4(major: u32, read_only: bool) -> MountIdentity {
    MountIdentity {
        dev: DevId { major, minor: 0 },
        root: "/".into(),
        fs_type: "ext4".into(),
        read_only,
        selinux: None,
    }
}

/// The local PV's device target and pod `6f1b…` as the fixture shows them
/// (7:0, rw); pod `9a8b…` recorded on another device (8:0), so the bind the
/// fixture shows there is not ours.
fn write_journal(dir: &Path) {
    let (j, _) = Journal::open(&JournalConfig::new(dir, "node-a", BOOT)).unwrap();
    let uid = |s: &str| TargetRef::Pod(PodUid::new(s).unwrap());
    let targets = [
        (Operation::MountDevice, TargetRef::Device, ext4(7, false)),
        (Operation::SetUp, uid(P1), ext4(7, false)),
        (Operation::SetUp, uid(P2), ext4(8, true)),
    ];
    for (op, target, seen) in targets {
        let intent_seq = j
            .append_record(Body::Intent {
                op,
                steps: Steps::Single,
                target: local(target).into(),
            })
            .unwrap();
        j.append_record(Body::Outcome {
            intent_seq,
            op,
            result: OpResult::Success,
            observed: Some(seen),
        })
        .unwrap();
    }
    j.close().unwrap();
}

fn row<'a>(doc: &'a Value, target: &str, pod: Option<&str>, volume: &str) -> &'a Value {
    doc["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["target"] == target && t["pod_uid"].as_str() == pod && t["volume"] == volume)
        .unwrap_or_else(|| panic!("no row {target} {pod:?} {volume} in {doc:#}"))
}

const LOCAL: &str = "kubernetes.io/local-volume/pv-local-1";

/// The dry run's verdict on the journal written by [`write_journal`].
fn assert_journal_verdict(doc: &Value) {
    assert_eq!(doc["journal"], "on");
    for (target, pod) in [("device", None), ("pod", Some(P1))] {
        let r = row(doc, target, pod, LOCAL);
        assert_eq!(r["decision"], "mounted", "{r:#}");
        assert_eq!(r["reason"], "mounted_matches", "{r:#}");
        assert_eq!(r["journal_says"], "mounted", "{r:#}");
        assert_eq!(r["host_says"], "matches", "{r:#}");
    }
    let r = row(doc, "pod", Some(P2), LOCAL);
    assert_eq!(r["decision"], "uncertain", "{r:#}");
    assert_eq!(r["reason"], "mounted_differs", "{r:#}");
    assert_eq!(r["host_says"], "differs", "{r:#}");
    assert_eq!(r["observed"], "7:0 / ext4 ro", "{r:#}");
}

#[test]
fn journal_off_every_found_target_is_uncertain_and_device_targets_are_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let doc = dry_run(tmp.path(), None);
    assert_eq!(doc["journal"], "off");
    assert_eq!(doc["boot_id"], BOOT);
    let targets = doc["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 4, "{doc:#}");
    for t in targets {
        assert_eq!(t["decision"], "uncertain", "{t:#}");
        assert_eq!(t["reason"], "rebuilt_from_host", "{t:#}");
        assert_eq!(t["journal_says"], "off", "{t:#}");
        assert_eq!(t["boot"], "same", "{t:#}");
    }
    // Both device targets under plugins/: the local one decided, the CSI
    // globalmount failed (no vol_data.json on this machine), never dropped.
    let device = row(&doc, "device", None, LOCAL);
    assert!(
        device["path"]
            .as_str()
            .unwrap()
            .starts_with("/var/lib/kubelet/plugins/kubernetes.io/local-volume/mounts/"),
        "{device:#}"
    );
    let failed = doc["failed"].as_array().unwrap();
    assert!(
        failed.iter().any(|f| f["target"] == "device"
            && f["plugin"] == "kubernetes.io/csi"
            && f["path"].as_str().unwrap().ends_with("/globalmount")),
        "{doc:#}"
    );
    assert!(
        failed
            .iter()
            .all(|f| f["reason"] == "rebuild_failed" && f["host_says"] == "mounted")
    );
    assert_eq!(doc["unmounted_outside"], Value::Array(vec![]));
}

#[test]
fn journal_on_matches_and_mismatches_and_leaves_the_journal_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let jdir = tmp.path().join("j").join("journal");
    write_journal(&jdir);
    let before: Value = serde_json::from_slice(ok(&dump(tmp.path(), &jdir))).unwrap();

    let doc = dry_run(tmp.path(), Some(&jdir));
    assert_journal_verdict(&doc);
    assert_eq!(doc["journal_note"], Value::Null, "{doc:#}");
    // The emptyDir the journal never heard of: rebuilt from the host.
    let empty_dir = format!("kubernetes.io/empty-dir/{P1}-cache");
    assert_eq!(
        row(&doc, "pod", Some(P1), &empty_dir)["reason"],
        "rebuilt_from_host"
    );

    let after: Value = serde_json::from_slice(ok(&dump(tmp.path(), &jdir))).unwrap();
    assert_eq!(before["records"], after["records"]);
    assert_eq!(before["state"], after["state"]);
    assert_eq!(after["records"].as_array().unwrap().len(), 6);
}

#[test]
fn dry_run_without_the_flag_says_where_reconstruction_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["reconstruct", "--journal", "off", "--mountinfo"])
        .arg(fixture())
        .arg("--boot-id-file")
        .arg(boot_file(tmp.path()))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("volumed run") && err.contains("--dry-run"),
        "{err}"
    );
}

/// Kills the daemon if the test fails before it is stopped.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn dry_run_reads_a_copy_while_the_daemon_holds_the_journal() {
    if !support::require_root("runs the daemon, which mounts its root dir shared") {
        return;
    }
    // The daemon bind-mounts its root shared: keep that off the host.
    support::in_private_mount_ns(dry_run_reads_a_copy_while_the_daemon_holds_the_journal_body);
}

fn dry_run_reads_a_copy_while_the_daemon_holds_the_journal_body() {
    let tmp = tempfile::tempdir().unwrap();
    let jdir = tmp.path().join("j").join("journal");
    write_journal(&jdir);
    let boot = boot_file(tmp.path());
    // An API server that never answers (nothing listens on port 1): the
    // sources never list, so the daemon keeps the targets it reconstructed
    // as not mounted (it forgets those no pod wants only once every source
    // has listed, docs/merge-table.md) and the copy below must show them.
    let kubeconfig = tmp.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'http://127.0.0.1:1'}\nusers:\n- name: u\n  user: {}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n",
    )
    .unwrap();
    let daemon = Command::new(BIN)
        .args(["run", "--node-name", "node-a", "--listen", "127.0.0.1:0"])
        .arg("--root-dir")
        .arg(tmp.path().join("root"))
        .arg("--journal-dir")
        .arg(&jdir)
        .arg("--boot-id-file")
        .arg(&boot)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .env("VOLUMED_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut daemon = KillOnDrop(daemon);

    // Wait for the daemon to say it runs (it has opened the journal) before
    // touching the journal: a `dump` racing the daemon's open would hold
    // sled's lock for an instant and make the daemon refuse to start.
    let stderr = daemon.0.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("volumed running") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(30))
        .expect("the daemon never said it runs");
    // The daemon said it runs: it holds sled's lock now.
    let locked = || {
        matches!(
            volumed::journal::Journal::open(&volumed::journal::JournalConfig::inspect(&jdir, BOOT)),
            Err(e) if e.category() == volumed::journal::Category::Busy
        )
    };
    assert!(locked(), "the daemon holds the journal");

    let doc = dry_run(tmp.path(), Some(&jdir));
    // The daemon reconstructed against this (private, empty) host first and
    // journaled the fixture's targets as unmounted outside volumed; the copy
    // shows exactly that: its records, not an empty journal.
    assert_eq!(doc["journal"], "on", "{doc:#}");
    let device = row(
        &doc,
        "device",
        None,
        "kubernetes.io/local-volume/pv-local-1",
    );
    assert_eq!(device["journal_says"], "unmounted", "{doc:#}");
    let note = doc["journal_note"].as_str().unwrap_or_default();
    assert!(note.contains("read from a copy"), "{doc:#}");
    // The daemon still holds its journal: the copy never took its lock.
    assert!(daemon.0.try_wait().unwrap().is_none());
    assert!(locked(), "the daemon still holds its journal");
    drop(daemon);
}

/// The local PV `pv` on loop device `minor` as volumed journals it on an
/// SELinux host: `label` on both targets (`None`: mounted without one).
fn labelled(pv: &str, minor: u32, target: TargetRef, label: Option<&str>) -> TargetParams {
    let layout = Layout::new(ROOT);
    let label = label.map(|l| SeLinuxContext::parse(l).unwrap());
    let pod_path = target.pod().map(|uid| {
        layout
            .pod_target_path(uid, PluginName::LocalVolume, pv)
            .into()
    });
    TargetParams::at(
        UniqueVolumeName::shared(PluginName::LocalVolume, pv),
        PluginName::LocalVolume,
        pv.into(),
        target,
        TargetKind::Mount,
        None,
    )
    .with_pod_mount_path(pod_path)
    .with_device_path(Some(format!("/dev/loop{minor}").into()))
    .with_device_mount_path(Some(layout.local_device_path(pv).into()))
    .with_selinux(label)
    .with_fs_type(Some("ext4".into()))
}

/// Issue #6: on an SELinux host's mount table (`context=` quoted and not,
/// binds of a labelled filesystem), the journal's labels are checked
/// against the super block's: agreeing ones (also written `c40,c30`) are
/// mounted, a different label or one the journal did not expect makes the
/// target uncertain (`selinux_label_differs`); with the journal off every
/// target is uncertain, as the kubelet, which never reads labels from the
/// mount table, would have it.
#[test]
fn selinux_labels_in_the_mount_table_are_checked_against_the_journal() {
    let tmp = tempfile::tempdir().unwrap();
    let jdir = tmp.path().join("journal");
    let l = |cats: &str| format!("system_u:object_r:container_file_t:s0:{cats}");
    let (c10, c40, c1, c5) = (l("c10,c20"), l("c40,c30"), l("c1,c2"), l("c5,c6"));
    let pod = |s: &str| TargetRef::Pod(PodUid::new(s).unwrap());
    let (j, _) = Journal::open(&JournalConfig::new(&jdir, "node-a", BOOT)).unwrap();
    let ext4_at = |minor: u32, ro: bool, label: Option<&str>| MountIdentity {
        dev: DevId { major: 7, minor },
        root: "/".into(),
        fs_type: "ext4".into(),
        read_only: ro,
        selinux: label.map(|l| SeLinuxContext::parse(l).unwrap()),
    };
    let records = [
        // agree, quoted label with a comma
        (
            Operation::MountDevice,
            labelled("pv-sel-1", 0, TargetRef::Device, Some(&c10)),
            Some(ext4_at(0, false, Some(&c10))),
        ),
        (
            Operation::SetUp,
            labelled("pv-sel-1", 0, pod(P1), Some(&c10)),
            Some(ext4_at(0, false, Some(&c10))),
        ),
        // agree once categories are normalised; no observed identity: params compared
        (
            Operation::MountDevice,
            labelled("pv-sel-2", 1, TargetRef::Device, Some(&c40)),
            None,
        ),
        (
            Operation::SetUp,
            labelled("pv-sel-2", 1, pod(P2), Some(&c40)),
            None,
        ),
        // disagree: the journal's label is c1,c2, the host shows c5,c6
        (
            Operation::MountDevice,
            labelled("pv-sel-3", 2, TargetRef::Device, Some(&c1)),
            Some(ext4_at(2, false, Some(&c1))),
        ),
        // disagree: journaled as mounted without a context
        (
            Operation::SetUp,
            labelled("pv-sel-3", 2, pod(P2), None),
            Some(ext4_at(2, true, None)),
        ),
    ];
    for (op, target, observed) in records {
        let intent_seq = j
            .append_record(Body::Intent {
                op,
                steps: Steps::Single,
                target: target.into(),
            })
            .unwrap();
        j.append_record(Body::Outcome {
            intent_seq,
            op,
            result: OpResult::Success,
            observed,
        })
        .unwrap();
    }
    j.close().unwrap();

    let table = fixture_named("selinux-kubelet-node.txt");
    let doc = dry_run_on(&table, tmp.path(), Some(&jdir));
    let vol = |pv: &str| format!("kubernetes.io/local-volume/{pv}");
    let rows = [
        ("device", None, "pv-sel-1", "mounted", "mounted_matches"),
        ("pod", Some(P1), "pv-sel-1", "mounted", "mounted_matches"),
        ("device", None, "pv-sel-2", "mounted", "mounted_matches"),
        ("pod", Some(P2), "pv-sel-2", "mounted", "mounted_matches"),
        (
            "device",
            None,
            "pv-sel-3",
            "uncertain",
            "selinux_label_differs",
        ),
        (
            "pod",
            Some(P2),
            "pv-sel-3",
            "uncertain",
            "selinux_label_differs",
        ),
    ];
    for (target, pod, pv, decision, reason) in rows {
        let r = row(&doc, target, pod, &vol(pv));
        assert_eq!(r["decision"], decision, "{target} {pv}: {r:#}");
        assert_eq!(r["reason"], reason, "{target} {pv}: {r:#}");
    }
    let differs = row(&doc, "device", None, &vol("pv-sel-3"));
    assert!(
        differs["observed"].as_str().unwrap().contains(&c5),
        "the report names the label the host shows: {differs:#}"
    );
    // The tmpfs emptyDir the journal never heard of: rebuilt from the host.
    let mem = format!("kubernetes.io/empty-dir/{P1}-mem");
    assert_eq!(row(&doc, "pod", Some(P1), &mem)["decision"], "uncertain");

    // `dump` shows the labels the journal recorded, normalised.
    let dumped: Value = serde_json::from_slice(ok(&dump(tmp.path(), &jdir))).unwrap();
    let v2 = dumped["state"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["volume"] == vol("pv-sel-2"))
        .unwrap();
    assert_eq!(v2["device"]["selinux_context"], l("c30,c40"), "{v2:#}");

    let off = dry_run_on(&table, tmp.path(), None);
    let targets = off["targets"].as_array().unwrap();
    assert!(!targets.is_empty());
    assert!(
        targets.iter().all(|t| t["decision"] == "uncertain"),
        "{off:#}"
    );
}
