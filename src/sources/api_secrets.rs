//! What an API pod refers to ([`ObjectRef`]s, for the one index in
//! `api_refs`): the claims, ConfigMaps, Secrets and tokens its spec names,
//! and the Secrets its resolved CSI volumes name (only those objects are
//! watched, each by name); and a Secret as the API server sent it, read as
//! the static objects read one. Also where a pod puts a token, so a token
//! kept across a restart can be read back from its volume.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::Value;

use super::api_refs::ObjectRef;
use super::static_pods::{ParsedPod, ParsedVolume};
use crate::model::{PayloadSource, TokenRef, VolumeSpec};

/// What a pod's spec names: its claims, and its payload volumes'
/// ConfigMaps, Secrets and tokens.
pub(super) fn spec_refs(pod: &ParsedPod) -> BTreeSet<ObjectRef> {
    let mut out = BTreeSet::new();
    let ns = || pod.namespace.clone();
    for v in &pod.volumes {
        match v {
            ParsedVolume::Claim { claim_name, .. } => {
                out.insert(ObjectRef::Claim(ns(), claim_name.clone()));
            }
            ParsedVolume::Inline {
                spec: VolumeSpec::Payload(p),
                ..
            } => {
                for src in &p.sources {
                    let r = match src {
                        PayloadSource::ConfigMap { name, .. } => {
                            ObjectRef::ConfigMap(p.namespace.clone(), name.clone())
                        }
                        PayloadSource::Secret { name, .. } => {
                            ObjectRef::Secret(p.namespace.clone(), name.clone())
                        }
                        PayloadSource::ServiceAccountToken { .. } => {
                            match crate::plugins::payload::build::token_ref(p, src) {
                                Some(t) => ObjectRef::Token(t),
                                None => continue,
                            }
                        }
                        PayloadSource::DownwardApi { .. } => continue,
                    };
                    out.insert(r);
                }
            }
            ParsedVolume::Inline { .. } => {}
        }
    }
    out
}

/// Where `pod` puts the token `r`: (volume name, path in the volume) of
/// each projected `serviceAccountToken` source that asks for it.
pub(super) fn token_paths(pod: &ParsedPod, r: &TokenRef) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for v in &pod.volumes {
        let ParsedVolume::Inline {
            name,
            spec: VolumeSpec::Payload(p),
        } = v
        else {
            continue;
        };
        for src in &p.sources {
            if let PayloadSource::ServiceAccountToken { path, .. } = src
                && crate::plugins::payload::build::token_ref(p, src).as_ref() == Some(r)
            {
                out.push((name.clone(), path.clone()));
            }
        }
    }
    out
}

/// The Secrets a pod's CSI volumes name (stage, publish and expand refs).
pub(super) fn secrets_named(pod: &super::DesiredPod) -> BTreeSet<ObjectRef> {
    pod.volumes
        .iter()
        .filter_map(|v| match &*v.spec {
            crate::model::VolumeSpec::Csi(c) => {
                Some([&c.stage_secret, &c.publish_secret, &c.expand_secret])
            }
            _ => None,
        })
        .flatten()
        .flatten()
        .map(|r| ObjectRef::Secret(r.namespace.clone(), r.name.clone()))
        .collect()
}

/// A Secret as the API server sent it, for the [`SecretStore`](super::static_objects::SecretStore):
/// its key and contents, or why it cannot be read (naming it).
pub fn secret_from_api(
    doc: Value,
) -> Result<((String, String), super::static_objects::SecretInfo), String> {
    let file = server_path("secrets", &doc);
    super::csi_objects::secret(&file, doc).map_err(|e| e.to_string())
}

/// Where a namespaced core object sent by the API server lives there
/// (`/api/v1/namespaces/<ns>/<plural>/<name>`): the name its errors give
/// it, as a static object's give its file.
pub(super) fn server_path(plural: &str, doc: &Value) -> PathBuf {
    let field = |p: &str| doc.pointer(p).and_then(Value::as_str);
    let ns = field("/metadata/namespace").unwrap_or("default");
    let name = field("/metadata/name").unwrap_or_default();
    PathBuf::from(format!("/api/v1/namespaces/{ns}/{plural}/{name}"))
}
