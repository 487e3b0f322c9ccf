//! A payload from its spec and the objects it names: which files, at which
//! paths, with which modes — pure, no I/O. The sources build it to learn
//! the payload's version (its hash and the objects' versions, which the
//! journal records with the intent), the plugin to write it.
//!
//! The kubelet's rules, re-stated:
//! - every key of the object is a file named after it, unless `items`
//!   picks keys and paths; a key `items` names that the object lacks is an
//!   error unless the source is `optional`;
//! - a missing object is an error unless `optional`, then it adds nothing;
//! - a path is relative, not empty, has no `..` component, does not start
//!   with `..` (the writer's own names) and no component is longer than 255
//!   bytes;
//! - modes: the item's, else the volume's `defaultMode`;
//! - in a projected volume a later source's file at the same path replaces
//!   an earlier one.

use std::collections::BTreeMap;
use std::path::{Component, Path};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::model::{
    IssuedToken, KeyToPath, ObjectVersion, PAYLOAD_PRIVATE_PREFIX, PayloadSource, PayloadSpec,
    PayloadVersion, TOKEN_OBJECT_KIND, TokenRef,
};

/// A ConfigMap or Secret as the stores hold it. Its `Debug` never shows a
/// value: a Secret's bytes must not reach a log.
#[derive(Clone, PartialEq, Eq)]
pub struct KubeObject {
    /// kind, namespace, name, uid, resourceVersion
    pub version: ObjectVersion,
    /// the keys and their bytes (a ConfigMap's `data` and `binaryData`, a
    /// Secret's decoded `data` and `stringData`)
    pub data: BTreeMap<String, Vec<u8>>,
    /// `immutable: true`: read once, never updated
    pub immutable: bool,
}

impl std::fmt::Debug for KubeObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeObject")
            .field("version", &self.version)
            .field("keys", &self.data.keys().collect::<Vec<_>>())
            .field("immutable", &self.immutable)
            .finish()
    }
}

/// Where payload objects are looked up. The static objects dir is one
/// store, the API server's watches another (with the tokens its
/// TokenRequests got), and a node with both asks them in turn
/// ([`ObjectStores`]).
pub trait ObjectStore: Send + Sync + std::fmt::Debug {
    /// The ConfigMap `namespace/name`, if this store has it.
    fn config_map(&self, namespace: &str, name: &str) -> Option<Arc<KubeObject>>;
    /// The Secret `namespace/name`, if this store has it.
    fn secret(&self, namespace: &str, name: &str) -> Option<Arc<KubeObject>>;
    /// The token last issued for `r`, if this store has one.
    fn token(&self, _r: &TokenRef) -> Result<Option<Arc<IssuedToken>>, String> {
        Ok(None)
    }
    /// Whether tokens can be had here at all (an API server is
    /// configured): without one a token source is a clear error, not a
    /// wait.
    fn serves_tokens(&self) -> bool {
        false
    }
}

/// Several stores asked in order; the first that has an object wins. The
/// daemon puts the static objects dir first: a standalone node's objects
/// are the admin's own files, and a static pod's payload is resolved
/// against that dir alone, so the plugin must read the same object it
/// did. An API pod's objects are then the API server's unless the dir
/// holds one of the same namespace and name.
#[derive(Debug, Clone, Default)]
pub struct ObjectStores(pub Vec<Arc<dyn ObjectStore>>);

impl ObjectStore for ObjectStores {
    fn config_map(&self, namespace: &str, name: &str) -> Option<Arc<KubeObject>> {
        self.0.iter().find_map(|s| s.config_map(namespace, name))
    }
    fn secret(&self, namespace: &str, name: &str) -> Option<Arc<KubeObject>> {
        self.0.iter().find_map(|s| s.secret(namespace, name))
    }
    fn token(&self, r: &TokenRef) -> Result<Option<Arc<IssuedToken>>, String> {
        for s in self.0.iter().filter(|s| s.serves_tokens()) {
            if let Some(t) = s.token(r)? {
                return Ok(Some(t));
            }
        }
        Ok(None)
    }
    fn serves_tokens(&self) -> bool {
        self.0.iter().any(|s| s.serves_tokens())
    }
}

/// One file of a payload.
#[derive(Clone, PartialEq, Eq)]
pub struct PayloadFile {
    /// its content
    pub bytes: Vec<u8>,
    /// its permission bits
    pub mode: u32,
}

impl std::fmt::Debug for PayloadFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PayloadFile({} bytes, {:o})",
            self.bytes.len(),
            self.mode
        )
    }
}

/// A whole payload: files by relative path, and its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload {
    /// the files, by relative path (`/`-separated, checked)
    pub files: BTreeMap<String, PayloadFile>,
    /// the hash and the objects' versions
    pub version: PayloadVersion,
    /// it read objects, all of them `immutable`
    pub immutable: bool,
}

/// Why a payload cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    /// a non-optional object does not exist
    #[error("{kind} {namespace}/{name} not found")]
    MissingObject {
        /// `ConfigMap` or `Secret`
        kind: &'static str,
        /// namespace
        namespace: String,
        /// name
        name: String,
    },
    /// `items` names a key the object lacks
    #[error("{kind} {namespace}/{name} has no key {key:?}")]
    MissingKey {
        /// `ConfigMap` or `Secret`
        kind: &'static str,
        /// namespace
        namespace: String,
        /// name
        name: String,
        /// the key
        key: String,
    },
    /// a key or item path would land outside the volume or on the
    /// writer's own names
    #[error("path {path:?} is not usable in a volume: {why}")]
    BadPath {
        /// the path as given
        path: String,
        /// what is wrong
        why: &'static str,
    },
    /// a projected service account token on a node without an API server
    #[error(
        "serviceAccountToken {path:?}: a service account token needs the API server (--kubeconfig)"
    )]
    TokenNeedsApiServer {
        /// the token's path in the volume
        path: String,
    },
    /// the token was not issued (yet): the TokenRequest failed or is on
    /// its way
    #[error(
        "serviceAccountToken {path:?}: no token for service account {namespace}/{service_account}: {why}"
    )]
    TokenNotIssued {
        /// the token's path in the volume
        path: String,
        /// the pod's namespace
        namespace: String,
        /// its service account
        service_account: String,
        /// the TokenRequest's error, or that none has answered yet
        why: String,
    },
    /// a downwardAPI field volumed does not provide
    #[error("downwardAPI field {0:?} is not supported")]
    UnsupportedField(String),
}

/// Checks `path` as the kubelet's atomic writer does.
pub(crate) fn check_path(path: &str) -> Result<(), PayloadError> {
    let bad = |why| {
        Err(PayloadError::BadPath {
            path: path.to_owned(),
            why,
        })
    };
    if path.is_empty() {
        return bad("empty");
    }
    if path.len() > 4096 {
        return bad("longer than 4096 bytes");
    }
    if path.starts_with(PAYLOAD_PRIVATE_PREFIX) {
        return bad("starts with ..");
    }
    for c in Path::new(path).components() {
        match c {
            Component::Normal(n) if n.len() > 255 => return bad("a name longer than 255 bytes"),
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir => return bad("contains .."),
            Component::RootDir | Component::Prefix(_) => return bad("absolute"),
        }
    }
    if path.contains('\0') {
        return bad("contains NUL");
    }
    Ok(())
}

/// Builds the payload of `spec` from `store`.
pub(crate) fn build(spec: &PayloadSpec, store: &dyn ObjectStore) -> Result<Payload, PayloadError> {
    let mut files = BTreeMap::new();
    let mut objects = Vec::new();
    // (None: no object read yet)
    let mut immutable = None;
    for source in &spec.sources {
        match source {
            PayloadSource::ConfigMap {
                name,
                items,
                optional,
            } => {
                let obj = store.config_map(&spec.namespace, name);
                note_immutable(&mut immutable, obj.as_deref());
                let found = keyed(spec, "ConfigMap", name, obj, items.as_deref(), *optional)?;
                add(&mut files, &mut objects, found)?;
            }
            PayloadSource::Secret {
                name,
                items,
                optional,
            } => {
                let obj = store.secret(&spec.namespace, name);
                note_immutable(&mut immutable, obj.as_deref());
                let found = keyed(spec, "Secret", name, obj, items.as_deref(), *optional)?;
                add(&mut files, &mut objects, found)?;
            }
            PayloadSource::DownwardApi { items } => {
                // pod fields change with the pod, never "immutable"
                immutable = Some(false);
                for item in items {
                    let Some(value) = spec.pod_fields.get(&item.field_path) else {
                        return Err(PayloadError::UnsupportedField(item.field_path.clone()));
                    };
                    let mode = item.mode.unwrap_or(spec.default_mode);
                    let file = PayloadFile {
                        bytes: value.as_bytes().to_vec(),
                        mode,
                    };
                    add(
                        &mut files,
                        &mut objects,
                        Some((None, vec![(item.path.clone(), file)])),
                    )?;
                }
            }
            PayloadSource::ServiceAccountToken { path, .. } => {
                // a token expires: never "immutable"
                immutable = Some(false);
                let (version, file) = token_file(spec, source, path, store)?;
                add(
                    &mut files,
                    &mut objects,
                    Some((Some(version), vec![(path.clone(), file)])),
                )?;
            }
        }
    }
    objects.sort();
    objects.dedup();
    let hash = hash(&files);
    Ok(Payload {
        files,
        version: PayloadVersion { hash, objects },
        immutable: immutable.unwrap_or(false),
    })
}

/// The TokenRequest a token source of `spec`'s pod makes (`None`: not a
/// token source).
pub(crate) fn token_ref(spec: &PayloadSpec, source: &PayloadSource) -> Option<TokenRef> {
    let PayloadSource::ServiceAccountToken {
        audience,
        expiration_seconds,
        ..
    } = source
    else {
        return None;
    };
    let field = |f: &str| spec.pod_fields.get(f).cloned().unwrap_or_default();
    let sa = spec.pod_fields.get("spec.serviceAccountName");
    Some(TokenRef {
        namespace: spec.namespace.clone(),
        // the API server's default when the pod names none
        service_account: sa
            .filter(|s| !s.is_empty())
            .map_or("default".into(), Clone::clone),
        audience: audience.clone(),
        expiration_seconds: *expiration_seconds,
        pod_name: field("metadata.name"),
        pod_uid: field("metadata.uid"),
    })
}

/// A token source's file (the volume's `defaultMode`, as the kubelet
/// writes it) and its version: the service account, and the token's
/// expiry in place of a resourceVersion.
fn token_file(
    spec: &PayloadSpec,
    source: &PayloadSource,
    path: &str,
    store: &dyn ObjectStore,
) -> Result<(ObjectVersion, PayloadFile), PayloadError> {
    if !store.serves_tokens() {
        return Err(PayloadError::TokenNeedsApiServer {
            path: path.to_owned(),
        });
    }
    let Some(r) = token_ref(spec, source) else {
        return Err(PayloadError::TokenNeedsApiServer {
            path: path.to_owned(),
        });
    };
    let not_issued = |why: String| PayloadError::TokenNotIssued {
        path: path.to_owned(),
        namespace: r.namespace.clone(),
        service_account: r.service_account.clone(),
        why,
    };
    let token = store
        .token(&r)
        .map_err(not_issued)?
        .ok_or_else(|| not_issued("not requested yet".into()))?;
    let version = ObjectVersion {
        kind: TOKEN_OBJECT_KIND.into(),
        namespace: r.namespace.clone(),
        name: r.service_account.clone(),
        uid: String::new(),
        resource_version: token.version(),
    };
    let file = PayloadFile {
        bytes: token.token.as_bytes().to_vec(),
        mode: spec.default_mode,
    };
    Ok((version, file))
}

/// Folds one object into "every object read is immutable" (a missing one
/// is not: it may appear).
fn note_immutable(all: &mut Option<bool>, obj: Option<&KubeObject>) {
    let this = obj.is_some_and(|o| o.immutable);
    *all = Some(all.unwrap_or(true) && this);
}

type Found = Option<(Option<ObjectVersion>, Vec<(String, PayloadFile)>)>;

/// The files one ConfigMap or Secret source contributes (`None`: an
/// optional object that is missing).
fn keyed(
    spec: &PayloadSpec,
    kind: &'static str,
    name: &str,
    obj: Option<Arc<KubeObject>>,
    items: Option<&[KeyToPath]>,
    optional: bool,
) -> Result<Found, PayloadError> {
    let Some(obj) = obj else {
        if optional {
            return Ok(None);
        }
        return Err(PayloadError::MissingObject {
            kind,
            namespace: spec.namespace.clone(),
            name: name.to_owned(),
        });
    };
    let file = |bytes: &Vec<u8>, mode: Option<u32>| PayloadFile {
        bytes: bytes.clone(),
        mode: mode.unwrap_or(spec.default_mode),
    };
    let out = match items {
        None => obj
            .data
            .iter()
            .map(|(k, v)| (k.clone(), file(v, None)))
            .collect(),
        Some(items) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                match obj.data.get(&item.key) {
                    Some(v) => out.push((item.path.clone(), file(v, item.mode))),
                    None if optional => {}
                    None => {
                        return Err(PayloadError::MissingKey {
                            kind,
                            namespace: spec.namespace.clone(),
                            name: name.to_owned(),
                            key: item.key.clone(),
                        });
                    }
                }
            }
            out
        }
    };
    Ok(Some((Some(obj.version.clone()), out)))
}

fn add(
    files: &mut BTreeMap<String, PayloadFile>,
    objects: &mut Vec<ObjectVersion>,
    found: Found,
) -> Result<(), PayloadError> {
    let Some((version, new)) = found else {
        return Ok(());
    };
    objects.extend(version);
    for (path, file) in new {
        check_path(&path)?;
        // `a/./b` and `a//b` are `a/b`: one spelling per file
        let clean: Vec<_> = Path::new(&path)
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => n.to_str(),
                _ => None,
            })
            .collect();
        files.insert(clean.join("/"), file);
    }
    Ok(())
}

/// Hex SHA-256 over every file's path, mode and bytes, in path order, each
/// length-prefixed so no two payloads share an encoding.
pub(crate) fn hash(files: &BTreeMap<String, PayloadFile>) -> String {
    let mut h = Sha256::new();
    for (path, f) in files {
        h.update((path.len() as u64).to_le_bytes());
        h.update(path.as_bytes());
        h.update(f.mode.to_le_bytes());
        h.update((f.bytes.len() as u64).to_le_bytes());
        h.update(&f.bytes);
    }
    h.finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DEFAULT_PAYLOAD_MODE, PayloadKind};

    #[derive(Debug, Default)]
    struct Store(BTreeMap<(&'static str, String), Arc<KubeObject>>);
    impl ObjectStore for Store {
        fn config_map(&self, _: &str, name: &str) -> Option<Arc<KubeObject>> {
            self.0.get(&("ConfigMap", name.to_owned())).cloned()
        }
        fn secret(&self, _: &str, name: &str) -> Option<Arc<KubeObject>> {
            self.0.get(&("Secret", name.to_owned())).cloned()
        }
    }

    /// (kind, name, key/value pairs)
    type Obj<'a> = (&'static str, &'a str, &'a [(&'a str, &'a str)]);

    fn store(objs: &[Obj<'_>]) -> Store {
        let mut s = Store::default();
        for (kind, name, data) in objs {
            let obj = KubeObject {
                version: ObjectVersion {
                    kind: kind.to_string(),
                    namespace: "ns".into(),
                    name: name.to_string(),
                    uid: format!("uid-{name}"),
                    resource_version: "7".into(),
                },
                data: data
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                    .collect(),
                immutable: false,
            };
            s.0.insert((kind, name.to_string()), Arc::new(obj));
        }
        s
    }

    fn spec(sources: Vec<PayloadSource>) -> PayloadSpec {
        PayloadSpec {
            kind: PayloadKind::Projected,
            namespace: "ns".into(),
            default_mode: DEFAULT_PAYLOAD_MODE,
            sources,
            fs_group: None,
            pod_fields: BTreeMap::from([("metadata.name".into(), "pod-a".into())]),
            version: None,
            immutable: false,
        }
    }

    fn cm(name: &str, items: Option<Vec<KeyToPath>>, optional: bool) -> PayloadSource {
        PayloadSource::ConfigMap {
            name: name.into(),
            items,
            optional,
        }
    }

    fn item(key: &str, path: &str, mode: Option<u32>) -> KeyToPath {
        KeyToPath {
            key: key.into(),
            path: path.into(),
            mode,
        }
    }

    #[test]
    fn every_key_is_a_file_unless_items_pick_some() {
        let s = store(&[("ConfigMap", "c", &[("a", "1"), ("b", "2")])]);
        let all = build(&spec(vec![cm("c", None, false)]), &s).unwrap();
        assert_eq!(all.files.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(all.files["a"].mode, 0o644);
        assert_eq!(all.version.objects[0].uid, "uid-c");
        let picked = vec![item("b", "dir/./x", Some(0o400))];
        let some = build(&spec(vec![cm("c", Some(picked), false)]), &s).unwrap();
        assert_eq!(some.files.keys().collect::<Vec<_>>(), ["dir/x"]);
        assert_eq!(some.files["dir/x"].mode, 0o400);
        assert_ne!(all.version.hash, some.version.hash);
    }

    #[test]
    fn optional_sources_may_be_missing_and_others_may_not() {
        let s = store(&[("ConfigMap", "c", &[("a", "1")])]);
        let none = build(&spec(vec![cm("gone", None, true)]), &s).unwrap();
        assert!(none.files.is_empty() && none.version.objects.is_empty());
        let e = build(&spec(vec![cm("gone", None, false)]), &s).unwrap_err();
        assert_eq!(e.to_string(), "ConfigMap ns/gone not found");
        let missing_key = Some(vec![item("zz", "zz", None)]);
        let e = build(&spec(vec![cm("c", missing_key.clone(), false)]), &s).unwrap_err();
        assert_eq!(e.to_string(), "ConfigMap ns/c has no key \"zz\"");
        assert!(build(&spec(vec![cm("c", missing_key, true)]), &s).is_ok());
    }

    #[test]
    fn a_hostile_path_is_refused() {
        let s = store(&[("Secret", "s", &[("k", "v"), ("../evil", "x")])]);
        let secret = |items| PayloadSource::Secret {
            name: "s".into(),
            items,
            optional: false,
        };
        for path in ["../x", "/etc/passwd", "a/../../b", "..data", "", "..x"] {
            let items = Some(vec![item("k", path, None)]);
            let e = build(&spec(vec![secret(items)]), &s).unwrap_err();
            assert!(matches!(e, PayloadError::BadPath { .. }), "{path}: {e}");
        }
        let e = build(&spec(vec![secret(None)]), &s).unwrap_err();
        assert!(e.to_string().contains("\"../evil\""), "{e}");
    }

    #[test]
    fn projected_sources_merge_in_order_and_tokens_need_the_api_server() {
        let s = store(&[
            ("ConfigMap", "c", &[("a", "from-cm")]),
            ("Secret", "s", &[("a", "from-secret")]),
        ]);
        let sec = PayloadSource::Secret {
            name: "s".into(),
            items: None,
            optional: false,
        };
        let dapi = PayloadSource::DownwardApi {
            items: vec![crate::model::FieldItem {
                path: "name".into(),
                field_path: "metadata.name".into(),
                mode: None,
            }],
        };
        let p = build(&spec(vec![cm("c", None, false), sec, dapi]), &s).unwrap();
        assert_eq!(p.files["a"].bytes, b"from-secret");
        assert_eq!(p.files["name"].bytes, b"pod-a");
        assert_eq!(p.version.objects.len(), 2);
        let token = PayloadSource::ServiceAccountToken {
            path: "t".into(),
            audience: None,
            expiration_seconds: 3600,
        };
        let e = build(&spec(vec![token]), &s).unwrap_err();
        assert_eq!(
            e.to_string(),
            "serviceAccountToken \"t\": a service account token needs the API server (--kubeconfig)"
        );
    }

    /// A store that also serves one token.
    #[derive(Debug)]
    struct WithToken(Store, Option<Arc<IssuedToken>>);
    impl ObjectStore for WithToken {
        fn config_map(&self, ns: &str, name: &str) -> Option<Arc<KubeObject>> {
            self.0.config_map(ns, name)
        }
        fn secret(&self, ns: &str, name: &str) -> Option<Arc<KubeObject>> {
            self.0.secret(ns, name)
        }
        fn token(&self, r: &TokenRef) -> Result<Option<Arc<IssuedToken>>, String> {
            assert_eq!(
                (r.service_account.as_str(), r.pod_name.as_str()),
                ("robot", "pod-a")
            );
            Ok(self.1.clone())
        }
        fn serves_tokens(&self) -> bool {
            true
        }
    }

    #[test]
    fn a_token_is_a_file_whose_version_is_its_expiry_never_its_bytes() {
        let token = PayloadSource::ServiceAccountToken {
            path: "token".into(),
            audience: Some("vault".into()),
            expiration_seconds: 3600,
        };
        let mut sp = spec(vec![token]);
        sp.default_mode = 0o600;
        sp.pod_fields
            .insert("spec.serviceAccountName".into(), "robot".into());
        let issued = IssuedToken {
            token: "eyJ-secret".into(),
            expires: std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_900_000_000),
            expiration_seconds: 3600,
        };
        let s = WithToken(Store::default(), Some(Arc::new(issued)));
        let p = build(&sp, &s).unwrap();
        assert_eq!(p.files["token"].bytes, b"eyJ-secret");
        assert_eq!(p.files["token"].mode, 0o600);
        assert!(!p.immutable, "a token expires");
        let v = &p.version.objects[0];
        assert_eq!(
            (
                v.kind.as_str(),
                v.name.as_str(),
                v.resource_version.as_str()
            ),
            ("ServiceAccountToken", "robot", "exp:1900000000")
        );
        assert!(
            !format!("{p:?}").contains("eyJ-secret"),
            "Debug shows no token"
        );
        let none = WithToken(Store::default(), None);
        let e = build(&sp, &none).unwrap_err();
        assert!(matches!(e, PayloadError::TokenNotIssued { .. }), "{e}");
        assert!(e.to_string().contains("\"token\""), "names the path: {e}");
    }
}
