//! Node expansion when a volume is mounted for a pod (the kubelet's
//! `expandVolumeDuringMount`): once SetUp made the pod's target (or
//! MapPodDevice mapped a raw block one, with the block capability), a claim
//! whose PV is bigger than its status says (`model::decide_expansion`) is
//! grown with NodeExpandVolume, journaled as its own step
//! (`expand_volume`: intent, the call, outcome), with the kubelet's
//! events on the pod. A failure fails the job (the pod's error, a
//! `FailedMount` event), the mount it made stays.
//!
//! The RPC is idempotent: an intent without an outcome after a crash is
//! a multi-step one, so the restart finds the pod target uncertain, runs
//! SetUp again (the mount in place) and, the claim still saying the
//! expansion is pending, the expansion after it.

use super::Executor;
use crate::journal::{Announced, Permit};
use crate::metrics::StorageOperation;
use crate::model::{
    ClaimResize, ClaimUpdate, ExpandCase, ExpandDecision, Operation, ResizeStep, SharedParams,
    Steps, VolumeSpec, decide_expansion,
};
use crate::plugins::{Action, ExpandCall, Outcome, PluginError, VolumePlugin};
use crate::reconciler::effects::PodEvent;
use crate::reconciler::jobs::{AswUpdate, JobError, JobReport};
use crate::state::VolumeToMount;

/// The kubelet's reason for a node expansion that succeeded (a Normal
/// event).
pub(crate) const FILE_SYSTEM_RESIZE_SUCCESSFUL: &str = "FileSystemResizeSuccessful";
/// The kubelet's reason for one it would not or could not make.
pub(crate) const FILE_SYSTEM_RESIZE_FAILED: &str = "FileSystemResizeFailed";

/// Whether a final failure says the size can never be had, so the claim
/// is marked `NodeResizeInfeasible` and no node retries: the driver's
/// INVALID_ARGUMENT or OUT_OF_RANGE (the CSI spec's "unsupported
/// capacity"), or an answer below the request (a Secret not there yet is
/// not: the call is made again once it is).
fn infeasible(e: &PluginError) -> bool {
    match e {
        PluginError::Csi { cause, .. } => cause.size_out_of_reach(),
        PluginError::Expand { cause, .. } => {
            matches!(**cause, crate::model::ExpandError::ShortAnswer { .. })
        }
        _ => false,
    }
}

impl Executor {
    /// Expands `want`'s volume after SetUp made `pod` when its claim says
    /// a node expansion is pending; nothing for any other volume.
    pub(super) fn expand_after_set_up(
        &self,
        plugin: &dyn VolumePlugin,
        want: &VolumeToMount,
        pod: &SharedParams,
        r: &mut JobReport,
    ) -> Result<(), JobError> {
        let VolumeSpec::Csi(csi) = &*want.spec else {
            return Ok(());
        };
        let Some(claim) = &csi.claim else {
            return Ok(());
        };
        // a raw block volume is expanded after its MapPodDevice as a
        // filesystem one after its SetUp (the kubelet's MapVolume calls the
        // same expander), with the block capability and no filesystem
        let block = csi.volume_mode == crate::model::VolumeMode::Block;
        let read_only = want.read_only || pod.read_only();
        let claim_name = format!("{}/{}", claim.namespace, claim.name);
        let case = ExpandCase {
            pod: want.pod.as_str(),
            volume: &want.outer_name,
            claim: &claim_name,
            pv: &want.spec_name,
            pv_capacity: claim.pv_capacity,
            size: &claim.size,
            read_only,
            block,
            driver_expands: plugin.can_expand(pod),
        };
        // the kubelet's message shape: "<what> for volume \"<pv>\" <detail>"
        let shown = |what: &str, detail: &str| {
            format!("{what} for volume {:?} {detail}", &*want.spec_name)
                .trim_end()
                .to_owned()
        };
        let (to, block, update) = match decide_expansion(&case) {
            Ok(ExpandDecision::Expand {
                to, block, update, ..
            }) => (to, block, update),
            Ok(ExpandDecision::NotSupported) => {
                // nothing to call: not asked again for this size
                if let Some(to) = claim.pv_capacity {
                    r.updates.push(AswUpdate::Expanded {
                        volume: want.volume.clone(),
                        bytes: to,
                    });
                }
                return Ok(());
            }
            Ok(ExpandDecision::Nothing) => return Ok(()),
            Ok(ExpandDecision::ReadOnly) => {
                let message = shown(
                    "MountVolume.NodeExpandVolume failed",
                    "requested read-only file system",
                );
                self.pod_event(want, FILE_SYSTEM_RESIZE_FAILED, message);
                return Ok(());
            }
            Err(e) => {
                // bad input (a PV below its claim): said once per mount, on
                // the pod and as the claim's NodeResizeError, where whoever
                // edits the claim or the PV looks; the mount kept, nothing
                // marked infeasible (fixing the PV lets the next mount go on)
                let error = e.to_string();
                self.pod_event(want, FILE_SYSTEM_RESIZE_FAILED, error.clone());
                if let Some(claims) = &self.claims {
                    claims(ClaimResize {
                        claim: claim.clone(),
                        update: ClaimUpdate::Legacy,
                        step: ResizeStep::Failed {
                            error,
                            infeasible: false,
                        },
                    });
                }
                return Ok(());
            }
        };
        let tell = |step: ResizeStep| {
            if let Some(claims) = &self.claims {
                claims(ClaimResize {
                    claim: claim.clone(),
                    update,
                    step,
                });
            }
        };
        if update == ClaimUpdate::Recovery {
            tell(ResizeStep::Started);
        }
        let sys = self.sys.as_ref();
        let call = ExpandCall {
            required: to,
            block,
            secret: csi.expand_secret.as_ref(),
        };
        let mut answered = 0;
        // a final failure's words, and whether the size can never be had
        let mut failed: Option<(String, bool)> = None;
        let mut none: Option<Announced> = None;
        let started = std::time::Instant::now();
        // multi-step, as the fsGroup walk after SetUp: a cut intent makes
        // the restart find the pod target uncertain, so SetUp runs again
        // (the mount in place) and the expansion after it, once
        let result = self.journaled(
            Operation::ExpandVolume,
            Steps::Multi,
            pod,
            r,
            &mut none,
            |permit: &Permit| match plugin.expand(permit, pod, &call, sys) {
                Ok(n) => {
                    answered = n;
                    Ok(Outcome::of(Action::Performed))
                }
                Err(e) => {
                    if !e.is_uncertain() {
                        failed = Some((e.to_string(), infeasible(&e)));
                    }
                    Err(e)
                }
            },
        );
        // `storage_operation_duration_seconds{operation_name="volume_fs_resize"}`,
        // the kubelet's name for it; a CSI volume's plugin label names its driver
        let label = match pod.csi() {
            Some(c) => format!("{}:{}", pod.plugin.as_str(), c.driver),
            None => pod.plugin.as_str().to_owned(),
        };
        self.metrics.ops.storage_operation(
            &label,
            StorageOperation::VolumeFsResize,
            result.is_ok(),
            started.elapsed(),
        );
        match (&result, failed) {
            (Ok(()), _) => {
                r.updates.push(AswUpdate::Expanded {
                    volume: want.volume.clone(),
                    bytes: to,
                });
                tell(ResizeStep::Finished(to));
            }
            (Err(_), Some((error, infeasible))) => tell(ResizeStep::Failed { error, infeasible }),
            // not known to have failed: the status says nothing yet
            (Err(_), None) => {}
        }
        result?;
        tracing::info!(volume = %pod.volume, pod = %want.pod, required_bytes = to, answered,
            "NodeExpandVolume succeeded");
        let message = shown("MountVolume.NodeExpandVolume succeeded", "");
        self.pod_event(want, FILE_SYSTEM_RESIZE_SUCCESSFUL, message);
        Ok(())
    }

    /// An event on `want`'s pod, or a log line without an event sink.
    fn pod_event(&self, want: &VolumeToMount, reason: &'static str, message: String) {
        match &self.events {
            Some(events) => events(PodEvent {
                pod: want.pod.clone(),
                names: None,
                reason,
                message,
            }),
            None => tracing::warn!(pod = %want.pod, reason, "{message}"),
        }
    }
}

#[cfg(test)]
mod tests {
    //! The executor's side with a test double in the CSI plugin's place
    //! (no driver process in a unit test; `tests/csi_testdriver.rs` grows
    //! a real tmpfs through the real client): which mounts expand, the
    //! journal's shape, and the events.
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::host::recording_sys::RecordingSys;
    use crate::host::sys::Sys;
    use crate::journal::{Body, Journal, JournalConfig, OpResult};
    use crate::metrics::Metrics;
    use crate::model::{
        ClaimSize, ClaimState, CsiSpec, Layout, PluginName, PodUid, PodVolume, ResizeStatus,
        TargetParams,
    };
    use crate::plugins::{Certainty, PluginError, PluginResult};
    use crate::reconciler::jobs::Job;
    use crate::reconciler::params::pod_params;

    const GI: u64 = 1 << 30;

    /// A CSI plugin double: SetUp succeeds; expand records its size and
    /// answers it reached it (or fails as told).
    #[derive(Default)]
    struct Double {
        expands: bool,
        calls: Mutex<Vec<u64>>,
        /// the `block` flag of each call
        blocks: Mutex<Vec<bool>>,
        fail: Option<Certainty>,
    }

    impl VolumePlugin for Double {
        fn name(&self) -> PluginName {
            PluginName::Csi
        }
        fn setup(&self, _: &Permit, _: &VolumeSpec, _: &TargetParams, _: &dyn Sys) -> PluginResult {
            Ok(Outcome::of(Action::Performed))
        }
        fn teardown(&self, _: &Permit, _: &TargetParams, _: &dyn Sys) -> PluginResult {
            Ok(Outcome::of(Action::Performed))
        }
        fn can_expand(&self, _: &TargetParams) -> bool {
            self.expands
        }
        fn expand(
            &self,
            _: &Permit,
            params: &TargetParams,
            call: &ExpandCall<'_>,
            _: &dyn Sys,
        ) -> Result<u64, PluginError> {
            let required = call.required;
            self.calls.lock().unwrap().push(required);
            self.blocks.lock().unwrap().push(call.block);
            match self.fail {
                None => Ok(required),
                Some(certainty) => Err(PluginError::Csi {
                    op: Operation::ExpandVolume,
                    volume: params.volume.clone(),
                    certainty,
                    cause: Box::new(crate::csi::CsiError {
                        driver: "d".into(),
                        method: "/csi.v1.Node/NodeExpandVolume",
                        code: tonic::Code::OutOfRange,
                        message: "too big".into(),
                    }),
                }),
            }
        }
    }

    type Events = Arc<Mutex<Vec<(&'static str, String)>>>;
    type Claims = Arc<Mutex<Vec<(ClaimUpdate, ResizeStep)>>>;

    struct Fixture {
        _dir: tempfile::TempDir,
        journal: Arc<Journal>,
        layout: Layout,
        exec: Executor,
        double: Arc<Double>,
        events: Events,
        metrics: Arc<Metrics>,
        claims: Claims,
    }

    /// The double behind an `Arc`, so a test reads its calls after the
    /// executor owns it.
    struct Shared(Arc<Double>);
    impl VolumePlugin for Shared {
        fn name(&self) -> PluginName {
            self.0.name()
        }
        fn setup(&self, p: &Permit, s: &VolumeSpec, t: &TargetParams, y: &dyn Sys) -> PluginResult {
            self.0.setup(p, s, t, y)
        }
        fn teardown(&self, p: &Permit, t: &TargetParams, y: &dyn Sys) -> PluginResult {
            self.0.teardown(p, t, y)
        }
        fn can_expand(&self, t: &TargetParams) -> bool {
            self.0.can_expand(t)
        }
        fn expand(
            &self,
            p: &Permit,
            t: &TargetParams,
            c: &ExpandCall<'_>,
            y: &dyn Sys,
        ) -> Result<u64, PluginError> {
            self.0.expand(p, t, c, y)
        }
    }

    fn fixture(double: Double) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let (j, _) = Journal::open(&JournalConfig::new(dir.path().join("j"), "n", "b")).unwrap();
        let journal = Arc::new(j);
        let sys = Arc::new(RecordingSys::new());
        sys.add("/r", crate::host::sys::FileKind::Dir);
        let layout = Layout::new("/r");
        let double = Arc::new(double);
        let events: Events = Arc::default();
        let sink = events.clone();
        let claims: Claims = Arc::default();
        let told = claims.clone();
        let metrics = Arc::new(Metrics::new().unwrap());
        let exec = Executor::new(Some(journal.clone()), sys, &layout, metrics.clone())
            .with_plugin(Box::new(Shared(double.clone())))
            .with_events(Arc::new(move |e: PodEvent| {
                sink.lock().unwrap().push((e.reason, e.message));
            }))
            .with_claims(Arc::new(move |u: ClaimResize| {
                told.lock().unwrap().push((u.update, u.step));
            }));
        Fixture {
            _dir: dir,
            journal,
            layout,
            exec,
            double,
            events,
            metrics,
            claims,
        }
    }

    /// A CSI claim of PV `pv-1` whose PV says `pv` bytes and whose claim
    /// reports `status` with resize status `rs`.
    fn want(pv: u64, status: u64, rs: Option<ResizeStatus>, read_only: bool) -> VolumeToMount {
        let claim = ClaimState {
            namespace: "ns".into(),
            name: "data".into(),
            pv_capacity: Some(pv),
            size: ClaimSize {
                status_capacity: Some(status),
                allocated: rs.is_some(),
                resize_status: rs,
            },
            ..ClaimState::default()
        };
        let spec = VolumeSpec::Csi(Box::new(CsiSpec {
            driver: "d.example.com".into(),
            volume_handle: "vol-1".into(),
            claim: Some(Arc::new(claim)),
            ..CsiSpec::default()
        }));
        let pod = PodUid::new("p1").unwrap();
        VolumeToMount {
            volume: PodVolume::unique_name(&spec, &pod, "pv-1"),
            plugin: spec.plugin(),
            spec: spec.into(),
            pod,
            spec_name: "pv-1".into(),
            outer_name: "data".into(),
            selinux: None,
            csi_pod: None,
            read_only,
            fs_group: None,
        }
    }

    fn run(f: &Fixture, want: VolumeToMount) -> crate::reconciler::jobs::JobReport {
        let job = Job::Mount {
            device: None,
            pod: pod_params(&f.layout, &want).into(),
            want: Box::new(want),
        };
        f.exec.run(&job)
    }

    /// (op, what) of every journal record, in log order.
    fn shape(f: &Fixture) -> Vec<(Operation, &'static str)> {
        f.journal.flush_pending().unwrap();
        (f.journal.current("n").unwrap().tail.iter())
            .map(|r| match &r.body {
                Body::Intent { op, steps, .. } => (
                    *op,
                    if *steps == Steps::Multi {
                        "multi"
                    } else {
                        "single"
                    },
                ),
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

    #[test]
    fn a_pending_expansion_runs_after_set_up_as_its_own_journaled_step() {
        let f = fixture(Double {
            expands: true,
            ..Double::default()
        });
        let report = run(
            &f,
            want(2 * GI, GI, Some(ResizeStatus::NodeResizePending), false),
        );
        assert_eq!(report.error, None);
        assert_eq!(report.ran, vec![Operation::SetUp, Operation::ExpandVolume]);
        assert_eq!(
            *f.double.calls.lock().unwrap(),
            vec![2 * GI],
            "the PV's size"
        );
        assert_eq!(
            shape(&f),
            vec![
                (Operation::SetUp, "multi"),
                (Operation::SetUp, "success"),
                (Operation::ExpandVolume, "multi"),
                (Operation::ExpandVolume, "success"),
            ]
        );
        assert_eq!(
            *f.claims.lock().unwrap(),
            vec![
                (ClaimUpdate::Recovery, ResizeStep::Started),
                (ClaimUpdate::Recovery, ResizeStep::Finished(2 * GI)),
            ],
            "in progress before the call, finished after it"
        );
        let text = crate::metrics::gather_text(&f.metrics);
        assert!(
            text.lines().any(
                |l| l.starts_with("storage_operation_duration_seconds_count")
                    && l.contains("operation_name=\"volume_fs_resize\"")
                    && l.contains("status=\"success\"")
            ),
            "{text}"
        );
        let events = f.events.lock().unwrap().clone();
        assert_eq!(
            events,
            vec![(
                FILE_SYSTEM_RESIZE_SUCCESSFUL,
                "MountVolume.NodeExpandVolume succeeded for volume \"pv-1\"".to_owned()
            )]
        );
    }

    /// A raw block claim mapped into its pod (the online case, planned
    /// as an Expand job) is grown with the block flag, journaled and
    /// reported to the claim as a filesystem one is.
    #[test]
    fn a_mapped_block_claim_is_expanded_with_the_block_flag() {
        let f = fixture(Double {
            expands: true,
            ..Double::default()
        });
        let mut w = want(2 * GI, GI, Some(ResizeStatus::NodeResizePending), false);
        let mut spec = (*w.spec).clone();
        if let VolumeSpec::Csi(c) = &mut spec {
            c.volume_mode = crate::model::VolumeMode::Block;
        }
        w.spec = spec.into();
        let job = Job::Expand {
            pod: pod_params(&f.layout, &w).into(),
            want: Box::new(w),
        };
        let report = f.exec.run(&job);
        assert_eq!(report.error, None);
        assert_eq!(report.ran, vec![Operation::ExpandVolume]);
        assert_eq!(*f.double.calls.lock().unwrap(), vec![2 * GI]);
        assert_eq!(*f.double.blocks.lock().unwrap(), vec![true], "block");
        assert_eq!(
            shape(&f),
            vec![
                (Operation::ExpandVolume, "multi"),
                (Operation::ExpandVolume, "success"),
            ]
        );
        assert_eq!(
            *f.claims.lock().unwrap(),
            vec![
                (ClaimUpdate::Recovery, ResizeStep::Started),
                (ClaimUpdate::Recovery, ResizeStep::Finished(2 * GI)),
            ]
        );
    }

    #[test]
    fn no_call_without_a_pending_expansion_a_driver_that_expands_or_for_read_only() {
        let cases: [(&str, VolumeToMount, bool, usize); 4] = [
            ("same size", want(GI, GI, None, false), true, 0),
            (
                "controller's turn",
                want(
                    2 * GI,
                    GI,
                    Some(ResizeStatus::ControllerResizeInProgress),
                    false,
                ),
                true,
                0,
            ),
            ("no EXPAND_VOLUME", want(2 * GI, GI, None, false), false, 0),
            ("read-only", want(2 * GI, GI, None, true), true, 1),
        ];
        for (what, w, expands, events) in cases {
            let f = fixture(Double {
                expands,
                ..Double::default()
            });
            let report = run(&f, w);
            assert_eq!(report.error, None, "{what}");
            assert_eq!(report.ran, vec![Operation::SetUp], "{what}");
            assert!(f.double.calls.lock().unwrap().is_empty(), "{what}");
            let seen = f.events.lock().unwrap().clone();
            assert_eq!(seen.len(), events, "{what}: {seen:?}");
            if events == 1 {
                assert_eq!(seen[0].0, FILE_SYSTEM_RESIZE_FAILED);
                assert!(
                    seen[0].1.ends_with("requested read-only file system"),
                    "{seen:?}"
                );
            }
        }
    }

    #[test]
    fn a_pv_below_the_claim_is_an_error_naming_the_fields_and_the_mount_stays() {
        let f = fixture(Double {
            expands: true,
            ..Double::default()
        });
        let report = run(&f, want(GI, 2 * GI, None, false));
        assert_eq!(report.error, None, "the mount is not failed for it");
        assert!(f.double.calls.lock().unwrap().is_empty());
        let seen = f.events.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert!(
            seen[0].1.contains("pod p1: volume data")
                && seen[0].1.contains("spec.capacity.storage")
                && seen[0].1.contains("claim ns/data status.capacity.storage"),
            "{seen:?}"
        );
        // the claim says it too, retryable once the PV is fixed
        let told = f.claims.lock().unwrap().clone();
        assert!(
            matches!(&told[..], [(_, ResizeStep::Failed { error, infeasible: false })]
                if *error == seen[0].1),
            "{told:?}"
        );
    }

    #[test]
    fn a_failed_expansion_is_journaled_and_fails_the_job_with_the_mount_kept() {
        for certainty in [Certainty::Final, Certainty::Uncertain] {
            let f = fixture(Double {
                expands: true,
                fail: Some(certainty),
                ..Double::default()
            });
            let report = run(&f, want(2 * GI, GI, None, false));
            let err = report.error.expect("the job fails");
            assert!(err.to_string().contains("too big"), "{err}");
            assert!(
                report
                    .updates
                    .iter()
                    .any(|u| matches!(u, crate::reconciler::jobs::AswUpdate::PodMounted { .. })),
                "the mount SetUp made is kept: {:?}",
                report.updates
            );
            assert_eq!(
                shape(&f)[2..],
                [
                    (Operation::ExpandVolume, "multi"),
                    (Operation::ExpandVolume, "failed"),
                ]
            );
            let told = f.claims.lock().unwrap().clone();
            match certainty {
                // OUT_OF_RANGE: the size can never be had
                Certainty::Final => assert!(
                    matches!(&told[..], [(ClaimUpdate::Legacy, ResizeStep::Failed { error, infeasible: true })]
                        if error.contains("too big")),
                    "{told:?}"
                ),
                // not known to have failed: the claim is not told
                Certainty::Uncertain => assert!(told.is_empty(), "{told:?}"),
            }
        }
    }
}
