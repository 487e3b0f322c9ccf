//! A journal another process holds: the one wait policy. sled takes a file
//! lock; a running daemon holds it for good, an inspection (`dump`,
//! `reconstruct --dry-run`) for a moment, and this process's own dropped
//! handles until sled's background thread ends. Every open goes through
//! [`open_sled`], which waits up to the config's `lock_wait` for the lock;
//! an inspection that finds it held for good asks the holder instead
//! ([`Journal::open_or_ask`]), within the same deadline.

use std::path::Path;
use std::time::{Duration, Instant};

use super::contain::{Failed, contain};
use super::{Category, Journal, JournalConfig, JournalError, Replay};

/// How often a held lock is tried again.
const RETRY: Duration = Duration::from_millis(20);

/// Opens sled in `dir`, waiting up to `lock_wait` for a lock another
/// handle (another process, or this one's dropped handles) still holds.
/// The daemon (`tidy`) first removes the snapshots sled left unfinished
/// (`recover::remove_unfinished_snapshots`).
pub(super) fn open_sled(
    dir: &Path,
    cache_capacity: u64,
    lock_wait: Duration,
    tidy: bool,
) -> Result<sled::Db, Failed> {
    if tidy {
        super::recover::remove_unfinished_snapshots(dir);
    }
    let try_open = || {
        contain(|| {
            sled::Config::new()
                .path(dir)
                .cache_capacity(cache_capacity)
                .open()
        })
    };
    let deadline = Instant::now() + lock_wait;
    let mut opened = try_open();
    while matches!(&opened, Err(e) if e.is_locked()) && Instant::now() < deadline {
        std::thread::sleep(RETRY);
        opened = try_open();
    }
    opened
}

/// Waits up to `lock_wait` for sled's lock on `<dir>/db` to be free (an
/// `flock`, as sled takes it), and lets go of it at once: `false` when
/// another handle still holds it. A journal with no log yet is free. A
/// probe, not a claim: sled takes the lock itself ([`open_sled`]), so a
/// holder that comes in between is still refused there.
pub(super) fn wait_for_lock(dir: &Path, lock_wait: Duration) -> bool {
    let Ok(log) = std::fs::File::open(dir.join("db")) else {
        return true;
    };
    let deadline = Instant::now() + lock_wait;
    loop {
        match log.try_lock() {
            // let go of when `log` is dropped, on return
            Ok(()) => return true,
            Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(RETRY);
            }
            Err(std::fs::TryLockError::WouldBlock) => return false,
            // a lock that cannot be asked about is left to sled's open
            Err(std::fs::TryLockError::Error(_)) => return true,
        }
    }
}

/// What [`Journal::open_or_ask`] read.
#[derive(Debug)]
pub enum Opened<T> {
    /// nobody held the journal: opened here (boxed: the two are large, an
    /// answer may be small)
    Here(Box<(Journal, Replay)>),
    /// the process holding it answered
    Holder(T),
}

/// Why [`Journal::open_or_ask`] read nothing.
#[derive(Debug)]
pub enum NotOpened<E> {
    /// the journal could not be opened (not for its lock)
    Open(JournalError),
    /// it stayed held, and its holder answered with this error, or never
    /// answered before the deadline (`None`)
    Held(Option<E>),
}

impl Journal {
    /// Opens the journal (an inspection: `cfg` from
    /// [`JournalConfig::inspect`]); while another process holds it, asks
    /// `holder`: `Ok(Some)` is its answer, `Ok(None)` that nobody answers
    /// for the lock yet (a daemon between taking it and saying where it
    /// listens, another inspection for a moment), and the journal is tried
    /// again, then the holder, until `cfg.lock_wait` has passed.
    pub fn open_or_ask<T, E>(
        cfg: &JournalConfig,
        mut holder: impl FnMut() -> Result<Option<T>, E>,
    ) -> Result<Opened<T>, NotOpened<E>> {
        let deadline = Instant::now() + cfg.lock_wait;
        // one try per round: the deadline is the round's, not sled's
        let once = JournalConfig {
            lock_wait: Duration::ZERO,
            ..cfg.clone()
        };
        loop {
            match Journal::open(&once) {
                Ok(opened) => return Ok(Opened::Here(Box::new(opened))),
                Err(e) if e.category() == Category::Busy => match holder() {
                    Ok(Some(answer)) => return Ok(Opened::Holder(answer)),
                    Ok(None) if Instant::now() < deadline => std::thread::sleep(RETRY),
                    Ok(None) => return Err(NotOpened::Held(None)),
                    Err(e) => return Err(NotOpened::Held(Some(e))),
                },
                Err(e) => return Err(NotOpened::Open(e)),
            }
        }
    }
}
