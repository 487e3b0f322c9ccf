//! The executor's job steps: MountDevice (with its format step), SetUp,
//! TearDown, UnmountDevice and the forced cleanup, each one journaled
//! plugin call and the ASW changes it implies.

use std::path::Path;
use std::time::Instant;

use super::Executor;
use crate::host::sys::{Beneath, SysError};
use crate::journal::{Announced, Permit};
use crate::model::{FsGroup, Operation, PodUid, SharedParams, Steps, TargetRef};
use crate::plugins::ownership::{self, Progress};
use crate::plugins::{self, Action, Certainty, Outcome, PluginError, VolumePlugin};
use crate::reconciler::effects::PodEvent;
use crate::reconciler::jobs::{AswUpdate, Job, JobError, JobReport, LateWatch};
use crate::reconciler::params::{op_for, op_steps, pod_step};
use crate::state::{DeviceMount, PodMount, SeLinuxState, VolumeToMount};

impl Executor {
    /// A Mount job's device step: a format when the device needs one, then
    /// MountDevice; the ASW learns of the device mount (as uncertain when
    /// the outcome is).
    pub(super) fn mount_device(
        &self,
        plugin: &dyn VolumePlugin,
        want: &VolumeToMount,
        dev: &SharedParams,
        r: &mut JobReport,
        announced: &mut Option<Announced>,
    ) -> Result<(), JobError> {
        let sys = self.sys.as_ref();
        let device_mount = DeviceMount {
            device_path: dev.device_path().map(Path::to_path_buf),
            mount_path: dev
                .device_mount_path()
                .map(Path::to_path_buf)
                .unwrap_or_default(),
            selinux: dev.selinux().cloned(),
        };
        // a raw block device is mapped, never formatted nor mounted
        let op = op_for(Operation::MountDevice, dev.kind);
        let needs = op == Operation::MountDevice
            && plugin
                .needs_format(&want.spec, dev, sys)
                .map_err(|e| JobError::from(&e))?;
        if needs {
            self.journaled(
                Operation::FormatDevice,
                op_steps(Operation::FormatDevice, dev.plugin),
                dev,
                r,
                announced,
                |permit: &Permit| plugin.format(permit, &want.spec, dev, sys),
            )?;
        }
        let res = self.journaled(
            op,
            op_steps(op, dev.plugin),
            dev,
            r,
            announced,
            |permit: &Permit| match op {
                Operation::MapDevice => plugin.map_device(permit, &want.spec, dev, sys),
                _ => plugin.mount_device(permit, &want.spec, dev, sys),
            },
        );
        match res {
            Ok(()) => {
                r.updates.push(AswUpdate::DeviceMounted {
                    volume: want.volume.clone(),
                    plugin: want.plugin,
                    spec_name: want.spec_name.clone(),
                    spec: Some(want.spec.clone()),
                    mount: device_mount,
                });
                Ok(())
            }
            Err(e) if !e.is_uncertain() => Err(e),
            Err(e) => {
                let path = device_mount.mount_path.as_path().into();
                let update = AswUpdate::DeviceUncertain {
                    volume: want.volume.clone(),
                    plugin: want.plugin,
                    spec_name: want.spec_name.clone(),
                    mount: device_mount,
                };
                let undo = Job::UnmountDevice {
                    params: dev.clone(),
                };
                uncertain(r, dev, path, update, undo);
                Err(e)
            }
        }
    }

    /// A Mount job's pod step: SetUp, then, for a pod with an fsGroup the
    /// volume takes (`VolumeToMount::fs_group`) and a plugin that did not
    /// apply it itself, the ownership walk as its own journaled step, its
    /// intent written with SetUp's outcome; the ASW learns of the pod's
    /// mount once both are done (as uncertain when either is).
    pub(super) fn set_up(
        &self,
        plugin: &dyn VolumePlugin,
        want: &VolumeToMount,
        pod: &SharedParams,
        r: &mut JobReport,
        announced: &mut Option<Announced>,
    ) -> Result<(), JobError> {
        let sys = self.sys.as_ref();
        let pod_mount = PodMount {
            outer_name: want.outer_name.clone(),
            mount_path: pod
                .pod_mount_path
                .clone()
                .unwrap_or_else(|| Path::new("").into()),
            kind: pod.kind,
            selinux: SeLinuxState::mounted_with(pod.selinux().cloned()),
        };
        // a raw block volume is mapped into the pod: no files to walk
        let (op, steps) = pod_step(want, pod.kind);
        let owner = want.fs_group.filter(|_| {
            op == Operation::SetUp
                && pod.pod_mount_path.is_some()
                && !plugin.group_applied_by_driver(pod)
        });
        let permit = self.permit(op, steps, pod, announced)?;
        let res = self.run_permitted(
            op,
            pod,
            r,
            permit,
            owner.map(|_| (Operation::SetOwnership, Steps::Multi)),
            |permit: &Permit| match op {
                Operation::MapPodDevice => plugin.map_pod_device(permit, &want.spec, pod, sys),
                _ => plugin.setup(permit, &want.spec, pod, sys),
            },
        );
        let uncertain_update = |pod_mount: PodMount| AswUpdate::PodUncertain {
            volume: want.volume.clone(),
            plugin: want.plugin,
            spec_name: want.spec_name.clone(),
            pod: want.pod.clone(),
            mount: pod_mount,
        };
        match res {
            Ok(next) => {
                if let (Some(permit), Some(group)) = (next, owner)
                    && let Err(e) = self.own(permit, want, pod, group, r)
                {
                    // mounted, its files walked in part: SetUp runs again
                    // (the mount in place) and the walk after it
                    r.updates.push(uncertain_update(pod_mount));
                    return Err(e);
                }
                r.updates.push(AswUpdate::PodMounted {
                    volume: want.volume.clone(),
                    plugin: want.plugin,
                    spec_name: want.spec_name.clone(),
                    spec: Some(want.spec.clone()),
                    pod: want.pod.clone(),
                    mount: pod_mount,
                });
                // mounted: a pending node expansion grows it now
                self.expand_after_set_up(plugin, want, pod, r)
            }
            Err(e) if !e.is_uncertain() => Err(e),
            Err(e) => {
                let path = pod_mount.mount_path.clone();
                let update = uncertain_update(pod_mount);
                let undo = Job::TearDown {
                    params: pod.clone(),
                    subpaths: Some(want.outer_name.clone()),
                };
                uncertain(r, pod, path, update, undo);
                Err(e)
            }
        }
    }

    /// The ownership walk of a pod target SetUp just made (its intent
    /// durable: `permit`): every failure is uncertain, part of the volume
    /// may have been walked. A walk past 30 s raises the kubelet's
    /// `VolumePermissionChangeInProgress` warning on the pod, then one a
    /// minute with the count so far.
    fn own(
        &self,
        permit: Permit,
        want: &VolumeToMount,
        pod: &SharedParams,
        group: FsGroup,
        r: &mut JobReport,
    ) -> Result<(), JobError> {
        let sys = self.sys.as_ref();
        let read_only = want.read_only
            || pod.mount_options().is_read_only()
            || pod.csi().is_some_and(|c| c.read_only);
        let failed = |source: SysError| PluginError::Sys {
            op: Operation::SetOwnership,
            volume: pod.volume.clone(),
            certainty: Certainty::Uncertain,
            cause: Box::new(source),
        };
        let walk = |permit: &Permit| {
            let path = pod.pod_mount_path.as_deref().unwrap_or(Path::new(""));
            let at = Beneath::split(self.layout.root(), path).ok_or_else(|| {
                PluginError::OutsideRoot {
                    op: Operation::SetOwnership,
                    volume: pod.volume.clone(),
                    path: path.to_owned(),
                    root: self.layout.root().to_owned(),
                }
            })?;
            let dir = sys.open_dir_beneath(at).map_err(failed)?;
            let shown = dir_to_report(path, want.pod.as_str());
            let started = Instant::now();
            let mut report = |p: Progress| self.progress(&want.pod, &shown, p);
            let walked = ownership::set_ownership(
                permit,
                sys,
                &dir,
                group,
                read_only,
                self.every,
                &mut report,
            )
            .map_err(failed)?;
            tracing::info!(volume = %pod.volume, pod = %want.pod, gid = group.gid,
                policy = group.policy.as_str(), skipped = walked.skipped,
                entries = walked.entries, changed = walked.changed, failed = walked.failed,
                mounts_left = walked.mounts.len(), ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                "fsGroup ownership set");
            Ok(Outcome::of(match walked.changed {
                0 => Action::AlreadyInPlace,
                _ => Action::Performed,
            }))
        };
        self.run_permitted(Operation::SetOwnership, pod, r, permit, None, walk)
            .map(drop)
    }

    /// A long walk's report: logged, and an event on the pod.
    fn progress(&self, pod: &PodUid, shown: &str, p: Progress) {
        let message = match p {
            Progress::Slow => format!(
                "Setting volume ownership for {shown} is taking longer than expected, \
                 consider using OnRootMismatch - {FS_GROUP_POLICY_DOC}"
            ),
            Progress::Processed(n) => {
                format!("Setting volume ownership for {shown}, processed {n} files.")
            }
        };
        match &self.events {
            Some(events) => events(PodEvent {
                pod: pod.clone(),
                names: None,
                reason: VOLUME_PERMISSION_CHANGE_IN_PROGRESS,
                message,
            }),
            None => tracing::warn!(pod = %pod, "{message}"),
        }
    }

    /// TearDown or UnmountDevice of `params`' target (UnmapPodDevice or
    /// UnmapDevice of a block one), journaled, with the parameters it was
    /// mounted with.
    fn undo(
        &self,
        op: Operation,
        params: &SharedParams,
        r: &mut JobReport,
        announced: &mut Option<Announced>,
    ) -> Result<(), JobError> {
        let sys = self.sys.as_ref();
        let plugin = self
            .plugin(params.plugin)
            .ok_or(JobError::NoPlugin(params.plugin))?;
        let op = op_for(op, params.kind);
        self.journaled(
            op,
            op_steps(op, params.plugin),
            params,
            r,
            announced,
            |permit: &Permit| match op {
                Operation::UnmountDevice => plugin.unmount_device(permit, params, sys),
                Operation::UnmapDevice => plugin.unmap_device(permit, params, sys),
                Operation::UnmapPodDevice => plugin.unmap_pod_device(permit, params, sys),
                _ => plugin.teardown(permit, params, sys),
            },
        )
    }

    /// A TearDown job: the pod leaves the ASW's volume once it succeeded.
    pub(super) fn tear_down(
        &self,
        params: &SharedParams,
        subpaths: Option<&str>,
        r: &mut JobReport,
        announced: &mut Option<Announced>,
    ) -> Result<(), JobError> {
        // The kubelet's CleanSubPaths before every TearDown: the volume's
        // subpath binds are unmounted and removed first; one that will not
        // go fails the TearDown (retried), so the volume is never torn
        // down under a bind of it.
        // The pod volume's name comes from the ASW, else from the
        // journal's binds of this volume. No bind is made into the volume
        // from the cleanup to the TearDown's end (the mark).
        let _closing = params
            .target
            .pod()
            .map(|pod| self.subpaths.closing(pod, &params.volume));
        if let TargetRef::Pod(pod) = &params.target {
            let names = match subpaths {
                Some(name) => vec![name.to_owned()],
                None => self.subpaths.names_of(pod, &params.volume),
            };
            for name in names {
                self.subpaths
                    .clean_volume(pod, &name, &params.volume)
                    .map_err(|e| JobError::Subpaths(format!("volume {name}: {e}")))?;
            }
        }
        self.undo(Operation::TearDown, params, r, announced)?;
        if let TargetRef::Pod(pod) = &params.target {
            r.updates.push(AswUpdate::PodRemoved {
                volume: params.volume.clone(),
                pod: pod.clone(),
            });
        }
        Ok(())
    }

    /// An UnmountDevice job: the device leaves the ASW once it succeeded.
    /// Once the call ran and failed, final or not, the device is uncertain,
    /// as the kubelet's `MarkDeviceAsUncertain` after a failed
    /// UnmountDevice: a NodeUnstage that failed may have unstaged part of
    /// the way, so the next pod of the volume stages it again (plan's
    /// "device uncertain: mount device again") instead of publishing from
    /// a staging path that may be gone. A job that never reached the call
    /// (no plugin, no intent) changed nothing and leaves the state as is.
    pub(super) fn unmount_device(
        &self,
        params: &SharedParams,
        r: &mut JobReport,
        announced: &mut Option<Announced>,
    ) -> Result<(), JobError> {
        match self.undo(Operation::UnmountDevice, params, r, announced) {
            Ok(()) => {
                r.updates.push(AswUpdate::DeviceUnmounted {
                    volume: params.volume.clone(),
                });
                Ok(())
            }
            Err(e) => {
                if reached_the_call(&e) {
                    r.updates.push(AswUpdate::DeviceUncertain {
                        volume: params.volume.clone(),
                        plugin: params.plugin,
                        spec_name: params.spec_name.clone(),
                        mount: DeviceMount {
                            device_path: params.device_path().map(Path::to_path_buf),
                            mount_path: params
                                .device_mount_path()
                                .map(Path::to_path_buf)
                                .unwrap_or_default(),
                            // the volume keeps the context it has
                            selinux: None,
                        },
                    });
                }
                Err(e)
            }
        }
    }

    /// A ForceCleanup job, journaled as the TearDown or UnmountDevice its
    /// target calls for; no ASW change.
    pub(super) fn force_cleanup(
        &self,
        params: &SharedParams,
        r: &mut JobReport,
        announced: &mut Option<Announced>,
    ) -> Result<(), JobError> {
        let sys = self.sys.as_ref();
        let op = match params.target {
            TargetRef::Pod(_) => Operation::TearDown,
            TargetRef::Device => Operation::UnmountDevice,
        };
        self.journaled(
            op,
            Steps::Single,
            params,
            r,
            announced,
            |permit: &Permit| plugins::force_unmount(permit, params, sys, &self.layout),
        )
    }
}

/// Whether a journaled step that failed with `e` got as far as its plugin
/// call: a plugin error, or an outcome the journal refused after the call.
fn reached_the_call(e: &JobError) -> bool {
    match e {
        JobError::Plugin { .. } => true,
        JobError::Journal { step, .. } => *step == "outcome",
        // the subpath cleanup runs before the TearDown's own call
        JobError::NotStarted(_) | JobError::NoPlugin(_) | JobError::Subpaths(_) => false,
    }
}

/// The kubelet's reason for a long ownership walk (a Warning).
pub(crate) const VOLUME_PERMISSION_CHANGE_IN_PROGRESS: &str = "VolumePermissionChangeInProgress";

/// Where the kubelet's slow-walk event points the pod's owner.
const FS_GROUP_POLICY_DOC: &str = "https://kubernetes.io/docs/tasks/configure-pod-container/security-context/#configure-volume-permission-and-ownership-change-policy-for-pods";

/// The volume's path as the kubelet's event shows it: from the pod's UID
/// on (`<uid>/volumes/<plugin>/<name>`), or whole when it lacks the UID.
fn dir_to_report(path: &Path, uid: &str) -> String {
    let s = path.to_string_lossy();
    match s.find(uid) {
        Some(i) => s[i..].to_owned(),
        None => s.into_owned(),
    }
}

/// A step that ended uncertain: the ASW learns it; a CSI call is also
/// watched for a late mount (`reconciler::core::late`), undone by `undo`.
fn uncertain(
    r: &mut JobReport,
    params: &SharedParams,
    path: crate::model::SharedPath,
    update: AswUpdate,
    undo: Job,
) {
    if params.csi().is_some() {
        r.late = Some(Box::new(LateWatch {
            path,
            uncertain: update.clone(),
            undo,
        }));
    }
    r.updates.push(update);
}
