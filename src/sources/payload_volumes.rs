//! A pod's `configMap`, `secret`, `downwardAPI` and `projected` volumes →
//! [`PayloadSpec`]s. The objects they name are looked up when the pod is
//! resolved (`load.rs`), which fills in the payload's version.
//!
//! As the API server validates them: modes are 0–0777; a secret volume
//! needs a `secretName`; downwardAPI items name a `fieldRef` (a
//! `resourceFieldRef` — container limits — is refused: volumed has no
//! containers to read them from). Paths are checked when the payload is
//! built, so a hostile one fails the volume, naming it.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, Pod, Volume};

use super::SourceError;
use crate::model::{
    DEFAULT_PAYLOAD_MODE, FieldItem, KeyToPath, PayloadKind, PayloadSource, PayloadSpec, VolumeSpec,
};

/// What a payload volume takes from its pod.
#[derive(Debug, Clone, Default)]
pub(super) struct PodPayloadContext {
    /// the pod's namespace
    pub namespace: String,
    /// `securityContext.fsGroup`
    pub fs_group: Option<i64>,
    /// the fields a downwardAPI item may name, rendered as the kubelet
    /// writes them
    pub fields: BTreeMap<String, String>,
}

impl PodPayloadContext {
    /// The context of `pod`, known by `name` and `uid` in `namespace`.
    pub(super) fn of(pod: &Pod, name: &str, uid: &str, namespace: &str) -> Self {
        let meta = &pod.metadata;
        let spec = pod.spec.as_ref();
        let mut fields = BTreeMap::from([
            ("metadata.name".to_owned(), name.to_owned()),
            ("metadata.namespace".to_owned(), namespace.to_owned()),
            ("metadata.uid".to_owned(), uid.to_owned()),
            (
                "metadata.labels".to_owned(),
                render_map(meta.labels.as_ref()),
            ),
            (
                "metadata.annotations".to_owned(),
                render_map(meta.annotations.as_ref()),
            ),
        ]);
        if let Some(node) = spec.and_then(|s| s.node_name.clone()) {
            fields.insert("spec.nodeName".to_owned(), node);
        }
        if let Some(sa) = spec.and_then(|s| s.service_account_name.clone()) {
            fields.insert("spec.serviceAccountName".to_owned(), sa);
        }
        for (k, v) in meta.labels.iter().flatten() {
            fields.insert(format!("metadata.labels['{k}']"), v.clone());
        }
        for (k, v) in meta.annotations.iter().flatten() {
            fields.insert(format!("metadata.annotations['{k}']"), v.clone());
        }
        Self {
            namespace: namespace.to_owned(),
            fs_group: spec
                .and_then(|s| s.security_context.as_ref())
                .and_then(|c| c.fs_group),
            fields,
        }
    }
}

/// `key="value"` lines, sorted by key, as the kubelet's downward API
/// renders labels and annotations.
fn render_map(m: Option<&BTreeMap<String, String>>) -> String {
    m.into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The payload spec of `v`, `None` when it is no payload volume.
pub(super) fn parse(
    file: &Path,
    v: &Volume,
    ctx: &PodPayloadContext,
) -> Option<Result<VolumeSpec, SourceError>> {
    let bad = |reason: String| SourceError::InvalidVolume {
        file: file.to_owned(),
        volume: v.name.clone(),
        reason,
    };
    let spec = |kind, mode: Option<i32>, sources| -> Result<VolumeSpec, SourceError> {
        let fs_group = match ctx.fs_group {
            None => None,
            Some(g) => Some(u32::try_from(g).map_err(|_| bad(format!("fsGroup {g}")))?),
        };
        Ok(VolumeSpec::Payload(Box::new(PayloadSpec {
            kind,
            namespace: ctx.namespace.clone(),
            default_mode: mode_of(mode, DEFAULT_PAYLOAD_MODE).map_err(&bad)?,
            sources,
            fs_group,
            pod_fields: ctx.fields.clone(),
            version: None,
            immutable: false,
        })))
    };
    let items = |items: &Option<Vec<k8s_openapi::api::core::v1::KeyToPath>>| {
        items.as_ref().map(|items| {
            items
                .iter()
                .map(|i| {
                    Ok(KeyToPath {
                        key: i.key.clone(),
                        path: i.path.clone(),
                        mode: i.mode.map(|m| mode_of(Some(m), 0)).transpose()?,
                    })
                })
                .collect::<Result<Vec<_>, String>>()
        })
    };
    if let Some(c) = &v.config_map {
        let source = items(&c.items)
            .transpose()
            .map(|items| PayloadSource::ConfigMap {
                name: c.name.clone(),
                items,
                optional: c.optional.unwrap_or(false),
            });
        return Some(
            source
                .map_err(bad)
                .and_then(|s| spec(PayloadKind::ConfigMap, c.default_mode, vec![s])),
        );
    }
    if let Some(s) = &v.secret {
        let Some(name) = s.secret_name.clone().filter(|n| !n.is_empty()) else {
            return Some(Err(bad("secret volume without secretName".into())));
        };
        let source = items(&s.items)
            .transpose()
            .map(|items| PayloadSource::Secret {
                name,
                items,
                optional: s.optional.unwrap_or(false),
            });
        return Some(
            source
                .map_err(bad)
                .and_then(|src| spec(PayloadKind::Secret, s.default_mode, vec![src])),
        );
    }
    if let Some(d) = &v.downward_api {
        let source = field_items(d.items.as_deref().unwrap_or_default());
        return Some(
            source
                .map_err(bad)
                .and_then(|src| spec(PayloadKind::DownwardApi, d.default_mode, vec![src])),
        );
    }
    let p = v.projected.as_ref()?;
    let mut sources = Vec::new();
    for s in p.sources.iter().flatten() {
        let one = if let Some(c) = &s.config_map {
            items(&c.items)
                .transpose()
                .map(|items| PayloadSource::ConfigMap {
                    name: c.name.clone(),
                    items,
                    optional: c.optional.unwrap_or(false),
                })
        } else if let Some(sec) = &s.secret {
            items(&sec.items)
                .transpose()
                .map(|items| PayloadSource::Secret {
                    name: sec.name.clone(),
                    items,
                    optional: sec.optional.unwrap_or(false),
                })
        } else if let Some(d) = &s.downward_api {
            field_items(d.items.as_deref().unwrap_or_default())
        } else if let Some(t) = &s.service_account_token {
            token_source(t)
        } else {
            Err(
                "a projected source volumed does not support (clusterTrustBundle, podCertificate)"
                    .into(),
            )
        };
        match one {
            Ok(src) => sources.push(src),
            Err(e) => return Some(Err(bad(e))),
        }
    }
    Some(spec(PayloadKind::Projected, p.default_mode, sources))
}

/// A `serviceAccountToken` source with the API server's defaulting and
/// checks: `expirationSeconds` 3600 when unset, between 600 and 2^32.
fn token_source(
    t: &k8s_openapi::api::core::v1::ServiceAccountTokenProjection,
) -> Result<PayloadSource, String> {
    use crate::model::{DEFAULT_TOKEN_SECONDS, MAX_TOKEN_SECONDS, MIN_TOKEN_SECONDS};
    let secs = t.expiration_seconds.unwrap_or(DEFAULT_TOKEN_SECONDS);
    if !(MIN_TOKEN_SECONDS..=MAX_TOKEN_SECONDS).contains(&secs) {
        return Err(format!(
            "serviceAccountToken {:?}: expirationSeconds {secs} is not between {MIN_TOKEN_SECONDS} and {MAX_TOKEN_SECONDS}",
            t.path
        ));
    }
    Ok(PayloadSource::ServiceAccountToken {
        path: t.path.clone(),
        audience: t.audience.clone().filter(|a| !a.is_empty()),
        expiration_seconds: secs,
    })
}

fn field_items(items: &[DownwardAPIVolumeFile]) -> Result<PayloadSource, String> {
    let mut out = Vec::with_capacity(items.len());
    for i in items {
        let Some(f) = &i.field_ref else {
            return Err(format!(
                "downwardAPI item {:?}: only fieldRef is supported (resourceFieldRef needs a container)",
                i.path
            ));
        };
        out.push(FieldItem {
            path: i.path.clone(),
            field_path: f.field_path.clone(),
            mode: i.mode.map(|m| mode_of(Some(m), 0)).transpose()?,
        });
    }
    Ok(PayloadSource::DownwardApi { items: out })
}

/// A mode as the API gives it (a decimal i32), checked to be 0–0777.
fn mode_of(mode: Option<i32>, default: u32) -> Result<u32, String> {
    match mode {
        None => Ok(default),
        Some(m) => u32::try_from(m)
            .ok()
            .filter(|m| *m <= 0o777)
            .ok_or_else(|| format!("mode {m} is not between 0 and 0777")),
    }
}
