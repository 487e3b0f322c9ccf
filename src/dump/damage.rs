//! The journal's damage report as JSON: `journal_damage` in `dump` (and
//! `/debug/journal`) and in `/debug/state`, the same shape in both. Absent
//! when there is nothing to report (docs/dump-json.md: fields are added,
//! never renamed).

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::journal::Damage;

/// What the journal keeps aside: journals moved aside beside it, records
/// in its quarantine tree, a tail lost across a reboot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DamageJson {
    /// journals moved aside beside this one (`<dir>.corrupt-*`), never deleted
    pub moved_aside: Vec<MovedAsideJson>,
    /// sequence numbers of the records kept in the `quarantine` tree
    pub quarantined: Vec<u64>,
    /// after a reboot: the acknowledged tail sled no longer returned
    pub lost_tail: Option<LostTailJson>,
}

/// One journal moved aside.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MovedAsideJson {
    /// where it is now
    pub path: String,
    /// why it was moved (its note), `null` when unknown
    pub reason: Option<String>,
}

/// A tail lost across a reboot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostTailJson {
    /// the last record acknowledged before the reboot
    pub acked_through: u64,
    /// the last record sled recovered
    pub recovered_through: u64,
}

impl DamageJson {
    /// The report of `d`, `None` when there is nothing in it.
    pub fn of(d: &Damage) -> Option<Self> {
        (!d.is_empty()).then(|| DamageJson {
            moved_aside: d
                .moved_aside
                .iter()
                .map(|m| MovedAsideJson {
                    path: m.path.display().to_string(),
                    reason: m.reason.clone(),
                })
                .collect(),
            quarantined: d.quarantined.clone(),
            lost_tail: d.lost_tail.map(|(acked, recovered)| LostTailJson {
                acked_through: acked,
                recovered_through: recovered,
            }),
        })
    }
}

/// The table lines of `dump`'s default format.
pub(super) fn render(d: Option<&DamageJson>, out: &mut String) {
    let Some(d) = d else { return };
    for m in &d.moved_aside {
        let why = m.reason.as_deref().unwrap_or("reason unknown");
        let _ = writeln!(out, "MOVED ASIDE: {} ({why})", m.path);
    }
    if let (Some(first), Some(last)) = (d.quarantined.first(), d.quarantined.last()) {
        let _ = writeln!(
            out,
            "QUARANTINED: {} records, seq {first}..={last} (kept in the quarantine tree)",
            d.quarantined.len()
        );
    }
    if let Some(l) = &d.lost_tail {
        let _ = writeln!(
            out,
            "LOST ACROSS A REBOOT: records {}..={} were acknowledged, sled recovered through {}",
            l.recovered_through + 1,
            l.acked_through,
            l.recovered_through
        );
    }
}
