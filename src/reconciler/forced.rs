//! The one-time forced cleanup of failed reconstructions (KEP-3756,
//! "Proposed VolumeManager startup", last step; the kubelet's
//! `cleanOrphanVolumes` → `cleanupMounts`; docs/kubelet.md, "Startup").
//!
//! Reconstruction lists the host-found targets it could not rebuild
//! ([`FailedTarget`]: a plugin volumed does not have, a CSI target without
//! its `vol_data.json`). They never enter the ASW, so the reconciler never
//! unmounts them. Once every pod source has listed *and* the pod-dir walk
//! has reported, after the pass that starts the normal unmounts, each such
//! target no pod wants is handled once:
//!
//! - a pod the DSW knows (any of its volumes, or an unresolved claim), or
//!   one the loop holds back (refused for its SELinux label), keeps it:
//!   skipped, not counted (the kubelet skips what the DSW has, and a pod
//!   whose claim does not resolve keeps every mount it has);
//! - a device target whose plugin a DSW volume uses with the same driver:
//!   skipped, not counted;
//! - otherwise `force_cleaned_failed_volume_operations_total` + 1, then:
//!   - a volume type volumed has no plugin for ([`crate::plugins::NAMES`]:
//!     CSI — a target that could not be rebuilt lacks the `vol_data.json`
//!     that names its driver and handle, so there is nothing to call
//!     NodeUnpublish or NodeUnstage with — secret, projected, …): left
//!     mounted (docs/layout.md, "Removal rules": plugin dirs of volume
//!     types volumed has no plugin for are never force-cleaned),
//!     reported, `force_cleaned_failed_volume_operation_errors_total` + 1 —
//!     what the kubelet counts when it finds no plugin;
//!   - nothing mounted: nothing to do (the dir is orphan cleanup's);
//!   - mounted: a [`Job::ForceCleanup`] on the worker pool — intent
//!     journaled, everything stacked at the target unmounted (no
//!     `MNT_DETACH`; a nested mount makes it fail), the empty mount-point
//!     dir removed, outcome journaled — then, whatever the result, a
//!     `Forget` of the journal entry (the journal knows no more than
//!     before: a target still there fails reconstruction again at the next
//!     start). A failure counts an error and is not retried (the kubelet's
//!     "cleanup is one shot"); unlike the kubelet, a failure of the unmount
//!     itself is counted too, not only a refusal to start.
//!
//! Known limit: a crash between such an intent and its `Forget` leaves a
//! journal target of a plugin volumed has no implementation for; the next
//! start settles it from the host (single-step unmount), and if it is still
//! mounted the reconciler cannot tear it down (it reports "no plugin").

use std::collections::HashSet;
use std::path::Path;
use std::time::Instant;

use crate::model::{
    KubeletPath, Layout, PluginName, PodUid, SharedParams, TargetKind, TargetParams, TargetRef,
    UniqueVolumeName, VolumeSpec,
};
use crate::reconciler::jobs::{Job, JobReport};
use crate::reconstruct::{FailedTarget, HostObservation, RebuildFailure};
use crate::state::DesiredStateOfWorld;

use super::core::{Core, Counted, Effect, JournalWork, World};

/// What the forced cleanup does with one failed target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// a pod the DSW knows, or a device a DSW volume may use: not touched, not counted
    Wanted,
    /// counted as an error and left: volumed has no plugin for it
    NoPlugin,
    /// counted; nothing is mounted there
    NothingMounted,
    /// counted; unmount it with these parameters
    Unmount(SharedParams),
}

/// The name the journal records a forced cleanup under: the plugin and the
/// spec name (the kubelet's force-clean uses the bare spec name; a real
/// unique name needs the metadata that was missing).
fn journal_name(f: &FailedTarget) -> UniqueVolumeName {
    UniqueVolumeName::from_raw(format!("{}/{}", f.plugin_name, f.spec_name))
}

/// The driver of a CSI device target (`…/csi/<driver>/<hash>/globalmount`).
fn csi_driver(path: &Path) -> Option<&str> {
    match Layout::device_of(path)? {
        KubeletPath::CsiGlobalMount { driver, .. } => Some(driver),
        _ => None,
    }
}

/// Decides, as a pure function of the failed targets, the DSW and the pods
/// known outside it (`also_known`: pods the loop holds back, e.g. refused
/// for their SELinux label), what the forced cleanup does with each (in
/// order).
pub(crate) fn plan_forced(
    failed: &[FailedTarget],
    dsw: &DesiredStateOfWorld,
    also_known: &dyn Fn(&PodUid) -> bool,
) -> Vec<Step> {
    // What the device targets are checked against, found once (per-plugin
    // pair counts, and the CSI drivers in one walk, only when a CSI device
    // target failed): a walk of the DSW per failed target made the check
    // O(failed × volumes).
    let in_use = dsw.to_mount_counts();
    let csi_device_failed = failed.iter().any(|f| {
        f.target == TargetRef::Device && PluginName::parse(&f.plugin_name) == Some(PluginName::Csi)
    });
    let csi_drivers: HashSet<&str> = match csi_device_failed {
        true => dsw
            .volumes()
            .filter_map(|(_, v)| match &*v.spec {
                VolumeSpec::Csi(c) => Some(c.driver.as_str()),
                _ => None,
            })
            .collect(),
        false => HashSet::new(),
    };
    failed
        .iter()
        .map(|f| {
            let plugin = PluginName::parse(&f.plugin_name);
            let wanted = match &f.target {
                TargetRef::Pod(uid) => {
                    dsw.pod_has_volumes(uid) || dsw.pod_has_unresolved(uid) || also_known(uid)
                }
                TargetRef::Device => match (plugin, csi_driver(&f.path)) {
                    (Some(PluginName::Csi), Some(d)) => csi_drivers.contains(d),
                    (Some(p), _) => in_use.contains_key(&p),
                    (None, _) => false,
                },
            };
            if wanted {
                return Step::Wanted;
            }
            let plugin = match (plugin, &f.cause) {
                (Some(p), RebuildFailure::MissingMetadata(_)) if crate::plugins::has(p) => p,
                _ => return Step::NoPlugin,
            };
            if !matches!(f.observation, HostObservation::Mounted(_)) {
                return Step::NothingMounted;
            }
            Step::Unmount(SharedParams::new(TargetParams::at(
                journal_name(f),
                plugin,
                f.spec_name.as_str().into(),
                f.target.clone(),
                TargetKind::Mount,
                Some(f.path.as_path().into()),
            )))
        })
        .collect()
}

impl Core {
    /// Decides the forced cleanup, once: every source listed, the pod-dir
    /// walk reported (its failures are in), after a pass that started the
    /// normal unmounts. The list is dropped whatever happens (one shot).
    pub(super) fn force_cleanup(&mut self, w: &World, now: Instant, out: &mut Vec<Effect>) {
        let steps = {
            let refused = &self.refused;
            plan_forced(&self.failed, &w.dsw, &|p| refused.contains_key(p))
        };
        let failed = std::mem::take(&mut self.failed);
        for (f, step) in failed.iter().zip(steps) {
            let path = f.path.display();
            match step {
                Step::Wanted => {
                    tracing::debug!(path = %path, "forced cleanup: a pod still wants it; left");
                }
                Step::NoPlugin => {
                    out.push(Effect::Count(Counted::ForceCleaned));
                    out.push(Effect::Count(Counted::ForceCleanedError));
                    tracing::warn!(path = %path, plugin = %f.plugin_name,
                        "forced cleanup: volumed has no plugin for this volume type; left as it is");
                }
                Step::NothingMounted => {
                    out.push(Effect::Count(Counted::ForceCleaned));
                    tracing::info!(path = %path, "forced cleanup: nothing mounted; the dir is left to orphan cleanup");
                }
                Step::Unmount(params) => {
                    out.push(Effect::Count(Counted::ForceCleaned));
                    let job = Job::ForceCleanup { params };
                    if !self.pending.start(&job.key(), now) {
                        out.push(Effect::Count(Counted::ForceCleanedError));
                        tracing::warn!(path = %path, "forced cleanup: an operation on it is pending; not retried");
                        continue;
                    }
                    tracing::info!(path = %path, "forced cleanup: unmounting a target reconstruction could not rebuild");
                    out.push(Effect::Start {
                        job,
                        announce: false,
                    });
                }
            }
        }
    }

    /// A forced cleanup job finished: counted, and its journal entry
    /// forgotten whatever the result. The entry holds nothing the host scan
    /// does not find again, and a kept one would make the next start see a
    /// journal target of a plugin volumed cannot tear down; forgotten, a
    /// target that is still there is a failed reconstruction again next
    /// start (and counted again), exactly as before the attempt.
    pub(super) fn forced_done(&mut self, report: &JobReport, out: &mut Vec<Effect>) {
        match &report.error {
            Some(e) => {
                out.push(Effect::Count(Counted::ForceCleanedError));
                tracing::warn!(volume = %report.key.volume, error = %e,
                    "forced cleanup failed; not retried (one shot)");
            }
            None => tracing::info!(volume = %report.key.volume, "forced cleanup done"),
        }
        // No intent was written when nothing ran (the journal refused it).
        if report.ran.is_empty() || !self.cfg.journal {
            return;
        }
        let target = match &report.key.pod {
            Some(p) => TargetRef::Pod(p.clone()),
            None => TargetRef::Device,
        };
        self.in_flight.forgets += 1;
        out.push(Effect::Journal(JournalWork::ForgetTarget {
            volume: report.key.volume.clone(),
            target,
            key: None,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DevId, MountIdentity, PodVolume, StorageMedium};
    use crate::reconstruct::ObservedMount;
    use crate::state::LabelCheck;
    use std::path::PathBuf;

    fn mounted() -> HostObservation {
        HostObservation::Mounted(ObservedMount {
            identity: MountIdentity {
                dev: DevId {
                    major: 0,
                    minor: 42,
                },
                root: "/".into(),
                fs_type: "tmpfs".into(),
                read_only: false,
                selinux: None,
            },
            source: PathBuf::from("tmpfs"),
        })
    }

    fn failed(
        target: TargetRef,
        plugin: &str,
        cause: RebuildFailure,
        obs: HostObservation,
    ) -> FailedTarget {
        let path = match &target {
            TargetRef::Pod(uid) => PathBuf::from(format!(
                "/r/pods/{uid}/volumes/{}/vol/mount",
                plugin.replace('/', "~")
            )),
            TargetRef::Device => PathBuf::from("/r/plugins/kubernetes.io/csi/drv/abc/globalmount"),
        };
        FailedTarget {
            path,
            target,
            plugin_name: plugin.into(),
            spec_name: "vol".into(),
            cause,
            observation: obs,
        }
    }

    fn pod(s: &str) -> TargetRef {
        TargetRef::Pod(PodUid::new(s).unwrap())
    }

    fn missing() -> RebuildFailure {
        RebuildFailure::MissingMetadata("vol_data.json".into())
    }

    fn dsw_with(pod_uid: &str, spec: VolumeSpec) -> DesiredStateOfWorld {
        let mut dsw = DesiredStateOfWorld::new();
        let uid = PodUid::new(pod_uid).unwrap();
        let v = PodVolume {
            volume: PodVolume::unique_name(&spec, &uid, "other"),
            spec_name: "other".into(),
            outer_name: "other".into(),
            spec: spec.into(),
            selinux: None,
            csi_pod: None,
            read_only: false,
            fs_group: None,
            supplemental_gid: None,
        };
        dsw.add_pod_to_volume(&uid, v, LabelCheck::default())
            .unwrap();
        dsw.mark_sources_ready();
        dsw
    }

    #[test]
    fn each_failed_target_gets_one_step() {
        let csi = "kubernetes.io/csi";
        let local = "kubernetes.io/local-volume";
        let empty = dsw_with(
            "kept",
            VolumeSpec::EmptyDir {
                medium: StorageMedium::Disk,
                size_limit: None,
            },
        );
        let cases: Vec<(&str, FailedTarget, Step)> = vec![
            (
                "a pod the DSW knows keeps its mounts",
                failed(pod("kept"), csi, missing(), mounted()),
                Step::Wanted,
            ),
            (
                "no plugin: counted as an error and left",
                failed(
                    pod("gone"),
                    "kubernetes.io/secret",
                    RebuildFailure::UnknownPlugin,
                    mounted(),
                ),
                Step::NoPlugin,
            ),
            (
                "CSI (no node client to call NodeUnpublish): counted as an error and left",
                failed(pod("gone"), csi, missing(), mounted()),
                Step::NoPlugin,
            ),
            (
                "nothing mounted: nothing to unmount",
                failed(pod("gone"), local, missing(), HostObservation::DirPresent),
                Step::NothingMounted,
            ),
        ];
        for (what, f, want) in cases {
            assert_eq!(plan_forced(&[f], &empty, &|_| false), vec![want], "{what}");
        }
        let f = failed(pod("gone"), local, missing(), mounted());
        let [Step::Unmount(p)] = &plan_forced(std::slice::from_ref(&f), &empty, &|_| false)[..]
        else {
            panic!("a mounted target of a gone pod whose plugin volumed has is unmounted");
        };
        assert_eq!(p.pod_mount_path.as_deref(), Some(f.path.as_path()));
        assert_eq!(p.plugin, PluginName::LocalVolume);
        assert_eq!(p.volume.as_str(), "kubernetes.io/local-volume/vol");
    }

    #[test]
    fn an_unresolved_pod_keeps_its_mounts() {
        let mut dsw = DesiredStateOfWorld::new();
        dsw.set_pod_unresolved(&PodUid::new("waiting").unwrap(), true);
        dsw.mark_sources_ready();
        let f = failed(pod("waiting"), "kubernetes.io/csi", missing(), mounted());
        assert_eq!(
            plan_forced(std::slice::from_ref(&f), &dsw, &|_| false),
            vec![Step::Wanted]
        );
        let held = failed(pod("held-back"), "kubernetes.io/csi", missing(), mounted());
        let known = |p: &PodUid| p.as_str() == "held-back";
        assert_eq!(plan_forced(&[held], &dsw, &known), vec![Step::Wanted]);
    }

    #[test]
    fn a_device_target_is_kept_while_a_dsw_volume_of_its_driver_exists() {
        let spec = |driver: &str| {
            VolumeSpec::Csi(Box::new(crate::model::CsiSpec {
                driver: driver.into(),
                volume_handle: "h".into(),
                fs_type: None,
                access_modes: Vec::new(),
                mount_options: Default::default(),
                attributes: Default::default(),
                selinux_mount: Default::default(),
                ..Default::default()
            }))
        };
        let f = failed(TargetRef::Device, "kubernetes.io/csi", missing(), mounted());
        let same = dsw_with("p", spec("drv"));
        assert_eq!(
            plan_forced(std::slice::from_ref(&f), &same, &|_| false),
            vec![Step::Wanted]
        );
        // no pod of its driver: still left, as volumed has no CSI node client
        let other = dsw_with("p", spec("other-driver"));
        assert_eq!(
            plan_forced(std::slice::from_ref(&f), &other, &|_| false),
            vec![Step::NoPlugin]
        );
    }
}
