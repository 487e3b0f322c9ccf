//! A target's parameters from what the DSW wants: the pod target's and the
//! device target's paths, device, options, fs type and label, and whether
//! SetUp is one step or several. The journal records them with each intent.

use std::sync::Arc;

use crate::model::{
    CsiLifecycle, CsiParams, CsiPodInfo, Layout, MountOptions, Operation, PluginName, SharedPath,
    SharedStr, Steps, StorageMedium, TargetKind, TargetParams, TargetRef, VolumeSpec,
};
use crate::state::VolumeToMount;

/// Whether SetUp of `spec` is one syscall or several (the merge settles a
/// single-step intent from the host, and re-runs a multi-step one).
pub(crate) fn setup_steps(spec: &VolumeSpec) -> Steps {
    match spec {
        // an RPC: what the driver did is not one syscall the host shows
        VolumeSpec::Csi(_) => Steps::Multi,
        // the wrapped emptyDir, then the payload's files and links
        VolumeSpec::Payload(_) => Steps::Multi,
        // tmpfs, then its mode: two steps a crash can cut apart
        VolumeSpec::EmptyDir {
            medium: StorageMedium::Memory,
            ..
        } => Steps::Multi,
        _ => Steps::Single,
    }
}

/// Whether `op` (any but SetUp, see [`setup_steps`]) on a target of
/// `plugin` is one syscall or several: formatting runs mkfs, and every CSI
/// operation is an RPC whose effect is not one syscall the host shows; the
/// mounts and unmounts of volumed's own plugins are one syscall.
pub(crate) fn op_steps(op: Operation, plugin: PluginName) -> Steps {
    match (op, plugin) {
        (Operation::FormatDevice, _) | (_, PluginName::Csi) => Steps::Multi,
        _ => Steps::Single,
    }
}

/// The CSI arguments of a volume's targets, from its spec, plus what the
/// pod adds for its pod target (`pod`: the podInfoOnMount keys, fsGroup).
fn csi_params(spec: &VolumeSpec, pod: Option<&CsiPodInfo>) -> Option<Arc<CsiParams>> {
    let VolumeSpec::Csi(c) = spec else {
        return None;
    };
    let mut volume_context = c.attributes.clone();
    if let Some(p) = pod {
        volume_context.extend(p.volume_context.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    Some(Arc::new(CsiParams {
        driver: c.driver.clone(),
        volume_handle: c.volume_handle.clone(),
        lifecycle: if c.ephemeral {
            CsiLifecycle::Ephemeral
        } else {
            CsiLifecycle::Persistent
        },
        access_modes: c.access_modes.clone(),
        read_only: c.read_only,
        publish_context: c
            .attachment
            .as_ref()
            .map(|a| a.1.clone())
            .unwrap_or_default(),
        volume_context,
        stage_secret: c.stage_secret.clone(),
        publish_secret: c.publish_secret.clone(),
        mount_group: pod.and_then(|p| p.mount_group.clone()),
        attachment_id: c.attachment.as_ref().map(|a| a.0.clone()),
    }))
}

/// The parameters of a pod target, from what the DSW wants.
pub(crate) fn pod_params(layout: &Layout, want: &VolumeToMount) -> TargetParams {
    let (device_path, mount_options, fs_type) = spec_details(&want.spec);
    let path = layout.pod_target_path(&want.pod, want.plugin, &want.spec_name);
    TargetParams::at(
        want.volume.clone(),
        want.plugin,
        want.spec_name.clone(),
        TargetRef::Pod(want.pod.clone()),
        want.spec.pod_target_kind(),
        Some(path.into()),
    )
    .with_device_path(device_path)
    .with_device_mount_path(device_mount_path(layout, want))
    .with_selinux(want.selinux.clone())
    .with_mount_options(mount_options)
    .with_fs_type(match &*want.spec {
        VolumeSpec::EmptyDir {
            medium: StorageMedium::Memory,
            ..
        } => Some(SharedStr::tmpfs()),
        VolumeSpec::Payload(p) if p.kind.in_memory() => Some(SharedStr::tmpfs()),
        _ => fs_type,
    })
    .with_csi(csi_params(&want.spec, want.csi_pod.as_deref()))
    // the payload's hash and objects, which the intent records
    .with_payload(match &*want.spec {
        VolumeSpec::Payload(p) => p.version.clone(),
        _ => None,
    })
}

/// The parameters of a device target, from what the DSW wants.
pub(crate) fn device_params(layout: &Layout, want: &VolumeToMount) -> TargetParams {
    let (device_path, mount_options, fs_type) = spec_details(&want.spec);
    TargetParams::at(
        want.volume.clone(),
        want.plugin,
        want.spec_name.clone(),
        TargetRef::Device,
        TargetKind::Mount,
        device_mount_path(layout, want),
    )
    .with_device_path(device_path)
    .with_selinux(want.selinux.clone())
    .with_mount_options(mount_options)
    .with_fs_type(fs_type)
    // NodeStage gets the fsGroup of the pod whose mount stages it, as
    // the kubelet's MountDevice sends it; the pod's keys go to publish only
    .with_csi(csi_params(
        &want.spec,
        want.csi_pod
            .as_deref()
            .map(|p| CsiPodInfo {
                volume_context: Default::default(),
                mount_group: p.mount_group.clone(),
            })
            .as_ref(),
    ))
}

fn device_mount_path(layout: &Layout, want: &VolumeToMount) -> Option<SharedPath> {
    match (&*want.spec, want.spec.device_target_kind()) {
        (_, Some(_)) if want.plugin == PluginName::LocalVolume => {
            Some(layout.local_device_path(&want.spec_name).into())
        }
        (VolumeSpec::Csi(c), Some(_)) => Some(
            layout
                .csi_device_path(&c.driver, &Layout::csi_handle_hash(&c.volume_handle))
                .into(),
        ),
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
        VolumeSpec::Csi(c) => (
            None,
            c.mount_options.clone().into(),
            c.fs_type.as_deref().map(SharedStr::from),
        ),
        _ => (None, MountOptions::default(), None),
    }
}
