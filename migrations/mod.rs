//! Journal schema migrations: one pure step per version, applied in order
//! when a journal written by an older build is opened.
//!
//! Format v1 is the first released format (documented in
//! `docs/journal-format.md` and `migrations/README.md`); no step exists yet.
//! To change the format: bump `journal::SCHEMA_VERSION`, add a `Step` from
//! the old version whose `run` rewrites the old trees into the new layout
//! (re-encoding every value; it must be idempotent, since a crash can cut it
//! short and the next open runs it again), keep a journal written by the old
//! build under `fixtures/journal/v<old>/`, and add a test that opens it.

/// One migration step.
#[derive(Debug)]
pub struct Step {
    /// The schema version it reads.
    pub from: u32,
    /// The schema version it writes.
    pub to: u32,
    /// Rewrites the database; must be idempotent.
    pub run: fn(&sled::Db) -> Result<(), String>,
}

/// Every step, in order. Empty while v1 is the only format.
pub const STEPS: &[Step] = &[];

/// The chain of steps that leads from `from` to `to`, or why there is none.
pub fn plan(steps: &[Step], from: u32, to: u32) -> Result<Vec<&Step>, String> {
    let mut at = from;
    let mut chain = Vec::new();
    while at < to {
        let step = steps
            .iter()
            .find(|s| s.from == at)
            .ok_or_else(|| format!("no migration step from schema {at}"))?;
        if step.to <= at {
            return Err(format!("migration step from {at} does not advance"));
        }
        chain.push(step);
        at = step.to;
    }
    if at != to {
        return Err(format!("migrations overshoot schema {to} (reach {at})"));
    }
    Ok(chain)
}

/// Runs the steps from `from` to `to`, then records the new version in meta.
pub fn migrate(db: &sled::Db, from: u32, to: u32) -> Result<(), String> {
    for step in plan(STEPS, from, to)? {
        (step.run)(db)?;
        let meta = db.open_tree("meta").map_err(|e| e.to_string())?;
        meta.insert("schema_version", step.to.to_le_bytes().to_vec())
            .map_err(|e| e.to_string())?;
        db.flush().map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(_: &sled::Db) -> Result<(), String> {
        Ok(())
    }

    #[test]
    fn plans_chain_and_refuse_gaps() {
        let steps = [
            Step {
                from: 1,
                to: 2,
                run: ok,
            },
            Step {
                from: 2,
                to: 3,
                run: ok,
            },
        ];
        let chain: Vec<_> = plan(&steps, 1, 3).unwrap().iter().map(|s| s.to).collect();
        assert_eq!(chain, vec![2, 3]);
        assert!(plan(&steps, 1, 1).unwrap().is_empty());
        assert!(plan(&steps, 0, 3).unwrap_err().contains("from schema 0"));
        assert!(plan(STEPS, 1, 1).unwrap().is_empty());
    }
}
