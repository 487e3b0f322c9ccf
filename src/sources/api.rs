//! The API server as a pod source, the pure half: what the watches said,
//! turned into [`SourceEvent`]s. The watches themselves (kube's runtime
//! watcher, every request) are in `crate::apiserver`.
//!
//! Follows the kubelet's API source (`pkg/kubelet/config/apiserver.go`)
//! and its populator:
//! - pods of this node only (the watch's `spec.nodeName` field selector,
//!   checked again here); a mirror pod (annotation
//!   `kubernetes.io/config.mirror`) is the API's copy of a static pod, whose
//!   volumes the static source owns, so it is skipped;
//! - a pod whose phase is `Succeeded` or `Failed` has no running
//!   containers: its volumes are no longer wanted. A pod being deleted
//!   (`deletionTimestamp`) keeps them until the object is gone — its
//!   containers may still run through the grace period, and volumed cannot
//!   see them (the kubelet asks its runtime);
//! - claims resolve against the PVs, claims, CSIDrivers and
//!   VolumeAttachments the API server sent, with the static objects' rules.
//!
//! **Relists keep pods.** A watch that restarts (a disconnect the watcher
//! cannot resume, a `410 Gone`) lists again: kube's watcher reports `Init`,
//! every object, then `InitDone`. Until `InitDone` nothing is removed;
//! then whatever that list did not contain is gone (deleted while the
//! watch was down, or while volumed was). An API server that errors keeps
//! every pod as it was (k8s #120150).
//!
//! **Cost.** A change marks the pods it concerns dirty: a pod's own event
//! that pod; a claim the pods naming it; a PV the pods of its `claimRef`;
//! a VolumeAttachment the pods of its PV's claim; a CSIDriver (rare) every
//! pod. [`ApiState::take_events`] resolves only dirty pods, so N pod
//! events cost O(N) whatever the node holds.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

pub use super::api_refs::{FollowChanges, ObjectRef, Part, PodRefs};
pub use super::api_secrets::secret_from_api;
use super::api_secrets::{secrets_named, spec_refs};
use super::resolve::Resolver;
use super::static_objects::StaticObjects;
use super::static_pods::{Origin, ParsedPod, parse_pod_object};
use super::{SourceEvent, fingerprint};
use crate::host::sys::Sys;
use crate::model::PodUid;
use crate::plugins::payload::ObjectStores;

/// Where an API pod's "file" points: its object's path on the API server.
const POD_PATH_PREFIX: &str = "/api/v1/namespaces/";

/// Whether `pod` came from the API server (its `file` is its API path).
pub fn is_api_pod(pod: &super::DesiredPod) -> bool {
    pod.file.starts_with(POD_PATH_PREFIX)
}

/// The annotation the kubelet puts on the API copy of a static pod.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// What the source watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// this node's pods
    Pod,
    /// PersistentVolumes
    PersistentVolume,
    /// PersistentVolumeClaims
    PersistentVolumeClaim,
    /// CSIDrivers
    CsiDriver,
    /// VolumeAttachments
    VolumeAttachment,
}

impl Kind {
    /// Every kind; the source is listed once each has been.
    pub const ALL: [Kind; 5] = [
        Kind::Pod,
        Kind::PersistentVolume,
        Kind::PersistentVolumeClaim,
        Kind::CsiDriver,
        Kind::VolumeAttachment,
    ];

    /// The object kind, as manifests spell it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Pod => "Pod",
            Kind::PersistentVolume => "PersistentVolume",
            Kind::PersistentVolumeClaim => "PersistentVolumeClaim",
            Kind::CsiDriver => "CSIDriver",
            Kind::VolumeAttachment => "VolumeAttachment",
        }
    }

    fn api_path(self, namespace: &str, name: &str) -> PathBuf {
        let p = match self {
            Kind::Pod => format!("{POD_PATH_PREFIX}{namespace}/pods/{name}"),
            Kind::PersistentVolume => format!("/api/v1/persistentvolumes/{name}"),
            Kind::PersistentVolumeClaim => {
                format!("/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}")
            }
            Kind::CsiDriver => format!("/apis/storage.k8s.io/v1/csidrivers/{name}"),
            Kind::VolumeAttachment => format!("/apis/storage.k8s.io/v1/volumeattachments/{name}"),
        };
        PathBuf::from(p)
    }
}

/// One thing a watch reported.
#[derive(Debug, Clone)]
pub enum Change {
    /// the watch of this kind lists again (kube's `Init`)
    Relist(Kind),
    /// that list is complete (`InitDone`)
    Listed(Kind),
    /// a pod was added or changed (also while listing)
    PodApplied(Box<Pod>),
    /// a pod was deleted
    PodDeleted(Box<Pod>),
    /// an object of another kind was added or changed
    Applied(Kind, Value),
    /// an object of another kind was deleted
    Deleted(Kind, Value),
}

/// What the API server said, and what the DSW was last told of it.
#[derive(Debug)]
pub struct ApiState {
    node_name: String,
    objects: StaticObjects,
    /// the pods this node runs, parsed (claims unresolved)
    pods: BTreeMap<PodUid, ParsedPod>,
    /// what the DSW was last told of each pod, by [`fingerprint`]
    sent: BTreeMap<PodUid, u64>,
    dirty: BTreeSet<PodUid>,
    all_dirty: bool,
    /// which pods refer to which claim, ConfigMap, Secret or token
    refs: PodRefs,
    /// where payload objects are read when a pod is resolved (the plugins
    /// read the same stores, in the same order)
    payload: ObjectStores,
    /// pods held back waiting for a followed object's first report; not
    /// looked at again until one of their objects reports
    /// ([`ApiState::object_reported`] marks them dirty) or they change: a
    /// node's first list holds every pod until its token comes, and
    /// walking all of them again on each report was quadratic
    held: BTreeSet<PodUid>,
    /// per kind relisting, the keys seen since its `Init`
    relisting: BTreeMap<Kind, BTreeSet<String>>,
    listed: BTreeSet<Kind>,
    errors: Vec<String>,
}

impl ApiState {
    /// Nothing known yet, for the node `node_name`.
    pub fn new(node_name: &str) -> Self {
        Self {
            node_name: node_name.to_owned(),
            objects: StaticObjects {
                from_api: true,
                ..StaticObjects::default()
            },
            pods: BTreeMap::new(),
            sent: BTreeMap::new(),
            dirty: BTreeSet::new(),
            all_dirty: false,
            refs: PodRefs::default(),
            payload: ObjectStores::default(),
            held: BTreeSet::new(),
            relisting: BTreeMap::new(),
            listed: BTreeSet::new(),
            errors: Vec::new(),
        }
    }

    /// Payload volumes read their objects and tokens from `stores`.
    pub fn with_payload(mut self, stores: ObjectStores) -> Self {
        self.payload = stores;
        self
    }

    /// The ConfigMaps, Secrets and tokens to stop and to start following
    /// since the last call, when any.
    pub fn take_follow_changes(&mut self) -> Option<FollowChanges> {
        self.refs.take_follow_changes()
    }

    /// A followed object reported (it is now in the API store, or gone,
    /// or its watch or request failed): its pods are resolved again.
    pub fn object_reported(&mut self, r: &ObjectRef) {
        if self.refs.reported(r) {
            self.dirty.extend(self.refs.users(r).cloned());
        }
    }

    /// Whether no pod is held back waiting for a followed object's first
    /// report (the DSW is not marked ready before).
    pub fn settled(&self) -> bool {
        self.held.is_empty()
    }

    /// Whether every kind has been listed completely once: until then
    /// the DSW must not be marked ready (nothing is unmounted).
    pub fn listed(&self) -> bool {
        Kind::ALL.iter().all(|k| self.listed.contains(k))
    }

    /// Where the pod `r` is bound to puts that token: (volume name, path
    /// in the volume) of each projected source asking for it.
    pub fn token_paths(&self, r: &crate::model::TokenRef) -> Vec<(String, String)> {
        let pod = PodUid::new(&r.pod_uid).ok();
        pod.and_then(|u| self.pods.get(&u))
            .map(|p| super::api_secrets::token_paths(p, r))
            .unwrap_or_default()
    }

    /// The pods the DSW was last told about.
    pub fn sent(&self) -> &BTreeMap<PodUid, u64> {
        &self.sent
    }

    /// The objects as the API server sent them.
    pub fn objects(&self) -> &StaticObjects {
        &self.objects
    }

    /// Problems since the last call (objects that cannot be read), each
    /// naming the object: for the caller to log.
    pub fn take_errors(&mut self) -> Vec<String> {
        std::mem::take(&mut self.errors)
    }

    /// Takes in one change.
    pub fn apply(&mut self, change: Change) {
        match change {
            Change::Relist(kind) => {
                self.relisting.insert(kind, BTreeSet::new());
            }
            Change::Listed(kind) => self.finish_list(kind),
            Change::PodApplied(pod) => self.pod_applied(&pod),
            Change::PodDeleted(pod) => {
                if let Some(uid) = pod
                    .metadata
                    .uid
                    .as_deref()
                    .and_then(|u| PodUid::new(u).ok())
                {
                    self.drop_pod(&uid);
                }
            }
            Change::Applied(kind, doc) => self.object_applied(kind, doc),
            Change::Deleted(kind, doc) => {
                let (ns, name) = meta_key(kind, &doc);
                self.remove_object(kind, &ns, &name);
            }
        }
    }

    fn pod_applied(&mut self, pod: &Pod) {
        let meta = &pod.metadata;
        let ns = meta.namespace.as_deref().unwrap_or("default");
        let name = meta.name.as_deref().unwrap_or("");
        let file = Kind::Pod.api_path(ns, name);
        let uid = meta.uid.as_deref().and_then(|u| PodUid::new(u).ok());
        if let (Some(seen), Some(uid)) = (self.relisting.get_mut(&Kind::Pod), &uid) {
            seen.insert(uid.as_str().to_owned());
        }
        // (a pod without a spec is an error below, not another node's)
        let on_node = pod.spec.as_ref().map(|s| s.node_name.as_deref());
        let mirror = meta
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION));
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let finished = matches!(phase, Some("Succeeded" | "Failed"));
        let elsewhere = on_node.is_some_and(|n| n != Some(self.node_name.as_str()));
        if mirror || finished || elsewhere {
            if let Some(uid) = uid {
                self.drop_pod(&uid);
            }
            return;
        }
        match parse_pod_object(&file, pod, Origin::Api) {
            Ok(p) => {
                let uid = p.uid.clone();
                self.refs.set(&uid, Part::Spec, spec_refs(&p));
                self.pods.insert(uid.clone(), p);
                self.dirty.insert(uid);
            }
            // Like a half-written manifest: a pod the server sends in a
            // shape we cannot read keeps what it had.
            Err(e) => self.errors.push(e.to_string()),
        }
    }

    fn drop_pod(&mut self, uid: &PodUid) {
        self.refs.forget(uid);
        if self.pods.remove(uid).is_some() || self.sent.contains_key(uid) {
            self.dirty.insert(uid.clone());
        }
    }

    fn object_applied(&mut self, kind: Kind, doc: Value) {
        let (ns, name) = meta_key(kind, &doc);
        if let Some(seen) = self.relisting.get_mut(&kind) {
            seen.insert(object_key(&ns, &name));
        }
        self.touch(kind, &ns, &name);
        self.take_out(kind, &ns, &name);
        let file = kind.api_path(&ns, &name);
        match self.objects.add_object(&file, kind.name(), doc) {
            Ok(()) => self.touch(kind, &ns, &name),
            Err(e) => self.errors.push(e.to_string()),
        }
    }

    fn remove_object(&mut self, kind: Kind, ns: &str, name: &str) {
        self.touch(kind, ns, name);
        self.take_out(kind, ns, name);
    }

    fn take_out(&mut self, kind: Kind, ns: &str, name: &str) {
        let o = &mut self.objects;
        let key = (ns.to_owned(), name.to_owned());
        match kind {
            Kind::Pod => {}
            Kind::PersistentVolume => drop(o.pvs.remove(name)),
            Kind::PersistentVolumeClaim => drop(o.pvcs.remove(&key)),
            Kind::CsiDriver => drop(o.csi_drivers.remove(name)),
            Kind::VolumeAttachment => drop(o.attachments.remove(name)),
        }
    }

    /// Marks dirty the pods an object as it is now concerns.
    fn touch(&mut self, kind: Kind, ns: &str, name: &str) {
        let claim = match kind {
            Kind::Pod => None,
            Kind::PersistentVolumeClaim => Some((ns.to_owned(), name.to_owned())),
            Kind::PersistentVolume => self.claim_of_pv(name),
            Kind::VolumeAttachment => self
                .objects
                .attachments
                .get(name)
                .and_then(|a| a.pv_name.clone())
                .and_then(|pv| self.claim_of_pv(&pv)),
            Kind::CsiDriver => {
                self.all_dirty = true;
                None
            }
        };
        if let Some((ns, name)) = claim {
            let users = self.refs.users(&ObjectRef::Claim(ns, name));
            self.dirty.extend(users.cloned());
        }
    }

    fn claim_of_pv(&self, pv: &str) -> Option<(String, String)> {
        let r = self.objects.pvs.get(pv)?.claim_ref.as_ref()?;
        Some((r.namespace.clone(), r.name.clone()))
    }

    fn finish_list(&mut self, kind: Kind) {
        self.listed.insert(kind);
        let Some(seen) = self.relisting.remove(&kind) else {
            return;
        };
        match kind {
            Kind::Pod => {
                let gone: Vec<PodUid> = self
                    .pods
                    .keys()
                    .chain(self.sent.keys())
                    .filter(|u| !seen.contains(u.as_str()))
                    .cloned()
                    .collect();
                for uid in gone {
                    self.drop_pod(&uid);
                }
            }
            _ => {
                let o = &self.objects;
                let keys: Vec<(String, String)> = match kind {
                    Kind::Pod => Vec::new(),
                    Kind::PersistentVolume => names(o.pvs.keys()),
                    Kind::PersistentVolumeClaim => o.pvcs.keys().cloned().collect(),
                    Kind::CsiDriver => names(o.csi_drivers.keys()),
                    Kind::VolumeAttachment => names(o.attachments.keys()),
                };
                for (ns, name) in keys {
                    if !seen.contains(&object_key(&ns, &name)) {
                        self.remove_object(kind, &ns, &name);
                    }
                }
            }
        }
    }

    /// The events for every pod that changed since the last call: removals
    /// first, then additions and updates, each by UID (as `diff` orders
    /// them). Claims resolve against the objects as they are now; `sys`
    /// looks at a local PV's path.
    pub fn take_events(&mut self, sys: &dyn Sys) -> Vec<SourceEvent> {
        let dirty = match std::mem::take(&mut self.all_dirty) {
            true => {
                self.dirty.clear();
                self.pods.keys().chain(self.sent.keys()).cloned().collect()
            }
            false => std::mem::take(&mut self.dirty),
        };
        let resolver = Resolver {
            objects: &self.objects,
            payload: &self.payload,
            sys,
            node_name: &self.node_name,
        };
        let mut removed = Vec::new();
        let mut changed = Vec::new();
        let mut refs = Vec::new();
        for uid in dirty {
            self.held.remove(&uid);
            match self.pods.get(&uid) {
                None => {
                    refs.push((uid.clone(), None));
                    if self.sent.remove(&uid).is_some() {
                        removed.push(SourceEvent::PodRemoved(uid));
                    }
                }
                // its ConfigMap's watch has not answered yet: next time
                Some(_) if self.refs.holds(&uid) => {
                    self.held.insert(uid);
                }
                Some(p) => {
                    let pod = resolver.resolve(p.clone());
                    refs.push((uid.clone(), Some(secrets_named(&pod))));
                    let f = fingerprint(&pod);
                    match self.sent.insert(uid, f) {
                        None => changed.push(SourceEvent::PodAdded(pod)),
                        Some(before) if before != f => changed.push(SourceEvent::PodUpdated(pod)),
                        Some(_) => {}
                    }
                }
            }
        }
        for (uid, now) in refs {
            if let Some(now) = now {
                self.refs.set(&uid, Part::Resolved, now);
            }
        }
        removed.extend(changed);
        removed
    }
}

fn names<'a>(keys: impl Iterator<Item = &'a String>) -> Vec<(String, String)> {
    keys.map(|n| (String::new(), n.clone())).collect()
}

fn object_key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

/// (namespace, name) of an object document: cluster-scoped objects have
/// an empty namespace; a namespaced one without one is in `default`, as
/// the static objects read it.
fn meta_key(kind: Kind, doc: &Value) -> (String, String) {
    let meta = doc.get("metadata");
    let field = |f: &str| {
        meta.and_then(|m| m.get(f))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let mut ns = field("namespace");
    if ns.is_empty() && kind == Kind::PersistentVolumeClaim {
        ns = "default".to_owned();
    }
    (ns, field("name"))
}

#[cfg(test)]
#[path = "api_tests.rs"]
mod tests;
