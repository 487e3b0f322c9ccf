//! Journal append benchmark: what one durable [`Journal::append_record`] costs, next
//! to what the disk itself costs for the same bytes.
//!
//! `Journal::append_record` returns once its record is durable against the death
//! of the process. sled 0.34.7 gets there with `sync_file_range(WAIT_BEFORE |
//! WRITE | WAIT_AFTER)` on its log buffers, not `fsync` (see the journal
//! module docs: sled 0.34 syncs its log with `sync_file_range`, which
//! flushes no device cache), and the journal adds a `pwrite` of the
//! `acked` watermark after every group flush. So this bench measures, in one
//! run and in one directory on the same filesystem:
//!
//! 1. **Floors** — the cheapest way to make one record's bytes durable with
//!    no database at all, appending N bytes at a time to a plain file, where
//!    N is the size of one real encoded record as sled stores it (8-byte key
//!    + envelope; sled's own message header adds a few bytes more):
//!    - `pwrite` + `fdatasync`: the honest "on the disk" floor (flushes the
//!      device cache; the journal does NOT pay this);
//!    - `pwrite` + `sync_file_range(WAIT_BEFORE|WRITE|WAIT_AFTER)`: the floor
//!      of the mechanism sled actually uses — the number the journal should
//!      be compared with.
//! 2. **Journal appends** with 1, 8 and 64 concurrent appender threads on a
//!    fresh journal each: throughput, per-append latency p50/p99, flushes
//!    per record (group commit shares one flush among concurrent appenders),
//!    and the ratios to the floors.
//!
//! The ratios are printed, never asserted: latencies on shared VMs vary by
//! several times between runs, and sled's background
//! flusher adds a `sync_all` every 500 ms that lands in the p99s.
//!
//! Where: a tempdir under `$VOLUMED_BENCH_DIR`, else under cargo's
//! `CARGO_TARGET_TMPDIR` (inside the target dir, so on the real disk rather
//! than a tmpfs `/tmp`); the filesystem type is printed and a tmpfs is
//! warned about. The tempdir is removed at the end.
//!
//! Run: `cargo bench --bench journal`; `-- --quick` or
//! `VOLUMED_BENCH_QUICK=1` shrinks every count 10× (a CI smoke test).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::statfs;
use volumed::journal::envelope::{self, Kind};
use volumed::journal::record::{self, RecordV1};
use volumed::journal::{Body, Journal, JournalConfig, Record, now_ns};
use volumed::model::{
    Layout, Operation, PluginName, PodUid, SeLinuxContext, Steps, TargetKind, TargetParams,
    TargetRef, UniqueVolumeName,
};

const BOOT: &str = "6f1c2d3e-4a5b-4c6d-8e7f-901a2b3c4d5e";
const NODE: &str = "bench-node-0";
const APPENDERS: [usize; 3] = [1, 8, 64];

/// How many operations each part runs.
#[derive(Debug, Clone, Copy)]
struct Counts {
    /// timed operations per floor
    floor_ops: usize,
    /// timed records per journal configuration (split among the appenders)
    journal_records: usize,
    /// untimed operations before each measurement
    warmup: usize,
}

impl Counts {
    fn new(quick: bool) -> Self {
        let full = Self {
            floor_ops: 2_000,
            journal_records: 4_000,
            warmup: 100,
        };
        if quick {
            Self {
                floor_ops: full.floor_ops / 10,
                journal_records: full.journal_records / 10,
                warmup: full.warmup / 10,
            }
        } else {
            full
        }
    }
}

/// Latencies of one measurement.
#[derive(Debug, Clone)]
struct Stats {
    ops: usize,
    wall: Duration,
    p50_ns: u64,
    p99_ns: u64,
    flushes: Option<u64>,
}

impl Stats {
    fn new(mut lat_ns: Vec<u64>, wall: Duration, flushes: Option<u64>) -> Self {
        lat_ns.sort_unstable();
        Self {
            ops: lat_ns.len(),
            wall,
            p50_ns: percentile(&lat_ns, 500),
            p99_ns: percentile(&lat_ns, 990),
            flushes,
        }
    }

    fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    fn flushes_per_op(&self) -> Option<f64> {
        self.flushes.map(|f| f as f64 / (self.ops.max(1) as f64))
    }
}

/// Nearest-rank percentile of sorted values, `permille` in 0..=1000.
fn percentile(sorted: &[u64], permille: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (sorted.len() * permille).div_ceil(1000).max(1);
    sorted[rank.min(sorted.len()) - 1]
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// A realistic intent: a pod SetUp of a local PV, with kubelet paths, an
/// SELinux context and mount options — the biggest record kind the daemon
/// writes routinely. `(thread, i)` makes every target distinct.
fn intent(thread: usize, i: usize) -> Body {
    let layout = Layout::new("/var/lib/kubelet");
    let pod =
        PodUid::new(format!("{thread:08x}-5b1c-4e2a-9d7f-{i:012x}")).expect("pod uid is valid");
    let pv = format!("local-pv-{thread:04x}{i:06x}");
    let plugin = PluginName::LocalVolume;
    Body::Intent {
        op: Operation::SetUp,
        steps: Steps::Single,
        target: TargetParams::at(
            UniqueVolumeName::shared(plugin, &pv),
            plugin,
            pv.as_str().into(),
            TargetRef::Pod(pod.clone()),
            TargetKind::Mount,
            Some(layout.pod_target_path(&pod, plugin, &pv).into()),
        )
        .with_device_path(Some(
            PathBuf::from(format!("/mnt/disks/ssd{}", i % 4)).into(),
        ))
        .with_device_mount_path(Some(layout.local_device_path(&pv).into()))
        .with_selinux(Some(
            SeLinuxContext::parse("system_u:object_r:container_file_t:s0:c123,c456")
                .expect("selinux context is valid"),
        ))
        .with_mount_options(vec!["rw".into(), "relatime".into()].into())
        .with_fs_type(Some("ext4".into()))
        .into(),
    }
}

/// Bytes sled is given for one record: the 8-byte big-endian key plus the
/// sealed envelope, encoded exactly as `Journal::append_record` does.
fn record_bytes() -> (usize, usize) {
    let rec = Record {
        seq: 1_000,
        wall_time_ns: now_ns(),
        boot_id: BOOT.to_owned(),
        body: intent(3, 1_000),
    };
    let payload = record::encode(&RecordV1::from(&rec));
    let sealed = envelope::seal(0x5eed_5eed, Kind::Record, rec.seq, &payload);
    (8 + sealed.len(), sealed.len())
}

/// The filesystem type of `dir`: the statfs magic, and the name from
/// `/proc/self/mounts` (longest mount point containing `dir`), if found.
fn fs_type(dir: &Path) -> (String, bool) {
    let st = statfs::statfs(dir).expect("statfs of the bench dir");
    let magic = st.filesystem_type();
    let is_tmpfs = magic == statfs::TMPFS_MAGIC;
    let name = mount_fs_name(dir).unwrap_or_else(|| "unknown".to_owned());
    (format!("{name} (statfs magic {:#x})", magic.0), is_tmpfs)
}

fn mount_fs_name(dir: &Path) -> Option<String> {
    let dir = dir.canonicalize().ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let (_dev, mp, ty) = (f.next()?, f.next()?, f.next()?);
            let mp = mp.replace("\\040", " ").replace("\\011", "\t");
            dir.starts_with(&mp).then(|| (mp.len(), ty.to_owned()))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, ty)| ty)
}

/// `sync_file_range(fd, off, len, WAIT_BEFORE | WRITE | WAIT_AFTER)`, what
/// sled 0.34.7 calls on Linux to make its log durable.
fn sync_file_range(file: &File, off: u64, len: usize) -> io::Result<()> {
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    let off = off.try_into().expect("offset fits off_t");
    let len = len.try_into().expect("length fits off_t");
    // SAFETY: `file` is borrowed for the whole call, so the descriptor is open
    // and ours; sync_file_range takes only integers and touches none of our
    // memory.
    let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), off, len, flags) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Appends `len` bytes at a time to a new file at `path`, each followed by
/// `sync`; times `ops` of them after `warmup` untimed ones.
fn floor(
    path: &Path,
    len: usize,
    counts: Counts,
    sync: impl Fn(&File, u64, usize) -> io::Result<()>,
) -> Stats {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .expect("create floor file");
    let buf = vec![0xa5u8; len];
    let step = u64::try_from(len).expect("record length fits u64");
    let mut off = 0u64;
    let one = |off: u64| {
        file.write_all_at(&buf, off).expect("pwrite floor file");
        sync(&file, off, len).expect("sync floor file");
    };
    for _ in 0..counts.warmup {
        one(off);
        off += step;
    }
    let mut lat = Vec::with_capacity(counts.floor_ops);
    let start = Instant::now();
    for _ in 0..counts.floor_ops {
        let t = Instant::now();
        one(off);
        lat.push(nanos(t.elapsed()));
        off += step;
    }
    Stats::new(lat, start.elapsed(), None)
}

/// `records` appends split among `threads` appenders on a fresh journal in
/// `dir`, all released at once.
fn journal_run(dir: &Path, threads: usize, counts: Counts) -> Stats {
    let (journal, _replay) =
        Journal::open(&JournalConfig::new(dir, NODE, BOOT)).expect("open journal");
    let journal = Arc::new(journal);
    // Untimed: lets sled allocate its first segment and warm its caches.
    for i in 0..counts.warmup {
        journal
            .append_record(intent(usize::MAX, i))
            .expect("warm-up append");
    }
    let flushes_before = journal.flush_count();
    let barrier = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let share = counts.journal_records / threads
                + usize::from(t < counts.journal_records % threads);
            let journal = Arc::clone(&journal);
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                let bodies: Vec<Body> = (0..share).map(|i| intent(t, i)).collect();
                let mut lat = Vec::with_capacity(share);
                barrier.wait();
                for body in bodies {
                    let start = Instant::now();
                    journal.append_record(body).expect("journal append");
                    lat.push(nanos(start.elapsed()));
                }
                lat
            })
        })
        .collect();
    let start = Instant::now();
    barrier.wait();
    let mut lat = Vec::with_capacity(counts.journal_records);
    for h in handles {
        lat.extend(h.join().expect("appender thread panicked"));
    }
    let wall = start.elapsed();
    let flushes = journal.flush_count() - flushes_before;
    Arc::try_unwrap(journal)
        .expect("every appender thread has been joined")
        .close()
        .expect("close journal");
    Stats::new(lat, wall, Some(flushes))
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick")
        || std::env::var("VOLUMED_BENCH_QUICK").is_ok_and(|v| v == "1");
    let counts = Counts::new(quick);
    let base = std::env::var_os("VOLUMED_BENCH_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")), PathBuf::from);
    std::fs::create_dir_all(&base).expect("create bench base dir");
    let tmp = tempfile::Builder::new()
        .prefix("journal-bench-")
        .tempdir_in(&base)
        .expect("create bench tempdir");
    let dir = tmp.path();
    let (fs, is_tmpfs) = fs_type(dir);
    let (n, envelope_len) = record_bytes();

    println!(
        "volumed journal bench (sled 0.34.7){}",
        if quick { ", --quick" } else { "" }
    );
    println!("dir:    {}", dir.display());
    println!("fs:     {fs}");
    if is_tmpfs {
        println!(
            "WARNING: the bench dir is on tmpfs: every sync is a no-op and the floors mean \
             nothing; set VOLUMED_BENCH_DIR to a dir on a real disk"
        );
    }
    println!(
        "record: N = {n} bytes (8-byte key + {envelope_len}-byte envelope of a local-PV SetUp intent)"
    );
    println!(
        "counts: {} ops per floor, {} records per journal configuration, {} warm-up each",
        counts.floor_ops, counts.journal_records, counts.warmup
    );

    let fds = floor(&dir.join("floor-fdatasync"), n, counts, |f, _, _| {
        f.sync_data()
    });
    let sfr = floor(
        &dir.join("floor-sync-file-range"),
        n,
        counts,
        sync_file_range,
    );
    let mut rows = vec![
        ("floor pwrite+fdatasync".to_owned(), fds.clone()),
        ("floor pwrite+sync_file_range".to_owned(), sfr.clone()),
    ];
    for threads in APPENDERS {
        let stats = journal_run(&dir.join(format!("journal-{threads}")), threads, counts);
        let label = format!(
            "journal, {threads} appender{}",
            if threads == 1 { "" } else { "s" }
        );
        rows.push((label, stats));
    }

    println!();
    println!(
        "{:<30} {:>6} {:>9} {:>8} {:>8} {:>9} {:>8} {:>8} {:>9} {:>9}",
        "what",
        "ops",
        "ops/s",
        "p50 ms",
        "p99 ms",
        "flush/rec",
        "p50/sfr",
        "p50/fds",
        "tput/sfr",
        "tput/fds"
    );
    for (label, s) in &rows {
        println!(
            "{:<30} {:>6} {:>9.0} {:>8.3} {:>8.3} {:>9} {:>7.2}x {:>7.2}x {:>8.2}x {:>8.2}x",
            label,
            s.ops,
            s.ops_per_sec(),
            ms(s.p50_ns),
            ms(s.p99_ns),
            s.flushes_per_op()
                .map_or_else(|| "-".to_owned(), |f| format!("{f:.3}")),
            s.p50_ns as f64 / sfr.p50_ns.max(1) as f64,
            s.p50_ns as f64 / fds.p50_ns.max(1) as f64,
            s.ops_per_sec() / sfr.ops_per_sec(),
            s.ops_per_sec() / fds.ops_per_sec(),
        );
    }
    println!(
        "(sfr = the pwrite+sync_file_range floor, fds = the pwrite+fdatasync floor; \
         ops/s of a journal row = records/s over all its appenders)"
    );
    println!();

    let one = &rows[2].1;
    let many = &rows[4].1;
    println!(
        "journal bench: 1 appender p50 {:.2}x sync_file_range floor; 64 appenders {:.0} rec/s ({:.3} flushes/record)",
        one.p50_ns as f64 / sfr.p50_ns.max(1) as f64,
        many.ops_per_sec(),
        many.flushes_per_op().unwrap_or(0.0),
    );

    let path = dir.to_path_buf();
    tmp.close().expect("remove bench tempdir");
    assert!(!path.exists(), "bench tempdir removed");
}
