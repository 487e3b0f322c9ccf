//! What the monitor keeps per volume between passes, and the reports
//! read: only the names, condition and usage (a pass's [`Subject`] holds
//! the spec and the paths, for the checks alone).

use std::collections::{BTreeMap, HashSet};
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

/// One volume as last checked.
#[derive(Debug, Clone)]
pub struct Record {
    /// its plugin
    pub plugin: PluginName,
    /// the pods whose mounted targets were checked
    pub pods: Box<[PodName]>,
    /// the claim for a PVC-backed volume
    pub claim: Option<Box<Claim>>,
    /// the condition; `None` until one was judged (a CSI driver without
    /// `VOLUME_CONDITION` never gives one)
    pub condition: Option<Condition>,
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
    pub(super) condition: Option<Condition>,
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

/// The names of `pods` as the store keeps them.
fn pod_names(pods: &[PodTarget]) -> Box<[PodName]> {
    pods.iter()
        .map(|p| PodName {
            uid: p.uid.clone(),
            outer_name: p.outer_name.clone(),
        })
        .collect()
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
