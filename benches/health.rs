//! Health bench (issue 15): one full pass of the real monitor
//! (`volumed::health::Monitor`, in process, over `LinuxSys`) against N
//! memory emptyDirs, each a real tmpfs mount, next to the floor measured in
//! the same run on the same paths: N bare `statfs(2)` calls. Figures are
//! printed, never asserted.
//!
//! The bench moves itself into a private mount namespace first, so its
//! mounts live and die with it. The monitor's first pass learns every
//! mount from the table (timed apart); the passes timed after it are what
//! every period costs: copying the subjects, one `statfs` per volume,
//! applying the results — and, when the mount table changed since the
//! last pass (a mount or unmount anywhere; made here before each such
//! pass, untimed), one `statx` per mount target too. Both kinds are timed,
//! each figure the median of 5. The CPU a quiet pass takes (the process's
//! user + system time around it) over the default 60 s period is what the
//! monitor adds to an idle daemon.

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use volumed::health::{HealthConfig, Monitor, MonitorParts, PodTarget, RecentEvents, Subject};
use volumed::host::sys::LinuxSys;
use volumed::model::{PluginName, PodUid, StorageMedium, TargetKind, UniqueVolumeName, VolumeSpec};

use support::{Scratch, enter_private_mount_ns, mkdirs, mount_tmpfs, require_root};

const ROUNDS: usize = 5;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// User + system CPU time of this process.
fn cpu() -> Duration {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `u` is writable memory the size of `struct rusage`, all the
    // kernel writes; RUSAGE_SELF needs nothing else.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr()) };
    assert_eq!(rc, 0, "getrusage");
    // SAFETY: getrusage succeeded, so it filled the struct.
    let u = unsafe { u.assume_init() };
    let tv = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn subjects(paths: &[PathBuf]) -> Vec<Subject> {
    let spec = Arc::new(VolumeSpec::EmptyDir {
        medium: StorageMedium::Memory,
        size_limit: None,
    });
    paths
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let uid = PodUid::new(format!("pod-{i}")).expect("a valid UID");
            Subject {
                volume: UniqueVolumeName::per_pod(PluginName::EmptyDir, &uid, "cache"),
                plugin: PluginName::EmptyDir,
                spec: Some(spec.clone()),
                device: None,
                pods: vec![PodTarget {
                    uid,
                    outer_name: "cache".into(),
                    path: p.as_path().into(),
                    kind: TargetKind::Mount,
                    pod: None,
                    read_only: false,
                }],
                claim: None,
            }
        })
        .collect()
}

fn run(n: usize, scratch: &Scratch) {
    let base = scratch.path().join(format!("n{n}"));
    let paths: Vec<PathBuf> = (0..n).map(|i| base.join(format!("v{i}"))).collect();
    for p in &paths {
        mkdirs(p);
        mount_tmpfs(p, "size=1m");
    }
    let floor = median(
        (0..ROUNDS)
            .map(|_| {
                let t = Instant::now();
                for p in &paths {
                    std::hint::black_box(nix::sys::statvfs::statvfs(p).expect("statfs"));
                }
                t.elapsed()
            })
            .collect(),
    );
    let all = subjects(&paths);
    let monitor = Monitor::start(MonitorParts {
        config: HealthConfig {
            period: Duration::from_secs(3600),
            ..HealthConfig::default()
        },
        sys: Arc::new(LinuxSys),
        drivers: None,
        subjects: Box::new(move || all.clone()),
        sink: Arc::new(RecentEvents::default()),
        metrics: None,
    })
    .expect("start the monitor");
    // the pass at start learns every mount from the table
    let t = Instant::now();
    assert!(monitor.check_now(Duration::from_secs(600)));
    let first = t.elapsed();
    let mut walls = Vec::new();
    let mut cpus = Vec::new();
    let mut after_change = Vec::new();
    let elsewhere = base.join("elsewhere");
    mkdirs(&elsewhere);
    for _ in 0..ROUNDS {
        let (t, c) = (Instant::now(), cpu());
        assert!(monitor.check_now(Duration::from_secs(600)));
        walls.push(t.elapsed());
        cpus.push(cpu().saturating_sub(c));
        // a change of the table: the next pass looks at every mount
        mount_tmpfs(&elsewhere, "size=1m");
        support::umount(&elsewhere);
        let t = Instant::now();
        assert!(monitor.check_now(Duration::from_secs(600)));
        after_change.push(t.elapsed());
    }
    let abnormal = monitor.read(|s| {
        s.volumes
            .values()
            .filter(|r| r.condition.as_ref().is_some_and(|c| c.abnormal))
            .count()
    });
    assert_eq!(abnormal, 0, "every tmpfs is healthy");
    monitor.stop();
    let (pass, cpu_pass) = (median(walls), median(cpus));
    let full = median(after_change);
    println!(
        "{n:>6} volumes: pass {:>9.3} ms, floor ({n} statfs) {:>8.3} ms, ratio {:.2}x; \
         after a change of the mount table {:.3} ms ({:.2}x); \
         first pass (learns the table) {:.3} ms; CPU per pass {:.3} ms = {:.4}% of a core at a 60 s period",
        pass.as_secs_f64() * 1e3,
        floor.as_secs_f64() * 1e3,
        pass.as_secs_f64() / floor.as_secs_f64(),
        full.as_secs_f64() * 1e3,
        full.as_secs_f64() / floor.as_secs_f64(),
        first.as_secs_f64() * 1e3,
        cpu_pass.as_secs_f64() * 1e3,
        cpu_pass.as_secs_f64() / 60.0 * 100.0,
    );
    for p in paths.iter().rev() {
        support::umount(p);
    }
}

fn main() {
    if !require_root("the health bench mounts a tmpfs per volume") {
        return;
    }
    enter_private_mount_ns();
    let quick = std::env::args().all(|a| a != "--bench")
        || std::env::var("VOLUMED_BENCH_QUICK").is_ok_and(|v| v == "1");
    let sizes: &[usize] = if quick {
        &[100, 1000]
    } else {
        &[1000, 5000, 10_000]
    };
    let scratch = Scratch::new("volumed-health-bench-");
    println!(
        "health bench ({} mode): a monitor pass against bare statfs, median of {ROUNDS}",
        if quick { "quick" } else { "full" }
    );
    for &n in sizes {
        run(n, &scratch);
    }
}
