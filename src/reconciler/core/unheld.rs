//! Journal targets the ASW does not hold, forgotten once no pod wants them.
//!
//! The ASW holds live targets only. A target the journal has as not
//! mounted while the ASW lacks it is forgotten by no plan: no TearDown
//! runs for it, and a volume's `Forget` reaches it only if the volume was
//! in the ASW. Such targets come from:
//!
//! - reconstruction: a target decided not mounted (gone after a reboot,
//!   unmounted outside volumed, a leftover dir) is no ASW entry
//!   (`reconstruct/apply.rs`). A pod deleted while volumed was down left
//!   them in the journal for good (`dump` kept them, `/debug/state` did
//!   not; the nemesis soak's second finding, `tests/soak.rs`). The
//!   walk's are candidates even when the loop sets them aside as stale:
//!   the walk journaled them already (the third finding, on the slow
//!   journal disk);
//! - a mount that failed, final: its intent made the journal entry, the
//!   failure left it not mounted, and the ASW never held it. Its pod
//!   deleted later left it for good (`tests/daemon_e2e.rs` shows it with a
//!   refused tmpfs).
//!
//! So the loop forgets such a target, in one batch, when its pod stops
//! wanting it: reconstruction's not-mounted targets once settled (every
//! source listed, the walk reported; O(those targets), once), and a
//! removed pod's targets (and its volumes' device targets) when the pod
//! goes, O(its volumes). It forgets a pod target whose pod does not want
//! its volume and that the ASW lacks, whoever else holds the volume, and a
//! device target whose volume neither state has. A candidate whose
//! operation is running waits for it (`deferred`, looked at again when an
//! operation on its volume ends): a mount that succeeds brings it into
//! the ASW, one that fails leaves it to this rule. A failed mount's
//! backoff does not hold the forget back (its pod is gone: nothing will
//! retry it). The key stays busy until the forget is durable, and the
//! journal forgets only what it still has as not mounted with nothing
//! pending (`Journal::forget_not_mounted`). A forget whose write failed
//! is tried again a little later, on what is still a candidate then.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::journal::TargetKey;
use crate::model::{PodUid, TargetRef, UniqueVolumeName};
use crate::reconciler::pending::OpKey;
use crate::state::{ActualStateOfWorld, DesiredStateOfWorld};

use super::{Core, Effect, JournalWork, Phase, World};

/// What to do with candidates: the targets to forget now with the keys to
/// hold busy meanwhile (a volume-wide key stands for the pod keys of its
/// volume), and those to look at again once their operation ends.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct ToForget {
    /// the targets, in the order given
    pub targets: Vec<TargetKey>,
    /// their operation keys, sorted
    pub keys: Vec<OpKey>,
    /// not held, but an operation on them runs: in the order given
    pub deferred: Vec<TargetKey>,
}

/// The key an operation on `key`'s target takes.
fn op_key(key: &TargetKey) -> OpKey {
    match &key.target {
        TargetRef::Device => OpKey::volume(&key.volume),
        TargetRef::Pod(pod) => OpKey::pod(&key.volume, pod),
    }
}

/// Which of `candidates` to forget now (see the module doc): those no pod
/// wants and the ASW does not hold; of those, the ones with an operation
/// `running` are deferred.
pub(crate) fn to_forget(
    candidates: Vec<TargetKey>,
    dsw: &DesiredStateOfWorld,
    asw: &ActualStateOfWorld,
    running: &dyn Fn(&OpKey) -> bool,
) -> ToForget {
    let mut out = ToForget::default();
    for k in candidates {
        let held = match &k.target {
            TargetRef::Pod(pod) => {
                dsw.volume(&k.volume)
                    .is_some_and(|v| v.pods.contains_key(pod))
                    || asw.pod(&k.volume, pod).is_some()
            }
            TargetRef::Device => dsw.volume(&k.volume).is_some() || asw.volume(&k.volume).is_some(),
        };
        match (held, running(&op_key(&k))) {
            (true, _) => {}
            (false, true) => out.deferred.push(k),
            (false, false) => out.targets.push(k),
        }
    }
    let all: BTreeSet<OpKey> = out.targets.iter().map(op_key).collect();
    out.keys = all
        .iter()
        .filter(|k| k.pod.is_none() || !all.contains(&OpKey::volume(&k.volume)))
        .cloned()
        .collect();
    out
}

/// A pod's targets of `volumes` and those volumes' device targets: what
/// the journal may hold of them that the ASW lacks, once the pod is gone.
pub(crate) fn targets_of(pod: &PodUid, volumes: &[UniqueVolumeName]) -> Vec<TargetKey> {
    let mut out = Vec::with_capacity(2 * volumes.len());
    for v in volumes {
        out.push(TargetKey {
            volume: v.clone(),
            target: TargetRef::Pod(pod.clone()),
        });
        out.push(TargetKey {
            volume: v.clone(),
            target: TargetRef::Device,
        });
    }
    out
}

/// How long after a failed forget its targets are tried again.
pub(crate) const FORGET_RETRY: Duration = Duration::from_secs(5);

/// Candidates that waited for an operation on their volume.
pub(crate) type Deferred = BTreeMap<UniqueVolumeName, Vec<TargetKey>>;

impl Core {
    /// Takes note of a reconstruction phase's not-mounted targets (with the
    /// journal on: without it there is nothing to forget).
    pub(super) fn note_not_mounted(&mut self, keys: impl IntoIterator<Item = TargetKey>) {
        if self.cfg.journal {
            self.not_mounted.extend(keys);
        }
    }

    /// Once settled: forgets reconstruction's not-mounted targets no pod
    /// wants (see the module doc), once, and those of a failed forget
    /// once its retry is due.
    pub(super) fn forget_not_mounted(&mut self, w: &World, now: Instant, out: &mut Vec<Effect>) {
        if self.phase != Phase::Settled || self.not_mounted.is_empty() {
            return;
        }
        if self.timers.forget_retry_at.is_some_and(|at| now < at) {
            return;
        }
        self.timers.forget_retry_at = None;
        let noted = std::mem::take(&mut self.not_mounted);
        self.forget_unheld(w, noted, out);
    }

    /// A forget's write failed: its targets are candidates again, looked
    /// at after [`FORGET_RETRY`] (a pod may want one by then). A journal
    /// that cannot be written holds them until it recovers, as it holds
    /// every start.
    pub(super) fn forget_failed(&mut self, targets: Vec<TargetKey>, now: Instant) {
        self.not_mounted.extend(targets);
        self.timers.forget_retry_at = Some(now + FORGET_RETRY);
    }

    /// The candidates deferred for `volume`, looked at again (an operation
    /// on it ended).
    pub(super) fn forget_deferred(
        &mut self,
        w: &World,
        volume: &UniqueVolumeName,
        out: &mut Vec<Effect>,
    ) {
        if let Some(keys) = self.deferred.remove(volume) {
            self.forget_unheld(w, keys, out);
        }
    }

    /// Forgets those of `candidates` no pod wants and the ASW lacks, in one
    /// batch; defers those whose operation runs (journal on only).
    pub(super) fn forget_unheld(
        &mut self,
        w: &World,
        candidates: Vec<TargetKey>,
        out: &mut Vec<Effect>,
    ) {
        // before the ASW there is nothing to compare with (reconstruction
        // notes what it leaves out); stopping, nothing new starts (the next
        // start's reconstruction finds them not mounted)
        let idle = matches!(self.phase, Phase::Reconstructing | Phase::Stopping);
        if !self.cfg.journal || candidates.is_empty() || idle || self.unwritable.is_some() {
            return;
        }
        let forget = {
            let pending = &self.pending;
            to_forget(candidates, &w.dsw, &w.asw, &|k| pending.runs_against(k))
        };
        for k in forget.deferred {
            self.deferred.entry(k.volume.clone()).or_default().push(k);
        }
        if forget.targets.is_empty() {
            return;
        }
        for k in &forget.keys {
            // nothing runs against it (checked above), none of them
            // conflict; a failed mount's backoff is over (its pod is gone)
            self.pending.take_over(k);
        }
        tracing::debug!(
            targets = forget.targets.len(),
            "journal targets no pod wants and the ASW lacks: forgetting them"
        );
        self.in_flight.forgets += 1;
        out.push(Effect::Journal(JournalWork::ForgetNotMounted {
            targets: forget.targets,
            keys: forget.keys,
        }));
    }
}
