//! The actual state of world (ASW): what volumed believes is mounted on the
//! node, per volume a device target and one target per pod. See the `state`
//! module doc for the rules.

use std::collections::{BTreeMap, BTreeSet, btree_map};
use std::path::PathBuf;
use std::sync::Arc;

use super::{PodMap, SeLinuxState, StateError};
use crate::model::{
    MountState, PluginName, PodUid, SeLinuxContext, SharedPath, SharedStr, TargetKind,
    UniqueVolumeName, VolumeSpec,
};

/// A volume's device (global) target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceTarget {
    /// mounted, uncertain or not mounted
    pub state: MountState,
    /// the device (e.g. `/dev/loop0`), once known
    pub device_path: Option<PathBuf>,
    /// where the device is mounted, once known
    pub mount_path: Option<PathBuf>,
    /// the size a node expansion grew the volume to (or found it could
    /// not), so a mounted volume is not expanded again for it; none since
    /// it was mounted (or rebuilt after a restart)
    pub expanded_to: Option<u64>,
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
    pub outer_name: SharedStr,
    /// the pod target path (shared with the job's and the journal's
    /// parameters: a clone is a count)
    pub mount_path: SharedPath,
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
    pub spec_name: SharedStr,
    /// the spec, shared with the DSW; `None` when rebuilt from the host alone
    pub spec: Option<Arc<VolumeSpec>>,
    /// the device target; `None` when the volume has none (or none is known
    /// yet). Boxed: most volumes (emptyDir, hostPath, a local PV dir) have
    /// none, and inline it made every volume record 48 bytes larger.
    pub device: Option<Box<DeviceTarget>>,
    /// the volume-level context (the kubelet's `seLinuxMountContext`), as
    /// a flag and the context: read it with [`ActualVolume::selinux`]. A
    /// `SeLinuxState` field (16 bytes) made the record 104 bytes, a malloc
    /// class (112) above the 96 it takes now.
    selinux_known: bool,
    selinux_context: Option<SeLinuxContext>,
    /// the pod targets
    pub pods: PodMap<MountedPod>,
}

impl ActualVolume {
    /// The volume-level context (the kubelet's `seLinuxMountContext`).
    pub fn selinux(&self) -> SeLinuxState {
        match (&self.selinux_context, self.selinux_known) {
            (Some(c), _) => SeLinuxState::Context(c.clone()),
            (None, true) => SeLinuxState::WithoutContext,
            (None, false) => SeLinuxState::Unknown,
        }
    }

    /// `self.selinux().conflicts_with(desired)`, without making the state
    /// (a pass asks it of every mounted target).
    pub fn selinux_conflicts_with(&self, desired: Option<&SeLinuxContext>) -> bool {
        self.selinux_known && self.selinux_context.as_ref() != desired
    }

    fn set_selinux(&mut self, s: SeLinuxState) {
        self.selinux_known = s.is_known();
        self.selinux_context = s.context().cloned();
    }
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
    pub spec_name: SharedStr,
    /// the spec, when known
    pub spec: Option<Arc<VolumeSpec>>,
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
    /// Boxed: a volume record is a few hundred bytes and B-tree nodes keep
    /// spare slots; the box costs less per volume.
    volumes: BTreeMap<UniqueVolumeName, Box<ActualVolume>>,
    /// (volume, pod) pairs rebuilt at startup and not yet confirmed mounted.
    reconstructed: Reconstructed,
    /// The (pod, volume) pairs that have a pod record, by pod: a pod's
    /// targets are found without a walk of the node (the runtime API's
    /// questions about one pod). A pair is here exactly when the volume's
    /// pod map holds the pod.
    by_pod: BTreeSet<(PodUid, UniqueVolumeName)>,
}

impl ActualStateOfWorld {
    /// An empty ASW.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many volumes it holds.
    pub fn volume_count(&self) -> usize {
        self.volumes.len()
    }

    /// Repacks its maps (see `util::repack`); nothing else changes.
    pub fn repack(&mut self) {
        crate::util::repack::repack(&mut self.volumes);
        crate::util::repack::repack(&mut self.by_pod);
    }

    /// Adds a volume with its device target not mounted (when the spec says
    /// it has one). On an existing volume, only sets a non-empty device path
    /// and a spec that was unknown — or a payload volume's, which says what
    /// payload was last written (the periodic re-run compares it).
    pub fn add_volume(
        &mut self,
        volume: UniqueVolumeName,
        plugin: PluginName,
        spec_name: impl Into<SharedStr>,
        spec: Option<Arc<VolumeSpec>>,
        device_path: Option<PathBuf>,
    ) {
        self.add_volume_mut(volume, plugin, spec_name, spec, device_path);
    }

    /// [`ActualStateOfWorld::add_volume`], and the volume's record for more
    /// changes without searching for it again ([`VolumeMut`]).
    pub fn add_volume_mut(
        &mut self,
        volume: UniqueVolumeName,
        plugin: PluginName,
        spec_name: impl Into<SharedStr>,
        spec: Option<Arc<VolumeSpec>>,
        device_path: Option<PathBuf>,
    ) -> VolumeMut<'_> {
        let has_device = |s: &Option<Arc<VolumeSpec>>| {
            s.as_deref()
                .and_then(VolumeSpec::device_target_kind)
                .is_some()
        };
        let name = volume.clone();
        let record = match self.volumes.entry(volume) {
            btree_map::Entry::Occupied(o) => {
                let v = o.into_mut();
                let payload = matches!(spec.as_deref(), Some(VolumeSpec::Payload(_)));
                if (v.spec.is_none() || payload) && spec.is_some() {
                    if v.device.is_none() && has_device(&spec) {
                        v.device = Some(not_mounted_device());
                    }
                    v.spec = spec;
                }
                if let (Some(path), Some(d)) = (device_path, v.device.as_mut()) {
                    d.device_path = Some(path);
                }
                v
            }
            btree_map::Entry::Vacant(slot) => {
                let device = (has_device(&spec) || device_path.is_some()).then(|| {
                    let mut d = not_mounted_device();
                    d.device_path = device_path;
                    d
                });
                slot.insert(Box::new(ActualVolume {
                    plugin,
                    spec_name: spec_name.into(),
                    spec,
                    device,
                    selinux_known: false,
                    selinux_context: None,
                    pods: PodMap::new(),
                }))
            }
        };
        VolumeMut {
            name,
            volume: record,
            reconstructed: &mut self.reconstructed,
            by_pod: &mut self.by_pod,
        }
    }

    /// One volume's record, for several changes with one search
    /// ([`VolumeMut`]); `None` when the volume is absent.
    pub fn volume_mut(&mut self, volume: &UniqueVolumeName) -> Option<VolumeMut<'_>> {
        let record = self.volumes.get_mut(volume)?;
        Some(VolumeMut {
            name: volume.clone(),
            volume: record,
            reconstructed: &mut self.reconstructed,
            by_pod: &mut self.by_pod,
        })
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
        let mut v = self
            .volume_mut(volume)
            .ok_or_else(|| StateError::MarkDevice {
                volume: volume.clone(),
                state,
            })?;
        v.set_device_state(state, mount);
        Ok(())
    }

    /// Sets the device path of a device that is uncertain and has none (a
    /// reconstructed volume learning its device later, from the node's
    /// status); whether it did. A known path is never replaced.
    pub fn update_reconstructed_device_path(
        &mut self,
        volume: &UniqueVolumeName,
        device_path: PathBuf,
    ) -> bool {
        let device = self.volumes.get_mut(volume).and_then(|v| v.device.as_mut());
        match device {
            Some(d) if d.state == MountState::Uncertain && d.device_path.is_none() => {
                d.device_path = Some(device_path);
                true
            }
            _ => false,
        }
    }

    /// A node expansion of `volume` reached (or gave up on) `bytes`: a
    /// mounted volume is not expanded again for that size. Nothing for a
    /// volume without a device target.
    pub fn mark_expanded(&mut self, volume: &UniqueVolumeName, bytes: u64) {
        if let Some(d) = self.volumes.get_mut(volume).and_then(|v| v.device.as_mut()) {
            d.expanded_to = Some(bytes);
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
        let mut v = self
            .volume_mut(volume)
            .ok_or_else(|| StateError::MarkVolume {
                volume: volume.clone(),
                pod: pod.clone(),
                state,
            })?;
        v.add_pod(pod, mount, state);
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
        self.volume_mut(volume)
            .is_some_and(|mut v| v.mark_volume_uncertain_via_reconstruction(pod, mount))
    }

    /// Whether `pod`'s target of `volume` came from reconstruction and is still uncertain.
    #[cfg(test)]
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
    #[cfg(test)]
    pub fn is_volume_device_reconstructed(&self, volume: &UniqueVolumeName) -> bool {
        self.reconstructed.contains_key(volume)
    }

    fn forget_reconstructed(&mut self, volume: &UniqueVolumeName, pod: &PodUid) {
        forget_reconstructed(&mut self.reconstructed, volume, pod);
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
        if v.pods.remove(pod).is_some() {
            self.by_pod.remove(&(pod.clone(), volume.clone()));
        }
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
        if v.selinux_conflicts_with(desired_label) {
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
        self.volumes.get(volume).map(|v| &**v)
    }

    /// One pod target's record.
    pub fn pod(&self, volume: &UniqueVolumeName, pod: &PodUid) -> Option<&MountedPod> {
        self.volumes.get(volume).and_then(|v| v.pods.get(pod))
    }

    /// `pod`'s target records (any state) with their volumes, sorted by
    /// volume. O(the pod's targets), from the index by pod.
    pub fn targets_of_pod<'a>(
        &'a self,
        pod: &'a PodUid,
    ) -> impl Iterator<Item = (&'a UniqueVolumeName, &'a ActualVolume, &'a MountedPod)> + 'a {
        self.by_pod
            .range((pod.clone(), UniqueVolumeName::from_raw(""))..)
            .take_while(move |(p, _)| p == pod)
            .filter_map(|(_, name)| {
                let v = self.volumes.get(name)?;
                Some((name, &**v, v.pods.get(pod)?))
            })
    }

    /// Every volume, sorted by name.
    pub fn volumes(&self) -> impl Iterator<Item = (&UniqueVolumeName, &ActualVolume)> {
        self.volumes.iter().map(|(n, v)| (n, &**v))
    }

    /// Pod targets whose state passes `keep`, optionally of one pod only.
    #[cfg(test)]
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
                    selinux: v.selinux(),
                });
            }
        }
        out
    }

    /// Pod targets that are mounted (not uncertain).
    #[cfg(test)]
    pub fn get_mounted_volumes(&self) -> Vec<MountedVolume> {
        self.pod_targets(None, |s| s == MountState::Mounted)
    }

    /// Per plugin, how many pod targets are mounted (what
    /// `Self::get_mounted_volumes` lists), without copying them.
    pub fn mounted_counts(&self) -> BTreeMap<PluginName, usize> {
        let mut out = BTreeMap::new();
        for v in self.volumes.values() {
            let n = v
                .pods
                .values()
                .filter(|p| p.state == MountState::Mounted)
                .count();
            if n > 0 {
                *out.entry(v.plugin).or_default() += n;
            }
        }
        out
    }

    /// `pod`'s targets that are mounted (not uncertain).
    #[cfg(test)]
    pub fn get_mounted_volumes_for_pod(&self, pod: &PodUid) -> Vec<MountedVolume> {
        self.pod_targets(Some(pod), |s| s == MountState::Mounted)
    }

    /// Pod targets that are mounted or uncertain.
    #[cfg(test)]
    pub fn get_possibly_mounted_volumes(&self) -> Vec<MountedVolume> {
        self.pod_targets(None, |s| s != MountState::NotMounted)
    }

    /// The pod targets `Self::get_possibly_mounted_volumes` lists, borrowed:
    /// (volume, pod, the volume's record).
    pub fn possibly_mounted_iter(
        &self,
    ) -> impl Iterator<Item = (&UniqueVolumeName, &PodUid, &ActualVolume)> {
        self.volumes.iter().flat_map(|(name, v)| {
            v.pods
                .iter()
                .filter(|(_, p)| p.state != MountState::NotMounted)
                .map(move |(uid, _)| (name, uid, &**v))
        })
    }

    /// `pod`'s targets that are mounted or uncertain.
    #[cfg(test)]
    pub fn get_possibly_mounted_volumes_for_pod(&self, pod: &PodUid) -> Vec<MountedVolume> {
        self.pod_targets(Some(pod), |s| s != MountState::NotMounted)
    }

    /// Whether `pod` has a mounted (not uncertain) target.
    #[cfg(test)]
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
    #[cfg(test)]
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
            .map(|(n, v)| (n.clone(), (**v).clone()))
            .collect()
    }

    /// Whether a pod other than `pod` may have `volume` mounted (uncertain counts).
    #[cfg(test)]
    pub fn is_volume_mounted_elsewhere(&self, volume: &UniqueVolumeName, pod: &PodUid) -> bool {
        self.volumes.get(volume).is_some_and(|v| {
            v.pods
                .iter()
                .any(|(uid, p)| uid != pod && p.state != MountState::NotMounted)
        })
    }

    /// Whether `pod`'s target of `volume` is gone: false while mounted or uncertain.
    #[cfg(test)]
    pub fn pod_removed_from_volume(&self, volume: &UniqueVolumeName, pod: &PodUid) -> bool {
        self.pod(volume, pod)
            .is_none_or(|p| p.state == MountState::NotMounted)
    }
}

/// Pairs rebuilt at startup and not yet confirmed mounted, per volume.
type Reconstructed = BTreeMap<UniqueVolumeName, BTreeSet<PodUid>>;

fn forget_reconstructed(
    reconstructed: &mut Reconstructed,
    volume: &UniqueVolumeName,
    pod: &PodUid,
) {
    if let Some(set) = reconstructed.get_mut(volume) {
        set.remove(pod);
        if set.is_empty() {
            reconstructed.remove(volume);
        }
    }
}

/// One volume's record in the ASW, found once
/// ([`ActualStateOfWorld::add_volume_mut`], [`ActualStateOfWorld::volume_mut`])
/// for several changes: reconstruction applies a volume's decisions
/// together, as they come (in key order), with one search of the volumes
/// instead of one per target. Each change means what the ASW method of the
/// same name means for this volume.
pub struct VolumeMut<'a> {
    name: UniqueVolumeName,
    volume: &'a mut ActualVolume,
    reconstructed: &'a mut Reconstructed,
    by_pod: &'a mut BTreeSet<(PodUid, UniqueVolumeName)>,
}

impl VolumeMut<'_> {
    /// Sets a device path, as [`ActualStateOfWorld::add_volume`] does on an
    /// existing volume without a spec: only when it has a device target.
    pub fn set_device_path(&mut self, device_path: PathBuf) {
        if let Some(d) = self.volume.device.as_mut() {
            d.device_path = Some(device_path);
        }
    }

    /// Room for `pods` more pod records (a volume shared by thousands of
    /// pods grows once, not by doubling).
    pub fn reserve_pods(&mut self, pods: usize) {
        self.volume.pods.reserve_exact(pods);
    }

    /// [`ActualStateOfWorld::mark_device_mounted`].
    pub fn mark_device_mounted(&mut self, mount: DeviceMount) {
        self.set_device_state(MountState::Mounted, Some(mount));
    }

    /// [`ActualStateOfWorld::mark_device_uncertain`].
    pub fn mark_device_uncertain(&mut self, mount: DeviceMount) {
        self.set_device_state(MountState::Uncertain, Some(mount));
    }

    /// [`ActualStateOfWorld::mark_device_unmounted`].
    pub fn mark_device_unmounted(&mut self) {
        self.set_device_state(MountState::NotMounted, None);
    }

    /// Sets the state; the device path and the context only when given.
    fn set_device_state(&mut self, state: MountState, mount: Option<DeviceMount>) {
        let v = &mut *self.volume;
        let d = v.device.get_or_insert_with(not_mounted_device);
        d.state = state;
        if let Some(m) = mount {
            d.device_path = m.device_path.or(d.device_path.take());
            d.mount_path = Some(m.mount_path);
            if let Some(c) = m.selinux {
                v.set_selinux(SeLinuxState::Context(c));
            }
        }
    }

    /// [`ActualStateOfWorld::mark_volume_mounted`].
    pub fn mark_volume_mounted(&mut self, pod: &PodUid, mount: PodMount) {
        self.add_pod(pod, mount, MountState::Mounted);
    }

    /// See [`ActualStateOfWorld::add_pod`].
    fn add_pod(&mut self, pod: &PodUid, mount: PodMount, state: MountState) {
        let v = &mut *self.volume;
        if !v.selinux_known {
            v.set_selinux(mount.selinux.clone());
        }
        match v.pods.get_mut(pod) {
            Some(p) if p.state != MountState::Uncertain => p.state = state,
            _ => {
                if v.pods
                    .insert(pod.clone(), MountedPod { state, mount })
                    .is_none()
                {
                    self.by_pod.insert((pod.clone(), self.name.clone()));
                }
            }
        }
        if state == MountState::Mounted {
            forget_reconstructed(self.reconstructed, &self.name, pod);
        }
    }

    /// [`ActualStateOfWorld::mark_volume_uncertain_via_reconstruction`].
    pub fn mark_volume_uncertain_via_reconstruction(
        &mut self,
        pod: &PodUid,
        mount: PodMount,
    ) -> bool {
        let v = &mut *self.volume;
        if v.pods.contains_key(pod) {
            return false;
        }
        let state = MountState::Uncertain;
        v.pods.insert(pod.clone(), MountedPod { state, mount });
        self.by_pod.insert((pod.clone(), self.name.clone()));
        self.reconstructed
            .entry(self.name.clone())
            .or_default()
            .insert(pod.clone());
        true
    }
}

fn not_mounted_device() -> Box<DeviceTarget> {
    Box::new(DeviceTarget {
        state: MountState::NotMounted,
        device_path: None,
        mount_path: None,
        expanded_to: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StateErrorKind;
    use crate::state::test_support::{asw, ctx, dm, local, local_spec, uid};

    fn mount(outer: &str, selinux: SeLinuxState) -> PodMount {
        PodMount {
            outer_name: outer.into(),
            mount_path: format!("/pods/{outer}").into(),
            kind: TargetKind::Mount,
            selinux,
        }
    }
    fn device(asw: &ActualStateOfWorld) -> DeviceTarget {
        *asw.volume(&local()).unwrap().device.clone().unwrap()
    }

    /// A volume's context reads back as set, each of its three states;
    /// kept as a flag and a context, the record stays within 96 bytes.
    #[test]
    fn a_volume_keeps_its_context_in_96_bytes() {
        let mut asw = ActualStateOfWorld::new();
        let v = UniqueVolumeName::from_raw("kubernetes.io/empty-dir/p-cache");
        let label = ctx("u:r:t:s0:c1,c2");
        asw.add_volume_mut(v.clone(), PluginName::EmptyDir, "cache", None, None);
        let vol = asw.volumes.get_mut(&v).unwrap();
        assert_eq!(vol.selinux(), SeLinuxState::Unknown);
        for s in [
            SeLinuxState::WithoutContext,
            SeLinuxState::Context(label),
            SeLinuxState::Unknown,
        ] {
            vol.set_selinux(s.clone());
            assert_eq!(vol.selinux(), s);
            let other = ctx("u:r:t:s0:c3");
            for desired in [None, s.context(), Some(&other)] {
                let want = s.conflicts_with(desired);
                assert_eq!(
                    vol.selinux_conflicts_with(desired),
                    want,
                    "{s:?} {desired:?}"
                );
            }
        }
        assert!(std::mem::size_of::<ActualVolume>() <= 96);
    }

    #[test]
    fn targets_of_pod_are_found_by_pod_whatever_way_they_came_and_went() {
        let mut asw = asw();
        let other = UniqueVolumeName::from_raw("kubernetes.io/empty-dir/u2-cache");
        asw.add_volume(other.clone(), PluginName::EmptyDir, "cache", None, None);
        let (u1, u2) = (uid("u1"), uid("u2"));
        let unknown = SeLinuxState::Unknown;
        asw.mark_volume_mounted(&local(), &u1, mount("data", unknown.clone()))
            .unwrap();
        asw.mark_volume_uncertain_via_reconstruction(&other, &u2, mount("", unknown.clone()));
        asw.mark_volume_mounted(&local(), &u2, mount("data", unknown.clone()))
            .unwrap();
        let of = |asw: &ActualStateOfWorld, p: &PodUid| -> Vec<(String, MountState)> {
            asw.targets_of_pod(p)
                .map(|(n, _, t)| (n.as_str().to_owned(), t.state))
                .collect()
        };
        assert_eq!(
            of(&asw, &u2),
            [
                (other.as_str().to_owned(), MountState::Uncertain),
                (local().as_str().to_owned(), MountState::Mounted),
            ]
        );
        assert_eq!(of(&asw, &u1).len(), 1);
        asw.delete_pod_from_volume(&local(), &u2).unwrap();
        asw.delete_pod_from_volume(&other, &u2).unwrap();
        assert_eq!(of(&asw, &u2), []);
        assert_eq!(of(&asw, &uid("u0")), [], "a pod before the others");
        assert_eq!(of(&asw, &u1).len(), 1, "another pod's stay");
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
        assert_eq!(asw.volume(&v).unwrap().selinux(), SeLinuxState::Unknown);
        asw.mark_device_uncertain(&v, dm(None, "/g", Some(ctx("u:r:t:s0:c1"))))
            .unwrap();
        asw.mark_device_mounted(&v, dm(None, "/g", None)).unwrap();
        let want = SeLinuxState::Context(ctx("u:r:t:s0:c1"));
        assert_eq!(asw.volume(&v).unwrap().selinux(), want, "no label: kept");
        asw.mark_device_unmounted(&v).unwrap();
        let vol = asw.volume(&v).unwrap();
        assert_eq!(vol.selinux(), want, "unmount does not clear the context");
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
            asw.volume(&v).unwrap().selinux(),
            SeLinuxState::WithoutContext
        );
        let labelled = mount("b", SeLinuxState::Context(ctx("u:r:t:s0")));
        asw.mark_volume_mounted(&v, &uid("p2"), labelled).unwrap();
        assert_eq!(
            asw.volume(&v).unwrap().selinux(),
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
            asw.volumes
                .get_mut(&v)
                .unwrap()
                .set_selinux(volume_ctx.clone());
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
            Some(local_spec().into()),
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
        assert!(
            !asw.update_reconstructed_device_path(&v, "/dev/loop8".into()),
            "a known path is kept"
        );
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
}
