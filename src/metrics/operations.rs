//! The daemon's operation metrics: the kubelet's
//! `storage_operation_duration_seconds`, `volume_manager_total_volumes`,
//! orphan-cleanup and forced-cleanup series (exact names and labels,
//! docs/metrics.md), and volumed's own
//! `volumed_plugin_operations_total`, `volumed_unmounted_outside_total` and
//! `volumed_nested_mounts_left_total{plugin}` (+1 per TearDown attempt that
//! found mounts beneath a directory volume and left it in place: the
//! operation fails and is retried, so a steady rate means a stuck volume),
//! and `volumed_csi_selinux_label_ignored_total{driver_name}` (+1 per CSI
//! call that was asked to mount with `context=` and left a mount without
//! that label: the driver does not apply the label; see `executor`).

use std::time::Duration;

use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
};

use super::{MetricsError, Registrar, register};
use crate::model::{Operation, PluginName};

/// The kubelet's buckets for `storage_operation_duration_seconds`.
pub(crate) const STORAGE_BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];

/// The operation metrics.
#[derive(Debug, Clone)]
pub struct OperationMetrics {
    /// `storage_operation_duration_seconds{volume_plugin,operation_name,status,migrated}`
    pub storage_duration: HistogramVec,
    /// `volumed_plugin_operations_total{plugin,operation}`
    pub plugin_operations: IntCounterVec,
    /// `volumed_unmounted_outside_total`
    pub unmounted_outside: IntCounter,
    /// `volumed_nested_mounts_left_total{plugin}`
    pub nested_mounts_left: IntCounterVec,
    /// `volume_manager_total_volumes{plugin_name,state}`
    pub total_volumes: IntGaugeVec,
    /// `volumed_csi_selinux_label_ignored_total{driver_name}`
    pub csi_label_ignored: IntCounterVec,
    /// `csi_operations_seconds{driver_name,method_name,grpc_status_code,migrated}`
    pub csi_seconds: HistogramVec,
    /// `force_cleaned_failed_volume_operations_total`
    pub force_cleaned: IntCounter,
    /// `force_cleaned_failed_volume_operation_errors_total`
    pub force_cleaned_errors: IntCounter,
    /// `kubelet_orphan_pod_cleaned_volumes`
    pub orphan_cleaned: IntGauge,
    /// `kubelet_orphan_pod_cleaned_volumes_errors`
    pub orphan_cleaned_errors: IntGauge,
}

/// The `operation_name` of a job, as the kubelet names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageOperation {
    /// MountDevice + SetUp
    VolumeMount,
    /// TearDown
    VolumeUnmount,
    /// UnmountDevice
    UnmountDevice,
    /// NodeExpandVolume (the kubelet's `volume_fs_resize`)
    VolumeFsResize,
}

impl StorageOperation {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            StorageOperation::VolumeMount => "volume_mount",
            StorageOperation::VolumeUnmount => "volume_unmount",
            StorageOperation::UnmountDevice => "unmount_device",
            StorageOperation::VolumeFsResize => "volume_fs_resize",
        }
    }
}

impl OperationMetrics {
    pub(super) fn new(r: &Registrar) -> Result<Self, MetricsError> {
        let storage_duration = register(r, "storage_operation_duration_seconds", || {
            HistogramVec::new(
                HistogramOpts::new(
                    "storage_operation_duration_seconds",
                    "Storage operation duration in seconds, by plugin, operation and status.",
                )
                .buckets(STORAGE_BUCKETS.to_vec()),
                &["volume_plugin", "operation_name", "status", "migrated"],
            )
        })?;
        let csi_seconds = register(r, "csi_operations_seconds", || {
            HistogramVec::new(
                HistogramOpts::new(
                    "csi_operations_seconds",
                    "Container Storage Interface operation duration with gRPC error code status total",
                )
                .buckets(STORAGE_BUCKETS.to_vec()),
                &["driver_name", "method_name", "grpc_status_code", "migrated"],
            )
        })?;
        let plugin_operations = register(r, "volumed_plugin_operations_total", || {
            IntCounterVec::new(
                Opts::new(
                    "volumed_plugin_operations_total",
                    "Journaled plugin operations run, by plugin and operation.",
                ),
                &["plugin", "operation"],
            )
        })?;
        let unmounted_outside = register(r, "volumed_unmounted_outside_total", || {
            IntCounter::new(
                "volumed_unmounted_outside_total",
                "Targets the journal knew mounted that were found unmounted outside volumed.",
            )
        })?;
        let nested_mounts_left = register(r, "volumed_nested_mounts_left_total", || {
            IntCounterVec::new(
                Opts::new(
                    "volumed_nested_mounts_left_total",
                    "TearDowns that found mounts beneath a directory volume and left it in place (retried).",
                ),
                &["plugin"],
            )
        })?;
        let csi_label_ignored = register(r, "volumed_csi_selinux_label_ignored_total", || {
            IntCounterVec::new(
                Opts::new(
                    "volumed_csi_selinux_label_ignored_total",
                    "CSI calls asked to mount with a context= label that left a mount with another label or none.",
                ),
                &["driver_name"],
            )
        })?;
        let total_volumes = register(r, "volume_manager_total_volumes", || {
            IntGaugeVec::new(
                Opts::new(
                    "volume_manager_total_volumes",
                    "Number of volumes in the desired and actual state of the world.",
                ),
                &["plugin_name", "state"],
            )
        })?;
        let force_cleaned = register(r, "force_cleaned_failed_volume_operations_total", || {
            IntCounter::new(
                "force_cleaned_failed_volume_operations_total",
                "Targets whose reconstruction failed that the one-time forced cleanup handled.",
            )
        })?;
        let force_cleaned_errors = register(
            r,
            "force_cleaned_failed_volume_operation_errors_total",
            || {
                IntCounter::new(
                    "force_cleaned_failed_volume_operation_errors_total",
                    "Forced cleanups of failed reconstructions that failed or were left (no plugin).",
                )
            },
        )?;
        let orphan_cleaned = register(r, "kubelet_orphan_pod_cleaned_volumes", || {
            IntGauge::new(
                "kubelet_orphan_pod_cleaned_volumes",
                "Orphaned pod dirs examined in the last cleanup sweep.",
            )
        })?;
        let orphan_cleaned_errors =
            register(r, "kubelet_orphan_pod_cleaned_volumes_errors", || {
                IntGauge::new(
                    "kubelet_orphan_pod_cleaned_volumes_errors",
                    "Orphaned pod dirs the last sweep could not fully clean.",
                )
            })?;
        for p in PluginName::ALL {
            for op in Operation::ALL {
                plugin_operations.with_label_values(&[p.as_str(), op.as_str()]);
            }
            nested_mounts_left.with_label_values(&[p.as_str()]);
        }
        Ok(Self {
            storage_duration,
            csi_seconds,
            plugin_operations,
            unmounted_outside,
            nested_mounts_left,
            total_volumes,
            csi_label_ignored,
            force_cleaned,
            force_cleaned_errors,
            orphan_cleaned,
            orphan_cleaned_errors,
        })
    }

    /// One journaled plugin step ran.
    pub fn plugin_operation(&self, plugin: PluginName, op: Operation) {
        self.plugin_operations
            .with_label_values(&[plugin.as_str(), op.as_str()])
            .inc();
    }

    /// A TearDown left a directory volume in place: mounts are beneath it.
    pub fn nested_mounts_left(&self, plugin: PluginName) {
        self.nested_mounts_left
            .with_label_values(&[plugin.as_str()])
            .inc();
    }

    /// One job (the kubelet's operation) finished.
    /// `volume_plugin` is the plugin's name, or `kubernetes.io/csi:<driver>`.
    pub fn storage_operation(
        &self,
        volume_plugin: &str,
        op: StorageOperation,
        ok: bool,
        took: Duration,
    ) {
        let status = if ok { "success" } else { "fail-unknown" };
        self.storage_duration
            .with_label_values(&[volume_plugin, op.as_str(), status, "false"])
            .observe(took.as_secs_f64());
    }

    /// Sets `volume_manager_total_volumes` from (plugin, state) counts.
    pub fn set_total_volumes(&self, counts: &[(PluginName, &'static str, usize)]) {
        self.total_volumes.reset();
        for (p, state, n) in counts {
            self.total_volumes
                .with_label_values(&[p.as_str(), state])
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
    }
}
