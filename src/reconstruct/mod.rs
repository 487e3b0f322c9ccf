//! Reconstruction: what the journal says × what the host shows → the state
//! of every target after a restart (docs/merge-table.md says why; this doc
//! says how).
//!
//! [`merge`] is one pure function. Its input ([`MergeInput`]) is the
//! replayed journal (or none: `--journal off`, or a journal that could not be
//! opened), the current boot id, the targets found on the host in the
//! kubelet layout ([`HostTarget`]) and what one read of the mount table shows
//! at each journal target's path ([`HostObservation`]). For every target —
//! the union of journal targets and host-found targets, matched by path, then
//! by (volume, device | pod UID) — it reduces the pair to three small facts,
//! [`JournalSays`], [`HostSays`] and [`Boot`], and matches them exhaustively
//! (`classify::decide`, one arm per row below). The answer is a
//! [`MergeOutput`]: one [`Decision`] per target plus findings (failed
//! rebuilds, unmounts done outside volumed, leftover dirs) — never a `Result`.
//! [`to_journal_records`] turns the decisions into `Reconstructed` journal
//! records and [`apply_to_asw`] fills the actual state of the world.
//!
//! # The merge table, as implemented
//!
//! "P" is the journal's parameters; "matches" compares mount identity
//! (see *Identity* below); for `dir` targets "matches" is "the directory is
//! present" ([`HostSays::DirPresent`]); `none` targets (hostPath) have no
//! host observation ([`HostSays::NotObserved`]). A `block` target's map is
//! its global map dir (the device's: present matches) or, for a pod, its
//! symlink and the bind on its file in that dir ([`HostObservation::Mapped`]):
//! both, the symlink naming P's device, match; one of them alone, another
//! device or a dir at the symlink's path differ; neither is absent. So a map
//! lost outside volumed is `unmounted_outside` (whole) or `mounted_differs`
//! (in part) and is made again while wanted, undone otherwise.
//!
//! | journal | host | boot | result | reason |
//! | --- | --- | --- | --- | --- |
//! | mounted with P | identity matches P (dir: present) | any | mounted | `mounted_matches` |
//! | mounted with P | mounted, identity differs | any | uncertain | `mounted_differs` |
//! | mounted, single-step intent | same identity, other SELinux label | any | uncertain | `selinux_label_differs` |
//! | mounted | absent | same | not mounted, finding *unmounted outside* | `unmounted_outside` |
//! | mounted | absent | after reboot | not mounted | `gone_after_reboot` |
//! | single-step mount intent | shows it done with P | any | mounted | `single_step_done` |
//! | single-step mount intent | absent | any | not mounted | `single_step_not_done` |
//! | single-step unmount intent | absent | any | not mounted | `single_step_done` |
//! | single-step unmount intent | still mounted with P | any | mounted | `single_step_not_done` |
//! | single-step intent | a mount with another identity | any | uncertain | `single_step_differs` |
//! | multi-step intent (or formatting) | `mount` target absent | after reboot | not mounted | `gone_after_reboot` |
//! | multi-step intent (or formatting) | anything else | any | uncertain | `multi_step_intent` |
//! | uncertain | `mount` target absent | after reboot | not mounted | `gone_after_reboot` |
//! | uncertain | anything else | any | uncertain | `journal_uncertain` |
//! | unmounted | mounted (any identity) or dir present | any | uncertain | `unmounted_but_mounted` |
//! | unmounted | absent | any | not mounted, listed as leftover | `unmounted_absent` |
//! | nothing | mounted in the kubelet layout | — | uncertain, rebuilt from the host | `rebuilt_from_host` |
//! | nothing | a bare volume dir (`dir` target) | — | mounted (set up) | `found_dir` |
//! | nothing | a `mount` target's dir with no mount | — | not mounted, listed as leftover | `host_leftover` |
//! | nothing, rebuild fails | — | — | [`MergeOutput::failed`], forced cleanup later | `rebuild_failed` |
//! | any (`none` target) | not observed | any | the journal's state (pending intent: uncertain) | `journal_stands` |
//! | nothing (`none` target) | not observed | — | uncertain | `rebuilt_from_host` |
//! | journal off | anything found | — | uncertain (KEP-3756), bare dirs too; failures listed | `rebuilt_from_host` (`rebuild_failed` for failures) |
//!
//! Rows and choices worth a word:
//!
//! - **A final failure outcome** has no row of its own: journal replay keeps
//!   the state before the operation in the entry, so the target falls into
//!   the row of that state (`mounted_*`, `unmounted_*`, …).
//! - **Single-step intents** are settled from the host, whatever the state
//!   before: one mount(2) or umount2(2) is either visible or not. Formatting
//!   is never single-step (a half-written filesystem is not visible in the
//!   mount table), whatever the record says.
//! - **Uncertain in the journal** stays uncertain on the same boot even when
//!   the host shows the intended mount: an uncertain outcome can come from a
//!   multi-step operation (a CSI driver may still be working, ownership may
//!   be half done), and re-running it is idempotent.
//! - **After a reboot** every `mount` target is not mounted unless the host
//!   shows it mounted (fstab); `dir` targets survive and are decided by their
//!   observation like on the same boot. "Same boot" means the boot id of the
//!   target's last journal record equals the current one.
//! - **A found bare dir** (journal on; a kubelet-era disk emptyDir) is *mounted*, i.e. set
//!   up: its contents are the pod's data, the directory is all a `dir` target
//!   is, and marking it uncertain would gain nothing (TearDown of a `dir`
//!   target is the same whether it was set up or not).
//! - **A found `mount` target dir with no mount** (journal on): the mount
//!   table proves nothing is mounted, so it is *not mounted* and its dir goes
//!   to orphan cleanup. With the journal off volumed behaves like the kubelet,
//!   which does not look, and calls it uncertain — as it does every target
//!   it finds, a bare `dir` target too (KEP-3756's "everything found is
//!   uncertain"; the next SetUp of a still-wanted one is idempotent).
//! - **SELinux**: a journal label that disagrees with the observed mount's
//!   `context=` (categories normalised by [`SeLinuxContext::parse`], so
//!   `c20,c10` = `c10,c20`) while everything else matches is uncertain with
//!   its own reason, so the next SetUp/MountDevice remounts with the right
//!   label (the host's mountinfo parser reads it from the super options).
//! - **A device target absent while pod binds remain**: every target is
//!   decided on its own observation; the pod binds match their recorded
//!   identity (major:minor, root), so they stay mounted ("in use" is decided
//!   by major:minor, not by path), and the device is `unmounted_outside`.
//!
//! # Identity
//!
//! A mount matches when [`MountIdentity::matches`] says so against the
//! identity the journal observed after the mount succeeded (for unmount
//! intents and settled mounts). When the journal has no observed identity
//! (a mount intent that never got its outcome, or a success outcome the
//! daemon wrote without one), the expected mount is built from P as well as
//! a pure function can:
//! - a pod bind of a directory (a local PV that is one, no device target):
//!   the major:minor and root a bind of that directory shows, from
//!   [`MergeInput::bind_sources`] (the same mount table), and P's
//!   read-only flag; P's fs type means nothing there;
//! - the fs type must be P's (`tmpfs` for a memory emptyDir) and the
//!   read-only flag must be P's (`ro` in P's mount options);
//! - a tmpfs is identified by being a tmpfs;
//! - a pod target whose volume has a device target: the pod bind must show
//!   the same major:minor and root as the mount currently observed at P's
//!   device mount path;
//! - otherwise P's device path must resolve to the observed major:minor
//!   through [`MergeInput::device_ids`] (filled by the caller by `stat`ing the
//!   device paths, which follows `/dev/disk/by-*` links and loop devices), or
//!   failing that equal the mount source path, compared lexically after
//!   normalisation (`//`, `/./`, trailing `/`);
//! - anything unconfirmed counts as *differs*: a mount that cannot be shown
//!   to be ours is replaced, never adopted (k8s #117513).
//!
//! The label is then compared on its own (row `selinux_label_differs`).
//!
//! *Invariant:* the merge (this file, `classify`, `apply`) does no I/O;
//! everything it knows arrives in [`MergeInput`]. The I/O edges fill it:
//! [`edge`] (host scan + journal → merge → records and ASW), `devices`
//! (device paths → major:minor), [`inspect`] (a journal read for the dry
//! run, never changed) and [`report`] (the dry run's document). None of
//! them mounts, unmounts or deletes.

mod apply;
mod classify;
mod counted;
pub(crate) mod devices;
pub mod edge;
mod error;
mod host_only;
pub mod inspect;
mod merge;
mod paths;
pub mod report;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::collections::HashMap;

use fxhash::FxBuildHasher;
use std::path::{Path, PathBuf};

use crate::journal::{JournalState, TargetKey};
use crate::model::{
    DevId, MountIdentity, MountState, PluginName, SeLinuxContext, SharedParams, TargetKind,
    TargetRef, UniqueVolumeName,
};

pub use apply::{
    apply_to_asw, asw_as_journal_says, changed_journal_records, journal_agrees, to_journal_records,
};
pub use classify::{Boot, HostSays, JournalSays, Reason};
pub use counted::record_metrics;
pub use error::ReconstructError;
pub use host_only::merge_leftovers;
pub use merge::merge;
pub(crate) use merge::merge_checked;

/// One mount the mount table shows at a target's path (the top-most one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedMount {
    /// major:minor, root, fs type, per-mount read-only flag, `context=` label
    pub identity: MountIdentity,
    /// the mount source (mountinfo's field 10), e.g. `/dev/loop3` or `tmpfs`
    pub source: PathBuf,
}

/// What the host shows at one target's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostObservation {
    /// Nothing: no mount, and for `dir` targets no directory.
    Absent,
    /// The directory exists and nothing is mounted on it (for `mount`
    /// targets: a leftover mount point dir).
    DirPresent,
    /// Something is mounted there.
    Mounted(ObservedMount),
    /// A raw block pod map, whole or in part (`block` pod targets, whose
    /// path is the pod's symlink and whose bind sits on the pod's file in
    /// the global map dir); nothing of it is [`HostObservation::Absent`].
    Mapped(BlockMap),
}

/// What the host shows of one pod's raw block map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockMap {
    /// where the pod's symlink points; `None` when there is no symlink
    pub link: Option<PathBuf>,
    /// whether something is mounted on the pod's file in the global map
    /// dir (the device's bind)
    pub bound: bool,
}

impl HostObservation {
    /// The observed identity, when something is mounted.
    pub fn identity(&self) -> Option<&MountIdentity> {
        match self {
            HostObservation::Mounted(m) => Some(&m.identity),
            HostObservation::Absent | HostObservation::DirPresent | HostObservation::Mapped(_) => {
                None
            }
        }
    }
}

/// What the caller could learn about a host-found target beyond its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rebuild {
    /// Enough to rebuild the target: its unique volume name (from the path,
    /// or for CSI from `vol_data.json`) and the label recorded there, if any.
    Ready {
        /// the unique volume name
        volume: UniqueVolumeName,
        /// `seLinuxMountContext` from `vol_data.json`, when present
        selinux: Option<SeLinuxContext>,
        /// a CSI target's arguments as `vol_data.json` gives them (driver,
        /// handle, lifecycle, attachment id): enough to unpublish or
        /// unstage it without a journal
        csi: Option<std::sync::Arc<crate::model::CsiParams>>,
    },
    /// The unique volume name follows from the path alone and no label was
    /// recorded: per pod for an emptyDir or hostPath
    /// ([`UniqueVolumeName::per_pod`]), the PV name for a local PV
    /// ([`UniqueVolumeName::shared`]). Built only when the target is rebuilt
    /// (a target the journal knows never is); other plugins are missing
    /// metadata.
    FromPath,
    /// Metadata needed to rebuild the target is missing or unreadable.
    MissingMetadata {
        /// what was missing (e.g. `vol_data.json: no such file`)
        what: String,
    },
}

/// A target found on the host in the kubelet layout (`pods/<uid>/volumes/…`
/// or under `plugins/`), possibly unknown to the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostTarget {
    /// the target's path (for CSI pod targets, the `…/mount` dir)
    pub path: PathBuf,
    /// device target, or the pod (UID from the path)
    pub target: TargetRef,
    /// the plugin's qualified name as found (unescaped), e.g. `kubernetes.io/secret`
    /// (borrowed for the plugins volumed knows)
    pub plugin_name: Cow<'static, str>,
    /// the plugin, when it is one volumed knows
    pub plugin: Option<PluginName>,
    /// the spec name from the path (pod volume name or PV name)
    pub spec_name: String,
    /// the target's kind: the plugin's, or for an emptyDir `mount` when a
    /// mount is observed and `dir` otherwise
    pub kind: TargetKind,
    /// what the host shows at `path`
    pub observation: HostObservation,
    /// whether the target can be rebuilt
    pub rebuild: Rebuild,
}

/// A map keyed by paths, with a fast (not DoS-resistant) hash: its keys
/// come from the journal and the mount table, not from pods.
pub type PathMap<V> = HashMap<PathBuf, V, FxBuildHasher>;

/// Everything the merge needs, filled by the I/O edge from one journal
/// replay, one mount-table read and one pod-dir scan.
#[derive(Debug, Clone, Default)]
pub struct MergeInput<'a> {
    /// the replayed journal; `None` with `--journal off` or when the journal
    /// was unusable (the KEP-3756 baseline)
    pub journal: Option<&'a JournalState>,
    /// the boot id now (`/proc/sys/kernel/random/boot_id`)
    pub current_boot_id: String,
    /// targets found on the host in the kubelet layout
    pub host_targets: Vec<HostTarget>,
    /// the top-most mount (or a dir) at each path the caller looked at; a
    /// path that is not here is [`HostObservation::Absent`]. The caller puts
    /// every journal target path (and device mount path) here: the top
    /// mount the table shows there, else `DirPresent` when its directory
    /// exists. Host-found targets carry their own observation (a journal
    /// target path with no entry here takes the observation of the
    /// host-found target at that path, if any). Hashed, not ordered: it is
    /// only looked up, once or twice per journal target.
    pub observe: PathMap<HostObservation>,
    /// device paths named by the journal, resolved to the block device's
    /// major:minor (`st_rdev`, following symlinks); missing when unresolved
    pub device_ids: BTreeMap<PathBuf, DevId>,
    /// directories the journal names as a pod bind's source (a local PV
    /// that is a directory), with the identity a bind of them shows: the
    /// mount holding the directory, its root extended by the path below it
    /// ([`MountTable::identity_at`](crate::host::mountinfo::MountTable::identity_at))
    pub bind_sources: PathMap<MountIdentity>,
}

impl MergeInput<'_> {
    /// What the host shows at `path` (absent when not observed).
    pub fn observation(&self, path: &Path) -> &HostObservation {
        const ABSENT: &HostObservation = &HostObservation::Absent;
        self.observe.get(path).unwrap_or(ABSENT)
    }
}

/// The decision for one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// the target
    pub key: TargetKey,
    /// its kind
    pub kind: TargetKind,
    /// what the journal said
    pub journal_says: JournalSays,
    /// what the host showed, compared with the journal
    pub host_says: HostSays,
    /// whether the journal's last record for it is from this boot
    pub boot: Boot,
    /// the decided state
    pub result: MountState,
    /// the merge-table row that decided it
    pub reason: Reason,
    /// the best known parameters: the journal's (the pending intent's when
    /// one was in flight, shared with the journal's entry), else rebuilt
    /// from the host
    pub params: SharedParams,
    /// the mount the host showed, if any
    pub observed: Option<MountIdentity>,
}

impl Decision {
    /// `device` or `pod`: the `target` label of
    /// `volumed_reconstruct_decisions_total`.
    pub fn target_label(&self) -> &'static str {
        match self.key.target {
            TargetRef::Device => "device",
            TargetRef::Pod(_) => "pod",
        }
    }
}

/// Why a host-found target could not be rebuilt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RebuildFailure {
    /// Its plugin is not one volumed has (secret, projected, …): such dirs
    /// are left alone and reported, never force-cleaned.
    UnknownPlugin,
    /// Metadata needed to name the volume is missing (e.g. `vol_data.json`).
    MissingMetadata(String),
}

/// A host-found target that could not be rebuilt (forced cleanup later).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedTarget {
    /// its path
    pub path: PathBuf,
    /// device or pod
    pub target: TargetRef,
    /// the plugin name as found
    pub plugin_name: String,
    /// the spec name from the path
    pub spec_name: String,
    /// why it failed
    pub cause: RebuildFailure,
    /// what the host shows there
    pub observation: HostObservation,
}

impl FailedTarget {
    /// Always [`Reason::RebuildFailed`].
    pub fn reason(&self) -> Reason {
        Reason::RebuildFailed
    }
}

/// A `mount` target decided not mounted whose mount-point dir may remain:
/// a candidate for orphan cleanup (the sweep removes the dirs of pods no
/// source wants; the loop forgets the journal entry of a target no pod
/// wants once settled, `reconciler/core/unheld.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leftover {
    /// the target
    pub key: TargetKey,
    /// its path
    pub path: PathBuf,
    /// whether the host showed the directory
    pub dir_present: bool,
}

/// Everything the merge decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MergeOutput {
    /// one decision per target, journal targets first (in key order), then
    /// host-only targets (in the order found)
    pub decisions: Vec<Decision>,
    /// host-found targets that could not be rebuilt
    pub failed: Vec<FailedTarget>,
    /// targets the journal had mounted that were unmounted outside volumed
    /// during this boot (`volumed_unmounted_outside_total`, `/debug/state`)
    pub unmounted_outside: Vec<TargetKey>,
    /// not-mounted `mount` targets whose dirs go to orphan cleanup
    pub orphan_leftovers: Vec<Leftover>,
    /// volumes whose device path only node status could tell; always empty
    /// in standalone mode (the journal records device paths)
    pub needs_device_path_from_node_status: Vec<UniqueVolumeName>,
}

impl MergeOutput {
    /// The decision for one target.
    pub fn decision(&self, key: &TargetKey) -> Option<&Decision> {
        self.decisions.iter().find(|d| &d.key == key)
    }
}

#[cfg(test)]
mod tests;
