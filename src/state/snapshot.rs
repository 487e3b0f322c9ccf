//! The ASW as JSON: the `state` object of `dump` and `/debug/state`
//! (docs/dump-json.md). Field names are a contract.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{ActualStateOfWorld, SeLinuxState};
use crate::model::{MountState, PodUid, TargetKind, UniqueVolumeName};

impl ActualStateOfWorld {
    /// The ASW as `dump` and `/debug/state` show it, sorted by volume then pod.
    pub fn snapshot(&self) -> StateSnapshot {
        let volumes = self
            .volumes()
            .map(|(name, v)| VolumeSnapshot {
                volume: name.clone(),
                device: v.device.as_ref().map(|d| DeviceSnapshot {
                    state: d.state,
                    device_path: d.device_path.clone(),
                    mount_path: d.mount_path.clone(),
                    selinux_context: v.selinux(),
                }),
                pods: v
                    .pods
                    .iter()
                    .map(|(uid, p)| PodSnapshot {
                        pod_uid: uid.clone(),
                        mount_path: p.mount.mount_path.to_path_buf(),
                        kind: p.mount.kind,
                        state: p.state,
                        selinux_context: p.mount.selinux.clone(),
                    })
                    .collect(),
                health: None,
            })
            .collect();
        StateSnapshot {
            volumes,
            pod_errors: Default::default(),
            unmounted_outside: Vec::new(),
            pod_volume_health: Default::default(),
            journal_damage: None,
        }
    }
}

/// The ASW as JSON: `dump`'s `state` object (docs/dump-json.md). Field
/// names are a contract.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateSnapshot {
    /// every volume, sorted by name
    pub volumes: Vec<VolumeSnapshot>,
    /// `/debug/state` only: each pod's current errors (a volume refused for
    /// its SELinux label, a claim that does not resolve, a failed
    /// operation), by pod UID; absent when there are none
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub pod_errors: std::collections::BTreeMap<String, Vec<String>>,
    /// `/debug/state` only: the targets this start's reconstruction found
    /// unmounted outside volumed (the journal had them mounted, this boot,
    /// and the host did not; also counted by
    /// `volumed_unmounted_outside_total`); absent when there are none
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unmounted_outside: Vec<UnmountedOutside>,
    /// `/debug/state` only: per pod UID, its volumes' health in the shape
    /// of `Pod.status.volumeHealth` (Kubernetes 1.37); absent when no
    /// volume of a pod has been judged
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub pod_volume_health: std::collections::BTreeMap<String, serde_json::Value>,
    /// `/debug/state` only: what the journal keeps aside (journals moved
    /// aside beside it, quarantined records, a tail lost across a reboot;
    /// also `volumed_journal_damage`); absent when nothing
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_damage: Option<super::DamageJson>,
}

/// A target found unmounted outside volumed (docs/merge-table.md: a
/// finding in `/debug/state`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnmountedOutside {
    /// the unique volume name
    pub volume: String,
    /// `device` or `pod`
    pub target: String,
    /// the pod, `null` for a device target
    pub pod_uid: Option<String>,
    /// the target's path, when known
    pub path: Option<String>,
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
    /// `/debug/state`: the volume's condition, `null` until one was judged
    /// (docs/http.md); `dump` (the journal's view) always has `null`
    #[serde(default)]
    pub health: Option<super::HealthJson>,
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
    use crate::model::{PluginName, StorageMedium, VolumeSpec};
    use crate::state::PodMount;
    use crate::state::test_support::{asw, ctx, dm, local, uid};
    use serde_json::json;

    #[test]
    fn snapshot_has_the_dump_json_shape() {
        let mut asw = asw();
        let v = local();
        let ed = UniqueVolumeName::per_pod(PluginName::EmptyDir, &uid("p1"), "cache");
        let spec = VolumeSpec::EmptyDir {
            medium: StorageMedium::Disk,
            size_limit: None,
        };
        asw.add_volume(
            ed.clone(),
            PluginName::EmptyDir,
            "cache",
            Some(spec.into()),
            None,
        );
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
                 "selinux_context": ""}], "health": null},
            {"volume": "kubernetes.io/local-volume/pv1",
             "device": {"state": "mounted", "device_path": "/dev/loop0", "mount_path": "/g",
                        "selinux_context": "u:r:t:s0:c1,c2"},
             "pods": [
                {"pod_uid": "p1", "mount_path": "/p1", "kind": "mount", "state": "uncertain",
                 "selinux_context": null},
                {"pod_uid": "p2", "mount_path": "/p2", "kind": "mount", "state": "mounted",
                 "selinux_context": "u:r:t:s0:c1,c2"}], "health": null}
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
