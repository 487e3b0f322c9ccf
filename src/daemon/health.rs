//! The daemon's side of the health monitor: the volumes it checks, copied
//! from the `World` under its lock (the probing happens after, outside
//! it), and the monitor started with them.

use std::sync::{Arc, Mutex};

use crate::health::{Claim, HealthConfig, Monitor, MonitorParts, PodTarget, Subject};
use crate::host::sys::Sys;
use crate::metrics::Metrics;
use crate::model::{KubeletPath, Layout, MountState, SharedPath, TargetKind, VolumeSpec};
use crate::state::World;

/// Every volume with a target the ASW has mounted, with only those targets.
/// A raw block volume's device target is a directory (a local PV's global
/// map dir, a CSI staging dir), no mount to watch: it is left out, or every
/// pass found it "unmounted outside volumed" (the nemesis soak's log with
/// raw block volumes in the mix).
pub(super) fn subjects(w: &World) -> Vec<Subject> {
    let mut out = Vec::new();
    for (name, v) in w.asw.volumes() {
        let raw_block = v.spec.as_deref().and_then(VolumeSpec::device_target_kind)
            == Some(TargetKind::Block)
            || v.pods.values().any(|p| p.mount.kind == TargetKind::Block);
        let device = v
            .device
            .as_ref()
            .filter(|d| d.state == MountState::Mounted)
            .and_then(|d| d.mount_path.as_deref())
            .filter(|p| {
                !raw_block
                    && !matches!(
                        Layout::device_of(p),
                        Some(KubeletPath::LocalBlockMap { .. })
                    )
            })
            .map(SharedPath::from);
        let mut claim = None;
        let pods: Vec<PodTarget> = v
            .pods
            .iter()
            .filter(|(_, p)| p.state == MountState::Mounted)
            .map(|(uid, p)| {
                let entry = w.pods.get(uid);
                if claim.is_none()
                    && let Some(e) = entry
                    && let Some(c) = e.claim(p.mount.outer_name.as_str())
                {
                    claim = Some(Box::new(Claim {
                        namespace: e.pod.namespace.to_string(),
                        name: c.clone(),
                    }));
                }
                PodTarget {
                    uid: uid.clone(),
                    outer_name: p.mount.outer_name.clone(),
                    path: p.mount.mount_path.clone(),
                    kind: p.mount.kind,
                    pod: entry.map(|e| e.pod.clone()),
                    read_only: w
                        .dsw
                        .volume(name)
                        .and_then(|d| d.pods.get(uid))
                        .is_some_and(|d| d.read_only)
                        || matches!(v.spec.as_deref(), Some(VolumeSpec::Csi(c)) if c.read_only),
                }
            })
            .collect();
        if device.is_none() && pods.is_empty() {
            continue;
        }
        out.push(Subject {
            volume: name.clone(),
            plugin: v.plugin,
            spec: v.spec.clone(),
            device,
            pods,
            claim,
        });
    }
    out
}

/// Starts the monitor over `world`; its first pass waits to be asked (the
/// event loop asks once the node is ready).
pub(super) fn start(
    config: HealthConfig,
    world: Arc<Mutex<World>>,
    sys: Arc<dyn Sys>,
    drivers: Option<Arc<crate::csi::registry::Drivers>>,
    metrics: &Metrics,
    sink: Arc<dyn crate::health::EventSink>,
) -> std::io::Result<Monitor> {
    Monitor::start_when_asked(MonitorParts {
        config,
        sys,
        drivers,
        subjects: Box::new(move || {
            let w = world.lock().unwrap_or_else(|p| p.into_inner());
            subjects(&w)
        }),
        sink,
        metrics: Some(metrics.health.clone()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{PluginName, PodUid, UniqueVolumeName};
    use crate::state::{DeviceMount, PodMount, SeLinuxState};

    /// A volume with its device target and one pod's target mounted.
    fn world_with(volume: &str, device: &str, pod_kind: TargetKind, pod_path: &str) -> World {
        let mut w = World::default();
        let v = UniqueVolumeName::from_raw(volume);
        w.asw
            .add_volume(v.clone(), PluginName::LocalVolume, "pv", None, None);
        w.asw
            .mark_device_mounted(
                &v,
                DeviceMount {
                    device_path: Some("/dev/loop3".into()),
                    mount_path: device.into(),
                    selinux: None,
                },
            )
            .unwrap();
        let mount = PodMount {
            outer_name: "data".into(),
            mount_path: pod_path.into(),
            kind: pod_kind,
            selinux: SeLinuxState::Unknown,
        };
        w.asw
            .mark_volume_mounted(&v, &PodUid::new("p1").unwrap(), mount)
            .unwrap();
        w
    }

    /// A raw block volume's device target (its global map dir) is not
    /// watched as a mount; a filesystem local PV's device mount is.
    #[test]
    fn a_raw_block_volume_s_map_dir_is_no_mount_to_watch() {
        let rows = [
            (
                "/r/plugins/kubernetes.io/local-volume/mounts/pv",
                TargetKind::Mount,
                "/r/pods/p1/volumes/kubernetes.io~local-volume/pv",
                true,
            ),
            (
                "/r/plugins/kubernetes.io~local-volume/volumeDevices/pv",
                TargetKind::Block,
                "/r/pods/p1/volumeDevices/kubernetes.io~local-volume/pv",
                false,
            ),
        ];
        for (device, kind, pod, watched) in rows {
            let w = world_with("kubernetes.io/local-volume/pv", device, kind, pod);
            let s = subjects(&w);
            assert_eq!(s.len(), 1, "{device}");
            assert_eq!(s[0].device.is_some(), watched, "{device}");
            // the map dir alone (no pod target mounted) is left out too
            let mut w = w;
            let v = UniqueVolumeName::from_raw("kubernetes.io/local-volume/pv");
            w.asw
                .delete_pod_from_volume(&v, &PodUid::new("p1").unwrap())
                .unwrap();
            let s = subjects(&w);
            assert_eq!(s.len(), usize::from(watched), "{device}: device alone");
        }
    }
}
