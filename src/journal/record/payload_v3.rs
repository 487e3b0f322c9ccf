//! Format v3's target: v2's, then the payload of a configMap, secret,
//! downwardAPI or projected volume's pod target — the SHA-256 of what was
//! written and the uid and resourceVersion of each object it came from.
//! Never a byte of the payload: a Secret's values must not reach the
//! journal's files.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{RecordError, TargetFormat, TargetV2, field_err};
use crate::model::{ObjectVersion, PayloadVersion, PluginName, TargetParams};

/// Target parameters (format v3): v2's, then the payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetV3 {
    /// every field of format v2, in v2's order
    pub base: TargetV2,
    /// the payload written, `None` for other plugins and device targets
    pub payload: Option<PayloadV3>,
}

/// The payload of a pod target (format v3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayloadV3 {
    /// lowercase hex SHA-256 over the payload's paths, modes and bytes
    pub hash: String,
    /// the objects it came from, sorted
    pub objects: Vec<ObjectV3>,
}

/// An object a payload came from (format v3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct ObjectV3 {
    /// `ConfigMap` or `Secret`
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
}

impl From<TargetV2> for TargetV3 {
    fn from(base: TargetV2) -> Self {
        TargetV3 {
            base,
            payload: None,
        }
    }
}

impl From<&PayloadVersion> for PayloadV3 {
    fn from(v: &PayloadVersion) -> Self {
        PayloadV3 {
            hash: v.hash.clone(),
            objects: v
                .objects
                .iter()
                .map(|o| ObjectV3 {
                    kind: o.kind.clone(),
                    namespace: o.namespace.clone(),
                    name: o.name.clone(),
                    uid: o.uid.clone(),
                    resource_version: o.resource_version.clone(),
                })
                .collect(),
        }
    }
}

impl TryFrom<&PayloadV3> for PayloadVersion {
    type Error = RecordError;
    fn try_from(p: &PayloadV3) -> Result<Self, RecordError> {
        let hex = p
            .hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if p.hash.len() != 64 || !hex {
            return Err(field_err(
                "payload.hash",
                &p.hash,
                "not 64 lowercase hex digits",
            ));
        }
        Ok(PayloadVersion {
            hash: p.hash.clone(),
            objects: p
                .objects
                .iter()
                .map(|o| ObjectVersion {
                    kind: o.kind.clone(),
                    namespace: o.namespace.clone(),
                    name: o.name.clone(),
                    uid: o.uid.clone(),
                    resource_version: o.resource_version.clone(),
                })
                .collect(),
        })
    }
}

/// Whether `plugin` writes payloads.
fn writes_payloads(plugin: PluginName) -> bool {
    matches!(
        plugin,
        PluginName::ConfigMap
            | PluginName::Secret
            | PluginName::DownwardApi
            | PluginName::Projected
    )
}

impl TargetFormat for TargetV3 {
    fn from_params(p: &TargetParams) -> Self {
        TargetV3 {
            base: TargetV2::from_params(p),
            payload: p.payload().map(|v| PayloadV3::from(v.as_ref())),
        }
    }
    fn to_params(&self) -> Result<TargetParams, RecordError> {
        let p = self.base.to_params()?;
        with_payload(p, self.payload.as_ref(), &self.base.base.plugin)
    }
}

/// `p` with the payload of its v3 target, if any (`plugin`, as written,
/// names it in an error).
pub(super) fn with_payload(
    p: TargetParams,
    payload: Option<&PayloadV3>,
    plugin: &str,
) -> Result<TargetParams, RecordError> {
    let Some(payload) = payload else {
        return Ok(p);
    };
    if !writes_payloads(p.plugin) {
        return Err(field_err(
            "payload",
            plugin,
            "a payload on a target of a plugin that writes none",
        ));
    }
    Ok(p.with_payload(Some(Arc::new(PayloadVersion::try_from(payload)?))))
}
