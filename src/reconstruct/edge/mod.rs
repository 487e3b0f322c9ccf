//! The I/O edge of reconstruction: fills a [`MergeInput`](super::MergeInput) from the host
//! (one mount-table read, the pod-dir walk, `stat` of device paths) and the
//! journal, runs the pure [`merge`](super::merge), and — inside the daemon — writes the
//! decisions that change the journal back as `Reconstructed` records and
//! fills the ASW.
//!
//! What goes into the [`MergeInput`](super::MergeInput) (as the `reconstruct` module doc asks):
//! - `host_targets`: every target [`scan_with_table`](crate::host::scan::scan_with_table) found — device
//!   targets mounted under `plugins/`, pod targets mounted under
//!   `pods/<uid>/volumes/`, bare pod volume dirs, and dirs of plugins volumed
//!   does not have (which the merge lists as failed, never cleans). The
//!   target kind is the plugin's: `mount` for local and CSI, `none` for
//!   hostPath, and for an emptyDir `mount` when something is mounted there,
//!   `dir` otherwise. Unique volume names come from the path (local PV
//!   name, emptyDir/hostPath per pod) or, for CSI, from `vol_data.json`
//!   (driver and handle); without it the target cannot be rebuilt.
//! - `observe`: for each journal target path (and device mount path), the
//!   top-most mount the table shows there, else `DirPresent` when it is a
//!   directory with nothing mounted on it (one `lstat`: a symlink is not a
//!   directory). Host-found targets carry their own observation.
//! - `device_ids`: every distinct device path the journal names, through
//!   `super::devices::device_id`; unresolved ones are
//!   simply absent.
//!
//! The table is read once (the live `/proc/self/mountinfo`, or a captured
//! file replayed by `reconstruct --dry-run --mountinfo`); the root dir is
//! canonicalised once, as the mount table shows resolved paths.
//!
//! # Two phases
//!
//! The daemon reconstructs in two phases (docs/merge-table.md: the walk of
//! pod dirs for leftovers only feeds orphan cleanup and may finish after the
//! ASW is ready):
//! 1. **ready** ([`reconstruct_ready`], [`reconstruct_and_record_ready`];
//!    at startup [`read_and_reconstruct_ready`], which also reads the table
//!    and meanwhile fills the ASW the journal implies):
//!    the mount-table part of the scan (device and pod targets mounted in the
//!    kubelet layout, CSI `vol_data.json` beside them), every journal
//!    target's own observation (the table; for a path with nothing mounted,
//!    one `lstat`) and the merge. Every journal target and every mounted
//!    target is decided, recorded and in the ASW when it returns.
//! 2. **leftovers** ([`reconstruct_leftovers`], [`record_leftovers`]), after
//!    readiness: the pod-dir walk, and decisions only for what it found that
//!    phase 1 and the journal did not decide — kubelet-era bare emptyDirs
//!    (`found_dir`), `mount` targets' dirs with nothing mounted
//!    (`host_leftover`, orphan cleanup), dirs of plugins volumed does not
//!    have (listed as failed, never cleaned).
//!
//! Why this is safe: with the journal on, every journal target — `dir`
//! targets included — is observed in phase 1 through its own path, so the
//! walk can only add targets the journal never knew (host-only dirs), and a
//! dir of a target the journal knows is never decided twice. Those dirs
//! hold no mount (the table proves it), so nothing the ASW must know about
//! a mount waits. [`reconstruct`] (the dry run) and
//! [`reconstruct_and_record`] run both phases and decide the same targets
//! the same way.
//!
//! Only decisions that change what the journal implies are recorded
//! ([`super::journal_agrees`]), in one batch per phase
//! ([`Journal::record_reconstruction`](crate::journal::Journal::record_reconstruction)): a journal that agrees with the host costs no
//! write at all. Phase 1 checks each journal decision against its entry
//! inside the merge (`merge_checked`), while the entry is at hand, instead of
//! walking the journal a second time.
//!
//! A journal that cannot be opened is [`JournalInput::Unreadable`]: every
//! target is rebuilt from the host alone, and [`reconstruct`] says so once,
//! loudly (`tracing::error!`). `--journal off` is the same merge without the
//! alarm: it is the KEP-3756 baseline, chosen on purpose.
//!
//! *Invariant:* this module reads the host and appends to the journal; it
//! never mounts, unmounts or deletes.

mod input;
mod phases;
mod record;

use std::path::Path;

use crate::host::boot::BootId;
use crate::host::mountinfo::MountTable;
use crate::host::scan::ScanProblem;
use crate::host::sys::{Sys, SysError};
use crate::journal::JournalState;
use crate::model::Layout;
pub(super) use crate::util::chain::error_chain;

use super::report::{ReconstructReport, report_with};
use super::{MergeOutput, ReconstructError};

pub use phases::{
    reconstruct, reconstruct_leftovers, reconstruct_leftovers_until, reconstruct_ready,
};
pub use record::{
    Ready, TableRead, read_and_reconstruct_ready, reconstruct_and_record,
    reconstruct_and_record_ready, record_leftovers,
};

/// Where the journal side of the merge comes from.
#[derive(Debug, Clone, Copy)]
pub enum JournalInput<'a> {
    /// `--journal off`: the KEP-3756 baseline, on purpose.
    Off,
    /// The journal could not be opened (or was replaced by a fresh one after
    /// it was moved aside): every target is rebuilt from the host alone.
    Unreadable {
        /// why, for the one loud log line and the report
        reason: &'a str,
    },
    /// The replayed journal.
    Replayed(&'a JournalState),
}

impl<'a> JournalInput<'a> {
    /// The replayed state, if any.
    pub fn state(&self) -> Option<&'a JournalState> {
        match self {
            JournalInput::Replayed(s) => Some(s),
            JournalInput::Off | JournalInput::Unreadable { .. } => None,
        }
    }

    /// `on`, `off` or `unreadable`: the dry run's `journal` field.
    pub fn as_str(&self) -> &'static str {
        match self {
            JournalInput::Off => "off",
            JournalInput::Unreadable { .. } => "unreadable",
            JournalInput::Replayed(_) => "on",
        }
    }
}

/// The host side: the layout, one read of the mount table, the boot id.
#[derive(Clone, Copy)]
pub struct HostInput<'a> {
    /// the kubelet layout (root dir as configured; canonicalised here)
    pub layout: &'a Layout,
    /// the mount table, read once
    pub table: &'a MountTable,
    /// the boot id now
    pub boot_id: &'a BootId,
    /// the seam every other host read goes through (the root's resolution,
    /// `lstat`s, the pod-dir walk, `vol_data.json`, device nodes, sysfs)
    pub sys: &'a dyn Sys,
}

impl std::fmt::Debug for HostInput<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostInput")
            .field("layout", self.layout)
            .field("table", &self.table.entries().len())
            .field("boot_id", self.boot_id)
            .finish_non_exhaustive()
    }
}

/// What one reconstruction found and decided.
#[derive(Debug)]
pub struct Reconstruction {
    /// the merge's decisions and findings
    pub output: MergeOutput,
    /// what the host scan skipped and why
    pub problems: Vec<ScanProblem>,
    /// the boot id now, for the report
    boot_id: String,
    /// `on`, `off` or `unreadable`, for the report
    journal: &'static str,
    /// why the journal is unreadable, for the report
    journal_note: Option<String>,
}

impl Reconstruction {
    fn new(
        output: MergeOutput,
        problems: Vec<ScanProblem>,
        boot_id: &str,
        journal: JournalInput<'_>,
    ) -> Self {
        Reconstruction {
            output,
            problems,
            boot_id: boot_id.to_owned(),
            journal: journal.as_str(),
            journal_note: match journal {
                JournalInput::Unreadable { reason } => Some(reason.to_owned()),
                JournalInput::Off | JournalInput::Replayed(_) => None,
            },
        }
    }

    /// Per target: journal, host, decision and reason (the dry run's
    /// document). Built on demand: the daemon does not need it.
    pub fn report(&self) -> ReconstructReport {
        let problems = self.problems.iter().map(|p| error_chain(p)).collect();
        report_with(
            &self.output,
            &self.boot_id,
            self.journal,
            self.journal_note.clone(),
            problems,
        )
    }
}

/// What [`reconstruct_and_record`] (or one of its phases) did.
#[derive(Debug)]
pub struct Outcome {
    /// the reconstruction
    pub reconstruction: Reconstruction,
    /// sequence numbers of the `Reconstructed` records, one per decision
    /// that changed what the journal implies, in decision order
    pub appended: Vec<u64>,
    /// decisions the journal already implied: no record needed
    /// ([`super::journal_agrees`]); `appended.len() + unchanged` is the
    /// number of decisions
    pub unchanged: usize,
    /// decisions the ASW refused (the others were applied)
    pub asw_errors: Vec<ReconstructError>,
}

/// Reads a mount table once (`/proc/self/mountinfo`, or a captured file).
pub fn read_mount_table(path: &Path) -> Result<MountTable, ReconstructError> {
    MountTable::read(path).map_err(|source| ReconstructError::ReadMountTable {
        path: path.to_owned(),
        source,
    })
}

/// Reads the live mount table once, through the seam.
pub fn read_live_mount_table(sys: &dyn Sys) -> Result<MountTable, ReconstructError> {
    sys.read_mountinfo().map_err(mount_table_error)
}

/// A failed read of the live table as reconstruction reports it.
fn mount_table_error(e: SysError) -> ReconstructError {
    let path = std::path::PathBuf::from(crate::host::sys::LIVE_MOUNTINFO);
    let source = match e {
        SysError::MountInfo(host) => *host,
        other => crate::host::HostError::ReadMountInfo {
            path: path.clone(),
            source: other.to_io(),
        },
    };
    ReconstructError::ReadMountTable { path, source }
}

#[cfg(test)]
mod tests;
