//! The core's deadlines acted on at the end of each step: flush, orphan
//! sweep, checkpoint and allocator trim, each rate limited.
//!
//! A sweep costs a listing of `pods/` against the known pods, plus a
//! listing beneath each pod dir in [`Finish`] (a TearDown ran there since
//! the last sweep; every pod once after a start) and the mount table read
//! once an orphan turns up. The idle sweep is the safety net for orphans
//! nothing told of; one that changed nothing and took d makes the next
//! wait [`idle_sweep_wait`]: at most 1/[`SWEEP_COST_SHARE`] of a core.
//! Also the deadlines themselves ([`Timers`]) and the slow work in flight
//! ([`InFlight`]) they wait for.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::{Core, Effect, Finish, HostWork, JournalWork, Phase, Swept, World};
use crate::journal::LONG_TAIL_FROM;
use crate::model::PodUid;

/// The allocator is trimmed at most this often, once no job is in flight.
pub(crate) const TRIM_EVERY: Duration = Duration::from_secs(1);
/// Outcomes appended without a flush wait at most this long for one while
/// other jobs keep running (a long mkfs or a hung mount must not hold them).
pub(crate) const FLUSH_WITHIN: Duration = Duration::from_millis(200);
/// Orphan sweeps run at most this often.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(2);
/// And at least this often once settled, unless the last one cost more
/// than 1/[`SWEEP_COST_SHARE`] of that.
pub(crate) const SWEEP_IDLE: Duration = Duration::from_secs(120);
/// A sweep that changed nothing and took d is followed by the next idle one
/// no sooner than d × this: idle sweeps use at most 0.1% of a core.
pub(crate) const SWEEP_COST_SHARE: u32 = 1000;

/// The World is repacked only from this many entries: below, its maps are
/// small whatever their fill.
pub(super) const REPACK_FROM: usize = 1024;

/// How long after an idle sweep that changed nothing and took `took` the
/// next one waits: [`SWEEP_IDLE`], or longer where a sweep costs more.
pub(crate) fn idle_sweep_wait(took: Duration) -> Duration {
    SWEEP_IDLE.max(took.saturating_mul(SWEEP_COST_SHARE))
}

impl Core {
    /// Flushes the outcomes appended without waiting: once no job is in
    /// flight (one flush for the whole burst; while jobs run, their intents'
    /// flushes carry earlier outcomes along), or once they have waited
    /// [`FLUSH_WITHIN`].
    pub(super) fn maybe_flush(&mut self, now: Instant, out: &mut Vec<Effect>) {
        let Some(by) = self.timers.flush_by else {
            return;
        };
        if self.in_flight.flush || (self.pending.running() != 0 && now < by) {
            return;
        }
        self.timers.flush_by = None;
        self.in_flight.flush = true;
        out.push(Effect::Journal(JournalWork::Flush));
    }

    /// Enters [`Phase::Settled`]: the first sweep is due at once, and a
    /// trim (a restart that mounts nothing ends no job, yet its merge,
    /// listings and hand-over freed more than the node's state).
    pub(super) fn settle(&mut self, now: Instant) -> Phase {
        self.timers.sweep_at = Some(now);
        self.trim_due(now);
        Phase::Settled
    }

    /// A TearDown (or a raw block unmap) ran on `pod`'s target (`None`:
    /// never for a TearDown, but then every pod): its dir may hold a
    /// `.deleting~` rename, or a gone pod's dirs, finished by a sweep asked
    /// for at the rate limit.
    pub(super) fn torn_down(&mut self, pod: Option<&PodUid>, now: Instant) {
        match pod {
            Some(p) => self.finish.insert(p.clone()),
            None => self.finish = Finish::All,
        }
        self.sweep_wanted(now);
    }

    /// Asks for a sweep at the rate limit (a pod target went away).
    pub(super) fn sweep_wanted(&mut self, now: Instant) {
        let soonest = self.timers.sweep_not_before.unwrap_or(now);
        let at = self.timers.sweep_at.map_or(soonest, |t| t.min(soonest));
        self.timers.sweep_at = Some(at);
    }

    /// Sweeps orphaned pod dirs once settled, when due, never while an
    /// operation is in flight (the sweep completes the `.deleting~` renames
    /// a disk emptyDir's or configMap's TearDown makes and deletes). The
    /// pods to finish go with it; the next idle sweep is timed from its end.
    pub(super) fn maybe_sweep(&mut self, w: &World, now: Instant, out: &mut Vec<Effect>) {
        let due = self.timers.sweep_at.is_some_and(|t| now >= t);
        if self.phase != Phase::Settled
            || !due
            || self.in_flight.sweep
            || self.pending.running() != 0
        {
            return;
        }
        let mut known: BTreeSet<PodUid> = BTreeSet::new();
        for (_, v) in w.dsw.volumes() {
            known.extend(v.pods.keys().cloned());
        }
        for (_, v) in w.asw.volumes() {
            known.extend(v.pods.keys().cloned());
        }
        self.timers.sweep_at = None;
        self.timers.sweep_not_before = Some(now + SWEEP_EVERY);
        self.in_flight.sweep = true;
        let finish = std::mem::take(&mut self.finish);
        out.push(Effect::Host(HostWork::Sweep { known, finish }));
    }

    /// A sweep ended: what it could not finish waits for the next, due at
    /// the idle period, or later after a costly one that changed nothing
    /// (unless one was asked for meanwhile).
    pub(super) fn swept(&mut self, s: Swept, now: Instant) {
        self.in_flight.sweep = false;
        // its set of known pods and its listings are freed
        self.trim_due(now);
        self.finish.merge(s.unfinished);
        let wait = if s.changed {
            SWEEP_IDLE
        } else {
            idle_sweep_wait(s.took)
        };
        let idle = now + wait;
        self.timers.sweep_at = Some(self.timers.sweep_at.map_or(idle, |t| t.min(idle)));
    }

    /// The journal's tail at start worth folding (`Journal::long_tail`
    /// decides which is), or 0. A tail given is folded into a checkpoint
    /// once the start has settled with no job running, so that the next
    /// start decodes one checkpoint instead of replaying those records one
    /// by one again.
    pub(crate) fn with_tail(mut self, records: u64) -> Self {
        self.start_tail = records;
        self
    }

    /// Every `checkpoint_every` records, once for a long tail at start
    /// (`with_tail`), and once settled and idle after a burst: a mass start
    /// or delete leaves up to `checkpoint_every` records that a kill would
    /// make the next start replay one by one. That tail is folded when it
    /// holds at least [`LONG_TAIL_FROM`] records and half as many as the
    /// ASW has volumes, so a checkpoint's O(volumes) is paid at most once
    /// per volumes / 2 records: O(1) a record.
    pub(super) fn maybe_checkpoint(
        &mut self,
        synced_through: u64,
        volumes: usize,
        out: &mut Vec<Effect>,
    ) {
        let n = self.cfg.checkpoint_every;
        if !self.cfg.journal || n == 0 || self.in_flight.checkpoint {
            return;
        }
        let idle = self.phase == Phase::Settled && self.pending.running() == 0;
        let tail = synced_through.saturating_sub(self.last_checkpoint_seq);
        let burst = tail >= LONG_TAIL_FROM && tail.saturating_mul(2) >= volumes as u64;
        let fold = idle && (self.start_tail > 0 || burst);
        if !fold && synced_through < self.last_checkpoint_seq + n {
            return;
        }
        self.start_tail = 0;
        self.in_flight.checkpoint = true;
        out.push(Effect::Journal(JournalWork::Checkpoint));
    }

    /// Has the World's maps repacked (`World::repack`) once settled and with no
    /// job running, when it holds at least [`REPACK_FROM`] entries and
    /// twice as many as at the last repack (or the fewest since): a start's
    /// fill (reconstruction, the listing, a mass start's mounts) leaves
    /// B-tree nodes half full, and repacking only at a doubling keeps the
    /// cost O(1) per entry added. The journal's state, filled by the same
    /// start, is repacked with it (on the journal's lane). A trim gives the
    /// old nodes back. `/readyz` waits for the World's repack (under its
    /// lock); a job started while the journal's runs waits for it at its
    /// intent. Hence the step's last, after anything that starts a job.
    pub(super) fn maybe_repack(&mut self, w: &World, now: Instant, out: &mut Vec<Effect>) {
        if self.phase != Phase::Settled || self.pending.running() != 0 {
            return;
        }
        let size = w.size();
        self.repacked_at = self.repacked_at.min(size);
        if size < REPACK_FROM || size < self.repacked_at.saturating_mul(2) {
            return;
        }
        self.repacked_at = size;
        self.trim_due(now);
        out.push(Effect::RepackWorld);
        if self.cfg.journal {
            out.push(Effect::Journal(JournalWork::Repack));
        }
    }

    /// Memory was freed (a job ended, a checkpoint was written, the start
    /// settled, a sweep ended): a trim is due, at most every [`TRIM_EVERY`].
    pub(super) fn trim_due(&mut self, now: Instant) {
        let soonest = self.timers.trim_not_before.map_or(now, |t| t.max(now));
        self.timers.trim_at.get_or_insert(soonest);
    }

    /// Trims once no job is in flight, and only when something asked
    /// (`trim_due`): a daemon that frees nothing never trims.
    pub(super) fn maybe_trim(&mut self, now: Instant, out: &mut Vec<Effect>) {
        let due = self.timers.trim_at.is_some_and(|t| now >= t);
        if !due || self.in_flight.trim || self.pending.running() != 0 {
            return;
        }
        self.timers.trim_at = None;
        self.timers.trim_not_before = Some(now + TRIM_EVERY);
        self.in_flight.trim = true;
        out.push(Effect::Host(HostWork::Trim));
    }
}

/// Deadlines; `None`: nothing due.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Timers {
    /// outcomes wait for a flush: at once when no job runs, else by this
    pub flush_by: Option<Instant>,
    /// the next orphan sweep (once settled, while no job runs)
    pub sweep_at: Option<Instant>,
    /// sweeps are rate limited: none before this
    pub sweep_not_before: Option<Instant>,
    /// memory was freed: trim at this time once no job runs
    pub trim_at: Option<Instant>,
    /// trims are rate limited: none before this
    pub trim_not_before: Option<Instant>,
    /// the next check for late mounts (while paths are watched)
    pub late_check_at: Option<Instant>,
    /// the next NodePublish of `requiresRepublish` volumes (`republish`)
    pub republish_at: Option<Instant>,
    /// a forget of targets no pod wants failed: tried again then (`unheld`)
    pub forget_retry_at: Option<Instant>,
}

/// Slow work the driver is performing for the loop.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct InFlight {
    /// a flush
    pub flush: bool,
    /// a checkpoint
    pub checkpoint: bool,
    /// an orphan sweep (no job starts meanwhile: it finishes pending
    /// deletions a TearDown would race with, and removes dirs a SetUp makes)
    pub sweep: bool,
    /// a trim
    pub trim: bool,
    /// `Forget` writes
    pub forgets: usize,
    /// a check for late mounts
    pub late_check: bool,
    /// a recovery of the unwritable journal
    pub recover: bool,
}

impl InFlight {
    pub(super) fn any(&self) -> bool {
        self.flush
            || self.checkpoint
            || self.sweep
            || self.trim
            || self.forgets > 0
            || self.late_check
            || self.recover
    }
}
