//! What the daemon benches share (`benches/daemon.rs`, `benches/scale.rs`,
//! `benches/csi.rs`): spawning the real `volumed run` binary and waiting on
//! its `/readyz` and `/metrics`, a minimal HTTP client, a fresh ext4 root on
//! an autoclear loop device, and the process figures read from
//! `/proc/<pid>` (CPU ticks, RSS).
//!
//! Included with `#[path = "support/mod.rs"] mod bench_support;` next to
//! `#[path = "../tests/support/mod.rs"] mod support;` (the mount and loop
//! device harness, reached here as `crate::support`). Every helper runs in
//! the bench's private mount namespace, which the bench enters first.
#![allow(dead_code)] // each bench uses a different part

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::support::{LoopDevice, bind_mount, mkdirs};

/// The release binary `cargo bench` builds beside the bench.
pub const BIN: &str = env!("CARGO_BIN_EXE_volumed");
pub const NODE: &str = "bench-node";
/// How often the bench asks the daemon's `/readyz` or `/metrics` while
/// waiting for something slow.
pub const POLL: Duration = Duration::from_millis(20);
/// How often [`Daemon::wait_mounted`] asks: the clock stops at the first
/// answer that shows every volume, so it reads up to this late. Each ask
/// costs the daemon one `/metrics` render, which is small next to the work
/// it waits for.
pub const MOUNTED_POLL: Duration = Duration::from_millis(5);

/// Quick mode: `--quick`, `VOLUMED_BENCH_QUICK=1`, or a run without
/// `--bench` (`cargo test --benches`).
pub fn quick_mode() -> bool {
    let args: Vec<String> = std::env::args().collect();
    args.iter().any(|a| a == "--quick")
        || std::env::var("VOLUMED_BENCH_QUICK").is_ok_and(|v| v == "1")
        || !args.iter().any(|a| a == "--bench")
}

/// Where journals go: `$VOLUMED_BENCH_DIR`, else cargo's
/// `CARGO_TARGET_TMPDIR` (the real disk, not a tmpfs).
pub fn journal_base() -> PathBuf {
    std::env::var_os("VOLUMED_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")))
}

/// A fresh dir for journals under [`journal_base`], named `prefix…`.
pub fn journal_tempdir(prefix: &str) -> tempfile::TempDir {
    let base = journal_base();
    mkdirs(&base);
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(base)
        .expect("journal tempdir")
}

/// Writes this boot's id into `dir/boot_id` (what the daemons are given as
/// `--boot-id-file`) and returns the file.
pub fn boot_id_file(dir: &Path) -> PathBuf {
    let file = dir.join("boot_id");
    let id = volumed::host::boot::read_boot_id(None).expect("boot id");
    fs::write(&file, id.as_str().to_owned() + "\n").expect("write boot id");
    file
}

/// Pod `i`'s UID.
pub fn uid(i: usize) -> String {
    format!("00000000-0000-4000-8000-{i:012}")
}

/// Writes `manifest(i)` for each `i` in `range` into `dir` as
/// `bench-<i>.json`, each under a name the sources skip and then renamed,
/// so no poll sees half a file.
pub fn write_pods(range: std::ops::Range<usize>, dir: &Path, manifest: impl Fn(usize) -> String) {
    mkdirs(dir);
    for i in range {
        let tmp = dir.join(format!(".bench-{i:05}.json.tmp"));
        fs::write(&tmp, manifest(i)).expect("write pod manifest");
        fs::rename(&tmp, dir.join(format!("bench-{i:05}.json"))).expect("rename pod manifest");
    }
}

/// Makes `root` a shared bind mount of itself, as the daemon does its own.
pub fn shared_root(root: &Path) {
    mkdirs(root);
    bind_mount(root, root);
    mount(
        None::<&str>,
        root,
        None::<&str>,
        MsFlags::MS_SHARED | MsFlags::MS_REC,
        None::<&str>,
    )
    .expect("make root shared");
}

/// A freshly made ext4 (sparse image, loop device with autoclear) mounted on
/// `dir`. Daemon and floor roots live on one each: on a filesystem that
/// earlier runs and tests filled and emptied, ext4's inode allocator scans
/// the recently deleted inodes on every `mkdir` (perf: `__ext4_new_inode →
/// find_inode_bit → recently_deleted`), which made the same floor take
/// 0.07 s or 1.1 s from one run to the next. ext4 gets one inode per 16 KiB
/// at 512 MiB and more, so `size_mb` sets how many dirs fit.
pub fn fresh_ext4(dir: &Path, size_mb: u64) -> LoopDevice {
    let image = dir.with_extension("img");
    crate::support::mkfs_ext4(&image, size_mb);
    let dev = LoopDevice::attach(&image);
    mkdirs(dir);
    crate::support::mount_device(dev.path(), dir, "ext4");
    dev
}

/// Detaches the fresh ext4 on `fs` (with whatever is mounted below it),
/// then its loop device, and removes the image.
pub fn drop_ext4(fs: &Path, dev: LoopDevice) {
    umount2(fs, MntFlags::MNT_DETACH).expect("detach the bench's ext4");
    drop(dev);
    let _ = fs::remove_file(fs.with_extension("img"));
}

/// Stops a daemon (printing how long SIGTERM took), then detaches the fresh
/// ext4 its root was on and its loop device.
pub fn stop_on_ext4(daemon: Daemon, fs: &Path, dev: LoopDevice) {
    let stop = daemon.stop();
    println!("  SIGTERM to exit: {:.0} ms", stop.as_secs_f64() * 1e3);
    drop_ext4(fs, dev);
}

/// `--poll-ms` for the daemons: 100, or `VOLUMED_BENCH_POLL_MS`.
pub fn poll_ms() -> String {
    std::env::var("VOLUMED_BENCH_POLL_MS").unwrap_or_else(|_| "100".into())
}

/// More `volumed run` arguments from `VOLUMED_BENCH_DAEMON_ARGS` (split on
/// whitespace), for experiments such as `--journal off`.
pub fn extra_args() -> Vec<String> {
    std::env::var("VOLUMED_BENCH_DAEMON_ARGS")
        .map(|v| v.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// A spawned `volumed run`, SIGKILLed if dropped while still running.
pub struct Daemon {
    child: Child,
    addr: String,
    /// `<journal-dir>/api.sock`, where everything but the probes is served
    socket: PathBuf,
    log: PathBuf,
    root: PathBuf,
    /// when it was spawned, on the bench's clock and on the wall clock (the
    /// log's timestamps)
    pub spawned: Instant,
    pub spawned_wall: SystemTime,
}

impl Daemon {
    /// Spawns `volumed run` on `root` and waits for its `daemon.json` (the
    /// HTTP server is up then). `objects`: its `--static-objects`, if any.
    pub fn start(
        root: &Path,
        journal: &Path,
        pods: &Path,
        objects: Option<&Path>,
        boot_file: &Path,
        log: PathBuf,
    ) -> Daemon {
        Daemon::start_with(root, journal, pods, objects, boot_file, log, &[])
    }

    /// [`Daemon::start`] with more `volumed run` arguments (before those of
    /// [`extra_args`]), e.g. `--csi-driver NAME=SOCKET`.
    pub fn start_with(
        root: &Path,
        journal: &Path,
        pods: &Path,
        objects: Option<&Path>,
        boot_file: &Path,
        log: PathBuf,
        args: &[String],
    ) -> Daemon {
        let mut cmd = Command::new(BIN);
        cmd.arg("run")
            .arg("--root-dir")
            .arg(root)
            .arg("--journal-dir")
            .arg(journal)
            .arg("--static-pods")
            .arg(pods);
        if let Some(objects) = objects {
            cmd.arg("--static-objects").arg(objects);
        }
        cmd.args(["--listen", "127.0.0.1:0", "--node-name", NODE])
            .arg("--boot-id-file")
            .arg(boot_file)
            .args(["--poll-ms", &poll_ms()])
            .args(args)
            .args(extra_args())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).expect("daemon log file"));
        let spawned_wall = SystemTime::now();
        let spawned = Instant::now();
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {BIN}: {e}"));
        let mut d = Daemon {
            child,
            addr: String::new(),
            socket: volumed::server::api_socket::path(journal),
            log,
            root: root.to_owned(),
            spawned,
            spawned_wall,
        };
        let info = journal.join("daemon.json");
        let deadline = Instant::now() + Duration::from_secs(600);
        while !info.exists() {
            d.check_alive();
            assert!(Instant::now() < deadline, "no daemon.json after 600 s");
            std::thread::sleep(Duration::from_millis(2));
        }
        let v: serde_json::Value =
            serde_json::from_slice(&fs::read(&info).expect("read daemon.json"))
                .expect("parse daemon.json");
        d.addr = v["listen"].as_str().expect("listen address").to_owned();
        d
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).expect("pid fits i32"))
    }

    /// The daemon's stderr so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_tail(&self) -> String {
        let log = self.log_text();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    pub fn check_alive(&mut self) {
        if let Some(s) = self.child.try_wait().expect("wait daemon") {
            panic!(
                "the daemon exited early ({s}); log tail:\n{}",
                self.log_tail()
            );
        }
    }

    /// One GET: the probes and `/metrics` on the TCP listener, everything
    /// else on the socket (the TCP listener answers it 403).
    pub fn get(&self, path: &str) -> (u16, String) {
        let bare = path.split('?').next().unwrap_or_default();
        if matches!(bare, "/healthz" | "/readyz" | "/metrics") {
            return http_get(&self.addr, path);
        }
        crate::support::daemon::unix_get(&self.socket, path, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("GET {path} on {}: {e}", self.socket.display()))
    }

    /// Waits (asking every `poll`, at most `limit`) until `/readyz` says
    /// 200: the time since the spawn.
    pub fn wait_ready(&mut self, poll: Duration, limit: Duration) -> Duration {
        loop {
            self.check_alive();
            if self.get("/readyz").0 == 200 {
                return self.spawned.elapsed();
            }
            assert!(
                self.spawned.elapsed() < limit,
                "not ready {:.0} s after the spawn",
                limit.as_secs_f64()
            );
            std::thread::sleep(poll);
        }
    }

    /// (desired, actual) volume counts from `/metrics`.
    pub fn volume_counts(&self) -> (u64, u64) {
        let (status, body) = self.get("/metrics");
        assert_eq!(status, 200, "/metrics: {body}");
        let (mut dsw, mut asw) = (0, 0);
        for line in body.lines() {
            let Some(rest) = line.strip_prefix("volume_manager_total_volumes{") else {
                continue;
            };
            let n: u64 = rest
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
            if rest.contains("state=\"actual_state_of_world\"") {
                asw += n;
            } else if rest.contains("state=\"desired_state_of_world\"") {
                dsw += n;
            }
        }
        (dsw, asw)
    }

    /// Waits until the ASW holds `want` mounted volumes: the times (from
    /// `since`) at which the DSW and the ASW reached it, or `None` on timeout.
    pub fn wait_mounted(
        &mut self,
        want: u64,
        since: Instant,
        limit: Duration,
    ) -> Option<(Duration, Duration)> {
        let mut dsw_at = None;
        loop {
            self.check_alive();
            let (dsw, asw) = self.volume_counts();
            if dsw_at.is_none() && dsw >= want {
                dsw_at = Some(since.elapsed());
            }
            if asw >= want {
                let at = since.elapsed();
                return Some((dsw_at.unwrap_or(at), at));
            }
            if since.elapsed() > limit {
                println!(
                    "  gave up after {:.0} s: DSW {dsw}, ASW {asw} of {want} volumes",
                    limit.as_secs_f64()
                );
                return None;
            }
            std::thread::sleep(MOUNTED_POLL);
        }
    }

    /// SIGTERM and wait (bounded; SIGKILL after 120 s): how long it took.
    /// The mounts stay (the namespace holds them), for a restart.
    pub fn stop_keep_mounts(mut self) -> Duration {
        let start = Instant::now();
        let _ = kill(self.pid(), Signal::SIGTERM);
        let deadline = start + Duration::from_secs(120);
        while self.child.try_wait().expect("wait daemon").is_none() {
            if Instant::now() > deadline {
                println!("  the daemon did not stop within 120 s of SIGTERM; killed");
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        start.elapsed()
    }

    /// SIGKILL and wait (a crash: no shutdown work at all). The mounts stay,
    /// and so does its `daemon.json`: remove it before a restart.
    pub fn kill_keep_mounts(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// [`Daemon::stop_keep_mounts`], then detach the root's mounts.
    pub fn stop(self) -> Duration {
        let root = self.root.clone();
        let took = self.stop_keep_mounts();
        let _ = umount2(&root, MntFlags::MNT_DETACH);
        took
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A minimal HTTP/1.1 GET (`Connection: close`): status and body.
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send request");
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).expect("read response");
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, body.to_owned())
}

/// utime + stime of `pid` in clock ticks (`/proc/<pid>/stat` fields 14, 15).
pub fn cpu_ticks(pid: Pid) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("read stat");
    // the command may hold spaces: fields are counted after the last ')'
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state), so field 14 is index 11
    f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
}

/// Waits `min`, then until the daemon has used no CPU for a second (its
/// start's leftovers walk, first sweep and trims are over: what RSS then
/// shows is what it keeps), at most `limit`: the time waited.
pub fn settle_cpu(pid: Pid, min: Duration, limit: Duration) -> Duration {
    let t = Instant::now();
    std::thread::sleep(min);
    let mut last = cpu_ticks(pid);
    let mut quiet_since = Instant::now();
    while t.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(250));
        let now = cpu_ticks(pid);
        if now != last {
            last = now;
            quiet_since = Instant::now();
        } else if quiet_since.elapsed() >= Duration::from_secs(1) {
            break;
        }
    }
    t.elapsed()
}

/// utime + stime per thread name of `pid`, in clock ticks.
pub fn thread_ticks(pid: Pid) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let Ok(stat) = fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = stat[open + 1..close].to_owned();
        let f: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        let ticks = f.get(11).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0)
            + f.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
        *out.entry(name).or_insert(0) += ticks;
    }
    out
}

/// The CPU each thread of `pid` used since `before` (from [`thread_ticks`]),
/// as `name 0.12 s` items, busiest first; threads that used none are left out.
pub fn threads_since(pid: Pid, before: &std::collections::BTreeMap<String, u64>) -> String {
    let mut used: Vec<(String, u64)> = thread_ticks(pid)
        .into_iter()
        .filter_map(|(name, t)| {
            let d = t.saturating_sub(before.get(&name).copied().unwrap_or(0));
            (d > 0).then_some((name, d))
        })
        .collect();
    used.sort_by_key(|u| std::cmp::Reverse(u.1));
    used.iter()
        .map(|(name, d)| format!("{name} {:.2} s", *d as f64 / clk_tck()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// (VmRSS, RssAnon) of `pid` in KiB.
pub fn rss_kib(pid: Pid) -> (u64, u64) {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("RssAnon:"))
}

/// How many mounts there are strictly below `root` in this namespace.
pub fn mounts_below(root: &Path) -> usize {
    let table = volumed::host::mountinfo::MountTable::read_self().expect("read mountinfo");
    table
        .entries()
        .iter()
        .filter(|m| m.mount_point.starts_with(root) && m.mount_point != root)
        .count()
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`).
pub fn clk_tck() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// The median of `times` (sorted in place).
pub fn median(times: &mut [Duration]) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// The restart goal (issue 43): spawn to `/readyz` 200 after a stop within
/// this many times the kernel's raw read of the mount table, judged from
/// [`RESTART_GOAL_FROM`] to [`RESTART_GOAL_TO`] pods.
pub const RESTART_GOAL_RAW: f64 = 5.0;
pub const RESTART_GOAL_FROM: usize = 10_000;
pub const RESTART_GOAL_TO: usize = 50_000;

/// The floors a restart is judged by, each the median of its runs: the
/// kernel's raw read of `/proc/self/mountinfo` (its bytes with `std::fs`,
/// nothing of ours, no parse), and one read and parse of it with our own
/// parser (`MountTable::read`), which a slower parser would make easier to
/// beat.
#[derive(Debug, Clone, Copy)]
pub struct TableFloors {
    pub raw: Duration,
    pub read_parse: Duration,
    /// the mount table's lines
    pub entries: usize,
    /// its bytes
    pub bytes: usize,
}

/// [`TableFloors`] of this namespace's mount table, `runs` reads of each
/// kind, alternated.
pub fn table_floors(runs: usize) -> TableFloors {
    let path = Path::new("/proc/self/mountinfo");
    let (mut raw, mut parsed) = (Vec::new(), Vec::new());
    let (mut entries, mut bytes) = (0, 0);
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        let read = fs::read(path).expect("read mountinfo");
        raw.push(t.elapsed());
        bytes = read.len();
        drop(read);
        let t = Instant::now();
        let table = volumed::host::mountinfo::MountTable::read(path).expect("read mountinfo");
        parsed.push(t.elapsed());
        entries = table.entries().len();
    }
    TableFloors {
        raw: median(&mut raw),
        read_parse: median(&mut parsed),
        entries,
        bytes,
    }
}

impl TableFloors {
    /// A restart's ratio to the raw read.
    pub fn over_raw(&self, restart: Duration) -> f64 {
        restart.as_secs_f64() / self.raw.as_secs_f64()
    }

    /// A restart's ratio to the read and parse.
    pub fn over_parse(&self, restart: Duration) -> f64 {
        restart.as_secs_f64() / self.read_parse.as_secs_f64()
    }

    /// `raw read 18.0 ms (6.8x), read + parse 45.2 ms (2.7x)`: both
    /// floors with `restart`'s ratio to each.
    pub fn ratios_text(&self, restart: Duration) -> String {
        format!(
            "raw read {:.2} ms ({:.1}x), read + parse {:.2} ms ({:.1}x)",
            self.raw.as_secs_f64() * 1e3,
            self.over_raw(restart),
            self.read_parse.as_secs_f64() * 1e3,
            self.over_parse(restart)
        )
    }

    /// The verdict on a restart over `pods` pods (`what` names the node):
    /// `DEFECT: …` over [`RESTART_GOAL_RAW`]x the raw read inside the
    /// goal's range, `within the goal …` under it, `None` outside the range.
    pub fn judge(&self, what: &str, pods: usize, restart: Duration) -> Option<String> {
        if !(RESTART_GOAL_FROM..=RESTART_GOAL_TO).contains(&pods) {
            return None;
        }
        let ratio = self.over_raw(restart);
        let figures = format!(
            "{:.0} ms against a raw read of {:.2} ms ({} lines, {} KiB), {ratio:.1}x; \
             {:.1}x read + parse",
            restart.as_secs_f64() * 1e3,
            self.raw.as_secs_f64() * 1e3,
            self.entries,
            self.bytes / 1024,
            self.over_parse(restart)
        );
        Some(match ratio > RESTART_GOAL_RAW {
            true => format!(
                "DEFECT: {what} at {pods} pods: restart → readyz over {RESTART_GOAL_RAW:.0}x \
                 the raw read of the mount table: {figures}"
            ),
            false => format!(
                "{what} at {pods} pods: restart → readyz within {RESTART_GOAL_RAW:.0}x the raw \
                 read of the mount table: {figures}"
            ),
        })
    }
}
