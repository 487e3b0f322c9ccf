//! What the merge's decisions become: journal records and ASW entries.

use crate::journal::{Body, Entry, JournalState};
use crate::model::{
    MountState, SeLinuxContext, SharedStr, TargetParams, TargetRef, UniqueVolumeName,
};
use crate::state::{ActualStateOfWorld, DeviceMount, PodMount, SeLinuxState};

use super::{Decision, MergeOutput, ReconstructError};

/// One `Reconstructed` record per decision, so that replaying them makes the
/// journal's state equal to the decisions (and to the ASW). Failed rebuilds
/// have no parameters and are not recorded.
pub fn to_journal_records(out: &MergeOutput) -> Vec<Body> {
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
) -> Vec<(&'a Decision, Body)> {
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

pub(super) fn record_of(d: &Decision) -> Body {
    Body::Reconstructed {
        target: TargetParams::clone(&d.params),
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
/// volume has another target in the ASW. Volumes are added without a spec
/// (the DSW brings it). Returns the errors, one per failed decision.
pub fn apply_to_asw(out: &MergeOutput, asw: &mut ActualStateOfWorld) -> Vec<ReconstructError> {
    let live = |d: &&Decision| d.result != MountState::NotMounted;
    // the volume just added or found: a volume's targets come together
    let mut known: Option<&UniqueVolumeName> = None;
    for d in out.decisions.iter().filter(live) {
        let device_path = match d.key.target {
            TargetRef::Device => d.params.device_path.clone(),
            TargetRef::Pod(_) => None,
        };
        // adding a known volume with no spec and no device path changes
        // nothing (one search either way: no `volume_exists` first)
        if device_path.is_none() && known == Some(&d.key.volume) {
            continue;
        }
        known = Some(&d.key.volume);
        asw.add_volume(
            d.key.volume.clone(),
            d.params.plugin,
            d.params.spec_name.clone(),
            None,
            device_path,
        );
    }
    out.decisions
        .iter()
        .filter_map(|d| apply_one(d, asw).err())
        .collect()
}

/// The label a target carries: what the host showed when it showed a
/// mount, else the journal's.
fn label(d: &Decision) -> Option<SeLinuxContext> {
    match &d.observed {
        Some(identity) => identity.selinux.clone(),
        None => d.params.selinux.clone(),
    }
}

fn apply_one(d: &Decision, asw: &mut ActualStateOfWorld) -> Result<(), ReconstructError> {
    let volume = &d.key.volume;
    let no_path = || ReconstructError::NoTargetPath { key: d.key.clone() };
    match &d.key.target {
        TargetRef::Device => {
            let mount_path = d.params.path().ok_or_else(no_path)?.to_path_buf();
            let mount = DeviceMount {
                device_path: d.params.device_path.clone(),
                mount_path,
                selinux: label(d),
            };
            match d.result {
                MountState::Mounted => asw.mark_device_mounted(volume, mount)?,
                MountState::Uncertain => asw.mark_device_uncertain(volume, mount)?,
                MountState::NotMounted if asw.volume_exists(volume) => {
                    // Record where the device target lives, then its state;
                    // the label of a mount that is gone is not the volume's.
                    let mount = DeviceMount {
                        selinux: None,
                        ..mount
                    };
                    asw.mark_device_uncertain(volume, mount)?;
                    asw.mark_device_unmounted(volume)?;
                }
                MountState::NotMounted => {}
            }
        }
        TargetRef::Pod(pod) => {
            let mount_path = d.params.pod_mount_path.clone().ok_or_else(no_path)?;
            let known = || SeLinuxState::mounted_with(label(d));
            match d.result {
                MountState::Mounted => {
                    let mount = PodMount {
                        outer_name: SharedStr::default(),
                        mount_path,
                        kind: d.kind,
                        selinux: known(),
                    };
                    asw.mark_volume_mounted(volume, pod, mount)?;
                }
                MountState::Uncertain => {
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
                    asw.mark_volume_uncertain_via_reconstruction(volume, pod, mount);
                }
                MountState::NotMounted => {}
            }
        }
    }
    Ok(())
}
