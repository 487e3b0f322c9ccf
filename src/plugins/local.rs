//! `kubernetes.io/local-volume`: a local PersistentVolume.
//!
//! A **block device** (`spec.local.path` a device, with `fsType`, default
//! ext4 as in the kubelet):
//! - [`VolumePlugin::needs_format`] probes the device; only a device with no
//!   filesystem and no partition table needs one. [`VolumePlugin::format`]
//!   runs `mkfs.<fs>` and never reformats; it is its own step so the
//!   executor journals it (docs/journal-format.md).
//! - MountDevice mounts the device at `Layout::local_device_path(pv)` with
//!   the PV's mount options and, when a label is given, `context="…"`. It
//!   refuses an unformatted device and one holding another filesystem.
//! - SetUp bind-mounts the device mount into the pod target (the flags of
//!   the options, e.g. `ro`, applied by a bind remount); the bind inherits
//!   the superblock's label.
//!
//! A **directory**: no device target; SetUp bind-mounts the directory.
//!
//! A PV with **`volumeMode: Block`** is mapped raw (`block.rs`), as the
//! kubelet's local block mapper and volume path handler do: MapDevice
//! makes the global map dir `Layout::local_block_map_dir(pv)`;
//! MapPodDevice binds the device on the pod's file in it
//! (`local_block_pod_map`), links the pod's `volumeDevices` path to the
//! device and holds the device with a loop device backed by the pod's
//! file; the unmaps undo them, the hold first, then the symlink. The device is never
//! formatted nor mounted as a filesystem.
//!
//! Idempotency (docs/kubelet.md, "The reconciler"): a target already mounted with the
//! intended identity — (major:minor, root, fs type, `ro`, label), compared
//! through the mount table, not path strings — completes without a mount
//! call; a different mount there is unmounted first, never adopted.
//! TearDown / UnmountDevice unmount everything stacked at the target and
//! remove the (then empty) directory; they never delete contents.

use std::path::Path;

use crate::host::mountinfo::MountInfo;
use crate::host::sys::{Beneath, DiskFormat, Errno, FileKind, MsFlags, Sys};
use crate::journal::Permit;
use crate::model::{
    Layout, MountIdentity, Operation, PluginName, SharedPath, SharedStr, TargetParams, VolumeSpec,
};
use crate::plugins::mount_ops::{
    beneath, data_string, ensure_mounted, split_options, target_exists, unmount_target,
};
use crate::plugins::{Action, Op, Outcome, PluginError, PluginResult, VolumePlugin, block};

/// The filesystem used when neither the PV nor the params name one.
pub(crate) const DEFAULT_FS_TYPE: &str = "ext4";

/// The local PV plugin.
#[derive(Debug, Clone)]
pub struct LocalPlugin {
    layout: Layout,
}

impl LocalPlugin {
    /// A plugin for the layout under `layout` (its targets are reached
    /// beneath the root dir).
    pub fn new(layout: Layout) -> Self {
        Self { layout }
    }
}

/// The parts of a local spec the operations use.
struct Local<'s> {
    path: &'s Path,
    fs_type: Option<&'s str>,
    is_block: bool,
}

fn local<'s>(op: &Op<'_>, spec: &'s VolumeSpec) -> Result<Local<'s>, PluginError> {
    match spec {
        VolumeSpec::Local {
            path,
            fs_type,
            is_block,
            ..
        } => Ok(Local {
            path,
            fs_type: fs_type.as_deref(),
            is_block: *is_block,
        }),
        _ => Err(op.bad_spec(PluginName::LocalVolume, "not a local volume")),
    }
}

/// The block device and the filesystem type, for the device operations.
fn block<'a>(
    op: &Op<'_>,
    spec: &'a VolumeSpec,
    params: &'a TargetParams,
) -> Result<(&'a Path, &'a str), PluginError> {
    let l = local(op, spec)?;
    if !l.is_block {
        return Err(op.bad_spec(PluginName::LocalVolume, "a directory has no device target"));
    }
    let device = params.device_path().unwrap_or(l.path);
    let fs = params
        .fs_type
        .as_deref()
        .or(l.fs_type)
        .unwrap_or(DEFAULT_FS_TYPE);
    Ok((device, fs))
}

fn mismatch(op: &Op<'_>, device: &Path, found: String, wanted: &str) -> PluginError {
    PluginError::FormatMismatch {
        op: op.op,
        volume: op.volume.clone(),
        device: device.to_owned(),
        found,
        wanted: wanted.to_owned(),
    }
}

impl VolumePlugin for LocalPlugin {
    fn name(&self) -> PluginName {
        PluginName::LocalVolume
    }

    fn needs_format(
        &self,
        spec: &VolumeSpec,
        params: &TargetParams,
        sys: &dyn Sys,
    ) -> Result<bool, PluginError> {
        let op = Op::new(sys, Operation::FormatDevice, params);
        if !local(&op, spec)?.is_block {
            return Ok(false);
        }
        let (device, _) = block(&op, spec, params)?;
        Ok(op.look(sys.probe_fs(device))? == DiskFormat::Unformatted)
    }

    fn format(
        &self,
        _permit: &Permit,
        spec: &VolumeSpec,
        params: &TargetParams,
        sys: &dyn Sys,
    ) -> PluginResult {
        let mut op = Op::new(sys, Operation::FormatDevice, params);
        let (device, fs) = block(&op, spec, params)?;
        match op.look(sys.probe_fs(device))? {
            DiskFormat::Unformatted => {
                op.act(sys.mkfs(device, fs))?;
                Ok(Outcome::of(Action::Performed))
            }
            DiskFormat::Filesystem(_) => Ok(Outcome::of(Action::AlreadyInPlace)),
            DiskFormat::PartitionTable(pt) => {
                Err(mismatch(&op, device, format!("a {pt} partition table"), fs))
            }
        }
    }

    fn mount_device(
        &self,
        _permit: &Permit,
        spec: &VolumeSpec,
        params: &TargetParams,
        sys: &dyn Sys,
    ) -> PluginResult {
        let mut op = Op::new(sys, Operation::MountDevice, params);
        let (device, fs) = block(&op, spec, params)?;
        let target = params
            .device_mount_path()
            .ok_or_else(|| op.missing("device mount path"))?;
        match op.look(sys.probe_fs(device))? {
            DiskFormat::Filesystem(f) if f == fs => {}
            DiskFormat::Filesystem(f) => return Err(mismatch(&op, device, f, fs)),
            DiskFormat::PartitionTable(pt) => {
                return Err(mismatch(&op, device, format!("a {pt} partition table"), fs));
            }
            DiskFormat::Unformatted => {
                return Err(PluginError::NotFormatted {
                    op: op.op,
                    volume: op.volume.clone(),
                    device: device.to_owned(),
                });
            }
        }
        let st = op.look(sys.stat(device, true))?;
        if st.kind != FileKind::BlockDevice {
            return Err(op.wrong_type(device, "block device"));
        }
        let (flags, opts) = split_options(params.mount_options());
        let data = data_string(&opts, params.selinux());
        let want = MountIdentity {
            dev: st.rdev,
            root: SharedPath::fs_root(Path::new("/")),
            fs_type: SharedStr::fs_type(fs),
            read_only: flags.contains(MsFlags::MS_RDONLY),
            selinux: params.selinux().cloned(),
        };
        let wanted = |m: &MountInfo| want.matches(&m.identity());
        let mut mount = |op: &mut Op<'_>, at: Beneath<'_>| {
            let r = op
                .sys
                .mount_beneath(Some(device), at, Some(fs), flags, data.as_deref());
            op.act(r)
        };
        let root = self.layout.root();
        let (action, seen) = ensure_mounted(&mut op, root, target, &wanted, &mut mount)?;
        Ok(Outcome::seen(action, seen.map(|m| m.identity())))
    }

    fn setup(
        &self,
        _permit: &Permit,
        spec: &VolumeSpec,
        params: &TargetParams,
        sys: &dyn Sys,
    ) -> PluginResult {
        let mut op = Op::new(sys, Operation::SetUp, params);
        let l = local(&op, spec)?;
        let target = params
            .pod_mount_path
            .as_deref()
            .ok_or_else(|| op.missing("pod mount path"))?;
        let (flags, _) = split_options(params.mount_options());
        let (source, source_id) = if l.is_block {
            let source = params
                .device_mount_path()
                .ok_or_else(|| op.missing("device mount path"))?;
            // the one device mount, not the table: a mass start of local
            // PVs stays linear
            let found = match sys.mount_identity(source) {
                Err(e) if e.errno() == Some(Errno::ENOENT) => None,
                r => op.look(r)?,
            };
            let Some(id) = found else {
                return Err(PluginError::DeviceNotMounted {
                    op: op.op,
                    volume: op.volume.clone(),
                    path: source.to_owned(),
                });
            };
            (source, Some(id))
        } else {
            if op.look(sys.stat(l.path, true))?.kind != FileKind::Dir {
                return Err(op.wrong_type(l.path, "directory"));
            }
            // A directory PV bound on a target that does not exist yet
            // (every first SetUp) needs no identity: nothing is there to
            // tell apart from our bind.
            let id = if target_exists(&op, target) {
                op.look(sys.read_mountinfo())?.identity_at(l.path)
            } else {
                None
            };
            (l.path, id)
        };
        let want = source_id.map(|mut id| {
            id.read_only = flags.contains(MsFlags::MS_RDONLY);
            id
        });
        let wanted = |m: &MountInfo| want.as_ref().is_some_and(|w| w.matches(&m.identity()));
        // A device mount (under the root's `plugins/`) is bound from beneath
        // the root, as the target is reached: a symlink swapped in on its way
        // cannot make the pod see another directory. A directory PV's path
        // is the operator's, outside the root by design.
        let root = self.layout.root();
        let source_at = l.is_block.then(|| beneath(&op, root, source)).transpose()?;
        let mut mount = |op: &mut Op<'_>, at: Beneath<'_>| {
            let r = match source_at {
                Some(from) => op.sys.bind_beneath(from, at),
                None => op
                    .sys
                    .mount_beneath(Some(source), at, None, MsFlags::MS_BIND, None),
            };
            op.act(r)?;
            if !flags.is_empty() {
                let remount = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | flags;
                let r = op.sys.mount_beneath(None, at, None, remount, None);
                op.act(r)?;
            }
            Ok(())
        };
        let (action, seen) = ensure_mounted(&mut op, root, target, &wanted, &mut mount)?;
        Ok(Outcome::seen(action, seen.map(|m| m.identity())))
    }

    fn map_device(
        &self,
        _permit: &Permit,
        spec: &VolumeSpec,
        params: &TargetParams,
        sys: &dyn Sys,
    ) -> PluginResult {
        let mut op = Op::new(sys, Operation::MapDevice, params);
        let l = local(&op, spec)?;
        block::device_of(&op, params.device_path().unwrap_or(l.path))?;
        let dir = params
            .device_mount_path()
            .ok_or_else(|| op.missing("global map path"))?;
        block::make_map_dir(&mut op, self.layout.root(), dir)?;
        Ok(op.finished(Vec::new()))
    }

    fn map_pod_device(
        &self,
        _permit: &Permit,
        spec: &VolumeSpec,
        params: &TargetParams,
        sys: &dyn Sys,
    ) -> PluginResult {
        let mut op = Op::new(sys, Operation::MapPodDevice, params);
        let l = local(&op, spec)?;
        let device = params.device_path().unwrap_or(l.path);
        let dev = block::device_of(&op, device)?;
        let pod = params.target.pod().ok_or_else(|| op.missing("pod"))?;
        let link = params
            .pod_mount_path
            .as_deref()
            .ok_or_else(|| op.missing("pod device map path"))?;
        let root = self.layout.root();
        // the bind first, then the link the runtime hands to containers
        let file = self.layout.local_block_pod_map(&params.spec_name, pod);
        block::bind_device_file(&mut op, root, device, &dev, &file)?;
        block::link_pod_device(&mut op, root, device, link)?;
        block::hold_device(&mut op, root, &file)?;
        Ok(op.finished(Vec::new()))
    }

    fn unmap_pod_device(
        &self,
        _permit: &Permit,
        params: &TargetParams,
        sys: &dyn Sys,
    ) -> PluginResult {
        let mut op = Op::new(sys, Operation::UnmapPodDevice, params);
        let pod = params.target.pod().ok_or_else(|| op.missing("pod"))?;
        let link = params
            .pod_mount_path
            .as_deref()
            .ok_or_else(|| op.missing("pod device map path"))?;
        let root = self.layout.root();
        // the hold goes first (its loop device keeps the pod's bind busy),
        // then the link the containers use, then the pod's bind
        let file = self.layout.local_block_pod_map(&params.spec_name, pod);
        block::release_device(&mut op, root, &file)?;
        block::unlink_pod_device(&mut op, root, link)?;
        block::unbind_device_file(&mut op, root, &file)?;
        Ok(op.finished(Vec::new()))
    }

    fn unmap_device(&self, _permit: &Permit, params: &TargetParams, sys: &dyn Sys) -> PluginResult {
        let mut op = Op::new(sys, Operation::UnmapDevice, params);
        let dir = params
            .device_mount_path()
            .ok_or_else(|| op.missing("global map path"))?;
        block::remove_map_dir(&mut op, self.layout.root(), dir)?;
        Ok(op.finished(Vec::new()))
    }

    fn teardown(&self, _permit: &Permit, params: &TargetParams, sys: &dyn Sys) -> PluginResult {
        let mut op = Op::new(sys, Operation::TearDown, params);
        let target = params
            .pod_mount_path
            .as_deref()
            .ok_or_else(|| op.missing("pod mount path"))?;
        unmount_target(&mut op, self.layout.root(), target)
    }

    fn unmount_device(
        &self,
        _permit: &Permit,
        params: &TargetParams,
        sys: &dyn Sys,
    ) -> PluginResult {
        let mut op = Op::new(sys, Operation::UnmountDevice, params);
        let target = params
            .device_mount_path()
            .ok_or_else(|| op.missing("device mount path"))?;
        unmount_target(&mut op, self.layout.root(), target)
    }
}

#[cfg(test)]
#[path = "local_tests.rs"]
mod tests;
