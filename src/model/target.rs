//! Targets and the operations on them: what a target is on disk, its
//! state, and which of a volume's targets an operation acts on (the
//! parameters the journal records with every intent are in `params`).

use serde::{Deserialize, Serialize};

use super::PodUid;

/// What a target is on disk (docs/merge-table.md, "Words").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetKind {
    /// A mount point (tmpfs emptyDir, local PV device mount and bind).
    Mount,
    /// A directory and its contents (disk emptyDir).
    Dir,
    /// Nothing on disk to track (hostPath).
    None,
    /// A raw block device map (format v6 on): the global map of a
    /// `volumeMode: Block` volume, or a pod's device file for it.
    Block,
}

impl TargetKind {
    /// The JSON / table spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TargetKind::Mount => "mount",
            TargetKind::Dir => "dir",
            TargetKind::None => "none",
            TargetKind::Block => "block",
        }
    }
}

/// The state of one target (device or pod), as `dump` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MountState {
    /// Known to be mounted (or, for `dir` targets, set up).
    Mounted,
    /// May or may not be mounted; the next operation must be idempotent.
    Uncertain,
    /// Known not to be mounted.
    NotMounted,
}

impl MountState {
    /// The JSON / table spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            MountState::Mounted => "mounted",
            MountState::Uncertain => "uncertain",
            MountState::NotMounted => "not_mounted",
        }
    }
}

/// Which of a volume's two targets an operation acts on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TargetRef {
    /// The device (global) target, shared by every pod.
    Device,
    /// The per-pod target.
    Pod(PodUid),
}

impl TargetRef {
    /// The pod of a per-pod target; `None` for the device target.
    pub fn pod(&self) -> Option<&PodUid> {
        match self {
            TargetRef::Pod(uid) => Some(uid),
            TargetRef::Device => None,
        }
    }
}

/// The four journaled volume operations, plus formatting as its own step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    /// Creating a filesystem on a device before its first MountDevice.
    FormatDevice,
    /// Mounting the device (global) target.
    MountDevice,
    /// Setting up the per-pod target.
    SetUp,
    /// Tearing down the per-pod target.
    TearDown,
    /// Unmounting the device (global) target.
    UnmountDevice,
    /// Giving a mounted pod target's files the pod's fsGroup (the walk
    /// after SetUp, `plugins/ownership.rs`); it leaves the state as it is.
    SetOwnership,
    /// Binding one container's subPath of a mounted pod target
    /// (`host::subpath`): acts on a [`super::SubpathBind`], never on the
    /// volume's targets, whose state it leaves as it is.
    BindSubpath,
    /// Unmounting and removing a subPath bind, before its volume's
    /// TearDown or for a pod that is gone.
    UnbindSubpath,
    /// (format v6 on) Mapping a raw block volume's device at its global map
    /// path: the device target of a `volumeMode: Block` volume, as
    /// MountDevice is of a filesystem one.
    MapDevice,
    /// Undoing [`Operation::MapDevice`] once no pod maps the device.
    UnmapDevice,
    /// Mapping the device into one pod (its `volumeDevices` file): the pod
    /// target of a block volume, as SetUp is of a filesystem one.
    MapPodDevice,
    /// Undoing [`Operation::MapPodDevice`].
    UnmapPodDevice,
    /// Growing a mounted (or just staged) volume's filesystem on the node
    /// (NodeExpandVolume); it leaves the target's state as it is.
    ExpandVolume,
}

impl Operation {
    /// Every operation.
    pub const ALL: [Operation; 13] = [
        Operation::FormatDevice,
        Operation::MountDevice,
        Operation::SetUp,
        Operation::TearDown,
        Operation::UnmountDevice,
        Operation::SetOwnership,
        Operation::BindSubpath,
        Operation::UnbindSubpath,
        Operation::MapDevice,
        Operation::UnmapDevice,
        Operation::MapPodDevice,
        Operation::UnmapPodDevice,
        Operation::ExpandVolume,
    ];
    /// The snake_case name used in records, crash points and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::FormatDevice => "format_device",
            Operation::MountDevice => "mount_device",
            Operation::SetUp => "setup",
            Operation::TearDown => "teardown",
            Operation::UnmountDevice => "unmount_device",
            Operation::SetOwnership => "set_ownership",
            Operation::BindSubpath => "bind_subpath",
            Operation::UnbindSubpath => "unbind_subpath",
            Operation::MapDevice => "map_device",
            Operation::UnmapDevice => "unmap_device",
            Operation::MapPodDevice => "map_pod_device",
            Operation::UnmapPodDevice => "unmap_pod_device",
            Operation::ExpandVolume => "expand_volume",
        }
    }
    /// Whether the operation acts on a subPath bind, not on a target.
    pub fn is_subpath_op(self) -> bool {
        matches!(self, Operation::BindSubpath | Operation::UnbindSubpath)
    }
    /// Whether the operation acts on the device target.
    #[cfg(test)]
    pub fn is_device_op(self) -> bool {
        matches!(
            self,
            Operation::FormatDevice
                | Operation::MountDevice
                | Operation::UnmountDevice
                | Operation::MapDevice
                | Operation::UnmapDevice
        )
    }
    /// The state a successful run leaves its target in, if it changes it
    /// (formatting leaves the device unmounted).
    pub fn success_state(self) -> Option<MountState> {
        match self {
            Operation::FormatDevice
            | Operation::SetOwnership
            | Operation::BindSubpath
            | Operation::UnbindSubpath
            | Operation::ExpandVolume => None,
            Operation::MountDevice
            | Operation::SetUp
            | Operation::MapDevice
            | Operation::MapPodDevice => Some(MountState::Mounted),
            Operation::TearDown
            | Operation::UnmountDevice
            | Operation::UnmapDevice
            | Operation::UnmapPodDevice => Some(MountState::NotMounted),
        }
    }
}

/// Whether an operation is one syscall (a mount or an umount, whose effect
/// the host shows completely) or several steps (format then mount, tmpfs then
/// ownership, CSI calls) that a crash can cut in the middle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Steps {
    /// One mount(2) or umount2(2).
    Single,
    /// More than one step.
    Multi,
}
