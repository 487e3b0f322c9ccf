//! Whether a pod's volumes are ready, as a pure function of one pod's view
//! of the DSW and the ASW ([`PodView`], taken under the world lock by
//! `super::view`), and the JSON document the runtime API answers with.
//!
//! *Ready* means what the kubelet's `WaitForAttachAndMount` waits for:
//! every volume the pod's spec lists is in the DSW for this pod and its pod
//! target is `mounted` in the ASW — an uncertain target does not count, nor
//! a volume the sources could not resolve or the DSW refused (its name is
//! still expected, so the pod is never reported ready without it).

use serde::{Deserialize, Serialize};

use crate::model::{MountState, SharedStr, VolumeSpec};

/// One mounted volume of a pod, as a container runtime binds it in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodVolume {
    /// `pod.spec.volumes[x].name`
    pub name: String,
    /// the path on the host to bind into the containers: the pod target
    /// (`pods/<uid>/volumes/...`), or a hostPath's own path
    pub host_path: String,
    /// the volume itself is read-only for this pod (its claim's `readOnly`,
    /// a CSI `readOnly`, an `ro` mount option)
    pub read_only: bool,
    /// the SELinux context the target was mounted with (`context=`), if any
    pub selinux_context: Option<String>,
    /// the runtime should relabel the files for the container (the CRI
    /// `Mount.selinux_relabel` the kubelet sets): see `selinux_relabel`
    #[serde(default)]
    pub selinux_relabel: bool,
}

/// `GET /v1/pods/<uid>/volumes`: whether the pod's volumes are ready, the
/// mounted ones, and what blocks the others.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodVolumes {
    /// the pod UID asked about
    pub pod_uid: String,
    /// every volume of the pod is mounted (see the module doc)
    pub ready: bool,
    /// the pod's volumes the DSW wants that are mounted, sorted by name
    pub volumes: Vec<PodVolume>,
    /// empty when ready; else what blocks it: the volumes not mounted, the
    /// ones that could not be processed, then the pod's errors
    pub errors: Vec<String>,
    /// the groups the pod's containers get besides the pod's own (the
    /// kubelet's `GetExtraSupplementalGroupsForPod`): the
    /// `pv.beta.kubernetes.io/gid` of each mounted claim's PV that the pod's
    /// `supplementalGroups` lack, sorted, each once
    #[serde(default)]
    pub supplemental_groups: Vec<u32>,
}

/// `GET /v1/pods/<uid>/volumes?unmounted=1`: whether none of the pod's
/// targets is mounted any more (the kubelet's `WaitForUnmount`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodUnmounted {
    /// the pod UID asked about
    pub pod_uid: String,
    /// no target of the pod is `mounted` (an uncertain one is not waited
    /// for, as the kubelet's `PodHasMountedVolumes`; a pod volumed never
    /// knew has none)
    pub unmounted: bool,
    /// the pod's volumes still mounted, by `pod.spec.volumes[x].name`
    /// (the unique volume name for a target rebuilt without one), sorted
    pub mounted: Vec<String>,
}

/// One volume the DSW wants for the pod, with its pod target in the ASW.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetView {
    /// `pod.spec.volumes[x].name`
    pub name: SharedStr,
    /// the pod target's state; `None`: the ASW has no record of it
    pub state: Option<MountState>,
    /// where the runtime finds it ([`PodVolume::host_path`])
    pub host_path: String,
    /// [`PodVolume::read_only`]
    pub read_only: bool,
    /// [`PodVolume::selinux_context`]
    pub selinux_context: Option<String>,
    /// [`PodVolume::selinux_relabel`]
    pub selinux_relabel: bool,
    /// the PV's group for [`PodVolumes::supplemental_groups`]
    pub supplemental_gid: Option<u32>,
}

/// What the DSW and the ASW say about one pod: O(its volumes) to take.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodView {
    /// the names of the volumes the pod's spec lists
    pub names: Vec<SharedStr>,
    /// some volume of the pod cannot be resolved now
    pub unresolved: bool,
    /// the pod's errors the DSW keeps (sources, failed operations)
    pub errors: Vec<String>,
    /// the volumes the DSW wants for the pod
    pub targets: Vec<TargetView>,
}

/// Whether `spec` makes its volume read-only for every pod.
pub(crate) fn read_only(spec: &VolumeSpec) -> bool {
    match spec {
        VolumeSpec::Csi(c) => c.read_only || c.mount_options.iter().any(|o| o == "ro"),
        VolumeSpec::Local { mount_options, .. } => mount_options.iter().any(|o| o == "ro"),
        VolumeSpec::EmptyDir { .. } | VolumeSpec::HostPath { .. } => false,
        // the kubelet mounts a payload read-only into every container
        VolumeSpec::Payload(_) => true,
    }
}

/// Whether a container runtime should relabel the volume's files with the
/// container's SELinux label, as the kubelet decides a CRI mount's
/// `selinux_relabel`: never a volume mounted with `context=` (its files
/// carry the label already, which is why those mounts exist) nor a hostPath
/// (the host's own files); the volumes the kubelet's plugins mark
/// `SELinuxRelabel` — emptyDir, local PVs, and configMap, secret,
/// downwardAPI and projected, which the kubelet never mounts with a
/// context — always. A CSI volume: the kubelet asks the mount whether it
/// has `seclabel`; volumed answers from the filesystem type the volume is
/// formatted with, relabelling the local filesystems that carry labels and
/// nothing it cannot tell (an NFS or FUSE export without labels would make
/// the relabel, and the container's start, fail). A runtime on a host
/// without SELinux ignores it.
pub(crate) fn selinux_relabel(spec: Option<&VolumeSpec>, context: Option<&str>) -> bool {
    const LABELLED: [&str; 6] = ["ext4", "ext3", "ext2", "xfs", "btrfs", "tmpfs"];
    if context.is_some_and(|c| !c.is_empty()) {
        return false;
    }
    match spec {
        Some(VolumeSpec::EmptyDir { .. } | VolumeSpec::Local { .. } | VolumeSpec::Payload(_)) => {
            true
        }
        Some(VolumeSpec::Csi(c)) => c.fs_type.as_deref().is_some_and(|f| LABELLED.contains(&f)),
        Some(VolumeSpec::HostPath { .. }) | None => false,
    }
}

/// The answer for pod `uid` from its view.
pub fn decide(uid: &str, view: &PodView) -> PodVolumes {
    let mounted = |t: &&TargetView| t.state == Some(MountState::Mounted);
    let mut volumes: Vec<PodVolume> = view
        .targets
        .iter()
        .filter(mounted)
        .map(|t| PodVolume {
            name: t.name.to_string(),
            host_path: t.host_path.clone(),
            read_only: t.read_only,
            selinux_context: t.selinux_context.clone(),
            selinux_relabel: t.selinux_relabel,
        })
        .collect();
    volumes.sort_by(|a, b| a.name.cmp(&b.name));
    let is_mounted = |n: &SharedStr| volumes.iter().any(|v| v.name == n.as_str());
    let in_dsw = |n: &SharedStr| view.targets.iter().any(|t| t.name == *n);
    let unmounted: Vec<&str> = view
        .names
        .iter()
        .filter(|n| in_dsw(n) && !is_mounted(n))
        .map(|n| n.as_str())
        .collect();
    let unprocessed: Vec<&str> = view
        .names
        .iter()
        .filter(|n| !in_dsw(n))
        .map(|n| n.as_str())
        .collect();
    let ready = unmounted.is_empty() && unprocessed.is_empty() && !view.unresolved;
    let mut errors = Vec::new();
    if !ready {
        if !unmounted.is_empty() {
            errors.push(format!("unmounted volumes=[{}]", unmounted.join(", ")));
        }
        if !unprocessed.is_empty() {
            errors.push(format!(
                "failed to process volumes=[{}]",
                unprocessed.join(", ")
            ));
        }
        errors.extend(view.errors.iter().cloned());
        if errors.is_empty() {
            errors.push("a volume of the pod cannot be resolved now".to_owned());
        }
    }
    let mut supplemental_groups: Vec<u32> = view
        .targets
        .iter()
        .filter(mounted)
        .filter_map(|t| t.supplemental_gid)
        .collect();
    supplemental_groups.sort_unstable();
    supplemental_groups.dedup();
    PodVolumes {
        pod_uid: uid.to_owned(),
        ready,
        volumes,
        errors,
        supplemental_groups,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kubelet's `selinux_relabel` per plugin, and never over a
    /// `context=` mount.
    #[test]
    fn which_volumes_a_runtime_relabels() {
        use crate::model::{CsiSpec, StorageMedium};
        let csi = |fs: Option<&str>| {
            VolumeSpec::Csi(Box::new(CsiSpec {
                fs_type: fs.map(str::to_owned),
                ..CsiSpec::default()
            }))
        };
        let empty_dir = VolumeSpec::EmptyDir {
            medium: StorageMedium::Memory,
            size_limit: None,
        };
        let host_path = VolumeSpec::HostPath {
            path: "/data".into(),
            host_path_type: crate::model::HostPathType::Unset,
        };
        let secret = VolumeSpec::Payload(Box::new(crate::model::PayloadSpec {
            kind: crate::model::PayloadKind::Secret,
            namespace: "default".into(),
            default_mode: 0o644,
            sources: Vec::new(),
            fs_group: None,
            pod_fields: Default::default(),
            version: None,
            immutable: false,
        }));
        let label = Some("system_u:object_r:container_file_t:s0:c1,c2");
        let rows: [(&str, Option<&VolumeSpec>, Option<&str>, bool); 9] = [
            (
                "secret: never mounted with a context",
                Some(&secret),
                None,
                true,
            ),
            ("emptyDir", Some(&empty_dir), None, true),
            (
                "emptyDir mounted without a context",
                Some(&empty_dir),
                Some(""),
                true,
            ),
            (
                "hostPath: the host's own files",
                Some(&host_path),
                None,
                false,
            ),
            ("CSI ext4", Some(&csi(Some("ext4"))), None, true),
            (
                "CSI ext4 mounted with context=",
                Some(&csi(Some("ext4"))),
                label,
                false,
            ),
            ("CSI nfs: cannot tell", Some(&csi(Some("nfs"))), None, false),
            ("CSI without fsType", Some(&csi(None)), None, false),
            ("no spec (rebuilt from the host)", None, None, false),
        ];
        for (name, spec, context, want) in rows {
            assert_eq!(selinux_relabel(spec, context), want, "{name}");
        }
    }

    fn target(name: &str, state: Option<MountState>) -> TargetView {
        TargetView {
            name: name.into(),
            state,
            host_path: format!("/r/pods/u/volumes/kubernetes.io~empty-dir/{name}"),
            read_only: false,
            selinux_context: None,
            selinux_relabel: true,
            supplemental_gid: None,
        }
    }

    fn view(names: &[&str], targets: Vec<TargetView>) -> PodView {
        PodView {
            names: names.iter().map(|n| SharedStr::from(*n)).collect(),
            targets,
            ..PodView::default()
        }
    }

    #[test]
    fn every_volume_mounted_is_ready_with_no_errors_even_if_an_old_one_stays() {
        let mut v = view(
            &["b", "a"],
            vec![
                target("b", Some(MountState::Mounted)),
                target("a", Some(MountState::Mounted)),
            ],
        );
        v.errors = vec!["an earlier failure".into()];
        let d = decide("u", &v);
        assert!(d.ready);
        assert_eq!(d.errors, Vec::<String>::new());
        let names: Vec<&str> = d.volumes.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["a", "b"], "sorted by name");
    }

    /// The PV groups of the mounted volumes only, sorted, each once (the
    /// kubelet's extra supplemental groups come from mounted volumes).
    #[test]
    fn supplemental_groups_come_from_the_mounted_volumes() {
        let with = |name, state, gid| TargetView {
            supplemental_gid: gid,
            ..target(name, state)
        };
        let v = view(
            &["a", "b", "c", "d", "e"],
            vec![
                with("a", Some(MountState::Mounted), Some(3000)),
                with("b", Some(MountState::Mounted), Some(1000)),
                with("c", Some(MountState::Mounted), Some(3000)),
                with("d", Some(MountState::Uncertain), Some(5000)),
                with("e", Some(MountState::Mounted), None),
            ],
        );
        assert_eq!(decide("u", &v).supplemental_groups, vec![1000, 3000]);
    }

    #[test]
    fn a_pod_without_volumes_is_ready() {
        let d = decide("u", &view(&[], vec![]));
        assert!(d.ready);
        assert!(d.volumes.is_empty() && d.errors.is_empty());
    }

    #[test]
    fn uncertain_and_absent_targets_are_unmounted_and_block() {
        let mut v = view(
            &["a", "b", "c"],
            vec![
                target("a", Some(MountState::Mounted)),
                target("b", Some(MountState::Uncertain)),
                target("c", None),
            ],
        );
        v.errors = vec!["mount b: no such device".into()];
        let d = decide("u", &v);
        assert!(!d.ready);
        assert_eq!(d.volumes.len(), 1, "only the mounted one is listed");
        assert_eq!(
            d.errors,
            ["unmounted volumes=[b, c]", "mount b: no such device"]
        );
    }

    #[test]
    fn a_volume_the_dsw_does_not_hold_blocks_even_when_the_rest_is_mounted() {
        // e.g. refused for its SELinux label, or a claim without a volume
        let v = view(&["a", "data"], vec![target("a", Some(MountState::Mounted))]);
        let d = decide("u", &v);
        assert!(!d.ready);
        assert_eq!(d.errors, ["failed to process volumes=[data]"]);
    }

    #[test]
    fn an_unresolved_pod_is_not_ready_and_says_why() {
        let mut v = view(&["a"], vec![target("a", Some(MountState::Mounted))]);
        v.unresolved = true;
        let d = decide("u", &v);
        assert!(!d.ready);
        assert_eq!(d.errors.len(), 1, "{:?}", d.errors);
        v.errors = vec!["claim c: not found".into()];
        assert_eq!(decide("u", &v).errors, ["claim c: not found"]);
    }

    #[test]
    fn the_json_has_the_contract_s_field_names() {
        let mut t = target("data", Some(MountState::Mounted));
        t.read_only = true;
        t.selinux_context = Some("system_u:object_r:container_file_t:s0:c1,c2".into());
        t.selinux_relabel = false;
        let d = decide("u1", &view(&["data"], vec![t]));
        let json = serde_json::to_value(&d).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "pod_uid": "u1",
                "ready": true,
                "volumes": [{
                    "name": "data",
                    "host_path": "/r/pods/u/volumes/kubernetes.io~empty-dir/data",
                    "read_only": true,
                    "selinux_context": "system_u:object_r:container_file_t:s0:c1,c2",
                    "selinux_relabel": false,
                }],
                "errors": [],
                "supplemental_groups": [],
            })
        );
        let back: PodVolumes = serde_json::from_value(json).unwrap();
        assert_eq!(back, d);
    }

    #[test]
    fn read_only_comes_from_the_spec() {
        let local = |opts: &[&str]| VolumeSpec::Local {
            path: "/dev/x".into(),
            fs_type: None,
            access_modes: vec![],
            mount_options: opts.iter().map(|s| s.to_string()).collect(),
            is_block: true,
            volume_mode: Default::default(),
        };
        assert!(read_only(&local(&["noatime", "ro"])));
        assert!(!read_only(&local(&["rw"])));
        let csi = crate::model::CsiSpec {
            read_only: true,
            ..Default::default()
        };
        assert!(read_only(&VolumeSpec::Csi(Box::new(csi))));
    }
}
