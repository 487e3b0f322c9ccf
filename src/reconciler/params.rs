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

/// Whether the SetUp of `want` is one syscall or several: a pod whose
/// fsGroup the volume takes has the walk after it, which the host does not
/// show, so a SetUp cut short is run again (and the walk after it) even
/// when its mount is one syscall the host shows done.
pub(crate) fn setup_steps_of(want: &VolumeToMount) -> Steps {
    match want.fs_group {
        Some(_) => Steps::Multi,
        None => setup_steps(&want.spec),
    }
}

/// The operation a filesystem step is for a target of `kind`: a raw block
/// target is mapped and unmapped, never mounted (docs/kubelet.md, "Raw
/// block volumes").
pub(crate) fn op_for(op: Operation, kind: TargetKind) -> Operation {
    match (op, kind) {
        (Operation::MountDevice, TargetKind::Block) => Operation::MapDevice,
        (Operation::SetUp, TargetKind::Block) => Operation::MapPodDevice,
        (Operation::TearDown, TargetKind::Block) => Operation::UnmapPodDevice,
        (Operation::UnmountDevice, TargetKind::Block) => Operation::UnmapDevice,
        (op, _) => op,
    }
}

/// The pod step of a Mount job and its steps: SetUp (see
/// [`setup_steps_of`]), or MapPodDevice for a raw block target.
pub(crate) fn pod_step(want: &VolumeToMount, kind: TargetKind) -> (Operation, Steps) {
    match op_for(Operation::SetUp, kind) {
        Operation::SetUp => (Operation::SetUp, setup_steps_of(want)),
        op => (op, op_steps(op, want.plugin)),
    }
}

/// Whether `op` (any but SetUp, see [`setup_steps`]) on a target of
/// `plugin` is one syscall or several: formatting runs mkfs, every CSI
/// operation is an RPC whose effect is not one syscall the host shows, and
/// a pod's raw block map and unmap are a file, a bind, a symlink and the
/// loop device's hold (the host's map, whole, does not show the hold); the
/// mounts and unmounts of volumed's own plugins are one syscall, as are
/// the global map dir's mkdir and rmdir.
pub(crate) fn op_steps(op: Operation, plugin: PluginName) -> Steps {
    match (op, plugin) {
        (Operation::FormatDevice | Operation::MapPodDevice | Operation::UnmapPodDevice, _)
        | (_, PluginName::Csi) => Steps::Multi,
        _ => Steps::Single,
    }
}

/// The CSI arguments of a volume's targets, from its spec, plus what the
/// pod adds for its pod target (`pod`: the podInfoOnMount keys, fsGroup;
/// `read_only`: the pod's claim is read-only, so NodePublish gets
/// `readonly: true` as the kubelet sends the claim's `readOnly`).
fn csi_params(
    spec: &VolumeSpec,
    pod: Option<&CsiPodInfo>,
    read_only: bool,
) -> Option<Arc<CsiParams>> {
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
        read_only: c.read_only || read_only,
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

/// The parameters of a pod target, from what the DSW wants. A pod whose
/// claim is `readOnly` gets `ro` among its target's mount options (a local
/// PV's bind is then remounted read-only, and the merge expects the target
/// `ro`), or, for CSI, `readonly` in its publish call: the device target,
/// shared by every pod, stays as the PV says (the kubelet's MountDevice
/// takes the PV's options alone).
pub(crate) fn pod_params(layout: &Layout, want: &VolumeToMount) -> TargetParams {
    let (device_path, mut mount_options, fs_type) = spec_details(&want.spec);
    if want.read_only && !mount_options.is_read_only() && want.plugin != PluginName::Csi {
        mount_options = mount_options
            .iter()
            .cloned()
            .chain(["ro".to_owned()])
            .collect();
    }
    let kind = want.spec.pod_target_kind();
    let path = match kind {
        TargetKind::Block => layout.pod_device_map_path(&want.pod, want.plugin, &want.spec_name),
        _ => layout.pod_target_path(&want.pod, want.plugin, &want.spec_name),
    };
    TargetParams::at(
        want.volume.clone(),
        want.plugin,
        want.spec_name.clone(),
        TargetRef::Pod(want.pod.clone()),
        kind,
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
    .with_csi(csi_params(
        &want.spec,
        want.csi_pod.as_deref(),
        want.read_only,
    ))
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
        want.spec.device_target_kind().unwrap_or(TargetKind::Mount),
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
        false,
    ))
}

fn device_mount_path(layout: &Layout, want: &VolumeToMount) -> Option<SharedPath> {
    match (&*want.spec, want.spec.device_target_kind()) {
        (_, Some(TargetKind::Block)) if want.plugin == PluginName::LocalVolume => {
            Some(layout.local_block_map_dir(&want.spec_name).into())
        }
        (_, Some(_)) if want.plugin == PluginName::LocalVolume => {
            Some(layout.local_device_path(&want.spec_name).into())
        }
        // a CSI block volume's device target is its staging dir, keyed by
        // the spec name as the kubelet's block mapper keys it
        (VolumeSpec::Csi(_), Some(TargetKind::Block)) => {
            Some(layout.csi_block_staging_path(&want.spec_name).into())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{AccessMode, CsiSpec, PodUid, UniqueVolumeName};

    #[test]
    fn a_block_target_is_mapped_and_unmapped_never_mounted() {
        use Operation::*;
        let cases = [
            (MountDevice, TargetKind::Block, MapDevice),
            (SetUp, TargetKind::Block, MapPodDevice),
            (TearDown, TargetKind::Block, UnmapPodDevice),
            (UnmountDevice, TargetKind::Block, UnmapDevice),
            (FormatDevice, TargetKind::Block, FormatDevice),
            (MountDevice, TargetKind::Mount, MountDevice),
            (SetUp, TargetKind::Dir, SetUp),
            (TearDown, TargetKind::Mount, TearDown),
            (UnmountDevice, TargetKind::Mount, UnmountDevice),
        ];
        for (op, kind, want) in cases {
            assert_eq!(op_for(op, kind), want, "{op:?} on {kind:?}");
        }
    }

    #[test]
    fn a_block_local_pv_targets_are_the_kubelet_s_map_paths() {
        let spec = VolumeSpec::Local {
            path: "/dev/loop3".into(),
            fs_type: None,
            access_modes: vec![AccessMode::ReadWriteOnce],
            mount_options: Default::default(),
            is_block: true,
            volume_mode: crate::model::VolumeMode::Block,
        };
        let mut want = want(spec, false);
        want.spec_name = "pv-raw".into();
        let pod = want.pod.clone();
        let l = Layout::new("/k");
        let dev = device_params(&l, &want);
        assert_eq!(dev.kind, TargetKind::Block);
        assert_eq!(
            dev.device_mount_path(),
            Some(l.local_block_map_dir("pv-raw").as_path())
        );
        let p = pod_params(&l, &want);
        assert_eq!(p.kind, TargetKind::Block);
        assert_eq!(
            p.pod_mount_path.as_deref(),
            Some(
                l.pod_device_map_path(&pod, PluginName::LocalVolume, "pv-raw")
                    .as_path()
            )
        );
        assert_eq!(
            pod_step(&want, p.kind),
            (Operation::MapPodDevice, Steps::Multi)
        );
    }

    /// A CSI PV in `Block` mode: the device target is the kubelet's
    /// staging dir keyed by the spec name (not the handle's globalmount),
    /// the pod target the pod's `volumeDevices` link; every step an RPC,
    /// so multi-step; a filesystem CSI PV keeps its globalmount.
    #[test]
    fn a_block_csi_pv_targets_are_the_kubelet_s_block_paths() {
        let csi = |mode| {
            VolumeSpec::Csi(Box::new(CsiSpec {
                driver: "d.example.com".into(),
                volume_handle: "h".into(),
                volume_mode: mode,
                ..CsiSpec::default()
            }))
        };
        let l = Layout::new("/k");
        let hash = Layout::csi_handle_hash("h");
        let pod = PodUid::new("p1").unwrap();
        let table = [
            (
                crate::model::VolumeMode::Block,
                TargetKind::Block,
                l.csi_block_staging_path("pv-raw"),
                l.pod_device_map_path(&pod, PluginName::Csi, "pv-raw"),
                Operation::MapPodDevice,
            ),
            (
                crate::model::VolumeMode::Filesystem,
                TargetKind::Mount,
                l.csi_device_path("d.example.com", &hash),
                l.pod_target_path(&pod, PluginName::Csi, "pv-raw"),
                Operation::SetUp,
            ),
        ];
        for (mode, kind, device_path, pod_path, pod_op) in table {
            let mut w = want(csi(mode), false);
            w.spec_name = "pv-raw".into();
            let dev = device_params(&l, &w);
            assert_eq!(dev.kind, kind, "{mode:?}");
            assert_eq!(dev.device_mount_path(), Some(device_path.as_path()));
            let p = pod_params(&l, &w);
            assert_eq!(p.kind, kind, "{mode:?}");
            assert_eq!(p.pod_mount_path.as_deref(), Some(pod_path.as_path()));
            // the publish gets the staging path from the pod's params
            assert_eq!(p.device_mount_path(), Some(device_path.as_path()));
            assert_eq!(pod_step(&w, p.kind), (pod_op, Steps::Multi), "{mode:?}");
        }
    }

    fn want(spec: VolumeSpec, read_only: bool) -> VolumeToMount {
        VolumeToMount {
            volume: UniqueVolumeName::from_raw("v"),
            pod: PodUid::new("p1").unwrap(),
            plugin: spec.plugin(),
            spec: Arc::new(spec),
            spec_name: "pv1".into(),
            outer_name: "data".into(),
            selinux: None,
            csi_pod: None,
            read_only,
            fs_group: None,
        }
    }

    /// A pod's read-only claim: `ro` on a local PV's pod target (never its
    /// device target, which every pod shares), `readonly` in a CSI pod
    /// target's publish (never a mount flag the driver would get); the
    /// spec's own read-only holds whatever the pod says.
    #[test]
    fn a_read_only_claim_makes_only_the_pod_target_read_only() {
        let layout = Layout::new("/r");
        let local = |options: &[&str]| VolumeSpec::Local {
            path: "/dev/loop0".into(),
            fs_type: Some("ext4".into()),
            access_modes: vec![AccessMode::ReadWriteOnce],
            mount_options: options.iter().map(|o| o.to_string()).collect(),
            is_block: true,
            volume_mode: Default::default(),
        };
        let csi = |read_only| {
            VolumeSpec::Csi(Box::new(CsiSpec {
                driver: "d.example.com".into(),
                volume_handle: "h".into(),
                read_only,
                ..CsiSpec::default()
            }))
        };
        // (spec, pod's readOnly, pod options, pod read_only(), csi readonly)
        let table = [
            (local(&["noatime"]), false, vec!["noatime"], false, None),
            (local(&["noatime"]), true, vec!["noatime", "ro"], true, None),
            (local(&["ro"]), true, vec!["ro"], true, None),
            (local(&["ro"]), false, vec!["ro"], true, None),
            (csi(false), false, vec![], false, Some(false)),
            (csi(false), true, vec![], true, Some(true)),
            (csi(true), false, vec![], true, Some(true)),
        ];
        for (spec, read_only, options, ro, publish_ro) in table {
            let w = want(spec.clone(), read_only);
            let pod = pod_params(&layout, &w);
            let what = format!("{spec:?} read_only={read_only}");
            assert_eq!(&**pod.mount_options(), options, "{what}");
            assert_eq!(pod.read_only(), ro, "{what}");
            assert_eq!(pod.csi().map(|c| c.read_only), publish_ro, "{what}");
            let device = device_params(&layout, &w);
            assert!(
                !device.mount_options().contains(&"ro".to_owned()) || spec_ro(&spec),
                "{what}: the device target is as the PV says"
            );
            assert!(!device.read_only() || spec_ro(&spec), "{what}");
        }
    }

    fn spec_ro(spec: &VolumeSpec) -> bool {
        matches!(spec, VolumeSpec::Local { mount_options, .. } if mount_options.iter().any(|o| o == "ro"))
    }
}
