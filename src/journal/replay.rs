//! Replay: the state the journal's records imply, built one record at a
//! time by [`JournalState::apply`] — the only code that gives records their
//! meaning. The writer applies each record as it appends it, `open` applies
//! checkpoint + tail, `dump` applies what it reads; all three agree because
//! they share this function.
//!
//! Per target (a volume's device target or one pod's target) the state keeps
//! the last settled state with its parameters, and the pending intent, if an
//! operation started and has no outcome yet. Rules:
//!
//! | record | effect |
//! | --- | --- |
//! | intent | pending = the intent (a pending intent already there is superseded: state uncertain, an anomaly) |
//! | outcome success | state = the operation's result (formatting leaves it), params = the intent's |
//! | outcome final failure | the state before the operation holds |
//! | outcome uncertain failure | state = uncertain |
//! | reconstructed | state, params and observation as decided |
//! | forget | the target is no longer tracked |
//!
//! SubPath binds are kept beside the targets, one entry per bind
//! ([`SubpathKey`]), by the same intent and outcome rules: a bind's
//! success makes it mounted, an unbind's success drops it, a final failure
//! leaves the state before (a bind never mounted is dropped then), an
//! uncertain one makes it uncertain.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::model::{
    MountIdentity, MountState, Operation, PodUid, SharedParams, SharedStr, Steps, SubpathBind,
    SubpathKey, TargetParams, TargetRef, UniqueVolumeName,
};

/// A record with model types (decoded from `record::RecordV2`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// sequence number
    pub seq: u64,
    /// wall time, ns since the Unix epoch
    pub wall_time_ns: u64,
    /// boot id when written
    pub boot_id: String,
    /// what happened
    pub body: Body,
}

/// What a record says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// An operation is about to touch the OS.
    Intent {
        /// the operation
        op: Operation,
        /// one syscall or several steps
        steps: Steps,
        /// the target and everything needed to redo or undo the operation
        /// (shared: the journal's state keeps this very `Arc` for the
        /// target, so the job that wrote it and the state hold one copy)
        target: SharedParams,
    },
    /// An operation finished.
    Outcome {
        /// the intent it completes
        intent_seq: u64,
        /// the operation
        op: Operation,
        /// how it ended
        result: OpResult,
        /// the mount observed after success, if any
        observed: Option<MountIdentity>,
    },
    /// Reconstruction decided a target's state.
    Reconstructed {
        /// the target (shared, as an intent's: the state keeps this `Arc`)
        target: SharedParams,
        /// the decision
        state: MountState,
        /// the merge-table row that decided it
        reason: String,
        /// the mount the host showed, if any
        observed: Option<MountIdentity>,
    },
    /// A target is fully cleaned up.
    Forget {
        /// the volume
        volume: UniqueVolumeName,
        /// which target
        target: TargetRef,
    },
    /// A subPath bind or unbind is about to touch the OS (its outcome is
    /// an [`Body::Outcome`] naming this record).
    SubpathIntent {
        /// [`Operation::BindSubpath`] or [`Operation::UnbindSubpath`]
        op: Operation,
        /// the bind
        bind: SubpathBind,
    },
}

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResult {
    /// completed
    Success,
    /// failed without changing the target
    FailedFinal(String),
    /// failed and may have changed the target
    FailedUncertain(String),
}

/// Identifies one target.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TargetKey {
    /// the volume
    pub volume: UniqueVolumeName,
    /// device or pod
    pub target: TargetRef,
}

impl TargetKey {
    /// The key of a target's parameters.
    pub fn of(p: &TargetParams) -> Self {
        Self {
            volume: p.volume.clone(),
            target: p.target.clone(),
        }
    }
}

/// An operation started and not finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// the operation
    pub op: Operation,
    /// its intent's sequence number
    pub intent_seq: u64,
    /// one syscall or several
    pub steps: Steps,
    /// the parameters it was started with (shared with the entry while the
    /// entry has no settled parameters of its own)
    pub params: SharedParams,
}

/// What the journal knows of one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// parameters of the last settled state (shared: reconstruction's
    /// decision for the target holds the same)
    pub params: SharedParams,
    /// last settled state
    pub state: MountState,
    /// operation in flight, if any (boxed: most entries have none, and an
    /// inline `Pending` would make every entry of the map twice as large)
    pub pending: Option<Box<Pending>>,
    /// mount identity observed when it was last mounted (boxed: most
    /// entries have none)
    pub observed: Option<Box<MountIdentity>>,
    /// sequence number of the last record about this target
    pub last_seq: u64,
    /// boot id of that record (shared: a journal's entries hold a handful
    /// of distinct boot ids; a thin `Arc` of a `String`, 8 bytes where an
    /// `Arc<str>` is 16)
    pub boot_id: Arc<String>,
    /// reason of the last reconstruction decision, if any (a `SharedStr`,
    /// 8 bytes, where a `String` made every entry a malloc size class
    /// larger)
    pub reason: Option<SharedStr>,
}

impl Entry {
    /// The state `dump` reports: a pending operation makes a target uncertain.
    pub fn reported_state(&self) -> MountState {
        if self.pending.is_some() {
            MountState::Uncertain
        } else {
            self.state
        }
    }
    /// The parameters to report: the pending operation's when one runs.
    pub fn current_params(&self) -> &SharedParams {
        self.pending.as_ref().map_or(&self.params, |p| &p.params)
    }
}

/// What the journal knows of one subPath bind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubpathEntry {
    /// the bind, as its last settled operation named it
    pub bind: SubpathBind,
    /// last settled state
    pub state: MountState,
    /// a bind or unbind begun and not finished, with its intent's sequence
    /// number and the bind it named
    pub pending: Option<(Operation, u64, SubpathBind)>,
    /// sequence number of the last record about this bind
    pub last_seq: u64,
}

impl SubpathEntry {
    /// The state `dump` reports: a pending operation makes it uncertain.
    pub fn reported_state(&self) -> MountState {
        match self.pending {
            Some(_) => MountState::Uncertain,
            None => self.state,
        }
    }
}

/// Something in the records that should not happen; replay goes on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Anomaly {
    /// the record
    pub seq: u64,
    /// what was wrong
    pub what: String,
}

/// The state all records so far imply. Equality compares the state, not the
/// anomalies met while building it (a checkpoint does not carry those).
#[derive(Debug, Clone, Default)]
pub struct JournalState {
    /// Boxed: an empty slot of a B-tree node (eleven per node, some empty
    /// until a repack) then costs a pointer, not an entry. One per target.
    entries: BTreeMap<TargetKey, Box<Entry>>,
    pending_by_seq: BTreeMap<u64, TargetKey>,
    last_seq: u64,
    anomalies: Vec<Anomaly>,
    /// the boot id entries last got, shared by the next ones with the same
    boot: Option<Arc<String>>,
    /// subPath binds, by key (few: only containers with a subPath have any)
    subpaths: BTreeMap<SubpathKey, SubpathEntry>,
    /// pending subPath intents, by sequence number
    subpath_pending: BTreeMap<u64, SubpathKey>,
}

impl PartialEq for JournalState {
    fn eq(&self, other: &Self) -> bool {
        self.entries == other.entries
            && self.pending_by_seq == other.pending_by_seq
            && self.last_seq == other.last_seq
            && self.subpaths == other.subpaths
    }
}

impl Eq for JournalState {}

impl JournalState {
    /// Rebuilds a state from checkpointed entries.
    pub fn from_entries(last_seq: u64, entries: impl IntoIterator<Item = Entry>) -> Self {
        let mut s = JournalState {
            last_seq,
            ..Self::default()
        };
        let mut pending_by_seq = BTreeMap::new();
        // built at once (full B-tree nodes; a checkpoint's entries come in
        // key order, and inserting them one by one left leaves half empty);
        // a key met twice keeps its last entry, as inserts would
        let entries: BTreeMap<TargetKey, Box<Entry>> = entries
            .into_iter()
            .map(|mut e| {
                e.boot_id = s.share_boot(e.boot_id);
                let key = TargetKey::of(&e.params);
                if let Some(p) = &e.pending {
                    pending_by_seq.insert(p.intent_seq, key.clone());
                }
                (key, Box::new(e))
            })
            .collect();
        s.entries = entries;
        s.pending_by_seq = pending_by_seq;
        s
    }

    /// The same state with these subPath binds (a checkpoint's).
    pub fn with_subpaths(mut self, binds: impl IntoIterator<Item = SubpathEntry>) -> Self {
        for e in binds {
            if let Some((_, seq, _)) = &e.pending {
                self.subpath_pending.insert(*seq, e.bind.key.clone());
            }
            self.subpaths.insert(e.bind.key.clone(), e);
        }
        self
    }

    /// Every subPath bind the journal knows, in key order.
    pub fn subpaths(&self) -> impl Iterator<Item = &SubpathEntry> {
        self.subpaths.values()
    }

    /// The subPath binds of pod volume `name` of pod `pod`.
    pub fn subpaths_of<'a>(
        &'a self,
        pod: &'a PodUid,
        name: &'a str,
    ) -> impl Iterator<Item = &'a SubpathEntry> + 'a {
        let from = SubpathKey {
            pod: pod.clone(),
            name: name.to_owned(),
            container: String::new(),
            index: 0,
        };
        self.subpaths
            .range(from..)
            .take_while(move |(k, _)| k.pod == *pod && k.name == name)
            .map(|(_, e)| e)
    }

    /// Every subPath bind of pod `pod`.
    pub fn subpaths_of_pod<'a>(
        &'a self,
        pod: &'a PodUid,
    ) -> impl Iterator<Item = &'a SubpathEntry> + 'a {
        let from = SubpathKey {
            pod: pod.clone(),
            name: String::new(),
            container: String::new(),
            index: 0,
        };
        self.subpaths
            .range(from..)
            .take_while(move |(k, _)| k.pod == *pod)
            .map(|(_, e)| e)
    }

    /// Every tracked target, in key order (volume, then device before pods).
    pub fn entries(&self) -> impl Iterator<Item = (&TargetKey, &Entry)> {
        self.entries.iter().map(|(k, e)| (k, &**e))
    }

    /// One target.
    pub fn get(&self, key: &TargetKey) -> Option<&Entry> {
        self.entries.get(key).map(|e| &**e)
    }

    /// Rebuilds the map of entries from its own entries, which fills its
    /// nodes (`util::repack` says why; the daemon repacks its maps and
    /// this one together, at each doubling of the node).
    pub fn repack(&mut self) {
        crate::util::repack::repack(&mut self.entries);
    }

    /// Number of tracked targets.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is tracked.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The highest sequence number applied.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Anomalies met while applying.
    pub fn anomalies(&self) -> &[Anomaly] {
        &self.anomalies
    }

    /// Applies one record.
    pub fn apply(&mut self, rec: &Record) {
        self.last_seq = self.last_seq.max(rec.seq);
        match &rec.body {
            Body::Intent { op, steps, target } => self.apply_intent(rec, *op, *steps, target),
            Body::Outcome {
                intent_seq,
                op,
                result,
                observed,
            } => self.apply_outcome(rec, *intent_seq, *op, result, observed),
            Body::Reconstructed {
                target,
                state,
                reason,
                observed,
            } => {
                let key = TargetKey::of(target);
                if let Some(old) = self.entries.get(&key).and_then(|e| e.pending.as_ref()) {
                    self.pending_by_seq.remove(&old.intent_seq);
                }
                let boot_id = self.intern_boot(&rec.boot_id);
                self.entries.insert(
                    key,
                    Box::new(Entry {
                        params: target.clone(),
                        state: *state,
                        pending: None,
                        observed: observed.clone().map(Box::new),
                        last_seq: rec.seq,
                        boot_id,
                        reason: Some(reason.as_str().into()),
                    }),
                );
            }
            Body::Forget { volume, target } => {
                let key = TargetKey {
                    volume: volume.clone(),
                    target: target.clone(),
                };
                match self.entries.remove(&key) {
                    Some(e) => {
                        if let Some(p) = e.pending {
                            self.pending_by_seq.remove(&p.intent_seq);
                        }
                    }
                    None => self.anomaly(rec.seq, "forget of a target that is not tracked"),
                }
            }
            Body::SubpathIntent { op, bind } => self.apply_subpath_intent(rec.seq, *op, bind),
        }
    }

    fn apply_subpath_intent(&mut self, seq: u64, op: Operation, bind: &SubpathBind) {
        let entry = self
            .subpaths
            .entry(bind.key.clone())
            .or_insert_with(|| SubpathEntry {
                bind: bind.clone(),
                state: MountState::NotMounted,
                pending: None,
                last_seq: seq,
            });
        let superseded = entry.pending.take().map(|(_, old, _)| old);
        if superseded.is_some() {
            entry.state = MountState::Uncertain;
        }
        entry.pending = Some((op, seq, bind.clone()));
        entry.last_seq = seq;
        if let Some(old) = superseded {
            self.subpath_pending.remove(&old);
            self.anomaly(
                seq,
                format!("subpath intent supersedes intent {old} that had no outcome"),
            );
        }
        self.subpath_pending.insert(seq, bind.key.clone());
    }

    /// The outcome of a subPath intent; `false` when `intent_seq` is not
    /// one.
    fn apply_subpath_outcome(&mut self, seq: u64, intent_seq: u64, result: &OpResult) -> bool {
        let Some(key) = self.subpath_pending.remove(&intent_seq) else {
            return false;
        };
        let Some(entry) = self.subpaths.get_mut(&key) else {
            return true;
        };
        let Some((op, _, bind)) = entry.pending.take() else {
            return true;
        };
        entry.last_seq = seq;
        match (result, op) {
            (OpResult::Success, Operation::UnbindSubpath) => {
                self.subpaths.remove(&key);
            }
            (OpResult::Success, _) => {
                entry.state = MountState::Mounted;
                entry.bind = bind;
            }
            // the state before holds; a bind that was never mounted is
            // not worth keeping (a refused subpath leaves nothing)
            (OpResult::FailedFinal(_), _) => {
                if entry.state == MountState::NotMounted {
                    self.subpaths.remove(&key);
                }
            }
            (OpResult::FailedUncertain(_), _) => {
                entry.state = MountState::Uncertain;
                entry.bind = bind;
            }
        }
        true
    }

    /// `boot_id` as the `Arc` the entries before it share when equal, else
    /// as it is, remembered for the next ones (a checkpoint's decode hands
    /// one `Arc` to all its entries of a boot).
    fn share_boot(&mut self, boot_id: Arc<String>) -> Arc<String> {
        match &self.boot {
            Some(b) if *b == boot_id => b.clone(),
            _ => {
                self.boot = Some(boot_id.clone());
                boot_id
            }
        }
    }

    /// [`JournalState::share_boot`] for a record's boot id: allocated only
    /// when it differs from the last one.
    fn intern_boot(&mut self, boot_id: &str) -> Arc<String> {
        match &self.boot {
            Some(b) if **b == *boot_id => b.clone(),
            _ => self.share_boot(Arc::new(boot_id.to_owned())),
        }
    }

    fn anomaly(&mut self, seq: u64, what: impl Into<String>) {
        self.anomalies.push(Anomaly {
            seq,
            what: what.into(),
        });
    }

    fn apply_intent(&mut self, rec: &Record, op: Operation, steps: Steps, target: &SharedParams) {
        let key = TargetKey::of(target);
        let params = target.clone();
        let pending = Box::new(Pending {
            op,
            intent_seq: rec.seq,
            steps,
            params: params.clone(),
        });
        let mut superseded = None;
        let boot_id = self.intern_boot(&rec.boot_id);
        let entry = self.entries.entry(key.clone()).or_insert_with(|| {
            Box::new(Entry {
                params,
                state: MountState::NotMounted,
                pending: None,
                observed: None,
                last_seq: rec.seq,
                boot_id: boot_id.clone(),
                reason: None,
            })
        });
        if let Some(old) = entry.pending.take() {
            entry.state = MountState::Uncertain;
            superseded = Some(old.intent_seq);
        }
        entry.pending = Some(pending);
        entry.last_seq = rec.seq;
        entry.boot_id = boot_id;
        if let Some(old) = superseded {
            self.pending_by_seq.remove(&old);
            self.anomaly(
                rec.seq,
                format!("intent supersedes intent {old} that had no outcome"),
            );
        }
        self.pending_by_seq.insert(rec.seq, key);
    }

    fn apply_outcome(
        &mut self,
        rec: &Record,
        intent_seq: u64,
        op: Operation,
        result: &OpResult,
        observed: &Option<MountIdentity>,
    ) {
        if op.is_subpath_op() && self.apply_subpath_outcome(rec.seq, intent_seq, result) {
            return;
        }
        let boot_id = self.intern_boot(&rec.boot_id);
        let Some(key) = self.pending_by_seq.remove(&intent_seq) else {
            self.anomaly(
                rec.seq,
                format!("outcome for intent {intent_seq}, which is not pending"),
            );
            return;
        };
        let Some(entry) = self.entries.get_mut(&key) else {
            return;
        };
        let Some(pending) = entry.pending.take() else {
            return;
        };
        entry.last_seq = rec.seq;
        entry.boot_id = boot_id;
        entry.reason = None;
        match result {
            OpResult::Success => {
                if let Some(state) = op.success_state() {
                    entry.state = state;
                    entry.observed = match state {
                        MountState::Mounted => observed.clone().map(Box::new),
                        _ => None,
                    };
                }
                entry.params = pending.params;
            }
            OpResult::FailedFinal(_) => {}
            OpResult::FailedUncertain(_) => {
                entry.state = MountState::Uncertain;
                entry.params = pending.params;
                entry.observed = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{PluginName, PodUid, TargetKind};

    fn params(target: TargetRef) -> TargetParams {
        TargetParams::at(
            UniqueVolumeName::from_raw("kubernetes.io/local-volume/pv1"),
            PluginName::LocalVolume,
            "pv1".into(),
            target,
            TargetKind::Mount,
            None,
        )
        .with_device_path(Some("/dev/loop3".into()))
        .with_device_mount_path(Some(
            "/r/plugins/kubernetes.io/local-volume/mounts/pv1".into(),
        ))
        .with_fs_type(Some("ext4".into()))
    }

    fn rec(seq: u64, body: Body) -> Record {
        Record {
            seq,
            wall_time_ns: seq,
            boot_id: "b".into(),
            body,
        }
    }

    fn intent(seq: u64, op: Operation, steps: Steps) -> Record {
        rec(
            seq,
            Body::Intent {
                op,
                steps,
                target: params(TargetRef::Device).into(),
            },
        )
    }

    fn outcome(seq: u64, intent_seq: u64, op: Operation, result: OpResult) -> Record {
        rec(
            seq,
            Body::Outcome {
                intent_seq,
                op,
                result,
                observed: None,
            },
        )
    }

    fn device_state(records: &[Record]) -> (MountState, Option<Operation>) {
        let mut s = JournalState::default();
        for r in records {
            s.apply(r);
        }
        let key = TargetKey::of(&params(TargetRef::Device));
        let e = s.get(&key).expect("tracked");
        (e.state, e.pending.as_ref().map(|p| p.op))
    }

    #[test]
    fn replay_rules_table() {
        use MountState::*;
        use Operation::*;
        let fail = || OpResult::FailedFinal("x".into());
        let unsure = || OpResult::FailedUncertain("x".into());
        type Row = (&'static str, Vec<Record>, (MountState, Option<Operation>));
        let table: Vec<Row> = vec![
            (
                "intent alone is pending",
                vec![intent(1, MountDevice, Steps::Single)],
                (NotMounted, Some(MountDevice)),
            ),
            (
                "mount success",
                vec![
                    intent(1, MountDevice, Steps::Single),
                    outcome(2, 1, MountDevice, OpResult::Success),
                ],
                (Mounted, None),
            ),
            (
                "final failure keeps the state before",
                vec![
                    intent(1, MountDevice, Steps::Single),
                    outcome(2, 1, MountDevice, fail()),
                ],
                (NotMounted, None),
            ),
            (
                "uncertain failure",
                vec![
                    intent(1, MountDevice, Steps::Single),
                    outcome(2, 1, MountDevice, unsure()),
                ],
                (Uncertain, None),
            ),
            (
                "format leaves the device unmounted",
                vec![
                    intent(1, FormatDevice, Steps::Multi),
                    outcome(2, 1, FormatDevice, OpResult::Success),
                ],
                (NotMounted, None),
            ),
            (
                "unmount success",
                vec![
                    intent(1, MountDevice, Steps::Single),
                    outcome(2, 1, MountDevice, OpResult::Success),
                    intent(3, UnmountDevice, Steps::Single),
                    outcome(4, 3, UnmountDevice, OpResult::Success),
                ],
                (NotMounted, None),
            ),
            (
                "failed unmount keeps it mounted",
                vec![
                    intent(1, MountDevice, Steps::Single),
                    outcome(2, 1, MountDevice, OpResult::Success),
                    intent(3, UnmountDevice, Steps::Single),
                    outcome(4, 3, UnmountDevice, fail()),
                ],
                (Mounted, None),
            ),
            (
                "superseded intent makes it uncertain",
                vec![
                    intent(1, MountDevice, Steps::Single),
                    intent(2, MountDevice, Steps::Single),
                ],
                (Uncertain, Some(MountDevice)),
            ),
        ];
        for (name, records, want) in table {
            assert_eq!(device_state(&records), want, "{name}");
        }
    }

    /// A repack keeps every entry and pending operation as it was, and the
    /// state goes on applying records.
    #[test]
    fn a_repacked_state_is_the_same_state() {
        let mut s = JournalState::default();
        for pod in 0..40 {
            let target = TargetRef::Pod(PodUid::new(format!("p{pod:02}")).unwrap());
            let seq = 2 * pod + 1;
            s.apply(&rec(
                seq,
                Body::Intent {
                    op: Operation::SetUp,
                    steps: Steps::Single,
                    target: params(target).into(),
                },
            ));
            if pod % 3 != 0 {
                s.apply(&outcome(seq + 1, seq, Operation::SetUp, OpResult::Success));
            }
        }
        let before = s.clone();
        s.repack();
        assert_eq!(s, before);
        s.apply(&intent(100, Operation::MountDevice, Steps::Multi));
        assert_eq!(s.len(), before.len() + 1);
    }

    #[test]
    fn reconstructed_and_forget() {
        let mut s = JournalState::default();
        s.apply(&intent(1, Operation::MountDevice, Steps::Multi));
        s.apply(&rec(
            2,
            Body::Reconstructed {
                target: params(TargetRef::Device).into(),
                state: MountState::Uncertain,
                reason: "multi_step_intent".into(),
                observed: None,
            },
        ));
        let key = TargetKey::of(&params(TargetRef::Device));
        let e = s.get(&key).unwrap();
        assert_eq!(e.reported_state(), MountState::Uncertain);
        assert!(e.pending.is_none());
        assert_eq!(e.reason.as_deref(), Some("multi_step_intent"));
        // The old intent no longer resolves.
        s.apply(&outcome(3, 1, Operation::MountDevice, OpResult::Success));
        assert_eq!(s.get(&key).unwrap().state, MountState::Uncertain);
        assert_eq!(s.anomalies().len(), 1);
        s.apply(&rec(
            4,
            Body::Forget {
                volume: key.volume.clone(),
                target: TargetRef::Device,
            },
        ));
        assert!(s.is_empty());
        assert_eq!(s.last_seq(), 4);
    }

    #[test]
    fn pod_targets_are_separate_from_the_device_target() {
        let mut s = JournalState::default();
        let pod = TargetRef::Pod(PodUid::new("p1").unwrap());
        s.apply(&rec(
            1,
            Body::Intent {
                op: Operation::SetUp,
                steps: Steps::Single,
                target: params(pod.clone()).into(),
            },
        ));
        s.apply(&intent(2, Operation::MountDevice, Steps::Single));
        s.apply(&outcome(3, 1, Operation::SetUp, OpResult::Success));
        assert_eq!(s.len(), 2);
        let pod_key = TargetKey::of(&params(pod));
        assert_eq!(
            s.get(&pod_key).unwrap().reported_state(),
            MountState::Mounted
        );
        let dev_key = TargetKey::of(&params(TargetRef::Device));
        assert_eq!(
            s.get(&dev_key).unwrap().reported_state(),
            MountState::Uncertain
        );
    }

    fn bind(index: u32, sub_path: &str) -> SubpathBind {
        let pod = PodUid::new("p1").unwrap();
        SubpathBind {
            key: SubpathKey::new(pod, "data", "app", index).unwrap(),
            volume: UniqueVolumeName::from_raw("kubernetes.io/local-volume/pv1"),
            sub_path: sub_path.to_owned(),
        }
    }

    fn sub_intent(seq: u64, op: Operation, index: u32, sub_path: &str) -> Record {
        rec(
            seq,
            Body::SubpathIntent {
                op,
                bind: bind(index, sub_path),
            },
        )
    }

    #[test]
    fn subpath_replay_rules_table() {
        use MountState::*;
        use Operation::*;
        let fail = || OpResult::FailedFinal("x".into());
        let unsure = || OpResult::FailedUncertain("x".into());
        // what the state says of bind 0 after the records: its reported
        // state and subpath, or None when it is not tracked
        type Row = (
            &'static str,
            Vec<Record>,
            Option<(MountState, &'static str)>,
        );
        let table: Vec<Row> = vec![
            (
                "an intent alone is uncertain",
                vec![sub_intent(1, BindSubpath, 0, "a")],
                Some((Uncertain, "a")),
            ),
            (
                "a bind's success mounts it",
                vec![
                    sub_intent(1, BindSubpath, 0, "a"),
                    outcome(2, 1, BindSubpath, OpResult::Success),
                ],
                Some((Mounted, "a")),
            ),
            (
                "a first bind's final failure leaves nothing",
                vec![
                    sub_intent(1, BindSubpath, 0, "a"),
                    outcome(2, 1, BindSubpath, fail()),
                ],
                None,
            ),
            (
                "a bind's final failure over a mounted one keeps it",
                vec![
                    sub_intent(1, BindSubpath, 0, "a"),
                    outcome(2, 1, BindSubpath, OpResult::Success),
                    sub_intent(3, BindSubpath, 0, "b"),
                    outcome(4, 3, BindSubpath, fail()),
                ],
                Some((Mounted, "a")),
            ),
            (
                "an uncertain failure makes it uncertain with the new subpath",
                vec![
                    sub_intent(1, BindSubpath, 0, "a"),
                    outcome(2, 1, BindSubpath, OpResult::Success),
                    sub_intent(3, BindSubpath, 0, "b"),
                    outcome(4, 3, BindSubpath, unsure()),
                ],
                Some((Uncertain, "b")),
            ),
            (
                "an unbind's success forgets it",
                vec![
                    sub_intent(1, BindSubpath, 0, "a"),
                    outcome(2, 1, BindSubpath, OpResult::Success),
                    sub_intent(3, UnbindSubpath, 0, "a"),
                    outcome(4, 3, UnbindSubpath, OpResult::Success),
                ],
                None,
            ),
            (
                "an unbind's final failure keeps it mounted",
                vec![
                    sub_intent(1, BindSubpath, 0, "a"),
                    outcome(2, 1, BindSubpath, OpResult::Success),
                    sub_intent(3, UnbindSubpath, 0, "a"),
                    outcome(4, 3, UnbindSubpath, fail()),
                ],
                Some((Mounted, "a")),
            ),
        ];
        for (name, records, want) in table {
            let mut s = JournalState::default();
            for r in &records {
                s.apply(r);
            }
            let pod = PodUid::new("p1").unwrap();
            let got = s
                .subpaths_of(&pod, "data")
                .find(|e| e.bind.key.index == 0)
                .map(|e| (e.reported_state(), e.bind.sub_path.clone()));
            let want = want.map(|(st, sp)| (st, sp.to_owned()));
            assert_eq!(got, want, "{name}");
            assert!(s.anomalies().is_empty(), "{name}: {:?}", s.anomalies());
            // a subpath never shows up as a target
            assert_eq!(s.len(), 0, "{name}");
        }
    }

    #[test]
    fn subpaths_are_listed_by_pod_volume_and_by_pod_and_a_superseded_intent_is_an_anomaly() {
        use Operation::*;
        let mut s = JournalState::default();
        let other = SubpathBind {
            key: SubpathKey::new(PodUid::new("p2").unwrap(), "data", "app", 0).unwrap(),
            ..bind(0, "x")
        };
        let records = [
            sub_intent(1, BindSubpath, 0, "a"),
            outcome(2, 1, BindSubpath, OpResult::Success),
            sub_intent(3, BindSubpath, 1, "b"),
            rec(
                4,
                Body::SubpathIntent {
                    op: BindSubpath,
                    bind: other,
                },
            ),
            sub_intent(5, BindSubpath, 1, "c"),
        ];
        for r in &records {
            s.apply(r);
        }
        let p1 = PodUid::new("p1").unwrap();
        let idx: Vec<u32> = s
            .subpaths_of(&p1, "data")
            .map(|e| e.bind.key.index)
            .collect();
        assert_eq!(idx, vec![0, 1]);
        assert_eq!(s.subpaths_of(&p1, "other").count(), 0);
        assert_eq!(s.subpaths_of_pod(&p1).count(), 2);
        assert_eq!(s.subpaths().count(), 3);
        assert_eq!(s.anomalies().len(), 1, "{:?}", s.anomalies());
        assert_eq!(s.anomalies()[0].seq, 5);
    }
}
