//! The journal's damage report as JSON: `journal_damage` in `dump` (and
//! `/debug/journal`) and in `/debug/state`, the same shape in both. Absent
//! when there is nothing to report (docs/dump-json.md: fields are added,
//! never renamed).

use std::fmt::Write as _;

pub use crate::state::{DamageJson, LostTailJson, MovedAsideJson};

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
