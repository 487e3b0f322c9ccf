//! The operation executor: runs one planned operation on a worker thread —
//! intent to the journal, the plugin call through the syscall seam, outcome
//! to the journal — and returns the ASW changes it implies. It never touches
//! the ASW itself: the loop applies the returned [`AswUpdate`]s, so the ASW
//! has one mutation point.
//!
//! Crash points (`<op>.after_intent`, `<op>.after_op`) sit exactly where
//! DESIGN.md names them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crate::failpoint;
use crate::host::sys::Sys;
use crate::journal::{Body, Journal, OpResult};
use crate::metrics::{Metrics, StorageOperation};
use crate::model::{
    Layout, Operation, PluginName, PodUid, Steps, StorageMedium, TargetKind, TargetParams,
    TargetRef, UniqueVolumeName, VolumeSpec,
};
use crate::plugins::{EmptyDirPlugin, HostPathPlugin, LocalPlugin, PluginError, VolumePlugin};
use crate::state::{DeviceMount, PodMount, SeLinuxState, VolumeToMount};

use super::pending::OpKey;

/// A planned operation with everything the worker needs (built by the loop
/// from the plan, the ASW and the journal).
#[derive(Debug, Clone)]
pub enum Job {
    /// MountDevice (with its format step) when `device` is set, then SetUp.
    Mount {
        /// what to mount
        want: Box<VolumeToMount>,
        /// the device target's parameters, when it must be mounted first
        device: Option<TargetParams>,
        /// the pod target's parameters
        pod: TargetParams,
    },
    /// TearDown of one pod target.
    TearDown {
        /// the target (from the journal when it knows it, else the ASW)
        params: TargetParams,
    },
    /// UnmountDevice of a volume's device target.
    UnmountDevice {
        /// the target
        params: TargetParams,
    },
}

impl Job {
    /// The exclusivity key.
    pub fn key(&self) -> OpKey {
        match self {
            Job::Mount { want, .. } => OpKey::for_mount(&want.volume, &want.pod, &want.spec),
            Job::TearDown { params } => match &params.target {
                TargetRef::Pod(p) => OpKey::pod(&params.volume, p),
                TargetRef::Device => OpKey::volume(&params.volume),
            },
            Job::UnmountDevice { params } => OpKey::volume(&params.volume),
        }
    }
}

/// One change to the ASW an operation implies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AswUpdate {
    /// the device target is mounted
    DeviceMounted {
        /// volume
        volume: UniqueVolumeName,
        /// plugin
        plugin: PluginName,
        /// spec name
        spec_name: String,
        /// spec
        spec: Option<VolumeSpec>,
        /// how
        mount: DeviceMount,
    },
    /// the device target may be mounted
    DeviceUncertain {
        /// volume
        volume: UniqueVolumeName,
        /// plugin
        plugin: PluginName,
        /// spec name
        spec_name: String,
        /// how
        mount: DeviceMount,
    },
    /// the device target is unmounted
    DeviceUnmounted {
        /// volume
        volume: UniqueVolumeName,
    },
    /// a pod target is set up
    PodMounted {
        /// volume
        volume: UniqueVolumeName,
        /// plugin
        plugin: PluginName,
        /// spec name
        spec_name: String,
        /// spec
        spec: Option<VolumeSpec>,
        /// pod
        pod: PodUid,
        /// how
        mount: PodMount,
    },
    /// a pod target may be set up
    PodUncertain {
        /// volume
        volume: UniqueVolumeName,
        /// plugin
        plugin: PluginName,
        /// spec name
        spec_name: String,
        /// pod
        pod: PodUid,
        /// how
        mount: PodMount,
    },
    /// a pod target is torn down
    PodRemoved {
        /// volume
        volume: UniqueVolumeName,
        /// pod
        pod: PodUid,
    },
}

/// What one job did.
#[derive(Debug)]
pub struct JobReport {
    /// the job's key
    pub key: OpKey,
    /// the ASW changes, in order
    pub updates: Vec<AswUpdate>,
    /// the error that ended the job, if any
    pub error: Option<String>,
    /// operations that ran (for metrics and tests)
    pub ran: Vec<Operation>,
}

/// Runs jobs. Cheap to share between worker threads.
pub struct Executor {
    journal: Option<Arc<Journal>>,
    sys: Arc<dyn Sys>,
    metrics: Arc<Metrics>,
    empty_dir: EmptyDirPlugin,
    host_path: HostPathPlugin,
    local: LocalPlugin,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor").finish_non_exhaustive()
    }
}

/// Whether SetUp of `spec` is one syscall or several (the merge settles a
/// single-step intent from the host, and re-runs a multi-step one).
pub fn setup_steps(spec: &VolumeSpec) -> Steps {
    match spec {
        // tmpfs, then its mode: two steps a crash can cut apart
        VolumeSpec::EmptyDir {
            medium: StorageMedium::Memory,
            ..
        } => Steps::Multi,
        _ => Steps::Single,
    }
}

/// The parameters of a pod target, from what the DSW wants.
pub fn pod_params(layout: &Layout, want: &VolumeToMount) -> TargetParams {
    let (device_path, mount_options, fs_type) = spec_details(&want.spec);
    TargetParams {
        volume: want.volume.clone(),
        plugin: want.plugin,
        spec_name: want.spec_name.clone(),
        target: TargetRef::Pod(want.pod.clone()),
        kind: want.spec.pod_target_kind(),
        device_path,
        device_mount_path: device_mount_path(layout, want),
        pod_mount_path: Some(layout.pod_target_path(&want.pod, want.plugin, &want.spec_name)),
        selinux: want.selinux.clone(),
        mount_options,
        fs_type: match &want.spec {
            VolumeSpec::EmptyDir {
                medium: StorageMedium::Memory,
                ..
            } => Some("tmpfs".into()),
            _ => fs_type,
        },
    }
}

/// The parameters of a device target, from what the DSW wants.
pub fn device_params(layout: &Layout, want: &VolumeToMount) -> TargetParams {
    let (device_path, mount_options, fs_type) = spec_details(&want.spec);
    TargetParams {
        volume: want.volume.clone(),
        plugin: want.plugin,
        spec_name: want.spec_name.clone(),
        target: TargetRef::Device,
        kind: TargetKind::Mount,
        device_path,
        device_mount_path: device_mount_path(layout, want),
        pod_mount_path: None,
        selinux: want.selinux.clone(),
        mount_options,
        fs_type,
    }
}

fn device_mount_path(layout: &Layout, want: &VolumeToMount) -> Option<PathBuf> {
    match want.spec.device_target_kind() {
        Some(_) if want.plugin == PluginName::LocalVolume => {
            Some(layout.local_device_path(&want.spec_name))
        }
        _ => None,
    }
}

fn spec_details(spec: &VolumeSpec) -> (Option<PathBuf>, Vec<String>, Option<String>) {
    match spec {
        VolumeSpec::Local {
            path,
            fs_type,
            mount_options,
            ..
        } => (Some(path.clone()), mount_options.clone(), fs_type.clone()),
        VolumeSpec::EmptyDir {
            size_limit: Some(bytes),
            medium: StorageMedium::Memory,
        } => (None, vec![format!("size={bytes}")], None),
        VolumeSpec::HostPath { path, .. } => (Some(path.clone()), vec![], None),
        _ => (None, vec![], None),
    }
}

impl Executor {
    /// An executor over the journal (`None`: journal off), the seam and the metrics.
    pub fn new(journal: Option<Arc<Journal>>, sys: Arc<dyn Sys>, metrics: Arc<Metrics>) -> Self {
        Self {
            journal,
            sys,
            metrics,
            empty_dir: EmptyDirPlugin,
            host_path: HostPathPlugin,
            local: LocalPlugin,
        }
    }

    fn plugin(&self, name: PluginName) -> Option<&dyn VolumePlugin> {
        match name {
            PluginName::EmptyDir => Some(&self.empty_dir),
            PluginName::HostPath => Some(&self.host_path),
            PluginName::LocalVolume => Some(&self.local),
            PluginName::Csi => None,
        }
    }

    /// Journals the intent, runs `f`, journals the outcome. A journal that
    /// fails to append is fatal for the operation (nothing touches the OS
    /// without a durable intent).
    fn journaled(
        &self,
        op: Operation,
        steps: Steps,
        params: &TargetParams,
        ran: &mut Vec<Operation>,
        f: impl FnOnce() -> Result<crate::plugins::Outcome, PluginError>,
    ) -> Result<(), String> {
        let intent = match &self.journal {
            Some(j) => Some(
                j.append(Body::Intent {
                    op,
                    steps,
                    target: params.clone(),
                })
                .map_err(|e| format!("journal intent: {e}"))?,
            ),
            None => None,
        };
        failpoint::hit(&format!("{}.after_intent", op.as_str()));
        let result = f();
        ran.push(op);
        self.metrics.ops.plugin_operation(params.plugin, op);
        if result.is_ok() {
            failpoint::hit(&format!("{}.after_op", op.as_str()));
        }
        if let (Some(j), Some(intent_seq)) = (&self.journal, intent) {
            let outcome = match &result {
                Ok(_) => OpResult::Success,
                Err(e) if e.is_uncertain() => OpResult::FailedUncertain(e.to_string()),
                Err(e) => OpResult::FailedFinal(e.to_string()),
            };
            j.append(Body::Outcome {
                intent_seq,
                op,
                result: outcome,
                observed: None,
            })
            .map_err(|e| format!("journal outcome: {e}"))?;
        }
        result.map(drop).map_err(|e| e.to_string())
    }

    /// Runs one job to its end.
    pub fn run(&self, job: &Job) -> JobReport {
        let mut report = JobReport {
            key: job.key(),
            updates: Vec::new(),
            error: None,
            ran: Vec::new(),
        };
        let started = Instant::now();
        let result = self.run_inner(job, &mut report);
        let (plugin, op) = match job {
            Job::Mount { want, .. } => (want.plugin, StorageOperation::VolumeMount),
            Job::TearDown { params } => (params.plugin, StorageOperation::VolumeUnmount),
            Job::UnmountDevice { params } => (params.plugin, StorageOperation::UnmountDevice),
        };
        // Like the kubelet, only operations that actually ran are observed.
        if !report.ran.is_empty() {
            self.metrics
                .ops
                .storage_operation(plugin, op, result.is_ok(), started.elapsed());
        }
        if let Err(e) = result {
            report.error = Some(e);
        }
        report
    }

    fn run_inner(&self, job: &Job, r: &mut JobReport) -> Result<(), String> {
        let sys = self.sys.as_ref();
        match job {
            Job::Mount { want, device, pod } => {
                let plugin = self
                    .plugin(want.plugin)
                    .ok_or_else(|| format!("no plugin for {}", want.plugin))?;
                if let Some(dev) = device {
                    let device_mount = DeviceMount {
                        device_path: dev.device_path.clone(),
                        mount_path: dev.device_mount_path.clone().unwrap_or_default(),
                        selinux: dev.selinux.clone(),
                    };
                    let needs = plugin
                        .needs_format(&want.spec, dev, sys)
                        .map_err(|e| e.to_string())?;
                    if needs {
                        self.journaled(Operation::FormatDevice, Steps::Multi, dev, &mut r.ran, || {
                            plugin.format(&want.spec, dev, sys)
                        })?;
                    }
                    let res = self.journaled(Operation::MountDevice, Steps::Single, dev, &mut r.ran, || {
                        plugin.mount_device(&want.spec, dev, sys)
                    });
                    match res {
                        Ok(()) => r.updates.push(AswUpdate::DeviceMounted {
                            volume: want.volume.clone(),
                            plugin: want.plugin,
                            spec_name: want.spec_name.clone(),
                            spec: Some(want.spec.clone()),
                            mount: device_mount,
                        }),
                        Err(e) => {
                            r.updates.push(AswUpdate::DeviceUncertain {
                                volume: want.volume.clone(),
                                plugin: want.plugin,
                                spec_name: want.spec_name.clone(),
                                mount: device_mount,
                            });
                            return Err(e);
                        }
                    }
                }
                let pod_mount = PodMount {
                    outer_name: want.outer_name.clone(),
                    mount_path: pod.pod_mount_path.clone().unwrap_or_default(),
                    kind: pod.kind,
                    selinux: SeLinuxState::mounted_with(pod.selinux.clone()),
                };
                let res = self.journaled(Operation::SetUp, setup_steps(&want.spec), pod, &mut r.ran, || {
                    plugin.setup(&want.spec, pod, sys)
                });
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
                    Err(e) => {
                        r.updates.push(AswUpdate::PodUncertain {
                            volume: want.volume.clone(),
                            plugin: want.plugin,
                            spec_name: want.spec_name.clone(),
                            pod: want.pod.clone(),
                            mount: pod_mount,
                        });
                        Err(e)
                    }
                }
            }
            Job::TearDown { params } => {
                let plugin = self
                    .plugin(params.plugin)
                    .ok_or_else(|| format!("no plugin for {}", params.plugin))?;
                self.journaled(Operation::TearDown, Steps::Single, params, &mut r.ran, || {
                    plugin.teardown(params, sys)
                })?;
                if let TargetRef::Pod(pod) = &params.target {
                    r.updates.push(AswUpdate::PodRemoved {
                        volume: params.volume.clone(),
                        pod: pod.clone(),
                    });
                }
                Ok(())
            }
            Job::UnmountDevice { params } => {
                let plugin = self
                    .plugin(params.plugin)
                    .ok_or_else(|| format!("no plugin for {}", params.plugin))?;
                self.journaled(Operation::UnmountDevice, Steps::Single, params, &mut r.ran, || {
                    plugin.unmount_device(params, sys)
                })?;
                r.updates.push(AswUpdate::DeviceUnmounted {
                    volume: params.volume.clone(),
                });
                Ok(())
            }
        }
    }
}
