//! The API for a container runtime: the kubelet's `VolumeManager`
//! operations its pod workers call before starting a pod's containers and
//! after stopping them, offered on a running daemon through an embeddable
//! [`VolumeManagerHandle`] (and, by `server`, as JSON over HTTP and the
//! unix socket `<journal-dir>/api.sock`).
//!
//! - [`VolumeManagerHandle::wait_for_attach_and_mount`]: until every volume
//!   of the pod is mounted (`ready`), or the timeout, with what blocks it;
//! - [`VolumeManagerHandle::wait_for_unmount`]: until no target of the pod
//!   is mounted (uncertain ones are not waited for, as the kubelet's
//!   `PodHasMountedVolumes`);
//! - [`VolumeManagerHandle::mounted_volumes_for_pod`] and
//!   [`VolumeManagerHandle::volumes_in_use`].
//!
//! The kubelet polls its caches every 300 ms; here a waiter sleeps on
//! [`Changes`], which the reconciler loop bumps after each step, and each
//! look holds the world lock for one pod's snapshot: O(that pod's volumes),
//! found through the DSW's and the ASW's indexes by pod. The kubelet pops
//! the pod's DSW errors when it reads them; this API only reads them, so
//! any number of callers can ask.
//!
//! Supplemental groups (the kubelet's `GetExtraSupplementalGroupsForPod`,
//! from a PersistentVolume's `pv.beta.kubernetes.io/gid` annotation) are
//! part of the answer: `PodVolumes::supplemental_groups`.

mod changes;
pub mod mounts;
pub(crate) mod ready;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use changes::Changes;
pub use mounts::{ContainerDevice, ContainerMount, ContainerMounts, Planned, SubpathRequest};
pub use ready::{PodUnmounted, PodView, PodVolume, PodVolumes, TargetView, decide};

use crate::model::{MountState, PodUid, UniqueVolumeName, VolumeSpec};
use crate::state::World;

/// Why a wait ended without what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// no pod source has told of the pod (within the wait)
    #[error("pod {pod}: volumed does not know this pod")]
    UnknownPod {
        /// the pod
        pod: PodUid,
    },
    /// the pod's volumes were not all mounted in time
    #[error("pod {}: volumes not ready after {after:?}: {}", .status.pod_uid, .status.errors.join("; "))]
    NotReady {
        /// how long it waited
        after: Duration,
        /// the last answer, with the blocking errors
        status: Box<PodVolumes>,
    },
    /// some of the pod's targets were still mounted in time
    #[error("pod {pod}: mounted volumes=[{}] after {after:?}", .mounted.join(", "))]
    StillMounted {
        /// the pod
        pod: PodUid,
        /// how long it waited
        after: Duration,
        /// the mounted targets' volume names
        mounted: Vec<String>,
    },
    /// the daemon is stopping
    #[error("the daemon is stopping")]
    Stopped,
}

/// What [`VolumeManagerHandle::container_view`] answers.
#[derive(Debug, Clone)]
pub struct ContainerView {
    /// the pod's answer
    pub status: PodVolumes,
    /// the container's spec, `None` when the pod has no such container
    pub spec: Option<crate::model::ContainerSpec>,
    /// for each of the pod's volumes: its pod volume name, its unique
    /// volume name, and whether its pod target is a mount point (a bind
    /// is made only while it still is one)
    pub volumes: Vec<(String, crate::model::UniqueVolumeName, bool)>,
}

/// The running daemon's answers to a container runtime. Cheap to clone;
/// every method may block on the world lock for one pod's snapshot.
#[derive(Clone)]
pub struct VolumeManagerHandle {
    world: Arc<Mutex<World>>,
    changes: Arc<Changes>,
}

impl std::fmt::Debug for VolumeManagerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeManagerHandle")
            .finish_non_exhaustive()
    }
}

impl VolumeManagerHandle {
    /// A handle on `world`, woken by `changes`.
    pub fn new(world: Arc<Mutex<World>>, changes: Arc<Changes>) -> Self {
        Self { world, changes }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, World> {
        // the world is plain data, consistent after any panic (event_loop::lock)
        self.world.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The change counter (for async waiters: [`Changes::subscribe`]).
    pub fn changes(&self) -> &Arc<Changes> {
        &self.changes
    }

    /// The pod's volumes now; `None` when no source has told of the pod.
    pub fn pod_volumes(&self, pod: &PodUid) -> Option<PodVolumes> {
        let view = view(&self.lock(), pod)?;
        Some(decide(pod.as_str(), &view))
    }

    /// The pod's answer now with its container `name`'s spec (`None` when
    /// the pod has no such container) and, for each pod volume name, its
    /// unique volume name (what a subPath bind is journaled under); `None`
    /// when no source knows the pod. One look under the lock, O(the pod's
    /// volumes and containers).
    pub fn container_view(&self, pod: &PodUid, name: &str) -> Option<ContainerView> {
        let w = self.lock();
        let view = view(&w, pod)?;
        let containers = w.dsw.pod_containers(pod);
        let volumes = w
            .dsw
            .volumes_of_pod(pod)
            .into_iter()
            .filter_map(|unique| {
                let outer = w.dsw.volume(&unique)?.pods.get(pod)?.outer_name.clone();
                let is_mount = w
                    .asw
                    .pod(&unique, pod)
                    .is_some_and(|a| a.mount.kind == crate::model::TargetKind::Mount);
                Some((outer.to_string(), unique, is_mount))
            })
            .collect();
        drop(w);
        let spec = containers.and_then(|c| c.iter().find(|c| c.name == name).cloned());
        Some(ContainerView {
            status: decide(pod.as_str(), &view),
            spec,
            volumes,
        })
    }

    /// The kubelet's `WaitForAttachAndMount`: returns once every volume of
    /// the pod is mounted; after `timeout`, the last answer with what
    /// blocks it. A pod no source has told of yet is waited for too.
    pub fn wait_for_attach_and_mount(
        &self,
        pod: &PodUid,
        timeout: Duration,
    ) -> Result<PodVolumes, RuntimeError> {
        let deadline = Instant::now() + timeout;
        loop {
            let seen = self.changes.seen();
            let now = self.pod_volumes(pod);
            match now {
                Some(p) if p.ready => return Ok(p),
                _ if Instant::now() >= deadline => {
                    return Err(match now {
                        Some(status) => RuntimeError::NotReady {
                            after: timeout,
                            status: Box::new(status),
                        },
                        None => RuntimeError::UnknownPod { pod: pod.clone() },
                    });
                }
                _ => {}
            }
            if !self.changes.wait_past(seen, deadline) {
                return Err(RuntimeError::Stopped);
            }
        }
    }

    /// The pod's volumes still mounted now, by pod volume name (the unique
    /// name for a target rebuilt without one), sorted: O(its volumes),
    /// through the ASW's index by pod. Uncertain targets are left out, as
    /// the kubelet's `PodHasMountedVolumes` leaves them.
    pub fn pod_unmounted(&self, pod: &PodUid) -> PodUnmounted {
        let mut mounted: Vec<String> = {
            let w = self.lock();
            w.asw
                .targets_of_pod(pod)
                .filter(|(_, _, t)| t.state == MountState::Mounted)
                .map(|(name, _, t)| match t.mount.outer_name.as_str() {
                    "" => name.as_str().to_owned(),
                    outer => outer.to_owned(),
                })
                .collect()
        };
        mounted.sort();
        PodUnmounted {
            pod_uid: pod.as_str().to_owned(),
            unmounted: mounted.is_empty(),
            mounted,
        }
    }

    /// The kubelet's `WaitForUnmount`: returns once no target of the pod is
    /// mounted (uncertain ones are not waited for, as the kubelet).
    pub fn wait_for_unmount(&self, pod: &PodUid, timeout: Duration) -> Result<(), RuntimeError> {
        let deadline = Instant::now() + timeout;
        loop {
            let seen = self.changes.seen();
            let now = self.pod_unmounted(pod);
            if now.unmounted {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(RuntimeError::StillMounted {
                    pod: pod.clone(),
                    after: timeout,
                    mounted: now.mounted,
                });
            }
            if !self.changes.wait_past(seen, deadline) {
                return Err(RuntimeError::Stopped);
            }
        }
    }

    /// The kubelet's `GetMountedVolumesForPod`: the pod's mounted targets
    /// (not uncertain), by pod volume name, whether or not the DSW still
    /// wants them. A target rebuilt from the host alone has no name yet.
    pub fn mounted_volumes_for_pod(&self, pod: &PodUid) -> Vec<PodVolume> {
        let w = self.lock();
        let mut out: Vec<PodVolume> = w
            .asw
            .targets_of_pod(pod)
            .filter(|(_, _, t)| t.state == MountState::Mounted)
            .map(|(name, v, t)| PodVolume {
                name: t.mount.outer_name.to_string(),
                host_path: host_path(v.spec.as_deref(), &t.mount.mount_path),
                // the spec's read-only, or the pod's claim's while a source
                // still lists the pod
                read_only: v.spec.as_deref().is_some_and(ready::read_only)
                    || w.dsw
                        .volume(name)
                        .and_then(|d| d.pods.get(pod))
                        .is_some_and(|p| p.read_only),
                selinux_context: t.mount.selinux.context().map(|c| c.as_str().to_owned()),
                selinux_relabel: ready::selinux_relabel(
                    v.spec.as_deref(),
                    t.mount.selinux.context().map(|c| c.as_str()),
                ),
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The kubelet's `GetVolumesInUse`: every volume a pod wants or that
    /// is on the node, sorted. volumed has no attach/detach controller to
    /// tell, so it reports every plugin's volumes, not only attachable ones.
    /// Walks the node: for the node's status, not for a pod's start.
    pub fn volumes_in_use(&self) -> Vec<UniqueVolumeName> {
        let w = self.lock();
        let mut out: Vec<UniqueVolumeName> = w
            .dsw
            .volumes()
            .map(|(n, _)| n.clone())
            .chain(w.asw.volumes().map(|(n, _)| n.clone()))
            .collect();
        drop(w);
        out.sort();
        out.dedup();
        out
    }

    /// What the kubelet reports in `node.status.volumesInUse`: the
    /// attachable volumes (a CSI volume whose driver requires attaching)
    /// a pod wants or that are on the node, sorted. The attach/detach
    /// controller detaches none of these. A volume reconstructed without
    /// its spec is reported when its plugin is CSI: reporting one too many
    /// only delays a detach; one too few could detach a mounted volume.
    pub fn attachable_in_use(&self) -> Vec<UniqueVolumeName> {
        use crate::model::{PluginName, VolumeSpec};
        let attachable = |spec: Option<&VolumeSpec>, plugin: PluginName| match spec {
            Some(spec) => spec.is_attachable(),
            None => plugin == PluginName::Csi,
        };
        let w = self.lock();
        let mut out: Vec<UniqueVolumeName> = w
            .dsw
            .volumes()
            .filter(|(_, v)| attachable(Some(&v.spec), v.plugin))
            .map(|(n, _)| n.clone())
            .chain(
                w.asw
                    .volumes()
                    .filter(|(_, v)| attachable(v.spec.as_deref(), v.plugin))
                    .map(|(n, _)| n.clone()),
            )
            .collect();
        drop(w);
        out.sort();
        out.dedup();
        out
    }
}

/// Where the runtime finds a volume: a hostPath's own path (nothing is
/// mounted for it, the runtime binds the path itself), else the pod target.
fn host_path(spec: Option<&VolumeSpec>, target: &std::path::Path) -> String {
    match spec {
        Some(VolumeSpec::HostPath { path, .. }) => path.to_string_lossy().into_owned(),
        _ => target.to_string_lossy().into_owned(),
    }
}

/// One pod's view of the world; `None` when no source has told of it.
/// O(the pod's volumes): the DSW's index by pod, one ASW lookup each.
fn view(w: &World, pod: &PodUid) -> Option<PodView> {
    let names = w.dsw.pod_volume_names(pod)?;
    let targets = w
        .dsw
        .volumes_of_pod(pod)
        .into_iter()
        .filter_map(|name| {
            let desired = w.dsw.volume(&name)?;
            let wanted = desired.pods.get(pod)?;
            let actual = w.asw.pod(&name, pod);
            Some(TargetView {
                name: wanted.outer_name.clone(),
                state: actual.map(|a| a.state),
                // only a mounted target's is shown
                host_path: actual.map_or_else(String::new, |a| {
                    host_path(Some(&desired.spec), &a.mount.mount_path)
                }),
                read_only: ready::read_only(&desired.spec) || wanted.read_only,
                selinux_context: actual
                    .and_then(|a| a.mount.selinux.context())
                    .map(|c| c.as_str().to_owned()),
                selinux_relabel: ready::selinux_relabel(
                    Some(&desired.spec),
                    actual
                        .and_then(|a| a.mount.selinux.context())
                        .map(|c| c.as_str()),
                ),
                supplemental_gid: wanted.supplemental_gid,
            })
        })
        .collect();
    Some(PodView {
        names: names.to_vec(),
        unresolved: w.dsw.pod_has_unresolved(pod),
        errors: w.dsw.errors_of_pod(pod).cloned().collect(),
        targets,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::model::{
        PluginName, PodVolume as ModelPodVolume, StorageMedium, TargetKind, VolumeSpec,
    };
    use crate::state::{LabelCheck, PodMount, SeLinuxState};

    const T: Duration = Duration::from_secs(30);

    fn uid() -> PodUid {
        PodUid::new("u1").unwrap()
    }

    fn cache() -> UniqueVolumeName {
        UniqueVolumeName::per_pod(PluginName::EmptyDir, &uid(), "cache")
    }

    /// A world where pod `u1` wants the emptyDir `cache`, not mounted yet.
    fn handle() -> VolumeManagerHandle {
        let mut w = World::default();
        let spec = Arc::new(VolumeSpec::EmptyDir {
            medium: StorageMedium::Memory,
            size_limit: None,
        });
        w.dsw.set_pod_volume_names(&uid(), ["cache".to_owned()]);
        let v = ModelPodVolume {
            volume: cache(),
            spec_name: "cache".into(),
            outer_name: "cache".into(),
            spec: spec.clone(),
            selinux: None,
            csi_pod: None,
            read_only: false,
            fs_group: None,
            supplemental_gid: None,
        };
        w.dsw
            .add_pod_to_volume(&uid(), v, LabelCheck::default())
            .unwrap();
        w.asw
            .add_volume(cache(), PluginName::EmptyDir, "cache", Some(spec), None);
        VolumeManagerHandle::new(Arc::new(Mutex::new(w)), Arc::new(Changes::new()))
    }

    /// What the loop does: a change under the lock, then a bump.
    fn later(h: &VolumeManagerHandle, change: impl FnOnce(&mut World) + Send + 'static) {
        let h = h.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            change(&mut h.lock());
            h.changes().bump();
        });
    }

    fn mount() -> PodMount {
        PodMount {
            outer_name: "cache".into(),
            mount_path: Path::new("/r/cache").into(),
            kind: TargetKind::Mount,
            selinux: SeLinuxState::WithoutContext,
        }
    }

    #[test]
    fn wait_for_attach_and_mount_returns_when_the_loop_mounts_the_volume() {
        let h = handle();
        assert!(!h.pod_volumes(&uid()).unwrap().ready);
        later(&h, |w| {
            w.asw
                .mark_volume_mounted(&cache(), &uid(), mount())
                .unwrap();
        });
        let start = Instant::now();
        let got = h.wait_for_attach_and_mount(&uid(), T).unwrap();
        assert!(start.elapsed() < T / 2, "woken, not timed out");
        assert_eq!(got.volumes.len(), 1);
        assert_eq!(got.volumes[0].host_path, "/r/cache");
        let mounted = h.mounted_volumes_for_pod(&uid());
        assert_eq!(mounted, got.volumes);
        assert_eq!(h.volumes_in_use(), [cache()]);
    }

    #[test]
    fn wait_for_attach_and_mount_times_out_with_the_blocking_errors() {
        let h = handle();
        h.lock().dsw.add_pod_error(&uid(), "setup cache: ENOSPC");
        let e = h
            .wait_for_attach_and_mount(&uid(), Duration::from_millis(50))
            .unwrap_err();
        let RuntimeError::NotReady { status, .. } = &e else {
            panic!("{e}");
        };
        assert_eq!(
            status.errors,
            ["unmounted volumes=[cache]", "setup cache: ENOSPC"]
        );
        let other = PodUid::new("u2").unwrap();
        let e = h
            .wait_for_attach_and_mount(&other, Duration::from_millis(10))
            .unwrap_err();
        assert_eq!(e, RuntimeError::UnknownPod { pod: other });
    }

    #[test]
    fn wait_for_unmount_returns_when_the_pod_s_last_mounted_target_goes() {
        let h = handle();
        h.lock()
            .asw
            .mark_volume_mounted(&cache(), &uid(), mount())
            .unwrap();
        let e = h
            .wait_for_unmount(&uid(), Duration::from_millis(20))
            .unwrap_err();
        assert!(matches!(&e, RuntimeError::StillMounted { mounted, .. } if mounted == &["cache"]));
        let now = h.pod_unmounted(&uid());
        assert_eq!(
            (now.unmounted, now.mounted),
            (false, vec!["cache".to_owned()])
        );
        later(&h, |w| {
            w.dsw.delete_pod(&uid());
            w.asw.delete_pod_from_volume(&cache(), &uid()).unwrap();
        });
        h.wait_for_unmount(&uid(), T).unwrap();
        assert!(h.mounted_volumes_for_pod(&uid()).is_empty());
        assert!(h.pod_unmounted(&uid()).unmounted);
        // a pod volumed never knew has nothing mounted
        let other = PodUid::new("u2").unwrap();
        assert!(h.pod_unmounted(&other).unmounted);
    }

    #[test]
    fn a_stopping_daemon_ends_every_wait() {
        let h = handle();
        let c = h.changes().clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            c.close();
        });
        let e = h.wait_for_attach_and_mount(&uid(), T).unwrap_err();
        assert_eq!(e, RuntimeError::Stopped);
    }
}
