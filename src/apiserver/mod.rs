//! The Kubernetes API server: **the one place volumed talks to it**, with
//! kube 5 (its client, and its runtime's watcher for list-then-watch).
//! What the watches say is turned into DSW events by the pure
//! [`crate::sources::api`]; this module only connects, watches and decodes.
//!
//! Watches (the kubelet's, `pkg/kubelet/config/apiserver.go` and its
//! volume manager's informers): this node's pods (`spec.nodeName=<node>`),
//! PersistentVolumes, PersistentVolumeClaims, CSIDrivers,
//! VolumeAttachments. kube's watcher lists in pages, then watches from the
//! list's resourceVersion with bookmarks, and lists again on `410 Gone` or
//! a watch it cannot resume; errors back off (kube's default: exponential,
//! capped) and never end a stream.
//!
//! **One bad object is one error.** Objects are decoded loosely first
//! ([`Loose`]: metadata, and the rest as JSON), then each into its own
//! type: an object the server sends in a shape we cannot read is an error
//! naming it, and every other object still counts. Decoding straight into
//! `Pod` would fail the whole list, and so the source would never be ready.

pub mod claim_status;
pub(crate) mod events;
pub(crate) mod loose;
pub(crate) mod publish;
pub mod token;

use std::path::PathBuf;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

pub use loose::Loose;

use crate::sources::api::{Change, Kind};

/// Where the API server's address and credentials come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Connection {
    /// `--kubeconfig FILE`: its current context
    Kubeconfig(PathBuf),
    /// `--in-cluster`: the service account of the pod volumed runs in
    InCluster,
}

/// The API source's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiConfig {
    /// how to connect
    pub connection: Connection,
    /// how often the node's status and CSINode are checked
    /// (`--node-status-update-frequency`)
    pub node_status_every: std::time::Duration,
    /// every watch's `timeoutSeconds` ([`WATCH_TIMEOUT`] but in tests)
    pub watch_timeout: std::time::Duration,
}

/// kube's default watch timeout. The server ends a watch after it, and
/// kube's watcher gives up a watch that sent nothing for it plus 5 s (a
/// hung connection, a server that stopped talking) and watches again from
/// the last resourceVersion it saw: the bound on how long a hung watch
/// hides changes. (client-go's reflector asks 5–10 min and has no idle
/// bound of its own; bookmarks every minute keep a live watch talking.)
pub const WATCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(290);

/// kube's watcher settings with `timeout` as the watch timeout (whole
/// seconds, at least one: zero would turn kube's idle bound off).
fn watch_config(timeout: std::time::Duration) -> watcher::Config {
    let secs = u32::try_from(timeout.as_secs()).unwrap_or(u32::MAX).max(1);
    watcher::Config::default().timeout(secs)
}

/// Why the API server could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// the kubeconfig could not be read or used
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig {
        /// the file
        path: PathBuf,
        /// why
        message: String,
    },
    /// the in-cluster configuration is missing or broken
    #[error("in-cluster configuration: {0}")]
    InCluster(String),
    /// the client could not be built from the configuration
    #[error("API client: {0}")]
    Client(String),
}

/// Builds the client. Nothing is requested yet: an API server that is down
/// is found by the watches, which retry.
pub async fn connect(cfg: &ApiConfig) -> Result<Client, ApiError> {
    let config = match &cfg.connection {
        Connection::Kubeconfig(path) => {
            let fail = |message: String| ApiError::Kubeconfig {
                path: path.clone(),
                message,
            };
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| fail(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| fail(e.to_string()))?
        }
        Connection::InCluster => {
            kube::Config::incluster().map_err(|e| ApiError::InCluster(e.to_string()))?
        }
    };
    let mut config = config;
    // kube's client would retry a 503/429/504 itself, up to 15 times with
    // a backoff that grows toward 1000 s: an outage of a minute could then
    // keep the first list waiting long after the server is back. Without
    // it the watcher's own backoff (800 ms doubling to 30 s, client-go's
    // reflector's) retries, and the publisher its next tick.
    config.default_retry = false;
    Client::try_from(config).map_err(|e| ApiError::Client(e.to_string()))
}

/// One item of the merged watches: a change, or an error naming the
/// resource (the watch goes on).
pub type Watched = Result<Change, String>;

/// Every watch the pod source needs, merged into one stream.
pub fn watch_all(
    client: Client,
    node_name: &str,
    timeout: std::time::Duration,
) -> impl Stream<Item = Watched> + Send + 'static {
    let pods = watch_config(timeout).fields(&format!("spec.nodeName={node_name}"));
    let all = || watch_config(timeout);
    futures::stream::select_all([
        watch::<Pod>(Api::all(client.clone()), pods, Kind::Pod),
        watch::<PersistentVolume>(Api::all(client.clone()), all(), Kind::PersistentVolume),
        watch::<PersistentVolumeClaim>(
            Api::all(client.clone()),
            all(),
            Kind::PersistentVolumeClaim,
        ),
        watch::<CSIDriver>(Api::all(client.clone()), all(), Kind::CsiDriver),
        watch::<VolumeAttachment>(Api::all(client), all(), Kind::VolumeAttachment),
    ])
}

fn watch<K>(
    api: Api<Loose<K>>,
    config: watcher::Config,
    kind: Kind,
) -> std::pin::Pin<Box<dyn Stream<Item = Watched> + Send>>
where
    K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let s = watcher(api, config)
        .default_backoff()
        .flat_map(move |item| futures::stream::iter(changes(kind, item)));
    Box::pin(s)
}

/// A watcher event as the changes [`crate::sources::api::ApiState`]
/// takes (an object that cannot be decoded is an error, and skipped).
fn changes<K>(kind: Kind, item: Result<watcher::Event<Loose<K>>, watcher::Error>) -> Vec<Watched>
where
    K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned,
{
    let event = match item {
        Ok(e) => e,
        Err(e) => return vec![Err(format!("watch {}: {e}", K::plural(&())))],
    };
    let one = |obj: Loose<K>, deleted: bool| -> Watched {
        match kind {
            Kind::Pod => {
                let pod = obj.decode::<Pod>().map_err(|e| e.to_string())?;
                Ok(match deleted {
                    true => Change::PodDeleted(Box::new(pod)),
                    false => Change::PodApplied(Box::new(pod)),
                })
            }
            _ => {
                let doc = obj.into_value();
                Ok(match deleted {
                    true => Change::Deleted(kind, doc),
                    false => Change::Applied(kind, doc),
                })
            }
        }
    };
    match event {
        watcher::Event::Init => vec![Ok(Change::Relist(kind))],
        watcher::Event::InitDone => vec![Ok(Change::Listed(kind))],
        watcher::Event::InitApply(o) | watcher::Event::Apply(o) => vec![one(o, false)],
        watcher::Event::Delete(o) => vec![one(o, true)],
    }
}

/// `node.status.volumesAttached` as (unique volume name, devicePath).
pub async fn volumes_attached(client: &Client, node: &str) -> kube::Result<Vec<(String, String)>> {
    let n = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .get(node)
        .await?;
    Ok(n.status
        .and_then(|s| s.volumes_attached)
        .unwrap_or_default()
        .into_iter()
        .map(|a| (a.name, a.device_path))
        .collect())
}

/// What one object's watch says: it is now this (`Some`), it does not
/// exist (`None`), or an error naming it (the watch goes on).
pub type ObjectSeen = Result<Option<serde_json::Value>, String>;

/// Which kind of object [`watch_named`] watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Named {
    /// a Secret
    Secret,
    /// a ConfigMap
    ConfigMap,
}

/// Watches one ConfigMap or Secret, as the kubelet's watch-based managers
/// do for each one a pod refers to (a `metadata.name` field selector in
/// its namespace): never the node's whole list of them.
pub fn watch_named(
    client: Client,
    kind: Named,
    namespace: &str,
    name: &str,
    timeout: std::time::Duration,
) -> std::pin::Pin<Box<dyn Stream<Item = ObjectSeen> + Send>> {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    let config = watch_config(timeout).fields(&format!("metadata.name={name}"));
    match kind {
        Named::Secret => {
            let api: Api<Loose<Secret>> = Api::namespaced(client, namespace);
            Box::pin(named(api, config, format!("Secret {namespace}/{name}")))
        }
        Named::ConfigMap => {
            let api: Api<Loose<ConfigMap>> = Api::namespaced(client, namespace);
            Box::pin(named(api, config, format!("ConfigMap {namespace}/{name}")))
        }
    }
}

fn named<K>(
    api: Api<Loose<K>>,
    config: watcher::Config,
    shown: String,
) -> impl Stream<Item = ObjectSeen> + Send + 'static
where
    K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    // A list that ends without it: it does not exist.
    let mut listed_it = false;
    watcher(api, config)
        .default_backoff()
        .filter_map(move |item| {
            let out = match item {
                Err(e) => Some(Err(format!("watch {shown}: {e}"))),
                Ok(watcher::Event::Init) => {
                    listed_it = false;
                    None
                }
                Ok(watcher::Event::InitApply(o)) => {
                    listed_it = true;
                    Some(Ok(Some(o.into_value())))
                }
                Ok(watcher::Event::Apply(o)) => Some(Ok(Some(o.into_value()))),
                Ok(watcher::Event::InitDone) => (!listed_it).then_some(Ok(None)),
                Ok(watcher::Event::Delete(_)) => Some(Ok(None)),
            };
            futures::future::ready(out)
        })
}
