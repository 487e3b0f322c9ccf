//! The Secrets of the API-server source: which ones a pod's CSI volumes
//! name (only those are watched, each by name), and a Secret as the API
//! server sent it, read as the static objects read one.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::Value;

/// The Secrets a pod's CSI volumes name (stage and publish refs).
pub(super) fn secrets_named(pod: &super::DesiredPod) -> BTreeSet<(String, String)> {
    pod.volumes
        .iter()
        .filter_map(|v| match &*v.spec {
            crate::model::VolumeSpec::Csi(c) => Some([&c.stage_secret, &c.publish_secret]),
            _ => None,
        })
        .flatten()
        .flatten()
        .map(|r| (r.namespace.clone(), r.name.clone()))
        .collect()
}

/// A Secret as the API server sent it, for the [`SecretStore`](super::static_objects::SecretStore):
/// its key and contents, or why it cannot be read (naming it).
pub fn secret_from_api(
    doc: Value,
) -> Result<((String, String), super::static_objects::SecretInfo), String> {
    let ns = doc
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default")
        .to_owned();
    let name = doc
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let file = PathBuf::from(format!("/api/v1/namespaces/{ns}/secrets/{name}"));
    super::csi_objects::secret(&file, doc).map_err(|e| e.to_string())
}
