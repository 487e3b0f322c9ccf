//! The core while the journal cannot be written (a full, read-only or
//! failing disk under it): no operation starts, since none may start
//! without a durable intent; operations in flight finish (their outcomes
//! wait in the journal's memory); every mounted volume stays. A recovery
//! (`JournalWork::Recover`) is tried at once, then with a backoff doubling
//! from [`RECOVER_FIRST`] to [`RECOVER_MAX`]; when one succeeds every kept
//! record is durable and the next pass starts what waited, with no restart.

use std::time::{Duration, Instant};

use super::{Core, Effect, JournalWork};

/// The first wait between recoveries of an unwritable journal.
pub(crate) const RECOVER_FIRST: Duration = Duration::from_millis(500);
/// The longest wait between them.
pub(crate) const RECOVER_MAX: Duration = Duration::from_secs(30);

/// The journal is unwritable: when the next recovery is due, and the wait
/// after it fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unwritable {
    /// the next recovery, once none is in flight
    pub retry_at: Instant,
    /// the wait after the next one fails (doubled each time, at most
    /// [`RECOVER_MAX`])
    pub backoff: Duration,
}

impl Core {
    /// Whether the journal is unwritable: nothing new starts.
    #[cfg(test)]
    pub(crate) fn journal_unwritable(&self) -> bool {
        self.unwritable.is_some()
    }

    /// The driver saw the journal unwritable (a failed flush, intent or
    /// outcome write): nothing starts from now on, a recovery is due at
    /// once, and the driver says so once.
    pub(super) fn watch_journal(&mut self, unwritable: bool, now: Instant, out: &mut Vec<Effect>) {
        if !self.cfg.journal || !unwritable || self.unwritable.is_some() {
            return;
        }
        self.unwritable = Some(Unwritable {
            retry_at: now,
            backoff: RECOVER_FIRST,
        });
        // the outcomes waiting for a flush wait for the recovery instead
        self.timers.flush_by = None;
        out.push(Effect::JournalWritable(false));
    }

    /// Asks for a recovery when one is due and none is in flight.
    pub(super) fn maybe_recover(&mut self, now: Instant, out: &mut Vec<Effect>) {
        let Some(u) = self.unwritable else {
            return;
        };
        if self.in_flight.recover || now < u.retry_at {
            return;
        }
        self.in_flight.recover = true;
        out.push(Effect::Journal(JournalWork::Recover));
    }

    /// A recovery ended: writable again (every kept record durable; a pass
    /// is due for what waited), or the next one after the backoff.
    pub(super) fn recovered(
        &mut self,
        r: Result<bool, String>,
        now: Instant,
        out: &mut Vec<Effect>,
    ) -> bool {
        self.in_flight.recover = false;
        match (r, self.unwritable.as_mut()) {
            (Ok(_), Some(_)) => {
                self.unwritable = None;
                // the recovery made every record appended so far durable
                self.timers.flush_by = None;
                out.push(Effect::JournalWritable(true));
                true
            }
            (Ok(_), None) => false,
            (Err(e), Some(u)) => {
                tracing::warn!(error = %e, retry_in = ?u.backoff, "the journal is still unwritable");
                u.retry_at = now + u.backoff;
                u.backoff = (u.backoff * 2).min(RECOVER_MAX);
                false
            }
            (Err(e), None) => {
                tracing::warn!(error = %e, "a journal recovery failed");
                false
            }
        }
    }
}
