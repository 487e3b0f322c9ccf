//! The API-server pod source's thread, and the gate that lets the DSW be
//! marked ready only once *every* source has listed (KEP-3756, docs/kubelet.md: nothing
//! is unmounted before that; an API server that is down delays unmounts, and
//! never the static pods' mounts, whose events flow at once).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::thread::JoinHandle;
use std::time::Instant;

use futures::{FutureExt, StreamExt};

use crate::daemon::event_loop::Event;
use crate::daemon::{DaemonError, spawn};

pub(super) mod follow;
pub(super) mod token_seed;
use crate::apiserver::ApiConfig;
use crate::host::sys::Sys;
use crate::model::UniqueVolumeName;
use crate::plugins::payload::{ObjectStore, ObjectStores};
use crate::sources::SourceEvent;
use crate::sources::api::ApiState;
use crate::sources::api_store::ApiObjectStore;
use crate::util::time::elapsed_ms;
use std::path::PathBuf;

/// Counts the sources still to list; the last one to list sends
/// [`SourceEvent::SourcesReady`], after its own events, and after every
/// other source has sent its own (each calls [`ReadyGate::listed`] only
/// once its events are in the channel).
#[derive(Debug)]
pub(super) struct ReadyGate(AtomicUsize);

impl ReadyGate {
    pub(super) fn new(sources: usize) -> Arc<Self> {
        Arc::new(Self(AtomicUsize::new(sources)))
    }

    /// This source has listed: whether it was the last one (call once).
    pub(super) fn listed(&self) -> bool {
        self.0.fetch_sub(1, Ordering::SeqCst) == 1
    }
}

/// Ends the API source's thread.
#[derive(Debug)]
pub(super) struct ApiStopper(tokio::sync::watch::Sender<bool>);

impl ApiStopper {
    pub(super) fn stop(&self) {
        self.0.send_replace(true);
    }
}

/// A client and the runtime it runs on, before any request.
pub(super) struct Connected(
    tokio::runtime::Runtime,
    kube::Client,
    std::time::Duration,
    std::time::Duration,
);

/// Builds the client: a kubeconfig that cannot be used is an error now, at
/// startup, before anything on the host changes.
pub(super) fn connect(cfg: &ApiConfig) -> Result<Connected, DaemonError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|cause| DaemonError::Thread {
            what: "volumed-apiserver runtime",
            cause,
        })?;
    let client = rt
        .block_on(crate::apiserver::connect(cfg))
        .map_err(DaemonError::Api)?;
    Ok(Connected(
        rt,
        client,
        cfg.node_status_every,
        cfg.watch_timeout,
    ))
}

/// Where the API source puts what it follows, and what else payloads read.
pub(super) struct Stores {
    /// the Secrets CSI calls read
    pub secrets: crate::sources::static_objects::SecretStore,
    /// the static objects dir's ConfigMaps and Secrets (read first)
    pub static_payload: crate::sources::payload_objects::PayloadStore,
    /// the API server's followed ConfigMaps, Secrets and tokens
    pub api: ApiObjectStore,
}

impl Stores {
    /// What payload volumes read, in order: the static dir, then the API
    /// server's (see [`ObjectStores`]).
    pub(super) fn payload(
        static_payload: &crate::sources::payload_objects::PayloadStore,
        api: Option<&ApiObjectStore>,
    ) -> ObjectStores {
        let mut v: Vec<Arc<dyn ObjectStore>> = vec![Arc::new(static_payload.clone())];
        v.extend(api.map(|a| Arc::new(a.clone()) as Arc<dyn ObjectStore>));
        ObjectStores(v)
    }
}

/// Watches on a thread of its own: changes are batched as they arrive
/// (all that are ready at once), and each batch becomes the events of the
/// pods it concerns. A followed object's report (a ConfigMap's watch, a
/// token's renewal) goes into the API store and makes its pods' events.
pub(super) fn spawn_api_source(
    Connected(rt, client, period, watch_timeout): Connected,
    node_name: &str,
    sys: Arc<dyn Sys>,
    tx: Sender<Event>,
    gate: Arc<ReadyGate>,
    stores: Stores,
    seeds: token_seed::TokenSeeds,
) -> Result<(JoinHandle<()>, ApiStopper, Publisher), DaemonError> {
    let publisher = Publisher {
        every: period,
        handle: rt.handle().clone(),
        client: client.clone(),
        node: node_name.to_owned(),
    };
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let node = node_name.to_owned();
    let thread = spawn("volumed-apiserver", move || {
        rt.block_on(async move {
            let started = Instant::now();
            let payload = Stores::payload(&stores.static_payload, Some(&stores.api));
            let static_payload = stores.static_payload.clone();
            let mut state = ApiState::new(&node).with_payload(payload);
            let mut ready = false;
            let mut changes =
                crate::apiserver::watch_all(client.clone(), &node, watch_timeout)
                    .ready_chunks(4096);
            let mut follow =
                follow::Followers::new(client.clone(), stores, watch_timeout, seeds);
            let mut overdue_tick = tokio::time::interval(std::time::Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = stop_rx.changed() => return,
                    b = changes.next() => {
                        let Some(batch) = b else { return };
                        apply_all(&mut state, batch);
                    }
                    Some((r, seen)) = follow.rx.recv() => {
                        if follow.seen(&r, seen) {
                            state.object_reported(&r);
                        }
                    }
                    // a pod's object in the static objects dir changed:
                    // that copy is the one its payload reads
                    _ = static_payload.changed() => {
                        for r in static_payload.take_changed() {
                            state.object_reported(&r);
                        }
                    }
                    _ = overdue_tick.tick() => {
                        let max = follow::FIRST_REPORT_MAX;
                        for r in follow.overdue(Instant::now(), max) {
                            tracing::warn!(object = ?shown_ref(&r), waited_s = max.as_secs(),
                                "API server: no answer yet; its pods are resolved without it");
                            state.object_reported(&r);
                        }
                    }
                };
                // What else comes now joins this pass: one resolution and
                // one event to the loop for many changes. A watch hands its
                // events over one at a time (its connection's task decodes
                // the next once this one has taken the last), and so do the
                // token keepers: one pass each cost a walk, an event and a
                // step of the loop per pod. Bounded, so the first pods of a
                // burst reach the DSW (and the workers) without waiting for
                // the last.
                let pass = Instant::now();
                let mut taken = 0usize;
                loop {
                    // new pods' objects first: their watches and token
                    // requests start before this task yields
                    if let Some(c) = state.take_follow_changes() {
                        follow.change(c, &|r| state.token_paths(r));
                    }
                    tokio::task::yield_now().await;
                    let mut more = 0usize;
                    while let Ok((r, seen)) = follow.rx.try_recv() {
                        more += 1;
                        if follow.seen(&r, seen) {
                            state.object_reported(&r);
                        }
                    }
                    loop {
                        match changes.next().now_or_never() {
                            Some(Some(batch)) => {
                                more += batch.len();
                                apply_all(&mut state, batch);
                            }
                            Some(None) => return,
                            None => break,
                        }
                    }
                    taken += more;
                    if more == 0 || taken >= PASS_MAX.0 || pass.elapsed() >= PASS_MAX.1 {
                        break;
                    }
                }
                for e in state.take_errors() {
                    tracing::error!(error = %e, "API server object");
                }
                if let Some(c) = state.take_follow_changes() {
                    follow.change(c, &|r| state.token_paths(r));
                }
                let evs = state.take_events(sys.as_ref());
                crate::sources::log_pod_errors(&evs, "API");
                // and the Secrets their CSI volumes' PVs name
                if let Some(c) = state.take_follow_changes() {
                    follow.change(c, &|r| state.token_paths(r));
                }
                if !evs.is_empty() && tx.send(Event::Sources(evs)).is_err() {
                    return;
                }
                if !ready && state.listed() && state.settled() {
                    ready = true;
                    tracing::info!(
                        phase = "apiserver_listed",
                        elapsed_ms = elapsed_ms(started.elapsed()),
                        pods = state.sent().len(),
                        "startup phase"
                    );
                    // before readiness, so the loop has them when it settles
                    match crate::apiserver::volumes_attached(&client, &node).await {
                        Ok(attached) => {
                            let paths = attached
                                .into_iter()
                                .map(|(v, p)| (UniqueVolumeName::from_raw(v), PathBuf::from(p)))
                                .collect();
                            if tx.send(Event::NodeDevicePaths(paths)).is_err() {
                                return;
                            }
                        }
                        Err(e) => tracing::warn!(node = %node, error = %e,
                            "read node.status.volumesAttached; uncertain devices keep no devicePath"),
                    }
                    if gate.listed()
                        && tx
                            .send(Event::Sources(vec![SourceEvent::SourcesReady]))
                            .is_err()
                    {
                        return;
                    }
                }
            }
        });
    })?;
    Ok((thread, ApiStopper(stop_tx), publisher))
}

/// The most one pass of the API source takes in before it resolves and
/// sends: changes and reports, and time since the pass began.
const PASS_MAX: (usize, std::time::Duration) = (256, std::time::Duration::from_millis(5));

/// Takes in a batch of watch changes.
fn apply_all(state: &mut ApiState, batch: Vec<crate::apiserver::Watched>) {
    for item in batch {
        match item {
            Ok(c) => state.apply(c),
            // kube's backoff retries; the pods stay as they are
            Err(e) => tracing::warn!(error = %e, "API server"),
        }
    }
}

/// Starts what volumed tells the API server (the node's status, CSINode,
/// pod events, claim status after a node expansion) on the API source's
/// thread, once the loop runs.
pub(super) struct Publisher {
    every: std::time::Duration,
    handle: tokio::runtime::Handle,
    client: kube::Client,
    node: String,
}

impl Publisher {
    pub(super) fn start(
        self,
        view: crate::apiserver::publish::NodeView,
        events: tokio::sync::mpsc::UnboundedReceiver<crate::health::VolumeEvent>,
        claims: tokio::sync::mpsc::UnboundedReceiver<crate::model::ClaimResize>,
        stop: &ApiStopper,
    ) {
        use crate::apiserver::publish::{keep_node, send_events};
        let (client, node) = (self.client, self.node);
        self.handle.spawn(keep_node(
            client.clone(),
            node.clone(),
            view,
            self.every,
            stop.0.subscribe(),
        ));
        self.handle
            .spawn(crate::apiserver::claim_status::send_claim_updates(
                client.clone(),
                claims,
                stop.0.subscribe(),
            ));
        self.handle
            .spawn(send_events(client, node, events, stop.0.subscribe()));
    }
}

/// What the publisher reads of the node: the attachable volumes in use
/// (through the runtime API's handle), the registered drivers, and the
/// API pods' volume health from the monitor's last pass.
pub(super) fn node_view(
    (runtime, changes): (
        crate::runtime::VolumeManagerHandle,
        Arc<crate::runtime::Changes>,
    ),
    world: Arc<std::sync::Mutex<crate::daemon::event_loop::World>>,
    drivers: Option<Arc<crate::csi::registry::Drivers>>,
    monitor: Option<Arc<crate::health::Monitor>>,
    (wake, loop_events): (Arc<tokio::sync::Notify>, std::sync::mpsc::Sender<Event>),
) -> crate::apiserver::publish::NodeView {
    use crate::apiserver::publish::{NodeView, PodHealth};
    // The list walks the node: computed again only when the loop changed
    // the world since (the count is read before the walk, so a change
    // during it is seen next time).
    let last: std::sync::Mutex<Option<(u64, Vec<String>)>> = std::sync::Mutex::new(None);
    NodeView {
        in_use: Box::new(move || {
            let seen = changes.seen();
            let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((at, names)) = &*last
                && *at == seen
            {
                return names.clone();
            }
            let names = runtime.attachable_in_use().into_iter();
            let names: Vec<String> = names.map(|n| n.as_str().to_owned()).collect();
            *last = Some((seen, names.clone()));
            names
        }),
        in_use_reported: Box::new(move |names| {
            let names = names.iter().map(crate::model::UniqueVolumeName::from_raw);
            let _ = loop_events.send(Event::ReportedInUse(names.collect()));
        }),
        in_use_wanted: wake,
        drivers: Box::new(move || drivers.as_ref().map(|d| d.node_ids()).unwrap_or_default()),
        volume_health: Box::new(move || {
            let Some(m) = &monitor else {
                return Vec::new();
            };
            let by_uid = m.read(crate::health::report::pod_volume_health);
            let w = world.lock().unwrap_or_else(|p| p.into_inner());
            by_uid
                .into_iter()
                .filter_map(|(uid, volumes)| {
                    let pod = crate::model::PodUid::new(uid.as_str()).ok()?;
                    let e = w.pods.get(&pod).filter(|e| e.from_api)?;
                    Some(PodHealth {
                        namespace: e.pod.namespace.to_string(),
                        name: e.pod.name.to_string(),
                        uid,
                        volumes,
                    })
                })
                .collect()
        }),
    }
}

/// A followed object as the log may show it: kind, namespace and name (a
/// token's service account and pod; never the token).
fn shown_ref(r: &crate::sources::api::ObjectRef) -> String {
    use crate::sources::api::ObjectRef;
    match r {
        ObjectRef::Claim(ns, n) => format!("PersistentVolumeClaim {ns}/{n}"),
        ObjectRef::ConfigMap(ns, n) => format!("ConfigMap {ns}/{n}"),
        ObjectRef::Secret(ns, n) => format!("Secret {ns}/{n}"),
        ObjectRef::Token(t) => format!(
            "token of service account {}/{} for pod {}",
            t.namespace, t.service_account, t.pod_name
        ),
    }
}
