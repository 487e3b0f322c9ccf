//! Source events into the DSW, as the loop applies them: pods that hold
//! targets first, SELinux metrics counted, and the pods refused for their
//! label applied again whenever another pod changes.

use crate::journal::TargetKey;
use crate::model::PodUid;
use crate::sources::{SourceEvent, apply_event};
use crate::state::ActualStateOfWorld;

use super::core::Core;
use super::core::unheld::targets_of;
use super::effects::{Counted, Effect, PodEvent};
use crate::state::World;

impl Core {
    /// Applies source events to the DSW, counts their SELinux metrics, and
    /// retries the pods refused for a label once any other pod changed.
    ///
    /// Where a pod can be refused for its label, pods that already have
    /// targets in the ASW are applied before new ones: after a restart the
    /// pod that holds a volume's label keeps it,
    /// and a newcomer with another label is the one refused (never the
    /// other way round, which would unmount a running pod's volume).
    ///
    /// Returns the targets that pods stopped wanting (a pod removed, or
    /// updated without a volume), with their volumes' device targets:
    /// candidates for the journal's forget of what the ASW lacks
    /// (`core/unheld.rs`). Only with the journal on; O(those pods'
    /// volumes).
    pub(super) fn apply_sources(
        &mut self,
        w: &mut World,
        events: Vec<SourceEvent>,
        out: &mut Vec<Effect>,
    ) -> Vec<TargetKey> {
        // only a pod that can be refused is kept to be applied again: on a
        // host without labels, a copy of every pod for nothing; nor does
        // the order matter there
        let may_refuse = self.cfg.selinux.labels_volumes();
        let events = match may_refuse {
            true => holders_first(events, &w.asw),
            false => events,
        };
        let mut others_changed = false;
        let mut dropped = Vec::new();
        for e in events {
            let before = match &e {
                SourceEvent::PodAdded(p) | SourceEvent::PodUpdated(p) => Some(&p.uid),
                SourceEvent::PodRemoved(uid) => Some(uid),
                SourceEvent::SourcesReady => None,
            }
            .filter(|_| self.cfg.journal)
            .map(|uid| (uid.clone(), w.dsw.volumes_of_pod(uid)));
            let pod = match &e {
                SourceEvent::PodAdded(p) | SourceEvent::PodUpdated(p) => {
                    w.pods
                        .insert(p.uid.clone(), pod_entry(p, &mut self.namespace));
                    Some((p.uid.clone(), may_refuse.then(|| p.clone())))
                }
                SourceEvent::PodRemoved(uid) => {
                    w.pods.remove(uid);
                    self.refused.remove(uid);
                    others_changed = true;
                    None
                }
                SourceEvent::SourcesReady => None,
            };
            let applied = apply_event(&mut w.dsw, e, &self.cfg.selinux);
            if let Some((uid, before)) = before.filter(|(_, v)| !v.is_empty()) {
                let after = w.dsw.volumes_of_pod(&uid);
                let gone: Vec<_> = before
                    .into_iter()
                    .filter(|v| after.binary_search(v).is_err())
                    .collect();
                dropped.extend(targets_of(&uid, &gone));
            }
            for m in applied.metrics.iter().cloned() {
                out.push(Effect::Count(Counted::SeLinux(m)));
            }
            debug_assert!(may_refuse || !applied.refused, "refused without labels");
            if let Some((uid, copy)) = pod {
                pod_error_events(w, &uid, out);
                match copy.filter(|_| applied.refused) {
                    Some(p) => {
                        self.refused.insert(uid, p);
                    }
                    None => {
                        self.refused.remove(&uid);
                        others_changed = true;
                    }
                }
            }
        }
        if !others_changed {
            return dropped;
        }
        let mut admitted = Vec::new();
        for p in self.refused.values() {
            let again = SourceEvent::PodUpdated(p.clone());
            let applied = apply_event(&mut w.dsw, again, &self.cfg.selinux);
            for m in applied.metrics.iter().cloned() {
                out.push(Effect::Count(Counted::SeLinux(m)));
            }
            if !applied.refused {
                admitted.push(p.uid.clone());
            }
        }
        for uid in admitted {
            self.refused.remove(&uid);
        }
        dropped
    }
}

/// A pod that appeared or changed with errors (an unresolved claim, a
/// volume waiting for its VolumeAttachment, a refused SELinux label): one
/// event per error, as the kubelet tells the pod why its volumes cannot
/// be mounted — `FailedMount`, or `FailedAttachVolume` for a volume that
/// waits to be attached. Once per change, not per pass; the event
/// recorder counts repeats.
fn pod_error_events(w: &World, uid: &PodUid, out: &mut Vec<Effect>) {
    use super::effects::{FAILED_ATTACH, FAILED_MOUNT};
    for e in w.dsw.errors_of_pod(uid) {
        let attach = crate::sources::csi_objects::is_attach_wait(e);
        out.push(Effect::PodEvent(PodEvent {
            pod: uid.clone(),
            names: w.pods.get(uid).map(|e| e.pod.clone()),
            reason: if attach { FAILED_ATTACH } else { FAILED_MOUNT },
            message: e.clone(),
        }));
    }
}

/// What the health reports keep of a pod. `namespace` is the last
/// namespace kept, shared by the next pod of the same one.
fn pod_entry(
    p: &crate::sources::DesiredPod,
    namespace: &mut crate::model::SharedStr,
) -> crate::state::PodEntry {
    if **namespace != *p.namespace {
        *namespace = p.namespace.as_str().into();
    }
    crate::state::PodEntry {
        pod: std::sync::Arc::new(crate::state::PodRef {
            namespace: namespace.clone(),
            name: p.name.as_str().into(),
        }),
        claims: (!p.claims.is_empty()).then(|| Box::new(p.claims.clone())),
        from_api: crate::sources::api::is_api_pod(p),
    }
}

/// `events` with the additions and updates of pods that have a target in
/// the ASW moved before those of pods that have none; otherwise in order
/// (removals stay first, `SourcesReady` stays last).
pub(super) fn holders_first(
    events: Vec<SourceEvent>,
    asw: &ActualStateOfWorld,
) -> Vec<SourceEvent> {
    let is_pod =
        |e: &SourceEvent| matches!(e, SourceEvent::PodAdded(_) | SourceEvent::PodUpdated(_));
    if events.iter().filter(|e| is_pod(e)).count() < 2 {
        return events;
    }
    // from the ASW's index by pod: the batch's pods, not the node, are walked
    let holds = |uid: &PodUid| {
        asw.targets_of_pod(uid)
            .any(|(_, _, t)| t.state != crate::model::MountState::NotMounted)
    };
    let rank = |e: &SourceEvent| match e {
        SourceEvent::PodRemoved(_) => 0,
        SourceEvent::PodAdded(p) | SourceEvent::PodUpdated(p) if holds(&p.uid) => 1,
        SourceEvent::PodAdded(_) | SourceEvent::PodUpdated(_) => 2,
        SourceEvent::SourcesReady => 3,
    };
    let mut ranked: Vec<(u8, SourceEvent)> = events.into_iter().map(|e| (rank(&e), e)).collect();
    ranked.sort_by_key(|(r, _)| *r);
    ranked.into_iter().map(|(_, e)| e).collect()
}
