//! The reconciler's event loop: one thread that owns every decision. It
//! wakes on a closed set of [`Event`]s — sources changed, a job finished, a
//! stop was asked — or when a backoff window closes, with a slow resync as
//! the safety net (no 100 ms poll over every volume). Each wake it applies
//! finished jobs to the ASW, plans (`reconciler::plan`) and starts what is
//! not busy on the worker pool — except when the wake brought only jobs
//! that succeeded while started jobs still wait for a worker: a pass then
//! could only queue work behind them, so it waits for the job that empties
//! the queue (one pass per finished job made the loop O(volumes) per job).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::host::sys::Sys;
use crate::journal::Journal;
use crate::metrics::Metrics;
use crate::model::{Layout, MountState, PluginName, PodUid, TargetRef, UniqueVolumeName};
use crate::reconciler::executor::{Executor, JobReport, Queued};
use crate::reconciler::jobs::{apply_update, job_for};
use crate::reconciler::pending::Pending;
use crate::reconciler::plan::{Action, plan};
use crate::reconstruct::{MergeOutput, apply_to_asw};
use crate::selinux::Policy;
use crate::sources::{DesiredPod, SourceEvent, apply_event};
use crate::state::{ActualStateOfWorld, DesiredStateOfWorld};

/// Everything that can wake the loop.
#[derive(Debug)]
pub enum Event {
    /// the pod sources changed
    Sources(Vec<SourceEvent>),
    /// a job finished
    JobDone(JobReport),
    /// stop: finish in-flight jobs, start nothing new
    Stop,
    /// reconstruction's phase 2 (the pod-dir walk) finished, with the
    /// targets it found unmounted outside volumed (already logged)
    Leftovers(Box<MergeOutput>, Vec<crate::state::UnmountedOutside>),
}

/// The caches the loop mutates and the HTTP provider reads.
#[derive(Debug, Default)]
pub struct World {
    /// desired state
    pub dsw: DesiredStateOfWorld,
    /// actual state
    pub asw: ActualStateOfWorld,
    /// what reconstruction found unmounted outside volumed (`/debug/state`)
    pub unmounted_outside: Vec<crate::state::UnmountedOutside>,
}

/// Loop settings.
#[derive(Debug, Clone)]
pub struct LoopConfig {
    /// the kubelet layout
    pub layout: Layout,
    /// how often to re-plan with nothing happening
    pub resync: Duration,
    /// journal records between checkpoints (0: never)
    pub checkpoint_every: u64,
    /// the SELinux label rules
    pub selinux: Policy,
}

/// The loop's owned state.
pub struct EventLoop {
    pub(super) cfg: LoopConfig,
    pub(super) world: Arc<Mutex<World>>,
    pub(super) events: Receiver<Event>,
    pub(super) jobs: Sender<Queued>,
    /// jobs sent that no worker has taken yet (workers count down)
    pub(super) queued: Arc<AtomicUsize>,
    pub(super) journal: Option<Arc<Journal>>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) pending: Pending,
    pub(super) stopping: bool,
    pub(super) last_checkpoint_seq: u64,
    pub(super) sys: Arc<dyn Sys>,
    /// reconstruction's pod-dir walk has reported
    pub(super) leftovers_done: bool,
    /// when orphans were last swept
    pub(super) last_sweep: Option<Instant>,
    /// a pod target went away since the last sweep
    pub(super) sweep_wanted: bool,
    /// a job finished or a checkpoint was written since the allocator was
    /// last trimmed
    pub(super) trim_due: bool,
    /// when the allocator was last trimmed
    pub(super) last_trim: Option<Instant>,
    /// since when outcomes appended without a flush have been waiting for
    /// one while jobs were in flight (see `maybe_flush`)
    pub(super) outcomes_since: Option<Instant>,
    /// targets reconstruction could not rebuild (both phases), for the
    /// one-time forced cleanup (`super::forced`)
    pub(super) failed_reconstructions: Vec<crate::reconstruct::FailedTarget>,
    /// the forced cleanup has run
    pub(super) forced_cleanup_done: bool,
    /// pods refused a volume for their SELinux label, applied again when
    /// other pods change (see `sources::Applied::refused`)
    pub(super) refused: BTreeMap<PodUid, DesiredPod>,
}

/// The allocator is trimmed at most this often, once no job is in flight.
const TRIM_EVERY: Duration = Duration::from_secs(1);
/// Outcomes appended without a flush wait at most this long for one while
/// other jobs keep running (a long mkfs or a hung mount would otherwise
/// hold them back for as long as it runs).
const FLUSH_WITHIN: Duration = Duration::from_millis(200);
/// Orphan sweeps run at most this often.
const SWEEP_EVERY: Duration = Duration::from_secs(2);
/// And at least this often once populated.
const SWEEP_IDLE: Duration = Duration::from_secs(120);

pub(super) fn lock(world: &Mutex<World>) -> MutexGuard<'_, World> {
    // The world is plain data; every mutation completes before anything
    // that could panic, so a poisoned lock still guards a consistent state.
    world.lock().unwrap_or_else(|p| p.into_inner())
}

impl EventLoop {
    /// Runs until [`Event::Stop`] and every in-flight job has reported.
    pub fn run(mut self) {
        loop {
            let now = Instant::now();
            let mut wake = self
                .pending
                .next_retry(now)
                .map_or(self.cfg.resync, |t| t.saturating_duration_since(now))
                .min(self.cfg.resync);
            if self.sweep_wanted
                && let Some(last) = self.last_sweep
            {
                wake = wake.min((last + SWEEP_EVERY).saturating_duration_since(now));
            }
            if self.trim_due
                && let Some(last) = self.last_trim
            {
                wake = wake.min((last + TRIM_EVERY).saturating_duration_since(now));
            }
            if self.stopping {
                // only events matter now (the last jobs reporting): no
                // deadline of work that will not be done, which would spin
                wake = self.cfg.resync;
            } else if let Some(since) = self.outcomes_since {
                wake = wake.min((since + FLUSH_WITHIN).saturating_duration_since(now));
            }
            let mut pass_due = match self.events.recv_timeout(wake) {
                Ok(ev) => self.handle(ev),
                Err(RecvTimeoutError::Timeout) => true,
                Err(RecvTimeoutError::Disconnected) => {
                    self.stopping = true;
                    true
                }
            };
            // Take every event already queued before planning once.
            while let Ok(ev) = self.events.try_recv() {
                pass_due |= self.handle(ev);
            }
            if self.stopping {
                if self.pending.running() == 0 {
                    tracing::info!("reconciler stopped: no operation in flight");
                    return;
                }
                continue;
            }
            // A job that succeeded while others still wait for a worker
            // needs no pass yet: whatever its end makes startable would
            // queue behind them, and the pass (O(volumes)) would run once
            // per finished job — most of the loop's CPU at a mass start.
            // The job that empties the queue reports later and brings the
            // pass (and the gauges) up to date.
            if pass_due || self.queued.load(Ordering::SeqCst) == 0 {
                self.reconcile();
            }
            self.maybe_force_cleanup();
            self.maybe_flush();
            self.maybe_sweep();
            self.maybe_checkpoint();
            self.maybe_trim();
        }
    }

    /// After a burst of jobs or a checkpoint, once no job is in flight:
    /// gives the memory they freed back to the kernel (at most every [`TRIM_EVERY`]; an idle
    /// daemon never trims).
    fn maybe_trim(&mut self) {
        if !self.trim_due || self.pending.running() != 0 {
            return;
        }
        let now = Instant::now();
        if self.last_trim.is_some_and(|t| now < t + TRIM_EVERY) {
            return;
        }
        self.trim_due = false;
        self.last_trim = Some(now);
        crate::host::sys::trim_malloc();
    }

    /// Applies source events to the DSW, counts their SELinux metrics, and
    /// retries the pods refused for a label once any other pod changed.
    ///
    /// Pods that already have targets in the ASW are applied before new
    /// ones: after a restart the pod that holds a volume's label keeps it,
    /// and a newcomer with another label is the one refused (never the
    /// other way round, which would unmount a running pod's volume).
    fn apply_sources(&mut self, events: Vec<SourceEvent>) {
        let mut w = lock(&self.world);
        let events = holders_first(events, &w.asw);
        let mut others_changed = false;
        for e in events {
            let pod = match &e {
                SourceEvent::PodAdded(p) | SourceEvent::PodUpdated(p) => Some(p.clone()),
                SourceEvent::PodRemoved(uid) => {
                    self.refused.remove(uid);
                    others_changed = true;
                    None
                }
                SourceEvent::SourcesReady => None,
            };
            let applied = apply_event(&mut w.dsw, e, &self.cfg.selinux);
            for m in &applied.metrics {
                self.metrics.selinux.record(m);
            }
            if let Some(p) = pod {
                if applied.refused {
                    self.refused.insert(p.uid.clone(), p);
                } else {
                    self.refused.remove(&p.uid);
                    others_changed = true;
                }
            }
        }
        if !others_changed {
            return;
        }
        let mut admitted = Vec::new();
        for p in self.refused.values() {
            let applied = apply_event(
                &mut w.dsw,
                SourceEvent::PodUpdated(p.clone()),
                &self.cfg.selinux,
            );
            for m in &applied.metrics {
                self.metrics.selinux.record(m);
            }
            if !applied.refused {
                admitted.push(p.uid.clone());
            }
        }
        for uid in admitted {
            self.refused.remove(&uid);
        }
    }

    /// Applies one event; true when it calls for a reconcile pass now
    /// (anything but a job that succeeded).
    fn handle(&mut self, ev: Event) -> bool {
        match ev {
            Event::Stop => self.stopping = true,
            Event::Leftovers(output, outside) => {
                let mut w = lock(&self.world);
                for e in apply_to_asw(&output, &mut w.asw) {
                    tracing::error!(error = %e, "reconstruction: the ASW refused a leftover decision");
                }
                w.unmounted_outside.extend(outside);
                self.failed_reconstructions
                    .extend(output.failed.iter().cloned());
                self.leftovers_done = true;
                self.sweep_wanted = true;
            }
            Event::Sources(events) => self.apply_sources(events),
            Event::JobDone(report) => {
                self.trim_due = true;
                let ok = report.error.is_none();
                self.pending.finish(&report.key, ok, Instant::now());
                if self.stopping && report.ran.is_empty() && report.updates.is_empty() {
                    // queued when the stop came: not started, nothing to apply
                    tracing::debug!(volume = %report.key.volume, "operation not started: stopping");
                    return false;
                }
                if report.ran.contains(&crate::model::Operation::TearDown) {
                    self.sweep_wanted = true;
                }
                if report.forced {
                    self.forced_done(&report);
                    return true;
                }
                let mut w = lock(&self.world);
                for u in &report.updates {
                    if let Err(e) = apply_update(&mut w.asw, u) {
                        tracing::error!(error = %e, "applying a finished operation to the ASW failed");
                    }
                }
                if let Some(err) = &report.error {
                    tracing::warn!(volume = %report.key.volume, error = %err, "volume operation failed; backing off");
                    let pods: BTreeSet<_> = match &report.key.pod {
                        Some(p) => [p.clone()].into(),
                        None => w
                            .dsw
                            .volume(&report.key.volume)
                            .map(|v| v.pods.keys().cloned().collect())
                            .unwrap_or_default(),
                    };
                    for p in pods {
                        w.dsw.add_pod_error(&p, err.clone());
                    }
                }
                return !ok;
            }
        }
        true
    }

    fn reconcile(&mut self) {
        let now = Instant::now();
        let mut w = lock(&self.world);
        let p = {
            let pending = &self.pending;
            plan(&w.dsw, &w.asw, &|k| pending.busy(k, now))
        };
        for b in p.blocked {
            w.dsw.add_pod_error(&b.pod, b.error.to_string());
        }
        for action in p.actions {
            let key = action.key();
            if !self.pending.start(&key, now) {
                continue;
            }
            if let Action::Forget { volume } = &action {
                let ok = self.forget(&mut w.asw, volume);
                self.pending.finish(&key, ok, now);
                continue;
            }
            // Only teardowns read the journal (for the target's last
            // parameters), under its lock and without copying its state: a
            // copy per pass is O(targets) with the appenders locked out.
            let job = match (&action, &self.journal) {
                (Action::Mount { .. }, _) | (_, None) => {
                    job_for(&action, &w.asw, None, &self.cfg.layout)
                }
                (_, Some(j)) => {
                    j.with_state(|s| job_for(&action, &w.asw, Some(s), &self.cfg.layout))
                }
            };
            match job {
                Some(job) => {
                    // The intent goes in now, unflushed: the worker waits
                    // for it to be durable before touching the OS, and the
                    // jobs of one pass share the flush. A journal that
                    // refuses it leaves the job to append its own intent,
                    // fail, and report as any failed intent does.
                    let intent = match &self.journal {
                        Some(j) => Executor::announce(j, &job).unwrap_or_else(|e| {
                            tracing::error!(error = %e, "journal intent");
                            None
                        }),
                        None => None,
                    };
                    if !self.send_job(Queued { job, intent }) {
                        self.pending.finish(&key, false, now);
                        self.stopping = true;
                    }
                }
                None => {
                    tracing::error!(
                        ?action,
                        "no parameters known for this operation; it is left for a later pass"
                    );
                    self.pending.finish(&key, false, now);
                }
            }
        }
        self.update_gauges(&w);
    }

    /// Hands a job to the workers, counted as queued until one takes it;
    /// false when the workers are gone.
    pub(super) fn send_job(&self, q: Queued) -> bool {
        self.queued.fetch_add(1, Ordering::SeqCst);
        self.jobs.send(q).is_ok()
    }

    /// Drops a volume with nothing left from the ASW, and its targets from the journal.
    fn forget(&self, asw: &mut ActualStateOfWorld, volume: &UniqueVolumeName) -> bool {
        if let Err(e) = asw.delete_volume(volume) {
            tracing::warn!(error = %e, "forget volume");
            return false;
        }
        let Some(j) = &self.journal else {
            return true;
        };
        let targets: Vec<TargetRef> = j.with_state(|state| {
            state
                .entries()
                .filter(|(k, e)| {
                    &k.volume == volume && e.reported_state() == MountState::NotMounted
                })
                .map(|(k, _)| k.target.clone())
                .collect()
        });
        // one batch: one flush however many targets
        if let Err(e) = j.forget(volume, targets) {
            tracing::error!(error = %e, "journal forget records");
            return false;
        }
        true
    }

    fn update_gauges(&self, w: &World) {
        // Counted in place: a copy of every target per pass would make each
        // pass O(volumes) in allocations.
        let mut counts: Vec<(PluginName, &'static str, usize)> = Vec::new();
        for (p, n) in w.asw.mounted_counts() {
            counts.push((p, "actual_state_of_world", n));
        }
        for (p, n) in w.dsw.to_mount_counts() {
            counts.push((p, "desired_state_of_world", n));
        }
        self.metrics.ops.set_total_volumes(&counts);
    }

    /// Sweeps orphaned pod dirs once every source has listed and the
    /// reconstruction walk is done; then after teardowns (rate-limited) and
    /// every [`SWEEP_IDLE`]. Never while an operation is in flight: the
    /// sweep completes the `.deleting~` renames of every pod, and a disk
    /// emptyDir's TearDown on a worker renames and then deletes its own
    /// (the job that ends last brings the next iteration, and the sweep).
    fn maybe_sweep(&mut self) {
        if !self.leftovers_done || self.pending.running() != 0 {
            return;
        }
        let now = Instant::now();
        let due = match self.last_sweep {
            None => true,
            Some(t) => {
                let since = now.saturating_duration_since(t);
                (self.sweep_wanted && since >= SWEEP_EVERY) || since >= SWEEP_IDLE
            }
        };
        let known = {
            let w = lock(&self.world);
            if !due || !w.dsw.is_populated() {
                return;
            }
            let mut known: BTreeSet<crate::model::PodUid> = BTreeSet::new();
            for (_, v) in w.dsw.volumes() {
                known.extend(v.pods.keys().cloned());
            }
            for (_, v) in w.asw.volumes() {
                known.extend(v.pods.keys().cloned());
            }
            known
        };
        let r = super::orphans::sweep(&self.cfg.layout, self.sys.as_ref(), &known);
        for (path, why) in &r.left {
            tracing::warn!(path = %path.display(), %why, "orphan cleanup left this");
        }
        if r.examined > 0 || r.finished_deletions > 0 {
            tracing::info!(
                examined = r.examined,
                removed = r.removed,
                errors = r.errors,
                finished_deletions = r.finished_deletions,
                "orphaned pod dirs swept"
            );
        }
        let as_i64 = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.metrics.ops.orphan_cleaned.set(as_i64(r.examined));
        self.metrics.ops.orphan_cleaned_errors.set(as_i64(r.errors));
        self.last_sweep = Some(now);
        self.sweep_wanted = false;
    }

    /// Makes the outcomes the workers appended without waiting durable:
    /// once no job is in flight (one flush for the whole burst; while jobs
    /// run, their intents' flushes carry the earlier outcomes along), or
    /// once they have waited [`FLUSH_WITHIN`] while jobs are still running.
    fn maybe_flush(&mut self) {
        let Some(j) = &self.journal else { return };
        let (flush, since) = flush_due(
            j.has_pending(),
            self.pending.running() != 0,
            self.outcomes_since,
            Instant::now(),
        );
        self.outcomes_since = since;
        if !flush {
            return;
        }
        if let Err(e) = j.flush_pending() {
            // A failed flush closes the journal for good (no later append
            // succeeds): stop, as a failed intent would, and reconstruct.
            tracing::error!(error = %e, "flushing the journal's outcomes failed; stopping");
            self.stopping = true;
        }
    }

    fn maybe_checkpoint(&mut self) {
        let (Some(j), n) = (&self.journal, self.cfg.checkpoint_every) else {
            return;
        };
        if n == 0 || j.synced_through() < self.last_checkpoint_seq + n {
            return;
        }
        // The checkpoint's buffers (the whole state, encoded and sealed:
        // megabytes at 10k volumes) are freed by now: give them back too.
        let done = j.checkpoint();
        self.trim_due = true;
        match done {
            Ok(r) => {
                self.last_checkpoint_seq = r.through_seq;
                tracing::debug!(
                    through = r.through_seq,
                    dropped = r.dropped,
                    "journal checkpoint"
                );
            }
            Err(e) => tracing::error!(error = %e, "journal checkpoint failed"),
        }
    }
}

/// Whether the outcomes waiting for a flush (`waiting`) are flushed now,
/// and since when they wait afterwards: at once when no job runs, else
/// once they have waited [`FLUSH_WITHIN`].
fn flush_due(
    waiting: bool,
    jobs_running: bool,
    since: Option<Instant>,
    now: Instant,
) -> (bool, Option<Instant>) {
    if !waiting {
        return (false, None);
    }
    if !jobs_running {
        return (true, None);
    }
    let since = since.unwrap_or(now);
    if now >= since + FLUSH_WITHIN {
        (true, None)
    } else {
        (false, Some(since))
    }
}

/// `events` with the additions and updates of pods that have a target in
/// the ASW moved before those of pods that have none; otherwise in order
/// (removals stay first, `SourcesReady` stays last).
fn holders_first(events: Vec<SourceEvent>, asw: &ActualStateOfWorld) -> Vec<SourceEvent> {
    let is_pod =
        |e: &SourceEvent| matches!(e, SourceEvent::PodAdded(_) | SourceEvent::PodUpdated(_));
    if events.iter().filter(|e| is_pod(e)).count() < 2 {
        return events;
    }
    let holders: BTreeSet<&PodUid> = asw.possibly_mounted_iter().map(|(_, p, _)| p).collect();
    let rank = |e: &SourceEvent| match e {
        SourceEvent::PodRemoved(_) => 0,
        SourceEvent::PodAdded(p) | SourceEvent::PodUpdated(p) if holders.contains(&p.uid) => 1,
        SourceEvent::PodAdded(_) | SourceEvent::PodUpdated(_) => 2,
        SourceEvent::SourcesReady => 3,
    };
    let mut ranked: Vec<(u8, SourceEvent)> = events.into_iter().map(|e| (rank(&e), e)).collect();
    ranked.sort_by_key(|(r, _)| *r);
    ranked.into_iter().map(|(_, e)| e).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{PodMount, SeLinuxState};

    fn pod(uid: &str) -> DesiredPod {
        DesiredPod {
            uid: PodUid::new(uid).unwrap(),
            namespace: "default".into(),
            name: uid.into(),
            file: format!("/pods/{uid}.yaml").into(),
            volumes: vec![],
            unresolved: Default::default(),
            errors: vec![],
            selinux: Default::default(),
        }
    }

    #[test]
    fn outcomes_are_flushed_when_idle_or_after_waiting_long_enough() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let wait = u64::try_from(FLUSH_WITHIN.as_millis()).unwrap();
        // (waiting, jobs running, since, now) -> (flush, since after)
        let cases = [
            ("nothing waits", false, true, Some(t0), ms(0), (false, None)),
            (
                "no job runs: at once",
                true,
                false,
                None,
                ms(0),
                (true, None),
            ),
            (
                "a job runs: the wait starts",
                true,
                true,
                None,
                ms(5),
                (false, Some(ms(5))),
            ),
            (
                "still within the bound",
                true,
                true,
                Some(t0),
                ms(wait - 1),
                (false, Some(t0)),
            ),
            (
                "the bound reached",
                true,
                true,
                Some(t0),
                ms(wait),
                (true, None),
            ),
            (
                "long past it",
                true,
                true,
                Some(t0),
                ms(10 * wait),
                (true, None),
            ),
        ];
        for (what, waiting, running, since, now, want) in cases {
            assert_eq!(flush_due(waiting, running, since, now), want, "{what}");
        }
    }

    fn order(events: &[SourceEvent]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                SourceEvent::PodAdded(p) => format!("+{}", p.uid),
                SourceEvent::PodUpdated(p) => format!("~{}", p.uid),
                SourceEvent::PodRemoved(u) => format!("-{u}"),
                SourceEvent::SourcesReady => "ready".into(),
            })
            .collect()
    }

    #[test]
    fn pods_holding_targets_are_applied_before_newcomers() {
        let mut asw = ActualStateOfWorld::new();
        let v = UniqueVolumeName::from_raw("kubernetes.io/local-volume/pv1");
        asw.add_volume(v.clone(), PluginName::LocalVolume, "pv1", None, None);
        asw.mark_volume_uncertain(
            &v,
            &PodUid::new("b-holder").unwrap(),
            PodMount {
                outer_name: "data".into(),
                mount_path: "/r/pods/b-holder/v".into(),
                kind: crate::model::TargetKind::Mount,
                selinux: SeLinuxState::Unknown,
            },
        )
        .unwrap();
        let events = vec![
            SourceEvent::PodRemoved(PodUid::new("gone").unwrap()),
            SourceEvent::PodAdded(pod("a-new")),
            SourceEvent::PodAdded(pod("b-holder")),
            SourceEvent::PodUpdated(pod("c-new")),
            SourceEvent::SourcesReady,
        ];
        assert_eq!(
            order(&holders_first(events, &asw)),
            ["-gone", "+b-holder", "+a-new", "~c-new", "ready"]
        );
    }
}
