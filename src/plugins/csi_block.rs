//! CSI raw block volumes (`volumeMode: Block`), driven as the kubelet's
//! CSI block mapper drives them (docs/csi.md, "Raw block volumes"):
//!
//! - MapDevice = `NodeStageVolume` with the block access type at
//!   `Layout::csi_block_staging_path` (a dir made first; no call for a
//!   driver without STAGE_UNSTAGE_VOLUME);
//! - MapPodDevice = `NodePublishVolume` with the block access type at the
//!   pod's publish *file* (`Layout::csi_block_publish_path`, its dir made
//!   first, the file the driver's), then the device found there bound on
//!   the pod's file in the global map path (`Layout::csi_block_pod_map`)
//!   and the pod's `volumeDevices` symlink made to the publish file, then
//!   the device held open by a loop device over the pod's file, as the
//!   kubelet's `MapBlockVolume` does (`block.rs`);
//! - UnmapPodDevice: the hold, the symlink, the bind, then `NodeUnpublishVolume`
//!   (skipped when the publish file is gone, as the kubelet skips it);
//! - UnmapDevice: `NodeUnstageVolume`, then the staging dir, the publish
//!   dir, the global map path and `vol_data.json` go, each only if empty.
//!
//! `vol_data.json` (the kubelet's keys for a block volume: no lifecycle,
//! no SELinux key) is written under the volume's `data` dir before each
//! map call (whole, by a rename; fsynced only with `--journal off`, as
//! for a filesystem volume), as the kubelet rewrites it whenever it
//! builds a mapper; an undo without the journal's arguments reads it
//! back.

use std::path::Path;
use std::sync::Arc;

use super::{CsiPlugin, attachment_name, path_str};
use crate::csi::CsiError;
use crate::csi::client::{access_mode, block_capability};
use crate::host::sys::{Errno, Sys, mkdir_all_beneath};
use crate::journal::Permit;
use crate::model::{CsiParams, Operation, TargetParams};
use crate::plugins::mount_ops::beneath;
use crate::plugins::{Certainty, Op, PluginError, PluginResult, block};

/// The mode of the dirs made before a call, as the kubelet makes them.
const DIR_MODE: u32 = 0o750;

impl CsiPlugin {
    /// Makes one call with the block access type (see [`block_refusal`]).
    fn call_block(
        &self,
        op: &mut Op<'_>,
        rpc: impl std::future::Future<Output = Result<(), CsiError>>,
    ) -> Result<(), PluginError> {
        self.call(op, rpc).map_err(block_refusal)
    }

    /// Writes the volume's `vol_data.json` with the kubelet's block keys.
    fn write_block_vol_data(
        &self,
        op: &mut Op<'_>,
        permit: &Permit,
        params: &TargetParams,
        csi: &CsiParams,
    ) -> Result<(), PluginError> {
        let attachment_id = match &csi.attachment_id {
            Some(id) => id.clone(),
            None => attachment_name(&csi.volume_handle, &csi.driver, &self.node_name),
        };
        let dir = self.layout.csi_block_data_dir(&params.spec_name);
        self.write_vol_data(
            op,
            permit,
            &dir,
            &[
                ("specVolID", &params.spec_name),
                ("volumeHandle", &csi.volume_handle),
                ("driverName", &csi.driver),
                ("nodeName", &self.node_name),
                ("attachmentID", &attachment_id),
            ],
        )
    }

    /// The arguments of an undo: the journal's, else the volume's
    /// `vol_data.json`.
    fn block_undo_args(
        &self,
        op: &Op<'_>,
        params: &TargetParams,
    ) -> Result<Arc<CsiParams>, PluginError> {
        match params.csi() {
            Some(c) => Ok(c.clone()),
            None => self.vol_data_args(op, &self.layout.csi_block_vol_data(&params.spec_name)),
        }
    }

    /// Whether `path` (beneath the root) exists, by `lstat`.
    fn exists(&self, op: &Op<'_>, path: &Path) -> Result<bool, PluginError> {
        let at = beneath(op, self.layout.root(), path)?;
        match op.sys.stat_beneath(at) {
            Ok(_) => Ok(true),
            Err(e) if e.errno() == Some(Errno::ENOENT) => Ok(false),
            Err(e) => Err(op.sys_err(e, false)),
        }
    }

    /// MapDevice: the volume data, the staging dir, NodeStageVolume.
    pub(super) fn stage_block(
        &self,
        permit: &Permit,
        params: &TargetParams,
        sys: &dyn Sys,
    ) -> PluginResult {
        let mut op = Op::new(sys, Operation::MapDevice, params);
        let csi = self.csi(&op, params)?;
        let staging = path_str(&op, params.device_mount_path(), "staging path")?;
        let driver = self.driver(&op, csi)?;
        self.write_block_vol_data(&mut op, permit, params, csi)?;
        // made even for a driver never staged, as for a filesystem volume
        let at = beneath(&op, self.layout.root(), Path::new(&staging))?;
        op.act(mkdir_all_beneath(op.sys, at, DIR_MODE))?;
        if driver.caps.stage_unstage {
            let capability = block_capability(access_mode(&csi.access_modes, driver.caps));
            let req = self.stage_request(&op, csi, staging, capability)?;
            self.call_block(&mut op, driver.client.stage(req))?;
        }
        Ok(op.finished(Vec::new()))
    }

    /// MapPodDevice: NodePublishVolume at the pod's publish file, then the
    /// device there bound on the pod's map file and the pod's symlink.
    pub(super) fn publish_block(
        &self,
        permit: &Permit,
        params: &TargetParams,
        sys: &dyn Sys,
    ) -> PluginResult {
        let mut op = Op::new(sys, Operation::MapPodDevice, params);
        let csi = self.csi(&op, params)?;
        let pod = params.target.pod().ok_or_else(|| op.missing("pod"))?;
        let link = params
            .pod_mount_path
            .as_deref()
            .ok_or_else(|| op.missing("pod device map path"))?;
        let driver = self.driver(&op, csi)?;
        self.write_block_vol_data(&mut op, permit, params, csi)?;
        let root = self.layout.root();
        let publish = self.layout.csi_block_publish_path(&params.spec_name, pod);
        let publish_str = path_str(&op, Some(&publish), "publish path")?;
        if let Some(dir) = publish.parent() {
            let at = beneath(&op, root, dir)?;
            op.act(mkdir_all_beneath(op.sys, at, DIR_MODE))?;
        }
        let staging = match driver.caps.stage_unstage {
            true => path_str(&op, params.device_mount_path(), "staging path")?,
            false => String::new(),
        };
        let capability = block_capability(access_mode(&csi.access_modes, driver.caps));
        let req = self.publish_request(&op, csi, staging, publish_str, capability)?;
        self.call_block(&mut op, driver.client.publish(req))?;
        // The driver put the device at the publish path (a bind of it, or
        // a device node; a symlink to one is followed, as the kubelet's
        // bind from that path follows it). What is there now is
        // published: anything but a block device is the driver's fault,
        // and the call is made again.
        // Every failure from here on leaves the publish done: uncertain
        // (a kernel call's error is, once the call changed the host).
        let dev = block::device_of(&op, &publish).map_err(after_call)?;
        let file = self.layout.csi_block_pod_map(&params.spec_name, pod);
        block::bind_device_file(&mut op, root, &publish, &dev, &file).map_err(after_call)?;
        block::link_pod_device(&mut op, root, &publish, link).map_err(after_call)?;
        // held open while the pod maps it, as the kubelet's MapBlockVolume
        // holds a CSI device too
        block::hold_device(&mut op, root, &file).map_err(after_call)?;
        Ok(op.finished(Vec::new()))
    }

    /// UnmapPodDevice: the pod's symlink, its bind, then NodeUnpublish
    /// (none when the publish file is gone: the kubelet's skip).
    pub(super) fn unpublish_block(&self, params: &TargetParams, sys: &dyn Sys) -> PluginResult {
        let mut op = Op::new(sys, Operation::UnmapPodDevice, params);
        let pod = params.target.pod().ok_or_else(|| op.missing("pod"))?;
        let link = params
            .pod_mount_path
            .as_deref()
            .ok_or_else(|| op.missing("pod device map path"))?;
        let csi = self.block_undo_args(&op, params)?;
        let driver = self.driver(&op, &csi)?;
        let root = self.layout.root();
        // the hold first (its loop device keeps the pod's bind busy), then
        // the link, then the bind, then the driver's publish
        let file = self.layout.csi_block_pod_map(&params.spec_name, pod);
        block::release_device(&mut op, root, &file)?;
        block::unlink_pod_device(&mut op, root, link)?;
        block::unbind_device_file(&mut op, root, &file)?;
        let publish = self.layout.csi_block_publish_path(&params.spec_name, pod);
        if self.exists(&op, &publish)? {
            let target = path_str(&op, Some(&publish), "publish path")?;
            self.call(
                &mut op,
                driver.client.unpublish(&csi.volume_handle, &target),
            )?;
        }
        Ok(op.finished(Vec::new()))
    }

    /// UnmapDevice: NodeUnstage, then the volume's dirs and data, the
    /// kubelet's cleanup after it; a dir not empty is left and reported.
    pub(super) fn unstage_block(&self, params: &TargetParams, sys: &dyn Sys) -> PluginResult {
        let mut op = Op::new(sys, Operation::UnmapDevice, params);
        let staging = path_str(&op, params.device_mount_path(), "staging path")?;
        let staging_path = Path::new(&staging);
        let csi = self.block_undo_args(&op, params)?;
        let driver = self.driver(&op, &csi)?;
        if driver.caps.stage_unstage && self.exists(&op, staging_path)? {
            self.call(&mut op, driver.client.unstage(&csi.volume_handle, &staging))?;
        }
        let root = self.layout.root();
        // never delete inside a mount: a staging dir the driver left
        // mounted is an uncertain error, retried
        let at = beneath(&op, root, staging_path)?;
        if let Ok(true) = op.sys.mount_root_beneath(at) {
            return Err(PluginError::StillMounted {
                op: op.op,
                volume: op.volume.clone(),
                path: staging_path.to_owned(),
                tries: 1,
                certainty: Certainty::Uncertain,
            });
        }
        let spec = params.spec_name.as_str();
        let l = &self.layout;
        let leftovers = [
            (staging_path.to_owned(), true),
            (l.csi_block_publish_dir(spec), true),
            (l.csi_block_map_dir(spec), true),
            (l.csi_block_vol_data(spec), false),
            (l.csi_block_data_dir(spec), true),
            (l.csi_block_volume_dir(spec), true),
        ];
        let mut left = Vec::new();
        for (path, is_dir) in leftovers {
            let at = beneath(&op, root, &path)?;
            match op.sys.remove_beneath(at.base, at.rel, is_dir) {
                Err(e) if e.errno() == Some(Errno::ENOENT) => {}
                Err(e) if e.errno() == Some(Errno::ENOTEMPTY) => left.push(path),
                r => op.act(r)?,
            }
        }
        Ok(op.finished(left))
    }
}

/// A stage or publish call with the block access type refused as an
/// invalid argument: the driver has no raw block volumes (the error says
/// the PV's `volumeMode`); any other failure is left as it is.
fn block_refusal(e: PluginError) -> PluginError {
    match e {
        PluginError::Csi {
            op, volume, cause, ..
        } if cause.code == tonic::Code::InvalidArgument => {
            PluginError::BlockRefused { op, volume, cause }
        }
        e => e,
    }
}

/// A path of the wrong type found after the driver's call succeeded:
/// uncertain, not final (see [`PluginError::WrongTypeAfterCall`]); any
/// other error is as it is.
fn after_call(e: PluginError) -> PluginError {
    match e {
        PluginError::WrongType {
            op,
            volume,
            path,
            expected,
        } => PluginError::WrongTypeAfterCall {
            op,
            volume,
            path,
            expected,
        },
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_type_after_the_call_is_uncertain() {
        let volume = crate::model::UniqueVolumeName::from_raw("kubernetes.io/csi/d^h".to_owned());
        let wrong = PluginError::WrongType {
            op: Operation::MapPodDevice,
            volume: volume.clone(),
            path: "/k/plugins/kubernetes.io/csi/volumeDevices/publish/pv/u".into(),
            expected: "block device",
        };
        assert_eq!(wrong.certainty(), Certainty::Final);
        let e = after_call(wrong);
        assert_eq!(e.certainty(), Certainty::Uncertain);
        assert!(
            e.to_string()
                .contains("is not a block device after the driver's call"),
            "{e}"
        );
        let other = after_call(PluginError::MissingParam {
            op: Operation::MapPodDevice,
            volume,
            what: "pod",
        });
        assert!(matches!(other, PluginError::MissingParam { .. }));
    }

    #[test]
    fn an_invalid_argument_to_a_block_call_says_the_volume_mode() {
        let volume = crate::model::UniqueVolumeName::from_raw("kubernetes.io/csi/d^h".to_owned());
        let csi_err = |code| PluginError::Csi {
            op: Operation::MapDevice,
            volume: volume.clone(),
            certainty: Certainty::Final,
            cause: Box::new(CsiError {
                driver: "d.example.com".to_owned(),
                method: "NodeStageVolume",
                code,
                message: "block volumes are not supported".to_owned(),
            }),
        };
        let table = [
            (tonic::Code::InvalidArgument, true),
            (tonic::Code::Internal, false),
            (tonic::Code::Unavailable, false),
            (tonic::Code::FailedPrecondition, false),
        ];
        for (code, refused) in table {
            let e = block_refusal(csi_err(code));
            assert_eq!(
                matches!(e, PluginError::BlockRefused { .. }),
                refused,
                "{code:?}"
            );
            let text = e.to_string();
            assert!(text.contains("kubernetes.io/csi/d^h"), "{text}");
            if refused {
                assert!(text.contains("volumeMode is Block"), "{text}");
                assert!(text.contains("d.example.com"), "{text}");
                assert_eq!(e.certainty(), Certainty::Final);
            }
        }
    }
}
