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
    /// a write or flush failed: nothing that needs a durable record goes
    /// on until [`Journal::recover`](super::Journal::recover) writes again
    #[error("journal {path} cannot be written ({reason}); no operation starts until it can")]
    Flush {
        /// the dir
        path: PathBuf,
        /// the cause
        reason: String,
    },
    /// the host refused the journal's files (no space, a read-only or
    /// failing disk, no descriptors): nothing was moved aside or dropped,
    /// the journal is as it was for the next open
    #[error("journal {path} cannot be opened: {step}: {cause}; nothing was moved aside or lost")]
    Unavailable {
        /// the dir
        path: PathBuf,
        /// what the open was doing
        step: String,
        /// the host's error (printed inline, once: not a `source`)
        cause: std::io::Error,
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
    /// an I/O error: the journal is intact, the host refused a write or
    /// an open ([`environmental`]), or a flush failed (recoverable)
    Io,
}

/// Whether `e` is the host refusing (no space or quota, a read-only or
/// failing disk, no permission, no descriptors or memory): an error that
/// says nothing about the journal's bytes, so it never moves the journal
/// aside. Errors without an errno (a short read, invalid data) are the
/// file's content and are judged as damage by the caller.
pub fn environmental(e: &std::io::Error) -> bool {
    use nix::errno::Errno;
    let Some(n) = e.raw_os_error() else {
        return false;
    };
    matches!(
        Errno::from_raw(n),
        Errno::ENOSPC
            | Errno::EDQUOT
            | Errno::EIO
            | Errno::EROFS
            | Errno::EACCES
            | Errno::EPERM
            | Errno::EMFILE
            | Errno::ENFILE
            | Errno::ENOMEM
    )
}

/// The errno's name (`ENOSPC`) of an I/O error, `other` without one: the
/// label of `volumed_journal_write_errors_total`.
pub fn errno_name(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => format!("{:?}", nix::errno::Errno::from_raw(n)),
        None => "other".to_owned(),
    }
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
