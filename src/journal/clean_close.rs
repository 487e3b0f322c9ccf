//! What a clean close leaves beside sled's files: each file's size and
//! CRC-32, so the next open can tell that they are byte for byte what
//! that close left. Such files need no as-found copy ([`super::damage`]):
//! the close already reopened them with sled ([`super::checkpoint::snapshot_log`]),
//! so sled's recovery has run over these very bytes and found nothing to
//! zero. Any change since — a crash after a later open, a flipped bit on
//! disk, a file added or gone — fails the comparison and the copy is
//! taken as before. The checkpoint file is listed too, though sled never
//! touches it: a journal whose checkpoint changed since the close is not
//! the one the close left, and a damaged checkpoint moves it aside, which
//! must then keep sled's files as found like any other. The marker is a
//! hint checked by content, never trusted alone: it is not synced, and a
//! torn or garbled one is no match.

use std::io::Read;
use std::path::{Path, PathBuf};

/// The marker's name in the journal dir.
pub(super) const FILE_NAME: &str = "clean-close";
const HEADER: &str = "volumed clean close v1";

/// One sled file as the marker lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    rel: PathBuf,
    size: u64,
    crc: u32,
}

/// `rel`'s size and CRC-32 in `journal`, read in chunks through `buf`.
fn seen(journal: &Path, rel: &Path, buf: &mut [u8]) -> std::io::Result<Seen> {
    let mut f = std::fs::File::open(journal.join(rel))?;
    let mut h = crc32fast::Hasher::new();
    let mut size = 0u64;
    loop {
        let n = f.read(buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        size += n as u64;
    }
    Ok(Seen {
        rel: rel.to_owned(),
        size,
        crc: h.finalize(),
    })
}

/// The chunk files are read in.
const CHUNK: usize = 64 * 1024;

/// Every file of `journal` as found ([`super::damage::found_files`]),
/// sorted, as seen now.
fn all_seen(journal: &Path) -> std::io::Result<Vec<Seen>> {
    let mut rels = super::damage::found_files(journal)?;
    rels.sort();
    let mut buf = vec![0u8; CHUNK];
    rels.iter().map(|r| seen(journal, r, &mut buf)).collect()
}

fn render(files: &[Seen]) -> String {
    let mut s = format!("{HEADER}\n");
    for f in files {
        s.push_str(&format!("{} {:08x} {}\n", f.size, f.crc, f.rel.display()));
    }
    s
}

fn parse(text: &str) -> Option<Vec<Seen>> {
    let mut lines = text.lines();
    if lines.next()? != HEADER {
        return None;
    }
    lines
        .map(|l| {
            let mut parts = l.splitn(3, ' ');
            let size = parts.next()?.parse().ok()?;
            let crc = u32::from_str_radix(parts.next()?, 16).ok()?;
            let rel = PathBuf::from(parts.next()?);
            Some(Seen { rel, size, crc })
        })
        .collect()
}

/// After a clean close (sled's snapshot written, the lock let go): notes
/// sled's files as they are. Best effort: without a marker the next open
/// only takes its copy.
pub(crate) fn note(journal: &Path) {
    let write = || -> std::io::Result<()> {
        let text = render(&all_seen(journal)?);
        let tmp = journal.join(format!("{FILE_NAME}.tmp"));
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, journal.join(FILE_NAME))
    };
    if let Err(e) = write() {
        tracing::debug!(dir = %journal.display(), error = %e, "journal: no clean-close marker");
    }
}

/// Whether sled's files in `journal` are exactly those the marker lists
/// (the same set, sizes and CRC-32s). Sizes are compared before anything
/// is read, so a journal that changed in length costs no hashing.
pub(crate) fn unchanged(journal: &Path) -> bool {
    let listed = std::fs::read_to_string(journal.join(FILE_NAME))
        .ok()
        .and_then(|text| parse(&text));
    let Some(listed) = listed else {
        return false;
    };
    let sizes_match = listed
        .iter()
        .all(|l| std::fs::metadata(journal.join(&l.rel)).is_ok_and(|m| m.len() == l.size));
    // the full set, in the order the marker was written in
    sizes_match && all_seen(journal).is_ok_and(|now| now == listed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn journal_with(files: &[(&str, &[u8])]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("blobs")).unwrap();
        for (rel, bytes) in files {
            std::fs::write(d.path().join(rel), bytes).unwrap();
        }
        d
    }

    #[test]
    fn files_as_the_close_left_them_match_and_any_change_does_not() {
        let base: &[(&str, &[u8])] = &[
            ("conf", b"segment_size: 524288\n"),
            ("db", &[7u8; 5000]),
            ("snap.0000000000000A", b"snapshot"),
            ("blobs/42", b"a blob"),
        ];
        let d = journal_with(base);
        assert!(!unchanged(d.path()), "no marker: no match");
        note(d.path());
        assert!(unchanged(d.path()), "untouched since the close");
        assert!(unchanged(d.path()), "checking changes nothing");

        // the same length, one byte flipped: only the checksum tells
        let mut db = std::fs::read(d.path().join("db")).unwrap();
        db[4000] ^= 1;
        std::fs::write(d.path().join("db"), &db).unwrap();
        assert!(!unchanged(d.path()), "a flipped byte");
        note(d.path());
        assert!(unchanged(d.path()));

        std::fs::write(d.path().join("blobs/43"), b"new").unwrap();
        assert!(!unchanged(d.path()), "a file added");
        note(d.path());
        std::fs::remove_file(d.path().join("snap.0000000000000A")).unwrap();
        assert!(!unchanged(d.path()), "a file gone");
        note(d.path());
        std::fs::write(d.path().join("db"), [7u8; 5001]).unwrap();
        assert!(!unchanged(d.path()), "a file grown");
        note(d.path());

        // the checkpoint is the journal's, not sled's, but counts too
        std::fs::write(d.path().join("checkpoint"), b"envelope").unwrap();
        assert!(!unchanged(d.path()), "a checkpoint added");
        note(d.path());
        assert!(unchanged(d.path()));
        std::fs::write(d.path().join("checkpoint"), b"envelopf").unwrap();
        assert!(!unchanged(d.path()), "a checkpoint changed");
        note(d.path());
        std::fs::write(d.path().join("checkpoint.tmp"), b"torn").unwrap();
        assert!(unchanged(d.path()), "a leftover checkpoint.tmp is not read");
    }

    #[test]
    fn a_torn_or_foreign_marker_is_no_match() {
        let d = journal_with(&[("conf", b"c"), ("db", b"d")]);
        note(d.path());
        let text = std::fs::read_to_string(d.path().join(FILE_NAME)).unwrap();
        for bad in [
            "",
            &text[..text.len() / 2],
            "volumed clean close v9\n",
            &text.replace(HEADER, "something else"),
            &format!("{text}garbage line\n"),
        ] {
            std::fs::write(d.path().join(FILE_NAME), bad).unwrap();
            assert!(!unchanged(d.path()), "{bad:?}");
        }
        std::fs::write(d.path().join(FILE_NAME), &text).unwrap();
        assert!(unchanged(d.path()));
    }
}
