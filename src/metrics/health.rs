//! The volume stats and health series: the kubelet's
//! `kubelet_volume_stats_*` gauges and
//! `kubelet_volume_stats_health_status_abnormal`, labelled `namespace` and
//! `persistentvolumeclaim` (PVC-backed volumes only, as the kubelet's
//! collector), and volumed's own counters of the checks.

use prometheus::{Gauge, IntCounter, IntCounterVec, IntGaugeVec, Opts};

use super::{MetricsError, Registrar, register};

const LABELS: [&str; 2] = ["namespace", "persistentvolumeclaim"];

/// (name, help) of the six usage gauges, in [`Figures`] order.
const USAGE: [(&str, &str); 6] = [
    (
        "kubelet_volume_stats_capacity_bytes",
        "Capacity in bytes of the volume",
    ),
    (
        "kubelet_volume_stats_available_bytes",
        "Number of available bytes in the volume",
    ),
    (
        "kubelet_volume_stats_used_bytes",
        "Number of used bytes in the volume",
    ),
    (
        "kubelet_volume_stats_inodes",
        "Maximum number of inodes in the volume",
    ),
    (
        "kubelet_volume_stats_inodes_free",
        "Number of free inodes in the volume",
    ),
    (
        "kubelet_volume_stats_inodes_used",
        "Number of used inodes in the volume",
    ),
];
const ABNORMAL: &str = "kubelet_volume_stats_health_status_abnormal";
const TIMEOUTS: &str = "volumed_health_check_timeouts_total";
const ERRORS: &str = "volumed_health_check_errors_total";
const PASS: &str = "volumed_health_pass_seconds";

/// A volume's usage figures in `USAGE` order (`None`: not reported).
pub(crate) type Figures = [Option<u64>; 6];

/// The health series.
#[derive(Debug, Clone)]
pub struct HealthMetrics {
    usage: Vec<IntGaugeVec>,
    abnormal: IntGaugeVec,
    /// checks abandoned at their timeout (a hung statfs, a silent driver)
    pub timeouts: IntCounter,
    errors: IntCounterVec,
    /// the last pass's duration
    pub pass_seconds: Gauge,
}

impl HealthMetrics {
    pub(super) fn new(r: &Registrar) -> Result<Self, MetricsError> {
        let mut usage = Vec::with_capacity(USAGE.len());
        for (name, help) in USAGE {
            usage.push(register(r, name, || {
                IntGaugeVec::new(Opts::new(name, help), &LABELS)
            })?);
        }
        let abnormal = register(r, ABNORMAL, || {
            IntGaugeVec::new(
                Opts::new(
                    ABNORMAL,
                    "Abnormal volume health status. The count is either 1 or 0. 1 indicates the volume is unhealthy, 0 indicates volume is healthy",
                ),
                &LABELS,
            )
        })?;
        let timeouts = register(r, TIMEOUTS, || {
            IntCounter::new(TIMEOUTS, "Volume health checks abandoned at their timeout.")
        })?;
        let errors = register(r, ERRORS, || {
            IntCounterVec::new(
                Opts::new(
                    ERRORS,
                    "Volume health checks that failed (the last condition stays), by source.",
                ),
                &["source"],
            )
        })?;
        for s in ["csi", "native"] {
            errors.with_label_values(&[s]);
        }
        let pass_seconds = register(r, PASS, || {
            Gauge::new(PASS, "Duration of the last volume health pass.")
        })?;
        Ok(Self {
            usage,
            abnormal,
            timeouts,
            errors,
            pass_seconds,
        })
    }

    /// Sets one PVC's series; a figure or condition not known is removed.
    pub fn set(&self, namespace: &str, claim: &str, figures: &Figures, abnormal: Option<bool>) {
        let labels = [namespace, claim];
        for (g, v) in self.usage.iter().zip(figures) {
            match v {
                Some(v) => g
                    .with_label_values(&labels)
                    .set(i64::try_from(*v).unwrap_or(i64::MAX)),
                None => {
                    let _ = g.remove_label_values(&labels);
                }
            }
        }
        match abnormal {
            Some(a) => self.abnormal.with_label_values(&labels).set(i64::from(a)),
            None => {
                let _ = self.abnormal.remove_label_values(&labels);
            }
        }
    }

    /// Removes one PVC's series (its volume is no longer mounted).
    pub fn forget(&self, namespace: &str, claim: &str) {
        self.set(namespace, claim, &[None; 6], None);
    }

    /// Counts a failed check of `source` (`csi` or `native`).
    pub fn error(&self, source: &str) {
        self.errors.with_label_values(&[source]).inc();
    }
}
