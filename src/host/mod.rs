//! The OS as it is: the mount table, the pod and plugin directories, the boot
//! id.
//!
//! - [`mountinfo`]: our own byte parser of `/proc/<pid>/mountinfo` and the
//!   [`mountinfo::MountTable`] lookups (by mount point, under a prefix);
//!   `super_options` splits the last field and pulls out SELinux labels.
//! - [`boot`]: the boot id, which tells reconstruction whether the machine
//!   rebooted since the journal was written.
//! - [`scan`]: the host side of reconstruction: from one read of the mount
//!   table plus a walk of `<root>/pods/*/volumes/*/*` it builds a
//!   [`scan::HostView`] of device targets, pod targets, bare directories and
//!   CSI `vol_data.json` files. The mount-table part is a pure function;
//!   the on-disk part (walk, `vol_data.json`) is [`pod_dirs`].
//! - `testgen` (hidden): deterministic generators of large tables for tests
//!   and benchmarks.
//!
//! - [`sys`]: the one syscall seam — mount, umount2, statx, openat2, mkfs,
//!   blkid behind the [`sys::Sys`] trait, with the nix implementation
//!   [`sys::LinuxSys`]; `recording_sys` (test builds) is its recording fake.
//! - [`remove`]: safe removal that never deletes a mount point or what is
//!   under one, never follows a symlink and never crosses a filesystem.
//!
//! *Invariant:* only [`sys`] calls the kernel to mount, unmount or delete
//! (and holds the crate's only `unsafe`); everything else here reads. The
//! scan never follows a symlink below the root dir and never fails as a whole
//! because of one bad line, directory or file — those become reported
//! problems.

use std::path::PathBuf;

pub mod boot;
#[cfg(test)]
pub(crate) mod fake_host;
pub mod meminfo;
pub mod mountinfo;
pub mod pod_dirs;
#[cfg(test)]
pub(crate) mod recording_sys;
pub mod remove;
pub mod scan;
pub mod subpath;
pub(crate) mod super_options;
pub mod sys;
pub(crate) mod sys_types;
#[cfg(test)]
pub(crate) mod testgen;
pub(crate) mod watch;

/// What kind of failure a [`HostError`] is, for callers that branch on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostErrorCategory {
    /// The thing is not there.
    NotFound,
    /// Any other I/O failure.
    Io,
    /// The thing is there but its content makes no sense.
    Corruption,
}

/// Errors of the host module. Each variant names the step that failed and
/// carries the path it failed on.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// reading the mount table failed
    #[error("reading mount table {path}")]
    ReadMountInfo {
        /// the mountinfo file
        path: PathBuf,
        /// the I/O error
        #[source]
        source: std::io::Error,
    },
    /// the mount table is larger than we are willing to hold in memory
    #[error("mount table {path} is larger than {limit} bytes")]
    MountInfoTooLarge {
        /// the mountinfo file
        path: PathBuf,
        /// the cap in bytes
        limit: usize,
    },
    /// reading the boot id failed
    #[error("reading boot id {path}")]
    ReadBootId {
        /// the boot id file
        path: PathBuf,
        /// the I/O error
        #[source]
        source: std::io::Error,
    },
    /// the boot id file holds something that is not a boot id
    #[error("invalid boot id {value:?} in {path}")]
    InvalidBootId {
        /// the boot id file
        path: PathBuf,
        /// what it held (lossily decoded, truncated)
        value: String,
    },
    /// reading a directory during the pod-dir walk failed
    #[error("reading directory {path}")]
    ReadDir {
        /// the directory
        path: PathBuf,
        /// the I/O error
        #[source]
        source: std::io::Error,
    },
    /// `lstat` of a path during the walk failed
    #[error("stat of {path}")]
    Stat {
        /// the path
        path: PathBuf,
        /// the I/O error
        #[source]
        source: std::io::Error,
    },
    /// reading a CSI `vol_data.json` failed
    #[error("reading csi volume data {path}")]
    ReadVolData {
        /// the file
        path: PathBuf,
        /// the I/O error
        #[source]
        source: std::io::Error,
    },
    /// a CSI `vol_data.json` is not the JSON object of strings the kubelet writes
    #[error("parsing csi volume data {path}")]
    ParseVolData {
        /// the file
        path: PathBuf,
        /// the JSON error
        #[source]
        source: serde_json::Error,
    },
    /// a CSI `vol_data.json` is a symlink, too large or not a regular file
    #[error("refusing csi volume data {path}: {why}")]
    RefuseVolData {
        /// the file
        path: PathBuf,
        /// why it was refused
        why: &'static str,
    },
}

impl HostError {
    /// The category, for recovery and the reconciler to branch on.
    pub fn category(&self) -> HostErrorCategory {
        let io = |e: &std::io::Error| {
            if e.kind() == std::io::ErrorKind::NotFound {
                HostErrorCategory::NotFound
            } else {
                HostErrorCategory::Io
            }
        };
        match self {
            HostError::ReadMountInfo { source, .. }
            | HostError::ReadBootId { source, .. }
            | HostError::ReadDir { source, .. }
            | HostError::Stat { source, .. }
            | HostError::ReadVolData { source, .. } => io(source),
            HostError::MountInfoTooLarge { .. } => HostErrorCategory::Io,
            HostError::InvalidBootId { .. }
            | HostError::ParseVolData { .. }
            | HostError::RefuseVolData { .. } => HostErrorCategory::Corruption,
        }
    }
}
