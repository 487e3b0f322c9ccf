//! Forced cleanup of a target reconstruction could not rebuild (KEP-3756's
//! one-time cleanup of failed reconstructions; the kubelet's
//! `cleanupMounts`): no spec, no plugin-specific step — only what is still
//! mounted at the target is unmounted, and its mount-point directory is
//! removed if it is empty. Nothing is ever deleted inside a mount point: a
//! target with a nested mount fails to unmount (`EBUSY`, never
//! `MNT_DETACH`) and a directory that is not empty is left and reported.
//!
//! A device target is refused while any mount under `pods/` shares the
//! device of any mount stacked there (a pod still uses it; "in use" is
//! decided by major:minor).

use crate::host::sys::Sys;
use crate::journal::Permit;
use crate::model::{Layout, Operation, TargetParams, TargetRef};
use crate::plugins::mount_ops::unmount_target;
use crate::plugins::{Op, PluginError, PluginResult};

/// Unmounts everything stacked at the target of `params` (the pod mount
/// path for a pod target, the device mount path for a device target) and
/// removes its directory (beneath the root dir) if it is then empty. A
/// device target is refused while a mount below `<root>/pods` shares the
/// device.
pub fn force_unmount(
    _permit: &Permit,
    params: &TargetParams,
    sys: &dyn Sys,
    layout: &Layout,
) -> PluginResult {
    let pods_dir = &layout.pods_dir();
    let (op_name, target) = match params.target {
        TargetRef::Pod(_) => (Operation::TearDown, params.pod_mount_path.as_deref()),
        TargetRef::Device => (Operation::UnmountDevice, params.device_mount_path()),
    };
    let mut op = Op::new(sys, op_name, params);
    let target = target.ok_or_else(|| op.missing("target path"))?;
    if params.target == TargetRef::Device {
        let table = op.look(sys.read_mountinfo())?;
        // every mount stacked at the target is unmounted, so every one of
        // their devices must be free of pod mounts, not only the top's
        if let Some(user) = table.at(target).find_map(|m| {
            table
                .by_dev(m.dev)
                .find(|u| u.mount_point.starts_with(pods_dir))
        }) {
            return Err(PluginError::DeviceInUse {
                op: op_name,
                volume: params.volume.clone(),
                path: target.to_owned(),
                user: user.mount_point.clone(),
            });
        }
    }
    unmount_target(&mut op, layout.root(), target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::recording_sys::RecordingSys;
    use crate::model::{PluginName, PodUid, TargetKind, UniqueVolumeName};
    use crate::plugins::Action;
    use std::path::Path;

    fn params(target: TargetRef, path: &str) -> TargetParams {
        TargetParams::at(
            UniqueVolumeName::from_raw("kubernetes.io/csi/pv-x"),
            PluginName::Csi,
            "pv-x".into(),
            target,
            TargetKind::Mount,
            Some(Path::new(path).into()),
        )
    }

    #[test]
    fn a_missing_target_path_is_an_error_not_a_guess() {
        let sys = RecordingSys::new();
        let mut p = params(TargetRef::Device, "/r/x");
        p = p.with_device_mount_path(None);
        let err = force_unmount(&Permit::JournalOff, &p, &sys, &Layout::new("/r")).unwrap_err();
        assert!(matches!(err, PluginError::MissingParam { .. }), "{err}");
    }

    #[test]
    fn nothing_mounted_and_no_dir_is_already_clean() {
        let sys = RecordingSys::new();
        let uid = PodUid::new("p1").unwrap();
        let p = params(
            TargetRef::Pod(uid),
            "/r/pods/p1/volumes/kubernetes.io~csi/pv-x/mount",
        );
        let out = force_unmount(&Permit::JournalOff, &p, &sys, &Layout::new("/r")).unwrap();
        assert_eq!(out.action, Action::AlreadyInPlace);
        assert!(out.left_behind.is_empty());
    }

    #[test]
    fn a_mounted_pod_target_is_unmounted_and_its_empty_dir_removed() {
        let sys = RecordingSys::new();
        let target = Path::new("/r/pods/p1/volumes/kubernetes.io~csi/pv-x/mount");
        sys.add(target, crate::host::sys::FileKind::Dir);
        sys.preset_mount(
            None,
            target,
            Some("tmpfs"),
            crate::host::sys::MsFlags::empty(),
            None,
        )
        .unwrap();
        let uid = PodUid::new("p1").unwrap();
        let p = params(TargetRef::Pod(uid), target.to_str().unwrap());
        let out = force_unmount(&Permit::JournalOff, &p, &sys, &Layout::new("/r")).unwrap();
        assert_eq!(out.action, Action::Performed);
        assert!(sys.mounts().is_empty(), "{:?}", sys.mounts());
        assert!(!sys.exists(target));
    }

    #[test]
    fn a_device_target_a_pod_still_binds_is_refused() {
        let sys = RecordingSys::new();
        let global = Path::new("/r/plugins/kubernetes.io/csi/d/h/globalmount");
        let bind = Path::new("/r/pods/p1/volumes/kubernetes.io~csi/pv-x/mount");
        sys.add(global, crate::host::sys::FileKind::Dir);
        sys.add(bind, crate::host::sys::FileKind::Dir);
        let flags = crate::host::sys::MsFlags::empty();
        sys.preset_mount(None, global, Some("tmpfs"), flags, None)
            .unwrap();
        sys.preset_mount(
            Some(global),
            bind,
            None,
            crate::host::sys::MsFlags::MS_BIND,
            None,
        )
        .unwrap();
        let p = params(TargetRef::Device, global.to_str().unwrap());
        let err = force_unmount(&Permit::JournalOff, &p, &sys, &Layout::new("/r")).unwrap_err();
        assert!(matches!(err, PluginError::DeviceInUse { .. }), "{err}");
        assert_eq!(sys.mounts().len(), 2, "nothing unmounted");
        assert!(sys.mutations().is_empty(), "{:?}", sys.mutations());

        // a second mount stacked over the global one: the device a pod
        // binds is under the top, and still refused
        sys.preset_mount(None, global, Some("tmpfs"), flags, None)
            .unwrap();
        let err = force_unmount(&Permit::JournalOff, &p, &sys, &Layout::new("/r")).unwrap_err();
        assert!(matches!(err, PluginError::DeviceInUse { .. }), "{err}");
        assert_eq!(sys.mounts().len(), 3, "nothing unmounted");
        assert!(sys.mutations().is_empty(), "{:?}", sys.mutations());
    }
}
