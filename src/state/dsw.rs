//! The desired state of world (DSW): which pods want which volumes, and
//! with which SELinux labels. See the `state` module doc for the rules.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::{PodMap, SeLinuxConflict, StateError};
use crate::model::{
    ContainerSpec, PluginName, PodUid, PodVolume, SeLinuxContext, SharedStr, UniqueVolumeName,
    VolumeSpec,
};

/// How many recent outer names [`DesiredStateOfWorld`] keeps to share.
const RECENT_NAMES: usize = 8;

/// The kubelet's `maxPodErrors`: a pod's error set grows only while it holds
/// at most this many entries, so at most one more accumulates.
pub const MAX_POD_ERRORS: usize = 10;

/// How a new pod's SELinux label is checked against the volume's. The
/// `selinux` module computes it (the kubelet's `AddPodToVolume` rules);
/// this cache only compares.
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
    /// `pod.spec.volumes[x].name` (shared with the ASW)
    pub outer_name: SharedStr,
    /// the spec name (pod volume name, or PV name), shared with the jobs,
    /// the ASW and the journal's state
    pub spec_name: SharedStr,
    /// the label this pod would mount with
    pub selinux: Option<SeLinuxContext>,
    /// for a CSI volume, what this pod adds to its publish call
    pub csi_pod: Option<Arc<crate::model::CsiPodInfo>>,
    /// the pod mounts it read-only ([`PodVolume::read_only`])
    pub read_only: bool,
    /// the group the node gives the volume's files for this pod, if any
    pub fs_group: Option<crate::model::FsGroup>,
    /// the PV's group the pod's containers get as a supplemental group
    pub supplemental_gid: Option<u32>,
}

/// A volume some pods want mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredVolume {
    /// the plugin
    pub plugin: PluginName,
    /// the spec, as the last pod added it (shared with the ASW and the
    /// jobs: a clone is a count)
    pub spec: Arc<VolumeSpec>,
    /// the label used for `-o context`, fixed by the first pod
    pub effective_selinux: Option<SeLinuxContext>,
    /// the label compared for conflicts, fixed by the first pod
    pub original_selinux: Option<SeLinuxContext>,
    /// the pods that want it
    pub pods: PodMap<DesiredPod>,
    /// whether `node.status.volumesInUse` has it (attachable volumes)
    pub in_use: InUseReport,
}

/// Where an attachable volume stands with `node.status.volumesInUse` (the
/// kubelet's `reportedInUse`): the attach/detach controller must see it in
/// use before it is mounted, or it could detach it under the mount.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum InUseReport {
    /// not in a status update yet
    #[default]
    Unreported,
    /// a mount waits for it: the publisher was asked for an update
    Requested,
    /// a status update that lists it succeeded
    Reported,
}

/// The result of [`DesiredStateOfWorld::add_pod_to_volume`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddedPod {
    /// the volume the pod was added to
    pub volume: UniqueVolumeName,
    /// a label conflict that was tolerated (not strict): a warning to report
    pub conflict: Option<SeLinuxConflict>,
}

/// One (volume, pod) pair to mount, as `DesiredStateOfWorld::volumes_to_mount` lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeToMount {
    /// the volume
    pub volume: UniqueVolumeName,
    /// the pod
    pub pod: PodUid,
    /// the plugin
    pub plugin: PluginName,
    /// the spec (shared with the DSW)
    pub spec: Arc<VolumeSpec>,
    /// the spec name
    pub spec_name: SharedStr,
    /// the pod's outer volume name
    pub outer_name: SharedStr,
    /// the volume's effective label: what to mount with
    pub selinux: Option<SeLinuxContext>,
    /// for a CSI volume, what this pod adds to its publish call
    pub csi_pod: Option<Arc<crate::model::CsiPodInfo>>,
    /// the pod mounts it read-only ([`PodVolume::read_only`])
    pub read_only: bool,
    /// the group the node gives the volume's files for this pod, if any
    pub fs_group: Option<crate::model::FsGroup>,
}

/// What the pod sources want mounted.
#[derive(Debug, Clone, Default)]
pub struct DesiredStateOfWorld {
    /// Boxed: a volume record is a few hundred bytes and B-tree nodes keep
    /// spare slots; the box costs less per volume.
    volumes: BTreeMap<UniqueVolumeName, Box<DesiredVolume>>,
    /// The same (pod, volume) pairs as `volumes`' pod maps, by pod: a pod's
    /// event finds its volumes without a walk of the node. A pair is here
    /// exactly when the volume's map holds the pod (every change to a map
    /// goes through `add_pod_to_volume` or `delete_pod_from_volume`). The
    /// keys are the shared names (a clone is a count); `None` is never
    /// stored: it sorts first, so a pod's pairs start at `(pod, None)`.
    by_pod: BTreeSet<(PodUid, Option<UniqueVolumeName>)>,
    /// per plugin, how many (volume, pod) pairs there are
    pairs: [usize; PluginName::ALL.len()],
    pod_errors: BTreeMap<PodUid, BTreeSet<String>>,
    /// every pod the sources have told of, with the names of the volumes
    /// its spec lists (`pod.spec.volumes[x].name`, shared with the
    /// records): a pod without volumes is known too, and a volume that was
    /// refused or could not be resolved is still expected (the runtime API
    /// waits for every name, as the kubelet's `WaitForAttachAndMount` waits
    /// for every volume of the pod's spec)
    pods: BTreeMap<PodUid, Box<[SharedStr]>>,
    /// the containers of the pods that have some (`runtime::mounts`
    /// answers from them): shared, so a look clones a count
    containers: BTreeMap<PodUid, Arc<[ContainerSpec]>>,
    populated: bool,
    /// attachable volumes are mounted only once reported in use (a node
    /// with an API server; a standalone node has no controller to tell)
    in_use_gate: bool,
    /// pods that exist but have a volume that cannot be resolved now: they
    /// keep every mount they have (as the kubelet: an unresolved claim
    /// never unmounts a running pod's volumes)
    unresolved: BTreeSet<PodUid>,
    /// per plugin, the spec its last new volume got: a next volume of that
    /// plugin with an equal spec shares it (emptyDirs of one medium and size
    /// are all alike), which saves a spec allocation per such volume
    last_spec: [Option<Arc<VolumeSpec>>; PluginName::ALL.len()],
    /// the containers the last pod with some got: a next pod whose
    /// containers are equal shares them. Pods of one template (a
    /// Deployment's, a DaemonSet's) list the same containers, so a node's
    /// pods hold one copy each template, not one each pod
    last_containers: Option<Arc<[ContainerSpec]>>,
    /// the few outer names (`pod.spec.volumes[x].name`) records got most
    /// recently, most recent first: a record whose name equals one shares
    /// it. Pods written from one template name their volumes alike
    /// (`cache`, `data`), so this saves a string allocation per volume; a
    /// new name pushes out the least recently used, so it never holds more
    /// than a handful
    recent_names: [Option<SharedStr>; RECENT_NAMES],
}

impl DesiredStateOfWorld {
    /// An empty DSW, not yet populated.
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
        crate::util::repack::repack(&mut self.pods);
        crate::util::repack::repack(&mut self.containers);
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
        let outer_name = self.shared_name(volume.outer_name);
        // an inline volume's spec name is its outer name: one string for both
        let spec_name = if volume.spec_name == *outer_name {
            outer_name.clone()
        } else {
            volume.spec_name.into()
        };
        let record = DesiredPod {
            outer_name,
            spec_name,
            selinux: volume.selinux.clone(),
            csi_pod: volume.csi_pod.clone(),
            read_only: volume.read_only,
            fs_group: volume.fs_group,
            supplemental_gid: volume.supplemental_gid,
        };
        let last_spec = &mut self.last_spec[volume.spec.plugin() as usize];
        let entry = self.volumes.entry(name.clone()).or_insert_with(|| {
            let spec = match last_spec {
                Some(s) if **s == *volume.spec => s.clone(),
                _ => last_spec.insert(volume.spec.clone()).clone(),
            };
            Box::new(DesiredVolume {
                plugin: volume.spec.plugin(),
                spec,
                effective_selinux: volume.selinux,
                original_selinux: check.original.clone(),
                pods: PodMap::new(),
                in_use: InUseReport::Unreported,
            })
        });
        let mut conflict = None;
        let new_pod = !entry.pods.is_empty() && !entry.pods.contains_key(pod);
        if new_pod && entry.original_selinux != check.original {
            let c = SeLinuxConflict {
                spec_name: record.spec_name.to_string(),
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
        // a new `Arc` only for a changed spec: the ASW shares the old one
        if *entry.spec != *volume.spec {
            entry.spec = volume.spec;
        }
        if entry.pods.insert(pod.clone(), record).is_none() {
            self.by_pod.insert((pod.clone(), Some(name.clone())));
            self.pairs[entry.plugin as usize] += 1;
        }
        Ok(AddedPod {
            volume: name,
            conflict,
        })
    }

    /// `name` as a [`SharedStr`]: a recent equal one when there is one.
    fn shared_name(&mut self, name: String) -> SharedStr {
        let recent = &mut self.recent_names;
        let at = recent
            .iter()
            .position(|n| n.as_ref().is_some_and(|n| *n == name));
        let shared = at
            .and_then(|i| recent[i].clone())
            .unwrap_or_else(|| SharedStr::from(name));
        // to the front, the ones before it one down; a new one pushes the
        // least recently used (the last) out
        recent[..=at.unwrap_or(RECENT_NAMES - 1)].rotate_right(1);
        recent[0] = Some(shared.clone());
        shared
    }

    /// Removes `pod` from `volume`, and the volume once no pod wants it.
    /// Clears the pod's errors, as the kubelet does.
    pub fn delete_pod_from_volume(&mut self, pod: &PodUid, volume: &UniqueVolumeName) {
        self.pod_errors.remove(pod);
        // one search of the volumes, whether the volume stays or goes
        let Entry::Occupied(mut v) = self.volumes.entry(volume.clone()) else {
            return;
        };
        if v.get_mut().pods.remove(pod).is_some() {
            self.by_pod.remove(&(pod.clone(), Some(volume.clone())));
            self.pairs[v.get().plugin as usize] -= 1;
        }
        if v.get().pods.is_empty() {
            v.remove();
        }
    }

    /// Removes `pod` from every volume; returns the volumes it was removed
    /// from. Costs O(the pod's volumes), whatever the node holds.
    pub fn delete_pod(&mut self, pod: &PodUid) -> Vec<UniqueVolumeName> {
        let names = self.volumes_of_pod(pod);
        for name in &names {
            self.delete_pod_from_volume(pod, name);
        }
        self.pod_errors.remove(pod);
        self.unresolved.remove(pod);
        self.pods.remove(pod);
        self.containers.remove(pod);
        names
    }

    /// Records `pod`'s containers (none: forgotten), shared with the last
    /// pod's when equal.
    pub fn set_pod_containers(&mut self, pod: &PodUid, containers: Vec<ContainerSpec>) {
        if containers.is_empty() {
            self.containers.remove(pod);
            return;
        }
        let shared = match &self.last_containers {
            Some(last) if **last == *containers => last.clone(),
            _ => self.last_containers.insert(containers.into()).clone(),
        };
        self.containers.insert(pod.clone(), shared);
    }

    /// `pod`'s containers, as the sources last told them.
    pub fn pod_containers(&self, pod: &PodUid) -> Option<Arc<[ContainerSpec]>> {
        self.containers.get(pod).cloned()
    }

    /// Records that `pod` exists and lists the volumes named `names` in
    /// its spec (whether or not each could be added).
    pub fn set_pod_volume_names(&mut self, pod: &PodUid, names: impl IntoIterator<Item = String>) {
        let names: Box<[SharedStr]> = names.into_iter().map(|n| self.shared_name(n)).collect();
        self.pods.insert(pod.clone(), names);
    }

    /// The names of the volumes `pod`'s spec lists; `None` when no source
    /// has told of the pod.
    pub fn pod_volume_names(&self, pod: &PodUid) -> Option<&[SharedStr]> {
        self.pods.get(pod).map(|n| &**n)
    }

    /// `pod`'s current errors, sorted (without clearing them).
    pub fn errors_of_pod(&self, pod: &PodUid) -> impl Iterator<Item = &String> {
        self.pod_errors.get(pod).into_iter().flatten()
    }

    /// Records whether `pod` (which exists) has a volume that cannot be
    /// resolved now. Such a pod keeps every mount it has: a volume whose
    /// claim vanished is not torn down under a running pod, even when the
    /// DSW never held it (after a restart).
    pub fn set_pod_unresolved(&mut self, pod: &PodUid, unresolved: bool) {
        if unresolved {
            self.unresolved.insert(pod.clone());
        } else {
            self.unresolved.remove(pod);
        }
    }

    /// Whether `pod` has a volume that cannot be resolved now.
    pub fn pod_has_unresolved(&self, pod: &PodUid) -> bool {
        self.unresolved.contains(pod)
    }

    /// Whether some pod wants `volume`.
    pub fn volume_exists(&self, volume: &UniqueVolumeName) -> bool {
        self.volumes.contains_key(volume)
    }

    /// Whether some pod wants `volume` mounted with `label` (the effective
    /// label); a volume mounted with another label is not desired.
    #[cfg(test)]
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
    #[cfg(test)]
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

    /// Whether `pod` wants some volume. O(log n), from the index by pod: a
    /// caller asking about many pods needs no set of its own.
    pub fn pod_has_volumes(&self, pod: &PodUid) -> bool {
        self.by_pod
            .range((pod.clone(), None)..)
            .next()
            .is_some_and(|(p, _)| p == pod)
    }

    /// One volume's record.
    pub fn volume(&self, volume: &UniqueVolumeName) -> Option<&DesiredVolume> {
        self.volumes.get(volume).map(|v| &**v)
    }

    /// Every volume, sorted by name.
    pub fn volumes(&self) -> impl Iterator<Item = (&UniqueVolumeName, &DesiredVolume)> {
        self.volumes.iter().map(|(n, v)| (n, &**v))
    }

    /// The volumes `pod` wants, sorted. O(the pod's volumes), from the
    /// index by pod.
    pub fn volumes_of_pod(&self, pod: &PodUid) -> Vec<UniqueVolumeName> {
        self.by_pod
            .range((pod.clone(), None)..)
            .take_while(|(p, _)| p == pod)
            .filter_map(|(_, v)| v.clone())
            .collect()
    }

    /// One entry per (volume, pod), sorted by volume then pod.
    #[cfg(test)]
    pub fn volumes_to_mount(&self) -> Vec<VolumeToMount> {
        self.volumes_to_mount_iter()
            .map(|(name, uid, v, p)| Self::volume_to_mount(name, uid, v, p))
            .collect()
    }

    /// The (volume, pod) pairs `Self::volumes_to_mount` lists, borrowed:
    /// for a pass that copies only the pairs it acts on.
    pub fn volumes_to_mount_iter(
        &self,
    ) -> impl Iterator<Item = (&UniqueVolumeName, &PodUid, &DesiredVolume, &DesiredPod)> {
        self.volumes.iter().flat_map(|(name, v)| {
            let v: &DesiredVolume = v;
            v.pods.iter().map(move |(uid, p)| (name, uid, v, p))
        })
    }

    /// One pair of [`Self::volumes_to_mount_iter`] as `Self::volumes_to_mount` lists it.
    pub fn volume_to_mount(
        name: &UniqueVolumeName,
        uid: &PodUid,
        v: &DesiredVolume,
        p: &DesiredPod,
    ) -> VolumeToMount {
        VolumeToMount {
            volume: name.clone(),
            pod: uid.clone(),
            plugin: v.plugin,
            spec: v.spec.clone(),
            spec_name: p.spec_name.clone(),
            outer_name: p.outer_name.clone(),
            selinux: v.effective_selinux.clone(),
            csi_pod: p.csi_pod.clone(),
            read_only: p.read_only,
            fs_group: p.fs_group,
        }
    }

    /// Per plugin, how many (volume, pod) pairs `Self::volumes_to_mount`
    /// lists (plugins without any left out), from counts kept up to date:
    /// no walk of the node.
    pub fn to_mount_counts(&self) -> BTreeMap<PluginName, usize> {
        PluginName::ALL
            .into_iter()
            .map(|p| (p, self.pairs[p as usize]))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// Forgets one error of `pod` that no longer holds (a refusal that was
    /// lifted); its other errors stay.
    pub fn remove_pod_error(&mut self, pod: &PodUid, error: &str) {
        if let Some(errors) = self.pod_errors.get_mut(pod) {
            errors.remove(error);
            if errors.is_empty() {
                self.pod_errors.remove(pod);
            }
        }
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

    /// Every pod's current errors (without clearing them), for `/debug/state`.
    pub fn pod_errors(&self) -> impl Iterator<Item = (&PodUid, &BTreeSet<String>)> {
        self.pod_errors.iter().filter(|(_, e)| !e.is_empty())
    }

    /// Every pod source has listed its pods once: unmounting may start.
    pub fn mark_sources_ready(&mut self) {
        self.populated = true;
    }

    /// Whether every pod source has listed its pods once.
    pub fn is_populated(&self) -> bool {
        self.populated
    }

    /// Makes attachable volumes wait for `node.status.volumesInUse` before
    /// they are mounted (see [`InUseReport`]).
    pub fn set_in_use_gate(&mut self, on: bool) {
        self.in_use_gate = on;
    }

    /// Whether mounting `v` must wait for a status update that lists it.
    pub fn waits_for_in_use_report(&self, v: &DesiredVolume) -> bool {
        self.in_use_gate && v.in_use != InUseReport::Reported && v.spec.is_attachable()
    }

    /// Notes that a mount of `volume` waits for a status update; true the
    /// first time, when the publisher is to be woken.
    pub fn request_in_use_report(&mut self, volume: &UniqueVolumeName) -> bool {
        match self.volumes.get_mut(volume) {
            Some(v) if v.in_use == InUseReport::Unreported => {
                v.in_use = InUseReport::Requested;
                true
            }
            _ => false,
        }
    }

    /// A status update listing `reported` in `volumesInUse` succeeded (the
    /// kubelet's `MarkVolumesAsReportedInUse`). O(reported): a volume added
    /// after the update was computed but listed in it is in use on the
    /// server all the same.
    pub fn mark_reported_in_use(&mut self, reported: &[UniqueVolumeName]) -> usize {
        let mut newly = 0;
        for name in reported {
            if let Some(v) = self.volumes.get_mut(name)
                && v.in_use != InUseReport::Reported
            {
                v.in_use = InUseReport::Reported;
                newly += 1;
            }
        }
        newly
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::StorageMedium;
    use crate::state::test_support::{ctx, local, local_spec, uid};

    fn pod_volume(pod: &PodUid, selinux: Option<SeLinuxContext>) -> PodVolume {
        PodVolume {
            volume: local(),
            spec_name: "pv1".into(),
            outer_name: format!("data-{pod}"),
            spec: local_spec().into(),
            selinux,
            csi_pod: None,
            read_only: false,
            fs_group: None,
            supplemental_gid: None,
        }
    }

    #[test]
    fn a_pod_s_volume_names_are_known_until_it_is_deleted() {
        let mut dsw = DesiredStateOfWorld::new();
        let (u1, u2) = (uid("u1"), uid("u2"));
        assert_eq!(dsw.pod_volume_names(&u1), None);
        dsw.set_pod_volume_names(&u1, ["data".to_owned(), "cache".to_owned()]);
        dsw.set_pod_volume_names(&u2, []);
        let names: Vec<&str> = dsw
            .pod_volume_names(&u1)
            .unwrap()
            .iter()
            .map(|n| n.as_str())
            .collect();
        assert_eq!(names, ["data", "cache"]);
        assert_eq!(
            dsw.pod_volume_names(&u2).map(<[_]>::len),
            Some(0),
            "known without volumes"
        );
        dsw.add_pod_error(&u1, "e1");
        assert_eq!(dsw.errors_of_pod(&u1).collect::<Vec<_>>(), ["e1"]);
        dsw.delete_pod(&u1);
        assert_eq!(dsw.pod_volume_names(&u1), None);
        assert_eq!(dsw.errors_of_pod(&u1).count(), 0);
    }

    #[test]
    fn pods_with_equal_containers_share_one_copy() {
        let container = |mount_path: &str| ContainerSpec {
            name: "app".into(),
            privileged: false,
            mounts: vec![crate::model::VolumeMountSpec {
                name: "cache".into(),
                mount_path: mount_path.into(),
                read_only: false,
                sub_path: crate::model::SubPath::None,
                propagation: None,
            }],
            devices: Vec::new(),
            env: Vec::new(),
        };
        let mut dsw = DesiredStateOfWorld::new();
        let (a, b, c) = (uid("a"), uid("b"), uid("c"));
        dsw.set_pod_containers(&a, vec![container("/cache")]);
        dsw.set_pod_containers(&b, vec![container("/cache")]);
        dsw.set_pod_containers(&c, vec![container("/data")]);
        let got = |p: &PodUid| dsw.pod_containers(p).unwrap();
        assert!(Arc::ptr_eq(&got(&a), &got(&b)), "equal: one copy");
        assert!(!Arc::ptr_eq(&got(&b), &got(&c)), "different: its own");
        assert_eq!(got(&c)[0].mounts[0].mount_path, "/data");
        assert_eq!(got(&a)[0].mounts[0].mount_path, "/cache");
        dsw.set_pod_containers(&a, Vec::new());
        assert!(dsw.pod_containers(&a).is_none(), "none: forgotten");
        dsw.delete_pod(&b);
        assert!(dsw.pod_containers(&b).is_none());
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
            spec: ed.into(),
            selinux: None,
            csi_pod: None,
            read_only: false,
            fs_group: None,
            supplemental_gid: None,
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
    fn dsw_new_volumes_with_equal_specs_share_one_spec_per_plugin() {
        let mut dsw = DesiredStateOfWorld::new();
        let memory = VolumeSpec::EmptyDir {
            medium: StorageMedium::Memory,
            size_limit: None,
        };
        let disk = VolumeSpec::EmptyDir {
            medium: StorageMedium::Disk,
            size_limit: None,
        };
        // pods of an emptyDir and a local PV each, the order a manifest gives
        let specs = [&memory, &memory, &disk, &memory];
        let mut names = Vec::new();
        for (i, spec) in specs.into_iter().enumerate() {
            let p = uid(&format!("p{i}"));
            let scratch = PodVolume {
                volume: PodVolume::unique_name(spec, &p, "scratch"),
                spec_name: "scratch".into(),
                outer_name: "scratch".into(),
                spec: spec.clone().into(),
                selinux: None,
                csi_pod: None,
                read_only: false,
                fs_group: None,
                supplemental_gid: None,
            };
            let added = dsw
                .add_pod_to_volume(&p, scratch, LabelCheck::default())
                .unwrap();
            names.push(added.volume);
            dsw.add_pod_to_volume(&p, pod_volume(&p, None), LabelCheck::default())
                .unwrap();
        }
        let spec = |i: usize| dsw.volume(&names[i]).unwrap().spec.clone();
        // (volume, volume, share one spec?)
        let table = [(0, 1, true), (1, 2, false), (0, 3, false), (2, 3, false)];
        for (a, b, shared) in table {
            assert_eq!(Arc::ptr_eq(&spec(a), &spec(b)), shared, "{a} {b}");
        }
        // equal specs, shared or not
        assert_eq!(*spec(0), *spec(3));
    }

    #[test]
    fn dsw_records_with_equal_outer_names_share_one_recent_name() {
        let mut dsw = DesiredStateOfWorld::new();
        let spec = VolumeSpec::EmptyDir {
            medium: StorageMedium::Disk,
            size_limit: None,
        };
        // pod i has `scratch` and `v<i>`: every `scratch` is one string
        // while the others pass through the few recent names
        let mut names = Vec::new();
        for i in 0..2 * RECENT_NAMES {
            let p = uid(&format!("p{i}"));
            for outer in ["scratch".to_owned(), format!("v{i}")] {
                let v = PodVolume {
                    volume: PodVolume::unique_name(&spec, &p, &outer),
                    spec_name: outer.clone(),
                    outer_name: outer,
                    spec: spec.clone().into(),
                    selinux: None,
                    csi_pod: None,
                    read_only: false,
                    fs_group: None,
                    supplemental_gid: None,
                };
                let added = dsw.add_pod_to_volume(&p, v, LabelCheck::default());
                names.push((p.clone(), added.unwrap().volume));
            }
        }
        let outer = |(p, v): &(PodUid, UniqueVolumeName)| {
            let rec = dsw.volume(v).unwrap().pods.get(p).unwrap();
            // an inline volume's spec name is its outer name
            assert!(std::ptr::eq(
                rec.outer_name.as_str(),
                rec.spec_name.as_str()
            ));
            rec.outer_name.clone()
        };
        let first = outer(&names[0]);
        for n in names.iter().step_by(2) {
            assert!(std::ptr::eq(outer(n).as_str(), first.as_str()), "{n:?}");
        }
        assert_eq!(outer(&names[3]), "v1");
        assert_eq!(dsw.recent_names.iter().flatten().count(), RECENT_NAMES);
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

    /// What the index by pod and the pair counts must be: a full walk of
    /// every volume's pods.
    fn assert_index_matches_a_walk(dsw: &DesiredStateOfWorld, all: &[PodUid], step: &str) {
        let mut walk: BTreeSet<(PodUid, Option<UniqueVolumeName>)> = BTreeSet::new();
        let mut counts: BTreeMap<PluginName, usize> = BTreeMap::new();
        for (name, v) in dsw.volumes() {
            assert!(!v.pods.is_empty(), "{step}: {name} kept without pods");
            for uid in v.pods.keys() {
                walk.insert((uid.clone(), Some(name.clone())));
            }
            *counts.entry(v.plugin).or_default() += v.pods.len();
        }
        assert_eq!(dsw.by_pod, walk, "{step}: index by pod");
        assert_eq!(dsw.to_mount_counts(), counts, "{step}: counts");
        let pods: BTreeSet<&PodUid> = walk.iter().map(|(p, _)| p).collect();
        for pod in all {
            let has = pods.contains(pod);
            assert_eq!(dsw.pod_has_volumes(pod), has, "{step}: {pod}");
        }
        for pod in pods {
            let of_pod: Vec<UniqueVolumeName> = dsw
                .volumes()
                .filter(|(_, v)| v.pods.contains_key(pod))
                .map(|(n, _)| n.clone())
                .collect();
            assert_eq!(dsw.volumes_of_pod(pod), of_pod, "{step}: {pod}");
        }
    }

    #[test]
    fn dsw_index_by_pod_equals_a_full_walk_after_every_operation() {
        use crate::host::testgen::XorShift;
        let pods: Vec<PodUid> = (0..6).map(|i| uid(&format!("p{i}"))).collect();
        let labels = [None, Some(ctx("u:r:t:s0:c1")), Some(ctx("u:r:t:s0:c2"))];
        let memory = VolumeSpec::EmptyDir {
            medium: StorageMedium::Memory,
            size_limit: None,
        };
        // a volume of one pod (an emptyDir) or shared (one of a few PVs)
        let volume = |rng: &mut XorShift, pod: &PodUid| -> PodVolume {
            let n = rng.below(6);
            match n {
                0..3 => PodVolume {
                    volume: PodVolume::unique_name(&memory, pod, &format!("e{n}")),
                    spec_name: format!("e{n}"),
                    outer_name: format!("e{n}"),
                    spec: memory.clone().into(),
                    selinux: None,
                    csi_pod: None,
                    read_only: false,
                    fs_group: None,
                    supplemental_gid: None,
                },
                _ => PodVolume {
                    volume: UniqueVolumeName::shared(PluginName::LocalVolume, &format!("pv{n}")),
                    spec_name: format!("pv{n}"),
                    outer_name: "data".into(),
                    spec: local_spec().into(),
                    selinux: None,
                    csi_pod: None,
                    read_only: false,
                    fs_group: None,
                    supplemental_gid: None,
                },
            }
        };
        // a number in 0..n
        let below = |rng: &mut XorShift, n: usize| {
            usize::try_from(rng.below(n as u64)).expect("below n, a usize")
        };
        for seed in 1..=20u64 {
            let mut rng = XorShift::new(seed);
            let mut dsw = DesiredStateOfWorld::new();
            for i in 0..400 {
                let pod = &pods[below(&mut rng, pods.len())];
                let op = rng.below(8);
                let step = format!("seed {seed} step {i} op {op} pod {pod}");
                match op {
                    // adds, some refused for a strict label conflict
                    0..3 => {
                        let mut v = volume(&mut rng, pod);
                        let label = labels[below(&mut rng, labels.len())].clone();
                        v.selinux = label.clone();
                        let check = LabelCheck {
                            original: label,
                            strict: rng.below(2) == 0,
                        };
                        let _ = dsw.add_pod_to_volume(pod, v, check);
                    }
                    3 => {
                        let v = volume(&mut rng, pod).volume;
                        dsw.delete_pod_from_volume(pod, &v);
                    }
                    // a volume the pod has, when it has one
                    4 => {
                        let of_pod = dsw.volumes_of_pod(pod);
                        if !of_pod.is_empty() {
                            let v = &of_pod[below(&mut rng, of_pod.len())];
                            dsw.delete_pod_from_volume(pod, v);
                        }
                    }
                    5 => {
                        let want = dsw.volumes_of_pod(pod);
                        assert_eq!(dsw.delete_pod(pod), want, "{step}");
                        assert!(dsw.volumes_of_pod(pod).is_empty(), "{step}");
                    }
                    6 => {
                        dsw.add_pod_error(pod, format!("error {i}"));
                        dsw.set_pod_unresolved(pod, rng.below(2) == 0);
                    }
                    _ => {
                        dsw.pop_pod_errors(pod);
                    }
                }
                assert_index_matches_a_walk(&dsw, &pods, &step);
            }
            for pod in &pods {
                dsw.delete_pod(pod);
            }
            assert_index_matches_a_walk(&dsw, &pods, &format!("seed {seed}: all deleted"));
            assert!(dsw.by_pod.is_empty() && dsw.volumes().next().is_none());
        }
    }

    #[test]
    fn dsw_is_populated_only_once_sources_are_ready() {
        let mut dsw = DesiredStateOfWorld::new();
        assert!(!dsw.is_populated());
        dsw.mark_sources_ready();
        assert!(dsw.is_populated());
    }
}
