//! Which API pods refer to which object: **the one index** the API source
//! keeps of it. A claim's users are marked dirty when the claim (or its
//! PV, or its VolumeAttachment) changes; ConfigMaps, Secrets and service
//! account tokens are *followed* — one watch per object by name, one
//! TokenRequest keeper per token — exactly while some pod refers to them,
//! as the kubelet's watch-based ConfigMap and Secret managers and its token
//! manager do.
//!
//! A pod's refs come in two parts: what its spec names (claims, its
//! payload volumes' objects and tokens), known when the pod arrives, and
//! what resolving it found (the Secrets its claims' CSI PVs name). An
//! object is referred to while either part of any pod names it.
//!
//! A followed object that has not reported yet (no list answered, no
//! TokenRequest returned) *holds* its pods: they are not resolved until it
//! does, so a pod's first payload is not an error just because its
//! ConfigMap's watch was a moment behind the pod's (the kubelet waits for
//! its object cache to sync in the same way). A watch or request that
//! fails reports too — the error — so nothing is held for long.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{PodUid, TokenRef};

/// An object an API pod refers to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectRef {
    /// a PersistentVolumeClaim (namespace, name): its changes are watched
    /// with every claim's, not by name
    Claim(String, String),
    /// a ConfigMap (namespace, name)
    ConfigMap(String, String),
    /// a Secret (namespace, name): a payload's or a CSI volume's
    Secret(String, String),
    /// a service account token bound to the pod
    Token(TokenRef),
}

impl ObjectRef {
    /// Whether the source follows it one by one (a watch or a keeper).
    pub fn followed(&self) -> bool {
        !matches!(self, ObjectRef::Claim(..))
    }
}

/// Which part of a pod's refs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// what the pod's spec names
    Spec,
    /// what resolving it found
    Resolved,
}

/// What to start and stop following since the last look: a change costs
/// what changed, never a walk of every followed object (a node's first
/// list brings one token per pod).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FollowChanges {
    /// stopped first: no pod refers to these any more
    pub stop: BTreeSet<ObjectRef>,
    /// then started: newly referred to (both: named again after nobody
    /// did, followed afresh so its pods get a first report again)
    pub start: BTreeSet<ObjectRef>,
}

impl FollowChanges {
    fn is_empty(&self) -> bool {
        self.stop.is_empty() && self.start.is_empty()
    }
}

/// Pods ↔ the objects they refer to, both ways.
#[derive(Debug, Default)]
pub struct PodRefs {
    of: BTreeMap<PodUid, [BTreeSet<ObjectRef>; 2]>,
    users: BTreeMap<ObjectRef, BTreeSet<PodUid>>,
    /// what changed since [`PodRefs::take_follow_changes`]
    pending: FollowChanges,
    /// followed refs that have reported since they were first referred to
    reported: BTreeSet<ObjectRef>,
}

impl PodRefs {
    /// Sets one part of `pod`'s refs.
    pub fn set(&mut self, pod: &PodUid, part: Part, now: BTreeSet<ObjectRef>) {
        let entry = self.of.entry(pod.clone()).or_default();
        let before: BTreeSet<ObjectRef> = entry[0].union(&entry[1]).cloned().collect();
        entry[part as usize] = now;
        let after: BTreeSet<ObjectRef> = entry[0].union(&entry[1]).cloned().collect();
        if after.is_empty() {
            self.of.remove(pod);
        }
        self.update(pod, &before, &after);
    }

    /// Forgets every ref of `pod` (it is gone).
    pub fn forget(&mut self, pod: &PodUid) {
        let Some([a, b]) = self.of.remove(pod) else {
            return;
        };
        let before = a.union(&b).cloned().collect();
        self.update(pod, &before, &BTreeSet::new());
    }

    fn update(&mut self, pod: &PodUid, before: &BTreeSet<ObjectRef>, after: &BTreeSet<ObjectRef>) {
        for gone in before.difference(after) {
            if let Some(users) = self.users.get_mut(gone) {
                users.remove(pod);
                if users.is_empty() {
                    self.users.remove(gone);
                    self.reported.remove(gone);
                    // one never started is simply not started
                    if gone.followed() && !self.pending.start.remove(gone) {
                        self.pending.stop.insert(gone.clone());
                    }
                }
            }
        }
        for new in after.difference(before) {
            let users = self.users.entry(new.clone()).or_default();
            if users.is_empty() && new.followed() {
                self.pending.start.insert(new.clone());
            }
            users.insert(pod.clone());
        }
    }

    /// The pods that refer to `r`.
    pub fn users<'a>(&'a self, r: &ObjectRef) -> impl Iterator<Item = &'a PodUid> + use<'a> {
        self.users.get(r).into_iter().flatten()
    }

    /// What to stop and start following since the last call, if anything.
    pub fn take_follow_changes(&mut self) -> Option<FollowChanges> {
        let c = std::mem::take(&mut self.pending);
        (!c.is_empty()).then_some(c)
    }

    /// `r` reported (an object, its absence, or an error): it holds its
    /// pods no longer. Whether some pod still refers to it.
    pub fn reported(&mut self, r: &ObjectRef) -> bool {
        let used = self.users.contains_key(r);
        if used {
            self.reported.insert(r.clone());
        }
        used
    }

    /// Whether `pod` waits for a followed object's first report.
    pub fn holds(&self, pod: &PodUid) -> bool {
        self.of.get(pod).is_some_and(|parts| {
            parts
                .iter()
                .flatten()
                .any(|r| r.followed() && !self.reported.contains(r))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uid(s: &str) -> PodUid {
        PodUid::new(s).unwrap()
    }
    fn cm(n: &str) -> ObjectRef {
        ObjectRef::ConfigMap("ns".into(), n.into())
    }
    fn refs(r: &[ObjectRef]) -> BTreeSet<ObjectRef> {
        r.iter().cloned().collect()
    }
    fn start(r: &[ObjectRef]) -> FollowChanges {
        FollowChanges {
            start: refs(r),
            ..FollowChanges::default()
        }
    }
    fn stop(r: &[ObjectRef]) -> FollowChanges {
        FollowChanges {
            stop: refs(r),
            ..FollowChanges::default()
        }
    }

    #[test]
    fn an_object_is_followed_while_either_part_of_any_pod_names_it() {
        let mut p = PodRefs::default();
        let claim = ObjectRef::Claim("ns".into(), "c".into());
        p.set(&uid("a"), Part::Spec, refs(&[cm("x"), claim.clone()]));
        assert_eq!(
            p.take_follow_changes(),
            Some(start(&[cm("x")])),
            "claims are not followed"
        );
        assert_eq!(p.take_follow_changes(), None, "told once");
        p.set(&uid("b"), Part::Resolved, refs(&[cm("x")]));
        assert_eq!(
            p.take_follow_changes(),
            None,
            "a second user changes nothing"
        );
        p.forget(&uid("a"));
        assert_eq!(p.take_follow_changes(), None, "b still names it");
        assert_eq!(p.users(&claim).count(), 0, "a's claim is forgotten");
        p.set(&uid("b"), Part::Spec, refs(&[cm("x")]));
        p.set(&uid("b"), Part::Resolved, BTreeSet::new());
        assert_eq!(
            p.take_follow_changes(),
            None,
            "moved between parts, still named"
        );
        p.forget(&uid("b"));
        assert_eq!(
            p.take_follow_changes(),
            Some(stop(&[cm("x")])),
            "nobody: stop it"
        );
    }

    #[test]
    fn changes_between_two_looks_add_up_to_what_to_stop_and_start() {
        let mut p = PodRefs::default();
        p.set(&uid("a"), Part::Spec, refs(&[cm("x")]));
        p.forget(&uid("a"));
        assert_eq!(p.take_follow_changes(), None, "gone before it started");
        p.set(&uid("a"), Part::Spec, refs(&[cm("x"), cm("y")]));
        let _ = p.take_follow_changes();
        p.forget(&uid("a"));
        p.set(&uid("b"), Part::Spec, refs(&[cm("x"), cm("z")]));
        assert_eq!(
            p.take_follow_changes(),
            Some(FollowChanges {
                // x: named again after nobody did, followed afresh
                stop: refs(&[cm("x"), cm("y")]),
                start: refs(&[cm("x"), cm("z")]),
            })
        );
        assert!(p.holds(&uid("b")), "x must report again");
    }

    #[test]
    fn a_pod_is_held_until_each_followed_object_reported() {
        let mut p = PodRefs::default();
        p.set(&uid("a"), Part::Spec, refs(&[cm("x"), cm("y")]));
        assert!(p.holds(&uid("a")));
        assert!(p.reported(&cm("x")));
        assert!(p.holds(&uid("a")), "y has not");
        assert!(p.reported(&cm("y")));
        assert!(!p.holds(&uid("a")));
        assert!(!p.reported(&cm("z")), "nobody names z");
        // named again after nobody did: a new watch, held again
        p.forget(&uid("a"));
        p.set(&uid("b"), Part::Spec, refs(&[cm("x")]));
        assert!(p.holds(&uid("b")));
    }
}
