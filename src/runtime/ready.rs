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
    /// the volume itself is read-only (a CSI `readOnly`, an `ro` mount option)
    pub read_only: bool,
    /// the SELinux context the target was mounted with (`context=`), if any
    pub selinux_context: Option<String>,
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
pub fn read_only(spec: &VolumeSpec) -> bool {
    match spec {
        VolumeSpec::Csi(c) => c.read_only || c.mount_options.iter().any(|o| o == "ro"),
        VolumeSpec::Local { mount_options, .. } => mount_options.iter().any(|o| o == "ro"),
        VolumeSpec::EmptyDir { .. } | VolumeSpec::HostPath { .. } => false,
        // the kubelet mounts a payload read-only into every container
        VolumeSpec::Payload(_) => true,
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
    PodVolumes {
        pod_uid: uid.to_owned(),
        ready,
        volumes,
        errors,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(name: &str, state: Option<MountState>) -> TargetView {
        TargetView {
            name: name.into(),
            state,
            host_path: format!("/r/pods/u/volumes/kubernetes.io~empty-dir/{name}"),
            read_only: false,
            selinux_context: None,
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
                }],
                "errors": [],
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
