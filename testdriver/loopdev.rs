//! The driver's loop devices: one per staged block volume, over a sparse
//! backing file in its staging dir. The test harness binds its own with
//! this file too (`tests/support/mod.rs` includes it by path).
//!
//! A device is bound with one `LOOP_CONFIGURE` carrying
//! `LO_FLAGS_AUTOCLEAR` (never `losetup -f`, which binds first and sets
//! flags after), and the driver keeps it open: the kernel unbinds it when
//! the last opener goes — the driver's NodeUnstage closing it, or the
//! driver dying. A bind mount of the device node is no opener, so no test
//! and no crash can leak a device. A driver restarted while volumes are
//! staged takes their devices back as a real driver re-attaches its
//! staged disks: the device still bound to a staging dir's file (an
//! opener, volumed's hold, kept it) is opened again ([`Loop::adopt`]),
//! or, if autoclear let it go, a new one is bound to the same file.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `LOOP_CTL_GET_FREE` on `/dev/loop-control` (linux/loop.h).
const LOOP_CTL_GET_FREE: libc::Ioctl = 0x4C82;
/// `LOOP_CONFIGURE` on `/dev/loopN` (linux/loop.h, Linux 5.8).
const LOOP_CONFIGURE: libc::Ioctl = 0x4C0A;
/// `LOOP_SET_CAPACITY` on `/dev/loopN` (linux/loop.h): re-read the
/// backing file's size, so a grown file grows the device.
const LOOP_SET_CAPACITY: libc::Ioctl = 0x4C07;
/// `LO_FLAGS_AUTOCLEAR`: unbind when the last opener closes it.
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// `struct loop_info64` (linux/loop.h).
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config` (linux/loop.h).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// A loop device the driver holds open, bound to `backing` with autoclear.
#[derive(Debug)]
pub(crate) struct Loop {
    /// The open device: the hold.
    dev: File,
    /// `/dev/loopN`.
    pub path: PathBuf,
    /// N.
    pub number: u32,
    /// The device number (`st_rdev` of `/dev/loopN`).
    pub rdev: u64,
    /// The backing file, as the kernel names it.
    pub backing: PathBuf,
}

impl Loop {
    /// Binds a free loop device to `backing` (retrying when another
    /// process takes the free number first).
    pub(crate) fn attach(backing: &Path) -> io::Result<Loop> {
        let file = OpenOptions::new().read(true).write(true).open(backing)?;
        let backing = fs::canonicalize(backing)?;
        let control = File::open("/dev/loop-control")?;
        for _ in 0..50 {
            // SAFETY: LOOP_CTL_GET_FREE takes no argument; it returns a
            // number or -1.
            let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
            let number = u32::try_from(n).map_err(|_| io::Error::last_os_error())?;
            let path = PathBuf::from(format!("/dev/loop{number}"));
            let dev = match OpenOptions::new().read(true).write(true).open(&path) {
                Ok(d) => d,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let mut name = [0u8; 64];
            let src = backing.as_os_str().as_encoded_bytes();
            let len = src.len().min(63);
            name[..len].copy_from_slice(&src[..len]);
            let config = LoopConfig {
                fd: u32::try_from(file.as_raw_fd()).map_err(|_| io::Error::other("bad fd"))?,
                block_size: 0,
                info: LoopInfo64 {
                    lo_device: 0,
                    lo_inode: 0,
                    lo_rdevice: 0,
                    lo_offset: 0,
                    lo_sizelimit: 0,
                    lo_number: 0,
                    lo_encrypt_type: 0,
                    lo_encrypt_key_size: 0,
                    lo_flags: LO_FLAGS_AUTOCLEAR,
                    lo_file_name: name,
                    lo_crypt_name: [0; 64],
                    lo_encrypt_key: [0; 32],
                    lo_init: [0; 2],
                },
                reserved: [0; 8],
            };
            // SAFETY: `config` is a live, initialised `struct loop_config`
            // laid out as the kernel's (repr(C)); the kernel only reads it.
            let r = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE, &raw const config) };
            if r == 0 {
                let rdev = fs::metadata(&path)?.rdev();
                return Ok(Loop {
                    dev,
                    path,
                    number,
                    rdev,
                    backing,
                });
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EBUSY) {
                return Err(e);
            }
            // another process bound this free device first: ask again
            std::thread::sleep(Duration::from_millis(5));
        }
        Err(io::Error::other("no free loop device after 50 tries"))
    }

    /// The device already bound to `backing`, opened and held again: what
    /// a restarted driver does with a device its former process bound
    /// (another opener kept it bound). None when no device is bound to it.
    pub(crate) fn adopt(backing: &Path) -> io::Result<Option<Loop>> {
        let backing = fs::canonicalize(backing)?;
        for entry in fs::read_dir("/sys/block")?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(number) = name.strip_prefix("loop").and_then(|n| n.parse().ok()) else {
                continue;
            };
            if !bound_to(number, &backing) {
                continue;
            }
            let path = PathBuf::from(format!("/dev/{name}"));
            let dev = match OpenOptions::new().read(true).write(true).open(&path) {
                Ok(d) => d,
                // gone, or being unbound by autoclear (its last opener,
                // the former process, just closed it): not bound for us
                Err(e)
                    if e.kind() == io::ErrorKind::NotFound
                        || e.raw_os_error() == Some(libc::ENXIO) =>
                {
                    continue;
                }
                Err(e) => return Err(e),
            };
            // autoclear may have unbound it between the look and the open
            // (and another file been bound to the number since)
            if !bound_to(number, &backing) {
                continue;
            }
            let rdev = fs::metadata(&path)?.rdev();
            return Ok(Some(Loop {
                dev,
                path,
                number,
                rdev,
                backing,
            }));
        }
        Ok(None)
    }

    /// The device's size in bytes, as the kernel sees it (sysfs counts
    /// 512-byte sectors whatever the block size).
    pub(crate) fn bytes(&self) -> io::Result<u64> {
        let text = fs::read_to_string(format!("/sys/block/loop{}/size", self.number))?;
        let sectors: u64 = text.trim().parse().map_err(io::Error::other)?;
        Ok(sectors.saturating_mul(512))
    }

    /// Grows the backing file to `bytes` (never shrinks it) and has the
    /// kernel re-read its size (`LOOP_SET_CAPACITY`, what `losetup -c`
    /// does), so every opener and every bind of the device node sees
    /// the new size; answers the device's size after.
    pub(crate) fn grow(&self, bytes: u64) -> io::Result<u64> {
        let file = OpenOptions::new().write(true).open(&self.backing)?;
        if file.metadata()?.len() < bytes {
            file.set_len(bytes)?;
        }
        // SAFETY: LOOP_SET_CAPACITY takes no argument; it returns 0 or -1.
        let r = unsafe { libc::ioctl(self.dev.as_raw_fd(), LOOP_SET_CAPACITY, 0) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        self.bytes()
    }

    /// Closes the hold and waits (up to `timeout`) until the kernel has
    /// unbound the device; false if it is still bound to our file
    /// (another opener holds it).
    pub(crate) fn detach(self, timeout: Duration) -> bool {
        let (number, backing) = (self.number, self.backing.clone());
        drop(self);
        let deadline = Instant::now() + timeout;
        while bound_to(number, &backing) {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }
}

/// Whether `/dev/loop<number>` is bound to `backing`.
pub(crate) fn bound_to(number: u32, backing: &Path) -> bool {
    fs::read(format!("/sys/block/loop{number}/loop/backing_file")).is_ok_and(|b| {
        let b = b.strip_suffix(b"\n").unwrap_or(&b);
        b == backing.as_os_str().as_encoded_bytes()
    })
}
