//! The node's conventions, on the real `volumed run` binary (issue 18,
//! item 4), with no systemd: the test binds the unix datagram socket that
//! `NOTIFY_SOCKET` names and records what the daemon sends, as systemd
//! would receive it.
//!
//! 1. `READY=1` is withheld while `/readyz` is 503 (a pod source that
//!    cannot be listed), arrives once the source lists and `/readyz`
//!    answers 200 (a GET right after it is 200), and only once;
//! 2. with `WATCHDOG_USEC` set, `WATCHDOG=1` arrives about every half
//!    interval after `READY=1`, never before it;
//! 3. SIGTERM sends `STOPPING=1`, and nothing says ready after it;
//! 4. `--log-format json`: every stderr line of a short run (start,
//!    ready, SIGTERM) is a JSON object with `level`, `target` and
//!    `fields`; the readiness line carries its message and phase;
//! 5. `--log-format xml` is refused naming the values that exist;
//! 6. the journal's figures (`volumed_journal_*`) are on `/metrics`;
//! 7. a command that fails in JSON mode says so in a JSON line;
//! 8. with jemalloc (the default build), one thread of the allocator's own
//!    returns freed pages, so an idle daemon does not keep a burst's.
//!
//! The daemon runs as root in a private mount namespace, as every
//! `support::daemon` test does (it makes its root a shared mount).
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::fs;
use std::os::unix::net::UnixDatagram;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::daemon::{BIN, Daemon, Env, WAIT, real, series};

/// A pod with one tmpfs emptyDir: something to mount before readiness.
const POD: &str = "apiVersion: v1
kind: Pod
metadata: {name: notify-pod, namespace: default, uid: notify-pod}
spec:
  containers: [{name: app, image: busybox, volumeMounts: [{name: cache, mountPath: /cache}]}]
  volumes: [{name: cache, emptyDir: {medium: Memory}}]
";

/// The watchdog interval the tests give: pings every 500 ms.
const WATCHDOG_USEC: &str = "1000000";

/// Every datagram that arrives within `within` of the call.
fn drain(sock: &UnixDatagram, within: Duration) -> Vec<String> {
    let deadline = Instant::now() + within;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return out;
        }
        sock.set_read_timeout(Some(left)).unwrap();
        match sock.recv(&mut buf) {
            Ok(n) => out.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(_) => return out,
        }
    }
}

/// Whether a datagram carries `line` (one of its `KEY=VALUE` lines).
fn says(msg: &str, line: &str) -> bool {
    msg.lines().any(|l| l == line)
}

/// Waits for `daemon.json` and learns the daemon's address from it.
fn learn_address(env: &Env, daemon: &mut Daemon) {
    let file = env.journal.join("daemon.json");
    let pid = daemon.child.borrow().id();
    daemon.wait_until("daemon.json names the new daemon", || {
        daemon.wrote_json(&file, pid)
    });
    let info: Value = serde_json::from_slice(&fs::read(&file).unwrap()).unwrap();
    daemon.addr = Some(info["listen"].as_str().unwrap().parse().unwrap());
}

#[test]
fn ready_follows_readyz_the_watchdog_pings_and_sigterm_says_stopping() {
    real("sd_notify from the real daemon", || {
        let mut env = Env::new("notify");
        // the pod source is a file, not a dir: it cannot be listed, so
        // the daemon is up but not ready
        fs::remove_dir(&env.pods).unwrap();
        fs::write(&env.pods, "not a directory\n").unwrap();
        let sock_path = env.scratch.path().join("notify.sock");
        let sock = UnixDatagram::bind(&sock_path).unwrap();
        env.extra_env = vec![
            ("NOTIFY_SOCKET".into(), sock_path.display().to_string()),
            ("WATCHDOG_USEC".into(), WATCHDOG_USEC.into()),
        ];
        let mut daemon = env.spawn();
        learn_address(&env, &mut daemon);
        daemon.wait_until("/readyz is 503", || daemon.try_get("/readyz").0 == 503);
        let before = drain(&sock, Duration::from_millis(1500));
        assert!(
            before.iter().all(|m| m.starts_with("STATUS=")),
            "only STATUS= lines while not ready (no READY=1, no watchdog yet): {before:?}"
        );
        assert!(
            before.iter().any(|m| m.contains("reconstruct")),
            "a startup phase was reported: {before:?}"
        );
        assert_eq!(daemon.try_get("/readyz").0, 503, "still not ready");

        // the source becomes a listable dir holding a pod
        let staged = env.scratch.path().join("pods.new");
        fs::create_dir(&staged).unwrap();
        fs::write(staged.join("pod.yaml"), POD).unwrap();
        fs::remove_file(&env.pods).unwrap();
        fs::rename(&staged, &env.pods).unwrap();

        let deadline = Instant::now() + WAIT;
        let ready_at = loop {
            assert!(
                Instant::now() < deadline,
                "no READY=1 within {WAIT:?}\n{}",
                daemon.log_tail()
            );
            let got = drain(&sock, Duration::from_millis(100));
            if let Some(m) = got.iter().find(|m| says(m, "READY=1")) {
                let (status, body) = daemon.try_get("/readyz");
                assert_eq!(
                    status, 200,
                    "READY=1 ({m:?}) arrived while /readyz answers {status}: {body}"
                );
                assert!(
                    !got.iter()
                        .take_while(|x| !says(x, "READY=1"))
                        .any(|x| says(x, "WATCHDOG=1")),
                    "a watchdog ping came before READY=1: {got:?}"
                );
                break Instant::now();
            }
            assert!(
                got.iter().all(|m| !says(m, "WATCHDOG=1")),
                "a watchdog ping before READY=1: {got:?}"
            );
        };

        let after = drain(&sock, Duration::from_millis(2600));
        let pings = after.iter().filter(|m| says(m, "WATCHDOG=1")).count();
        assert!(
            (3..=8).contains(&pings),
            "about one ping per 500 ms over 2.6 s after READY=1 ({:?} ago), got {pings}: {after:?}",
            ready_at.elapsed()
        );
        assert!(
            !after.iter().any(|m| says(m, "READY=1")),
            "READY=1 only once: {after:?}"
        );

        daemon.stop();
        let last = drain(&sock, Duration::from_millis(300));
        let stopping = last.iter().position(|m| says(m, "STOPPING=1"));
        let Some(at) = stopping else {
            panic!("no STOPPING=1 after SIGTERM: {last:?}");
        };
        assert!(
            last[at..].iter().all(|m| !says(m, "READY=1")),
            "nothing says ready after STOPPING=1: {last:?}"
        );
    });
}

#[test]
fn json_logs_are_one_object_per_line_with_level_target_and_fields() {
    real("--log-format json", || {
        let mut env = Env::new("jsonlog");
        env.write_pod("pod.yaml", POD);
        env.extra_args = vec!["--log-format".into(), "json".into()];
        let daemon = env.start();
        // the journal's figures, read at the scrape: the pod's mount was
        // journaled, so records were made durable by some flush
        daemon.wait_until("the journal's figures on /metrics", || {
            let m = daemon.metrics();
            let one = |name| series(&m, name).first().map_or(0.0, |(_, v)| *v);
            one("volumed_journal_flushes_total") >= 1.0 && one("volumed_journal_durable_seq") >= 1.0
        });
        let log = daemon.log.clone();
        daemon.stop();
        let text = fs::read_to_string(&log).unwrap();
        let mut lines = 0;
        let mut ready_line = false;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            lines += 1;
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not JSON ({e}): {line}\n--- log ---\n{text}"));
            assert!(v["level"].is_string(), "no level: {line}");
            assert!(v["target"].is_string(), "no target: {line}");
            assert!(v["timestamp"].is_string(), "no timestamp: {line}");
            assert!(v["fields"].is_object(), "no fields: {line}");
            if v["fields"]["phase"] == "readyz" {
                assert!(v["fields"]["message"].is_string(), "{line}");
                assert!(v["fields"]["elapsed_ms"].is_number(), "{line}");
                assert_eq!(v["level"], "INFO", "{line}");
                ready_line = true;
            }
        }
        assert!(lines >= 5, "a short run logs its phases: {text}");
        assert!(ready_line, "the readiness phase is logged: {text}");
    });
}

#[test]
fn an_unknown_log_format_is_refused_naming_the_choices() {
    let out = Command::new(BIN)
        .args(["run", "--log-format", "xml", "--root-dir", "/nonexistent"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a usage error: {out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    for word in ["--log-format", "xml", "text", "json"] {
        assert!(err.contains(word), "names {word}: {err}");
    }
}

#[test]
fn a_failure_in_json_mode_is_a_json_line_too() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-journal");
    let out = Command::new(BIN)
        .args(["--log-format", "json", "dump", "--journal-dir"])
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "the failure is reported");
    for line in lines {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(v["level"], "ERROR", "{line}");
        let msg = v["fields"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains(&missing.display().to_string()),
            "names the dir: {line}"
        );
    }
}

#[cfg(feature = "jemalloc")]
#[test]
fn one_allocator_thread_returns_freed_pages_while_the_daemon_idles() {
    real("jemalloc's background thread", || {
        let mut env = Env::new("bgthread");
        env.write_pod("pod.yaml", POD);
        let daemon = env.start();
        let pid = daemon.child.borrow().id();
        let names: Vec<String> = fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .map(|t| fs::read_to_string(t.unwrap().path().join("comm")).unwrap())
            .map(|n| n.trim_end().to_owned())
            .collect();
        daemon.stop();
        let bg = names.iter().filter(|n| *n == "jemalloc_bg_thd").count();
        assert_eq!(bg, 1, "one background thread: {names:?}");
    });
}
