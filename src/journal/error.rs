//! The journal's errors, by step, and the categories recovery branches on.

use std::path::PathBuf;

/// What went wrong, by step. Callers branch on [`JournalError::category`].
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// creating the journal dir failed
    #[error("create journal dir {path}: {cause}")]
    CreateDir {
        /// the dir
        path: PathBuf,
        /// the cause (printed inline, once: not a `source`)
        cause: std::io::Error,
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
    #[error("move corrupt journal {from} aside to {to}: {cause}")]
    MoveAside {
        /// the journal dir
        from: PathBuf,
        /// the destination
        to: PathBuf,
        /// the cause (printed inline, once: not a `source`)
        cause: std::io::Error,
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
    #[error("write {what} to journal {path}: {cause}")]
    Write {
        /// what was written
        what: &'static str,
        /// the dir
        path: PathBuf,
        /// the cause (printed inline, once: not a `source`)
        cause: sled::Error,
    },
    /// sled's log file could not be opened, or the journal dir synced
    #[error("make journal file {path} durable: {cause}")]
    Durable {
        /// the file or dir
        path: PathBuf,
        /// the cause (printed inline, once: not a `source`)
        cause: std::io::Error,
    },
    /// the watermark file could not be opened or written
    #[error("watermark {path}: {cause}")]
    Watermark {
        /// the file
        path: PathBuf,
        /// the cause (printed inline, once: not a `source`)
        cause: std::io::Error,
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

/// Whether `e` is the host refusing (no space or quota, a read-only or
/// failing disk, no permission, no descriptors or memory): an error that
/// says nothing about the journal's bytes, so it never moves the journal
/// aside. Errors without an errno (a short read, invalid data) are the
/// file's content and are judged as damage by the caller.
pub fn environmental(e: &std::io::Error) -> bool {
    use nix::errno::Errno;
    matches!(
        errno(e),
        Some(
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
    )
}

/// The errno's name (`ENOSPC`) of an I/O error, `other` without one: the
/// label of `volumed_journal_write_errors_total`.
pub fn errno_name(e: &std::io::Error) -> String {
    errno(e).map_or_else(|| "other".to_owned(), |n| format!("{n:?}"))
}

/// The errno of `e`. sled 0.34 hands out copies of an error it keeps (a
/// failed flush, returned by every later call) made from the original's
/// kind and `Debug` text, without the errno: it is read back from that
/// text (`Os { code: 28, .. }`), else from the kind.
fn errno(e: &std::io::Error) -> Option<nix::errno::Errno> {
    use nix::errno::Errno;
    use std::io::ErrorKind;
    if let Some(n) = e.raw_os_error() {
        return Some(Errno::from_raw(n));
    }
    if let Some(n) = errno_in_text(&e.to_string()) {
        return Some(n);
    }
    Some(match e.kind() {
        ErrorKind::StorageFull => Errno::ENOSPC,
        ErrorKind::QuotaExceeded => Errno::EDQUOT,
        ErrorKind::ReadOnlyFilesystem => Errno::EROFS,
        ErrorKind::PermissionDenied => Errno::EACCES,
        ErrorKind::OutOfMemory => Errno::ENOMEM,
        _ => return None,
    })
}

/// The errno an error's text carries, as `io::Error` writes it: its `Debug`
/// (`Os { code: 28, .. }`) or its `Display` (`... (os error 28)`). For
/// errors that reach the journal only as text (sled's copies, a
/// migration step's error).
pub(super) fn errno_in_text(text: &str) -> Option<nix::errno::Errno> {
    ["Os { code: ", "(os error "].iter().find_map(|marker| {
        let at = text.find(marker)? + marker.len();
        let digits: String = text[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok().map(nix::errno::Errno::from_raw)
    })
}

/// An error known only as text, when its errno is the host refusing: as
/// an `io::Error` for [`JournalError::Unavailable`].
pub(super) fn environmental_text(text: &str) -> Option<std::io::Error> {
    let e = std::io::Error::from_raw_os_error(errno_in_text(text)? as i32);
    environmental(&e).then_some(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error, ErrorKind};

    /// The whole chain as `{:#}` prints it (each error, then its sources).
    fn chain(e: &dyn std::error::Error) -> String {
        let mut out = e.to_string();
        let mut next = e.source();
        while let Some(s) = next {
            out.push_str(": ");
            out.push_str(&s.to_string());
            next = s.source();
        }
        out
    }

    /// Each cause is printed once in a chain: a cause shown inline is not
    /// also a `source`.
    #[test]
    fn a_cause_is_printed_once_in_the_chain() {
        let enospc = || Error::from_raw_os_error(nix::errno::Errno::ENOSPC as i32);
        let errors = [
            JournalError::CreateDir {
                path: "/j".into(),
                cause: enospc(),
            },
            JournalError::Durable {
                path: "/j/db".into(),
                cause: enospc(),
            },
            JournalError::Watermark {
                path: "/j/acked".into(),
                cause: enospc(),
            },
            JournalError::Unavailable {
                path: "/j".into(),
                step: "sled cannot open its files".into(),
                cause: enospc(),
            },
        ];
        for e in &errors {
            let text = chain(e);
            assert_eq!(text.matches("No space left").count(), 1, "{text}");
        }
    }

    /// sled's copy of a kept error loses the errno; it is still judged.
    #[test]
    fn the_host_is_told_from_the_journal_with_or_without_an_errno() {
        let enospc = Error::from_raw_os_error(nix::errno::Errno::ENOSPC as i32);
        let sleds_copy = Error::new(enospc.kind(), format!("{enospc:?}"));
        assert_eq!(sleds_copy.raw_os_error(), None);
        let eio = Error::from_raw_os_error(nix::errno::Errno::EIO as i32);
        let eio_copy = Error::new(eio.kind(), format!("{eio:?}"));
        for (e, name) in [
            (&enospc, "ENOSPC"),
            (&sleds_copy, "ENOSPC"),
            (&eio_copy, "EIO"),
            (&Error::new(ErrorKind::ReadOnlyFilesystem, "ro"), "EROFS"),
        ] {
            assert!(environmental(e), "{e:?}");
            assert_eq!(errno_name(e), name);
        }
        let migration = "v3_to_v4 checkpoint: IO error: No space left on device (os error 28)";
        assert_eq!(
            environmental_text(migration).and_then(|e| e.raw_os_error()),
            Some(nix::errno::Errno::ENOSPC as i32)
        );
        assert!(environmental_text("checkpoint: bad CRC").is_none());
        for e in [
            Error::new(ErrorKind::UnexpectedEof, "failed to fill whole buffer"),
            Error::new(ErrorKind::InvalidData, "bad"),
            Error::from_raw_os_error(nix::errno::Errno::ENOENT as i32),
        ] {
            assert!(!environmental(&e), "{e:?}");
        }
    }
}
