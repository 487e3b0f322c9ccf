//! [`SysCall`]: one call through the seam as plain comparable data.

use std::path::PathBuf;

use nix::mount::{MntFlags, MsFlags};

use super::Call;

/// One recorded call, with its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SysCall {
    /// `mount(2)`
    Mount {
        /// source
        source: Option<PathBuf>,
        /// target
        target: PathBuf,
        /// fs type
        fstype: Option<String>,
        /// flags
        flags: MsFlags,
        /// data string
        data: Option<String>,
    },
    /// `umount2(2)`
    Umount {
        /// target
        target: PathBuf,
        /// flags
        flags: MntFlags,
    },
    /// mount-root probe
    MountRoot {
        /// path
        path: PathBuf,
    },
    /// mount id probe
    MntId {
        /// path
        path: PathBuf,
    },
    /// `statx`
    Stat {
        /// path
        path: PathBuf,
        /// follow a last symlink
        follow: bool,
    },
    /// `mkdir`
    Mkdir {
        /// path
        path: PathBuf,
        /// mode
        mode: u32,
    },
    /// chmod of a directory
    ChmodDir {
        /// path
        path: PathBuf,
        /// mode
        mode: u32,
    },
    /// exclusive file creation
    CreateFile {
        /// path
        path: PathBuf,
        /// mode
        mode: u32,
    },
    /// a file written whole and durably
    WriteFile {
        /// path
        path: PathBuf,
        /// mode
        mode: u32,
    },
    /// rename without replacing
    Rename {
        /// from
        from: PathBuf,
        /// to
        to: PathBuf,
    },
    /// rename over whatever is at `to`
    Replace {
        /// from
        from: PathBuf,
        /// to
        to: PathBuf,
    },
    /// a symlink made
    Symlink {
        /// the link
        path: PathBuf,
        /// what it points to
        target: PathBuf,
    },
    /// a symlink read
    ReadLink {
        /// the link
        path: PathBuf,
    },
    /// the group of an entry changed
    Chgrp {
        /// path
        path: PathBuf,
        /// the group id
        gid: u32,
    },
    /// `rmdir`
    Rmdir {
        /// path
        path: PathBuf,
    },
    /// `unlink`
    Unlink {
        /// path
        path: PathBuf,
    },
    /// directory listing beneath a base
    ReadDirBeneath {
        /// base
        base: PathBuf,
        /// relative dir
        rel: PathBuf,
    },
    /// removal beneath a base
    RemoveBeneath {
        /// base
        base: PathBuf,
        /// relative entry
        rel: PathBuf,
        /// as a directory
        dir: bool,
    },
    /// `mkfs.<fs>`
    Mkfs {
        /// device
        device: PathBuf,
        /// fs type
        fstype: String,
    },
    /// `blkid -p`
    ProbeFs {
        /// device
        device: PathBuf,
    },
    /// mountinfo read
    ReadMountinfo,
    /// `realpath`
    Canonicalize {
        /// path
        path: PathBuf,
    },
    /// directory listing
    ReadDir {
        /// path
        path: PathBuf,
    },
    /// small file read
    ReadFile {
        /// path
        path: PathBuf,
    },
    /// filesystem usage
    Statfs {
        /// path
        path: PathBuf,
    },
    /// mount id, device and mount-root attribute
    MountProbe {
        /// path
        path: PathBuf,
    },
    /// a directory opened as a handle
    OpenDir {
        /// path
        path: PathBuf,
    },
    /// the loop devices backed by a file
    LoopFind {
        /// the backing file
        backing: PathBuf,
    },
    /// a free loop device attached to a file
    LoopAttach {
        /// the backing file
        backing: PathBuf,
    },
    /// a loop device detached
    LoopDetach {
        /// the loop device
        dev: PathBuf,
    },
}

impl SysCall {
    /// The kind of call.
    pub(crate) fn kind(&self) -> Call {
        match self {
            SysCall::Mount { .. } => Call::Mount,
            SysCall::Umount { .. } => Call::Umount,
            SysCall::MountRoot { .. } => Call::MountRoot,
            SysCall::MntId { .. } => Call::MntId,
            SysCall::Stat { .. } => Call::Stat,
            SysCall::Mkdir { .. } => Call::Mkdir,
            SysCall::ChmodDir { .. } => Call::ChmodDir,
            SysCall::CreateFile { .. } => Call::CreateFile,
            SysCall::WriteFile { .. } => Call::WriteFile,
            SysCall::Rename { .. } => Call::Rename,
            SysCall::Replace { .. } => Call::Replace,
            SysCall::Symlink { .. } => Call::Symlink,
            SysCall::ReadLink { .. } => Call::ReadLink,
            SysCall::Chgrp { .. } => Call::Chgrp,
            SysCall::Rmdir { .. } => Call::Rmdir,
            SysCall::Unlink { .. } => Call::Unlink,
            SysCall::ReadDirBeneath { .. } => Call::ReadDirBeneath,
            SysCall::RemoveBeneath { .. } => Call::RemoveBeneath,
            SysCall::Mkfs { .. } => Call::Mkfs,
            SysCall::ProbeFs { .. } => Call::ProbeFs,
            SysCall::ReadMountinfo => Call::ReadMountinfo,
            SysCall::Canonicalize { .. } => Call::Canonicalize,
            SysCall::ReadDir { .. } => Call::ReadDir,
            SysCall::ReadFile { .. } => Call::ReadFile,
            SysCall::Statfs { .. } => Call::Statfs,
            SysCall::MountProbe { .. } => Call::MountProbe,
            SysCall::OpenDir { .. } => Call::OpenDir,
            SysCall::LoopFind { .. } => Call::LoopFind,
            SysCall::LoopAttach { .. } => Call::LoopAttach,
            SysCall::LoopDetach { .. } => Call::LoopDetach,
        }
    }

    /// Whether the call changes the host (as opposed to looking at it).
    pub(crate) fn mutates(&self) -> bool {
        !matches!(
            self.kind(),
            Call::MountRoot
                | Call::MntId
                | Call::Stat
                | Call::ReadDirBeneath
                | Call::ProbeFs
                | Call::ReadMountinfo
                | Call::Canonicalize
                | Call::ReadDir
                | Call::ReadFile
                | Call::Statfs
                | Call::MountProbe
                | Call::OpenDir
                | Call::ReadLink
                | Call::LoopFind
        )
    }
}
