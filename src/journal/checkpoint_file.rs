//! The checkpoint's own file beside sled's (`<dir>/checkpoint`, schema 4
//! on): one sealed checkpoint envelope, read once at open and freed after
//! decoding. Kept out of sled because sled 0.34 never evicts a tree's last
//! cached page, so an in-sled checkpoint stayed in memory for the life of
//! the process whatever the cache capacity said.
//!
//! Written whole to `checkpoint.tmp`, fsynced, renamed over `checkpoint`
//! and the dir fsynced: a crash or a power cut leaves the old checkpoint or
//! the new one, never a torn one. A leftover `checkpoint.tmp` is never read
//! and is overwritten by the next write.

use std::io::Write;
use std::path::Path;

use super::JournalError;
use super::contain::{Failed, contain};
use super::envelope::{self, Kind};
use super::record;
use super::replay::JournalState;

/// The checkpoint file's name in the journal dir.
pub const FILE: &str = "checkpoint";
/// Where the next checkpoint is written before it is renamed over [`FILE`].
pub const TMP: &str = "checkpoint.tmp";
/// The tree that held the checkpoint before schema 4.
pub(crate) const CHECKPOINT_TREE: &str = "checkpoint";
/// Its one key.
pub(crate) const CHECKPOINT_KEY: &[u8] = b"current";

/// The `checkpoint` tree of a journal from before schema 4; `None` when
/// the journal has none (opening it would create it).
pub(crate) fn legacy_tree(db: &sled::Db) -> sled::Result<Option<sled::Tree>> {
    let names = db.tree_names();
    if !names.iter().any(|n| n == CHECKPOINT_TREE.as_bytes()) {
        return Ok(None);
    }
    db.open_tree(CHECKPOINT_TREE).map(Some)
}

/// Makes `envelope` the journal's checkpoint, durably (see the module doc).
pub(crate) fn write(dir: &Path, envelope: &[u8]) -> Result<(), JournalError> {
    let err = |what| {
        move |e| JournalError::Write {
            what,
            path: dir.to_path_buf(),
            cause: sled::Error::Io(e),
        }
    };
    let tmp = dir.join(TMP);
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(envelope).and_then(|()| f.sync_all()));
    if let Err(e) = written {
        // never read, but a part of it (a full disk) holds the room the
        // journal's own writes need
        let _ = std::fs::remove_file(&tmp);
        return Err(err("checkpoint.tmp")(e));
    }
    std::fs::rename(&tmp, dir.join(FILE)).map_err(err("checkpoint rename"))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(err("checkpoint dir fsync"))
}

/// The checkpoint file's bytes, `None` when there is none.
pub(crate) fn read(dir: &Path) -> std::io::Result<Option<Vec<u8>>> {
    match std::fs::read(dir.join(FILE)) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Where open looks for the checkpoint.
pub(super) struct Stored<'a> {
    /// the journal dir
    pub dir: &'a Path,
    /// the schema the journal is read in
    pub schema: u32,
    pub journal_id: u64,
    /// the `checkpoint` tree, when the journal has one (schema 3 and before)
    pub legacy: Option<&'a sled::Tree>,
}

/// A checkpoint decoded: its state, through seq, wall time, entry count.
pub(super) type Decoded = (JournalState, u64, u64, usize);
/// The seq a stored checkpoint claims, and what decoding it gave.
pub(super) type Found = (u64, Result<Decoded, String>);

impl Stored<'_> {
    /// The checkpoint as open found it: the seq it claims and its decoded
    /// contents, or why it cannot be used (it fails verification, or it is
    /// missing while records it covered are gone); `None` when there is
    /// none and none is missing. `Err`: it could not be read.
    pub(super) fn load(
        &self,
        records: &sled::Tree,
        quarantine: &sled::Tree,
    ) -> Result<Option<Found>, Failed> {
        let Some(v) = self.envelope()? else {
            return Ok(
                dropped_without_checkpoint(records, quarantine).map(|first| {
                    let why = format!("it is missing, yet records before seq {first} were dropped");
                    (0, Err(why))
                }),
            );
        };
        let claimed = envelope::claimed_seq(&v).unwrap_or(0);
        let decoded = envelope::open(self.journal_id, Kind::Checkpoint, claimed, &v)
            .map_err(|e| e.to_string())
            .and_then(|p| record::decode_checkpoint(self.schema, p).map_err(|e| e.to_string()))
            .and_then(|d| match gap_after(d.1, records, quarantine) {
                Some(why) => Err(why),
                None => Ok(d),
            });
        Ok(Some((claimed, decoded)))
    }

    /// The stored envelope: the file from schema 4 on; before, the tree's
    /// value, or the file when a migration to 4 was cut short after
    /// removing it (an inspection reads such a journal unmigrated).
    fn envelope(&self) -> Result<Option<Vec<u8>>, Failed> {
        if let Some(tree) = self.legacy.filter(|_| self.schema < 4)
            && let Some(v) = contain(|| tree.get(CHECKPOINT_KEY))?
        {
            return Ok(Some(v.to_vec()));
        }
        read(self.dir).map_err(|e| Failed::Sled(sled::Error::Io(e)))
    }
}

/// With no checkpoint, records are only ever moved (to quarantine), never
/// removed, so a journal whose first record is past 1 lost the checkpoint
/// that covered the rest (a deleted file): its first seq, or `None`.
fn dropped_without_checkpoint(records: &sled::Tree, quarantine: &sled::Tree) -> Option<u64> {
    first_seq(records, quarantine).filter(|first| *first > 1)
}

/// The lowest seq left in `records` or `quarantine`.
fn first_seq(records: &sled::Tree, quarantine: &sled::Tree) -> Option<u64> {
    let first = |t: &sled::Tree| {
        let (k, _) = contain(|| t.first()).ok().flatten()?;
        <[u8; 8]>::try_from(k.as_ref()).ok().map(u64::from_be_bytes)
    };
    [first(records), first(quarantine)]
        .into_iter()
        .flatten()
        .min()
}

/// Only a checkpoint drops records, and only those it covers: a first
/// record past `through + 1` means a checkpoint older than the one that
/// dropped the records between (a stale file put back). Why, if so.
fn gap_after(through: u64, records: &sled::Tree, quarantine: &sled::Tree) -> Option<String> {
    let first = first_seq(records, quarantine)?;
    (first > through + 1).then(|| {
        format!("it covers through seq {through}, yet the first record left is seq {first}: the records between are gone")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_replaces_the_file_whole_and_a_leftover_tmp_is_ignored() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        assert_eq!(read(dir).unwrap(), None);
        write(dir, b"first").unwrap();
        std::fs::write(dir.join(TMP), b"torn").unwrap();
        assert_eq!(read(dir).unwrap().as_deref(), Some(&b"first"[..]));
        write(dir, b"second").unwrap();
        assert_eq!(read(dir).unwrap().as_deref(), Some(&b"second"[..]));
        assert!(!dir.join(TMP).exists());
    }

    #[test]
    fn a_write_that_fails_names_the_step_and_the_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("gone");
        let e = write(&missing, b"x").unwrap_err();
        let JournalError::Write { what, path, .. } = &e else {
            panic!("{e}");
        };
        assert_eq!(
            (*what, path.as_path()),
            ("checkpoint.tmp", missing.as_path())
        );
    }
}
