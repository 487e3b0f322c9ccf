//! Scale benchmark: the real `volumed run` binary at 1k to 20k static pods
//! (50k on request), each pod with one `emptyDir: {medium: Memory}`, next to
//! floors measured in the same run. Figures are printed, never asserted.
//!
//! The bench moves itself into a private mount namespace first (as
//! `benches/daemon.rs`; one single-threaded process), so every mount, the
//! daemons' included, lives and dies with it. Per size N, on a root that is
//! a fresh ext4 of its own (sparse image, autoclear loop device, detached
//! at the end of the size), with the N manifests in `--static-pods` before
//! the spawn:
//!
//! - **first start → readyz**: spawn to the first `/readyz` 200 (asked every
//!   5 ms); **all mounted**: spawn to `volume_manager_total_volumes`
//!   `{state="actual_state_of_world"}` = N on `/metrics` (asked every 5 ms).
//!   Its **floor**: the same dirs and mounts made by the bench (per pod
//!   `mkdir -p` of the target, tmpfs mount, `chmod 0777`, `mkdir -p` of the
//!   ready marker's dir) under a shared root bind mount, on a fresh ext4,
//!   median of 3 (quick: 1) runs.
//! - **graceful stop**: SIGTERM to exit with N mounted; the mounts stay.
//!   Also of the restarted daemon (after its health pass and idle
//!   CPU), and of a third daemon on the same root, stopped as soon as
//!   `/readyz` says 200 (**stop at ready**: the close on top of the
//!   start's own work; goal 250 ms from 20,000 pods, printed `within` or
//!   `OVER`), with the daemon's own `phase=stop` figure.
//! - **one mountinfo read**: `MountTable::read` (read + parse) of
//!   `/proc/self/mountinfo` with the N mounts in it, median of 11 (the raw
//!   read alone is printed beside it).
//! - **restart → readyz**: a second daemon on the same root dir, journal and
//!   manifests (the mounts are still there), spawn to `/readyz` 200; and
//!   **restart/read**, its ratio to one mountinfo read. Above 10× it is
//!   printed as a `DEFECT` line with the longest silence in the log before
//!   ready, to explain; below 1,000 pods, where a start's fixed cost is
//!   most of it, with the same explanation but not judged.
//! - **phases** of each start, from the daemon's stderr (tracing's default
//!   format, `<RFC 3339 UTC time> <LEVEL> <target>: <message> k=v k="v v"`).
//!   Every line up to all mounted is listed with its time after the spawn
//!   (the spawn's wall clock against the line's timestamp; repeats of one
//!   message folded into a count), and any line with a `phase=<name>`
//!   field is also listed as a phase with its duration, taken from the
//!   first field whose key contains `elapsed`, `duration` or `took`, or ends
//!   in `_ms`, `_us`, `_ns`, `_s` or `_secs`: a number with a unit
//!   (`12.5ms`, `800µs`, `1.2s`, as tracing prints a `Duration` with `?`)
//!   or a bare number in the key's unit (milliseconds when the key has
//!   none). So `INFO volumed::daemon: startup phase phase=mount_scan
//!   elapsed_ms=41.2 mounts=20001` is picked up as it is.
//! - **RSS** (VmRSS, RssAnon) twice, each once the daemon has used no CPU
//!   for a second (at least 2 s) after a health pass over every volume
//!   (the steady state: the monitor holds a record per volume): at the
//!   first start, after all mounted and a pass asked for then
//!   (`/debug/health?fresh=1&volume=`, answering for one volume; its first
//!   pass, at readiness, saw few volumes), and on the restarted daemon
//!   after its first pass (asked at readiness, with the ASW already
//!   rebuilt from the checkpoint); at the largest size per volume (from
//!   50,000 volumes on, judged against the goal of 2 KiB per volume:
//!   within, or `OVER`), and the slope from the smallest size; and
//!   **idle CPU** of the restarted daemon over 30 s (quick 3 s), as
//!   `benches/daemon.rs` measures it.
//!
//! Then: the table, per-size growth factors (each also per doubling of
//! the node: it should be at most 2), `scale.csv` and `phases.csv` in
//! `target/scale/` (`$VOLUMED_BENCH_SCALE_OUT`), and a log-log plot of the
//! curves, `scale.svg` there too; at full size with the default sizes also
//! `docs/scale.svg` (quick mode never touches the tree).
//!
//! Sizes: `cargo bench --bench scale` runs 1,000, 5,000, 10,000 and 20,000
//! pods (about 5 min on a 2-core VM); `VOLUMED_BENCH_SCALE_50K=1` adds
//! 50,000; `VOLUMED_BENCH_SCALE_SIZES=500,2000` picks others. Quick mode
//! (`VOLUMED_BENCH_QUICK=1`, `--quick` or `cargo test --benches`): 200 and
//! 1,000 (about 10 s). `VOLUMED_BENCH_POLL_MS` and
//! `VOLUMED_BENCH_DAEMON_ARGS` are passed on as in `benches/daemon.rs`.
//! Needs root; otherwise prints what it skipped and exits 0.

#[path = "support/mod.rs"]
mod bench_support;
#[path = "../tests/support/mod.rs"]
mod support;

use std::fmt::Write as _;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bench_support::{
    Daemon, MOUNTED_POLL, RESTART_GOAL_FROM, TableFloors, boot_id_file, clk_tck, cpu_ticks,
    drop_ext4, fresh_ext4, journal_tempdir, median, mounts_below, poll_ms, quick_mode, rss_kib,
    settle_cpu, shared_root, table_floors, thread_ticks, threads_since, uid, write_pods,
};
use nix::mount::{MntFlags, umount2};
use support::{Scratch, enter_private_mount_ns, mkdirs, mount_tmpfs, require_root};
use volumed::model::{Layout, PluginName, PodUid, PodVolume, StorageMedium, VolumeSpec};

/// Reads of the mount table per size; the median is the floor.
const READ_RUNS: usize = 11;
/// Below the goal's range (`RESTART_GOAL_FROM`), a restart over this many
/// times one read and parse of the mount table is reported as a defect,
/// from `DEFECT_FROM` pods: below, a start's fixed cost (opening the
/// journal, binding the sockets) is most of a restart and the mount table
/// a few hundred lines, so the ratio is printed, not judged.
const DEFECT_RATIO: f64 = 10.0;
const DEFECT_FROM: usize = 1_000;
/// The goal for VmRSS per volume, judged at `MEMORY_GOAL_AT` volumes and
/// above (below, the process's fixed cost dominates).
const MEMORY_GOAL_KIB: f64 = 2.0;
const MEMORY_GOAL_AT: usize = 50_000;
/// The goal for a graceful stop right after a restart (issue 43), judged
/// from `STOP_GOAL_AT` pods.
const STOP_GOAL: Duration = Duration::from_millis(250);
const STOP_GOAL_AT: usize = 20_000;
/// The emptyDir's name in every pod.
const VOLUME: &str = "cache";

struct Config {
    quick: bool,
    sizes: Vec<usize>,
    /// whether the sizes are the defaults (only then docs/scale.svg)
    default_sizes: bool,
    floor_runs: usize,
    quiet: Duration,
    idle: Duration,
    wait: Duration,
}

impl Config {
    fn from_env() -> Config {
        let quick = quick_mode();
        let custom: Option<Vec<usize>> = std::env::var("VOLUMED_BENCH_SCALE_SIZES")
            .ok()
            .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect());
        let mut sizes = match (&custom, quick) {
            (Some(s), _) if !s.is_empty() => s.clone(),
            (_, true) => vec![200, 1_000],
            (_, false) => vec![1_000, 5_000, 10_000, 20_000],
        };
        if !quick && std::env::var("VOLUMED_BENCH_SCALE_50K").is_ok_and(|v| v == "1") {
            sizes.push(50_000);
        }
        sizes.sort_unstable();
        sizes.dedup();
        Config {
            quick,
            default_sizes: custom.is_none_or(|s| s.is_empty()),
            sizes,
            floor_runs: if quick { 1 } else { 3 },
            quiet: Duration::from_secs(if quick { 1 } else { 2 }),
            idle: Duration::from_secs(if quick { 3 } else { 30 }),
            wait: Duration::from_secs(3_600),
        }
    }
}

/// Pod `i`'s manifest: one memory emptyDir.
fn pod_manifest(i: usize) -> String {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": format!("scale-{i:05}"), "namespace": "default", "uid": uid(i)},
        "spec": {
            "containers": [{
                "name": "app",
                "image": "busybox",
                "volumeMounts": [{"name": VOLUME, "mountPath": "/cache"}]
            }],
            "volumes": [{"name": VOLUME, "emptyDir": {"medium": "Memory"}}]
        }
    })
    .to_string()
}

/// The ext4 for `pods` pods: about 200 KiB each, so with ext4's one inode
/// per 16 KiB a pod has some 12 inodes (it takes 8: 7 dirs and the marker).
fn ext4_mb(pods: usize) -> u64 {
    (pods as u64 * 200 / 1024).max(512)
}

/// One floor run on `root`: the daemon's dirs and mounts for `pods`
/// emptyDirs, done directly; returns the time, then detaches everything.
fn floor_once(root: &Path, pods: usize) -> Duration {
    shared_root(root);
    let layout = Layout::new(root);
    let targets: Vec<(PathBuf, PathBuf)> = (0..pods)
        .map(|i| {
            let pod = PodUid::new(uid(i)).expect("uid");
            let marker = layout.empty_dir_ready_marker(&pod, VOLUME);
            (
                layout.pod_target_path(&pod, PluginName::EmptyDir, VOLUME),
                marker.parent().expect("the marker's dir").to_owned(),
            )
        })
        .collect();
    let start = Instant::now();
    for (target, marker_dir) in &targets {
        mkdirs(target);
        mount_tmpfs(target, "");
        fs::set_permissions(target, fs::Permissions::from_mode(0o777)).expect("chmod");
        mkdirs(marker_dir);
    }
    let took = start.elapsed();
    umount2(root, MntFlags::MNT_DETACH).expect("detach floor root");
    took
}

/// One line of the daemon's log, as far as it could be read.
#[derive(Debug, Clone, PartialEq)]
struct LogLine {
    /// milliseconds after the spawn (negative if the clocks disagree a bit)
    at_ms: f64,
    level: String,
    message: String,
    fields: Vec<(String, String)>,
}

impl LogLine {
    fn field(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The phase's duration in milliseconds, from the first field that
    /// names one (see the module doc).
    fn elapsed_ms(&self) -> Option<f64> {
        self.fields.iter().find_map(|(k, v)| duration_field(k, v))
    }

    fn fields_text(&self) -> String {
        self.fields
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// `key=value` as a duration in milliseconds, if the key names one.
fn duration_field(key: &str, value: &str) -> Option<f64> {
    let k = key.to_ascii_lowercase();
    let key_unit = [
        ("_ms", 1.0),
        ("_us", 1e-3),
        ("_ns", 1e-6),
        ("_secs", 1e3),
        ("_s", 1e3),
    ]
    .iter()
    .find(|(suffix, _)| k.ends_with(suffix))
    .map(|(_, f)| *f);
    let named = k.contains("elapsed") || k.contains("duration") || k.contains("took");
    if key_unit.is_none() && !named {
        return None;
    }
    let v = value.trim_matches('"');
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == 'e'))
        .unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let num: f64 = num.parse().ok()?;
    let factor = match unit.trim() {
        "" => key_unit.unwrap_or(1.0),
        "ns" => 1e-6,
        "us" | "µs" => 1e-3,
        "ms" => 1.0,
        "s" => 1e3,
        "m" | "min" => 60e3,
        _ => return None,
    };
    Some(num * factor)
}

/// Days from 1970-01-01 to the civil date `y-m-d` (proleptic Gregorian).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let month_from_march = (m + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + d - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// An RFC 3339 time (`2026-11-20T15:12:00.123456Z`, or with `+hh:mm`) as
/// seconds since the epoch.
fn parse_rfc3339(s: &str) -> Option<f64> {
    let num = |a: usize, b: usize| s.get(a..b)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    if !matches!(s.as_bytes().get(10), Some(b'T' | b't' | b' ')) {
        return None;
    }
    let (h, mi, sec) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    let rest = s.get(19..)?;
    let frac_len = rest.strip_prefix('.').map_or(0, |r| {
        r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len()) + 1
    });
    let frac: f64 = match frac_len {
        0 => 0.0,
        n => format!("0{}", &rest[..n]).parse().ok()?,
    };
    let offset = match &rest[frac_len..] {
        "" | "Z" | "z" => 0,
        o if o.len() == 6 && (o.starts_with('+') || o.starts_with('-')) => {
            let sign = if o.starts_with('-') { -1 } else { 1 };
            sign * (o[1..3].parse::<i64>().ok()? * 3600 + o[4..6].parse::<i64>().ok()? * 60)
        }
        _ => return None,
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + sec - offset;
    Some(secs as f64 + frac)
}

/// Splits on whitespace, except inside double quotes.
fn tokens(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let (mut quoted, mut escaped) = (false, false);
    for c in s.chars() {
        match c {
            _ if escaped => {
                cur.push(c);
                escaped = false;
            }
            '\\' if quoted => {
                cur.push(c);
                escaped = true;
            }
            '"' => {
                cur.push(c);
                quoted = !quoted;
            }
            c if c.is_whitespace() && !quoted => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// `key=value` with an identifier key.
fn as_field(token: &str) -> Option<(String, String)> {
    let (k, v) = token.split_once('=')?;
    let mut chars = k.chars();
    let first = chars.next()?;
    let ident = (first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
    ident.then(|| (k.to_owned(), v.trim_matches('"').to_owned()))
}

/// One line of tracing's default format, timed against `spawned` (seconds
/// since the epoch); `None` for what is not such a line (a panic message,
/// a continuation).
fn parse_log_line(line: &str, spawned: f64) -> Option<LogLine> {
    let toks = tokens(line);
    let ts = parse_rfc3339(toks.first()?)?;
    let level = toks.get(1)?.clone();
    if !matches!(
        level.as_str(),
        "TRACE" | "DEBUG" | "INFO" | "WARN" | "ERROR"
    ) {
        return None;
    }
    // any spans (`run{a=1}:`), then the target (`volumed::daemon:`)
    let mut i = 2;
    while toks
        .get(i)
        .is_some_and(|t| t.ends_with(':') && t.contains('{'))
    {
        i += 1;
    }
    let is_target = |t: &str| {
        t.len() > 1
            && t.ends_with(':')
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    if toks.get(i).is_some_and(|t| is_target(t)) {
        i += 1;
    }
    let (mut message, mut fields) = (Vec::new(), Vec::<(String, String)>::new());
    for t in &toks[i..] {
        // (`-o context=` in a message is no field: one needs a value there)
        let field = as_field(t).filter(|f| !fields.is_empty() || !f.1.is_empty());
        match (field, fields.last_mut()) {
            (Some(f), _) => fields.push(f),
            // a Debug value with spaces goes on
            (None, Some((_, v))) => {
                v.push(' ');
                v.push_str(t);
            }
            (None, None) => message.push(t.as_str()),
        }
    }
    Some(LogLine {
        at_ms: (ts - spawned) * 1e3,
        level,
        message: message.join(" "),
        fields,
    })
}

fn parse_log(text: &str, spawned: SystemTime) -> Vec<LogLine> {
    let spawned = spawned
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    text.lines()
        .filter_map(|l| parse_log_line(l, spawned))
        .collect()
}

/// A phase line (`phase=` and a duration).
#[derive(Debug, Clone)]
struct Phase {
    name: String,
    at_ms: f64,
    elapsed_ms: Option<f64>,
}

/// Prints the log of one start (every line so far, one per message with a
/// count of repeats), phase lines first, with the bench's own `marks`
/// (`/readyz` 200, all mounted) in their places; returns the phases and the
/// longest silence in the log before `marks[0]` (ready), described.
fn print_phases(
    what: &str,
    lines: &[LogLine],
    marks: &[(f64, &str)],
) -> (Vec<Phase>, Option<(f64, String)>) {
    let phases: Vec<Phase> = lines
        .iter()
        .filter_map(|l| {
            Some(Phase {
                name: l.field("phase")?.to_owned(),
                at_ms: l.at_ms,
                elapsed_ms: l.elapsed_ms(),
            })
        })
        .collect();
    println!("  {what}: the daemon's log, ms after the spawn");
    if phases.is_empty() {
        println!("    (no phase= lines in this build's log)");
    }
    for p in &phases {
        let took = p
            .elapsed_ms
            .map_or("?".to_owned(), |e| format!("{e:.1} ms"));
        println!(
            "    phase {:<24} {took:>10}  (ends +{:.0})",
            p.name, p.at_ms
        );
    }
    // (time, text) of every line to print, the marks among them
    let mut out: Vec<(f64, String)> = marks
        .iter()
        .map(|(at, m)| (*at, format!("── {m} (seen by the bench)")))
        .collect();
    let mut seen: Vec<(String, usize, f64)> = Vec::new();
    for l in lines {
        let key = format!("{} {}", l.level, l.message);
        if let Some(s) = seen.iter_mut().find(|s| s.0 == key) {
            s.1 += 1;
            s.2 = l.at_ms;
            continue;
        }
        seen.push((key, 1, l.at_ms));
        if l.field("phase").is_some() {
            continue;
        }
        let level = match l.level.as_str() {
            "INFO" => String::new(),
            other => format!("{other} "),
        };
        let message: String = l.message.chars().take(70).collect();
        let fields: String = l.fields_text().chars().take(100).collect();
        out.push((l.at_ms, format!("{level}{message}  {fields}")));
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    for (at, text) in &out {
        println!("    +{at:>7.0}  {text}");
    }
    for (key, n, last) in seen.iter().filter(|s| s.1 > 1) {
        println!("    ({key}: {n} lines, the last at +{last:.0})");
    }
    let ready = marks.first().map_or(f64::MAX, |m| m.0);
    let mut steps: Vec<(f64, String)> = lines
        .iter()
        .filter(|l| l.at_ms <= ready)
        .map(|l| (l.at_ms, format!("\"{}\"", l.message)))
        .collect();
    if let Some((at, m)) = marks.first() {
        steps.push((*at, (*m).to_owned()));
    }
    let mut gap = None::<(f64, String)>;
    let mut prev = (0.0, "the spawn".to_owned());
    for (at, label) in steps {
        let g = at - prev.0;
        if gap.as_ref().is_none_or(|(best, _)| g > *best) {
            gap = Some((
                g,
                format!(
                    "{g:.0} ms from +{:.0} {} to +{at:.0} {label}",
                    prev.0, prev.1
                ),
            ));
        }
        prev = (at, label);
    }
    (phases, gap)
}

/// The figures of one size.
struct Row {
    pods: usize,
    first_ready: Duration,
    first_dsw: Option<Duration>,
    first_mounted: Option<Duration>,
    floor_mounts: Duration,
    stop: Duration,
    /// the mount table read after the stop, before the restart
    floors: TableFloors,
    restart_ready: Duration,
    restart_mounted: Option<Duration>,
    restart_stop: Duration,
    /// a third daemon's stop as soon as it was ready
    stop_at_ready: Duration,
    rss_kib: u64,
    anon_kib: u64,
    /// the restarted daemon's, after its first health pass
    restart_rss_kib: u64,
    restart_anon_kib: u64,
    phases: Vec<(&'static str, Phase)>,
    restart_gap: Option<(f64, String)>,
}

impl Row {
    /// restart → readyz over one read and parse of the mount table
    fn ratio(&self) -> f64 {
        self.floors.over_parse(self.restart_ready)
    }

    /// restart → readyz over the kernel's raw read of the mount table
    fn raw_ratio(&self) -> f64 {
        self.floors.over_raw(self.restart_ready)
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

struct Env<'a> {
    cfg: &'a Config,
    scratch: &'a Path,
    journals: &'a Path,
    boot_file: &'a Path,
}

fn run_size(env: &Env<'_>, n: usize, largest: bool) -> Option<Row> {
    let cfg = env.cfg;
    let size_mb = ext4_mb(n);
    println!("{n} pods (ext4 roots of {size_mb} MiB):");
    let pods_dir = env.scratch.join(format!("pods-{n}"));
    write_pods(0..n, &pods_dir, pod_manifest);

    let mut floors: Vec<Duration> = (0..cfg.floor_runs)
        .map(|r| {
            let fs_dir = env.scratch.join(format!("floor-fs-{n}-{r}"));
            let dev = fresh_ext4(&fs_dir, size_mb);
            let took = floor_once(&fs_dir.join("root"), n);
            drop_ext4(&fs_dir, dev);
            took
        })
        .collect();
    let floor_mounts = median(&mut floors);

    let fs_dir = env.scratch.join(format!("daemon-fs-{n}"));
    let dev = fresh_ext4(&fs_dir, size_mb);
    let root = fs_dir.join("root");
    let journal = env.journals.join(format!("journal-{n}"));
    let mut d = Daemon::start(
        &root,
        &journal,
        &pods_dir,
        None,
        env.boot_file,
        env.scratch.join(format!("first-{n}.log")),
    );
    let first_ready = d.wait_ready(MOUNTED_POLL, cfg.wait);
    let since = d.spawned;
    let Some((first_dsw, first_mounted)) = d.wait_mounted(n as u64, since, cfg.wait) else {
        println!("  not all mounted; log tail:\n{}", d.log_tail());
        d.stop();
        drop_ext4(&fs_dir, dev);
        return None;
    };
    let first_log = parse_log(&d.log_text(), d.spawned_wall);
    let (first_phases, _) = print_phases(
        "first start",
        &first_log,
        &[
            (ms(first_ready), "/readyz 200"),
            (ms(first_mounted), "all mounted"),
        ],
    );
    // The monitor's first pass ran at readiness, over the few volumes
    // mounted by then: one asked for now checks them all, so this reading
    // holds the state the restarted daemon's does. The answer is one
    // volume's: the whole store's (tens of MB of JSON at 50k) would be
    // built and freed just before the reading, which no idle node does.
    let spec = VolumeSpec::EmptyDir {
        medium: StorageMedium::Memory,
        size_limit: None,
    };
    let one = PodVolume::unique_name(&spec, &PodUid::new(uid(0)).expect("uid"), VOLUME);
    let asked = volumed::server::client::with_query(
        "/debug/health",
        &[Some(("fresh", "1")), Some(("volume", one.as_str()))],
    );
    let (code, body) = d.get(&asked);
    if code != 200 || !body.contains(one.as_str()) {
        println!("  check: {asked} answered {code}: {body}");
    }
    let settled = settle_cpu(d.pid(), cfg.quiet, cfg.wait);
    let (first_rss_kib, first_anon_kib) = rss_kib(d.pid());
    let stop = d.stop_keep_mounts();
    let below = mounts_below(&root);
    if below != n {
        println!("  check: {below} mounts below the root after the stop, want {n}");
    }

    let floors = table_floors(READ_RUNS);

    // A daemon killed at its stop left its daemon.json: not the new one's.
    let _ = fs::remove_file(journal.join("daemon.json"));
    let mut r = Daemon::start(
        &root,
        &journal,
        &pods_dir,
        None,
        env.boot_file,
        env.scratch.join(format!("restart-{n}.log")),
    );
    let restart_ready = r.wait_ready(MOUNTED_POLL, cfg.wait);
    let since = r.spawned;
    let restart_mounted = r.wait_mounted(n as u64, since, cfg.wait).map(|m| m.1);
    let restart_log = parse_log(&r.log_text(), r.spawned_wall);
    let mut marks = vec![(ms(restart_ready), "/readyz 200")];
    marks.extend(restart_mounted.map(|m| (ms(m), "all in the ASW")));
    let (restart_phases, restart_gap) = print_phases("restart", &restart_log, &marks);
    println!(
        "  {n} pods: first start ready {:.0} ms, all mounted {:.0} ms (DSW full {:.0} ms; floor {:.0} ms, {:.1}x); \
         stop {:.0} ms; mount table {} entries; restart ready {:.0} ms ({}), all in the ASW {}; \
         VmRSS {first_rss_kib} KiB",
        ms(first_ready),
        ms(first_mounted),
        ms(first_dsw),
        ms(floor_mounts),
        first_mounted.as_secs_f64() / floor_mounts.as_secs_f64(),
        ms(stop),
        floors.entries,
        ms(restart_ready),
        floors.ratios_text(restart_ready),
        restart_mounted.map_or("never".to_owned(), |m| format!("{:.0} ms", ms(m))),
    );
    if !wait_health_pass(&r, cfg.wait) {
        println!("  check: the restarted daemon's first health pass did not end in time");
    }
    let restart_settled = settle_cpu(r.pid(), cfg.quiet, cfg.wait);
    let (restart_rss_kib, restart_anon_kib) = rss_kib(r.pid());
    println!(
        "  memory: first start VmRSS {first_rss_kib} KiB ({:.1} s after the health pass \
         asked once all mounted); restarted, after its first health pass, \
         VmRSS {restart_rss_kib} KiB ({:.1} s after it)",
        settled.as_secs_f64(),
        restart_settled.as_secs_f64()
    );
    if largest {
        idle_cpu(&r, n, cfg.idle);
    }
    let restart_stop = r.stop_keep_mounts();
    // once more, stopped as soon as it is ready: what a stop costs on top
    // of a start's own work (the pod-dir walk, the first health pass and
    // the journal's close all still to come or under way)
    let _ = fs::remove_file(journal.join("daemon.json"));
    let again_log = env.scratch.join(format!("restart-again-{n}.log"));
    let mut q = Daemon::start(
        &root,
        &journal,
        &pods_dir,
        None,
        env.boot_file,
        again_log.clone(),
    );
    let again_ready = q.wait_ready(MOUNTED_POLL, cfg.wait);
    let spawned_wall = q.spawned_wall;
    let stop_at_ready = q.stop();
    let at_stop = parse_log(
        &fs::read_to_string(&again_log).unwrap_or_default(),
        spawned_wall,
    );
    let stopped_in = at_stop
        .iter()
        .filter(|l| l.field("phase") == Some("stop"))
        .find_map(LogLine::elapsed_ms)
        .map_or("?".to_owned(), |e| format!("{e:.0} ms"));
    println!(
        "  graceful stop right after a restart (ready {:.0} ms after the spawn): {:.0} ms to exit, \
         the daemon's threads joined in {stopped_in}{}",
        ms(again_ready),
        ms(stop_at_ready),
        match n >= STOP_GOAL_AT {
            true => format!(
                "; goal {:.0} ms from {STOP_GOAL_AT} pods: {}",
                ms(STOP_GOAL),
                if stop_at_ready <= STOP_GOAL {
                    "within"
                } else {
                    "OVER"
                }
            ),
            false => String::new(),
        }
    );
    drop_ext4(&fs_dir, dev);
    let _ = fs::remove_dir_all(&journal);
    let _ = fs::remove_dir_all(&pods_dir);
    let phases = first_phases
        .into_iter()
        .map(|p| ("first", p))
        .chain(restart_phases.into_iter().map(|p| ("restart", p)))
        .collect();
    Some(Row {
        pods: n,
        first_ready,
        first_dsw: Some(first_dsw),
        first_mounted: Some(first_mounted),
        floor_mounts,
        stop,
        floors,
        restart_ready,
        restart_mounted,
        restart_stop,
        stop_at_ready,
        rss_kib: first_rss_kib,
        anon_kib: first_anon_kib,
        restart_rss_kib,
        restart_anon_kib,
        phases,
        restart_gap,
    })
}

/// Waits until the daemon's health monitor has ended a pass
/// (`volumed_health_pass_seconds` is set after each one). On a restart the
/// first pass is asked at readiness, with the ASW already rebuilt, so it
/// covers every volume.
fn wait_health_pass(d: &Daemon, limit: Duration) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        let (code, body) = d.get("/metrics");
        let passed = code == 200
            && body.lines().any(|l| {
                l.strip_prefix("volumed_health_pass_seconds ")
                    .and_then(|v| v.trim().parse::<f64>().ok())
                    .is_some_and(|v| v > 0.0)
            });
        if passed {
            return true;
        }
        std::thread::sleep(MOUNTED_POLL);
    }
    false
}

/// The daemon's CPU over `window` while it holds `n` volumes and nothing
/// changes, as a share of one core.
fn idle_cpu(d: &Daemon, n: usize, window: Duration) {
    let before = cpu_ticks(d.pid());
    let threads_before = thread_ticks(d.pid());
    let t = Instant::now();
    std::thread::sleep(window);
    let ticks = cpu_ticks(d.pid()) - before;
    let secs = t.elapsed().as_secs_f64();
    println!(
        "  idle CPU at {n} volumes (the restarted daemon): {:.2} s over {secs:.1} s = {:.3}% of \
         one core; --poll-ms {}; by thread: {}",
        ticks as f64 / clk_tck(),
        100.0 * ticks as f64 / clk_tck() / secs,
        poll_ms(),
        threads_since(d.pid(), &threads_before)
    );
}

fn opt_ms(d: Option<Duration>) -> String {
    d.map_or("-".to_owned(), |d| format!("{:.0}", ms(d)))
}

fn print_table(rows: &[Row]) {
    println!();
    println!(
        "{:>6} | {:>20} | {:>24} | {:>16} | {:>18} | {:>12} | {:>12} | {:>12} | {:>13} | {:>16} | {:>13}",
        "pods",
        "first start → readyz",
        "all mounted (floor)",
        "restart → readyz",
        "read + parse",
        "restart/read",
        "raw read",
        "restart/raw",
        "graceful stop",
        "stop after restart",
        "stop at ready"
    );
    println!(
        "{}",
        "-".repeat(6 + 20 + 24 + 16 + 18 + 12 + 12 + 12 + 13 + 16 + 13 + 30)
    );
    for r in rows {
        println!(
            "{:>6} | {:>17.0} ms | {:>24} | {:>13.0} ms | {:>15.2} ms | {:>11.1}x | {:>9.2} ms | {:>11.1}x | {:>10.0} ms | {:>13.0} ms | {:>10.0} ms",
            r.pods,
            ms(r.first_ready),
            format!(
                "{} ms ({:.0} ms)",
                opt_ms(r.first_mounted),
                ms(r.floor_mounts)
            ),
            ms(r.restart_ready),
            ms(r.floors.read_parse),
            r.ratio(),
            ms(r.floors.raw),
            r.raw_ratio(),
            ms(r.stop),
            ms(r.restart_stop),
            ms(r.stop_at_ready)
        );
    }
    // the goal's range is judged against the raw read; below it, the
    // old bound against read + parse still catches a restart gone wrong
    let judged = |r: &&Row| match r.floors.judge("emptyDir node", r.pods, r.restart_ready) {
        Some(line) => {
            println!("{line}");
            line.starts_with("DEFECT")
        }
        None => r.pods < RESTART_GOAL_FROM && r.ratio() > DEFECT_RATIO,
    };
    let fixed_cost = |r: &Row| r.pods < DEFECT_FROM;
    for r in rows.iter().filter(judged) {
        let gap = r.restart_gap.as_ref().map_or(String::new(), |(_, what)| {
            format!("; the longest silence in its log before ready: {what}")
        });
        let slowest = r
            .phases
            .iter()
            .filter(|(s, p)| *s == "restart" && p.elapsed_ms.is_some())
            .max_by(|a, b| a.1.elapsed_ms.partial_cmp(&b.1.elapsed_ms).expect("no NaN"))
            .map_or(String::new(), |(_, p)| {
                format!(
                    "; the longest phase: {} {:.0} ms",
                    p.name,
                    p.elapsed_ms.unwrap_or(0.0)
                )
            });
        println!(
            "  {} pods: restart → readyz {:.0} ms, {}{slowest}{gap}",
            r.pods,
            ms(r.restart_ready),
            r.floors.ratios_text(r.restart_ready)
        );
        if fixed_cost(r) {
            println!(
                "  (not judged: below {DEFECT_FROM} pods a start's fixed cost is most of \
                 the restart, {:.1}x one mountinfo read + parse)",
                r.ratio()
            );
        } else if r.pods < RESTART_GOAL_FROM {
            println!(
                "DEFECT: at {} pods restart → readyz takes {:.1}x one mountinfo read + parse \
                 (over {DEFECT_RATIO:.0}x)",
                r.pods,
                r.ratio()
            );
        }
    }
}

/// How each time grows from one size to the next, and per doubling of the
/// node (`factor^(1 / log2(size ratio))`), which should be at most 2.
fn print_growth(rows: &[Row]) {
    println!();
    println!(
        "growth (each time's factor, then per doubling of the node; more than 2 is superlinear):"
    );
    for w in rows.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        let k = b.pods as f64 / a.pods as f64;
        let mut line = format!("  {} → {} pods (x{k:.1}):", a.pods, b.pods);
        let mut worse = Vec::new();
        let figures: [(&str, Option<Duration>, Option<Duration>); 6] = [
            ("first → readyz", Some(a.first_ready), Some(b.first_ready)),
            ("all mounted", a.first_mounted, b.first_mounted),
            (
                "restart → readyz",
                Some(a.restart_ready),
                Some(b.restart_ready),
            ),
            (
                "mountinfo read",
                Some(a.floors.read_parse),
                Some(b.floors.read_parse),
            ),
            ("raw read", Some(a.floors.raw), Some(b.floors.raw)),
            ("stop", Some(a.stop), Some(b.stop)),
        ];
        for (name, x, y) in figures {
            let (Some(x), Some(y)) = (x, y) else { continue };
            let f = y.as_secs_f64() / x.as_secs_f64();
            let per_doubling = f.powf(1.0 / k.log2());
            let _ = write!(line, " {name} x{f:.2} ({per_doubling:.2}/doubling);");
            if per_doubling > 2.0 {
                worse.push(name);
            }
        }
        println!("{}", line.trim_end_matches(';'));
        if !worse.is_empty() {
            println!("    more than doubles per doubling: {}", worse.join(", "));
        }
    }
}

fn print_memory(rows: &[Row]) {
    let (Some(lo), Some(hi)) = (rows.first(), rows.last()) else {
        return;
    };
    let line = |when: &str, kib: fn(&Row) -> (u64, u64)| {
        let ((rss, anon), (lo_rss, lo_anon)) = (kib(hi), kib(lo));
        let slope = if hi.pods > lo.pods {
            let per = |h: u64, l: u64| (h as f64 - l as f64) / (hi.pods - lo.pods) as f64;
            format!(
                "; its slope from {} volumes {:.2} KiB/volume (RssAnon {:.2})",
                lo.pods,
                per(rss, lo_rss),
                per(anon, lo_anon)
            )
        } else {
            String::new()
        };
        let per_volume = rss as f64 / hi.pods as f64;
        let verdict = match (hi.pods >= MEMORY_GOAL_AT, per_volume <= MEMORY_GOAL_KIB) {
            (false, _) => String::new(),
            (true, true) => format!("; within the goal of {MEMORY_GOAL_KIB} KiB/volume"),
            (true, false) => format!("; OVER the goal of {MEMORY_GOAL_KIB} KiB/volume"),
        };
        println!(
            "memory at {} volumes ({when}): VmRSS {rss} KiB = {per_volume:.2} KiB/volume, \
             RssAnon {anon} KiB{slope}{verdict}",
            hi.pods,
        );
    };
    line("first start, all mounted, after a health pass", |r| {
        (r.rss_kib, r.anon_kib)
    });
    line("restarted, after its first health pass", |r| {
        (r.restart_rss_kib, r.restart_anon_kib)
    });
}

fn write_csv(dir: &Path, rows: &[Row]) {
    let mut csv = String::from(
        "pods,volumes,first_ready_ms,first_dsw_ms,first_mounted_ms,floor_mounts_ms,stop_ms,\
         mountinfo_read_ms,mountinfo_raw_read_ms,restart_ready_ms,restart_mounted_ms,\
         restart_over_read,restart_stop_ms,rss_kib,rss_anon_kib,restart_rss_kib,\
         restart_rss_anon_kib,restart_over_raw_read,stop_at_ready_ms\n",
    );
    let o = |d: Option<Duration>| d.map_or(String::new(), |d| format!("{:.3}", ms(d)));
    for r in rows {
        let _ = writeln!(
            csv,
            "{},{},{:.3},{},{},{:.3},{:.3},{:.4},{:.4},{:.3},{},{:.2},{:.3},{},{},{},{},{:.2},{:.3}",
            r.pods,
            r.pods,
            ms(r.first_ready),
            o(r.first_dsw),
            o(r.first_mounted),
            ms(r.floor_mounts),
            ms(r.stop),
            ms(r.floors.read_parse),
            ms(r.floors.raw),
            ms(r.restart_ready),
            o(r.restart_mounted),
            r.ratio(),
            ms(r.restart_stop),
            r.rss_kib,
            r.anon_kib,
            r.restart_rss_kib,
            r.restart_anon_kib,
            r.raw_ratio(),
            ms(r.stop_at_ready)
        );
    }
    let mut phases = String::from("pods,start,phase,ends_at_ms,elapsed_ms\n");
    for r in rows {
        for (start, p) in &r.phases {
            let _ = writeln!(
                phases,
                "{},{start},{},{:.1},{}",
                r.pods,
                p.name,
                p.at_ms,
                p.elapsed_ms.map_or(String::new(), |e| format!("{e:.3}"))
            );
        }
    }
    fs::write(dir.join("scale.csv"), csv).expect("write scale.csv");
    fs::write(dir.join("phases.csv"), phases).expect("write phases.csv");
}

/// The curves against volumes, log-log, as an SVG.
fn draw_svg(path: &Path, rows: &[Row], note: &str) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    /// name, colour, points
    type Curve = (&'static str, RGBColor, Vec<(f64, f64)>);
    let series: [Curve; 6] = [
        (
            "first start → readyz",
            RGBColor(31, 119, 180),
            rows.iter()
                .map(|r| (r.pods as f64, r.first_ready.as_secs_f64()))
                .collect(),
        ),
        (
            "first start → all mounted",
            RGBColor(148, 103, 189),
            rows.iter()
                .filter_map(|r| Some((r.pods as f64, r.first_mounted?.as_secs_f64())))
                .collect(),
        ),
        (
            "floor: the same mkdirs + mounts, done directly",
            RGBColor(190, 170, 220),
            rows.iter()
                .map(|r| (r.pods as f64, r.floor_mounts.as_secs_f64()))
                .collect(),
        ),
        (
            "restart → readyz",
            RGBColor(214, 39, 40),
            rows.iter()
                .map(|r| (r.pods as f64, r.restart_ready.as_secs_f64()))
                .collect(),
        ),
        (
            "floor: one /proc/self/mountinfo read + parse",
            RGBColor(120, 120, 120),
            rows.iter()
                .map(|r| (r.pods as f64, r.floors.read_parse.as_secs_f64()))
                .collect(),
        ),
        (
            "floor: the kernel's raw read of /proc/self/mountinfo (no parse)",
            RGBColor(40, 40, 40),
            rows.iter()
                .map(|r| (r.pods as f64, r.floors.raw.as_secs_f64()))
                .collect(),
        ),
    ];
    // restart → readyz as if it grew linearly from its smallest size
    let linear: Vec<(f64, f64)> = rows
        .first()
        .map(|r0| {
            rows.iter()
                .map(|r| {
                    let k = r.pods as f64 / r0.pods as f64;
                    (r.pods as f64, r0.restart_ready.as_secs_f64() * k)
                })
                .collect()
        })
        .unwrap_or_default();
    let all = series.iter().flat_map(|s| s.2.iter()).chain(&linear);
    let (mut y_lo, mut y_hi) = (f64::MAX, f64::MIN);
    for &(_, y) in all {
        y_lo = y_lo.min(y);
        y_hi = y_hi.max(y);
    }
    let x_lo = rows.first().map_or(100.0, |r| r.pods as f64) / 1.3;
    let x_hi = rows.last().map_or(1000.0, |r| r.pods as f64) * 1.3;

    let area = SVGBackend::new(path, (960, 600)).into_drawing_area();
    area.fill(&WHITE)?;
    let (plot, footer) = area.split_vertically(570);
    footer.draw(&Text::new(
        note.to_owned(),
        (10, 8),
        ("sans-serif", 13).into_font().color(&RGBColor(90, 90, 90)),
    ))?;
    let mut chart = ChartBuilder::on(&plot)
        .caption(
            "volumed: startup time against volumes (log-log)",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (x_lo..x_hi).log_scale(),
            (y_lo / 1.5..y_hi * 1.5).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("volumes (static pods, one memory emptyDir each)")
        .y_desc("seconds")
        .x_labels(12)
        .x_max_light_lines(0)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y}"))
        .draw()?;
    for (name, color, points) in &series {
        let color = *color;
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(
            points
                .iter()
                .map(move |&p| Circle::new(p, 3, color.filled())),
        )?;
    }
    let grey = RGBColor(160, 160, 160);
    chart
        .draw_series(LineSeries::new(linear, grey.stroke_width(1)))?
        .label("linear growth from the smallest restart (slope 1)")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], grey.stroke_width(1)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    area.present()?;
    Ok(())
}

/// nproc and the load average, for the plot's footer.
fn machine_note() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    format!("{cpus} CPUs, load average {} at the end", load.join(" "))
}

fn main() {
    check_log_parser();
    let cfg = Config::from_env();
    if !require_root("the scale bench runs volumed, which makes real mounts") {
        return;
    }
    enter_private_mount_ns();
    let started = Instant::now();
    let scratch = Scratch::new("volumed-scale-bench-");
    let journals = journal_tempdir("volumed-scale-bench-journal-");
    let boot_file = boot_id_file(scratch.path());
    println!(
        "scale bench ({} mode): {:?} pods, one memory emptyDir each; binary {}; journals under {}; {}",
        if cfg.quick { "quick" } else { "full" },
        cfg.sizes,
        bench_support::BIN,
        journals.path().display(),
        machine_note().replace(" at the end", "")
    );
    let env = Env {
        cfg: &cfg,
        scratch: scratch.path(),
        journals: journals.path(),
        boot_file: &boot_file,
    };
    let mut rows = Vec::new();
    for (i, &n) in cfg.sizes.iter().enumerate() {
        match run_size(&env, n, i + 1 == cfg.sizes.len()) {
            Some(row) => rows.push(row),
            None => break,
        }
    }
    print_table(&rows);
    print_growth(&rows);
    print_memory(&rows);

    let out = std::env::var_os("VOLUMED_BENCH_SCALE_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("../scale"));
    mkdirs(&out);
    let out = out.canonicalize().unwrap_or(out);
    write_csv(&out, &rows);
    let note = format!("{}; regenerate: cargo bench --bench scale", machine_note());
    let mut svgs = vec![out.join("scale.svg")];
    if !cfg.quick && cfg.default_sizes {
        svgs.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/scale.svg"));
    }
    for svg in &svgs {
        if let Err(e) = draw_svg(svg, &rows, &note) {
            println!("plot {}: {e}", svg.display());
        }
    }
    println!(
        "wrote {} and {}",
        out.join("scale.csv").display(),
        svgs.iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "scale bench: done in {:.0} s",
        started.elapsed().as_secs_f64()
    );
}

/// Checks the log parser on the documented format before the run (a
/// harness = false bench has no `#[test]`s): a phase line, durations in
/// each unit, Debug values with spaces, a time with an offset.
fn check_log_parser() {
    let spawned = parse_rfc3339("2026-11-20T15:12:00Z").expect("a time");
    let l = parse_log_line(
        "2026-11-20T15:12:00.250000Z  INFO volumed::daemon: startup phase phase=mount_scan elapsed_ms=41.5 mounts=20001",
        spawned,
    )
    .expect("a phase line");
    assert!((l.at_ms - 250.0).abs() < 1e-6, "{l:?}");
    assert_eq!(l.message, "startup phase");
    assert_eq!(l.field("phase"), Some("mount_scan"));
    assert_eq!(l.elapsed_ms(), Some(41.5));
    assert_eq!(duration_field("elapsed", "12.5ms"), Some(12.5));
    assert_eq!(duration_field("took", "800µs"), Some(0.8));
    assert_eq!(duration_field("duration", "1.5s"), Some(1500.0));
    assert_eq!(duration_field("elapsed_us", "250"), Some(0.25));
    assert_eq!(duration_field("records", "12"), None);
    let l = parse_log_line(
        "2026-11-20T16:12:01+01:00  WARN volumed: odd one checkpoint=Some(3) gates=FeatureGates { a: true } path=\"/a b\"",
        spawned,
    )
    .expect("a line with an offset");
    assert!((l.at_ms - 1000.0).abs() < 1e-6, "{l:?}");
    assert_eq!(l.field("gates"), Some("FeatureGates { a: true }"));
    assert_eq!(l.field("path"), Some("/a b"));
    let l = parse_log_line(
        "2026-11-20T15:12:00Z  INFO volumed: labels off: no -o context= option is used mode=Auto",
        spawned,
    )
    .expect("a message with an = in it");
    assert_eq!(l.message, "labels off: no -o context= option is used");
    assert!(parse_log_line("thread 'main' panicked", spawned).is_none());
}
