//! The tortured journal end to end (issue 18, item 2): the real `volumed run`
//! binary writes a journal (a static pod's tmpfs emptyDir, mounted for
//! real), is stopped, the journal is damaged, and the daemon is started on
//! it again. It must start (`/readyz` 200), keep the pod mounted, and say
//! what it kept aside in `/debug/state` (`journal_damage`), in `volumed
//! dump` (asked of the running daemon and read from disk after it stopped)
//! and in `volumed_journal_damage{kind}`; a further start must not crash
//! loop and must still report it. The exhaustive sweep is the library-level
//! `journal_torture`; these are the few cases worth a real daemon:
//! sled's log damaged (the journal is moved aside), one record damaged (it
//! and the rest are quarantined), the `acked` watermark damaged (nothing
//! lost, nothing to report), `daemon.json` torn under a running daemon
//! (`dump` fails naming it), sled's `conf` damaged (moved aside alone, the
//! journal kept).
//!
//! Each test runs as root in its own private mount namespace (the daemon
//! makes its root a shared mount).
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::fs;
use std::path::Path;
use std::process::Command;

use serde_json::Value;
use support::daemon::{BIN, Daemon, Env, all_mounted, real, series};

const POD: &str = "torture-pod";
const EMPTY_DIR: &str = "kubernetes.io~empty-dir";

/// A running daemon's journal with one mounted tmpfs, then stopped.
fn journal_with_a_mounted_pod(prefix: &str) -> Env {
    let mut env = Env::new(prefix);
    env.write_pod(
        "a.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: {POD}, namespace: default, uid: {POD}}}
spec:
  containers: [{{name: app, image: busybox}}]
  volumes:
  - name: cache
    emptyDir: {{medium: Memory}}
"
        ),
    );
    let daemon = env.start();
    wait_mounted(&env, &daemon);
    daemon.stop();
    env
}

fn wait_mounted(env: &Env, daemon: &Daemon) {
    let target = env.pod_volume(POD, EMPTY_DIR, "cache");
    daemon.wait_until("the tmpfs is mounted", || {
        all_mounted(&daemon.state(), std::slice::from_ref(&target))
    });
}

fn damage_gauge(daemon: &Daemon, kind: &str) -> f64 {
    let want = format!("volumed_journal_damage{{kind=\"{kind}\"}}");
    series(&daemon.metrics(), "volumed_journal_damage")
        .into_iter()
        .find(|(k, _)| *k == want)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no {want} on /metrics"))
}

fn flip(file: &Path, offset: usize, len: usize) -> Vec<u8> {
    let mut bytes = fs::read(file).unwrap();
    for b in &mut bytes[offset..offset + len] {
        *b ^= 0xff;
    }
    fs::write(file, &bytes).unwrap();
    bytes
}

#[test]
fn a_damaged_log_is_moved_aside_reported_everywhere_and_the_daemon_starts() {
    real("starts the daemon on a damaged sled log", || {
        let mut env = journal_with_a_mounted_pod("volumed-torture-log");
        // 16 bytes in the middle of what sled logged: its recovery drops
        // (and zeroes) everything from there, the watermark notices.
        let db = env.journal.join("db");
        let logged = fs::read(&db)
            .unwrap()
            .iter()
            .rposition(|&b| b != 0)
            .unwrap();
        let damaged = flip(&db, logged / 2, 16);

        let daemon = env.start();
        wait_mounted(&env, &daemon);
        let state = daemon.state();
        let moved = state["journal_damage"]["moved_aside"].as_array().cloned();
        let moved = moved.unwrap_or_else(|| panic!("no journal_damage: {state:#}"));
        assert_eq!(moved.len(), 1, "{state:#}");
        let to = Path::new(moved[0]["path"].as_str().unwrap()).to_owned();
        let reason = moved[0]["reason"].as_str().unwrap_or_default().to_owned();
        assert!(reason.contains("is corrupt"), "{reason}");
        assert!(
            to.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("journal.corrupt-"),
            "{}",
            to.display()
        );
        assert_eq!(
            fs::read(to.join("as-found/db")).unwrap(),
            damaged,
            "kept as found"
        );
        assert_eq!(damage_gauge(&daemon, "moved_aside"), 1.0);
        assert_eq!(damage_gauge(&daemon, "quarantined"), 0.0);
        assert!(daemon.log().contains("reconstructing from the host alone"));
        // dump, asked of the running daemon, says the same.
        assert_eq!(
            env.dump()["journal_damage"]["moved_aside"][0]["path"],
            moved[0]["path"]
        );
        daemon.stop();

        // Read from disk, and on the next start: still reported, nothing new moved.
        assert_eq!(
            env.dump()["journal_damage"]["moved_aside"][0]["path"],
            moved[0]["path"]
        );
        let daemon = env.start();
        wait_mounted(&env, &daemon);
        let again = daemon.state()["journal_damage"]["moved_aside"].clone();
        assert_eq!(again.as_array().map(Vec::len), Some(1), "{again:#}");
        assert_eq!(damage_gauge(&daemon, "moved_aside"), 1.0);
        daemon.stop();
    });
}

#[test]
fn a_damaged_record_is_quarantined_reported_and_the_rest_replayed() {
    real(
        "starts the daemon on a journal with a damaged record",
        || {
            let mut env = journal_with_a_mounted_pod("volumed-torture-record");
            // The watermark damaged: nothing is lost, nothing to report.
            flip(&env.journal.join("acked"), 20, 4);
            let daemon = env.start();
            wait_mounted(&env, &daemon);
            assert_eq!(daemon.state()["journal_damage"], Value::Null);
            assert_eq!(damage_gauge(&daemon, "moved_aside"), 0.0);
            daemon.stop();

            // One record's envelope damaged (sled's own checksums are fine).
            let (bad, last) = {
                let db = sled::open(&env.journal).unwrap();
                let records = db.open_tree("records").unwrap();
                let keys: Vec<u64> = records
                    .iter()
                    .keys()
                    .map(|k| u64::from_be_bytes(k.unwrap().as_ref().try_into().unwrap()))
                    .collect();
                assert!(keys.len() >= 2, "{keys:?}");
                let bad = keys[keys.len() / 2];
                let mut v = records.get(bad.to_be_bytes()).unwrap().unwrap().to_vec();
                v[30] ^= 0xff;
                records.insert(bad.to_be_bytes(), v).unwrap();
                db.flush().unwrap();
                (bad, *keys.last().unwrap())
            };
            let daemon = env.start();
            wait_mounted(&env, &daemon);
            let damage = daemon.state()["journal_damage"].clone();
            let want: Vec<u64> = (bad..=last).collect();
            assert_eq!(damage["quarantined"], serde_json::json!(want), "{damage:#}");
            assert_eq!(damage["moved_aside"], serde_json::json!([]), "{damage:#}");
            assert_eq!(damage_gauge(&daemon, "quarantined"), want.len() as f64);
            assert_eq!(
                env.dump()["journal_damage"]["quarantined"],
                serde_json::json!(want)
            );
            // `daemon.json` torn while the daemon runs: dump fails clearly,
            // naming the file (no panic: exit code 1, not 101), and the
            // daemon still stops cleanly (its removal tolerates a torn file).
            let daemon_json = env.journal.join("daemon.json");
            let len = fs::metadata(&daemon_json).unwrap().len();
            fs::OpenOptions::new()
                .write(true)
                .open(&daemon_json)
                .unwrap()
                .set_len(len / 2)
                .unwrap();
            let out = Command::new(BIN)
                .arg("dump")
                .arg("--journal-dir")
                .arg(&env.journal)
                .arg("--boot-id-file")
                .arg(&env.boot)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{stderr}");
            assert!(stderr.contains("daemon.json"), "{stderr}");
            daemon.stop();
            // Quarantined once, kept, still reported; replay no longer stops there.
            let doc = env.dump();
            assert_eq!(
                doc["journal_damage"]["quarantined"],
                serde_json::json!(want)
            );
            assert_eq!(doc["corruption"], Value::Null, "{doc:#}");
            let daemon = env.start();
            wait_mounted(&env, &daemon);
            assert_eq!(damage_gauge(&daemon, "quarantined"), want.len() as f64);
            daemon.stop();
        },
    );
}

#[test]
fn a_damaged_sled_conf_is_moved_aside_and_the_journal_kept() {
    real(
        "starts the daemon on a journal whose sled conf is damaged",
        || {
            let mut env = journal_with_a_mounted_pod("volumed-torture-conf");
            let conf = flip(&env.journal.join("conf"), 4, 1);
            let daemon = env.start();
            wait_mounted(&env, &daemon);
            let damage = daemon.state()["journal_damage"].clone();
            let moved = damage["moved_aside"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            assert_eq!(moved.len(), 1, "{damage:#}");
            let to = Path::new(moved[0]["path"].as_str().unwrap()).to_owned();
            assert_eq!(fs::read(to.join("conf")).unwrap(), conf, "kept as found");
            assert!(
                moved[0]["reason"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("conf"),
                "{damage:#}"
            );
            assert_eq!(damage_gauge(&daemon, "moved_aside"), 1.0);
            // The journal itself was kept: the first run's SetUp intent is
            // still there (a fresh journal would start at reconstruction).
            assert!(!daemon.log().contains("reconstructing from the host alone"));
            let doc = env.dump();
            let records = doc["records"].as_array().cloned().unwrap_or_default();
            assert!(records.iter().any(|r| r["type"] == "intent"), "{doc:#}");
            daemon.stop();
        },
    );
}
