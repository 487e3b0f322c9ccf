//! The objects payload volumes read: ConfigMaps and Secrets of the static
//! objects dir as [`KubeObject`]s (bytes as given, uid, resourceVersion,
//! `immutable`), and the [`PayloadStore`] the payload plugins read them
//! from. A Secret is also kept for CSI calls (`csi_objects`).
//!
//! The plugins see objects through [`ObjectStore`]: this store holds what
//! the static objects dir says; the API server's watches publish into
//! their own (`api_store`) and the daemon asks this one first
//! ([`ObjectStores`]). The API store reads its documents with the same
//! `config_map_object` and `secret_object`.
//!
//! [`ObjectStores`]: crate::plugins::payload::ObjectStores

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use serde_json::Value;

use super::SourceError;
use super::api_refs::ObjectRef;
use super::static_objects::{StaticObjects, decode, object_name};
use crate::model::ObjectVersion;
use crate::plugins::payload::{KubeObject, ObjectStore};

type Key = (String, String);

/// The ConfigMaps and Secrets of one read of the objects, with the file
/// each came from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PayloadObjects {
    config_maps: BTreeMap<Key, (PathBuf, Arc<KubeObject>)>,
    secrets: BTreeMap<Key, (PathBuf, Arc<KubeObject>)>,
}

impl PayloadObjects {
    /// Publishes these objects to `store` (the payload plugins read them
    /// there), and tells the store's watcher which ones changed.
    pub fn publish(&self, store: &PayloadStore) {
        let changed = match store.objects.write() {
            Ok(mut s) => {
                let mut changed = changes(&s.config_maps, &self.config_maps, ObjectRef::ConfigMap);
                changed.extend(changes(&s.secrets, &self.secrets, ObjectRef::Secret));
                s.clone_from(self);
                changed
            }
            Err(_) => return,
        };
        if changed.is_empty() {
            return;
        }
        if let Ok(mut c) = store.changed.lock() {
            c.extend(changed);
        }
        store.wake.notify_one();
    }
}

/// The keys whose object is new, gone or different from `old` to `new`.
fn changes(
    old: &BTreeMap<Key, (PathBuf, Arc<KubeObject>)>,
    new: &BTreeMap<Key, (PathBuf, Arc<KubeObject>)>,
    to_ref: fn(String, String) -> ObjectRef,
) -> Vec<ObjectRef> {
    let differs = |a: Option<&(PathBuf, Arc<KubeObject>)>,
                   b: Option<&(PathBuf, Arc<KubeObject>)>| {
        a.map(|(_, o)| o) != b.map(|(_, o)| o)
    };
    old.keys()
        .chain(new.keys().filter(|k| !old.contains_key(*k)))
        .filter(|k| differs(old.get(*k), new.get(*k)))
        .map(|(ns, n)| to_ref(ns.clone(), n.clone()))
        .collect()
}

fn lookup(
    map: &BTreeMap<Key, (PathBuf, Arc<KubeObject>)>,
    ns: &str,
    name: &str,
) -> Option<Arc<KubeObject>> {
    map.get(&(ns.to_owned(), name.to_owned()))
        .map(|(_, o)| o.clone())
}

impl ObjectStore for PayloadObjects {
    fn config_map(&self, namespace: &str, name: &str) -> Option<Arc<KubeObject>> {
        lookup(&self.config_maps, namespace, name)
    }
    fn secret(&self, namespace: &str, name: &str) -> Option<Arc<KubeObject>> {
        lookup(&self.secrets, namespace, name)
    }
}

/// The objects the payload plugins read, shared between the sources (which
/// replace them on every read of the objects dir) and the plugins; and
/// which ones changed, for the API source, whose pods read this store
/// first (a pod from the API server whose ConfigMap is in the dir is
/// written again when the file changes).
#[derive(Debug, Clone, Default)]
pub struct PayloadStore {
    objects: Arc<RwLock<PayloadObjects>>,
    changed: Arc<Mutex<BTreeSet<ObjectRef>>>,
    wake: Arc<tokio::sync::Notify>,
}

impl PayloadStore {
    /// Returns once an object changed since the last [`PayloadStore::take_changed`]
    /// (at once if one did meanwhile).
    pub async fn changed(&self) {
        self.wake.notified().await;
    }

    /// The ConfigMaps and Secrets that changed since the last call.
    pub fn take_changed(&self) -> BTreeSet<ObjectRef> {
        self.changed
            .lock()
            .map(|mut c| std::mem::take(&mut *c))
            .unwrap_or_default()
    }
}

/// Two handles are equal when they are the same store.
impl PartialEq for PayloadStore {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.objects, &other.objects)
    }
}
impl Eq for PayloadStore {}

impl ObjectStore for PayloadStore {
    fn config_map(&self, namespace: &str, name: &str) -> Option<Arc<KubeObject>> {
        self.objects.read().ok()?.config_map(namespace, name)
    }
    fn secret(&self, namespace: &str, name: &str) -> Option<Arc<KubeObject>> {
        self.objects.read().ok()?.secret(namespace, name)
    }
}

impl StaticObjects {
    /// A Secret document: for payload volumes (bytes as given) and for CSI
    /// calls (`csi_objects`).
    pub(super) fn add_secret(&mut self, file: &Path, doc: Value) -> Result<(), SourceError> {
        let (key, obj) = secret_object(file, doc.clone())?;
        let shown = format!("{}/{}", key.0, key.1);
        let (csi_key, info) = super::csi_objects::secret(file, doc)?;
        super::static_objects::insert_new(&mut self.secrets, csi_key, info, file, "Secret", shown)?;
        self.payload
            .secrets
            .insert(key, (file.to_owned(), Arc::new(obj)));
        Ok(())
    }

    /// A ConfigMap document (see [`config_map_object`]).
    pub(super) fn add_config_map(&mut self, file: &Path, doc: Value) -> Result<(), SourceError> {
        let (key, obj) = config_map_object(file, doc)?;
        if let Some((other, _)) = self.payload.config_maps.get(&key) {
            return Err(SourceError::DuplicateObject {
                file: file.to_owned(),
                kind: "ConfigMap",
                name: format!("{}/{}", key.0, key.1),
                other: other.clone(),
            });
        }
        self.payload
            .config_maps
            .insert(key, (file.to_owned(), Arc::new(obj)));
        Ok(())
    }
}

/// A Secret document as a payload reads it: its decoded `data`, and
/// `stringData` over it (as the API server merges it). `file` names it
/// in errors (an API object's path on the server).
pub(super) fn secret_object(file: &Path, doc: Value) -> Result<(Key, KubeObject), SourceError> {
    let s: Secret = decode(file, doc)?;
    let name = object_name(file, s.metadata.name.clone(), "Secret")?;
    let mut data: BTreeMap<String, Vec<u8>> = (s.data.unwrap_or_default())
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    let strings = s.string_data.unwrap_or_default();
    data.extend(strings.into_iter().map(|(k, v)| (k, v.into_bytes())));
    Ok(object("Secret", name, &s.metadata, data, s.immutable))
}

/// A ConfigMap document: `data` and `binaryData` (a key in both: the
/// binary one, which the API server would have refused).
pub(super) fn config_map_object(file: &Path, doc: Value) -> Result<(Key, KubeObject), SourceError> {
    let c: ConfigMap = decode(file, doc)?;
    let name = object_name(file, c.metadata.name.clone(), "ConfigMap")?;
    let mut data: BTreeMap<String, Vec<u8>> = (c.data.unwrap_or_default())
        .into_iter()
        .map(|(k, v)| (k, v.into_bytes()))
        .collect();
    let binary = c.binary_data.unwrap_or_default();
    data.extend(binary.into_iter().map(|(k, v)| (k, v.0)));
    Ok(object("ConfigMap", name, &c.metadata, data, c.immutable))
}

fn object(
    kind: &str,
    name: String,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    data: BTreeMap<String, Vec<u8>>,
    immutable: Option<bool>,
) -> (Key, KubeObject) {
    let ns = meta.namespace.clone().filter(|n| !n.is_empty());
    let ns = ns.unwrap_or_else(|| "default".to_owned());
    let version = ObjectVersion {
        kind: kind.to_owned(),
        namespace: ns.clone(),
        name: name.clone(),
        uid: meta.uid.clone().unwrap_or_default(),
        resource_version: meta.resource_version.clone().unwrap_or_default(),
    };
    let obj = KubeObject {
        version,
        data,
        immutable: immutable.unwrap_or(false),
    };
    ((ns, name), obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(name: &str, value: &str) -> (Key, (PathBuf, Arc<KubeObject>)) {
        let doc = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "ns"}, "data": {"k": value}});
        let (key, obj) = config_map_object(Path::new("/objects/o.yaml"), doc).unwrap();
        (key, ("/objects/o.yaml".into(), Arc::new(obj)))
    }

    /// What the API source is told after each read of the objects dir: the
    /// objects new, changed or gone, each once; nothing for a read that
    /// changed nothing.
    #[test]
    fn a_publish_tells_which_objects_changed_once() {
        let store = PayloadStore::default();
        let read = |objs: &[(&str, &str)]| PayloadObjects {
            config_maps: objs.iter().map(|(n, v)| cm(n, v)).collect(),
            secrets: BTreeMap::new(),
        };
        let r = |n: &str| ObjectRef::ConfigMap("ns".into(), n.into());
        read(&[("a", "1"), ("b", "1")]).publish(&store);
        assert_eq!(store.take_changed(), [r("a"), r("b")].into());
        assert!(store.take_changed().is_empty(), "told once");
        read(&[("a", "1"), ("b", "1")]).publish(&store);
        assert!(store.take_changed().is_empty(), "the same objects again");
        read(&[("a", "2"), ("c", "1")]).publish(&store);
        assert_eq!(store.take_changed(), [r("a"), r("b"), r("c")].into());
    }
}
