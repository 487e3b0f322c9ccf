//! The `--static-objects` directory: PersistentVolumes, PersistentVolumeClaims
//! and CSIDrivers, so PVC-backed volumes work without an API server.
//!
//! - **Files.** Same entry rules as the pods dir (`read.rs`). A file may hold
//!   several objects: multi-document YAML (`---`) and `kind: List` (or any
//!   `…List` kind) with `items`, as `kubectl apply -f` takes them. A
//!   document of another kind is reported and skipped; a bad file loses only
//!   its own objects. The first definition of a name (files sorted) wins.
//! - **Binding** ([`StaticObjects::resolve_claim`]): there is no binder, so a
//!   claim is bound by its `spec.volumeName`, and that PV's `claimRef` must
//!   name the claim (namespace and name; and UID when both sides carry one),
//!   as the kubelet's `getPVCExtractPV` insists on `claimRef`. The claim's
//!   `status.phase` is not required (static files have no status).
//! - **PV types.** `spec.local` (path must be absolute) and `spec.csi`
//!   (driver must be one path component). Access modes and `mountOptions`
//!   are carried. `is_block` of a local PV is left `false` here: whether the
//!   path is a block device is decided by `stat` when a pod's claim is
//!   resolved (`Sources::resolve`), not by reading the objects dir.
//!   `volumeMode` (`Filesystem` when unset, or `Block`) is carried for both;
//!   other PV types are reported as unsupported.
//! - **CSIDriver:** `seLinuxMount` (default false, for the SELinux rules),
//!   `attachRequired` (default true, as the API server defaults it; with no
//!   CSIDriver at all a driver needs attaching, as the kubelet assumes),
//!   `podInfoOnMount`, `fsGroupPolicy`, `requiresRepublish`.
//! - **VolumeAttachment:** matched to a claim's PV by attacher (the driver),
//!   `nodeName` and `source.persistentVolumeName`, not by the name the
//!   attach/detach controller would give it: a static folder names objects
//!   as it likes. A volume whose driver needs attaching is usable only with
//!   one that says `status.attached: true` (the kubelet's WaitForAttach);
//!   its name is the attachment id and its `attachmentMetadata` the
//!   publish context.
//! - **Secret:** `data` (decoded) and `stringData`, for the secrets CSI
//!   calls send; kept only in memory ([`SecretStore`]), never logged.
//! - **Cache.** With a journal dir, what each file parsed to is kept across
//!   a restart (`manifest_cache.rs`, [`CachedObjects`]): a restart over
//!   unchanged files decodes them instead of parsing them. Only a file that
//!   parsed without an error and holds no Secret or ConfigMap is stored,
//!   from a run's first complete listing (a file changed while the daemon
//!   runs is stored at the next start); the first definition of a name
//!   still wins, as the files are replayed in their order.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::SourceError;
use super::csi_objects;
pub use super::csi_objects::{AttachmentInfo, CsiDriverInfo, SecretInfo, SecretStore};
use super::manifest_cache::{ObjectsCache, bytes_hash};
use super::read::{kind_of, parse_documents, read_file};
use super::signature::{FileSignature, manifest_key};
use crate::model::{
    AccessMode, ClaimCondition, ClaimSize, ClaimState, CsiSpec, ResizeStatus, SecretRef,
    VolumeMode, VolumeSpec, check_component,
};

/// A PV's `claimRef`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRef {
    /// `namespace` (empty when unset)
    pub namespace: String,
    /// `name`
    pub name: String,
    /// `uid`, if set
    pub uid: Option<String>,
}

/// The PV annotation whose group a pod using the PV gets as a
/// supplemental group (the kubelet's `VolumeGidAnnotationKey`).
pub const PV_GID_ANNOTATION: &str = "pv.beta.kubernetes.io/gid";

/// A PersistentVolume as read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PvInfo {
    /// the file it came from
    pub file: PathBuf,
    /// `spec.claimRef`
    pub claim_ref: Option<ClaimRef>,
    /// the spec, or why it cannot be used (the message names file and PV);
    /// shared with the DSW volumes of the pods that claim it
    pub spec: Result<Arc<VolumeSpec>, String>,
    /// the `pv.beta.kubernetes.io/gid` annotation, when it is a group id
    /// (the kubelet ignores one that does not parse)
    pub gid: Option<u32>,
    /// `spec.capacity.storage` in bytes (none when unset or not a
    /// quantity: the volume is then never expanded)
    pub capacity: Option<u64>,
    /// the same as written
    pub capacity_text: Option<String>,
}

/// A PersistentVolumeClaim as read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PvcInfo {
    /// the file it came from
    pub file: PathBuf,
    /// `spec.volumeName`
    pub volume_name: Option<String>,
    /// `metadata.uid`
    pub uid: Option<String>,
    /// the UID of its controller: the first `ownerReferences` entry with
    /// `controller: true` (a generic ephemeral volume's claim names its pod)
    pub controller: Option<String>,
    /// `metadata.resourceVersion`
    pub resource_version: Option<String>,
    /// what its status says of its size (node expansion)
    pub size: ClaimSize,
    /// `status.conditions`
    pub conditions: Vec<ClaimCondition>,
}

/// Every object of the static objects dir.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StaticObjects {
    /// PVs by name
    pub pvs: BTreeMap<String, PvInfo>,
    /// PVCs by (namespace, name)
    pub pvcs: BTreeMap<(String, String), PvcInfo>,
    /// CSIDrivers by name
    pub csi_drivers: BTreeMap<String, CsiDriverInfo>,
    /// VolumeAttachments by name
    pub attachments: BTreeMap<String, AttachmentInfo>,
    /// Secrets by (namespace, name)
    pub secrets: BTreeMap<(String, String), SecretInfo>,
    /// what the API server sent, not the static objects dir (errors say so)
    pub from_api: bool,
    /// ConfigMaps and Secrets for payload volumes
    pub payload: super::payload_objects::PayloadObjects,
}

/// One object of an objects file, parsed: what it adds to
/// [`StaticObjects`] once it meets the other files' objects (where the
/// first definition of a name wins).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ParsedObject {
    /// a PersistentVolume, by name
    Pv(String, PvInfo),
    /// a PersistentVolumeClaim, by (namespace, name)
    Pvc((String, String), PvcInfo),
    /// a CSIDriver, by name
    CsiDriver(String, CsiDriverInfo),
    /// a VolumeAttachment, by name
    Attachment(String, AttachmentInfo),
}

impl ParsedObject {
    fn file(&self) -> &Path {
        match self {
            Self::Pv(_, i) => &i.file,
            Self::Pvc(_, i) => &i.file,
            Self::CsiDriver(_, i) => &i.file,
            Self::Attachment(_, i) => &i.file,
        }
    }
}

/// What one objects file parsed to, as the objects cache keeps it
/// (`manifest_cache.rs`): only files whose every document is one of these
/// kinds and parsed without an error (never a Secret).
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedObjects(pub Vec<ParsedObject>);

/// One document of an objects file, in the file's order.
enum Item {
    Object(ParsedObject),
    /// a Secret or ConfigMap: added as it is, never cached
    Payload(String, Value),
    /// the document's error
    Error(SourceError),
}

/// What one objects file gave: its items in order, or why it could not be
/// read or parsed.
type FileItems = Result<(Vec<Item>, u64), SourceError>;

/// Objects files from which [`StaticObjects::load_cached`] uses a second
/// thread for the parse.
const PARALLEL_PARSE_FROM: usize = 32;

impl StaticObjects {
    /// Reads every file (sorted); returns the objects and every problem.
    pub fn load(files: &[PathBuf]) -> (Self, Vec<SourceError>) {
        Self::load_cached(files, &[], None, None)
    }

    /// [`StaticObjects::load`] with the objects cache: each of `files`
    /// whose signature (in `sigs`, in the same order; none: no lookup) the
    /// cache has is decoded instead of parsed, and each file parsed is told
    /// to it (`listed_at`: when the listing began). Files are parsed on two
    /// threads when there are many; their objects are added in file order
    /// whatever their origin, so the result is the same.
    pub(crate) fn load_cached(
        files: &[PathBuf],
        sigs: &[FileSignature],
        mut cache: Option<&mut ObjectsCache>,
        listed_at: Option<SystemTime>,
    ) -> (Self, Vec<SourceError>) {
        let mut objects = Self::default();
        let mut errors = Vec::new();
        // per file, its cached objects (`None`: to parse)
        let cached: Vec<Option<CachedObjects>> = files
            .iter()
            .enumerate()
            .map(|(i, file)| {
                let (c, sig) = (cache.as_deref_mut()?, sigs.get(i)?);
                let hit = c.lookup(manifest_key(file), sig)?;
                hit.0
                    .iter()
                    .all(|o| o.file() == file.as_path())
                    .then_some(hit)
            })
            .collect();
        let to_parse: Vec<&PathBuf> = files
            .iter()
            .zip(&cached)
            .filter(|(_, c)| c.is_none())
            .map(|(f, _)| f)
            .collect();
        let all = |files: &[&PathBuf]| {
            files
                .iter()
                .map(|f| read_file(f).map(|b| (parse_file(f, &b), bytes_hash(&b))))
                .collect::<Vec<FileItems>>()
        };
        let at = match to_parse.len() >= PARALLEL_PARSE_FROM {
            true => to_parse.len() / 2,
            false => to_parse.len(),
        };
        let (mut parsed, rest) =
            crate::util::halves::in_two_halves("volumed-objects", &to_parse, at, all);
        parsed.extend(rest);
        let mut parsed = parsed.into_iter();
        for (i, (file, hit)) in files.iter().zip(cached).enumerate() {
            if let Some(hit) = hit {
                for o in hit.0 {
                    objects.insert_parsed(o, &mut errors);
                }
                continue;
            }
            let Some(got) = parsed.next() else { break };
            let (items, bytes) = match got {
                Ok(got) => got,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            let storable = items.iter().all(|i| matches!(i, Item::Object(_)));
            let (Some(c), Some(sig), Some(at), true) =
                (cache.as_deref_mut(), sigs.get(i), listed_at, storable)
            else {
                objects.add_items(file, items, &mut errors);
                continue;
            };
            let found = CachedObjects(
                items
                    .into_iter()
                    .filter_map(|i| match i {
                        Item::Object(o) => Some(o),
                        _ => None,
                    })
                    .collect(),
            );
            c.parsed(manifest_key(file), *sig, bytes, &found, at);
            for o in found.0 {
                objects.insert_parsed(o, &mut errors);
            }
        }
        (objects, errors)
    }

    /// Adds the objects of one file's bytes, as [`StaticObjects::load`]
    /// reads them: the fuzz targets' way in, with no file to write.
    #[doc(hidden)]
    pub fn add_file(&mut self, file: &Path, bytes: &[u8], errors: &mut Vec<SourceError>) {
        self.add_items(file, parse_file(file, bytes), errors);
    }

    /// Adds one file's items in their order.
    fn add_items(&mut self, file: &Path, items: Vec<Item>, errors: &mut Vec<SourceError>) {
        for item in items {
            let added = match item {
                Item::Object(o) => {
                    self.insert_parsed(o, errors);
                    continue;
                }
                Item::Payload(kind, doc) => self.add_object(file, &kind, doc),
                Item::Error(e) => Err(e),
            };
            if let Err(e) = added {
                errors.push(e);
            }
        }
    }

    /// Adds one parsed object; a name defined before is an error.
    fn insert_parsed(&mut self, o: ParsedObject, errors: &mut Vec<SourceError>) {
        if let Err(e) = self.insert_object(o) {
            errors.push(e);
        }
    }

    pub(crate) fn add_object(
        &mut self,
        file: &Path,
        kind: &str,
        doc: Value,
    ) -> Result<(), SourceError> {
        match kind {
            "Secret" => self.add_secret(file, doc),
            "ConfigMap" => self.add_config_map(file, doc),
            _ => self.insert_object(parse_object(file, kind, doc)?),
        }
    }

    fn insert_object(&mut self, o: ParsedObject) -> Result<(), SourceError> {
        match o {
            ParsedObject::Pv(name, info) => {
                let file = info.file.clone();
                insert_new(
                    &mut self.pvs,
                    name.clone(),
                    info,
                    &file,
                    "PersistentVolume",
                    name,
                )
            }
            ParsedObject::Pvc((ns, name), info) => {
                let file = info.file.clone();
                let shown = format!("{ns}/{name}");
                insert_new(
                    &mut self.pvcs,
                    (ns, name),
                    info,
                    &file,
                    "PersistentVolumeClaim",
                    shown,
                )
            }
            ParsedObject::CsiDriver(name, info) => {
                let file = info.file.clone();
                insert_new(
                    &mut self.csi_drivers,
                    name.clone(),
                    info,
                    &file,
                    "CSIDriver",
                    name,
                )
            }
            ParsedObject::Attachment(name, info) => {
                let file = info.file.clone();
                let shown = name.clone();
                insert_new(
                    &mut self.attachments,
                    name,
                    info,
                    &file,
                    "VolumeAttachment",
                    shown,
                )
            }
        }
    }
}

/// One file's bytes as items, in document order (a `…List`'s items in
/// its place).
fn parse_file(file: &Path, bytes: &[u8]) -> Vec<Item> {
    let mut items = Vec::new();
    match parse_documents(file, bytes) {
        Ok(docs) => {
            for doc in docs {
                document_items(file, doc, &mut items);
            }
        }
        Err(e) => items.push(Item::Error(e)),
    }
    items
}

fn document_items(file: &Path, doc: Value, items: &mut Vec<Item>) {
    let kind = kind_of(&doc).to_owned();
    if kind.ends_with("List") {
        match doc {
            Value::Object(mut map) => match map.remove("items") {
                Some(Value::Array(list)) => {
                    for item in list {
                        document_items(file, item, items);
                    }
                }
                None | Some(Value::Null) => {}
                Some(_) => items.push(Item::Error(SourceError::Decode {
                    file: file.to_owned(),
                    message: format!("{kind}: items is not a list"),
                })),
            },
            _ => items.push(Item::Error(SourceError::Decode {
                file: file.to_owned(),
                message: format!("{kind}: not an object"),
            })),
        }
        return;
    }
    items.push(match kind.as_str() {
        "Secret" | "ConfigMap" => Item::Payload(kind, doc),
        _ => match parse_object(file, &kind, doc) {
            Ok(o) => Item::Object(o),
            Err(e) => Item::Error(e),
        },
    });
}

/// One document of a kind other than Secret and ConfigMap.
fn parse_object(file: &Path, kind: &str, doc: Value) -> Result<ParsedObject, SourceError> {
    match kind {
        "PersistentVolume" => {
            let pv: PersistentVolume = decode(file, doc)?;
            let name = object_name(file, pv.metadata.name, "PersistentVolume")?;
            let spec = pv.spec.unwrap_or_default();
            let claim_ref = spec.claim_ref.as_ref().map(|r| ClaimRef {
                namespace: r.namespace.clone().unwrap_or_default(),
                name: r.name.clone().unwrap_or_default(),
                uid: r.uid.clone().filter(|u| !u.is_empty()),
            });
            let gid = pv
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(PV_GID_ANNOTATION))
                .and_then(|g| g.trim().parse().ok());
            let capacity = storage_bytes(spec.capacity.as_ref());
            let capacity_text = (spec.capacity.as_ref())
                .and_then(|m| m.get("storage"))
                .map(|q| q.0.clone());
            let info = PvInfo {
                file: file.to_owned(),
                gid,
                capacity,
                capacity_text,
                claim_ref,
                spec: pv_spec(file, &name, &spec)
                    .map(Arc::new)
                    .map_err(|e| e.to_string()),
            };
            Ok(ParsedObject::Pv(name, info))
        }
        "PersistentVolumeClaim" => {
            // kept as read: a status update writes back the conditions it
            // does not own, fields and times as they were
            let conditions = claim_conditions(doc.pointer("/status/conditions"));
            let pvc: PersistentVolumeClaim = decode(file, doc)?;
            let status = pvc.status.unwrap_or_default();
            let size = ClaimSize {
                status_capacity: storage_bytes(status.capacity.as_ref()),
                allocated: status
                    .allocated_resources
                    .as_ref()
                    .is_some_and(|m| m.contains_key("storage")),
                resize_status: status
                    .allocated_resource_statuses
                    .as_ref()
                    .and_then(|m| m.get("storage"))
                    .map(|s| ResizeStatus::parse(s)),
            };
            let name = object_name(file, pvc.metadata.name, "PersistentVolumeClaim")?;
            let ns = pvc.metadata.namespace.filter(|n| !n.is_empty());
            let ns = ns.unwrap_or_else(|| "default".to_owned());
            let info = PvcInfo {
                file: file.to_owned(),
                volume_name: pvc
                    .spec
                    .and_then(|s| s.volume_name)
                    .filter(|v| !v.is_empty()),
                uid: pvc.metadata.uid.filter(|u| !u.is_empty()),
                controller: pvc
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .find(|r| r.controller == Some(true))
                    .map(|r| r.uid.clone()),
                resource_version: pvc.metadata.resource_version.filter(|v| !v.is_empty()),
                size,
                conditions,
            };
            Ok(ParsedObject::Pvc((ns, name), info))
        }
        "CSIDriver" => {
            let (name, info) = csi_objects::csi_driver(file, doc)?;
            Ok(ParsedObject::CsiDriver(name, info))
        }
        "VolumeAttachment" => {
            let (name, info) = csi_objects::attachment(file, doc)?;
            Ok(ParsedObject::Attachment(name, info))
        }
        _ => Err(SourceError::UnsupportedKind {
            file: file.to_owned(),
            kind: kind.to_owned(),
        }),
    }
}

impl StaticObjects {
    /// Publishes the Secrets to `store` (the CSI plugin reads them there).
    pub fn publish_secrets(&self, store: &SecretStore) {
        store.replace(&self.secrets);
    }

    fn whence(&self) -> &'static str {
        match self.from_api {
            true => "the API server's objects",
            false => "the static objects",
        }
    }

    /// Whether the claim `namespace/claim` of a generic ephemeral volume was
    /// made for the pod `(uid, name)`: its controller must be the pod, as
    /// the kubelet's `VolumeIsForPod` insists (a claim of that name made by
    /// hand, or for another pod, is refused with the kubelet's message). A
    /// claim not there yet is left to [`Self::resolve_claim`] to report.
    pub fn check_owner(
        &self,
        pod_file: &Path,
        volume: &str,
        namespace: &str,
        claim: &str,
        (uid, name): (&str, &str),
    ) -> Result<(), SourceError> {
        let key = (namespace.to_owned(), claim.to_owned());
        match self.pvcs.get(&key) {
            Some(pvc) if pvc.controller.as_deref() != Some(uid) => Err(SourceError::Claim {
                file: pod_file.to_owned(),
                volume: volume.to_owned(),
                claim: format!("{namespace}/{claim}"),
                reason: format!(
                    "PVC {namespace}/{claim} was not created for pod {namespace}/{name} (pod is not owner)"
                ),
            }),
            _ => Ok(()),
        }
    }

    /// Resolves a pod's claim to (PV name, spec) for a pod on `node`.
    /// `pod_file` and `volume` only name the error.
    pub fn resolve_claim(
        &self,
        pod_file: &Path,
        volume: &str,
        namespace: &str,
        claim: &str,
        node: &str,
    ) -> Result<(String, Arc<VolumeSpec>), SourceError> {
        let fail = |reason: String| SourceError::Claim {
            file: pod_file.to_owned(),
            volume: volume.to_owned(),
            claim: format!("{namespace}/{claim}"),
            reason,
        };
        let key = (namespace.to_owned(), claim.to_owned());
        let pvc = self
            .pvcs
            .get(&key)
            .ok_or_else(|| fail(format!("not found in {}", self.whence())))?;
        let pvc_file = pvc.file.display();
        let pv_name = pvc
            .volume_name
            .as_deref()
            .ok_or_else(|| fail(format!("not bound: spec.volumeName is empty in {pvc_file}")))?;
        let pv = self.pvs.get(pv_name).ok_or_else(|| {
            fail(format!(
                "bound ({pvc_file}) to PersistentVolume {pv_name:?}, which is not in {}",
                self.whence()
            ))
        })?;
        let pv_file = pv.file.display();
        let Some(r) = &pv.claim_ref else {
            return Err(fail(format!(
                "PersistentVolume {pv_name:?} ({pv_file}) has no claimRef, so it is not bound to the claim"
            )));
        };
        let uid_mismatch = matches!((&r.uid, &pvc.uid), (Some(a), Some(b)) if a != b);
        if r.namespace != namespace || r.name != claim || uid_mismatch {
            return Err(fail(format!(
                "PersistentVolume {pv_name:?} ({pv_file}) has claimRef {}/{}{}, not the claim {namespace}/{claim} ({pvc_file})",
                r.namespace,
                r.name,
                if uid_mismatch {
                    " with another uid"
                } else {
                    ""
                }
            )));
        }
        let mut spec = pv.spec.clone().map_err(fail)?;
        if let VolumeSpec::Csi(c) = &*spec {
            let driver = self.csi_drivers.get(&c.driver);
            let selinux_mount = driver.is_some_and(|d| d.se_linux_mount);
            let republish = driver.is_some_and(|d| d.requires_republish);
            let attachment = match driver.is_none_or(|d| d.attach_required) {
                true => Some(
                    csi_objects::attached(&self.attachments, &c.driver, pv_name, node)
                        .map_err(fail)?,
                ),
                false => None,
            };
            // the claim's size travels with the spec, so the claim's
            // status changing (a resize) reaches the volume
            let claim = Some(Arc::new(ClaimState {
                namespace: namespace.to_owned(),
                name: claim.to_owned(),
                resource_version: pvc.resource_version.clone(),
                pv_capacity: pv.capacity,
                pv_capacity_text: pv.capacity_text.clone(),
                size: pvc.size.clone(),
                conditions: pvc.conditions.clone(),
            }));
            // a copy of the PV's spec only when the driver or claim changes it
            if (c.selinux_mount != selinux_mount
                || c.attachment != attachment
                || c.republish != republish
                || c.claim != claim)
                && let VolumeSpec::Csi(c) = Arc::make_mut(&mut spec)
            {
                c.selinux_mount = selinux_mount;
                c.attachment = attachment;
                c.republish = republish;
                c.claim = claim;
            }
        }
        Ok((pv_name.to_owned(), spec))
    }
}

/// A resource list's `storage` in bytes; none when unset or not a
/// quantity (the API server validates it; a static file may not).
fn storage_bytes(
    list: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> Option<u64> {
    let q = list?.get("storage")?;
    super::quantity::parse_bytes(&q.0).ok()
}

/// A claim's `status.conditions` as read; an entry that is not an object
/// is skipped.
fn claim_conditions(list: Option<&Value>) -> Vec<ClaimCondition> {
    let text = |c: &Value, k: &str| c.get(k).and_then(Value::as_str).map(str::to_owned);
    list.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|c| c.is_object())
        .map(|c| ClaimCondition {
            kind: text(c, "type").unwrap_or_default(),
            status: text(c, "status").unwrap_or_default(),
            reason: text(c, "reason"),
            message: text(c, "message"),
            last_probe_time: text(c, "lastProbeTime"),
            last_transition_time: text(c, "lastTransitionTime"),
        })
        .collect()
}

fn secret_ref(r: &Option<k8s_openapi::api::core::v1::SecretReference>) -> Option<SecretRef> {
    let r = r.as_ref()?;
    Some(SecretRef {
        namespace: r.namespace.clone().unwrap_or_else(|| "default".to_owned()),
        name: r.name.clone().filter(|n| !n.is_empty())?,
    })
}

pub(super) fn decode<T: DeserializeOwned>(file: &Path, doc: Value) -> Result<T, SourceError> {
    serde_json::from_value(doc).map_err(|e| SourceError::Decode {
        file: file.to_owned(),
        message: e.to_string(),
    })
}

pub(super) fn object_name(
    file: &Path,
    name: Option<String>,
    kind: &str,
) -> Result<String, SourceError> {
    let name = name
        .filter(|n| !n.is_empty())
        .ok_or(SourceError::MissingField {
            file: file.to_owned(),
            field: "metadata.name",
        })?;
    check_component("object name", &name).map_err(|e| SourceError::Decode {
        file: file.to_owned(),
        message: format!("{kind}: {e}"),
    })?;
    Ok(name)
}

pub(super) fn insert_new<K: Ord, V: HasFile>(
    map: &mut BTreeMap<K, V>,
    key: K,
    value: V,
    file: &Path,
    kind: &'static str,
    shown: String,
) -> Result<(), SourceError> {
    if let Some(existing) = map.get(&key) {
        return Err(SourceError::DuplicateObject {
            file: file.to_owned(),
            kind,
            name: shown,
            other: existing.file().to_owned(),
        });
    }
    map.insert(key, value);
    Ok(())
}

pub(super) trait HasFile {
    fn file(&self) -> &Path;
}
impl HasFile for PvInfo {
    fn file(&self) -> &Path {
        &self.file
    }
}
impl HasFile for PvcInfo {
    fn file(&self) -> &Path {
        &self.file
    }
}

/// Fields of a PV spec that are not a volume source.
const NOT_A_SOURCE: [&str; 9] = [
    "accessModes",
    "capacity",
    "claimRef",
    "mountOptions",
    "nodeAffinity",
    "persistentVolumeReclaimPolicy",
    "storageClassName",
    "volumeAttributesClassName",
    "volumeMode",
];

fn pv_spec(file: &Path, pv: &str, spec: &PersistentVolumeSpec) -> Result<VolumeSpec, SourceError> {
    let invalid = |reason: String| SourceError::InvalidPv {
        file: file.to_owned(),
        pv: pv.to_owned(),
        reason,
    };
    let unsupported = |volume_type: String| SourceError::UnsupportedPv {
        file: file.to_owned(),
        pv: pv.to_owned(),
        volume_type,
    };
    // both PV types volumed knows take either mode (the kubelet's local and
    // CSI plugins are both block volume mappers)
    let volume_mode = VolumeMode::parse(spec.volume_mode.as_deref()).ok_or_else(|| {
        invalid(format!(
            "volumeMode {:?} is neither Filesystem nor Block",
            spec.volume_mode.as_deref().unwrap_or_default()
        ))
    })?;
    let mut access_modes = Vec::new();
    for m in spec.access_modes.iter().flatten() {
        access_modes.push(match m.as_str() {
            "ReadWriteOncePod" => AccessMode::ReadWriteOncePod,
            "ReadWriteOnce" => AccessMode::ReadWriteOnce,
            "ReadOnlyMany" => AccessMode::ReadOnlyMany,
            "ReadWriteMany" => AccessMode::ReadWriteMany,
            other => return Err(invalid(format!("unknown access mode {other:?}"))),
        });
    }
    let mount_options = spec.mount_options.clone().unwrap_or_default();
    let fs_type = |t: &Option<String>| t.clone().filter(|t| !t.is_empty());
    if let Some(local) = &spec.local {
        let path = PathBuf::from(&local.path);
        if !path.is_absolute() {
            return Err(invalid(format!(
                "local path {:?} is not absolute",
                local.path
            )));
        }
        return Ok(VolumeSpec::Local {
            path: path.into(),
            fs_type: fs_type(&local.fs_type),
            access_modes,
            mount_options,
            is_block: false,
            volume_mode,
        });
    }
    if let Some(csi) = &spec.csi {
        check_component("csi driver", &csi.driver).map_err(|e| invalid(e.to_string()))?;
        if csi.volume_handle.is_empty() {
            return Err(invalid("csi volumeHandle is empty".to_owned()));
        }
        return Ok(VolumeSpec::Csi(Box::new(CsiSpec {
            driver: csi.driver.clone(),
            volume_handle: csi.volume_handle.clone(),
            fs_type: fs_type(&csi.fs_type),
            access_modes,
            mount_options,
            attributes: csi.volume_attributes.clone().unwrap_or_default(),
            selinux_mount: false,
            read_only: csi.read_only.unwrap_or(false),
            stage_secret: secret_ref(&csi.node_stage_secret_ref),
            publish_secret: secret_ref(&csi.node_publish_secret_ref),
            expand_secret: secret_ref(&csi.node_expand_secret_ref),
            attachment: None,
            ephemeral: false,
            republish: false,
            volume_mode,
            claim: None,
        })));
    }
    let types: Vec<String> = match serde_json::to_value(spec) {
        Ok(Value::Object(map)) => map
            .keys()
            .filter(|k| !NOT_A_SOURCE.contains(&k.as_str()))
            .cloned()
            .collect(),
        _ => Vec::new(),
    };
    Err(unsupported(
        types.first().cloned().unwrap_or_else(|| "none".to_owned()),
    ))
}

#[cfg(test)]
#[path = "static_objects_tests.rs"]
mod tests;
