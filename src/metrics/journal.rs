//! `volumed_journal_damage{kind}`: what the journal keeps aside, set once
//! the journal is open (a gauge, because it describes what is on disk now,
//! not events: it stays non-zero across restarts until an operator removes
//! the moved-aside journals). `kind`: `moved_aside` (journals moved aside
//! beside this one, `<dir>.corrupt-*`), `quarantined` (records in the
//! quarantine tree), `lost` (records acknowledged before a reboot that sled
//! no longer returned at this start). The same report is `journal_damage`
//! in `/debug/state` and `dump`. Every series exists at zero from the start,
//! so an alert on `> 0` needs no `absent()`.

use prometheus::{IntGaugeVec, Opts, Registry};

use super::{MetricsError, register};
use crate::journal::Damage;

const NAME: &str = "volumed_journal_damage";
const KINDS: [&str; 3] = ["moved_aside", "quarantined", "lost"];

/// The journal's damage gauge.
#[derive(Debug, Clone)]
pub struct JournalMetrics {
    /// `volumed_journal_damage{kind}`
    pub damage: IntGaugeVec,
}

impl JournalMetrics {
    pub(super) fn new(r: &Registry) -> Result<Self, MetricsError> {
        let damage = register(r, NAME, || {
            IntGaugeVec::new(
                Opts::new(
                    NAME,
                    "What the journal keeps aside: journals moved aside, quarantined records, records lost across a reboot.",
                ),
                &["kind"],
            )
        })?;
        for k in KINDS {
            damage.with_label_values(&[k]);
        }
        Ok(Self { damage })
    }

    /// Sets the gauge from what the journal's open found.
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
