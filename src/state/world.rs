//! The caches the reconciler loop mutates under one lock and the HTTP
//! provider and the runtime API read: the [`World`] (DSW, ASW, what
//! reconstruction found unmounted outside, readiness, the listed pods'
//! names and claims).

use std::sync::Arc;

use crate::model::SharedStr;

use super::{ActualStateOfWorld, DesiredStateOfWorld, UnmountedOutside};

/// The caches the loop mutates and the HTTP provider reads.
#[derive(Debug, Default)]
pub struct World {
    /// desired state
    pub dsw: DesiredStateOfWorld,
    /// actual state
    pub asw: ActualStateOfWorld,
    /// what reconstruction found unmounted outside volumed (`/debug/state`)
    pub unmounted_outside: Vec<UnmountedOutside>,
    /// every pod source has listed (`/readyz`; see `core::Phase::ready`)
    pub ready: bool,
    /// the listed pods' names and claims (health reports)
    pub pods: std::collections::BTreeMap<crate::model::PodUid, PodEntry>,
}

impl World {
    /// The ASW's and the DSW's volumes and the listed pods: the measure of
    /// the node [`World::repack`] is timed by.
    pub fn size(&self) -> usize {
        self.asw.volume_count() + self.dsw.volume_count() + self.pods.len()
    }

    /// Repacks the states' maps and the pods' (see `util::repack`): the
    /// same entries, in full nodes.
    pub fn repack(&mut self) {
        self.asw.repack();
        self.dsw.repack();
        crate::util::repack::repack(&mut self.pods);
    }
}

/// A pod's names, for events and reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    /// `metadata.namespace` (shared: a node's pods come from a few)
    pub namespace: SharedStr,
    /// `metadata.name`
    pub name: Box<str>,
}

/// What the daemon keeps of a listed pod for the reports: its names and,
/// per pod volume name, the claim it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEntry {
    /// namespace and name
    pub pod: Arc<PodRef>,
    /// pod volume name → claim name (in the pod's namespace); `None` for
    /// none (boxed: most pods name no claim, and the daemon keeps one entry
    /// per pod)
    pub claims: Option<Box<std::collections::BTreeMap<String, String>>>,
    /// the API server lists it (its status there is volumed's to report)
    pub from_api: bool,
}

impl PodEntry {
    /// The claim pod volume `outer_name` names, if any.
    pub fn claim(&self, outer_name: &str) -> Option<&String> {
        self.claims.as_ref().and_then(|c| c.get(outer_name))
    }
}
