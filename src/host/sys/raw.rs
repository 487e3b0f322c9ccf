//! The raw calls under [`LinuxSys`]: `statx` (the `unsafe` wrapper), the
//! `openat2` handles it acts through, and their errors as the seam's.

use std::ffi::{CString, OsStr};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;

use super::{Beneath, Call, Errno, FileKind, FileStat, LinuxSys, SysError};
use crate::model::DevId;

/// The file type from the `S_IFMT` bits of a mode.
pub(super) fn kind_from_mode(mode: u32) -> Option<FileKind> {
    Some(match mode & libc::S_IFMT {
        libc::S_IFDIR => FileKind::Dir,
        libc::S_IFREG => FileKind::File,
        libc::S_IFLNK => FileKind::Symlink,
        libc::S_IFSOCK => FileKind::Socket,
        libc::S_IFCHR => FileKind::CharDevice,
        libc::S_IFBLK => FileKind::BlockDevice,
        libc::S_IFIFO => FileKind::Fifo,
        _ => return None,
    })
}

/// `S_IFMT`-free permission bits as nix's `Mode`.
pub(super) fn mode(bits: u32) -> Mode {
    Mode::from_bits_truncate(bits & 0o7777)
}

pub(super) fn cpath(call: Call, path: &Path) -> Result<CString, SysError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| SysError::call(call, path, Errno::EINVAL))
}

/// `statx(dirfd, path, flags, mask)`.
pub(super) fn statx_at(
    dirfd: RawFd,
    path: &CString,
    flags: i32,
    mask: u32,
) -> Result<libc::statx, Errno> {
    let mut buf = MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: `path` is a valid NUL-terminated string that outlives the call,
    // and `buf` points to writable memory the size of `struct statx`, which
    // is all the kernel writes.
    let rc = unsafe { libc::statx(dirfd, path.as_ptr(), flags, mask, buf.as_mut_ptr()) };
    if rc != 0 {
        return Err(Errno::last());
    }
    // SAFETY: the buffer was zero-initialised (a valid `statx`: plain
    // integers) and the kernel filled it on success.
    Ok(unsafe { buf.assume_init() })
}

/// The stat of `st`; `path` names the file in the error (made only then).
pub(super) fn file_stat(
    st: &libc::statx,
    call: Call,
    path: impl FnOnce() -> PathBuf,
) -> Result<FileStat, SysError> {
    let m = u32::from(st.stx_mode);
    Ok(FileStat {
        kind: kind_from_mode(m).ok_or_else(|| SysError::call(call, &path(), Errno::EINVAL))?,
        dev: DevId {
            major: st.stx_dev_major,
            minor: st.stx_dev_minor,
        },
        rdev: DevId {
            major: st.stx_rdev_major,
            minor: st.stx_rdev_minor,
        },
        perm: m & 0o7777,
        ino: st.stx_ino,
        ctime_ns: i128::from(st.stx_ctime.tv_sec) * 1_000_000_000
            + i128::from(st.stx_ctime.tv_nsec),
    })
}

/// `Some(is mount root)` when the kernel reported the attribute, `None` when it could not.
pub(super) fn mount_root_attr(st: &libc::statx) -> Option<bool> {
    let bit = libc::STATX_ATTR_MOUNT_ROOT as u64;
    (st.stx_attributes_mask & bit != 0).then_some(st.stx_attributes & bit != 0)
}

const RESOLVE_SAFE: ResolveFlag = ResolveFlag::RESOLVE_BENEATH
    .union(ResolveFlag::RESOLVE_NO_XDEV)
    .union(ResolveFlag::RESOLVE_NO_SYMLINKS);

impl LinuxSys {
    /// Opens the directory `dir` without following a symlink anywhere in
    /// its path (`ELOOP`); mounts on the way are crossed. For the paths
    /// removal works on: all below the daemon's root, which it resolves at
    /// startup, so a symlink in them is one planted below the root.
    /// The handle is `O_PATH`: it only serves as the directory of `*at` calls.
    pub(super) fn open_dir_no_symlinks(
        dir: &Path,
        err: impl Fn(Errno) -> SysError,
    ) -> Result<OwnedFd, SysError> {
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let how = OpenHow::new()
            .flags(flags)
            .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS);
        nix::fcntl::openat2(nix::fcntl::AT_FDCWD, dir, how).map_err(err)
    }

    /// Removes the entry `base/rel` (a directory when `dir`) in its parent,
    /// opened as [`LinuxSys::open_beneath`] does; errors are `call`'s.
    pub(super) fn unlink_beneath(
        call: Call,
        base: &Path,
        rel: &Path,
        dir: bool,
    ) -> Result<(), SysError> {
        let full = base.join(rel);
        let Some(name) = rel.file_name() else {
            return Err(SysError::call(call, &full, Errno::EINVAL));
        };
        let parent = rel.parent().unwrap_or(Path::new(""));
        let fd = Self::open_beneath(call, base, parent)?;
        let flag = if dir {
            nix::unistd::UnlinkatFlags::RemoveDir
        } else {
            nix::unistd::UnlinkatFlags::NoRemoveDir
        };
        nix::unistd::unlinkat(fd.as_fd(), name, flag).map_err(|e| SysError::call(call, &full, e))
    }

    /// [`LinuxSys::unlink_beneath`] of `path`'s name in its parent: no
    /// symlink anywhere in the path is followed.
    pub(super) fn unlink_no_symlinks(call: Call, path: &Path, dir: bool) -> Result<(), SysError> {
        match (path.parent(), path.file_name()) {
            (Some(parent), Some(name)) if !parent.as_os_str().is_empty() => {
                Self::unlink_beneath(call, parent, Path::new(name), dir)
            }
            (_, Some(name)) => Self::unlink_beneath(call, Path::new("."), Path::new(name), dir),
            _ => Err(SysError::call(call, path, Errno::EINVAL)),
        }
    }

    /// Opens `base` (no symlink anywhere in its path) and then `rel`
    /// beneath it as a directory (no symlink, no mount crossed).
    pub(super) fn open_beneath(call: Call, base: &Path, rel: &Path) -> Result<OwnedFd, SysError> {
        let err = |errno| SysError::call(call, &base.join(rel), errno);
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let base_fd = Self::open_dir_no_symlinks(base, err)?;
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        let how = OpenHow::new().flags(flags).resolve(RESOLVE_SAFE);
        nix::fcntl::openat2(base_fd.as_fd(), rel, how).map_err(err)
    }

    /// Opens `at` as an `O_PATH` handle (plus `extra`), resolved beneath its
    /// base without symlinks (mounts on the way may be crossed: a target's
    /// parents can be mounts). The base itself is opened as given. Errors
    /// name `named` (the path the caller was asked to act on).
    pub(super) fn open_path_beneath(
        call: Call,
        at: Beneath<'_>,
        extra: OFlag,
        named: &Path,
    ) -> Result<OwnedFd, SysError> {
        Self::open_at_beneath(call, at, OFlag::O_PATH | extra, named)
    }

    /// Runs `act` on `at`'s last component in its parent, the parent opened
    /// `O_PATH` beneath `at.base` without following any symlink (`ELOOP`);
    /// errors name `at`, and `at` being the base itself is `on_base`.
    pub(super) fn in_parent_beneath<T>(
        call: Call,
        at: Beneath<'_>,
        on_base: Errno,
        act: impl FnOnce(BorrowedFd<'_>, &OsStr) -> nix::Result<T>,
    ) -> Result<T, SysError> {
        let path = at.full();
        let err = |e| SysError::call(call, &path, e);
        let (Some(parent), Some(name)) = (at.parent(), at.rel.file_name()) else {
            return Err(err(on_base));
        };
        let dir = Self::open_path_beneath(call, parent, OFlag::O_DIRECTORY, &path)?;
        act(dir.as_fd(), name).map_err(err)
    }

    /// `at` opened `O_PATH` beneath `at.base`, following symlinks only
    /// while they stay beneath it (`Sys::stat_within`); errors name `named`.
    pub(super) fn open_path_within(
        call: Call,
        at: Beneath<'_>,
        named: &Path,
    ) -> Result<OwnedFd, SysError> {
        let err = |errno| SysError::call(call, named, errno);
        let flags = OFlag::O_PATH | OFlag::O_CLOEXEC;
        let base_fd =
            nix::fcntl::open(at.base, flags | OFlag::O_DIRECTORY, Mode::empty()).map_err(err)?;
        if at.rel.as_os_str().is_empty() {
            return Ok(base_fd);
        }
        let resolve = ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS;
        let how = OpenHow::new().flags(flags).resolve(resolve);
        nix::fcntl::openat2(base_fd.as_fd(), at.rel, how).map_err(err)
    }

    /// The stat of an open descriptor (`statx(AT_EMPTY_PATH)`).
    pub(super) fn stat_fd(fd: &OwnedFd, call: Call, named: &Path) -> Result<FileStat, SysError> {
        let empty = CString::default();
        let st = statx_at(
            fd.as_raw_fd(),
            &empty,
            libc::AT_EMPTY_PATH,
            libc::STATX_BASIC_STATS,
        )
        .map_err(|e| SysError::call(call, named, e))?;
        file_stat(&st, call, || named.to_owned())
    }

    /// [`LinuxSys::open_path_beneath`] with `flags` as given (plus
    /// `O_CLOEXEC`), for a handle that must allow I/O (`fchmod`).
    pub(super) fn open_at_beneath(
        call: Call,
        at: Beneath<'_>,
        flags: OFlag,
        named: &Path,
    ) -> Result<OwnedFd, SysError> {
        let err = |errno| SysError::call(call, named, errno);
        let flags = flags | OFlag::O_CLOEXEC;
        let base_fd =
            nix::fcntl::open(at.base, flags | OFlag::O_DIRECTORY, Mode::empty()).map_err(err)?;
        if at.rel.as_os_str().is_empty() {
            return Ok(base_fd);
        }
        // (NO_SYMLINKS covers magic links too)
        let resolve = ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS;
        let how = OpenHow::new().flags(flags).resolve(resolve);
        nix::fcntl::openat2(base_fd.as_fd(), at.rel, how).map_err(err)
    }
}

impl LinuxSys {
    /// The file `at` opened for I/O with `flags` (plus `O_CLOEXEC`): its
    /// base opened `O_PATH` as a directory, then `at.rel` beneath it with
    /// no symlink followed, the file itself included (`ELOOP`). For the
    /// files volumed opens by content (the device a loop device holds).
    pub(super) fn open_file_beneath(
        call: Call,
        at: Beneath<'_>,
        flags: OFlag,
    ) -> Result<OwnedFd, SysError> {
        let named = at.full();
        let err = |errno| SysError::call(call, &named, errno);
        let dir = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let base_fd = nix::fcntl::open(at.base, dir, Mode::empty()).map_err(err)?;
        let resolve = ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS;
        let how = OpenHow::new()
            .flags(flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
            .resolve(resolve);
        nix::fcntl::openat2(base_fd.as_fd(), at.rel, how).map_err(err)
    }
}

pub(super) fn std_kind(t: std::fs::FileType) -> Option<FileKind> {
    use std::os::unix::fs::FileTypeExt;
    Some(if t.is_dir() {
        FileKind::Dir
    } else if t.is_file() {
        FileKind::File
    } else if t.is_symlink() {
        FileKind::Symlink
    } else if t.is_socket() {
        FileKind::Socket
    } else if t.is_char_device() {
        FileKind::CharDevice
    } else if t.is_block_device() {
        FileKind::BlockDevice
    } else if t.is_fifo() {
        FileKind::Fifo
    } else {
        return None;
    })
}

/// An I/O error of `call` on `path` as the seam's error (its errno, else `EIO`).
pub(super) fn io_error(call: Call, path: &Path, e: &std::io::Error) -> SysError {
    let errno = e.raw_os_error().map_or(Errno::EIO, Errno::from_raw);
    SysError::call(call, path, errno)
}
