//! The events sources emit, how two desired sets differ, and
//! [`apply_event`]: the one place sources change the DSW.

use std::collections::{BTreeMap, BTreeSet};

use super::{DesiredPod, fingerprint};
use crate::model::{PodUid, UniqueVolumeName};
use crate::state::{DesiredStateOfWorld, LabelCheck};

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
    let mut events: Vec<SourceEvent> = old
        .keys()
        .filter(|uid| !new.contains_key(*uid) && !kept.contains(*uid))
        .map(|uid| SourceEvent::PodRemoved(uid.clone()))
        .collect();
    for (uid, pod) in new {
        match old.get(uid) {
            None => events.push(SourceEvent::PodAdded(pod.clone())),
            Some(before) if *before != fingerprint(pod) => {
                events.push(SourceEvent::PodUpdated(pod.clone()));
            }
            Some(_) => {}
        }
    }
    events
}

/// Applies one event to the DSW. For an added or updated pod: the DSW
/// volumes of the pod that it no longer lists are removed — except those
/// whose outer name is in [`DesiredPod::unresolved`] (a claim that stopped
/// resolving keeps what the pod had); its volumes are added (labels are not
/// computed yet: no label check); its errors are recorded last, because
/// removing a pod from a volume clears its errors.
pub fn apply_event(dsw: &mut DesiredStateOfWorld, event: SourceEvent) {
    match event {
        SourceEvent::PodAdded(pod) | SourceEvent::PodUpdated(pod) => apply_pod(dsw, pod),
        SourceEvent::PodRemoved(uid) => {
            dsw.delete_pod(&uid);
        }
        SourceEvent::SourcesReady => dsw.mark_sources_ready(),
    }
}

fn apply_pod(dsw: &mut DesiredStateOfWorld, pod: DesiredPod) {
    let uid = pod.uid;
    dsw.set_pod_unresolved(&uid, !pod.unresolved.is_empty());
    let wanted: BTreeSet<&UniqueVolumeName> = pod.volumes.iter().map(|v| &v.volume).collect();
    for name in dsw.volumes_of_pod(&uid) {
        if wanted.contains(&name) {
            continue;
        }
        let outer = dsw
            .volume(&name)
            .and_then(|v| v.pods.get(&uid))
            .map(|p| p.outer_name.clone());
        if outer.is_some_and(|o| pod.unresolved.contains(&o)) {
            continue;
        }
        dsw.delete_pod_from_volume(&uid, &name);
    }
    let mut errors = pod.errors;
    for volume in pod.volumes {
        let name = volume.volume.clone();
        match dsw.add_pod_to_volume(&uid, volume, LabelCheck::default()) {
            Ok(added) => {
                if let Some(c) = added.conflict {
                    tracing::warn!(pod = %uid, volume = %name, conflict = %c, "SELinux label conflict");
                }
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    for e in errors {
        dsw.add_pod_error(&uid, e);
    }
}
