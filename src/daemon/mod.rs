//! The node daemon, assembled: KEP-3756's "Proposed VolumeManager startup"
//! (docs/kubelet.md, "Startup").
//!
//! 1. The root dir is made a shared mount, as the kubelet does (bind-mounted
//!    onto itself first when it is not a mount point and the mount holding
//!    it is not shared; refused when that would bind over mounts beneath it).
//! 2. Reconstruction, before anything else and without any network: one read
//!    of the mount table merged with the journal (`reconstruct::edge`), its
//!    decisions journaled, the ASW filled. `/readyz` stays 503 until this is
//!    done *and* every pod source has been listed.
//!    The source poller already lists and parses the manifests meanwhile;
//!    its events wait for the loop (files only: no mount is touched).
//! 3. The reconciler loop starts at once and applies the sources' events:
//!    mounts begin while the DSW is still filling; nothing is unmounted until
//!    every source has been fully listed (`reconciler::plan`). Once it has
//!    (ready), reconstruction's phase 2, the pod-dir walk, starts.
//! 4. Once every source has listed and the pod-dir walk has reported: the
//!    one-time forced cleanup of the targets reconstruction could not
//!    rebuild (`forced`).
//! 5. Stop: no new operation starts, in-flight ones finish, the journal is
//!    flushed by the caller.
//!
//! Threads: the loop (all decisions: a pure [`core`] stepped by the
//! `event_loop` driver), a small worker pool (the executor's blocking
//! syscalls and journal appends), the loop's journal thread (flushes,
//! checkpoints, `Forget` records) and host thread (orphan sweeps, malloc
//! trims), the source poller and the pod-dir walk. The HTTP
//! server runs on the caller's tokio runtime and reads through
//! [`Daemon::provider`].

mod api;
mod config;
mod error;
pub(crate) mod event_loop;
mod health;
mod journal_fault;
mod lanes;
pub mod notify;
pub(crate) mod orphans;
mod pools;
mod provider;
mod startup;

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::host::sys::Sys;
use crate::journal::Journal;
use crate::metrics::Metrics;
use crate::server::DebugProvider;
use crate::util::time::elapsed_ms;

use api::{ApiStopper, Publisher, ReadyGate, spawn_api_source};
pub use config::{CsiSetup, DaemonConfig};
pub use error::{DaemonError, OpenedJournal};
use event_loop::{Event, LoopConfig, LoopParts, World, spawn_loop};
use provider::Provider;
use startup::{Leftovers, reconstruct_first, resolved_root, spawn_leftovers, spawn_sources};

/// A running daemon.
pub struct Daemon {
    world: Arc<Mutex<World>>,
    /// bumped by the loop after each step; closed at stop
    changes: Arc<crate::runtime::Changes>,
    events: Sender<Event>,
    threads: Vec<JoinHandle<()>>,
    /// set at stop: workers start no queued job
    stopping: Arc<AtomicBool>,
    /// wakes the source poller at stop
    poller: crate::host::watch::Stopper,
    api: Option<ApiStopper>,
    /// the plugin registration watcher, when CSI discovery is on
    discovery: Option<crate::csi::discovery::Discovery>,
    metrics: Arc<Metrics>,
    journal: Option<Arc<Journal>>,
    node_name: String,
    boot_id: String,
    /// the health monitor, when on
    monitor: Option<Arc<crate::health::Monitor>>,
    /// the events the monitor emitted, for `/debug/events`
    sink: Arc<crate::health::RecentEvents>,
    /// the reconciler loop's pulse
    heartbeat: Arc<notify::Heartbeat>,
    /// the journaled subPath binds the runtime API makes (one lock with
    /// the executor's cleanup before a TearDown)
    subpaths: Arc<crate::reconciler::executor::subpaths::Subpaths>,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

pub(super) fn spawn(
    name: &'static str,
    f: impl FnOnce() + Send + 'static,
) -> Result<JoinHandle<()>, DaemonError> {
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(f)
        .map_err(|cause| DaemonError::Thread { what: name, cause })
}

impl Daemon {
    /// Starts the daemon. `journal` is `None` with `--journal off`;
    /// `replaced` names why a fresh journal stands in for one that was moved
    /// aside (every target is then rebuilt from the host alone).
    pub fn start(
        cfg: DaemonConfig,
        journal: Option<Arc<Journal>>,
        replaced: Option<String>,
        sys: Arc<dyn Sys>,
        metrics: Arc<Metrics>,
    ) -> Result<Daemon, DaemonError> {
        let dir = journal.as_ref().map(|j| j.dir().to_owned());
        Self::start_opening(cfg, dir, move |_| Ok((journal, replaced)), sys, metrics)
    }

    /// [`Daemon::start`] with the journal opened by `open`, on this thread,
    /// while the pod sources are listed on theirs: on a restart the two
    /// cost about the same, and neither needs the other. `journal_dir` is
    /// where `open` opens it (`None`: `--journal off`); the parsed-manifest
    /// cache lives there. `open` calls the function it is given once it
    /// holds the journal's lock ([`Journal::open_then`]): the mount table
    /// is then read while the journal replays.
    pub fn start_opening(
        cfg: DaemonConfig,
        journal_dir: Option<PathBuf>,
        open: impl FnOnce(&dyn Fn()) -> Result<OpenedJournal, DaemonError>,
        sys: Arc<dyn Sys>,
        metrics: Arc<Metrics>,
    ) -> Result<Daemon, DaemonError> {
        // the journal's decode and the sources make the same names on two
        // threads: one allocation each until `/readyz` (a ready hook holds
        // this; a start that fails, or a loop that ends before it is
        // ready, drops it)
        let sharing = crate::model::intern::begin();
        let started = Instant::now();
        let mut cfg = cfg;
        let api = cfg.api.as_ref().map(api::connect).transpose()?;
        cfg.layout = resolved_root(&cfg.layout, sys.as_ref())?;

        let (events_tx, events_rx) = mpsc::channel::<Event>();
        // The manifests are listed and parsed while reconstruction runs
        // (on a restart the two cost about the same); the loop, started
        // before phase 1, applies their events to the DSW as they come
        // and plans nothing until phase 1 hands over the ASW.
        let gate = ReadyGate::new(1 + usize::from(cfg.api.is_some()));
        // the parsed-file caches live beside the journal (none with
        // `--journal off`, which parses every file as the kubelet does)
        let caches = journal_dir.map(|d| {
            use crate::sources::manifest_cache::{FILE_NAME, OBJECTS_FILE_NAME};
            (d.join(FILE_NAME), d.join(OBJECTS_FILE_NAME))
        });
        let (sources, poller) =
            spawn_sources(&cfg, caches, sys.clone(), events_tx.clone(), gate.clone())?;
        let early = std::cell::OnceCell::new();
        let (journal, replaced) = match open(&|| {
            early.get_or_init(|| crate::reconstruct::edge::TableRead::start(sys.clone()));
        }) {
            Ok(j) => j,
            Err(e) => {
                poller.stop();
                let _ = sources.join();
                return Err(e);
            }
        };
        // what API pods' payload volumes read: the objects and tokens the
        // API source follows for them
        let api_objects = api
            .is_some()
            .then(crate::sources::api_store::ApiObjectStore::default);
        let payload_objects = api::Stores::payload(&cfg.payload_objects, api_objects.as_ref());
        let api = match (api, api_objects) {
            (Some(a), Some(api_objects)) => {
                let stores = api::Stores {
                    secrets: cfg.secrets.clone(),
                    static_payload: cfg.payload_objects.clone(),
                    api: api_objects,
                };
                // read before the keepers start, and before reconstruction
                // records its decisions
                let seeds = api::token_seed::TokenSeeds::from_journal(
                    journal.as_deref(),
                    &cfg.layout,
                    sys.clone(),
                );
                match spawn_api_source(
                    a,
                    &cfg.node_name,
                    sys.clone(),
                    events_tx.clone(),
                    gate,
                    stores,
                    seeds,
                ) {
                    Ok(t) => Some(t),
                    Err(e) => {
                        poller.stop();
                        let _ = sources.join();
                        return Err(e);
                    }
                }
            }
            _ => None,
        };
        let abandon = |sources: JoinHandle<()>,
                       poller: &crate::host::watch::Stopper,
                       api: Option<(JoinHandle<()>, ApiStopper, Publisher)>| {
            poller.stop();
            let _ = sources.join();
            if let Some((t, s, _)) = api {
                s.stop();
                let _ = t.join();
            }
        };

        // The loop starts before reconstruction's phase 1, so the sources'
        // first listing fills the DSW while the journal and the mount
        // table are merged (KEP-3756: the populator beside reconstruction);
        // it plans nothing until `Event::Reconstructed` brings the ASW.
        let world = Arc::new(Mutex::new(World::default()));
        // Set by `stop`: workers start no job still queued (only in-flight
        // operations are finished).
        let stopping = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel::<()>();
        let recent = Arc::new(crate::health::RecentEvents::default());
        let (sink, api_events): (Arc<dyn crate::health::EventSink>, _) = match api.is_some() {
            true => {
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                let sink = crate::apiserver::publish::ApiEventSink {
                    recent: recent.clone(),
                    tx,
                };
                (Arc::new(sink), Some(rx))
            }
            false => (recent.clone(), None),
        };
        let in_use_wake = api.is_some().then(|| Arc::new(tokio::sync::Notify::new()));
        // a node expansion's claim status updates, to the API server
        let (claims, claims_rx) = match api.is_some() {
            true => {
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                let send: crate::reconciler::executor::ClaimUpdates =
                    Arc::new(move |u| drop(tx.send(u)));
                (Some(send), Some(rx))
            }
            false => (None, None),
        };
        let changes = Arc::new(crate::runtime::Changes::new());
        let monitor = match cfg.health.clone() {
            Some(h) => match health::start(
                h,
                world.clone(),
                sys.clone(),
                cfg.csi.as_ref().map(|c| c.drivers.clone()),
                &metrics,
                sink.clone(),
            ) {
                Ok(m) => Some(Arc::new(m)),
                Err(source) => {
                    abandon(sources, &poller, api);
                    return Err(DaemonError::Thread {
                        what: "volumed-health",
                        cause: source,
                    });
                }
            },
            None => None,
        };
        let mut on_ready: Vec<event_loop::ReadyHook> = vec![Box::new(move || {
            // the leftovers' thread is gone only if it failed to start
            let _ = ready_tx.send(());
        })];
        if let Some(m) = monitor.clone() {
            on_ready.push(Box::new(move || m.ask()));
        }
        // both states hold the node's names once ready: new ones need no
        // sharing
        on_ready.push(Box::new(move || drop(sharing)));
        let heartbeat = Arc::new(notify::Heartbeat::default());
        let csi = cfg.csi.as_ref().map(|c| {
            crate::plugins::CsiPlugin::new(
                cfg.layout.clone(),
                &cfg.node_name,
                c.drivers.clone(),
                Some(Arc::new(cfg.secrets.clone())),
            )
        });
        let subpaths = Arc::new(crate::reconciler::executor::subpaths::Subpaths::new(
            journal.clone(),
            sys.clone(),
            cfg.layout.clone(),
        ));
        // the journal's binds agree with the host before anything binds or
        // cleans (after a reboot the host has none)
        subpaths.settle_at_start();
        let spawned = spawn_loop(LoopParts {
            cfg: LoopConfig {
                core: cfg.core_config(journal.is_some(), csi.as_ref()),
                workers: cfg.workers,
                started,
                csi,
                payload_objects: Arc::new(payload_objects),
                in_use_wake: in_use_wake.clone(),
                node_memory: cfg.node_memory,
            },
            world: world.clone(),
            journal: journal.clone(),
            sys: sys.clone(),
            subpaths: subpaths.clone(),
            metrics: metrics.clone(),
            failed: None,
            events: (events_tx.clone(), events_rx),
            stopping: stopping.clone(),
            on_ready,
            changes: changes.clone(),
            sink: sink.clone(),
            heartbeat: heartbeat.clone(),
            claims,
        });
        let mut threads = match spawned {
            Ok(t) => t,
            Err(e) => {
                abandon(sources, &poller, api);
                if let Some(m) = &monitor {
                    m.stop();
                }
                return Err(e);
            }
        };
        // Reconstruction, the first mount-touching work: the loop's workers
        // get no job before the ASW is handed over.
        let first = reconstruct_first(
            &cfg,
            journal.as_ref(),
            replaced.as_deref(),
            &sys,
            &metrics,
            started,
            early.into_inner().flatten(),
        );
        let (reconstructed, table, ready) = match first {
            Ok(r) => r,
            Err(e) => {
                stopping.store(true, std::sync::atomic::Ordering::SeqCst);
                let _ = events_tx.send(Event::Stop);
                for t in threads {
                    let _ = t.join();
                }
                abandon(sources, &poller, api);
                if let Some(m) = &monitor {
                    m.stop();
                }
                return Err(e);
            }
        };
        if let Some(j) = &journal {
            metrics.journal.set_damage(j.damage());
        }
        // the loop ends only after a stop: it is there to take it
        let _ = events_tx.send(Event::Reconstructed(Box::new(reconstructed)));
        threads.push(sources);
        let (api, publisher) = match api {
            Some((t, stop, publisher)) => {
                threads.push(t);
                (Some(stop), Some(publisher))
            }
            None => (None, None),
        };
        threads.push(spawn_leftovers(
            Leftovers {
                layout: cfg.layout.clone(),
                boot: cfg.boot_id.clone(),
                journal: journal.clone(),
                replaced,
                table,
                ready,
                stopping: stopping.clone(),
            },
            sys.clone(),
            metrics.clone(),
            ready_rx,
            events_tx.clone(),
        )?);
        // Nothing waits for a driver: operations on a volume whose driver
        // is not registered yet fail and back off until it is.
        let discovery = match &cfg.csi {
            Some(c) if c.discover => Some(
                crate::csi::discovery::Discovery::start(
                    cfg.layout.plugins_registry_dir(),
                    c.drivers.clone(),
                    sys.clone(),
                )
                .map_err(DaemonError::Csi)?,
            ),
            _ => None,
        };
        if let (Some(publisher), Some(stop), Some(rx), Some(wake), Some(claims_rx)) =
            (publisher, &api, api_events, in_use_wake, claims_rx)
        {
            let view = api::node_view(
                (
                    crate::runtime::VolumeManagerHandle::new(world.clone(), changes.clone()),
                    changes.clone(),
                ),
                world.clone(),
                cfg.csi.as_ref().map(|c| c.drivers.clone()),
                monitor.clone(),
                (wake, events_tx.clone()),
            );
            publisher.start(view, rx, claims_rx, stop);
        }
        Ok(Daemon {
            world,
            changes,
            events: events_tx,
            threads,
            stopping,
            poller,
            api,
            discovery,
            metrics,
            journal,
            node_name: cfg.node_name,
            boot_id: cfg.boot_id.as_str().to_owned(),
            monitor,
            sink: recent,
            heartbeat,
            subpaths,
        })
    }

    /// The reconciler loop's pulse: what `READY=1` waits for and what the
    /// watchdog pings only while it beats.
    pub fn heartbeat(&self) -> Arc<notify::Heartbeat> {
        self.heartbeat.clone()
    }

    /// The runtime API on this daemon (embeddable: a clone per caller).
    pub fn runtime(&self) -> crate::runtime::VolumeManagerHandle {
        crate::runtime::VolumeManagerHandle::new(self.world.clone(), self.changes.clone())
    }

    /// The journal it writes (`None` with `--journal off`): whoever closes
    /// it at the end holds the last reference once [`Daemon::stop`] returned.
    pub fn journal(&self) -> Option<Arc<Journal>> {
        self.journal.clone()
    }

    /// What the HTTP server reads.
    pub fn provider(&self) -> Arc<dyn DebugProvider> {
        Arc::new(Provider {
            runtime: self.runtime(),
            world: self.world.clone(),
            metrics: self.metrics.clone(),
            journal: self.journal.clone(),
            node_name: self.node_name.clone(),
            boot_id: self.boot_id.clone(),
            monitor: self.monitor.clone(),
            sink: self.sink.clone(),
            subpaths: self.subpaths.clone(),
        })
    }

    /// Stops: no new operation starts (a queued job is reported as not
    /// started); waits for in-flight ones.
    pub fn stop(self) {
        let asked = Instant::now();
        // waiters of the runtime API answer now, not at their deadline
        self.changes.close();
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.poller.stop();
        if let Some(a) = &self.api {
            a.stop();
        }
        if let Some(m) = &self.monitor {
            m.stop();
        }
        if let Some(mut d) = self.discovery {
            d.stop();
        }
        let _ = self.events.send(Event::Stop);
        drop(self.events);
        for t in self.threads {
            if t.join().is_err() {
                tracing::error!("a daemon thread panicked");
            }
        }
        tracing::info!(
            phase = "stop",
            elapsed_ms = elapsed_ms(asked.elapsed()),
            "daemon stopped: every thread joined"
        );
    }
}

#[cfg(test)]
mod loop_tests;
#[cfg(test)]
mod start_tests;

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::startup::make_root_shared;
    use super::*;
    use crate::host::recording_sys::{RecordingSys, SysCall};
    use crate::host::sys::{FileKind, MsFlags};

    const ROOT: &str = "/var/lib/kubelet";
    const CACHE: &str = "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/cache";

    fn tmpfs(sys: &RecordingSys, at: &str) {
        sys.add(at, FileKind::Dir);
        sys.preset_mount(None, Path::new(at), Some("tmpfs"), MsFlags::empty(), None)
            .unwrap();
    }

    /// How often each mount point shows in the fake's mount table.
    fn times_mounted(sys: &RecordingSys, at: &str) -> usize {
        let table = sys.read_mountinfo().unwrap();
        table.at(Path::new(at)).count()
    }

    fn mount_call(source: Option<&str>, flags: MsFlags) -> SysCall {
        SysCall::Mount {
            source: source.map(PathBuf::from),
            target: PathBuf::from(ROOT),
            fstype: None,
            flags,
            data: None,
        }
    }

    #[test]
    fn mounts_beneath_a_root_on_a_private_mount_refuse_startup_and_stay_as_they_are() {
        let sys = RecordingSys::new();
        tmpfs(&sys, CACHE);
        let e = make_root_shared(&sys, Path::new(ROOT)).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(&e, DaemonError::MountsBeneathRoot { mounts, .. } if mounts == &[PathBuf::from(CACHE)]),
            "{msg}"
        );
        assert!(msg.contains(CACHE), "names the mount: {msg}");
        assert!(
            msg.contains("mount --make-rshared /"),
            "names the fix: {msg}"
        );
        assert_eq!(sys.mutations(), vec![], "nothing bound over it");
        assert_eq!(times_mounted(&sys, CACHE), 1);
        assert_eq!(times_mounted(&sys, ROOT), 0);
    }

    #[test]
    fn a_root_on_a_shared_mount_is_left_as_it_is_whatever_is_beneath() {
        let sys = RecordingSys::new();
        tmpfs(&sys, "/var");
        sys.preset_mount(None, Path::new("/var"), None, MsFlags::MS_SHARED, None)
            .unwrap();
        tmpfs(&sys, CACHE);
        make_root_shared(&sys, Path::new(ROOT)).unwrap();
        assert_eq!(sys.mutations(), vec![]);
        assert_eq!(times_mounted(&sys, CACHE), 1);
    }

    #[test]
    fn a_root_with_nothing_beneath_is_bound_onto_itself_then_shared() {
        let sys = RecordingSys::new();
        sys.add(ROOT, FileKind::Dir);
        make_root_shared(&sys, Path::new(ROOT)).unwrap();
        assert_eq!(
            sys.mutations(),
            vec![
                mount_call(Some(ROOT), MsFlags::MS_BIND | MsFlags::MS_REC),
                mount_call(None, MsFlags::MS_SHARED | MsFlags::MS_REC),
            ]
        );
        let table = sys.read_mountinfo().unwrap();
        let root = table.top_at(Path::new(ROOT)).unwrap();
        assert!(root.propagation.shared.is_some(), "{root:?}");
    }

    #[test]
    fn a_root_that_is_a_mount_point_is_made_shared_with_what_is_beneath() {
        let sys = RecordingSys::new();
        tmpfs(&sys, ROOT);
        tmpfs(&sys, CACHE);
        make_root_shared(&sys, Path::new(ROOT)).unwrap();
        assert_eq!(
            sys.mutations(),
            vec![mount_call(None, MsFlags::MS_SHARED | MsFlags::MS_REC)]
        );
        assert_eq!(times_mounted(&sys, CACHE), 1);
    }
}
