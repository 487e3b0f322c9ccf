//! SELinux mount labels (KEP-1710): which label a pod's volume is mounted
//! with, when `-o context=` is used at all, and what a conflict between
//! pods does. docs/selinux.md is the user's view; docs/kubelet.md says where
//! we differ from the kubelet. volumed follows Kubernetes
//! [`gates::KUBERNETES_VERSION`].
//!
//! - [`gates`]: `--feature-gates` (`SELinuxMountReadWriteOncePod`,
//!   `SELinuxMount`, `SELinuxChangePolicy`) with their defaults;
//! - [`host`]: whether the host does SELinux (as `/bin/mount` decides) and
//!   the policy's default container file label;
//! - `label`: the pure per-(pod, volume) decision, [`volume_label`].
//!
//! Where the rest lives: the DSW compares labels between pods
//! (`state::DesiredStateOfWorld::add_pod_to_volume`, with the
//! [`LabelCheck`](crate::state::LabelCheck) computed here); the ASW tracks the
//! label each target was mounted with and reports a mismatch
//! (`state::ActualStateOfWorld::pod_exists_in_volume`), which makes the
//! reconciler tear the volume down and mount it again with the new label
//! once the old pod is gone; the plugins put the quoted `context="…"` on
//! superblock mounts (`plugins::mount_ops::data_string`); reconstruction
//! compares the journal's label with `context=` in the mount table
//! (`reconstruct::classify`). `sources::apply_event` calls [`volume_label`]
//! and returns the [`MetricEvent`]s the daemon counts in the seven
//! `volume_manager_selinux_*` gauges.
//!
//! *Invariant:* with SELinux off on the host ([`Policy::host`] `None`) no
//! label is ever computed, so no `context=` can reach the kernel (a raw
//! `mount(2)` would fail with EINVAL there).

pub mod gates;
pub mod host;
pub(crate) mod label;

#[cfg(test)]
mod tests;

pub use gates::{FeatureGates, GateError};
pub use host::{FileDefaults, HostFacts, SeLinuxHostError, SeLinuxMode};
pub use label::{
    ContainerKind, ContainerSeLinux, PodSeLinux, Problem, ProblemKind, SeLinuxOptions, VolumeLabel,
    access_mode_label, file_label, plugin_supports_context_mount, volume_label,
    volume_plugin_label, volume_supports_selinux_mount,
};

/// Everything the label rules need, fixed at startup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// the feature gates
    pub gates: FeatureGates,
    /// the host's default file label parts; `None` when the host does not
    /// do SELinux (or `--selinux disabled`): then no label is computed
    pub host: Option<FileDefaults>,
}

impl Policy {
    /// No SELinux: no label anywhere.
    pub fn disabled() -> Self {
        Self {
            gates: FeatureGates::default(),
            host: None,
        }
    }

    /// SELinux on with these gates and defaults.
    pub fn enabled(gates: FeatureGates, defaults: FileDefaults) -> Self {
        Self {
            gates,
            host: Some(defaults),
        }
    }

    /// Whether any volume can get a label (a host that does SELinux, and
    /// the gate of the first wave on): without it no label is computed,
    /// so no pod is ever refused a volume for one.
    pub fn labels_volumes(&self) -> bool {
        self.host.is_some() && self.gates.rwop
    }
}

impl Default for Policy {
    fn default() -> Self {
        Self::disabled()
    }
}

/// Which of the seven `volume_manager_selinux_*` gauges an event adds to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Counter {
    /// `volume_manager_selinux_container_errors_total`
    ContainerErrors,
    /// `volume_manager_selinux_container_warnings_total`
    ContainerWarnings,
    /// `volume_manager_selinux_pod_context_mismatch_errors_total`
    PodContextMismatchErrors,
    /// `volume_manager_selinux_pod_context_mismatch_warnings_total`
    PodContextMismatchWarnings,
    /// `volume_manager_selinux_volume_context_mismatch_errors_total`
    VolumeContextMismatchErrors,
    /// `volume_manager_selinux_volume_context_mismatch_warnings_total`
    VolumeContextMismatchWarnings,
    /// `volume_manager_selinux_volumes_admitted_total`
    VolumesAdmitted,
}

impl Counter {
    /// For a label problem: which gauge, by kind and severity.
    pub fn for_problem(p: &Problem) -> Self {
        match (p.kind, p.fatal) {
            (ProblemKind::Translation, true) => Counter::ContainerErrors,
            (ProblemKind::Translation, false) => Counter::ContainerWarnings,
            (ProblemKind::PodContextMismatch, true) => Counter::PodContextMismatchErrors,
            (ProblemKind::PodContextMismatch, false) => Counter::PodContextMismatchWarnings,
        }
    }

    /// Whether the gauge has a `volume_plugin` label (the other three have
    /// only `access_mode`).
    pub fn has_plugin_label(self) -> bool {
        matches!(
            self,
            Counter::VolumeContextMismatchErrors
                | Counter::VolumeContextMismatchWarnings
                | Counter::VolumesAdmitted
        )
    }
}

/// One increment of a `volume_manager_selinux_*` gauge, with its labels.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct MetricEvent {
    /// the gauge
    pub counter: Counter,
    /// `volume_plugin` (ignored by gauges without it)
    pub volume_plugin: String,
    /// `access_mode`
    pub access_mode: &'static str,
}

impl MetricEvent {
    /// An event for `spec`'s labels.
    pub fn new(counter: Counter, spec: &crate::model::VolumeSpec) -> Self {
        Self {
            counter,
            volume_plugin: volume_plugin_label(spec),
            access_mode: access_mode_label(spec),
        }
    }
}
