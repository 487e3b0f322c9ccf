//! The merge's journal side: every journal target decided (a large journal
//! in two halves), then the host-only targets, into one [`MergeOutput`].

use fxhash::FxHashMap;

use super::host_only::merge_host_only;
use super::paths::{ObserveByBytes, by_path, path_bytes};
use super::{
    Boot, Decision, HostObservation, HostTarget, Leftover, MergeInput, MergeOutput, Reason,
    classify,
};
use crate::journal::{Entry, JournalState, TargetKey};
use crate::model::{MountState, TargetKind, TargetRef};

/// Merges the journal with the host: one decision per target plus findings.
pub fn merge(input: &MergeInput<'_>) -> MergeOutput {
    merge_checked(input).0
}

/// [`merge`], and per decision whether the journal already implies it
/// ([`journal_agrees`] against `input.journal` and the current boot id),
/// checked while each journal entry is at hand rather than in a second walk
/// of the journal: what [`changed_journal_records`] finds, as flags.
pub(crate) fn merge_checked(input: &MergeInput<'_>) -> (MergeOutput, Vec<bool>) {
    // Each entry is decided on its own, so a large journal is decided in
    // two halves on two threads, and the halves' results are joined in key
    // order. Below `PARALLEL_FROM` a thread costs more than it saves.
    let n = input.journal.map_or(0, JournalState::len);
    merge_checked_split(input, if n >= PARALLEL_FROM { n / 2 } else { n })
}

/// [`merge_checked`], deciding the journal's entries from `split_at` on
/// (in key order) on a second thread (tests choose where).
pub(super) fn merge_checked_split(
    input: &MergeInput<'_>,
    split_at: usize,
) -> (MergeOutput, Vec<bool>) {
    let mut out = MergeOutput::default();
    let mut agrees = Vec::new();
    let mut claimed = vec![false; input.host_targets.len()];
    // keyed by path bytes: `Path`'s own hash walks components
    let host_by_path: FxHashMap<&[u8], usize> = input
        .host_targets
        .iter()
        .enumerate()
        .map(|(i, h)| (path_bytes(&h.path), i))
        .collect();

    if let Some(journal) = input.journal {
        let observe = ObserveByBytes::new(&input.observe);
        let entries: Vec<(&TargetKey, &Entry)> = journal.entries().collect();
        let run = |entries: &[(&TargetKey, &Entry)]| {
            decide_journal_run(input, &host_by_path, &observe, entries)
        };
        let (mut ran, rest) =
            crate::util::halves::in_two_halves("volumed-merge", &entries, split_at, run);
        ran.append(rest);
        for i in ran.claimed {
            claimed[i] = true;
        }
        agrees = ran.agrees;
        out = ran.out;
    }
    // Claimed by path: with several host targets at one path (the map
    // holds the last), each asks the map.
    let unique_paths = host_by_path.len() == input.host_targets.len();
    let is_claimed = |i: usize, h: &HostTarget| match unique_paths {
        true => claimed[i],
        false => claimed[host_by_path[path_bytes(&h.path)]],
    };
    // a host target's key is decided when the journal has it (it decided it)
    let journal_has = |key: &TargetKey| input.journal.is_some_and(|j| j.get(key).is_some());
    merge_host_only(input, is_claimed, journal_has, &mut out);
    // host-only targets are not in the journal: nothing implies them
    agrees.resize(out.decisions.len(), false);
    (out, agrees)
}

/// Journal entries from which [`merge_checked`] decides in two halves.
const PARALLEL_FROM: usize = 2048;

/// What deciding a run of journal entries gives: the decisions and
/// findings, whether the journal implies each decision, and the host
/// targets (by index) that the run's entries claimed.
#[derive(Default)]
struct JournalRun {
    out: MergeOutput,
    agrees: Vec<bool>,
    claimed: Vec<usize>,
}

impl JournalRun {
    /// `next`'s results after this run's (every field: a field added to
    /// [`MergeOutput`] must be joined here too).
    fn append(&mut self, next: JournalRun) {
        let JournalRun {
            out:
                MergeOutput {
                    mut decisions,
                    mut failed,
                    mut unmounted_outside,
                    mut orphan_leftovers,
                    mut needs_device_path_from_node_status,
                },
            mut agrees,
            mut claimed,
        } = next;
        self.out.decisions.append(&mut decisions);
        self.out.failed.append(&mut failed);
        self.out.unmounted_outside.append(&mut unmounted_outside);
        self.out.orphan_leftovers.append(&mut orphan_leftovers);
        self.out
            .needs_device_path_from_node_status
            .append(&mut needs_device_path_from_node_status);
        self.agrees.append(&mut agrees);
        self.claimed.append(&mut claimed);
    }
}

/// Decides the journal targets `entries` (consecutive entries of
/// `input.journal`, in key order).
fn decide_journal_run(
    input: &MergeInput<'_>,
    host_by_path: &FxHashMap<&[u8], usize>,
    observe: &ObserveByBytes<'_>,
    entries: &[(&TargetKey, &Entry)],
) -> JournalRun {
    let mut run = JournalRun::default();
    run.out.decisions.reserve(entries.len());
    run.agrees.reserve(entries.len());
    run.claimed.reserve(entries.len());
    for &(key, entry) in entries {
        let path = entry.current_params().path();
        let host = path.and_then(|p| by_path(host_by_path, p));
        if let Some(i) = host {
            run.claimed.push(i);
        }
        let observation = match (path.and_then(|p| observe.get(p)), host) {
            (Some(seen), _) => seen,
            (None, Some(i)) => &input.host_targets[i].observation,
            (None, None) => &HostObservation::Absent,
        };
        let decision = decide_journal_target(input, key, entry, observation);
        // `entry_agrees`, without comparing the parameters: with no
        // pending intent they are the entry's own (the same `Arc`)
        run.agrees.push(
            entry.pending.is_none()
                && entry.state == decision.result
                && *entry.boot_id == *input.current_boot_id
                && entry.observed.as_deref() == decision.observed.as_ref(),
        );
        record(&mut run.out, decision, observation);
    }
    run
}

/// Classifies and decides one journal target.
fn decide_journal_target(
    input: &MergeInput<'_>,
    key: &TargetKey,
    entry: &Entry,
    observation: &HostObservation,
) -> Decision {
    let params = entry.current_params();
    let journal_says = classify::journal_says(entry);
    let expected = classify::expectation(entry, journal_says);
    let boot = if *entry.boot_id == *input.current_boot_id {
        Boot::Same
    } else {
        Boot::Rebooted
    };
    // a CSI block target's maps are not at its path for the scan to see
    // (the pod's is a symlink, the device's a dir the driver may leave
    // empty): it follows the block rows, as a local PV's does, but for
    // its staging after a reboot
    let csi = match (params.plugin, params.kind, &params.target) {
        (crate::model::PluginName::Csi, TargetKind::Block, TargetRef::Device) => {
            classify::decide_csi_block_device(journal_says, observation, boot)
        }
        (crate::model::PluginName::Csi, TargetKind::Block, TargetRef::Pod(_)) => None,
        (crate::model::PluginName::Csi, ..) => {
            classify::decide_csi(entry, journal_says, observation, expected, boot, input)
        }
        _ => None,
    };
    let (host_says, result, reason) = match csi {
        Some(decided) => decided,
        None => {
            let host_says = classify::host_says(
                params.kind,
                &params.target,
                observation,
                Some(expected),
                input,
            );
            let (result, reason) = classify::decide(params.kind, journal_says, host_says, boot);
            (host_says, result, reason)
        }
    };
    Decision {
        key: key.clone(),
        kind: params.kind,
        journal_says,
        host_says,
        boot,
        result,
        reason,
        params: params.clone(),
        observed: observation.identity().cloned(),
    }
}

/// Appends a decision and the findings it implies.
pub(super) fn record(out: &mut MergeOutput, decision: Decision, observation: &HostObservation) {
    if decision.reason == Reason::UnmountedOutside {
        out.unmounted_outside.push(decision.key.clone());
    }
    if decision.result == MountState::NotMounted
        && decision.kind == TargetKind::Mount
        && let Some(path) = decision.params.path()
    {
        out.orphan_leftovers.push(Leftover {
            key: decision.key.clone(),
            path: path.to_path_buf(),
            dir_present: *observation == HostObservation::DirPresent,
        });
    }
    out.decisions.push(decision);
}
