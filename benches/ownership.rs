//! fsGroup ownership benchmark: the walk volumed runs after SetUp
//! (`plugins::ownership::set_ownership`, the kubelet's
//! `SetVolumeOwnership`) over a volume of N files, against the floor of
//! the same `fchownat` + `fchmodat` calls made directly by this process,
//! in the same run, on the same files. Figures are printed, never
//! asserted.
//!
//! - **The tree.** N empty files of mode 0600 and group 0, 1,000 to a
//!   directory, on a tmpfs of its own (no disk: what is left is the
//!   syscalls' own cost and ours around them, the harshest comparison).
//! - **The floor.** Every directory opened once and every name listed
//!   before the clock starts; timed: one `fchownat(dirfd, name, -1, gid,
//!   AT_SYMLINK_NOFOLLOW)` and one `fchmodat(dirfd, name, 0660)` per file
//!   and per directory (with 02770), exactly the changes the walk makes.
//! - **volumed.** `set_ownership` on the volume's root, `Always`: it lists
//!   every directory, `statx`es every entry, opens every directory with
//!   `openat2` and makes the same two changes per entry through the
//!   `host::sys` seam.
//!
//! Between two timed runs the tree is put back to group 0 and its old
//! modes, untimed. The order alternates between rounds (3; quick 1);
//! medians are printed. The goal: volumed within 1.2x the floor at
//! 100,000 files. Sizes: 10,000, 30,000 and 100,000 files (quick: 1,000
//! and 10,000). Needs root (chgrp to any group, a tmpfs); otherwise says
//! what it skipped and exits 0. Runs in a private mount namespace.

#[path = "support/mod.rs"]
mod bench_support;
#[path = "../tests/support/mod.rs"]
mod support;

use std::ffi::CString;
use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bench_support::{median, quick_mode};
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FchmodatFlags, Mode, fchmodat};
use nix::unistd::{Gid, fchownat};
use support::{Scratch, enter_private_mount_ns, mount_tmpfs, require_root};
use volumed::host::sys::{Beneath, LinuxSys, Sys};
use volumed::journal::Permit;
use volumed::model::{FsGroup, FsGroupChangePolicy};
use volumed::plugins::ownership::{ProgressEvery, set_ownership};

const GID: u32 = 4747;
const PER_DIR: usize = 1000;

/// The volume: `n` files in dirs of `PER_DIR`.
fn make_tree(root: &Path, n: usize) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for d in 0..n.div_ceil(PER_DIR) {
        let dir = root.join(format!("d{d}"));
        fs::create_dir(&dir).unwrap();
        for f in 0..PER_DIR.min(n - d * PER_DIR) {
            fs::write(dir.join(format!("f{f}")), b"").unwrap();
        }
        dirs.push(dir);
    }
    dirs
}

/// Every directory opened once with the names in it: what the floor's
/// loop acts on (made before its clock starts).
struct Listed {
    root: OwnedFd,
    dirs: Vec<(CString, OwnedFd, Vec<CString>)>,
}

fn list(root: &Path, dirs: &[PathBuf]) -> Listed {
    let open = |p: &Path| {
        nix::fcntl::open(p, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).unwrap()
    };
    let dirs = dirs
        .iter()
        .map(|d| {
            let mut names: Vec<CString> = fs::read_dir(d)
                .unwrap()
                .map(|e| CString::new(e.unwrap().file_name().as_bytes()).unwrap())
                .collect();
            names.sort();
            let name = CString::new(d.file_name().unwrap().as_bytes()).unwrap();
            (name, open(d), names)
        })
        .collect();
    Listed {
        root: open(root),
        dirs,
    }
}

/// The same changes as the walk, by direct calls: group and mode of every
/// file, of every directory and of the root.
fn direct(l: &Listed, gid: u32, file_mode: u32, dir_mode: u32) {
    let g = Some(Gid::from_raw(gid));
    let nofollow = AtFlags::AT_SYMLINK_NOFOLLOW;
    let fm = Mode::from_bits_truncate(file_mode);
    let dm = Mode::from_bits_truncate(dir_mode);
    for (name, fd, names) in &l.dirs {
        for n in names {
            fchownat(fd.as_fd(), n.as_c_str(), None, g, nofollow).unwrap();
            fchmodat(fd.as_fd(), n.as_c_str(), fm, FchmodatFlags::FollowSymlink).unwrap();
        }
        fchownat(l.root.as_fd(), name.as_c_str(), None, g, nofollow).unwrap();
        fchmodat(
            l.root.as_fd(),
            name.as_c_str(),
            dm,
            FchmodatFlags::FollowSymlink,
        )
        .unwrap();
    }
    nix::unistd::fchown(l.root.as_fd(), None, g).unwrap();
    nix::sys::stat::fchmod(l.root.as_fd(), dm).unwrap();
}

fn walk(base: &Path) -> (Duration, u64) {
    let dir = LinuxSys
        .open_dir_beneath(Beneath {
            base,
            rel: Path::new("vol"),
        })
        .unwrap();
    let group = FsGroup {
        gid: GID,
        policy: FsGroupChangePolicy::Always,
    };
    let t = Instant::now();
    let w = set_ownership(
        &Permit::JournalOff,
        &LinuxSys,
        &dir,
        group,
        false,
        ProgressEvery::KUBELET,
        &mut |_| {},
    )
    .unwrap();
    (t.elapsed(), w.changed)
}

fn main() {
    if !require_root("the ownership bench changes groups and mounts a tmpfs") {
        return;
    }
    enter_private_mount_ns();
    let quick = quick_mode();
    let sizes: &[usize] = if quick {
        &[1_000, 10_000]
    } else {
        &[10_000, 30_000, 100_000]
    };
    let rounds = if quick { 1 } else { 3 };
    println!(
        "ownership bench ({} mode): the fsGroup walk over N files (1,000 a dir, on a tmpfs) \
         against the same fchownat + fchmodat calls made directly; {rounds} round(s), medians",
        if quick { "quick" } else { "full" }
    );
    println!(
        "{:>9} {:>12} {:>12} {:>8} {:>14}",
        "files", "direct ms", "volumed ms", "ratio", "volumed ns/ent"
    );
    for &n in sizes {
        let scratch = Scratch::new("volumed-ownership-bench-");
        let base = scratch.path().to_path_buf();
        let vol = base.join("vol");
        fs::create_dir(&vol).unwrap();
        mount_tmpfs(&vol, "size=512m,mode=0700");
        let dirs = make_tree(&vol, n);
        let listed = list(&vol, &dirs);
        let reset = || direct(&listed, 0, 0o600, 0o700);
        let mut floors = Vec::new();
        let mut ours = Vec::new();
        for round in 0..rounds {
            let mut floor = || {
                reset();
                let t = Instant::now();
                direct(&listed, GID, 0o660, 0o2770);
                floors.push(t.elapsed());
            };
            let mut volumed = || {
                reset();
                let (d, changed) = walk(&base);
                assert_eq!(changed, (n + dirs.len() + 1) as u64, "every entry changed");
                ours.push(d);
            };
            if round % 2 == 0 {
                floor();
                volumed();
            } else {
                volumed();
                floor();
            }
        }
        let f = median(&mut floors);
        let o = median(&mut ours);
        let entries = (n + dirs.len() + 1) as f64;
        println!(
            "{n:>9} {:>12.1} {:>12.1} {:>7.2}x {:>14.0}",
            f.as_secs_f64() * 1e3,
            o.as_secs_f64() * 1e3,
            o.as_secs_f64() / f.as_secs_f64(),
            o.as_secs_f64() * 1e9 / entries
        );
        drop(listed);
        nix::mount::umount2(&vol, nix::mount::MntFlags::MNT_DETACH).unwrap();
    }
    println!("goal: volumed within 1.20x the direct calls at 100,000 files");
}
