//! What the merge's decisions become: journal records and ASW entries.

use std::path::Path;

use crate::journal::{Decided, Entry, JournalState, TargetKey};
use crate::model::{
    MountIdentity, MountState, SeLinuxContext, SharedStr, TargetKind, TargetParams, TargetRef,
};
use crate::state::{
    ActualStateOfWorld, DeviceMount, PodMount, SeLinuxState, StateError, VolumeMut,
};

use super::{Decision, MergeOutput, ReconstructError};

/// One `Reconstructed` record per decision, so that replaying them makes the
/// journal's state equal to the decisions (and to the ASW). Failed rebuilds
/// have no parameters and are not recorded.
pub fn to_journal_records(out: &MergeOutput) -> Vec<Decided> {
    out.decisions.iter().map(record_of).collect()
}

/// Whether the journal already implies `d` for its target: an entry with no
/// pending intent whose settled state, parameters and observed mount equal
/// the decision's and whose last record is from this boot (`boot_id`). Such
/// a decision needs no `Reconstructed` record: replay already yields it, and
/// `dump` shows the same live state without one (only the entry's `reason`
/// stays that of its last record).
pub fn journal_agrees(d: &Decision, state: &JournalState, boot_id: &str) -> bool {
    state
        .get(&d.key)
        .is_some_and(|e| entry_agrees(d, e, boot_id))
}

/// [`journal_agrees`] with the decision's entry at hand.
fn entry_agrees(d: &Decision, e: &Entry, boot_id: &str) -> bool {
    e.pending.is_none()
        && e.state == d.result
        && *e.boot_id == *boot_id
        && e.observed.as_deref() == d.observed.as_ref()
        && e.params == d.params
}

/// The `Reconstructed` records that change what `state` implies: one per
/// decision the journal does not already agree with ([`journal_agrees`]), in
/// decision order, with the decision it records. Replaying them over `state`
/// makes the journal's state equal to every decision.
pub fn changed_journal_records<'a>(
    out: &'a MergeOutput,
    state: &JournalState,
    boot_id: &str,
) -> Vec<(&'a Decision, Decided)> {
    // The merge decides journal targets in key order, as `entries` yields
    // them: walk both together, and look up only what is out of step.
    let mut entries = state.entries().peekable();
    out.decisions
        .iter()
        .filter(|d| {
            while entries.next_if(|(k, _)| **k < d.key).is_some() {}
            let entry = match entries.next_if(|(k, _)| **k == d.key) {
                Some((_, e)) => Some(e),
                None => state.get(&d.key),
            };
            !entry.is_some_and(|e| entry_agrees(d, e, boot_id))
        })
        .map(|d| (d, record_of(d)))
        .collect()
}

pub(super) fn record_of(d: &Decision) -> Decided {
    Decided {
        target: d.params.clone(),
        state: d.result,
        reason: d.reason.as_str().to_owned(),
        observed: d.observed.clone(),
    }
}

/// Fills the ASW from the decisions: device targets through
/// `mark_device_*`, pod targets through `mark_volume_mounted` or, when
/// uncertain, `mark_volume_uncertain_via_reconstruction` (so a final SetUp
/// error keeps them uncertain, as the kubelet does for reconstructed
/// volumes). Not-mounted pod targets are not recorded (the ASW holds no
/// not-mounted pods); a not-mounted device target is recorded only when its
/// volume has another target in the ASW. The journal forgets those no pod
/// wants once every source has listed (`reconciler/core/unheld.rs`). Volumes are added without a spec
/// (the DSW brings it). Returns the errors, one per failed decision, in
/// decision order.
///
/// A volume's decisions come together (journal targets in key order): each
/// run of them is applied through one [`VolumeMut`], found or added once. A
/// run with nothing mounted or uncertain adds no volume; its decisions wait
/// until every run is applied, so that a volume another run adds (a
/// host-only target of the same volume) is there for them, as it would be
/// had every volume been added first. What they change (a device target
/// not mounted) no other decision touches.
pub fn apply_to_asw(out: &MergeOutput, asw: &mut ActualStateOfWorld) -> Vec<ReconstructError> {
    let settled: Vec<Settled<'_>> = out.decisions.iter().map(Settled::of_decision).collect();
    fill(&settled, asw)
}

/// What filling the ASW reads of one decision: its target, state,
/// parameters and observed mount. A decision gives it, and so does a
/// journal entry that a merge in full agreement would decide as it stands
/// ([`asw_as_journal_says`]).
#[derive(Debug, Clone, Copy)]
struct Settled<'a> {
    key: &'a TargetKey,
    kind: TargetKind,
    result: MountState,
    params: &'a TargetParams,
    observed: Option<&'a MountIdentity>,
}

impl<'a> Settled<'a> {
    fn of_decision(d: &'a Decision) -> Self {
        Settled {
            key: &d.key,
            kind: d.kind,
            result: d.result,
            params: &d.params,
            observed: d.observed.as_ref(),
        }
    }
}

/// The ASW that [`apply_to_asw`] fills when the merge agrees with every
/// entry of `state` and finds nothing else (the common case of a restart:
/// every decision is then the entry's settled state, parameters and
/// observed mount, in key order, which the merge's decision order is), with
/// the errors it would return. Needs no host: the daemon builds it while the
/// mount table is being read, and keeps it only when the merge agrees with
/// every entry ([`super::edge::read_and_reconstruct_ready`]). `None` when
/// some entry cannot agree: an operation in flight, or a last record from
/// another boot than `boot_id`.
pub fn asw_as_journal_says(
    state: &JournalState,
    boot_id: &str,
) -> Option<(ActualStateOfWorld, Vec<ReconstructError>)> {
    let mut settled = Vec::with_capacity(state.len());
    for (key, e) in state.entries() {
        if e.pending.is_some() || *e.boot_id != *boot_id {
            return None;
        }
        settled.push(Settled {
            key,
            // a journal target's decision has its parameters' kind
            kind: e.params.kind,
            result: e.state,
            params: &e.params,
            observed: e.observed.as_deref(),
        });
    }
    let mut asw = ActualStateOfWorld::new();
    let errors = fill(&settled, &mut asw);
    Some((asw, errors))
}

/// [`apply_to_asw`] over the views of its decisions.
fn fill(decisions: &[Settled<'_>], asw: &mut ActualStateOfWorld) -> Vec<ReconstructError> {
    let live = |d: &&Settled<'_>| d.result != MountState::NotMounted;
    let device_path = |d: &Settled<'_>| match d.key.target {
        TargetRef::Device => d.params.device_path().map(Path::to_path_buf),
        TargetRef::Pod(_) => None,
    };
    let mut errors = Vec::new();
    let mut waiting = Vec::new();
    let mut at = 0;
    for run in decisions.chunk_by(|a, b| a.key.volume == b.key.volume) {
        let first = at;
        at += run.len();
        let mut lives = run.iter().filter(live);
        let Some(d) = lives.next() else {
            waiting.push((first, run));
            continue;
        };
        let mut volume = asw.add_volume_mut(
            d.key.volume.clone(),
            d.params.plugin,
            d.params.spec_name.clone(),
            None,
            device_path(d),
        );
        for path in lives.filter_map(device_path) {
            volume.set_device_path(path);
        }
        // the live pod targets of the run, at most: one allocation
        let pods = run
            .iter()
            .filter(|d| live(d) && matches!(d.key.target, TargetRef::Pod(_)))
            .count();
        volume.reserve_pods(pods);
        for (i, d) in run.iter().enumerate() {
            if let Err(e) = apply_one(d, Some(&mut volume)) {
                errors.push((first + i, e));
            }
        }
    }
    for (first, run) in waiting {
        let mut volume = asw.volume_mut(&run[0].key.volume);
        for (i, d) in run.iter().enumerate() {
            if let Err(e) = apply_one(d, volume.as_mut()) {
                errors.push((first + i, e));
            }
        }
    }
    errors.sort_by_key(|(i, _)| *i);
    errors.into_iter().map(|(_, e)| e).collect()
}

/// The label a target carries: what the host showed when it showed a
/// mount, else the journal's.
fn label(d: &Settled<'_>) -> Option<SeLinuxContext> {
    match d.observed {
        // A CSI driver that dropped `context=` left a mount without it; the
        // ASW held the label asked for (see `Executor::check_csi_label`), and
        // keeps it, or every restart would remount for a label no mount of
        // that driver brings.
        Some(identity) if identity.selinux.is_none() && d.params.csi().is_some() => {
            d.params.selinux().cloned()
        }
        Some(identity) => identity.selinux.clone(),
        None => d.params.selinux().cloned(),
    }
}

/// Applies one decision to its volume's record (`None`: the volume is not
/// in the ASW, which only a run with nothing live meets).
fn apply_one(d: &Settled<'_>, volume: Option<&mut VolumeMut<'_>>) -> Result<(), ReconstructError> {
    let no_path = || ReconstructError::NoTargetPath { key: d.key.clone() };
    // what the ASW's own `mark_*` says of a volume it does not have (a live
    // decision's volume was added just before: not met)
    let absent = || match &d.key.target {
        TargetRef::Device => StateError::MarkDevice {
            volume: d.key.volume.clone(),
            state: d.result,
        },
        TargetRef::Pod(pod) => StateError::MarkVolume {
            volume: d.key.volume.clone(),
            pod: pod.clone(),
            state: d.result,
        },
    };
    match &d.key.target {
        TargetRef::Device => {
            let mount_path = d.params.path().ok_or_else(no_path)?.to_path_buf();
            let mount = DeviceMount {
                device_path: d.params.device_path().map(Path::to_path_buf),
                mount_path,
                selinux: label(d),
            };
            match (d.result, volume) {
                (MountState::Mounted, Some(v)) => v.mark_device_mounted(mount),
                (MountState::Uncertain, Some(v)) => v.mark_device_uncertain(mount),
                (MountState::NotMounted, Some(v)) => {
                    // Record where the device target lives, then its state;
                    // the label of a mount that is gone is not the volume's.
                    let mount = DeviceMount {
                        selinux: None,
                        ..mount
                    };
                    v.mark_device_uncertain(mount);
                    v.mark_device_unmounted();
                }
                (MountState::NotMounted, None) => {}
                (MountState::Mounted | MountState::Uncertain, None) => return Err(absent().into()),
            }
        }
        TargetRef::Pod(pod) => {
            let mount_path = d.params.pod_mount_path.clone().ok_or_else(no_path)?;
            let known = || SeLinuxState::mounted_with(label(d));
            match (d.result, volume) {
                (MountState::Mounted, Some(v)) => {
                    let mount = PodMount {
                        outer_name: SharedStr::default(),
                        mount_path,
                        kind: d.kind,
                        selinux: known(),
                    };
                    v.mark_volume_mounted(pod, mount);
                }
                (MountState::Uncertain, Some(v)) => {
                    let selinux = match d.observed {
                        Some(_) => known(),
                        None => SeLinuxState::Unknown,
                    };
                    let mount = PodMount {
                        outer_name: SharedStr::default(),
                        mount_path,
                        kind: d.kind,
                        selinux,
                    };
                    v.mark_volume_uncertain_via_reconstruction(pod, mount);
                }
                (MountState::NotMounted, _) => {}
                (MountState::Mounted | MountState::Uncertain, None) => return Err(absent().into()),
            }
        }
    }
    Ok(())
}
