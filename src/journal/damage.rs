//! What the journal keeps of damage it could not read, for `/debug/state`,
//! `dump` and the `volumed_journal_damage_total` metric: the journals moved
//! aside beside this one (`<dir>.corrupt-*`, each with the note saying why),
//! the records kept in the `quarantine` tree, and a tail lost across a
//! reboot. Nothing here deletes anything: the report is read from what is on
//! disk, so it stays true across restarts until an operator removes the
//! moved-aside journals.

use std::path::{Path, PathBuf};

/// The note written into a journal moved aside: why it was.
pub const NOTE: &str = "volumed-moved-aside.txt";

/// A journal moved aside beside this one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedAside {
    /// where it is now (`<dir>.corrupt-<unix seconds>[-n]`)
    pub path: PathBuf,
    /// why it was moved, from its note (`None`: no readable note, e.g. moved
    /// by a build before the note existed)
    pub reason: Option<String>,
}

/// Damage the journal has kept aside (see the module doc).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Damage {
    /// journals moved aside beside this one, by path
    pub moved_aside: Vec<MovedAside>,
    /// sequence numbers of the records in the `quarantine` tree, in order
    pub quarantined: Vec<u64>,
    /// after a reboot: (acknowledged through, recovered through) when the
    /// tail written before power loss is gone
    pub lost_tail: Option<(u64, u64)>,
}

impl Damage {
    /// Whether there is nothing to report.
    pub fn is_empty(&self) -> bool {
        self.moved_aside.is_empty() && self.quarantined.is_empty() && self.lost_tail.is_none()
    }
}

/// The journals moved aside beside `dir`, sorted by path. An unreadable
/// parent dir yields none: the report is best effort, the journal is not.
pub(crate) fn moved_aside_beside(dir: &Path) -> Vec<MovedAside> {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return Vec::new();
    };
    let prefix = format!("{}.corrupt-", name.to_string_lossy());
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut out: Vec<MovedAside> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| {
            let path = e.path();
            let reason = std::fs::read_to_string(path.join(NOTE))
                .ok()
                .map(|s| s.trim_end().to_owned());
            MovedAside { path, reason }
        })
        .collect();
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// Writes why `moved` was moved aside into it. Best effort: the move is what
/// matters, a missing note only loses the reason in later reports (the
/// error was logged when it happened).
pub(crate) fn write_note(moved: &Path, reason: &str) {
    if let Err(e) = std::fs::write(moved.join(NOTE), format!("{reason}\n")) {
        tracing::warn!(path = %moved.display(), "write the moved-aside note: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_moved_aside_journals_with_their_notes_and_nothing_else() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("journal");
        let a = tmp.path().join("journal.corrupt-100");
        let b = tmp.path().join("journal.corrupt-100-1");
        for d in [&dir, &a, &b, &tmp.path().join("journal2.corrupt-1")] {
            std::fs::create_dir_all(d).unwrap();
        }
        write_note(&a, "sled cannot open it: corrupted data");
        let found = moved_aside_beside(&dir);
        assert_eq!(
            found,
            vec![
                MovedAside {
                    path: a,
                    reason: Some("sled cannot open it: corrupted data".into())
                },
                MovedAside {
                    path: b,
                    reason: None
                },
            ]
        );
    }
}
