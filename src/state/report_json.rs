//! The JSON shapes `/debug/state` embeds from other modules' reports, kept
//! here so that the state's snapshot depends on nothing above it: the
//! journal's damage (`journal_damage`, also in `dump`) and a volume's health
//! condition (`health`, filled by the health monitor's report).

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

/// A volume's condition in `/debug/state` (docs/http.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthJson {
    /// abnormal or not
    pub abnormal: bool,
    /// CamelCase
    pub reason: String,
    /// for people
    pub message: String,
    /// RFC 3339: since when it is so
    pub since: String,
    /// `csi` or `native`
    pub source: String,
}
