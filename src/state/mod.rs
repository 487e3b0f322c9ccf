//! The desired and actual state of the world (DSW, ASW): caches, no I/O.
//!
//! [`DesiredStateOfWorld`] holds what the pod sources want mounted: unique
//! volume name → the pods that use it. [`ActualStateOfWorld`] holds what
//! volumed believes is on the node: per volume a device (global) target and
//! one target per pod, each with a [`MountState`]. Both follow the kubelet's
//! `desired_state_of_world.go` / `actual_state_of_world.go` rules
//! (and the ASW's tracking of SELinux contexts), re-expressed in Rust:
//!
//! - a device path or a device SELinux context is only ever replaced by a
//!   non-empty one; marking a device unmounted keeps both;
//! - a pod record is replaced wholesale only when it is absent or uncertain
//!   (how a reconstructed entry gets its real outer name), otherwise only its
//!   state changes;
//! - the volume-level SELinux context ([`SeLinuxState`]) is three-valued:
//!   unknown, mounted without a context, or a context. It is set by the first
//!   pod mount while unknown, and [`ActualStateOfWorld::pod_exists_in_volume`]
//!   reports a mismatch with the kubelet's message;
//! - a volume is deleted only once no pod remains.
//!
//! Decisions where volumed departs from the kubelet, on purpose:
//! - [`ActualStateOfWorld::add_volume`] on an existing volume never clears a
//!   known device path (the kubelet overwrites it even with an empty one), and
//!   fills in a spec that was unknown after reconstruction;
//! - [`ActualStateOfWorld::mark_device_unmounted`] keeps the device mount
//!   path (the kubelet blanks it): `dump` still says where the target lives;
//! - the volume-level context lives on the volume, not the device, because
//!   volumes without a device target (a tmpfs emptyDir) have one too; the
//!   snapshot shows it in the `device` object.
//!
//! SELinux *policy* (which label a pod gets, whether a conflict is fatal) is
//! not decided here: callers pass a [`LabelCheck`]. When SELinux mounts are
//! off, callers pass no labels anywhere, so every known context is "without
//! context" and never mismatches.
//!
//! *Invariant:* no locking, no I/O, no async: plain `&mut self` data
//! structures that the daemon wraps. Iteration order is deterministic
//! (sorted by volume name, then pod UID).
//!
//! Layout, by responsibility: `dsw` holds the desired state, `asw` the actual
//! state, `snapshot` the JSON form of the ASW that `dump` and `/debug/state`
//! print. This file holds what they share: the error type and the SELinux
//! state of a mount.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::model::{MountState, PodUid, SeLinuxContext, SharedStr, UniqueVolumeName};

mod asw;
mod dsw;
mod pod_map;
mod report_json;
mod snapshot;
mod world;

pub use asw::{
    ActualStateOfWorld, ActualVolume, DeviceMount, DeviceTarget, MountedPod, MountedVolume,
    PodMount, PodPresence, VolumeMut,
};
pub use dsw::{
    AddedPod, DesiredPod, DesiredStateOfWorld, DesiredVolume, InUseReport, LabelCheck,
    MAX_POD_ERRORS, VolumeToMount,
};
pub use pod_map::PodMap;
pub use report_json::{DamageJson, HealthJson, LostTailJson, MovedAsideJson};
pub use snapshot::{DeviceSnapshot, PodSnapshot, StateSnapshot, UnmountedOutside, VolumeSnapshot};
pub use world::{PodEntry, PodRef, World};

/// Errors from the state caches.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// DSW: a new pod's SELinux label differs from the volume's, and the check was strict.
    #[error("add pod {pod} to volume {volume}: {conflict}")]
    AddPodToVolume {
        /// the volume
        volume: UniqueVolumeName,
        /// the pod that was not added
        pod: PodUid,
        /// the two labels
        conflict: SeLinuxConflict,
    },
    /// ASW: a device state change for a volume that is not in the ASW.
    #[error("mark device of volume {volume} {}: volume is not in the actual state of world", .state.as_str())]
    MarkDevice {
        /// the volume
        volume: UniqueVolumeName,
        /// the state that was to be set
        state: MountState,
    },
    /// ASW: a pod mount state change for a volume that is not in the ASW.
    #[error("mark volume {volume} {} for pod {pod}: volume is not in the actual state of world", .state.as_str())]
    MarkVolume {
        /// the volume
        volume: UniqueVolumeName,
        /// the pod
        pod: PodUid,
        /// the state that was to be set
        state: MountState,
    },
    /// ASW: removing a pod from a volume that is not in the ASW.
    #[error("delete pod {pod} from volume {volume}: volume is not in the actual state of world")]
    DeletePodFromVolume {
        /// the volume
        volume: UniqueVolumeName,
        /// the pod
        pod: PodUid,
    },
    /// ASW: deleting a volume that still has pod records.
    #[error("delete volume {volume}: still used by {} pod(s)", .pods.len())]
    DeleteVolume {
        /// the volume
        volume: UniqueVolumeName,
        /// the pods still recorded
        pods: Vec<PodUid>,
    },
    /// ASW `pod_exists_in_volume`: the volume is not in the ASW (the kubelet's `volumeNotAttachedError`).
    #[error("check pod {pod} in volume {volume}: volume is not in the actual state of world")]
    VolumeNotAttached {
        /// the volume
        volume: UniqueVolumeName,
        /// the pod
        pod: PodUid,
    },
    /// ASW `pod_exists_in_volume`: mounted with another SELinux context than desired.
    #[error("waiting for unmount of volume {:?}, because it is already mounted to a different pod with a different SELinux label", .volume.as_str())]
    SeLinuxMismatch {
        /// the volume
        volume: UniqueVolumeName,
        /// the pod that asked
        pod: PodUid,
    },
    /// An attachable volume not yet in `node.status.volumesInUse`: it is
    /// not mounted until a status update lists it (the kubelet's
    /// `VerifyControllerAttachedVolume` refuses it the same way).
    #[error(
        "volume {volume} is not yet in the node's status.volumesInUse; it is mounted once the node status update lists it"
    )]
    NotReportedInUse {
        /// the volume
        volume: UniqueVolumeName,
        /// the pod that waits
        pod: PodUid,
    },
    /// A volume whose only access mode is ReadWriteOncePod, mounted (or
    /// maybe mounted) for another pod of the node: refused with the
    /// kubelet's words (its MountVolume check), which do not name the
    /// other pod (it may be another namespace's). Tried again each pass;
    /// the pod gets the volume once the other's target is unmounted.
    #[error(
        "MountVolume.SetUp failed for volume {:?} : volume uses the ReadWriteOncePod access mode and is already in use by another pod",
        .spec_name.as_str()
    )]
    ReadWriteOncePodInUse {
        /// the volume
        volume: UniqueVolumeName,
        /// its spec name (the PV's name), as the kubelet's message names it
        spec_name: SharedStr,
        /// the pod refused
        pod: PodUid,
    },
}

/// What kind of failure a [`StateError`] is, for callers to branch on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateErrorKind {
    /// The volume is not in the cache.
    NotFound,
    /// The volume is still in use.
    Busy,
    /// SELinux labels disagree.
    Conflict,
}

impl StateError {
    /// The category of this error.
    pub fn kind(&self) -> StateErrorKind {
        match self {
            StateError::MarkDevice { .. }
            | StateError::MarkVolume { .. }
            | StateError::DeletePodFromVolume { .. }
            | StateError::VolumeNotAttached { .. }
            | StateError::NotReportedInUse { .. } => StateErrorKind::NotFound,
            StateError::ReadWriteOncePodInUse { .. } => StateErrorKind::Busy,
            StateError::DeleteVolume { .. } => StateErrorKind::Busy,
            StateError::AddPodToVolume { .. } | StateError::SeLinuxMismatch { .. } => {
                StateErrorKind::Conflict
            }
        }
    }
}

/// Two SELinux labels that disagree for one volume (DSW; the kubelet's
/// `AddPodToVolume` conflict rules).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeLinuxConflict {
    /// the volume's spec name
    pub spec_name: String,
    /// the label the volume was first added with
    pub existing: Option<SeLinuxContext>,
    /// the new pod's label
    pub new: Option<SeLinuxContext>,
}

impl fmt::Display for SeLinuxConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = |l: &Option<SeLinuxContext>| l.as_ref().map_or("", |c| c.as_str()).to_owned();
        write!(
            f,
            "conflicting SELinux labels of volume {}: {:?} and {:?}",
            self.spec_name,
            s(&self.existing),
            s(&self.new)
        )
    }
}

/// What volumed knows about the SELinux context a target is mounted with.
///
/// In JSON: `null` when unknown, `""` when mounted without a context, else the context.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub enum SeLinuxState {
    /// Not known (not mounted yet, or rebuilt from the host alone).
    #[default]
    Unknown,
    /// Mounted without `-o context`.
    WithoutContext,
    /// Mounted with this context.
    Context(SeLinuxContext),
}

impl SeLinuxState {
    /// The known state of a mount made with `label` (`None`: without context).
    pub fn mounted_with(label: Option<SeLinuxContext>) -> Self {
        label.map_or(SeLinuxState::WithoutContext, SeLinuxState::Context)
    }
    /// Whether the state is known.
    pub fn is_known(&self) -> bool {
        !matches!(self, SeLinuxState::Unknown)
    }
    /// The context, when mounted with one.
    pub fn context(&self) -> Option<&SeLinuxContext> {
        match self {
            SeLinuxState::Context(c) => Some(c),
            _ => None,
        }
    }
    /// Whether a known state differs from the desired label (unknown never does).
    pub fn conflicts_with(&self, desired: Option<&SeLinuxContext>) -> bool {
        self.is_known() && self.context() != desired
    }
}

impl Serialize for SeLinuxState {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            SeLinuxState::Unknown => s.serialize_none(),
            SeLinuxState::WithoutContext => s.serialize_str(""),
            SeLinuxState::Context(c) => s.serialize_str(c.as_str()),
        }
    }
}

impl<'de> Deserialize<'de> for SeLinuxState {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match Option::<String>::deserialize(d)? {
            None => SeLinuxState::Unknown,
            Some(s) if s.is_empty() => SeLinuxState::WithoutContext,
            Some(s) => {
                SeLinuxState::Context(SeLinuxContext::parse(&s).map_err(serde::de::Error::custom)?)
            }
        })
    }
}

/// Helpers shared by the tests of the state modules.
#[cfg(test)]
mod test_support {
    use std::path::PathBuf;

    use super::*;
    use crate::model::{AccessMode, PluginName, VolumeSpec};

    pub(super) fn uid(s: &str) -> PodUid {
        PodUid::new(s).unwrap()
    }
    pub(super) fn ctx(s: &str) -> SeLinuxContext {
        SeLinuxContext::parse(s).unwrap()
    }
    pub(super) fn local_spec() -> VolumeSpec {
        VolumeSpec::Local {
            path: "/dev/loop0".into(),
            fs_type: Some("ext4".into()),
            access_modes: vec![AccessMode::ReadWriteOncePod],
            mount_options: Default::default(),
            is_block: true,
            volume_mode: Default::default(),
        }
    }
    pub(super) fn local() -> UniqueVolumeName {
        UniqueVolumeName::shared(PluginName::LocalVolume, "pv1")
    }
    /// An ASW holding the local PV `pv1` with its device not mounted.
    pub(super) fn asw() -> ActualStateOfWorld {
        let mut asw = ActualStateOfWorld::new();
        asw.add_volume(
            local(),
            PluginName::LocalVolume,
            "pv1",
            Some(local_spec().into()),
            None,
        );
        asw
    }
    pub(super) fn dm(
        device: Option<PathBuf>,
        path: &str,
        selinux: Option<SeLinuxContext>,
    ) -> DeviceMount {
        DeviceMount {
            device_path: device,
            mount_path: path.into(),
            selinux,
        }
    }
}
