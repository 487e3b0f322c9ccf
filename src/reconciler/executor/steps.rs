//! The executor's job steps: MountDevice (with its format step), SetUp,
//! TearDown, UnmountDevice and the forced cleanup, each one journaled
//! plugin call and the ASW changes it implies.

use std::path::Path;

use super::Executor;
use crate::journal::{Announced, Permit};
use crate::model::{Operation, SharedParams, Steps, TargetRef};
use crate::plugins::{self, VolumePlugin};
use crate::reconciler::jobs::{AswUpdate, Job, JobError, JobReport, LateWatch};
use crate::reconciler::params::{op_steps, setup_steps};
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
        let needs = plugin
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
            Operation::MountDevice,
            op_steps(Operation::MountDevice, dev.plugin),
            dev,
            r,
            announced,
            |permit: &Permit| plugin.mount_device(permit, &want.spec, dev, sys),
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

    /// A Mount job's pod step: SetUp; the ASW learns of the pod's mount (as
    /// uncertain when the outcome is).
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
        let res = self.journaled(
            Operation::SetUp,
            setup_steps(&want.spec),
            pod,
            r,
            announced,
            |permit: &Permit| plugin.setup(permit, &want.spec, pod, sys),
        );
        match res {
            Ok(()) => {
                r.updates.push(AswUpdate::PodMounted {
                    volume: want.volume.clone(),
                    plugin: want.plugin,
                    spec_name: want.spec_name.clone(),
                    spec: Some(want.spec.clone()),
                    pod: want.pod.clone(),
                    mount: pod_mount,
                });
                Ok(())
            }
            Err(e) if !e.is_uncertain() => Err(e),
            Err(e) => {
                let path = pod_mount.mount_path.clone();
                let update = AswUpdate::PodUncertain {
                    volume: want.volume.clone(),
                    plugin: want.plugin,
                    spec_name: want.spec_name.clone(),
                    pod: want.pod.clone(),
                    mount: pod_mount,
                };
                let undo = Job::TearDown {
                    params: pod.clone(),
                    subpaths: Some(want.outer_name.clone()),
                };
                uncertain(r, pod, path, update, undo);
                Err(e)
            }
        }
    }

    /// TearDown or UnmountDevice of `params`' target, journaled, with the
    /// parameters it was mounted with.
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
        self.journaled(
            op,
            op_steps(op, params.plugin),
            params,
            r,
            announced,
            |permit: &Permit| match op {
                Operation::UnmountDevice => plugin.unmount_device(permit, params, sys),
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
        if let (TargetRef::Pod(pod), Some(name)) = (&params.target, subpaths) {
            crate::host::subpath::clean_volume(self.sys.as_ref(), &self.layout, pod, name)
                .map_err(|e| JobError::Subpaths(format!("volume {name}: {e}")))?;
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
