//! Volume health (KEP-1432, node side; docs/health.md): every mounted volume is
//! checked each `--health-period` (default 60 s, the kubelet's volume stats
//! period) and on demand, on the monitor's own thread.
//!
//! - **CSI** (`csi`): `NodeGetVolumeStats` for a driver with
//!   `GET_VOLUME_STATS`, on the first mounted pod's publish path with the
//!   staging path when the volume is staged (the kubelet asks per pod; the
//!   answer is the volume's). Its `volume_condition` counts only with the
//!   `VOLUME_CONDITION` capability and the `CSIVolumeHealth` gate, as in the
//!   kubelet; a failed call is not a recovery: the last condition stays and
//!   the failure is counted.
//! - **Native** (`probe`, `decide`): for volumed's own plugins, where the
//!   kubelet is blind — a mount vanished or replaced behind volumed's back,
//!   ext4 `errors_count` grown, a read-only filesystem under a read-write
//!   volume, the backing device (or hostPath) gone, out of space or inodes,
//!   an emptyDir over its `sizeLimit` (thresholds in `decide`).
//! - **Reports** (`report`, `events`): the `kubelet_volume_stats_*` gauges
//!   per PVC, `VolumeConditionAbnormal` / `VolumeConditionNormal` events per
//!   pod, `/debug/state`'s `health` and per-pod `Pod.status.volumeHealth`,
//!   `/debug/health` for `volumed health`.
//!
//! The `CSIVolumeHealth` gate is accepted with the kubelet's name and is
//! **on** by default here (the kubelet's alpha gate is off): volumed exists
//! to report what it sees. Off, a driver's `volume_condition` is ignored and
//! its usage still reported, as a kubelet with the gate off does; native
//! checks do not depend on it.
//!
//! *Invariants:* the monitor never runs on the reconciler's thread and
//! never probes while holding the `World` lock (it copies the mounted
//! targets under it, then lets go); only targets the ASW has `mounted` are
//! probed, never an uncertain or unmounted one; a probe that hangs past the
//! per-check timeout is abandoned and counted, the pass goes on without it,
//! and its volume is not probed again until the hung call returns.

mod csi;
pub(crate) mod decide;
pub(crate) mod events;
mod monitor;
mod probe;
pub mod report;
mod store;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::model::{
    PluginName, PodUid, SharedPath, SharedStr, TargetKind, UniqueVolumeName, VolumeSpec,
};

pub use decide::{Finding, Severity};
pub use events::{EventSink, RecentEvents, VolumeEvent};
pub use monitor::{HealthMetrics, Monitor, MonitorParts};
pub use store::{PodName, PodNames, Record, Store};

/// The kubelet's feature gate name.
pub const CSI_VOLUME_HEALTH: &str = "CSIVolumeHealth";

/// How the monitor runs.
#[derive(Debug, Clone)]
pub struct HealthConfig {
    /// `--health-period`
    pub period: Duration,
    /// `--health-check-timeout`: one volume's check, at most
    pub timeout: Duration,
    /// the `CSIVolumeHealth` gate
    pub csi_condition: bool,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            period: Duration::from_secs(60),
            timeout: Duration::from_secs(10),
            csi_condition: true,
        }
    }
}

/// A bad health flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HealthError {
    /// a duration flag that does not parse
    #[error("{flag} {value:?}: expected a duration like 60s, 500ms, 5m or 1h")]
    Duration {
        /// the flag
        flag: &'static str,
        /// its value
        value: String,
    },
    /// a gate value that is not a boolean
    #[error("--feature-gates {name}={value}: expected true or false")]
    Gate {
        /// the gate
        name: String,
        /// its value
        value: String,
    },
}

/// A health duration flag (`crate::util::duration`'s spellings). Zero is
/// refused: a pass every instant is never what was meant.
pub fn parse_duration(flag: &'static str, value: &str) -> Result<Duration, HealthError> {
    let bad = || HealthError::Duration {
        flag,
        value: value.to_owned(),
    };
    match crate::util::duration::parse_duration(flag, value) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(bad()),
    }
}

/// Takes the `CSIVolumeHealth` items out of `--feature-gates` (the rest
/// are SELinux's) and returns the gate's value (the last one wins; on by
/// default, see the module doc).
pub fn take_gate(items: &mut Vec<String>) -> Result<bool, HealthError> {
    let mut on = true;
    let mut err = None;
    items.retain(|item| {
        let Some((name, value)) = item.split_once('=') else {
            return true;
        };
        if name.trim() != CSI_VOLUME_HEALTH {
            return true;
        }
        match value.trim() {
            "1" | "t" | "T" | "true" | "TRUE" | "True" => on = true,
            "0" | "f" | "F" | "false" | "FALSE" | "False" => on = false,
            v => {
                err.get_or_insert(HealthError::Gate {
                    name: CSI_VOLUME_HEALTH.to_owned(),
                    value: v.to_owned(),
                });
            }
        }
        false
    });
    match err {
        Some(e) => Err(e),
        None => Ok(on),
    }
}

/// Where a condition came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// the driver's `volume_condition`
    Csi,
    /// volumed's own checks
    Native,
}

pub use crate::state::{PodEntry, PodRef};

/// One mounted pod target of a volume to check. Its names and path are
/// the ASW's handles: a pass's copy of every target costs counts, not
/// bytes.
#[derive(Debug, Clone)]
pub struct PodTarget {
    /// the pod
    pub uid: PodUid,
    /// `pod.spec.volumes[x].name` (empty when rebuilt from the host alone)
    pub outer_name: SharedStr,
    /// the target path
    pub path: SharedPath,
    /// what the target is on disk
    pub kind: TargetKind,
    /// the pod's names, when a source still lists it
    pub pod: Option<Arc<PodRef>>,
    /// the pod mounts it read-only (its claim's `readOnly`): a read-only
    /// filesystem there is what was asked for, not a fault
    pub read_only: bool,
}

/// A volume with every target the ASW has mounted: what one check looks at.
#[derive(Debug, Clone)]
pub struct Subject {
    /// the volume
    pub volume: UniqueVolumeName,
    /// its plugin
    pub plugin: PluginName,
    /// its spec; `None` when rebuilt from the host alone
    pub spec: Option<Arc<VolumeSpec>>,
    /// the device target's mount path, when mounted
    pub device: Option<SharedPath>,
    /// the mounted pod targets
    pub pods: Vec<PodTarget>,
    /// the claim for a PVC-backed volume (boxed: rare on most nodes, and
    /// the store keeps it as it is)
    pub claim: Option<Box<Claim>>,
}

/// A PVC's names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// its namespace
    pub namespace: String,
    /// its name
    pub name: String,
}

/// A volume's usage, as `kubelet_volume_stats_*` report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// total bytes
    pub capacity_bytes: u64,
    /// bytes a pod may still write
    pub available_bytes: u64,
    /// bytes in use
    pub used_bytes: u64,
    /// total inodes, when counted
    pub inodes: Option<u64>,
    /// free inodes
    pub inodes_free: Option<u64>,
    /// inodes in use
    pub inodes_used: Option<u64>,
}

impl From<crate::host::sys::FsUsage> for Usage {
    fn from(u: crate::host::sys::FsUsage) -> Self {
        let bytes = |n: u64| n.saturating_mul(u.block_size);
        let counted = u.files > 0;
        Usage {
            capacity_bytes: bytes(u.blocks),
            available_bytes: bytes(u.blocks_available),
            used_bytes: bytes(u.blocks.saturating_sub(u.blocks_free)),
            inodes: counted.then_some(u.files),
            inodes_free: counted.then_some(u.files_free),
            inodes_used: counted.then(|| u.files.saturating_sub(u.files_free)),
        }
    }
}

/// A volume's condition as last judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// abnormal or not
    pub abnormal: bool,
    /// CamelCase: the first finding's reason, or `Healthy` (a fixed set:
    /// no allocation per volume)
    pub reason: &'static str,
    /// every finding's message, or the driver's (a normal native
    /// condition's is static)
    pub message: Cow<'static, str>,
    /// since when `abnormal` and `reason` are what they are
    pub since: SystemTime,
    /// who judged
    pub source: Source,
    /// the problems, most severe first (empty when normal)
    pub findings: Vec<Finding>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_their_unit_and_zero_or_junk_is_refused() {
        let ok = [
            ("60s", 60_000),
            ("60", 60_000),
            ("500ms", 500),
            ("5m", 300_000),
            ("1h", 3_600_000),
        ];
        for (v, ms) in ok {
            assert_eq!(
                parse_duration("--health-period", v),
                Ok(Duration::from_millis(ms)),
                "{v}"
            );
        }
        for v in ["", "0s", "s", "1d", "-1s", "1.5s"] {
            assert!(parse_duration("--health-period", v).is_err(), "{v}");
        }
    }

    #[test]
    fn the_gate_is_taken_out_of_the_selinux_gates_and_defaults_on() {
        let mut items = vec!["SELinuxMount=false".to_owned()];
        assert_eq!(take_gate(&mut items), Ok(true));
        assert_eq!(items, ["SELinuxMount=false"]);
        let mut items = vec![
            "CSIVolumeHealth=true".to_owned(),
            "SELinuxMount=false".to_owned(),
            "CSIVolumeHealth=false".to_owned(),
        ];
        assert_eq!(take_gate(&mut items), Ok(false));
        assert_eq!(items, ["SELinuxMount=false"]);
        let mut items = vec!["CSIVolumeHealth=maybe".to_owned()];
        assert!(take_gate(&mut items).is_err());
    }
}
