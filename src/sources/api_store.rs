//! The objects and tokens the API source followed for the node's pods
//! (the index in `sources::api_refs`): the ConfigMaps and Secrets their
//! payload volumes name, as each one's watch last said, and the tokens
//! their projected volumes asked for. The payload plugins read it through
//! [`ObjectStore`], after the static objects dir
//! ([`crate::plugins::payload::ObjectStores`]).
//!
//! Nothing here is logged: a Secret's bytes and a token are secrets (the
//! `Debug` of the store shows counts only).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use serde_json::Value;

use crate::model::{IssuedToken, TokenRef};
use crate::plugins::payload::{KubeObject, ObjectStore};

type Key = (String, String);

#[derive(Default)]
struct Inner {
    config_maps: BTreeMap<Key, Arc<KubeObject>>,
    secrets: BTreeMap<Key, Arc<KubeObject>>,
    /// the token, or why the last TokenRequest failed with none valid
    tokens: BTreeMap<TokenRef, Result<Arc<IssuedToken>, String>>,
}

/// The API server's objects and tokens, shared by the API source's
/// thread (which writes) and the payload plugins (which read).
#[derive(Clone, Default)]
pub(crate) struct ApiObjectStore(Arc<RwLock<Inner>>);

impl std::fmt::Debug for ApiObjectStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = self.0.read().unwrap_or_else(|p| p.into_inner());
        f.debug_struct("ApiObjectStore")
            .field("config_maps", &r.config_maps.len())
            .field("secrets", &r.secrets.len())
            .field("tokens", &r.tokens.len())
            .finish()
    }
}

impl ApiObjectStore {
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.0.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The ConfigMap `key` is now `obj` (`None`: it does not exist).
    pub(crate) fn set_config_map(&self, key: Key, obj: Option<KubeObject>) {
        let mut w = self.write();
        match obj {
            Some(o) => drop(w.config_maps.insert(key, Arc::new(o))),
            None => drop(w.config_maps.remove(&key)),
        }
    }

    /// The Secret `key` is now `obj` (`None`: it does not exist).
    pub(crate) fn set_secret(&self, key: Key, obj: Option<KubeObject>) {
        let mut w = self.write();
        match obj {
            Some(o) => drop(w.secrets.insert(key, Arc::new(o))),
            None => drop(w.secrets.remove(&key)),
        }
    }

    /// The token for `r` is now this (`None`: no pod asks for it any more).
    pub(crate) fn set_token(&self, r: TokenRef, t: Option<Result<Arc<IssuedToken>, String>>) {
        let mut w = self.write();
        match t {
            Some(t) => drop(w.tokens.insert(r, t)),
            None => drop(w.tokens.remove(&r)),
        }
    }
}

impl ObjectStore for ApiObjectStore {
    fn config_map(&self, namespace: &str, name: &str) -> Option<Arc<KubeObject>> {
        let r = self.0.read().ok()?;
        r.config_maps
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }
    fn secret(&self, namespace: &str, name: &str) -> Option<Arc<KubeObject>> {
        let r = self.0.read().ok()?;
        r.secrets
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }
    fn token(&self, r: &TokenRef) -> Result<Option<Arc<IssuedToken>>, String> {
        let g = self
            .0
            .read()
            .map_err(|_| "token store poisoned".to_owned())?;
        g.tokens.get(r).cloned().transpose()
    }
    fn serves_tokens(&self) -> bool {
        true
    }
}

/// A ConfigMap or Secret as its watch sent it, as a payload reads it (the
/// error names it by its path on the server, never shows its data).
pub(crate) fn payload_object(kind: &str, doc: Value) -> Result<(Key, KubeObject), String> {
    let plural = match kind {
        "ConfigMap" => "configmaps",
        _ => "secrets",
    };
    let file = super::api_secrets::server_path(plural, &doc);
    let got = match kind {
        "ConfigMap" => super::payload_objects::config_map_object(&file, doc),
        _ => super::payload_objects::secret_object(&file, doc),
    };
    got.map_err(|e| e.to_string())
}
