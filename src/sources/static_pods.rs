//! One static Pod manifest → a [`ParsedPod`]: its UID, name, volumes (inline
//! ones resolved, claims still to resolve) and SELinux options.
//!
//! Follows the kubelet's file source (`pkg/kubelet/config/file.go`,
//! `common.go` `applyDefaults`):
//! - one Pod per file (`kind: Pod`); a second document is an error;
//! - UID: `metadata.uid` when set, else 32 hex characters of SHA-256 over the
//!   canonical JSON of the parsed pod (the k8s-openapi type, so unknown
//!   fields do not count; keys sorted), then `host:<node name>`, then
//!   `file:<path>`. The kubelet uses md5 over Go's struct dump, which cannot
//!   be reproduced; the shape (pod + node + path) is the same, so the UID is
//!   stable across restarts and changes with the node name or the path.
//!   Every UID goes through [`PodUid::new`], so `../../x` is refused;
//! - name `<metadata.name>-<lowercase node name>`, namespace `default` when unset.
//!
//! Volumes: `emptyDir` (medium `""`/`Memory`, `sizeLimit` in bytes; a zero
//! limit is no limit, as in the kubelet; a memory one's size is also capped
//! by the pod's memory limit, `pod_memory`), `hostPath` (absolute, no `..`,
//! `type` mapped to [`HostPathType`]), `persistentVolumeClaim` (resolved
//! later against the static objects), `configMap`, `secret`, `downwardAPI`
//! and `projected` (`payload_volumes`). Anything else (iscsi, nfs, …) is
//! reported as unsupported. `ephemeral` (a generic ephemeral volume) is
//! the claim `<pod name>-<volume name>`, resolved as any claim once the pod
//! is shown to own it. **Decision:** where the kubelet
//! would refuse the whole pod (API validation) or fail its mount, volumed
//! reports the error on the pod and still mounts the pod's other volumes;
//! a volume whose name is not one safe path component is refused the same
//! way. A claim's `readOnly` is kept per pod ([`crate::model::PodVolume`]'s
//! `read_only`): the pod mounts it read-only.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{Pod, Volume};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::SourceError;
use super::payload_volumes::PodPayloadContext;
use super::quantity::parse_bytes;
use super::read::{canonical_json, kind_of, parse_documents};
use crate::model::{
    ContainerSpec, CsiSpec, FsGroup, FsGroupChangePolicy, HostPathType, PodUid, SecretRef,
    StorageMedium, SubPath, VolumeDeviceSpec, VolumeMountSpec, VolumeSpec, check_component,
    check_devices, check_dns1123_label, resolve_env,
};

/// A pod's volume after parsing.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ParsedVolume {
    /// emptyDir or hostPath: complete.
    Inline {
        /// `spec.volumes[x].name`
        name: String,
        /// the spec
        spec: VolumeSpec,
    },
    /// persistentVolumeClaim, or a generic ephemeral volume's claim:
    /// resolved against the static objects.
    Claim {
        /// `spec.volumes[x].name`
        name: String,
        /// `persistentVolumeClaim.claimName`; for an `ephemeral` volume the
        /// claim its controller makes, `<pod name>-<volume name>`
        claim_name: String,
        /// `persistentVolumeClaim.readOnly`: this pod mounts the claim
        /// read-only (an ephemeral volume has no such field: false)
        #[serde(default)]
        read_only: bool,
        /// a generic ephemeral volume: the claim is used only when the pod
        /// controls it (an `ownerReferences` entry with `controller: true`
        /// and the pod's UID), as the kubelet checks
        #[serde(default)]
        ephemeral: bool,
    },
}

pub use crate::selinux::{ContainerKind, ContainerSeLinux, PodSeLinux, SeLinuxOptions};

/// A parsed static pod, claims not yet resolved (kept by the
/// parsed-manifest cache, `manifest_cache.rs`, between runs).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ParsedPod {
    /// the UID
    pub uid: PodUid,
    /// the namespace (`default` when unset)
    pub namespace: String,
    /// `<metadata.name>-<node name>`, as the kubelet names static pods
    pub name: String,
    /// the manifest
    pub file: PathBuf,
    /// the volumes that parsed
    pub volumes: Vec<ParsedVolume>,
    /// the names of volumes that did not (they have an entry in `errors`)
    pub failed_volumes: BTreeSet<String>,
    /// per-volume problems, rendered [`SourceError`]s; the pod itself is fine
    pub errors: Vec<String>,
    /// SELinux inputs
    pub selinux: PodSeLinux,
    /// `spec.serviceAccountName` (empty when unset)
    pub service_account: String,
    /// `spec.securityContext.fsGroup`
    pub fs_group: Option<i64>,
    /// every container's volumeMounts, env and privilege (init, regular,
    /// ephemeral), for the runtime API's per-container mounts
    pub containers: Vec<ContainerSpec>,
    /// `spec.securityContext.fsGroupChangePolicy` as written
    #[serde(default)]
    pub fs_group_change_policy: Option<String>,
    /// `spec.securityContext.supplementalGroups`
    #[serde(default)]
    pub supplemental_groups: Vec<i64>,
}

impl ParsedPod {
    /// The pod's fsGroup and its change policy, checked: a negative or
    /// too large group, or a policy the API does not know, is an error
    /// naming the field (a volume that would get the group is refused with
    /// it; the pod's other volumes are not concerned).
    pub fn fs_group(&self) -> Result<Option<FsGroup>, String> {
        let policy = match self.fs_group_change_policy.as_deref() {
            None | Some("") => FsGroupChangePolicy::Always,
            Some(p) => FsGroupChangePolicy::parse(p).ok_or_else(|| {
                format!(
                    "spec.securityContext.fsGroupChangePolicy: unknown policy {p:?} \
                     (Always or OnRootMismatch)"
                )
            })?,
        };
        let Some(g) = self.fs_group else {
            return Ok(None);
        };
        let gid = u32::try_from(g).map_err(|_| match g < 0 {
            true => format!("spec.securityContext.fsGroup: {g} is negative"),
            false => format!("spec.securityContext.fsGroup: {g} is not a 32-bit group id"),
        })?;
        Ok(Some(FsGroup { gid, policy }))
    }
}

/// The kubelet's handle of an inline CSI volume: `csi-` and the hex
/// SHA-256 of the pod UID followed by the volume name.
pub fn ephemeral_handle(uid: &PodUid, volume: &str) -> String {
    crate::model::sha256_hex("csi-", format!("{}{volume}", uid.as_str()).as_bytes())
}

/// The UID the kubelet's shape gives a pod without `metadata.uid`.
pub fn hashed_uid(pod: &Pod, node_name: &str, file: &Path) -> Result<PodUid, SourceError> {
    let value = serde_json::to_value(pod).map_err(|e| SourceError::Decode {
        file: file.to_owned(),
        message: e.to_string(),
    })?;
    let mut h = Sha256::new();
    h.update(canonical_json(&value).as_bytes());
    h.update(b"host:");
    h.update(node_name.as_bytes());
    h.update(b"file:");
    h.update(file.as_os_str().as_encoded_bytes());
    let digest = h.finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    PodUid::new(hex).map_err(|source| SourceError::InvalidPodUid {
        file: file.to_owned(),
        cause: source,
    })
}

/// Parses one manifest file's bytes.
pub fn parse_pod(file: &Path, bytes: &[u8], node_name: &str) -> Result<ParsedPod, SourceError> {
    let parse = |message: &str| SourceError::Parse {
        file: file.to_owned(),
        message: message.to_owned(),
    };
    let mut docs = parse_documents(file, bytes)?;
    if docs.len() > 1 {
        return Err(parse(
            "more than one document: a static pod file holds one Pod",
        ));
    }
    let mut doc = docs.pop().ok_or_else(|| parse("no document"))?;
    if kind_of(&doc) != "Pod" {
        return Err(SourceError::WrongKind {
            file: file.to_owned(),
            kind: kind_of(&doc).to_owned(),
            expected: "Pod",
        });
    }
    size_limits_as_strings(&mut doc);
    let pod: Pod = serde_json::from_value(doc).map_err(|e| SourceError::Decode {
        file: file.to_owned(),
        message: e.to_string(),
    })?;
    parse_pod_object(file, &pod, Origin::Static { node_name })
}

/// Where a pod came from, which decides its UID and name.
#[derive(Debug, Clone, Copy)]
pub enum Origin<'a> {
    /// a static manifest: `<metadata.name>-<node>`, a hashed UID when unset
    Static {
        /// `--node-name`
        node_name: &'a str,
    },
    /// the API server: its name and UID as they are (a UID is required)
    Api,
}

/// A decoded Pod, from a manifest or the API server; `file` names it in
/// errors (the manifest, or the object's API path).
pub fn parse_pod_object(
    file: &Path,
    pod: &Pod,
    origin: Origin<'_>,
) -> Result<ParsedPod, SourceError> {
    let missing = |field| SourceError::MissingField {
        file: file.to_owned(),
        field,
    };
    let meta = &pod.metadata;
    let name = meta.name.clone().filter(|n| !n.is_empty());
    let name = name.ok_or_else(|| missing("metadata.name"))?;
    let spec = pod.spec.as_ref().ok_or_else(|| missing("spec"))?;
    let given_uid = meta.uid.as_deref().filter(|u| !u.is_empty());
    let uid = match (given_uid, origin) {
        (Some(uid), _) => PodUid::new(uid).map_err(|source| SourceError::InvalidPodUid {
            file: file.to_owned(),
            cause: source,
        })?,
        (None, Origin::Static { node_name }) => hashed_uid(pod, node_name, file)?,
        (None, Origin::Api) => return Err(missing("metadata.uid")),
    };
    let name = match origin {
        Origin::Static { node_name } => format!("{name}-{}", node_name.to_lowercase()),
        Origin::Api => name,
    };
    let mut out = ParsedPod {
        uid,
        namespace: meta
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".to_owned()),
        name,
        file: file.to_owned(),
        volumes: Vec::new(),
        failed_volumes: BTreeSet::new(),
        errors: Vec::new(),
        selinux: selinux_of(spec),
        service_account: spec.service_account_name.clone().unwrap_or_default(),
        fs_group: spec.security_context.as_ref().and_then(|c| c.fs_group),
        containers: Vec::new(),
        fs_group_change_policy: spec
            .security_context
            .as_ref()
            .and_then(|c| c.fs_group_change_policy.clone()),
        supplemental_groups: spec
            .security_context
            .as_ref()
            .and_then(|c| c.supplemental_groups.clone())
            .unwrap_or_default(),
    };
    let mut seen = BTreeSet::new();
    let ctx = PodPayloadContext::of(pod, &out.name, out.uid.as_str(), &out.namespace);
    // only a memory emptyDir needs it, so only such a volume fails on a bad one
    let memory_limit = super::pod_memory::pod_memory_limit(spec);
    out.containers = containers_of(spec, &ctx);
    for v in spec.volumes.iter().flatten() {
        let parsed = if seen.insert(v.name.clone()) {
            parse_volume(file, v, (&out.uid, &out.name), &ctx, &memory_limit)
        } else {
            Err(invalid(file, &v.name, "duplicate volume name".into()))
        };
        match parsed {
            Ok(p) => out.volumes.push(p),
            Err(e) => {
                out.failed_volumes.insert(v.name.clone());
                out.errors.push(e.to_string());
            }
        }
    }
    // the pod is still served: only the containers' devices are wrong
    for e in check_devices(&out.containers, |n| seen.contains(n)) {
        let e = SourceError::InvalidContainer {
            file: file.to_owned(),
            pod: format!("{}/{}", out.namespace, out.name),
            reason: e,
        };
        out.errors.push(e.to_string());
    }
    Ok(out)
}

fn invalid(file: &Path, volume: &str, reason: String) -> SourceError {
    SourceError::InvalidVolume {
        file: file.to_owned(),
        volume: volume.to_owned(),
        reason,
    }
}

/// The Quantity type only takes strings; Kubernetes also takes `sizeLimit: 1000`.
fn size_limits_as_strings(doc: &mut Value) {
    let volumes = doc
        .pointer_mut("/spec/volumes")
        .and_then(Value::as_array_mut);
    for v in volumes.into_iter().flatten() {
        if let Some(limit) = v.pointer_mut("/emptyDir/sizeLimit")
            && limit.is_number()
        {
            *limit = Value::String(limit.to_string());
        }
    }
}

/// The set source types of a volume, by their API names (`emptyDir`, `secret`).
fn volume_types(v: &Volume) -> Vec<String> {
    match serde_json::to_value(v) {
        Ok(Value::Object(map)) => map.keys().filter(|k| *k != "name").cloned().collect(),
        _ => Vec::new(),
    }
}

/// One volume of the pod `(uid, name)`.
fn parse_volume(
    file: &Path,
    v: &Volume,
    (uid, pod_name): (&PodUid, &str),
    ctx: &PodPayloadContext,
    memory_limit: &Result<Option<u64>, String>,
) -> Result<ParsedVolume, SourceError> {
    let namespace = ctx.namespace.as_str();
    let name = v.name.clone();
    check_dns1123_label("volume name", &name).map_err(|e| invalid(file, &name, e.to_string()))?;
    let types = volume_types(v);
    if types.len() > 1 {
        let reason = format!("more than one volume type: {}", types.join(", "));
        return Err(invalid(file, &name, reason));
    }
    if let Some(spec) = super::payload_volumes::parse(file, v, ctx) {
        return spec.map(|spec| ParsedVolume::Inline { name, spec });
    }
    if let Some(ed) = &v.empty_dir {
        let medium = match ed.medium.as_deref().unwrap_or("") {
            "" => StorageMedium::Disk,
            "Memory" => StorageMedium::Memory,
            other => {
                return Err(SourceError::UnsupportedVolume {
                    file: file.to_owned(),
                    volume: name,
                    volume_type: format!("emptyDir with medium {other}"),
                });
            }
        };
        let size_limit = match &ed.size_limit {
            None => None,
            Some(q) => Some(parse_bytes(&q.0).map_err(|e| invalid(file, &name, e))?),
        };
        let size_limit = match medium {
            StorageMedium::Disk => size_limit.filter(|&n| n > 0),
            // the kubelet sizes a tmpfs by the pod's memory limit too
            StorageMedium::Memory => {
                let pod = memory_limit.clone().map_err(|e| invalid(file, &name, e))?;
                super::pod_memory::memory_empty_dir_size(pod, size_limit)
            }
        };
        let spec = VolumeSpec::EmptyDir { medium, size_limit };
        return Ok(ParsedVolume::Inline { name, spec });
    }
    if let Some(hp) = &v.host_path {
        let path = PathBuf::from(&hp.path);
        if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
            let reason = format!("hostPath {:?} must be absolute without '..'", hp.path);
            return Err(invalid(file, &name, reason));
        }
        let host_path_type = match hp.type_.as_deref().unwrap_or("") {
            "" => HostPathType::Unset,
            "DirectoryOrCreate" => HostPathType::DirectoryOrCreate,
            "Directory" => HostPathType::Directory,
            "FileOrCreate" => HostPathType::FileOrCreate,
            "File" => HostPathType::File,
            "Socket" => HostPathType::Socket,
            "CharDevice" => HostPathType::CharDevice,
            "BlockDevice" => HostPathType::BlockDevice,
            other => {
                return Err(invalid(
                    file,
                    &name,
                    format!("unknown hostPath type {other:?}"),
                ));
            }
        };
        let spec = VolumeSpec::HostPath {
            path: path.into(),
            host_path_type,
        };
        return Ok(ParsedVolume::Inline { name, spec });
    }
    if let Some(csi) = &v.csi {
        check_component("csi driver", &csi.driver)
            .map_err(|e| invalid(file, &name, e.to_string()))?;
        let spec = VolumeSpec::Csi(Box::new(CsiSpec {
            driver: csi.driver.clone(),
            volume_handle: ephemeral_handle(uid, &name),
            fs_type: csi.fs_type.clone().filter(|t| !t.is_empty()),
            attributes: csi.volume_attributes.clone().unwrap_or_default(),
            read_only: csi.read_only.unwrap_or(false),
            // an inline volume's secret is the pod's namespace's
            publish_secret: csi
                .node_publish_secret_ref
                .as_ref()
                .map(|r| r.name.clone())
                .filter(|n| !n.is_empty())
                .map(|name| SecretRef {
                    namespace: namespace.to_owned(),
                    name,
                }),
            ephemeral: true,
            ..CsiSpec::default()
        }));
        return Ok(ParsedVolume::Inline { name, spec });
    }
    if let Some(pvc) = &v.persistent_volume_claim {
        if pvc.claim_name.is_empty() {
            return Err(invalid(file, &name, "empty claimName".into()));
        }
        let claim_name = pvc.claim_name.clone();
        return Ok(ParsedVolume::Claim {
            name,
            claim_name,
            read_only: pvc.read_only.unwrap_or(false),
            ephemeral: false,
        });
    }
    if let Some(eph) = &v.ephemeral {
        // The kubelet names the claim `<pod name>-<volume name>` (the
        // ephemeral volume controller creates it so) and refuses one the
        // pod does not own; both names are DNS labels, so the claim name
        // is one safe path component.
        if eph.volume_claim_template.is_none() {
            return Err(invalid(
                file,
                &name,
                "ephemeral.volumeClaimTemplate is required".into(),
            ));
        }
        let claim_name = format!("{pod_name}-{name}");
        return Ok(ParsedVolume::Claim {
            name,
            claim_name,
            read_only: false,
            ephemeral: true,
        });
    }
    Err(SourceError::UnsupportedVolume {
        file: file.to_owned(),
        volume: name,
        volume_type: types.first().cloned().unwrap_or_else(|| "none".into()),
    })
}

/// Every container's mounts, as written, in the order init, regular,
/// ephemeral. An env var is resolved from a literal value or a `fieldRef`
/// the downward API knows (the pod's name, namespace, UID, labels,
/// annotations, node, service account); any other source stays unknown.
/// Checks wait for the runtime API's answer, which names the container
/// and the mount: a bad mount never stops the pod's volumes.
fn containers_of(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    ctx: &PodPayloadContext,
) -> Vec<ContainerSpec> {
    use k8s_openapi::api::core::v1::{
        EnvVar as K8sEnv, SecurityContext, VolumeDevice, VolumeMount,
    };
    let one = |name: &str,
               sc: Option<&SecurityContext>,
               mounts: Option<&Vec<VolumeMount>>,
               devices: Option<&Vec<VolumeDevice>>,
               env: Option<&Vec<K8sEnv>>| {
        let mounts: Vec<VolumeMountSpec> = mounts
            .into_iter()
            .flatten()
            .map(|m| VolumeMountSpec {
                name: m.name.clone(),
                mount_path: m.mount_path.clone(),
                read_only: m.read_only.unwrap_or(false),
                sub_path: match (m.sub_path.as_deref(), m.sub_path_expr.as_deref()) {
                    (Some(p), _) if !p.is_empty() => SubPath::Path(p.to_owned()),
                    (_, Some(e)) if !e.is_empty() => SubPath::Expr(e.to_owned()),
                    _ => SubPath::None,
                },
                propagation: m.mount_propagation.clone(),
            })
            .collect();
        let wants_env = mounts
            .iter()
            .any(|m| matches!(m.sub_path, SubPath::Expr(_)));
        let env = match wants_env {
            false => Vec::new(),
            true => resolve_env(
                env.into_iter()
                    .flatten()
                    .map(|e| {
                        let from_field = e
                            .value_from
                            .as_ref()
                            .and_then(|f| f.field_ref.as_ref())
                            .and_then(|f| ctx.fields.get(&f.field_path).cloned());
                        let value = match &e.value_from {
                            None => Some(e.value.clone().unwrap_or_default()),
                            Some(_) => from_field,
                        };
                        (e.name.clone(), value)
                    })
                    .collect(),
            ),
        };
        let devices = devices
            .into_iter()
            .flatten()
            .map(|d| VolumeDeviceSpec {
                name: d.name.clone(),
                device_path: d.device_path.clone(),
            })
            .collect();
        ContainerSpec {
            name: name.to_owned(),
            privileged: sc.and_then(|c| c.privileged).unwrap_or(false),
            mounts,
            devices,
            env,
        }
    };
    let mut out = Vec::new();
    for c in spec.init_containers.iter().flatten() {
        out.push(one(
            &c.name,
            c.security_context.as_ref(),
            c.volume_mounts.as_ref(),
            c.volume_devices.as_ref(),
            c.env.as_ref(),
        ));
    }
    for c in &spec.containers {
        out.push(one(
            &c.name,
            c.security_context.as_ref(),
            c.volume_mounts.as_ref(),
            c.volume_devices.as_ref(),
            c.env.as_ref(),
        ));
    }
    for c in spec.ephemeral_containers.iter().flatten() {
        out.push(one(
            &c.name,
            c.security_context.as_ref(),
            c.volume_mounts.as_ref(),
            c.volume_devices.as_ref(),
            c.env.as_ref(),
        ));
    }
    out
}

fn selinux_of(spec: &k8s_openapi::api::core::v1::PodSpec) -> PodSeLinux {
    use k8s_openapi::api::core::v1::{SecurityContext, VolumeMount};
    let ctx = spec.security_context.as_ref();
    let mut containers = Vec::new();
    let mut push =
        |name: &str, kind, sc: Option<&SecurityContext>, mounts: Option<&Vec<VolumeMount>>| {
            let volumes: Vec<String> = mounts
                .into_iter()
                .flatten()
                .map(|m| m.name.clone())
                .collect();
            if volumes.is_empty() {
                return;
            }
            containers.push(ContainerSeLinux {
                name: name.to_owned(),
                kind,
                options: sc
                    .and_then(|sc| sc.se_linux_options.clone())
                    .map(Into::into),
                volumes,
            });
        };
    for c in spec.init_containers.iter().flatten() {
        push(
            &c.name,
            ContainerKind::Init,
            c.security_context.as_ref(),
            c.volume_mounts.as_ref(),
        );
    }
    for c in &spec.containers {
        push(
            &c.name,
            ContainerKind::Regular,
            c.security_context.as_ref(),
            c.volume_mounts.as_ref(),
        );
    }
    for c in spec.ephemeral_containers.iter().flatten() {
        push(
            &c.name,
            ContainerKind::Ephemeral,
            c.security_context.as_ref(),
            c.volume_mounts.as_ref(),
        );
    }
    PodSeLinux {
        pod: ctx.and_then(|c| c.se_linux_options.clone()).map(Into::into),
        change_policy: ctx.and_then(|c| c.se_linux_change_policy.clone()),
        containers,
    }
}

#[cfg(test)]
#[path = "static_pods_tests.rs"]
mod tests;
