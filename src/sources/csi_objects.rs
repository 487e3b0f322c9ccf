//! The static objects CSI volumes need: CSIDriver (attach, pod info,
//! fsGroup policy, SELinux mounts), VolumeAttachment (a driver that needs
//! attaching waits for one that says attached) and Secret (kept only in
//! memory, in the [`SecretStore`] the CSI plugin reads; never logged).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use serde_json::Value;

use super::SourceError;
use super::static_objects::{HasFile, decode, object_name};
use crate::model::SecretRef;

/// A CSIDriver as read.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CsiDriverInfo {
    /// the file it came from
    pub file: PathBuf,
    /// `spec.seLinuxMount`
    pub se_linux_mount: bool,
    /// `spec.attachRequired` (default true)
    pub attach_required: bool,
    /// `spec.podInfoOnMount` (default false)
    pub pod_info_on_mount: bool,
    /// `spec.fsGroupPolicy` (default `ReadWriteOnceWithFSType`)
    pub fs_group_policy: String,
    /// `spec.requiresRepublish` (default false)
    pub requires_republish: bool,
    /// `spec.volumeLifecycleModes` (default `[Persistent]`, as the API
    /// server fills it in)
    pub lifecycle_modes: Vec<String>,
}

/// A VolumeAttachment as read.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AttachmentInfo {
    /// the file it came from
    pub file: PathBuf,
    /// `spec.attacher`: the driver
    pub attacher: String,
    /// `spec.nodeName`
    pub node_name: String,
    /// `spec.source.persistentVolumeName`
    pub pv_name: Option<String>,
    /// `status.attached`
    pub attached: bool,
    /// `status.attachmentMetadata`
    pub metadata: BTreeMap<String, String>,
}

/// A Secret as read: its file and keys (the values live only in the
/// [`SecretStore`]).
#[derive(Clone, PartialEq, Eq)]
pub struct SecretInfo {
    /// the file it came from
    pub file: PathBuf,
    /// `data` (decoded, lossily as UTF-8, as CSI's string map takes them)
    /// merged with `stringData`
    data: BTreeMap<String, String>,
}

impl std::fmt::Debug for SecretInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // never a value
        f.debug_struct("SecretInfo")
            .field("file", &self.file)
            .field("keys", &self.data.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// The Secrets CSI calls read, shared between the sources and the CSI
/// plugin: the static objects dir's (replaced on every read of that dir)
/// and the API server's (each referenced one as its watch says; the
/// static one wins where both name a Secret).
#[derive(Debug, Clone, Default)]
pub struct SecretStore(Arc<std::sync::RwLock<Layers>>);

#[derive(Debug, Default)]
struct Layers {
    files: BTreeMap<(String, String), SecretInfo>,
    api: BTreeMap<(String, String), SecretInfo>,
}

/// Two handles are equal when they are the same store.
impl PartialEq for SecretStore {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
impl Eq for SecretStore {}

impl SecretStore {
    pub(super) fn replace(&self, secrets: &BTreeMap<(String, String), SecretInfo>) {
        if let Ok(mut s) = self.0.write() {
            s.files.clone_from(secrets);
        }
    }

    /// The API server's version of one Secret (`None`: it does not exist,
    /// or is no longer referenced).
    pub fn set_from_api(&self, key: (String, String), secret: Option<SecretInfo>) {
        if let Ok(mut s) = self.0.write() {
            match secret {
                Some(i) => s.api.insert(key, i),
                None => s.api.remove(&key),
            };
        }
    }
}

impl crate::plugins::csi::SecretSource for SecretStore {
    fn secret(&self, r: &SecretRef) -> Result<BTreeMap<String, String>, String> {
        let s = self
            .0
            .read()
            .map_err(|_| "the Secret store is poisoned".to_owned())?;
        let key = (r.namespace.clone(), r.name.clone());
        s.files
            .get(&key)
            .or_else(|| s.api.get(&key))
            .map(|i| i.data.clone())
            .ok_or_else(|| "not found in the static objects nor from the API server".to_owned())
    }
}

impl HasFile for CsiDriverInfo {
    fn file(&self) -> &Path {
        &self.file
    }
}
impl HasFile for AttachmentInfo {
    fn file(&self) -> &Path {
        &self.file
    }
}
impl HasFile for SecretInfo {
    fn file(&self) -> &Path {
        &self.file
    }
}

const PERSISTENT: &str = "Persistent";
const EPHEMERAL: &str = "Ephemeral";

/// Whether the driver may serve a volume of this lifecycle (the kubelet
/// refuses the mount otherwise): a driver without a CSIDriver object
/// serves persistent volumes only.
pub(super) fn check_lifecycle(
    driver_name: &str,
    driver: Option<&CsiDriverInfo>,
    ephemeral: bool,
) -> Result<(), String> {
    let mode = if ephemeral { EPHEMERAL } else { PERSISTENT };
    match driver {
        None if !ephemeral => Ok(()),
        None => Err(format!(
            "CSI driver {driver_name} has no CSIDriver object, so it serves only {PERSISTENT} volumes, not this {mode} (inline) one"
        )),
        Some(d) if d.lifecycle_modes.iter().any(|m| m == mode) => Ok(()),
        Some(d) => Err(format!(
            "CSI driver {driver_name} does not support the {mode} volume lifecycle mode: its CSIDriver ({}) lists {:?}",
            d.file.display(),
            d.lifecycle_modes
        )),
    }
}

/// A CSIDriver document: its name and what volumed keeps of it.
pub(super) fn csi_driver(file: &Path, doc: Value) -> Result<(String, CsiDriverInfo), SourceError> {
    let d: CSIDriver = decode(file, doc)?;
    let name = object_name(file, d.metadata.name, "CSIDriver")?;
    let info = CsiDriverInfo {
        file: file.to_owned(),
        se_linux_mount: d.spec.se_linux_mount.unwrap_or(false),
        attach_required: d.spec.attach_required.unwrap_or(true),
        pod_info_on_mount: d.spec.pod_info_on_mount.unwrap_or(false),
        fs_group_policy: d
            .spec
            .fs_group_policy
            .unwrap_or_else(|| "ReadWriteOnceWithFSType".to_owned()),
        requires_republish: d.spec.requires_republish.unwrap_or(false),
        lifecycle_modes: d
            .spec
            .volume_lifecycle_modes
            .unwrap_or_else(|| vec![PERSISTENT.to_owned()]),
    };
    Ok((name, info))
}

/// A VolumeAttachment document.
pub(super) fn attachment(file: &Path, doc: Value) -> Result<(String, AttachmentInfo), SourceError> {
    let va: VolumeAttachment = decode(file, doc)?;
    let name = object_name(file, va.metadata.name, "VolumeAttachment")?;
    let status = va.status.unwrap_or_default();
    let info = AttachmentInfo {
        file: file.to_owned(),
        attacher: va.spec.attacher,
        node_name: va.spec.node_name,
        pv_name: va.spec.source.persistent_volume_name,
        attached: status.attached,
        metadata: status.attachment_metadata.unwrap_or_default(),
    };
    Ok((name, info))
}

/// A Secret document, keyed by (namespace, name).
pub(crate) fn secret(
    file: &Path,
    doc: Value,
) -> Result<((String, String), SecretInfo), SourceError> {
    let s: Secret = decode(file, doc)?;
    let name = object_name(file, s.metadata.name, "Secret")?;
    let ns = s.metadata.namespace.filter(|n| !n.is_empty());
    let ns = ns.unwrap_or_else(|| "default".to_owned());
    let mut data: BTreeMap<String, String> = s
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
        .collect();
    data.extend(s.string_data.unwrap_or_default());
    Ok((
        (ns, name),
        SecretInfo {
            file: file.to_owned(),
            data,
        },
    ))
}

/// What every error of `attached` says: a pod error holding it waits
/// for its volume to be attached.
pub(crate) const ATTACH_WAIT: &str = "requires attaching";

/// Whether a pod error is a wait for a VolumeAttachment (`attached`).
pub(crate) fn is_attach_wait(error: &str) -> bool {
    error.contains(ATTACH_WAIT)
}

/// The VolumeAttachment of `pv` by `driver` to `node` that says it is
/// attached, as (name, attachment metadata); or why there is none.
pub(super) fn attached(
    attachments: &BTreeMap<String, AttachmentInfo>,
    driver: &str,
    pv: &str,
    node: &str,
) -> Result<(String, BTreeMap<String, String>), String> {
    let mut found = None;
    for (name, a) in attachments {
        if a.attacher == driver && a.node_name == node && a.pv_name.as_deref() == Some(pv) {
            if a.attached {
                return Ok((name.clone(), a.metadata.clone()));
            }
            found = Some(name);
        }
    }
    Err(match found {
        Some(name) => format!(
            "driver {driver} {ATTACH_WAIT}: VolumeAttachment {name} for node {node} is not attached yet (status.attached is not true)"
        ),
        None => format!(
            "driver {driver} {ATTACH_WAIT} (no CSIDriver says attachRequired: false): waiting for a VolumeAttachment of PersistentVolume {pv} to node {node} with status.attached: true"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn driver(modes: &[&str]) -> CsiDriverInfo {
        CsiDriverInfo {
            file: "/objects/d.yaml".into(),
            se_linux_mount: false,
            attach_required: false,
            pod_info_on_mount: false,
            fs_group_policy: String::new(),
            requires_republish: false,
            lifecycle_modes: modes.iter().map(|m| (*m).to_owned()).collect(),
        }
    }

    #[test]
    fn a_volume_needs_a_driver_that_lists_its_lifecycle_mode() {
        let both = driver(&["Persistent", "Ephemeral"]);
        let persistent = driver(&["Persistent"]);
        let ephemeral = driver(&["Ephemeral"]);
        // (driver, inline?, allowed)
        let rows: [(Option<&CsiDriverInfo>, bool, bool); 8] = [
            (None, false, true),
            (None, true, false),
            (Some(&both), false, true),
            (Some(&both), true, true),
            (Some(&persistent), false, true),
            (Some(&persistent), true, false),
            (Some(&ephemeral), false, false),
            (Some(&ephemeral), true, true),
        ];
        for (d, inline, allowed) in rows {
            let got = check_lifecycle("d.example.com", d, inline);
            assert_eq!(got.is_ok(), allowed, "{d:?} inline={inline}: {got:?}");
            if let Err(e) = got {
                assert!(e.contains("d.example.com"), "names the driver: {e}");
            }
        }
    }
}
