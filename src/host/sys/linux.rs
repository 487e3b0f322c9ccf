//! [`LinuxSys`], the real kernel behind the [`Sys`] seam.

use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::child::{parse_blkid_export, run};
use super::raw::{cpath, file_stat, io_error, mode, mount_root_attr, statx_at, std_kind};
use super::statmount::{MountStat, reports_options, statmount};
use super::{
    Beneath, Call, DirEntry, DirHandle, DiskFormat, Errno, FileKind, FileStat, FsUsage,
    LIVE_MOUNTINFO, Listing, MntFlags, MountProbe, MsFlags, Sys, SysError, identity_from_table,
};
use crate::host::mountinfo::{MountTable, read_pieces};
use crate::host::super_options::parse_super_options;
use crate::model::{MountIdentity, SharedPath, SharedStr};

/// The real kernel, through nix (libc for `statx`).
#[derive(Debug, Default, Clone, Copy)]
pub struct LinuxSys;

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

    fn stat_within(&self, at: Beneath<'_>) -> Result<FileStat, SysError> {
        let path = at.full();
        let fd = Self::open_path_within(Call::Stat, at, &path)?;
        Self::stat_fd(&fd, Call::Stat, &path)
    }

    fn bind_within(
        &self,
        source: Beneath<'_>,
        at: Beneath<'_>,
        kind: FileKind,
    ) -> Result<(), SysError> {
        let target = at.full();
        let from = Self::open_path_within(Call::Mount, source, &target)?;
        if Self::stat_fd(&from, Call::Mount, &target)?.kind != kind {
            return Err(SysError::call(Call::Mount, &target, Errno::ESTALE));
        }
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

    fn mount_identity(&self, path: &Path) -> Result<Option<MountIdentity>, SysError> {
        let c = cpath(Call::MountRoot, path)?;
        let st = statx_at(
            libc::AT_FDCWD,
            &c,
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_BASIC_STATS | libc::STATX_MNT_ID_UNIQUE,
        )
        .map_err(|e| SysError::call(Call::MountRoot, path, e))?;
        match mount_root_attr(&st) {
            Some(false) => Ok(None),
            // A kernel before 6.11 (no unique id, no statmount or no
            // options), a FUSE mount (mountinfo names its subtype), or the
            // mount gone between the two calls: the table decides.
            Some(true) => {
                let unique = st.stx_mask & libc::STATX_MNT_ID_UNIQUE != 0;
                match unique.then(|| statmount(st.stx_mnt_id).ok().and_then(identity_of)) {
                    Some(Some(id)) => Ok(Some(id)),
                    _ => Ok(self.read_mountinfo()?.identity_at(path)),
                }
            }
            // kernel < 5.8: no mount-root attribute either
            None => identity_from_table(self, path),
        }
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
        file_stat(&st, Call::Stat, || path.to_owned())
    }

    fn mkdir(&self, path: &Path, m: u32) -> Result<(), SysError> {
        nix::unistd::mkdir(path, mode(m)).map_err(|e| SysError::call(Call::Mkdir, path, e))
    }

    fn stat_beneath(&self, at: Beneath<'_>) -> Result<FileStat, SysError> {
        match statx_leaf_beneath(Call::Stat, at)? {
            Some(st) => file_stat(&st, Call::Stat, || at.full()),
            None => self.stat(&at.full(), false), // the base itself
        }
    }

    fn mount_root_beneath(&self, at: Beneath<'_>) -> Result<bool, SysError> {
        let Some(st) = statx_leaf_beneath(Call::MountRoot, at)? else {
            return self.mount_root(&at.full()); // the base itself
        };
        match mount_root_attr(&st) {
            Some(root) => Ok(root),
            // kernel < 5.8: the table knows
            None => Ok(self.read_mountinfo()?.is_mount_point(&at.full())),
        }
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

    fn create_file_beneath(&self, at: Beneath<'_>, bytes: &[u8], m: u32) -> Result<(), SysError> {
        Self::in_parent_beneath(Call::CreateFile, at, Errno::EEXIST, |dir, name| {
            super::dir::create_in(dir, name, bytes, m)
        })
    }

    fn write_file_beneath(&self, at: Beneath<'_>, bytes: &[u8], m: u32) -> Result<(), SysError> {
        place_file(at, bytes, m, true)
    }

    fn write_file_beneath_unsynced(
        &self,
        at: Beneath<'_>,
        bytes: &[u8],
        m: u32,
    ) -> Result<(), SysError> {
        place_file(at, bytes, m, false)
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

    fn replace_beneath(&self, from: Beneath<'_>, to_name: &OsStr) -> Result<(), SysError> {
        Self::in_parent_beneath(Call::Replace, from, Errno::EINVAL, |dir, name| {
            nix::fcntl::renameat(dir, name, dir, to_name)
        })
    }

    fn symlink_beneath(&self, at: Beneath<'_>, target: &Path) -> Result<(), SysError> {
        Self::in_parent_beneath(Call::Symlink, at, Errno::EEXIST, |dir, name| {
            nix::unistd::symlinkat(target, dir, name)
        })
    }

    fn read_link_beneath(&self, at: Beneath<'_>) -> Result<PathBuf, SysError> {
        Self::in_parent_beneath(Call::ReadLink, at, Errno::EINVAL, |dir, name| {
            nix::fcntl::readlinkat(dir, name).map(PathBuf::from)
        })
    }

    fn chgrp_beneath(&self, at: Beneath<'_>, gid: u32) -> Result<(), SysError> {
        Self::in_parent_beneath(Call::Chgrp, at, Errno::EINVAL, |dir, name| {
            let gid = Some(nix::unistd::Gid::from_raw(gid));
            let flags = nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW;
            nix::unistd::fchownat(dir, name, None, gid, flags)
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
        let fd = Self::open_beneath(Call::ReadDirBeneath, base, rel)?;
        super::dir::list(fd, &base.join(rel), Call::ReadDirBeneath)
    }

    fn open_dir_beneath(&self, at: Beneath<'_>) -> Result<DirHandle, SysError> {
        super::dir::open(at)
    }

    fn mkdirs_beneath(&self, at: Beneath<'_>, m: u32) -> Result<(), SysError> {
        super::dir::mkdirs(at, m)
    }

    fn open_dirs_beneath(&self, at: Beneath<'_>, m: u32) -> Result<DirHandle, SysError> {
        super::dir::open_dirs(at, m)
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
        read_whole(fd, path, limit)
    }

    fn read_file_beneath(&self, at: Beneath<'_>, limit: u64) -> Result<Vec<u8>, SysError> {
        let path = at.full();
        // O_NONBLOCK as in `read_file`; RESOLVE_NO_SYMLINKS refuses a
        // symlink at the file itself too
        let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW;
        let fd = Self::open_at_beneath(Call::ReadFile, at, flags, &path)?;
        read_whole(fd, &path, limit)
    }

    fn statfs(&self, path: &Path) -> Result<FsUsage, SysError> {
        let v =
            nix::sys::statvfs::statvfs(path).map_err(|e| SysError::call(Call::Statfs, path, e))?;
        // The widths differ between libc targets (u64 on 64-bit Linux).
        #[allow(clippy::useless_conversion)]
        Ok(FsUsage {
            block_size: u64::from(v.fragment_size()),
            blocks: u64::from(v.blocks()),
            blocks_free: u64::from(v.blocks_free()),
            blocks_available: u64::from(v.blocks_available()),
            files: u64::from(v.files()),
            files_free: u64::from(v.files_free()),
            read_only: v.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY),
        })
    }

    /// `POLLPRI` on an open `/proc/self/mountinfo`: the kernel raises it
    /// once per change of the namespace's mount table since the file was
    /// opened or last polled.
    fn watch_mount_table(&self) -> Option<Box<dyn super::MountTableWatch>> {
        let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC;
        match nix::fcntl::open("/proc/self/mountinfo", flags, Mode::empty()) {
            Ok(fd) => Some(Box::new(MountinfoPoll(fd))),
            Err(e) => {
                tracing::warn!("open /proc/self/mountinfo to watch the mount table: {e}");
                None
            }
        }
    }

    fn loop_find_backing(&self, backing: &Path) -> Result<Vec<PathBuf>, SysError> {
        super::loopdev::find_backing(backing)
    }

    fn loop_attach_beneath(&self, at: Beneath<'_>) -> Result<PathBuf, SysError> {
        let open = |flags| Self::open_file_beneath(Call::LoopAttach, at, flags);
        // read-write as `losetup` opens it, read-only when the file refuses
        // writing (the loop device is then read-only too)
        let file = match open(OFlag::O_RDWR) {
            Err(e) if matches!(e.errno(), Some(Errno::EROFS | Errno::EACCES | Errno::EPERM)) => {
                open(OFlag::O_RDONLY)?
            }
            other => other?,
        };
        super::loopdev::attach(&file, &at.full())
    }

    fn loop_detach(&self, dev: &Path) -> Result<(), SysError> {
        super::loopdev::detach(dev)
    }

    fn mount_probe(&self, path: &Path) -> Result<MountProbe, SysError> {
        let c = cpath(Call::MountProbe, path)?;
        let st = statx_at(
            libc::AT_FDCWD,
            &c,
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_MNT_ID,
        )
        .map_err(|e| SysError::call(Call::MountProbe, path, e))?;
        Ok(MountProbe {
            mnt_id: st.stx_mnt_id,
            dev: crate::model::DevId {
                major: st.stx_dev_major,
                minor: st.stx_dev_minor,
            },
            mount_root: mount_root_attr(&st),
        })
    }
}

/// See [`LinuxSys::watch_mount_table`].
struct MountinfoPoll(OwnedFd);

impl super::MountTableWatch for MountinfoPoll {
    fn changed(&mut self) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let mut fds = [PollFd::new(self.0.as_fd(), PollFlags::POLLPRI)];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(0) => false,
            Ok(_) => fds[0].revents().is_none_or(|r| {
                r.intersects(PollFlags::POLLPRI | PollFlags::POLLERR | PollFlags::POLLNVAL)
            }),
            Err(_) => true,
        }
    }
}

/// The whole of the regular file open at `fd`, at most `limit` bytes
/// (`EINVAL` for anything but a regular file, `EFBIG` past the limit).
fn read_whole(fd: OwnedFd, path: &Path, limit: u64) -> Result<Vec<u8>, SysError> {
    let err = |e: Errno| SysError::call(Call::ReadFile, path, e);
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

/// `statx` of `at`'s leaf, never following it, its parent opened beneath
/// `at.base` without following any symlink (`ELOOP`); `None` when `at` is
/// the base itself.
fn statx_leaf_beneath(call: Call, at: Beneath<'_>) -> Result<Option<libc::statx>, SysError> {
    let Some(parent) = at.parent() else {
        return Ok(None);
    };
    let path = at.full();
    let leaf = cpath(call, Path::new(at.rel.file_name().unwrap_or_default()))?;
    let dir = LinuxSys::open_path_beneath(call, parent, OFlag::O_DIRECTORY, &path)?;
    statx_at(
        dir.as_raw_fd(),
        &leaf,
        libc::AT_SYMLINK_NOFOLLOW,
        libc::STATX_BASIC_STATS,
    )
    .map(Some)
    .map_err(|e| SysError::call(call, &path, e))
}

/// The identity mountinfo would show for the mount `statmount` described,
/// or `None` where only the table can tell: a kernel that cannot report
/// the super-block options (so not the `context=` label either), or a
/// FUSE type, whose subtype mountinfo appends.
fn identity_of(m: MountStat) -> Option<MountIdentity> {
    if m.fs_type.starts_with("fuse") {
        return None;
    }
    let selinux = match &m.options {
        Some(options) => parse_super_options(options, &mut |_| {}).selinux.context,
        // none to report, a label included, only where the kernel could
        None if reports_options() => None,
        None => return None,
    };
    Some(MountIdentity {
        dev: m.dev,
        root: SharedPath::fs_root(Path::new(&m.root)),
        fs_type: SharedStr::fs_type(&m.fs_type),
        read_only: m.read_only,
        selinux,
    })
}

/// `bytes` as the whole of `at`: a temp file beside it renamed over
/// it, the file and its dir fsynced when `synced`.
fn place_file(at: Beneath<'_>, bytes: &[u8], m: u32, synced: bool) -> Result<(), SysError> {
    let path = at.full();
    let err = |e| SysError::call(Call::WriteFile, &path, e);
    let (Some(parent), Some(name)) = (at.parent(), at.rel.file_name()) else {
        return Err(err(Errno::EINVAL));
    };
    let dir = LinuxSys::open_at_beneath(Call::WriteFile, parent, OFlag::O_RDONLY, &path)?;
    let mut tmp = std::ffi::OsString::from(".");
    tmp.push(name);
    tmp.push(".volumed-tmp");
    // a temp file a crash left behind is ours to replace
    let _ = nix::unistd::unlinkat(
        &dir,
        tmp.as_os_str(),
        nix::unistd::UnlinkatFlags::NoRemoveDir,
    );
    let flags =
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = nix::fcntl::openat(&dir, tmp.as_os_str(), flags, mode(m)).map_err(err)?;
    let io = |e: std::io::Error| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO));
    let placed = (|| {
        // exact, whatever the umask (a payload's `defaultMode` may be 0666)
        nix::sys::stat::fchmod(&fd, mode(m))?;
        let mut file = std::fs::File::from(fd);
        std::io::Write::write_all(&mut file, bytes).map_err(io)?;
        if synced {
            file.sync_all().map_err(io)?;
        }
        nix::fcntl::renameat(&dir, tmp.as_os_str(), &dir, name)
    })();
    if let Err(e) = placed {
        // a write cut short (a full disk) leaves part of the temp file:
        // never read as the file, but holding space the disk lacks and
        // keeping the dir from being removed empty
        let flag = nix::unistd::UnlinkatFlags::NoRemoveDir;
        let _ = nix::unistd::unlinkat(&dir, tmp.as_os_str(), flag);
        return Err(err(e));
    }
    if synced {
        nix::unistd::fsync(&dir).map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::sys::FileKind;

    #[test]
    fn the_real_statx_sees_a_directory_and_the_root_mount() {
        let dir = tempfile::tempdir().unwrap();
        let st = LinuxSys.stat(dir.path(), false).unwrap();
        assert_eq!(st.kind, FileKind::Dir);
        assert!(LinuxSys.mount_root(Path::new("/")).unwrap());
        assert!(!LinuxSys.mount_root(dir.path()).unwrap());
        assert!(LinuxSys.mnt_id(dir.path()).unwrap() > 0);
    }

    /// `statmount` read at the offsets we wrote down agrees with the
    /// table on the root mount (no root needed, no mount made; the mounts
    /// a test makes are compared in `tests/host_scan_real.rs`).
    #[test]
    fn statmount_says_what_the_table_says_of_the_root_mount() {
        let c = cpath(Call::MountRoot, Path::new("/")).unwrap();
        let st = statx_at(
            libc::AT_FDCWD,
            &c,
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_MNT_ID_UNIQUE,
        )
        .unwrap();
        if st.stx_mask & libc::STATX_MNT_ID_UNIQUE == 0 {
            eprintln!("skipped: kernel before 6.8 (no unique mount id)");
            return;
        }
        let m = match statmount(st.stx_mnt_id) {
            Err(Errno::ENOSYS) => return eprintln!("skipped: no statmount(2)"),
            r => r.unwrap(),
        };
        let table = LinuxSys.read_mountinfo().unwrap();
        let want = table.identity_at(Path::new("/")).unwrap();
        assert_eq!(m.dev, want.dev);
        assert_eq!(Path::new(&m.root), &*want.root);
        assert_eq!(m.read_only, want.read_only);
        assert!(want.fs_type.starts_with(&*m.fs_type), "{m:?} vs {want:?}");
        if m.options.is_some() {
            assert_eq!(identity_of(m), Some(want));
        }
    }

    /// Synced or not, a file is placed whole by a rename: the old
    /// content is replaced, the mode is exact and no temp file is left.
    #[test]
    fn a_file_written_beneath_replaces_the_old_one_whole_synced_or_not() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        std::fs::create_dir(base.join("d")).unwrap();
        let at = Beneath {
            base,
            rel: Path::new("d/vol_data.json"),
        };
        for (synced, text) in [(true, "first"), (false, "second"), (false, "third")] {
            if synced {
                LinuxSys.write_file_beneath(at, text.as_bytes(), 0o640)
            } else {
                LinuxSys.write_file_beneath_unsynced(at, text.as_bytes(), 0o640)
            }
            .unwrap();
            let file = base.join("d/vol_data.json");
            assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
            let mode = std::fs::metadata(&file).unwrap().permissions().mode();
            assert_eq!(mode & 0o7777, 0o640);
            let names: Vec<_> = std::fs::read_dir(base.join("d"))
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(names, ["vol_data.json"], "no temp file left");
        }
        std::os::unix::fs::symlink("d", base.join("up")).unwrap();
        let through = Beneath {
            base,
            rel: Path::new("up/vol_data.json"),
        };
        let e = LinuxSys
            .write_file_beneath_unsynced(through, b"x", 0o640)
            .unwrap_err();
        assert_eq!(e.errno(), Some(Errno::ELOOP), "no symlink followed");
    }

    #[test]
    fn a_file_read_beneath_follows_no_symlink_not_even_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        std::fs::create_dir(base.join("v")).unwrap();
        std::fs::write(base.join("v/f"), b"bytes").unwrap();
        std::os::unix::fs::symlink("f", base.join("v/link")).unwrap();
        std::os::unix::fs::symlink("v", base.join("up")).unwrap();
        let at = |rel: &'static str| Beneath {
            base,
            rel: Path::new(rel),
        };
        assert_eq!(LinuxSys.read_file_beneath(at("v/f"), 16).unwrap(), b"bytes");
        for rel in ["v/link", "up/f"] {
            let e = LinuxSys.read_file_beneath(at(rel), 16).unwrap_err();
            assert_eq!(e.errno(), Some(Errno::ELOOP), "{rel}");
        }
        let big = LinuxSys.read_file_beneath(at("v/f"), 2).unwrap_err();
        assert_eq!(big.errno(), Some(Errno::EFBIG));
        let dir_read = LinuxSys.read_file_beneath(at("v"), 16).unwrap_err();
        assert_eq!(dir_read.errno(), Some(Errno::EINVAL));
    }
}
