//! The loop's vocabulary: the [`Event`]s that wake it and the [`Effect`]s
//! its core asks the driver to perform (jobs, journal work, host work) with
//! their [`Completion`]s. What it changes under the lock is
//! [`World`](crate::state::World).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::journal::TargetKey;
use crate::model::{PodUid, SharedPath, TargetRef, UniqueVolumeName};
use crate::reconciler::jobs::{Job, JobReport};
use crate::reconciler::pending::OpKey;
use crate::reconciler::plan::Action;
use crate::reconstruct::MergeOutput;
use crate::sources::SourceEvent;
use crate::state::{ActualStateOfWorld, UnmountedOutside};

/// Everything that can wake the loop.
#[derive(Debug)]
pub(crate) enum Event {
    /// the pod sources changed
    Sources(Vec<SourceEvent>),
    /// a job finished
    JobDone(JobReport),
    /// stop: finish in-flight work, start nothing new
    Stop,
    /// reconstruction's phase 1 finished: the ASW it built, what it found
    /// unmounted outside volumed, and the targets it could not rebuild
    Reconstructed(Box<Reconstructed>),
    /// reconstruction's phase 2 (the pod-dir walk) finished, with the
    /// targets it found unmounted outside volumed (already logged)
    Leftovers(Box<MergeOutput>, Vec<UnmountedOutside>),
    /// an effect the driver performed finished
    Done(Completion),
    /// `node.status.volumesAttached` as the API server had it once the
    /// API source listed: (unique volume name, devicePath)
    NodeDevicePaths(Vec<(UniqueVolumeName, std::path::PathBuf)>),
    /// a node status update listing these in `volumesInUse` succeeded
    ReportedInUse(Vec<UniqueVolumeName>),
}

/// What reconstruction's phase 1 hands the loop ([`Event::Reconstructed`]).
#[derive(Debug, Default)]
pub(crate) struct Reconstructed {
    /// the ASW, ready
    pub asw: ActualStateOfWorld,
    /// the targets found unmounted outside volumed (already logged)
    pub unmounted_outside: Vec<UnmountedOutside>,
    /// the targets it could not rebuild (for the forced cleanup)
    pub failed: Vec<crate::reconstruct::FailedTarget>,
    /// the journal's targets it decided not mounted (the ASW holds none of
    /// them as such): forgotten once every source listed unless wanted
    /// (`core/unheld.rs`)
    pub not_mounted: Vec<TargetKey>,
}

/// How an effect ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Completion {
    /// a job was not handed to a worker: no parameters known for it, or
    /// the workers are gone (`workers_gone`)
    NotStarted {
        /// its key
        key: OpKey,
        /// a forced cleanup
        forced: bool,
        /// the workers are gone: the loop stops
        workers_gone: bool,
    },
    /// the outcomes appended without waiting are durable, or the flush
    /// failed (the journal is unwritable until a recovery)
    Flushed(Result<(), String>),
    /// a recovery of the unwritable journal ran: `Ok(true)` it is writable
    /// again with every record kept in memory durable (`Ok(false)`: it
    /// was writable already), or why it is still not
    Recovered(Result<bool, String>),
    /// a checkpoint through this sequence number was written, or failed
    Checkpointed(Result<u64, String>),
    /// a `Forget` is durable (`ok`) or was refused; `key` when the plan
    /// decided it or a TearDown led to it (busy until then)
    Forgotten {
        /// the key kept busy for it
        key: Option<OpKey>,
        /// whether every record was appended
        ok: bool,
    },
    /// reconstruction's not-mounted targets no pod wants are forgotten
    /// (`ok`), or the write failed (`JournalWork::ForgetNotMounted`)
    NotMountedForgotten {
        /// the targets, tried again later when the write failed
        targets: Vec<TargetKey>,
        /// the keys kept busy for it
        keys: Vec<OpKey>,
        /// whether the records were appended
        ok: bool,
    },
    /// an orphan sweep finished
    Swept(Swept),
    /// the allocator was trimmed
    Trimmed,
    /// the journal's state was repacked (or the lane was gone)
    Repacked,
    /// the watched paths found mounted (`HostWork::CheckLate`)
    LateChecked {
        /// those with a mount
        mounted: Vec<SharedPath>,
    },
}

/// A journal write the loop decided (performed in order on one thread).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JournalWork {
    /// make the outcomes the workers appended without waiting durable
    Flush,
    /// the journal cannot be written: reopen its files and write what
    /// waits in memory (`Journal::recover`)
    Recover,
    /// write a checkpoint
    Checkpoint,
    /// repack the journal's state (`World::repack`'s companion)
    Repack,
    /// forget the volume's targets the journal has as not mounted (the
    /// plan's `Forget`: the volume left the ASW)
    ForgetVolume {
        /// its key, busy until this is done
        key: OpKey,
        /// the volume
        volume: UniqueVolumeName,
    },
    /// forget one target (after a forced cleanup ran, or a pod target
    /// torn down from a volume that stays in the ASW)
    ForgetTarget {
        /// the name it was journaled under
        volume: UniqueVolumeName,
        /// the target
        target: TargetRef,
        /// the operation key kept busy until the forget is durable
        key: Option<OpKey>,
    },
    /// forget reconstruction's not-mounted targets that no pod wants once
    /// every source listed, in one batch; each only while the journal
    /// still has it not mounted with nothing pending (`core/unheld.rs`)
    ForgetNotMounted {
        /// the targets
        targets: Vec<TargetKey>,
        /// the operation keys kept busy until the forget is durable
        keys: Vec<OpKey>,
    },
}

/// Host work the loop decided (on its own thread: a hung filesystem must
/// not hold back the journal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HostWork {
    /// sweep orphaned pod dirs; `known` holds every pod the DSW or ASW knows
    Sweep {
        /// pods not to be touched
        known: BTreeSet<PodUid>,
        /// the known pods whose interrupted deletions to finish (an
        /// orphan's always are)
        finish: Finish,
    },
    /// give freed memory back to the kernel
    Trim,
    /// which of these paths are mount points (late mounts, `core::late`)
    CheckLate {
        /// the watched paths
        paths: Vec<SharedPath>,
    },
}

/// The pod dirs in which a sweep finishes the `<name>.deleting~<seq>`
/// renames a TearDown left (`EmptyDirPlugin::finish_pending`). Only a
/// TearDown makes one, so only a pod with a TearDown since the last sweep
/// can hold one, and every pod after a start (a crash may have cut a
/// TearDown anywhere): a settled sweep lists no known pod's dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Finish {
    /// every pod dir
    All,
    /// these pods' dirs
    Pods(BTreeSet<PodUid>),
}

impl Default for Finish {
    fn default() -> Self {
        Finish::Pods(BTreeSet::new())
    }
}

impl Finish {
    /// Whether `pod`'s dir is to be finished.
    pub(crate) fn contains(&self, pod: &PodUid) -> bool {
        match self {
            Finish::All => true,
            Finish::Pods(p) => p.contains(pod),
        }
    }

    /// Adds `pod`.
    pub(crate) fn insert(&mut self, pod: PodUid) {
        if let Finish::Pods(p) = self {
            p.insert(pod);
        }
    }

    /// Adds every pod of `other`.
    pub(crate) fn merge(&mut self, other: Finish) {
        match (&mut *self, other) {
            (Finish::All, _) => {}
            (_, Finish::All) => *self = Finish::All,
            (Finish::Pods(p), Finish::Pods(mut q)) => p.append(&mut q),
        }
    }
}

/// How an orphan sweep ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Swept {
    /// the pods whose interrupted deletions are not finished (an error, a
    /// mount left inside, the sweep stopped first): the next sweep tries
    /// them again
    pub unfinished: Finish,
    /// how long it took (on the host thread)
    pub took: Duration,
    /// it removed an orphan or finished a deletion
    pub changed: bool,
}

/// What the driver does for a step.
#[derive(Debug)]
pub(crate) enum Effect {
    /// hand a job to the workers; `announce`: append its first intent
    /// (unflushed) first, so the jobs of one pass share flushes
    Start {
        /// the job
        job: Job,
        /// append its intent ahead
        announce: bool,
    },
    /// a teardown: built from the journal's last parameters for the target
    /// when it has them, else `fallback` (from the ASW), then started as
    /// [`Effect::Start`] with `announce`
    StartTearDown {
        /// the planned teardown
        action: Action,
        /// the job as the ASW describes it
        fallback: Option<Job>,
    },
    /// a journal write
    Journal(JournalWork),
    /// host work
    Host(HostWork),
    /// an event on a pod, as the kubelet records one (`FailedMount`,
    /// `FailedUnMount`): to the event sink, stamped with the time there
    PodEvent(PodEvent),
    /// an attachable volume's mount waits for `volumesInUse`: update the
    /// node status now rather than at the next period
    ReportInUse,
    /// repack the World's maps ([`World::repack`](crate::state::World::repack), under its lock), timed
    /// and logged: the step decides, with no clock to time it by
    RepackWorld,
    /// the journal turned unwritable (`false`: nothing new starts) or
    /// writable again (`true`): logged and an event, naming the journal's
    /// filesystem and its free space
    JournalWritable(bool),
    /// a metric the step counted, for the driver to apply: the step
    /// touches no registry
    Count(Counted),
}

/// What the core counts (`Effect::Count`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Counted {
    /// `volume_manager_total_volumes`: every (plugin, state, count), in
    /// place of the last
    TotalVolumes(Vec<(crate::model::PluginName, &'static str, usize)>),
    /// one SELinux metric event of a pod's admission
    SeLinux(crate::selinux::MetricEvent),
    /// a forced cleanup decided (`force_cleaned_failed_volume_operations_total`)
    ForceCleaned,
    /// one that failed or could not run
    /// (`force_cleaned_failed_volume_operation_errors_total`)
    ForceCleanedError,
}

/// What the driver read from shared counters before the step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Observed {
    /// jobs sent that no worker has taken yet
    pub queued_jobs: usize,
    /// the journal's synced-through watermark
    pub synced_through: u64,
    /// a write or flush of the journal failed and no recovery has
    /// succeeded since (`Journal::unwritable_reason`)
    pub journal_unwritable: bool,
}

/// The kubelet's reason when a pod's volume cannot be attached or mounted
/// (a Warning).
pub(crate) const FAILED_MOUNT: &str = "FailedMount";
/// The attach/detach controller's reason when a volume cannot be attached:
/// volumed gives it to a pod whose CSI volume waits for its
/// VolumeAttachment (the wait the kubelet reports only as a mount timeout).
pub(crate) const FAILED_ATTACH: &str = "FailedAttachVolume";
/// The kubelet's reason when a pod's volume cannot be unmounted.
pub(crate) const FAILED_UNMOUNT: &str = "FailedUnMount";

/// An event on a pod the core decided (stamped and sent by the driver:
/// `health::events::stamped`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodEvent {
    /// the pod
    pub pod: PodUid,
    /// its namespace and name, when a source lists it
    pub names: Option<Arc<crate::state::PodRef>>,
    /// the kubelet's reason
    pub reason: &'static str,
    /// what happened
    pub message: String,
}
