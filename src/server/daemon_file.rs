//! `<journal-dir>/daemon.json`: how `dump` finds the daemon that holds the
//! journal (docs/layout.md, docs/http.md). The daemon writes it after binding its
//! listen address and removes it on a clean shutdown; after a crash it stays
//! behind, so a reader checks the pid is alive and the boot id is this
//! boot's before trusting it.
//!
//! Written atomically: a temp file in the same dir,
//! fsynced, renamed over the old one, then the dir fsynced, so a reader sees
//! the old file or the new one, never a torn one, and the rename survives.
//! A write that fails (a full disk) leaves the old file and no temp file:
//! the temp file is removed when its handle drops.
//! Its contents are external input: reading never panics on them.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file name inside the journal dir.
pub const FILE_NAME: &str = "daemon.json";
/// Larger than any daemon.json we write; a bigger file is not ours.
const MAX_LEN: u64 = 64 * 1024;

/// What the daemon tells other processes about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonFile {
    /// the daemon's process id
    pub pid: u32,
    /// the address it serves HTTP on, as bound (`127.0.0.1:10264`)
    pub listen: String,
    /// the boot id it started under
    pub boot_id: String,
    /// its version (`CARGO_PKG_VERSION`)
    pub version: String,
    /// when it started, ns since the Unix epoch
    pub started_ns: u64,
    /// the lab listener `--debug-listen`, as bound, when there is one
    /// (left out otherwise, so older readers see the file they know)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debug_listen: Option<String>,
}

/// What went wrong, by step, with the path.
#[derive(Debug, thiserror::Error)]
pub enum DaemonFileError {
    /// creating the temp file beside daemon.json failed (no inode left, a
    /// read-only disk)
    #[error("create a temp file for {path}: {cause}")]
    CreateTemp {
        /// daemon.json
        path: PathBuf,
        /// the cause
        cause: std::io::Error,
    },
    /// writing or fsyncing the temp file failed
    #[error("{step} temp file {path}: {cause}")]
    WriteTemp {
        /// `write` or `fsync`
        step: &'static str,
        /// the temp file
        path: PathBuf,
        /// the cause
        cause: std::io::Error,
    },
    /// renaming the temp file over daemon.json failed
    #[error("rename temp file over {path}: {cause}")]
    Rename {
        /// daemon.json
        path: PathBuf,
        /// the cause
        cause: std::io::Error,
    },
    /// fsyncing the dir after the rename failed
    #[error("fsync dir {dir}: {cause}")]
    SyncDir {
        /// the journal dir
        dir: PathBuf,
        /// the cause
        cause: std::io::Error,
    },
    /// reading daemon.json failed
    #[error("read {path}: {cause}")]
    Read {
        /// daemon.json
        path: PathBuf,
        /// the cause
        cause: std::io::Error,
    },
    /// daemon.json is larger than any the daemon writes
    #[error("{path} is {len} bytes, larger than any daemon.json ({MAX_LEN})")]
    TooLarge {
        /// daemon.json
        path: PathBuf,
        /// its length
        len: u64,
    },
    /// daemon.json is not the JSON we write
    #[error("parse {path}: {cause}")]
    Parse {
        /// daemon.json
        path: PathBuf,
        /// the cause
        cause: serde_json::Error,
    },
    /// removing daemon.json failed
    #[error("remove {path}: {cause}")]
    Remove {
        /// daemon.json
        path: PathBuf,
        /// the cause
        cause: std::io::Error,
    },
}

/// The path of daemon.json in `journal_dir`.
pub fn path(journal_dir: &Path) -> PathBuf {
    journal_dir.join(FILE_NAME)
}

impl DaemonFile {
    /// This process, serving on `listen`, under `boot_id`, started now.
    pub fn for_this_process(listen: &str, boot_id: &str) -> Self {
        DaemonFile {
            pid: std::process::id(),
            listen: listen.to_owned(),
            boot_id: boot_id.to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            started_ns: crate::journal::now_ns(),
            debug_listen: None,
        }
    }

    /// The same, saying the lab listener `--debug-listen` is bound at
    /// `debug` too.
    pub fn with_debug_listen(self, debug: Option<String>) -> Self {
        Self {
            debug_listen: debug,
            ..self
        }
    }

    /// Writes `<journal_dir>/daemon.json` atomically (temp, fsync, rename,
    /// fsync the dir).
    pub fn write(&self, journal_dir: &Path) -> Result<(), DaemonFileError> {
        let target = path(journal_dir);
        let mut tmp = tempfile::Builder::new()
            .prefix(".daemon.json.")
            .suffix(".tmp")
            .tempfile_in(journal_dir)
            .map_err(|cause| DaemonFileError::CreateTemp {
                path: target.clone(),
                cause,
            })?;
        let tmp_path = tmp.path().to_owned();
        let step = |step| {
            let p = tmp_path.clone();
            move |cause| DaemonFileError::WriteTemp {
                step,
                path: p,
                cause,
            }
        };
        let mut body = serde_json::to_vec_pretty(self).map_err(|e| DaemonFileError::WriteTemp {
            step: "encode",
            path: tmp_path.clone(),
            cause: e.into(),
        })?;
        body.push(b'\n');
        tmp.write_all(&body).map_err(step("write"))?;
        tmp.as_file().sync_all().map_err(step("fsync"))?;
        tmp.persist(&target).map_err(|e| DaemonFileError::Rename {
            path: target.clone(),
            cause: e.error,
        })?;
        sync_dir(journal_dir)
    }

    /// Reads `<journal_dir>/daemon.json`: `Ok(None)` when there is none.
    pub fn read(journal_dir: &Path) -> Result<Option<DaemonFile>, DaemonFileError> {
        let p = path(journal_dir);
        let read_err = |cause| DaemonFileError::Read {
            path: p.clone(),
            cause,
        };
        let file = match std::fs::File::open(&p) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(read_err(e)),
        };
        let len = file.metadata().map_err(read_err)?.len();
        if len > MAX_LEN {
            return Err(DaemonFileError::TooLarge { path: p, len });
        }
        let mut body = Vec::new();
        std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_LEN), &mut body)
            .map_err(read_err)?;
        serde_json::from_slice(&body)
            .map(Some)
            .map_err(|cause| DaemonFileError::Parse { path: p, cause })
    }

    /// Removes `<journal_dir>/daemon.json` if it is still this one's (same
    /// pid and start time): a clean shutdown never removes another
    /// daemon's file. Returns whether it removed it.
    pub fn remove(&self, journal_dir: &Path) -> Result<bool, DaemonFileError> {
        match DaemonFile::read(journal_dir) {
            Ok(Some(f)) if f.pid == self.pid && f.started_ns == self.started_ns => {}
            Ok(_) => return Ok(false),
            // Unreadable or torn by hand: it is not another daemon's either.
            Err(DaemonFileError::Parse { .. } | DaemonFileError::TooLarge { .. }) => {}
            Err(e) => return Err(e),
        }
        let p = path(journal_dir);
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(cause) => return Err(DaemonFileError::Remove { path: p, cause }),
        }
        sync_dir(journal_dir)?;
        Ok(true)
    }
}

fn sync_dir(dir: &Path) -> Result<(), DaemonFileError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|cause| DaemonFileError::SyncDir {
            dir: dir.to_owned(),
            cause,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(pid: u32, listen: &str) -> DaemonFile {
        DaemonFile {
            pid,
            listen: listen.to_owned(),
            boot_id: "b-1".to_owned(),
            version: "0.1.0".to_owned(),
            started_ns: 42,
            debug_listen: None,
        }
    }

    fn temp_names(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != FILE_NAME)
            .collect()
    }

    #[test]
    fn round_trip_and_absent_is_none() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(DaemonFile::read(dir.path()).unwrap(), None);
        let f = sample(7, "127.0.0.1:10264");
        f.write(dir.path()).unwrap();
        assert_eq!(DaemonFile::read(dir.path()).unwrap(), Some(f));
        assert!(temp_names(dir.path()).is_empty(), "no temp file left");
    }

    #[test]
    fn write_replaces_the_old_file_whole() {
        let dir = tempfile::tempdir().unwrap();
        sample(7, "127.0.0.1:1").write(dir.path()).unwrap();
        let newer = sample(8, "127.0.0.1:2");
        newer.write(dir.path()).unwrap();
        assert_eq!(DaemonFile::read(dir.path()).unwrap(), Some(newer));
        assert!(temp_names(dir.path()).is_empty(), "no temp file left");
    }

    #[test]
    fn garbage_and_oversized_files_are_errors_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(path(dir.path()), b"{\"pid\": \"not a number\"").unwrap();
        let e = DaemonFile::read(dir.path()).unwrap_err();
        assert!(matches!(e, DaemonFileError::Parse { .. }), "{e}");
        assert!(e.to_string().contains(FILE_NAME), "{e}");
        std::fs::write(path(dir.path()), vec![b' '; 70 * 1024]).unwrap();
        let e = DaemonFile::read(dir.path()).unwrap_err();
        assert!(matches!(e, DaemonFileError::TooLarge { .. }), "{e}");
    }

    #[test]
    fn remove_only_removes_our_own_file() {
        let dir = tempfile::tempdir().unwrap();
        let ours = sample(7, "127.0.0.1:1");
        let theirs = sample(9, "127.0.0.1:2");
        theirs.write(dir.path()).unwrap();
        assert!(!ours.remove(dir.path()).unwrap());
        assert!(path(dir.path()).exists());
        ours.write(dir.path()).unwrap();
        assert!(ours.remove(dir.path()).unwrap());
        assert!(!path(dir.path()).exists());
        assert!(!ours.remove(dir.path()).unwrap(), "already gone");
    }

    #[test]
    fn write_into_a_missing_dir_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("absent");
        let e = sample(1, "x").write(&missing).unwrap_err();
        assert!(e.to_string().contains("absent/daemon.json"), "{e}");
    }
}
