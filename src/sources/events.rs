//! The events sources emit, how two desired sets differ, and
//! [`apply_event`]: the one place sources change the DSW.

use std::collections::{BTreeMap, BTreeSet};

use super::{DesiredPod, fingerprint};
use crate::model::{PodUid, UniqueVolumeName};
use crate::selinux::{Counter, MetricEvent, Policy, volume_label};
use crate::state::{DesiredStateOfWorld, StateError};

/// What changed in the sources. Closed: every way a source changes the DSW
/// is listed here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceEvent {
    /// A pod appeared.
    PodAdded(DesiredPod),
    /// A known pod changed (volumes, errors, SELinux inputs, file).
    PodUpdated(DesiredPod),
    /// A pod is gone: its volumes are no longer wanted.
    PodRemoved(PodUid),
    /// Every configured source has been listed completely once: the DSW is
    /// populated and unmounting may start. Emitted exactly once.
    SourcesReady,
}

/// The events that turn `old` into `new`, pure: removals first, then
/// additions and updates, each sorted by UID.
pub fn diff(
    old: &BTreeMap<PodUid, DesiredPod>,
    new: &BTreeMap<PodUid, DesiredPod>,
) -> Vec<SourceEvent> {
    let old = old
        .iter()
        .map(|(u, p)| (u.clone(), fingerprint(p)))
        .collect();
    diff_fingerprints(&old, new, &BTreeSet::new())
}

/// [`diff`] against what the DSW was last told, kept as [`fingerprint`]s
/// (the sources keep no pods between polls). A pod in `kept` (its manifest
/// exists but cannot be read now) is neither removed nor updated.
pub fn diff_fingerprints(
    old: &BTreeMap<PodUid, u64>,
    new: &BTreeMap<PodUid, DesiredPod>,
    kept: &BTreeSet<PodUid>,
) -> Vec<SourceEvent> {
    let now: Vec<u64> = new.values().map(fingerprint).collect();
    advance(&mut old.clone(), new.clone(), &now, kept)
}

/// [`diff_fingerprints`] for the source that keeps the fingerprints:
/// `current` (what the DSW was last told) is brought up to `new`, whose
/// fingerprints are `now` (in `new`'s order), and `new`'s pods move into
/// the events (a whole listing is not copied to be sent). Both are walked
/// once side by side, in UID order, and `current` rebuilt from the sorted
/// result: no search per pod.
pub(super) fn advance(
    current: &mut BTreeMap<PodUid, u64>,
    new: BTreeMap<PodUid, DesiredPod>,
    now: &[u64],
    kept: &BTreeSet<PodUid>,
) -> Vec<SourceEvent> {
    let mut events = Vec::new();
    // at most one per new pod (a listing's new pods are its changed ones)
    let mut changed = Vec::with_capacity(new.len());
    let mut next: Vec<(PodUid, u64)> = Vec::with_capacity(current.len().max(new.len()));
    let mut before = std::mem::take(current).into_iter().peekable();
    // a pod the DSW has that `new` lacks: removed, unless kept
    let mut gone = |(uid, f): (PodUid, u64), next: &mut Vec<(PodUid, u64)>| {
        if kept.contains(&uid) {
            next.push((uid, f));
        } else {
            events.push(SourceEvent::PodRemoved(uid));
        }
    };
    for ((uid, pod), &f) in new.into_iter().zip(now) {
        while let Some(old) = before.next_if(|(u, _)| *u < uid) {
            gone(old, &mut next);
        }
        match before.next_if(|(u, _)| *u == uid) {
            None => changed.push(SourceEvent::PodAdded(pod)),
            Some((_, was)) if was != f => changed.push(SourceEvent::PodUpdated(pod)),
            Some(_) => {}
        }
        next.push((uid, f));
    }
    for old in before {
        gone(old, &mut next);
    }
    *current = next.into_iter().collect();
    events.extend(changed);
    events
}

/// Applies one event to the DSW. For an added or updated pod: the DSW
/// volumes of the pod that it no longer lists are removed — except those
/// whose outer name is in [`DesiredPod::unresolved`] (a claim that stopped
/// resolving keeps what the pod had); each volume gets its SELinux label
/// from [`volume_label`] under `policy` and is added with that label check
/// (a fatal label problem or a refused conflict leaves the pod without the
/// volume and with an error naming both labels); its errors are recorded
/// last, because removing a pod from a volume clears its errors.
///
/// The pod's errors are replaced by the ones this application finds.
pub fn apply_event(dsw: &mut DesiredStateOfWorld, event: SourceEvent, policy: &Policy) -> Applied {
    let mut out = Applied::default();
    match event {
        SourceEvent::PodAdded(pod) | SourceEvent::PodUpdated(pod) => {
            apply_pod(dsw, pod, policy, &mut out)
        }
        SourceEvent::PodRemoved(uid) => {
            dsw.delete_pod(&uid);
        }
        SourceEvent::SourcesReady => dsw.mark_sources_ready(),
    }
    out
}

/// Logs each added or changed pod's own errors (a rejected volume, an
/// unresolved claim) at error level, naming where the pod came from: once
/// when it appears or changes, not on every poll. `source` says which.
pub fn log_pod_errors(events: &[SourceEvent], source: &'static str) {
    for ev in events {
        if let SourceEvent::PodAdded(p) | SourceEvent::PodUpdated(p) = ev {
            for e in &p.errors {
                tracing::error!(pod = %p.uid, from = %p.file.display(), error = %e, "{source} pod");
            }
        }
    }
}

/// What [`apply_event`] reports back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// the `volume_manager_selinux_*` increments, for the caller to count
    pub metrics: Vec<MetricEvent>,
    /// the pod was refused a volume for its SELinux label: the caller
    /// applies it again when other pods change (the kubelet's populator
    /// retries it every loop), so it gets the volume once the pod holding
    /// the other label is gone. Never under a policy that labels no
    /// volume ([`Policy::labels_volumes`]).
    pub refused: bool,
}

fn apply_pod(dsw: &mut DesiredStateOfWorld, pod: DesiredPod, policy: &Policy, out: &mut Applied) {
    let uid = pod.uid;
    dsw.pop_pod_errors(&uid);
    dsw.set_pod_unresolved(&uid, !pod.unresolved.is_empty());
    // sorted and deduplicated, without a set's allocations per name
    let mut names: Vec<String> = pod.volumes.iter().map(|v| v.outer_name.clone()).collect();
    names.extend(pod.unresolved.iter().cloned());
    names.sort_unstable();
    names.dedup();
    dsw.set_pod_volume_names(&uid, names);
    dsw.set_pod_containers(&uid, pod.containers);
    // a pod new to the DSW (every pod of a first listing) has none to drop
    let had = dsw.volumes_of_pod(&uid);
    let wanted: BTreeSet<&UniqueVolumeName> = match had.is_empty() {
        true => BTreeSet::new(),
        false => pod.volumes.iter().map(|v| &v.volume).collect(),
    };
    for name in had {
        if wanted.contains(&name) {
            continue;
        }
        let outer = dsw
            .volume(&name)
            .and_then(|v| v.pods.get(&uid))
            .map(|p| p.outer_name.clone());
        if outer.is_some_and(|o| pod.unresolved.contains(o.as_str())) {
            continue;
        }
        dsw.delete_pod_from_volume(&uid, &name);
    }
    let mut errors = pod.errors;
    for mut volume in pod.volumes {
        let name = volume.volume.clone();
        let label = volume_label(policy, &pod.selinux, &volume.outer_name, &volume.spec);
        if let Some(p) = &label.problem {
            out.metrics
                .push(MetricEvent::new(Counter::for_problem(p), &volume.spec));
            if p.fatal {
                out.refused = true;
                errors.push(p.message.clone());
                continue;
            }
            tracing::warn!(pod = %uid, volume = %name, problem = %p.message, "SELinux label problem; the volume is used without a label");
        }
        let is_new = !dsw.volume_exists(&name);
        let admitted = is_new && label.check.original.is_some();
        let spec = volume.spec.clone();
        volume.selinux = label.effective;
        match dsw.add_pod_to_volume(&uid, volume, label.check) {
            Ok(added) => {
                if admitted {
                    out.metrics
                        .push(MetricEvent::new(Counter::VolumesAdmitted, &spec));
                }
                if let Some(c) = added.conflict {
                    out.metrics.push(MetricEvent::new(
                        Counter::VolumeContextMismatchWarnings,
                        &spec,
                    ));
                    tracing::warn!(pod = %uid, volume = %name, conflict = %c, "SELinux label conflict (a warning: the volume does not support SELinux mounts)");
                }
            }
            Err(e) => {
                if matches!(e, StateError::AddPodToVolume { .. }) {
                    out.refused = true;
                    out.metrics.push(MetricEvent::new(
                        Counter::VolumeContextMismatchErrors,
                        &spec,
                    ));
                }
                tracing::warn!(pod = %uid, volume = %name, error = %e, "the pod does not get the volume");
                errors.push(e.to_string());
            }
        }
    }
    for e in errors {
        dsw.add_pod_error(&uid, e);
    }
}
