//! `kubernetes.io/csi`: volumes a CSI driver mounts, driven as the kubelet
//! drives them — MountDevice = `NodeStageVolume`, SetUp =
//! `NodePublishVolume`, TearDown = `NodeUnpublishVolume`, UnmountDevice =
//! `NodeUnstageVolume` — with the kubelet's paths and `vol_data.json`.
//!
//! Every argument comes from the target's journaled [`CsiParams`], so a
//! crashed call is re-run, and a staged or published volume undone, without
//! an API server. Secrets are journaled as references and read here, when
//! the call is made.
//!
//! What the host shows after a call is recorded in the outcome (the mount at
//! the path, or none): the spec leaves staging to the driver, and some
//! drivers publish without a mount (docs/merge-table.md, "CSI targets"). `vol_data.json` is
//! written whole, by a rename, before the call; with `--journal off` it is
//! also fsynced, since it is then the only record of the call's arguments
//! (the kubelet writes it unsynced and can lose it: k8s #108217).
//!
//! A driver without `STAGE_UNSTAGE_VOLUME` is never staged: MountDevice and
//! UnmountDevice complete without a call, and NodePublish gets no staging
//! path, as in the kubelet.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::csi::CsiError;
use crate::csi::client::{
    ExpandArgs, access_mode, block_capability, expand_request, mount_capability, proto_map,
};
use crate::csi::proto::csi_v1 as pb;
use crate::csi::registry::{Driver, Drivers};
use crate::host::sys::{Errno, Sys, mkdir_all_beneath};
use crate::journal::Permit;
use crate::model::{
    CsiLifecycle, CsiParams, Layout, MountIdentity, Operation, PluginName, SecretRef, TargetParams,
    TargetRef, VOL_DATA_FILE, VolumeSpec,
};
use crate::plugins::mount_ops::beneath;
use crate::plugins::{
    Action, Certainty, ExpandCall, Op, Outcome, PluginError, PluginResult, VolumePlugin,
};

/// Reads the Secrets a CSI call needs (`nodeStageSecretRef`,
/// `nodePublishSecretRef`, `nodeExpandSecretRef`) when the call is made.
pub trait SecretSource: Send + Sync + std::fmt::Debug {
    /// The Secret's data, or why it cannot be had.
    fn secret(&self, r: &SecretRef) -> Result<BTreeMap<String, String>, String>;
}

/// The CSI plugin.
#[derive(Debug, Clone)]
pub struct CsiPlugin {
    layout: Layout,
    node_name: String,
    drivers: Arc<Drivers>,
    secrets: Option<Arc<dyn SecretSource>>,
}

impl CsiPlugin {
    /// How long an RPC may take before volumed gives up on it.
    pub fn rpc_timeout(&self) -> std::time::Duration {
        self.drivers.timeout()
    }

    /// A plugin calling `drivers`, reading secrets from `secrets`.
    pub fn new(
        layout: Layout,
        node_name: &str,
        drivers: Arc<Drivers>,
        secrets: Option<Arc<dyn SecretSource>>,
    ) -> Self {
        Self {
            layout,
            node_name: node_name.to_owned(),
            drivers,
            secrets,
        }
    }

    fn csi<'p>(&self, op: &Op<'_>, params: &'p TargetParams) -> Result<&'p CsiParams, PluginError> {
        params
            .csi()
            .map(Arc::as_ref)
            .ok_or_else(|| op.missing("CSI arguments"))
    }

    /// The arguments an undo needs: the journal's, else — a target known
    /// only from the host, as after a restart with the journal off — the
    /// driver, handle and lifecycle from the `vol_data.json` beside it, as
    /// the kubelet reads them for its TearDown and UnmountDevice.
    fn undo_args(
        &self,
        op: &Op<'_>,
        params: &TargetParams,
        path: &Path,
    ) -> Result<Arc<CsiParams>, PluginError> {
        let missing = || op.missing("CSI arguments (neither a journal entry nor volume data)");
        match params.csi() {
            Some(c) => Ok(c.clone()),
            None => self.vol_data_args(op, &path.parent().ok_or_else(missing)?.join(VOL_DATA_FILE)),
        }
    }

    /// The driver, handle and lifecycle the `vol_data.json` at `file`
    /// holds (see [`Self::undo_args`]).
    fn vol_data_args(&self, op: &Op<'_>, file: &Path) -> Result<Arc<CsiParams>, PluginError> {
        let missing = || op.missing("CSI arguments (neither a journal entry nor volume data)");
        let data = crate::host::pod_dirs::read_vol_data(op.sys, file)
            .ok()
            .flatten()
            .ok_or_else(missing)?;
        data.csi_params().map(Arc::new).map_err(|_| missing())
    }

    fn driver(&self, op: &Op<'_>, csi: &CsiParams) -> Result<Arc<Driver>, PluginError> {
        self.drivers
            .get(&csi.driver)
            .map_err(|source| PluginError::Driver {
                op: op.op,
                volume: op.volume.clone(),
                cause: Box::new(source),
            })
    }

    /// NodeStageVolume's request for `csi` at `staging` with `capability`
    /// (a mount or a raw block one), its secret read now.
    fn stage_request(
        &self,
        op: &Op<'_>,
        csi: &CsiParams,
        staging: String,
        capability: pb::VolumeCapability,
    ) -> Result<pb::NodeStageVolumeRequest, PluginError> {
        Ok(pb::NodeStageVolumeRequest {
            volume_id: csi.volume_handle.clone(),
            publish_context: proto_map(&csi.publish_context),
            staging_target_path: staging,
            volume_capability: Some(capability),
            secrets: self
                .secret(op, csi.stage_secret.as_ref())?
                .into_iter()
                .collect(),
            volume_context: proto_map(&csi.volume_context),
        })
    }

    /// NodePublishVolume's request for `csi` at `target` (staged at
    /// `staging`, empty when not) with `capability`, its secret read now.
    fn publish_request(
        &self,
        op: &Op<'_>,
        csi: &CsiParams,
        staging: String,
        target: String,
        capability: pb::VolumeCapability,
    ) -> Result<pb::NodePublishVolumeRequest, PluginError> {
        Ok(pb::NodePublishVolumeRequest {
            volume_id: csi.volume_handle.clone(),
            publish_context: proto_map(&csi.publish_context),
            staging_target_path: staging,
            target_path: target,
            volume_capability: Some(capability),
            readonly: csi.read_only,
            secrets: self
                .secret(op, csi.publish_secret.as_ref())?
                .into_iter()
                .collect(),
            volume_context: proto_map(&csi.volume_context),
        })
    }

    fn secret(
        &self,
        op: &Op<'_>,
        r: Option<&SecretRef>,
    ) -> Result<BTreeMap<String, String>, PluginError> {
        let Some(r) = r else {
            return Ok(BTreeMap::new());
        };
        let found = match &self.secrets {
            Some(s) => s.secret(r),
            None => Err("no source of Secrets is configured".to_owned()),
        };
        found.map_err(|why| PluginError::Secret {
            op: op.op,
            volume: op.volume.clone(),
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            why,
        })
    }

    /// Writes `vol_data.json` into `dir` (made if missing): whole or not
    /// at all to a reader, and durable unless `permit` says the journal's
    /// intent already holds its facts. Undo steps read the journal first
    /// (`undo_args`), so its fsyncs, four per volume, would only slow a
    /// mass start down.
    fn write_vol_data(
        &self,
        op: &mut Op<'_>,
        permit: &Permit,
        dir: &Path,
        fields: &[(&str, &str)],
    ) -> Result<(), PluginError> {
        let root = self.layout.root();
        let at = beneath(op, root, dir)?;
        op.act(mkdir_all_beneath(op.sys, at, 0o750))?;
        let json: BTreeMap<&str, &str> = fields.iter().copied().collect();
        let bytes = serde_json::to_vec(&json).unwrap_or_default();
        let file = dir.join(VOL_DATA_FILE);
        let file_at = beneath(op, root, &file)?;
        op.act(if permit.journaled() {
            op.sys.write_file_beneath_unsynced(file_at, &bytes, 0o640)
        } else {
            op.sys.write_file_beneath(file_at, &bytes, 0o640)
        })
    }

    /// The mount the host shows at `path` after a call, if any.
    fn observe(&self, op: &Op<'_>, path: &Path) -> Result<Option<MountIdentity>, PluginError> {
        // one mount, not the table: a mass start stays linear
        match op.sys.mount_identity(path) {
            Ok(id) => Ok(id),
            Err(e) if e.errno() == Some(Errno::ENOENT) => Ok(None),
            Err(e) => Err(op.sys_err(e, false)),
        }
    }

    /// After an unpublish or unstage: the path must hold no mount; then the
    /// (empty) mount dir, `vol_data.json` and their dir go. Never deletes
    /// inside a mount: a path still mounted is an uncertain error.
    fn clean_up(
        &self,
        op: &mut Op<'_>,
        path: &Path,
    ) -> Result<Vec<std::path::PathBuf>, PluginError> {
        if let Ok(true) = op.sys.mount_root(path) {
            return Err(PluginError::StillMounted {
                op: op.op,
                volume: op.volume.clone(),
                path: path.to_owned(),
                tries: 1,
                certainty: Certainty::Uncertain,
            });
        }
        let root = self.layout.root();
        let at = beneath(op, root, path)?;
        let Some(dir) = at.parent() else {
            return Ok(Vec::new());
        };
        let data = dir.rel.join(VOL_DATA_FILE);
        let mut left = Vec::new();
        // the mount dir, vol_data.json, their dir; gone already is fine,
        // a dir not empty is left and reported
        for (rel, is_dir) in [(at.rel, true), (data.as_path(), false), (dir.rel, true)] {
            match op.sys.remove_beneath(root, rel, is_dir) {
                Err(e) if e.errno() == Some(Errno::ENOENT) => {}
                Err(e) if e.errno() == Some(Errno::ENOTEMPTY) => left.push(root.join(rel)),
                r => op.act(r)?,
            }
        }
        Ok(left)
    }

    /// A failed RPC: final when the driver's status is (the kubelet's
    /// `isFinalError`) — the dirs and `vol_data.json` made before the call
    /// change no mount state — else uncertain.
    fn rpc_err(&self, op: &Op<'_>, e: CsiError) -> PluginError {
        let certainty = if e.is_final() {
            Certainty::Final
        } else {
            Certainty::Uncertain
        };
        PluginError::Csi {
            op: op.op,
            volume: op.volume.clone(),
            certainty,
            cause: Box::new(e),
        }
    }

    /// The volume capability of a stage or publish call: fs type, mount
    /// flags (with `context="…"` when `labels` — the call that mounts the
    /// superblock: NodeStage when the volume is staged, else NodePublish),
    /// the fsGroup for a driver with VOLUME_MOUNT_GROUP, the access mode.
    fn capability(
        params: &TargetParams,
        csi: &CsiParams,
        driver: &Driver,
        labels: bool,
    ) -> pb::VolumeCapability {
        let mut flags = params.mount_options().to_vec();
        if labels && let Some(ctx) = params.selinux() {
            flags.push(format!("context=\"{}\"", ctx.as_str()));
        }
        let group = (driver.caps.volume_mount_group)
            .then_some(csi.mount_group.as_deref())
            .flatten();
        mount_capability(
            params.fs_type.as_deref(),
            &flags,
            group,
            access_mode(&csi.access_modes, driver.caps),
        )
    }

    /// Makes one call, its failure final or uncertain ([`Self::rpc_err`]).
    fn call<T>(
        &self,
        op: &mut Op<'_>,
        rpc: impl std::future::Future<Output = Result<T, CsiError>>,
    ) -> Result<T, PluginError> {
        let out = self
            .drivers
            .block_on(rpc)
            .map_err(|e| self.rpc_err(op, e))?;
        op.changed = true;
        Ok(out)
    }
}

/// The kubelet's name of the VolumeAttachment of `handle` by `driver` to
/// `node` (`getAttachmentName`: `csi-` and the hex SHA-256 of the three),
/// which it writes as `attachmentID` in `vol_data.json`.
pub(crate) fn attachment_name(handle: &str, driver: &str, node: &str) -> String {
    crate::model::sha256_hex("csi-", format!("{handle}{driver}{node}").as_bytes())
}

fn path_str(op: &Op<'_>, p: Option<&Path>, what: &'static str) -> Result<String, PluginError> {
    p.and_then(Path::to_str)
        .map(str::to_owned)
        .ok_or_else(|| op.missing(what))
}

impl VolumePlugin for CsiPlugin {
    fn name(&self) -> PluginName {
        PluginName::Csi
    }

    fn group_applied_by_driver(&self, params: &TargetParams) -> bool {
        let Some(csi) = params.csi() else {
            return false;
        };
        csi.mount_group.is_some()
            && self
                .drivers
                .get(&csi.driver)
                .is_ok_and(|d| d.caps.volume_mount_group)
    }

    fn mount_device(
        &self,
        permit: &Permit,
        _spec: &VolumeSpec,
        params: &TargetParams,
        sys: &dyn Sys,
    ) -> PluginResult {
        let mut op = Op::new(sys, Operation::MountDevice, params);
        let csi = self.csi(&op, params)?;
        let staging = path_str(&op, params.device_mount_path(), "staging path")?;
        let staging_path = Path::new(&staging);
        let driver = self.driver(&op, csi)?;
        if let Some(dir) = staging_path.parent() {
            self.write_vol_data(
                &mut op,
                permit,
                dir,
                &[
                    ("driverName", &csi.driver),
                    ("volumeHandle", &csi.volume_handle),
                ],
            )?;
        }
        // The staging dir is made even for a driver that is never staged:
        // after a restart its presence is what says "set up, no mount".
        let at = beneath(&op, self.layout.root(), staging_path)?;
        match op.sys.mkdir_beneath(at, 0o750) {
            Err(e) if e.errno() == Some(Errno::EEXIST) => {}
            r => op.act(r)?,
        }
        if !driver.caps.stage_unstage {
            return Ok(Outcome::of(Action::AlreadyInPlace));
        }
        let capability = Self::capability(params, csi, &driver, true);
        let req = self.stage_request(&op, csi, staging.clone(), capability)?;
        self.call(&mut op, driver.client.stage(req))?;
        Ok(Outcome::seen(
            Action::Performed,
            self.observe(&op, staging_path)?,
        ))
    }

    fn setup(
        &self,
        permit: &Permit,
        _spec: &VolumeSpec,
        params: &TargetParams,
        sys: &dyn Sys,
    ) -> PluginResult {
        let mut op = Op::new(sys, Operation::SetUp, params);
        let csi = self.csi(&op, params)?;
        let target = path_str(&op, params.pod_mount_path.as_deref(), "pod path")?;
        let target_path = Path::new(&target);
        if !matches!(params.target, TargetRef::Pod(_)) {
            return Err(op.missing("pod uid"));
        }
        let driver = self.driver(&op, csi)?;
        let selinux_label = params.selinux().map(|c| c.as_str().to_owned());
        let attachment_id = match (&csi.attachment_id, csi.lifecycle) {
            (Some(id), _) => id.clone(),
            (None, CsiLifecycle::Persistent) => {
                attachment_name(&csi.volume_handle, &csi.driver, &self.node_name)
            }
            (None, CsiLifecycle::Ephemeral) => String::new(),
        };
        if let Some(dir) = target_path.parent() {
            self.write_vol_data(
                &mut op,
                permit,
                dir,
                &[
                    ("specVolID", &params.spec_name),
                    ("volumeHandle", &csi.volume_handle),
                    ("driverName", &csi.driver),
                    ("nodeName", &self.node_name),
                    ("attachmentID", &attachment_id),
                    ("volumeLifecycleMode", csi.lifecycle.as_str()),
                    (
                        "seLinuxMountContext",
                        selinux_label.as_deref().unwrap_or_default(),
                    ),
                ],
            )?;
        }
        let staged = driver.caps.stage_unstage && csi.lifecycle == CsiLifecycle::Persistent;
        let staging = if staged {
            path_str(&op, params.device_mount_path(), "staging path")?
        } else {
            String::new()
        };
        let capability = Self::capability(params, csi, &driver, !staged);
        let req = self.publish_request(&op, csi, staging, target.clone(), capability)?;
        self.call(&mut op, driver.client.publish(req))?;
        Ok(Outcome::seen(
            Action::Performed,
            self.observe(&op, target_path)?,
        ))
    }

    fn teardown(&self, _permit: &Permit, params: &TargetParams, sys: &dyn Sys) -> PluginResult {
        let mut op = Op::new(sys, Operation::TearDown, params);
        let target = path_str(&op, params.pod_mount_path.as_deref(), "pod path")?;
        let csi = self.undo_args(&op, params, Path::new(&target))?;
        let driver = self.driver(&op, &csi)?;
        self.call(
            &mut op,
            driver.client.unpublish(&csi.volume_handle, &target),
        )?;
        let left = self.clean_up(&mut op, Path::new(&target))?;
        Ok(op.finished(left))
    }

    fn can_expand(&self, params: &TargetParams) -> bool {
        params.csi().is_some_and(|c| {
            self.drivers
                .get(&c.driver)
                .is_ok_and(|d| d.caps.expand_volume)
        })
    }

    /// NodeExpandVolume as the kubelet calls it: the pod's publish path
    /// as `volume_path` (for a raw block volume the publish *file*, the
    /// device path the kubelet's block mapper hands its expander, never
    /// the pod's `volumeDevices` link), the staging path when the driver
    /// stages, the PV's capacity as `required_bytes`, the capability
    /// (mount with the PV's fs type and mount options, or block) with the
    /// PV's first access mode. A driver answer below the request is
    /// refused.
    fn expand(
        &self,
        _permit: &Permit,
        params: &TargetParams,
        call: &ExpandCall<'_>,
        sys: &dyn Sys,
    ) -> Result<u64, PluginError> {
        let ExpandCall {
            required,
            block,
            secret,
        } = *call;
        let mut op = Op::new(sys, Operation::ExpandVolume, params);
        let csi = self.csi(&op, params)?;
        let target = match block {
            true => {
                let pod = params.target.pod().ok_or_else(|| op.missing("pod"))?;
                let publish = self.layout.csi_block_publish_path(&params.spec_name, pod);
                path_str(&op, Some(&publish), "publish path")?
            }
            false => path_str(&op, params.pod_mount_path.as_deref(), "pod path")?,
        };
        let driver = self.driver(&op, csi)?;
        let staged = driver.caps.stage_unstage && csi.lifecycle == CsiLifecycle::Persistent;
        let staging = match staged {
            true => Some(path_str(&op, params.device_mount_path(), "staging path")?),
            false => None,
        };
        let mode = access_mode(&csi.access_modes, driver.caps);
        let flags = params.mount_options().to_vec();
        let capability = match block {
            true => block_capability(mode),
            false => mount_capability(params.fs_type.as_deref(), &flags, None, mode),
        };
        // read now, as the kubelet reads it for each call: a Secret not
        // there fails this call (retried, its error on the claim), and its
        // bytes go to the driver only
        let pod = params.target.pod().map_or("", |p| p.as_str());
        let secrets = self.secret(&op, secret).map_err(|e| match e {
            PluginError::Secret {
                op,
                volume,
                namespace,
                name,
                why,
            } => PluginError::Expand {
                op,
                volume,
                cause: Box::new(crate::model::ExpandError::Secret {
                    pod: pod.to_owned(),
                    volume: params.spec_name.to_string(),
                    namespace,
                    name,
                    why,
                }),
            },
            e => e,
        })?;
        let req = expand_request(&ExpandArgs {
            volume_id: &csi.volume_handle,
            volume_path: &target,
            staging_path: staging.as_deref(),
            required_bytes: required,
            capability,
            secrets,
        });
        let answered = self.call(&mut op, driver.client.expand(req))?;
        crate::model::check_answer(pod, &params.spec_name, required, answered).map_err(
            |cause| PluginError::Expand {
                op: op.op,
                volume: op.volume.clone(),
                cause: Box::new(cause),
            },
        )?;
        Ok(answered)
    }

    fn map_device(
        &self,
        permit: &Permit,
        _spec: &VolumeSpec,
        params: &TargetParams,
        sys: &dyn Sys,
    ) -> PluginResult {
        self.stage_block(permit, params, sys)
    }

    fn map_pod_device(
        &self,
        permit: &Permit,
        _spec: &VolumeSpec,
        params: &TargetParams,
        sys: &dyn Sys,
    ) -> PluginResult {
        self.publish_block(permit, params, sys)
    }

    fn unmap_pod_device(
        &self,
        _permit: &Permit,
        params: &TargetParams,
        sys: &dyn Sys,
    ) -> PluginResult {
        self.unpublish_block(params, sys)
    }

    fn unmap_device(&self, _permit: &Permit, params: &TargetParams, sys: &dyn Sys) -> PluginResult {
        self.unstage_block(params, sys)
    }

    fn unmount_device(
        &self,
        _permit: &Permit,
        params: &TargetParams,
        sys: &dyn Sys,
    ) -> PluginResult {
        let mut op = Op::new(sys, Operation::UnmountDevice, params);
        let staging = path_str(&op, params.device_mount_path(), "staging path")?;
        let csi = self.undo_args(&op, params, Path::new(&staging))?;
        let driver = self.driver(&op, &csi)?;
        if driver.caps.stage_unstage {
            self.call(&mut op, driver.client.unstage(&csi.volume_handle, &staging))?;
        }
        let left = self.clean_up(&mut op, Path::new(&staging))?;
        Ok(op.finished(left))
    }
}

#[path = "csi_block.rs"]
mod raw;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_attachment_name_is_the_kubelets_hash_of_handle_driver_and_node() {
        let a = attachment_name("vol-1", "d.example.com", "node-1");
        assert!(a.starts_with("csi-") && a.len() == 4 + 64, "{a}");
        assert_eq!(
            a,
            crate::model::sha256_hex("csi-", b"vol-1d.example.comnode-1")
        );
        assert_ne!(a, attachment_name("vol-1", "d.example.com", "node-2"));
    }
}
