//! What volumed tells the API server, as the kubelet does:
//! - `node.status.volumesInUse`: the attachable volumes a pod wants or that
//!   are on the node (reconstructed ones included, as KEP-3756 asks), so the
//!   attach/detach controller detaches none of them. A JSON merge patch of
//!   `status.volumesInUse` alone on the status subresource: no other status
//!   field is touched (the kubelet's is a strategic merge patch of its
//!   whole status; for this plain list both replace it);
//! - the node's `CSINode` (`spec.drivers`: name and node id of every
//!   registered driver) and the node's `csi.volume.kubernetes.io/nodeid`
//!   annotation (a JSON map of driver → node id), as the kubelet's
//!   `nodeinfomanager` keeps them on plugin registration;
//! - pod events ([`events`](super::events) decides what to send).
//!
//! Each is checked every `--node-status-update-frequency` (the kubelet's
//! flag, default `10s`) and written only when it changed since the
//! last successful write; a failed write is retried on the next tick.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Event, Node, Pod, PodVolumeHealth};
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

use super::events::{Decision, Recorder};
use crate::health::{EventSink, RecentEvents, VolumeEvent};

/// The first wait before a failed `volumesInUse` patch is tried again.
const IN_USE_RETRY: Duration = Duration::from_millis(200);

/// The annotation the kubelet keeps on the Node: driver name → node id.
pub(crate) const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";

/// Told the names a successful `volumesInUse` update listed.
pub(crate) type InUseReported = Box<dyn Fn(&[String]) + Send + Sync>;

/// What the node's status is made of, read when it is published.
pub(crate) struct NodeView {
    /// the attachable volumes in use, sorted
    pub in_use: Box<dyn Fn() -> Vec<String> + Send + Sync>,
    /// told, after each status update (or check) that found these in
    /// `volumesInUse` on the server: their mounts may start
    pub in_use_reported: InUseReported,
    /// notified when a mount waits for `volumesInUse`: update now
    pub in_use_wanted: std::sync::Arc<tokio::sync::Notify>,
    /// the registered CSI drivers as (name, node id), sorted by name
    pub drivers: Box<dyn Fn() -> Vec<(String, String)> + Send + Sync>,
    /// the API pods' volume health from the last health pass
    pub volume_health: Box<dyn Fn() -> Vec<PodHealth> + Send + Sync>,
}

/// One pod's `status.volumeHealth`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PodHealth {
    /// `metadata.namespace`
    pub namespace: String,
    /// `metadata.name`
    pub name: String,
    /// `metadata.uid`
    pub uid: String,
    /// one entry per pod volume with a condition, by name
    pub volumes: Vec<PodVolumeHealth>,
}

/// Keeps `volumesInUse`, the CSINode and the node id annotation in step
/// with `view` until `stop` turns true.
pub(crate) async fn keep_node(
    client: Client,
    node: String,
    view: NodeView,
    period: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut in_use_sent: Option<Vec<String>> = None;
    let mut drivers_sent: Option<Vec<(String, String)>> = None;
    // per pod UID, the volumeHealth last written
    let mut health_sent: BTreeMap<String, Vec<PodVolumeHealth>> = BTreeMap::new();
    // after a failed volumesInUse patch: mounts wait on it, so it is tried
    // again sooner than the period, backing off up to it
    let mut retry: Option<Duration> = None;
    loop {
        publish_volume_health(&client, (view.volume_health)(), &mut health_sent).await;
        let in_use = (view.in_use)();
        if in_use_sent.as_ref() != Some(&in_use) {
            match patch_volumes_in_use(&client, &node, &in_use).await {
                Ok(()) => {
                    in_use_sent = Some(in_use.clone());
                    retry = None;
                }
                Err(e) => {
                    tracing::warn!(node = %node, error = %e, "patch node.status.volumesInUse");
                    retry = Some(
                        retry
                            .map_or(IN_USE_RETRY, |r| r.saturating_mul(2))
                            .min(period),
                    );
                }
            }
        }
        if in_use_sent.as_ref() == Some(&in_use) {
            (view.in_use_reported)(&in_use);
        }
        let drivers = (view.drivers)();
        if drivers_sent.as_ref() != Some(&drivers) {
            match sync_csi_node(&client, &node, &drivers).await {
                Ok(()) => drivers_sent = Some(drivers),
                Err(e) => tracing::warn!(node = %node, error = %e, "update the node's CSINode"),
            }
        }
        // The kubelet waits for its next status period (up to 10 s) before
        // an attachable volume may mount; a waiting mount wakes this at once.
        tokio::select! {
            _ = tokio::time::sleep(retry.unwrap_or(period)) => {}
            _ = view.in_use_wanted.notified() => {}
            _ = stop.changed() => return,
        }
    }
}

/// Writes each API pod's `status.volumeHealth` that changed (the 1.37
/// field the kubelet fills from the driver's reports). A volume whose
/// condition cleared is an entry without conditions, as in the kubelet.
async fn publish_volume_health(
    client: &Client,
    now: Vec<PodHealth>,
    sent: &mut BTreeMap<String, Vec<PodVolumeHealth>>,
) {
    let mut seen = std::collections::BTreeSet::new();
    for h in now {
        seen.insert(h.uid.clone());
        if sent.get(&h.uid) == Some(&h.volumes) {
            continue;
        }
        let patch = json!({ "status": { "volumeHealth": h.volumes } });
        let api = Api::<Pod>::namespaced(client.clone(), &h.namespace);
        match api
            .patch_status(&h.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                sent.insert(h.uid, h.volumes);
            }
            Err(e) => tracing::warn!(pod = %h.name, namespace = %h.namespace, error = %e,
                "patch pod status.volumeHealth"),
        }
    }
    // a pod no longer reported: its pod is gone, or its volumes too
    sent.retain(|uid, _| seen.contains(uid));
}

async fn patch_volumes_in_use(client: &Client, node: &str, in_use: &[String]) -> kube::Result<()> {
    // null removes the field: the kubelet leaves it out when empty
    let list = match in_use.is_empty() {
        true => Value::Null,
        false => json!(in_use),
    };
    let patch = json!({ "status": { "volumesInUse": list } });
    Api::<Node>::all(client.clone())
        .patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    tracing::info!(
        node,
        volumes = in_use.len(),
        "node.status.volumesInUse updated"
    );
    Ok(())
}

async fn sync_csi_node(
    client: &Client,
    node: &str,
    drivers: &[(String, String)],
) -> kube::Result<()> {
    let entries: Vec<Value> = drivers
        .iter()
        .map(|(name, id)| json!({ "name": name, "nodeID": id }))
        .collect();
    let api = Api::<CSINode>::all(client.clone());
    match api.get_opt(node).await? {
        None => {
            // Owned by the Node, as the kubelet creates it: it goes with it.
            let owner = Api::<Node>::all(client.clone())
                .get_opt(node)
                .await?
                .and_then(|n| n.metadata.uid)
                .map(
                    |uid| json!([{ "apiVersion": "v1", "kind": "Node", "name": node, "uid": uid }]),
                );
            let obj: CSINode = serde_json::from_value(json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
                "metadata": { "name": node, "ownerReferences": owner },
                "spec": { "drivers": entries },
            }))
            .map_err(kube::Error::SerdeError)?;
            api.create(&PostParams::default(), &obj).await?;
        }
        Some(mut cur) => {
            let want: Vec<_> =
                serde_json::from_value(Value::Array(entries)).map_err(kube::Error::SerdeError)?;
            if cur.spec.drivers != want {
                cur.spec.drivers = want;
                // replace carries the resourceVersion: a concurrent writer
                // makes it a 409, retried on the next tick
                api.replace(node, &PostParams::default(), &cur).await?;
            }
        }
    }
    let ids: BTreeMap<&str, &str> = drivers
        .iter()
        .map(|(n, i)| (n.as_str(), i.as_str()))
        .collect();
    let annotation = match ids.is_empty() {
        true => Value::Null,
        false => Value::String(serde_json::to_string(&ids).map_err(kube::Error::SerdeError)?),
    };
    let patch = json!({ "metadata": { "annotations": { NODE_ID_ANNOTATION: annotation } } });
    Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    tracing::info!(
        node,
        drivers = drivers.len(),
        "CSINode and node id annotation updated"
    );
    Ok(())
}

/// Keeps events locally (`/debug/events`, the log) and hands each to the
/// API source's thread, never blocking the reconciler.
pub(crate) struct ApiEventSink {
    /// the recent ones
    pub recent: Arc<RecentEvents>,
    /// to the thread that sends them
    pub tx: tokio::sync::mpsc::UnboundedSender<VolumeEvent>,
}

impl EventSink for ApiEventSink {
    fn emit(&self, event: VolumeEvent) {
        self.recent.emit(event.clone());
        // the API thread gone (stopping): the event stays local
        let _ = self.tx.send(event);
    }
}

/// Sends pod events as [`Recorder`] decides until the channel closes or
/// `stop` turns true. An event of a pod no source names (no namespace) is
/// kept local only.
pub(crate) async fn send_events(
    client: Client,
    node: String,
    mut rx: UnboundedReceiver<VolumeEvent>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut recorder = Recorder::default();
    loop {
        let ev = tokio::select! {
            e = rx.recv() => e,
            _ = stop.changed() => return,
        };
        let Some(ev) = ev else { return };
        let (Some(ns), Some(pod)) = (ev.namespace.clone(), ev.pod.clone()) else {
            continue;
        };
        let new_name = || {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            format!("{pod}.{nanos:x}")
        };
        let api = Api::<Event>::namespaced(client.clone(), &ns);
        let sent = match recorder.record(&ev, Instant::now(), new_name) {
            Decision::Create { name, message } => {
                let obj = json!({
                    "apiVersion": "v1", "kind": "Event",
                    "metadata": { "name": name, "namespace": ns },
                    "involvedObject": {
                        "apiVersion": "v1", "kind": "Pod",
                        "namespace": ns, "name": pod, "uid": ev.pod_uid,
                    },
                    "reason": ev.reason, "message": message, "type": ev.kind,
                    "count": 1, "firstTimestamp": ev.time, "lastTimestamp": ev.time,
                    "source": { "component": "volumed", "host": node },
                    "reportingComponent": "volumed", "reportingInstance": node,
                });
                match serde_json::from_value::<Event>(obj) {
                    Ok(e) => api.create(&PostParams::default(), &e).await.map(drop),
                    Err(e) => Err(kube::Error::SerdeError(e)),
                }
            }
            Decision::Patch {
                name,
                count,
                message,
            } => {
                let patch = json!({ "count": count, "lastTimestamp": ev.time, "message": message });
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(drop)
            }
            Decision::Drop => Ok(()),
        };
        if let Err(e) = sent {
            tracing::warn!(pod = %pod, namespace = %ns, reason = ev.reason, error = %e, "send a pod event");
        }
    }
}
