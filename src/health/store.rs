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

/// The pods of a record: one inline (most volumes have one), else boxed
/// twice: a thin pointer fits beside the inline pod's UID, so the enum is
/// 16 bytes, not 24, and eleven records fit a smaller node. Reads as a
/// slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodNames {
    /// a volume one pod uses
    One(PodName),
    /// any other number of pods
    Many(Box<Box<[PodName]>>),
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

/// One volume as last checked. Its usage and time are packed (read them
/// with [`Record::usage`] and [`Record::checked`]): the store keeps a
/// record per volume in its map's nodes, and packed, eleven fit a smaller
/// allocation.
#[derive(Debug, Clone)]
pub struct Record {
    /// its plugin
    pub plugin: PluginName,
    /// which of `figures` hold a value: [`USAGE`], then one bit per inode
    /// figure
    present: u8,
    /// the pods whose mounted targets were checked
    pub pods: PodNames,
    /// the claim for a PVC-backed volume
    pub claim: Option<Box<Claim>>,
    /// the condition; `None` until one was judged (a CSI driver without
    /// `VOLUME_CONDITION` never gives one). Shared by the records whose
    /// conditions are equal (see `share`).
    pub condition: Option<Arc<Condition>>,
    /// the usage last measured, in [`Usage`]'s field order
    figures: [u64; 6],
    /// when it was last checked, in nanoseconds since the epoch
    checked_ns: u64,
    /// the last pass that found it mounted (see [`Store::passes`])
    pub pass: u64,
}

/// `Record::present`'s bit for a usage; the next three are its inode
/// figures'.
const USAGE: u8 = 1;

impl Record {
    /// A record of a volume checked at `checked`.
    fn new(plugin: PluginName, pods: PodNames, claim: Option<Box<Claim>>, j: Judged) -> Self {
        let mut r = Record {
            plugin,
            present: 0,
            pods,
            claim,
            condition: j.condition,
            figures: [0; 6],
            checked_ns: 0,
            pass: j.pass,
        };
        r.set_usage(j.usage);
        r.set_checked(j.checked);
        r
    }

    /// The usage last measured.
    pub fn usage(&self) -> Option<Usage> {
        if self.present & USAGE == 0 {
            return None;
        }
        let f = self.figures;
        let inode = |i: usize| (self.present & (USAGE << (i - 2)) != 0).then_some(f[i]);
        Some(Usage {
            capacity_bytes: f[0],
            available_bytes: f[1],
            used_bytes: f[2],
            inodes: inode(3),
            inodes_free: inode(4),
            inodes_used: inode(5),
        })
    }

    /// When it was last checked (to the nanosecond; a time before the
    /// epoch reads as the epoch).
    pub fn checked(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + std::time::Duration::from_nanos(self.checked_ns)
    }

    fn set_usage(&mut self, u: Option<Usage>) {
        let Some(u) = u else {
            self.present = 0;
            self.figures = [0; 6];
            return;
        };
        let inodes = [u.inodes, u.inodes_free, u.inodes_used];
        self.present = USAGE;
        self.figures = [u.capacity_bytes, u.available_bytes, u.used_bytes, 0, 0, 0];
        for (i, v) in inodes.into_iter().enumerate() {
            if let Some(v) = v {
                self.present |= USAGE << (i + 1);
                self.figures[i + 3] = v;
            }
        }
    }

    fn set_checked(&mut self, t: SystemTime) {
        let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        self.checked_ns = u64::try_from(since.as_nanos()).unwrap_or(u64::MAX);
    }
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
            r.set_usage(j.usage);
            r.set_checked(j.checked);
            r.pass = j.pass;
            return false;
        }
        let record = Record::new(subject.plugin, pod_names(&subject.pods), subject.claim, j);
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
            crate::util::repack::repack(&mut self.volumes);
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
        _ => PodNames::Many(Box::new(pods.iter().map(name).collect())),
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

    /// A record gives back the usage and time it was given, each inode
    /// figure present or not on its own, and no usage as none; packed, it
    /// stays small enough for eleven (with their keys) to fit a 1.25 KiB
    /// node.
    #[test]
    fn a_record_reads_back_its_usage_and_time() {
        let u = |inodes: [Option<u64>; 3]| Usage {
            capacity_bytes: u64::MAX,
            available_bytes: 0,
            used_bytes: 7,
            inodes: inodes[0],
            inodes_free: inodes[1],
            inodes_used: inodes[2],
        };
        let at = SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789);
        let names = PodNames::Many(Box::new(Box::new([])));
        for usage in [
            None,
            Some(u([None; 3])),
            Some(u([Some(10), Some(0), Some(u64::MAX)])),
            Some(u([None, Some(3), None])),
        ] {
            let j = |usage| Judged {
                condition: None,
                usage,
                checked: at,
                pass: 4,
            };
            let mut r = Record::new(PluginName::EmptyDir, names.clone(), None, j(usage));
            assert_eq!((r.usage(), r.checked(), r.pass), (usage, at, 4));
            r.set_usage(Some(u([Some(1); 3])));
            r.set_usage(usage);
            assert_eq!(r.usage(), usage, "set again");
        }
        let before = SystemTime::UNIX_EPOCH - Duration::from_secs(1);
        let mut r = Record::new(
            PluginName::EmptyDir,
            names,
            None,
            Judged {
                condition: None,
                usage: None,
                checked: before,
                pass: 0,
            },
        );
        assert_eq!(r.checked(), SystemTime::UNIX_EPOCH);
        r.set_checked(at);
        assert_eq!(r.checked(), at);
        let slot = std::mem::size_of::<(UniqueVolumeName, Record)>();
        assert!(8 + 11 * slot + 4 <= 1280, "{slot} bytes a slot");
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
