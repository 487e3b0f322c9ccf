//! The calls of the fsGroup ownership walk (`plugins/ownership.rs`) on a
//! [`DirHandle`] holding a descriptor. Each acts on one name of the
//! handle's directory with an `*at` call that never follows it, or on the
//! handle's own directory through its descriptor:
//!
//! - a listing is one `getdents` pass and one `statx(AT_SYMLINK_NOFOLLOW)`
//!   per entry, which also says whether the entry is a mount root;
//! - a subdirectory is opened with `openat2(RESOLVE_BENEATH |
//!   RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV)`: a symlink swapped in is
//!   `ELOOP`, a mount made on it meanwhile `EXDEV`, never followed;
//! - the group is set with `fchownat(AT_SYMLINK_NOFOLLOW)` (a symlink's
//!   own group), the mode with `fchmodat2(AT_SYMLINK_NOFOLLOW)`, which
//!   refuses a symlink (`EOPNOTSUPP`) instead of changing its target.
//!   Kernels before 6.6 lack `fchmodat2` (`ENOSYS`): the entry is then
//!   opened `O_PATH | O_NOFOLLOW` and its mode set through
//!   `/proc/self/fd/N`, which reaches that very inode and no other.

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag};

use super::raw::{kind_from_mode, mode, mount_root_attr, statx_at};
use super::{Call, DirHandle, Errno, OwnerEntry, SysError};

/// The statx fields the walk reads.
const MASK: u32 = libc::STATX_TYPE | libc::STATX_MODE | libc::STATX_GID;

fn entry(name: CString, st: &libc::statx, dev: (u32, u32)) -> Option<OwnerEntry> {
    let m = u32::from(st.stx_mode);
    let kind = kind_from_mode(m)?;
    let other_dev = (st.stx_dev_major, st.stx_dev_minor) != dev;
    Some(OwnerEntry {
        name,
        kind,
        perm: m & 0o7777,
        gid: st.stx_gid,
        mount_root: mount_root_attr(st).unwrap_or(other_dev) || other_dev,
    })
}

/// The handle's own directory (name empty).
pub(super) fn stat_self(path: &Path, fd: BorrowedFd<'_>) -> Result<OwnerEntry, SysError> {
    let st = statx_at(
        fd.as_raw_fd(),
        &CString::from(c""),
        libc::AT_EMPTY_PATH,
        MASK,
    )
    .map_err(|e| SysError::call(Call::Stat, path, e))?;
    // a mount root only as seen from above; the walk's root always is one
    // when the volume is a mount, which is no reason to skip it
    let dev = (st.stx_dev_major, st.stx_dev_minor);
    let mut e = entry(CString::default(), &st, dev)
        .ok_or_else(|| SysError::call(Call::Stat, path, Errno::EINVAL))?;
    e.mount_root = false;
    Ok(e)
}

/// The entries of the handle's directory; an entry gone before its
/// `statx` is left out.
pub(super) fn list(path: &Path, fd: BorrowedFd<'_>) -> Result<Vec<OwnerEntry>, SysError> {
    let err = |e| SysError::call(Call::ReadDirBeneath, path, e);
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let own = nix::fcntl::openat(fd, ".", flags, mode(0)).map_err(err)?;
    let dot = statx_at(own.as_raw_fd(), &CString::from(c"."), 0, MASK).map_err(err)?;
    let dev = (dot.stx_dev_major, dot.stx_dev_minor);
    let mut dir = nix::dir::Dir::from_fd(own).map_err(err)?;
    let mut names = Vec::new();
    for e in dir.iter() {
        let e = e.map_err(err)?;
        let name = e.file_name();
        if name != c"." && name != c".." {
            names.push(name.to_owned());
        }
    }
    let dirfd = dir.as_raw_fd();
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        match statx_at(dirfd, &name, libc::AT_SYMLINK_NOFOLLOW, MASK) {
            Ok(st) => out.extend(entry(name, &st, dev)),
            Err(Errno::ENOENT) => {}
            Err(e) => {
                let p = path.join(OsStr::from_bytes(name.as_bytes()));
                return Err(SysError::call(Call::Stat, &p, e));
            }
        }
    }
    Ok(out)
}

/// The subdirectory `name`, never through a symlink nor across a mount.
pub(super) fn open(path: &Path, fd: BorrowedFd<'_>, name: &CStr) -> Result<DirHandle, SysError> {
    let sub = path.join(OsStr::from_bytes(name.to_bytes()));
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_XDEV,
        );
    match nix::fcntl::openat2(fd, name, how) {
        Ok(own) => Ok(DirHandle::with_fd(sub, own)),
        Err(e) => Err(SysError::call(Call::OpenDir, &sub, e)),
    }
}

fn named(path: &Path, name: &CStr) -> std::path::PathBuf {
    match name.is_empty() {
        true => path.to_owned(),
        false => path.join(OsStr::from_bytes(name.to_bytes())),
    }
}

/// The group of `name` (empty: the handle's own directory), never
/// following it.
pub(super) fn chgrp(
    path: &Path,
    fd: BorrowedFd<'_>,
    name: &CStr,
    gid: u32,
) -> Result<(), SysError> {
    let gid = Some(nix::unistd::Gid::from_raw(gid));
    let r = match name.is_empty() {
        true => nix::unistd::fchown(fd, None, gid),
        false => nix::unistd::fchownat(fd, name, None, gid, AtFlags::AT_SYMLINK_NOFOLLOW),
    };
    r.map_err(|e| SysError::call(Call::Chgrp, &named(path, name), e))
}

/// Whether `fchmodat2` answered `ENOSYS` once (then not asked again).
static NO_FCHMODAT2: AtomicBool = AtomicBool::new(false);

/// The mode of `name` (empty: the handle's own directory), never through
/// a symlink.
pub(super) fn chmod(path: &Path, fd: BorrowedFd<'_>, name: &CStr, m: u32) -> Result<(), SysError> {
    let err = |e| SysError::call(Call::Chmod, &named(path, name), e);
    if name.is_empty() {
        return nix::sys::stat::fchmod(fd, mode(m)).map_err(err);
    }
    if !NO_FCHMODAT2.load(Ordering::Relaxed) {
        // SAFETY: `name` is a NUL-terminated string that outlives the
        // call; `fd` is an open descriptor; the kernel reads only these.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_fchmodat2,
                fd.as_raw_fd(),
                name.as_ptr(),
                libc::c_uint::from(m & 0o7777),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        match rc {
            0 => return Ok(()),
            _ => match Errno::last() {
                Errno::ENOSYS => NO_FCHMODAT2.store(true, Ordering::Relaxed),
                e => return Err(err(e)),
            },
        }
    }
    let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let own: OwnedFd = nix::fcntl::openat(fd, name, flags, mode(0)).map_err(err)?;
    let st = statx_at(
        own.as_raw_fd(),
        &CString::from(c""),
        libc::AT_EMPTY_PATH,
        MASK,
    )
    .map_err(err)?;
    if u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFLNK {
        return Err(err(Errno::EOPNOTSUPP));
    }
    let proc = format!("/proc/self/fd/{}", own.as_raw_fd());
    nix::sys::stat::fchmodat(
        nix::fcntl::AT_FDCWD,
        proc.as_str(),
        mode(m),
        nix::sys::stat::FchmodatFlags::FollowSymlink,
    )
    .map_err(err)
}
