//! What the monitor keeps per volume between passes, and the reports
//! read: only the names, condition and usage (a pass's [`Subject`] holds
//! the spec and the paths, for the checks alone).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::SystemTime;

use super::{Claim, Condition, PodTarget, Subject, Usage};
use crate::model::{PluginName, PodUid, SharedStr, UniqueVolumeName};

/// A pod using a volume, as the reports name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodName {
    /// the pod
    pub uid: PodUid,
    /// `pod.spec.volumes[x].name` (empty when rebuilt from the host alone)
    pub outer_name: SharedStr,
}

/// The pods of a record: one inline (most volumes have one), else boxed.
/// Reads as a slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodNames {
    /// a volume one pod uses
    One(PodName),
    /// any other number of pods
    Many(Box<[PodName]>),
}

impl std::ops::Deref for PodNames {
    type Target = [PodName];
    fn deref(&self) -> &[PodName] {
        match self {
            PodNames::One(p) => std::slice::from_ref(p),
            PodNames::Many(ps) => ps,
        }
    }
}

/// One volume as last checked.
#[derive(Debug, Clone)]
pub struct Record {
    /// its plugin
    pub plugin: PluginName,
    /// the pods whose mounted targets were checked
    pub pods: PodNames,
    /// the claim for a PVC-backed volume
    pub claim: Option<Box<Claim>>,
    /// the condition; `None` until one was judged (a CSI driver without
    /// `VOLUME_CONDITION` never gives one). Shared by the records whose
    /// conditions are equal (see [`share`]).
    pub condition: Option<Arc<Condition>>,
    /// the usage last measured
    pub usage: Option<Usage>,
    /// when it was last checked
    pub checked: SystemTime,
    /// the last pass that found it mounted (see [`Store::passes`])
    pub pass: u64,
}

/// What the reports read.
#[derive(Debug, Default)]
pub struct Store {
    /// by volume
    pub volumes: BTreeMap<UniqueVolumeName, Record>,
    /// passes completed
    pub passes: u64,
}

/// What a pass learnt of one checked volume.
pub(super) struct Judged {
    pub(super) condition: Option<Arc<Condition>>,
    pub(super) usage: Option<Usage>,
    pub(super) checked: SystemTime,
    pub(super) pass: u64,
}

impl Store {
    /// Keeps what `j` says of `subject`, in place when it has a record.
    /// Returns whether a record was added.
    pub(super) fn put(&mut self, subject: Subject, j: Judged) -> bool {
        if let Some(r) = self.volumes.get_mut(&subject.volume) {
            if !same_pods(&r.pods, &subject.pods) {
                r.pods = pod_names(&subject.pods);
            }
            r.claim = subject.claim;
            r.condition = j.condition;
            r.usage = j.usage;
            r.checked = j.checked;
            r.pass = j.pass;
            return false;
        }
        let record = Record {
            plugin: subject.plugin,
            pods: pod_names(&subject.pods),
            claim: subject.claim,
            condition: j.condition,
            usage: j.usage,
            checked: j.checked,
            pass: j.pass,
        };
        self.volumes.insert(subject.volume, record);
        true
    }

    /// Ends pass `pass`: forgets and returns the records it did not stamp
    /// (no longer mounted), except `hung` ones, which keep what they had.
    /// When records came or went, the map is rebuilt: one filled in order
    /// or thinned out keeps its nodes about half full, one built whole
    /// keeps them full, and a record is a few hundred bytes.
    pub(super) fn end_pass(
        &mut self,
        pass: u64,
        hung: &HashSet<UniqueVolumeName>,
        added: bool,
    ) -> Vec<Record> {
        let drop_keys: Vec<UniqueVolumeName> = self
            .volumes
            .iter()
            .filter(|(k, r)| r.pass != pass && !hung.contains(*k))
            .map(|(k, _)| k.clone())
            .collect();
        let gone: Vec<Record> = drop_keys
            .iter()
            .filter_map(|k| self.volumes.remove(k))
            .collect();
        if added || !gone.is_empty() {
            self.volumes = std::mem::take(&mut self.volumes).into_iter().collect();
        }
        self.passes = pass;
        gone
    }
}

/// `new` as a volume keeps it: its `old` one when equal, else the pass's
/// `last` judged one when equal, else a new one that becomes `last`. The
/// volumes a pass finds healthy share one condition (it is the same to the
/// second), not a copy each.
pub(super) fn share(
    old: Option<Arc<Condition>>,
    new: Condition,
    last: &mut Option<Arc<Condition>>,
) -> Arc<Condition> {
    if let Some(old) = old.filter(|o| **o == new) {
        return old;
    }
    if let Some(l) = last.as_ref().filter(|l| ***l == new) {
        return l.clone();
    }
    let new = Arc::new(new);
    *last = Some(new.clone());
    new
}

/// The names of `pods` as the store keeps them.
fn pod_names(pods: &[PodTarget]) -> PodNames {
    let name = |p: &PodTarget| PodName {
        uid: p.uid.clone(),
        outer_name: p.outer_name.clone(),
    };
    match pods {
        [p] => PodNames::One(name(p)),
        _ => PodNames::Many(pods.iter().map(name).collect()),
    }
}

/// Whether `kept` names `pods`, in order: a record whose pods did not
/// change keeps its allocation from pass to pass.
fn same_pods(kept: &[PodName], pods: &[PodTarget]) -> bool {
    kept.len() == pods.len()
        && kept
            .iter()
            .zip(pods)
            .all(|(k, p)| k.uid == p.uid && k.outer_name == p.outer_name)
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::time::Duration;

    use super::*;
    use crate::health::Source;

    fn condition(reason: &'static str, secs: u64) -> Condition {
        Condition {
            abnormal: reason != "Healthy",
            reason,
            message: Cow::Borrowed("m"),
            since: SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
            source: Source::Native,
            findings: Vec::new(),
        }
    }

    /// A volume keeps its own condition while it is unchanged, else takes
    /// the one judged last when equal (the same check at the same second),
    /// else a new one, which is then the one to share.
    #[test]
    fn equal_conditions_are_one_shared_condition() {
        let old = Arc::new(condition("Healthy", 1));
        let mut last = Some(Arc::new(condition("Healthy", 2)));
        let before = last.clone().unwrap();

        let kept = share(Some(old.clone()), condition("Healthy", 1), &mut last);
        assert!(Arc::ptr_eq(&kept, &old), "unchanged: its own");
        let taken = share(Some(old.clone()), condition("Healthy", 2), &mut last);
        assert!(Arc::ptr_eq(&taken, &before), "equal to the last: the last");
        let taken = share(None, condition("Healthy", 2), &mut last);
        assert!(Arc::ptr_eq(&taken, &before), "a new volume too");

        let full = share(Some(old.clone()), condition("OutOfSpace", 2), &mut last);
        assert_eq!(*full, condition("OutOfSpace", 2));
        assert!(!Arc::ptr_eq(&full, &old) && !Arc::ptr_eq(&full, &before));
        assert!(Arc::ptr_eq(last.as_ref().unwrap(), &full), "now the last");
        let mut none = None;
        let first = share(None, condition("Healthy", 3), &mut none);
        assert!(Arc::ptr_eq(none.as_ref().unwrap(), &first));
    }
}
