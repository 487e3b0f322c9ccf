//! The reconciler loop's decisions as a pure step: `(state, events, now,
//! what the driver observed) → effects`. No journal, no syscall, no thread,
//! no clock: the driver (`crate::daemon::event_loop`) calls [`Core::step`] with the
//! [`World`] locked — so the step changes only memory — and performs the
//! returned [`Effect`]s after unlocking, slow ones off the decision thread;
//! their completions come back as [`Event::Done`].
//!
//! The state is one [`Phase`] (where startup and shutdown stand), the
//! operations `Pending` admits, and deadlines ([`Timers`]) instead of flags:
//! a flush is due by a time, a sweep at a time, a trim not before a time.
//! Each step applies the events, then — unless the wake brought only jobs
//! that succeeded while started jobs still wait for a worker (the job that
//! empties the queue brings the pass; one pass per finished job made the
//! loop O(volumes) per job) — plans a pass (`reconciler::plan`; it starts
//! at most `pass_budget` jobs), then the one-time forced cleanup, flush,
//! sweep, checkpoint, the late-call check, republish, and last repack and
//! trim (both wait for an idle core). While the journal cannot be written
//! nothing starts and a recovery is tried with backoff (`unwritable`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::effects::{FAILED_MOUNT, FAILED_UNMOUNT};
use crate::model::{
    Layout, Operation, PluginName, PodUid, SharedPath, TargetRef, UniqueVolumeName,
};
use crate::reconciler::jobs::JobReport;
use crate::reconciler::jobs::{apply_update, job_for};
use crate::reconciler::pending::{OpKey, Pending, pass_budget};
use crate::reconciler::plan::{Action, plan};
use crate::reconstruct::{FailedTarget, MergeOutput, apply_to_asw};
use crate::selinux::Policy;
use crate::sources::DesiredPod;

mod handover;
mod housekeeping;
mod late;
mod node_status;
mod republish;
pub(super) mod unheld;
mod unwritable;

pub(crate) use super::effects::{
    Completion, Counted, Effect, Event, Finish, HostWork, JournalWork, Observed, PodEvent,
    Reconstructed, Swept,
};
pub(crate) use crate::state::World;
pub(crate) use housekeeping::{FLUSH_WITHIN, InFlight, Timers};
#[cfg(test)]
pub(crate) use housekeeping::{SWEEP_EVERY, SWEEP_IDLE, TRIM_EVERY, idle_sweep_wait};
#[cfg(test)]
pub(crate) use late::LATE_CHECK_EVERY;
pub(crate) use late::LATE_WINDOW_FLOOR;
pub(crate) use unwritable::Unwritable;
#[cfg(test)]
pub(crate) use unwritable::{RECOVER_FIRST, RECOVER_MAX};

/// Where startup and shutdown stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// reconstruction's phase 1 has not handed over the ASW yet: source
    /// events fill the DSW meanwhile (KEP-3756: the populator runs beside
    /// reconstruction), nothing is planned; where a pod can be refused
    /// for its label, they wait for the ASW (`apply_sources`)
    Reconstructing,
    /// not every pod source has listed: not ready, nothing is unmounted
    /// (`plan`'s gate); `walked`: the pod-dir walk has reported
    Listing {
        /// the walk reported first
        walked: bool,
    },
    /// every source listed (ready); the pod-dir walk still runs
    Populated,
    /// listed and walked: the forced cleanup has been decided, orphans are
    /// swept on their timers
    Settled,
    /// stop asked: nothing new starts; over once nothing is in flight
    Stopping,
}

impl Phase {
    /// Whether `/readyz` says 200: reconstruction's phase 1 is done (the
    /// loop exists only after it) and every pod source has listed. The
    /// pod-dir walk is not waited for: it only finds kubelet-era dirs and
    /// leftovers for cleanup.
    pub(crate) fn ready(self) -> bool {
        matches!(self, Phase::Populated | Phase::Settled)
    }
}

/// The core's settings.
#[derive(Debug, Clone)]
pub(crate) struct CoreConfig {
    /// the kubelet layout
    pub layout: Layout,
    /// the journal is on (flushes, checkpoints, forgets, announced intents)
    pub journal: bool,
    /// how often to re-plan with nothing happening
    pub resync: Duration,
    /// journal records between checkpoints (0: never)
    pub checkpoint_every: u64,
    /// the SELinux label rules
    pub selinux: Policy,
    /// how long the path of a CSI call that ended uncertain is watched for
    /// a late mount (zero: never; see `late`)
    pub late_window: Duration,
    /// the kubelet's sync period: how often `requiresRepublish` volumes
    /// are published again (zero: never)
    pub republish_every: Duration,
}

/// The loop's state.
#[derive(Debug)]
pub(crate) struct Core {
    pub(super) cfg: CoreConfig,
    pub(super) phase: Phase,
    pub(super) pending: Pending,
    pub(super) timers: Timers,
    pub(super) in_flight: InFlight,
    /// the checkpoint covers the journal through this sequence number
    last_checkpoint_seq: u64,
    /// targets reconstruction could not rebuild (both phases), for the
    /// one-time forced cleanup (`super::forced`; emptied when decided)
    pub(super) failed: Vec<FailedTarget>,
    /// the journal's targets reconstruction decided not mounted (both
    /// phases), forgotten once settled unless wanted (`unheld`; emptied
    /// when decided)
    pub(super) not_mounted: Vec<crate::journal::TargetKey>,
    /// journal targets not held whose operation ran when they were
    /// looked at, by volume (`unheld`)
    pub(super) deferred: unheld::Deferred,
    /// pods refused a volume for their SELinux label, applied again when
    /// other pods change (see `sources::Applied::refused`)
    pub(super) refused: BTreeMap<PodUid, DesiredPod>,
    /// the namespace the last pod entry kept, shared by the next of the
    /// same namespace (see `admit::pod_entry`)
    pub(super) namespace: crate::model::SharedStr,
    /// paths watched for a late mount
    pub(super) late: BTreeMap<SharedPath, late::Watched>,
    /// where the next sweep finishes interrupted deletions (all at start)
    pub(super) finish: Finish,
    /// events that came while reconstructing and wait for the ASW
    early: Vec<Event>,
    /// the World's size at its last repack, or less since (`maybe_repack`)
    pub(super) repacked_at: usize,
    /// the journal's tail at start, folded once settled (`with_tail`)
    pub(super) start_tail: u64,
    /// the journal cannot be written: nothing starts (`unwritable`)
    pub(super) unwritable: Option<Unwritable>,
}

impl Core {
    /// A core in [`Phase::Listing`], with reconstruction's phase 1 failures
    /// and the journal's watermark at start.
    pub(crate) fn new(cfg: CoreConfig, failed: Vec<FailedTarget>, synced_through: u64) -> Self {
        Self {
            cfg,
            phase: Phase::Listing { walked: false },
            pending: Pending::new(),
            timers: Timers::default(),
            in_flight: InFlight::default(),
            last_checkpoint_seq: synced_through,
            failed,
            not_mounted: Vec::new(),
            deferred: Default::default(),
            refused: BTreeMap::new(),
            namespace: Default::default(),
            late: BTreeMap::new(),
            finish: Finish::All,
            early: Vec::new(),
            repacked_at: 0,
            start_tail: 0,
            unwritable: None,
        }
    }

    /// A core started before reconstruction's phase 1 is over
    /// ([`Phase::Reconstructing`]): [`Event::Reconstructed`] brings the
    /// ASW and the failed targets.
    pub(crate) fn reconstructing(cfg: CoreConfig, synced_through: u64) -> Self {
        Self {
            phase: Phase::Reconstructing,
            ..Self::new(cfg, Vec::new(), synced_through)
        }
    }

    /// The phase.
    pub(crate) fn phase(&self) -> Phase {
        self.phase
    }

    /// The pod-dir walk (phase 2) decided from the start's mount table
    /// while the loop went on: a target the loop has learned or worked on
    /// since (the ASW holds it, or its key is busy) is the loop's, and the
    /// walk's older view of it is dropped. A raw block map made during the
    /// walk showed there as its symlink without its bind: a half map, which
    /// must not make the loop's own map uncertain.
    fn drop_stale_leftovers(&self, w: &World, output: &mut MergeOutput, now: Instant) {
        output.decisions.retain(|d| {
            let pod = d.key.target.pod().cloned();
            let known = match &pod {
                None => w.asw.volume_exists(&d.key.volume),
                Some(p) => w.asw.pod(&d.key.volume, p).is_some(),
            };
            let key = OpKey {
                volume: d.key.volume.clone(),
                pod,
            };
            !known && !self.pending.busy(&key, now)
        });
    }

    /// Stopping, with no job and no slow effect in flight: the loop ends.
    pub(crate) fn finished(&self) -> bool {
        self.phase == Phase::Stopping && self.pending.running() == 0 && !self.in_flight.any()
    }

    /// How long the driver may wait for an event: until the earliest
    /// deadline whose other conditions hold (a deadline that cannot fire
    /// yet would make the loop spin), at most the resync.
    pub(crate) fn next_wake(&self, now: Instant) -> Duration {
        let idle = self.pending.running() == 0;
        let t = &self.timers;
        let deadlines = [
            self.pending.next_retry(now),
            t.flush_by
                .filter(|_| !self.in_flight.flush && self.unwritable.is_none()),
            t.sweep_at
                .filter(|_| idle && !self.in_flight.sweep && self.phase == Phase::Settled),
            t.trim_at.filter(|_| idle && !self.in_flight.trim),
            t.late_check_at.filter(|_| !self.in_flight.late_check),
            t.republish_at.filter(|_| !self.in_flight.sweep),
            t.forget_retry_at,
            self.unwritable
                .map(|u| u.retry_at)
                .filter(|_| !self.in_flight.recover),
        ];
        let mut wake = self.cfg.resync;
        if self.phase != Phase::Stopping {
            for d in deadlines.into_iter().flatten() {
                wake = wake.min(d.saturating_duration_since(now));
            }
        }
        wake
    }

    /// One step: applies `events` (none: a timer or the resync fired) to
    /// the core and `w`, and returns what the driver must do, in order.
    pub(crate) fn step(
        &mut self,
        w: &mut World,
        events: Vec<Event>,
        now: Instant,
        obs: Observed,
    ) -> Vec<Effect> {
        let mut out = Vec::new();
        let mut pass_due = events.is_empty();
        for ev in events {
            pass_due |= self.handle(w, ev, now, &mut out);
        }
        w.ready = self.phase.ready() || (w.ready && self.phase == Phase::Stopping);
        self.watch_journal(obs.journal_unwritable, now, &mut out);
        if matches!(self.phase, Phase::Stopping | Phase::Reconstructing) {
            return out;
        }
        // With the journal unwritable nothing starts (no operation without
        // a durable intent): no pass, no forced cleanup, no flush, no
        // checkpoint, no republish; the recovery is tried instead.
        let writable = self.unwritable.is_none();
        if writable && (pass_due || obs.queued_jobs == 0) && !self.in_flight.sweep {
            self.reconcile(w, now, &mut out);
        }
        if writable && self.phase == Phase::Settled && !self.failed.is_empty() {
            self.force_cleanup(w, now, &mut out);
        }
        if writable {
            self.forget_not_mounted(w, now, &mut out);
        }
        if writable {
            self.maybe_flush(now, &mut out);
        }
        self.maybe_recover(now, &mut out);
        self.maybe_sweep(w, now, &mut out);
        if writable {
            self.maybe_checkpoint(obs.synced_through, w.asw.volume_count(), &mut out);
        }
        self.maybe_check_late(now, &mut out);
        if writable {
            self.maybe_republish(w, now, &mut out);
        }
        self.maybe_repack(w, now, &mut out);
        self.maybe_trim(now, &mut out);
        out
    }

    /// Applies one event; true when it calls for a pass now (anything but
    /// a job that succeeded or a journal write done).
    pub(super) fn handle(
        &mut self,
        w: &mut World,
        ev: Event,
        now: Instant,
        out: &mut Vec<Effect>,
    ) -> bool {
        if self.phase == Phase::Reconstructing && self.waits_for_asw(&ev) {
            self.early.push(ev);
            return false;
        }
        match ev {
            Event::Stop => self.phase = Phase::Stopping,
            Event::Leftovers(mut output, outside) => {
                // The walk journaled its not-mounted targets before the
                // loop saw them: one dropped as stale below (an operation
                // on its volume ran, or its key backed off) is a candidate
                // all the same, or the journal would keep it for good (the
                // soak's third finding). The forget's own checks keep what
                // a pod wants, the ASW holds or an operation took.
                let noted: Vec<_> = not_mounted(&output).collect();
                self.drop_stale_leftovers(w, &mut output, now);
                for e in apply_to_asw(&output, &mut w.asw) {
                    tracing::error!(error = %e, "reconstruction: the ASW refused a leftover decision");
                }
                w.unmounted_outside.extend(outside);
                self.failed.extend(output.failed.iter().cloned());
                self.note_not_mounted(noted);
                self.phase = match self.phase {
                    Phase::Listing { .. } => Phase::Listing { walked: true },
                    Phase::Populated => self.settle(now),
                    p => p,
                };
            }
            Event::Reconstructed(r) => self.reconstructed(w, *r, now, out),
            Event::Sources(events) => {
                let dropped = self.apply_sources(w, events, out);
                self.forget_unheld(w, dropped, out);
                if let Phase::Listing { walked } = self.phase
                    && w.dsw.is_populated()
                {
                    self.phase = if walked {
                        self.settle(now)
                    } else {
                        Phase::Populated
                    };
                }
            }
            Event::JobDone(report) => return self.job_done(w, report, now, out),
            Event::Done(c) => return self.completed(w, c, now, out),
            Event::NodeDevicePaths(paths) => node_status::device_paths_from_node(w, paths),
            // a pass: mounts that waited for the report may start
            Event::ReportedInUse(names) => return w.dsw.mark_reported_in_use(&names) > 0,
        }
        true
    }

    fn job_done(
        &mut self,
        w: &mut World,
        report: JobReport,
        now: Instant,
        out: &mut Vec<Effect>,
    ) -> bool {
        let ok = report.error.is_none();
        // a pod target torn down (a raw block map undone too): its key
        // stays busy until its journal target is forgotten or found to go
        // with its volume (`torn_down_target`)
        let torn_down = ok
            && self.cfg.journal
            && !report.forced
            && report.key.pod.is_some()
            && report
                .ran
                .iter()
                .any(|op| matches!(op, Operation::TearDown | Operation::UnmapPodDevice));
        if !torn_down {
            self.pending.finish(&report.key, ok, now);
        }
        self.trim_due(now);
        if self.cfg.journal {
            // the worker appended outcomes without waiting for them
            self.timers.flush_by.get_or_insert(now + FLUSH_WITHIN);
        }
        if self.phase == Phase::Stopping && report.ran.is_empty() && report.updates.is_empty() {
            // queued when the stop came: not started, nothing to apply
            tracing::debug!(volume = %report.key.volume, "operation not started: stopping");
            return false;
        }
        // a pod target gone (a raw block map too: its pod dir's
        // `volumeDevices` is left for the sweep to remove)
        if report
            .ran
            .iter()
            .any(|op| matches!(op, Operation::TearDown | Operation::UnmapPodDevice))
        {
            self.torn_down(report.key.pod.as_ref(), now);
        }
        if report.forced {
            self.forced_done(&report, out);
            return true;
        }
        for u in &report.updates {
            if let Err(e) = apply_update(&mut w.asw, u) {
                tracing::error!(error = %e, "applying a finished operation to the ASW failed");
            }
        }
        if torn_down {
            self.torn_down_target(w, &report.key, now, out);
        }
        self.forget_deferred(w, &report.key.volume, out);
        if let Some(watch) = report.late.clone() {
            self.watch_late(*watch, now);
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
            // The kubelet's reasons: the way in fails a mount, the way out
            // an unmount (a device's teardown has no pod left to tell).
            let reason = match report.ran.last() {
                Some(Operation::TearDown | Operation::UnmountDevice) => FAILED_UNMOUNT,
                _ => FAILED_MOUNT,
            };
            for p in pods {
                w.dsw.add_pod_error(&p, err.to_string());
                out.push(Effect::PodEvent(PodEvent {
                    names: w.pods.get(&p).map(|e| e.pod.clone()),
                    pod: p,
                    reason,
                    message: format!("volume {}: {err}", report.key.volume),
                }));
            }
        }
        !ok
    }

    fn completed(
        &mut self,
        w: &mut World,
        c: Completion,
        now: Instant,
        out: &mut Vec<Effect>,
    ) -> bool {
        match c {
            Completion::NotStarted {
                key,
                forced,
                workers_gone,
            } => {
                self.pending.finish(&key, false, now);
                self.forget_deferred(w, &key.volume, out);
                if forced {
                    out.push(Effect::Count(Counted::ForceCleanedError));
                }
                if workers_gone {
                    self.phase = Phase::Stopping;
                }
                false
            }
            Completion::Flushed(r) => {
                self.in_flight.flush = false;
                if let Err(e) = r {
                    // The journal is unwritable now: the driver's next
                    // observation says so, and nothing starts until a
                    // recovery writes what waits (`unwritable`).
                    tracing::error!(error = %e, "flushing the journal's outcomes failed");
                }
                false
            }
            Completion::Recovered(r) => self.recovered(r, now, out),
            Completion::Checkpointed(r) => {
                self.in_flight.checkpoint = false;
                // its buffers (the whole state, encoded) are freed by now
                self.trim_due(now);
                match r {
                    Ok(through) => self.last_checkpoint_seq = through,
                    Err(e) => tracing::error!(error = %e, "journal checkpoint failed"),
                }
                false
            }
            Completion::Forgotten { key, ok } => {
                self.in_flight.forgets = self.in_flight.forgets.saturating_sub(1);
                if let Some(k) = key {
                    self.pending.finish(&k, ok, now);
                    self.forget_deferred(w, &k.volume, out);
                }
                true
            }
            Completion::NotMountedForgotten { targets, keys, ok } => {
                self.in_flight.forgets = self.in_flight.forgets.saturating_sub(1);
                for k in &keys {
                    self.pending.finish(k, ok, now);
                }
                if !ok {
                    self.forget_failed(targets, now);
                }
                for k in &keys {
                    self.forget_deferred(w, &k.volume, out);
                }
                true
            }
            Completion::Swept(s) => {
                self.swept(s, now);
                true // the passes held back while it ran
            }
            Completion::Trimmed => {
                self.in_flight.trim = false;
                false
            }
            // the old nodes are freed: the trim gives their pages back
            Completion::Repacked => {
                self.trim_due(now);
                false
            }
            Completion::LateChecked { mounted } => self.late_checked(w, mounted, now, out),
        }
    }

    /// One pass: what `plan` decides, within `pass_budget`, is started (its
    /// key marked running); a `Forget` drops the volume from the ASW here and
    /// its journal targets on the journal's thread (the volume busy until then).
    fn reconcile(&mut self, w: &mut World, now: Instant, out: &mut Vec<Effect>) {
        let p = {
            let pending = &self.pending;
            let budget = pass_budget(w.dsw.volume_count());
            plan(&w.dsw, &w.asw, &|k| pending.busy(k, now), budget)
        };
        node_status::blocked(w, p.blocked, out);
        for action in p.actions {
            let key = action.key();
            if !self.pending.start(&key, now) {
                continue;
            }
            if let Action::Forget { volume } = &action {
                self.forget(w, key, volume.clone(), now, out);
                continue;
            }
            if let Action::Mount { want, .. } = &action {
                node_status::lifted(w, want);
            }
            let job = job_for(&action, &w.asw, None, &self.cfg.layout);
            match (&action, job) {
                (Action::Mount { .. }, Some(job)) => out.push(Effect::Start {
                    job,
                    announce: self.cfg.journal,
                }),
                (Action::TearDown { .. } | Action::UnmountDevice { .. }, fallback)
                    if self.cfg.journal =>
                {
                    out.push(Effect::StartTearDown { action, fallback });
                }
                (_, Some(job)) => out.push(Effect::Start {
                    job,
                    announce: false,
                }),
                (_, None) => {
                    tracing::error!(
                        ?action,
                        "no parameters known for this operation; it is left for a later pass"
                    );
                    self.pending.finish(&key, false, now);
                }
            }
        }
        out.push(Effect::Count(Counted::TotalVolumes(total_volumes(w))));
    }

    /// A pod target torn down (its outcome journaled): if its volume stays
    /// in the ASW (another pod's target, a device that may be mounted, or
    /// a pod that wants it), the
    /// journal forgets the target now, its key busy until that is durable
    /// (a mount of the same pod started before would have its intent
    /// forgotten). A volume that leaves the ASW forgets its targets with
    /// it (`forget`). Without this the journal kept one not-mounted target
    /// for every pod that ever used a volume other pods held meanwhile
    /// (found by the nemesis soak, `tests/soak.rs`).
    fn torn_down_target(&mut self, w: &World, key: &OpKey, now: Instant, out: &mut Vec<Effect>) {
        // A volume whose device may be mounted stays too: it leaves the
        // ASW only after an UnmountDevice, and a pod that wants it before
        // then keeps it, its forget never planned (the long soak found
        // such a target kept: a CSI volume wanted again after its last
        // pod's teardown).
        let stays = w.asw.volume(&key.volume).is_some_and(|v| {
            !v.pods.is_empty() || v.device.as_ref().is_some_and(|d| d.may_be_mounted())
        }) || w.dsw.volume(&key.volume).is_some();
        let Some(pod) = key.pod.clone().filter(|_| stays) else {
            self.pending.finish(key, true, now);
            return;
        };
        self.in_flight.forgets += 1;
        out.push(Effect::Journal(JournalWork::ForgetTarget {
            volume: key.volume.clone(),
            target: TargetRef::Pod(pod),
            key: Some(key.clone()),
        }));
    }

    fn forget(
        &mut self,
        w: &mut World,
        key: OpKey,
        volume: UniqueVolumeName,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        if let Err(e) = w.asw.delete_volume(&volume) {
            tracing::warn!(error = %e, "forget volume");
            self.pending.finish(&key, false, now);
            return;
        }
        if !self.cfg.journal {
            self.pending.finish(&key, true, now);
            return;
        }
        self.in_flight.forgets += 1;
        out.push(Effect::Journal(JournalWork::ForgetVolume { key, volume }));
    }
}

/// The targets a reconstruction phase decided not mounted.
pub(crate) fn not_mounted(
    output: &crate::reconstruct::MergeOutput,
) -> impl Iterator<Item = crate::journal::TargetKey> + '_ {
    output
        .decisions
        .iter()
        .filter(|d| d.result == crate::model::MountState::NotMounted)
        .map(|d| d.key.clone())
}

/// `volume_manager_total_volumes` now, per plugin and state.
fn total_volumes(w: &World) -> Vec<(PluginName, &'static str, usize)> {
    // Counted in place: a copy of every target per pass would make each
    // pass O(volumes) in allocations.
    let mut counts: Vec<(PluginName, &'static str, usize)> = Vec::new();
    for (p, n) in w.asw.mounted_counts() {
        counts.push((p, "actual_state_of_world", n));
    }
    for (p, n) in w.dsw.to_mount_counts() {
        counts.push((p, "desired_state_of_world", n));
    }
    counts
}

#[cfg(test)]
#[path = "core_tests.rs"]
pub(crate) mod tests;
