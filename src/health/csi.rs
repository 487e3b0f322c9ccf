//! The CSI check: `NodeGetVolumeStats` through the driver registry, as the
//! kubelet asks it (`csi_client.go`): only for a driver with
//! `GET_VOLUME_STATS`; the volume path is a pod's publish path and the
//! staging path is given when the volume is staged; `volume_condition` is
//! read only with `VOLUME_CONDITION` and the `CSIVolumeHealth` gate.

use std::time::Duration;

use super::{Subject, Usage};
use crate::csi::registry::Drivers;
use crate::model::{PluginName, TargetKind, VolumeSpec};

/// What the driver said about one volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum CsiChecked {
    /// nothing to ask: no `GET_VOLUME_STATS`, no mounted pod, an unknown driver
    NotAsked,
    /// the call failed (or timed out: `true`)
    Failed(String, bool),
    /// usage, and the condition when the driver reports one that counts
    Answered(Option<Usage>, Option<(bool, String)>),
}

/// The driver and volume handle of a CSI subject: from its spec, else from
/// its unique name (`kubernetes.io/csi/<driver>^<handle>`).
fn driver_and_handle(s: &Subject) -> Option<(String, String)> {
    if let Some(VolumeSpec::Csi(c)) = s.spec.as_deref() {
        return Some((c.driver.clone(), c.volume_handle.clone()));
    }
    let rest = s
        .volume
        .as_str()
        .strip_prefix(PluginName::Csi.as_str())?
        .strip_prefix('/')?;
    let (d, h) = rest.split_once('^')?;
    Some((d.to_owned(), h.to_owned()))
}

/// The pod target whose publish path the driver is asked about: the
/// first; none for a raw block volume, which the kubelet never asks
/// NodeGetVolumeStats about (its block mapper has no metrics).
fn asked_at(s: &Subject) -> Option<&super::PodTarget> {
    s.pods.first().filter(|p| p.kind != TargetKind::Block)
}

/// Asks the driver about `s`, within `timeout`.
pub(super) fn check(drivers: &Drivers, s: &Subject, gate: bool, timeout: Duration) -> CsiChecked {
    let Some((name, handle)) = driver_and_handle(s) else {
        return CsiChecked::NotAsked;
    };
    let Some(pod) = asked_at(s) else {
        return CsiChecked::NotAsked;
    };
    let driver = match drivers.get(&name) {
        Ok(d) => d,
        Err(e) => return CsiChecked::Failed(e.to_string(), false),
    };
    if !driver.caps.volume_stats {
        return CsiChecked::NotAsked;
    }
    let publish = pod.path.to_string_lossy().into_owned();
    let staging = s.device.as_ref().map(|d| d.to_string_lossy().into_owned());
    let call = driver
        .client
        .volume_stats(&handle, &publish, staging.as_deref());
    let res = drivers.block_on(async { tokio::time::timeout(timeout, call).await });
    match res {
        Err(_) => CsiChecked::Failed(
            format!("NodeGetVolumeStats: no answer within {timeout:?}"),
            true,
        ),
        Ok(Err(e)) => {
            let timed_out = e.to_string().contains("DeadlineExceeded");
            CsiChecked::Failed(format!("NodeGetVolumeStats: {e}"), timed_out)
        }
        Ok(Ok(stats)) => {
            let usage = stats.bytes.map(|(avail, total, used)| {
                let n = |v: i64| u64::try_from(v).unwrap_or(0);
                Usage {
                    capacity_bytes: n(total),
                    available_bytes: n(avail),
                    used_bytes: n(used),
                    inodes: stats.inodes.map(|i| n(i.1)),
                    inodes_free: stats.inodes.map(|i| n(i.0)),
                    inodes_used: stats.inodes.map(|i| n(i.2)),
                }
            });
            let condition = stats
                .condition
                .filter(|_| gate && driver.caps.volume_condition);
            CsiChecked::Answered(usage, condition)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::UniqueVolumeName;

    #[test]
    fn a_volume_rebuilt_without_a_spec_is_named_by_its_unique_name() {
        let s = Subject {
            volume: UniqueVolumeName::from_raw("kubernetes.io/csi/d.example.com^vol^1"),
            plugin: PluginName::Csi,
            spec: None,
            device: None,
            pods: vec![],
            claim: None,
        };
        assert_eq!(
            driver_and_handle(&s),
            Some(("d.example.com".into(), "vol^1".into()))
        );
    }

    #[test]
    fn a_raw_block_volume_is_never_asked_for_stats() {
        let pod = |kind| super::super::PodTarget {
            uid: crate::model::PodUid::new("p1").unwrap(),
            outer_name: "data".into(),
            path: std::path::Path::new("/k/pods/p1/x").into(),
            kind,
            pod: None,
            read_only: false,
        };
        for (kind, asked) in [(TargetKind::Mount, true), (TargetKind::Block, false)] {
            let s = Subject {
                volume: UniqueVolumeName::from_raw("kubernetes.io/csi/d.example.com^h"),
                plugin: PluginName::Csi,
                spec: None,
                device: None,
                pods: vec![pod(kind)],
                claim: None,
            };
            assert_eq!(asked_at(&s).is_some(), asked, "{kind:?}");
        }
    }
}
