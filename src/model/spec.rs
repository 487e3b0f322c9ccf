//! What a volume is (`VolumeSpec`) and how one pod wants it (`PodVolume`).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{
    CsiPodInfo, FsGroup, PayloadSpec, PluginName, PodUid, SeLinuxContext, SecretRef, SharedPath,
    TargetKind, UniqueVolumeName,
};

/// emptyDir storage medium.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StorageMedium {
    /// The node's disk: a plain directory.
    Disk,
    /// `medium: Memory`: a tmpfs.
    Memory,
}

/// hostPath `type` checks, as the kubelet does them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum HostPathType {
    /// `""`: no check.
    Unset,
    /// `DirectoryOrCreate`
    DirectoryOrCreate,
    /// `Directory`
    Directory,
    /// `FileOrCreate`
    FileOrCreate,
    /// `File`
    File,
    /// `Socket`
    Socket,
    /// `CharDevice`
    CharDevice,
    /// `BlockDevice`
    BlockDevice,
}

/// A PersistentVolume's `volumeMode`: a filesystem the pod mounts, or a
/// raw block device the pod maps (`volumeDevices`). Inline volumes are
/// always `Filesystem`, as the kubelet's `GetVolumeMode` says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum VolumeMode {
    /// `Filesystem` (the default when unset)
    #[default]
    Filesystem,
    /// `Block`
    Block,
}

impl VolumeMode {
    /// The API's spelling, as the kubelet's messages print it.
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeMode::Filesystem => "Filesystem",
            VolumeMode::Block => "Block",
        }
    }

    /// The API field as written: unset is `Filesystem`; anything but the
    /// two known values is `None`.
    pub fn parse(raw: Option<&str>) -> Option<VolumeMode> {
        match raw {
            None | Some("Filesystem") => Some(VolumeMode::Filesystem),
            Some("Block") => Some(VolumeMode::Block),
            Some(_) => None,
        }
    }
}

/// PV access modes, ordered as the kubelet's SELinux metrics rank them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AccessMode {
    /// ReadWriteOncePod
    ReadWriteOncePod,
    /// ReadWriteOnce
    ReadWriteOnce,
    /// ReadOnlyMany
    ReadOnlyMany,
    /// ReadWriteMany
    ReadWriteMany,
}

/// What a volume is, with everything a plugin needs to mount and unmount it
/// without an API server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum VolumeSpec {
    /// An emptyDir.
    EmptyDir {
        /// disk or memory
        medium: StorageMedium,
        /// `sizeLimit` in bytes
        size_limit: Option<u64>,
    },
    /// A hostPath.
    HostPath {
        /// the host path (shared with the parameters of its targets)
        path: SharedPath,
        /// the type check
        host_path_type: HostPathType,
    },
    /// A local PersistentVolume.
    Local {
        /// `spec.local.path`: a block device or a directory (shared with
        /// the parameters of its targets, where it is the device path)
        path: SharedPath,
        /// `spec.local.fsType` (for block devices), e.g. `ext4`
        fs_type: Option<String>,
        /// the PV's access modes
        access_modes: Vec<AccessMode>,
        /// the PV's `mountOptions`
        mount_options: Vec<String>,
        /// whether the path is a block device (decided when the spec is resolved)
        is_block: bool,
        /// `spec.volumeMode`: `Block` maps the device into the pod raw
        #[serde(default)]
        volume_mode: VolumeMode,
    },
    /// A CSI persistent volume (modelled now, mounted when the CSI plugin
    /// lands). Boxed: its fields would make every spec half as large again.
    Csi(Box<CsiSpec>),
    /// A configMap, secret, downwardAPI or projected volume: files volumed
    /// writes (boxed, as CSI's).
    Payload(Box<PayloadSpec>),
}

/// The fields of [`VolumeSpec::Csi`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsiSpec {
    /// the driver name
    pub driver: String,
    /// the volume handle
    pub volume_handle: String,
    /// the fs type
    pub fs_type: Option<String>,
    /// the PV's access modes
    pub access_modes: Vec<AccessMode>,
    /// the PV's `mountOptions`
    pub mount_options: Vec<String>,
    /// volume attributes
    pub attributes: BTreeMap<String, String>,
    /// the driver's CSIDriver says `seLinuxMount: true` (filled in when the
    /// claim is resolved; false without a CSIDriver, as the kubelet does)
    #[serde(default)]
    pub selinux_mount: bool,
    /// `spec.csi.readOnly`
    #[serde(default)]
    pub read_only: bool,
    /// `spec.csi.nodeStageSecretRef`
    #[serde(default)]
    pub stage_secret: Option<SecretRef>,
    /// `spec.csi.nodePublishSecretRef`
    #[serde(default)]
    pub publish_secret: Option<SecretRef>,
    /// `spec.csi.nodeExpandSecretRef`: read when NodeExpandVolume is
    /// called, never journaled (an expansion is decided again from the
    /// claim after a restart, so its call's arguments need no record)
    #[serde(default)]
    pub expand_secret: Option<SecretRef>,
    /// the VolumeAttachment that attached it to this node (its name and
    /// `attachmentMetadata`), when the driver needs attaching (filled in
    /// when the claim is resolved)
    #[serde(default)]
    pub attachment: Option<(String, BTreeMap<String, String>)>,
    /// an inline volume of the pod spec (`volumes[].csi`): the ephemeral
    /// lifecycle, published only, never staged; its handle is the kubelet's
    /// `csi-<sha256 of pod uid and volume name>`
    #[serde(default)]
    pub ephemeral: bool,
    /// the driver's CSIDriver says `requiresRepublish: true`: NodePublish
    /// is called again every sync period while the volume is mounted, as
    /// the kubelet does (filled in when the claim is resolved)
    #[serde(default)]
    pub republish: bool,
    /// the PV's `spec.volumeMode`: `Block` is refused when the pod is
    /// resolved until the CSI plugin maps devices
    #[serde(default)]
    pub volume_mode: VolumeMode,
    /// the claim bound to this PV, its size and status (filled in when the
    /// claim is resolved; none for an inline volume): node expansion
    #[serde(default)]
    pub claim: Option<Arc<super::ClaimState>>,
}

impl VolumeSpec {
    /// The plugin that owns this spec.
    pub fn plugin(&self) -> PluginName {
        match self {
            VolumeSpec::EmptyDir { .. } => PluginName::EmptyDir,
            VolumeSpec::HostPath { .. } => PluginName::HostPath,
            VolumeSpec::Local { .. } => PluginName::LocalVolume,
            VolumeSpec::Csi { .. } => PluginName::Csi,
            VolumeSpec::Payload(p) => p.kind.plugin(),
        }
    }

    /// The kind of the device (global) target, or `None` when the volume has no
    /// device target.
    pub fn device_target_kind(&self) -> Option<TargetKind> {
        match self {
            VolumeSpec::Local {
                volume_mode: VolumeMode::Block,
                ..
            } => Some(TargetKind::Block),
            VolumeSpec::Local { is_block: true, .. } => Some(TargetKind::Mount),
            VolumeSpec::Csi(c) if c.ephemeral => None,
            VolumeSpec::Csi(c) if c.volume_mode == VolumeMode::Block => Some(TargetKind::Block),
            VolumeSpec::Csi(_) => Some(TargetKind::Mount),
            _ => None,
        }
    }

    /// The kind of the per-pod target.
    pub fn pod_target_kind(&self) -> TargetKind {
        if self.volume_mode() == VolumeMode::Block {
            return TargetKind::Block;
        }
        match self {
            VolumeSpec::EmptyDir {
                medium: StorageMedium::Memory,
                ..
            } => TargetKind::Mount,
            VolumeSpec::EmptyDir { .. } => TargetKind::Dir,
            VolumeSpec::HostPath { .. } => TargetKind::None,
            VolumeSpec::Local { .. } | VolumeSpec::Csi(_) => TargetKind::Mount,
            // the wrapped emptyDir: a tmpfs, or a dir for a configMap
            VolumeSpec::Payload(p) if p.kind.in_memory() => TargetKind::Mount,
            VolumeSpec::Payload(_) => TargetKind::Dir,
        }
    }

    /// Whether an attach/detach controller attaches this volume to the
    /// node: a CSI PV whose driver requires attaching (its spec carries the
    /// VolumeAttachment). Such a volume goes into `node.status.volumesInUse`
    /// and is mounted only once it is reported there.
    pub fn is_attachable(&self) -> bool {
        matches!(self, VolumeSpec::Csi(c) if c.attachment.is_some() && !c.ephemeral)
    }

    /// The volume's mode: a PV's `volumeMode`; `Filesystem` for every
    /// inline volume.
    pub fn volume_mode(&self) -> VolumeMode {
        match self {
            VolumeSpec::Local { volume_mode, .. } => *volume_mode,
            VolumeSpec::Csi(c) => c.volume_mode,
            _ => VolumeMode::Filesystem,
        }
    }

    /// The access modes, empty for inline volumes.
    pub fn access_modes(&self) -> &[AccessMode] {
        match self {
            VolumeSpec::Local { access_modes, .. } => access_modes,
            VolumeSpec::Csi(c) => &c.access_modes,
            _ => &[],
        }
    }
}

/// A volume as one pod wants it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodVolume {
    /// the unique volume name
    pub volume: UniqueVolumeName,
    /// the spec name: the pod's volume name for inline volumes, the PV name for PVC-backed ones
    pub spec_name: String,
    /// `pod.spec.volumes[x].name`
    pub outer_name: String,
    /// the spec (shared: a claim's is its PersistentVolume's, as the
    /// static objects hold it, and the DSW keeps this `Arc`)
    pub spec: Arc<VolumeSpec>,
    /// the SELinux label to mount with, if any
    pub selinux: Option<SeLinuxContext>,
    /// for a CSI volume, what this pod adds to its publish call
    pub csi_pod: Option<Arc<CsiPodInfo>>,
    /// the pod's `persistentVolumeClaim.readOnly`: this pod's target is
    /// mounted read-only whatever the spec says (a spec's own read-only,
    /// a CSI `readOnly` or an `ro` mount option, holds for every pod)
    pub read_only: bool,
    /// the group the node gives the volume's files for this pod (the
    /// walk), when the volume gets one (`ownership_applies`)
    #[serde(default)]
    pub fs_group: Option<FsGroup>,
    /// a claim's PV's `pv.beta.kubernetes.io/gid`, a supplemental group
    /// of the pod's containers unless the pod lists it already
    #[serde(default)]
    pub supplemental_gid: Option<u32>,
}

impl PodVolume {
    /// Builds the unique name the kubelet would give this volume for `pod`.
    pub fn unique_name(spec: &VolumeSpec, pod: &PodUid, spec_name: &str) -> UniqueVolumeName {
        let plugin = spec.plugin();
        match spec {
            VolumeSpec::Local { .. } => UniqueVolumeName::shared(plugin, spec_name),
            // not attachable, not device-mountable: per pod, as the kubelet names it
            VolumeSpec::Csi(c) if c.ephemeral => UniqueVolumeName::per_pod(plugin, pod, spec_name),
            VolumeSpec::Csi(c) => {
                UniqueVolumeName::shared(plugin, &format!("{}^{}", c.driver, c.volume_handle))
            }
            _ => UniqueVolumeName::per_pod(plugin, pod, spec_name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_names_follow_the_kubelet() {
        let pod = PodUid::new("uid1").unwrap();
        let ed = VolumeSpec::EmptyDir {
            medium: StorageMedium::Disk,
            size_limit: None,
        };
        assert_eq!(
            PodVolume::unique_name(&ed, &pod, "cache").as_str(),
            "kubernetes.io/empty-dir/uid1-cache"
        );
        let local = VolumeSpec::Local {
            path: "/dev/loop0".into(),
            fs_type: Some("ext4".into()),
            access_modes: vec![AccessMode::ReadWriteOnce],
            mount_options: vec![],
            is_block: true,
            volume_mode: Default::default(),
        };
        let name = PodVolume::unique_name(&local, &pod, "pv-local");
        assert_eq!(name.as_str(), "kubernetes.io/local-volume/pv-local");
        assert_eq!(name.plugin(), Some(PluginName::LocalVolume));
        let csi = VolumeSpec::Csi(Box::new(CsiSpec {
            driver: "d.example.com".into(),
            volume_handle: "h1".into(),
            fs_type: None,
            access_modes: vec![],
            mount_options: vec![],
            attributes: BTreeMap::new(),
            selinux_mount: false,
            read_only: false,
            stage_secret: None,
            publish_secret: None,
            expand_secret: None,
            attachment: None,
            ephemeral: false,
            republish: false,
            volume_mode: VolumeMode::Filesystem,
            claim: None,
        }));
        assert_eq!(
            PodVolume::unique_name(&csi, &pod, "pv1").as_str(),
            "kubernetes.io/csi/d.example.com^h1"
        );
        let inline = VolumeSpec::Csi(Box::new(CsiSpec {
            driver: "d.example.com".into(),
            volume_handle: "csi-abc".into(),
            ephemeral: true,
            ..CsiSpec::default()
        }));
        assert_eq!(
            PodVolume::unique_name(&inline, &pod, "scratch").as_str(),
            "kubernetes.io/csi/uid1-scratch",
            "an inline CSI volume is per pod, as the kubelet names it"
        );
        assert_eq!(inline.device_target_kind(), None, "never staged");
        assert_eq!(csi.device_target_kind(), Some(TargetKind::Mount));
    }
}
