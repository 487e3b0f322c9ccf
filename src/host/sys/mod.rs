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
//!   heuristic misses).
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
//!   the same way, which never follows the last component (so a symlink
//!   swapped in after a check redirects nothing). The checks before a removal (`stat`, [`Sys::mount_root`]) read
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
//! - **Acting in one directory** ([`Sys::open_dir_beneath`],
//!   [`Sys::open_dirs_beneath`] and the `*_in` calls): the directory is
//!   opened once as the targets above are (beneath the root, no symlink
//!   followed; made first when missing) and held as a [`DirHandle`];
//!   each `*_in` call then names an entry relative to that descriptor: a
//!   single name acted on with an `*at` call that never follows it, a
//!   nested one's parent opened with `openat2(RESOLVE_BENEATH |
//!   RESOLVE_NO_SYMLINKS)` from the handle. The same guarantees as the
//!   `*_beneath` calls, with the path from the root resolved once per
//!   directory instead of once per call (the payload writer made about 140
//!   syscalls a volume, most of them re-resolving the same volume dir; a
//!   tmpfs emptyDir SetUp of a new pod 58, 34 through handles). A handle
//!   its call made ([`DirHandle::was_made`]) is new and empty: nothing in
//!   it needs looking for before it is made, and an `EEXIST` still says
//!   what is there.
//!   The handle pins the directory: it is for one operation's calls, never
//!   kept across operations.
//! - **Filesystem probe** ([`Sys::probe_fs`]): runs `blkid -p -s TYPE -s
//!   PTTYPE -o export <dev>` like the kubelet's `GetDiskFormat`: a low-level
//!   probe that reads the device itself (not the udev cache). Exit status 2
//!   means "nothing identifiable" (unformatted); a partition table without a
//!   filesystem is reported as such and must never be formatted over.
//! - **Formatting** ([`Sys::mkfs`]): runs `mkfs.<fs>` as a child; ext2/3/4
//!   get `-F -m0` as the kubelet passes them.
//! - **Loop devices** ([`Sys::loop_find_backing`], [`Sys::loop_attach_beneath`],
//!   [`Sys::loop_detach`]): the hold on a mapped raw block device, with the
//!   loop driver's own ioctls (`loop(4)`: `LOOP_CTL_GET_FREE` on
//!   `/dev/loop-control`, `LOOP_SET_FD`, `LOOP_CLR_FD`) instead of running
//!   `losetup`; which loop holds what is read from sysfs, as `losetup -j`
//!   and the kubelet read it (`loopdev.rs`).

mod child;
mod dir;
mod linux;
mod loopdev;
mod malloc;
mod mkdirs;
mod owner;
mod raw;
mod statmount;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use crate::host::mountinfo::MountTable;
use crate::model::MountIdentity;

#[cfg(test)]
pub(crate) use crate::host::sys_types::SysCall;
pub use crate::host::sys_types::{
    Beneath, Call, DirEntry, DirHandle, DiskFormat, FileKind, FileStat, FsUsage, Listing,
    MountProbe, OwnerEntry, SysError,
};
pub use child::parse_blkid_export;
pub use linux::LinuxSys;
#[cfg(feature = "jemalloc")]
pub use malloc::JEMALLOC_MALLOC_CONF;
pub use malloc::{limit_malloc_arenas, trim_malloc};
use mkdirs::mkdirs_by_calls;
pub use mkdirs::{mkdir_all, mkdir_all_beneath};
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
    /// The stat of `at`, resolved beneath `at.base` following symlinks only
    /// while they stay beneath it (`openat2(RESOLVE_BENEATH |
    /// RESOLVE_NO_MAGICLINKS)`): an absolute symlink or one that climbs out
    /// fails with `EXDEV`. For a subPath, which the kubelet lets name a
    /// symlink inside its volume (a configMap key is one) but never one
    /// out of it.
    fn stat_within(&self, at: Beneath<'_>) -> Result<FileStat, SysError>;
    /// Binds `source`, resolved as [`Sys::stat_within`] resolves it, onto
    /// `at`, reached beneath its base following no symlink: both are opened
    /// `O_PATH` and the mount made between their `/proc/self/fd/N`, so
    /// nothing swapped in after the check is bound. The descriptor opened
    /// must be a `kind` (what the caller checked), else `ESTALE` and no
    /// mount. Errors name `at`.
    fn bind_within(
        &self,
        source: Beneath<'_>,
        at: Beneath<'_>,
        kind: FileKind,
    ) -> Result<(), SysError>;
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
    /// [`Sys::mount_root`] of `at`, reached beneath `at.base` without
    /// following any symlink (`ELOOP`): whether something is mounted there,
    /// asked of that one path (the fakes and a kernel before 5.8 read the
    /// table).
    fn mount_root_beneath(&self, at: Beneath<'_>) -> Result<bool, SysError> {
        self.mount_root(&at.full())
    }
    /// The identity of the top mount whose root is `path` (device, root,
    /// fs type, per-mount `ro`, `context=` label), `None` when `path` is
    /// no mount's root: what an operation records after it mounted.
    /// [`LinuxSys`] asks the kernel for that one mount (`statmount(2)`),
    /// so one volume's operation costs O(1), not O(the node's mounts);
    /// this default, and its fallback, read the table.
    fn mount_identity(&self, path: &Path) -> Result<Option<MountIdentity>, SysError> {
        identity_from_table(self, path)
    }
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
    /// A new regular file at `at` holding `bytes`, with exactly `mode`
    /// (the umask does not apply); `EEXIST` if anything is there. The
    /// parent is opened beneath `at.base` without following any symlink
    /// (`ELOOP`). Not synced: for markers, and for files nobody sees before
    /// a later step publishes them (a payload dir before its `..data` swap).
    /// A failed write (`ENOSPC`) removes the part written: whole or absent.
    fn create_file_beneath(&self, at: Beneath<'_>, bytes: &[u8], mode: u32)
    -> Result<(), SysError>;
    /// Writes `bytes` as the whole content of `at` (created or replaced)
    /// durably: a temp file beside it, fsync, rename over it, fsync of the
    /// dir. The parent is opened beneath `at.base` without following any
    /// symlink (`ELOOP`); a reader sees the old content or the new, never a
    /// part, and a failed write (`ENOSPC`, `EIO`) removes its temp file.
    /// The mode is exact: the umask does not apply.
    fn write_file_beneath(&self, at: Beneath<'_>, bytes: &[u8], mode: u32) -> Result<(), SysError>;
    /// [`Sys::write_file_beneath`] without either fsync: still whole or
    /// absent to a reader, even after the daemon dies, but a power loss
    /// may leave the old content, none, or an empty file. Only for a file
    /// whose facts a durable record already holds (the journal's intent).
    fn write_file_beneath_unsynced(
        &self,
        at: Beneath<'_>,
        bytes: &[u8],
        mode: u32,
    ) -> Result<(), SysError> {
        // a double that keeps no page cache has nothing to skip
        self.write_file_beneath(at, bytes, mode)
    }
    /// Renames the entry `from` to `to_name` in the same directory without
    /// replacing (`EEXIST` if taken); the directory is opened beneath
    /// `from.base` without following any symlink (`ELOOP`), and the entry
    /// itself is never followed.
    fn rename_beneath(&self, from: Beneath<'_>, to_name: &OsStr) -> Result<(), SysError>;
    /// Renames the entry `from` to `to_name` in the same directory,
    /// replacing what is there atomically (the payload writer's `..data`
    /// swap); opened as for [`Sys::rename_beneath`].
    fn replace_beneath(&self, from: Beneath<'_>, to_name: &OsStr) -> Result<(), SysError>;
    /// Makes the symlink `at` pointing to `target` (`EEXIST` if taken), in
    /// its parent opened beneath `at.base` without following any symlink.
    fn symlink_beneath(&self, at: Beneath<'_>, target: &Path) -> Result<(), SysError>;
    /// What the symlink `at` points to (`EINVAL` if it is not one), read in
    /// its parent opened beneath `at.base` without following any symlink.
    fn read_link_beneath(&self, at: Beneath<'_>) -> Result<PathBuf, SysError>;
    /// Sets the group of `at` (never following it), in its parent opened
    /// beneath `at.base` without following any symlink (fsGroup).
    fn chgrp_beneath(&self, at: Beneath<'_>, gid: u32) -> Result<(), SysError>;
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
    /// [`Sys::read_file`] of `at`, reached beneath `at.base` without
    /// following any symlink, the file itself included (`ELOOP`): a payload
    /// file read back (a service account token kept across a restart).
    fn read_file_beneath(&self, at: Beneath<'_>, limit: u64) -> Result<Vec<u8>, SysError>;
    /// `statfs(2)` of the filesystem `path` shows (following symlinks, as
    /// the kubelet's volume stats do): usage, inodes, read-only.
    fn statfs(&self, path: &Path) -> Result<FsUsage, SysError>;
    /// One `statx` of `path` (not following a symlink at its end): the
    /// mount id, the device and whether it is a mount root — what the
    /// health monitor compares with the mount it learnt from the table.
    fn mount_probe(&self, path: &Path) -> Result<MountProbe, SysError>;
    /// The loop devices (`/dev/loopN`, in order) whose backing file is
    /// `backing`, as `/sys/block/loopN/loop/backing_file` names it (what
    /// `losetup -j` reads); none is an empty list.
    fn loop_find_backing(&self, backing: &Path) -> Result<Vec<PathBuf>, SysError>;
    /// Attaches a free loop device to the file `at` (reached beneath its
    /// base, no symlink followed, itself included), read-write or, when
    /// the file refuses it, read-only, as `losetup -f` does; returns the
    /// loop device's path.
    fn loop_attach_beneath(&self, at: Beneath<'_>) -> Result<PathBuf, SysError>;
    /// Detaches the loop device `dev` (a `/dev/loopN`); one attached to
    /// nothing fails with `ENXIO`.
    fn loop_detach(&self, dev: &Path) -> Result<(), SysError>;
    /// [`mkdir_all_beneath`]: `at` and its missing parents below the base,
    /// each with `mode` (the umask applies), no symlink followed.
    fn mkdirs_beneath(&self, at: Beneath<'_>, mode: u32) -> Result<(), SysError> {
        mkdirs_by_calls(self, at, mode)
    }
    /// Opens the directory `at`, reached beneath `at.base` without following
    /// any symlink, itself included (`ELOOP`), as a handle for the `*_in`
    /// calls. The default (a fake's) checks it with [`Sys::stat_beneath`]
    /// and keeps the path.
    fn open_dir_beneath(&self, at: Beneath<'_>) -> Result<DirHandle, SysError> {
        let full = at.full();
        match self.stat_beneath(at)?.kind {
            FileKind::Dir => Ok(DirHandle::by_path(full)),
            FileKind::Symlink => Err(SysError::call(Call::OpenDir, &full, Errno::ELOOP)),
            _ => Err(SysError::call(Call::OpenDir, &full, Errno::ENOTDIR)),
        }
    }
    /// [`mkdir_all_beneath`] of `at`, then `at` opened as by
    /// [`Sys::open_dir_beneath`]: the directory a SetUp names its target
    /// and marker through. [`LinuxSys`] makes the missing levels and opens
    /// the last from the same handles; the default (a fake's) opens first
    /// and makes the levels only on `ENOENT`.
    /// The handle says whether the leaf was made ([`DirHandle::was_made`]).
    fn open_dirs_beneath(&self, at: Beneath<'_>, mode: u32) -> Result<DirHandle, SysError> {
        match self.open_dir_beneath(at) {
            Err(e) if e.errno() == Some(Errno::ENOENT) => {
                self.mkdirs_beneath(at, mode)?;
                Ok(self.open_dir_beneath(at)?.made(true))
            }
            r => r,
        }
    }
    /// [`Sys::open_dirs_beneath`] of `rel` in `dir`; in a directory the
    /// handle made, every level is made without looking first.
    fn open_dirs_in(&self, dir: &DirHandle, rel: &Path, mode: u32) -> Result<DirHandle, SysError> {
        match dir.fd() {
            Some(fd) => dir::open_dirs_in(dir, fd, rel, mode),
            None => self.open_dirs_beneath(in_dir(dir, rel), mode),
        }
    }
    /// [`Sys::open_dir_beneath`] of `rel` in `dir`.
    fn open_dir_in(&self, dir: &DirHandle, rel: &Path) -> Result<DirHandle, SysError> {
        match dir.fd() {
            Some(fd) => dir::open_in(dir.path(), fd, rel),
            None => self.open_dir_beneath(in_dir(dir, rel)),
        }
    }
    /// Sets the permission bits of the handle's own directory.
    fn chmod_dir(&self, dir: &DirHandle, mode: u32) -> Result<(), SysError> {
        match dir.fd() {
            Some(fd) => dir::fchmod(dir.path(), fd, mode),
            None => {
                let path = dir.path();
                let at = match (path.parent(), path.file_name()) {
                    (Some(base), Some(name)) => Beneath {
                        base,
                        rel: Path::new(name),
                    },
                    _ => in_dir(dir, Path::new("")),
                };
                self.chmod_dir_beneath(at, mode)
            }
        }
    }
    /// [`Sys::stat_beneath`] of `rel` in `dir`.
    fn stat_in(&self, dir: &DirHandle, rel: &Path) -> Result<FileStat, SysError> {
        match dir.fd() {
            Some(fd) => dir::stat(dir.path(), fd, rel),
            None => self.stat_beneath(in_dir(dir, rel)),
        }
    }
    /// [`Sys::mkdir_beneath`] of `rel` in `dir` (the umask applies).
    fn mkdir_in(&self, dir: &DirHandle, rel: &Path, mode: u32) -> Result<(), SysError> {
        match dir.fd() {
            Some(fd) => dir::mkdir(dir.path(), fd, rel, mode),
            None => self.mkdir_beneath(in_dir(dir, rel), mode),
        }
    }
    /// [`Sys::chmod_dir_beneath`] of `rel` in `dir`: the directory there
    /// now, the root of a mount made on it included.
    fn chmod_dir_in(&self, dir: &DirHandle, rel: &Path, mode: u32) -> Result<(), SysError> {
        match dir.fd() {
            Some(fd) => dir::chmod_dir(dir.path(), fd, rel, mode),
            None => self.chmod_dir_beneath(in_dir(dir, rel), mode),
        }
    }
    /// [`Sys::mount_beneath`] on `rel` in `dir`.
    fn mount_in(
        &self,
        source: Option<&Path>,
        dir: &DirHandle,
        rel: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Result<(), SysError> {
        match dir.fd() {
            Some(fd) => dir::mount(source, dir.path(), fd, rel, fstype, flags, data),
            None => self.mount_beneath(source, in_dir(dir, rel), fstype, flags, data),
        }
    }
    /// A new directory `rel` in `dir` with exactly `mode` (the umask does
    /// not apply), opened as a handle; `EEXIST` if anything is there.
    fn make_dir_in(&self, dir: &DirHandle, rel: &Path, mode: u32) -> Result<DirHandle, SysError> {
        if let Some(fd) = dir.fd() {
            return dir::make_dir(dir.path(), fd, rel, mode);
        }
        let at = in_dir(dir, rel);
        self.mkdir_beneath(at, mode)?;
        self.chmod_dir_beneath(at, mode)?;
        Ok(DirHandle::by_path(at.full()))
    }
    /// [`Sys::create_file_beneath`] of `rel` in `dir`.
    fn create_file_in(
        &self,
        dir: &DirHandle,
        rel: &Path,
        bytes: &[u8],
        mode: u32,
    ) -> Result<(), SysError> {
        match dir.fd() {
            Some(fd) => dir::create_file(dir.path(), fd, rel, bytes, mode),
            None => self.create_file_beneath(in_dir(dir, rel), bytes, mode),
        }
    }
    /// [`Sys::symlink_beneath`] of `rel` in `dir`.
    fn symlink_in(&self, dir: &DirHandle, rel: &Path, target: &Path) -> Result<(), SysError> {
        match dir.fd() {
            Some(fd) => dir::symlink(dir.path(), fd, rel, target),
            None => self.symlink_beneath(in_dir(dir, rel), target),
        }
    }
    /// [`Sys::read_link_beneath`] of `rel` in `dir`.
    fn read_link_in(&self, dir: &DirHandle, rel: &Path) -> Result<PathBuf, SysError> {
        match dir.fd() {
            Some(fd) => dir::read_link(dir.path(), fd, rel),
            None => self.read_link_beneath(in_dir(dir, rel)),
        }
    }
    /// [`Sys::chgrp_beneath`] of `rel` in `dir`.
    fn chgrp_in(&self, dir: &DirHandle, rel: &Path, gid: u32) -> Result<(), SysError> {
        match dir.fd() {
            Some(fd) => dir::chgrp(dir.path(), fd, rel, gid),
            None => self.chgrp_beneath(in_dir(dir, rel), gid),
        }
    }
    /// [`Sys::replace_beneath`] of the entry `from` of `dir` to `to_name`.
    fn replace_in(&self, dir: &DirHandle, from: &OsStr, to_name: &OsStr) -> Result<(), SysError> {
        match dir.fd() {
            Some(fd) => dir::replace(dir.path(), fd, from, to_name),
            None => self.replace_beneath(in_dir(dir, Path::new(from)), to_name),
        }
    }
    /// [`Sys::read_dir_beneath`] of `dir` itself (entries on another
    /// filesystem than `dir` are mount roots).
    fn read_dir_in(&self, dir: &DirHandle) -> Result<Vec<DirEntry>, SysError> {
        match dir.fd() {
            Some(fd) => dir::read_dir(dir.path(), fd),
            None => self.read_dir_beneath(dir.path(), Path::new("")),
        }
    }
    /// The handle's own directory as the fsGroup walk sees it (its name
    /// empty, never a mount root). These `owner_*` calls need a handle
    /// with a descriptor ([`LinuxSys`]'s); a path-only handle (a fake's)
    /// gets `ENOSYS`: the walk is tested on real directories.
    fn owner_stat(&self, dir: &DirHandle) -> Result<OwnerEntry, SysError> {
        match dir.fd() {
            Some(fd) => owner::stat_self(dir.path(), fd),
            None => Err(SysError::call(Call::Stat, dir.path(), Errno::ENOSYS)),
        }
    }
    /// The entries of the handle's directory, each with its type, mode,
    /// group and whether it is a mount root (`statx`, never following).
    fn owner_list(&self, dir: &DirHandle) -> Result<Vec<OwnerEntry>, SysError> {
        match dir.fd() {
            Some(fd) => owner::list(dir.path(), fd),
            None => Err(SysError::call(
                Call::ReadDirBeneath,
                dir.path(),
                Errno::ENOSYS,
            )),
        }
    }
    /// The subdirectory `name` of the handle's directory as a handle,
    /// never through a symlink (`ELOOP`) nor across a mount (`EXDEV`).
    fn owner_open(&self, dir: &DirHandle, name: &std::ffi::CStr) -> Result<DirHandle, SysError> {
        match dir.fd() {
            Some(fd) => owner::open(dir.path(), fd, name),
            None => Err(SysError::call(Call::OpenDir, dir.path(), Errno::ENOSYS)),
        }
    }
    /// Sets the group of `name` in the handle's directory, or of the
    /// directory itself when `name` is empty; never follows a symlink.
    fn owner_chgrp(
        &self,
        dir: &DirHandle,
        name: &std::ffi::CStr,
        gid: u32,
    ) -> Result<(), SysError> {
        match dir.fd() {
            Some(fd) => owner::chgrp(dir.path(), fd, name, gid),
            None => Err(SysError::call(Call::Chgrp, dir.path(), Errno::ENOSYS)),
        }
    }
    /// Sets the mode of `name` in the handle's directory, or of the
    /// directory itself when `name` is empty; a symlink is refused
    /// (`EOPNOTSUPP`), never followed.
    fn owner_chmod(
        &self,
        dir: &DirHandle,
        name: &std::ffi::CStr,
        mode: u32,
    ) -> Result<(), SysError> {
        match dir.fd() {
            Some(fd) => owner::chmod(dir.path(), fd, name, mode),
            None => Err(SysError::call(Call::Chmod, dir.path(), Errno::ENOSYS)),
        }
    }
    /// A watch of this process's mount table, `None` where changes cannot
    /// be watched (every look must then assume one).
    fn watch_mount_table(&self) -> Option<Box<dyn MountTableWatch>> {
        None
    }
}

/// Says whether the process's mount table changed: a mount, an unmount, a
/// move or a remount anywhere in its mount namespace. (A directory renamed
/// above a mount point is no change of the table.)
pub trait MountTableWatch: Send {
    /// Whether the table changed since the watch was made or last asked;
    /// also true when it cannot tell.
    fn changed(&mut self) -> bool;
}

/// `rel` beneath a path-only handle's directory.
fn in_dir<'p>(dir: &'p DirHandle, rel: &'p Path) -> Beneath<'p> {
    Beneath {
        base: dir.path(),
        rel,
    }
}

/// The live mount table of this process.
pub const LIVE_MOUNTINFO: &str = "/proc/self/mountinfo";

/// [`Sys::mount_identity`] from the whole mount table.
fn identity_from_table<S: Sys + ?Sized>(
    sys: &S,
    path: &Path,
) -> Result<Option<MountIdentity>, SysError> {
    if !sys.mount_root(path)? {
        return Ok(None);
    }
    Ok(sys.read_mountinfo()?.identity_at(path))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
