//! The metrics volumed exports on `/metrics`: the kubelet's exact names and
//! labels, plus volumed's own `volumed_*` series (docs/metrics.md lists
//! them all).
//!
//! One [`Metrics`] owns one prometheus [`Registry`]. Metrics are grouped by
//! the subsystem that increments them, one struct of typed handles per group
//! ([`ReconstructMetrics`]; `operations::OperationMetrics`: volume manager
//! gauges, storage operation durations, plugin operations, orphan and
//! forced cleanup; `selinux::SeLinuxMetrics`); [`Metrics::new`] creates
//! every group and registers every handle in one place, so a metric that
//! exists is a metric that is exported.
//!
//! # Reconstruction counters
//!
//! - `reconstruct_volume_operations_total` (counter, no labels): the kubelet
//!   increments it once per pod volume dir it tries to reconstruct, failed
//!   or not. volumed counts the same: +1 per **pod** target found on the
//!   host (mounted, or its directory present — decided or failed). Device
//!   targets and targets only the journal knows are not reconstructions the
//!   kubelet would count; they show up in `volumed_reconstruct_decisions_total`.
//! - `reconstruct_volume_operations_errors_total` (counter, no labels): +1
//!   per pod target found on the host that could not be rebuilt (unknown
//!   plugin, missing `vol_data.json`), as the kubelet counts its failures.
//!   Always ≤ the total above.
//! - `volumed_reconstruct_decisions_total{target, result, reason}`: +1 per
//!   decision, `target` `device`|`pod`, `result` `mounted`|`uncertain`|
//!   `not_mounted`, `reason` the merge-table row (`Reason::as_str`). A
//!   target that could not be rebuilt counts as `result="uncertain",
//!   reason="rebuild_failed"`: it may still be mounted, and forced cleanup
//!   treats it so. Every label combination is created at zero by the
//!   first count (`reconstruct::record_metrics`, at the first phase, before
//!   the HTTP server serves), even one that decided nothing.
//!
//! *Invariant:* only this module knows the prometheus crate; callers record
//! through functions taking domain types.

use prometheus::{Encoder, Gauge, IntCounter, IntCounterVec, Opts, Registry, TextEncoder};

pub(crate) mod health;
pub(crate) mod journal;
pub(crate) mod operations;
pub(crate) mod runtime_api;
pub(crate) mod selinux;

pub use health::HealthMetrics;
pub use journal::JournalMetrics;
pub use operations::{OperationMetrics, StorageOperation};
pub use runtime_api::RuntimeApiMetrics;
pub use selinux::SeLinuxMetrics;

/// Errors of the metrics module.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// creating or registering a metric failed (a duplicate or invalid name)
    #[error("register metric {name}")]
    Register {
        /// the metric's name
        name: &'static str,
        /// the cause
        #[source]
        source: prometheus::Error,
    },
}

/// The reconstruction metrics (see the module doc for what they count).
#[derive(Debug, Clone)]
pub struct ReconstructMetrics {
    /// `reconstruct_volume_operations_total`
    pub operations_total: IntCounter,
    /// `reconstruct_volume_operations_errors_total`
    pub operations_errors_total: IntCounter,
    /// `volumed_reconstruct_decisions_total{target,result,reason}`
    pub decisions_total: IntCounterVec,
    /// `volumed_reconstruct_seconds`: startup to a ready ASW (phase 1:
    /// the journal and one read of the mount table), set once per start
    pub seconds: Gauge,
}

/// Every metric volumed exports, registered in one registry.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// every registered family's name, in registration order
    names: Vec<String>,
    /// reconstruction
    pub reconstruct: ReconstructMetrics,
    /// operations, volumes, cleanup
    pub ops: OperationMetrics,
    /// the `volume_manager_selinux_*` gauges
    pub selinux: SeLinuxMetrics,
    /// volume stats and health
    pub health: HealthMetrics,
    /// the journal's flushes, durable watermark and what it keeps aside
    pub journal: JournalMetrics,
    /// the runtime API's long-polls
    pub runtime_api: RuntimeApiMetrics,
}

const OPERATIONS_TOTAL: &str = "reconstruct_volume_operations_total";
const OPERATIONS_ERRORS_TOTAL: &str = "reconstruct_volume_operations_errors_total";
const DECISIONS_TOTAL: &str = "volumed_reconstruct_decisions_total";
const SECONDS: &str = "volumed_reconstruct_seconds";

/// The registry being filled, and the names of what was registered: the
/// prometheus registry exports a family only once it has a series, so the
/// names are kept here for [`Metrics::names`] (the dashboard's check).
#[derive(Default)]
pub(crate) struct Registrar {
    registry: Registry,
    names: std::cell::RefCell<Vec<String>>,
}

/// Creates a metric and registers it, naming it in the error.
pub(crate) fn register<M: prometheus::core::Collector + Clone + 'static>(
    r: &Registrar,
    name: &'static str,
    make: impl FnOnce() -> prometheus::Result<M>,
) -> Result<M, MetricsError> {
    let err = |source| MetricsError::Register { name, source };
    let metric = make().map_err(err)?;
    r.registry.register(Box::new(metric.clone())).map_err(err)?;
    let descs = metric.desc();
    r.names
        .borrow_mut()
        .extend(descs.iter().map(|d| d.fq_name.clone()));
    Ok(metric)
}

impl ReconstructMetrics {
    fn new(registry: &Registrar) -> Result<Self, MetricsError> {
        let operations_total = register(registry, OPERATIONS_TOTAL, || {
            IntCounter::new(
                OPERATIONS_TOTAL,
                "Pod volume dirs found on the host that startup tried to reconstruct, whether it succeeded or not.",
            )
        })?;
        let operations_errors_total = register(registry, OPERATIONS_ERRORS_TOTAL, || {
            IntCounter::new(
                OPERATIONS_ERRORS_TOTAL,
                "Pod volume dirs found on the host that startup could not reconstruct.",
            )
        })?;
        let decisions_total = register(registry, DECISIONS_TOTAL, || {
            IntCounterVec::new(
                Opts::new(
                    DECISIONS_TOTAL,
                    "Reconstruction decisions per target, by decided state and merge-table reason.",
                ),
                &["target", "result", "reason"],
            )
        })?;
        let seconds = register(registry, SECONDS, || {
            Gauge::new(
                SECONDS,
                "Seconds from startup to a ready ASW at the last start (reconstruction's first phase).",
            )
        })?;
        Ok(Self {
            operations_total,
            operations_errors_total,
            decisions_total,
            seconds,
        })
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Result<Self, MetricsError> {
        let r = Registrar::default();
        let reconstruct = ReconstructMetrics::new(&r)?;
        let ops = OperationMetrics::new(&r)?;
        let selinux = SeLinuxMetrics::new(&r)?;
        let health = HealthMetrics::new(&r)?;
        let journal = JournalMetrics::new(&r)?;
        let runtime_api = RuntimeApiMetrics::new(&r)?;
        Ok(Self {
            registry: r.registry,
            names: r.names.into_inner(),
            reconstruct,
            ops,
            selinux,
            health,
            journal,
            runtime_api,
        })
    }

    /// The registry (for the HTTP server).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The name of every metric family registered, whether or not it has
    /// a series yet (a histogram's `_bucket`, `_sum` and `_count` are its
    /// family's).
    pub fn names(&self) -> &[String] {
        &self.names
    }
}

/// Every registered metric in the text exposition format.
pub fn gather_text(metrics: &Metrics) -> String {
    let mut buf = Vec::new();
    // Encoding into a Vec fails only on a metric family the encoder cannot
    // represent, which our registrations never produce; an empty answer is
    // better than a panic on /metrics.
    if let Err(e) = TextEncoder::new().encode(&metrics.registry.gather(), &mut buf) {
        tracing::error!(error = %e, "encode metrics");
    }
    String::from_utf8_lossy(&buf).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::TargetKey;
    use crate::model::{
        MountIdentity, MountState, PluginName, PodUid, TargetKind, TargetParams, TargetRef,
        UniqueVolumeName,
    };
    use crate::reconstruct::{
        Boot, Decision, FailedTarget, HostObservation, JournalSays, Leftover, RebuildFailure,
    };
    use crate::reconstruct::{HostSays, MergeOutput, Reason};

    fn decision(target: TargetRef, result: MountState, reason: Reason, seen: bool) -> Decision {
        let volume = UniqueVolumeName::from_raw("kubernetes.io/local-volume/pv1");
        Decision {
            key: TargetKey {
                volume: volume.clone(),
                target: target.clone(),
            },
            kind: TargetKind::Mount,
            journal_says: JournalSays::MountedWith,
            host_says: if seen {
                HostSays::Matches
            } else {
                HostSays::Absent
            },
            boot: Boot::Same,
            result,
            reason,
            params: TargetParams::at(
                volume,
                PluginName::LocalVolume,
                "pv1".into(),
                target,
                TargetKind::Mount,
                None,
            )
            .into(),
            observed: seen.then(|| MountIdentity {
                dev: crate::model::DevId { major: 7, minor: 0 },
                root: "/".into(),
                fs_type: "ext4".into(),
                read_only: false,
                selinux: None,
            }),
        }
    }

    fn line_value(text: &str, series: &str) -> Option<String> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ').map(str::to_owned))
    }

    #[test]
    fn every_series_exists_once_a_reconstruction_that_decided_nothing_is_counted() {
        let m = Metrics::new().unwrap();
        let text = gather_text(&m);
        assert_eq!(line_value(&text, OPERATIONS_TOTAL).as_deref(), Some("0"));
        assert_eq!(
            line_value(&text, OPERATIONS_ERRORS_TOTAL).as_deref(),
            Some("0")
        );
        crate::reconstruct::record_metrics(&m, &MergeOutput::default());
        let text = gather_text(&m);
        let decisions = text
            .lines()
            .filter(|l| l.starts_with(&format!("{DECISIONS_TOTAL}{{")))
            .count();
        assert_eq!(decisions, 2 * 3 * Reason::ALL.len());
    }

    #[test]
    fn record_reconstruction_counts_pod_dirs_failures_and_decisions() {
        let pod = |s: &str| TargetRef::Pod(PodUid::new(s).unwrap());
        let gone = decision(
            pod("p3"),
            MountState::NotMounted,
            Reason::HostLeftover,
            false,
        );
        let out = MergeOutput {
            decisions: vec![
                decision(
                    TargetRef::Device,
                    MountState::Mounted,
                    Reason::MountedMatches,
                    true,
                ),
                decision(pod("p1"), MountState::Mounted, Reason::MountedMatches, true),
                decision(
                    pod("p2"),
                    MountState::NotMounted,
                    Reason::UnmountedOutside,
                    false,
                ),
                gone.clone(),
            ],
            failed: vec![FailedTarget {
                path: "/r/pods/p4/volumes/kubernetes.io~secret/s".into(),
                target: pod("p4"),
                plugin_name: "kubernetes.io/secret".into(),
                spec_name: "s".into(),
                cause: RebuildFailure::UnknownPlugin,
                observation: HostObservation::DirPresent,
            }],
            orphan_leftovers: vec![Leftover {
                key: gone.key.clone(),
                path: "/r/pods/p3/x".into(),
                dir_present: true,
            }],
            ..MergeOutput::default()
        };
        let m = Metrics::new().unwrap();
        crate::reconstruct::record_metrics(&m, &out);
        let text = gather_text(&m);
        // p1 (mounted), p3 (its dir is there), p4 (failed); not p2 (absent), not the device.
        assert_eq!(line_value(&text, OPERATIONS_TOTAL).as_deref(), Some("3"));
        assert_eq!(
            line_value(&text, OPERATIONS_ERRORS_TOTAL).as_deref(),
            Some("1")
        );
        let series = |t: &str, r: &str, why: &str| {
            line_value(
                &text,
                &format!(r#"{DECISIONS_TOTAL}{{reason="{why}",result="{r}",target="{t}"}}"#),
            )
        };
        assert_eq!(
            series("device", "mounted", "mounted_matches").as_deref(),
            Some("1")
        );
        assert_eq!(
            series("pod", "mounted", "mounted_matches").as_deref(),
            Some("1")
        );
        assert_eq!(
            series("pod", "not_mounted", "unmounted_outside").as_deref(),
            Some("1")
        );
        assert_eq!(
            series("pod", "not_mounted", "host_leftover").as_deref(),
            Some("1")
        );
        assert_eq!(
            series("pod", "uncertain", "rebuild_failed").as_deref(),
            Some("1")
        );
        assert_eq!(
            series("device", "uncertain", "rebuilt_from_host").as_deref(),
            Some("0")
        );
    }

    /// The metrics contract (docs/metrics.md): every metric named there
    /// is registered, has a recording site, and appears on /metrics.
    #[test]
    fn every_metric_design_md_names_is_exported() {
        use crate::model::{Operation, PluginName};
        let m = Metrics::new().unwrap();
        // one recording through each site the daemon uses
        m.ops
            .plugin_operation(PluginName::EmptyDir, Operation::SetUp);
        m.ops.storage_operation(
            PluginName::EmptyDir.as_str(),
            StorageOperation::VolumeMount,
            true,
            std::time::Duration::from_millis(5),
        );
        m.ops
            .set_total_volumes(&[(PluginName::EmptyDir, "desired_state_of_world", 1)]);
        m.ops.orphan_cleaned.set(0);
        m.ops.orphan_cleaned_errors.set(0);
        crate::reconstruct::record_metrics(&m, &crate::reconstruct::MergeOutput::default());
        let rwop_pv = crate::model::VolumeSpec::Local {
            path: "/dev/loop9".into(),
            fs_type: Some("ext4".into()),
            access_modes: vec![crate::model::AccessMode::ReadWriteOncePod],
            mount_options: Default::default(),
            is_block: true,
            volume_mode: Default::default(),
        };
        use crate::selinux::{Counter, MetricEvent};
        for c in [
            Counter::ContainerErrors,
            Counter::ContainerWarnings,
            Counter::PodContextMismatchErrors,
            Counter::PodContextMismatchWarnings,
            Counter::VolumeContextMismatchErrors,
            Counter::VolumeContextMismatchWarnings,
            Counter::VolumesAdmitted,
        ] {
            m.selinux.record(&MetricEvent::new(c, &rwop_pv));
        }
        m.health.set(
            "default",
            "data",
            &[Some(1), Some(2), Some(3), Some(4), Some(5), Some(6)],
            Some(true),
        );
        m.health.timeouts.inc();
        m.health.error("csi");
        m.health.pass_seconds.set(0.5);
        m.reconstruct.seconds.set(0.25);
        let text = gather_text(&m);
        for n in SeLinuxMetrics::names() {
            assert!(text.contains(&format!("# TYPE {n} gauge")), "{n}:\n{text}");
        }
        assert!(text.contains(r#"volume_manager_selinux_volume_context_mismatch_errors_total{access_mode="RWOP",volume_plugin="kubernetes.io/local-volume"} 1"#), "{text}");
        assert!(
            text.contains(
                r#"volume_manager_selinux_pod_context_mismatch_errors_total{access_mode="RWOP"} 1"#
            ),
            "{text}"
        );
        let names = [
            "reconstruct_volume_operations_total",
            "reconstruct_volume_operations_errors_total",
            "force_cleaned_failed_volume_operations_total",
            "force_cleaned_failed_volume_operation_errors_total",
            "volume_manager_total_volumes",
            "storage_operation_duration_seconds",
            "kubelet_orphan_pod_cleaned_volumes",
            "kubelet_orphan_pod_cleaned_volumes_errors",
            "volumed_plugin_operations_total",
            "volumed_unmounted_outside_total",
            "volumed_nested_mounts_left_total",
            "volumed_reconstruct_decisions_total",
            "kubelet_volume_stats_capacity_bytes",
            "kubelet_volume_stats_available_bytes",
            "kubelet_volume_stats_used_bytes",
            "kubelet_volume_stats_inodes",
            "kubelet_volume_stats_inodes_free",
            "kubelet_volume_stats_inodes_used",
            "kubelet_volume_stats_health_status_abnormal",
            "volumed_health_check_timeouts_total",
            "volumed_health_check_errors_total",
            "volumed_health_pass_seconds",
            "volumed_reconstruct_seconds",
            "csi_operations_seconds",
            "volumed_csi_selinux_label_ignored_total",
        ];
        for n in names {
            assert!(
                m.names().iter().any(|r| r == n),
                "{n} is not in names(): {:?}",
                m.names()
            );
            if !n.starts_with("csi_") && !n.starts_with("volumed_csi") {
                assert!(
                    text.contains(&format!("# TYPE {n} ")),
                    "{n} is not on /metrics:\n{text}"
                );
            }
        }
        // names() is every family /metrics can show, each once
        let mut seen = std::collections::BTreeSet::new();
        for n in m.names() {
            assert!(seen.insert(n), "{n} twice");
        }
        for line in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
            let family = line.split(' ').next().unwrap_or_default();
            assert!(seen.contains(&family.to_owned()), "{family} not in names()");
        }
        assert!(text.contains(r#"storage_operation_duration_seconds_count{migrated="false",operation_name="volume_mount",status="success",volume_plugin="kubernetes.io/empty-dir"} 1"#), "{text}");
        assert!(text.contains(r#"volume_manager_total_volumes{plugin_name="kubernetes.io/empty-dir",state="desired_state_of_world"} 1"#), "{text}");
        assert!(text.contains(r#"kubelet_volume_stats_health_status_abnormal{namespace="default",persistentvolumeclaim="data"} 1"#), "{text}");
        assert!(text.contains(r#"kubelet_volume_stats_inodes_used{namespace="default",persistentvolumeclaim="data"} 6"#), "{text}");
    }
}
