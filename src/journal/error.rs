//! The journal's errors, by step, and the categories recovery branches on.

use std::path::PathBuf;

/// What went wrong, by step. Callers branch on [`JournalError::category`].
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// creating the journal dir failed
    #[error("create journal dir {path}: {source}")]
    CreateDir {
        /// the dir
        path: PathBuf,
        /// the cause
        source: std::io::Error,
    },
    /// there is no journal in the dir
    #[error("no journal in {path}")]
    NotFound {
        /// the dir
        path: PathBuf,
    },
    /// another process (a running daemon) holds sled's lock
    #[error("journal {path} is locked by another process (is the daemon running?)")]
    Locked {
        /// the dir
        path: PathBuf,
    },
    /// the journal cannot be trusted; it was moved aside if `moved_to` is set
    #[error("journal {path} is corrupt: {reason}{}", moved(.moved_to))]
    Corrupt {
        /// the dir
        path: PathBuf,
        /// what was wrong
        reason: String,
        /// where it was moved
        moved_to: Option<PathBuf>,
    },
    /// the journal was written by a newer build
    #[error("journal {path} has schema version {found}, newer than this build reads ({supported}){}", moved(.moved_to))]
    NewerSchema {
        /// the dir
        path: PathBuf,
        /// version found
        found: u32,
        /// version this build reads
        supported: u32,
        /// where it was moved
        moved_to: Option<PathBuf>,
    },
    /// moving a corrupt journal aside failed
    #[error("move corrupt journal {from} aside to {to}: {source}")]
    MoveAside {
        /// the journal dir
        from: PathBuf,
        /// the destination
        to: PathBuf,
        /// the cause
        source: std::io::Error,
    },
    /// a migration step failed
    #[error("migrate journal {path} from schema {from}: {reason}")]
    Migrate {
        /// the dir
        path: PathBuf,
        /// version migrated from
        from: u32,
        /// what failed
        reason: String,
    },
    /// sled refused a write
    #[error("write {what} to journal {path}: {source}")]
    Write {
        /// what was written
        what: &'static str,
        /// the dir
        path: PathBuf,
        /// the cause
        source: sled::Error,
    },
    /// sled's log file could not be opened, or the journal dir synced
    #[error("make journal file {path} durable: {source}")]
    Durable {
        /// the file or dir
        path: PathBuf,
        /// the cause
        source: std::io::Error,
    },
    /// the watermark file could not be opened or written
    #[error("watermark {path}: {source}")]
    Watermark {
        /// the file
        path: PathBuf,
        /// the cause
        source: std::io::Error,
    },
    /// a flush failed; the journal accepts nothing more and the daemon must exit
    #[error("flush journal {path} failed, the journal is closed: {reason}")]
    Flush {
        /// the dir
        path: PathBuf,
        /// the cause
        reason: String,
    },
}

fn moved(to: &Option<PathBuf>) -> String {
    to.as_ref()
        .map(|p| format!("; moved aside to {}", p.display()))
        .unwrap_or_default()
}

/// Error categories recovery branches on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    /// the journal is damaged or unreadable: reconstruct from the host alone
    Corruption,
    /// the journal is in use by another process
    Busy,
    /// there is no journal
    NotFound,
    /// an I/O error; a failed flush is fatal
    Io,
}

impl JournalError {
    /// The category of this error.
    pub fn category(&self) -> Category {
        match self {
            JournalError::Corrupt { .. }
            | JournalError::NewerSchema { .. }
            | JournalError::Migrate { .. } => Category::Corruption,
            JournalError::Locked { .. } => Category::Busy,
            JournalError::NotFound { .. } => Category::NotFound,
            _ => Category::Io,
        }
    }
}
