//! The binary through its contract: `dump` on a journal written by the
//! library, `dump` while `run` holds the journal, and `run`'s flags.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use volumed::journal::{Body, Journal, JournalConfig, OpResult};
use volumed::model::{
    Operation, PluginName, PodUid, Steps, TargetKind, TargetParams, TargetRef, UniqueVolumeName,
};

const BIN: &str = env!("CARGO_BIN_EXE_volumed");
const BOOT: &str = "11111111-2222-3333-4444-555555555555";

fn boot_file(dir: &Path) -> std::path::PathBuf {
    let f = dir.join("boot_id");
    std::fs::write(&f, format!("{BOOT}\n")).unwrap();
    f
}

fn params(volume: &str, target: TargetRef) -> TargetParams {
    TargetParams {
        volume: UniqueVolumeName::from_raw(volume),
        plugin: PluginName::LocalVolume,
        spec_name: "pv1".into(),
        kind: TargetKind::Mount,
        pod_mount_path: match &target {
            TargetRef::Pod(u) => {
                Some(format!("/r/pods/{u}/volumes/kubernetes.io~local-volume/pv1").into())
            }
            TargetRef::Device => None,
        },
        target,
        device_path: Some("/dev/loop7".into()),
        device_mount_path: Some("/r/plugins/kubernetes.io/local-volume/mounts/pv1".into()),
        selinux: None,
        mount_options: vec!["noatime".into()],
        fs_type: Some("ext4".into()),
    }
}

fn write_journal(dir: &Path) {
    let (j, _) = Journal::open(&JournalConfig::new(dir, "node-a", BOOT)).unwrap();
    let vol = "kubernetes.io/local-volume/pv1";
    let i = j
        .append(Body::Intent {
            op: Operation::MountDevice,
            steps: Steps::Single,
            target: params(vol, TargetRef::Device),
        })
        .unwrap();
    j.append(Body::Outcome {
        intent_seq: i,
        op: Operation::MountDevice,
        result: OpResult::Success,
        observed: None,
    })
    .unwrap();
    let pod = TargetRef::Pod(PodUid::new("pod-1").unwrap());
    j.append(Body::Intent {
        op: Operation::SetUp,
        steps: Steps::Single,
        target: params(vol, pod),
    })
    .unwrap();
    j.append(Body::Intent {
        op: Operation::SetUp,
        steps: Steps::Single,
        target: params(
            "kubernetes.io/local-volume/pv2",
            TargetRef::Pod(PodUid::new("pod-2").unwrap()),
        ),
    })
    .unwrap();
}

fn dump(journal: &Path, extra: &[&str]) -> std::process::Output {
    // The boot id file sits beside the test's temp dir, never inside a dir
    // the daemon creates.
    let boot = boot_file(journal.parent().unwrap().parent().unwrap());
    Command::new(BIN)
        .arg("dump")
        .arg("--journal-dir")
        .arg(journal)
        .arg("--boot-id-file")
        .arg(&boot)
        .args(extra)
        .output()
        .unwrap()
}

/// Kills the daemon if the test fails before stopping it.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn dump_json_shows_records_and_implied_state() {
    let tmp = tempfile::tempdir().unwrap();
    let jdir = tmp.path().join("j").join("journal");
    write_journal(&jdir);
    let out = dump(&jdir, &["--format", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["boot_id"], BOOT);
    assert_eq!(v["records"].as_array().unwrap().len(), 4);
    let vols = v["state"]["volumes"].as_array().unwrap();
    assert_eq!(vols.len(), 2);
    assert_eq!(vols[0]["volume"], "kubernetes.io/local-volume/pv1");
    assert_eq!(vols[0]["device"]["state"], "mounted");
    assert_eq!(vols[0]["device"]["device_path"], "/dev/loop7");
    assert_eq!(vols[0]["pods"][0]["state"], "uncertain");
    assert_eq!(vols[1]["device"], serde_json::Value::Null);

    let out = dump(
        &jdir,
        &[
            "--format",
            "json",
            "--volume",
            "kubernetes.io/local-volume/pv2",
        ],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["records"].as_array().unwrap().len(), 1);
    assert_eq!(v["state"]["volumes"].as_array().unwrap().len(), 1);

    let out = dump(&jdir, &[]);
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(
        table.contains("records (4):") && table.contains("kubernetes.io/local-volume/pv2"),
        "{table}"
    );
}

#[test]
fn dump_of_a_missing_journal_is_a_clear_error_and_creates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let jdir = tmp.path().join("j").join("absent");
    let out = dump(&jdir, &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no journal in") && err.contains("absent"),
        "{err}"
    );
    assert!(!jdir.exists());
}

#[test]
fn dump_while_the_daemon_runs_says_so_and_sigterm_exits_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let boot = boot_file(tmp.path());
    let mut daemon = KillOnDrop(
        Command::new(BIN)
            .args([
                "run",
                "--node-name",
                "n1",
                "--listen",
                "127.0.0.1:0",
                "--root-dir",
            ])
            .arg(&root)
            .arg("--boot-id-file")
            .arg(&boot)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let jdir = root.join("volumed");
    let deadline = Instant::now() + Duration::from_secs(20);
    let err = loop {
        let out = dump(&jdir, &[]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        if err.contains("held by a running volumed") || Instant::now() > deadline {
            break err;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(err.contains("held by a running volumed"), "{err}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(daemon.0.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = daemon.0.wait().unwrap();
    assert!(status.success(), "SIGTERM exits 0, got {status}");
    let out = dump(&jdir, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn kubeconfig_is_a_clear_not_supported_error() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args([
            "run",
            "--kubeconfig",
            "/etc/kubernetes/kubelet.conf",
            "--root-dir",
        ])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--kubeconfig") && err.contains("not supported yet"),
        "{err}"
    );
}
