//! sled calls made safe to fail: sled 0.34 has assertions on paths that
//! read its files, so damage could surface as a panic rather than an
//! error, and a journal that cannot be read must be moved aside, not crash
//! the daemon at every start. The failure keeps sled's typed error, so an
//! open can tell the host refusing a file ([`Failed::host_error`]) from
//! damage.

use std::panic::{AssertUnwindSafe, catch_unwind};

use super::error::environmental;

/// How a contained sled call failed.
#[derive(Debug)]
pub(super) enum Failed {
    /// sled returned an error
    Sled(sled::Error),
    /// sled panicked (an assertion on what it read)
    Panicked(String),
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Sled(e) => write!(f, "{e}"),
            Failed::Panicked(p) => write!(f, "sled panicked: {p}"),
        }
    }
}

impl From<Failed> for String {
    fn from(f: Failed) -> String {
        f.to_string()
    }
}

impl Failed {
    /// The host's error when the host refused a file (no space, a
    /// read-only or failing disk, ...): never evidence of damage.
    pub(super) fn host_error(&self) -> Option<&std::io::Error> {
        match self {
            Failed::Sled(sled::Error::Io(e)) if environmental(e) => Some(e),
            _ => None,
        }
    }

    /// Another process holds sled's file lock.
    pub(super) fn is_locked(&self) -> bool {
        self.to_string().contains("could not acquire lock")
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".to_owned())
}

/// Runs a sled call, turning a panic into a [`Failed::Panicked`].
pub(super) fn contain<T>(f: impl FnOnce() -> Result<T, sled::Error>) -> Result<T, Failed> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Failed::Sled(e)),
        Err(p) => Err(Failed::Panicked(panic_text(p.as_ref()))),
    }
}
