//! [`Loose`]: an object of kind `K` read as its metadata and the rest as
//! JSON, so that a watch survives one object it cannot decode.

use std::borrow::Cow;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::{Map, Value};

/// An object of kind `K`, its metadata decoded (the watcher needs the
/// resourceVersion) and everything else kept as JSON until
/// [`Loose::decode`].
#[derive(Deserialize)]
pub struct Loose<K> {
    /// `metadata`
    pub metadata: ObjectMeta,
    #[serde(flatten)]
    rest: Map<String, Value>,
    #[serde(skip)]
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Loose<K> {
    fn clone(&self) -> Self {
        Self {
            metadata: self.metadata.clone(),
            rest: self.rest.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> std::fmt::Debug for Loose<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the rest: it may be a Secret's data.
        f.debug_struct("Loose")
            .field("namespace", &self.metadata.namespace)
            .field("name", &self.metadata.name)
            .finish_non_exhaustive()
    }
}

/// An object that does not decode as its kind.
#[derive(Debug, thiserror::Error)]
#[error("{kind} {namespace}{name}: the API server sent an object that does not decode: {message}")]
pub struct DecodeError {
    /// the kind
    pub kind: String,
    /// `<namespace>/`, or empty for a cluster-scoped object
    pub namespace: String,
    /// the name
    pub name: String,
    /// serde's message
    pub message: String,
}

impl<K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned> Loose<K> {
    /// The whole object as JSON.
    pub fn into_value(self) -> Value {
        let mut rest = self.rest;
        // ObjectMeta always serialises.
        let meta = serde_json::to_value(&self.metadata).unwrap_or(Value::Null);
        rest.insert("metadata".to_owned(), meta);
        rest.entry("kind")
            .or_insert_with(|| Value::String(K::kind(&()).into_owned()));
        Value::Object(rest)
    }

    /// The object as `T` (its own kind, usually), or an error naming it.
    pub fn decode<T: serde::de::DeserializeOwned>(self) -> Result<T, DecodeError> {
        let namespace = match &self.metadata.namespace {
            Some(ns) if !ns.is_empty() => format!("{ns}/"),
            _ => String::new(),
        };
        let name = self.metadata.name.clone().unwrap_or_default();
        serde_json::from_value(self.into_value()).map_err(|e| DecodeError {
            kind: K::kind(&()).into_owned(),
            namespace,
            name,
            message: e.to_string(),
        })
    }
}

impl<K: kube::Resource<DynamicType = ()>> kube::Resource for Loose<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    #[test]
    fn a_broken_object_still_reads_its_metadata_and_fails_alone() {
        let broken = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "7"},
            "spec": {"containers": "not a list"},
        });
        let loose: Loose<Pod> = serde_json::from_value(broken).expect("metadata decodes");
        assert_eq!(loose.metadata.resource_version.as_deref(), Some("7"));
        let e = loose.decode::<Pod>().expect_err("the spec does not");
        let shown = e.to_string();
        assert!(shown.starts_with("Pod ns/p: "), "{shown}");
    }

    #[test]
    fn a_good_object_decodes_whole() {
        let good = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"nodeName": "n", "containers": []},
        });
        let loose: Loose<Pod> = serde_json::from_value(good).expect("decodes");
        let pod: Pod = loose.decode().expect("decodes");
        assert_eq!(pod.metadata.uid.as_deref(), Some("u"));
        assert_eq!(pod.spec.and_then(|s| s.node_name).as_deref(), Some("n"));
    }
}
