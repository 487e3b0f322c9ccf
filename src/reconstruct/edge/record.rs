//! The daemon's reconstruction: each phase's decisions recorded in the
//! journal (only what changes it) and applied to the ASW.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use nix::errno::Errno;

use crate::host::boot::BootId;
use crate::host::mountinfo::MountTable;
use crate::host::sys::{Call, LIVE_MOUNTINFO, Sys, SysError};
use crate::journal::{Decided, Journal, JournalError, JournalState, TargetKey};
use crate::model::Layout;
use crate::state::ActualStateOfWorld;
use crate::util::time::elapsed_ms;

use super::phases::{
    decide_leftovers, reconstruct_ready, reconstruct_ready_checked, walk_all_leftovers,
    walk_leftovers,
};
use super::{HostInput, JournalInput, Outcome, Reconstruction, error_chain, mount_table_error};
use crate::reconstruct::{MergeOutput, ReconstructError, apply_to_asw, changed_journal_records};

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
    let view = walk_all_leftovers(host);
    let left = record_walked(journal, replaced, host, &ready.reconstruction, asw, view)?;
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
        .map(|(d, _)| crate::reconstruct::apply::record_of(d))
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

/// A read of the live mount table started early, on a thread of its own,
/// for [`read_and_reconstruct_ready`]: the daemon starts it as soon as it
/// holds the journal's lock ([`Journal::open_then`]), so the kernel formats
/// the table while the journal replays. Started before the lock, the read
/// could miss what another daemon still holding it did next.
#[derive(Debug)]
pub struct TableRead(std::thread::JoinHandle<Result<MountTable, SysError>>);

impl TableRead {
    /// Starts the read; `None` when no thread can be had (the table is
    /// then read in phase 1 as without it).
    pub fn start(sys: Arc<dyn Sys>) -> Option<TableRead> {
        std::thread::Builder::new()
            .name("volumed-mountinfo".into())
            .spawn(move || sys.read_mountinfo())
            .ok()
            .map(TableRead)
    }

    fn finish(self) -> Result<MountTable, SysError> {
        self.0.join().unwrap_or_else(|_| {
            // the reader panicked: as a failed read, named as one
            Err(SysError::call(
                Call::ReadMountinfo,
                Path::new(LIVE_MOUNTINFO),
                Errno::EIO,
            ))
        })
    }
}

/// Phase 1 as the daemon runs it at startup: reads
/// the live mount table through `sys` (or takes the read started `early`)
/// and does [`reconstruct_and_record_ready`] into a new ASW.
///
/// The read is most of phase 1's time, spent in the kernel formatting the
/// table, and needs nothing from the journal; so the table is read on a
/// thread of its own ([`TableRead`], or [`MountTable::read_overlapped`]
/// when none was started) while this one fills,
/// from the journal alone, the ASW the journal implies
/// ([`crate::reconstruct::asw_as_journal_says`]) and then parses the table's lines as
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
    early: Option<TableRead>,
) -> Result<Ready, ReconstructError> {
    let (table, decided, speculated) = journal.with_state(|state| {
        let scan = Instant::now();
        let fill = || {
            let fill = Instant::now();
            let speculated = match replaced {
                None => crate::reconstruct::asw_as_journal_says(state, boot_id.as_str()),
                Some(_) => None,
            };
            // overlaps the table's read: part of `mount_scan`
            tracing::info!(
                phase = "asw_from_journal",
                elapsed_ms = elapsed_ms(fill.elapsed()),
                kept_if_merge_agrees = speculated.is_some(),
                "startup phase"
            );
            speculated
        };
        let started_early = early.is_some();
        let (table, speculated) = match early {
            Some(read) => {
                let speculated = fill();
                (read.finish(), speculated)
            }
            None => MountTable::read_overlapped(|piece| sys.read_mountinfo_pieces(piece), fill),
        };
        let table = table.map_err(mount_table_error)?;
        // with an early read: only the wait for it after the journal's open
        tracing::info!(
            phase = "mount_scan",
            elapsed_ms = elapsed_ms(scan.elapsed()),
            mounts = table.len(),
            started_early,
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
            append(journal, Vec::new())?;
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
            // Timed apart: a restart right after a first start records one
            // `Reconstructed` record per fresh mount (its outcome carried no
            // identity, the merge now has one), and sled's inserts of those
            // are most of phase 1 at 10k targets.
            let record = Instant::now();
            let records = bodies.len();
            let appended = append(journal, bodies)?;
            tracing::info!(
                phase = "journal_record",
                elapsed_ms = elapsed_ms(record.elapsed()),
                records,
                "startup phase"
            );
            let fill = Instant::now();
            let mut asw = ActualStateOfWorld::new();
            let asw_errors = apply(&reconstruction, &mut asw);
            tracing::info!(
                phase = "asw_fill",
                elapsed_ms = elapsed_ms(fill.elapsed()),
                "startup phase"
            );
            let outcome = Outcome {
                reconstruction,
                appended,
                unchanged,
                asw_errors,
            };
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
/// already claim. One an operation takes after that read (a leftover dir
/// its pod wants again) is looked at again as the records are appended,
/// and left to the operation.
///
/// `stop` is asked before each pod's dir is walked: once it says so the
/// walk ends, nothing is decided or recorded (`Ok(None)`), and the next
/// start walks again.
pub fn record_leftovers(
    journal: &Journal,
    replaced: Option<&str>,
    host: &HostInput<'_>,
    ready: &Reconstruction,
    asw: &mut ActualStateOfWorld,
    stop: &dyn Fn() -> bool,
) -> Result<Option<Outcome>, ReconstructError> {
    let Some(view) = walk_leftovers(host, stop) else {
        return Ok(None);
    };
    record_walked(journal, replaced, host, ready, asw, view).map(Some)
}

/// [`record_leftovers`] once the walk gave `view`.
fn record_walked(
    journal: &Journal,
    replaced: Option<&str>,
    host: &HostInput<'_>,
    ready: &Reconstruction,
    asw: &mut ActualStateOfWorld,
    view: crate::host::scan::HostView,
) -> Result<Outcome, ReconstructError> {
    let walked = decide_walked(journal, replaced, host, ready, view);
    record_decided_walk(journal, walked, asw)
}

/// The walk's decisions against the journal's state as it is now, and the
/// records they would add (by target), with how many need none.
pub(super) struct Walked {
    pub(super) reconstruction: Reconstruction,
    bodies: Vec<(TargetKey, Decided)>,
    unchanged: usize,
}

pub(super) fn decide_walked(
    journal: &Journal,
    replaced: Option<&str>,
    host: &HostInput<'_>,
    ready: &Reconstruction,
    view: crate::host::scan::HostView,
) -> Walked {
    journal.with_state(|state| {
        let r = decide_leftovers(host, journal_input(replaced, state), view, ready);
        let bodies: Vec<(TargetKey, Decided)> =
            changed_journal_records(&r.output, state, host.boot_id.as_str())
                .into_iter()
                .map(|(d, body)| (d.key.clone(), body))
                .collect();
        Walked {
            unchanged: r.output.decisions.len() - bodies.len(),
            reconstruction: r,
            bodies,
        }
    })
}

/// Records `walked` and applies it to `asw`. The loop runs meanwhile: an
/// operation may have taken a target since the walk looked. The journal
/// looks again as it appends ([`Journal::record_unknown`]), and what was
/// taken is the operation's, left out of the journal and the ASW alike.
pub(super) fn record_decided_walk(
    journal: &Journal,
    walked: Walked,
    asw: &mut ActualStateOfWorld,
) -> Result<Outcome, ReconstructError> {
    let Walked {
        mut reconstruction,
        bodies,
        unchanged,
    } = walked;
    let count = bodies.len();
    let (appended, taken) = journal
        .record_unknown(bodies)
        .map_err(append_failed(journal, count))?;
    if !taken.is_empty() {
        tracing::debug!(
            targets = taken.len(),
            "pod-dir walk: targets an operation took meanwhile are left to it"
        );
        let taken: BTreeSet<TargetKey> = taken.into_iter().collect();
        reconstruction
            .output
            .decisions
            .retain(|d| !taken.contains(&d.key));
    }
    Ok(applied(reconstruction, appended, unchanged, asw))
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
    let appended = append(journal, bodies)?;
    Ok(applied(reconstruction, appended, unchanged, asw))
}

/// A phase's outcome once its records are appended: its decisions applied
/// to `asw`.
fn applied(
    reconstruction: Reconstruction,
    appended: Vec<u64>,
    unchanged: usize,
    asw: &mut ActualStateOfWorld,
) -> Outcome {
    let asw_errors = apply(&reconstruction, asw);
    Outcome {
        reconstruction,
        appended,
        unchanged,
        asw_errors,
    }
}

/// Appends a phase's records in one batch (see [`record_and_apply`]).
fn append(journal: &Journal, bodies: Vec<Decided>) -> Result<Vec<u64>, ReconstructError> {
    let count = bodies.len();
    journal
        .record_reconstruction(bodies)
        .map_err(append_failed(journal, count))
}

/// The error of a batch of `count` records `journal` refused.
fn append_failed(journal: &Journal, count: usize) -> impl FnOnce(JournalError) -> ReconstructError {
    let path = journal.dir().to_owned();
    move |source| ReconstructError::AppendRecords {
        path,
        count,
        source: Box::new(source),
    }
}

/// Applies a phase's decisions to `asw`, logging what it refused.
fn apply(reconstruction: &Reconstruction, asw: &mut ActualStateOfWorld) -> Vec<ReconstructError> {
    let asw_errors = apply_to_asw(&reconstruction.output, asw);
    log_asw_errors(&asw_errors);
    asw_errors
}

fn log_asw_errors(errors: &[ReconstructError]) {
    for e in errors {
        tracing::error!(error = %error_chain(e), "reconstruction: the ASW refused a decision");
    }
}
