//! From plan to work and back: the [`Job`] types (what a worker runs, the
//! [`JobReport`] it returns, the [`AswUpdate`]s it implies, [`JobError`]),
//! [`job_for`], which turns a planned [`Action`] into a
//! job carrying every parameter the worker needs (from the DSW, the
//! journal's last parameters for the target, or the ASW), and
//! [`apply_update`], the one place a finished job changes the ASW.

use std::sync::Arc;

use crate::journal::{Announced, JournalError, JournalState, TargetKey};
use crate::model::{
    KubeletPath, Layout, Operation, PluginName, PodUid, SharedParams, SharedPath, SharedStr, Steps,
    TargetKind, TargetParams, TargetRef, UniqueVolumeName, VolumeSpec,
};
use crate::plugins::PluginError;
use crate::state::{ActualStateOfWorld, DeviceMount, PodMount, StateError, VolumeToMount};

use super::params::{device_params, op_for, op_steps, pod_params, pod_step};
use super::pending::OpKey;
use super::plan::Action;

/// A planned operation with everything the worker needs (built by the loop
/// from the plan, the ASW and the journal).
#[derive(Debug, Clone)]
pub(crate) enum Job {
    /// MountDevice (with its format step) when `device` is set, then SetUp.
    Mount {
        /// what to mount
        want: Box<VolumeToMount>,
        /// the device target's parameters, when it must be mounted first
        /// (shared, as every job's: the journal's state keeps the intent's
        /// `Arc`, so a mounted target's parameters exist once)
        device: Option<SharedParams>,
        /// the pod target's parameters
        pod: SharedParams,
    },
    /// MountDevice alone (with its format step), for a volume whose pod
    /// targets stayed mounted when its device target went away.
    MountDevice {
        /// the volume, as one pod that uses it wants it
        want: Box<VolumeToMount>,
        /// the device target's parameters
        device: SharedParams,
    },
    /// TearDown of one pod target.
    TearDown {
        /// the target (from the journal when it knows it, else the ASW)
        params: SharedParams,
        /// the pod volume's name (`pod.spec.volumes[x].name`) when the ASW
        /// knows it: its `volume-subpaths/<name>/` binds go first
        subpaths: Option<SharedStr>,
    },
    /// UnmountDevice of a volume's device target.
    UnmountDevice {
        /// the target
        params: SharedParams,
    },
    /// The one-time forced cleanup of a target reconstruction could not
    /// rebuild ([`crate::plugins::force_unmount`]): journaled as a TearDown (pod
    /// target) or UnmountDevice (device target); no ASW change (the target
    /// was never in the ASW).
    ForceCleanup {
        /// minimal parameters: a name for the journal, the plugin, the path
        params: SharedParams,
    },
    /// NodeExpandVolume of a mounted pod target whose claim grew (online
    /// expansion).
    Expand {
        /// the volume, as the pod wants it (its claim's size on the spec)
        want: Box<VolumeToMount>,
        /// the pod target's parameters
        pod: SharedParams,
    },
}

impl Job {
    /// The exclusivity key.
    pub(crate) fn key(&self) -> OpKey {
        match self {
            Job::Mount { want, .. } => OpKey::for_mount(&want.volume, &want.pod, &want.spec),
            Job::MountDevice { want, .. } => OpKey::volume(&want.volume),
            Job::TearDown { params, .. } => match &params.target {
                TargetRef::Pod(p) => OpKey::pod(&params.volume, p),
                TargetRef::Device => OpKey::volume(&params.volume),
            },
            Job::UnmountDevice { params } => OpKey::volume(&params.volume),
            Job::ForceCleanup { params } => match &params.target {
                TargetRef::Pod(p) => OpKey::pod(&params.volume, p),
                TargetRef::Device => OpKey::volume(&params.volume),
            },
            Job::Expand { want, .. } => OpKey::volume(&want.volume),
        }
    }
}

impl Job {
    /// The CSI driver the job calls, if any: whose pool of workers runs
    /// it (`daemon::pools`), so a driver that hangs holds only its own.
    pub(crate) fn csi_driver(&self) -> Option<&str> {
        let params = match self {
            Job::Mount { pod, .. } | Job::Expand { pod, .. } => pod,
            Job::MountDevice { device, .. } => device,
            Job::TearDown { params, .. }
            | Job::UnmountDevice { params }
            | Job::ForceCleanup { params } => params,
        };
        params.csi().map(|c| c.driver.as_str())
    }
}

/// A job on its way to a worker, with the sequence number of its first
/// step's intent when the loop already appended it ([`super::executor::Executor::announce`]):
/// the worker then waits for that record to be durable instead of writing
/// its own, so the intents of every job started in one pass share flushes.
#[derive(Debug)]
pub(crate) struct Queued {
    /// the job
    pub job: Job,
    /// its first step's intent, appended but perhaps not durable yet
    pub intent: Option<Announced>,
}

impl Job {
    /// The first step of the job when it is known before the job runs: its
    /// operation, steps and target. `None` for a mount with a device target
    /// (whether it is formatted first is read from the device on the worker).
    pub(crate) fn first_step(&self) -> Option<(Operation, Steps, &SharedParams)> {
        match self {
            Job::Mount {
                device: Some(_), ..
            }
            | Job::MountDevice { .. }
            | Job::Expand { .. } => None,
            Job::Mount {
                want,
                device: None,
                pod,
            } => {
                let (op, steps) = pod_step(want, pod.kind);
                Some((op, steps, pod))
            }
            // (a raw block target is unmapped: `op_for`)
            Job::TearDown { params, .. } => {
                let op = op_for(Operation::TearDown, params.kind);
                Some((op, op_steps(op, params.plugin), params))
            }
            Job::UnmountDevice { params } => {
                let op = op_for(Operation::UnmountDevice, params.kind);
                Some((op, op_steps(op, params.plugin), params))
            }
            Job::ForceCleanup { params } => {
                let op = match params.target {
                    TargetRef::Pod(_) => Operation::TearDown,
                    TargetRef::Device => Operation::UnmountDevice,
                };
                Some((op, Steps::Single, params))
            }
        }
    }
}

/// One change to the ASW an operation implies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AswUpdate {
    /// the device target is mounted
    DeviceMounted {
        /// volume
        volume: UniqueVolumeName,
        /// plugin
        plugin: PluginName,
        /// spec name
        spec_name: SharedStr,
        /// spec (shared with the DSW)
        spec: Option<Arc<VolumeSpec>>,
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
        spec_name: SharedStr,
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
        spec_name: SharedStr,
        /// spec (shared with the DSW)
        spec: Option<Arc<VolumeSpec>>,
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
        spec_name: SharedStr,
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
    /// a node expansion reached (or gave up on) a size
    Expanded {
        /// volume
        volume: UniqueVolumeName,
        /// the size
        bytes: u64,
    },
}

/// What one job did.
#[derive(Debug)]
pub(crate) struct JobReport {
    /// the job's key
    pub key: OpKey,
    /// the ASW changes, in order
    pub updates: Vec<AswUpdate>,
    /// the error that ended the job, if any
    pub error: Option<JobError>,
    /// operations that ran (for metrics and tests)
    pub ran: Vec<Operation>,
    /// a forced cleanup ([`Job::ForceCleanup`]): counted, never retried
    pub forced: bool,
    /// a CSI call that ended uncertain, to watch for a late mount
    pub late: Option<Box<LateWatch>>,
}

/// A CSI call volumed gave up on (a timeout, or a status the kubelet does
/// not treat as final) may still be running at the driver and mount after
/// volumed has undone the target — a leak nobody would ever unmount
/// (k8s #86360 class). The loop watches `path` for a while and, when a mount
/// shows up there that the ASW does not hold, puts `uncertain` back and runs
/// `undo` with the call's own parameters if no pod wants the volume.
#[derive(Debug, Clone)]
pub(crate) struct LateWatch {
    /// where the late call would mount
    pub path: SharedPath,
    /// the target as the ASW held it when the call ended
    pub uncertain: AswUpdate,
    /// UnmountDevice or TearDown with the parameters of the call
    pub undo: Job,
}

impl JobReport {
    /// The report of `job` not started at all (`why`): no ASW change,
    /// nothing ran, nothing journaled.
    pub(crate) fn not_started(job: &Job, why: &'static str) -> Self {
        JobReport {
            key: job.key(),
            updates: Vec::new(),
            error: Some(JobError::NotStarted(why)),
            ran: Vec::new(),
            forced: matches!(job, Job::ForceCleanup { .. }),
            late: None,
        }
    }
}

/// Why a job failed. The DSW keeps its message as the pod's error, as
/// the kubelet keeps its operation errors (strings, deduplicated).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum JobError {
    /// never started: the daemon is stopping
    #[error("not started: {0}")]
    NotStarted(&'static str),
    /// volumed has no plugin for the volume's type
    #[error("no plugin for {0}")]
    NoPlugin(PluginName),
    /// the journal refused an intent or an outcome: nothing more may
    /// touch the OS, and the target may have changed
    #[error("journal {step}: {message}")]
    Journal {
        /// `intent` or `outcome`
        step: &'static str,
        /// the journal's error
        message: String,
    },
    /// the plugin failed (`uncertain`: the target may have changed)
    #[error("{message}")]
    Plugin {
        /// the plugin's error
        message: String,
        /// whether the target may have changed
        uncertain: bool,
    },
    /// a subpath bind of the volume would not go: its TearDown did not
    /// start (the target is as it was)
    #[error("clean subpaths of {0}")]
    Subpaths(String),
}

impl JobError {
    /// Whether the target may have changed.
    pub(crate) fn is_uncertain(&self) -> bool {
        match self {
            JobError::Journal { .. } => true,
            JobError::Plugin { uncertain, .. } => *uncertain,
            JobError::NotStarted(_) | JobError::NoPlugin(_) | JobError::Subpaths(_) => false,
        }
    }

    pub(super) fn journal(step: &'static str, e: &JournalError) -> Self {
        JobError::Journal {
            step,
            message: e.to_string(),
        }
    }
}

impl From<&PluginError> for JobError {
    fn from(e: &PluginError) -> Self {
        JobError::Plugin {
            message: e.to_string(),
            uncertain: e.is_uncertain(),
        }
    }
}

/// The parameters of a target the journal knows, if it does (its `Arc`:
/// a clone is a count).
fn journaled(
    state: Option<&JournalState>,
    volume: &UniqueVolumeName,
    target: TargetRef,
) -> Option<SharedParams> {
    let key = TargetKey {
        volume: volume.clone(),
        target,
    };
    state
        .and_then(|s| s.get(&key))
        .map(|e| e.current_params().clone())
}

/// The job for a teardown (`TearDown`, `UnmountDevice`) from the journal's
/// last parameters for its target, when the journal knows them (they are
/// what was mounted; the ASW may know less).
pub(crate) fn journal_job(action: &Action, state: &JournalState) -> Option<Job> {
    match action {
        Action::TearDown { volume, pod } => {
            journaled(Some(state), volume, TargetRef::Pod(pod.clone())).map(|params| {
                Job::TearDown {
                    params,
                    subpaths: None,
                }
            })
        }
        Action::UnmountDevice { volume } => journaled(Some(state), volume, TargetRef::Device)
            .map(|params| Job::UnmountDevice { params }),
        Action::Mount { .. }
        | Action::MountDevice { .. }
        | Action::Expand { .. }
        | Action::Forget { .. } => None,
    }
}

/// A teardown job made from the journal's parameters, given the subpath
/// dir name the ASW's job (`fallback`) knows: the journal keeps no pod
/// volume names, and the TearDown must clean that volume's subpath binds
/// first.
pub(crate) fn keep_subpaths(journaled: Job, fallback: Option<&Job>) -> Job {
    match (journaled, fallback) {
        (
            Job::TearDown {
                params,
                subpaths: None,
            },
            Some(Job::TearDown { subpaths, .. }),
        ) => Job::TearDown {
            params,
            subpaths: subpaths.clone(),
        },
        (job, _) => job,
    }
}

/// The job for an action, or `None` when it needs no worker (`Forget`) or
/// the target's parameters are unknown (reported by the caller).
pub(crate) fn job_for(
    action: &Action,
    asw: &ActualStateOfWorld,
    journal: Option<&JournalState>,
    layout: &Layout,
) -> Option<Job> {
    match action {
        Action::Mount { want, mount_device } => Some(Job::Mount {
            device: mount_device.then(|| SharedParams::new(device_params(layout, want))),
            pod: SharedParams::new(pod_params(layout, want)),
            want: want.clone(),
        }),
        Action::MountDevice { want } => Some(Job::MountDevice {
            device: SharedParams::new(device_params(layout, want)),
            want: want.clone(),
        }),
        Action::Expand { want } => Some(Job::Expand {
            pod: SharedParams::new(pod_params(layout, want)),
            want: want.clone(),
        }),
        Action::TearDown { volume, pod } => {
            let subpaths = asw
                .pod(volume, pod)
                .map(|m| m.mount.outer_name.clone())
                .filter(|n| !n.is_empty());
            if let Some(Job::TearDown { params, .. }) = journal.and_then(|s| journal_job(action, s))
            {
                return Some(Job::TearDown { params, subpaths });
            }
            let target = TargetRef::Pod(pod.clone());
            let v = asw.volume(volume)?;
            let m = asw.pod(volume, pod)?;
            let device = v.device.as_ref();
            Some(Job::TearDown {
                params: TargetParams::at(
                    volume.clone(),
                    v.plugin,
                    v.spec_name.clone(),
                    target,
                    m.mount.kind,
                    Some(m.mount.mount_path.clone()),
                )
                .with_device_path(
                    device.and_then(|d| d.device_path.as_deref().map(SharedPath::from)),
                )
                .with_device_mount_path(
                    device.and_then(|d| d.mount_path.as_deref().map(SharedPath::from)),
                )
                .with_selinux(m.mount.selinux.context().cloned())
                .into(),
                subpaths,
            })
        }
        Action::UnmountDevice { volume } => {
            if let Some(job) = journal.and_then(|s| journal_job(action, s)) {
                return Some(job);
            }
            let v = asw.volume(volume)?;
            let d = v.device.as_ref()?;
            let mount_path = d.mount_path.as_deref()?;
            Some(Job::UnmountDevice {
                params: TargetParams::at(
                    volume.clone(),
                    v.plugin,
                    v.spec_name.clone(),
                    TargetRef::Device,
                    device_kind(layout, v.spec.as_deref(), mount_path),
                    Some(mount_path.into()),
                )
                .with_device_path(d.device_path.as_deref().map(SharedPath::from))
                .with_selinux(v.selinux().context().cloned())
                .into(),
            })
        }
        Action::Forget { .. } => None,
    }
}

/// The kind of a device target the journal does not give: the spec's,
/// else (a volume rebuilt from the host alone has none) its path's, as a
/// raw block volume's device target is its global map dir (a local PV's)
/// or its staging dir (a CSI volume's), so its undo is UnmapDevice.
fn device_kind(layout: &Layout, spec: Option<&VolumeSpec>, path: &std::path::Path) -> TargetKind {
    if let Some(kind) = spec.and_then(VolumeSpec::device_target_kind) {
        return kind;
    }
    match layout.parse(path) {
        Ok(KubeletPath::LocalBlockMap { .. } | KubeletPath::CsiBlockStaging { .. }) => {
            TargetKind::Block
        }
        _ => TargetKind::Mount,
    }
}

/// Applies one finished job's change to the ASW (the one mutation point
/// besides reconstruction).
pub(crate) fn apply_update(asw: &mut ActualStateOfWorld, u: &AswUpdate) -> Result<(), StateError> {
    match u {
        AswUpdate::DeviceMounted {
            volume,
            plugin,
            spec_name,
            spec,
            mount,
        } => {
            asw.add_volume(
                volume.clone(),
                *plugin,
                spec_name.clone(),
                spec.clone(),
                mount.device_path.clone(),
            );
            asw.mark_device_mounted(volume, mount.clone())
        }
        AswUpdate::DeviceUncertain {
            volume,
            plugin,
            spec_name,
            mount,
        } => {
            asw.add_volume(
                volume.clone(),
                *plugin,
                spec_name.clone(),
                None,
                mount.device_path.clone(),
            );
            asw.mark_device_uncertain(volume, mount.clone())
        }
        AswUpdate::DeviceUnmounted { volume } => asw.mark_device_unmounted(volume),
        AswUpdate::PodMounted {
            volume,
            plugin,
            spec_name,
            spec,
            pod,
            mount,
        } => {
            asw.add_volume(
                volume.clone(),
                *plugin,
                spec_name.clone(),
                spec.clone(),
                None,
            );
            asw.mark_volume_mounted(volume, pod, mount.clone())
        }
        AswUpdate::PodUncertain {
            volume,
            plugin,
            spec_name,
            pod,
            mount,
        } => {
            asw.add_volume(volume.clone(), *plugin, spec_name.clone(), None, None);
            asw.mark_volume_uncertain(volume, pod, mount.clone())
        }
        AswUpdate::PodRemoved { volume, pod } => asw.delete_pod_from_volume(volume, pod),
        AswUpdate::Expanded { volume, bytes } => {
            asw.mark_expanded(volume, *bytes);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{AccessMode, PluginName, PodUid, StorageMedium, VolumeSpec};
    use crate::reconciler::pending::OpKey;
    use crate::state::{DeviceMount, PodMount, SeLinuxState, VolumeToMount};

    /// The loop marks an action's key busy when it starts the job and frees
    /// the job's key when it reports: the two must be the same key for every
    /// action kind (`Action::key` and `Job::key` compute it from two shapes).
    #[test]
    fn a_job_has_the_exclusivity_key_of_its_action() {
        let layout = Layout::new("/r");
        let pod = PodUid::new("p1").unwrap();
        let block = VolumeSpec::Local {
            path: "/dev/loop0".into(),
            fs_type: Some("ext4".into()),
            access_modes: vec![AccessMode::ReadWriteOnce],
            mount_options: Default::default(),
            is_block: true,
            volume_mode: Default::default(),
        };
        let tmpfs = VolumeSpec::EmptyDir {
            medium: StorageMedium::Memory,
            size_limit: None,
        };
        let shared = UniqueVolumeName::shared(PluginName::LocalVolume, "pv1");
        let mut asw = ActualStateOfWorld::new();
        asw.add_volume(
            shared.clone(),
            PluginName::LocalVolume,
            "pv1",
            Some(block.clone().into()),
            None,
        );
        asw.mark_device_mounted(
            &shared,
            DeviceMount {
                device_path: Some("/dev/loop0".into()),
                mount_path: layout.local_device_path("pv1"),
                selinux: None,
            },
        )
        .unwrap();
        asw.mark_volume_mounted(
            &shared,
            &pod,
            PodMount {
                outer_name: "data".into(),
                mount_path: layout
                    .pod_target_path(&pod, PluginName::LocalVolume, "pv1")
                    .into(),
                kind: TargetKind::Mount,
                selinux: SeLinuxState::WithoutContext,
            },
        )
        .unwrap();
        let want = |spec: VolumeSpec, name: &str| {
            let volume = crate::model::PodVolume::unique_name(&spec, &pod, name);
            Box::new(VolumeToMount {
                volume,
                pod: pod.clone(),
                plugin: spec.plugin(),
                spec: spec.into(),
                spec_name: name.into(),
                outer_name: name.into(),
                selinux: None,
                csi_pod: None,
                read_only: false,
                fs_group: None,
            })
        };
        let actions = [
            Action::Mount {
                want: want(block, "pv1"),
                mount_device: true,
            },
            Action::Mount {
                want: want(tmpfs, "cache"),
                mount_device: false,
            },
            Action::TearDown {
                volume: shared.clone(),
                pod: pod.clone(),
            },
            Action::UnmountDevice {
                volume: shared.clone(),
            },
        ];
        let keys: Vec<OpKey> = actions.iter().map(Action::key).collect();
        assert_eq!(
            keys[0],
            OpKey::volume(&shared),
            "a shared device: volume-wide"
        );
        assert!(keys[1].pod.is_some(), "a per-pod tmpfs: per pod");
        for (action, key) in actions.iter().zip(keys) {
            let job = job_for(action, &asw, None, &layout).expect("a job");
            assert_eq!(job.key(), key, "{action:?}");
        }
        assert!(
            job_for(
                &Action::Forget {
                    volume: shared.clone()
                },
                &asw,
                None,
                &layout
            )
            .is_none()
        );

        // a TearDown names the pod volume (not the PV) whose subpath binds
        // go first, and keeps it when the journal gives the parameters
        let teardown = Action::TearDown {
            volume: shared.clone(),
            pod: pod.clone(),
        };
        let fallback = job_for(&teardown, &asw, None, &layout).expect("a job");
        let Job::TearDown { params, subpaths } = &fallback else {
            panic!("{fallback:?}");
        };
        assert_eq!(subpaths.as_deref(), Some("data"));
        let journaled = Job::TearDown {
            params: params.clone(),
            subpaths: None,
        };
        let kept = keep_subpaths(journaled.clone(), Some(&fallback));
        assert!(matches!(&kept, Job::TearDown { subpaths: Some(n), .. } if n.as_str() == "data"));
        let alone = keep_subpaths(journaled, None);
        assert!(matches!(alone, Job::TearDown { subpaths: None, .. }));
    }

    /// Without the journal (`--journal off`) a device target rebuilt from
    /// the host has no spec: its kind comes from its path, so a raw block
    /// volume's is unmapped (UnmapDevice), never unmounted as a mount.
    #[test]
    fn a_device_known_only_by_its_path_is_undone_as_its_kind() {
        let layout = Layout::new("/var/lib/kubelet");
        let table = [
            (layout.csi_block_staging_path("pv-raw"), TargetKind::Block),
            (layout.local_block_map_dir("pv-raw"), TargetKind::Block),
            (layout.local_device_path("pv1"), TargetKind::Mount),
            (
                layout.csi_device_path("d.example.com", "abc"),
                TargetKind::Mount,
            ),
            (std::path::PathBuf::from("/elsewhere"), TargetKind::Mount),
        ];
        for (path, kind) in table {
            assert_eq!(device_kind(&layout, None, &path), kind, "{path:?}");
            assert_eq!(
                op_for(Operation::UnmountDevice, kind) == Operation::UnmapDevice,
                kind == TargetKind::Block
            );
        }
    }
}
