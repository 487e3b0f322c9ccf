//! The daemon's side of the health monitor: the volumes it checks, copied
//! from the `World` under its lock (the probing happens after, outside
//! it), and the monitor started with them.

use std::sync::{Arc, Mutex};

use crate::health::{Claim, HealthConfig, Monitor, MonitorParts, PodTarget, Subject};
use crate::host::sys::Sys;
use crate::metrics::Metrics;
use crate::model::{MountState, SharedPath, VolumeSpec};
use crate::state::World;

/// Every volume with a target the ASW has mounted, with only those targets.
pub(super) fn subjects(w: &World) -> Vec<Subject> {
    let mut out = Vec::new();
    for (name, v) in w.asw.volumes() {
        let device = v
            .device
            .as_ref()
            .filter(|d| d.state == MountState::Mounted)
            .and_then(|d| d.mount_path.as_deref())
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
