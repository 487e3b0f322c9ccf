//! What a configMap, secret, downwardAPI or projected volume holds: the
//! objects and keys it projects (`PayloadSpec`), and the version of a
//! written payload the journal records (`PayloadVersion`: a hash and the
//! objects' uids and resourceVersions — never a secret's bytes).

use serde::{Deserialize, Serialize};

/// The kubelet's `defaultMode` when the spec gives none (0644).
pub const DEFAULT_PAYLOAD_MODE: u32 = 0o644;

/// Which of the four payload volume types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PayloadKind {
    /// `configMap`: on disk
    ConfigMap,
    /// `secret`: on a tmpfs
    Secret,
    /// `downwardAPI`: on a tmpfs
    DownwardApi,
    /// `projected`: on a tmpfs
    Projected,
}

/// One `items` entry: a key of the object written at a relative path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyToPath {
    /// the object's key
    pub key: String,
    /// where under the volume (relative, no `..`; checked when the payload
    /// is built)
    pub path: String,
    /// the file's mode, else the volume's `defaultMode`
    pub mode: Option<u32>,
}

/// A downwardAPI item: a pod field written at a relative path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldItem {
    /// where under the volume
    pub path: String,
    /// `fieldRef.fieldPath` (`metadata.name`, `metadata.labels`, …)
    pub field_path: String,
    /// the file's mode, else the volume's `defaultMode`
    pub mode: Option<u32>,
}

/// One source of a payload (a configMap or secret volume has one; a
/// projected volume several).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PayloadSource {
    /// a ConfigMap's `data` and `binaryData`
    ConfigMap {
        /// the ConfigMap's name (in the pod's namespace)
        name: String,
        /// `items`: only these keys, at these paths; `None` for every key
        items: Option<Vec<KeyToPath>>,
        /// `optional`: a missing object (or key) is no error
        optional: bool,
    },
    /// a Secret's `data`
    Secret {
        /// the Secret's name (in the pod's namespace)
        name: String,
        /// `items`, as for a ConfigMap
        items: Option<Vec<KeyToPath>>,
        /// `optional`
        optional: bool,
    },
    /// pod fields
    DownwardApi {
        /// the items
        items: Vec<FieldItem>,
    },
    /// a projected `serviceAccountToken` (needs the API server)
    ServiceAccountToken {
        /// where under the volume
        path: String,
    },
}

/// A payload volume as the pod's spec gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayloadSpec {
    /// which volume type
    pub kind: PayloadKind,
    /// the pod's namespace (objects are looked up there)
    pub namespace: String,
    /// `defaultMode`
    pub default_mode: u32,
    /// what it projects, in order (a later file of a projected volume
    /// replaces an earlier one at the same path, as the kubelet's map does)
    pub sources: Vec<PayloadSource>,
    /// the pod's `securityContext.fsGroup`, which payload files are given
    pub fs_group: Option<u32>,
    /// the pod fields a downwardAPI item can name, as the source read them
    pub pod_fields: std::collections::BTreeMap<String, String>,
    /// the payload the objects make now, filled in when the pod's volumes
    /// are resolved against the objects (the journal records it with the
    /// intent; a change of the objects changes it)
    pub version: Option<std::sync::Arc<PayloadVersion>>,
    /// every object the payload read is `immutable` (filled in with the
    /// version): once written, it is never read again
    pub immutable: bool,
}

impl PayloadKind {
    /// The plugin of this kind of volume.
    pub fn plugin(self) -> super::PluginName {
        match self {
            PayloadKind::ConfigMap => super::PluginName::ConfigMap,
            PayloadKind::Secret => super::PluginName::Secret,
            PayloadKind::DownwardApi => super::PluginName::DownwardApi,
            PayloadKind::Projected => super::PluginName::Projected,
        }
    }

    /// Whether the payload lives on a tmpfs (the kubelet's wrapped emptyDir
    /// of medium Memory): everything but a configMap, which may hold
    /// nothing secret.
    pub fn in_memory(self) -> bool {
        self != PayloadKind::ConfigMap
    }
}

/// An object a payload came from, as the journal records it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ObjectVersion {
    /// `ConfigMap` or `Secret`
    pub kind: String,
    /// namespace
    pub namespace: String,
    /// name
    pub name: String,
    /// `metadata.uid` (empty when the object has none, as a static file may)
    pub uid: String,
    /// `metadata.resourceVersion` (empty when none)
    pub resource_version: String,
}

/// What a payload write wrote: the journal records it with the intent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayloadVersion {
    /// hex SHA-256 over the payload's paths, modes and bytes
    pub hash: String,
    /// the objects it came from
    pub objects: Vec<ObjectVersion>,
}
