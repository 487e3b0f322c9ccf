//! The reconstruct module's one error enum: applying decisions to the ASW
//! (`apply`), reading the host and writing the decisions (`edge`), and
//! reading a journal for a dry run (`inspect`).

use std::path::PathBuf;

use crate::host::HostError;
use crate::journal::{JournalError, TargetKey};
use crate::state::StateError;

/// What failed, by step. Each variant carries the path or target it failed
/// on and the source error.
#[derive(Debug, thiserror::Error)]
pub enum ReconstructError {
    /// a decision whose parameters name no path for its target
    #[error("apply decision for {} ({:?}): no target path in its parameters", .key.volume, .key.target)]
    NoTargetPath {
        /// the target
        key: TargetKey,
    },
    /// the ASW refused a mark
    #[error("apply decision to the actual state of world")]
    Asw(#[from] StateError),
    /// reading the mount table (live or a replayed capture) failed
    #[error("read mount table {path}")]
    ReadMountTable {
        /// the mountinfo file
        path: PathBuf,
        /// the cause
        #[source]
        source: HostError,
    },
    /// appending a `Reconstructed` record failed; records before it are in
    /// the journal, the rest are not
    #[error("append reconstructed record for {} ({:?}) to journal {path}", .key.volume, .key.target)]
    AppendRecord {
        /// the journal dir
        path: PathBuf,
        /// the target whose record failed
        key: Box<TargetKey>,
        /// the cause (boxed: journal errors are large)
        #[source]
        source: Box<JournalError>,
    },
    /// appending one batch of `Reconstructed` records failed; none of them
    /// is in the journal (a batch is inserted whole or not at all), or, when
    /// the flush failed, the journal is closed and the daemon must exit
    #[error("append {count} reconstructed records to journal {path}")]
    AppendRecords {
        /// the journal dir
        path: PathBuf,
        /// how many records the batch held
        count: usize,
        /// the cause (boxed: journal errors are large)
        #[source]
        source: Box<JournalError>,
    },
    /// copying a locked journal for a dry run failed
    #[error("copy journal {from} to {to}")]
    CopyJournal {
        /// the file or dir being copied
        from: PathBuf,
        /// where to
        to: PathBuf,
        /// the cause
        #[source]
        source: std::io::Error,
    },
    /// opening the journal (or its copy) for a dry run failed
    #[error("open journal {path} for inspection")]
    OpenJournal {
        /// the journal dir (or the copy's)
        path: PathBuf,
        /// the cause (boxed: journal errors are large)
        #[source]
        source: Box<JournalError>,
    },
}
