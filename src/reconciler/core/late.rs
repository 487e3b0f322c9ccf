//! Late mounts: a CSI call volumed gave up on may still finish at the
//! driver, after volumed undid its target (the pod went away meanwhile), and
//! leave a mount nobody would ever unmount — the kubelet's k8s #86360 class.
//! The spec lets a driver run a timed-out call to its end, and nothing obliges
//! it to serialize a NodeUnstage behind the NodeStage it is still running.
//!
//! Each such call's path is watched for [`CoreConfig::late_window`] (four
//! times the CSI timeout, at least [`LATE_WINDOW_FLOOR`]; a driver slower
//! than that is not caught — the watch costs one `statx` a second): checked every [`LATE_CHECK_EVERY`] on the host lane
//! (one `statx` per watched path), and a mount found there that the ASW does
//! not hold is put back into the ASW as uncertain; when no pod wants it, it
//! is undone at once with the call's own parameters (the journal may have
//! forgotten the target, and the driver's `vol_data.json` be gone).
//!
//! [`CoreConfig::late_window`]: super::CoreConfig::late_window

use std::time::{Duration, Instant};

use super::{Core, Effect, HostWork, World};
use crate::model::{SharedPath, TargetRef};
use crate::reconciler::jobs::{AswUpdate, Job, LateWatch, apply_update};

/// The shortest watch of a path.
pub(crate) const LATE_WINDOW_FLOOR: Duration = Duration::from_secs(300);

/// How often watched paths are checked.
pub(crate) const LATE_CHECK_EVERY: Duration = Duration::from_secs(1);

/// A watched path.
#[derive(Debug)]
pub(in crate::reconciler) struct Watched {
    watch: LateWatch,
    until: Instant,
}

impl Core {
    /// Starts (or extends) watching the path of a call that ended uncertain.
    pub(super) fn watch_late(&mut self, watch: LateWatch, now: Instant) {
        if self.cfg.late_window.is_zero() {
            return;
        }
        let until = now + self.cfg.late_window;
        self.late
            .insert(watch.path.clone(), Watched { watch, until });
        self.timers
            .late_check_at
            .get_or_insert(now + LATE_CHECK_EVERY);
    }

    /// Asks the host lane to check the watched paths, when due; forgets the
    /// ones watched long enough.
    pub(super) fn maybe_check_late(&mut self, now: Instant, out: &mut Vec<Effect>) {
        let due = self.timers.late_check_at.is_some_and(|t| now >= t);
        if !due || self.in_flight.late_check {
            return;
        }
        self.late.retain(|_, w| w.until > now);
        if self.late.is_empty() {
            self.timers.late_check_at = None;
            return;
        }
        self.timers.late_check_at = Some(now + LATE_CHECK_EVERY);
        self.in_flight.late_check = true;
        let paths = self.late.keys().cloned().collect();
        out.push(Effect::Host(HostWork::CheckLate { paths }));
    }

    /// The watched paths found mounted: each one the ASW does not hold and
    /// no operation is busy with goes back into the ASW as uncertain, and
    /// is undone at once when no pod wants it (once every source listed).
    /// Returns whether a pass is due.
    pub(super) fn late_checked(
        &mut self,
        w: &mut World,
        mounted: Vec<SharedPath>,
        now: Instant,
        out: &mut Vec<Effect>,
    ) -> bool {
        self.in_flight.late_check = false;
        let mut changed = false;
        for path in mounted {
            let Some(watched) = self.late.get(&path) else {
                continue;
            };
            let undo = &watched.watch.undo;
            let key = undo.key();
            if self.pending.busy(&key, now) || held(w, &watched.watch.uncertain) {
                continue;
            }
            tracing::warn!(
                path = %path.display(),
                "a mount appeared after volumed gave up on the CSI call that made it; \
                 it is uncertain again and undone if no pod wants it"
            );
            if let Err(e) = apply_update(&mut w.asw, &watched.watch.uncertain) {
                tracing::error!(error = %e, "late mount: the ASW refused it");
                continue;
            }
            changed = true;
            if self.phase.ready() && !wanted(w, undo) && self.pending.start(&key, now) {
                out.push(Effect::Start {
                    job: undo.clone(),
                    announce: self.cfg.journal,
                });
            }
        }
        changed
    }
}

/// Whether the ASW already holds the target the update describes as
/// possibly mounted (then the normal passes take care of it).
fn held(w: &World, update: &AswUpdate) -> bool {
    match update {
        AswUpdate::DeviceUncertain { volume, .. } => w
            .asw
            .volume(volume)
            .and_then(|v| v.device.as_ref())
            .is_some_and(|d| d.may_be_mounted()),
        AswUpdate::PodUncertain { volume, pod, .. } => w.asw.pod(volume, pod).is_some(),
        _ => true,
    }
}

/// Whether a pod still wants what `undo` would undo.
fn wanted(w: &World, undo: &Job) -> bool {
    match undo {
        Job::UnmountDevice { params } => w.dsw.volume(&params.volume).is_some(),
        Job::TearDown { params, .. } => match &params.target {
            TargetRef::Pod(pod) => w.dsw.pod_exists_in_volume(pod, &params.volume),
            TargetRef::Device => w.dsw.volume(&params.volume).is_some(),
        },
        _ => true,
    }
}
