//! A target's parameters from what the DSW wants: the pod target's and the
//! device target's paths, device, options, fs type and label, and whether
//! SetUp is one step or several. The journal records them with each intent.

use crate::model::{
    Layout, MountOptions, PluginName, SharedPath, SharedStr, Steps, StorageMedium, TargetKind,
    TargetParams, TargetRef, VolumeSpec,
};
use crate::state::VolumeToMount;

/// Whether SetUp of `spec` is one syscall or several (the merge settles a
/// single-step intent from the host, and re-runs a multi-step one).
pub fn setup_steps(spec: &VolumeSpec) -> Steps {
    match spec {
        // tmpfs, then its mode: two steps a crash can cut apart
        VolumeSpec::EmptyDir {
            medium: StorageMedium::Memory,
            ..
        } => Steps::Multi,
        _ => Steps::Single,
    }
}

/// The parameters of a pod target, from what the DSW wants.
pub fn pod_params(layout: &Layout, want: &VolumeToMount) -> TargetParams {
    let (device_path, mount_options, fs_type) = spec_details(&want.spec);
    let path = layout.pod_target_path(&want.pod, want.plugin, &want.spec_name);
    TargetParams {
        device_path,
        device_mount_path: device_mount_path(layout, want),
        selinux: want.selinux.clone(),
        mount_options,
        fs_type: match &*want.spec {
            VolumeSpec::EmptyDir {
                medium: StorageMedium::Memory,
                ..
            } => Some(SharedStr::tmpfs()),
            _ => fs_type,
        },
        ..TargetParams::at(
            want.volume.clone(),
            want.plugin,
            want.spec_name.clone(),
            TargetRef::Pod(want.pod.clone()),
            want.spec.pod_target_kind(),
            Some(path.into()),
        )
    }
}

/// The parameters of a device target, from what the DSW wants.
pub fn device_params(layout: &Layout, want: &VolumeToMount) -> TargetParams {
    let (device_path, mount_options, fs_type) = spec_details(&want.spec);
    TargetParams {
        device_path,
        selinux: want.selinux.clone(),
        mount_options,
        fs_type,
        ..TargetParams::at(
            want.volume.clone(),
            want.plugin,
            want.spec_name.clone(),
            TargetRef::Device,
            TargetKind::Mount,
            device_mount_path(layout, want),
        )
    }
}

fn device_mount_path(layout: &Layout, want: &VolumeToMount) -> Option<SharedPath> {
    match want.spec.device_target_kind() {
        Some(_) if want.plugin == PluginName::LocalVolume => {
            Some(layout.local_device_path(&want.spec_name).into())
        }
        _ => None,
    }
}

/// A spec's device path, mount options and fs type, as the parameters hold
/// them (the path is the spec's own `Arc`).
fn spec_details(spec: &VolumeSpec) -> (Option<SharedPath>, MountOptions, Option<SharedStr>) {
    match spec {
        VolumeSpec::Local {
            path,
            fs_type,
            mount_options,
            ..
        } => (
            Some(path.clone()),
            mount_options.clone().into(),
            fs_type.as_deref().map(SharedStr::from),
        ),
        VolumeSpec::EmptyDir {
            size_limit: Some(bytes),
            medium: StorageMedium::Memory,
        } => (None, vec![format!("size={bytes}")].into(), None),
        VolumeSpec::HostPath { path, .. } => (Some(path.clone()), MountOptions::default(), None),
        _ => (None, MountOptions::default(), None),
    }
}
