//! The seven `volume_manager_selinux_*` series, with the kubelet's names,
//! types and labels (docs/metrics.md): **gauges** whose
//! names end in `_total`, only ever incremented by one, as the kubelet's
//! `desired_state_of_wold_selinux_metrics.go` does. The container and pod
//! context series are labelled by `access_mode`; the volume context and
//! admitted series by `volume_plugin` and `access_mode`. The increments
//! come from `sources::apply_event` as [`MetricEvent`]s.

use prometheus::{IntGaugeVec, Opts};

use super::{MetricsError, Registrar, register};
use crate::selinux::{Counter, MetricEvent};

/// The seven gauges.
#[derive(Debug, Clone)]
pub struct SeLinuxMetrics {
    gauges: Vec<(Counter, IntGaugeVec)>,
}

const SERIES: [(Counter, &str, &str); 7] = [
    (
        Counter::ContainerErrors,
        "volume_manager_selinux_container_errors_total",
        "Errors translating a container's SELinux options to a label, on volumes that support SELinux mounts.",
    ),
    (
        Counter::ContainerWarnings,
        "volume_manager_selinux_container_warnings_total",
        "Errors translating a container's SELinux options to a label, on volumes that do not support SELinux mounts.",
    ),
    (
        Counter::PodContextMismatchErrors,
        "volume_manager_selinux_pod_context_mismatch_errors_total",
        "Pods whose containers use different SELinux labels on a volume that supports SELinux mounts.",
    ),
    (
        Counter::PodContextMismatchWarnings,
        "volume_manager_selinux_pod_context_mismatch_warnings_total",
        "Pods whose containers use different SELinux labels on a volume that does not support SELinux mounts.",
    ),
    (
        Counter::VolumeContextMismatchErrors,
        "volume_manager_selinux_volume_context_mismatch_errors_total",
        "Pods refused a volume because another pod uses it with a different SELinux label.",
    ),
    (
        Counter::VolumeContextMismatchWarnings,
        "volume_manager_selinux_volume_context_mismatch_warnings_total",
        "Pods sharing a volume with another pod's different SELinux label, on a volume that does not support SELinux mounts.",
    ),
    (
        Counter::VolumesAdmitted,
        "volume_manager_selinux_volumes_admitted_total",
        "Volumes first added to the desired state with an SELinux label.",
    ),
];

impl SeLinuxMetrics {
    pub(super) fn new(r: &Registrar) -> Result<Self, MetricsError> {
        let mut gauges = Vec::with_capacity(SERIES.len());
        for (counter, name, help) in SERIES {
            let labels: &[&str] = if counter.has_plugin_label() {
                &["volume_plugin", "access_mode"]
            } else {
                &["access_mode"]
            };
            let g = register(r, name, || IntGaugeVec::new(Opts::new(name, help), labels))?;
            gauges.push((counter, g));
        }
        Ok(Self { gauges })
    }

    /// Adds one to the event's gauge.
    pub fn record(&self, e: &MetricEvent) {
        let Some((_, g)) = self.gauges.iter().find(|(c, _)| *c == e.counter) else {
            return;
        };
        if e.counter.has_plugin_label() {
            g.with_label_values(&[e.volume_plugin.as_str(), e.access_mode])
                .inc();
        } else {
            g.with_label_values(&[e.access_mode]).inc();
        }
    }

    /// The metric names, for the contract test.
    pub fn names() -> impl Iterator<Item = &'static str> {
        SERIES.iter().map(|(_, n, _)| *n)
    }
}
