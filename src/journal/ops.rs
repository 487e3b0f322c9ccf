//! The journal's writer API, one call per thing the daemon has to say: an
//! operation announced, begun, finished or withdrawn, a volume's targets
//! forgotten, reconstruction's decisions recorded. The daemon writes records
//! only through these (`tests/tidy.rs` checks that nothing outside the
//! journal calls the raw appends).
//!
//! The write-ahead rule is a type: a plugin call needs a [`Permit`], and a
//! permit is made only from a [`DurableIntent`] ([`Journal::begin`], or
//! [`Journal::confirm`] of an [`Announced`] one) or, with the journal off,
//! by [`Permit::JournalOff`] (only the executor does, for `--journal off`;
//! `tests/tidy.rs` checks it). Every mutating `VolumePlugin` method takes
//! the permit. An [`Announced`] intent permits nothing.

use crate::model::{
    MountIdentity, MountState, Operation, SharedParams, Steps, SubpathBind, TargetRef,
    UniqueVolumeName,
};

use super::{Body, Journal, JournalError, OpResult};

/// An intent appended ahead of its operation, not known to be durable: it
/// permits nothing until [`Journal::confirm`]ed. Dropped unconfirmed, it
/// reads after a crash as an operation cut before it began.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "an announced intent is confirmed before its operation or withdrawn"]
pub struct Announced {
    op: Operation,
    seq: u64,
}

impl Announced {
    /// The operation it announces.
    pub fn op(&self) -> Operation {
        self.op
    }

    /// Its sequence number.
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

/// A durable intent: its operation may touch the OS, and its outcome is
/// written by handing it back to [`Journal::finish`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a begun operation's outcome is journaled with Journal::finish"]
pub struct DurableIntent {
    op: Operation,
    seq: u64,
}

impl DurableIntent {
    /// The operation it permits.
    pub fn op(&self) -> Operation {
        self.op
    }

    /// Its sequence number.
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

/// What a plugin call needs: a durable intent, or the journal being off.
#[derive(Debug, PartialEq, Eq)]
pub enum Permit {
    /// the intent is durable
    Journaled(DurableIntent),
    /// `--journal off`: nothing to write ahead
    JournalOff,
}

impl Permit {
    /// Whether a durable record of the call's arguments exists, so a
    /// file repeating them needs no fsync of its own.
    pub fn journaled(&self) -> bool {
        matches!(self, Permit::Journaled(_))
    }
}

/// One reconstruction decision as the journal records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    /// the target (shared: the state keeps this `Arc`)
    pub target: SharedParams,
    /// the state decided
    pub state: MountState,
    /// the merge-table row that decided it
    pub reason: String,
    /// the mount the host showed, if any
    pub observed: Option<MountIdentity>,
}

impl Journal {
    /// Appends `op`'s intent on `target` without waiting for it to be
    /// durable: the intents of many jobs then share one flush.
    pub fn announce(
        &self,
        op: Operation,
        steps: Steps,
        target: &SharedParams,
    ) -> Result<Announced, JournalError> {
        let seq = self.insert(intent(op, steps, target));
        Ok(Announced { op, seq })
    }

    /// Returns once an announced intent is durable (a flush shared with
    /// concurrent waiters, or none when one already covered it). When it
    /// cannot be made durable its operation never starts, and the journal
    /// says so (`Journal::never_started`).
    pub fn confirm(&self, announced: Announced) -> Result<DurableIntent, JournalError> {
        if let Err(e) = self.make_durable(announced.seq) {
            self.never_started(announced.op, announced.seq, &e);
            return Err(e);
        }
        Ok(DurableIntent {
            op: announced.op,
            seq: announced.seq,
        })
    }

    /// Appends `op`'s intent on `target` and returns once it is durable
    /// (refused up front while the journal cannot be written).
    pub fn begin(
        &self,
        op: Operation,
        steps: Steps,
        target: &SharedParams,
    ) -> Result<DurableIntent, JournalError> {
        self.check_open()?;
        let seq = self.insert(intent(op, steps, target));
        if let Err(e) = self.wait_durable(seq) {
            self.never_started(op, seq, &e);
            return Err(e);
        }
        Ok(DurableIntent { op, seq })
    }

    /// An intent that could not be made durable (the disk refused the
    /// flush) gets a final failure outcome, kept with it: the recovery
    /// writes both, and neither replay nor reconstruction then takes the
    /// intent for an operation cut short, since it never ran.
    fn never_started(&self, op: Operation, intent_seq: u64, e: &JournalError) {
        self.insert(Body::Outcome {
            intent_seq,
            op,
            result: OpResult::FailedFinal(format!("not started: {e}")),
            observed: None,
        });
    }

    /// Appends the outcome of a begun operation, with the mount the plugin
    /// saw when it saw one. Not waited for: the next flush (anyone's)
    /// makes it durable; one lost in a crash leaves an intent without an
    /// outcome, which reconstruction settles from the host.
    pub fn finish(
        &self,
        intent: DurableIntent,
        result: OpResult,
        observed: Option<MountIdentity>,
    ) -> Result<u64, JournalError> {
        Ok(self.insert(Body::Outcome {
            intent_seq: intent.seq,
            op: intent.op,
            result,
            observed,
        }))
    }

    /// Appends the outcome of a begun operation and, in the same batch, the
    /// intent of the operation that follows it on the same target; returns
    /// once both are durable. The two are one insert, so no flush (and no
    /// crash) can keep the outcome without the next intent: a SetUp's
    /// success is never durable while the walk after it is not announced
    /// (docs/crash-points.md). When the flush fails the next operation
    /// never starts (`never_started`), and the error says so.
    pub fn finish_then_begin(
        &self,
        intent: DurableIntent,
        observed: Option<MountIdentity>,
        next: Operation,
        steps: Steps,
        target: &SharedParams,
    ) -> Result<DurableIntent, JournalError> {
        self.check_open()?;
        let outcome = Body::Outcome {
            intent_seq: intent.seq,
            op: intent.op,
            result: OpResult::Success,
            observed,
        };
        let (_, seq) = self.insert_all(vec![outcome, self::intent(next, steps, target)]);
        if let Err(e) = self.wait_durable(seq) {
            self.never_started(next, seq, &e);
            return Err(e);
        }
        Ok(DurableIntent { op: next, seq })
    }

    /// Appends the intent of a subPath bind or unbind (`op`) of `bind` and
    /// returns once it is durable, as [`Journal::begin`] does for a
    /// target; its outcome is written with [`Journal::finish`].
    pub fn begin_subpath(
        &self,
        op: Operation,
        bind: &SubpathBind,
    ) -> Result<DurableIntent, JournalError> {
        debug_assert!(op.is_subpath_op(), "{op:?} is not a subpath operation");
        self.check_open()?;
        let seq = self.insert(Body::SubpathIntent {
            op,
            bind: bind.clone(),
        });
        if let Err(e) = self.wait_durable(seq) {
            self.never_started(op, seq, &e);
            return Err(e);
        }
        Ok(DurableIntent { op, seq })
    }

    /// Closes an announced intent whose operation never ran (`why`), with
    /// a final failure: nothing touched the OS for it.
    pub fn withdraw(&self, announced: Announced, why: String) -> Result<u64, JournalError> {
        Ok(self.insert(Body::Outcome {
            intent_seq: announced.seq,
            op: announced.op,
            result: OpResult::FailedFinal(why),
            observed: None,
        }))
    }

    /// Forgets `volume`'s `targets` (fully cleaned up) in one batch, durable
    /// on return: one flush however many targets.
    pub fn forget(
        &self,
        volume: &UniqueVolumeName,
        targets: Vec<TargetRef>,
    ) -> Result<(), JournalError> {
        let bodies = targets
            .into_iter()
            .map(|target| Body::Forget {
                volume: volume.clone(),
                target,
            })
            .collect();
        self.append_records(bodies).map(drop)
    }

    /// Forgets those of `keys` the journal still has as not mounted with
    /// nothing pending, in one batch, durable on return; returns how many.
    /// A key with an entry in any other state (an operation began on it
    /// since the caller decided) is left alone, and one gone already is
    /// not forgotten twice.
    pub fn forget_not_mounted(&self, keys: &[super::TargetKey]) -> Result<usize, JournalError> {
        let bodies: Vec<Body> = self.with_state(|state| {
            keys.iter()
                .filter(|k| {
                    state
                        .get(k)
                        .is_some_and(|e| e.reported_state() == MountState::NotMounted)
                })
                .map(|k| Body::Forget {
                    volume: k.volume.clone(),
                    target: k.target.clone(),
                })
                .collect()
        });
        let n = bodies.len();
        self.append_records(bodies).map(|_| n)
    }

    /// Records reconstruction's decisions in one batch, durable on return;
    /// an empty batch writes nothing but still fails on a journal closed
    /// for writes.
    pub fn record_reconstruction(&self, decided: Vec<Decided>) -> Result<Vec<u64>, JournalError> {
        self.append_records(decided.into_iter().map(Body::from).collect())
    }

    /// Records the pod-dir walk's decisions, each only while the journal
    /// still has no entry for its target. The walk decided targets the
    /// journal lacked; one that has an entry now was taken by an operation
    /// since, and is that operation's. The look and the append are one
    /// step under the writer's lock; durable on return. Answers the
    /// sequence numbers appended and the keys left out.
    pub fn record_unknown(
        &self,
        decided: Vec<(super::TargetKey, Decided)>,
    ) -> Result<(Vec<u64>, Vec<super::TargetKey>), JournalError> {
        self.check_open()?;
        let mut taken = Vec::new();
        let mut count = 0;
        let (first, last) = self.insert_where(|state| {
            let bodies: Vec<Body> = decided
                .into_iter()
                .filter_map(|(key, d)| {
                    if state.get(&key).is_some() {
                        taken.push(key);
                        return None;
                    }
                    Some(Body::from(d))
                })
                .collect();
            count = bodies.len();
            bodies
        });
        if count == 0 {
            return Ok((Vec::new(), taken));
        }
        self.wait_durable(last)?;
        Ok(((first..=last).collect(), taken))
    }
}

impl From<Decided> for Body {
    fn from(d: Decided) -> Self {
        Body::Reconstructed {
            target: d.target,
            state: d.state,
            reason: d.reason,
            observed: d.observed,
        }
    }
}

fn intent(op: Operation, steps: Steps, target: &SharedParams) -> Body {
    Body::Intent {
        op,
        steps,
        target: target.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::JournalConfig;
    use crate::model::{PluginName, TargetKind, TargetParams};

    const BOOT: &str = "boot-1";

    fn params(volume: &str) -> SharedParams {
        SharedParams::new(TargetParams::at(
            UniqueVolumeName::from_raw(volume),
            PluginName::EmptyDir,
            "cache".into(),
            TargetRef::Device,
            TargetKind::Dir,
            None,
        ))
    }

    fn open() -> (tempfile::TempDir, Journal) {
        let tmp = tempfile::tempdir().unwrap();
        let (j, _) = Journal::open(&JournalConfig::new(tmp.path().join("j"), "n", BOOT)).unwrap();
        (tmp, j)
    }

    #[test]
    fn an_announced_intent_is_durable_only_once_confirmed() {
        let (_t, j) = open();
        let a = j
            .announce(Operation::SetUp, Steps::Single, &params("v"))
            .unwrap();
        assert!(j.synced_through() < a.seq(), "announcing does not flush");
        let seq = a.seq();
        let d = j.confirm(a).unwrap();
        assert_eq!(d.seq(), seq);
        assert!(j.synced_through() >= seq, "confirmed means durable");
    }

    #[test]
    fn begin_is_durable_and_finish_completes_the_pending_intent() {
        let (_t, j) = open();
        let d = j
            .begin(Operation::TearDown, Steps::Single, &params("v"))
            .unwrap();
        assert!(j.synced_through() >= d.seq());
        let key = crate::journal::TargetKey {
            volume: UniqueVolumeName::from_raw("v"),
            target: TargetRef::Device,
        };
        assert!(j.with_state(|s| s.get(&key).unwrap().pending.is_some()));
        j.finish(d, OpResult::Success, None).unwrap();
        j.with_state(|s| {
            let e = s.get(&key).unwrap();
            assert!(e.pending.is_none(), "the outcome closes the intent");
            assert_eq!(e.reported_state(), MountState::NotMounted);
        });
    }

    #[test]
    fn withdraw_says_the_operation_never_ran() {
        let (_t, j) = open();
        let a = j
            .announce(Operation::SetUp, Steps::Single, &params("v"))
            .unwrap();
        let seq = a.seq();
        let out = j.withdraw(a, "not started: stopping".into()).unwrap();
        j.flush_pending().unwrap();
        let tail = j.current("n").unwrap().tail;
        let rec = tail.iter().find(|r| r.seq == out).unwrap();
        assert!(matches!(
            &rec.body,
            Body::Outcome { intent_seq, result: OpResult::FailedFinal(why), .. }
                if *intent_seq == seq && why.contains("stopping")
        ));
    }

    #[test]
    fn forgetting_many_targets_costs_one_flush() {
        let (_t, j) = open();
        let v = UniqueVolumeName::from_raw("v");
        let pods: Vec<TargetRef> = (0..5)
            .map(|i| TargetRef::Pod(crate::model::PodUid::new(format!("p{i}")).unwrap()))
            .collect();
        let before = j.flush_count();
        j.forget(&v, pods).unwrap();
        assert_eq!(j.flush_count(), before + 1);
        let forgets = j
            .current("n")
            .unwrap()
            .tail
            .iter()
            .filter(|r| matches!(r.body, Body::Forget { .. }))
            .count();
        assert_eq!(forgets, 5);
    }

    /// The walk's decisions are appended only for targets still unknown
    /// at the append: one an operation announced since is left to it, and
    /// named; a batch with none left writes nothing.
    #[test]
    fn the_walk_records_only_targets_the_journal_still_lacks() {
        let (_t, j) = open();
        let key = |p: &SharedParams| crate::journal::TargetKey {
            volume: p.volume.clone(),
            target: p.target.clone(),
        };
        let decided = |p: &SharedParams| {
            (
                key(p),
                Decided {
                    target: p.clone(),
                    state: MountState::Uncertain,
                    reason: "walk".into(),
                    observed: None,
                },
            )
        };
        let (a, b) = (params("a"), params("b"));
        let _intent = j.announce(Operation::SetUp, Steps::Single, &a).unwrap();
        let (seqs, taken) = j.record_unknown(vec![decided(&a), decided(&b)]).unwrap();
        assert_eq!(taken, [key(&a)], "the operation's");
        assert_eq!(seqs.len(), 1);
        let state = j.state();
        assert!(state.get(&key(&a)).is_some_and(|e| e.pending.is_some()));
        let got = state.get(&key(&b)).map(|e| (e.state, e.pending.is_none()));
        assert_eq!(got, Some((MountState::Uncertain, true)), "recorded");

        let flushes = j.flush_count();
        let (seqs, taken) = j.record_unknown(vec![decided(&b)]).unwrap();
        assert!(seqs.is_empty());
        assert_eq!(taken, [key(&b)]);
        assert_eq!(j.flush_count(), flushes, "nothing written");
    }
}
