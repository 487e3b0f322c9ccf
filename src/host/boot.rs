//! The boot id: a random UUID the kernel picks at every boot
//! (`/proc/sys/kernel/random/boot_id`). Reconstruction compares the journal's
//! boot id with this one to tell "unmounted outside volumed" from "the
//! machine rebooted" (docs/merge-table.md).

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::host::HostError;

/// Where the kernel publishes the boot id.
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// Longest boot id accepted (a UUID is 36 characters; test files may differ).
const MAX_BOOT_ID_LEN: usize = 128;

/// The id of the current boot, as read (trimmed).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BootId(String);

impl BootId {
    /// Validates a boot id: non-empty, at most 128 bytes of printable ASCII
    /// without spaces. The kernel's is a lowercase UUID; a test override may
    /// hold any such token.
    pub fn new(s: &str) -> Option<Self> {
        let ok =
            !s.is_empty() && s.len() <= MAX_BOOT_ID_LEN && s.bytes().all(|b| b.is_ascii_graphic());
        ok.then(|| Self(s.to_owned()))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for BootId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Reads the boot id: through `procfs` (one of the places it is sound, see
/// Cargo.toml) when `path` is `None`, else from the file `path` (the
/// override is for tests and the hidden `--boot-id-file` flag).
pub fn read_boot_id(path: Option<&Path>) -> Result<BootId, HostError> {
    let (path, text) = match path {
        None => {
            let path = Path::new(BOOT_ID_PATH);
            let text =
                procfs::sys::kernel::random::boot_id().map_err(|e| HostError::ReadBootId {
                    path: path.to_owned(),
                    source: std::io::Error::other(e.to_string()),
                })?;
            (path, text)
        }
        Some(path) => {
            let bytes = std::fs::read(path).map_err(|source| HostError::ReadBootId {
                path: path.to_owned(),
                source,
            })?;
            (path, String::from_utf8_lossy(&bytes).into_owned())
        }
    };
    BootId::new(text.trim()).ok_or_else(|| HostError::InvalidBootId {
        path: path.to_owned(),
        value: text.chars().take(MAX_BOOT_ID_LEN).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostErrorCategory;

    #[test]
    fn reads_this_machines_boot_id() {
        let id = read_boot_id(None).unwrap();
        assert_eq!(id.as_str().len(), 36, "{id}");
        assert_eq!(id, read_boot_id(None).unwrap(), "stable within a boot");
    }

    #[test]
    fn override_path_is_read_and_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("boot_id");
        std::fs::write(&p, "0f0e0d0c-1111-2222-3333-444455556666\n").unwrap();
        assert_eq!(
            read_boot_id(Some(&p)).unwrap().as_str(),
            "0f0e0d0c-1111-2222-3333-444455556666"
        );
    }

    #[test]
    fn errors_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let err = read_boot_id(Some(&missing)).unwrap_err();
        assert_eq!(err.category(), HostErrorCategory::NotFound);
        assert!(err.to_string().contains("nope"), "{err}");
        assert!(err.to_string().starts_with("reading boot id"), "{err}");

        for bad in ["", "\n", "two words\n", "\u{7f}"] {
            let p = dir.path().join("bad");
            std::fs::write(&p, bad).unwrap();
            let err = read_boot_id(Some(&p)).unwrap_err();
            assert_eq!(err.category(), HostErrorCategory::Corruption, "{bad:?}");
            assert!(err.to_string().contains("bad"), "{err}");
        }
    }
}
