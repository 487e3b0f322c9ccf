//! Which operations are running or backing off: per-volume exclusivity and
//! the kubelet's exponential backoff (500 ms, doubling, capped at 2 min 2 s).
//!
//! Operations on one volume are exclusive, except that TearDowns of
//! different pods may run side by side (the kubelet's nested pending
//! operations: a key with a pod conflicts only with the same pod or with the
//! volume-wide key). Time is passed in, so the rules are tested without
//! sleeping.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::model::{PodUid, UniqueVolumeName, VolumeSpec};

/// First retry delay after a failure.
pub(crate) const INITIAL_BACKOFF: Duration = Duration::from_millis(500);
/// Longest retry delay.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(122);

/// The operations a pass may start on a node of up to
/// `STARTS_FLOOR × STARTS_SHARE` desired volumes ([`pass_budget`]).
pub(crate) const STARTS_FLOOR: usize = 1024;
/// On a bigger node a pass may start 1/this of its desired volumes: a mass
/// start of any size takes about this many passes at most, each
/// O(volumes), so O(volumes) in all.
pub(crate) const STARTS_SHARE: usize = 16;

/// How many operations a pass may start on a node that wants `desired`
/// volumes. A mass start goes in slices: the next is planned once the
/// queue has drained (the step that sees it empty plans a pass), so what
/// waits in the queue (each job's copy of its volume, its intent in the
/// journal's tail) stays bounded and a checkpoint can fold the tail
/// between slices. Jobs still queued do not count against it: those of a
/// hung CSI driver must not hold back every other volume's.
pub(crate) fn pass_budget(desired: usize) -> usize {
    STARTS_FLOOR.max(desired / STARTS_SHARE)
}

/// What an operation locks.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct OpKey {
    /// the volume
    pub volume: UniqueVolumeName,
    /// `Some` for an operation on one pod's target only
    pub pod: Option<PodUid>,
}

impl OpKey {
    /// A volume-wide key (device operations, mounts of shared volumes).
    pub(crate) fn volume(volume: &UniqueVolumeName) -> Self {
        Self {
            volume: volume.clone(),
            pod: None,
        }
    }
    /// A per-pod key (TearDown; mounts of per-pod volumes).
    pub(crate) fn pod(volume: &UniqueVolumeName, pod: &PodUid) -> Self {
        Self {
            volume: volume.clone(),
            pod: Some(pod.clone()),
        }
    }
    /// The key of a mount: volume-wide when the volume has a device target
    /// shared by pods, per pod otherwise.
    pub(crate) fn for_mount(volume: &UniqueVolumeName, pod: &PodUid, spec: &VolumeSpec) -> Self {
        if spec.device_target_kind().is_some() || spec.plugin().is_device_mountable() {
            Self::volume(volume)
        } else {
            Self::pod(volume, pod)
        }
    }
    /// Whether two keys may not run at the same time.
    #[cfg(test)]
    pub(crate) fn conflicts(&self, other: &OpKey) -> bool {
        self.volume == other.volume
            && (self.pod.is_none() || other.pod.is_none() || self.pod == other.pod)
    }
}

#[derive(Debug, Clone)]
struct Backoff {
    delay: Duration,
    until: Instant,
}

/// Running operations and backoff windows.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    running: BTreeMap<OpKey, ()>,
    backoff: BTreeMap<OpKey, Backoff>,
}

impl Pending {
    /// Nothing running, nothing backing off.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Whether `key` must wait: a conflicting operation runs, or `key` itself
    /// failed and its backoff window has not passed.
    pub(crate) fn busy(&self, key: &OpKey, now: Instant) -> bool {
        self.conflicts_with_running(key) || self.backoff.get(key).is_some_and(|b| now < b.until)
    }

    /// Whether a running key conflicts with `key`, in O(log n): keys sort by
    /// volume, then with the volume-wide key (`pod: None`) first, so the
    /// only candidates are that volume's first running key, its volume-wide
    /// key and `key` itself.
    fn conflicts_with_running(&self, key: &OpKey) -> bool {
        match &key.pod {
            None => self
                .running
                .range(OpKey::volume(&key.volume)..)
                .next()
                .is_some_and(|(k, ())| k.volume == key.volume),
            Some(_) => {
                self.running.contains_key(key)
                    || self.running.contains_key(&OpKey::volume(&key.volume))
            }
        }
    }

    /// Marks `key` running; `false` (and nothing changes) when it must wait.
    pub(crate) fn start(&mut self, key: &OpKey, now: Instant) -> bool {
        if self.busy(key, now) {
            return false;
        }
        self.running.insert(key.clone(), ());
        true
    }

    /// Whether an operation running conflicts with `key` (a backoff does
    /// not count).
    pub(crate) fn runs_against(&self, key: &OpKey) -> bool {
        self.conflicts_with_running(key)
    }

    /// Marks `key` running whatever its backoff (which it clears): for
    /// work no backoff paces, once [`Pending::runs_against`] said nothing
    /// conflicts.
    pub(crate) fn take_over(&mut self, key: &OpKey) {
        self.backoff.remove(key);
        self.running.insert(key.clone(), ());
    }

    /// Marks `key` finished. A failure doubles its backoff (from 500 ms up to
    /// 2 min 2 s); a success clears it.
    pub(crate) fn finish(&mut self, key: &OpKey, ok: bool, now: Instant) {
        self.running.remove(key);
        if ok {
            self.backoff.remove(key);
            return;
        }
        let delay = match self.backoff.get(key) {
            Some(b) => (b.delay * 2).min(MAX_BACKOFF),
            None => INITIAL_BACKOFF,
        };
        self.backoff.insert(
            key.clone(),
            Backoff {
                delay,
                until: now + delay,
            },
        );
    }

    /// When the earliest backoff window closes (to wake the loop then).
    pub(crate) fn next_retry(&self, now: Instant) -> Option<Instant> {
        self.backoff
            .values()
            .map(|b| b.until)
            .filter(|u| *u > now)
            .min()
    }

    /// Number of running operations.
    pub(crate) fn running(&self) -> usize {
        self.running.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_budget_is_a_slice_of_the_node() {
        // desired volumes -> operations a pass may start
        let rows = [
            (0, STARTS_FLOOR),
            (10, STARTS_FLOOR),
            (STARTS_FLOOR * STARTS_SHARE + STARTS_SHARE - 1, STARTS_FLOOR),
            (STARTS_FLOOR * STARTS_SHARE + STARTS_SHARE, STARTS_FLOOR + 1),
            (50_000, 50_000 / STARTS_SHARE),
        ];
        for (desired, want) in rows {
            assert_eq!(pass_budget(desired), want, "{desired}");
        }
    }

    fn v(s: &str) -> UniqueVolumeName {
        UniqueVolumeName::from_raw(s)
    }
    fn p(s: &str) -> PodUid {
        PodUid::new(s).unwrap()
    }

    #[test]
    fn conflict_table() {
        let table = [
            (OpKey::volume(&v("a")), OpKey::volume(&v("a")), true),
            (OpKey::volume(&v("a")), OpKey::pod(&v("a"), &p("1")), true),
            (
                OpKey::pod(&v("a"), &p("1")),
                OpKey::pod(&v("a"), &p("1")),
                true,
            ),
            (
                OpKey::pod(&v("a"), &p("1")),
                OpKey::pod(&v("a"), &p("2")),
                false,
            ),
            (OpKey::volume(&v("a")), OpKey::volume(&v("b")), false),
        ];
        for (x, y, want) in table {
            assert_eq!(x.conflicts(&y), want, "{x:?} vs {y:?}");
            assert_eq!(y.conflicts(&x), want, "symmetric");
        }
    }

    #[test]
    fn operations_on_one_volume_are_exclusive_but_pod_teardowns_are_not() {
        let now = Instant::now();
        let mut pending = Pending::new();
        assert!(pending.start(&OpKey::pod(&v("a"), &p("1")), now));
        assert!(
            pending.start(&OpKey::pod(&v("a"), &p("2")), now),
            "teardowns of two pods run side by side"
        );
        assert!(
            !pending.start(&OpKey::volume(&v("a")), now),
            "device op waits for the pods"
        );
        assert!(pending.start(&OpKey::volume(&v("b")), now));
        assert_eq!(pending.running(), 3);
    }

    #[test]
    fn busy_agrees_with_conflicts_against_every_running_key() {
        let now = Instant::now();
        let keys = [
            OpKey::volume(&v("a")),
            OpKey::pod(&v("a"), &p("1")),
            OpKey::pod(&v("a"), &p("2")),
            OpKey::volume(&v("ab")),
            OpKey::pod(&v("ab"), &p("1")),
            OpKey::volume(&v("b")),
            OpKey::pod(&v("b"), &p("3")),
        ];
        // every subset of running keys, every probe key
        for mask in 0u32..(1 << keys.len()) {
            let mut pending = Pending::new();
            let running: Vec<&OpKey> = keys
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, k)| k)
                .collect();
            for k in &running {
                pending.running.insert((*k).clone(), ());
            }
            for probe in &keys {
                let want = running.iter().any(|k| k.conflicts(probe));
                assert_eq!(pending.busy(probe, now), want, "{probe:?} vs {running:?}");
            }
        }
    }

    #[test]
    fn failures_back_off_exponentially_to_the_kubelets_cap() {
        let t0 = Instant::now();
        let k = OpKey::volume(&v("a"));
        let mut pending = Pending::new();
        let mut now = t0;
        let mut delays = Vec::new();
        for _ in 0..12 {
            assert!(pending.start(&k, now));
            pending.finish(&k, false, now);
            let retry = pending.next_retry(now).unwrap();
            delays.push(retry - now);
            assert!(pending.busy(&k, now), "backing off");
            now = retry;
            assert!(!pending.busy(&k, now), "free when the window closes");
        }
        assert_eq!(delays[0], Duration::from_millis(500));
        assert_eq!(delays[1], Duration::from_secs(1));
        assert_eq!(delays[2], Duration::from_secs(2));
        assert_eq!(*delays.last().unwrap(), MAX_BACKOFF);
        pending.start(&k, now);
        pending.finish(&k, true, now);
        assert!(!pending.busy(&k, now));
        assert_eq!(pending.next_retry(now), None, "success clears the backoff");
    }
}
