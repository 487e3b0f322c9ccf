//! Kill-restart suites (docs/crash-points.md, docs/testing.md): the real
//! `volumed`, built with `--features failpoints`, is killed at every crash
//! point and at random moments under churn, restarted, and checked.
//!
//! - **Fixtures** (`fixtures/crash/*.crash`, format in
//!   `fixtures/crash/README.md` and [`fixture`]): one scenario each, each in
//!   its own private mount namespace (a re-executed child,
//!   `support::run_test_in_private_mount_ns`). A scenario whose crash point
//!   never fires fails; one marked `expect_fail` must fail. Every point
//!   of the contract (docs/crash-points.md) must be reached by some fixture.
//! - **Churn** ([`churn`]): pods added and deleted continuously, the daemon
//!   SIGKILLed at random moments and restarted, invariants checked after each
//!   restart. `VOLUMED_CHURN_ITERS` (default 20; 0 skips) and
//!   `VOLUMED_CHURN_SEED` (default 1) choose the run; a soak of 1,000 works.
//!   Then the same churn with the pods, PVs, claims and CSIDriver served by
//!   the API-server fake (`--kubeconfig`; `VOLUMED_CHURN_API_ITERS`,
//!   default 10; 0 skips): the watch's relist after each restart must keep
//!   every running pod's mounts as the static folder does.
//!   `VOLUMED_CRASH_ONLY=<name>[,…]` runs only the fixtures whose names
//!   contain one of the words.
//! - **Full disk** ([`full`], `fixtures/crash/full-*.crash`): the journal's
//!   disk filled to its last byte at each point in [`FULL_POINTS`] while
//!   the daemon is held there; it must degrade, then recover once the
//!   space is freed under it, or across a SIGKILL and a start on the full
//!   disk; nothing moved aside, no acknowledged record lost.
//!
//! After each namespaced run the runner checks that no mount and no loop
//! device of the suite is left on the host. The last line, e.g.
//! `crash fixtures: 41 passed, 0 failed; full-disk fixtures: 22 passed, 0
//! failed; churn: 20 kills, 0 violations; …`, is
//! printed (see it with `--nocapture`) and written to
//! `<target dir>/crash-summary.txt`.
//!
//! Run: `cargo test --features failpoints --test crash -- --test-threads=1`
//! (as root; otherwise it says it skipped).
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

#[path = "../support/mod.rs"]
mod support;

mod churn;
mod fixture;
mod full;
mod node;
mod scenario;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The contract's crash points (docs/crash-points.md): each must fire in
/// some fixture.
const NAMED_POINTS: [&str; 10] = [
    "mount_device.after_intent",
    "setup.after_intent",
    "teardown.after_intent",
    "unmount_device.after_intent",
    "mount_device.after_op",
    "setup.after_op",
    "teardown.after_op",
    "unmount_device.after_op",
    "checkpoint.mid",
    "orphan_cleanup.mid",
];

/// The points a `full-*` fixture fills the journal's disk at (every
/// `<op>.after_intent` and `<op>.after_op` with a journal write after it,
/// and `checkpoint.mid`): each must be held in some fixture, with the
/// space freed under the running daemon and across a SIGKILL.
const FULL_POINTS: [&str; 11] = [
    "format_device.after_intent",
    "format_device.after_op",
    "mount_device.after_intent",
    "mount_device.after_op",
    "setup.after_intent",
    "setup.after_op",
    "teardown.after_intent",
    "teardown.after_op",
    "unmount_device.after_intent",
    "unmount_device.after_op",
    "checkpoint.mid",
];

const FIXTURE_ENV: &str = "VOLUMED_CRASH_FIXTURE";
const CHURN_ENV: &str = "VOLUMED_CRASH_CHURN_CHILD";
/// Set for the churn child whose pods come from the API-server fake.
const CHURN_API_ENV: &str = "VOLUMED_CRASH_CHURN_API";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/crash")
}

/// The target dir: the test binary is `<target>/<profile>/deps/crash-…`.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    exe.ancestors()
        .nth(3)
        .map_or_else(|| PathBuf::from("target"), Path::to_path_buf)
}

/// The scratch-dir prefix of this run of the suite: the pid keeps two runs
/// (in parallel, or a soak beside CI) from mistaking each other's loop
/// devices and mounts for leftovers. Passed to every namespaced child.
pub(crate) const SCRATCH_ENV: &str = "VOLUMED_CRASH_SCRATCH_PREFIX";

fn scratch_prefix() -> String {
    format!("volumed-crash-{}-", std::process::id())
}

/// Whatever of this run is still on the host: loop devices bound to an
/// image under one of its scratch dirs, mounts below one.
fn leftovers() -> Vec<String> {
    let prefix = scratch_prefix();
    let mut left = Vec::new();
    for e in std::fs::read_dir("/sys/block")
        .into_iter()
        .flatten()
        .flatten()
    {
        let f = e.path().join("loop/backing_file");
        if let Ok(b) = std::fs::read_to_string(&f)
            && b.contains(&prefix)
        {
            left.push(format!("loop device {:?} -> {}", e.file_name(), b.trim()));
        }
    }
    for line in std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
    {
        if line.contains(&prefix) {
            left.push(format!("mount: {line}"));
        }
    }
    left
}

/// Waits up to 10 s for the namespaced run's leftovers to go (autoclear
/// unbinds a loop device asynchronously once its namespace is gone).
fn check_cleaned_up() -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = leftovers();
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("left on the host: {left:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn figure<'a>(out: &'a str, key: &str) -> Option<&'a str> {
    // libtest's `test name ... ` may precede the line with --nocapture
    out.lines()
        .find_map(|l| l.find(key).map(|i| &l[i + key.len()..]))
}

fn field(line: &str, name: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

#[test]
fn crash_suite() {
    if !support::require_root("kill-restart fixtures: real mounts and loop devices") {
        return;
    }
    let fixtures = fixture::load_all(&fixtures_dir()).expect("load fixtures/crash");
    let only: Vec<String> = std::env::var("VOLUMED_CRASH_ONLY")
        .map(|v| v.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    let (mut passed, mut failed) = (0usize, Vec::new());
    let (mut full_passed, mut full_failed) = (0usize, 0usize);
    // per `full` fixture kind (free, kill): the points held
    let mut held = std::collections::BTreeSet::new();
    let mut restarts = std::collections::BTreeMap::<String, usize>::new();
    let mut reached = std::collections::BTreeSet::new();
    let (mut unc_on, mut unc_off) = (0usize, 0usize);
    let mut ran = 0usize;
    for f in &fixtures {
        if !only.is_empty() && !only.iter().any(|o| f.name.contains(o.as_str())) {
            continue;
        }
        // the full-disk fixtures run no dry run: the figure is the others'
        ran += usize::from(f.full.is_none());
        let started = Instant::now();
        let result = support::run_test_in_private_mount_ns(
            "scenario_child",
            &[
                (FIXTURE_ENV, f.name.clone()),
                (SCRATCH_ENV, scratch_prefix()),
            ],
            Duration::from_secs(180),
        );
        let clean = check_cleaned_up();
        let out = match &result {
            Ok(o) | Err(o) => o.clone(),
        };
        let mut note = String::new();
        if let Some(line) = figure(&out, "FIGURES ") {
            let point = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("point="))
                .filter(|p| *p != "-");
            match (point, &f.full) {
                (Some(p), None) => {
                    reached.insert(p.to_owned());
                }
                (Some(p), Some(full)) => {
                    held.insert((p.to_owned(), full.then));
                }
                (None, _) => {}
            }
            if let Some(r) = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix("restart="))
                .filter(|r| *r != "-")
            {
                *restarts.entry(r.to_owned()).or_default() += 1;
                note = format!("; on the full disk the start: {r}");
            }
            unc_on += usize::try_from(field(line, "on").unwrap_or(0)).unwrap_or(0);
            unc_off += usize::try_from(field(line, "off").unwrap_or(0)).unwrap_or(0);
        }
        let verdict = match (&result, &f.expect_fail, &clean) {
            (_, _, Err(e)) => Err(format!("cleanup: {e}")),
            (Ok(_), None, _) => Ok("passed".to_owned()),
            (Err(_), Some(bug), _) => Ok(format!("failed as expected (known bug: {bug})")),
            (Ok(_), Some(bug), _) => Err(format!(
                "passed but is marked expect_fail ({bug}): the bug looks fixed, drop the mark"
            )),
            (Err(e), None, _) => Err(e.clone()),
        };
        let secs = started.elapsed().as_secs_f32();
        match verdict {
            Ok(v) => {
                if f.full.is_some() {
                    full_passed += 1;
                } else {
                    passed += 1;
                }
                println!("crash fixture {:<40} {v} ({secs:.1} s{note})", f.name);
            }
            Err(e) => {
                println!("crash fixture {:<40} FAILED ({secs:.1} s)\n{e}", f.name);
                if f.full.is_some() {
                    full_failed += 1;
                }
                failed.push(f.name.clone());
            }
        }
    }
    let mut problems = Vec::new();
    if only.is_empty() {
        let missing: Vec<_> = NAMED_POINTS
            .iter()
            .filter(|p| !reached.contains(**p))
            .collect();
        if !missing.is_empty() {
            problems.push(format!("crash points never reached: {missing:?}"));
        }
        let unheld: Vec<String> = FULL_POINTS
            .iter()
            .flat_map(|p| [(p, fixture::AfterFull::Free), (p, fixture::AfterFull::Kill)])
            .filter(|(p, then)| !held.contains(&((**p).to_owned(), *then)))
            .map(|(p, then)| format!("{p} {then:?}"))
            .collect();
        if !unheld.is_empty() {
            problems.push(format!(
                "points where no `full` fixture filled the journal's disk: {unheld:?}"
            ));
        }
    }
    let full_ran = full_passed + full_failed;
    if full_ran > 0 {
        let restarts: Vec<String> = restarts.iter().map(|(r, n)| format!("{r} {n}")).collect();
        println!(
            "full-disk fixtures: how the starts on the full disk ended: {}",
            if restarts.is_empty() {
                "none".to_owned()
            } else {
                restarts.join(", ")
            }
        );
    }
    if ran > 0 {
        println!(
            "crash fixtures: uncertain targets at restart {unc_on} with the journal, {unc_off} with --journal off (summed over {ran} scenarios)"
        );
    }

    let iters = env_u64("VOLUMED_CHURN_ITERS", 20);
    let api_iters = env_u64("VOLUMED_CHURN_API_ITERS", 10);
    let seed = env_u64("VOLUMED_CHURN_SEED", 1);
    let churn_line = churn(iters, seed, false, &only, &mut problems);
    let api_line = churn(api_iters, seed, true, &only, &mut problems);
    let summary = format!(
        "crash fixtures: {passed} passed, {} failed; full-disk fixtures: {full_passed} passed, {full_failed} failed; {churn_line}; API pods {api_line}",
        failed.len() - full_failed
    );
    let file = target_dir().join("crash-summary.txt");
    let _ = std::fs::write(&file, format!("{summary}\n"));
    println!("{summary}");
    assert!(
        failed.is_empty() && problems.is_empty(),
        "failed fixtures: {failed:?}\n{}",
        problems.join("\n")
    );
}

/// One fixture, in its own mount namespace (started by [`crash_suite`]).
#[test]
#[ignore = "run by crash_suite in a private mount namespace"]
fn scenario_child() {
    let Ok(name) = std::env::var(FIXTURE_ENV) else {
        return;
    };
    support::in_private_mount_ns(|| {
        let text = std::fs::read_to_string(fixtures_dir().join(format!("{name}.crash")))
            .expect("read fixture");
        let f = fixture::parse(&name, &text).expect("parse fixture");
        let mut figures = scenario::Figures::default();
        let r = scenario::run(&f, &mut figures);
        let restart = figures.full.as_ref().and_then(|f| f.restart).unwrap_or("-");
        println!(
            "FIGURES point={} on={} off={} restart={}",
            figures.point.as_deref().unwrap_or("-"),
            figures.uncertain_on,
            figures.uncertain_off,
            restart.replace(' ', "")
        );
        if let Err(e) = r {
            panic!("{name}: {e}");
        }
    });
}

/// The churn run, in its own mount namespace (started by [`crash_suite`]).
#[test]
#[ignore = "run by crash_suite in a private mount namespace"]
fn churn_child() {
    if std::env::var_os(CHURN_ENV).is_none() {
        return;
    }
    support::in_private_mount_ns_timeout(Duration::from_secs(u64::MAX / 4), || {
        let iters = env_u64("VOLUMED_CHURN_ITERS", 20);
        let seed = env_u64("VOLUMED_CHURN_SEED", 1);
        let api = std::env::var(CHURN_API_ENV).is_ok_and(|v| v == "1");
        let r = churn::run(iters, seed, api);
        let mean = |n: usize| {
            if r.kills == 0 {
                0.0
            } else {
                n as f64 / r.kills as f64
            }
        };
        println!(
            "CHURN kills={} violations={} mean_uncertain_on={:.2} mean_uncertain_off={:.2}",
            r.kills,
            r.violations.len(),
            mean(r.uncertain_on),
            mean(r.uncertain_off)
        );
        for v in &r.violations {
            println!("violation: {v}");
        }
        assert!(r.violations.is_empty(), "{} violations", r.violations.len());
    });
}

/// One churn run in its own namespace (`api`: pods from the API-server
/// fake): its summary line; problems are added to `problems`.
fn churn(iters: u64, seed: u64, api: bool, only: &[String], problems: &mut Vec<String>) -> String {
    if iters == 0 || !only.is_empty() {
        "churn: skipped".to_owned()
    } else {
        let limit = Duration::from_secs(120 + 30 * iters);
        let result = support::run_test_in_private_mount_ns(
            "churn_child",
            &[
                (CHURN_ENV, "1".to_owned()),
                (CHURN_API_ENV, if api { "1" } else { "" }.to_owned()),
                (SCRATCH_ENV, scratch_prefix()),
                ("VOLUMED_CHURN_ITERS", iters.to_string()),
                ("VOLUMED_CHURN_SEED", seed.to_string()),
            ],
            limit,
        );
        if let Err(e) = check_cleaned_up() {
            problems.push(format!("churn cleanup: {e}"));
        }
        let out = match &result {
            Ok(o) | Err(o) => o.clone(),
        };
        match figure(&out, "CHURN ") {
            Some(line) => {
                let kills = field(line, "kills").unwrap_or(0);
                let violations = field(line, "violations").unwrap_or(0);
                let on = line
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("mean_uncertain_on="))
                    .unwrap_or("?");
                let off = line
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("mean_uncertain_off="))
                    .unwrap_or("?");
                if violations > 0 || result.is_err() {
                    problems.push(format!("churn: {violations} violations\n{out}"));
                }
                println!(
                    "churn (seed {seed}): mean uncertain targets right after restart: {on} with the journal, {off} with --journal off"
                );
                format!("churn: {kills} kills, {violations} violations")
            }
            None => {
                problems.push(format!("churn did not report\n{out}"));
                "churn: did not finish".to_owned()
            }
        }
    }
}
