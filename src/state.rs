//! The desired and actual state of the world (DSW, ASW): caches, no I/O.
//!
//! [`DesiredStateOfWorld`] holds what the pod sources want mounted: unique
//! volume name → the pods that use it. [`ActualStateOfWorld`] holds what
//! volumed believes is on the node: per volume a device (global) target and
//! one target per pod, each with a [`MountState`]. Both follow the kubelet's
//! `desired_state_of_world.go` / `actual_state_of_world.go` rules
//! (`reference/kubelet-behaviour.md` §1.1, §1.2, §4.4), re-expressed in Rust:
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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::model::{
    MountState, PluginName, PodUid, PodVolume, SeLinuxContext, TargetKind, UniqueVolumeName,
    VolumeSpec,
};

/// The kubelet's `maxPodErrors`: a pod's error set grows only while it holds
/// at most this many entries, so at most one more accumulates.
pub const MAX_POD_ERRORS: usize = 10;

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
            | StateError::VolumeNotAttached { .. } => StateErrorKind::NotFound,
            StateError::DeleteVolume { .. } => StateErrorKind::Busy,
            StateError::AddPodToVolume { .. } | StateError::SeLinuxMismatch { .. } => {
                StateErrorKind::Conflict
            }
        }
    }
}

/// Two SELinux labels that disagree for one volume (DSW, kubelet §4.6).
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

// ---------------------------------------------------------------------------
// Desired state of world
// ---------------------------------------------------------------------------

/// How a new pod's SELinux label is checked against the volume's. The
/// `selinux` module computes it (kubelet §4.6); this cache only compares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelCheck {
    /// The label the pod would get if every access mode allowed `-o context`
    /// (the kubelet's "original" label); compared with the volume's.
    pub original: Option<SeLinuxContext>,
    /// Whether a conflict refuses the pod (the volume supports SELinux
    /// mounts) instead of only being reported.
    pub strict: bool,
}

/// One pod's use of a desired volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredPod {
    /// `pod.spec.volumes[x].name`
    pub outer_name: String,
    /// the spec name (pod volume name, or PV name)
    pub spec_name: String,
    /// the label this pod would mount with
    pub selinux: Option<SeLinuxContext>,
}

/// A volume some pods want mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredVolume {
    /// the plugin
    pub plugin: PluginName,
    /// the spec, as the last pod added it
    pub spec: VolumeSpec,
    /// the label used for `-o context`, fixed by the first pod
    pub effective_selinux: Option<SeLinuxContext>,
    /// the label compared for conflicts, fixed by the first pod
    pub original_selinux: Option<SeLinuxContext>,
    /// the pods that want it
    pub pods: BTreeMap<PodUid, DesiredPod>,
}

/// The result of [`DesiredStateOfWorld::add_pod_to_volume`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddedPod {
    /// the volume the pod was added to
    pub volume: UniqueVolumeName,
    /// a label conflict that was tolerated (not strict): a warning to report
    pub conflict: Option<SeLinuxConflict>,
}

/// One (volume, pod) pair to mount, as [`DesiredStateOfWorld::volumes_to_mount`] lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeToMount {
    /// the volume
    pub volume: UniqueVolumeName,
    /// the pod
    pub pod: PodUid,
    /// the plugin
    pub plugin: PluginName,
    /// the spec
    pub spec: VolumeSpec,
    /// the spec name
    pub spec_name: String,
    /// the pod's outer volume name
    pub outer_name: String,
    /// the volume's effective label: what to mount with
    pub selinux: Option<SeLinuxContext>,
}

/// What the pod sources want mounted.
#[derive(Debug, Clone, Default)]
pub struct DesiredStateOfWorld {
    volumes: BTreeMap<UniqueVolumeName, DesiredVolume>,
    pod_errors: BTreeMap<PodUid, BTreeSet<String>>,
    populated: bool,
}

impl DesiredStateOfWorld {
    /// An empty DSW, not yet populated.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `pod`'s use of `volume`; the result names the volume. The first
    /// pod fixes the volume's labels. A *new* pod whose `check.original`
    /// differs from the volume's is refused when `check.strict`, else added
    /// with the conflict reported in [`AddedPod::conflict`]. Re-adding a pod
    /// updates its record without a label check.
    pub fn add_pod_to_volume(
        &mut self,
        pod: &PodUid,
        volume: PodVolume,
        check: LabelCheck,
    ) -> Result<AddedPod, StateError> {
        let name = volume.volume;
        let record = DesiredPod {
            outer_name: volume.outer_name,
            spec_name: volume.spec_name,
            selinux: volume.selinux.clone(),
        };
        let entry = self
            .volumes
            .entry(name.clone())
            .or_insert_with(|| DesiredVolume {
                plugin: volume.spec.plugin(),
                spec: volume.spec.clone(),
                effective_selinux: volume.selinux,
                original_selinux: check.original.clone(),
                pods: BTreeMap::new(),
            });
        let mut conflict = None;
        let new_pod = !entry.pods.is_empty() && !entry.pods.contains_key(pod);
        if new_pod && entry.original_selinux != check.original {
            let c = SeLinuxConflict {
                spec_name: record.spec_name.clone(),
                existing: entry.original_selinux.clone(),
                new: check.original,
            };
            if check.strict {
                return Err(StateError::AddPodToVolume {
                    volume: name,
                    pod: pod.clone(),
                    conflict: c,
                });
            }
            conflict = Some(c);
        }
        entry.spec = volume.spec;
        entry.pods.insert(pod.clone(), record);
        Ok(AddedPod {
            volume: name,
            conflict,
        })
    }

    /// Removes `pod` from `volume`, and the volume once no pod wants it.
    /// Clears the pod's errors, as the kubelet does.
    pub fn delete_pod_from_volume(&mut self, pod: &PodUid, volume: &UniqueVolumeName) {
        self.pod_errors.remove(pod);
        if let Some(v) = self.volumes.get_mut(volume) {
            v.pods.remove(pod);
            if v.pods.is_empty() {
                self.volumes.remove(volume);
            }
        }
    }

    /// Removes `pod` from every volume; returns the volumes it was removed from.
    pub fn delete_pod(&mut self, pod: &PodUid) -> Vec<UniqueVolumeName> {
        let names = self.volumes_of_pod(pod);
        for name in &names {
            self.delete_pod_from_volume(pod, name);
        }
        self.pod_errors.remove(pod);
        names
    }

    /// Whether some pod wants `volume`.
    pub fn volume_exists(&self, volume: &UniqueVolumeName) -> bool {
        self.volumes.contains_key(volume)
    }

    /// Whether some pod wants `volume` mounted with `label` (the effective
    /// label); a volume mounted with another label is not desired.
    pub fn volume_exists_with_label(
        &self,
        volume: &UniqueVolumeName,
        label: Option<&SeLinuxContext>,
    ) -> bool {
        self.volumes
            .get(volume)
            .is_some_and(|v| v.effective_selinux.as_ref() == label)
    }

    /// Whether `pod` wants `volume`.
    pub fn pod_exists_in_volume(&self, pod: &PodUid, volume: &UniqueVolumeName) -> bool {
        self.volumes
            .get(volume)
            .is_some_and(|v| v.pods.contains_key(pod))
    }

    /// Whether `pod` wants `volume` mounted with `label` (the effective label).
    pub fn pod_exists_in_volume_with_label(
        &self,
        pod: &PodUid,
        volume: &UniqueVolumeName,
        label: Option<&SeLinuxContext>,
    ) -> bool {
        self.volumes
            .get(volume)
            .is_some_and(|v| v.pods.contains_key(pod) && v.effective_selinux.as_ref() == label)
    }

    /// One volume's record.
    pub fn volume(&self, volume: &UniqueVolumeName) -> Option<&DesiredVolume> {
        self.volumes.get(volume)
    }

    /// Every volume, sorted by name.
    pub fn volumes(&self) -> impl Iterator<Item = (&UniqueVolumeName, &DesiredVolume)> {
        self.volumes.iter()
    }

    /// The volumes `pod` wants, sorted.
    pub fn volumes_of_pod(&self, pod: &PodUid) -> Vec<UniqueVolumeName> {
        self.volumes
            .iter()
            .filter(|(_, v)| v.pods.contains_key(pod))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// One entry per (volume, pod), sorted by volume then pod.
    pub fn volumes_to_mount(&self) -> Vec<VolumeToMount> {
        self.volumes
            .iter()
            .flat_map(|(name, v)| {
                v.pods.iter().map(move |(uid, p)| VolumeToMount {
                    volume: name.clone(),
                    pod: uid.clone(),
                    plugin: v.plugin,
                    spec: v.spec.clone(),
                    spec_name: p.spec_name.clone(),
                    outer_name: p.outer_name.clone(),
                    selinux: v.effective_selinux.clone(),
                })
            })
            .collect()
    }

    /// Records an error for `pod`. Like the kubelet, an error is added only
    /// while the pod holds at most [`MAX_POD_ERRORS`] distinct errors.
    pub fn add_pod_error(&mut self, pod: &PodUid, error: impl Into<String>) {
        let errors = self.pod_errors.entry(pod.clone()).or_default();
        if errors.len() <= MAX_POD_ERRORS {
            errors.insert(error.into());
        }
    }

    /// Returns and clears `pod`'s errors, sorted.
    pub fn pop_pod_errors(&mut self, pod: &PodUid) -> Vec<String> {
        self.pod_errors
            .remove(pod)
            .map(|e| e.into_iter().collect())
            .unwrap_or_default()
    }

    /// Every pod source has listed its pods once: unmounting may start.
    pub fn mark_sources_ready(&mut self) {
        self.populated = true;
    }

    /// Whether every pod source has listed its pods once.
    pub fn is_populated(&self) -> bool {
        self.populated
    }
}

// ---------------------------------------------------------------------------
// Actual state of world
// ---------------------------------------------------------------------------

/// A volume's device (global) target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceTarget {
    /// mounted, uncertain or not mounted
    pub state: MountState,
    /// the device (e.g. `/dev/loop0`), once known
    pub device_path: Option<PathBuf>,
    /// where the device is mounted, once known
    pub mount_path: Option<PathBuf>,
}

impl DeviceTarget {
    /// Mounted or uncertain (the kubelet's `DeviceMayBeMounted`).
    pub fn may_be_mounted(&self) -> bool {
        self.state != MountState::NotMounted
    }
}

/// Where and how a device target was (or may have been) mounted: the input
/// of [`ActualStateOfWorld::mark_device_mounted`] and `mark_device_uncertain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceMount {
    /// the device; `None` keeps the one already known
    pub device_path: Option<PathBuf>,
    /// the device mount path
    pub mount_path: PathBuf,
    /// the context given to the mount; `None` keeps the volume's
    pub selinux: Option<SeLinuxContext>,
}

/// A pod's target of a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedPod {
    /// mounted or uncertain
    pub state: MountState,
    /// how it was set up
    pub mount: PodMount,
}

/// How a pod target was (or may have been) set up: the input of
/// [`ActualStateOfWorld::mark_volume_mounted`] and friends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodMount {
    /// `pod.spec.volumes[x].name` (empty when rebuilt from the host alone)
    pub outer_name: String,
    /// the pod target path
    pub mount_path: PathBuf,
    /// what the target is on disk
    pub kind: TargetKind,
    /// the context the mount was made with
    pub selinux: SeLinuxState,
}

/// A volume volumed believes is (or was) on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActualVolume {
    /// the plugin, kept apart from the spec so unmount works without one
    pub plugin: PluginName,
    /// the spec name
    pub spec_name: String,
    /// the spec; `None` when rebuilt from the host alone
    pub spec: Option<VolumeSpec>,
    /// the device target; `None` when the volume has none (or none is known yet)
    pub device: Option<DeviceTarget>,
    /// the volume-level context (the kubelet's `seLinuxMountContext`)
    pub selinux: SeLinuxState,
    /// the pod targets
    pub pods: BTreeMap<PodUid, MountedPod>,
}

/// A pod target with its volume's details, as the listing functions return it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedVolume {
    /// the volume
    pub volume: UniqueVolumeName,
    /// the pod
    pub pod: PodUid,
    /// the plugin
    pub plugin: PluginName,
    /// the spec name
    pub spec_name: String,
    /// the spec, when known
    pub spec: Option<VolumeSpec>,
    /// the pod target
    pub target: MountedPod,
    /// the device mount path, when known
    pub device_mount_path: Option<PathBuf>,
    /// the volume-level context, as the kubelet reports it
    pub selinux: SeLinuxState,
}

/// Whether a pod's target is mounted, from [`ActualStateOfWorld::pod_exists_in_volume`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPresence {
    /// mounted (`false` when absent or uncertain: mount it again)
    pub mounted: bool,
    /// the volume's device path, when known
    pub device_path: Option<PathBuf>,
}

/// What volumed believes is mounted.
#[derive(Debug, Clone, Default)]
pub struct ActualStateOfWorld {
    volumes: BTreeMap<UniqueVolumeName, ActualVolume>,
    /// (volume, pod) pairs rebuilt at startup and not yet confirmed mounted.
    reconstructed: BTreeMap<UniqueVolumeName, BTreeSet<PodUid>>,
}

impl ActualStateOfWorld {
    /// An empty ASW.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a volume with its device target not mounted (when the spec says
    /// it has one). On an existing volume, only sets a non-empty device path
    /// and a spec that was unknown.
    pub fn add_volume(
        &mut self,
        volume: UniqueVolumeName,
        plugin: PluginName,
        spec_name: impl Into<String>,
        spec: Option<VolumeSpec>,
        device_path: Option<PathBuf>,
    ) {
        let has_device = |s: &Option<VolumeSpec>| {
            s.as_ref()
                .and_then(VolumeSpec::device_target_kind)
                .is_some()
        };
        match self.volumes.get_mut(&volume) {
            Some(v) => {
                if v.spec.is_none() && spec.is_some() {
                    if v.device.is_none() && has_device(&spec) {
                        v.device = Some(not_mounted_device());
                    }
                    v.spec = spec;
                }
                if let (Some(path), Some(d)) = (device_path, v.device.as_mut()) {
                    d.device_path = Some(path);
                }
            }
            None => {
                let device = (has_device(&spec) || device_path.is_some()).then(|| DeviceTarget {
                    device_path,
                    ..not_mounted_device()
                });
                self.volumes.insert(
                    volume,
                    ActualVolume {
                        plugin,
                        spec_name: spec_name.into(),
                        spec,
                        device,
                        selinux: SeLinuxState::Unknown,
                        pods: BTreeMap::new(),
                    },
                );
            }
        }
    }

    /// The device target is mounted.
    pub fn mark_device_mounted(
        &mut self,
        volume: &UniqueVolumeName,
        mount: DeviceMount,
    ) -> Result<(), StateError> {
        self.set_device_state(volume, MountState::Mounted, Some(mount))
    }

    /// The device target may or may not be mounted.
    pub fn mark_device_uncertain(
        &mut self,
        volume: &UniqueVolumeName,
        mount: DeviceMount,
    ) -> Result<(), StateError> {
        self.set_device_state(volume, MountState::Uncertain, Some(mount))
    }

    /// The device target is not mounted. Device path, mount path and the
    /// volume's context are kept.
    pub fn mark_device_unmounted(&mut self, volume: &UniqueVolumeName) -> Result<(), StateError> {
        self.set_device_state(volume, MountState::NotMounted, None)
    }

    /// Sets the state; the device path and the context only when given.
    fn set_device_state(
        &mut self,
        volume: &UniqueVolumeName,
        state: MountState,
        mount: Option<DeviceMount>,
    ) -> Result<(), StateError> {
        let v = self
            .volumes
            .get_mut(volume)
            .ok_or_else(|| StateError::MarkDevice {
                volume: volume.clone(),
                state,
            })?;
        let d = v.device.get_or_insert_with(not_mounted_device);
        d.state = state;
        if let Some(m) = mount {
            d.device_path = m.device_path.or(d.device_path.take());
            d.mount_path = Some(m.mount_path);
            if let Some(c) = m.selinux {
                v.selinux = SeLinuxState::Context(c);
            }
        }
        Ok(())
    }

    /// Overwrites the device path while the device is uncertain (a
    /// reconstructed volume learning its device later).
    pub fn update_reconstructed_device_path(
        &mut self,
        volume: &UniqueVolumeName,
        device_path: PathBuf,
    ) -> bool {
        let device = self.volumes.get_mut(volume).and_then(|v| v.device.as_mut());
        match device {
            Some(d) if d.state == MountState::Uncertain => {
                d.device_path = Some(device_path);
                true
            }
            _ => false,
        }
    }

    /// `pod`'s target of `volume` is mounted.
    pub fn mark_volume_mounted(
        &mut self,
        volume: &UniqueVolumeName,
        pod: &PodUid,
        mount: PodMount,
    ) -> Result<(), StateError> {
        self.add_pod(volume, pod, mount, MountState::Mounted)
    }

    /// `pod`'s target of `volume` may or may not be mounted.
    pub fn mark_volume_uncertain(
        &mut self,
        volume: &UniqueVolumeName,
        pod: &PodUid,
        mount: PodMount,
    ) -> Result<(), StateError> {
        self.add_pod(volume, pod, mount, MountState::Uncertain)
    }

    /// Creates or replaces the pod record when absent or uncertain, else only
    /// sets its state; sets the volume context while unknown.
    fn add_pod(
        &mut self,
        volume: &UniqueVolumeName,
        pod: &PodUid,
        mount: PodMount,
        state: MountState,
    ) -> Result<(), StateError> {
        let v = self
            .volumes
            .get_mut(volume)
            .ok_or_else(|| StateError::MarkVolume {
                volume: volume.clone(),
                pod: pod.clone(),
                state,
            })?;
        if !v.selinux.is_known() {
            v.selinux = mount.selinux.clone();
        }
        match v.pods.get_mut(pod) {
            Some(p) if p.state != MountState::Uncertain => p.state = state,
            _ => {
                v.pods.insert(pod.clone(), MountedPod { state, mount });
            }
        }
        if state == MountState::Mounted {
            self.forget_reconstructed(volume, pod);
        }
        Ok(())
    }

    /// Records a pod target found at startup as uncertain, unless the volume
    /// is absent or the pod is already recorded. The pod's context is stored
    /// as given; the volume's is left alone. Returns whether it was recorded.
    pub fn mark_volume_uncertain_via_reconstruction(
        &mut self,
        volume: &UniqueVolumeName,
        pod: &PodUid,
        mount: PodMount,
    ) -> bool {
        let Some(v) = self.volumes.get_mut(volume) else {
            return false;
        };
        if v.pods.contains_key(pod) {
            return false;
        }
        let state = MountState::Uncertain;
        v.pods.insert(pod.clone(), MountedPod { state, mount });
        self.reconstructed
            .entry(volume.clone())
            .or_default()
            .insert(pod.clone());
        true
    }

    /// Whether `pod`'s target of `volume` came from reconstruction and is still uncertain.
    pub fn is_volume_reconstructed(&self, volume: &UniqueVolumeName, pod: &PodUid) -> bool {
        let uncertain = self
            .pod(volume, pod)
            .is_some_and(|p| p.state == MountState::Uncertain);
        uncertain
            && self
                .reconstructed
                .get(volume)
                .is_some_and(|s| s.contains(pod))
    }

    /// Whether some pod target of `volume` came from reconstruction.
    pub fn is_volume_device_reconstructed(&self, volume: &UniqueVolumeName) -> bool {
        self.reconstructed.contains_key(volume)
    }

    fn forget_reconstructed(&mut self, volume: &UniqueVolumeName, pod: &PodUid) {
        if let Some(set) = self.reconstructed.get_mut(volume) {
            set.remove(pod);
            if set.is_empty() {
                self.reconstructed.remove(volume);
            }
        }
    }

    /// Removes `pod`'s target record of `volume` (absent pod: nothing to do).
    pub fn delete_pod_from_volume(
        &mut self,
        volume: &UniqueVolumeName,
        pod: &PodUid,
    ) -> Result<(), StateError> {
        let v = self
            .volumes
            .get_mut(volume)
            .ok_or_else(|| StateError::DeletePodFromVolume {
                volume: volume.clone(),
                pod: pod.clone(),
            })?;
        v.pods.remove(pod);
        self.forget_reconstructed(volume, pod);
        Ok(())
    }

    /// Removes `volume`; refused while any pod record remains. An absent volume is fine.
    pub fn delete_volume(&mut self, volume: &UniqueVolumeName) -> Result<(), StateError> {
        let Some(v) = self.volumes.get(volume) else {
            return Ok(());
        };
        if !v.pods.is_empty() {
            return Err(StateError::DeleteVolume {
                volume: volume.clone(),
                pods: v.pods.keys().cloned().collect(),
            });
        }
        self.volumes.remove(volume);
        self.reconstructed.remove(volume);
        Ok(())
    }

    /// Whether `pod`'s target of `volume` is mounted, checked in the
    /// kubelet's order: volume absent → error; volume context known and not
    /// `desired_label` → mismatch error; pod uncertain → not mounted; else
    /// whether the pod is recorded mounted.
    pub fn pod_exists_in_volume(
        &self,
        volume: &UniqueVolumeName,
        pod: &PodUid,
        desired_label: Option<&SeLinuxContext>,
    ) -> Result<PodPresence, StateError> {
        let v = self
            .volumes
            .get(volume)
            .ok_or_else(|| StateError::VolumeNotAttached {
                volume: volume.clone(),
                pod: pod.clone(),
            })?;
        if v.selinux.conflicts_with(desired_label) {
            return Err(StateError::SeLinuxMismatch {
                volume: volume.clone(),
                pod: pod.clone(),
            });
        }
        Ok(PodPresence {
            mounted: v
                .pods
                .get(pod)
                .is_some_and(|p| p.state == MountState::Mounted),
            device_path: v.device.as_ref().and_then(|d| d.device_path.clone()),
        })
    }

    /// Whether `volume` is recorded.
    pub fn volume_exists(&self, volume: &UniqueVolumeName) -> bool {
        self.volumes.contains_key(volume)
    }

    /// One volume's record.
    pub fn volume(&self, volume: &UniqueVolumeName) -> Option<&ActualVolume> {
        self.volumes.get(volume)
    }

    /// One pod target's record.
    pub fn pod(&self, volume: &UniqueVolumeName, pod: &PodUid) -> Option<&MountedPod> {
        self.volumes.get(volume).and_then(|v| v.pods.get(pod))
    }

    /// Every volume, sorted by name.
    pub fn volumes(&self) -> impl Iterator<Item = (&UniqueVolumeName, &ActualVolume)> {
        self.volumes.iter()
    }

    /// Pod targets whose state passes `keep`, optionally of one pod only.
    fn pod_targets(
        &self,
        only: Option<&PodUid>,
        keep: impl Fn(MountState) -> bool,
    ) -> Vec<MountedVolume> {
        let mut out = Vec::new();
        for (name, v) in &self.volumes {
            for (uid, p) in &v.pods {
                if only.is_some_and(|o| o != uid) || !keep(p.state) {
                    continue;
                }
                out.push(MountedVolume {
                    volume: name.clone(),
                    pod: uid.clone(),
                    plugin: v.plugin,
                    spec_name: v.spec_name.clone(),
                    spec: v.spec.clone(),
                    target: p.clone(),
                    device_mount_path: v.device.as_ref().and_then(|d| d.mount_path.clone()),
                    selinux: v.selinux.clone(),
                });
            }
        }
        out
    }

    /// Pod targets that are mounted (not uncertain).
    pub fn get_mounted_volumes(&self) -> Vec<MountedVolume> {
        self.pod_targets(None, |s| s == MountState::Mounted)
    }

    /// `pod`'s targets that are mounted (not uncertain).
    pub fn get_mounted_volumes_for_pod(&self, pod: &PodUid) -> Vec<MountedVolume> {
        self.pod_targets(Some(pod), |s| s == MountState::Mounted)
    }

    /// Pod targets that are mounted or uncertain.
    pub fn get_possibly_mounted_volumes(&self) -> Vec<MountedVolume> {
        self.pod_targets(None, |s| s != MountState::NotMounted)
    }

    /// `pod`'s targets that are mounted or uncertain.
    pub fn get_possibly_mounted_volumes_for_pod(&self, pod: &PodUid) -> Vec<MountedVolume> {
        self.pod_targets(Some(pod), |s| s != MountState::NotMounted)
    }

    /// Whether `pod` has a mounted (not uncertain) target.
    pub fn pod_has_mounted_volumes(&self, pod: &PodUid) -> bool {
        self.volumes.values().any(|v| {
            v.pods
                .get(pod)
                .is_some_and(|p| p.state == MountState::Mounted)
        })
    }

    /// Volumes without pod records, whatever their device state.
    pub fn get_unmounted_volumes(&self) -> Vec<(UniqueVolumeName, ActualVolume)> {
        self.volumes_where(|v| v.pods.is_empty())
    }

    /// Volumes whose device target is mounted (not uncertain).
    pub fn get_globally_mounted_volumes(&self) -> Vec<(UniqueVolumeName, ActualVolume)> {
        self.volumes_where(|v| {
            v.device
                .as_ref()
                .is_some_and(|d| d.state == MountState::Mounted)
        })
    }

    fn volumes_where(
        &self,
        keep: impl Fn(&ActualVolume) -> bool,
    ) -> Vec<(UniqueVolumeName, ActualVolume)> {
        self.volumes
            .iter()
            .filter(|(_, v)| keep(v))
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect()
    }

    /// Whether a pod other than `pod` may have `volume` mounted (uncertain counts).
    pub fn is_volume_mounted_elsewhere(&self, volume: &UniqueVolumeName, pod: &PodUid) -> bool {
        self.volumes.get(volume).is_some_and(|v| {
            v.pods
                .iter()
                .any(|(uid, p)| uid != pod && p.state != MountState::NotMounted)
        })
    }

    /// Whether `pod`'s target of `volume` is gone: false while mounted or uncertain.
    pub fn pod_removed_from_volume(&self, volume: &UniqueVolumeName, pod: &PodUid) -> bool {
        self.pod(volume, pod)
            .is_none_or(|p| p.state == MountState::NotMounted)
    }

    /// The ASW as `dump` and `/debug/state` show it, sorted by volume then pod.
    pub fn snapshot(&self) -> StateSnapshot {
        let volumes = self
            .volumes
            .iter()
            .map(|(name, v)| VolumeSnapshot {
                volume: name.clone(),
                device: v.device.as_ref().map(|d| DeviceSnapshot {
                    state: d.state,
                    device_path: d.device_path.clone(),
                    mount_path: d.mount_path.clone(),
                    selinux_context: v.selinux.clone(),
                }),
                pods: v
                    .pods
                    .iter()
                    .map(|(uid, p)| PodSnapshot {
                        pod_uid: uid.clone(),
                        mount_path: p.mount.mount_path.clone(),
                        kind: p.mount.kind,
                        state: p.state,
                        selinux_context: p.mount.selinux.clone(),
                    })
                    .collect(),
            })
            .collect();
        StateSnapshot { volumes }
    }
}

fn not_mounted_device() -> DeviceTarget {
    DeviceTarget {
        state: MountState::NotMounted,
        device_path: None,
        mount_path: None,
    }
}

// ---------------------------------------------------------------------------
// Snapshot (the `state` object of `dump` and `/debug/state`)
// ---------------------------------------------------------------------------

/// The ASW as JSON: DESIGN.md's `dump` `state` object. Field names are a contract.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateSnapshot {
    /// every volume, sorted by name
    pub volumes: Vec<VolumeSnapshot>,
}

/// One volume in a [`StateSnapshot`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeSnapshot {
    /// the unique volume name
    pub volume: UniqueVolumeName,
    /// the device target; `null` when the volume has none
    pub device: Option<DeviceSnapshot>,
    /// the pod targets, sorted by pod UID
    pub pods: Vec<PodSnapshot>,
}

/// A device target in a [`StateSnapshot`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSnapshot {
    /// `mounted`, `uncertain` or `not_mounted`
    pub state: MountState,
    /// the device, `null` when unknown
    pub device_path: Option<PathBuf>,
    /// the device mount path, `null` when unknown
    pub mount_path: Option<PathBuf>,
    /// the volume's context: `null` unknown, `""` without one
    #[serde(default)]
    pub selinux_context: SeLinuxState,
}

/// A pod target in a [`StateSnapshot`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodSnapshot {
    /// the pod UID
    pub pod_uid: PodUid,
    /// the pod target path
    pub mount_path: PathBuf,
    /// `mount`, `dir` or `none`
    pub kind: TargetKind,
    /// `mounted`, `uncertain` or `not_mounted`
    pub state: MountState,
    /// the pod mount's context: `null` unknown, `""` without one
    #[serde(default)]
    pub selinux_context: SeLinuxState,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{AccessMode, StorageMedium};
    use serde_json::json;

    fn uid(s: &str) -> PodUid {
        PodUid::new(s).unwrap()
    }
    fn ctx(s: &str) -> SeLinuxContext {
        SeLinuxContext::parse(s).unwrap()
    }
    fn local_spec() -> VolumeSpec {
        VolumeSpec::Local {
            path: "/dev/loop0".into(),
            fs_type: Some("ext4".into()),
            access_modes: vec![AccessMode::ReadWriteOncePod],
            mount_options: vec![],
            is_block: true,
        }
    }
    fn local() -> UniqueVolumeName {
        UniqueVolumeName::shared(PluginName::LocalVolume, "pv1")
    }
    /// An ASW holding the local PV `pv1` with its device not mounted.
    fn asw() -> ActualStateOfWorld {
        let mut asw = ActualStateOfWorld::new();
        asw.add_volume(
            local(),
            PluginName::LocalVolume,
            "pv1",
            Some(local_spec()),
            None,
        );
        asw
    }
    fn mount(outer: &str, selinux: SeLinuxState) -> PodMount {
        PodMount {
            outer_name: outer.into(),
            mount_path: format!("/pods/{outer}").into(),
            kind: TargetKind::Mount,
            selinux,
        }
    }
    fn dm(device: Option<PathBuf>, path: &str, selinux: Option<SeLinuxContext>) -> DeviceMount {
        DeviceMount {
            device_path: device,
            mount_path: path.into(),
            selinux,
        }
    }
    fn device(asw: &ActualStateOfWorld) -> DeviceTarget {
        asw.volume(&local()).unwrap().device.clone().unwrap()
    }

    #[test]
    fn device_path_is_overwritten_only_by_a_non_empty_one() {
        let table: [(Option<&str>, Option<&str>, Option<&str>); 4] = [
            (None, None, None),
            (None, Some("/dev/a"), Some("/dev/a")),
            (Some("/dev/a"), None, Some("/dev/a")),
            (Some("/dev/a"), Some("/dev/b"), Some("/dev/b")),
        ];
        for (first, second, want) in table {
            let mut asw = asw();
            let path = |p: Option<&str>| p.map(PathBuf::from);
            asw.mark_device_uncertain(&local(), dm(path(first), "/g", None))
                .unwrap();
            asw.mark_device_mounted(&local(), dm(path(second), "/g", None))
                .unwrap();
            assert_eq!(
                device(&asw).device_path,
                path(want),
                "{first:?} then {second:?}"
            );
            // add_volume on an existing volume follows the same rule.
            asw.add_volume(local(), PluginName::LocalVolume, "pv1", None, None);
            assert_eq!(device(&asw).device_path, path(want), "add_volume(None)");
        }
    }

    #[test]
    fn device_context_is_set_only_when_given_and_kept_on_unmount() {
        let mut asw = asw();
        let v = local();
        asw.mark_device_mounted(&v, dm(None, "/g", None)).unwrap();
        assert_eq!(asw.volume(&v).unwrap().selinux, SeLinuxState::Unknown);
        asw.mark_device_uncertain(&v, dm(None, "/g", Some(ctx("u:r:t:s0:c1"))))
            .unwrap();
        asw.mark_device_mounted(&v, dm(None, "/g", None)).unwrap();
        let want = SeLinuxState::Context(ctx("u:r:t:s0:c1"));
        assert_eq!(asw.volume(&v).unwrap().selinux, want, "no label: kept");
        asw.mark_device_unmounted(&v).unwrap();
        let vol = asw.volume(&v).unwrap();
        assert_eq!(vol.selinux, want, "unmount does not clear the context");
        let d = vol.device.as_ref().unwrap();
        assert_eq!(d.state, MountState::NotMounted);
        assert_eq!(d.mount_path, Some("/g".into()), "unmount keeps the path");
    }

    #[test]
    fn pod_record_is_replaced_only_when_absent_or_uncertain() {
        // (existing state, new state, outer name and state afterwards)
        let table = [
            (None, MountState::Mounted, ("new", MountState::Mounted)),
            (
                Some(MountState::Uncertain),
                MountState::Mounted,
                ("new", MountState::Mounted),
            ),
            (
                Some(MountState::Uncertain),
                MountState::Uncertain,
                ("new", MountState::Uncertain),
            ),
            (
                Some(MountState::Mounted),
                MountState::Uncertain,
                ("old", MountState::Uncertain),
            ),
            (
                Some(MountState::Mounted),
                MountState::Mounted,
                ("old", MountState::Mounted),
            ),
        ];
        let (v, p) = (local(), uid("p1"));
        for (existing, new, (want_name, want_state)) in table {
            let mut asw = asw();
            let old = mount("old", SeLinuxState::WithoutContext);
            match existing {
                Some(MountState::Mounted) => asw.mark_volume_mounted(&v, &p, old).unwrap(),
                Some(_) => asw.mark_volume_uncertain(&v, &p, old).unwrap(),
                None => {}
            }
            let fresh = mount("new", SeLinuxState::WithoutContext);
            match new {
                MountState::Mounted => asw.mark_volume_mounted(&v, &p, fresh).unwrap(),
                _ => asw.mark_volume_uncertain(&v, &p, fresh).unwrap(),
            }
            let rec = asw.pod(&v, &p).unwrap();
            assert_eq!(
                (rec.mount.outer_name.as_str(), rec.state),
                (want_name, want_state),
                "{existing:?} then {new:?}"
            );
        }
    }

    #[test]
    fn volume_context_is_set_by_a_pod_mount_only_while_unknown() {
        let mut asw = asw();
        let v = local();
        let without = mount("a", SeLinuxState::WithoutContext);
        asw.mark_volume_uncertain(&v, &uid("p1"), without).unwrap();
        assert_eq!(
            asw.volume(&v).unwrap().selinux,
            SeLinuxState::WithoutContext
        );
        let labelled = mount("b", SeLinuxState::Context(ctx("u:r:t:s0")));
        asw.mark_volume_mounted(&v, &uid("p2"), labelled).unwrap();
        assert_eq!(
            asw.volume(&v).unwrap().selinux,
            SeLinuxState::WithoutContext,
            "\"\" is known: a second pod does not change it"
        );
    }

    #[test]
    fn delete_volume_is_refused_while_pods_remain() {
        let mut asw = asw();
        let (v, p) = (local(), uid("p1"));
        let m = mount("a", SeLinuxState::Unknown);
        asw.mark_volume_mounted(&v, &p, m).unwrap();
        let err = asw.delete_volume(&v).unwrap_err();
        assert_eq!(
            err,
            StateError::DeleteVolume {
                volume: v.clone(),
                pods: vec![p.clone()]
            }
        );
        assert_eq!(err.kind(), StateErrorKind::Busy);
        assert!(asw.volume_exists(&v));
        asw.delete_pod_from_volume(&v, &p).unwrap();
        asw.delete_volume(&v).unwrap();
        assert!(!asw.volume_exists(&v));
        assert_eq!(
            asw.delete_volume(&v),
            Ok(()),
            "absent volume: nothing to do"
        );
    }

    #[test]
    fn marks_on_an_absent_volume_are_typed_errors() {
        let mut asw = ActualStateOfWorld::new();
        let (v, p) = (local(), uid("p1"));
        let m = || mount("a", SeLinuxState::Unknown);
        let results = [
            asw.mark_device_mounted(&v, dm(None, "/g", None)),
            asw.mark_device_unmounted(&v),
            asw.mark_volume_mounted(&v, &p, m()),
            asw.mark_volume_uncertain(&v, &p, m()),
            asw.delete_pod_from_volume(&v, &p),
        ];
        for r in results {
            assert_eq!(r.map_err(|e| e.kind()), Err(StateErrorKind::NotFound));
        }
        let msg = asw
            .mark_volume_mounted(&v, &p, m())
            .unwrap_err()
            .to_string();
        assert_eq!(
            msg,
            "mark volume kubernetes.io/local-volume/pv1 mounted for pod p1: \
             volume is not in the actual state of world"
        );
        assert!(!asw.mark_volume_uncertain_via_reconstruction(&v, &p, m()));
    }

    #[test]
    fn pod_exists_in_volume_checks_in_the_kubelet_order() {
        let (v, p) = (local(), uid("p1"));
        let l1 = ctx("u:r:t:s0:c1");
        let l2 = ctx("u:r:t:s0:c2");
        let mismatch = Err(StateError::SeLinuxMismatch {
            volume: v.clone(),
            pod: p.clone(),
        });
        let present = |mounted| {
            Ok(PodPresence {
                mounted,
                device_path: Some("/dev/loop0".into()),
            })
        };
        // (volume context, pod state, desired label, expected)
        let table = [
            (
                SeLinuxState::Context(l1.clone()),
                None,
                Some(&l2),
                mismatch.clone(),
            ),
            (
                SeLinuxState::WithoutContext,
                None,
                Some(&l1),
                mismatch.clone(),
            ),
            (
                SeLinuxState::Context(l1.clone()),
                None,
                None,
                mismatch.clone(),
            ),
            // the mismatch comes before the uncertain check
            (
                SeLinuxState::Context(l1.clone()),
                Some(MountState::Uncertain),
                Some(&l2),
                mismatch,
            ),
            (
                SeLinuxState::Unknown,
                Some(MountState::Uncertain),
                Some(&l2),
                present(false),
            ),
            (
                SeLinuxState::Unknown,
                Some(MountState::Mounted),
                Some(&l2),
                present(true),
            ),
            (
                SeLinuxState::Context(l1.clone()),
                Some(MountState::Mounted),
                Some(&l1),
                present(true),
            ),
            (
                SeLinuxState::WithoutContext,
                Some(MountState::Mounted),
                None,
                present(true),
            ),
            (SeLinuxState::WithoutContext, None, None, present(false)),
        ];
        for (volume_ctx, pod_state, desired, want) in table {
            let mut asw = asw();
            asw.mark_device_mounted(&v, dm(Some("/dev/loop0".into()), "/g", None))
                .unwrap();
            asw.volumes.get_mut(&v).unwrap().selinux = volume_ctx.clone();
            let m = mount("a", SeLinuxState::Unknown);
            match pod_state {
                Some(MountState::Mounted) => asw.mark_volume_mounted(&v, &p, m).unwrap(),
                Some(_) => asw.mark_volume_uncertain(&v, &p, m).unwrap(),
                None => {}
            }
            let got = asw.pod_exists_in_volume(&v, &p, desired);
            assert_eq!(got, want, "{volume_ctx:?} {pod_state:?} {desired:?}");
        }
        let absent = ActualStateOfWorld::new().pod_exists_in_volume(&v, &p, None);
        assert_eq!(
            absent,
            Err(StateError::VolumeNotAttached {
                volume: v.clone(),
                pod: p.clone()
            }),
            "volume absent comes first"
        );
        let err = StateError::SeLinuxMismatch { volume: v, pod: p };
        assert_eq!(
            err.to_string(),
            "waiting for unmount of volume \"kubernetes.io/local-volume/pv1\", because it is \
             already mounted to a different pod with a different SELinux label"
        );
    }

    #[test]
    fn listing_functions_filter_by_state() {
        let mut asw = asw();
        let (v, idle) = (
            local(),
            UniqueVolumeName::shared(PluginName::LocalVolume, "idle"),
        );
        asw.add_volume(
            idle.clone(),
            PluginName::LocalVolume,
            "idle",
            Some(local_spec()),
            None,
        );
        asw.mark_device_uncertain(&idle, dm(None, "/gi", None))
            .unwrap();
        asw.mark_device_mounted(&v, dm(None, "/g", None)).unwrap();
        let m = || mount("a", SeLinuxState::Unknown);
        asw.mark_volume_mounted(&v, &uid("mounted"), m()).unwrap();
        asw.mark_volume_uncertain(&v, &uid("uncertain"), m())
            .unwrap();
        let pairs = |l: Vec<MountedVolume>| -> Vec<String> {
            l.iter().map(|m| m.pod.to_string()).collect()
        };
        let names = |l: Vec<(UniqueVolumeName, ActualVolume)>| -> Vec<String> {
            l.into_iter().map(|(n, _)| n.to_string()).collect()
        };
        assert_eq!(pairs(asw.get_mounted_volumes()), ["mounted"]);
        assert_eq!(
            pairs(asw.get_possibly_mounted_volumes()),
            ["mounted", "uncertain"]
        );
        assert_eq!(
            pairs(asw.get_mounted_volumes_for_pod(&uid("uncertain"))),
            [""; 0]
        );
        assert_eq!(
            pairs(asw.get_possibly_mounted_volumes_for_pod(&uid("uncertain"))),
            ["uncertain"]
        );
        assert_eq!(
            names(asw.get_unmounted_volumes()),
            [idle.as_str()],
            "any device state"
        );
        assert_eq!(
            names(asw.get_globally_mounted_volumes()),
            [v.as_str()],
            "not uncertain"
        );
        assert!(asw.pod_has_mounted_volumes(&uid("mounted")));
        assert!(!asw.pod_has_mounted_volumes(&uid("uncertain")));
        assert!(
            asw.is_volume_mounted_elsewhere(&v, &uid("mounted")),
            "uncertain counts"
        );
        assert!(!asw.is_volume_mounted_elsewhere(&idle, &uid("mounted")));
        assert!(!asw.pod_removed_from_volume(&v, &uid("uncertain")));
        assert!(asw.pod_removed_from_volume(&v, &uid("other")));
        assert!(asw.pod_removed_from_volume(&idle, &uid("mounted")));
    }

    #[test]
    fn reconstruction_is_tracked_until_the_pod_is_mounted_or_removed() {
        let mut asw = asw();
        let (v, p) = (local(), uid("p1"));
        let found = || mount("", SeLinuxState::Unknown);
        asw.mark_device_uncertain(&v, dm(None, "/g", None)).unwrap();
        assert!(asw.mark_volume_uncertain_via_reconstruction(&v, &p, found()));
        assert!(
            !asw.mark_volume_uncertain_via_reconstruction(&v, &p, found()),
            "already there"
        );
        assert!(asw.is_volume_reconstructed(&v, &p));
        assert!(asw.is_volume_device_reconstructed(&v));
        assert!(asw.update_reconstructed_device_path(&v, "/dev/loop7".into()));
        assert_eq!(device(&asw).device_path, Some("/dev/loop7".into()));
        // the real mount replaces the reconstructed record and ends tracking
        let real = mount("data", SeLinuxState::WithoutContext);
        asw.mark_volume_mounted(&v, &p, real).unwrap();
        assert_eq!(asw.pod(&v, &p).unwrap().mount.outer_name, "data");
        assert!(!asw.is_volume_reconstructed(&v, &p));
        assert!(!asw.is_volume_device_reconstructed(&v));
        asw.mark_device_mounted(&v, dm(None, "/g", None)).unwrap();
        assert!(
            !asw.update_reconstructed_device_path(&v, "/dev/x".into()),
            "only while uncertain"
        );
        // removal ends tracking too
        let q = uid("p2");
        assert!(asw.mark_volume_uncertain_via_reconstruction(&v, &q, found()));
        asw.delete_pod_from_volume(&v, &q).unwrap();
        assert!(!asw.is_volume_device_reconstructed(&v));
    }

    fn pod_volume(pod: &PodUid, selinux: Option<SeLinuxContext>) -> PodVolume {
        PodVolume {
            volume: local(),
            spec_name: "pv1".into(),
            outer_name: format!("data-{pod}"),
            spec: local_spec(),
            selinux,
        }
    }

    #[test]
    fn dsw_label_conflicts_refuse_a_new_pod_only_when_strict() {
        let l1 = Some(ctx("u:r:t:s0:c1"));
        let l2 = Some(ctx("u:r:t:s0:c2"));
        let conflict = SeLinuxConflict {
            spec_name: "pv1".into(),
            existing: l1.clone(),
            new: l2.clone(),
        };
        // (second pod's original label, strict, refused?, reported conflict)
        let table = [
            (l1.clone(), true, false, None),
            (l2.clone(), true, true, None),
            (l2.clone(), false, false, Some(conflict.clone())),
        ];
        for (label, strict, refused, want_conflict) in table {
            let mut dsw = DesiredStateOfWorld::new();
            let (a, b) = (uid("a"), uid("b"));
            let first = LabelCheck {
                original: l1.clone(),
                strict,
            };
            dsw.add_pod_to_volume(&a, pod_volume(&a, l1.clone()), first)
                .unwrap();
            let check = LabelCheck {
                original: label.clone(),
                strict,
            };
            let got = dsw.add_pod_to_volume(&b, pod_volume(&b, label.clone()), check);
            match got {
                Err(e) => {
                    assert!(refused, "{label:?} {strict}: {e}");
                    assert_eq!(
                        e.to_string(),
                        "add pod b to volume kubernetes.io/local-volume/pv1: conflicting SELinux \
                         labels of volume pv1: \"u:r:t:s0:c1\" and \"u:r:t:s0:c2\""
                    );
                    assert!(!dsw.pod_exists_in_volume(&b, &local()));
                }
                Ok(added) => {
                    assert!(!refused, "{label:?} {strict}");
                    assert_eq!(added.volume, local());
                    assert_eq!(added.conflict, want_conflict);
                    assert!(dsw.pod_exists_in_volume(&b, &local()));
                }
            }
            let vol = dsw.volume(&local()).unwrap();
            assert_eq!(vol.effective_selinux, l1, "fixed by the first pod");
            // re-adding a known pod is not checked
            let again = LabelCheck {
                original: l2.clone(),
                strict: true,
            };
            assert!(
                dsw.add_pod_to_volume(&a, pod_volume(&a, l2.clone()), again)
                    .is_ok()
            );
        }
    }

    #[test]
    fn dsw_queries_deletes_and_flattens_per_volume_and_pod() {
        let mut dsw = DesiredStateOfWorld::new();
        let (a, b) = (uid("a"), uid("b"));
        let l = Some(ctx("u:r:t:s0"));
        for p in [&b, &a] {
            let check = LabelCheck {
                original: l.clone(),
                strict: true,
            };
            dsw.add_pod_to_volume(p, pod_volume(p, l.clone()), check)
                .unwrap();
        }
        let ed = VolumeSpec::EmptyDir {
            medium: StorageMedium::Memory,
            size_limit: None,
        };
        let cache = PodVolume {
            volume: PodVolume::unique_name(&ed, &a, "cache"),
            spec_name: "cache".into(),
            outer_name: "cache".into(),
            spec: ed,
            selinux: None,
        };
        let cache_name = cache.volume.clone();
        dsw.add_pod_to_volume(&a, cache, LabelCheck::default())
            .unwrap();
        let flat: Vec<(String, String)> = dsw
            .volumes_to_mount()
            .into_iter()
            .map(|m| (m.volume.to_string(), m.pod.to_string()))
            .collect();
        let pair = |v: &str, p: &str| (v.to_owned(), p.to_owned());
        assert_eq!(
            flat,
            [
                pair("kubernetes.io/empty-dir/a-cache", "a"),
                pair("kubernetes.io/local-volume/pv1", "a"),
                pair("kubernetes.io/local-volume/pv1", "b"),
            ]
        );
        assert!(dsw.volume_exists_with_label(&local(), l.as_ref()));
        assert!(
            !dsw.volume_exists_with_label(&local(), None),
            "other label: not desired"
        );
        assert!(dsw.pod_exists_in_volume_with_label(&a, &local(), l.as_ref()));
        assert!(!dsw.pod_exists_in_volume_with_label(&a, &cache_name, l.as_ref()));
        assert_eq!(dsw.delete_pod(&a), [cache_name.clone(), local()]);
        assert!(
            !dsw.volume_exists(&cache_name),
            "last pod gone: volume gone"
        );
        assert!(dsw.volume_exists(&local()));
        dsw.delete_pod_from_volume(&b, &local());
        assert!(!dsw.volume_exists(&local()));
        assert!(dsw.volumes_to_mount().is_empty());
    }

    #[test]
    fn dsw_pod_errors_are_capped_like_the_kubelet_and_popped_once() {
        let mut dsw = DesiredStateOfWorld::new();
        let p = uid("p1");
        for i in 0..20 {
            dsw.add_pod_error(&p, format!("error {i:02}"));
        }
        dsw.add_pod_error(&uid("p2"), "other");
        let errors = dsw.pop_pod_errors(&p);
        assert_eq!(
            errors.len(),
            MAX_POD_ERRORS + 1,
            "added while at most 10 held"
        );
        assert_eq!(errors.first().map(String::as_str), Some("error 00"));
        assert!(dsw.pop_pod_errors(&p).is_empty(), "popping clears");
        dsw.add_pod_error(&p, "same");
        dsw.add_pod_error(&p, "same");
        assert_eq!(dsw.pop_pod_errors(&p), ["same"], "a set");
        assert_eq!(dsw.pop_pod_errors(&uid("p2")), ["other"]);
    }

    #[test]
    fn dsw_is_populated_only_once_sources_are_ready() {
        let mut dsw = DesiredStateOfWorld::new();
        assert!(!dsw.is_populated());
        dsw.mark_sources_ready();
        assert!(dsw.is_populated());
    }

    #[test]
    fn snapshot_has_the_dump_json_shape() {
        let mut asw = asw();
        let v = local();
        let ed = UniqueVolumeName::per_pod(PluginName::EmptyDir, &uid("p1"), "cache");
        let spec = VolumeSpec::EmptyDir {
            medium: StorageMedium::Disk,
            size_limit: None,
        };
        asw.add_volume(ed.clone(), PluginName::EmptyDir, "cache", Some(spec), None);
        asw.mark_device_mounted(&v, dm(Some("/dev/loop0".into()), "/g", None))
            .unwrap();
        let pm = |path: &str, kind, selinux| PodMount {
            outer_name: "x".into(),
            mount_path: path.into(),
            kind,
            selinux,
        };
        let labelled = SeLinuxState::Context(ctx("u:r:t:s0:c2,c1"));
        asw.mark_volume_mounted(&v, &uid("p2"), pm("/p2", TargetKind::Mount, labelled))
            .unwrap();
        let found = pm("/p1", TargetKind::Mount, SeLinuxState::Unknown);
        asw.mark_volume_uncertain_via_reconstruction(&v, &uid("p1"), found);
        let dir = pm("/c", TargetKind::Dir, SeLinuxState::WithoutContext);
        asw.mark_volume_mounted(&ed, &uid("p1"), dir).unwrap();
        let snap = asw.snapshot();
        let want = json!({"volumes": [
            {"volume": "kubernetes.io/empty-dir/p1-cache", "device": null, "pods": [
                {"pod_uid": "p1", "mount_path": "/c", "kind": "dir", "state": "mounted",
                 "selinux_context": ""}]},
            {"volume": "kubernetes.io/local-volume/pv1",
             "device": {"state": "mounted", "device_path": "/dev/loop0", "mount_path": "/g",
                        "selinux_context": "u:r:t:s0:c1,c2"},
             "pods": [
                {"pod_uid": "p1", "mount_path": "/p1", "kind": "mount", "state": "uncertain",
                 "selinux_context": null},
                {"pod_uid": "p2", "mount_path": "/p2", "kind": "mount", "state": "mounted",
                 "selinux_context": "u:r:t:s0:c1,c2"}]}
        ]});
        assert_eq!(serde_json::to_value(&snap).unwrap(), want);
        let back: StateSnapshot = serde_json::from_value(want).unwrap();
        assert_eq!(back, snap, "round trip");
    }

    #[test]
    fn snapshot_selinux_context_reads_null_empty_and_labels() {
        let table = [
            (json!(null), Some(SeLinuxState::Unknown)),
            (json!(""), Some(SeLinuxState::WithoutContext)),
            (
                json!("u:r:t:s0"),
                Some(SeLinuxState::Context(ctx("u:r:t:s0"))),
            ),
            (json!("not a label"), None),
        ];
        for (input, want) in table {
            let got = serde_json::from_value::<SeLinuxState>(input.clone()).ok();
            assert_eq!(got, want, "{input}");
        }
        let no_field = json!({"state": "not_mounted", "device_path": null, "mount_path": null});
        let d: DeviceSnapshot = serde_json::from_value(no_field).unwrap();
        assert_eq!(
            d.selinux_context,
            SeLinuxState::Unknown,
            "missing reads as unknown"
        );
    }
}
