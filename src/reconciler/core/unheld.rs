//! Reconstruction's not-mounted targets, forgotten once no pod wants them.
//!
//! Reconstruction fills the ASW with live targets only
//! (`reconstruct/apply.rs`): a target it decides not mounted (gone after a
//! reboot, unmounted outside volumed, a leftover dir) is no ASW entry, so
//! no plan ever tears it down or forgets it. While a pod wants it, its
//! mount brings it into the ASW and the normal lifecycle forgets it later.
//! Otherwise nothing would: a pod deleted while volumed was down left its
//! targets in the journal for good (`dump` kept them, `/debug/state` did
//! not; found by the nemesis soak, `tests/soak.rs`).
//!
//! So, once every source has listed and the pod-dir walk has reported
//! ([`Phase::Settled`]), each such target that neither the DSW nor the ASW
//! holds is forgotten, once, in one batch: O(those targets). A pod target
//! goes when its pod does not want its volume, whoever else holds the
//! volume; a device target when its volume is in neither state (a volume
//! the ASW holds forgets its not-mounted targets when it leaves, through
//! the plan's `Forget`). A target with an operation pending or backing off
//! is left to that operation. Its key stays busy until the forget is
//! durable, and the journal forgets only what it still has as not mounted
//! with nothing pending (`Journal::forget_not_mounted`).

use std::collections::BTreeSet;
use std::time::Instant;

use crate::journal::TargetKey;
use crate::model::TargetRef;
use crate::reconciler::pending::OpKey;
use crate::state::{ActualStateOfWorld, DesiredStateOfWorld};

use super::{Core, Effect, JournalWork, Phase, World};

/// What to forget of reconstruction's not-mounted targets: the targets,
/// and the keys to hold busy meanwhile (a volume-wide key stands for the
/// pod keys of its volume).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct ToForget {
    /// the targets, in the order given
    pub targets: Vec<TargetKey>,
    /// their operation keys, sorted
    pub keys: Vec<OpKey>,
}

/// The key an operation on `key`'s target takes.
fn op_key(key: &TargetKey) -> OpKey {
    match &key.target {
        TargetRef::Device => OpKey::volume(&key.volume),
        TargetRef::Pod(pod) => OpKey::pod(&key.volume, pod),
    }
}

/// Which of `not_mounted` to forget now (see the module doc): those no
/// pod wants and the ASW does not hold, with no operation `busy` on them.
pub(crate) fn to_forget(
    not_mounted: Vec<TargetKey>,
    dsw: &DesiredStateOfWorld,
    asw: &ActualStateOfWorld,
    busy: &dyn Fn(&OpKey) -> bool,
) -> ToForget {
    let targets: Vec<TargetKey> = not_mounted
        .into_iter()
        .filter(|k| {
            let held = match &k.target {
                TargetRef::Pod(pod) => {
                    dsw.volume(&k.volume)
                        .is_some_and(|v| v.pods.contains_key(pod))
                        || asw.pod(&k.volume, pod).is_some()
                }
                TargetRef::Device => {
                    dsw.volume(&k.volume).is_some() || asw.volume(&k.volume).is_some()
                }
            };
            !held && !busy(&op_key(k))
        })
        .collect();
    let all: BTreeSet<OpKey> = targets.iter().map(op_key).collect();
    let keys = all
        .iter()
        .filter(|k| k.pod.is_none() || !all.contains(&OpKey::volume(&k.volume)))
        .cloned()
        .collect();
    ToForget { targets, keys }
}

impl Core {
    /// Takes note of a reconstruction phase's not-mounted targets (with the
    /// journal on: without it there is nothing to forget).
    pub(super) fn note_not_mounted(&mut self, keys: impl IntoIterator<Item = TargetKey>) {
        if self.cfg.journal {
            self.not_mounted.extend(keys);
        }
    }

    /// Once settled: forgets those no pod wants (see the module doc), once.
    pub(super) fn forget_not_mounted(&mut self, w: &World, now: Instant, out: &mut Vec<Effect>) {
        if self.phase != Phase::Settled || self.not_mounted.is_empty() {
            return;
        }
        let noted = std::mem::take(&mut self.not_mounted);
        let forget = {
            let pending = &self.pending;
            to_forget(noted, &w.dsw, &w.asw, &|k| pending.busy(k, now))
        };
        if forget.targets.is_empty() {
            return;
        }
        for k in &forget.keys {
            // not busy (checked above), and no two of them conflict
            self.pending.start(k, now);
        }
        tracing::info!(
            targets = forget.targets.len(),
            "reconstruction's not-mounted targets no pod wants: forgetting them"
        );
        self.in_flight.forgets += 1;
        out.push(Effect::Journal(JournalWork::ForgetNotMounted {
            targets: forget.targets,
            keys: forget.keys,
        }));
    }
}
