//! The journal's figures on `/metrics`, read from the open journal when
//! `/metrics` is scraped (the journal keeps them as plain atomics and knows
//! nothing of prometheus): `volumed_journal_flushes_total`, the group
//! commits made (each one a `sync_file_range` of the log), and
//! `volumed_journal_durable_seq`, the highest record sequence number known
//! durable — its derivative is the records made durable per second.
//! Neither exists with `--journal off`.

use prometheus::{IntCounter, IntGauge};

use super::{MetricsError, Registrar, register};

const FLUSHES: &str = "volumed_journal_flushes_total";
const DURABLE_SEQ: &str = "volumed_journal_durable_seq";

/// The journal's series.
#[derive(Debug, Clone)]
pub struct JournalMetrics {
    flushes: IntCounter,
    durable_seq: IntGauge,
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
        Ok(Self {
            flushes,
            durable_seq,
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
}
