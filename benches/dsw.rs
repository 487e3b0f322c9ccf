//! Desired-state benchmark: what populating the DSW with N pods costs per
//! pod, and whether that cost stays flat as N grows (a pod's event should
//! cost O(its volumes), so the total is linear in the node's size).
//!
//! Pure, in one process, no root: each pod has two volumes, a memory
//! emptyDir and a local PV of its own (the mix of the daemon bench), and is
//! given to the DSW the way the sources give it, through
//! [`apply_event`]. Per size, median of several runs each, per pod:
//!
//! - **floor**: building the pods' data (the [`DesiredPod`]s with their
//!   UIDs, names and specs), which no population can skip, and putting
//!   their volume names into a sorted map and taking them out again, the
//!   least a state keyed by volume does (it slows with N as the DSW's own
//!   trees do, as the caches fill);
//! - **populate**: `PodAdded` for every pod into an empty DSW;
//! - **update**: `PodUpdated` (same volumes) for every pod of the full DSW,
//!   what a change of the objects that every pod's claim reads sends;
//! - **delete**: `PodRemoved` for every pod.
//!
//! Each line prints the three against the floor; the last lines compare
//! each one's ratio to the floor at the largest size with the smallest
//! one and say whether it stays flat (a linear total) or grows. The bytes
//! the DSW holds per volume (counted by a wrapping allocator: requested
//! sizes, without the allocator's own headers and rounding) are printed
//! too.
//!
//! Sizes: 1,000, 5,000, 10,000 and 20,000 pods; 250, 1,000 and 4,000
//! with `--quick` or `VOLUMED_BENCH_QUICK=1`, and also when run
//! without `--bench` (`cargo test --benches` smoke run). Nothing asserts a
//! timing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{BTreeMap, BTreeSet};
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use volumed::model::{AccessMode, PodUid, PodVolume, StorageMedium, VolumeSpec};
use volumed::selinux::{PodSeLinux, Policy};
use volumed::sources::{DesiredPod, SourceEvent, apply_event};
use volumed::state::DesiredStateOfWorld;

/// The system allocator, counting the bytes live.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded to `System` unchanged; only a counter is
// updated beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

fn quick() -> bool {
    let args: Vec<String> = std::env::args().collect();
    args.iter().any(|a| a == "--quick")
        || std::env::var("VOLUMED_BENCH_QUICK").is_ok_and(|v| v == "1")
        || !args.iter().any(|a| a == "--bench")
}

/// Pod `i`: a memory emptyDir `cache` and a claim of its own local PV.
fn pod(i: usize) -> DesiredPod {
    let uid = PodUid::new(format!("00000000-0000-4000-8000-{i:012}")).expect("a valid UID");
    let cache = VolumeSpec::EmptyDir {
        medium: StorageMedium::Memory,
        size_limit: None,
    };
    let pv = format!("pv-{i}");
    let local = VolumeSpec::Local {
        path: PathBuf::from(format!("/dev/disk/by-id/{pv}")).into(),
        fs_type: Some("ext4".into()),
        access_modes: vec![AccessMode::ReadWriteOncePod],
        mount_options: vec![],
        is_block: true,
        volume_mode: Default::default(),
    };
    let volumes = vec![
        PodVolume {
            volume: PodVolume::unique_name(&cache, &uid, "cache"),
            spec_name: "cache".into(),
            outer_name: "cache".into(),
            spec: Arc::new(cache),
            selinux: None,
            csi_pod: None,
            read_only: false,
            fs_group: None,
            supplemental_gid: None,
        },
        PodVolume {
            volume: PodVolume::unique_name(&local, &uid, &pv),
            spec_name: pv,
            outer_name: "data".into(),
            spec: Arc::new(local),
            selinux: None,
            csi_pod: None,
            read_only: false,
            fs_group: None,
            supplemental_gid: None,
        },
    ];
    DesiredPod {
        uid,
        namespace: "default".into(),
        name: format!("app-{i}-node"),
        file: PathBuf::from(format!("/etc/volumed/pods/app-{i}.yaml")),
        volumes,
        unresolved: BTreeSet::new(),
        errors: Vec::new(),
        selinux: PodSeLinux::default(),
        claims: Default::default(),
        containers: Vec::new(),
    }
}

fn pods(n: usize) -> Vec<DesiredPod> {
    (0..n).map(pod).collect()
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// Nanoseconds per pod.
fn per_pod(d: Duration, n: usize) -> f64 {
    d.as_secs_f64() * 1e9 / n as f64
}

/// One size's medians per pod (ns) and the DSW's bytes per volume.
struct Figures {
    pods: usize,
    floor: f64,
    populate: f64,
    update: f64,
    delete: f64,
    bytes_per_volume: f64,
}

fn measure(n: usize, runs: usize, policy: &Policy) -> Figures {
    let (mut floor, mut populate, mut update, mut delete) = (vec![], vec![], vec![], vec![]);
    let mut bytes = 0;
    for _ in 0..runs {
        // the updates' data, built untimed: the same pods again
        let again = pods(n);
        let uids: Vec<PodUid> = again.iter().map(|p| p.uid.clone()).collect();
        let before = live();
        // the floor: building the pods' data, and their volume names put
        // into a sorted map and taken out again, the least a state keyed by
        // volume does (it slows with N as the DSW's own trees do)
        let t = Instant::now();
        let built = black_box(pods(n));
        let mut names = BTreeMap::new();
        for v in built.iter().flat_map(|p| &p.volumes) {
            names.insert(v.volume.clone(), ());
        }
        for v in again.iter().flat_map(|p| &p.volumes) {
            black_box(names.remove(&v.volume));
        }
        floor.push(t.elapsed());
        drop(names);

        let mut dsw = DesiredStateOfWorld::new();
        let t = Instant::now();
        for p in built {
            black_box(apply_event(&mut dsw, SourceEvent::PodAdded(p), policy));
        }
        populate.push(t.elapsed());
        // the pods were consumed: what is left beyond `before` is the DSW
        bytes = live() - before;
        let t = Instant::now();
        for p in again {
            black_box(apply_event(&mut dsw, SourceEvent::PodUpdated(p), policy));
        }
        update.push(t.elapsed());
        let t = Instant::now();
        for uid in uids {
            black_box(apply_event(&mut dsw, SourceEvent::PodRemoved(uid), policy));
        }
        delete.push(t.elapsed());
        assert!(dsw.volumes().next().is_none(), "every pod deleted");
    }
    Figures {
        pods: n,
        floor: per_pod(median(floor), n),
        populate: per_pod(median(populate), n),
        update: per_pod(median(update), n),
        delete: per_pod(median(delete), n),
        bytes_per_volume: bytes as f64 / (2 * n) as f64,
    }
}

/// Flat: the largest size's ratio to its floor within this factor of the
/// smallest's (on a busy machine the ratios wander by up to about 2x). A
/// walk of the node per pod makes the ratio grow with N itself.
const FLAT_WITHIN: f64 = 3.0;

fn main() {
    let quick = quick();
    let sizes: &[usize] = match quick {
        true => &[250, 1_000, 4_000],
        false => &[1_000, 5_000, 10_000, 20_000],
    };
    let policy = Policy::disabled();
    // warm up the allocator and the code once
    measure(sizes[0], 1, &policy);
    let mut all = Vec::new();
    for &n in sizes {
        // small sizes are quick and noisier: more runs
        let runs = (40_000 / n).clamp(5, 40);
        let f = measure(n, runs, &policy);
        let x = |ns: f64| ns / f.floor;
        println!(
            "dsw bench: {:>6} pods: floor {:>5.0} ns/pod; populate {:>6.0} ns/pod ({:.2}x), \
             update {:>6.0} ns/pod ({:.2}x), delete {:>6.0} ns/pod ({:.2}x); DSW {:.0} B/volume",
            f.pods,
            f.floor,
            f.populate,
            x(f.populate),
            f.update,
            x(f.update),
            f.delete,
            x(f.delete),
            f.bytes_per_volume,
        );
        all.push(f);
    }
    let (first, last) = (&all[0], &all[all.len() - 1]);
    for (what, a, b) in [
        ("populate", first.populate, last.populate),
        ("update", first.update, last.update),
        ("delete", first.delete, last.delete),
    ] {
        let growth = (b / last.floor) / (a / first.floor);
        println!(
            "dsw bench: {what} per pod, to the floor, at {} pods is {growth:.2}x that at {} \
             ({:.2}x in ns): {} for {:.0}x the pods (flat: within {FLAT_WITHIN}x, a linear total)",
            last.pods,
            first.pods,
            b / a,
            if growth <= FLAT_WITHIN {
                "flat"
            } else {
                "GROWS"
            },
            last.pods as f64 / first.pods as f64,
        );
    }
}
