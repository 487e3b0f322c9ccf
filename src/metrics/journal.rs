//! The journal's figures on `/metrics`. The journal keeps them as plain
//! atomics and knows nothing of prometheus:
//! - `volumed_journal_flushes_total`, the group commits made (each one a
//!   `sync_file_range` of the log), and `volumed_journal_durable_seq`, the
//!   highest record sequence number known durable — its derivative is the
//!   records made durable per second — both read when `/metrics` is
//!   scraped;
//! - `volumed_journal_damage{kind}`: what the journal keeps aside, set once
//!   the journal is open (a gauge, because it describes what is on disk
//!   now, not events: it stays non-zero across restarts until an operator
//!   removes the moved-aside journals). `kind`: `moved_aside` (journals
//!   moved aside beside this one, `<dir>.corrupt-*`), `quarantined`
//!   (records in the quarantine tree), `lost` (records acknowledged before
//!   a reboot that sled no longer returned at this start). The same report
//!   is `journal_damage` in `/debug/state` and `dump`. Every series exists
//!   at zero from the start, so an alert on `> 0` needs no `absent()`;
//! - `volumed_journal_writable`, 1 while the journal can be written, 0
//!   from a failed write or flush (a full, read-only or failing disk) until
//!   a recovery writes again (nothing starts meanwhile; `/readyz` is 503),
//!   and `volumed_journal_write_errors_total{errno}`, the failed writes and
//!   flushes by errno name (`ENOSPC`, `EROFS`, `EIO`, `other`), both read
//!   at scrape.
//!
//! None of them is exported with `--journal off` but the damage gauge (at
//! zero).

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};

use super::{MetricsError, Registrar, register};
use crate::journal::Damage;

const FLUSHES: &str = "volumed_journal_flushes_total";
const DURABLE_SEQ: &str = "volumed_journal_durable_seq";
const DAMAGE: &str = "volumed_journal_damage";
const WRITABLE: &str = "volumed_journal_writable";
const WRITE_ERRORS: &str = "volumed_journal_write_errors_total";
const KINDS: [&str; 3] = ["moved_aside", "quarantined", "lost"];

/// The journal's series.
#[derive(Debug, Clone)]
pub struct JournalMetrics {
    flushes: IntCounter,
    durable_seq: IntGauge,
    /// `volumed_journal_damage{kind}`
    pub damage: IntGaugeVec,
    writable: IntGauge,
    write_errors: IntCounterVec,
}

impl JournalMetrics {
    pub(super) fn new(r: &Registrar) -> Result<Self, MetricsError> {
        let flushes = register(r, FLUSHES, || {
            IntCounter::new(
                FLUSHES,
                "Journal group commits (flushes) since the daemon started.",
            )
        })?;
        let durable_seq = register(r, DURABLE_SEQ, || {
            IntGauge::new(
                DURABLE_SEQ,
                "The highest journal record sequence number known durable.",
            )
        })?;
        let damage = register(r, DAMAGE, || {
            IntGaugeVec::new(
                Opts::new(
                    DAMAGE,
                    "What the journal keeps aside: journals moved aside, quarantined records, records lost across a reboot.",
                ),
                &["kind"],
            )
        })?;
        for k in KINDS {
            damage.with_label_values(&[k]);
        }
        let writable = register(r, WRITABLE, || {
            IntGauge::new(
                WRITABLE,
                "1 while the journal can be written; 0 after a failed write until a recovery (nothing starts meanwhile).",
            )
        })?;
        // writable until a journal says otherwise (and with it off)
        writable.set(1);
        let write_errors = register(r, WRITE_ERRORS, || {
            IntCounterVec::new(
                Opts::new(
                    WRITE_ERRORS,
                    "Failed journal writes and flushes, by errno (ENOSPC, EROFS, EIO, other).",
                ),
                &["errno"],
            )
        })?;
        Ok(Self {
            flushes,
            durable_seq,
            damage,
            writable,
            write_errors,
        })
    }

    /// The journal's own totals now: `flushes` since it was opened (only
    /// grows), `durable_seq` its synced-through watermark.
    pub fn observe(&self, flushes: u64, durable_seq: u64) {
        let have = self.flushes.get();
        if flushes > have {
            self.flushes.inc_by(flushes - have);
        }
        self.durable_seq
            .set(i64::try_from(durable_seq).unwrap_or(i64::MAX));
    }

    /// The journal's write state now: whether it can be written, and its
    /// failed writes by errno since it was opened (each only grows).
    pub fn observe_writes(&self, writable: bool, errors: &[(String, u64)]) {
        self.writable.set(i64::from(writable));
        for (errno, n) in errors {
            let c = self.write_errors.with_label_values(&[errno.as_str()]);
            let have = c.get();
            if *n > have {
                c.inc_by(n - have);
            }
        }
    }

    /// Sets the damage gauge from what the journal's open found.
    pub fn set_damage(&self, d: &Damage) {
        let lost = d
            .lost_tail
            .map_or(0, |(acked, got)| acked.saturating_sub(got));
        let n = |x: usize| i64::try_from(x).unwrap_or(i64::MAX);
        for (kind, v) in KINDS.into_iter().zip([
            n(d.moved_aside.len()),
            n(d.quarantined.len()),
            i64::try_from(lost).unwrap_or(i64::MAX),
        ]) {
            self.damage.with_label_values(&[kind]).set(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Metrics, gather_text};

    #[test]
    fn totals_become_a_counter_and_a_gauge() {
        let m = Metrics::new().unwrap();
        m.journal.observe(3, 40);
        m.journal.observe(5, 52);
        m.journal.observe(5, 52);
        let text = gather_text(&m);
        assert!(text.contains("volumed_journal_flushes_total 5"), "{text}");
        assert!(text.contains("volumed_journal_durable_seq 52"), "{text}");
    }

    #[test]
    fn write_state_becomes_a_gauge_and_errors_a_counter_by_errno() {
        let m = Metrics::new().unwrap();
        m.journal.observe_writes(true, &[]);
        assert!(gather_text(&m).contains("volumed_journal_writable 1"));
        let errors = [("ENOSPC".to_owned(), 3), ("EIO".to_owned(), 1)];
        m.journal.observe_writes(false, &errors);
        m.journal.observe_writes(false, &errors);
        let text = gather_text(&m);
        assert!(text.contains("volumed_journal_writable 0"), "{text}");
        assert!(
            text.contains("volumed_journal_write_errors_total{errno=\"ENOSPC\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("volumed_journal_write_errors_total{errno=\"EIO\"} 1"),
            "{text}"
        );
    }
}
