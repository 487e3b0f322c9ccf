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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use serde_json::Value;

use super::SourceError;
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
    /// Publishes these objects to `store` (the payload plugins read them there).
    pub fn publish(&self, store: &PayloadStore) {
        if let Ok(mut s) = store.0.write() {
            s.clone_from(self);
        }
    }
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
/// replace them on every read of the objects dir) and the plugins.
#[derive(Debug, Clone, Default)]
pub struct PayloadStore(Arc<RwLock<PayloadObjects>>);

/// Two handles are equal when they are the same store.
impl PartialEq for PayloadStore {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
impl Eq for PayloadStore {}

impl ObjectStore for PayloadStore {
    fn config_map(&self, namespace: &str, name: &str) -> Option<Arc<KubeObject>> {
        self.0.read().ok()?.config_map(namespace, name)
    }
    fn secret(&self, namespace: &str, name: &str) -> Option<Arc<KubeObject>> {
        self.0.read().ok()?.secret(namespace, name)
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
