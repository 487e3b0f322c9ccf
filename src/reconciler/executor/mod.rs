//! The operation executor: runs one planned operation on a worker thread —
//! intent to the journal, the plugin call through the syscall seam, outcome
//! to the journal — and returns the ASW changes it implies. It never touches
//! the ASW itself: the loop applies the returned [`AswUpdate`](super::jobs::AswUpdate)s, so the ASW
//! has one mutation point.
//!
//! Crash points (`<op>.after_intent`, `<op>.after_op`) sit here, around
//! the plugin call (docs/crash-points.md).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::Instant;

use crate::failpoint;
use crate::host::sys::Sys;
use crate::journal::{Announced, Journal, JournalError, OpResult, Permit};
use crate::metrics::{Metrics, StorageOperation};
use crate::model::{Layout, Operation, PluginName, SharedParams, Steps, TargetRef};
use crate::plugins::{self, PluginError, VolumePlugin};

use super::jobs::{Job, JobError, JobReport};

mod expand;
mod steps;
pub(crate) mod subpaths;

pub(crate) use expand::FILE_SYSTEM_RESIZE_SUCCESSFUL;

/// Runs jobs. Cheap to share between worker threads.
pub(crate) struct Executor {
    journal: Option<Arc<Journal>>,
    /// the kubelet layout: forced cleanup never unmounts a device a mount
    /// below `<root>/pods` uses, and removes dirs beneath the root
    layout: Layout,
    sys: Arc<dyn Sys>,
    metrics: Arc<Metrics>,
    plugins: Vec<Box<dyn VolumePlugin>>,
    /// where a pod's events raised while a job runs go (a long fsGroup
    /// walk's progress); none: only logged
    events: Option<PodEvents>,
    /// when a long walk reports its progress
    every: crate::plugins::ownership::ProgressEvery,
    /// the subPath binds a TearDown cleans first (shared with the runtime
    /// API, which makes them)
    subpaths: Arc<subpaths::Subpaths>,
    /// where a node expansion's claim status updates go (the API server);
    /// none: not written
    claims: Option<ClaimUpdates>,
}

/// Takes a claim status update a node expansion asks for (the daemon
/// hands it to the API server's side).
pub(crate) type ClaimUpdates = Arc<dyn Fn(crate::model::ClaimResize) + Send + Sync>;

/// Takes a pod's event raised while a job runs (the daemon stamps it and
/// hands it to its event sink).
pub(crate) type PodEvents = Arc<dyn Fn(crate::reconciler::effects::PodEvent) + Send + Sync>;

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor").finish_non_exhaustive()
    }
}

impl Executor {
    /// An executor over the journal (`None`: journal off), the seam, the
    /// kubelet layout and the metrics.
    pub(crate) fn new(
        journal: Option<Arc<Journal>>,
        sys: Arc<dyn Sys>,
        layout: &Layout,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            subpaths: Arc::new(subpaths::Subpaths::new(
                journal.clone(),
                sys.clone(),
                layout.clone(),
            )),
            journal,
            layout: layout.clone(),
            sys,
            metrics,
            plugins: plugins::all(layout),
            events: None,
            every: crate::plugins::ownership::ProgressEvery::KUBELET,
            claims: None,
        }
    }

    /// The same executor with `claims` taking the claim status updates of
    /// node expansions.
    pub(crate) fn with_claims(mut self, claims: ClaimUpdates) -> Self {
        self.claims = Some(claims);
        self
    }

    /// Cleans the subPath binds of `subpaths` (shared with whoever makes
    /// them, the runtime API, so both hold one lock) instead of its own.
    pub(crate) fn with_subpaths(mut self, subpaths: Arc<subpaths::Subpaths>) -> Self {
        self.subpaths = subpaths;
        self
    }

    /// The same executor with `events` taking the events its jobs raise.
    pub(crate) fn with_events(mut self, events: PodEvents) -> Self {
        self.events = Some(events);
        self
    }

    /// The same executor with one more plugin (the CSI plugin, which
    /// needs the driver registry), or with it in place of the one of its
    /// name (the payload plugins given the daemon's object stores).
    pub(crate) fn with_plugin(mut self, plugin: Box<dyn VolumePlugin>) -> Self {
        self.plugins.retain(|p| p.name() != plugin.name());
        self.plugins.push(plugin);
        self
    }

    fn plugin(&self, name: PluginName) -> Option<&dyn VolumePlugin> {
        self.plugins
            .iter()
            .find(|p| p.name() == name)
            .map(|p| p.as_ref())
    }

    /// Appends the intent of `job`'s first step without waiting for it to
    /// be durable ([`Job::first_step`]; `None` when it is not known ahead,
    /// or the journal is off). The worker that runs the job waits for it
    /// ([`Executor::run_queued`]) before touching the OS; until then the
    /// record reads, after a crash, like an intent whose operation was cut
    /// short before it began, which reconstruction settles from the host.
    pub(crate) fn announce(
        journal: &Journal,
        job: &Job,
    ) -> Result<Option<Announced>, JournalError> {
        let Some((op, steps, params)) = job.first_step() else {
            return Ok(None);
        };
        journal.announce(op, steps, params).map(Some)
    }

    /// The permit for `op`: the intent `announced` for this very operation
    /// made durable, else a new intent written durably (nothing without a
    /// journal). A journal that fails is fatal for the operation.
    fn permit(
        &self,
        op: Operation,
        steps: Steps,
        params: &SharedParams,
        announced: &mut Option<Announced>,
    ) -> Result<Permit, JobError> {
        let Some(j) = &self.journal else {
            return Ok(Permit::JournalOff);
        };
        let durable = match announced.take() {
            Some(a) if a.op() == op => j.confirm(a),
            other => {
                *announced = other;
                j.begin(op, steps, params)
            }
        };
        durable
            .map(Permit::Journaled)
            .map_err(|e| JobError::journal("intent", &e))
    }

    /// Journals the intent (durable before `f` runs), runs `f` with the
    /// permit, journals the outcome (appended, durable with the next flush)
    /// with the mount the plugin saw; what it left behind goes to the
    /// report.
    fn journaled(
        &self,
        op: Operation,
        steps: Steps,
        params: &SharedParams,
        r: &mut JobReport,
        announced: &mut Option<Announced>,
        f: impl FnOnce(&Permit) -> Result<crate::plugins::Outcome, PluginError>,
    ) -> Result<(), JobError> {
        let permit = self.permit(op, steps, params, announced)?;
        self.run_permitted(op, params, r, permit, None, f).map(drop)
    }

    /// [`Self::journaled`] with its permit in hand; with `next`, a success's
    /// outcome is written with the next operation's intent in one batch,
    /// both durable on return ([`Journal::finish_then_begin`]), and the
    /// next operation's permit is returned.
    fn run_permitted(
        &self,
        op: Operation,
        params: &SharedParams,
        r: &mut JobReport,
        permit: Permit,
        next: Option<(Operation, Steps)>,
        f: impl FnOnce(&Permit) -> Result<crate::plugins::Outcome, PluginError>,
    ) -> Result<Option<Permit>, JobError> {
        failpoint::hit(&format!("{}.after_intent", op.as_str()));
        let result = f(&permit);
        r.ran.push(op);
        self.metrics.ops.plugin_operation(params.plugin, op);
        if let Err(PluginError::MountsBeneath { path, mounts, .. }) = &result {
            // the job's error is logged and shown as the pod's; this says
            // which mounts hold the volume dir, and counts it
            tracing::warn!(volume = %params.volume, path = %path.display(), ?mounts,
                "mounts beneath a volume dir: left in place, neither renamed nor emptied");
            self.metrics.ops.nested_mounts_left(params.plugin);
        }
        if result.is_ok() {
            failpoint::hit(&format!("{}.after_op", op.as_str()));
        }
        let (outcome, observed) = match &result {
            Ok(o) => (OpResult::Success, o.seen.clone()),
            Err(e) if e.is_uncertain() => (OpResult::FailedUncertain(e.to_string()), None),
            Err(e) => (OpResult::FailedFinal(e.to_string()), None),
        };
        let mut next_permit = None;
        match (&self.journal, permit) {
            (Some(j), Permit::Journaled(intent)) => match (next, &result) {
                (Some((next_op, steps)), Ok(_)) => {
                    let durable = j
                        .finish_then_begin(intent, observed, next_op, steps, params)
                        .map_err(|e| JobError::journal("intent", &e))?;
                    next_permit = Some(Permit::Journaled(durable));
                }
                _ => {
                    j.finish(intent, outcome, observed)
                        .map_err(|e| JobError::journal("outcome", &e))?;
                }
            },
            _ => next_permit = next.map(|_| Permit::JournalOff),
        }
        let done = result.map_err(|e| JobError::from(&e))?;
        self.check_csi_label(params, op, done.seen.as_ref());
        if done.action == crate::plugins::Action::Remounted {
            tracing::info!(volume = %params.volume, op = op.as_str(),
                "the mount was in place with other options; remounted in place");
        }
        for path in &done.left_behind {
            tracing::warn!(volume = %params.volume, op = op.as_str(), path = %path.display(),
                "left in place: a mount point or a non-empty dir the operation does not remove");
        }
        Ok(next_permit)
    }

    /// A CSI call asked to mount with `context=` (KEP-1710) is checked
    /// against the mount it left: a driver that drops the option gives the
    /// pod files without the label. Warned and counted; the ASW keeps the
    /// label asked for, as the kubelet's does (another mount would not
    /// bring it), and reconstruction keeps it too (`reconstruct::apply`).
    fn check_csi_label(
        &self,
        params: &SharedParams,
        op: Operation,
        seen: Option<&crate::model::MountIdentity>,
    ) {
        let (Some(csi), Some(wanted), Some(seen)) = (params.csi(), params.selinux(), seen) else {
            return;
        };
        if seen.selinux.as_ref() == Some(wanted) {
            return;
        }
        tracing::warn!(volume = %params.volume, op = op.as_str(), driver = %csi.driver,
            wanted = wanted.as_str(), seen = seen.selinux.as_ref().map_or("", |c| c.as_str()),
            "the CSI driver mounted without the context= label it was given");
        self.metrics
            .ops
            .csi_label_ignored
            .with_label_values(&[csi.driver.as_str()])
            .inc();
    }

    /// Runs `job` unless the daemon is stopping: a job still queued when
    /// `stopping` is set is not in flight, so it is not started — nothing
    /// journaled, nothing touched — and reported as not started.
    /// An intent the loop already `announced` for it gets a final failure
    /// outcome (its operation never ran, and the journal says so).
    pub(crate) fn run_unless_stopping(
        &self,
        job: &Job,
        announced: Option<Announced>,
        stopping: &AtomicBool,
    ) -> JobReport {
        if !stopping.load(AtomicOrdering::Relaxed) {
            return self.run_queued(job, announced);
        }
        let why = "volumed is stopping";
        let mut report = JobReport::not_started(job, why);
        if let (Some(j), Some(a)) = (&self.journal, announced)
            && let Err(e) = j.withdraw(a, format!("not started: {why}"))
        {
            report.error = Some(JobError::journal("outcome", &e));
        }
        report
    }

    #[cfg(test)]
    /// Runs one job to its end.
    pub(crate) fn run(&self, job: &Job) -> JobReport {
        self.run_queued(job, None)
    }

    /// Runs one job to its end whose first intent may already be appended
    /// ([`Executor::announce`]): it is made durable before the first step
    /// touches the OS.
    pub(crate) fn run_queued(&self, job: &Job, announced: Option<Announced>) -> JobReport {
        let mut announced = announced;
        let mut report = JobReport {
            key: job.key(),
            updates: Vec::new(),
            error: None,
            ran: Vec::new(),
            forced: matches!(job, Job::ForceCleanup { .. }),
            late: None,
        };
        let started = Instant::now();
        let mut result = self.run_inner(job, &mut report, &mut announced);
        // An announced intent the job ended before reaching (no plugin for
        // it): its operation never ran, and the journal says so.
        if let (Some(j), Some(a)) = (&self.journal, announced) {
            let why = match &result {
                Err(e) => e.to_string(),
                Ok(()) => "not run".to_owned(),
            };
            if let Err(e) = j.withdraw(a, why) {
                result = Err(JobError::journal("outcome", &e));
            }
        }
        let (params, op) = match job {
            Job::Mount { pod, .. } => (pod, StorageOperation::VolumeMount),
            // the kubelet has no operation of its own for this: MountDevice
            // is part of its volume_mount
            Job::MountDevice { device, .. } => (device, StorageOperation::VolumeMount),
            Job::TearDown { params, .. } => (params, StorageOperation::VolumeUnmount),
            Job::UnmountDevice { params } => (params, StorageOperation::UnmountDevice),
            Job::ForceCleanup { params } => match params.target {
                TargetRef::Pod(_) => (params, StorageOperation::VolumeUnmount),
                TargetRef::Device => (params, StorageOperation::UnmountDevice),
            },
            // observed by the step itself (`expand.rs`), as after a SetUp
            Job::Expand { pod, .. } => (pod, StorageOperation::VolumeFsResize),
        };
        // Like the kubelet, only operations that actually ran are observed;
        // a CSI volume's plugin label names its driver.
        if !report.ran.is_empty() && !matches!(job, Job::Expand { .. }) {
            let label = match params.csi() {
                Some(c) => format!("{}:{}", params.plugin.as_str(), c.driver),
                None => params.plugin.as_str().to_owned(),
            };
            self.metrics
                .ops
                .storage_operation(&label, op, result.is_ok(), started.elapsed());
        }
        if let Err(e) = result {
            report.error = Some(e);
        }
        report
    }

    fn run_inner(
        &self,
        job: &Job,
        r: &mut JobReport,
        announced: &mut Option<Announced>,
    ) -> Result<(), JobError> {
        match job {
            Job::Mount { want, device, pod } => {
                let plugin = self
                    .plugin(want.plugin)
                    .ok_or(JobError::NoPlugin(want.plugin))?;
                if let Some(dev) = device {
                    self.mount_device(plugin, want, dev, r, announced)?;
                }
                self.set_up(plugin, want, pod, r, announced)
            }
            Job::MountDevice { want, device } => {
                let plugin = self
                    .plugin(want.plugin)
                    .ok_or(JobError::NoPlugin(want.plugin))?;
                self.mount_device(plugin, want, device, r, announced)
            }
            Job::TearDown { params, subpaths } => {
                self.tear_down(params, subpaths.as_deref(), r, announced)
            }
            Job::UnmountDevice { params } => self.unmount_device(params, r, announced),
            Job::ForceCleanup { params } => self.force_cleanup(params, r, announced),
            Job::Expand { want, pod } => {
                let plugin = self
                    .plugin(want.plugin)
                    .ok_or(JobError::NoPlugin(want.plugin))?;
                // the online case (the kubelet's `ExpandInUseVolume`): the
                // same step as after SetUp
                self.expand_after_set_up(plugin, want, pod, r)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::recording_sys::RecordingSys;
    use crate::host::sys::{Call, DiskFormat, Errno, MsFlags, SysCall};
    use crate::journal::{Body, JournalConfig, Record};
    use crate::model::{
        AccessMode, DevId, MountIdentity, MountState, PodUid, PodVolume, StorageMedium, VolumeSpec,
    };
    use crate::reconciler::jobs::AswUpdate;
    use crate::reconciler::params::{device_params, pod_params};
    use crate::state::VolumeToMount;
    use std::path::{Path, PathBuf};

    struct Fixture {
        _dir: tempfile::TempDir,
        journal: Arc<Journal>,
        sys: Arc<RecordingSys>,
        layout: Layout,
        exec: Executor,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let (j, _) = Journal::open(&JournalConfig::new(dir.path().join("j"), "n", "b")).unwrap();
        let journal = Arc::new(j);
        let sys = Arc::new(RecordingSys::new());
        // the root dir exists (the daemon makes it); targets are made beneath it
        sys.add("/r", crate::host::sys::FileKind::Dir);
        let layout = Layout::new("/r");
        let metrics = Arc::new(Metrics::new().unwrap());
        let exec = Executor::new(Some(journal.clone()), sys.clone(), &layout, metrics);
        Fixture {
            _dir: dir,
            journal,
            sys,
            layout,
            exec,
        }
    }

    fn want(spec: VolumeSpec, pod: &str, name: &str) -> VolumeToMount {
        let pod = PodUid::new(pod).unwrap();
        VolumeToMount {
            volume: PodVolume::unique_name(&spec, &pod, name),
            plugin: spec.plugin(),
            spec: spec.into(),
            pod,
            spec_name: name.into(),
            outer_name: name.into(),
            selinux: None,
            csi_pod: None,
            read_only: false,
            fs_group: None,
        }
    }

    fn mount_job(f: &Fixture, want: VolumeToMount, device: bool) -> Job {
        Job::Mount {
            device: device.then(|| device_params(&f.layout, &want).into()),
            pod: pod_params(&f.layout, &want).into(),
            want: Box::new(want),
        }
    }

    /// Whether `r` is the success outcome of intent `intent`.
    fn succeeded(r: &Record, intent: u64) -> bool {
        matches!(&r.body, Body::Outcome { intent_seq, result: OpResult::Success, .. } if *intent_seq == intent)
    }

    fn records(f: &Fixture) -> Vec<Record> {
        f.journal.current("n").unwrap().tail
    }

    /// A local PV on the block device `/dev/loop9`, ext4.
    fn block_pv() -> VolumeSpec {
        VolumeSpec::Local {
            path: "/dev/loop9".into(),
            fs_type: Some("ext4".into()),
            access_modes: vec![AccessMode::ReadWriteOnce],
            mount_options: Default::default(),
            is_block: true,
            volume_mode: Default::default(),
        }
    }

    fn tmpfs() -> VolumeSpec {
        VolumeSpec::EmptyDir {
            medium: StorageMedium::Memory,
            size_limit: Some(1 << 20),
        }
    }

    #[test]
    fn a_job_dequeued_while_stopping_is_not_started() {
        let f = fixture();
        let job = mount_job(&f, want(tmpfs(), "p1", "cache"), false);
        let stopping = AtomicBool::new(true);
        let report = f.exec.run_unless_stopping(&job, None, &stopping);
        assert_eq!(
            report.error,
            Some(JobError::NotStarted("volumed is stopping"))
        );
        assert_eq!(
            report.error.map(|e| e.to_string()).as_deref(),
            Some("not started: volumed is stopping")
        );
        assert!(report.ran.is_empty() && report.updates.is_empty());
        assert!(records(&f).is_empty(), "nothing journaled");
        assert!(f.sys.mutations().is_empty(), "{:?}", f.sys.mutations());

        // announced by the loop before the stop: the intent gets its final
        // failure outcome, and still nothing touches the OS
        let announced = Executor::announce(&f.journal, &job).unwrap();
        let report = f.exec.run_unless_stopping(&job, announced, &stopping);
        assert!(report.ran.is_empty() && report.updates.is_empty());
        f.journal.flush_pending().unwrap();
        let recs = records(&f);
        assert_eq!(recs.len(), 2, "{recs:?}");
        assert!(matches!(
            &recs[1].body,
            Body::Outcome {
                intent_seq: 1,
                result: OpResult::FailedFinal(_),
                ..
            }
        ));
        assert!(f.sys.mutations().is_empty(), "{:?}", f.sys.mutations());

        stopping.store(false, AtomicOrdering::Relaxed);
        let report = f.exec.run_unless_stopping(&job, None, &stopping);
        assert_eq!(report.error, None);
        assert_eq!(report.ran, vec![Operation::SetUp]);
    }

    #[test]
    fn a_mount_writes_its_intent_before_the_os_and_its_outcome_after() {
        let f = fixture();
        let report = f
            .exec
            .run(&mount_job(&f, want(tmpfs(), "p1", "cache"), false));
        assert_eq!(report.error, None);
        assert_eq!(report.ran, vec![Operation::SetUp]);
        let recs = records(&f);
        assert_eq!(recs.len(), 2);
        assert!(matches!(
            &recs[0].body,
            Body::Intent {
                op: Operation::SetUp,
                steps: Steps::Multi,
                ..
            }
        ));
        assert!(succeeded(&recs[1], 1));
        let target =
            f.layout
                .pod_target_path(&PodUid::new("p1").unwrap(), PluginName::EmptyDir, "cache");
        assert!(
            f.sys
                .mounts()
                .iter()
                .any(|m| m.target == target && m.fstype == "tmpfs"),
            "{:?}",
            f.sys.mounts()
        );
        assert!(matches!(
            &report.updates[..],
            [AswUpdate::PodMounted { .. }]
        ));
    }

    #[test]
    fn announced_intents_are_not_written_again_and_share_one_flush() {
        let f = fixture();
        let jobs = [
            mount_job(&f, want(tmpfs(), "p1", "cache"), false),
            mount_job(&f, want(tmpfs(), "p2", "cache"), false),
        ];
        let announced: Vec<Announced> = jobs
            .iter()
            .map(|j| Executor::announce(&f.journal, j).unwrap().unwrap())
            .collect();
        assert_eq!(
            announced
                .iter()
                .map(|a| (a.op(), a.seq()))
                .collect::<Vec<_>>(),
            [(Operation::SetUp, 1), (Operation::SetUp, 2)]
        );
        assert_eq!(f.journal.synced_through(), 0, "announcing does not flush");
        assert!(f.sys.mounts().is_empty());
        let flushes = f.journal.flush_count();
        for (job, a) in jobs.iter().zip(announced) {
            let seq = a.seq();
            let report = f.exec.run_queued(job, Some(a));
            assert_eq!(report.error, None);
            assert!(f.journal.synced_through() >= seq);
        }
        assert_eq!(
            f.journal.flush_count(),
            flushes + 1,
            "the first job's wait made both intents durable"
        );
        let recs = records(&f);
        assert_eq!(recs.len(), 4, "two intents, two outcomes: {recs:?}");
        assert!(succeeded(&recs[2], 1));
        assert!(succeeded(&recs[3], 2));
        assert_eq!(f.sys.mounts().len(), 2);
    }

    #[test]
    fn a_mount_with_a_device_target_is_not_announced() {
        let f = fixture();
        let spec = block_pv();
        let job = mount_job(&f, want(spec, "p1", "pv1"), true);
        assert_eq!(Executor::announce(&f.journal, &job).unwrap(), None);
        assert!(records(&f).is_empty());
    }

    #[test]
    fn a_blank_device_is_formatted_as_its_own_journaled_step_then_mounted_then_bound() {
        let f = fixture();
        f.sys.add_device(
            "/dev/loop9",
            DevId { major: 7, minor: 9 },
            DiskFormat::Unformatted,
        );
        let spec = block_pv();
        let report = f
            .exec
            .run(&mount_job(&f, want(spec.clone(), "p1", "pv1"), true));
        assert_eq!(report.error, None);
        assert_eq!(
            report.ran,
            vec![
                Operation::FormatDevice,
                Operation::MountDevice,
                Operation::SetUp
            ]
        );
        let ops: Vec<_> = records(&f)
            .iter()
            .filter_map(|r| match &r.body {
                Body::Intent { op, steps, .. } => Some((*op, *steps)),
                _ => None,
            })
            .collect();
        assert_eq!(
            ops,
            vec![
                (Operation::FormatDevice, Steps::Multi),
                (Operation::MountDevice, Steps::Single),
                (Operation::SetUp, Steps::Single)
            ]
        );
        assert!(
            f.sys
                .calls()
                .iter()
                .any(|c| matches!(c, SysCall::Mkfs { .. }))
        );
        // A second pod: the device is formatted already and stays mounted.
        let before = f
            .sys
            .calls()
            .iter()
            .filter(|c| matches!(c, SysCall::Mkfs { .. }))
            .count();
        let report = f.exec.run(&mount_job(&f, want(spec, "p2", "pv1"), false));
        assert_eq!(report.ran, vec![Operation::SetUp]);
        assert_eq!(
            f.sys
                .calls()
                .iter()
                .filter(|c| matches!(c, SysCall::Mkfs { .. }))
                .count(),
            before,
            "never reformat"
        );
    }

    #[test]
    fn an_outcome_records_the_mount_the_plugin_saw_in_place() {
        let f = fixture();
        f.sys.add_device(
            "/dev/loop9",
            DevId { major: 7, minor: 9 },
            DiskFormat::Filesystem("ext4".into()),
        );
        let job = mount_job(&f, want(block_pv(), "p1", "pv1"), true);
        let observed = |f: &Fixture| -> Vec<(Operation, Option<MountIdentity>)> {
            records(f)
                .iter()
                .filter_map(|r| match &r.body {
                    Body::Outcome { op, observed, .. } => Some((*op, observed.clone())),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(f.exec.run(&job).error, None);
        f.journal.flush_pending().unwrap();
        let first = observed(&f);
        assert!(
            first.iter().all(|(_, o)| o.is_none()),
            "a fresh mount is not looked up: {first:?}"
        );
        // the same job again (a restart that re-runs it): both mounts are
        // found in the table, and what was seen is journaled
        assert_eq!(f.exec.run(&job).error, None);
        f.journal.flush_pending().unwrap();
        let again = &observed(&f)[first.len()..];
        assert_eq!(again.len(), 2, "{again:?}");
        let (op, seen) = &again[0];
        assert_eq!(*op, Operation::MountDevice);
        let seen = seen.as_ref().expect("the device mount was seen");
        assert_eq!(seen.dev, DevId { major: 7, minor: 9 });
        assert_eq!(seen.fs_type, "ext4");
        assert!(again[1].1.is_some(), "the pod bind was seen too");
    }

    #[test]
    fn failures_are_journaled_final_or_uncertain_and_only_uncertain_ones_touch_the_asw() {
        for (errno, uncertain) in [(Errno::EPERM, false), (Errno::EIO, true)] {
            let f = fixture();
            f.sys.fail_nth(Call::Mount, 1, errno);
            let report = f
                .exec
                .run(&mount_job(&f, want(tmpfs(), "p1", "cache"), false));
            let err = report.error.clone().expect("the mount failed");
            assert_eq!(err.is_uncertain(), uncertain, "{err}");
            let err = err.to_string();
            assert!(err.contains("cache"), "the error names the volume: {err}");
            let recs = records(&f);
            let outcome = match &recs[1].body {
                Body::Outcome { result, .. } => result.clone(),
                other => panic!("{other:?}"),
            };
            assert_eq!(
                matches!(outcome, OpResult::FailedUncertain(_)),
                uncertain,
                "{errno}: {outcome:?}"
            );
            assert_eq!(
                matches!(outcome, OpResult::FailedFinal(_)),
                !uncertain,
                "{errno}: {outcome:?}"
            );
            assert_eq!(
                !report.updates.is_empty(),
                uncertain,
                "{errno}: {:?}",
                report.updates
            );
            let state = f.journal.state();
            let entry = state.entries().next().unwrap().1;
            let want_state = if uncertain {
                MountState::Uncertain
            } else {
                MountState::NotMounted
            };
            assert_eq!(entry.reported_state(), want_state);
        }
    }

    /// The kubelet's CleanSubPaths: the volume's subpath binds are
    /// unmounted and their dirs removed before its TearDown; another
    /// volume's stay. One that will not unmount fails the TearDown before
    /// it starts.
    #[test]
    fn a_teardown_unmounts_and_removes_its_volume_s_subpath_binds_first() {
        let f = fixture();
        let w = want(tmpfs(), "p1", "cache");
        f.exec.run(&mount_job(&f, w.clone(), false));
        let pod = PodUid::new("p1").unwrap();
        let bind = f.layout.subpath_target(&pod, "cache", "app", 0);
        let other = f.layout.subpath_target(&pod, "other", "app", 0);
        f.sys.add("/src", crate::host::sys::FileKind::Dir);
        for p in [&bind, &other] {
            f.sys.add(p, crate::host::sys::FileKind::Dir);
            f.sys
                .preset_mount(Some(Path::new("/src")), p, None, MsFlags::MS_BIND, None)
                .unwrap();
        }
        let job = |subpaths: Option<&str>| Job::TearDown {
            params: pod_params(&f.layout, &w).into(),
            subpaths: subpaths.map(Into::into),
        };
        f.sys.fail_nth(Call::Umount, 1, Errno::EBUSY);
        let report = f.exec.run(&job(Some("cache")));
        let e = report.error.expect("a busy bind fails the teardown");
        assert!(
            e.to_string()
                .starts_with("clean subpaths of volume cache: "),
            "{e}"
        );
        assert!(report.ran.is_empty(), "the teardown did not start");

        let before = f.sys.calls().len();
        let report = f.exec.run(&job(Some("cache")));
        assert_eq!(report.error, None);
        let umounts: Vec<PathBuf> = f.sys.calls()[before..]
            .iter()
            .filter_map(|c| match c {
                SysCall::Umount { target, .. } => Some(target.clone()),
                _ => None,
            })
            .collect();
        let target = f
            .layout
            .pod_target_path(&pod, PluginName::EmptyDir, "cache");
        assert_eq!(umounts, [bind.clone(), target], "the bind first");
        assert!(!f.sys.exists(&bind) && !f.sys.exists(bind.parent().unwrap()));
        assert!(
            f.sys.mounts().iter().any(|m| m.target == other),
            "another volume's stays"
        );
    }

    #[test]
    fn teardown_and_unmount_device_run_from_journal_params_alone() {
        let f = fixture();
        let w = want(tmpfs(), "p1", "cache");
        f.exec.run(&mount_job(&f, w.clone(), false));
        let params = pod_params(&f.layout, &w);
        let report = f.exec.run(&Job::TearDown {
            params: params.into(),
            subpaths: None,
        });
        assert_eq!(report.error, None);
        assert_eq!(report.ran, vec![Operation::TearDown]);
        assert!(
            f.sys.mounts().iter().all(|m| m.fstype != "tmpfs"),
            "{:?}",
            f.sys.mounts()
        );
        assert!(matches!(
            &report.updates[..],
            [AswUpdate::PodRemoved { .. }]
        ));
    }

    /// An UnmountDevice that fails, final or uncertain, leaves the device
    /// uncertain (the kubelet's `MarkDeviceAsUncertain`), so the next pod
    /// mounts it again; one that succeeds leaves it unmounted.
    #[test]
    fn a_failed_unmount_device_leaves_the_device_uncertain() {
        for errno in [Errno::EBUSY, Errno::EIO] {
            let f = fixture();
            f.sys.add_device(
                "/dev/loop9",
                DevId { major: 7, minor: 9 },
                DiskFormat::Filesystem("ext4".into()),
            );
            let w = want(block_pv(), "p1", "pv1");
            assert_eq!(f.exec.run(&mount_job(&f, w.clone(), true)).error, None);
            let pod = Job::TearDown {
                params: pod_params(&f.layout, &w).into(),
                subpaths: None,
            };
            assert_eq!(f.exec.run(&pod).error, None);
            let dev = Job::UnmountDevice {
                params: device_params(&f.layout, &w).into(),
            };
            f.sys.fail_nth(Call::Umount, 1, errno);
            let report = f.exec.run(&dev);
            assert!(report.error.is_some(), "{errno}: the unmount failed");
            assert_eq!(report.ran, vec![Operation::UnmountDevice]);
            let [AswUpdate::DeviceUncertain { volume, mount, .. }] = &report.updates[..] else {
                panic!("{errno}: {:?}", report.updates);
            };
            assert_eq!(*volume, w.volume);
            assert_eq!(
                Some(mount.mount_path.as_path()),
                device_params(&f.layout, &w).device_mount_path(),
                "{errno}: the staging path is kept"
            );
            let report = f.exec.run(&dev);
            assert_eq!(report.error, None, "{errno}: the retry unmounts");
            assert!(
                matches!(&report.updates[..], [AswUpdate::DeviceUnmounted { .. }]),
                "{errno}: {:?}",
                report.updates
            );
        }
    }

    fn owned(mut w: VolumeToMount) -> VolumeToMount {
        w.fs_group = Some(crate::model::FsGroup {
            gid: 4343,
            policy: crate::model::FsGroupChangePolicy::Always,
        });
        w
    }

    /// (op, steps) of every intent and (op, success) of every outcome, in
    /// log order.
    fn journal_shape(f: &Fixture) -> Vec<(Operation, &'static str)> {
        records(f)
            .iter()
            .map(|r| match &r.body {
                Body::Intent { op, .. } => (*op, "intent"),
                Body::Outcome {
                    op,
                    result: OpResult::Success,
                    ..
                } => (*op, "success"),
                Body::Outcome { op, .. } => (*op, "failed"),
                _ => (Operation::SetUp, "other"),
            })
            .collect()
    }

    /// An fsGroup pod's disk emptyDir on a real directory: SetUp, then the
    /// walk as its own journaled step, its intent right after SetUp's
    /// outcome (one batch); the directory ends with the group and bits.
    #[test]
    fn an_fs_group_walk_is_its_own_journaled_step_after_setup() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root (chgrp to any group)");
            return;
        }
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap().join("root");
        std::fs::create_dir(&root).unwrap();
        let (j, _) = Journal::open(&JournalConfig::new(dir.path().join("j"), "n", "b")).unwrap();
        let journal = Arc::new(j);
        let layout = Layout::new(&root);
        let metrics = Arc::new(Metrics::new().unwrap());
        let sys: Arc<dyn Sys> = Arc::new(crate::host::sys::LinuxSys);
        let exec = Executor::new(Some(journal.clone()), sys, &layout, metrics);
        let disk = VolumeSpec::EmptyDir {
            medium: StorageMedium::Disk,
            size_limit: None,
        };
        let w = owned(want(disk, "p1", "data"));
        let job = Job::Mount {
            device: None,
            pod: pod_params(&layout, &w).into(),
            want: Box::new(w),
        };
        let report = exec.run(&job);
        assert_eq!(report.error, None);
        assert_eq!(report.ran, vec![Operation::SetUp, Operation::SetOwnership]);
        assert!(matches!(
            &report.updates[..],
            [AswUpdate::PodMounted { .. }]
        ));
        journal.flush_pending().unwrap();
        let recs = journal.current("n").unwrap().tail;
        let shape: Vec<_> = recs
            .iter()
            .map(|r| match &r.body {
                Body::Intent { op, .. } => (r.seq, *op, "intent"),
                Body::Outcome { op, result, .. } => (
                    r.seq,
                    *op,
                    if *result == OpResult::Success {
                        "success"
                    } else {
                        "failed"
                    },
                ),
                _ => (r.seq, Operation::SetUp, "other"),
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                (1, Operation::SetUp, "intent"),
                (2, Operation::SetUp, "success"),
                (3, Operation::SetOwnership, "intent"),
                (4, Operation::SetOwnership, "success"),
            ]
        );
        // a disk emptyDir's SetUp is one mkdir, but with the walk after it
        // a SetUp cut short must run again: multi-step
        assert!(matches!(
            &recs[0].body,
            Body::Intent {
                steps: Steps::Multi,
                ..
            }
        ));
        let target =
            layout.pod_target_path(&PodUid::new("p1").unwrap(), PluginName::EmptyDir, "data");
        let m = std::fs::metadata(&target).unwrap();
        assert_eq!((m.gid(), m.mode() & 0o7777 & 0o2770), (4343, 0o2770));
        // the state the journal keeps: mounted, nothing pending
        let state = journal.state();
        let (_, entry) = state.entries().next().unwrap();
        assert_eq!(entry.reported_state(), MountState::Mounted);
    }

    /// A long walk raises the kubelet's warning on the pod: first that it
    /// is slow (the path shown from the pod's UID on), then the count so
    /// far (periods of zero here: each look at the clock, every 256
    /// entries).
    #[test]
    fn a_long_walk_raises_the_kubelets_progress_events() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root (chgrp to any group)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap().join("root");
        std::fs::create_dir(&root).unwrap();
        let layout = Layout::new(&root);
        let metrics = Arc::new(Metrics::new().unwrap());
        let sys: Arc<dyn Sys> = Arc::new(crate::host::sys::LinuxSys);
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = seen.clone();
        let mut exec = Executor::new(None, sys, &layout, metrics).with_events(Arc::new(
            move |e: crate::reconciler::effects::PodEvent| {
                sink.lock()
                    .unwrap()
                    .push((e.pod.as_str().to_owned(), e.reason, e.message));
            },
        ));
        exec.every = crate::plugins::ownership::ProgressEvery {
            first: std::time::Duration::ZERO,
            then: std::time::Duration::ZERO,
        };
        let disk = VolumeSpec::EmptyDir {
            medium: StorageMedium::Disk,
            size_limit: None,
        };
        let w = owned(want(disk, "p1", "data"));
        let target = layout.pod_target_path(&w.pod, PluginName::EmptyDir, "data");
        std::fs::create_dir_all(&target).unwrap();
        for i in 0..600 {
            std::fs::write(target.join(format!("f{i}")), b"").unwrap();
        }
        let job = Job::Mount {
            device: None,
            pod: pod_params(&layout, &w).into(),
            want: Box::new(w),
        };
        assert_eq!(exec.run(&job).error, None);
        let shown = "p1/volumes/kubernetes.io~empty-dir/data";
        let want_events = vec![
            (
                "p1".to_owned(),
                "VolumePermissionChangeInProgress",
                format!(
                    "Setting volume ownership for {shown} is taking longer than expected, \
                     consider using OnRootMismatch - https://kubernetes.io/docs/tasks/\
                     configure-pod-container/security-context/\
                     #configure-volume-permission-and-ownership-change-policy-for-pods"
                ),
            ),
            (
                "p1".to_owned(),
                "VolumePermissionChangeInProgress",
                format!("Setting volume ownership for {shown}, processed 512 files."),
            ),
        ];
        assert_eq!(*seen.lock().unwrap(), want_events);
    }

    /// A walk that fails (here the fake seam cannot list: `ENOSYS`) is an
    /// uncertain outcome of its own step: the journal and the ASW say
    /// uncertain, so SetUp and the walk run again; the SetUp before it is
    /// kept as done.
    #[test]
    fn a_failed_walk_leaves_the_target_uncertain() {
        let f = fixture();
        let w = owned(want(tmpfs(), "p1", "cache"));
        let report = f.exec.run(&mount_job(&f, w, false));
        let err = report.error.expect("the walk failed");
        assert!(err.is_uncertain(), "{err}");
        assert!(err.to_string().contains("set_ownership"), "{err}");
        assert_eq!(report.ran, vec![Operation::SetUp, Operation::SetOwnership]);
        assert!(
            matches!(&report.updates[..], [AswUpdate::PodUncertain { .. }]),
            "{:?}",
            report.updates
        );
        f.journal.flush_pending().unwrap();
        assert_eq!(
            journal_shape(&f),
            vec![
                (Operation::SetUp, "intent"),
                (Operation::SetUp, "success"),
                (Operation::SetOwnership, "intent"),
                (Operation::SetOwnership, "failed"),
            ]
        );
        let state = f.journal.state();
        let (_, entry) = state.entries().next().unwrap();
        assert_eq!(entry.reported_state(), MountState::Uncertain);
    }

    /// A disk emptyDir with a foreign mount beneath it: the TearDown fails,
    /// final, naming the mount; the journal says so, the ASW keeps the pod
    /// (no update), and `volumed_nested_mounts_left_total` counts it.
    #[test]
    fn a_teardown_refused_for_a_nested_mount_is_a_final_failure_and_counted() {
        let f = fixture();
        let disk = VolumeSpec::EmptyDir {
            medium: StorageMedium::Disk,
            size_limit: None,
        };
        let w = want(disk, "p1", "scratch");
        assert_eq!(f.exec.run(&mount_job(&f, w.clone(), false)).error, None);
        let params = pod_params(&f.layout, &w);
        let nested = params.pod_mount_path.as_deref().unwrap().join("m");
        f.sys.add(&nested, crate::host::sys::FileKind::Dir);
        f.sys
            .preset_mount(
                None,
                &nested,
                Some("tmpfs"),
                crate::host::sys::MsFlags::empty(),
                None,
            )
            .unwrap();
        let report = f.exec.run(&Job::TearDown {
            params: params.into(),
            subpaths: None,
        });
        let error = report.error.expect("the teardown fails");
        assert!(!error.is_uncertain(), "a refusal changes nothing: {error}");
        let error = error.to_string();
        assert!(error.contains(&nested.display().to_string()), "{error}");
        assert!(report.updates.is_empty(), "{:?}", report.updates);
        let last = records(&f).pop().unwrap();
        assert!(
            matches!(&last.body, Body::Outcome { result: OpResult::FailedFinal(e), .. } if *e == error),
            "{last:?}"
        );
        let counted = f
            .exec
            .metrics
            .ops
            .nested_mounts_left
            .with_label_values(&[PluginName::EmptyDir.as_str()])
            .get();
        assert_eq!(counted, 1);
    }
}
