//! The API-server pod source's thread, and the gate that lets the DSW be
//! marked ready only once *every* source has listed (seed 000: nothing is
//! unmounted before that; an API server that is down delays unmounts, and
//! never the static pods' mounts, whose events flow at once).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::thread::JoinHandle;
use std::time::Instant;

use futures::StreamExt;

use super::event_loop::Event;
use super::{DaemonError, spawn};
use crate::apiserver::ApiConfig;
use crate::elapsed_ms;
use crate::host::sys::Sys;
use crate::model::UniqueVolumeName;
use crate::sources::SourceEvent;
use crate::sources::api::ApiState;
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
        .map_err(|source| DaemonError::Thread {
            what: "volumed-apiserver runtime",
            source,
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

/// Watches on a thread of its own: changes are batched as they arrive
/// (all that are ready at once), and each batch becomes the events of the
/// pods it concerns.
pub(super) fn spawn_api_source(
    Connected(rt, client, period, watch_timeout): Connected,
    node_name: &str,
    sys: Arc<dyn Sys>,
    tx: Sender<Event>,
    gate: Arc<ReadyGate>,
    secrets: crate::sources::static_objects::SecretStore,
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
            let mut state = ApiState::new(&node);
            let mut ready = false;
            let mut changes =
                crate::apiserver::watch_all(client.clone(), &node, watch_timeout)
                    .ready_chunks(4096);
            let mut secret_watches = SecretWatches::new(client.clone(), secrets, watch_timeout);
            loop {
                let batch = tokio::select! {
                    _ = stop_rx.changed() => return,
                    b = changes.next() => b,
                    Some((key, seen)) = secret_watches.rx.recv() => {
                        secret_watches.seen(key, seen);
                        continue;
                    }
                };
                let Some(batch) = batch else { return };
                for item in batch {
                    match item {
                        Ok(c) => state.apply(c),
                        // kube's backoff retries; the pods stay as they are
                        Err(e) => tracing::warn!(error = %e, "API server"),
                    }
                }
                for e in state.take_errors() {
                    tracing::error!(error = %e, "API server object");
                }
                let evs = state.take_events(sys.as_ref());
                crate::sources::log_pod_errors(&evs, "API");
                if let Some(wanted) = state.take_secret_changes() {
                    secret_watches.want(wanted);
                }
                if !evs.is_empty() && tx.send(Event::Sources(evs)).is_err() {
                    return;
                }
                if !ready && state.listed() {
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

/// Starts what volumed tells the API server (the node's status, CSINode,
/// pod events) on the API source's thread, once the loop runs.
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
            .spawn(send_events(client, node, events, stop.0.subscribe()));
    }
}

/// What the publisher reads of the node: the attachable volumes in use
/// (through the runtime API's handle), the registered drivers, and the
/// API pods' volume health from the monitor's last pass.
pub(super) fn node_view(
    runtime: crate::runtime::VolumeManagerHandle,
    world: Arc<std::sync::Mutex<super::event_loop::World>>,
    drivers: Option<Arc<crate::csi::registry::Drivers>>,
    monitor: Option<Arc<crate::health::Monitor>>,
) -> crate::apiserver::publish::NodeView {
    use crate::apiserver::publish::{NodeView, PodHealth};
    NodeView {
        in_use: Box::new(move || {
            let names = runtime.attachable_in_use().into_iter();
            names.map(|n| n.as_str().to_owned()).collect()
        }),
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
                        namespace: e.pod.namespace.clone(),
                        name: e.pod.name.clone(),
                        uid,
                        volumes,
                    })
                })
                .collect()
        }),
    }
}

/// The watches of the Secrets the node's pods refer to: one task each,
/// started when a pod first names it and aborted (its Secret forgotten)
/// when none does any more.
struct SecretWatches {
    client: kube::Client,
    timeout: std::time::Duration,
    store: crate::sources::static_objects::SecretStore,
    tasks: std::collections::BTreeMap<(String, String), tokio::task::AbortHandle>,
    tx: tokio::sync::mpsc::UnboundedSender<((String, String), crate::apiserver::SecretSeen)>,
    rx: tokio::sync::mpsc::UnboundedReceiver<((String, String), crate::apiserver::SecretSeen)>,
}

impl SecretWatches {
    fn new(
        client: kube::Client,
        store: crate::sources::static_objects::SecretStore,
        timeout: std::time::Duration,
    ) -> Self {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        Self {
            client,
            timeout,
            store,
            tasks: std::collections::BTreeMap::new(),
            tx,
            rx,
        }
    }

    fn want(&mut self, wanted: std::collections::BTreeSet<(String, String)>) {
        let gone: Vec<_> = self
            .tasks
            .keys()
            .filter(|k| !wanted.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            if let Some(t) = self.tasks.remove(&key) {
                t.abort();
            }
            self.store.set_from_api(key, None);
        }
        for key in wanted {
            if self.tasks.contains_key(&key) {
                continue;
            }
            let mut watch = Box::pin(crate::apiserver::watch_secret(
                self.client.clone(),
                &key.0,
                &key.1,
                self.timeout,
            ));
            let (tx, k) = (self.tx.clone(), key.clone());
            let task = tokio::spawn(async move {
                while let Some(seen) = watch.next().await {
                    if tx.send((k.clone(), seen)).is_err() {
                        return;
                    }
                }
            });
            self.tasks.insert(key, task.abort_handle());
        }
    }

    /// What a watch said: into the store (never logged: it holds the
    /// Secret's data).
    fn seen(&mut self, key: (String, String), seen: crate::apiserver::SecretSeen) {
        if !self.tasks.contains_key(&key) {
            return;
        }
        match seen {
            Ok(Some(doc)) => match crate::sources::api::secret_from_api(doc) {
                Ok((_, info)) => self.store.set_from_api(key, Some(info)),
                Err(e) => tracing::error!(error = %e, "API server Secret"),
            },
            Ok(None) => self.store.set_from_api(key, None),
            Err(e) => tracing::warn!(error = %e, "API server"),
        }
    }
}
