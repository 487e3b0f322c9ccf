//! What a CSI target needs beyond the common parameters: everything the
//! four node RPCs send, so a crashed NodeStage or NodePublish can be re-run,
//! and a staged or published volume undone, from the journal alone.
//!
//! *Invariant:* no secret's bytes live here. Secrets travel as references
//! ([`SecretRef`]) and are read when the RPC is made.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::AccessMode;

/// A Secret named by a PersistentVolume's `nodeStageSecretRef` or
/// `nodePublishSecretRef`, or by an inline volume's `nodePublishSecretRef`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SecretRef {
    /// the namespace (for an inline volume, the pod's)
    pub namespace: String,
    /// the Secret's name
    pub name: String,
}

/// The CSI volume lifecycle mode (the kubelet's `volumeLifecycleMode` in
/// `vol_data.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CsiLifecycle {
    /// a PersistentVolume: staged once, published per pod
    Persistent,
    /// an inline volume in the pod spec: published only
    Ephemeral,
}

impl CsiLifecycle {
    /// The spelling in `vol_data.json` and in the `csi.storage.k8s.io/ephemeral` key's sense.
    pub fn as_str(self) -> &'static str {
        match self {
            CsiLifecycle::Persistent => "Persistent",
            CsiLifecycle::Ephemeral => "Ephemeral",
        }
    }
}

/// What one pod adds to a CSI volume's publish call: the
/// `csi.storage.k8s.io/pod.*` keys when the CSIDriver has `podInfoOnMount`,
/// and the pod's fsGroup when the CSIDriver's `fsGroupPolicy` allows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsiPodInfo {
    /// keys added to the volume context
    pub volume_context: BTreeMap<String, String>,
    /// `securityContext.fsGroup`, sent as `volume_mount_group` when the
    /// driver has `VOLUME_MOUNT_GROUP`
    pub mount_group: Option<String>,
}

/// The CSI arguments of one target, journaled with its intent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsiParams {
    /// the driver name
    pub driver: String,
    /// the volume handle (`volume_id` in every RPC)
    pub volume_handle: String,
    /// persistent or inline ephemeral
    pub lifecycle: CsiLifecycle,
    /// the PV's access modes; the RPC's access mode is chosen from them and
    /// the driver's capabilities when the call is made, as the kubelet does
    pub access_modes: Vec<AccessMode>,
    /// `readonly` of NodePublish (the pod's volume mount or the PV's claim)
    pub read_only: bool,
    /// from the VolumeAttachment's `attachmentMetadata`
    pub publish_context: BTreeMap<String, String>,
    /// `volumeAttributes`, plus the `csi.storage.k8s.io/pod.*` keys when the
    /// CSIDriver has `podInfoOnMount`
    pub volume_context: BTreeMap<String, String>,
    /// `nodeStageSecretRef`
    pub stage_secret: Option<SecretRef>,
    /// `nodePublishSecretRef`
    pub publish_secret: Option<SecretRef>,
    /// the pod's fsGroup, sent as `volume_mount_group` when the driver has
    /// `VOLUME_MOUNT_GROUP` and the CSIDriver's `fsGroupPolicy` allows it
    pub mount_group: Option<String>,
    /// the VolumeAttachment's name, when the driver needs attaching
    pub attachment_id: Option<String>,
}
