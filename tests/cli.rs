//! The binary through its contract: `dump` on a journal written by the
//! library, `dump` asking a running daemon for it (and failing clearly when
//! the daemon is gone), and `run`'s flags.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

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
    let pod_path = target
        .pod()
        .map(|u| format!("/r/pods/{u}/volumes/kubernetes.io~local-volume/pv1").into());
    TargetParams::at(
        UniqueVolumeName::from_raw(volume),
        PluginName::LocalVolume,
        "pv1".into(),
        target,
        TargetKind::Mount,
        None,
    )
    .with_pod_mount_path(pod_path)
    .with_device_path(Some("/dev/loop7".into()))
    .with_device_mount_path(Some(
        "/r/plugins/kubernetes.io/local-volume/mounts/pv1".into(),
    ))
    .with_mount_options(vec!["noatime".into()].into())
    .with_fs_type(Some("ext4".into()))
}

fn write_journal(dir: &Path) {
    let (j, _) = Journal::open(&JournalConfig::new(dir, "node-a", BOOT)).unwrap();
    let vol = "kubernetes.io/local-volume/pv1";
    let i = j
        .append_record(Body::Intent {
            op: Operation::MountDevice,
            steps: Steps::Single,
            target: params(vol, TargetRef::Device).into(),
        })
        .unwrap();
    j.append_record(Body::Outcome {
        intent_seq: i,
        op: Operation::MountDevice,
        result: OpResult::Success,
        observed: None,
    })
    .unwrap();
    let pod = TargetRef::Pod(PodUid::new("pod-1").unwrap());
    j.append_record(Body::Intent {
        op: Operation::SetUp,
        steps: Steps::Single,
        target: params(vol, pod).into(),
    })
    .unwrap();
    j.append_record(Body::Intent {
        op: Operation::SetUp,
        steps: Steps::Single,
        target: params(
            "kubernetes.io/local-volume/pv2",
            TargetRef::Pod(PodUid::new("pod-2").unwrap()),
        )
        .into(),
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
    assert_eq!(v["schema_version"], volumed::journal::SCHEMA_VERSION);
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

/// Waits for the child to exit, killing it after `limit`.
fn wait_bounded(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "the daemon did not exit within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn dump_while_the_daemon_runs_asks_it_and_sigterm_exits_zero() {
    if !support::require_root("runs the daemon, which mounts its root dir shared") {
        return;
    }
    // The daemon bind-mounts its root shared: keep that off the host.
    support::in_private_mount_ns(|| {
        dump_while_the_daemon_runs_asks_it_and_sigterm_exits_zero_body()
    });
}

fn dump_while_the_daemon_runs_asks_it_and_sigterm_exits_zero_body() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let jdir = root.join("volumed");
    write_journal(&jdir);
    let boot = boot_file(tmp.path());
    let mut daemon = KillOnDrop(
        Command::new(BIN)
            .args([
                "run",
                "--node-name",
                "node-a",
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
    // daemon.json appears once the journal is open and the port bound; only
    // then is dump run, so it never races the daemon for sled's lock.
    let daemon_json = jdir.join("daemon.json");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !daemon_json.exists() {
        assert!(
            daemon.0.try_wait().unwrap().is_none(),
            "the daemon exited early"
        );
        assert!(Instant::now() < deadline, "no daemon.json after 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&daemon_json).unwrap()).unwrap();
    assert_eq!(info["pid"], daemon.0.id());
    assert_eq!(info["boot_id"], BOOT);
    assert!(
        info["listen"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{info}"
    );

    // Nothing is mounted and no pod wants these targets: reconstruction
    // decides each not mounted, and once the sources have listed the loop
    // forgets them (docs/merge-table.md). Wait for the journal to settle.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (v, live) = loop {
        let live = dump(&jdir, &["--format", "json"]);
        assert!(
            live.status.success(),
            "dump through the daemon: {}",
            String::from_utf8_lossy(&live.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&live.stdout).unwrap();
        if v["state"]["volumes"].as_array().is_some_and(Vec::is_empty) {
            break (v, live);
        }
        assert!(Instant::now() < deadline, "not settled after 20 s: {v:#}");
        std::thread::sleep(Duration::from_millis(50));
    };
    // The four records written before, then the daemon's reconstruction
    // decisions, then a forget for each.
    let records = v["records"].as_array().unwrap();
    let kinds: Vec<&str> = records[4..]
        .iter()
        .map(|r| r["type"].as_str().unwrap_or_default())
        .collect();
    let decided = kinds.iter().take_while(|k| **k == "reconstructed").count();
    assert!(decided > 0, "{v:#}");
    assert_eq!(kinds.len(), 2 * decided, "{v:#}");
    assert!(kinds[decided..].iter().all(|k| *k == "forget"), "{v:#}");
    let one = dump(
        &jdir,
        &[
            "--format",
            "json",
            "--volume",
            "kubernetes.io/local-volume/pv2",
        ],
    );
    assert!(
        one.status.success(),
        "{}",
        String::from_utf8_lossy(&one.stderr)
    );
    let total = records.len();
    let v: serde_json::Value = serde_json::from_slice(&one.stdout).unwrap();
    let kinds: Vec<_> = v["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["type"].clone())
        .collect();
    assert_eq!(
        kinds,
        ["intent", "reconstructed", "forget"],
        "pv2's intent, its reconstruction and its forget"
    );
    assert_eq!(v["state"]["volumes"].as_array().unwrap().len(), 0);
    let table = dump(&jdir, &[]);
    let live_table = String::from_utf8(table.stdout).unwrap();
    assert!(
        live_table.contains(&format!("records ({total}):")),
        "{live_table}"
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(daemon.0.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = wait_bounded(&mut daemon.0, Duration::from_secs(30));
    assert!(status.success(), "SIGTERM exits 0, got {status}");
    assert!(
        !daemon_json.exists(),
        "a clean shutdown removes daemon.json"
    );

    let stopped = dump(&jdir, &["--format", "json"]);
    assert!(
        stopped.status.success(),
        "{}",
        String::from_utf8_lossy(&stopped.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&live.stdout),
        String::from_utf8_lossy(&stopped.stdout),
        "the daemon serves exactly what dump reads from the stopped journal"
    );
    let stopped_table = String::from_utf8(dump(&jdir, &[]).stdout).unwrap();
    assert_eq!(live_table, stopped_table);
}

#[test]
fn dump_with_a_locked_journal_and_a_stale_daemon_json_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let jdir = tmp.path().join("j").join("journal");
    write_journal(&jdir);
    // This process holds sled's lock, as a daemon would.
    let (_held, _) = Journal::open(&JournalConfig::new(&jdir, "node-a", BOOT)).unwrap();

    let out = dump(&jdir, &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("held by a running volumed") && err.contains("daemon.json"),
        "no daemon.json: {err}"
    );

    // A daemon.json left by a daemon that died: a pid that has exited.
    let mut gone = Command::new("true").spawn().unwrap();
    let pid = gone.id();
    gone.wait().unwrap();
    let stale = serde_json::json!({
        "pid": pid, "listen": "127.0.0.1:9", "boot_id": BOOT,
        "version": "0.1.0", "started_ns": 1
    });
    std::fs::write(jdir.join("daemon.json"), stale.to_string()).unwrap();
    let start = Instant::now();
    let out = dump(&jdir, &["--format", "json"]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("held by a running volumed")
            && err.contains(&format!("pid {pid} is not running")),
        "stale daemon.json: {err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "no wait on a dead daemon"
    );
}

#[test]
fn a_kubeconfig_that_is_missing_or_garbage_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let garbage = tmp.path().join("garbage.conf");
    std::fs::write(&garbage, "clusters: [this is: not a kubeconfig").unwrap();
    let missing = tmp.path().join("missing.conf");
    for (file, says) in [(&missing, "no such file"), (&garbage, "garbage.conf")] {
        let out = Command::new(BIN)
            .args(["run", "--journal", "off", "--listen", "127.0.0.1:0"])
            .arg("--kubeconfig")
            .arg(file)
            .arg("--root-dir")
            .arg(tmp.path().join("root"))
            .output()
            .unwrap();
        assert!(!out.status.success(), "{}", file.display());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("kubeconfig") && err.contains(says),
            "names the flag and the file: {err}"
        );
    }
}

/// The binary runs on jemalloc with the options `host::sys::malloc` sets
/// (one arena, no thread caches, fast decay): jemalloc prints the
/// options in force at exit when asked through its environment variable.
/// A misspelt options symbol would leave its defaults (an arena per CPU,
/// thread caches), and the system allocator would print nothing.
#[cfg(feature = "jemalloc")]
#[test]
fn the_binary_runs_on_jemalloc_with_its_options() {
    let out = std::process::Command::new(BIN)
        .arg("--version")
        .env("_RJEM_MALLOC_CONF", "stats_print:true")
        .output()
        .expect("volumed runs");
    assert!(out.status.success(), "{out:?}");
    let stats = String::from_utf8_lossy(&out.stderr);
    for want in [
        "opt.narenas: 1\n",
        "opt.tcache: false\n",
        "opt.dirty_decay_ms: 1000 ",
        "opt.muzzy_decay_ms: 0 ",
    ] {
        assert!(
            stats.contains(want),
            "{want:?} not in jemalloc's stats:\n{stats}"
        );
    }
}
