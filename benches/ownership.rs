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
//! - **The same syscalls as the walk.** A second floor, a plain loop over
//!   the tree making exactly the calls the walk makes, timed whole: per
//!   directory an `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//!   RESOLVE_NO_XDEV)` and its `getdents`, per entry one
//!   `statx(AT_SYMLINK_NOFOLLOW)`, one `fchownat` and one `fchmodat2`. The
//!   `statx` is the walk's safety check (is the entry a symlink, or the
//!   root of another mount?), which the kubelet's walk pays too (an
//!   `lstat` per entry): the first floor leaves it out, this one measures
//!   what our code costs around the calls.
//! - **volumed.** `set_ownership` on the volume's root, `Always`: it lists
//!   every directory, `statx`es every entry, opens every directory with
//!   `openat2` and makes the same two changes per entry through the
//!   `host::sys` seam.
//!
//! Between two timed runs the tree is put back to group 0 and its old
//! modes, untimed. The order alternates between rounds (3; quick 1);
//! medians are printed. The goal: volumed within 1.2x the floor at
//! 100,000 files; both floors are printed and the goal is judged against
//! each. Sizes: 10,000, 30,000 and 100,000 files (quick: 1,000
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

/// The walk's own syscalls, made directly (module doc, second floor):
/// the directory `dir` (open) listed, each entry `statx`ed, changed, and
/// its subdirectories walked first; the number of entries changed.
fn same_calls(dir: &OwnedFd, gid: u32) -> u64 {
    use nix::fcntl::{OpenHow, ResolveFlag};
    let how = || {
        OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(
                ResolveFlag::RESOLVE_BENEATH
                    | ResolveFlag::RESOLVE_NO_SYMLINKS
                    | ResolveFlag::RESOLVE_NO_XDEV,
            )
    };
    let own = nix::fcntl::openat2(dir.as_fd(), c".", how()).unwrap();
    let mut listing = nix::dir::Dir::from_fd(own).unwrap();
    let names: Vec<CString> = listing
        .iter()
        .map(|e| e.unwrap().file_name().to_owned())
        .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
        .collect();
    let fd = listing.as_fd();
    let mut changed = 0;
    for name in &names {
        let st = statx(fd, name);
        let is_dir = u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFDIR;
        let mode = match is_dir {
            true => {
                let sub = nix::fcntl::openat2(fd, name.as_c_str(), how()).unwrap();
                changed += same_calls(&sub, gid);
                0o2770
            }
            false => 0o660,
        };
        let g = Some(Gid::from_raw(gid));
        fchownat(fd, name.as_c_str(), None, g, AtFlags::AT_SYMLINK_NOFOLLOW).unwrap();
        fchmodat2(fd, name, mode);
        changed += 1;
    }
    changed
}

/// One `statx(AT_SYMLINK_NOFOLLOW)` of `name` in `dir`, of the fields the
/// walk asks.
fn statx(dir: std::os::fd::BorrowedFd<'_>, name: &CString) -> libc::statx {
    use std::os::fd::AsRawFd;
    let mut buf = std::mem::MaybeUninit::<libc::statx>::zeroed();
    let mask = libc::STATX_TYPE | libc::STATX_MODE | libc::STATX_GID;
    // SAFETY: `name` is NUL-terminated and outlives the call; `buf` is
    // writable and the size of `struct statx`, all the kernel writes.
    let rc = unsafe {
        libc::statx(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            mask,
            buf.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0, "statx: {}", std::io::Error::last_os_error());
    // SAFETY: zero-initialised plain integers, filled by the kernel
    unsafe { buf.assume_init() }
}

/// One `fchmodat2(AT_SYMLINK_NOFOLLOW)`, as the walk calls it.
fn fchmodat2(dir: std::os::fd::BorrowedFd<'_>, name: &CString, mode: u32) {
    use std::os::fd::AsRawFd;
    // SAFETY: `name` is NUL-terminated and outlives the call; the kernel
    // reads only the descriptor, the name and the two integers.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_fchmodat2,
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::c_uint::from(mode),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(rc, 0, "fchmodat2: {}", std::io::Error::last_os_error());
}

/// [`same_calls`] over the volume at `vol`, its root changed last: the
/// time and the entries changed.
fn same_calls_timed(vol: &Path) -> (Duration, u64) {
    let root = nix::fcntl::open(vol, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
    let t = Instant::now();
    let mut changed = same_calls(&root, GID);
    nix::unistd::fchown(root.as_fd(), None, Some(Gid::from_raw(GID))).unwrap();
    nix::sys::stat::fchmod(root.as_fd(), Mode::from_bits_truncate(0o2770)).unwrap();
    changed += 1;
    (t.elapsed(), changed)
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
         against the same fchownat + fchmodat calls made directly, and against every syscall \
         the walk makes (statx, openat2, getdents too) made directly; {rounds} round(s), medians",
        if quick { "quick" } else { "full" }
    );
    println!(
        "{:>9} {:>12} {:>12} {:>8} {:>15} {:>8} {:>14}",
        "files", "direct ms", "volumed ms", "ratio", "same calls ms", "ratio", "volumed ns/ent"
    );
    let mut last = None;
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
        let mut same = Vec::new();
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
            let mut syscalls = || {
                reset();
                let (d, changed) = same_calls_timed(&vol);
                assert_eq!(changed, (n + dirs.len() + 1) as u64, "every entry changed");
                same.push(d);
            };
            if round % 2 == 0 {
                floor();
                syscalls();
                volumed();
            } else {
                volumed();
                syscalls();
                floor();
            }
        }
        let f = median(&mut floors);
        let c = median(&mut same);
        let o = median(&mut ours);
        let entries = (n + dirs.len() + 1) as f64;
        println!(
            "{n:>9} {:>12.1} {:>12.1} {:>7.2}x {:>15.1} {:>7.2}x {:>14.0}",
            f.as_secs_f64() * 1e3,
            o.as_secs_f64() * 1e3,
            o.as_secs_f64() / f.as_secs_f64(),
            c.as_secs_f64() * 1e3,
            o.as_secs_f64() / c.as_secs_f64(),
            o.as_secs_f64() * 1e9 / entries
        );
        last = Some((
            n,
            o.as_secs_f64() / f.as_secs_f64(),
            o.as_secs_f64() / c.as_secs_f64(),
        ));
        drop(listed);
        nix::mount::umount2(&vol, nix::mount::MntFlags::MNT_DETACH).unwrap();
    }
    println!("goal: volumed within 1.20x the direct calls at 100,000 files");
    if let Some((n, direct, same)) = last {
        let judge = |r: f64| match r <= 1.2 {
            true => "met",
            false => "NOT met",
        };
        println!(
            "at {n} files: {direct:.2}x the fchownat + fchmodat calls alone ({}); {same:.2}x \
             the walk's own syscalls made directly ({}; the difference between the two floors \
             is the statx per entry that no walk that stays in its volume can skip)",
            judge(direct),
            judge(same)
        );
    }
}
