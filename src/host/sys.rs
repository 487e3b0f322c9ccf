//! The one syscall seam: every kernel call volumed makes to change or probe
//! mounts and volume directories goes through the [`Sys`] trait.
//!
//! - [`LinuxSys`] is the real implementation: a thin pass-through to `nix`,
//!   with raw `libc` only for `statx` (nix has no wrapper) — the only
//!   `unsafe` in the crate, each block with a `SAFETY` note.
//! - `RecordingSys` (`host::recording_sys`, test builds) is the fake for unit tests:
//!   it records every call as a typed `SysCall`,
//!   keeps a fake file tree and mount table, and fails the n-th call of a
//!   kind with a chosen errno.
//!
//! The implementation is passed in explicitly (`&dyn Sys`, `Arc<dyn Sys>`),
//! never chosen by `cfg(test)`.
//!
//! Decisions written down here:
//! - **Mount-root detection** ([`Sys::mount_root`]): `statx` with
//!   `STATX_ATTR_MOUNT_ROOT` (Linux ≥ 5.8), which also catches a bind mount of
//!   a directory of the same filesystem. When the kernel does not report the
//!   attribute, fall back to "`st_dev` differs from the parent's" plus a
//!   mount-table lookup (which catches same-filesystem binds the `st_dev`
//!   heuristic misses, storage-facts D4).
//! - **Removal** ([`Sys::read_dir_beneath`], [`Sys::remove_beneath`],
//!   [`Sys::rmdir`], [`Sys::unlink`]): the directory being removed (the
//!   walk's start) is opened with `openat2(RESOLVE_NO_SYMLINKS)` from the
//!   current directory, so a symlink anywhere in its path fails the call
//!   (`ELOOP`) — its paths are below the daemon's root, which is resolved at
//!   startup, so a symlink there was planted; every directory below it is
//!   opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_XDEV |
//!   RESOLVE_NO_SYMLINKS)` relative to it, so a symlink swapped in or a
//!   mount point on the way fails the call (`ELOOP`, `EXDEV`) instead of
//!   being followed; entries are removed with `unlinkat` in a parent opened
//!   the same way, which never follows the last component (storage-facts
//!   D5, D6). The checks before a removal (`stat`, [`Sys::mount_root`]) read
//!   by path; whatever they were told, the removal itself refuses a symlink.
//! - **Targets beneath the root** ([`Sys::stat_beneath`],
//!   [`Sys::mkdir_beneath`], [`Sys::mount_beneath`], [`Sys::bind_beneath`],
//!   [`Sys::umount2_beneath`], [`Sys::chmod_dir_beneath`],
//!   [`Sys::create_file_beneath`], [`Sys::rename_beneath`],
//!   [`Sys::rmdir_beneath`]):
//!   a mount target and the directories on its way are reached from the root
//!   dir with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` (mounts on the
//!   way may be crossed), and the mount is made on the opened `O_PATH`
//!   handle's `/proc/self/fd/N`, so a symlink anywhere below the root fails
//!   the call with `ELOOP` instead of sending the volume elsewhere, and
//!   nothing swapped in after the check can redirect the mount. Here the
//!   root itself may sit behind a symlink (the daemon resolves it anyway,
//!   for removal and for the mount table's resolved paths).
//! - **Filesystem probe** ([`Sys::probe_fs`]): runs `blkid -p -s TYPE -s
//!   PTTYPE -o export <dev>` like the kubelet's `GetDiskFormat`: a low-level
//!   probe that reads the device itself (not the udev cache). Exit status 2
//!   means "nothing identifiable" (unformatted); a partition table without a
//!   filesystem is reported as such and must never be formatted over.
//! - **Formatting** ([`Sys::mkfs`]): runs `mkfs.<fs>` as a child; ext2/3/4
//!   get `-F -m0` as the kubelet passes them.

use std::ffi::{CString, OsStr, OsString};
use std::io::Read;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;

use crate::host::mountinfo::{MountTable, read_pieces};
use crate::model::DevId;

pub use crate::host::sys_types::{
    Beneath, Call, DirEntry, DiskFormat, FileKind, FileStat, Listing, SysCall, SysError,
};
pub use nix::errno::Errno;
pub use nix::mount::{MntFlags, MsFlags};

/// One method per kernel call volumed needs (see the module docs).
pub trait Sys: Send + Sync {
    /// `mount(2)`.
    fn mount(
        &self,
        source: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Result<(), SysError>;
    /// `mount(2)` onto `at.rel` resolved beneath `at.base` without following
    /// any symlink (`ELOOP`) or leaving the base: the target is opened
    /// `O_PATH` and the mount made on its `/proc/self/fd/N`, so nothing
    /// swapped in between the check and the mount can redirect it. Errors
    /// and the recording fake name `base/rel`.
    fn mount_beneath(
        &self,
        source: Option<&Path>,
        at: Beneath<'_>,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Result<(), SysError>;
    /// Binds `source` onto `at` (`MS_BIND`), both reached beneath their bases
    /// without following any symlink (`ELOOP`): each is opened `O_PATH` and
    /// the mount made between their `/proc/self/fd/N`, so neither end can
    /// be redirected after the check. Errors name `at`.
    fn bind_beneath(&self, source: Beneath<'_>, at: Beneath<'_>) -> Result<(), SysError>;
    /// `umount2(2)` of the mount at `at`, with [`MntFlags::UMOUNT_NOFOLLOW`]
    /// added: its parent is opened beneath `at.base` without following any
    /// symlink (`ELOOP`) and the unmount named through that handle
    /// (`/proc/self/fd/N/<name>`), so a directory swapped for a symlink on
    /// the way cannot send it to another pod's mount. (The parent, not the
    /// target, is held open: a handle on the mount itself would make it
    /// busy.)
    fn umount2_beneath(&self, at: Beneath<'_>, flags: MntFlags) -> Result<(), SysError>;
    /// Whether `path` (not following a last symlink) is the root of a mount,
    /// same-filesystem binds included.
    fn mount_root(&self, path: &Path) -> Result<bool, SysError>;
    /// The mount id (`STATX_MNT_ID`) of the mount holding `path`.
    fn mnt_id(&self, path: &Path) -> Result<u64, SysError>;
    /// `statx`; `follow` follows a last symlink (for device paths such as
    /// `/dev/disk/by-id/…`).
    fn stat(&self, path: &Path, follow: bool) -> Result<FileStat, SysError>;
    /// `statx` of `at` (never following it), reached beneath `at.base`
    /// without following any symlink on the way (`ELOOP`).
    fn stat_beneath(&self, at: Beneath<'_>) -> Result<FileStat, SysError>;
    /// `mkdir(2)` with this mode (the umask still applies; see
    /// [`Sys::chmod_dir_beneath`]).
    fn mkdir(&self, path: &Path, mode: u32) -> Result<(), SysError>;
    /// `mkdirat(2)` of `at.rel`'s last component in its parent, the parent
    /// opened beneath `at.base` without following any symlink (`ELOOP`).
    fn mkdir_beneath(&self, at: Beneath<'_>, mode: u32) -> Result<(), SysError>;
    /// Sets the permission bits of the directory `at`, opened beneath
    /// `at.base` without following any symlink, itself included (`ELOOP`).
    fn chmod_dir_beneath(&self, at: Beneath<'_>, mode: u32) -> Result<(), SysError>;
    /// Creates an empty regular file; fails with `EEXIST` if anything is there.
    fn create_file(&self, path: &Path, mode: u32) -> Result<(), SysError>;
    /// [`Sys::create_file`] of `at`'s last component in its parent, the
    /// parent opened beneath `at.base` without following any symlink (`ELOOP`).
    fn create_file_beneath(&self, at: Beneath<'_>, mode: u32) -> Result<(), SysError>;
    /// Renames the entry `from` to `to_name` in the same directory without
    /// replacing (`EEXIST` if taken); the directory is opened beneath
    /// `from.base` without following any symlink (`ELOOP`), and the entry
    /// itself is never followed.
    fn rename_beneath(&self, from: Beneath<'_>, to_name: &OsStr) -> Result<(), SysError>;
    /// `rmdir(2)`: only an empty directory that is not a mount point. No
    /// symlink anywhere in `path` is followed (`ELOOP`): removal works on
    /// paths below the daemon's root, which it resolves at startup.
    fn rmdir(&self, path: &Path) -> Result<(), SysError>;
    /// `unlinkat(AT_REMOVEDIR)` of `at`'s last component in its parent, the
    /// parent opened beneath `at.base` without following any symlink
    /// (`ELOOP`).
    fn rmdir_beneath(&self, at: Beneath<'_>) -> Result<(), SysError>;
    /// `unlink(2)`: removes a non-directory, a symlink itself rather than its
    /// target; no symlink above it is followed (`ELOOP`), as for [`Sys::rmdir`].
    fn unlink(&self, path: &Path) -> Result<(), SysError>;
    /// Lists `base/rel` (`rel` empty for `base`), opened beneath `base`
    /// without following symlinks or crossing mounts; `base` itself is
    /// reached without following a symlink anywhere in its path, as for
    /// [`Sys::rmdir`] (so a directory above it swapped for a symlink between
    /// two calls of a walk fails the next one).
    fn read_dir_beneath(&self, base: &Path, rel: &Path) -> Result<Vec<DirEntry>, SysError>;
    /// Removes the entry `base/rel` (a directory when `dir`, which must be
    /// empty), its parent opened beneath `base` without following symlinks
    /// or crossing mounts.
    fn remove_beneath(&self, base: &Path, rel: &Path, dir: bool) -> Result<(), SysError>;
    /// Creates a filesystem of type `fstype` on `device`.
    fn mkfs(&self, device: &Path, fstype: &str) -> Result<(), SysError>;
    /// What `device` holds.
    fn probe_fs(&self, device: &Path) -> Result<DiskFormat, SysError>;
    /// The mount table as this process sees it.
    fn read_mountinfo(&self) -> Result<MountTable, SysError>;
    /// Reads `/proc/self/mountinfo` and hands it to `piece` in pieces cut
    /// anywhere, as they arrive (so a caller can parse while the kernel
    /// still formats the rest); stops early when `piece` returns false.
    fn read_mountinfo_pieces(&self, piece: &mut dyn FnMut(Vec<u8>) -> bool)
    -> Result<(), SysError>;
    /// `realpath(3)`: `path` with every symlink, `.` and `..` resolved.
    fn canonicalize(&self, path: &Path) -> Result<PathBuf, SysError>;
    /// The entries of the directory `path`, each classified by `lstat`
    /// (never followed); an entry gone before its `lstat` is left out.
    fn read_dir(&self, path: &Path) -> Result<Listing, SysError>;
    /// The whole of a regular file of at most `limit` bytes (sysfs
    /// attributes, CSI `vol_data.json`). With `follow` false a symlink at
    /// the last component fails with `ELOOP`; anything but a regular file
    /// fails with `EINVAL`, a larger file with `EFBIG`.
    fn read_file(&self, path: &Path, limit: u64, follow: bool) -> Result<Vec<u8>, SysError>;
}

/// Creates `path` and any missing parents with `mode` (like `mkdir -p`,
/// following symlinks like it); an existing directory is fine, anything
/// else there is `ENOTDIR`.
///
/// `mkdir` comes first and the parents only on `ENOENT`, as `mkdir -p`
/// does: a target whose parent exists (the common case: a pod's second
/// volume, a marker beside its volume) costs one `mkdir`, where asking
/// `stat` first cost a `stat` per missing level and one more for the
/// parent that exists. Only an existing entry costs a `stat`, to tell a
/// directory (or a symlink to one) from anything else.
pub fn mkdir_all(sys: &dyn Sys, path: &Path, mode: u32) -> Result<(), SysError> {
    leaf_first(
        path,
        &|p| sys.mkdir(p, mode),
        &|p| p.parent().filter(|p| !p.as_os_str().is_empty()),
        &|p| existing_dir(sys, p),
    )
}

/// Like [`mkdir_all`] for `at.rel` beneath `at.base`, with no symlink
/// followed anywhere below the base: every level is made with
/// [`Sys::mkdir_beneath`], and an existing entry must be a directory
/// itself (a symlink there, even to a directory, is `ELOOP`).
pub fn mkdir_all_beneath(sys: &dyn Sys, at: Beneath<'_>, mode: u32) -> Result<(), SysError> {
    leaf_first(
        at,
        &|b| sys.mkdir_beneath(b, mode),
        &|b| b.parent().filter(|b| !b.rel.as_os_str().is_empty()),
        &|b| {
            let full = b.full();
            match sys.stat_beneath(b)?.kind {
                FileKind::Dir => Ok(()),
                FileKind::Symlink => Err(SysError::call(Call::Mkdir, &full, Errno::ELOOP)),
                _ => Err(SysError::call(Call::Mkdir, &full, Errno::ENOTDIR)),
            }
        },
    )
}

/// `mkdir -p`'s order: the leaf first, its parents only on `ENOENT`, and
/// an existing entry checked by `existing`.
fn leaf_first<P: Copy>(
    p: P,
    mkdir: &dyn Fn(P) -> Result<(), SysError>,
    parent: &dyn Fn(P) -> Option<P>,
    existing: &dyn Fn(P) -> Result<(), SysError>,
) -> Result<(), SysError> {
    match mkdir(p) {
        Err(e) if e.errno() == Some(Errno::ENOENT) => {
            if let Some(up) = parent(p) {
                leaf_first(up, mkdir, parent, existing)?;
            }
            match mkdir(p) {
                // created by someone else in between
                Err(e) if e.errno() == Some(Errno::EEXIST) => existing(p),
                other => other,
            }
        }
        Err(e) if e.errno() == Some(Errno::EEXIST) => existing(p),
        other => other,
    }
}

/// `Ok` when `path`, which exists, is a directory or a symlink to one.
fn existing_dir(sys: &dyn Sys, path: &Path) -> Result<(), SysError> {
    match sys.stat(path, true) {
        Ok(st) if st.kind == FileKind::Dir => Ok(()),
        Ok(_) => Err(SysError::call(Call::Mkdir, path, Errno::ENOTDIR)),
        Err(e) => Err(e),
    }
}

/// The file type from the `S_IFMT` bits of a mode.
fn kind_from_mode(mode: u32) -> Option<FileKind> {
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

/// The real kernel, through nix (libc for `statx`).
#[derive(Debug, Default, Clone, Copy)]
pub struct LinuxSys;

/// `S_IFMT`-free permission bits as nix's `Mode`.
fn mode(bits: u32) -> Mode {
    Mode::from_bits_truncate(bits & 0o7777)
}

fn cpath(call: Call, path: &Path) -> Result<CString, SysError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| SysError::call(call, path, Errno::EINVAL))
}

/// `statx(dirfd, path, flags, mask)`.
fn statx_at(dirfd: RawFd, path: &CString, flags: i32, mask: u32) -> Result<libc::statx, Errno> {
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

fn file_stat(st: &libc::statx, call: Call, path: &Path) -> Result<FileStat, SysError> {
    let m = u32::from(st.stx_mode);
    Ok(FileStat {
        kind: kind_from_mode(m).ok_or_else(|| SysError::call(call, path, Errno::EINVAL))?,
        dev: DevId {
            major: st.stx_dev_major,
            minor: st.stx_dev_minor,
        },
        rdev: DevId {
            major: st.stx_rdev_major,
            minor: st.stx_rdev_minor,
        },
        perm: m & 0o7777,
    })
}

/// `Some(is mount root)` when the kernel reported the attribute, `None` when it could not.
fn mount_root_attr(st: &libc::statx) -> Option<bool> {
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
    fn open_dir_no_symlinks(
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
    fn unlink_beneath(call: Call, base: &Path, rel: &Path, dir: bool) -> Result<(), SysError> {
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
    fn unlink_no_symlinks(call: Call, path: &Path, dir: bool) -> Result<(), SysError> {
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
    fn open_beneath(call: Call, base: &Path, rel: &Path) -> Result<OwnedFd, SysError> {
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
    fn open_path_beneath(
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
    fn in_parent_beneath<T>(
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

    /// [`LinuxSys::open_path_beneath`] with `flags` as given (plus
    /// `O_CLOEXEC`), for a handle that must allow I/O (`fchmod`).
    fn open_at_beneath(
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

impl Sys for LinuxSys {
    fn mount(
        &self,
        source: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Result<(), SysError> {
        nix::mount::mount(source, target, fstype, flags, data)
            .map_err(|e| SysError::call(Call::Mount, target, e))
    }

    fn mount_beneath(
        &self,
        source: Option<&Path>,
        at: Beneath<'_>,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Result<(), SysError> {
        let fd = Self::open_path_beneath(Call::Mount, at, OFlag::empty(), &at.full())?;
        let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        nix::mount::mount(source, proc_path.as_str(), fstype, flags, data)
            .map_err(|e| SysError::call(Call::Mount, &at.full(), e))
    }

    fn bind_beneath(&self, source: Beneath<'_>, at: Beneath<'_>) -> Result<(), SysError> {
        let target = at.full();
        let from = Self::open_path_beneath(Call::Mount, source, OFlag::empty(), &target)?;
        let to = Self::open_path_beneath(Call::Mount, at, OFlag::empty(), &target)?;
        let from_path = format!("/proc/self/fd/{}", from.as_raw_fd());
        let to_path = format!("/proc/self/fd/{}", to.as_raw_fd());
        nix::mount::mount(
            Some(from_path.as_str()),
            to_path.as_str(),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| SysError::call(Call::Mount, &target, e))
    }

    fn umount2_beneath(&self, at: Beneath<'_>, flags: MntFlags) -> Result<(), SysError> {
        Self::in_parent_beneath(Call::Umount, at, Errno::EINVAL, |dir, name| {
            let through = Path::new(&format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name);
            nix::mount::umount2(&through, flags | MntFlags::UMOUNT_NOFOLLOW)
        })
    }

    fn mount_root(&self, path: &Path) -> Result<bool, SysError> {
        let c = cpath(Call::MountRoot, path)?;
        let st = statx_at(
            libc::AT_FDCWD,
            &c,
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_BASIC_STATS,
        )
        .map_err(|e| SysError::call(Call::MountRoot, path, e))?;
        if let Some(root) = mount_root_attr(&st) {
            return Ok(root);
        }
        // Kernel < 5.8: st_dev against the parent, then the mount table for
        // same-filesystem binds.
        let Some(parent) = path.parent() else {
            return Ok(true);
        };
        let parent_dev = self.stat(parent, true)?.dev;
        if (st.stx_dev_major, st.stx_dev_minor) != (parent_dev.major, parent_dev.minor) {
            return Ok(true);
        }
        Ok(self.read_mountinfo()?.is_mount_point(path))
    }

    fn mnt_id(&self, path: &Path) -> Result<u64, SysError> {
        let c = cpath(Call::MntId, path)?;
        let st = statx_at(
            libc::AT_FDCWD,
            &c,
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_MNT_ID,
        )
        .map_err(|e| SysError::call(Call::MntId, path, e))?;
        if st.stx_mask & libc::STATX_MNT_ID == 0 {
            return Err(SysError::call(Call::MntId, path, Errno::ENOSYS));
        }
        Ok(st.stx_mnt_id)
    }

    fn stat(&self, path: &Path, follow: bool) -> Result<FileStat, SysError> {
        let c = cpath(Call::Stat, path)?;
        let flags = if follow { 0 } else { libc::AT_SYMLINK_NOFOLLOW };
        let st = statx_at(libc::AT_FDCWD, &c, flags, libc::STATX_BASIC_STATS)
            .map_err(|e| SysError::call(Call::Stat, path, e))?;
        file_stat(&st, Call::Stat, path)
    }

    fn mkdir(&self, path: &Path, m: u32) -> Result<(), SysError> {
        nix::unistd::mkdir(path, mode(m)).map_err(|e| SysError::call(Call::Mkdir, path, e))
    }

    fn stat_beneath(&self, at: Beneath<'_>) -> Result<FileStat, SysError> {
        let path = at.full();
        let Some(parent) = at.parent() else {
            return self.stat(&path, false); // the base itself
        };
        let leaf = cpath(
            Call::Stat,
            Path::new(at.rel.file_name().unwrap_or_default()),
        )?;
        let dir = Self::open_path_beneath(Call::Stat, parent, OFlag::O_DIRECTORY, &path)?;
        let st = statx_at(
            dir.as_raw_fd(),
            &leaf,
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_BASIC_STATS,
        )
        .map_err(|e| SysError::call(Call::Stat, &path, e))?;
        file_stat(&st, Call::Stat, &path)
    }

    fn mkdir_beneath(&self, at: Beneath<'_>, m: u32) -> Result<(), SysError> {
        Self::in_parent_beneath(Call::Mkdir, at, Errno::EEXIST, |dir, name| {
            nix::sys::stat::mkdirat(dir, name, mode(m))
        })
    }

    fn chmod_dir_beneath(&self, at: Beneath<'_>, m: u32) -> Result<(), SysError> {
        let path = at.full();
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY;
        let fd = Self::open_at_beneath(Call::ChmodDir, at, flags, &path)?;
        nix::sys::stat::fchmod(fd.as_fd(), mode(m))
            .map_err(|e| SysError::call(Call::ChmodDir, &path, e))
    }

    fn create_file_beneath(&self, at: Beneath<'_>, m: u32) -> Result<(), SysError> {
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        Self::in_parent_beneath(Call::CreateFile, at, Errno::EEXIST, |dir, name| {
            nix::fcntl::openat(dir, name, flags, mode(m)).map(drop)
        })
    }

    fn create_file(&self, path: &Path, m: u32) -> Result<(), SysError> {
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        nix::fcntl::open(path, flags, mode(m))
            .map(drop)
            .map_err(|e| SysError::call(Call::CreateFile, path, e))
    }

    fn rename_beneath(&self, from: Beneath<'_>, to_name: &OsStr) -> Result<(), SysError> {
        Self::in_parent_beneath(Call::Rename, from, Errno::EINVAL, |dir, name| {
            let flags = nix::fcntl::RenameFlags::RENAME_NOREPLACE;
            nix::fcntl::renameat2(dir, name, dir, to_name, flags)
        })
    }

    fn rmdir_beneath(&self, at: Beneath<'_>) -> Result<(), SysError> {
        Self::in_parent_beneath(Call::Rmdir, at, Errno::EBUSY, |dir, name| {
            nix::unistd::unlinkat(dir, name, nix::unistd::UnlinkatFlags::RemoveDir)
        })
    }

    fn rmdir(&self, path: &Path) -> Result<(), SysError> {
        Self::unlink_no_symlinks(Call::Rmdir, path, true)
    }

    fn unlink(&self, path: &Path) -> Result<(), SysError> {
        Self::unlink_no_symlinks(Call::Unlink, path, false)
    }

    fn read_dir_beneath(&self, base: &Path, rel: &Path) -> Result<Vec<DirEntry>, SysError> {
        let call = Call::ReadDirBeneath;
        let fd = Self::open_beneath(call, base, rel)?;
        let err = |e| SysError::call(call, &base.join(rel), e);
        let dot = CString::from(c".");
        let own = statx_at(fd.as_raw_fd(), &dot, 0, libc::STATX_BASIC_STATS).map_err(err)?;
        let mut dir = nix::dir::Dir::from_fd(fd).map_err(err)?;
        let mut names = Vec::new();
        for entry in dir.iter() {
            let entry = entry.map_err(err)?;
            let name = entry.file_name();
            if name != c"." && name != c".." {
                names.push(name.to_owned());
            }
        }
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let os = OsString::from(std::ffi::OsStr::from_bytes(name.as_bytes()));
            let path = base.join(rel).join(&os);
            let st = statx_at(
                dir.as_raw_fd(),
                &name,
                libc::AT_SYMLINK_NOFOLLOW,
                libc::STATX_BASIC_STATS,
            )
            .map_err(|e| SysError::call(Call::Stat, &path, e))?;
            let kind = file_stat(&st, Call::Stat, &path)?.kind;
            let other_dev =
                (st.stx_dev_major, st.stx_dev_minor) != (own.stx_dev_major, own.stx_dev_minor);
            let mount_root = mount_root_attr(&st).unwrap_or(other_dev) || other_dev;
            out.push(DirEntry {
                name: os,
                kind,
                mount_root,
            });
        }
        Ok(out)
    }

    fn remove_beneath(&self, base: &Path, rel: &Path, dir: bool) -> Result<(), SysError> {
        Self::unlink_beneath(Call::RemoveBeneath, base, rel, dir)
    }

    fn mkfs(&self, device: &Path, fstype: &str) -> Result<(), SysError> {
        if fstype.is_empty() || !fstype.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(SysError::call(Call::Mkfs, device, Errno::EINVAL));
        }
        let program = format!("mkfs.{fstype}");
        let mut cmd = Command::new(&program);
        if matches!(fstype, "ext2" | "ext3" | "ext4") {
            cmd.args(["-F", "-m0"]);
        }
        cmd.arg(device);
        run(Call::Mkfs, device, &program, &mut cmd).map(drop)
    }

    fn probe_fs(&self, device: &Path) -> Result<DiskFormat, SysError> {
        let mut cmd = Command::new("blkid");
        cmd.args(["-p", "-s", "TYPE", "-s", "PTTYPE", "-o", "export"]);
        cmd.arg(device);
        let out = match run(Call::ProbeFs, device, "blkid", &mut cmd) {
            Ok(out) => out,
            Err(SysError::Command { status, .. }) if status == "exit status: 2" => {
                return Ok(DiskFormat::Unformatted);
            }
            Err(e) => return Err(e),
        };
        Ok(parse_blkid_export(&out))
    }

    fn read_mountinfo(&self) -> Result<MountTable, SysError> {
        MountTable::read_self().map_err(|e| SysError::MountInfo(Box::new(e)))
    }

    fn read_mountinfo_pieces(
        &self,
        piece: &mut dyn FnMut(Vec<u8>) -> bool,
    ) -> Result<(), SysError> {
        read_pieces(Path::new(LIVE_MOUNTINFO), piece).map_err(|e| SysError::MountInfo(Box::new(e)))
    }

    fn canonicalize(&self, path: &Path) -> Result<PathBuf, SysError> {
        std::fs::canonicalize(path).map_err(|e| io_error(Call::Canonicalize, path, &e))
    }

    fn read_dir(&self, path: &Path) -> Result<Listing, SysError> {
        let err = |e: &std::io::Error| io_error(Call::ReadDir, path, e);
        let mut out = Vec::new();
        for entry in std::fs::read_dir(path).map_err(|e| err(&e))? {
            let entry = entry.map_err(|e| err(&e))?;
            // the dirent's type when the filesystem gives one, else `lstat`
            let kind = match entry.file_type() {
                Ok(t) => std_kind(t)
                    .ok_or_else(|| SysError::call(Call::Stat, &entry.path(), Errno::EINVAL)),
                // raced with a removal: nothing there any more
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => Err(io_error(Call::Stat, &entry.path(), &e)),
            };
            out.push((entry.file_name(), kind));
        }
        Ok(out)
    }

    fn read_file(&self, path: &Path, limit: u64, follow: bool) -> Result<Vec<u8>, SysError> {
        let err = |e: Errno| SysError::call(Call::ReadFile, path, e);
        // O_NONBLOCK: opening a FIFO planted there must not hang the read
        let mut flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
        if !follow {
            flags |= OFlag::O_NOFOLLOW;
        }
        let fd = nix::fcntl::open(path, flags, Mode::empty()).map_err(err)?;
        let mut file = std::fs::File::from(fd);
        let md = file
            .metadata()
            .map_err(|e| io_error(Call::ReadFile, path, &e))?;
        if !md.is_file() {
            return Err(err(Errno::EINVAL));
        }
        if md.len() > limit {
            return Err(err(Errno::EFBIG));
        }
        let mut bytes = Vec::new();
        (&mut file)
            .take(limit + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| io_error(Call::ReadFile, path, &e))?;
        if bytes.len() as u64 > limit {
            return Err(err(Errno::EFBIG));
        }
        Ok(bytes)
    }
}

fn std_kind(t: std::fs::FileType) -> Option<FileKind> {
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

/// The live mount table of this process.
pub const LIVE_MOUNTINFO: &str = "/proc/self/mountinfo";

/// An I/O error of `call` on `path` as the seam's error (its errno, else `EIO`).
fn io_error(call: Call, path: &Path, e: &std::io::Error) -> SysError {
    let errno = e.raw_os_error().map_or(Errno::EIO, Errno::from_raw);
    SysError::call(call, path, errno)
}

/// Runs a child, returning its stdout on success.
fn run(call: Call, path: &Path, program: &str, cmd: &mut Command) -> Result<String, SysError> {
    let fail = |status: String, stderr: String| SysError::Command {
        call,
        path: path.to_owned(),
        program: program.to_owned(),
        status,
        stderr,
    };
    let out = cmd
        .output()
        .map_err(|e| fail(format!("could not start: {e}"), String::new()))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        return Err(fail(out.status.to_string(), stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Reads `blkid -o export` output (`TYPE=ext4`, `PTTYPE=dos` lines).
pub fn parse_blkid_export(out: &str) -> DiskFormat {
    let value = |key: &str| {
        out.lines()
            .find_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    match (value("TYPE"), value("PTTYPE")) {
        (Some(fs), _) => DiskFormat::Filesystem(fs),
        (None, Some(pt)) => DiskFormat::PartitionTable(pt),
        (None, None) => DiskFormat::Unformatted,
    }
}

/// Caps glibc's malloc at `arenas` arenas (`mallopt(M_ARENA_MAX)`), unless
/// `MALLOC_ARENA_MAX` is set in the environment (glibc reads that itself and
/// it wins). glibc otherwise gives each thread that contends for a lock an
/// arena of its own (up to 8 per core); the daemon's worker, tokio and sled
/// threads each fill one with the per-volume records they allocate, and
/// their freed space is kept per arena, so RSS per volume grows with the
/// thread count. Call it first thing in `main`, before any thread starts.
/// Returns whether the cap was set (always `false` off glibc).
pub fn limit_malloc_arenas(arenas: i32) -> bool {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return false;
    }
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: `mallopt` only changes a tunable of the allocator; it takes
        // no pointers, and glibc makes it safe to call at any time (it locks
        // the main arena). Called before other threads exist, it also cannot
        // race with an arena being created.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) == 1 }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        let _ = arenas;
        false
    }
}

/// Gives the allocator's free pages back to the kernel (`malloc_trim(0)`).
/// glibc returns memory on `free` only from the top of a heap; what a burst
/// of work freed in the middle (parsed manifests, job reports, journal
/// buffers) otherwise stays in RSS. Returns whether anything was released
/// (always `false` off glibc).
pub fn trim_malloc() -> bool {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: `malloc_trim` takes no pointers; it locks each arena while
        // it releases whole free pages (madvise), so any thread may call it
        // at any time.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blkid_export_is_read_like_the_kubelet_does() {
        assert_eq!(
            parse_blkid_export("DEVNAME=/dev/loop0\nTYPE=ext4\n"),
            DiskFormat::Filesystem("ext4".into())
        );
        assert_eq!(
            parse_blkid_export("DEVNAME=/dev/sda\nPTTYPE=gpt\n"),
            DiskFormat::PartitionTable("gpt".into())
        );
        assert_eq!(parse_blkid_export(""), DiskFormat::Unformatted);
    }

    #[test]
    fn errors_name_the_call_the_path_and_the_errno() {
        let e = SysError::call(Call::Umount, Path::new("/a b"), Errno::EBUSY);
        assert_eq!(
            e.to_string(),
            "umount2 /a b: EBUSY: Device or resource busy"
        );
        assert_eq!(e.kind(), Call::Umount);
    }

    /// `mkdir -p` on the real filesystem: what exists is kept, missing
    /// levels are made, and anything but a directory (or a symlink to one)
    /// in the way is an error, a dangling symlink included.
    #[test]
    fn mkdir_all_makes_missing_levels_and_refuses_what_is_not_a_dir() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        std::fs::create_dir(p.join("dir")).unwrap();
        std::fs::write(p.join("file"), b"").unwrap();
        std::os::unix::fs::symlink(p.join("dir"), p.join("to-dir")).unwrap();
        std::os::unix::fs::symlink(p.join("gone"), p.join("dangling")).unwrap();
        let table: [(&str, Option<Errno>); 7] = [
            ("dir", None),
            ("to-dir", None),
            ("to-dir/made", None),
            ("new/a/b", None),
            ("file", Some(Errno::ENOTDIR)),
            ("file/below", Some(Errno::ENOTDIR)),
            ("dangling", Some(Errno::ENOENT)),
        ];
        for (rel, want) in table {
            let path = p.join(rel);
            let got = mkdir_all(&LinuxSys, &path, 0o750)
                .err()
                .and_then(|e| e.errno());
            assert_eq!(got, want, "{rel}");
            if want.is_none() {
                let meta = std::fs::metadata(&path).unwrap();
                assert!(meta.is_dir(), "{rel}");
            }
        }
        // (the umask may take bits away, never add any)
        let mode = std::fs::metadata(p.join("new/a"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777 & !0o750, 0, "new levels get at most the mode");
    }

    #[test]
    fn the_real_statx_sees_a_directory_and_the_root_mount() {
        let dir = tempfile::tempdir().unwrap();
        let st = LinuxSys.stat(dir.path(), false).unwrap();
        assert_eq!(st.kind, FileKind::Dir);
        assert!(LinuxSys.mount_root(Path::new("/")).unwrap());
        assert!(!LinuxSys.mount_root(dir.path()).unwrap());
        assert!(LinuxSys.mnt_id(dir.path()).unwrap() > 0);
    }
}
