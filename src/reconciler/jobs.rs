//! From plan to work and back: [`job_for`] turns a planned [`Action`] into a
//! [`Job`] carrying every parameter the worker needs (from the DSW's wish,
//! the journal's last parameters for the target, or the ASW), and
//! [`apply_update`] is the one place a finished job changes the ASW.

use crate::journal::{JournalState, TargetKey};
use crate::model::{
    Layout, SharedParams, SharedPath, TargetKind, TargetParams, TargetRef, UniqueVolumeName,
};
use crate::state::{ActualStateOfWorld, StateError};

use super::executor::{AswUpdate, Job, device_params, pod_params};
use super::plan::Action;

/// The parameters of a target the journal knows, if it does (its `Arc`:
/// a clone is a count).
fn journaled(
    state: Option<&JournalState>,
    volume: &UniqueVolumeName,
    target: TargetRef,
) -> Option<SharedParams> {
    let key = TargetKey {
        volume: volume.clone(),
        target,
    };
    state
        .and_then(|s| s.get(&key))
        .map(|e| e.current_params().clone())
}

/// The job for a teardown (`TearDown`, `UnmountDevice`) from the journal's
/// last parameters for its target, when the journal knows them (they are
/// what was mounted; the ASW may know less).
pub fn journal_job(action: &Action, state: &JournalState) -> Option<Job> {
    match action {
        Action::TearDown { volume, pod } => {
            journaled(Some(state), volume, TargetRef::Pod(pod.clone()))
                .map(|params| Job::TearDown { params })
        }
        Action::UnmountDevice { volume } => journaled(Some(state), volume, TargetRef::Device)
            .map(|params| Job::UnmountDevice { params }),
        Action::Mount { .. } | Action::Forget { .. } => None,
    }
}

/// The job for an action, or `None` when it needs no worker (`Forget`) or
/// the target's parameters are unknown (reported by the caller).
pub fn job_for(
    action: &Action,
    asw: &ActualStateOfWorld,
    journal: Option<&JournalState>,
    layout: &Layout,
) -> Option<Job> {
    match action {
        Action::Mount { want, mount_device } => Some(Job::Mount {
            device: mount_device.then(|| SharedParams::new(device_params(layout, want))),
            pod: SharedParams::new(pod_params(layout, want)),
            want: want.clone(),
        }),
        Action::TearDown { volume, pod } => {
            if let Some(job) = journal.and_then(|s| journal_job(action, s)) {
                return Some(job);
            }
            let target = TargetRef::Pod(pod.clone());
            let v = asw.volume(volume)?;
            let m = asw.pod(volume, pod)?;
            let device = v.device.as_ref();
            Some(Job::TearDown {
                params: TargetParams {
                    device_path: device
                        .and_then(|d| d.device_path.as_deref().map(SharedPath::from)),
                    device_mount_path: device
                        .and_then(|d| d.mount_path.as_deref().map(SharedPath::from)),
                    selinux: m.mount.selinux.context().cloned(),
                    ..TargetParams::at(
                        volume.clone(),
                        v.plugin,
                        v.spec_name.clone(),
                        target,
                        m.mount.kind,
                        Some(m.mount.mount_path.clone()),
                    )
                }
                .into(),
            })
        }
        Action::UnmountDevice { volume } => {
            if let Some(job) = journal.and_then(|s| journal_job(action, s)) {
                return Some(job);
            }
            let v = asw.volume(volume)?;
            let d = v.device.as_ref()?;
            Some(Job::UnmountDevice {
                params: TargetParams {
                    device_path: d.device_path.as_deref().map(SharedPath::from),
                    selinux: v.selinux.context().cloned(),
                    ..TargetParams::at(
                        volume.clone(),
                        v.plugin,
                        v.spec_name.clone(),
                        TargetRef::Device,
                        TargetKind::Mount,
                        Some(d.mount_path.as_deref()?.into()),
                    )
                }
                .into(),
            })
        }
        Action::Forget { .. } => None,
    }
}

/// Applies one finished job's change to the ASW (the one mutation point
/// besides reconstruction).
pub fn apply_update(asw: &mut ActualStateOfWorld, u: &AswUpdate) -> Result<(), StateError> {
    match u {
        AswUpdate::DeviceMounted {
            volume,
            plugin,
            spec_name,
            spec,
            mount,
        } => {
            asw.add_volume(
                volume.clone(),
                *plugin,
                spec_name.clone(),
                spec.clone(),
                mount.device_path.clone(),
            );
            asw.mark_device_mounted(volume, mount.clone())
        }
        AswUpdate::DeviceUncertain {
            volume,
            plugin,
            spec_name,
            mount,
        } => {
            asw.add_volume(
                volume.clone(),
                *plugin,
                spec_name.clone(),
                None,
                mount.device_path.clone(),
            );
            asw.mark_device_uncertain(volume, mount.clone())
        }
        AswUpdate::DeviceUnmounted { volume } => asw.mark_device_unmounted(volume),
        AswUpdate::PodMounted {
            volume,
            plugin,
            spec_name,
            spec,
            pod,
            mount,
        } => {
            asw.add_volume(
                volume.clone(),
                *plugin,
                spec_name.clone(),
                spec.clone(),
                None,
            );
            asw.mark_volume_mounted(volume, pod, mount.clone())
        }
        AswUpdate::PodUncertain {
            volume,
            plugin,
            spec_name,
            pod,
            mount,
        } => {
            asw.add_volume(volume.clone(), *plugin, spec_name.clone(), None, None);
            asw.mark_volume_uncertain(volume, pod, mount.clone())
        }
        AswUpdate::PodRemoved { volume, pod } => asw.delete_pod_from_volume(volume, pod),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{AccessMode, PluginName, PodUid, StorageMedium, VolumeSpec};
    use crate::reconciler::pending::OpKey;
    use crate::state::{DeviceMount, PodMount, SeLinuxState, VolumeToMount};

    /// The loop marks an action's key busy when it starts the job and frees
    /// the job's key when it reports: the two must be the same key for every
    /// action kind (`Action::key` and `Job::key` compute it from two shapes).
    #[test]
    fn a_job_has_the_exclusivity_key_of_its_action() {
        let layout = Layout::new("/r");
        let pod = PodUid::new("p1").unwrap();
        let block = VolumeSpec::Local {
            path: "/dev/loop0".into(),
            fs_type: Some("ext4".into()),
            access_modes: vec![AccessMode::ReadWriteOnce],
            mount_options: vec![],
            is_block: true,
        };
        let tmpfs = VolumeSpec::EmptyDir {
            medium: StorageMedium::Memory,
            size_limit: None,
        };
        let shared = UniqueVolumeName::shared(PluginName::LocalVolume, "pv1");
        let mut asw = ActualStateOfWorld::new();
        asw.add_volume(
            shared.clone(),
            PluginName::LocalVolume,
            "pv1",
            Some(block.clone().into()),
            None,
        );
        asw.mark_device_mounted(
            &shared,
            DeviceMount {
                device_path: Some("/dev/loop0".into()),
                mount_path: layout.local_device_path("pv1"),
                selinux: None,
            },
        )
        .unwrap();
        asw.mark_volume_mounted(
            &shared,
            &pod,
            PodMount {
                outer_name: "data".into(),
                mount_path: layout
                    .pod_target_path(&pod, PluginName::LocalVolume, "pv1")
                    .into(),
                kind: TargetKind::Mount,
                selinux: SeLinuxState::WithoutContext,
            },
        )
        .unwrap();
        let want = |spec: VolumeSpec, name: &str| {
            let volume = crate::model::PodVolume::unique_name(&spec, &pod, name);
            Box::new(VolumeToMount {
                volume,
                pod: pod.clone(),
                plugin: spec.plugin(),
                spec: spec.into(),
                spec_name: name.into(),
                outer_name: name.into(),
                selinux: None,
            })
        };
        let actions = [
            Action::Mount {
                want: want(block, "pv1"),
                mount_device: true,
            },
            Action::Mount {
                want: want(tmpfs, "cache"),
                mount_device: false,
            },
            Action::TearDown {
                volume: shared.clone(),
                pod: pod.clone(),
            },
            Action::UnmountDevice {
                volume: shared.clone(),
            },
        ];
        let keys: Vec<OpKey> = actions.iter().map(Action::key).collect();
        assert_eq!(
            keys[0],
            OpKey::volume(&shared),
            "a shared device: volume-wide"
        );
        assert!(keys[1].pod.is_some(), "a per-pod tmpfs: per pod");
        for (action, key) in actions.iter().zip(keys) {
            let job = job_for(action, &asw, None, &layout).expect("a job");
            assert_eq!(job.key(), key, "{action:?}");
        }
        assert!(job_for(&Action::Forget { volume: shared }, &asw, None, &layout).is_none());
    }
}
