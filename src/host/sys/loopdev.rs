//! Loop devices through the loop driver's ioctls (`loop(4)`): the hold the
//! kubelet takes on a mapped raw block device (a loop device backed by the
//! device's file keeps the device open, so it cannot vanish and be
//! replaced under the same name while a pod maps it). The kubelet runs
//! `losetup`; these are the same kernel calls without a child process.
//!
//! Which loop device holds a file is read from sysfs: the kernel names a
//! bound loop device's backing file in `/sys/block/loopN/loop/backing_file`
//! (the path of the file it holds open, as the reader's root sees it) and
//! has no such file for an unbound one. This is what `losetup -j` and the
//! kubelet's lookup read. Both walk every loop device for each lookup; here
//! one walk at the first lookup fills an index that attach and detach keep
//! ([`KNOWN`]), so a pod's map step costs O(its devices), not O(the node's
//! block pods).

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsStr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::raw::io_error;
use super::{Call, Errno, SysError};

/// `LOOP_SET_FD` (`<linux/loop.h>`): bind a loop device to an open file.
const LOOP_SET_FD: u32 = 0x4C00;
/// `LOOP_CLR_FD`: unbind a loop device.
const LOOP_CLR_FD: u32 = 0x4C01;
/// `LOOP_CTL_GET_FREE` on `/dev/loop-control`: the number of a free loop
/// device, made when none is free.
const LOOP_CTL_GET_FREE: u32 = 0x4C82;

const LOOP_CONTROL: &str = "/dev/loop-control";
const SYS_BLOCK: &str = "/sys/block";
/// A free device another process takes between `LOOP_CTL_GET_FREE` and
/// `LOOP_SET_FD` answers `EBUSY`: ask for another, this many times.
const ATTACH_TRIES: usize = 16;
/// How long a detach waits for the kernel to let go of the backing file
/// (another opener of the loop device, udev's probe, delays it until it
/// closes); past it the detach still holds, done at the last close.
const RELEASE_WAIT: Duration = Duration::from_secs(2);

/// `N` of a loop device's name `loopN`.
fn loop_number(name: &OsStr) -> Option<u32> {
    let digits = name.as_bytes().strip_prefix(b"loop")?;
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// The sysfs file naming the backing file of loop device `n`.
fn backing_file_of(n: u32) -> PathBuf {
    PathBuf::from(format!("{SYS_BLOCK}/loop{n}/loop/backing_file"))
}

/// What sysfs says loop device `n` is backed by: `None` when unbound.
fn backing_of(n: u32, call: Call, named: &Path) -> Result<Option<Vec<u8>>, SysError> {
    match std::fs::read(backing_file_of(n)) {
        Ok(mut bytes) => {
            if bytes.last() == Some(&b'\n') {
                bytes.pop();
            }
            Ok(Some(bytes))
        }
        // unbound (no `backing_file`), or removed since the listing
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENXIO)) => Ok(None),
        Err(e) => Err(io_error(call, named, &e)),
    }
}

/// The host's bound loop devices by backing file, as this process knows
/// them: filled by one walk of `/sys/block` at the first lookup, then kept
/// by [`attach`] and [`detach`]. The loop devices are the host's, whichever
/// `LinuxSys` asks, hence one index per process. Every answer is checked
/// against sysfs, so a device detached or rebound by another process since
/// is dropped, never returned. One another process binds to a file after
/// the walk is not seen: the holds are volumed's own (a restart walks
/// again), and another's device is not volumed's to detach.
static KNOWN: Mutex<Option<Known>> = Mutex::new(None);

/// Loop device numbers by backing file (its path, as sysfs names it).
type Known = HashMap<Vec<u8>, BTreeSet<u32>>;

/// Every bound loop device, by backing file: one read per loop device.
fn walk(call: Call, named: &Path) -> Result<Known, SysError> {
    let list = std::fs::read_dir(SYS_BLOCK).map_err(|e| io_error(call, named, &e))?;
    let mut known = Known::new();
    for entry in list {
        let entry = entry.map_err(|e| io_error(call, named, &e))?;
        let Some(n) = loop_number(&entry.file_name()) else {
            continue;
        };
        if let Some(backing) = backing_of(n, call, named)? {
            known.entry(backing).or_default().insert(n);
        }
    }
    Ok(known)
}

/// The index, walked first if this is the first lookup. A poisoned lock is
/// taken as it is: every change to the index is a single insert or remove.
fn known_index(call: Call, named: &Path) -> Result<MutexGuard<'static, Option<Known>>, SysError> {
    let mut known = KNOWN.lock().unwrap_or_else(|p| p.into_inner());
    if known.is_none() {
        *known = Some(walk(call, named)?);
    }
    Ok(known)
}

/// See [`super::Sys::loop_find_backing`].
pub(super) fn find_backing(backing: &Path) -> Result<Vec<PathBuf>, SysError> {
    let call = Call::LoopFind;
    let key = backing.as_os_str().as_bytes();
    let mut guard = known_index(call, backing)?;
    let Some(devices) = guard.as_mut().and_then(|k| k.get_mut(key)) else {
        return Ok(Vec::new());
    };
    let mut found = Vec::new();
    for n in std::mem::take(devices) {
        if backing_of(n, call, backing)?.as_deref() == Some(key) {
            found.push(n);
        }
    }
    devices.extend(found.iter().copied());
    if devices.is_empty()
        && let Some(k) = guard.as_mut()
    {
        k.remove(key);
    }
    Ok(found
        .into_iter()
        .map(|n| PathBuf::from(format!("/dev/loop{n}")))
        .collect())
}

/// Records in the index what loop device `n` is now backed by, as sysfs
/// names it (a first lookup's walk will see it anyway).
fn remember(n: u32, call: Call, named: &Path) -> Result<(), SysError> {
    let mut known = KNOWN.lock().unwrap_or_else(|p| p.into_inner());
    if let (Some(k), Some(backing)) = (known.as_mut(), backing_of(n, call, named)?) {
        k.entry(backing).or_default().insert(n);
    }
    Ok(())
}

/// Drops loop device `n`, backed by `backing`, from the index.
fn forget(n: u32, backing: &[u8]) {
    let mut known = KNOWN.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(k) = known.as_mut()
        && let Some(devices) = k.get_mut(backing)
    {
        devices.remove(&n);
        if devices.is_empty() {
            k.remove(backing);
        }
    }
}

/// `ioctl(fd, request, arg)`, its failure as the errno.
fn ioctl(fd: &OwnedFd, request: u32, arg: libc::c_ulong) -> Result<libc::c_int, Errno> {
    // SAFETY: the loop requests used here take an integer argument (a file
    // descriptor, or none), never a pointer, and `fd` is open for the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), request as _, arg) };
    if r < 0 { Err(Errno::last()) } else { Ok(r) }
}

/// Attaches a free loop device to `file` (open for the call); `named` is
/// the backing path errors name. See [`super::Sys::loop_attach_beneath`].
pub(super) fn attach(file: &OwnedFd, named: &Path) -> Result<PathBuf, SysError> {
    let err = |e| SysError::call(Call::LoopAttach, named, e);
    let ctl = nix::fcntl::open(
        LOOP_CONTROL,
        OFlag::O_RDWR | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(err)?;
    let backing = libc::c_ulong::try_from(file.as_raw_fd()).map_err(|_| err(Errno::EBADF))?;
    for _ in 0..ATTACH_TRIES {
        let n = ioctl(&ctl, LOOP_CTL_GET_FREE, 0).map_err(err)?;
        let dev = PathBuf::from(format!("/dev/loop{n}"));
        let flags = OFlag::O_RDWR | OFlag::O_CLOEXEC;
        let lo = match nix::fcntl::open(&dev, flags, Mode::empty()) {
            Ok(lo) => lo,
            // removed by another process (`LOOP_CTL_REMOVE`) since: ask again
            Err(Errno::ENOENT | Errno::ENXIO) => continue,
            Err(e) => return Err(err(e)),
        };
        match ioctl(&lo, LOOP_SET_FD, backing) {
            Ok(_) => {
                if let Ok(n) = u32::try_from(n) {
                    remember(n, Call::LoopAttach, named)?;
                }
                return Ok(dev);
            }
            // taken by someone else since it was free: ask again
            Err(Errno::EBUSY) => continue,
            Err(e) => return Err(err(e)),
        }
    }
    Err(err(Errno::EBUSY))
}

/// See [`super::Sys::loop_detach`]: `LOOP_CLR_FD`, then a bounded wait
/// for the kernel to close the backing file (so the bind it was opened
/// through can be unmounted).
pub(super) fn detach(dev: &Path) -> Result<(), SysError> {
    let err = |e| SysError::call(Call::LoopDetach, dev, e);
    let n = match (dev.parent(), dev.file_name()) {
        (Some(dir), Some(name)) if dir == Path::new("/dev") => loop_number(name),
        _ => None,
    };
    let n = n.ok_or_else(|| err(Errno::EINVAL))?;
    let lo =
        nix::fcntl::open(dev, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty()).map_err(err)?;
    let backing = backing_of(n, Call::LoopDetach, dev)?;
    ioctl(&lo, LOOP_CLR_FD, 0).map_err(err)?;
    if let Some(backing) = &backing {
        forget(n, backing);
    }
    // the kernel lets go of the backing file at the loop device's last close
    drop(lo);
    let start = Instant::now();
    while backing_of(n, Call::LoopDetach, dev)?.is_some() && start.elapsed() < RELEASE_WAIT {
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loop_device_names_have_a_number() {
        let cases = [
            ("loop0", Some(0)),
            ("loop17", Some(17)),
            ("loop", None),
            ("loop1p1", None),
            ("sda", None),
            ("loop-control", None),
        ];
        for (name, want) in cases {
            assert_eq!(loop_number(OsStr::new(name)), want, "{name}");
        }
    }
}
