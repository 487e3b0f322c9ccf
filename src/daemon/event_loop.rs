//! The reconciler loop's driver: the thread that owns every decision, and
//! the threads that carry out the slow ones. It waits for the next
//! [`Event`] (or the core's next deadline), locks the [`World`] only for
//! [`Core::step`] — in-memory changes, never a journal write or a syscall —
//! and performs the returned effects after unlocking:
//!
//! - jobs go to a worker pool — the host plugins', or their CSI driver's
//!   (`pools`) — the intent of a job's first step appended first,
//!   unflushed, on this thread: a sled insert, no flush;
//! - journal work (flush, checkpoint, `Forget` records, the recovery of an
//!   unwritable journal) goes to the journal thread, in order;
//! - host work (orphan sweep, malloc trim) goes to the host thread;
//!
//! and each completion comes back as an [`Event::Done`]. So a slow flush, a
//! hung sweep or a two-minute mount delays neither another volume's
//! decisions nor `/readyz`, `/metrics` or `/debug/state`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use super::notify::{EndOnDrop, Heartbeat};
use crate::host::sys::Sys;
use crate::journal::Journal;
use crate::metrics::Metrics;
use crate::reconciler::executor::Executor;
use crate::reconciler::jobs::{Job, Queued};
use crate::reconciler::jobs::{journal_job, keep_subpaths};
use crate::reconstruct::FailedTarget;

use super::lanes::{host_lane, journal_lane, lane_gone_journal};
use super::pools::{Pools, StartWorker};
use super::{DaemonError, spawn};
pub(crate) use crate::reconciler::core::{
    Completion, Core, CoreConfig, Counted, Effect, Event, HostWork, JournalWork, Observed, Swept,
    World,
};

/// Loop settings: the core's (made once, `DaemonConfig::core_config`) and
/// the driver's own.
#[derive(Debug, Clone)]
pub(crate) struct LoopConfig {
    /// the core's settings, as they reach it
    pub core: CoreConfig,
    /// worker threads for operations
    pub workers: usize,
    /// when the daemon started (the `ready` phase is timed from it)
    pub started: Instant,
    /// the CSI plugin, when CSI drivers are configured or discovered
    pub csi: Option<crate::plugins::CsiPlugin>,
    /// where payload volumes read their ConfigMaps and Secrets
    pub payload_objects: Arc<dyn crate::plugins::payload::ObjectStore>,
    /// with an API server: wakes the node status publisher when an
    /// attachable volume's mount waits for `volumesInUse` (and turns that
    /// wait on)
    pub in_use_wake: Option<Arc<tokio::sync::Notify>>,
    /// the node's allocatable memory, the most a memory emptyDir gets
    pub node_memory: Option<u64>,
}

pub(super) fn lock(world: &Mutex<World>) -> MutexGuard<'_, World> {
    // The world is plain data; every mutation completes before anything
    // that could panic, so a poisoned lock still guards a consistent state.
    world.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the loop needs from its caller.
pub(crate) struct LoopParts {
    /// settings
    pub cfg: LoopConfig,
    /// the caches the provider reads
    pub world: Arc<Mutex<World>>,
    /// `None`: journal off
    pub journal: Option<Arc<Journal>>,
    /// the syscall seam
    pub sys: Arc<dyn Sys>,
    /// the journaled subPath binds (shared with the runtime API)
    pub subpaths: Arc<crate::reconciler::executor::subpaths::Subpaths>,
    /// metrics
    pub metrics: Arc<Metrics>,
    /// reconstruction phase 1's failed targets (for the forced cleanup);
    /// `None`: phase 1 still runs, its [`Event::Reconstructed`] brings
    /// them with the ASW, and source events fill the DSW meanwhile
    pub failed: Option<Vec<FailedTarget>>,
    /// where events arrive (the sender side is cloned to every producer)
    pub events: (Sender<Event>, Receiver<Event>),
    /// set before [`Event::Stop`] is sent: workers start no queued job
    pub stopping: Arc<AtomicBool>,
    /// run once the loop is ready (every pod source listed); dropped,
    /// unrun, when the loop ends before
    pub on_ready: Vec<ReadyHook>,
    /// bumped after every step: the runtime API's waiters look again
    pub changes: Arc<crate::runtime::Changes>,
    /// where pod events go (`FailedMount`, …)
    pub sink: Arc<dyn crate::health::EventSink>,
    /// the loop's pulse (watchdog, `READY=1`): busy, idle, ready, ended
    pub heartbeat: Arc<Heartbeat>,
    /// where a node expansion's claim status updates go (the API
    /// server's publisher); none without an API server
    pub claims: Option<crate::reconciler::executor::ClaimUpdates>,
}

/// What the loop runs once it is ready: the leftovers' walk and the health
/// monitor's first pass wait for it.
pub(crate) type ReadyHook = Box<dyn FnOnce() + Send>;

/// Starts the loop, its worker pool and its journal and host threads;
/// returns their handles (they end once [`Event::Stop`] was handled and
/// nothing is in flight).
pub(crate) fn spawn_loop(parts: LoopParts) -> Result<Vec<JoinHandle<()>>, DaemonError> {
    let LoopParts {
        cfg,
        world,
        journal,
        sys,
        subpaths,
        metrics,
        failed,
        events: (events_tx, events_rx),
        stopping,
        on_ready,
        changes,
        sink,
        heartbeat,
        claims,
    } = parts;
    let mut threads = Vec::new();
    let queued = Arc::new(AtomicUsize::new(0));
    let mut executor = Executor::new(
        journal.clone(),
        sys.clone(),
        &cfg.core.layout,
        metrics.clone(),
    )
    .with_subpaths(subpaths.clone());
    if let Some(csi) = &cfg.csi {
        executor = executor.with_plugin(Box::new(csi.clone()));
    }
    let empty_dir = crate::plugins::EmptyDirPlugin::new(cfg.core.layout.clone())
        .with_node_memory(cfg.node_memory);
    executor = executor.with_plugin(Box::new(empty_dir));
    {
        // a job's event (a long fsGroup walk) names the pod as the loop's
        // events do: its namespace and name looked up under the lock, then
        // stamped and sunk outside it
        let (world, sink) = (world.clone(), sink.clone());
        executor = executor.with_events(Arc::new(move |mut e| {
            if e.names.is_none() {
                e.names = lock(&world).pods.get(&e.pod).map(|p| p.pod.clone());
            }
            sink.emit(crate::health::events::stamped(
                e,
                std::time::SystemTime::now(),
            ));
        }));
    }
    if let Some(claims) = claims {
        executor = executor.with_claims(claims);
    }
    let payload =
        crate::plugins::payload::PayloadPlugin::all(&cfg.core.layout, &cfg.payload_objects);
    for plugin in payload {
        executor = executor.with_plugin(plugin);
    }
    let executor = Arc::new(executor);
    let start_worker: StartWorker = {
        let (tx, exec) = (events_tx.clone(), executor.clone());
        let (queued, stop) = (queued.clone(), stopping.clone());
        Box::new(move |rx| {
            let (tx, exec) = (tx.clone(), exec.clone());
            let (queued, stop) = (queued.clone(), stop.clone());
            spawn("volumed-worker", move || {
                worker(&rx, &queued, &tx, &exec, &stop);
            })
        })
    };
    let (pools, workers) = Pools::new(cfg.workers, start_worker)?;
    threads.extend(workers);
    let journal_lane = match &journal {
        Some(j) => {
            let (tx, rx) = mpsc::channel::<JournalWork>();
            let (j, events) = (j.clone(), events_tx.clone());
            threads.push(spawn("volumed-journal", move || {
                journal_lane(&rx, &j, &events);
            })?);
            Some(tx)
        }
        None => None,
    };
    let host_lane = {
        let (tx, rx) = mpsc::channel::<HostWork>();
        let (layout, sys, metrics) = (cfg.core.layout.clone(), sys.clone(), metrics.clone());
        let (events, stop) = (events_tx.clone(), stopping.clone());
        threads.push(spawn("volumed-host", move || {
            let host = (layout, sys, subpaths);
            host_lane(&rx, &host, &metrics, &events, &stop);
        })?);
        tx
    };
    // The loop must see every producer gone to notice a lost stop.
    drop(events_tx);
    let core_cfg = cfg.core.clone();
    let synced = journal.as_ref().map_or(0, |j| j.synced_through());
    let tail = journal.as_ref().map_or(0, |j| j.long_tail());
    let core = match failed {
        Some(failed) => Core::new(core_cfg, failed, synced),
        None => Core::reconstructing(core_cfg, synced),
    }
    .with_tail(tail);
    let driver = Driver {
        started: cfg.started,
        on_ready,
        changes,
        heartbeat,
        core,
        world,
        events: events_rx,
        pools,
        queued,
        journal,
        journal_lane,
        host_lane,
        sink,
        in_use_wake: cfg.in_use_wake.clone(),
        sys,
        metrics,
    };
    lock(&driver.world)
        .dsw
        .set_in_use_gate(cfg.in_use_wake.is_some());
    threads.push(spawn("volumed-reconciler", move || driver.run())?);
    Ok(threads)
}

/// The decision thread.
struct Driver {
    started: Instant,
    on_ready: Vec<ReadyHook>,
    changes: Arc<crate::runtime::Changes>,
    heartbeat: Arc<Heartbeat>,
    core: Core,
    world: Arc<Mutex<World>>,
    events: Receiver<Event>,
    /// where jobs go: the host plugins' workers, or their driver's
    pools: Pools,
    /// jobs sent that no worker has taken yet (workers count down)
    queued: Arc<AtomicUsize>,
    journal: Option<Arc<Journal>>,
    journal_lane: Option<Sender<JournalWork>>,
    host_lane: Sender<HostWork>,
    sink: Arc<dyn crate::health::EventSink>,
    in_use_wake: Option<Arc<tokio::sync::Notify>>,
    /// the seam, to name the journal's filesystem when it turns unwritable
    sys: Arc<dyn Sys>,
    /// where the step's counts go (`Effect::Count`)
    metrics: Arc<Metrics>,
}

impl Driver {
    /// Runs until the core is finished: stopped, nothing in flight.
    fn run(mut self) {
        // Completions the driver produced itself (a job it could not start),
        // handled at the next step without waiting.
        let mut feedback: Vec<Event> = Vec::new();
        // a return or a panic alike ends the watchdog's pings
        let _ended = EndOnDrop(self.heartbeat.clone());
        loop {
            let mut batch = std::mem::take(&mut feedback);
            let mut orphaned = false;
            if batch.is_empty() {
                self.heartbeat.idle();
                match self
                    .events
                    .recv_timeout(self.core.next_wake(Instant::now()))
                {
                    Ok(ev) => batch.push(ev),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => {
                        // every producer is gone, workers and threads too:
                        // nothing more can report
                        batch.push(Event::Stop);
                        orphaned = true;
                    }
                }
            }
            self.heartbeat.busy(Instant::now());
            // Take every event already queued before planning once.
            batch.extend(self.events.try_iter());
            let obs = Observed {
                queued_jobs: self.queued.load(Ordering::SeqCst),
                synced_through: self.journal.as_ref().map_or(0, |j| j.synced_through()),
                journal_unwritable: self
                    .journal
                    .as_ref()
                    .is_some_and(|j| j.unwritable_reason().is_some()),
            };
            let was_ready = self.core.phase().ready();
            let stepped = Instant::now();
            let effects = {
                let mut w = lock(&self.world);
                self.core.step(&mut w, batch, stepped, obs)
            };
            // after unlocking: a woken waiter takes the lock at once
            self.changes.bump();
            if !was_ready && self.core.phase().ready() {
                self.log_ready(stepped);
            }
            for e in effects {
                self.perform(e, &mut feedback);
            }
            if orphaned || (self.core.finished() && feedback.is_empty()) {
                tracing::info!("reconciler stopped: no operation in flight");
                return;
            }
        }
    }

    /// The step at `stepped` populated the DSW (every source listed): it
    /// and readiness as startup phases.
    fn log_ready(&mut self, stepped: Instant) {
        let pairs: usize = lock(&self.world).dsw.to_mount_counts().values().sum();
        // the step: the listing applied to the DSW, and the pass after it
        tracing::info!(
            phase = "dsw_populated",
            elapsed_ms = crate::util::time::elapsed_ms(stepped.elapsed()),
            pairs,
            "startup phase"
        );
        tracing::info!(
            phase = "readyz",
            elapsed_ms = crate::util::time::elapsed_ms(self.started.elapsed()),
            "startup phase: every pod source listed, /readyz 200"
        );
        for hook in std::mem::take(&mut self.on_ready) {
            hook();
        }
        // after the step's unlock: `/readyz` already answers 200
        self.heartbeat.set_ready();
    }

    fn perform(&mut self, effect: Effect, feedback: &mut Vec<Event>) {
        match effect {
            Effect::Start { job, announce } => self.start(job, announce, feedback),
            Effect::StartTearDown { action, fallback } => {
                // Only teardowns read the journal (for the target's last
                // parameters), without copying its state.
                let journaled = self
                    .journal
                    .as_ref()
                    .and_then(|j| j.with_state(|s| journal_job(&action, s)));
                let job = match journaled {
                    Some(j) => Some(keep_subpaths(j, fallback.as_ref())),
                    None => fallback,
                };
                match job {
                    Some(job) => self.start(job, true, feedback),
                    None => {
                        tracing::error!(
                            ?action,
                            "no parameters known for this operation; it is left for a later pass"
                        );
                        feedback.push(Event::Done(Completion::NotStarted {
                            key: action.key(),
                            forced: false,
                            workers_gone: false,
                        }));
                    }
                }
            }
            Effect::Journal(work) => match &self.journal_lane {
                Some(lane) => {
                    if let Err(mpsc::SendError(work)) = lane.send(work) {
                        feedback.push(Event::Done(lane_gone_journal(work)));
                    }
                }
                None => feedback.push(Event::Done(lane_gone_journal(work))),
            },
            Effect::PodEvent(e) => self.sink.emit(crate::health::events::stamped(
                e,
                std::time::SystemTime::now(),
            )),
            Effect::RepackWorld => {
                let started = Instant::now();
                let entries = {
                    let mut w = lock(&self.world);
                    w.repack();
                    w.size()
                };
                tracing::info!(
                    entries,
                    elapsed_ms = crate::util::time::elapsed_ms(started.elapsed()),
                    "repacked the state's maps"
                );
            }
            Effect::JournalWritable(writable) => {
                if let Some(j) = &self.journal {
                    super::journal_fault::report(
                        j,
                        self.sys.as_ref(),
                        self.sink.as_ref(),
                        writable,
                    );
                }
            }
            Effect::Count(c) => count(&self.metrics, c),
            Effect::ReportInUse => {
                if let Some(n) = &self.in_use_wake {
                    // a permit is kept when the publisher is busy patching
                    n.notify_one();
                }
            }
            Effect::Host(work) => {
                if let Err(mpsc::SendError(work)) = self.host_lane.send(work) {
                    feedback.push(Event::Done(match work {
                        HostWork::Sweep { finish, .. } => Completion::Swept(Swept {
                            unfinished: finish,
                            ..Swept::default()
                        }),
                        HostWork::Trim => Completion::Trimmed,
                        HostWork::CheckLate { .. } => Completion::LateChecked {
                            mounted: Vec::new(),
                        },
                    }));
                }
            }
        }
    }

    /// Hands a job to the workers, counted as queued until one takes it.
    /// With `announce`, its first intent is appended first, unflushed: the
    /// worker waits for it to be durable before touching the OS, and the
    /// jobs of one pass share the flush. A journal that refuses it leaves
    /// the job to append its own intent, fail, and report as any failed
    /// intent does.
    fn start(&mut self, job: Job, announce: bool, feedback: &mut Vec<Event>) {
        let intent = match (&self.journal, announce) {
            (Some(j), true) => Executor::announce(j, &job).unwrap_or_else(|e| {
                tracing::error!(error = %e, "journal intent");
                None
            }),
            _ => None,
        };
        let (key, forced) = (job.key(), matches!(job, Job::ForceCleanup { .. }));
        self.queued.fetch_add(1, Ordering::SeqCst);
        if self.pools.send(Queued { job, intent }).is_err() {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            feedback.push(Event::Done(Completion::NotStarted {
                key,
                forced,
                workers_gone: true,
            }));
        }
    }
}

/// Applies a count the step made to the registry.
fn count(m: &Metrics, c: Counted) {
    match c {
        Counted::TotalVolumes(counts) => m.ops.set_total_volumes(&counts),
        Counted::SeLinux(e) => m.selinux.record(&e),
        Counted::ForceCleaned => m.ops.force_cleaned.inc(),
        Counted::ForceCleanedError => m.ops.force_cleaned_errors.inc(),
    }
}

fn worker(
    rx: &Mutex<Receiver<Queued>>,
    queued: &AtomicUsize,
    tx: &Sender<Event>,
    exec: &Executor,
    stop: &AtomicBool,
) {
    loop {
        let job = {
            let rx = rx.lock().unwrap_or_else(|p| p.into_inner());
            rx.recv()
        };
        let Ok(q) = job else { return };
        queued.fetch_sub(1, Ordering::SeqCst);
        let report = exec.run_unless_stopping(&q.job, q.intent, stop);
        if tx.send(Event::JobDone(report)).is_err() {
            return;
        }
    }
}
