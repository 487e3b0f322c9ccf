//! Classify, then match: reduces a journal entry and a host observation to
//! [`JournalSays`] × [`HostSays`] × [`Boot`] and decides with one exhaustive
//! match whose arms are the rows of the merge table (see the module doc of
//! `reconstruct`).

use std::fmt;
use std::path::{Component, Path, PathBuf};

use crate::journal::Entry;
use crate::model::{
    MountIdentity, MountState, Operation, PluginName, Steps, TMPFS, TargetKind, TargetParams,
    TargetRef,
};

use super::{BlockMap, HostObservation, MergeInput, ObservedMount};

/// What the journal says about a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JournalSays {
    /// The last settled state is mounted with P.
    MountedWith,
    /// The last settled state is unmounted (P is what was unmounted).
    UnmountedWith,
    /// A one-syscall operation started and has no outcome.
    IntentSingleStep(Operation),
    /// A multi-step operation (or formatting) started and has no outcome.
    IntentMultiStep(Operation),
    /// The last settled state is uncertain.
    Uncertain,
    /// The journal does not know the target.
    Nothing,
    /// There is no journal (`--journal off` or unusable).
    Off,
}

impl fmt::Display for JournalSays {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JournalSays::MountedWith => f.write_str("mounted"),
            JournalSays::UnmountedWith => f.write_str("unmounted"),
            JournalSays::IntentSingleStep(op) => write!(f, "intent {} (single step)", op.as_str()),
            JournalSays::IntentMultiStep(op) => write!(f, "intent {} (multi step)", op.as_str()),
            JournalSays::Uncertain => f.write_str("uncertain"),
            JournalSays::Nothing => f.write_str("nothing"),
            JournalSays::Off => f.write_str("off"),
        }
    }
}

/// What the host shows at a target, compared with what the journal expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HostSays {
    /// A mount with the expected identity and label.
    Matches,
    /// A mount with another identity.
    Differs,
    /// A mount with the expected identity but another SELinux label.
    LabelDiffers,
    /// A mount, and no expectation to compare it with (journal nothing/off).
    Mounted,
    /// A `dir` target's directory is present.
    DirPresent,
    /// Nothing there (for a `mount` target: no mount, whether or not its
    /// mount-point dir remains).
    Absent,
    /// A `none` target: there is nothing to observe.
    NotObserved,
}

impl HostSays {
    /// The snake_case spelling for tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            HostSays::Matches => "matches",
            HostSays::Differs => "differs",
            HostSays::LabelDiffers => "label_differs",
            HostSays::Mounted => "mounted",
            HostSays::DirPresent => "dir_present",
            HostSays::Absent => "absent",
            HostSays::NotObserved => "not_observed",
        }
    }
}

/// Whether the journal's last record about a target is from this boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Boot {
    /// Same boot id (also used for targets the journal does not know).
    Same,
    /// The machine rebooted since.
    Rebooted,
}

/// The merge-table row that decided a target: the `reason` label of
/// `volumed_reconstruct_decisions_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// mounted with P, the host shows P's identity (dir: present)
    MountedMatches,
    /// mounted with P, the host shows another mount
    MountedDiffers,
    /// the identity matches but the SELinux label does not
    SelinuxLabelDiffers,
    /// mounted, now absent, same boot
    UnmountedOutside,
    /// absent after a reboot
    GoneAfterReboot,
    /// single-step intent, the host shows it done
    SingleStepDone,
    /// single-step intent, the host shows it not done
    SingleStepNotDone,
    /// single-step intent, the host shows a mount with another identity
    SingleStepDiffers,
    /// multi-step intent without outcome
    MultiStepIntent,
    /// the journal's state was already uncertain
    JournalUncertain,
    /// unmounted, yet the host shows something there
    UnmountedButMounted,
    /// unmounted, and nothing there
    UnmountedAbsent,
    /// not in the journal, found mounted: rebuilt from the host alone
    RebuiltFromHost,
    /// not in the journal, a bare volume dir: a found `dir` target
    FoundDir,
    /// not in the journal, a `mount` target's dir with nothing mounted
    HostLeftover,
    /// not in the journal and could not be rebuilt
    RebuildFailed,
    /// a `none` target: nothing to observe, the journal's state stands
    JournalStands,
    /// a CSI target the journal knows staged or published, after a reboot:
    /// the driver may hold state outside the mount table, so its call runs
    /// again (or its undo does)
    CsiAfterReboot,
    /// a CSI target the journal knows staged or published whose path is gone
    CsiPathMissing,
}

impl Reason {
    /// Every reason (for registering metric series up front).
    pub const ALL: [Reason; 19] = [
        Reason::MountedMatches,
        Reason::MountedDiffers,
        Reason::SelinuxLabelDiffers,
        Reason::UnmountedOutside,
        Reason::GoneAfterReboot,
        Reason::SingleStepDone,
        Reason::SingleStepNotDone,
        Reason::SingleStepDiffers,
        Reason::MultiStepIntent,
        Reason::JournalUncertain,
        Reason::UnmountedButMounted,
        Reason::UnmountedAbsent,
        Reason::RebuiltFromHost,
        Reason::FoundDir,
        Reason::HostLeftover,
        Reason::RebuildFailed,
        Reason::JournalStands,
        Reason::CsiAfterReboot,
        Reason::CsiPathMissing,
    ];

    /// The stable snake_case name (metric label, journal record, dry-run).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::MountedMatches => "mounted_matches",
            Reason::MountedDiffers => "mounted_differs",
            Reason::SelinuxLabelDiffers => "selinux_label_differs",
            Reason::UnmountedOutside => "unmounted_outside",
            Reason::GoneAfterReboot => "gone_after_reboot",
            Reason::SingleStepDone => "single_step_done",
            Reason::SingleStepNotDone => "single_step_not_done",
            Reason::SingleStepDiffers => "single_step_differs",
            Reason::MultiStepIntent => "multi_step_intent",
            Reason::JournalUncertain => "journal_uncertain",
            Reason::UnmountedButMounted => "unmounted_but_mounted",
            Reason::UnmountedAbsent => "unmounted_absent",
            Reason::RebuiltFromHost => "rebuilt_from_host",
            Reason::FoundDir => "found_dir",
            Reason::HostLeftover => "host_leftover",
            Reason::RebuildFailed => "rebuild_failed",
            Reason::JournalStands => "journal_stands",
            Reason::CsiAfterReboot => "csi_after_reboot",
            Reason::CsiPathMissing => "csi_path_missing",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// [`JournalSays`] with single-step intents split by direction: what
/// [`decide`] matches on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum J {
    Mounted,
    Unmounted,
    MountIntent,
    UnmountIntent,
    MultiStepIntent,
    Uncertain,
    Nothing,
    Off,
}

impl J {
    fn of(j: JournalSays) -> Self {
        match j {
            JournalSays::MountedWith => J::Mounted,
            JournalSays::UnmountedWith => J::Unmounted,
            JournalSays::IntentSingleStep(op) => match op.success_state() {
                Some(MountState::Mounted) => J::MountIntent,
                Some(MountState::NotMounted) => J::UnmountIntent,
                Some(MountState::Uncertain) | None => J::MultiStepIntent,
            },
            JournalSays::IntentMultiStep(_) => J::MultiStepIntent,
            JournalSays::Uncertain => J::Uncertain,
            JournalSays::Nothing => J::Nothing,
            JournalSays::Off => J::Off,
        }
    }
}

/// The merge table: one arm per row.
pub(super) fn decide(
    kind: TargetKind,
    journal: JournalSays,
    host: HostSays,
    boot: Boot,
) -> (MountState, Reason) {
    use HostSays as H;
    use MountState::{Mounted, NotMounted, Uncertain};
    match (J::of(journal), host, boot, kind) {
        // `none` targets: nothing to observe, the journal stands.
        (J::Mounted, H::NotObserved, ..) => (Mounted, Reason::JournalStands),
        (J::Unmounted, H::NotObserved, ..) => (NotMounted, Reason::JournalStands),
        (
            J::Uncertain | J::MountIntent | J::UnmountIntent | J::MultiStepIntent,
            H::NotObserved,
            ..,
        ) => (Uncertain, Reason::JournalStands),
        (J::Nothing | J::Off, H::NotObserved, ..) => (Uncertain, Reason::RebuiltFromHost),

        // mounted with P
        (J::Mounted, H::Matches | H::DirPresent, ..) => (Mounted, Reason::MountedMatches),
        (J::Mounted, H::Differs | H::Mounted, ..) => (Uncertain, Reason::MountedDiffers),
        (J::Mounted, H::LabelDiffers, ..) => (Uncertain, Reason::SelinuxLabelDiffers),
        (J::Mounted, H::Absent, Boot::Same, _) => (NotMounted, Reason::UnmountedOutside),
        (J::Mounted, H::Absent, Boot::Rebooted, _) => (NotMounted, Reason::GoneAfterReboot),

        // intent without outcome, single syscall: settled from the host
        (J::MountIntent, H::Matches | H::DirPresent, ..) => (Mounted, Reason::SingleStepDone),
        (J::MountIntent, H::Absent, ..) => (NotMounted, Reason::SingleStepNotDone),
        (J::UnmountIntent, H::Absent, ..) => (NotMounted, Reason::SingleStepDone),
        (J::UnmountIntent, H::Matches | H::DirPresent, ..) => (Mounted, Reason::SingleStepNotDone),
        (J::MountIntent | J::UnmountIntent, H::LabelDiffers, ..) => {
            (Uncertain, Reason::SelinuxLabelDiffers)
        }
        (J::MountIntent | J::UnmountIntent, H::Differs | H::Mounted, ..) => {
            (Uncertain, Reason::SingleStepDiffers)
        }

        // multi-step intent, or uncertain: uncertain, except a `mount`
        // target that a reboot took away
        (J::MultiStepIntent | J::Uncertain, H::Absent, Boot::Rebooted, TargetKind::Mount) => {
            (NotMounted, Reason::GoneAfterReboot)
        }
        (J::MultiStepIntent, ..) => (Uncertain, Reason::MultiStepIntent),
        (J::Uncertain, ..) => (Uncertain, Reason::JournalUncertain),

        // unmounted
        (J::Unmounted, H::Absent, ..) => (NotMounted, Reason::UnmountedAbsent),
        (
            J::Unmounted,
            H::Matches | H::Differs | H::LabelDiffers | H::Mounted | H::DirPresent,
            ..,
        ) => (Uncertain, Reason::UnmountedButMounted),

        // nothing in the journal (or no journal)
        (J::Nothing | J::Off, H::Mounted | H::Matches | H::Differs | H::LabelDiffers, ..) => {
            (Uncertain, Reason::RebuiltFromHost)
        }
        (J::Nothing, H::DirPresent, ..) => (Mounted, Reason::FoundDir),
        // KEP-3756: without the journal everything found is uncertain, a
        // bare dir too (its SetUp runs again, idempotently)
        (J::Off, H::DirPresent, ..) => (Uncertain, Reason::RebuiltFromHost),
        (J::Nothing, H::Absent, ..) => (NotMounted, Reason::HostLeftover),
        (J::Off, H::Absent, ..) => (Uncertain, Reason::RebuiltFromHost),
    }
}

/// A CSI raw block volume's device target (its staging dir) the journal
/// knows staged, after a reboot: uncertain and staged again
/// (`csi_after_reboot`), as a filesystem volume's staging is, whatever
/// dir is left: the driver may have lost what it staged, and a NodePublish
/// on it would fail. The kubelet's reconstruction marks it uncertain and
/// its MapVolume stages again. `None` leaves it to the block rows.
pub(super) fn decide_csi_block_device(
    journal: JournalSays,
    observation: &HostObservation,
    boot: Boot,
) -> Option<(HostSays, MountState, Reason)> {
    if journal != JournalSays::MountedWith || boot != Boot::Rebooted {
        return None;
    }
    let says = match observation {
        HostObservation::Absent => HostSays::Absent,
        _ => HostSays::DirPresent,
    };
    Some((says, MountState::Uncertain, Reason::CsiAfterReboot))
}

/// A CSI target the journal knows staged or published (docs/merge-table.md,
/// "CSI targets"):
/// the host is compared with what the call's outcome recorded at the path —
/// a mount and its identity, or none — never with an assumption that
/// drivers mount. `None` leaves it to the general table (intents, unmounted
/// targets, a target never called).
pub(super) fn decide_csi(
    entry: &Entry,
    journal: JournalSays,
    observation: &HostObservation,
    expected: Expected<'_>,
    boot: Boot,
    input: &MergeInput<'_>,
) -> Option<(HostSays, MountState, Reason)> {
    use MountState::{Mounted, NotMounted, Uncertain};
    if journal != JournalSays::MountedWith {
        return None;
    }
    let out = match (boot, &entry.observed, observation) {
        // a raw block pod map is decided as any block map is
        (_, _, HostObservation::Mapped(_)) => return None,
        (Boot::Rebooted, ..) => {
            let says = match observation {
                HostObservation::Mounted(m) => compare(expected, m, input),
                _ => HostSays::Absent,
            };
            (says, Uncertain, Reason::CsiAfterReboot)
        }
        (_, _, HostObservation::Absent) => (HostSays::Absent, Uncertain, Reason::CsiPathMissing),
        // recorded a mount
        (_, Some(_), HostObservation::Mounted(m)) => match compare(expected, m, input) {
            HostSays::Matches => (HostSays::Matches, Mounted, Reason::MountedMatches),
            HostSays::LabelDiffers => (
                HostSays::LabelDiffers,
                Uncertain,
                Reason::SelinuxLabelDiffers,
            ),
            other => (other, Uncertain, Reason::MountedDiffers),
        },
        (_, Some(_), HostObservation::DirPresent) => {
            (HostSays::Absent, NotMounted, Reason::UnmountedOutside)
        }
        // recorded no mount: the driver keeps the volume without one
        (_, None, HostObservation::DirPresent) => {
            (HostSays::Matches, Mounted, Reason::MountedMatches)
        }
        (_, None, HostObservation::Mounted(_)) => {
            (HostSays::Differs, Uncertain, Reason::MountedDiffers)
        }
    };
    Some(out)
}

/// Reduces a journal entry to what it says.
pub(super) fn journal_says(entry: &Entry) -> JournalSays {
    match &entry.pending {
        Some(p) => match (p.steps, p.op) {
            (_, Operation::FormatDevice) | (Steps::Multi, _) => JournalSays::IntentMultiStep(p.op),
            (Steps::Single, op) => JournalSays::IntentSingleStep(op),
        },
        None => match entry.state {
            MountState::Mounted => JournalSays::MountedWith,
            MountState::NotMounted => JournalSays::UnmountedWith,
            MountState::Uncertain => JournalSays::Uncertain,
        },
    }
}

/// The mount a journal entry expects to find.
#[derive(Debug, Clone, Copy)]
pub(super) enum Expected<'a> {
    /// The identity observed after the mount succeeded.
    Identity(&'a MountIdentity),
    /// Only the parameters: a mount intent, or no identity recorded.
    Params(&'a TargetParams),
}

/// What to compare the host with: the recorded identity, except for a
/// mount intent (which expects P, not what was there before).
pub(super) fn expectation(entry: &Entry, says: JournalSays) -> Expected<'_> {
    let mount_intent = J::of(says) == J::MountIntent;
    match (&entry.observed, mount_intent) {
        (Some(identity), false) => Expected::Identity(identity),
        (Some(_), true) | (None, _) => Expected::Params(entry.current_params()),
    }
}

/// Reduces what the host shows at a target to [`HostSays`].
pub(super) fn host_says(
    kind: TargetKind,
    target: &TargetRef,
    observation: &HostObservation,
    expected: Option<Expected<'_>>,
    input: &MergeInput<'_>,
) -> HostSays {
    match (kind, observation) {
        (TargetKind::None, _) => HostSays::NotObserved,
        (TargetKind::Dir, HostObservation::Absent) => HostSays::Absent,
        (TargetKind::Dir, HostObservation::DirPresent) => HostSays::DirPresent,
        (TargetKind::Dir, HostObservation::Mounted(_)) => match expected {
            // Something mounted over a directory target is not ours.
            Some(_) => HostSays::Differs,
            None => HostSays::Mounted,
        },
        (TargetKind::Mount, HostObservation::Absent | HostObservation::DirPresent) => {
            HostSays::Absent
        }
        // A raw block map: the device's target is the global map dir (a
        // plain dir, as a `dir` target's), a pod's is its symlink with the
        // bind on its file in that dir (`Mapped`), whole or in part.
        (TargetKind::Block, HostObservation::Absent) => HostSays::Absent,
        (TargetKind::Block, HostObservation::DirPresent) => match (target, expected) {
            (TargetRef::Device, Some(_)) => HostSays::Matches,
            (TargetRef::Device, None) => HostSays::DirPresent,
            // a directory where the pod's symlink belongs is not our map
            (TargetRef::Pod(_), Some(_)) => HostSays::Differs,
            (TargetRef::Pod(_), None) => HostSays::Mounted,
        },
        (TargetKind::Block, HostObservation::Mapped(map)) => block_map_says(map, expected),
        (TargetKind::Mount | TargetKind::Block, HostObservation::Mounted(m)) => match expected {
            None => HostSays::Mounted,
            Some(e) => compare(e, m, input),
        },
        // only block pod targets are observed as maps
        (TargetKind::Mount | TargetKind::Dir, HostObservation::Mapped(_)) => match expected {
            None => HostSays::Mounted,
            Some(_) => HostSays::Differs,
        },
    }
}

/// A pod's raw block map against the journal's: whole, with its symlink
/// naming P's device, it matches; in part (a symlink or a bind lost
/// outside volumed), or naming another device, it differs, so the map is
/// made again or undone, both idempotent. Found without a journal record
/// it is a map to rebuild.
fn block_map_says(map: &BlockMap, expected: Option<Expected<'_>>) -> HostSays {
    let Some(expected) = expected else {
        return HostSays::Mounted;
    };
    let BlockMap {
        link: Some(link),
        bound: true,
    } = map
    else {
        return HostSays::Differs;
    };
    match expected {
        Expected::Params(p) if p.device_path().is_some_and(|d| d != link.as_path()) => {
            HostSays::Differs
        }
        Expected::Params(_) | Expected::Identity(_) => HostSays::Matches,
    }
}

/// Compares an observed mount with the expectation (see "Identity" in the
/// module doc).
fn compare(expected: Expected<'_>, seen: &ObservedMount, input: &MergeInput<'_>) -> HostSays {
    let seen_id = &seen.identity;
    match expected {
        Expected::Identity(identity) => {
            if identity.matches(seen_id) {
                return HostSays::Matches;
            }
            let relabelled = MountIdentity {
                selinux: seen_id.selinux.clone(),
                ..identity.clone()
            };
            if relabelled.matches(seen_id) {
                HostSays::LabelDiffers
            } else {
                HostSays::Differs
            }
        }
        Expected::Params(p) => {
            if !same_mount(p, seen, input) {
                HostSays::Differs
            } else if p.selinux() != seen_id.selinux.as_ref() {
                HostSays::LabelDiffers
            } else {
                HostSays::Matches
            }
        }
    }
}

/// Whether an observed mount is P's mount, label aside, without a recorded
/// identity. Unconfirmed means no.
fn same_mount(p: &TargetParams, seen: &ObservedMount, input: &MergeInput<'_>) -> bool {
    let seen_id = &seen.identity;
    // a target the journal says is `ro` found `rw` (or the reverse) is
    // not this mount: a read-only claim is never taken as mounted writable
    let read_only = p.read_only();
    // A pod bind of a directory (a local PV that is one): the directory's
    // filesystem and its root there (a `fsType` on such a PV means nothing).
    if p.device_mount_path().is_none()
        && let Some(device) = p.device_path()
        && let Some(source) = input.bind_sources.get(device)
    {
        return source.dev == seen_id.dev
            && source.root == seen_id.root
            && read_only == seen_id.read_only;
    }
    let memory_empty_dir = p.plugin == PluginName::EmptyDir && p.kind == TargetKind::Mount;
    let fs_type = match (&p.fs_type, memory_empty_dir) {
        (Some(t), _) => Some(t.as_str()),
        (None, true) => Some(TMPFS),
        (None, false) => None,
    };
    if fs_type.is_some_and(|t| t != seen_id.fs_type.as_str()) {
        return false;
    }
    if read_only != seen_id.read_only {
        return false;
    }
    if seen_id.fs_type == TMPFS && fs_type == Some(TMPFS) {
        return true;
    }
    // A pod bind of a device target: same filesystem and root as the device mount.
    if matches!(p.target, TargetRef::Pod(_))
        && let Some(device_mount) = p.device_mount_path()
        && let Some(dev) = input.observation(device_mount).identity()
    {
        return dev.dev == seen_id.dev && dev.root == seen_id.root;
    }
    let Some(device) = p.device_path() else {
        return false;
    };
    match input.device_ids.get(device) {
        Some(id) => *id == seen_id.dev,
        None => normalise(device) == normalise(&seen.source),
    }
}

/// Lexical normalisation: `//`, `/./` and a trailing `/` go; `..` stays.
fn normalise(path: &Path) -> PathBuf {
    path.components()
        .filter(|c| *c != Component::CurDir)
        .collect()
}
