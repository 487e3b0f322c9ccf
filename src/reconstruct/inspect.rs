//! Reading the journal for `reconstruct --dry-run`, which must change
//! neither mounts nor journal records.
//!
//! The journal is opened with [`JournalConfig::inspect`]: nothing is
//! created, a damaged journal is reported and left where it is (never moved
//! aside, no records quarantined). Opening still refreshes the `acked`
//! watermark file, as `dump` does; records are untouched.
//!
//! When a running daemon holds sled's lock, the dry run reads a **copy**:
//! the journal dir is copied into a fresh temp dir and the copy is opened.
//! sled's lock is an `flock` on the copy's own `db` file, so the copy opens
//! while the daemon keeps its lock, and nothing the copy does reaches the
//! original. The watermark file is copied first: the daemon writes it only
//! after a flush, so the copied records are never older than the copied
//! watermark claims (copying it last could make a healthy journal look like
//! it lost acknowledged records). The checkpoint file is copied last: a
//! checkpoint is durable before the records it covers leave sled, so a
//! checkpoint copied after sled's files covers every record they lack
//! (copied first, an older one could leave a gap a checkpoint dropped
//! meanwhile). A copy taken while the daemon appends is a
//! snapshot of some instant, at worst missing the records of the last few
//! milliseconds; sled recovers the copy as it would after a crash. This is
//! the "reads a copy" of `reconstruct --dry-run` (docs/cli.md; the
//! alternative to asking the daemon): the
//! dry run needs the replayed state with every target's full parameters,
//! which the copy gives exactly, while the daemon's `GET /debug/journal`
//! (what `dump` asks, through `daemon.json`) is the dump document.
//!
//! A dir with no journal yet is read as an empty journal (the daemon would
//! create one), not as an unreadable one.

use std::fs;
use std::path::{Path, PathBuf};

use crate::journal::{
    CHECKPOINT_FILE, CHECKPOINT_TMP, Category, Journal, JournalConfig, JournalState, NotOpened,
    Opened,
};

use super::ReconstructError;
use super::edge::{JournalInput, error_chain};

/// The watermark file, copied first (see the module doc).
const WATERMARK_FILE: &str = "acked";

/// Where the journal's state came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom {
    /// the journal dir itself
    Dir,
    /// a copy, because a running daemon holds the lock
    Copy,
    /// there is no journal yet: an empty state
    NoJournalYet,
}

/// The journal as a dry run sees it.
#[derive(Debug, Clone)]
pub enum InspectedJournal {
    /// Replayed.
    Read {
        /// the replayed state
        state: JournalState,
        /// where from
        from: ReadFrom,
        /// replay stopped at a bad record: the daemon would quarantine from there
        corruption: Option<String>,
    },
    /// It cannot be opened: the daemon would move it aside and rebuild from
    /// the host alone.
    Unreadable {
        /// why (the error and its causes)
        reason: String,
    },
}

impl InspectedJournal {
    /// The merge's journal input.
    pub fn input(&self) -> JournalInput<'_> {
        match self {
            InspectedJournal::Read { state, .. } => JournalInput::Replayed(state),
            InspectedJournal::Unreadable { reason } => JournalInput::Unreadable { reason },
        }
    }

    /// A line for the report's `journal_note`, when there is something to say.
    pub fn note(&self, dir: &Path) -> Option<String> {
        match self {
            InspectedJournal::Read {
                from, corruption, ..
            } => {
                let from = match from {
                    ReadFrom::Dir => None,
                    ReadFrom::Copy => Some(format!(
                        "{} is held by a running volumed; read from a copy of it",
                        dir.display()
                    )),
                    ReadFrom::NoJournalYet => Some(format!(
                        "no journal in {} yet; the daemon would start an empty one",
                        dir.display()
                    )),
                };
                let corrupt = corruption.as_ref().map(|c| {
                    format!("replay stopped at a bad record ({c}); later records are ignored")
                });
                match (from, corrupt) {
                    (Some(a), Some(b)) => Some(format!("{a}; {b}")),
                    (a, b) => a.or(b),
                }
            }
            InspectedJournal::Unreadable { reason } => Some(reason.clone()),
        }
    }
}

/// Opens the journal in `dir` without changing its records; falls back to
/// a copy when the daemon holds it.
pub fn inspect_journal(dir: &Path, boot_id: &str) -> InspectedJournal {
    // the journal's holder is not asked: a copy of its files is read
    let cfg = JournalConfig::inspect(dir, boot_id);
    match Journal::open_or_ask(&cfg, || read_copy(dir, boot_id).map(Some)) {
        Ok(Opened::Here(here)) => {
            let (journal, replay) = *here;
            read_from(replayed(journal, replay), ReadFrom::Dir)
        }
        Ok(Opened::Holder(copy)) => read_from(copy, ReadFrom::Copy),
        Err(NotOpened::Open(source)) if source.category() == Category::NotFound => {
            InspectedJournal::Read {
                state: JournalState::default(),
                from: ReadFrom::NoJournalYet,
                corruption: None,
            }
        }
        Err(NotOpened::Open(source)) => InspectedJournal::Unreadable {
            reason: error_chain(&ReconstructError::OpenJournal {
                path: dir.to_owned(),
                source: Box::new(source),
            }),
        },
        Err(NotOpened::Held(Some(e))) => InspectedJournal::Unreadable {
            reason: error_chain(&e),
        },
        Err(NotOpened::Held(None)) => InspectedJournal::Unreadable {
            reason: format!("journal {} is held and no copy was read", dir.display()),
        },
    }
}

/// The state an open journal implies, with where its replay stopped.
fn replayed(journal: Journal, replay: crate::journal::Replay) -> Read {
    let corruption = replay
        .corruption
        .map(|c| format!("seq {}: {}", c.seq, c.reason));
    (journal.into_state(), corruption)
}

type Read = (JournalState, Option<String>);

fn read_from((state, corruption): Read, from: ReadFrom) -> InspectedJournal {
    InspectedJournal::Read {
        state,
        from,
        corruption,
    }
}

fn open_replay(dir: &Path, boot_id: &str) -> Result<Read, ReconstructError> {
    let (journal, replay) =
        Journal::open(&JournalConfig::inspect(dir, boot_id)).map_err(|source| {
            ReconstructError::OpenJournal {
                path: dir.to_owned(),
                source: Box::new(source),
            }
        })?;
    Ok(replayed(journal, replay))
}

/// Copies the journal into a temp dir (removed afterwards) and replays it.
fn read_copy(dir: &Path, boot_id: &str) -> Result<Read, ReconstructError> {
    let tmp = tempfile::Builder::new()
        .prefix("volumed-dry-run-")
        .tempdir()
        .map_err(|source| ReconstructError::CopyJournal {
            from: dir.to_owned(),
            to: std::env::temp_dir(),
            source,
        })?;
    let copy = tmp.path().join("journal");
    copy_journal(dir, &copy)?;
    tracing::info!(
        journal = %dir.display(),
        copy = %copy.display(),
        "the journal is held by a running volumed; reading a copy"
    );
    open_replay(&copy, boot_id)
}

/// Copies `from` to `to`: the watermark first, then everything else,
/// recursively, then the checkpoint (see the module doc); symlinks are not
/// followed (sled makes none). A checkpoint being written is not copied.
pub fn copy_journal(from: &Path, to: &Path) -> Result<(), ReconstructError> {
    create_dir(to)?;
    let if_file = |name: &str| -> Result<(), ReconstructError> {
        let src = from.join(name);
        match fs::symlink_metadata(&src).is_ok_and(|m| m.is_file()) {
            true => copy_file(&src, &to.join(name)),
            false => Ok(()),
        }
    };
    if_file(WATERMARK_FILE)?;
    copy_tree(from, to, true)?;
    if_file(CHECKPOINT_FILE)
}

fn copy_tree(from: &Path, to: &Path, top: bool) -> Result<(), ReconstructError> {
    let err = |from: &Path, to: &Path| {
        let (from, to) = (from.to_owned(), to.to_owned());
        move |source| ReconstructError::CopyJournal { from, to, source }
    };
    for entry in fs::read_dir(from).map_err(err(from, to))? {
        let entry = entry.map_err(err(from, to))?;
        let name = entry.file_name();
        if top
            && [WATERMARK_FILE, CHECKPOINT_FILE, CHECKPOINT_TMP].contains(&&*name.to_string_lossy())
        {
            continue;
        }
        let (src, dst): (PathBuf, PathBuf) = (entry.path(), to.join(&name));
        let kind = entry.file_type().map_err(err(&src, &dst))?;
        if kind.is_dir() {
            create_dir(&dst)?;
            copy_tree(&src, &dst, false)?;
        } else if kind.is_file() {
            copy_file(&src, &dst)?;
        }
    }
    Ok(())
}

fn create_dir(dir: &Path) -> Result<(), ReconstructError> {
    fs::create_dir_all(dir).map_err(|source| ReconstructError::CopyJournal {
        from: dir.to_owned(),
        to: dir.to_owned(),
        source,
    })
}

fn copy_file(from: &Path, to: &Path) -> Result<(), ReconstructError> {
    fs::copy(from, to)
        .map(drop)
        .map_err(|source| ReconstructError::CopyJournal {
            from: from.to_owned(),
            to: to.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{Body, Journal, JournalConfig, OpResult};
    use crate::model::{
        Operation, PluginName, PodUid, Steps, TargetKind, TargetParams, TargetRef, UniqueVolumeName,
    };

    const BOOT: &str = "boot-a";

    fn params() -> TargetParams {
        let pod = PodUid::new("p1").unwrap();
        TargetParams::at(
            UniqueVolumeName::per_pod(PluginName::EmptyDir, &pod, "cache"),
            PluginName::EmptyDir,
            "cache".into(),
            TargetRef::Pod(pod),
            TargetKind::Dir,
            Some("/r/pods/p1/volumes/kubernetes.io~empty-dir/cache".into()),
        )
    }

    #[test]
    fn no_journal_yet_reads_as_an_empty_journal() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("none");
        let seen = inspect_journal(&dir, BOOT);
        assert!(matches!(
            &seen,
            InspectedJournal::Read { state, from: ReadFrom::NoJournalYet, .. } if state.is_empty()
        ));
        assert_eq!(seen.input().as_str(), "on");
        assert!(!dir.exists(), "inspection created nothing");
    }

    #[test]
    fn a_copy_opens_while_the_original_is_held() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("journal");
        let (held, _) = Journal::open(&JournalConfig::new(&dir, "n", BOOT)).unwrap();
        let intent_seq = held
            .append_record(Body::Intent {
                op: Operation::SetUp,
                steps: Steps::Multi,
                target: params().into(),
            })
            .unwrap();
        held.append_record(Body::Outcome {
            intent_seq,
            op: Operation::SetUp,
            result: OpResult::Success,
            observed: None,
        })
        .unwrap();
        let seen = inspect_journal(&dir, BOOT);
        let InspectedJournal::Read { state, from, .. } = &seen else {
            panic!("unreadable: {seen:?}");
        };
        assert_eq!(*from, ReadFrom::Copy);
        assert_eq!(state.len(), 1);
        assert!(seen.note(&dir).unwrap().contains("read from a copy"));
        // Still held: our copy took no lock on the original.
        assert!(matches!(
            Journal::open(&JournalConfig::inspect(&dir, BOOT)),
            Err(e) if e.category() == Category::Busy
        ));
        drop(held);
    }
}
