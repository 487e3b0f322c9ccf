//! The values of the syscall seam ([`crate::host::sys`]): the kinds of call,
//! the error that names the call, the path and the errno, what `statx` and a
//! directory listing report, what a device holds, and `SysCall` (test builds only, in
//! `sys_types/recorded.rs`), one recorded call with its arguments as plain
//! comparable data (what `RecordingSys` (`host::recording_sys`, test builds)
//! records and tests compare).
//! Re-exported from [`crate::host::sys`].

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;

use crate::host::HostError;
use crate::model::DevId;

// the recording fake's vocabulary: test builds only
#[cfg(test)]
mod recorded;
#[cfg(test)]
pub(crate) use recorded::SysCall;

/// A path given as a trusted base directory and a path `rel` beneath it
/// that is resolved without following any symlink and without leaving
/// `base` (`openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`). Mount targets
/// and the directories on their way are reached this way: a symlink under
/// the root dir would put a volume somewhere else than the mount table is
/// later searched for, possibly outside the pod dir.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beneath<'p> {
    /// the trusted directory (the root dir, canonical)
    pub base: &'p Path,
    /// the path under it (relative, without `..`)
    pub rel: &'p Path,
}

impl<'p> Beneath<'p> {
    /// `path` split at `base`; `None` when `path` is not below `base` or
    /// climbs out of it with `..`.
    pub fn split(base: &'p Path, path: &'p Path) -> Option<Self> {
        let rel = path.strip_prefix(base).ok()?;
        let plain = rel
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        plain.then_some(Self { base, rel })
    }
    /// `base/rel`, for messages and the recording fake.
    pub fn full(&self) -> PathBuf {
        self.base.join(self.rel)
    }
    /// The parent of `rel` beneath the same base (`None` for `base` itself).
    pub fn parent(&self) -> Option<Self> {
        let rel = self.rel.parent()?;
        Some(Self {
            base: self.base,
            rel,
        })
    }
}

/// The kinds of call the seam makes: what a [`SysError`] names and what the
/// recording fake is told to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Call {
    /// `mount(2)`
    Mount,
    /// `umount2(2)`
    Umount,
    /// `statx` for the mount-root attribute
    MountRoot,
    /// `statx` for the mount id
    MntId,
    /// `statx` for type and device numbers
    Stat,
    /// `mkdir(2)`
    Mkdir,
    /// `fchmod` of a directory opened without following symlinks
    ChmodDir,
    /// `open(O_CREAT|O_EXCL|O_NOFOLLOW)`
    CreateFile,
    /// writing a small file whole: a temp file, fsync, rename, fsync of the dir
    WriteFile,
    /// `renameat2(RENAME_NOREPLACE)`
    Rename,
    /// `renameat(2)` over an existing entry (the payload's `..data` swap)
    Replace,
    /// `symlinkat(2)`
    Symlink,
    /// `readlinkat(2)`
    ReadLink,
    /// `fchownat(2)` of the group, not following a symlink
    Chgrp,
    /// `rmdir(2)`
    Rmdir,
    /// `unlink(2)`
    Unlink,
    /// listing a directory opened with `openat2` beneath a base
    ReadDirBeneath,
    /// `unlinkat` of an entry beneath a base
    RemoveBeneath,
    /// running `mkfs.<fs>`
    Mkfs,
    /// running `blkid -p`
    ProbeFs,
    /// reading `/proc/self/mountinfo`
    ReadMountinfo,
    /// `realpath`
    Canonicalize,
    /// listing a directory, each entry classified by `lstat`
    ReadDir,
    /// reading a small file whole
    ReadFile,
    /// `statfs(2)`: a filesystem's usage and flags
    Statfs,
    /// `statx` for a path's mount id, device and mount-root attribute
    MountProbe,
    /// opening a directory beneath a base as a [`DirHandle`]
    OpenDir,
    /// `fchmodat2(AT_SYMLINK_NOFOLLOW)`: a mode set, never through a symlink
    Chmod,
    /// the loop devices backed by a file, from sysfs (`losetup -j`)
    LoopFind,
    /// `LOOP_CTL_GET_FREE` and `LOOP_SET_FD`: a free loop device attached
    LoopAttach,
    /// `LOOP_CLR_FD`: a loop device detached
    LoopDetach,
}

impl Call {
    /// The name in error messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Call::Mount => "mount",
            Call::Umount => "umount2",
            Call::MountRoot => "statx mount root",
            Call::MntId => "statx mount id",
            Call::Stat => "statx",
            Call::Mkdir => "mkdir",
            Call::ChmodDir => "chmod",
            Call::CreateFile => "create file",
            Call::WriteFile => "write file",
            Call::Rename => "rename",
            Call::Replace => "rename over",
            Call::Symlink => "symlink",
            Call::ReadLink => "readlink",
            Call::Chgrp => "chgrp",
            Call::Rmdir => "rmdir",
            Call::Unlink => "unlink",
            Call::ReadDirBeneath => "read dir",
            Call::RemoveBeneath => "remove",
            Call::Mkfs => "mkfs",
            Call::ProbeFs => "blkid",
            Call::ReadMountinfo => "read mountinfo",
            Call::Canonicalize => "canonicalize",
            Call::ReadDir => "read dir",
            Call::ReadFile => "read file",
            Call::Statfs => "statfs",
            Call::MountProbe => "statx mount probe",
            Call::OpenDir => "open dir",
            Call::Chmod => "fchmodat2",
            Call::LoopFind => "find loop device",
            Call::LoopAttach => "attach loop device",
            Call::LoopDetach => "detach loop device",
        }
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Errors of the seam: each names the call and the path and carries the errno
/// (or, for child processes, their exit status and stderr).
#[derive(Debug, thiserror::Error)]
pub enum SysError {
    /// a system call failed
    #[error("{call} {path}: {errno}")]
    Call {
        /// which call
        call: Call,
        /// the path it acted on
        path: PathBuf,
        /// the error number
        errno: Errno,
    },
    /// a child process (`mkfs.<fs>`, `blkid`) failed
    #[error("{call} {path}: {program} {status}: {stderr}")]
    Command {
        /// which call
        call: Call,
        /// the device it acted on
        path: PathBuf,
        /// the program run
        program: String,
        /// how it ended (exit status, or why it could not start)
        status: String,
        /// its standard error, trimmed
        stderr: String,
    },
    /// reading the mount table failed
    #[error("read mountinfo")]
    MountInfo(#[source] Box<HostError>),
}

impl SysError {
    /// A failed system call.
    pub fn call(call: Call, path: &Path, errno: Errno) -> Self {
        SysError::Call {
            call,
            path: path.to_owned(),
            errno,
        }
    }
    /// Which call failed.
    pub fn kind(&self) -> Call {
        match self {
            SysError::Call { call, .. } | SysError::Command { call, .. } => *call,
            SysError::MountInfo(_) => Call::ReadMountinfo,
        }
    }
    /// The errno, when a system call failed.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            SysError::Call { errno, .. } => Some(*errno),
            _ => None,
        }
    }
    /// The path the call acted on.
    pub fn path(&self) -> Option<&Path> {
        match self {
            SysError::Call { path, .. } | SysError::Command { path, .. } => Some(path),
            SysError::MountInfo(_) => None,
        }
    }
    /// As an I/O error, for the callers whose errors carry one: the errno
    /// when there is one, else the message.
    pub fn to_io(&self) -> std::io::Error {
        match self.errno() {
            Some(errno) => std::io::Error::from(errno),
            None => std::io::Error::other(self.to_string()),
        }
    }
}

/// A directory listing ([`super::sys::Sys::read_dir`]): each entry's name and
/// what `lstat` showed (an error for that entry alone).
pub type Listing = Vec<(OsString, Result<FileKind, SysError>)>;

/// What a directory entry or path is (from `statx`, never following the last
/// symlink unless asked).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// a directory
    Dir,
    /// a regular file
    File,
    /// a symbolic link
    Symlink,
    /// a Unix socket
    Socket,
    /// a character device
    CharDevice,
    /// a block device
    BlockDevice,
    /// a FIFO
    Fifo,
}

/// The part of `statx` volumed uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStat {
    /// the file type
    pub kind: FileKind,
    /// the device of the filesystem holding it
    pub dev: DevId,
    /// for device nodes, the device they stand for
    pub rdev: DevId,
    /// permission bits (`mode & 0o7777`)
    pub perm: u32,
    /// the inode number
    pub ino: u64,
    /// the inode's change time, ns since the epoch
    pub ctime_ns: i128,
}

impl FileStat {
    /// The file's identity: device, inode and change time. A file deleted
    /// and made again at the same path often gets the freed inode back
    /// (ext4 does), so the inode alone does not tell them apart.
    pub fn file_id(&self) -> (u64, u64, i128) {
        let dev = (u64::from(self.dev.major) << 32) | u64::from(self.dev.minor);
        (dev, self.ino, self.ctime_ns)
    }
}

/// A filesystem's usage and flags, per [`Sys::statfs`](crate::host::sys::Sys::statfs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FsUsage {
    /// the fragment size the block counts are in (`f_frsize`)
    pub block_size: u64,
    /// total blocks
    pub blocks: u64,
    /// free blocks (root's reserve included)
    pub blocks_free: u64,
    /// blocks free to unprivileged users (what a pod can still write)
    pub blocks_available: u64,
    /// total inodes (0: the filesystem does not count them)
    pub files: u64,
    /// free inodes
    pub files_free: u64,
    /// mounted read-only (`ST_RDONLY`)
    pub read_only: bool,
}

/// What one `statx` tells about a path's mount, per
/// [`Sys::mount_probe`](crate::host::sys::Sys::mount_probe).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MountProbe {
    /// the mount id (`STATX_MNT_ID`, the mount table's first column)
    pub mnt_id: u64,
    /// the device of the filesystem the path shows
    pub dev: DevId,
    /// whether the path is the root of a mount; `None` when the kernel does
    /// not report the attribute (before 5.8)
    pub mount_root: Option<bool>,
}

/// One entry of a directory listed by [`Sys::read_dir_beneath`](crate::host::sys::Sys::read_dir_beneath).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// the name (never `.` or `..`)
    pub name: OsString,
    /// the type, not following a symlink
    pub kind: FileKind,
    /// whether the entry is the root of a mount (including a same-filesystem bind)
    pub mount_root: bool,
    /// the disk space it takes (`st_blocks` × 512, not following a symlink;
    /// a directory's own blocks, not its contents')
    pub bytes: u64,
}

/// One entry as the fsGroup ownership walk sees it: one `statx`, never
/// following it ([`Sys::owner_list`](crate::host::sys::Sys::owner_list)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerEntry {
    /// the name (never `.` or `..`; empty for a handle's own directory)
    pub name: std::ffi::CString,
    /// the type, not following a symlink
    pub kind: FileKind,
    /// the mode's permission bits (`mode & 0o7777`)
    pub perm: u32,
    /// the group
    pub gid: u32,
    /// whether the entry is the root of a mount (a same-filesystem bind too)
    pub mount_root: bool,
}

/// A directory reached beneath a base without following any symlink
/// ([`Sys::open_dir_beneath`](crate::host::sys::Sys::open_dir_beneath)),
/// that the seam's `*_in` calls act in. The real one holds a descriptor of
/// the directory, so each call resolves only its own name from there rather
/// than the whole path from the base; a fake's holds only the path.
#[derive(Debug)]
pub struct DirHandle {
    path: PathBuf,
    fd: Option<std::os::fd::OwnedFd>,
    made: bool,
}

impl DirHandle {
    /// A handle that is only a path: the `*_in` calls act through the
    /// `*_beneath` calls with the path as their base.
    pub fn by_path(path: PathBuf) -> Self {
        Self {
            path,
            fd: None,
            made: false,
        }
    }
    /// A handle on the open directory `fd` at `path`.
    pub(crate) fn with_fd(path: PathBuf, fd: std::os::fd::OwnedFd) -> Self {
        Self {
            path,
            fd: Some(fd),
            made: false,
        }
    }
    /// The same handle, saying whether the call that opened it made the
    /// directory.
    pub(crate) fn made(self, made: bool) -> Self {
        Self { made, ..self }
    }
    /// Whether the call that opened it made the directory (so it was
    /// empty then). A hint to skip looking: what a call in it finds (an
    /// `EEXIST`) still decides.
    pub fn was_made(&self) -> bool {
        self.made
    }
    /// Where the directory was when it was opened (for messages, and the
    /// base of a path-only handle's calls).
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// The descriptor, when the handle holds one.
    pub(crate) fn fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.fd.as_ref().map(|f| f.as_fd())
    }
}

/// What a block device holds, per [`Sys::probe_fs`](crate::host::sys::Sys::probe_fs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskFormat {
    /// nothing identifiable: safe to format
    Unformatted,
    /// a filesystem of this type
    Filesystem(String),
    /// a partition table (this type) and no filesystem: never format it
    PartitionTable(String),
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beneath_splits_only_paths_below_the_base_without_climbing() {
        let base = Path::new("/k");
        let table: [(&str, Option<&str>); 7] = [
            ("/k/pods/u/volumes/x", Some("pods/u/volumes/x")),
            ("/k", Some("")),
            ("/kk/pods", None),
            ("/other", None),
            ("/k/pods/../../etc", None),
            ("/k/./pods", Some("pods")), // `Path` drops `.` components
            ("k/pods", None),
        ];
        for (path, want) in table {
            let got = Beneath::split(base, Path::new(path));
            assert_eq!(
                got.map(|b| b.rel.to_owned()),
                want.map(PathBuf::from),
                "{path}"
            );
        }
        let b = Beneath::split(base, Path::new("/k/a/b")).unwrap();
        assert_eq!(b.full(), Path::new("/k/a/b"));
        assert_eq!(b.parent().unwrap().rel, Path::new("a"));
        assert_eq!(b.parent().unwrap().parent().unwrap().rel, Path::new(""));
        assert!(b.parent().unwrap().parent().unwrap().parent().is_none());
    }
}
