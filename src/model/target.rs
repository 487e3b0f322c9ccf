//! Targets and the operations on them: what a target is on disk, its
//! state, and the parameters the journal records with every intent.

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{
    CsiParams, PayloadVersion, PluginName, PodUid, SeLinuxContext, SharedPath, SharedStr,
    UniqueVolumeName,
};

/// What a target is on disk (DESIGN.md "Targets").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetKind {
    /// A mount point (tmpfs emptyDir, local PV device mount and bind).
    Mount,
    /// A directory and its contents (disk emptyDir).
    Dir,
    /// Nothing on disk to track (hostPath).
    None,
}

impl TargetKind {
    /// The JSON / table spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TargetKind::Mount => "mount",
            TargetKind::Dir => "dir",
            TargetKind::None => "none",
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
}

impl Operation {
    /// Every operation.
    pub const ALL: [Operation; 5] = [
        Operation::FormatDevice,
        Operation::MountDevice,
        Operation::SetUp,
        Operation::TearDown,
        Operation::UnmountDevice,
    ];
    /// The snake_case name used in records, crash points and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::FormatDevice => "format_device",
            Operation::MountDevice => "mount_device",
            Operation::SetUp => "setup",
            Operation::TearDown => "teardown",
            Operation::UnmountDevice => "unmount_device",
        }
    }
    /// Whether the operation acts on the device target.
    #[cfg(test)]
    pub fn is_device_op(self) -> bool {
        matches!(
            self,
            Operation::FormatDevice | Operation::MountDevice | Operation::UnmountDevice
        )
    }
    /// The state a successful run leaves its target in, if it changes it
    /// (formatting leaves the device unmounted).
    pub fn success_state(self) -> Option<MountState> {
        match self {
            Operation::FormatDevice => None,
            Operation::MountDevice | Operation::SetUp => Some(MountState::Mounted),
            Operation::TearDown | Operation::UnmountDevice => Some(MountState::NotMounted),
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

/// Everything needed to redo or undo an operation on one target without an
/// API server: what the journal records with every intent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetParams {
    /// The unique volume name.
    pub volume: UniqueVolumeName,
    /// The plugin.
    pub plugin: PluginName,
    /// The spec name (pod volume name, or PV name for PVC-backed volumes),
    /// shared with the DSW, the ASW and the journal's state.
    pub spec_name: SharedStr,
    /// Which target.
    pub target: TargetRef,
    /// What the target is on disk.
    pub kind: TargetKind,
    /// The device (block device, or the source dir for a bind), if any
    /// (shared: one allocation however many targets name it).
    pub device_path: Option<SharedPath>,
    /// The device (global) mount path, if the volume has one.
    pub device_mount_path: Option<SharedPath>,
    /// The per-pod path, for pod targets (shared with the ASW's pod target
    /// and the journal's state: a clone is a count).
    pub pod_mount_path: Option<SharedPath>,
    /// The SELinux label mounted with; `None` for none.
    pub selinux: Option<SeLinuxContext>,
    /// Mount options (without the context option).
    pub mount_options: MountOptions,
    /// The filesystem type, if known (shared: every memory emptyDir's is
    /// the one [`SharedStr::tmpfs`]).
    pub fs_type: Option<SharedStr>,
    /// The CSI arguments, for CSI targets only (shared: a clone is a count).
    pub csi: Option<Arc<CsiParams>>,
    /// For a payload volume's pod target: the payload the write is for
    /// (its hash and the objects' versions — never their bytes).
    pub payload: Option<Arc<PayloadVersion>>,
}

/// Mount options as a PersistentVolume gives them (`ro`, `noatime`,
/// `size=…`), without the SELinux context option; a slice of strings to
/// read, with the questions the daemon asks of them answered here.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MountOptions(Vec<String>);

impl MountOptions {
    /// Whether `ro` is among them: the plugins turn `ro` into `MS_RDONLY`
    /// and drop `rw` (the default), so any `ro` makes the mount read-only.
    pub fn is_read_only(&self) -> bool {
        self.0.iter().any(|o| o == "ro")
    }
}

impl std::ops::Deref for MountOptions {
    type Target = [String];
    fn deref(&self) -> &[String] {
        &self.0
    }
}

impl From<Vec<String>> for MountOptions {
    fn from(v: Vec<String>) -> Self {
        MountOptions(v)
    }
}

impl FromIterator<String> for MountOptions {
    fn from_iter<I: IntoIterator<Item = String>>(iter: I) -> Self {
        MountOptions(iter.into_iter().collect())
    }
}

/// One target's parameters, shared (`Arc`): the journal's state holds them
/// once for an entry and its pending intent, and reconstruction's decisions
/// share the entry's instead of copying them.
pub type SharedParams = Arc<TargetParams>;

impl TargetParams {
    /// A target at `path` (a pod target's pod path, the device target's
    /// mount path) with nothing else known — no device, label, options or
    /// fs type; callers add what they know with struct update syntax.
    pub fn at(
        volume: UniqueVolumeName,
        plugin: PluginName,
        spec_name: SharedStr,
        target: TargetRef,
        kind: TargetKind,
        path: Option<SharedPath>,
    ) -> Self {
        let is_device = target == TargetRef::Device;
        TargetParams {
            volume,
            plugin,
            spec_name,
            target,
            kind,
            device_path: None,
            device_mount_path: if is_device { path.clone() } else { None },
            pod_mount_path: if is_device { None } else { path },
            selinux: None,
            mount_options: MountOptions::default(),
            fs_type: None,
            csi: None,
            payload: None,
        }
    }

    /// The path of this target: the pod path for pod targets, the device mount
    /// path for the device target.
    pub fn path(&self) -> Option<&Path> {
        match self.target {
            TargetRef::Device => self.device_mount_path.as_deref(),
            TargetRef::Pod(_) => self.pod_mount_path.as_deref(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_options_say_whether_they_mount_read_only() {
        let opts = |o: &[&str]| o.iter().map(|s| s.to_string()).collect::<MountOptions>();
        assert!(opts(&["noatime", "ro"]).is_read_only());
        assert!(
            opts(&["ro", "rw"]).is_read_only(),
            "as the plugins mount it"
        );
        assert!(!opts(&["rw", "size=1m", "rootcontext=ro"]).is_read_only());
        assert!(!MountOptions::default().is_read_only());
    }

    #[test]
    fn a_target_at_a_path_puts_it_where_its_kind_of_target_keeps_it() {
        let at = |target: TargetRef| {
            TargetParams::at(
                UniqueVolumeName::from_raw("v"),
                PluginName::LocalVolume,
                "pv1".into(),
                target,
                TargetKind::Mount,
                Some(Path::new("/r/x").into()),
            )
        };
        let device = at(TargetRef::Device);
        assert_eq!(device.path(), Some(Path::new("/r/x")));
        assert_eq!(device.pod_mount_path, None);
        let pod = at(TargetRef::Pod(crate::model::PodUid::new("p1").unwrap()));
        assert_eq!(pod.path(), Some(Path::new("/r/x")));
        assert_eq!(pod.device_mount_path, None);
        assert!(pod.device_path.is_none() && pod.selinux.is_none() && pod.fs_type.is_none());
    }
}
