//! What the journal keeps of damage it could not read, and the report of
//! it for `/debug/state`, `dump` and the `volumed_journal_damage` gauge:
//! the journals moved aside beside this one (`<dir>.corrupt-*`, each with
//! a note saying why), the records kept in the `quarantine` tree, and a
//! tail lost across a reboot. Also the moving itself: the whole journal
//! ([`move_aside`]), sled's derived `conf` and `snap.*` alone
//! ([`move_derived_aside`]), and the copy of sled's files taken before
//! sled's recovery can zero a damaged tail ([`AsFound`]). Nothing here
//! deletes journal data: the report is read from what is on disk, so it
//! stays true across restarts until an operator removes what was moved.

use std::path::{Path, PathBuf};

use super::JournalError;

/// The note written into a journal moved aside: why it was.
pub(super) const NOTE: &str = "volumed-moved-aside.txt";

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

/// The subdir of the journal dir holding sled's files as they were found.
pub(super) const AS_FOUND: &str = "as-found";
const AS_FOUND_INSPECT: &str = "as-found.inspect";

/// A copy of sled's files (`conf`, `db`, `snap.*`, `blobs/`) made before
/// sled opens them. sled's recovery does not only stop at a damaged log
/// message: it zeroes the log from there to its end before it returns
/// (measured by `tests/journal_torture.rs`: a flipped byte at offset 5,000
/// of a 183 KB log left 0 of the 524 record envelopes after it), so without
/// this copy a journal "moved aside" would hold nothing past the damage.
/// A trusted open discards it; a distrusted one keeps it inside the
/// journal moved aside, or puts it back (an inspection changes nothing).
#[derive(Debug)]
pub(crate) struct AsFound {
    dir: PathBuf,
}

/// The files that make the journal as an open finds it: sled's
/// ([`sled_files`]) and the checkpoint file, when there is one. Not sled's,
/// and no open rewrites it; but sled's files alone do not read back as the
/// journal (the records the checkpoint covers are gone from them). What
/// the as-found copy and the clean-close marker cover.
pub(super) fn found_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = sled_files(dir)?;
    let checkpoint = Path::new(super::checkpoint_file::FILE);
    if dir.join(checkpoint).is_file() {
        out.push(checkpoint.to_owned());
    }
    Ok(out)
}

/// sled's own files in `dir`: `conf`, `db`, `snap.*` and `blobs/*`.
pub(super) fn sled_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name == "conf" || name == "db" || name.starts_with("snap.") {
            out.push(PathBuf::from(&*name));
        } else if name == "blobs" && e.file_type()?.is_dir() {
            for b in std::fs::read_dir(e.path())? {
                out.push(Path::new("blobs").join(b?.file_name()));
            }
        }
    }
    Ok(out)
}

/// The free bytes of `journal`'s filesystem when they are too few for a
/// copy of `size` bytes, `None` when the copy fits: it may take at most
/// half of what is free, and must leave [`KEEP_FREE`], so that sled's open
/// and the writes after it still find room. Unknown free space: the copy
/// is tried.
fn room_for_copy(journal: &Path, size: u64) -> Option<u64> {
    let v = nix::sys::statvfs::statvfs(journal).ok()?;
    let free = v.blocks_available().saturating_mul(v.fragment_size());
    let fits = size.saturating_mul(2).saturating_add(KEEP_FREE) <= free;
    (!fits).then_some(free)
}

/// What the as-found copy leaves free on the journal's filesystem.
const KEEP_FREE: u64 = 8 << 20;

impl AsFound {
    /// Copies the files of `journal` as found ([`found_files`]) to
    /// `<journal>/as-found/`. A copy with no room for it
    /// ([`room_for_copy`]) is not tried, one that fails is removed; both
    /// are logged and skipped: the daemon must start even on a full disk;
    /// only the evidence of a later damage would be lost.
    /// An inspection uses its own name, so a `dump` beside a starting
    /// daemon never removes the daemon's copy.
    /// A daemon takes none when the files are exactly what its last clean
    /// close left ([`super::clean_close`]): sled's recovery has already run
    /// over them.
    pub(crate) fn save(journal: &Path, inspection: bool) -> Option<AsFound> {
        if !inspection && super::clean_close::unchanged(journal) {
            tracing::debug!(path = %journal.display(), "journal as its last clean close left it: no as-found copy");
            return None;
        }
        let dir = journal.join(if inspection {
            AS_FOUND_INSPECT
        } else {
            AS_FOUND
        });
        let _ = std::fs::remove_dir_all(&dir);
        let files = match found_files(journal) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(path = %journal.display(), "list the journal's files to copy them before opening it: {e}");
                return None;
            }
        };
        let size: u64 = files
            .iter()
            .filter_map(|rel| std::fs::metadata(journal.join(rel)).ok())
            .map(|m| m.len())
            .sum();
        if let Some(free) = room_for_copy(journal, size) {
            tracing::warn!(path = %dir.display(), bytes = size, free,
                "no room for a copy of the journal's files before opening it: skipped (only the evidence of a damage found by this open would be lost)");
            return None;
        }
        let copy = || -> std::io::Result<()> {
            std::fs::create_dir_all(dir.join("blobs"))?;
            for rel in &files {
                std::fs::copy(journal.join(rel), dir.join(rel))?;
            }
            Ok(())
        };
        match copy() {
            Ok(()) => Some(AsFound { dir }),
            Err(e) => {
                // a partial copy only takes the room the journal needs
                let _ = std::fs::remove_dir_all(&dir);
                tracing::warn!(path = %dir.display(), "copy the journal's files before opening it: {e}; skipped");
                None
            }
        }
    }

    /// Where the copy is while the journal dir is where it was.
    #[cfg(test)]
    pub(crate) fn path(&self) -> &Path {
        &self.dir
    }

    /// The copy's name inside the journal dir.
    fn name(&self) -> &Path {
        Path::new(self.dir.file_name().unwrap_or_default())
    }

    /// Settles the copy once the open is over: kept in the journal moved
    /// aside (the note says where), put back when an inspection refused
    /// the journal, dropped otherwise.
    pub(crate) fn settle(self, journal: &Path, failed: Option<&JournalError>) {
        match failed {
            Some(
                e @ (JournalError::Corrupt { moved_to, .. }
                | JournalError::NewerSchema { moved_to, .. }),
            ) => match moved_to {
                Some(to) => write_note(
                    to,
                    &format!(
                        "{e}\nsled's files as found before its recovery: {}",
                        to.join(self.name()).display()
                    ),
                ),
                None => self.restore(journal),
            },
            _ => self.discard(),
        }
    }

    /// The open went on without needing the copy (or kept it aside).
    fn discard(self) {
        match std::fs::remove_dir_all(&self.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!(path = %self.dir.display(), "remove the as-found copy: {e}");
            }
            _ => {}
        }
    }

    /// The journal goes on after sled dropped part of it (a tail lost
    /// across a reboot): the copy becomes a journal moved aside, `to`,
    /// with a note saying `why`.
    pub(crate) fn keep_aside(&self, to: &Path, why: &str) {
        match std::fs::rename(&self.dir, to) {
            Ok(()) => write_note(to, why),
            Err(e) => tracing::warn!(path = %to.display(), "keep the as-found copy aside: {e}"),
        }
    }

    /// Puts the files back as they were found (an inspection changes
    /// nothing, not even through sled's recovery), then drops the copy.
    fn restore(self, journal: &Path) {
        let back = || -> std::io::Result<()> {
            for rel in sled_files(&self.dir)? {
                std::fs::copy(self.dir.join(&rel), journal.join(&rel))?;
            }
            std::fs::remove_dir_all(&self.dir)
        };
        if let Err(e) = back() {
            tracing::warn!(path = %self.dir.display(), "put the as-found files back: {e}");
        }
    }
}

/// Moves sled's derived files out of `journal` into a new dir beside it (a
/// journal moved aside, reported like one), with a note naming sled's
/// error `why`: `snap.*` (a snapshot of its page table, rebuilt from the
/// log) and `conf` (its settings, rewritten from the `sled::Config` the
/// journal always opens with: volumed never changes sled's on-disk
/// settings). `None` when there are none or one could not be moved.
pub(crate) fn move_derived_aside(journal: &Path, why: &str) -> Option<PathBuf> {
    let derived: Vec<PathBuf> = std::fs::read_dir(journal)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("snap.") || name == "conf"
        })
        .map(|e| e.path())
        .collect();
    if derived.is_empty() {
        return None;
    }
    let to = aside_path(journal);
    let moved = std::fs::create_dir(&to).and_then(|()| {
        derived.iter().try_for_each(|f| {
            let name = f.file_name().unwrap_or_default();
            std::fs::rename(f, to.join(name))
        })
    });
    if let Err(e) = moved {
        tracing::warn!(path = %to.display(), "move sled's conf and snapshot aside: {e}");
        return None;
    }
    let note = format!(
        "sled could not open the journal ({why}); its conf and snapshot (rebuilt by sled) were moved here and the journal reopened from its log alone"
    );
    write_note(&to, &note);
    tracing::warn!(path = %to.display(), "{note}");
    Some(to)
}

/// Undoes [`move_derived_aside`] when the log alone would not open either,
/// so the journal moved aside next is whole: the files go back, then the
/// dir (holding only our note) is removed.
pub(crate) fn put_derived_back(journal: &Path, aside: &Path) {
    let back = || -> std::io::Result<()> {
        for e in std::fs::read_dir(aside)? {
            let e = e?;
            if e.file_name() != NOTE {
                std::fs::rename(e.path(), journal.join(e.file_name()))?;
            }
        }
        std::fs::remove_file(aside.join(NOTE))?;
        std::fs::remove_dir(aside)
    };
    if let Err(e) = back() {
        tracing::warn!(path = %aside.display(), "put sled's conf and snapshot back: {e}");
    }
}

/// Renames `<dir>` to `<dir>.corrupt-<unix seconds>[-n]`; never deletes.
pub(crate) fn move_aside(dir: &Path) -> Result<PathBuf, JournalError> {
    let to = aside_path(dir);
    std::fs::rename(dir, &to).map_err(|cause| JournalError::MoveAside {
        from: dir.to_owned(),
        to: to.clone(),
        cause,
    })?;
    Ok(to)
}

/// A free `<dir>.corrupt-<unix seconds>[-n]` beside `dir`.
pub(crate) fn aside_path(dir: &Path) -> PathBuf {
    let secs = super::now_ns() / 1_000_000_000;
    let base = format!("{}.corrupt-{secs}", dir.display());
    let mut to = PathBuf::from(&base);
    let mut n = 1;
    while to.exists() {
        to = PathBuf::from(format!("{base}-{n}"));
        n += 1;
    }
    to
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_as_found_copy_holds_sleds_files_and_is_put_back_or_discarded() {
        let tmp = tempfile::tempdir().unwrap();
        let j = tmp.path();
        std::fs::create_dir_all(j.join("blobs")).unwrap();
        for (f, b) in [
            ("db", "log"),
            ("conf", "c"),
            ("snap.01", "s"),
            ("blobs/7", "b"),
        ] {
            std::fs::write(j.join(f), b).unwrap();
        }
        std::fs::write(j.join("acked"), "not sled's").unwrap();
        let found = AsFound::save(j, false).unwrap();
        assert_eq!(std::fs::read(found.path().join("blobs/7")).unwrap(), b"b");
        assert!(!found.path().join("acked").exists());
        std::fs::write(j.join("db"), "zeroed by recovery").unwrap();
        found.restore(j);
        assert_eq!(std::fs::read(j.join("db")).unwrap(), b"log");
        assert!(!j.join(AS_FOUND).exists());
        AsFound::save(j, true).unwrap().discard();
        assert!(!j.join(AS_FOUND).exists());
    }

    /// The copy is skipped only for files exactly as a clean close left
    /// them; a crash after an open, or any byte changed, brings it back.
    #[test]
    fn a_daemon_copies_nothing_only_after_a_clean_close_with_nothing_changed() {
        use crate::journal::{Journal, JournalConfig};
        let tmp = tempfile::tempdir().unwrap();
        let j = tmp.path();
        let cfg = JournalConfig::new(j, "node-a", "11111111-2222-3333-4444-555555555555");
        let (journal, _) = Journal::open(&cfg).unwrap();
        journal.close().unwrap();
        assert!(AsFound::save(j, false).is_none(), "clean close, untouched");
        // an inspection keeps its promise to put every file back
        AsFound::save(j, true).unwrap().discard();

        // opened again, written to and dropped without close: a crash
        let (journal, _) = Journal::open(&cfg).unwrap();
        journal
            .append_record(crate::journal::Body::Forget {
                volume: crate::model::UniqueVolumeName::from_raw("v"),
                target: crate::model::TargetRef::Device,
            })
            .unwrap();
        drop(journal);
        std::thread::sleep(std::time::Duration::from_millis(200));
        let found = AsFound::save(j, false).expect("a crash: the copy is taken");
        found.discard();

        let (journal, _) = Journal::open(&cfg).unwrap();
        journal.close().unwrap();
        assert!(AsFound::save(j, false).is_none());
        let db = j.join("db");
        let mut bytes = std::fs::read(&db).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        std::fs::write(&db, &bytes).unwrap();
        AsFound::save(j, false)
            .expect("a byte changed since the close: the copy is taken")
            .discard();
    }

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
