//! The reconciler loop's two lanes: the journal thread (flushes,
//! checkpoints, `Forget` records, in order) and the host thread (orphan
//! sweeps, malloc trims, late-mount checks). Each performs the work the
//! driver hands it and sends the completion back as an [`Event::Done`]; a
//! lane that is gone is reported as one that failed ([`lane_gone_journal`]).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{Receiver, Sender};
use std::time::Instant;

use crate::host::sys::Sys;
use crate::journal::Journal;
use crate::metrics::Metrics;
use crate::model::{Layout, MountState, TargetRef, UniqueVolumeName};

use crate::reconciler::core::{Completion, Event, Finish, HostWork, JournalWork, Swept};
use crate::reconciler::executor::subpaths::Subpaths;

/// The completion of journal work that found no journal thread.
pub(super) fn lane_gone_journal(work: JournalWork) -> Completion {
    let why = "the journal thread is gone".to_owned();
    match work {
        JournalWork::Flush => Completion::Flushed(Err(why)),
        JournalWork::Recover => Completion::Recovered(Err(why)),
        JournalWork::Checkpoint => Completion::Checkpointed(Err(why)),
        JournalWork::Repack => Completion::Repacked,
        JournalWork::ForgetVolume { key, .. } => Completion::Forgotten {
            key: Some(key),
            ok: false,
        },
        JournalWork::ForgetTarget { key, .. } => Completion::Forgotten { key, ok: false },
        JournalWork::ForgetNotMounted { targets, keys } => Completion::NotMountedForgotten {
            targets,
            keys,
            ok: false,
        },
    }
}

/// Performs journal work in order; each completion goes back to the loop.
pub(super) fn journal_lane(rx: &Receiver<JournalWork>, j: &Journal, events: &Sender<Event>) {
    for work in rx {
        let done = match work {
            JournalWork::Flush => Completion::Flushed(j.flush_pending().map_err(|e| e.to_string())),
            JournalWork::Recover => Completion::Recovered(j.recover().map_err(|e| e.to_string())),
            JournalWork::Checkpoint => Completion::Checkpointed(match j.checkpoint() {
                Ok(r) => {
                    tracing::debug!(
                        through = r.through_seq,
                        dropped = r.dropped,
                        "journal checkpoint"
                    );
                    Ok(r.through_seq)
                }
                Err(e) => Err(e.to_string()),
            }),
            JournalWork::Repack => {
                j.repack_state();
                Completion::Repacked
            }
            JournalWork::ForgetVolume { key, volume } => Completion::Forgotten {
                key: Some(key),
                ok: forget_volume(j, &volume),
            },
            JournalWork::ForgetTarget {
                volume,
                target,
                key,
            } => {
                let ok = j.forget(&volume, vec![target]);
                if let Err(e) = &ok {
                    tracing::error!(error = %e, "journal forget record");
                }
                Completion::Forgotten {
                    key,
                    ok: ok.is_ok(),
                }
            }
            JournalWork::ForgetNotMounted { targets, keys } => {
                let ok = match j.forget_not_mounted(&targets) {
                    Ok(n) => {
                        tracing::info!(
                            forgotten = n,
                            decided = targets.len(),
                            "journal: reconstruction's not-mounted targets no pod wants forgotten"
                        );
                        true
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "journal forget record");
                        false
                    }
                };
                Completion::NotMountedForgotten { targets, keys, ok }
            }
        };
        if events.send(Event::Done(done)).is_err() {
            return;
        }
    }
}

/// Forgets the targets of `volume` the journal has as not mounted: one
/// batch, one flush.
fn forget_volume(j: &Journal, volume: &UniqueVolumeName) -> bool {
    let targets: Vec<TargetRef> = j.with_state(|state| {
        state
            .entries()
            .filter(|(k, e)| &k.volume == volume && e.reported_state() == MountState::NotMounted)
            .map(|(k, _)| k.target.clone())
            .collect()
    });
    match j.forget(volume, targets) {
        Ok(_) => true,
        Err(e) => {
            tracing::error!(error = %e, "journal forget record");
            false
        }
    }
}

/// Performs host work in order; each completion goes back to the loop.
pub(super) fn host_lane(
    rx: &Receiver<HostWork>,
    (layout, sys, subpaths): &(Layout, Arc<dyn Sys>, Arc<Subpaths>),
    metrics: &Metrics,
    events: &Sender<Event>,
    stop: &AtomicBool,
) {
    for work in rx {
        let done = match work {
            HostWork::Sweep { known, finish } => Completion::Swept(sweep(
                (layout, sys.as_ref(), subpaths),
                metrics,
                &known,
                &finish,
                stop,
            )),
            HostWork::Trim => {
                crate::host::sys::trim_malloc();
                Completion::Trimmed
            }
            HostWork::CheckLate { paths } => Completion::LateChecked {
                // a path that cannot be read has no mount to undo now
                mounted: paths
                    .into_iter()
                    .filter(|p| sys.mount_root(p).unwrap_or(false))
                    .collect(),
            },
        };
        if events.send(Event::Done(done)).is_err() {
            return;
        }
    }
}

fn sweep(
    (layout, sys, subpaths): (&Layout, &dyn Sys, &Subpaths),
    metrics: &Metrics,
    known: &std::collections::BTreeSet<crate::model::PodUid>,
    finish: &Finish,
    stop: &AtomicBool,
) -> Swept {
    let started = Instant::now();
    let clean = |uid: &crate::model::PodUid| subpaths.clean_pod(uid);
    let r = super::orphans::sweep(layout, sys, &clean, known, finish, stop);
    let took = started.elapsed();
    for (path, why) in &r.left {
        tracing::warn!(path = %path.display(), %why, "orphan cleanup left this");
    }
    if r.examined > 0 || r.finished_deletions > 0 {
        tracing::info!(
            examined = r.examined,
            removed = r.removed,
            errors = r.errors,
            finished_deletions = r.finished_deletions,
            "orphaned pod dirs swept"
        );
    }
    let as_i64 = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    metrics.ops.orphan_cleaned.set(as_i64(r.examined));
    metrics.ops.orphan_cleaned_errors.set(as_i64(r.errors));
    tracing::debug!(?took, all = *finish == Finish::All, "orphan sweep");
    Swept {
        changed: r.changed,
        unfinished: r.unfinished,
        took,
    }
}
