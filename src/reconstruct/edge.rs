//! The I/O edge of reconstruction: fills a [`MergeInput`] from the host
//! (one mount-table read, the pod-dir walk, `stat` of device paths) and the
//! journal, runs the pure [`merge`], and — inside the daemon — writes the
//! decisions that change the journal back as `Reconstructed` records and
//! fills the ASW.
//!
//! What goes into the [`MergeInput`] (as the `reconstruct` module doc asks):
//! - `host_targets`: every target [`scan_with_table`] found — device
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
//!   [`super::devices::device_id`]; unresolved ones are
//!   simply absent.
//!
//! The table is read once (the live `/proc/self/mountinfo`, or a captured
//! file replayed by `reconstruct --dry-run --mountinfo`); the root dir is
//! canonicalised once, as the mount table shows resolved paths.
//!
//! # Two phases
//!
//! The daemon reconstructs in two phases (DESIGN.md, host scan: the walk of
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
//! ([`Journal::record_reconstruction`]): a journal that agrees with the host costs no
//! write at all. Phase 1 checks each journal decision against its entry
//! inside the merge (`merge_checked`), while the entry is at hand, instead of
//! walking the journal a second time.
//!
//! A journal that cannot be opened is [`JournalInput::Unreadable`]: every
//! target is rebuilt from the host alone, and [`reconstruct`] says so once,
//! loudly (`tracing::error!`). `--journal off` is the same merge without the
//! alarm: it is the KEP-3756 baseline, chosen on purpose.
//!
//! *Invariant:* this file reads the host and appends to the journal; it
//! never mounts, unmounts or deletes.

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use fxhash::{FxHashMap, FxHashSet};

use crate::elapsed_ms;
use crate::host::boot::BootId;
use crate::host::mountinfo::{MountInfo, MountTable};
use crate::host::scan::{
    DeviceName, DeviceTarget, HostView, Observed, PodTarget, ScanProblem, UnknownPluginDir,
    VolData, attach_vol_data, scan_mounts, scan_with_table, walk_pod_dirs,
};
use crate::host::sys::{FileKind, Sys, SysError};
use crate::journal::{Decided, Journal, JournalState};
use crate::model::{
    Layout, PluginName, SeLinuxContext, TargetKind, TargetRef, UniqueVolumeName, VOL_DATA_FILE,
};
use crate::state::ActualStateOfWorld;

use super::report::{ReconstructReport, report_with};
use super::{
    HostObservation, HostTarget, MergeInput, MergeOutput, ObservedMount, Rebuild, ReconstructError,
    apply_to_asw, changed_journal_records, devices, merge, merge_leftovers,
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

/// The layout with its root canonicalised (the mount table shows resolved
/// paths).
fn resolved(sys: &dyn Sys, layout: &Layout) -> Layout {
    Layout::new(
        sys.canonicalize(layout.root())
            .unwrap_or_else(|_| layout.root().into()),
    )
}

fn alarm_if_unreadable(journal: JournalInput<'_>) {
    if let JournalInput::Unreadable { reason } = journal {
        tracing::error!(
            %reason,
            "journal unreadable: every target is rebuilt from the host alone, as the kubelet does; \
             mounts the host cannot prove stay uncertain"
        );
    }
}

/// Scans the host, fills the merge input, merges, and builds the report:
/// both phases in one pass ([`reconstruct_ready`] then
/// [`reconstruct_leftovers`] decide the same targets the same way).
/// Changes nothing anywhere (the dry run shares it).
pub fn reconstruct(host: &HostInput<'_>, journal: JournalInput<'_>) -> Reconstruction {
    alarm_if_unreadable(journal);
    let layout = resolved(host.sys, host.layout);
    let view = scan_with_table(host.sys, host.table, &layout, host.boot_id.clone());
    finish(host, journal, view, merge)
}

/// Phase 1, up to a ready ASW: the mount-table part of the scan
/// ([`scan_mounts`], CSI `vol_data.json` of mounted CSI targets), every
/// journal target's own observation (the table, or one `lstat` for a path
/// with nothing mounted) and the merge. Decides every journal target and
/// every target mounted in the kubelet layout; the pod-dir walk is left to
/// [`reconstruct_leftovers`]. Changes nothing anywhere.
pub fn reconstruct_ready(host: &HostInput<'_>, journal: JournalInput<'_>) -> Reconstruction {
    ready_with(host, journal, merge)
}

/// [`reconstruct_ready`], and per decision whether the journal already
/// implies it (see [`super::merge_checked`]).
fn reconstruct_ready_checked(
    host: &HostInput<'_>,
    journal: JournalInput<'_>,
) -> (Reconstruction, Vec<bool>) {
    let mut agrees = Vec::new();
    let r = ready_with(host, journal, |input| {
        let (out, checked) = super::merge_checked(input);
        agrees = checked;
        out
    });
    (r, agrees)
}

fn ready_with(
    host: &HostInput<'_>,
    journal: JournalInput<'_>,
    decide: impl FnOnce(&MergeInput<'_>) -> MergeOutput,
) -> Reconstruction {
    alarm_if_unreadable(journal);
    let layout = resolved(host.sys, host.layout);
    let mounts = scan_mounts(host.table, &layout);
    let mut view = HostView {
        boot_id: host.boot_id.clone(),
        device_targets: mounts.device_targets,
        pod_targets: mounts.pod_targets,
        found_dirs: Vec::new(),
        unknown_plugin_dirs: mounts.unknown_plugin_dirs,
        problems: mounts.problems,
    };
    attach_vol_data(host.sys, &mut view, &layout);
    finish(host, journal, view, decide)
}

/// The pod-dir walk of phase 2 (with the CSI `vol_data.json` of what it
/// found): bare dirs of known plugins and dirs of unknown plugins that are
/// not mount points.
fn walk_leftovers(host: &HostInput<'_>) -> HostView {
    let layout = resolved(host.sys, host.layout);
    let mut problems = Vec::new();
    let (found_dirs, unknown_plugin_dirs) =
        walk_pod_dirs(host.sys, &layout, host.table, &mut problems);
    let mut view = HostView {
        boot_id: host.boot_id.clone(),
        device_targets: Vec::new(),
        pod_targets: Vec::new(),
        found_dirs,
        unknown_plugin_dirs,
        problems,
    };
    attach_vol_data(host.sys, &mut view, &layout);
    view
}

/// Phase 2, after readiness: the pod-dir walk, and decisions for what it
/// found that neither the journal nor `ready` decided
/// ([`super::merge_leftovers`]): kubelet-era bare emptyDirs (`found_dir`),
/// `mount` targets' dirs with nothing mounted (`host_leftover`, orphan
/// cleanup), dirs of plugins volumed does not have (listed as failed).
/// Changes nothing anywhere.
pub fn reconstruct_leftovers(
    host: &HostInput<'_>,
    journal: JournalInput<'_>,
    ready: &Reconstruction,
) -> Reconstruction {
    let view = walk_leftovers(host);
    decide_leftovers(host, journal, view, ready)
}

fn decide_leftovers(
    host: &HostInput<'_>,
    journal: JournalInput<'_>,
    mut view: HostView,
    ready: &Reconstruction,
) -> Reconstruction {
    // the walk's targets are bare dirs or dirs of unknown plugins: few lookups
    let tops = MountIndex::new(host.table, false);
    let mut pods = std::mem::take(&mut view.pod_targets);
    pods.append(&mut view.found_dirs);
    let input = MergeInput {
        journal: journal.state(),
        current_boot_id: host.boot_id.as_str().to_owned(),
        host_targets: host_targets_moving(&tops, &view, pods),
        observe: Default::default(),
        device_ids: BTreeMap::new(),
        bind_sources: Default::default(),
    };
    let output = merge_leftovers(&input, &ready.output);
    Reconstruction::new(output, view.problems, host.boot_id.as_str(), journal)
}

impl Reconstruction {
    /// Both phases as one reconstruction: `ready`'s decisions and findings,
    /// then `leftovers'` (one report over all of them).
    pub fn combine(
        ready: Reconstruction,
        leftovers: Reconstruction,
        boot_id: &str,
        journal: JournalInput<'_>,
    ) -> Reconstruction {
        let mut output = ready.output;
        let more = leftovers.output;
        output.decisions.extend(more.decisions);
        output.failed.extend(more.failed);
        output.unmounted_outside.extend(more.unmounted_outside);
        output.orphan_leftovers.extend(more.orphan_leftovers);
        output
            .needs_device_path_from_node_status
            .extend(more.needs_device_path_from_node_status);
        let mut problems = ready.problems;
        problems.extend(leftovers.problems);
        Reconstruction::new(output, problems, boot_id, journal)
    }
}

/// Fills the merge input from `view` and merges with `decide`.
fn finish(
    host: &HostInput<'_>,
    journal: JournalInput<'_>,
    mut view: HostView,
    decide: impl FnOnce(&MergeInput<'_>) -> MergeOutput,
) -> Reconstruction {
    let input = build_input_moving(host.sys, host.table, &mut view, journal.state());
    let output = decide(&input);
    Reconstruction::new(output, view.problems, host.boot_id.as_str(), journal)
}

/// The daemon's reconstruction, both phases at once:
/// [`reconstruct_and_record_ready`] then [`record_leftovers`], as one
/// [`Outcome`]. `replaced` is set when `journal` is a fresh journal
/// standing in for one that could not be opened: its (empty) state is not
/// consulted, and every target is rebuilt from the host alone.
///
/// Fails only when records cannot be appended; the journal is then closed
/// for writes and the daemon must exit (a later start reconstructs again).
pub fn reconstruct_and_record(
    journal: &Journal,
    replaced: Option<&str>,
    host: &HostInput<'_>,
    asw: &mut ActualStateOfWorld,
) -> Result<Outcome, ReconstructError> {
    let ready = reconstruct_and_record_ready(journal, replaced, host, asw)?;
    let left = record_leftovers(journal, replaced, host, &ready.reconstruction, asw)?;
    let state = journal.state();
    let input = journal_input(replaced, &state);
    let mut appended = ready.appended;
    appended.extend(left.appended);
    let mut asw_errors = ready.asw_errors;
    asw_errors.extend(left.asw_errors);
    Ok(Outcome {
        reconstruction: Reconstruction::combine(
            ready.reconstruction,
            left.reconstruction,
            host.boot_id.as_str(),
            input,
        ),
        appended,
        unchanged: ready.unchanged + left.unchanged,
        asw_errors,
    })
}

fn journal_input<'a>(replaced: Option<&'a str>, state: &'a JournalState) -> JournalInput<'a> {
    match replaced {
        Some(reason) => JournalInput::Unreadable { reason },
        None => JournalInput::Replayed(state),
    }
}

/// Phase 1 with the journal, on a table already read (the daemon reads its
/// own: [`read_and_reconstruct_ready`]): [`reconstruct_ready`] against `journal`'s state
/// (read in place, under its lock: nothing else writes before readiness),
/// then, in ONE batch ([`Journal::record_reconstruction`]), a `Reconstructed` record
/// for every decision the journal does not already imply (so `dump` shows
/// the live state afterwards), then the ASW. When it returns, the ASW is
/// ready; call [`record_leftovers`] afterwards. `replaced`: as for
/// [`reconstruct_and_record`].
pub fn reconstruct_and_record_ready(
    journal: &Journal,
    replaced: Option<&str>,
    host: &HostInput<'_>,
    asw: &mut ActualStateOfWorld,
) -> Result<Outcome, ReconstructError> {
    let (reconstruction, bodies, unchanged) =
        journal.with_state(|state| decide_ready(replaced, host, state));
    record_and_apply(journal, reconstruction, bodies, unchanged, asw)
}

/// Phase 1's decisions against `state`, the records that change it and how
/// many decisions need none.
fn decide_ready(
    replaced: Option<&str>,
    host: &HostInput<'_>,
    state: &JournalState,
) -> (Reconstruction, Vec<Decided>, usize) {
    let input = journal_input(replaced, state);
    if replaced.is_some() {
        let r = reconstruct_ready(host, input);
        let (bodies, unchanged) = changes(&r.output, state, host.boot_id.as_str());
        return (r, bodies, unchanged);
    }
    // the merge checked each decision against its entry as it went:
    // the same records `changes` finds, without walking the journal again
    let (r, agrees) = reconstruct_ready_checked(host, input);
    let bodies: Vec<Decided> = r
        .output
        .decisions
        .iter()
        .zip(&agrees)
        .filter(|(_, agrees)| !**agrees)
        .map(|(d, _)| super::apply::record_of(d))
        .collect();
    let unchanged = r.output.decisions.len() - bodies.len();
    (r, bodies, unchanged)
}

/// What [`read_and_reconstruct_ready`] returns: the table it read (phase 2
/// walks with it), what phase 1 did and the ready ASW.
#[derive(Debug)]
pub struct Ready {
    /// the mount table, read once
    pub table: MountTable,
    /// phase 1's decisions, records and ASW errors
    pub outcome: Outcome,
    /// the actual state of the world, ready
    pub asw: ActualStateOfWorld,
    /// whether `asw` is the one filled from the journal while the table was
    /// read (the merge agreed with every entry), not one filled afterwards
    pub asw_from_journal: bool,
}

/// Phase 1 as the daemon runs it at startup: reads
/// the live mount table through `sys` and does [`reconstruct_and_record_ready`]
/// into a new ASW.
///
/// The read is most of phase 1's time, spent in the kernel formatting the
/// table, and needs nothing from the journal; so the table is read on a
/// thread of its own ([`MountTable::read_overlapped`]) while this one fills,
/// from the journal alone, the ASW the journal implies
/// ([`super::asw_as_journal_says`]) and then parses the table's lines as
/// they arrive. That ASW is kept
/// only when the merge then agrees with every entry and decides nothing
/// else: it is then exactly what [`apply_to_asw`] would fill. Otherwise
/// it is dropped and the ASW is filled from the decisions. The journal's
/// state is read under one lock for both, so they see the same entries.
pub fn read_and_reconstruct_ready(
    journal: &Journal,
    replaced: Option<&str>,
    sys: &dyn Sys,
    layout: &Layout,
    boot_id: &BootId,
) -> Result<Ready, ReconstructError> {
    let (table, decided, speculated) = journal.with_state(|state| {
        let scan = Instant::now();
        let (table, speculated) = MountTable::read_overlapped(
            |piece| sys.read_mountinfo_pieces(piece),
            || match replaced {
                None => super::asw_as_journal_says(state, boot_id.as_str()),
                Some(_) => None,
            },
        );
        let table = table.map_err(mount_table_error)?;
        tracing::info!(
            phase = "mount_scan",
            elapsed_ms = elapsed_ms(scan.elapsed()),
            mounts = table.len(),
            "startup phase"
        );
        let host = HostInput {
            layout,
            table: &table,
            boot_id,
            sys,
        };
        let merge = Instant::now();
        let decided = decide_ready(replaced, &host, state);
        tracing::info!(
            phase = "merge",
            elapsed_ms = elapsed_ms(merge.elapsed()),
            decisions = decided.0.output.decisions.len(),
            "startup phase"
        );
        Ok::<_, ReconstructError>((table, decided, speculated))
    })?;
    let (reconstruction, bodies, unchanged) = decided;
    let decisions = reconstruction.output.decisions.len();
    match speculated {
        Some((asw, asw_errors)) if bodies.is_empty() && unchanged == decisions => {
            // nothing to append, but a journal closed for writes fails
            // startup here as it does on the other branch
            journal
                .record_reconstruction(Vec::new())
                .map_err(|source| ReconstructError::AppendRecords {
                    path: journal.dir().to_owned(),
                    count: 0,
                    source: Box::new(source),
                })?;
            log_asw_errors(&asw_errors);
            Ok(Ready {
                table,
                outcome: Outcome {
                    reconstruction,
                    appended: Vec::new(),
                    unchanged,
                    asw_errors,
                },
                asw,
                asw_from_journal: true,
            })
        }
        _ => {
            let mut asw = ActualStateOfWorld::new();
            let outcome = record_and_apply(journal, reconstruction, bodies, unchanged, &mut asw)?;
            Ok(Ready {
                table,
                outcome,
                asw,
                asw_from_journal: false,
            })
        }
    }
}

/// Phase 2 in the daemon, after readiness: the pod-dir walk, then
/// decisions for what it found that neither the journal nor `ready`
/// decided, recorded like phase 1's (one batch, only what changes) and
/// applied to the ASW. The journal state is read after the walk: a target
/// an operation started meanwhile has its intent written before its
/// directory was made, so the walk cannot find a dir the journal does not
/// already claim.
pub fn record_leftovers(
    journal: &Journal,
    replaced: Option<&str>,
    host: &HostInput<'_>,
    ready: &Reconstruction,
    asw: &mut ActualStateOfWorld,
) -> Result<Outcome, ReconstructError> {
    let view = walk_leftovers(host);
    let (reconstruction, bodies, unchanged) = journal.with_state(|state| {
        let r = decide_leftovers(host, journal_input(replaced, state), view, ready);
        let (bodies, unchanged) = changes(&r.output, state, host.boot_id.as_str());
        (r, bodies, unchanged)
    });
    record_and_apply(journal, reconstruction, bodies, unchanged, asw)
}

/// The records that change the journal, and how many decisions need none.
fn changes(out: &MergeOutput, state: &JournalState, boot_id: &str) -> (Vec<Decided>, usize) {
    let bodies: Vec<Decided> = changed_journal_records(out, state, boot_id)
        .into_iter()
        .map(|(_, body)| body)
        .collect();
    let unchanged = out.decisions.len() - bodies.len();
    (bodies, unchanged)
}

fn record_and_apply(
    journal: &Journal,
    reconstruction: Reconstruction,
    bodies: Vec<Decided>,
    unchanged: usize,
    asw: &mut ActualStateOfWorld,
) -> Result<Outcome, ReconstructError> {
    let count = bodies.len();
    let appended = journal.record_reconstruction(bodies).map_err(|source| {
        ReconstructError::AppendRecords {
            path: journal.dir().to_owned(),
            count,
            source: Box::new(source),
        }
    })?;
    let asw_errors = apply_to_asw(&reconstruction.output, asw);
    log_asw_errors(&asw_errors);
    Ok(Outcome {
        reconstruction,
        appended,
        unchanged,
        asw_errors,
    })
}

fn log_asw_errors(errors: &[ReconstructError]) {
    for e in errors {
        tracing::error!(error = %error_chain(e), "reconstruction: the ASW refused a decision");
    }
}

/// Fills the merge input from one scan (see the module doc for what goes
/// where).
#[cfg(test)]
pub fn build_input<'a>(
    sys: &dyn Sys,
    table: &MountTable,
    view: &HostView,
    journal: Option<&'a JournalState>,
) -> MergeInput<'a> {
    let tops = MountIndex::new(table, true);
    let host_targets = host_targets(&tops, view);
    fill_input(sys, &tops, host_targets, view, journal)
}

/// `build_input`, taking the view's pod targets and bare dirs instead of
/// copying them.
fn build_input_moving<'a>(
    sys: &dyn Sys,
    table: &MountTable,
    view: &mut HostView,
    journal: Option<&'a JournalState>,
) -> MergeInput<'a> {
    let tops = MountIndex::new(table, true);
    let mut pods = std::mem::take(&mut view.pod_targets);
    pods.append(&mut view.found_dirs);
    let host_targets = host_targets_moving(&tops, view, pods);
    fill_input(sys, &tops, host_targets, view, journal)
}

fn fill_input<'a>(
    sys: &dyn Sys,
    tops: &MountIndex<'_>,
    host_targets: Vec<HostTarget>,
    view: &HostView,
    journal: Option<&'a JournalState>,
) -> MergeInput<'a> {
    // Only journal paths are looked up in `observe`: one table lookup each,
    // else one `lstat`. A target path that is a host-found target's with a
    // mount is skipped: the merge takes that target's observation, the same
    // top mount of the same table. Device mount paths are always observed
    // here (the merge compares pod binds with them through `observe`).
    let mut found_mounted: FxHashSet<&[u8]> = FxHashSet::default();
    found_mounted.reserve(host_targets.len());
    found_mounted.extend(
        host_targets
            .iter()
            .filter(|h| matches!(h.observation, HostObservation::Mounted(_)))
            .map(|h| h.path.as_os_str().as_bytes()),
    );
    let mut observe = crate::reconstruct::PathMap::default();
    let mut device_paths: FxHashSet<&[u8]> = FxHashSet::default();
    let mut bind_sources = crate::reconstruct::PathMap::default();
    if let Some(state) = journal {
        observe.reserve(state.len() / 8 + 1);
        // looked-up paths by bytes (`Path`'s hash walks components): a path
        // spelt two ways is looked up twice, to the same answer
        let mut looked: FxHashSet<&[u8]> = FxHashSet::default();
        let mut look = |path: &'a Path| {
            if !looked.insert(path.as_os_str().as_bytes()) {
                return;
            }
            if let Some(top) = tops.top_at(path) {
                observe.insert(path.to_owned(), HostObservation::Mounted(observed(top)));
            } else if is_dir(sys, path) {
                observe.insert(path.to_owned(), HostObservation::DirPresent);
            }
        };
        // a volume's targets come together and name the same device paths:
        // the previous ones are skipped without hashing them again
        let (mut last_mount, mut last_device): (Option<&[u8]>, Option<&[u8]>) = (None, None);
        for (_, entry) in state.entries() {
            let params =
                std::iter::once(&entry.params).chain(entry.pending.iter().map(|p| &p.params));
            for p in params {
                if let Some(path) = p.path()
                    && !found_mounted.contains(path.as_os_str().as_bytes())
                {
                    look(path);
                }
                if let Some(path) = p.device_mount_path.as_deref() {
                    let b = path.as_os_str().as_bytes();
                    if last_mount != Some(b) {
                        look(path);
                        last_mount = Some(b);
                    }
                }
                // a directory bound into a pod (a local PV that is one): the
                // identity its bind must show, from the same table
                if p.plugin == PluginName::LocalVolume
                    && p.device_mount_path.is_none()
                    && let Some(d) = p.device_path.as_deref()
                    && !bind_sources.contains_key(d)
                    && let Some(id) = tops.table.identity_at(d)
                {
                    bind_sources.insert(d.to_owned(), id);
                }
                // one `stat` per distinct device path, however many targets name it
                if let Some(d) = p.device_path.as_deref() {
                    let b = d.as_os_str().as_bytes();
                    if last_device != Some(b) {
                        device_paths.insert(b);
                        last_device = Some(b);
                    }
                }
            }
        }
    }
    let device_paths = device_paths
        .into_iter()
        .map(|b| Path::new(std::ffi::OsStr::from_bytes(b)));
    MergeInput {
        journal,
        current_boot_id: view.boot_id.as_str().to_owned(),
        host_targets,
        observe,
        device_ids: devices::device_ids(sys, device_paths),
        bind_sources,
    }
}

/// The top mount at every mount point of one table, by path bytes (one
/// hash lookup where [`MountTable::top_at`] searches the sorted table),
/// built on first need: the first [`INDEX_AFTER`] lookups search the table,
/// as few do not repay hashing every mount point (with every mounted target
/// found by the scan, a journal that agrees looks up little else). A path
/// not in the index (`/`, or one spelt with a trailing `/`) is looked up in
/// the table.
struct MountIndex<'t> {
    table: &'t MountTable,
    /// lookups so far, while the index is not built
    lookups: std::cell::Cell<usize>,
    tops: std::cell::OnceCell<FxHashMap<&'t [u8], &'t MountInfo>>,
}

/// Lookups a [`MountIndex`] answers from the sorted table before indexing it.
const INDEX_AFTER: usize = 64;

impl<'t> MountIndex<'t> {
    /// Indexes `table` once more than [`INDEX_AFTER`] lookups are asked
    /// (`full` false: never; every lookup goes to the table).
    fn new(table: &'t MountTable, full: bool) -> Self {
        let tops = std::cell::OnceCell::new();
        if !full {
            let _ = tops.set(FxHashMap::default());
        }
        MountIndex {
            table,
            lookups: std::cell::Cell::new(0),
            tops,
        }
    }

    /// The index, built on first call (one pass over the table).
    fn index(&self) -> &FxHashMap<&'t [u8], &'t MountInfo> {
        self.tops.get_or_init(|| {
            let mut tops = FxHashMap::default();
            tops.reserve(self.table.len());
            for stack in self.table.stacks_under(Path::new("/")) {
                let top = stack.top();
                tops.insert(top.mount_point.as_os_str().as_bytes(), top);
            }
            tops
        })
    }

    /// The visible mount at `path`, as [`MountTable::top_at`] finds it.
    fn top_at(&self, path: &Path) -> Option<&'t MountInfo> {
        if self.tops.get().is_none() {
            let n = self.lookups.get() + 1;
            self.lookups.set(n);
            if n <= INDEX_AFTER {
                return self.table.top_at(path);
            }
        }
        match self.index().get(path.as_os_str().as_bytes()) {
            Some(top) => Some(*top),
            None => self.table.top_at(path),
        }
    }

    /// What the table shows at `path`: its top mount, else a present dir.
    fn observation_at(&self, path: &Path) -> HostObservation {
        match self.top_at(path) {
            Some(top) => HostObservation::Mounted(observed(top)),
            None => HostObservation::DirPresent,
        }
    }
}

/// A directory, not followed through a symlink.
fn is_dir(sys: &dyn Sys, path: &Path) -> bool {
    sys.stat(path, false)
        .is_ok_and(|st| st.kind == FileKind::Dir)
}

/// The merge's view of one mountinfo line.
fn observed(m: &MountInfo) -> ObservedMount {
    ObservedMount {
        identity: m.identity(),
        source: PathBuf::from(&m.source),
    }
}

/// Every host-found target, in scan order: device targets, mounted pod
/// targets, bare dirs, then dirs of unknown plugins.
#[cfg(test)]
fn host_targets(table: &MountIndex<'_>, view: &HostView) -> Vec<HostTarget> {
    let pods = view.pod_targets.iter().chain(&view.found_dirs).cloned();
    host_targets_moving(table, view, pods.collect())
}

/// `host_targets`, with the pod targets and bare dirs moved in (in that
/// order).
fn host_targets_moving(
    table: &MountIndex<'_>,
    view: &HostView,
    pods: Vec<PodTarget>,
) -> Vec<HostTarget> {
    let devices = view.device_targets.iter().map(|t| device_target(table, t));
    let pods = pods.into_iter().map(pod_target);
    let unknown = view
        .unknown_plugin_dirs
        .iter()
        .map(|d| unknown_target(table, d));
    devices.chain(pods).chain(unknown).collect()
}

fn device_target(table: &MountIndex<'_>, t: &DeviceTarget) -> HostTarget {
    let (spec_name, rebuild) = match &t.name {
        DeviceName::Local { pv } => (
            pv.clone(),
            Rebuild::Ready {
                volume: UniqueVolumeName::shared(PluginName::LocalVolume, pv),
                selinux: None,
            },
        ),
        DeviceName::Csi { handle_hash, .. } => {
            let spec = t.vol_data.as_ref().and_then(|v| v.spec_vol_id.clone());
            (
                spec.unwrap_or_else(|| handle_hash.clone()),
                csi_rebuild(t.vol_data.as_ref(), &t.path),
            )
        }
    };
    HostTarget {
        path: t.path.clone(),
        target: TargetRef::Device,
        plugin_name: t.plugin.as_str().into(),
        plugin: Some(t.plugin),
        spec_name,
        kind: TargetKind::Mount,
        observation: table.observation_at(&t.path),
        rebuild,
    }
}

/// One pod target, moved in: its path, pod, name and observed mount
/// become the host target's (the scan took them from the top mount at its
/// path in the same table).
fn pod_target(t: PodTarget) -> HostTarget {
    let mounted = matches!(t.observed, Observed::Mounted(_));
    let kind = match t.plugin {
        PluginName::EmptyDir if mounted => TargetKind::Mount,
        PluginName::EmptyDir => TargetKind::Dir,
        PluginName::HostPath => TargetKind::None,
        PluginName::LocalVolume | PluginName::Csi => TargetKind::Mount,
    };
    // the name follows from the path: built only if the target is rebuilt
    let rebuild = match t.plugin {
        PluginName::EmptyDir | PluginName::HostPath | PluginName::LocalVolume => Rebuild::FromPath,
        PluginName::Csi => csi_rebuild(t.vol_data.as_ref(), &t.path),
    };
    let observation = match t.observed {
        Observed::Mounted(seen) => HostObservation::Mounted(ObservedMount {
            identity: seen.identity,
            source: PathBuf::from(seen.source),
        }),
        Observed::DirPresent => HostObservation::DirPresent,
    };
    HostTarget {
        path: t.path,
        target: TargetRef::Pod(t.pod_uid),
        plugin_name: t.plugin.as_str().into(),
        plugin: Some(t.plugin),
        spec_name: t.spec_name,
        kind,
        observation,
        rebuild,
    }
}

/// A dir of a plugin volumed does not have: the merge lists it as failed
/// (never cleaned), whatever `rebuild` says.
fn unknown_target(table: &MountIndex<'_>, d: &UnknownPluginDir) -> HostTarget {
    HostTarget {
        path: d.path.clone(),
        target: TargetRef::Pod(d.pod_uid.clone()),
        plugin_name: d.plugin_dir.replace('~', "/").into(),
        plugin: None,
        spec_name: d.name.clone(),
        kind: if d.mounted {
            TargetKind::Mount
        } else {
            TargetKind::Dir
        },
        observation: if d.mounted {
            table.observation_at(&d.path)
        } else {
            HostObservation::DirPresent
        },
        rebuild: Rebuild::MissingMetadata {
            what: format!("no volumed plugin for {}", d.plugin_dir),
        },
    }
}

/// A CSI target's unique name `kubernetes.io/csi/<driver>^<handle>` and
/// label, from the `vol_data.json` beside it.
fn csi_rebuild(vol_data: Option<&VolData>, target: &Path) -> Rebuild {
    let missing = |what: &str| Rebuild::MissingMetadata {
        what: format!("{VOL_DATA_FILE} beside {}: {what}", target.display()),
    };
    let Some(v) = vol_data else {
        return missing("missing or unreadable");
    };
    let (Some(driver), Some(handle)) = (&v.driver_name, &v.volume_handle) else {
        return missing("no driverName or volumeHandle");
    };
    Rebuild::Ready {
        volume: UniqueVolumeName::shared(PluginName::Csi, &format!("{driver}^{handle}")),
        selinux: v
            .selinux_mount_context
            .as_deref()
            .and_then(|c| SeLinuxContext::parse(c).ok()),
    }
}

/// An error and its sources, `: `-joined, for logs and reports.
pub(super) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
#[path = "edge_tests.rs"]
mod tests;
