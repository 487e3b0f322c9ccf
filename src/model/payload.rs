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
    /// a projected `serviceAccountToken` (needs the API server's
    /// TokenRequest API)
    ServiceAccountToken {
        /// where under the volume
        path: String,
        /// `audience` (`None`: the API server's own)
        #[serde(default)]
        audience: Option<String>,
        /// `expirationSeconds`, as the API server defaults it (3600) and
        /// checks it (at least 600)
        #[serde(default = "default_token_seconds")]
        expiration_seconds: i64,
    },
}

/// The API server's default `expirationSeconds` of a projected token.
pub const DEFAULT_TOKEN_SECONDS: i64 = 3600;
/// The least `expirationSeconds` the API server accepts (ten minutes).
pub const MIN_TOKEN_SECONDS: i64 = 600;
/// The most it accepts (2^32 seconds).
pub const MAX_TOKEN_SECONDS: i64 = 1 << 32;

fn default_token_seconds() -> i64 {
    DEFAULT_TOKEN_SECONDS
}

/// A service account token a pod's projected volume asks for: the
/// TokenRequest it makes (the kubelet's token manager keys its cache the
/// same way), bound to the pod. Not secret: only the token is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TokenRef {
    /// the pod's namespace
    pub namespace: String,
    /// the pod's service account (`default` when unset)
    pub service_account: String,
    /// the audience asked for (`None`: the API server's)
    pub audience: Option<String>,
    /// the lifetime asked for
    pub expiration_seconds: i64,
    /// the pod it is bound to: name
    pub pod_name: String,
    /// and uid
    pub pod_uid: String,
}

/// The kind a token's [`ObjectVersion`] names (its version is its
/// expiry, [`IssuedToken::version`]).
pub const TOKEN_OBJECT_KIND: &str = "ServiceAccountToken";

/// A token the API server issued. Its `Debug` never shows the token.
#[derive(Clone, PartialEq, Eq)]
pub struct IssuedToken {
    /// the token itself (a bearer credential)
    pub token: String,
    /// `status.expirationTimestamp`
    pub expires: std::time::SystemTime,
    /// the lifetime the request asked for (the kubelet reckons the issue
    /// time from it, not from the answer)
    pub expiration_seconds: i64,
}

impl std::fmt::Debug for IssuedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedToken")
            .field("token", &format_args!("<{} bytes>", self.token.len()))
            .field("expires", &self.expires)
            .field("expiration_seconds", &self.expiration_seconds)
            .finish()
    }
}

impl IssuedToken {
    /// When it was issued, as the kubelet reckons it: its expiry less the
    /// lifetime asked for.
    pub fn issued(&self) -> std::time::SystemTime {
        let secs = u64::try_from(self.expiration_seconds).unwrap_or(0);
        self.expires
            .checked_sub(std::time::Duration::from_secs(secs))
            .unwrap_or(std::time::UNIX_EPOCH)
    }

    /// The "version" a payload journals for it: its expiry, in Unix
    /// seconds (never the token: the journal holds no secret).
    pub fn version(&self) -> String {
        let secs = self
            .expires
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        format!("exp:{secs}")
    }

    /// A token read back from a payload with the version the journal
    /// recorded for it ([`IssuedToken::version`]) and the lifetime its
    /// source asks for; `None` when `version` is no token's.
    pub fn from_version(token: String, version: &str, expiration_seconds: i64) -> Option<Self> {
        let secs: u64 = version.strip_prefix("exp:")?.parse().ok()?;
        Some(Self {
            token,
            expires: std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_secs(secs))?,
            expiration_seconds,
        })
    }
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
